"""Who may enter a job, and how the command is entered into its sandbox (pure and service tests)."""

import pytest

from jobs.choices import Phase
from jobs.models import Attempt, Job
from jobs.services import sessions
from scheduler.backends.local_exec import SETPRIV, SETSID, exec_argv

pytestmark = [pytest.mark.fast]


@pytest.mark.parametrize("label, privileged, tty, expect_head, expect_tail", [
    ("root: nsenter, then setpriv down to the sandbox's user with no capabilities", True, False,
     ["--root", "--wd", "--", SETPRIV, "--reuid", "65534", "--regid", "65533", "--clear-groups"],
     ["--inh-caps=-all", "--bounding-set=-all", "--", "id", "-u"]),
    ("not root: through the sandbox's user namespace, as its uid/gid", False, False,
     ["--root", "--wd", "--user", "--setuid=65534", "--setgid=65533", "--"], ["id", "-u"]),
    ("a terminal: the command leads a session on it (Ctrl-C reaches it, not nsenter)", False, True,
     ["--setgid=65533", "--", SETSID, "--ctty"], ["id", "-u"]),
])
def test_the_exec_command_line(label, privileged, tty, expect_head, expect_tail):
    argv = exec_argv(4242, ["id", "-u"], uid=65534, gid=65533, privileged=privileged, tty=tty)
    assert argv[:2] == ["/usr/bin/nsenter", "--target=4242"]
    assert {"--mount", "--pid", "--net", "--ipc", "--uts"} <= set(argv[:argv.index("--")])
    joined = " ".join(argv)
    assert " ".join(expect_head) in joined and joined.endswith(" ".join(expect_tail))


@pytest.mark.django_db
def test_only_the_group_sees_a_running_replica(submit, world):
    job = submit("bob", command="sleep 1")
    with pytest.raises(sessions.SessionRefused) as refused:
        sessions.session_target(user=world.users["bob"], job_id=job.pk)
    assert refused.value.status == 409 and "Submitted, not Running" in refused.value.message
    attempt = Attempt.objects.create(job=job, number=1, replicas=1, backend="local")
    Job.objects.filter(pk=job.pk).update(phase=Phase.RUNNING, current_attempt=attempt)
    for user in ("bob", "pan", "admin"):  # the owner, another member of the group, a superuser
        assert sessions.session_target(user=world.users[user], job_id=job.pk).attempt == attempt
    for user in ("eve",):  # in no group of the job's: as if it did not exist
        with pytest.raises(sessions.SessionRefused) as refused:
            sessions.session_target(user=world.users[user], job_id=job.pk)
        assert refused.value.status == 404
    with pytest.raises(sessions.SessionRefused) as refused:
        sessions.session_target(user=world.users["bob"], job_id=job.pk, rank=1)
    assert refused.value.status == 400
