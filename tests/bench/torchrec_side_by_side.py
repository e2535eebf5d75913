"""TorchRec's own sharding planner and planner's, side by side, each plan scored in both cost models.

    python tests/bench/torchrec_side_by_side.py                  # every scenario
    python tests/bench/torchrec_side_by_side.py --only criteo    # scenarios whose name contains "criteo"
    python tests/bench/torchrec_side_by_side.py --torchrec-timeout 120

Scenarios (issue #17), 8,192 samples per rank:

* dlrm-criteo-terabyte (26 tables, dim 128, MLPerf DLRM-DCNv2 multi-hot pooling) on one and on eight DGX A100
  40 GB nodes (8 and 64 ranks);
* dlrm-meta-2021-synthetic (856 tables) on sixteen DGX A100 80 GB nodes (128 ranks).

TorchRec plans in a child process (its timeout is checked between proposals only; the child is stopped
`GRACE_S` after it), planner's compile and greedy in this one.

Planners: `torchrec` is TorchRec 1.8's EmbeddingShardingPlanner with its defaults on a Topology of the cluster's
figures (planner/compare/torchrec_baseline.py); `planner` is planner's compile; `greedy-torchrec-style` is
planner's own greedy in TorchRec's style (the stand-in the README compared against before).  Columns: the wall
seconds each planner spent planning (imports excluded; TorchRec's is its `plan()` call), the plan's step in
planner's cost model (`planner-model`, the whole step: embedding and dense part) and in TorchRec's estimators
(`torchrec-model`, the slowest rank's embedding seconds: its NoopPerfModel rating), and for each model the ratio
TorchRec's plan / this plan (above 1: this plan is faster in that model).  `fits`: in planner's memory model /
in TorchRec's storage model after its reservation.  Timings are single runs on a shared machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.compare.torchrec_baseline import plan_with_torchrec, score_with_torchrec, why_not  # noqa: E402
from planner.embedding.compile import GREEDY_NAME, compile_embedding, placements_of  # noqa: E402
from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from planner.job import Job  # noqa: E402

PER_RANK = 8192  # samples per rank per step
TORCHREC_TIMEOUT_S = 600.0  # TorchRec's own timeout: it then returns its best plan so far, if it has one
# TorchRec checks its timeout between proposals only (on 856 tables one proposal can take minutes), so its
# planner runs in a child process that is stopped this long after the timeout
GRACE_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    cluster: str


SCENARIOS = (
    Scenario("criteo-tb/8", "dlrm-criteo-terabyte", "dgx-a100-40g:1"),
    Scenario("criteo-tb/64", "dlrm-criteo-terabyte", "dgx-a100-40g:8"),
    Scenario("meta-856/128", "dlrm-meta-2021-synthetic", "dgx-a100-80g:16"),
)


@dataclass
class Row:
    scenario: str
    ranks: int
    planner: str
    planning_s: float
    planner_model_s: float | None  # step in planner's cost model
    torchrec_model_s: float | None  # embedding seconds in TorchRec's estimators
    fits: str  # "planner-model / torchrec-model"
    plan: str  # sharding mix, or why there is none


def _mix(placements: list[TablePlacement]) -> str:
    names = {"table_wise": "tw", "column_wise": "cw", "row_wise": "rw", "table_row_wise": "twrw",
             "data_parallel": "dp"}
    counts = Counter(names[p.option.kind.value] + (f"/{p.option.shards}" if p.option.shards > 1 else "")
                     + ("" if p.option.cache >= 1.0 else f"@{p.option.cache:g}") for p in placements)
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _scored(s: Scenario, model: EmbeddingCostModel, who: str, planning_s: float,
            placements: list[TablePlacement], note: str = "") -> Row:
    ours = model.evaluate(placements)
    theirs = score_with_torchrec(model, placements)
    fits = f"{'yes' if ours.fits else 'no'} / {'yes' if theirs.fits else 'no'}"
    return Row(s.name, model.sites.world, who, planning_s, ours.step_time_s, theirs.step_s, fits,
               _mix(placements) + note)


def _job(s: Scenario) -> Job:
    cluster = load_cluster(s.cluster)
    return Job(model=load_model(s.model), cluster=cluster, global_batch=PER_RANK * cluster.num_gpus, seq_len=1)


def _torchrec_child(s: Scenario, timeout_s: float, out: multiprocessing.Queue) -> None:
    try:
        plan = plan_with_torchrec(EmbeddingCostModel(_job(s)), timeout_s)
        out.put((plan.placements, plan.planning_s, plan.timed_out, ""))
    except InfeasibleError as err:
        out.put((None, 0.0, False, str(err)))


def _torchrec_plan(s: Scenario, timeout_s: float, isolate: bool) -> tuple[list[TablePlacement] | None, float, bool,
                                                                         str]:
    """TorchRec's plan of a scenario, from a child process when `isolate`: placements (None when there is none),
    planning seconds, whether it stopped at its timeout, and why there is no plan."""
    if not isolate:
        try:
            plan = plan_with_torchrec(EmbeddingCostModel(_job(s)), timeout_s)
        except InfeasibleError as err:
            return None, 0.0, False, str(err)
        return plan.placements, plan.planning_s, plan.timed_out, ""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_torchrec_child, args=(s, timeout_s, out), daemon=True)
    start = time.perf_counter()
    child.start()
    try:
        return out.get(timeout=timeout_s + GRACE_S + 30.0)  # + the child's imports
    except Exception:  # queue.Empty: still planning
        return None, time.perf_counter() - start, True, f"no plan after {time.perf_counter() - start:.0f} s (stopped)"
    finally:
        if child.is_alive():
            child.terminate()
        child.join()


def scenario_rows(s: Scenario, timeout_s: float, time_limit: float = 60.0, isolate: bool = True) -> list[Row]:
    """TorchRec's plan, planner's and the greedy TorchRec-style one of a scenario, each scored in both models
    (`isolate`: TorchRec in a child process that is stopped when it overruns its timeout)."""
    job = _job(s)
    model = EmbeddingCostModel(job)
    world = model.sites.world
    blocked = why_not(model)
    if blocked:
        raise SystemExit(f"{s.name}: {blocked}")
    rows = []
    placements, planning_s, timed_out, why = _torchrec_plan(s, timeout_s, isolate)
    if placements is None:
        rows.append(Row(s.name, world, "torchrec", planning_s, None, None, "-", why))
    else:
        note = f" (stopped at its {timeout_s:g} s timeout)" if timed_out else ""
        rows.append(_scored(s, model, "torchrec", planning_s, placements, note))
    for who in ("planner", GREEDY_NAME):
        try:
            result = compile_embedding(job, strategy=who, time_limit=time_limit)
        except InfeasibleError as err:
            rows.append(Row(s.name, world, who, 0.0, None, None, "-", str(err).splitlines()[0]))
            continue
        cert = result.certificate
        note = f" [{cert.status} gap {100 * cert.gap:.1f}%]" if who == "planner" else ""
        rows.append(_scored(s, model, who, cert.wall_s, placements_of(result), note))
    return rows


def _ratio(base: float | None, value: float | None) -> str:
    return "-" if base is None or value is None else f"{base / value:.2f}"


def render(rows: list[Row]) -> str:
    heads = ["scenario", "ranks", "planner", "plan s", "planner-model ms", "x", "torchrec-model ms", "x", "fits",
             "plan"]
    body = []
    for r in rows:
        base = next(b for b in rows if b.scenario == r.scenario and b.planner == "torchrec")
        body.append([r.scenario, str(r.ranks), r.planner, f"{r.planning_s:.2f}",
                     "-" if r.planner_model_s is None else f"{r.planner_model_s * 1e3:.3f}",
                     _ratio(base.planner_model_s, r.planner_model_s),
                     "-" if r.torchrec_model_s is None else f"{r.torchrec_model_s * 1e3:.3f}",
                     _ratio(base.torchrec_model_s, r.torchrec_model_s), r.fits, r.plan])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(heads)]
    right = {1, 3, 4, 5, 6, 7}

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    out = [line(heads), "  ".join("-" * w for w in widths)] + [line(b) for b in body]
    out.append("x: TorchRec's plan / this plan in that cost model (above 1: this plan is faster). planner-model: "
               "planner's step (embedding + dense); torchrec-model: TorchRec's rating (slowest rank's embedding "
               "seconds). fits: planner's memory model / TorchRec's storage model.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Run the scenarios whose name contains this text.")
    parser.add_argument("--torchrec-timeout", type=float, default=TORCHREC_TIMEOUT_S, metavar="SEC",
                        help="TorchRec's own planning timeout (default %(default)s).")
    args = parser.parse_args(argv)
    rows = []
    for s in SCENARIOS:
        if args.only in s.name:
            rows += scenario_rows(s, args.torchrec_timeout)
            print(f"{s.name}: done", file=sys.stderr, flush=True)
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
