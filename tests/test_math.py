"""tanh, erf, exp2, log2, sigmoid (and rsqrt's edges): the interpreter against float64 references on random
and edge inputs, the builder's and verifier's refusals, the generated CUDA and NVRTC (the GPU runs, within
each function's documented error, are in test_math_gpu.py)."""
import math

import numpy as np
import pytest

from cbrules import api
from cbrules.ir.bind import NP_DTYPES
from cbrules.ir.builder import BuildError, Kernel, blockIdx, ceil_div, threadIdx
from cbrules.ir.ops import MATH, MATH_ERRORS, OP_DOCS
from cbrules.ir.verify import GraphError
from cbrules.reference.interp import run

INF, NAN = math.inf, math.nan
_tanh, _erf = np.vectorize(math.tanh), np.vectorize(math.erf)
# float64 references, computed otherwise than the interpreter where Python offers another way
REFERENCE = {
    "exp": lambda x: np.vectorize(lambda v: v if v != v else math.exp(v) if v < 709 else INF)(x),
    "tanh": _tanh,
    "erf": lambda x: np.where(np.abs(x) < 0.5, _erf(x), np.sign(x) * (1 - np.vectorize(math.erfc)(np.abs(x)))),
    "exp2": lambda x: np.vectorize(lambda v: v if v != v else 2.0 ** v if v < 1100 else INF)(x),
    "log2": lambda x: np.vectorize(lambda v: NAN if v < 0 or v != v else -INF if v == 0 else math.log2(v))(x),
    # no cancellation on either side (the interpreter's 1 / (1 + exp(-x)) is another formula on both)
    "sigmoid": lambda x: np.vectorize(lambda v: math.exp(v) / (1 + math.exp(v)) if v < 0 else 0.5 * (1 + math.tanh(v / 2)))(x),
    "rsqrt": lambda x: np.vectorize(lambda v: NAN if v < 0 or v != v else math.copysign(INF, v) if v == 0
                                    else 1 / math.sqrt(v))(x),
}
EDGES = {
    "exp": [0.0, -0.0, 1.0, -1.0, 88.7, 88.8, -87.0, -103.0, -104.0, INF, -INF, NAN],
    "tanh": [0.0, -0.0, 1e-30, -1e-8, 0.5, -0.5, 9.0, -10.0, 20.0, -88.0, 1e30, INF, -INF, NAN],
    "erf": [0.0, -0.0, 1e-30, -1e-6, 0.5, -0.5, 3.9, -4.0, 10.0, INF, -INF, NAN],
    "exp2": [0.0, -0.0, 1.0, -1.0, 0.5, 127.99, 128.0, 200.0, -126.0, -149.0, -149.5, -150.0, -200.0, INF, -INF, NAN],
    "log2": [1.0, 2.0, 0.5, 1 + 2 ** -23, 0.0, -0.0, -1.0, 1e-45, 3.4e38, INF, -INF, NAN],
    "sigmoid": [0.0, 1.0, -1.0, 1e-30, 16.0, 17.0, -16.0, -87.0, -88.5, -89.0, -100.0, INF, -INF, NAN],
    "rsqrt": [0.0, -0.0, 1.0, 4.0, 1e-45, 3e38, -1.0, INF, NAN],
}
# the interpreter's distance from the exact result: tanh, erf, exp2 and log2 round once; sigmoid's exp, add and
# division round each: a relative error r of an operand costs up to r * 2**24 ulp of the result, so
# sigmoid's exp (2**-24 times e / (1 + e) < 1), add (2**-24) and division (half an ulp) give at most 2.5 ulp
# and rsqrt's sqrt and division 1.5
INTERP_ULP = {"tanh": 0.5001, "erf": 0.5001, "exp2": 0.5001, "log2": 0.5001, "sigmoid": 2.5, "rsqrt": 1.5}
BLOCK = 128


def reference(op: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN inputs give NaN quietly, as in C
        return REFERENCE[op](np.asarray(x, np.float64))


def ulps(got: np.ndarray, want: np.ndarray, bits: int = 24, tiny: float = 2.0 ** -149) -> np.ndarray:
    """|got - want| in units of the last place of a ``bits``-bit significand at ``want`` (float32 by
    default); special values must match exactly (NaN where NaN, each infinity where it, float32
    overflow included, is due) and count 0 or inf."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    with np.errstate(over="ignore"):
        rounded = want.astype(np.float32).astype(np.float64) if bits == 24 else want
    special = np.isnan(rounded) | np.isinf(rounded) | np.isnan(got) | np.isinf(got)
    same = (np.isnan(rounded) & np.isnan(got)) | (rounded == got)
    _, e = np.frexp(np.where(special, 1.0, np.abs(want)))
    ulp = np.maximum(np.ldexp(1.0, e - bits), tiny)
    with np.errstate(invalid="ignore"):
        d = np.abs(np.where(special, 0.0, got - want)) / ulp
    return np.where(special, np.where(same, 0.0, INF), d)


def sigmoid_flushed(x: np.ndarray, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where expf(-x) overflows (x < -88.72) sigmoid is 0 by its formula: the exact value there is a
    denormal below 2**-126 (ops.MATH_ERRORS). Checks those and returns the other positions."""
    low = np.asarray(x, np.float64) < -88.72
    assert (np.asarray(got)[low] == 0).all() and (want[low] < 2.0 ** -126).all()
    return ~low


def elementwise(op: str, dtype: str = "float32", reg: str = "float32") -> Kernel:
    """out[i] = op(x[i]) over a ragged N, ``dtype`` the tensors' type and ``reg`` the register's."""
    k = Kernel(f"map_{op}", block=BLOCK)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,), dtype), k.tensor("out", (n,), dtype)
    k.grid(ceil_div(n, BLOCK))
    i = blockIdx.x * BLOCK + threadIdx.x
    with k.if_(i.lt(n)):
        v = k.load(x, i)
        k.store(out, i, getattr(k, op)(v if reg == "float32" or dtype == "float64" else k.assign(v, dtype=reg),
                                       dtype=reg))
    return k


def inputs(op: str, n: int = 300, seed: int = 0, dtype: str = "float32") -> np.ndarray:
    """Random inputs on each op's interesting range, its edge values first."""
    rng = np.random.default_rng(seed)
    spread = {"exp2": 60.0, "log2": None, "rsqrt": None}.get(op, 4.0)
    rand = np.exp(rng.uniform(-80, 80, n)) if spread is None else rng.standard_normal(n) * spread
    x = np.concatenate([np.array(EDGES[op], np.float64), rand])
    with np.errstate(over="ignore"):
        return x.astype(NP_DTYPES[dtype])


@pytest.mark.parametrize("op", sorted(INTERP_ULP))
def test_interpreter_matches_the_float64_reference_on_random_and_edge_inputs(op):
    x = inputs(op)
    got = run(elementwise(op), {"x": x, "out": np.zeros_like(x)})["out"]
    want = reference(op, x)
    keep = sigmoid_flushed(x, got, want) if op == "sigmoid" else slice(None)
    x, got, want = x[keep], got[keep], want[keep]
    d = ulps(got, want)
    assert d.max() <= INTERP_ULP[op], (op, x[np.argmax(d)], got[np.argmax(d)], d.max())
    assert got.dtype == np.float32


def test_special_values_are_cs():
    want = {"tanh": [1.0, -1.0, NAN], "erf": [1.0, -1.0, NAN], "exp2": [INF, 0.0, NAN],
            "log2": [INF, NAN, NAN], "sigmoid": [1.0, 0.0, NAN]}
    for op, w in want.items():
        x = np.array([INF, -INF, NAN], np.float32)
        np.testing.assert_array_equal(run(elementwise(op), {"x": x, "out": np.zeros(3, np.float32)})["out"],
                                      np.array(w, np.float32), err_msg=op)
    x = np.array([0.0, -0.0, -1.0, 2.0 ** -149, 200.0, -150.0], np.float32)
    got = {op: run(elementwise(op), {"x": x, "out": np.zeros(6, np.float32)})["out"] for op in ("log2", "exp2")}
    np.testing.assert_array_equal(got["log2"], np.array([-INF, -INF, NAN, -149.0, math.log2(200.0), NAN], np.float32))
    np.testing.assert_array_equal(got["exp2"], [1.0, 1.0, 0.5, 1.0, INF, 0.0])


@pytest.mark.parametrize("op", MATH)
def test_float64_registers_compute_in_double(op):
    x = inputs(op, n=40, seed=2, dtype="float64")
    got = run(elementwise(op, "float64", "float64"), {"x": x, "out": np.zeros_like(x)})["out"]
    d = ulps(got, reference(op, x), bits=53, tiny=2.0 ** -1074)
    assert d.max() <= 2, (op, x[np.argmax(d)], d.max())


@pytest.mark.parametrize("op", MATH)
def test_bfloat16_tensors_load_into_float32_and_round_on_the_store(op):
    x = inputs(op, n=60, seed=3, dtype="bfloat16")
    got = run(elementwise(op, "bfloat16"), {"x": x, "out": np.zeros_like(x)})["out"]
    with np.errstate(over="ignore"):
        want = reference(op, x).astype(np.float32).astype(NP_DTYPES["bfloat16"])
    assert got.dtype == want.dtype
    keep = sigmoid_flushed(x, got, want.astype(np.float64)) if op == "sigmoid" else slice(None)
    got, want = got[keep], want[keep]
    # one rounding to bfloat16 each, of results a few float32 ulp apart: at most one bfloat16 ulp
    assert ulps(got, want.astype(np.float64), bits=8, tiny=2.0 ** -133).max() <= 1


@pytest.mark.parametrize("op", MATH)
def test_math_on_an_int_register_is_refused_by_name(op):
    k = Kernel("ints", block=32)
    with pytest.raises(BuildError, match=f"{op} at .*dtype 'int32'; {op} computes in a float register"):
        getattr(k, op)(1.0, dtype="int32")
    k = elementwise(op)
    k.graph[k.graph.nodes(op)[0]]["dtype"] = "int32"  # as a rule could set it
    with pytest.raises(GraphError, match=f"{op} into a 'int32' register; it computes in float32 or float64"):
        api.generate(k)


def test_each_new_op_documents_its_cuda_function_and_error():
    for op in MATH:
        assert "ulp" in MATH_ERRORS[op] and MATH_ERRORS[op] in OP_DOCS[op]
        assert "ulp" in getattr(Kernel, op).__doc__


def test_codegen_calls_cuda_math_and_nvrtc_compiles_every_op():
    k = Kernel("all_math", block=BLOCK)
    x, xd = k.tensor("x", (BLOCK,)), k.tensor("xd", (BLOCK,), "float64")
    out, outd = k.tensor("out", (BLOCK,)), k.tensor("outd", (BLOCK,), "float64")
    v, vd = k.load(x, threadIdx.x), k.load(xd, threadIdx.x)
    acc, accd = k.assign(0.0, dst="acc"), k.assign(0.0, dtype="float64", dst="accd")
    for op in MATH + ("rsqrt",):
        k.add(acc, getattr(k, op)(v), dst="acc")
        k.add(accd, getattr(k, op)(vd, dtype="float64"), dtype="float64", dst="accd")
    k.store(out, threadIdx.x, acc)
    k.store(outd, threadIdx.x, accd)
    text = api.generate(k).text
    for fn in ("tanh", "erf", "exp2", "log2", "rsqrt"):
        assert f" = {fn}f(v" in text and f" = {fn}(v" in text
    assert " = 1.0f / (1.0f + expf(-(v" in text and " = 1.0 / (1.0 + exp(-(v" in text
    api.compile(k)  # NVRTC has the math functions without headers


def _flushed_exp2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """exp2_approx's exact value and where it is due: 2**x, 0 where that is below 2**-126 (the flush)."""
    want = reference("exp2", x)
    low = want < 2.0 ** -126
    return np.where(low, 0.0, want), low


def test_exp2_approx_rounds_once_and_flushes_results_below_the_normals():
    x = inputs("exp2", n=400, seed=5)
    got = run(elementwise("exp2_approx"), {"x": x, "out": np.zeros_like(x)})["out"]
    want, low = _flushed_exp2(x)
    assert low.any() and (got[low] == 0).all() and not np.signbit(got[low]).any()
    assert ulps(got[~low], want[~low]).max() <= 0.5001
    # exp2 keeps the denormals that exp2_approx flushes
    exact = run(elementwise("exp2"), {"x": x, "out": np.zeros_like(x)})["out"]
    assert (exact[low & (x > -149)] > 0).all()


def test_exp2_approx_is_a_float32_instruction():
    k = Kernel("f64", block=32)
    with pytest.raises(BuildError, match="exp2_approx at .*dtype 'float64'; exp2_approx is a float32 instruction"):
        k.exp2_approx(1.0, dtype="float64")
    k = elementwise("exp2_approx")
    k.graph[k.graph.nodes("exp2_approx")[0]]["dtype"] = "float64"  # as a rule could set it
    with pytest.raises(GraphError, match="exp2_approx into a 'float64' register; it is a float32 instruction"):
        api.generate(k)


def test_exp2_approx_emits_the_sfu_instruction_and_compiles():
    text = api.generate(elementwise("exp2_approx")).text
    assert 'asm("ex2.approx.ftz.f32 %0, %1;"' in text and "cb_ex2_approx(v" in text
    assert "cb_ex2_approx" not in api.generate(elementwise("exp2")).text  # the helper only where used
    assert "ulp" in MATH_ERRORS["exp2_approx"] and MATH_ERRORS["exp2_approx"] in OP_DOCS["exp2_approx"]
    api.compile(elementwise("exp2_approx"))  # NVRTC takes the inline PTX
