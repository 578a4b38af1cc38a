"""What a Pod Security level refuses in a pod spec, decided without I/O, for `mpsched preflight`:
the checks of the built-in Pod Security admission that a GPU pod can trip (host namespaces,
privileged containers, added capabilities, hostPath and other volume types, host ports,
seccomp, privilege escalation, running as root). Windows, AppArmor, SELinux, procMount and
sysctl checks are left out: nothing mpsched adds touches them, so a pod failing one of them
fails without mpsched.

Owns the level names and the rule "a namespace without an enforce label is `privileged`".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

#: The namespace label that sets the enforced level.
ENFORCE_LABEL: Final = "pod-security.kubernetes.io/enforce"
LEVELS: Final = ("privileged", "baseline", "restricted")
#: Capabilities `baseline` lets a container add (exact names, no CAP_ prefix).
BASELINE_CAPABILITIES: Final = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
#: Volume types `restricted` allows; every other type (hostPath among them) is refused.
RESTRICTED_VOLUMES: Final = frozenset(
    {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
        "persistentVolumeClaim", "projected", "secret",
    }
)  # fmt: skip


def enforced_level(namespace: Mapping[str, Any] | None) -> str:
    """The level a namespace enforces: its label, `privileged` where it has none (the API
    server's default without an admission configuration of its own) or an unknown value."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    return level if level in LEVELS else "privileged"


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Init, regular and ephemeral containers: Pod Security checks all three."""
    return [
        c
        for key in ("initContainers", "containers", "ephemeralContainers")
        for c in spec.get(key) or []
        if isinstance(c, Mapping)
    ]


def _context(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found = obj.get("securityContext")
    return found if isinstance(found, Mapping) else {}


def violations(spec: Mapping[str, Any], level: str) -> list[str]:
    """What `level` refuses in `spec`, one short phrase each ("hostIPC", "hostPath volume
    mps-pipe", "container app: runAsNonRoot != true"); [] when the pod meets it."""
    if level not in ("baseline", "restricted"):
        return []
    restricted = level == "restricted"
    found = [key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key) is True]
    for volume in spec.get("volumes") or []:
        if not isinstance(volume, Mapping):
            continue
        name = volume.get("name", "")
        if "hostPath" in volume:
            found.append(f"hostPath volume {name}")
        elif restricted and not set(volume) - {"name"} <= RESTRICTED_VOLUMES:
            kinds = sorted(set(volume) - {"name"} - RESTRICTED_VOLUMES)
            found.append(f"{'/'.join(kinds)} volume {name}")
    pod = _context(spec)
    if (pod.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("seccompProfile Unconfined")
    if restricted and pod.get("runAsUser") == 0:
        found.append("runAsUser 0")
    for container in _containers(spec):
        found += [
            f"container {container.get('name', '')}: {p}"
            for p in _container(container, pod, restricted=restricted)
        ]
    return found


def _container(
    container: Mapping[str, Any], pod: Mapping[str, Any], *, restricted: bool
) -> list[str]:
    sc = _context(container)
    found: list[str] = []
    if sc.get("privileged") is True:
        found.append("privileged")
    capabilities: Mapping[str, Any] = _context({"securityContext": sc.get("capabilities")})
    added: Sequence[str] = capabilities.get("add") or []
    allowed = {"NET_BIND_SERVICE"} if restricted else BASELINE_CAPABILITIES
    extra = sorted(set(added) - allowed)
    if extra:
        found.append(f"adds capabilities {', '.join(extra)}")
    if any(isinstance(p, Mapping) and p.get("hostPort") for p in container.get("ports") or []):
        found.append("hostPort")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        found.append("seccompProfile Unconfined")
    if not restricted:
        return found
    if sc.get("allowPrivilegeEscalation") is not False:
        found.append("allowPrivilegeEscalation != false")
    non_root = sc.get("runAsNonRoot", pod.get("runAsNonRoot"))
    if non_root is not True:
        found.append("runAsNonRoot != true")
    if sc.get("runAsUser") == 0:
        found.append("runAsUser 0")
    if (seccomp or (pod.get("seccompProfile") or {}).get("type")) not in (
        "RuntimeDefault",
        "Localhost",
    ):
        found.append("no seccompProfile RuntimeDefault or Localhost")
    if "ALL" not in (capabilities.get("drop") or []):
        found.append("capabilities do not drop ALL")
    return found
