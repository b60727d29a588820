"""cbrules inside PyTorch programs: kernels as ``torch.library`` custom ops, and drop-in functions.

Imported only on request (``import cbrules.torch``); torch is not a dependency of cbrules, and
``import cbrules`` never loads it. Everything here runs on CUDA tensors, on torch's current stream,
without synchronising (cbrules/codegen/launch.py), so it composes with ``torch.cuda.stream``, CUDA
graphs and ``torch.compile``:

* :func:`kernel_op` registers a kernel of one's own (a :class:`cbrules.ir.builder.Kernel` or a compiled
  one) as a custom op with a fake implementation: its unwritten tensors are the op's inputs, its written
  ones its outputs (shapes from the kernel's own shape terms), its symbols that no input's shape gives
  and its float scalars are int / float arguments;
* :func:`linear`, :func:`matmul`, :func:`attention`, :func:`rms_norm`, :func:`layer_norm` and
  :func:`softmax` behave like ``F.linear`` (with a fused activation), ``torch.matmul``,
  ``F.scaled_dot_product_attention``, ``F.rms_norm``, ``F.layer_norm`` and ``torch.softmax`` for the
  shapes and dtypes the built-in kernels take (``matmul_tc``, ``attention``, the row kernels), refusing
  the rest by name. They are custom ops too (``cbrules::linear`` ...), so
  ``torch.compile(fullgraph=True)`` keeps them whole.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Optional, Sequence

try:
    import torch
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("cbrules.torch needs PyTorch (pip install torch); the rest of cbrules runs without it") from e

from . import api
from .errors import CbrulesError
from .ir.builder import Kernel
from .ir.terms import evaluate

__all__ = ["TorchOpError", "kernel_op", "linear", "matmul", "attention", "rms_norm", "layer_norm", "softmax",
           "swiglu", "set_autotune", "ACTIVATIONS"]

# cbrules dtype names <-> torch dtypes
_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                 "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
                 "uint32": getattr(torch, "uint32", None), "uint64": getattr(torch, "uint64", None),
                 "float8_e4m3": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
_NAMES = {v: k for k, v in _TORCH_DTYPES.items() if v is not None}
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$")
_SCHEMA_WORDS = frozenset({"Tensor", "int", "float", "bool", "str", "None", "Scalar", "SymInt", "out", "self"})


class TorchOpError(CbrulesError, ValueError):
    """A call or a registration the torch integration cannot take (named: what, why, the fix)."""


class _KernelOp:
    """What a custom op made from one kernel needs: its parameters sorted into the op's arguments and
    results, and the compiled kernel (built on first launch, under a lock)."""

    def __init__(self, kernel: Any):
        if isinstance(kernel, Kernel):
            self._graph = api.lower(kernel)
            from .codegen.cuda import emit
            from .schedule import schedule
            self.source = emit(schedule(self._graph))
            self._compiled = None
        elif hasattr(kernel, "source") and hasattr(kernel, "bind"):  # a CompiledKernel
            self.source, self._compiled = kernel.source, kernel
        else:
            raise TorchOpError(f"kernel_op: {type(kernel).__name__} is not a cbrules kernel; give a Kernel (the "
                               "builder's) or what cbrules.api.compile returned")
        self._lock = threading.Lock()
        params = self.source.params
        self.inputs = [p for p in params if p.kind == "tensor" and not p.written]
        self.outputs = [p for p in params if p.kind == "tensor" and p.written]
        if not self.outputs:
            raise TorchOpError(f"kernel_op: kernel {self.source.name!r} writes no tensor, so the op would "
                               "return nothing; a custom op returns what the kernel writes")
        shaped = {str(t.value) for p in self.inputs for t in p.shape if t.op == "name"}
        self.ints = [p for p in params if p.kind == "symbol" and p.dtype.startswith("int") and p.name not in shaped]
        self.floats = [p for p in params if p.kind == "symbol" and not p.dtype.startswith("int")]
        for p in self.inputs + self.outputs:
            if _TORCH_DTYPES.get(p.dtype) is None:
                raise TorchOpError(f"kernel_op: tensor {p.name!r} is {p.dtype}, which torch has no type for here")
        for p in self.inputs + self.ints + self.floats:
            if p.name in _SCHEMA_WORDS:
                raise TorchOpError(f"kernel_op: parameter {p.name!r} is a word of torch's schema language; "
                                   "rename it in the kernel")

    def schema(self) -> str:
        args = [f"Tensor {p.name}" for p in self.inputs] + [f"int {p.name}" for p in self.ints] + \
            [f"float {p.name}" for p in self.floats]
        results = "Tensor" if len(self.outputs) == 1 else "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        return f"({', '.join(args)}) -> {results}"

    def output_shapes(self, tensors: Sequence[Any], ints: Sequence[int]) -> list[tuple]:
        """The written tensors' shapes from the inputs' shapes and the int arguments."""
        symbols = {p.name: n for p, n in zip(self.ints, ints)}
        for p, t in zip(self.inputs, tensors):
            if t.dim() != len(p.shape):
                raise TorchOpError(f"{self.source.name}: tensor {p.name!r} has {t.dim()} dimensions, the kernel "
                                   f"takes {len(p.shape)} ({', '.join(map(str, p.shape))})")
            for term, n in zip(p.shape, t.shape):
                if term.op == "name":
                    symbols.setdefault(str(term.value), n)
        try:
            return [tuple(evaluate(term, symbols) for term in p.shape) for p in self.outputs]
        except KeyError as e:
            raise TorchOpError(f"{self.source.name}: an output's shape needs symbol {e}, which no input gives; "
                               "pass it as an argument") from None

    def empty_outputs(self, tensors: Sequence[Any], ints: Sequence[int]) -> list:
        device = tensors[0].device if tensors else torch.device("cuda")
        return [torch.empty(shape, dtype=_TORCH_DTYPES[p.dtype], device=device)
                for p, shape in zip(self.outputs, self.output_shapes(tensors, ints))]

    def compiled(self):
        with self._lock:
            if self._compiled is None:
                self._compiled = api.compile_lowered(self._graph)
            return self._compiled

    def run(self, tensors: Sequence[Any], ints: Sequence[int], floats: Sequence[float]) -> list:
        self.output_shapes(tensors, ints)  # the shapes first, the device last (as the drop-in functions)
        for p, t in zip(self.inputs, tensors):
            _require_cuda(self.source.name, p.name, t)
        outs = self.empty_outputs(tensors, ints)
        kwargs = {p.name: t.contiguous() for p, t in zip(self.inputs, tensors)}
        kwargs.update({p.name: o for p, o in zip(self.outputs, outs)})
        kwargs.update({p.name: int(v) for p, v in zip(self.ints, ints)})
        kwargs.update({p.name: float(v) for p, v in zip(self.floats, floats)})
        if outs and all(o.numel() for o in outs):
            self.compiled()(**kwargs)
        return outs


def kernel_op(name: str, kernel: Any) -> Callable:
    """Register ``kernel`` as the torch custom op ``name`` ("namespace::op") and return it.

    The op takes the kernel's unwritten tensors (in parameter order), then the int symbols no input's
    shape gives, then its float scalars, and returns its written tensors (one tensor, or a tuple), new
    tensors of the shapes the kernel's shape terms give. Inputs that are not contiguous are made so;
    CPU tensors are refused by name. The fake implementation returns empty tensors of those shapes,
    so ``torch.compile(fullgraph=True)`` and ``torch.export`` trace through it. The kernel is lowered
    now and compiled on the first launch."""
    if not isinstance(name, str) or not _OP_NAME.match(name):
        raise TorchOpError(f"kernel_op: name {name!r}: give 'namespace::op', identifiers on both sides")
    spec = _KernelOp(kernel)
    n_in, n_int = len(spec.inputs), len(spec.ints)
    single = len(spec.outputs) == 1

    def split(args):
        return args[:n_in], args[n_in:n_in + n_int], args[n_in + n_int:]

    def real(*args):
        outs = spec.run(*split(args))
        return outs[0] if single else tuple(outs)

    def fake(*args):
        tensors, ints, _ = split(args)
        outs = spec.empty_outputs(tensors, ints)
        return outs[0] if single else tuple(outs)

    op = torch.library.custom_op(name, real, mutates_args=(), schema=spec.schema())
    op.register_fake(fake)
    return op


def _require_cuda(op: str, what: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TorchOpError(f"{op}: {what} is a {type(t).__name__}, not a torch tensor")
    if t.device.type != "cuda":
        raise TorchOpError(f"{op}: {what} is on {t.device}; cbrules kernels run on CUDA tensors (x.cuda())")


# ------------------------------------------------------------------------------ drop-in functions
ACTIVATIONS = {None: "bias", "relu": "bias_relu", "gelu": "bias_gelu", "gelu_tanh": "bias_gelu_tanh",
               "silu": "bias_silu"}  # activation -> matmul_tc's epilogue (with a bias of zeros where none is given)
_MMA_TORCH = (torch.bfloat16, torch.float16)
_kernels: dict = {}
_kernels_lock = threading.Lock()
_log = logging.getLogger("cbrules")


def _sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _kernel(key: tuple, build: Callable[[], Kernel]):
    """The compiled kernel for ``key``, built once per process (shapes are launch-time symbols); each
    build is logged (logger ``cbrules``, INFO: what, and how long the caller waited for it)."""
    with _kernels_lock:
        if key not in _kernels:
            t0 = time.perf_counter()
            _kernels[key] = api.compile(build())
            _log.info("cbrules.torch: compiled %s for %s in %.2f s (once per process; NVRTC's cache keeps the "
                      "cubin)", _kernels[key].name, ", ".join(map(str, key[1:])), time.perf_counter() - t0)
        return _kernels[key]


_autotune = [os.environ.get("CBRULES_AUTOTUNE", "") not in ("", "0")]


def set_autotune(on: bool) -> None:
    """Have the drop-in functions measure their kernel's configurations (cbrules.kernels.tuned.tune_space)
    on the first call at each shape and keep the fastest (:func:`cbrules.autotune.autotune`: the choice
    is cached on disk, so later processes measure nothing). Off by default (the environment variable
    ``CBRULES_AUTOTUNE=1`` turns it on): each function then runs one configuration that is fast on the
    H200. A call during CUDA-graph capture never measures (it takes a cached choice or that default)."""
    _autotune[0] = bool(on)


def _tuned(family: tuple, shapes: tuple, build: Callable[..., Kernel], args: dict, default: Callable[[], Kernel]):
    """The compiled kernel of ``family`` (the built-in kernel's name, then what picks its variant) for
    these ``shapes``: autotuned on ``args`` where asked (and not capturing a graph), else ``default()``'s,
    one for the family whatever the shapes (they are launch-time symbols)."""
    key = ("tuned",) + family + shapes
    with _kernels_lock:
        hit = _kernels.get(key)
    if hit is not None:
        return hit
    if not _autotune[0] or not args or torch.cuda.is_current_stream_capturing():
        return _kernel(family, default)
    from .autotune import autotune
    from .kernels.tuned import tune_space
    name = "cbrules.torch:" + ":".join(map(str, family))
    choice = autotune(name, build, tune_space(family[0], _sm_count()), list(shapes), args)
    with _kernels_lock:
        return _kernels.setdefault(key, choice.kernel)


def _matmul_kernel(dtype: torch.dtype, b_layout: str, epilogue: str, args: dict):
    from .kernels.matmul_tc import matmul_tc
    name = _NAMES[dtype]
    sms = _sm_count()
    m, kk = args["a"].shape
    n = args["c"].shape[1]
    build = functools.partial(matmul_tc, dtype=name, b_layout=b_layout, epilogue=epilogue)
    return _tuned(("matmul_tc", name, b_layout, epilogue, sms), (m, n, kk), build, args,
                  lambda: build(stages=4, warp_specialize=True, registers=(40, 232), persistent=sms))


def _check_mma_operands(op: str, **tensors) -> torch.dtype:
    """The operands' one dtype, if the tensor cores take it (their device is checked last, by
    :func:`_require_cuda`, once every shape is known to fit)."""
    for what, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TorchOpError(f"{op}: {what} is a {type(t).__name__}, not a torch tensor")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _MMA_TORCH:
        shown = ", ".join(f"{k} {t.dtype}" for k, t in tensors.items())
        raise TorchOpError(f"{op}: {shown}: the tensor cores take bfloat16 or float16 operands of one dtype "
                           "(cast them first)")
    return next(iter(dtypes))


def _product(op: str, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
             b_layout: str, names: tuple[str, str], residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a [M, K] times b ([N, K] for "nk", [K, N] for "kn") with the bias and activation (or the residual
    [M, N]) fused; ``names`` are a's and b's in the caller's words."""
    if activation not in ACTIVATIONS:
        raise TorchOpError(f"{op}: activation={activation!r}: one of {', '.join(map(repr, ACTIVATIONS))}")
    if residual is not None and (bias is not None or activation is not None):
        raise TorchOpError(f"{op}: residual with a bias or an activation: matmul_tc's epilogues add one of them "
                           "(add the bias to the residual first, or apply the activation separately)")
    extra = {"bias": bias, "residual": residual}
    dtype = _check_mma_operands(op, **{names[0]: a, names[1]: b}, **{k: v for k, v in extra.items() if v is not None})
    m, k = a.shape
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    if k % 8 or n % 8:
        raise TorchOpError(f"{op}: K = {k}, N = {n}: the TMA loads need rows of 16-byte multiples, so K and N "
                           "must be multiples of 8 (pad them)")
    if bias is not None and tuple(bias.shape) != (n,):
        raise TorchOpError(f"{op}: bias has shape {tuple(bias.shape)}, the product has {n} columns")
    if residual is not None and tuple(residual.shape) != (m, n):
        raise TorchOpError(f"{op}: residual has shape {tuple(residual.shape)}, the product is {(m, n)}")
    for what, t in zip(names + ("bias", "residual"), (a, b, bias, residual)):
        if t is not None:
            _require_cuda(op, what, t)
    c = torch.empty((m, n), dtype=dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        if residual is not None:
            return c.copy_(residual)
        return c.zero_() if bias is None else _activate(bias.expand(m, n).float(), activation).to(dtype)
    fused = bias is not None or activation is not None
    epilogue = ACTIVATIONS[activation] if fused else "residual" if residual is not None else "none"
    args = {"a": a.contiguous(), "b": b.contiguous(), "c": c}
    if fused:
        args["bias"] = (torch.zeros(n, dtype=dtype, device=a.device) if bias is None else bias.contiguous())
    if residual is not None:
        args["residual"] = residual.contiguous()
    _matmul_kernel(dtype, b_layout, epilogue, args)(**args)
    return c


def _activate(x: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    F = torch.nn.functional
    return {None: lambda v: v, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
            "silu": F.silu}[activation](x)


@torch.library.custom_op("cbrules::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
               residual: Optional[torch.Tensor]) -> torch.Tensor:
    lead = x.shape[:-1]
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise TorchOpError(f"cbrules.torch.linear: x {tuple(x.shape)} and weight {tuple(weight.shape)}: weight is "
                           "[out_features, in_features] and x's last dimension is in_features")
    if residual is not None and tuple(residual.shape) != (*lead, weight.shape[0]):
        raise TorchOpError(f"cbrules.torch.linear: residual has shape {tuple(residual.shape)}, the output is "
                           f"{(*lead, weight.shape[0])}")
    flat = None if residual is None else residual.reshape(-1, weight.shape[0])
    y = _product("cbrules.torch.linear", x.reshape(-1, x.shape[-1]), weight, bias, activation, "nk", ("x", "weight"),
                 flat)
    return y.reshape(*lead, weight.shape[0])


@_linear_op.register_fake
def _(x, weight, bias, activation, residual):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("cbrules::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
               activation: Optional[str]) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise TorchOpError(f"cbrules.torch.matmul: a {tuple(a.shape)} @ b {tuple(b.shape)}: two matrices [M, K] "
                           "and [K, N] (batched products: loop, or use linear for [..., K] inputs)")
    return _product("cbrules.torch.matmul", a, b, bias, activation, "kn", ("a", "b"))


@_matmul_op.register_fake
def _(a, b, bias, activation):
    return a.new_empty((a.shape[0], b.shape[1]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``activation(F.linear(x, weight, bias))`` on the tensor cores (matmul_tc, persistent and
    warp-specialized; bias and activation fused into its epilogue): x [..., K], weight [N, K] (torch's
    Linear layout), bias [N], bfloat16 or float16 alike; ``activation`` one of :data:`ACTIVATIONS`
    (gelu is the exact, erf one; gelu_tanh torch's approximate="tanh"). ``residual`` [..., N] is added
    in the epilogue instead (``F.linear(x, weight) + residual``, one rounding). K and N multiples of 8."""
    return _linear_op(x, weight, bias, activation, residual)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None) -> torch.Tensor:
    """``activation(a @ b + bias)`` for a [M, K] and b [K, N] row-major (B read MN-major by the tensor
    cores: no transpose), bfloat16 or float16 alike; bias [N]. See :func:`linear`."""
    return _matmul_op(a, b, bias, activation)


def _row_kernel(op: str, x: torch.Tensor, eps: float):
    from .kernels.rows import RowError, row_op
    name = _NAMES.get(x.dtype)
    try:
        return _kernel(("rows", op, x.shape[-1], name, eps), lambda: row_op(op, row=x.shape[-1], dtype=name, eps=eps))
    except RowError as e:
        raise TorchOpError(f"cbrules.torch.{op}: {e}") from None


def _rows(op: str, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
          eps: float) -> torch.Tensor:
    """``op`` over the last dimension of ``x`` (any leading dimensions), weight and bias of that length."""
    where = f"cbrules.torch.{op}"
    tensors = {"x": x, **({} if weight is None else {"weight": weight}), **({} if bias is None else {"bias": bias})}
    for what, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TorchOpError(f"{where}: {what} is a {type(t).__name__}, not a torch tensor")
        if t.dtype != x.dtype or t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TorchOpError(f"{where}: {what} is {t.dtype}: give float32, float16 or bfloat16 tensors of one dtype")
    if x.dim() < 1:
        raise TorchOpError(f"{where}: x is a scalar; give [..., D]")
    d = x.shape[-1]
    for what, t in tensors.items():
        if what != "x" and tuple(t.shape) != (d,):
            raise TorchOpError(f"{where}: {what} has shape {tuple(t.shape)}, x's rows have {d} elements")
    ck = _row_kernel(op, x, eps)
    for what, t in tensors.items():
        _require_cuda(where, what, t)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return out
    args = {"x": x.contiguous().view(-1, d), "out": out.view(-1, d)}
    if op != "softmax":
        args["weight"] = weight.contiguous() if weight is not None else torch.ones(d, dtype=x.dtype, device=x.device)
    if op == "layer_norm":
        args["bias"] = bias.contiguous() if bias is not None else torch.zeros(d, dtype=x.dtype, device=x.device)
    ck(**args)
    return out


def _last_dim(op: str, x: torch.Tensor, normalized_shape) -> None:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or x.dim() < 1 or shape[0] != x.shape[-1]:
        raise TorchOpError(f"cbrules.torch.{op}: normalized_shape {shape} for x {tuple(x.shape)}: the kernels "
                           "normalise over the last dimension only (normalized_shape = (x.shape[-1],))")


@torch.library.custom_op("cbrules::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return _rows("rms_norm", x, weight, None, eps)


@torch.library.custom_op("cbrules::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                   eps: float) -> torch.Tensor:
    return _rows("layer_norm", x, weight, bias, eps)


@torch.library.custom_op("cbrules::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor) -> torch.Tensor:
    return _rows("softmax", x, None, None, 0.0)


for _op in (_rms_norm_op, _layer_norm_op, _softmax_op):
    _op.register_fake(lambda x, *rest: torch.empty_like(x, memory_format=torch.contiguous_format))


def rms_norm(x: torch.Tensor, normalized_shape, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    """``F.rms_norm`` over the last dimension (the row kernel: the row in registers, one read, one write);
    ``eps`` defaults to the dtype's machine epsilon, as torch's."""
    _last_dim("rms_norm", x, normalized_shape)
    eps = torch.finfo(x.dtype).eps if eps is None and x.is_floating_point() else eps
    return _rms_norm_op(x, weight, float(eps if eps is not None else 0.0))


def layer_norm(x: torch.Tensor, normalized_shape, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm`` over the last dimension (biased variance, as torch's)."""
    _last_dim("layer_norm", x, normalized_shape)
    return _layer_norm_op(x, weight, bias, float(eps))


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)`` along the last dimension (another ``dim`` is refused by name)."""
    if not isinstance(dim, int) or x.dim() < 1 or dim not in (-1, x.dim() - 1):
        raise TorchOpError(f"cbrules.torch.softmax: dim={dim!r} of x {tuple(x.shape)}: the kernel runs along the last "
                           "dimension (transpose x first)")
    return _softmax_op(x)


@torch.library.custom_op("cbrules::swiglu", mutates_args=())
def _swiglu_op(ab: torch.Tensor) -> torch.Tensor:
    from .kernels.rows import RowError, swiglu as build
    where = "cbrules.torch.swiglu"
    if not isinstance(ab, torch.Tensor) or ab.dim() < 1 or ab.shape[-1] % 2:
        raise TorchOpError(f"{where}: give a tensor [..., 2 * hidden] (gate and up side by side)")
    if ab.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TorchOpError(f"{where}: ab is {ab.dtype}: give float32, float16 or bfloat16")
    hidden = ab.shape[-1] // 2
    try:
        ck = _kernel(("swiglu", hidden, _NAMES[ab.dtype]), lambda: build(hidden, _NAMES[ab.dtype]))
    except RowError as e:
        raise TorchOpError(f"{where}: {e}") from None
    _require_cuda(where, "ab", ab)
    out = ab.new_empty((*ab.shape[:-1], hidden))
    if out.numel():
        ck(ab=ab.contiguous().view(-1, 2 * hidden), out=out.view(-1, hidden))
    return out


@_swiglu_op.register_fake
def _(ab):
    return ab.new_empty((*ab.shape[:-1], ab.shape[-1] // 2))


def swiglu(ab: torch.Tensor) -> torch.Tensor:
    """``F.silu(ab[..., :h]) * ab[..., h:]`` for ``ab [..., 2h]``: the step of a SwiGLU MLP between its
    gate-and-up GEMM (one ``linear`` with the two weights stacked) and its down GEMM."""
    return _swiglu_op(ab)


_SHORT_KEYS = 2048  # keys up to which the attention drop-in walks its query tiles persistently (below)


def _attention_kernel(dtype: torch.dtype, d: int, causal: bool, scale: float, args: Optional[dict] = None):
    from .kernels.attention import attention as build
    name = _NAMES[dtype]
    shapes = () if args is None else (*args["q"].shape, args["k"].shape[1])
    variant = functools.partial(build, head_dim=d, causal=causal, scale=scale, dtype=name)
    # short non-causal sequences at D <= 128 walk the query tiles in a block an SM, which loads the next
    # tile under the last one's epilogue (quick timing on the H200, L = 1k: D = 128 420 -> 469 TFLOP/s,
    # D = 64 318 -> 350; even at 4k, behind at 16k and at D = 256)
    walk = args is not None and not causal and d <= 128 and args["k"].shape[1] <= _SHORT_KEYS
    default = (lambda: variant(warp_specialize=True, persistent=_sm_count())) if walk else \
        (lambda: variant(warp_specialize=True))
    return _tuned(("attention", name, d, causal, scale) + (("walk",) if walk else ()), shapes, variant,
                  args or {}, default)



def _attention_shapes(op: str, q, k, v, scale: Optional[float], heads_hint: str) -> tuple[int, int, int, int]:
    """(heads, Lq, Lk, D) of attention's [..., L, D] operands, each checked by name, the device last."""
    if q.dim() < 2 or q.dim() != k.dim() or k.shape != v.shape or q.shape[:-2] != k.shape[:-2] \
            or q.shape[-1] != k.shape[-1]:
        raise TorchOpError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: give [..., L, D] "
                           f"tensors with the same leading dimensions ({heads_hint}) and head dimension, k and "
                           "v alike")
    d = q.shape[-1]
    if d not in (64, 128, 256):
        raise TorchOpError(f"{op}: head dimension {d}: the kernel is built for 64, 128 and 256")
    if scale is not None and not (scale > 0 and scale != float("inf")):
        raise TorchOpError(f"{op}: scale={scale!r}: give a positive finite number (default 1/sqrt(D))")
    for what, t in (("q", q), ("k", k), ("v", v)):
        _require_cuda(op, what, t)
    heads = 1
    for n in q.shape[:-2]:
        heads *= n
    return heads, q.shape[-2], k.shape[-2], d


@torch.library.custom_op("cbrules::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: Optional[float]) -> torch.Tensor:
    op = "cbrules.torch.attention"
    dtype = _check_mma_operands(op, q=q, k=k, v=v)
    heads, lq, lk, d = _attention_shapes(op, q, k, v, scale, "one key head per query head; fewer key heads "
                                                              "with enable_gqa=True")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    if o.numel() == 0:
        return o
    if lk == 0:
        return o.fill_(float("nan"))  # softmax over no keys, as torch's math backend gives
    args = {"q": q.contiguous().view(heads, lq, d), "k": k.contiguous().view(heads, lk, d),
            "v": v.contiguous().view(heads, lk, d), "o": o.view(heads, lq, d)}
    _attention_kernel(dtype, d, causal, float(d ** -0.5 if scale is None else scale), args)(**args)
    return o


@_attention_op.register_fake
def _(q, k, v, causal, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


_FP8_TORCH = (torch.float8_e4m3fn, torch.float8_e5m2)


@torch.library.custom_op("cbrules::attention_fp8", mutates_args=())
def _attention_fp8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
                      descale: list[float]) -> torch.Tensor:
    heads, lq, lk, d = _attention_shapes("cbrules.torch.attention", q, k, v, scale, "one key head per query head")
    o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    if o.numel() == 0:
        return o
    if lk == 0:
        return o.fill_(float("nan"))
    # V^T [heads, D, Lv]: the tensor cores read an FP8 B K-major only; rows padded with zeros to a multiple of
    # 16 keys (TMA's row pitch; P is 0 past Lk)
    lv = -(-lk // 16) * 16
    vt = torch.zeros(heads, d, lv, dtype=v.dtype, device=v.device)
    vt[:, :, :lk] = v.reshape(heads, lk, d).transpose(1, 2)
    args = {"q": q.contiguous().view(heads, lq, d), "k": k.contiguous().view(heads, lk, d), "vt": vt,
            "o": o.view(heads, lq, d), "scale_q": descale[0], "scale_k": descale[1], "scale_v": descale[2]}
    _attention_kernel(q.dtype, d, causal, float(d ** -0.5 if scale is None else scale), args)(**args)
    return o


@_attention_fp8_op.register_fake
def _(q, k, v, causal, scale, descale):
    return torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)


def _fp8_descale(op: str, dtypes: set, descale) -> list[float]:
    """The three dequantization scales of FP8 q, k, v as floats (named refusals: types, values)."""
    if len(dtypes) != 1:
        raise TorchOpError(f"{op}: q, k and v of {', '.join(sorted(map(str, dtypes)))}: give FP8 operands of one dtype")
    if descale is None or not isinstance(descale, (tuple, list)) or len(descale) != 3:
        raise TorchOpError(f"{op}: FP8 q, k, v need descale=(scale_q, scale_k, scale_v), the floats that "
                           "dequantize them (x = x_fp8 * scale_x), as Python numbers (a CUDA tensor's value "
                           "would need a synchronization)")
    out = []
    for what, s in zip(("scale_q", "scale_k", "scale_v"), descale):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0 < s < float("inf")):
            raise TorchOpError(f"{op}: descale {what}={s!r}: give a positive finite Python number")
        out.append(float(s))
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None, enable_gqa: bool = False,
              descale: Optional[tuple] = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=enable_gqa)``
    by the built-in FlashAttention kernel (warp-specialized): q [..., Lq, D], k and v [..., Lk, D] with the
    same leading dimensions, D in 64, 128, 256, bfloat16 or float16; causal is top-left aligned as
    torch's is_causal. ``enable_gqa=True`` takes k and v with fewer heads (dimension -3) than q, a
    divisor of q's: each key head serves that many query heads, as torch's; the kernel reads them
    repeated (a copy of k and v, repeat_interleave), not through a head map of its own.

    FP8 q, k, v (``torch.float8_e4m3fn`` or ``float8_e5m2``, one dtype) take ``descale=(scale_q, scale_k,
    scale_v)``, Python floats with x = x_fp8 * scale_x, and give a bfloat16 output; V is transposed into a
    copy (its rows padded to 16 keys) for the kernel, which reads an FP8 V only that way (docs/fp8.md)."""
    if enable_gqa and all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in (q, k, v)) \
            and k.shape[-3] != q.shape[-3]:
        hq, hk = q.shape[-3], k.shape[-3]
        if hk == 0 or hq % hk or v.shape[-3] != hk:
            raise TorchOpError(f"cbrules.torch.attention: enable_gqa with {hq} query heads and k {tuple(k.shape)}, "
                               f"v {tuple(v.shape)}: the key heads (dimension -3, k and v alike) must divide the "
                               "query heads")
        k, v = k.repeat_interleave(hq // hk, dim=-3), v.repeat_interleave(hq // hk, dim=-3)
    if isinstance(q, torch.Tensor) and q.dtype in _FP8_TORCH:
        descale = _fp8_descale("cbrules.torch.attention",
                               {t.dtype for t in (q, k, v) if isinstance(t, torch.Tensor)}, descale)
        for what, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TorchOpError(f"cbrules.torch.attention: {what} is a {type(t).__name__}, not a torch tensor")
        return _attention_fp8_op(q, k, v, bool(causal), None if scale is None else float(scale), descale)
    if descale is not None:
        raise TorchOpError("cbrules.torch.attention: descale is for FP8 q, k, v; these are "
                           f"{getattr(q, 'dtype', type(q).__name__)}")
    if any(isinstance(t, torch.Tensor) and t.dtype in _FP8_TORCH for t in (k, v)):
        raise TorchOpError(f"cbrules.torch.attention: q is {getattr(q, 'dtype', type(q).__name__)} but k or v is "
                           "FP8: give q, k and v all in one FP8 type (with descale=...) or all bfloat16/float16")
    return _attention_op(q, k, v, bool(causal), None if scale is None else float(scale))
