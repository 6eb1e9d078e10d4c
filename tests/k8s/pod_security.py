"""The Pod Security Standards, `baseline` and `restricted` (latest version), as checks of a pod spec.

Each function returns the rules a pod spec breaks (empty: admitted). Written from the standard's table
(https://kubernetes.io/docs/concepts/security/pod-security-standards/); Windows-only and deprecated-annotation
controls are left out, as no manifest here sets them.
"""

from __future__ import annotations

from collections.abc import Iterator

BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})
ALLOWED_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})


def containers(pod: dict) -> Iterator[dict]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _sc(obj: dict) -> dict:
    return obj.get("securityContext") or {}


def baseline_violations(pod: dict) -> list[str]:
    problems = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"{key}")
    for v in pod.get("volumes") or []:
        if "hostPath" in v:
            problems.append(f"hostPath volume {v['name']}")
    pod_sc = _sc(pod)
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl['name']}")
    for where, sc in [("pod", pod_sc)] + [(c["name"], _sc(c)) for c in containers(pod)]:
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            problems.append(f"{where}: seccompProfile Unconfined")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            problems.append(f"{where}: appArmorProfile Unconfined")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            problems.append(f"{where}: seLinuxOptions {selinux}")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}: hostProcess")
    for c in containers(pod):
        sc = _sc(c)
        if sc.get("privileged"):
            problems.append(f"{c['name']}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            problems.append(f"{c['name']}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            problems.append(f"{c['name']}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{c['name']}: procMount {sc['procMount']}")
    return problems


def restricted_violations(pod: dict) -> list[str]:
    problems = baseline_violations(pod)
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_sc = _sc(pod)
    for c in containers(pod):
        sc = _sc(c)
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if run_as_non_root is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ALLOWED_SECCOMP:
            problems.append(f"{name}: seccompProfile {seccomp!r}")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod: runAsUser 0")
    return problems
