"""The acceptance scenarios of issue #7 (the truth rules of docs/design.md), each over real HTTP:
`mpsched serve` as a subprocess against the fake API server, kube-scheduler's verbs sent to it,
what it gave out counted from the fake's applied binds and what it reports read from /status
and /metrics. Every scenario breaks a promise on the server before this work (run them with
`MPSCHED_UNDER_TEST=<old checkout>`, see `harness`) and keeps it on this one.

The nodes have one GPU each, so a node's threads are its GPU's. Each scenario records its
figures (`FIGURE ...` lines, `pytest -rA`) before it asserts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from extender.packing.codec import (
    ALLOCATION_KEY,
    INVENTORY_KEY,
    decode_allocation,
    encode_allocation,
)
from tests.http.kube_objects import gpu_node, pod
from tests.kube.fake_apiserver import FakeApiServer
from tests.scenarios.harness import (
    Serve,
    binding_requests,
    bound_names,
    config_document,
    figure,
    running,
    seconds_until,
    threads_given_out,
    wait_for,
)

NODE = "gpu-a"
#: Seconds a resolution (in doubt → confirmed or released) may take once the API answers.
RESOLVE_DEADLINE_S = 30.0
#: Seconds a bind nobody answers may take to be answered Error (bindTimeoutSeconds is 3 here).
BIND_ANSWER_DEADLINE_S = 30.0
#: Seconds serve may take to exit on SIGTERM (the promise), and the most the test waits.
EXIT_PROMISE_S = 10.0
EXIT_CAP_S = 30.0


def one_gpu_node() -> dict[str, Any]:
    return gpu_node(NODE, gpus=1)


def inventory_with(mps: str) -> str:
    """The node's `mpsched.io/gpus` annotation with its one GPU's MPS state set to `mps`."""
    gpus = json.loads(one_gpu_node()["metadata"]["annotations"][INVENTORY_KEY])
    for g in gpus:
        g["mps"] = mps
    return json.dumps(gpus)


def shown(seconds: float | None, cap: float = EXIT_CAP_S) -> str:
    return f"> {cap:.0f} s" if seconds is None else f"{seconds:.2f} s"


def one_gpu_cluster(**threads: int) -> tuple[FakeApiServer, list[dict[str, Any]]]:
    """The fake with the one-GPU node and a pending pod per keyword (name=thread percent)."""
    fake = FakeApiServer()
    fake.put(one_gpu_node())
    pods = [pod(name, threads=t) for name, t in threads.items()]
    for p in pods:
        fake.put(p)
    return fake, pods


async def test_mps_flap_keeps_what_runs(tmp_path: Path) -> None:
    """1. MPS goes down and comes back on the node of a running 100 % pod: the pod still counts
    (rule 1), so a second 100 % pod is not placed on that GPU."""
    fake, (a, b) = one_gpu_cluster(a=100, b=100)
    async with running(fake, tmp_path) as serve:
        assert await serve.bind(a, NODE) == ""
        fake.update_node(NODE, annotations={INVENTORY_KEY: inventory_with("down")})
        await wait_for(lambda: _mps_is(serve, "down"), deadline_s=30, what="/status shows MPS down")
        fake.update_node(NODE, annotations={INVENTORY_KEY: inventory_with("ready")})
        await wait_for(
            lambda: _mps_is(serve, "ready"), deadline_s=30, what="/status shows MPS ready"
        )
        filtered = await serve.passes_filter(b, NODE)
        error = await serve.bind(b, NODE)
        used = (await serve.gpu(NODE)).get("threads", {}).get("used")
        given = threads_given_out(fake, NODE)
        figure(
            "1 mps-flap",
            given_out_pct=given,
            status_used_pct=used,
            b_passes_filter=filtered,
            b_bind_error=bool(error),
        )
        assert error, "pod b was bound on a GPU a 100 % pod holds"
        assert given == 100
        assert bound_names(fake) == ["a"]
        assert not filtered
        assert used == 100


async def _mps_is(serve: Serve, state: str) -> bool:
    return bool((await serve.gpu(NODE)).get("mps") == state)


async def test_lost_answer_during_outage_stays_counted(tmp_path: Path) -> None:
    """2. A bind is applied but its answer is lost as the API goes down: it is held in doubt
    (rule 5), so a second 60 % pod is refused during and after the outage, and the reservation
    is confirmed once the API answers again."""
    fake, (a, b) = one_gpu_cluster(a=60, b=60)
    async with running(fake, tmp_path) as serve:
        fake.outage_after_next_bind = True
        error_a = await serve.bind(a, NODE)
        assert bound_names(fake) == ["a"]  # applied, answer lost, API down
        error_b_during = await serve.bind(b, NODE)
        # Refused by the extender, not merely failed at the API: no Binding was even sent.
        sent_during = binding_requests(fake, "b")
        fake.outage(False)
        confirmed_s = await seconds_until(
            lambda: _state_is(serve, "a", "confirmed"),
            deadline_s=RESOLVE_DEADLINE_S,
            what="/status shows a confirmed",
        )
        error_b_after = await serve.bind(b, NODE)
        given = threads_given_out(fake, NODE)
        figure(
            "2 lost-answer-outage",
            given_out_pct=given,
            a_bind_error=bool(error_a),
            b_refused_during=bool(error_b_during),
            b_refused_after=bool(error_b_after),
            b_bindings_sent_during=sent_during,
            b_bindings_sent=binding_requests(fake, "b"),
            a_confirmed_after=shown(confirmed_s, RESOLVE_DEADLINE_S),
        )
        assert given <= 100, f"{given} % of the GPU's threads given out"
        assert bound_names(fake) == ["a"]
        assert error_a, "a bind whose answer was lost must be answered Error"
        assert error_b_during and error_b_after
        assert sent_during == 0, "b's Binding was sent while a's 60 % was in doubt"
        assert binding_requests(fake, "b") == 0
        assert confirmed_s is not None, "a's reservation was not confirmed within 30 s"


async def _state_is(serve: Serve, name: str, state: str) -> bool:
    return await serve.pod_state(NODE, name) == state


async def test_reload_racing_a_slow_bind(tmp_path: Path) -> None:
    """3. A configuration change rebuilds the decision state while a bind is in flight: the new
    state carries its reservation (rule 7), so a second 60 % pod is refused.

    The bind is held with `hang_binds` rather than slowed by a fixed `bind_delay_s`, so that it
    is in flight for as long as the reload takes, however slow the machine; the API timeouts
    are raised (20 s per call, 25 s per bind) for the same reason (serve looks at its
    configuration every 2 s), so that a's bind is answered, not given up."""
    fake, (a, b) = one_gpu_cluster(a=60, b=60)
    document = config_document(
        budgets={"memoryReserveMiB": 256},
        api={"requestTimeoutSeconds": 20, "bindTimeoutSeconds": 25},
    )
    async with running(fake, tmp_path, document) as serve:
        fake.hang_binds = True
        bind_a = asyncio.ensure_future(serve.bind(a, NODE))
        await wait_for(
            lambda: binding_requests(fake, "a") >= 1,
            deadline_s=30,
            what="a's Binding reaches the API server",
        )
        changed = dict(document, budgets={"memoryReserveMiB": 512})
        serve.rewrite_config(changed)
        reload_s = await serve.wait_reloaded()
        a_in_flight = not bind_a.done()
        # b's bind: refused at once, or (a server that lost a's reservation) sent to the API,
        # where it is held too; release the held binds once it has either answered or got there.
        bind_b = asyncio.ensure_future(serve.bind(b, NODE))
        await wait_for(
            lambda: bind_b.done() or binding_requests(fake, "b") >= 1,
            deadline_s=30,
            what="b's bind is refused or reaches the API server",
        )
        fake.hang_binds = False
        error_a, error_b = await bind_a, await bind_b
        given = threads_given_out(fake, NODE)
        figure(
            "3 reload-racing-bind",
            given_out_pct=given,
            reload_seen_s=f"{reload_s:.2f}",
            a_in_flight_at_reload=a_in_flight,
            a_bind_error=error_a or None,
            b_refused=bool(error_b),
        )
        assert a_in_flight, "the reload did not happen while a's bind was in flight"
        assert given <= 100, f"{given} % of the GPU's threads given out"
        assert error_b, "b was bound on a GPU whose 60 % a's bind in flight holds"
        assert error_a == ""
        assert bound_names(fake) == ["a"]


async def test_lowered_budget_keeps_what_runs(tmp_path: Path) -> None:
    """4. The oversubscription budget is lowered under two running 90 % pods: both still count
    (rule 1), the GPU shows over budget and takes nothing new. Threads only
    (`proportional: false`): memory derived from threads would not fit 180 % at ×2.0."""
    fake, (a, b, c) = one_gpu_cluster(a=90, b=90, c=10)
    document = config_document(budgets={"oversubscription": 2.0, "proportional": False})
    async with running(fake, tmp_path, document) as serve:
        assert await serve.bind(a, NODE) == ""
        assert await serve.bind(b, NODE) == ""
        serve.rewrite_config(
            dict(document, budgets={"oversubscription": 1.0, "proportional": False})
        )
        await serve.wait_reloaded()
        gpu = await serve.gpu(NODE)
        over_metric = await serve.metric("mpsched_over_budget_gpus")
        filtered = await serve.passes_filter(c, NODE)
        error_c = await serve.bind(c, NODE)
        given = threads_given_out(fake, NODE)
        figure(
            "4 lowered-budget",
            given_out_pct=given,
            status_used_pct=gpu.get("threads", {}).get("used"),
            status_capacity_pct=gpu.get("threads", {}).get("capacity"),
            over_budget=gpu.get("overBudget"),
            over_budget_metric=over_metric,
            c_passes_filter=filtered,
            c_refused=bool(error_c),
        )
        assert error_c, "a 10 % pod was bound on a GPU already at 180 % of a 100 % budget"
        assert bound_names(fake) == ["a", "b"]
        assert not filtered
        assert gpu["threads"] == {"used": 180, "capacity": 100}
        assert gpu["overBudget"]
        assert over_metric == 1


async def test_edited_and_removed_allocation_changes_nothing(tmp_path: Path) -> None:
    """5. A running pod's allocation annotation is rewritten to a 1 % share, then removed: the
    ledger keeps the allocation first seen (rule 2) and each change is reported by a Warning
    Event `GpuAllocationChanged`."""
    fake, (a, b) = one_gpu_cluster(a=60, b=60)
    async with running(fake, tmp_path) as serve:
        assert await serve.bind(a, NODE) == ""
        await wait_for(
            lambda: _state_is(serve, "a", "confirmed"), deadline_s=30, what="a confirmed"
        )
        meta = a["metadata"]
        text = fake.pods[("default", "a")]["metadata"]["annotations"][ALLOCATION_KEY]
        held = decode_allocation(
            text, pod_uid=meta["uid"], namespace="default", name="a", priority=0
        )
        # A 1 % share: 1 % of the threads and the memory that goes with them.
        small = dataclasses.replace(
            held,
            threads=1,
            memory_mib=held.memory_mib // held.threads,
            containers=tuple(
                dataclasses.replace(c, threads=1, memory_mib=c.memory_mib // c.threads)
                for c in held.containers
            ),
        )
        figures: dict[str, object] = {}
        errors: list[str] = []
        for step, value in (("edited", encode_allocation(small)), ("removed", None)):
            seen = _changed_events(fake)
            fake.update_pod("default", "a", annotations={ALLOCATION_KEY: value})

            async def noticed(seen: int = seen) -> bool:
                # An Event, or (a server that takes the edit) /status no longer showing 60 %.
                if _changed_events(fake) > seen:
                    return True
                return bool((await serve.gpu(NODE)).get("threads", {}).get("used") != 60)

            with contextlib.suppress(AssertionError):
                await wait_for(noticed, deadline_s=30, what=f"serve notices a's {step} annotation")
            event = _changed_events(fake) > seen
            filtered = await serve.passes_filter(b, NODE)
            error_b = await serve.bind(b, NODE)
            used = (await serve.gpu(NODE)).get("threads", {}).get("used")
            figures |= {
                f"{step}_given_out_pct": threads_given_out(fake, NODE),
                f"{step}_status_used_pct": used,
                f"{step}_b_refused": bool(error_b),
                f"{step}_event": event,
            }
            if not error_b:
                errors.append(f"b was bound after a's annotation was {step}")
                break
            if filtered:
                errors.append(f"b passes the filter after a's annotation was {step}")
            if used != 60:
                errors.append(f"/status shows {used} % after a's annotation was {step}")
            if not event:
                errors.append(f"no GpuAllocationChanged Event after a's annotation was {step}")
        figure("5 annotation-edited-removed", **figures)
        assert bound_names(fake) == ["a"], errors
        assert not errors, errors


def _changed_events(fake: FakeApiServer) -> int:
    return sum(
        1
        for e in fake.events
        if e.get("reason") == "GpuAllocationChanged" and e.get("type") == "Warning"
    )


async def test_unanswered_bind_is_answered_then_resolved(tmp_path: Path) -> None:
    """6a. The API server never answers a Binding: /bind answers Error within the bind deadline
    (3 s here; the Binding call itself gives up after requestTimeoutSeconds, 1 s here), and
    once the held Binding is applied the reservation is resolved: confirmed."""
    fake, (a,) = one_gpu_cluster(a=60)
    async with running(fake, tmp_path) as serve:
        fake.hang_binds = True
        start = time.monotonic()
        bind_a = asyncio.ensure_future(serve.bind(a, NODE))
        try:
            error_a: str | None = await asyncio.wait_for(
                asyncio.shield(bind_a), BIND_ANSWER_DEADLINE_S
            )
            answered_s: float | None = time.monotonic() - start
        except TimeoutError:
            error_a, answered_s = None, None
        fake.hang_binds = False
        resolved_s = await seconds_until(
            lambda: _state_is(serve, "a", "confirmed"),
            deadline_s=RESOLVE_DEADLINE_S,
            what="a's reservation is confirmed",
        )
        if not bind_a.done():
            await bind_a  # the client gives up within VERB_TIMEOUT_S
        given = threads_given_out(fake, NODE)
        figure(
            "6a unanswered-bind",
            bind_answered=shown(answered_s, BIND_ANSWER_DEADLINE_S),
            a_bind_error=bool(error_a),
            resolved_after=shown(resolved_s, RESOLVE_DEADLINE_S),
            given_out_pct=given,
        )
        assert answered_s is not None, "/bind did not answer within 30 s"
        assert error_a, "an unanswered bind must be answered Error"
        assert resolved_s is not None, "a's reservation was not resolved within 30 s"
        assert bound_names(fake) == ["a"]


async def test_sigterm_while_a_bind_hangs_exits_promptly(tmp_path: Path) -> None:
    """6b. SIGTERM while a Binding hangs unanswered: serve exits within 10 s (rule 5:
    shutdown is bounded too)."""
    fake, (a,) = one_gpu_cluster(a=60)
    async with running(fake, tmp_path) as serve:
        fake.hang_binds = True
        bind_a = asyncio.ensure_future(serve.bind(a, NODE))
        await wait_for(
            lambda: binding_requests(fake, "a") >= 1,
            deadline_s=30,
            what="a's Binding reaches the API server",
        )
        exit_s = await serve.stop(cap_s=EXIT_CAP_S)
        bind_a.cancel()
        figure("6b sigterm-while-bind-hangs", exit_after=shown(exit_s), code=serve.exit_code)
        assert exit_s is not None and exit_s <= EXIT_PROMISE_S, f"exit took {shown(exit_s)}"


async def test_shutdown_is_bounded_during_an_outage(tmp_path: Path) -> None:
    """7. The API server answers 503 to everything and cuts the watches, then stops answering
    at all (a black-holed API behind a load balancer): SIGTERM still makes serve exit within
    10 s, its Lease release included (leader election is on here: handing the Lease over is
    the API call shutdown makes)."""
    fake, _ = one_gpu_cluster(a=60)
    document = config_document()
    document["leaderElection"] = {"enabled": True}
    async with running(fake, tmp_path, document) as serve:
        seen = len(fake.requests)
        fake.outage(True, refuse=False)
        # serve has noticed: it asked again (a watch, a relist, the Lease) and was answered 503.
        await wait_for(
            lambda: len(fake.requests) > seen,
            deadline_s=30,
            what="serve asks the API server again during the outage",
        )
        fake.delay_s = 600.0  # from now on no request is answered (the fake cancels them on exit)
        seen = len(fake.requests)
        await wait_for(
            lambda: len(fake.requests) > seen,
            deadline_s=30,
            what="serve sends a request the API server does not answer",
        )
        exit_s = await serve.stop(cap_s=EXIT_CAP_S)
        fake.delay_s = 0.0
        figure("7 shutdown-during-outage", exit_after=shown(exit_s), code=serve.exit_code)
        assert exit_s is not None and exit_s <= EXIT_PROMISE_S, f"exit took {shown(exit_s)}"


async def test_unanswered_bind_stays_counted_while_the_binding_may_still_apply(
    tmp_path: Path,
) -> None:
    """6c (rule 5). The Binding call gives up (requestTimeoutSeconds) while the API server
    still holds the Binding, as a slow etcd would, and later applies it. A read-back that shows
    the pod unbound at that moment does not say the Binding will not happen, so a's 60 % must
    stay counted: a second 60 % pod is refused without a Binding being sent, and when the held
    Binding lands at most 100 % of the GPU is given out."""
    fake, (a, b) = one_gpu_cluster(a=60, b=60)
    async with running(fake, tmp_path) as serve:
        fake.hang_binds = True
        error_a = await serve.bind(a, NODE)
        state_a = await serve.pod_state(NODE, "a")
        bind_b = asyncio.ensure_future(serve.bind(b, NODE))
        await wait_for(
            lambda: bind_b.done() or binding_requests(fake, "b") >= 1,
            deadline_s=30,
            what="b's bind is refused or reaches the API server",
        )
        sent_b = binding_requests(fake, "b")
        fake.hang_binds = False  # the held Bindings are applied now
        error_b = await bind_b
        await wait_for(
            lambda: _state_is(serve, "a", "confirmed"),
            deadline_s=RESOLVE_DEADLINE_S,
            what="a's applied Binding is counted",
        )
        given = threads_given_out(fake, NODE)
        figure(
            "6c binding-held-after-timeout",
            a_bind_error=bool(error_a),
            a_state_after_error=state_a,
            b_bindings_sent=sent_b,
            b_bind_error=bool(error_b),
            given_out_pct=given,
        )
        assert error_a
        assert sent_b == 0, "b's Binding was sent while a's Binding was still held by the API"
        assert given <= 100, f"{given} % of the GPU's threads given out"
        assert bound_names(fake) == ["a"]
