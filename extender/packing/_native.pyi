"""Types of the C extension module `_native.c` (built only by the compiled build)."""

from array import array
from collections.abc import Sequence

MAX_GPUS: int
RECORD_FIELDS: tuple[str, ...]

class Plan:
    def __init__(
        self,
        cpu_only: float,
        groups: tuple[tuple[int, tuple[tuple[int, int, bool, float, int], ...], float], ...],
        left: tuple[float, ...],
        gaps: tuple[float, ...],
        lookahead: float,
        mix: bool,
    ) -> None: ...
    def value(self, cpu: int, free_sorted: tuple[int, ...], /) -> float: ...
    def score(
        self,
        cpu_free: int,
        free: tuple[int, ...],
        pod_cpu: int,
        threads: int,
        gpus: int,
        candidates: Sequence[int],
        /,
    ) -> tuple[float, int | None]: ...

def fit_share(
    record: bytes, demands: bytes, run_as_user: int | None, uid_isolation: bool, /
) -> tuple[tuple[int, ...], tuple[int, ...]] | None: ...
def fill_share(
    record: bytes,
    demands: bytes,
    run_as_user: int | None,
    uid_isolation: bool,
    plan: Plan,
    cpu_free: int,
    free: tuple[int, ...],
    pod_cpu: int,
    /,
) -> tuple[float, int] | None: ...
def pick_bytes(source: bytes | bytearray, ids: tuple[int, ...], /) -> bytes: ...
def pick_doubles(source: array[float], ids: tuple[int, ...], /) -> tuple[float, ...]: ...
def scale(raw: tuple[float, ...] | list[float], top: int, /) -> tuple[int, ...] | None: ...
