"""Gang start of multi-replica jobs on Kubernetes.

With a gang scheduler (JOBSITE_K8S_GANG_SCHEDULING): the attempt's PodGroup, built by ``k8s_gang`` and created before
its pods, which carry its name and the scheduler's; it goes with the pods (stop, TTL cleanup, orphan reconcile), and
its API is called only when the setting is on. Without one: an attempt not wholly running within the preparing
timeout is requeued whole. With capacity checking: a job waits, without a pod, until every replica has a node.
"""

from __future__ import annotations

from datetime import timedelta

import kubernetes_validate
import pytest
from django.conf import settings as dj
from django.core.exceptions import ImproperlyConfigured
from kubernetes import client

from jobs import services
from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.backends.k8s_gang import (
    APIS,
    COSCHEDULING,
    COSCHEDULING_LABEL,
    VOLCANO,
    VOLCANO_ANNOTATION,
    GangSettings,
    build_podgroup,
    gang_pods,
    min_resources,
)
from scheduler.backends.k8s_manifest import PodDefaults, build_attempt
from scheduler.backends.kubernetes import GANG_RBAC_RULES, NETWORK_API_GROUP, RBAC_RULES
from scheduler.passes import schedule_pass
from scheduler.sync import housekeeping, orphans_delete, sync_jobs

from .conftest import NAMESPACE
from .helpers import admit_and_launch, backend, name_of, phase_is, settle
from .test_manifest import GIB, NOW, make_spec

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("k8s")]

MODES = [COSCHEDULING, VOLCANO]
LABELS = {"app.kubernetes.io/managed-by": "jobsite", "jobsite/job-id": "7", "jobsite/attempt": "2"}
# The spec fields each PodGroup API defines (scheduler-plugins v1alpha1 PodGroupSpec, Volcano v1beta1 PodGroupSpec).
SPEC_FIELDS = {
    COSCHEDULING: {"minMember", "minResources", "scheduleTimeoutSeconds"},
    VOLCANO: {"minMember", "minTaskMember", "minResources", "queue", "priorityClassName"},
}


@pytest.fixture
def custom(emulator) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(emulator.api_client())


@pytest.fixture
def gang(k8s, settings):
    """gang(mode, scheduler_name=""): turn gang scheduling on for the backend built next."""

    def turn_on(mode: str, scheduler_name: str = "") -> None:
        settings.JOBSITE_K8S_GANG_SCHEDULING = mode
        settings.JOBSITE_K8S_SCHEDULER_NAME = scheduler_name
        get_backend.cache_clear()

    return turn_on


def pod_names(core) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}


def podgroups(custom, mode: str) -> dict[str, dict]:
    api = APIS[mode]
    items = custom.list_namespaced_custom_object(api.group, api.version, NAMESPACE, api.plural)["items"]
    return {g["metadata"]["name"]: g for g in items}


def podgroup_path(mode: str) -> str:
    api = APIS[mode]
    return f"/apis/{api.group}/{api.version}/namespaces/{NAMESPACE}/{api.plural}"


def unschedulable(pod):
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


# --- the builders (pure) ---------------------------------------------------------------------------------------------

def built(spec, gang: GangSettings):
    service, pods = build_attempt(spec, PodDefaults(namespace="ns1"), now=NOW)
    pods = gang_pods(spec, pods, gang)
    return service, pods, build_podgroup(spec, pods, gang, namespace="ns1")


def test_a_coscheduling_podgroup_asks_for_every_replica_and_their_summed_requests():
    gang = GangSettings(mode=COSCHEDULING, schedule_timeout_seconds=240)
    service, pods, group = built(make_spec(replicas=2), gang)
    assert group == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "job-7-2", "namespace": "ns1", "labels": LABELS},
        "spec": {
            "minMember": 2,
            "minResources": {"cpu": "32000m", "memory": str(128 * GIB), "nvidia.com/gpu": "4"},
            "scheduleTimeoutSeconds": 240,
        },
    }
    assert group["metadata"]["name"] == service["metadata"]["name"]
    assert set(group["spec"]) <= SPEC_FIELDS[COSCHEDULING]
    for pod in pods:
        assert pod["metadata"]["labels"][COSCHEDULING_LABEL] == "job-7-2"
        assert VOLCANO_ANNOTATION not in pod["metadata"]["annotations"]
        assert "schedulerName" not in pod["spec"]  # scheduler-plugins may be the default scheduler
        kubernetes_validate.validate(pod, "1.33", strict=True)


def test_a_volcano_podgroup_and_pods_that_name_it_for_the_volcano_scheduler(settings):
    settings.JOBSITE_K8S_GANG_SCHEDULING = "volcano"
    settings.JOBSITE_K8S_SCHEDULER_NAME = ""
    gang = GangSettings.from_settings()
    assert gang.scheduler_name == "volcano"  # the default with volcano
    service, pods, group = built(make_spec(replicas=3), gang)
    assert group == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "job-7-2", "namespace": "ns1", "labels": LABELS},
        "spec": {"minMember": 3,
                 "minResources": {"cpu": "48000m", "memory": str(192 * GIB), "nvidia.com/gpu": "6"}},
    }
    assert set(group["spec"]) <= SPEC_FIELDS[VOLCANO]
    for pod in pods:
        assert pod["metadata"]["annotations"][VOLCANO_ANNOTATION] == "job-7-2"
        assert COSCHEDULING_LABEL not in pod["metadata"]["labels"]
        assert pod["spec"]["schedulerName"] == "volcano"
        kubernetes_validate.validate(pod, "1.33", strict=True)
    settings.JOBSITE_K8S_SCHEDULER_NAME = "volcano-gpu"
    assert GangSettings.from_settings().scheduler_name == "volcano-gpu"


def test_one_replica_gets_no_podgroup_but_the_configured_scheduler():
    for mode in MODES:
        _, [pod], group = built(make_spec(replicas=1), GangSettings(mode=mode, scheduler_name="gang-sched"))
        assert group is None
        assert pod["spec"]["schedulerName"] == "gang-sched"
        assert COSCHEDULING_LABEL not in pod["metadata"]["labels"]
        assert VOLCANO_ANNOTATION not in pod["metadata"]["annotations"]


def test_off_builds_no_podgroup_and_leaves_the_pods_as_k8s_manifest_made_them():
    spec = make_spec(replicas=2)
    _, plain = build_attempt(spec, PodDefaults(namespace="ns1"), now=NOW)
    _, pods, group = built(spec, GangSettings())
    assert group is None and pods == plain
    _, named, _ = built(spec, GangSettings(scheduler_name="custom-scheduler"))  # a scheduler name alone
    assert [p["spec"]["schedulerName"] for p in named] == ["custom-scheduler"] * 2
    assert [{**p, "spec": {k: v for k, v in p["spec"].items() if k != "schedulerName"}} for p in named] == plain


def test_min_resources_count_what_the_scheduler_reserves_per_pod():
    def pod(containers, inits=()):
        return {"spec": {"containers": [{"resources": r} for r in containers],
                         "initContainers": [{"resources": r} for r in inits]}}

    main = {"requests": {"cpu": "1500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi",
                                                                       "nvidia.com/gpu": "1"}}
    sidecar = {"requests": {"cpu": "100m"}}
    big_init = {"requests": {"cpu": "4", "memory": "64Mi"}}
    # Per pod: containers summed; an init container counts only where it asks more than they do; a limit alone
    # is a request.
    assert min_resources([pod([main, sidecar], [big_init]), pod([main])]) == {
        "cpu": "5500m", "memory": str(2 * GIB), "nvidia.com/gpu": "2"}
    assert min_resources([pod([{}])]) == {}


def test_an_unknown_mode_is_refused(settings):
    settings.JOBSITE_K8S_GANG_SCHEDULING = "kueue"
    with pytest.raises(ImproperlyConfigured, match="JOBSITE_K8S_GANG_SCHEDULING"):
        GangSettings.from_settings()
    settings.JOBSITE_K8S_GANG_SCHEDULING = " Volcano "
    assert GangSettings.from_settings().mode == VOLCANO


# --- on the emulator -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_the_podgroup_is_created_before_the_pods_and_cancel_deletes_it_with_them(
        mode, gang, submit, world, core, custom, kubelet, k8s, settings):
    settings.JOBSITE_PREPARING_TIMEOUT_SECONDS = 240
    gang(mode, scheduler_name="gang-scheduler")
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    group_name = f"job-{job.pk}-1"
    names = [name_of(job, rank=r) for r in (0, 1)]

    group = podgroups(custom, mode)[group_name]
    assert group["spec"]["minMember"] == 2
    assert group["spec"]["minResources"] == {"cpu": "32000m", "memory": str(128 * GIB), "nvidia.com/gpu": "4",
                                             "ephemeral-storage": str(20 * GIB)}  # JOBSITE_K8S_EPHEMERAL_STORAGE_*
    assert group["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "jobsite",
                                           "jobsite/job-id": str(job.pk), "jobsite/attempt": "1",
                                           "jobsite/installation": dj.JOBSITE_INSTALLATION_ID,
                                           "jobsite/attempt-uid": str(job.current_attempt_id)}
    assert group["spec"].get("scheduleTimeoutSeconds") == (240 if mode == COSCHEDULING else None)
    posts = [p for m, p, q, _ in k8s.emu.journal if m == "POST"]
    assert posts[0] == podgroup_path(mode)  # the group exists before any of its pods
    assert posts[1:] == [f"/apis/{NETWORK_API_GROUP}/v1/namespaces/{NAMESPACE}/networkpolicies",
                         f"/api/v1/namespaces/{NAMESPACE}/services"] + [f"/api/v1/namespaces/{NAMESPACE}/pods"] * 2
    for name in names:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        assert pod.spec.scheduler_name == "gang-scheduler"
        if mode == COSCHEDULING:
            assert pod.metadata.labels[COSCHEDULING_LABEL] == group_name
        else:
            assert pod.metadata.annotations[VOLCANO_ANNOTATION] == group_name
    job.current_attempt.refresh_from_db()
    assert job.current_attempt.backend_data["podgroup"] == group_name

    for name in names:
        kubelet.running(name)
    settle({n: phase_is("Running") for n in names})
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING
    services.job_cancel(job=job, by=world.users["lin"])
    sync_jobs()
    settle({n: None for n in names})
    assert podgroups(custom, mode) == {}
    with pytest.raises(client.ApiException):
        core.read_namespaced_service(group_name, NAMESPACE)
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED


def test_a_single_replica_job_gets_no_podgroup_even_with_gang_scheduling(gang, submit, core, custom, k8s):
    gang(VOLCANO)
    job = admit_and_launch(submit("bob", "gpu-1"))
    assert podgroups(custom, VOLCANO) == {}
    assert not [p for m, p, q, _ in k8s.emu.journal if m == "POST" and p.startswith("/apis/")
                and not p.startswith(f"/apis/{NETWORK_API_GROUP}/")]
    assert core.read_namespaced_pod(name_of(job), NAMESPACE).spec.scheduler_name == "volcano"


def test_without_gang_scheduling_no_podgroup_api_is_called(submit, core, k8s, world):
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    pod = core.read_namespaced_pod(name_of(job), NAMESPACE)
    assert COSCHEDULING_LABEL not in pod.metadata.labels
    assert VOLCANO_ANNOTATION not in (pod.metadata.annotations or {})
    assert pod.spec.scheduler_name in (None, "default-scheduler")
    services.job_cancel(job=job, by=world.users["lin"])
    sync_jobs()
    orphans_delete(backend=backend())
    assert not [p for m, p, q, _ in k8s.emu.journal if p.startswith("/apis/")
                and not p.startswith(f"/apis/{NETWORK_API_GROUP}/")]


def test_a_podgroup_that_already_exists_is_no_failure(gang, submit, core, custom, k8s):
    """The create goes through but its answer is lost: the retry meets 409 AlreadyExists, which means done."""
    gang(COSCHEDULING)
    k8s.emu.fail("POST", podgroup_path(COSCHEDULING) + "$", 500, times=1, after=True)
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    assert set(podgroups(custom, COSCHEDULING)) == {f"job-{job.pk}-1"}
    assert {name_of(job, rank=0), name_of(job, rank=1)} <= pod_names(core)
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING and job.reason != "ContainerCannotRun"


def test_a_cluster_without_the_podgroup_api_fails_the_job_without_creating_pods(gang, submit, core, k8s):
    gang(VOLCANO)
    k8s.emu.fail("POST", podgroup_path(VOLCANO) + "$", 404, times=1)
    job = submit("lin", "gpu-2", group="research", replicas=2)
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.FAILED, "ContainerCannotRun")
    assert "PodGroup (scheduling.volcano.sh/v1beta1)" in job.message and "404" in job.message
    assert pod_names(core) == set()
    assert not [p for m, p, q, _ in k8s.emu.journal if m == "POST" and p.startswith("/api/v1/")]


def test_ttl_cleanup_deletes_the_podgroup_with_the_pods(gang, submit, core, custom, kubelet, settings):
    gang(COSCHEDULING)
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2, ttl_seconds_after_finished=60))
    names = [name_of(job, rank=r) for r in (0, 1)]
    for name in names:
        kubelet.exited(name, 0)
    settle({n: phase_is("Succeeded") for n in names})
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert set(podgroups(custom, COSCHEDULING)) == {f"job-{job.pk}-1"}  # kept with the pods until the TTL
    housekeeping(now=job.expires_at + timedelta(seconds=1))
    job.refresh_from_db()
    assert job.cleaned_at is not None
    assert podgroups(custom, COSCHEDULING) == {} and pod_names(core) == set()


def test_reconcile_deletes_orphaned_podgroups_only(gang, submit, custom):
    gang(VOLCANO)
    live = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    api = APIS[VOLCANO]

    def stray(name, labels):
        custom.create_namespaced_custom_object(api.group, api.version, NAMESPACE, api.plural, {
            "apiVersion": api.api_version, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels}, "spec": {"minMember": 2}})

    managed = {"app.kubernetes.io/managed-by": "jobsite", "jobsite/installation": dj.JOBSITE_INSTALLATION_ID}
    stray("job-99999-1", {**managed, "jobsite/job-id": "99999", "jobsite/attempt": "1"})  # unknown job
    stray(f"job-{live.pk}-7", {**managed, "jobsite/job-id": str(live.pk), "jobsite/attempt": "7"})  # old attempt
    stray("someone-elses", {"jobsite/job-id": "5", "jobsite/attempt": "1"})  # not ours: never touched
    deleted = orphans_delete(backend=backend())
    assert sorted(d for d in deleted if d.startswith("podgroup/")) == sorted(
        ["podgroup/job-99999-1", f"podgroup/job-{live.pk}-7"])
    assert set(podgroups(custom, VOLCANO)) == {f"job-{live.pk}-1", "someone-elses"}


def rbac_calls(journal, agent_to_skip: str) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every call in the journal but the kubelet's."""
    used = set()
    for method, path, query, agent in journal:
        if agent == agent_to_skip:
            continue
        if path.startswith("/api/v1/"):
            group, parts = "", path.split("/")[3:]
        elif path.startswith("/apis/"):
            group, parts = path.split("/")[2], path.split("/")[4:]
        else:
            continue
        if parts[0] == "namespaces":
            parts = parts[2:]
        resource = parts[0] + ("/" + parts[2] if len(parts) > 2 else "")
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(method)
        if method == "GET":
            verb = "watch" if query.get("watch") == "true" else "get" if len(parts) > 1 else "list"
        used.add((group, resource, verb))
    return used


@pytest.mark.parametrize("mode", MODES)
def test_with_gang_scheduling_the_backend_calls_exactly_the_podgroup_rules_besides_its_own(
        mode, gang, submit, world, kubelet, k8s):
    kubelet.core.api_client.user_agent = "test-kubelet"
    gang(mode)
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    names = [name_of(job, rank=r) for r in (0, 1)]
    for n in names:
        kubelet.running(n)
    settle({n: phase_is("Running") for n in names})
    sync_jobs()
    services.job_cancel(job=job, by=world.users["lin"])
    sync_jobs()
    settle({n: None for n in names})
    sync_jobs()
    orphans_delete(backend=backend())
    backend().cleanup(job_id=job.pk, attempt_number=1, replicas=2)
    used = rbac_calls(k8s.emu.journal, "test-kubelet")
    group = APIS[mode].group
    assert {(r, v) for g, r, v in used if g == group} == {(r, v) for r, verbs in GANG_RBAC_RULES.items()
                                                          for v in verbs}
    assert {(r, v) for g, r, v in used if g == ""} <= {(r, v) for r, verbs in RBAC_RULES.items() for v in verbs}
    assert {g for g, r, v in used} == {"", NETWORK_API_GROUP, group}


# --- no gang scheduler: requeued whole -------------------------------------------------------------------------------

def test_a_partly_started_attempt_is_requeued_whole_and_relaunched_with_every_pod(
        submit, core, kubelet, k8s, settings, run_hooks):
    settings.JOBSITE_PREPARING_TIMEOUT_SECONDS = 30
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    rank0, rank1 = name_of(job, rank=0), name_of(job, rank=1)
    started = job.current_attempt.started_at
    kubelet.running(rank0)  # rank 0 holds its GPUs ...
    kubelet.patch(rank1, {"phase": "Pending", "conditions": [{  # ... rank 1 finds no node
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]})
    settle({rank0: phase_is("Running"), rank1: unschedulable})

    run_hooks(sync_jobs, now=started + timedelta(seconds=29))
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.PREPARING, "Pending")  # not RUNNING with one rank of two
    assert "Insufficient nvidia.com/gpu" in job.message

    run_hooks(sync_jobs, now=started + timedelta(seconds=31))  # past the preparing timeout
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.TERMINATING, "Requeued")
    run_hooks(sync_jobs, now=started + timedelta(seconds=31))  # the stop: every replica's pod
    assert pod_names(core) == set()  # both ranks deleted, the running one too
    settle({rank0: None, rank1: None})
    with pytest.raises(client.ApiException):
        core.read_namespaced_service(f"job-{job.pk}-1", NAMESPACE)
    run_hooks(sync_jobs, now=started + timedelta(seconds=32))
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.PENDING, "Requeued")
    assert job.retry_at is not None and "requeued" in job.message
    reasons = list(job.events.values_list("reason", flat=True))
    assert reasons[-2:] == ["Requeued", "Terminated"]
    assert job.events.get(reason="Requeued").message.startswith("Still preparing after 31 s: requeued (1/5)")

    schedule_pass(now=job.retry_at - timedelta(seconds=1))  # still backing off
    job.refresh_from_db()
    assert (job.phase, job.reason, job.current_attempt.number) == (Phase.PENDING, "Requeued", 1)
    run_hooks(schedule_pass, now=job.retry_at + timedelta(seconds=1))
    run_hooks(sync_jobs, now=job.retry_at + timedelta(seconds=1))
    job.refresh_from_db()
    assert (job.phase, job.current_attempt.number) == (Phase.PREPARING, 2)
    assert pod_names(core) == {name_of(job, 2, 0), name_of(job, 2, 1)}  # all ranks again, in a new attempt
    assert core.read_namespaced_service(f"job-{job.pk}-2", NAMESPACE)


# --- capacity checking: a node for every replica, or no pod at all ----------------------------------------------------

def gpu_node(core, name: str, gpus: int) -> None:
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                      "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)},
                                 "conditions": [{"type": "Ready", "status": "True"}]}})


def test_a_job_waits_without_a_pod_until_every_replica_has_a_node(submit, core, kubelet, settings, run_hooks):
    settings.JOBSITE_K8S_CHECK_CAPACITY = True
    gpu_node(core, "gpu-a", 2)
    gpu_node(core, "gpu-b", 2)
    busy = admit_and_launch(submit("bob", "gpu-2"))  # one node's GPUs taken
    gang_job = submit("lin", "gpu-2", group="research", replicas=2)  # one replica per node
    schedule_pass()
    sync_jobs()
    gang_job.refresh_from_db()
    assert (gang_job.phase, gang_job.reason) == (Phase.PENDING, "Capacity")
    assert gang_job.message == "waiting for cluster capacity: 2 GPU free, asks 4 GPU"
    assert gang_job.current_attempt is None
    assert pod_names(core) == {name_of(busy)}  # not one replica of the waiting job started

    kubelet.exited(name_of(busy), 0)
    settle({name_of(busy): phase_is("Succeeded")})
    run_hooks(sync_jobs)
    busy.refresh_from_db()
    assert busy.phase == Phase.SUCCEEDED
    run_hooks(schedule_pass)
    sync_jobs()
    gang_job.refresh_from_db()
    assert gang_job.phase == Phase.PREPARING
    assert sorted(p["node"] for p in gang_job.current_attempt.placement.values()) == ["gpu-a", "gpu-b"]
    assert {name_of(gang_job, rank=0), name_of(gang_job, rank=1)} <= pod_names(core)


def test_a_job_whose_replicas_no_cluster_state_can_hold_together_is_inadmissible(submit, core, settings):
    settings.JOBSITE_K8S_CHECK_CAPACITY = True
    gpu_node(core, "gpu-a", 2)  # holds one replica of gpu-2, never two
    job = submit("lin", "gpu-2", group="research", replicas=2)
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.INADMISSIBLE, "NoNodeFits")
    assert job.message == "no node of the cluster can ever hold all 2 replicas of this job"
    assert pod_names(core) == set()

