"""Candidate policies: the FAULTLINE_POLICY_* settings overridden from a TOML or JSON file, or a form, validated."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_origin

from pydantic import ValidationError

from service.config import Settings
from service.errors import InvalidInput

POLICY_SETTINGS = tuple(name for name in Settings.model_fields if name.startswith("policy_"))


def setting_name(key: str) -> str:
    """`FAULTLINE_POLICY_EVICT_MIN_CONFIDENCE`, `policy_evict_min_confidence` and `evict_min_confidence` alike."""
    name = key.strip().lower().removeprefix("faultline_")
    return name if name.startswith("policy_") else f"policy_{name}"


def load_file(path: Path) -> dict[str, Any]:
    """A policy file's settings: TOML (`.toml`) or JSON (anything else), one flat table of names and values."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise InvalidInput(f"{path}: not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: expected a table of policy settings, got {type(data).__name__}")
    return data


def _coerced(name: str, value: Any) -> Any:
    """A list setting given as text (an environment variable's form, a form field): JSON or comma-separated."""
    if get_origin(Settings.model_fields[name].annotation) is list and isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                return value  # validation says what is wrong with it
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def candidate(base: Settings, overrides: Mapping[str, Any]) -> Settings:
    """`base` with these policy settings replaced; an unknown name or a bad value is InvalidInput (422)."""
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        name = setting_name(str(key))
        if name not in POLICY_SETTINGS:
            raise InvalidInput(f"{key}: not a policy setting; known: {', '.join(POLICY_SETTINGS)}")
        changes[name] = _coerced(name, value)
    try:
        # Validation only: model_validate reads no environment, so the file's values are the ones checked.
        return Settings.model_validate({**base.model_dump(), **changes})
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise InvalidInput("; ".join(lines)) from None


def current(settings: Settings) -> dict[str, Any]:
    """The policy settings in effect, by name."""
    return {name: getattr(settings, name) for name in POLICY_SETTINGS}


def changed(base: Settings, other: Settings) -> dict[str, tuple[Any, Any]]:
    """name -> (current, candidate) for the policy settings that differ."""
    return {
        name: (getattr(base, name), getattr(other, name))
        for name in POLICY_SETTINGS
        if getattr(base, name) != getattr(other, name)
    }
