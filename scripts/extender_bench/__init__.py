"""Extender benchmark: drives `mpsched serve` over HTTP as kube-scheduler does, on a cluster of
5,000 nodes x 8 GPUs, and compares it with a floor: a minimal aiohttp + orjson server in its own
process that does what any extender must (parse the JSON body, echo the node names, scores of 0,
and for bind create the Binding) and nothing more.

Where the cluster lives (`--api`, realistic mode): by default in a Kubernetes API server in its
own process (the project's fake, tests/kube/fake_apiserver.py), which serve lists, watches and
binds through with `--kubeconfig`, as in production; the floor POSTs its Bindings to a second
copy of it, so that both bind the same pods. `--api embedded` keeps the earlier shape: serve's
embedded cluster (`--cluster-file`), the API server's work inside serve's process, and a floor
whose bind only answers. The classic mode always uses the embedded cluster.

Two modes (`--mode`):

realistic (the default): the cluster starts empty and 3,000 distinct pending pods of production
size and variety (~3.3 KB: a ReplicaSet owner, one or two containers, env, volumes, tolerations,
sometimes a nodeSelector; asks mixing threads and memory, units, whole GPUs, two clients) are
scheduled one by one, each new to the extender (its parse is never cached), over candidate
windows of 500 nodes that rotate over the zone-interleaved node list as kube-scheduler's
numFeasibleNodesToFind / nextStartNodeIndex make them; each pod's bind is handed to a worker
and overlaps the next pod's filter, so filters see the nodes binds just changed. Prioritize
follows filter at once, as the issue's bench has it; kube-scheduler runs its own PreScore and
Score plugins in between, which `--score-pause-ms` models (the pause is in no latency). The
servers alternate in blocks of pods (`--block`); p50/p99 per verb, pods/s, CPU per pod, the
ratios to the floor and PASS/MISS per target of issue #11 are printed with the machine.

classic (issue #3's bench), described below: a half-full cluster, the same ten shapes warmed
before measuring, random candidate samples, all binds after all filters.

What it measures (loopback only, bounded loops only):
  1. serial filter+prioritize pairs with the scheduler's adaptive candidate count (500 at
     5,000 nodes: 50 % less one point per 125 nodes, at least 5 % and 100 nodes), then with
     every node as a candidate;
  2. concurrent binds (16 in flight) of those pods to the node prioritize ranked first;
  3. the same traffic against the floor, interleaved with the extender's in short blocks of
     pods (`--block`, 50 by default: a tenth of a second or so) so that load from elsewhere on
     a shared machine falls on both alike, while each server runs a block as a dedicated
     process would. Pod-by-pod interleaving (`--block 1`) puts a whole request of the other
     server between any two calls, and each call then starts with the other's data in the CPU
     caches, which a production extender never sees; it costs the extender (a 460 MB heap)
     much more than the floor, so it is kept only as an option;
  4. the serve process's peak RSS (VmHWM) and each server's CPU per pod;
  5. for the record (no target), 20 pods whose shapes no pod in the cluster has: serve warms
     the shapes of pending pods before the scheduler asks, so only these show what a shape
     seen for the first time costs.
Measuring starts once serve is ready and idle (it may warm caches after /readyz). It prints
p50/p99 per verb and per pair, pods/s, the ratio to the floor, the machine, and PASS or MISS per
target. Run `scripts/bench-extender --help`; `--nodes 200 --pods 50` is a smoke run.

The cluster is generated through the packing core itself (`parse_pod` → `fit_node` →
`allocate` → `Ledger.assume`), so every running pod's `mpsched.io/allocation` annotation is one
the extender could have written, and no GPU is over any budget.

The code, by what it owns: `catalog` (what the nodes and pods are drawn from), `cluster` (the
generated cluster), `pods` and `realistic_pods` (the pending pods), `kube_scheduler` (the candidate
count, node order and windows kube-scheduler uses), `servers` (the floor and the API server, each
a process of its own), `processes` and `machine` (the child processes, what the bench ran on),
`measuring` (the scheduler's connection and the quantile), `classic_driver` and
`realistic_driver` (the traffic), `targets` and `report` (PASS/MISS and the text), and
`classic_run`, `realistic_run` and `cli` (a run from the command line), and `ablation` (serve
with accelerators switched off, and scripts/bench-ablation's summary). The entry point is
scripts/bench_extender.py, beside this package.
"""
