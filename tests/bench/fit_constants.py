"""Fit the calibrated cost-model constants to the published runs, and validate them leaving one source out.

    python tests/bench/fit_constants.py                      # fit, LOSO, every table (~100 CPU-seconds)
    python tests/bench/fit_constants.py --write              # ... and put the fit into constants.yaml
    python tests/bench/fit_constants.py --points 5 --refine 3   # a finer first grid (about twice as long)
    python tests/bench/fit_constants.py --refine 1           # coarser and faster
    python tests/bench/fit_constants.py --objective median   # the median |log ratio| instead of the robust mean
    python tests/bench/fit_constants.py --free backward_gemm_ratio,elementwise_traffic_per_saved_byte
    python tests/bench/fit_constants.py --free +network_efficiency   # the default set plus a candidate
    python tests/bench/fit_constants.py --bounds attention_relative_efficiency=0.5:0.73
    python tests/bench/fit_constants.py --sources "pytorch/ao,mosaicml/llm-foundry"   # only these sources' rows

Rows: the tier-A rows of tests/data/published_runs.csv with a published tokens/s per GPU, each rebuilt
once by tests/bench/published_runs.py (`load_cases`) with the constants of hardware/data/constants.yaml.
The case stays fixed while the constants move: the recompute setting the bench picks by memory, and so
the strategy, is never re-chosen (the free constants below change step time, not memory).

Free constants (FREE; each bounded by what its constants.yaml source allows):

* backward_gemm_ratio in [2.0, 2.3]: the backward of a GEMM is two GEMMs of its FLOPs (2), the weight-gradient
  one somewhat slower (up to 15%).  Korthikanti et al. 2022 Table 4 measure the whole 22B layer's backward at
  1.5-1.6x its forward; the end-to-end rows pull the ratio to the top of its bounds (see benchmarks.md).
* backward_elementwise_ratio in [1.0, 2.0]: a fused element-wise backward moves about its forward's traffic
  (1), an unfused one up to twice it (2).
* elementwise_traffic_per_saved_byte in [2.0, 4.0]: the source gives no measured range, only a count of
  kernel passes; the bounds are that count's ends: each saved byte written once and read once (2), up to
  as much again for the un-saved temporaries (4).
* attention_relative_efficiency in [0.625, 0.9125]: Dao 2023 (arXiv 2307.08691 Fig. 4-6) measures
  FlashAttention-2 forward+backward at 50-73% of A100 peak against ~80% for GEMMs; the constant is relative
  to the GEMM efficiency, so 0.50/0.80 to 0.73/0.80.  (Read as absolute, 0.50-0.73: pass
  --bounds attention_relative_efficiency=0.5:0.73.)
* comm_overlap_efficiency in [0.80, 0.90]: the source's 10-20% compute slowdown under concurrent NCCL kernels.

Left fixed, and why (CANDIDATES holds the bounded ones; --free +NAME adds one):

* hbm_efficiency (0.80-0.90): element-wise time is traffic x saved bytes / (HBM bandwidth x hbm_efficiency),
  so it is not identifiable apart from elementwise_traffic_per_saved_byte (the optimizer step, its only
  other use, is at most 4% of a row's step);
* network_efficiency (0.85-0.92), fp8_gemm_speedup_cap (1.3-1.5), context_parallel_attention_efficiency
  (0.7-0.9): ranged, but each moves at most four tier-A rows by more than 1% per 10% change (network:
  rows 22, 24, 26, 48; fp8: 66, 206; context parallel: 54), so a fit would tune them to those rows;
* nvlink_efficiency, tp_overlap_hidden_fraction, pp_p2p_exposed_fraction, eager_elementwise_traffic_factor:
  their sources give one figure, not a range; the memory constants do not move step time (memory errors
  are reported, not fitted: fifteen rows from three sources publish a peak);
* the devices' matmul_efficiency top steps (devices.yaml, per device) are not constants: out of scope.

Objective (--objective): `clipped` (default) minimises the mean over the fitted rows of
min(|log(predicted / published)|, log 1.3): a robust mean in which a row beyond 30% counts as 30%, so a
row far off (the ZeRO-3 rows 217-218 were +44% and +373% before their collectives were counted) cannot
pull; ties broken by the median, then by the distance to the constants.yaml values (in units of each
bound's width).  `median` minimises the median |log ratio|, ties broken by `clipped`.  Both find the same
valley: backward_time_ratio (now backward_gemm_ratio) and elementwise_traffic_per_saved_byte both scale
compute time and differ only in how much more the element-wise share weighs on small models, so the data
fix a mix of the two, not each.  The median is piecewise and rugged along that valley: a compass search
from a 5-point grid alone ended at (2.58, 2.0, 0.80, 0.90), no better on the median than the
constants.yaml point, which is why the search also starts from that point; the clipped mean lands in the
same place from either start ((2.34, 2.69, 0.625, 0.82) from the grid alone, (2.33, 2.75, 0.625, 0.80) with
the constants.yaml start) with LOSO errors as low (median 5.0% vs 4.9%), so it is the default.  (These
figures are from the four-constant fit before the backward was split per kind of work.)  How flat the
optimum is gets printed: the range of each constant over the trial points whose objective on every row is
within 1% of the best.

Search (deterministic): each free constant lives on a lattice of (points - 1) * 2**refine + 1 values over its
bounds.  A full grid of `points` values per constant, and the lattice point nearest the constants.yaml
values, are evaluated first (every row, shared by all fits), then a compass search from the best of them:
try one lattice step of 2**(refine - 1), ..., 1 up and down on every constant, move to the best neighbour
while it improves, halve the step.  Each trial costs every row
once (evaluate, ~2.5 ms a row) and is cached by lattice point, so the fits of the folds share their trials.

Leave one source out (LOSO): rows are grouped by `published_runs.source_key` (the arXiv id or the
owner/repo the `source` column starts with; the grouping is printed).  For each source the free constants
are refitted on every other row and that source's rows are predicted with them: its rows' LOSO errors are
errors on a publication the constants never saw.

--write puts the fit on every row into hardware/data/constants.yaml (each free constant's `value:` line, to
four significant digits; comments and sources stay), so its calibrated values come from this script.

Printed: the grouping; the free constants with bounds, constants.yaml value, fit on every row and the range
over the folds; per row the error with the constants.yaml values, with the fitted values (in-sample) and
LOSO; the summaries and the tables per runtime, device family, parallelism family and source; peak-memory
errors where published; the rows that resist, with their largest breakdown terms; and whether
tests/test_cost.py's accuracy thresholds (in-sample rows ids < 200: median <= 10%, max <= 25%) hold with
the fitted values.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _bench():
    module = sys.modules.get("published_runs")
    if module is None:
        spec = importlib.util.spec_from_file_location("published_runs", HERE / "published_runs.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["published_runs"] = module  # dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    return module


pr = _bench()
from hardware import load_catalog  # noqa: E402  (published_runs put the repository root on sys.path)


@dataclass(frozen=True)
class Bound:
    low: float
    high: float
    why: str


FREE = {
    "backward_gemm_ratio": Bound(2.0, 2.3, "FLOPs give 2 (data + weight gradient); up to 15% slower weight-gradient "
                                 "GEMMs"),
    "backward_elementwise_ratio": Bound(1.0, 2.0, "fused backward ~ the forward's traffic (1); unfused re-reads up to "
                                        "twice it (2)"),
    "comm_overlap_efficiency": Bound(0.80, 0.90, "10-20% compute slowdown under concurrent NCCL kernels"),
}
# ranged constants left fixed by default (see the docstring); --free +NAME adds one
CANDIDATES = {
    **FREE,
    # set by its own measurement (Korthikanti et al. 2022 Table 4's layer forward), no longer by the end-to-end
    # fit; --free +elementwise_traffic_per_saved_byte puts it back for a trial
    "elementwise_traffic_per_saved_byte": Bound(2.0, 4.0, "no measured range: write + read of each saved byte (2) "
                                                "up to the same again for un-saved temporaries (4)"),
    # the fallback of devices no attention benchmark measures (B200, MI300X): hardware/data/attention.yaml holds
    # the measured kernels, which the fit no longer moves (issue #28: each term from its own measurement)
    "attention_relative_efficiency": Bound(0.50 / 0.80, 0.73 / 0.80, "FA2 fwd+bwd 50-73% of A100 peak vs ~80% for "
                                           "GEMMs (Dao 2023): 0.50/0.80-0.73/0.80"),
    "hbm_efficiency": Bound(0.80, 0.90, "STREAM-like copies reach 80-90% of HBM peak"),
    "network_efficiency": Bound(0.85, 0.92, "nccl-tests inter-node all_reduce 85-92% of line rate"),
    "fp8_gemm_speedup_cap": Bound(1.3, 1.5, "torchtitan float8 on H100: 1.3-1.5x GEMM-level gains"),
    "context_parallel_attention_efficiency": Bound(0.7, 0.9, "ring-attention reports span 0.7-0.9"),
}
CLIP = math.log(1.30)  # the `clipped` objective's cap: a row beyond 30% counts as 30%
OBJECTIVES = ("median", "clipped")
TARGET_LOSO_MEDIAN, TARGET_ROW, TARGET_MEMORY = 0.08, 0.30, 0.10  # issue #15 item 3
TEST_MEDIAN, TEST_MAX = 0.10, 0.25  # tests/test_cost.py on the in-sample rows (ids < 200)


# ----------------------------------------------------------------------------- prediction


_WORKER_CASES: list = []


def _predict(cases, values: dict[str, float]) -> list[float]:
    catalog = pr.with_constants(values)
    return [pr.evaluate(c.job, c.strategy, catalog=catalog).tokens_per_s_per_gpu for c in cases]


def _worker_predict(values: dict[str, float]) -> list[float]:
    return _predict(_WORKER_CASES, values)


class Predictor:
    """log(predicted / published) of every case at lattice points of the free constants, cached."""

    def __init__(self, cases, free: dict[str, Bound], points: int = 3, refine: int = 4, jobs: int = 1):
        if points < 2 or refine < 0:
            raise ValueError("points >= 2 and refine >= 0")
        self.cases, self.free, self.points, self.refine = cases, dict(free), points, refine
        self.names = list(self.free)
        self.lattice = (points - 1) * 2**refine  # lattice indices 0..lattice per constant
        self.published = np.array([c.published for c in cases], dtype=float)
        self.cache: dict[tuple, np.ndarray] = {}
        self.evaluations = 0  # rows evaluated (one evaluate call each)
        self.jobs = jobs
        self._pool = None

    # lattice <-> values
    def values(self, point: tuple[int, ...]) -> dict[str, float]:
        return {name: self.free[name].low + (self.free[name].high - self.free[name].low) * k / self.lattice
                for name, k in zip(self.names, point)}

    def unit(self, values: dict[str, float]) -> tuple[float, ...]:
        """Values in units of each bound's width (0 = low, 1 = high)."""
        return tuple((values[n] - self.free[n].low) / (self.free[n].high - self.free[n].low) for n in self.names)

    def grid(self) -> list[tuple[int, ...]]:
        step = 2**self.refine
        return list(itertools.product(range(0, self.lattice + 1, step), repeat=len(self.names)))

    def log_ratios(self, points: list[tuple[int, ...]]) -> list[np.ndarray]:
        """log(predicted / published) per case at each point (computing the uncached ones)."""
        todo = [p for p in dict.fromkeys(points) if p not in self.cache]
        if todo:
            for point, predicted in zip(todo, self._run([self.values(p) for p in todo])):
                self.cache[point] = np.log(np.asarray(predicted) / self.published)
        return [self.cache[p] for p in points]

    def log_ratios_at(self, values: dict[str, float]) -> np.ndarray:
        """log(predicted / published) per case at arbitrary values (not cached)."""
        (predicted,) = self._run([values])
        return np.log(np.asarray(predicted) / self.published)

    def _run(self, value_sets: list[dict[str, float]]) -> list[list[float]]:
        self.evaluations += len(value_sets) * len(self.cases)
        if self.jobs <= 1 or len(value_sets) < 2:
            return [_predict(self.cases, v) for v in value_sets]
        if self._pool is None:
            global _WORKER_CASES
            _WORKER_CASES = self.cases  # inherited by the forked workers
            self._pool = multiprocessing.get_context("fork").Pool(self.jobs)
        return self._pool.map(_worker_predict, value_sets, chunksize=max(1, len(value_sets) // (4 * self.jobs)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None


# ----------------------------------------------------------------------------- objective and search


def objective_key(log_ratios: np.ndarray, objective: str, distance: float) -> tuple[float, float, float]:
    """Lexicographic key of a trial (smaller is better): the objective, its tie-break, the distance to
    constants.yaml.  Rounded so that float noise cannot decide a tie."""
    absolute = np.abs(log_ratios)
    median = float(np.median(absolute))
    clipped = float(np.mean(np.minimum(absolute, CLIP)))
    first, second = (median, clipped) if objective == "median" else (clipped, median)
    return (round(first, 10), round(second, 10), round(distance, 10))


@dataclass
class Fit:
    point: tuple[int, ...]
    values: dict[str, float]
    key: tuple[float, float, float]
    rows: list[int] = field(default_factory=list)  # indices of the cases fitted


def fit(predictor: Predictor, rows: list[int], objective: str = "clipped", current: dict[str, float] | None = None,
        refine: bool = True) -> Fit:
    """Fit the free constants on the cases `rows` (indices): grid, then compass search on the lattice."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: one of {OBJECTIVES}")
    current = current or {n: load_catalog().constant(n) for n in predictor.names}
    origin = predictor.unit(current)
    index = np.asarray(rows, dtype=int)

    def keys(points):
        out = []
        for point, ratios in zip(points, predictor.log_ratios(points)):
            unit = [k / predictor.lattice for k in point]
            distance = math.sqrt(sum((u - o) ** 2 for u, o in zip(unit, origin)))
            out.append(objective_key(ratios[index], objective, distance))
        return out

    # the grid, and the lattice point nearest the constants.yaml values (the data leave a flat valley between
    # backward_gemm_ratio and elementwise_traffic_per_saved_byte: a coarse grid can miss it)
    nearest = tuple(min(predictor.lattice, max(0, round(u * predictor.lattice))) for u in origin)
    starts = list(dict.fromkeys(predictor.grid() + [nearest]))
    best_key, best = min(zip(keys(starts), starts))
    step = 2 ** (predictor.refine - 1) if refine and predictor.refine > 0 else 0
    while step >= 1:
        neighbours = []
        for axis in range(len(best)):
            for sign in (-1, 1):
                k = best[axis] + sign * step
                if 0 <= k <= predictor.lattice:
                    neighbours.append(best[:axis] + (k,) + best[axis + 1:])
        candidate_key, candidate = min(zip(keys(neighbours), neighbours)) if neighbours else (best_key, best)
        if candidate_key < best_key:
            best_key, best = candidate_key, candidate
        else:
            step //= 2
    return Fit(best, predictor.values(best), best_key, list(rows))


@dataclass
class Validation:
    """The fit on every row and the leave-one-source-out fits."""

    cases: list
    sources: list[str]  # per case
    full: Fit
    folds: dict[str, Fit]  # source -> fit without its rows
    in_sample: np.ndarray  # log ratio per case with the full fit's constants
    loso: np.ndarray  # log ratio per case with its fold's constants
    current: np.ndarray  # log ratio per case with constants.yaml's values
    objective: str = "clipped"


def validate(predictor: Predictor, objective: str = "clipped", refine: bool = True, progress=None) -> Validation:
    """Fit on every case, then once per source without its cases; predict each source with its fold's fit."""
    cases = predictor.cases
    sources = [pr.source_key(c.row) for c in cases]
    current_values = {n: load_catalog().constant(n) for n in predictor.names}
    everything = list(range(len(cases)))
    full = fit(predictor, everything, objective, current_values, refine)
    if progress:
        progress(f"fit on all {len(cases)} rows: {_values_text(full.values)}")
    folds, loso = {}, np.full(len(cases), np.nan)
    for source in sorted(set(sources)):
        held = [i for i, s in enumerate(sources) if s == source]
        train = [i for i in everything if sources[i] != source]
        if not train:
            continue
        folds[source] = fit(predictor, train, objective, current_values, refine)
        (ratios,) = predictor.log_ratios([folds[source].point])
        loso[held] = ratios[held]
        if progress:
            progress(f"without {source} ({len(held)} rows): {_values_text(folds[source].values)}")
    (in_sample,) = predictor.log_ratios([full.point])
    return Validation(cases, sources, full, folds, in_sample, loso, predictor.log_ratios_at(current_values),
                      objective)


# ----------------------------------------------------------------------------- reporting


def _values_text(values: dict[str, float]) -> str:
    return ", ".join(f"{n}={v:.4g}" for n, v in values.items())


def _err(log_ratio: float) -> float:
    return math.exp(log_ratio) - 1.0


def _stats(log_ratios) -> tuple[float, float]:
    errors = [abs(_err(x)) for x in log_ratios if not math.isnan(x)]
    return (statistics.median(errors), max(errors)) if errors else (float("nan"), float("nan"))


def print_grouping(v: Validation, out=sys.stdout) -> None:
    print("rows by source (LOSO leaves each out in turn)", file=out)
    for source in sorted(set(v.sources)):
        ids = [c.row["id"] for c, s in zip(v.cases, v.sources) if s == source]
        print(f"  {source:<26} {len(ids):>2}  {','.join(ids)}", file=out)


def print_constants(v: Validation, predictor: Predictor, out=sys.stdout) -> None:
    catalog = load_catalog()
    print("\nfree constants", file=out)
    header = f"{'constant':<36} {'bounds':<15} {'yaml':>7} {'fitted':>7} {'LOSO folds':<15} source of the bounds"
    print(header, file=out)
    print("-" * len(header), file=out)
    for name in predictor.names:
        bound = predictor.free[name]
        fold_values = [f.values[name] for f in v.folds.values()]
        spread = f"{min(fold_values):.4g}-{max(fold_values):.4g}" if fold_values else "-"
        print(f"{name:<36} {f'{bound.low:.4g}-{bound.high:.4g}':<15} {catalog.constant(name):>7.4g} "
              f"{v.full.values[name]:>7.4g} {spread:<15} {bound.why}", file=out)
    resolution = ", ".join(f"{n} {(b.high - b.low) / predictor.lattice:.3g}" for n, b in predictor.free.items())
    print(f"lattice step: {resolution}", file=out)
    best = v.full.key[0]
    near = [predictor.values(point) for point, ratios in predictor.cache.items()
            if objective_key(ratios, v.objective, 0.0)[0] <= best * 1.01]
    spans = {n: (min(q[n] for q in near), max(q[n] for q in near)) for n in predictor.names}
    yaml_key = objective_key(v.current, v.objective, 0.0)[0]
    print(f"objective ({v.objective}) on every row: constants.yaml {yaml_key:.4f}, fitted {best:.4f}; "
          f"the {len(near)} of {len(predictor.cache)} trial points within 1% of the best span:", file=out)
    for name in predictor.names:
        bound, (low, high) = predictor.free[name], spans[name]
        width = (high - low) / (bound.high - bound.low)
        if width > 0.5:
            note = "not pinned by the data"
        elif v.full.values[name] in (bound.low, bound.high):
            note = "pinned at a bound: the data would take it beyond what its source allows"
        else:
            note = ""
        print(f"  {name:<36} {low:.4g}-{high:.4g} ({width:.0%} of its bounds) {note}".rstrip(), file=out)
    print("\nfits per fold (constants fitted without the source's rows; held-out = that source's rows)", file=out)
    short = [n.split("_")[0][:10] for n in predictor.names]
    header = f"{'left out':<26} {'n':>2} " + " ".join(f"{s:>10}" for s in short) + \
        f" {'train obj':>9} {'yaml obj':>8} {'held med':>8} {'held max':>8}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for source, f in v.folds.items():
        held = [i for i, s in enumerate(v.sources) if s == source]
        median, worst = _stats(v.loso[held])
        yaml_key = objective_key(v.current[f.rows], v.objective, 0.0)[0]
        print(f"{source:<26} {len(held):>2} " + " ".join(f"{f.values[n]:>10.4g}" for n in predictor.names) +
              f" {f.key[0]:>9.4f} {yaml_key:>8.4f} {median:>8.1%} {worst:>8.1%}", file=out)
    print(f"{'(none: every row)':<26} {len(v.cases):>2} " +
          " ".join(f"{v.full.values[n]:>10.4g}" for n in predictor.names) +
          f" {v.full.key[0]:>9.4f} {objective_key(v.current, v.objective, 0.0)[0]:>8.4f}", file=out)
    print(f"(train obj: the fold's {v.objective} objective on its training rows; yaml obj: the same with the "
          f"constants.yaml values; held med / max: |error| of the left-out rows)", file=out)


def _strategy_text(case) -> str:
    s = case.strategy
    parts = [f"tp{s.tp}", f"pp{s.pp}", f"dp{s.dp}"] + ([f"cp{s.cp}"] if s.cp > 1 else []) + \
        ([f"v{s.vpp}"] if s.vpp > 1 else []) + [f"mbs{s.mbs}"]
    return " ".join(parts)


def print_rows(v: Validation, out=sys.stdout) -> None:
    print("\nper row: error of predicted vs published tokens/s per GPU", file=out)
    header = (f"{'id':>3} {'model':<34} {'source':<24} {'runtime':<22} {'dev':<6} {'family':<7} {'published':>9} "
              f"{'yaml':>7} {'fitted':>7} {'LOSO':>7}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for i, c in enumerate(v.cases):
        print(f"{c.row['id']:>3} {c.row['model'][:34]:<34} {v.sources[i][:24]:<24} {c.runtime:<22} "
              f"{pr.device_family(c.row):<6} {pr.parallel_family(c.strategy):<7} {c.published:>9.1f} "
              f"{_err(v.current[i]):>+7.1%} {_err(v.in_sample[i]):>+7.1%} {_err(v.loso[i]):>+7.1%}", file=out)


def print_summary(v: Validation, out=sys.stdout) -> None:
    print("\nsummary: median / max |error| (n rows)", file=out)
    header = f"{'rows':<24} {'n':>3} {'yaml':>15} {'fitted':>15} {'LOSO':>15} {'> 30% LOSO':>10}"
    print(header, file=out)
    print("-" * len(header), file=out)
    sets = (("all tier A", lambda c: True), ("ids < 200 (in-sample)", lambda c: not c.new),
            ("ids > 200", lambda c: c.new))
    for label, keep in sets:
        idx = [i for i, c in enumerate(v.cases) if keep(c)]
        if not idx:
            continue
        cells = [f"{m:.1%} / {w:.1%}" for m, w in (_stats(a[idx]) for a in (v.current, v.in_sample, v.loso))]
        beyond = sum(abs(_err(v.loso[i])) > TARGET_ROW for i in idx)
        print(f"{label:<24} {len(idx):>3} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} {beyond:>10}", file=out)


def print_groups(v: Validation, by: str, out=sys.stdout) -> None:
    key = pr.GROUPINGS[by]
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(v.cases):
        groups.setdefault(key(c), []).append(i)
    print(f"\nby {by}: median / max |error|", file=out)
    header = f"{by:<26} {'n':>3} {'yaml':>15} {'fitted':>15} {'LOSO':>15}"
    print(header, file=out)
    print("-" * len(header), file=out)
    order = [f for f in pr.PARALLEL_FAMILIES if f in groups] if by == "family" else sorted(groups)
    for name in order:
        idx = groups[name]
        cells = [f"{m:.1%} / {w:.1%}" for m, w in (_stats(a[idx]) for a in (v.current, v.in_sample, v.loso))]
        print(f"{name:<26} {len(idx):>3} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15}", file=out)


def print_memory(cases, fitted: dict[str, float], out=sys.stdout) -> None:
    """Peak HBM error where published; the fitted constants do not change memory (checked here)."""
    rows = [c for c in cases if c.published_peak_gib is not None]
    if not rows:
        return
    yaml_results = pr.evaluate_cases(rows)
    fitted_results = pr.evaluate_cases(rows, pr.with_constants(fitted))
    same = all(abs(a.peak_gib - b.peak_gib) < 1e-9 for a, b in zip(yaml_results, fitted_results))
    print("\npeak HBM per GPU where published" +
          (" (identical with the fitted constants)" if same else " (with the fitted constants)"), file=out)
    header = f"{'id':>3} {'model':<34} {'runtime':<12} {'dev':<6} {'predicted':>9} {'published':>9} {'error':>7}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in fitted_results:
        c = r.case
        print(f"{c.row['id']:>3} {c.row['model'][:34]:<34} {c.runtime:<12} {pr.device_family(c.row):<6} "
              f"{r.peak_gib:>9.1f} {c.published_peak_gib:>9.1f} {r.memory_error:>+7.1%}", file=out)
    errors = [abs(r.memory_error) for r in fitted_results]
    print(f"memory: n {len(errors)}, median |error| {statistics.median(errors):.2%}, max {max(errors):.1%} "
          f"(target median <= {TARGET_MEMORY:.0%}: {'yes' if statistics.median(errors) <= TARGET_MEMORY else 'no'})",
          file=out)
    for by in ("runtime", "device", "source"):
        pr.print_grouped(fitted_results, by, "memory", out)


_TERMS = ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
          "optimizer_s", "offload_s")


def describe(case, values: dict[str, float]) -> str:
    """The step's largest breakdown terms under `values`, and the communication the model hides."""
    est = pr.evaluate(case.job, case.strategy, catalog=pr.with_constants(values))
    b, step = est.breakdown, est.step_time_s
    terms = sorted(_TERMS, key=lambda t: -getattr(b, t))[:3]
    text = ", ".join(f"{t.removesuffix('_s').replace('_comm', ' comm')} {getattr(b, t) / step:.0%}" for t in terms
                     if getattr(b, t) > 0.005 * step)
    hidden = b.dp_comm_total_s - b.dp_comm_s
    if hidden > 0.05 * step:
        text += (f"; dp comm {b.dp_comm_total_s:.3g} s ({b.dp_comm_total_s / step:.0%} of the step), "
                 f"{hidden / max(b.dp_comm_total_s, 1e-30):.0%} hidden")
    return f"step {step:.3g} s = {text}; mfu {est.mfu:.0%}"


def print_resisting(v: Validation, threshold: float, out=sys.stdout) -> None:
    rows = [i for i in range(len(v.cases)) if abs(_err(v.loso[i])) > threshold]
    print(f"\nrows beyond {threshold:.0%} LOSO |error| (largest terms of the step under the fold's constants)",
          file=out)
    if not rows:
        print("  none", file=out)
    for i in sorted(rows, key=lambda i: -abs(v.loso[i])):
        c = v.cases[i]
        zero = f"ZeRO-{c.strategy.zero} " if c.strategy.zero else ""
        mark = "beyond the 30% target" if abs(_err(v.loso[i])) > TARGET_ROW else "within 30%"
        print(f"  row {c.row['id']} {c.runtime} {zero}{_strategy_text(c)} ({c.row['model'][:40]}): "
              f"LOSO {_err(v.loso[i]):+.0%}, fitted {_err(v.in_sample[i]):+.0%} [{mark}]\n"
              f"      {describe(c, v.folds[v.sources[i]].values)}", file=out)


def print_targets(v: Validation, out=sys.stdout) -> None:
    loso_median, loso_max = _stats(v.loso)
    beyond = [v.cases[i].row["id"] for i in range(len(v.cases)) if abs(_err(v.loso[i])) > TARGET_ROW]
    print("\ntargets (issue #15 item 3)", file=out)
    print(f"  LOSO median |error| {loso_median:.2%} <= {TARGET_LOSO_MEDIAN:.0%}: "
          f"{'yes' if loso_median <= TARGET_LOSO_MEDIAN else 'no'}", file=out)
    print(f"  no tier-A row beyond {TARGET_ROW:.0%} LOSO: {'yes' if not beyond else 'no'} "
          f"({len(beyond)} beyond: {','.join(beyond) or '-'}; max {loso_max:.1%})", file=out)
    old = [i for i, c in enumerate(v.cases) if not c.new]
    print("\ntests/test_cost.py accuracy thresholds on the in-sample rows (ids < 200): median <= 10%, max <= 25%",
          file=out)
    for label, ratios in (("constants.yaml", v.current), ("fitted", v.in_sample)):
        median, worst = _stats(ratios[old])
        ok = median <= TEST_MEDIAN and worst <= TEST_MAX
        print(f"  {label:<15} median {median:.1%}, max {worst:.1%}: {'hold' if ok else 'FAIL'}", file=out)


# ----------------------------------------------------------------------------- main


def select_free(free_arg: str | None, bounds_arg: str | None) -> dict[str, Bound]:
    free = dict(FREE)
    if free_arg:
        names = [n.strip() for n in free_arg.split(",") if n.strip()]
        if not all(n.startswith("+") for n in names):
            free = {}
        for name in names:
            name = name.lstrip("+")
            if name not in CANDIDATES:
                raise SystemExit(f"unknown free constant {name!r}; candidates: {', '.join(CANDIDATES)}")
            free[name] = CANDIDATES[name]
    for item in filter(None, (p.strip() for p in (bounds_arg or "").split(","))):
        name, _, rest = item.partition("=")
        low, _, high = rest.partition(":")
        if name not in free:
            raise SystemExit(f"--bounds {name}: not a free constant ({', '.join(free)})")
        free[name] = Bound(float(low), float(high), f"--bounds {low}:{high}")
    return free


CONSTANTS_YAML = HERE.parents[1] / "hardware" / "data" / "constants.yaml"


def write_constants(values: dict[str, float], path: Path = CONSTANTS_YAML) -> list[str]:
    """Put the fitted values into constants.yaml in place (only each constant's `value:` line changes, comments and
    sources stay); returns the lines changed, as 'name: old -> new'."""
    lines, changed, current = path.read_text().splitlines(keepends=True), [], None
    for i, line in enumerate(lines):
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.strip()[:-1]
        elif current in values and line.strip().startswith("value:"):
            old = line.split(":", 1)[1].strip()
            new = f"{values[current]:.4g}"
            if float(old) != float(new):
                lines[i] = line.split("value:")[0] + f"value: {new}\n"
                changed.append(f"{current}: {old} -> {new}")
            current = None
    path.write_text("".join(lines))
    return changed


def load_fit_cases(sources: list[str] | None = None):
    """The tier-A cases with a published throughput (only these sources' rows if given)."""
    cases = [c for c in pr.load_cases("A") if c.published is not None]
    if sources:
        cases = [c for c in cases if pr.source_key(c.row) in sources]
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=3, help="grid values per free constant (default 3)")
    parser.add_argument("--refine", type=int, default=4, help="compass-search halvings below the grid (default 4)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="clipped",
                        help="clipped: mean of min(|log ratio|, log 1.3) (default); median: median |log ratio|")
    parser.add_argument("--free", help="free constants, comma-separated (+NAME: the default set plus NAME)")
    parser.add_argument("--bounds", help="override bounds: name=low:high,...")
    parser.add_argument("--sources", help="only these sources' rows (source keys, comma-separated)")
    parser.add_argument("--resist", type=float, default=0.20, help="list rows beyond this LOSO |error| (0.20)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (2)")
    parser.add_argument("--write", action="store_true", help="write the fit on every row into "
                        "hardware/data/constants.yaml (the calibrated values come from here, never by hand)")
    args = parser.parse_args()
    start = time.perf_counter()
    free = select_free(args.free, args.bounds)
    sources = [s.strip() for s in args.sources.split(",")] if args.sources else None
    cases = load_fit_cases(sources)
    predictor = Predictor(cases, free, args.points, args.refine, args.jobs)
    progress = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    try:
        v = validate(predictor, args.objective, progress=progress)
    finally:
        predictor.close()
    print(f"{len(cases)} tier-A rows with a published throughput; objective {args.objective}; "
          f"grid {args.points}^{len(free)}, refine {args.refine}")
    print_grouping(v)
    print_constants(v, predictor)
    print_rows(v)
    print_summary(v)
    for by in ("runtime", "device", "family", "source"):
        print_groups(v, by)
    print_memory(cases, v.full.values)
    print_resisting(v, args.resist)
    print_targets(v)
    print(f"\n{len(predictor.cache)} trial points, {predictor.evaluations} row evaluations, "
          f"{time.perf_counter() - start:.0f} s ({args.jobs} worker{'s' if args.jobs > 1 else ''})")
    if args.write:
        if sources:
            raise SystemExit("--write: only a fit on every source's rows goes into constants.yaml")
        changed = write_constants(v.full.values)
        print(f"constants.yaml: {'; '.join(changed) if changed else 'unchanged (already the fit)'}")


if __name__ == "__main__":
    main()
