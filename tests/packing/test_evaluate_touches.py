"""The evaluator's touch log: which nodes changed since an epoch, for callers that keep
results across calls (prioritize reusing its filter's scores while other pods bind)."""

from __future__ import annotations

from extender.packing.evaluate import Evaluator
from extender.packing.ledger import Ledger
from extender.packing.policies.bestfit import BestFitPolicy
from extender.packing.settings import BudgetSettings
from extender.packing.state_index import TOUCH_LOG


def _evaluator() -> Evaluator:
    # Touches need no inventory: the log records names; only refresh reads the ledger.
    budgets = BudgetSettings()
    return Evaluator(Ledger(budgets), budgets, BestFitPolicy(), cpu_free=lambda _: 0)


def test_touched_since_names_the_nodes_changed_after_an_epoch() -> None:
    ev = _evaluator()
    start = ev.epoch
    assert ev.touched_since(start) == frozenset()
    ev.touch("n0")
    middle = ev.epoch
    ev.touch("n2")
    ev.touch("n0")
    assert ev.touched_since(start) == {"n0", "n2"}
    assert ev.touched_since(middle) == {"n0", "n2"}
    assert ev.touched_since(ev.epoch) == frozenset()


def test_touched_since_is_none_after_a_policy_change_or_beyond_the_log() -> None:
    ev = _evaluator()
    start = ev.epoch
    ev.touch("n1")
    ev.set_policy(ev.policy)
    assert ev.touched_since(start) is None
    after_policy = ev.epoch
    ev.touch("n1")
    assert ev.touched_since(after_policy) == {"n1"}
    for _ in range(TOUCH_LOG):
        ev.touch("n2")
    # The log no longer reaches back to after_policy: unknown, not "only n2".
    assert ev.touched_since(after_policy) is None
    assert ev.touched_since(ev.epoch - 1) == {"n2"}
