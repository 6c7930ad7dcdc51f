"""Render deploy/kubernetes with Kustomize (a `kustomize` binary, or `kubectl kustomize`) for the tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.paths import REPO

KUBERNETES = REPO / "deploy" / "kubernetes"
OVERLAYS = ("base", "overlays/production", "overlays/try")
KUSTOMIZE_MISSING = "Kustomize not installed"
MIN_KUSTOMIZE = 4  # `labels` and inline `patches`


def _kubectl_kustomize_major() -> int:
    """The major version of the Kustomize built into kubectl (kubectl 1.20, Debian's, carries v2: too old)."""
    done = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r"Kustomize Version: v(\d+)", done.stdout)
    return int(found.group(1)) if found else 0


def renderer() -> list[str] | None:
    """The command that renders a kustomization folder, or None when no recent enough tool is installed."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl") and _kubectl_kustomize_major() >= MIN_KUSTOMIZE:
        return ["kubectl", "kustomize"]
    return None


def render(folder: str) -> list[dict[str, Any]]:
    """Every document `kubectl apply -k` would send for this folder."""
    command = renderer()
    if command is None:
        pytest.skip(
            f"{KUSTOMIZE_MISSING}: neither `kustomize` nor a `kubectl` with Kustomize v{MIN_KUSTOMIZE}+ is on PATH "
            "(CI installs kubectl)"
        )
    done = subprocess.run(
        [*command, str(KUBERNETES / folder)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{' '.join(command)} {folder} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod template of every workload, by kind/name."""
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet", "Job", "StatefulSet")
    }
