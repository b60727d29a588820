"""The built-in kernels' specifications: how to build each, inputs of a given shape, a numpy reference,
tolerances and the trip count of its circular-buffered loop (their one-line docs: :data:`CATALOG`).

``get(name)`` looks one up; an unknown name is an error that lists the known ones.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import numpy as np

from ..ir.bind import NP_DTYPES
from ..errors import CbrulesError, did_you_mean
from . import CATALOG
from ..ir.builder import Kernel
from ..ir.ops import FP8_DTYPES, HALF_DTYPES, STORAGE_DTYPES
from . import attention as _att
from . import matmul as _mm
from . import matmul_tc as _mtc
from . import pointwise1d as _p1
from . import reductions as _red
from . import rows as _rows
from . import tiled2d as _t2
from .exp1d import exp1d_tma

UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # half an ulp at 1: the rounding of a store
_STORAGE_NAMES = frozenset(np.dtype(NP_DTYPES[d]).name for d in STORAGE_DTYPES)  # numpy's names of them
SHAPES_1D = ((128,), (1024,), (2048,), (500 * 1024,))
SHAPES_2D = tuple((m, n) for m in (128, 500, 1024) for n in (128, 1024, 2048))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KernelSpec:
    """A named kernel: how to build it, inputs for a shape, the numpy answer, and its matrix."""

    name: str
    doc: str
    factory: Callable[..., Kernel]
    inputs: Optional[Callable[[tuple, np.random.Generator], dict]]
    reference: Optional[Callable[[dict], dict]]
    outputs: tuple[str, ...]
    default_shape: tuple
    shapes: tuple = ()
    trips: Callable[[tuple], int] = lambda shape: 1 << 30  # iterations of the circular-buffered loop
    tolerance: Callable[[tuple], tuple[float, float]] = lambda shape: (1e-5, 1e-6)  # (rtol, atol)
    build_params: Callable[[tuple], dict] = field(default=lambda shape: {})
    pipelined: bool = True
    # the CPU checker's problems: a small shape whose circular-buffered loop runs t times, and the
    # build parameters that set t where the trip count is fixed when the kernel is built
    shape_for_trips: Optional[Callable[[int], tuple]] = None
    trips_params: Callable[[int], dict] = field(default=lambda t: {})

    dtypes: tuple[str, ...] = ("float32",) + HALF_DTYPES  # storage types of its tensors
    tile_output: bool = False  # its output leaves in whole tiles, one per iteration: it can be TMA-stored
    swizzles: bool = False  # it can read its inputs from swizzled tiles
    seed: bool = True  # one of the seed's test matrix (the CPU differential matrix runs every such kernel)
    # the spec of the kernel built with these keyword parameters (its inputs and reference follow them),
    # for kernels that take some on the command line (attention: --head-dim, --causal, --lse, --scale)
    variant: Optional[Callable[..., "KernelSpec"]] = None
    float32_outputs: tuple[str, ...] = ()  # arrays (outputs, scale vectors) that stay float32 whatever the dtype
    # the spec of the kernel in another dtype where more than the tensors' type changes (FP8 matmul_tc: k32
    # steps, 128 elements of K a stage, scales among the inputs, a bfloat16 output); None: only the type
    dtype_variant: Optional[Callable[["KernelSpec", str], "KernelSpec"]] = None
    # where the outputs (and every float array but ``operands``) have another type than the kernel's dtype
    output_dtype: Optional[str] = None
    operands: tuple[str, ...] = ()
    scaling: Optional[str] = None  # matmul_tc: the operands' scales its inputs carry (None: its default)
    # where the GPU's arithmetic departs from the reference's model (FP8 attention: the tensor cores' FP8
    # sums keep fewer bits than float32), how a run on the GPU is judged: (output name, its values, the
    # reference's outputs, the inputs) -> (good, what was measured); None: :meth:`tolerances` there too
    device_check: Optional[Callable[[str, np.ndarray, dict, dict], tuple[bool, str]]] = None

    def for_dtype(self, dtype: Optional[str]) -> "KernelSpec":
        """This kernel as built for ``dtype``: :attr:`dtype_variant`'s spec, or itself."""
        if self.dtype_variant is None or dtype is None:
            return self
        return _dtype_spec(self, dtype)

    def build(self, shape: Optional[tuple] = None, trips: Optional[int] = None, dtype: Optional[str] = None,
              tma_store: bool = False, swizzle: str = "none", **options) -> Kernel:
        """The kernel for ``shape`` (only kernels specialised at build time look at it) with
        circular-buffer ``options`` (stages, prefetch, war, warp_specialize, registers) where the
        kernel takes them; ``trips`` fixes a trip count that is a build parameter (see
        ``trips_params``); ``dtype`` is the type of its tensors (float32, float16 or bfloat16;
        arithmetic is float32 either way); ``tma_store`` writes each output tile with one TMA store
        (kernels with ``tile_output`` only); ``swizzle`` (32B, 64B, 128B) has the input tiles arrive
        swizzled (kernels with ``swizzles`` only)."""
        dtype = self.dtypes[0] if dtype is None else dtype  # float32 wherever the kernel takes it
        if dtype not in self.dtypes:
            raise UnsupportedDtypeError(f"kernel {self.name}: dtype {dtype!r} is not supported; it is built for "
                                        f"{', '.join(self.dtypes)}")
        if tma_store and not self.tile_output:
            raise UnsupportedVariantError(
                f"kernel {self.name}: tma_store needs an output written as whole tiles, one per iteration of its "
                "serial loop; this kernel's output is not (a row or column result, or stored after its loop): "
                "drop --tma-store, or use one of " + ", ".join(n for n, s in KERNELS.items() if s.tile_output))
        if swizzle != "none" and not self.swizzles:
            raise UnsupportedVariantError(
                f"kernel {self.name}: swizzle {swizzle} is not supported (its tiles are read as dense rows); "
                "use one of " + ", ".join(n for n, s in KERNELS.items() if s.swizzles))
        params = self.build_params(tuple(shape or self.default_shape))
        if trips is not None:
            params.update(self.trips_params(trips))
        if swizzle != "none":
            params["swizzle"] = swizzle
        if dtype != "float32":
            params["dtype"] = dtype
        if tma_store:
            params["tma_store"] = True
        opts = {k: v for k, v in options.items() if v is not None} if self.pipelined else {}
        return self.factory(**opts, **params)

    def make_inputs(self, shape: tuple, rng: np.random.Generator, dtype: str = "float32") -> dict:
        """:attr:`inputs` with every float32 array in ``dtype`` (rounded to nearest even), or, where the
        spec has an :attr:`output_dtype`, the :attr:`operands` in ``dtype`` and the rest in that."""
        args = self.inputs(shape, rng)
        want = np.dtype(NP_DTYPES[dtype])
        other = np.dtype(NP_DTYPES[self.output_dtype]) if self.output_dtype else want
        return {k: v.astype(want if not self.output_dtype or k in self.operands else other)
                if isinstance(v, np.ndarray) and v.dtype == np.float32 and k not in self.float32_outputs else v
                for k, v in args.items()}

    def expected(self, args: dict) -> dict:
        """:attr:`reference` of ``args``, computed from half-precision and FP8 inputs widened to float32
        (exact)."""
        return self.reference({k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype.name in _STORAGE_NAMES
                               else v for k, v in args.items()})

    def tolerances(self, shape: tuple, dtype: str = "float32") -> tuple[float, float]:
        """(rtol, atol) for outputs of ``dtype`` (or of :attr:`output_dtype`): :attr:`tolerance` (float32
        arithmetic) plus twice the unit roundoff of the final rounding to a half type."""
        rtol, atol = self.tolerance(shape)
        return rtol + 2 * UNIT_ROUNDOFF.get(self.output_dtype or dtype, 0.0), atol


def _normal(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _nan(*shape):
    return np.full(shape, np.nan, np.float32)


def _unary_1d(shape, rng):
    (n,) = shape
    return {"x": _normal(rng, n), "out": _nan(n)}


def _unary_2d(shape, rng):
    return {"x": _normal(rng, *shape), "out": _nan(*shape)}


def _binary_2d(shape, rng):
    return {"x": _normal(rng, *shape), "y": _normal(rng, *shape), "out": _nan(*shape)}


def _inner(shape, rng):
    return {"x": _normal(rng, *shape), "out": _nan(shape[0])}


def _outer(shape, rng):
    return {"x": _normal(rng, *shape), "out": _nan(shape[1])}


def _mm_inputs(shape, rng):
    m, n = shape  # K = N
    return {"a": _normal(rng, m, n), "b": _normal(rng, n, n), "c": _nan(m, n)}


def _mm_tc_inputs(shape, rng):
    m, n, kk = shape
    return {"a": _normal(rng, m, kk), "b": _normal(rng, n, kk), "c": _nan(m, n)}


def _scaled(c: np.ndarray, a: dict) -> np.ndarray:
    """The product ``c`` times the operands' scales where the inputs carry them (matmul_tc ``scaling``):
    scalars (per tensor) or vectors over M and N (rows and columns)."""
    if "scale_a" not in a:
        return c
    sa, sb = (np.asarray(a[k], np.float64) for k in ("scale_a", "scale_b"))
    return c * (sa[:, None] if sa.ndim else sa) * (sb[None, :] if sb.ndim else sb)


def _mm_tc_reference(a):
    sa = a.get("scale_a")
    if isinstance(sa, np.ndarray) and sa.ndim == 2:  # block scales: each 128 of K its own
        x, y, sb, step = a["a"].astype(np.float64), a["b"].astype(np.float64), a["scale_b"], _mtc.SCALE_BLOCK
        rows_b = np.arange(y.shape[0]) // step
        return {"c": sum((x[:, kb * step:(kb + 1) * step] @ y[:, kb * step:(kb + 1) * step].T)
                         * sa[:, kb, None] * sb[rows_b, kb][None, :] for kb in range(sa.shape[1]))}
    return {"c": _scaled(a["a"].astype(np.float64) @ a["b"].astype(np.float64).T, a)}


def _mm_tc_kn_inputs(shape, rng):
    m, n, kk = shape
    return {"a": _normal(rng, m, kk), "b": _normal(rng, kk, n), "c": _nan(m, n)}


def _mm_tc_kn_reference(a):
    return {"c": _scaled(a["a"].astype(np.float64) @ a["b"].astype(np.float64), a)}


def _mm_tc_scaled_inputs(scaling: str, base, shape, rng):
    """``base``'s inputs and the scales of ``scaling``: float32 scalars, or vectors over M and N, in 0.25..2."""
    args = base(shape, rng)
    m, n, _ = shape
    if scaling == "tensor":
        args["scale_a"], args["scale_b"] = (float(np.float32(rng.uniform(0.25, 2.0))) for _ in range(2))
    elif scaling == "rowcol":
        args["scale_a"] = rng.uniform(0.25, 2.0, m).astype(np.float32)
        args["scale_b"] = rng.uniform(0.25, 2.0, n).astype(np.float32)
    elif scaling == "block":
        kt, nt = _cdiv(shape[2], _mtc.SCALE_BLOCK), _cdiv(n, _mtc.SCALE_BLOCK)
        args["scale_a"] = rng.uniform(0.25, 2.0, (m, kt)).astype(np.float32)
        args["scale_b"] = rng.uniform(0.25, 2.0, (nt, kt)).astype(np.float32)
    return args


# FP8 rows are 128 elements a stage and TMA needs 16-byte row pitches: K a multiple of 16
FP8_BK = 128
FP8_SHAPES = ((128, 128, 128), (500, 1000, 384), (1024, 2048, 4096), (129, 264, 80))


def _fp8_tolerance(shape) -> tuple[float, float]:
    # the H200 adds each k32 step into the accumulator keeping fewer bits than float32; promoted every 128
    # of K (matmul_tc's FP8 default) the error grows as sqrt(K): measured at most 7e-4 * sqrt(K) for scales
    # of 1 (the inputs' scales reach 4) -- docs/fp8.md
    return 1e-3, 3e-3 * shape[2] ** 0.5


def _matmul_tc_dtype(spec: "KernelSpec", dtype: str) -> "KernelSpec":
    """matmul_tc in ``dtype``: for FP8, k32 steps of 128-element stages, the scales (per tensor unless the
    spec asked for others) among the inputs, a bfloat16 c (the epilogue's tensors too)."""
    if dtype not in FP8_DTYPES:
        return spec
    scaling = spec.scaling or "tensor"
    inputs = spec.inputs if spec.scaling else functools.partial(_mm_tc_scaled_inputs, scaling, spec.inputs)
    return replace(spec, factory=functools.partial(spec.factory, scaling=scaling), inputs=inputs,
                   shapes=FP8_SHAPES, trips=lambda s: _cdiv(s[2], FP8_BK), tolerance=_fp8_tolerance,
                   shape_for_trips=lambda t: (130, 136, FP8_BK * t - 16), output_dtype="bfloat16",
                   operands=("a", "b"), float32_outputs=spec.float32_outputs + ("scale_a", "scale_b"),
                   scaling=scaling, dtype_variant=None)


@functools.lru_cache(maxsize=256)
def _dtype_spec(spec: "KernelSpec", dtype: str) -> "KernelSpec":
    # one spec object per (spec, dtype): the checker's caches key on its factory and inputs
    return spec.dtype_variant(spec, dtype)


_ERF = np.frompyfunc(math.erf, 1, 1)
_ACTIVATIONS = {None: lambda x: x, "relu": lambda x: np.maximum(x, 0.0),
                "gelu": lambda x: 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)).astype(np.float64)),
                "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
                "silu": lambda x: x / (1.0 + np.exp(-x))}


def _mm_tc_epilogue_inputs(epilogue: str, product_inputs, shape, rng):
    args = product_inputs(shape, rng)
    m, n, _ = shape
    for p in _mtc.epilogue_inputs(epilogue):
        if p == "bias":
            args["bias"] = _normal(rng, n)
        elif p in ("residual", "c_in"):
            args[p] = _normal(rng, m, n)
        else:  # the scalars alpha and beta
            args[p] = float(np.float32(rng.uniform(-2.0, 2.0)))
    return args


def _mm_tc_epilogue_reference(epilogue: str, product, a):
    x = product(a)["c"]
    adds, act = _mtc.EPILOGUES[epilogue]
    if "bias" in adds:
        x = x + a["bias"].astype(np.float64)[None, :]
    if "residual" in adds:
        x = x + a["residual"].astype(np.float64)
    if "alpha_beta" in adds:
        x = a["alpha"] * x + a["beta"] * a["c_in"].astype(np.float64)
    return {"c": _ACTIVATIONS[act](x)}


def _attention_inputs(head_dim: int, lse: bool, shape, rng):
    bh, lq, lk = shape
    args = {"q": _normal(rng, bh, lq, head_dim), "k": _normal(rng, bh, lk, head_dim),
            "v": _normal(rng, bh, lk, head_dim), "o": _nan(bh, lq, head_dim)}
    if lse:
        args["lse"] = _nan(bh, lq)
    return args


def attention_reference(q, k, v, scale: float, causal: bool, dtype=np.float64,
                        masked: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse) of attention computed in ``dtype``: softmax(scale * q @ k^T) @ v over [BH, L, D] arrays,
    causal as torch's is_causal (key <= query, top-left aligned), the scores where ``masked`` [Lq, Lk] is
    True sent to -inf too; lse the natural log of each row's sum."""
    q, k, v = (np.asarray(x).astype(np.float32).astype(dtype) for x in (q, k, v))
    s = (q @ k.transpose(0, 2, 1)) * dtype(scale)
    if causal:
        lq, lk = s.shape[1:]
        s = np.where(np.arange(lk)[None, None, :] <= np.arange(lq)[None, :, None], s, -np.inf)
    if masked is not None:
        s = np.where(masked[None], -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    return (p / total) @ v, (m + np.log(total))[..., 0]


def _attention_reference(head_dim: int, causal: bool, scale: Optional[float], lse: bool, a):
    o, row_lse = attention_reference(a["q"], a["k"], a["v"], 1.0 / math.sqrt(head_dim) if scale is None else scale,
                                     causal)
    return {"o": o, "lse": row_lse} if lse else {"o": o}


def _attention_fp8_inputs(head_dim: int, lse: bool, shape, rng):
    """FP8 attention's inputs: q, k and V transposed ``vt [BH, D, Lk]`` (rounded to the FP8 type by
    make_inputs), the dequantization scales in 0.25..2, a bfloat16 o."""
    args = _attention_inputs(head_dim, lse, shape, rng)
    args["vt"] = np.ascontiguousarray(args.pop("v").transpose(0, 2, 1))
    for nm in ("scale_q", "scale_k", "scale_v"):
        args[nm] = float(np.float32(rng.uniform(0.25, 2.0)))
    return args


def attention_fp8_reference(a: dict, scale: float, causal: bool, bn: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse) of FP8 attention computed in float64 the way the kernel computes it: key tiles of ``bn``,
    a running row max in the log2 domain, P = exp2(c s - m) rounded (saturating) to ``dtype`` before
    P @ V while the row sum l takes P unrounded, o = O / l * scale_v (c = scale * scale_q * scale_k *
    log2 e). The rounding of P (2^-4 relative for e4m3) is the kernel's, not an error of it; what is
    left is float32 arithmetic and the bfloat16 output."""
    store = NP_DTYPES[dtype]
    q, k = (np.asarray(a[n]).astype(np.float64) for n in ("q", "k"))
    v = np.asarray(a["vt"]).astype(np.float64).transpose(0, 2, 1)
    c = scale * _att.LOG2E * a["scale_q"] * a["scale_k"]
    bh, lq, _ = q.shape
    lk = k.shape[1]
    s = (q @ k.transpose(0, 2, 1)) * c
    if causal:
        s = np.where(np.arange(lk)[None, None, :] <= np.arange(lq)[None, :, None], s, -np.inf)
    m = np.full((bh, lq, 1), -np.inf)
    total = np.zeros((bh, lq, 1))
    o = np.zeros((bh, lq, v.shape[2]))
    for key0 in range(0, lk, bn):
        tile = s[:, :, key0:key0 + bn]
        new = np.maximum(m, tile.max(axis=-1, keepdims=True))
        use = np.where(new == -np.inf, 0.0, new)
        alpha, p = np.exp2(m - use), np.exp2(tile - use)
        total = total * alpha + p.sum(axis=-1, keepdims=True)
        rounded = p.astype(np.float32).astype(store).astype(np.float64)  # P <= 1: never saturates
        o = o * alpha + rounded @ v[:, key0:key0 + bn]
        m = new
    return o / total * a["scale_v"], ((m + np.log2(total)) * _att.LN2)[..., 0]


def _attention_fp8_reference(head_dim: int, causal: bool, scale: Optional[float], lse: bool, dtype: str, a):
    o, row_lse = attention_fp8_reference(a, 1.0 / math.sqrt(head_dim) if scale is None else scale, causal,
                                         _att.default_bn(head_dim), dtype)
    return {"o": o, "lse": row_lse} if lse else {"o": o}


# the tensor cores' FP8 sums: errors measured up to 5.3e-4 of the sum of |a_k b_k| (docs/fp8.md); twice that
FP8_SUM_DRIFT = 1e-3
# P rounded to the FP8 type moves o from the exact attention by about this much, relative (the norm of the
# difference over the norm of o; the float64 model at L = 16..4096, D = 64..256: at most 0.026 for e4m3,
# 0.052 for e5m2); the bound is the FP8 type's unit roundoff, about 2.4x that
FP8_ATTENTION_ERROR = {"float8_e4m3": 2 ** -4, "float8_e5m2": 2 ** -3}


def attention_fp8_check(head_dim: int, causal: bool, scale: Optional[float], dtype: str, name: str,
                        got: np.ndarray, want: dict, a: dict) -> tuple[bool, str]:
    """FP8 attention on the GPU: o against the exact attention of the dequantized inputs, the norm of the
    difference within FP8_ATTENTION_ERROR of o's (P's rounding; a kernel writing zeros, a wrong scale or a
    wrong lane exchange is off by about 1); lse within the drift of the FP8 tensor cores' sums (up to
    FP8_SUM_DRIFT of sum_k |q_k k_k|, times the scores' scale) of the model's. Every element must be finite."""
    q, k = (np.asarray(a[n]).astype(np.float64) * a[f"scale_{n}"] for n in ("q", "k"))
    s = 1.0 / math.sqrt(head_dim) if scale is None else scale
    got = np.asarray(got, np.float64)
    if not np.isfinite(got).all():
        return False, f"{int((~np.isfinite(got)).sum())} elements not finite"
    if name == "lse":
        drift = FP8_SUM_DRIFT * s * float((np.abs(q) @ np.abs(k).transpose(0, 2, 1)).max(initial=0.0))
        err = float(np.abs(got - want["lse"]).max(initial=0.0))
        return err <= drift + 1e-4, f"max abs error {err:.3g} vs numpy (bound {drift + 1e-4:.3g}: the FP8 sums' drift)"
    v = np.asarray(a["vt"]).astype(np.float64).transpose(0, 2, 1) * a["scale_v"]
    exact, _ = attention_reference(q, k, v, s, causal)
    rel = float(np.linalg.norm(got - exact) / max(np.linalg.norm(exact), 1e-30))
    bound = FP8_ATTENTION_ERROR[dtype]
    return rel <= bound, f"relative error {rel:.3g} vs the exact attention (bound {bound:.3g}: P's {dtype} rounding)"


def _attention_dtype(head_dim: int, causal: bool, scale: Optional[float], lse: bool, spec: "KernelSpec",
                     dtype: str) -> "KernelSpec":
    """attention in ``dtype``: for FP8, V transposed and the scales among the inputs, the kernel's own
    rounding of P in the reference, a bfloat16 o, Lk a multiple of 16 (V^T's row pitch, Lv = Lk)."""
    if dtype not in FP8_DTYPES:
        return spec
    def trips(t, base=spec.shape_for_trips):  # Lk cut to a multiple of 16 (the trip count stays: bn is 64 or 128)
        bh, lq, lk = base(t)
        cut = lk - lk % 16
        return bh, cut if lq == lk else lq, cut
    return replace(spec, inputs=functools.partial(_attention_fp8_inputs, head_dim, lse),
                   reference=functools.partial(_attention_fp8_reference, head_dim, causal, scale, lse, dtype),
                   shapes=ATTENTION_FP8_SHAPES, shape_for_trips=trips, tolerance=lambda s: (2 ** -7, 1e-3),
                   output_dtype="bfloat16", operands=("q", "k", "vt"),
                   float32_outputs=spec.float32_outputs + ("scale_q", "scale_k", "scale_v"), dtype_variant=None,
                   device_check=functools.partial(attention_fp8_check, head_dim, causal, scale, dtype))


# FP8 attention: V^T's rows are Lk bytes, which TMA needs in multiples of 16
ATTENTION_FP8_SHAPES = ((1, 1, 16), (2, 17, 32), (1, 128, 128), (3, 200, 144), (16, 1024, 1024))


def _attention_spec(base: "KernelSpec", head_dim: Optional[int] = None, causal: Optional[bool] = None,
                    lse: Optional[bool] = None, scale: Optional[float] = None,
                    persistent: Optional[int] = None) -> "KernelSpec":
    """attention built with these parameters (None: the default): its inputs, reference and outputs.
    ``persistent`` blocks walk the query tiles (warp-specialized builds only: the kernel before lowering,
    which the checker compares with, is built without it)."""
    head_dim = 64 if head_dim is None else head_dim
    causal, lse = bool(causal), bool(lse)
    bn = _att.default_bn(head_dim)
    try:
        _att.check(head_dim, "bfloat16", _att.BM, bn, None, scale)
        _att.check_persistent(persistent, True, causal, None)
    except _att.AttentionError as e:
        raise UnsupportedVariantError(str(e)) from None
    if causal:  # the loop of the last query tile runs over every key tile: Lq as long as Lk
        shape_for_trips = lambda t: (1, bn * t - 8, bn * t - 8)  # noqa: E731
    elif persistent:  # two heads: a block of --persistent 1 walks two tiles
        shape_for_trips = lambda t: (2, 70, bn * t - 8)  # noqa: E731
    else:
        shape_for_trips = lambda t: (1, 70, bn * t - 8)  # noqa: E731
    factory = functools.partial(_att.attention, head_dim=head_dim, causal=causal, lse=lse, scale=scale)
    if persistent:
        factory = functools.partial(_persistent_attention, factory, persistent)
    return replace(base, factory=factory,
                   inputs=functools.partial(_attention_inputs, head_dim, lse),
                   reference=functools.partial(_attention_reference, head_dim, causal, scale, lse),
                   outputs=("o", "lse") if lse else ("o",), shape_for_trips=shape_for_trips,
                   trips=lambda s: _cdiv(s[2], bn),
                   dtype_variant=functools.partial(_attention_dtype, head_dim, causal, scale, lse))


def _persistent_attention(factory, blocks: int, **options) -> Kernel:
    """``factory``'s attention walked by ``blocks`` persistent blocks where it is warp-specialized (the
    checker's kernel before lowering is not: the same tiles, a block each)."""
    return factory(**options, persistent=blocks if options.get("warp_specialize") else 0)


def _row_inputs(op: str, shape, rng):
    m, row = shape
    args = {"x": _normal(rng, m, row) * 3 + 1, "out": _nan(m, row)}
    if op != "softmax":
        args["weight"] = _normal(rng, row)
    if op == "layer_norm":
        args["bias"] = _normal(rng, row)
    return args


def _row_reference(op: str, a):
    x = a["x"].astype(np.float64)
    if op == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return {"out": e / e.sum(axis=1, keepdims=True)}
    if op == "rms_norm":
        y = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    else:
        y = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-6)
    y = y * a["weight"].astype(np.float64)
    return {"out": y + a["bias"].astype(np.float64) if op == "layer_norm" else y}


def _row_spec(op: str) -> "KernelSpec":
    return KernelSpec(op, CATALOG[op], functools.partial(_rows.row_op, op), functools.partial(_row_inputs, op),
                      functools.partial(_row_reference, op), ("out",), (4096, 4096),
                      ((3, 256), (100, 1024), (4096, 4096), (1000, 8192)), pipelined=False, seed=False,
                      tolerance=lambda s: (2e-5, 2e-5), build_params=lambda s: {"row": s[1]})


def _normalize(x):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    return ((x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True))).astype(np.float32)


def _sum_tol(n):
    return 1e-4, 3e-6 * n  # float32 accumulation of n normal values


_SPECS = [
    KernelSpec("exp1d_tma", CATALOG["exp1d_tma"],
               lambda: exp1d_tma(), _unary_1d, lambda a: {"out": np.exp(a["x"])}, ("out",),
               (1 << 20,), SHAPES_1D + ((1 << 24,),), pipelined=False, dtypes=("float32",)),
    KernelSpec("single_dim", CATALOG["single_dim"],
               _p1.single_dim, _unary_1d, lambda a: {"out": np.exp(a["x"])}, ("out",),
               (1 << 20,), SHAPES_1D, trips=lambda s: 8,
               shape_for_trips=lambda t: (256 * t + 100,), trips_params=lambda t: {"tiles_per_block": t},
               tile_output=True),
    KernelSpec("single_dim_unroll", CATALOG["single_dim_unroll"],
               _p1.single_dim_unroll, _unary_1d, lambda a: {"out": np.exp(a["x"])},
               ("out",), (1 << 20,), SHAPES_1D, trips=lambda s: 8,
               shape_for_trips=lambda t: (1024 * t + 300,), trips_params=lambda t: {"tiles_per_block": 4 * t}),
    KernelSpec("single_dim_unswitch", CATALOG["single_dim_unswitch"],
               _p1.single_dim_unswitch, _unary_1d, lambda a: {"out": np.exp(a["x"])}, ("out",),
               (1 << 20,), SHAPES_1D, trips=lambda s: 8,
               shape_for_trips=lambda t: (1024 * t + 300,), trips_params=lambda t: {"tiles_per_block": 4 * t}),
    KernelSpec("multi_dim", CATALOG["multi_dim"], _t2.multi_dim, _unary_2d, lambda a: {"out": np.exp(a["x"])}, ("out",),
               (1024, 2048), SHAPES_2D, trips=lambda s: _cdiv(s[1], 256),
               shape_for_trips=lambda t: (6, 256 * t - 128), tile_output=True, swizzles=True),
    KernelSpec("pointwise", CATALOG["pointwise"],
               _t2.pointwise, _binary_2d, lambda a: {"out": a["x"] + a["y"]}, ("out",), (1024, 2048), SHAPES_2D,
               trips=lambda s: _cdiv(s[1], 256), shape_for_trips=lambda t: (6, 256 * t - 128),
               tile_output=True, swizzles=True),
    KernelSpec("inner_reduction", CATALOG["inner_reduction"],
               _red.inner_reduction, _inner, lambda a: {"out": a["x"].astype(np.float64).sum(axis=1)},
               ("out",), (1024, 2048), SHAPES_2D, trips=lambda s: _cdiv(s[1], 256),
               tolerance=lambda s: _sum_tol(s[1]), shape_for_trips=lambda t: (3, 256 * t - 128)),
    KernelSpec("outer_reduction", CATALOG["outer_reduction"], _red.outer_reduction, _outer,
               lambda a: {"out": a["x"].astype(np.float64).sum(axis=0)}, ("out",), (1024, 2048), SHAPES_2D,
               trips=lambda s: _cdiv(s[0], 8), tolerance=lambda s: _sum_tol(s[0]),
               shape_for_trips=lambda t: (8 * t - 3, 264)),  # rows of 16-byte multiples in every dtype
    KernelSpec("persistent", CATALOG["persistent"], _red.persistent, _unary_2d,
               lambda a: {"out": _normalize(a["x"])}, ("out",), (1024, 2048),
               tuple(s for s in SHAPES_2D if s[1] % 256 == 0), trips=lambda s: s[1] // 256,
               tolerance=lambda s: (1e-4, 1e-4), build_params=lambda s: {"row": s[1]},
               shape_for_trips=lambda t: (2, 256 * t)),
    KernelSpec("two_pass", CATALOG["two_pass"],
               _red.two_pass, _unary_2d, lambda a: {"out": _normalize(a["x"])}, ("out",), (1024, 2048), SHAPES_2D,
               trips=lambda s: _cdiv(s[1], 256), tolerance=lambda s: (1e-4, 1e-4),
               shape_for_trips=lambda t: (2, 256 * t - 128), tile_output=True),
    KernelSpec("matmul", CATALOG["matmul"], _mm.matmul, _mm_inputs,
               lambda a: {"c": a["a"].astype(np.float64) @ a["b"].astype(np.float64)}, ("c",), (1024, 1024),
               SHAPES_2D, trips=lambda s: _cdiv(s[1], 16), tolerance=lambda s: (1e-4, 2e-5 * s[1]),
               shape_for_trips=lambda t: (40, 16 * t - 8)),
    # B is [N, K] (K-major, what the tensor cores read); float32 accumulation of K products of exact
    # half-precision values; K a multiple of 8 (TMA needs 16-byte row pitches)
    KernelSpec("matmul_tc", CATALOG["matmul_tc"], _mtc.matmul_tc, _mm_tc_inputs, _mm_tc_reference, ("c",),
               (1024, 2048, 4096), ((128, 128, 64), (500, 1000, 304), (1024, 2048, 4096), (129, 264, 72)),
               trips=lambda s: _cdiv(s[2], _mtc.BK), tolerance=lambda s: (1e-4, 3e-6 * s[2]),
               shape_for_trips=lambda t: (130, 136, _mtc.BK * t - 8), dtypes=_mtc.MMA_DTYPES, seed=False,
               dtype_variant=_matmul_tc_dtype),
    # shape (BH, Lq, Lk), head dim 64 unless --head-dim; P rounded to the inputs' dtype before P @ V
    KernelSpec("attention", CATALOG["attention"], functools.partial(_att.attention, head_dim=64),
               functools.partial(_attention_inputs, 64, False),
               functools.partial(_attention_reference, 64, False, None, False), ("o",),
               (64, 4096, 4096), ((1, 1, 1), (2, 17, 17), (1, 128, 128), (3, 200, 130), (16, 1024, 1024)),
               trips=lambda s: _cdiv(s[2], _att.BN), tolerance=lambda s: (2e-3, 1.5e-2),
               shape_for_trips=lambda t: (1, 70, _att.BN * t - 8), dtypes=_att.MMA_DTYPES, seed=False,
               float32_outputs=("lse",), variant=lambda **kw: _attention_spec(KERNELS["attention"], **kw),
               dtype_variant=functools.partial(_attention_dtype, 64, False, None, False)),
]
_SPECS += [_row_spec(op) for op in _rows.OPS]
KERNELS: dict[str, KernelSpec] = {s.name: s for s in _SPECS}
assert list(KERNELS) == list(CATALOG), "every built-in kernel has one line in the catalog"
SEED_MATRIX = tuple(n for n in KERNELS if KERNELS[n].pipelined and KERNELS[n].seed)


B_LAYOUTS = ("nk", "kn")


def with_b_layout(spec: KernelSpec, b_layout: str) -> KernelSpec:
    """``spec`` with its B operand in ``b_layout`` (:func:`matmul_tc_variant`)."""
    return matmul_tc_variant(spec, b_layout)


def matmul_tc_variant(spec: KernelSpec, b_layout: str = "nk", epilogue: str = "none",
                      scaling: Optional[str] = None) -> KernelSpec:
    """``spec`` with its B operand in ``b_layout``: "nk" (b is [N, K], the built-in default) or "kn"
    (b is [K, N] row-major and c = a @ b: inputs, reference and kernel change together), with
    ``epilogue`` (:data:`cbrules.kernels.matmul_tc.EPILOGUES`: its inputs, reference and tolerance
    too) and with the operands' ``scaling`` (:data:`cbrules.kernels.matmul_tc.SCALINGS`; None: the
    kernel's default, per tensor for FP8). Only the built-in matmul_tc takes them; "nk" without an
    epilogue or a scaling returns it unchanged."""
    if b_layout not in B_LAYOUTS:
        raise UnsupportedVariantError(f"B layout {b_layout!r}: one of {', '.join(B_LAYOUTS)}")
    if epilogue not in _mtc.EPILOGUES:
        raise UnsupportedVariantError(f"kernel matmul_tc: epilogue {epilogue!r} is not one of "
                                      f"{', '.join(_mtc.EPILOGUES)}")
    if scaling is not None and scaling not in _mtc.SCALINGS:
        raise UnsupportedVariantError(f"kernel matmul_tc: scaling {scaling!r} is not one of {', '.join(_mtc.SCALINGS)}")
    if spec is not KERNELS.get("matmul_tc"):
        what = "an epilogue (--epilogue)" if epilogue != "none" else "a scaling (--scaling)" if scaling is not None \
            else "a B layout (--b-layout)"
        raise UnsupportedVariantError(f"kernel {spec.name}: {what} applies to the built-in matmul_tc only; drop it")
    if b_layout == "nk" and epilogue == "none" and scaling is None:
        return spec
    inputs, product = (_mm_tc_inputs, _mm_tc_reference) if b_layout == "nk" else (_mm_tc_kn_inputs, _mm_tc_kn_reference)
    keywords, changes = {"b_layout": b_layout}, {}
    if epilogue != "none":
        keywords["epilogue"] = epilogue
        # alpha scales the product's rounding error, the epilogue adds its own
        changes = dict(reference=functools.partial(_mm_tc_epilogue_reference, epilogue, product),
                       tolerance=lambda s: (1e-4, 6e-6 * s[2] + 1e-5))
        inputs = functools.partial(_mm_tc_epilogue_inputs, epilogue, inputs)
    if scaling is not None:
        keywords["scaling"] = scaling
        inputs = functools.partial(_mm_tc_scaled_inputs, scaling, inputs)
        changes["float32_outputs"] = spec.float32_outputs + ("scale_a", "scale_b")
    return replace(spec, factory=functools.partial(_mtc.matmul_tc, **keywords), inputs=inputs,
                   reference=changes.pop("reference", product), scaling=scaling, **changes)


PINGPONG_TILE = 128  # bm = bn of a ping-pong tile: one warp group's 128 x 128 float32 accumulator, 128 registers


def with_pingpong(spec: KernelSpec, persistent: int) -> KernelSpec:
    """``spec`` (the built-in matmul_tc, in either B layout) as the ping-pong kernel: ``persistent`` blocks,
    each walking its tiles of 128 x 128 on two consumer warp groups that take turns (rules/ws_pingpong.rules)."""
    if getattr(spec.factory, "func", spec.factory) is not _mtc.matmul_tc:
        raise UnsupportedVariantError(f"kernel {spec.name}: --pingpong applies to the built-in matmul_tc only; drop "
                                      "it (a kernel of your own asks for it with circular_buffer(..., pingpong=True))")
    base = spec.factory

    def pingpong(**options) -> Kernel:
        # the checker's kernel before lowering is not warp-specialized: the same tiles, one walk, no turns
        return base(**options, pingpong=bool(options.get("warp_specialize")), bm=PINGPONG_TILE, bn=PINGPONG_TILE,
                    persistent=persistent)
    pingpong.func = _mtc.matmul_tc  # still the built-in matmul_tc (for with_pingpong's own test)
    return replace(spec, factory=pingpong)


class UnsupportedVariantError(CbrulesError, ValueError):
    """A built-in kernel asked for in a variant it is not built for (``tma_store`` without a tile output)."""


class UnsupportedDtypeError(UnsupportedVariantError):
    """A built-in kernel asked for in a dtype it is not built for."""


class UnknownKernelError(CbrulesError, KeyError):
    """A kernel name that is not built in."""

    def __str__(self) -> str:
        return self.args[0]


def get(name: str) -> KernelSpec:
    """The built-in kernel called ``name``."""
    if name not in KERNELS:
        raise UnknownKernelError(f"unknown kernel {name!r}{did_you_mean(name, KERNELS)}; known kernels: "
                                 f"{', '.join(sorted(KERNELS))} (or give the path of a kernel file)")
    return KERNELS[name]


def prefetch_values(stages: int) -> list[int]:
    """Every valid prefetch for ``stages``: 0 .. S-1."""
    return list(range(stages))
