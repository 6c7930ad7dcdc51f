"""Chat message bodies (Slack Block Kit, Lark card, generic JSON) and the sender's pure helpers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from service.config import get_settings
from service.notify import formats, sender
from tests import paths

FIXTURES = paths.FIXTURES / "formats"
SLACK_SAMPLES = json.loads((FIXTURES / "slack_incoming_webhook_samples.json").read_text())
LARK_SAMPLES = json.loads((FIXTURES / "lark_feishu_bot_webhook_samples.json").read_text())


def payload(incident_id: int = 7, *, event: str = "opened", severity: str = "critical", **extra: Any) -> dict[str, Any]:
    p = {
        "event": event,
        "event_key": f"incident:{incident_id}:{event}",
        "time": "2026-11-22T10:00:03+00:00",
        "incident_id": incident_id,
        "job": "llm-pretrain-42",
        "state": "open",
        "root_cause": "gpu_hardware",
        "blame": "infrastructure",
        "severity": severity,
        "confidence": 0.97,
        "summary": "Xid 79 (GPU has fallen off the bus) on gpu-node-017 GPU 3",
        "suspects": [{"node": "gpu-node-017", "confidence": 0.97, "action": "evict", "reason": "Xid 79"}],
        "decisions": [
            {"id": 12, "kind": "evict", "node": "gpu-node-017", "state": "pending", "confidence": 0.97, "reason": "x"}
        ],
        "url": f"https://faultline.example.com/incidents/{incident_id}",
    }
    p.update(extra)
    return p


def texts(block: dict[str, Any]) -> list[str]:
    """Every text string inside a Slack block."""
    found: list[str] = []
    if isinstance(block.get("text"), dict):
        found.append(block["text"]["text"])
    for item in block.get("fields", []) + block.get("elements", []):
        found.extend(texts(item) if "type" in item and item["type"] not in ("mrkdwn", "plain_text") else [item["text"]])
    if "accessory" in block:
        found.extend(texts(block["accessory"]))
    return found


def test_slack_single_event_has_fallback_fields_and_a_button_to_the_incident():
    message = formats.render("slack", [payload()])
    assert "Incident #7 opened" in message["text"]
    types = [b["type"] for b in message["blocks"]]
    assert types == ["header", "section", "section", "context", "actions"]
    fields = {f["text"].split("\n")[0]: f["text"].split("\n", 1)[1] for f in message["blocks"][2]["fields"]}
    assert fields["*Job*"] == "`llm-pretrain-42`"
    assert fields["*Root cause*"] == "gpu_hardware"
    assert fields["*Blame*"] == "infrastructure"
    assert fields["*Confidence*"] == "97%"
    assert fields["*Suspects*"] == "gpu-node-017 (97%)"
    assert fields["*Decision*"] == "evict gpu-node-017 (pending, 97%)"
    button = message["blocks"][4]["elements"][0]
    assert button["text"]["text"] == "Open incident"
    assert button["url"] == "https://faultline.example.com/incidents/7"


def test_slack_blocks_have_the_shape_of_the_documented_sample():
    sample_fields = SLACK_SAMPLES["blocks"]["blocks"][1]["fields"]
    ours = formats.render("slack", [payload()])
    assert set(ours) == set(SLACK_SAMPLES["blocks"])  # text fallback + blocks
    field = ours["blocks"][2]["fields"][0]
    assert set(field) == set(sample_fields[0]) and field["type"] == sample_fields[0]["type"] == "mrkdwn"


def test_slack_escapes_control_characters_in_user_text():
    message = formats.render("slack", [payload(summary="loss <nan> & grad > 1e9")])
    assert message["blocks"][1]["text"]["text"] == "loss &lt;nan&gt; &amp; grad &gt; 1e9"


def test_slack_group_is_one_message_listing_each_incident_with_its_link():
    message = formats.render("slack", [payload(1), payload(2, event="decided"), payload(3, event="resolved")])
    assert message["blocks"][0]["text"]["text"] == "faultline: 3 incident events"
    sections = [b for b in message["blocks"] if b["type"] == "section"]
    assert len(sections) == 3
    for i, section in zip((1, 2, 3), sections, strict=True):
        assert f"<https://faultline.example.com/incidents/{i}|Open incident #{i}>" in section["text"]["text"]
        assert section["accessory"]["url"] == f"https://faultline.example.com/incidents/{i}"
    assert "Incident #2 decided: evict gpu-node-017" in sections[1]["text"]["text"]


def test_slack_limits_hold_for_huge_groups_and_long_text():
    long = "x" * 10_000
    message = formats.render("slack", [payload(i, summary=long, root_cause=long) for i in range(200)])
    assert len(message["blocks"]) <= formats.SLACK_MAX_BLOCKS
    assert "… and 153 more events" in message["blocks"][-2]["text"]["text"]
    for block in message["blocks"]:
        for text in texts(block):
            assert len(text) <= formats.SLACK_MAX_TEXT
    # A clipped event still ends with its link.
    assert message["blocks"][1]["text"]["text"].endswith("|Open incident #0>")
    single = formats.render("slack", [payload(summary=long, root_cause=long)])
    assert len(single["blocks"][0]["text"]["text"]) <= formats.SLACK_MAX_HEADER
    for block in single["blocks"]:
        for text in texts(block):
            assert len(text) <= formats.SLACK_MAX_TEXT
    assert len(single["text"]) <= formats.SLACK_MAX_FALLBACK


@pytest.mark.parametrize(
    ("events", "template"),
    [
        ([payload(severity="critical")], "red"),
        ([payload(severity="major")], "orange"),
        ([payload(severity="minor")], "yellow"),
        ([payload(event="decided")], "orange"),
        ([payload(event="resolved")], "green"),
        ([payload(1, event="resolved"), payload(2, severity="critical")], "red"),
    ],
)
def test_lark_header_color_follows_event_and_severity(events, template):
    assert formats.render("lark", events)["card"]["header"]["template"] == template


def test_lark_card_has_the_shape_of_the_documented_sample():
    sample = LARK_SAMPLES["interactive_card"]
    ours = formats.render("lark", [payload()])
    assert ours["msg_type"] == sample["msg_type"] == "interactive"
    assert set(ours["card"]) == set(sample["card"])
    assert ours["card"]["header"]["title"] == {
        "tag": "plain_text",
        "content": "Incident #7 opened: gpu_hardware (critical)",
    }
    elements = {e["tag"]: e for e in ours["card"]["elements"] if e["tag"] != "div"} | {
        "fields": next(e for e in ours["card"]["elements"] if "fields" in e)
    }
    sample_action = next(e for e in sample["card"]["elements"] if e["tag"] == "action")
    ours_button = elements["action"]["actions"][0]
    assert set(ours_button) == set(sample_action["actions"][0])
    assert ours_button["url"] == "https://faultline.example.com/incidents/7"
    sample_field = sample["card"]["elements"][0]["fields"][0]
    assert set(elements["fields"]["fields"][0]) == set(sample_field)
    assert elements["fields"]["fields"][0]["text"]["tag"] == "lark_md"
    assert elements["fields"]["fields"][0]["text"]["content"] == "**Job**\nllm-pretrain-42"


def test_lark_group_lists_each_incident_with_a_link():
    card = formats.render("lark", [payload(1), payload(2)])["card"]
    assert card["header"]["title"]["content"] == "faultline: 2 incident events"
    contents = [e["text"]["content"] for e in card["elements"]]
    assert len(contents) == 2
    assert "[Open incident #2](https://faultline.example.com/incidents/2)" in contents[1]


def test_json_message_carries_every_snapshot_as_recorded():
    events = [payload(1), payload(2)]
    assert formats.render("json", events) == {"version": "1", "events": events}


def test_test_message_renders_for_every_kind():
    test = {"event": "test", "time": "t", "summary": "Channel a is set up", "url": "https://f.example/incidents"}
    slack = formats.render("slack", [test])
    assert slack["blocks"][0]["text"]["text"] == "faultline test message"
    assert formats.render("lark", [test])["card"]["header"]["template"] == "blue"
    with pytest.raises(ValueError, match="unknown channel kind"):
        formats.render("teams", [test])


# ---- the sender's pure helpers ----


def test_mask_url_keeps_scheme_host_and_last_four_characters():
    url = "https://hooks.slack.com/services/T0123456789/B1001010101/7IsoQTrixdUtE971O1xQTm4T"
    assert sender.mask_url(url) == "https://hooks.slack.com/…Tm4T"
    assert sender.mask_url("http://user:pw@127.0.0.1:8080/hook/abcd1234") == "http://127.0.0.1:8080/…1234"
    error = f"ConnectError: cannot reach {url}"
    assert "7IsoQTrixdUtE971O1xQTm4T" not in sender.scrub(error, url)


@pytest.mark.parametrize(
    ("url", "allowed", "problem"),
    [
        ("https://hooks.slack.com/services/x", ["hooks.slack.com"], None),
        ("https://open.larksuite.com/open-apis/bot/v2/hook/x", ["*.larksuite.com"], None),
        ("https://HOOKS.slack.com/x", ["hooks.slack.com"], None),
        ("https://evil.example.com/x", ["hooks.slack.com"], "host 'evil.example.com' is not allowed"),
        ("https://hooks.slack.com.evil.example/x", ["hooks.slack.com"], "is not allowed"),
        ("ftp://hooks.slack.com/x", [], "must start with http:// or https://"),
        ("https:///x", [], "no host"),
        ("http://h:99999999/x", [], "not a valid URL"),
    ],
)
def test_url_problem(url, allowed, problem):
    found = sender.url_problem(url, allowed_hosts=allowed)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def response(status: int, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    return httpx.Response(status, content=content, headers=headers or {})


@pytest.mark.parametrize(
    ("kind", "answer", "ok", "retryable"),
    [
        ("slack", response(200, b"ok"), True, False),
        ("slack", response(500, b"oops"), False, True),
        ("slack", response(503), False, True),
        ("slack", response(404, b"no_service"), False, False),
        ("slack", response(400, b"invalid_payload"), False, False),
        ("slack", response(301, headers={"Location": "https://elsewhere/"}), False, False),
        ("json", response(204), True, False),
        ("lark", response(200, {"code": 0, "msg": "success", "data": {}}), True, False),
        ("lark", response(200, {"StatusCode": 0, "StatusMessage": "success"}), True, False),
        (
            "lark",
            response(200, {"code": 19021, "msg": "sign match fail"}),
            False,
            False,
        ),
        ("lark", response(200, {"code": 9499, "msg": "too many request"}), False, True),
        ("lark", response(200, {"code": 11232, "msg": "frequency limited"}), False, True),
    ],
)
def test_classify(kind, answer, ok, retryable):
    outcome = sender.classify(kind, answer)
    assert (outcome.ok, outcome.retryable) == (ok, retryable)
    if not ok:
        assert outcome.error


def test_classify_429_honours_retry_after():
    outcome = sender.classify("slack", response(429, b"rate_limited", {"Retry-After": "30"}))
    assert outcome.retryable and outcome.retry_after_s == 30
    assert sender.retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0  # a date in the past: now
    assert sender.retry_after("soon") is None


def test_backoff_doubles_with_jitter_and_is_capped():
    settings = get_settings().model_copy(update={"webhook_retry_base_s": 2.0, "webhook_retry_max_s": 60.0})
    assert 1.6 <= sender.backoff_s(1, settings=settings) <= 2.4
    assert 6.4 <= sender.backoff_s(3, settings=settings) <= 9.6
    assert 48 <= sender.backoff_s(30, settings=settings) <= 72


def test_message_key_is_the_same_for_the_same_group():
    assert sender.message_key([3, 1, 2]) == sender.message_key([1, 2, 3]) != sender.message_key([1, 2])


def test_an_incident_opened_and_decided_in_one_window_is_one_entry_for_people_and_two_events_for_machines():
    opened, decided = payload(7, event="opened"), payload(7, event="decided")
    slack = formats.render("slack", [opened, decided])
    assert slack["blocks"][0]["text"]["text"].startswith("Incident #7 opened and decided: evict")
    assert slack["blocks"][-1]["type"] == "actions"  # a single incident's full message, not a digest
    lark = formats.render("lark", [opened, decided])
    assert lark["card"]["header"]["title"]["content"].startswith("Incident #7 opened and decided")
    assert [e["event"] for e in formats.render("json", [opened, decided])["events"]] == ["opened", "decided"]
    two = formats.render("slack", [opened, payload(8, event="opened")])
    assert two["blocks"][0]["text"]["text"] == "faultline: 2 incident events"


def test_a_stall_no_machine_explains_yet_is_announced_as_localizing() -> None:
    stall = payload(root_cause="straggler", suspects=[], decisions=[])
    assert formats.suspects_line(stall) == "localizing: the evidence does not yet separate a machine"
    assert formats.suspects_line(payload(root_cause="user_code", suspects=[])) == "none named"
    assert formats.suspects_line(payload(root_cause="straggler", suspects=[], state="resolved")) == "none named"
    slack = json.dumps(formats.render("slack", [stall]))
    assert "localizing" in slack
