"""Machine-level signals: network ports (flaps, dead or slow links, error counters, congestion) and host pressure.

Input: a job's node windows as a DataFrame (window_start, last_ts, node, subject and the columns of
ml/node_metrics.py, cumulative counters also as `<column>_max`), one row per node, subject and 10 s window.
Ports are compared with the same port on the job's other machines (a DGX's mlx5_3 with the other DGXs'
mlx5_3), hosts with the other hosts: what every machine shows is the job's or the fabric's behaviour, what
one machine shows alone is that machine's fault.

- flap: a port's link_downed rose, or its state left ACTIVE and came back. One finding per flap, so the
  policy's flap tolerance counts them (a single flap is noise; two within minutes is a bad cable or port).
- down / slow: a port not ACTIVE, or trained at a lower rate, while that port is ACTIVE at full rate on the
  job's other machines, for several windows.
- errors: a port's physical/link error counters rise far faster than the same port's on its peers.
- congestion: a machine whose ports wait to send (port_xmit_wait) or send/receive pause frames at many
  times its peers' rate through the continuity period (Minder: PFC among the most telling metrics).
- memory pressure: a host whose PSI memory stall or available memory stands out from its peers' for
  several windows (a slow node for a host reason: diagnose it, the evidence does not prove the hardware).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from ml.evidence import NodeSignalEvidence, SignalRef
from ml.findings import Finding, JobInfo
from ml.metrics import WINDOW_S
from ml.node_metrics import (
    EXCESSIVE_BUFFER_OVERRUN_ERRORS,
    HOST,
    LINK_DOWNED,
    LINK_ERROR_RECOVERY,
    LOCAL_LINK_INTEGRITY_ERRORS,
    MEM_AVAILABLE_MIB,
    MEM_TOTAL_MIB,
    PAUSE_RX_FRAMES,
    PAUSE_TX_FRAMES,
    PORT_ACTIVE,
    PORT_RATE_GBPS,
    PORT_RCV_ERRORS,
    PORT_STATE,
    PORT_XMIT_DISCARDS,
    PORT_XMIT_WAIT,
    PSI_MEM_FULL,
    PSI_MEM_SOME,
    SWAP_USED_MIB,
    SYMBOL_ERROR,
    is_port,
)
from ml.quantities import significant

DETECTOR = "node_signals"

PORT_ERRORS = (
    SYMBOL_ERROR,
    LINK_ERROR_RECOVERY,
    PORT_RCV_ERRORS,
    LOCAL_LINK_INTEGRITY_ERRORS,
    EXCESSIVE_BUFFER_OVERRUN_ERRORS,
    PORT_XMIT_DISCARDS,
)
CONGESTION = (PORT_XMIT_WAIT, PAUSE_TX_FRAMES, PAUSE_RX_FRAMES)

PORT_DOWN = 1.0  # the lowest IB port state; a lower one (0, NOP) says nothing about the link
FLAP_CONFIDENCE = 0.85
PERSIST_WINDOWS = 3  # a dead or slow link, or host pressure, must be seen this many windows in a row
PEER_SHARE = 0.75  # ... while at least this share of the job's other machines show the port healthy
RATE_DROP = 0.9  # a port below this fraction of its peers' rate trained slower
ERRORS_MIN = 50.0  # new link errors in the lookback before a port's errors are worth a claim
ERRORS_FACTOR = 10.0
ERRORS_EVICT_PER_MIN = 1000.0
CONGESTION_FACTOR = 5.0  # a machine waiting or pausing this many times its peers' median
CONGESTION_FLOOR_PER_S = {PORT_XMIT_WAIT: 1000.0, PAUSE_TX_FRAMES: 50.0, PAUSE_RX_FRAMES: 50.0}
CONGESTION_SHARE = 0.8  # of the continuity period's windows, and the latest one
CONTINUITY_S = 120.0
LOOKBACK_S = 300.0  # the diagnosis pass's lookback (the service's diagnosis_window_s default)
MIN_PEERS = 2  # peer comparisons need this many other machines
PSI_FULL_HIGH = 5.0  # % of the last 10 s all non-idle tasks stalled on memory
PSI_SOME_HIGH = 20.0
AVAILABLE_LOW = 0.03
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
    for rule in (_flaps, _down_or_slow, _errors, _congestion, _memory_pressure):
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


def _increase(rows: pd.DataFrame, column: str) -> float:
    """How much a cumulative counter rose across consecutive windows (a decrease is a reset, not a rise)."""
    values = _col(rows, f"{column}_max").dropna()
    if len(values) < 2:
        return 0.0
    steps = values.diff().dropna()
    return float(steps[steps > 0].sum())


def _span_s(rows: pd.DataFrame) -> float:
    stamps = rows["last_ts"].dropna()
    return max(float((stamps.max() - stamps.min()).total_seconds()), WINDOW_S) if len(stamps) >= 2 else WINDOW_S


# --- one row per machine and subject: what the service computes in SQL over a job's windows --------------------

# The windows a summary reads (window starts): the lookback's first, the continuity period's first, the last two.
# Four windows however long the lookback, so the job-wide summary costs the same every pass; a flap or a drop
# is seen while it is among the last two windows, and its machine's windows are then read whole.
LOOKBACK_RISES = (LINK_DOWNED, *PORT_ERRORS)
ENDS_COLUMNS = (
    "node",
    "subject",
    "first_ts",
    "continuity_ts",
    "last_ts",
    *(f"{end}_{c}" for c in LOOKBACK_RISES for end in ("first", "continuity", "last")),
    *(f"{end}_{c}" for c in CONGESTION for end in ("continuity", "last")),
    "down_lately",  # the port's state below ACTIVE in one of the last two windows
    PORT_STATE,  # the last window's
    PORT_RATE_GBPS,
    PSI_MEM_SOME,
    PSI_MEM_FULL,
    "available_share",  # MemAvailable / MemTotal
)
AGGREGATE_COLUMNS = (
    "node",
    "subject",
    "span_s",
    "continuity_span_s",
    *(f"rise_{c}" for c in (*LOOKBACK_RISES, *CONGESTION)),
    "down_lately",
    PORT_STATE,
    PORT_RATE_GBPS,
    PSI_MEM_SOME,
    PSI_MEM_FULL,
    "available_share",
)


def summary_windows(last: datetime, lookback_s: float = LOOKBACK_S) -> dict[str, datetime]:
    """The window starts a summary reads, for the newest closed window starting at `last`."""
    return {
        "first": last - timedelta(seconds=lookback_s - WINDOW_S),
        "continuity": last - timedelta(seconds=CONTINUITY_S - WINDOW_S),
        "previous": last - timedelta(seconds=WINDOW_S),
        "last": last,
    }


def ends(frame: pd.DataFrame) -> pd.DataFrame:
    """ENDS_COLUMNS from windows (the service reads the same from SQL): each machine's values at the summary's
    windows."""
    at = summary_windows(frame["window_start"].max().to_pydatetime())
    rows = []
    for (node, subject), g in frame.groupby(["node", "subject"]):
        by_start = g.set_index("window_start")
        value = functools.partial(_value_at, by_start, at)
        out: dict[str, Any] = {"node": node, "subject": subject}
        for when in ("first", "continuity", "last"):
            stamp = pd.Timestamp(at[when])
            out[f"{when}_ts"] = by_start.at[stamp, "last_ts"] if stamp in by_start.index else pd.NaT
        for c in LOOKBACK_RISES:
            out[f"first_{c}"], out[f"last_{c}"] = value("first", f"{c}_max"), value("last", f"{c}_max")
            out[f"continuity_{c}"] = value("continuity", f"{c}_max")
        for c in CONGESTION:
            out[f"continuity_{c}"], out[f"last_{c}"] = value("continuity", f"{c}_max"), value("last", f"{c}_max")
        out["down_lately"] = bool(min(value("previous", PORT_STATE), value("last", PORT_STATE)) < PORT_ACTIVE)
        for c in (PORT_STATE, PORT_RATE_GBPS, PSI_MEM_SOME, PSI_MEM_FULL):
            out[c] = value("last", c)
        out["available_share"] = value("last", MEM_AVAILABLE_MIB) / value("last", MEM_TOTAL_MIB)
        rows.append(out)
    return pd.DataFrame(rows, columns=list(ENDS_COLUMNS))


def _value_at(by_start: pd.DataFrame, at: Mapping[str, datetime], when: str, column: str) -> float:
    stamp = pd.Timestamp(at[when])
    if stamp not in by_start.index or column not in by_start.columns:
        return math.nan
    return float(by_start.at[stamp, column])


def _rise(first: pd.Series, last: pd.Series) -> pd.Series:
    """last - first; a counter that went down was reset, and what it holds now is its rise since."""
    first, last = pd.to_numeric(first, errors="coerce"), pd.to_numeric(last, errors="coerce")
    # Unknown (NaN) where either end is: no window there yet, or a counter the driver lacks. Not the counter's
    # whole value, which would read as a burst of errors on every machine that joined late.
    return (last - first).where(last >= first, last).where(first.notna() & last.notna())


def _seconds(first: pd.Series, last: pd.Series) -> pd.Series:
    first, last = pd.to_datetime(first, utc=True, errors="coerce"), pd.to_datetime(last, utc=True, errors="coerce")
    return (last - first).dt.total_seconds().fillna(WINDOW_S).clip(lower=WINDOW_S)


def aggregate_ends(table: pd.DataFrame) -> pd.DataFrame:
    """Per machine and subject: counter rises and spans (AGGREGATE_COLUMNS) from its ends."""
    if table is None or table.empty:
        return pd.DataFrame(columns=list(AGGREGATE_COLUMNS))
    out = table[["node", "subject"]].copy()
    # A machine younger than the lookback (a new job, a late joiner) is judged from the continuity period on.
    young = pd.to_datetime(table["first_ts"], utc=True, errors="coerce").isna()
    first_ts = table["first_ts"].where(~young, table["continuity_ts"])
    out["span_s"] = _seconds(first_ts, table["last_ts"])
    out["continuity_span_s"] = _seconds(table["continuity_ts"], table["last_ts"])
    for c in LOOKBACK_RISES:
        first = table[f"first_{c}"].where(~young, table[f"continuity_{c}"])
        out[f"rise_{c}"] = _rise(first, table[f"last_{c}"])
    for c in CONGESTION:
        out[f"rise_{c}"] = _rise(table[f"continuity_{c}"], table[f"last_{c}"])
    out["down_lately"] = table["down_lately"].fillna(False).astype(bool)
    for c in (PORT_STATE, PORT_RATE_GBPS, PSI_MEM_SOME, PSI_MEM_FULL, "available_share"):
        out[c] = pd.to_numeric(table[c], errors="coerce").astype("float64")
    return out[list(AGGREGATE_COLUMNS)]


def aggregate(frame: pd.DataFrame) -> pd.DataFrame:
    """AGGREGATE_COLUMNS from a whole job's windows."""
    return aggregate_ends(ends(frame))


def peer_summary(aggregates: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per subject, the job's machines: how many, the share with the port ACTIVE, the median rate and PSI, and
    each counter's median rise per second."""
    out: dict[str, dict[str, float]] = {}
    if aggregates is None or aggregates.empty:
        return out
    for subject, rows in aggregates.groupby("subject"):
        summary: dict[str, float] = {"n": float(rows["node"].nunique())}
        state = pd.to_numeric(rows[PORT_STATE], errors="coerce")
        summary["active_share"] = float((state >= PORT_ACTIVE).mean())
        summary[PORT_RATE_GBPS] = _median(rows[PORT_RATE_GBPS])
        summary[PSI_MEM_SOME] = _median(rows[PSI_MEM_SOME])
        span = pd.to_numeric(rows["span_s"], errors="coerce").clip(lower=WINDOW_S)
        recent_span = pd.to_numeric(rows["continuity_span_s"], errors="coerce").clip(lower=WINDOW_S)
        for c in PORT_ERRORS:
            summary[c] = _median(pd.to_numeric(rows[f"rise_{c}"], errors="coerce") / span)
        for c in CONGESTION:
            summary[c] = _median(pd.to_numeric(rows[f"rise_{c}"], errors="coerce") / recent_span)
        out[str(subject)] = summary
    return out


def _median(values: pd.Series) -> float:
    clean = pd.to_numeric(values, errors="coerce").dropna()
    return float(clean.median()) if not clean.empty else math.nan


def worth_a_look(aggregates: pd.DataFrame, peers: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The machines a rule could fire on (a superset): the service reads only their windows. Vectorized: at
    16,384 GPUs this judges about 18,000 rows every pass."""
    if aggregates is None or aggregates.empty:
        return []
    a = aggregates.reset_index(drop=True)
    peer = pd.DataFrame.from_dict({k: dict(v) for k, v in peers.items()}, orient="index")
    peer = peer.reindex(a["subject"].astype(str).to_numpy()).reset_index(drop=True)

    def own(column: str) -> pd.Series:
        return pd.to_numeric(a[column], errors="coerce").astype("float64")

    def theirs(column: str) -> pd.Series:
        values = peer[column] if column in peer.columns else pd.Series(math.nan, index=a.index)
        return pd.to_numeric(values, errors="coerce").astype("float64")

    span = own("span_s").fillna(WINDOW_S).clip(lower=WINDOW_S)
    recent_span = own("continuity_span_s").fillna(WINDOW_S).clip(lower=WINDOW_S)
    errors = sum((own(f"rise_{c}").fillna(0.0) for c in PORT_ERRORS), pd.Series(0.0, index=a.index))
    peer_errors = sum((theirs(c).fillna(0.0) for c in PORT_ERRORS), pd.Series(0.0, index=a.index)) * span
    congested = pd.Series(False, index=a.index)
    for c in CONGESTION:
        bar = (CONGESTION_FACTOR * theirs(c).fillna(0.0)).clip(lower=CONGESTION_FLOOR_PER_S[c])
        congested |= own(f"rise_{c}").fillna(0.0) / recent_span >= bar
    pressed = (a["subject"] == HOST) & (
        (own(PSI_MEM_SOME) >= PSI_SOME_HIGH)
        | (own(PSI_MEM_FULL) >= PSI_FULL_HIGH)
        | (own("available_share") <= AVAILABLE_LOW)
    )
    worth = (
        (own(f"rise_{LINK_DOWNED}").fillna(0.0) > 0)
        | a["down_lately"].fillna(False).astype(bool)
        | (own(PORT_RATE_GBPS) < RATE_DROP * theirs(PORT_RATE_GBPS))
        | ((errors >= ERRORS_MIN) & (errors >= ERRORS_FACTOR * peer_errors.clip(lower=1.0)))
        | congested
        | pressed
    )
    return sorted({str(n) for n in a.loc[worth, "node"]})


def _port_name(subject: str) -> str:
    kind, _, name = subject.partition(":")
    return f"{'InfiniBand' if kind == 'ib' else 'RoCE' if kind == 'roce' else 'Ethernet'} port {name}"


def _iso(ts: Any) -> str:
    return pd.Timestamp(ts).isoformat()


def _dt(ts: Any) -> datetime:
    stamp = pd.Timestamp(ts)
    return (stamp.tz_localize(UTC) if stamp.tzinfo is None else stamp).to_pydatetime()


def _ref(node: str, subject: str, column: str, ts: Any, value: float | None = None) -> SignalRef:
    ref: SignalRef = {"type": "node_metric", "node": node, "subject": subject, "metric": column, "ts": _iso(ts)}
    if value is not None and math.isfinite(value):
        ref["value"] = round(value, 3)
    return ref


def _finding(
    node: str,
    subject: str,
    rule: str,
    *,
    category: str,
    confidence: float,
    action: str,
    summary: str,
    at: Any,
    evidence: NodeSignalEvidence,
    blame: str = "infrastructure",
    key_at: Any | None = None,
) -> Finding:
    stamp = pd.Timestamp(key_at if key_at is not None else at)
    # A state that persists (`key_at`: the start of the windows it was seen in, which slide every pass) is one
    # series: each pass moves its one row (latest figures, last seen) rather than adding a near-identical one.
    persists = key_at is not None
    return Finding(
        detector=DETECTOR,
        category=category,
        subject_kind="node",
        subject=node,
        confidence=confidence,
        summary=summary,
        observed_at=_dt(at),
        node=node,
        blame=blame,
        action=action,
        key=f"{rule}:{node}:{subject}:{stamp.strftime('%Y%m%dT%H%M%S')}",
        series=f"{rule}:{node}:{subject}" if persists else "",
        seen_until=_dt(at) if persists else None,
        evidence={**evidence, "rule": rule, "subject": subject},
    )


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
        rises = {c: _increase(rows, c) for c in PORT_ERRORS}
        total = sum(rises.values())
        if total < ERRORS_MIN:
            continue
        span = _span_s(rows)
        median = sum(peers.get(subject, {}).get(c, 0.0) or 0.0 for c in PORT_ERRORS) * span
        if total < ERRORS_FACTOR * max(median, 1.0):
            continue
        per_min = total / span * 60.0
        heavy = per_min >= ERRORS_EVICT_PER_MIN
        moved = {c: int(v) for c, v in rises.items() if v > 0}
        last = rows.iloc[-1]
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
                    "times": [_iso(rows.iloc[0]["last_ts"]), _iso(last["last_ts"])],
                    "counters": moved,
                    "per_minute": round(per_min, 2),
                    "peer_median": round(median, 2),
                },
            )
        )
    return found


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
                high = rate >= max(CONGESTION_FACTOR * median, floor)
                if high.mean() >= CONGESTION_SHARE and bool(high.iloc[-1]):
                    best = stood_out.get(column)
                    value = float(rate.median())
                    if best is None or value > best["value"]:
                        stood_out[column] = {"subject": str(subject), "value": value, "peer_median": median}
                        stood_out[column]["rows"] = rows
        if not stood_out:
            continue
        pauses = PAUSE_TX_FRAMES in stood_out or PAUSE_RX_FRAMES in stood_out
        lead = max(stood_out.values(), key=lambda s: s["value"] / max(s["peer_median"], 1e-9))
        rows = lead["rows"]
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
                summary=f"{node}'s network ports stand out from their peers for {CONTINUITY_S / 60:.0f} min: {words}",
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
