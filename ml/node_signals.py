"""Machine-level signals: network ports (flaps, dead or slow links, error counters, congestion) and host pressure.

Input: a job's node windows as a DataFrame (window_start, last_ts, node, subject and the columns of
ml/node_metrics.py, cumulative counters also as `<column>_max`), one row per node, subject and 10 s window.
Ports are compared with the same port on the job's other machines (a DGX's mlx5_3 with the other DGXs'
mlx5_3), hosts with the other hosts: what every machine shows is the job's or the fabric's behaviour, what
one machine shows alone is that machine's fault. The job-wide summary they are compared with, and the machines
worth a look, are ml/node_summary.py's; the findings are written by ml/node_findings.py.

- flap: a port's link_downed rose, or its state left ACTIVE and came back. One finding per flap, so the
  policy's flap tolerance counts them (a single flap is noise; two within minutes is a bad cable or port).
- down / slow: a port not ACTIVE, or trained at a lower rate, while that port is ACTIVE at full rate on the
  job's other machines, for several windows.
- errors: a port's physical/link error counters rise far faster than the same port's on its peers.
- congestion: a machine whose ports wait to send (port_xmit_wait) or send/receive pause frames at many
  times its peers' rate through the continuity period (Minder: PFC among the most telling metrics).
- memory errors: a host whose memory controllers counted an uncorrected error (EDAC's ue_count rose): its DRAM
  failed under the job (Llama 3's "system memory" interruptions); no peer comparison, one is a fault.
- memory pressure: a host whose PSI memory stall or available memory stands out from its peers' for
  several windows (a slow node for a host reason: diagnose it, the evidence does not prove the hardware).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pandas as pd

from ml import changepoint
from ml.findings import Finding, JobInfo
from ml.metrics import WINDOW_S
from ml.node_findings import _finding, _iso, _port_name, _ref
from ml.node_metrics import (
    EDAC_UE,
    HOST,
    LINK_DOWNED,
    MEM_AVAILABLE_MIB,
    MEM_TOTAL_MIB,
    PAUSE_RX_FRAMES,
    PAUSE_TX_FRAMES,
    PORT_ACTIVE,
    PORT_RATE_GBPS,
    PORT_STATE,
    PSI_MEM_FULL,
    PSI_MEM_SOME,
    SWAP_USED_MIB,
    is_port,
)
from ml.node_summary import (
    AVAILABLE_LOW,
    CONGESTION,
    CONGESTION_FACTOR,
    CONGESTION_FLOOR_PER_S,
    CONTINUITY_S,
    ERRORS_FACTOR,
    ERRORS_MIN,
    PORT_ERRORS,
    PSI_FULL_HIGH,
    PSI_SOME_HIGH,
    RATE_DROP,
    aggregate,
    peer_summary,
)
from ml.quantities import significant

PORT_DOWN = 1.0  # the lowest IB port state; a lower one (0, NOP) says nothing about the link
FLAP_CONFIDENCE = 0.85
PERSIST_WINDOWS = 3  # a dead or slow link, or host pressure, must be seen this many windows in a row
PEER_SHARE = 0.75  # ... while at least this share of the job's other machines show the port healthy
ERRORS_EVICT_PER_MIN = 1000.0
CONGESTION_SHARE = 0.8  # of the continuity period's windows, and the latest one
# ... or a change point (_congestion_onset): sustained windows far over the bar, before the continuity period.
CONGESTION_MIN_RUN = 2
CONGESTION_LOG_CAP = 4.0  # a window counts up to 16 x the bar
CONGESTION_CHANGE_THRESHOLD = 6.0
MIN_PEERS = 2  # peer comparisons need this many other machines
PSI_PEER_QUIET = 5.0  # peers' median PSI some below this: the pressure is the node's, not the workload's


def detect(
    job: JobInfo, windows: Any, *, now: datetime, peers: Mapping[str, Mapping[str, float]] | None = None
) -> list[Finding]:
    """Findings on a job's node windows. `peers` (peer_summary's shape) describes the job's machines when the
    frame holds only the few worth a look; without it the frame is the whole job."""
    frame = _prepare(windows)
    if frame is None:
        return []
    summary = dict(peers) if peers is not None else peer_summary(aggregate(frame))
    found: list[Finding] = []
    for rule in (_flaps, _down_or_slow, _errors, _congestion, _memory_errors, _memory_pressure):
        found += rule(job, frame, now, summary)
    return found


def _prepare(windows: Any) -> pd.DataFrame | None:
    if not isinstance(windows, pd.DataFrame) or windows.empty:
        return None
    if not {"window_start", "node", "subject"} <= set(windows.columns):
        return None
    df = windows.copy()
    df["window_start"] = pd.to_datetime(df["window_start"], utc=True, errors="coerce")
    if "last_ts" in df.columns:
        df["last_ts"] = pd.to_datetime(df["last_ts"], utc=True, errors="coerce")
    else:
        df["last_ts"] = df["window_start"] + pd.Timedelta(seconds=WINDOW_S)
    df = df.dropna(subset=["window_start", "node", "subject"])
    df["node"] = df["node"].astype(str)
    df["subject"] = df["subject"].astype(str)
    return df.sort_values(["node", "subject", "window_start"]).reset_index(drop=True)


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df.columns:
        return pd.Series(math.nan, index=df.index, dtype="float64")
    return pd.to_numeric(df[name], errors="coerce").astype("float64")


def _rises(rows: pd.DataFrame, column: str) -> pd.Series:
    """A cumulative counter's rises between consecutive windows, by the row they rose in (a decrease is a reset, not a
    rise; a window without a reading is skipped, and the rise read across it)."""
    steps = _col(rows, f"{column}_max").dropna().diff()
    return steps[steps > 0]


def _increase(rows: pd.DataFrame, column: str) -> float:
    """How much a cumulative counter rose across consecutive windows."""
    return float(_rises(rows, column).sum())


def _span_s(rows: pd.DataFrame) -> float:
    stamps = rows["last_ts"].dropna()
    return max(float((stamps.max() - stamps.min()).total_seconds()), WINDOW_S) if len(stamps) >= 2 else WINDOW_S


def _ports(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["subject"].map(is_port)]


def _flaps(job: JobInfo, frame: pd.DataFrame, now: datetime, peers: Mapping[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    for (node, subject), rows in _ports(frame).groupby(["node", "subject"]):
        downed = _col(rows, f"{LINK_DOWNED}_max")
        # A state below DOWN (0, NOP) is unknown, not down.
        state = _col(rows, PORT_STATE).where(lambda s: s >= PORT_DOWN)
        # A counter that dips for a window and comes back to exactly where it was (a misread, a reader restarting
        # without its last value) did not rise: only a clear followed by a new count (5, 0, 1) is a flap.
        before_dip = downed.shift(2)
        dip_back = (downed.shift(1) < before_dip) & (downed == before_dip)
        rose = (downed.diff() > 0) & ~dip_back
        # A state drop the counter missed (a driver without link_downed, or a counter at its 8-bit ceiling):
        # down for a window or more between two windows up, with no counter rise next to it.
        was_up = (state >= PORT_ACTIVE).cummax().shift(fill_value=False)
        dropped = (state < PORT_ACTIVE) & was_up & (state.shift(-1) >= PORT_ACTIVE)
        near_rise = rose | rose.shift(1, fill_value=False) | rose.shift(-1, fill_value=False)
        flap_rows = rows[(rose | (dropped & ~near_rise)).to_numpy()]
        if flap_rows.empty:
            continue
        times = [_iso(t) for t in flap_rows["last_ts"]]
        # Each flap named by the counter's value after it: the agent's port watch reports the same flap with the
        # same value seconds earlier, and the policy counts the two as one (service/decisions/service.py).
        # A state drop the counter missed has no such name.
        named = downed.where(rose).loc[flap_rows.index]
        port_flaps = [
            {"port": str(subject), "link_downed": int(v) if math.isfinite(v) else None, "at": _iso(t)}
            for v, t in zip(named, flap_rows["last_ts"], strict=True)
        ]
        errors = sum(_increase(rows, c) for c in PORT_ERRORS)
        for _, row in flap_rows.iterrows():
            count = len(times)
            summary = (
                f"{_port_name(str(subject))} on {node} went down and came back "
                f"({count} flap{'s' if count > 1 else ''} in {_span_s(rows) / 60:.0f} min)"
            )
            found.append(
                _finding(
                    str(node),
                    str(subject),
                    "flap",
                    category="network",
                    confidence=FLAP_CONFIDENCE,
                    action="evict",
                    summary=summary,
                    at=row["last_ts"],
                    evidence={
                        "signals": [_ref(str(node), str(subject), LINK_DOWNED, row["last_ts"])],
                        "times": times,
                        "flaps": count,
                        "port_flaps": port_flaps,
                        "link_errors": int(errors),
                    },
                )
            )
    return found


def _down_or_slow(job: JobInfo, frame: pd.DataFrame, now: datetime, peers: Mapping[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    for (node, subject), rows in _ports(frame).groupby(["node", "subject"]):
        recent = rows.tail(PERSIST_WINDOWS)
        if len(recent) < PERSIST_WINDOWS:
            continue
        node, subject = str(node), str(subject)
        last = recent.iloc[-1]
        state = _col(recent, PORT_STATE)
        if (state < PORT_ACTIVE).all():
            peer = peers.get(subject, {})
            n = int(peer.get("n", 0))
            # The share counts this machine too (down): with four machines, three of four up is 0.75.
            share = float(peer.get("active_share", 0.0)) * n / max(n - 1, 1)
            if n - 1 >= MIN_PEERS and share >= PEER_SHARE:
                found.append(
                    _finding(
                        node,
                        subject,
                        "down",
                        category="network",
                        confidence=0.85,
                        action="evict",
                        summary=f"{_port_name(subject)} on {node} is down while it is up on {share:.0%} of {n} peers",
                        at=last["last_ts"],
                        key_at=recent.iloc[0]["window_start"],
                        evidence={
                            "signals": [_ref(node, subject, PORT_STATE, last["last_ts"], float(state.iloc[-1]))],
                            "times": [_iso(t) for t in recent["last_ts"]],
                            "peer_share": round(share, 3),
                        },
                    )
                )
            continue
        rate = _col(recent, PORT_RATE_GBPS)
        peer = peers.get(subject, {})
        peer_rate = float(peer.get(PORT_RATE_GBPS, math.nan))
        if not (math.isfinite(peer_rate) and peer_rate > 0) or int(peer.get("n", 0)) - 1 < MIN_PEERS:
            continue
        if (rate < RATE_DROP * peer_rate).all():
            value = float(rate.iloc[-1])
            found.append(
                _finding(
                    node,
                    subject,
                    "slow_link",
                    category="network",
                    confidence=0.85,
                    action="evict",
                    summary=(
                        f"{_port_name(subject)} on {node} runs at {significant(value)} Gb/s; "
                        f"the same port on its peers at {significant(peer_rate)} Gb/s"
                    ),
                    at=last["last_ts"],
                    key_at=recent.iloc[0]["window_start"],
                    evidence={
                        "signals": [_ref(node, subject, PORT_RATE_GBPS, last["last_ts"], value)],
                        "times": [_iso(t) for t in recent["last_ts"]],
                        "value": value,
                        "peer_median": peer_rate,
                        "unit": "Gb/s",
                    },
                )
            )
    return found


def _errors(job: JobInfo, frame: pd.DataFrame, now: datetime, peers: Mapping[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    for (node, subject), rows in _ports(frame).groupby(["node", "subject"]):
        node, subject = str(node), str(subject)
        steps = {c: _rises(rows, c) for c in PORT_ERRORS}
        rises = {c: float(v.sum()) for c, v in steps.items()}
        total = sum(rises.values())
        if total < ERRORS_MIN:
            continue
        span = _span_s(rows)
        # No peer with a reading of the port (every node's errs at once: a switch down) is a median of 0, never NaN,
        # which JSON cannot store.
        median = sum(_finite(peers.get(subject, {}).get(c, 0.0)) for c in PORT_ERRORS) * span
        if total < ERRORS_FACTOR * max(median, 1.0):
            continue
        per_min = total / span * 60.0
        heavy = per_min >= ERRORS_EVICT_PER_MIN
        moved = {c: int(v) for c, v in rises.items() if v > 0}
        last = rows.iloc[-1]
        # When the errors came (the windows they rose in), for the flap tolerance: one burst is one occurrence, at
        # its flap if it came with one, not also at the start of the span the count was read over.
        rose = rows.index.isin([i for v in steps.values() for i in v.index])
        found.append(
            _finding(
                node,
                subject,
                "errors",
                category="network",
                confidence=0.85 if heavy else 0.65,
                action="evict" if heavy else "diagnose",
                summary=(
                    f"{_port_name(subject)} on {node}: {int(total)} link errors in {span / 60:.0f} min "
                    f"({', '.join(f'{c} +{v}' for c, v in moved.items())}); peers' median {median:.0f}"
                ),
                at=last["last_ts"],
                key_at=rows.iloc[0]["window_start"],
                evidence={
                    "signals": [_ref(node, subject, c, last["last_ts"]) for c in moved],
                    "times": [_iso(t) for t in rows.loc[rose, "last_ts"]],
                    "counters": moved,
                    "per_minute": round(per_min, 2),
                    "peer_median": round(median, 2),
                },
            )
        )
    return found


def _finite(value: Any) -> float:
    """A number, or 0.0 for None, NaN and infinities."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _rates(rows: pd.DataFrame, column: str) -> pd.Series:
    """Per window, a counter's increase per second since the window before (NaN where it reset)."""
    values = _col(rows, f"{column}_max")
    seconds = rows["last_ts"].diff().dt.total_seconds()
    rate = values.diff() / seconds
    return rate.where(rate >= 0)


def _congestion(job: JobInfo, frame: pd.DataFrame, now: datetime, peers: Mapping[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    end = frame["window_start"].max()
    start = end - pd.Timedelta(seconds=CONTINUITY_S)
    span = frame[frame["window_start"] > start]
    for node, node_rows in span.groupby("node"):
        node = str(node)
        stood_out: dict[str, dict[str, Any]] = {}
        for subject, rows in node_rows.groupby("subject"):
            if not is_port(str(subject)) or len(rows) < 3:
                continue
            peer = peers.get(str(subject), {})
            if int(peer.get("n", 0)) - 1 < MIN_PEERS:
                continue
            for column in CONGESTION:
                median = float(peer.get(column, 0.0) or 0.0)
                floor = CONGESTION_FLOOR_PER_S[column]
                rate = _rates(rows, column).iloc[1:]
                if rate.isna().all():
                    continue
                bar = max(CONGESTION_FACTOR * median, floor)
                high = rate >= bar
                if high.mean() >= CONGESTION_SHARE and bool(high.iloc[-1]):
                    since = len(rows)
                elif (since := _congestion_onset(rate, bar)) is None:
                    continue
                best = stood_out.get(column)
                value = float(rate.iloc[-since:].median())
                if best is None or value > best["value"]:
                    stood_out[column] = {"subject": str(subject), "value": value, "peer_median": median}
                    stood_out[column]["rows"] = rows.iloc[-since:]
        if not stood_out:
            continue
        pauses = PAUSE_TX_FRAMES in stood_out or PAUSE_RX_FRAMES in stood_out
        lead = max(stood_out.values(), key=lambda s: s["value"] / max(s["peer_median"], 1e-9))
        rows = lead["rows"]
        apart_s = float((rows.iloc[-1]["last_ts"] - rows.iloc[0]["window_start"]).total_seconds())
        words = ", ".join(
            f"{c} {s['value']:.0f}/s on {s['subject']} (peers {s['peer_median']:.0f}/s)" for c, s in stood_out.items()
        )
        found.append(
            _finding(
                node,
                lead["subject"],
                "congestion",
                category="network",
                # Pause frames name the machine that cannot keep up; waiting alone may be a victim's.
                confidence=0.85 if pauses else 0.7,
                action="evict" if pauses else "diagnose",
                summary=f"{node}'s network ports stand out from their peers for {apart_s:.0f} s: {words}",
                at=rows.iloc[-1]["last_ts"],
                key_at=rows.iloc[0]["window_start"],
                evidence={
                    "signals": [
                        _ref(node, s["subject"], c, rows.iloc[-1]["last_ts"], s["value"]) for c, s in stood_out.items()
                    ],
                    "times": [_iso(rows.iloc[0]["last_ts"]), _iso(rows.iloc[-1]["last_ts"])],
                    "rates": {c: round(s["value"], 2) for c, s in stood_out.items()},
                    "peer_rates": {c: round(s["peer_median"], 2) for c, s in stood_out.items()},
                    "continuity_s": CONTINUITY_S,
                    "apart_s": round(apart_s, 1),
                },
            )
        )
    return found


def _congestion_onset(rate: pd.Series, bar: float) -> int | None:
    """Windows since a port's congestion began, when a change point says it did (ml/changepoint.py): per window
    the log2 of its rate over the bar (CONGESTION_FACTOR x its peers', at least the floor; capped), summed by a
    CUSUM that a window under the bar drains. A rate far over the bar decides in CONGESTION_MIN_RUN windows, one
    just over it waits for the continuity rule; the latest CONGESTION_MIN_RUN windows must all be over it."""
    values = rate.to_numpy(dtype=float)
    if len(values) < CONGESTION_MIN_RUN or not (values[-CONGESTION_MIN_RUN:] >= bar).all():
        return None
    scores = [max(-CONGESTION_LOG_CAP, min(math.log2(v / bar), CONGESTION_LOG_CAP)) if v > 0 else -1.0 for v in values]
    hit = changepoint.alarm(scores, drift=0.0, threshold=CONGESTION_CHANGE_THRESHOLD)
    return None if hit is None else len(values) - hit.onset


def _memory_errors(job: JobInfo, frame: pd.DataFrame, now: datetime, peers: Mapping[str, Any]) -> list[Finding]:
    """A host whose EDAC uncorrected-error count rose between two of its windows. A count the host brought with it
    (errors before the job, or before a repair) is no rise, and a reboot's reset to 0 is none either."""
    found: list[Finding] = []
    for node, rows in frame[frame["subject"] == HOST].groupby("node"):
        node = str(node)
        rising = _rises(rows, EDAC_UE)
        if rising.empty:
            continue
        rises = rows.loc[rising.index]
        first, last = rises.iloc[0], rises.iloc[-1]
        total = int(rising.sum())
        found.append(
            _finding(
                node,
                HOST,
                "memory_errors",
                category="host",
                confidence=0.85,
                action="evict",
                summary=f"{node}'s memory controllers counted {total} uncorrected memory error{'s' * (total != 1)} "
                "(EDAC): its DRAM failed",
                at=last["last_ts"],
                key_at=first["window_start"],
                evidence={
                    "signals": [
                        _ref(node, HOST, EDAC_UE, last["last_ts"], float(_col(rows, f"{EDAC_UE}_max").loc[last.name]))
                    ],
                    "times": [_iso(t) for t in rises["last_ts"]],
                    "value": total,
                },
            )
        )
    return found


def _memory_pressure(job: JobInfo, frame: pd.DataFrame, now: datetime, peers: Mapping[str, Any]) -> list[Finding]:
    hosts = frame[frame["subject"] == HOST]
    peer = peers.get(HOST, {})
    if int(peer.get("n", 0)) - 1 < MIN_PEERS:
        return []
    found: list[Finding] = []
    for node, rows in hosts.groupby("node"):
        node = str(node)
        recent = rows.tail(PERSIST_WINDOWS)
        if len(recent) < PERSIST_WINDOWS:
            continue
        full, some = _col(recent, PSI_MEM_FULL), _col(recent, PSI_MEM_SOME)
        available = _col(recent, MEM_AVAILABLE_MIB) / _col(recent, MEM_TOTAL_MIB)
        pressed = (full >= PSI_FULL_HIGH) | (some >= PSI_SOME_HIGH) | ((available <= AVAILABLE_LOW) & (some >= 1.0))
        if not pressed.all():
            continue
        peer_some = float(peer.get(PSI_MEM_SOME, math.nan))
        if math.isfinite(peer_some) and peer_some >= PSI_PEER_QUIET:
            continue  # the whole job is under pressure: the workload's, not this machine's
        last = recent.iloc[-1]
        swap = float(_col(recent, SWAP_USED_MIB).iloc[-1])
        avail = float(available.iloc[-1])
        words = f"PSI memory some {float(some.iloc[-1]):.0f}%, full {float(full.iloc[-1]):.0f}% (avg10)"
        if math.isfinite(avail):
            words += f", {avail:.1%} of memory available"
        if math.isfinite(swap) and swap > 0:
            words += f", swap {swap / 1024:.1f} GiB"
        found.append(
            _finding(
                node,
                HOST,
                "memory_pressure",
                category="host",
                confidence=0.75,
                action="diagnose",
                blame="unknown",
                summary=f"host memory pressure on {node}: {words}; peers' PSI some {peer_some:.0f}%",
                at=last["last_ts"],
                key_at=recent.iloc[0]["window_start"],
                evidence={
                    "signals": [_ref(node, HOST, PSI_MEM_SOME, last["last_ts"], float(some.iloc[-1]))],
                    "times": [_iso(t) for t in recent["last_ts"]],
                    "value": round(float(some.iloc[-1]), 2),
                    "peer_median": round(peer_some, 2) if math.isfinite(peer_some) else 0.0,
                    "unit": "%",
                },
            )
        )
    return found
