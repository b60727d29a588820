"""The ``cbrules`` command line: demo, kernels, lower, compile, run."""
from __future__ import annotations

import argparse
import runpy
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from . import api
from .kernels import KERNELS, KernelSpec, get
from .schedule import print_program


class CliError(Exception):
    """A user error: printed to stderr, exit code 2."""


def load_kernel(ref: str) -> KernelSpec:
    """A built-in kernel by name, or a Python file defining ``build()`` (and optionally
    ``inputs(size, rng)``, ``reference(inputs)``, ``OUTPUTS`` and ``SIZE``)."""
    if ref.endswith(".py") or Path(ref).is_file():
        path = Path(ref)
        if not path.is_file():
            raise CliError(f"no such kernel file: {ref}")
        ns = runpy.run_path(str(path))
        if "build" not in ns:
            raise CliError(f"{ref}: a kernel file must define build() returning a cbrules Kernel")
        return KernelSpec(path.stem, ns.get("__doc__") or "", ns["build"], ns.get("inputs"),
                          ns.get("reference"), tuple(ns.get("OUTPUTS", ())), int(ns.get("SIZE", 1 << 20)))
    try:
        return get(ref)
    except KeyError as e:
        raise CliError(str(e)) from None


def _compile(spec: KernelSpec, annotate: bool = False):
    ck = api.compile(spec.build(), annotate=annotate)
    r = ck.cubin.resources
    return ck, (f"{ck.name}: {r.registers} registers, {ck.source.shared_bytes} B dynamic shared memory, "
                f"{r.shared_bytes} B static, {r.spill_stores}/{r.spill_loads} B spill stores/loads, "
                f"{r.stack_bytes} B stack{' (cached)' if ck.cubin.cached else ''}")


def _run(spec: KernelSpec, ck, size: int, reps: int, out=sys.stdout) -> bool:
    from codegen import runtime
    if spec.inputs is None or spec.reference is None:
        raise CliError(f"{spec.name}: the kernel file defines no inputs()/reference(), so it cannot be run")
    rng = np.random.default_rng(0)
    args = spec.inputs(size, rng)
    want = spec.reference(args)
    bound = ck.bind(**args)
    for name in spec.outputs:  # poison outputs so a kernel that writes nothing cannot pass
        bound.arrays[name].fill_bytes(0xFF)
    bound.launch()
    bound.finish()
    ok = True
    for name in spec.outputs:
        got = args[name]
        err = float(np.max(np.abs(got - want[name]))) if got.size else 0.0
        good = np.allclose(got, want[name], rtol=spec.rtol, atol=spec.atol)
        ok &= good
        print(f"{name}: max abs error {err:.3g} vs numpy ({'ok' if good else 'MISMATCH'})", file=out)
    times = runtime.time_launch(bound.launch, reps)
    ms = statistics.median(times)
    nbytes = sum(a.nbytes for a in args.values() if isinstance(a, np.ndarray))
    print(f"size {size}: median {ms * 1e3:.1f} us over {reps} launches, {nbytes / ms / 1e6:.1f} GB/s "
          "(bytes read + written)", file=out)
    return ok


def cmd_kernels(a) -> int:
    for name, spec in sorted(KERNELS.items()):
        print(f"{name:16s} {spec.doc}")
    return 0


def cmd_lower(a) -> int:
    spec = load_kernel(a.kernel)
    print(print_program(api.program(spec.build())))
    return 0


def cmd_compile(a) -> int:
    spec = load_kernel(a.kernel)
    ck, summary = _compile(spec, annotate=a.annotate)
    if a.output:
        Path(a.output).write_text(ck.source.text)
    elif not a.quiet:
        print(ck.source.text)
    print(summary)
    return 0


def cmd_run(a) -> int:
    from codegen import runtime
    spec = load_kernel(a.kernel)
    ck, summary = _compile(spec)
    print(summary)
    if not runtime.gpu_available():
        raise CliError("no compute-capability 9.x GPU here: `cbrules run` needs a Hopper GPU "
                       "(`cbrules compile` works without one)")
    return 0 if _run(spec, ck, a.size or spec.default_size, a.reps) else 1


def cmd_demo(a) -> int:
    from codegen import runtime
    spec = get("exp1d_tma")
    ck, summary = _compile(spec)
    if not a.quiet:
        print(ck.source.text)
    print(summary)
    if not runtime.gpu_available():
        print("no compute-capability 9.x GPU found: compiled for sm_90a, not run")
        return 0
    info = runtime.device_info()
    print(f"running on {info['name']}")
    return 0 if _run(spec, ck, a.size, a.reps) else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cbrules", description="Declarative rules that turn GPU kernels into "
                                "TMA circular-buffered Hopper kernels.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="build, print, compile and (on a Hopper GPU) run the default kernel")
    d.add_argument("--size", type=int, default=1 << 26, help="elements (default 2**26)")
    d.add_argument("--reps", type=int, default=50, help="timed launches (default 50)")
    d.add_argument("--quiet", action="store_true", help="do not print the CUDA source")
    d.set_defaults(fn=cmd_demo)
    sub.add_parser("kernels", help="list the built-in kernels").set_defaults(fn=cmd_kernels)
    lo = sub.add_parser("lower", help="print the lowered kernel as a linear program")
    lo.add_argument("kernel", help="a built-in kernel name or a Python file defining build()")
    lo.set_defaults(fn=cmd_lower)
    c = sub.add_parser("compile", help="print the CUDA source and NVRTC-compile it for sm_90a")
    c.add_argument("kernel", help="a built-in kernel name or a Python file defining build()")
    c.add_argument("--annotate", action="store_true", help="mark each statement with what produced it")
    c.add_argument("-o", "--output", help="write the CUDA source to this file instead of stdout")
    c.add_argument("--quiet", action="store_true", help="print only the resource summary")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="compile, run on the GPU and compare with numpy")
    r.add_argument("kernel", help="a built-in kernel name or a Python file defining build()")
    r.add_argument("--size", type=int, help="problem size (default: the kernel's)")
    r.add_argument("--reps", type=int, default=20, help="timed launches (default 20)")
    r.set_defaults(fn=cmd_run)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the console script."""
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except CliError as e:
        print(f"cbrules: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # named library errors: one line, no traceback
        from codegen.errors import CodegenError
        from .verify import GraphError
        if isinstance(e, (CodegenError, GraphError)):
            print(f"cbrules: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
