"""The pipeline term of a step: m micro-batches on the slowest stage plus the schedule's fill and drain.

With per-micro-batch stage times t_i, m micro-batches and v chunks per stage (Narayanan et al. 2021)

    T = m * max_i t_i + (sum_i u_i - max_i u_i) / v

where u_i, the part of stage i's micro-batch that warm-up and drain leave idle on the others, is t_i under
GPipe, 1F1B and interleaved 1F1B (docs/cost-model.md's (m - 1) max t + sum t for v = 1).

Zero-bubble schedules (zbv, dualpipev; v = 2 in a V) split each backward into an input-gradient pass I and a
weight-gradient pass W that waits for nothing downstream, and run W where 1F1B would idle.  Per chunk, with
forward f, input gradient i and weight gradient w, the orders torch.distributed.pipelining runs (torch 2.13
`_calculate_single_rank_operations`) leave, on p equal stages,

    zbv (ScheduleZBVZeroBubble):  (p - 1) * max(f, i, f + i - 2w)
    dualpipev (ScheduleDualPipeV): (p - 1) * max(f, f + i - w)

idle: the zero-bubble paper's (p - 1)(f + i - 2w) (Qi et al. 2023, arXiv 2401.10241 Sec. 6: B = i + w there)
with its floors, the first forward crossing the ranks before the turn of the V (f) and, in ZB-V's fixed
steady F-I-W, a slower input gradient (i); DualPipeV's F&B pairs run one after the other in torch (no overlap
callback registered), which leaves its fill at f + i - w (DualPipe's README bound (PP/2 - 1)(F&B + B - 3W)
needs overlapped F&B kernels; where a runtime overlaps the expert all-to-alls of the pairs, Strategy.ep_overlap
prices that as it does for Megatron).  In stage terms (F = 2f, W = 2w, I = t - F - W: the input gradient with
recompute and the exposed collectives) u_i = max(F, I, F + I - 2W) or max(F, F + I - W), over v = 2.  Measured
against an event simulation of the torch orders on equal stages (tests/test_schedules_zero_bubble.py): exact
for zbv where f <= i and w <= i (transformer layers: the input gradient carries the attention core's 2.5x
backward) and for dualpipev where i <= f or p = 2; elsewhere the fill grows with p, up to 1.9x at p = 8 for
the cases measured.  Both need m >= 2p (validation.check_strategy): with fewer, torch's ZB-V pads its order
with idle slots and DualPipeV refuses.
"""

from __future__ import annotations

from typing import Sequence

from planner.cost.stage import StageCost
from planner.strategy import Strategy


def fill_seconds(strategy: Strategy, cost: StageCost) -> float:
    """u_i: the seconds of one micro-batch on this stage that the schedule's warm-up and drain leave idle on the
    other stages (the stage's whole micro-batch, or for a zero-bubble V what W cannot fill)."""
    if not strategy.v_shape:
        return cost.microbatch
    forward, weight = cost.sums.forward, cost.sums.weight_grad
    backward_input = cost.microbatch - forward - weight
    if strategy.pipeline_schedule == "zbv":
        return max(forward, backward_input, forward + backward_input - 2.0 * weight)
    return max(forward, forward + backward_input - weight)


def bubble_seconds(strategy: Strategy, fills: Sequence[float]) -> float:
    """(sum u - max u) / v: the fill and drain of the pipeline, from each stage's u_i (`fill_seconds`)."""
    return (sum(fills) - max(fills)) / strategy.vpp
