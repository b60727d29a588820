"""Kernel files for the command line: a built-in kernel by name, or a Python file that defines
``build()`` (and optionally ``inputs(shape, rng)``, ``reference(inputs)``, ``OUTPUTS``, ``SHAPE``,
``TOLERANCE``, ``DTYPES`` (the tensor types it is built for, the first the default) and
``shape_for_trips(trips)``). The file is the user's own code: whatever it raises,
at import or in ``build()``, ``inputs()`` or ``reference()`` -- ``sys.exit()`` and other
``BaseException`` subclasses included, Ctrl-C aside -- becomes a :class:`CliError` naming the file, the line
and the exception. Importing it and calling ``build()`` each have a time bound
(:data:`TIMEOUT_VAR`, default :data:`DEFAULT_TIMEOUT_S` seconds): past it, a
:class:`KernelFileTimeout`. A path that is not a regular file (a FIFO, a device) is refused unopened.

The command line's options (``--stages``, ``--prefetch``, ``--war``, ``--warp-specialize``,
``--registers``, ``--shape``, ``--dtype``, ``--tma-store``, ``--swizzle``) reach ``build()`` as the
keywords of :data:`BUILD_OPTIONS` when it takes them (by name, or ``**options``); an option given
that ``build()`` does not take is a :class:`CliError` naming it and the parameter to add.
"""
from __future__ import annotations

import functools
import math
import os
import runpy
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .errors import CliError
from .ir import option_schema
from .userio import check_readable, printable

if TYPE_CHECKING:
    from .kernels.specs import KernelSpec

# build() keyword <- the command-line option that gives it
# (the circular-buffer options' flags from the options schema, rules/options.rules)
BUILD_OPTIONS = {**option_schema.flags(), "shape": "--shape", "dtype": "--dtype", "tma_store": "--tma-store",
                 "swizzle": "--swizzle"}


@functools.lru_cache(maxsize=None)
def _kernel_file_type() -> type:
    """The KernelSpec of a kernel file (made on first use: the light commands import no kernels)."""
    from .kernels.specs import KernelSpec

    @dataclass(frozen=True)
    class KernelFile(KernelSpec):
        """A kernel file's specification: ``takes`` the :data:`BUILD_OPTIONS` its ``build()`` accepts."""

        path: str = ""
        takes: frozenset = frozenset()
    return KernelFile


def refuse_untaken(spec: KernelSpec, given: dict) -> None:
    """For a kernel file: a :class:`CliError` for the first option given (not None/False) that its
    ``build()`` does not take. Built-in kernels are not judged here."""
    takes = getattr(spec, "takes", None)
    if takes is None:
        return
    for key, value in given.items():
        if value not in (None, False, "none") and key not in takes:
            raise CliError(f"{spec.path}: build() takes no {key!r} parameter, so {BUILD_OPTIONS[key]} would be "
                           f"ignored; drop {BUILD_OPTIONS[key]}, or add {key}=None to build()'s parameters (or "
                           "**options) and use it")


def load_kernel(ref: str) -> KernelSpec:
    """A built-in kernel by name, or a Python file defining ``build()`` (and optionally
    ``inputs(shape, rng)``, ``reference(inputs)``, ``OUTPUTS`` and ``SHAPE``).

    A kernel file that fails (a syntax error, any exception while it runs or builds, no ``build``)
    is a :class:`CliError` naming the file, the line and the exception."""
    from .ir.ops import HALF_DTYPES, STORAGE_DTYPES
    from .kernels import get
    if ref.endswith(".py") or Path(ref).is_file():
        path = Path(ref)
        try:  # judged before runpy opens it: a FIFO or device would block the import for ever
            check_readable(path, "a kernel file is a Python file")
        except FileNotFoundError:
            raise CliError(f"no such kernel file: {printable(ref)}") from None
        except OSError as e:
            raise CliError(f"cannot read kernel file {printable(ref)}: {e.strerror or e}") from None
        ns = _bounded(path, "running", _guarded(path, "running", runpy.run_path))(str(path))
        build = ns.get("build")
        if not callable(build):
            raise CliError(f"{ref}: a kernel file must define build() returning a cbrules Kernel")
        try:
            shape = tuple(int(x) for x in ns.get("SHAPE", (1 << 20,)))
            outputs = tuple(str(x) for x in ns.get("OUTPUTS", ()))
        except (TypeError, ValueError, OverflowError) as e:
            raise CliError(f"{ref}: SHAPE must be a tuple of integers and OUTPUTS a tuple of tensor names ({e})")
        tolerance = _tolerance(ref, ns.get("TOLERANCE", (1e-5, 1e-6)))
        dtypes = ns.get("DTYPES", ("float32", *HALF_DTYPES))
        if not isinstance(dtypes, (tuple, list)) or not dtypes or \
                any(d not in ("float32", *STORAGE_DTYPES) for d in dtypes):
            raise CliError(f"{ref}: DTYPES must be a tuple of tensor types from float32, {', '.join(STORAGE_DTYPES)} "
                           f"(the first is the default), got {dtypes!r}")
        inputs, reference, trips_shape = ns.get("inputs"), ns.get("reference"), ns.get("shape_for_trips")
        takes = _takes(build)
        return _kernel_file_type()(path.stem, str(ns.get("__doc__") or ""), _built(path, build),
                          _guarded(path, "calling inputs() of", inputs) if callable(inputs) else None,
                          _guarded(path, "calling reference() of", reference) if callable(reference) else None,
                          outputs, shape, tolerance=lambda s: tolerance,
                          build_params=(lambda s: {"shape": s}) if "shape" in takes else (lambda s: {}),
                          pipelined=bool(takes & set(option_schema.flags())),
                          dtypes=tuple(dtypes), tile_output=True, swizzles=True,
                          shape_for_trips=(_guarded(path, "calling shape_for_trips() of", trips_shape)
                                           if callable(trips_shape) else None),
                          path=ref, takes=takes)
    try:
        return get(ref)
    except KeyError as e:
        raise CliError(str(e)) from None


def _guarded(path: Path, doing: str, fn: Callable) -> Callable:
    """``fn`` with anything it raises turned into a CliError naming the kernel file and line: any
    exception, ``sys.exit()``, a ``BaseException`` subclass, ``GeneratorExit`` -- all but Ctrl-C
    (KeyboardInterrupt, exit 130) and the time bound's own alarm."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, _Expired):
            raise
        except SyntaxError as e:
            where = f"{e.filename or path}:{e.lineno or '?'}"
            raise CliError(f"{where}: syntax error in kernel file: {e.msg}") from None
        except SystemExit as e:  # the file is not the command: it may not end it
            raise CliError(f"{_where(e, path)}: the kernel file {path} called sys.exit({_text(repr(e.code))}) while "
                           f"{doing} it; a kernel file defines build() and returns, it does not exit") from None
        except BaseException as e:  # the user's code: whatever it raises is the user's error
            raise CliError(f"{_where(e, path)}: {type(e).__name__} while {doing} kernel file {path}: "
                           f"{_text(e)}") from None
    return call


def _text(e: object) -> str:
    """An exception's text as an error shows it (an object whose str() fails is shown by its type)."""
    try:
        return str(e)[:2000]
    except Exception:  # noqa: BLE001 - the user's __str__
        return f"<{type(e).__name__} that cannot be shown>"


# how long importing a kernel file or calling its build() may take: a file that loops for ever must
# end in a named error, not look like a slow compile
TIMEOUT_VAR = "CBRULES_KERNEL_FILE_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0


class KernelFileTimeout(CliError):
    """A kernel file's import or ``build()`` ran past the time bound (:data:`TIMEOUT_VAR`)."""


class _Expired(BaseException):
    """The time bound's alarm: a BaseException, so that the file's own ``except Exception`` does not
    swallow it."""


def timeout_s() -> float:
    """The time bound in seconds from :data:`TIMEOUT_VAR` (default :data:`DEFAULT_TIMEOUT_S`; 0: none)."""
    text = os.environ.get(TIMEOUT_VAR, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError
    except ValueError:
        raise CliError(f"{TIMEOUT_VAR}={printable(text)[:40]} is not a number of seconds >= 0 (0: no bound)") \
            from None
    return value


def _bounded(path: Path, doing: str, fn: Callable) -> Callable:
    """``fn`` under the time bound: past :func:`timeout_s` seconds a :class:`KernelFileTimeout`.

    A POSIX interval timer (SIGALRM), not a child process: the file's namespace and the Kernel that
    build() returns are Python objects the caller uses, which a child could only hand back pickled
    (a kernel file's functions do not pickle). The alarm interrupts Python code anywhere (a loop,
    ``time.sleep``); a single C call that never returns to the interpreter (one huge integer power)
    is not interrupted, and outside the main thread (where Python cannot take signals), or where
    SIGALRM has a handler that is not Python's, no bound applies. An alarm already set by the caller
    keeps its own time: it rings as it would have, and is set again, less the time spent, afterwards."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        limit = timeout_s()
        if not limit or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGALRM) is None:  # None: a handler not Python's, left alone
            return fn(*args, **kwargs)
        start = time.monotonic()
        outer_handler = signal.getsignal(signal.SIGALRM)
        outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)

        def ring(signum, frame):
            if time.monotonic() - start >= limit * 0.999 or not callable(outer_handler):
                raise _Expired()
            outer_handler(signum, frame)  # the caller's alarm came first: it is the caller's

        signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, min(limit, outer_left) if outer_left else limit)
        try:
            return fn(*args, **kwargs)
        except _Expired:
            raise KernelFileTimeout(f"{path}: {doing} the kernel file took more than {limit:g} s (a loop that never "
                                    f"ends?); stopped. Make it quicker, or set {TIMEOUT_VAR} (seconds; 0: no bound; "
                                    f"default {DEFAULT_TIMEOUT_S:g})") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, outer_handler)
            if outer_left:
                signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 1e-3),
                                 outer_interval)
    return call


def _takes(build: Callable) -> frozenset:
    """The :data:`BUILD_OPTIONS` a kernel file's build() takes as keywords (all of them with ``**options``)."""
    import inspect
    try:
        params = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return frozenset(BUILD_OPTIONS)
    return frozenset(p.name for p in params if p.name in BUILD_OPTIONS
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _tolerance(ref: str, value) -> tuple[float, float]:
    """A kernel file's ``TOLERANCE``: (rtol, atol), two non-negative numbers."""
    try:
        rtol, atol = (float(x) for x in value)
        if not (rtol >= 0 and atol >= 0):
            raise ValueError("negative or NaN")
    except (TypeError, ValueError, OverflowError) as e:
        raise CliError(f"{ref}: TOLERANCE must be (rtol, atol), two non-negative numbers, got {value!r} ({e})") \
            from None
    return rtol, atol


def _built(path: Path, build: Callable) -> Callable:
    from .ir.builder import Kernel

    def factory(**options):
        k = _bounded(path, "calling build() of", _guarded(path, "calling build() of", build))(**options)
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
