"""Sampling every sample interval, shipping every ship interval: real agent processes against local receivers.

No assertion depends on how fast this machine is: the intervals are chosen so that what is checked
(several samples in a batch, a critical batch well before the next ship tick) holds by a wide margin.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agents.config import ConfigError, load
from agents.samples import SampleBuffer, left_over
from tests import paths
from tests.procs import wait_for
from tests.receiver import Receiver, receiver

GPUS = 4
XID79 = "[Sat Nov 22 10:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=python, GPU has fallen off the bus.\n"


def _exporter_page(scrape: int) -> bytes:
    """A dcgm-exporter page carrying the scrape's number, so each sample can be told apart."""
    return "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g}",Hostname="n1"}} {90 + g}\n'
        f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{g}",UUID="GPU-{g}",Hostname="n1"}} {scrape}\n'
        for g in range(GPUS)
    ).encode()


def _scrape(sample: dict[str, Any]) -> int:
    return int(sample["fields"]["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"])


@contextmanager
def _agent(server: str, dcgm: Receiver, tmp: Path, *flags: str) -> Iterator[subprocess.Popen[str]]:
    args = [
        sys.executable, "-m", "faultline", "agent", "--server", server, "--node-name", "n1",
        "--dcgm-url", f"{dcgm.url}/metrics", "--spool-dir", str(tmp / "spool"), *flags,
    ]  # fmt: skip
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_AGENT_")},
        "FAULTLINE_AGENT_TOKEN": "t",
    }
    with (tmp / "agent.log").open("a") as log, subprocess.Popen(args, env=env, stderr=log, text=True) as agent:
        try:
            yield agent
        finally:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=30)


def test_one_batch_carries_several_samples_per_gpu_each_with_its_own_time(tmp_path: Path) -> None:
    with receiver() as dcgm, receiver() as rx:
        dcgm.page = _exporter_page
        flags = ("--sample-interval", "0.2", "--ship-interval", "2", "--kmsg", "none")
        with _agent(rx.url, dcgm, tmp_path, *flags) as agent:
            wait_for(lambda: len(rx.requests) >= 2, timeout=30, what="a batch after the first")
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) == 0
    first, second = rx.bodies()[:2]
    assert {m["gpu"] for m in first["metrics"]} == set(range(GPUS))  # the batch at start: one sample
    by_gpu: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for sample in second["metrics"]:
        by_gpu[sample["gpu"]].append(sample)
    assert set(by_gpu) == set(range(GPUS))
    for samples in by_gpu.values():
        times = [s["ts"] for s in samples]
        assert len(samples) >= 3  # 2 s of 0.2 s samples: about ten
        assert len(set(times)) == len(times) and times == sorted(times)  # distinct instants, in order
        assert len({_scrape(s) for s in samples}) == len(samples)  # each from its own scrape
    # Every scrape the agent made went out exactly once, across all batches (the last one at SIGTERM).
    shipped = Counter(_scrape(m) for body in rx.bodies() for m in body["metrics"])
    assert set(shipped) == set(range(1, dcgm.gets + 1)) and set(shipped.values()) == {GPUS}


def test_a_critical_xid_goes_at_once_with_the_samples_so_far(tmp_path: Path) -> None:
    kernel = tmp_path / "kern.log"
    kernel.touch()
    with receiver() as dcgm, receiver() as rx:
        dcgm.page = _exporter_page
        flags = ("--sample-interval", "0.2", "--ship-interval", "600", "--kmsg", str(kernel))
        with _agent(rx.url, dcgm, tmp_path, *flags):
            wait_for(lambda: len(rx.requests) == 1, timeout=30, what="the first batch")  # sent at start
            wait_for(lambda: dcgm.gets >= 3, timeout=30, what="samples after it")
            with kernel.open("a") as f:
                f.write(XID79)
            # The next ship tick is ten minutes away: this batch can only be the critical one.
            wait_for(lambda: len(rx.requests) >= 2, timeout=60, what="the critical batch")
    critical = rx.bodies()[1]
    (event,) = critical["logs"]
    assert event["kind"] == "xid" and event["fields"]["xid"] == 79 and event["severity"] == "critical"
    assert len(critical["metrics"]) >= 2 * GPUS  # the samples taken since the start went with it


def test_killed_between_ship_ticks_the_agent_loses_no_sample_it_took(tmp_path: Path) -> None:
    with receiver() as dcgm, receiver() as rx:
        dcgm.page = _exporter_page
        flags = ("--sample-interval", "0.2", "--ship-interval", "600", "--kmsg", "none")
        with _agent(rx.url, dcgm, tmp_path, *flags) as agent:
            wait_for(lambda: len(rx.requests) == 1, timeout=30, what="the first batch")
            wait_for(lambda: dcgm.gets >= 6, timeout=30, what="samples after it")
            agent.kill()  # SIGKILL, ten minutes before the next ship tick
            agent.wait()
        taken = dcgm.gets
        assert len(rx.requests) == 1 and list((tmp_path / "spool").glob("samples-*.jsonl"))
        dcgm.page = None  # the next agent reads no GPU: whatever arrives now is the first agent's
        with _agent(rx.url, dcgm, tmp_path, *flags):
            wait_for(lambda: len(rx.requests) >= 3, timeout=30, what="the recovered batch")
        assert "GPU samples the previous agent had not shipped" in (tmp_path / "agent.log").read_text()
    batches = {body["batch_id"]: body for body in rx.bodies()}  # the service stores a batch id once
    shipped = Counter(_scrape(m) for body in batches.values() for m in body["metrics"])
    # Every scrape is there once, except perhaps the one the kill cut between reading and journaling.
    assert set(range(1, taken)) <= set(shipped) <= set(range(1, taken + 1))
    assert set(shipped.values()) == {GPUS}
    assert not list((tmp_path / "spool").glob("samples-*.jsonl"))


def test_a_journal_left_behind_after_its_batch_was_spooled_keeps_the_batch_id(tmp_path: Path) -> None:
    """A kill after spooling a batch but before forgetting its samples re-sends them under the same id."""
    buffer = SampleBuffer(tmp_path)
    buffer.add([{"ts": "2026-11-22T10:00:00+00:00", "gpu": 0, "fields": {"X": 1.0}}])
    buffer.add([{"ts": "2026-11-22T10:00:01+00:00", "gpu": 0, "fields": {"X": 2.0}}])
    batch_id = buffer.batch_id
    buffer.close()  # killed here: the batch may be in the spool, the journal is still there
    with (tmp_path / f"samples-{batch_id}.jsonl").open("ab") as f:
        f.write(b'[{"ts": "2026-11-22T10:00:0')  # a torn last line
    ((path, recovered_id, metrics),) = left_over(tmp_path)
    assert recovered_id == batch_id and [m["fields"]["X"] for m in metrics] == [1.0, 2.0]

    fresh = SampleBuffer(tmp_path)
    fresh.add([{"ts": "2026-11-22T10:00:02+00:00", "gpu": 0, "fields": {}}])
    fresh.shipped()
    assert fresh.batch_id != batch_id and len(fresh) == 0 and left_over(tmp_path)[0][0] == path


def test_interval_defaults_the_old_name_and_the_sources() -> None:
    base = {"server": "http://s:1", "token": "t"}
    config = load(base, config_file=None, environ={})
    assert (config.sample_interval, config.ship_interval) == (1.0, 5.0)
    # --interval, the old name of the ship interval: the sample interval follows it below one second.
    old = load({**base, "interval": 5.0}, config_file=None, environ={})
    assert (old.sample_interval, old.ship_interval, old.interval) == (1.0, 5.0, 5.0)
    fast = load({**base, "interval": 0.5}, config_file=None, environ={})
    assert (fast.sample_interval, fast.ship_interval) == (0.5, 0.5)
    env = {"FAULTLINE_AGENT_SHIP_INTERVAL": "10", "FAULTLINE_AGENT_SAMPLE_INTERVAL": "2"}
    assert load(base, config_file=None, environ=env).sample_interval == 2.0
    # A flag for the old name overrides the variable for the new one, like any flag overrides a variable.
    assert load({**base, "interval": 30.0}, config_file=None, environ=env).ship_interval == 30.0


def test_interval_settings_in_a_config_file(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text('[agent]\nserver = "http://file:1"\ntoken = "t"\ninterval = 10\nsample-interval = 0.5\n')
    config = load({}, config_file=toml, environ={})
    assert (config.sample_interval, config.ship_interval) == (0.5, 10.0)
    toml.write_text('server = "http://file:1"\ntoken = "t"\ninterval = 10\nship_interval = 5\n')
    with pytest.raises(ConfigError, match="'interval' is the old name of 'ship_interval'; give only one"):
        load({}, config_file=toml, environ={})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"sample_interval": 10.0}, r"--sample-interval \(10 s\) must not be longer than --ship-interval \(5 s\)"),
        ({"sample_interval": 2.0, "ship_interval": 1.0}, r"must not be longer than --ship-interval \(1 s\)"),
        ({"ship_interval": 0.0}, r"--ship-interval \(or --interval\) must be a number of seconds > 0, not 0"),
        ({"interval": -1.0}, r"--ship-interval \(or --interval\) must be .* > 0, not -1"),
        ({"sample_interval": 0.0}, r"--sample-interval must be a number of seconds > 0, not 0"),
        ({"sample_interval": float("nan")}, r"--sample-interval must be a number of seconds > 0, not nan"),
        ({"interval": 5.0, "ship_interval": 5.0}, r"flags: --interval is the old name of --ship-interval"),
    ],
)
def test_interval_errors(flags: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load({"server": "http://s:1", "token": "t", **flags}, config_file=None, environ={})


def test_interval_errors_on_the_command_line_exit_2_with_the_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_AGENT_")}
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "agent", "--dry-run", "--sample-interval", "3", "--ship-interval", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    assert "faultline agent: --sample-interval (3 s) must not be longer than --ship-interval (1 s)" in done.stderr


def test_the_simulator_checks_the_intervals_it_gives_its_agents() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "sim", "--no-agents", "--sample-interval", "2", "--ship-interval", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--sample-interval must not be longer than --ship-interval" in done.stderr


def test_node_metrics_are_read_once_per_ship_tick_not_per_sample(tmp_path: Path) -> None:
    sysfs = Path(shutil.copytree(paths.FIXTURES / "sysfs", tmp_path / "sys"))
    wait = sysfs / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait"
    with receiver() as dcgm, receiver() as rx:
        dcgm.page = _exporter_page
        flags = ("--sample-interval", "0.2", "--ship-interval", "1", "--kmsg", "none", "--sysfs-root", str(sysfs))
        with _agent(rx.url, dcgm, tmp_path, *flags, "--volume", str(tmp_path)) as agent:
            wait_for(lambda: len(rx.requests) >= 1, timeout=30, what="the first batch")
            wait.write_text("3421990000\n")
            wait_for(lambda: len(rx.requests) >= 3, timeout=30, what="two more batches")
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) == 0
    bodies = rx.bodies()
    assert bodies[0]["heartbeat"]["host"]["rdma"] is True  # the facts go with the process scan
    for n, body in enumerate(bodies[:3]):
        subjects = [item["subject"] for item in body["node_metrics"]]
        # One reading of each subject per batch, while GPU samples were taken about five times (the batch at
        # start: once).
        assert len(subjects) == len(set(subjects)) == 9 and len(body["metrics"]) >= (2 if n else 1) * GPUS
        assert {"ib:mlx5_0/1", "roce:mlx5_4/1", "eth:eno1", "host", f"vol:{tmp_path}"} <= set(subjects)
    waits = [
        item["fields"]["port_xmit_wait"]
        for body in bodies
        for item in body["node_metrics"]
        if item["subject"] == "ib:mlx5_0/1"
    ]
    assert waits[0] == 3421987654 and waits[-1] == 3421990000


def test_a_port_going_down_goes_at_once_between_ship_ticks(tmp_path: Path) -> None:
    sysfs = Path(shutil.copytree(paths.FIXTURES / "sysfs", tmp_path / "sys"))
    port = sysfs / "class/infiniband/mlx5_3/ports/1"
    with receiver() as dcgm, receiver() as rx:
        dcgm.page = _exporter_page
        flags = ("--sample-interval", "0.2", "--ship-interval", "600", "--kmsg", "none", "--sysfs-root", str(sysfs))
        with _agent(rx.url, dcgm, tmp_path, *flags):
            wait_for(lambda: len(rx.requests) == 1, timeout=30, what="the first batch")  # sent at start
            wait_for(lambda: dcgm.gets >= 3, timeout=30, what="samples after it")
            (port / "counters" / "link_downed").write_text("4\n")
            (port / "state").write_text("1: DOWN\n")
            # The next ship tick is ten minutes away: this batch can only be the port's.
            wait_for(lambda: len(rx.requests) >= 2, timeout=60, what="the port's batch")
    (event,) = rx.bodies()[1]["logs"]
    assert (event["kind"], event["source"], event["severity"]) == ("port_down", "sysfs", "error")
    assert event["fields"]["port"] == "ib:mlx5_3/1" and event["fields"]["state"] == 1
    assert event["fields"]["link_downed"] in (3, 4)  # the state and the counter are two files: either read first
