"""deploy/slurm's PrologSlurmctld and EpilogSlurmctld scripts against a real API process: the prolog registers the
job with its nodes and rank layout, the epilog ends it; with the service down, or a bad token, neither fails the
job (slurmctld would hold it) and each says why on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from agents.schedulers.slurm_jobs import EXIT_CONFIG, HookError, end_state, expand_nodes, rank_layout
from service.embedded import free_port
from service.tokens import service as tokens
from tests.paths import REPO
from tests.procs import api_server

SLURM = REPO / "deploy" / "slurm"
FAULTLINE = str(Path(sys.executable).with_name("faultline"))


def _hook(script: str, *, env_file: Path, slurm_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a hook as slurmctld does: a bare environment, the job's variables, nothing else."""
    env = {"PATH": "/usr/bin:/bin", "FAULTLINE_HOOKS_ENV": str(env_file), **slurm_env}
    return subprocess.run(
        ["/bin/sh", str(SLURM / script)], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _env_file(tmp_path: Path, *, url: str, token: str, gpus: int = 4) -> Path:
    token_file = tmp_path / "scheduler.token"
    token_file.write_text(token + "\n")
    env_file = tmp_path / "slurm-hooks.env"
    env_file.write_text(
        f"FAULTLINE_URL={url}\nFAULTLINE_BIN={FAULTLINE}\nFAULTLINE_TOKEN_FILE={token_file}\n"
        f"FAULTLINE_GPUS_PER_NODE={gpus}\n"
    )
    return env_file


@pytest.fixture
def scheduler_token(committed) -> Iterator[str]:
    with Session(committed) as session:
        made = tokens.create(session, scope="scheduler", name="slurm-hooks")
        session.commit()
    yield made.token


@pytest.mark.slow
def test_prolog_registers_the_job_and_epilog_ends_it(committed, scheduler_token, tmp_path):
    with api_server(log=tmp_path / "api.log") as url:
        env_file = _env_file(tmp_path, url=url, token=scheduler_token, gpus=4)
        job = {"SLURM_JOB_ID": "81234", "SLURM_JOB_NODELIST": "gpu-[07-08],gpu-11"}
        prolog = _hook("prolog_slurmctld.sh", env_file=env_file, slurm_env=job)
        assert prolog.returncode == 0, prolog.stderr
        assert "registered job 81234: 12 ranks on 3 nodes" in prolog.stderr
        headers = {"Authorization": f"Bearer {scheduler_token}"}
        registered = httpx.get(f"{url}/api/v1/jobs/81234", headers=headers).json()
        assert registered["state"] == "running" and registered["world_size"] == 12
        assert registered["nodes"] == ["gpu-07", "gpu-08", "gpu-11"]
        layout = [(r["rank"], r["node"], r["local_rank"]) for r in registered["ranks"]]
        assert layout == [(r, ["gpu-07", "gpu-08", "gpu-11"][r // 4], r % 4) for r in range(12)]

        epilog = _hook("epilog_slurmctld.sh", env_file=env_file, slurm_env={**job, "SLURM_JOB_EXIT_CODE": "256"})
        assert epilog.returncode == 0 and "ended job 81234: failed" in epilog.stderr
        assert httpx.get(f"{url}/api/v1/jobs/81234", headers=headers).json()["state"] == "failed"

        # A job whose prolog never reached the service: its epilog has nothing to end, and says so.
        lost = _hook("epilog_slurmctld.sh", env_file=env_file, slurm_env={"SLURM_JOB_ID": "99999"})
        assert lost.returncode == 0 and "never registered" in lost.stderr


@pytest.mark.slow
def test_a_refused_token_is_reported_and_the_job_still_runs(committed, tmp_path):
    with Session(committed) as session:
        agent = tokens.create(session, scope="agent", name="not a scheduler").token
        session.commit()
    with api_server(log=tmp_path / "api.log") as url:
        env_file = _env_file(tmp_path, url=url, token=agent)
        done = _hook(
            "prolog_slurmctld.sh", env_file=env_file, slurm_env={"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "a1"}
        )
        assert done.returncode == 0  # never holds the job
        assert "job 5 not registered (403)" in done.stderr and "scope" in done.stderr


def test_an_unreachable_service_is_reported_and_the_job_still_runs(tmp_path):
    env_file = _env_file(tmp_path, url=f"http://127.0.0.1:{free_port()}", token="fl_x")
    done = _hook("prolog_slurmctld.sh", env_file=env_file, slurm_env={"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "a1"})
    assert done.returncode == 0 and "unreachable" in done.stderr


def test_the_command_itself_says_what_went_wrong_by_exit_code(tmp_path):
    """The scripts swallow failures; `faultline slurm` itself does not, for people and monitoring."""
    env = {**os.environ, "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu-[1-", "FAULTLINE_TOKEN": "fl_x"}
    done = subprocess.run(
        [FAULTLINE, "slurm", "prolog", "--url", "http://127.0.0.1:9"], env=env, capture_output=True, text=True
    )
    assert done.returncode == EXIT_CONFIG and "not a host list" in done.stderr
    env.pop("FAULTLINE_TOKEN")
    done = subprocess.run(
        [FAULTLINE, "slurm", "epilog", "--url", "http://127.0.0.1:9"], env=env, capture_output=True, text=True
    )
    assert done.returncode == EXIT_CONFIG and "no token" in done.stderr


def test_host_lists_and_layouts():
    assert expand_nodes("gpu-[01-03,07],cpu1") == ["gpu-01", "gpu-02", "gpu-03", "gpu-07", "cpu1"]
    assert rank_layout(["a", "b"], 2) == [
        {"rank": 0, "node": "a", "local_rank": 0, "gpu": 0},
        {"rank": 1, "node": "a", "local_rank": 1, "gpu": 1},
        {"rank": 2, "node": "b", "local_rank": 0, "gpu": 0},
        {"rank": 3, "node": "b", "local_rank": 1, "gpu": 1},
    ]
    with pytest.raises(HookError):
        expand_nodes("gpu-[3")
    assert end_state({"SLURM_JOB_EXIT_CODE": "0"}) == "finished"
    assert end_state({"SLURM_JOB_EXIT_CODE": "9"}) == "failed"
    assert end_state({}) == "finished"
