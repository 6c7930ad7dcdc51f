"""The node agent from the base install alone (`pip install faultline`, no extra), in a fresh venv: it starts, ships
batches, and never imports the server, the detection methods or the lab; the server's and the lab's commands say
which extra they need."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import venv
from pathlib import Path

import orjson
import pytest

from tests import paths
from tests.procs import wait_for
from tests.receiver import receiver

pytestmark = pytest.mark.slow

XID48 = (
    "[Sat Nov 22 10:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=python, An uncorrectable double bit "
    "error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.\n"
)
COPY_SKIPS = (".venv", ".git", ".faultline", "build", "*.egg-info", "__pycache__", ".*_cache", "node_modules")
SERVER_ONLY = ("fastapi", "sqlalchemy", "psycopg", "celery", "pandas", "sklearn", "pgserver", "psutil")


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding faultline's base install and nothing else (pip from PyPI, as on a GPU node)."""
    root = tmp_path_factory.mktemp("base-venv")
    # Built from a copy: an in-tree build would leave build/ and egg-info behind in the checkout.
    source = tmp_path_factory.mktemp("source") / "faultline"
    shutil.copytree(paths.REPO, source, ignore=shutil.ignore_patterns(*COPY_SKIPS))
    venv.create(root, with_pip=True)
    done = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", source],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def _clean_env(**extra: str) -> dict[str, str]:
    # Nothing of this checkout's venv or source tree may leak in: the base venv finds only what it installed.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAULTLINE_", "PYTHON", "VIRTUAL_ENV"))}
    return {**env, **extra}


def test_the_base_install_holds_no_server_dependency(base_venv: Path) -> None:
    probe = "import importlib.util, json; print(json.dumps({m: bool(importlib.util.find_spec(m)) for m in %r}))"
    done = subprocess.run(
        [str(base_venv / "bin" / "python"), "-c", probe % (SERVER_ONLY,)],
        capture_output=True,
        text=True,
        cwd=base_venv,
        env=_clean_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == dict.fromkeys(SERVER_ONLY, False)


def test_the_agent_ships_from_the_base_install_without_importing_server_ml_or_lab(
    base_venv: Path, tmp_path: Path
) -> None:
    kernel = tmp_path / "kern.log"
    kernel.touch()
    with receiver() as rx:
        # -X importtime lists every module the process imports, on stderr.
        args = [
            str(base_venv / "bin" / "python"), "-X", "importtime", "-m", "faultline", "agent",
            "--server", rx.url, "--node-name", "n1", "--interval", "60", "--kmsg", str(kernel),
            "--spool-dir", str(tmp_path / "spool"),
        ]  # fmt: skip
        env = _clean_env(FAULTLINE_AGENT_TOKEN="fl_t")
        with subprocess.Popen(args, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True) as agent:
            try:
                wait_for(lambda: len(rx.requests) == 1, timeout=30, what="the first batch")
                with kernel.open("a") as f:
                    f.write(XID48)
                wait_for(lambda: len(rx.requests) == 2, timeout=15, what="the critical batch")
            finally:
                agent.send_signal(signal.SIGTERM)
                _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr[-2000:]
    assert rx.requests[0]["path"] == "/api/v1/ingest"
    assert rx.requests[0]["headers"]["Authorization"] == "Bearer fl_t"
    (event,) = rx.bodies()[1]["logs"]
    assert event["kind"] == "xid" and event["fields"]["xid"] == 48
    timed = [line for line in stderr.splitlines() if line.startswith("import time:") and "|" in line]
    imported = {line.rsplit("|", 1)[1].strip() for line in timed}
    assert "agents.agent" in imported  # the listing is read right
    top = {name.split(".")[0] for name in imported}
    assert not top & {"service", "ml", "lab", *SERVER_ONLY}, sorted(top & {"service", "ml", "lab", *SERVER_ONLY})


def test_the_lab_and_server_commands_name_the_extra_they_need(base_venv: Path, tmp_path: Path) -> None:
    faultline = str(base_venv / "bin" / "faultline")
    listed = subprocess.run([faultline, "--help"], capture_output=True, text=True, env=_clean_env(), timeout=60)
    assert listed.returncode == 0 and "demo" in listed.stdout and "agent" in listed.stdout
    for command, extra in ((["demo"], "lab"), (["eval", "--help"], "lab"), (["serve"], "server")):
        done = subprocess.run(
            [faultline, *command], capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=60
        )
        assert done.returncode == 2, (command, done.stderr)
        assert f"pip install 'faultline[{extra}]'" in done.stderr, (command, done.stderr)
