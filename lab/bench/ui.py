"""`faultline bench ui`: the web UI's pages timed through a real API process, at cluster size.

Seeds (once per database) 2,048 nodes in 16 jobs, their 16,384 GPUs and ranks, and 3,000 incidents with
findings, decisions, kernel log lines and node histories (lab/bench/uidata.py); starts `faultline serve`;
signs in as an admin; then requests every page several times and prints each page's median and worst time
and its size. The pages' query counts do not grow with the data (tests/service/ui/test_ui_*.py check that); this
measures what that buys in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from lab.bench import uidata
from lab.bench.backend import say, spawn, start_backend
from lab.bench.busy import note, watch_other_load
from service import embedded, migrate, processes

PREFIX = "bench"
# A page an on-call engineer opens at 3 a.m. should answer well within this.
TARGET_MS = 500.0


def _seed(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """Seed unless already seeded; an admin token; the URLs of the pages to time."""
    from service.db import session_scope
    from service.models import Incident
    from service.tokens import service as tokens

    with session_scope() as session:
        if uidata.existing(session, prefix=PREFIX):
            say("the database already holds the seeded cluster; timing it as it is")
        else:
            started = time.monotonic()
            seeded = uidata.seed(
                session,
                nodes=args.nodes,
                incidents=args.incidents,
                open_incidents=args.open_incidents,
                prefix=PREFIX,
            )
            say(
                f"seeded {seeded.nodes} nodes in {seeded.jobs} jobs and {seeded.incidents} incidents "
                f"in {time.monotonic() - started:.1f} s"
            )
        token = tokens.create(session, scope="admin", name="bench-ui").token
        incident = session.scalar(select(Incident.id).where(Incident.state != "resolved").order_by(Incident.id.desc()))
    node, job = f"{PREFIX}-node-00000", f"{PREFIX}-job-000"
    pages = {
        "overview": "/",
        "incidents": "/incidents",
        "incidents (unresolved)": "/incidents?state=unresolved",
        "incident": f"/incidents/{incident}",
        "nodes": "/nodes",
        "node": f"/nodes/{node}",
        "jobs": "/jobs",
        "job (1,024 ranks)": f"/jobs/{job}",
        "decisions": "/decisions",
        "decisions (waiting)": "/decisions?state=awaiting_approval",
        "silences": "/silences",
        "channels": "/channels",
        "tokens": "/tokens",
    }
    return token, pages


def run(args: argparse.Namespace) -> int:
    if min(args.nodes, args.incidents, args.rounds) < 1:
        say("--nodes, --incidents and --rounds must be at least 1")
        return 2
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="faultline-bench-ui-"))
        backend = start_backend(args.data_dir, workdir, stack)
        say(f"database: {backend.kind}; applying migrations ...")
        migrate.upgrade(backend.database_url)
        token, pages = _seed(args)
        port = embedded.free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            **backend.env,
            "FAULTLINE_DATABASE_URL": backend.database_url,
            "FAULTLINE_REDIS_URL": backend.redis_url,
            "FAULTLINE_LOG_LEVEL": "WARNING",
        }
        api = spawn(["faultline", "serve", "--port", str(port)], env, workdir / "api.log", stack)
        processes.wait_healthy(url, api, timeout=60, log=workdir / "api.log")
        with watch_other_load(backend.dsn) as watched:
            figures = _time_pages(url, token, pages, rounds=args.rounds)
    _print(figures, args)
    print(note(figures, watched))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        say(f"figures written to {args.json}")
    return 0 if all(f["ok"] for f in figures["pages"]) else 1


def _time_pages(url: str, token: str, pages: dict[str, str], *, rounds: int) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=60) as client:
        signed_in = client.post("/login", data={"token": token, "next": "/"})
        if signed_in.status_code >= 400:
            raise SystemExit(f"faultline bench ui: could not sign in: {signed_in.status_code} {signed_in.text[:200]}")
        results = []
        for name, path in pages.items():
            client.get(path)  # warm: templates compiled, connections in the pool
            times, size, status = [], 0, 0
            for _ in range(rounds):
                started = time.perf_counter()
                response = client.get(path)
                times.append((time.perf_counter() - started) * 1000)
                size, status = len(response.content), response.status_code
            median = statistics.median(times)
            results.append(
                {
                    "page": name,
                    "path": path,
                    "status": status,
                    "median_ms": round(median, 1),
                    "max_ms": round(max(times), 1),
                    "kib": round(size / 1024, 1),
                    "ok": status == 200 and median < TARGET_MS,
                }
            )
    return {"target_median_ms": TARGET_MS, "rounds": rounds, "pages": results}


def _print(figures: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"web UI pages at {args.nodes} nodes and {args.incidents} incidents ({figures['rounds']} requests each)")
    print(f"{'page':<26} {'status':>6} {'median ms':>10} {'max ms':>8} {'KiB':>7}  target")
    for p in figures["pages"]:
        verdict = "PASS" if p["ok"] else "FAIL"
        row = f"{p['page']:<26} {p['status']:>6} {p['median_ms']:>10.1f} {p['max_ms']:>8.1f} {p['kib']:>7.1f}"
        print(f"{row}  {verdict}")
    print(f"target: every page answers 200 with a median under {TARGET_MS:.0f} ms")
