"""What a policy is shown (`packing.view`): a GPU's free share, a pod's shape and a share's
GPU, the rules `serve` and `simulate` both decide from."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from extender.packing.ledger import Allocation, GpuRef, GpuUsage, gpu_capacity, share_cause
from extender.packing.model import ComputeCapability, GpuInfo, MpsState
from extender.packing.policies import NodeState
from extender.packing.request import ContainerAsk, RequestKind, ShareRequest
from extender.packing.settings import BudgetSettings
from extender.packing.view import gpu_free, pod_shape, share_gpu

#: 10,000 MiB pinnable: a proportional share of t % pins 100 * t MiB.
BUDGETS = BudgetSettings(memory_reserve_mib=0)


def _gpu(*, mps: MpsState = "ready", cc: tuple[int, int] = (8, 0), clients: int = 48) -> GpuInfo:
    return GpuInfo(0, "GPU-0", "A100", 10_000, ComputeCapability(*cc), clients, 4, mps)


def _share(threads: int, memory: int, clients: int = 1) -> Allocation:
    ref = (GpuRef(0, "GPU-0"),)
    return Allocation("u", "ns", "p", "n", "share", ref, threads, memory, clients)


def _usage(
    info: GpuInfo | None = None,
    *,
    shares: tuple[Allocation, ...] = (),
    owner: str | None = None,
    budgets: BudgetSettings = BUDGETS,
) -> GpuUsage:
    info = info or _gpu()
    g = GpuUsage(info, gpu_capacity(info, budgets), owner=owner)
    for i, a in enumerate(shares):
        g.shares[f"u{i}"] = a
        g.threads += a.threads
        g.memory_mib += a.memory_mib
        g.clients += a.clients
    return g


def test_an_idle_gpu_is_whole_whatever_its_mps_state() -> None:
    assert gpu_free(_usage(), proportional=True) == 100
    assert gpu_free(_usage(_gpu(mps="down")), proportional=True) == 100
    assert gpu_free(_usage(_gpu(cc=(6, 0))), proportional=True) == 100  # pre-Volta, whole-only


def test_a_gpu_given_out_whole_or_without_a_client_slot_is_full() -> None:
    assert gpu_free(_usage(owner="w"), proportional=True) == 0
    full = _usage(_gpu(clients=2), shares=(_share(10, 1000, clients=2),))
    assert gpu_free(full, proportional=True) == 0


def test_free_threads_of_a_shared_gpu() -> None:
    assert gpu_free(_usage(shares=(_share(30, 3000),)), proportional=True) == 70


def test_threads_without_the_memory_for_them_are_not_free() -> None:
    # 5 % threads pinning 7,000 of 10,000 MiB: 95 % threads left, memory for 30 % of them.
    heavy = _usage(shares=(_share(5, 7000),))
    assert gpu_free(heavy, proportional=True) == 30
    # Without proportional memory a share pins only what it asks: the threads are free.
    assert gpu_free(heavy, proportional=False) == 95
    # Memory cannot hold one more client at all.
    overhead = BudgetSettings(memory_reserve_mib=0, client_overhead_mib=600)
    crowded = _usage(shares=(_share(5, 9000),), budgets=overhead)
    assert gpu_free(crowded, proportional=True) == 0


def test_a_shared_gpu_never_reads_whole() -> None:
    assert gpu_free(_usage(shares=(_share(0, 100),)), proportional=False) == 99
    over = BudgetSettings(memory_reserve_mib=0, oversubscription=2.0)
    assert gpu_free(_usage(shares=(_share(50, 0),), budgets=over), proportional=False) == 99


@given(threads=st.integers(0, 100), memory=st.integers(0, 10_000))
def test_the_cap_is_the_largest_proportional_share_that_fits(threads: int, memory: int) -> None:
    free = gpu_free(_usage(shares=(_share(threads, memory),)), proportional=True)
    left = 10_000 - memory
    assert 0 <= free <= min(99, 100 - threads)
    assert free == 0 or 10_000 * free // 100 <= left
    assert free == min(99, 100 - threads) or 10_000 * (free + 1) // 100 > left


@given(
    used=st.lists(
        st.tuples(st.integers(0, 120), st.integers(0, 12_000), st.integers(0, 3)), max_size=3
    ),
    oversubscription=st.sampled_from([1.0, 1.5, 2.0]),
    overhead=st.sampled_from([0, 700]),
    clients=st.sampled_from([1, 2, 4, 48]),
    proportional=st.booleans(),
    owner=st.sampled_from([None, None, "w"]),
    mps=st.sampled_from(["ready", "ready", "down"]),
)
def test_the_free_share_is_the_largest_share_the_share_fit_takes(
    used: list[tuple[int, int, int]],
    oversubscription: float,
    overhead: int,
    clients: int,
    proportional: bool,
    owner: str | None,
    mps: MpsState,
) -> None:
    """`gpu_free` is read off the share fit (`share_cause`), UIDs aside: the largest t below
    100 for which a one-client share of t %, pinning t % of the memory where memory follows
    threads, fits; 100 for an idle GPU."""
    budgets = BudgetSettings(
        memory_reserve_mib=0, oversubscription=oversubscription, client_overhead_mib=overhead
    )
    shares = tuple(_share(*u) for u in used)
    g = _usage(_gpu(mps=mps, clients=clients), shares=shares, owner=owner, budgets=budgets)

    def fits(t: int) -> bool:
        memory = 10_000 * t // 100 if proportional else 0
        cause = share_cause(g, t, memory, 1, None, multi_user=True, uid_isolation=False)
        return cause is None

    expected = 100 if g.idle else max([t for t in range(100) if fits(t)], default=0)
    assert gpu_free(g, proportional=proportional) == expected


def _request(kind: RequestKind, ask: ContainerAsk | None = None) -> ShareRequest:
    containers = (ask,) if ask else ()
    whole = 2 if kind == "whole" else 0
    return ShareRequest("ns", "p", "u", kind, containers=containers, whole_gpus=whole)


def test_pod_shape_by_kind() -> None:
    models = frozenset({"T4"})
    assert pod_shape(_request("none"), 500, threads=40).gpus == 0
    whole = pod_shape(
        _request("whole", ContainerAsk("main", gpus=2)), 500, threads=0, models=models
    )
    assert (whole.threads, whole.gpus, whole.models) == (100, 2, models)
    share = pod_shape(_request("share", ContainerAsk("main", threads=30)), 500, threads=30)
    assert (share.cpu_milli, share.threads, share.gpus, share.is_share) == (500, 30, 1, True)


def test_a_share_stays_within_1_and_100_percent() -> None:
    request = _request("share", ContainerAsk("main", memory_mib=1))
    assert pod_shape(request, 0, threads=0).threads == 1
    assert not pod_shape(request, 0, threads=130).is_share  # all of a GPU: whole to a policy


def test_an_allocation_has_the_shape_of_what_it_holds() -> None:
    whole = Allocation("u", "ns", "p", "n", "whole", (GpuRef(0, "a"), GpuRef(1, "b")))
    shape = pod_shape(whole, 100, threads=0)
    assert (shape.threads, shape.gpus) == (100, 2)
    assert pod_shape(_share(20, 0), 100, threads=20).threads == 20


def test_a_share_goes_where_the_policy_says_else_to_the_tightest_gpu() -> None:
    node = NodeState("A100", 0, (100, 40, 100, 40))
    assert share_gpu(node, (0, 1, 2, 3), 2) == 2
    assert share_gpu(node, (0, 1, 2, 3), None) == 1
    assert share_gpu(node, (0, 2), 1) == 0  # not a candidate: the policy's choice is ignored
