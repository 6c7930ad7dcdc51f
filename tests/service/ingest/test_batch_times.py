"""A batch's times are held to the window around the server's clock by one check per batch, not one per item: the
same refusals and the same field names as before, for every timed section."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from pydantic import ValidationError

from service.gc_tuning import YOUNG_THRESHOLD, tune_for_serving
from service.ingest.schemas import IngestBatch
from tests.conftest import bearer, count
from tests.factories import batch

FAR_FUTURE = "2999-01-01T00:00:00Z"
WINDOW = {"time_window": (timedelta(hours=1), timedelta(minutes=5))}


def _errors(payload: dict, context: dict | None = WINDOW) -> list[dict]:
    with pytest.raises(ValidationError) as caught:
        IngestBatch.model_validate_json(orjson.dumps(payload), context=context)
    return caught.value.errors(include_url=False)


@pytest.mark.parametrize("section", ["metrics", "logs", "processes"])
def test_an_implausible_item_time_names_its_section_index_and_field(section: str) -> None:
    payload = batch(gpus=4)
    payload[section][-1]["ts"] = FAR_FUTURE
    errors = _errors(payload)
    last = len(payload[section]) - 1
    assert [e["loc"] for e in errors] == [(section, last, "ts")]
    assert errors[0]["msg"].startswith("Value error, 2999-01-01T00:00:00+00:00 is implausible")


def test_every_implausible_time_is_reported_and_sent_at_too() -> None:
    payload = batch(gpus=3)
    old = (datetime.now(UTC) - timedelta(hours=2)).isoformat()  # outside the 1 h window, inside the default 30 days
    payload["sent_at"] = old
    payload["metrics"][0]["ts"] = old
    payload["metrics"][2]["ts"] = FAR_FUTURE
    payload["node_metrics"] = [{"ts": old, "subject": "host", "fields": {"cpu_util": 1.0}}]
    assert {e["loc"] for e in _errors(payload)} == {
        ("sent_at",),
        ("metrics", 0, "ts"),
        ("metrics", 2, "ts"),
        ("node_metrics", 0, "ts"),
    }
    # Without a context the default window (30 days back) holds: only the far-future sample is refused.
    assert [e["loc"] for e in _errors(payload, context=None)] == [("metrics", 2, "ts")]


def test_times_at_the_edges_of_the_window_are_accepted() -> None:
    payload = batch(gpus=2)
    payload["metrics"][0]["ts"] = (datetime.now(UTC) - timedelta(minutes=59)).isoformat()
    payload["metrics"][1]["ts"] = (datetime.now(UTC) + timedelta(minutes=4)).isoformat()
    parsed = IngestBatch.model_validate_json(orjson.dumps(payload), context=WINDOW)
    assert len(parsed.metrics) == 2


def test_an_implausible_sent_at_is_422_and_stores_nothing(client, session, make_token) -> None:
    payload = batch(gpus=2)
    payload["sent_at"] = FAR_FUTURE
    response = client.post("/api/v1/ingest", json=payload, headers=bearer(make_token("agent")))
    assert response.status_code == 422, response.text
    assert [d["field"] for d in response.json()["details"]] == ["body.sent_at"]
    assert (count(session, "agent_batches"), count(session, "metric_samples")) == (0, 0)


def test_serving_processes_freeze_their_startup_heap_and_collect_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_for_serving()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_times_with_other_utc_offsets_are_judged_as_instants() -> None:
    """A section's earliest and latest times are found across offsets: 3 h ahead on a clock at +03:00 is now."""
    now = datetime.now(UTC)
    east = timezone(timedelta(hours=3))
    payload = batch(gpus=3)
    payload["metrics"][0]["ts"] = now.astimezone(east).isoformat()
    payload["metrics"][1]["ts"] = (now - timedelta(minutes=30)).isoformat()
    payload["metrics"][2]["ts"] = (now + timedelta(minutes=3)).astimezone(timezone(timedelta(hours=-8))).isoformat()
    assert len(IngestBatch.model_validate_json(orjson.dumps(payload), context=WINDOW).metrics) == 3
    # Two hours back, written at +03:00 (so it reads an hour ahead of UTC's wall clock): refused.
    payload["metrics"][1]["ts"] = (now - timedelta(hours=2)).astimezone(east).isoformat()
    assert [e["loc"] for e in _errors(payload)] == [("metrics", 1, "ts")]
