"""Real logs from public threads, end to end: `faultline replay` (the real CLI) into a real API and Celery worker,
and `faultline eval --corpus`'s scoring of a few of them beside an innocent peer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import sessionmaker

from lab.evaluation import corpus
from service.tokens import service as tokens
from tests import paths
from tests.procs import api_server, running

pytestmark = pytest.mark.slow

LOGS = paths.FIXTURES / "logs"
MACHINE = LOGS / "xid79_fallen_off_bus_multiline_nvsentinel_155.txt"
APPLICATION = LOGS / "oom_cuda_mid_format_mgfn_35.txt"
BENIGN = LOGS / "torchtitan_step_lines_pr1287.txt"


def _replay(url: str, operator: str, agent: str, job: str, *specs: str, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "faultline.cli", "replay", *specs, "--url", url, "--job", job, "--json", str(out)],
        env={**os.environ, "FAULTLINE_TOKEN": operator, "FAULTLINE_AGENT_TOKEN": agent},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    result["stdout"] = done.stdout
    return result


def test_replay_and_corpus_scoring_on_real_logs(committed, tmp_path: Path) -> None:
    factory = sessionmaker(bind=committed)
    with factory() as session:
        operator = tokens.create(session, scope="operator", name="replay").token
        agent = tokens.create(session, scope="agent", name="replay").token
        session.commit()
    with (
        api_server(log=tmp_path / "api.log") as url,
        running(["faultline", "work", "--beat", "--concurrency", "2"], log=tmp_path / "worker.log"),
    ):
        # A GPU fallen off the bus: the machine is evicted, with the driver's lines as evidence.
        machine = _replay(
            url, operator, agent, "r-machine", f"gpu-a={MACHINE}", f"gpu-b={BENIGN}", out=tmp_path / "m.json"
        )
        assert machine["settled"]
        evictions = [d for d in machine["decisions"] if d["kind"] == "evict"]
        assert [d["node"] for d in evictions] == ["r-machine-gpu-a"]
        assert "fallen off the bus" in machine["stdout"] and "decision evict r-machine-gpu-a" in machine["stdout"]
        assert "| " in machine["stdout"], "the evidence lines are printed"

        # The application's out-of-memory error: an incident that accuses no machine.
        app = _replay(url, operator, agent, "r-app", f"gpu-a={APPLICATION}", f"gpu-b={BENIGN}", out=tmp_path / "a.json")
        assert app["incidents"] and all(i["blame"] != "infrastructure" for i in app["incidents"])
        assert not [d for d in app["decisions"] if d["node"]]

        # A healthy run's step lines: nothing to say.
        benign = _replay(url, operator, agent, "r-benign", f"gpu-a={BENIGN}", out=tmp_path / "b.json")
        assert benign["incidents"] == [] and benign["decisions"] == []
        assert "incidents: none" in benign["stdout"]

        # The corpus eval's scoring of the same three logs, each beside an innocent peer.
        run = corpus.CorpusRun(url, token=operator, agent_token=agent, tag="t", parallel=3, timeout_s=90)
        results = run.run([MACHINE, APPLICATION, BENIGN])
    summary = corpus.summarize(results)
    assert [r.right for r in results] == [True, True, True], [r.why for r in results]
    assert summary["totals"] == {
        "logs": 3,
        "right": 3,
        "accuracy": 1.0,
        "innocent_accused": 0,
        "unlabeled": 0,
        "errors": 0,
    }
    report = corpus.format_report(results, summary)
    assert "innocent peer accused: 0" in report and "machine" in report
