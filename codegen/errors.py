"""Exception types raised by the code generator, the NVRTC wrapper and the runtime."""

from __future__ import annotations

import re
from typing import Any

from ..errors import CbrulesError

# NVRTC reports errors as `name.cu(LINE): error: ...` (also "catastrophic error",
# "fatal error"); warnings use the same shape and are deliberately not matched.
_ERROR_LINE = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?:\w+ )?error\b", re.M)
_CONTEXT = 2


class CodegenError(CbrulesError):
    """Base class of every error raised by :mod:`codegen`."""


class RegisterPoolError(CodegenError):
    """A warp-specialized kernel's ``setmaxnreg`` ask its block's register pool for more registers than
    the block is launched with: its ``setmaxnreg.inc`` would wait forever."""


def _source_excerpt(source_lines: list[str], line: int) -> str:
    """Lines ``line-2 .. line+2`` of the source, numbered, with ``>>`` on ``line``."""
    lo = max(1, line - _CONTEXT)
    hi = min(len(source_lines), line + _CONTEXT)
    width = len(str(hi))
    out = []
    for n in range(lo, hi + 1):
        mark = ">>" if n == line else "  "
        out.append(f"{mark} {n:>{width}} | {source_lines[n - 1]}")
    return "\n".join(out)


class CompileError(CodegenError):
    """NVRTC failed to compile a kernel.

    The message is the NVRTC log followed, for every error line of the log that
    points into ``filename``, by the offending source lines with context.
    """

    # printed as the lines it has (the log and the source excerpts), each escaped (see cbrules.cli_output)
    multiline = True

    def __init__(self, log: str, source: str | None = None, filename: str | None = None):
        self.log = log
        self.source = source
        self.filename = filename
        super().__init__(self._format())

    def _format(self) -> str:
        text = self.log.rstrip() or "NVRTC compilation failed (empty log)"
        if not self.source:
            return text
        lines = self.source.splitlines()
        seen: set[int] = set()
        parts = [text]
        for m in _ERROR_LINE.finditer(self.log):
            if self.filename and m.group("file") != self.filename:
                continue
            line = int(m.group("line"))
            # Several errors on one line would repeat the same excerpt; show it once.
            if line in seen or not 1 <= line <= len(lines):
                continue
            seen.add(line)
            parts.append(f"\n{m.group('file')}:{line}:\n{_source_excerpt(lines, line)}")
        return "\n".join(parts)


def _error_description(result: Any) -> str | None:
    """Ask the driver for the human text of a CUresult; None if the driver is unusable."""
    try:
        from cuda.bindings import driver

        err, text = driver.cuGetErrorString(result)
        if err == driver.CUresult.CUDA_SUCCESS and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # no libcuda, unknown code, ...: the enum name alone must do
        pass
    return None


class CudaError(CodegenError):
    """A CUDA driver call returned an error.

    Attributes: ``call`` (driver function name), ``code`` (CUresult enum name),
    ``value`` (its integer value) and ``description`` (driver text or None).
    """

    def __init__(self, call: str, result: Any):
        self.call = call
        self.value = int(result)
        name = getattr(result, "name", None)
        if name is None:
            try:
                from cuda.bindings import driver

                name = driver.CUresult(self.value).name
            except Exception:
                name = f"CUresult({self.value})"
        self.code = name
        self.description = _error_description(result)
        msg = f"{call} failed: {self.code}"
        if self.description:
            msg += f" ({self.description})"
        super().__init__(msg)


class CacheWarning(RuntimeWarning):
    """The NVRTC cache could not be used (a damaged entry, a folder that cannot be created, read or
    written); the kernel is compiled afresh, so this never stops a compilation."""


class NoGpuError(CodegenError):
    """No usable GPU: the driver library could not be loaded or no device exists."""


# A TMA limit is a fact about the hardware shared with the builder and the interpreter.
from ..ir.limits import TmaLimitError  # noqa: E402,F401
