"""A reset_gpu decision as people read it: the decisions list and card, the approve flash, and chat messages."""

from __future__ import annotations

import re

from service.notify import formats
from tests import rows


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


def test_the_decisions_list_says_which_gpu_on_which_node(ui, session) -> None:
    job, node = rows.job(session), rows.node(session, "node-x")
    incident = rows.incident(session, job=job, suspects=[node.name])
    reset = rows.decision(session, incident=incident, node=node, kind="reset_gpu", gpu=3, reason="reset GPU 3: Xid 119")
    evict = rows.decision(session, incident=rows.incident(session, job=job, suspects=[node.name], root_cause="nvlink"),
                          node=node, kind="evict", state="awaiting_approval")  # fmt: skip

    page = _text(ui.get("/decisions", params={"node": "node-x"}).text)
    assert f"#{reset.id} reset GPU 3 on node-x" in page
    assert f"#{evict.id} evict node-x" in page
    assert "reset_gpu node-x" not in page

    filtered = _text(ui.get("/decisions", params={"kind": "reset_gpu"}).text)
    assert f"#{reset.id} reset GPU 3 on node-x" in filtered and f"#{evict.id} evict" not in filtered


def test_approving_a_reset_flashes_the_gpu(ui, session) -> None:
    job, node = rows.job(session), rows.node(session, "node-y")
    incident = rows.incident(session, job=job, suspects=[node.name])
    reset = rows.decision(session, incident=incident, node=node, kind="reset_gpu", gpu=5, state="awaiting_approval")
    response = ui.post(f"/decisions/{reset.id}/approve", {"return_to": "/decisions"}, htmx=True)
    assert response.status_code == 200, response.text
    assert f"Decision {reset.id} approved: reset GPU 5 on node-y is now pending." in _text(response.text)


def test_chat_messages_name_the_gpu() -> None:
    decision = {"id": 12, "kind": "reset_gpu", "node": "gpu-node-017", "gpu": 3, "state": "pending", "confidence": 0.9}
    assert formats.decision_line(decision) == "reset GPU 3 on gpu-node-017 (pending, 90%)"
    assert formats.decision_line({**decision, "kind": "evict", "gpu": None}) == "evict gpu-node-017 (pending, 90%)"
    payload = {"event": "decided", "incident_id": 7, "root_cause": "gpu_hardware", "decisions": [decision]}
    assert formats.title(payload) == "Incident #7 decided: reset GPU 3 on gpu-node-017 (pending, 90%)"
    slack = formats.render("slack", [payload])
    assert "reset GPU 3 on gpu-node-017" in slack["text"]


def test_a_reset_by_pci_bus_id_names_the_gpu_by_it_in_the_list_the_flash_and_chat(ui, session) -> None:
    job, node = rows.job(session), rows.node(session, "node-z")
    incident = rows.incident(session, job=job, suspects=[node.name])
    reason = "reset GPU 0000:3b:00.0 on node-z (not in its GPU inventory: addressed by PCI bus id): Xid 119"
    reset = rows.decision(session, incident=incident, node=node, kind="reset_gpu", gpu_pci="0000:3b:00.0",
                          reason=reason, state="awaiting_approval")  # fmt: skip
    assert reset.gpu is None

    page = _text(ui.get("/decisions", params={"node": "node-z"}).text)
    assert f"#{reset.id} reset GPU 0000:3b:00.0 on node-z" in page and "reset_gpu node-z" not in page
    response = ui.post(f"/decisions/{reset.id}/approve", {"return_to": "/decisions"}, htmx=True)
    assert response.status_code == 200, response.text
    assert f"Decision {reset.id} approved: reset GPU 0000:3b:00.0 on node-z is now pending." in _text(response.text)

    line = {"kind": "reset_gpu", "node": "node-z", "gpu": None, "gpu_pci": "0000:3b:00.0", "state": "pending",
            "confidence": 0.9}  # fmt: skip
    assert formats.decision_line(line) == "reset GPU 0000:3b:00.0 on node-z (pending, 90%)"
