"""Simulated vs analytic step time over a grid of plans (issue 6's agreement figures).

    python tests/bench/simulate_agreement.py             # every plan
    python tests/bench/simulate_agreement.py --only 70b  # plans whose model or cluster contains "70b"

One row per (model, cluster, strategy): micro-batches, simulated tasks, the
simulated and analytic step times, their difference, the term that differs
most and the simulation's wall time; then the median and worst |difference|
of the homogeneous plans (one device type, even split) and of the
heterogeneous ones (mixed pools or uneven splits).  The simulator prices every
task with the analytic model's own functions (planner/simulate/tasks.py), so
a difference is a difference of schedule and overlap.

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
from planner.strategy import parse_strategy  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Only plans whose model or cluster contains this text.")
    args = parser.parse_args()
    header = (f"{'model':12s} {'cluster':16s} {'strategy':62s} {'m':>4s} {'tasks':>6s} {'sim s':>9s} "
              f"{'analytic s':>10s} {'diff %':>7s}  {'largest term (ms)':24s} {'wall s':>6s}")
    print(header)
    print("-" * len(header))
    diffs: dict[bool, list[float]] = {False: [], True: []}
    for model, cluster, batch, seq, spec, hetero in PLANS:
        if args.only and args.only not in model and args.only not in cluster:
            continue
        job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq)
        start = time.perf_counter()
        result = summarize(simulate(job, parse_strategy(spec)))
        wall = time.perf_counter() - start
        term = max(result.terms, key=lambda t: abs(t.difference_s))
        diffs[hetero].append(result.difference)
        name = Path(cluster).stem if cluster.endswith(".yaml") else cluster
        print(f"{model:12s} {name:16s} {spec:62s} {result.micro_batches:4d} {result.tasks:6d} "
              f"{result.simulated_step_s:9.4f} {result.analytic_step_s:10.4f} {100 * result.difference:+7.2f}  "
              f"{term.term + f' {term.difference_s * 1e3:+.2f}':24s} {wall:6.2f}")
    print()
    for hetero, label in ((False, "homogeneous"), (True, "heterogeneous / uneven")):
        values = [abs(d) for d in diffs[hetero]]
        if values:
            print(f"{label:24s} plans {len(values):2d}  median |diff| {100 * statistics.median(values):.2f}%  "
                  f"worst |diff| {100 * max(values):.2f}%")


if __name__ == "__main__":
    main()
