"""The node agent (`mpsched agent`, a DaemonSet on GPU nodes): discovers the node's GPUs through
NVML, runs and watches the MPS control daemon, publishes the node's `mpsched.io/gpus` inventory,
serves the kubelet device plugin that hands MPS to share containers, and checks every MPS
client against the share its pod was given.

Decisions (the inventory to publish, the writes it takes, the plugin's slots, who is over their
share, which client is outside it) are pure functions in `inventory`, `usage` and `clients`;
`nvml` is the one importer of pynvml and runs every NVML call off the event loop; `mps`
supervises the control daemon; `deviceplugin` and `podresources` speak kubelet's gRPC APIs
(code generated into `proto/`); `enforce` acts on the client findings; `node` ties them
together.
"""
