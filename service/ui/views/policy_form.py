"""The what-if page's policy form: one control per FAULTLINE_POLICY_* setting, chosen from the setting's type,
with a human label and the setting's name as help text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt

from service.config import Settings
from service.decisions.overrides import POLICY_SETTINGS
from service.errors import InvalidInput

# What an on-call engineer calls each setting; a setting added later without a label reads from its name.
LABELS: dict[str, str] = {
    "policy_mode": "Mode",
    "policy_approval_required_for": "Always wait for a person before",
    "policy_evict_min_confidence": "Evict at confidence of at least",
    "policy_diagnose_min_confidence": "Diagnose at confidence of at least",
    "policy_rollback_min_confidence": "Roll back at confidence of at least",
    "policy_restart_min_confidence": "Restart at confidence of at least",
    "policy_max_evict_share_per_hour": "Most of a job's nodes evicted per hour",
    "policy_network_flap_count": "Network flaps on one node before evicting",
    "policy_network_flap_window_s": "Within (network flaps)",
    "policy_network_broken_flap_s": "Evict on one flap that broke the job when no other link dropped within",
    "policy_node_cooldown_s": "Between two evictions of a node",
    "policy_job_cooldown_s": "Between two restarts or rollbacks of a job",
    "policy_reset_gpu_enabled": "Reset a GPU instead of evicting its node when a reset clears the fault",
    "policy_reset_gpu_window_s": "GPU reset window",
    "policy_reset_gpu_max_per_window": "Resets of one GPU per window before evicting its node",
}


@dataclass(frozen=True)
class PolicyField:
    """One control: `kind` is select, checkboxes, checkbox or number; `unit` follows a number's box."""

    name: str
    label: str
    kind: Literal["select", "checkboxes", "checkbox", "number"]
    value: Any
    choices: tuple[str, ...] = ()
    bounds: dict[str, str] = field(default_factory=dict)
    unit: str = ""


# Settings that are shares (a confidence, a share of a job's nodes): shown and typed as percentages, as every page
# shows them; the settings themselves stay fractions.
PERCENT_SETTINGS = frozenset(
    name for name in POLICY_SETTINGS if name.endswith("_min_confidence") or name.endswith("_share_per_hour")
)


def label(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    words = name.removeprefix("policy_").removesuffix("_s").replace("_", " ")
    return words[:1].upper() + words[1:]


def _bounds(name: str) -> dict[str, str]:
    """min/max/step attributes from the setting's constraints, so the browser refuses what validation would."""
    info = Settings.model_fields[name]
    out = {"step": "1" if info.annotation is int else "any"}
    scale = 100 if name in PERCENT_SETTINGS else 1
    for rule in info.metadata:
        if isinstance(rule, Ge | Gt):
            out["min"] = f"{(rule.ge if isinstance(rule, Ge) else rule.gt) * scale:g}"
        if isinstance(rule, Le | Lt):
            out["max"] = f"{(rule.le if isinstance(rule, Le) else rule.lt) * scale:g}"
    return out


def shown(name: str, value: Any) -> str:
    """A setting's value as the page shows it: a share as a percentage (80%), anything else as it is."""
    if name in PERCENT_SETTINGS and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value * 100:g}%"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def as_settings(form: dict[str, Any]) -> dict[str, Any]:
    """The form as policy settings: its percentages back to the fractions the settings hold; a percentage that is
    no number is InvalidInput naming the field."""
    out = dict(form)
    for name in PERCENT_SETTINGS:
        text = str(form.get(name, "")).strip().removesuffix("%").strip()
        if not text:
            continue
        try:
            percent = float(text)
        except ValueError:
            raise InvalidInput(f"{name}: {form[name]!r} is not a percentage (0 to 100)") from None
        if not 0 <= percent <= 100:
            raise InvalidInput(f"{name}: {text}% is not a percentage between 0 and 100")
        out[name] = percent / 100
    return out


def fields(values: dict[str, Any]) -> list[PolicyField]:
    """The form's controls in the settings' order, showing `values` (in effect, or as typed)."""
    out = []
    for name in POLICY_SETTINGS:
        annotation = Settings.model_fields[name].annotation
        value = values.get(name)
        if get_origin(annotation) is Literal:
            out.append(PolicyField(name, label(name), "select", str(value), tuple(get_args(annotation))))
        elif get_origin(annotation) is list:
            choices = tuple(get_args(get_args(annotation)[0]))
            chosen = list(value) if isinstance(value, list | tuple) else []
            out.append(PolicyField(name, label(name), "checkboxes", chosen, choices))
        elif annotation is bool:
            checked = value if isinstance(value, bool) else str(value).lower() in ("true", "1", "on")
            out.append(PolicyField(name, label(name), "checkbox", checked))
        else:
            unit = "%" if name in PERCENT_SETTINGS else "s" if name.endswith("_s") else ""
            if name in PERCENT_SETTINGS and isinstance(value, int | float):
                value = round(value * 100, 6)  # a setting in effect (a fraction); a typed value stays as typed
            # 1800, not 1800.0: a float setting shows as a person would type it (as typed values stay).
            number = int(value) if isinstance(value, float) and value.is_integer() else value
            out.append(PolicyField(name, label(name), "number", number, bounds=_bounds(name), unit=unit))
    return out


def from_query(query: Any) -> dict[str, Any]:
    """The form as submitted: a checkbox sends nothing when cleared, so its hidden `false` twin is read then."""
    values: dict[str, Any] = {}
    for name in POLICY_SETTINGS:
        annotation = Settings.model_fields[name].annotation
        if get_origin(annotation) is list:
            values[name] = query.getlist(name)
        elif annotation is bool:
            values[name] = "true" if "true" in query.getlist(name) else "false"
        else:
            values[name] = query.get(name, "")
    return values
