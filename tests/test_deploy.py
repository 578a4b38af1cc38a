"""The deployment manifests hang together, in both roots (deploy/own-scheduler,
deploy/cluster-scheduler) as `kubectl kustomize` renders them: the ConfigMap's configuration
passes validation and the extender serves it on the probed port; the node agent's DaemonSet runs
on GPU nodes only, with the host namespaces and mounts its configuration needs (each privilege
explained where it is granted), updates only when an operator deletes a pod, and runs in the
privileged namespace of its own. RBAC against the code's calls: tests/deploy/test_rbac.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extender.cli import build_parser
from extender.config import load_config_text
from tests.deploy.manifests import CLUSTER, DEPLOY, OWN, containers, one, pod_spec

ROOTS = (OWN, CLUSTER)


def _config(root: str) -> Any:
    cm = one(root, "ConfigMap", "mpsched-config", "mpsched-system")
    return load_config_text(cm["data"]["mpsched.yaml"])


def _extender(root: str) -> dict[str, Any]:
    spec = pod_spec(one(root, "Deployment", "mpsched"))
    (container,) = [c for c in containers(spec) if c["name"] in ("mpsched", "extender")]
    return container


@pytest.mark.parametrize("root", ROOTS)
def test_configmap_is_a_valid_configuration_and_the_extender_serves_it(root: str) -> None:
    config = _config(root)
    container = _extender(root)
    args = build_parser("serve").parse_args(container["args"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert args.config == f"{mounts['config']}/mpsched.yaml"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.server.metrics_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = one(root, "Service", "mpsched")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    # `mpsched status --kubeconfig` reaches /status through the port named metrics.
    assert service_ports["metrics"]["port"] == config.server.metrics_port
    if root == CLUSTER:
        assert config.leader_election.enabled
        assert config.leader_election.namespace == "mpsched-system"
        # The verbs' port wants kube-scheduler's client certificate: probes use the metrics port.
        assert config.tls.client_ca_file is not None and config.server.host == "0.0.0.0"
        assert config.tls.cert_file is not None
        assert config.tls.cert_file.startswith(mounts["tls"])
        assert ports["extender"] == config.server.port == service_ports["extender"]["port"]
    else:
        # Beside kube-scheduler on loopback: no TLS, no port, no election of its own.
        assert config.server.host == "127.0.0.1" and config.tls.cert_file is None
        assert "extender" not in ports and "extender" not in service_ports
        assert not config.leader_election.enabled
        assert container["restartPolicy"] == "Always"  # a native sidecar


# -- the node agent ----------------------------------------------------------------------------

AGENT_FILE = DEPLOY / "base" / "agent-daemonset.yaml"


def _agent_pod(root: str = OWN) -> dict[str, Any]:
    return pod_spec(one(root, "DaemonSet", "mpsched-agent"))


def _comment_above(key: str) -> str:
    """The comment block right above the agent manifest's one line setting `key` ("" if none)."""
    lines = AGENT_FILE.read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:")]
    block: list[str] = []
    while at > 0 and lines[at - 1].strip().startswith("#"):
        at -= 1
        block.insert(0, lines[at].strip().lstrip("# "))
    return " ".join(block)


@pytest.mark.parametrize("root", ROOTS)
def test_agent_runs_on_gpu_nodes_only_and_updates_only_on_delete(root: str) -> None:
    daemonset = one(root, "DaemonSet", "mpsched-agent")
    assert daemonset["metadata"]["namespace"] == "mpsched-node"
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "drain" in AGENT_FILE.read_text()  # the comment says how to update a node
    pod = _agent_pod(root)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "affinity" not in pod  # one place to change the node selection
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["serviceAccountName"] == "mpsched-agent"


def _agent_config(root: str = OWN) -> Any:
    cm = one(root, "ConfigMap", "mpsched-config", "mpsched-node")
    return load_config_text(cm["data"]["mpsched.yaml"])


def test_agent_command_config_and_probes_match_the_configuration() -> None:
    config = _agent_config()
    pod = _agent_pod()
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert container["args"] == [
        "agent", "--node-name", "$(NODE_NAME)", "--config", "/etc/mpsched/mpsched.yaml",
    ]  # fmt: skip
    assert container["args"][4] == f"{mounts['config']['mountPath']}/mpsched.yaml"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "mpsched-config"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")) == {"compute", "utility"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.agent.metrics_port == 9465
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "livenessProbe" not in container  # a restart would take every MPS client with it
    assert "memory" in container["resources"]["requests"]
    assert "memory" in container["resources"]["limits"]
    assert "cpu" not in container["resources"]["limits"]  # throttling stalls MPS servers


def test_agent_mounts_what_its_configuration_names_at_the_same_host_paths() -> None:
    config = _agent_config()
    pod = _agent_pod()
    (container,) = pod["containers"]
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounted = {
        m["mountPath"]: (host[m["name"]], m.get("readOnly", False))
        for m in container["volumeMounts"]
        if m["name"] in host
    }

    def at(path: str) -> tuple[dict[str, Any], bool]:
        return mounted[path]

    # The pipe directory: the one path the daemon, the webhook's mount and every client share.
    pipe, read_only = at(config.webhook.pipe_directory)
    assert pipe == {"path": config.webhook.pipe_directory, "type": "DirectoryOrCreate"}
    assert not read_only
    logs, read_only = at(config.agent.mps.log_directory)
    assert logs == {"path": config.agent.mps.log_directory, "type": "DirectoryOrCreate"}
    assert not read_only
    for foreign in config.agent.mps.foreign_pipe_directories:
        source, read_only = at(foreign)
        assert source["path"] == foreign and read_only
    socket_dir = str(Path(config.agent.pod_resources_socket).parent)
    source, read_only = at(socket_dir)
    assert source["path"] == socket_dir and read_only
    # Every host path is mounted where the host has it, so the paths in the configuration
    # mean the same inside the agent and outside.
    assert all(path == source["path"] for path, (source, _) in mounted.items())


def test_agent_host_namespaces_and_privilege_are_explained() -> None:
    pod = _agent_pod()
    assert pod["hostPID"] is True
    assert pod["hostIPC"] is True  # hostIPC delivery: clients and servers meet there
    assert "hostNetwork" not in pod
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["privileged"] is True and security["runAsUser"] == 0
    # Each grant says why, where it is made.
    why = {
        "hostPID": "/proc/<pid>/cgroup",
        "hostIPC": "IPC namespace",
        "privileged": "nvmlDeviceSetComputeMode",
        "updateStrategy": "drain",
        "nodeSelector": "GPU nodes only",
    }
    for key, reason in why.items():
        assert reason in _comment_above(key), key
