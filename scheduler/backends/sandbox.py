"""The sandbox of a local replica: bubblewrap (``bwrap``) around its command.

A replica sees a read-only system (``/usr`` and its links, ``/etc``, ``/sys``, ``/opt`` and the paths of
JOBSITE_LOCAL_SANDBOX_PATHS), its own ``/proc``, ``/dev`` (plus the NVIDIA device nodes), ``/tmp``, ``/dev/shm``
and IPC, its attempt's hostfile read-only, its group volume and, writable, only its own working directory. Nothing
of the installation (``var/``: the database, other jobs' directories and logs, the supervisors' state; the code
tree but its ``examples/``) is there, even under a directory it sees. It runs in its own PID namespace, whose pid 1
(bubblewrap) ends with the command: then, or when the supervisor dies (``--die-with-parent``), the kernel kills
every process of the replica, ``setsid`` or not. Its network is its attempt's own namespace (netns.py: ranks meet
on 127.0.0.1, no port of the machine answers); of the NVIDIA devices it sees only its GPUs' (and the control
devices); its ``/tmp`` and ``/dev/shm`` are bounded by its memory.

Its user is unprivileged: a server running as root starts bubblewrap as root, which sets the sandbox up and then
becomes JOBSITE_LOCAL_SANDBOX_UID/GID with no capabilities left (``setpriv``); any other user gets a user namespace
in which its processes are that uid. Either way the job cannot signal the server or another job (it sees no
process but its own), and its output reaches its log through a pipe the supervisor reads, outside the sandbox.

``sandbox_argv`` and ``sandbox_env`` are pure: everything they need about the machine is in ``Facts``, read by
``host_facts``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .environments import Environment

log = logging.getLogger(__name__)

MODES = ("auto", "bwrap", "off")
# What a sandbox shows of the system, read-only, when it is on this machine (a directory, or a link such as
# Debian's /bin -> usr/bin, recreated as the same link).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys", "/opt")
SETPRIV = "/usr/bin/setpriv"
# The sandbox's own empty directories: /dev/shm for POSIX shared memory and semaphores (multiprocessing).
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
# A directory of the sandbox's own, on PATH, where ``python`` is python3 when the system has no ``python``.
SHIM_BIN = "/run/jobsite/bin"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
MISSING_WARNING = (
    "bubblewrap (bwrap) was not found: job processes run unsandboxed, as the server's user, and can read the "
    "database, other jobs' files and logs, and signal the server. Install it (Debian: apt-get install bubblewrap), "
    "or set JOBSITE_LOCAL_SANDBOX=off to run unsandboxed on purpose."
)


@dataclass(frozen=True)
class Facts:
    """What one replica's sandbox is built from."""

    bwrap: str
    work_dir: str  # the one writable directory; the command starts there
    command: list[str]
    uid: int = 65534
    gid: int = 65534
    # The supervisor runs as root: bubblewrap sets up as root, then ``setpriv`` drops to uid/gid for good.
    privileged: bool = False
    # (path, link target or "" for a directory) of SYSTEM_PATHS present on this machine.
    system: tuple[tuple[str, str], ...] = ()
    readonly: tuple[str, ...] = ()  # datasets, software, the attempt's hostfile
    writable: tuple[str, ...] = ()  # the group volume
    devices: tuple[tuple[str, str], ...] = ()  # (host node, /dev/name): the replica's GPUs and NVIDIA's controls
    files: tuple[tuple[str, str], ...] = ()  # (host file, path in the sandbox), read-only: the resolver's address
    system_root: str = ""  # an unpacked root file system shown as the system (an image's environment), else the host's
    env_bin: str = ""  # an image's environment: its bin/, first on PATH
    env_vars: tuple[tuple[str, str], ...] = ()  # and what it sets (VIRTUAL_ENV, CONDA_PREFIX)
    tmp_bytes: int = 0  # the size of /tmp and /var/tmp (0: unbounded)
    shm_bytes: int = 0  # the size of /dev/shm (0: unbounded)
    python_shim: str = ""  # the python3 that ``python`` runs, when the system has no ``python``
    # The installation (code tree, var/, the local root): an empty directory wherever what the sandbox shows
    # contains it (jobsite installed under /opt, say); the working directory and the examples still show.
    hidden: tuple[str, ...] = ()


def sandbox_argv(f: Facts) -> list[str]:
    """The bwrap command line that runs ``f.command`` in the replica's sandbox."""
    argv = [f.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try"]
    if not f.privileged:
        argv += ["--unshare-user", "--uid", str(f.uid), "--gid", str(f.gid)]
    for path, target in f.system:
        argv += ["--symlink", target, path] if target else ["--ro-bind", f.system_root + path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for scratch in SCRATCH:  # empty, and anyone's to write (sticky), as on the host; bounded
        size = f.shm_bytes if scratch == "/dev/shm" else f.tmp_bytes
        argv += [*(["--size", str(size)] if size else []), "--perms", "1777", "--tmpfs", scratch]
    for parent in dict.fromkeys(str(PurePosixPath(name).parent) for _, name in f.devices):
        if parent != "/dev":  # /dev/nvidia-caps: readable by all, as on the host
            argv += ["--perms", "0755", "--dir", parent]
    for node, name in f.devices:
        argv += ["--dev-bind", node, name]
    if f.python_shim:
        argv += ["--dir", SHIM_BIN, "--symlink", f.python_shim, f"{SHIM_BIN}/python"]
    argv += _mounts(f)
    for source, path in f.files:  # over what the system shows there
        argv += ["--ro-bind", source, path]
    argv += ["--chdir", f.work_dir]
    if f.privileged:
        caps = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # only what setpriv needs to drop to uid/gid
        argv += [arg for cap in caps for arg in ("--cap-add", cap)]
        argv += ["--", SETPRIV, "--reuid", str(f.uid), "--regid", str(f.gid), "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all"]
    return [*argv, "--", *f.command]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _deepest(path: str, roots) -> int:
    """The length of the deepest of ``roots`` that contains ``path``; -1: none."""
    return max((len(r) for r in roots if _under(path, r)), default=-1)


def _hidden(f: Facts) -> list[str]:
    """The installation's paths the sandbox would otherwise show, outermost only."""
    shown = [p for p, target in f.system if not target] + list(f.readonly) + list(f.writable)
    found: list[str] = []
    for h in sorted(f.hidden, key=len):
        if any(_under(h, s) for s in shown) and not any(_under(h, o) for o in found):
            found.append(h)
    return found


def _mounts(f: Facts) -> list[str]:
    """Datasets, software and the hostfile read-only, the group volume, the installation hidden, then the
    working directory, each after what contains it. The directories above a bind that are not the host's are
    created first (mode 0755): bubblewrap would otherwise copy their host modes, and the unprivileged user could
    not reach a working directory under a private /tmp/xyz."""
    ops = [(p, "--ro-bind") for p in f.readonly] + [(p, "--bind") for p in f.writable]
    ops += [(h, "--tmpfs") for h in _hidden(f)]
    ops.sort(key=lambda op: (len(PurePosixPath(op[0]).parts), op[1] == "--tmpfs"))
    ops.append((f.work_dir, "--bind"))
    host = [p for p, target in f.system if not target]  # the host's directories, so far
    fresh = list(SCRATCH)  # empty ones of the sandbox, so far
    made: set[str] = set()
    argv: list[str] = []
    for path, op in ops:
        if op == "--tmpfs":
            argv += [op, path]
            fresh.append(path)
            continue
        for parent in reversed(PurePosixPath(path).parents[:-1]):  # from the top, "/" left out
            p = str(parent)
            if p in made or p in fresh or _deepest(p, host) > _deepest(p, fresh):
                continue
            argv += ["--dir", p]
            made.add(p)
        argv += [op, path, path]
        host.append(path)
    return argv


def visible(path: str, f: Facts) -> bool:
    """Whether ``path`` (as named, links not followed) is inside something the sandbox shows."""
    roots = [p for p, _ in f.system] + list(f.readonly) + list(f.writable) + [f.work_dir, *SCRATCH, SHIM_BIN]
    return _deepest(path, roots) > _deepest(path, _hidden(f))


def sandbox_env(env: Mapping[str, str], f: Facts) -> dict[str, str]:
    """The replica's environment inside the sandbox: PATH keeps only directories the sandbox shows (the server's
    virtual environment or home are not there), after its image's environment's ``bin``, with ``python`` on it
    when the system has none."""
    kept = [d for d in env.get("PATH", "").split(":") if d and visible(d, f) and d != f.env_bin]
    path = ":".join([f.env_bin] * bool(f.env_bin) + kept) or DEFAULT_PATH
    if f.python_shim:
        path += f":{SHIM_BIN}"
    return {**env, **dict(f.env_vars), "PATH": path}


# --- the machine (not pure) ----------------------------------------------------------------------------------------


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def resolve_mode() -> str | None:
    """The bwrap to sandbox replicas with, from JOBSITE_LOCAL_SANDBOX; None: unsandboxed. Refuses (the scheduler
    does not start) when the setting asks for bwrap and there is none; warns when ``auto`` finds none."""
    mode = str(settings.JOBSITE_LOCAL_SANDBOX).strip().lower()
    if mode not in MODES:
        raise ImproperlyConfigured(f"JOBSITE_LOCAL_SANDBOX must be one of {', '.join(MODES)}, not {mode!r}.")
    if mode == "off":
        log.info("JOBSITE_LOCAL_SANDBOX=off: job processes run unsandboxed, as the server's user")
        return None
    found = find_bwrap()
    if found is None and mode == "bwrap":
        raise ImproperlyConfigured(
            "JOBSITE_LOCAL_SANDBOX=bwrap, but bubblewrap (bwrap) is not on PATH: the scheduler does not start. "
            "Install it (Debian: apt-get install bubblewrap) or set JOBSITE_LOCAL_SANDBOX=auto or off."
        )
    if found is None:
        log.warning("JOBSITE_LOCAL_SANDBOX=auto: %s", MISSING_WARNING)
    elif os.geteuid() == 0 and not os.access(SETPRIV, os.X_OK):
        raise ImproperlyConfigured(f"The sandbox of a server running as root needs {SETPRIV} (util-linux).")
    return found


def _system(root: str = "") -> tuple[tuple[str, str], ...]:
    """SYSTEM_PATHS present on this machine, or in the root file system ``root``."""
    found = []
    for path in SYSTEM_PATHS:
        if os.path.islink(root + path):
            found.append((path, os.readlink(root + path)))
        elif os.path.isdir(root + path):
            found.append((path, ""))
    return tuple(found)


def _existing(paths) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(p) for p in paths if p and os.path.isabs(str(p)) and os.path.exists(str(p))))


def host_facts(*, bwrap: str, work_dir: Path, command: list[str], hostfile: Path, group_volume: str = "",
               gpu_ids: Sequence[int] = (), memory_bytes: int = 0, resolv_conf: str = "",
               environment: Environment | None = None) -> Facts:
    """The Facts of one replica on this machine. ``resolv_conf``: a file to show as the system's resolver
    configuration (the job's network has its own resolver); ``environment``: its image's (environments.py)."""
    root = environment.root if environment is not None and environment.kind == "rootfs" else ""
    system = _system(root)
    readonly = [*settings.JOBSITE_LOCAL_SANDBOX_PATHS, hostfile, *(environment.shown if environment else ())]
    files = []
    resolv = "/etc/resolv.conf"  # may point into /run (systemd-resolved), which the sandbox does not show
    real = os.path.realpath(resolv)
    if root:  # the root file system's own, where it has one to cover
        real = resolv if os.path.isfile(root + resolv) and not os.path.islink(root + resolv) else ""
    elif os.path.islink(resolv) and not real.startswith("/etc/"):
        readonly.append(real)
    if resolv_conf and real and os.path.exists(root + real):
        files.append((resolv_conf, real))
    has_python = any(os.path.exists(f"{root}{d}/python") for d in ("/usr/local/bin", "/usr/bin", "/bin"))
    shim = "" if has_python else next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3")
                                       if os.path.exists(root + p)), "")
    memory = int(memory_bytes)
    return Facts(
        bwrap=bwrap, work_dir=str(work_dir), command=command, system_root=root,
        env_bin=environment.bin if environment else "", env_vars=environment.variables if environment else (),
        uid=settings.JOBSITE_LOCAL_SANDBOX_UID, gid=settings.JOBSITE_LOCAL_SANDBOX_GID,
        privileged=os.geteuid() == 0, system=system, readonly=_existing(readonly),
        writable=_existing([group_volume] if group_volume and os.path.isdir(group_volume) else []),
        devices=gpu_devices(settings.JOBSITE_LOCAL_DEVICE_DIR, gpu_ids), files=tuple(files),
        tmp_bytes=memory, shm_bytes=int(memory * settings.JOBSITE_LOCAL_SHM_FRACTION),
        python_shim=shim, hidden=_existing(installation()),
    )


def gpu_devices(device_dir: str, gpu_ids: Sequence[int]) -> tuple[tuple[str, str], ...]:
    """(node, /dev/name) of what a replica with ``gpu_ids`` sees of the NVIDIA devices under ``device_dir``: the
    node of each of its GPUs (``nvidiaN``) and, when it has any, the control devices CUDA needs (``nvidiactl``,
    ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset``, ``nvidia-caps/*``). A replica without GPUs sees none."""
    if not gpu_ids:
        return ()
    base = Path(device_dir)
    wanted = {f"nvidia{int(i)}" for i in gpu_ids}
    found = []
    for node in sorted(base.glob("nvidia*")) + sorted(base.glob("nvidia-caps/*")):
        name = node.relative_to(base).as_posix()
        gpu = name[len("nvidia"):].isdigit()
        if (name in wanted if gpu else not node.is_dir()) and node.is_char_device():
            found.append((str(node), f"/dev/{name}"))
    return tuple(found)


def installation() -> list:
    """What of this installation no job may see: the code, var/, the local backend's root, a SQLite database."""
    found = [settings.BASE_DIR, settings.VAR_DIR, settings.JOBSITE_LOCAL_ROOT]
    for db in settings.DATABASES.values():
        if str(db.get("ENGINE", "")).endswith("sqlite3") and os.path.isabs(str(db.get("NAME", ""))):
            found.append(os.path.dirname(str(db["NAME"])))
    return [os.path.realpath(p) for p in found] + found
