"""The network of a local attempt: one network namespace its replicas share, and nothing of this machine in it.

Every replica of an attempt runs in the attempt's network namespace, so ranks still meet on 127.0.0.1 (the
namespace's own loopback: ``MASTER_ADDR`` keeps working), while no port of the machine answers a job: not the web
server, PostgreSQL, Redis, the scheduler's HTTP port, nor another installation's. JOBSITE_LOCAL_JOB_NETWORK says
what else a job reaches:

  ``outbound`` (default)  the internet and the package registries, through a user-mode network stack
                          (``slirp4netns``, from Debian) with its route to the host's loopback disabled; every
                          address of this machine and the link-local range (cloud metadata) are prohibited routes
                          inside the namespace, which the job, without capabilities, cannot change.
  ``none``                loopback only.

The namespace is held by a small process (``cat`` on a pipe; as a server that is not root, in a user namespace
of its own too), forked by the installation's launcher (netns_sys.py: the namespace made with system calls) or,
without one, started as ``unshare`` running a shell and ``ip``. The write end of that pipe goes to every
supervisor of the attempt and to nobody else, so when the last of them ends, the holder reads end-of-file and
exits, ``slirp4netns`` (whose exit fd is the same pipe) with it, and the kernel frees the namespace: it ends with
the attempt, whoever dies first, the scheduler included. A supervisor (``--network``) enters the namespace between
the fork and the exec of bubblewrap; it holds the pipe open while it does, so the holder it names is alive.

``holder_argv``, ``slirp_argv``, ``runner_options`` and ``blocked_routes`` are pure; ``open_network`` starts the
processes.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)

MODES = ("outbound", "none")
# slirp4netns' defaults: the namespace's tap device, its address range and resolver.
TAP = "tap0"
SLIRP_MTU = 65520
RESOLVER = "10.0.2.3"
RESOLV_CONF = f"nameserver {RESOLVER}\n"
# Prohibited inside every job's namespace whatever the machine's addresses: link-local (cloud metadata services).
ALWAYS_BLOCKED = ("169.254.0.0/16",)
# The marker of a holder in its environment: <installation>:<job>:<attempt>.
MARKER = "JOBSITE_NETNS"
# How long a launch waits for the namespace to be ready (generous: a busy machine starts processes slowly).
READY_SECONDS = 30.0
TUN = "/dev/net/tun"
SLIRP_MISSING = (
    f"slirp4netns was not found, or this user may not open {TUN}: jobs run with loopback only "
    "(JOBSITE_LOCAL_JOB_NETWORK=none), without the internet or package registries. Install it (Debian: apt-get "
    "install slirp4netns) for outbound access."
)

# The holder: loopback up, the prohibited routes (its arguments), "ready", then it waits for end-of-file on stdin.
# One `ip` for all the namespace's setup (`-batch` stops at the first command that fails): an `ip` per route cost
# 2.6 ms more CPU an attempt on a machine with two routes to block, and a host has one per address.
HOLDER_SCRIPT = (
    '{ echo "link set lo up"; for r; do echo "route add prohibit $r"; done; } | ip -batch - || exit 1; '
    'echo ready; exec cat >/dev/null'
)


@dataclass(frozen=True)
class NetFacts:
    """What an attempt's network namespace is built from."""

    mode: str  # outbound | none
    privileged: bool  # a root server: no user namespace of its own
    unshare: str = "/usr/bin/unshare"
    slirp: str = ""  # slirp4netns, for outbound
    blocked: tuple[str, ...] = field(default=ALWAYS_BLOCKED)  # prohibited routes (CIDRs)

    @property
    def outbound(self) -> bool:
        return self.mode == "outbound" and bool(self.slirp)


def blocked_routes(addresses) -> tuple[str, ...]:
    """The prohibited routes of a namespace: every IPv4 address of this machine (as /32) but loopback's (the
    namespace has its own), and link-local."""
    found = []
    for a in addresses:
        ip = ipaddress.ip_address(a)
        if ip.version == 4 and not ip.is_loopback:
            found.append(f"{ip}/32")
    return (*sorted(set(found)), *ALWAYS_BLOCKED)


def holder_argv(f: NetFacts) -> list[str]:
    """The process that makes and holds the namespace (as a server that is not root, in a user namespace where
    the server's user is root, so that it may set the namespace up)."""
    user = [] if f.privileged else ["--user", "--map-root-user"]
    return [f.unshare, "--net", *user, "/bin/sh", "-c", HOLDER_SCRIPT, "jobsite-netns", *f.blocked]


def slirp_argv(f: NetFacts, pid: int, *, ready_fd: int, exit_fd: int) -> list[str]:
    """slirp4netns for the namespace of ``pid``: the tap device configured, the host's loopback out of reach,
    ready and exit reported through the two fds; sandboxed and under seccomp (it handles a job's packets)."""
    user = [] if f.privileged else [f"--userns-path=/proc/{pid}/ns/user"]
    return [f.slirp, "--configure", f"--mtu={SLIRP_MTU}", "--disable-host-loopback", "--enable-sandbox",
            "--enable-seccomp", f"--ready-fd={ready_fd}", f"--exit-fd={exit_fd}", *user, str(pid), TAP]


def runner_options(f: NetFacts, pid: int) -> list[str]:
    """What tells a supervisor (local_runner.py) to start its sandbox in the namespace of the holder ``pid`` (and
    its user namespace when it has one, keeping the server's credentials, which are root there)."""
    return ["--network", f"{pid}" if f.privileged else f"{pid}:user"]


# --- the machine (not pure) ----------------------------------------------------------------------------------------


def local_addresses(fib_trie: str = "/proc/net/fib_trie") -> list[str]:
    """This machine's IPv4 addresses: the kernel's local routes (``/32 host LOCAL``) of its routing table."""
    found, previous = [], ""
    try:
        with open(fib_trie) as f:
            for line in f:
                if "/32 host LOCAL" in line and previous:
                    found.append(previous)
                words = line.split()
                if len(words) == 2 and words[0] in ("|--", "+--"):
                    previous = words[1]
    except OSError:
        pass
    return found


def resolve_mode() -> str:
    """JOBSITE_LOCAL_JOB_NETWORK, checked; warns when outbound has no slirp4netns (loopback only then)."""
    mode = str(settings.JOBSITE_LOCAL_JOB_NETWORK).strip().lower()
    if mode not in MODES:
        raise ImproperlyConfigured(f"JOBSITE_LOCAL_JOB_NETWORK must be one of {', '.join(MODES)}, not {mode!r}.")
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            raise ImproperlyConfigured(f"The jobs' network namespaces need {tool} (Debian: util-linux, iproute2).")
    if mode == "outbound" and not _slirp():
        log.warning("JOBSITE_LOCAL_JOB_NETWORK=outbound: %s", SLIRP_MISSING)
    return mode


def _slirp() -> str:
    """slirp4netns, when it can serve this server: found, and (for a server that is not root) the tun device open
    to all, as most distributions leave it."""
    found = shutil.which("slirp4netns") or ""
    return found if found and (os.geteuid() == 0 or os.access(TUN, os.R_OK | os.W_OK)) else ""


def host_facts(mode: str) -> NetFacts:
    return NetFacts(mode=mode, privileged=os.geteuid() == 0, unshare=shutil.which("unshare") or "unshare",
                    slirp=_slirp(),
                    blocked=blocked_routes(local_addresses()))


class NetworkError(OSError):
    """The attempt's namespace could not be made."""


@dataclass
class Network:
    """An attempt's namespace while its replicas start: ``keep_fd`` goes to each supervisor (``pass_fds``), and
    ``close`` is called once they all have it."""

    facts: NetFacts
    pid: int
    keep_fd: int
    processes: list[subprocess.Popen]

    def runner_options(self) -> list[str]:
        return runner_options(self.facts, self.pid)

    def close(self) -> None:
        if self.keep_fd >= 0:
            os.close(self.keep_fd)
            self.keep_fd = -1


def _wait_readable(fd: int, deadline: float) -> bool:
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            return True
    return False


def open_network(f: NetFacts, marker: str, launcher=None) -> Network:
    """Make an attempt's namespace and wait until it is ready; the caller hands ``keep_fd`` to the supervisors.
    The holder is forked by ``launcher`` (launcher.Launcher) when it answers, else started as ``unshare``."""
    hold_r, keep = os.pipe()
    started: list[subprocess.Popen] = []
    try:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), MARKER: marker}
        deadline = time.monotonic() + READY_SECONDS
        holder = _forked_holder(f, env, hold_r, launcher)
        if holder is None:
            started.append(_started_holder(f, env, hold_r, deadline))
            holder = started[0].pid
        if f.outbound:
            ready_r, ready_w = os.pipe()
            try:
                slirp = subprocess.Popen(slirp_argv(f, holder, ready_fd=ready_w, exit_fd=hold_r),
                                         pass_fds=(ready_w, hold_r), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                         start_new_session=True)
                started.append(slirp)
                os.close(ready_w)
                ready_w = -1
                if not _wait_readable(ready_r, deadline) or not os.read(ready_r, 1):
                    raise NetworkError(f"slirp4netns did not configure the job's network: {_stderr(slirp)}")
            finally:
                os.close(ready_r)
                if ready_w >= 0:
                    os.close(ready_w)
        return Network(f, holder, keep, started)
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(keep)
        for p in started:
            p.kill()
            p.wait()
        raise exc if isinstance(exc, NetworkError) else NetworkError(str(exc)) from exc
    finally:
        os.close(hold_r)


def _forked_holder(f: NetFacts, env: dict[str, str], hold_r: int, launcher) -> int | None:
    """The pid of a holder the launcher forked; None when there is no launcher or it made none (the namespace is
    then made by ``unshare``; a holder the launcher made without answering ends with the attempt, as the one made
    here, reading the same pipe)."""
    if launcher is None:
        return None
    try:
        return launcher.hold_network(routes=list(f.blocked), privileged=f.privileged, env=env, stdin=hold_r)
    except OSError as exc:
        log.info("the launcher made no network namespace (%s): started with unshare", exc)
        return None


def _started_holder(f: NetFacts, env: dict[str, str], hold_r: int, deadline: float) -> subprocess.Popen:
    holder = subprocess.Popen(holder_argv(f), stdin=hold_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env, start_new_session=True)
    try:
        if not _wait_readable(holder.stdout.fileno(), deadline) or holder.stdout.readline() != b"ready\n":
            raise NetworkError(f"the job's network namespace did not start: {_stderr(holder)}")
    except BaseException:
        holder.kill()
        holder.wait()
        raise
    holder.stdout.close()
    return holder


def _stderr(p: subprocess.Popen) -> str:
    if p.poll() is None:
        p.kill()
    try:
        return p.communicate(timeout=5)[1].decode(errors="replace").strip() or f"exit {p.returncode}"
    except subprocess.SubprocessError:
        return "no answer"
