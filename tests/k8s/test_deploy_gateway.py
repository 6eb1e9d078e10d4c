"""deploy/'s gateway (gateway.yaml): the only holder of pods/exec and pods/portforward, with exactly the rights
scheduler/gateway calls, reached by the web alone; the web keeps no cluster rights. Rendered as test_deploy.py does."""

from __future__ import annotations

import pytest

from scheduler.gateway import RBAC_RULES

from .netpol import allowed, connects, endpoint
from .test_deploy import (
    CONTROL,
    JOBS,
    README,
    SETTINGS,
    TARGETS,
    bindings_of,
    config,
    deployments,
    get,
    of_kind,
    pod_spec,
    rendered,
    rules_as_map,
)

pytestmark = pytest.mark.fast

ROLE = "jobsite-gateway"
EXEC_RESOURCES = {"pods/exec", "pods/portforward", "pods/attach", "*"}


def labels_of(docs, name: str) -> dict[str, str]:
    return deployments(docs)[name]["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_role_grants_exactly_pods_get_exec_and_portforward_in_the_jobs_namespace(target):
    docs = rendered(target)
    role = get(docs, "Role", ROLE, JOBS)
    assert rules_as_map(role["rules"]) == RBAC_RULES
    assert RBAC_RULES == {"pods": {"get"}, "pods/exec": {"create", "get"}, "pods/portforward": {"create", "get"}}
    assert not any("resourceNames" in rule for rule in role["rules"])
    binding = get(docs, "RoleBinding", ROLE, JOBS)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ROLE, "namespace": CONTROL}]
    assert bindings_of(docs, ROLE) == {("RoleBinding", JOBS, ROLE)}  # nothing else, nowhere else

    # No other role may exec, attach or port-forward: the scheduler, the web, the worker have no such right.
    for kind in ("Role", "ClusterRole"):
        for other in of_kind(docs, kind):
            if other["metadata"]["name"] == ROLE:
                continue
            for rule in other["rules"]:
                assert not EXEC_RESOURCES & set(rule["resources"]), (other["metadata"]["name"], rule)
    for account in ("jobsite-web", "jobsite-worker", "jobsite-migrate"):
        assert bindings_of(docs, account) == set()
    web = pod_spec(deployments(docs)["web"])
    assert web["serviceAccountName"] == "jobsite-web" and web["automountServiceAccountToken"] is False


@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_runs_rungateway_with_its_own_account_behind_the_service_the_web_is_given(target):
    docs = rendered(target)
    gateway = deployments(docs)["gateway"]
    pod = pod_spec(gateway)
    assert pod["serviceAccountName"] == ROLE and pod["automountServiceAccountToken"] is True
    [main] = pod["containers"]
    assert main["command"][:3] == ["python", "manage.py", "rungateway"]
    port = main["ports"][0]
    assert main["command"][-1] == f"0.0.0.0:{port['containerPort']}"
    assert main["readinessProbe"]["tcpSocket"]["port"] == port["name"]
    assert labels_of(docs, "gateway")["app.kubernetes.io/component"] == "gateway"

    service = get(docs, "Service", "gateway", CONTROL)
    assert service["spec"]["selector"].items() <= labels_of(docs, "gateway").items()
    [service_port] = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    assert config(docs)["JOBSITE_GATEWAY_URL"] == f"gateway:{service_port['port']}"
    assert """"JOBSITE_GATEWAY_URL\"""" in SETTINGS
    assert "rungateway" in README and "pods/exec" in README


@pytest.mark.parametrize("target", TARGETS)
def test_only_the_web_reaches_the_gateway_and_the_gateway_reaches_job_pods(target):
    docs = rendered(target)
    policies = of_kind(docs, "NetworkPolicy")
    gateway = endpoint(CONTROL, labels_of(docs, "gateway"), "10.244.20.20")
    web = endpoint(CONTROL, labels_of(docs, "web"), "10.244.20.10")
    assert connects(policies, web, gateway, 8100)
    others = [endpoint(CONTROL, labels_of(docs, "scheduler"), "10.244.20.11"),
              endpoint(CONTROL, labels_of(docs, "worker"), "10.244.20.12"),
              endpoint(CONTROL, {"app": "postgresql"}, "10.244.20.13"),
              endpoint("ingress-nginx", {"app": "ingress-nginx"}, "10.244.30.3"),
              endpoint(JOBS, {"app.kubernetes.io/managed-by": "jobsite", "jobsite/job-id": "7"}, "10.244.1.10"),
              endpoint(None, None, "203.0.113.9")]
    for source in others:
        assert not allowed(policies, gateway, source, 8100, "Ingress"), source
    assert not connects(policies, web, gateway, 8000)  # its port only
    # The rest of the namespace still meets as before (allow-same-namespace leaves only the gateway out).
    assert connects(policies, web, endpoint(CONTROL, labels_of(docs, "scheduler"), "10.244.20.11"), 9100)
    assert connects(policies, others[0], others[2], 5432)
    # The reserved policy of the jobs namespace now matches the shipped gateway.
    job_pod = endpoint(JOBS, {"app.kubernetes.io/managed-by": "jobsite", "jobsite/job-id": "7"}, "10.244.1.10")
    assert connects(policies, gateway, job_pod, 8888)
