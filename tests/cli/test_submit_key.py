"""`jobctl submit` sends an `Idempotency-Key`, a fresh one per invocation."""

import uuid

import pytest

from jobs.models import Job, SubmitKey

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_submit_sends_its_own_idempotency_key(bob, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("group: phusers\nimage: base-notebook\ninstance_type: cpu-tiny\ncommand: 'true'\n")
    for args in (["-f", str(path)], ["-f", str(path)], ["-g", "phusers", "--image", "base-notebook",
                                                        "-t", "cpu-tiny", "--", "true"]):
        result = bob("submit", *args)
        assert result.returncode == 0, result.stderr

    keys = list(SubmitKey.objects.order_by("job_id").values_list("key", "job_id", "user__username"))
    assert [job_id for _, job_id, _ in keys] == list(Job.objects.order_by("pk").values_list("pk", flat=True))
    assert {user for _, _, user in keys} == {"bob"}
    assert len({key for key, _, _ in keys}) == 3  # the same file twice is two jobs: two invocations, two keys
    for key, _, _ in keys:
        uuid.UUID(key)
