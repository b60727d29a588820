"""From a parsed command line to a kernel: the shape, the circular-buffer and warp-specialization
options, the rule folders, and building, compiling and running the kernel the options describe
(shared by the ``compile``, ``run``, ``lower``, ``trace`` and ``check`` commands of :mod:`cbrules.cli`)."""
from __future__ import annotations

import math
import statistics
import sys
from typing import TYPE_CHECKING, Optional

from .errors import CliError
from .ir import option_schema
from .kernelfile import load_kernel, refuse_untaken

if TYPE_CHECKING:
    from .kernels.specs import KernelSpec

MAX_ELEMENTS = 2 ** 31  # the launcher refuses tensors past 2**31 elements: refuse such shapes up front


VARIANT_OPTIONS = ("head_dim", "causal", "lse", "scale", "persistent")  # a built-in kernel's own parameters (KernelSpec.variant)


def load_spec(a) -> KernelSpec:
    """The kernel the command line names (:func:`cbrules.kernelfile.load_kernel`), with its B operand in
    the layout ``--b-layout`` asks for, its ``--epilogue`` and ``--scaling`` (built-in matmul_tc only: its
    inputs and reference change too), in the ``--dtype`` asked for (:meth:`KernelSpec.for_dtype`), as the
    ping-pong kernel with ``--pingpong`` (matmul_tc only), and with the parameters of :data:`VARIANT_OPTIONS` (``--head-dim``, ``--causal``, ``--lse``, ``--scale``, ``--persistent``) for a
    kernel that takes them (attention)."""
    spec = load_kernel(a.kernel)
    asked = {k: getattr(a, k, None) for k in VARIANT_OPTIONS}
    asked = {k: v for k, v in asked.items() if v is not None}
    if asked:
        if spec.variant is None:
            flags = " ".join(f"--{k.replace('_', '-')}" for k in asked)
            raise CliError(f"{spec.name}: {flags}: this kernel takes no such parameters (attention does)")
        if asked.get("persistent") and not getattr(a, "warp_specialize", False):
            raise CliError(f"{spec.name}: --persistent {asked['persistent']} needs --warp-specialize: the producer "
                           "warp group loads each tile's Q and runs on into the next tile's K and V")
        spec = spec.variant(**asked)
    layout, epilogue, scaling = (getattr(a, k, None) for k in ("b_layout", "epilogue", "scaling"))
    if layout is not None or epilogue is not None or scaling is not None:
        from .kernels.specs import matmul_tc_variant
        spec = matmul_tc_variant(spec, layout or "nk", epilogue or "none", scaling)
    if getattr(a, "pingpong", False):
        from .kernels.specs import with_pingpong
        spec = with_pingpong(spec, PINGPONG_CHECK_BLOCKS if getattr(a, "command", "") == "check" else PINGPONG_BLOCKS)
    return spec.for_dtype(getattr(a, "dtype", None))


# --pingpong: one persistent block per SM of the H200; the checker's small problems run on one block, so that
# it walks every tile and both consumer groups take several turns
PINGPONG_BLOCKS, PINGPONG_CHECK_BLOCKS = 132, 1


def lowering_options(a) -> dict:
    """What the command line asks of a lowering: its rule folders and debug mode (absent when not given)."""
    return {"rules": rule_folders(a) or None, "debug": True if getattr(a, "debug", False) else None}


def rule_folders(a) -> list:
    """The ``--rules`` folders; an empty one would mean the working directory, which is never meant."""
    folders = list(getattr(a, "rules", None) or ()) + list(getattr(a, "dirs", None) or ())
    for f in folders:
        if not str(f).strip():
            raise CliError("--rules '' (or an empty rule folder argument): give the path of a rule folder")
    return list(getattr(a, "rules", None) or ())


def shape_of(a, spec: KernelSpec) -> tuple:
    """--shape as a tuple of ints (checked), else the kernel's default shape."""
    if getattr(a, "shape", None) is None:  # given empty (--shape ''), it is refused below, not the default
        return spec.default_shape
    try:
        if len(a.shape) > 200:  # int() of thousands of digits is refused by Python itself
            raise ValueError
        shape = tuple(int(x) for x in a.shape.split(","))
    except ValueError:
        raise CliError(f"--shape {a.shape[:40]!r}: give the sizes as integers separated by commas, e.g. "
                       "500,1024") from None
    if len(shape) != len(spec.default_shape):
        raise CliError(f"--shape {a.shape!r}: {spec.name} takes {len(spec.default_shape)} size(s), e.g. "
                       + ",".join(map(str, spec.default_shape)))
    if any(x < 1 for x in shape) or math.prod(shape) > MAX_ELEMENTS:
        raise CliError(f"--shape {a.shape!r}: sizes must be >= 1 and {MAX_ELEMENTS} elements at most")
    return shape


def _registers(a) -> Optional[tuple[int, int]]:
    text = getattr(a, "registers", None)
    if text is None:
        return None
    try:
        producer, consumer = (int(x) for x in text.split(","))
    except ValueError:
        raise CliError(f"--registers {text!r}: give the producer's and the consumers' register counts as two "
                       "integers separated by a comma, e.g. 40,232") from None
    return producer, consumer


def warp_options(a) -> dict:
    """The command line's warp-specialization options (absent when not asked for)."""
    ws = getattr(a, "warp_specialize", False) or getattr(a, "pingpong", False)  # ping-pong is warp-specialized
    return {"warp_specialize": True if ws else None, "registers": _registers(a)}


def file_options(a, spec: KernelSpec) -> None:
    """A kernel file gets every option given that its build() takes; one it does not take is an error
    (--shape is also the problem's shape for `run` and `check` when the file defines inputs())."""
    shape_for_inputs = getattr(a, "command", "") in ("run", "check") and spec.inputs is not None
    refuse_untaken(spec, {**{k: getattr(a, k, None) for k in option_schema.flags()},
                          "shape": None if shape_for_inputs else getattr(a, "shape", None),
                          "dtype": None if getattr(a, "dtype", None) in (None, "float32") else a.dtype,
                          "tma_store": getattr(a, "tma_store", False), "swizzle": getattr(a, "swizzle", None)})


def kernel_of(a, spec: KernelSpec):
    """The kernel with the command line's circular-buffer options; options it cannot take are an error."""
    file_options(a, spec)
    given = [flag for k, flag in option_schema.flags().items() if getattr(a, k, None) not in (None, False)]
    if given and not spec.pipelined:
        raise CliError(f"{spec.name}: its build() takes no circular-buffer options, so "
                       f"{', '.join(given)} would be ignored; drop them, or give build() "
                       "keyword parameters (stages=None, prefetch=None, war=None, ...) and pass them on")
    return spec.build(shape_of(a, spec), stages=getattr(a, "stages", None), prefetch=getattr(a, "prefetch", None),
                      war=getattr(a, "war", None), dtype=dtype_of(a, spec),
                      tma_store=bool(getattr(a, "tma_store", False)),
                      swizzle=getattr(a, "swizzle", None) or "none", **warp_options(a))


def dtype_of(a, spec: KernelSpec) -> str:
    """--dtype, else the kernel's first dtype (float32 for every kernel that takes it)."""
    return getattr(a, "dtype", None) or spec.dtypes[0]


def compile_kernel(spec: KernelSpec, kernel, annotate: bool = False, **lower_options):
    """Lower and compile ``kernel``: (the compiled kernel, one line of its registers, shared memory and spills)."""
    from . import api
    ck = api.compile(kernel, annotate=annotate, **lower_options)
    r = ck.cubin.resources
    return ck, (f"{ck.name}: {r.registers} registers, {ck.source.shared_bytes} B dynamic shared memory, "
                f"{r.shared_bytes} B static, {r.spill_stores}/{r.spill_loads} B spill stores/loads, "
                f"{r.stack_bytes} B stack{' (cached)' if ck.cubin.cached else ''}")


def run_kernel(spec: KernelSpec, ck, shape: tuple, reps: int, out=None, dtype: str = "float32") -> bool:
    """Launch ``ck`` ``reps`` times on random inputs of ``shape`` and judge its outputs against the reference
    (the spec's device check where it has one); prints what it measured to ``out``; True when they pass."""
    import numpy as np

    out = sys.stdout if out is None else out  # looked up now: the command line guards sys.stdout while it runs

    from .codegen import runtime
    rng = np.random.default_rng(0)
    args = spec.make_inputs(shape, rng, dtype)
    want = spec.expected(args)
    rtol, atol = spec.tolerances(shape, dtype)
    bound = ck.bind(**args)
    for name in spec.outputs:  # poison outputs so a kernel that writes nothing cannot pass
        bound.arrays[name].fill_bytes(0xFF)
    bound.launch()
    bound.finish()
    ok = True
    for name in spec.outputs:
        got = args[name].astype(np.float64)
        if spec.device_check is not None:  # the GPU's arithmetic departs from the reference's model
            good, what = spec.device_check(name, got, want, args)
        else:
            err = float(np.max(np.abs(got - want[name]))) if got.size else 0.0
            good, what = bool(np.allclose(got, want[name], rtol=rtol, atol=atol)), f"max abs error {err:.3g} vs numpy"
        ok &= good
        print(f"{name}: {what} ({'ok' if good else 'MISMATCH'})", file=out)
    times = runtime.time_launch(bound.launch, reps)
    ms = statistics.median(times)
    nbytes = sum(a.nbytes for a in args.values() if isinstance(a, np.ndarray))
    print(f"shape {'x'.join(map(str, shape))}: median {ms * 1e3:.1f} us over {reps} launches, "
          f"{nbytes / ms / 1e6:.1f} GB/s (bytes read + written)", file=out)
    return ok
