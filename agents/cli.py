"""`faultline agent`: flags, then the loop. Imports nothing from the server."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from agents.config import ENV_PREFIX, ConfigError, load


def add_parser(sub: Any) -> None:
    agent = sub.add_parser(
        "agent",
        help="run the node agent: ship GPU counters, kernel and training logs, processes and stacks",
        description="Settings come from these flags, then FAULTLINE_AGENT_<NAME> variables (e.g. "
        f"{ENV_PREFIX}TOKEN), then the TOML file of --config, then defaults.",
    )
    agent.add_argument("--config", type=Path, help=f"TOML file of settings (or {ENV_PREFIX}CONFIG)")
    agent.add_argument("--server", help="faultline service URL, e.g. https://faultline.example:8080")
    agent.add_argument("--token", help=f"agent-scope API token (prefer {ENV_PREFIX}TOKEN: flags show in ps)")
    agent.add_argument(
        "--enrol-token",
        help=f"instead of --token: an enrolment token, exchanged once for this node's own agent token (prefer "
        f"{ENV_PREFIX}ENROL_TOKEN)",
    )
    agent.add_argument(
        "--token-file",
        type=Path,
        help="where this node's agent token is kept after enrolment, and read from on later starts "
        "(default: beside the spool, <node name>.token)",
    )
    agent.add_argument("--node-name", help="this node's name (default: the hostname)")
    agent.add_argument(
        "--sample-interval",
        type=float,
        metavar="S",
        help="seconds between GPU counter samples (default 1, or the ship interval if shorter)",
    )
    agent.add_argument(
        "--ship-interval",
        type=float,
        metavar="S",
        help="seconds between batches, each carrying every sample since the last; critical events go at once "
        "(default 5)",
    )
    agent.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help="old name of --ship-interval (the sample interval then defaults to min(1, S))",
    )
    agent.add_argument("--dcgm-url", help="dcgm-exporter endpoint, e.g. http://localhost:9400/metrics (default: NVML)")
    agent.add_argument(
        "--nvml-xid",
        nargs="?",
        const="on",
        choices=["auto", "on", "off"],
        help="Xids from NVML events as well as the kernel log: 'on' (the flag alone), 'off', or 'auto' (the default: "
        "when no kernel log is followed and NVML reads the GPUs, as in a container without /dev/kmsg)",
    )
    agent.add_argument(
        "--nvml-fabric",
        choices=["auto", "off"],
        help="with --dcgm-url: read the GPUs' NVLink fabric info (cluster, clique, health: GB200 NVL72 domains) "
        "through NVML beside the exporter, which does not export it; 'auto' (the default: when NVML answers and "
        "some GPU is in a multi-node NVLink fabric) or 'off'",
    )
    agent.add_argument(
        "--kmsg",
        help="kernel log: /dev/kmsg, a file (dmesg or kern.log output), 'journald', or 'none' "
        "(default: /dev/kmsg when readable)",
    )
    agent.add_argument(
        "--log", dest="logs", action="append", metavar="GLOB", help="training log files to follow (repeatable)"
    )
    agent.add_argument("--watch-pid", type=int, help="only report processes below this one (one node of several)")
    agent.add_argument(
        "--no-processes",
        dest="processes",
        action="store_false",
        default=None,
        help="do not look for training processes (metrics only: the service attributes the GPUs by the exporter's "
        "pod/hpc_job labels or the job's registered rank map)",
    )
    agent.add_argument(
        "--job-env",
        help="comma-separated environment variables naming the job, first set wins "
        "(default FAULTLINE_JOB_ID,SLURM_JOB_ID,TORCHELASTIC_RUN_ID)",
    )
    agent.add_argument(
        "--step-pattern",
        dest="step_patterns",
        action="append",
        metavar="REGEX",
        help="extra step-progress regex with a named group `step` (optional: loss, grad_norm, elapsed_ms, lr)",
    )
    agent.add_argument("--stack-timeout", type=float, help="seconds py-spy may take per process (default 10)")
    agent.add_argument(
        "--bundle-timeout", type=float, help="seconds an evidence bundle may take to collect, in all (default 60)"
    )
    agent.add_argument("--bundle-max-mb", type=float, help="largest evidence bundle in MiB, packed (default 20)")
    agent.add_argument(
        "--bundle-history-s", type=float, help="seconds of the agent's last batches kept for bundles (default 300)"
    )
    agent.add_argument(
        "--cloud-events",
        choices=["off", "auto", "aws", "gcp", "azure"],
        help="read the cloud's scheduled maintenance from its metadata service (default off; auto probes all three)",
    )
    agent.add_argument("--cloud-events-interval", type=float, help="seconds between metadata polls (default 60)")
    agent.add_argument("--cloud-metadata-url", help="the metadata service's address instead of the provider's own")
    agent.add_argument(
        "--checkpoint-file", type=Path, help="where a checkpoint request (planned maintenance) is written for the job"
    )
    agent.add_argument("--checkpoint-signal", help="also send the job's processes this signal on one, e.g. SIGUSR1")
    agent.add_argument("--spool-dir", type=Path, help="disk spool (default ~/.local/state/faultline-agent/NODE)")
    agent.add_argument("--spool-max-mb", type=float, help="spool bound in MiB (default 256); the oldest go first")
    agent.add_argument("--from-start", action="store_true", default=None, help="read existing log files whole")
    agent.add_argument(
        "--dry-run", action="store_true", default=None, help="print batches as JSON lines instead of sending"
    )
    agent.add_argument("--once", action="store_true", default=None, help="collect one round (whole log files) and exit")
    agent.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    agent.add_argument(
        "--sysfs-root", type=Path, metavar="DIR", help="read /sys here instead (a fake tree for tests; default /sys)"
    )
    agent.add_argument(
        "--procfs-root", type=Path, metavar="DIR", help="read /proc here instead (a fake tree for tests; default /proc)"
    )
    agent.add_argument(
        "--volume",
        dest="volumes",
        action="append",
        metavar="PATH",
        help="a checkpoint or log folder whose free space is shipped (repeatable)",
    )
    agent.add_argument(
        "--node-label",
        dest="node_labels",
        action="append",
        metavar="KEY=VALUE",
        help="where the node sits: rack=..., switch=..., power_domain=... (repeatable; env FAULTLINE_AGENT_NODE_LABELS "
        "takes them comma-separated): kept as the node's labels, to find a cause several nodes share",
    )
    agent.add_argument(
        "--storage-mount",
        dest="storage_mounts",
        action="append",
        metavar="PATH",
        help="a shared storage mount the node's jobs read (repeatable; default: the --volume paths)",
    )


def run(args: argparse.Namespace) -> int:
    flags = {
        name: getattr(args, name)
        for name in (
            "server",
            "token",
            "enrol_token",
            "token_file",
            "node_name",
            "interval",
            "sample_interval",
            "ship_interval",
            "dcgm_url",
            "nvml_xid",
            "nvml_fabric",
            "kmsg",
            "logs",
            "watch_pid",
            "processes",
            "job_env",
            "step_patterns",
            "stack_timeout",
            "bundle_timeout",
            "bundle_max_mb",
            "bundle_history_s",
            "cloud_events",
            "cloud_events_interval",
            "cloud_metadata_url",
            "checkpoint_file",
            "checkpoint_signal",
            "spool_dir",
            "spool_max_mb",
            "from_start",
            "dry_run",
            "once",
            "log_level",
            "sysfs_root",
            "procfs_root",
            "volumes",
            "node_labels",
            "storage_mounts",
        )
    }
    try:
        config = load(flags, config_file=args.config)
    except ConfigError as exc:
        print(f"faultline agent: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s agent[" + config.node_name + "] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the agent's own
    from agents.agent import Agent, install_signal_handlers  # after the config: its errors come first

    if not config.dry_run and not config.token:
        from agents.enrol import EnrolmentFailed, obtain_token

        try:
            config.token = obtain_token(config)
        except EnrolmentFailed as exc:
            print(f"faultline agent: {exc}", file=sys.stderr)
            return 2
    try:
        agent = Agent(config)
    except OSError as exc:
        print(f"faultline agent: {exc}", file=sys.stderr)
        return 2
    install_signal_handlers(agent)
    return agent.run()
