"""`faultline replay`'s reading of log files: kinds guessed, the agent's own parsers, times in order moved to now,
batches on the agent protocol, and clear errors for what cannot be replayed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from agents import replay
from agents.replay.client import Outcome, ReplayClient, batches_of, rank_map
from agents.replay.report import format_outcome
from agents.replay.timeline import MAX_GAP_S, guess_kind, log_text
from faultline.cli import main
from service.ingest.schemas import IngestBatch
from tests import paths

LOGS = paths.FIXTURES / "logs"
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def test_kinds_are_guessed_from_the_lines() -> None:
    assert guess_kind(log_text(LOGS / "xid79_fallen_off_bus_multiline_nvsentinel_155.txt")) == "kernel"
    assert guess_kind(log_text(LOGS / "xid13_xid109_gpud_pr46.txt")) == "kernel"
    # The fabric manager's journal lines (systemd units), read by the kernel/journal parser as the agent reads them.
    assert guess_kind(log_text(LOGS / "fabricmanager_nv_warn_nothing_to_do_2x4090_cubestudio_29.txt")) == "kernel"
    assert guess_kind(log_text(LOGS / "nccl_timeout_internlm_290.txt")) == "training"
    assert guess_kind(log_text(LOGS / "torchtitan_step_lines_pr1287.txt")) == "training"
    scrape = (paths.FIXTURES / "formats" / "dcgm_exporter_metrics_v100_issue250.txt").read_text()
    assert guess_kind(scrape) == "dcgm"


def test_a_corpus_files_header_is_not_replayed(tmp_path: Path) -> None:
    text = log_text(LOGS / "xid79_fallen_off_bus_multiline_nvsentinel_155.txt")
    assert not text.startswith("#") and "# source:" not in text and "NVRM" in text
    plain = tmp_path / "dmesg.txt"
    plain.write_text("# a comment line a user's log happens to start with\nNVRM: Xid (PCI:0000:3b:00): 79, x\n")
    assert log_text(plain).startswith("# a comment")


def test_plan_reads_node_specs_kinds_and_folders(tmp_path: Path) -> None:
    folder = tmp_path / "gpu-b"
    folder.mkdir()
    (folder / "train.log").write_text("step 1\n")
    (folder / "kern.log").write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n" * 3)
    files = replay.plan([f"gpu-a=training:{LOGS / 'xid13_xid109_gpud_pr46.txt'}", f"gpu-b={folder}"])
    assert [(f.node, f.path.name, f.kind) for f in files] == [
        ("gpu-a", "xid13_xid109_gpud_pr46.txt", "training"),  # the prefix wins over the guess
        ("gpu-b", "kern.log", "kernel"),
        ("gpu-b", "train.log", "training"),
    ]
    bare = replay.plan([str(LOGS / "nccl_timeout_ofa_271.txt")])
    assert bare[0].node == "nccl_timeout_ofa_271"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpu a=x.log", "not a node name"),
        ("gpu-a=/nonexistent/dmesg.txt", "no such file"),
    ],
)
def test_plan_refuses_what_cannot_be_replayed(spec: str, message: str) -> None:
    with pytest.raises(replay.ReplayError, match=message):
        replay.plan([spec])


def test_times_keep_their_order_and_spacing_and_end_just_before_now(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics\n"
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics\n"
        # Three days later: the gap is shortened to MAX_GAP_S, the order kept.
        "[Mon Sep  2 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=2917, name=pt_main_thread, Ch 00000008\n"
    )
    loaded = replay.load(replay.plan([f"n1={log}"]), now=NOW)
    times = [e.ts for e in loaded.nodes[0].events]
    assert [e.fields.get("xid") for e in loaded.nodes[0].events] == [13, 13, 109]
    assert times == sorted(times)
    assert times[1] - times[0] == timedelta(seconds=5)
    assert times[2] - times[1] == timedelta(seconds=MAX_GAP_S)
    assert times[-1] == NOW - timedelta(seconds=1)
    assert loaded.span_s == pytest.approx(5 + MAX_GAP_S)


def test_unstamped_lines_follow_the_stamped_line_before_them(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "[rank0]:2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384\n"
        "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[rank0]:2025-06-16 22:31:00,322 - root - INFO - step: 201  loss:  6.1384\n"
    )
    events = replay.load(replay.plan([f"n1=training:{log}"]), now=NOW).nodes[0].events
    kinds = [e.kind for e in events]
    assert kinds[0] == "step" and kinds[-1] == "step" and len(events) >= 3
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    assert events[-1].ts - events[0].ts >= timedelta(seconds=10)


def test_batches_carry_the_logs_the_ranks_and_a_scrapes_inventory(tmp_path: Path) -> None:
    scrape = paths.FIXTURES / "formats" / "dcgm_exporter_metrics_v100_issue250.txt"
    files = replay.plan(
        [
            f"a={LOGS / 'nccl_timeout_internlm_290.txt'},dcgm:{scrape}",
            f"b={LOGS / 'xid79_fallen_off_bus_multiline_nvsentinel_155.txt'}",
        ]
    )
    loaded = replay.load(files, now=NOW)
    ranks = rank_map(loaded.nodes)
    assert {r["node"] for r in ranks} == {"a", "b"}
    assert len({r["rank"] for r in ranks}) == len(ranks)
    for node in loaded.nodes:
        for body in batches_of("job-1", node, now=NOW):
            batch = IngestBatch.model_validate(body)  # the service's own schema accepts it
            assert batch.node == node.node and batch.job_id == "job-1"
    first = batches_of("job-1", loaded.nodes[0], now=NOW)[0]
    assert first["heartbeat"]["gpus"] and first["metrics"], "the scrape's inventory and readings"
    assert first["heartbeat"]["jobs"] == ["job-1"]


def test_the_outcome_reads_like_an_answer() -> None:
    outcome = Outcome(
        "j",
        incidents=[
            {
                "id": 3,
                "root_cause": "gpu_hardware",
                "blame": "infrastructure",
                "severity": "critical",
                "confidence": 0.97,
                "state": "open",
                "summary": "Xid 79 on n1",
                "suspects": [{"node": "n1", "action": "evict", "confidence": 0.97, "reason": "Xid 79"}],
                "findings": [
                    {
                        "detector": "signatures",
                        "category": "gpu_hardware",
                        "role": "cause",
                        "action": "evict",
                        "summary": "Xid 79",
                        "evidence": {"lines": ["NVRM: Xid 79"]},
                    }
                ],
            }
        ],
        decisions=[{"kind": "evict", "node": "n1", "state": "pending", "confidence": 0.97, "reason": "evict n1"}],
        settled=True,
    )
    text = "\n".join(format_outcome(outcome))
    assert "incident #3: gpu_hardware, blame infrastructure" in text
    assert "suspect n1: evict" in text and "| NVRM: Xid 79" in text and "decision evict n1 (pending" in text
    assert outcome.node_decisions("n1") and not outcome.node_decisions("n2")
    assert "still changing" in "\n".join(format_outcome(Outcome("j", settled=False, waited_s=90)))


def test_the_cli_says_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(LOGS / "nccl_timeout_ofa_271.txt")
    assert main(["replay", f"a={log}", "--url", "http://127.0.0.1:9"]) == 2
    assert "--token" in capsys.readouterr().err
    assert (
        main(["replay", "a=/nonexistent.log", "--url", "http://127.0.0.1:9", "--token", "t", "--agent-token", "a"]) == 2
    )
    assert "no such file" in capsys.readouterr().err
    code = main(["replay", f"a={log}", "--url", "http://127.0.0.1:9", "--token", "t", "--agent-token", "a"])
    assert code == 2 and "did not answer" in capsys.readouterr().err


def _service(marks: list[str | None] | None) -> tuple[httpx.MockTransport, list[str]]:
    """A service whose job reports these `diagnosed_at` values in turn (the last one then stays; None: a service
    without the field), with no incident and no decision; the calls it answered, in order."""
    calls: list[str] = []
    given = iter(marks or [])
    last: list[str | None] = [None]

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/api/v1/jobs/j":
            if marks is None:
                return httpx.Response(200, json={"job_id": "j"})
            last[0] = next(given, last[0])
            return httpx.Response(200, json={"job_id": "j", "diagnosed_at": last[0]})
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    return httpx.MockTransport(answer), calls


@pytest.mark.parametrize(
    ("marks", "settled", "job_reads"),
    [
        (["t0", "t0", "t1", "t1", "t2"], True, 5),  # the pass under way (t1), then one begun after the sends (t2)
        ([None, None, "t1", "t2"], True, 4),  # a new job: no pass before the sends
        (["t0", "t1"], False, None),  # only the pass that may have begun before the last batch: never settled
        (None, True, 1),  # an older service without diagnosed_at: a quiet outcome settles it, as before
    ],
)
def test_a_replay_settles_only_once_a_whole_pass_has_read_what_it_sent(
    marks: list[str | None] | None, settled: bool, job_reads: int | None
) -> None:
    transport, calls = _service(marks)
    client = ReplayClient("http://faultline", token="p", agent_token="a", transport=transport)
    outcome = client.wait("j", timeout_s=0.3, min_wait_s=0.0, quiet_s=0.0, poll_s=0.0, sleep=lambda _: None)
    assert outcome.settled is settled
    if job_reads is not None:
        assert calls.count("/api/v1/jobs/j") == job_reads
