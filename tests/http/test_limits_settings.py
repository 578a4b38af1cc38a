"""The `server:` limits as configured reach the HTTP layer, with their ranges checked; and the
large-body gate's pacing, on its own: one at a time in arrival order, paced to its share while
others are served, not paced when nobody else is, and a cancelled waiter gives its turn on."""

from __future__ import annotations

import asyncio
import time

import pytest

from extender.commands.serve import http_settings
from extender.config import Config, ConfigError, config_from_document, load_config
from extender.http.fairness import LargeBodyGate
from extender.http.keys import HttpSettings


def test_server_limits_reach_the_http_settings() -> None:
    doc = {
        "server": {
            "idleTimeoutSeconds": 5,
            "bodyTimeoutSeconds": 2.5,
            "sendTimeoutSeconds": 3,
            "maxConnections": 100,
            "largeBodyBytes": 2 << 20,
            "largeBodyLoopShare": 0.25,
        }
    }
    got = http_settings(config_from_document(doc))
    assert (got.idle_timeout_s, got.body_timeout_s, got.send_timeout_s) == (5, 2.5, 3)
    assert (got.max_connections, got.large_body_bytes, got.large_body_share) == (
        100,
        2 << 20,
        0.25,
    )
    defaults = http_settings(Config.default())
    want = HttpSettings()
    assert (defaults.idle_timeout_s, defaults.max_connections, defaults.large_body_share) == (
        want.idle_timeout_s,
        want.max_connections,
        want.large_body_share,
    )


def test_the_sample_configuration_states_the_defaults() -> None:
    assert load_config("config/mpsched.yaml").server == Config.default().server


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("idleTimeoutSeconds", 0),
        ("maxConnections", 2),
        ("largeBodyLoopShare", 0),
        ("largeBodyLoopShare", 1.5),
        ("largeBodyBytes", 1000),
    ],
)
def test_server_limits_are_range_checked(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_document({"server": {key: value}})
    assert any(p.startswith(f"server.{key}:") for p in caught.value.problems)


async def test_large_requests_take_turns_in_arrival_order() -> None:
    gate = LargeBodyGate(threshold_bytes=1, share=1.0, idle_s=0.001)
    order: list[int] = []

    async def one(i: int) -> None:
        await gate.acquire()
        order.append(i)
        await asyncio.sleep(0.01)
        order.append(i)
        gate.release(0.0)

    await asyncio.gather(*(one(i) for i in range(4)))
    assert order == [0, 0, 1, 1, 2, 2, 3, 3]


async def test_pacing_while_others_are_served_and_not_when_idle() -> None:
    gate = LargeBodyGate(threshold_bytes=1, share=0.5, idle_s=0.01)
    await gate.acquire()
    gate.release(0.2)  # the next large one owes 0.2 s while others are being served
    busy = True

    async def others() -> None:
        while busy:
            gate.last_other = time.perf_counter()
            await asyncio.sleep(0.002)

    task = asyncio.create_task(others())
    started = time.perf_counter()
    await gate.acquire()
    paced = time.perf_counter() - started
    busy = False
    await task
    gate.release(0.2)
    started = time.perf_counter()
    await gate.acquire()  # nobody else: only the idle probe
    idle = time.perf_counter() - started
    gate.release(0.0)
    assert paced >= 0.18, paced
    assert idle < 0.1, idle


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    gate = LargeBodyGate(threshold_bytes=1, share=1.0, idle_s=0.001)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    third = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0.01)
    waiter.cancel()
    gate.release(0.0)
    await asyncio.wait_for(third, 1.0)
    gate.release(0.0)
    await asyncio.wait_for(gate.acquire(), 1.0)  # and the gate is free after
