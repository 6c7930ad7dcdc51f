"""reset_gpu decisions in the adapters, on plain data: a GPU named by index or by PCI bus id, the shared loop's
handling of each, and the Kubernetes marks for both."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
import orjson
import pytest

from agents.schedulers.client import FaultlineClient
from agents.schedulers.gpus import bus_id, decision_gpu, label_token, nvidia_smi_id, reset_command
from agents.schedulers.kubernetes import GPU_ANNOTATION, GPU_LABEL, gpu_marks_patch
from agents.schedulers.loop import AdapterLoop, LoopOptions


def test_a_bus_id_is_taken_only_in_a_bus_ids_form() -> None:
    assert bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert bus_id(" 0001:db:1f.7 ") == "0001:db:1f.7"
    for bad in ("0000:3b:00", "3b:00.0", "0000:3b:00.8", "0000:3b:00.0; reboot", "GPU-3", "", None, 3):
        assert bus_id(bad) is None, bad


def test_a_decision_names_its_gpu_by_index_else_by_bus_id() -> None:
    assert decision_gpu({"gpu": 3, "gpu_pci": None}) == 3
    assert decision_gpu({"gpu": 0}) == 0
    assert decision_gpu({"gpu": None, "gpu_pci": "0000:3b:00.0"}) == "0000:3b:00.0"
    assert decision_gpu({"gpu": 2, "gpu_pci": "0000:3b:00.0"}) == 2  # the index wins
    for bad in ({}, {"gpu": -1}, {"gpu": True}, {"gpu": "3"}, {"gpu": None, "gpu_pci": "3b:00"}):
        assert decision_gpu(bad) is None, bad


def test_the_reset_command_and_the_label_token_for_each_form() -> None:
    assert (nvidia_smi_id(3), reset_command(3)) == ("3", "nvidia-smi -r -i 3")
    assert nvidia_smi_id("0000:3b:00.0") == "00000000:3B:00.0"
    assert reset_command("0000:3b:00.0") == "nvidia-smi -r -i 00000000:3B:00.0"
    assert (label_token(3), label_token("0000:3b:00.0")) == ("3", "0000-3b-00-0")


def _node(annotation: str | None = None, label: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": "7", "labels": {}, "annotations": {}}
    if annotation is not None:
        metadata["annotations"][GPU_ANNOTATION] = annotation
    if label is not None:
        metadata["labels"][GPU_LABEL] = label
    return {"metadata": metadata}


def test_kubernetes_marks_bus_ids_after_indexes_and_label_values_stay_valid() -> None:
    patch, gpus = gpu_marks_patch(_node("5"), add="0000:3b:00.0")
    assert gpus == [5, "0000:3b:00.0"]
    assert patch == {
        "metadata": {
            "resourceVersion": "7",
            "labels": {GPU_LABEL: "5.0000-3b-00-0"},
            "annotations": {GPU_ANNOTATION: "5,0000:3b:00.0"},
        }
    }
    # Marked already (as the label and annotation say): nothing to write.
    assert gpu_marks_patch(_node("5,0000:3b:00.0", "5.0000-3b-00-0"), add="0000:3b:00.0") == (
        None,
        [5, "0000:3b:00.0"],
    )
    # Indexes before bus ids, each in order; what is neither is dropped.
    _, gpus = gpu_marks_patch(_node("0000:5d:00.0,junk,7,0000:3b:00.0"), add=2)
    assert gpus == [2, 7, "0000:3b:00.0", "0000:5d:00.0"]


def test_kubernetes_label_keeps_the_marks_that_fit_and_the_annotation_every_one() -> None:
    ids = [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A)]
    patch, gpus = gpu_marks_patch(_node(",".join(ids[:4])), add=ids[4])
    assert patch is not None and gpus == ids
    label = patch["metadata"]["labels"][GPU_LABEL]
    assert label == "0000-18-00-0.0000-2a-00-0.0000-3a-00-0.0000-5d-00-0" and len(label) <= 63
    assert patch["metadata"]["annotations"][GPU_ANNOTATION] == ",".join(ids)


class _Backend:
    name = "Fake"

    def __init__(self) -> None:
        self.resets: list[tuple[str, int | str]] = []

    def reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        self.resets.append((node, gpu))
        return f"reset {gpu} of {node}"

    def preview_reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        return f"would reset {gpu} of {node}"


def _run(decisions: list[dict[str, Any]], *, dry_run: bool = False) -> tuple[_Backend, dict[int, dict[str, Any]]]:
    acks: dict[int, dict[str, Any]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            decision_id = int(request.url.path.split("/")[-2])
            acks[decision_id] = orjson.loads(request.content)
            return httpx.Response(200, json={"id": decision_id})
        return httpx.Response(200, json={"items": [d for d in decisions if d["id"] not in acks], "next_cursor": None})

    client = FaultlineClient("http://faultline.test", "fl_token", transport=httpx.MockTransport(handler))
    backend = _Backend()
    options = LoopOptions(wait_s=0, once=True, dry_run=dry_run, returns_every_s=0)
    assert AdapterLoop(client, backend, options).run() == 0
    return backend, acks


def _reset(decision_id: int, **gpu: Any) -> dict[str, Any]:
    return {"id": decision_id, "kind": "reset_gpu", "node": "gpu-01", "state": "pending", "reason": "r",
            "expires_at": None, "gpu": None, "gpu_pci": None, **gpu}  # fmt: skip


def test_the_loop_passes_on_a_gpu_named_by_index_or_by_bus_id_and_fails_one_named_by_neither() -> None:
    backend, acks = _run([_reset(1, gpu=3), _reset(2, gpu_pci="0000:3b:00.0"), _reset(3), _reset(4, gpu_pci="3b")])
    assert backend.resets == [("gpu-01", 3), ("gpu-01", "0000:3b:00.0")]
    assert acks[1] == {"outcome": "done", "message": "reset 3 of gpu-01"}
    assert acks[2] == {"outcome": "done", "message": "reset 0000:3b:00.0 of gpu-01"}
    failed = {"outcome": "failed", "message": "reset_gpu decision names no GPU (neither an index nor a PCI bus id)"}
    assert acks[3] == acks[4] == failed


def test_the_dry_run_previews_a_reset_by_bus_id_and_acknowledges_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agents.schedulers.loop"):
        backend, acks = _run([_reset(5, gpu_pci="0000:3b:00.0")], dry_run=True)
    assert backend.resets == [] and acks == {}
    assert "dry run: decision #5 reset_gpu: would reset 0000:3b:00.0 of gpu-01" in caplog.messages
