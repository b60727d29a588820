"""A hostile compile cache (issue 10): a damaged, foreign, unreadable or linked entry, a cache folder
that is a file or unreadable, concurrent writers -- each ends in a CacheWarning and a fresh compile,
never a wrong cubin, a hang or a crash (on the CPU: NVRTC needs no GPU)."""
import errno
import os
import stat
import threading
import warnings
from contextlib import contextmanager

import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.codegen import cache as cache_module
from cbrules.codegen.cache import MAGIC, CubinCache, encode_entry
from cbrules.codegen.errors import CacheWarning
from cbrules.codegen.nvrtc import compile_cuda
from hostile import within


TINY = r"""
extern "C" __global__ void tiny(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * i;
}
"""


@pytest.fixture
def warm(tmp_path):
    """A cache folder holding one good entry; returns (folder, entry path, the good Cubin)."""
    folder = tmp_path / "cache"
    good = compile_cuda(TINY, "tiny", cache_dir=folder)
    (entry,) = folder.iterdir()
    return folder, entry, good


def recompiled(folder, good, match):
    """Compile again: one or more CacheWarnings (the first matching ``match``), a fresh compile."""
    with pytest.warns(CacheWarning) as record:
        c = compile_cuda(TINY, "tiny", cache_dir=folder)
    assert match in str(record[0].message), [str(w.message) for w in record]
    assert not c.cached and c.cubin == good.cubin and c.resources == good.resources
    return c


def _layout(data: bytes) -> dict:
    header = len(MAGIC) + 32 + 4
    meta_len = int.from_bytes(data[header - 4:header], "little")
    return {"magic": 0, "digest": len(MAGIC), "length": header - 1, "log": data.index(b"registers", header),
            "cubin": header + meta_len + 100}


def _alter(data: bytes, at: int) -> bytes:
    """Change one byte, keeping a digit a digit (so a log stays valid JSON and plausible)."""
    b = data[at]
    new = (b - 48 + 1) % 10 + 48 if 48 <= b <= 57 else b ^ 0x01
    return data[:at] + bytes([new]) + data[at + 1:]


@pytest.mark.parametrize("region", ["magic", "digest", "length", "log", "cubin"])
def test_one_byte_changed_in_any_region_is_detected(warm, region):
    folder, entry, good = warm
    data = entry.read_bytes()
    at = _layout(data)[region]
    if region == "log":
        at -= 2  # the register count's last digit: "Used 8 registers" -> "Used 9 registers"
        assert data[at:at + 1].isdigit(), data[at - 10:at + 10]
    entry.write_bytes(_alter(data, at))
    recompiled(folder, good, "damaged NVRTC cache entry")
    assert compile_cuda(TINY, "tiny", cache_dir=folder).cached  # rewritten whole


@pytest.mark.parametrize("damage", [b"", b"CBNV", b"\0" * 4096, b"garbage" * 50, None])
def test_truncated_or_garbage_entry_is_detected(warm, damage):
    folder, entry, good = warm
    entry.write_bytes(entry.read_bytes()[:-1] if damage is None else damage)
    recompiled(folder, good, "damaged NVRTC cache entry")


def test_old_format_entry_is_replaced(warm):
    folder, entry, good = warm
    entry.write_bytes(b"CBNVRTC1" + entry.read_bytes()[8:])
    recompiled(folder, good, "not a CBNVRTC2 entry")


@contextmanager
def denied(monkeypatch, folder, *, reading=False):
    """What a read-only folder (or, ``reading=True``, a folder of mode 000) does to this process,
    for root, whom chmod does not stop: creating, replacing and deleting inside it (and, with
    ``reading``, opening anything in it) fail with EACCES."""
    top = os.path.realpath(folder)

    def inside(path):
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        real_path = os.path.realpath(os.fsdecode(path))
        return real_path == top or real_path.startswith(top + os.sep)

    def refuse(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))

    real = {n: getattr(os, n) for n in ("open", "unlink", "replace", "mkdir", "rename")}

    def guarded(name, writes):
        def call(path, *args, **kwargs):
            flags = args[0] if name == "open" and args else 0
            if inside(path) and (reading or writes or flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR)):
                refuse(path)
            return real[name](path, *args, **kwargs)
        return call
    for name in real:
        monkeypatch.setattr(os, name, guarded(name, writes=name != "open"))
    try:
        yield
    finally:
        for name, fn in real.items():
            monkeypatch.setattr(os, name, fn)


def test_corrupt_entry_in_read_only_folder_is_a_warning_every_time(warm, monkeypatch):
    folder, entry, good = warm
    entry.write_bytes(entry.read_bytes()[:-7])
    damaged = entry.read_bytes()
    with denied(monkeypatch, folder):
        for _ in range(2):  # and again on the next run: never a PermissionError
            recompiled(folder, good, "cannot be deleted (Permission denied)")
    assert entry.read_bytes() == damaged and list(folder.iterdir()) == [entry]


def test_mode_000_folder_is_a_warning(warm, monkeypatch):
    folder, entry, good = warm
    with denied(monkeypatch, folder, reading=True):
        with pytest.warns(CacheWarning) as record:
            c = compile_cuda(TINY, "tiny", cache_dir=folder)
    messages = [str(w.message) for w in record]
    assert not c.cached and c.cubin == good.cubin
    assert "cannot read NVRTC cache entry" in messages[0] and "cannot create" in messages[1], messages


needs_non_root = pytest.mark.skipif(os.geteuid() == 0, reason="chmod does not stop root")


@needs_non_root
def test_real_read_only_folder(warm):
    folder, entry, good = warm
    entry.write_bytes(b"garbage")
    folder.chmod(0o555)
    try:
        recompiled(folder, good, "cannot be deleted")
        recompiled(folder, good, "cannot be deleted")
    finally:
        folder.chmod(0o755)


@needs_non_root
def test_real_mode_000_folder(warm):
    folder, entry, good = warm
    folder.chmod(0)
    try:
        recompiled(folder, good, "cannot read NVRTC cache entry")
    finally:
        folder.chmod(0o755)
    assert entry.exists()


@pytest.mark.parametrize("below", [(), ("sub",)])
def test_cache_dir_that_is_a_file(tmp_path, monkeypatch, below):
    """CBRULES_CACHE_DIR naming a file (or a folder under one): one warning, a fresh compile."""
    afile = tmp_path / "not-a-folder"
    afile.write_text("keep me")
    monkeypatch.setenv("CBRULES_CACHE_DIR", str(afile.joinpath(*below)))
    with pytest.warns(CacheWarning) as record:
        assert not compile_cuda(TINY, "tiny").cached
    assert [str(w.message).split(" (")[1] for w in record] == [
        "a file is in the way of the folder); not cached: point CBRULES_CACHE_DIR at a writable folder"]
    assert afile.read_text() == "keep me"


def test_entry_that_links_outside_the_folder_is_not_followed(warm, tmp_path):
    folder, entry, good = warm
    outside = tmp_path / "outside.cubin"
    entry.rename(outside)  # a valid entry, but not in the folder: it must not be read
    entry.symlink_to(outside)
    recompiled(folder, good, "a symbolic link, not an entry")
    assert not entry.is_symlink() and outside.read_bytes()  # the link was replaced, its target kept
    assert compile_cuda(TINY, "tiny", cache_dir=folder).cached


def test_fifo_or_folder_at_the_entry_path_neither_hangs_nor_raises(warm):
    folder, entry, good = warm
    entry.unlink()
    os.mkfifo(entry)
    with within(30):
        recompiled(folder, good, "not a regular file")
    assert stat.S_ISREG(entry.stat().st_mode)  # deleted, then written
    entry.unlink()
    entry.mkdir()
    with within(30):
        recompiled(folder, good, "cannot be deleted")
    assert entry.is_dir()


def test_keys_are_digests_never_paths(tmp_path):
    cache = CubinCache(tmp_path)
    for key in ("../../etc/passwd", "/etc/passwd", "a" * 63, "A" * 64, "a" * 64 + "\n", "a" * 64 + "/x"):
        with pytest.raises(ValueError, match="not a hex SHA-256"):
            cache.path(key)
    assert cache.path("0" * 64) == tmp_path / f"{'0' * 64}.cubin"


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path, monkeypatch):
    """Writers of different sizes race readers: a reader sees the old entry, none, or a new one."""
    problems = []
    monkeypatch.setattr(cache_module, "_warn", problems.append)
    cache, key = CubinCache(tmp_path), "ab" * 32
    payloads = [bytes([i]) * ((i + 1) << 20) for i in range(4)]  # 1..4 MiB
    stop = threading.Event()

    def write(payload):
        for _ in range(15):
            cache.store(key, payload, f"log {len(payload)}")

    def read(seen):
        while not stop.is_set():
            hit = cache.load(key)
            if hit is not None:
                seen.append(hit[0] in payloads and hit[1] == f"log {len(hit[0])}")

    seen: list = []
    readers = [threading.Thread(target=read, args=(seen,)) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert problems == [] and seen and all(seen)
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.cubin"]  # no temporary files left


def test_entry_round_trip_and_metadata():
    data = encode_entry("cd" * 32, b"\x7fELF...", "ptxas info", nvrtc_version=[13, 0])
    assert data.startswith(MAGIC)
    assert cache_module.decode_entry(data, "cd" * 32) == (b"\x7fELF...", "ptxas info")
    with pytest.raises(cache_module._Damaged, match="metadata does not match"):
        cache_module.decode_entry(data, "ef" * 32)  # a whole entry stored under another key


def test_api_compile_survives_a_damaged_cache(tmp_path):
    """The whole pipeline: a damaged entry of a generated kernel is a warning, then a fresh compile."""
    kernel = KERNELS["multi_dim"].build(stages=2)
    first = api.compile(kernel, cache_dir=str(tmp_path))
    (entry,) = tmp_path.iterdir()
    data = entry.read_bytes()
    entry.write_bytes(_alter(data, _layout(data)["log"] - 2))
    with pytest.warns(CacheWarning, match="checksum mismatch"):
        again = api.compile(kernel, cache_dir=str(tmp_path))
    assert not again.cubin.cached and again.cubin.cubin == first.cubin.cubin
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert api.compile(kernel, cache_dir=str(tmp_path)).cubin.cached


def test_a_forged_entry_is_what_the_checksum_does_not_catch_so_the_folder_must_be_trusted(warm):
    """Issue 28: a forged entry with a matching SHA-256 passes the checksum (it protects against
    damage, not forgery: see cbrules.codegen.cache); so a cache folder every user may write, or
    another user's, is not used at all -- neither read nor written."""
    folder, entry, good = warm
    forged = encode_entry(entry.name[:-len(".cubin")], b"\x7fELF forged", "forged log")
    entry.write_bytes(forged)
    assert compile_cuda(TINY, "tiny", cache_dir=folder).cubin == b"\x7fELF forged"  # what the hash cannot tell
    os.chmod(folder, 0o777)
    try:
        with pytest.warns(CacheWarning, match="writable by every user .* not used"):
            c = compile_cuda(TINY, "tiny", cache_dir=folder)
        assert not c.cached and c.cubin == good.cubin
        assert entry.read_bytes() == forged  # nor written: the folder is left as it was
        assert CubinCache(folder).untrusted() == "writable by every user (mode 777)"
    finally:
        os.chmod(folder, 0o755)
    assert CubinCache(folder).untrusted() is None and CubinCache(folder / "not-yet").untrusted() is None


def test_a_cache_folder_of_another_user_is_not_used(warm, monkeypatch):
    folder, _, good = warm
    monkeypatch.setattr(os, "getuid", lambda: os.stat(folder).st_uid + 1)
    with pytest.warns(CacheWarning, match="owned by user id"):
        assert compile_cuda(TINY, "tiny", cache_dir=folder).cubin == good.cubin


def test_a_new_cache_folder_is_its_owners_alone(tmp_path):
    compile_cuda(TINY, "tiny", cache_dir=tmp_path / "fresh")
    assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) & 0o077 == 0
