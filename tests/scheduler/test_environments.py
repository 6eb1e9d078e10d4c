"""Images are environments on the local backend (issue 22.4): a venv, a conda prefix or a root file system an admin
names per image, shown read-only in the job's sandbox with its bin first on PATH."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from jobs.choices import Phase
from jobs.models import Image
from scheduler.backend_factory import get_backend
from scheduler.backends.environments import BadEnvironment, kind_of, parse_pyvenv, read_environment
from scheduler.backends.sandbox import sandbox_argv, sandbox_env

from .conftest import wait_for
from .test_sandbox import facts, log_of, needs_bwrap

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("label, names, kind", [
    ("a virtualenv", {"pyvenv.cfg", "bin/python"}, "venv"),
    ("a conda environment", {"conda-meta", "bin/python"}, "prefix"),
    ("a software tree", set(), "prefix"),
    ("an unpacked root file system", {"usr/bin", "etc"}, "rootfs"),
    ("a prefix that happens to hold etc and usr/bin but runs its own python", {"usr/bin", "etc", "bin/python"},
     "prefix"),
])
def test_the_kind_of_an_environment(label, names, kind):
    assert kind_of(names) == kind, label


def test_pyvenv_cfg():
    assert parse_pyvenv("home = /opt/python/3.11/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n") == {
        "home": "/opt/python/3.11/bin", "include-system-site-packages": "false", "version": "3.11.7"}


def test_path_starts_with_the_environment_and_its_variables_are_set():
    f = facts(readonly=("/srv/envs/torch",), env_bin="/srv/envs/torch/bin",
              env_vars=(("VIRTUAL_ENV", "/srv/envs/torch"),))
    env = sandbox_env({"PATH": "/srv/envs/torch/bin:/root/.venv/bin:/usr/bin", "RANK": "0"}, f)
    assert env == {"PATH": "/srv/envs/torch/bin:/usr/bin", "RANK": "0", "VIRTUAL_ENV": "/srv/envs/torch"}


def test_a_root_file_system_is_shown_as_the_system():
    argv = sandbox_argv(facts(system=(("/usr", ""), ("/bin", "usr/bin"), ("/etc", "")), system_root="/srv/rootfs"))
    i = argv.index("/srv/rootfs/usr")
    assert argv[i - 1:i + 2] == ["--ro-bind", "/srv/rootfs/usr", "/usr"]
    assert argv[argv.index("/srv/rootfs/etc") + 1] == "/etc"
    assert ["--symlink", "usr/bin", "/bin"] == argv[argv.index("usr/bin") - 1:argv.index("usr/bin") + 2]
    assert ("/usr", "/usr") not in zip(argv, argv[1:], strict=False)  # the machine's own /usr is not shown


def test_reading_a_venv_shows_its_base_interpreter_too(tmp_path):
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    link = tmp_path / "env-link"
    link.symlink_to(venv)
    found = read_environment(str(link))
    base = os.path.realpath(sys.base_prefix)
    assert (found.kind, found.bin) == ("venv", f"{link}/bin")
    expected = [str(link), str(venv)] + ([base] if not base.startswith("/usr") else [])
    assert list(found.shown) == expected
    assert dict(found.variables) == {"VIRTUAL_ENV": str(link)}
    with pytest.raises(BadEnvironment, match="is not a directory of this machine"):
        read_environment(str(tmp_path / "missing"))


def test_register_image_validates_and_updates(world, tmp_path):
    call_command("register_image", "torch", "--local-root", str(tmp_path), "--group", "phusers")
    image = Image.objects.get(name="torch")
    assert (image.url, image.local_root, list(image.groups.values_list("name", flat=True))) == (
        "torch", str(tmp_path), ["phusers"])
    with pytest.raises(CommandError, match="local_root: Give an absolute, normalised directory"):
        call_command("register_image", "torch", "--local-root", "relative/env")
    with pytest.raises(CommandError, match="No such group: nope"):
        call_command("register_image", "torch", "--group", "nope")
    assert Image.objects.get(name="torch").local_root == str(tmp_path)  # the refused calls changed nothing


@pytest.fixture
def venv_image(world, tmp_path_factory):
    """An image whose environment is a venv of the test's interpreter (outside /usr: its base must be shown too)."""
    venv = tmp_path_factory.mktemp("envs") / "tools"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "bin" / "hello-tool").write_text("#!/bin/sh\necho hello from the environment\n")
    (venv / "bin" / "hello-tool").chmod(0o755)
    os.chmod(venv.parent, 0o755)
    call_command("register_image", "tools", "--local-root", str(venv), "--group", "phusers")
    return venv


@needs_bwrap
@pytest.mark.slow
def test_a_job_runs_in_its_images_environment(submit, clock, venv_image):
    job = submit("bob", image="tools", backoff_limit=0, command=(
        'hello-tool; python -c "import sys; print(sys.prefix)"; echo "$VIRTUAL_ENV"; '
        f'touch {venv_image}/written 2>/dev/null && echo writable || echo read-only'))
    wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock, timeout=120)
    assert log_of(job).splitlines() == ["hello from the environment", str(venv_image), str(venv_image),
                                        "read-only"], log_of(job)
    assert get_backend().bwrap


def test_an_image_whose_environment_is_gone_fails_saying_so(submit, clock, world, tmp_path):
    Image.objects.create(name="gone", url="gone", local_root=str(tmp_path / "removed")).groups.add(
        world.groups["phusers"])
    job = submit("bob", image="gone", command="true")
    wait_for(job, {Phase.FAILED}, clock)
    assert job.reason == "ContainerCannotRun"
    assert f"image gone: its environment {tmp_path / 'removed'} is not a directory of this machine" in job.message
