"""The service's reading of the newer real-world log forms: RDMA verbs failures and IB async events on a node,
the stuck watchdog, flight-recorder reports pointing at the ranks that never joined, and the NaNs that fp16
loss scaling and Megatron's iteration lines carry into the training-metrics path."""

from __future__ import annotations

from agents.parsers import parse_text
from agents.parsers.training import TrainingLogParser
from ml import training_metrics
from ml.findings import Finding, JobInfo, LogRecord
from tests.ml.test_ml_signatures import NOW, base_key, detect, job_of, only, rec, to_records, training
from tests.stored import check_evidence


def metrics(records: list[LogRecord], job: JobInfo | None = None) -> list[Finding]:
    findings = training_metrics.detect(job or JobInfo(job_id="job-1"), records)
    check_evidence(findings)
    return findings


def test_reg_mr_enomem_is_the_nodes_memlock() -> None:
    # "misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory": ulimit -l
    # was 8192, raising it fixed the run. The host's configuration, not its network.
    f = only(detect(training("nccl_ibv_reg_mr_enomem_nccltests_206.txt", node="gpu-07")), key="ib_verbs:gpu-07")
    assert (f.category, f.role, f.blame, f.action, f.node) == ("host", "cause", "infrastructure", "diagnose", "gpu-07")
    assert f.evidence["reason"] == "memlock"
    assert f.evidence["calls"] == ["ibv_reg_mr_iova2"] and f.evidence["errnos"] == ["ENOMEM"]
    assert "locked-memory limit (ulimit -l) too low? host configuration" in f.summary


def test_queue_creation_and_ofi_registration_failures_are_the_memlock_too() -> None:
    # "misc/ibvwrap.cc:268 NCCL WARN Call to ibv_create_cq failed" (NCCL 2.7.8 printed no errno)
    f = only(detect(training("nccl_ibv_create_cq_roce_nccl_380.txt")), key="ib_verbs:node-a")
    assert (f.category, f.action, f.blame, f.evidence["reason"]) == ("host", "diagnose", "infrastructure", "memlock")
    # "NET/OFI Unable to register memory (type = 1) for device 0. RC: 12, Error: Cannot allocate memory"
    f = only(detect(training("nccl_ofi_register_memory_enomem_nccl_563.txt")), key="ib_verbs:node-a")
    assert (f.category, f.evidence["reason"], f.evidence["errnos"]) == ("host", "memlock", ["ENOMEM"])
    assert "ulimit -l" in f.summary
    # a queue pair refused for another reason is the RDMA stack's, not the limit
    timeout = rec("ib_verbs_error", "node-a", 0, call="ibv_create_qp", errno="EINVAL", category="resource")
    f = only(detect([timeout]), key="ib_verbs:node-a")
    assert (f.category, f.evidence["reason"]) == ("network", "rdma_resources")


def test_port_error_and_catastrophic_error_evict() -> None:
    records = training("nccl_ib_async_port_error_litllama_380.txt", node="node-048")
    f = only(detect(records), key="ib_verbs:node-048")
    assert (f.action, f.confidence) == ("evict", 0.8) and f.evidence["ib_events"] == ["IBV_EVENT_PORT_ERR"]
    assert "port error" in f.summary
    fatal = only(detect(training("nccl_ib_async_catastrophic_mpirun_nccl_230.txt")), key="ib_verbs:node-a")
    assert (fatal.action, fatal.confidence) == ("evict", 0.85)
    # the async thread's own failure to read the next event is not a second claim
    assert "calls" not in fatal.evidence


def test_state_changes_are_not_findings() -> None:
    gid = rec("ib_async_event", "node-a", 0, event="GID table change", event_name="IBV_EVENT_GID_CHANGE", fatal=False)
    assert [f for f in detect([gid]) if base_key(f).startswith("ib_verbs")] == []


def test_stuck_watchdog_is_a_symptom() -> None:
    f = only(detect(training("watchdog_stuck_heartbeat_llamafactory_8549.txt")), key="symptom:watchdog_stuck")
    assert (f.role, f.category) == ("symptom", "job_failure") and f.evidence["ranks"] == [2]


def test_flight_recorder_names_the_ranks_that_never_joined_and_accuses_no_machine() -> None:
    records = training("fr_trace_missing_ranks_pytorch_140969.txt")
    # ranks 0-3 on node-000, 4-7 on node-001: "missing ranks: {3, 4, 5, 6, 7}" of "collective: nccl:all_reduce"
    spread = detect(records, job_of(nodes=2, gpus=4))
    f = only(spread, key="collective_divergence")
    assert f.evidence["lagging_ranks"] == [3, 4, 5, 6, 7] and f.evidence["collectives"] == [31117]
    assert f.evidence["ops"] == ["nccl:all_reduce"] and f.evidence["lagging_nodes"] == ["node-000", "node-001"]
    assert (f.role, f.category, f.blame, f.action, f.node) == ("cause", "user_code", "user_code", "none", None)
    # the tutorial's two single-GPU nodes: rank 1 is node-001's, which is no suspect for it
    tutorial = detect(training("fr_trace_missing_rank_tutorial.txt"), job_of(nodes=2, gpus=1))
    assert all(f.node is None for f in tutorial)
    f = only(tutorial, key="collective_divergence")
    assert f.evidence["lagging_ranks"] == [1] and "ranks [1] never joined nccl:all_reduce #5" in f.summary


def test_flight_recorder_culprit_of_a_state_mismatch_is_weak_evidence_of_a_divergence() -> None:
    # "Collective sequence number: 1487 has errors" ... "error msg: Culprit rank 1; Error type:
    # COLLECTIVE_STATE_MISMATCH, Expected state: 'scheduled' does not match found state: 'completed'"
    findings = detect(training("fr_trace_state_mismatch_pytorch_151666.txt"), job_of(nodes=2, gpus=1))
    f = only(findings)
    assert (base_key(f), f.category, f.action, f.node, f.confidence) == (
        "collective_divergence",
        "user_code",
        "none",
        None,
        0.4,
    )
    assert f.evidence["lagging_ranks"] == [1] and f.evidence["collectives"] == [1487, 1488]
    # a culprit whose call differs (type, size, dtype) is a mismatch the analyzer caught
    typed = rec(
        "flight_recorder",
        "node-000",
        None,
        culprit_ranks=[1],
        error_types=["COLLECTIVE_TYPE_MISMATCH"],
        op="nccl:all_reduce",
        collective=42,
        missing_ranks=[],
    )
    f = only(detect([typed], job_of(nodes=2, gpus=1)))
    assert (base_key(f), f.confidence) == ("collective_mismatch", 0.8)
    assert f.summary == "collective mismatch: rank 1 differs in nccl:all_reduce #42 (COLLECTIVE_TYPE_MISMATCH)"


def test_loss_scale_at_its_floor_is_a_persistent_nan() -> None:
    records = training("deepspeed_overflow_at_min_scale_t5_hf_14531.txt")
    [f] = metrics(records)
    assert f.category == "nan" and f.evidence["metric"] == "grad_norm"
    # overflows while the scale calibrates are not
    assert metrics(training("deepspeed_overflow_recovers_cogvideo_233.txt")) == []


def test_megatron_nan_reaches_the_training_metrics() -> None:
    line = (
        " iteration     {step}/    8000 | elapsed time per iteration (ms): 7613.1 | learning rate: 6.680E-06 |"
        "{loss} loss scale: 1.0 | grad norm: 0.752 | number of skipped iterations:   0 |"
        " number of nan iterations:   0 |"
    )
    text = "\n".join(
        [line.format(step=s, loss=" lm loss: 7.3E-01 |") for s in range(100, 106)]
        + [line.format(step=s, loss="") for s in range(106, 110)]
    )
    records = to_records([("node-a", e) for e in parse_text(TrainingLogParser(), text, now=NOW)])
    [f] = metrics(records)
    assert f.category == "nan" and f.evidence["metric"] == "loss" and f.evidence["first_step"] == 106
    assert f.action == "rollback"


def test_host_oom_is_not_a_gpu_oom() -> None:
    host = rec("oom", "node-a", 0, tried_bytes=21474836480, gpu=None, host=True)
    gpu = rec("oom", "node-a", 1, tried_bytes=1024, gpu=0)
    found = detect([host, gpu])
    assert only(found, key="oom:host").evidence["tried_bytes"] == [21474836480]
    assert only(found, key="oom:gpu").evidence["tried_bytes"] == [1024]


def test_nccl_init_store_timeout_points_at_the_root_rank() -> None:
    records = training("nccl_uniqueid_socket_timeout_pytorch_82091.txt", node="node-001")
    found = detect(records, job_of(nodes=2, gpus=2))
    p = only(found, key="pointer:node-000")
    assert p.evidence["lagging_ranks"] == [0] and p.role == "symptom"
