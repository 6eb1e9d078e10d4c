"""Leader election by a coordination.k8s.io Lease, on the emulator, with a hand-moved clock."""

from __future__ import annotations

import kmock
import pytest
from kubernetes import client

from scheduler.leader import LeaseElector

from .conftest import NAMESPACE


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def coordination(emulator):
    emulator.emu.resources["coordination.k8s.io/v1/leases"] = kmock.ResourceInfo(kind="Lease", namespaced=True)
    return client.CoordinationV1Api(emulator.api_client())


def elector(coordination, who: str, clock: Clock, monkeypatch) -> LeaseElector:
    monkeypatch.setenv("POD_NAME", who)
    return LeaseElector(coordination, name="jobsite-scheduler", namespace=NAMESPACE, lease_seconds=10,
                        clock=clock)


def holder(coordination) -> str:
    return coordination.read_namespaced_lease("jobsite-scheduler", NAMESPACE).spec.holder_identity


def test_one_lease_holder_and_a_standby_that_takes_over_once_the_lease_is_stale(coordination, monkeypatch):
    clock = Clock()
    a = elector(coordination, "scheduler-a", clock, monkeypatch)
    b = elector(coordination, "scheduler-b", clock, monkeypatch)
    assert a.acquire_or_renew() is True  # creates the lease
    assert holder(coordination) == "scheduler-a"
    assert b.acquire_or_renew() is False
    for _ in range(5):  # a renews every 2 s: b never takes over
        clock.now += 2
        assert a.acquire_or_renew() is True
        assert b.acquire_or_renew() is False
    # a dies (kill -9: no release). b sees the same record for a whole lease duration, then takes it.
    clock.now += 8
    assert b.acquire_or_renew() is False
    clock.now += 2.5
    assert b.acquire_or_renew() is True
    lease = coordination.read_namespaced_lease("jobsite-scheduler", NAMESPACE)
    assert lease.spec.holder_identity == "scheduler-b" and lease.spec.lease_transitions == 1


def test_a_leader_that_cannot_renew_steps_down_before_its_lease_expires_for_others(coordination, emulator,
                                                                                  monkeypatch):
    clock = Clock()
    a = elector(coordination, "scheduler-a", clock, monkeypatch)
    assert a.acquire_or_renew() is True
    emulator.emu.fail("GET", "/leases/", 503, times=100)
    clock.now += 2
    assert a.acquire_or_renew() is True  # a blip: still well within its lease
    clock.now += 5  # 7 s since the last renewal > 2/3 of 10 s
    assert a.acquire_or_renew() is False


def test_a_clean_shutdown_hands_the_lease_over_at_once(coordination, monkeypatch):
    clock = Clock()
    a = elector(coordination, "scheduler-a", clock, monkeypatch)
    b = elector(coordination, "scheduler-b", clock, monkeypatch)
    assert a.acquire_or_renew() is True
    assert b.acquire_or_renew() is False
    a.release()
    assert b.acquire_or_renew() is True
    assert holder(coordination) == "scheduler-b"


