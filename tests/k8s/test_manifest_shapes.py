"""The shapes of a job pod that differ by instance type, priority and installation: the GPU resource (MIG slices),
capabilities kept, priorityClassName, ephemeral storage and /dev/shm."""

import dataclasses

import pytest
from django.core.exceptions import ImproperlyConfigured

from scheduler.backends.k8s_manifest import PodDefaults, build_attempt, resources

from .pod_security import baseline_violations
from .test_manifest import GIB, NOW, make_spec

pytestmark = pytest.mark.fast


def pod_of(spec, defaults=None):
    _, [pod] = build_attempt(spec, defaults or PodDefaults(namespace="ns"), now=NOW)
    return pod


@pytest.mark.parametrize(("instance_resource", "default", "expected"), [
    ("", "nvidia.com/gpu", "nvidia.com/gpu"),
    ("nvidia.com/mig-1g.10gb", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"),
    ("", "amd.com/gpu", "amd.com/gpu"),
    ("nvidia.com/mig-3g.40gb", "amd.com/gpu", "nvidia.com/mig-3g.40gb"),
])
def test_the_gpu_resource_is_the_instance_types_else_the_default(instance_resource, default, expected):
    pod = pod_of(make_spec(gpu_resource=instance_resource), PodDefaults(namespace="ns", gpu_resource=default))
    res = pod["spec"]["containers"][0]["resources"]
    assert res["limits"][expected] == res["requests"][expected] == "2"
    assert {k for k in res["limits"] if "/" in k} == {expected}  # no other GPU resource


@pytest.mark.parametrize(("capabilities", "add"), [
    ([], None),
    (["IPC_LOCK"], ["IPC_LOCK"]),
    (["cap_sys_nice", "IPC_LOCK", "IPC_LOCK"], ["IPC_LOCK", "SYS_NICE"]),
])
def test_capabilities_are_added_back_to_an_all_dropped_container(capabilities, add):
    context = pod_of(make_spec(capabilities=capabilities))["spec"]["containers"][0]["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["capabilities"].get("add") == add
    assert context["allowPrivilegeEscalation"] is False


def test_only_capabilities_beyond_baseline_need_a_laxer_jobs_namespace():
    # Pod Security `baseline` (the jobs namespace) allows a short list back (e.g. SYS_CHROOT); IPC_LOCK is not on
    # it, so an instance type with IPC_LOCK needs the jobs namespace at `privileged` (README, namespaces.yaml).
    assert baseline_violations(pod_of(make_spec(capabilities=["SYS_CHROOT"]))["spec"]) == []
    assert any("IPC_LOCK" in p for p in baseline_violations(pod_of(make_spec(capabilities=["IPC_LOCK"]))["spec"]))


@pytest.mark.parametrize(("priority", "classes", "expected"), [
    ("high", {"high": "jobs-high", "low": "jobs-low"}, "jobs-high"),
    ("low", {"high": "jobs-high", "low": "jobs-low"}, "jobs-low"),
    ("normal", {"high": "jobs-high"}, None),
    ("high", {}, None),
])
def test_priority_class_by_the_jobs_priority(priority, classes, expected):
    pod = pod_of(make_spec(priority=priority), PodDefaults(namespace="ns", priority_classes=classes))
    assert pod["spec"].get("priorityClassName") == expected


@pytest.mark.parametrize(("request_", "limit", "requests", "limits"), [
    ("", "", None, None),
    ("10Gi", "", "10Gi", None),
    ("10Gi", "50Gi", "10Gi", "50Gi"),
    ("", "50Gi", None, "50Gi"),
])
def test_ephemeral_storage_request_and_limit(request_, limit, requests, limits):
    defaults = PodDefaults(namespace="ns", ephemeral_request=request_, ephemeral_limit=limit)
    res = pod_of(make_spec(), defaults)["spec"]["containers"][0]["resources"]
    assert res["requests"].get("ephemeral-storage") == requests
    assert res["limits"].get("ephemeral-storage") == limits
    assert res["requests"]["memory"] == res["limits"]["memory"]  # still Guaranteed


def test_ephemeral_storage_alone_makes_resources():
    assert resources({}, ephemeral_request="1Gi") == {"requests": {"ephemeral-storage": "1Gi"}, "limits": {}}


def test_ephemeral_storage_settings_must_be_quantities(settings):
    settings.JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST = "lots"
    with pytest.raises(ImproperlyConfigured, match="JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST"):
        PodDefaults.from_settings("ns")


def test_settings_reach_the_pod_defaults(settings):
    settings.JOBSITE_K8S_GPU_RESOURCE = "nvidia.com/mig-1g.10gb"
    settings.JOBSITE_K8S_PRIORITY_CLASSES = {"high": "jobs-high", "low": ""}
    settings.JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST = "20Gi"
    settings.JOBSITE_K8S_EPHEMERAL_STORAGE_LIMIT = "100Gi"
    settings.JOBSITE_INSTALLATION_ID = "prod-eu"
    defaults = PodDefaults.from_settings("ns")
    assert (defaults.gpu_resource, defaults.priority_classes, defaults.ephemeral_request, defaults.ephemeral_limit,
            defaults.installation) == ("nvidia.com/mig-1g.10gb", {"high": "jobs-high"}, "20Gi", "100Gi", "prod-eu")


@pytest.mark.parametrize("bad", ["", "has space", "x" * 64, "-leading"])
def test_the_installation_id_must_be_a_label_value(settings, bad):
    settings.JOBSITE_INSTALLATION_ID = bad
    with pytest.raises(ImproperlyConfigured, match="JOBSITE_INSTALLATION_ID"):
        PodDefaults.from_settings("ns")


@pytest.mark.parametrize(("memory", "shm_max", "expected"), [
    (64 * GIB, None, str(32 * GIB)),
    (64 * GIB, 8 * GIB, str(8 * GIB)),
    (0, 8 * GIB, str(8 * GIB)),
])
def test_dev_shm_is_a_bounded_memory_volume(memory, shm_max, expected):
    request = {"gpu": 1, "cpu": 1000, **({"memory": memory} if memory else {})}
    pod = pod_of(make_spec(request=request), dataclasses.replace(PodDefaults(namespace="ns"), shm_max=shm_max))
    [shm] = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": expected}
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"
