"""The GPU-metric detectors of one pass, on stored windows, each reading only what its pass needs.

- peers: one span summary (ml.peers.summarize_span) per window that closed since the job's last pass, kept
  in the detector's state; the continuity check then runs on the kept summaries (sparse: only the GPUs far
  from their peers), so a pass reads a few windows however long the job has run. The recurrence check
  (ml.recurrence) reads the outliers of the spans kept over its longer horizon.
- progress's GPU activity: the job's median GPU per window, computed in SQL as windows close, kept in state.
- counters: one aggregate over the lookback per GPU in SQL (how much each error counter rose, when the GPU
  last reported), then the exact rules of ml.counters on the windows of the few nodes worth a look.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import text
from sqlalchemy.orm import Session

from ml import (
    counters,
    error_rates,
    node_metrics,
    node_signals,
    node_summary,
    peer_spans,
    peers,
    progress,
    recurrence,
)
from ml.findings import Finding, JobInfo
from ml.metrics import (
    GPU_UTIL,
    METRIC_COLUMNS,
    PCIE_LINK_GEN,
    PCIE_LINK_WIDTH,
    PCIE_MAX_LINK_GEN,
    PCIE_MAX_LINK_WIDTH,
    POWER_LIMIT,
    ROW_REMAP_FAILURE,
    SM_ACTIVE,
    TENSOR_ACTIVE,
    WINDOW_MAX_COLUMNS,
    WINDOW_S,
    XID_LAST,
)
from ml.windows import to_samples
from service.diagnosis import state, windows
from service.models import Job

PEERS_VERSION = 1
NODE_SIGNALS_VERSION = 1
ACTIVITY_VERSION = 1
CONTINUITY_S = 120.0
_PEER_SPANS = round(CONTINUITY_S / peers.SPAN_S) * peers.HISTORY_FACTOR
# How many windows a cold start (no state) summarizes at most: the spans the continuity check looks at.
_PEER_HISTORY_S = _PEER_SPANS * peers.SPAN_S
# How long kept spans stay: the recurrence rule's horizon. Beyond the continuity history only its outliers are
# kept (no per-GPU distances, which only the continuity check's support reads): a few entries per span.
_PEER_KEEP_S = max(_PEER_HISTORY_S, recurrence.HORIZON_S)


def _outliers_only(span: dict[str, Any]) -> dict[str, Any]:
    return {
        "active": span.get("active", False),
        "steady": span.get("steady", True),
        "metrics": {m: {"out": v["out"]} for m, v in span.get("metrics", {}).items() if v.get("out")},
    }


def _peer_columns() -> list[str]:
    columns = [*peers.DEFAULT_PRIORITY, POWER_LIMIT, SM_ACTIVE, TENSOR_ACTIVE, GPU_UTIL]
    columns += [f"{c}_max" for c in peers.DEFAULT_PRIORITY if peers.SPECS[c].counter]
    return columns


def peer_ends(session: Session, *, job: Job, closed: datetime) -> list[datetime]:
    """The ends of the spans a pass summarizes (newest first): every window boundary since the last pass, at most
    the continuity check's history back (a cold start)."""
    cursor, _ = state.load(session, job_id=job.id, detector="peers", version=PEERS_VERSION)
    return _ends(cursor, closed)


def _ends(cursor: datetime | None, closed: datetime) -> list[datetime]:
    oldest = closed - timedelta(seconds=_PEER_HISTORY_S)
    first = max(cursor + timedelta(seconds=WINDOW_S), oldest) if cursor is not None else oldest
    ends = []
    end = closed
    while end >= first:
        ends.append(end)
        end -= timedelta(seconds=WINDOW_S)
    return ends


def peer_parts(
    session: Session,
    *,
    job: Job,
    info: JobInfo,
    ends: list[datetime],
    names: dict[int, str],
    node_ids: list[int] | None = None,
) -> dict[str, peer_spans.SpanPart]:
    """Per span end (ISO), the per-GPU half of its summary (ml.peer_spans.span_part) over the job's windows, or
    over those of `node_ids` only (one node group of a split pass)."""
    if not ends:
        return {}
    rolled = windows.read(
        session,
        job=job,
        start=min(ends) - timedelta(seconds=peers.SPAN_S + WINDOW_S),
        end=max(ends),
        columns=_peer_columns(),
        names=names,
        node_ids=node_ids,
    )
    # Unit names and start times once for the frame: a cold start summarizes 24 spans of it, and building them
    # again for every span was most of a cold pass's peer stage.
    rolled["unit"] = peer_spans.unit_names(rolled)
    starts = pd.to_datetime(rolled["window_start"], utc=True)
    parts = {}
    for end in ends:
        begin = pd.Timestamp(end) - pd.Timedelta(seconds=peers.SPAN_S + WINDOW_S)
        rows = rolled[(starts >= begin) & (starts < pd.Timestamp(end))]
        parts[end.isoformat()] = peer_spans.span_part(info, rows, end=end, span_s=peers.SPAN_S)
    return parts


def peer_findings(
    session: Session,
    *,
    job: Job,
    info: JobInfo,
    closed: datetime,
    names: dict[int, str],
    now: datetime,
    parts: dict[str, list[peer_spans.SpanPart]] | None = None,
) -> list[Finding]:
    """Summarize the spans ending at every window boundary since the last pass, then compare peers. `parts`: the
    node groups' parts of spans a split pass computed on other workers (by end); a span they lack, or whose
    parts disagree on the activity gauge, is computed here from all the job's windows."""
    cursor, kept = state.load(session, job_id=job.id, detector="peers", version=PEERS_VERSION)
    spans: dict[str, Any] = kept.get("spans", {})
    oldest = closed - timedelta(seconds=_PEER_HISTORY_S)
    todo = []
    for end in _ends(cursor, closed):
        given = (parts or {}).get(end.isoformat())
        summary = peer_spans.judge_span(info, given, span_s=peers.SPAN_S) if given is not None else None
        if summary is None:
            todo.append(end)
        else:
            spans[end.isoformat()] = summary
    for key, part in peer_parts(session, job=job, info=info, ends=todo, names=names).items():
        judged = peer_spans.judge_span(info, [part], span_s=peers.SPAN_S)
        if judged is not None:  # always: one part agrees with itself on the gauge
            spans[key] = judged
    keep_from = closed - timedelta(seconds=_PEER_KEEP_S)
    spans = {
        k: v if end > oldest else _outliers_only(v)
        for k, v in spans.items()
        if (end := datetime.fromisoformat(k)) > keep_from
    }
    if cursor is None or closed > cursor:
        state.save(
            session,
            job_id=job.id,
            detector="peers",
            version=PEERS_VERSION,
            cursor=closed,
            state={"spans": spans},
            now=now,
        )
    return peers.from_spans(
        info, spans, latest_end=closed, span_s=peers.SPAN_S, continuity_s=CONTINUITY_S, horizon_s=recurrence.HORIZON_S
    )


_ACTIVITY_SQL = text(
    "SELECT extract(epoch FROM window_start)::bigint AS bucket, "
    + ", ".join(f"percentile_cont(0.5) WITHIN GROUP (ORDER BY {c}) AS {c}" for c in progress.ACTIVITY_COLUMNS)
    + ", count(*) FILTER (WHERE fb_used >= :alive) AS gpus_alive, count(fb_used) AS gpus_seen "
    "FROM metric_windows WHERE job_id = :job AND window_start >= :lo AND window_start < :hi "
    "GROUP BY window_start"
)


def job_activity(
    session: Session, *, job: Job, closed: datetime, lookback_s: float, now: datetime
) -> pd.DataFrame | None:
    """The job's median GPU per window (progress.job_activity's shape), the new windows added to the kept."""
    cursor, kept = state.load(session, job_id=job.id, detector="activity", version=ACTIVITY_VERSION)
    buckets: dict[str, Any] = kept.get("buckets", {})
    oldest = closed - timedelta(seconds=lookback_s)
    lo = max(cursor, oldest) if cursor is not None else oldest
    if lo < closed:
        rows = session.execute(
            _ACTIVITY_SQL, {"job": job.id, "lo": lo, "hi": closed, "alive": progress.FB_USED_ALIVE_MIB}
        ).mappings()
        for row in rows:
            buckets[str(row["bucket"])] = {k: v for k, v in row.items() if k != "bucket"}
    buckets = {k: v for k, v in buckets.items() if int(k) >= oldest.timestamp()}
    if cursor is None or closed > cursor:
        state.save(
            session,
            job_id=job.id,
            detector="activity",
            version=ACTIVITY_VERSION,
            cursor=closed,
            state={"buckets": buckets},
            now=now,
        )
    if not buckets:
        return None
    frame = pd.DataFrame.from_dict(buckets, orient="index").astype("float64")
    frame.index = frame.index.astype("int64")
    if not frame["gpus_seen"].max() > 0:
        frame = frame.drop(columns=["gpus_alive", "gpus_seen"])
    return frame.dropna(axis=1, how="all").sort_index()


# The counters each rule watches: uncorrectable errors, the peer-compared error rates, and the states.
_UNCORRECTABLE = tuple(counters.UNCORRECTABLE)
_PEER_COUNTED = tuple(dict.fromkeys(c for cols in error_rates.PEER_MEDIANS.values() for c in cols))


_PENDING = tuple(counters.PENDING)
_PCIE_LINK = (PCIE_LINK_WIDTH, PCIE_MAX_LINK_WIDTH, PCIE_LINK_GEN, PCIE_MAX_LINK_GEN, GPU_UTIL)


def _delta(columns: tuple[str, ...]) -> str:
    """The counters' rises added up over those the GPU reports: a counter a node never reports (dcgm-exporter's
    default field list leaves the NVLink and volatile ECC ones out) must not make the sum NULL and hide the
    others. NULL only when none of them is known."""
    rows = ", ".join(f"(l.{c}_max - f.{c}_max)" for c in columns)
    return f"(SELECT sum(d) FROM (VALUES {rows}) AS rises(d))"


# Per GPU: the first window of the lookback against its newest one (of the last two), so a pass reads three
# windows however long the lookback: how much each watched counter rose (negative: it reset), whether the
# Xid code or the remap-failure state moved, and when the GPU last reported against its node.
_COUNTER_SQL = text(
    "WITH first AS ("
    "  SELECT node_id, gpu, " + ", ".join(f"{c}_max" for c in (*_UNCORRECTABLE, *_PEER_COUNTED, XID_LAST)) + " "
    "  FROM metric_windows WHERE job_id = :job AND window_start = (SELECT min(window_start) FROM metric_windows "
    "    WHERE job_id = :job AND window_start >= :lo AND window_start < :hi)"
    "), last AS ("
    "  SELECT DISTINCT ON (node_id, gpu) node_id, gpu, last_ts, "
    + ", ".join(f"{c}_max" for c in (*_UNCORRECTABLE, *_PEER_COUNTED, XID_LAST, ROW_REMAP_FAILURE, *_PENDING))
    + ", "
    + ", ".join(_PCIE_LINK)
    + "  FROM metric_windows WHERE job_id = :job AND window_start >= :recent AND window_start < :hi "
    "  ORDER BY node_id, gpu, window_start DESC"
    "), g AS ("
    "  SELECT coalesce(l.node_id, f.node_id) AS node_id, l.last_ts, l.node_id IS NULL AS gone, "
    f"   {_delta(_UNCORRECTABLE)} AS uncorrectable, "
    + ", ".join(f"{_delta(cols)} AS {name}" for name, cols in error_rates.PEER_MEDIANS.items())
    + f",   coalesce(l.{ROW_REMAP_FAILURE}_max, 0) > 0 AS remap_failure, "
    + " OR ".join(f"coalesce(l.{c}_max, 0) > 0" for c in _PENDING)
    + " AS pending, "
    f"   l.{PCIE_LINK_WIDTH} < l.{PCIE_MAX_LINK_WIDTH} "
    f"     OR (l.{PCIE_LINK_GEN} < l.{PCIE_MAX_LINK_GEN} AND l.{GPU_UTIL} >= :busy) AS link_down, "
    f"   l.{XID_LAST}_max IS DISTINCT FROM f.{XID_LAST}_max AND f.node_id IS NOT NULL AS xid_changed "
    "  FROM first f FULL JOIN last l ON l.node_id = f.node_id AND l.gpu = f.gpu"
    "), judged AS ("
    "  SELECT *, (max(last_ts) OVER (PARTITION BY node_id) - last_ts) >= make_interval(secs => :quiet) "
    "    OR (gone AND count(last_ts) OVER (PARTITION BY node_id) > 0) AS quiet FROM g"
    ") SELECT "
    + ", ".join(
        f"percentile_cont(0.5) WITHIN GROUP (ORDER BY greatest(coalesce({name}, 0), 0)) AS {name}"
        for name in error_rates.PEER_MEDIANS
    )
    + ", array_agg(DISTINCT node_id) FILTER (WHERE quiet OR remap_failure OR xid_changed OR pending OR link_down "
    "  OR coalesce(uncorrectable, 0) <> 0 OR nvlink >= :nvlink OR nvlink_recovery <> 0 OR pcie >= :pcie "
    "  OR nvlink < 0 OR pcie < 0) AS worth "
    "FROM judged"
)


def counter_findings(
    session: Session,
    *,
    job: Job,
    info: JobInfo,
    closed: datetime,
    lookback_s: float,
    names: dict[int, str],
    now: datetime,
) -> list[Finding]:
    """ml.counters on the nodes whose GPUs' counters moved (or whose GPUs went quiet) in the lookback."""
    lo = closed - timedelta(seconds=lookback_s)
    params = {
        "job": job.id,
        "lo": lo,
        "hi": closed,
        "recent": closed - timedelta(seconds=2 * WINDOW_S),
        "quiet": counters.LOST_MIN_S,
        "nvlink": error_rates.NVLINK_MIN_ERRORS,
        "pcie": error_rates.PCIE_MIN_REPLAYS,
        "busy": counters.PCIE_BUSY_UTIL,
    }
    summary = session.execute(_COUNTER_SQL, params).mappings().one()
    nodes = sorted(summary["worth"] or [])
    if not nodes:
        return []
    medians = {name: float(summary[name] or 0.0) for name in error_rates.PEER_MEDIANS}
    rolled = windows.read(
        session,
        job=job,
        start=lo,
        end=closed,
        columns=[*METRIC_COLUMNS, *(f"{c}_max" for c in WINDOW_MAX_COLUMNS)],
        names=names,
        node_ids=nodes,
    )
    samples = to_samples(rolled.sort_values(["node", "gpu", "window_start"]))
    return counters.detect(info, samples, now=now, peer_medians=medians)


def _at(when: str, column: str) -> str:
    return f"max({column}) FILTER (WHERE window_start = :{when})"


def _rise(first: str, last: str) -> str:
    """A counter's rise between two windows; one that went down was reset and holds its rise since. NULL where
    either end is (no window there yet, a counter the driver lacks): unknown, left out of the peers' medians."""
    return f"CASE WHEN {last} >= {first} THEN {last} - {first} WHEN {first} IS NOT NULL THEN {last} END"


def _seconds(first: str, last: str) -> str:
    return f"greatest(coalesce(extract(epoch FROM {last} - {first}), :window), :window)"


def _median(expression: str) -> str:
    return f"percentile_cont(0.5) WITHIN GROUP (ORDER BY {expression})"


_NS = node_summary
_GAUGES_AT_LAST = (
    node_metrics.PORT_STATE,
    node_metrics.PORT_RATE_GBPS,
    node_metrics.PSI_MEM_SOME,
    node_metrics.PSI_MEM_FULL,
)
# What ml.node_summary computes from a whole job's windows (ends, aggregate_ends, peer_summary, worth_a_look), in
# SQL over the four windows a summary reads (ml.node_summary.summary_windows): an index lookup of four windows
# of the job whatever the lookback, one row per machine and subject, then per subject the job's medians, and the
# machines worth a look. A test holds the two to the same findings.
_NODE_SQL = text(
    "WITH e AS (SELECT node_id, subject, "
    + ", ".join(
        [
            *(f"{_at(when, 'last_ts')} AS {when}_ts" for when in ("first", "continuity", "last")),
            *(f"{_at(w, c + '_max')} AS {w}_{c}" for c in _NS.LOOKBACK_RISES for w in ("first", "continuity", "last")),
            *(f"{_at(w, c + '_max')} AS {w}_{c}" for c in _NS.CONGESTION for w in ("continuity", "last")),
            "coalesce(bool_or(port_state < :active) FILTER (WHERE window_start >= :previous), false) AS down_lately",
            *(f"{_at('last', c)} AS {c}" for c in _GAUGES_AT_LAST),
            f"{_at('last', 'mem_available_mib / nullif(mem_total_mib, 0)')} AS available_share",
        ]
    )
    + " FROM node_windows WHERE job_id = :job AND window_start IN (:first, :continuity, :previous, :last) "
    "GROUP BY node_id, subject"
    "), a AS (SELECT node_id, subject, down_lately, available_share, "
    + ", ".join(
        [
            *_GAUGES_AT_LAST,
            # A machine younger than the lookback (a new job, a late joiner): from the continuity period on.
            f"{_seconds('coalesce(first_ts, continuity_ts)', 'last_ts')} AS span_s",
            f"{_seconds('continuity_ts', 'last_ts')} AS continuity_span_s",
            *(
                f"{_rise(f'CASE WHEN first_ts IS NULL THEN continuity_{c} ELSE first_{c} END', 'last_' + c)} "
                f"AS rise_{c}"
                for c in _NS.LOOKBACK_RISES
            ),
            *(f"{_rise('continuity_' + c, 'last_' + c)} AS rise_{c}" for c in _NS.CONGESTION),
        ]
    )
    + " FROM e), s AS (SELECT subject, count(*)::float8 AS n, "
    "avg(CASE WHEN port_state >= :active THEN 1.0 ELSE 0.0 END) AS active_share, "
    + ", ".join(
        [
            *(f"{_median(c)} AS {c}" for c in (node_metrics.PORT_RATE_GBPS, node_metrics.PSI_MEM_SOME)),
            *(f"{_median(f'rise_{c} / span_s')} AS {c}" for c in _NS.PORT_ERRORS),
            *(f"{_median(f'rise_{c} / continuity_span_s')} AS {c}" for c in _NS.CONGESTION),
        ]
    )
    + " FROM a GROUP BY subject"
    ") SELECT (SELECT json_object_agg(subject, to_jsonb(s) - 'subject') FROM s) AS summary, "
    "(SELECT array_agg(DISTINCT a.node_id) FROM a JOIN s USING (subject) WHERE "
    f"a.rise_{node_metrics.LINK_DOWNED} > 0 OR a.rise_{node_metrics.EDAC_UE} > 0 OR a.down_lately "
    f"OR a.{node_metrics.PORT_RATE_GBPS} < :rate_drop * s.{node_metrics.PORT_RATE_GBPS} "
    "OR ("
    + " + ".join(f"coalesce(a.rise_{c}, 0)" for c in _NS.PORT_ERRORS)
    + " >= :errors_min AND "
    + " + ".join(f"coalesce(a.rise_{c}, 0)" for c in _NS.PORT_ERRORS)
    + " >= :errors_factor * greatest(("
    + " + ".join(f"coalesce(s.{c}, 0)" for c in _NS.PORT_ERRORS)
    + ") * a.span_s, 1)) OR "
    + " OR ".join(
        f"a.rise_{c} / a.continuity_span_s >= greatest(:congestion_factor * coalesce(s.{c}, 0), :floor_{c})"
        for c in _NS.CONGESTION
    )
    + f" OR (a.subject = :host AND (a.{node_metrics.PSI_MEM_SOME} >= :psi_some OR a.{node_metrics.PSI_MEM_FULL} "
    ">= :psi_full OR a.available_share <= :available_low))) AS worth"
)


def node_findings(
    session: Session,
    *,
    job: Job,
    info: JobInfo,
    closed: datetime,
    lookback_s: float,
    names: dict[int, str],
    now: datetime,
) -> list[Finding]:
    """ml.node_signals on the machines whose ports or host stood out in the job's summary of the lookback; only
    when a window closed since the last pass (passes come every 5 s, windows every 10 s: the other passes would
    judge the same windows again and store nothing new)."""
    cursor, _ = state.load(session, job_id=job.id, detector="node_signals", version=NODE_SIGNALS_VERSION)
    if cursor is not None and closed <= cursor:
        return []
    state.save(
        session, job_id=job.id, detector="node_signals", version=NODE_SIGNALS_VERSION, cursor=closed, state={}, now=now
    )
    lo = closed - timedelta(seconds=lookback_s)
    at = node_summary.summary_windows(closed - timedelta(seconds=WINDOW_S), lookback_s)
    params = {
        "job": job.id,
        **at,
        "window": float(WINDOW_S),
        "active": node_metrics.PORT_ACTIVE,
        "host": node_metrics.HOST,
        "rate_drop": _NS.RATE_DROP,
        "errors_min": _NS.ERRORS_MIN,
        "errors_factor": _NS.ERRORS_FACTOR,
        "congestion_factor": _NS.CONGESTION_FACTOR,
        **{f"floor_{c}": floor for c, floor in _NS.CONGESTION_FLOOR_PER_S.items()},
        "psi_some": _NS.PSI_SOME_HIGH,
        "psi_full": _NS.PSI_FULL_HIGH,
        "available_low": _NS.AVAILABLE_LOW,
    }
    row = session.execute(_NODE_SQL, params).one()
    node_ids = sorted(row.worth or [])
    if not node_ids:
        return []
    summary = {
        subject: {k: math.nan if v is None else float(v) for k, v in values.items()}
        for subject, values in (row.summary or {}).items()
    }
    rolled = windows.read_nodes(
        session,
        job=job,
        start=lo,
        end=closed,
        columns=sorted(windows.NODE_STORED),
        names=names,
        node_ids=node_ids,
    )
    return node_signals.detect(info, rolled, now=now, peers=summary)
