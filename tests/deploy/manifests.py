"""The deploy/ kustomization roots, rendered as `kubectl apply -k` would apply them: every
directory under deploy/ whose kustomization.yaml is a Kustomization (not a Component, not the
shared base), rendered once per test session with `kubectl kustomize`."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

Json = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
#: The two ways to install; the overlays add cert-manager to them.
OWN, CLUSTER = "own-scheduler", "cluster-scheduler"
#: Seconds `kubectl kustomize` may take for one root (it takes well under one).
RENDER_TIMEOUT_S = 30


#: Roots that are not ways to install: the base is a building block; monitoring is an add-on
#: for clusters with the Prometheus Operator (its kinds are not in the core schemas), applied
#: on its own and checked in tests/observability.
NOT_INSTALLS = frozenset({"base", "monitoring"})


def roots() -> list[str]:
    """Every way to install, relative to deploy/."""
    found = []
    for path in sorted(DEPLOY.rglob("kustomization.yaml")):
        doc = yaml.safe_load(path.read_text())
        rel = path.parent.relative_to(DEPLOY).as_posix()
        if doc.get("kind", "Kustomization") == "Kustomization" and rel not in NOT_INSTALLS:
            found.append(rel)
    return found


@cache
def render(root: str) -> tuple[Json, ...]:
    """The objects `kubectl kustomize deploy/<root>` renders."""
    return render_dir(DEPLOY / root)


def render_dir(path: Path) -> tuple[Json, ...]:
    """The objects `kubectl kustomize <path>` renders (an overlay a test writes, say)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {path}: {done.stderr.strip()}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def overlay(directory: Path, root: str, **fields: Any) -> Path:
    """Write, in `directory`, the kustomization a user writes over deploy/<root> (its other
    fields: images, components, ... as given, component paths relative to deploy/); returns
    the directory to render."""
    directory.mkdir(parents=True, exist_ok=True)
    doc: Json = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / root, directory)],
        **fields,
    }
    if "components" in doc:
        doc["components"] = [os.path.relpath(DEPLOY / c, directory) for c in doc["components"]]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return directory


def images(objects: tuple[Json, ...]) -> list[str]:
    """Every container image (init containers included) of the rendered workloads."""
    return [
        c["image"]
        for d in objects
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")
        for c in containers(pod_spec(d))
    ]


def one(root: str, kind: str, name: str, namespace: str | None = None) -> Json:
    """The one object of `kind` named `name` (in `namespace`, where given) that `root` renders."""
    (doc,) = [
        d
        for d in render(root)
        if d["kind"] == kind
        and d["metadata"]["name"] == name
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]
    return doc


def pod_spec(workload: Json) -> Json:
    spec: Json = workload["spec"]["template"]["spec"]
    return spec


def containers(spec: Json) -> list[Json]:
    """App containers and init containers (native sidecars included)."""
    return [*spec.get("initContainers", []), *spec["containers"]]
