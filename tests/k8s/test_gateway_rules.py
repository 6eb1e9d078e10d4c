"""The gateway's pure rules: what a ticket must name, which pod it may open, and the exit code an exec's status
channel reports (table tests; end to end: test_gateway.py)."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.core import signing

from jobs import gateway_wire as wire
from scheduler.gateway.pods import Refused, exit_from_status, expected_labels, pod_check

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("raw, expected", [
    ({"metadata": {}, "status": "Success"}, (0, "")),
    ({"status": "Failure", "reason": "NonZeroExitCode", "message": "exit code 7",
      "details": {"causes": [{"reason": "ExitCode", "message": "7"}]}}, (7, "exit code 7")),
    ({"status": "Failure", "reason": "InternalError", "message": "container not found"},
     (None, "container not found")),
    ({"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "x"}]}},
     (None, "the command failed")),
    (None, (None, "the command's end was not reported")),
])
def test_the_exit_code_comes_from_the_status_channel(raw, expected):
    assert exit_from_status(b"" if raw is None else json.dumps(raw).encode()) == expected


@pytest.mark.parametrize("payload, error", [
    ({"job": 1, "attempt": 1, "rank": 0, "nonce": "n", "command": ["id"]}, None),
    ({"job": 1, "attempt": 1, "rank": 0, "nonce": "n", "port": 8888}, None),
    ({"job": 1, "attempt": 1, "rank": 0, "command": ["id"]}, "no nonce"),
    ({"job": 1, "attempt": 1, "nonce": "n", "command": ["id"]}, "no replica"),
    ({"job": "1", "attempt": 1, "rank": 0, "nonce": "n", "port": 80}, "no replica"),
    ({"job": 1, "attempt": 1, "rank": 0, "nonce": "n"}, "neither"),
    ({"job": 1, "attempt": 1, "rank": 0, "nonce": "n", "port": 80, "command": ["id"]}, "neither"),
    ({"job": 1, "attempt": 1, "rank": 0, "nonce": "n", "port": 70000}, "not a port"),
    ({"job": 1, "attempt": 1, "rank": 0, "nonce": "n", "command": []}, "not a command"),
    ({"job": 1, "attempt": 1, "rank": 0, "nonce": "n", "command": ["sh", 1]}, "not a command"),
    (["job", 1], "names nothing"),
])
def test_a_ticket_names_one_replica_and_one_command_or_port(payload, error):
    ticket = signing.dumps(payload, salt=wire.SALT)
    if error is None:
        assert wire.ticket_read(ticket) == payload
    else:
        with pytest.raises(wire.TicketRefused, match=error):
            wire.ticket_read(ticket)


def test_a_signed_ticket_reads_back_and_any_other_is_refused():
    ticket = wire.ticket_sign(job=3, attempt=2, rank=1, command=["sh"], tty=True, rows=30, cols=100)
    assert {k: v for k, v in wire.ticket_read(ticket).items() if k != "nonce"} == {
        "job": 3, "attempt": 2, "rank": 1, "command": ["sh"], "tty": True, "rows": 30, "cols": 100,
        "installation": settings.JOBSITE_INSTALLATION_ID}
    assert wire.ticket_read(ticket)["nonce"] != wire.ticket_read(wire.ticket_sign(job=3, attempt=2, rank=1,
                                                                                  port=80))["nonce"]
    for bad in (ticket[:-2] + "xx", "", "not a ticket", signing.dumps({"job": 3}, salt="another")):
        with pytest.raises(wire.TicketRefused):
            wire.ticket_read(bad)


POD = {"metadata": {"name": "job-5-2-1", "labels": expected_labels(installation="site", job=5, attempt=2, rank=1)},
       "status": {"phase": "Running"}}


@pytest.mark.parametrize("label, change, status", [
    ("this site's running replica", {}, None),
    ("another installation's", {"jobsite/installation": "other"}, 403),
    ("no installation label", {"jobsite/installation": None}, 403),
    ("not jobsite's", {"app.kubernetes.io/managed-by": None}, 403),
    ("another job", {"jobsite/job-id": "6"}, 403),
    ("another attempt", {"jobsite/attempt": "1"}, 403),
    ("another rank", {"jobsite/replica": "0"}, 403),
    ("not running", {"phase": "Succeeded"}, 409),
])
def test_the_gateway_opens_only_this_sites_running_replica_the_ticket_names(label, change, status):
    labels = {k: v for k, v in {**POD["metadata"]["labels"], **change}.items() if v is not None and k != "phase"}
    pod = {"metadata": {**POD["metadata"], "labels": labels},
           "status": {"phase": change.get("phase", "Running")}}
    check = lambda: pod_check(pod, installation="site", job=5, attempt=2, rank=1)  # noqa: E731
    if status is None:
        check()
    else:
        with pytest.raises(Refused) as refused:
            check()
        assert refused.value.status == status, label
