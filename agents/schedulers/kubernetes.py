"""Kubernetes backend: cordon and taint a faulty node, mark it with a node condition; undo on return; mark one
GPU of a node for a reset.

evict / cordon / diagnose: `spec.unschedulable = true`, taint `faultline.io/faulty=<decision id>:<effect>` (one,
never duplicated; other taints kept), and condition `FaultlineFaulty=True` (reason FaultlineEvict or
FaultlineCordon; FaultlineChecksRunning for a diagnose, whose node runs the stop-time checks, and
FaultlineChecksFailed for the eviction their failure made; message = the decision's reason) through the status
subresource.
return: `spec.unschedulable = false`, our taint removed (only ours), condition `FaultlineFaulty=False`
with reason FaultlineReturned (FaultlineChecksPassed when the node's checks passed); the GPU marks below removed.
in service? (the loop asks this of the nodes faultline holds out, to report the ones someone put back):
schedulable (`kubectl uncordon`) and without our taint.
reset_gpu: the node stays schedulable; one GPU is marked on the Node object, by faultline's own convention:
  label      `faultline.io/unhealthy-gpus=3` (indexes joined by "." as label values allow no comma: "3.5"),
  annotation `faultline.io/unhealthy-gpus: "3,5"` (the same list, comma-separated).
  A decision that names its GPU by PCI bus id (`gpu_pci`: faultline has no GPU inventory of the node, so no
  index) is marked by that id: as is in the annotation ("3,0000:3b:00.0"), and in the label, whose values allow
  neither ':' nor (our separator) '.', with both written '-' ("3.0000-3b-00-0"). Indexes come first, then bus ids.
  A label value holds 63 characters (every index, at least four bus ids): the label lists the marks that fit,
  the annotation every one.
  No taint: a taint is node-wide (NoSchedule would cost the other seven GPUs). Workloads that need every GPU of
  a node select `faultline.io/unhealthy-gpus DoesNotExist`; a node-local remediation DaemonSet selects the
  label, resets the GPU (`nvidia-smi -r -i 3`, `nvidia-smi -r -i 0000:3b:00.0` for a bus id, or DCGM) and
  removes it. Neither the NVIDIA device plugin nor the GPU Operator reads these marks: the device plugin takes no
  per-GPU input from the API (its own health check already withdraws a GPU from `nvidia.com/gpu` on a critical
  Xid from NVML), and the operator's `nvidia.com/gpu.deploy.*` labels switch whole components off for the whole
  node.

Uses the official client (`pip install 'faultline[kubernetes]'`), imported only when this backend starts.
Spec changes carry the node's resourceVersion, so a concurrent writer (another controller editing taints)
makes the API answer 409 instead of one of us losing the other's change; we then re-read and retry.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from agents.schedulers.checks import checks_state
from agents.schedulers.gpus import bus_id, label_token
from agents.schedulers.loop import ActionFailed, BackendConfigError

TAINT_KEY = "faultline.io/faulty"
CONDITION_TYPE = "FaultlineFaulty"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
GPU_LABEL = "faultline.io/unhealthy-gpus"
GPU_ANNOTATION = "faultline.io/unhealthy-gpus"
_LABEL_MAX = 63  # characters in a label value
Mark = int | str  # a GPU marked unhealthy: its index, or its PCI bus id ("0000:3b:00.0")
_TRANSIENT_STATUS = {409, 429, 500, 502, 503, 504}  # 409: our resourceVersion was stale; re-read and retry
_ATTEMPTS = 5
_NO_SUCH_NODE = "no such node in Kubernetes"
T = TypeVar("T")


@dataclass(frozen=True)
class KubeOptions:
    api_url: str | None = None  # e.g. http://127.0.0.1:8001 from `kubectl proxy`; no credentials sent
    kubeconfig: Path | None = None
    context: str | None = None
    in_cluster: bool = False
    taint_effect: str = "NoSchedule"
    request_timeout_s: float = 10.0


def _import_client() -> ModuleType:
    try:
        return importlib.import_module("kubernetes")
    except ImportError as exc:
        raise BackendConfigError(
            f"the Kubernetes adapter needs the official client ({exc.name} is missing): "
            "pip install 'faultline[kubernetes]'"
        ) from exc


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc3339(value: Any) -> str:
    """A time read back through the client (an ISO string, maybe +00:00) in the API's own Z form."""
    text = str(value)
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class KubernetesBackend:
    name = "Kubernetes"

    def __init__(self, options: KubeOptions) -> None:
        if options.taint_effect not in TAINT_EFFECTS:
            raise BackendConfigError(f"taint effect must be one of {', '.join(TAINT_EFFECTS)}")
        self.options = options
        kubernetes = _import_client()
        self._client = kubernetes.client
        configuration = kubernetes.client.Configuration()
        try:
            if options.api_url:
                configuration.host = options.api_url.rstrip("/")
            elif options.in_cluster or (not options.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST")):
                kubernetes.config.load_incluster_config(client_configuration=configuration)
            else:
                kubernetes.config.load_kube_config(
                    config_file=str(options.kubeconfig) if options.kubeconfig else None,
                    context=options.context,
                    client_configuration=configuration,
                )
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise BackendConfigError(f"no Kubernetes credentials: {exc}") from exc
        self.api_client = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.where = configuration.host

    # -- actions -----------------------------------------------------------------------------------

    def take_out(self, node: str, decision: Mapping[str, Any]) -> str:
        """Cordon, taint once, condition FaultlineFaulty=True."""
        ours = {"key": TAINT_KEY, "value": str(decision["id"]), "effect": self.options.taint_effect}
        current, changed = self._retrying(lambda: self._set_spec(node, unschedulable=True, taint=ours))
        reason = _CONDITION_REASON.get(checks_state(decision) or "", "")
        reason = reason or ("FaultlineEvict" if decision.get("kind") == "evict" else "FaultlineCordon")
        self._retrying(lambda: self._set_condition(node, current, "True", reason, str(decision.get("reason") or "")))
        held = next(t for t in current["spec"]["taints"] if t.get("key") == TAINT_KEY)
        taint = f"taint {TAINT_KEY}={held.get('value', '')}:{held['effect']}"
        return (
            f"cordoned {node} in Kubernetes, {taint}" if changed else f"{node} already cordoned in Kubernetes, {taint}"
        )

    def put_back(self, node: str, decision: Mapping[str, Any]) -> str:
        """Uncordon, remove our taint (only ours), condition FaultlineFaulty=False."""
        current, changed = self._retrying(lambda: self._set_spec(node, unschedulable=False, taint=None))
        message = str(decision.get("reason") or "returned to service")
        reason = "FaultlineChecksPassed" if checks_state(decision) == "passed" else "FaultlineReturned"
        self._retrying(lambda: self._set_condition(node, current, "False", reason, message))
        if self._clear_gpu_marks(node):
            return f"uncordoned {node} in Kubernetes, taint {TAINT_KEY} and label {GPU_LABEL} removed"
        if not changed:
            return f"{node} already schedulable in Kubernetes, without taint {TAINT_KEY}"
        return f"uncordoned {node} in Kubernetes, taint {TAINT_KEY} removed"

    def reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        """Mark one GPU unhealthy (label and annotation); the node stays schedulable."""

        def step() -> tuple[dict[str, Any] | None, list[Mark]]:
            patch, gpus = gpu_marks_patch(self._read(node), add=gpu)
            if patch is not None:
                self.core.patch_node(node, patch, _request_timeout=self.options.request_timeout_s)
            return patch, gpus

        patch, gpus = self._retrying(step)
        marks = f"label {GPU_LABEL}={_label_value(gpus)}"
        if patch is None:
            return f"GPU {gpu} of {node} already marked unhealthy in Kubernetes, {marks}"
        return f"marked GPU {gpu} of {node} unhealthy in Kubernetes for a reset, {marks}"

    def preview_reset_gpu(self, node: str, gpu: int | str, decision: Mapping[str, Any]) -> str:
        """The exact strategic merge patch reset_gpu would send now (the node is read, nothing written)."""
        patch, _ = gpu_marks_patch(self._retrying(lambda: self._read(node)), add=gpu)
        if patch is None:
            return f"would patch nothing: GPU {gpu} of {node} is already marked"
        return f"would PATCH /api/v1/nodes/{node} (strategic merge): {json.dumps(patch, sort_keys=True)}"

    def in_service(self, node: str) -> bool | None:
        """Schedulable and without faultline's taint; None for a node this cluster does not have."""
        try:
            current = self._retrying(lambda: self._read(node))
        except ActionFailed as exc:
            if str(exc) == _NO_SUCH_NODE:
                return None
            raise
        spec = current.get("spec") or {}
        return not spec.get("unschedulable") and not any(t.get("key") == TAINT_KEY for t in spec.get("taints") or [])

    # -- steps -------------------------------------------------------------------------------------

    def _clear_gpu_marks(self, node: str) -> bool:
        """A returned node's GPUs were checked with it: our GPU marks go; False when there were none."""

        def step() -> bool:
            patch, _ = gpu_marks_patch(self._read(node), add=None)
            if patch is not None:
                self.core.patch_node(node, patch, _request_timeout=self.options.request_timeout_s)
            return patch is not None

        return self._retrying(step)

    def _read(self, node: str) -> dict[str, Any]:
        found = self.core.read_node(node, _request_timeout=self.options.request_timeout_s)
        return self.api_client.sanitize_for_serialization(found)

    def _set_spec(self, node: str, *, unschedulable: bool, taint: dict[str, str] | None) -> tuple[dict[str, Any], bool]:
        """Bring spec.unschedulable and our taint to the wanted state; returns the node, and whether it changed."""
        current = self._read(node)
        spec = current.get("spec") or {}
        existing = list(spec.get("taints") or [])
        taints = [t for t in existing if t.get("key") != TAINT_KEY]
        if taint is not None:
            # A node already out keeps the taint it has, in place (it names the decision that took it out,
            # and for NoExecute carries the timeAdded that tolerationSeconds count from): never doubled.
            same = next((t for t in existing if t.get("key") == TAINT_KEY and t.get("effect") == taint["effect"]), None)
            taints = [t for t in existing if t.get("key") != TAINT_KEY or t is same] if same else [*taints, taint]
        if bool(spec.get("unschedulable")) == unschedulable and existing == taints:
            return current, False  # already so: write nothing
        # Taints have no merge key, so a strategic merge patch replaces the whole list: hence the
        # resourceVersion precondition, which turns a concurrent change into a 409 and a retry.
        patch = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "spec": {"unschedulable": unschedulable, "taints": taints},
        }
        patched = self.core.patch_node(node, patch, _request_timeout=self.options.request_timeout_s)
        return self.api_client.sanitize_for_serialization(patched), True

    def _set_condition(self, node: str, current: dict[str, Any], status: str, reason: str, message: str) -> None:
        now = _now()
        previous = next(
            (c for c in (current.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION_TYPE),
            None,
        )
        # The transition time moves only when the status does, as Kubernetes' own conditions behave.
        changed = previous is None or previous.get("status") != status
        condition = {
            "type": CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "lastHeartbeatTime": now,
            "lastTransitionTime": now if changed else _rfc3339(previous.get("lastTransitionTime") or now),
        }
        # Conditions merge by `type` under a strategic merge patch: the kubelet's own are left alone.
        self.core.patch_node_status(
            node, {"status": {"conditions": [condition]}}, _request_timeout=self.options.request_timeout_s
        )

    def _retrying(self, step: Callable[[], T]) -> T:
        """Run a step, retrying transient API errors briefly; anything else fails the decision."""
        api_exception = self._client.ApiException

        def transient(exc: BaseException) -> bool:
            if isinstance(exc, api_exception):
                return exc.status in _TRANSIENT_STATUS or exc.status == 0
            return isinstance(exc, OSError) or type(exc).__module__.startswith("urllib3")

        try:
            for attempt in Retrying(
                retry=retry_if_exception(transient),
                stop=stop_after_attempt(_ATTEMPTS),
                wait=wait_random_exponential(multiplier=0.3, max=3),
                reraise=True,
            ):
                with attempt:
                    return step()
        except api_exception as exc:
            if exc.status == 404:
                raise ActionFailed(_NO_SUCH_NODE) from exc
            raise ActionFailed(f"Kubernetes API at {self.where}: HTTP {exc.status} {_api_message(exc)}") from exc
        except Exception as exc:
            if transient(exc):
                raise ActionFailed(f"Kubernetes API at {self.where} unreachable: {exc}") from exc
            raise
        raise AssertionError("unreachable")  # Retrying either returns or raises


# The node condition's reason for a decision about the stop-time checks (agents/schedulers/checks.py).
_CONDITION_REASON = {"running": "FaultlineChecksRunning", "failed": "FaultlineChecksFailed"}


def _label_value(gpus: list[Mark]) -> str:
    """The marks joined by '.', as many as a label value holds (whole ones: the annotation keeps the rest)."""
    value = ""
    for token in map(label_token, gpus):
        joined = f"{value}.{token}" if value else token
        if len(joined) > _LABEL_MAX:
            break
        value = joined
    return value


def _marked(annotation: str) -> set[Mark]:
    """The GPUs an annotation marks: indexes and PCI bus ids; anything else is dropped on the next write."""
    marks: set[Mark] = set()
    for token in (t.strip() for t in annotation.split(",")):
        if token.isdigit():
            marks.add(int(token))
        elif (pci := bus_id(token)) is not None:
            marks.add(pci)
    return marks


def _order(mark: Mark) -> tuple[int, int, str]:
    return (0, mark, "") if isinstance(mark, int) else (1, 0, mark)


def gpu_marks_patch(current: Mapping[str, Any], *, add: Mark | None) -> tuple[dict[str, Any] | None, list[Mark]]:
    """The patch that marks GPU `add` (an index or a PCI bus id) unhealthy beside those already marked (or, with
    None, clears every mark), and the GPUs marked after it; no patch when the node already is so. Carries the
    resourceVersion read."""
    metadata = current.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    marked = _marked(str(annotations.get(GPU_ANNOTATION) or ""))
    gpus = sorted(marked | {add}, key=_order) if add is not None else []
    if add is None:
        if GPU_LABEL not in labels and GPU_ANNOTATION not in annotations:
            return None, gpus
        wanted_labels: dict[str, str | None] = {GPU_LABEL: None}
        wanted_annotations: dict[str, str | None] = {GPU_ANNOTATION: None}
    else:
        label, annotation = _label_value(gpus), ",".join(str(g) for g in gpus)
        if labels.get(GPU_LABEL) == label and annotations.get(GPU_ANNOTATION) == annotation:
            return None, gpus
        wanted_labels, wanted_annotations = {GPU_LABEL: label}, {GPU_ANNOTATION: annotation}
    patch = {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": wanted_labels,
            "annotations": wanted_annotations,
        }
    }
    return patch, gpus


def _api_message(exc: Any) -> str:
    """The `message` of a Kubernetes Status body, else the reason phrase."""
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason or "")
