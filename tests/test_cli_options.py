"""Command-line options of issue 16: --version, compile --ptx, one meaning for --debug, options a
kernel file's build() cannot take, check's rows as they finish, a quiet broken pipe."""
import re
import subprocess
import sys
import textwrap

import pytest

import cbrules
from cbrules import cli
from cbrules.cli import main


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cbrules {cbrules.__version__}"


def test_compile_ptx_prints_ptx_for_the_hopper_target(capsys):
    assert main(["compile", "single_dim", "--stages", "2", "--ptx"]) == 0
    out = capsys.readouterr().out
    assert ".target sm_90a" in out and ".visible .entry single_dim(" in out
    assert 'extern "C"' not in out  # the PTX replaces the CUDA source


def test_debug_has_one_meaning():
    parsers = {name: p for name, p in cli.parser()._subparsers._group_actions[0].choices.items()}
    with_debug = {n for n, p in parsers.items() if "--debug" in p._option_string_actions}
    assert with_debug == {"lower"}
    assert parsers["lower"]._option_string_actions["--debug"].help == cli.DEBUG_HELP
    assert "--annotate" in parsers["demo"]._option_string_actions


def test_lower_debug_prints_the_applications(capsys):
    assert main(["lower", "single_dim", "--stages", "2", "--debug"]) == 0
    out = capsys.readouterr().out
    assert "cb-default-prefetch" in out and "rules/circular_buffer.rules:" in out


@pytest.mark.parametrize("option", [["--stages", "3"], ["--prefetch", "1"], ["--war", "mbarrier"],
                                    ["--warp-specialize"]])
def test_options_a_kernel_file_cannot_take_are_an_error(tmp_path, option, capsys):
    f = tmp_path / "k.py"
    f.write_text("from cbrules.kernels.exp1d import exp1d_tma\ndef build():\n    return exp1d_tma()\n")
    assert main(["lower", str(f), *option]) == 2
    err = capsys.readouterr().err
    assert f"{option[0]} would be ignored" in err and "build()" in err


def test_a_kernel_file_taking_options_gets_them(tmp_path, capsys):
    f = tmp_path / "k.py"
    f.write_text(textwrap.dedent("""
        from cbrules.kernels import get
        def build(stages=None, prefetch=None, war=None, **rest):
            return get("single_dim").build(stages=stages, prefetch=prefetch, war=war)
    """))
    assert main(["lower", str(f), "--stages", "4"]) == 0
    assert "stages=4" in capsys.readouterr().out
    assert main(["lower", "exp1d_tma", "--stages", "3"]) == 2  # the built-in hand-built kernel takes none either


def test_check_prints_each_row_as_it_finishes(monkeypatch, capsys):
    from cbrules import check
    real, seen = check.Checker.check, []

    def spy(self, spec, trips, *args, **kwargs):  # what stdout already held when each case began
        seen.append((trips, capsys.readouterr().out))
        return real(self, spec, trips, *args, **kwargs)

    monkeypatch.setattr(check.Checker, "check", spy)
    assert main(["check", "single_dim", "--stages", "2", "--sample"]) == 0
    tail = capsys.readouterr().out
    assert [t for t, _ in seen] == list(range(0, 9))
    for (t, _), (_, printed) in zip(seen, seen[1:]):  # case t's row was out before case t+1 began
        assert re.match(rf"\s*{t}\s+\d+\s+ok", printed.splitlines()[-1]), printed
    assert check.TABLE_HEADER in seen[0][1] and "9 trip counts" in tail


def test_a_closed_pipe_ends_quietly():
    p = subprocess.run(f"{sys.executable} -m cbrules.cli ops | head -1", shell=True, capture_output=True,
                       text=True, timeout=120)
    assert p.stdout.count("\n") == 1 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr
