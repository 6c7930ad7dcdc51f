"""Python stacks of training processes, read from outside with `py-spy dump --json`.

py-spy reads a live process's memory without stopping it for long or needing anything inside it,
which is what a hung rank needs: it cannot be asked to print its own stack.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)


def find_py_spy() -> str | None:
    """The py-spy installed with the agent (same environment), else one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump(pid: int, *, py_spy: str, timeout: float) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(threads, None) or (None, why it failed)."""
    try:
        done = subprocess.run(
            [py_spy, "dump", "--json", "--pid", str(pid)], capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy timed out after {timeout:g} s"
    except OSError as exc:
        return None, f"cannot run py-spy: {exc}"
    if done.returncode != 0:
        return None, (done.stderr or done.stdout).decode(errors="replace").strip()[-2000:] or "py-spy failed"
    try:
        threads = orjson.loads(done.stdout)
    except orjson.JSONDecodeError:
        return None, "py-spy printed no JSON: " + done.stdout.decode(errors="replace")[:500]
    return threads, None


def dump_all(
    targets: list[dict[str, Any]], *, directive_id: str, timeout: float, parallel: int = 4
) -> list[dict[str, Any]]:
    """One stack dump per target ({pid, rank, job_id}), as wire-protocol `stacks` items."""
    py_spy = find_py_spy()

    def one(target: dict[str, Any]) -> dict[str, Any]:
        if py_spy is None:
            threads, error = None, "py-spy is not installed (pip install py-spy)"
        else:
            threads, error = dump(target["pid"], py_spy=py_spy, timeout=timeout)
        item = {"ts": datetime.now(UTC).isoformat(), "directive_id": directive_id, **target}
        if threads is not None:
            item["threads"] = threads
        else:
            item["error"] = error
            log.warning("stack dump of pid %s failed: %s", target["pid"], error)
        return item

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, targets))
