"""Annotation codecs: inventory and allocation round-trip, are canonical, and raise nothing but
CodecError on arbitrary input; label-derived inventory; env-ready annotation keys."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import replace
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.packing import bounds
from extender.packing.bounds import Bound
from extender.packing.codec import (
    ALLOCATION_KEY,
    VISIBLE_DEVICES_KEY,
    allocation_annotations,
    decode_allocation,
    decode_allocation_on,
    decode_inventory,
    encode_allocation,
    encode_inventory,
    env_annotations,
    mem_limit_key,
    threads_key,
)
from extender.packing.errors import CodecError
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory, client_limit
from extender.packing.request import ContainerDemand
from extender.packing.settings import BudgetSettings

B = BudgetSettings()
H100 = ComputeCapability(9, 0)
# An annotation key's name part (after the prefix): at most 63 characters of this shape.
NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def gpu_json(i: int, **over: object) -> dict[str, object]:
    g: dict[str, object] = {
        "index": i,
        "uuid": f"GPU-{i}",
        "model": "NVIDIA H100 80GB HBM3",
        "memoryMiB": 81559,
        "computeCapability": "9.0",
        "maxClients": 48,
        "units": 4,
        "mps": "ready",
    }
    g.update(over)
    return {k: v for k, v in g.items() if v is not None}


def inv_text(*gpus: dict[str, object]) -> str:
    return json.dumps(list(gpus))


# --- inventory -------------------------------------------------------------------------------


def test_decode_inventory() -> None:
    inv = decode_inventory("n1", inv_text(gpu_json(1), gpu_json(0)), budgets=B)
    assert inv.name == "n1"
    assert [g.index for g in inv.gpus] == [0, 1]  # index order whatever the annotation's order
    assert inv.gpus[0] == GpuInfo(0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559, H100, 48, 4, "ready")


def test_max_clients_is_capped_by_architecture_and_configuration() -> None:
    text = inv_text(
        gpu_json(0, maxClients=60),
        gpu_json(1, maxClients=48, computeCapability="6.0"),
        gpu_json(2, maxClients=None),
    )
    assert [g.max_clients for g in decode_inventory("n", text, budgets=B).gpus] == [48, 16, 48]
    capped = decode_inventory("n", text, budgets=BudgetSettings(max_clients_per_gpu=10))
    assert [g.max_clients for g in capped.gpus] == [10, 10, 10]
    assert (
        decode_inventory("n", inv_text(gpu_json(0, maxClients=3)), budgets=B).gpus[0].max_clients
        == 3
    )


@pytest.mark.parametrize(
    ("labels", "units"),
    [
        ({}, 4),
        ({"nvidia.com/gpu.replicas": "8"}, 8),
        ({"nvidia.com/gpu.replicas": "1"}, 4),  # NDP's "not shared": not a unit count
        (
            {
                "cloud.google.com/gke-max-shared-clients-per-gpu": "3",
                "nvidia.com/gpu.replicas": "8",
            },
            3,
        ),
        ({"cloud.google.com/gke-max-shared-clients-per-gpu": "x"}, 4),
    ],
)
def test_units_fallback_order(labels: dict[str, str], units: int) -> None:
    inv = decode_inventory("n", inv_text(gpu_json(0, units=None)), budgets=B, labels=labels)
    assert inv.gpus[0].units == units
    assert dict(inv.labels) == labels
    given_units = decode_inventory("n", inv_text(gpu_json(0, units=7)), budgets=B, labels=labels)
    assert given_units.gpus[0].units == 7


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not valid JSON"),
        ("{}", "expected a JSON list of GPUs, got an object"),
        ("[1]", "[0]: expected an object, got int 1"),
        (inv_text(gpu_json(0, uuid=None)), "[0].uuid: expected a non-empty string, got nothing"),
        (inv_text(gpu_json(0, uuid="")), "[0].uuid: expected a non-empty string"),
        (inv_text(gpu_json(0, index=-1)), "[0].index: -1 is below 0"),
        (inv_text(gpu_json(0, index=True)), "[0].index: expected an integer, got bool True"),
        (inv_text(gpu_json(0, memoryMiB=0)), "[0].memoryMiB: 0 is below 1"),
        (inv_text(gpu_json(0, memoryMiB=1.5)), "[0].memoryMiB: expected an integer, got float"),
        (inv_text(gpu_json(0, computeCapability=9)), "[0].computeCapability: expected a string"),
        (inv_text(gpu_json(0, computeCapability="nine")), "not of the form MAJOR.MINOR"),
        (inv_text(gpu_json(0, mps="up")), "[0].mps: expected one of ready, down, off"),
        (inv_text(gpu_json(0, units=0)), "[0].units: 0 is below 1"),
        (inv_text(gpu_json(0, model=3)), "[0].model: expected a string"),
        (inv_text(gpu_json(0, mig="yes")), "[0].mig: expected true or false"),
        (inv_text(gpu_json(0), gpu_json(0, uuid="GPU-x")), "GPU indices must be 0..1 once each"),
        (inv_text(gpu_json(0), gpu_json(2)), "GPU indices must be 0..1 once each"),
        (inv_text(gpu_json(0), gpu_json(1, uuid="GPU-0")), "two GPUs share a uuid"),
    ],
)
def test_decode_inventory_rejects_naming_the_field(text: str, reason: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_inventory("n1", text, budgets=B)
    assert "node 'n1' mpsched.io/gpus" in str(info.value)
    assert reason in str(info.value), str(info.value)


def test_encode_inventory_is_canonical() -> None:
    inv = decode_inventory("n", inv_text(gpu_json(0)), budgets=B)
    assert encode_inventory(inv) == (
        '[{"computeCapability":"9.0","index":0,"maxClients":48,"memoryMiB":81559,'
        '"model":"NVIDIA H100 80GB HBM3","mps":"ready","units":4,"uuid":"GPU-0"}]'
    )


def test_a_mig_gpu_is_read_and_written_with_its_flag() -> None:
    inv = decode_inventory("n", inv_text(gpu_json(0, mig=True), gpu_json(1)), budgets=B)
    assert [g.mig for g in inv.gpus] == [True, False]
    assert [("mig" in g) for g in json.loads(encode_inventory(inv))] == [True, False]


CCS = st.sampled_from([ComputeCapability(6, 0), ComputeCapability(7, 0), ComputeCapability(9, 0)])


@st.composite
def inventories(draw: st.DrawFn) -> NodeInventory:
    n = draw(st.integers(0, 4))
    uuids = draw(st.lists(st.text(min_size=1, max_size=12), min_size=n, max_size=n, unique=True))
    gpus = []
    for i, uuid in enumerate(uuids):
        cc = draw(CCS)
        gpus.append(
            GpuInfo(
                index=i,
                uuid=uuid,
                model=draw(st.text(max_size=10)),
                memory_mib=draw(st.integers(1, 200_000)),
                compute_capability=cc,
                max_clients=draw(st.integers(0, client_limit(cc))),
                units=draw(st.integers(1, 48)),
                mps=draw(st.sampled_from(["ready", "down", "off"])),
                mig=draw(st.booleans()),
            )
        )
    return NodeInventory(name=draw(st.text(min_size=1, max_size=10)), gpus=tuple(gpus))


@given(inventories())
def test_inventory_round_trips(inv: NodeInventory) -> None:
    text = encode_inventory(inv)
    assert decode_inventory(inv.name, text, budgets=B) == inv
    assert encode_inventory(decode_inventory(inv.name, text, budgets=B)) == text


# --- allocation ------------------------------------------------------------------------------

SHARE = Allocation(
    pod_uid="u1",
    namespace="ml",
    name="p",
    node="n1",
    kind="share",
    gpus=(GpuRef(1, "GPU-1"),),
    threads=50,
    memory_mib=8192,
    clients=2,
    containers=(ContainerDemand("a", 30, 4096, 1), ContainerDemand("b", 20, 4096, 1)),
    run_as_user=1000,
    priority=7,
)


def test_encode_allocation_is_canonical_and_compact() -> None:
    assert encode_allocation(SHARE) == (
        '{"clients":2,"containers":[{"clients":1,"memoryMiB":4096,"name":"a","threads":30},'
        '{"clients":1,"memoryMiB":4096,"name":"b","threads":20}],"gpus":[{"index":1,"uuid":"GPU-1"}],'
        '"kind":"share","memoryMiB":8192,"node":"n1","threads":50,"uid":1000,"v":1}'
    )


def test_decode_allocation_takes_identity_from_the_pod() -> None:
    text = encode_allocation(SHARE)
    assert decode_allocation(text, pod_uid="u1", namespace="ml", name="p", priority=7) == SHARE
    other = decode_allocation(text, pod_uid="u2", namespace="x", name="q")
    assert (other.pod_uid, other.namespace, other.name, other.priority) == ("u2", "x", "q", 0)


def _alloc_text(**over: object) -> str:
    doc = json.loads(encode_allocation(SHARE))
    doc.update(over)
    return json.dumps({k: v for k, v in doc.items() if v != "DROP"})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("nope", "not valid JSON"),
        ("[]", "expected an object, got a list"),
        (_alloc_text(v=2), "version 2 is not supported (this build reads version 1)"),
        (_alloc_text(v="1"), "version str '1' is not supported"),
        (_alloc_text(v="DROP"), "version nothing is not supported"),
        (_alloc_text(v=True), "version True is not supported"),
        (_alloc_text(kind="half"), ".kind: expected 'share' or 'whole'"),
        (_alloc_text(gpus=[]), ".gpus: expected a non-empty list"),
        (
            _alloc_text(gpus=[{"index": 0, "uuid": "a"}, {"index": 1, "uuid": "b"}]),
            "a share lives on exactly one GPU, got 2",
        ),
        (
            _alloc_text(kind="whole", gpus=[{"index": 0, "uuid": "a"}, {"index": 0, "uuid": "b"}]),
            ".gpus: a GPU is listed twice",
        ),
        (_alloc_text(gpus=[{"index": 0}]), ".gpus[0].uuid: expected a non-empty string"),
        (_alloc_text(threads=-1), ".threads: -1 is below 0"),
        (_alloc_text(memoryMiB="8Gi"), ".memoryMiB: expected an integer, got str '8Gi'"),
        (_alloc_text(clients=None), ".clients: expected an integer, got nothing"),
        (_alloc_text(node=""), ".node: expected a non-empty string"),
        (_alloc_text(uid=-5), ".uid: -5 is below 0"),
        (_alloc_text(uid="root"), ".uid: expected an integer"),
        (_alloc_text(containers={}), ".containers: expected a list, got an object"),
        (
            _alloc_text(containers=[{"name": "a", "threads": 1, "memoryMiB": 1}]),
            ".containers[0].clients: expected an integer",
        ),
        (
            _alloc_text(containers=[{"name": "a", "threads": 1, "memoryMiB": 1, "clients": 1}] * 2),
            ".containers: a container is listed twice",
        ),
    ],
)
def test_decode_allocation_rejects_naming_the_field(text: str, reason: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_allocation(text, pod_uid="u1", namespace="ml", name="p")
    assert "pod ml/p mpsched.io/allocation" in str(info.value)
    assert reason in str(info.value), str(info.value)


def test_unknown_fields_of_version_1_are_ignored() -> None:
    # Forward compatibility within a version: a newer writer may add fields.
    alloc = decode_allocation(_alloc_text(extra={"x": 1}), pod_uid="u1", namespace="ml", name="p")
    assert alloc == replace(SHARE, priority=0)


@st.composite
def allocations(draw: st.DrawFn) -> Allocation:
    kind: Literal["share", "whole"] = draw(st.sampled_from(["share", "whole"]))
    n = 1 if kind == "share" else draw(st.integers(1, 8))
    indices = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n, unique=True))
    uuids = draw(st.lists(st.text(min_size=1, max_size=10), min_size=n, max_size=n, unique=True))
    names = draw(st.lists(st.text(min_size=1, max_size=63), max_size=4, unique=True))

    def within(bound: Bound) -> st.SearchStrategy[int]:
        return st.integers(bound.low, bound.high)

    return Allocation(
        pod_uid=draw(st.text(max_size=8)),
        namespace=draw(st.text(max_size=8)),
        name=draw(st.text(max_size=8)),
        node=draw(st.text(min_size=1, max_size=12)),
        kind=kind,
        gpus=tuple(GpuRef(i, u) for i, u in zip(indices, uuids, strict=True)),
        threads=draw(within(bounds.ALLOCATION_THREADS)),
        memory_mib=draw(within(bounds.ALLOCATION_MEMORY_MIB)),
        clients=draw(within(bounds.ALLOCATION_CLIENTS)),
        containers=tuple(
            ContainerDemand(
                c,
                draw(within(bounds.CONTAINER_THREADS)),
                draw(within(bounds.ALLOCATION_MEMORY_MIB)),
                draw(within(bounds.ALLOCATION_CLIENTS)),
            )
            for c in names
        ),
        run_as_user=draw(st.none() | within(bounds.RUN_AS_USER)),
        priority=draw(st.integers(-(2**31), 2**31)),
    )


@given(allocations())
def test_allocation_round_trips(alloc: Allocation) -> None:
    text = encode_allocation(alloc)
    back = decode_allocation(
        text,
        pod_uid=alloc.pod_uid,
        namespace=alloc.namespace,
        name=alloc.name,
        priority=alloc.priority,
    )
    assert back == alloc
    assert encode_allocation(back) == text


# --- arbitrary input -------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
# Documents shaped like the real thing, with wrong values in places: reaches the field checks.
NEAR_GPU = st.dictionaries(
    st.sampled_from(
        ["index", "uuid", "model", "memoryMiB", "computeCapability", "maxClients", "units", "mps"]
    ),
    JSON | st.integers(-2, 3) | st.sampled_from(["9.0", "7.5", "x", "ready", "off"]),
)
NEAR_ALLOC = st.dictionaries(
    st.sampled_from(
        ["v", "node", "kind", "gpus", "threads", "memoryMiB", "clients", "containers", "uid"]
    ),
    JSON
    | st.just(1)
    | st.sampled_from(["share", "whole", "n"])
    | st.lists(
        st.fixed_dictionaries({"index": st.integers(-1, 2), "uuid": JSON | st.text()}), max_size=2
    ),
)
TEXTS = st.one_of(
    st.text(max_size=40),
    JSON.map(json.dumps),
    st.lists(NEAR_GPU, max_size=3).map(json.dumps),
    NEAR_ALLOC.map(json.dumps),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),  # deep nesting: RecursionError inside
    st.just("1" * 5000),  # beyond Python's int-parsing digit limit
    st.just('[{"index": NaN}]'),
)


@settings(max_examples=300)
@given(TEXTS)
def test_decoders_raise_only_codec_error(text: str) -> None:
    for decode in (
        lambda: decode_inventory("n", text, budgets=B, labels={"nvidia.com/gpu.replicas": "x"}),
        lambda: decode_allocation(text, pod_uid="u", namespace="ns", name="p"),
    ):
        with contextlib.suppress(CodecError):
            decode()


@pytest.mark.parametrize("value", [None, 5, b"[]", ["[]"]])
def test_decoders_reject_non_text(value: object) -> None:
    with pytest.raises(CodecError, match="expected JSON text"):
        decode_inventory("n", value, budgets=B)  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="expected JSON text"):
        decode_allocation(value, pod_uid="u", namespace="ns", name="p")  # type: ignore[arg-type]


def test_deep_nesting_is_a_codec_error() -> None:
    with pytest.raises(CodecError):
        decode_inventory("n", "[" * 100_000 + "]" * 100_000, budgets=B)


# --- env-ready annotations -------------------------------------------------------------------


def test_env_annotations_of_a_share() -> None:
    assert env_annotations(SHARE) == {
        VISIBLE_DEVICES_KEY: "GPU-1",
        "mpsched.io/threads.a": "30",
        "mpsched.io/mem-limit.a": "0=4096M",
        "mpsched.io/threads.b": "20",
        "mpsched.io/mem-limit.b": "0=4096M",
    }
    assert threads_key("a") == "mpsched.io/threads.a"
    assert mem_limit_key("a") == "mpsched.io/mem-limit.a"


def test_env_annotations_of_whole_gpus_name_only_the_devices() -> None:
    whole = replace(
        SHARE,
        kind="whole",
        gpus=(GpuRef(0, "GPU-0"), GpuRef(3, "GPU-3")),
        threads=0,
        memory_mib=0,
        clients=0,
        containers=(),
    )
    assert env_annotations(whole) == {VISIBLE_DEVICES_KEY: "GPU-0,GPU-3"}


def test_no_memory_limit_key_without_a_memory_budget() -> None:
    # "0=0M" would forbid all device memory; no key means the webhook injects no limit.
    alloc = replace(SHARE, containers=(ContainerDemand("a", 30, 0, 1),))
    assert env_annotations(alloc) == {VISIBLE_DEVICES_KEY: "GPU-1", "mpsched.io/threads.a": "30"}


def test_allocation_annotations_hold_the_record_and_the_env_values() -> None:
    notes = allocation_annotations(SHARE)
    assert notes[ALLOCATION_KEY] == encode_allocation(SHARE)
    assert notes.keys() - {ALLOCATION_KEY} == env_annotations(SHARE).keys()


@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True))
def test_env_keys_stay_valid_annotation_keys_for_every_container_name(name: str) -> None:
    for key in (threads_key(name), mem_limit_key(name)):
        prefix, _, part = key.partition("/")
        assert prefix == "mpsched.io"
        assert NAME_PART.fullmatch(part), key


def test_long_container_names_are_cut_and_hashed_and_stay_distinct() -> None:
    a, b = "x" * 60 + "aaa", "x" * 60 + "bbb"
    assert len(threads_key("x" * 55).partition("/")[2]) == 63  # fits: used as it is
    assert threads_key("x" * 55) == "mpsched.io/threads." + "x" * 55
    for key in (threads_key, mem_limit_key):
        assert key(a) != key(b)
        assert len(key(a).partition("/")[2]) == 63
        assert key(a) == key(a)  # deterministic: the webhook computes the same key


def test_label_only_gpus_are_visible_by_index() -> None:
    # A node known only from feature-discovery labels has stand-in uuids no runtime knows;
    # NVIDIA_VISIBLE_DEVICES then names the GPUs by index, which the runtime accepts.
    labelled = replace(
        SHARE, kind="whole", gpus=(GpuRef(1, "gpu-t4-gfd-1-gpu1"), GpuRef(3, "gpu-t4-gfd-1-gpu3"))
    )
    assert env_annotations(labelled)[VISIBLE_DEVICES_KEY] == "1,3"
    mig = replace(SHARE, gpus=(GpuRef(0, "MIG-4b1c2a"),))
    assert env_annotations(mig)[VISIBLE_DEVICES_KEY] == "MIG-4b1c2a"


# --- documented ranges -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"memoryMiB": 2**64}, "memoryMiB"),
        ({"memoryMiB": (1 << 22) + 1}, "memoryMiB"),
        ({"index": 64}, "index"),
        ({"maxClients": 10**30}, "maxClients"),
        ({"units": 49}, "units"),
        ({"computeCapability": "100.0"}, "computeCapability"),
        ({"computeCapability": "9.\u00b2"}, "computeCapability"),  # isdigit() yet not int()
        ({"computeCapability": "99999999999999999999.0"}, "computeCapability"),
    ],
)
def test_an_inventory_number_out_of_range_is_refused(over: dict[str, object], field: str) -> None:
    """Before: accepted (2**64 MiB reached /status and /metrics), or for "9.²" a ValueError
    that no reader caught."""
    with pytest.raises(CodecError, match=rf"\[0\]\.{field}"):
        decode_inventory("n", inv_text(gpu_json(0, **over)), budgets=B)
    # The upper ends of the ranges are accepted.
    top = gpu_json(0, memoryMiB=1 << 22, units=48, maxClients=1024, computeCapability="99.99")
    assert decode_inventory("n", inv_text(top), budgets=B).gpus[0].memory_mib == 1 << 22


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"threads": 10**30}, "threads"),
        ({"threads": 1001}, "threads"),
        ({"memoryMiB": 2**64}, "memoryMiB"),
        ({"clients": 49}, "clients"),
        ({"uid": 2**31}, "uid"),
        ({"gpus": [{"index": 2**70, "uuid": "GPU-0"}]}, "index"),
        ({"containers": [{"name": "c", "threads": 101, "memoryMiB": 0, "clients": 1}]}, "threads"),
    ],
)
def test_an_allocation_number_out_of_range_is_refused(over: dict[str, object], field: str) -> None:
    with pytest.raises(CodecError, match=rf"\.{field}: .* is above"):
        decode_allocation(_alloc_text(**over), pod_uid="u", namespace="ns", name="p")


def test_an_allocation_counts_only_on_the_node_it_names() -> None:
    """What the watch and the node agent both read of a bound pod's annotation: the allocation
    on the node it names; else why not, the decoder's reason or the other node."""
    text = encode_allocation(SHARE)

    def on(text: str, node: str) -> Allocation | str:
        return decode_allocation_on(
            text, node=node, pod_uid="u1", namespace="ml", name="p", priority=7
        )

    assert on(text, "n1") == SHARE
    assert on(text, "n2") == "allocation names node 'n1', the pod runs on 'n2'"
    problem = on("{", "n1")
    assert isinstance(problem, str)
    assert problem.startswith(f"pod ml/p {ALLOCATION_KEY}")
