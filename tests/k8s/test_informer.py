"""The list+watch informer: against the emulator (cache, client-side filtering, errors, 410, relist, stop) and
against a scripted fake API server (tests/k8s/fake_apiserver.py) that sends what a real one sends: the 410
ERROR event mid-stream, bookmarks, HTTP 410, and journals every request with its arrival time."""

import time

import pytest
from kubernetes import client

from scheduler.backends.k8s_informer import Informer
from scheduler.backends.k8s_manifest import SELECTOR, is_managed

from . import fake_apiserver as fake
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


def test_request_relist_catches_what_the_watch_missed(emulator, core, make_informer):
    informer = make_informer(resync_seconds=0.3)
    core.create_namespaced_pod(NAMESPACE, pod("job-4-1-0"))
    wait_for(lambda: informer.get("job-4-1-0"), what="the pod")
    # Remove it from the emulator without any watch event (as if the DELETED event were lost).
    key = next(k for k in emulator.emu.objects if k[2] == "job-4-1-0")
    del emulator.emu.objects[key]
    informer.request_relist()
    wait_for(lambda: informer.get("job-4-1-0") is None, timeout=5, what="the relist dropping the pod")
    assert informer.relists == 2  # the resync alone does not list


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


# --- against the scripted fake API server ---------------------------------------------------------------------


@pytest.fixture
def server():
    s = fake.FakeApiServer(NAMESPACE).start()
    yield s
    s.stop()


@pytest.fixture
def make_fake_informer(server, informers):
    """An informer on the fake server with the production backoff (retry_base 0.5 s) unless told otherwise."""
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url)))

    def make(**kw):
        options = dict(name="pods", list_func=core.list_namespaced_pod, namespace=NAMESPACE)
        options.update(kw)
        informer = Informer(**options)
        informers.append(informer)
        informer.start()
        assert informer.wait_synced(10)
        return informer

    return make


def fake_pod(name, version):
    return fake.pod(name, version, namespace=NAMESPACE)


def names(objs):
    return sorted(o["metadata"]["name"] for o in objs)


def test_expired_event_relists_promptly_from_the_new_version(server, make_fake_informer):
    server.lists = [fake.PodList("10", [fake_pod("a", "5"), fake_pod("b", "6")]),
                    # Meanwhile: a changed, b deleted, c created; the watch never said so.
                    fake.PodList("20", [fake_pod("a", "15"), fake_pod("c", "18")])]
    server.watches = [[fake.event("MODIFIED", fake_pod("a", "11")), fake.expired("11", "19")]]
    informer = make_fake_informer()
    assert informer.lag_seconds() is not None and informer.last_activity is not None

    watches = wait_for(lambda: len(server.requests("watch")) >= 2 and server.requests("watch"), timeout=10,
                       what="a watch after the relist")
    lists = server.requests("list")
    assert len(lists) == 2
    (error,) = server.sent_of("ERROR")
    assert lists[1].at - error.at < 2.0, f"relisted {lists[1].at - error.at:.2f} s after the ERROR event"
    assert watches[0].resource_version == "10"
    assert watches[1].resource_version == "20"  # the new list's version, not the expired "11"
    assert lists[1].at < watches[1].at
    assert names(informer.items()) == ["a", "c"]
    assert informer.get("a")["metadata"]["resourceVersion"] == "15"
    assert (informer.relists, informer.expired, informer.errors) == (2, 1, 0)


def test_http_410_on_the_watch_relists(server, make_fake_informer):
    server.lists = [fake.PodList("10", [fake_pod("a", "5")]), fake.PodList("20", [fake_pod("b", "19")])]
    server.watches = [410]
    informer = make_fake_informer()
    watches = wait_for(lambda: len(server.requests("watch")) >= 2 and server.requests("watch"), timeout=10,
                       what="a watch after the relist")
    assert [w.resource_version for w in watches] == ["10", "20"]
    assert len(server.requests("list")) == 2
    assert names(informer.items()) == ["b"]
    assert (informer.relists, informer.expired) == (2, 1)


@pytest.mark.parametrize("answer", [410, [fake.expired()]], ids=["http-410", "error-event"])
def test_a_server_that_keeps_answering_410_is_not_hammered(server, make_fake_informer, answer):
    server.default_watch = answer
    informer = make_fake_informer()
    first = server.requests("list")[0].at
    wait_for(lambda: time.monotonic() > first + 3.5 and informer.relists >= 2, timeout=10, what="3 s of 410s")
    lists = [r for r in server.requests("list") if r.at <= first + 3.0]
    assert 2 <= len(lists) <= 6, f"{len(lists)} lists in 3 s"
    assert informer.expired >= len(lists) - 1


def test_a_watch_that_ends_at_once_backs_off(server, make_fake_informer):
    server.default_watch = []  # an empty stream, closed at once
    informer = make_fake_informer()
    first = wait_for(lambda: server.requests("watch"), timeout=10, what="the first watch")[0].at
    wait_for(lambda: time.monotonic() > first + 2.5, timeout=10, what="2 s of empty watches")
    watches = [r for r in server.requests("watch") if r.at <= first + 2.0]
    assert 2 <= len(watches) <= 5, f"{len(watches)} watches in 2 s"
    assert informer.relists == 1
    assert informer.errors >= len(watches) - 1


def test_an_error_event_resumes_the_watch_after_a_backoff(server, make_fake_informer):
    server.lists = [fake.PodList("10", [fake_pod("a", "5")])]
    server.watches = [[fake.event("ADDED", fake_pod("b", "11")),
                       fake.error_event(500, "InternalError", "etcd hiccup")]]
    informer = make_fake_informer(retry_base=0.01)
    watches = wait_for(lambda: len(server.requests("watch")) >= 2 and server.requests("watch"), timeout=10,
                       what="a second watch")
    assert [w.resource_version for w in watches[:2]] == ["10", "11"]  # resumed, not relisted
    assert len(server.requests("list")) == 1
    assert names(informer.items()) == ["a", "b"]
    assert (informer.errors, informer.expired, informer.relists) == (1, 0, 1)


def test_resync_delivers_the_cache_without_listing(server, make_fake_informer):
    server.lists = [fake.PodList("10", [fake_pod("a", "5"), fake_pod("b", "6")])]
    server.watches = [[fake.event("ADDED", fake_pod("c", "11")), fake.HOLD]]
    resyncs, relists = [], []
    informer = make_fake_informer(resync_seconds=0.3, on_resync=lambda items: resyncs.append(names(items)),
                                  on_relist=lambda: relists.append(1))
    wait_for(lambda: len(resyncs) >= 4 and resyncs[-1] == ["a", "b", "c"], timeout=10,
             what="resyncs with the watched pod")
    assert len(server.requests("list")) == 1
    assert len(server.requests("watch")) == 1  # the resync does not disturb the watch either
    assert len(relists) == 1 and informer.relists == 1
    assert informer.resyncs >= 4
    assert all(r in (["a", "b"], ["a", "b", "c"]) for r in resyncs)


def test_a_bookmark_moves_the_watch_version(server, make_fake_informer):
    server.lists = [fake.PodList("10", [fake_pod("a", "5")])]
    server.watches = [[fake.bookmark("42")]]  # then the server ends the watch
    informer = make_fake_informer()
    watches = wait_for(lambda: len(server.requests("watch")) >= 2 and server.requests("watch"), timeout=10,
                       what="the next watch")
    assert [w.resource_version for w in watches[:2]] == ["10", "42"]
    assert watches[0].query["allowWatchBookmarks"].lower() == "true"
    assert names(informer.items()) == ["a"]
    assert (informer.relists, informer.errors) == (1, 0)


@pytest.mark.parametrize("answer", [500, 410], ids=["http-500", "http-410"])
def test_stop_is_prompt_mid_backoff(server, make_fake_informer, answer):
    server.default_watch = answer
    informer = make_fake_informer(retry_base=60, retry_cap=60)  # the first backoff is 30 to 60 s
    wait_for(lambda: informer.errors + informer.expired >= 1, timeout=10, what="a failed watch")
    started = time.monotonic()
    informer.stop()
    assert time.monotonic() - started < 2
    assert not informer.running
    assert len(server.requests("watch")) == 1


def test_request_relist_cuts_a_backoff_short(server, make_fake_informer):
    server.default_watch = 500
    informer = make_fake_informer(retry_base=60, retry_cap=60)
    wait_for(lambda: informer.errors >= 1, timeout=10, what="a failed watch")
    informer.request_relist()
    wait_for(lambda: len(server.requests("list")) >= 2, timeout=5, what="the requested relist")
