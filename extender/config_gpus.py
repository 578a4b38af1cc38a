"""The configuration's `gpuModels`: the facts (memory, compute capability) of the GPU models
that traces name by model only, for the simulator.

Owns `GpuModel`, the default models and the reading of a document's `gpuModels` section, which
adds to (or replaces) them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from extender.config_schema import Bad, Checks, Reader, integer, show
from extender.packing.errors import InvalidRequest
from extender.packing.model import ComputeCapability


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model's facts for traces that name models only (the simulator)."""

    memory_mib: int
    compute_capability: ComputeCapability


def _cc(text: str) -> ComputeCapability:
    return ComputeCapability.parse(text)


#: Models of the FGD benchmark trace (the FGD paper's Alibaba trace) with the memory totals
#: NVML reports for those models (the lowest seen). G2 and G3 are undisclosed Alibaba models:
#: assumed Volta-class with 32 GiB, as config/bench-openb.yaml does; a guess, not a fact.
DEFAULT_GPU_MODELS: Final = MappingProxyType(
    {
        "T4": GpuModel(15109, _cc("7.5")),
        "P100": GpuModel(16280, _cc("6.0")),
        "V100M16": GpuModel(16130, _cc("7.0")),
        "V100M32": GpuModel(32480, _cc("7.0")),
        "A10": GpuModel(23028, _cc("8.6")),
        "G2": GpuModel(32768, _cc("7.0")),
        "G3": GpuModel(32768, _cc("7.0")),
    }
)


def _cc_check(v: object) -> ComputeCapability:
    # YAML reads an unquoted 8.6 as a float; accept it, though "8.6" is the safe spelling.
    text = repr(v) if isinstance(v, float) else v
    if isinstance(text, str):
        try:
            return ComputeCapability.parse(text)
        except InvalidRequest:
            pass
    raise Bad('must be a compute capability such as "8.6"')


_GPU_MODEL: Final[Checks] = MappingProxyType(
    {
        "memoryMiB": ("memory_mib", integer(low=1)),
        "computeCapability": ("compute_capability", _cc_check),
    }
)


def read_gpu_models(r: Reader, doc: object) -> Mapping[str, GpuModel]:
    """`gpuModels`: model name → {memoryMiB, computeCapability}, added to the defaults."""
    models = dict(DEFAULT_GPU_MODELS)
    if doc is not None and not isinstance(doc, dict):
        r.problems.append(f"gpuModels: must be a mapping of model name to facts, got {show(doc)}")
    for name, facts in doc.items() if isinstance(doc, dict) else ():
        path = f"gpuModels.{name}"
        if not isinstance(name, str) or not name:
            r.problems.append(f"gpuModels: model name {show(name)} must be a non-empty string")
            continue
        before = len(r.problems)
        values = r.section(facts, path, _GPU_MODEL)
        if len(r.problems) > before:
            continue
        missing = [k for k, (attr, _) in _GPU_MODEL.items() if attr not in values]
        if missing:
            r.problems.append(f"{path}: missing {', '.join(missing)}")
        else:
            models[name] = GpuModel(**values)
    return MappingProxyType(models)
