"""NVRTC compilation, ptxas resource parsing and the on-disk cubin cache (CPU only)."""

import os
import warnings

import pytest

from cbrules.codegen import nvrtc as nvrtc_module
from cbrules.codegen.cache import MAGIC
from cbrules.codegen.errors import CacheWarning, CodegenError, CompileError
from cbrules.codegen.nvrtc import (UNKNOWN_RESOURCES, Cubin, Resources, compile_cuda, nvrtc_version,
                           parse_resources)

TINY = r"""
extern "C" __global__ void tiny(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * i;
}
"""

BROKEN = r"""extern "C" __global__ void broken(float* out) {
    int i = threadIdx.x;
    out[i] = undefined_symbol_xyz * 2.0f;
    out[0] = 1.0f;
}
"""


def test_nvrtc_version():
    from cuda.bindings import nvrtc
    major, minor = nvrtc_version()
    _, want_major, want_minor = nvrtc.nvrtcVersion()  # what the library itself says
    # sm_90a (wgmma, setmaxnreg) needs NVRTC 12.0 or later
    assert (major, minor) == (want_major, want_minor) and (major, minor) >= (12, 0)


def test_compile_tiny(tmp_path):
    c = compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    assert isinstance(c, Cubin)
    assert c.name == "tiny"
    assert c.cubin.startswith(b"\x7fELF")
    assert c.resources.registers > 0
    assert c.resources.spill_stores == 0 and c.resources.spill_loads == 0
    assert "--gpu-architecture=sm_90a" in c.options and "-Xptxas=-v" in c.options
    assert "--use_fast_math" not in c.options
    assert not c.cached


def test_compile_error_shows_source_line(tmp_path):
    with pytest.raises(CompileError) as info:
        compile_cuda(BROKEN, "broken", cache_dir=tmp_path)
    msg = str(info.value)
    assert "broken.cu(3)" in msg  # the NVRTC log itself
    assert "undefined_symbol_xyz" in msg
    marked = [line for line in msg.splitlines() if line.startswith(">>")]
    assert marked == [">> 3 |     out[i] = undefined_symbol_xyz * 2.0f;"]
    assert "  2 |     int i = threadIdx.x;" in msg  # context before
    assert "  5 | }" in msg  # context after
    assert list(tmp_path.iterdir()) == []  # failures are not cached


def test_compile_error_format_unit():
    src = "a\nb\nc\nd\ne\nf\n"
    err = CompileError("k.cu(1): error: x\nk.cu(6): catastrophic error: y\nk.cu(4): warning: z",
                       src, "k.cu")
    msg = str(err)
    assert ">> 1 | a" in msg and "   2 | b" in msg and "   3 | c" in msg
    assert ">> 6 | f" in msg and "   4 | d" in msg
    assert ">> 4" not in msg  # warnings get no excerpt
    assert err.log.startswith("k.cu(1)")


def test_missing_entry_is_reported(tmp_path):
    with pytest.raises(CodegenError, match="not_there"):
        compile_cuda(TINY, "not_there", cache_dir=tmp_path)


def test_parse_resources_picks_named_entry():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_90a'
ptxas info    : Function properties for helper
ptxas         .     99 bytes stack frame, 99 bytes spill stores, 99 bytes spill loads
ptxas info    : Function properties for a
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'b' for 'sm_90a'
ptxas info    : Function properties for b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
"""
    assert parse_resources(log, "a") == Resources(40, 2048, 8, 4, 16)
    assert parse_resources(log, "b") == Resources(8, 0, 0, 0, 0)


def test_shared_memory_is_parsed(tmp_path):
    src = r"""extern "C" __global__ void smem(float* a) {
        __shared__ float s[256];
        s[threadIdx.x] = a[threadIdx.x];
        __syncthreads();
        a[threadIdx.x] = s[255 - threadIdx.x];
    }"""
    assert compile_cuda(src, "smem", cache_dir=tmp_path).resources.shared_bytes == 1024


def test_cache_hit(tmp_path):
    first = compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    second = compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    assert not first.cached and second.cached
    assert second.cubin == first.cubin
    assert second.resources == first.resources
    assert second.options == first.options
    assert len(list(tmp_path.iterdir())) == 1
    # Different options are a different entry.
    third = compile_cuda(TINY, "tiny", cache_dir=tmp_path, options=["-lineinfo"])
    assert not third.cached and len(list(tmp_path.iterdir())) == 2


def test_cache_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("CBRULES_CACHE_DIR", str(tmp_path / "envcache"))
    assert not compile_cuda(TINY, "tiny").cached
    assert compile_cuda(TINY, "tiny").cached
    assert len(list((tmp_path / "envcache").iterdir())) == 1


def test_use_cache_false(tmp_path):
    compile_cuda(TINY, "tiny", cache_dir=tmp_path, use_cache=False)
    assert list(tmp_path.iterdir()) == []
    compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    assert not compile_cuda(TINY, "tiny", cache_dir=tmp_path, use_cache=False).cached


def _flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]


HEADER = len(MAGIC) + 32 + 4  # magic, sha256, metadata length


def _garble_metadata(data: bytes) -> bytes:
    meta_len = int.from_bytes(data[HEADER - 4:HEADER], "little")
    return data[:HEADER] + b"\xff" * meta_len + data[HEADER + meta_len:]


CORRUPTIONS = {
    "empty": lambda d: b"",
    "truncated_header": lambda d: d[:5],
    "truncated_half": lambda d: d[: len(d) // 2],
    "truncated_tail": lambda d: d[:-1],
    "flip_magic": lambda d: _flip(d, 0),
    "flip_digest": lambda d: _flip(d, len(MAGIC) + 5),
    "flip_length": lambda d: _flip(d, HEADER - 1),
    "flip_json": lambda d: _flip(d, HEADER + 2),
    "flip_payload": lambda d: _flip(d, len(d) - 1),
    "garbage": lambda d: os.urandom(len(d)),
    "bad_json": lambda d: _garble_metadata(d),
    "appended": lambda d: d + b"extra",
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupt_cache_is_rebuilt(tmp_path, how):
    good = compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(CORRUPTIONS[how](entry.read_bytes()))
    with pytest.warns(CacheWarning, match=str(entry.name)):
        rebuilt = compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    assert not rebuilt.cached
    assert rebuilt.cubin == good.cubin
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    assert again.cached and again.cubin == good.cubin
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # no temp files left


def test_no_ptxas_report_means_unknown():
    assert parse_resources("", "k") == UNKNOWN_RESOURCES
    assert parse_resources("\0", "k").registers == -1


def test_unknown_no_cache_option_is_dropped(tmp_path, monkeypatch):
    # Stands in for an NVRTC that predates "--no-cache": the option is retried without.
    monkeypatch.setattr(nvrtc_module, "_NO_DRIVER_CACHE", ["--not-an-nvrtc-option"])
    c = compile_cuda(TINY, "tiny", cache_dir=tmp_path)
    assert c.resources.registers > 0 and nvrtc_module._NO_DRIVER_CACHE == []
