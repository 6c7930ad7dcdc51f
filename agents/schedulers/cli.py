"""`faultline adapter kubernetes|slurm`: flags, then the poll-act-ack loop. Imports nothing from the server."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from agents.schedulers.client import NODE_KINDS
from agents.schedulers.loop import EXIT_AUTH, BackendConfigError, LoopOptions

TOKEN_ENV = "FAULTLINE_TOKEN"
URL_ENV = "FAULTLINE_URL"
ONCE_PATIENCE_S = 30.0  # --once gives up on an unreachable service after this long; the loop never does
EXIT_CONFIG = 2


def _wait_seconds(value: str) -> float:
    seconds = float(value)
    if not 0 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"must be between 0 and 60, got {value}")
    return seconds


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """--url and --token-file: where the service is, and the scheduler token (never a flag: flags show in ps)."""
    parser.add_argument("--url", default=os.environ.get(URL_ENV), help=f"faultline service URL (or {URL_ENV})")
    parser.add_argument(
        "--token-file",
        type=Path,
        help=f"file holding a token with scope scheduler (default: env {TOKEN_ENV}; never on the command line)",
    )


def _common(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser)
    parser.add_argument(
        "--wait", type=_wait_seconds, default=30.0, help="long-poll seconds per request, 0 to 60 (default 30)"
    )
    parser.add_argument("--once", action="store_true", help="act on what is pending now, then exit")
    parser.add_argument("--dry-run", action="store_true", help="log what would be done; act on and ack nothing")
    parser.add_argument(
        "--strip-domain", action="store_true", help="gpu-01.example.com in faultline is gpu-01 in the scheduler"
    )
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="also drain a node for a diagnose decision: its agent then runs the stop-time checks the service sends "
        "and the service's verdict comes back as an eviction or a return (the node condition or drain reason says "
        "checks running, failed, passed)",
    )
    parser.add_argument(
        "--returns-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how often to look for nodes faultline holds out of service that the scheduler has back in service "
        "(resumed, uncordoned) and report them, so faultline runs their return gate; 0 never (default 30)",
    )
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")


def add_parser(sub: Any) -> None:
    adapter = sub.add_parser(
        "adapter",
        help="act on faultline's node decisions in a scheduler (Kubernetes, Slurm) and acknowledge them",
        description="Long-poll pending evict/cordon/return/reset_gpu decisions, take nodes (or one GPU) out of "
        "(or back into) service, acknowledge each decision done or failed.",
    )
    backends = adapter.add_subparsers(dest="adapter_backend", required=True, metavar="SCHEDULER")
    kube = backends.add_parser(
        "kubernetes",
        help="cordon + taint + node condition; uncordon on return",
        description="evict/cordon: spec.unschedulable, taint faultline.io/faulty=<decision id>, condition "
        "FaultlineFaulty=True. reset_gpu: label and annotation faultline.io/unhealthy-gpus=<index> (or the PCI bus "
        "id, ':' and '.' as '-' in the label), the node stays schedulable. return: undo both. Needs get/patch on "
        "nodes and patch on nodes/status.",
    )
    _common(kube)
    where = kube.add_mutually_exclusive_group()
    where.add_argument("--kube-api", help="API server URL without credentials, e.g. `kubectl proxy`'s")
    where.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    kube.add_argument("--context", help="kubeconfig context (default: the current one)")
    kube.add_argument(
        "--taint-effect",
        choices=["NoSchedule", "PreferNoSchedule", "NoExecute"],
        default="NoSchedule",
        help="NoExecute also evicts running pods without a toleration (default NoSchedule)",
    )
    slurm = backends.add_parser(
        "slurm",
        help="scontrol drain; resume on return",
        description="evict/cordon: scontrol update nodename=N state=drain reason=...; reset_gpu: the same drain, "
        "the reason naming the GPU (Slurm cannot drain one GPU), the ack the reset (nvidia-smi -r -i <index or PCI "
        "bus id>); return: state=resume.",
    )
    _common(slurm)
    slurm.add_argument("--scontrol", default="scontrol", help="scontrol program (default: scontrol on PATH)")
    slurm.add_argument("--scontrol-timeout", type=float, default=30.0, help="seconds per scontrol call (default 30)")


def read_token(args: argparse.Namespace) -> str:
    if args.token_file:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            raise BackendConfigError(f"cannot read --token-file: {exc}") from exc
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise BackendConfigError(f"no token: pass --token-file FILE or set {TOKEN_ENV} (a token with scope scheduler)")
    return token


def _backend(args: argparse.Namespace) -> Any:
    if args.adapter_backend == "kubernetes":
        from agents.schedulers.kubernetes import KubeOptions, KubernetesBackend

        return KubernetesBackend(
            KubeOptions(
                api_url=args.kube_api,
                kubeconfig=args.kubeconfig,
                context=args.context,
                in_cluster=args.in_cluster,
                taint_effect=args.taint_effect,
            )
        )
    from agents.schedulers.slurm import SlurmBackend

    return SlurmBackend(args.scontrol, timeout_s=args.scontrol_timeout, required=not args.dry_run)


def run(args: argparse.Namespace) -> int:
    prog = f"faultline adapter {args.adapter_backend}"
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s adapter[{args.adapter_backend}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per long poll would drown ours
    try:
        if not args.url:
            raise BackendConfigError(f"no service URL: pass --url or set {URL_ENV}")
        token = read_token(args)
        backend = _backend(args)
    except BackendConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from agents.schedulers.client import FaultlineClient
    from agents.schedulers.loop import AdapterLoop

    stop = threading.Event()
    client = FaultlineClient(args.url, token, stop=stop, patience_s=ONCE_PATIENCE_S if args.once else None)
    loop = AdapterLoop(
        client,
        backend,
        LoopOptions(
            wait_s=args.wait,
            once=args.once,
            dry_run=args.dry_run,
            strip_domain=args.strip_domain,
            kinds=(*NODE_KINDS, "diagnose") if args.diagnose else NODE_KINDS,
            returns_every_s=max(0.0, args.returns_every),
        ),
        stop=stop,
    )
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        code = loop.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        client.close()
    if code == EXIT_AUTH:
        print(f"{prog}: the service refused the token; see the log above", file=sys.stderr)
    return code
