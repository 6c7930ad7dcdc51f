"""The Kubernetes adapter against a real faultline API (uvicorn on the test database) and a fake Kubernetes API.

Decisions are written straight into the database; the adapter reads them over HTTP, acts on the fake
cluster, and acknowledges; outcomes are read back through the API.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from faultline.cli import main
from service.embedded import free_port
from tests.fakes.decisions import decision_state, make_decision, read_decision, read_node, scheduler_token
from tests.fakes.kube import FakeKube, fake_kube
from tests.procs import api_server, running, wait_api, wait_for

pytestmark = pytest.mark.slow

TAINT = "faultline.io/faulty"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with api_server(log=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with fake_kube() as fake:
        yield fake


def _once(api: str, token: Path, kube: FakeKube, *extra: str) -> int:
    return main(
        ["adapter", "kubernetes", "--url", api, "--token-file", str(token), "--kube-api", kube.url,
         "--once", "--wait", "0", *extra]
    )  # fmt: skip


def _ours(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints", []) if t["key"] == TAINT]


def test_evict_cordons_taints_once_sets_the_condition_and_acks_done(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-01", taints=[GPU_TAINT])
    first = make_decision(committed, node="gpu-01.cluster.example", reason='Xid 79 "fallen off the bus" on GPU 3')

    assert _once(api, token, kube, "--strip-domain") == 0

    node = kube.node("gpu-01")
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [GPU_TAINT, {"key": TAINT, "value": str(first), "effect": "NoSchedule"}]
    condition = kube.condition("gpu-01", "FaultlineFaulty")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "FaultlineEvict")
    assert condition["message"] == 'Xid 79 "fallen off the bus" on GPU 3'
    assert condition["lastTransitionTime"] and condition["lastHeartbeatTime"]
    assert kube.condition("gpu-01", "Ready")["status"] == "True"  # the kubelet's condition is left alone
    status_patch = next(r for r in kube.patches() if r["path"].endswith("/status"))
    assert status_patch["content_type"] == "application/strategic-merge-patch+json"
    acked = read_decision(api, token, first)
    assert (acked["state"], acked["outcome"]) == ("done", "done")
    assert "cordoned gpu-01" in acked["outcome_message"]

    # A second eviction of the same node (another incident) keeps the one taint, naming the decision that
    # took the node out; the condition carries the newer reason.
    second = make_decision(committed, node="gpu-01.cluster.example", reason="ECC row remap failure")
    assert _once(api, token, kube, "--strip-domain") == 0
    assert kube.node("gpu-01")["spec"]["taints"] == [
        GPU_TAINT,
        {"key": TAINT, "value": str(first), "effect": "NoSchedule"},
    ]
    assert len([r for r in kube.patches() if not r["path"].endswith("/status")]) == 1  # the spec was already right
    again = kube.condition("gpu-01", "FaultlineFaulty")
    assert again["message"] == "ECC row remap failure"
    assert again["lastTransitionTime"] == condition["lastTransitionTime"]  # still True: no transition
    acked = read_decision(api, token, second)
    assert (acked["state"], acked["outcome_message"]) == (
        "done",
        f"gpu-01 already cordoned in Kubernetes, taint {TAINT}={first}:NoSchedule",
    )


def test_return_uncordons_and_removes_only_our_taint(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node(
        "gpu-02", taints=[GPU_TAINT, {"key": TAINT, "value": "3", "effect": "NoSchedule"}], unschedulable=True
    )
    cordon = make_decision(committed, node="gpu-03", kind="cordon", reason="operator: flaky NVLink, check it")
    kube.add_node("gpu-03")
    returned = make_decision(committed, node="gpu-02", kind="return", reason="diagnostics passed")

    assert _once(api, token, kube, "--taint-effect", "NoExecute") == 0

    node = kube.node("gpu-02")
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == [GPU_TAINT]
    condition = kube.condition("gpu-02", "FaultlineFaulty")
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "FaultlineReturned",
        "diagnostics passed",
    )
    assert read_decision(api, token, returned)["state"] == "done"
    # The operator's cordon, in the same round, with the configured effect and its own reason.
    assert _ours(kube.node("gpu-03")) == [{"key": TAINT, "value": str(cordon), "effect": "NoExecute"}]
    assert kube.condition("gpu-03", "FaultlineFaulty")["reason"] == "FaultlineCordon"
    assert read_decision(api, token, cordon)["state"] == "done"


def test_node_missing_in_kubernetes_is_acked_failed(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    decision = make_decision(committed, node="gpu-99")

    assert _once(api, token, kube) == 0

    acked = read_decision(api, token, decision)
    assert (acked["state"], acked["outcome_message"]) == ("failed", "no such node in Kubernetes")
    assert kube.patches() == []


def test_dry_run_and_job_level_decisions_leave_everything_pending(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-04")
    evict = make_decision(committed, node="gpu-04")
    restart = make_decision(committed, node="gpu-04", kind="restart", reason="restart the job")

    assert _once(api, token, kube, "--dry-run") == 0
    assert kube.patches() == []
    assert read_decision(api, token, evict)["state"] == "pending"

    assert _once(api, token, kube) == 0
    assert read_decision(api, token, evict)["state"] == "done"
    assert read_decision(api, token, restart)["state"] == "pending"  # not the scheduler's to act on


def test_a_refused_token_stops_the_adapter_with_exit_code_3(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-token"
    wrong.write_text("fl_not_a_token")
    assert _once(api, wrong, kube) == 3
    agent_token = scheduler_token(committed, tmp_path, scope="agent")  # valid, but not allowed to read decisions
    assert _once(api, agent_token, kube) == 3


def _adapter_args(url: str, token: Path, kube: FakeKube) -> list[str]:
    return ["faultline", "adapter", "kubernetes", "--url", url, "--token-file", str(token), "--kube-api", kube.url,
            "--wait", "5"]  # fmt: skip


def test_survives_the_service_being_down_then_acts_within_seconds(
    committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-05")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "adapter.log"
    with running(_adapter_args(url, token, kube), log=log) as adapter:
        wait_for(lambda: "unavailable" in log.read_text(), what="the adapter to notice the outage")
        assert adapter.poll() is None, log.read_text()
        with running(["faultline", "serve", "--port", str(port)], log=tmp_path / "api.log"):
            wait_api(url)
            decision = make_decision(committed, node="gpu-05")
            wait_for(lambda: decision_state(committed, decision) == "done", timeout=30, what="the ack")
            assert kube.node("gpu-05")["spec"]["unschedulable"] is True
            wait_for(lambda: "reachable again" in log.read_text(), what="the recovery line")
            text = log.read_text()
            assert text.count("unavailable") == 1, text  # one line per outage, not one per retry
        assert adapter.poll() is None


def test_service_dies_between_action_and_ack_then_the_ack_is_delivered(
    committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-06", taints=[GPU_TAINT])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["faultline", "serve", "--port", str(port)]
    log = tmp_path / "adapter.log"
    with running(serve, log=tmp_path / "api-1.log") as api:
        wait_api(url)

        def kill_api(_method: str, path: str) -> None:
            if path.endswith("/status") and api.poll() is None:
                api.send_signal(signal.SIGKILL)  # the action is done; the ack will find nobody
                api.wait()

        kube.after_patch = kill_api
        with running(_adapter_args(url, token, kube), log=log) as adapter:
            decision = make_decision(committed, node="gpu-06")
            wait_for(lambda: api.poll() is not None, what="the action")
            wait_for(lambda: "unavailable" in log.read_text(), what="the failed ack")
            assert decision_state(committed, decision) == "pending"
            with running(serve, log=tmp_path / "api-2.log"):
                wait_api(url)
                wait_for(lambda: decision_state(committed, decision) == "done", timeout=30, what="the held ack")
            assert adapter.poll() is None
    assert _ours(kube.node("gpu-06")) == [{"key": TAINT, "value": str(decision), "effect": "NoSchedule"}]


def test_adapter_killed_before_its_ack_redoes_the_action_harmlessly(
    committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-07", taints=[GPU_TAINT])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["faultline", "serve", "--port", str(port)]
    with running(serve, log=tmp_path / "api-1.log") as api:
        wait_api(url)
        with running(_adapter_args(url, token, kube), log=tmp_path / "adapter-1.log") as adapter:

            def kill_both(_method: str, path: str) -> None:
                if path.endswith("/status") and adapter.poll() is None:
                    api.send_signal(signal.SIGKILL)
                    adapter.send_signal(signal.SIGKILL)  # acted, never acked, and gone
                    api.wait()
                    adapter.wait()

            kube.after_patch = kill_both
            decision = make_decision(committed, node="gpu-07")
            wait_for(lambda: adapter.poll() is not None, what="the action")
    kube.after_patch = None
    assert decision_state(committed, decision) == "pending"
    with running(serve, log=tmp_path / "api-2.log"):
        wait_api(url)
        with running(_adapter_args(url, token, kube), log=tmp_path / "adapter-2.log"):
            wait_for(lambda: decision_state(committed, decision) == "done", timeout=30, what="the redone action's ack")
    spec_patches = [r for r in kube.patches() if not r["path"].endswith("/status")]
    status_patches = [r for r in kube.patches() if r["path"].endswith("/status")]
    assert (len(spec_patches), len(status_patches)) == (1, 2)  # redone: the spec was already right
    node = kube.node("gpu-07")
    assert node["spec"]["taints"] == [GPU_TAINT, {"key": TAINT, "value": str(decision), "effect": "NoSchedule"}]


def test_a_node_uncordoned_after_its_repair_is_reported_back_once_our_taint_is_gone(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-06", taints=[GPU_TAINT])
    make_decision(committed, node="gpu-06", reason="Xid 79 on GPU 3")
    assert _once(api, token, kube) == 0
    assert read_node(api, token, "gpu-06")["state"] == "evicted"

    with kube.lock:  # `kubectl uncordon gpu-06`: schedulable, but our NoSchedule taint still keeps pods off
        kube.nodes["gpu-06"]["spec"]["unschedulable"] = False
    assert _once(api, token, kube) == 0
    assert read_node(api, token, "gpu-06")["state"] == "evicted"

    with kube.lock:  # `kubectl taint nodes gpu-06 faultline.io/faulty-`
        kube.nodes["gpu-06"]["spec"]["taints"] = [GPU_TAINT]
    assert _once(api, token, kube) == 0
    node = read_node(api, token, "gpu-06")
    assert node["state"] == "returning"
    assert (node["history"][0]["kind"], node["history"][0]["source"]) == ("return_reported", "scheduler")
    assert node["history"][0]["reason"].startswith("schedulable again in Kubernetes")
