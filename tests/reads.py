"""What a computation reads of a Strategy, recorded while it runs (tests/test_field_reads.py).

`recording(strategy)` is the same strategy as a `RecordingStrategy`: inside `record()`, every field and
every declared view (a property planner.fields names, such as `pipelined`) that code asks it for is
noted; any other property is transparent (the fields it reads are noted instead).  A copy made with
`model_copy(update=...)` records too, except the fields the update set (the code chose their values, as
planner.search.ilp.floors.last_stage_view does).  `RecordingComms` stands for a stage's communicators
and notes, for each one the computation uses, what its shape reads (planner.cost.layout.GROUP_SHAPES).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

from planner.cost.layout import GROUP_SHAPES, StageComms
from planner.fields import FIELD_ROLES
from planner.strategy import Strategy

VIEWS = {name for role in FIELD_ROLES.values() for name in role.reads.values()}


@dataclass
class _Log:
    names: set[str] = field(default_factory=set)
    depth: int = 0  # > 0 inside a recorded view: its own reads are not the caller's
    chosen: dict[int, frozenset[str]] = field(default_factory=dict)  # id(copy) -> fields its update set
    views: frozenset[str] = frozenset(VIEWS)


_LOG: contextvars.ContextVar[_Log | None] = contextvars.ContextVar("strategy_reads", default=None)
_FIELDS = frozenset(Strategy.model_fields)


class RecordingStrategy(Strategy):
    """A Strategy that notes what is read of it inside `record()`."""

    def __getattribute__(self, name: str):
        log = _LOG.get()
        if log is None or log.depth or name not in _FIELDS and name not in log.views:
            return super().__getattribute__(name)
        if name not in log.chosen.get(id(self), ()):
            log.names.add(name)
        log.depth += 1
        try:
            return super().__getattribute__(name)
        finally:
            log.depth -= 1

    def model_copy(self, *, update=None, deep: bool = False):
        copy = super().model_copy(update=update, deep=deep)
        log = _LOG.get()
        if log is not None:
            log.chosen[id(copy)] = log.chosen.get(id(self), frozenset()) | frozenset(update or {})
        return copy


def recording(strategy: Strategy) -> RecordingStrategy:
    return RecordingStrategy.model_construct(**{name: getattr(strategy, name) for name in _FIELDS})


@contextlib.contextmanager
def record(views: frozenset[str] = frozenset(VIEWS)):
    """Yields the set of names read while the block runs (views: the properties noted as themselves)."""
    log = _Log(views=views)
    token = _LOG.set(log)
    try:
        yield log.names
    finally:
        _LOG.reset(token)


@contextlib.contextmanager
def paused():
    """Nothing read in the block is noted (setting up a computation's inputs)."""
    token = _LOG.set(None)
    try:
        yield
    finally:
        _LOG.reset(token)


class RecordingComms:
    """A stage's communicators; using one notes what its shape reads of the strategy."""

    def __init__(self, groups: StageComms, strategy: Strategy, gpus_per_node: int):
        self._groups, self._strategy, self._gpn = groups, strategy, gpus_per_node

    def __getattr__(self, name: str):
        if name in GROUP_SHAPES:
            GROUP_SHAPES[name](self._strategy, self._gpn)  # its reads are noted against the caller
        return getattr(self._groups, name)
