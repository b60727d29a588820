"""FP8 on the CPU: the k32 operand layout, the instruction text, FP8 storage (rounding and saturation), the
builder's and matmul_tc's refusals, matmul_tc checked by the interpreter for every type pair, scaling and
accumulation mode, and mutations the checker must catch (a wrong k-step, a scale applied twice, a
missing promotion)."""
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker
from cbrules.ir.builder import BuildError, Kernel
from cbrules.ir.mma_layout import MmaLayoutError, k_step, operand_address, tma_tile_descriptor
from cbrules.ir.names import PRELUDE_NAMES
from cbrules.ir.terms import swizzle_index
from cbrules.kernels import KERNELS
from cbrules.kernels import matmul_tc as mtc
from cbrules.kernels.matmul_tc import MatmulTileError, matmul_tc
from cbrules.kernels.specs import matmul_tc_variant
from cbrules.reference.interp import run
from test_half import convert_kernel

SPEC = KERNELS["matmul_tc"]
WS = dict(warp_specialize=True, registers=(40, 232))
ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- layout and instruction
def test_k32_step_reads_32_bytes_of_each_swizzled_row():
    # a 64 x 128 FP8 tile as TMA writes it (128-byte rows, 128B swizzle): k-step s of the instruction reads
    # elements 32 s .. 32 s + 31 of each row, at the swizzled byte of the dense offset row * 128 + k
    assert k_step("float8_e4m3") == 32 and k_step("float8_e5m2") == 32 and k_step("bfloat16") == 16
    mn, k = np.meshgrid(np.arange(64), np.arange(32), indexing="ij")
    for s in range(4):
        desc = tma_tile_descriptor(0, 64, 128, "k", s)
        got = operand_address(desc, mn, k, "k", element_bytes=1)
        np.testing.assert_array_equal(got, swizzle_index(mn * 128 + 32 * s + k, 1, 128))


def test_fp8_operands_are_k_major_only():
    desc = tma_tile_descriptor(0, 64, 128, "k", 0)
    with pytest.raises(MmaLayoutError, match="K-major only"):
        operand_address(desc, 0, 0, "mn", element_bytes=1)


def test_instruction_text_is_k32_without_transpose_immediates():
    # the promoted default tile (128 x 256) is promoted in two column blocks of 128: n128 instructions
    src = api.generate(matmul_tc(dtype="float8_e4m3", b_dtype="float8_e5m2", **WS)).text
    assert set(re.findall(r"wgmma\.mma_async\S*", src)) == {"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2"}
    line = next(x for x in src.splitlines() if "m64n128k32" in x)
    assert line.rstrip().endswith('p, 1, 1;\\n}\\n"'), line  # scale-d, imm-scale-a/b: no tnspA/tnspB for FP8
    assert "cb_wgmma_n192_e4m3_e5m2" in PRELUDE_NAMES and "cb_e4m3" in PRELUDE_NAMES
    fast = api.generate(matmul_tc(dtype="float8_e4m3", promote=False, **WS)).text
    assert set(re.findall(r"wgmma\.mma_async\S*", fast)) == {"wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3"}
    assert "CB_FP8_TYPE(cb_e4m3" in src  # the operand tensors' type is declared (the prelude defines both)
    bf16 = api.generate(matmul_tc(**WS)).text
    assert "cb_e4m3" not in bf16 and "m64n256k16.f32.bf16.bf16" in bf16


# ----------------------------------------------------------------------------- FP8 storage
@pytest.mark.parametrize("dtype,np_type,largest", [("float8_e4m3", ml_dtypes.float8_e4m3fn, 448.0),
                                                   ("float8_e5m2", ml_dtypes.float8_e5m2, 57344.0)])
def test_fp8_store_rounds_and_saturates(dtype, np_type, largest):
    x = np.array([0.001, -0.002, 1.0, -100.0, np.nan, 0.0], np.float32).astype(np_type)
    out = np.zeros(6, np_type)
    got = run(convert_kernel(dtype, dtype, 1000.0, block=128), {"x": x, "out": out})["out"].astype(np.float64)
    want = np.clip(x.astype(np.float64) * 1000, -largest, largest).astype(np.float32).astype(np_type)
    np.testing.assert_array_equal(got[~np.isnan(got)], want.astype(np.float64)[~np.isnan(got)])
    assert got[3] == -largest and np.isnan(got[4])  # saturated, not NaN or inf; NaN stays NaN
    assert api.compile(convert_kernel(dtype, dtype, 1000.0, block=128)).cubin is not None  # the prelude's cvt forms pass NVRTC / ptxas


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("kw,match", [
    (dict(dtype="float8_e4m3", b_layout="kn"), "K-major only"),
    (dict(dtype="bfloat16", b_dtype="float8_e4m3"), "only the FP8 types mix"),
    (dict(dtype="float8_e4m3", scaling="block", promote=False), "give promote=True"),
    (dict(dtype="float8_e4m3", scaling="block", bn=192), "its width \\(96\\) must divide 128"),
    (dict(dtype="float8_e4m3", scaling="rows"), "scaling='rows'"),
    (dict(dtype="float8_e4m3", bk=64, promote=False), None),  # 64-byte rows: allowed, k32 x 2
    (dict(dtype="float8_e4m3", bk=96), "use bk = 32, 64 or 128"),
    (dict(dtype="float8_e4m3", bn=256, groups=1), "2 x 64 of the k-step part"),
    (dict(dtype="float8_e4m3", bn=200), "column blocks of equal width, a multiple of 8"),
])
def test_matmul_tc_refuses_by_name(kw, match):
    if match is None:
        matmul_tc(**kw)
        return
    with pytest.raises(MatmulTileError, match=match):
        matmul_tc(**kw)


def test_builder_refuses_fp8_mixes_and_transposed_b():
    k = Kernel("t", block=128)
    acc = k.mma_accumulator(64, 64)
    a = k.alloc("a", "shared", "float8_e4m3", (64, 128))
    b = k.alloc("b", "shared", "bfloat16", (64, 64))
    with pytest.raises(BuildError, match="only the FP8 types mix"):
        k.mma(acc, a, b)
    bt = k.alloc("bt", "shared", "float8_e5m2", (128, 64))
    with pytest.raises(BuildError, match="K-major only"):
        k.mma(acc, a, bt, b_layout="kn")
    with pytest.raises(BuildError, match="a register array of float8_e4m3"):
        k.alloc("r", "register", "float8_e4m3", (4,))


# ----------------------------------------------------------------------------- matmul_tc checked on the CPU
CASES = [("float8_e4m3", None, {}, 2, False), ("float8_e5m2", "tensor", {}, 3, True),
         ("float8_e4m3", "rowcol", {}, 2, True), ("float8_e4m3", "block", {}, 2, True),
         ("float8_e4m3", "none", {"promote": False}, 2, False), ("float8_e5m2", "rowcol", {"epilogue": "bias_gelu"}, 2, True)]


def _fp8_spec(dtype, scaling, extra):
    epilogue = extra.get("epilogue", "none")
    spec = matmul_tc_variant(SPEC, "nk", epilogue, scaling) if scaling or epilogue != "none" else SPEC
    spec = spec.for_dtype(dtype)
    if "promote" in extra:
        import dataclasses
        import functools
        spec = dataclasses.replace(spec, factory=functools.partial(spec.factory, promote=extra["promote"]))
    return spec


@pytest.mark.parametrize("dtype,scaling,extra,stages,ws", CASES, ids=lambda v: str(v))
def test_checker_passes_fp8_matmul(dtype, scaling, extra, stages, ws):
    checker = Checker(blocks="sample", dtype=dtype)
    spec = _fp8_spec(dtype, scaling, extra)
    for trips in (1, stages, stages + 2):
        res = checker.check(spec, trips, stages, warp_specialize=ws, registers=(40, 232) if ws else None)
        assert res.ok and res.status == "ok", f"trips {trips}: {res.status} {res.detail}"


@pytest.mark.parametrize("shape", [(130, 104, 256), (70, 296, 384)])
def test_block_scales_in_column_blocks_past_n(shape):
    # bn=256 in two column blocks of 128, each with its own scale of B: N = 104 puts the second block
    # wholly past the tensor (its scale index clamped to the last block, its columns not stored); N = 296
    # has a second tile whose second block starts past N
    checker = Checker(blocks=None, dtype="float8_e4m3")  # every block: the ragged tiles too
    spec = _fp8_spec("float8_e4m3", "block", {})
    assert "b_tile1" in api.generate(spec.build(dtype="float8_e4m3", **WS)).text
    res = checker.check(spec, shape[2] // 128, 2, warp_specialize=True, registers=(40, 232), shape=shape)
    assert res.ok and res.status == "ok", f"{shape}: {res.status} {res.detail}"


def test_mixed_pair_on_the_interpreter():
    # e4m3 A with e5m2 B: each read through its own type, against the float64 product
    k = matmul_tc(dtype="float8_e4m3", b_dtype="float8_e5m2", stages=2, **WS)
    rng = np.random.default_rng(3)
    m, n, kk = 130, 136, 400
    a = rng.standard_normal((m, kk), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    b = (4 * rng.standard_normal((n, kk), dtype=np.float32)).astype(ml_dtypes.float8_e5m2)
    c = np.full((m, n), np.nan, np.float32).astype(ml_dtypes.bfloat16)
    lowered = api.lower(k)
    got = run(lowered, {"a": a, "b": b, "c": c, "scale_a": 0.5, "scale_b": 1.0}, blocks="sample")["c"]
    want = (a.astype(np.float64) @ b.astype(np.float64).T) * 0.5
    done = ~np.isnan(got.astype(np.float64))
    assert done.any()
    np.testing.assert_allclose(got.astype(np.float64)[done], want[done], rtol=2 ** -7, atol=1e-3)


def test_spec_inputs_types_and_scales():
    spec = matmul_tc_variant(SPEC, scaling="block").for_dtype("float8_e5m2")
    args = spec.make_inputs((130, 300, 272), np.random.default_rng(0), "float8_e5m2")
    assert args["a"].dtype == ml_dtypes.float8_e5m2 and args["c"].dtype == ml_dtypes.bfloat16
    assert args["scale_a"].shape == (130, 3) and args["scale_b"].shape == (3, 3) and args["scale_a"].dtype == np.float32
    assert SPEC.for_dtype("float8_e4m3") is SPEC.for_dtype("float8_e4m3")  # one spec object: the checker's caches
    assert SPEC.for_dtype("bfloat16") is SPEC


# ----------------------------------------------------------------------------- mutations the checker catches
def _fails(spec, dtype="float8_e4m3", ws=True):
    res = Checker(blocks="sample", dtype=dtype).check(spec, 3, 2, warp_specialize=ws,
                                                      registers=(40, 232) if ws else None)
    return not res.ok


def test_mutation_wrong_k_step_is_caught(monkeypatch):
    # the model stepping k16 through FP8 rows (as for a 2-byte type): wrong elements or past the tile
    from cbrules.reference import interp_mma
    real = interp_mma.k_step
    monkeypatch.setattr(interp_mma, "k_step", lambda dtype: 16 if dtype.startswith("float8") else real(dtype))
    assert _fails(SPEC.for_dtype("float8_e4m3"))


def test_mutation_scale_applied_twice_is_caught(monkeypatch):
    real = mtc._scales

    def twice(k, scaling, m, n, out_dtype):
        before, after = real(k, scaling, m, n, out_dtype)
        return (lambda e: k.mul(before(e), before(e))), after
    monkeypatch.setattr(mtc, "_scales", twice)
    assert _fails(SPEC.for_dtype("float8_e4m3"))


def test_mutation_missing_promotion_is_caught(monkeypatch):
    monkeypatch.setattr(mtc, "_promote", lambda k, acc, part, factor, columns=None: None)
    assert _fails(SPEC.for_dtype("float8_e4m3"))


def test_mutation_promotion_into_the_wrong_column_block_is_caught(monkeypatch):
    # the checker's kernel is the promoted default, 128 x 256 in two column blocks: each block's part must
    # go into its own columns of the sum
    assert "b_tile1" in api.generate(SPEC.for_dtype("float8_e4m3").build(dtype="float8_e4m3", **WS)).text
    promote = mtc._promote
    monkeypatch.setattr(mtc, "_promote", lambda k, acc, part, factor, columns=None:
                        promote(k, acc, part, factor, None if columns is None else (0, columns[1])))
    assert _fails(SPEC.for_dtype("float8_e4m3"))


def test_unmutated_baseline_passes():
    assert not _fails(SPEC.for_dtype("float8_e4m3"))


# ----------------------------------------------------------------------------- the acceptance commands
def test_cli_compile_and_check_fp8():
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "cbrules.cli"]
    out = subprocess.run(cmd + ["compile", "matmul_tc", "--dtype", "float8_e4m3"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", out.stdout)
    # the other command, `cbrules check matmul_tc --dtype float8_e4m3 --stages 3`, is docs/fp8.md's and
    # runs in tests/test_docs.py (exit status 0: every case passed); run twice it cost the suite 35 s
    assert "cbrules check matmul_tc --dtype float8_e4m3 --stages 3" in (ROOT / "docs" / "fp8.md").read_text()


# ----------------------------------------------------------------------------- hostile inputs: named refusals
@pytest.fixture(scope="module")
def fp8_kernels():
    return {s: api.compile(matmul_tc(dtype="float8_e4m3", scaling=s, **WS)) for s in ("tensor", "block")}


def _fp8_args(m=130, n=136, k=256, **over):
    args = {"a": np.zeros((m, k), ml_dtypes.float8_e4m3fn), "b": np.zeros((n, k), ml_dtypes.float8_e4m3fn),
            "c": np.zeros((m, n), ml_dtypes.bfloat16), "scale_a": 1.0, "scale_b": 1.0}
    return {**args, **over}


@pytest.mark.parametrize("over,match", [
    (dict(a=np.zeros((130, 256), ml_dtypes.float8_e5m2)), "float8_e4m3"),  # the other FP8 type
    (dict(b=np.zeros((136, 256), np.float32)), "float8_e4m3"),  # not dequantized by the launcher
    (dict(scale_a=float("nan")), "scale_a"),
    (dict(scale_b="2"), "scale_b"),
])
def test_launch_refuses_bad_fp8_arguments_by_name(fp8_kernels, over, match):
    from cbrules.ir.bind import LaunchError
    with pytest.raises(LaunchError, match=match):
        fp8_kernels["tensor"].check(**_fp8_args(**over))
    fp8_kernels["tensor"].check(**_fp8_args())  # the same arguments without the bad one pass


def test_launch_refuses_block_scales_of_the_wrong_shape(fp8_kernels):
    from cbrules.ir.bind import LaunchError
    good = dict(scale_a=np.ones((130, 2), np.float32), scale_b=np.ones((2, 2), np.float32))
    fp8_kernels["block"].check(**_fp8_args(**good))
    with pytest.raises(LaunchError, match="scale_a"):  # K = 256 is two blocks of 128, not one
        fp8_kernels["block"].check(**_fp8_args(**{**good, "scale_a": np.ones((130, 1), np.float32)}))


def test_an_object_posing_as_a_torch_fp8_tensor_is_refused(fp8_kernels):
    from cbrules.ir.bind import LaunchError

    class Posing:
        dtype = "torch.float8_e4m3fn"

        def view(self, _):
            raise AssertionError("never viewed: only torch tensors are")
    with pytest.raises(LaunchError, match="only torch tensors"):
        fp8_kernels["tensor"].check(**_fp8_args(a=Posing()))


@pytest.mark.parametrize("argv,match", [
    (["compile", "single_dim", "--dtype", "float8_e4m3"], "float8_e4m3"),
    (["compile", "matmul_tc", "--dtype", "bfloat16", "--scaling", "block"], "scaling='block'"),
    (["compile", "attention", "--scaling", "rowcol"], "built-in matmul_tc only"),
    (["compile", "matmul_tc", "--scaling", "per-row"], "invalid choice"),
])
def test_cli_refuses_fp8_options_by_name(argv, match):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "cbrules.cli", *argv], capture_output=True, text=True)
    assert out.returncode != 0 and match in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_kernel_file_may_declare_fp8_dtypes(tmp_path):
    from cbrules.errors import CliError
    from cbrules.kernelfile import load_kernel
    body = ("from cbrules.ir.builder import Kernel\nDTYPES = {dtypes}\n"
            "def build(dtype='float8_e4m3'):\n    k = Kernel('k', block=32)\n    k.tensor('x', (4,), dtype)\n"
            "    k.grid(1)\n    return k\n")
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(body.format(dtypes=("float8_e4m3", "float8_e5m2")))
    bad.write_text(body.format(dtypes=("float8",)))
    assert load_kernel(str(good)).dtypes == ("float8_e4m3", "float8_e5m2")
    with pytest.raises(CliError, match="DTYPES must be a tuple of tensor types from float32, float16, bfloat16, "
                                       "float8_e4m3, float8_e5m2"):
        load_kernel(str(bad))
