"""A CP-SAT program proved infeasible is not solved again: the compile is the same, with fewer solves.

Configurations whose tables agree number for number (ZeRO stages that change no stage time and no fit) build the
same program; `planner.search.config_solve.solve_config` keeps a digest of each program CP-SAT proved infeasible
(the text of its model: variables, constraints, the incumbent's cutoff, the hint) and takes an identical one as
proved.  Here a mixed-cluster compile runs with the memo and with every digest unique (no memo), and everything
it reports is held equal: status, objective, bound, counts, the plan and its runners-up.
"""

from __future__ import annotations

import itertools

from models import load_model
from planner.job import Job
from planner.profile import load_runtime
from planner.search import config_solve
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from test_compile import _cluster


def _compile(monkeypatch, memo: bool):
    """(the compile's result, CP-SAT solves run), with the memo or with every program's digest unique."""
    solves = 0
    real = config_solve._solve

    def counted(*args, **kwargs):
        nonlocal solves
        solves += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(config_solve, "_solve", counted)
    if not memo:
        unique = itertools.count()

        class Unique:  # hashlib's blake2b as solve_config calls it, one fresh digest per program
            def __init__(self, *args, **kwargs):
                self.value = next(unique).to_bytes(16, "big")

            def digest(self) -> bytes:
                return self.value

        monkeypatch.setattr(config_solve.hashlib, "blake2b", Unique)
    job = Job(model=load_model("llama3-8b"), global_batch=64, seq_len=4096, memory_margin=0.1,
              cluster=_cluster("a100-h100", ("a100", "dgx-a100-80g", 8), ("h100", "dgx-h100", 8)),
              runtime=load_runtime("planner"))
    result = compile_job(job, CompileOptions(time_limit=120))
    monkeypatch.undo()
    return result, solves


def test_an_infeasible_program_is_proved_once(monkeypatch):
    with_memo, memo_solves = _compile(monkeypatch, memo=True)
    without, solves = _compile(monkeypatch, memo=False)
    ours, theirs = with_memo.certificate, without.certificate
    assert ours.stopped is None and theirs.stopped is None  # neither cut by the clock: both reproducible
    assert (ours.status, ours.objective, ours.bound, ours.solved, ours.pruned) == (
        theirs.status, theirs.objective, theirs.bound, theirs.solved, theirs.pruned)
    assert with_memo.strategy == without.strategy and with_memo.runners_up == without.runners_up
    assert memo_solves <= solves - 10  # the job has ZeRO twins among the programs CP-SAT proves infeasible
