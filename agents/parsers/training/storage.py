"""Storage errors as the training process meets them: a file system call failing (EIO, ESTALE, EROFS, ENOSPC,
EDQUOT, a FUSE mount whose daemon died), and an object store the job cannot reach while it saves or loads.
`category` says which: io, read_only, stale, capacity, shm (/dev/shm full) or object_store.

    [rank1]: OSError: [Errno 116] Stale file handle: xxx
    RuntimeError: read(): fd 33 failed with Stale file handle
    OP_REQUIRES failed at save_restore_v2_ops.cc:137 : Unknown: : Unable to connect to endpoint

`Transport endpoint is not connected` (ENOTCONN) is a socket's error: a peer went away (c10d's store, Gloo, a
process dying). It is a storage error only when it names a path (`[Errno 107] ...: '/mnt/fuse/...'`), which is
a FUSE mount whose daemon died.
"""

from __future__ import annotations

import re
from typing import Any

from agents.parsers.training.common import MAX_MESSAGE, Emit

# (errno name, the C library's words for it, category)
_ERRNOS: tuple[tuple[str, int, str, str], ...] = (
    ("EIO", 5, "Input/output error", "io"),
    ("EREMOTEIO", 121, "Remote I/O error", "io"),
    ("EROFS", 30, "Read-only file system", "read_only"),
    ("ESTALE", 116, "Stale file handle", "stale"),
    ("ENOSPC", 28, "No space left on device", "capacity"),
    ("EDQUOT", 122, "Disk quota exceeded", "capacity"),
)
_WORDS = tuple(words for _, _, words, _ in _ERRNOS)
# What follows the error's words: "Stale file handle: '/data/x'", "... Input/output error: /mnt/ckpt"
_PATH_AFTER = re.compile(r"""^:\s*['"]?(/[^'"\s]{0,400}|[^'"\s:]{1,400})""")
_FUSE_GONE = re.compile(r"""(?:\[Errno 107\] )?Transport endpoint is not connected:\s*['"]?(/[^'"\s]{0,400})""")
# The AWS SDKs: aws-sdk-cpp (TensorFlow's S3 file system) and botocore.
_OBJECT_STORE = re.compile(r"Unable to connect to endpoint|Could not connect to the endpoint URL:?\s*\"?(\S+?)\"?\s*$")
# Shared memory (/dev/shm) full: the DataLoader's tensors ("unable to write to file </torch_123_456>: No space left on
# device (28)"), not a file system the job writes to.
_SHM = re.compile(r"/dev/shm|</torch_|shared memory|\bshm\b", re.IGNORECASE)
_HINTS = ("[Errno", *_WORDS, "endpoint")


def rule_storage(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if not any(h in body for h in _HINTS):
        return False
    fields = _read(body)
    if fields is None:
        return False
    emit("storage_error", "error", fields, critical=True)
    return True


def _read(body: str) -> dict[str, Any] | None:
    for name, number, words, category in _ERRNOS:
        at = body.find(words)
        numbered = f"[Errno {number}]" in body
        if at < 0 and not numbered:
            continue
        path = None
        if at >= 0:
            after = _PATH_AFTER.match(body[at + len(words) :])
            path = after.group(1) if after else None
        if category == "capacity" and _SHM.search(body):
            category = "shm"
        return _fields(name, category, path, body)
    fuse = _FUSE_GONE.search(body)
    if fuse:
        return _fields("ENOTCONN", "io", fuse.group(1), body)
    store = _OBJECT_STORE.search(body)
    if store:
        fields = _fields(None, "object_store", None, body)
        if store.group(1):
            fields["endpoint"] = store.group(1)
        return fields
    return None


def _fields(errno: str | None, category: str, path: str | None, message: str) -> dict[str, Any]:
    return {"errno": errno, "category": category, "path": path, "message": message.strip()[:MAX_MESSAGE]}
