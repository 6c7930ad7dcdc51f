"""The NVML fallback (agents/nvml.py, agents/nvml_xid.py) against a fake pynvml (lab/fakes/nvml.py) built on the
real module's constants, exceptions and structures; and the names it calls against the real nvidia-ml-py."""

from __future__ import annotations

import ast
import io
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pynvml as real
import pytest

from agents import nvml as agent_nvml
from agents import nvml_xid
from agents.agent import Agent
from agents.config import ConfigError, load
from agents.nvml import LINKS_DOWN, Nvml, open_nvml
from agents.nvml_xid import open_nvml_xids, pci_device, xid_line
from agents.parsers.kernel import KernelLogParser
from lab.bench import agent as bench
from lab.fakes.nvml import FakeNvml
from ml.metrics import CLOCK_EVENT_BITS, FIELD_TO_COLUMN
from tests import paths
from tests.procs import wait_for

_PYNVML_NAME = re.compile(r"(?:nvml[A-Z]|NVML)\w+")
GPM_FIELDS = [name for _, name in agent_nvml.GPM_METRICS]
NVLINK_FIELDS = [name for _, name in agent_nvml.NVLINK_COUNTERS]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def nvml(fake: FakeNvml) -> Iterator[Nvml]:
    reader = open_nvml()
    assert reader is not None
    reader.slow_period = 0.0  # every read takes the slow readings too, unless a test says otherwise
    yield reader
    if fake.initialized:
        reader.close()


# -- the real module ---------------------------------------------------------------------------------


def _nvml_names(path: Path) -> set[str]:
    """Every pynvml name a module uses: attributes of the module (`nv.x`, `self.nv.x`, `pynvml.x`) and the strings
    it looks functions and constants up by."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id in ("nv", "pynvml")) or (
                isinstance(owner, ast.Attribute) and owner.attr == "nv"
            ):
                names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _PYNVML_NAME.fullmatch(node.value):
            names.add(node.value)
    return names


def test_every_pynvml_name_the_agent_uses_exists_in_the_real_module() -> None:
    used = _nvml_names(paths.REPO / "agents/nvml.py") | _nvml_names(paths.REPO / "agents/nvml_xid.py")
    assert {"nvmlDeviceGetRemappedRows", "nvmlGpmMetricsGet", "nvmlEventSetWait_v2", "NVMLError_NotSupported"} <= used
    assert sorted(name for name in used if not hasattr(real, name)) == []


def test_the_fake_offers_only_what_the_real_module_has() -> None:
    offered = {name for name in dir(FakeNvml) if name.startswith("nvml")} | set(vars(FakeNvml(1)))
    offered = {name for name in offered if name.startswith(("nvml", "NVML", "c_nvml"))}
    assert sorted(name for name in offered if not hasattr(real, name)) == []
    # Its errors are the real classes: the agent's `except` clauses see what a real driver raises.
    assert FakeNvml(1).NVMLError_NotSupported is real.NVMLError_NotSupported


def test_clock_event_bits_agree_with_the_service_and_with_nvml() -> None:
    assert agent_nvml.CLOCK_EVENT_BITS == CLOCK_EVENT_BITS
    nvml_names = {
        "gpu_idle": "GpuIdle",
        "applications_clocks": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal": "SwThermalSlowdown",
        "hw_thermal": "HwThermalSlowdown",
        "hw_power_brake": "HwPowerBrakeSlowdown",
        "display_clocks": "DisplayClockSetting",
    }
    for name, bit in agent_nvml.CLOCK_EVENT_BITS.items():
        assert getattr(real, "nvmlClocksEventReason" + nvml_names[name]) == bit, name
    assert agent_nvml.clock_event_flags(0x48) == ["hw_slowdown", "hw_thermal"]


# -- readings ------------------------------------------------------------------------------------------


def test_every_field_is_one_the_service_stores_in_dcgm_units(fake: FakeNvml, nvml: Nvml) -> None:
    fake.gpus[0].remapped = (3, 1, 1, 0)
    fake.gpus[0].ecc[(real.NVML_MEMORY_ERROR_TYPE_CORRECTED, real.NVML_AGGREGATE_ECC)] = 12
    fake.gpus[0].clock_reasons = real.nvmlClocksEventReasonHwSlowdown | real.nvmlClocksEventReasonSwPowerCap
    fake.gpus[1].link_gen = 1  # idling: the link trained down
    readings = nvml.read()
    assert [r.inventory() for r in readings] == [
        {
            "index": i,
            "uuid": f"GPU-0d6f4c1e-9a51-4c2b-8f7e-{i:012x}",
            "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
            "model": "NVIDIA H100 80GB HBM3",
        }
        for i in range(2)
    ]
    fields = readings[0].fields
    assert set(fields) - set(FIELD_TO_COLUMN) == set()  # the service would drop anything else
    assert len(fields) == 38
    assert fields["DCGM_FI_DEV_POWER_USAGE"] == 640.5 and fields["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == 700.0  # W
    assert fields["DCGM_FI_DEV_FB_USED"] == 70_000.0  # MiB
    assert fields["DCGM_FI_PROF_PCIE_TX_BYTES"] == 1_100_000 * 1024.0  # KB/s -> bytes/s
    assert fields["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 3 and fields["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1
    assert fields["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 1 and fields["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0
    assert fields["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] == 12 and fields["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"] == 0
    assert fields["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0xC
    assert (
        readings[1].fields["DCGM_FI_DEV_PCIE_LINK_GEN"] == 1
        and readings[1].fields["DCGM_FI_DEV_PCIE_MAX_LINK_GEN"] == 5
    )
    assert (
        fake.calls["nvmlDeviceGetGpuMaxPcieLinkGeneration"] == 2
        and not fake.calls["nvmlDeviceGetMaxPcieLinkGeneration"]
    )


def test_retired_pages_are_counted_by_cause(fake: FakeNvml, nvml: Nvml) -> None:
    fake.gpus[1].retired = {
        real.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [0x1000, 0x2000],
        real.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x3000],
    }
    fake.gpus[1].retired_pending = 1
    fields = nvml.read()[1].fields
    assert (fields["DCGM_FI_DEV_RETIRED_SBE"], fields["DCGM_FI_DEV_RETIRED_DBE"]) == (2, 1)
    assert fields["DCGM_FI_DEV_RETIRED_PENDING"] == 1


def test_a_reading_the_gpu_does_not_support_is_asked_once(fake: FakeNvml, nvml: Nvml) -> None:
    fake.gpus[1].unsupported = {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPages", "nvmlDeviceGetPcieThroughput"}
    for _ in range(3):
        first, second = nvml.read()
        assert first.fields["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 0 and first.fields["DCGM_FI_DEV_RETIRED_SBE"] == 0
        assert "DCGM_FI_DEV_ROW_REMAP_PENDING" not in second.fields  # skipped: not a None every second
        assert "DCGM_FI_DEV_RETIRED_DBE" not in second.fields and "DCGM_FI_PROF_PCIE_RX_BYTES" not in second.fields
    assert fake.gpu_calls[("nvmlDeviceGetRemappedRows", 1)] == 1
    assert fake.gpu_calls[("nvmlDeviceGetRetiredPages", 1)] == 2  # one per cause, each once
    assert fake.gpu_calls[("nvmlDeviceGetPcieThroughput", 1)] == 2
    assert fake.gpu_calls[("nvmlDeviceGetRemappedRows", 0)] == 3


def test_an_older_driver_falls_back_to_throttle_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(1, missing=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuMaxPcieLinkGeneration"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    fake.gpus[0].clock_reasons = real.nvmlClocksThrottleReasonHwThermalSlowdown
    fake.gpus[0].max_link_gen = 4
    reader = open_nvml()
    assert reader is not None
    reader.slow_period = 0.0
    for _ in range(3):
        fields = reader.read()[0].fields
        assert fields["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x40 and fields["DCGM_FI_DEV_PCIE_MAX_LINK_GEN"] == 4
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # FunctionNotFound once, then the old name
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3
    reader.close()


def test_a_lost_gpu_reads_as_missing_values_and_comes_back(fake: FakeNvml, nvml: Nvml, caplog: Any) -> None:
    nvml.read()
    fake.gpus[1].lost = True
    with caplog.at_level(logging.WARNING, logger="agents.nvml"):
        first, second = nvml.read()
        nvml.read()
    assert first.fields["DCGM_FI_DEV_GPU_TEMP"] == 61
    assert second.fields and all(v is None for v in second.fields.values())
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_SM_ACTIVE", LINKS_DOWN, *NVLINK_FIELDS} <= set(second.fields)
    assert len([r for r in caplog.records if "GPU 1" in r.getMessage()]) == 1  # said once, not every second
    fake.gpus[1].lost = False
    nvml.read()  # GPM pairs this read's sample with the next one
    back = nvml.read()[1].fields
    assert back["DCGM_FI_DEV_GPU_TEMP"] == 61 and back[LINKS_DOWN] == 0
    assert back["DCGM_FI_PROF_SM_ACTIVE"] == pytest.approx(0.88)


def test_gpm_percentages_become_dcgm_ratios_and_samples_are_freed(fake: FakeNvml) -> None:
    fake.gpus[0].gpm = {
        real.NVML_GPM_METRIC_SM_UTIL: 75.0,
        real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 40.0,
        real.NVML_GPM_METRIC_DRAM_BW_UTIL: 12.5,
    }  # no occupancy on this one: that metric answers NotSupported inside the request
    fake.gpus[1].gpm = None  # older than Hopper
    reader = open_nvml()
    assert reader is not None
    first, second = reader.read()
    assert first.fields["DCGM_FI_PROF_SM_ACTIVE"] == 0.75 and first.fields["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == 0.4
    assert first.fields["DCGM_FI_PROF_DRAM_ACTIVE"] == 0.125 and first.fields["DCGM_FI_PROF_SM_OCCUPANCY"] is None
    assert not set(GPM_FIELDS) & set(second.fields)
    assert len(fake.samples) == 2  # two per Hopper GPU, reused every read
    reader.close()
    assert fake.samples == {} and fake.initialized == 0


def test_nvlinks_down_count_links_that_were_up(fake: FakeNvml) -> None:
    fake.gpus[0].nvlinks[5] = 0  # down before the agent started, beside 17 that are up: counted
    fake.gpus[1].nvlinks = [0] * 18  # no link in use (no NVLink wired): nothing is down
    fake.gpus[0].nvlink_errors = {
        (2, real.NVML_NVLINK_ERROR_DL_CRC_FLIT): 7,
        (9, real.NVML_NVLINK_ERROR_DL_CRC_FLIT): 1,
        (9, real.NVML_NVLINK_ERROR_DL_REPLAY): 4,
    }
    reader = open_nvml()
    assert reader is not None
    reader.slow_period = 0.0
    first, second = reader.read()
    assert first.fields[LINKS_DOWN] == 1 and second.fields[LINKS_DOWN] == 0
    assert first.fields["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 8
    assert first.fields["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"] == 4
    assert first.fields["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"] == 0
    fake.gpus[0].nvlinks[11] = 0
    fake.gpus[1].nvlinks[0] = 1  # came up: from now on it is expected up
    assert [r.fields[LINKS_DOWN] for r in reader.read()] == [2, 0]
    fake.gpus[1].nvlinks[0] = 0
    assert [r.fields[LINKS_DOWN] for r in reader.read()] == [2, 1]
    # Links 18..35 of NVML_NVLINK_MAX_LINKS answer InvalidArgument: asked once at start, never again.
    assert fake.gpu_calls[("nvmlDeviceGetNvLinkState", 0)] == real.NVML_NVLINK_MAX_LINKS + 3 * 18
    reader.close()


def test_slow_readings_come_every_slow_period_staggered_across_gpus(fake: FakeNvml) -> None:
    reader = open_nvml()
    assert reader is not None
    first = reader.read()
    assert all("DCGM_FI_DEV_PCIE_LINK_GEN" in r.fields for r in first)  # the first read takes everything
    second = reader.read()
    assert all("DCGM_FI_DEV_PCIE_LINK_GEN" not in r.fields and LINKS_DOWN not in r.fields for r in second)
    assert all("DCGM_FI_DEV_GPU_TEMP" in r.fields for r in second)
    due = [gpu.next_slow for gpu in reader.gpus]
    assert due[1] - due[0] == pytest.approx(agent_nvml.SLOW_PERIOD_S / 2, abs=0.05)
    reader.close()


def test_reading_cost_per_sample_on_eight_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(8)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = open_nvml()
    assert reader is not None
    reader.read()
    fake.calls.clear()
    reader.read()  # a read between slow periods: what every second costs
    assert fake.total_calls() == 8 * 11
    # The two counters that cost milliseconds a call on a real H200 are not among them.
    assert not {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieReplayCounter"} & set(fake.calls)
    reader.close()


def test_clock_slowdowns_are_logged_when_they_start_and_stop(fake: FakeNvml, nvml: Nvml, caplog: Any) -> None:
    with caplog.at_level(logging.INFO, logger="agents.nvml"):
        nvml.read()
        fake.gpus[1].clock_reasons = real.nvmlClocksEventReasonHwThermalSlowdown | real.nvmlClocksEventReasonSwPowerCap
        nvml.read()
        nvml.read()
        fake.gpus[1].clock_reasons = real.nvmlClocksEventReasonSwPowerCap
        nvml.read()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "GPU 1: clocks held back: hw_thermal (clock event reasons 0x44: sw_power_cap, hw_thermal)",
        "GPU 1: clocks no longer held back (was hw_thermal)",
    ]


# -- Xid events ----------------------------------------------------------------------------------------


def test_pci_device_is_named_as_the_kernel_names_it() -> None:
    assert pci_device("00000000:3B:00.0") == "0000:3b:00"
    assert pci_device("0000:b3:00.0") == "0000:b3:00"
    assert pci_device(None) is None


def test_an_xid_of_a_mig_instance_names_it_as_the_kernel_does() -> None:
    (event,) = KernelLogParser().feed(xid_line(31, "0000:3b:00", 1, 0), now=datetime.now(UTC))
    assert event.fields["pci"] == "0000:3b:00" and event.fields["xid"] == 31
    assert (event.fields["gpu_instance"], event.fields["compute_instance"]) == (1, 0)


def test_no_gpu_with_xid_events_means_no_watcher_and_nvml_is_let_go(fake: FakeNvml) -> None:
    for gpu in fake.gpus:
        gpu.xid_events = False
    assert open_nvml_xids(None) is None
    assert fake.initialized == 0 and all(s.freed for s in fake.event_sets)


def test_an_nvml_xid_is_the_event_the_kernel_line_makes_with_source_nvml(fake: FakeNvml, nvml: Nvml) -> None:
    fake.gpus[0].xid_events = False  # this GPU cannot register: the other is still watched
    xids = open_nvml_xids(nvml)
    assert xids is not None and xids.watching == 1
    xids.start()
    try:
        fake.xid(1, 79)
        fake.xid(1, 13)
        fake.xid(0, 79)  # not registered: never arrives
        events: list[Any] = []
        wait_for(lambda: len(events.__iadd__(xids.drain())) >= 2, timeout=10, what="two Xid events")
    finally:
        xids.close()
    fell, app = events
    assert fell.source == "nvml" and fell.kind == "xid" and fell.critical and fell.severity == "critical"
    assert fell.line == "NVRM: Xid (PCI:0000:19:00): 79, (from NVML event)"
    (kernel,) = KernelLogParser().feed(
        "[Sat Nov 22 10:00:00 2026] NVRM: Xid (PCI:0000:19:00): 79, pid=7, name=python, GPU has fallen off the bus.",
        now=datetime.now(UTC),
    )
    assert set(fell.fields) == set(kernel.fields)  # the service's Xid rules read the same fields
    assert {k: v for k, v in fell.fields.items() if k not in ("message", "pid", "process")} == {
        k: v for k, v in kernel.fields.items() if k not in ("message", "pid", "process")
    }
    assert fell.critical == kernel.critical and fell.severity == kernel.severity
    assert app.fields["xid"] == 13 and not app.critical and app.severity == "error"
    assert xids.drain() == [] and all(s.freed for s in fake.event_sets)


def test_a_failing_wait_is_said_once_and_the_watcher_carries_on(
    fake: FakeNvml, nvml: Nvml, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr(nvml_xid, "_ERROR_PAUSE_S", 0.01)
    fake.wait_errors = [real.NVMLError_GpuIsLost(), real.NVMLError_Unknown(), real.NVMLError_Timeout()]
    xids = open_nvml_xids(nvml)
    assert xids is not None
    with caplog.at_level(logging.WARNING, logger="agents.nvml_xid"):
        xids.start()
        try:
            wait_for(lambda: not fake.wait_errors, timeout=10, what="the failing waits")
            fake.xid(1, 48)
            events: list[Any] = []
            wait_for(lambda: bool(events.__iadd__(xids.drain())), timeout=10, what="the Xid after them")
        finally:
            xids.close()
    assert [e.fields["xid"] for e in events] == [48] and events[0].critical
    assert [r.getMessage() for r in caplog.records] == [
        "waiting for NVML Xid events failed: GPU is lost (trying again every 0.01 s)"
    ]


def test_an_nvml_xid_79_makes_the_agent_ship_at_once(fake: FakeNvml, tmp_path: Path) -> None:
    flags = {"dry_run": True, "kmsg": "none", "ship_interval": 600.0, "spool_dir": tmp_path}
    out = io.StringIO()
    agent = Agent(load(flags, config_file=None, environ={}), out=out)
    assert agent.nvml_xids is not None  # no kernel log followed, NVML reads the GPUs: on by default
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        wait_for(lambda: len(out.getvalue().splitlines()) == 1, timeout=10, what="the first batch")  # at start
        fake.xid(0, 79)
        # The next ship tick is ten minutes away: a second batch can only be the critical one.
        wait_for(lambda: len(out.getvalue().splitlines()) == 2, timeout=10, what="the critical batch")
    finally:
        agent.stopping.set()
        loop.join(timeout=10)
    (event,) = orjson.loads(out.getvalue().splitlines()[1])["logs"]
    assert event["source"] == "nvml" and event["kind"] == "xid" and event["severity"] == "critical"
    assert event["fields"]["xid"] == 79 and event["fields"]["pci"] == "0000:18:00"
    assert not loop.is_alive() and fake.initialized == 0


def test_nvml_xids_stay_off_while_the_kernel_log_is_followed_unless_asked(fake: FakeNvml, tmp_path: Path) -> None:
    kernel = tmp_path / "kern.log"
    kernel.touch()
    base = {"dry_run": True, "kmsg": str(kernel), "spool_dir": tmp_path}
    for mode, on in (("auto", False), ("on", True), ("off", False)):
        agent = Agent(load({**base, "nvml_xid": mode}, config_file=None, environ={}))
        try:
            assert (agent.nvml_xids is not None) == on, mode
        finally:
            agent._close_sources()
    agent = Agent(load({"dry_run": True, "kmsg": "none", "nvml_xid": "off"}, config_file=None, environ={}))
    assert agent.nvml_xids is None
    agent._close_sources()
    with pytest.raises(ConfigError, match="--nvml-xid must be one of auto, on, off"):
        load({"dry_run": True, "nvml_xid": "yes"}, config_file=None, environ={})


def test_nvml_xids_forced_beside_dcgm_exporter_open_nvml_of_their_own(fake: FakeNvml) -> None:
    xids = open_nvml_xids(None)
    assert xids is not None and xids.watching == 2 and fake.initialized == 1
    xids.close()
    assert fake.initialized == 0


# -- the command ---------------------------------------------------------------------------------------


def test_dry_run_once_prints_the_nvml_fields(tmp_path: Path) -> None:
    """`faultline agent --dry-run --once` on a node with NVML and no exporter, the fake standing in for the driver
    (started as `faultline bench agent --gpu-source nvml-fake` starts it)."""
    launcher, gpu_flags, env = bench._gpu_source("nvml-fake", 8, "http://127.0.0.1:9")
    env = {k: v for k, v in env.items() if not k.startswith("FAULTLINE_AGENT_")}
    done = subprocess.run(
        [*launcher, "agent", *gpu_flags, "--dry-run", "--once", "--kmsg", "none", "--node-name", "n1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (batch,) = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert {m["gpu"] for m in batch["metrics"]} == set(range(8))
    fields = batch["metrics"][0]["fields"]
    for name in (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        LINKS_DOWN,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ):
        assert name in fields, name
    assert batch["heartbeat"]["gpus"][3]["pci_bus_id"] == "00000000:1B:00.0"


def test_the_benchmark_counts_the_reader_s_calls_per_second() -> None:
    cost = bench.nvml_source_cost(gpus=8, sample_interval=1.0, seconds=600)
    # 11 calls per GPU every second; every 10 s per GPU 15 slow calls and 18 links x (state + 4 counters).
    assert cost["nvml_calls_per_s"] == pytest.approx(8 * 11 + 8 * (15 + 18 * 5) / 10, rel=0.03)
    assert cost["cpu_ms_per_read"] > 0
