"""Zero-bubble V schedules against interleaved 1F1B: the cost model's bubble and step, and the event simulation's.

    python tests/bench/zero_bubble.py

One row per (job, strategy, schedule): micro-batches per replica, the analytic bubble and step time
(planner.cost.evaluate: (sum u - max u) / v, planner/cost/pipeline.py), the simulated bubble of the
bottleneck stage and step (planner.simulate: torch's own orders of ScheduleZBVZeroBubble / ScheduleDualPipeV,
priced by the same functions), and their difference.  Single runs; the simulation's prices are the
analytic model's, so a difference is one of schedule (docs/cost-model.md, Step time).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hardware import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.simulate import simulate, summarize  # noqa: E402
from planner.strategy import parse_strategy  # noqa: E402

JOBS = [  # (model, cluster, global batch, sequence, strategy without the schedule)
    ("llama3-70b", "dgx-h100:8", 256, 4096, "tp=4,pp=2,vpp=2,zero=1"),
    ("llama3-70b", "dgx-h100:8", 256, 4096, "tp=8,pp=4,vpp=2,zero=1"),
    ("llama3-70b", "dgx-h100:8", 256, 4096, "tp=8,pp=8,vpp=2,zero=1"),
    ("gpt3-175b", "dgx-h100:16", 256, 2048, "tp=8,pp=8,vpp=2,zero=1"),
    ("llama3-8b", "dgx-h100:1", 64, 4096, "tp=2,pp=4,vpp=2,zero=1"),
]
SCHEDULES = ("interleaved", "zbv", "dualpipev")


def main() -> None:
    header = ("model", "strategy", "schedule", "m", "bubble s", "sim bubble s", "step s", "sim step s", "diff")
    rows = []
    for model, cluster, batch, seq, spec in JOBS:
        job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq)
        for schedule in SCHEDULES:
            result = summarize(simulate(job, parse_strategy(f"{spec},schedule={schedule}")))
            bubble = next(t for t in result.terms if t.term == "bubble")
            rows.append((model, spec, schedule, str(result.micro_batches), f"{bubble.analytic_s:.4f}",
                         f"{bubble.simulated_s:.4f}", f"{result.analytic_step_s:.3f}", f"{result.simulated_step_s:.3f}",
                         f"{result.difference * 100:+.2f}%"))
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
