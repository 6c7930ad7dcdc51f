"""`faultline check`: the stop-time checks by hand, on this node."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from agents.checks.collectives import Peer
from agents.checks.suite import LEVELS, Options, Refused, run_suite, verdict
from agents.procs import ProcessScanner


def add_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check",
        help="run the stop-time checks on this node (NVML, dcgmi, GEMM, bandwidth, numerics, all-reduce, ports)",
        description="Exit status: 0 every check passed or was not available, 1 a check failed, 2 refused or bad "
        "arguments. Refuses while a job's training processes run here, unless --force.",
    )
    check.add_argument("--level", type=int, choices=LEVELS, default=2, help="1 seconds, 2 minutes, 3 long (default 2)")
    check.add_argument("--force", action="store_true", help="run even while training processes run on this node")
    check.add_argument(
        "--peer", metavar="ADDR:PORT", help="cross-node all-reduce (level 3) with this rendezvous (the rank-0 node's)"
    )
    check.add_argument("--node-rank", type=int, default=0, help="this node's rank in the cross-node pair (0 or 1)")
    check.add_argument(
        "--volume",
        dest="volumes",
        action="append",
        default=[],
        metavar="PATH",
        help="a volume whose free space is checked",
    )
    check.add_argument("--json", action="store_true", help="print the results as one JSON document")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    peer = None
    if args.peer:
        addr, _, port = args.peer.rpartition(":")
        try:
            peer = Peer.from_wire({"addr": addr, "port": port, "node_rank": args.node_rank})
        except ValueError as exc:
            print(f"faultline check: --peer must be ADDR:PORT with --node-rank 0 or 1 ({exc})", file=sys.stderr)
            return 2
        if not addr:
            print("faultline check: --peer must be ADDR:PORT", file=sys.stderr)
            return 2
        if args.level != 3:
            print("faultline check: --peer is for the cross-node all-reduce, which runs at --level 3", file=sys.stderr)
            return 2
    options = Options(level=args.level, force=args.force, peer=peer, volumes=args.volumes)
    try:
        results = run_suite(options, busy_ranks=ProcessScanner().scan(0.0))
    except Refused as exc:
        print(f"faultline check: refused: {exc}", file=sys.stderr)
        return 2
    overall = verdict(results)
    if args.json:
        print(
            json.dumps({"level": args.level, "verdict": overall, "results": [r.to_wire() for r in results]}, indent=1)
        )
    else:
        for r in results:
            figure = "" if r.measured is None else f" {r.measured:g}" + (f" {r.unit}" if r.unit else "")
            limit = "" if r.expected is None else f" (limit {r.expected:g})"
            why = r.evidence.get("problems") or r.evidence.get("reason") or r.evidence.get("errors") or ""
            print(f"{r.status:<13} {r.check:<22} {r.subject:<16}{figure}{limit} {why}".rstrip())
        print(f"verdict: {overall}")
    return 1 if overall == "fail" else 0
