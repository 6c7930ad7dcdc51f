"""Chat message bodies built from delivery payloads: Slack Block Kit, a Lark card, and generic JSON (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ml.demarcation import localizing

Payload = dict[str, Any]

# Events about an incident carry its job, root cause, blame and decisions; the others (a channel's test, a node
# placed in a job before its return gate) carry a title and a summary of their own.
_INCIDENT_EVENTS = frozenset({"opened", "decided", "resolved"})

# Slack's documented limits (api.slack.com/reference/block-kit): blocks per message, characters per field.
SLACK_MAX_BLOCKS = 50
SLACK_MAX_TEXT = 3000
SLACK_MAX_HEADER = 150
SLACK_MAX_FIELD = 2000
SLACK_MAX_BUTTON = 75
# Enough for a notification preview; the blocks carry the rest.
SLACK_MAX_FALLBACK = 1000
# Lark rejects cards over about 30 KB; events beyond this many are summarized in one line.
LARK_MAX_EVENTS = 40

_SEVERITY_RANK = {"critical": 0, "major": 1, "minor": 2}


def render(kind: str, payloads: Sequence[Payload]) -> dict[str, Any]:
    """The body to POST to a channel of this kind for one event or a group of them."""
    if not payloads:
        raise ValueError("nothing to render")
    if kind == "slack":
        return slack_message(collapse(payloads))
    if kind == "lark":
        return lark_message(collapse(payloads))
    if kind == "json":
        return json_message(payloads)
    raise ValueError(f"unknown channel kind {kind!r}")


def json_message(payloads: Sequence[Payload]) -> dict[str, Any]:
    """The generic webhook body: every event's snapshot as recorded."""
    return {"version": "1", "events": list(payloads)}


def collapse(payloads: Sequence[Payload]) -> list[Payload]:
    """For people, one entry per incident: its latest event, naming the earlier ones it absorbs.

    An incident that opened and was decided within one group window reads "opened and decided", once.
    """
    by_incident: dict[Any, Payload] = {}
    for p in payloads:
        key = p.get("incident_id")
        earlier = by_incident.pop(key, None) if key is not None else None
        events = [*(earlier or {}).get("events_seen", []), p.get("event")]
        by_incident[key if key is not None else id(p)] = {**p, "events_seen": events}
    return list(by_incident.values())


# ---- shared wording ----


def title(p: Payload) -> str:
    """One line naming the event: 'Incident #7 opened: gpu_hardware (critical)'."""
    event = p.get("event")
    if event == "test":
        return "faultline test message"
    if event not in _INCIDENT_EVENTS:
        return str(p.get("title") or event)
    seen = [e for i, e in enumerate(p.get("events_seen") or [event]) if e not in (p.get("events_seen") or [])[:i]]
    head = f"Incident #{p.get('incident_id')} {' and '.join(str(e) for e in seen)}"
    cause = p.get("root_cause") or "unknown"
    if event == "opened":
        return f"{head}: {cause} ({p.get('severity') or 'major'})"
    if event == "decided":
        decisions = p.get("decisions") or []
        return f"{head}: {decision_line(decisions[0])}" if decisions else head
    return f"{head}: {cause}"


def decision_line(d: Payload) -> str:
    """'evict gpu-node-017 (pending, 97%)', 'reset GPU 3 on gpu-node-017 (pending, 90%)', or by PCI bus id when
    the node's inventory lacks the index: 'reset GPU 0000:3b:00.0 on gpu-node-017 (pending, 90%)'."""
    target = f" {d['node']}" if d.get("node") else ""
    gpu = d["gpu"] if d.get("gpu") is not None else d.get("gpu_pci")
    what = f"reset GPU {gpu} on" if d.get("kind") == "reset_gpu" and gpu is not None else d.get("kind")
    return f"{what}{target} ({d.get('state')}, {percent(d.get('confidence'))})"


def suspects_line(p: Payload) -> str:
    suspects = p.get("suspects") or []
    if localizing(str(p.get("root_cause") or ""), suspects) and p.get("state") != "resolved":
        return "localizing: the evidence does not yet separate a machine"
    return ", ".join(f"{s.get('node')} ({percent(s.get('confidence'))})" for s in suspects) or "none named"


def decisions_text(p: Payload) -> str:
    return "; ".join(decision_line(d) for d in p.get("decisions") or []) or "none yet"


def percent(value: Any) -> str:
    return f"{float(value) * 100:.0f}%" if isinstance(value, int | float) else "?"


def compact_line(p: Payload) -> str:
    """One event of a digest: title, job, blame, confidence and the decisions."""
    if p.get("event") not in _INCIDENT_EVENTS:
        return title(p)
    return (
        f"{title(p)} · job {p.get('job') or '?'} · {p.get('blame') or 'unknown'} · "
        f"{percent(p.get('confidence'))} · {decisions_text(p)}"
    )


def color(payloads: Sequence[Payload]) -> str:
    """Lark header template: red for a critical opening, orange for decisions, green when all resolved."""
    events = {p.get("event") for p in payloads}
    if events == {"test"}:
        return "blue"
    if events - _INCIDENT_EVENTS - {"test"}:
        return "red"  # a node at work before its gate: someone should look now
    if events == {"resolved"}:
        return "green"
    opened = [p for p in payloads if p.get("event") == "opened"]
    if any(p.get("severity") == "critical" for p in opened):
        return "red"
    if "decided" in events:
        return "orange"
    if opened:
        worst = min((_SEVERITY_RANK.get(p.get("severity") or "major", 1) for p in opened), default=1)
        return ("red", "orange", "yellow")[worst]
    return "grey"


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---- Slack ----


def _esc(text: Any) -> str:
    """Slack mrkdwn treats &, < and > as control characters."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _mrkdwn(text: str, limit: int = SLACK_MAX_TEXT) -> dict[str, str]:
    return {"type": "mrkdwn", "text": clip(text, limit)}


def _button(text: str, url: str, action_id: str) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": clip(text, SLACK_MAX_BUTTON)},
        "url": url,
        "action_id": action_id,
    }


def slack_message(payloads: Sequence[Payload]) -> dict[str, Any]:
    """Block Kit message with a `text` fallback: full detail for one event, a compact digest for several."""
    if len(payloads) == 1:
        p = payloads[0]
        blocks = _slack_single(p)
        fallback = f"{title(p)} · job {p.get('job') or '?'} · {p.get('url') or ''}"
        if p.get("event") not in _INCIDENT_EVENTS:
            fallback = f"{title(p)} · {p.get('url') or ''}"
    else:
        blocks = _slack_digest(payloads)
        fallback = f"faultline: {len(payloads)} incident events · " + "; ".join(title(p) for p in payloads)
    return {"text": clip(fallback, SLACK_MAX_FALLBACK), "blocks": blocks}


def _slack_single(p: Payload) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(title(p), SLACK_MAX_HEADER), "emoji": True}}
    ]
    if p.get("summary"):
        blocks.append({"type": "section", "text": _mrkdwn(_esc(p["summary"]))})
    if p.get("event") in _INCIDENT_EVENTS:
        fields = [
            ("Job", f"`{p.get('job') or '?'}`"),
            ("Root cause", p.get("root_cause") or "unknown"),
            ("Blame", p.get("blame") or "unknown"),
            ("Confidence", percent(p.get("confidence"))),
            ("Suspects", suspects_line(p)),
            ("Decision", decisions_text(p)),
        ]
        blocks.append(
            {
                "type": "section",
                "fields": [_mrkdwn(f"*{name}*\n{_esc(value)}", SLACK_MAX_FIELD) for name, value in fields],
            }
        )
    context = f"faultline · {p.get('event')} · {p.get('time') or ''}"
    if p.get("severity") and p.get("event") in _INCIDENT_EVENTS:
        context += f" · severity {p['severity']}"
    blocks.append({"type": "context", "elements": [_mrkdwn(_esc(context))]})
    if p.get("url"):
        label, action = _link(p)
        blocks.append({"type": "actions", "elements": [_button(label, p["url"], action)]})
    return blocks


def _slack_digest(payloads: Sequence[Payload]) -> list[dict[str, Any]]:
    # header + context + a possible "and N more" line leave the rest of the 50 blocks for events.
    room = SLACK_MAX_BLOCKS - 3
    shown, hidden = payloads[:room], len(payloads) - min(len(payloads), room)
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": f"faultline: {len(payloads)} incident events", "emoji": True},
        }
    ]
    for i, p in enumerate(shown):
        link = f"\n<{p['url']}|Open incident #{p.get('incident_id')}>" if p.get("url") else ""
        # The link goes after the clipped text so a long summary never cuts it off.
        text = clip(_esc(compact_line(p)), SLACK_MAX_TEXT - len(link)) + link
        section: dict[str, Any] = {"type": "section", "text": {"type": "mrkdwn", "text": text}}
        if p.get("url"):
            section["accessory"] = _button("Open", p["url"], f"open_incident_{p.get('incident_id')}_{i}")
        blocks.append(section)
    if hidden:
        blocks.append({"type": "section", "text": _mrkdwn(f"… and {hidden} more events: see faultline.")})
    times = sorted(str(p.get("time")) for p in payloads if p.get("time"))
    span = f"{times[0]} to {times[-1]}" if times else ""
    blocks.append({"type": "context", "elements": [_mrkdwn(_esc(f"faultline · {span}"))]})
    return blocks


# ---- Lark / Feishu ----


def _lark_md(text: str) -> dict[str, str]:
    return {"tag": "lark_md", "content": text}


def lark_message(payloads: Sequence[Payload]) -> dict[str, Any]:
    """An interactive card: header colored by event and severity, lark_md divs, a button to the incident."""
    if len(payloads) == 1:
        p = payloads[0]
        header = title(p)
        elements = _lark_single(p)
    else:
        header = f"faultline: {len(payloads)} incident events"
        elements = _lark_digest(payloads)
    return {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True, "enable_forward": True},
            "header": {"title": {"tag": "plain_text", "content": header}, "template": color(payloads)},
            "elements": elements,
        },
    }


def _lark_single(p: Payload) -> list[dict[str, Any]]:
    elements: list[dict[str, Any]] = []
    if p.get("summary"):
        elements.append({"tag": "div", "text": _lark_md(clip(str(p["summary"]), SLACK_MAX_TEXT))})
    if p.get("event") in _INCIDENT_EVENTS:
        fields = [
            ("Job", p.get("job") or "?"),
            ("Root cause", p.get("root_cause") or "unknown"),
            ("Blame", p.get("blame") or "unknown"),
            ("Confidence", percent(p.get("confidence"))),
            ("Suspects", suspects_line(p)),
            ("Decision", decisions_text(p)),
        ]
        elements.append(
            {
                "tag": "div",
                "fields": [
                    {"is_short": True, "text": _lark_md(f"**{name}**\n{clip(str(value), SLACK_MAX_FIELD)}")}
                    for name, value in fields
                ],
            }
        )
    if p.get("url"):
        label, _ = _link(p)
        elements.append(
            {
                "tag": "action",
                "actions": [
                    {"tag": "button", "text": _lark_md(label), "url": p["url"], "type": "primary", "value": {}}
                ],
            }
        )
    elements.append({"tag": "note", "elements": [{"tag": "plain_text", "content": _note(p)}]})
    return elements


def _lark_digest(payloads: Sequence[Payload]) -> list[dict[str, Any]]:
    elements: list[dict[str, Any]] = []
    for p in payloads[:LARK_MAX_EVENTS]:
        link = f"\n[Open incident #{p.get('incident_id')}]({p['url']})" if p.get("url") else ""
        elements.append({"tag": "div", "text": _lark_md(clip(compact_line(p), SLACK_MAX_TEXT) + link)})
    if len(payloads) > LARK_MAX_EVENTS:
        elements.append({"tag": "div", "text": _lark_md(f"… and {len(payloads) - LARK_MAX_EVENTS} more events")})
    return elements


def _link(p: Payload) -> tuple[str, str]:
    """The button's label and Slack action id: to the incident, the node, or faultline itself."""
    if p.get("event") in _INCIDENT_EVENTS:
        return "Open incident", f"open_incident_{p.get('incident_id')}"
    if p.get("node"):
        return "Open node", f"open_node_{p.get('node')}"
    return "Open faultline", "open_incident_None"


def _note(p: Payload) -> str:
    parts = ["faultline", str(p.get("event")), str(p.get("time") or "")]
    if p.get("severity") and p.get("event") in _INCIDENT_EVENTS:
        parts.append(f"severity {p['severity']}")
    return " · ".join(parts)
