"""deploy/: the base, every overlay and component, rendered as `kubectl apply -k` would (tests/k8s/kustomize.py).

Every component is rendered over the base on its own too (targets ``base+components/<name>``, as an overlay adding
only it would be), so that components no overlay may use together (gang-coscheduling, gang-volcano) are checked.

Every object is valid against the Kubernetes API schema; every pod meets Pod Security `restricted`; the RBAC is
exactly what the backend calls, given to the scheduler only; the log archive works on a ReadWriteOnce default class;
the roles share one image, config and secret that jobsite reads. What the NetworkPolicies let through, with the
backend's own policy of each attempt: tests/k8s/test_network.py.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from scheduler.backends.k8s_gang import APIS as GANG_APIS
from scheduler.backends.kubernetes import (
    CAPACITY_RBAC_RULES,
    GANG_RBAC_RULES,
    LEASE_API_GROUP,
    LEASE_RBAC_RULES,
    NETWORK_API_GROUP,
    NETWORK_RBAC_RULES,
    RBAC_RULES,
)

from .kustomize import CLUSTER_SCOPED, BuildError, Unsupported, build, load_documents, object_id, strategic_merge
from .netpol import selects
from .pod_security import restricted_violations

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"
SETTINGS = "".join(p.read_text() for p in sorted((ROOT / "jobsite").glob("settings*.py")))
README = (ROOT / "README.md").read_text()

CONTROL = "jobsite"  # web, scheduler, worker
JOBS = "jobsite-jobs"  # job pods only
KUBERNETES = "1.33"  # schemas of kubernetes-validate
SECRET = "jobsite-secrets"
SECRET_KEYS = {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "JOBSITE_METRICS_TOKEN"}
LOG_LABEL = ("jobsite/logs-volume", "jobsite-logs")

OVERLAYS = ["base"] + sorted(f"overlays/{p.name}" for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
COMPONENTS = sorted(p.name for p in (DEPLOY / "components").iterdir() if p.is_dir())
TARGETS = OVERLAYS + [f"base+components/{c}" for c in COMPONENTS]
GANG_ROLE = "jobsite-scheduler-podgroups"


@contextlib.contextmanager
def target_directory(target: str) -> Iterator[Path]:
    """The directory to build: a folder of deploy/, or for ``a+b`` a kustomization (in a temporary folder) of the
    folder ``a`` with the component ``b``."""
    if "+" not in target:
        yield DEPLOY / target
        return
    resource, component = target.split("+")
    with tempfile.TemporaryDirectory(prefix="jobsite-deploy-") as tmp:
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / resource, tmp)],
            "components": [os.path.relpath(DEPLOY / component, tmp)],
        }))
        yield Path(tmp)


@functools.cache
def _rendered(target: str) -> tuple[dict, ...]:
    with target_directory(target) as directory:
        return tuple(build(directory))


def rendered(target: str) -> list[dict]:
    return copy.deepcopy(list(_rendered(target)))


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def get(docs: list[dict], kind: str, name: str, namespace: str | None = None) -> dict:
    [obj] = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name
             and (namespace is None or d["metadata"].get("namespace") == namespace)]
    return obj


def deployments(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def all_containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


def config_map(docs: list[dict]) -> dict:
    """The settings' ConfigMap, generated as jobsite-config-<hash of its content> (test_deploy_ha.py)."""
    [obj] = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("jobsite-config-")
             and d["metadata"].get("namespace") == CONTROL]
    return obj


def config(docs: list[dict]) -> dict[str, str]:
    return config_map(docs)["data"]


def rules_by_group(rules: list[dict]) -> dict[str, dict[str, frozenset[str]]]:
    """API group -> resource -> verbs of a Role's rules (one group per rule)."""
    result: dict[str, dict[str, set[str]]] = {}
    for rule in rules:
        [group] = rule["apiGroups"]
        for resource in rule["resources"]:
            result.setdefault(group, {}).setdefault(resource, set()).update(rule["verbs"])
    return {g: {k: frozenset(v) for k, v in resources.items()} for g, resources in result.items()}


def rules_as_map(rules: list[dict], group: str = "") -> dict[str, frozenset[str]]:
    """The rules of a Role that grants in one API group only."""
    by_group = rules_by_group(rules)
    assert set(by_group) == {group}, by_group
    return by_group[group]


# The jobs namespace Role: the core API of pods, and each attempt's NetworkPolicy.
JOBS_ROLE_RULES = {"": RBAC_RULES, NETWORK_API_GROUP: NETWORK_RBAC_RULES}


def bindings_of(docs: list[dict], account: str, namespace: str = CONTROL) -> set[tuple[str, str, str]]:
    """(binding kind, its namespace, role name) of every binding naming the ServiceAccount."""
    found = set()
    for b in of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding"):
        for s in b.get("subjects", []):
            if s["kind"] == "ServiceAccount" and s["name"] == account and s.get("namespace") == namespace:
                found.add((b["kind"], b["metadata"].get("namespace", ""), b["roleRef"]["name"]))
    return found


# --- files and the renderer ------------------------------------------------------------------------------------------

def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_file_parses_into_kubernetes_objects(path):
    docs = load_documents(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: {doc}"
        if doc["kind"] not in ("Kustomization", "Component"):
            assert doc["metadata"]["name"]


def test_each_kustomization_lists_every_file_beside_it():
    kustomizations = sorted(DEPLOY.rglob("kustomization.yaml"))
    assert BASE / "kustomization.yaml" in kustomizations
    assert not (DEPLOY / "kustomization.yaml").exists(), "install through an overlay: deploy/overlays/*"
    for k in kustomizations:
        [doc] = load_documents(k)
        entries = doc.get("resources", []) + doc.get("components", [])
        for entry in entries:
            assert (k.parent / entry).exists(), f"{k.relative_to(DEPLOY)}: {entry} does not exist"
        listed = {e for e in entries if (k.parent / e).is_file()} | {p["path"] for p in doc.get("patches", [])}
        present = {p.name for p in k.parent.iterdir() if p.suffix in (".yaml", ".yml") and p != k}
        assert listed == present, f"{k.relative_to(DEPLOY)} lists {sorted(listed)}, the folder has {sorted(present)}"


def test_every_component_is_rendered_alone_over_the_base_and_overlays_use_only_components_here():
    """So that the tests below render (and validate) each of them, and what the overlays use."""
    assert {t.split("/")[-1] for t in TARGETS if "+" in t} == set(COMPONENTS)
    for target in OVERLAYS:
        [k] = load_documents(DEPLOY / target / "kustomization.yaml")
        assert {(DEPLOY / target / c).resolve().parent for c in k.get("components", [])} <= {DEPLOY / "components"}


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl (with its built-in kustomize) is not installed")
@pytest.mark.parametrize("target", TARGETS)
def test_the_renderer_agrees_with_kubectl_kustomize(target):
    with target_directory(target) as directory:
        out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True)
    theirs = {object_id(d): d for d in yaml.safe_load_all(out.stdout) if d}
    ours = {object_id(d): d for d in rendered(target)}
    assert sorted(ours) == sorted(theirs)
    for key, obj in ours.items():
        assert obj == theirs[key], key


def test_the_renderer_merges_maps_deletes_nulls_and_refuses_what_it_does_not_implement(tmp_path):
    original = {"spec": {"a": 1, "affinity": {"podAffinity": {"x": 1}}, "args": ["a", "b"]}}
    patch = {"spec": {"affinity": {"podAffinity": None, "podAntiAffinity": {"y": 2}}, "args": ["c"]}}
    assert strategic_merge(original, patch) == {
        "spec": {"a": 1, "affinity": {"podAntiAffinity": {"y": 2}}, "args": ["c"]}}
    with pytest.raises(Unsupported):
        strategic_merge({"containers": [{"name": "a"}]}, {"containers": [{"name": "a", "image": "b"}]})
    with pytest.raises(Unsupported):
        strategic_merge({"spec": {}}, {"spec": {"$patch": "replace"}})
    (tmp_path / "kustomization.yaml").write_text("namespace: other\nresources: []\n")
    with pytest.raises(Unsupported):
        build(tmp_path)


# --- validity --------------------------------------------------------------------------------------------------------

def check_service_monitor(obj: dict) -> None:
    """ServiceMonitor is a CRD kubernetes-validate has no schema for: the fields used here, checked by hand."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "ServiceMonitor"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    spec = obj["spec"]
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert set(spec["selector"]) <= {"matchLabels", "matchExpressions"} and spec["selector"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scheme", "authorization"}, endpoint
        assert isinstance(endpoint["port"], str) and endpoint["path"].startswith("/")
        assert re.fullmatch(r"\d+[smh]", endpoint.get("interval", "30s"))
        if "authorization" in endpoint:
            auth = endpoint["authorization"]
            assert auth.get("type", "Bearer") == "Bearer"
            assert set(auth["credentials"]) == {"name", "key"}


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_is_valid_kubernetes(target):
    docs = rendered(target)
    assert docs
    for obj in docs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            check_service_monitor(obj)
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{target}: {obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_names_its_namespace_and_the_jobs_namespace_holds_no_control_plane(target):
    for obj in rendered(target):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, obj["metadata"]
        elif namespace == JOBS:
            assert obj["kind"] in ("Role", "RoleBinding", "NetworkPolicy"), obj["metadata"]
        else:
            assert namespace == CONTROL, obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "jobsite"


# --- Pod Security ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_the_namespaces_are_under_pod_security_admission(target):
    docs = rendered(target)
    control = get(docs, "Namespace", CONTROL)["metadata"]["labels"]
    assert control["pod-security.kubernetes.io/enforce"] == "restricted"
    jobs = get(docs, "Namespace", JOBS)["metadata"]["labels"]
    # GPU images often run as root, NFS volumes are not `restricted`: baseline enforced, restricted reported.
    assert jobs["pod-security.kubernetes.io/enforce"] == "baseline"
    assert jobs["pod-security.kubernetes.io/warn"] == jobs["pod-security.kubernetes.io/audit"] == "restricted"


@pytest.mark.parametrize("target", TARGETS)
def test_every_deployment_meets_pod_security_restricted(target):
    for name, d in deployments(rendered(target)).items():
        pod = pod_spec(d)
        assert restricted_violations(pod) == [], name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}  # pod level
        assert pod["securityContext"]["runAsUser"] == 10001  # the image's user, numeric so the kubelet can check
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in all_containers(pod):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, f"{name}/{c['name']}"
            [tmp] = [m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert "emptyDir" in volumes[tmp], f"{name}/{c['name']}"


def test_the_restricted_checker_catches_what_restricted_forbids():
    pod = pod_spec(deployments(rendered("base"))["web"])
    assert restricted_violations(pod) == []
    for change, problem in [
        (lambda p: p["securityContext"].pop("seccompProfile"), "web: seccompProfile None"),
        (lambda p: p["securityContext"].pop("runAsNonRoot"), "web: runAsNonRoot is not true"),
        (lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
         "web: allowPrivilegeEscalation is not false"),
        (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(drop=[]),
         "web: capabilities do not drop ALL"),
        (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
         "web: adds capabilities ['SYS_ADMIN']"),
        (lambda p: p["containers"][0]["securityContext"].update(privileged=True), "web: privileged"),
        (lambda p: p.update(hostNetwork=True), "hostNetwork"),
        (lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath volume h"),
    ]:
        broken = copy.deepcopy(pod)
        change(broken)
        assert problem in restricted_violations(broken)


# --- identities and RBAC ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_each_role_has_its_own_service_account_and_only_the_scheduler_has_rights(target):
    docs = rendered(target)
    accounts = {sa["metadata"]["name"]: sa for sa in of_kind(docs, "ServiceAccount")}
    assert set(accounts) == {"jobsite-web", "jobsite-worker", "jobsite-scheduler", "jobsite-migrate", "jobsite-gateway"}
    for name, d in deployments(docs).items():
        pod = pod_spec(d)
        assert pod["serviceAccountName"] == f"jobsite-{name}"
        if name in ("scheduler", "gateway"):  # the gateway's rights: test_deploy_gateway.py
            assert pod["automountServiceAccountToken"] is True
        else:  # web is internet-facing, worker does database work: no token, no binding
            assert accounts[f"jobsite-{name}"]["automountServiceAccountToken"] is False
            assert pod["automountServiceAccountToken"] is False
            assert bindings_of(docs, f"jobsite-{name}") == set()
    expected = {("RoleBinding", JOBS, "jobsite-scheduler"), ("RoleBinding", CONTROL, "jobsite-scheduler-leader")}
    if any(c["metadata"]["name"] == "jobsite-nodes" for c in of_kind(docs, "ClusterRole")):
        expected.add(("ClusterRoleBinding", "", "jobsite-nodes"))
    if any(r["metadata"]["name"] == GANG_ROLE for r in of_kind(docs, "Role")):
        expected.add(("RoleBinding", JOBS, GANG_ROLE))
    assert bindings_of(docs, "jobsite-scheduler") == expected
    for b in of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding"):
        if b["metadata"]["name"] == "jobsite-gateway":
            continue
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "jobsite-scheduler", "namespace": CONTROL}]
        assert b["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        assert len([r for r in of_kind(docs, b["roleRef"]["kind"]) if r["metadata"]["name"] == b["roleRef"]["name"]
                    and r["metadata"].get("namespace") == b["metadata"].get("namespace")]) == 1, b


def test_the_jobs_role_grants_exactly_what_the_backend_calls_in_the_jobs_namespace():
    docs = rendered("base")
    [role] = [r for r in of_kind(docs, "Role") if r["metadata"]["namespace"] == JOBS
              and r["metadata"]["name"] == "jobsite-scheduler"]
    assert rules_by_group(role["rules"]) == JOBS_ROLE_RULES
    assert not any("resourceNames" in rule for rule in role["rules"])
    assert config(docs)["JOBSITE_K8S_NAMESPACE"] == JOBS
    assert not of_kind(docs, "ClusterRole") and not of_kind(docs, "ClusterRoleBinding"), "no cluster rights"
    # Gang scheduling is off in the base: the backend calls no PodGroup API, and nothing grants one.
    assert config(docs)["JOBSITE_K8S_GANG_SCHEDULING"] == ""


@pytest.mark.parametrize("mode", sorted(GANG_APIS))
def test_a_gang_component_turns_its_mode_on_and_grants_podgroups_of_its_api_only(mode):
    docs = rendered(f"base+components/gang-{mode}")
    assert config(docs)["JOBSITE_K8S_GANG_SCHEDULING"] == mode
    roles = {r["metadata"]["name"]: r for r in of_kind(docs, "Role") if r["metadata"]["namespace"] == JOBS}
    assert set(roles) == {"jobsite-scheduler", GANG_ROLE, "jobsite-gateway"}
    assert rules_by_group(roles["jobsite-scheduler"]["rules"]) == JOBS_ROLE_RULES  # unchanged
    assert rules_as_map(roles[GANG_ROLE]["rules"], GANG_APIS[mode].group) == GANG_RBAC_RULES
    assert not any("resourceNames" in rule for rule in roles[GANG_ROLE]["rules"])
    binding = get(docs, "RoleBinding", GANG_ROLE, JOBS)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": GANG_ROLE}
    assert not of_kind(docs, "ClusterRole"), "no cluster rights"
    other = next(m for m in GANG_APIS if m != mode)  # one gang scheduler at a time: the two conflict
    with pytest.raises(BuildError, match="defined twice"):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump({
                "resources": [os.path.relpath(BASE, tmp)],
                "components": [os.path.relpath(DEPLOY / "components" / f"gang-{m}", tmp) for m in (mode, other)]}))
            build(tmp)


def test_the_lease_role_covers_only_the_schedulers_lease_in_its_own_namespace():
    docs = rendered("base")
    [role] = [r for r in of_kind(docs, "Role") if r["metadata"]["namespace"] == CONTROL]
    assert rules_as_map(role["rules"], LEASE_API_GROUP) == LEASE_RBAC_RULES
    lease = config(docs)["JOBSITE_LEADER_LEASE_NAME"]
    for rule in role["rules"]:
        if rule["verbs"] == ["create"]:
            assert "resourceNames" not in rule  # RBAC cannot restrict create by name
        else:
            assert rule["resourceNames"] == [lease]
    # The Lease's namespace is the scheduler's own (POD_NAMESPACE), where this Role is.
    assert "JOBSITE_LEADER_NAMESPACE" not in config(docs)
    assert get(docs, "Deployment", "scheduler")["metadata"]["namespace"] == CONTROL


def test_the_capacity_component_adds_only_node_listing_for_the_scheduler():
    docs = rendered("overlays/example")
    [role] = of_kind(docs, "ClusterRole")
    assert rules_as_map(role["rules"]) == CAPACITY_RBAC_RULES
    [binding] = of_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert config(docs)["JOBSITE_K8S_CHECK_CAPACITY"] == "true"
    assert config(rendered("base"))["JOBSITE_K8S_CHECK_CAPACITY"] == "false"


# --- configuration and secrets ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_no_secret_is_applied_and_every_container_reads_the_config_and_the_secret(target):
    docs = rendered(target)
    assert not of_kind(docs, "Secret"), "a Secret here would overwrite the real one on every apply"
    images = set()
    for d in deployments(docs).values():
        spec = d["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        for c in all_containers(pod_spec(d)):
            images.add(c["image"])
            assert c["envFrom"] == [{"configMapRef": {"name": config_map(docs)["metadata"]["name"]}},
                                    {"secretRef": {"name": SECRET}}]
    assert len(images) == 1
    expected = "registry.example.com/jobsite:1.0.0" if target == "overlays/example" else "jobsite"
    assert images == {expected}


def test_the_secret_keys_are_settings_and_the_readme_creates_them():
    for key in SECRET_KEYS:
        assert re.search(rf"""["']{key}["']""", SETTINGS), f"{key} is not a setting jobsite reads"
    [command] = re.findall(r"kubectl create secret generic .*?(?=\n\S|\n\n|```)", README, flags=re.S)
    assert f"-n {CONTROL}" in command and SECRET in command
    assert set(re.findall(r"--from-literal=(\w+)=", command)) == SECRET_KEYS


@pytest.mark.parametrize("target", TARGETS)
def test_the_config_selects_the_kubernetes_backend_with_settings_that_exist(target):
    data = config(rendered(target))
    assert data["JOBSITE_BACKEND"] == "kubernetes"
    assert data["JOBSITE_SCHEDULER_MODE"] == "process"
    assert data["JOBSITE_K8S_NAMESPACE"] == JOBS
    assert data["JOBSITE_LEADER_ELECTION"] == "lease"
    for key in ("JOBSITE_DEFAULT_ACTIVE_DEADLINE_SECONDS", "JOBSITE_DEFAULT_TTL_SECONDS_AFTER_FINISHED",
                "JOBSITE_K8S_WORKDIR_SIZE"):
        assert data[key]
    for key, value in data.items():
        assert isinstance(value, str), f"{key}: ConfigMap values are strings"
        assert re.search(rf"""["']{key}["']""", SETTINGS), f"{key} is not a setting jobsite reads"
        assert key not in SECRET_KEYS
    for key in ("JOBSITE_K8S_DEFAULT_NODE_SELECTOR", "JOBSITE_K8S_DEFAULT_TOLERATIONS",
                "JOBSITE_K8S_DEFAULT_AFFINITY", "JOBSITE_K8S_DATASETS"):
        json.loads(data[key])


# --- the three roles -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_web_scheduler_and_worker_have_probes(target):
    docs = rendered(target)
    data = config(docs)
    ds = deployments(docs)
    assert set(ds) == {"web", "scheduler", "worker", "gateway"}

    [web] = pod_spec(ds["web"])["containers"]
    # uvicorn with JOBSITE_WEB_WORKERS processes (jobsite/serve_web.py). Live pages push small HTML fragments to
    # many sockets: compressing each frame per socket costs the web's CPU (bench/live_latency.py --load: p50 2.8 s
    # with it, 1.0 s without), the bytes saved do not matter.
    assert web["command"][:3] == ["python", "-m", "jobsite.serve_web"]
    from jobsite.serve_web import command

    uvicorn = command(web["command"][3:], {"JOBSITE_WEB_WORKERS": "1"})
    assert uvicorn[1:4] == ["-m", "uvicorn", "jobsite.asgi:application"]
    assert uvicorn[uvicorn.index("--ws-per-message-deflate") + 1] == "false"
    ports = {p["name"]: p["containerPort"] for p in web["ports"]}
    for probe in (web["readinessProbe"], web["livenessProbe"]):
        assert probe["httpGet"]["path"] == "/healthz" and probe["httpGet"]["port"] in ports
        # Django answers only ALLOWED_HOSTS; the probe's Host must be one of them.
        [host] = [h["value"] for h in probe["httpGet"]["httpHeaders"] if h["name"] == "Host"]
        assert host in data["ALLOWED_HOSTS"].split(",")

    [scheduler] = pod_spec(ds["scheduler"])["containers"]
    assert scheduler["ports"] == [{"name": "http-metrics", "containerPort": 9100}]
    assert data["JOBSITE_SCHEDULER_HTTP_PORT"] == "9100"
    assert scheduler["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert scheduler["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}

    [worker] = pod_spec(ds["worker"])["containers"]
    probe = worker["livenessProbe"]
    assert "celery -A jobsite inspect ping" in probe["exec"]["command"][-1]
    assert '-d "celery@$HOSTNAME"' in probe["exec"]["command"][-1]
    assert probe["periodSeconds"] >= 60 and probe["timeoutSeconds"] >= 30


def test_the_scheduler_runs_two_replicas_one_of_them_leading():
    docs = rendered("base")
    d = deployments(docs)["scheduler"]
    assert d["spec"]["replicas"] == 2
    # New pods one at a time: a standby is always there to take the Lease over.
    assert d["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = pod_spec(d)
    [wait] = pod["initContainers"]  # the migrations are the Job's (test_deploy_ha.py)
    assert wait["name"] == "wait-for-migrations"
    [main] = pod["containers"]
    assert main["command"] == ["python", "manage.py", "runscheduler"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in main["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    assert d["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9100", "prometheus.io/path": "/metrics"}


def test_the_worker_is_one_celery_worker_with_beat_and_no_cluster_access():
    d = deployments(rendered("base"))["worker"]
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}  # one embedded beat
    [worker] = pod_spec(d)["containers"]
    assert worker["command"][:5] == ["celery", "-A", "jobsite", "worker", "-B"]
    assert not any(v.get("persistentVolumeClaim") for v in pod_spec(d)["volumes"])


def test_the_web_service_reaches_the_web_pods():
    docs = rendered("base")
    service = get(docs, "Service", "web")
    template = deployments(docs)["web"]["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports


# --- the log archive -------------------------------------------------------------------------------------------------

def log_volume_users(docs: list[dict]) -> dict[str, dict]:
    """Deployments mounting the log archive claim at JOBSITE_LOG_ROOT -> that mount."""
    root = config(docs)["JOBSITE_LOG_ROOT"]
    users = {}
    for name, d in deployments(docs).items():
        pod = pod_spec(d)
        claims = {v["name"] for v in pod["volumes"]
                  if v.get("persistentVolumeClaim", {}).get("claimName") == "jobsite-logs"}
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] in claims:
                    assert m["mountPath"] == root
                    users[name] = m
    return users


def test_the_base_log_archive_is_read_write_once_on_the_default_class_with_its_users_on_one_node():
    docs = rendered("base")
    pvc = get(docs, "PersistentVolumeClaim", "jobsite-logs")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class
    users = log_volume_users(docs)
    assert set(users) == {"web", "scheduler"}
    assert users["web"].get("readOnly") is True and not users["scheduler"].get("readOnly")
    for name in users:
        template = deployments(docs)[name]["spec"]["template"]
        key, value = LOG_LABEL
        assert template["metadata"]["labels"][key] == value
        # Required affinity to every pod carrying the label (itself included, so the first pod goes anywhere).
        assert template["spec"]["affinity"] == {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {key: value}}, "topologyKey": "kubernetes.io/hostname"}]}}
    assert LOG_LABEL[0] not in deployments(docs)["worker"]["spec"]["template"]["metadata"]["labels"]


def test_the_rwx_overlay_asks_for_a_read_write_many_class_and_drops_the_co_location():
    docs = rendered("overlays/rwx")
    pvc = get(docs, "PersistentVolumeClaim", "jobsite-logs")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"]
    for name in log_volume_users(docs):
        affinity = pod_spec(deployments(docs)[name])["affinity"]
        assert set(affinity) == {"podAntiAffinity"}
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAntiAffinity"]


# --- scraping --------------------------------------------------------------------------------------------------------

def test_the_servicemonitor_component_scrapes_the_scheduler_and_web_with_the_metrics_token():
    docs = rendered("overlays/example")
    monitors = {m["metadata"]["name"]: m for m in of_kind(docs, "ServiceMonitor")}
    assert set(monitors) == {"jobsite-scheduler", "jobsite-web"}
    metrics = get(docs, "Service", "scheduler-metrics")
    assert metrics["spec"]["clusterIP"] == "None"
    template = deployments(docs)["scheduler"]["spec"]["template"]
    assert metrics["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert metrics["spec"]["ports"] == [{"name": "http-metrics", "port": 9100, "targetPort": "http-metrics"}]
    services = of_kind(docs, "Service")
    for name, monitor in monitors.items():
        assert monitor["metadata"]["namespace"] == CONTROL
        [service] = [s for s in services if selects(monitor["spec"]["selector"], s["metadata"].get("labels", {}))]
        [endpoint_] = monitor["spec"]["endpoints"]
        assert endpoint_["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint_["path"] == "/metrics"
        # Both with the token: in production neither /metrics answers without it (issue 20).
        assert endpoint_["authorization"]["credentials"] == {"name": SECRET, "key": "JOBSITE_METRICS_TOKEN"}
        assert service["metadata"]["name"] == "web" if name == "jobsite-web" else service is metrics
