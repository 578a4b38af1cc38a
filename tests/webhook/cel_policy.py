"""A ValidatingAdmissionPolicy evaluated as kube-apiserver evaluates it, with cel-python: every
expression compiled once; `object`, `oldObject` (null on CREATE), `request` (operation,
subResource, userInfo, namespace, ...) bound; the policy's `variables` evaluated first and
exposed as `variables.<name>`. matchConditions decide whether the request is evaluated at all; a
validation that returns false denies with its messageExpression. Every evaluation also checks
that the `touches-mpsched` matchCondition never skips a request the validations would deny."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

Json = dict[str, Any]

POLICY_FILE = Path(__file__).resolve().parents[2] / "deploy" / "base" / "admission-policy.yaml"
TENANT = "alice@example.com"
EXEMPTION, SCOPE = "not-mpsched", "touches-mpsched"  # the policy's matchConditions


@dataclass(frozen=True)
class Decision:
    evaluated: bool  # False: a matchCondition was false, the policy did not look at the pod
    denials: tuple[str, ...]  # the messages of the validations that failed

    @property
    def allowed(self) -> bool:
        return not self.denials


def _value(program: celpy.Runner, activation: dict[str, Any], what: str) -> Any:
    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:  # failurePolicy Fail would deny; no sample may get here
        raise AssertionError(f"{what}: evaluation error {exc.args[:2]}") from None
    if isinstance(result, CELEvalError):
        raise AssertionError(f"{what}: evaluation error {result.args[:2]}")
    return result


def pod_request(operation: str, obj: Json, *, user: str = TENANT, sub_resource: str = "") -> Json:
    """The `request` variable of a pod request, as the API server fills it."""
    request: Json = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": sub_resource,
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": obj["metadata"].get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": user, "uid": "u-1", "groups": ["system:authenticated"]},
        "dryRun": False,
    }
    if "name" in obj["metadata"]:
        request["name"] = obj["metadata"]["name"]
    return request


class Policy:
    """The policy's expressions compiled once; `admit` evaluates them as kube-apiserver does."""

    def __init__(self, spec: Json) -> None:
        env = celpy.Environment()

        def compile_(text: str) -> celpy.Runner:
            return env.program(env.compile(text))

        self.spec = spec
        self.conditions = [(m["name"], compile_(m["expression"])) for m in spec["matchConditions"]]
        self.variables = [(v["name"], compile_(v["expression"])) for v in spec["variables"]]
        self.validations = [
            (compile_(v["expression"]), compile_(v["messageExpression"]))
            for v in spec["validations"]
        ]

    def admit(
        self,
        operation: str,
        obj: Json,
        old: Json | None = None,
        *,
        user: str = TENANT,
        sub_resource: str = "",
    ) -> Decision:
        assert (old is None) == (operation == "CREATE")
        request = pod_request(operation, obj, user=user, sub_resource=sub_resource)
        activation: dict[str, Any] = {
            "object": json_to_cel(obj),
            "oldObject": json_to_cel(old),
            "request": json_to_cel(request),
        }
        conditions = {
            name: bool(_value(program, activation, f"matchCondition {name}"))
            for name, program in self.conditions
        }
        variables = celtypes.MapType()
        activation["variables"] = variables
        for name, program in self.variables:
            variables[celtypes.StringType(name)] = _value(program, activation, f"variable {name}")
        denials: list[str] = []
        for i, (check, message) in enumerate(self.validations):
            if not _value(check, activation, f"validation {i}"):
                denials.append(str(_value(message, activation, f"messageExpression {i}")))
        # `touches-mpsched` is an optimisation: it must never hide a denial (`not-mpsched`, the
        # exemption, is meant to).
        assert conditions[SCOPE] or not denials, f"{SCOPE} skips a request denied: {denials}"
        matched = all(conditions.values())
        return Decision(evaluated=matched, denials=tuple(denials) if matched else ())


@cache
def policy_documents() -> tuple[Json, ...]:
    """The policy and its binding, as shipped."""
    return tuple(d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d)


@cache
def policy() -> Policy:
    return Policy(policy_documents()[0]["spec"])
