"""The node states of the evaluator, reduced to small integers: equal *state ids* mean equal
GPU budgets, usage, UIDs and free CPU, hence equal fit and score for any request.

Owns the state index: a node's id is recomputed only when the service reports that the node
changed (`touch`), so a filter never walks the GPUs of unchanged nodes; the log of touches
(`touched_since`) for callers that keep results across calls; the policy's view of each state;
and, for the compiled build's C share fit, each state's packed fit record. `Evaluator`
(`extender.packing.evaluate`) keeps its result caches over these ids. Nothing here does I/O.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Set
from typing import Final, NamedTuple

from extender.packing import native as _native
from extender.packing.errors import RecordLayoutError
from extender.packing.ledger import GpuUsage, Ledger, NodeUsage, unshareable_detail
from extender.packing.model import GpuInfo
from extender.packing.policies import NodeState
from extender.packing.settings import BudgetSettings
from extender.packing.usage import uids_mixed
from extender.packing.view import node_state

#: Touches remembered for `touched_since`: between a filter and its prioritize a few binds
#: land; more than this and the caller recomputes instead.
TOUCH_LOG: Final = 64
#: A GPU's UIDs in its figures (`GpuFigures.uid_kind`): no share, one share whose UID is not
#: known, every share of one known UID, shares of several UIDs (or several of unknown UID).
_UIDS_NONE: Final = 0
_UIDS_UNSET: Final = 1
_UIDS_ONE: Final = 2
_UIDS_MANY: Final = 3


class GpuFigures(NamedTuple):
    """One GPU as the state index sees it: every figure of it that the share fit
    (`ledger.share_cause`), the policy's view (`view.gpu_free`) or a misfit's reason reads,
    and nothing else. The one list of a GPU's fields: a node's state key is its GPUs' figures,
    and its C fit record these words in this order (`_native.c`, checked at import)."""

    gpu_index: int
    #: The number of the GPU's shape (memory MiB, units: what a share's demand depends on).
    shape: int
    cap_threads: int
    cap_memory: int
    cap_clients: int
    cap_overhead: int
    threads: int
    memory: int
    clients: int
    owned: int
    uid_kind: int
    #: The one UID of `_UIDS_ONE`, else 0.
    uid: int
    idle: int
    #: The number of why the GPU takes no shares (`ledger.unshareable_detail`), 0 if it does.
    unshareable: int


#: The names of a GPU's figures, in the fit record's order.
GPU_FIELDS: Final = GpuFigures._fields


def check_record_layout(native_fields: tuple[str, ...] | None) -> None:
    """Refuse a C fit whose record fields (`_native.RECORD_FIELDS`; None in the pure build)
    are not GPU_FIELDS in the same order: it would read one budget as another."""
    if native_fields is not None and tuple(native_fields) != GPU_FIELDS:
        raise RecordLayoutError(
            "extender.packing._native reads fit records as "
            f"({', '.join(native_fields)}), state_index writes ({', '.join(GPU_FIELDS)}): "
            "rebuild the C extension from this source"
        )


check_record_layout(_native.RECORD_FIELDS)


class StateIndex:
    """Node name → state id over the ledger's nodes, and what each state id stands for."""

    def __init__(
        self,
        ledger: Ledger,
        budgets: BudgetSettings,
        *,
        cpu_free: Callable[[str], int],
        native: bool = True,
    ) -> None:
        self.ledger = ledger
        self.budgets = budgets
        self._cpu_free = cpu_free
        #: Bumped on every change that can alter any result: a touched node, a new policy.
        self.epoch = 0
        #: (epoch after the change, node touched or None for a change to every node), newest
        #: last: what changed since an epoch, for callers that keep results across calls.
        self._touches: deque[tuple[int, str | None]] = deque(maxlen=TOUCH_LOG)
        self._dirty: set[str] = set()
        self._state_of: dict[str, int] = {}
        #: Index size at the last `compact`; nodes added since are scattered again.
        self._compacted = 0
        #: The policy's view of each state id.
        self._states: list[NodeState] = []
        self._generation: dict[str, int] = {}
        self._intern: dict[tuple[object, ...], int] = {}
        #: The compiled build's C share fit (None in the pure build), the packed fit record of
        #: each state id it can fit (`fit_record`), and the GPU shapes (memory MiB, units) the
        #: records number, with a GPU of each shape to compute a request's demand on.
        #: (`native=False` computes in Python where the C extension is installed too: the
        #: tests compare the two.)
        self._fit_share = _native.FIT_SHARE if native else None
        self._records: list[bytes | None] = []
        self._gpu_shapes: dict[tuple[int, int], int] = {}
        self._shape_infos: list[GpuInfo] = []
        #: Why a GPU takes no shares → its number in `GpuFigures.unshareable`.
        self._unshareable_ids: dict[str, int] = {}

    # -- node state -----------------------------------------------------------------------

    def touch(self, node: str) -> None:
        """The node's usage, inventory or free CPU changed."""
        self._dirty.add(node)
        self.epoch += 1
        self._touches.append((self.epoch, node))

    def touched_since(self, epoch: int) -> Set[str] | None:
        """The nodes whose results may have changed since `epoch` (an earlier `self.epoch`),
        or None when every node's may have (a new policy) or the log no longer reaches back."""
        if epoch == self.epoch:
            return frozenset()
        touches = self._touches
        if not touches or touches[0][0] > epoch + 1:
            return None
        names: set[str] = set()
        for at, name in reversed(touches):
            if at <= epoch:
                break
            if name is None:
                return None
            names.add(name)
        return names

    def _restate(self, name: str) -> None:
        usage = self.ledger.get_node(name)
        if usage is None:
            self._state_of.pop(name, None)
            self._generation.pop(name, None)
            return
        cpu = self._cpu_free(name)
        figures = tuple([self._figures(g) for g in usage.gpus])
        key = (
            usage.inventory.multi_user,
            usage.held_elsewhere,
            len(usage.unplaced),
            cpu,
            usage.gpus[0].info.model if usage.gpus else "",
            figures,
        )
        sid = self._intern.get(key)
        if sid is None:
            # Equal state ids are equal policy views and fit inputs: one of each serves them
            # all, read by the id (a list index) where a fill needs it.
            sid = self._intern[key] = len(self._intern)
            self._states.append(node_state(usage, cpu, proportional=self.budgets.proportional))
            if self._fit_share is not None:
                self._records.append(self._record(usage, figures))
        self._state_of[name] = sid
        self._generation[name] = usage.generation

    def fit_record(self, usage: NodeUsage) -> bytes | None:
        """The node's GPUs packed as the C share fit reads them (`_native.c`: a header, then
        each GPU's figures), or None where only the Python fit decides."""
        return self._record(usage, tuple([self._figures(g) for g in usage.gpus]))

    def _record(self, usage: NodeUsage, figures: tuple[GpuFigures, ...]) -> bytes | None:
        """`fit_record` of the node's figures; None for no GPUs, GPUs held elsewhere,
        allocations it cannot place, more GPUs than the C fit takes, or figures past 64
        bits."""
        if not figures or usage.held_elsewhere or usage.unplaced or len(figures) > _native.MAX_GPUS:
            return None
        words = [len(figures), int(usage.inventory.multi_user)]
        for gpu in figures:
            words += gpu
        try:
            return array("q", words).tobytes()
        except OverflowError:
            return None

    def _figures(self, g: GpuUsage) -> GpuFigures:
        info, cap, uids = g.info, g.capacity, g.uids
        if not uids:
            kind, uid = _UIDS_NONE, 0
        elif uids_mixed(uids):
            kind, uid = _UIDS_MANY, 0
        else:
            only = next(iter(uids))
            kind, uid = (_UIDS_UNSET, 0) if only is None else (_UIDS_ONE, only)
        # Positional, in the fields' order: keywords cost a dictionary per GPU.
        return GpuFigures(
            info.index,
            self._gpu_shape(info),
            cap.threads,
            cap.memory_mib,
            cap.clients,
            cap.client_overhead_mib,
            g.threads,
            g.memory_mib,
            g.clients,
            int(g.owner is not None),
            kind,
            uid,
            int(g.idle),
            0 if cap.threads else self._unshareable(info),
        )

    def _gpu_shape(self, info: GpuInfo) -> int:
        """The number of the GPU's shape (memory MiB, units: what a share's demand depends
        on) in the fit records; numbers are never reused."""
        key = (info.memory_mib, info.units)
        found = self._gpu_shapes.get(key)
        if found is None:
            found = self._gpu_shapes[key] = len(self._shape_infos)
            self._shape_infos.append(info)
        return found

    def _unshareable(self, info: GpuInfo) -> int:
        """The number (from 1) of why the GPU takes no shares; numbers are never reused."""
        why = unshareable_detail(info)
        found = self._unshareable_ids.get(why)
        if found is None:
            found = self._unshareable_ids[why] = len(self._unshareable_ids) + 1
        return found

    def compact(self) -> None:
        """Rebuild the name index with fresh key strings allocated one after another, in name
        order. A filter call looks up every candidate name: with keys scattered over the heap
        (as the cluster's objects left them) each lookup misses the CPU cache two or three
        times; packed, the index stays in a few hundred KB, and a filter's lookups with the
        CPU cache cold between calls cost markedly less."""
        # The ids are fresh int objects too (`sid + 1 - 1` is a new object above 256): the
        # lookup increments each value's reference count, another cache line per name.
        self._state_of = {
            name.encode().decode(): sid + 1 - 1 for name, sid in sorted(self._state_of.items())
        }
        self._compacted = len(self._state_of)

    def state_ids(self) -> dict[str, int]:
        """Node name → state id, for every node with an inventory (after `refresh`)."""
        return self._state_of

    def node_state(self, name: str) -> NodeState | None:
        sid = self._state_of.get(name)
        return None if sid is None else self._states[sid]
