"""A pass reuses the last pass's decision while nothing it was made of changed (``scheduler.carry``): held jobs are
decided again as soon as what holds them changes, and a reused decision is always the one a fresh pass makes."""

import random
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import services
from jobs.choices import Phase, Priority, Resource
from jobs.models import Group, GroupQuota, Image, InstanceType, Job
from scheduler import carry
from scheduler.passes import decide_heads, refresh_nodes, schedule_pass
from scheduler.values import Node

pytestmark = [pytest.mark.fast, pytest.mark.django_db]
postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the carry is PostgreSQL's")


@pytest.fixture(autouse=True)
def forget():
    carry.pass_memory_reset()
    yield
    carry.pass_memory_reset()


def settle(**kw) -> bool:
    """Passes until one reuses the last one's decision (the passes after a change write what it changed)."""
    return any(schedule_pass(**kw).carried for _ in range(4))


def end(job: Job) -> None:
    """``job`` stops holding resources: a terminating one goes back to the queue (a preempted training job), a
    running one succeeds."""
    job.refresh_from_db()
    if job.phase == Phase.TERMINATING:
        services.job_transition(job=job, phase=Phase.PENDING, reason="Preempted", message="requeued")
    else:
        services.job_transition(job=job, phase=Phase.SUCCEEDED)


@postgresql_only
def test_a_job_held_by_its_users_quota_is_admitted_the_pass_after_its_users_usage_drops(submit):
    holder = submit("bob", "gpu-4", name="holder")  # bob's user quota (and the group's): 4 GPUs
    schedule_pass()
    held = submit("bob", "gpu-1", name="held")
    schedule_pass()
    assert Job.objects.get(pk=held.pk).reason == "UserQuota"
    assert settle()  # nothing changed: decided as before, without reading it again
    assert Job.objects.get(pk=held.pk).phase == Phase.PENDING

    end(holder)
    result = schedule_pass()
    assert not result.carried and result.admitted == [held.pk]
    assert Job.objects.get(pk=held.pk).phase == Phase.PREPARING


@postgresql_only
def test_a_job_waiting_on_its_victims_is_admitted_once_they_have_ended(submit):
    victim = submit("bob", "gpu-4", name="victim", preemptible=True, priority=Priority.LOW)
    schedule_pass()
    urgent = submit("pan", "gpu-4", name="urgent", priority=Priority.HIGH)
    assert schedule_pass().preempted == [victim.pk]
    assert settle()
    assert Job.objects.get(pk=urgent.pk).reason == "Preempting"

    end(victim)
    result = schedule_pass()
    assert not result.carried and result.admitted == [urgent.pk]
    assert Job.objects.get(pk=victim.pk).reason == "BlockedByQueueHead" or Job.objects.get(
        pk=victim.pk).phase == Phase.PENDING  # back in the queue, behind what it gave way to


@postgresql_only
def test_a_requeued_job_is_decided_again_once_the_clock_passes_its_delay(submit):
    job = submit("bob", "gpu-1", name="requeued")
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(retry_at=now + timedelta(seconds=30))
    schedule_pass(now=now)
    assert settle(now=now + timedelta(seconds=10))
    assert Job.objects.get(pk=job.pk).reason == "Requeued"
    result = schedule_pass(now=now + timedelta(seconds=31))
    assert not result.carried and result.admitted == [job.pk]


@postgresql_only
def test_a_pass_that_wrote_is_never_reused(submit):
    submit("bob", "gpu-4", name="a")
    result = schedule_pass()
    assert result.written and not result.carried
    assert not schedule_pass().carried  # its writes are what the next pass reads
    assert settle()


class Backend:
    """What a pass asks of a backend: its name and its nodes."""

    name = "carry-test"

    def __init__(self, nodes: list[Node]):
        self._nodes = nodes

    def nodes(self) -> list[Node]:
        return self._nodes


def nodes(count: int, gpus: int = 8) -> list[Node]:
    return [Node(f"n{i}", {"gpu": gpus}, {"gpu": gpus}, list(range(gpus))) for i in range(count)]


class RandomWorld:
    """A few groups with quotas, limits and user quotas, nodes, and jobs of every kind, changed at random."""

    def __init__(self, rng: random.Random, make_user):
        self.rng = rng
        self.users = [make_user() for _ in range(6)]
        self.image = Image.objects.create(name="carry", url="busybox")
        self.types = [InstanceType.objects.create(name=f"gpu-{g}", gpu=g) for g in (1, 2, 4)]
        self.groups = [Group.objects.create(name=f"g{i}") for i in range(3)]
        for g in self.groups:
            GroupQuota.objects.create(group=g, resource=Resource.GPU, quota=rng.choice([2, 4, 6]),
                                      limit=rng.choice([None, 8, 12]), user_quota=rng.choice([None, 2, 4]))
        self.backend = Backend(nodes(2, 4))  # fewer GPUs than the groups' limits: capacity binds too
        self.clock = timezone.now()
        self.made = 0

    def submit(self) -> None:
        itype = self.rng.choice(self.types)
        self.made += 1
        Job.objects.create(
            name=f"j{self.made}", group=self.rng.choice(self.groups), user=self.rng.choice(self.users),
            image=self.image, image_url=self.image.url, command="true", instance_type=itype, gpu=itype.gpu,
            priority=self.rng.choice(list(Priority)), preemptible=self.rng.random() < 0.4,
            queued_at=self.clock + timedelta(microseconds=self.made), phase=Phase.SUBMITTED, status="Submitted")

    def change(self) -> str:
        """One change of any kind, or none."""
        rng = self.rng
        kind = rng.choice(["none", "none", "none", "submit", "end", "cancel", "quota", "priority", "delay", "clock",
                           "stop", "nodes", "behind"])
        pending = list(Job.objects.filter(phase__in=[Phase.PENDING, Phase.SUBMITTED, Phase.INADMISSIBLE]))
        holding = list(Job.objects.filter(phase__in=[Phase.PREPARING, Phase.RUNNING, Phase.TERMINATING]))
        if kind == "submit":
            self.submit()
        elif kind == "end" and holding:
            end(rng.choice(holding))
        elif kind == "cancel" and pending:
            services.job_transition(job=rng.choice(pending), phase=Phase.CANCELLED, reason="CancelledByUser")
        elif kind == "quota":
            GroupQuota.objects.filter(group=rng.choice(self.groups)).update(
                quota=rng.choice([2, 4, 6, 8]), user_quota=rng.choice([None, 2, 4]))
        elif kind == "priority" and pending:
            Job.objects.filter(pk=rng.choice(pending).pk).update(priority=rng.choice(list(Priority)))
        elif kind == "delay" and pending:
            Job.objects.filter(pk=rng.choice(pending).pk).update(
                retry_at=self.clock + timedelta(seconds=rng.choice([5, 30])))
        elif kind == "clock":
            self.clock += timedelta(seconds=rng.choice([1, 20]))
        elif kind == "stop":
            group = rng.choice(self.groups)
            Group.objects.filter(pk=group.pk).update(queue_stopped=rng.random() < 0.3)
        elif kind == "nodes":
            self.backend._nodes = nodes(rng.choice([1, 2, 3]), rng.choice([4, 8]))
        elif kind == "behind":  # a job far behind its head: no pass reads it (nor should it matter)
            behind = [j for j in pending if j.reason == "BlockedByQueueHead"]
            if behind:
                Job.objects.filter(pk=behind[-1].pk).update(name="renamed", preemptible=not behind[-1].preemptible)
        return kind


def by_job(outcomes) -> dict:
    return {(o.job_id, o.verdict): o for o in outcomes}


@postgresql_only
@pytest.mark.parametrize("seed", range(6))
def test_a_reused_decision_is_the_one_a_fresh_pass_makes(seed, make_user):
    rng = random.Random(seed)
    world = RandomWorld(rng, make_user)
    for _ in range(rng.randint(10, 25)):
        world.submit()
    reused = 0
    for step in range(40):
        kind = world.change()
        refresh_nodes(world.backend)
        with transaction.atomic():
            carried = carry.memory.recall(world.backend.name, world.clock)
            _, fresh = decide_heads(world.backend, world.clock)
        if carried is not None:
            reused += 1
            assert by_job(carried.outcomes) == by_job(fresh), f"seed {seed}, step {step}, after {kind}"
        result = schedule_pass(backend=world.backend, now=world.clock)
        assert result.carried == (carried is not None)
    assert reused >= 5  # the comparison did happen
    assert connection.vendor == "postgresql"
