"""The node agent (`mpsched agent`, a DaemonSet on GPU nodes): discovers the node's GPUs through
NVML, runs and watches the MPS control daemon, publishes the node's `mpsched.io/gpus` inventory,
and measures what each pod's MPS clients really use against the share it was given.

Decisions (the inventory to publish, the writes it takes, who is over their share) are pure
functions in `inventory` and `usage`; `nvml` is the one importer of pynvml and runs every NVML
call off the event loop; `mps` supervises the control daemon; `node` ties them together.
"""
