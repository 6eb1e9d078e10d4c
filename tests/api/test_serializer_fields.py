"""A job's serializers work their fields out from the model once per class (``FieldsBuiltOnce``), and each
instance still gets fields of its own."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from jobs.api.serializers.job_writes import JobSubmitSerializer
from jobs.api.serializers.jobs import EventSerializer, JobDetailSerializer, JobSerializer

pytestmark = pytest.mark.fast


def test_fields_are_worked_out_once_per_class_and_copied_for_each_instance(monkeypatch):
    class Probe(EventSerializer):  # a class of its own: nothing built yet
        pass

    calls = []
    original = serializers.ModelSerializer.get_fields
    monkeypatch.setattr(serializers.ModelSerializer, "get_fields", lambda self: calls.append(self) or original(self))

    first, second = Probe(), Probe()
    assert list(first.fields) == list(second.fields) == ["time", "type", "reason", "message", "attempt"]
    assert len(calls) == 1
    for name in first.fields:
        assert first.fields[name] is not second.fields[name]
        assert first.fields[name].parent is first and second.fields[name].parent is second


@pytest.mark.parametrize("first", [JobSerializer, JobDetailSerializer])
def test_a_subclass_and_its_parent_keep_their_own_fields(first):
    assert first().fields  # whichever is worked out first
    assert {"attempts", "events", "after", "waited_by"} <= set(JobDetailSerializer().fields)
    assert not {"attempts", "events", "after", "waited_by"} & set(JobSerializer().fields)


@pytest.mark.parametrize("serializer", [JobDetailSerializer, JobSubmitSerializer])
def test_two_requests_never_share_a_field_nor_a_nested_one(serializer):
    """Plain fields are copied shallowly (binding sets only their own attributes); a field holding another (the
    detail's attempts and events, a submit's lists) is copied deeply: two requests at once never share one, bound
    to the other's serializer and its context."""
    first, second = serializer(context={"who": 1}), serializer(context={"who": 2})
    holders = 0
    for name, field in first.fields.items():
        other = second.fields[name]
        assert field is not other and field.parent is first and other.parent is second, name
        assert field.context == {"who": 1} and other.context == {"who": 2}
        assert (field.field_name, field.source_attrs) == (other.field_name, other.source_attrs) == (
            name, field.source.split(".") if field.source != "*" else [])
        inner = getattr(field, "child", None)
        if inner is not None:
            holders += 1
            assert inner is not other.child and inner.parent is field and other.child.parent is other, name
            assert inner.root is first and other.child.root is second
    assert holders >= 1


@pytest.mark.django_db
def test_a_serializer_kept_for_the_thread_answers_each_job_as_a_new_one_would(world, submit):
    """``represented``: one serializer per class and thread, given another job and context each time; each answer
    is the one a serializer made for it alone gives, nothing of the last one left in it."""
    from jobs.api.serializers.fields import represented
    from jobs.models import Job
    from jobs.services import job_cancel

    first = submit("bob", name="first", env={"A": "1"})
    second = submit("pan", name="second", instance_type="gpu-1")
    job_cancel(job=Job.objects.get(pk=second.pk), by=world.users["pan"])
    plain, worded = {}, {"vocabulary": "mcli"}
    answers = [represented(JobDetailSerializer, Job.objects.get(pk=job.pk), context)
               for job, context in [(first, plain), (second, worded), (first, plain), (second, plain)]]
    for answer, (job, context) in zip(answers, [(first, plain), (second, worded), (first, plain), (second, plain)],
                                      strict=True):
        assert answer == JobDetailSerializer(Job.objects.get(pk=job.pk), context=context).data
    assert answers[0]["name"] == "first" and answers[0]["env"] == {"A": "1"} and len(answers[0]["events"]) == 1
    assert answers[1]["name"] == "second" and answers[1]["phase"] == "CANCELLED" and len(answers[1]["events"]) == 2
    assert "vocabulary_status" in answers[1] and "vocabulary_status" not in answers[3]
    assert answers[0] == answers[2]


def test_a_serializer_kept_for_the_thread_validates_each_body_as_a_new_one_would():
    """``validated``: an error of one body is not left for the next, nor a valid body's data."""
    from rest_framework.exceptions import ValidationError

    from jobs.api.serializers.fields import validated

    good = {"group": "g", "image": "i", "instance_type": "t", "command": "true", "env": {"A": "1"}}
    bad = {"group": "g", "image": "i", "command": 3, "replicas": 0, "colour": "red"}
    other = {"group": "h", "image": "j", "instance_type": "u", "command": "sleep 1", "replicas": 2}
    outcomes = []
    for body in (good, bad, other, bad, good):
        try:
            outcomes.append(("valid", dict(validated(JobSubmitSerializer, body))))
        except ValidationError as exc:
            outcomes.append(("invalid", exc.detail))
        fresh = JobSubmitSerializer(data=body)
        expected = ("valid", dict(fresh.validated_data)) if fresh.is_valid() else ("invalid", fresh.errors)
        assert outcomes[-1] == expected
    assert [kind for kind, _ in outcomes] == ["valid", "invalid", "valid", "invalid", "valid"]
    assert outcomes[2][1]["group"] == "h" and outcomes[2][1]["replicas"] == 2 and "env" not in outcomes[2][1]
    assert set(outcomes[1][1]) == {"instance_type", "command", "replicas", "colour"}
