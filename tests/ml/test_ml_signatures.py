"""Rules for explicit failures: real corpus logs and simulated clusters through the agent's parsers, then
synthetic records for the cross-rank rules; plus log normalization and the Xid catalog they rely on."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.events import Event
from agents.parsers import LineParser, parse_text
from agents.parsers.kernel import KernelLogParser
from agents.parsers.training import TrainingLogParser
from lab.sim.config import SimConfig
from lab.sim.model import Cluster
from ml import signatures, xid
from ml.findings import ACTIONS, BLAMES, CATEGORIES, ROLES, SUBJECT_KINDS, Finding, JobInfo, LogRecord
from ml.normalize import normalize, signature
from tests import paths
from tests.stored import check_evidence

FIXTURES = paths.FIXTURES
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
START = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)


# -- helpers -----------------------------------------------------------------------------------------------------


def corpus(name: str) -> str:
    """A corpus log without its provenance header (everything up to the '---' line)."""
    return (FIXTURES / "logs" / name).read_text().split("\n---\n", 1)[1]


def to_records(events: Sequence[tuple[str, Event]], first_id: int = 1) -> list[LogRecord]:
    return [
        LogRecord(
            id=first_id + i,
            ts=e.ts,
            node=node,
            kind=e.kind,
            line=e.line,
            severity=e.severity,
            rank=e.rank,
            source=e.source,
            fields=e.fields,
        )
        for i, (node, e) in enumerate(events)
    ]


def parsed(name: str, parser: LineParser, node: str = "node-a") -> list[LogRecord]:
    return to_records([(node, e) for e in parse_text(parser, corpus(name), now=NOW)])


def kernel(name: str, node: str = "node-a") -> list[LogRecord]:
    return parsed(name, KernelLogParser(), node)


def training(name: str, node: str = "node-a") -> list[LogRecord]:
    return parsed(name, TrainingLogParser(), node)


def job_of(nodes: int = 1, gpus: int = 8, job_id: str = "job-1", names: Sequence[str] | None = None) -> JobInfo:
    names = list(names) if names else [f"node-{i:03d}" for i in range(nodes)]
    return JobInfo(
        job_id=job_id,
        world_size=len(names) * gpus,
        rank_nodes={r: names[r // gpus] for r in range(len(names) * gpus)},
    )


def check(findings: Sequence[Finding]) -> list[Finding]:
    """What every finding must satisfy: the contract's vocabularies, evidence references, a key."""
    for f in findings:
        assert f.detector == "signatures"
        assert f.category in CATEGORIES and f.blame in BLAMES and f.role in ROLES and f.action in ACTIONS
        assert f.subject_kind in SUBJECT_KINDS and f.subject
        assert 0.0 <= f.confidence <= 1.0
        assert f.key and f.summary
        assert f.observed_at.tzinfo is not None
        signals = f.evidence["signals"]
        assert signals and all(s["type"] == "log" and isinstance(s["id"], int) for s in signals)
        assert f.evidence["count"] >= 1 and f.evidence["lines"] and f.evidence["signature"]
        assert (f.node is None) == (f.subject_kind == "job" or f.subject_kind == "rank")
    assert len({f.key for f in findings}) == len(findings), "keys must be unique within one run"
    check_evidence(findings)
    return list(findings)


def detect(records: list[LogRecord], job: JobInfo | None = None, **kw: Any) -> list[Finding]:
    return check(signatures.detect(job or JobInfo(job_id="job-1"), records, **kw))


def causes(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.role == "cause"]


def base_key(f: Finding) -> str:
    """The rule's own part of a key ("xid:node-a:79"), without the claim, the episode's time and the burst
    (a GPU-resettable Xid's key ends in "~<its burst's first second>")."""
    return f.key.rsplit("@", 1)[0].rsplit(":", 2)[0].split("~", 1)[0]


def only(findings: Sequence[Finding], **match: Any) -> Finding:
    """The one finding whose attributes match (`key` matches the rule's part of the key)."""
    found = [f for f in findings if all((base_key(f) if k == "key" else getattr(f, k)) == v for k, v in match.items())]
    assert len(found) == 1, [(f.category, f.node, f.summary) for f in findings]
    return found[0]


_ids = iter(range(10_000, 10**9))


def rec(kind: str, node: str, rank: int | None = None, at: float = 0.0, line: str = "", **fields: Any) -> LogRecord:
    """A synthetic record shaped as the agent's parsers emit it."""
    return LogRecord(
        id=next(_ids),
        ts=START + timedelta(seconds=at),
        node=node,
        kind=kind,
        line=line or f"{kind} {fields}",
        rank=rank,
        source="training",
        fields=fields,
    )


def traceback(
    node: str, rank: int, exc_type: str, message: str, file: str = "/work/train.py", at: float = 0.0
) -> LogRecord:
    frame = {"file": file, "line": 42, "function": "train_step"}
    line = f'Traceback (most recent call last):\n  File "{file}", line 42, in train_step\n{exc_type}: {message}'
    return rec("traceback", node, rank, at, line, exc_type=exc_type, exc_message=message, last_frame=frame)


def sim_records(scenario: str, *, seed: int = 11, until: float = 80.0, nodes: int = 3, gpus: int = 4):
    """Run the simulated cluster in-process; its kernel and training lines through the agent's parsers."""
    cluster = Cluster(
        SimConfig(nodes=nodes, gpus_per_node=gpus, scenario=scenario, seed=seed, fault_after=10.0, start=START)
    )
    parsers: dict[tuple[str, str], LineParser] = {}
    events: list[tuple[str, Event]] = []
    t = 0.0
    while t < until:
        t += 0.5
        now = START + timedelta(seconds=t)
        for line in cluster.advance(t):
            key = (line.node, line.stream)
            if key not in parsers:
                parsers[key] = KernelLogParser() if line.stream == "kern" else TrainingLogParser()
            for raw in line.text.split("\n"):
                events += [(line.node, e) for e in parsers[key].feed(raw, now=now)]
    for (node, _), parser in parsers.items():
        events += [(node, e) for e in parser.flush(now=START + timedelta(seconds=until))]
    job = job_of(nodes, gpus, job_id=f"sim-{scenario}", names=cluster.node_names)
    return cluster, job, to_records(events)


# -- normalization -----------------------------------------------------------------------------------------------


def test_normalize_replaces_variable_parts_and_keeps_codes():
    line = (
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, "
        "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
    )
    out = normalize(line)
    assert "109" in out and "CTX SWITCH TIMEOUT" in out and "pt_main_thread" in out
    for gone in ("0000:cb:00", "1797828", "0x58005", "2024", "11:43:14"):
        assert gone not in out
    ib = (
        "node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer "
        "10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
    )
    out = normalize(ib)
    assert "error 12" in out and "vendor err 129" in out and "NET/IB" in out
    assert "10.2.0.5" not in out and "5776" not in out and "node-2" not in out
    out = normalize("OSError: [Errno 116] Stale file handle: '/mnt/lustre/user/ckpt/step_100.pt'")
    assert "[Errno 116] Stale file handle" in out and "/mnt/lustre" not in out and "step_<num>.pt" in out
    out = normalize("RuntimeError: CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress)")
    assert out == "RuntimeError: CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress)"
    out = normalize("peer fe80::966d:ae03:8b:df78%ib0<53249> and ::ffff:29.87.88.182 via c10d::ProcessGroupNCCL")
    assert "fe80" not in out and "29.87" not in out and "c10d::ProcessGroupNCCL" in out
    out = normalize("GPU-8f2b4c1e-1d2a-4b3c-9d8e-0123456789ab at 2024-01-02T03:04:05.678Z on rank 7 tid=4242")
    assert "8f2b4c1e" not in out and "2024" not in out and "7" not in out and "4242" not in out


def test_signature_is_equal_across_nodes_ranks_and_runs_and_differs_across_faults():
    tail = "Watchdog caught collective operation timeout"
    a = f"[rank3]:[E1122 10:00:01.123 1234 ProcessGroupNCCL.cpp:616] [Rank 3] {tail}"
    b = f"[rank12]:[E1122 11:07:43.999 8812 ProcessGroupNCCL.cpp:616] [Rank 12] {tail}"
    assert signature(a) == signature(b)
    x79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    x48 = "NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert signature(x79) == signature(x79.replace("3b", "b3")) != signature(x48)
    assert signature("with status=12 opcode=1") != signature("with status=5 opcode=1")
    assert signature("node-001 failed", hosts=["node-001"]) == signature("gpu-host-17 failed", hosts=["gpu-host-17"])
    assert len(signature("anything")) == 16 and normalize(None) == ""  # type: ignore[arg-type]


# -- the Xid catalog ---------------------------------------------------------------------------------------------


def test_xid_catalog_is_package_data_with_its_source_header():
    path = Path(xid.__file__).parent / "data" / xid.CATALOG_FILE
    assert path.read_text().startswith("# source: leptonai/gpud")
    entries = xid.catalog()
    assert len(entries) > 100 and entries[79].mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert entries[48].immediate_action == "WORKFLOW_XID_48" and entries[48].investigatory_action == "WORKFLOW_XID_48"


@pytest.mark.parametrize(
    ("code", "severity", "category", "action"),
    [
        (79, "fatal", "gpu_hardware", "evict"),
        (48, "fatal", "gpu_hardware", "evict"),
        (64, "fatal", "gpu_hardware", "evict"),
        (63, "hardware", "gpu_hardware", "diagnose"),  # a remap pending (catalog IGNORE): evidence, not a drain
        (94, "fatal", "gpu_hardware", "evict"),  # contained ECC: a reset of its GPU (gpu_reset_enough), never the node
        (95, "fatal", "gpu_hardware", "evict"),
        (74, "fatal", "nvlink", "evict"),
        (145, "fatal", "nvlink", "evict"),
        (119, "fatal", "gpu_hardware", "evict"),
        (167, "fatal", "pcie", "evict"),  # no catalog action: judged by name
        (92, "hardware", "gpu_hardware", "diagnose"),
        (13, "application", "unknown", "diagnose"),
        (31, "application", "unknown", "diagnose"),
        (45, "consequence", "job_failure", "none"),
        (43, "consequence", "job_failure", "none"),
        (38, "informational", "unknown", "none"),
        (9999, "unknown", "unknown", "diagnose"),
    ],
)
def test_xid_reading(code: int, severity: str, category: str, action: str):
    entry = xid.lookup(code)
    assert (entry.severity, entry.category, entry.action) == (severity, category, action)
    assert entry.blame == ("infrastructure" if severity in ("fatal", "hardware") else "unknown")


def test_xid_severity_is_derived_from_the_immediate_action():
    text = "# source: test\ncode\tmnemonic\tdescription\timmediate_action\tinvestigatory_action\n"
    text += "500\tX_A\ta\tRESET_GPU\t\n501\tX_B\tb\tRESTART_APP\t\n502\tX_C\tc\tIGNORE\t\nnot-a-code\tjunk\n"
    entries = xid.parse_catalog(text)
    assert sorted(entries) == [500, 501, 502]
    assert [entries[c].action for c in (500, 501, 502)] == ["evict", "diagnose", "none"]
    assert xid.recovery_required("GPU Reset Required") and not xid.recovery_required("None")


# -- corpus logs -----------------------------------------------------------------------------------------------


def test_xid79_multiline_is_a_fatal_gpu_finding():
    records = kernel("xid79_fallen_off_bus_multiline_nvsentinel_155.txt")
    f = only(causes(detect(records)))
    assert (f.category, f.action, f.blame, f.node) == ("gpu_hardware", "evict", "infrastructure", "node-a")
    assert f.subject_kind == "gpu" and f.subject == "node-a/0000:b3:00"
    assert f.confidence >= 0.95 and f.evidence["xid"] == 79 and f.evidence["pci"] == ["0000:b3:00"]
    xid_ids = {r.id for r in records if r.kind == "xid"}
    assert {s["id"] for s in f.evidence["signals"]} == xid_ids
    assert "fallen off the bus" in f.evidence["lines"][0]


def test_xid48_dbe_and_64_are_gpu_hardware_and_a_failed_init_needs_a_reboot():
    findings = detect(kernel("xid48_dbe_xid64_gpuoperator_1146.txt"))
    dbe = only(findings, key="xid:node-a:48")
    assert (dbe.category, dbe.action, dbe.blame) == ("gpu_hardware", "evict", "infrastructure")
    assert dbe.confidence >= 0.9 and dbe.evidence["immediate_action"] == "WORKFLOW_XID_48"
    assert only(findings, key="xid:node-a:64").action == "evict"
    # "GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)": a GPU the driver cannot bring up is not in
    # NVML, so no GPU reset reaches it; the machine reboots.
    init = only(findings, key="nvrm:node-a:0000:0a:00")
    assert (init.subject, init.action, init.evidence["gpu_reset_enough"]) == ("node-a/0000:0a:00", "evict", False)


def test_application_xid_alone_never_evicts_but_the_reset_it_caused_does():
    findings = detect(kernel("xid13_xid109_gpud_pr46.txt"))
    x13 = only(findings, key="xid:node-a:13")
    assert x13.action == "diagnose" and x13.blame == "unknown" and x13.evidence["count"] == 3
    assert only(findings, key="xid:node-a:109").action == "evict"


def test_application_xid_on_most_nodes_is_the_jobs_code():
    job = job_of(3)
    records = [
        rec("xid", n, None, i, f"NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception on {n}", xid=13, pci="0000:3b:00")
        for i, n in enumerate(job.nodes)
    ]
    f = only(detect(records, job))
    assert (f.category, f.blame, f.node, f.action) == ("user_code", "user_code", None, "none")
    assert f.evidence["nodes"] == job.nodes


def test_ib_completion_error_12_is_a_network_fault_on_the_node():
    f = only(detect(training("ib_error12_mlengineering_azure.txt")))
    assert (f.category, f.action, f.blame, f.node) == ("network", "evict", "infrastructure", "node-a")
    assert f.evidence["statuses"] == [12] and len(f.evidence["times"]) == 1
    assert f.evidence["connections_lost"] is True  # retries exceeded: NCCL's communicator is gone
    f = only(detect(training("ib_status12_nccl_1814.txt")))
    assert f.action == "evict" and f.evidence["statuses"] == [5, 12] and f.evidence["peers"] == ["172.36.143.59"]
    # A local protection error (4) is often memory registration, not the link: a suspect, not a culprit.
    f = only(detect(training("ib_error4_nccl_928.txt")))
    assert f.category == "network" and f.action == "diagnose" and f.confidence < 0.8
    assert "connections_lost" not in f.evidence


def test_ib_errors_list_each_occurrence_time_for_flap_tolerance():
    records = [
        rec("ib_error", "node-001", 5, at, status=12, status_name="IBV_WC_RETRY_EXC_ERR", direction=d)
        for at, d in ((10.0, "Recv"), (10.2, "Send"), (70.0, "Recv"), (70.1, "Send"))
    ]
    f = only(detect(records, job_of(2)))
    assert f.evidence["times"] == [(START + timedelta(seconds=s)).isoformat() for s in (10.0, 70.0)]
    assert f.evidence["count"] == 4 and f.observed_at == START + timedelta(seconds=10)


def test_a_port_the_agent_saw_go_down_is_the_nodes_network_fault_each_flap_named_by_its_counter():
    records = [
        rec("port_down", "node-001", None, at, port="ib:mlx5_3/1", state=st, was=4, link_downed=n)
        for at, st, n in ((10.0, 1, 4), (33.0, 4, 5))
    ]
    f = only(detect(records, job_of(2)))
    assert (f.category, f.action, f.blame, f.node, f.confidence) == (
        "network",
        "evict",
        "infrastructure",
        "node-001",
        0.85,
    )
    assert f.evidence["ports"] == ["ib:mlx5_3/1"] and "went down (2 times)" in f.summary
    assert [(x["link_downed"], x["at"]) for x in f.evidence["port_flaps"]] == [
        (4, (START + timedelta(seconds=10)).isoformat()),
        (5, (START + timedelta(seconds=33)).isoformat()),
    ]
    # Stamped with the latest flap: each flap stores a finding of its own, for the flap tolerance.
    assert f.key.endswith(f"@{START + timedelta(seconds=33):%Y%m%dT%H%M%S}")


def test_oom_is_the_jobs_own_and_never_evicts():
    f = only(detect(training("oom_cuda_mid_format_mgfn_35.txt")))
    assert (f.category, f.blame, f.action, f.node) == ("oom", "user_code", "none", None)


@pytest.mark.parametrize(
    "name",
    [
        "nccl_timeout_internlm_290.txt",
        "nccl_timeout_llamafactory_7396.txt",
        "nccl_timeout_ofa_271.txt",
        "nccl_timeout_seqnum_skew_pytorch_118369.txt",
        "gloo_barrier_timeout_torchtune_2676.txt",
        "elastic_childfailed_sigabrt_vlmevalkit_1131.txt",
    ],
)
def test_timeouts_and_torchrun_summaries_are_symptoms_only(name: str):
    findings = detect(training(name))
    assert findings
    assert all(f.role == "symptom" and f.action == "none" and f.node is None for f in findings)


def test_uncorrectable_ecc_cuda_errors_point_at_the_machine():
    for name in ("ecc_uncorrectable_jade_hpc_194.txt", "ecc_uncorrectable_tf_deepfacelab_89.txt"):
        f = only(detect(training(name, node="dgk713")))
        assert (f.category, f.action, f.node, f.blame) == ("gpu_hardware", "evict", "dgk713", "infrastructure")


def test_shared_memory_bus_error_is_a_host_setting_not_a_bug():
    findings = detect(training("dataloader_bus_error_shm_mmseg_1356.txt"))
    f = only(findings)
    assert f.category == "host" and f.action != "evict" and f.evidence["count"] == 2


def test_desync_report_names_the_rank_that_never_joined_and_accuses_no_machine():
    # "[1] finished collective #2, but didn't join collective #3": the author's repro, rank 0 issues an extra
    # all_reduce. node-b holds rank 1 and is innocent.
    job = JobInfo(job_id="j", world_size=2, rank_nodes={0: "node-a", 1: "node-b"})
    findings = detect(training("nccl_desync_report_mlengineering.txt"), job)
    assert all(f.node is None for f in findings)
    f = only(causes(findings))
    assert (base_key(f), f.category, f.blame, f.action, f.subject) == (
        "collective_divergence",
        "user_code",
        "user_code",
        "none",
        "j",
    )
    assert f.evidence["lagging_ranks"] == [1] and f.evidence["lagging_nodes"] == ["node-b"]
    assert f.evidence["ops"] == ["ALLREDUCE"] and f.evidence["collectives"] == [3]
    assert "ranks [1] never joined ALLREDUCE #3" in f.summary
    # the victim's watchdog timeout stays a symptom the cause explains
    assert only(findings, key="symptom:watchdog_timeout").role == "symptom"


def test_ranks_that_never_joined_are_a_machines_symptom_when_it_has_a_fault():
    job = JobInfo(job_id="j", world_size=2, rank_nodes={0: "node-a", 1: "node-b"})
    xid = rec("xid", "node-b", None, xid=79, pci="0000:3b:00", message="GPU has fallen off the bus.")
    findings = detect([*training("nccl_desync_report_mlengineering.txt"), xid], job)
    report = only(findings, key="collective_divergence")
    assert (report.role, report.category, report.blame, report.node) == ("symptom", "job_failure", "unknown", None)
    assert only(causes(findings)).node == "node-b"


def test_nccl_remote_peer_maps_to_a_node_of_the_job():
    job = JobInfo(job_id="j", world_size=2, rank_nodes={0: "ubuntu", 1: "node1"})
    findings = detect(training("nccl_socket_abort_ncclTests_166.txt", node="ubuntu"), job)
    pointer = only(findings, node="node1")
    assert pointer.role == "symptom" and pointer.action == "diagnose" and pointer.confidence < 0.5
    rest = only(findings, key="nccl_error")
    assert rest.evidence["peers"] == ["10.0.0.2"] and rest.evidence["count"] == 4


def test_one_rank_raising_a_python_error_is_user_code_and_its_peer_a_victim():
    findings = detect(training("torchrun_crash_rank1_real.txt"), JobInfo(job_id="j", world_size=4))
    bug = only(causes(findings))
    assert (bug.category, bug.blame, bug.node, bug.subject) == ("user_code", "user_code", None, "rank 1")
    assert bug.action == "diagnose" and 0.5 <= bug.confidence < 0.8 and bug.evidence["exc_type"] == "RuntimeError"
    assert all(f.action in ("none", "diagnose") for f in findings)
    assert any(f.role == "symptom" and f.subject == "rank 0" for f in findings)


def test_pcie_corrected_errors_are_low_confidence():
    records = kernel("pcie_aer_gpu_unknown_error_returnn_1486.txt") + training(
        "pcie_aer_gpu_unknown_error_returnn_1486.txt"
    )
    findings = detect([replace(r, id=i) for i, r in enumerate(records)])
    aer = only(findings, category="pcie")
    assert aer.action == "diagnose" and aer.confidence < 0.5 and aer.evidence["aer_severity"] == "corrected"
    lost = only(findings, category="gpu_hardware")  # "Unable to determine the device handle for GPU ...: Unknown Error"
    assert lost.action == "diagnose" and lost.node == "node-a"


# -- the simulated cluster ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sim_healthy_runs_give_no_findings(seed: int):
    _, job, records = sim_records("healthy", seed=seed, until=60.0)
    assert records
    assert detect(records, job) == []


@pytest.mark.parametrize(
    ("scenario", "category", "min_confidence"),
    [("gpu_lost", "gpu_hardware", 0.95), ("ecc_dbe", "gpu_hardware", 0.9), ("nvlink", "nvlink", 0.85)],
)
def test_sim_hardware_faults_evict_the_faulty_node_and_nothing_else(
    scenario: str, category: str, min_confidence: float
):
    cluster, job, records = sim_records(scenario)
    fault = cluster.faults[0]
    [node] = fault.nodes
    [gpu] = fault.gpus[node]
    findings = detect(records, job)
    evictions = [f for f in findings if f.action == "evict"]
    assert evictions and {f.node for f in evictions} == {node}
    assert all(f.category == category and f.blame == "infrastructure" for f in evictions)
    pci = f"0000:{cluster.gpus[cluster.node_names.index(node)][gpu].bus:02x}:00"
    assert any(f.subject == f"{node}/{pci}" and f.confidence >= min_confidence for f in evictions)
    # The victims' timeouts and torchrun's summary corroborate; they never point at a machine on their own.
    assert all(f.node in (None, node) for f in findings if f.role == "symptom" and f.action != "none")


def test_sim_ib_flap_is_a_network_fault_with_two_occurrences():
    cluster, job, records = sim_records("ib_flap", until=90.0)
    [node] = cluster.faults[0].nodes
    f = only(detect(records, job), category="network")
    assert (f.node, f.action) == (node, "evict") and len(f.evidence["times"]) == 2


def test_sim_user_bug_is_one_user_code_finding_with_rollback():
    _, job, records = sim_records("user_bug", until=30.0)
    findings = detect(records, job)
    bug = only(causes(findings))
    assert (bug.category, bug.blame, bug.action, bug.node) == ("user_code", "user_code", "rollback", None)
    assert bug.confidence >= 0.85 and len(bug.evidence["ranks"]) == job.world_size
    assert not any(f.action == "evict" for f in findings)


# -- cross-rank rules on synthetic records -------------------------------------------------------------------------


def test_same_traceback_on_half_the_ranks_across_nodes_is_user_code():
    job = job_of(2, 4)
    ranks = (0, 1, 4, 5)
    records = [traceback(job.rank_nodes[r], r, "ValueError", f"bad shape on rank {r}: {r * 7}", at=r) for r in ranks]
    f = only(detect(records, job))
    assert (f.category, f.action, f.blame) == ("user_code", "rollback", "user_code")
    assert f.evidence["ranks"] == list(ranks) and f.evidence["nodes"] == job.nodes
    # The same on one node only (half the ranks, one node): still the code, but not certain enough to roll back.
    one_node = [traceback("node-000", r, "ValueError", "bad shape", at=r) for r in range(4)]
    f = only(detect(one_node, job))
    assert f.category == "user_code" and f.action == "diagnose"


def test_different_exceptions_are_not_merged():
    job = job_of(2, 2)
    records = [
        traceback("node-000", 0, "KeyError", "'input_ids'"),
        traceback("node-001", 2, "KeyError", "'input_ids'", file="/work/data.py"),
        traceback("node-001", 3, "ZeroDivisionError", "division by zero"),
    ]
    findings = detect(records, job)
    assert len(findings) == 3 and all(f.category == "user_code" and f.action == "diagnose" for f in findings)


def test_library_frames_lower_confidence_of_a_single_rank_error():
    job = job_of(2, 2)
    user = only(detect([traceback("node-000", 0, "RuntimeError", "boom")], job))
    lib = only(
        detect([traceback("node-000", 0, "RuntimeError", "boom", file="/usr/lib/python3.11/site-packages/x.py")], job)
    )
    assert lib.confidence < user.confidence


def test_illegal_memory_access_is_the_application_unless_its_machine_shows_a_hardware_error():
    job = job_of(2, 4)
    msg = dict(error="illegal_memory_access", message="an illegal memory access was encountered")
    one = only(detect([rec("cuda_error", "node-001", 5, **msg)], job))
    assert (one.category, one.blame, one.action, one.node, one.subject) == (
        "user_code",
        "user_code",
        "restart",
        None,
        "job-1",
    )
    # the stable key a check across jobs matches on, and the machine it would promote
    assert (one.evidence["fault"], one.evidence["fault_node"]) == ("illegal_memory_access", "node-001")
    # with a hardware signal of its own the machine is a suspect to diagnose
    aer = rec("pcie_aer", "node-001", None, 1.0, severity="uncorrected_nonfatal", device="0000:3b:00.0")
    suspect = only(detect([rec("cuda_error", "node-001", 5, **msg), aer], job), key="cuda:ambiguous:node-001")
    assert (suspect.category, suspect.action, suspect.node) == ("unknown", "diagnose", "node-001")
    most = only(detect([rec("cuda_error", job.rank_nodes[r], r, r, **msg) for r in range(6)], job))
    assert (most.category, most.blame, most.action, most.node) == ("user_code", "user_code", "rollback", None)


def test_illegal_memory_access_in_a_real_crash_is_not_sent_to_diagnose():
    # THCudaCheck FAIL ... error=77 : an illegal memory access was encountered, then the caching allocator's
    # c10::Error "CUDA error: an illegal memory access was encountered": a PyTorch bug (pytorch/pytorch#35202).
    findings = detect(training("illegal_memory_access_thc77_detectron2_1439.txt"), job_of(2, 1))
    f = only(causes(findings))
    assert (f.category, f.blame, f.action, f.node) == ("user_code", "user_code", "restart", None)
    assert f.evidence["fault"] == "illegal_memory_access" and f.evidence["count"] == 2
    assert all(f.action != "diagnose" for f in findings)


def test_cuda_error_inside_a_traceback_reads_as_the_cuda_error():
    job = job_of(2, 2)
    error = {"kind": "cuda_error", "error": "ecc_uncorrectable", "message": "uncorrectable ECC error encountered"}
    r = rec(
        "traceback", "node-001", 3, exc_type="RuntimeError", exc_message="CUDA error: uncorrectable ECC", error=error
    )
    f = only(detect([r], job))
    assert (f.category, f.action, f.node) == ("gpu_hardware", "evict", "node-001")


def test_filesystem_errors_on_one_node_are_that_node_on_all_the_filesystem():
    job = job_of(3, 2)
    eio = "[Errno 5] Input/output error: '/mnt/nfs/data/shard_0001.bin'"
    f = only(detect([traceback("node-002", 4, "OSError", eio)], job))
    assert (f.category, f.node, f.action, f.blame) == ("storage", "node-002", "diagnose", "infrastructure")
    everywhere = [traceback(job.rank_nodes[r], r, "OSError", eio, at=r) for r in range(6)]
    f = only(detect(everywhere, job))
    assert (f.category, f.node, f.action) == ("storage", None, "none")
    # a stale handle is a shared file replaced under an open handle: the job's or the file system's, on one node too
    stale = "[Errno 116] Stale file handle: '/mnt/nfs/data/shard_0001.bin'"
    f = only(detect([traceback("node-002", 4, "OSError", stale)], job))
    assert (base_key(f), f.category, f.node, f.action, f.blame) == (
        "storage:stale:job",
        "storage",
        None,
        "none",
        "unknown",
    )
    full = only(
        detect([rec("unmatched_error", "node-000", None, line="OSError: [Errno 28] No space left on device")], job)
    )
    assert full.category == "storage" and full.blame == "unknown"


def test_one_claim_seen_by_several_rules_is_one_finding():
    job = job_of(3, 2)
    records = [
        traceback("node-001", 2, "OSError", "[Errno 5] Input/output error: '/mnt/lustre/ckpt.pt'", at=5.0),
        rec("unmatched_error", "node-001", None, 1.0, "LustreError: 1234:0:(client.c:1187) ost_write failed: rc = -5"),
    ]
    f = only(detect(records, job))
    assert (base_key(f), f.category, f.node) == ("storage:io:node-001", "storage", "node-001")
    assert f.evidence["count"] == 2 and len(f.evidence["signals"]) == 2 and len(f.evidence["lines"]) == 2
    assert f.observed_at == START + timedelta(seconds=1)


def test_host_oom_killer_and_worker_segfaults():
    job = job_of(2, 2)
    killed = rec("dataloader_died", "node-000", 0, pids=[12], signal="Killed")
    f = only(detect([killed], job))
    assert f.category == "oom" and f.action == "none"
    segv = [rec("crash", "node-001", 2, line="Segmentation fault (core dumped)", reason="segfault", message="x")]
    f = only(detect(segv, job))
    assert (f.category, f.node, f.action, f.confidence) == ("unknown", "node-001", "diagnose", 0.4)


def test_classifier_reads_the_lines_no_rule_knows():
    job = job_of(2, 2)
    lines = {
        "mlx5_core 0000:3b:00.0: mlx5_cmd_check: FAILED (port down)": ("network", 0.9),
        "ERROR worker: something odd happened": ("unknown", 0.95),
        "ERROR train: loss went crazy": ("user_code", 0.8),
        "ERROR nothing sure": ("gpu_hardware", 0.3),
    }
    records = [rec("unmatched_error", "node-001", 2, i, line) for i, line in enumerate(lines)]
    asked: list[list[str]] = []

    def classify(texts: list[str]) -> list[tuple[str, float]]:
        asked.append(texts)
        return [lines[t] for t in texts]

    findings = detect(records, job, classify=classify)
    assert len(asked) == 1 and sorted(asked[0]) == sorted(lines)
    net = only(findings, category="network")
    assert net.node == "node-001" and net.action == "diagnose" and net.confidence <= 0.55
    user = only(findings, category="user_code")
    assert user.node is None and user.action == "none" and user.confidence <= 0.5
    assert len(findings) == 2  # unknown and unsure answers make nothing

    def broken(texts: list[str]) -> list[tuple[str, float]]:
        raise RuntimeError("model not loaded")

    assert detect(records, job, classify=broken) == []
    assert detect(records, job) == []  # no classifier, no keyword: nothing to say


def test_unknown_exception_goes_to_the_classifier():
    job = job_of(1, 2)
    r = traceback("node-000", 0, "mylib.WeirdError", "the frobnicator failed")
    seen: list[str] = []

    def classify(texts: list[str]) -> list[tuple[str, float]]:
        seen.extend(texts)
        return [("gpu_hardware", 0.7) for _ in texts]

    f = only(detect([r], job, classify=classify))
    assert seen == ["mylib.WeirdError: the frobnicator failed"]
    assert f.category == "gpu_hardware" and f.action == "diagnose" and f.evidence["classifier_probability"] == 0.7


def test_keys_are_stable_whatever_the_order_and_distinct_per_node():
    _, job, records = sim_records("ecc_dbe", seed=5, until=40.0)
    first = detect(records, job)
    shuffled = list(records)
    random.Random(0).shuffle(shuffled)
    again = detect(shuffled, job)
    assert sorted((f.key, f.confidence, f.summary) for f in first) == sorted(
        (f.key, f.confidence, f.summary) for f in again
    )
    two = [rec("xid", n, None, 0, f"NVRM: Xid 79 {n}", xid=79, pci="0000:3b:00") for n in ("node-000", "node-001")]
    keys = {f.key for f in detect(two, job_of(2))}
    assert keys == {f"xid:{n}:79:gpu_hardware:evict@20251122T100000" for n in ("node-000", "node-001")}


def test_keys_tell_episodes_and_stronger_claims_apart():
    job = job_of(2, 4)
    flap1 = [rec("ib_error", "node-001", 5, 10.0, status=12), rec("ib_error", "node-001", 5, 10.3, status=12)]
    flap2 = [rec("ib_error", "node-001", 5, 50.0, status=12)]
    [first] = detect(flap1, job)
    [again] = detect(flap1, job)
    [second] = detect(flap1 + flap2, job)
    assert first.key == again.key != second.key  # each flap is stored: the policy counts them
    assert len(second.evidence["times"]) == 2
    one = [traceback("node-000", 0, "ValueError", "bad batch")]
    most = one + [traceback(job.rank_nodes[r], r, "ValueError", "bad batch", at=1) for r in (1, 4, 5)]
    [early] = detect(one, job)
    [late] = detect(most, job)
    assert base_key(early) == base_key(late) and early.key != late.key  # diagnose, then rollback: a new claim
    assert (early.action, late.action) == ("diagnose", "rollback")


def test_a_job_crashing_on_the_same_bug_after_its_relaunch_is_new_evidence_of_the_bugs_series():
    """Relaunched without the fix, the job crashes on the same bug again: with both crashes in the window read, the
    finding stamped with the first stored nothing new, and the bug's incident never heard of the second crash."""
    job = job_of(2, 4)
    crash = [traceback(job.rank_nodes[r], r, "RuntimeError", "size mismatch", at=r * 0.2) for r in range(8)]
    again = [traceback(job.rank_nodes[r], r, "RuntimeError", "size mismatch", at=200 + r * 0.2) for r in range(8)]
    [first] = detect(crash, job)
    [second] = detect(crash + again, job)
    assert first.category == second.category == "user_code" and first.action == second.action == "rollback"
    assert first.key != second.key and first.series == second.series != ""  # one row per bug, moved by the crash
    assert first.seen_until == START  # each crash at its first line: its ranks' later lines move nothing
    assert second.seen_until == START + timedelta(seconds=200)
    assert second.evidence["times"] == [START.isoformat(), (START + timedelta(seconds=200)).isoformat()]
    assert detect(crash + again, job)[0].key == second.key  # the same records again: nothing new


def test_odd_records_are_skipped_not_raised():
    job = job_of(2, 2)
    naive = LogRecord(id=1, ts=datetime(2026, 1, 1), node="node-000", kind="xid", line="Xid 79", fields={"xid": 79})
    records: list[Any] = [
        naive,
        LogRecord(id=2, ts=START, node="node-000", kind="traceback", line="x", fields=None),  # type: ignore[arg-type]
        LogRecord(id=3, ts=START, node="node-000", kind="ib_error", line="x", fields={"status": "twelve"}),
        LogRecord(id=4, ts=START, node="node-000", kind="cuda_error", line="x", rank=-1, fields={"error": None}),
        LogRecord(id=5, ts=START, node="node-000", kind="desync_report", line="x", fields={"lagging_ranks": "1,2"}),
        LogRecord(
            id=6, ts=START, node="node-000", kind="child_failed", line="x", fields={"error": "str", "root_rank": "a"}
        ),
        LogRecord(id=7, ts=START, node="node-000", kind="xid", line="x", fields={"xid": True}),
        "not a record",
        None,
    ]
    findings = detect(records, job)
    assert only(findings, key="xid:node-000:79").observed_at.tzinfo is not None
    assert signatures.detect(job, []) == []


def test_an_xid_event_without_parsed_fields_is_read_from_its_line() -> None:
    """Another agent, or a person with curl, may send the kernel line alone."""
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    finding = only(signatures.detect(JobInfo(job_id="j"), [rec("xid", "node-a", line=line)]), category="gpu_hardware")
    assert (finding.node, finding.action) == ("node-a", "evict")
    assert signatures.detect(JobInfo(job_id="j"), [rec("xid", "node-a", line="no code in this line")]) == []


def test_a_data_loader_death_cites_its_log_records_and_names_the_signals_apart():
    # The rule's signal names once replaced the record references under "signals", so the page could not
    # link the lines that showed the workers dying.
    died = rec("dataloader_died", "node-000", 0, pids=[12], signal="SIGSEGV")
    f = only(detect([died], job_of(2, 2)), key="dataloader:died")
    assert f.evidence["signals"] == [{"type": "log", "id": died.id}]
    assert f.evidence["exit_signals"] == ["SIGSEGV"]


def test_a_launcher_stopped_from_outside_is_no_failure_but_one_whose_worker_died_is():
    """torchrun told to stop (the scheduler's stop after an eviction, a preemption) logs its death signal, then a
    closing signal per worker: read alone the closing signals were a "launcher errors" finding after every
    eviction. Without the death signal, or with a worker that failed, they are still the job's failure."""
    stopped = [
        rec("elastic_error", "node-a", at=0.0, category="death_signal", signal="SIGTERM"),
        rec("elastic_error", "node-a", at=0.1, category="closing_signal", pid=11, signal="SIGTERM"),
        rec("elastic_error", "node-a", at=0.1, category="closing_signal", pid=12, signal="SIGTERM"),
    ]
    assert detect(stopped) == []
    unprompted = [rec("elastic_error", "node-b", at=0.1, category="closing_signal", pid=21, signal="SIGTERM")]
    failed = [rec("elastic_error", "node-a", at=0.2, category="worker_failed", exitcode=1, local_rank=0, pid=11)]
    for records in (stopped + unprompted, stopped + failed):
        (symptom,) = detect(records)
        assert symptom.role == "symptom" and symptom.evidence["count"] == 1


def test_a_network_adapters_fatal_error_is_its_nodes_failed_adapter_not_a_flap():
    records = [
        rec("nic_fatal", "node-001", None, 10.0, device="0000:81:00.0", driver="mlx5_core", error=1),
        rec("nic_fatal", "node-001", None, 10.5, device="0000:81:00.0", driver="mlx5_core"),
    ]
    f = only(detect(records, job_of(2)))
    assert (f.category, f.action, f.blame, f.node, base_key(f)) == (
        "network",
        "evict",
        "infrastructure",
        "node-001",
        "ib_adapter:node-001",
    )
    # The policy's flap tolerance reads this: an adapter that failed does not come back like a link.
    assert f.evidence["adapter_failed"] is True
    assert "0000:81:00.0" in f.summary and "fatal error 1" in f.summary


def test_a_port_modules_cable_error_is_its_nodes_failed_adapter():
    records = [
        rec("nic_module_error", "node-002", None, 10.0, device="0000:5c:00.0", module=0, problem="High Temperature"),
        rec("port_down", "node-002", None, 10.2, port="ib:mlx5_0/1", state=1, was=4, link_downed=1),
    ]
    f = next(f for f in detect(records, job_of(2)) if base_key(f) == "ib_adapter:node-002")
    assert (f.category, f.action, f.node) == ("network", "evict", "node-002")
    assert f.evidence["adapter_failed"] is True and f.evidence["module_problems"] == ["module 0: High Temperature"]
    assert "cable or transceiver" in f.summary and "High Temperature" in f.summary
