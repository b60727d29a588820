"""Every subcommand with bad input ends in one line on stderr and a non-zero exit code, never a
Python traceback, and within seconds (in-process through ``cli.main``; a few real processes)."""
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from cbrules import api, cli
from cbrules.rewrite import engine
from rulekit import write_rules
from hostile import within




@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bad kernel files and hostile rule folders, by name."""
    d = tmp_path_factory.mktemp("hostile")
    kernels = {
        "raises.py": 'import os\nraise RuntimeError("boom at import")\n',
        "syntax.py": "def build(:\n    pass\n",
        "nobuild.py": "SHAPE = (4,)\n",
        "buildfails.py": "def build():\n    return {}['missing']\n",
        "notkernel.py": "def build():\n    return 42\n",
        "sysexit.py": "import sys\nsys.exit(3)\n",
        "baseexc.py": "class Stop(BaseException):\n    pass\nraise Stop('not an Exception')\n",
        "genexit.py": "raise GeneratorExit\n",
        "buildexit.py": "def build():\n    raise SystemExit('from build')\n",
        "forever.py": "while True:\n    pass\n",
        "buildforever.py": "import time\ndef build():\n    while True:\n        try:\n            time.sleep(10)\n"
                           "        except Exception:\n            pass\n",
        "hugetol.py": "def build():\n    pass\nTOLERANCE = (10 ** 400, 0)\n",
        "badshape.py": textwrap.dedent('''
            from cbrules.ir.builder import Kernel
            SHAPE = "not a shape"
            def build():
                return Kernel("k", block=32)
        '''),
    }
    for name, text in kernels.items():
        (d / name).write_text(text)
    if hasattr(os, "mkfifo"):  # nobody writes or reads these: opening either would block
        os.mkfifo(d / "fifo.py")
        os.mkfifo(d / "out.fifo")
    (d / "zero.py").symlink_to("/dev/zero")  # a device never ends
    (d / "zero.cbtrace").symlink_to("/dev/zero")
    last = api.load_rules().phases[-1]
    grow = write_rules(d / "grow", f"(phase hostile :after {last})\n(graph-rule grow :phase hostile "
                       ":match ((for ?L) (_ ?s :child-of ?L)) :rewrite ((insert-after ?s (syncthreads))))\n").parent
    selfmove = write_rules(d / "selfmove", f"(phase hostile :after {last})\n(graph-rule m :phase hostile "
                           ":match ((for ?L)) :rewrite ((move ?L :into ?L)))\n").parent
    egg = write_rules(d / "egg", f'(datatype E (Num i64))\n(output "{d}/written.txt" (Num 1))\n').parent
    broken = write_rules(d / "broken", "(graph-rule x :phase\n").parent
    out = {k[:-3]: str(d / k) for k in kernels}
    out.update(grow=str(grow), selfmove=str(selfmove), egg=str(egg), broken=str(broken), dir=d,
               missing=str(d / "no-such-folder"))
    return out


# (argv with {placeholders} from `files`, expected exit code, a fragment stderr must contain)
CASES = [
    # demo, kernels
    (["demo", "--size", "0"], 2, "argument --size: 0 is too small"),
    (["demo", "--reps", "-3"], 2, "argument --reps: -3 is too small"),
    (["kernels", "extra"], 2, "unrecognized arguments"),
    # lower: kernels, shapes, rule folders
    (["lower", "no_such_kernel"], 2, "unknown kernel 'no_such_kernel'"),
    (["lower", "{dir}/missing.py"], 2, "no such kernel file"),
    (["lower", "{raises}"], 2, "raises.py:2: RuntimeError while running kernel file"),
    (["lower", "{syntax}"], 2, "syntax.py:1: syntax error in kernel file"),
    (["lower", "{nobuild}"], 2, "must define build()"),
    (["lower", "{buildfails}"], 2, "buildfails.py:2: KeyError while calling build()"),
    (["lower", "{notkernel}"], 2, "build() returned int, not a cbrules Kernel"),
    (["lower", "{badshape}"], 2, "SHAPE must be a tuple of integers"),
    (["lower", "{sysexit}"], 2, "sysexit.py:2: the kernel file " + "{sysexit} called sys.exit(3) while running it"),
    (["lower", "{baseexc}"], 2, "baseexc.py:3: Stop while running kernel file"),
    (["lower", "{genexit}"], 2, "genexit.py:1: GeneratorExit while running kernel file"),
    (["lower", "{buildexit}"], 2, "buildexit.py:2: the kernel file " + "{buildexit} called sys.exit('from build')"),
    (["lower", "{hugetol}"], 2, "TOLERANCE must be (rtol, atol), two non-negative numbers"),
    (["lower", "{dir}/fifo.py"], 2, "fifo.py: a FIFO (named pipe); cbrules reads only regular files"),
    (["lower", "{dir}/zero.py"], 2, "zero.py: a device; cbrules reads only regular files"),
    (["trace", "{dir}/zero.cbtrace", "counts"], 1, "zero.cbtrace: a device; cbrules reads only regular files"),
    (["lower", "single_dim", "--shape", ""], 2, "--shape '': give the sizes as integers"),
    (["lower", "single_dim", "--shape", "1" * 5000], 2, "give the sizes as integers"),
    (["compile", "exp1d_tma", "--quiet", "-o", "{dir}/out.fifo"], 2, "a FIFO (named pipe); cbrules writes an output"),
    (["lower", "single_dim", "--shape", "a,b"], 2, "give the sizes as integers"),
    (["lower", "single_dim", "--shape", "-5"], 2, "sizes must be >= 1"),
    (["lower", "multi_dim", "--shape", "4096"], 2, "multi_dim takes 2 size(s)"),
    (["lower", "single_dim", "--shape", "99999999999"], 2, "elements at most"),
    (["lower", "single_dim", "--stages", "2.5"], 2, "argument --stages: '2.5' is neither an integer nor auto"),
    (["lower", "single_dim", "--rules", ""], 2, "--rules ''"),
    (["lower", "single_dim", "--rules", "{missing}"], 1, "rule folder does not exist"),
    (["lower", "single_dim", "--rules", "{broken}"], 1, "broken"),
    (["lower", "single_dim", "--rules", "{grow}"], 1, "rule grow ("),
    (["lower", "single_dim", "--rules", "{selfmove}"], 1, "inside itself"),
    (["lower", "single_dim", "--rules", "{egg}"], 1, "(output ...) is not allowed"),
    # rules check / list
    (["rules", "check", ""], 2, "--rules ''"),
    (["rules", "list", "--rules", ""], 2, "--rules ''"),
    (["rules", "check", "{missing}"], 1, "rule folder does not exist"),
    (["rules", "list", "{missing}"], 1, "rule folder does not exist"),
    (["rules", "check", "{egg}"], 1, "(output ...) is not allowed"),
    (["rules", "check", "{broken}"], 1, "broken"),
    (["rules", "frobnicate"], 2, "invalid choice"),
    # trace, each query
    (["trace", "exp1d_tma", "counts", "--rules", "{grow}"], 1, "rule grow ("),
    (["trace", "{syntax}", "log"], 2, "syntax error in kernel file"),
    (["trace", "exp1d_tma", "history"], 2, "trace history needs --node"),
    (["trace", "exp1d_tma", "why-not", "--node", "3"], 2, "needs --rule"),
    (["trace", "exp1d_tma", "why-not", "--rule", "nope", "--node", "3"], 1, "unknown rule 'nope'"),
    (["trace", "exp1d_tma", "graph", "--step", "99999"], 1, "no step 99999"),
    (["trace", "exp1d_tma", "dot"], 2, "needs --step"),
    (["trace", "exp1d_tma", "dot", "--step", "99999"], 1, "no step 99999"),
    (["trace", "exp1d_tma", "dot", "--step", "1", "-o", "/nonexistent/x.dot"], 2,
     "cannot write /nonexistent/x.dot: No such file or directory"),
    (["trace", "exp1d_tma", "cuda", "--stop-after", "0"], 2, "argument --stop-after: 0 is too small"),
    (["trace", "exp1d_tma", "log", "--node", "-1"], 2, "argument --node: -1 is too small"),
    (["trace", "exp1d_tma", "sideways"], 2, "invalid choice"),
    # compile, run
    (["compile", "exp1d_tma", "-o", "/nonexistent/x.cu"], 2, "cannot write /nonexistent/x.cu: No such file"),
    (["compile", "{raises}"], 2, "RuntimeError while running kernel file"),
    (["compile", "single_dim", "--rules", "{selfmove}"], 1, "inside itself"),
    (["run", "single_dim", "--reps", "0"], 2, "argument --reps: 0 is too small"),
    (["run", "{buildfails}"], 2, "KeyError while calling build()"),
    (["run", "no_such_kernel"], 2, "unknown kernel"),
    # check
    (["check", "single_dim", "--stages", "1000"], 2, "1 <= S <= 16"),
    (["check", "single_dim", "--stages", "0"], 2, "1 <= S <= 16"),
    (["check", "single_dim", "--shape", "1024,3"], 2, "single_dim takes 1 size(s)"),  # one case at --shape
    (["check", "exp1d_tma"], 2, "needs a built-in circular-buffered kernel"),
    (["check", "{syntax}"], 2, "syntax error in kernel file"),
    (["check", "single_dim", "--rules", ""], 2, "--rules ''"),
]


@pytest.mark.parametrize("argv, code, fragment", CASES, ids=[" ".join(c[0]) or "(none)" for c in CASES])
def test_bad_input_ends_in_one_named_line(files, capsys, argv, code, fragment):
    argv = [a.format(**files) for a in argv]
    fragment = fragment.format(**files)
    with within(60):
        got = cli.main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "Traceback" not in out.out, out.err
    assert got == code, out.err
    assert fragment in out.err, out.err
    last = out.err.strip().splitlines()[-1]
    assert last.startswith("cbrules"), out.err  # "cbrules: ..." or argparse's "cbrules lower: error: ..."


def test_a_hostile_rule_folder_never_writes_a_file(files, capsys):
    for argv in (["rules", "check", files["egg"]], ["lower", "single_dim", "--rules", files["egg"]]):
        assert cli.main(argv) == 1
    assert not (files["dir"] / "written.txt").exists()
    assert "Traceback" not in capsys.readouterr().err


def test_a_growing_rule_folder_ends_in_the_bound_within_seconds(files, capsys):
    with within(30):
        assert cli.main(["lower", "matmul", "--rules", files["grow"]]) == 1
    err = capsys.readouterr().err
    assert "LoweringError: phase 'hostile': rule grow (" in err and "add a guard" in err, err
    assert f"({engine.RULE_FIRINGS_PER_NODE} per node + {engine.RULE_FIRINGS_EXTRA})" in err


def test_an_internal_error_says_so_and_how_to_see_the_traceback(monkeypatch, capsys):
    def broken(a):
        raise TypeError("a bug")
    monkeypatch.setattr(cli, "cmd_kernels", broken)
    monkeypatch.delenv(cli.TRACEBACK_VAR, raising=False)
    assert cli.main(["kernels"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: TypeError: a bug" in err and f"{cli.TRACEBACK_VAR}=1" in err
    monkeypatch.setenv(cli.TRACEBACK_VAR, "1")
    with pytest.raises(TypeError, match="a bug"):
        cli.main(["kernels"])


def test_interrupt_and_closed_pipe_are_quiet(monkeypatch, capsys):
    for exc, code in ((KeyboardInterrupt, 130), (BrokenPipeError, 141)):
        def stop(a, exc=exc):
            raise exc()
        monkeypatch.setattr(cli, "cmd_kernels", stop)
        assert cli.main(["kernels"]) == code
        assert capsys.readouterr().err == ""


def test_a_warning_is_one_line(monkeypatch, capsys):
    import warnings

    def warn(a):
        warnings.warn("budget hit", UserWarning)
        return 0
    monkeypatch.setattr(cli, "cmd_kernels", warn)
    assert cli.main(["kernels"]) == 0
    assert capsys.readouterr().err == "cbrules: warning: UserWarning: budget hit\n"


def test_help_names_the_exit_codes_and_the_check_cap(capsys):
    assert cli.main(["--help"]) == 0
    assert "3 an internal error" in capsys.readouterr().out
    assert cli.main(["check", "--help"]) == 0
    assert "S <= 16" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------ real processes
def run(*args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "cbrules.cli", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_process_kernel_file_that_raises(files):
    r = run("compile", files["raises"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"cbrules: error: {files['raises']}:2: RuntimeError while running kernel file " \
                               f"{files['raises']}: boom at import"


def test_process_unwritable_output_and_huge_stages():
    r = run("compile", "exp1d_tma", "--quiet", "-o", "/nonexistent/x.cu")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "/nonexistent/x.cu" in r.stderr
    r = run("check", "single_dim", "--stages", "1000", timeout=30)
    assert r.returncode == 2 and "1 <= S <= 16" in r.stderr and r.stdout == ""


def test_process_closed_pipe_is_quiet():
    p = subprocess.Popen([sys.executable, "-m", "cbrules.cli", "kernels"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first line is written
    _, err = p.communicate(timeout=60)
    assert p.returncode == 141 and err == b"", err


def test_interrupt_lost_in_a_finalizer_still_ends_with_130(monkeypatch, capsys):
    """Ctrl-C raised inside a ``__del__`` is swallowed by Python ("Exception ignored"): the command
    still exits 130, quietly, and the unraisable hook is restored."""
    import argparse
    from cbrules import cli

    class Finalizer:
        def __del__(self):
            raise KeyboardInterrupt

    def command(_args):
        Finalizer()  # dropped at once: its interrupt goes to the unraisable hook
        return 0

    def parser():
        p = argparse.ArgumentParser()
        p.set_defaults(fn=command)
        return p

    monkeypatch.setattr(cli, "parser", parser)
    hook = sys.unraisablehook
    assert cli.main([]) == 130
    assert sys.unraisablehook is hook
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


def test_process_interrupt_is_quiet():
    """Ctrl-C while ``check`` runs: exit 130, nothing on stderr. The check takes a few seconds; on a
    loaded machine this process may not get to send the signal before the command has finished (its
    summary line printed: a signal then lands in the interpreter's shutdown and says nothing about
    the command), so such a run is tried again, at most three times."""
    def as_at_a_terminal():  # what a shell gives a foreground command, whatever this worker inherited
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-m", "cbrules.cli", "check", "single_dim", "--stages", "16"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=as_at_a_terminal)
        try:
            assert p.stdout.readline().startswith("single_dim: options given: --stages 16;")  # past start-up
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        if not re.search(r"^\d+ trip counts: ", out, re.M):  # interrupted before its end
            assert p.returncode == 130 and err == "", err
            return
    with open("/proc/self/status") as f:  # what this worker passes on to the processes it starts
        mine = " ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn")))
    pytest.fail(f"check single_dim --stages 16 finished before SIGINT reached it in three tries ({mine})")


# ------------------------------------------------------------------ issue 28: kernel files, output, rule text
def test_a_kernel_file_that_never_ends_is_stopped_by_the_time_bound(files, capsys, monkeypatch):
    from cbrules import kernelfile
    monkeypatch.setenv(kernelfile.TIMEOUT_VAR, "0.5")
    for name, doing in (("forever", "running the kernel"), ("buildforever", "calling build() of the kernel")):
        with within(10):
            assert cli.main(["lower", files[name]]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{doing} file took more than 0.5 s" in err, err
        assert f"set {kernelfile.TIMEOUT_VAR} (seconds; 0: no bound; default 30)" in err


def test_the_time_bound_keeps_an_alarm_the_caller_set(files, monkeypatch):
    from cbrules import kernelfile
    monkeypatch.setenv(kernelfile.TIMEOUT_VAR, "0.3")
    with within(10):  # the test's own alarm: still set, less the time spent, after the bound rang
        with pytest.raises(kernelfile.KernelFileTimeout, match="took more than 0.3 s"):
            kernelfile.load_kernel(files["forever"])
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 8 < left < 10
    monkeypatch.setenv(kernelfile.TIMEOUT_VAR, "soon")
    with pytest.raises(kernelfile.CliError, match="CBRULES_KERNEL_FILE_TIMEOUT=soon is not a number of seconds"):
        kernelfile.load_kernel(files["forever"])


class _Full:
    """A stream on a full disk (as stdout on /dev/full)."""
    encoding = "utf-8"

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass


def test_stdout_closed_full_or_ascii_ends_in_a_named_error(monkeypatch, capsys, tmp_path):
    import io
    monkeypatch.setattr(sys, "stdout", None)  # `cbrules kernels >&-`
    assert cli.main(["kernels"]) == 141
    assert "stdout is closed (>&-)" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdout", _Full())
    assert cli.main(["kernels"]) == 1
    assert capsys.readouterr().err == "cbrules: error: cannot write to stdout: No space left on device\n"
    folder = write_rules(tmp_path / "r", '(graph-rule r\u00e8gle :phase cb-normalize :doc "\u00e9t\u00e9" '
                         ':match ((for ?L)) :rewrite ())\n').parent
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out)
    assert cli.main(["rules", "list", str(folder)]) == 0  # PYTHONIOENCODING=ascii and a non-ASCII rule name
    ascii_out.flush()
    assert "r\\xe8gle" in ascii_out.buffer.getvalue().decode("ascii")


def test_process_stdout_closed_full_or_ascii_is_a_named_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "cbrules.cli", "kernels"], stderr=subprocess.PIPE, text=True,
                       preexec_fn=lambda: os.close(1), timeout=60)  # as `cbrules kernels >&-`
    assert p.returncode == 141 and "Traceback" not in p.stderr
    assert p.stderr == "cbrules: error: stdout is closed (>&-), so the output has nowhere to go; redirect it " \
                       "to a file or to /dev/null instead\n"
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            p = subprocess.run([sys.executable, "-m", "cbrules.cli", "kernels"], stdout=full, stderr=subprocess.PIPE,
                               text=True, timeout=60)
        assert (p.returncode, p.stderr) == (1, "cbrules: error: cannot write to stdout: No space left on device\n")
    folder = write_rules(tmp_path / "r", '(graph-rule r\u00e8gle :phase nowhere :match ((for ?L)) :rewrite ())\n')
    p = run("rules", "list", str(folder.parent), timeout=60, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert p.returncode == 1 and p.stderr.startswith("cbrules: RuleError: ") and "rule r\\xe8gle: unknown phase" \
        in p.stderr and "Traceback" not in p.stderr, p.stderr


FORGED = "cbrules: ok: all checks passed"


def test_file_names_and_fail_texts_print_escaped(tmp_path, capsys):
    """A newline, CR or ESC in a rule file's name or a rule's text never forges a line of output
    nor reaches the terminal."""
    folder = tmp_path / "r"
    write_rules(folder, "(graph-rule x :phase\n", f"a\n{FORGED}\r\x1b[2J.rules")
    assert cli.main(["rules", "check", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\r" not in err and f"a\\n{FORGED}\\r\\x1b[2J" in err
    last = api.load_rules().phases[-1]
    fail = write_rules(tmp_path / "f", f'(phase hostile :after {last})\n(graph-rule f :phase hostile :doc "d\\n'
                       f'{FORGED}\x1b[31m" :match ((for ?L)) :rewrite ((fail "no\\n{FORGED}\\n\x1b[2J")))\n').parent
    escape = write_rules(tmp_path / "e", "(phases p\x1b[31mred)\n").parent
    assert cli.main(["rules", "check", str(escape)]) == 0
    assert "p\\x1b[31mred" in capsys.readouterr().out  # whatever prints a rule file's words: no escapes
    assert cli.main(["rules", "list", str(fail)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and f"d\\n{FORGED}\\x1b[31m" in out and not any(
        line.startswith("cbrules") for line in out.splitlines())
    assert cli.main(["lower", "single_dim", "--rules", str(fail)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and f"no\\n{FORGED}\\n\\x1b[2J" in err, err


def test_a_symlinked_rule_file_outside_any_folder_is_refused_unread(tmp_path, capsys, monkeypatch):
    from cbrules import sexpr
    secret = tmp_path / "secret" / "key.txt"
    secret.parent.mkdir()
    secret.write_text("SECRET-TOKEN-8472\n")
    (tmp_path / "r").mkdir()
    link = tmp_path / "r" / "x.rules"
    link.symlink_to(secret)

    read = sexpr.read_regular

    def never_the_secret(path, *a, **k):
        assert os.path.realpath(path) != str(secret), "the linked file was opened"
        return read(path, *a, **k)
    monkeypatch.setattr(sexpr, "read_regular", never_the_secret)
    for argv in (["rules", "check", str(link)], ["lower", "single_dim", "--rules", str(link)],
                 ["rules", "list", "--rules", str(link)]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert "x.rules: symlink to" in err and "outside the rule folder" in err and "SECRET" not in err, err


def test_a_rule_folder_1100_folders_deep_is_not_walked(tmp_path, capsys):
    """Sub-folders of a rule folder are not read (docs/cli.md), so a deep chain costs nothing: its
    rule file, 1,100 folders down, is neither read nor an error."""
    deep = tmp_path / "r"
    chain = [deep]
    for _ in range(1100):  # os.makedirs and shutil.rmtree recurse once per folder: made and removed here
        chain.append(chain[-1] / "d")
    for folder in chain:
        folder.mkdir()
    (chain[-1] / "x.rules").write_text("(phases p) (bad\n")  # unreadable as rules, were it read
    try:
        with within(10):
            assert cli.main(["rules", "check", str(deep)]) == 0
    finally:
        (chain[-1] / "x.rules").unlink()
        for folder in reversed(chain):
            folder.rmdir()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("ok: "), captured


def test_error_text_keeps_only_the_lines_an_error_has():
    from cbrules import cli_output
    from cbrules.codegen.errors import CompileError
    from cbrules.rewrite.rulefile import RuleErrors
    from cbrules.sexpr import Pos, RuleError
    assert cli_output.error_text(ValueError(f"a\n{FORGED}\x1b[2J")) == f"a\\n{FORGED}\\x1b[2J"
    both = RuleErrors([RuleError(Pos("a\nb.rules", 1, 2), "x\x1by"), RuleError(Pos("c.rules", 3, 4), "z")])
    assert cli_output.error_text(both) == "a\\nb.rules:1:2: x\\x1by\nc.rules:3:4: z"
    log = "k.cu(3): error: identifier \"q\x1b\" is undefined\n1 error detected"
    assert cli_output.error_text(CompileError(log)) == "k.cu(3): error: identifier \"q\\x1b\" is undefined\n" \
                                                       "1 error detected"


def test_a_kernel_file_named_like_a_placeholder_stays_text_in_the_viewer(tmp_path, capsys):
    kernel = tmp_path / "{{DATA}}.py"
    kernel.write_text("from cbrules.kernels import get\n\ndef build():\n    return get('single_dim').build(stages=2)\n")
    page = tmp_path / "t.html"
    assert cli.main(["trace", str(kernel), "--stop-after", "2", "--html", str(page)]) == 0, capsys.readouterr().err
    html = page.read_text()
    assert html.count('"steps":') == 1 and "<title>cbrules trace {{DATA}}: 2 steps</title>" in html


@pytest.mark.parametrize("argv, needle", [
    (["compile", "attention", "--scale", "nan"], "scale=nan: give a positive finite number"),
    (["compile", "attention", "--scale", "1e400"], "scale=inf: give a positive finite number"),
    (["compile", "attention", "--head-dim", "-1"], "head_dim=-1: built for 64, 128, 256"),
    (["check", "attention", "--head-dim", "9" * 25], "built for 64, 128, 256"),
    (["compile", "matmul_tc", "--epilogue", "\x1b[2J\nok"], "is not one of none, bias"),
    (["compile", "single_dim", "--pingpong"], "--pingpong applies to the built-in matmul_tc only"),
    (["compile", "attention", "--pingpong"], "--pingpong applies to the built-in matmul_tc only"),
    (["compile", "matmul_tc", "--head-dim", "64"], "takes no such parameters"),  # a wrong command line: 2
])
def test_the_tensor_core_options_refuse_hostile_values_by_name(argv, needle, capsys):
    """The options of the attention, epilogue and ping-pong kernels: one escaped line, exit 1 (a
    refused variant) or 2 (an option the kernel does not take), fast."""
    with within(10):
        assert cli.main(argv) == (2 if needle == "takes no such parameters" else 1)
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "\x1b" not in err, err
