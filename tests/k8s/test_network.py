"""Job pods on Kubernetes are isolated from each other and from the site (DESIGN.md §4, "The job is a boundary").

The static policies of deploy/ (rendered for every target) and the NetworkPolicy the backend makes for each attempt
are read together (tests/k8s/netpol.py): the replicas of an attempt meet, nothing of another job, of an earlier
attempt or of the control plane reaches them, and they reach DNS and the internet but not the control plane, private
addresses or the cloud metadata service. Then, on the emulator, the backend creates each attempt's policy before its
pods, deletes it with them, deletes orphans, and fails a launch the cluster refuses it for.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes import client

from jobs import services
from jobs.choices import Phase
from scheduler.backends.k8s_manifest import PodDefaults, attempt_labels, build_attempt, build_network_policy
from scheduler.backends.kubernetes import NETWORK_API_GROUP, NETWORK_RBAC_RULES
from scheduler.passes import schedule_pass
from scheduler.sync import orphans_delete, sync_jobs

from .conftest import NAMESPACE
from .helpers import admit_and_launch, backend, name_of, phase_is, settle
from .netpol import allowed, connects, endpoint
from .test_deploy import CONTROL, JOBS, TARGETS, config, deployments, of_kind, pod_spec, rendered
from .test_gang import rbac_calls
from .test_manifest import NOW, make_spec

POLICIES_PATH = f"/apis/{NETWORK_API_GROUP}/v1/namespaces/{NAMESPACE}/networkpolicies"


def job_pods(spec, namespace: str, subnet: int) -> list[dict]:
    """The attempt's pods as policy endpoints, at 10.244.<subnet>.<10 + rank>."""
    _, pods = build_attempt(spec, PodDefaults(namespace=namespace), now=NOW)
    return [endpoint(p["metadata"]["namespace"], p["metadata"]["labels"], f"10.244.{subnet}.{10 + i}")
            for i, p in enumerate(pods)]


# --- the policies as a cluster reads them ----------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_job_pods_reach_their_own_replicas_dns_and_the_internet_but_no_other_job_nor_the_control_plane(target):
    docs = rendered(target)
    static = of_kind(docs, "NetworkPolicy")
    namespace = config(docs)["JOBSITE_K8S_NAMESPACE"]
    defaults = PodDefaults(namespace=namespace)
    job_a, job_b = make_spec(replicas=2), make_spec(replicas=2, job_id=8, user="lin", group="research")
    earlier_a, single = make_spec(replicas=2, attempt_number=1), make_spec(job_id=9)
    attempts = [job_a, job_b, earlier_a, single]
    policies = static + [build_network_policy(spec, defaults) for spec in attempts]
    (rank0, rank1), (other0, other1), (earlier0, _), (alone,) = (
        job_pods(spec, namespace, subnet) for subnet, spec in enumerate(attempts, start=1))

    # The replicas of an attempt: the rendezvous port and anything else, both ways.
    assert connects(policies, rank1, rank0, 29500) and connects(policies, rank0, rank1, 12345)
    # Another job, an earlier attempt of the same job, a single-replica job: neither way, refused at both ends.
    for stranger in (other0, other1, earlier0, alone):
        for source, target_ in ((stranger, rank0), (rank0, stranger)):
            assert not connects(policies, source, target_, 29500), (source, target_)
            assert not allowed(policies, source, target_, 29500, "Egress")
            assert not allowed(policies, target_, source, 29500, "Ingress")

    def labels(component):
        return deployments(docs)[component]["spec"]["template"]["metadata"]["labels"]

    web = endpoint(CONTROL, labels("web"), "10.244.20.10")
    scheduler = endpoint(CONTROL, labels("scheduler"), "10.244.20.11")
    worker = endpoint(CONTROL, labels("worker"), "10.244.20.12")
    postgres = endpoint(CONTROL, {"app": "postgresql"}, "10.244.20.13")
    redis = endpoint(CONTROL, {"app": "redis"}, "10.244.20.14")
    dns = endpoint("kube-system", {"k8s-app": "kube-dns"}, "10.244.0.2")
    ingress_controller = endpoint("ingress-nginx", {"app": "ingress-nginx"}, "10.244.30.3")
    gateway_labels = {"app.kubernetes.io/name": "jobsite", "app.kubernetes.io/component": "gateway"}
    gateway = endpoint(CONTROL, gateway_labels, "10.244.20.20")

    for pod in (rank0, alone):
        assert connects(policies, pod, dns, 53, "UDP") and connects(policies, pod, dns, 53, "TCP")
        assert connects(policies, pod, endpoint(None, None, "169.254.20.10"), 53, "UDP")  # NodeLocal DNSCache
        assert connects(policies, pod, endpoint(None, None, "151.101.0.223"), 443)  # e.g. a package index
        # Never the control plane, by pod or by address; nor the cloud metadata service or private networks.
        for other in (web, scheduler, worker, postgres, redis):
            for port in (8000, 9100, 5432, 6379):
                assert not allowed(policies, pod, other, port, "Egress"), (other, port)
        for ip, port in (("169.254.169.254", 80), ("10.0.0.5", 5432), ("172.20.0.1", 443), ("192.168.1.1", 6379),
                         ("100.64.0.10", 5432)):
            assert not connects(policies, pod, endpoint(None, None, ip), port), ip
        # Nothing of the control plane or outside reaches a job pod, but the site's own proxy (reserved).
        for source in (web, scheduler, worker, ingress_controller):
            assert not connects(policies, source, pod, 8888), source
        assert connects(policies, gateway, pod, 8888)
    # The proxy's labels elsewhere open nothing: in the jobs namespace (a job cannot label its pods anyway), or in
    # any other namespace.
    assert not connects(policies, endpoint(JOBS, gateway_labels, "10.244.9.9"), rank0, 8888)
    assert not connects(policies, endpoint("monitoring", gateway_labels, "10.244.30.9"), rank0, 8888)

    # Without the attempts' own policies (not yet created, or a scheduler that made none) the namespace's defaults
    # keep even the replicas of one job apart: isolation never depends on an object the scheduler may fail to make.
    assert not connects(static, rank1, rank0, 29500) and not connects(static, rank0, other0, 29500)
    [deny] = [p for p in static if p["metadata"]["namespace"] == JOBS and p["spec"]["podSelector"] == {}]
    assert "Ingress" in deny["spec"]["policyTypes"] and not deny["spec"].get("ingress")
    # The web port and the scheduler's metrics stay as they were.
    assert connects(policies, ingress_controller, web, 8000)
    assert connects(policies, web, scheduler, 9100)
    assert {p["containerPort"] for p in pod_spec(deployments(docs)["web"])["containers"][0]["ports"]} == {8000}


def test_an_attempts_policy_is_valid_selects_its_own_pods_only_and_carries_the_labels_reconcile_reads():
    defaults = PodDefaults(namespace="ns1")
    spec = make_spec(replicas=3)
    policy = build_network_policy(spec, defaults)
    kubernetes_validate.validate(policy, "1.33", strict=True)
    marks = {"jobsite/installation": "jobsite", "jobsite/attempt-uid": "70"}
    assert policy["metadata"] == {"name": "job-7-2", "namespace": "ns1", "labels": {**attempt_labels(7, 2), **marks},
                                  "annotations": marks}
    selector = policy["spec"]["podSelector"]
    _, pods = build_attempt(spec, defaults, now=NOW)
    _, others = build_attempt(make_spec(replicas=2, attempt_number=3), defaults, now=NOW)
    assert all(selector["matchLabels"].items() <= p["metadata"]["labels"].items() for p in pods)
    assert not any(selector["matchLabels"].items() <= p["metadata"]["labels"].items() for p in others)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": selector}]}]
    assert policy["spec"]["egress"] == [{"to": [{"podSelector": selector}]}]


# --- the backend: created with the pods, deleted with them -----------------------------------------------------------

@pytest.fixture
def networking(emulator) -> client.NetworkingV1Api:
    return client.NetworkingV1Api(emulator.api_client())


def policy_names(networking) -> set[str]:
    return {p.metadata.name for p in networking.list_namespaced_network_policy(NAMESPACE).items}


@pytest.mark.django_db
def test_each_attempt_gets_its_policy_before_its_pods_and_loses_it_with_them(
        submit, world, core, networking, kubelet, k8s):
    kubelet.core.api_client.user_agent = networking.api_client.user_agent = "test-kubelet"  # the test's own calls
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    names = [name_of(job, rank=r) for r in (0, 1)]
    policy = networking.read_namespaced_network_policy(f"job-{job.pk}-1", NAMESPACE)
    assert policy.spec.pod_selector.match_labels == {**attempt_labels(job.pk, 1),
                                                     "jobsite/installation": backend().defaults.installation}
    posts = [p for m, p, q, _ in k8s.emu.journal if m == "POST"]
    assert posts[0] == POLICIES_PATH and posts.count(f"/api/v1/namespaces/{NAMESPACE}/pods") == 2
    job.current_attempt.refresh_from_db()
    assert job.current_attempt.backend_data["networkpolicy"] == f"job-{job.pk}-1"

    for n in names:
        kubelet.running(n)
    settle({n: phase_is("Running") for n in names})
    sync_jobs()
    services.job_cancel(job=job, by=world.users["lin"])
    sync_jobs()  # the pods are deleted with their grace period...
    settle({n: None for n in names})
    # ...during which they may still finish a collective or a checkpoint together: the policy outlives them,
    assert policy_names(networking) == {f"job-{job.pk}-1"}
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED
    # until the leader's sweep finds it belongs to no live attempt.
    assert f"networkpolicy/job-{job.pk}-1" in orphans_delete(backend=backend())
    assert policy_names(networking) == set()
    backend().cleanup(job_id=job.pk, attempt_number=1, replicas=2)  # the TTL's cleanup: nothing left, 404 is fine
    # What it called of the networking API is exactly what the Role grants (list: reconcile).
    used = {(r, v) for g, r, v in rbac_calls(k8s.emu.journal, "test-kubelet") if g == NETWORK_API_GROUP}
    assert used == {(r, v) for r, verbs in NETWORK_RBAC_RULES.items() for v in verbs}


@pytest.mark.django_db
def test_the_ttl_cleanup_of_a_finished_job_deletes_its_policy_with_its_pods(submit, core, networking, kubelet, k8s):
    job = admit_and_launch(submit("bob", "gpu-1", ttl_seconds_after_finished=60))
    name = name_of(job)
    kubelet.exited(name, 0)
    settle({name: phase_is("Succeeded")})
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert policy_names(networking) == {f"job-{job.pk}-1"}  # kept while its ended pod is
    backend().cleanup(job_id=job.pk, attempt_number=1, replicas=1)
    assert policy_names(networking) == set() and core.list_namespaced_pod(NAMESPACE).items == []


@pytest.mark.django_db
def test_a_pod_without_gpus_gets_no_device_on_the_cluster_either(submit, core, k8s):
    job = admit_and_launch(submit("bob", "cpu-tiny", env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}))
    pod = core.read_namespaced_pod(name_of(job), NAMESPACE)
    main = pod.spec.containers[0]
    env = {e.name: e.value for e in main.env}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # picks libraries, not devices: kept
    assert "nvidia.com/gpu" not in (main.resources.limits or {})
    [shm] = [v for v in pod.spec.volumes if v.name == "dshm"]
    assert shm.empty_dir.medium == "Memory" and shm.empty_dir.size_limit == str(512 * 1024 * 1024)  # half of 1 GiB


@pytest.mark.django_db
def test_reconcile_deletes_the_policies_of_no_live_attempt_and_nothing_else(submit, networking, k8s):
    live = admit_and_launch(submit("bob", "gpu-1"))

    def stray(name, job_id, attempt, managed=True):
        labels = {"jobsite/job-id": str(job_id), "jobsite/attempt": str(attempt)}
        if managed:
            labels["app.kubernetes.io/managed-by"] = "jobsite"
            labels["jobsite/installation"] = backend().defaults.installation
        networking.create_namespaced_network_policy(NAMESPACE, {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"]}})

    stray("job-99999-1", 99999, 1)  # a job jobsite does not know
    stray(f"job-{live.pk}-7", live.pk, 7)  # an old attempt of a live job
    stray("someone-elses", 5, 1, managed=False)  # not ours: never touched
    deleted = orphans_delete(backend=backend())
    assert sorted(d for d in deleted if d.startswith("networkpolicy/")) == sorted(
        ["networkpolicy/job-99999-1", f"networkpolicy/job-{live.pk}-7"])
    assert policy_names(networking) == {f"job-{live.pk}-1", "someone-elses"}


@pytest.mark.django_db
def test_a_cluster_refusing_the_policy_fails_the_launch_and_no_pod_runs_unisolated(submit, core, networking, k8s):
    k8s.emu.fail("POST", POLICIES_PATH + "$", 403, times=1)
    job = submit("lin", "gpu-2", group="research", replicas=2)
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.FAILED, "ContainerCannotRun")
    assert "NetworkPolicy" in job.message and "403" in job.message
    assert core.list_namespaced_pod(NAMESPACE).items == []
    assert not [p for m, p, q, _ in k8s.emu.journal if m == "POST" and p.startswith("/api/v1/")]


@pytest.mark.django_db
def test_a_launch_the_cluster_rejects_after_the_policy_takes_the_policy_back(submit, core, networking, k8s):
    k8s.emu.fail("POST", f"/api/v1/namespaces/{NAMESPACE}/pods$", 422, times=1)
    job = submit("lin", "gpu-2", group="research", replicas=2)
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.FAILED, "ContainerCannotRun")
    assert policy_names(networking) == set() and core.list_namespaced_pod(NAMESPACE).items == []
