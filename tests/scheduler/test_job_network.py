"""A job reaches nothing of the site (issue 20): its attempt's own network namespace, its GPUs' devices only, bounded
scratch space. Table tests of the pure parts, then real jobs through the real backend in the bubblewrap sandbox.

What a job finds out it prints to its log; the test's own servers count who connected to them. Every probe runs
from inside the job with a deadline of its own (``timeout``), so a probe that would hang fails as "refused".
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import socket
import stat
import subprocess
import threading

import pytest

from jobs.choices import Phase
from jobs.models import InstanceType
from scheduler.backend_factory import get_backend
from scheduler.backends import netns
from scheduler.backends.local_runner import processes
from scheduler.backends.netns import NetFacts, blocked_routes, holder_argv, runner_options, slirp_argv
from scheduler.backends.sandbox import gpu_devices, sandbox_argv
from tests import waiting

from .conftest import wait_for
from .test_sandbox import facts, log_of, needs_bwrap

pytestmark = [pytest.mark.fast, pytest.mark.django_db]

MIB = 1 << 20
GIB = 1 << 30

# --- the pure parts -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label, addresses, expect", [
    ("loopback is the namespace's own; every other address of the machine is prohibited, metadata too",
     ["127.0.0.1", "192.0.2.2", "10.213.0.1"], ("10.213.0.1/32", "192.0.2.2/32", "169.254.0.0/16")),
    ("IPv6 is not routed at all (slirp4netns without --enable-ipv6)", ["::1", "fe80::1", "127.0.0.1"],
     ("169.254.0.0/16",)),
    ("the same address twice", ["192.0.2.2", "192.0.2.2"], ("192.0.2.2/32", "169.254.0.0/16")),
])
def test_the_prohibited_routes(label, addresses, expect):
    assert blocked_routes(addresses) == expect, label


def test_this_machines_addresses_from_the_routing_table(tmp_path):
    trie = tmp_path / "fib_trie"
    trie.write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        "     +-- 127.0.0.0/8 2 0 2\n        +-- 127.0.0.0/31 1 0 0\n           |-- 127.0.0.0\n"
        "              /8 host LOCAL\n           |-- 127.0.0.1\n              /32 host LOCAL\n"
        "     +-- 192.0.2.0/24 2 0 2\n        |-- 192.0.2.0\n           /24 link UNICAST\n"
        "        |-- 192.0.2.2\n           /32 host LOCAL\n        |-- 192.0.2.255\n           /32 link BROADCAST\n")
    assert netns.local_addresses(str(trie)) == ["127.0.0.1", "192.0.2.2"]
    assert netns.local_addresses(str(tmp_path / "missing")) == []


@pytest.mark.parametrize("label, privileged, holder_user, enter_user, slirp_user", [
    ("a root server: the namespace in the machine's user namespace", True, [], ["--network", "42"], []),
    ("any other user: a user namespace of its own, where the server's user is root",
     False, ["--user", "--map-root-user"], ["--network", "42:user"], ["--userns-path=/proc/42/ns/user"]),
])
def test_the_namespace_command_lines(label, privileged, holder_user, enter_user, slirp_user):
    f = NetFacts(mode="outbound", privileged=privileged, slirp="/usr/bin/slirp4netns",
                 blocked=("192.0.2.2/32", "169.254.0.0/16"))
    holder = holder_argv(f)
    assert holder[:2 + len(holder_user)] == ["/usr/bin/unshare", "--net", *holder_user], label
    assert holder[-3:] == ["jobsite-netns", "192.0.2.2/32", "169.254.0.0/16"]
    assert "route add prohibit" in holder[-4] and "link set lo up" in holder[-4]
    assert runner_options(f, 42) == enter_user
    slirp = slirp_argv(f, 42, ready_fd=5, exit_fd=6)
    assert slirp[0] == "/usr/bin/slirp4netns" and slirp[-2:] == ["42", "tap0"]
    for option in ("--configure", "--disable-host-loopback", "--enable-sandbox", "--enable-seccomp",
                   "--ready-fd=5", "--exit-fd=6", *slirp_user):
        assert option in slirp, (label, option)
    assert NetFacts(mode="outbound", privileged=True, slirp="").outbound is False  # no slirp4netns: loopback only
    assert NetFacts(mode="none", privileged=True, slirp="/usr/bin/slirp4netns").outbound is False


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="makes a network namespace: root")
@pytest.mark.parametrize("blocked, ready", [
    (("192.0.2.2/32", "169.254.0.0/16"), True),
    (("192.0.2.2/32", "not-a-route", "169.254.0.0/16"), False),  # a route that cannot be added: no namespace
])
def test_the_holder_sets_its_namespace_up_or_fails(blocked, ready):
    holder = holder_argv(NetFacts(mode="none", privileged=True, blocked=blocked))
    script = holder.index("-c") + 1
    holder[script] = holder[script].replace("exec cat >/dev/null", "ip route")  # shows its routes, not held
    done = subprocess.run(holder, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0 and done.stdout.startswith("ready")) is ready, done
    if ready:  # the routes the namespace was given
        assert "prohibit 192.0.2.2" in done.stdout and "prohibit 169.254.0.0/16" in done.stdout


def test_scratch_space_is_bounded_and_the_resolver_shown():
    argv = sandbox_argv(facts(tmp_bytes=GIB, shm_bytes=GIB // 2, files=(("/srv/attempt/resolv.conf",
                                                                          "/etc/resolv.conf"),)))
    assert [argv[i - 4:i + 2] for i, a in enumerate(argv) if a == "--tmpfs"] == [
        ["--size", str(size), "--perms", "1777", "--tmpfs", path]
        for path, size in (("/tmp", GIB), ("/var/tmp", GIB), ("/dev/shm", GIB // 2))]
    i = argv.index("/srv/attempt/resolv.conf")
    assert argv[i - 1:i + 2] == ["--ro-bind", "/srv/attempt/resolv.conf", "/etc/resolv.conf"]
    assert i > argv.index("/etc")  # over the system's


@pytest.fixture
def fake_devices(tmp_path):
    """NVIDIA device nodes of 8 GPUs and the control devices, made for the test (major 195, as the driver's)."""
    if os.geteuid() != 0:
        pytest.skip("making device nodes needs root")
    base = tmp_path / "dev"
    (base / "nvidia-caps").mkdir(parents=True)
    names = [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm", "nvidia-modeset",
                                                 "nvidia-caps/nvidia-cap1"]
    for minor, name in enumerate(names):
        os.mknod(base / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    (base / "nvidia-not-a-device").write_text("")
    return base


@pytest.mark.parametrize("label, gpu_ids, expect", [
    ("no GPU: no NVIDIA device at all", (), []),
    ("one GPU: its node and the control devices", (3,),
     ["nvidia-caps/nvidia-cap1", "nvidia-modeset", "nvidia-uvm", "nvidia3", "nvidiactl"]),
    ("two GPUs", (0, 7), ["nvidia-caps/nvidia-cap1", "nvidia-modeset", "nvidia-uvm", "nvidia0", "nvidia7",
                          "nvidiactl"]),
])
def test_a_replica_sees_only_its_own_gpus(fake_devices, label, gpu_ids, expect):
    found = gpu_devices(str(fake_devices), gpu_ids)
    assert sorted(name.removeprefix("/dev/") for _, name in found) == expect, label
    assert all(node == str(fake_devices / name.removeprefix("/dev/")) for node, name in found)


# --- real jobs ------------------------------------------------------------------------------------------------------


class Listener:
    """A TCP server of the test's that counts the connections it accepts."""

    def __init__(self, host: str, payload: bytes = b""):
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.payload = payload
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(self.payload)

    def close(self):
        self.sock.close()


def probe(name: str, host: str, port: int) -> str:
    """A line of bash that prints "REACHED name" or "refused name"."""
    return (f'if timeout 10 bash -c "exec 3<>/dev/tcp/{host}/{port}" 2>/dev/null; '
            f'then echo "REACHED {name}"; else echo "refused {name}"; fi; ')


def machine_address() -> str:
    found = [a for a in netns.local_addresses() if not ipaddress.ip_address(a).is_loopback]
    if not found:
        pytest.skip("this machine has no address but loopback")
    return found[0]


def namespace_processes(backend, job) -> list[int]:
    """The live holders and slirp4netns of the job's attempt-1 network (by their marker)."""
    marker = f"{netns.MARKER}={backend.root_id}:{job.pk}:1".encode()
    found = []
    for pid in processes():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


@needs_bwrap
@pytest.mark.slow
def test_no_port_of_the_machine_answers_a_job(submit, clock, settings):
    """The web server, PostgreSQL, Redis, the scheduler's HTTP port, another installation: whichever address of
    the machine the job tries, loopback, the machine's own or the user-mode network's gateway to it."""
    backend = get_backend()
    assert backend.bwrap and backend.network == "outbound"
    host = machine_address()
    server = Listener("0.0.0.0")  # a port of the machine's, on every address (as a web server or database)
    ports = {"the test's server": server.port, "PostgreSQL": 5432, "Redis": 6379}
    try:
        script = "".join(probe(f"{name} on {address}", address, port) for name, port in ports.items()
                         for address in ("127.0.0.1", host, "10.0.2.2"))
        script += probe("metadata", "169.254.169.254", 80)
        # The control: its own server on its own loopback answers (so "refused" above means the network).
        script += ('python3 -c "import socket,time; s=socket.create_server((\'127.0.0.1\', 7001)); '
                   's.accept(); time.sleep(1)" & sleep 0.5; ' + probe("its own loopback", "127.0.0.1", 7001))
        script += "wait"
        job = submit("bob", command=script, backoff_limit=0)
        wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock, timeout=120)
        out = log_of(job)
        lines = [line for line in out.splitlines() if line.startswith(("REACHED", "refused"))]
        assert lines == [f"refused {name} on {a}" for name in ports for a in ("127.0.0.1", host, "10.0.2.2")] + [
            "refused metadata", "REACHED its own loopback"], out
        assert server.accepted == 0
    finally:
        server.close()


_OTHER_HOSTS = itertools.count()


@pytest.fixture
def other_host(tmp_path):
    """A host of the test's own: a network namespace joined to this machine by a veth pair, with a server."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace of the test's needs root and iproute2")
    # Names of this fixture's use only: the kernel tears a deleted namespace's veth down in the background, so the
    # next use must not count on the last one's names being free.
    n = next(_OTHER_HOSTS)
    name, link = f"jst{os.getpid() % 100000}n{n}", f"jsv{os.getpid() % 100000}n{n}"
    subnet = f"10.{213 + n % 40}.{os.getpid() % 250}"

    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", name)
    server = None
    try:
        ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("addr", "add", f"{subnet}.1/30", "dev", link)
        ip("link", "set", link, "up")
        ip("-n", name, "addr", "add", f"{subnet}.2/30", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        ready = tmp_path / "other-host-ready"
        server = subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c", (
            "import socket, sys; s = socket.create_server(('0.0.0.0', 8443)); open(sys.argv[1], 'w').close()\n"
            "while True:\n    c, _ = s.accept(); c.sendall(b'hello from the other host\\n'); c.close()"),
            str(ready)])
        waiting.wait_for(ready.exists, message="the other host's server to start")
        yield f"{subnet}.2", 8443, f"{subnet}.1"
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", link], capture_output=True)  # both ends, at once
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["outbound", "none"])
def test_outbound_reaches_other_hosts_but_not_this_machine(submit, clock, settings, other_host, mode):
    settings.JOBSITE_LOCAL_JOB_NETWORK = mode
    get_backend.cache_clear()
    address, port, this_side = other_host
    server = Listener("0.0.0.0")
    try:
        job = submit("bob", backoff_limit=0, command=(
            f'timeout 10 bash -c "exec 3<>/dev/tcp/{address}/{port}; cat <&3" 2>/dev/null || echo "no answer"; '
            + probe("this machine's side of the link", this_side, server.port)
            + probe("this machine's loopback", "127.0.0.1", server.port) + "cat /etc/resolv.conf"))
        wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock, timeout=120)
        out = log_of(job)
        expect = "hello from the other host" if mode == "outbound" else "no answer"
        assert out.splitlines()[:3] == [expect, "refused this machine's side of the link",
                                        "refused this machine's loopback"], out
        assert ("nameserver 10.0.2.3" in out) == (mode == "outbound")
        assert server.accepted == 0
    finally:
        server.close()


@needs_bwrap
@pytest.mark.slow
def test_ranks_meet_on_their_loopback_and_the_namespace_ends_with_the_attempt(submit, clock):
    """Two replicas of one attempt share a network namespace (rank 1 reaches rank 0 on 127.0.0.1:MASTER_PORT);
    another job's is another; when the attempt ends, the holder and slirp4netns are gone."""
    backend = get_backend()
    other = submit("lin", group="research", command="readlink /proc/self/ns/net; exec sleep 600")
    job = submit("bob", "gpu-2", replicas=2, backoff_limit=0, command=(
        "readlink /proc/self/ns/net; "
        'if [ "$RANK" = 0 ]; then python3 -c "import os, socket; s = socket.create_server((\'127.0.0.1\', '
        'int(os.environ[\'MASTER_PORT\']))); c, _ = s.accept(); print(c.recv(64).decode())"; '
        'else for i in $(seq 100); do python3 -c "import os, socket; c = socket.create_connection(('
        '\'127.0.0.1\', int(os.environ[\'MASTER_PORT\']))); c.sendall(b\'hello rank 0\')" 2>/dev/null '
        "&& exit 0; sleep 0.2; done; exit 1; fi"))
    try:
        wait_for(other, {Phase.RUNNING}, clock)
        wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock, timeout=120)
        assert job.phase == Phase.SUCCEEDED, (log_of(job, rank=0), log_of(job, rank=1))
        rank0, rank1 = log_of(job, rank=0).splitlines(), log_of(job, rank=1).splitlines()
        assert rank0[0] == rank1[0] and rank0[0].startswith("net:[") and rank0[1] == "hello rank 0"
        assert rank0[0] != os.readlink("/proc/self/ns/net")
        waiting.wait_for(lambda: log_of(other).strip() != "", message="the other job's log")
        assert log_of(other).splitlines()[0] not in (rank0[0], os.readlink("/proc/self/ns/net"))
        waiting.wait_for(lambda: namespace_processes(backend, job) == [], message="the namespace gone with the attempt")
        assert namespace_processes(backend, other)  # still running: still there
    finally:
        backend.stop(job_id=other.pk, attempt_number=1, replicas=1, force=True)
    waiting.wait_for(lambda: namespace_processes(backend, other) == [], message="the other namespace to end")


@needs_bwrap
@pytest.mark.slow
def test_a_one_gpu_job_sees_exactly_its_gpu_and_bounded_scratch(submit, clock, settings, fake_devices, world):
    settings.JOBSITE_LOCAL_DEVICE_DIR = str(fake_devices)
    small = InstanceType.objects.create(name="cpu-128m", gpu=0, cpu_millicores=500, memory_bytes=128 * MIB)
    small.groups.add(world.groups["phusers"])
    list_devices = "ls -d /dev/nvidia* /dev/nvidia-caps/* 2>/dev/null | sort | tr '\\n' ' '; echo; "
    one = submit("bob", "gpu-1", command='echo "gpu $CUDA_VISIBLE_DEVICES"; ' + list_devices)
    none = submit("pan", "cpu-128m", command=list_devices + (
        "df -B1 --output=size /tmp /dev/shm | tail -n 2 | tr -d ' '; "
        "head -c 80M /dev/zero > /dev/shm/big 2>/dev/null && echo shm-unbounded || echo shm-full; "
        "rm -f /dev/shm/big"))
    wait_for(one, {Phase.SUCCEEDED, Phase.FAILED}, clock, timeout=120)
    wait_for(none, {Phase.SUCCEEDED, Phase.FAILED}, clock, timeout=120)
    out = log_of(one)
    gpu = int(out.split("gpu ")[1].split()[0])
    assert sorted(out.splitlines()[1].split()) == sorted([
        f"/dev/nvidia{gpu}", "/dev/nvidiactl", "/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1"]), out
    assert log_of(none).splitlines() == ["", str(128 * MIB), str(64 * MIB), "shm-full"], log_of(none)
