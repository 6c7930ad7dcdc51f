"""CUDA errors (runtime, driver, cuBLAS/cuDNN, device-side asserts) and out-of-memory errors."""

from __future__ import annotations

import re
from typing import Any

from agents.parsers.training.common import MAX_MESSAGE, Emit

_CUDA_ERR = re.compile(r"CUDA error: (.+?)(?:\s+CUDA kernel errors|\s+Search for `cuda|\s*$)")
_CUDA_DRIVER = re.compile(r"\b(CUDA_ERROR_[A-Z_]+)(?::\s*([^.:]+))?")
_CUDA_RUNTIME = re.compile(r"\b(cudaError[A-Z]\w+)")
CUDA_FAILURE = re.compile(r"Cuda failure '?([^']+?)'?(?:\s*$|\s+\()")  # NCCL's wording
_CUBLAS = re.compile(r"\b((?:CUBLAS|CUDNN)_STATUS_[A-Z_]+)")
# (substring of the lowercased message, error name); the first that fits names the error.
_CUDA_NAMES: tuple[tuple[str, str], ...] = (
    ("illegal memory access", "illegal_memory_access"),
    ("uncorrectable ecc error", "ecc_uncorrectable"),
    ("ecc_uncorrectable", "ecc_uncorrectable"),
    ("unspecified launch failure", "launch_failure"),
    ("launch_failed", "launch_failure"),
    ("device-side assert triggered", "device_assert"),
    ("misaligned address", "misaligned_address"),
    ("illegal instruction", "illegal_instruction"),
    ("launch timed out", "launch_timeout"),
    ("no kernel image is available", "no_kernel_image"),
    ("invalid device ordinal", "invalid_device_ordinal"),
    ("busy or unavailable", "devices_unavailable"),
    ("no cuda-capable device", "no_device"),
    ("nvlink error", "nvlink_uncorrectable"),
    ("initialization error", "initialization_error"),
    ("operation not permitted when stream is capturing", "stream_capture"),
    ("invalid argument", "invalid_argument"),
    ("unknown error", "unknown_error"),
    ("out of memory", "out_of_memory"),
)

_OOM = re.compile(
    r"(?:CUDA|HIP|XPU|MPS) out of memory|OutOfMemoryError|CUDA error: out of memory|Cuda failure 'out of memory'"
)
_BYTES = r"[\d.]+ ?(?:[KMGTP]i?B|bytes|B)"  # "20.00 MiB", "1.5 GB", "512 bytes"
_OOM_TRIED = re.compile(rf"Tried to allocate ({_BYTES})")
_OOM_GPU = re.compile(r"\bGPU (\d+)")
_OOM_TOTAL = re.compile(rf"total capac\w* of ({_BYTES})|({_BYTES}) total capacity")
_OOM_FREE = re.compile(rf"of which ({_BYTES}) is free|({_BYTES}) free")
_SIZE = re.compile(r"([\d.]+) ?([KMGTP]?)i?(B|bytes)")


def cuda_name(message: str) -> str:
    """A short stable name for a CUDA error message ("illegal_memory_access"), else a slug of it."""
    low = message.lower()
    for needle, name in _CUDA_NAMES:
        if needle in low:
            return name
    slug = re.sub(r"[^a-z0-9]+", "_", low).strip("_")
    return slug[:48] or "unknown"


def rule_oom(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "memory" not in low or not _OOM.search(body):
        return False
    fields: dict[str, Any] = {"tried_bytes": None, "gpu": None}
    tried = _OOM_TRIED.search(body)
    if tried:
        fields["tried_bytes"] = _size(tried.group(1))
    gpu = _OOM_GPU.search(body)
    if gpu:
        fields["gpu"] = int(gpu.group(1))
    total = _OOM_TOTAL.search(body)
    if total:
        fields["total_bytes"] = _size(total.group(1) or total.group(2))
    free = _OOM_FREE.search(body)
    if free:
        fields["free_bytes"] = _size(free.group(1) or free.group(2))
    start = body.find("out of memory")
    text = body[max(0, start - 5) :] if start >= 0 else body
    fields["message"] = text.strip()[:MAX_MESSAGE]
    emit("oom", "error", fields, critical=True)
    return True


def rule_cuda(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "cuda" not in low and "cublas" not in low and "cudnn" not in low and "device-side assert" not in low:
        return False
    fields: dict[str, Any] = {}
    message: str | None = None
    library = _CUBLAS.search(body)
    if library:  # cuBLAS/cuDNN status codes say more than the words around them
        fields["code"] = library.group(1)
    m = _CUDA_ERR.search(body)
    if m:
        message = m.group(1).strip()
    driver = _CUDA_DRIVER.search(body)
    if driver:
        fields["code"] = driver.group(1)
        message = message or (driver.group(2) or driver.group(1)).strip()
    if message is None:
        for regex in (_CUDA_RUNTIME, _CUBLAS, CUDA_FAILURE):
            found = regex.search(body)
            if found:
                message = found.group(1)
                if regex is not CUDA_FAILURE:
                    fields["code"] = found.group(1)
                break
    if message is None and "device-side assert triggered" in low:
        message = "device-side assert triggered"
    if message is None:
        return False
    if library:
        error = library.group(1).lower().replace("_status", "")
    else:
        error = cuda_name(fields.get("code", "") + " " + message)
    fields["error"] = error
    fields["message"] = message[:MAX_MESSAGE]
    emit("cuda_error", "error", fields, critical=True)
    return True


def _size(text: str | None) -> int | None:
    """Bytes in "20.00 MiB", "1.5 GB", "512 bytes" (binary multiples, as PyTorch means them)."""
    if not text:
        return None
    m = _SIZE.search(text)
    if not m:
        return None
    try:
        return int(float(m.group(1)) * 1024 ** "_KMGTP".index(m.group(2) or "_"))
    except ValueError:
        return None
