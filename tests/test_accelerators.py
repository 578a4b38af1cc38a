"""Every accelerator (the configuration's `accelerators` section) can be turned off with the same
answers, and runs when on and only then.

One realistic small cluster (GPU nodes of three models and sizes, a node without GPUs) and a
queue of pending pods of mixed shapes are scheduled over loopback HTTP as kube-scheduler does:
filter on a rotating window of nodes, prioritize on what passed, bind to the best. Each
combination of switches (all off, each one on alone, all on) must give the same answers byte for
byte; and counters at each accelerator's boundary (spies on the C functions, the fast path's
count of answers, the forecast's results) show that exactly the accelerators switched on ran;
and with any of them, every prioritize reuses its pod's scheduling cycle. In the pure build the
C parts do not exist and never run; `tests/test_native_build.py` runs this module against the
compiled extension, where they must.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import AcceleratorSettings, Config, ConfigError, load_config_text
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.http.listener import serving
from extender.packing import native
from extender.service import ExtenderService
from extender.service.runtime import Reconfigured
from tests.http.kube_objects import gpu_node, plain_node, pod
from tests.http.test_fastpath import post, response

pytestmark = pytest.mark.accelerator("every")

Json = dict[str, Any]

SWITCHES = tuple(f.name for f in dataclasses.fields(AcceleratorSettings))
ALL_OFF = AcceleratorSettings(**dict.fromkeys(SWITCHES, False))
#: Every accelerator off, each one on alone, and all on.
COMBINATIONS = {
    "all-off": ALL_OFF,
    **{f"{s}-alone": dataclasses.replace(ALL_OFF, **{s: True}) for s in SWITCHES},
    "all-on": AcceleratorSettings(),
}
#: The accelerators that are C code, by the C functions each one is: each must run when it is
#: on in the compiled build (the pure build has none).
C_PARTS = {
    "native_fit": ("fill_share", "fit_share", "plan", "pick_bytes", "pick_doubles"),
    "native_writer": ("scale", "host_priorities"),
}
COMPILED = native.FILL_SHARE is not None

NODES = [
    *(gpu_node(f"a100-{i}", gpus=4, memory_mib=81920, units=4) for i in range(4)),
    *(
        gpu_node(f"t4-{i}", gpus=2, memory_mib=15109, cc="7.5", model="T4", units=2, cpu="32")
        for i in range(4)
    ),
    *(gpu_node(f"v100-{i}", memory_mib=32480, cc="7.0", model="V100", cpu="16") for i in range(2)),
    plain_node("cpu-0"),
]
NAMES = [n["metadata"]["name"] for n in NODES]
_SHAPES: list[Json] = [
    {"threads": 30, "memory": "8Gi"},
    {"threads": 50, "memory": "20Gi", "user": 2000},
    {"threads": 10, "memory": "2Gi"},
    {"units": 1},
    {"gpus": 1},
    {"threads": 100, "memory": "30Gi", "cpu": "8"},
    {"units": 2, "user": 2000},
    {"threads": 25, "memory": "4Gi", "clients": 2},
    {"gpus": 2, "cpu": "4"},
    {"threads": 60, "memory": "70Gi"},
]
PENDING = [pod(f"p{i:02d}", **_SHAPES[(i * 7) % len(_SHAPES)]) for i in range(22)]
#: Fits nowhere: every filter answer says why for every node.
PENDING.append(pod("huge", gpus=8))
#: Fits nowhere once the queue is placed, and outranks it: preempt picks its victims.
URGENT = pod("urgent", gpus=4, priority=1000)
#: Nodes in each filter call: a window rotating over the cluster, as kube-scheduler's
#: percentageOfNodesToScore makes it.
WINDOW = 8


@dataclass
class Run:
    """What one combination answered, and what ran."""

    answers: list[tuple[str, int, bytes]]
    ran: Counter[str]


@contextlib.contextmanager
def spies(ran: Counter[str]) -> Iterator[None]:
    """Count the C functions' calls that answered (not those that left the work to Python),
    at the boundary where the Python code reads them."""

    def spy(key: str, fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
        if fn is None:
            return None

        def counted(*args: Any) -> Any:
            out = fn(*args)
            if out is not None:
                ran[key] += 1
            return out

        return counted

    from extender.http import wire
    from extender.service import answers
    from extender.service.core import ExtenderService

    recompute = ExtenderService._raw_scores

    def recomputed(*args: Any) -> Any:
        ran["prioritize_recomputed"] += 1
        return recompute(*args)

    with pytest.MonkeyPatch.context() as mp:
        for name in ("FILL_SHARE", "FIT_SHARE", "PLAN", "PICK_BYTES", "PICK_DOUBLES"):
            mp.setattr(native, name, spy(name.lower(), getattr(native, name)))
        mp.setattr(answers, "SCALE", spy("scale", native.SCALE))
        in_c = wire._HOST_PRIORITIES_IN_C
        mp.setattr(wire, "_HOST_PRIORITIES_IN_C", spy("host_priorities", in_c))
        mp.setattr(ExtenderService, "_raw_scores", staticmethod(recomputed))
        yield


def best(prioritized: list[Json]) -> str:
    """The node kube-scheduler binds to: the highest score, the first of equals."""
    top = max(p["Score"] for p in prioritized)
    return str(next(p["Host"] for p in prioritized if p["Score"] == top))


async def schedule(accelerators: AcceleratorSettings) -> Run:
    """Schedule every pending pod with these accelerators; the answers and what ran."""
    ran: Counter[str] = Counter()
    with spies(ran):
        cluster = EmbeddedCluster.from_objects([*NODES, *PENDING, URGENT])
        config = dataclasses.replace(Config.default(), accelerators=accelerators)
        service = ExtenderService(cluster=cluster, config=config)
        settings = HttpSettings()
        app = make_app(service, settings)
        answers: list[tuple[str, int, bytes]] = []
        bound: dict[str, list[str]] = {}
        async with serving(app, settings, host="127.0.0.1", port=0) as site:
            await asyncio.wait_for(service.wait_ready(), 10)
            reader, writer = await asyncio.open_connection("127.0.0.1", site.port)

            async def call(verb: str, body: Json) -> Any:
                writer.write(post(f"/scheduler/{verb}", orjson.dumps(body)))
                status, _, got = await response(reader)
                answers.append((verb, status, got))
                return orjson.loads(got)

            for i, p in enumerate(PENDING):
                start = (i * 3) % len(NAMES)
                window = (NAMES[start:] + NAMES[:start])[:WINDOW]
                passed = (await call("filter", {"Pod": p, "NodeNames": window}))["NodeNames"]
                if not passed:
                    continue
                # A pod without GPUs appears between filter and prioritize (a watch event).
                cluster.apply(pod(f"web-{i}", cpu="1"))
                for _ in range(3):
                    await asyncio.sleep(0)
                scores = await call("prioritize", {"Pod": p, "NodeNames": passed})
                meta = p["metadata"]
                bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"]}
                bind |= {"PodUID": meta["uid"], "Node": best(scores)}
                await call("bind", bind)
                bound.setdefault(bind["Node"], []).append(meta["uid"])
                await asyncio.sleep(0.01)  # the forecast's turn, and the watch's echo
            # kube-scheduler's proposal: every pod on the nodes it would preempt on.
            await call("filter", {"Pod": URGENT, "NodeNames": NAMES})
            proposal = {
                node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}
                for node, uids in sorted(bound.items())
            }
            await call("preempt", {"Pod": URGENT, "NodeNameToMetaVictims": proposal})
            writer.close()
            verbs = site.guard.verbs
            ran["fast_path"] = verbs.answered if verbs is not None else 0
            ran["forecast"] = service.forecast_results
    return Run(answers, ran)


@pytest.fixture(scope="module")
def reference() -> Run:
    """The answers with every accelerator off: the plain code's."""
    return asyncio.run(schedule(ALL_OFF))


@pytest.fixture(params=list(COMBINATIONS))
def accelerators(request: pytest.FixtureRequest) -> AcceleratorSettings:
    """Every accelerator off, each one on alone, and all on."""
    settings: AcceleratorSettings = COMBINATIONS[request.param]
    return settings


def test_the_answers_are_the_same_and_only_what_is_on_runs(
    accelerators: AcceleratorSettings, reference: Run
) -> None:
    run = asyncio.run(schedule(accelerators))
    assert run.answers == reference.answers
    # The run did schedule: binds succeeded, and some filter refused some node.
    binds = [body for verb, _, body in run.answers if verb == "bind"]
    assert len(binds) >= 15
    assert all(orjson.loads(b) == {"Error": ""} for b in binds)
    verb, status, preempted = run.answers[-1]
    assert (verb, status) == ("preempt", 200)
    assert orjson.loads(preempted)["NodeNameToMetaVictims"]
    for switch in SWITCHES:
        parts = C_PARTS.get(switch, (switch,))
        on = getattr(accelerators, switch) and (COMPILED or switch not in C_PARTS)
        for part in parts:
            if on:
                assert run.ran[part] > 0, f"{switch} is on but {part} did not run"
            else:
                assert run.ran[part] == 0, f"{switch} is off but {part} ran {run.ran[part]} times"
    # Every prioritize found its pod's cycle from filter, whatever is on: nothing between the
    # two changed a passed node, and the names (decoded anew) are equal.
    assert run.ran["prioritize_recomputed"] == 0


def test_the_switches_are_read_from_the_configuration() -> None:
    config = load_config_text("accelerators: {fastPath: false, nativeFit: false}\n")
    assert config.accelerators == AcceleratorSettings(fast_path=False, native_fit=False)
    assert Config.default().accelerators == AcceleratorSettings()
    with pytest.raises(ConfigError, match=r"accelerators\.fastpath"):
        load_config_text("accelerators: {fastpath: false}\n")
    with pytest.raises(ConfigError, match=r"accelerators\.forecast"):
        load_config_text("accelerators: {forecast: 'no'}\n")
    # Removed because they earned nothing on the realistic bench: named as such.
    for removed in ("cycleDelay", "preparedPriorities"):
        with pytest.raises(ConfigError, match=rf"accelerators\.{removed}: no longer exists"):
            load_config_text(f"accelerators: {{{removed}: true}}\n")


async def test_a_reload_keeps_the_accelerators_it_started_with() -> None:
    """The listener and the decision state are made at start: a reload that changes the
    section says it needs a restart, and what runs stays as it started."""
    cluster = EmbeddedCluster.from_objects(NODES)
    service = ExtenderService(cluster=cluster, config=Config.default())
    await service.start()
    try:
        changed = dataclasses.replace(Config.default(), accelerators=ALL_OFF)
        done = await service.reconfigure(changed)
        assert done == Reconfigured(rebuilt=False, needs_restart=("accelerators",))
        assert service.accelerators == AcceleratorSettings()
    finally:
        await service.close()
