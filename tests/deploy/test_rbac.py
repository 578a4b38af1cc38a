"""RBAC in every root is exactly what the code calls, both ways: nothing it calls is missing,
nothing granted goes unused. The tables below are the code's API calls (the generated client's
methods in extender/kube, each a verb on a resource, and the writes the adapter sends itself,
each named by its verb and resource) and which command makes them; a test reads extender/kube
and fails when a call appears that the tables do not know, so a new call cannot ship without
its grant. kube-scheduler's own needs (own-scheduler) are upstream's
ClusterRoles, bound by name, plus its Lease and the authentication ConfigMap reader."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import yaml

from extender.config import load_config_text
from tests.deploy.manifests import CLUSTER, OWN, REPO, Json, one, render, roots


@dataclass(frozen=True)
class Grant:
    group: str
    resource: str
    verb: str
    #: None: cluster-wide (a ClusterRole); else the namespace and, where RBAC can say, the name.
    namespace: str | None = None
    name: str | None = None


#: The generated client's method -> the (group, resource, verbs) it calls.
CLIENT_CALLS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # follow(): list then watch (watch=True on the same method)
    "list_node": ("", "nodes", ("list", "watch")),
    # follow() (list + watch, every namespace) and the agent's list_node_pods (list only)
    "list_pod_for_all_namespaces": ("", "pods", ("list", "watch")),
    "read_namespaced_pod": ("", "pods", ("get",)),  # get_pod: an in-doubt bind's read-back
    "read_node": ("", "nodes", ("get",)),  # get_node (agent)
    "read_namespaced_lease": ("coordination.k8s.io", "leases", ("get",)),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", ("create",)),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", ("update",)),
}

#: What `kubectl mpsched` (extender/kube/plugin.py) calls with the user's own kubeconfig, not a
#: service account's: no role in deploy/ grants it (docs/operating.md names what it needs).
PLUGIN_CALLS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "list_namespaced_pod": ("", "pods", ("list",)),  # the agents' pods, for top
    "connect_get_namespaced_service_proxy_with_path": ("", "services/proxy", ("get",)),
    "connect_get_namespaced_pod_proxy_with_path": ("", "pods/proxy", ("get",)),
}

#: The writes KubeCluster._write sends (verb, core resource).
WRITES: set[tuple[str, str]] = {
    ("create", "pods/binding"),  # bind
    ("patch", "nodes"),  # patch_node_metadata (agent)
    ("create", "events"),  # record_event, record_node_event
}

#: What each command calls, cluster-wide.
SERVE = {
    Grant("", "nodes", "list"), Grant("", "nodes", "watch"),
    Grant("", "pods", "list"), Grant("", "pods", "watch"), Grant("", "pods", "get"),
    Grant("", "pods/binding", "create"), Grant("", "events", "create"),
}  # fmt: skip
AGENT = {
    Grant("", "nodes", "get"), Grant("", "nodes", "patch"),
    Grant("", "pods", "list"),  # its node's pods, by field selector; no watch
    Grant("", "events", "create"),
}  # fmt: skip


def _lease_grants(namespace: str, name: str) -> set[Grant]:
    """serve's election: read, create when absent, replace to renew, take over, release."""
    group = "coordination.k8s.io"
    return {
        Grant(group, "leases", "get", namespace, name),
        Grant(group, "leases", "update", namespace, name),
        Grant(group, "leases", "create", namespace),  # RBAC cannot limit create by name
    }


def test_the_table_knows_every_api_call_the_code_makes() -> None:
    called = set()
    written = set()
    for path in (REPO / "extender" / "kube").glob("*.py"):
        text = path.read_text()
        called |= set(re.findall(r"self\._(?:core|leases)\.(\w+)", text))
        written |= set(re.findall(r'verb="(\w+)",\s*resource="([\w/]+)"', text))
    assert called == set(CLIENT_CALLS) | set(PLUGIN_CALLS)
    assert written == WRITES
    # And the commands' sets are made of those calls.
    table = {Grant(g, r, v) for g, r, verbs in CLIENT_CALLS.values() for v in verbs}
    table |= {Grant("", r, v) for v, r in WRITES}
    leases = {Grant(g.group, g.resource, g.verb) for g in _lease_grants("x", "y")}
    assert SERVE | AGENT | leases == table


def _rules(doc: Json) -> set[Grant]:
    namespace = doc["metadata"].get("namespace") if doc["kind"] == "Role" else None
    grants = set()
    for rule in doc["rules"]:
        names = rule.get("resourceNames") or [None]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in names:
                        grants.add(Grant(group, resource, verb, namespace, name))
    return grants


def _granted(root: str, account: str, namespace: str) -> tuple[set[Grant], set[str]]:
    """What `account` may do through the roles `root` renders, and the upstream (not rendered)
    roles it is bound to."""
    docs = render(root)
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    grants: set[Grant] = set()
    upstream: set[str] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], where, ref["name"]))
        if role is None:
            upstream.add(f"{ref['kind']} {where or ''}/{ref['name']}")
        else:
            grants |= _rules(role)
    return grants, upstream


def _config(root: str) -> object:
    return load_config_text(
        one(root, "ConfigMap", "mpsched-config", "mpsched-system")["data"]["mpsched.yaml"]
    )


@pytest.mark.parametrize("root", roots())
def test_the_extenders_account_may_do_exactly_what_serve_calls(root: str) -> None:
    grants, upstream = _granted(root, "mpsched", "mpsched-system")
    election = _config(root).leader_election  # type: ignore[attr-defined]
    want = set(SERVE)
    if election.enabled:
        want |= _lease_grants(election.namespace, election.lease_name)
    if root.endswith(OWN) or root.startswith("overlays/own"):
        assert not election.enabled  # it follows kube-scheduler's
        scheduler = yaml.safe_load(
            one(root, "ConfigMap", "mpsched-scheduler-config")["data"]["kube-scheduler.yaml"]
        )["leaderElection"]
        group = "coordination.k8s.io"
        # create comes with system:kube-scheduler; get/update only on its name "kube-scheduler".
        want |= {
            Grant(group, "leases", verb, scheduler["resourceNamespace"], scheduler["resourceName"])
            for verb in ("get", "update")
        }
        assert upstream == {
            "ClusterRole /system:kube-scheduler",
            "ClusterRole /system:volume-scheduler",
            "Role kube-system/extension-apiserver-authentication-reader",
        }
    else:
        assert upstream == set()
    assert grants == want


@pytest.mark.parametrize("root", roots())
def test_the_agents_account_may_do_exactly_what_the_agent_calls(root: str) -> None:
    grants, upstream = _granted(root, "mpsched-agent", "mpsched-node")
    assert grants == AGENT and upstream == set()


@pytest.mark.parametrize("root", roots())
def test_no_other_account_is_granted_anything(root: str) -> None:
    for doc in render(root):
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in doc["subjects"]:
                assert (subject["name"], subject["namespace"]) in (
                    ("mpsched", "mpsched-system"),
                    ("mpsched-agent", "mpsched-node"),
                ), doc["metadata"]["name"]
    # The webhook decides from the review alone: no token at all.
    account = one(root, "ServiceAccount", "mpsched-webhook")
    assert account["automountServiceAccountToken"] is False


def test_both_modes_are_covered() -> None:
    assert {OWN, CLUSTER} <= set(roots())
