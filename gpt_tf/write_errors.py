"""A write the machine refused (a full disk, a read-only or vanished folder) as one line for the operator.

Every command that writes (training's checkpoints and run files, the data builders' shards, exports,
submissions) lets such a failure through its own clean-up first (temporary files and folders removed, the
previous good output left where it was) and then ends with one line, ``WriteError``'s text: what it could
not write, why, and, for a full disk, how much room is left on which file system::

    no space left on device writing runs/x/checkpoints/ckpt-12 (free: 3.1 MB on /mnt/data)
    read-only file system: cannot write runs/x/checkpoints/ckpt-12 (/mnt/data is mounted read-only)

``writing(path)`` wraps a write: an ``OSError`` or a TensorFlow ``OpError`` of that kind becomes a
``WriteError`` naming ``path`` (the free space measured then, before any clean-up frees some); anything
else passes through unchanged. ``as_write_error`` is the same test for an error caught further up, where
only the full disk, the quota and the read-only file system are recognised (a missing file or a refused
permission there may be a read). No TensorFlow here: its errors are recognised by the C library's text
their messages carry.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Optional

# Always a fault of the storage, wherever it is met.
STORAGE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
           errno.EROFS: "read-only file system"}
# A fault of the storage when met while writing a known path (elsewhere they may be reads of a missing input).
WRITING = {**STORAGE, errno.ENOENT: "folder removed", errno.EACCES: "permission denied",
           errno.EPERM: "permission denied"}
_TEXT = {os.strerror(code): code for code in WRITING}  # "No space left on device", "Read-only file system", ...


class WriteError(OSError):
    """A write refused by the machine's storage; ``str()`` is the operator's one line (see the module doc)."""

    def __init__(self, code: int, path: str, detail: str = ""):
        super().__init__(code, WRITING.get(code, os.strerror(code)), path)
        self.path, self.detail = str(path), detail
        self.free, self.mount = free_space(self.path)

    def __str__(self) -> str:
        if self.detail:
            return self.detail
        where = f"on {self.mount}" if self.mount else "on its file system"
        if self.errno in (errno.ENOSPC, errno.EDQUOT):
            free = "unknown" if self.free is None else f"{self.free / 1e6:.1f} MB"
            return f"{self.strerror} writing {self.path} (free: {free} {where})"
        if self.errno == errno.EROFS:
            return f"read-only file system: cannot write {self.path} ({self.mount or 'its file system'} is mounted read-only)"
        if self.errno == errno.ENOENT:
            return f"cannot write {self.path}: its folder no longer exists (removed while the command ran?)"
        return f"{self.strerror}: cannot write {self.path}"

    @property
    def remedy(self) -> str:
        """What the operator does about it, in a few words."""
        return {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space",
                errno.EROFS: "make it writable"}.get(self.errno, "fix the storage")

    def __reduce__(self):
        return (type(self), (self.errno, self.path, self.detail))


def _code(err: BaseException, known: dict) -> Optional[int]:
    if isinstance(err, OSError) and err.errno in known:
        return err.errno
    message = getattr(err, "message", None)
    if message is None or isinstance(err, OSError):
        return None
    found = [(message.find(text), code) for text, code in _TEXT.items() if code in known and text in message]
    return min(found)[1] if found else None


def as_write_error(err: BaseException, path: str = "", strict: bool = False) -> Optional[WriteError]:
    """``err`` as a ``WriteError`` about ``path`` (default: the path the error names), or None when it is not
    the storage's fault. ``strict`` (the caller was writing ``path``): a missing folder or a refused
    permission counts too."""
    if isinstance(err, WriteError):
        return err
    code = _code(err, WRITING if strict else STORAGE)
    if code is None:
        return None
    if not path:
        path = getattr(err, "filename", None) or ""
        path = path or _path_in(getattr(err, "message", "") or str(err))
    return WriteError(code, path)


def _path_in(message: str) -> str:
    """The first file path a (TensorFlow) error message names, or ""."""
    for word in message.split():
        word = word.strip(";,'\"()[]")
        if "/" in word and not word.startswith(("{", "[")) and ":" not in word.split("://")[-1]:
            return word
    return ""


def refused_build(err: OSError, folder) -> str:
    """A data builder's one line for a write the storage refused while it built ``folder`` (its partial build
    removed, the folder as it was); ``err`` itself is raised again when it is no such fault."""
    fault = as_write_error(err)
    if fault is None:
        raise err
    return (f"error: {fault}; {folder} is as it was (the partial build was removed): {fault.remedy} and run the "
            "same command")


@contextlib.contextmanager
def writing(path):
    """Turns a storage fault raised inside the block into a ``WriteError`` about ``path``."""
    try:
        yield
    except WriteError:
        raise
    except Exception as err:  # noqa: BLE001 -- re-raised unless the storage refused the write
        found = as_write_error(err, str(path), strict=True)
        if found is None:
            raise
        raise found from err


def free_space(path: str) -> tuple[Optional[int], str]:
    """(bytes free to an unprivileged user, mount point) of the file system ``path`` is (or would be) on; (None,
    "") for a remote path or when it cannot be told."""
    if not path or "://" in path:
        return None, ""
    folder = os.path.abspath(path)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None, ""
    return free, _mount_point(os.path.realpath(folder))


def _mount_point(folder: str) -> str:
    """The mount point ``folder`` lies under: the longest one the kernel lists (bind mounts included), else the
    nearest folder ``os.path.ismount`` accepts."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            points = [line.split()[4].encode().decode("unicode_escape") for line in f if len(line.split()) > 4]
    except OSError:
        points = []
    under = [p for p in points if folder == p or folder.startswith(p.rstrip("/") + "/")]
    if under:
        return max(under, key=len)
    while not os.path.ismount(folder):
        folder = os.path.dirname(folder)
    return folder
