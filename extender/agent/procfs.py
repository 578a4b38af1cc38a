"""Which pod an MPS client belongs to, read from the host's /proc: the agent runs with hostPID,
so NVML's client PIDs are PIDs in its own /proc, and each one's `cgroup` file names its pod.

Owns the file reads only (`usage.pod_uid_from_cgroup` reads the text). They are blocking
syscalls, so one batch runs in one worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from extender.agent.usage import pod_uid_from_cgroup

#: Bytes read of one `cgroup` file: a v1 host has a dozen short lines, v2 one; a file longer
#: than this names no pod we could trust anyway.
MAX_CGROUP_BYTES: Final = 64 * 1024


async def owners_of(pids: Iterable[int], *, proc_root: str) -> dict[int, str]:
    """pid → pod UID for every pid whose cgroup names a pod. A pid that has exited (its /proc
    entry gone, or going while read) or that belongs to no pod is simply absent. Other read
    errors (no permission on the host's /proc: a deployment fault) raise OSError."""
    batch = sorted({pid for pid in pids if pid > 0})
    return await asyncio.to_thread(_read_owners, batch, Path(proc_root)) if batch else {}


def _read_owners(pids: list[int], root: Path) -> dict[int, str]:
    owners: dict[int, str] = {}
    for pid in pids:
        text = _read_cgroup(root / str(pid) / "cgroup")
        uid = pod_uid_from_cgroup(text) if text is not None else None
        if uid is not None:
            owners[pid] = uid
    return owners


def _read_cgroup(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CGROUP_BYTES)
    # ENOENT: exited before we looked; ESRCH: exited while we read (procfs answers so).
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data.decode("utf-8", errors="replace")
