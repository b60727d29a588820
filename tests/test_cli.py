"""The console script: help everywhere, errors on stderr with non-zero codes."""
import subprocess
import sys
import textwrap

import pytest

from cbrules.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "cbrules.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("cmd", [[], ["demo"], ["kernels"], ["lower"], ["compile"], ["run"]])
def test_help_everywhere(cmd):
    r = run(*cmd, "--help")
    assert r.returncode == 0 and "usage: cbrules" in r.stdout


def test_kernels_lists_the_demo(capsys):
    assert main(["kernels"]) == 0
    assert "exp1d_tma" in capsys.readouterr().out


def test_unknown_kernel_lists_known_ones():
    r = run("compile", "no_such_kernel")
    assert r.returncode == 2
    assert "unknown kernel 'no_such_kernel'" in r.stderr and "exp1d_tma" in r.stderr
    assert r.stdout == ""


def test_lower_and_compile(capsys):
    assert main(["lower", "exp1d_tma"]) == 0
    assert "mbarrier_wait" in capsys.readouterr().out
    assert main(["compile", "exp1d_tma", "--quiet"]) == 0
    assert "registers" in capsys.readouterr().err  # the summary: stdout is the source alone


def test_kernel_from_a_python_file(tmp_path, capsys):
    f = tmp_path / "mine.py"
    f.write_text(textwrap.dedent('''
        from cbrules.ir.builder import Kernel, threadIdx
        def build():
            k = Kernel("mine", block=32)
            n = k.symbol("N")
            x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
            with k.if_(threadIdx.x.lt(n)):
                k.store(out, threadIdx.x, k.add(k.load(x, threadIdx.x), 1.0))
            return k
    '''))
    assert main(["compile", str(f), "--quiet"]) == 0
    assert "mine:" in capsys.readouterr().err
    assert main(["run", str(f)]) == 2  # no inputs()/reference(): a clear error, before any GPU is looked for


def test_demo_without_gpu_exits_zero():
    from cbrules.codegen.runtime import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present; the GPU test covers the demo")
    r = run("demo", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "registers" in r.stdout and "no compute-capability 9.x GPU" in r.stdout
