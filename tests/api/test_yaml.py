"""POST /api/v1/jobs/ with a YAML job spec (like an mcli run YAML): the same fields as the JSON body."""

import pytest

from jobs.models import Job, JobEvent

from .conftest import JOBS_URL, assert_error_shape

SPEC = """\
# a job file as jobctl submit -f sends it
name: resnet
group: phusers
image: base-notebook
instance_type: gpu-1
command: |
  python train.py \\
    --epochs 3
env:
  EPOCHS: 3
  LR: "0.1"
replicas: 2
priority: high
preemptible: yes
"""


def post_yaml(client, text, content_type="application/yaml"):
    return client.post(JOBS_URL, text.encode(), content_type=content_type)


def assert_nothing_written():
    assert (Job.objects.count(), JobEvent.objects.count()) == (0, 0)


@pytest.mark.django_db
@pytest.mark.parametrize("content_type", ["application/yaml", "text/yaml", "application/x-yaml",
                                          "application/yaml; charset=utf-8"])
def test_submit_yaml(world, client_for, content_type):
    response = post_yaml(client_for("bob"), SPEC, content_type)
    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    assert (job.name, job.replicas, job.priority, job.preemptible) == ("resnet", 2, 100, True)
    assert job.command == "python train.py \\\n  --epochs 3\n"
    assert job.env == {"EPOCHS": "3", "LR": "0.1"}
    assert response.json()["id"] == job.pk


BAD_YAML = {
    "syntax": ("group: phusers\nimage: [base-notebook\n", "line 3"),
    "tab indent": ("group: phusers\n\timage: x\n", "line 2"),
    "empty": ("# nothing here\n", "empty"),
    "two documents": ("group: a\n---\ngroup: b\n", "single document"),
    "alias": ("env: &e {A: '1'}\nother: *e\n", "aliases"),
    "not utf-8": (b"group: \xff\xfe".decode("latin-1"), None),
}


@pytest.mark.django_db
@pytest.mark.parametrize("text,needle", BAD_YAML.values(), ids=BAD_YAML.keys())
def test_invalid_yaml_is_400_with_a_message(world, client_for, text, needle):
    body = text.encode("latin-1") if needle is None else text.encode()
    response = client_for("bob").post(JOBS_URL, body, content_type="application/yaml")
    data = assert_error_shape(response, 400)
    assert "YAML" in data["detail"]
    if needle:
        assert needle in data["detail"], data
    assert_nothing_written()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "text,fields",
    [
        ("- group: phusers\n", []),  # a list, not a mapping
        ("just a string\n", []),
        ("group: phusers\nimage: base-notebook\ninstance_type: gpu-1\ncommand: true\ngpus: 2\n", ["gpus"]),
        ("group: phusers\nimage: base-notebook\ninstance_type: gpu-1\ncommand: [a, b]\n", ["command"]),
        ("group: phusers\nimage: base-notebook\ninstance_type: gpu-1\ncommand: x\nreplicas: 2024-01-01\n",
         ["replicas"]),
        ("group: phusers\nimage: base-notebook\ninstance_type: gpu-1\ncommand: x\nenv: [A=1]\n", ["env"]),
        ("group: nope\nimage: base-notebook\ninstance_type: gpu-1\ncommand: x\n", ["group"]),
    ],
    ids=["list", "scalar", "unknown field", "command list", "date for a number", "env list", "unknown group"],
)
def test_yaml_with_wrong_fields_names_them(world, client_for, text, fields):
    data = assert_error_shape(post_yaml(client_for("bob"), text), 400, *fields)
    assert data["detail"]
    assert_nothing_written()
