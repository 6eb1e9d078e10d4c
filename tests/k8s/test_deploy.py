"""deploy/: every manifest parses, kustomize lists every file, RBAC matches the backend, the roles share config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from scheduler.backends.kubernetes import CAPACITY_RBAC_RULES, RBAC_RULES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SETTINGS = (ROOT / "jobsite" / "settings.py").read_text()


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def base_documents() -> list[dict]:
    kustomization = load(DEPLOY / "kustomization.yaml")[0]
    return [d for name in kustomization["resources"] for d in load(DEPLOY / name)]


def of_kind(kind: str, docs: list[dict] | None = None) -> list[dict]:
    return [d for d in (docs if docs is not None else base_documents()) if d.get("kind") == kind]


def rules_as_map(rules: list[dict]) -> dict[str, frozenset[str]]:
    result: dict[str, set[str]] = {}
    for rule in rules:
        assert rule["apiGroups"] == [""], "only the core API group is used"
        for resource in rule["resources"]:
            result.setdefault(resource, set()).update(rule["verbs"])
    return {k: frozenset(v) for k, v in result.items()}


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_file_parses_into_kubernetes_objects(path):
    docs = load(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: {doc}"
        if doc["kind"] not in ("Kustomization", "Component"):
            assert doc["metadata"]["name"]


def test_each_kustomization_lists_every_file_beside_it():
    kustomizations = sorted(DEPLOY.rglob("kustomization.yaml"))
    assert DEPLOY / "kustomization.yaml" in kustomizations
    for k in kustomizations:
        [doc] = load(k)
        listed = set(doc.get("resources", [])) | {p["path"] for p in doc.get("patches", []) if "path" in p}
        listed |= {Path(c).name for c in doc.get("components", [])}
        present = {p.name for p in k.parent.iterdir() if p.suffix in (".yaml", ".yml") and p != k}
        assert listed == present, f"{k.relative_to(DEPLOY)} lists {sorted(listed)}, the folder has {sorted(present)}"
        for name in listed:
            assert (k.parent / name).exists()


def test_the_role_grants_exactly_what_the_backend_calls():
    [role] = of_kind("Role")
    assert rules_as_map(role["rules"]) == RBAC_RULES
    [binding] = of_kind("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    [sa] = of_kind("ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "jobsite"}]
    assert not of_kind("ClusterRole"), "the base needs no cluster-wide rights"


def test_the_capacity_component_adds_only_node_listing():
    folder = DEPLOY / "components" / "capacity"
    [component] = load(folder / "kustomization.yaml")
    assert component["kind"] == "Component"
    docs = [d for name in component["resources"] for d in load(folder / name)]
    [role] = of_kind("ClusterRole", docs)
    assert rules_as_map(role["rules"]) == CAPACITY_RBAC_RULES
    [binding] = of_kind("ClusterRoleBinding", docs)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == of_kind("ServiceAccount")[0]["metadata"]["name"]
    [patch] = [d for p in component["patches"] for d in load(folder / p["path"])]
    assert patch["data"] == {"JOBSITE_K8S_CHECK_CAPACITY": "true"}


def test_deployments_share_one_image_and_read_the_config_and_secret():
    deployments = {d["metadata"]["name"]: d for d in of_kind("Deployment")}
    assert set(deployments) == {"web", "scheduler", "worker"}
    [config] = of_kind("ConfigMap")
    [secret] = of_kind("Secret")
    [sa] = of_kind("ServiceAccount")
    [pvc] = of_kind("PersistentVolumeClaim")
    images = set()
    for name, d in deployments.items():
        spec = d["spec"]
        pod = spec["template"]["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        assert pod["serviceAccountName"] == sa["metadata"]["name"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            images.add(c["image"])
            sources = c["envFrom"]
            assert {"configMapRef": {"name": config["metadata"]["name"]}} in sources, f"{name}/{c['name']}"
            assert {"secretRef": {"name": secret["metadata"]["name"]}} in sources, f"{name}/{c['name']}"
        [main] = pod["containers"]
        mounts = {m["mountPath"]: m["name"] for m in main.get("volumeMounts", [])}
        log_volume = mounts.get(config["data"]["JOBSITE_LOG_ROOT"])
        assert log_volume, f"{name} does not mount the log archive"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[log_volume]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert len(images) == 1
    [kustomization] = load(DEPLOY / "kustomization.yaml")
    assert [i["name"] for i in kustomization["images"]] == list(images)

    assert deployments["scheduler"]["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "manage.py", "runscheduler"]
    assert deployments["scheduler"]["spec"]["replicas"] == 1
    assert deployments["scheduler"]["spec"]["template"]["spec"]["initContainers"][0]["command"][:3] == [
        "python", "manage.py", "migrate"]
    worker = deployments["worker"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert worker[:5] == ["celery", "-A", "jobsite", "worker", "-B"]
    assert deployments["worker"]["spec"]["replicas"] == 1  # one embedded beat
    assert deployments["web"]["spec"]["template"]["spec"]["containers"][0]["command"][:2] == [
        "uvicorn", "jobsite.asgi:application"]


def test_the_web_service_reaches_the_web_pods():
    [service] = of_kind("Service")
    [web] = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "web"]
    template = web["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports or port["targetPort"] in ports.values()


def test_the_config_selects_the_kubernetes_backend_with_settings_that_exist():
    [config] = of_kind("ConfigMap")
    data = config["data"]
    assert data["JOBSITE_BACKEND"] == "kubernetes"
    [namespace] = of_kind("Namespace")
    [kustomization] = load(DEPLOY / "kustomization.yaml")
    assert data["JOBSITE_K8S_NAMESPACE"] == namespace["metadata"]["name"] == kustomization["namespace"]
    for key, value in data.items():
        assert isinstance(value, str), f"{key}: ConfigMap values are strings"
        assert re.search(rf"""["']{key}["']""", SETTINGS), f"{key} is not a setting jobsite reads"
    for key in ("JOBSITE_K8S_DEFAULT_NODE_SELECTOR", "JOBSITE_K8S_DEFAULT_TOLERATIONS",
                "JOBSITE_K8S_DEFAULT_AFFINITY", "JOBSITE_K8S_DATASETS"):
        json.loads(data[key])
    [secret] = of_kind("Secret")
    assert set(secret["stringData"]) == {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"}
    for key in secret["stringData"]:
        assert re.search(rf"""["']{key}["']""", SETTINGS)
