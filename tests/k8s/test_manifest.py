"""The pods and Service an attempt becomes: resources, env, volumes, labels, scheduling, restart policy."""

import dataclasses
from datetime import UTC, datetime, timedelta

import kubernetes_validate
import pytest
from django.core.exceptions import ImproperlyConfigured

from scheduler.backend_factory import kubernetes_backend
from scheduler.backends.k8s_manifest import (
    PodDefaults,
    build_attempt,
    group_volume_source,
    merge_tolerations,
    resources,
)
from scheduler.values import LaunchReplica, LaunchSpec

from .conftest import NAMESPACE
from .pod_security import baseline_violations, restricted_violations

pytestmark = pytest.mark.fast

GIB = 1 << 30
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def make_spec(replicas=1, **kw):
    env = {"LR": "0.1", "JOB_ID": "7", "JOB_NAME": "train", "JOB_USER": "bob", "JOB_GROUP": "phusers",
           "JOB_ATTEMPT": "2"}
    base = dict(
        job_id=7, attempt_id=70, attempt_number=2, command="python train.py --epochs 3", image="pytorch/pytorch:2",
        replicas=[LaunchReplica(rank=r, node="", gpu_ids=(r,), env={**env, "RANK": str(r),
                                                                     "WORLD_SIZE": str(replicas),
                                                                     "CUDA_VISIBLE_DEVICES": str(r)})
                  for r in range(replicas)],
        job_name="train", job_type="training", user="bob", group="phusers",
        request={"gpu": 2, "cpu": 16000, "memory": 64 * GIB},
    )
    base.update(kw)
    return LaunchSpec(**base)


def env_of(pod):
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_gpu_pod_asks_for_the_instance_type_and_runs_the_command():
    service, pods = build_attempt(make_spec(), PodDefaults(namespace="ns1"), now=NOW)
    assert service is None
    [pod] = pods
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "job-7-2-0"
    assert meta["namespace"] == "ns1"
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "jobsite", "jobsite/job-id": "7",
                              "jobsite/attempt": "2", "jobsite/replica": "0", "jobsite/group": "phusers",
                              "jobsite/installation": "jobsite", "jobsite/attempt-uid": "70"}
    assert meta["annotations"] == {"jobsite/job-name": "train", "jobsite/user": "bob",
                                   "jobsite/hostfile": "127.0.0.1 slots=2\n",
                                   "jobsite/installation": "jobsite", "jobsite/attempt-uid": "70"}
    [c] = spec["containers"]
    assert c["image"] == "pytorch/pytorch:2"
    assert c["command"] == ["/bin/bash", "-c", "python train.py --epochs 3"]
    assert c["workingDir"] == "/home/jovyan"
    amounts = {"cpu": "16000m", "memory": str(64 * GIB), "nvidia.com/gpu": "2"}
    assert c["resources"] == {"requests": amounts, "limits": amounts}
    env = env_of(pod)
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and env["JOB_ID"] == "7" and env["LR"] == "0.1"
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin sets it
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")  # its own rank 0
    assert spec["restartPolicy"] == "Never"
    assert "hostname" not in spec and "subdomain" not in spec
    assert spec["automountServiceAccountToken"] is False
    assert {"name": "workdir", "emptyDir": {"sizeLimit": "5Gi"}} in spec["volumes"]
    assert {"name": "workdir", "mountPath": "/home/jovyan"} in c["volumeMounts"]
    assert "initContainers" not in spec  # nothing to link
    assert "nodeSelector" not in spec and "tolerations" not in spec and "imagePullSecrets" not in spec


def test_cpu_only_pod_has_no_gpu_resource():
    assert resources({"gpu": 0, "cpu": 500, "memory": GIB}) == {
        "requests": {"cpu": "500m", "memory": str(GIB)}, "limits": {"cpu": "500m", "memory": str(GIB)}}
    assert resources({}) == {}


# --- devices and /dev/shm: the job is a boundary ---------------------------------------------------------------------

def with_env(spec, extra):
    """The spec with ``extra`` in every replica's own env, as a job's ``env`` arrives there."""
    return dataclasses.replace(spec, replicas=[dataclasses.replace(r, env={**r.env, **extra}) for r in spec.replicas])


CPU_ONLY = {"gpu": 0, "cpu": 500, "memory": GIB}


@pytest.mark.parametrize("request_, job_env, expected", [
    pytest.param(CPU_ONLY, {}, {"NVIDIA_VISIBLE_DEVICES": "void"}, id="no GPUs: void"),
    pytest.param(CPU_ONLY, {"NVIDIA_VISIBLE_DEVICES": "all"}, {"NVIDIA_VISIBLE_DEVICES": "void"},
                 id="no GPUs: the job's 'all' loses"),
    pytest.param(CPU_ONLY, {"NVIDIA_MIG_CONFIG_DEVICES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all"},
                 {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_MIG_CONFIG_DEVICES": None,
                  "NVIDIA_MIG_MONITOR_DEVICES": None}, id="no GPUs: no MIG rights"),
    pytest.param({"gpu": 2}, {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                 {"NVIDIA_VISIBLE_DEVICES": None, "CUDA_VISIBLE_DEVICES": None},
                 id="GPUs: the device plugin's allocation, no override"),
    pytest.param({"gpu": 1}, {"NVIDIA_VISIBLE_DEVICES": "void"}, {"NVIDIA_VISIBLE_DEVICES": None},
                 id="GPUs: not even 'void' from the job"),
    pytest.param({"gpu": 1}, {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility,video"},
                 {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility,video", "NVIDIA_VISIBLE_DEVICES": None},
                 id="GPUs: driver capabilities (libraries, not devices) are the job's"),
])
def test_a_pod_gets_the_devices_of_its_gpu_limit_and_a_job_cannot_name_others(request_, job_env, expected):
    spec = with_env(make_spec(request=request_), job_env)
    _, [pod] = build_attempt(spec, PodDefaults(namespace="ns"), now=NOW)
    [c] = pod["spec"]["containers"]
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names))  # one value each: no later duplicate can win in the runtime
    env = env_of(pod)
    for name, value in expected.items():
        assert env.get(name) == value, name
    limits = c.get("resources", {}).get("limits", {})
    assert limits.get("nvidia.com/gpu") == (str(request_["gpu"]) if request_["gpu"] else None)
    assert env["LR"] == "0.1" and env["JOB_ID"] == "7"  # the job's other variables are untouched


@pytest.mark.parametrize("memory, fraction, cap, size", [
    pytest.param(64 * GIB, 0.5, None, str(32 * GIB), id="half the memory by default"),
    pytest.param(GIB, 0.25, None, str(GIB // 4), id="a configured fraction"),
    pytest.param(64 * GIB, 0.5, 8 * GIB, str(8 * GIB), id="capped"),
    pytest.param(GIB, 0.5, 8 * GIB, str(GIB // 2), id="under the cap"),
    pytest.param(0, 0.5, 2 * GIB, str(2 * GIB), id="no memory asked: the cap"),
    pytest.param(0, 0.5, None, None, id="no memory asked, no cap: the kubelet's default"),
])
def test_dev_shm_is_memory_sized_from_the_instance_type(memory, fraction, cap, size):
    request_ = {"gpu": 1, "cpu": 1000, **({"memory": memory} if memory else {})}
    defaults = PodDefaults(namespace="ns", shm_fraction=fraction, shm_max=cap)
    _, [pod] = build_attempt(make_spec(request=request_), defaults, now=NOW)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    expected = {"medium": "Memory", **({"sizeLimit": size} if size else {})}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": expected}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]
    kubernetes_validate.validate(pod, "1.33", strict=True)


def test_dev_shm_settings(settings):
    settings.JOBSITE_K8S_SHM_FRACTION, settings.JOBSITE_K8S_SHM_MAX = 0.25, "16Gi"
    defaults = PodDefaults.from_settings("ns")
    assert (defaults.shm_fraction, defaults.shm_max) == (0.25, 16 * GIB)
    settings.JOBSITE_K8S_SHM_FRACTION, settings.JOBSITE_K8S_SHM_MAX = 0.5, ""
    assert PodDefaults.from_settings("ns").shm_max is None
    for bad in (0, 1.5, -0.1):
        settings.JOBSITE_K8S_SHM_FRACTION = bad
        with pytest.raises(ImproperlyConfigured, match="JOBSITE_K8S_SHM_FRACTION"):
            PodDefaults.from_settings("ns")


def test_interactive_jobs_restart_in_place():
    _, [pod] = build_attempt(make_spec(job_type="interactive"), PodDefaults(namespace="ns"), now=NOW)
    assert pod["spec"]["restartPolicy"] == "Always"


def test_multi_replica_gets_a_headless_service_and_master_addr():
    service, pods = build_attempt(make_spec(replicas=3), PodDefaults(namespace="ns"), now=NOW)
    assert service["metadata"]["name"] == "job-7-2"
    assert service["metadata"]["namespace"] == "ns"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"app.kubernetes.io/managed-by": "jobsite", "jobsite/job-id": "7",
                                           "jobsite/attempt": "2", "jobsite/installation": "jobsite"}
    assert [p["metadata"]["name"] for p in pods] == ["job-7-2-0", "job-7-2-1", "job-7-2-2"]
    for rank, pod in enumerate(pods):
        assert pod["spec"]["hostname"] == f"job-7-2-{rank}"
        assert pod["spec"]["subdomain"] == "job-7-2"
        env = env_of(pod)
        assert env["MASTER_ADDR"] == "job-7-2-0.job-7-2"
        assert env["MASTER_PORT"] == "29500"
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "3")
        assert pod["metadata"]["labels"]["jobsite/replica"] == str(rank)
        # The service selects every replica of the attempt.
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_node_selector_and_tolerations_merge_over_the_defaults():
    defaults = PodDefaults(
        namespace="ns",
        node_selector={"pool": "gpu", "zone": "a"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        image_pull_secrets=("regcred",),
        workdir_size="20Gi",
    )
    spec = make_spec(node_selector={"zone": "b", "gpu-type": "a100"},
                     tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "a100", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}])
    _, [pod] = build_attempt(spec, defaults, now=NOW)
    s = pod["spec"]
    assert s["nodeSelector"] == {"pool": "gpu", "zone": "b", "gpu-type": "a100"}
    assert s["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                                {"key": "a100", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]
    assert s["affinity"] == defaults.affinity
    assert s["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "workdir", "emptyDir": {"sizeLimit": "20Gi"}} in s["volumes"]


def test_merge_tolerations_keeps_order_and_drops_duplicates():
    a = {"key": "k", "operator": "Exists"}
    assert merge_tolerations([a], [dict(a), {"key": "x", "value": "1"}]) == [a, {"key": "x", "value": "1"}]


def test_active_deadline_is_what_remains_plus_a_margin():
    _, [pod] = build_attempt(make_spec(deadline=NOW + timedelta(seconds=3600)), PodDefaults(namespace="ns"), now=NOW)
    assert pod["spec"]["activeDeadlineSeconds"] == 3600 + 60
    _, [late] = build_attempt(make_spec(deadline=NOW - timedelta(seconds=5)), PodDefaults(namespace="ns"), now=NOW)
    assert late["spec"]["activeDeadlineSeconds"] == 1 + 60


@pytest.mark.parametrize("path, source", [
    ("pvc:phusers-data", {"persistentVolumeClaim": {"claimName": "phusers-data"}}),
    ("phusers-data", {"persistentVolumeClaim": {"claimName": "phusers-data"}}),
    ("nfs://10.0.0.5/exports/phusers", {"nfs": {"server": "10.0.0.5", "path": "/exports/phusers"}}),
    ("/mnt/shared/phusers", {"hostPath": {"path": "/mnt/shared/phusers", "type": "Directory"}}),
])
def test_group_volume_sources(path, source):
    assert group_volume_source(path) == source


def test_group_volume_and_datasets_are_mounted_and_linked_from_the_working_dir():
    defaults = PodDefaults(namespace="ns", datasets=[
        {"name": "mnist", "volume": {"persistentVolumeClaim": {"claimName": "ds-mnist", "readOnly": True}}},
        {"name": "secret-ds", "volume": {"hostPath": {"path": "/data/secret"}}, "groups": ["research"]},
        {"name": "Bad Name; rm -rf /", "volume": {"emptyDir": {}}},
    ])
    _, [pod] = build_attempt(make_spec(group_volume="pvc:phusers-vol"), defaults, now=NOW)
    s = pod["spec"]
    [c] = s["containers"]
    volumes = {v["name"]: v for v in s["volumes"]}
    assert volumes["group"] == {"name": "group", "persistentVolumeClaim": {"claimName": "phusers-vol"}}
    assert volumes["dataset-mnist"]["persistentVolumeClaim"]["claimName"] == "ds-mnist"
    assert "dataset-secret-ds" not in volumes  # another group's dataset
    assert len([n for n in volumes if n.startswith("dataset-")]) == 1
    assert {"name": "group", "mountPath": "/project/phusers"} in c["volumeMounts"]
    assert {"name": "dataset-mnist", "mountPath": "/datasets/mnist", "readOnly": True} in c["volumeMounts"]
    [init] = s["initContainers"]
    assert init["image"] == "pytorch/pytorch:2"
    script = init["command"][-1]
    assert "ln -sfn /project/phusers /home/jovyan/phusers" in script
    assert "ln -sfn /datasets /home/jovyan/datasets" in script
    assert init["volumeMounts"] == [{"name": "workdir", "mountPath": "/home/jovyan"}]


@pytest.mark.slow
def test_launch_creates_the_objects_in_the_namespace_and_is_idempotent(settings, emulator, core, tmp_path):
    settings.JOBSITE_K8S_API_RETRY_BASE_SECONDS = 0.01
    backend = kubernetes_backend(emulator.api_client(), namespace=NAMESPACE, log_root=tmp_path)
    spec = make_spec(replicas=2)
    data = backend.launch(spec)
    assert data == {"namespace": NAMESPACE, "pods": ["job-7-2-0", "job-7-2-1"], "service": "job-7-2",
                    "networkpolicy": "job-7-2"}
    pod = core.read_namespaced_pod("job-7-2-1", NAMESPACE)
    assert pod.metadata.namespace == NAMESPACE
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    assert core.read_namespaced_service("job-7-2", NAMESPACE).spec.cluster_ip == "None"
    # A second launch of the same attempt (an answer lost, a restart) finds everything there: 409 is fine.
    assert backend.launch(spec) == data
    posts = [p for m, p, *_ in emulator.emu.journal if m == "POST"]
    assert posts.count(f"/api/v1/namespaces/{NAMESPACE}/pods") == 4


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
MNIST = {"name": "mnist", "volume": {"persistentVolumeClaim": {"claimName": "ds-mnist", "readOnly": True}}}


def test_job_pods_meet_pod_security_restricted_when_a_user_id_is_configured():
    defaults = PodDefaults(namespace="ns", run_as_user=1000, run_as_group=100, datasets=[MNIST])
    service, pods = build_attempt(make_spec(replicas=2, group_volume="pvc:phusers-vol"), defaults, now=NOW)
    for obj in [service, *pods]:
        kubernetes_validate.validate(obj, "1.33", strict=True)
    for pod in pods:
        spec = pod["spec"]
        assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True,
                                           "runAsUser": 1000, "runAsGroup": 100}
        assert [c["name"] for c in spec["initContainers"] + spec["containers"]] == ["workdir-links", "main"]
        for c in spec["initContainers"] + spec["containers"]:
            assert c["securityContext"] == CONTAINER_SECURITY
        assert restricted_violations(spec) == []


def test_job_pods_run_as_the_images_user_by_default_and_meet_baseline():
    # GPU images often run as root: without a configured uid only runAsNonRoot (and NFS) is short of `restricted`,
    # which is why the jobs namespace enforces `baseline` (deploy/base/namespaces.yaml).
    spec = make_spec(group_volume="nfs://10.0.0.5/exports/phusers")
    _, [pod] = build_attempt(spec, PodDefaults(namespace="ns", datasets=[MNIST]), now=NOW)
    kubernetes_validate.validate(pod, "1.33", strict=True)
    s = pod["spec"]
    assert s["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert baseline_violations(s) == []
    assert restricted_violations(s) == ["volume group: ['nfs']", "workdir-links: runAsNonRoot is not true",
                                        "main: runAsNonRoot is not true"]
    # A user id of 0 is root: runAsNonRoot is not claimed.
    _, [root] = build_attempt(make_spec(), PodDefaults(namespace="ns", run_as_user=0), now=NOW)
    assert root["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 0}


def test_a_node_path_group_volume_is_outside_baseline():
    _, [pod] = build_attempt(make_spec(group_volume="/mnt/shared/phusers"), PodDefaults(namespace="ns"), now=NOW)
    assert baseline_violations(pod["spec"]) == ["hostPath volume group"]


def test_the_job_user_id_comes_from_the_settings_when_they_have_one(settings):
    settings.JOBSITE_K8S_RUN_AS_USER = "1000"
    settings.JOBSITE_K8S_RUN_AS_GROUP = 100
    defaults = PodDefaults.from_settings("ns")
    assert (defaults.run_as_user, defaults.run_as_group) == (1000, 100)
    settings.JOBSITE_K8S_RUN_AS_USER = ""
    settings.JOBSITE_K8S_RUN_AS_GROUP = None
    defaults = PodDefaults.from_settings("ns")
    assert (defaults.run_as_user, defaults.run_as_group) == (None, None)


HOSTFILE_VOLUME = {"name": "hostfile", "downwardAPI": {"items": [
    {"path": "hostfile", "fieldRef": {"fieldPath": "metadata.annotations['jobsite/hostfile']"}}]}}
HOSTFILE_MOUNT = {"name": "hostfile", "mountPath": "/etc/jobsite", "readOnly": True}


def test_every_replica_gets_the_distributed_environment_and_the_hostfile():
    service, pods = build_attempt(make_spec(replicas=2), PodDefaults(namespace="ns"), now=NOW)
    hostfile = "job-7-2-0.job-7-2 slots=2\njob-7-2-1.job-7-2 slots=2\n"  # the instance type's 2 GPUs each
    for rank, pod in enumerate(pods):
        env = env_of(pod)
        assert {k: env[k] for k in env if k not in ("LR", "JOB_ID", "JOB_NAME", "JOB_USER", "JOB_GROUP",
                                                     "JOB_ATTEMPT")} == {
            "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(rank),
            "MASTER_ADDR": "job-7-2-0.job-7-2", "MASTER_PORT": "29500",
            "PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": "2",
            "PET_MASTER_ADDR": "job-7-2-0.job-7-2", "PET_MASTER_PORT": "29500",
            "JOB_HOSTFILE": "/etc/jobsite/hostfile",
        }
        # The hostfile is the pod's annotation, projected by the downward API at JOB_HOSTFILE: no ConfigMap.
        assert pod["metadata"]["annotations"]["jobsite/hostfile"] == hostfile
        assert HOSTFILE_VOLUME in pod["spec"]["volumes"]
        assert HOSTFILE_MOUNT in pod["spec"]["containers"][0]["volumeMounts"]
        kubernetes_validate.validate(pod, "1.33", strict=True)
    # Rank 0 listens on the port the headless Service names.
    assert service["spec"]["ports"][0]["port"] == 29500


def test_a_single_replica_is_its_own_rank_0_on_the_loopback_address():
    service, [pod] = build_attempt(make_spec(request={"cpu": 500}), PodDefaults(namespace="ns"), now=NOW)
    assert service is None
    env = env_of(pod)
    assert (env["RANK"], env["WORLD_SIZE"], env["NODE_RANK"], env["LOCAL_RANK"]) == ("0", "1", "0", "0")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"], env["PET_NNODES"]) == ("127.0.0.1", "29500", "1")
    assert env["PET_NPROC_PER_NODE"] == "1"  # no GPU: still one worker
    assert pod["metadata"]["annotations"]["jobsite/hostfile"] == "127.0.0.1 slots=1\n"
    assert HOSTFILE_VOLUME in pod["spec"]["volumes"]
    assert HOSTFILE_MOUNT in pod["spec"]["containers"][0]["volumeMounts"]


def test_the_schedulers_distributed_variables_win_over_the_jobs_own_env():
    spec = make_spec(replicas=2)
    spec.replicas[1].env.update(MASTER_ADDR="elsewhere", MASTER_PORT="1", NODE_RANK="5", PET_NNODES="9")
    _, pods = build_attempt(spec, PodDefaults(namespace="ns"), now=NOW)
    env = env_of(pods[1])
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("job-7-2-0.job-7-2", "29500")
    assert (env["NODE_RANK"], env["PET_NNODES"], env["LR"]) == ("1", "2", "0.1")
    assert [e["name"] for e in pods[1]["spec"]["containers"][0]["env"]].count("MASTER_ADDR") == 1
