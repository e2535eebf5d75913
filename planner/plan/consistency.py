"""Reading plan.json back: strictly typed, and holding together (its stages are the ones its strategy makes).

`plan_from_text` parses as every reader needs: a repeated key, nesting too deep to parse, a boolean or a
string where a number belongs (`"tp": true`, `"tp": "1"`) are one line naming the field, never a guess.

plan.json carries the strategy and, per stage, the blocks and chunks the runtimes build from.  A hand-edited
file whose stages contradict its strategy (blocks [0, 99] on a 4-block model, three stages under pp=2) would
be run as written by the trainer and costed as the strategy says by simulate and replan; every reader checks
it first (`stage_problem`) and refuses it with one line naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from models import ModelInputError
from models.spec import parse_json
from planner.cost.layout import split_blocks
from planner.errors import PlannerInputError
from planner.plan.build import stage_chunks
from planner.plan.schema import Plan

_TAGS = ("single", "replica_groups")  # the strategy union's tags, which plan.json does not spell


def plan_from_text(text: str, where: str) -> Plan:
    """The plan in `text`, or PlannerInputError naming `where` and the first bad field."""
    try:
        data = parse_json(text, where)  # repeated keys, nesting too deep: one line
    except ModelInputError as err:
        raise PlannerInputError(str(err)) from None
    try:
        plan = Plan.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p not in _TAGS) or "plan"
        raise PlannerInputError(f"{where}: {field}: {first['msg']} (not a planner plan.json, schema 2)") from None
    coerced = _coerced(data, plan.model_dump(mode="json"), "")
    if coerced is not None:
        raise PlannerInputError(f"{where}: {coerced} (not a planner plan.json, schema 2)")
    return plan


def _coerced(given: Any, read: Any, path: str) -> str | None:
    """'field: ...' for the first value pydantic read as a number from a boolean or a string (`"tp": true`
    would be tp=1), walking the file's JSON and the plan read from it side by side; None when there is none."""
    if isinstance(given, dict) and isinstance(read, dict):
        for key, value in given.items():
            if key in read:
                found = _coerced(value, read[key], f"{path}.{key}" if path else str(key))
                if found is not None:
                    return found
        return None
    if isinstance(given, list) and isinstance(read, (list, tuple)):
        for i, (value, back) in enumerate(zip(given, read)):
            found = _coerced(value, back, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    number = isinstance(read, (int, float)) and not isinstance(read, bool)
    if number and isinstance(given, (bool, str)):
        return f"{path or 'plan'}: expected a number, got {type(given).__name__} {given!r}"
    return None


def _expected_blocks(num_blocks: int, pp: int, split: tuple[int, ...] | None) -> list[list[int]]:
    """[first, last] block of each stage (or [] for a stage without blocks), as build_plan writes them."""
    return [[blocks[0], blocks[-1]] if blocks else [] for blocks in split_blocks(num_blocks, pp, split)]


def stage_problem(plan: Plan, num_blocks: int) -> str | None:
    """'field: what is wrong' when the plan's stages are not the ones its strategy makes of a model of
    `num_blocks` transformer blocks; None when they are (replica groups: each group's plan)."""
    if plan.groups:
        for i, group in enumerate(plan.groups):
            problem = stage_problem(group.plan, num_blocks)
            if problem is not None:
                return f"groups[{i}].plan.{problem}"
        return None
    strategy = plan.single_strategy
    if len(plan.stages) != strategy.pp:
        return f"stages: {len(plan.stages)} stages, the strategy has pp={strategy.pp}"
    if strategy.split is not None and sum(strategy.split) != num_blocks:
        return f"strategy.split: {sum(strategy.split)} blocks, the model has {num_blocks}"
    expected = _expected_blocks(num_blocks, strategy.pp, strategy.split)
    for i, (stage, blocks) in enumerate(zip(plan.stages, expected)):
        if stage.index != i:
            return f"stages[{i}].index: {stage.index}, expected {i}"
        if stage.blocks != blocks:
            return (f"stages[{i}].blocks: {stage.blocks}, the strategy puts blocks {blocks} of the model's "
                    f"{num_blocks} there")
        if stage.chunks != stage_chunks(strategy, i, blocks):
            return f"stages[{i}].chunks: {stage.chunks}, expected {stage_chunks(strategy, i, blocks)}"
    return None
