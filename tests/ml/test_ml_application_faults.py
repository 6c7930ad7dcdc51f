"""The service's reading of faults that are the application's (collective mismatches, NCCL invalid usage), the
job's storage, or the host's configuration, on the real fixture lines the agent's parsers read: no machine is made
a suspect for the application's fault, and the victims' symptoms follow the cause."""

from __future__ import annotations

from ml.demarcation import demarcate
from ml.findings import Finding, JobInfo
from tests.ml.test_ml_signatures import base_key, causes, detect, job_of, only, rec, training


def incidents(findings: list[Finding]) -> list[tuple[str, str, list[str]]]:
    """(root cause, blame, suspect nodes) of each incident the findings make."""
    return [(p.root_cause, p.blame, [s.node for s in p.suspects]) for p in demarcate(list(enumerate(findings)))]


def test_collective_mismatches_caught_by_a_check_are_user_code() -> None:
    cases = {
        # "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective:
        # CollectiveFingerPrint(SequenceNumber=485, OpType=ALLREDUCE, TensorShape=[25], ...), but Rank 0 is running
        # collective: CollectiveFingerPrint(SequenceNumber=485, OpType=BROADCAST, TensorShape=[1], ...)"
        "desync_mismatch_checkpointing_speechbrain_2401.txt": (
            "collective mismatch: rank 1 ran ALLREDUCE [25] Float while rank 0 ran BROADCAST [1] Long (seq 485)"
        ),
        "desync_mismatch_shapes_msswift_pr9443.txt": (
            "collective mismatch: rank 1 ran ALLREDUCE [195812480] while rank 0 ran ALLREDUCE [51123456] (seq 3104)"
        ),
        # "init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at and around
        # rank 39."
        "mismatched_collective_nccl_296.txt": (
            "collective mismatch: NCCL found mismatched collective calls at and around rank 39"
        ),
        # "NCCL WARN NET/IB : req 0/1 tag 0 peer 10.10.23.6<58683> collective mismatch error, local size 496640 remote
        # size 65536"
        "nccl_ib_collective_mismatch_size_nccl_969.txt": (
            "collective mismatch: NET/IB transfer sizes differ (local 496640 bytes, remote 65536 bytes, peer "
            "10.10.23.6): the ranks posted different collectives"
        ),
    }
    for name, summary in cases.items():
        findings = detect(training(name), job_of(nodes=2, gpus=1))
        f = only(causes(findings))
        assert (base_key(f), f.category, f.blame, f.action, f.node, f.subject) == (
            "collective_mismatch",
            "user_code",
            "user_code",
            "none",
            None,
            "job-1",
        ), name
        assert f.summary == summary and f.confidence == 0.8
        assert incidents(findings) == [("user_code", "user_code", [])], name
    speechbrain = only(
        detect(training("desync_mismatch_checkpointing_speechbrain_2401.txt")), key="collective_mismatch"
    )
    assert speechbrain.evidence["mismatch_ranks"] == [0, 1] and speechbrain.evidence["ops"] == [
        "ALLREDUCE",
        "BROADCAST",
    ]
    assert speechbrain.evidence["collectives"] == [485] and speechbrain.evidence["shapes"] == ["[1]", "[25]"]


def test_a_mismatch_explains_the_victims_so_no_incident_points_at_a_machine() -> None:
    # rank 1 (node-b) ran ahead into another collective; rank 0 (node-a) timed out in the all_reduce, its desync
    # report names rank 1 as the one that did not join, and its NCCL error names node-b as the peer.
    job = JobInfo(job_id="j", world_size=2, rank_nodes={0: "node-a", 1: "node-b"})
    records = [
        *training("desync_mismatch_checkpointing_speechbrain_2401.txt", node="node-b"),
        *training("nccl_desync_report_mlengineering.txt", node="node-a"),
        rec(
            "nccl_error",
            "node-a",
            0,
            30.0,
            nccl_code="ncclRemoteError",
            message="NCCL error: remote process exited or there was a network error",
            peer="node-b",
            category="socket",
        ),
    ]
    findings = detect(records, job)
    cause = only(causes(findings))
    assert base_key(cause) == "collective_mismatch" and cause.evidence["lagging_ranks"] == [1]
    assert incidents(findings) == [("user_code", "user_code", [])]
    [incident] = demarcate(list(enumerate(findings)))
    assert {findings[i].key.split(":")[0] for i in incident.finding_ids} >= {"symptom", "nccl_peer", "nccl_error"}


def test_nccl_invalid_usage_is_the_launch_configuration() -> None:
    # "[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 both
    # on CUDA device 1000"
    horovod = detect(training("nccl_warn_duplicate_gpu_mpirun_horovod_3929.txt"))
    f = only(causes(horovod))
    assert (base_key(f), f.category, f.blame, f.action, f.node) == (
        "nccl_invalid_usage",
        "user_code",
        "user_code",
        "none",
        None,
    )
    assert "rank 2 and rank 0 both on CUDA device 1000" in f.summary and f.evidence["mismatch_ranks"] == [0, 1, 2, 4]
    # "torch.distributed.DistBackendError: NCCL error in: ..., invalid usage ..." / "Last error:" / "Duplicate GPU
    # detected : rank 0 and rank 1 both on CUDA device 2000"
    dfine = detect(training("nccl_invalid_usage_duplicate_gpu_dfine_289.txt"), job_of(nodes=2, gpus=1))
    f = only(causes(dfine))
    assert base_key(f) == "nccl_invalid_usage" and "rank 0 and rank 1 both on CUDA device 2000" in f.summary
    assert incidents(dfine) == [("user_code", "user_code", [])]


def test_storage_errors_of_the_job_and_of_the_object_store() -> None:
    # "[rank1]: OSError: [Errno 116] Stale file handle: xxx": filelock removed its lock file (a library's bug)
    stale = detect(training("stale_file_handle_filelock_msswift_6695.txt"), job_of(nodes=2, gpus=1))
    f = only(stale)
    assert (base_key(f), f.category, f.blame, f.action, f.node) == (
        "storage:stale:job",
        "storage",
        "unknown",
        "none",
        None,
    )
    assert incidents(stale) == [("storage", "unknown", [])]
    # "OP_REQUIRES failed at save_restore_v2_ops.cc:137 : Unknown: : Unable to connect to endpoint" on one of two nodes
    s3 = only(detect(training("s3_checkpoint_save_failed_sagemaker_454.txt"), job_of(nodes=2, gpus=1)))
    assert (base_key(s3), s3.category, s3.action, s3.node, s3.blame) == (
        "storage:object_store:node-a",
        "storage",
        "diagnose",
        "node-a",
        "unknown",
    )


def test_a_socket_error_next_to_a_gpu_fault_is_not_storage() -> None:
    # "what():  Transport endpoint is not connected" beside "CUDA error: uncorrectable NVLink error detected"
    findings = detect(training("nvlink_uncorrectable_transport_endpoint_pytorch_58155.txt"))
    assert all(f.category != "storage" for f in findings)
    nvlink = only(causes(findings))
    assert (nvlink.category, nvlink.action, nvlink.node) == ("nvlink", "evict", "node-a")
    assert incidents(findings) == [("nvlink", "infrastructure", ["node-a"])]
    # a FUSE mount whose daemon died names its path: that one is storage
    fuse = rec(
        "unmatched_error", "node-a", 0, line="OSError: [Errno 107] Transport endpoint is not connected: '/mnt/fuse/x'"
    )
    assert only(detect([fuse])).category == "storage"


def test_ncclras_mismatch_is_a_symptom_naming_the_ranks_apart() -> None:
    # "#0-0 (fa93daea854b060b) MISMATCH", "Communicator ranks have different AllGather operation counts", "30 ranks
    # have launched up to operation 640", "2 ranks have launched up to operation 641", "Rank 12 -- GPU 4 ..."
    findings = detect(training("ncclras_mismatch_opcount_nccl_1911.txt"))
    f = only(findings)
    assert (base_key(f), f.role, f.category, f.node, f.action) == ("nccl_ras", "symptom", "job_failure", None, "none")
    assert f.summary == (
        "NCCL RAS: #0-0 MISMATCH: AllGather operation counts differ (30 ranks at 640, 2 ranks at 641), "
        "ranks [12, 13] apart"
    )
    assert f.evidence["ras_errors"] == ["MISMATCH"] and f.evidence["ras_ranks"] == [12, 13]
    # a process RAS found dead points at its machine (a symptom still)
    job = JobInfo(job_id="j", world_size=2, rank_nodes={0: "gpu-1", 1: "gpu-2"})
    dead = rec(
        "nccl_ras",
        "gpu-1",
        None,
        errors=["INCOMPLETE"],
        issues=[{"kind": "DEAD", "section": "errors", "details": [], "nodes": ["gpu-2"], "processes": [42]}],
    )
    pointer = only(detect([dead], job), key="pointer:gpu-2")
    assert pointer.role == "symptom" and pointer.action == "diagnose"
