"""The list+watch informer against the emulator: cache, client-side filtering, errors, 410, resync, stop."""

import time

import pytest
from kubernetes import client

from scheduler.backends.k8s_informer import Informer
from scheduler.backends.k8s_manifest import SELECTOR, is_managed

from .conftest import NAMESPACE, wait_for

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def pod(name, managed=True, namespace=NAMESPACE):
    labels = {"app.kubernetes.io/managed-by": "jobsite" if managed else "someone-else"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


@pytest.fixture
def informers():
    made = []
    yield made
    for i in made:
        i.stop()


@pytest.fixture
def make_informer(core, informers):
    def make(**kw):
        options = dict(name="pods", list_func=core.list_namespaced_pod, namespace=NAMESPACE,
                       list_kwargs={"label_selector": SELECTOR}, accept=is_managed, retry_base=0.01)
        options.update(kw)
        informer = Informer(**options)
        informers.append(informer)
        informer.start()
        assert informer.wait_synced(5)
        return informer

    return make


def test_lists_then_watches_managed_pods_only(core, make_informer):
    core.create_namespaced_pod(NAMESPACE, pod("job-1-1-0"))
    core.create_namespaced_pod(NAMESPACE, pod("not-ours", managed=False))
    core.create_namespaced_pod("elsewhere", pod("job-9-1-0", namespace="elsewhere"))
    informer = make_informer()
    assert [p["metadata"]["name"] for p in informer.items()] == ["job-1-1-0"]  # the selector, client-side

    core.create_namespaced_pod(NAMESPACE, pod("job-2-1-0"))
    wait_for(lambda: informer.get("job-2-1-0"), what="ADDED from the watch")
    core.patch_namespaced_pod_status("job-2-1-0", NAMESPACE, {"status": {"phase": "Running"}})
    wait_for(lambda: (informer.get("job-2-1-0").get("status") or {}).get("phase") == "Running", what="MODIFIED")
    core.delete_namespaced_pod("job-1-1-0", NAMESPACE)
    wait_for(lambda: informer.get("job-1-1-0") is None, what="DELETED")
    # A label change that makes a pod not ours drops it.
    core.patch_namespaced_pod("job-2-1-0", NAMESPACE, {"metadata": {"labels": {
        "app.kubernetes.io/managed-by": "other"}}})
    wait_for(lambda: informer.get("job-2-1-0") is None, what="unmanaged pod dropped")
    assert informer.relists == 1


def test_stop_ends_a_blocked_watch_at_once(make_informer):
    informer = make_informer()
    wait_for(lambda: informer.watches >= 1, what="a watch")
    time.sleep(0.1)
    started = time.monotonic()
    informer.stop()
    assert time.monotonic() - started < 2
    assert not informer.running


def test_watch_errors_resume_without_relisting(emulator, core, make_informer):
    # The first two watch requests fail with 500: the informer backs off and watches again from where it was.
    emulator.emu.fail("GET", PODS + "$", 500, times=2, watch=True)
    informer = make_informer()
    wait_for(lambda: informer.errors >= 2 and informer.watches >= 3, what="two failed watches, then a third")
    core.create_namespaced_pod(NAMESPACE, pod("job-3-1-0"))
    wait_for(lambda: informer.get("job-3-1-0"), what="the pod after the errors")
    assert informer.relists == 1


def test_410_gone_relists(emulator, core, make_informer):
    emulator.emu.fail("GET", PODS + "$", 410, times=1, watch=True)
    informer = make_informer()
    wait_for(lambda: informer.relists == 2, what="a relist after 410")
    core.create_namespaced_pod(NAMESPACE, pod("job-3-1-0"))
    wait_for(lambda: informer.get("job-3-1-0"), what="the pod after the relist")


def test_request_relist_lists_again(core, make_informer):
    informer = make_informer()
    informer.request_relist()
    wait_for(lambda: informer.relists >= 2, what="a second list")


def test_periodic_resync_catches_what_the_watch_missed(emulator, core, make_informer):
    informer = make_informer(resync_seconds=0.3)
    core.create_namespaced_pod(NAMESPACE, pod("job-4-1-0"))
    wait_for(lambda: informer.get("job-4-1-0"), what="the pod")
    # Remove it from the emulator without any watch event (as if the DELETED event were lost).
    key = next(k for k in emulator.emu.objects if k[2] == "job-4-1-0")
    del emulator.emu.objects[key]
    wait_for(lambda: informer.get("job-4-1-0") is None, timeout=5, what="the resync dropping the pod")
    assert informer.relists >= 2


def test_list_errors_are_retried(emulator, core, make_informer):
    emulator.emu.fail("GET", PODS + "$", 503, times=2, watch=False)
    core.create_namespaced_pod(NAMESPACE, pod("job-5-1-0"))
    informer = make_informer()
    assert informer.get("job-5-1-0")
    assert informer.errors == 2


def test_events_index_by_pod(core, make_informer):
    def event(name, pod_name):
        return client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE),
            involved_object=client.V1ObjectReference(kind="Pod", name=pod_name, namespace=NAMESPACE),
            reason="Scheduled", message="assigned", type="Normal")

    core.create_namespaced_event(NAMESPACE, event("e1", "job-1-1-0"))
    informer = make_informer(name="events", list_func=core.list_namespaced_event, list_kwargs={}, accept=None,
                             index=lambda e: e["involvedObject"]["name"])
    core.create_namespaced_event(NAMESPACE, event("e2", "job-1-1-0"))
    core.create_namespaced_event(NAMESPACE, event("e3", "job-2-1-0"))
    wait_for(lambda: len(informer.indexed("job-1-1-0")) == 2 and informer.indexed("job-2-1-0"), what="events")
    assert [e["metadata"]["name"] for e in informer.indexed("job-2-1-0")] == ["e3"]
    core.delete_namespaced_event("e1", NAMESPACE)
    wait_for(lambda: len(informer.indexed("job-1-1-0")) == 1, what="the index after a delete")
