"""Compile self-contained CUDA C++ to cubin with NVRTC, with an on-disk cache."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cuda.bindings import nvrtc

from .cache import CubinCache
from .errors import CodegenError, CompileError


@dataclass(frozen=True)
class Resources:
    """Per-kernel resource usage reported by ``ptxas -v``."""

    registers: int
    shared_bytes: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int


@dataclass(frozen=True)
class Cubin:
    """A compiled kernel image and what NVRTC/ptxas said about it."""

    name: str
    cubin: bytes
    log: str
    resources: Resources
    options: tuple[str, ...]
    cached: bool


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the loaded NVRTC library."""
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def _check(err, call: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise CodegenError(f"{call} failed: {text.decode() if isinstance(text, bytes) else text}")


UNKNOWN_RESOURCES = Resources(-1, -1, -1, -1, -1)

# NVRTC (12.9+) reuses cubins from the driver's on-disk compute cache and then skips
# ptxas, leaving no `-v` report in the log; "--no-cache" turns that off. It is left
# out of the key and of Cubin.options, and dropped for NVRTCs that reject it.
_NO_DRIVER_CACHE = ["--no-cache"]


def parse_resources(log: str, entry: str) -> Resources:
    """Extract the ptxas ``-v`` figures of kernel ``entry`` from an NVRTC log.

    Returns UNKNOWN_RESOURCES (all -1) when the log has no ptxas report at all;
    raises CodegenError when ptxas reported other entries but not ``entry``
    (typically a missing ``extern "C"`` or a typo in the name).
    """
    # The log is split into one chunk per "Compiling entry function 'NAME'" header;
    # callees' "Function properties" blocks can live inside a chunk, so the stack and
    # spill line is taken from the block that names the entry itself.
    chunks = re.split(r"^ptxas info\s*: Compiling entry function '([^']+)'.*$", log, flags=re.M)
    bodies = dict(zip(chunks[1::2], chunks[2::2]))
    if not bodies:
        return UNKNOWN_RESOURCES
    if entry not in bodies:
        raise CodegenError(
            f"kernel entry '{entry}' not found in ptxas output (entries: {sorted(bodies)}); "
            "is it declared extern \"C\" __global__?"
        )
    body = bodies[entry]

    def grab(pattern: str, text: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    props = re.search(rf"Function properties for {re.escape(entry)}\s*\n(.*)$", body, flags=re.M)
    props_line = props.group(1) if props else ""
    used = re.search(r"Used \d+ registers.*$", body, flags=re.M)
    used_line = used.group(0) if used else ""
    return Resources(
        registers=grab(r"Used (\d+) registers", used_line),
        shared_bytes=grab(r"(\d+) bytes smem", used_line),
        spill_stores=grab(r"(\d+) bytes spill stores", props_line),
        spill_loads=grab(r"(\d+) bytes spill loads", props_line),
        stack_bytes=grab(r"(\d+) bytes stack frame", props_line),
    )


def _run_nvrtc(source: str, filename: str, options: Sequence[str], ptx: bool = False) -> tuple[object, str, bytes]:
    """One NVRTC run: (result code, log, cubin (or with ``ptx`` the PTX) or b"")."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "nvrtcGetProgramLogSize")
        buf = bytearray(size)
        _check(nvrtc.nvrtcGetProgramLog(prog, buf)[0], "nvrtcGetProgramLog")
        log = bytes(buf).rstrip(b"\0").decode(errors="replace")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return result, log, b""
        get_size, get = (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX) if ptx else \
            (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
        err, size = get_size(prog)
        _check(err, get_size.__name__)
        out = bytearray(size)
        _check(get(prog, out)[0], get.__name__)
        return result, log, bytes(out)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_compile(source: str, filename: str, options: Sequence[str], ptx: bool = False) -> tuple[bytes, str]:
    """Compile; return (cubin or PTX, log) or raise CompileError with the log."""
    result, log, cubin = _run_nvrtc(source, filename, [*options, *_NO_DRIVER_CACHE], ptx)
    if (result == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION and _NO_DRIVER_CACHE
            and _NO_DRIVER_CACHE[0] in log):
        _NO_DRIVER_CACHE.clear()  # an NVRTC older than its driver cache
        result, log, cubin = _run_nvrtc(source, filename, options, ptx)
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(log, source, filename)
    return cubin, log


def default_cache_dir() -> Path:
    """``$CBRULES_CACHE_DIR`` if set, else ``~/.cache/cbrules/nvrtc``."""
    env = os.environ.get("CBRULES_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "cbrules" / "nvrtc"


def compile_cuda(
    source: str,
    entry: str,
    *,
    arch: str = "sm_90a",
    options: Sequence[str] = (),
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
) -> Cubin:
    """Compile ``source`` for ``arch`` and return the cubin of kernel ``entry``.

    ``entry`` must be an ``extern "C"`` kernel; the file name NVRTC sees is
    ``f"{entry}.cu"``. Extra ``options`` follow the defaults
    (``--gpu-architecture``, ``-std=c++17``, ``-Xptxas=-v``). Results are
    cached on disk (see :func:`default_cache_dir` and :mod:`cbrules.codegen.cache`) keyed
    by source, arch, options and NVRTC version; a cache that cannot be used is a
    CacheWarning and a fresh compile. Raises CompileError on compilation failure.
    """
    opts = (f"--gpu-architecture={arch}", "-std=c++17", "-Xptxas=-v", *options)
    filename = f"{entry}.cu"
    # The entry (and so the file name) is not part of the key: the stored log covers
    # every entry of the source, so resources for any of them are parsed on a hit.
    key = hashlib.sha256(
        json.dumps([source, arch, list(opts), list(nvrtc_version())]).encode()
    ).hexdigest()
    cache = CubinCache(cache_dir if cache_dir is not None else default_cache_dir())
    hit = cache.load(key) if use_cache else None
    if hit is not None:
        cubin, log = hit
        return Cubin(entry, cubin, log, parse_resources(log, entry), opts, cached=True)

    cubin, log = _nvrtc_compile(source, filename, opts)
    resources = parse_resources(log, entry)
    if resources == UNKNOWN_RESOURCES:
        warnings.warn(f"no ptxas -v report for '{entry}' in the NVRTC log; resources unknown",
                      stacklevel=2)
    elif use_cache:  # an entry without a ptxas report would stay "unknown" for good
        cache.store(key, cubin, log, nvrtc_version=list(nvrtc_version()))
    return Cubin(entry, cubin, log, resources, opts, cached=False)


def compile_ptx(source: str, entry: str, *, arch: str = "compute_90a", options: Sequence[str] = ()) -> str:
    """The PTX NVRTC makes of ``source`` for the virtual architecture ``arch`` (``cbrules compile --ptx``).

    Not cached: it is read by people, once. Raises CompileError on compilation failure."""
    opts = (f"--gpu-architecture={arch}", "-std=c++17", *options)
    ptx, _ = _nvrtc_compile(source, f"{entry}.cu", opts, ptx=True)
    return ptx.rstrip(b"\0").decode()
