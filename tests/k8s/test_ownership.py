"""Whose pod is it: every object carries the installation (JOBSITE_INSTALLATION_ID) and the attempt's uid; a 409 on
create adopts only this attempt's own pod, and orphan cleanup touches only this installation's objects."""

from __future__ import annotations

import pytest
from django.conf import settings as dj

from jobs.choices import Phase
from scheduler.launch import launch_spec
from scheduler.passes import schedule_pass
from scheduler.sync import orphans_delete, sync_jobs

from .conftest import NAMESPACE
from .helpers import admit_and_launch, backend, name_of, phase_is, settle

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("k8s")]


def ours() -> str:
    return dj.JOBSITE_INSTALLATION_ID


def make_pod(core, name, *, installation, attempt_uid, job_id, attempt=1, annotate=True, phase=None):
    marks = {"jobsite/installation": installation, "jobsite/attempt-uid": str(attempt_uid)}
    labels = {"app.kubernetes.io/managed-by": "jobsite", "jobsite/job-id": str(job_id),
              "jobsite/attempt": str(attempt), "jobsite/replica": "0", **marks}
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                     "annotations": dict(marks) if annotate else {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    if phase:
        core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {"phase": phase}})


def test_every_pod_carries_the_installation_and_the_attempt_uid(submit, core):
    job = admit_and_launch(submit("bob", "gpu-1"))
    pod = core.read_namespaced_pod(name_of(job), NAMESPACE)
    marks = {"jobsite/installation": ours(), "jobsite/attempt-uid": str(job.current_attempt_id)}
    assert marks.items() <= pod.metadata.labels.items()
    assert marks.items() <= pod.metadata.annotations.items()


def test_another_installations_pod_of_the_same_name_fails_the_attempt_and_is_left_alone(submit, core, settings):
    job = submit("bob", "gpu-1")
    make_pod(core, name_of(job), installation="staging", attempt_uid=12345, job_id=job.pk)
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.FAILED, "ContainerCannotRun")
    assert f"pod {name_of(job)} already exists and is not this attempt's" in job.message
    assert "'staging'" in job.message and "'12345'" in job.message
    pod = core.read_namespaced_pod(name_of(job), NAMESPACE)
    assert pod.metadata.labels["jobsite/installation"] == "staging"
    assert pod.metadata.deletion_timestamp is None


def test_a_pod_of_another_attempt_uid_of_this_installation_is_not_adopted(submit, core):
    # A database restored from an older backup: the same job id and attempt number, another attempt.
    job = submit("bob", "gpu-1")
    make_pod(core, name_of(job), installation=ours(), attempt_uid=987654, job_id=job.pk)
    schedule_pass()
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.FAILED and "'987654'" in job.message
    assert core.read_namespaced_pod(name_of(job), NAMESPACE).metadata.labels["jobsite/attempt-uid"] == "987654"


def test_the_attempts_own_pod_is_adopted_on_409(submit, core, k8s):
    # The create got through but its answer was lost: the retry meets the attempt's own pod.
    job = submit("bob", "gpu-1")
    schedule_pass()
    job.refresh_from_db()
    make_pod(core, name_of(job), installation=ours(), attempt_uid=job.current_attempt_id, job_id=job.pk)
    uid = core.read_namespaced_pod(name_of(job), NAMESPACE).metadata.uid
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING, job.message
    assert core.read_namespaced_pod(name_of(job), NAMESPACE).metadata.uid == uid  # adopted, not replaced


def test_labels_alone_are_not_enough_to_adopt(submit, core):
    job = submit("bob", "gpu-1")
    schedule_pass()
    job.refresh_from_db()
    make_pod(core, name_of(job), installation=ours(), attempt_uid=job.current_attempt_id, job_id=job.pk,
             annotate=False)
    sync_jobs()
    job.refresh_from_db()
    assert job.phase == Phase.FAILED and "not this attempt's" in job.message


def test_an_interactive_pod_that_ended_is_replaced_on_relaunch(submit, core, kubelet, k8s):
    job = admit_and_launch(submit("bob", "cpu-tiny", job_type="interactive"))
    name = name_of(job)
    kubelet.running(name)
    settle({name: phase_is("Running")})
    sync_jobs()
    # Evicted: the whole pod ended Failed, which restartPolicy Always does not restart.
    kubelet.patch(name, {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."})
    settle({name: phase_is("Failed")})
    k8s.emu.journal.clear()
    backend().launch(launch_spec(job, job.current_attempt))  # the relaunch in place of an interactive job
    pod_calls = [m for m, p, *_ in k8s.emu.journal if m in ("POST", "DELETE") and "/pods" in p]
    assert pod_calls == ["POST", "DELETE", "POST"]  # 409, the ended pod deleted, made anew
    pod = core.read_namespaced_pod(name, NAMESPACE)
    assert (pod.status.phase if pod.status else None) in (None, "Pending")  # not the Failed one, "adopted"
    assert pod.metadata.labels["jobsite/attempt-uid"] == str(job.current_attempt_id)


def test_orphan_cleanup_leaves_another_installations_pods_alone(submit, core):
    live = admit_and_launch(submit("bob", "gpu-1"))
    make_pod(core, "job-99999-1-0", installation=ours(), attempt_uid=1, job_id=99999)  # ours, orphaned
    make_pod(core, "job-88888-1-0", installation="staging", attempt_uid=2, job_id=88888)  # the other's
    make_pod(core, f"job-{live.pk}-5-0", installation="staging", attempt_uid=3, job_id=live.pk, attempt=5)
    deleted = orphans_delete(backend=backend())
    assert deleted == ["job-99999-1-0"]
    remaining = {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
    assert remaining == {name_of(live), "job-88888-1-0", f"job-{live.pk}-5-0"}


def test_a_second_installation_sees_only_its_own_pods(submit, core, settings):
    job = admit_and_launch(submit("bob", "gpu-1"))
    make_pod(core, "job-77777-1-0", installation="staging", attempt_uid=4, job_id=77777)
    settings.JOBSITE_INSTALLATION_ID = "staging"
    from scheduler.backend_factory import get_backend

    get_backend.cache_clear()
    other = backend()
    assert {p["metadata"]["name"] for p in other.managed_pods()} == {"job-77777-1-0"}
    assert orphans_delete(backend=other) == ["job-77777-1-0"]  # it deletes its own orphans only
    assert core.read_namespaced_pod(name_of(job), NAMESPACE).metadata.name == name_of(job)
