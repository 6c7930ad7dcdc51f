"""Kernel log forms of today's GPUs and hosts (issue 41): GSP firmware timeouts and boot failures, the driver's
"fallen off the bus" line alone, an SXid's Data line without its header, the OOM killer, the fabric manager,
journal lines without a host name and syslog stamps in other locales' month names.

Lines quoted here are real, from the fixture named beside them (tests/fixtures/logs, each file cites its thread);
the few others are a real line's variants (another locale's month, a container's OOM), said so where they are.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents.events import Event
from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from tests import paths
from tests.agents.test_parsers_kernel import check_event

LOGS = paths.FIXTURES / "logs"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def corpus(name: str) -> str:
    return (LOGS / name).read_text().split("\n---\n", 1)[1]


def parse(text: str) -> list[Event]:
    events = parse_text(KernelLogParser(), text, now=NOW)
    for event in events:
        check_event(event)
    return events


def one(line: str) -> Event:
    events = parse(line)
    assert len(events) == 1, [(e.kind, e.fields) for e in events]
    return events[0]


def failures(events: list[Event]) -> list[tuple[str, int | None, str | None, str]]:
    """(form, driver GPU number, PCI address, severity) of the NVRM events that say a GPU failed."""
    return [
        (e.fields["failure"], e.fields.get("gpu_index"), e.fields.get("pci"), e.severity)
        for e in events
        if e.kind == "nvrm" and "failure" in e.fields
    ]


# -- GSP ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "line", "form", "severity"),
    [
        (
            "gsp_heartbeat_rpc_timeout_gh100_opengpu_1230.txt",
            "[   84.300488] NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout "
            "**********************************",
            "gsp_rpc_timeout",
            "critical",
        ),
        (
            "gsp_heartbeat_rpc_timeout_gh100_opengpu_1230.txt",
            "[   24.302465] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 "
            "heartbeat 1899482 heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200",
            "gsp_heartbeat",
            "error",
        ),
        (
            "gsp_wpr2_rminitadapter_failed_opengpu_1230.txt",
            "[  115.083711] NVRM: GPU6 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP",
            "gsp_boot_failed",
            "critical",
        ),
        (
            "gsp_wpr2_rminitadapter_failed_opengpu_1230.txt",
            "[  115.083720] NVRM: GPU6 _kgspBootGspRm: (the GPU is likely in a bad state and may need to be reset)",
            "gsp_boot_failed",
            "critical",
        ),
        (
            "gsp_wpr2_rminitadapter_failed_opengpu_1230.txt",
            "[  115.083750] NVRM: GPU6 RmInitAdapter: Cannot initialize GSP firmware RM",
            "gsp_boot_failed",
            "critical",
        ),
    ],
)
def test_gsp_lines_name_their_form_and_the_drivers_gpu(fixture: str, line: str, form: str, severity: str) -> None:
    assert line in corpus(fixture)
    event = one(line)
    assert event.kind == "nvrm" and event.fields["failure"] == form and event.fields["gsp"] is True
    assert event.fields["gpu_index"] == 6 and "pci" not in event.fields  # the driver's number, no address
    assert event.severity == severity and event.critical is (severity == "critical")


def test_gsp_rpc_timeouts_without_a_gpu_named() -> None:
    # xid154_gsp_back_to_back_timeout_talos_opengpu_446.txt (Talos's "IP: kern: level: [ISO]: " prefix)
    marked = (
        "192.168.11.119: kern: warning: [2026-04-22T21:30:51.526447914Z]: NVRM: nvAssertFailedNoLog: Assertion "
        "failed: Back to back GSP RPC timeout detected! GPU marked for reset @ kernel_gsp.c:2387"
    )
    poll = (
        "192.168.11.119: kern: warning: [2026-04-22T21:30:51.803749334Z]: NVRM: _issueRpcAndWait: rpcRecvPoll "
        "timedout for fn 76 sequence 4129!"
    )
    text = corpus("xid154_gsp_back_to_back_timeout_talos_opengpu_446.txt")
    assert marked in text and poll in text
    assert failures(parse(f"{marked}\n{poll}")) == [
        ("gsp_reset_required", None, None, "critical"),
        ("gsp_rpc_timeout", None, None, "critical"),
    ]
    assert [(e.kind, e.severity) for e in parse(text)].count(("nvrm", "critical")) == 2


def test_rm_init_adapter_failed_is_critical_with_its_pci() -> None:
    # gsp_wpr2_rminitadapter_failed_opengpu_1230.txt: 0x62 is NV_ERR_RESET_REQUIRED; the init failed.
    line = "[  115.084348] NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x62:0x40:2168)"
    assert line in corpus("gsp_wpr2_rminitadapter_failed_opengpu_1230.txt")
    event = one(line)
    assert failures([event]) == [("init_failed", None, "0000:a1:00.0", "critical")] and event.critical
    assert event.fields["gsp"] is False
    # Every failure line of the excerpt ships at once; the driver's reassurance does not.
    events = parse(corpus("gsp_wpr2_rminitadapter_failed_opengpu_1230.txt"))
    assert len(events) == 15 and sum(e.critical for e in events) == 15


def test_lines_around_a_gsp_failure_stay_plain_nvrm() -> None:
    events = parse(corpus("gsp_heartbeat_rpc_timeout_gh100_opengpu_1230.txt"))
    assert [f for f, *_ in failures(events)] == ["gsp_heartbeat", "gsp_heartbeat", "gsp_rpc_timeout"]
    # "Memory Subsystem Error detected", "Timeout was set to: 4000 msecs!": warnings, not a form of their own
    assert sum(e.severity == "warning" for e in events) == 5
    load = events[0]
    assert "loading NVIDIA UNIX Open Kernel Module" in load.fields["message"] and load.severity == "info"


# -- journal lines without a host name, and other locales' months ---------------------------------------------------


def test_journal_without_host_name_keeps_the_nvrm_message() -> None:
    # gsp_heartbeat_rpcrecvpoll_no_hostname_bazzite_4449.txt: `journalctl --no-hostname -k`, indented in the issue
    line = "     Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out"
    assert line in corpus("gsp_heartbeat_rpcrecvpoll_no_hostname_bazzite_4449.txt")
    event = one(line)
    assert event.kind == "nvrm" and event.fields["message"] == "GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out"
    assert event.fields["failure"] == "gsp_heartbeat" and event.fields["gpu_index"] == 0
    assert event.ts == datetime(2026, 3, 21, 21, 42, 1, tzinfo=UTC)
    assert len(parse(corpus("gsp_heartbeat_rpcrecvpoll_no_hostname_bazzite_4449.txt"))) == 8  # all NVRM lines
    # The same line as `journalctl --no-hostname -o short-iso` prints it (the agent's own format, less the host).
    iso = one("2026-03-21T21:42:01+0000 kernel: NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out")
    assert iso.fields == event.fields and iso.ts == event.ts


def test_syslog_stamps_in_other_locales() -> None:
    # pcie_aer_corrected_receiver_error_laptop_benign_nbfc_181.txt: a Dutch/Norwegian locale's "jan."
    nbfc = corpus("pcie_aer_corrected_receiver_error_laptop_benign_nbfc_181.txt")
    assert "jan. 29 20:50:17 kevin kernel: pcieport 0000:00:1c.5: AER: Corrected error received: id=00e5" in nbfc
    [aer] = parse(nbfc)  # the header and its three detail lines
    assert aer.kind == "pcie_aer" and aer.ts == datetime(2026, 1, 29, 20, 50, 17, tzinfo=UTC)
    assert aer.fields["errors"] == ["Receiver Error"] and aer.severity == "warning"
    # fabricmanager_nv_warn_nothing_to_do_a40_bridge_gpuoperator_610.txt: zh_CN's "11月"
    line = (
        "11月 15 14:15:47 leon-NF5468M6 nv-fabricmanager[4177]: request to query NVSwitch device information from "
        "NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]"
    )
    assert line in corpus("fabricmanager_nv_warn_nothing_to_do_a40_bridge_gpuoperator_610.txt")
    event = one(line)
    assert event.ts == datetime(2026, 11, 15, 14, 15, 47, tzinfo=UTC)
    assert event.fields["message"].startswith("request to query NVSwitch device information")


@pytest.mark.parametrize(
    ("stamp", "month"),
    [("Mär 3", 3), ("févr. 3", 2), ("okt 3", 10), ("dic 3", 12), ("июл 3", 7), ("3월 3", 3), ("12月  3", 12)],
)
def test_month_words_of_other_locales(stamp: str, month: int) -> None:
    event = one(f"{stamp} 10:00:00 host kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert (event.ts.month, event.ts.day, event.ts.hour) == (month, 3, 10)


def test_a_word_that_is_no_month_is_no_stamp() -> None:
    event = one("Hai 12 10:00:00 host kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert event.fields["xid"] == 79 and event.ts == NOW  # the Xid is read; the prefix was no stamp


# -- the fallen-off-bus line alone, SXid's Data line ---------------------------------------------------------------


def test_fallen_off_the_bus_line_alone_is_critical() -> None:
    # xid79_fallen_off_bus_rtx5090_opengpu_1151.txt: newer drivers may print this line with no Xid 79 before it
    line = "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus."
    assert line in corpus("xid79_fallen_off_bus_rtx5090_opengpu_1151.txt")
    event = one(line)
    assert event.kind == "nvrm" and event.fields["failure"] == "fallen_off_bus"
    assert event.fields["pci"] == "0000:06:00.0"
    assert event.severity == "critical" and event.critical


def test_sxid_data_line_without_its_header_is_one_event() -> None:
    # sxid12028_data_line_dmesg_iso_gpud_338.txt: `dmesg -x --time-format=iso`, only the Data line was captured
    line = (
        "kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data "
        "{0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}"
    )
    assert line in corpus("sxid12028_data_line_dmesg_iso_gpud_338.txt")
    event = one(line)
    assert event.kind == "sxid" and event.severity == "warning" and not event.critical
    f = event.fields
    assert (f["sxid"], f["pci"], f["switch"], f["fatal"]) == (12028, "0000:84:00.0", "nvidia-nvswitch1", None)
    assert f["message"].startswith("Data {0x000001c0")
    # Its Severity line and Data line after a header it did not see: still one event; after its header: none.
    severity = "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Severity 0 Engine instance 32 Sub-engine instance 00"
    assert len(parse(f"{severity}\n{line}")) == 1
    header = "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"
    assert [e.fields["fatal"] for e in parse(f"{header}\n{severity}\n{line}")] == [False]


# -- the OOM killer -------------------------------------------------------------------------------------------------


def test_oom_killer_kill_is_one_host_oom_event() -> None:
    # host_oom_killer_python_qaconv_19.txt: the oom-kill line (its stamp lost) and the kill itself
    text = corpus("host_oom_killer_python_qaconv_19.txt")
    kill = (
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice/"
        "user-1000.slice/user@1000.service,task=python,pid=698405,uid=1000"
    )
    assert kill in text and "Out of memory: Killed process 698405 (python) total-vm:49978204kB" in text
    [event] = parse(text)  # the reaper's line and another process invoking the killer are no kill of their own
    assert event.kind == "oom" and event.severity == "error" and event.critical
    f = event.fields
    assert (f["host"], f["process"], f["pid"], f["constraint"]) == (True, "python", 698405, "CONSTRAINT_NONE")
    assert f["anon_rss_bytes"] == 12918388 * 1024 and "cgroup" not in f
    assert f["message"].startswith("Out of memory: Killed process 698405 (python)")
    assert event.line.count("\n") == 1  # both lines


def test_oom_kill_lines_alone_and_in_a_cgroup() -> None:
    # host_oom_killer_python_qaconv_19.txt's kill line (its head), without the oom-kill line before it
    line = "[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB, anon-rss:12918388kB"
    assert line in corpus("host_oom_killer_python_qaconv_19.txt")
    killed = one(line)
    assert (killed.fields["pid"], killed.fields["process"]) == (698405, "python")
    # The same kill's lines as a container's limit reports them (another pid and task, same words otherwise).
    kill = "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=c1,mems_allowed=0,task=python3,pid=42,uid=0"
    memcg = "Memory cgroup out of memory: Killed process 42 (python3) total-vm:100kB, anon-rss:64kB"
    [event] = parse(f"{kill}\n{memcg}")
    assert event.fields["cgroup"] is True and event.fields["process"] == "python3"
    [alone] = parse(kill)  # its Killed line never came: the kill is still reported, on flush
    assert alone.fields["pid"] == 42 and alone.fields["cgroup"] is True


# -- the fabric manager ---------------------------------------------------------------------------------------------


def test_fabric_manager_that_cannot_start_is_an_error() -> None:
    # fabricmanager_ib_umad_not_loaded_hgx_b200_canvos_700.txt (the host name elided by the PR's author)
    line = 'Jul 20 16:15:36 edge-...:  Kernel module "ib_umad" has not been loaded, fabric manager cannot be started'
    assert line in corpus("fabricmanager_ib_umad_not_loaded_hgx_b200_canvos_700.txt")
    event = one(line)
    assert event.kind == "fabric_manager" and event.severity == "error" and not event.critical
    assert event.fields["state"] == "cannot_start"
    assert event.fields["message"] == 'Kernel module "ib_umad" has not been loaded, fabric manager cannot be started'
    assert event.ts == datetime(2026, 7, 20, 16, 15, 36, tzinfo=UTC)
    # The script's progress lines before it are no events.
    assert [e.kind for e in parse(corpus("fabricmanager_ib_umad_not_loaded_hgx_b200_canvos_700.txt"))] == [
        "fabric_manager"
    ]


@pytest.mark.parametrize(
    "fixture",
    [
        "fabricmanager_nv_warn_nothing_to_do_2x4090_cubestudio_29.txt",
        "fabricmanager_nv_warn_nothing_to_do_a40_bridge_gpuoperator_610.txt",
    ],
)
def test_fabric_manager_with_nothing_to_do_is_no_error(fixture: str) -> None:
    events = parse(corpus(fixture))
    assert {e.kind for e in events} == {"fabric_manager"} and not any(e.critical for e in events)
    states = [(e.fields["state"], e.severity) for e in events]
    assert ("nothing_to_do", "info") in states
    assert {s for s in states if s[0] != "nothing_to_do"} == {("exited", "warning")}


def test_an_nvlink_the_driver_cannot_bring_up_names_its_form() -> None:
    # nvlink_postrxdet_linkmask_gpud_1271.txt (held out): "Jul 09 10:42:47 pool0-0082 kernel: NVRM:
    # knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's postRxDetLinkMask failed!"
    [event] = parse(corpus("nvlink_postrxdet_linkmask_gpud_1271.txt"))
    assert (event.kind, event.fields["failure"]) == ("nvrm", "nvlink_failed")
    assert (event.severity, event.critical) == ("error", False)
    # NVLink state lines that say nothing failed stay plain (a real line's variant)
    [plain] = parse("NVRM: knvlinkCoreShutdownDeviceLinks: links shut down on GPU 0000:1b:00.0\n")
    assert "failure" not in plain.fields


def test_the_oom_killers_older_two_lines_are_one_kill() -> None:
    # host_oom_killer_sacrifice_child_nervana_deepspeech_48.txt (kernels before 4.19):
    #   [3017506.733819] Out of memory: Kill process 25635 (python) score 974 or sacrifice child
    #   [3017506.736861] Killed process 25635 (python) total-vm:55518724kB, anon-rss:23902876kB, file-rss:154436kB
    [event] = parse(corpus("host_oom_killer_sacrifice_child_nervana_deepspeech_48.txt"))
    assert (event.kind, event.critical) == ("oom", True)
    assert (event.fields["pid"], event.fields["process"]) == (25635, "python")
    assert event.fields["anon_rss_bytes"] == 23902876 * 1024 and not event.fields.get("cgroup")


def test_edac_uncorrected_host_memory_errors_are_critical_corrected_ones_not() -> None:
    # edac_ue_dimm_apei_pcie_gpu_node_lwa_117.txt: "[11189.970968] EDAC MC3: 1 UE memory read error on
    # CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (channel:2 slot:0 ...)"; the APEI and MCE lines around it are no events
    [ue] = parse(corpus("edac_ue_dimm_apei_pcie_gpu_node_lwa_117.txt"))
    assert (ue.kind, ue.critical, ue.fields["uncorrected"], ue.fields["count"], ue.fields["mc"]) == (
        "edac", True, True, 1, 3,
    )  # fmt: skip
    assert ue.fields["location"] == "CPU_SrcID#1_MC#1_Chan#2_DIMM#0"
    # a corrected one (the same line, CE), from another driver's prefix
    [ce] = parse("[   12.5] EDAC skx MC0: 2 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1)\n")
    assert (ce.critical, ce.fields["uncorrected"], ce.fields["count"]) == (False, False, 2)
