"""The service's reading of today's GPUs' error forms (issue 41): GSP firmware failures (a GPU reset or a reboot of
the machine, one finding per GPU and episode), Xid 45 that names its cause, NVLink5 Xids, the Xids whose meaning
must not depend on the node's GPU inventory (63, 94 against 95, 64), NCCL's NVLS transport, the fabric manager and
the kernel's OOM killer.

The records come from the real fixtures (tests/fixtures/logs, each file cites its thread) through the agent's
parsers; the lines a test leans on are quoted beside it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from ml.demarcation import demarcate
from ml.findings import Finding, LogRecord
from ml.xid import lookup
from tests.ml.test_ml_signatures import base_key, corpus, detect, kernel, only, rec, training


def keyed(findings: list[Finding], prefix: str) -> list[Finding]:
    return [f for f in findings if base_key(f).startswith(prefix)]


def suspects(findings: list[Finding]) -> list[tuple[str, str, float, str | None]]:
    """(node, action, confidence, GPU to reset) of each suspect of each incident the findings make."""
    return [
        (s.node, s.action, s.confidence, s.reset_gpu) for p in demarcate(list(enumerate(findings))) for s in p.suspects
    ]


# -- GSP ------------------------------------------------------------------------------------------------------------


def test_gsp_rpc_timeout_is_one_finding_for_the_gpu_a_reset_clears() -> None:
    # gsp_heartbeat_rpc_timeout_gh100_opengpu_1230.txt: two heartbeat lines, then a minute later
    # "NVRM: GPU6 _kgspLogRpcTimeout: ***...*** GSP Timeout ***...***"
    name = "gsp_heartbeat_rpc_timeout_gh100_opengpu_1230.txt"
    assert "NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout" in corpus(name)
    f = only(detect(kernel(name)))
    assert base_key(f) == "nvrm:node-a:GPU6"
    assert (f.category, f.action, f.blame, f.role, f.confidence) == (
        "gpu_hardware",
        "evict",
        "infrastructure",
        "cause",
        0.85,
    )
    assert f.evidence["failures"] == ["gsp_rpc_timeout", "gsp_heartbeat"] and f.evidence["count"] == 3
    assert f.evidence["gpu_reset_enough"] is True and f.evidence["driver_gpus"] == [6]
    # The driver's "GPU6" is its own number, not nvidia-smi's index: no GPU to name for a reset, so the node.
    assert f.subject_kind == "node" and "pci" not in f.evidence
    assert suspects([f]) == [("node-a", "evict", 0.85, None)]


def test_gsp_that_cannot_boot_needs_the_machine_rebooted() -> None:
    # gsp_wpr2_rminitadapter_failed_opengpu_1230.txt, three times over:
    #   NVRM: GPU 0000:a1:00.0: rm_init_adapter failed, device minor number 7
    #   NVRM: GPU6 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP
    #   NVRM: GPU6 _kgspBootGspRm: (the GPU is likely in a bad state and may need to be reset)
    #   NVRM: GPU6 RmInitAdapter: Cannot initialize GSP firmware RM
    #   NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x62:0x40:2168)
    f = only(detect(kernel("gsp_wpr2_rminitadapter_failed_opengpu_1230.txt")))
    assert base_key(f) == "nvrm:node-a:0000:a1:00" and f.evidence["count"] == 15  # GPU6 is that GPU: one finding
    assert (f.category, f.action, f.blame, f.subject) == (
        "gpu_hardware",
        "evict",
        "infrastructure",
        "node-a/0000:a1:00",
    )
    assert f.evidence["failures"] == ["gsp_boot_failed", "init_failed"] and f.evidence["gsp"] is True
    assert f.evidence["gpu_reset_enough"] is False  # not in NVML, so no reset reaches it
    assert "reboot" in f.summary
    assert suspects([f]) == [("node-a", "evict", 0.85, None)]


def test_gpu_marked_for_reset_names_the_gpu_its_xid_names() -> None:
    # xid154_gsp_back_to_back_timeout_talos_opengpu_446.txt: the GSP lines name no GPU, the Xid 154 does
    #   NVRM: nvAssertFailedNoLog: Assertion failed: Back to back GSP RPC timeout detected! GPU marked for reset ...
    #   NVRM: _issueRpcAndWait: rpcRecvPoll timedout for fn 76 sequence 4129!
    #   NVRM: Xid (PCI:0000:0b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
    findings = detect(kernel("xid154_gsp_back_to_back_timeout_talos_opengpu_446.txt"))
    gsp = only(findings, key="nvrm:node-a:0000:0b:00")
    assert (gsp.action, gsp.confidence, gsp.subject) == ("evict", 0.9, "node-a/0000:0b:00")
    assert gsp.evidence["failures"] == ["gsp_reset_required", "gsp_rpc_timeout"]
    assert gsp.evidence["gpu_reset_enough"] is True and "GPU reset clears it" in gsp.summary
    # With the Xid 154 on the same GPU, the policy may reset that GPU rather than take the node.
    assert suspects(findings) == [("node-a", "evict", 0.99, "0000:0b:00")]


def test_gsp_heartbeat_alone_is_diagnosed() -> None:
    # gsp_heartbeat_rpcrecvpoll_no_hostname_bazzite_4449.txt (a desktop; "heartbeat 0" since boot):
    #   Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timed out, ... heartbeat 0 ...
    #   Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out
    f = only(detect(kernel("gsp_heartbeat_rpcrecvpoll_no_hostname_bazzite_4449.txt")))
    assert base_key(f) == "nvrm:node-a:GPU0" and f.evidence["count"] == 2
    assert (f.category, f.action, f.confidence, f.blame) == ("gpu_hardware", "diagnose", 0.6, "infrastructure")


def test_gsp_banner_beside_xid_119_on_two_gpus_stays_with_the_node() -> None:
    # xid119_gsp_timeout_a100_nvmltaskrunner_vllm_40652.txt: "NVRM: _kgspLogXid119: *** GSP Timeout ***" banners
    # around Xid 119 lines on two GPUs (0001:6c:00, 0001:96:00): which GPU each banner is for is not said.
    findings = detect(kernel("xid119_gsp_timeout_a100_nvmltaskrunner_vllm_40652.txt"))
    banner = only(findings, key="nvrm:node-a:-")
    assert (banner.action, banner.subject_kind) == ("evict", "node") and banner.evidence["count"] == 2
    assert only(findings, key="xid:node-a:119").action == "evict"
    assert suspects(findings)[0][3] is None  # two GPUs: the node goes


def test_gsp_task_exception_is_the_xid_120s() -> None:
    # xid120_gsp_task_exception_driver_init_opengpu_829.txt: the CrashCat report's lines are no form of their own
    findings = detect(kernel("xid120_gsp_task_exception_driver_init_opengpu_829.txt"))
    assert [base_key(f) for f in findings] == ["xid:node-a:120"]


def test_gsp_lines_from_an_agent_without_the_failure_field() -> None:
    # An older agent ships the NVRM message only: the service reads the form from its text.
    old = rec("nvrm", "node-a", message="GPU6 _kgspLogRpcTimeout: ******** GSP Timeout ********")
    f = only(detect([old]))
    assert base_key(f) == "nvrm:node-a:GPU6" and f.evidence["failures"] == ["gsp_rpc_timeout"]


def test_nvlink_the_driver_cannot_bring_up_is_an_nvlink_finding_to_diagnose() -> None:
    # nvlink_postrxdet_linkmask_gpud_1271.txt (held out):
    #   Jul 09 10:42:47 pool0-0082 kernel: NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's
    #   postRxDetLinkMask failed!
    f = only(detect(kernel("nvlink_postrxdet_linkmask_gpud_1271.txt")))
    assert (f.category, f.action, f.confidence, f.blame) == ("nvlink", "diagnose", 0.7, "infrastructure")
    assert f.evidence["failures"] == ["nvlink_failed"] and not f.evidence["gsp"]
    # With a GSP timeout in the same burst, the GSP's claim leads: the GPU's, to evict.
    gsp = rec("nvrm", "node-a", message="GPU0 _kgspLogRpcTimeout: ******** GSP Timeout ********")
    link = rec("nvrm", "node-a", message="GPU0 knvlinkCoreTrainLinks: link training failed")
    both = only(detect([gsp, link]))
    assert (both.category, both.action) == ("gpu_hardware", "evict")
    assert both.evidence["failures"] == ["gsp_rpc_timeout", "nvlink_failed"]


@pytest.mark.parametrize(
    "name",
    [
        "nvlink_postrxdet_linkmask_gpud_1271.txt",
        "gsp_heartbeat_rpc_timeout_gh100_opengpu_1230.txt",
        "gsp_wpr2_rminitadapter_failed_opengpu_1230.txt",
        "xid154_gsp_back_to_back_timeout_talos_opengpu_446.txt",
        "gsp_heartbeat_rpcrecvpoll_no_hostname_bazzite_4449.txt",
        "xid119_gsp_timeout_a100_nvmltaskrunner_vllm_40652.txt",
        "xid48_dbe_xid64_gpuoperator_1146.txt",
    ],
)
def test_the_service_reads_the_forms_as_the_agent_names_them(name: str) -> None:
    # The service's own patterns (for events without the agent's fields) and the agent's must agree: the same
    # records without `failure`, `gsp` and `gpu_index` make the same findings.
    records = kernel(name)
    bare = [replace(r, fields={k: v for k, v in r.fields.items() if k not in _AGENT_FIELDS}) for r in records]
    assert any(r.fields.get("failure") for r in records)
    assert _claims(detect(bare)) == _claims(detect(records))


_AGENT_FIELDS = ("failure", "gsp", "gpu_index")


def _claims(findings: list[Finding]) -> list[tuple[str, str, str, float, object]]:
    return sorted((f.key, f.category, f.action, f.confidence, f.evidence.get("failures")) for f in findings)


def test_a_gsp_timeout_after_a_quiet_spell_is_a_new_episode() -> None:
    line = "GPU 0000:3b:00.0: rpcRecvPoll timedout for fn 76 sequence 4129!"  # a 446 line with an address
    records: list[LogRecord] = [
        rec("nvrm", "node-a", None, at, message=line, failure="gsp_rpc_timeout", pci="0000:3b:00.0")
        for at in (0.0, 30.0, 600.0)
    ]
    found = sorted(detect(records), key=lambda f: f.observed_at)
    assert [base_key(f) for f in found] == ["nvrm:node-a:0000:3b:00"] * 2
    assert [f.evidence["count"] for f in found] == [2, 1] and found[0].key != found[1].key
    assert found[1].observed_at - found[0].observed_at == timedelta(seconds=600)


# -- Xid 45 and NVLink5 ---------------------------------------------------------------------------------------------


def test_xid45_takes_its_nvlink5_cause_s_meaning() -> None:
    # xid45_caused_by_xid149_xid145_opengpu_1150.txt, 7 lines such as
    #   kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149
    # and no Xid 149 or 145 line in the excerpt.
    f = only(detect(kernel("xid45_caused_by_xid149_xid145_opengpu_1150.txt")))
    assert base_key(f) == "xid:node-a:45>145+149"
    assert (f.category, f.action, f.blame, f.role, f.node) == ("nvlink", "evict", "infrastructure", "cause", "node-a")
    assert f.confidence == 0.85 and f.evidence["caused_by_xids"] == [145, 149] and f.evidence["count"] == 7
    assert f.evidence["gpu_reset_enough"] is False  # an NVLink fault is not one GPU's
    assert "caused by Xid 145" in f.summary


def test_xid45_after_an_application_fault_stays_a_symptom() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 45, Ch 00000008 caused by previous Xid {}"
    after_13 = rec("xid", "node-a", None, 0, line.format(13), xid=45, pci="0000:3b:00", caused_by_xid=13)
    after_79 = rec("xid", "node-a", None, 1, line.format(79), xid=45, pci="0000:3b:00")  # the cause read from the line
    findings = detect([after_13, after_79])
    symptom = only(findings, key="xid:node-a:45")
    assert (symptom.role, symptom.action, symptom.category) == ("symptom", "none", "job_failure")
    fatal = only(findings, key="xid:node-a:45>79")
    assert (fatal.category, fatal.action, fatal.subject) == ("gpu_hardware", "evict", "node-a/0000:3b:00")


def test_nvlink5_xids_are_nvlink_findings_on_the_machine() -> None:
    # xid144_xid149_nvlink5_kmsg_gpud_1160.txt:
    #   NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 ...)
    #   NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 ...)
    findings = detect(kernel("xid144_xid149_nvlink5_kmsg_gpud_1160.txt"))
    fatal, nonfatal = only(findings, key="xid:node-a:149"), only(findings, key="xid:node-a:144")
    assert (fatal.category, fatal.action, fatal.node, fatal.blame) == ("nvlink", "evict", "node-a", "infrastructure")
    assert (nonfatal.category, nonfatal.action, nonfatal.node) == ("nvlink", "diagnose", "node-a")
    # xid149_xid145_nvlink5_gb200_gpud_1174.txt:
    #   NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 ...)
    #   NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 ...)
    findings = detect(kernel("xid149_xid145_nvlink5_gb200_gpud_1174.txt"))
    assert (only(findings, key="xid:node-a:149").action, only(findings, key="xid:node-a:145").action) == (
        "evict",
        "diagnose",
    )
    assert {f.category for f in findings} == {"nvlink"} and suspects(findings)[0][:2] == ("node-a", "evict")


# -- Xids whose meaning must not depend on the GPU inventory -------------------------------------------------------


def test_xid63_row_remap_pending_drains_nothing() -> None:
    # xid63_row_remap_pending_a100_m4logs_tr190.txt:
    #   ... NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, Row Remapper: New row marked for remapping, reset gpu to activate
    f = only(detect(kernel("xid63_row_remap_pending_a100_m4logs_tr190.txt")))
    assert (f.category, f.action, f.blame) == ("gpu_hardware", "diagnose", "infrastructure")
    # Below the policy's diagnose floor (0.5): alone it makes no decision, with or without an inventory.
    assert f.confidence == 0.45 and suspects([f]) == [("node-a", "diagnose", 0.45, None)]


def test_xid94_contained_ecc_resets_its_gpu() -> None:
    # xid94_contained_sm_with_xid43_xid31_akash_244.txt:
    #   NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No
    # The application dies (the catalog's RESTART_APP); a reset of that one GPU remaps the row: the finding asks
    # for the GPU out with gpu_reset_enough, which the policy makes a reset_gpu by index or by PCI bus id, with or
    # without the node's GPU inventory (tests/service/decisions/test_policy.py).
    findings = detect(kernel("xid94_contained_sm_with_xid43_xid31_akash_244.txt"))
    f = only(findings, key="xid:node-a:94")
    assert (f.category, f.action, f.blame, f.subject) == (
        "gpu_hardware",
        "evict",
        "infrastructure",
        "node-a/0000:00:08",
    )
    assert f.evidence["gpu_reset_enough"] is True


def test_uncontained_ecc_and_a_failed_remap_still_take_the_gpu_out() -> None:
    assert (lookup(95).action, lookup(95).gpu_reset_enough) == ("evict", True)
    # xid64_row_remap_failure_a100_m4logs_tr190.txt: "... NVRM: Xid (PCI:0000:90:1c): 64, ..."
    f = only(detect(kernel("xid64_row_remap_failure_a100_m4logs_tr190.txt")))
    assert (f.action, f.evidence["gpu_reset_enough"]) == ("evict", False)


# -- NVLS, the fabric manager, the OOM killer ----------------------------------------------------------------------


def test_nccl_nvls_failure_is_the_nodes_nvlink_fabric() -> None:
    # nccl_nvls_cuda_failure_fm_restart_no_gpu_reset_nccl_1488.txt:
    #   node23:12098:12141 [2] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'
    f = only(detect(training("nccl_nvls_cuda_failure_fm_restart_no_gpu_reset_nccl_1488.txt")), key="nccl_nvls:node-a")
    assert (f.category, f.action, f.blame, f.node, f.confidence) == (
        "nvlink",
        "diagnose",
        "infrastructure",
        "node-a",
        0.6,
    )


def test_fabric_manager_that_cannot_start_is_diagnosed_on_its_node() -> None:
    # fabricmanager_ib_umad_not_loaded_hgx_b200_canvos_700.txt:
    #   Jul 20 16:15:36 edge-...:  Kernel module "ib_umad" has not been loaded, fabric manager cannot be started
    f = only(detect(kernel("fabricmanager_ib_umad_not_loaded_hgx_b200_canvos_700.txt")))
    assert base_key(f) == "fabric_manager:node-a"
    assert (f.category, f.action, f.blame, f.node) == ("nvlink", "diagnose", "infrastructure", "node-a")
    assert 'Kernel module "ib_umad" has not been loaded' in f.summary


def test_fabric_manager_with_nothing_to_do_makes_no_finding() -> None:
    # fabricmanager_nv_warn_nothing_to_do_*.txt (no NVSwitch: FM exits, harmlessly), e.g.
    #   ... nv-fabricmanager[4177]: request to query NVSwitch device information from NVSwitch driver failed with
    #   error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]
    #   ... systemd[1]: nvidia-fabricmanager.service: Control process exited, code=exited, status=1/FAILURE
    for name in (
        "fabricmanager_nv_warn_nothing_to_do_2x4090_cubestudio_29.txt",
        "fabricmanager_nv_warn_nothing_to_do_a40_bridge_gpuoperator_610.txt",
    ):
        records = kernel(name)
        assert {r.kind for r in records} == {"fabric_manager"}
        assert detect(records) == []


def test_kernel_oom_kill_of_python_is_the_applications_host_oom() -> None:
    # host_oom_killer_python_qaconv_19.txt:
    #   [441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB, anon-rss:12918388kB, ...
    f = only(detect(kernel("host_oom_killer_python_qaconv_19.txt")))
    assert base_key(f) == "oom:host"
    assert (f.category, f.action, f.blame, f.node) == ("oom", "none", "user_code", None)
    assert suspects([f]) == []  # no machine to act on


def test_a_lone_corrected_pcie_error_on_a_working_node_is_routine() -> None:
    # pcie_aer_corrected_receiver_error_laptop_benign_nbfc_181.txt (benign): one corrected Receiver Error, the
    # hardware fixed it, nothing else wrong on the node: no finding, so no incident.
    assert [f for f in detect(kernel("pcie_aer_corrected_receiver_error_laptop_benign_nbfc_181.txt"))] == []


def test_an_uncorrected_host_memory_error_is_the_hosts_to_evict() -> None:
    # edac_ue_dimm_apei_pcie_gpu_node_lwa_117.txt (held out): "EDAC MC3: 1 UE memory read error on
    # CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (...)"
    f = only(detect(kernel("edac_ue_dimm_apei_pcie_gpu_node_lwa_117.txt")))
    assert (base_key(f), f.category, f.action, f.confidence) == ("edac:node-a", "host", "evict", 0.85)
    assert f.evidence["dimms"] == ["CPU_SrcID#1_MC#1_Chan#2_DIMM#0"]
    # corrected errors alone are routine
    assert detect([rec("edac", "node-a", count=4, uncorrected=False, mc=0)]) == []


def test_a_gpu_nvml_calls_lost_is_evicted_as_hardware() -> None:
    # gpu_is_lost_nvidia_smi_owod_81.txt (held out): "... GPU 0000:02:00.0: GPU is lost. Reboot the system ..."
    f = only(detect(training("gpu_is_lost_nvidia_smi_owod_81.txt")))
    assert (f.category, f.action, f.confidence, f.blame) == ("gpu_hardware", "evict", 0.9, "infrastructure")
