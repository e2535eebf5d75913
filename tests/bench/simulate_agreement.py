"""Simulated vs analytic step time over a grid of plans (issue 6's agreement figures).

    python tests/bench/simulate_agreement.py             # every plan
    python tests/bench/simulate_agreement.py --only 70b  # plans whose model, cluster or runtime contains "70b"

One row per (model, cluster, runtime, strategy): micro-batches, simulated
tasks, the simulated and analytic step times, their difference, the term
that differs most and the simulation's wall time; then the median and worst
|difference| of the homogeneous plans (one device type, even split), of the
heterogeneous ones (mixed pools or uneven splits) and of the published
ZeRO-3 / FSDP runs.  The grid runs under the default runtime profile; the
published runs (tests/data/published_runs.csv, rebuilt by
tests/bench/published_runs.py) under their own, whose sharded weights are
gathered as that framework issues them (collectives per layer, prefetch depth,
host copies).  The simulator prices every task with the analytic model's own
functions (planner/simulate/tasks.py), so a difference is a difference of
schedule and overlap.

Timings are single runs on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.simulate import simulate, summarize  # noqa: E402
from planner.strategy import Strategy, parse_strategy  # noqa: E402
from tests.benches import load_bench  # noqa: E402

HETERO = str(ROOT / "examples" / "clusters" / "hetero-3pool.yaml")

# (model, cluster, batch, seq_len, strategy, heterogeneous)
PLANS = [
    ("llama3-8b", "dgx-h100:1", 16, 8192, "tp=1,zero=3,recompute=selective", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=1,zero=0", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=1,zero=2", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=1,zero=3", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,cp=2,zero=1", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,zero=1", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,vpp=2,zero=1", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,schedule=gpipe,recompute=full", False),
    ("llama3-8b", "dgx-h100:8", 64, 4096, "tp=1,zero=0", False),
    ("llama3-8b", "dgx-h100:8", 64, 4096, "tp=1,zero=3", False),
    ("llama3-70b", "dgx-h100:8", 512, 4096, "tp=8,pp=4,recompute=selective", False),
    ("llama3-70b", "dgx-h100:8", 512, 4096, "tp=8,pp=4,vpp=5,recompute=selective", False),
    ("llama3-70b", "dgx-h100:8", 128, 4096, "tp=8,zero=3,recompute=full", False),
    ("llama3-70b", "dgx-h100:8", 128, 4096, "tp=4,pp=2,zero=1,recompute=full", False),
    ("mixtral-8x7b", "dgx-h100:4", 256, 4096, "tp=2,pp=2,ep=4,zero=1,recompute=selective", False),
    ("gpt3-175b", "dgx-a100-80g:16", 256, 2048, "tp=8,pp=8,recompute=full", False),
    ("tiny-llama", "dgx-h100:1", 64, 512, "tp=2,pp=2,zero=1", False),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,split=2/14/14/2", True),
    ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,split=14/6/6/6,schedule=gpipe", True),
    ("llama3-8b", "dgx-h100:2", 16, 4096, "tp=2,pp=4,vpp=2,split=4/12/4/12", True),
    ("llama3-8b", HETERO, 256, 4096, "tp=8,pp=4,dp=1,stage_pools=h100/a100/a100/h100", True),
    ("llama3-8b", HETERO, 256, 4096, "tp=8,pp=4,dp=2,stage_pools=h100/a100/l4/h100", True),
    ("llama3-70b", HETERO, 256, 4096, "tp=8,pp=4,dp=2,stage_pools=a100/h100/h100/a100,recompute=full", True),
]

# published ZeRO-3 / FSDP runs, each under the runtime that ran it (tests/data/published_runs.csv ids):
# DeepSpeed 0.3.x without prefetch, one collective per weight (217, 218: GPT-3 175B on 384 / 1,536 A100);
# torchtitan FSDP2, one collective per block, one block of prefetch (205: one node; 212: 64 A100;
# 66: with tp 8 on 256 H100); FSDP1 under llm-foundry (68: MPT-70B on 64 H100, 4 micro-batches)
PUBLISHED = ["217", "218", "205", "212", "66", "68"]


def _plans(only: str):
    """(group, model, cluster, job, strategy, spec as printed) of every plan whose names contain `only`."""
    for model, cluster, batch, seq, spec, hetero in PLANS:
        name = Path(cluster).stem if cluster.endswith(".yaml") else cluster
        job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq)
        if only in model or only in name or only in job.runtime.name:
            yield ("heterogeneous / uneven" if hetero else "homogeneous"), model, name, job, parse_strategy(spec), spec
    runs = load_bench("published_runs")
    rows = {row["id"]: row for row in runs.read_rows("all")}
    for key in PUBLISHED:
        case = runs.build_case(rows[key])
        model = f"row {key} {case.job.model.name}"
        if only in model or only in case.job.cluster.name or only in case.runtime:
            cluster = case.job.cluster.name
            yield "published ZeRO-3 / FSDP", model, cluster, case.job, case.strategy, _short(case.strategy)


def _short(strategy: Strategy) -> str:
    """The strategy's spec without the keys at their defaults (dp always), as the grid writes them."""
    default = Strategy().spec().split(",")
    return ",".join(part for part in strategy.spec().split(",") if part not in default or part.startswith("dp="))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Only plans whose model, cluster or runtime contains this text.")
    args = parser.parse_args()
    header = (f"{'model':22s} {'cluster':16s} {'runtime':16s} {'strategy':62s} {'m':>4s} {'tasks':>6s} {'sim s':>9s} "
              f"{'analytic s':>10s} {'diff %':>7s}  {'largest term (ms)':24s} {'wall s':>6s}")
    print(header)
    print("-" * len(header))
    diffs: dict[str, list[float]] = {}
    for group, model, cluster, job, strategy, spec in _plans(args.only):
        start = time.perf_counter()
        result = summarize(simulate(job, strategy))
        wall = time.perf_counter() - start
        term = max(result.terms, key=lambda t: abs(t.difference_s))
        diffs.setdefault(group, []).append(result.difference)
        print(f"{model[:22]:22s} {cluster[:16]:16s} {job.runtime.name:16s} {spec[:62]:62s} {result.micro_batches:4d} "
              f"{result.tasks:6d} {result.simulated_step_s:9.4f} {result.analytic_step_s:10.4f} "
              f"{100 * result.difference:+7.2f}  {term.term + f' {term.difference_s * 1e3:+.2f}':24s} {wall:6.2f}")
    print()
    for group, values in diffs.items():
        values = [abs(d) for d in values]
        print(f"{group:24s} plans {len(values):2d}  median |diff| {100 * statistics.median(values):.2f}%  "
              f"worst |diff| {100 * max(values):.2f}%")

if __name__ == "__main__":
    main()
