"""Kernel log parser: real corpus samples, every prefix style, every Xid variant, AER, robustness."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from agents.events import SEVERITIES, Event
from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from agents.parsers.xid import CRITICAL_XIDS, XID_CATALOG, lookup
from tests import paths

FIXTURES = paths.FIXTURES
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
BOOT = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
KIND = r"^[a-z][a-z0-9_.-]{0,63}$"


def corpus(name: str) -> str:
    """A corpus log without its provenance header (everything up to the '---' line)."""
    text = (FIXTURES / "logs" / name).read_text()
    return text.split("\n---\n", 1)[1]


def parse(text: str, *, boot_time: datetime | None = BOOT) -> list[Event]:
    events = parse_text(KernelLogParser(boot_time=boot_time), text, now=NOW)
    for event in events:
        check_event(event)
    return events


def one(line: str, **kw: object) -> Event:
    events = parse(line, **kw)  # type: ignore[arg-type]
    assert len(events) == 1, events
    return events[0]


def check_event(event: Event) -> None:
    """What every event must satisfy to go on the wire."""
    import re

    assert event.source == "kmsg"
    assert re.match(KIND, event.kind)
    assert event.severity in SEVERITIES
    assert event.ts.tzinfo is not None
    json.dumps(event.to_wire(), allow_nan=False)
    assert len(event.line) <= 65_536


# -- corpus ----------------------------------------------------------------------------------------


def test_corpus_xid13_and_xid109_dmesg_t():
    events = parse(corpus("xid13_xid109_gpud_pr46.txt"))
    assert [e.fields["xid"] for e in events] == [13, 13, 13, 109]  # the nvidia-peermem line is not ours
    for e in events[:3]:
        assert e.fields["pci"] == "0000:cb:00"
        assert e.fields["pid"] is None and e.fields["process"] is None  # pid='<unknown>', name=<unknown>
        assert e.fields["action"] == "RESTART_APP" and e.severity == "error" and not e.critical
        assert e.ts == datetime(2024, 8, 30, 11, 43, 9, tzinfo=UTC)
    assert events[0].fields["message"].startswith("Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)")
    xid109 = events[3]
    assert xid109.fields["pid"] == 1797828 and xid109.fields["process"] == "pt_main_thread"
    assert xid109.fields["message"] == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
    assert xid109.fields["mnemonic"] == "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR"
    assert xid109.fields["action"] == "RESET_GPU" and xid109.critical and xid109.severity == "critical"
    assert xid109.ts == datetime(2024, 8, 30, 11, 43, 14, tzinfo=UTC)


def test_corpus_xid48_xid64_journald_with_dmesg_stamp():
    events = parse(corpus("xid48_dbe_xid64_gpuoperator_1146.txt"))
    assert [e.kind for e in events] == ["nvrm", "nvrm", "nvrm", "xid", "xid", "nvrm", "nvrm"]
    xid48, xid64 = events[3], events[4]
    assert (xid48.fields["xid"], xid48.fields["pci"], xid48.fields["pid"]) == (48, "0000:07:00", None)
    assert xid48.fields["message"].startswith("An uncorrectable double bit error (DBE)")
    assert xid48.critical and xid48.fields["action"] == "WORKFLOW_XID_48"
    assert xid64.fields["xid"] == 64 and xid64.critical and "codes" not in xid64.fields
    # The syslog wall time wins over the inner dmesg stamp; the year comes from `now` (Dec 2 is past).
    assert xid48.ts == datetime(2025, 12, 2, 11, 38, 47, tzinfo=UTC)
    init = events[0]
    assert init.fields == {
        "message": "GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5",
        "pci": "0000:0a:00.0",
        "failure": "init_failed",
        "gsp": False,
    }
    assert init.severity == "critical" and init.critical  # the driver cannot bring the GPU up: ship at once


def test_corpus_xid79_multiline_fallen_off_the_bus():
    events = parse(corpus("xid79_fallen_off_bus_multiline_nvsentinel_155.txt"))
    assert [e.kind for e in events] == ["xid", "nvrm", "nvrm"]
    fell = events[0]
    assert fell.fields["xid"] == 79 and fell.fields["from_multiline"] is True
    assert fell.fields["pci"] == "0000:b3:00" and fell.fields["pci_id"] == "10de:26b5"
    assert fell.critical and fell.severity == "critical" and fell.fields["action"] == "RESTART_BM"
    assert fell.line.count("\n") == 2 and "fallen off the bus" in fell.line
    assert fell.ts == BOOT + timedelta(seconds=1843.308145)
    assert events[1].fields["message"] == "The NVIDIA probe routine failed for 1 device(s)."
    assert events[1].severity == "warning" and events[2].severity == "info"


def test_corpus_pcie_aer_corrected_blocks():
    events = parse(corpus("pcie_aer_gpu_unknown_error_returnn_1486.txt"))
    assert [e.kind for e in events] == ["pcie_aer", "pcie_aer"]  # shell lines and nvidia-smi output ignored
    for e in events:
        assert e.fields["device"] == "0000:00:03.0"
        assert e.fields["severity"] == "corrected"
        assert e.fields["type"] == "Data Link Layer"
        assert e.fields["agent"] == "Transmitter ID"
        assert (e.fields["vendor_device"], e.fields["status"], e.fields["mask"]) == (
            "8086:6f08",
            "00001000",
            "00002000",
        )
        assert e.fields["errors"] == ["Timeout"]
        assert e.severity == "warning" and not e.critical
        assert e.line.count("\n") == 3  # header and three detail lines: one event


# -- prefix styles ---------------------------------------------------------------------------------

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("line", "ts"),
    [
        (f"6,1234,5678901,-;{XID79}", BOOT + timedelta(microseconds=5678901)),
        (f"3,1234,5678901,-,caller=T12;{XID79}", BOOT + timedelta(microseconds=5678901)),
        (f"[ 1234.567890] {XID79}", BOOT + timedelta(seconds=1234.56789)),
        (f"[Sat Nov 22 10:00:00 2026] {XID79}", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        (f"Nov 22 10:00:00 gpu-node-7 kernel: {XID79}", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        (f"Nov 22 10:00:00.250000 gpu-node-7 kernel: {XID79}", datetime(2026, 11, 22, 10, 0, 0, 250000, tzinfo=UTC)),
        (f"2026-11-22T10:00:00+0000 gpu-node-7 kernel: {XID79}", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        (f"2026-11-22T10:00:00+00:00 gpu-node-7 kernel: {XID79}", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        (f"2026-11-22T11:00:00+01:00 gpu-node-7 kernel: {XID79}", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        (
            f"2026-11-22T10:00:00.123456Z gpu-node-7 kernel: {XID79}",
            datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=UTC),
        ),
        (f"kern  :warn  : [ 1234.567890] {XID79}", BOOT + timedelta(seconds=1234.56789)),
        (f"[  +0.000316] {XID79}", NOW),
        (XID79, NOW),
    ],
)
def test_prefix_styles(line: str, ts: datetime):
    event = one(line)
    assert event.kind == "xid" and event.fields["xid"] == 79 and event.fields["pci"] == "0000:3b:00"
    assert event.fields["pid"] == 1234 and event.fields["process"] == "python"
    assert event.fields["message"] == "GPU has fallen off the bus."
    assert event.ts == ts
    assert event.line == line  # the raw line, prefix and all


def test_monotonic_stamps_without_boot_time_use_now():
    assert one(f"[ 1234.567890] {XID79}", boot_time=None).ts == NOW
    assert one(f"6,1,5678901,-;{XID79}", boot_time=None).ts == NOW


def test_journald_short_without_year_rolls_back_over_new_year():
    parser = KernelLogParser()
    jan = datetime(2027, 1, 1, 0, 5, tzinfo=UTC)
    [event] = parser.feed(f"Dec 31 23:59:59 host kernel: {XID79}", now=jan)
    assert event.ts == datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)


def test_kmsg_dictionary_continuation_lines_are_ignored():
    events = parse(f"6,1234,5678901,-;{XID79}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
    assert len(events) == 1


def test_kmsg_record_with_escaped_newlines_is_one_fallen_off_event():
    record = (
        "4,555,1000000,-;NVRM: The NVIDIA GPU 0000:3b:00.0\\x0aNVRM: (PCI ID: 10de:20b0) installed in this system"
        " has\\x0aNVRM: fallen off the bus and is not responding to commands."
    )
    event = one(record)
    assert event.kind == "xid" and event.fields["xid"] == 79 and event.fields["from_multiline"]
    assert event.fields["pci"] == "0000:3b:00" and event.ts == BOOT + timedelta(seconds=1)
    assert event.line.split("\n") == [
        record,
        "NVRM: (PCI ID: 10de:20b0) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]


# -- Xid variants ----------------------------------------------------------------------------------


def test_xid_without_pid_or_name_old_driver():
    event = one("NVRM: Xid (0000:03:00): 13, Graphics Exception: ChID 0010, Class 0000c797, Offset 00000000")
    assert event.fields["xid"] == 13 and event.fields["pci"] == "0000:03:00"
    assert event.fields["pid"] is None and event.fields["process"] is None
    assert event.fields["message"] == "Graphics Exception: ChID 0010, Class 0000c797, Offset 00000000"


def test_xid_pid_without_name():
    event = one("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    assert event.fields["pid"] == 1234 and event.fields["process"] is None
    assert event.fields["message"] == "GPU has fallen off the bus."


def test_xid_message_with_commas_is_kept_whole():
    event = one("NVRM: Xid (PCI:0000:3b:00): 31, pid=2222, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault")
    assert event.fields["message"] == "Ch 00000008, intr 00000000. MMU Fault"
    assert event.fields["process"] == "pt_main_thread"


def test_xid_caused_by_previous_xid():
    event = one("NVRM: Xid (PCI:0000:3b:00): 45, pid=2222, name=python3, Ch 00000008 caused by previous Xid 149")
    assert event.fields["xid"] == 45 and event.fields["caused_by_xid"] == 149
    assert event.severity == "error" and not event.critical  # fallout of the NVLink error, not its own


def test_xid_nvlink5_fatal_with_link_and_subcode():
    line = (
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 14 "
        "(0x0215c5c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    event = one(line)
    f = event.fields
    assert (f["xid"], f["pci"], f["link"], f["fatal"]) == (149, "0018:01:00", 14, True)
    assert f["subcode_name"] == "NETIR_LINK_EVT" and f["intrinfo"] == "0x0215c5c6" and f["error_status"] == "0x00000000"
    assert f["subcode"] == (0x0215C5C6 >> 20) & 0x3F
    assert len(f["codes"]) == 6 and f["mnemonic"] == "NVLINK_NETIR_ERROR"
    assert event.critical


def test_xid_nvlink5_nonfatal_is_an_error_not_critical():
    event = one("NVRM: Xid (PCI:0018:01:00): 145, NVLink: RLW Nonfatal XC0 i0 Link 11 (0x00086226 0x00000001)")
    assert event.fields["link"] == 11 and event.fields["fatal"] is False
    assert event.fields["codes"] == ["0x00086226", "0x00000001"] and event.fields["subcode"] == 0
    assert event.severity == "error" and not event.critical


def test_xid_with_mig_attribution():
    event = one("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 94, pid=99, name=python, Contained: SM (0x1).")
    assert event.fields["pci"] == "0000:3b:00"
    assert (event.fields["gpu_instance"], event.fields["compute_instance"]) == (1, 0)
    # The catalog's action is kept; a contained ECC error ships at once (the service resets its GPU).
    assert event.fields["action"] == "RESTART_APP" and event.severity == "critical" and event.critical


@pytest.mark.parametrize(
    ("action_text", "critical"),
    [("0x1 (GPU Reset Required)", True), ("0x2 (Node Reboot Required)", True), ("0x0 (None)", False)],
)
def test_xid154_recovery_action(action_text: str, critical: bool):
    event = one(
        f"NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to {action_text}"
    )
    assert event.fields["recovery_action"] == action_text.split("(")[1].rstrip(")")
    assert event.critical is critical


def test_unknown_xid_is_an_error_without_action():
    event = one("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, something new")
    assert event.fields["xid"] == 999 and event.fields["action"] is None and event.fields["mnemonic"] is None
    assert event.severity == "error" and not event.critical


def test_one_line_xid79_and_multiline_block_are_two_events_not_three():
    text = "\n".join(
        [
            "[ 100.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
            "[ 100.1] NVRM: The NVIDIA GPU 0000:3b:00.0",
            "         NVRM: (PCI ID: 10de:20b0) installed in this system has",
            "         NVRM: fallen off the bus and is not responding to commands.",
            "[ 100.2] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x23:0x65:1426)",
        ]
    )
    events = parse(text)
    assert [(e.kind, e.fields.get("xid"), e.fields.get("from_multiline", False)) for e in events] == [
        ("xid", 79, False),
        ("xid", 79, True),
        ("nvrm", None, False),
    ]


def test_fallen_off_block_is_emitted_on_flush_when_input_stops_midway():
    parser = KernelLogParser()
    assert parser.feed("NVRM: The NVIDIA GPU 0000:3b:00.0", now=NOW) == []
    [event] = parser.flush(now=NOW)
    assert event.kind == "nvrm" and event.fields["pci"] == "0000:3b:00.0"  # never said it fell off
    assert parser.flush(now=NOW) == []


def test_same_opening_with_other_news_is_plain_nvrm():
    events = parse(
        "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:1db4)\n"
        "NVRM: installed in this system is not supported by the\n"
        "NVRM: NVIDIA 535.54 driver release.\n"
        "[ 5.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.54"
    )
    assert [e.kind for e in events] == ["nvrm", "nvrm"]
    assert "not supported" in events[0].fields["message"] and events[0].line.count("\n") == 2


# -- SXid, AER, other lines ------------------------------------------------------------------------


def test_sxid_non_fatal_and_fatal_with_detail_lines():
    events = parse(
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 44 LTSSM Fault Up\n"
        "[ 10.0] nvidia-nvswitch2: SXid (PCI:0000:88:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
        "[ 10.0] nvidia-nvswitch2: SXid (PCI:0000:88:00.0): 20034, Severity 5 Engine instance 30 Sub-engine\n"
        "[ 10.0] nvidia-nvswitch2: SXid (PCI:0000:88:00.0): 20034, Data {0x50610002, 0x10100030, 0x00000000}\n"
    )
    assert [e.kind for e in events] == ["sxid", "sxid"]
    nonfatal, fatal = events
    assert nonfatal.fields == {
        "sxid": 12028,
        "pci": "0000:05:00.0",
        "switch": "nvidia-nvswitch0",
        "fatal": False,
        "message": "Link 44 LTSSM Fault Up",
        "link": 44,
    }
    assert not nonfatal.critical and nonfatal.severity == "warning"
    assert fatal.fields["sxid"] == 20034 and fatal.fields["fatal"] is True and fatal.critical


def test_pcie_aer_uncorrected_fatal_from_root_port_and_device():
    events = parse(
        "[ 500.1] pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0\n"
        "[ 500.1] nvidia 0000:01:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
        "(Receiver ID)\n"
        "[ 500.1] nvidia 0000:01:00.0:   device [10de:2330] error status/mask=00000020/00000000\n"
        "[ 500.1] nvidia 0000:01:00.0:    [ 5] SDES                   (First)\n"
        "[ 501.0] pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0\n"
        "[ 501.0] nvidia 0000:01:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer,"
        " (Requester ID)\n"
        "[ 501.0] nvidia 0000:01:00.0: AER:    [14] CmpltTO                (First)\n"
        "[ 502.0] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n"
    )
    assert [e.fields["severity"] for e in events] == ["uncorrected_fatal", "uncorrected_nonfatal"]
    fatal, nonfatal = events
    assert fatal.fields["device"] == "0000:01:00.0" and fatal.fields["port"] == "0000:00:01.0"
    assert fatal.fields["type"] == "Transaction Layer" and fatal.fields["errors"] == ["SDES"]
    assert fatal.critical and fatal.severity == "critical"
    assert nonfatal.fields["errors"] == ["CmpltTO"] and nonfatal.severity == "error" and not nonfatal.critical


def test_pcie_bus_error_without_header_line():
    [event] = parse("pcieport 0000:00:01.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)")
    assert event.fields["severity"] == "corrected" and event.fields["type"] == "Physical Layer"
    assert event.fields["device"] == "0000:00:01.0"


def test_unrelated_kernel_lines_are_ignored():
    assert (
        parse(
            "[ 1.0] usb 1-1: new high-speed USB device\n"
            "Nov 22 10:00:00 host kernel: EXT4-fs (sda1): mounted filesystem\n"
            "6,99,100,-;audit: type=1400 apparmor=DENIED\n"
            "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context\n"
        )
        == []
    )


# -- the Xid table ---------------------------------------------------------------------------------


def test_xid_table_matches_the_catalog_fixture():
    rows = (FIXTURES / "formats" / "xid_catalog_nvidia_via_gpud.tsv").read_text().splitlines()
    catalog = {}
    for row in rows[2:]:
        code, mnemonic, _description, action, _investigatory = row.split("\t")
        catalog[int(code)] = (mnemonic.split(" /")[0].strip(), action)
    assert catalog == XID_CATALOG


@pytest.mark.parametrize(
    ("code", "severity"),
    [(79, "critical"), (48, "critical"), (64, "critical"), (109, "critical"), (74, "critical"), (13, "error"),
     (31, "error"), (43, "warning"), (63, "warning"), (94, "critical"), (154, "warning"), (171, "critical"),
     (162, "warning")],
)  # fmt: skip
def test_xid_severity_follows_the_immediate_action(code: int, severity: str):
    assert lookup(code).severity == severity
    assert (code in CRITICAL_XIDS) is (severity == "critical")


# -- robustness ------------------------------------------------------------------------------------


def test_never_raises_on_garbage_and_stays_consistent():
    rng = random.Random(1234)
    alphabet = "NVRM: Xid (PCI:0000:3b:00) 79, pid= name AER SXid []0123456789.,;\\x0a\t é漢😀\x00\x1b"
    parser = KernelLogParser(boot_time=BOOT)
    fed = 0
    for _ in range(3000):
        n = rng.choice([0, 1, 5, 40, 200])
        line = "".join(rng.choice(alphabet) for _ in range(n))
        if rng.random() < 0.2:
            line = (
                rng.choice(["6,1,2,-;", "[ 1.5] ", "Nov 22 10:00:00 h kernel: ", "NVRM: The NVIDIA GPU 0000:3b:00.0 "])
                + line
            )
        for event in parser.feed(line, now=NOW):
            check_event(event)
        fed += 1
    for event in parser.feed("[ 1.0] " + "NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * 1_000_000, now=NOW):
        check_event(event)
    for event in parser.flush(now=NOW):
        check_event(event)
    assert fed == 3000
    assert parser.parse_errors == 0  # the safety net caught nothing: the parser itself coped


def test_naive_now_is_taken_as_utc():
    [event] = KernelLogParser().feed(XID79, now=datetime(2026, 11, 22, 12, 0))
    assert event.ts == NOW


def test_rsyslog_escaped_newlines_are_split():
    line = (
        "Nov 22 10:00:00 host kernel: [ 5.0] NVRM: The NVIDIA GPU 0000:3b:00.0#012NVRM: (PCI ID: 10de:20b0) installed"
        " in this system has#012NVRM: fallen off the bus and is not responding to commands."
    )
    event = one(line)
    assert event.fields["xid"] == 79 and event.fields["pci"] == "0000:3b:00"
    assert event.ts == datetime(2026, 11, 22, 10, tzinfo=UTC)
    assert event.line.count("\n") == 2 and event.line.startswith(line)


# -- a network adapter's own failure (mlx5's health poller, drivers/net/ethernet/mellanox/mlx5/core/health.c) ------


def test_mlx5_health_fatal_error_is_a_critical_nic_fatal_event_with_its_device():
    event = one("[ 4021.118203] mlx5_core 0000:81:00.0: poll_health:806:(pid 0): Fatal error 1 detected")
    assert (event.kind, event.severity, event.critical) == ("nic_fatal", "critical", True)
    assert event.fields == {
        "device": "0000:81:00.0",
        "driver": "mlx5_core",
        "function": "poll_health",
        "error": 1,
        "message": "Fatal error 1 detected",
    }
    assert event.ts == BOOT + timedelta(seconds=4021.118203)


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_core 0000:81:00.0: poll_health:794:(pid 0): device's health compromised - reached miss count",
        "mlx5_core 0000:81:00.0: mlx5_health_try_recover:329:(pid 1843): handling bad device here",
        "mlx5_core mlx5_3: mlx5_health_try_recover:340:(pid 921): health recovery flow aborted, PCI reads still not "
        "working",
    ],
)
def test_mlx5_adapter_failures_in_each_form_are_nic_fatal(line: str):
    event = one(line)
    assert event.kind == "nic_fatal" and event.critical
    assert event.fields["device"] in ("0000:81:00.0", "mlx5_3") and "error" not in event.fields


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_core 0000:81:00.0 ibp129s0: Link down",  # the port watch's business
        "mlx5_core 0000:81:00.0: print_health_info:430:(pid 0): assert_var[0] 0x00000000",  # detail of the above
        "mlx5_core 0000:81:00.0: E-Switch: Total vports 10, per vport: max uc(1024) max mc(16384)",
        "mlx5_core 0000:81:00.0: mlx5_health_try_recover:337:(pid 1843): health recovery succeeded",
    ],
)
def test_other_mlx5_lines_are_not_adapter_failures(line: str):
    assert parse(line) == []


# Port module events (drivers/net/ethernet/mellanox/mlx5/core/events.c): mlx5_core_err since 5.x, mlx5_core_info
# (no function prefix) before; the first form as gpud's matcher quotes it (leptonai/gpud, infiniband kmsg matcher).


@pytest.mark.parametrize(
    ("line", "function", "problem"),
    [
        (
            "mlx5_core 0000:5c:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, "
            "Cable error, High Temperature",
            "mlx5_port_module_event",
            "High Temperature",
        ),
        (
            "mlx5_core 0000:81:00.1: Port module event[error]: module 1, Cable error, Bad or shorted cable/module",
            None,
            "Bad or shorted cable/module",
        ),
    ],
)
def test_a_port_modules_error_is_a_critical_nic_module_error(line: str, function: str | None, problem: str):
    event = one(line)
    assert (event.kind, event.severity, event.critical) == ("nic_module_error", "critical", True)
    assert event.fields.get("function") == function
    assert (event.fields["status"], event.fields["problem"]) == ("Cable error", problem)
    assert event.fields["module"] in (0, 1) and event.fields["device"].startswith("0000:")


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_core 0004:01:00.0: Port module event: module 0, Cable plugged",
        "mlx5_core 0004:01:00.0: Port module event: module 0, Cable unplugged",  # the port watch sees the port go
        # benign on DGX Spark (NVIDIA's forum), and a setting of the slot, not a failure
        "mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W).",
        # monitoring tools reading restricted PFs' counters flood these (gpud issue 1164)
        "mlx5_core 0000:d2:00.0: mlx5_cmd_out_err:838:(pid 268269): ACCESS_REG(0x805) op_mod(0x1) failed, status bad "
        "resource(0x5), syndrome (0x305684), err(-22)",
    ],
)
def test_mlx5_module_and_power_notices_are_not_failures(line: str):
    assert parse(line) == []
