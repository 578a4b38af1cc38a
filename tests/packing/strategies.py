"""Hypothesis strategies for small GPU nodes and share requests, shared by the core's tests."""

from __future__ import annotations

from hypothesis import strategies as st

from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory
from extender.packing.request import ContainerAsk, ShareRequest

CCS = (ComputeCapability(6, 0), ComputeCapability(7, 0), ComputeCapability(9, 0))


@st.composite
def gpus(draw: st.DrawFn, index: int, node: str) -> GpuInfo:
    cc = draw(st.sampled_from(CCS))
    return GpuInfo(
        index=index,
        uuid=f"GPU-{node}-{index}",
        model="H100" if cc.major == 9 else ("V100" if cc.major == 7 else "P100"),
        memory_mib=draw(st.sampled_from([1024, 4096, 16160, 81559])),
        compute_capability=cc,
        max_clients=draw(st.sampled_from([2, 4, 16, 48])),
        units=draw(st.sampled_from([1, 2, 4, 7])),
        mps=draw(st.sampled_from(["ready", "ready", "ready", "down"])),
    )


@st.composite
def nodes(draw: st.DrawFn, name: str = "n0", max_gpus: int = 3) -> NodeInventory:
    count = draw(st.integers(0, max_gpus))
    return NodeInventory(
        name=name,
        gpus=tuple(draw(gpus(i, name)) for i in range(count)),
        multi_user=draw(st.booleans()),
    )


@st.composite
def requests(draw: st.DrawFn, uid: str) -> ShareRequest:
    kind = draw(st.sampled_from(["share", "share", "share", "whole"]))
    run_as = draw(st.sampled_from([None, 1000, 2000]))
    if kind == "whole":
        return ShareRequest(
            "ns", uid, uid, "whole", whole_gpus=draw(st.integers(1, 3)), run_as_user=run_as
        )
    asks = []
    for i in range(draw(st.integers(1, 2))):
        form = draw(st.sampled_from(["threads", "memory", "both", "units"]))
        asks.append(
            ContainerAsk(
                name=f"c{i}",
                init=draw(st.booleans()) if i else False,
                threads=draw(st.integers(1, 100)) if form in ("threads", "both") else None,
                memory_mib=draw(st.integers(1, 20000)) if form in ("memory", "both") else None,
                units=draw(st.integers(1, 3)) if form == "units" else None,
                clients=draw(st.integers(1, 4)),
            )
        )
    return ShareRequest("ns", uid, uid, "share", containers=tuple(asks), run_as_user=run_as)
