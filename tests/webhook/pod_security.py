"""Pod Security `baseline` as the API server's Pod Security admission evaluates a pod at the
newest policy version: the pod's metadata and spec only (what a device plugin mounts later is
invisible to it), every check over init, app and ephemeral containers alike, one reason per
failed check. A test's checker, so that the suite can show which pods a namespace enforcing
`baseline` admits."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

Json = Mapping[str, Any]

#: Capabilities `baseline` lets a container add (exact names, no CAP_ prefix).
ALLOWED_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
#: Sysctls `baseline` allows, at the newest policy version.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
SELINUX_TYPES_NEW = SELINUX_TYPES | {"container_engine_t"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(spec: Json) -> Iterator[Json]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(field) or ()


def _context(c: Json) -> Json:
    return c.get("securityContext") or {}


def baseline_problems(pod: Json) -> list[str]:
    """The `baseline` checks a Pod (metadata and spec) fails, each as `check: detail`."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ctx = spec.get("securityContext") or {}
    containers = list(_containers(spec))
    contexts = [ctx, *(_context(c) for c in containers)]
    found = []

    if any((c.get("windowsOptions") or {}).get("hostProcess") for c in contexts):
        found.append("windowsHostProcess")
    hosts = [k for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        found.append(f"hostNamespaces: {', '.join(hosts)}")
    privileged = [c["name"] for c in containers if _context(c).get("privileged")]
    if privileged:
        found.append(f"privileged: {', '.join(privileged)}")
    added = sorted(
        {
            cap
            for c in containers
            for cap in (_context(c).get("capabilities") or {}).get("add") or ()
            if cap not in ALLOWED_CAPABILITIES
        }
    )
    if added:
        found.append(f"capabilities: {', '.join(added)}")
    host_paths = [v["name"] for v in spec.get("volumes") or () if v.get("hostPath") is not None]
    if host_paths:
        found.append(f"hostPathVolumes: {', '.join(host_paths)}")
    ports = [
        str(p["hostPort"]) for c in containers for p in c.get("ports") or () if p.get("hostPort")
    ]
    if ports:
        found.append(f"hostPorts: {', '.join(ports)}")
    found += _profiles(meta, contexts)
    user_namespace = spec.get("hostUsers") is False
    proc = [
        c["name"]
        for c in containers
        if _context(c).get("procMount") not in (None, "Default") and not user_namespace
    ]
    if proc:
        found.append(f"procMount: {', '.join(proc)}")
    sysctls = [s.get("name") for s in ctx.get("sysctls") or () if s.get("name") not in SAFE_SYSCTLS]
    if sysctls:
        found.append(f"sysctls: {', '.join(map(str, sysctls))}")
    hosts_probed = [c["name"] for c in containers if _probe_hosts(c)]
    if hosts_probed:
        found.append(f"hostProbesAndHostLifecycle: {', '.join(hosts_probed)}")
    return found


def _profiles(meta: Json, contexts: list[Json]) -> list[str]:
    """AppArmor, SELinux and seccomp: each may be unset, never opted out of."""
    found = []
    annotations = meta.get("annotations") or {}
    apparmor = [
        k
        for k, v in annotations.items()
        if k.startswith(APPARMOR_ANNOTATION)
        and not (v in ("", "runtime/default") or v.startswith("localhost/"))
    ]
    if apparmor or any(
        (c.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost")
        for c in contexts
    ):
        found.append("appArmorProfile")
    selinux = [c.get("seLinuxOptions") or {} for c in contexts]
    if any(
        o.get("type", "") not in SELINUX_TYPES_NEW or o.get("user") or o.get("role")
        for o in selinux
    ):
        found.append("seLinuxOptions")
    if any((c.get("seccompProfile") or {}).get("type") == "Unconfined" for c in contexts):
        found.append("seccompProfile: Unconfined")
    return found


def _probe_hosts(c: Json) -> bool:
    handlers = [c.get(p) or {} for p in ("livenessProbe", "readinessProbe", "startupProbe")]
    lifecycle = c.get("lifecycle") or {}
    handlers += [lifecycle.get(h) or {} for h in ("postStart", "preStop")]
    return any(
        (h.get(kind) or {}).get("host") for h in handlers for kind in ("httpGet", "tcpSocket")
    )
