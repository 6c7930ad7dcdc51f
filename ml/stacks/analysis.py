"""Stack aggregation for hangs and fail-slow (ByteRobust section 5), localized with the job's parallel groups.

Every rank's main-thread stack (from `py-spy dump --json`) is normalized (function and module per frame, no
line numbers, addresses or numbering) and hashed; ranks with the same signature form a group and the largest
group is taken as healthy. Ranks blocked in a collective are victims; ranks elsewhere while the others wait,
ranks without a stack, and peers that never reached a collective their group waits in are culprits. The
machine is named when the culprits sit on it alone; otherwise the smallest parallel group covering them is.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from operator import itemgetter
from typing import Any

import numpy as np

from ml import parallel
from ml.findings import Finding, JobInfo, StackSample

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


# --- the analysis ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StackGroup:
    """Ranks sharing one normalized stack."""

    signature: str
    state: str  # collective, data, compute, other, or no_stack
    op: str  # the innermost meaningful frame
    ranks: str  # compact ranges, "0-6,8-15"
    count: int
    nodes: list[str]
    frames: list[str]  # representative normalized frames, innermost first


@dataclass(frozen=True, slots=True)
class StackAnalysis:
    """What the stacks of one snapshot say: groups, the healthy one, the culprits and the machines to blame."""

    groups: list[StackGroup]
    dominant: str | None  # signature of the largest group
    dominant_state: str | None
    culprit_ranks: list[int]
    suspects: list[tuple[str, float, str]]  # (node, confidence, why), most likely first
    method: str  # named, group_fallback, inconclusive
    why: str
    tree: dict[str, Any]
    covering_group: tuple[str, list[int]] | None = None
    ranks_reporting: int = 0
    unreported: str = ""  # ranks of the job with no sample at all (their agents have not answered)
    culprit_frames: list[str] = field(default_factory=list)
    culprit_state: str | None = None
    culprit_sample_ids: list[int] = field(default_factory=list)
    outlier_sample_ids: list[int] = field(default_factory=list)
    sample_ids: int = 0  # how many samples carried an id


_PHRASE = {
    DATA: "in data loading",
    COMPUTE: "in compute",
    OTHER: "outside any collective",
    COLLECTIVE: "in a collective",
    NO_STACK: "without a stack (process gone or dump failed)",
}


def _groups(snap: _Snapshot, norm: _Normalizer) -> list[tuple[int, np.ndarray]]:
    """(signature index or -1 for no stack, ranks) for every group present, largest first."""
    ranks = np.flatnonzero(snap.sig >= _NO_STACK)
    keys = snap.sig[ranks]
    order = np.argsort(keys, kind="stable")
    keys, ranks = keys[order], ranks[order]
    cuts = np.flatnonzero(np.diff(keys)) + 1
    out = [(int(k[0]), r) for k, r in zip(np.split(keys, cuts), np.split(ranks, cuts), strict=True) if k.size]

    def rank_key(item: tuple[int, np.ndarray]) -> tuple[int, int, str]:
        index, members = item
        waiting = 0 if index >= 0 and norm.sigs[index].cls.state == COLLECTIVE else 1
        return -members.size, waiting, norm.sigs[index].signature if index >= 0 else "~"

    return sorted(out, key=rank_key)


def _group_view(index: int, members: np.ndarray, snap: _Snapshot, norm: _Normalizer) -> StackGroup:
    nodes = sorted({snap.node_names[n] for n in np.unique(snap.node[members]).tolist() if n >= 0})
    if index < 0:
        return StackGroup("none", NO_STACK, "(no stack)", rank_ranges(members), int(members.size), nodes, [])
    sig = norm.sigs[index]
    return StackGroup(
        sig.signature, sig.cls.state, sig.cls.op, rank_ranges(members), int(members.size), nodes, sig.labels
    )


@dataclass(slots=True)
class _Verdict:
    culprits: np.ndarray
    basis: str  # elsewhere, no_stack, partner, absent, stuck_group, stuck_p2p, none
    detail: str


def _partners_p2p(job: JobInfo, snap: _Snapshot, norm: _Normalizer, p2p_ranks: np.ndarray) -> np.ndarray:
    """Pipeline neighbours that point-to-point waiters talk to and that are not in a point-to-point op."""
    lay = parallel.layout(job)
    if lay.sizes["pp"] < 2 or p2p_ranks.size == 0:
        return np.empty(0, dtype=np.int64)
    direction = np.array([s.cls.p2p for s in norm.sigs], dtype=np.int64)[snap.sig[p2p_ranks]]
    prev, nxt = parallel.pipeline_neighbours_array(lay, p2p_ranks)
    wanted = np.concatenate((prev[(direction & 1) > 0], nxt[(direction & 2) > 0]))
    wanted = wanted[(wanted >= 0) & (wanted < snap.sig.size)]
    wanted = np.unique(wanted)
    in_p2p = np.zeros(snap.sig.size, dtype=bool)
    in_p2p[p2p_ranks] = True
    reporting = snap.sig[wanted] >= _NO_STACK
    return wanted[reporting & ~in_p2p[wanted]]


def _absent_peers(job: JobInfo, snap: _Snapshot, members: np.ndarray) -> tuple[np.ndarray, str | None]:
    """Ranks of the parallel groups a collective's waiters belong to that are not in it: they never arrived.

    The group the collective runs in is the dimension whose groups the waiters almost fill; when they fill
    them completely, everyone arrived and the group itself is stuck (returned as the waiters, dimension named).
    """
    lay = parallel.layout(job)
    reporting = np.flatnonzero(snap.sig >= _NO_STACK)
    inside = np.zeros(snap.sig.size, dtype=bool)
    inside[members] = True
    best: tuple[int, str, np.ndarray] | None = None
    for dim in parallel.DIMS:
        if lay.sizes[dim] < 2:
            continue
        ids = parallel.group_id_array(lay, reporting, dim)
        touched = np.isin(ids, np.unique(parallel.group_id_array(lay, members, dim)))
        absent = reporting[touched & ~inside[reporting]]
        if best is None or absent.size < best[0]:
            best = (int(absent.size), dim, absent)
    if best is None:
        return np.empty(0, dtype=np.int64), None
    return best[2], best[1]


def _verdict(job: JobInfo, snap: _Snapshot, norm: _Normalizer, dominant: int) -> _Verdict:
    reporting = snap.sig >= _NO_STACK
    outlier = reporting & (snap.sig != dominant)
    no_stack = snap.sig == _NO_STACK
    elsewhere = outlier & (snap.state >= 0) & (snap.state != _CODE[COLLECTIVE])
    dom_state = norm.sigs[dominant].cls.state
    empty = np.empty(0, dtype=np.int64)
    if not outlier.any():
        return _Verdict(empty, "none", "every rank shares one stack")
    if dom_state != COLLECTIVE:
        # Nobody visibly waits: ranks elsewhere than the majority are suspects only when they are few.
        few = max(1, int(0.25 * reporting.sum()))
        if 0 < elsewhere.sum() <= few:
            return _Verdict(np.flatnonzero(elsewhere), "elsewhere", "")
        if 0 < no_stack.sum() <= few:
            return _Verdict(np.flatnonzero(no_stack), "no_stack", "")
        return _Verdict(empty, "none", "no small set of ranks stands apart from the majority")
    if elsewhere.any():
        culprits = elsewhere.copy()
        # A dead process on a culprit's machine is the same story; elsewhere it is only a failed dump.
        culprit_nodes = np.unique(snap.node[elsewhere])
        culprits |= no_stack & np.isin(snap.node, culprit_nodes[culprit_nodes >= 0])
        return _Verdict(np.flatnonzero(culprits), "elsewhere", "")
    # Failed dumps point at their machines only while most dumps worked (py-spy itself may be broken).
    if no_stack.any() and no_stack.sum() * 2 < reporting.sum():
        return _Verdict(np.flatnonzero(no_stack), "no_stack", "")
    return _collective_outliers(job, snap, norm, outlier)


def _collective_outliers(job: JobInfo, snap: _Snapshot, norm: _Normalizer, outlier: np.ndarray) -> _Verdict:
    """Outliers all wait in other collectives: find the peers they wait for."""
    p2p_sig = np.array([s.cls.p2p > 0 for s in norm.sigs] + [False, False], dtype=bool)
    is_p2p = outlier & p2p_sig[snap.sig]
    partners = _partners_p2p(job, snap, norm, np.flatnonzero(is_p2p))
    culprits: list[np.ndarray] = [partners] if partners.size else []
    details: list[str] = []
    if partners.size:
        waiters = np.flatnonzero(is_p2p)
        p2p_op = _fn(norm.sigs[int(snap.sig[waiters[0]])].cls.op)
        details.append(f"ranks {_short_ranges(waiters, 6)} wait in {p2p_op} for pipeline peers that never came")
    stuck: list[np.ndarray] = []
    # Waiters of one operation belong together whatever call path brought them there.
    others = np.flatnonzero(outlier & ~is_p2p & (snap.sig >= 0))
    ops = np.array([s.cls.op for s in norm.sigs], dtype=object)[snap.sig[others]] if others.size else []
    for op in sorted(set(ops)):
        members = others[ops == op]
        absent, dim = _absent_peers(job, snap, members)
        if absent.size:
            culprits.append(absent)
            details.append(f"ranks {_short_ranges(members, 6)} wait in {_fn(op)} for {dim} peers that never came")
        elif dim is not None:
            stuck.append(members)
            details.append(
                f"ranks {_short_ranges(members, 6)} all reached {_fn(op)} in their {dim} group and are stuck"
            )
    if culprits:
        return _Verdict(np.unique(np.concatenate(culprits)), "partner", "; ".join(details))
    if stuck:
        return _Verdict(np.unique(np.concatenate(stuck)), "stuck_group", "; ".join(details))
    if is_p2p.any():
        detail = "point-to-point pairs wait for each other"
        return _Verdict(np.flatnonzero(is_p2p), "stuck_p2p", detail)
    return _Verdict(np.empty(0, dtype=np.int64), "none", "outliers wait in other collectives; no peer stands out")


_BASE_CONFIDENCE = {"elsewhere": 0.9, "no_stack": 0.85, "partner": 0.8, "stuck_group": 0.75, "stuck_p2p": 0.7}


def _fn(label: str) -> str:
    """The function of a frame label: 'all_reduce (torch/distributed/distributed_c10d.py)' -> 'all_reduce'."""
    return label.split(" (", 1)[0]


def _doing(index: int, norm: _Normalizer) -> str:
    """'wait in all_reduce', 'in data loading (_get_data)', 'without a stack (...)'."""
    if index < 0:
        return _PHRASE[NO_STACK]
    cls = norm.sigs[index].cls
    return f"in {_fn(cls.op)}" if cls.state == COLLECTIVE else f"{_PHRASE[cls.state]} ({_fn(cls.op)})"


def _describe(ranks: np.ndarray, snap: _Snapshot, norm: _Normalizer) -> str:
    """'rank 3 in data loading (_stuck_in_data_loading)' for culprits (the first one's state stands for all)."""
    first = int(ranks[0])
    who = f"rank {first}" if ranks.size == 1 else f"ranks {_short_ranges(ranks, 6)}"
    return f"{who} {_doing(int(snap.sig[first]), norm)}"


def _suspects(
    job: JobInfo, snap: _Snapshot, norm: _Normalizer, verdict: _Verdict, dominant: int
) -> tuple[str, list[tuple[str, float, str]], tuple[str, list[int]] | None, str]:
    """(method, suspects, covering group, why) for the verdict's culprits."""
    culprits = verdict.culprits
    dom = norm.sigs[dominant]
    reporting = int((snap.sig >= _NO_STACK).sum())
    waiting = (
        f"{int((snap.sig == dominant).sum())} of {reporting} ranks {'wait ' if dom.cls.state == COLLECTIVE else 'are '}"
    )
    waiting += _doing(dominant, norm)
    if culprits.size == 0:
        return "inconclusive", [], None, f"{verdict.detail}; {waiting}"
    base = _BASE_CONFIDENCE.get(verdict.basis, 0.7) - (0.15 if dom.cls.state != COLLECTIVE else 0.0)
    node_of = snap.node[culprits]
    nodes = np.unique(node_of[node_of >= 0])
    per_node = [(snap.node_names[n], culprits[node_of == n]) for n in nodes.tolist()]
    job_nodes = int(np.unique(snap.node[snap.node >= 0]).size)
    # Every reporting rank of each machine is a culprit: whole machines failed, which separates them too.
    on_node = np.bincount(snap.node[(snap.sig >= _NO_STACK) & (snap.node >= 0)], minlength=len(snap.node_names))
    culprits_on_node = np.bincount(node_of[node_of >= 0], minlength=len(snap.node_names))
    whole = bool(np.all(on_node[nodes] == culprits_on_node[nodes]))
    if nodes.size == 1 or (whole and nodes.size <= max(2, math.ceil(0.05 * job_nodes))):
        confidence = round(base - (0.05 if nodes.size > 1 else 0.0), 2)
        suspects = [(name, confidence, _why(verdict, _describe(r, snap, norm), waiting)) for name, r in per_node]
        return "named", suspects, None, suspects[0][2] if len(suspects) == 1 else f"{len(suspects)} whole machines"
    covering = parallel.smallest_group_covering(job, culprits.tolist())
    if covering is not None:
        members = np.asarray([r for r in covering[1] if r < snap.sig.size], dtype=np.int64)
        group_nodes = sorted({int(n) for n in snap.node[members].tolist() if n >= 0})
        if len(members) < reporting and len(group_nodes) <= max(8, math.ceil(0.25 * job_nodes)):
            hosting = set(nodes.tolist())
            why = f"{_why(verdict, _describe(culprits, snap, norm), waiting)}; they span {nodes.size} machines,"
            why += f" the smallest parallel group covering them is {covering[0]} group {_short_ranges(covering[1], 6)}"
            suspects = [
                (snap.node_names[n], 0.7 if n in hosting else 0.6, why if n in hosting else f"in the same group: {why}")
                for n in sorted(group_nodes, key=lambda n: (n not in hosting, snap.node_names[n]))
            ]
            return "group_fallback", suspects, covering, why
    why = f"{_why(verdict, _describe(culprits, snap, norm), waiting)}; they span {nodes.size} machines"
    return "inconclusive", [], covering, why + " and no small parallel group covers them"


def _why(verdict: _Verdict, culprits: str, waiting: str) -> str:
    """One sentence a person reads: who is where, and what the others do meanwhile."""
    if verdict.basis in ("elsewhere", "no_stack"):
        return f"{culprits} while {waiting}"
    if verdict.basis == "partner":
        return f"{verdict.detail}: {culprits}"
    return f"{verdict.detail}; {waiting}"


def _tree(snap: _Snapshot, norm: _Normalizer, keep: set[int], total: int) -> dict[str, Any]:
    """All ranks' stacks merged outermost-first, pruned: tiny branches go unless they lead to an outlier."""
    root: dict[str, Any] = {"name": "all ranks", "count": 0, "children": {}, "keep": True}
    counts = np.bincount(snap.sig[snap.sig >= 0], minlength=len(norm.sigs)) if norm.sigs else np.zeros(0, int)
    for index in np.flatnonzero(counts).tolist():
        labels = norm.sigs[index].labels[::-1]
        if len(labels) > MAX_TREE_DEPTH:  # keep both ends: the entry point and where the rank is
            head, tail = MAX_TREE_DEPTH // 4, MAX_TREE_DEPTH - MAX_TREE_DEPTH // 4 - 1
            labels = [*labels[:head], f"... {len(labels) - head - tail} frames ...", *labels[-tail:]]
        _insert(root, labels, int(counts[index]), index in keep)
    missing = int((snap.sig == _NO_STACK).sum())
    if missing:
        _insert(root, ["(no stack)"], missing, _NO_STACK in keep)
    return _prune(root, min_count=max(2, math.ceil(0.005 * total)))


def _insert(root: dict[str, Any], labels: list[str], count: int, keep: bool) -> None:
    node = root
    node["count"] += count
    for label in labels:
        child = node["children"].get(label)
        if child is None:
            child = node["children"][label] = {"name": label, "count": 0, "children": {}, "keep": False}
        child["count"] += count
        child["keep"] = child["keep"] or keep
        node = child


def _prune(node: dict[str, Any], *, min_count: int, max_children: int = 12) -> dict[str, Any]:
    children = sorted(node["children"].values(), key=lambda c: (-c["count"], c["name"]))
    kept = [c for i, c in enumerate(children) if c["keep"] or (c["count"] >= min_count and i < max_children)]
    out: dict[str, Any] = {"name": node["name"], "count": node["count"]}
    out["children"] = [_prune(c, min_count=min_count, max_children=max_children) for c in kept]
    rest = sum(c["count"] for c in children) - sum(c["count"] for c in kept)
    if rest > 0:
        other = {"name": f"(other, {len(children) - len(kept)} branches)", "count": rest, "children": []}
        out["children"].append(other)
    return out


def _ids(snap: _Snapshot, ranks: np.ndarray) -> list[int]:
    out = []
    for rank in ranks.tolist():
        pos = int(snap.sample_pos[rank])
        if pos >= 0 and snap.samples[pos].id is not None:
            out.append(int(snap.samples[pos].id))
    return out


def _empty(why: str, unreported: str = "") -> StackAnalysis:
    tree: dict[str, Any] = {"name": "all ranks", "count": 0, "children": []}
    return StackAnalysis([], None, None, [], [], "inconclusive", why, tree, unreported=unreported)


def _unreported(job: JobInfo, snap: _Snapshot) -> str:
    """Ranks the job has (world size or rank map) that sent no sample."""
    world = job.world_size or max((r + 1 for r in job.rank_nodes if isinstance(r, int)), default=0)
    world = min(int(world), _MAX_RANK)
    missing = np.ones(world, dtype=bool)
    seen = np.flatnonzero(snap.sig[:world] != _UNREPORTED)
    missing[seen] = False
    return rank_ranges(np.flatnonzero(missing))


def _analyze(job: JobInfo, snap: _Snapshot, norm: _Normalizer) -> StackAnalysis:
    groups = _groups(snap, norm)
    unreported = _unreported(job, snap)
    stacked = [(i, r) for i, r in groups if i >= 0]
    if not stacked:
        return _empty("no rank has a readable stack", unreported)
    dominant = stacked[0][0]
    verdict = _verdict(job, snap, norm, dominant)
    method, suspects, covering, why = _suspects(job, snap, norm, verdict, dominant)
    reporting = snap.sig >= _NO_STACK
    outliers = np.flatnonzero(reporting & (snap.sig != dominant))
    culprits = verdict.culprits
    # The tree keeps the culprits' branches however thin; with no culprit, a few outlier branches instead.
    keep = {int(i) for i in np.unique(snap.sig[culprits]).tolist()} | {dominant}
    outlier_sigs = np.unique(snap.sig[outliers]).tolist()
    if not culprits.size and len(outlier_sigs) <= 16:
        keep |= {int(i) for i in outlier_sigs}
    first = int(snap.sig[culprits[0]]) if culprits.size else None
    culprit_ids = _ids(snap, culprits[:_EVIDENCE_SIGNALS])
    outlier_ids = _ids(snap, np.setdiff1d(outliers, culprits)[: max(0, _EVIDENCE_SIGNALS - len(culprit_ids))])
    return StackAnalysis(
        groups=[_group_view(i, r, snap, norm) for i, r in groups],
        dominant=norm.sigs[dominant].signature,
        dominant_state=norm.sigs[dominant].cls.state,
        culprit_ranks=culprits.tolist(),
        suspects=suspects,
        method=method,
        why=why,
        tree=_tree(snap, norm, keep, int(reporting.sum())),
        covering_group=covering,
        ranks_reporting=int(reporting.sum()),
        unreported=unreported,
        culprit_frames=norm.sigs[first].labels if first is not None and first >= 0 else [],
        culprit_state=(norm.sigs[first].cls.state if first >= 0 else NO_STACK) if first is not None else None,
        culprit_sample_ids=culprit_ids,
        outlier_sample_ids=outlier_ids,
        sample_ids=len(snap.samples) - [s.id for s in snap.samples].count(None),
    )


def analyze(job: JobInfo, stacks: list[StackSample]) -> StackAnalysis:
    """Group one snapshot of every rank's stack and localize the rank and machine the others wait for."""
    norm = _Normalizer()
    return _analyze(job, _snapshot(job, stacks or [], norm), norm)


# --- findings ----------------------------------------------------------------------------------------------


def _key(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


def _groups_evidence(groups: list[StackGroup], limit: int = 20) -> list[dict[str, Any]]:
    return [
        {
            "signature": g.signature,
            "state": g.state,
            "op": g.op,
            "ranks": _cap(g.ranks),
            "count": g.count,
            "node_count": len(g.nodes),
            "nodes": g.nodes[:10],
            "frames": g.frames[:12],
        }
        for g in groups[:limit]
    ]


def _signals(culprit_ids: list[int], outlier_ids: list[int], total: int) -> tuple[list[dict[str, Any]], int]:
    ids = list(dict.fromkeys(culprit_ids + outlier_ids))[:_EVIDENCE_SIGNALS]
    return [{"type": "stack", "id": i} for i in ids], max(0, total - len(ids))


def findings(job: JobInfo, analysis: StackAnalysis, *, observed_at: datetime, category: str = "hang") -> list[Finding]:
    """One finding per suspect machine, or one job-level 'diagnose' finding when the stacks name nobody."""
    if not analysis.groups:
        return []
    signals, omitted = _signals(analysis.culprit_sample_ids, analysis.outlier_sample_ids, analysis.sample_ids)
    culprits = rank_ranges(analysis.culprit_ranks)
    covering = analysis.covering_group
    evidence: dict[str, Any] = {
        "signals": signals,
        "signals_omitted": omitted,
        "method": analysis.method,
        "why": analysis.why,
        "dominant": analysis.dominant,
        "dominant_state": analysis.dominant_state,
        "groups": _groups_evidence(analysis.groups),
        "culprit_ranks": _short_ranges(analysis.culprit_ranks) if analysis.culprit_ranks else "",
        "culprit_state": analysis.culprit_state,
        "culprit_frames": analysis.culprit_frames[:MAX_TREE_DEPTH],
        "covering_group": {"dim": covering[0], "ranks": _short_ranges(covering[1])} if covering else None,
        "ranks_reporting": analysis.ranks_reporting,
        "unreported": _cap(analysis.unreported),
        "tree": analysis.tree,
    }
    base_key = _key(category, analysis.dominant or "", culprits, analysis.method)
    if analysis.method == "inconclusive":
        suspects: list[tuple[str, float, str]] = []
    else:
        suspects = analysis.suspects
    nobody = f"stacks of {analysis.ranks_reporting} ranks name no machine: {analysis.why}"
    return _findings(job, category, base_key, suspects, evidence, observed_at, nobody=nobody)


def _findings(
    job: JobInfo,
    category: str,
    key: str,
    suspects: list[tuple[str, float, str]],
    evidence: dict[str, Any],
    observed_at: datetime,
    *,
    nobody: str,
) -> list[Finding]:
    """One eviction-grade finding per suspect machine, or one job-level 'diagnose' finding naming nobody."""
    if not suspects:
        return [
            Finding(
                detector="stacks",
                category=category,
                subject_kind="job",
                subject=job.job_id,
                confidence=0.3,
                summary=nobody[:300],
                observed_at=observed_at,
                blame="unknown",
                role="cause",
                action="diagnose",
                key=f"stacks:{category}:job:{key}",
                evidence=evidence,
            )
        ]
    return [
        Finding(
            detector="stacks",
            category=category,
            subject_kind="node",
            subject=node,
            confidence=confidence,
            summary=f"{node}: {why}"[:300],
            observed_at=observed_at,
            node=node,
            blame="infrastructure",
            role="cause",
            action="evict",
            key=f"stacks:{category}:{node}:{key}",
            evidence={**evidence, "why": why},
        )
        for node, confidence, why in suspects
    ]


# --- fail-slow over rounds ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RoundsAnalysis:
    """Stacks taken in rounds seconds apart: the ranks outside the collective in most rounds are stragglers."""

    rounds: int
    informative_rounds: int  # rounds with one clear majority stack
    stragglers: list[int]
    out_counts: dict[int, int]  # rounds each rank stood apart in (the most frequent 50 ranks)
    suspects: list[tuple[str, float, str]]
    method: str  # named, group_fallback, inconclusive
    why: str
    dominant_states: list[str | None]  # per round
    straggler_frames: list[str] = field(default_factory=list)
    straggler_sample_ids: list[int] = field(default_factory=list)
    covering_group: tuple[str, list[int]] | None = None
    # Ranks apart often enough that more rounds could settle them, when none is significant yet.
    leading: list[int] = field(default_factory=list)


_ALPHA = 0.01  # chance that noise alone makes any rank of the job look consistently out
_BASE_RATE_FLOOR = 0.02  # healthy ranks are caught outside the collective at least this often
# A rank apart in this share of the rounds (and in two at least) but not yet significant is worth more rounds:
# a straggler that computes most of a step is still caught beside a computing peer now and then.
_LEAD_SHARE = 0.4
_LEAD_CHANCE = 0.25  # not yet beyond chance, but unlikely enough that more rounds may settle it


def _round_out(snap: _Snapshot, norm: _Normalizer, usual: int) -> tuple[np.ndarray | None, str | None]:
    """Per rank: apart from the ranks dumped beside it in this round; None when the round tells nothing.

    Agents dump when their directive reaches them, so machines are caught at different moments of a step:
    a rank is compared first with the ranks of its own machine (dumped at the same moment), and only a rank
    alone on its machine with the whole round. A tie inside a machine is settled by the job's usual stack.
    """
    counts = np.bincount(snap.sig[snap.sig >= 0], minlength=len(norm.sigs))
    if counts.size == 0 or counts.max() == 0:
        return None, None
    top = np.flatnonzero(counts == counts.max())
    dominant = int(top[0]) if top.size == 1 else -1
    reporting = snap.sig >= _NO_STACK
    state = norm.sigs[dominant].cls.state if dominant >= 0 else None
    if dominant >= 0:
        # When the rest wait in a collective, what matters is who is not waiting; otherwise who differs.
        globally = (snap.state != _CODE[COLLECTIVE]) if state == COLLECTIVE else (snap.sig != dominant)
    else:
        globally = np.zeros(snap.sig.size, dtype=bool)
    apart = reporting & globally
    stacked = np.flatnonzero((snap.sig >= 0) & (snap.node >= 0))
    if stacked.size:
        order = stacked[np.argsort(snap.node[stacked], kind="stable")]
        bounds = np.flatnonzero(np.diff(snap.node[order])) + 1
        for members in np.split(order, bounds):
            if members.size < 2:
                continue  # alone on its machine: the whole round is its reference
            sigs = snap.sig[members]
            local = np.bincount(sigs)
            best = np.flatnonzero(local == local.max())
            major = int(best[0]) if best.size == 1 else (usual if usual in best.tolist() else -1)
            apart[members] = (sigs != major) if major >= 0 else False
    if dominant < 0 and not apart.any():
        return None, None
    return apart, state


def _binomial_tail(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def analyze_rounds(job: JobInfo, rounds: list[list[StackSample]], *, looks: int = 1) -> RoundsAnalysis:
    """Find the ranks standing outside the collective in a majority of rounds while the rest wait for them.

    `looks`: how many times this campaign has been tested as rounds were added (a sequential test): the
    false-alarm budget is split between the looks, so asking again never makes noise more likely to pass.
    """
    norm = _Normalizer()
    snaps = [_snapshot(job, r or [], norm) for r in rounds or []]
    size = max((s.sig.size for s in snaps), default=0)
    out_count = np.zeros(size, dtype=np.int64)
    seen = np.zeros(size, dtype=np.int64)
    states: list[str | None] = []
    informative = 0
    # The job's usual stack over all rounds: what a healthy rank is doing most of the time.
    every = np.concatenate([snap.sig[snap.sig >= 0] for snap in snaps]) if snaps else np.empty(0, dtype=np.int64)
    usual = int(np.bincount(every).argmax()) if every.size else -1
    for snap in snaps:
        out, state = _round_out(snap, norm, usual)
        states.append(state)
        if out is not None:  # only rounds with a clear majority say who stands apart
            informative += 1
            seen[: snap.sig.size] += snap.sig >= _NO_STACK
            out_count[: out.size] += out
    total = len(snaps)
    alpha = _ALPHA / max(1, looks)
    stragglers, apart_leading = _significant(out_count, seen, total, alpha=alpha)
    stuck, stuck_leading, stuck_why = _stuck_in_one_stack(snaps, norm, size, alpha=alpha)
    top = np.argsort(-out_count, kind="stable")[:50]
    counts = {int(r): int(out_count[r]) for r in top.tolist() if out_count[r] > 0}
    if not stragglers.size and not stuck.size:
        why = f"no rank stood apart in a majority of {total} rounds ({informative} with a clear majority stack)"
        leading = sorted(set(apart_leading) | set(stuck_leading))
        return RoundsAnalysis(total, informative, [], counts, [], "inconclusive", why, states, leading=leading)
    if not stragglers.size:  # only the second test spoke: its counts are the evidence
        return _round_suspects(job, snaps, norm, stuck, out_count, informative, states, counts, why=stuck_why)
    return _round_suspects(job, snaps, norm, stragglers, out_count, informative, states, counts)


_STUCK_SHARE = 0.8  # found in one stack in at least this share of its rounds


def _stuck_in_one_stack(
    snaps: list[_Snapshot], norm: _Normalizer, size: int, *, alpha: float
) -> tuple[np.ndarray, list[int], str]:
    """Ranks found in the same non-waiting stack in (nearly) every round, where the other ranks are seldom.

    The second test of the rounds, for a straggler whose peers are not visibly waiting: with few ranks per
    machine, a mate caught computing beside it hides it from the per-machine comparison, but across rounds
    it is always in its own work while the others pass through that stack only now and then. The rate of the
    others is the null hypothesis of a binomial test, split between the job's ranks and the looks as above.
    (stragglers, ranks worth more rounds, why)."""
    if len(snaps) < 3 or size == 0:
        return np.empty(0, dtype=np.int64), [], ""
    sigs = np.full((len(snaps), size), _UNREPORTED, dtype=np.int64)
    for i, snap in enumerate(snaps):
        sigs[i, : snap.sig.size] = snap.sig
    node, _ = _round_nodes(snaps, size)
    valid = sigs >= 0
    rounds_seen = valid.sum(axis=0)
    width = len(norm.sigs)
    # Per rank, its most frequent stack and how often it was there.
    per_rank = np.zeros((size, max(1, width)), dtype=np.int64)
    rows, cols = np.nonzero(valid)
    np.add.at(per_rank, (cols, sigs[rows, cols]), 1)
    mode = per_rank.argmax(axis=1)
    held = per_rank[np.arange(size), mode]
    overall = per_rank.sum(axis=0)
    others_rate = (overall[mode] - held) / np.maximum(1, valid.sum() - rounds_seen)
    waiting = np.array([s.cls.state == COLLECTIVE for s in norm.sigs] or [False], dtype=bool)
    candidates = np.flatnonzero((rounds_seen >= 3) & (held >= _STUCK_SHARE * rounds_seen) & ~waiting[mode])
    ranks = int((rounds_seen > 0).sum())
    keep: list[int] = []
    leading: list[int] = []
    tails: dict[tuple[int, int, float], float] = {}  # few distinct values, even over 16,384 candidates
    for r in candidates.tolist():
        args = (int(held[r]), int(rounds_seen[r]), max(float(others_rate[r]), _BASE_RATE_FLOOR))
        chance = tails.get(args)
        if chance is None:
            chance = tails[args] = _binomial_tail(*args) * ranks
        if chance >= _LEAD_CHANCE:
            continue
        mates = np.flatnonzero((node == node[r]) & (np.arange(size) != r)) if node[r] >= 0 else np.empty(0, int)
        if mates.size and bool((per_rank[mates, mode[r]] >= held[r]).all()):
            continue  # its whole machine sits there as often: the machine's timing (or the machine), not this rank
        if chance < alpha:
            keep.append(r)
        elif chance < _LEAD_CHANCE:
            leading.append(r)
    # As above: a quarter of the job in one place is a role, and so is a lead that large.
    if len(keep) > max(1, ranks // 4):
        keep = []
    if len(leading) > max(1, ranks // 4):
        leading = []
    if not keep:
        return np.empty(0, dtype=np.int64), leading, ""
    first = keep[0]
    why = (
        f"{_who(np.asarray(keep))} {_doing(int(mode[first]), norm)} in {int(held[first])}/{int(rounds_seen[first])}"
        f" rounds, where the other ranks were in {float(others_rate[first]):.0%} of theirs"
    )
    return np.asarray(keep, dtype=np.int64), leading, why


def _significant(out_count: np.ndarray, seen: np.ndarray, total: int, *, alpha: float) -> tuple[np.ndarray, list[int]]:
    """Ranks out in a majority of rounds, and more often than noise at the job's base rate explains; and the
    ranks not there yet that more rounds may settle (out in 40% of them, and unlikely by chance)."""
    if total == 0 or out_count.size == 0:
        return np.empty(0, dtype=np.int64), []
    candidates = np.flatnonzero((out_count >= 2) & (out_count >= _LEAD_SHARE * total))
    rest = np.setdiff1d(np.flatnonzero(seen > 0), candidates[out_count[candidates] * 2 > total])
    base = float(out_count[rest].sum() / max(1, seen[rest].sum())) if rest.size else 0.0
    base = max(base, _BASE_RATE_FLOOR)
    ranks = int((seen > 0).sum())
    tails = {k: _binomial_tail(k, total, base) * ranks for k in np.unique(out_count[candidates]).tolist()}
    keep = [r for r in candidates.tolist() if out_count[r] * 2 > total and tails[int(out_count[r])] < alpha]
    leading = [r for r in candidates.tolist() if r not in keep and tails[int(out_count[r])] < _LEAD_CHANCE]
    # A quarter of the job consistently apart is a different role (a pipeline stage), not a slow machine.
    if len(keep) > max(1, ranks // 4):
        return np.empty(0, dtype=np.int64), []
    return np.asarray(keep, dtype=np.int64), (leading if len(leading) <= max(1, ranks // 4) else [])


def _round_nodes(snaps: list[_Snapshot], size: int) -> tuple[np.ndarray, list[str]]:
    """Per rank, its machine from any round that knew it."""
    node = np.full(size, -1, dtype=np.int64)
    names: dict[str, int] = {}
    for snap in snaps:
        known = np.flatnonzero(snap.node >= 0)
        if known.size:
            node[known] = [names.setdefault(snap.node_names[n], len(names)) for n in snap.node[known].tolist()]
    return node, list(names)


def _who(ranks: np.ndarray) -> str:
    return f"rank {int(ranks[0])}" if ranks.size == 1 else f"ranks {_short_ranges(ranks, 6)}"


def _round_suspects(
    job: JobInfo,
    snaps: list[_Snapshot],
    norm: _Normalizer,
    stragglers: np.ndarray,
    out_count: np.ndarray,
    informative: int,
    states: list[str | None],
    counts: dict[int, int],
    *,
    why: str = "",
) -> RoundsAnalysis:
    total = len(snaps)
    node, node_names = _round_nodes(snaps, out_count.size)
    # The others visibly waiting for the stragglers in most rounds is the strong form of the evidence.
    waited = sum(1 for s in states if s == COLLECTIVE) * 2 > total
    # Apart in (nearly) every round is strong evidence on its own, even where the others' wait is not
    # visible as a collective (DDP waits inside backward).
    # (The stuck-in-one-stack test speaks only for ranks in one place in 80% of the rounds: steady too.)
    steady = bool(why) or (total >= 3 and int(out_count[stragglers].min()) >= 0.8 * total)
    base = 0.85 if waited else (0.8 if steady else 0.7)
    ids: list[int] = []
    frames: list[str] = []
    doing = ""
    for snap in reversed(snaps):  # the latest stacks first
        for rank in stragglers.tolist():
            pos = int(snap.sample_pos[rank]) if rank < snap.sample_pos.size else -1
            if pos >= 0 and snap.samples[pos].id is not None:
                ids.append(int(snap.samples[pos].id))
        first = int(stragglers[0])
        index = int(snap.sig[first]) if first < snap.sig.size else _UNREPORTED
        if not frames and index >= 0 and snap.state[first] != _CODE[COLLECTIVE]:
            frames, doing = norm.sigs[index].labels, " " + _doing(index, norm)
    if not why:
        out_of = ", ".join(f"{int(out_count[r])}/{total}" for r in stragglers[:6].tolist())
        others = "wait in a collective" if waited else "share one stack"
        why = f"{_who(stragglers)}{doing} stood apart in most rounds ({out_of}) while the others {others}"
    hosts = np.unique(node[stragglers][node[stragglers] >= 0])
    result = RoundsAnalysis(total, informative, stragglers.tolist(), counts, [], "inconclusive", why, states)
    result = replace(result, straggler_frames=frames, straggler_sample_ids=ids[:_EVIDENCE_SIGNALS])
    if hosts.size == 1:
        return replace(result, suspects=[(node_names[int(hosts[0])], base, why)], method="named")
    covering = parallel.smallest_group_covering(job, stragglers.tolist())
    if covering is None or not hosts.size:
        return replace(result, why=why + "; no small parallel group covers them")
    members = [r for r in covering[1] if r < node.size]
    group_nodes = sorted({int(n) for n in node[members].tolist() if n >= 0})
    if len(group_nodes) > max(8, math.ceil(0.25 * len(node_names))):
        return replace(result, why=why + f"; their smallest covering group ({covering[0]}) is too large to name")
    hosting = set(hosts.tolist())
    why += f"; they span {hosts.size} machines, smallest covering group {covering[0]} {_short_ranges(covering[1], 6)}"
    suspects = [
        (node_names[n], 0.6 if n in hosting else 0.5, why)
        for n in sorted(group_nodes, key=lambda n: (n not in hosting, node_names[n]))
    ]
    return replace(result, suspects=suspects, method="group_fallback", why=why, covering_group=covering)


def round_findings(
    job: JobInfo, result: RoundsAnalysis, *, observed_at: datetime, category: str = "straggler"
) -> list[Finding]:
    """One finding per machine holding stragglers; nothing when no rank was consistently apart."""
    if not result.stragglers:
        return []
    key = _key(category, rank_ranges(result.stragglers), result.method, str(result.rounds))
    evidence: dict[str, Any] = {
        "signals": [{"type": "stack", "id": i} for i in result.straggler_sample_ids],
        "method": result.method,
        "rounds": result.rounds,
        "informative_rounds": result.informative_rounds,
        "stragglers": _short_ranges(result.stragglers),
        "out_counts": {str(r): c for r, c in list(result.out_counts.items())[:20]},
        "dominant_states": result.dominant_states,
        "straggler_frames": result.straggler_frames[:MAX_TREE_DEPTH],
        "covering_group": (
            {"dim": result.covering_group[0], "ranks": _short_ranges(result.covering_group[1])}
            if result.covering_group
            else None
        ),
    }
    if not result.suspects:
        evidence["why"] = result.why
    nobody = f"stragglers seen in stacks but no machine named: {result.why}"
    return _findings(job, category, key, result.suspects, evidence, observed_at, nobody=nobody)
