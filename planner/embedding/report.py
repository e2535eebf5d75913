"""report.md and the terminal summary of a recommendation model's plan."""

from __future__ import annotations

from collections import Counter

from planner.embedding.plan_doc import EmbeddingPlan
from planner.embedding.sharding_plan import cache_fraction
from planner.plan.report import md_table
from planner.plan.plots import RANKS_PNG

GB = 1e9
_TERMS = [("lookup_s", "embedding lookups (slowest rank)"), ("all_to_all_s", "all-to-all (slowest side)"),
          ("dense_compute_s", "dense compute"), ("dense_sync_s", "dense gradient all-reduce"),
          ("table_sync_s", "data-parallel table all-reduce"), ("optimizer_s", "dense optimizer")]


def _kind(entry) -> str:
    kind = entry.sharding_type.value
    if kind == "column_wise":
        kind += f"/{len(entry.ranks)}"
    return kind


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 4 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _cache(entry) -> float | None:
    """The HBM share of a table kept in host DRAM (0 without a cache), None when it is all in HBM."""
    share = cache_fraction(entry)
    return None if share >= 1.0 else share


def summary(plan: EmbeddingPlan, wall_s: float) -> str:
    """A few lines for the terminal: throughput, breakdown, the mix of choices, the certificate."""
    e, s, job = plan.estimate, plan.solver, plan.job
    mix = Counter((_kind(t), _cache(t)) for t in plan.sharding.tables.values())
    mix_text = ", ".join(f"{n} {kind}" + (f" cache {cache:g}" if cache is not None else "")
                         for (kind, cache), n in sorted(mix.items(), key=lambda kv: (-kv[1], kv[0][0])))
    lines = [
        f"{job.model} on {job.cluster_description}",
        f"batch {job.global_batch} samples, {len(plan.sharding.tables)} tables, strategy {plan.strategy}",
        "",
        f"throughput   {e.samples_per_s:,.0f} samples/s ({e.samples_per_s_per_gpu:,.0f} per GPU, {job.num_gpus} GPUs)",
        f"step time    {e.step_time_s * 1e3:.3f} ms: " + ", ".join(
            f"{label.split(' (')[0]} {getattr(e.breakdown, key) * 1e3:.2f}" for key, label in _TERMS[:3]),
        f"memory       peak HBM {e.peak_hbm_bytes / GB:.1f} GB per GPU, peak host {e.peak_host_bytes / GB:.1f} GB "
        f"per node",
        f"tables       {mix_text}",
        f"solver       {s.status} ({s.form}): objective {s.objective * 1e3:.4f} ms, bound {s.bound * 1e3:.4f} ms, "
        f"gap {100 * s.gap:.2f}%, in {wall_s:.2f} s",
    ]
    if plan.baseline is not None and plan.strategy == "planner":
        ratio = plan.baseline.step_time_s / e.step_time_s
        lines.append(f"baseline     greedy-torchrec-style {plan.baseline.step_time_s * 1e3:.3f} ms "
                     f"({ratio:.2f}x slower)")
    return "\n".join(lines)


def render_embedding_report(plan: EmbeddingPlan, plots: bool = False) -> str:
    """report.md: the plan for a person; `plots`: link ranks.png (planner.plan.plots), written beside it."""
    e, job = plan.estimate, plan.job
    lines = [f"# {job.model} on {job.cluster}", "", summary(plan, 0.0).split("\n")[1], ""]
    rows = [[label, f"{getattr(e.breakdown, key) * 1e3:.3f}", f"{100 * getattr(e.breakdown, key) / e.step_time_s:.1f}%"]
            for key, label in _TERMS]
    lines += ["## Time per step (ms)", "", md_table(["term", "ms", "of step"], rows, right=(1, 2)), ""]
    if plan.baseline is not None:
        lines += [f"Planner's greedy TorchRec-style plan (not TorchRec's planner) on the same cost model: "
                  f"{plan.baseline.step_time_s * 1e3:.3f} ms per step "
                  f"({plan.baseline.step_time_s / e.step_time_s:.2f}x this plan).", ""]
    table_rows = [[name, f"{t.rows:,}", str(t.dim), _kind(t), "HBM" if _cache(t) is None else
                   f"{_cache(t):g}", f"{t.expected_hit_rate:.3f}", _ranks(t.ranks)]
                  for name, t in plan.sharding.tables.items()]
    lines += ["## Tables", "", md_table(["table", "rows", "dim", "sharding", "HBM cache", "hit rate", "ranks"],
                                         table_rows, right=(1, 2, 5)), ""]
    busiest = sorted(e.ranks, key=lambda r: (-(r.lookup_s + r.send_s), r.rank))[:8]
    rank_rows = [[str(r.rank), str(r.node), str(r.tables), f"{r.lookup_s * 1e3:.3f}", f"{r.send_s * 1e3:.3f}",
                  f"{r.receive_s * 1e3:.3f}", f"{r.hbm_bytes / GB:.1f} / {r.hbm_capacity / GB:.0f}"] for r in busiest]
    lines += ["## Busiest ranks", "", md_table(["rank", "node", "units", "lookup ms", "send ms", "receive ms",
                                                 "HBM GB / capacity"], rank_rows, right=(0, 1, 2, 3, 4, 5)), ""]
    if plots:
        lines += [f"![memory and work per rank]({RANKS_PNG})", ""]
    host = max(e.nodes, key=lambda n: (n.host_bytes, -n.node))
    lines += [f"Host DRAM: node {host.node} holds the most cached-table bytes, {host.host_bytes / GB:.1f} GB of "
              f"{host.host_capacity / GB:.0f} GB usable.", ""]
    s = plan.solver
    lines += ["## Certificate", "", f"{s.status} ({s.form} program): objective {s.objective * 1e3:.4f} ms, bound "
              f"{s.bound * 1e3:.4f} ms, gap {100 * s.gap:.2f}%, over {s.options} table options.", ""]
    return "\n".join(lines)


def estimate_summary(estimate, title: str) -> str:
    """`estimate` of an embedding sharding: throughput, breakdown, memory per tier, what does not fit."""
    e = estimate
    lines = [title, "",
             f"throughput   {e.samples_per_s:,.0f} samples/s ({e.samples_per_s_per_gpu:,.0f} per GPU)",
             f"step time    {e.step_time_s * 1e3:.3f} ms", ""]
    rows = [[label, f"{getattr(e.breakdown, key) * 1e3:.3f}"] for key, label in _TERMS]
    lines += [md_table(["term", "ms"], rows, right=(1,)), "",
              f"memory       peak HBM {e.peak_hbm_bytes / GB:.1f} GB per GPU, "
              f"peak host {e.peak_host_bytes / GB:.1f} GB per node", f"fits: {'yes' if e.fits else 'no'}"]
    lines += [f"  - {problem}" for problem in e.problems[:8]]
    if len(e.problems) > 8:
        lines.append(f"  - ... and {len(e.problems) - 8} more")
    return "\n".join(lines)
