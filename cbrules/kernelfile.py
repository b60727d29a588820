"""Kernel files for the command line: a built-in kernel by name, or a Python file that defines
``build()`` (and optionally ``inputs``, ``reference``, ``OUTPUTS``, ``SHAPE``). The file is the user's
own code: whatever it raises, at import or in ``build()``, ``inputs()`` or ``reference()``, becomes a
:class:`CliError` naming the file, the line and the exception.
"""
from __future__ import annotations

import functools
import os
import runpy
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .errors import CliError

if TYPE_CHECKING:
    from .kernels.specs import KernelSpec


def load_kernel(ref: str) -> KernelSpec:
    """A built-in kernel by name, or a Python file defining ``build()`` (and optionally
    ``inputs(shape, rng)``, ``reference(inputs)``, ``OUTPUTS`` and ``SHAPE``).

    A kernel file that fails (a syntax error, any exception while it runs or builds, no ``build``)
    is a :class:`CliError` naming the file, the line and the exception."""
    from .kernels import KernelSpec, get
    if ref.endswith(".py") or Path(ref).is_file():
        path = Path(ref)
        if not path.is_file():
            raise CliError(f"no such kernel file: {ref}")
        ns = _guarded(path, "running", runpy.run_path)(str(path))
        build = ns.get("build")
        if not callable(build):
            raise CliError(f"{ref}: a kernel file must define build() returning a cbrules Kernel")
        try:
            shape = tuple(int(x) for x in ns.get("SHAPE", (1 << 20,)))
            outputs = tuple(str(x) for x in ns.get("OUTPUTS", ()))
        except (TypeError, ValueError) as e:
            raise CliError(f"{ref}: SHAPE must be a tuple of integers and OUTPUTS a tuple of tensor names ({e})")
        inputs, reference = ns.get("inputs"), ns.get("reference")
        return KernelSpec(path.stem, str(ns.get("__doc__") or ""), _built(path, build),
                          _guarded(path, "calling inputs() of", inputs) if callable(inputs) else None,
                          _guarded(path, "calling reference() of", reference) if callable(reference) else None,
                          outputs, shape, pipelined=_takes_options(build), dtypes=("float32",))
    try:
        return get(ref)
    except KeyError as e:
        raise CliError(str(e)) from None


def _guarded(path: Path, doing: str, fn: Callable) -> Callable:
    """``fn`` with any exception it raises turned into a CliError naming the kernel file and line."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SyntaxError as e:
            where = f"{e.filename or path}:{e.lineno or '?'}"
            raise CliError(f"{where}: syntax error in kernel file: {e.msg}") from None
        except Exception as e:  # the user's code: whatever it raises is the user's error
            raise CliError(f"{_where(e, path)}: {type(e).__name__} while {doing} kernel file {path}: {e}") from None
    return call


def _takes_options(build: Callable) -> bool:
    """Whether a kernel file's build() takes the circular-buffer options (as keywords)."""
    import inspect
    try:
        params = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_KEYWORD or p.name == "stages" for p in params)


def _built(path: Path, build: Callable) -> Callable:
    from .ir.builder import Kernel

    def factory(**options):
        k = _guarded(path, "calling build() of", build)(**options)
        if not isinstance(k, Kernel):
            raise CliError(f"{path}: build() returned {type(k).__name__}, not a cbrules Kernel")
        return k
    return factory


def _where(e: BaseException, path: Path) -> str:
    """``file:line`` of the innermost traceback frame in the kernel file (else the file itself)."""
    target = os.path.realpath(path)
    line = None
    for frame in traceback.extract_tb(e.__traceback__):
        if os.path.realpath(frame.filename) == target:
            line = frame.lineno
    return f"{path}:{line}" if line is not None else str(path)
