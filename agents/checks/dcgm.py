"""`dcgmi diag -r 1|2|3 -j`: NVIDIA's own diagnostics, when DCGM is installed, parsed per test and per GPU.

The JSON (DCGM 2.x/3.x, nvvs/src/JsonOutput.cpp) nests results as
{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results": [{"gpu_ids", "status",
"warnings": [{"warning", "error_id"} or a string], "info": [...]}]}]}], "version"}}; statuses are PASS, FAIL,
WARN or SKIP in any case. Software tests report once for all GPUs ("gpu_ids": "0,1,2"), the others once per GPU.
dcgmi exits non-zero when a test fails and still prints the document, so the exit code is not the verdict.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from typing import Any

from agents.checks.result import CheckResult, Status, not_available

# Seconds each level may take (NVIDIA's guide: r1 seconds, r2 about two minutes, r3 up to half an hour).
TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 2400.0}
_STATUS: dict[str, Status] = {"pass": "pass", "warn": "pass", "fail": "fail", "skip": "not_available"}


def _subject(gpu_ids: Any) -> str:
    ids = str(gpu_ids).strip()
    return f"gpu:{ids}" if ids.isdigit() else "node"


def _messages(items: Any) -> list[str]:
    out = []
    for item in items or []:
        if isinstance(item, dict):
            text = str(item.get("warning", ""))
            code = item.get("error_id")
            out.append(f"{text} (DCGM error {code})" if code is not None else text)
        elif item is not None:
            out.append(str(item))
    return out


def parse(text: str, *, level: int) -> list[CheckResult]:
    """One result per test and GPU (or per software test for the node); raises ValueError on no document."""
    start = text.find("{")  # dcgmi may print a warning line before the document
    if start < 0:
        raise ValueError("dcgmi printed no JSON")
    try:
        document, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise ValueError(f"dcgmi's JSON does not parse: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("dcgmi's JSON is not an object")
    root = document.get("DCGM GPU Diagnostic") or document.get("DCGM Diagnostic")
    if not isinstance(root, dict) or not isinstance(root.get("test_categories"), list):
        raise ValueError("dcgmi's JSON has no test_categories")
    out = []
    for category in root["test_categories"]:
        for test in (category or {}).get("tests") or []:
            if not test:
                continue  # DCGM 3.1 leaves nulls between tests
            for result in test.get("results") or []:
                if not result:
                    continue
                raw = str(result.get("status", "")).strip().lower()
                status = _STATUS.get(raw, "fail")  # an unknown status is not a pass
                evidence: dict[str, Any] = {
                    "level": level,
                    "category": category.get("category"),
                    "dcgm_status": result.get("status"),
                    "gpu_ids": str(result.get("gpu_ids")),
                    "dcgm_version": root.get("version"),
                }
                if warnings := _messages(result.get("warnings")):
                    evidence["warnings"] = warnings
                if info := _messages(result.get("info")):
                    evidence["info"] = info
                out.append(
                    CheckResult(f"dcgm:{test.get('name')}", _subject(result.get("gpu_ids")), status, evidence=evidence)
                )
    if not out:
        raise ValueError("dcgmi's JSON holds no test result")
    return out


def run(level: int, *, dcgmi: str | None = None, timeout: float | None = None) -> list[CheckResult]:
    dcgmi = dcgmi or shutil.which("dcgmi")
    if dcgmi is None:
        return [not_available("dcgm", "dcgmi is not installed (DCGM)")]
    timeout = timeout or TIMEOUT_S[level]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [dcgmi, "diag", "-r", str(level), "-j"], capture_output=True, timeout=timeout, check=False, text=True
        )
    except subprocess.TimeoutExpired:
        return [
            CheckResult("dcgm", "node", "fail", evidence={"level": level, "reason": f"timed out after {timeout:g} s"})
        ]
    except OSError as exc:
        return [not_available("dcgm", f"cannot run dcgmi: {exc}")]
    took = round(time.monotonic() - started, 1)
    try:
        results = parse(done.stdout, level=level)
    except ValueError as exc:
        # No host engine (nv-hostengine not running) is the usual cause: DCGM is there but not usable.
        why = f"{exc}; exit {done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}"
        return [not_available("dcgm", why)]
    return [CheckResult(r.check, r.subject, r.status, evidence=r.evidence, duration_s=took) for r in results]
