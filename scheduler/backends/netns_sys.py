"""The system calls of an attempt's network namespace (netns.py): made by a holder the launcher forks, instead of
``unshare`` running a shell, ``ip`` and ``cat`` (netns.py's HOLDER_SCRIPT, still used when there is no launcher),
and entered by each supervisor between the fork and the exec of its sandbox, instead of through ``nsenter``.

Standalone, as the launcher and the supervisor: no Django. ``hold`` runs in a child of the launcher's: it makes
the namespace (``unshare(2)``; for a server that is not root in a user namespace of its own too, where the server's
user is root), brings its loopback up (``SIOCSIFFLAGS``), adds the prohibited routes (rtnetlink, one message each,
every one acknowledged) and then becomes ``cat`` reading the attempt's pipe, with the holder's marker in its
environment: the same process, seen from outside, as the one the shell made, for one fork and one exec instead of
five programs. ``popen`` (with ``open_namespaces`` and ``enter``) is the supervisor's. ``route_message`` and
``ifreq`` are pure.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import socket
import struct
import subprocess
from collections.abc import Callable

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFNAMSIZ = 16
IFREQ_SIZE = 40  # struct ifreq: the name, then a 24-byte union (the kernel copies all of it)
# rtnetlink (linux/netlink.h, linux/rtnetlink.h)
NETLINK_ROUTE = 0
NLMSG_ERROR = 2
RTM_NEWROUTE = 24
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
RT_TABLE_MAIN = 254
RTPROT_BOOT = 3
RT_SCOPE_UNIVERSE = 0
RTN_PROHIBIT = 8
RTA_DST = 1
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTATTR = struct.Struct("=HH")  # length, type


class SetupError(OSError):
    """The namespace could not be set up (nothing is held)."""


def route_message(cidr: str, sequence: int) -> bytes:
    """The rtnetlink request for ``ip route add prohibit CIDR`` (IPv4) in the main table, acknowledged."""
    net = ipaddress.IPv4Network(cidr)
    dst = net.network_address.packed
    body = _RTMSG.pack(socket.AF_INET, net.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE,
                       RTN_PROHIBIT, 0) + _RTATTR.pack(_RTATTR.size + len(dst), RTA_DST) + dst
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWROUTE, flags, sequence, 0) + body


def ifreq(name: str, flags: int = 0) -> bytes:
    return struct.pack(f"={IFNAMSIZ}sh", name.encode(), flags).ljust(IFREQ_SIZE, b"\0")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> None:
    if _libc().unshare(flags) != 0:
        code = ctypes.get_errno()
        raise SetupError(code, f"unshare: {os.strerror(code)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def make_namespace(*, privileged: bool) -> None:
    """This process into a new network namespace (and, not ``privileged``, a user namespace mapping its user to
    root, which may then set the network up)."""
    if privileged:
        _unshare(CLONE_NEWNET)
        return
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER | CLONE_NEWNET)
    _write("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack_from("=h", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq("lo")), IFNAMSIZ)[0]
        fcntl.ioctl(s, SIOCSIFFLAGS, ifreq("lo", flags | IFF_UP))


def add_prohibited(routes) -> None:
    """Each route of ``routes`` (CIDRs) as a prohibited route of this namespace; SetupError at the first refused."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as s:
        s.bind((0, 0))
        for sequence, cidr in enumerate(routes, 1):
            try:
                s.send(route_message(cidr, sequence))
            except ValueError as exc:  # not an IPv4 network
                raise SetupError(errno.EINVAL, f"route {cidr!r}: {exc}") from exc
            answer = s.recv(65536)
            kind, = struct.unpack_from("=H", answer, 4)
            code = -struct.unpack_from("=i", answer, _NLMSGHDR.size)[0] if kind == NLMSG_ERROR else 0
            if code:
                raise SetupError(code, f"route prohibit {cidr}: {os.strerror(code)}")


def set_up(*, privileged: bool, routes) -> None:
    make_namespace(privileged=privileged)
    loopback_up()
    add_prohibited(routes)


def hold(*, privileged: bool, routes, stdin: int, env: dict[str, str], report: int) -> None:
    """In a child of the launcher (never returns): set the namespace up, then ``cat`` the attempt's pipe
    ``stdin`` to /dev/null until every supervisor has closed it. A failure is written to ``report`` (a
    close-on-exec pipe: on success the exec closes it with nothing written) and the child exits 1."""
    try:
        set_up(privileged=privileged, routes=routes)
        os.dup2(stdin, 0)
        if stdin != 0:
            os.close(stdin)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.execvpe("cat", ["cat"], env)
    except BaseException as exc:  # noqa: BLE001 - anything: this child must never return into the launcher
        try:
            os.write(report, f"{exc}".encode()[:4000] or b"failed")
        finally:
            os._exit(1)


def open_namespaces(holder: int, *, user: bool) -> list[tuple[int, int]]:
    """(fd, kind) of the namespaces of the holder ``holder`` to enter, in the order they are entered: its user
    namespace first when it has one of its own (which gives the rights to enter the network one it owns)."""
    kinds = [("user", CLONE_NEWUSER)] * user + [("net", CLONE_NEWNET)]
    opened: list[tuple[int, int]] = []
    try:
        for name, kind in kinds:
            opened.append((os.open(f"/proc/{holder}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), kind))
    except OSError:
        close_namespaces(opened)
        raise
    return opened


def enter(namespaces: list[tuple[int, int]]) -> None:
    """Into ``namespaces`` (``open_namespaces``), keeping this process's credentials. A network namespace is the
    calling thread's alone; a user namespace is entered only by a process of one thread (between a fork and its
    exec)."""
    for fd, kind in namespaces:
        if _libc().setns(fd, kind) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"cannot enter the job's network: {os.strerror(code)}")


def close_namespaces(namespaces: list[tuple[int, int]]) -> None:
    for fd, _kind in namespaces:
        os.close(fd)


def popen(argv: list[str], network: str | None, preexec: Callable[[], None], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` whose child runs ``preexec`` and then, with ``network`` (HOLDER or
    HOLDER:user, as netns.runner_options gives it), enters the namespaces of that holder, between its fork and its
    exec. The holder must live until then (the supervisor holds the attempt's pipe); the namespaces' descriptors
    are closed here, whether the command started or not."""
    namespaces: list[tuple[int, int]] = []
    if network is not None:
        holder, _, user = network.partition(":")
        namespaces = open_namespaces(int(holder), user=user == "user")

    def before_exec() -> None:
        preexec()
        enter(namespaces)
    try:
        return subprocess.Popen(argv, preexec_fn=before_exec, **kwargs)
    finally:
        close_namespaces(namespaces)
