"""reset_gpu through both scheduler adapters, against a real faultline API (uvicorn on the test database), a fake
Kubernetes API and a fake scontrol: what each does, what its dry run says it would do, and the acks; for a GPU
named by index and for one named by PCI bus id (a node faultline has no GPU inventory of)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agents.schedulers.kubernetes import GPU_ANNOTATION, GPU_LABEL
from faultline.cli import main
from tests.fakes.decisions import make_decision, read_decision, scheduler_token
from tests.fakes.kube import FakeKube, fake_kube
from tests.fakes.scontrol import FakeScontrol, fake_scontrol
from tests.procs import api_server

pytestmark = pytest.mark.slow

REASON = "reset GPU 3 on gpu-01: Xid 119 (GSP RPC timeout) on gpu-01 GPU 0000:5d:00"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with api_server(log=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with fake_kube() as fake:
        yield fake


def _kube_once(api: str, token: Path, kube: FakeKube, *extra: str) -> int:
    return main(
        ["adapter", "kubernetes", "--url", api, "--token-file", str(token), "--kube-api", kube.url,
         "--once", "--wait", "0", *extra]
    )  # fmt: skip


def _slurm_once(api: str, token: Path, scontrol: FakeScontrol, *extra: str) -> int:
    return main(
        ["adapter", "slurm", "--url", api, "--token-file", str(token), "--scontrol", str(scontrol.path),
         "--once", "--wait", "0", *extra]
    )  # fmt: skip


def test_kubernetes_marks_only_that_gpu_keeps_the_node_schedulable_and_return_clears_it(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-01")
    first = make_decision(committed, node="gpu-01", kind="reset_gpu", gpu=3, reason=REASON)
    assert read_decision(api, token, first)["gpu"] == 3

    assert _kube_once(api, token, kube) == 0

    node = kube.node("gpu-01")
    assert node["metadata"]["labels"][GPU_LABEL] == "3"
    assert node["metadata"]["annotations"][GPU_ANNOTATION] == "3"
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
    acked = read_decision(api, token, first)
    assert (acked["state"], acked["outcome_message"]) == (
        "done",
        f"marked GPU 3 of gpu-01 unhealthy in Kubernetes for a reset, label {GPU_LABEL}=3",
    )

    # A second GPU of the same node joins the list; the first stays marked.
    second = make_decision(committed, node="gpu-01", kind="reset_gpu", gpu=5, reason="reset GPU 5 on gpu-01")
    assert _kube_once(api, token, kube) == 0
    node = kube.node("gpu-01")
    assert (node["metadata"]["labels"][GPU_LABEL], node["metadata"]["annotations"][GPU_ANNOTATION]) == ("3.5", "3,5")
    assert read_decision(api, token, second)["state"] == "done"

    # Back to service: the marks go with the taint.
    returned = make_decision(committed, node="gpu-01", kind="return", reason="GPUs reset, diagnostics passed")
    assert _kube_once(api, token, kube) == 0
    node = kube.node("gpu-01")
    assert GPU_LABEL not in node["metadata"]["labels"] and GPU_ANNOTATION not in node["metadata"].get("annotations", {})
    assert read_decision(api, token, returned)["outcome_message"] == (
        f"uncordoned gpu-01 in Kubernetes, taint faultline.io/faulty and label {GPU_LABEL} removed"
    )


def test_kubernetes_dry_run_prints_the_exact_patch_and_writes_nothing(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-02")
    decision = make_decision(committed, node="gpu-02", kind="reset_gpu", gpu=3, reason=REASON)

    with caplog.at_level(logging.INFO, logger="agents.schedulers.loop"):
        assert _kube_once(api, token, kube, "--dry-run") == 0

    assert kube.patches() == []
    assert read_decision(api, token, decision)["state"] == "pending"
    patch = {"metadata": {"annotations": {GPU_ANNOTATION: "3"}, "labels": {GPU_LABEL: "3"}, "resourceVersion": "1"}}
    assert (
        f"dry run: decision #{decision} reset_gpu: would PATCH /api/v1/nodes/gpu-02 (strategic merge): "
        f"{json.dumps(patch, sort_keys=True)}"
    ) in caplog.messages


def test_slurm_drains_the_node_naming_the_gpu_and_its_dry_run_prints_the_command(
    api: str, committed: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = scheduler_token(committed, tmp_path)
    scontrol = fake_scontrol(tmp_path / "bin")
    decision = make_decision(committed, node="gpu-03", kind="reset_gpu", gpu=3, reason="reset GPU 3 on gpu-03: Xid 119")
    reason = f"reason=faultline: reset_gpu #{decision}: reset GPU 3 on gpu-03: Xid 119"

    with caplog.at_level(logging.INFO, logger="agents.schedulers.loop"):
        assert _slurm_once(api, token, scontrol, "--dry-run") == 0
    assert scontrol.calls() == []
    assert read_decision(api, token, decision)["state"] == "pending"
    command = f"{scontrol.path} update nodename=gpu-03 state=drain '{reason}'"
    assert (
        f"dry run: decision #{decision} reset_gpu: would drain gpu-03 for a reset of GPU 3: {command}; "
        "then on gpu-03: nvidia-smi -r -i 3"
    ) in caplog.messages

    assert _slurm_once(api, token, scontrol) == 0
    assert scontrol.calls() == [["update", "nodename=gpu-03", "state=drain", reason]]
    acked = read_decision(api, token, decision)
    assert (acked["state"], acked["outcome_message"]) == (
        "done",
        "drained gpu-03 in Slurm for a reset of GPU 3 (Slurm cannot drain one GPU of a node); "
        "reset it there with nvidia-smi -r -i 3",
    )


PCI_REASON = (
    "reset GPU 0000:3b:00.0 on gpu-04 (not in its GPU inventory: addressed by PCI bus id): Xid 119 (GSP RPC timeout) "
    "on gpu-04 GPU 0000:3b:00"
)


def test_kubernetes_marks_a_gpu_named_by_pci_bus_id_beside_one_named_by_index(
    api: str, committed: Engine, kube: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = scheduler_token(committed, tmp_path)
    kube.add_node("gpu-04")
    by_pci = make_decision(committed, node="gpu-04", kind="reset_gpu", gpu_pci="0000:3b:00.0", reason=PCI_REASON)
    shown = read_decision(api, token, by_pci)
    assert (shown["gpu"], shown["gpu_pci"]) == (None, "0000:3b:00.0")

    # The dry run shows the patch: label values allow no ':' (and '.' separates the list), the annotation has it whole.
    with caplog.at_level(logging.INFO, logger="agents.schedulers.loop"):
        assert _kube_once(api, token, kube, "--dry-run") == 0
    assert kube.patches() == []
    patch = {
        "metadata": {
            "annotations": {GPU_ANNOTATION: "0000:3b:00.0"},
            "labels": {GPU_LABEL: "0000-3b-00-0"},
            "resourceVersion": "1",
        }
    }
    assert (
        f"dry run: decision #{by_pci} reset_gpu: would PATCH /api/v1/nodes/gpu-04 (strategic merge): "
        f"{json.dumps(patch, sort_keys=True)}"
    ) in caplog.messages

    assert _kube_once(api, token, kube) == 0
    node = kube.node("gpu-04")
    assert node["metadata"]["labels"][GPU_LABEL] == "0000-3b-00-0"
    assert node["metadata"]["annotations"][GPU_ANNOTATION] == "0000:3b:00.0"
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
    acked = read_decision(api, token, by_pci)
    assert (acked["state"], acked["outcome_message"]) == (
        "done",
        f"marked GPU 0000:3b:00.0 of gpu-04 unhealthy in Kubernetes for a reset, label {GPU_LABEL}=0000-3b-00-0",
    )

    # An index joins the list, first; the return clears both.
    by_index = make_decision(committed, node="gpu-04", kind="reset_gpu", gpu=5, reason="reset GPU 5 on gpu-04")
    assert _kube_once(api, token, kube) == 0
    node = kube.node("gpu-04")
    assert (node["metadata"]["labels"][GPU_LABEL], node["metadata"]["annotations"][GPU_ANNOTATION]) == (
        "5.0000-3b-00-0",
        "5,0000:3b:00.0",
    )
    assert read_decision(api, token, by_index)["state"] == "done"
    make_decision(committed, node="gpu-04", kind="return", reason="GPUs reset")
    assert _kube_once(api, token, kube) == 0
    node = kube.node("gpu-04")
    assert GPU_LABEL not in node["metadata"]["labels"] and GPU_ANNOTATION not in node["metadata"].get("annotations", {})


def test_slurm_drains_for_a_gpu_named_by_pci_bus_id_and_gives_the_reset_by_bus_id(
    api: str, committed: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = scheduler_token(committed, tmp_path)
    scontrol = fake_scontrol(tmp_path / "bin")
    decision = make_decision(
        committed,
        node="gpu-05",
        kind="reset_gpu",
        gpu_pci="0000:3b:00.0",
        reason="reset GPU 0000:3b:00.0 on gpu-05: Xid 119",
    )
    reason = f"reason=faultline: reset_gpu #{decision}: reset GPU 0000:3b:00.0 on gpu-05: Xid 119"

    with caplog.at_level(logging.INFO, logger="agents.schedulers.loop"):
        assert _slurm_once(api, token, scontrol, "--dry-run") == 0
    assert scontrol.calls() == []
    command = f"{scontrol.path} update nodename=gpu-05 state=drain '{reason}'"
    assert (
        f"dry run: decision #{decision} reset_gpu: would drain gpu-05 for a reset of GPU 0000:3b:00.0: {command}; "
        "then on gpu-05: nvidia-smi -r -i 00000000:3B:00.0"
    ) in caplog.messages

    assert _slurm_once(api, token, scontrol) == 0
    assert scontrol.calls() == [["update", "nodename=gpu-05", "state=drain", reason]]
    acked = read_decision(api, token, decision)
    assert (acked["state"], acked["outcome_message"]) == (
        "done",
        "drained gpu-05 in Slurm for a reset of GPU 0000:3b:00.0 (Slurm cannot drain one GPU of a node); "
        "reset it there with nvidia-smi -r -i 00000000:3B:00.0",
    )
