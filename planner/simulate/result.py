"""`SimulationResult`: the simulated step against `evaluate`, term by term, with the reason for each difference.

Both step times are split into the same six terms, measured on the stage the
analytic model calls the bottleneck (the slowest micro-batch):

    compute + p2p + data-parallel waits + bubble   (the pipeline phase)
    + step-end sync + optimizer/offload             (after the last backward)

Analytic: m * each per-micro-batch term of that stage, the bubble
(sum t - max t) / v, dp_exposed_end, optimizer + offload (evaluate.py).
Simulated: that stage's busy and idle time up to the end of the pipeline
phase (idle split by what it waited for), then the barrier and the tail.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.simulate.memory import memory_curves
from planner.simulate.simulator import SimulationRun

_MODEL = ConfigDict(extra="forbid", frozen=True)
TOLERANCE = 0.05  # the agreement the simulator checks on homogeneous plans (issue 6)
SIGNIFICANT = 0.005  # a term differing by less than this share of the step needs no explanation


class StageTimes(BaseModel):
    """One stage's simulated step, and its analytic counterparts."""

    model_config = _MODEL
    stage: int = Field(description="Stage index.")
    device: str = Field(description="Device of the stage.")
    compute_s: float = Field(description="Forward and backward passes (with exposed TP/CP/EP collectives), seconds.")
    p2p_s: float = Field(description="Compute stream blocked by pipeline sends, seconds.")
    dp_wait_s: float = Field(description="Compute stream waiting for ZeRO gathers, seconds.")
    bubble_s: float = Field(description="Compute stream idle waiting for other stages (fill, drain, imbalance), "
                                        "seconds.")
    utilisation: float = Field(description="compute_s / simulated step time.")
    analytic_microbatch_s: float = Field(description="The analytic per-micro-batch time of the stage, seconds.")
    peak_bytes: float = Field(description="Simulated HBM peak per GPU, bytes.")
    analytic_peak_bytes: float = Field(description="evaluate()'s HBM peak per GPU, bytes.")
    capacity_bytes: float = Field(description="HBM capacity of the device, bytes.")


class TermDifference(BaseModel):
    """One term of the step in both models."""

    model_config = _MODEL
    term: str = Field(description="compute, p2p, dp-wait, bubble, step-end sync, optimizer+offload.")
    analytic_s: float = Field(description="The analytic model's seconds for the term.")
    simulated_s: float = Field(description="The simulation's seconds for the term.")
    difference_s: float = Field(description="simulated_s - analytic_s.")
    why: str = Field(description="Why they differ ('' when the difference is under 0.5% of the step).")


class SimulationResult(BaseModel):
    """A simulated training step compared with the analytic model."""

    model_config = _MODEL
    model: str = Field(description="Model name.")
    cluster: str = Field(description="Cluster name.")
    strategy_spec: str = Field(description="The simulated strategy.")
    micro_batches: int = Field(description="Micro-batches per step per replica.")
    simulated_step_s: float = Field(description="Simulated seconds per step.")
    analytic_step_s: float = Field(description="evaluate()'s seconds per step.")
    difference: float = Field(description="(simulated - analytic) / analytic.")
    agrees: bool = Field(description=f"|difference| <= {TOLERANCE:.0%}.")
    bottleneck_stage: int = Field(description="The analytic model's slowest stage, where the terms are measured.")
    tasks: int = Field(description="Tasks simulated.")
    stages: list[StageTimes] = Field(description="Per-stage busy, waiting and idle time.")
    terms: list[TermDifference] = Field(description="The step split into terms in both models.")


_TERM_OF_KIND = {"send": "p2p", "copy": "dp"}


def _stage_times(sim: SimulationRun, pipeline_end: float) -> dict[int, dict[str, float]]:
    """compute, p2p, dp-wait and bubble seconds per stage over [0, pipeline_end]."""
    tl = sim.timeline
    out = {w.index: {"compute": 0.0, "p2p": 0.0, "dp": 0.0} for w in sim.works}
    previous_end: dict[int, float] = {}
    for index, task in enumerate(tl.tasks):
        if task.stream != "compute" or task.kind not in ("forward", "backward", "send", "copy"):
            continue
        stats = out[task.stage]
        # host copies of list-based collectives are data-parallel time, as the analytic model counts them
        stats[_TERM_OF_KIND.get(task.kind, "compute")] += tl.end[index] - tl.start[index]
        free = previous_end.get(task.stage, 0.0)
        # the gap before a task is a data-parallel wait for the part after everything else it needed was ready
        other = max([free] + [tl.end[d] for d in task.after_end if tl.tasks[d].stream != "dp"]
                    + [tl.start[d] for d in task.after_start])
        stats["dp"] += max(0.0, tl.start[index] - max(other, free))
        previous_end[task.stage] = tl.end[index]
    for stats in out.values():
        stats["bubble"] = max(0.0, pipeline_end - stats["compute"] - stats["p2p"] - stats["dp"])
    return out


def _why(term: str, sim: SimulationRun, bottleneck: int, diff: float) -> str:
    s, works = sim.strategy, sim.works
    times = [w.cost.microbatch for w in works]
    if term == "compute":
        return "the simulated stage ran other work than the analytic bottleneck (a bug: the prices are shared)"
    if term == "p2p":
        sends = sum(1 for t in sim.timeline.tasks if t.stage == bottleneck and t.kind == "send")
        return (f"the analytic model blocks every stage for 2 x vpp = {2 * s.vpp} transfers per micro-batch; "
                f"stage {bottleneck} sends {sends / sim.micro_batches:g} (the first stage sends no gradient, the last "
                "no activation)")
    if term == "dp-wait":
        w = works[bottleneck]
        if w.prefetch == 0:
            return ("the runtime prefetches nothing, so both models put every gather and host copy on the critical "
                    "path; they differ where the simulated reduce-scatters hide: behind the next units' gathers as "
                    "well as behind overlap x their compute (the analytic model: overlap x the backward compute "
                    "only), and a reduce-scatter that outlasts that window delays the next re-gather")
        if diff > 0:
            return (f"gathers are per FSDP unit with {w.prefetch} unit(s) of prefetch: a unit whose gather outlasts "
                    "overlap x the compute issued before it (the embedding's, the first block's behind the cheap "
                    "embedding lookup) stalls the stream, and a backward's reduce-scatters delay the next pass's "
                    "first gathers; the analytic model hides the stage's total behind overlap x its whole compute")
        sums = w.cost.sums
        comm = w.dp_gather + w.dp_regather + w.dp_reduce
        busy = sums.compute + sums.recompute + sums.tp + sums.cp + sums.ep
        return (f"the analytic model hides a micro-batch's ZeRO traffic ({comm * 1e3:.4g} ms) only behind overlap x "
                f"its forward and backward compute ({sums.compute * 1e3:.4g} ms, no recompute or TP time) and adds "
                "the largest layer's gather; the simulated data-parallel stream also runs under recompute and TP "
                f"time ({busy * 1e3:.4g} ms in all) and its reduce-scatters drain into the next pass, so a "
                "communication-bound stage costs about its stream's busy time")
    if term == "bubble":
        if s.pp == 1:
            return "no pipeline: the stage only idles for the gathers and transfers counted in the other terms"
        spread = max(times) / min(times)
        if spread > 1.02:
            return (f"stages are uneven (per-micro-batch {min(times) * 1e3:.3g} to {max(times) * 1e3:.3g} ms): the "
                    "analytic fill/drain (sum t - max t) / v assumes every stage runs at its own pace, the schedule's "
                    "dependencies make faster stages wait for slower neighbours during warm-up and drain")
        if s.pipeline_schedule == "interleaved":
            return ("interleaved 1F1B: the analytic bubble (p - 1) t / v ignores that the last stage's chunk "
                    "hands over to the first stage's next chunk (one more transfer per round), and uneven chunks")
        return ("fill and drain on the simulated schedule: the first and last stages send in one direction only "
                "and the analytic (p - 1) t counts full micro-batch times")
    if term == "step-end sync":
        work = works[bottleneck]
        if diff < 0:
            return "the simulated sync starts with each stage's own last backward, before the pipeline drains"
        parts = []
        if work.dp_reduce > 0:
            parts.append("the last backward's per-unit reduce-scatters drain after it, with no compute left to hide "
                         "behind (the analytic model hides them inside each backward)")
        if work.step_end > 0:
            parts.append("gradients are ready only during the last backward of each chunk, unit by unit: the sync "
                         "hides behind overlap x that backward and the last unit's bucket behind nothing, where the "
                         "analytic model hides it behind overlap x a whole micro-batch (forward + backward)")
        return "; ".join(parts) or "the pipeline's last transfers end after the bottleneck stage's last pass"
    if term == "optimizer+offload":
        return ("every simulated optimizer step waits for all stages' gradients (the global gradient-norm "
                "all-reduce of clipping in Megatron-LM and torchtitan), then the step ends with the largest optimizer "
                "+ offload of any stage; the analytic model lets each stage's ranks sync and step on their own")
    return ""


def summarize(sim: SimulationRun) -> SimulationResult:
    """Compare a simulated step with evaluate(), term by term."""
    tl = sim.timeline
    analytic = sim.analytic
    m = sim.micro_batches
    barrier = next(tl.end[i] for i, t in enumerate(tl.tasks) if t.kind == "barrier")
    pipeline_end = max((tl.end[i] for i, t in enumerate(tl.tasks)
                        if t.kind in ("forward", "backward", "send", "transfer", "copy")), default=0.0)
    step = sim.step_time
    per_stage = _stage_times(sim, pipeline_end)
    bottleneck = max(range(len(sim.works)), key=lambda i: sim.works[i].cost.microbatch)
    cost = sim.works[bottleneck].cost
    sums = cost.sums
    b = analytic.breakdown
    ours = per_stage[bottleneck]
    rows = [
        ("compute", m * (sums.compute + sums.recompute + sums.tp + sums.cp + sums.ep), ours["compute"]),
        ("p2p", m * cost.pp, ours["p2p"]),
        ("dp-wait", m * cost.dp_exposed_microbatch, ours["dp"]),
        ("bubble", b.bubble_s, ours["bubble"]),
        ("step-end sync", b.dp_comm_s - m * cost.dp_exposed_microbatch, barrier - pipeline_end),
        ("optimizer+offload", b.optimizer_s + b.offload_s, step - barrier),
    ]
    terms = []
    for name, ana, simulated in rows:
        diff = simulated - ana
        why = _why(name, sim, bottleneck, diff) if abs(diff) > SIGNIFICANT * analytic.step_time_s else ""
        terms.append(TermDifference(term=name, analytic_s=ana, simulated_s=simulated, difference_s=diff, why=why))
    curves = {c.stage: c for c in memory_curves(sim)}
    stages = [
        StageTimes(stage=w.index, device=w.device, compute_s=per_stage[w.index]["compute"],
                   p2p_s=per_stage[w.index]["p2p"], dp_wait_s=per_stage[w.index]["dp"],
                   bubble_s=per_stage[w.index]["bubble"], utilisation=per_stage[w.index]["compute"] / step,
                   analytic_microbatch_s=w.cost.microbatch, peak_bytes=curves[w.index].peak,
                   analytic_peak_bytes=w.cost.memory.total, capacity_bytes=w.capacity)
        for w in sim.works
    ]
    difference = (step - analytic.step_time_s) / analytic.step_time_s
    return SimulationResult(
        model=sim.job.model.name, cluster=sim.job.cluster.name, strategy_spec=sim.strategy.spec(),
        micro_batches=m, simulated_step_s=step, analytic_step_s=analytic.step_time_s, difference=difference,
        agrees=abs(difference) <= TOLERANCE, bottleneck_stage=bottleneck, tasks=len(tl.tasks), stages=stages,
        terms=terms,
    )
