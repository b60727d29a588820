"""What a user reads or pipes from the command line: clean stdout, help that says what a command
takes, ids and term text, short paths, aligned lists, suggestions, exit codes, units."""
import os
import re

import pytest

from cbrules import cli, shipped
from cbrules.cli import main
from cbrules.rewrite import rulefile
from rulekit import write_rules

ROOT = shipped.PACKAGE.parent


def test_compile_to_a_file_through_stdout_is_only_the_source(capsys):
    assert main(["compile", "exp1d_tma"]) == 0
    got = capsys.readouterr()
    assert got.out.rstrip().endswith("}") and "registers" not in got.out.splitlines()[-1]
    assert "exp1d_tma: " in got.err and "registers" in got.err


def test_check_takes_a_shape_and_says_it_takes_a_kernel_file(capsys):
    assert main(["check", str(ROOT / "examples" / "rms_norm.py"), "--shape", "3,1000", "--stages", "2"]) == 0
    out = capsys.readouterr().out
    assert "shape 3x1000" in out and "1 case: 1 ok, 0 failed" in out
    assert re.search(r"^\s+-\s+3x1000\s+ok", out, re.M)
    assert main(["check", "single_dim", "--shape", "3000"]) == 0
    assert "1 case: 1 ok" in capsys.readouterr().out
    helps = {a.dest: a.help for a in cli.parser()._subparsers._group_actions[0].choices["check"]._actions}
    assert "Python file" in helps["kernel"] and "one case" in helps["shape"]


def test_checks_table_states_units_and_tolerances(capsys):
    assert main(["check", "single_dim", "--stages", "2"]) == 0
    out = capsys.readouterr().out
    assert "largest absolute difference" in out and "atol + rtol * |expected|" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("trips"))
    assert "|err| numpy" in header and "rtol, atol" in header
    assert re.search(r"^\s+3\s+\S+\s+ok\s+0\s+0\s+1e-05, 1e-06", out, re.M)


def test_rule_folders_are_read_without_their_sub_folders(tmp_path):
    write_rules(tmp_path / "mine", "(phase mine :after cb-pipeline)\n")
    write_rules(tmp_path / "mine" / "backup", "(phase stale :after cb-pipeline)\n")
    phases = rulefile.load(rulefile.rule_dirs([tmp_path / "mine"])).phases
    assert "mine" in phases and "stale" not in phases


def test_an_empty_log_query_says_nothing_matched(capsys):
    assert main(["trace", "single_dim", "log", "--rule", "cb-war-*", "--phase", "cb-stage", "--node", "12"]) == 1
    got = capsys.readouterr()
    assert "nothing matched" in got.err and got.out == ""
    assert main(["trace", "single_dim", "log", "--rule", "cb-war-*"]) == 0
    assert "cb-war-sync @ rules/circular_buffer.rules:" in capsys.readouterr().out


def test_lower_prints_node_ids_and_term_text(capsys):
    assert main(["lower", "matmul_tc"]) == 0
    out = capsys.readouterr().out
    assert "Term(" not in out and "{'" not in out
    assert re.search(r"^\s*#\d+ mma ", out, re.M)
    assert "coords: (" in out  # a dictionary's terms printed as text


def test_paths_are_short_from_any_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert shipped.shown(shipped.RULES / "circular_buffer.rules") == "rules/circular_buffer.rules"
    assert shipped.shown(shipped.PACKAGE / "kernels" / "tiled2d.py") == "cbrules/kernels/tiled2d.py"
    assert shipped.shown(tmp_path / "mine" / "x.rules") == os.path.join("mine", "x.rules")
    assert shipped.shown("/elsewhere/x.rules") == "/elsewhere/x.rules"
    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    assert " rules/circular_buffer.rules:" in out and str(shipped.RULES) not in out
    assert main(["trace", "multi_dim", "history", "--node", "13"]) == 0
    out = capsys.readouterr().out
    assert str(ROOT) not in out and "rules/circular_buffer.rules:" in out
    assert main(["trace", "multi_dim", "cuda"]) == 0  # the annotated CUDA
    out = capsys.readouterr().out
    assert str(ROOT) not in out and "from build @ cbrules/kernels/tiled2d.py:" in out
    assert main(["trace", "multi_dim", "--html", "steps.html"]) == 0  # the viewer
    page = (tmp_path / "steps.html").read_text()
    assert str(ROOT) not in page and "rules/circular_buffer.rules:" in page


def test_kernels_line_up():
    from cbrules.kernels import CATALOG
    lines = []
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert main(["kernels"]) == 0
    lines = buf.getvalue().splitlines()
    columns = {line.index(CATALOG[line.split()[0]]) for line in lines}
    assert len(lines) == len(CATALOG) and len(columns) == 1


def test_a_misspelt_kernel_gets_a_suggestion(capsys):
    assert main(["lower", "single_dmi"]) == 2
    assert "did you mean 'single_dim'?" in capsys.readouterr().err


def test_run_without_a_gpu_is_a_named_error_not_a_wrong_command_line(monkeypatch, capsys):
    from cbrules.codegen import runtime
    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    assert main(["run", "exp1d_tma"]) == 1
    assert "NoGpuError: no compute-capability 9.x GPU" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["compile", "exp1d_tma", "--quiet"]])
def test_quiet_compile_leaves_stdout_empty(argv, capsys):
    assert main(argv) == 0
    got = capsys.readouterr()
    assert got.out == "" and "registers" in got.err
