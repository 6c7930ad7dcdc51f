"""Stack frames normalized into signatures and states, and one snapshot's ranks as arrays of them."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from ml.findings import JobInfo, StackSample

COLLECTIVE, DATA, COMPUTE, OTHER, NO_STACK = "collective", "data", "compute", "other", "no_stack"
STATES = (COLLECTIVE, DATA, COMPUTE, OTHER)  # codes 0..3 in the per-rank arrays; -1 is no stack
_CODE = {s: i for i, s in enumerate(STATES)}
_UNREPORTED, _NO_STACK = -2, -1
_MAX_RANK = 10_000_000  # a rank number beyond this is garbage, not a job
MAX_TREE_DEPTH = 40
_EVIDENCE_SIGNALS = 50  # stack ids listed in a finding; the rest are counted

# --- normalization -----------------------------------------------------------------------------------------

_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUMBERED = re.compile(r"(lambda|genexpr|listcomp|dictcomp|setcomp|locals)[_$#-]?\d+")
_LONG_NUMBER = re.compile(r"\d{5,}")
_HASHY = re.compile(r"(?=[0-9a-f]*\d)[0-9a-f]{8,}")  # temp-dir and generated-file hashes
_PACKAGES = ("site-packages/", "dist-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?/")
# Frameworks often run from a source checkout (Megatron-LM cloned anywhere): keep their package path, from
# the last such directory so that differently named checkouts agree.
_FRAMEWORK = re.compile(
    r"^.*/((?:megatron|deepspeed|torch|transformers|accelerate|apex|colossalai|lightning|pytorch_lightning|fairseq"
    r"|nemo|torchtitan|verl|vllm|transformer_engine)/.*)$"
)


def _clean(text: str) -> str:
    text = _HEX.sub("0x?", text)
    text = _NUMBERED.sub(r"\1", text)
    text = _LONG_NUMBER.sub("#", text)
    return _HASHY.sub("#", text)


def _where(filename: Any, module: Any) -> str:
    """Where a frame runs, stable across machines: the package path, the stdlib path, else the basename."""
    if isinstance(module, str) and module:  # native frames (py-spy --native) name their shared object
        return _clean(module.rsplit("/", 1)[-1])
    if not isinstance(filename, str) or not filename:
        return "?"
    path = filename.replace("\\", "/")
    for marker in _PACKAGES:
        if marker in path:
            return _clean(path.rsplit(marker, 1)[1])
    stdlib = _STDLIB.split(path)
    if len(stdlib) > 1:
        return _clean(stdlib[-1])
    framework = _FRAMEWORK.search(path)
    if framework:
        return _clean(framework.group(1))
    return _clean(path.rsplit("/", 1)[-1])


def normalize_frame(frame: dict[str, Any]) -> tuple[str, str]:
    """(function, where) of one py-spy frame, without line numbers, addresses or numbering."""
    name = frame.get("name") if isinstance(frame, dict) else None
    where = _where(frame.get("filename"), frame.get("module")) if isinstance(frame, dict) else "?"
    return (_clean(name) if isinstance(name, str) and name else "?"), where


def frame_label(frame: tuple[str, str]) -> str:
    """'all_reduce (torch/distributed/distributed_c10d.py)'."""
    return f"{frame[0]} ({frame[1]})"


def signature_of(frames: Sequence[tuple[str, str]]) -> str:
    """A stable short hash of normalized frames (innermost first)."""
    text = "\n".join(f"{n}\t{w}" for n, w in frames)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


# --- classification ----------------------------------------------------------------------------------------

# Frames that wrap whatever runs inside them; they say nothing about where a rank is.
_GENERIC_WHERE = (
    "threading.py",
    "queue.py",
    "selectors.py",
    "contextlib.py",
    "functools.py",
    "logging/",
    "warnings.py",
    "multiprocessing/connection.py",
    "multiprocessing/queues.py",
    "torch/_ops.py",
    "torch/utils/_contextlib.py",
    "torch/distributed/c10d_logger.py",
    "torch/distributed/elastic/",
    "torch/distributed/launcher/",
    "torch/distributed/run.py",
)
_COLLECTIVE_NAMES = {
    "all_reduce", "allreduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "allgather",
    "all_gather_object", "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "reducescatter", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "all_to_all",
    "all_to_all_single", "alltoall", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "_wait_for_work", "wait_tensor", "_wait_tensor", "wait_stream",
}  # fmt: skip
_P2P_NAMES = {
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "_communicate", "_p2p_ops", "_batched_p2p_ops",
    "send_forward", "recv_forward", "send_backward", "recv_backward", "send_forward_recv_backward",
    "send_backward_recv_forward", "send_forward_recv_forward", "send_backward_recv_backward",
    "send_forward_backward_recv_forward_backward", "_send_recv", "p2p_communicate",
}  # fmt: skip
_COMM_WHERE = (
    "torch/distributed/",
    "deepspeed/comm/",
    "megatron/core/distributed/",
    "megatron/core/pipeline_parallel/p2p_communication",
    "megatron/core/tensor_parallel/mappings",
    "deepspeed/runtime/pipe/p2p",
)
_COMM_NATIVE = ("nccl", "gloo", "processgroup", "c10d::")
_DATA_WHERE = ("torch/utils/data/", "datasets/", "webdataset/", "streaming/", "petastorm/", "nvidia/dali/")
_DATA_WORDS = (
    "dataloader", "data_loader", "data_load", "load_data", "dataset", "get_batch", "next_batch", "load_batch",
    "read_batch", "prefetch", "_next_data", "_get_data", "fetch",
)  # fmt: skip
_COMPUTE_WHERE = (
    "torch/nn/", "torch/autograd/", "torch/optim/", "torch/_tensor.py", "torch/_dynamo/", "torch/_inductor/",
    "torch/cuda/", "torch/amp/", "torch/functional.py", "triton/", "apex/", "transformer_engine/", "flash_attn/",
    "xformers/", "megatron/core/transformer/", "megatron/core/models/", "megatron/core/fusions/",
)  # fmt: skip
_COMPUTE_WORDS = ("forward", "backward", "compute", "matmul", "attention", "optimizer", "loss")


@dataclass(frozen=True, slots=True)
class _Class:
    state: str
    op: str  # the innermost meaningful frame, as a label
    p2p: int  # pipeline neighbours a point-to-point op talks to: 1 previous stage, 2 next, 3 either, 0 none


def _p2p_direction(name: str) -> int:
    lower = name.lower()
    if "forward" not in lower and "backward" not in lower:
        return 3
    direction = 0
    # Activations flow forward: recv_forward hears from the previous stage, send_forward talks to the next.
    if "recv_forward" in lower or "send_backward" in lower:
        direction |= 1
    if "send_forward" in lower or "recv_backward" in lower:
        direction |= 2
    return direction or 3


def _frame_state(name: str, where: str) -> tuple[str, int] | None:
    """(state, p2p direction) of one frame, or None when it says nothing."""
    if where.startswith(_GENERIC_WHERE):
        return None
    short = name.rsplit(".", 1)[-1]
    lower_name, lower_where = name.lower(), where.lower()
    if short in _P2P_NAMES:
        return COLLECTIVE, _p2p_direction(short)
    if short in _COLLECTIVE_NAMES or any(k in lower_name or k in lower_where for k in _COMM_NATIVE):
        return COLLECTIVE, 0
    if where.startswith(_COMM_WHERE):
        return COLLECTIVE, 0
    if where.startswith(_DATA_WHERE) or any(k in lower_name or k in lower_where for k in _DATA_WORDS):
        return DATA, 0
    if where.startswith(_COMPUTE_WHERE) or any(k in lower_name for k in _COMPUTE_WORDS):
        return COMPUTE, 0
    return None


def classify(frames: Sequence[tuple[str, str]]) -> _Class:
    """State of a normalized stack (innermost first) from its innermost meaningful frame."""
    for name, where in frames:
        found = _frame_state(name, where)
        if found is not None:
            direction = found[1]
            if direction == 3:  # `_communicate` says nothing; an outer `recv_forward` says which neighbour
                named = (_p2p_direction(n.rsplit(".", 1)[-1]) for n, _ in frames if n.rsplit(".", 1)[-1] in _P2P_NAMES)
                direction = next((d for d in named if d != 3), 3)
            return _Class(found[0], frame_label((name, where)), direction)
    meaningful = next((f for f in frames if not f[1].startswith(_GENERIC_WHERE)), frames[0] if frames else None)
    return _Class(OTHER, frame_label(meaningful) if meaningful else "?", 0)


# --- signatures, cached ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Sig:
    signature: str
    frames: tuple[tuple[str, str], ...]  # innermost first
    cls: _Class

    @property
    def labels(self) -> list[str]:
        return [frame_label(f) for f in self.frames]


_NAME, _FILE = itemgetter("name"), itemgetter("filename")


class _Normalizer:
    """Signature index per raw stack, cached: 16,384 ranks share a handful of distinct stacks."""

    def __init__(self) -> None:
        self.sigs: list[_Sig] = []
        self._raw: dict[tuple[Any, ...], int] = {}
        self._frames: dict[tuple[Any, ...], tuple[str, str]] = {}
        self._norm: dict[tuple[tuple[str, str], ...], int] = {}

    def index(self, frames: list[Any]) -> int:
        """The signature index of a raw frame list, or -1 when it has no readable frame."""
        # Names and file names only: hashing them is most of the cost at 16,384 ranks, and line numbers must
        # not split groups anyway. Native frames' module rarely differs where name and file agree.
        try:
            key: tuple[Any, ...] = (*map(_NAME, frames), *map(_FILE, frames))
            found = self._raw.get(key)
        except (KeyError, TypeError):  # frames without the usual keys, or unhashable values
            key = tuple(repr((f.get("name"), f.get("filename"))) for f in frames if isinstance(f, dict))
            found = self._raw.get(key)
        if found is not None:
            return found
        normalized = tuple(n for n in (self._frame(f) for f in frames if isinstance(f, dict)) if n != ("?", "?"))
        if not normalized:
            self._raw[key] = -1
            return -1
        found = self._norm.get(normalized)
        if found is None:
            found = len(self.sigs)
            self.sigs.append(_Sig(signature_of(normalized), normalized, classify(normalized)))
            self._norm[normalized] = found
        self._raw[key] = found
        return found

    def _frame(self, frame: dict[str, Any]) -> tuple[str, str]:
        raw = tuple(repr(frame.get(k)) for k in ("name", "filename", "module"))
        cached = self._frames.get(raw)
        if cached is None:
            cached = self._frames[raw] = normalize_frame(frame)
        return cached


def main_thread_frames(sample: StackSample) -> list[Any] | None:
    """The main thread's frames: thread MainThread, else the process's own thread, else the first with frames."""
    threads = sample.threads
    if not isinstance(threads, list):
        return None
    for thread in threads:  # the common case first, cheaply: 16,384 ranks, several threads each
        if isinstance(thread, dict) and thread.get("thread_name") == "MainThread":
            frames = thread.get("frames")
            if isinstance(frames, list) and frames:
                return frames
    usable = [t for t in threads if isinstance(t, dict) and isinstance(t.get("frames"), list) and t["frames"]]
    own = [t for t in usable if t.get("os_thread_id") is not None and t.get("os_thread_id") == sample.pid]
    return (own or usable)[0]["frames"] if usable else None


# --- one snapshot as arrays --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Snapshot:
    sig: np.ndarray  # per rank: signature index, -1 no stack, -2 no sample
    state: np.ndarray  # per rank: state code, -1 no stack, -2 no sample
    sample_pos: np.ndarray  # per rank: index into the samples, -1 none
    node: np.ndarray  # per rank: index into node_names, -1 unknown
    node_names: list[str]
    samples: list[StackSample]


def _snapshot(job: JobInfo, stacks: Iterable[StackSample], norm: _Normalizer) -> _Snapshot:
    samples = [s for s in stacks if isinstance(s, StackSample) and isinstance(s.rank, int) and 0 <= s.rank < _MAX_RANK]
    mapped = {r: n for r, n in job.rank_nodes.items() if isinstance(r, int) and 0 <= r < _MAX_RANK}
    size = max(max((s.rank for s in samples), default=-1), max(mapped, default=-1)) + 1
    # Python lists while filling (numpy item access per rank is slower), arrays for the reasoning.
    sig = [_UNREPORTED] * size
    pos = [-1] * size
    node = [-1] * size
    names: dict[str, int] = {}
    for rank, name in mapped.items():
        if isinstance(name, str) and name:
            node[rank] = names.setdefault(name, len(names))
    index = norm.index
    for i, sample in enumerate(samples):
        rank = sample.rank
        if sig[rank] >= 0:  # a duplicate dump of a rank: keep the first readable one
            continue
        frames = main_thread_frames(sample)
        sig[rank] = index(frames) if frames else _NO_STACK
        pos[rank] = i
        if isinstance(sample.node, str) and sample.node:
            node[rank] = names.setdefault(sample.node, len(names))
    sig_arr = np.asarray(sig, dtype=np.int64)
    codes = np.array([_CODE[s.cls.state] for s in norm.sigs] + [_NO_STACK, _UNREPORTED], dtype=np.int64)
    state = codes[sig_arr]  # -1 and -2 index the two sentinels at the end
    return _Snapshot(
        sig_arr, state, np.asarray(pos, dtype=np.int64), np.asarray(node, dtype=np.int64), list(names), samples
    )


def rank_ranges(ranks: Iterable[int] | np.ndarray) -> str:
    """'0-6,8-15' for ranks 0..6 and 8..15."""
    arr = np.unique(np.asarray(list(ranks) if not isinstance(ranks, np.ndarray) else ranks, dtype=np.int64))
    if arr.size == 0:
        return ""
    breaks = np.flatnonzero(np.diff(arr) != 1)
    starts = np.concatenate(([arr[0]], arr[breaks + 1]))
    ends = np.concatenate((arr[breaks], [arr[-1]]))
    return ",".join(str(s) if s == e else f"{s}-{e}" for s, e in zip(starts.tolist(), ends.tolist(), strict=True))


def _cap(ranges: str, limit: int = 24) -> str:
    """A range string cut to its first `limit` ranges, saying how many there were."""
    parts = ranges.split(",")
    return ranges if len(parts) <= limit else ",".join(parts[:limit]) + f",... ({len(parts)} ranges)"


def _short_ranges(ranks: np.ndarray | list[int], limit: int = 24) -> str:
    return _cap(rank_ranges(ranks), limit)
