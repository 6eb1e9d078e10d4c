"""deploy/ as a highly available install: migrations as a Job everything waits for, the Lease timings of Kubernetes'
own controllers, (overlays/rwx) PodDisruptionBudgets and topology spread, and a config whose change rolls the pods
(its ConfigMap named by a hash of its content). Rendered as test_deploy.py does."""

from __future__ import annotations

import pytest
from django.conf import settings

from .kustomize import build, config_map_hash
from .pod_security import restricted_violations
from .test_deploy import (
    CONTROL,
    DEPLOY,
    TARGETS,
    bindings_of,
    config,
    config_map,
    deployments,
    of_kind,
    pod_spec,
    rendered,
)

pytestmark = pytest.mark.fast

ROLES = ("web", "scheduler", "worker")


def migrate_job(docs):
    [job] = [j for j in of_kind(docs, "Job") if j["metadata"]["name"] == "migrate"]
    return job


@pytest.mark.parametrize("target", TARGETS)
def test_the_migrations_are_a_job_of_their_own_that_meets_restricted(target):
    docs = rendered(target)
    job = migrate_job(docs)
    assert job["metadata"]["namespace"] == CONTROL
    assert job["spec"]["ttlSecondsAfterFinished"] > 0  # gone before the next release's apply: no immutable template
    pod = job["spec"]["template"]["spec"]
    [main] = pod["containers"]
    assert main["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert main["image"] == pod_spec(deployments(docs)["web"])["containers"][0]["image"]  # the release's image
    assert restricted_violations(pod) == []
    assert pod["serviceAccountName"] == "jobsite-migrate" and pod["automountServiceAccountToken"] is False
    assert bindings_of(docs, "jobsite-migrate") == set()


@pytest.mark.parametrize("target", TARGETS)
def test_web_scheduler_and_worker_wait_for_the_migrations_and_never_run_them(target):
    docs = rendered(target)
    for role in ROLES:
        pod = pod_spec(deployments(docs)[role])
        [wait] = pod["initContainers"]
        assert wait["name"] == "wait-for-migrations"
        script = wait["command"][-1]
        assert wait["command"][:2] == ["sh", "-c"]
        assert script.startswith("until python manage.py migrate --check;") and "sleep" in script
        for c in pod["initContainers"] + pod["containers"]:
            command = " ".join(c.get("command", []))
            assert "migrate" not in command or "migrate --check" in command, (role, c["name"])
        assert restricted_violations(pod) == []


@pytest.mark.parametrize("target", TARGETS)
def test_the_lease_uses_the_timings_of_kubernetes_own_controllers(target):
    data = config(rendered(target))
    lease, renew, retry = (float(data[f"JOBSITE_LEADER_{k}_SECONDS"]) for k in ("LEASE", "RENEW_DEADLINE", "RETRY"))
    assert (lease, renew, retry) == (15, 10, 2)
    assert retry < renew < lease  # a leader steps down (and is fenced) before anyone may take its lease over


def test_the_settings_defaults_match_the_deployed_lease():
    assert (settings.JOBSITE_LEADER_LEASE_SECONDS, settings.JOBSITE_LEADER_RENEW_DEADLINE_SECONDS,
            settings.JOBSITE_LEADER_RETRY_SECONDS) == (15, 10, 2)


def test_the_rwx_overlay_keeps_one_of_each_through_drains_and_spreads_them():
    docs = build(DEPLOY / "overlays" / "rwx")
    budgets = {p["metadata"]["name"]: p for p in of_kind(docs, "PodDisruptionBudget")}
    assert set(budgets) == {"web", "scheduler"}
    for role in ("web", "scheduler"):
        d = deployments(docs)[role]
        labels = d["spec"]["template"]["metadata"]["labels"]
        budget = budgets[role]
        assert budget["metadata"]["namespace"] == CONTROL
        assert budget["spec"]["maxUnavailable"] == 1 and d["spec"]["replicas"] >= 2
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        spread = pod_spec(d)["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
        for c in spread:
            assert c["maxSkew"] == 1 and c["whenUnsatisfiable"] == "ScheduleAnyway"
            assert c["labelSelector"]["matchLabels"].items() <= labels.items()
            assert c["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == role
        assert "podAffinity" not in pod_spec(d)["affinity"]


def test_the_base_has_no_budget_its_pods_share_one_node():
    # The ReadWriteOnce log volume pins web and scheduler to one node: a budget would only block that node's drain.
    docs = build(DEPLOY / "base")
    assert of_kind(docs, "PodDisruptionBudget") == []
    assert all("topologySpreadConstraints" not in pod_spec(d) for d in deployments(docs).values())


# --- the config's checksum -------------------------------------------------------------------------------------------

def pod_templates(docs):
    return [d["spec"]["template"]["spec"] for d in of_kind(docs, "Deployment") + of_kind(docs, "Job")]


@pytest.mark.parametrize("target", TARGETS)
def test_the_config_map_is_named_by_its_content_and_every_pod_reads_that_name(target):
    docs = rendered(target)
    cm = config_map(docs)
    assert cm["metadata"]["name"] == f"jobsite-config-{config_map_hash(cm['data'])}"
    for pod in pod_templates(docs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            refs = [e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e]
            assert refs == [cm["metadata"]["name"]], c["name"]


def test_a_changed_setting_renames_the_config_map_and_so_rolls_the_pods():
    base, example = rendered("base"), rendered("overlays/example")  # the example overlay changes settings
    assert config(base) != config(example)
    assert config_map(base)["metadata"]["name"] != config_map(example)["metadata"]["name"]
    for role in ROLES:
        assert pod_spec(deployments(base)[role]) != pod_spec(deployments(example)[role])


def test_the_hash_is_kustomizes():
    # `kubectl kustomize` of {A: "1", B: "two words"} names it cfg-5gttg69dkf.
    assert config_map_hash({"A": "1", "B": "two words"}) == "5gttg69dkf"
