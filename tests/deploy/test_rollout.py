"""`kubectl rollout restart` completes and a drain of the leader's node is allowed, for the
extender of each root and for the webhook, played second by second from the rendered
manifests through the controllers' rules:

- Deployment (rolling update, kubernetes/kubernetes pkg/controller/deployment/rolling.go):
  maxSurge rounds up, maxUnavailable down, both 0 means 1 unavailable; the new ReplicaSet is
  scaled up to at most replicas + maxSurge pods (and the sync ends there), else the old ones
  are scaled down by at most all - minAvailable - newUnavailable, unhealthy old pods first,
  then while available > minAvailable;
- ReplicaSet: terminating pods do not count; surplus pods are deleted not-ready first;
- eviction (PodDisruptionBudget): disruptionsAllowed = currentHealthy - desiredHealthy, with
  desiredHealthy = minAvailable, or expected - maxUnavailable (expected: the Deployment's
  replicas); a healthy pod is evicted only while that is positive;
- a terminating pod runs its preStop sleep, then stops; it is not ready for the Deployment but
  still `serving` while its probe passes, and kube-proxy routes to serving terminating
  endpoints when no endpoint is ready (KEP-1669).

Readiness is modelled as the code has it (`ExtenderService.serving_problem`): ready = ledger
built and, where the extender runs its own election (cluster-scheduler), the Lease held; the
elector campaigns from the start, warm or not, and releases the Lease when serve stops. In
own-scheduler mode the Lease is kube-scheduler's: it campaigns once its sidecar is warm (the
sidecar's startupProbe gates its start) and is assumed not to release the Lease on shutdown
(the slower case: it expires). Scheduling works while the pod that may schedule can: in
cluster-scheduler mode a ready (or serving terminating) endpoint that leads and is warm; in
own-scheduler mode the holder of the scheduler's Lease, warm."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from extender.config import load_config_text
from tests.deploy.manifests import CLUSTER, OWN, Json, containers, one, pod_spec, render

#: Seconds from a pod's creation to its process running, and to its ledger being built.
START_S, WARM_S = 2, 10
NODES = ("node-a", "node-b", "node-c")
#: Seconds a drain waits before retrying a refused eviction (kubectl drain: 5 s).
EVICTION_RETRY_S = 5
LIMIT_S = 600


def _scaled(value: int | str, total: int, *, up: bool) -> int:
    if isinstance(value, int):
        return value
    fraction = int(value.rstrip("%")) * total / 100
    return math.ceil(fraction) if up else math.floor(fraction)


@dataclass
class Pod:
    name: str
    rs: int
    node: str
    created: int
    deleted: int | None = None
    ready_history: list[bool] = field(default_factory=list)

    def running(self, now: int, pre_stop: int) -> bool:
        return now >= self.created + START_S and (
            self.deleted is None or now < self.deleted + pre_stop
        )

    def warm(self, now: int) -> bool:
        return now >= self.created + WARM_S


@dataclass
class Lease:
    holder: str | None = None
    renewed: int = 0
    freed: int = 0  # when it was released, or expired


@dataclass(frozen=True)
class Workload:
    replicas: int
    surge: int
    unavailable: int
    pre_stop: int
    probe_period: int
    leader_ready_only: bool  # readiness needs the Lease (the extender's own election)
    has_leader: bool
    lease_duration: int
    retry: int
    releases: bool
    pdb: Json | None


def _workload(root: str | None, name: str) -> Workload:
    base = root or OWN
    deployment = one(base, "Deployment", name)
    spec = pod_spec(deployment)
    replicas = deployment["spec"]["replicas"]
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    surge = _scaled(rolling["maxSurge"], replicas, up=True)
    unavailable = _scaled(rolling["maxUnavailable"], replicas, up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    main = next(c for c in containers(spec) if c["name"] in ("mpsched", "extender", "webhook"))
    pre_stop = main.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pre_stop < spec.get("terminationGracePeriodSeconds", 30)
    pdbs = [
        d["spec"]
        for d in render(base)
        if d["kind"] == "PodDisruptionBudget"
        and d["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    ]
    pdb = pdbs[0] if pdbs else None
    if name == "mpsched-webhook":
        return Workload(
            replicas, surge, unavailable, pre_stop, main["readinessProbe"]["periodSeconds"],
            False, False, 0, 0, False, pdb,
        )  # fmt: skip
    config = load_config_text(
        one(base, "ConfigMap", "mpsched-config", "mpsched-system")["data"]["mpsched.yaml"]
    )
    if config.leader_election.enabled:  # the extender's own Lease
        election = config.leader_election
        duration, retry = election.lease_duration_seconds, election.retry_period_seconds
        releases = True  # serve releases it on shutdown (commands.serve._campaign)
    else:  # it follows kube-scheduler's
        scheduler = yaml.safe_load(
            one(base, "ConfigMap", "mpsched-scheduler-config")["data"]["kube-scheduler.yaml"]
        )["leaderElection"]
        duration = float(scheduler["leaseDuration"].rstrip("s"))
        retry = float(scheduler["retryPeriod"].rstrip("s"))
        releases = False
    return Workload(
        replicas, surge, unavailable, pre_stop, main["readinessProbe"]["periodSeconds"],
        config.leader_election.enabled, True, int(duration), int(retry), releases, pdb,
    )  # fmt: skip


class Cluster:
    """One Deployment, its ReplicaSets and pods, the Lease, and the controllers, per second."""

    def __init__(self, w: Workload, *, seed: int) -> None:
        self.w = w
        self.now = 0
        self.random = random.Random(seed)
        self.rs_spec: dict[int, int] = {0: w.replicas}
        self.template = 0
        self.pods: list[Pod] = []
        self.lease = Lease()
        self.cordoned: set[str] = set()
        self.outage = 0
        self.serial = 0
        for _ in range(w.replicas):
            self._create(0, at=-100)
        self._settle(30)
        self.outage = 0

    # -- the pods -------------------------------------------------------------------------------

    def _create(self, rs: int, *, at: int | None = None) -> None:
        load = {n: 0 for n in NODES if n not in self.cordoned}
        for p in self.pods:
            if p.node in load:
                load[p.node] += 1
        node = min(load, key=lambda n: (load[n], n))  # preferred anti-affinity
        self.serial += 1
        self.pods.append(Pod(f"pod-{self.serial}", rs, node, self.now if at is None else at))

    def running(self, p: Pod) -> bool:
        return p.running(self.now, self.w.pre_stop)

    def _condition(self, p: Pod) -> bool:
        """The readiness probe's answer now (`serving_problem() is None`)."""
        if not self.running(p) or not p.warm(self.now):
            return False
        return not self.w.leader_ready_only or self.lease.holder == p.name

    def ready(self, p: Pod) -> bool:
        """Probed every period: the answer as of the last probe."""
        history = p.ready_history
        return len(history) > self.w.probe_period and history[-1 - self.w.probe_period]

    def active(self, rs: int) -> list[Pod]:
        return [p for p in self.pods if p.rs == rs and p.deleted is None]

    def available(self, rs: int) -> int:
        return sum(self.ready(p) for p in self.active(rs))

    # -- a second ---------------------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1
        self.pods = [p for p in self.pods if p.deleted is None or self.running(p)]
        self._elect()
        for p in self.pods:
            p.ready_history.append(self._condition(p))
        if not self._scheduling_works():
            self.outage += 1
        self._deployment()
        self._replica_sets()

    def _elect(self) -> None:
        if not self.w.has_leader:
            return
        # serve's elector campaigns from its start, warm or not; kube-scheduler only once its
        # caches are synced, and it starts only once its sidecar is warm (the startupProbe).
        lease = self.lease
        names = {
            p.name: p
            for p in self.pods
            if self.running(p) and (self.w.leader_ready_only or p.warm(self.now))
        }
        if lease.holder is not None:
            if lease.holder in names:
                lease.renewed = self.now
                return
            # The holder stopped: released at once, or expired a lease duration after the
            # last renewal.
            if not self.w.releases and self.now < lease.renewed + self.w.lease_duration:
                return
            lease.holder, lease.freed = None, self.now
        if names and self.now >= lease.freed + self.w.retry:  # candidates retry every period
            lease.holder = self.random.choice(sorted(names))
            lease.renewed = self.now

    def _scheduling_works(self) -> bool:
        if not self.w.has_leader:  # the webhook: any ready or serving terminating endpoint
            return any(self.ready(p) for p in self.pods)
        leader = next((p for p in self.pods if p.name == self.lease.holder), None)
        if leader is None or not leader.warm(self.now):
            return False
        if not self.w.leader_ready_only:
            return True  # the scheduler that leads calls its own extender over loopback
        ready = [p for p in self.pods if p.deleted is None and self.ready(p)]
        serving = ready or [p for p in self.pods if self.ready(p)]  # KEP-1669's fallback
        return leader in serving

    def _deployment(self) -> None:
        w, new = self.w, self.template
        self.rs_spec.setdefault(new, 0)
        total = sum(self.rs_spec.values())
        if self.rs_spec[new] < w.replicas:
            room = w.replicas + w.surge - total
            if room > 0:
                self.rs_spec[new] += min(room, w.replicas - self.rs_spec[new])
                return
        old = sorted(rs for rs in self.rs_spec if rs != new and self.rs_spec[rs] > 0)
        if not old:
            return
        min_available = w.replicas - w.unavailable
        new_unavailable = self.rs_spec[new] - self.available(new)
        budget = total - min_available - new_unavailable
        if budget <= 0:
            return
        cleaned = 0
        for rs in old:
            unhealthy = self.rs_spec[rs] - self.available(rs)
            step = min(budget - cleaned, max(unhealthy, 0))
            self.rs_spec[rs] -= step
            cleaned += step
        available = sum(self.available(rs) for rs in self.rs_spec)
        down = available - min_available
        for rs in old:
            if down <= 0:
                break
            step = min(self.rs_spec[rs], down)
            self.rs_spec[rs] -= step
            down -= step

    def _replica_sets(self) -> None:
        for rs, spec in self.rs_spec.items():
            pods = self.active(rs)
            for _ in range(spec - len(pods)):
                self._create(rs)
            surplus = len(pods) - spec
            if surplus > 0:
                # Not ready first; among the rest, any (the real rank's ties are arbitrary).
                ranked = sorted(pods, key=lambda p: (self.ready(p), self.random.random()))
                for p in ranked[:surplus]:
                    p.deleted = self.now

    # -- what an operator does ----------------------------------------------------------------

    def _settle(self, seconds: int) -> None:
        for _ in range(seconds):
            self.tick()

    def rollout_restart(self) -> int:
        """Seconds until the new ReplicaSet has every replica available and no old pod is
        left; raises AssertionError if it never gets there."""
        self.template += 1
        started = self.now
        while self.now - started < LIMIT_S:
            self.tick()
            old_left = any(p.rs != self.template for p in self.pods)
            if not old_left and self.available(self.template) == self.w.replicas:
                return self.now - started
        raise AssertionError(f"rollout stuck: {self.rs_spec}, {self._state()}")

    def _allowed(self, pod: Pod) -> bool:
        pdb = self.w.pdb
        if pdb is None:
            return True
        healthy = sum(self.ready(p) for p in self.pods if p.deleted is None)
        expected = self.w.replicas
        if "minAvailable" in pdb:
            desired = _scaled(pdb["minAvailable"], expected, up=True)
        else:
            desired = expected - _scaled(pdb["maxUnavailable"], expected, up=True)
        if not self.ready(pod):  # unhealthyPodEvictionPolicy IfHealthyBudget (the default)
            return healthy >= desired
        return healthy - desired > 0

    def drain_leader_node(self) -> int:
        """`kubectl drain` of the node the leader (or, without one, the first pod) runs on:
        seconds until none of the Deployment's pods is left there."""
        target = next((p for p in self.pods if p.name == self.lease.holder), self.pods[0]).node
        self.cordoned.add(target)
        started, tried = self.now, -EVICTION_RETRY_S
        while self.now - started < LIMIT_S:
            if self.now - tried >= EVICTION_RETRY_S:
                tried = self.now
                for p in self.pods:
                    if p.node == target and p.deleted is None and self._allowed(p):
                        p.deleted = self.now
            self.tick()
            if not any(p.node == target for p in self.pods):
                return self.now - started
        raise AssertionError(f"drain of {target} refused for good: {self._state()}")

    def _state(self) -> list[tuple[Any, ...]]:
        return [(p.name, p.rs, p.node, self.ready(p), p.deleted) for p in self.pods]


#: (root, Deployment, the longest a rollout or drain may stop GPU pods from scheduling).
CASES = [
    # The scheduler's Lease expires (15 s), then a warm standby takes it (retry period 2 s).
    (OWN, "mpsched", 15 + 2 + 1),
    # The old leader serves through its preStop sleep; a warm new replica takes the released
    # Lease within the retry period and is probed ready within the probe period.
    (CLUSTER, "mpsched", 2 + 2 + 1),
    (OWN, "mpsched-webhook", 0),
    (CLUSTER, "mpsched-webhook", 0),
]


@pytest.mark.parametrize(("root", "name", "outage"), CASES)
@pytest.mark.parametrize("seed", range(5))
def test_rollout_restart_completes(root: str, name: str, outage: int, seed: int) -> None:
    cluster = Cluster(_workload(root, name), seed=seed)
    took = cluster.rollout_restart()
    assert took < 120
    assert cluster.outage <= outage
    # And again: a finished rollout leaves a state the next one starts from.
    cluster.outage = 0
    assert cluster.rollout_restart() < 120
    assert cluster.outage <= outage


@pytest.mark.parametrize(("root", "name", "outage"), CASES)
@pytest.mark.parametrize("seed", range(5))
def test_the_leaders_node_can_be_drained(root: str, name: str, outage: int, seed: int) -> None:
    cluster = Cluster(_workload(root, name), seed=seed)
    assert cluster.drain_leader_node() < 120
    cluster._settle(60)
    assert cluster.outage <= outage
    # What replaced the drained pods runs on the other nodes, and is ready.
    assert all(p.node not in cluster.cordoned for p in cluster.pods)
    assert cluster.available(cluster.template) == cluster.w.replicas


def test_the_issues_deadlock_is_what_the_model_finds() -> None:
    """Issue #10: leader-only readiness, the default rolling update (maxUnavailable 0) and
    `minAvailable: 1` never finish a rollout and never let the leader's node drain."""
    w = _workload(CLUSTER, "mpsched")
    stuck = Workload(**{**w.__dict__, "replicas": 2, "surge": 1, "unavailable": 0,
                        "pre_stop": 0, "pdb": {"minAvailable": 1}})  # fmt: skip
    with pytest.raises(AssertionError, match="rollout stuck"):
        Cluster(stuck, seed=0).rollout_restart()
    with pytest.raises(AssertionError, match="refused for good"):
        Cluster(stuck, seed=0).drain_leader_node()
