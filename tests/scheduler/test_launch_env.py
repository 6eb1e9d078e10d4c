"""The environment distributed frameworks expect: computed in one pure function, supplied with an address, a port
and a hostfile by each backend. Here: the function's table, the identity aliases, and real processes of the local
backend; the Kubernetes pods are in tests/k8s/test_manifest.py, real PyTorch in tests/e2e/test_distributed_torch.py.
"""

import re
import time
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.backends.base import distributed_env, hostfile_text, replica_launch_env
from scheduler.launch import replica_env
from scheduler.passes import schedule_pass
from scheduler.sync import sync_jobs
from scheduler.values import LaunchReplica, LaunchSpec, ReplicaState
from tests import waiting

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
RENDEZVOUS = {"master_addr": "10.0.0.1", "master_port": 29400, "hostfile": "/etc/hosts.mpi"}


@pytest.mark.parametrize("replicas, rank, gpus, nproc", [
    (1, 0, 0, "1"),  # a CPU job is still one worker
    (1, 0, 1, "1"),
    (2, 0, 0, "1"),
    (2, 1, 0, "1"),
    (2, 1, 4, "4"),  # torchrun starts one worker per GPU of the replica
    (8, 7, 8, "8"),
])
def test_distributed_env_table(replicas, rank, gpus, nproc):
    assert distributed_env(rank=rank, replicas=replicas, gpus=gpus, **RENDEZVOUS) == {
        "RANK": str(rank),
        "WORLD_SIZE": str(replicas),
        "LOCAL_RANK": "0",  # one process per replica
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": str(rank),  # one replica per node
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "PET_NNODES": str(replicas),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": nproc,
        "PET_MASTER_ADDR": "10.0.0.1",
        "PET_MASTER_PORT": "29400",
        "JOB_HOSTFILE": "/etc/hosts.mpi",
    }


@pytest.mark.parametrize("hosts, gpus, text", [
    (["127.0.0.1"], 0, "127.0.0.1 slots=1\n"),
    (["a.svc", "b.svc"], 2, "a.svc slots=2\nb.svc slots=2\n"),
    (["h"] * 3, 1, "h slots=1\nh slots=1\nh slots=1\n"),
])
def test_hostfile_has_one_line_per_replica_with_its_gpu_slots(hosts, gpus, text):
    assert hostfile_text(hosts, gpus=gpus) == text


def spec_of(replicas: int, gpus: int = 1, command: str = "true", **env: str) -> LaunchSpec:
    return LaunchSpec(
        job_id=7, attempt_id=70, attempt_number=2, command=command, image="",
        replicas=[LaunchReplica(rank=r, node="", gpu_ids=tuple(range(r * gpus, (r + 1) * gpus)),
                                env={"JOB_ID": "7", **env}) for r in range(replicas)],
        request={"gpu": gpus, "cpu": 500},
    )


def test_a_replica_keeps_its_own_env_and_the_schedulers_variables_win():
    spec = spec_of(2, gpus=2, LR="0.5", RANK="9", MASTER_PORT="1", NODE_RANK="3")
    env = replica_launch_env(spec, spec.replicas[1], **RENDEZVOUS)
    assert (env["LR"], env["JOB_ID"]) == ("0.5", "7")
    assert (env["RANK"], env["NODE_RANK"], env["MASTER_PORT"]) == ("1", "1", "29400")
    assert (env["WORLD_SIZE"], env["PET_NPROC_PER_NODE"]) == ("2", "2")  # from the spec: replicas, GPUs per replica


@pytest.mark.django_db
def test_primehub_names_alias_the_jobs_user_and_group(submit):
    job = submit("bob", "gpu-1", replicas=2, env={"LR": "0.5"})
    env = replica_env(job, 1, 1)
    assert (env["JOB_USER"], env["JOB_GROUP"]) == ("bob", "phusers")
    assert (env["PRIMEHUB_USER"], env["PRIMEHUB_GROUP"]) == ("bob", "phusers")
    assert env["LR"] == "0.5"
    with pytest.raises(ValidationError, match="'PRIMEHUB_USER' is set by jobsite"):
        submit("bob", "gpu-1", env={"PRIMEHUB_USER": "mallory"})


# --- the local backend: real processes ---------------------------------------------------------------------

ENV_LINE = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$", re.MULTILINE)
PRINT_ENV = 'env; echo "hostfile<<"; cat "$JOB_HOSTFILE"'


def wait_until_exited(backend, *, job_id: int, attempt_number: int, replicas: int, timeout: float = 60.0):
    seen = []

    def exited():
        seen[:] = backend.observe(job_id=job_id, attempt_number=attempt_number, replicas=replicas)
        return all(s.state == ReplicaState.EXITED for s in seen)

    waiting.wait_for(exited, timeout=timeout, message=lambda: f"the replicas to exit: {seen}")
    return seen


def env_and_hostfile(log: str) -> tuple[dict[str, str], str]:
    env_part, _, hostfile = log.partition("hostfile<<\n")
    return dict(ENV_LINE.findall(env_part)), hostfile


@pytest.mark.slow
def test_local_launch_gives_both_replicas_one_port_and_one_hostfile():
    backend = get_backend("local")
    spec = spec_of(2, gpus=2, command=PRINT_ENV, MASTER_ADDR="elsewhere")
    backend.launch(spec)
    seen = wait_until_exited(backend, job_id=7, attempt_number=2, replicas=2)
    assert [s.exit_code for s in seen] == [0, 0]
    hostfile_path = backend.root / "work" / "job-7" / "attempt-2" / "hostfile"
    assert hostfile_path.read_text() == "127.0.0.1 slots=2\n127.0.0.1 slots=2\n"
    envs = []
    for rank in (0, 1):
        env, hostfile = env_and_hostfile(backend.log_path(job_id=7, attempt_number=2, rank=rank).read_text())
        assert hostfile == hostfile_path.read_text()  # what the replica read at JOB_HOSTFILE
        assert env["JOB_HOSTFILE"] == str(hostfile_path)
        assert (env["RANK"], env["NODE_RANK"], env["PET_NODE_RANK"]) == (str(rank),) * 3
        assert (env["WORLD_SIZE"], env["PET_NNODES"], env["LOCAL_RANK"], env["PET_NPROC_PER_NODE"]) == (
            "2", "2", "0", "2")
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"]
        assert env["JOB_ID"] == "7"  # the replica's own variables too
        envs.append(env)
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert 1024 <= int(envs[0]["MASTER_PORT"]) <= 65535

    # The next attempt has its own hostfile and a port chosen for it.
    again = spec_of(1, gpus=0, command=PRINT_ENV)
    again = LaunchSpec(**{**again.__dict__, "attempt_number": 3})
    backend.launch(again)
    wait_until_exited(backend, job_id=7, attempt_number=3, replicas=1)
    env, hostfile = env_and_hostfile(backend.log_path(job_id=7, attempt_number=3, rank=0).read_text())
    assert env["JOB_HOSTFILE"] == str(backend.root / "work" / "job-7" / "attempt-3" / "hostfile")
    assert hostfile == "127.0.0.1 slots=1\n"
    assert hostfile_path.read_text() == "127.0.0.1 slots=2\n127.0.0.1 slots=2\n"  # the first one is untouched


@pytest.mark.slow
@pytest.mark.django_db
def test_a_submitted_two_replica_job_sees_the_variables(submit, django_capture_on_commit_callbacks):
    job = submit("bob", "gpu-1", replicas=2,
                 command='echo "$RANK/$WORLD_SIZE node=$NODE_RANK local=$LOCAL_RANK $MASTER_ADDR:$MASTER_PORT '
                         'torchrun=$PET_NNODES,$PET_NODE_RANK,$PET_NPROC_PER_NODE,$PET_MASTER_ADDR:$PET_MASTER_PORT '
                         '$PRIMEHUB_USER@$PRIMEHUB_GROUP"; cat "$JOB_HOSTFILE"')
    deadline = time.monotonic() + 60
    while job.phase not in (Phase.SUCCEEDED, Phase.FAILED) and time.monotonic() < deadline:
        with django_capture_on_commit_callbacks(execute=True):  # the launch runs after commit, as in production
            schedule_pass()
            sync_jobs()
        job.refresh_from_db()
        time.sleep(0.05)
    assert job.phase == Phase.SUCCEEDED, (job.status, job.message)
    backend = get_backend()
    logs = [backend.log_path(job_id=job.pk, attempt_number=1, rank=r).read_text().splitlines() for r in (0, 1)]
    port = logs[0][0].split(":")[1].split()[0]
    for rank, lines in enumerate(logs):
        assert lines == [
            f"{rank}/2 node={rank} local=0 127.0.0.1:{port} torchrun=2,{rank},1,127.0.0.1:{port} bob@phusers",
            "127.0.0.1 slots=1",
            "127.0.0.1 slots=1",
        ]


def test_the_readme_shows_the_example_script_verbatim():
    readme = (ROOT / "README.md").read_text()
    section = readme.partition("\n## Distributed training\n")[2].partition("\n## ")[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert (ROOT / "examples" / "ddp" / "train.py").read_text() in blocks
