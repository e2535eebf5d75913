"""Expert placement under imbalanced routing: busiest-rank ratios and predicted step times (predictions, no
measurement) of Megatron's contiguous order, DeepSeek's EPLB (re-implemented) and planner's program.

    python tests/bench/routing.py            # both tables
    python tests/bench/routing.py --ratios   # the ratio grid only (seconds)

Table 1, the ratio grid: Zipf(s) skews over E experts (top_k routing; s kept where the busiest share stays
below 1/top_k), one redundant slot per expert-parallel rank, for several ep; the mean over layers is the
single synthetic layer's ratio.

Table 2, the example traces (examples/routing/): each trace's model on its Done-when cluster under one fixed
strategy (TRACES: the compiler's plan for that job without routing statistics on 4 Dec 2026), costed by
`evaluate` with each placement: step time, peak HBM per GPU, and the busiest-rank ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from models import load_model  # noqa: E402
from planner.api import load_job  # noqa: E402
from planner.cost import evaluate  # noqa: E402
from planner.routing.placement import placement_summary  # noqa: E402
from planner.routing.stats import RoutingStats  # noqa: E402
from planner.strategy import parse_strategy  # noqa: E402
from planner.validation import check_strategy  # noqa: E402

# (experts, top_k) of Mixtral-8x7B, a 64-expert layer (Qwen1.5-MoE-A2.7B's 60 rounded to divide ep) and
# DeepSeek-V3
EXPERTS = [(8, 2), (64, 4), (256, 8)]
SKEWS = [0.5, 0.8, 1.0, 1.2]
EPS = [4, 8, 32]
# the Done-when jobs and a fixed strategy each (the compiler's plan without routing statistics on 4 Dec 2026), so
# that every placement is costed on the same strategy
TRACES = [
    ("mixtral-8x7b", "dgx-h100:4", 256, 4096, "tp=2,pp=2,dp=8,ep=8,mbs=1,vpp=2,sp=on,zero=1,schedule=interleaved",
     ["zipf-mixtral.yaml", "mixtral-8x7b-layers.json"]),
    ("deepseek-v3", "dgx-h100:32", 1024, 4096,
     "tp=4,pp=16,dp=4,ep=16,etp=1,mbs=1,sp=on,zero=1,recompute=full,recompute_layers=2,"
     "split=2/4/4/4/4/4/4/4/4/4/4/4/4/4/4/3",
     ["zipf-deepseek-v3.yaml", "deepseek-v3-layers.json"]),
]


def ratio_rows() -> list[list[str]]:
    rows = []
    for experts, top_k in EXPERTS:
        for s in SKEWS:
            stats = RoutingStats(source="bench", synthetic={"exponent": s})
            if max(stats.layer_shares(experts)[0]) > 1 / top_k:
                continue
            for ep in EPS:
                if ep > experts or experts % ep:
                    continue
                stats = RoutingStats(source="bench", redundant_slots=ep, synthetic={"exponent": s})
                start = time.perf_counter()
                p = placement_summary(stats, experts, ep, max(1, ep // 8))
                rows.append([str(experts), str(top_k), f"{s:g}", str(ep), str(p.slots_per_rank),
                             f"{p.contiguous_max_load_ratio:.3f}", f"{p.eplb_max_load_ratio:.3f} ({p.eplb_policy})",
                             f"{p.max_load_ratio:.3f}", f"{time.perf_counter() - start:.2f}"])
    return rows


def trace_rows() -> list[list[str]]:
    rows = []
    for model, cluster, batch, seq_len, spec, traces in TRACES:
        for name in traces:
            job = load_job(model, cluster, batch=batch, seq_len=seq_len, routing=ROOT / "examples" / "routing" / name)
            s = check_strategy(job, parse_strategy(spec))
            placed = job.expert_placement(s.ep)
            ratios = {"planner": placed.max_load_ratio, "eplb": placed.eplb_max_load_ratio,
                      "contiguous": placed.contiguous_max_load_ratio}
            for policy in ("contiguous", "eplb", "planner"):
                est = evaluate(job.model_copy(update={"expert_placement_policy": policy}), s)
                rows.append([model, name, f"ep={s.ep}", policy, f"{ratios[policy]:.3f}", f"{est.step_time_s:.3f}",
                             f"{est.memory.peak_bytes / 1e9:.1f}", "yes" if est.memory.fits else "no"])
    return rows


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", action="store_true", help="Only the ratio grid.")
    args = parser.parse_args(argv)
    load_model("mixtral-8x7b")  # warm the zoo before timing placements
    print(table(["experts", "top_k", "Zipf s", "ep", "slots/rank", "contiguous", "EPLB", "planner", "solve s"],
                ratio_rows()))
    if not args.ratios:
        print()
        print(table(["model", "trace", "ep", "placement", "busiest/mean", "step s (predicted)",
                     "peak HBM GB", "fits"], trace_rows()))


if __name__ == "__main__":
    main()
