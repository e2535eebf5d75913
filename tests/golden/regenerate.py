"""Rewrite the golden launch files: python tests/golden/regenerate.py

For every case in CASES, compiles the plan and writes each target available
in this build (planner.emit.available_targets()) to
tests/golden/<case>/<target>/<file>, replacing what was there.
tests/test_emit_targets.py compares the emitters' output with these files
byte for byte.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from hardware import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.emit import UnsupportedPlan, available_targets, emitter  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.plan.assemble import build_plan  # noqa: E402
from planner.search.compile import compile_job  # noqa: E402
from planner.search.result import CompileOptions  # noqa: E402
from planner.search.space import SpaceOptions  # noqa: E402

# case -> (model, cluster, global batch, seq len, fixed keys)
CASES: dict[str, tuple[str, str, int, int, dict]] = {
    "tiny-llama-cpu2-tp2-pp2": ("tiny-llama", "cpu:2", 8, 128, {"tp": 2, "pp": 2, "vpp": 1}),
    "llama3-8b-dgx-h100-2": ("llama3-8b", "dgx-h100:2", 64, 8192, {}),
}


def case_plan(case: str):
    """(plan, job) of a golden case."""
    model, cluster, batch, seq, fixed = CASES[case]
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq)
    options = CompileOptions(time_limit=30, space=SpaceOptions(fixed=fixed))
    return build_plan(job, compile_job(job, options), options), job


def _target_files(target: str, plan, job) -> dict[str, str]:
    """{relative path: text} of one target; {} (no golden folder) when the target refuses the plan."""
    try:
        return emitter(target)(plan, job)
    except UnsupportedPlan:
        return {}


def case_files(case: str) -> dict[str, dict[str, str]]:
    """target -> {relative path: text} of a golden case."""
    plan, job = case_plan(case)
    return {target: _target_files(target, plan, job) for target in available_targets()}


def main() -> None:
    for case in CASES:
        for target, files in case_files(case).items():
            folder = HERE / case / target
            shutil.rmtree(folder, ignore_errors=True)
            for path, text in sorted(files.items()):
                out = folder / path
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(text.encode("utf-8"))
            print(f"wrote {folder.relative_to(HERE.parent.parent)} ({len(files)} files)")


if __name__ == "__main__":
    main()
