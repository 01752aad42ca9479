"""Files from outside the run, opened without trust; files of our own, written whole.

A path a user or a peer names (an expert folder for ``hddm add-expert``, a cluster's shard set, a DiT checkpoint to
convert, a prepared dataset) may be a symlink to ``/dev/zero``, a FIFO that never ends, a directory, or a file far
larger than anything sensible. Every function here opens the path once (a FIFO without blocking), checks on the
open descriptor that it is a regular file and that its size is within the limit, and then reads or copies it with
the limit enforced while the bytes flow (a file that grows while it is read is caught too). A copy goes to a new
file that is removed when anything fails: nothing half-written is left behind. Errors are :class:`UnsafeFile`
(an ``OSError``) with a one-line message naming the path.

What the project writes itself goes through :func:`atomic_path` (or :func:`write_atomic` for text): a temporary
file beside the target, renamed onto it when complete and removed when anything fails, so that a reader sees the
old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

CHUNK = 4 * 2**20


class UnsafeFile(OSError):
    """A file from outside is not a regular file, too large, or unreadable; the message names it."""

    def __str__(self) -> str:  # OSError's own str() would prefix an errno
        return str(self.args[0]) if self.args else "unsafe file"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike, what: str, max_bytes: int = 0) -> IO[bytes]:
    """Open ``path`` for binary reading if it is (or links to) a regular file of at most ``max_bytes`` bytes
    (0 = no limit); ``what`` names it in errors (e.g. ``"--cluster-data file"``)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    except OSError as e:
        raise UnsafeFile(f"{what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        if max_bytes and st.st_size > max_bytes:
            raise UnsafeFile(f"{what} {path} has {st.st_size} bytes, more than the limit of {max_bytes}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` bytes (also enforced while reading)."""
    with open_regular(path, what, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{what} {path} grew past the limit of {max_bytes} bytes while it was read")
    return data


def read_text(path: str | os.PathLike, what: str, max_bytes: int) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes`` bytes."""
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnsafeFile(f"{what} {path} is not UTF-8 text (byte {e.start})") from None


def copy_file(src: str | os.PathLike, dst: str | os.PathLike, what: str, max_bytes: int = 0) -> int:
    """Copy the regular file ``src`` to the new file ``dst`` (which must not exist), at most ``max_bytes`` bytes
    (0 = no limit), streamed in chunks; ``dst`` is removed if anything fails. Returns the bytes copied."""
    dst = Path(dst)
    with open_regular(src, what, max_bytes) as f:
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        n = 0
        try:
            with os.fdopen(out, "wb") as g:
                while chunk := f.read(CHUNK):
                    n += len(chunk)
                    if max_bytes and n > max_bytes:
                        raise UnsafeFile(f"{what} {src} grew past the limit of {max_bytes} bytes while it was copied")
                    g.write(chunk)
        except BaseException:
            dst.unlink(missing_ok=True)
            raise
    return n


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, shared: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` to write the file to; renamed onto ``path`` when the block ends, removed
    if it raises. ``shared``: other processes or threads may write the same file at the same time (a cache beside
    a dataset), so the temporary name is this writer's own; otherwise it is fixed, and a writer killed mid-write
    leaves one hidden file that the next write replaces."""
    path = Path(path)
    own = f".{os.getpid()}-{threading.get_ident()}" if shared else ""
    tmp = path.with_name(f".{path.name}{own}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, text: str, *, shared: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole (:func:`atomic_path`)."""
    with atomic_path(path, shared=shared) as tmp:
        tmp.write_text(text, encoding="utf-8")  # model cards hold ε, ², –: not the locale's encoding
