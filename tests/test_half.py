"""float16 / bfloat16 kernels on the CPU: builder checks, codegen text, NVRTC compiles, and the seed
matrix through the interpreter (lowered vs unlowered vs numpy, protocol checked)."""
import ml_dtypes
import numpy as np
import pytest

from cbrules import api, cli
from cbrules.ir.bind import LaunchError
from cbrules.ir.builder import BuildError, Kernel, TmaBoxError, threadIdx
from cbrules.check import Checker
from cbrules.reference.interp import run
from cbrules.kernels import KERNELS, SEED_MATRIX, UnsupportedDtypeError
from cbrules.codegen import runtime

HALF = ("float16", "bfloat16")


def convert_kernel(dtype_in: str, dtype_out: str, scale: float = 1.0, block: int = 64) -> Kernel:
    """``out = x * scale`` elementwise over one block: a load widening ``dtype_in`` and a store rounding
    to ``dtype_out`` (tests/test_fp8.py's FP8 saturation uses it too)."""
    k = Kernel("convert", block=block)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,), dtype_in), k.tensor("out", (n,), dtype_out)
    k.grid(1)
    with k.if_(threadIdx.x.lt(n)):
        k.store(out, threadIdx.x, k.mul(k.load(x, threadIdx.x), scale))
    return k


@pytest.mark.parametrize("dtype", HALF)
def test_store_rounds_to_nearest_even_and_load_widens(dtype):
    np_dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)
    ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
    # ties at 1 + ulp/2 (to even: 1), 1 + 3ulp/2 (to even: 1 + 2ulp), and plain values
    x = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 4, -2.75, 1e-3] + [0.5] * 59, np.float32)
    got = run(convert_kernel("float32", dtype), {"x": x, "out": np.zeros(64, np_dt)})["out"]
    assert got.dtype == np_dt
    assert got[0] == 1.0 and got[1] == np.float32(1 + 2 * ulp)
    np.testing.assert_array_equal(got, x.astype(np_dt))
    back = run(convert_kernel(dtype, "float32"), {"x": got, "out": np.zeros(64, np.float32)})["out"]
    np.testing.assert_array_equal(back, got.astype(np.float32))  # widening is exact


def test_registers_and_register_arrays_are_float32():
    k = Kernel("k")
    with pytest.raises(BuildError, match="registers compute in float32"):
        k.assign(0.0, dtype="bfloat16")
    with pytest.raises(BuildError, match="register array of float16"):
        k.alloc("r", "register", "float16", (4,))
    with pytest.raises(BuildError, match="unsupported dtype 'float8'"):
        k.tensor("x", (16,), "float8")


def test_half_box_must_span_16_bytes():
    k = Kernel("k")
    x = k.tensor("x", (64,), "bfloat16")
    with pytest.raises(TmaBoxError, match="multiple of 8 elements"):
        k.tensor_map(x, box=(4,))


def test_kernel_without_half_variant_is_refused():
    with pytest.raises(UnsupportedDtypeError, match="exp1d_tma: dtype 'float16'"):
        KERNELS["exp1d_tma"].build(dtype="float16")


def test_float32_text_has_no_half_prelude_and_half_text_does():
    f32 = api.generate(KERNELS["pointwise"].build(stages=2)).text
    assert "cb_half" not in f32 and "cb_bf16" not in f32
    bf = api.generate(KERNELS["pointwise"].build(stages=2, dtype="bfloat16")).text
    assert "const cb_bf16* __restrict__ x" in bf and "cb_bf16* x_tile" in bf
    assert "cvt.rn.bf16.f32" in bf and "#include" not in bf  # NVRTC ships no cuda_bf16.h
    assert "float v0 = 0;" in bf  # arithmetic stays float32
    # one arrive-expect-tx a stage covers both tiles: 2 x 4 x 256 x 2 bytes
    assert "cb_mbar_arrive_expect_tx(cb_smem_addr(&cb_full_3[j]), 4096)" in bf


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", SEED_MATRIX)
def test_nvrtc_compiles_half_seed_kernels(name, dtype):
    ck = api.compile(KERNELS[name].build(stages=3, dtype=dtype))
    assert ck.cubin.cubin and ck.cubin.resources.spill_stores in (0, -1)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", SEED_MATRIX)
def test_half_seed_matrix_in_the_interpreter(name, dtype):
    checker = Checker(blocks="sample", dtype=dtype)
    spec = KERNELS[name]
    for stages in (2, 3, 4):
        res = checker.check(spec, stages + 1, stages)
        assert res.status == "ok", f"{name} {dtype} S={stages}: {res.detail}"
        assert res.err_numpy > 0 or name == "pointwise"  # the rounding shows: the comparison is real


def test_half_outputs_outside_tolerance_are_caught():
    spec = KERNELS["multi_dim"]
    shape = spec.shape_for_trips(3)
    args = spec.make_inputs(shape, np.random.default_rng(0), "bfloat16")
    want = spec.expected(args)["out"]
    rtol, atol = spec.tolerances(shape, "bfloat16")
    assert rtol < 1e-2  # a bfloat16 result one ulp off (2**-7 relative) is a failure
    off = (want * (1 + 2.0 ** -6)).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert not np.allclose(off, want, rtol=rtol, atol=atol)


def test_launch_refuses_a_float32_array_for_a_bfloat16_tensor():
    ck = api.compile(KERNELS["multi_dim"].build(stages=2, dtype="bfloat16"))
    x = np.zeros((8, 512), np.float32)
    with pytest.raises(LaunchError, match="tensor 'x' is float32, the kernel expects bfloat16"):
        ck.check(x=x, out=np.zeros((8, 512), ml_dtypes.bfloat16))
    ck.check(x=x.astype(ml_dtypes.bfloat16), out=np.zeros((8, 512), ml_dtypes.bfloat16))


def test_bfloat16_borrow_falls_back_to_dlpack_when_the_array_interface_refuses():
    class TorchLikeBf16:  # torch raises TypeError for bfloat16's __cuda_array_interface__
        @property
        def __cuda_array_interface__(self):
            raise TypeError("Cannot interpret 'torch.cuda.BFloat16Tensor' as a data type")

        def __dlpack_device__(self):
            return (1, 0)  # a CPU tensor: not borrowed

        def __dlpack__(self):
            raise AssertionError("not reached for a CPU tensor")

    with pytest.raises(TypeError, match="cannot make a DeviceArray from TorchLikeBf16"):
        runtime.as_device_array(TorchLikeBf16())


def test_bfloat16_described_as_raw_bytes_goes_through_dlpack():
    calls = []

    class TorchBf16:  # torch 2.11 describes a bfloat16 tensor as typestr "|V2"
        __cuda_array_interface__ = {"shape": (4,), "typestr": "|V2", "data": (4096, False), "version": 3}

        def __dlpack_device__(self):
            calls.append("dlpack")
            return (1, 0)  # a CPU tensor here, so the DLPack path ends without a capsule

        def __dlpack__(self):
            raise AssertionError("not reached for a CPU tensor")

    with pytest.raises(TypeError, match="cannot make a DeviceArray from TorchBf16"):
        runtime.as_device_array(TorchBf16())
    assert calls == ["dlpack"]


def test_cli_compile_and_check_in_half(capsys):
    assert cli.main(["compile", "multi_dim", "--dtype", "float16", "--stages", "2"]) == 0
    assert "const cb_half* __restrict__ x" in capsys.readouterr().out
    assert cli.main(["compile", "multi_dim", "--dtype", "float8"]) == 2
    assert "invalid choice: 'float8'" in capsys.readouterr().err
