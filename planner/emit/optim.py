"""The optimizer and learning-rate schedule that the DeepSpeed and torchtitan launch files write.

A plan decides how training is parallelized, not its hyperparameters. These values are common pretraining
settings that the user can edit. They are written the same way for both frameworks: AdamW, a linear warmup
over the first WARMUP_PERCENT of the steps, cosine decay to MIN_LR_RATIO of the peak, and gradient-norm
clipping. The number of steps is a launch input (`planner.emit.inputs`). When it is not given, the launch
scripts compute the warmup in shell arithmetic (`warmup_shell`), with the same rounding as `warmup_steps`.
"""

from __future__ import annotations

# Llama 2's pretraining settings (arXiv 2307.09288 section 2.2): AdamW with betas 0.9/0.95, weight decay 0.1,
# gradient clipping at 1.0, cosine decay to 10% of the peak, peak 3e-4 for the 7B and 13B models
LR = 3e-4
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
MIN_LR_RATIO = 0.1
# Llama 2 warms up for 2000 of about 500k steps (0.4%); 1% of the steps, rounded up, gives short runs a warmup too
WARMUP_PERCENT = 1


def warmup_steps(train_steps: int) -> int:
    """Warmup steps for a run of `train_steps` optimizer steps: WARMUP_PERCENT of them, rounded up."""
    return -(-train_steps * WARMUP_PERCENT // 100)


def warmup_shell(var: str) -> str:
    """Bash arithmetic computing warmup_steps of the shell variable `var`, which holds a positive integer."""
    return f"$(( ({var} * {WARMUP_PERCENT} + 99) / 100 ))"
