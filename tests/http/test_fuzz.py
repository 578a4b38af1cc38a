"""Whatever JSON arrives, the verbs answer with a result or a WireError (a 4xx), never an
unexpected exception (a 500): random documents in the request and random values in the Pod."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http.wire import WireError, binding_args, extender_args, preemption_args
from extender.service import ExtenderService, Victims
from tests.http.kube_objects import gpu_node, pod

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    ["Pod", "pod", "NodeNames", "Nodes", "NodeNameToMetaVictims", "NodeNameToVictims",
     "PodName", "PodNamespace", "PodUID", "Node", "x"]
)  # fmt: skip
POD_PATHS = st.sampled_from(
    [
        ("metadata",),
        ("metadata", "uid"),
        ("metadata", "resourceVersion"),
        ("spec",),
        ("spec", "containers"),
        ("spec", "initContainers"),
        ("spec", "priority"),
        ("spec", "securityContext"),
        ("spec", "overhead"),
        ("status",),
    ]
)


@pytest.fixture(scope="module")
def service() -> ExtenderService:
    """A started service; its verbs are synchronous, so the loop that started it may close."""
    cluster = EmbeddedCluster.from_objects([gpu_node("a"), gpu_node("b", gpus=1)])
    started = ExtenderService(cluster=cluster, config=Config.default(), warm_budget_s=0.0)
    asyncio.run(started.start())
    return started


def _exercise(service: ExtenderService, doc: dict[str, Any]) -> None:
    try:
        args = extender_args(doc)
    except WireError:
        pass
    else:
        service.filter(args.pod, args.names())
        service.scores(args.pod, args.names())
    try:
        pre = preemption_args(doc)
    except WireError:
        pass
    else:
        service.preempt(
            pre.pod, {n: Victims(v.uids, v.pdb_violations) for n, v in pre.victims.items()}
        )
    with contextlib.suppress(WireError):
        binding_args(doc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, JSON, max_size=4))
def test_random_request_documents(service: ExtenderService, doc: dict[str, Any]) -> None:
    _exercise(service, doc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(POD_PATHS, JSON, st.sampled_from([["a", "b"], ["a", "zz"]]))
def test_random_values_inside_a_pod(
    service: ExtenderService, path: tuple[str, ...], value: Any, names: list[str]
) -> None:
    p: dict[str, Any] = pod("fuzz", threads=20)
    target = p
    for key in path[:-1]:
        target = target.setdefault(key, {})
        if not isinstance(target, dict):
            return
    target[path[-1]] = value
    _exercise(service, {"Pod": p, "NodeNames": names, "NodeNameToMetaVictims": {"a": {"Pods": []}}})
