"""kubelet's PodResources endpoint for the agent's tests: a real gRPC server (grpcio's asyncio
API) on a unix socket, serving `/v1.PodResourcesLister/List` through a generic handler and
answering with the hand-written encoder of `extender.agent.podresources`. Other methods of the
service (`Get`, `GetAllocatableResources`) answer UNIMPLEMENTED, as an unregistered method does
on any gRPC server.

Fault injection, each knob a plain attribute:

- `pods`: what List answers (kubelet's view of its pods and their devices).
- `raw`: bytes answered instead of the encoded `pods` (a malformed answer).
- `delay_s`: each call waits this long before it answers (a kubelet in trouble).
- `fail_next`: gRPC status codes the next calls are answered with, one each (kubelet's rate
  limiter answers RESOURCE_EXHAUSTED "rejected by rate limit").

`calls` counts the List calls served, `requests` holds their request bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from extender.agent.podresources import PodResources, encode_list_response

SERVICE = "v1.PodResourcesLister"


class FakeKubelet:
    def __init__(self, socket_path: Path, pods: Sequence[PodResources] = ()) -> None:
        self.socket_path = socket_path
        self.pods: list[PodResources] = list(pods)
        self.raw: bytes | None = None
        self.delay_s = 0.0
        self.fail_next: list[grpc.StatusCode] = []
        self.calls = 0
        self.requests: list[bytes] = []
        self._server: Any = None

    async def _list(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_next:
            code = self.fail_next.pop(0)
            await context.abort(code, "rejected by rate limit")
        return self.raw if self.raw is not None else encode_list_response(self.pods)

    async def start(self) -> None:
        server = grpc.aio.server()
        # No (de)serializers: the handler takes and returns the wire bytes.
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"List": grpc.unary_unary_rpc_method_handler(self._list)}
        )
        server.add_generic_rpc_handlers((handler,))
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            # grace 0: calls still waiting (delay_s) are cancelled, as when kubelet restarts.
            await self._server.stop(0)
            self._server = None

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
