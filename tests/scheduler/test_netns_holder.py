"""An attempt's network namespace made by system calls (netns_sys.py): by a holder the launcher forks, entered by
the supervisor without ``nsenter``; the same namespace, routes and lifetime as the shell's holder (netns.py)."""

import ctypes
import os
import shutil
import struct
import subprocess

import pytest

from scheduler.backends import launcher, netns, netns_sys
from scheduler.backends.netns import NetFacts, holder_argv
from tests import waiting

from .test_launcher import alive, backend, bare_backend, cmdline, exit_code, parent, spec, supervisor_pid  # noqa: F401

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="makes namespaces: root")]

PR_SET_DUMPABLE = 4
ROUTES = ("192.0.2.2/32", "198.51.100.0/24", "169.254.0.0/16")
SHOW = "readlink /proc/self/ns/net; ip route; ip -o link show lo"


def in_child(body, *, as_user: int | None = None) -> tuple[int, str]:
    """Fork; the child (as ``as_user`` when given) runs ``body()`` and then shows its routes and loopback; its exit
    code and what it wrote. An OSError is written as ``error: ...`` (exit 3)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            if as_user is not None:
                os.setgroups([])
                os.setgid(as_user)
                os.setuid(as_user)
                # As a server started as that user: dumpable (a change of uid made it not, and its /proc/self
                # files root's), so that it may write its own user namespace's maps.
                ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            try:
                body()
            except OSError as exc:
                os.write(1, f"error: {type(exc).__name__}: {exc}".encode())
                os._exit(3)
            os.execv("/bin/sh", ["sh", "-c", SHOW])
        finally:
            os._exit(4)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out.decode()


def shell_holder_routes(routes) -> str:
    """What the shell's holder (``unshare`` + ``ip -batch``) makes of the same routes."""
    argv = holder_argv(NetFacts(mode="none", privileged=True, blocked=tuple(routes)))
    argv[argv.index("-c") + 1] = argv[argv.index("-c") + 1].replace("exec cat >/dev/null", "ip route")
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.removeprefix("ready\n")


def test_the_namespace_has_the_shell_holders_routes_and_its_loopback_up():
    code, out = in_child(lambda: netns_sys.set_up(privileged=True, routes=ROUTES))
    assert code == 0, out
    namespace, _, out = out.partition("\n")
    assert namespace != os.readlink("/proc/self/ns/net")  # a namespace of its own
    routes, _, link = out.rpartition("1: lo:")
    assert routes == shell_holder_routes(ROUTES)  # the very routes `ip route add prohibit` makes
    assert "prohibit 192.0.2.2 " in routes and "prohibit 169.254.0.0/16 " in routes
    assert "UP" in link.split(">")[0]


@pytest.mark.parametrize("routes, error", [
    (("192.0.2.2/32", "not-a-route"), "route 'not-a-route'"),
    (("192.0.2.2/32", "192.0.2.2/32"), "File exists"),  # refused by the kernel: acknowledged with an error
])
def test_a_route_that_cannot_be_added_fails_the_setup(routes, error):
    code, out = in_child(lambda: netns_sys.set_up(privileged=True, routes=routes))
    assert code == 3 and out.startswith("error: ") and error in out, out


def test_a_server_that_is_not_root_gets_a_user_namespace_where_it_may_set_the_network_up():
    code, out = in_child(lambda: netns_sys.set_up(privileged=False, routes=ROUTES), as_user=65534)
    if code == 3 and "unshare" in out:
        pytest.skip(f"this kernel gives no user namespace to a user that is not root: {out}")
    assert code == 0, out
    assert out.partition("\n")[2].rpartition("1: lo:")[0] == shell_holder_routes(ROUTES)
    code, out = in_child(lambda: netns_sys.set_up(privileged=True, routes=ROUTES), as_user=65534)
    assert code == 3 and "Operation not permitted" in out  # without its own user namespace it may not


def test_the_route_message_is_an_acknowledged_prohibit_in_the_main_table():
    message = netns_sys.route_message("198.51.100.0/24", 7)
    length, kind, flags, sequence, _port = struct.unpack_from("=IHHII", message)
    assert (length, kind, sequence) == (len(message), netns_sys.RTM_NEWROUTE, 7)
    assert flags & netns_sys.NLM_F_ACK and flags & netns_sys.NLM_F_EXCL
    family, dst_len, _, _, table, _, _, kind = struct.unpack_from("=8B", message, 16)
    assert (dst_len, table, kind) == (24, netns_sys.RT_TABLE_MAIN, netns_sys.RTN_PROHIBIT)
    assert message.endswith(bytes([198, 51, 100, 0]))


def holders(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if f"{netns.MARKER}={marker}".encode() in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_the_launcher_forks_a_holder_that_ends_with_the_attempts_pipe(backend):  # noqa: F811
    hold_r, keep = os.pipe()
    env = {"PATH": os.environ["PATH"], netns.MARKER: "test:1:1"}
    try:
        pid = backend.launcher.hold_network(routes=list(ROUTES), privileged=True, env=env, stdin=hold_r)
    finally:
        os.close(hold_r)
    try:
        assert holders("test:1:1") == [pid] and cmdline(pid) == ["cat"]  # found by its marker, as the shell's
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert parent(pid) == backend.launcher.request({"op": "ping"})["pid"]  # the launcher's own child
    finally:
        os.close(keep)  # the last writer: the holder reads end-of-file and goes
    waiting.wait_for(lambda: not alive(pid), timeout=60, message="the holder to end with its pipe")
    backend.launcher.request({"op": "ping"})  # the launcher collects its children after each request
    assert not os.path.exists(f"/proc/{pid}")  # no zombie left


def test_a_holder_that_cannot_set_up_is_refused_and_nothing_is_left(backend):  # noqa: F811
    hold_r, keep = os.pipe()
    env = {"PATH": os.environ["PATH"], netns.MARKER: "test:2:1"}
    try:
        with pytest.raises(launcher.Unavailable, match="did not start: .*route 'bad'"):
            backend.launcher.hold_network(routes=["bad"], privileged=True, env=env, stdin=hold_r)
    finally:
        os.close(hold_r)
        os.close(keep)
    assert holders("test:2:1") == []


def test_a_replica_runs_in_the_namespace_of_the_launchers_holder(backend):  # noqa: F811
    assert backend.network and backend.bwrap, "a sandboxed backend with a network"
    backend.launch(spec(1, command="readlink /proc/self/ns/net; ip route; sleep 30"))
    supervisor_pid(backend, 1)
    [holder] = [pid for pid in holders(f"{backend.root_id}:1:1") if cmdline(pid) == ["cat"]]  # not slirp4netns
    assert parent(holder) == backend.launcher.request({"op": "ping"})["pid"]  # not started by this scheduler
    log = backend.log_path(job_id=1, attempt_number=1, rank=0)
    waiting.wait_for(lambda: log.exists() and "prohibit 169.254.0.0/16" in log.read_text(), timeout=60,
                     message="the replica to show its namespace")
    assert log.read_text().splitlines()[0] == os.readlink(f"/proc/{holder}/ns/net")
    backend.stop(job_id=1, attempt_number=1, replicas=1)
    assert exit_code(backend, 1) == 143
    waiting.wait_for(lambda: not holders(f"{backend.root_id}:1:1"), timeout=60,
                     message="the namespace's processes to end with the attempt")


def test_a_command_that_cannot_start_leaves_no_namespace_descriptor_open():
    """The supervisor opens the holder's namespaces to enter them between fork and exec: closed again whether the
    command started or not (here it cannot: no such program)."""
    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    before = open_fds()
    with pytest.raises(FileNotFoundError):
        netns_sys.popen(["/nonexistent/jobsite-command"], f"{os.getpid()}", lambda: None)
    assert open_fds() == before
    started = netns_sys.popen(["true"], f"{os.getpid()}", lambda: None)
    assert started.wait(60) == 0 and open_fds() == before
