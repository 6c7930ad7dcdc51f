"""Collectives the ranks disagree on, as the checks that caught it say so: PyTorch's fingerprint check
(TORCH_DISTRIBUTED_DEBUG=DETAIL), NCCL's own check of the collective calls, and its network transports finding
the two sides of a transfer sized differently.

    RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective:
        CollectiveFingerPrint(SequenceNumber=485, OpType=ALLREDUCE, TensorShape=[25], TensorDtypes=Float, ...),
        but Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=485, OpType=BROADCAST, ...).
        Collectives differ in the following aspects: ...
    init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at and around rank 39.
    host:pid:tid [0] transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 0 peer 10.10.23.6<58683> collective
        mismatch error, local size 496640 remote size 65536
    host:pid:tid [0] NCCL WARN NET/Socket : peer 10.0.0.2<43210> message truncated : receiving 1048576 bytes instead
        of 65536. ... there may be a mismatch in collective sizes or environment settings ...

Each is the application's: the ranks called different collectives, or the same one with different tensors. The event
(`collective_mismatch`) carries the ranks, op types, shapes and dtypes where the message prints them.
"""

from __future__ import annotations

import re
from typing import Any

from agents.parsers.training.common import MAX_MESSAGE, Emit
from agents.parsers.training.nccl import NCCL_LINE, nccl_prefix

_TORCH = "Detected mismatch between collectives"
# "Rank 1 is running collective: CollectiveFingerPrint(" (PyTorch 1.11+; 1.10 said "running inconsistent collective")
_FINGERPRINT = re.compile(r"Rank (\d+) is running (?:inconsistent )?collective: CollectiveFingerPrint\(")
_FP_SEQ = re.compile(r"SequenceNumber=(\d+)")
_FP_OP = re.compile(r"OpType=([A-Z_]+)")
_FP_SHAPE = re.compile(r"TensorShape=(\[[^\]]{0,200}\])")
_FP_DTYPES = re.compile(r"TensorDtypes=([\w, \[\]]+?)(?:, TensorDeviceTypes|\))")
_DIFFER = re.compile(r"Collectives differ in the following aspects:\s*(.+)$")
# NCCL's check of the calls (older NCCL, in its group/proxy code): no host:pid:tid prefix in some launchers' output.
_NCCL_CALLS = re.compile(r"(?:(?P<src>[\w./-]+:\d+) )?NCCL WARN Mismatched collective detected")
_AROUND_RANK = re.compile(r"at and around rank (\d+)")
# NET/IB: the receiver's posted buffer and the sender's message differ in size.
_NET_SIZES = re.compile(
    r"NET/(?P<net>\w+) : .*?peer (?P<peer>[^\s<]+)<(?P<port>\d+)> collective mismatch error, "
    r"local size (?P<local>\d+) remote size (?P<remote>\d+)"
)
# NET/Socket: "message truncated : receiving 1048576 bytes instead of 65536"
_NET_TRUNCATED = re.compile(
    r"NET/(?P<net>\w+) : (?:.*?peer (?P<peer>[^\s<]+)<(?P<port>\d+)> )?message truncated : "
    r"receiving (?P<remote>\d+) bytes instead of (?P<local>\d+)"
)


def rule_collective_mismatch(body: str, low: str, emit: Emit, rank: int | None) -> bool:
    if "ismatch" not in body and "message truncated" not in body:
        return False
    if _TORCH in body:
        emit("collective_mismatch", "error", _torch_fields(body), critical=True)
        return True
    m = _NCCL_CALLS.search(body) if "Mismatched collective detected" in body else None
    if m:
        around = _AROUND_RANK.search(body, m.end())
        fields: dict[str, Any] = {"source": "nccl", "ranks": [int(around.group(1))] if around else []}
        nccl = NCCL_LINE.search(body)
        fields.update(nccl_prefix(nccl) if nccl else {"src": m.group("src")})
        fields["message"] = body[body.find("Mismatched") :].strip()[:MAX_MESSAGE]
        emit("collective_mismatch", "error", fields, critical=True)
        return True
    m = _NET_SIZES.search(body) or _NET_TRUNCATED.search(body)
    if m:
        fields = {
            "source": "nccl_net",
            "ranks": [],
            "transport": m.group("net"),
            "peer": m.group("peer"),
            "peer_port": int(m.group("port")) if m.group("port") else None,
            "local_size": int(m.group("local")),
            "remote_size": int(m.group("remote")),
        }
        nccl = NCCL_LINE.search(body)
        if nccl:
            fields.update(nccl_prefix(nccl))
        fields["message"] = body[m.start() :].strip()[:MAX_MESSAGE]
        emit("collective_mismatch", "error", fields, critical=True)
        return True
    return False


def _torch_fields(body: str) -> dict[str, Any]:
    """Each rank's fingerprint (the reporting rank's first), and what PyTorch says differs."""
    fields: dict[str, Any] = {"source": "pytorch", "ranks": [], "ops": [], "shapes": [], "dtypes": [], "seqs": []}
    starts = list(_FINGERPRINT.finditer(body))
    for i, m in enumerate(starts):
        # The fingerprint nests parentheses (TensorOptions(dtype=float (default), ...)): read up to the next one.
        end = starts[i + 1].start() if i + 1 < len(starts) else len(body)
        part = body[m.end() : end]
        fields["ranks"].append(int(m.group(1)))
        for name, regex in (("ops", _FP_OP), ("shapes", _FP_SHAPE), ("dtypes", _FP_DTYPES)):
            found = regex.search(part)
            fields[name].append(found.group(1).strip() if found else None)
        seq = _FP_SEQ.search(part)
        fields["seqs"].append(int(seq.group(1)) if seq else None)
    differ = _DIFFER.search(body)
    if differ:
        fields["differences"] = " ".join(differ.group(1).split())[:MAX_MESSAGE]
    fields["message"] = body[body.find(_TORCH) :].strip()[:MAX_MESSAGE]
    return fields
