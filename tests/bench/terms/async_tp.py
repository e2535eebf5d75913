"""Asynchronous tensor parallelism against torchtitan's own vanilla-versus-async benchmark.

    python tests/bench/terms/async_tp.py [--quick]
    python tests/bench/terms/async_tp.py --implied   # the share of the TP communication AsyncTP hides that the
                                                     # pairs imply (torchtitan.yaml overlap.tp_hidden holds it)

Measurements (tests/data/terms/async_tp.csv): torchtitan's benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md,
Llama 3.1 8B and 70B at TP 8 within a Grand Teton host (FSDP over the hosts), bf16 and float8 tensorwise, each run
with vanilla TP and with AsyncTP and nothing else changed.  The measured quantity is the pair's speed-up, async over
vanilla tokens/s: the runs' other terms cancel in it, so it isolates what AsyncTP hides.  The runs' layouts are rows
of a runs file (column `runs`), built as tests/bench/published_runs.py builds every row.

Model: the same two strategies under the runtime the rows run (torchtitan), `evaluate`'s step times; the speed-up is
vanilla over async step time.  `tp_overlap` scales the exposed TP seconds by 1 - hidden (planner.cost.comm), so the
async step time is linear in `hidden`: --implied solves each pair for the `hidden` whose modelled speed-up is the
measured one, and prints the median.
"""

from __future__ import annotations

import csv
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, run_table  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "bench"))
import published_runs as bench  # noqa: E402

from planner.cost import evaluate  # noqa: E402
from planner.job import Job  # noqa: E402


@dataclass(frozen=True)
class Pair:
    """A pair's two published runs as the bench builds them."""

    vanilla: bench.Case
    asynchronous: bench.Case


def pair(row: dict[str, str]) -> Pair:
    """The vanilla and the async run of `row`, from its runs file."""
    with (ROOT / "tests" / "data" / row["runs"]).open(newline="") as handle:
        runs = {r["id"]: r for r in csv.DictReader(handle)}
    vanilla, asynchronous = (bench.build_case(runs[row[c]]) for c in ("vanilla_id", "async_id"))
    assert not vanilla.strategy.tp_overlap and asynchronous.strategy.tp_overlap
    return Pair(vanilla, asynchronous)


def with_hidden(job: Job, hidden: float | None) -> Job:
    """`job` whose runtime hides `hidden` of the TP communication under tp_overlap (None: as the profile says)."""
    if hidden is None:
        return job
    overlap = job.runtime.overlap.model_copy(update={"tp_hidden": hidden})
    return job.model_copy(update={"runtime": job.runtime.model_copy(update={"overlap": overlap})})


def step_seconds(case: bench.Case, hidden: float | None = None) -> float:
    return evaluate(with_hidden(case.job, hidden), case.strategy).step_time_s


def measured_speedup(row: dict[str, str]) -> float:
    return float(row["async_tps"]) / float(row["vanilla_tps"])


def compare(row: dict[str, str]) -> Compared:
    p = pair(row)
    modelled = step_seconds(p.vanilla) / step_seconds(p.asynchronous)
    measured = measured_speedup(row)
    config = f"{row['model']} {row['precision']} tp={row['tp']} rows {row['vanilla_id']}/{row['async_id']}"
    # the ratio is in time, as every term's: the async step over the vanilla one, modelled over measured
    return Compared(config=config, measured=f"x{measured:.3f}", modelled=f"x{modelled:.3f}",
                    ratio=measured / modelled, source=row["source_id"])


def implied_hidden(row: dict[str, str]) -> float:
    """The hidden share whose modelled speed-up is the pair's measured one (the async step is linear in it)."""
    p = pair(row)
    vanilla = step_seconds(p.vanilla)
    none, every = step_seconds(p.asynchronous, 0.0), step_seconds(p.asynchronous, 1.0)
    return (none - vanilla / measured_speedup(row)) / (none - every)


def implied(rows: list[dict[str, str]]) -> float:
    """The median hidden share over the pairs, to two digits."""
    return round(statistics.median(implied_hidden(row) for row in rows), 2)


def print_implied(rows: list[dict[str, str]]) -> None:
    """Each pair's hidden share and their median (--implied)."""
    for row in rows:
        print(f"{row['model']} {row['precision']}: hidden {implied_hidden(row):.3f}")
    print("median", implied(rows))


def main(argv: list[str] | None = None) -> list[Compared]:
    return run_table(
        "async_tp", __doc__, argv, compare,
        "AsyncTP: measured vs modelled speed-up over vanilla TP (planner.cost.comm tp_overlap)",
        by="model",
        key=lambda r: " ".join(r.config.split()[:3]),
        implied=print_implied)


if __name__ == "__main__":
    main()
