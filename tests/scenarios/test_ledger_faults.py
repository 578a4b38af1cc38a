"""Issue 29's over-commit scenarios, each over real HTTP: `mpsched serve` as a subprocess against
the fake API server with its fault injection, kube-scheduler's verbs sent to it, what it gave
out counted from the fake's applied binds (by the GPU uuid each pod's allocation names) and what
it reports read from /status, /metrics and the Events it recorded.

1. a Binding applied whose connection drops while reads fail: the POST is never sent again, the
   bind stays in doubt, and a 409 saying the pod is on the node chosen is the bind's success;
2. a node's GPUs renumbered (two uuids swap indices; GPU 0 gone and GPU 1 becoming index 0):
   running pods keep counting on their GPU by uuid, and a node running a pod whose GPU it does
   not show takes nothing new, and says so.

Each scenario records its figures (`FIGURE ...` lines, `pytest -rA`) before it asserts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from extender.packing.codec import ALLOCATION_KEY, INVENTORY_KEY, decode_allocation
from tests.http.kube_objects import gpu_node, pod
from tests.kube.fake_apiserver import FakeApiServer
from tests.scenarios.harness import (
    Serve,
    binding_requests,
    bound_names,
    config_document,
    figure,
    pod_threads,
    running,
    seconds_until,
    wait_for,
)

NODE = "gpu-a"
#: Seconds a resolution (in doubt → confirmed) may take once the API answers again.
RESOLVE_DEADLINE_S = 30.0
#: Seconds serve may take to see a node's inventory change through its watch.
SEEN_DEADLINE_S = 30.0


def cluster(gpus: int, **threads: int) -> tuple[FakeApiServer, dict[str, dict[str, Any]]]:
    """The fake with one node of `gpus` GPUs and a pending pod per keyword (name=thread %)."""
    fake = FakeApiServer()
    fake.put(gpu_node(NODE, gpus=gpus))
    pods = {name: pod(name, threads=t) for name, t in threads.items()}
    for p in pods.values():
        fake.put(p)
    return fake, pods


def threads_by_uuid(fake: FakeApiServer) -> Counter[str]:
    """Threads the API server shows given out per GPU uuid: every pod bound with an allocation,
    at what its pod asked, on the GPU its allocation names."""
    out: Counter[str] = Counter()
    for (namespace, name), obj in fake.pods.items():
        text = (obj["metadata"].get("annotations") or {}).get(ALLOCATION_KEY)
        if not obj["spec"].get("nodeName") or text is None:
            continue
        alloc = decode_allocation(
            text, pod_uid=obj["metadata"]["uid"], namespace=namespace, name=name
        )
        for ref in alloc.gpus:
            out[ref.uuid] += pod_threads(obj)
    return out


def uuid_of(fake: FakeApiServer, name: str) -> str:
    obj = fake.pods[("default", name)]
    text = obj["metadata"]["annotations"][ALLOCATION_KEY]
    alloc = decode_allocation(text, pod_uid=obj["metadata"]["uid"], namespace="default", name=name)
    (ref,) = alloc.gpus
    return ref.uuid


def inventory(order: list[str]) -> str:
    """The node's `mpsched.io/gpus` annotation listing the GPUs of these uuids, in this order
    (their indices renumbered from 0, as NVML enumerates after a reboot or a GPU gone)."""
    published = json.loads(gpu_node(NODE, gpus=2)["metadata"]["annotations"][INVENTORY_KEY])
    by_uuid = {g["uuid"]: g for g in published}
    return json.dumps([dict(by_uuid[u], index=i) for i, u in enumerate(order)])


async def gpus_shown(serve: Serve) -> list[tuple[int, str, int]]:
    """(index, uuid, threads used) of each GPU of the node in /status."""
    for n in (await serve.status()).get("nodes", []):
        if n.get("name") == NODE:
            return [(g["index"], g["uuid"], g["threads"]["used"]) for g in n.get("gpus", [])]
    return []


async def node_entry(serve: Serve) -> dict[str, Any]:
    for n in (await serve.status()).get("nodes", []):
        if n.get("name") == NODE:
            found: dict[str, Any] = n
            return found
    return {}


async def pod_state(serve: Serve, name: str) -> str | None:
    for n in (await serve.status()).get("nodes", []):
        for g in n.get("gpus", []):
            for p in g.get("pods", []):
                if p.get("name") == name:
                    state: str | None = p.get("state")
                    return state
    return None


# -- 1. a Binding applied, its answer lost, while reads fail ---------------------------------


async def test_a_bind_whose_answer_is_lost_while_reads_fail_is_never_given_out_twice(
    tmp_path: Path,
) -> None:
    """w (10 %) binds, so the write connection is pooled. a's (60 %) Binding is applied and its
    connection cut, and from that instant every read fails (get, list, watch) while Bindings
    are still served. a must stay counted (in doubt): b (60 %) must not go on the GPU. When
    kube-scheduler retries a's bind, the API's 409 "already assigned to node gpu-a" is the node
    this bind chose: a success, not a failure that releases a's 60 %."""
    fake, pods = cluster(1, w=10, a=60, b=60)
    # No GpuShareAllocated Events: w's Event would hold the pooled connection as a's bind goes.
    document = config_document(api={"allocationEvents": False})
    async with running(fake, tmp_path, document) as serve:
        assert await serve.bind(pods["w"], NODE) == ""
        fake.reads_outage_after_next_bind = True
        error_a = await serve.bind(pods["a"], NODE)
        sent_a = binding_requests(fake, "a")
        retry_a = await serve.bind(pods["a"], NODE)
        b_filtered = await serve.passes_filter(pods["b"], NODE)
        error_b = await serve.bind(pods["b"], NODE)
        given = threads_by_uuid(fake)
        fake.outage(False)
        confirmed_s = await seconds_until(
            lambda: _state_is(serve, "a", "confirmed"),
            deadline_s=RESOLVE_DEADLINE_S,
            what="/status shows a confirmed",
        )
        figure(
            "29.1 lost-answer-reads-down",
            given_out_pct=dict(given),
            a_bindings_sent_first_call=sent_a,
            a_first_error=error_a or None,
            a_retry_error=retry_a or None,
            b_passes_filter=b_filtered,
            b_bound="b" in bound_names(fake),
            a_confirmed_after=confirmed_s,
        )
        assert sent_a == 1, "a's Binding was sent again after a connection that carried it"
        assert error_a, "a bind whose answer was lost must be answered Error (in doubt)"
        assert retry_a == "", f"a 409 naming the node chosen is the bind's success: {retry_a}"
        assert max(given.values()) <= 100, f"{dict(given)} % of a GPU's threads given out"
        assert not b_filtered and error_b
        assert "b" not in bound_names(fake)
        assert confirmed_s is not None, "a's reservation was not confirmed within 30 s"


async def _state_is(serve: Serve, name: str, state: str) -> bool:
    return await pod_state(serve, name) == state


# -- 2. GPU indices renumbered -----------------------------------------------------------------


async def test_two_gpus_swapping_indices_keep_their_pods_by_uuid(tmp_path: Path) -> None:
    """a and c (60 % each) run on the node's two GPUs. The agent republishes the same GPUs with
    their indices swapped: each pod still runs on its GPU (by uuid), so b (60 %) fits nowhere;
    /status shows 60 % on each GPU, under its uuid, and nothing over budget."""
    fake, pods = cluster(2, a=60, c=60, b=60)
    async with running(fake, tmp_path) as serve:
        assert await serve.bind(pods["a"], NODE) == ""
        assert await serve.bind(pods["c"], NODE) == ""
        on = {name: uuid_of(fake, name) for name in ("a", "c")}
        swapped = [f"GPU-{NODE}-1", f"GPU-{NODE}-0"]
        fake.update_node(NODE, annotations={INVENTORY_KEY: inventory(swapped)})
        await wait_for(
            lambda: _uuid_order_is(serve, swapped),
            deadline_s=SEEN_DEADLINE_S,
            what="/status shows the GPUs renumbered",
        )
        shown = await gpus_shown(serve)
        b_filtered = await serve.passes_filter(pods["b"], NODE)
        error_b = await serve.bind(pods["b"], NODE)
        given = threads_by_uuid(fake)
        summary = (await serve.status())["summary"]
        figure(
            "29.2a indices-swapped",
            given_out_pct=dict(given),
            status_gpus=shown,
            over_budget_gpus=summary["overBudgetGpus"],
            b_passes_filter=b_filtered,
            b_bound="b" in bound_names(fake),
        )
        assert max(given.values()) <= 100, f"{dict(given)} % of a GPU's threads given out"
        assert not b_filtered and error_b
        assert sorted((u, t) for _, u, t in shown) == sorted((u, 60) for u in on.values())
        assert summary["overBudgetGpus"] == 0 and summary["unplaced"] == []


async def _uuid_order_is(serve: Serve, order: list[str]) -> bool:
    return [u for _, u, _ in await gpus_shown(serve)] == order


async def test_a_gpu_gone_and_the_rest_renumbered_blocks_the_node_and_says_so(
    tmp_path: Path,
) -> None:
    """a (60 %) runs on GPU 0 and c (60 %) on GPU 1. GPU 0 disappears and GPU 1 becomes index
    0: c keeps counting on its GPU (by uuid); a cannot be placed, so the node takes nothing new
    (b, 30 %, is refused though GPU 1 has 40 % free) and says so: /status's `unplacedPods`,
    the `mpsched_blocked_nodes` gauge and a GpuAllocationUnplaced Event on a. When GPU 0 comes
    back, a counts on it again and b binds."""
    fake, pods = cluster(2, a=60, c=60, b=30)
    async with running(fake, tmp_path) as serve:
        assert await serve.bind(pods["a"], NODE) == ""
        assert await serve.bind(pods["c"], NODE) == ""
        gone, kept = uuid_of(fake, "a"), uuid_of(fake, "c")
        fake.update_node(NODE, annotations={INVENTORY_KEY: inventory([kept])})
        await wait_for(
            lambda: _uuid_order_is(serve, [kept]),
            deadline_s=SEEN_DEADLINE_S,
            what="/status shows one GPU",
        )
        shown = await gpus_shown(serve)
        entry = await node_entry(serve)
        blocked = await serve.metric("mpsched_blocked_nodes")
        b_filtered = await serve.passes_filter(pods["b"], NODE)
        error_b = await serve.bind(pods["b"], NODE)
        given = threads_by_uuid(fake)
        event_s = await seconds_until(
            lambda: any(e.get("reason") == "GpuAllocationUnplaced" for e in fake.events),
            deadline_s=SEEN_DEADLINE_S,
            what="a GpuAllocationUnplaced Event is recorded",
        )
        unplaced_events = [
            e["involvedObject"]["name"]
            for e in fake.events
            if e.get("reason") == "GpuAllocationUnplaced"
        ]
        figure(
            "29.2b gpu-gone-renumbered",
            given_out_pct=dict(given),
            status_gpus=shown,
            unplaced_pods=entry.get("unplacedPods"),
            blocked_nodes_metric=blocked,
            b_passes_filter=b_filtered,
            b_bound_while_blocked="b" in bound_names(fake),
            unplaced_events=unplaced_events,
        )
        assert max(given.values()) <= 100, f"{dict(given)} % of a GPU's threads given out"
        assert shown == [(0, kept, 60)], "c must keep counting on its GPU, now index 0"
        assert not b_filtered and error_b and "b" not in bound_names(fake)
        assert entry.get("unplacedPods") == 1
        assert blocked == 1.0
        assert event_s is not None and unplaced_events == ["a"]
        # GPU 0 comes back (as index 1 now): a counts on it again, and the node takes b.
        fake.update_node(NODE, annotations={INVENTORY_KEY: inventory([kept, gone])})
        await wait_for(
            lambda: _uuid_order_is(serve, [kept, gone]),
            deadline_s=SEEN_DEADLINE_S,
            what="/status shows GPU 0 back",
        )
        back = await gpus_shown(serve)
        error_b_after = await serve.bind(pods["b"], NODE)
        figure("29.2b gpu-back", status_gpus=back, b_bind_error=error_b_after or None)
        assert back == [(0, kept, 60), (1, gone, 60)]
        assert error_b_after == ""
        assert (await node_entry(serve)).get("unplacedPods") == 0
        assert max(threads_by_uuid(fake).values()) <= 100
