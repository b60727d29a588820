"""Kernel files are first-class: the command line's options reach build() when it takes them and are
refused by name when it does not; `cbrules check FILE` runs a file that defines inputs, reference and
OUTPUTS (TOLERANCE optional); the example file of docs/kernel-files.md (examples/rms_norm.py) runs on the CPU here and
on the H200 in test_traps_gpu.py."""
import runpy
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cbrules import api
from cbrules.cli import main
from cbrules.reference.interp import run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rms_norm.py"

RECORDER = """
import json, os
from cbrules.kernels import get
OUTPUTS = ("out",)
SHAPE = (6, 512)
def build(**options):
    with open(os.environ["CB_SEEN"], "w") as f:
        json.dump({k: v for k, v in options.items()}, f)
    return get("multi_dim").build(stages=options.get("stages") or 2)
"""


def test_every_option_reaches_a_build_that_takes_it(tmp_path, monkeypatch):
    f = tmp_path / "k.py"
    f.write_text(RECORDER)
    seen = tmp_path / "seen.json"
    monkeypatch.setenv("CB_SEEN", str(seen))
    assert main(["lower", str(f), "--stages", "4", "--prefetch", "1", "--war", "mbarrier", "--shape", "5,1000",
                 "--dtype", "bfloat16", "--tma-store", "--swizzle", "64B"]) == 0
    import json
    got = json.loads(seen.read_text())
    assert got == {"stages": 4, "prefetch": 1, "war": "mbarrier", "shape": [5, 1000], "dtype": "bfloat16",
                   "tma_store": True, "swizzle": "64B"}
    assert main(["lower", str(f), "--warp-specialize", "--registers", "40,232"]) == 0
    got = json.loads(seen.read_text())
    assert got["warp_specialize"] is True and got["registers"] == [40, 232]


@pytest.mark.parametrize("option, key", [(["--shape", "5,1000"], "shape"), (["--dtype", "float16"], "dtype"),
                                         (["--swizzle", "32B"], "swizzle"), (["--tma-store"], "tma_store"),
                                         (["--war", "sync"], "war")])
def test_an_option_build_does_not_take_is_named(tmp_path, capsys, option, key):
    f = tmp_path / "k.py"
    f.write_text("from cbrules.kernels import get\ndef build(stages=None):\n    return get('single_dim').build(stages=stages)\n")
    assert main(["compile", str(f), "--quiet", *option]) == 2
    err = capsys.readouterr().err
    assert f"build() takes no {key!r} parameter, so {option[0]} would be ignored" in err and f"add {key}=None" in err


def test_check_runs_the_example_file_for_every_trip_count(capsys):
    assert main(["check", str(EXAMPLE), "--stages", "2", "--sample"]) == 0
    out = capsys.readouterr().out
    assert "trip counts 0..8" in out and "9 trip counts: 9 ok, 0 failed" in out


def test_check_without_shape_for_trips_runs_one_case_at_shape(tmp_path, capsys):
    text = EXAMPLE.read_text().replace("def shape_for_trips(", "def _unused(").replace("SHAPE = (512, 4096)", "SHAPE = (2, 600)")
    f = tmp_path / "rms.py"
    f.write_text(text)
    assert main(["check", str(f), "--stages", "3"]) == 0
    out = capsys.readouterr().out
    assert "shape 2x600" in out and "1 case: 1 ok, 0 failed" in out


def test_check_names_what_a_kernel_file_lacks(tmp_path, capsys):
    f = tmp_path / "k.py"
    f.write_text("from cbrules.kernels import get\ndef build(stages=None):\n    return get('single_dim').build(stages=stages)\n")
    assert main(["check", str(f)]) == 2
    assert "must define inputs(shape, rng), reference(inputs), OUTPUTS" in capsys.readouterr().err


def test_check_uses_the_file_tolerance_and_fails_a_wrong_reference(tmp_path, capsys):
    f = tmp_path / "rms.py"
    f.write_text(EXAMPLE.read_text().replace("TOLERANCE = (1e-4, 1e-5)", "TOLERANCE = (0.0, 0.0)")
                 .replace('+ args["eps"])}', '+ args["eps"]) * 1.0001}'))
    assert main(["check", str(f), "--stages", "2", "--sample"]) == 1
    assert "differs from numpy" in capsys.readouterr().out
    f.write_text(EXAMPLE.read_text().replace("TOLERANCE = (1e-4, 1e-5)", "TOLERANCE = 'tight'"))
    assert main(["check", str(f)]) == 2
    assert "TOLERANCE must be (rtol, atol)" in capsys.readouterr().err


def test_the_example_matches_numpy_on_the_cpu():
    ns = runpy.run_path(str(EXAMPLE))
    args = ns["inputs"]((3, 1000), np.random.default_rng(0))
    got = run(api.lower(ns["build"](stages=4)), args)["out"]
    np.testing.assert_allclose(got, ns["reference"](args)["out"], rtol=1e-4, atol=1e-5)


def test_the_docs_state_the_contract_the_code_keeps():
    readme = (ROOT / "docs" / "kernel-files.md").read_text()
    assert "inputs(size" not in readme
    for needle in ("inputs(shape, rng)", "reference(inputs)", "OUTPUTS", "TOLERANCE", "shape_for_trips(trips)",
                   "examples/rms_norm.py"):
        assert needle in readme, needle
