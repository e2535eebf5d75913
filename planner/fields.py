"""One declaration per Strategy field: which cached computations read it, and its other roles.

The search caches what it computes for one configuration (communicator shapes, layer sums, bounds, slot
profiles, stage sums) and serves it to every configuration that agrees on the fields the computation
reads.  Those cache keys, the fields `compile --fix` may force and the fields a rank's state layout
depends on (re-planning) are all read off `FIELD_ROLES`, never listed by hand beside their code.

`tests/test_field_reads.py` runs every computation under every built-in runtime on a Strategy that
records what it is asked for and fails on any read a declaration here leaves out; `tests/test_table_cache.py`
varies every field and compares each cached quantity with a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping


class Reader(str, Enum):
    """A cached computation (its cache key is what it reads: `reads`)."""

    COMMS = "comms"  # planner.cost.layout.stage_comms: every communicator's shape
    LAYER_SUMS = "layer_sums"  # planner.cost.stage.sum_layers, with the communicators it is handed
    LAYER_TIMES = "layer_times"  # planner.cost.stage.layer_busy of a layer without experts: the sums' time terms
    EXPERT_TIMES = "expert_times"  # planner.cost.stage.layer_busy of a mixture-of-experts layer
    P2P = "p2p"  # planner.cost.comm.p2p_seconds: a stage's pipeline transfers
    COMPOSE = "compose"  # planner.cost.stage.compose_stage beyond the sums: memory, dp sync, optimizer, offload
    # the search's own quantities (planner.search.ilp.tables.TableBuilder), each beside the readers it calls
    WORK = "work"  # _work_by_layer_group: the fixed layers' and the cheapest block's busy seconds
    LOWER = "lower"  # lower_bound: balanced stages, nothing recomputed
    STAGE_SUMS = "stage_sums"  # stage_sums: a stage's content with its recomputed blocks
    PROFILE = "profile"  # _slot_profile: the fastest stage of n blocks on a pool


# which readers each reader runs: its key is its own reads and theirs
CALLS: Mapping[Reader, tuple[Reader, ...]] = {
    Reader.EXPERT_TIMES: (Reader.LAYER_TIMES,),
    Reader.WORK: (Reader.EXPERT_TIMES,),
    Reader.LOWER: (Reader.WORK, Reader.P2P),
    Reader.STAGE_SUMS: (Reader.LAYER_SUMS,),
    Reader.PROFILE: (Reader.STAGE_SUMS, Reader.LAYER_SUMS, Reader.COMPOSE),
}

ALL = tuple(Reader)
# the readers that run the cost model on a stage of the configuration (everything that can shape its costs)
COSTED = (Reader.LAYER_SUMS, Reader.P2P, Reader.COMPOSE, Reader.PROFILE)


@dataclass(frozen=True)
class FieldRole:
    """What one Strategy field means to the search and the tools around it."""

    reads: Mapping[Reader, str] = field(default_factory=dict)  # reader -> what it reads: the field itself or a
    # property computed from it and fields the reader also reads (pp -> pipelined: only whether there are stages)
    layout: bool = False  # which state a rank holds depends on it (re-planning's migration term)
    fixable: bool = False  # `compile --fix` may force it (a global key of the search's configurations)


def _as(name: str, *readers: Reader) -> dict[Reader, str]:
    return {reader: name for reader in readers}


# a layer's sums and its time terms alone: what a block costs; the expert fields only for MoE layers
LAYER = (Reader.LAYER_SUMS, Reader.LAYER_TIMES)
EXPERT = (Reader.LAYER_SUMS, Reader.EXPERT_TIMES)

FIELD_ROLES: Mapping[str, FieldRole] = {
    "tp": FieldRole(reads=_as("tp", Reader.COMMS, *LAYER, Reader.P2P, Reader.COMPOSE, Reader.LOWER), layout=True,
                    fixable=True),
    "pp": FieldRole(reads={**_as("pipelined", Reader.COMMS, *LAYER, Reader.P2P),
                           **_as("pp", Reader.COMPOSE, Reader.LOWER, Reader.PROFILE)}, layout=True, fixable=True),
    "dp": FieldRole(reads=_as("dp", Reader.COMMS, Reader.P2P, Reader.COMPOSE, Reader.LOWER), layout=True,
                    fixable=True),
    "cp": FieldRole(reads=_as("cp", Reader.COMMS, *LAYER, Reader.P2P, Reader.COMPOSE, Reader.LOWER), layout=True,
                    fixable=True),
    "ep": FieldRole(reads=_as("ep", Reader.COMMS, *EXPERT, Reader.COMPOSE), layout=True, fixable=True),
    "etp": FieldRole(reads=_as("expert_tp", Reader.COMMS, *EXPERT, Reader.COMPOSE), layout=True, fixable=True),
    "ep_overlap": FieldRole(reads=_as("ep_overlap", *EXPERT)),
    "dispatcher": FieldRole(reads=_as("dispatcher", *EXPERT), fixable=True),
    "mbs": FieldRole(reads=_as("mbs", *LAYER, Reader.P2P, Reader.COMPOSE), fixable=True),
    "vpp": FieldRole(reads=_as("vpp", Reader.P2P, Reader.COMPOSE, Reader.LOWER, Reader.STAGE_SUMS),
                     layout=True, fixable=True),
    "sp": FieldRole(reads=_as("sequence_parallel", *LAYER, Reader.P2P, Reader.COMPOSE)),
    # the runtime's autocast saves at low ZeRO stages (planner.cost.memory.saved_bytes) make activations read it
    "zero": FieldRole(reads=_as("zero", Reader.LAYER_SUMS, Reader.COMPOSE), layout=True, fixable=True),
    "shard": FieldRole(reads=_as("shard", Reader.COMMS, Reader.COMPOSE), layout=True, fixable=True),
    "recompute": FieldRole(reads=_as("recompute", Reader.COMPOSE, Reader.WORK, Reader.STAGE_SUMS)),
    "recompute_layers": FieldRole(),  # the tables choose each stage's count themselves
    # a configuration family of the search (every k-th block recomputed): it decides which blocks a stage's
    # sums recompute and which blocks the work floor may count as not recomputed
    "recompute_every": FieldRole(reads=_as("recompute_every", Reader.WORK, Reader.STAGE_SUMS), fixable=True),
    "regather": FieldRole(reads=_as("regather", Reader.COMPOSE)),
    "offload": FieldRole(reads=_as("offload", Reader.COMPOSE)),
    "offload_device": FieldRole(reads=_as("offload_device", Reader.COMPOSE)),
    "offload_ratio": FieldRole(reads=_as("offload_ratio", Reader.COMPOSE)),
    # a zero-bubble V (zbv, dualpipev) puts the head on the first stage and changes the bubble's floor
    "schedule": FieldRole(reads=_as("pipeline_schedule", Reader.COMPOSE, Reader.LOWER), layout=True, fixable=True),
    "tp_overlap": FieldRole(reads=_as("tp_overlap", *LAYER)),
    "dp_overlap": FieldRole(reads=_as("dp_overlap", Reader.COMPOSE)),  # the step's dp sync, hidden or not
    "split": FieldRole(layout=True),  # the tables choose each stage's blocks themselves
    "stage_pools": FieldRole(layout=True),  # the tables choose each stage's pool themselves
    # a configuration's tables take each stage's placement from its variants (search.space.placement_variants);
    # a stage's cost reads its own (Strategy.for_stage)
    "stage_offload": FieldRole(reads=_as("stage_offload", Reader.COMPOSE)),
    "stage_offload_device": FieldRole(reads=_as("stage_offload_device", Reader.COMPOSE)),
    "stage_offload_ratio": FieldRole(reads=_as("stage_offload_ratio", Reader.COMPOSE)),
    "stage_regather": FieldRole(reads=_as("stage_regather", Reader.COMPOSE)),
}


def reads(*readers: Reader) -> tuple[str, ...]:
    """The names (fields or properties) `readers` read, with what the readers they call read, each once, in
    declaration order: the cache key of their result (planner.strategy.strategy_key)."""
    wanted = set(_closure(readers))
    return tuple(dict.fromkeys(name for role in FIELD_ROLES.values()
                               for reader, name in role.reads.items() if reader in wanted))


def _closure(readers: tuple[Reader, ...]) -> list[Reader]:
    out: list[Reader] = []
    stack = list(readers)
    while stack:
        reader = stack.pop()
        if reader not in out:
            out.append(reader)
            stack.extend(CALLS.get(reader, ()))
    return out


def fields_with(flag: str) -> tuple[str, ...]:
    """The fields whose role sets `flag` (layout, fixable), in declaration order."""
    return tuple(name for name, role in FIELD_ROLES.items() if getattr(role, flag))
