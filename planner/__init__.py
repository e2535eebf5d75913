"""planner: a constraint-optimization plan compiler for distributed deep-learning training.

The entry points (planner/api.py; the command line only parses, calls them and prints)::

    import planner

    job = planner.load_job("llama3-8b", "dgx-h100:1", batch=8, seq_len=8192)
    planner.estimate(job, "tp=2,sp=on,zero=3").step_time_s     # one strategy, costed
    compiled = planner.compile(job, targets=("megatron",))       # the fastest plan that fits, certified
    compiled.write("out/llama3-8b")                              # plan.json, report.md, megatron/
    planner.compare_baselines(job, only=("megatron", "zero3", "planner"))  # baselines beside the plan
    plan, job = planner.load_plan("out/llama3-8b/plan.json")     # a compiled plan and its job, checked
    planner.simulate_plan(plan, job).summary.simulated_step_s    # its step, event by event
    planner.replan_for(plan, job, "dgx-h100:1").plan             # re-planned for a changed allocation

The data path, and the package of each step (lower layers never import higher ones: pyproject.toml's
import-linter contract):

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

from typing import Any

from planner.version import __version__

# not job or compare: planner.job and planner.compare are modules;
# not simulate or replan either: their packages are planner.simulate and planner.replan
__all__ = ["Compiled", "DEFAULT_RUNTIME", "Replanned", "Simulated", "__version__", "compare_baselines", "compile",
           "estimate", "load_job", "load_plan", "replan_for", "simulate_plan"]


def __getattr__(name: str) -> Any:
    # the entry points load the whole library (solver, cost model, emitters): only when first asked for, so
    # that `import planner` (and `planner --help`) stays light
    if name in __all__:
        from planner import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
