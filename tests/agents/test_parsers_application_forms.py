"""Training log forms that say the application (or the job's storage, or the host's configuration) failed, not a
machine: collective mismatches caught by PyTorch, NCCL and the flight recorder, NCCL RAS reports, the newest
watchdog wording, storage errors, two ranks on one GPU; and lines that must not read as what they are not.

Every line here is quoted from a fixture of tests/fixtures/logs (each file cites its thread), or is a real line's
variant the rules must read the same way.
"""

from __future__ import annotations

from agents.events import Event
from tests.agents.test_parsers_real_world import corpus, of, one, parse

# -- collective mismatches ---------------------------------------------------------------------------------------


def test_nccl_mismatched_collective_without_its_host_prefix() -> None:
    # mismatched_collective_nccl_296.txt: the launcher dropped NCCL's "host:pid:tid [dev]" prefix.
    event = one(corpus("mismatched_collective_nccl_296.txt"))
    assert event.kind == "collective_mismatch" and event.critical and event.severity == "error"
    assert event.line.startswith("init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective")
    f = event.fields
    assert (f["source"], f["ranks"], f["src"]) == ("nccl", [39], "init.cc:1247")
    # with the prefix, the host comes along
    prefixed = one("node7:123:456 [3] init.cc:1247 NCCL WARN Mismatched collective detected, please check your "
                   "collective calls at and around rank 5. You can use NCCL_DEBUG=INFO")  # fmt: skip
    assert prefixed.fields["ranks"] == [5] and prefixed.fields["host"] == "node7"


def test_pytorch_fingerprint_mismatch_names_ranks_ops_and_shapes() -> None:
    # desync_mismatch_checkpointing_speechbrain_2401.txt: "RuntimeError: Detected mismatch between collectives on
    # ranks. Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=485, OpType=ALLREDUCE,
    # TensorShape=[25], TensorDtypes=Float, ...), but Rank 0 is running collective: CollectiveFingerPrint(
    # SequenceNumber=485, OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long, ...)"
    events = parse(corpus("desync_mismatch_checkpointing_speechbrain_2401.txt"))
    [event] = of(events, "collective_mismatch")
    f = event.fields
    assert (f["source"], f["ranks"], f["ops"]) == ("pytorch", [1, 0], ["ALLREDUCE", "BROADCAST"])
    assert (f["shapes"], f["dtypes"], f["seqs"]) == (["[25]", "[1]"], ["Float", "Long"], [485, 485])
    assert f["differences"].startswith("Op type: ALLREDUCEvs BROADCAST")
    assert of(events, "unmatched_error") == []
    # desync_mismatch_shapes_msswift_pr9443.txt: the same op, two shapes; the rank from the "[rank1]: " prefix
    shapes = one(corpus("desync_mismatch_shapes_msswift_pr9443.txt"))
    assert shapes.kind == "collective_mismatch" and shapes.rank == 1
    assert shapes.fields["ops"] == ["ALLREDUCE", "ALLREDUCE"]
    assert shapes.fields["shapes"] == ["[195812480]", "[51123456]"]


def test_pytorch_fingerprint_mismatch_in_a_traceback() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 9, in <module>\n'
        "    dist.all_reduce(t)\n"
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=7OpType=BARRIER), but Rank 1 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=7OpType=ALLREDUCE, TensorShape=[2, 3], TensorDtypes=Float, "
        "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda))."
    )
    [tb] = parse(text)
    assert tb.kind == "traceback" and tb.fields["error_kind"] == "collective_mismatch"
    assert tb.fields["error"]["ops"] == ["BARRIER", "ALLREDUCE"] and tb.fields["error"]["shapes"] == [None, "[2, 3]"]


def test_net_ib_size_mismatch_is_a_collective_mismatch() -> None:
    # nccl_ib_collective_mismatch_size_nccl_969.txt: "transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 0 peer
    # 10.10.23.6<58683> collective mismatch error, local size 496640 remote size 65536"
    [event] = parse(corpus("nccl_ib_collective_mismatch_size_nccl_969.txt"))
    assert event.kind == "collective_mismatch"
    f = event.fields
    assert (f["source"], f["transport"], f["peer"], f["peer_port"]) == ("nccl_net", "IB", "10.10.23.6", 58683)
    assert (f["local_size"], f["remote_size"], f["host"]) == (496640, 65536, "so-ucloud-10-10-23-10")
    socket = one(
        "gpu2:77:88 [0] NCCL WARN NET/Socket : peer 10.0.0.3<40111> message truncated : receiving 1048576 bytes "
        "instead of 65536. If you believe your socket network is in healthy state, there may be a mismatch in "
        "collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks"
    )
    assert socket.kind == "collective_mismatch" and socket.fields["transport"] == "Socket"
    assert (socket.fields["remote_size"], socket.fields["local_size"]) == (1048576, 65536)


def test_flight_recorder_errors_name_the_culprit() -> None:
    # fr_trace_state_mismatch_pytorch_151666.txt: "Collective sequence number: 1487 has errors" ... "error msg:
    # Culprit rank 1; Error type: COLLECTIVE_STATE_MISMATCH, Expected state: 'scheduled' does not match found state:
    # 'completed'"; the second record is cut before its error line.
    first, second = parse(corpus("fr_trace_state_mismatch_pytorch_151666.txt"))
    assert first.kind == second.kind == "flight_recorder"
    f = first.fields
    assert (f["error"], f["collective"], f["record_id"], f["op"]) == (
        "collective_mismatch",
        1487,
        1486,
        "nccl:all_reduce",
    )
    assert (f["culprit_ranks"], f["error_types"]) == ([1], ["COLLECTIVE_STATE_MISMATCH"])
    assert f["expected_ranks"] == [0, 1] and f["state"] == "scheduled" and len(f["stack"]) == 4
    assert second.fields["collective"] == 1488 and "culprit_ranks" not in second.fields


# -- NCCL RAS, the newest watchdog wording -------------------------------------------------------------------------


def test_ncclras_mismatch_report_keeps_its_rows() -> None:
    # ncclras_mismatch_opcount_nccl_1911.txt: "0  1  4  8  32  32   RUNNING  MISMATCH", then under Warnings
    # "#0-0 (fa93daea854b060b) MISMATCH", "30 ranks have launched up to operation 640", "2 ranks have launched up to
    # operation 641", "Rank 12 -- GPU 4 managed by process 323032 on node 10.137.190.124"
    event = one(corpus("ncclras_mismatch_opcount_nccl_1911.txt"))
    assert event.kind == "nccl_ras" and event.severity == "warning" and not event.critical
    f = event.fields
    assert (f["errors"], f["statuses"]) == (["MISMATCH"], ["RUNNING"])
    assert f["communicators"][0]["ranks"] == 32 and f["communicators"][0]["errors"] == "MISMATCH"
    [issue] = f["issues"]
    assert (issue["comm"], issue["comm_hash"], issue["kind"], issue["op"]) == (
        "#0-0",
        "fa93daea854b060b",
        "MISMATCH",
        "AllGather",
    )
    assert issue["op_counts"] == [{"operation": 640, "ranks": 30}, {"operation": 641, "ranks": 2}]
    assert (issue["ranks"], issue["nodes"], issue["processes"]) == ([12, 13], ["10.137.190.124"], [323032, 323033])


def test_ncclras_dead_process_is_an_error_and_an_ok_report_says_nothing() -> None:
    dead = (
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
        "    #  in group  per comm  per node  per comm  in group\n"
        "    0         1         4         8        32        32   RUNNING  INCOMPLETE\n"
        "\n"
        "Errors\n"
        "======\n"
        "\n"
        "DEAD\n"
        "  1 job process is considered dead (unreachable via the RAS network)\n"
        "  Process 3487984 on node 172.16.64.213 managing GPU 5\n"
    )
    event = one(dead)
    assert event.kind == "nccl_ras" and event.critical and event.severity == "error"
    assert event.fields["issues"][0]["kind"] == "DEAD" and event.fields["issues"][0]["nodes"] == ["172.16.64.213"]
    # ncclras_ok_then_watchdog_timeout_nccl_1730.txt: "0  1  32  8  256  256   RUNNING      OK"
    events = parse(corpus("ncclras_ok_then_watchdog_timeout_nccl_1730.txt"))
    assert of(events, "nccl_ras") == []


def test_newest_watchdog_wording_is_a_watchdog_exception() -> None:
    # ncclras_ok_then_watchdog_timeout_nccl_1730.txt: "[PG ID 0 PG GUID 0(default_pg) Rank 118]  failure detected by
    # watchdog at work sequence id: 2398459 PG status: last enqueued work: 2398578, last completed work: 2398458"
    events = parse(corpus("ncclras_ok_then_watchdog_timeout_nccl_1730.txt"))
    [event] = of(events, "watchdog_exception")
    f = event.fields
    assert (f["seq"], f["last_enqueued"], f["last_completed"], f["timeout"]) == (2398459, 2398578, 2398458, None)
    assert event.rank == 118 and f["pg_name"] == "default_pg"
    assert of(events, "unmatched_error") == [] and len(of(events, "watchdog_timeout")) == 1


# -- storage --------------------------------------------------------------------------------------------------------


def test_stale_file_handles_are_storage_errors() -> None:
    # stale_file_handle_filelock_msswift_6695.txt: "[rank1]: OSError: [Errno 116] Stale file handle: xxx"
    event = one(corpus("stale_file_handle_filelock_msswift_6695.txt").splitlines()[-1])
    assert event.kind == "storage_error" and event.critical and event.rank == 1
    assert (event.fields["errno"], event.fields["category"], event.fields["path"]) == ("ESTALE", "stale", "xxx")
    # stale_file_handle_torch_load_slurm_pytorch_45826.txt: "RuntimeError: read(): fd 33 failed with Stale file
    # handle", the traceback's header cut off
    events = parse(corpus("stale_file_handle_torch_load_slurm_pytorch_45826.txt"))
    [read] = of(events, "storage_error")
    assert read.fields["errno"] == "ESTALE" and read.fields["message"].startswith("RuntimeError: read(): fd 33")
    assert of(events, "unmatched_error") == []


def test_object_store_unreachable_while_saving_a_checkpoint() -> None:
    # s3_checkpoint_save_failed_sagemaker_454.txt: "OP_REQUIRES failed at save_restore_v2_ops.cc:137 : Unknown: :
    # Unable to connect to endpoint"
    events = parse(corpus("s3_checkpoint_save_failed_sagemaker_454.txt"))
    stores = of(events, "storage_error")
    assert stores and all(e.fields["category"] == "object_store" for e in stores)
    assert of(events, "unmatched_error") == []
    boto = one(
        'botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL: "https://b.s3.amazonaws.com/x"'
    )
    assert boto.fields["category"] == "object_store" and boto.fields["endpoint"] == "https://b.s3.amazonaws.com/x"


def test_errno_wordings_and_what_is_not_a_filesystem() -> None:
    assert one("OSError: [Errno 5] Input/output error: '/mnt/lustre/ckpt.pt'").fields["category"] == "io"
    assert one("OSError: [Errno 30] Read-only file system: '/ckpt'").fields["category"] == "read_only"
    full = one("OSError: [Errno 28] No space left on device: '/scratch/step_4000/model.pt'")
    assert (full.fields["category"], full.fields["path"]) == ("capacity", "/scratch/step_4000/model.pt")
    shm = one("RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on device (28)")
    assert shm.fields["category"] == "shm"
    fuse = one("OSError: [Errno 107] Transport endpoint is not connected: '/mnt/fuse/bucket/train'")
    assert (fuse.fields["errno"], fuse.fields["category"]) == ("ENOTCONN", "io")
    # nvlink_uncorrectable_transport_endpoint_pytorch_58155.txt: "what():  Transport endpoint is not connected" is
    # a c10d socket of a peer going away, in a crash next to an uncorrectable NVLink error
    crashes = parse(corpus("nvlink_uncorrectable_transport_endpoint_pytorch_58155.txt"))
    assert [e.kind for e in crashes] == ["crash", "crash"]
    assert all("error" not in e.fields or e.fields["error_kind"] != "storage_error" for e in crashes)


# -- two ranks on one GPU, NCCL's "Last error:", nccl-tests' header -------------------------------------------------


def _duplicate(event: Event) -> tuple[object, ...]:
    f = event.fields
    return f["category"], f["nccl_code"], f["ranks"], f["cuda_device"]


def test_duplicate_gpu_is_nccl_invalid_usage() -> None:
    # nccl_warn_duplicate_gpu_mpirun_horovod_3929.txt: "[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN
    # Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 1000"
    warns = of(parse(corpus("nccl_warn_duplicate_gpu_mpirun_horovod_3929.txt")), "nccl_warn")
    assert len(warns) == 3 and all(e.critical and e.severity == "error" for e in warns)
    assert _duplicate(warns[0]) == ("duplicate_gpu", "ncclInvalidUsage", [2, 0], "1000")
    # nccl_invalid_usage_duplicate_gpu_dfine_289.txt: PyTorch's error, "Last error:", then the line it heads
    events = parse(corpus("nccl_invalid_usage_duplicate_gpu_dfine_289.txt"))
    assert of(events, "unmatched_error") == []
    errors = of(events, "nccl_error")
    assert all(e.fields["nccl_code"] == "ncclInvalidUsage" for e in errors)
    assert _duplicate(errors[-1]) == ("duplicate_gpu", "ncclInvalidUsage", [0, 1], "2000")


def test_nccl_tests_header_is_not_a_training_step() -> None:
    # nccl_warn_no_libibverbs_healthy_nccltests_82.txt: "# nThread 1 nGpus 1 minBytes 8 maxBytes 2147483648 step:
    # 2(factor) warmup iters: 10 iters: 100 validation: 0"
    events = parse(corpus("nccl_warn_no_libibverbs_healthy_nccltests_82.txt"))
    assert of(events, "step") == [] and not any(e.critical for e in events)
    assert one("step: 12 loss: 2.5").kind == "step"
