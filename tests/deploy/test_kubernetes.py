"""deploy/kubernetes: every overlay renders with Kustomize and validates against the Kubernetes schemas offline
(kubernetes-validate, strict: an unknown field fails); the workloads run real faultline commands; the adapter's
RBAC is nodes get/patch and nodes/status patch, nothing more; the API is probed, budgeted, and waits for the
schema; beat is exactly one."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from faultline.cli import build_parser
from tests.deploy.manifests import OVERLAYS, one, pod_specs, render

# Native sidecars (the try overlay's PostgreSQL and Redis) need 1.29; the newest schemas the validator ships.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_document_validates_strictly(rendered, version):
    folder, docs = rendered
    assert docs, folder
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{folder}: {doc['kind']}/{doc['metadata']['name']} invalid for {version}: {exc.message}")


def test_the_validator_catches_a_misspelt_field():
    """The check above can fail: a field the schema does not know is refused, as the API server would."""
    daemonset = copy.deepcopy(one(render("base"), "DaemonSet", "faultline-agent"))
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_every_faultline_container_runs_a_command_faultline_accepts(rendered):
    folder, docs = rendered
    parser = build_parser()
    seen = 0
    for where, spec in pod_specs(docs).items():
        for container in _containers(spec):
            command = container.get("command") or []
            if command[:1] == ["sh"]:  # the schema wait: a loop around `faultline migrate --check`
                command = command[-1].split(";")[0].removeprefix("until ").split()
            if command[:1] != ["faultline"]:
                continue
            seen += 1
            try:
                parser.parse_args(command[1:])
            except SystemExit:
                pytest.fail(f"{folder} {where} {container['name']}: faultline refuses {command}")
    assert seen >= 3, folder


def test_the_adapter_may_get_and_patch_nodes_and_nothing_more():
    docs = render("overlays/production")
    role = one(docs, "ClusterRole", "faultline-adapter")
    rules = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"]))) for r in role["rules"])
    assert rules == [(("",), ("nodes",), ("get", "patch")), (("",), ("nodes/status",), ("patch",))]
    binding = one(docs, "ClusterRoleBinding", "faultline-adapter")
    assert binding["roleRef"]["name"] == "faultline-adapter"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "faultline-adapter", "namespace": "faultline"}]
    adapter = pod_specs(docs)["Deployment/faultline-adapter"]
    assert adapter["serviceAccountName"] == "faultline-adapter"
    # Nothing else runs with a service account that can do more than the default.
    others = [w for w, s in pod_specs(docs).items() if s.get("serviceAccountName") and "adapter" not in w]
    assert not others
    assert [r for r in docs if r["kind"] in ("Role", "RoleBinding")] == []


def test_the_api_is_probed_budgeted_and_waits_for_the_schema():
    docs = render("overlays/production")
    api = one(docs, "Deployment", "faultline-api")
    spec = api["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "api")
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert "faultline migrate --check" in " ".join(spec["initContainers"][0]["command"])
    assert api["spec"]["replicas"] >= 2
    pdb = one(docs, "PodDisruptionBudget", "faultline-api")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    service = one(docs, "Service", "faultline-api")
    assert service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    job = one(docs, "Job", "faultline-migrate")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["faultline", "migrate"]


def test_beat_is_exactly_one_and_never_two_during_an_upgrade():
    beat = one(render("overlays/production"), "Deployment", "faultline-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"


def test_the_try_overlay_is_one_pod_with_its_own_database():
    docs = render("overlays/try")
    workloads = pod_specs(docs)
    assert set(workloads) == {"Deployment/faultline-api", "Deployment/faultline-adapter", "DaemonSet/faultline-agent"}
    spec = workloads["Deployment/faultline-api"]
    sidecars = [c["name"] for c in spec["initContainers"] if c.get("restartPolicy") == "Always"]
    assert sidecars == ["postgres", "redis"]
    # Migrations run after the sidecars started, in the same pod; then the API and a worker with beat.
    assert [c["name"] for c in spec["initContainers"]][-1] == "wait-for-schema"
    assert spec["initContainers"][-1]["command"] == ["faultline", "migrate"]
    assert {c["name"]: c["command"][1:] for c in spec["containers"]}["worker"] == ["work", "--beat"]
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].startswith("faultline-db"))
    refs = {ref["secretRef"]["name"] for c in spec["containers"] for ref in c.get("envFrom", []) if "secretRef" in ref}
    assert refs == {secret["metadata"]["name"]}  # the generated name (with its hash) is the one the pod reads


def test_production_leaves_the_secrets_to_the_operator():
    """No credentials in git: the production overlay references Secrets, it does not make them."""
    docs = render("overlays/production")
    assert [d for d in docs if d["kind"] == "Secret"] == []
    referenced = set()
    for spec in pod_specs(docs).values():
        for container in _containers(spec):
            referenced |= {r["secretRef"]["name"] for r in container.get("envFrom", []) if "secretRef" in r}
            referenced |= {
                e["valueFrom"]["secretKeyRef"]["name"]
                for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            }
        referenced |= {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    assert referenced == {"faultline-db", "faultline-agent-enrol", "faultline-adapter-token"}
