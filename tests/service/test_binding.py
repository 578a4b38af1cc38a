"""`assigned_node` reads the API server's 409 for a Binding of a pod that has a node as data
(reason, code, details) and its message narrowly: only that Status, only for that pod."""

from __future__ import annotations

from typing import Any

import pytest

from extender.cluster import NoAnswer, error_from_status, status_body
from extender.service.binding import assigned_node


def conflict(kind: str, name: str, why: str, **extra: Any) -> Any:
    # errors.NewConflict(schema.GroupResource{Resource: kind}, name, fmt.Errorf(why))
    message = f'Operation cannot be fulfilled on {kind} "{name}": {why}'
    return error_from_status(
        409, status_body(409, "Conflict", message, name=name, kind=kind, **extra), what="bind"
    )


def test_the_node_of_an_already_assigned_pod_is_read() -> None:
    exc = conflict("pods/binding", "web-1", 'pod web-1 is already assigned to node "gpu-a"')
    assert assigned_node(exc, "web-1") == "gpu-a"


@pytest.mark.parametrize(
    ("kind", "name", "why"),
    [
        # Another pod's Status, or the same words about another resource.
        ("pods/binding", "web-2", 'pod web-2 is already assigned to node "gpu-a"'),
        ("pods", "web-1", 'pod web-1 is already assigned to node "gpu-a"'),
        # The other refusals of assignPod, and the UID precondition.
        ("pods/binding", "web-1", "pod web-1 is being deleted, cannot be assigned to a host"),
        ("pods/binding", "web-1", "pod web-1 has non-empty .spec.schedulingGates"),
        # Not at the message's end, or a node %q had to escape: not this answer.
        ("pods/binding", "web-1", 'pod web-1 is already assigned to node "gpu-a" (sic)'),
        ("pods/binding", "web-1", 'pod web-1 is already assigned to node "gpu\\"a"'),
    ],
)
def test_any_other_answer_names_no_node(kind: str, name: str, why: str) -> None:
    assert assigned_node(conflict(kind, name, why), "web-1") is None


def test_only_a_conflict_names_a_node() -> None:
    message = 'pod web-1 is already assigned to node "gpu-a"'
    body = status_body(500, "InternalError", message, name="web-1", kind="pods/binding")
    assert assigned_node(error_from_status(500, body, what="bind"), "web-1") is None
    assert assigned_node(NoAnswer(message), "web-1") is None
