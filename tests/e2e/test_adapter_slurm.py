"""The Slurm adapter against a real faultline API (uvicorn on the test database) and a fake scontrol."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agents.schedulers.slurm import MAX_REASON, drain_reason
from faultline.cli import main
from tests.fakes.decisions import decision_state, make_decision, read_decision, read_node, scheduler_token
from tests.fakes.scontrol import FakeScontrol, fake_scontrol
from tests.procs import api_server, running, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with api_server(log=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


@pytest.fixture
def scontrol(tmp_path: Path) -> FakeScontrol:
    return fake_scontrol(tmp_path / "bin")


def _once(api: str, token: Path, scontrol: FakeScontrol, *extra: str) -> int:
    return main(
        ["adapter", "slurm", "--url", api, "--token-file", str(token), "--scontrol", str(scontrol.path),
         "--once", "--wait", "0", *extra]
    )  # fmt: skip


def test_evict_drains_with_the_exact_scontrol_argv_and_acks_done(
    api: str, committed: Engine, scontrol: FakeScontrol, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    reason = 'Xid 79 "GPU has fallen off the bus"\non GPU 3'
    decision = make_decision(committed, node="gpu-01.cluster.example", reason=reason)

    assert _once(api, token, scontrol, "--strip-domain") == 0

    assert scontrol.calls() == [
        [
            "update",
            "nodename=gpu-01",
            "state=drain",
            f"reason=faultline: evict #{decision}: Xid 79 'GPU has fallen off the bus' on GPU 3",
        ]
    ]
    acked = read_decision(api, token, decision)
    assert (acked["state"], acked["outcome_message"]) == ("done", "drained gpu-01 in Slurm")


def test_return_resumes_and_a_node_already_in_service_counts_as_done(
    api: str, committed: Engine, scontrol: FakeScontrol, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    returned = make_decision(committed, node="gpu-02", kind="return", reason="diagnostics passed")
    assert _once(api, token, scontrol) == 0
    assert scontrol.calls() == [["update", "nodename=gpu-02", "state=resume"]]
    assert read_decision(api, token, returned)["outcome_message"] == "resumed gpu-02 in Slurm"

    # Resuming a node that is not drained: Slurm refuses, and the node is where the decision wants it.
    scontrol.fail_with("slurm_update error: Invalid node state specified\n")
    again = make_decision(committed, node="gpu-02", kind="return", reason="back again")
    assert _once(api, token, scontrol) == 0
    acked = read_decision(api, token, again)
    assert (acked["state"], acked["outcome_message"]) == ("done", "gpu-02 already in service in Slurm")


def test_failing_scontrol_acks_failed_with_its_stderr(
    api: str, committed: Engine, scontrol: FakeScontrol, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    scontrol.fail_with("slurm_update error: Invalid node name specified\n", code=1)
    decision = make_decision(committed, node="gpu-404", kind="cordon", reason="operator: check the PSU")

    assert _once(api, token, scontrol) == 0

    assert scontrol.calls() == [
        ["update", "nodename=gpu-404", "state=drain", f"reason=faultline: cordon #{decision}: operator: check the PSU"]
    ]
    acked = read_decision(api, token, decision)
    assert acked["state"] == "failed"
    assert acked["outcome_message"] == "scontrol exited with 1: slurm_update error: Invalid node name specified"


def test_dry_run_runs_no_scontrol_and_acks_nothing(
    api: str, committed: Engine, scontrol: FakeScontrol, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    decision = make_decision(committed, node="gpu-03")
    assert _once(api, token, scontrol, "--dry-run") == 0
    assert scontrol.calls() == []
    assert read_decision(api, token, decision)["state"] == "pending"


def test_missing_scontrol_is_a_clear_configuration_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("fl_whatever")
    code = main(["adapter", "slurm", "--url", "http://127.0.0.1:9", "--token-file", str(token),
                 "--scontrol", str(tmp_path / "no-such-scontrol"), "--once"])  # fmt: skip
    assert code == 2
    assert "scontrol not found" in capsys.readouterr().err


def test_the_adapter_process_finds_scontrol_on_path_and_acts_on_new_decisions(
    api: str, committed: Engine, scontrol: FakeScontrol, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    env = {"PATH": f"{scontrol.path.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = tmp_path / "adapter.log"
    args = ["faultline", "adapter", "slurm", "--url", api, "--token-file", str(token), "--wait", "10"]
    with running(args, env=env, log=log) as adapter:
        wait_for(lambda: "polling" in log.read_text(), what="the adapter")
        decision = make_decision(committed, node="gpu-04", reason="NCCL watchdog timeout, rank 12 stuck")
        wait_for(lambda: decision_state(committed, decision) == "done", timeout=30, what="the ack")
        assert adapter.poll() is None
    assert scontrol.calls() == [
        ["update", "nodename=gpu-04", "state=drain", f"reason=faultline: evict #{decision}: NCCL watchdog timeout, "
         "rank 12 stuck"]
    ]  # fmt: skip


def test_drain_reason_is_one_line_truncated_and_quote_safe() -> None:
    reason = drain_reason({"id": 7, "kind": "evict", "reason": '"quoted"\t' + "x" * 500})
    assert reason.startswith("faultline: evict #7: 'quoted' xxx")
    assert len(reason) == MAX_REASON and reason.endswith("...")
    assert '"' not in reason and "\n" not in reason and "\t" not in reason
    assert drain_reason({"id": 8, "kind": "cordon", "reason": ""}) == "faultline: cordon #8"


def test_a_node_resumed_after_its_repair_is_reported_back_and_its_gate_runs(
    api: str, committed: Engine, scontrol: FakeScontrol, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    decision = make_decision(committed, node="gpu-05", reason="Xid 79 on GPU 3")
    assert _once(api, token, scontrol) == 0  # drained; the ack makes it evicted
    assert read_node(api, token, "gpu-05")["state"] == "evicted"
    assert _once(api, token, scontrol) == 0  # still drained: nothing to report
    assert read_node(api, token, "gpu-05")["state"] == "evicted"

    scontrol.set_state("gpu-05", "IDLE")  # repaired, and an admin ran `scontrol update nodename=gpu-05 state=resume`
    assert _once(api, token, scontrol) == 0
    node = read_node(api, token, "gpu-05")
    assert node["state"] == "returning"
    assert (node["history"][0]["kind"], node["history"][0]["source"]) == ("return_reported", "scheduler")
    assert node["history"][0]["reason"].startswith("schedulable again in Slurm")
    assert scontrol.updates() == [
        ["update", "nodename=gpu-05", "state=drain", f"reason=faultline: evict #{decision}: Xid 79 on GPU 3"]
    ]
