"""End to end on the Kubernetes backend: the scheduler's own functions, the real client, the emulator as cluster.

JOBSITE_BACKEND=kubernetes with a kubeconfig pointing at the emulator (the ``k8s`` fixture); the tests play the
kubelet by patching pod status, and wait until the backend's watch has seen each change before syncing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings as dj
from django.utils import timezone
from kubernetes import client

from jobs import services
from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.backends.kubernetes import RBAC_RULES
from scheduler.passes import schedule_pass
from scheduler.sync import orphans_delete, sync_jobs
from scheduler.values import ReplicaState

from .conftest import NAMESPACE, wait_for
from .helpers import admit_and_launch, backend, has_waiting, name_of, phase_is, settle, sync_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("k8s")]


def k8s_event(core, name, pod, reason, message, type="Normal", count=1):
    core.create_namespaced_event(NAMESPACE, client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE),
        involved_object=client.V1ObjectReference(kind="Pod", name=pod, namespace=NAMESPACE),
        reason=reason, message=message, type=type, count=count,
        last_timestamp=datetime.now(UTC)))


def test_gpu_job_runs_to_success_with_events_and_a_log_that_outlives_the_pod(submit, core, kubelet, k8s):
    job = submit("bob", "gpu-1", command="python train.py", env={"LR": "0.5"})
    admit_and_launch(job)
    name = name_of(job)

    pod = core.read_namespaced_pod(name, NAMESPACE)
    main = pod.spec.containers[0]
    assert main.resources.limits["nvidia.com/gpu"] == "1"
    assert main.resources.requests == {"cpu": "8000m", "memory": str(32 << 30), "nvidia.com/gpu": "1",
                                       "ephemeral-storage": "10Gi"}
    env = {e.name: e.value for e in main.env}
    assert env["JOB_ID"] == str(job.pk) and env["JOB_USER"] == "bob" and env["JOB_GROUP"] == "phusers"
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and env["LR"] == "0.5"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert pod.metadata.labels["jobsite/job-id"] == str(job.pk)
    assert pod.spec.restart_policy == "Never"
    assert 86400 < pod.spec.active_deadline_seconds <= 86400 + 60
    attempt = job.current_attempt
    attempt.refresh_from_db()
    assert attempt.backend_data == {"namespace": NAMESPACE, "pods": [name], "service": "",
                                    "networkpolicy": f"job-{job.pk}-1"}
    assert not job.events.filter(reason="Started").exists()  # a pod created is no start: written once it runs

    kubelet.schedule(name)
    k8s_event(core, "ev-scheduled", name, "Scheduled", f"Successfully assigned {NAMESPACE}/{name} to gpu-node-1")
    kubelet.waiting(name, "ContainerCreating")
    settle({name: has_waiting("ContainerCreating")})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.PREPARING, "ContainerCreating")

    k8s.emu.logs[(NAMESPACE, name)] = "epoch 1\n"
    kubelet.running(name)
    settle({name: phase_is("Running")})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.RUNNING, "Running")
    log_file = backend().log_path(job_id=job.pk, attempt_number=1, rank=0)
    assert log_file.read_text() == "epoch 1\n"  # kept current while it runs

    k8s.emu.logs[(NAMESPACE, name)] = "epoch 1\nepoch 2\ndone\n"
    kubelet.exited(name, 0)
    settle({name: phase_is("Succeeded")})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.status, job.exit_code) == (Phase.SUCCEEDED, "Succeeded", 0)
    reasons = list(job.events.values_list("reason", flat=True))
    assert reasons[0] == "Submitted" and "Admitted" in reasons and "Started" in reasons
    assert reasons[-1] == "Completed"
    scheduled = job.events.get(reason="Scheduled")  # the pod's Kubernetes event, once however often synced
    assert scheduled.message.startswith("Successfully assigned") and scheduled.type == "Normal"
    assert log_file.read_text() == "epoch 1\nepoch 2\ndone\n"

    # The pod of a finished job belongs to no live attempt: reconcile archives its log and deletes it.
    k8s.emu.logs[(NAMESPACE, name)] = "epoch 1\nepoch 2\ndone\nbye\n"
    assert orphans_delete(backend=backend()) == [name, f"networkpolicy/job-{job.pk}-1"]
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_pod(name, NAMESPACE)
    assert gone.value.status == 404
    assert log_file.read_text() == "epoch 1\nepoch 2\ndone\nbye\n"


def test_the_archive_follows_the_log_and_never_shrinks(submit, kubelet, k8s):
    job = admit_and_launch(submit("bob", "cpu-tiny"))
    name = name_of(job)
    log_file = backend().log_path(job_id=job.pk, attempt_number=1, rank=0)
    kubelet.waiting(name, "ContainerCreating")
    settle({name: has_waiting("ContainerCreating")})
    sync_jobs()
    assert not log_file.exists()  # nothing to read before the container starts
    kubelet.running(name)
    settle({name: phase_is("Running")})
    for text in ["a\n", "a\nb\n", "b\n"]:  # the last: the kubelet rotated the log
        k8s.emu.logs[(NAMESPACE, name)] = text
        sync_jobs()
    assert log_file.read_text() == "a\nb\n"
    assert log_file == k8s.tmp_logs / f"job-{job.pk}" / "attempt-1" / "replica-0.log"


def test_kubernetes_events_are_deduplicated_by_count(submit, core, kubelet, k8s):
    job = admit_and_launch(submit("bob", "gpu-1"))
    name = name_of(job)
    k8s_event(core, "ev-pull", name, "Pulling", 'Pulling image "jupyter/base-notebook:latest"')
    k8s_event(core, "ev-backoff", name, "BackOff", "Back-off pulling image", type="Warning")
    kubelet.waiting(name, "ImagePullBackOff", "Back-off pulling image")
    backend().start()
    wait_for(lambda: len(backend().events_informer.items()) == 2, what="events in the cache")
    sync_jobs()
    sync_jobs()
    assert job.events.filter(reason="Pulling").count() == 1
    backoff = job.events.get(reason="BackOff")
    assert backoff.type == "Warning"
    core.patch_namespaced_event("ev-backoff", NAMESPACE, {"count": 3})
    wait_for(lambda: backend().events_informer.get("ev-backoff").get("count") == 3, what="count 3")
    sync_jobs()
    assert list(job.events.filter(reason="BackOff").values_list("message", flat=True)) == [
        "Back-off pulling image", "Back-off pulling image (x3)"]


def test_non_zero_exit_backs_off_with_its_exit_code(submit, kubelet):
    job = admit_and_launch(submit("bob", "cpu-tiny", backoff_limit=2))
    name = name_of(job)
    kubelet.exited(name, 3)
    settle({name: phase_is("Failed")})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.status, job.exit_code) == (Phase.BACKOFF, "Error", 3)
    assert "exited with code 3" in job.message


def test_oom_killed_fails_with_exit_137(submit, kubelet):
    job = admit_and_launch(submit("bob", "cpu-tiny", backoff_limit=0))
    name = name_of(job)
    kubelet.exited(name, 137, reason="OOMKilled")
    settle({name: phase_is("Failed")})
    [obs] = backend().observe(job_id=job.pk, attempt_number=1, replicas=1)
    assert (obs.state, obs.status, obs.exit_code) == (ReplicaState.EXITED, "OOMKilled", 137)
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason, job.exit_code) == (Phase.FAILED, "OOMKilled", 137)


def test_cancel_deletes_the_pods_and_keeps_the_log(submit, world, core, kubelet, k8s):
    job = admit_and_launch(submit("bob", "gpu-1"))
    name = name_of(job)
    kubelet.running(name)
    settle({name: phase_is("Running")})
    sync_jobs()
    k8s.emu.logs[(NAMESPACE, name)] = "working...\n"

    services.job_cancel(job=job, by=world.users["bob"])
    job.refresh_from_db()
    assert job.phase == Phase.TERMINATING
    sync_jobs()  # the scheduler stops the pods of a TERMINATING job
    deletes = [p for m, p, q, _ in k8s.emu.journal if m == "DELETE"]
    assert deletes == [f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"]  # its NetworkPolicy outlives it
    with pytest.raises(client.ApiException):
        core.read_namespaced_pod(name, NAMESPACE)
    settle({name: None})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.status, job.reason) == (Phase.CANCELLED, "Cancelled", "CancelledByUser")
    log_file = backend().log_path(job_id=job.pk, attempt_number=1, rank=0)
    assert log_file.read_text() == "working...\n"  # archived before the delete


def test_terminating_pod_shows_terminating_until_it_is_gone(submit, world, core, kubelet):
    job = admit_and_launch(submit("bob", "cpu-tiny"))
    name = name_of(job)
    kubelet.running(name)
    # A finalizer keeps the pod after its delete, as a kubelet does while the container stops.
    core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"finalizers": ["test/hold"]}})
    settle({name: phase_is("Running")})
    sync_jobs()
    services.job_cancel(job=job, by=world.users["bob"])
    sync_jobs()
    settle({name: lambda p: p["metadata"].get("deletionTimestamp")})
    [obs] = backend().observe(job_id=job.pk, attempt_number=1, replicas=1)
    assert (obs.state, obs.status) == (ReplicaState.RUNNING, "Terminating")
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.TERMINATING
    core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"finalizers": []}})
    settle({name: None})
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED


def test_multi_replica_job_gets_a_service_and_cancel_removes_everything(submit, world, core, kubelet, k8s):
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2, command="torchrun train.py"))
    names = [name_of(job, rank=r) for r in (0, 1)]
    svc = core.read_namespaced_service(f"job-{job.pk}-1", NAMESPACE)
    assert svc.spec.cluster_ip == "None"
    for rank, name in enumerate(names):
        pod = core.read_namespaced_pod(name, NAMESPACE)
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["MASTER_ADDR"] == f"job-{job.pk}-1-0.job-{job.pk}-1"
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "2")
        assert pod.spec.subdomain == f"job-{job.pk}-1" and pod.spec.hostname == name
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
        kubelet.running(name)
    settle({n: phase_is("Running") for n in names})
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING
    services.job_cancel(job=job, by=world.users["lin"])
    sync_jobs()
    settle({n: None for n in names})
    with pytest.raises(client.ApiException):
        core.read_namespaced_service(f"job-{job.pk}-1", NAMESPACE)
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED


def test_interactive_job_restarts_in_place(submit, kubelet):
    job = admit_and_launch(submit("bob", "cpu-tiny", job_type="interactive"))
    name = name_of(job)
    kubelet.running(name)
    settle({name: phase_is("Running")})
    sync_jobs()
    kubelet.patch(name, {"phase": "Running", "containerStatuses": [{
        "name": "main", "ready": False, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]})
    settle({name: has_waiting("CrashLoopBackOff")})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.RUNNING, "CrashLoopBackOff")
    assert "exited with code 1" in job.message


def test_err_image_pull_past_the_grace_fails_the_job(submit, kubelet, run_hooks):
    job = admit_and_launch(submit("bob", "gpu-1"))
    name = name_of(job)
    kubelet.waiting(name, "ErrImagePull", 'rpc error: manifest for "nope:latest" not found', ago=10)
    settle({name: has_waiting("ErrImagePull")})
    run_hooks(sync_jobs)
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.PREPARING, "ErrImagePull")
    assert "manifest" in job.message
    kubelet.started.clear()  # the kubelet started this pod long ago
    kubelet.waiting(name, "ImagePullBackOff", 'Back-off pulling image "nope:latest"', ago=121)
    settle({name: has_waiting("ImagePullBackOff")})
    job = sync_until(job, {Phase.FAILED}, run_hooks)
    assert (job.phase, job.status, job.reason) == (Phase.FAILED, "Fail", "FailedImagePull")
    # The failure is the Warning; that the pod is then gone is Normal, as Kubernetes types its events.
    assert job.events.get(reason="FailedImagePull").type == "Warning"
    assert job.events.get(reason="Terminated").type == "Normal"
    assert "Back-off pulling image" in job.message


def test_pod_evicted_over_its_own_limits_fails_the_job(submit, kubelet, run_hooks):  # node pressure: requeued
    job = admit_and_launch(submit("bob", "cpu-tiny"))
    name = name_of(job)
    kubelet.running(name)
    over = "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi."
    kubelet.patch(name, {"phase": "Failed", "reason": "Evicted", "message": over})
    settle({name: phase_is("Failed")})
    assert (sync_until(job, {Phase.FAILED}, run_hooks).reason, job.message) == ("Evicted", over)


def test_a_vanished_pod_requeues_the_attempt_at_once(submit, core, kubelet):
    """Deleted by someone else: nothing of it is left, which the API says (a 404), so no node-lost grace is waited
    out (issue 21): the attempt fails as NodeLost at once and the job goes back to its queue."""
    job = admit_and_launch(submit("bob", "cpu-tiny"))
    name = name_of(job)
    kubelet.running(name)
    settle({name: phase_is("Running")})
    sync_jobs()
    core.delete_namespaced_pod(name, NAMESPACE)  # someone else deleted it
    settle({name: None})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) in ((Phase.TERMINATING, "NodeLost"), (Phase.PENDING, "NodeLost"))
    assert f"pod {name} vanished; nothing of it is left" in job.message
    assert not job.events.filter(reason="NodeUnresponsive").exists()


def test_lost_node_makes_the_job_unknown(submit, kubelet):
    job = admit_and_launch(submit("bob", "cpu-tiny"))
    name = name_of(job)
    kubelet.running(name)
    kubelet.patch(name, {"phase": "Unknown"})
    settle({name: phase_is("Unknown")})
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.UNKNOWN and "unresponsive" in job.message


def test_lost_node_past_the_grace_force_deletes_the_pod_and_requeues(submit, kubelet, k8s, run_hooks):
    job = admit_and_launch(submit("bob", "cpu-tiny"))
    name = name_of(job)
    kubelet.running(name)
    kubelet.patch(name, {"phase": "Unknown"})
    settle({name: phase_is("Unknown")})
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.UNKNOWN
    later = job.updated_at + timedelta(minutes=10)
    run_hooks(sync_jobs, now=later)
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.TERMINATING, "NodeLost")  # its GPUs held until the pod is gone
    [delete] = [q for m, p, q, _ in k8s.emu.journal if m == "DELETE" and p.endswith(f"/pods/{name}")]
    assert delete["gracePeriodSeconds"] == "0"  # forced: the node will not confirm
    settle({name: None})
    run_hooks(sync_jobs, now=later)
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.PENDING, "NodeLost")


def test_reconcile_deletes_orphans_only(submit, core, kubelet, k8s):
    live = admit_and_launch(submit("bob", "gpu-1"))
    live_pod = name_of(live)

    def stray(name, job_id, attempt, rank=0, managed=True):
        labels = {"jobsite/job-id": str(job_id), "jobsite/attempt": str(attempt), "jobsite/replica": str(rank)}
        if managed:
            labels.update({"app.kubernetes.io/managed-by": "jobsite",
                           "jobsite/installation": dj.JOBSITE_INSTALLATION_ID})
        core.create_namespaced_pod(NAMESPACE, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}})

    stray("job-99999-1-0", 99999, 1)  # a job jobsite does not know
    stray(f"job-{live.pk}-7-0", live.pk, 7)  # an old attempt of a live job
    stray("someone-elses", 5, 1, managed=False)  # not ours: never touched
    core.create_namespaced_service(NAMESPACE, {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "job-99999-1", "namespace": NAMESPACE, "labels": {
            "app.kubernetes.io/managed-by": "jobsite", "jobsite/installation": dj.JOBSITE_INSTALLATION_ID,
            "jobsite/job-id": "99999", "jobsite/attempt": "1"}},
        "spec": {"clusterIP": "None", "selector": {"jobsite/job-id": "99999"}}})
    k8s.emu.logs[(NAMESPACE, "job-99999-1-0")] = "orphan output\n"
    kubelet.running("job-99999-1-0")

    deleted = orphans_delete(backend=backend())
    assert sorted(deleted) == sorted(["job-99999-1-0", f"job-{live.pk}-7-0", "job-99999-1"])
    remaining = {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
    assert remaining == {live_pod, "someone-elses"}
    assert backend().log_path(job_id=99999, attempt_number=1, rank=0).read_text() == "orphan output\n"


@pytest.mark.django_db(transaction=True)
def test_the_leaders_sync_round_deletes_orphans_and_nothing_else_does(settings, core, k8s):
    from scheduler.leader import SoleElector
    from scheduler.loop import SchedulerLoop

    settings.JOBSITE_K8S_RESYNC_SECONDS = 0.3
    settings.JOBSITE_SCHEDULER_INTERVAL = 0.1
    b = backend()
    b.start()
    assert b.pods_informer.wait_synced(5)
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "job-424242-1-0", "namespace": NAMESPACE, "labels": {
            "app.kubernetes.io/managed-by": "jobsite", "jobsite/installation": dj.JOBSITE_INSTALLATION_ID,
            "jobsite/job-id": "424242", "jobsite/attempt": "1", "jobsite/replica": "0"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    wait_for(lambda: b.pods_informer.get("job-424242-1-0"), what="the orphan in the cache")
    # The watch alone (any process) deletes nothing: its relists and resyncs only read.
    wait_for(lambda: b.pods_informer.resyncs + b.pods_informer.relists >= 3, timeout=10, what="resyncs")
    assert not [m for m, *_ in k8s.emu.journal if m == "DELETE"]
    loop = SchedulerLoop(elector=SoleElector())
    loop.start()
    try:
        wait_for(lambda: "job-424242-1-0" not in {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items},
                 timeout=15, what="the orphan deleted by the leader's sync round")
    finally:
        loop.stop()
        loop.join(10)


def test_launch_retries_server_errors(submit, core, k8s):
    k8s.emu.fail("POST", f"/api/v1/namespaces/{NAMESPACE}/pods$", 500, times=2)
    job = admit_and_launch(submit("bob", "gpu-1"))
    assert core.read_namespaced_pod(name_of(job), NAMESPACE).metadata.name == name_of(job)
    posts = [p for m, p, q, _ in k8s.emu.journal if m == "POST" and p.endswith("/pods")]
    assert len(posts) == 3
    attempt = job.current_attempt
    attempt.refresh_from_db()
    assert attempt.launched_at is not None and job.phase == Phase.PREPARING


def test_an_answer_lost_after_the_create_is_not_a_failure(submit, core, k8s):
    # The create goes through but its answer is a 500: the retry meets 409 AlreadyExists, which means done.
    k8s.emu.fail("POST", f"/api/v1/namespaces/{NAMESPACE}/pods$", 500, times=1, after=True)
    job = admit_and_launch(submit("bob", "gpu-1"))
    assert core.read_namespaced_pod(name_of(job), NAMESPACE)
    attempt = job.current_attempt
    attempt.refresh_from_db()
    assert attempt.launched_at is not None and job.phase == Phase.PREPARING


def test_a_rejected_pod_fails_the_job_as_container_cannot_run(submit, core, k8s):
    k8s.emu.fail("POST", f"/api/v1/namespaces/{NAMESPACE}/pods$", 422, times=1)
    job = submit("bob", "gpu-1")
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.FAILED, "ContainerCannotRun")
    assert "422" in job.message
    assert core.list_namespaced_pod(NAMESPACE).items == []


def test_a_rejected_second_replica_removes_the_first(submit, core, k8s):
    k8s.emu.fail("POST", f"/api/v1/namespaces/{NAMESPACE}/pods$", 403, times=1, skip=1)
    job = submit("lin", "gpu-1", group="research", replicas=2)
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.FAILED, "ContainerCannotRun")
    assert core.list_namespaced_pod(NAMESPACE).items == []
    with pytest.raises(client.ApiException):
        core.read_namespaced_service(f"job-{job.pk}-1", NAMESPACE)


def test_an_api_outage_during_launch_is_retried_by_sync(submit, core, k8s, settings):
    settings.JOBSITE_K8S_API_RETRIES = 2  # 3 tries a call
    get_backend.cache_clear()
    k8s.emu.fail("POST", f"/api/v1/namespaces/{NAMESPACE}/pods$", 503, times=4)
    job = submit("bob", "gpu-1")
    schedule_pass()
    sync_jobs()  # the launch gives up after 3 tries; the attempt stays PREPARING
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING
    sync_jobs()  # the 4th try fails too: still waiting, and saying why
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.PREPARING, "Pending")
    assert "waiting for the Kubernetes API" in job.message
    sync_jobs()  # the API is back: the pods are created
    assert core.read_namespaced_pod(name_of(job), NAMESPACE)
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING


def test_nodes_report_ready_allocatable_when_capacity_checking_is_on(core, settings):
    def node(name, gpu, ready=True, unschedulable=False):
        core.create_node({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "gpu"}},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"cpu": "63500m", "memory": "250Gi", "nvidia.com/gpu": str(gpu), "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})

    node("gpu-a", 8)
    node("gpu-b", 4, ready=False)
    node("gpu-c", 4, unschedulable=True)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-a"},
                      "status": {"allocatable": {"cpu": "16", "memory": "64Gi"},
                                 "conditions": [{"type": "Ready", "status": "True"}]}})
    assert backend().nodes() == []  # off by default: the scheduler skips capacity checks
    settings.JOBSITE_K8S_CHECK_CAPACITY = True
    nodes = {n.name: n for n in backend().nodes()}
    assert set(nodes) == {"gpu-a", "cpu-a"}
    assert nodes["gpu-a"].allocatable == {"gpu": 8, "cpu": 63500, "memory": 250 << 30}
    assert nodes["gpu-a"].free == nodes["gpu-a"].allocatable and nodes["gpu-a"].free_gpu_ids is None
    assert nodes["cpu-a"].allocatable == {"gpu": 0, "cpu": 16000, "memory": 64 << 30}
    settings.JOBSITE_K8S_DEFAULT_NODE_SELECTOR = {"pool": "gpu"}
    get_backend.cache_clear()
    assert [n.name for n in backend().nodes()] == ["gpu-a"]


def test_capacity_feeds_admission(submit, core, settings):
    settings.JOBSITE_K8S_CHECK_CAPACITY = True
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "small"},
                      "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "2"},
                                 "conditions": [{"type": "Ready", "status": "True"}]}})
    fits = submit("bob", "gpu-2")
    too_big = submit("lin", "gpu-4", group="research")
    schedule_pass()
    fits.refresh_from_db()
    too_big.refresh_from_db()
    assert fits.phase == Phase.PREPARING
    assert too_big.phase in (Phase.PENDING, Phase.INADMISSIBLE)


def test_the_backend_calls_exactly_what_the_role_grants(submit, world, core, kubelet, k8s):
    """Every API call the backend made in a full run, as RBAC (resource, verb) pairs, is in RBAC_RULES."""
    kubelet.core.api_client.user_agent = "test-kubelet"
    job = admit_and_launch(submit("lin", "gpu-2", group="research", replicas=2))
    names = [name_of(job, rank=r) for r in (0, 1)]
    for n in names:
        kubelet.running(n)
    k8s_event(core, "ev-1", names[0], "Started", "Started container main")
    settle({n: phase_is("Running") for n in names})
    wait_for(lambda: backend().events_informer.synced.is_set(), what="events synced")
    sync_jobs()
    services.job_cancel(job=job, by=world.users["lin"])
    sync_jobs()
    settle({n: None for n in names})
    sync_jobs()  # the pods are not in the cache: read directly, 404, gone
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED
    orphans_delete(backend=backend())
    backend().cleanup(job_id=job.pk, attempt_number=1, replicas=2)
    used = set()
    for method, path, query, agent in k8s.emu.journal:
        if agent == "test-kubelet" or not path.startswith("/api/v1/"):
            continue
        parts = path.split("/")[3:]  # after /api/v1
        if parts[0] == "namespaces":
            parts = parts[2:]
        resource = parts[0] + ("/" + parts[2] if len(parts) > 2 else "")
        named = len(parts) > 1
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(method)
        if method == "GET":
            verb = "watch" if query.get("watch") == "true" else "get" if named else "list"
        used.add((resource, verb))
    granted = {(r, v) for r, verbs in RBAC_RULES.items() for v in verbs}
    assert used == granted


def test_cancel_deletes_gracefully_and_forces_only_a_pod_stuck_past_the_documented_timeout(
        submit, world, core, kubelet, k8s, settings):
    settings.JOBSITE_TERMINATION_GRACE_SECONDS = 10  # the local backend's grace: no bearing on pods
    settings.JOBSITE_K8S_STUCK_TERMINATION_SECONDS = 600
    job = admit_and_launch(submit("bob", "gpu-1"))
    name = name_of(job)
    kubelet.running(name)
    # A finalizer keeps the pod after its delete, as a kubelet does while the container stops.
    core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"finalizers": ["test/hold"]}})
    settle({name: phase_is("Running")})
    sync_jobs()
    services.job_cancel(job=job, by=world.users["bob"])
    k8s.emu.journal.clear()
    sync_jobs()

    def deletes():
        return [q.get("gracePeriodSeconds") for m, p, q, _ in k8s.emu.journal if m == "DELETE" and p.endswith(name)]

    assert deletes() == ["30"]  # the job's grace period (the pod's terminationGracePeriodSeconds)
    settle({name: lambda p: p["metadata"].get("deletionTimestamp")})
    later = timezone.now() + timedelta(seconds=120)  # long past the local grace setting
    sync_jobs(now=later)
    sync_jobs(now=later)
    job.refresh_from_db()
    assert job.phase == Phase.TERMINATING  # holding its GPU until the pod is gone
    assert deletes() == ["30"]  # no second delete, no force
    sync_jobs(now=timezone.now() + timedelta(seconds=30 + 600 + 1))  # stuck past grace + the documented timeout
    assert deletes() == ["30", "0"]
    job.refresh_from_db()
    assert job.phase == Phase.TERMINATING
    core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"finalizers": []}})  # the kubelet confirms
    settle({name: None})
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.CANCELLED, "Cancelled")
