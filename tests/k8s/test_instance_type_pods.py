"""An instance type's GPU resource and capabilities, and the job's priority, reach its pods on the emulator."""

from __future__ import annotations

import pytest

from jobs.choices import Priority
from jobs.models import InstanceType, Job

from .conftest import NAMESPACE
from .helpers import admit_and_launch, name_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("k8s")]


def test_a_mig_instance_type_with_ipc_lock_and_a_high_priority_class(submit, core, settings):
    settings.JOBSITE_K8S_PRIORITY_CLASSES = {"high": "jobs-high"}
    InstanceType.objects.filter(name="gpu-1").update(gpu_resource="nvidia.com/mig-1g.10gb", capabilities=["IPC_LOCK"])
    job = submit("bob", "gpu-1")
    Job.objects.filter(pk=job.pk).update(priority=Priority.HIGH)
    job = admit_and_launch(job)
    pod = core.read_namespaced_pod(name_of(job), NAMESPACE)
    [main] = pod.spec.containers
    assert main.resources.limits["nvidia.com/mig-1g.10gb"] == "1"
    assert "nvidia.com/gpu" not in main.resources.limits
    assert main.security_context.capabilities.add == ["IPC_LOCK"]
    assert main.security_context.capabilities.drop == ["ALL"]
    assert pod.spec.priority_class_name == "jobs-high"
    assert main.resources.requests["ephemeral-storage"] == settings.JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST


def test_the_default_gpu_resource_setting(submit, core, settings):
    settings.JOBSITE_K8S_GPU_RESOURCE = "amd.com/gpu"
    job = admit_and_launch(submit("bob", "gpu-1"))
    pod = core.read_namespaced_pod(name_of(job), NAMESPACE)
    assert pod.spec.containers[0].resources.limits["amd.com/gpu"] == "1"
    assert pod.spec.priority_class_name is None
