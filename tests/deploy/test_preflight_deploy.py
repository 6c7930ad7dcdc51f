"""deploy/slurm/prolog_preflight.sh and deploy/kubernetes/examples/torchrun-job-preflight.yaml: both run
`faultline preflight` on each node and fail only on a node it named bad (exit 1), so that Slurm drains that node and
requeues the job, or Kubernetes retries that pod elsewhere; every other outcome, faultline down included, lets the
job start. A real run of the prolog, as slurmd runs it, reports to a live API."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.paths import REPO
from tests.procs import api_server

PROLOG = REPO / "deploy" / "slurm" / "prolog_preflight.sh"
EXAMPLE = REPO / "deploy" / "kubernetes" / "examples" / "torchrun-job-preflight.yaml"
FAULTLINE = str(Path(sys.executable).with_name("faultline"))


def _fake_faultline(tmp_path: Path, code: int) -> Path:
    """A `faultline` that records its arguments and exits with `code`."""
    fake = tmp_path / "bin" / "faultline"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\nexit {code}\n')
    fake.chmod(0o755)
    return fake


def _prolog(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """As slurmd runs a Prolog: a bare environment and the job's variables."""
    return subprocess.run(
        ["/bin/sh", str(PROLOG)], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=240
    )


@pytest.mark.parametrize("code, expected", [(0, 0), (1, 1), (2, 0), (3, 0)])
def test_the_prolog_fails_only_on_the_node_named_bad(tmp_path, code, expected):
    env_file = tmp_path / "preflight.env"
    env_file.write_text(
        f"FAULTLINE_BIN={_fake_faultline(tmp_path, code)}\nFAULTLINE_TOKEN_FILE=/etc/x.token\n"
        "FAULTLINE_PREFLIGHT_ARGS='--min-busbw 300'\n"
    )
    done = _prolog({"FAULTLINE_PREFLIGHT_ENV": str(env_file), "SLURM_JOB_ID": "7"})
    assert done.returncode == expected
    assert (tmp_path / "args").read_text().split() == [
        "preflight",
        "--token-file",
        "/etc/x.token",
        "--min-busbw",
        "300",
    ]
    assert ("is named bad" in done.stderr) == (expected == 1)


def _init_container() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    job = next(d for d in docs if d["kind"] == "Job")
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    return init


def test_the_kubernetes_example_is_valid_and_its_service_publishes_pods_before_they_are_ready():
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["publishNotReadyAddresses"] is True
    init = _init_container()
    names = {e["name"] for e in init["env"]}
    assert {"FAULTLINE_JOB_ID", "NODE_NAME", "POD_IP", "FAULTLINE_URL", "FAULTLINE_TOKEN"} <= names


@pytest.mark.parametrize("code, expected", [(0, 0), (1, 1), (2, 0), (3, 0)])
def test_the_init_container_fails_only_on_the_node_named_bad(tmp_path, code, expected):
    fake = _fake_faultline(tmp_path, code)
    init = _init_container()
    env = {
        "PATH": f"{fake.parent}:/usr/bin:/bin",
        "JOB_COMPLETION_INDEX": "1",
        "NODE_NAME": "gpu-7",
        "POD_IP": "10.0.0.7",
    }
    done = subprocess.run(init["command"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == expected
    args = (tmp_path / "args").read_text().split()
    assert args[0] == "preflight" and "--node-rank=1" in args and "--node=gpu-7" in args and "--addr=10.0.0.7" in args


@pytest.fixture
def agent_token(committed) -> Iterator[str]:
    with Session(committed) as session:
        made = tokens.create(session, scope="agent", name="preflight")
        session.commit()
    yield made.token


def _real_env(tmp_path: Path, *, url: str, token: str) -> dict[str, str]:
    token_file = tmp_path / "preflight.token"
    token_file.write_text(token + "\n")
    env_file = tmp_path / "preflight.env"
    env_file.write_text(
        f"FAULTLINE_URL={url}\nFAULTLINE_BIN={FAULTLINE}\nFAULTLINE_TOKEN_FILE={token_file}\n"
        f"FAULTLINE_PREFLIGHT_PORT={free_port()}\nFAULTLINE_PREFLIGHT_DEADLINE_S=60\n"
    )
    # slurmd's variables for a one-node job on this host; HOME for PyTorch's caches.
    return {
        "FAULTLINE_PREFLIGHT_ENV": str(env_file),
        "SLURM_JOB_ID": "90210",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURMD_NODENAME": "localhost",
        "HOME": str(tmp_path),
    }


@pytest.mark.slow
def test_a_real_prolog_reports_the_nodes_own_checks_to_faultline(committed, agent_token, tmp_path):
    pytest.importorskip("torch")
    with api_server(log=tmp_path / "api.log") as url:
        done = _prolog(_real_env(tmp_path, url=url, token=agent_token))
        assert done.returncode == 0, done.stderr
        assert "this node (localhost) passed" in done.stderr and "recorded preflight" in done.stderr
        results = httpx.get(f"{url}/api/v1/nodes/localhost/checks", headers={"Authorization": f"Bearer {agent_token}"})
        # The agent token may not read results; a scheduler's may: the API's scopes, unchanged.
        assert results.status_code == 403
        with Session(committed) as session:
            scheduler = tokens.create(session, scope="scheduler", name="reader").token
            session.commit()
        rows = httpx.get(
            f"{url}/api/v1/nodes/localhost/checks", headers={"Authorization": f"Bearer {scheduler}"}
        ).json()["results"]
        checks = {(r["check"], r["verdict"]) for r in rows}
        assert ("gemm_bf16", "pass") in checks and ("preflight_network", "not_available") in checks
        assert all(r["directive_id"].startswith("preflight:") for r in rows)


@pytest.mark.slow
def test_with_faultline_down_the_prolog_says_so_and_the_job_starts(tmp_path):
    pytest.importorskip("torch")
    done = _prolog(_real_env(tmp_path, url=f"http://127.0.0.1:{free_port()}", token="fl_x"))
    assert done.returncode == 0, done.stderr
    assert "fleet criteria unavailable" in done.stderr
    assert "faultline unreachable" in done.stderr and "the job starts" in done.stderr


def test_the_preflight_refuses_a_node_outside_its_allocation():
    env = {**os.environ, "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu-[1-2]", "SLURMD_NODENAME": "gpu-9"}
    done = subprocess.run([FAULTLINE, "preflight", "--no-service"], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "not in the allocation" in done.stderr
