"""The learned node order (`extender.service.forecast.NodeOrder`) on kube-scheduler's windows as
the extender bench makes them (scripts/extender_bench: a zone-interleaved order of 5,000 nodes, a
rotating start, the realistic pods with their nodeSelectors). Kept apart from test_forecast.py,
which the compiled build's run copies without the bench's package."""

from __future__ import annotations

from extender.service.forecast import NodeOrder
from extender_bench.cluster import generate_cluster
from extender_bench.kube_scheduler import Scheduler, adaptive_candidates, zone_interleaved
from extender_bench.realistic_pods import realistic_pods


def _fresh(names: list[str]) -> list[str]:
    """The names as new string objects, as a decoded request body carries them."""
    return [name.encode().decode() for name in names]


def test_windows_of_pods_without_a_selector_are_forecast_whole_among_others_with_gaps() -> None:
    """kube-scheduler's windows as the bench copies them (zone-interleaved order, a rotating
    start, 15 % of the pods with a nodeSelector, whose windows have gaps): once the order has
    been seen, the window of a pod without a selector is forecast node for node."""
    cluster, _ = generate_cluster(5000, 0, seed=3)
    nodes = [item for item in cluster["items"] if item["kind"] == "Node"]
    scheduler = Scheduler(
        zone_interleaved(nodes),
        {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes},
        adaptive_candidates(len(nodes)),  # 500: a turn is ten windows
    )
    pods = realistic_pods(600, seed=3)
    # The first turn has windows with gaps (a zone's, a pool's), as it may after any relearning.
    selected = [p for p in pods if p["spec"].get("nodeSelector")]
    zone = next(p for p in selected if "topology.kubernetes.io/zone" in p["spec"]["nodeSelector"])
    pool = next(p for p in selected if "mpsched.io/pool" in p["spec"]["nodeSelector"])
    pods = [p for p in pods if p is not zone and p is not pool]
    pods[1:1] = [zone]
    pods[5:5] = [pool]
    learned = NodeOrder()
    whole = plain = 0
    last: list[str] = []
    for k, p in enumerate(pods):
        window = _fresh(scheduler.window(p))
        if k >= 30 and not p["spec"].get("nodeSelector"):  # three turns seen
            plain += 1
            whole += learned.following(len(last)) == window
        learned.observe(window)
        last = window
    assert plain > 400
    assert whole >= 0.98 * plain  # 27 % before windows that show a jumped node corrected links
