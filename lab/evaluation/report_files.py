"""What the soak and the campaign share in reporting: the JSON file, the verdict over the targets, the clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def passed(report: dict[str, Any]) -> bool:
    return all(t["status"] == "PASS" for t in report["targets"])


def hms(seconds: float) -> str:
    """Simulated seconds as h:mm:ss."""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
