"""The poll-act-ack loop every scheduler adapter shares.

Long-poll pending node decisions (evict, cordon, return, reset_gpu), act on each through the backend, then
acknowledge it: `done`, or `failed` with the error. Every `returns_every_s` it also looks at the nodes faultline
holds out of service and reports each one the scheduler has in service again (someone resumed or uncordoned it
after its repair) with one call, POST /api/v1/nodes/NAME/return: faultline then runs the node's return gate
instead of keeping a stale "evicted" on a node that runs work. Actions are idempotent (cordoning a cordoned node
changes nothing), which is what makes the loop safe to restart at any point: an ack the service never
received leaves the decision pending, and the next run simply does the action again and acks it.
While the adapter runs, an ack that fails because the service is down is kept and retried before
anything new is read.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from agents.schedulers import checks
from agents.schedulers.client import NODE_KINDS, AuthFailed, FaultlineClient, GaveUp, Refused
from agents.schedulers.gpus import decision_gpu

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INCOMPLETE = 1  # --once: the service stayed unreachable, or some ack was not delivered
EXIT_AUTH = 3
_REMEMBERED = 10_000  # decision ids finished by this process, so a stale listing does not redo them
_MIN_ROUND_S = 1.0  # a service that ignores `wait` must not turn the loop into a busy poll


class ActionFailed(Exception):
    """The scheduler refused or could not act; the message goes into the `failed` ack."""


class BackendConfigError(Exception):
    """The backend cannot start (a missing client library, no scontrol, no cluster credentials)."""


class Backend(Protocol):
    """What a scheduler must do: both actions idempotent, raising `ActionFailed` with a readable reason."""

    name: str

    def take_out(self, node: str, decision: Mapping[str, Any]) -> str:
        """Stop scheduling on the node (evict, cordon); returns a one-line summary for the ack."""
        ...

    def put_back(self, node: str, decision: Mapping[str, Any]) -> str:
        """Schedule on the node again (return); returns a one-line summary for the ack."""
        ...

    def reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        """Take one GPU of the node out for a reset (reset_gpu), or the node where the scheduler cannot. `gpu` is
        its index, or its PCI bus id ("0000:3b:00.0") when faultline's inventory of the node lacks the index."""
        ...

    def preview_reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        """What reset_gpu would change, exactly (the patch, the command), changing nothing: for --dry-run."""
        ...

    def in_service(self, node: str) -> bool | None:
        """Whether the scheduler would place work on the node now; None when it does not know the node."""
        ...


@dataclass(frozen=True)
class LoopOptions:
    wait_s: float = 30.0
    once: bool = False
    dry_run: bool = False
    strip_domain: bool = False
    # What to poll for; a backend that can also take a node out for a check adds `diagnose`.
    kinds: tuple[str, ...] = NODE_KINDS
    # How often to look for nodes faultline holds out of service that the scheduler has back in service (0: never).
    returns_every_s: float = 30.0


def scheduler_node(name: str, *, strip_domain: bool) -> str:
    """faultline's node name as the scheduler knows it: gpu-01.example.com -> gpu-01 with strip_domain."""
    if not strip_domain:
        return name
    try:
        ipaddress.ip_address(name)
        return name  # an address has no domain to strip
    except ValueError:
        return name.split(".", 1)[0]


def _expired(decision: Mapping[str, Any], now: datetime) -> bool:
    raw = decision.get("expires_at")
    if not raw:
        return False
    try:
        expires = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return False
    return (expires if expires.tzinfo else expires.replace(tzinfo=UTC)) <= now


def _describe(decision: Mapping[str, Any]) -> str:
    return f"decision #{decision['id']} {decision['kind']}"


class AdapterLoop:
    def __init__(
        self,
        client: FaultlineClient,
        backend: Backend,
        options: LoopOptions,
        *,
        stop: threading.Event | None = None,
    ) -> None:
        self.client = client
        self.backend = backend
        self.options = options
        self.stop = stop or client.stop
        self.unacked: list[tuple[int, str, str]] = []  # (decision id, outcome, message) not yet delivered
        self.finished: OrderedDict[int, None] = OrderedDict()
        self.acted = 0
        self.returns_reported = 0
        self._next_sweep = 0.0  # monotonic time of the next look for returns
        self._watching = False  # the last look found nodes held out: poll no longer than the sweep interval

    def run(self) -> int:
        """Until stopped (or one round with --once); returns the process exit code."""
        mode = "dry run, acknowledging nothing" if self.options.dry_run else "acting and acknowledging"
        log.info(
            "%s adapter polling %s for %s decisions (%s)",
            self.backend.name,
            self.client.url,
            "/".join(self.options.kinds),
            mode,
        )
        try:
            if self.options.once:
                self.round()
                self.flush_acks()
                return EXIT_OK
            while not self.stop.is_set():
                self.round()
            return EXIT_OK
        except AuthFailed as exc:
            log.error("%s; stopping", exc)
            return EXIT_AUTH
        except Refused as exc:
            log.error("%s; is --url the faultline service? stopping", exc)
            return EXIT_INCOMPLETE
        except GaveUp as exc:
            if self.stop.is_set():
                return EXIT_OK
            log.error("%s; giving up", exc)
            return EXIT_INCOMPLETE
        finally:
            if self.unacked:
                ids = ", ".join(f"#{i}" for i, _, _ in self.unacked)
                log.warning(
                    "acted on %s but could not acknowledge them; they stay pending and the next run redoes them "
                    "(harmless: the actions are idempotent)",
                    ids,
                )

    def round(self) -> None:
        """Deliver held acks, read what is pending (long poll), act on each decision, acknowledge it."""
        started = time.monotonic()
        self.flush_acks()
        every = self.options.returns_every_s
        if every > 0 and started >= self._next_sweep:
            self._next_sweep = started + every
            self.sweep_returns()
        wait = self.options.wait_s
        if self._watching and every > 0:  # a node is held out: do not sleep through the next look for its return
            wait = min(wait, max(0.0, self._next_sweep - time.monotonic()))
        decisions = self.client.pending(self.options.kinds, wait)
        fresh = [d for d in decisions if int(d["id"]) not in self.finished]
        for decision in fresh:
            if self.stop.is_set():
                return
            self.handle(decision)
            self.flush_acks()
        if not self.options.once and not fresh:
            # Nothing new although the long poll woke us: a service without `wait`, or only decisions we
            # already finished (dry run, expired ones not yet swept). Slow down rather than spin.
            pause = _MIN_ROUND_S if not decisions else max(_MIN_ROUND_S, min(self.options.wait_s, 10.0))
            self.stop.wait(max(0.0, pause - (time.monotonic() - started)))

    def sweep_returns(self, only: Collection[str] | None = None) -> list[str]:
        """Report each node faultline holds out of service (of `only`, if given) that the scheduler has in service
        again; returns those reported. A node the scheduler does not know, or cannot say about, is left alone."""
        try:
            held = self.client.out_of_service()
        except Refused as exc:  # a service without the node API for schedulers: returns stay a person's
            log.warning("cannot list the nodes faultline holds out of service (%s); not watching for returns", exc)
            self._watching = False
            return []
        self._watching = bool(held)
        reported = []
        for name in held:
            if self.stop.is_set():
                break
            if only is not None and name not in only:
                continue
            node = scheduler_node(name, strip_domain=self.options.strip_domain)
            try:
                back = self.backend.in_service(node)
            except ActionFailed as exc:
                log.warning("cannot tell whether %s is in service in %s: %s", node, self.backend.name, exc)
                continue
            except Exception:  # a bug or an unexpected library error: the next sweep tries again
                log.exception("unexpected error reading %s's state in %s", node, self.backend.name)
                continue
            if not back:
                continue
            reason = f"schedulable again in {self.backend.name}"
            if self.options.dry_run:
                log.info("dry run: would report %s back in service (%s)", name, reason)
                continue
            result = self.client.report_return(name, reason)
            if result.delivered:
                self.returns_reported += 1
                reported.append(name)
                log.info("reported %s back in service (%s): faultline runs its return gate", name, reason)
            else:  # e.g. a take-out decision for it still waits on us: the next sweep looks again
                log.info("faultline did not take the return of %s (HTTP %d): %s", name, result.status, result.message)
        return reported

    def handle(self, decision: Mapping[str, Any]) -> None:
        """Act on one decision and queue its ack."""
        decision_id, kind = int(decision["id"]), str(decision["kind"])
        if _expired(decision, datetime.now(UTC)):
            log.info("%s expired at %s; not acting on it", _describe(decision), decision.get("expires_at"))
            self._finish(decision_id)
            return
        if not decision.get("node"):
            self._queue_ack(decision_id, "failed", f"{kind} decision names no node")
            return
        node = scheduler_node(str(decision["node"]), strip_domain=self.options.strip_domain)
        if kind == "reset_gpu":
            self._reset_gpu(decision, node)
            return
        take_out = kind in ("evict", "cordon", "diagnose")
        verb = "take out of service" if take_out else "return to service"
        if self.options.dry_run:
            log.info("dry run: would %s %s node %s (%s)", verb, self.backend.name, node, decision.get("reason", ""))
            self._finish(decision_id)
            return
        try:
            summary = (self.backend.take_out if take_out else self.backend.put_back)(node, decision)
        except ActionFailed as exc:
            log.warning("%s: could not %s %s: %s", _describe(decision), verb, node, exc)
            self._queue_ack(decision_id, "failed", str(exc))
            return
        except Exception as exc:  # a bug or an unexpected library error: report it rather than die
            log.exception("%s: unexpected error acting on %s", _describe(decision), node)
            self._queue_ack(decision_id, "failed", f"{type(exc).__name__}: {exc}")
            return
        self.acted += 1
        self._watching = self._watching or take_out  # the node is held out now: watch for its return
        log.info("%s: %s%s", _describe(decision), summary, checks.note(decision))
        self._queue_ack(decision_id, "done", summary)

    def _reset_gpu(self, decision: Mapping[str, Any], node: str) -> None:
        """One GPU of the node, by index or PCI bus id: the backend marks it (or drains the node where it cannot),
        then the ack."""
        decision_id, gpu = int(decision["id"]), decision_gpu(decision)
        if gpu is None:
            self._queue_ack(
                decision_id, "failed", "reset_gpu decision names no GPU (neither an index nor a PCI bus id)"
            )
            return
        if self.options.dry_run:
            try:
                plan = self.backend.preview_reset_gpu(node, gpu, decision)
            except ActionFailed as exc:
                plan = f"cannot tell what it would do to {node}: {exc}"
            log.info("dry run: %s: %s", _describe(decision), plan)
            self._finish(decision_id)
            return
        try:
            summary = self.backend.reset_gpu(node, gpu, decision)
        except ActionFailed as exc:
            log.warning("%s: could not take GPU %s of %s out: %s", _describe(decision), gpu, node, exc)
            self._queue_ack(decision_id, "failed", str(exc))
            return
        except Exception as exc:  # a bug or an unexpected library error: report it rather than die
            log.exception("%s: unexpected error acting on GPU %s of %s", _describe(decision), gpu, node)
            self._queue_ack(decision_id, "failed", f"{type(exc).__name__}: {exc}")
            return
        self.acted += 1
        log.info("%s: %s%s", _describe(decision), summary, checks.note(decision))
        self._queue_ack(decision_id, "done", summary)

    def flush_acks(self) -> None:
        """Deliver held acks in order, waiting out an outage; raises `GaveUp` if stopped meanwhile."""
        while self.unacked:
            decision_id, outcome, message = self.unacked[0]
            result = self.client.ack(decision_id, outcome, message)  # GaveUp propagates when stopping
            if result.delivered:
                log.info("acknowledged decision #%d: %s", decision_id, outcome)
            else:
                # Final: acked meanwhile by someone else, expired, or no longer pending. Do not retry.
                log.warning(
                    "service refused ack %s of decision #%d (HTTP %d): %s",
                    outcome,
                    decision_id,
                    result.status,
                    result.message,
                )
            self.unacked.pop(0)
            self._finish(decision_id)

    def _queue_ack(self, decision_id: int, outcome: str, message: str) -> None:
        self.unacked.append((decision_id, outcome, message))

    def _finish(self, decision_id: int) -> None:
        self.finished[decision_id] = None
        while len(self.finished) > _REMEMBERED:
            self.finished.popitem(last=False)
