"""`faultline slurm prolog|epilog`: register a Slurm job with faultline when it is allocated, end it when it ends.

Run from slurmctld's PrologSlurmctld / EpilogSlurmctld (deploy/slurm/): once per job, on the controller, with
SLURM_JOB_ID and SLURM_JOB_NODELIST (`gpu-[01-04]`) in the environment. The rank layout is the one srun and
torchrun give a job with one process per GPU: rank r on the (r // G)-th node of the list, local rank r % G.
Agents correct it as they see the real processes (RANK, LOCAL_RANK in /proc/PID/environ), so a different
layout costs nothing but the minutes before the first batch.

A prolog that fails holds the job, so the scripts in deploy/slurm/ never pass a failure on: the exit codes
here are for people and tests (0 done, 1 the service refused or was unreachable, 2 a configuration error).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import hostlist
import httpx
from tenacity import stop_after_attempt

from agents.http_errors import Unavailable, error_message, post_json
from agents.schedulers.cli import URL_ENV, add_service_arguments, read_token
from agents.schedulers.loop import BackendConfigError

GPUS_ENV = "FAULTLINE_GPUS_PER_NODE"
EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
_ATTEMPTS = 3  # the job waits for the prolog: a few quick tries, then let it run unregistered


class HookError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def expand_nodes(nodelist: str) -> list[str]:
    """Slurm's compressed host list (`gpu-[01-03,07],cpu1`) in its order."""
    try:
        return list(hostlist.expand_hostlist(nodelist.strip()))
    except hostlist.BadHostlist as exc:
        raise HookError(f"SLURM_JOB_NODELIST {nodelist!r} is not a host list: {exc}", EXIT_CONFIG) from exc


def rank_layout(nodes: list[str], gpus_per_node: int) -> list[dict[str, Any]]:
    """One rank per GPU, in block order over the nodes as Slurm lists them."""
    return [
        {"rank": i * gpus_per_node + local, "node": node, "local_rank": local, "gpu": local}
        for i, node in enumerate(nodes)
        for local in range(gpus_per_node)
    ]


def job_body(env: Mapping[str, str], *, gpus_per_node: int, hang_timeout_s: int | None) -> dict[str, Any]:
    """The registration for the job in a prolog's environment."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    nodelist = env.get("SLURM_JOB_NODELIST", "").strip()
    if not job_id or not nodelist:
        raise HookError("SLURM_JOB_ID and SLURM_JOB_NODELIST must be set (run from PrologSlurmctld)", EXIT_CONFIG)
    nodes = expand_nodes(nodelist)
    ranks = rank_layout(nodes, gpus_per_node)
    body: dict[str, Any] = {"job_id": job_id, "world_size": len(ranks), "ranks": ranks}
    if hang_timeout_s is not None:
        body["hang_timeout_s"] = hang_timeout_s
    return body


def end_state(env: Mapping[str, str]) -> str:
    """finished when the job exited 0 (SLURM_JOB_EXIT_CODE, a wait status), else failed."""
    return "finished" if env.get("SLURM_JOB_EXIT_CODE", "0").strip() in ("", "0") else "failed"


def _post(http: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    try:
        return post_json(http, path, body, stop=stop_after_attempt(_ATTEMPTS), max_wait_s=3)
    except Unavailable as exc:
        raise HookError(str(exc)) from exc


def prolog(http: httpx.Client, env: Mapping[str, str], *, gpus_per_node: int, hang_timeout_s: int | None) -> str:
    body = job_body(env, gpus_per_node=gpus_per_node, hang_timeout_s=hang_timeout_s)
    response = _post(http, "/api/v1/jobs", body)
    if response.status_code != 200:
        raise HookError(f"job {body['job_id']} not registered ({response.status_code}): {error_message(response)}")
    nodes = response.json()["nodes"]
    return f"registered job {body['job_id']}: {body['world_size']} ranks on {len(nodes)} nodes"


def epilog(http: httpx.Client, env: Mapping[str, str]) -> str:
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        raise HookError("SLURM_JOB_ID must be set (run from EpilogSlurmctld)", EXIT_CONFIG)
    state = end_state(env)
    response = _post(http, f"/api/v1/jobs/{job_id}/end", {"state": state})
    if response.status_code == 404:
        return f"job {job_id} was never registered (its prolog failed?): nothing to end"
    if response.status_code != 200:
        raise HookError(f"job {job_id} not ended ({response.status_code}): {error_message(response)}")
    return f"ended job {job_id}: {state}"


def add_parser(sub: Any) -> None:
    slurm = sub.add_parser(
        "slurm",
        help="Slurm hooks: register a job with faultline (PrologSlurmctld) and end it (EpilogSlurmctld)",
        description="Reads SLURM_JOB_ID, SLURM_JOB_NODELIST and (epilog) SLURM_JOB_EXIT_CODE from the environment "
        "slurmctld gives its prolog and epilog. Needs a token with scope scheduler.",
    )
    hooks = slurm.add_subparsers(dest="slurm_hook", required=True, metavar="HOOK")
    for name, text in (("prolog", "register the job, its nodes and rank layout"), ("epilog", "end the job")):
        hook = hooks.add_parser(name, help=text)
        add_service_arguments(hook)
        if name == "prolog":
            hook.add_argument(
                "--gpus-per-node",
                type=int,
                default=int(os.environ.get(GPUS_ENV, "8")),
                help=f"ranks per node: one per GPU (or {GPUS_ENV}; default 8)",
            )
            hook.add_argument("--hang-timeout", type=int, help="seconds without progress before a hang (default 600)")


def run(args: argparse.Namespace) -> int:
    prog = f"faultline slurm {args.slurm_hook}"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        if not args.url:
            raise HookError(f"no service URL: pass --url or set {URL_ENV}", EXIT_CONFIG)
        if args.slurm_hook == "prolog" and args.gpus_per_node < 1:
            raise HookError("--gpus-per-node must be at least 1", EXIT_CONFIG)
        try:
            headers = {"Authorization": f"Bearer {read_token(args)}"}
        except BackendConfigError as exc:
            raise HookError(str(exc), EXIT_CONFIG) from exc
        with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=5.0) as http:
            if args.slurm_hook == "prolog":
                done = prolog(http, os.environ, gpus_per_node=args.gpus_per_node, hang_timeout_s=args.hang_timeout)
            else:
                done = epilog(http, os.environ)
    except HookError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.code
    print(f"{prog}: {done}", file=sys.stderr)
    return EXIT_OK
