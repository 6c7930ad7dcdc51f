"""The network and host collectors on a fake sysfs/procfs laid out like the kernel's (tests/fixtures/*/README.md)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents import ethtool
from agents.counters import CounterTracker
from agents.ethtool import IoctlStats, parse_ethtool_s, pause_totals, stats_by_name
from agents.host import HostCollector, mce_count, parse_stat
from agents.network import NetworkCollector
from agents.node import SUBJECT, NodeCollectors
from agents.spool import Spool
from ml.node_metrics import NODE_COLUMNS, SUBJECT_PATTERN
from tests import paths

SYSFS = paths.FIXTURES / "sysfs"
PROCFS = paths.FIXTURES / "procfs"
TS = "2026-11-25T21:00:00+00:00"


def _by_subject(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    assert all(item["ts"] == TS for item in items)
    subjects = [item["subject"] for item in items]
    assert len(subjects) == len(set(subjects))
    return {item["subject"]: item["fields"] for item in items}


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A copy of the fake sysfs that a test may change."""
    return Path(shutil.copytree(SYSFS, tmp_path / "sys"))


def _set(root: Path, relative: str, value: int) -> None:
    (root / relative).write_text(f"{value}\n")


IB3 = "class/infiniband/mlx5_3/ports/1"
ROCE = "class/infiniband/mlx5_4/ports/1"


# -- network ---------------------------------------------------------------------------------------


def test_every_port_and_physical_nic_of_the_fixture_with_kernel_values() -> None:
    collector = NetworkCollector(SYSFS)
    ports = _by_subject(collector.read(TS))
    # IPoIB (type 32), a container's veth (no `device`) and lo are not Ethernet NICs.
    assert sorted(ports) == [
        "eth:eno1", "eth:ens4f0np0", "ib:mlx5_0/1", "ib:mlx5_1/1", "ib:mlx5_2/1", "ib:mlx5_3/1", "roce:mlx5_4/1",
    ]  # fmt: skip
    ib0 = ports["ib:mlx5_0/1"]
    assert (ib0["port_state"], ib0["port_phys_state"], ib0["port_rate_gbps"]) == (4, 5, 400.0)
    assert ib0["port_xmit_bytes"] == 1623459871234567 * 4  # sysfs counts 4-byte words
    assert ib0["port_rcv_bytes"] == 1618822345678901 * 4
    assert ib0["port_xmit_wait"] == 3421987654
    flaky = ports["ib:mlx5_2/1"]
    assert (flaky["symbol_error"], flaky["link_downed"], flaky["link_error_recovery"]) == (37, 1, 2)
    assert flaky["port_rcv_errors"] == 12 and flaky["local_link_integrity_errors"] == 1
    # Congestion counters exist on mlx5 RoCE ports only: absent on IB ones, and skipped without a word.
    assert "np_cnp_sent" not in ib0 and ib0["out_of_buffer"] == 0
    roce = ports["roce:mlx5_4/1"]
    assert roce["port_rate_gbps"] == 200.0
    assert (roce["np_cnp_sent"], roce["rp_cnp_handled"], roce["out_of_buffer"]) == (5523118, 4918273, 1402)
    assert "port_xmit_wait" not in roce  # no such file on this port
    # The RoCE port's PFC pause frames come from its netdev's ethtool stats (prio3 here), not *_duration.
    assert (roce["pause_rx_frames"], roce["pause_tx_frames"]) == (81234, 120455)
    assert ports["eth:ens4f0np0"] == {"rx_errors": 0, "tx_errors": 0, "rx_dropped": 17, "tx_dropped": 0}
    eno1 = ports["eth:eno1"]
    assert (eno1["rx_errors"], eno1["rx_dropped"], eno1["pause_rx_frames"], eno1["pause_tx_frames"]) == (
        3,
        2211,
        412,
        9,
    )
    assert collector.rdma is True


def test_every_name_and_subject_shipped_is_one_the_service_stores(tmp_path: Path) -> None:
    node = NodeCollectors(sysfs_root=SYSFS, procfs_root=PROCFS, volumes=[str(tmp_path)])
    node.prime()
    items = node.read(TS)
    kinds = {item["subject"].split(":")[0] for item in items}
    assert kinds == {"ib", "roce", "eth", "host", "vol"}
    for item in items:
        assert re.match(SUBJECT_PATTERN, item["subject"]), item["subject"]
        unknown = set(item["fields"]) - set(NODE_COLUMNS)
        assert not unknown, (item["subject"], unknown)
        assert all(isinstance(v, int | float) for v in item["fields"].values())
    shipped = {name for item in items for name in item["fields"]}
    # The fixture host exercises every column the service stores.
    assert shipped == set(NODE_COLUMNS)
    facts = node.facts()
    assert facts == {
        "driver_version": "550.54.15",
        "kernel": "5.15.0-105-generic",
        "firmware_version": "96.00.99.00.01",
        "rdma": True,
        "fabric_manager": "running",
        "ports": [
            "ib:mlx5_0/1",
            "ib:mlx5_1/1",
            "ib:mlx5_2/1",
            "ib:mlx5_3/1",
            "roce:mlx5_4/1",
            "eth:eno1",
            "eth:ens4f0np0",
        ],
    }
    assert all(re.match(SUBJECT_PATTERN, p) for p in facts["ports"])


def test_wrap_is_unwrapped_and_a_reset_ships_the_new_raw_value(sysfs: Path) -> None:
    collector = NetworkCollector(sysfs)
    cnp = f"{ROCE}/hw_counters/np_cnp_sent"  # a 32-bit firmware counter
    _set(sysfs, cnp, 2**32 - 100)
    _set(sysfs, "class/net/eno1/statistics/rx_dropped", 2**64 - 5)
    assert _by_subject(collector.read(TS))["roce:mlx5_4/1"]["np_cnp_sent"] == 2**32 - 100
    # A 32-bit counter passing 2**32: 100 to the top, 50 after it.
    _set(sysfs, cnp, 50)
    _set(sysfs, "class/net/eno1/statistics/rx_dropped", 3)  # a 64-bit one: 5 + 3
    ports = _by_subject(collector.read(TS))
    assert ports["roce:mlx5_4/1"]["np_cnp_sent"] == 2**32 + 50
    assert ports["eth:eno1"]["rx_dropped"] == float(2**64 + 3)  # beyond int64: shipped as a float
    _set(sysfs, cnp, 400)
    assert _by_subject(collector.read(TS))["roce:mlx5_4/1"]["np_cnp_sent"] == 2**32 + 400
    # The 64-bit data counter (extended PMA counters) wraps as well, then is multiplied into bytes.
    data = f"{IB3}/counters/port_rcv_data"
    _set(sysfs, data, 2**64 - 10)
    collector.read(TS)
    _set(sysfs, data, 6)
    assert _by_subject(collector.read(TS))["ib:mlx5_3/1"]["port_rcv_bytes"] == float((2**64 + 6) * 4)
    # A drop no wrap explains (driver reload, counters cleared): the new raw value, no offset.
    _set(sysfs, cnp, 12)
    assert _by_subject(collector.read(TS))["roce:mlx5_4/1"]["np_cnp_sent"] == 12
    _set(sysfs, cnp, 20)
    assert _by_subject(collector.read(TS))["roce:mlx5_4/1"]["np_cnp_sent"] == 20
    # A 32-bit data counter (an HCA without extended counters) stuck at its top, then cleared: not a wrap.
    _set(sysfs, data, 2**32 - 1)
    collector.read(TS)
    _set(sysfs, data, 7)
    assert _by_subject(collector.read(TS))["ib:mlx5_3/1"]["port_rcv_bytes"] == 28


def test_saturated_error_counters_are_noted_and_never_grow(sysfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    tracker = CounterTracker()
    collector = NetworkCollector(sysfs, tracker=tracker)
    for _ in range(3):
        port = _by_subject(collector.read(TS))["ib:mlx5_3/1"]
        assert (port["symbol_error"], port["link_error_recovery"]) == (65535, 255)
    assert {("ib:mlx5_3/1", "symbol_error"), ("ib:mlx5_3/1", "link_error_recovery")} <= tracker.saturated
    assert sum("symbol_error is saturated" in r.message for r in caplog.records) == 1  # noted once
    # Cleared (perfquery -R): a saturating counter never "wraps"; 0 is shipped and the service sees a reset.
    _set(sysfs, f"{IB3}/counters/symbol_error", 0)
    assert _by_subject(collector.read(TS))["ib:mlx5_3/1"]["symbol_error"] == 0
    assert ("ib:mlx5_3/1", "symbol_error") not in tracker.saturated
    # 8-bit link_downed and 32-bit port_xmit_wait up to their tops: shipped as read, flagged, not extrapolated.
    _set(sysfs, f"{IB3}/counters/link_downed", 255)
    _set(sysfs, f"{IB3}/counters/port_xmit_wait", 2**32 - 1)
    for _ in range(2):
        port = _by_subject(collector.read(TS))["ib:mlx5_3/1"]
        assert (port["link_downed"], port["port_xmit_wait"]) == (255, 2**32 - 1)
    assert {("ib:mlx5_3/1", "link_downed"), ("ib:mlx5_3/1", "port_xmit_wait")} <= tracker.saturated
    _set(sysfs, f"{IB3}/counters/port_xmit_wait", 5)  # cleared, never taken for a wrap
    assert _by_subject(collector.read(TS))["ib:mlx5_3/1"]["port_xmit_wait"] == 5


def test_absent_counters_are_skipped_quietly_and_remembered(sysfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    shutil.rmtree(sysfs / IB3 / "hw_counters")  # a driver without hw_counters
    (sysfs / IB3 / "counters" / "port_xmit_discards").unlink()
    collector = NetworkCollector(sysfs)
    port = _by_subject(collector.read(TS))["ib:mlx5_3/1"]
    assert "out_of_buffer" not in port and "port_xmit_discards" not in port and port["symbol_error"] == 65535
    # Remembered at discovery: a file that shows up later on the same port is not looked for every tick.
    _set(sysfs, f"{IB3}/counters/port_xmit_discards", 9)
    assert "port_xmit_discards" not in _by_subject(collector.read(TS))["ib:mlx5_3/1"]
    assert not [
        r for r in caplog.records if r.levelno >= logging.WARNING and "mlx5_3" in r.message and "satur" not in r.message
    ]


def test_a_port_state_of_nop_is_shipped_as_unknown_not_down(sysfs: Path) -> None:
    """`0: NOP` (the kernel has no state for the port yet) is no state: a 0 would pull the window's mean port
    state below ACTIVE between two windows up, which the service reads as a flap."""
    collector = NetworkCollector(sysfs)
    (sysfs / IB3 / "state").write_text("0: NOP\n")
    assert _by_subject(collector.read(TS))["ib:mlx5_3/1"]["port_state"] is None
    (sysfs / IB3 / "state").write_text("1: DOWN\n")
    assert _by_subject(collector.read(TS))["ib:mlx5_3/1"]["port_state"] == 1


def test_a_port_removed_mid_run_is_skipped_without_a_crash(sysfs: Path) -> None:
    collector = NetworkCollector(sysfs)
    assert "ib:mlx5_2/1" in _by_subject(collector.read(TS))
    # Files gone between discovery and reading (the device is being removed): that port is left out.
    (sysfs / "class/infiniband/mlx5_2/ports/1/state").unlink()
    assert "ib:mlx5_2/1" not in _by_subject(collector.read(TS))
    shutil.rmtree(sysfs / "class/infiniband/mlx5_2")
    shutil.rmtree(sysfs / "class/net/eno1")
    ports = _by_subject(collector.read(TS))
    assert "ib:mlx5_2/1" not in ports and "eth:eno1" not in ports and "ib:mlx5_3/1" in ports
    assert "ib:mlx5_2/1" not in collector.subjects


def test_a_host_without_rdma_says_so_once_and_carries_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "class" / "net", root / "class" / "net")
    collector = NetworkCollector(root)
    for _ in range(3):
        assert set(_by_subject(collector.read(TS))) == {"eth:eno1", "eth:ens4f0np0"}
    said = [r.message for r in caplog.records if "no RDMA device" in r.message]
    assert said == [
        f"no RDMA device under {root / 'class' / 'infiniband'}: no InfiniBand/RoCE port metrics on this host"
    ]
    assert collector.rdma is False
    node = NodeCollectors(sysfs_root=root, procfs_root=PROCFS, volumes=[])
    node.read(TS)
    assert node.facts()["rdma"] is False


def test_ethtool_s_output_and_pause_sums() -> None:
    text = (SYSFS / "class/net/ens4f0np0/ethtool_stats").read_text()
    stats = parse_ethtool_s(text)
    assert stats["rx_prio3_pause"] == 81234 and stats["rx_prio3_pause_duration"] == 3 * 81234
    assert pause_totals(stats) == {"rx": 81234, "tx": 120455}
    assert pause_totals({"rx_pause_ctrl_phy": 4, "rx_prio0_pause": 1, "rx_prio0_pause_transition": 7}) == {"rx": 5}
    assert pause_totals({"rx_packets": 9}) == {}


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    """A veth pair (root only): veth has ethtool statistics, so the ioctl path runs against a real driver."""
    a, b = f"flt{os.getpid() % 100000}a", f"flt{os.getpid() % 100000}b"
    try:
        made = subprocess.run(
            ["ip", "link", "add", a, "type", "veth", "peer", "name", b], capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no `ip` command to create a veth pair")
    if made.returncode != 0:
        pytest.skip(f"cannot create a veth pair here (needs CAP_NET_ADMIN): {made.stderr.strip()}")
    try:
        yield a, b
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)


def test_ethtool_ioctl_reads_a_real_drivers_statistics(veth: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = veth
    stats = stats_by_name(a)
    # veth's first statistic is the peer's ifindex (drivers/net/veth.c, veth_get_ethtool_stats).
    assert stats["peer_ifindex"] == int(Path(f"/sys/class/net/{b}/ifindex").read_text())
    assert "rx_queue_0_xdp_packets" in stats
    reader = IoctlStats()
    try:
        assert reader.read(a) is None  # veth has no pause counters: asked once, then remembered
        assert a in reader._unsupported
        # The same GSSET_INFO/GSTRINGS/GSTATS path, with names veth has standing in for pause counters.
        monkeypatch.setattr(ethtool, "_PAUSE", re.compile(r"^(rx|tx)_queue_0_xdp_(?:packets|xmit)$"))
        fresh = IoctlStats()
        assert fresh.read(a) == {"rx": 0, "tx": 0}
        names = list(stats)
        count, rx, tx = fresh._layout[a]
        assert (count, rx, tx) == (
            len(names),
            [names.index("rx_queue_0_xdp_packets")],
            [names.index("tx_queue_0_xdp_xmit")],
        )
        fresh.close()
        assert IoctlStats().read("flt-no-such-dev") is None
    finally:
        reader.close()


# -- host ------------------------------------------------------------------------------------------


def test_host_readings_from_the_fixture(tmp_path: Path) -> None:
    host = HostCollector(PROCFS, SYSFS, volumes=[str(tmp_path)])
    items = _by_subject(host.read(TS))
    fields = items["host"]
    assert fields["load1"] == 15.82
    assert fields["mem_total_mib"] == round(2113442816 / 1024, 1)
    assert fields["mem_available_mib"] == round(1802345678 / 1024, 1)
    assert fields["swap_used_mib"] == round((8388604 - 8126460) / 1024, 1)
    assert (fields["psi_cpu_some_avg10"], fields["psi_mem_some_avg10"], fields["psi_mem_full_avg10"]) == (
        1.52,
        0.0,
        0.0,
    )
    assert (fields["psi_io_some_avg10"], fields["psi_io_full_avg10"]) == (4.87, 3.21)
    assert (fields["mce_events"], fields["edac_ce"], fields["edac_ue"]) == (3, 4, 0)
    assert (fields["nvidia_driver_loaded"], fields["fabric_manager_running"]) == (1, 1)
    # A frozen tree has no tick between readings: the figures since boot.
    assert 0 < fields["cpu_util_pct"] < 100 and fields["cpu_iowait_max_core_pct"] > fields["cpu_iowait_pct"]
    volume = items[f"vol:{tmp_path}"]
    st = os.statvfs(tmp_path)
    assert volume["disk_total_bytes"] == st.f_blocks * st.f_frsize and 0 <= volume["disk_free_pct"] <= 100
    assert host.facts() == {
        "driver_version": "550.54.15",
        "kernel": "5.15.0-105-generic",
        "firmware_version": "96.00.99.00.01",
    }


def test_cpu_percentages_are_deltas_between_readings(tmp_path: Path) -> None:
    proc = Path(shutil.copytree(PROCFS, tmp_path / "proc"))
    before = (proc / "stat").read_text()
    host = HostCollector(proc, SYSFS)
    host.prime()
    # 4 cores, then 400 ticks each: core 2 spends 100 of them stolen, core 3 300 in iowait.
    lines = ["cpu  1000 0 0 1000 0 0 0 0 0 0"] + [f"cpu{c} 250 0 0 250 0 0 0 0 0 0" for c in range(4)]
    (proc / "stat").write_text("\n".join(lines) + "\nbtime 1\n")
    host.prime()
    lines = ["cpu  2100 0 0 1100 300 0 0 100 0 0", "cpu0 650 0 0 250 0 0 0 0 0 0", "cpu1 650 0 0 250 0 0 0 0 0 0",
             "cpu2 550 0 0 250 0 0 0 100 0 0", "cpu3 250 0 0 350 300 0 0 0 0 0"]  # fmt: skip
    (proc / "stat").write_text("\n".join(lines) + "\n")
    fields = _by_subject(host.read(TS))["host"]
    assert fields["cpu_util_pct"] == 75.0  # 1,200 busy of 1,600
    assert (fields["cpu_steal_pct"], fields["cpu_steal_max_core_pct"]) == (6.25, 25.0)
    assert (fields["cpu_iowait_pct"], fields["cpu_iowait_max_core_pct"]) == (18.75, 75.0)
    assert parse_stat(before)[0] is not None and len(parse_stat(before)[1]) == 16


def test_what_a_host_lacks_is_left_out_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    proc = tmp_path / "proc"
    proc.mkdir()
    for name in ("stat", "meminfo", "loadavg"):  # a VM: no PSI, no NVIDIA driver, no MCE row, no EDAC
        shutil.copy(PROCFS / name, proc / name)
    (proc / "interrupts").write_text("           CPU0\n  0:         38   IO-APIC   2-edge      timer\n")
    host = HostCollector(proc, tmp_path / "sys", volumes=[str(tmp_path / "gone")])
    fields = _by_subject(host.read(TS))["host"]
    assert fields["nvidia_driver_loaded"] == 0
    for absent in ("psi_cpu_some_avg10", "psi_io_full_avg10", "mce_events", "edac_ce", "fabric_manager_running"):
        assert absent not in fields
    assert set(_by_subject(host.read(TS))) == {"host"}  # the missing volume is left out
    assert sum("watched volume" in r.message for r in caplog.records) == 1  # said once
    assert host.facts() == {"driver_version": None, "kernel": None, "firmware_version": None}
    assert HostCollector(tmp_path / "nothing", tmp_path / "nothing").read(TS) == [
        {"ts": TS, "subject": "host", "fields": {"nvidia_driver_loaded": 0}}
    ]


def test_fabric_manager_only_on_nvswitch_hosts_and_found_by_comm(tmp_path: Path) -> None:
    proc = Path(shutil.copytree(PROCFS, tmp_path / "proc"))
    host = HostCollector(proc, SYSFS)
    assert _by_subject(host.read(TS))["host"]["fabric_manager_running"] == 1
    shutil.rmtree(proc / "2871")  # the fabric manager died
    assert _by_subject(host.read(TS))["host"]["fabric_manager_running"] == 0
    (proc / "40001").mkdir()
    (proc / "40001" / "comm").write_text("nv-fabricmanage\n")  # restarted under a new pid
    assert _by_subject(host.read(TS))["host"]["fabric_manager_running"] == 1
    shutil.rmtree(proc / "driver" / "nvidia-nvswitch")  # an HGX board without NVSwitches: no such reading
    assert "fabric_manager_running" not in _by_subject(host.read(TS))["host"]
    assert host.fabric_manager_state() is None


def test_fabric_manager_state_is_a_heartbeat_fact(tmp_path: Path) -> None:
    proc = Path(shutil.copytree(PROCFS, tmp_path / "proc"))
    node = NodeCollectors(sysfs_root=SYSFS, procfs_root=proc, volumes=[])
    assert node.facts()["fabric_manager"] == "running"
    shutil.rmtree(proc / "2871")  # the fabric manager died: the NVSwitches' routes are no longer managed
    assert node.facts()["fabric_manager"] == "stopped"


def test_location_versions_and_mounts_are_heartbeat_facts(tmp_path: Path) -> None:
    node = NodeCollectors(
        sysfs_root=SYSFS,
        procfs_root=PROCFS,
        volumes=[],
        location={"rack": "r12", "switch": "leaf-7", "power_domain": "pdu-3"},
        storage_mounts=["/mnt/datasets"],
    )
    facts = node.facts()
    assert (facts["rack"], facts["switch"], facts["power_domain"]) == ("r12", "leaf-7", "pdu-3")
    assert facts["storage_mounts"] == ["/mnt/datasets"]
    # The GPUs' firmware: the most common video BIOS; one the driver cannot read ("??...") does not count.
    proc = Path(shutil.copytree(PROCFS, tmp_path / "proc"))
    gpus = proc / "driver" / "nvidia" / "gpus"
    for pci, vbios in (("0000:3b:00.0", "96.00.74.00.0A"), ("0000:5d:00.0", "??.??.??.??.??"), ("0000:9a:00.0", "")):
        (gpus / pci).mkdir()
        (gpus / pci / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nVideo BIOS: \t {vbios}\n")
    assert HostCollector(proc, SYSFS).vbios_version() == "96.00.99.00.01"
    shutil.rmtree(gpus)
    assert HostCollector(proc, SYSFS).facts()["firmware_version"] is None


def test_mce_row_is_summed_over_cpus() -> None:
    assert mce_count((PROCFS / "interrupts").read_text()) == 3
    assert mce_count(" MCE:          0          7   Machine check exceptions\n MCP:  5  5  Machine check polls\n") == 7
    assert mce_count("  0:   1  timer\n") is None


def test_edac_counts_are_summed_and_a_counter_reset_shows(tmp_path: Path) -> None:
    sys = Path(shutil.copytree(SYSFS, tmp_path / "sys"))
    host = HostCollector(PROCFS, sys)
    assert _by_subject(host.read(TS))["host"]["edac_ce"] == 4
    _set(sys, "devices/system/edac/mc/mc1/ce_count", 6)
    assert _by_subject(host.read(TS))["host"]["edac_ce"] == 9
    _set(sys, "devices/system/edac/mc/mc0/ce_count", 0)  # reset_counters written: a reset, not a wrap
    _set(sys, "devices/system/edac/mc/mc1/ce_count", 0)
    assert _by_subject(host.read(TS))["host"]["edac_ce"] == 0


# -- node ------------------------------------------------------------------------------------------


def test_a_collector_that_raises_costs_its_readings_not_the_agent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = NodeCollectors(sysfs_root=SYSFS, procfs_root=PROCFS, volumes=[])

    def broken(ts: str) -> list[dict[str, Any]]:
        raise RuntimeError("a driver nobody has seen")

    monkeypatch.setattr(node.network, "read", broken)
    for _ in range(3):
        assert [item["subject"] for item in node.read(TS)] == ["host"]
    assert sum("network collector failed" in r.message for r in caplog.records) == 1
    monkeypatch.undo()
    assert len(node.read(TS)) == 8


def test_spool_reads_names_written_before_node_metrics(tmp_path: Path) -> None:
    (tmp_path / f"{1:016d}-3-2-0-1.batch").write_bytes(b"x")  # four counts: an agent before node_metrics
    (tmp_path / f"{2:016d}-3-2-0-1-9.batch").write_bytes(b"y")
    spool = Spool(tmp_path, max_bytes=2**20, max_batches=10)
    first = spool.peek()
    assert first is not None and first.counts == {"metrics": 3, "logs": 2, "stacks": 0, "processes": 1}
    spool.remove(first)
    second = spool.peek()
    assert second is not None and second.counts["node_metrics"] == 9


def test_node_settings_from_flags_environment_and_file(tmp_path: Path) -> None:
    from agents.config import load

    config_file = tmp_path / "agent.toml"
    config_file.write_text('volumes = ["/ckpt", "/logs"]\nsysfs_root = "/fake/sys"\n')
    from_file = load({"dry_run": True}, config_file=config_file, environ={})
    assert from_file.volumes == ["/ckpt", "/logs"] and from_file.sysfs_root == Path("/fake/sys")
    assert from_file.procfs_root == Path("/proc")
    environ = {"FAULTLINE_AGENT_VOLUMES": "/a,/b", "FAULTLINE_AGENT_PROCFS_ROOT": "/fake/proc"}
    from_env = load({"dry_run": True}, config_file=config_file, environ=environ)
    assert from_env.volumes == ["/a", "/b"] and from_env.procfs_root == Path("/fake/proc")
    flags = load({"dry_run": True, "volumes": ["/c"], "sysfs_root": Path("/s")}, config_file=None, environ=environ)
    assert flags.volumes == ["/c"] and flags.sysfs_root == Path("/s")


def test_subjects_the_service_would_refuse_are_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert SUBJECT.pattern == SUBJECT_PATTERN  # the agent's copy of the service's rule
    sys = Path(shutil.copytree(SYSFS, tmp_path / "sys"))
    shutil.copytree(sys / "class/net/eno1", sys / "class/net/odd+name")
    long_volume = tmp_path / ("v" * 130)
    long_volume.mkdir()
    node = NodeCollectors(sysfs_root=sys, procfs_root=PROCFS, volumes=[str(long_volume), str(tmp_path)])
    for _ in range(2):
        subjects = {item["subject"] for item in node.read(TS)}
        assert "eth:eno1" in subjects and f"vol:{tmp_path}" in subjects
        assert not any("odd+name" in s or "vvvv" in s for s in subjects)
    assert "eth:odd+name" not in node.facts()["ports"]
    assert sum("leaving out" in r.message for r in caplog.records) == 2  # each said once
