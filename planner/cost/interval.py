"""How sure an estimate is: a prediction interval from the residuals of published runs like it.

`hardware/data/residuals.yaml` holds, per published run with a measured throughput in the project's scored
files (tests/data/published_runs.csv and the holdouts scored so far), the error of the cost model with
constants not fitted to that run (log of predicted over published tokens/s: leave one source out for the
tier-A runs the calibrated constants are fitted on, the constants as they are for every other run) and the
run's regime: runtime, device family, parallel family and sequence range.  It is written by
`python tests/bench/intervals.py`; nobody edits it.

An estimate's interval comes from its nearest regime: the published runs that share the most of the
four regime keys with it, widened to the next-best match until at least `neighbours` runs are in (ties at
the cut are all kept).  The step time's interval is the predicted step time scaled by the runs'
`low_quantile` and `high_quantile` error ratios (a run predicted 10% fast took 10% longer than predicted).
Calibration, leave one source out, is printed by the bench and quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from planner.job import Job
from planner.strategy import Strategy

_FIELD = ConfigDict(extra="forbid", frozen=True)

REGIME_KEYS = ("runtime", "device", "family", "seq")
# Sequence ranges (tokens per sequence): the attention share of a step grows with length, and so did the
# errors by length that issue #28 lists.
SEQ_RANGES = ((4096, "<=4K"), (16384, "4K-16K"), (math.inf, ">16K"))
PARALLEL_FAMILIES = ("DP/FSDP", "TP", "PP", "TP+PP", "CP", "EP")


class Regime(BaseModel):
    """What a run's error is expected to depend on."""

    model_config = _FIELD
    runtime: str = Field(description="Runtime profile (hardware/data/runtimes).")
    device: str = Field(description="Device family: A100, H100, H200, B200, MI300X, ...")
    family: str = Field(description="Parallel family: EP, CP, TP+PP, PP, TP or DP/FSDP (parallel_family).")
    seq: str = Field(description="Sequence range: <=4K, 4K-16K or >16K tokens.")

    def text(self) -> str:
        return f"{self.runtime}, {self.device}, {self.family}, {self.seq}"


class Residual(Regime):
    """One published run's regime and its error with constants not fitted to it."""

    id: int = Field(description="Row id in the project's runs files (tests/data/published_runs.csv, holdout*_runs.csv; "
                    "ids are unique across them).")
    source: str = Field(description="The publication or repository the row comes from (its LOSO group).")
    log_ratio: float = Field(description="log(predicted / published tokens/s per GPU), constants fitted without "
                             "the row's source (tier-A rows) or not fitted to it at all (every other row).")


class Residuals(BaseModel):
    """hardware/data/residuals.yaml."""

    model_config = _FIELD
    coverage: float = Field(description="Nominal coverage of the interval (0.8: 80% of runs like it inside).")
    neighbours: int = Field(description="Fewest runs an interval is computed from (nearest regimes first).")
    loso_coverage: float = Field(description="Share of the runs whose error falls inside the interval computed "
                                 "from the other sources' runs (the calibration the bench measured).")
    comparison_error: float = Field(
        description="How far apart the model's errors on two tier-A runs of one source (same runtime and device) "
        "lie: the `coverage` quantile of |difference of their log ratios|, as a fraction.  Two plans of one job "
        "whose step times differ by less cannot be ranked by the model (comparison_error).")
    rows: list[Residual] = Field(description="One per scored run with a published throughput.")


class Interval(BaseModel):
    """The step time's prediction interval."""

    model_config = _FIELD
    coverage: float = Field(description="Nominal coverage (0.8: 80% of published runs like it fell inside).")
    low_s: float = Field(description="Low end of the step time, seconds.")
    high_s: float = Field(description="High end of the step time, seconds.")
    runs: int = Field(description="Published runs the interval comes from.")
    matched: list[str] = Field(description="The regime keys every one of those runs shares with the estimate "
                               "(REGIME_KEYS; empty: no single key is common to all of them).")
    shared: int = Field(0, ge=0, le=len(REGIME_KEYS), description="The fewest regime keys any of those runs shares "
                        "with the estimate (0: the runs of every regime).")
    regime: Regime = Field(description="The estimate's regime.")
    comparison_error: float = Field(description="Two plans whose step times differ by less than this fraction are "
                                    "indistinguishable within the model's error (Residuals.comparison_error).")

    def text(self) -> str:
        """'80%: 1.02-1.31 s, 14 runs alike in runtime, device' (or 'alike in 3 of runtime, device, family, seq'
        where the runs share as many keys but not the same ones)."""
        if len(self.matched) >= self.shared and self.matched:
            alike = f"alike in {', '.join(self.matched)}"
        elif self.shared:
            alike = f"alike in {self.shared} of {', '.join(REGIME_KEYS)}"
        else:
            alike = "of every regime"
        return f"{self.coverage:.0%}: {self.low_s:.4g}-{self.high_s:.4g} s, {self.runs} published runs {alike}"

    def indistinguishable(self, step_s: float, best_s: float) -> bool:
        """Whether a plan of `step_s` is within the model's error of one of `best_s` (step_s >= best_s)."""
        return step_s <= best_s * (1 + self.comparison_error)


@lru_cache(maxsize=1)
def load_residuals() -> Residuals:
    """hardware/data/residuals.yaml."""
    text = resources.files("hardware").joinpath("data", "residuals.yaml").read_text()
    return Residuals.model_validate(yaml.safe_load(text))


def device_family(device_name: str) -> str:
    """'h100-sxm' -> 'H100', 'mi300x' -> 'MI300X' (a catalog device's family)."""
    return device_name.split("-")[0].upper()


def parallel_family(strategy: Strategy) -> str:
    """EP if experts are split, else CP if the sequence is, else TP+PP, PP, TP, or DP/FSDP (data parallel
    only, any ZeRO stage)."""
    if strategy.ep > 1:
        return "EP"
    if strategy.cp > 1:
        return "CP"
    if strategy.tp > 1 and strategy.pp > 1:
        return "TP+PP"
    if strategy.pp > 1:
        return "PP"
    return "TP" if strategy.tp > 1 else "DP/FSDP"


def seq_range(seq_len: int) -> str:
    return next(name for top, name in SEQ_RANGES if seq_len <= top)


def regime(job: Job, strategy: Strategy, devices: list[str]) -> Regime:
    """The regime of `strategy` on `job` with its stages on `devices` (the first stage's device family)."""
    return Regime(runtime=job.runtime.name, device=device_family(devices[0]), family=parallel_family(strategy),
                  seq=seq_range(job.seq_len))


def comparison_error(rows: list[Residual], coverage: float) -> float:
    """Residuals.comparison_error of `rows`: pairs of runs of one source, runtime and device."""
    gaps = [abs(a.log_ratio - b.log_ratio) for i, a in enumerate(rows) for b in rows[i + 1:]
            if (a.source, a.runtime, a.device) == (b.source, b.runtime, b.device)]
    return math.exp(float(np.quantile(np.asarray(gaps), coverage, method="higher"))) - 1


def _shared(a: Regime, b: Regime) -> tuple[str, ...]:
    return tuple(k for k in REGIME_KEYS if getattr(a, k) == getattr(b, k))


def nearest(of: Regime, rows: list[Residual], neighbours: int) -> tuple[list[Residual], list[str]]:
    """The runs sharing the most regime keys with `of`, best matches first, until `neighbours` are in (every
    run tied with the last one taken too), and the keys all of them share."""
    scored = sorted(rows, key=lambda r: -len(_shared(of, r)))
    if len(scored) <= neighbours:
        cut = len(scored)
    else:
        level = len(_shared(of, scored[neighbours - 1]))
        cut = sum(1 for r in scored if len(_shared(of, r)) >= level)
    taken = scored[:cut]
    common = [k for k in REGIME_KEYS if all(getattr(of, k) == getattr(r, k) for r in taken)]
    return taken, common


def quantiles(log_ratios: list[float], coverage: float) -> tuple[float, float]:
    """The central `coverage` range of the errors, as step-time factors (low, high).  The order statistics
    outside the range, not interpolated ones: from a handful of runs an interpolated range covers less than
    its nominal share (the bench's calibration table shows both)."""
    tail, errors = (1 - coverage) / 2, np.asarray(log_ratios)
    low = np.quantile(errors, tail, method="lower")
    high = np.quantile(errors, 1 - tail, method="higher")
    return math.exp(float(low)), math.exp(float(high))


def _factors_of(of: Regime, residuals: Residuals) -> tuple[float, float, int, tuple[str, ...], int]:
    """(low, high, runs, matched keys, fewest keys shared) of regime `of` from `residuals`."""
    taken, common = nearest(of, residuals.rows, residuals.neighbours)
    low, high = quantiles([x.log_ratio for x in taken], residuals.coverage)
    return low, high, len(taken), tuple(common), min(len(_shared(of, x)) for x in taken)


@lru_cache(maxsize=256)
def _factors(of: Regime) -> tuple[float, float, int, tuple[str, ...], int]:
    """_factors_of the residuals file, cached (the search asks per strategy)."""
    return _factors_of(of, load_residuals())


def interval(step_s: float, of: Regime, residuals: Residuals | None = None) -> Interval:
    """The prediction interval of a step time `step_s` estimated in regime `of`."""
    r = residuals or load_residuals()
    low, high, runs, common, shared = _factors(of) if residuals is None else _factors_of(of, residuals)
    return Interval(coverage=r.coverage, low_s=step_s * low, high_s=step_s * high, runs=runs, matched=list(common),
                    shared=shared, regime=of, comparison_error=r.comparison_error)
