"""Fragments as values on a Hopper GPU against float64 numpy, outputs poisoned: matmul_tc's epilogues in both
dtypes at 128x128x64, 500x1000x304 and 4096^3 (warp-specialized, and one not), both B layouts; the example
kernel file; fragment reductions; the register-A MMA (P in registers) with V in both layouts."""
import functools
import sys
from pathlib import Path

import numpy as np
import pytest

from cbrules import api
from cbrules.kernelfile import load_kernel
from cbrules.kernels import KERNELS
from cbrules.kernels import specs
from cbrules.kernels.matmul_tc import EPILOGUES
from gpucheck import poisoned_run

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).parent))
SPEC = KERNELS["matmul_tc"]
WS = dict(warp_specialize=True, registers=(40, 232))
SHAPES = ((128, 128, 64), (500, 1000, 304), (4096, 4096, 4096))  # K = 304: TMA needs 16-byte row pitches


@functools.lru_cache(maxsize=None)
def _compiled(epilogue, dtype, b_layout="nk", ws=True, stages=4, persistent=0):
    spec = specs.matmul_tc_variant(SPEC, b_layout, epilogue)
    kernel = spec.build(stages=stages, dtype=dtype, **(WS if ws else {})) if not persistent else \
        spec.factory(stages=stages, dtype=dtype, persistent=persistent, **(WS if ws else {}))
    return spec, api.compile(kernel)


_PRODUCTS: dict = {}
_HALF = ("bfloat16", "float16")


def _product(args, key, b_layout):
    """a @ b^T (or a @ b) in float64, once per inputs (every epilogue draws the same a and b first)."""
    if key not in _PRODUCTS:
        _PRODUCTS.clear()  # a 4096^2 product is 128 MB: keep one
        b = args["b"].astype(np.float64)
        _PRODUCTS[key] = args["a"].astype(np.float64) @ (b.T if b_layout == "nk" else b)
    return _PRODUCTS[key]


def _run(epilogue, dtype, shape, b_layout="nk", ws=True, seed=0, persistent=0):
    spec, ck = _compiled(epilogue, dtype, b_layout, ws, persistent=persistent)
    args = spec.make_inputs(shape, np.random.default_rng(seed), dtype)
    prod = _product(args, (shape, dtype, seed, b_layout), b_layout)
    widened = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype.name in _HALF else v
               for k, v in args.items()}
    want = specs._mm_tc_epilogue_reference(epilogue, lambda a: {"c": prod}, widened)
    return poisoned_run(ck, args, want, spec.outputs, *spec.tolerances(shape, dtype), shape)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
def test_matmul_tc_epilogues(epilogue, dtype, shape):
    assert not _run(epilogue, dtype, shape)


@pytest.mark.parametrize("epilogue", ["bias_gelu", "alpha_beta", "residual"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_epilogues_with_b_given_as_k_by_n(epilogue, shape):
    assert not _run(epilogue, "bfloat16", shape, b_layout="kn", seed=1)


@pytest.mark.parametrize("epilogue", ["bias_gelu", "alpha_beta"])
def test_epilogues_not_warp_specialized(epilogue):
    assert not _run(epilogue, "bfloat16", (500, 1000, 304), ws=False, seed=2)


@pytest.mark.parametrize("epilogue", ["bias_gelu", "residual"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_epilogues_of_persistent_blocks(epilogue, shape):
    assert not _run(epilogue, "bfloat16", shape, seed=4, persistent=132)


def test_the_example_kernel_file():
    spec = load_kernel(str(Path(__file__).resolve().parents[1] / "examples" / "gemm_bias_gelu.py"))
    for kw in (dict(stages=3), dict(stages=4, **WS)):
        ck = api.compile(spec.build(**kw))
        for shape in SHAPES:
            args = spec.make_inputs(shape, np.random.default_rng(3), "float32")
            assert not poisoned_run(ck, args, spec.expected(args), spec.outputs, *spec.tolerances(shape), shape)


@pytest.mark.parametrize("axis,combine,groups", [("row", "max", 1), ("row", "sum", 2), ("col", "max", 2),
                                                 ("col", "sum", 1)])
def test_fragment_reductions(axis, combine, groups):
    from test_fragments import REDUCTIONS, _args, _gemm, _product as product, _reduction, _tile_reduced
    ident, fn = REDUCTIONS[combine]
    ck = api.compile(_gemm(m_tile=64 * groups, groups=groups, body=_reduction(axis, combine, ident)))
    for shape in ((150, 72, 40), (1000, 520, 136)):
        args = _args(shape, seed=groups)
        want = {"c": _tile_reduced(product(args), 64 * groups, 64, axis, fn)}
        assert not poisoned_run(ck, args, want, ("c",), 1e-5, 1e-3 * np.sqrt(shape[2]), shape)


@pytest.mark.parametrize("v_layout", ["nk", "kn"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_register_operand_mma(dtype, v_layout):
    from test_register_mma import _inputs, _two_products, _want
    ck = api.compile(_two_products(dtype, v_layout=v_layout))
    for shape in ((64, 64, 64), (100, 152, 64), (1000, 4096, 64)):
        args = _inputs(shape, dtype, v_layout=v_layout)
        want = {"o": _want(args, dtype, v_layout=v_layout)}
        # expf is within 2 ulp, so now and then P rounds to the neighbouring bf16/f16 value (2**-8 of one term)
        assert not poisoned_run(ck, args, want, ("o",), 1e-3, 1e-2 * np.abs(want["o"]).max(), shape)


@pytest.mark.parametrize("ws", [False, True])
def test_loop_invariant_operand(ws):
    from test_register_mma import _invariant_args, _invariant_q
    ck = api.compile(_invariant_q(ws=ws))
    for m, tiles in ((64, 1), (100, 5), (1000, 64)):
        args, want = _invariant_args(m, tiles)
        assert not poisoned_run(ck, args, {"o": want}, ("o",), 1e-5, 1e-3 * np.sqrt(tiles * 64), (m, tiles))


def test_column_reduction_warp_specialized():
    from test_fragments import _args, _gemm, _product as product, _reduction, _tile_reduced
    ck = api.compile(_gemm(m_tile=128, groups=2, body=_reduction("col", "max", float("-inf")), ws=True))
    for shape in ((150, 72, 40), (1000, 520, 136)):
        args = _args(shape, seed=5)
        want = {"c": _tile_reduced(product(args), 128, 64, "col", np.max)}
        assert not poisoned_run(ck, args, want, ("c",), 1e-5, 1e-3 * np.sqrt(shape[2]), shape)
