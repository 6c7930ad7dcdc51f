"""`faultline preflight`: check a job's nodes before it starts, name the bad ones, tell faultline.

Run once on every node of the allocation at the same time (a Slurm Prolog, a Kubernetes init container, or by
hand): the nodes find each other from the scheduler's environment (SLURM_JOB_NODELIST and this node's name in it)
or torchrun's (MASTER_ADDR, NODE_RANK, NNODES), or the flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from agents.checks.collectives import gpu_count
from agents.preflight.report import render, render_answer
from agents.preflight.runner import Plan, Run, run
from agents.preflight.search import Criteria
from agents.schedulers.cli import TOKEN_ENV, URL_ENV

EXIT_OK, EXIT_THIS_NODE, EXIT_USAGE, EXIT_OTHER_NODE = 0, 1, 2, 3
DEADLINE_ENV = "FAULTLINE_PREFLIGHT_DEADLINE_S"
PORT_ENV = "FAULTLINE_PREFLIGHT_PORT"
SLURM_PORT_BASE = 29400  # + the job id modulo 500: two jobs whose first node is the same still meet apart
SERVICE_TIMEOUT_S = 10.0


class UsageError(Exception):
    pass


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "preflight",
        help="before a job starts: GEMM and all-reduce on every node of its allocation, bisecting to the bad node",
        description="Run on every node of the allocation at once. Exit status: 0 no node named (or the preflight "
        "could not run: the job is never held for faultline), 1 this node is named bad, 3 another node of the "
        "allocation is named bad, 2 bad arguments.",
    )
    p.add_argument("--job", default=None, help="the job's id (default: SLURM_JOB_ID, or FAULTLINE_JOB_ID)")
    p.add_argument("--node", help="this node's name as faultline knows it (default: SLURMD_NODENAME or hostname)")
    p.add_argument("--addr", help="where the other nodes reach this one (default: the node's name)")
    p.add_argument(
        "--nodes", help="the allocation as a Slurm host list (default: SLURM_JOB_NODELIST); the first coordinates"
    )
    p.add_argument("--node-rank", type=int, help="this node's rank (without --nodes; default: NODE_RANK)")
    p.add_argument("--nnodes", type=int, help="how many nodes (without --nodes; default: NNODES)")
    p.add_argument("--master-addr", help="the coordinating node (without --nodes; default: MASTER_ADDR)")
    p.add_argument("--master-port", type=int, help=f"its control port (default: {PORT_ENV}, else chosen by job id)")
    p.add_argument("--backend", choices=("nccl", "gloo"), help="nccl with GPUs (default), gloo on CPU")
    p.add_argument("--nproc", type=int, help="ranks per node between nodes (default: the GPUs; 1 with gloo)")
    p.add_argument("--local-ranks", type=int, help="ranks of the local all-reduce (default: the GPUs; 1 with gloo)")
    p.add_argument("--bytes", type=int, default=64 * 2**20, help="all-reduce size per group (default 64 MiB)")
    p.add_argument("--iters", type=int, default=10, help="timed all-reduces per group (default 10)")
    p.add_argument("--probe-timeout", type=float, default=30.0, help="seconds one group may take (default 30)")
    p.add_argument(
        "--deadline",
        type=float,
        default=float(os.environ.get(DEADLINE_ENV, "180")),
        help=f"seconds the job's start waits at most (default 180, or {DEADLINE_ENV})",
    )
    p.add_argument("--slow-share", type=float, default=0.3, help="a pair this far below the pairs' median is slow")
    p.add_argument("--min-busbw", type=float, help="a floor in GB/s for every group (default: the fleet's, if known)")
    p.add_argument("--url", default=os.environ.get(URL_ENV), help=f"faultline service URL (or {URL_ENV})")
    p.add_argument(
        "--token-file",
        type=Path,
        help=f"file holding a token with scope agent (default: env {TOKEN_ENV}; never on the command line)",
    )
    p.add_argument("--no-service", action="store_true", help="do not fetch criteria from faultline nor report to it")
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON document")


def plan_of(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Plan, str | None]:
    """(this node's plan, the job id) from the flags and the scheduler's or torchrun's environment."""
    from agents.schedulers.slurm_jobs import HookError, expand_nodes

    node = args.node or env.get("FAULTLINE_NODE_NAME") or env.get("SLURMD_NODENAME") or socket.gethostname()
    job = args.job or env.get("SLURM_JOB_ID") or env.get("FAULTLINE_JOB_ID")
    nodelist = args.nodes or (env.get("SLURM_JOB_NODELIST") if args.master_addr is None else None)
    port = args.master_port or (int(env[PORT_ENV]) if env.get(PORT_ENV) else None)
    if nodelist:
        try:
            nodes = expand_nodes(nodelist)
        except HookError as exc:
            raise UsageError(str(exc)) from exc
        if node not in nodes:
            raise UsageError(f"this node {node!r} is not in the allocation {nodelist!r} (pass --node)")
        rank, nnodes, master = nodes.index(node), len(nodes), nodes[0]
        if port is None:
            port = SLURM_PORT_BASE + (int(job) % 500 if job and job.isdigit() else 0)
    else:
        try:
            rank = (
                args.node_rank if args.node_rank is not None else int(env.get("NODE_RANK", env.get("GROUP_RANK", "")))
            )
            nnodes = args.nnodes or int(env.get("NNODES", ""))
        except ValueError as exc:
            raise UsageError("no allocation: pass --nodes, or --node-rank and --nnodes (or NODE_RANK, NNODES)") from exc
        master = args.master_addr or env.get("MASTER_ADDR")
        if not master:
            raise UsageError("no coordinating node: pass --master-addr (or MASTER_ADDR)")
        port = port or (int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None)
        if port is None:
            raise UsageError(f"no control port: pass --master-port (or {PORT_ENV}, MASTER_PORT)")
    if not 0 <= rank < nnodes:
        raise UsageError(f"node rank {rank} is not within {nnodes} nodes")
    gpus = gpu_count()
    backend = args.backend or ("nccl" if gpus else "gloo")
    per_node = gpus if backend == "nccl" else 1
    if backend == "nccl" and not gpus:
        raise UsageError("--backend nccl needs GPUs, and this node has none: pass --backend gloo")
    if not 0 < args.slow_share < 1 or args.deadline <= 0 or args.probe_timeout <= 0:
        raise UsageError("--slow-share must be in (0, 1), --deadline and --probe-timeout above 0")
    plan = Plan(
        node=node,
        addr=args.addr or node,
        node_rank=rank,
        nnodes=nnodes,
        master_addr=master,
        master_port=port,
        backend=backend,
        nproc=args.nproc or per_node,
        local_ranks=args.local_ranks or per_node,
        nbytes=args.bytes,
        iters=args.iters,
        probe_timeout_s=args.probe_timeout,
        local_timeout_s=min(120.0, args.deadline / 3),
        deadline_s=args.deadline,
        criteria=Criteria(slow_share=args.slow_share, min_busbw_gbps=args.min_busbw),
    )
    return plan, job


class Service:
    """faultline as the preflight uses it: the fleet's criteria before, the outcome after. Never raises: a service
    that is down or refuses costs a message, not the job's start."""

    def __init__(self, url: str, token: str, say: Any, *, http: httpx.Client | None = None) -> None:
        self.http = http or httpx.Client(base_url=url.rstrip("/"), timeout=SERVICE_TIMEOUT_S)
        self.headers = {"Authorization": f"Bearer {token}"}
        self.say = say

    def criteria(self, base: Criteria, results: list[dict[str, Any]]) -> Criteria:
        models = sorted(
            {r["evidence"]["model"] for r in results if isinstance(r.get("evidence", {}).get("model"), str)}
        )
        if len(models) != 1:
            self.say("fleet criteria: not fetched (the nodes' GPU models differ or are unknown)")
            return base
        try:
            response = self.http.get("/api/v1/preflight/criteria", params={"model": models[0]}, headers=self.headers)
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            self.say(f"fleet criteria unavailable ({exc}): judging against this allocation only")
            return base
        floors = {}
        for check, figure in (("gemm_bf16", "gemm_tflops"), ("allreduce_node", "allreduce_node_gbps")):
            cutoff = (body.get("checks", {}).get(check) or {}).get("cutoff")
            if cutoff is not None:
                floors[figure] = float(cutoff)
        peer = body.get("checks", {}).get("allreduce_peer") or {}
        floor = base.min_busbw_gbps
        if floor is None and peer.get("basis") == "fleet" and peer.get("cutoff") is not None:
            floor = float(peer["cutoff"])
        self.say(f"fleet criteria for {models[0]}: {floors or 'none yet'}" + (f", busbw >= {floor:g}" if floor else ""))
        return replace(base, local_floors=floors, min_busbw_gbps=floor)

    def report(self, job: str | None, done: Run) -> dict[str, Any] | None:
        if done.outcome is None:
            return None
        body = {"job_id": job, **done.outcome, "results": done.results, "seconds": done.seconds}
        try:
            response = self.http.post("/api/v1/preflight", json=body, headers=self.headers)
        except httpx.HTTPError as exc:
            self.say(f"faultline unreachable ({exc}): the preflight's results are not recorded, the job starts")
            return None
        if response.status_code >= 400:
            self.say(f"faultline refused the results ({response.status_code}: {response.text[:300]})")
            return None
        answer: dict[str, Any] = response.json()
        return answer


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return args.token_file.read_text().strip() or None
        except OSError:
            return None
    return os.environ.get(TOKEN_ENV, "").strip() or None


def run_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")

    def say(line: str) -> None:
        print(f"preflight: {line}", file=sys.stderr, flush=True)

    try:
        plan, job = plan_of(args, os.environ)
    except UsageError as exc:
        print(f"faultline preflight: {exc}", file=sys.stderr)
        return EXIT_USAGE
    service = None
    if not args.no_service and plan.node_rank == 0:
        if not args.url:
            say(f"no faultline URL ({URL_ENV}): results are not reported")
        elif job is None:
            say("no job id (--job, SLURM_JOB_ID): results are not reported")
        else:
            token = _token(args)
            if token is None:
                say(f"no token (--token-file, or {TOKEN_ENV}: scope agent): results are not reported")
            else:
                service = Service(args.url, token, say)
    say(
        f"node {plan.node} ({plan.node_rank + 1} of {plan.nnodes}), {plan.backend}, meeting at "
        f"{plan.master_addr}:{plan.master_port}, deadline {plan.deadline_s:g} s"
    )
    fleet = (lambda results: service.criteria(plan.criteria, results)) if service else None
    done = run(plan, fleet=fleet)
    if done.aborted or done.outcome is None:
        say(f"could not check this allocation ({done.aborted}); the job starts unchecked")
        return EXIT_OK
    answer = service.report(job, done) if service else None
    if args.json:
        print(json.dumps({"node": plan.node, "seconds": done.seconds, **done.outcome, "service": answer}, indent=1))
    else:
        for line in render(done.outcome, node=plan.node):
            print(line)
        print(f"took {done.seconds:g} s (this node's own checks {done.local_seconds:g} s)")
        if answer is not None:
            for line in render_answer(answer):
                print(line)
    named = {n["node"] for n in done.outcome["named"]}
    if plan.node in named:
        return EXIT_THIS_NODE
    return EXIT_OTHER_NODE if named else EXIT_OK
