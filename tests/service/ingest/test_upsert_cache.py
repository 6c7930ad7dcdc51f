"""The ingest upsert cache skips repeated facts, forgets rolled-back writes, and expires."""

from __future__ import annotations

import pytest

from service.ingest.service import UpsertCache


def test_repeated_fact_is_written_once_per_ttl(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("service.ingest.service.time.monotonic", lambda: now[0])
    cache = UpsertCache(ttl=60)
    key, placement = ("rank", 1, 0), (7, 0, 0, 4242)
    assert cache.needs_write(key, placement)
    cache.stage(key, placement)
    cache.commit()
    assert not cache.needs_write(key, placement)
    assert cache.needs_write(key, (8, 0, 0, 4242)), "a moved rank must be written"
    now[0] += 61
    assert cache.needs_write(key, placement), "entries expire so other processes' writes get corrected"


def test_rolled_back_write_is_not_remembered():
    cache = UpsertCache()
    cache.stage(("gpu", 1, 0), ("GPU-1", None, None))
    cache.rollback()
    cache.commit()
    assert cache.needs_write(("gpu", 1, 0), ("GPU-1", None, None))


@pytest.mark.parametrize("known", [("GPU-1", "0000:3b:00.0", "H100"), (None, None, None)])
def test_partial_value_does_not_overwrite_a_known_one(known):
    cache = UpsertCache()
    cache.stage(("gpu", 1, 0), known)
    cache.commit()
    assert not cache.needs_write(("gpu", 1, 0), (None, None, None), partial=True)
    assert cache.needs_write(("gpu", 1, 0), ("GPU-2", None, None)) is (known != ("GPU-2", None, None))
