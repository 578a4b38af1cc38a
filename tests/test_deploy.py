"""The deployment manifests hang together: every file kustomize lists exists and parses, the
ConfigMap's configuration passes validation, the Deployment serves it on the probed port, and
RBAC grants exactly the API calls the Kubernetes adapter makes; the node agent's DaemonSet runs
on GPU nodes only, with the host namespaces and mounts its configuration needs (each privilege
explained where it is granted), updates only when an operator deletes a pod, and its own
service account may do exactly what the agent calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from extender.config import load_config_text

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SCHEDULER_CONFIG = DEPLOY.parent / "config" / "kube-scheduler.yaml"


def _documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    return docs


def _one(kind: str, name: str = "mpsched") -> dict[str, Any]:
    """The one object of `kind` named `name` (the webhook's objects sit beside the extender's)."""
    (doc,) = [d for d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_configmap_is_a_valid_configuration_and_the_deployment_serves_it() -> None:
    config = load_config_text(_one("ConfigMap", "mpsched-config")["data"]["mpsched.yaml"])
    assert config.leader_election.enabled
    assert config.leader_election.namespace == "mpsched-system"
    container = _one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["serve", "--config"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert container["args"][2] == f"{mounts['config']}/mpsched.yaml"
    assert config.tls.cert_file is not None
    assert config.tls.cert_file.startswith(mounts["tls"])
    assert container["ports"][0]["containerPort"] == config.server.port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The verbs' port wants kube-scheduler's client certificate: probes use the metrics port.
    assert config.tls.client_ca_file is not None and config.server.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.server.metrics_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
    service = _one("Service")
    assert service["spec"]["ports"][0]["port"] == config.server.port


def _allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


def test_rbac_grants_what_the_adapter_calls() -> None:
    cluster_rules = _one("ClusterRole", "mpsched-extender")["rules"]
    needed = [
        ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "get"),
        ("", "pods/binding", "create"), ("", "events", "create"),
    ]  # fmt: skip
    for group, resource, verb in needed:
        assert _allowed(cluster_rules, group, resource, verb), (resource, verb)
    # Nothing that could change a pod's spec or delete anything.
    assert not any(v in r["verbs"] for r in cluster_rules for v in ("update", "delete"))
    role = next(d for d in _documents() if d["kind"] == "Role")
    for verb in ("get", "create", "update"):
        assert _allowed(role["rules"], "coordination.k8s.io", "leases", verb)


def test_scheduler_config_points_at_the_service_and_manages_every_resource() -> None:
    scheduler = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    (extender,) = scheduler["extenders"]
    service = _one("Service")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert extender["urlPrefix"] == f"https://{host}:{service['spec']['ports'][0]['port']}"
    assert extender["nodeCacheCapable"] is True
    assert extender["weight"] > 0
    managed = {r["name"] for r in extender["managedResources"]}
    assert managed == {f"mpsched.io/{r}" for r in ("threads", "memory", "units", "gpus", "clients")}


# -- the node agent ----------------------------------------------------------------------------

AGENT_FILE = DEPLOY / "agent-daemonset.yaml"


def _agent_pod() -> dict[str, Any]:
    spec: dict[str, Any] = _one("DaemonSet", "mpsched-agent")["spec"]["template"]["spec"]
    return spec


def _comment_above(key: str) -> str:
    """The comment block right above the agent manifest's one line setting `key` ("" if none)."""
    lines = AGENT_FILE.read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:")]
    block: list[str] = []
    while at > 0 and lines[at - 1].strip().startswith("#"):
        at -= 1
        block.insert(0, lines[at].strip().lstrip("# "))
    return " ".join(block)


def test_agent_runs_on_gpu_nodes_only_and_updates_only_on_delete() -> None:
    daemonset = _one("DaemonSet", "mpsched-agent")
    assert daemonset["metadata"]["namespace"] == "mpsched-system"
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "drain" in AGENT_FILE.read_text()  # the comment says how to update a node
    pod = _agent_pod()
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "affinity" not in pod  # one place to change the node selection
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["serviceAccountName"] == "mpsched-agent"


def test_agent_command_config_and_probes_match_the_configuration() -> None:
    config = load_config_text(_one("ConfigMap", "mpsched-config")["data"]["mpsched.yaml"])
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
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert "livenessProbe" not in container  # a restart would take every MPS client with it
    assert "memory" in container["resources"]["requests"]
    assert "memory" in container["resources"]["limits"]
    assert "cpu" not in container["resources"]["limits"]  # throttling stalls MPS servers


def test_agent_mounts_what_its_configuration_names_at_the_same_host_paths() -> None:
    config = load_config_text(_one("ConfigMap", "mpsched-config")["data"]["mpsched.yaml"])
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
    config = load_config_text(_one("ConfigMap", "mpsched-config")["data"]["mpsched.yaml"])
    pod = _agent_pod()
    assert pod["hostPID"] is True
    assert pod["hostIPC"] is config.webhook.host_ipc is True  # clients and servers meet there
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


def test_agent_rbac_is_exactly_what_the_agent_calls() -> None:
    role = _one("ClusterRole", "mpsched-agent")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "nodes", "get"), ("", "nodes", "patch"),
        ("", "pods", "list"),
        ("", "events", "create"), ("", "events", "patch"),
    }  # fmt: skip
    binding = _one("ClusterRoleBinding", "mpsched-agent")
    assert binding["roleRef"]["name"] == "mpsched-agent"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mpsched-agent", "namespace": "mpsched-system"}
    ]
    account = _one("ServiceAccount", "mpsched-agent")
    assert account["metadata"]["namespace"] == "mpsched-system"
    # The agent's account is bound to nothing else (not the extender's role, not the Lease).
    for doc in _documents():
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding") and doc != binding:
            assert all(s["name"] != "mpsched-agent" for s in doc["subjects"]), doc["metadata"]
