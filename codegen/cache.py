"""The on-disk cubin cache of :mod:`cbrules.codegen.nvrtc`: one file per compile key in one folder.

An entry is ``MAGIC | SHA-256 | u32 metadata length | JSON metadata (key, log, ...) | cubin``; the
SHA-256 covers every byte after it and the magic is compared exactly, so any damage to the header,
the log or the cubin is detected. Entries are written to a temporary file and renamed into place,
so concurrent writers and readers see a whole entry or none.

The cache is a convenience: a damaged entry, a folder that cannot be created, read or written, or a
path that is not a plain file is a :class:`cbrules.codegen.errors.CacheWarning` and the caller compiles
afresh; nothing here raises. Only ``<folder>/<64 hex digits>.cubin`` and temporary files beside it
are ever touched: keys are checked, links are not followed and only regular files are read.

What the SHA-256 protects against, and what not: it is a checksum, not a signature. It detects an
entry that is damaged (truncated, altered by a disk or a crash, written by another version, not a
cache entry at all); it cannot detect a forged entry, since whoever can write the folder can compute
it too. Keying it with a secret (an HMAC) would not help either: the secret would have to sit where
the same user's processes read it, and an attacker with that user's rights can as well edit the
installed cbrules. So the folder must be as trusted as the code itself, and that is checked: a cache
folder that another user owns, or that every user may write (a shared ``/tmp`` folder, ``chmod
o+w``), is not used at all -- a :class:`CacheWarning`, and every kernel is compiled afresh.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import warnings
from pathlib import Path
from typing import Optional

from .errors import CacheWarning

# Bump the trailing digit whenever the layout or the metadata schema changes.
MAGIC = b"CBNVRTC2"
_HEADER = struct.Struct("<8s32sI")  # magic, sha256 of the rest, metadata length
_ENTRY_MAX = 1 << 28  # no cubin comes near 256 MiB: a bigger "entry" is not one of ours
_KEY = re.compile(r"[0-9a-f]{64}\Z")


class _Damaged(Exception):
    """An entry that exists but is not a valid entry for its key."""


def _warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=4)  # _warn < Cache method < compile_cuda < caller


def read_regular_file(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file (not a link, FIFO, device or folder)."""
    try:  # O_NONBLOCK: opening a FIFO planted at the path must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _Damaged("a symbolic link, not an entry") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Damaged("not a regular file")
        if info.st_size > _ENTRY_MAX:
            raise _Damaged(f"{info.st_size} bytes, more than any entry")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(_ENTRY_MAX + 1)
    finally:
        os.close(fd)


def untrusted_folder(folder: Path) -> Optional[str]:
    """Why ``folder`` cannot be trusted with what cbrules reads back (owned by another user, or writable
    by every user), or None (also when it does not exist yet)."""
    try:
        info = os.stat(folder)
    except OSError:
        return None
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"owned by user id {info.st_uid}, not by this user ({os.getuid()})"
    if stat.S_IMODE(info.st_mode) & 0o002:  # group-writable is left alone: umask 002 with a private group
        return f"writable by every user (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def encode_entry(key: str, cubin: bytes, log: str, **meta) -> bytes:
    """The bytes of a cache entry for ``key``."""
    body = json.dumps({"key": key, "cubin_len": len(cubin), "log": log, **meta}).encode()
    rest = struct.pack("<I", len(body)) + body + cubin
    return MAGIC + hashlib.sha256(rest).digest() + rest


def decode_entry(data: bytes, key: str) -> tuple[bytes, str]:
    """(cubin, log) of an entry for ``key``; raises _Damaged naming what is wrong."""
    if len(data) < _HEADER.size:
        raise _Damaged(f"truncated header ({len(data)} bytes)")
    magic, digest, meta_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise _Damaged(f"not a {MAGIC.decode()} entry (magic {magic!r}; another cbrules version or not ours)")
    if hashlib.sha256(data[len(MAGIC) + len(digest):]).digest() != digest:
        raise _Damaged("checksum mismatch (truncated or altered)")
    end = _HEADER.size + meta_len
    try:
        meta = json.loads(data[_HEADER.size:end].decode())
        cubin, log = data[end:], meta["log"]
        ok = meta["key"] == key and meta["cubin_len"] == len(cubin) and isinstance(log, str)
    except (ValueError, KeyError, TypeError) as e:  # UnicodeDecodeError is a ValueError
        raise _Damaged(f"bad metadata ({type(e).__name__}: {e})") from None
    if not ok:
        raise _Damaged("metadata does not match the entry (key, length or log)")
    return cubin, log


class CubinCache:
    """The entries of one cache folder (which need not exist yet)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)

    def untrusted(self) -> Optional[str]:
        """Why the folder cannot be trusted with cubins (owned by another user, or writable by others),
        or None (also when it does not exist yet: :meth:`store` creates it, mode 0700 below umask)."""
        return untrusted_folder(self.folder)

    def _refused(self) -> bool:
        why = self.untrusted()
        if why:
            _warn(f"NVRTC cache folder {self.folder} is {why}: anyone who can write it could plant a cubin that "
                  "passes the checksum, so it is not used; compiling afresh. Point CBRULES_CACHE_DIR at a folder "
                  "only you can write (chmod o-w)")
        return why is not None

    def path(self, key: str) -> Path:
        """Where the entry for ``key`` (a lowercase hex SHA-256) lives."""
        if not _KEY.match(key):  # a key is never a path: nothing outside the folder is named
            raise ValueError(f"cache key {key!r} is not a hex SHA-256 digest")
        return self.folder / f"{key}.cubin"

    def load(self, key: str) -> Optional[tuple[bytes, str]]:
        """(cubin, log) stored for ``key``, or None (missing, unreadable or damaged: warned)."""
        path = self.path(key)
        if self._refused():
            return None
        try:
            return decode_entry(read_regular_file(path), key)
        except (FileNotFoundError, NotADirectoryError):  # no entry, or no folder: store() says why
            return None
        except OSError as e:
            _warn(f"cannot read NVRTC cache entry {path} ({e.strerror or e}); compiling afresh")
            return None
        except _Damaged as e:
            damage = str(e)
        try:
            path.unlink()
            _warn(f"damaged NVRTC cache entry {path} ({damage}); deleted it, compiling afresh")
        except FileNotFoundError:  # another process got there first
            _warn(f"damaged NVRTC cache entry {path} ({damage}); compiling afresh")
        except OSError as e:
            _warn(f"damaged NVRTC cache entry {path} ({damage}) cannot be deleted ({e.strerror or e}); "
                  f"compiling afresh: remove it or point CBRULES_CACHE_DIR at a writable folder")
        return None

    def store(self, key: str, cubin: bytes, log: str, **meta) -> None:
        """Store an entry atomically; a folder that cannot be written is a warning."""
        path = self.path(key)
        data = encode_entry(key, cubin, log, **meta)
        if self._refused():
            return
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
        except OSError as e:
            why = ("a file is in the way of the folder" if isinstance(e, (FileExistsError, NotADirectoryError))
                   else e.strerror or str(e))
            _warn(f"cannot create NVRTC cache entry {path} ({why}); not cached: point "
                  "CBRULES_CACHE_DIR at a writable folder")
            return
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # atomic: readers see the old entry, or none, or this one
        except BaseException as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if not isinstance(e, OSError):
                raise
            _warn(f"cannot write NVRTC cache entry {path} ({e.strerror or e}); not cached")
