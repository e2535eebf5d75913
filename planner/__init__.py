"""planner: a constraint-optimization plan compiler for distributed deep-learning training.

The data path, and the package of each step (lower layers never import higher ones: tests/test_architecture.py):

    planner.cli          parse MODEL, CLUSTER, SPEC; print; map typed errors to exit codes
      -> planner.job      Job (models.ModelGraph + hardware.Cluster + batch, sequence, precision)
         planner.strategy Strategy (SPEC: tp, pp, dp, cp, ep, ZeRO, recompute, offload, ...), checked by validation
      -> planner.cost     evaluate(job, strategy): step time, memory, breakdown -- the one cost model
      -> planner.search   the space, cost tables from the same cost functions, a CP-SAT program per
                          configuration, branch and bound with a certificate (recommendation models:
                          planner.embedding)
      -> planner.plan     Plan (plan.json), report.md and its figures, written atomically
      -> planner.emit     launch files per target (DeepSpeed, torch, torchtitan, Megatron-LM, Slurm, Kubernetes)
    beside them: planner.compare (baselines on the same cost model), planner.simulate (event replay of a
    plan), planner.sweep (grids of comparisons), planner.runtime (our torch trainer that runs a plan).
"""

__version__ = "0.1.0"
