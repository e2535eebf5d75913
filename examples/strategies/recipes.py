"""An example recipe for `planner compare --strategies` / sweep files: a function of the Job returning a Strategy.

The rule: tensor parallel inside a node only as wide as the model needs (the smallest power of two whose
weights and optimizer state fit a GPU with ZeRO-1 over the data-parallel ranks), no pipeline, the rest data
parallel, full recompute.  It reads only public fields of the job, as any user recipe would.
"""

from planner.cost import evaluate
from planner.strategy import Strategy


def smallest_tp_that_fits(job):
    per_node = min(pool.node.gpus_per_node for pool in job.cluster.pools)
    tp = 1
    while tp <= per_node:
        strategy = Strategy(tp=tp, pp=1, mbs=1, zero=1, recompute="full", sp=tp > 1)
        if evaluate(job, strategy).memory.fits:
            return strategy
        tp *= 2
    return None
