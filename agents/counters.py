"""Cumulative counters as the agent ships them: unwrapped across 32/64-bit wrap, honest about resets and saturation.

Kernel counters come in three kinds. Wrapping ones (Ethernet statistics, ethtool stats, IB extended data
counters, mlx5 hw_counters) run up to 2**32 or 2**64 and start again at 0: the agent keeps the last raw
value and an offset and ships raw + offset, so the service sees one ever-growing number. Saturating ones
(the IB PortCounters fields: symbol_error is 16 bits, link_downed 8, port_xmit_wait 32) stop at their
maximum and stay there until cleared: an increase past it is invisible, so the agent notes the saturation
once and never invents one. A drop that no wrap explains (a driver reload, `perfquery -R`) is a reset: the
new raw value is shipped as it is and the service, which computes increases itself, treats the decrease as
a reset.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Widths a wrapping counter of unknown width is tried at, narrowest first.
_WIDTHS = (32, 64)


@dataclass(slots=True)
class _State:
    raw: int
    offset: int = 0
    saturated: bool = False


class CounterTracker:
    """Last raw value and wrap offset of every (subject, name) counter the agent ships."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, str], _State] = {}
        self.saturated: set[tuple[str, str]] = set()  # counters stuck at their maximum, for tests and logs

    def wrapping(self, subject: str, name: str, raw: int, bits: int | None = None) -> int:
        """The unwrapped value of a counter that wraps at 2**bits (None: 32 or 64, whichever the values fit)."""
        key = (subject, name)
        state = self._states.get(key)
        if state is None:
            self._states[key] = _State(raw)
            return raw
        if raw < state.raw:
            wrap = _wrap_span(state.raw, raw, bits)
            if wrap is None:
                log.info("%s %s went from %d to %d: counter reset", subject, name, state.raw, raw)
                state.offset = 0
            else:
                state.offset += wrap
        state.raw = raw
        return raw + state.offset

    def saturating(self, subject: str, name: str, raw: int, bits: int) -> int:
        """The value of a counter that stops at 2**bits - 1: shipped as read; saturation is noted once."""
        key = (subject, name)
        top = (1 << bits) - 1
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _State(raw)
        elif raw < state.raw:
            log.info("%s %s went from %d to %d: counter cleared", subject, name, state.raw, raw)
        state.raw = raw
        if raw >= top and not state.saturated:
            log.warning(
                "%s %s is saturated at %d: further errors are invisible until the counter is cleared",
                subject,
                name,
                raw,
            )
            self.saturated.add(key)
        elif raw < top and state.saturated:
            self.saturated.discard(key)
        state.saturated = raw >= top
        return raw

    def forget(self, subject: str) -> None:
        """A subject that went away (a hot-removed device): its next appearance starts afresh."""
        for key in [k for k in self._states if k[0] == subject]:
            del self._states[key]
            self.saturated.discard(key)


def _wrap_span(last: int, raw: int, bits: int | None) -> int | None:
    """2**bits if a wrap explains the drop from `last` to `raw`, else None (a reset).

    A wrap is believed when the increase it implies is under half the counter's range: the counter was near
    its top and is now near the bottom. Anything else, such as a counter at 1,000 that reads 5, is a reset."""
    for width in (bits,) if bits is not None else _WIDTHS:
        span = 1 << width
        # A counter sitting exactly at its top was more likely saturated (then cleared) than about to wrap.
        if last < span - 1 and raw < span and span - last + raw < span // 2:
            return span
    return None
