"""The demo's pod stream: a catalogue of pod templates (every kind of ask the Pod API allows,
pods that cannot fit, an invalid one) and the Pod objects made from them."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

NAMESPACE = "demo"

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container of a demo pod; immutable, so the templates below are constants and every
    pod gets fresh dicts."""

    name: str
    #: Resource limits (= requests), `mpsched.io/*` ones included.
    limits: tuple[tuple[str, str], ...]
    image: str = "nvcr.io/nvidia/pytorch:24.05-py3"

    def to_json(self) -> Json:
        limits = dict(self.limits)
        return {
            "name": self.name,
            "image": self.image,
            "resources": {"limits": limits, "requests": dict(limits)},
        }


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One kind of demo pod: what it asks for, in words and as containers."""

    kind: str
    asks: str
    containers: tuple[ContainerSpec, ...]
    init_containers: tuple[ContainerSpec, ...] = ()
    run_as_user: int | None = 1000
    node_selector: tuple[tuple[str, str], ...] = ()


def _container(name: str, **asks: str) -> ContainerSpec:
    gpu = tuple((f"mpsched.io/{k}", v) for k, v in asks.items())
    return ContainerSpec(name, (("cpu", "1"), ("memory", "4Gi"), *gpu))


def _t(
    kind: str,
    asks: str,
    *,
    user: int | None = 1000,
    on: str | None = None,
    init: tuple[ContainerSpec, ...] = (),
    containers: tuple[ContainerSpec, ...] = (),
    **asks_: str,
) -> PodTemplate:
    return PodTemplate(
        kind=kind,
        asks=asks,
        containers=containers or (_container("main", **asks_),),
        init_containers=init,
        run_as_user=user,
        node_selector=(("nvidia.com/gpu.product", on),) if on else (),
    )


#: Pods every full-size demo schedules once: each shows one rule of the Pod API or one kind of
#: GPU (docs/design.md: Resources a pod asks for, Budgets per GPU).
SPECIAL: tuple[PodTemplate, ...] = (
    _t("whole-1", "1 whole GPU", gpus="1"),
    _t("whole-2", "2 whole GPUs", gpus="2"),
    _t("whole-4", "4 whole GPUs", gpus="4"),
    _t("p100-whole", "1 whole GPU on a P100", on="Tesla-P100-PCIE-16GB", user=None, gpus="1"),
    _t("p100-share", "threads 20 on a P100 (pre-Volta)", on="Tesla-P100-PCIE-16GB", threads="20"),
    _t("l4", "threads 30 on an L4", on="NVIDIA-L4", threads="30"),
    _t("v100", "threads 25, 4 clients on a V100", on="Tesla-V100-SXM2-16GB", threads="25",
       clients="4"),
    _t("t4-gfd", "1 unit on the GFD-labelled T4", on="Tesla-T4-SHARED", units="1"),
    _t("a100", "threads 40, 16Gi on an A100", on="NVIDIA-A100-SXM4-40GB", threads="40",
       memory="16Gi"),
    _t("large", "threads 75, 30Gi", threads="75", memory="30Gi"),
    _t("memory-only", "12Gi (threads follow)", memory="12Gi"),
    _t("units-2", "2 units", units="2"),
    _t("clients", "threads 10, 4 clients", threads="10", clients="4"),
    _t("uid-2000", "threads 20 as UID 2000", user=2000, threads="20"),
    _t(
        "multi",
        "init threads 60; app 20+15 threads, 6Gi+4Gi",
        init=(_container("warmup", threads="60"),),
        containers=(
            _container("encoder", threads="20", memory="6Gi"),
            _container("decoder", threads="15", memory="4Gi"),
            ContainerSpec(
                "log-shipper", (("cpu", "100m"), ("memory", "128Mi")), "fluent/fluent-bit:3.1"
            ),
        ),
    ),
    _t("too-big", "16 whole GPUs (no node has 16)", gpus="16"),
    _t("invalid", "threads 150 (above 100)", threads="150"),
)  # fmt: skip

#: The rest of the stream: the everyday shares.
FILLER: tuple[PodTemplate, ...] = (
    _t("small", "threads 5", threads="5"),
    _t("small", "threads 10", threads="10"),
    _t("small", "threads 15", threads="15"),
    _t("small", "threads 20", threads="20"),
    _t("medium", "threads 25, 8Gi", threads="25", memory="8Gi"),
    _t("medium", "threads 30, 8Gi", threads="30", memory="8Gi"),
    _t("memory-only", "4Gi (threads follow)", memory="4Gi"),
    _t("units-1", "1 unit", units="1"),
    _t("large", "threads 50", threads="50"),
    _t("uid-2000", "threads 10 as UID 2000", user=2000, threads="10"),
)


def demo_templates(count: int, seed: int) -> list[PodTemplate]:
    """`count` templates in a seeded order: every special kind once (as many as fit), the rest
    everyday shares. The pods pinned to a GPU model by nodeSelector go first, so that each
    model shows a placement before the whole-GPU pods (which the packing policy sends to the
    smallest GPUs that fit) have taken its node."""
    rng = random.Random(seed)
    chosen = list(SPECIAL[:count]) + [rng.choice(FILLER) for _ in range(count - len(SPECIAL))]
    pinned = [t for t in chosen if t.node_selector]
    rest = [t for t in chosen if not t.node_selector]
    rng.shuffle(pinned)
    rng.shuffle(rest)
    return pinned + rest


def make_pod(template: PodTemplate, serial: int, rng: random.Random) -> Json:
    """A pending pod as the API server would hand it to kube-scheduler."""
    spec: Json = {
        "schedulerName": "default-scheduler",
        "restartPolicy": "Always",
        "containers": [c.to_json() for c in template.containers],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if template.init_containers:
        spec["initContainers"] = [c.to_json() for c in template.init_containers]
    if template.run_as_user is not None:
        spec["securityContext"] = {"runAsUser": template.run_as_user}
    if template.node_selector:
        spec["nodeSelector"] = dict(template.node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{template.kind}-{serial:02d}",
            "namespace": NAMESPACE,
            "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "labels": {"app.kubernetes.io/name": template.kind, "mpsched.io/demo": "true"},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }
