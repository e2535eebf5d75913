"""What the published runs validate: writes hardware/data/validated.yaml (planner.cost.confidence reads it).

A tier-A row of tests/data/published_runs.csv validates its regime (its runtime,
device and precision, and its degrees and scale as upper limits) when the cost model
predicts its tokens/s per GPU within TOLERANCE.  Rows outside the tolerance validate
nothing: their regime is what the confidence flag warns about.

    python tests/bench/coverage.py          # print the coverage and write hardware/data/validated.yaml
    python tests/bench/coverage.py --check  # exit 1 when the file differs from what the bench gives
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_runs as bench  # noqa: E402

TOLERANCE = 0.30  # the per-row bar for tier-A rows
PATH = bench.ROOT / "hardware" / "data" / "validated.yaml"
HEADER = ("# What the published runs validate: written by `python tests/bench/coverage.py` from\n"
          "# tests/data/published_runs.csv (tier-A rows predicted within `tolerance`); do not edit by hand.\n"
          "# planner.cost.confidence marks estimates outside it as extrapolated.\n")


def coverage(results: list[bench.Result]) -> dict:
    """The validated regime of the rows within TOLERANCE."""
    good = [r for r in results if r.error is not None and abs(r.error) <= TOLERANCE]
    out: dict = {"tolerance": TOLERANCE, "rows": sorted(int(r.case.row["id"]) for r in good)}
    for key, of in (("runtimes", lambda r: r.case.runtime),
                    ("devices", lambda r: r.estimate.memory.per_stage[0].device),
                    ("precisions", lambda r: r.case.job.precision)):
        table: dict[str, list[int]] = {}
        for r in good:
            table.setdefault(of(r), []).append(int(r.case.row["id"]))
        out[key] = {name: sorted(ids) for name, ids in sorted(table.items())}
    strategies = [(r, r.case.strategy.with_dp(r.case.job.cluster.num_gpus)) for r in good]
    out["max_gpus"] = max(r.estimate.num_gpus for r in good)
    out["max_cp"] = max(s.cp for _, s in strategies)
    out["min_cp_tokens"] = min((r.case.job.seq_len // s.cp for r, s in strategies if s.cp > 1), default=0)
    out["max_ep"] = max(s.ep for _, s in strategies)
    out["moe"] = any(r.case.job.model.num_experts for r in good)
    out["moe_routings"] = sorted({r.case.job.moe_routing for r in good if r.case.job.model.num_experts})
    out["max_zero3_group"] = max((s.dp * s.cp for _, s in strategies if s.zero == 3), default=1)
    return out


def render(data: dict) -> str:
    return HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when validated.yaml is not current")
    args = parser.parse_args()
    text = render(coverage(bench.run("A")))
    if args.check:
        current = PATH.read_text() if PATH.exists() else ""
        print("validated.yaml is current" if current == text else "validated.yaml differs: run coverage.py")
        sys.exit(0 if current == text else 1)
    print(text, end="")
    PATH.write_text(text)


if __name__ == "__main__":
    main()
