"""The instance type admin's Kubernetes fields: the GPU resource name and the capabilities its containers keep."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.models import InstanceType

pytestmark = pytest.mark.django_db

BASE = {"name": "ib-8", "display_name": "", "description": "", "gpu": "1", "cpu_cores": "4", "memory_gib": "16",
        "node_selector": "{}", "tolerations": "[]"}


@pytest.fixture
def admin_client(client, world):
    client.force_login(world.users["admin"])
    return client


def post(admin_client, **fields):
    return admin_client.post(reverse("admin:jobs_instancetype_add"), {**BASE, **fields})


def test_a_mig_resource_and_ipc_lock_are_saved_normalised(admin_client, world):
    response = post(admin_client, gpu_resource=" nvidia.com/mig-1g.10gb ", capabilities='["ipc_lock", "CAP_SYS_NICE"]')
    assert response.status_code == 302, response.content.decode()[:3000]
    it = InstanceType.objects.get(name="ib-8")
    assert (it.gpu_resource, it.capabilities) == ("nvidia.com/mig-1g.10gb", ["IPC_LOCK", "SYS_NICE"])
    page = admin_client.get(reverse("admin:jobs_instancetype_change", args=[it.pk])).content.decode()
    assert "nvidia.com/mig-1g.10gb" in page and "IPC_LOCK" in page


def test_empty_fields_mean_the_defaults(admin_client, world):
    assert post(admin_client, gpu_resource="", capabilities="[]").status_code == 302
    it = InstanceType.objects.get(name="ib-8")
    assert (it.gpu_resource, it.capabilities) == ("", [])


@pytest.mark.parametrize(("fields", "message"), [
    ({"capabilities": '["IPC_LOCK", "CAP_WHATEVER"]'}, "Unknown Linux capabilities: WHATEVER"),
    ({"capabilities": '"IPC_LOCK"'}, "A JSON list of Linux capability names"),
    ({"capabilities": "[1]"}, "A JSON list of Linux capability names"),
    ({"gpu_resource": "gpu"}, "An extended resource name such as nvidia.com/gpu"),
    ({"gpu_resource": "nvidia.com/mig 1g"}, "An extended resource name such as nvidia.com/gpu"),
])
def test_bad_input_is_an_inline_error_and_nothing_is_saved(admin_client, world, fields, message):
    response = post(admin_client, **fields)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not InstanceType.objects.filter(name="ib-8").exists()
