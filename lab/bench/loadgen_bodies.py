"""The load generator's request bodies: agent-shaped batches rendered from per-node templates, where only the
batch id, the sample times and the step lines change from one send to the next."""

from __future__ import annotations

import itertools
import math
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from lab.bench.loadgen_protocol import LoadConfig
from lab.bench.synthetic import SyntheticNode, process_every, sample_times

# Bodies per node: a first one carrying the GPU inventory, as a starting agent sends, then a cycle that
# rotates (process snapshots in as many of them as an agent sends them), so stored values vary.
MIN_TEMPLATE_VARIANTS = 3
_LOGS_MARKER = "@@faultline-loadgen-logs@@"


@dataclass(frozen=True)
class _Template:
    """A request body split at its variable parts: `slots[i]` is the value that goes after `segments[i]`."""

    segments: list[bytes]
    slots: list[int]

    @classmethod
    def of(cls, body: bytes, markers: dict[bytes, int]) -> _Template:
        """Split `body` at every marker; slot 0 (the batch id) must appear exactly once."""
        pattern = b"(" + b"|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)) + b")"
        parts = re.split(pattern, body)
        slots = [markers[m] for m in parts[1::2]]
        if slots.count(0) != 1:
            raise ValueError("the batch id must appear exactly once in a batch")
        return cls(parts[0::2], slots)

    def render(self, values: Sequence[bytes]) -> bytes:
        segments = self.segments
        out = [segments[0]]
        for i, slot in enumerate(self.slots, 1):
            out.append(values[slot])
            out.append(segments[i])
        return b"".join(out)


def _batch_ids() -> Iterator[bytes]:
    """Unique UUIDs (version 4 layout): a random per-run prefix and a counter, cheaper than uuid4()."""
    prefix = uuid.uuid4().hex[:20]
    for n in itertools.count():
        yield f"{prefix[:8]}-{prefix[8:12]}-4{prefix[13:16]}-a{prefix[17:20]}-{n:012x}".encode()


_BATCH_IDS = _batch_ids()


def _iso(epoch: float) -> bytes:
    return datetime.fromtimestamp(epoch, UTC).isoformat().encode()


class NodeBodies:
    """One node's request bodies: agent-shaped; a fresh batch id, sample times and step lines for every send.

    Slots: 0 the batch id, 1..n the times of the batch's n samples (oldest first; the last is the send
    time, which also stamps the batch and its process snapshots), n+1 the step lines (a JSON array).
    """

    def __init__(self, node: SyntheticNode, config: LoadConfig, *, start: datetime) -> None:
        self.samples = config.samples_per_batch
        self.sample_interval = config.sample_interval
        every = process_every(config.ship_interval)
        variants = every * math.ceil(MIN_TEMPLATE_VARIANTS / every)
        templates = [
            self._template(node, start + timedelta(seconds=k * config.ship_interval)) for k in range(variants + 1)
        ]
        self.first, self.rotating = templates[0], templates[1:]
        self.sends = 0

    def _template(self, node: SyntheticNode, now: datetime) -> _Template:
        batch = node.batch(now, interval=self.sample_interval, samples=self.samples, logs=_LOGS_MARKER)
        markers = {batch["batch_id"].encode(): 0, orjson.dumps(_LOGS_MARKER): self.samples + 1}
        for k, ts in enumerate(sample_times(now, interval=self.sample_interval, samples=self.samples)):
            markers[ts.isoformat().encode()] = 1 + k
        return _Template.of(orjson.dumps(batch), markers)

    def next_body(self, now: float, logs: bytes = b"[]") -> bytes:
        """The next body, its samples taken up to `now` (epoch seconds)."""
        template = self.first if self.sends == 0 else self.rotating[(self.sends - 1) % len(self.rotating)]
        self.sends += 1
        n, step = self.samples, self.sample_interval
        values = [next(_BATCH_IDS), *(_iso(now - (n - 1 - k) * step) for k in range(n)), logs]
        return template.render(values)

    def take_over(self, previous: NodeBodies) -> NodeBodies:
        """Continue where `previous` left off (a fault switches a node's bodies mid-run)."""
        self.sends = max(previous.sends, 1)
        return self
