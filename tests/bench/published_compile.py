"""The compiler against published strategies: `python tests/bench/published_runs.py --compile`.

Every row's job (same model, cluster, batch, seq_len, precision and runtime profile) is given to
`compile_job`, whose space the runtime narrows to what the framework can express
(CompileOptions(time_limit=60, space=SpaceOptions(tp_overlap=<the published strategy's tp_overlap>))), and
the compiled plan is compared with the cost model's estimate of the published strategy (see the
docstring of published_runs.py).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_runs import ROOT, Case  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.cost import Estimate, evaluate  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.search.compile import compile_job  # noqa: E402
from planner.search.result import CompileOptions, CompileResult  # noqa: E402
from planner.search.space import SpaceOptions  # noqa: E402
from planner.strategy import Strategy  # noqa: E402


COMPARED_KEYS = ("tp", "pp", "dp", "cp", "mbs", "vpp", "zero", "recompute")
_TERMS = ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
          "optimizer_s", "offload_s")


@dataclass(frozen=True)
class CompileRow:
    """A published row's strategy against the plan the compiler picks for the same job."""

    case: Case
    published: Estimate  # evaluate() of the published strategy: the reference
    result: CompileResult | None
    wall_s: float
    error: str | None = None

    @property
    def compiled(self) -> Estimate | None:
        return self.result.estimate if self.result is not None else None

    @property
    def ratio(self) -> float | None:
        """Compiled over published-strategy predicted tokens/s per GPU."""
        if self.compiled is None:
            return None
        return self.compiled.tokens_per_s_per_gpu / self.published.tokens_per_s_per_gpu

    @property
    def changes(self) -> list[tuple[str, str, str]]:
        """(key, published, compiled) for every compared key that differs."""
        if self.result is None:
            return []
        old, new = _compared(self.case.job, self.case.strategy), _compared(self.case.job, self.result.strategy)
        return [(k, old[k], new[k]) for k in COMPARED_KEYS if old[k] != new[k]]

    @property
    def differs(self) -> bool:
        return bool(self.changes)

    def why(self) -> str:
        """Machine-derived reason: the changed keys and the two breakdown terms that moved most."""
        keys = ", ".join(f"{k} {a}->{b}" for k, a, b in self.changes)
        old, new = self.published.breakdown, self.compiled.breakdown
        moved = sorted(_TERMS, key=lambda t: (-abs(getattr(new, t) - getattr(old, t)), t))[:2]
        moved = [t for t in moved if abs(getattr(new, t) - getattr(old, t)) > 1e-6 * self.published.step_time_s]
        terms = ", ".join(f"{t.removesuffix('_s')} {getattr(old, t):.3g}s -> {getattr(new, t):.3g}s"
                          for t in moved) or "breakdown unchanged"
        step = f"step {self.published.step_time_s:.4g}s -> {self.compiled.step_time_s:.4g}s"
        return f"{keys}: {terms} ({step})"


def _recompute_label(job: Job, strategy: Strategy) -> str:
    """none, selective, full (every block) or full:k1/k2/.. blocks per stage (per chunk)."""
    if strategy.recompute != "full" or strategy.recompute_layers is None:
        return strategy.recompute
    chunk = job.model.num_blocks // (strategy.pp * strategy.vpp)
    split = strategy.split or (None,) * strategy.pp
    counts = []
    for stage in range(strategy.pp):
        per_chunk = (split[stage] // strategy.vpp) if split[stage] is not None else chunk
        counts.append(min(strategy.stage_recompute_count(stage), per_chunk))
        if counts[-1] < per_chunk:
            continue
        counts[-1] = -1  # every block of this stage
    if all(c == -1 for c in counts):
        return "full"
    if all(c == 0 for c in counts):
        return "none"
    if len(set(counts)) == 1:
        return f"full:{counts[0]}"
    return "full:" + "/".join("all" if c == -1 else str(c) for c in counts)


def _compared(job: Job, strategy: Strategy) -> dict[str, str]:
    resolved = strategy.with_dp(job.cluster.num_gpus) if strategy.dp is None else strategy
    values = {k: str(getattr(resolved, k)) for k in COMPARED_KEYS if k != "recompute"}
    values["recompute"] = _recompute_label(job, resolved)
    return values


def compile_rows(cases: list[Case], time_limit: float = 60.0, progress=None) -> list[CompileRow]:
    """Compile every case's job; a failing compile is kept as a row with its error."""
    rows = []
    for case in cases:
        published = evaluate(case.job, case.strategy)
        options = CompileOptions(time_limit=time_limit, space=SpaceOptions(tp_overlap=case.strategy.tp_overlap))
        if progress is not None:
            progress(f"compiling row {case.row['id']} ({case.row['model'][:40]}) ...")
        start = time.perf_counter()
        try:
            result, error = compile_job(case.job, options), None
        except Exception as err:  # a bench row, not a crash
            result, error = None, f"{type(err).__name__}: {err}".splitlines()[0]
        rows.append(CompileRow(case, published, result, time.perf_counter() - start, error))
    return rows


def print_compile_table(rows: list[CompileRow], out=sys.stdout) -> None:
    header = (f"{'id':>3} {'model':<44} {'published*':>10} {'compiled':>9} {'ratio':>6} fits {'status':<8} "
              f"{'gap':>6} {'wall s':>6} differs")
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        head = f"{r.case.row['id']:>3} {r.case.row['model'][:44]:<44} {r.published.tokens_per_s_per_gpu:>10.1f}"
        if r.result is None:
            print(f"{head} {'-':>9} {'-':>6} {'-':<4} ERROR {r.error}", file=out)
            continue
        cert = r.result.certificate
        differs = ("yes: " + " ".join(k for k, _, _ in r.changes)) if r.differs else "no"
        print(f"{head} {r.compiled.tokens_per_s_per_gpu:>9.1f} {r.ratio:>6.3f} "
              f"{'yes ' if r.compiled.memory.fits else 'NO  '} {cert.status:<8} {cert.gap:>6.2%} {r.wall_s:>6.1f} "
              f"{differs}", file=out)
    print("\n* published = the cost model's estimate of the published strategy (the reference), "
          "not the published throughput", file=out)
    different = [r for r in rows if r.result is not None and r.differs]
    if different:
        print("\nwhere the compiled strategy differs (published -> compiled):", file=out)
        for r in different:
            print(f"{r.case.row['id']:>3} {r.why()}", file=out)
    ratios = [r.ratio for r in rows if r.ratio is not None]
    every = bool(rows) and len(ratios) == len(rows) and all(x >= 1 - 1e-9 for x in ratios)
    worst = min(ratios) if ratios else float("nan")
    print(f"\ncompiled >= published on every row: {'yes' if every else 'no'}  (min ratio {worst:.3f}, "
          f"total solve {sum(r.wall_s for r in rows):.0f} s)", file=out)
