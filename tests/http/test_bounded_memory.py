"""Memory over HTTP stays bounded when requests carry absurd identities: filter calls whose
pods have 4 MiB uids are answered as usual, and what the process keeps afterwards is the last
request's (the decoder's and the service's one-entry memories), not every one's."""

from __future__ import annotations

import gc
import tracemalloc

import aiohttp
import orjson

from extender.http.keys import HttpSettings
from tests.http.kube_objects import pod
from tests.http.served import served

MIB = 1 << 20
CALLS = 30


async def test_huge_uids_over_http_are_not_kept() -> None:
    async with served(HttpSettings()) as s, aiohttp.ClientSession() as session:

        async def call(i: int) -> None:
            p = pod(f"p{i}", threads=10, uid=f"{i:06d}" + "u" * (4 * MIB))
            async with session.post(s.url + "/filter", data=s.filter_body(p)) as resp:
                assert resp.status == 200
                assert orjson.loads(await resp.read())["NodeNames"] == s.names

        await call(-1)  # warm: sessions, buffers, the decoder's memory of one body
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(CALLS):
                await call(i)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    # Measured: 128 MiB before the parse cache was bounded in bytes, ~12 MiB after: the last
    # call's body and uid, held by the one-entry memories (traced anew: the warm-up call's
    # copies were allocated before tracing started).
    assert grown < 24 * MIB, grown // MIB
