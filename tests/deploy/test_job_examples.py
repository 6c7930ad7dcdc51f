"""deploy/kubernetes/examples: a torchrun job that its node agents register by themselves. The manifest is valid
Kubernetes; the job id it hands each worker (FAULTLINE_JOB_ID, from the label naming the job) is the one the
agent's process scan reads first, ahead of torchrun's run id, which static launches leave "none"."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from agents.procs import DEFAULT_JOB_ENV, ProcessScanner
from tests.paths import REPO

EXAMPLES = REPO / "deploy" / "kubernetes" / "examples"
JOB_LABELS = {
    "Job": "batch.kubernetes.io/job-name",
    "PyTorchJob": "training.kubeflow.org/job-name",
}


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _job_id_env(container: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in container["env"] if e["name"] == DEFAULT_JOB_ENV[0])


def test_the_torchrun_job_is_valid_kubernetes():
    for doc in _docs("torchrun-job.yaml"):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("name", ["torchrun-job.yaml", "pytorchjob-env.yaml"])
def test_each_launcher_hands_its_workers_the_job_name_as_faultline_job_id(name):
    (job,) = [d for d in _docs(name) if d["kind"] in JOB_LABELS]
    spec = job["spec"]
    template = spec["template"] if "template" in spec else spec["pytorchReplicaSpecs"]["Worker"]["template"]
    (container,) = template["spec"]["containers"]
    field = _job_id_env(container)["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == f"metadata.labels['{JOB_LABELS[job['kind']]}']"


def test_the_agent_reads_faultline_job_id_before_torchruns_run_id():
    scanner = ProcessScanner()
    env = {"RANK": "3", "TORCHELASTIC_RUN_ID": "none", "FAULTLINE_JOB_ID": "llm-pretrain"}
    assert scanner.job_of(env) == "llm-pretrain"
    assert scanner.job_of({**env, "TORCHELASTIC_RUN_ID": "rdzv-7"}) == "llm-pretrain"
    assert scanner.job_of({"RANK": "3", "TORCHELASTIC_RUN_ID": "none"}) is None
