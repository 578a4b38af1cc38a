"""parse_pod: the Pod API (docs/design.md, Resources a pod asks for). Every rejection rule has a
test that pins its reason text; garbage in gives InvalidRequest, never TypeError or KeyError."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.packing.errors import InvalidRequest
from extender.packing.model import ComputeCapability, GpuInfo
from extender.packing.podspec import parse_pod
from extender.packing.request import ContainerAsk, demand_on
from extender.packing.settings import BudgetSettings

B = BudgetSettings()


def ctr(
    name: str = "main", *, limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "cuda"}
    if limits is not None:
        c["resources"] = {"limits": limits}
    c.update(extra)
    return c


def pod(
    *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "uid": "u-1"},
        "spec": body,
    }


def rejects(p: object, reason: str, **kw: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_pod(p, B, **kw)  # type: ignore[arg-type]
    assert reason in str(info.value), str(info.value)


def gpu(memory: int = 16384, units: int = 4) -> GpuInfo:
    return GpuInfo(0, "GPU-0", "x", memory, ComputeCapability(8, 0), 48, units)


# --- accepted requests ---------------------------------------------------------------------


def test_pod_without_mpsched_resources_is_kind_none() -> None:
    p = pod(ctr(limits={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}), ctr("b"))
    r = parse_pod(p, B)
    assert (r.kind, r.containers, r.namespace, r.name, r.pod_uid) == ("none", (), "ml", "p", "u-1")


def test_threads_and_memory_share() -> None:
    p = pod(ctr("train", limits={"mpsched.io/threads": "30", "mpsched.io/memory": "8Gi"}))
    p["spec"]["priority"] = 1000
    r = parse_pod(p, B)
    assert r.kind == "share"
    assert r.priority == 1000
    assert r.key == "ml/p"
    assert r.containers == (ContainerAsk("train", threads=30, memory_mib=8192),)


def test_memory_rounds_up_to_whole_mib() -> None:
    r = parse_pod(pod(ctr(limits={"mpsched.io/memory": "8G"})), B)
    assert r.containers[0].memory_mib == 7630


def test_requests_only_and_limits_only_both_count() -> None:
    only_req = pod({"name": "a", "resources": {"requests": {"mpsched.io/threads": "20"}}})
    assert parse_pod(only_req, B).containers[0].threads == 20
    assert (
        parse_pod(pod(ctr("a", limits={"mpsched.io/threads": 20})), B).containers[0].threads == 20
    )


def test_request_and_limit_may_be_spelled_differently_if_equal() -> None:
    c = {
        "name": "a",
        "resources": {
            "limits": {"mpsched.io/memory": "8Gi"},
            "requests": {"mpsched.io/memory": "8192Mi"},
        },
    }
    assert parse_pod(pod(c), B).containers[0].memory_mib == 8192


def test_units_and_clients() -> None:
    r = parse_pod(pod(ctr(limits={"mpsched.io/units": "2", "mpsched.io/clients": "3"})), B)
    assert r.containers == (ContainerAsk("main", units=2, clients=3),)


def test_whole_gpus_follow_the_effective_request_rule() -> None:
    p = pod(
        ctr("a", limits={"mpsched.io/gpus": "1"}),
        ctr("b", limits={"mpsched.io/gpus": "2"}),
        init=(ctr("i", limits={"mpsched.io/gpus": "4"}),),
    )
    r = parse_pod(p, B)
    assert (r.kind, r.whole_gpus) == ("whole", 4)
    p["spec"]["initContainers"][0]["resources"]["limits"]["mpsched.io/gpus"] = "2"
    assert parse_pod(p, B).whole_gpus == 3


def test_init_containers_count_once_not_summed() -> None:
    p = pod(
        ctr("app", limits={"mpsched.io/threads": "30", "mpsched.io/memory": "1Gi"}),
        init=(
            ctr("i1", limits={"mpsched.io/threads": "60", "mpsched.io/memory": "512Mi"}),
            ctr("i2", limits={"mpsched.io/threads": "50"}),
        ),
    )
    r = parse_pod(p, B)
    assert [(a.name, a.init) for a in r.containers] == [("app", False), ("i1", True), ("i2", True)]
    d = demand_on(r, gpu(), B)
    assert (d.threads, d.memory_mib, d.clients) == (60, 8064, 1)  # i2's memory: 50 % of 16128


def test_sidecars_count_like_app_containers() -> None:
    sidecar = ctr("proxy", limits={"mpsched.io/threads": "20"}, restartPolicy="Always")
    p = pod(ctr("app", limits={"mpsched.io/threads": "30"}), init=(sidecar,))
    r = parse_pod(p, B)
    assert [(a.name, a.init, a.sidecar) for a in r.containers] == [
        ("app", False, False),
        ("proxy", True, True),
    ]
    assert demand_on(r, gpu(), B).threads == 50
    assert demand_on(r, gpu(), B).clients == 2


def test_sidecars_started_earlier_add_to_a_later_init_container() -> None:
    # Kubernetes' rule (KEP-753): while init container "setup" runs, sidecar "proxy" (started
    # before it) runs too, so the pod needs 20 + 60 = 80, more than app + sidecars (50).
    p = pod(
        ctr("app", limits={"mpsched.io/threads": "30"}),
        init=(
            ctr("proxy", limits={"mpsched.io/threads": "20"}, restartPolicy="Always"),
            ctr("setup", limits={"mpsched.io/threads": "60"}),
            ctr("late", limits={"mpsched.io/threads": "5"}, restartPolicy="Always"),
        ),
    )
    d = demand_on(parse_pod(p, B), gpu(), B)
    assert d.threads == 80
    assert d.clients == 3  # app + both sidecars in steady state


def test_sidecars_join_the_thread_sum() -> None:
    sidecar = ctr("proxy", limits={"mpsched.io/threads": "40"}, restartPolicy="Always")
    rejects(
        pod(ctr("app", limits={"mpsched.io/threads": "70"}), init=(sidecar,)),
        "containers 'app', 'proxy' need mpsched.io/threads=110 at once, above 100",
    )


def test_run_as_user_container_overrides_pod() -> None:
    p = pod(
        ctr("a", limits={"mpsched.io/threads": "10"}, securityContext={"runAsUser": 1000}),
        ctr("b", limits={"mpsched.io/threads": "10"}),
        securityContext={"runAsUser": 1000},
    )
    assert parse_pod(p, B).run_as_user == 1000
    p["spec"]["securityContext"]["runAsUser"] = 2000
    rejects(p, "have different effective runAsUser")
    p["spec"]["containers"][1]["securityContext"] = {"runAsUser": 1000}
    assert parse_pod(p, B).run_as_user == 1000


def test_run_as_user_unset_everywhere_is_none() -> None:
    assert parse_pod(pod(ctr(limits={"mpsched.io/threads": "10"})), B).run_as_user is None


def test_run_as_user_set_on_one_share_container_only_is_rejected() -> None:
    p = pod(
        ctr("a", limits={"mpsched.io/threads": "10"}, securityContext={"runAsUser": 1000}),
        ctr("b", limits={"mpsched.io/threads": "10"}),
    )
    rejects(p, "'a' (1000), 'b' (image default) have different effective runAsUser")


def test_run_as_user_of_containers_without_a_share_does_not_matter() -> None:
    p = pod(
        ctr("a", limits={"mpsched.io/threads": "10"}, securityContext={"runAsUser": 1000}),
        ctr("log", securityContext={"runAsUser": 0}),
    )
    assert parse_pod(p, B).run_as_user == 1000


def test_whole_gpu_pods_may_mix_users() -> None:
    p = pod(
        ctr("a", limits={"mpsched.io/gpus": "1"}, securityContext={"runAsUser": 1}),
        ctr("b", limits={"mpsched.io/gpus": "1"}, securityContext={"runAsUser": 2}),
    )
    r = parse_pod(p, B)
    assert (r.kind, r.run_as_user, r.whole_gpus) == ("whole", None, 2)


def test_memory_only_needs_proportional_derivation() -> None:
    p = pod(ctr("m", limits={"mpsched.io/memory": "1Gi"}))
    assert parse_pod(p, B).containers[0].memory_mib == 1024
    with pytest.raises(
        InvalidRequest, match=r"without mpsched\.io/threads needs budgets\.proportional"
    ):
        parse_pod(p, BudgetSettings(proportional=False))


# --- rejections, one rule each -------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"mpsched.io/threads": "150"}, "container 'train': mpsched.io/threads=150 is above 100"),
        ({"mpsched.io/threads": "0"}, "container 'train': mpsched.io/threads=0 is below 1"),
        ({"mpsched.io/threads": "-5"}, "mpsched.io/threads=-5 is below 1"),
        ({"mpsched.io/threads": "1.5"}, "mpsched.io/threads=1.5 is not a whole number"),
        ({"mpsched.io/threads": "500m"}, "mpsched.io/threads=500m is not a whole number"),
        ({"mpsched.io/threads": "lots"}, "mpsched.io/threads=lots: quantity 'lots' is not a"),
        ({"mpsched.io/threads": None}, "mpsched.io/threads=None: quantity None is a NoneType"),
        ({"mpsched.io/memory": "0"}, "container 'train': mpsched.io/memory=0 must be positive"),
        ({"mpsched.io/memory": "-1Gi"}, "mpsched.io/memory=-1Gi must be positive"),
        ({"mpsched.io/memory": "0.5"}, "mpsched.io/memory=0.5 is not a whole number"),
        ({"mpsched.io/units": "0"}, "container 'train': mpsched.io/units=0 is below 1"),
        ({"mpsched.io/gpus": "0"}, "container 'train': mpsched.io/gpus=0 is below 1"),
        ({"mpsched.io/gpus": "2", "mpsched.io/clients": "0"}, "mpsched.io/clients=0 is below 1"),
        ({"mpsched.io/threads": "5", "mpsched.io/clients": "49"}, "clients=49 is above 48"),
        ({"mpsched.io/clients": "2"}, "'train': mpsched.io/clients needs mpsched.io/threads"),
        ({"mpsched.io/cores": "2"}, "container 'train': unknown resource 'mpsched.io/cores'"),
        (
            {"mpsched.io/threads": "5", "mpsched.io/units": "1"},
            "mpsched.io/units cannot be combined with mpsched.io/threads",
        ),
        (
            {"mpsched.io/memory": "1Gi", "mpsched.io/units": "1"},
            "mpsched.io/units cannot be combined with mpsched.io/memory",
        ),
        (
            {"mpsched.io/gpus": "1", "mpsched.io/threads": "5"},
            "mpsched.io/gpus (whole GPUs) cannot be combined with mpsched.io/threads",
        ),
        (
            {"mpsched.io/gpus": "1", "mpsched.io/units": "1"},
            "mpsched.io/gpus (whole GPUs) cannot be combined with mpsched.io/units",
        ),
    ],
)
def test_container_rules(limits: dict[str, Any], reason: str) -> None:
    rejects(pod(ctr("train", limits=limits)), reason)


def test_memory_larger_than_any_gpu() -> None:
    p = pod(ctr("train", limits={"mpsched.io/memory": "100Gi"}))
    assert parse_pod(p, B).containers[0].memory_mib == 102400  # unknown cluster: not checked
    rejects(
        p,
        "'train': mpsched.io/memory=100Gi (102400 MiB) is larger than any GPU (81920 MiB)",
        max_gpu_memory_mib=81920,
    )


def test_units_above_the_largest_u() -> None:
    p = pod(ctr("train", limits={"mpsched.io/units": "8"}))
    assert parse_pod(p, B, max_units=8).containers[0].units == 8
    rejects(p, "container 'train': mpsched.io/units=8 is above 7", max_units=7)


def test_pod_totals_across_containers() -> None:
    two = pod(
        ctr("a", limits={"mpsched.io/threads": "60", "mpsched.io/memory": "50Gi"}),
        ctr("b", limits={"mpsched.io/threads": "50", "mpsched.io/memory": "40Gi"}),
    )
    rejects(two, "containers 'a', 'b' need mpsched.io/threads=110 at once, above 100")
    two["spec"]["containers"][1]["resources"]["limits"]["mpsched.io/threads"] = "40"
    rejects(
        two,
        "need mpsched.io/memory=92160Mi at once, larger than any GPU (81920 MiB)",
        max_gpu_memory_mib=81920,
    )
    units = pod(
        ctr("a", limits={"mpsched.io/units": "3"}), ctr("b", limits={"mpsched.io/units": "2"})
    )
    rejects(units, "need mpsched.io/units=5 at once, above 4", max_units=4)
    assert parse_pod(units, B).kind == "share"


def test_init_containers_are_not_summed_with_app_containers() -> None:
    p = pod(
        ctr("a", limits={"mpsched.io/threads": "90"}),
        init=(ctr("i", limits={"mpsched.io/threads": "90"}),),
    )
    assert parse_pod(p, B).kind == "share"


def test_pod_mixing_share_and_whole_containers() -> None:
    p = pod(
        ctr("a", limits={"mpsched.io/threads": "10"}), ctr("b", limits={"mpsched.io/gpus": "1"})
    )
    rejects(p, "pod mixes shared-GPU containers ('a') with whole-GPU containers ('b')")


def test_requests_must_equal_limits() -> None:
    c = {
        "name": "a",
        "resources": {
            "limits": {"mpsched.io/threads": "20"},
            "requests": {"mpsched.io/threads": "10"},
        },
    }
    rejects(pod(c), "container 'a': mpsched.io/threads request 10 differs from limit 20")


def test_duplicate_container_names() -> None:
    rejects(pod(ctr("a"), init=(ctr("a"),)), "container name 'a' appears twice")


def test_invalid_run_as_user() -> None:
    p = pod(ctr("a", limits={"mpsched.io/threads": "10"}, securityContext={"runAsUser": "root"}))
    rejects(p, "container 'a': securityContext.runAsUser='root' is not a valid UID")
    p = pod(ctr("a", limits={"mpsched.io/threads": "10"}), securityContext={"runAsUser": -1})
    rejects(p, "spec.securityContext.runAsUser=-1 is not a valid UID")


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ([], "pod is a list, not an object"),
        ({"metadata": []}, "metadata is a list, not an object"),
        ({"metadata": {"name": 5}}, "metadata.name=5 is not a string"),
        ({"spec": "x"}, "spec is a str, not an object"),
        ({"spec": {"containers": {}}}, "spec.containers is a dict, not a list"),
        ({"spec": {"containers": [5]}}, "spec.containers[0] is a int, not an object"),
        ({"spec": {"containers": [{}]}}, "spec.containers[0] has no name"),
        ({"spec": {"initContainers": [{"name": ""}]}}, "spec.initContainers[0] has no name"),
        (
            {"spec": {"containers": [{"name": "a", "resources": 3}]}},
            "container 'a': resources is a int, not an object",
        ),
        (
            {"spec": {"containers": [{"name": "a", "resources": {"limits": ["x"]}}]}},
            "container 'a': resources.limits is a list, not an object",
        ),
        ({"spec": {"priority": "high"}}, "spec.priority='high' is not an integer"),
        ({"spec": {"priority": True}}, "spec.priority=True is not an integer"),
        ({"spec": {"securityContext": 1}}, "spec.securityContext is a int, not an object"),
    ],
)
def test_garbage_is_an_invalid_request(bad: object, reason: str) -> None:
    rejects(bad, reason)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
VALUES = st.one_of(
    st.sampled_from(["1", "50", "150", "0", "-1", "1.5", "8Gi", "1e3", "x", ""]), JSON
)
NAMES = st.sampled_from(
    [
        "mpsched.io/threads",
        "mpsched.io/memory",
        "mpsched.io/units",
        "mpsched.io/gpus",
        "mpsched.io/clients",
        "mpsched.io/other",
        "cpu",
    ]
)
CONTAINERS = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c"]) | JSON},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "limits": st.dictionaries(NAMES, VALUES, max_size=3) | JSON,
                "requests": st.dictionaries(NAMES, VALUES, max_size=3),
            },
        )
        | JSON,
        "restartPolicy": st.sampled_from(["Always", "Never"]),
        "securityContext": st.fixed_dictionaries(
            {"runAsUser": st.sampled_from([0, 1000, -1]) | JSON}
        ),
    },
)
PODS = (
    st.fixed_dictionaries(
        {},
        optional={
            "metadata": st.fixed_dictionaries({}, optional={"name": JSON, "uid": st.text()}) | JSON,
            "spec": st.fixed_dictionaries(
                {},
                optional={
                    "containers": st.lists(CONTAINERS, max_size=3) | JSON,
                    "initContainers": st.lists(CONTAINERS, max_size=2),
                    "priority": st.integers() | JSON,
                    "securityContext": st.fixed_dictionaries(
                        {"runAsUser": st.integers(-1, 2000) | JSON}
                    ),
                },
            )
            | JSON,
        },
    )
    | JSON
)


@settings(max_examples=400)
@given(PODS, st.none() | st.integers(1, 100_000), st.none() | st.integers(1, 48))
def test_arbitrary_input_parses_or_raises_invalid_request(
    p: object, max_mem: int | None, max_units: int | None
) -> None:
    try:
        r = parse_pod(p, B, max_gpu_memory_mib=max_mem, max_units=max_units)  # type: ignore[arg-type]
    except InvalidRequest:
        return
    assert r.kind in ("none", "share", "whole")
    if r.kind == "share":
        assert sum(a.threads or 0 for a in r.containers if not a.init) <= 100
