"""AdmissionReview documents as kube-apiserver sends them, Pod objects as they look at admission
(defaulted, a generated name and no name or namespace yet on CREATE, the service-account token
volume already added), a small RFC 6902 JSONPatch applier, and the downward API's env rules."""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

Json = dict[str, Any]

#: Who creates a Deployment's pods.
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
MPSCHED = "system:serviceaccount:mpsched-system:mpsched"


def container(name: str = "main", *, limits: dict[str, str] | None = None, **extra: Any) -> Json:
    """A container as the API server defaults it, with the token mount of the SA plugin."""
    out: Json = {
        "name": name,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "resources": {"limits": dict(limits or {}), "requests": dict(limits or {})},
        "volumeMounts": [
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    out.update(extra)
    return out


def pod_object(*containers: Json, init: list[Json] | None = None, **spec: Any) -> Json:
    """A Pod at CREATE admission: generateName, no name, no namespace, no uid."""
    body: Json = {
        "containers": list(containers) or [container()],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {"runAsUser": 1000},
        "schedulerName": "default-scheduler",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
        "volumes": [
            {
                "name": "kube-api-access-x7k2p",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                    ],
                    "defaultMode": 420,
                },
            }
        ],
    }
    if init is not None:
        body["initContainers"] = init
    body.update(spec)
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "train-7d9f8b6c5-",
            "creationTimestamp": None,
            "labels": {"app": "train", "pod-template-hash": "7d9f8b6c5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "train-7d9f8b6c5",
                    "uid": "8c1f3e0a-2b7d-4c55-9a0e-3f1d2c4b5a69",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": body,
        "status": {},
    }


def review(
    obj: Json | None,
    *,
    operation: str = "CREATE",
    old: Json | None = None,
    username: str = REPLICASET_CONTROLLER,
    dry_run: bool = False,
    namespace: str = "team-a",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
) -> Json:
    """The AdmissionReview v1 request kube-apiserver sends a webhook for a pod."""
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    options = {
        "CREATE": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        "UPDATE": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
    }.get(operation)
    request: Json = {
        "uid": uid,
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {
            "username": username,
            "uid": "2c2b8d4e-8f3a-4a8e-a0c4-4f5e7d6c3b21",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        },
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
        "options": options,
    }
    if operation != "CREATE" and obj is not None:
        request["name"] = obj["metadata"]["name"]
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def created(obj: Json, *, name: str = "train-7d9f8b6c5-q2x8z", namespace: str = "team-a") -> Json:
    """The pod as stored once admitted: named, in its namespace, with a uid."""
    out = copy.deepcopy(obj)
    out["metadata"].update(name=name, namespace=namespace, uid=f"uid-{namespace}-{name}")
    out["metadata"].pop("generateName", None)
    out["status"] = {"phase": "Pending"}
    return out


# --- JSONPatch (RFC 6902) ----------------------------------------------------------------


class PatchError(Exception):
    pass


def _tokens(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} does not start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise PatchError(f"{path}: no member {token!r}")
        return node[token]
    if isinstance(node, list):
        if not token.isdigit() or int(token) >= len(node):
            raise PatchError(f"{path}: no element {token!r}")
        return node[int(token)]
    raise PatchError(f"{path}: {token!r} inside a {type(node).__name__}")


def apply_patch(doc: Json, ops: Sequence[Mapping[str, Any]]) -> Json:
    """`doc` with `ops` applied (add, remove, replace, test), strictly as RFC 6902 says: the
    parent of a target must exist, `-` appends to an existing array only."""
    out = copy.deepcopy(doc)
    for op in ops:
        tokens = _tokens(op["path"])
        if not tokens:
            raise PatchError("the whole document cannot be patched here")
        parent: Any = out
        for token in tokens[:-1]:
            parent = _child(parent, token, op["path"])
        last = tokens[-1]
        kind = op["op"]
        if kind == "add":
            value = copy.deepcopy(op["value"])
            if isinstance(parent, dict):
                parent[last] = value
            elif isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                elif last.isdigit() and int(last) <= len(parent):
                    parent.insert(int(last), value)
                else:
                    raise PatchError(f"{op['path']}: bad index")
            else:
                raise PatchError(f"{op['path']}: parent is a {type(parent).__name__}")
        elif kind in ("remove", "replace", "test"):
            current = _child(parent, last, op["path"])
            if kind == "test" and current != op["value"]:
                raise PatchError(f"{op['path']}: test failed")
            if kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            if kind == "replace":
                parent[int(last) if isinstance(parent, list) else last] = op["value"]
        else:
            raise PatchError(f"unsupported op {kind!r}")
    return out


def patch_of(response: Json) -> list[Json]:
    """The decoded JSONPatch of an AdmissionReview response ([] when it carries none)."""
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    ops: list[Json] = json.loads(base64.b64decode(body["patch"]))
    return ops


# --- the downward API ---------------------------------------------------------------------

_ANNOTATION = re.compile(r"^metadata\.annotations\['([^']+)'\]$")


def resolve_env(pod: Json, container_name: str) -> dict[str, str]:
    """A container's env as the kubelet computes it from the pod: plain values, and fieldRefs
    to annotations (a missing annotation gives ""). Later entries of a name win."""
    annotations = pod["metadata"].get("annotations") or {}
    spec = pod["spec"]
    (c,) = [
        c
        for c in spec.get("containers", []) + spec.get("initContainers", [])
        if c["name"] == container_name
    ]
    env: dict[str, str] = {}
    for entry in c.get("env", []):
        if "valueFrom" in entry:
            match = _ANNOTATION.match(entry["valueFrom"]["fieldRef"]["fieldPath"])
            assert match, entry
            env[entry["name"]] = annotations.get(match.group(1), "")
        else:
            env[entry["name"]] = entry.get("value", "")
    return env
