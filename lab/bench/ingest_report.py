"""The ingest benchmark's targets, each judged, and the report it prints (`faultline bench ingest`)."""

from __future__ import annotations

import argparse
from typing import Any

from lab.bench.cpu import format_cores
from lab.bench.synthetic import FIELD_COUNT

TARGET_GPUS = 16_384
TARGET_FIELDS = 20
TARGET_RATIO = 0.5
# Issue 13: a 16,384-GPU job at 1 s resolution, shipped every 5 s, on little more than one API core.
TARGET_API_CORES = 1.2
TARGET_P99_MS = 250.0
TARGET_SHIP_S = 5.0  # the agent's default shipping interval


def _targets(
    args: argparse.Namespace, *, kept_up: bool, ratio: float, p99: float | None, api_cores: float | None
) -> dict[str, Any]:
    """Each target with its verdict; none is judged below the target load: 16,384 GPUs sampled at 1 s, shipped
    at least as often as the agent ships (every TARGET_SHIP_S)."""
    size = (
        args.nodes * args.gpus_per_node >= TARGET_GPUS
        and args.sample_interval <= 1.0
        and args.ship_interval <= TARGET_SHIP_S
    )
    checks = {
        "kept_up": kept_up and FIELD_COUNT >= TARGET_FIELDS and not args.no_worker,
        "copy_ratio": ratio >= TARGET_RATIO,
        "p99_ms": p99 is not None and p99 < TARGET_P99_MS,
        "api_cores": api_cores is not None and api_cores < TARGET_API_CORES,
    }
    return {"gpus": TARGET_GPUS, "size_reached": size, "checks": checks, "met": size and all(checks.values())}


def _ms(latency: dict[str, float | None]) -> str:
    return "  ".join(f"{k} {v:,.1f} ms" if v is not None else f"{k} -" for k, v in latency.items())


def _failures(phase: dict[str, Any]) -> str:
    text = f"non-2xx {phase['non_2xx']:,}  errors {phase['errors']:,}"
    if phase.get("unsent"):
        text += f"  dropped unsent {phase['unsent']:,}"
    if phase.get("unanswered"):
        text += f"  unanswered {phase['unanswered']:,}"
    return text


def _per_core(requests_per_s: float, api_cores: float | None) -> str:
    """Requests per second of API CPU: what a change to the request path moves even when other load on the machine
    leaves the API fewer cores (the throughput and the ratio to COPY move with the machine's other load)."""
    if not api_cores or not requests_per_s:
        return "-"
    per_request_us = 1e6 * api_cores / requests_per_s
    return f"{requests_per_s / api_cores:>10,.0f} requests per API core-second ({per_request_us:,.0f} µs per request)"


def _verdict(ok: bool, size_reached: bool) -> str:
    if not size_reached:
        return "n/a"
    return "PASS" if ok else "FAIL"


def format_report(f: dict[str, Any]) -> str:
    c, paced, cap, rows = f["config"], f["paced"], f["capacity"], f["rows"]
    lines = [
        "",
        f"faultline bench ingest: {c['nodes']:,} nodes x {c['gpus_per_node']} GPUs = {c['gpus']:,} GPUs sampled every "
        f"{c['sample_interval_s']:g} s, one batch per node every {c['ship_interval_s']:g} s "
        f"({c['samples_per_batch']} samples per GPU per batch), {c['fields_per_sample']} fields per sample",
        f"  {c['api_workers']} API processes, worker {'on' if c['worker'] else 'off'}, {c['connections']} connections, "
        f"{c['cpus']} CPUs, database {c['database']}",
        "",
        f"paced, open loop ({c['duration_s']:g} s)",
        f"  offered           {paced['offered_samples_per_s']:>10,.0f} GPU samples/s  "
        f"{paced['offered_requests_per_s']:>7,.0f} requests/s",
        f"  sustained         {paced['samples_per_s']:>10,.0f} GPU samples/s  "
        f"{paced['requests_per_s']:>7,.0f} requests/s"
        f"  ({paced['sustained_ratio']:.3f} of offered)",
        f"  latency           {_ms(paced['latency_ms'])}  (from the scheduled send time)",
        f"  service time      {_ms(paced['service_ms'])}  (from the write)",
        f"  failures          {_failures(paced)}",
        f"  kept up           {'yes' if paced['kept_up'] else 'NO'}  (sustained >= 0.98 x offered and p99 < ship "
        "interval)",
    ]
    if paced["concurrency_needed"] > c["connections"]:
        lines.append(
            f"  note              at this service time the offered rate needs ~{paced['concurrency_needed']:,.0f} "
            f"requests in flight; --connections {c['connections']} queues the rest in the client"
        )
    lines += [
        "",
        f"capacity, closed loop ({cap['elapsed_s']:.1f} s, {c['connections']} connections)",
        f"  throughput        {cap['samples_per_s']:>10,.0f} GPU samples/s  {cap['requests_per_s']:>7,.0f} requests/s",
        f"  per API core      {_per_core(cap['requests_per_s'], f['cpu_cores'].get('capacity', {}).get('api'))}",
        f"  latency           {_ms(cap['latency_ms'])}",
        f"  failures          {_failures(cap)}",
        "",
        f"raw psycopg COPY, same database, same rows ({f['copy_baseline']['rows_per_transaction']:,} rows per "
        "transaction, a full server flush)",
    ]
    copy = f["copy_baseline"]
    lines.append(
        f"  binary COPY, as the server writes {copy['rows_per_s']:>10,.0f} rows/s  ({copy['rows']:,} rows in "
        f"{copy['seconds']:.1f} s)   HTTP capacity / COPY = {f['ratio_capacity_to_copy']:.2f}"
    )
    lines += [
        "",
        f"rows stored         {rows['stored']:,} metric_samples rows for {rows['ok_samples']:,} samples answered 2xx: "
        + ("match" if rows["match"] else "MISMATCH"),
    ]
    for phase, cores in f["cpu_cores"].items():
        lines.append(f"CPU cores, {phase:<9} {format_cores(cores)}")
    lines += ["", *_target_lines(f["targets"], paced)]
    return "\n".join(lines)


def _target_lines(targets: dict[str, Any], paced: dict[str, Any]) -> list[str]:
    size, checks = targets["size_reached"], targets["checks"]
    p99, api = paced["latency_ms"]["p99"], paced["api_cores"]
    lines = [
        f"targets ({targets['gpus']:,} GPUs sampled at 1 s, shipped every {TARGET_SHIP_S:g} s or more often)"
        + ("" if size else ": not judged below that size"),
        f"  kept up, >= {TARGET_FIELDS} fields, worker on    {_verdict(checks['kept_up'], size)}",
        f"  HTTP capacity / COPY >= {TARGET_RATIO}          {_verdict(checks['copy_ratio'], size)}",
        f"  paced p99 < {TARGET_P99_MS:g} ms                  {_verdict(checks['p99_ms'], size)}  "
        f"({'-' if p99 is None else f'{p99:,.1f} ms'})",
        f"  API < {TARGET_API_CORES:g} cores (paced)             {_verdict(checks['api_cores'], size)}  "
        f"({'-' if api is None else f'{api:.2f} cores'})",
    ]
    if size:
        lines.append(f"  all targets                         {'met' if targets['met'] else 'NOT met'}")
    return lines
