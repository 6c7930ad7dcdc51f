"""CUDA errors (runtime, driver, cuBLAS/cuDNN, device-side asserts) and out-of-memory errors.

PyTorch 2.x says `CUDA error: <message>`; PyTorch 0.x-1.x (THC) said `cuda runtime error (N) : <message>
at file.cu:line` and `THCudaCheck FAIL file=... line=... error=N : <message>`, with N the cudaError_t
number (2 is out of memory). A failed device-side assertion prints one line per GPU thread; those lines
are read as one block.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from agents.events import Event
from agents.parsers.training.blocks import REJECT, TAKE, Block
from agents.parsers.training.common import MAX_MESSAGE, Emit, make_event

_CUDA_ERR = re.compile(r"CUDA error: (.+?)(?:\s+CUDA kernel errors|\s+Search for `cuda|\s*$)")
_CUDA_DRIVER = re.compile(r"\b(CUDA_ERROR_[A-Z_]+)(?::\s*([^.:]+))?")
_CUDA_RUNTIME = re.compile(r"\b(cudaError[A-Z]\w+)")
CUDA_FAILURE = re.compile(r"Cuda failure '?([^']+?)'?(?:\s*$|\s+\()")  # NCCL's wording
_CUBLAS = re.compile(r"\b((?:CUBLAS|CUDNN)_STATUS_[A-Z_]+)")
# THC (PyTorch <= 1.x): "cuda runtime error (59) : device-side assert triggered at /pytorch/aten/src/THC/...cu:26"
_THC_RUNTIME = re.compile(r"(?i)cuda runtime error \((\d+)\)\s*:\s*(.+?)(?:\s+at\s+(\S+:\d+))?\s*$")
# "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=51 error=2 : out of memory"
_THC_CHECK = re.compile(r"THCudaCheck FAIL file=(\S+) line=(\d+) error=(\d+)\s*:\s*(.+?)\s*$")
# A C++ library's CHECK of a CUDA call (glog-style): "Check failed: ret == cudaSuccess (700 vs. 0)  Error: an illegal
# memory access was encountered." (k2-fsa/k2#859); the number is the cudaError_t.
_CUDA_CHECK = re.compile(r"cudaSuccess \((?P<code>\d{1,4}) vs\.? 0\)(?:.*?\bError:\s*(?P<message>.+?))?\s*$")
# cudaError_t numbers whose words a CHECK may leave out.
_CUDA_CODES = {
    2: "out of memory",
    214: "uncorrectable ECC error encountered",
    700: "an illegal memory access was encountered",
    710: "device-side assert triggered",
    719: "unspecified launch failure",
}
# One line per failing GPU thread: "/path/Indexing.cu:218: block: [0,0,0], thread: [106,0,0] Assertion `x` failed."
_KERNEL_ASSERT = re.compile(
    r"(?P<src>\S+:\d+): (?:\S{1,200}?: )?block: \[(?P<block>[\d,]+)\], thread: \[(?P<thread>[\d,]+)\] "
    r"Assertion `(?P<cond>.*)` failed\."
)
# (substring of the lowercased message, error name); the first that fits names the error.
_CUDA_NAMES: tuple[tuple[str, str], ...] = (
    ("illegal memory access", "illegal_memory_access"),
    ("cudaerrorillegaladdress", "illegal_memory_access"),  # the code alone (CuPy: "cudaErrorIllegalAddress: ...")
    ("cuda_error_illegal_address", "illegal_memory_access"),
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
    r"|(?i:cuda runtime error \(2\)\s*:\s*out of memory)|THCudaCheck FAIL .{0,300}error=2 : out of memory"
    r"|(?P<host>DefaultCPUAllocator: (?:not enough memory|can't allocate memory))"
)
_BYTES = r"[\d.]+ ?(?:[KMGTP]i?B|bytes|B)"  # "20.00 MiB", "1.5 GB", "512 bytes"
_CPU_TRIED = re.compile(r"you tried to allocate (\d+) bytes")
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
    if "memory" not in low:
        return False
    m = _OOM.search(body)
    if not m:
        return False
    fields: dict[str, Any] = {"tried_bytes": None, "gpu": None}
    if m.group("host"):  # the host's memory, not a GPU's: "you tried to allocate 123 bytes"
        fields["host"] = True
        tried = _CPU_TRIED.search(body)
        if tried:
            fields["tried_bytes"] = int(tried.group(1))
        fields["message"] = body[m.start() :].strip()[:MAX_MESSAGE]
        emit("oom", "error", fields, critical=True)
        return True
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
    if (
        "cuda" not in low
        and "cublas" not in low
        and "cudnn" not in low
        and "device-side assert" not in low
        and ("THCudaCheck" not in body)
    ):
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
    if message is None:
        check = _CUDA_CHECK.search(body)
        if check:
            code = int(check.group("code"))
            fields["cuda_code"] = code
            message = check.group("message") or _CUDA_CODES.get(code, f"CUDA error {code}")
    if message is None:
        legacy = _THC_CHECK.search(body)
        if legacy:
            message = legacy.group(4)
            fields["cuda_code"] = int(legacy.group(3))
            fields["src"] = f"{legacy.group(1)}:{legacy.group(2)}"
        else:
            legacy = _THC_RUNTIME.search(body)
            if legacy:
                message, fields["cuda_code"] = legacy.group(2), int(legacy.group(1))
                if legacy.group(3):
                    fields["src"] = legacy.group(3)
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


# NVML (nvidia-smi, a node checker) saying a GPU stopped answering on the bus: "Unable to determine the device handle
# for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU" (JosephKJ/OWOD#81), "failed to get device
# remapped rows: ERROR_GPU_IS_LOST" (leptonai/gpud#604). What Xid 79 says in the kernel's log.
_GPU_LOST = re.compile(r"GPU is lost\b|\b(?:NVML_)?ERROR_GPU_IS_LOST\b")
_GPU_LOST_PCI = re.compile(r"\bGPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])")


def rule_gpu_lost(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "lost" not in low or not (m := _GPU_LOST.search(body)):
        return False
    fields: dict[str, Any] = {"error": "gpu_lost", "message": body[max(0, m.start() - 200) :].strip()[:MAX_MESSAGE]}
    pci = _GPU_LOST_PCI.search(body)
    if pci:
        fields["pci"] = pci.group(1).lower()
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


class KernelAsserts(Block):
    """A device-side assertion as the GPU prints it: one line per failing thread, read as one error."""

    kind = "cuda_error"

    def __init__(self, ts: datetime, rank: int | None, line_no: int, now: datetime, first: re.Match[str]) -> None:
        super().__init__(ts, rank, line_no, now)
        self.src = first.group("src")
        self.condition = first.group("cond")
        self.threads = 1
        self.sources = {self.src}

    @staticmethod
    def match(stripped: str) -> re.Match[str] | None:
        """The first assertion line of a block (a literal test first: most lines are not one)."""
        return _KERNEL_ASSERT.search(stripped) if "Assertion `" in stripped and "block: [" in stripped else None

    def offer(self, body: str) -> int:
        m = self.match(body.strip())
        if m is None:
            return REJECT
        self.threads += 1
        self.sources.add(m.group("src"))
        return TAKE

    def event(self, path: str | None) -> Event:
        fields: dict[str, Any] = {
            "error": "device_assert",
            "message": f"Assertion `{self.condition}` failed"[:MAX_MESSAGE],
            "assertion": self.condition[:MAX_MESSAGE],
            "src": self.src,
            "threads": self.threads,
        }
        if len(self.sources) > 1:
            fields["sources"] = sorted(self.sources)[:20]
        return make_event(self.ts, self.kind, self.text, "error", fields, self.rank, path=path, critical=True)
