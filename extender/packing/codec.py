"""Annotation codecs (docs/design.md, Annotations): the node inventory `mpsched.io/gpus`, the pod
allocation `mpsched.io/allocation`, and the env-ready annotations the webhook's fieldRefs point at.

Owns the wire form of those annotations and nothing else. Encoders are canonical (sorted keys,
no blanks) so that equal values give equal strings; decoders validate every field, numbers
against their documented range (`bounds`), and raise only `CodecError`, naming the field,
whatever text they are given. Inventory derived from node
labels (no annotation) lives in `codec_labels`; `inventory_from_labels` is re-exported here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, Literal

from extender.packing import bounds
from extender.packing.bounds import Bound
from extender.packing.codec_labels import UNIT_LABELS, label_problem, units_from_labels
from extender.packing.codec_labels import inventory_from_labels as inventory_from_labels
from extender.packing.errors import CodecError, InvalidRequest
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.model import NVML_UUID_PREFIXES as NVML_UUID_PREFIXES
from extender.packing.model import ComputeCapability, GpuInfo, MpsState, NodeInventory, client_limit
from extender.packing.request import ContainerDemand
from extender.packing.settings import BudgetSettings

INVENTORY_KEY: Final = "mpsched.io/gpus"
ALLOCATION_KEY: Final = "mpsched.io/allocation"
VISIBLE_DEVICES_KEY: Final = "mpsched.io/visible-devices"
#: The allocation record's version; decoders refuse any other (docs/design.md, Annotations:
#: versioned).
ALLOCATION_VERSION: Final = 1
MPS_STATES: Final = frozenset({"ready", "down", "off"})
#: The name part of an annotation key is at most 63 characters (Kubernetes validation).
MAX_KEY_NAME: Final = 63


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _loads(text: object, what: str) -> object:
    if not isinstance(text, str):
        raise CodecError(f"{what}: expected JSON text, got {type(text).__name__}")
    try:
        return json.loads(text)
    # RecursionError: deeply nested input; ValueError covers JSONDecodeError and the int-digit
    # limit. Both are input faults, not bugs.
    except (ValueError, RecursionError) as exc:
        raise CodecError(f"{what}: not valid JSON ({str(exc)[:120]})") from None


def _obj(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise CodecError(f"{where}: expected an object, got {_kind(value)}")
    return value


def _int(obj: Mapping[str, Any], key: str, where: str, bound: Bound) -> int:
    """An integer field inside its documented range (`bounds`)."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"{where}.{key}: expected an integer, got {_kind(value)}")
    problem = bound.problem(value)
    if problem is not None:
        raise CodecError(f"{where}.{key}: {problem}")
    return value


def _str(obj: Mapping[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise CodecError(f"{where}.{key}: expected a non-empty string, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    """A short description of an unexpected value; never repr()s containers (they may be nested
    deeper than repr can recurse)."""
    if value is None:
        return "nothing"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


# --- node inventory ------------------------------------------------------------------------


def decode_inventory(
    node_name: str,
    text: str,
    *,
    budgets: BudgetSettings,
    labels: Mapping[str, str] | None = None,
) -> NodeInventory:
    """The node's GPUs from its `mpsched.io/gpus` annotation. Each GPU's maxClients is capped by
    its architecture's MPS limit and the configured cap; a missing `units` comes from the labels.
    GPU indices must be 0..n-1: the ledger addresses GPUs by position."""
    where = f"node {node_name!r} {INVENTORY_KEY}"
    doc = _loads(text, where)
    if not isinstance(doc, list):
        raise CodecError(f"{where}: expected a JSON list of GPUs, got {_kind(doc)}")
    labels = labels or {}
    problem = label_problem(labels, UNIT_LABELS)
    if problem is not None:
        raise CodecError(f"node {node_name!r} labels: {problem}")
    if len(doc) > bounds.MAX_GPUS_PER_NODE:
        raise CodecError(f"{where}: {len(doc)} GPUs, more than {bounds.MAX_GPUS_PER_NODE}")
    default_units = units_from_labels(labels, budgets)
    gpus = sorted(
        (_decode_gpu(item, f"{where}[{i}]", budgets, default_units) for i, item in enumerate(doc)),
        key=lambda g: g.index,
    )
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise CodecError(f"{where}: GPU indices must be 0..{len(gpus) - 1} once each")
    if len({g.uuid for g in gpus}) != len(gpus):
        raise CodecError(f"{where}: two GPUs share a uuid")
    pairs = tuple(sorted((k, v) for k, v in labels.items() if isinstance(v, str)))
    return NodeInventory(name=node_name, gpus=tuple(gpus), labels=pairs)


def _decode_gpu(item: object, where: str, budgets: BudgetSettings, default_units: int) -> GpuInfo:
    obj = _obj(item, where)
    cc_text = obj.get("computeCapability")
    if not isinstance(cc_text, str):
        raise CodecError(f"{where}.computeCapability: expected a string, got {_kind(cc_text)}")
    try:
        cc = ComputeCapability.parse(cc_text)
    except InvalidRequest as exc:
        raise CodecError(f"{where}.computeCapability: {exc}") from None
    cc_problem = bounds.COMPUTE_MAJOR.problem(cc.major) or bounds.COMPUTE_MINOR.problem(cc.minor)
    if cc_problem is not None:
        raise CodecError(f"{where}.computeCapability: {cc_problem}")
    # The agent decided maxClients from the driver; this bounds what any agent may claim.
    limit = client_limit(cc, budgets.max_clients_per_gpu, cuda131=budgets.clients_cuda131)
    mps = obj.get("mps", "ready")
    if not isinstance(mps, str) or mps not in MPS_STATES:
        raise CodecError(f"{where}.mps: expected one of ready, down, off, got {_kind(mps)}")
    model = obj.get("model", "")
    if not isinstance(model, str):
        raise CodecError(f"{where}.model: expected a string, got {_kind(model)}")
    mig = obj.get("mig", False)
    if not isinstance(mig, bool):
        raise CodecError(f"{where}.mig: expected true or false, got {_kind(mig)}")
    return GpuInfo(
        index=_int(obj, "index", where, bounds.GPU_INDEX),
        uuid=_str(obj, "uuid", where),
        model=model,
        memory_mib=_int(obj, "memoryMiB", where, bounds.GPU_MEMORY_MIB),
        compute_capability=cc,
        max_clients=(
            min(limit, _int(obj, "maxClients", where, bounds.MAX_CLIENTS))
            if "maxClients" in obj
            else limit
        ),
        units=_int(obj, "units", where, bounds.UNITS) if "units" in obj else default_units,
        mps=_mps(mps),
        mig=mig,
    )


def _mps(value: str) -> MpsState:
    return "ready" if value == "ready" else "down" if value == "down" else "off"


def encode_inventory(inventory: NodeInventory) -> str:
    """The `mpsched.io/gpus` annotation value for `inventory` (canonical JSON)."""
    return _dumps(
        [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memoryMiB": g.memory_mib,
                "computeCapability": str(g.compute_capability),
                "maxClients": g.max_clients,
                "units": g.units,
                "mps": g.mps,
                # Written only where true, so that inventories without MIG read as before.
                **({"mig": True} if g.mig else {}),
            }
            for g in inventory.gpus
        ]
    )


# --- pod allocation --------------------------------------------------------------------------


def encode_allocation(alloc: Allocation) -> str:
    """The `mpsched.io/allocation` annotation value: the decision without the pod's own identity
    (uid, namespace, name, priority come from the pod the annotation sits on)."""
    return _dumps(
        {
            "v": ALLOCATION_VERSION,
            "node": alloc.node,
            "kind": alloc.kind,
            "gpus": [{"index": g.index, "uuid": g.uuid} for g in alloc.gpus],
            "threads": alloc.threads,
            "memoryMiB": alloc.memory_mib,
            "clients": alloc.clients,
            "containers": [
                {
                    "name": c.name,
                    "threads": c.threads,
                    "memoryMiB": c.memory_mib,
                    "clients": c.clients,
                }
                for c in alloc.containers
            ],
            "uid": alloc.run_as_user,
        }
    )


def decode_allocation(
    text: str, *, pod_uid: str, namespace: str, name: str, priority: int = 0
) -> Allocation:
    """The Allocation recorded in a pod's `mpsched.io/allocation` annotation."""
    where = f"pod {namespace}/{name} {ALLOCATION_KEY}"
    obj = _obj(_loads(text, where), where)
    version = obj.get("v")
    if version != ALLOCATION_VERSION or isinstance(version, bool):
        shown = version if isinstance(version, int) else _kind(version)
        raise CodecError(
            f"{where}: version {shown} is not supported "
            f"(this build reads version {ALLOCATION_VERSION})"
        )
    kind = obj.get("kind")
    if kind not in ("share", "whole"):
        raise CodecError(f"{where}.kind: expected 'share' or 'whole', got {_kind(kind)}")
    gpus_raw = obj.get("gpus")
    if not isinstance(gpus_raw, list) or not gpus_raw:
        raise CodecError(f"{where}.gpus: expected a non-empty list, got {_kind(gpus_raw)}")
    if len(gpus_raw) > bounds.MAX_GPUS_PER_NODE:
        raise CodecError(f"{where}.gpus: {len(gpus_raw)} GPUs, more than a node holds")
    gpus = tuple(_decode_ref(g, f"{where}.gpus[{i}]") for i, g in enumerate(gpus_raw))
    if kind == "share" and len(gpus) != 1:
        raise CodecError(f"{where}.gpus: a share lives on exactly one GPU, got {len(gpus)}")
    if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
        raise CodecError(f"{where}.gpus: a GPU is listed twice")
    containers_raw = obj.get("containers", [])
    if not isinstance(containers_raw, list):
        raise CodecError(f"{where}.containers: expected a list, got {_kind(containers_raw)}")
    containers = tuple(
        _decode_container(c, f"{where}.containers[{i}]") for i, c in enumerate(containers_raw)
    )
    if len({c.name for c in containers}) != len(containers):
        raise CodecError(f"{where}.containers: a container is listed twice")
    uid = obj.get("uid")
    if uid is not None:
        uid = _int(obj, "uid", where, bounds.RUN_AS_USER)
    return Allocation(
        pod_uid=pod_uid,
        namespace=namespace,
        name=name,
        node=_str(obj, "node", where),
        kind=_kind_of(kind),
        gpus=gpus,
        threads=_int(obj, "threads", where, bounds.ALLOCATION_THREADS),
        memory_mib=_int(obj, "memoryMiB", where, bounds.ALLOCATION_MEMORY_MIB),
        clients=_int(obj, "clients", where, bounds.ALLOCATION_CLIENTS),
        containers=containers,
        run_as_user=uid,
        priority=priority,
    )


def decode_allocation_on(
    text: str, *, node: str, pod_uid: str, namespace: str, name: str, priority: int = 0
) -> Allocation | str:
    """The Allocation a pod bound to `node` carries, or why it cannot count: the annotation does
    not decode, or it names another node (copied from another pod, or stale)."""
    try:
        alloc = decode_allocation(
            text, pod_uid=pod_uid, namespace=namespace, name=name, priority=priority
        )
    except CodecError as exc:
        return str(exc)
    if alloc.node != node:
        return f"allocation names node {alloc.node!r}, the pod runs on {node!r}"
    return alloc


def _kind_of(value: str) -> Literal["share", "whole"]:
    return "share" if value == "share" else "whole"


def _decode_ref(item: object, where: str) -> GpuRef:
    obj = _obj(item, where)
    return GpuRef(index=_int(obj, "index", where, bounds.GPU_INDEX), uuid=_str(obj, "uuid", where))


def _decode_container(item: object, where: str) -> ContainerDemand:
    obj = _obj(item, where)
    return ContainerDemand(
        name=_str(obj, "name", where),
        threads=_int(obj, "threads", where, bounds.CONTAINER_THREADS),
        memory_mib=_int(obj, "memoryMiB", where, bounds.ALLOCATION_MEMORY_MIB),
        clients=_int(obj, "clients", where, bounds.ALLOCATION_CLIENTS),
    )


# --- env-ready annotations -------------------------------------------------------------------
#
# Key scheme: `mpsched.io/<what>.<container>` with <what> in {threads, mem-limit}. Container
# names are DNS labels of up to 63 characters, so the name part `<what>.<container>` can pass
# the 63-character limit: then the container name is cut and an 8-hex-digit SHA-256 of the full
# name appended (`mem-limit.<first 44 chars>-<hash>`). Names up to 55 (threads) and 53
# (mem-limit) characters are used as they are. The webhook builds its fieldRefs with the same
# functions, so it never has to know the scheme.


def _env_key(what: str, container: str) -> str:
    name = f"{what}.{container}"
    if len(name) > MAX_KEY_NAME:
        digest = hashlib.sha256(container.encode()).hexdigest()[:8]
        name = f"{what}.{container[: MAX_KEY_NAME - len(what) - 10]}-{digest}"
    return f"mpsched.io/{name}"


def threads_key(container: str) -> str:
    """Annotation holding the container's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE value."""
    return _env_key("threads", container)


def mem_limit_key(container: str) -> str:
    """Annotation holding the container's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value."""
    return _env_key("mem-limit", container)


def visible_device(ref: GpuRef) -> str:
    """How NVIDIA_VISIBLE_DEVICES names one GPU: its NVML UUID where the agent reported one,
    else its index, which the NVIDIA container runtime accepts too. Inventories derived from
    feature-discovery or GKE labels have no UUIDs: their stand-ins (`<node>-gpu<i>`) mean
    nothing to a runtime. NVML UUIDs start `GPU-` (or `MIG-`); node names are lowercase DNS
    labels, so a stand-in can never look like one."""
    return ref.uuid if ref.uuid.startswith(NVML_UUID_PREFIXES) else str(ref.index)


def env_annotations(alloc: Allocation) -> dict[str, str]:
    """The values the injected env vars read through the downward API: the visible devices
    (GPU uuids, comma-joined) and, per share container, its thread percentage and `0=<MiB>M`
    pinned-memory limit (device 0: the container sees only its one GPU). A container with no
    memory budget (proportional derivation off, threads only) gets no memory-limit key: "0M"
    would forbid all device memory, so the webhook must not inject that variable for it."""
    out = {VISIBLE_DEVICES_KEY: ",".join(map(visible_device, alloc.gpus))}
    if alloc.kind == "share":
        for c in alloc.containers:
            out[threads_key(c.name)] = str(c.threads)
            if c.memory_mib > 0:
                out[mem_limit_key(c.name)] = f"0={c.memory_mib}M"
    return out


def allocation_annotations(alloc: Allocation) -> dict[str, str]:
    """Every annotation a bind writes: the allocation record and the env-ready values."""
    return {ALLOCATION_KEY: encode_allocation(alloc), **env_annotations(alloc)}
