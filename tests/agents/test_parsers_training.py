"""Training log parser: every corpus sample, launcher prefixes, watchdog formats, blocks, progress."""

from __future__ import annotations

import json
import random
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from agents.events import SEVERITIES, Event
from agents.parsers import parse_text
from agents.parsers.training import DEFAULT_STEP_PATTERNS, TrainingLogParser
from tests import paths

FIXTURES = paths.FIXTURES
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
KIND = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


def corpus(name: str) -> str:
    """A corpus log without its provenance header (everything up to the '---' line)."""
    return (FIXTURES / "logs" / name).read_text().split("\n---\n", 1)[1]


def check_event(event: Event) -> None:
    """What every event must satisfy to go on the wire."""
    assert event.source == "training"
    assert KIND.match(event.kind)
    assert event.severity in SEVERITIES
    assert event.ts.tzinfo is not None
    assert event.rank is None or event.rank >= 0
    json.dumps(event.to_wire(), allow_nan=False)
    assert len(event.line) <= 65_536


def parse(text: str, **kw: object) -> list[Event]:
    events = parse_text(TrainingLogParser(path="/logs/train.log", **kw), text, now=NOW)  # type: ignore[arg-type]
    for event in events:
        check_event(event)
        assert event.path == "/logs/train.log"
    return events


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def one(text: str, **kw: object) -> Event:
    events = parse(text, **kw)
    assert len(events) == 1, [(e.kind, e.fields) for e in events]
    return events[0]


# -- corpus: every file gets its kind --------------------------------------------------------------


def test_corpus_dataloader_bus_error_without_traceback_header():
    [event] = parse(corpus("dataloader_bus_error_lustre_mmdet_291.txt"))  # orphan frames: no noise
    assert event.kind == "dataloader_died" and event.critical
    assert event.fields == {"pids": [34569], "signal": "Bus error"}


def test_corpus_dataloader_shm_then_traceback():
    shm, tb = parse(corpus("dataloader_bus_error_shm_mmseg_1356.txt"))
    assert shm.kind == "dataloader_died" and shm.fields["shm"] is True and shm.fields["signal"] == "Bus error"
    assert tb.kind == "traceback" and tb.critical
    assert tb.fields["exc_type"] == "RuntimeError"
    assert tb.fields["exc_message"].startswith("DataLoader worker (pid 7579) is killed by signal: Bus error.")
    assert tb.fields["error"] == {"kind": "dataloader_died", "pids": [7579], "signal": "Bus error"}
    assert tb.fields["n_frames"] == 4 and len(tb.fields["frames"]) == 4
    assert tb.fields["last_frame"] == {
        "file": "/opt/conda/lib/python3.7/site-packages/torch/utils/data/_utils/signal_handling.py",
        "line": 66,
        "function": "handler",
    }
    assert tb.line.count("\n") == 9 and tb.line.startswith("Traceback (most recent call last):")


def test_corpus_ecc_uncorrectable_pytorch():
    [event] = parse(corpus("ecc_uncorrectable_jade_hpc_194.txt"))  # the three hint lines are boilerplate
    assert event.kind == "cuda_error" and event.critical
    assert event.fields == {"error": "ecc_uncorrectable", "message": "uncorrectable ECC error encountered"}


def test_corpus_ecc_uncorrectable_tensorflow_driver_code():
    [event] = parse(corpus("ecc_uncorrectable_tf_deepfacelab_89.txt"))
    assert event.kind == "cuda_error"
    assert event.fields["code"] == "CUDA_ERROR_ECC_UNCORRECTABLE" and event.fields["error"] == "ecc_uncorrectable"


def test_corpus_elastic_heartbeat_lost():
    events = parse(corpus("elastic_agent_heartbeat_lost_pytorch_67742.txt"))
    assert kinds(events) == ["elastic_error"] * 3
    assert events[0].fields == {
        "category": "heartbeat",
        "node": "docker.b_3427_0",
        "rendezvous": "test",
        "error_type": "RendezvousConnectionError",
    }
    assert events[1].fields == {"category": "closing_signal", "pid": 3494, "signal": "SIGTERM"}
    assert events[1].severity == "warning"
    assert events[2].fields["category"] == "rendezvous_shutdown"


def test_corpus_child_failed_sigabrt():
    [event] = parse(corpus("elastic_childfailed_sigabrt_vlmevalkit_1131.txt"))
    assert event.kind == "child_failed" and event.critical and event.severity == "critical"
    f = event.fields
    assert (f["root_rank"], f["local_rank"], f["exitcode"], f["pid"], f["signal"]) == (1, 1, -6, 32051, "SIGABRT")
    assert f["host"] == "ip-172-31-21-134.ec2.internal" and f["failures"] == [1, 3]
    assert event.rank == 1 and event.ts == datetime(2025, 7, 10, 21, 46, 37, tzinfo=UTC)
    assert event.line.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:")
    assert event.line.count("\n") == 18


def test_corpus_rendezvous_store_failed():
    events = parse(corpus("elastic_rdzv_c10d_store_failed_pytorch_64926.txt"))
    assert kinds(events) == ["unmatched_error", "elastic_error"]
    level, store = events
    assert level.fields == {"level": "ERROR"} and level.ts == datetime(2021, 9, 13, 22, 18, 26, 678000, tzinfo=UTC)
    assert store.fields["category"] == "store" and store.fields["error_type"] == "RendezvousConnectionError"
    assert store.fields["message"].startswith("RendezvousConnectionError: The connection to the C10d store has failed.")


def test_corpus_worker_group_restart():
    failed, restart, tb = parse(corpus("elastic_worker_group_restart_pytorch_147064.txt"))
    assert failed.kind == "elastic_error" and failed.fields["category"] == "worker_failed"
    assert (failed.fields["exitcode"], failed.fields["local_rank"], failed.fields["pid"]) == (1, 0, 876053)
    assert failed.ts == datetime(2026, 2, 13, 12, 7, 20, 86000, tzinfo=UTC)  # glog stamp, year from now
    assert restart.fields == {"category": "worker_group_restart", "attempts_left": 3}
    # The excerpt ends inside the traceback: flush emits it, marked incomplete.
    assert tb.kind == "traceback" and tb.fields["complete"] is False and tb.fields["exc_type"] is None
    assert tb.fields["last_frame"]["function"] == "<module>"


def test_corpus_gloo_barrier_timeout():
    [event] = parse(corpus("gloo_barrier_timeout_torchtune_2676.txt"))
    assert event.kind == "collective_timeout" and event.rank == 2
    assert event.fields == {"backend": "gloo", "timeout_ms": 1800000, "op": "recv"}


def test_corpus_ib_error12_wrapped_over_two_lines():
    [event] = parse(corpus("ib_error12_mlengineering_azure.txt"))
    assert event.kind == "ib_error" and event.critical and event.severity == "error"
    f = event.fields
    assert (f["status"], f["status_name"], f["opcode"], f["len"], f["vendor_err"]) == (
        12,
        "IBV_WC_RETRY_EXC_ERR",
        0,
        0,
        129,
    )
    assert (f["peer"], f["peer_port"], f["direction"]) == ("10.2.0.5", 33092, "Recv")
    assert (f["host"], f["pid"], f["tid"], f["device"], f["src"]) == (
        "node-2",
        5776,
        5902,
        0,
        "transport/net_ib.cc:1296",
    )
    assert event.line.count("\n") == 1  # both halves


def test_corpus_ib_error4_ipv6_peer():
    events = parse(corpus("ib_error4_nccl_928.txt"))
    assert kinds(events) == ["ib_error", "ib_error"]  # NCCL INFO "-> 6" chains are not events
    assert events[0].fields["status"] == 4 and events[0].fields["vendor_err"] == 81
    assert events[0].fields["peer"] == "fe80::966d:ae03:8b:df78%ib0" and events[0].fields["direction"] == "Send"
    assert events[1].fields["host"] == "H100-1"


def test_corpus_ib_status12_new_format():
    first, second = parse(corpus("ib_status12_nccl_1814.txt"))
    assert (first.fields["status"], first.fields["opcode"], first.fields["len"]) == (12, 129, 65536)
    assert first.fields["peer"] == "172.36.143.59" and first.fields["src"] == "ib_plugin.c:1615"
    assert first.fields["local_gid"] == "::ffff:29.87.88.182" and first.fields["remote_gid"] == "::ffff:29.87.4.221"
    assert second.fields["status"] == 5 and second.fields["status_name"] == "IBV_WC_WR_FLUSH_ERR"


def test_corpus_watchdog_cpp_frames():
    [event] = parse(corpus("illegal_mem_access_watchdog_lmdeploy_3258.txt"))
    assert event.kind == "cpp_exception" and event.critical
    assert event.fields["function"] == "ncclCommWatchdog"
    assert event.fields["src"] == "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1601"
    assert len(event.fields["frames"]) == 5 and event.fields["frames"][0].startswith("c10::Error::Error")


def test_corpus_nan_grad_norm_assertion():
    [event] = parse(corpus("nan_gradnorm_assert_paimegatron_366.txt"))
    assert event.kind == "grad_norm_nan" and event.rank == 11 and event.fields["device"] == 3


def test_corpus_megatron_deepspeed_grad_norm_nan():
    events = parse(corpus("nan_gradnorm_megatron_deepspeed_396.txt"))
    assert kinds(events) == ["step", "grad_norm_nan"] * 3
    step = events[0]
    assert step.severity == "debug"
    assert step.fields == {
        "step": 5426,
        "total": 250000,
        "grad_norm": "nan",
        "elapsed_ms": 4247.9,
        "lr": 2.999e-4,
        "skipped": 0,
        "nan_iterations": 0,
    }
    assert [e.fields["step"] for e in events[1::2]] == [5426, 5427, 5428]


def test_corpus_desync_report():
    watchdog, desync = parse(corpus("nccl_desync_report_mlengineering.txt"))
    assert watchdog.kind == "watchdog_timeout"
    assert (watchdog.fields["seq"], watchdog.fields["op"], watchdog.fields["timeout_ms"]) == (2, "ALLREDUCE", 8000)
    assert watchdog.fields["elapsed_ms"] == 8097 and watchdog.rank == 0
    assert desync.kind == "desync_report"
    assert (desync.fields["op"], desync.fields["collective"], desync.fields["reporter_rank"]) == ("ALLREDUCE", 3, 0)
    assert desync.fields["lagging_ranks"] == [1]
    assert desync.fields["stack"] == [
        "#2 buggy from collective_mismatch.py:8",
        "#3 main from collective_mismatch.py:15",
        "#4 <module> from collective_mismatch.py:18",
    ]


def test_corpus_nccl_remote_error_carrying_ib_error5():
    ib, nccl = parse(corpus("nccl_remote_error_ib_error5_deepep_106.txt"))  # the orphan C++ frame: nothing
    assert ib.kind == "ib_error" and (ib.fields["status"], ib.fields["vendor_err"]) == (5, 249)
    assert ib.fields["peer"] == "172.21.17.89"
    assert nccl.kind == "nccl_error" and nccl.critical
    assert nccl.fields["nccl_code"] == "ncclRemoteError" and nccl.fields["nccl_version"] == "2.20.5"
    assert nccl.fields["last_error"].startswith("NET/IB : Got completion from peer 172.21.17.89<38536> with error 5")


def test_corpus_nccl_socket_abort():
    events = parse(corpus("nccl_socket_abort_ncclTests_166.txt"))
    assert kinds(events) == ["nccl_error"] * 4
    assert events[0].fields["peer"] == "10.0.0.2" and events[0].fields["category"] == "socket"
    assert events[0].fields["message"].endswith("failed : Software caused connection abort")
    assert events[1].fields["nccl_code"] == "ncclSystemError"  # "retcode 2"
    assert events[2].fields["peer"] == "node1" and events[2].fields["tid"] == 40044


def test_corpus_watchdog_old_format_then_crash_and_traceback():
    events = parse(corpus("nccl_timeout_internlm_290.txt"))
    assert kinds(events) == ["watchdog_timeout", "watchdog_timeout", "crash", "unmatched_error", "traceback"]
    assert [e.rank for e in events[:2]] == [0, 3]
    assert events[1].fields["seq"] == 316 and events[1].fields["elapsed_ms"] == 1803620
    crash = events[2]
    assert crash.fields["exc_type"] == "std::runtime_error" and crash.rank == 0
    assert crash.fields["error"]["kind"] == "watchdog_timeout" and crash.fields["error"]["seq"] == 316
    assert events[3].rank == 3  # "with rank id: 3"
    assert events[3].ts == datetime(2023, 9, 7, 9, 14, 40, 98000, tzinfo=UTC)


def test_corpus_watchdog_rank_prefixed_with_pg():
    events = parse(corpus("nccl_timeout_llamafactory_7396.txt"))
    assert kinds(events) == [
        "watchdog_timeout",
        "watchdog_timeout",
        "watchdog_exception",
        "watchdog_exception",
        "watchdog_timeout",
    ]
    first = events[0]
    assert first.rank == 0 and first.ts == datetime(2026, 3, 21, 2, 7, 8, 408271, tzinfo=UTC)
    assert (first.fields["seq"], first.fields["numel_in"], first.fields["timeout_ms"]) == (1580, 466119168, 600000)
    exc = events[3]
    assert exc.rank == 3 and exc.fields["pg"] == 1
    assert (exc.fields["seq"], exc.fields["last_enqueued"], exc.fields["last_completed"]) == (1580, 1582, 1579)
    assert events[4].rank == 2 and events[4].fields["elapsed_ms"] is None  # the line is cut off


def test_corpus_watchdog_eight_ranks():
    events = parse(corpus("nccl_timeout_ofa_271.txt"))
    assert [e.rank for e in events] == [1, 3, 2, 6, 7]
    assert {e.fields["seq"] for e in events} == {469508}


def test_corpus_seqnum_skew_progress_bar_with_watchdog_glued():
    events = parse(corpus("nccl_timeout_seqnum_skew_pytorch_118369.txt"))
    assert kinds(events) == ["step"] + ["watchdog_timeout"] * 5
    assert events[0].fields == {"step": 32040, "total": 500150, "loss": 2.6}
    assert [e.fields["seq"] for e in events[1:]] == [96120, 96117, 96125, 96125, 64088]
    assert [e.rank for e in events[1:]] == [0, 0, 0, 0, 7]


def test_corpus_oom():
    [event] = parse(corpus("oom_cuda_mid_format_mgfn_35.txt"))
    assert event.kind == "oom" and event.critical
    assert event.fields["tried_bytes"] == int(1.70 * 2**30) and event.fields["gpu"] == 0
    assert event.fields["total_bytes"] == 6 * 2**30 and event.fields["free_bytes"] == 0


def test_corpus_pyspy_dump_is_not_an_error():
    assert parse(corpus("pyspy_dump_multithread_mlengineering.txt")) == []


def test_kernel_corpus_files_make_no_training_noise():
    # A training-log parser pointed at kernel logs must not cry wolf on Xid lines' words.
    for name in ("xid13_xid109_gpud_pr46.txt", "pcie_aer_gpu_unknown_error_returnn_1486.txt"):
        assert all(e.kind == "unmatched_error" for e in parse(corpus(name)))


# -- launcher prefixes -----------------------------------------------------------------------------

CUDA_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize(
    ("prefix", "rank", "local_rank", "ts"),
    [
        ("[rank3]: ", 3, None, NOW),
        ("[rank3]:", 3, None, NOW),
        ("[default5]:", None, 5, NOW),
        ("3: ", 3, None, NOW),
        ("  12: ", 12, None, NOW),
        ("2026-11-22T10:00:00.500Z ", None, None, datetime(2026, 11, 22, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2026-11-22 10:00:00,250 ", None, None, datetime(2026, 11, 22, 10, 0, 0, 250000, tzinfo=UTC)),
        ("[2026-11-22 10:00:00,250] ", None, None, datetime(2026, 11, 22, 10, 0, 0, 250000, tzinfo=UTC)),
        ("2026-11-22T11:00:00+01:00 [rank7]: ", 7, None, datetime(2026, 11, 22, 10, tzinfo=UTC)),
        (
            "[rank1]:[E1122 10:00:00.123456789 ProcessGroupNCCL.cpp:607] ",
            1,
            None,
            NOW.replace(hour=10, microsecond=123456),
        ),
        ("E1122 10:00:00.123456 870572 train.py:10] ", None, None, NOW.replace(hour=10, microsecond=123456)),
        ("[E ProcessGroupNCCL.cpp:821] ", None, None, NOW),
    ],
)
def test_prefixes_are_stripped_and_read(prefix: str, rank: int | None, local_rank: int | None, ts: datetime):
    event = one(prefix + CUDA_LINE)
    assert event.kind == "cuda_error" and event.fields["error"] == "illegal_memory_access"
    assert event.fields["message"] == "an illegal memory access was encountered"
    assert event.rank == rank and event.fields.get("local_rank") == local_rank
    assert event.ts == ts and event.line == prefix + CUDA_LINE


# -- watchdog formats ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected", "rank"),
    [
        (
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, "
            "NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.",
            {"seq": 1234, "op": "ALLREDUCE", "timeout_ms": 600000, "elapsed_ms": 600123, "rank": 3, "pg": None},
            3,
        ),
        (
            "[PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, "
            "OpType=_ALLGATHER_BASE, NumelIn=8, NumelOut=64, Timeout(ms)=600000) ran for 600013 milliseconds before "
            "timing out.",
            {"seq": 77, "op": "_ALLGATHER_BASE", "timeout_ms": 600000, "elapsed_ms": 600013, "rank": 3, "pg": 0},
            3,
        ),
        (
            "[PG 0 (default_pg) Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=SEND, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800456 milliseconds before timing out.",
            {"seq": 9, "op": "SEND", "timeout_ms": 1800000, "elapsed_ms": 1800456, "rank": 5, "pg": 0},
            5,
        ),
        (
            "[PG 2 Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds before timing out.",
            {"seq": 9, "op": "ALLREDUCE", "timeout_ms": 600000, "elapsed_ms": 600001, "rank": 1, "pg": 2},
            None,  # rank 1 of process group 2 is not global rank 1
        ),
        (
            "[E ProcessGroupNCCL.cpp:587] [Rank 2] Watchdog caught collective operation timeout: "
            "WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800228 milliseconds before timing out.",
            {"seq": None, "op": "BROADCAST", "timeout_ms": 1800000, "elapsed_ms": 1800228, "rank": 2, "pg": None},
            2,
        ),
    ],
)
def test_watchdog_formats(line: str, expected: dict[str, object], rank: int | None):
    event = one(line)
    assert event.kind == "watchdog_timeout" and event.critical
    assert {k: event.fields[k] for k in expected} == expected
    assert event.rank == rank


def test_watchdog_pg_name_is_kept():
    event = one(
        "[PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=1) ran for 2 milliseconds before timing out."
    )
    assert event.fields["pg_name"] == "default_pg"


# -- tracebacks ------------------------------------------------------------------------------------

TRACEBACK = """\
Traceback (most recent call last):
  File "/app/train.py", line 10, in <module>
    main()
  File "/app/train.py", line 7, in main
    loss.backward()
RuntimeError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1."""


def test_traceback_is_one_event_finished_by_flush():
    parser = TrainingLogParser()
    events: list[Event] = []
    for line in TRACEBACK.splitlines():
        events += parser.feed(line, now=NOW)
    assert events == []  # the block may go on: nothing yet
    [event] = parser.flush(now=NOW)
    check_event(event)
    assert event.kind == "traceback" and event.critical and event.line == TRACEBACK
    assert event.fields["exc_type"] == "RuntimeError"
    assert event.fields["exc_message"] == "CUDA error: an illegal memory access was encountered"
    assert event.fields["error"] == {
        "kind": "cuda_error",
        "error": "illegal_memory_access",
        "message": "an illegal memory access was encountered",
    }
    assert event.fields["error_kind"] == "cuda_error"
    assert event.fields["frames"] == [
        {"file": "/app/train.py", "line": 10, "function": "<module>"},
        {"file": "/app/train.py", "line": 7, "function": "main"},
    ]
    assert event.fields["last_frame"] == {"file": "/app/train.py", "line": 7, "function": "main"}
    assert parser.flush(now=NOW) == []


def test_traceback_ends_at_the_next_ordinary_line():
    events = parse(TRACEBACK + "\nepoch 3 starting\n[rank0]: step=5 loss=1.5")
    assert kinds(events) == ["traceback", "step"]
    assert events[0].line == TRACEBACK and events[1].fields == {"step": 5, "loss": 1.5}


def test_chained_traceback_is_one_event():
    text = """\
Traceback (most recent call last):
  File "/app/data.py", line 3, in load
    open(path)
FileNotFoundError: [Errno 2] No such file or directory: '/data/shard7'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    load()
  File "/app/data.py", line 5, in load
    raise RuntimeError("bad shard")
RuntimeError: bad shard"""
    [event] = parse(text)
    assert event.kind == "traceback" and event.line == text
    assert event.fields["exc_type"] == "RuntimeError" and event.fields["exc_message"] == "bad shard"
    assert event.fields["chained"] == ["FileNotFoundError: [Errno 2] No such file or directory: '/data/shard7'"]
    assert event.fields["n_frames"] == 3 and event.fields["last_frame"]["line"] == 5


def test_traceback_with_oom_exception_line_and_old_oom_format():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/app/train.py", line 1, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 15.78 GiB total capacity;"
        " 13.10 GiB already allocated; 1.50 GiB free; 13.50 GiB reserved in total by PyTorch)"
    )
    [event] = parse(text)
    assert event.kind == "traceback" and event.fields["exc_type"] == "torch.OutOfMemoryError"
    error = event.fields["error"]
    assert error["kind"] == "oom" and error["tried_bytes"] == 2 * 2**30 and error["gpu"] == 1
    assert error["total_bytes"] == int(15.78 * 2**30) and error["free_bytes"] == int(1.5 * 2**30)


def test_interleaved_rank_tracebacks_stay_apart():
    text = "\n".join(
        [
            "[rank0]: Traceback (most recent call last):",
            "[rank1]: Traceback (most recent call last):",
            '[rank0]:   File "/app/a.py", line 1, in <module>',
            '[rank1]:   File "/app/b.py", line 2, in <module>',
            "[rank1]: ValueError: rank one broke",
            "[rank0]: KeyError: 'x'",
            "[rank1]: [rank1] step 10 done",
        ]
    )
    events = parse(text)
    assert [(e.kind, e.rank, e.fields.get("exc_type")) for e in events] == [
        ("traceback", 1, "ValueError"),
        ("step", 1, None),
        ("traceback", 0, "KeyError"),
    ]
    assert events[0].line.count("\n") == 2 and all(line.startswith("[rank1]") for line in events[0].line.split("\n"))
    assert events[2].fields["frames"] == [{"file": "/app/a.py", "line": 1, "function": "<module>"}]


def test_stale_block_is_finished_by_later_lines_of_other_ranks():
    parser = TrainingLogParser()
    events = parser.feed("[rank0]: Traceback (most recent call last):", now=NOW)
    events += parser.feed('[rank0]:   File "/app/a.py", line 1, in <module>', now=NOW)
    later = NOW + timedelta(seconds=30)
    events += parser.feed("[rank1]: step 5 loss 2.0", now=later)
    assert ("traceback", 0) in [(e.kind, e.rank) for e in events]


def test_lines_inside_blocks_are_never_unmatched_errors():
    events = parse(TRACEBACK)
    assert kinds(events) == ["traceback"]


# -- ChildFailedError ------------------------------------------------------------------------------

CHILD_FAILED = """\
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/lib/python3/site-packages/torch/distributed/launcher/api.py", line 264, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_10:00:05
  host      : gpu-node-7
  rank      : 9 (local_rank: 1)
  exitcode  : 1 (pid: 4321)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_10:00:04
  host      : gpu-node-7
  rank      : 11 (local_rank: 3)
  exitcode  : -6 (pid: 1234)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 1234
============================================================"""


def test_child_failed_with_torchrun_traceback_is_one_event():
    events = parse(CHILD_FAILED + "\nsrun: error: gpu-node-7: task 0: Exited with exit code 1")
    assert kinds(events) == ["child_failed", "unmatched_error"]
    event = events[0]
    assert event.line == CHILD_FAILED
    f = event.fields
    assert (f["root_rank"], f["local_rank"], f["exitcode"], f["pid"], f["signal"]) == (11, 3, -6, 1234, "SIGABRT")
    assert f["host"] == "gpu-node-7" and f["failures"] == [9, 11]  # sorted ranks, not the "[N]:" indices
    assert f["error_file"] is None and f["traceback"] == "Signal 6 (SIGABRT) received by PID 1234"
    assert f["entries"] == [
        {"rank": 9, "local_rank": 1, "exitcode": 1, "pid": 4321, "signal": None},
        {"rank": 11, "local_rank": 3, "exitcode": -6, "pid": 1234, "signal": "SIGABRT"},
    ]
    assert event.rank == 11 and event.ts == datetime(2026, 11, 22, 10, 0, 4, tzinfo=UTC)
    assert f["frames"][-1]["function"] == "launch_agent"


def test_child_failed_header_cut_off_by_flush_is_still_emitted():
    head = CHILD_FAILED.split("\n=====")[0]  # traceback ending in ChildFailedError, no table yet
    [event] = parse(head)
    assert event.kind == "child_failed" and event.fields["root_rank"] is None and event.line == head


def test_block_from_local_rank_prefix_carries_it():
    [event] = parse("[default2]:Traceback (most recent call last):\n[default2]:ValueError: x")
    assert event.kind == "traceback" and event.rank is None and event.fields["local_rank"] == 2


def test_child_failed_signal_from_exitcode_and_no_other_failures():
    text = "\n".join(
        [
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "=======================================",
            "main.py FAILED",
            "---------------------------------------",
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            "---------------------------------------",
            "Root Cause (first observed failure):",
            "[0]:",
            "  time      : 2026-11-22_10:00:04",
            "  rank      : 0 (local_rank: 0)",
            "  exitcode  : -9 (pid: 77)",
            "  traceback : Signal 9 (SIGKILL) received by PID 77",
            "=======================================",
        ]
    )
    [event] = parse(text)
    assert event.fields["signal"] == "SIGKILL" and event.fields["failures"] == [0] and event.fields["exitcode"] == -9
    assert event.fields["entries"] == [{"rank": 0, "local_rank": 0, "exitcode": -9, "pid": 77, "signal": "SIGKILL"}]


# A real run (PyTorch 2.13, torchrun, 2 nodes x 2 ranks, node 0's launcher): rank 1 raised, rank 0 was
# then SIGTERMed. torchrun lists rank 0 as "[1]:" under Failures and rank 1 as "[0]:" under Root Cause,
# each with the worker's traceback (from its error file) indented inside the table.
REAL_CRASH = "torchrun_crash_rank1_real.txt"


def test_real_torchrun_crash_events():
    events = parse(corpus(REAL_CRASH))
    assert kinds(events) == ["step"] * 8 + ["elastic_error", "elastic_error", "child_failed", "traceback", "traceback"]
    closing, worker = events[8:10]
    assert closing.fields == {"category": "closing_signal", "pid": 15977, "signal": "SIGTERM"}
    assert worker.fields["category"] == "worker_failed" and worker.fields["exitcode"] == 1
    assert worker.fields["local_rank"] == 1  # "no error file defined for parent ..." after it: no event
    assert not [e for e in events if e.kind == "unmatched_error"]


def test_real_torchrun_child_failed_root_cause_is_rank_1():
    [event] = [e for e in parse(corpus(REAL_CRASH)) if e.kind == "child_failed"]
    assert event.critical and event.severity == "critical" and event.rank == 1
    f = event.fields
    assert (f["root_rank"], f["local_rank"], f["exitcode"], f["pid"], f["signal"]) == (1, 1, 1, 15979, None)
    assert f["failures"] == [0, 1]
    assert f["entries"] == [
        {"rank": 0, "local_rank": 0, "exitcode": -15, "pid": 15977, "signal": "SIGTERM"},
        {"rank": 1, "local_rank": 1, "exitcode": 1, "pid": 15979, "signal": None},
    ]
    assert f["host"] == "localhost" and f["time"] == "2026-11-22_15:17:08"
    assert event.ts == datetime(2026, 11, 22, 15, 17, 8, tzinfo=UTC)
    assert f["error_file"].endswith("/attempt_0/1/error.json")  # rank 1's, not rank 0's
    # The root rank's own traceback, read from the table.
    assert f["traceback"].startswith("Traceback (most recent call last):\n  File ")
    assert f["traceback"].endswith("\nRuntimeError: injected fault: rank 1 crashed at step 5")
    assert (f["exc_type"], f["exc_message"]) == ("RuntimeError", "injected fault: rank 1 crashed at step 5")
    assert f["last_frame"] == {"file": "/work/main/tests/torchjob/train.py", "line": 71, "function": "_injected_crash"}
    # torchrun's own stack, then the whole table through the closing rule: one event.
    assert event.line.startswith('Traceback (most recent call last):\n  File "/work/main/.venv/bin/torchrun"')
    assert f["frames"][-1]["function"] == "launch_agent"
    lines = event.line.split("\n")
    assert "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: " in lines
    assert lines[-1] == "=" * 60 and len(lines) == 62
    assert "  RuntimeError: injected fault: rank 1 crashed at step 5" in lines
    assert any(line.startswith("  RuntimeError: [/__w/pytorch") for line in lines)


def test_real_torchrun_rank_tracebacks_with_double_prefix():
    events = parse(corpus(REAL_CRASH))
    tracebacks = [e for e in events if e.kind == "traceback"]
    assert [(e.rank, e.fields["exc_type"]) for e in tracebacks] == [(1, "RuntimeError"), (0, "RuntimeError")]
    rank1 = tracebacks[0]
    assert rank1.fields["exc_message"] == "injected fault: rank 1 crashed at step 5" and rank1.fields["complete"]
    assert rank1.fields["n_frames"] == 4 and rank1.fields["last_frame"]["function"] == "_injected_crash"
    assert rank1.line.count("\n") == 10 and all(line.startswith("[rank1]:[rank1]: ") for line in rank1.line.split("\n"))
    assert "Connection closed by peer" in tracebacks[1].fields["exc_message"]
    # The exception lines are told once, inside their blocks; no launcher traceback blamed on the user.
    assert not [e for e in events if e.kind == "unmatched_error" and "injected fault" in e.line]
    assert not [e for e in events if e.kind == "unmatched_error" and "Connection closed" in e.line]
    assert not [e for e in tracebacks if "bin/torchrun" in e.line or "ChildFailedError" in e.line]
    assert [e.fields["step"] for e in events if e.kind == "step"] == [1, 1, 2, 2, 3, 3, 4, 4]  # not "at step 5"


def test_child_failed_older_format_root_cause_first_and_quoted_multiline_msg():
    # PyTorch 1.9-1.10: "Root Cause:" before "Other Failures:", "msg" instead of "traceback".
    text = "\n".join(
        [
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "============================================================",
            "train.py FAILED",
            "------------------------------------------------------------",
            "Root Cause:",
            "[0]:",
            "  time: 2021-09-13_22:18:20",
            "  rank: 5 (local_rank: 1)",
            "  exitcode: 1 (pid: 900)",
            "  error_file: /tmp/torchelastic_x/1/error.json",
            '  msg: "Traceback (most recent call last):',
            '    File "/app/train.py", line 3, in main',
            "      step()",
            '  ValueError: bad batch"',
            "------------------------------------------------------------",
            "Other Failures:",
            "[1]:",
            "  time: 2021-09-13_22:18:21",
            "  rank: 4 (local_rank: 0)",
            "  exitcode: -15 (pid: 899)",
            "  error_file: <N/A>",
            '  msg: "Signal 15 (SIGTERM) received by PID 899"',
            "============================================================",
        ]
    )
    [event] = parse(text)
    f = event.fields
    assert event.kind == "child_failed" and event.rank == 5 and event.line == text
    assert (f["root_rank"], f["local_rank"], f["exitcode"], f["pid"], f["signal"]) == (5, 1, 1, 900, None)
    assert f["failures"] == [4, 5] and f["entries"][0]["signal"] == "SIGTERM"
    assert (f["exc_type"], f["exc_message"]) == ("ValueError", "bad batch")


def test_child_failed_only_failures_section_takes_the_first_as_root():
    [event] = parse(corpus("elastic_childfailed_sigabrt_vlmevalkit_1131.txt"))
    assert [e["rank"] for e in event.fields["entries"]] == [1, 3]
    assert event.fields["error_file"] is None and event.fields["traceback"].startswith("Signal 6 (SIGABRT)")


# -- other kinds -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("RuntimeError: CUDA error: unspecified launch failure", "launch_failure"),
        ("RuntimeError: CUDA error: device-side assert triggered", "device_assert"),
        ("RuntimeError: CUDA error: misaligned address", "misaligned_address"),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm()`",
            "cublas_execution_failed",
        ),
        (
            "n:1:2 [0] enqueue.cc:10 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
            "illegal_memory_access",
        ),
        (
            "RuntimeError: CUDA error: an uncorrectable NVLink error was detected during execution",
            "nvlink_uncorrectable",
        ),
    ],
)
def test_cuda_errors_are_normalized(line: str, error: str):
    event = one(line)
    assert event.kind == "cuda_error" and event.fields["error"] == error and event.critical


def test_nccl_error_chain():
    event = one(
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691,"
        " unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3"
    )
    assert event.kind == "nccl_error" and event.fields["nccl_code"] == "ncclSystemError"
    assert event.fields["src"] == "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691"
    assert event.fields["nccl_version"] == "2.19.3"


def test_nccl_warn_generic():
    event = one("gpu7:1234:5678 [3] misc/socket.cc:398 NCCL WARN NET/Socket : No usable listening interface found")
    assert event.kind == "nccl_warn" and event.severity == "warning" and not event.critical
    assert event.fields == {
        "host": "gpu7",
        "pid": 1234,
        "tid": 5678,
        "device": 3,
        "src": "misc/socket.cc:398",
        "message": "NET/Socket : No usable listening interface found",
    }


def test_old_ib_completion_format():
    event = one("gpu7:1:2 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129")
    assert event.kind == "ib_error" and event.fields["status"] == 12 and event.fields["peer"] is None
    assert event.fields["opcode"] == 1 and event.fields["vendor_err"] == 129 and event.fields["src"] is None


def test_dataloader_exited_unexpectedly_with_several_pids():
    event = one("RuntimeError: DataLoader worker (pid(s) 123, 456) exited unexpectedly")
    assert event.kind == "dataloader_died" and event.fields == {"pids": [123, 456], "signal": None}


def test_store_timeout_is_a_collective_timeout():
    event = one(
        "torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 3/4 clients joined."
    )
    assert event.kind == "collective_timeout"
    assert event.fields == {"backend": "store", "timeout_ms": 1801000, "op": "barrier", "joined": 3, "expected": 4}


def test_rendezvous_closed_is_elastic():
    event = one("torch.distributed.elastic.rendezvous.api.RendezvousClosedError")
    assert event.kind == "elastic_error" and event.fields["error_type"] == "RendezvousClosedError"


def test_terminate_block_with_cuda_error_and_frames():
    text = "\n".join(
        [
            "[rank4]: terminate called after throwing an instance of 'c10::DistBackendError'",
            "[rank4]:   what():  [PG ID 0 PG GUID 0(default_pg) Rank 4] Process group watchdog thread terminated"
            " with exception: CUDA error: an illegal memory access was encountered",
            "[rank4]: Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most"
            " recent call first):",
            "[rank4]: frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96",
            "[rank4]: frame #1: <unknown function> + 0xe4271b",
        ]
    )
    [event] = parse(text)
    assert event.kind == "crash" and event.rank == 4 and event.critical
    assert event.fields["exc_type"] == "c10::DistBackendError"
    assert event.fields["error"]["kind"] == "cuda_error" and event.fields["error"]["error"] == "illegal_memory_access"
    assert event.fields["function"] == "c10_cuda_check_implementation" and event.fields["cpp_frames"] == 2


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("Segmentation fault (core dumped)", "segfault"),
        ("/bin/bash: line 1: 12345 Killed                  python train.py", "killed"),
        ("Fatal Python error: Aborted", "fatal_python_error"),
    ],
)
def test_process_deaths(line: str, reason: str):
    event = one(line)
    assert event.kind == "crash" and event.fields["reason"] == reason and event.critical


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("WARNING: Loss is NaN at step, skipping batch", "nan_loss"),
        ("grad norm is nan, skipping update", "grad_norm_nan"),
        ("Detected inf in gradient norm", "grad_norm_nan"),
    ],
)
def test_nan_in_free_text(line: str, kind: str):
    assert one(line).kind == kind


def test_unmatched_error_for_unknown_error_lines():
    event = one("OSError: [Errno 71] Protocol error on /dev/frob0")
    assert event.kind == "unmatched_error" and event.severity == "warning" and not event.critical
    # a file system's own error is a storage error, not an unknown one
    assert one("OSError: [Errno 121] Remote I/O error on /lustre/shard9").kind == "storage_error"


@pytest.mark.parametrize(
    "line",
    [
        "epoch 1 finished, accuracy 0.98",
        "    raise ValueError(msg)",
        'The above exception was the direct cause of the following exception:',
        "NCCL INFO Channel 00/02 : 0 1 failed",
        "frame #3: <unknown function> + 0x94ac3 (0x7f in /lib/libc.so.6) c10::Error",
        "[rank0]: Stopping worker group",
        "CUDA kernel errors might be asynchronously reported at some other API call.",
        "Using CUDA device 0, infinite patience",
    ],
)  # fmt: skip
def test_quiet_lines(line: str):
    assert parse(line) == []


# -- progress --------------------------------------------------------------------------------------


def test_megatron_iteration_line():
    line = (
        " iteration      100/  500000 | consumed samples:        12800 | elapsed time per iteration (ms): 1234.5 |"
        " learning rate: 3.000E-04 | global batch size:   128 | lm loss: 2.345000E+00 | loss scale: 1.0 |"
        " grad norm: 1.230 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    event = one(line)
    assert event.kind == "step" and event.severity == "debug"
    assert event.fields == {
        "step": 100,
        "total": 500000,
        "loss": 2.345,
        "grad_norm": 1.23,
        "elapsed_ms": 1234.5,
        "lr": 3e-4,
        "skipped": 0,
        "nan_iterations": 0,
    }


def test_hf_trainer_dict_takes_the_last_progress_step():
    events = parse(
        " 50%|█████     | 500/1000 [01:40<01:40,  5.00it/s]\n"
        "{'loss': 2.345, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}\n"
        "Map: 100%|██████████| 1000/1000 [00:01<00:00, 900.00 examples/s]"  # a dataset bar: not progress
    )
    assert [e.fields for e in events] == [
        {"step": 500, "total": 1000},
        {"step": 500, "loss": 2.345, "grad_norm": 1.2, "lr": 5e-05},
    ]


def test_progress_bar_redrawn_with_carriage_returns_keeps_the_last():
    event = one("  1%|          | 10/1000 [00:02]\r  2%|▏         | 20/1000 [00:04]\r  3%|▎         | 30/1000 [00:06]")
    assert event.fields == {"step": 30, "total": 1000}


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        ("step=100 loss=2.3 grad_norm=1.1 lr=0.0001", {"step": 100, "loss": 2.3, "grad_norm": 1.1, "lr": 0.0001}),
        ("Step 100/1000 | loss: 2.3", {"step": 100, "total": 1000, "loss": 2.3}),
        ("[rank0]: step 7 loss nan", {"step": 7, "loss": "nan"}),
    ],
)
def test_generic_steps(line: str, fields: dict[str, object]):
    assert parse(line)[0].fields == fields


def test_custom_step_pattern_first_and_validation():
    events = parse(
        "it 42 | obj 0.5", step_patterns=(r"it (?P<step>\d+) \| obj (?P<loss>[\d.]+)", *DEFAULT_STEP_PATTERNS)
    )
    assert events[0].fields == {"step": 42, "loss": 0.5}
    with pytest.raises(ValueError, match="step"):
        TrainingLogParser(step_patterns=(r"it (?P<n>\d+)",))


def test_loss_spike_and_nan_after_history():
    lines = [f"step={i} loss={2.0 + 0.01 * i} grad_norm=1.0" for i in range(10)]
    lines += ["step=10 loss=11.0 grad_norm=1.0", "step=11 loss=2.0 grad_norm=9.0", "step=12 loss=inf grad_norm=nan"]
    events = parse("\n".join(lines))
    anomalies = [(e.kind, e.fields["step"]) for e in events if e.kind != "step"]
    assert anomalies == [("loss_spike", 10), ("grad_norm_spike", 11), ("nan_loss", 12), ("grad_norm_nan", 12)]
    spike = next(e for e in events if e.kind == "loss_spike")
    assert spike.fields["loss"] == 11.0 and spike.fields["factor"] > 5 and spike.severity == "warning"
    assert sum(e.kind == "step" for e in events) == 13


def test_no_spike_before_enough_history_or_below_factor():
    events = parse(
        "step=1 loss=1.0\nstep=2 loss=100.0\n"
        + "\n".join(f"step={i} loss=1.0" for i in range(3, 10))
        + "\nstep=10 loss=4.9"
    )
    assert all(e.kind == "step" for e in events)
    assert [
        e.kind
        for e in parse("\n".join(f"step={i} loss=1.0" for i in range(6)) + "\nstep=6 loss=6.0", spike_factor=10.0)
    ] == ["step"] * 7


# -- robustness and cost ---------------------------------------------------------------------------


def test_never_raises_on_garbage():
    rng = random.Random(99)
    pieces = [
        "Traceback (most recent call last):",
        '  File "x", line 1, in f',
        "ValueError: x",
        "[rank3]:",
        "NCCL WARN ",
        "Got completion from peer 1<2> with error 12",
        "ChildFailedError:",
        "=====",
        "[0]:",
        "  rank : x",
        "terminate called after throwing an instance of 'x'",
        "Watchdog caught collective operation timeout: WorkNCCL(",
        "iteration 5/ 9 |",
        "{'loss': nan",
        "step=",
        "é漢😀\x00\x1b[31m",
        "\r",
        "Timeout at collective: X, #",
    ]
    parser = TrainingLogParser()
    for _ in range(5000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
        if rng.random() < 0.3:
            line += "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 80)))
        for event in parser.feed(line, now=NOW):
            check_event(event)
    for event in parser.feed("[rank1]: " + "RuntimeError: CUDA error: x" + " y" * 500_000, now=NOW):
        check_event(event)
    for event in parser.flush(now=NOW):
        check_event(event)
    assert parser.parse_errors == 0


def test_huge_traceback_is_capped():
    text = (
        "Traceback (most recent call last):\n"
        + '  File "/a.py", line 1, in f\n    f()\n' * 5000
        + "RecursionError: deep"
    )
    [event] = parse(text)
    assert event.fields["exc_type"] == "RecursionError" and event.fields["n_frames"] == 5000
    assert len(event.fields["frames"]) == 50 and len(event.line) <= 65_536


def test_per_line_cost_is_small():
    lines = [
        " iteration  100/ 500000 | consumed samples: 12800 | elapsed time per iteration (ms): 1234.5 | lm loss: 2.3 |",
        "node-2:5776:5898 [0] NCCL INFO NET/IB : Using [0]ibP111p0s0:1/IB [RO]; OOB eth0:10.2.0.4<0>",
        "[rank3]: INFO 2026-11-22 10:00:00 dataloader.py:12] loaded shard 7 of 9 in 0.3s",
        "{'loss': 2.345, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}",
    ]
    parser = TrainingLogParser()
    n = 20_000
    start = time.perf_counter()
    for i in range(n):
        parser.feed(lines[i % len(lines)], now=NOW)
    per_line = (time.perf_counter() - start) / n
    assert per_line < 200e-6, f"{per_line * 1e6:.1f} us per line"  # generous: CI machines are slow


# -- PyTorch 2.4-era shapes --------------------------------------------------------------------------

PG = "[PG ID 0 PG GUID 0(default_pg) Rank 5]"
CAUGHT = (
    "[Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=1024, "
    "NumelOut=1024, Timeout(ms)=600000) ran for 600123 milliseconds before timing out."
)


def test_watchdog_teardown_sequence_reports_the_timeout_once():
    c10 = "[rank5]:[E1122 10:00:00.123456 1234 ProcessGroupNCCL.cpp:{}]"
    text = "\n".join(
        [
            f"{c10.format(616)} {CAUGHT}",
            f"{c10.format(1785)} {PG} Exception (either an error or timeout) detected by watchdog at work: 77, last "
            "enqueued NCCL work: 78, last completed NCCL work: 76.",
            f"{c10.format(1834)} {PG} Timeout at NCCL work: 77, last enqueued NCCL work: 78, last completed NCCL "
            "work: 76.",
            f"{c10.format(630)} [Rank 5] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
            "of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            f"{c10.format(636)} [Rank 5] To avoid data inconsistency, we are taking the entire process down.",
            f"{c10.format(1595)} {PG} Process group watchdog thread terminated with exception: {CAUGHT}",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  {PG} Process group watchdog thread terminated with exception: {CAUGHT}",
        ]
    )
    events = parse(text)
    assert kinds(events) == ["watchdog_timeout", "watchdog_exception", "watchdog_exception", "crash"]
    assert [e.rank for e in events] == [5, 5, 5, 5]
    assert [e.fields["timeout"] for e in events[1:3]] == [False, True]
    assert events[2].fields["last_completed"] == 76 and events[2].fields["pg_name"] == "default_pg"
    assert events[3].fields["error"]["kind"] == "watchdog_timeout" and events[3].fields["error"]["seq"] == 77


def test_nccl_error_message_over_several_lines_stays_in_the_traceback():
    text = "\n".join(
        [
            "[rank3]: Traceback (most recent call last):",
            '[rank3]:   File "/workspace/train.py", line 268, in train_step',
            "[rank3]:     dist.all_reduce(grad_norm_sq, group=dp_group)",
            "[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp"
            ":317, remote process exited or there was a network error, NCCL version 2.21.5",
            "[rank3]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting"
            " prematurely.",
            "[rank3]: Last error:",
            "[rank3]: NET/IB : Got completion from peer 10.0.0.9<40393> with error 12, opcode 0, len 0, vendor err 129",
        ]
    )
    [event] = parse(text)
    assert event.kind == "traceback" and event.rank == 3 and event.line == text
    error = event.fields["error"]
    assert error["kind"] == "nccl_error" and error["nccl_code"] == "ncclRemoteError"
    assert error["nccl_version"] == "2.21.5"
    assert error["related"][0]["kind"] == "ib_error" and error["related"][0]["status"] == 12
    assert error["related"][0]["peer"] == "10.0.0.9"


def test_megatron_line_with_bracketed_timestamp_and_plain_logging_step_with_rank():
    megatron, plain, nan = parse(
        " [2026-11-22 10:00:00] iteration      100/    1000 | consumed samples:        12800 |"
        " elapsed time per iteration (ms): 1234.5 | lm loss: 2.300000E+00 | loss scale: 1.0 | grad norm: 1.100 |\n"
        "2026-11-22 10:00:01,123 INFO train.py:297 rank=4 step=5 loss=nan grad_norm=1.0000 lr=1.0000e-04 "
        "step_time=0.500s"
    )
    assert megatron.ts == datetime(2026, 11, 22, 10, tzinfo=UTC) and megatron.fields["step"] == 100
    assert megatron.fields["loss"] == 2.3 and megatron.fields["grad_norm"] == 1.1
    assert plain.rank == 4 and plain.fields == {"step": 5, "loss": "nan", "grad_norm": 1.0, "lr": 1e-4}
    assert plain.ts == datetime(2026, 11, 22, 10, 0, 1, 123000, tzinfo=UTC)
    assert nan.kind == "nan_loss" and nan.rank == 4 and nan.fields == {"step": 5, "loss": "nan"}


def test_ib_completion_without_peer_address():
    event = one("NET/IB : Got completion from peer with error 12 (host gpu9)")
    assert event.kind == "ib_error" and event.fields["status"] == 12 and event.fields["peer"] is None


def test_a_launcher_told_to_stop_logs_its_death_signal():
    """torchrun's agent signalled from outside, as recent torch prints it (the enum) and older torch (the number)."""
    events = parse(
        "W0616 00:37:22.830000 4015698 torch/distributed/elastic/agent/server/api.py:719] Received Signals.SIGTERM"
        " death signal, shutting down workers\n"
        "WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers\n"
    )
    assert kinds(events) == ["elastic_error"] * 2
    assert [e.fields for e in events] == [{"category": "death_signal", "signal": "SIGTERM"}] * 2
    assert all(e.severity == "warning" for e in events)
