"""`faultline agent` as an operator runs it on a node: a dry run over real log files, and bad flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from tests import paths
from tests.procs import wait_for
from tests.receiver import receiver

LOGS = paths.FIXTURES / "logs"
XID48 = (
    "[Sat Nov 22 10:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=python, An uncorrectable double bit "
    "error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.\n"
)


def _agent(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "faultline", "agent", *args], capture_output=True, text=True, timeout=60, env=env
    )


def _without_header(source: Path, tmp: Path) -> Path:
    # The fixtures carry a provenance header; a node's log starts at the log text.
    out = tmp / source.name
    out.write_text(source.read_text().split("\n---\n", 1)[1])
    return out


def test_dry_run_once_prints_the_events_of_real_logs(tmp_path: Path) -> None:
    kmsg = _without_header(LOGS / "xid79_fallen_off_bus_multiline_nvsentinel_155.txt", tmp_path)
    xid48 = _without_header(LOGS / "xid48_dbe_xid64_gpuoperator_1146.txt", tmp_path)
    train = _without_header(LOGS / "ib_status12_nccl_1814.txt", tmp_path)
    timeout = _without_header(LOGS / "nccl_timeout_seqnum_skew_pytorch_118369.txt", tmp_path)
    kernel = tmp_path / "kern.log"
    kernel.write_text(kmsg.read_text() + xid48.read_text())
    done = _agent(
        "--dry-run", "--once", "--node-name", "gpu-17", "--kmsg", str(kernel), "--log", str(train),
        "--log", str(tmp_path / "nccl_timeout_*.txt"), "--spool-dir", str(tmp_path / "unused"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no GPU counters" in done.stderr  # said once, and the agent carries on
    (line,) = done.stdout.splitlines()  # --once: one batch, one JSON line
    batch = orjson.loads(line)
    assert batch["node"] == "gpu-17" and batch["metrics"] == [] and batch["heartbeat"]["agent_version"]
    events: list[dict[str, Any]] = batch["logs"]

    xids = [e for e in events if e["kind"] == "xid"]
    assert [e["fields"]["xid"] for e in xids if e["fields"]["xid"] == 79] == [79]
    assert {48, 64} <= {e["fields"]["xid"] for e in xids}
    lost = next(e for e in xids if e["fields"]["xid"] == 79)
    assert lost["severity"] == "critical" and lost["source"] == "kmsg" and "fallen off the bus" in lost["line"]

    ib = [e for e in events if e["kind"] == "ib_error"]
    assert [e["fields"]["status"] for e in ib] == [12, 5]
    assert ib[0]["fields"]["peer"] == "172.36.143.59" and ib[0]["path"] == str(train)

    watchdog = [e for e in events if e["kind"] == "watchdog_timeout"]
    assert watchdog and all(e["fields"]["op"] and e["fields"]["timeout_ms"] for e in watchdog)
    assert {e["path"] for e in watchdog} == {str(timeout)}
    assert not (tmp_path / "unused").exists()  # a dry run sends nothing and spools nothing


def test_bad_settings_are_clear_errors(tmp_path: Path) -> None:
    missing = _agent("--once")
    assert missing.returncode == 2
    assert "--server and --token required" in missing.stderr
    bad_url = _agent("--server", "faultline:8080", "--token", "t", "--once")
    assert bad_url.returncode == 2 and "http(s) URL" in bad_url.stderr
    config = tmp_path / "agent.toml"
    config.write_text("interval = [")
    broken = _agent("--config", str(config), "--dry-run")
    assert broken.returncode == 2 and "cannot read config file" in broken.stderr


def test_critical_events_are_shipped_at_once_not_at_the_interval(tmp_path: Path) -> None:
    kernel = tmp_path / "kern.log"
    kernel.touch()
    with receiver() as rx:
        args = [
            sys.executable, "-m", "faultline", "agent", "--server", rx.url, "--node-name", "n1",
            "--interval", "60", "--kmsg", str(kernel), "--spool-dir", str(tmp_path / "spool"),
        ]  # fmt: skip
        env = {**os.environ, "FAULTLINE_AGENT_TOKEN": "fl_t"}
        with subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True) as agent:
            try:
                wait_for(lambda: len(rx.requests) == 1, timeout=20, what="the first batch")  # sent at start
                with kernel.open("a") as f:
                    f.write(XID48)
                written = time.monotonic()
                wait_for(lambda: len(rx.requests) == 2, timeout=10, what="the critical batch")
                latency = time.monotonic() - written
            finally:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=30)
    (event,) = rx.bodies()[1]["logs"]
    assert event["kind"] == "xid" and event["fields"]["xid"] == 48
    assert latency < 5  # well before the 60 s interval
    assert rx.requests[1]["headers"]["Content-Encoding"] == "gzip"


def test_dry_run_once_on_a_fake_sysfs_prints_network_and_host_readings(tmp_path: Path) -> None:
    done = _agent(
        "--dry-run", "--once", "--kmsg", "none", "--sysfs-root", str(paths.FIXTURES / "sysfs"),
        "--procfs-root", str(paths.FIXTURES / "procfs"), "--volume", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    batch = orjson.loads(line)
    readings = {item["subject"]: item["fields"] for item in batch["node_metrics"]}
    assert {"ib:mlx5_0/1", "roce:mlx5_4/1", "eth:eno1", "host", f"vol:{tmp_path}"} <= set(readings)
    assert readings["ib:mlx5_0/1"]["port_rate_gbps"] == 400.0
    assert readings["roce:mlx5_4/1"]["pause_tx_frames"] == 120455
    assert readings["host"]["mem_total_mib"] > 0 and readings["host"]["psi_io_some_avg10"] == 4.87
    assert 0 <= readings["host"]["cpu_util_pct"] <= 100
    assert batch["heartbeat"]["host"]["rdma"] is True and "roce:mlx5_4/1" in batch["heartbeat"]["host"]["ports"]
    assert "no RDMA device" not in done.stderr


def test_a_host_without_rdma_is_said_once_and_the_agent_carries_on(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    done = _agent("--dry-run", "--once", "--kmsg", "none", "--sysfs-root", str(tmp_path / "sys"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("no RDMA device under") == 1
    batch = orjson.loads(done.stdout)
    assert batch["heartbeat"]["host"]["rdma"] is False
    host = next(item["fields"] for item in batch["node_metrics"] if item["subject"] == "host")
    assert host["mem_total_mib"] > 0  # the real /proc: percentages over the short --once interval
    assert 0 <= host["cpu_util_pct"] <= 100


def test_no_processes_reports_no_training_process_even_with_one_running(tmp_path: Path) -> None:
    """--no-processes (dcgm-exporter only): the torchrun-like worker below is not reported; without it, it is."""
    env = {**os.environ, "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "FAULTLINE_JOB_ID": "metrics-only-job"}
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        common = ["--dry-run", "--once", "--kmsg", "none", "--spool-dir", str(tmp_path / "unused")]
        seen = {}
        for flag in ([], ["--no-processes"]):
            done = _agent(*common, "--watch-pid", str(os.getpid()), *flag)
            assert done.returncode == 0, done.stderr
            (line,) = done.stdout.splitlines()
            seen[bool(flag)] = [p["pid"] for p in orjson.loads(line)["processes"]]
        assert worker.pid in seen[False] and seen[True] == []
    finally:
        worker.kill()
        worker.wait()


def test_node_labels_and_storage_mounts_reach_the_heartbeat(tmp_path: Path) -> None:
    done = _agent(
        "--dry-run", "--once", "--kmsg", "none", "--sysfs-root", str(paths.FIXTURES / "sysfs"),
        "--procfs-root", str(paths.FIXTURES / "procfs"), "--node-label", "rack=r12", "--node-label", "switch=leaf-7",
        "--volume", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    host = orjson.loads(done.stdout.splitlines()[0])["heartbeat"]["host"]
    assert (host["rack"], host["switch"], "power_domain" in host) == ("r12", "leaf-7", False)
    assert host["storage_mounts"] == [str(tmp_path)]  # the volumes, when no mount is named
    assert host["firmware_version"] == "96.00.99.00.01"
    # The environment's comma list; a key the service keeps no label for, or an empty value, is refused at start.
    env = {**os.environ, "FAULTLINE_AGENT_NODE_LABELS": "rack=r1,power_domain=pdu-2"}
    both = subprocess.run(
        [sys.executable, "-m", "faultline", "agent", "--dry-run", "--once", "--kmsg", "none", "--storage-mount",
         "/mnt/data", "--procfs-root", str(paths.FIXTURES / "procfs"), "--sysfs-root", str(paths.FIXTURES / "sysfs")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    host = orjson.loads(both.stdout.splitlines()[0])["heartbeat"]["host"]
    assert (host["rack"], host["power_domain"], host["storage_mounts"]) == ("r1", "pdu-2", ["/mnt/data"])
    for bad in ("row=7", "rack=", "rack"):
        refused = _agent("--dry-run", "--once", "--kmsg", "none", "--node-label", bad)
        assert refused.returncode == 2 and "node_labels" in refused.stderr, refused.stderr
