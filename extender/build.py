"""Which build of mpsched is running: the decision core compiled with mypyc, or pure Python.

Owns the list of modules the compiled build compiles (setup.py reads it from here, without
importing the package) and the check, at run time, of which of them were loaded compiled.

Why compile. Every /filter computes fit and score for each candidate node whose state the
caches have not seen; in a cluster that keeps filling, that is tens of nodes per pod, and the
interpreter's cost per operation dominates the scheduling latency. The modules below are the
decision core's hot path: plain, fully typed code (mypy --strict), which mypyc turns into C
extension modules with the same behaviour (the parity test checks it) several times faster.
What is left out is not hot, or relies on Python's own handling of bad input types (the
annotation codecs), or is read by introspection (the settings dataclasses, whose field types
the configuration reader checks values against), or owns a memory estimate measured on the
pure objects (the parse cache).

Beside them, the compiled build compiles the C extension modules of NATIVE_EXTENSIONS: the
per-node arithmetic of the fragmentation measure and the FGD score, the share fit and the
scaling of scores (`packing/_native.c`), where mypyc's boxing still cost more than the
arithmetic, and the writer of prioritize's answer (`http/_wire.c`). Their Python callers
compute in Python where they are not installed (the pure build), with the same results bit
for bit.

Stdlib only, and nothing from `extender` itself: setup.py runs this file on its own.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from typing import Final, Literal

#: The modules the compiled build compiles, in dependency order.
COMPILED_MODULES: Final = (
    "extender.packing.quantity",
    "extender.packing.model",
    "extender.packing.request",
    "extender.packing.objects",
    "extender.packing.podspec",
    "extender.packing.ledger",
    "extender.packing.fit",
    "extender.packing.view",
    "extender.packing.policies.base",
    "extender.packing.policies.scarcity",
    "extender.packing.policies.frag",
    "extender.packing.policies.fgd",
    "extender.packing.policies.bestfit",
    "extender.packing.policies.default",
    "extender.packing.policies.workload",
    "extender.packing.results",
    "extender.packing.state_index",
    "extender.packing.evaluate",
)

#: The C extension modules of the compiled build: (module, source file from the project root).
NATIVE_EXTENSIONS: Final = (
    ("extender.packing._native", "extender/packing/_native.c"),
    ("extender.http._wire", "extender/http/_wire.c"),
)
#: The accelerators (`AcceleratorSettings` fields) those C extension modules provide: where they
#: are not built (the pure build), switching one of these on or off changes nothing.
NATIVE_SWITCHES: Final = ("native_fit", "native_writer")
#: How they are compiled. No floating-point contraction: a fused multiply-add rounds once where
#: Python rounds twice, and the scores must be Python's to the bit.
NATIVE_COMPILE_ARGS: Final = ("-O2", "-ffp-contract=off", "-fno-fast-math")

Build = Literal["mypyc", "python", "partial"]


def compiled_modules() -> tuple[str, ...]:
    """The modules of COMPILED_MODULES and NATIVE_EXTENSIONS that this interpreter loads as
    extension modules."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    for name in (*COMPILED_MODULES, *(module for module, _ in NATIVE_EXTENSIONS)):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and spec.origin.endswith(suffixes):
            out.append(name)
    return tuple(out)


def build() -> Build:
    """`mypyc` when every hot module is compiled, `python` when none is, else `partial` (a
    broken install: some extension modules missing or shadowed by sources)."""
    found = len(compiled_modules())
    if found == len(COMPILED_MODULES) + len(NATIVE_EXTENSIONS):
        return "mypyc"
    return "python" if found == 0 else "partial"
