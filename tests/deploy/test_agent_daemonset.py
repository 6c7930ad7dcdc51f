"""The agent DaemonSet gives the agent what it reads: its settings load (every variable is one the agent knows),
each path it reads is mounted (read-only where it only reads), its token file and spool survive a pod restart,
its server and dcgm-exporter URLs name Services the manifests define, and it runs where the GPU Operator's GPUs are."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

from agents.config import ENV_PREFIX, SETTINGS, load
from faultline.cli import build_parser
from tests.deploy.manifests import one, render


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render("overlays/production")


@pytest.fixture(scope="module")
def pod(docs) -> dict[str, Any]:
    return one(docs, "DaemonSet", "faultline-agent")["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _mount_of(path: PurePosixPath | Path, mounts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The volume mount a path lies under (the deepest)."""
    under = [m for m in mounts if PurePosixPath(path).is_relative_to(m["mountPath"])]
    return max(under, key=lambda m: len(m["mountPath"]), default=None)


def _loaded(container: dict[str, Any]):
    """The agent's configuration from the container's command and environment, as `faultline agent` loads it."""
    environ = {}
    for name, value in _env(container).items():
        if isinstance(value, str):
            environ[name] = value
        elif "fieldRef" in value:
            assert value["fieldRef"]["fieldPath"] == "spec.nodeName"
            environ[name] = "gpu-node-017"
        else:
            environ[name] = "fl_from-secret-" + value["secretKeyRef"]["key"]
    args = build_parser().parse_args(container["command"][1:])
    flags = {name: getattr(args, name, None) for name in vars(args) if name not in ("command", "config")}
    return load(flags, config_file=None, environ=environ), environ


def test_every_variable_is_a_setting_the_agent_knows(pod):
    (agent,) = pod["containers"]
    for name in _env(agent):
        assert name.startswith(ENV_PREFIX), name
        assert name.removeprefix(ENV_PREFIX).lower() in SETTINGS, f"{name}: the agent has no such setting"


def test_the_settings_load_and_name_this_node(pod):
    (agent,) = pod["containers"]
    config, _ = _loaded(agent)
    assert config.node_name == "gpu-node-017"  # the downward API's spec.nodeName, not the pod's hostname
    assert config.enrol_token and not config.token  # node tokens come from enrolment, never from the manifest


def test_each_path_the_agent_reads_is_mounted_read_only(pod):
    (agent,) = pod["containers"]
    config, _ = _loaded(agent)
    mounts = agent["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path, host in ((config.sysfs_root, "/sys"), (config.procfs_root, "/proc"), (Path(config.kmsg), "/dev/kmsg")):
        mount = _mount_of(path, mounts)
        assert mount is not None, f"{path} is not mounted"
        assert mount.get("readOnly") is True, f"{path} should be read-only"
        assert volumes[mount["name"]]["hostPath"]["path"] == host
    # /proc of the host's pid namespace: the training pods' processes, and py-spy's pids, are the host's.
    assert pod["hostPID"] is True
    # /dev/kmsg, ptrace of other pods' processes: root and privileged (the image's default user is not root).
    assert agent["securityContext"]["privileged"] is True and agent["securityContext"]["runAsUser"] == 0


def test_the_token_file_and_spool_outlive_the_pod(pod):
    """Enrolment is answered once per node, so the kept token must survive a restart or an upgrade of the pod."""
    (agent,) = pod["containers"]
    config, _ = _loaded(agent)
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in (config.token_path, config.spool_path):
        mount = _mount_of(path, agent["volumeMounts"])
        assert mount is not None and not mount.get("readOnly"), f"{path} must be on a writable mount"
        assert "hostPath" in volumes[mount["name"]], f"{path} must be on the node's disk, not in the pod"


def test_the_urls_name_services_the_manifests_define(docs, pod):
    (agent,) = pod["containers"]
    config, _ = _loaded(agent)
    services = {
        (d["metadata"]["name"], d["metadata"]["namespace"]): {p["port"] for p in d["spec"]["ports"]}
        for d in docs
        if d["kind"] == "Service"
    }
    for url in (config.server, config.dcgm_url):
        parts = urlsplit(url)
        name, namespace, *_ = parts.hostname.split(".")
        assert parts.port in services.get((name, namespace), set()), f"{url}: no such Service port"
    dcgm = one(docs, "Service", "faultline-dcgm-local")
    # Only this node's exporter answers: an agent must never ship another node's GPU counters as its own.
    assert dcgm["spec"]["internalTrafficPolicy"] == "Local"
    assert dcgm["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}


def test_it_runs_on_gpu_nodes_and_stays_on_nodes_faultline_took_out(pod):
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert {"nvidia.com/gpu", "faultline.io/faulty"} <= tolerated


def test_the_enrolment_token_comes_from_a_secret(pod):
    (agent,) = pod["containers"]
    ref = _env(agent)[ENV_PREFIX + "ENROL_TOKEN"]
    assert ref == {"secretKeyRef": {"name": "faultline-agent-enrol", "key": "token"}}
