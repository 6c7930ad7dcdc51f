"""The simulator's runner in a thread of the test's own process (as `faultline sim` runs it), for the end-to-end
tests that drive a simulated cluster against a real API."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from lab.sim.config import SimConfig
from lab.sim.runner import SimRunner


class Lines:
    """A text sink that keeps the runner's lines."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def write(self, text: str) -> int:
        self.lines += [t for t in text.splitlines() if t]
        return len(text)

    def flush(self) -> None:
        pass


@contextmanager
def sim_running(config: SimConfig) -> Iterator[tuple[SimRunner, list[str]]]:
    """The runner started, and the lines it prints so far; stopped and joined on the way out, and (when the body
    ended normally) asserted to have stopped."""
    lines: list[str] = []
    stop = threading.Event()
    runner = SimRunner(config, stop=stop, out=Lines(lines))
    thread = threading.Thread(target=runner.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    try:
        yield runner, lines
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive(), "the simulator's runner did not stop within 60 s"
