"""The row kernels (rms_norm, layer_norm, softmax) in the interpreter against float64 numpy, outputs
poisoned, in every dtype, at row lengths that split into one and into several vectors a thread; the
refusals by name; the CLI compiles them (16-byte vector accesses, no spills)."""
import numpy as np
import pytest

from cbrules import api
from cbrules.cli import main
from cbrules.kernels import KERNELS
from cbrules.kernels.rows import OPS, RowError, row_op, row_threads
from cbrules.reference.interp import run

TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2}  # the output's rounding (values up to ~4)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype,row", [("float32", 128), ("float32", 2048), ("float16", 256), ("bfloat16", 4096)])
def test_rows_match_numpy(op, dtype, row):
    spec = KERNELS[op]
    shape = (3, row)
    args = spec.make_inputs(shape, np.random.default_rng(row), dtype)
    want = spec.expected(args)
    got = run(api.lower(spec.build(shape, dtype=dtype)), args)
    out = np.asarray(got["out"]).astype(np.float64)
    assert not np.isnan(out).any(), "an element was not written"
    np.testing.assert_allclose(out, want["out"], rtol=TOL[dtype], atol=TOL[dtype])


def test_the_split_of_a_row():
    assert row_threads(4096, "bfloat16") == 512 and row_threads(4096, "float32") == 1024
    assert row_threads(11008, "bfloat16") == 0  # 2^8 x 43: no whole-warp split of 16-byte vectors
    assert row_threads(100, "float32") == 0


def test_refusals_by_name():
    for kw, what in ((dict(op="gelu"), "op="), (dict(dtype="int32"), "dtype"), (dict(row=0), "row="),
                     (dict(row=100), "multiple of 128"), (dict(row=4096, threads=100), "whole warps"),
                     (dict(eps=float("nan")), "eps="), (dict(eps=-1.0), "eps="), (dict(row=True), "row=")):
        with pytest.raises(RowError, match=what):
            row_op(**kw)


@pytest.mark.parametrize("op", OPS)
def test_compile_vectorises_and_does_not_spill(op, capsys):
    assert main(["compile", op, "--dtype", "bfloat16", "--shape", "64,4096"]) == 0
    captured = capsys.readouterr()
    assert "cb_vcopy<16>" in captured.out and "0/0 B spill stores/loads" in captured.err


@pytest.mark.parametrize("argv,code,match", [
    (["compile", "rms_norm", "--shape", "3,100"], 1, "RowError: row_op: a row of 100"),
    (["compile", "softmax", "--shape", "3,0"], 2, "sizes must be >= 1"),
    (["compile", "layer_norm", "--shape", "3"], 2, "takes 2 size"),
    (["compile", "rms_norm", "--warp-specialize", "--shape", "3,256"], 2, "no circular-buffer options"),
])
def test_cli_misuse_is_a_named_error(argv, code, match, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
