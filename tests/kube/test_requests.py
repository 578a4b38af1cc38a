"""The bodies the Kubernetes adapter sends that it builds itself: an Event about a pod (from the
extender) and about a node (from its agent, reporting from that node)."""

from __future__ import annotations

from extender.kube.requests import event_body


def test_a_pod_event_names_the_pod_and_cuts_its_message() -> None:
    pod = {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "u"}
    body = event_body(
        "ns", pod, {"component": "mpsched"}, "T", reason="R", message="m" * 2000, warning=True
    )
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "p.", "namespace": "ns"},
        "involvedObject": pod,
        "reason": "R",
        "message": "m" * 1024,
        "type": "Warning",
        "source": {"component": "mpsched"},
        "reportingComponent": "mpsched",
        "firstTimestamp": "T",
        "lastTimestamp": "T",
        "count": 1,
    }


def test_a_node_event_reports_from_the_node() -> None:
    node = {"kind": "Node", "name": "gpu-1", "uid": "gpu-1"}
    source = {"component": "mpsched-agent", "host": "gpu-1"}
    body = event_body("default", node, source, "T", reason="R", message="m", warning=False)
    assert body["type"] == "Normal" and body["metadata"]["generateName"] == "gpu-1."
    assert (body["reportingComponent"], body["reportingInstance"]) == ("mpsched-agent", "gpu-1")
