"""Published recipes beside the compiler (docs/benchmarks.md, "Published recipes").

For every recipe of hardware/data/recipes/: its predicted tokens/s per GPU on the job it was written for (its
hardware, batch, sequence and precision) under its runtime, and the compiler's plan on the same job under the same
runtime with its predicted gain (the recipe's step time over the plan's; a recipe that does not fit the cost
model's memory is marked, its gain is against its step all the same).  Both numbers come from the one cost model.

    python tests/bench/recipes.py [--time-limit SEC]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.errors import InfeasibleError  # noqa: E402
from planner.recipes import load_recipes, on_own_hardware  # noqa: E402
from planner.search.compile import compile_job  # noqa: E402
from planner.search.result import CompileOptions  # noqa: E402
from planner.strategy import short_spec  # noqa: E402


def compact(spec: str) -> str:
    """A SPEC with its split's runs written n x k (split=1/2/2/2/1 -> split=1/2x3/1), for a table cell."""
    out = []
    for item in spec.split(","):
        key, _, value = item.partition("=")
        if key == "split":
            runs: list[list[str]] = []
            for part in value.split("/"):
                if runs and runs[-1][0] == part:
                    runs[-1].append(part)
                else:
                    runs.append([part])
            value = "/".join(r[0] if len(r) == 1 else f"{r[0]}x{len(r)}" for r in runs)
        out.append(f"{key}={value}")
    return ",".join(out)


def rows(time_limit: float) -> list[list[str]]:
    out = []
    for recipe in load_recipes():
        run = on_own_hardware(recipe)
        hw = f"{recipe.hardware.gpus}x {recipe.hardware.cluster.split(':')[0]}"
        head = [f"`{recipe.name}`", f"{recipe.source.repository}@{recipe.source.revision}", recipe.runtime, hw,
                f"{recipe.global_batch}x{recipe.seq_len} {recipe.precision}"]
        if run.estimate is None:
            out.append(head + ["-", f"not costed: {run.why}", "-"])
            continue
        theirs = run.estimate
        mark = "" if theirs.memory.fits else " (over HBM)"
        try:
            plan = compile_job(run.job, CompileOptions(time_limit=time_limit, runners_up=0))
        except InfeasibleError as err:
            out.append(head + [f"{theirs.tokens_per_s_per_gpu:,.0f}{mark}", f"none fits: {str(err).splitlines()[0]}",
                               "-"])
            continue
        mine = plan.estimate
        spec = compact(short_spec(mine.strategy_spec)) if mine is not None else "replica groups"
        step = mine.step_time_s if mine is not None else plan.replica_groups.step_time_s
        out.append(head + [f"{theirs.tokens_per_s_per_gpu:,.0f}{mark}", f"`{spec}`",
                           f"{theirs.step_time_s / step:.2f}x"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0, help="compile budget per recipe (s)")
    args = parser.parse_args()
    heads = ["recipe", "source", "runtime", "GPUs", "batch", "recipe tok/s/GPU", "planner's plan (same job, runtime)",
             "gain"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join(["---"] * 5 + ["---:", "---", "---:"]) + "|")
    for row in rows(args.time_limit):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
