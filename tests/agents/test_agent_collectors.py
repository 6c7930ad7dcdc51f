"""The agent's collectors on real inputs: /proc of real processes, real dcgm-exporter pages, real files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents.config import ConfigError, load
from agents.follow import FileTail, GlobFollower
from agents.gpu import ExporterParser, _reference, parse_exporter
from agents.procs import ProcessScanner
from tests import paths
from tests.procs import wait_for

FIXTURES = paths.FIXTURES / "formats"

# A "launcher" with two torchrun-like workers; worker 1 has a data loader child that inherits its env.
_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    procs = []
    for local in range(2):
        env = {**os.environ, "RANK": str(4 + local), "LOCAL_RANK": str(local), "GROUP_RANK": "2",
               "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "4242"}
        code = "import time; time.sleep(600)"
        if local == 1:
            code = (
                "import subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
            )
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env))
    time.sleep(600)
    """
)


@pytest.fixture
def launcher() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", _LAUNCHER], start_new_session=True)
    try:
        yield process
    finally:
        os.killpg(process.pid, 9)
        process.wait()


def test_scanner_finds_torchrun_workers_their_job_and_children(launcher: subprocess.Popen[bytes]) -> None:
    scanner = ProcessScanner(watch_pid=launcher.pid)

    def found() -> bool:
        workers = scanner.scan(time.monotonic())
        return len(workers) == 2 and len(workers[1].children) == 1

    wait_for(found, timeout=15, what="two workers and one data loader child")
    time.sleep(0.3)
    workers = scanner.scan(time.monotonic())
    assert [w.rank for w in workers] == [4, 5]
    # torchrun's default run id "none" is skipped: the Slurm job id names the job.
    assert {w.job_id for w in workers} == {"4242"}
    snap = workers[1].snapshot(datetime.now(UTC))
    assert snap["local_rank"] == 1 and snap["group_rank"] == 2 and snap["world_size"] == 8 and snap["gpu"] == 1
    assert snap["state"] in ("S", "R") and snap["rss_bytes"] > 1_000_000
    assert snap["cpu_pct"] is not None and snap["cpu_pct"] < 50  # a sleeping process, measured since the last scan
    assert snap["children"][0]["name"].startswith("python")

    # Outside the launcher's subtree nothing is reported; without --watch-pid the whole host is scanned.
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        assert ProcessScanner(watch_pid=other.pid).scan(time.monotonic()) == []
        other.kill()
    assert {w.pid for w in workers} <= {w.pid for w in ProcessScanner().scan(time.monotonic())}
    assert [w.job_id for w in ProcessScanner(job_env=["TORCHELASTIC_RUN_ID"], watch_pid=launcher.pid).scan(0)] == [
        None,
        None,
    ]


def _page(name: str) -> str:
    # The fixtures carry a provenance header before `---`; the page is what follows.
    text = (FIXTURES / name).read_text()
    return text.split("\n---\n", 1)[1]


def test_exporter_pages_of_real_exporters() -> None:
    v100 = parse_exporter(_page("dcgm_exporter_metrics_v100_issue250.txt"))
    assert [g.gpu for g in v100] == [0, 1, 2, 3]
    assert v100[0].uuid == "GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"
    assert v100[0].model == "Tesla V100-SXM2-32GB" and v100[0].hostname == "r6i3n0"
    assert v100[2].fields["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == 300.0

    xid = parse_exporter(_page("dcgm_exporter_xid_count_pr239.txt"))
    # One series per Xid code: the code stays in the field name instead of overwriting another series.
    assert xid[0].fields == {'DCGM_FI_DEV_XID_ERRORS_ACTIVE{xid="42"}': 1.0}
    assert xid[0].hostname == "workstation"


def test_blank_sentinels_are_missing_and_both_hostname_spellings_work() -> None:
    page = (
        "# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge\n"
        'DCGM_FI_DEV_MEMORY_TEMP{gpu="0",UUID="GPU-1",hostname="a"} 9223372036854775794\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",hostname="a"} 41\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-2",Hostname="a"} 43\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-2",GPU_I_ID="3",GPU_I_PROFILE="1g.10gb",Hostname="a"} 99\n'
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2",Hostname="a"} 1.7976931348623157e+308\n'
        'node_load1{instance="x"} 3\n'
    )
    gpus = parse_exporter(page)
    assert gpus[0].fields == {"DCGM_FI_DEV_MEMORY_TEMP": None, "DCGM_FI_DEV_GPU_TEMP": 41.0}
    assert gpus[1].fields == {"DCGM_FI_DEV_GPU_TEMP": 43.0, "DCGM_FI_DEV_FB_USED": None}  # MIG row ignored
    assert gpus[1].uuid == "GPU-2" and gpus[0].hostname == gpus[1].hostname == "a"


def test_fast_parser_agrees_with_the_reference_parser() -> None:
    page = "".join(
        f"# HELP DCGM_FI_F{n} h\n# TYPE DCGM_FI_F{n} {'counter' if n % 2 else 'gauge'}\n"
        + "".join(
            f'DCGM_FI_F{n}{{gpu="{g}",UUID="GPU-{g}",modelName="H100 \\"SXM\\""}} {n * 10 + g}\n' for g in range(8)
        )
        for n in range(20)
    )
    fast = ExporterParser().parse(page)
    assert [(s.gpu, s.fields) for s in fast] == [
        (g, {f"DCGM_FI_F{n}": float(n * 10 + g) for n in range(20)}) for g in range(8)
    ]
    reference = sorted((n, s.gpu, v) for n, s, v in _reference(page))
    assert len(reference) == 160 and fast[0].model == 'H100 "SXM"'
    # A page the fast path cannot read falls back to the reference parser, and garbage yields nothing.
    (only,) = parse_exporter('DCGM_FI_X{gpu="0"} 1\nbroken line with no value {\n')
    assert (only.gpu, only.fields) == (0, {"DCGM_FI_X": 1.0})
    assert parse_exporter("") == []


def test_file_tail_survives_rotation_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("old line\n")
    tail = FileTail(str(path), from_start=False)
    assert tail.poll() == []  # started at the end: history is not shipped
    with path.open("a") as f:
        f.write("one\ntw")
    assert tail.poll() == ["one"]  # a partial line waits for its newline
    with path.open("a") as f:
        f.write("o\n")
    assert tail.poll() == ["two"]
    path.rename(tmp_path / "train.log.1")  # logrotate: rename, then a new file
    with (tmp_path / "train.log.1").open("a") as f:
        f.write("three\n")
    path.write_text("four\n")
    assert tail.poll() == ["three", "four"]
    path.write_text("x\n")  # truncated and rewritten (copytruncate)
    assert tail.poll() == ["x"]
    position = tail.position()
    with path.open("a") as f:
        f.write("five\n")
    resumed = FileTail(str(path), from_start=False, position=position)  # a restarted agent
    assert resumed.poll() == ["five"]


def test_glob_follower_picks_up_new_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GlobFollower, "RESCAN_SECONDS", 0.0)
    follower = GlobFollower([str(tmp_path / "*.log")], from_start=False)
    (tmp_path / "rank0.log").write_text("hello\n")
    assert follower.poll() == {str(tmp_path / "rank0.log"): ["hello"]}


def test_config_precedence_and_errors(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text('[agent]\nserver = "http://file:1"\ntoken = "from-file"\ninterval = 2\nlogs = ["/a/*.log"]\n')
    env = {"FAULTLINE_AGENT_TOKEN": "from-env", "FAULTLINE_AGENT_INTERVAL": "3"}
    config = load({"interval": 1.0, "logs": []}, config_file=toml, environ=env)
    assert (config.server, config.token, config.interval, config.logs) == (
        "http://file:1",
        "from-env",
        1.0,
        ["/a/*.log"],
    )
    with pytest.raises(ConfigError, match="--server and --token required"):
        load({}, config_file=None, environ={})
    assert load({"dry_run": True}, config_file=None, environ={}).dry_run
    toml.write_text("intervall = 2\n")
    with pytest.raises(ConfigError, match="unknown setting 'intervall'"):
        load({}, config_file=toml, environ={})
    with pytest.raises(ConfigError, match="http"):
        load({"server": "faultline:8080", "token": "t"}, config_file=None, environ={})


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="needs read and write access to /dev/kmsg")
def test_kmsg_device_delivers_new_kernel_records_to_the_parser() -> None:
    from agents.follow import KmsgDevice
    from agents.parsers.kernel import KernelLogParser

    device = KmsgDevice()  # starts at the end of the ring buffer: history is not shipped
    lines: list[str] = []

    def arrived() -> bool:
        lines.extend(device.poll())
        return any(marker in line for line in lines)

    try:
        device.poll()
        # A record written to /dev/kmsg goes into the kernel's ring buffer like any driver's message.
        marker = f"faultline-test-{uuid.uuid4().hex[:8]}"
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name={marker}, GPU has fallen off the bus.\n")
        wait_for(arrived, timeout=5, what="the record in /dev/kmsg")
    finally:
        device.close()
    record = next(line for line in lines if marker in line)
    assert record.split(";", 1)[0].count(",") >= 3  # the raw /dev/kmsg header: priority,seq,usec,flags
    (event,) = KernelLogParser(boot_time=datetime.now(UTC)).feed(record, now=datetime.now(UTC))
    assert event.kind == "xid" and event.fields["xid"] == 79 and event.critical
