"""DeepSpeed's own MoE layer under planner.runtime.deepspeed_train: tiny-mixtral (4 experts, top-2) compiled
with `--target deepspeed` at ep=2 on 4 CPU ranks (gloo, torchrun) and trained 6 steps.

What DeepSpeed must have built (deepspeed/utils/groups.py _create_expert_and_data_parallel, the legacy
E + D layout without tensor or pipeline parallelism, worked out by hand for world 4, ep_size 2):
expert-parallel groups [0, 1] and [2, 3] (all-to-all), expert-data-parallel groups [0, 2] and [1, 3]
(expert gradients all-reduced there).  So ranks 0 and 2 hold experts 0-1, ranks 1 and 3 experts 2-3: each
rank 2 of the 4 experts, and the replicas of an expert stay equal through training while the two halves
differ.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from planner.plan.schema import Plan  # noqa: E402
from ports import MULTIPROCESS, free_port  # noqa: E402
from trainer_runs import run_planner  # noqa: E402
from warm_torchrun import command  # noqa: E402

RANKS = 4
CLUSTER = f"name: cpu-4\npools:\n  - {{name: cpu, preset: cpu, nodes: 1, overrides: {{gpus_per_node: {RANKS}}}}}\n"
# tiny-mixtral per block: attention 12,352; MoE 4 experts x 24,576, router 256, norm 64; the rest 32,832
DENSE = 2 * (12_352 + 256 + 64) + 32_832
EXPERT = 3 * 64 * 128


def _compile(out: Path, dataset: Path) -> Plan:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-4.yaml").write_text(CLUSTER)
    run_planner("compile", "tiny-mixtral", str(out / "cpu-4.yaml"), "-b", "8", "-s", "64", "--fix",
                "tp=1,pp=1,cp=1,dp=4,ep=2,zero=1,mbs=1", "-o", str(out / "plan"), "--target", "deepspeed",
                "--force", "--data", str(dataset), "--tokenizer", "bytes", "--train-steps", "6")
    return Plan.model_validate_json((out / "plan" / "plan.json").read_text())


@MULTIPROCESS
def test_moe_plan_trains_with_deepspeeds_expert_parallel_groups(tmp_path, dataset):
    plan = _compile(tmp_path, dataset)
    assert (plan.strategy.ep, plan.strategy.dp, plan.strategy.zero) == (2, 4, 1)
    ds = tmp_path / "plan" / "deepspeed"
    assert '--pipeline "$here/pipeline.json"' in (ds / "launch.sh").read_text()  # the moe section travels
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    report = tmp_path / "r.json"
    run = subprocess.run(
        [*command(), "--nproc_per_node", str(RANKS), "--master_port",
         str(free_port()), "-m", "planner.runtime.deepspeed_train", "--ds-config", str(ds / "ds_config.json"),
         "--pipeline", str(ds / "pipeline.json"), "--plan", str(tmp_path / "plan" / "plan.json"),
         "--data", str(dataset), "--tokenizer", "bytes", "--train-steps", "6", "--lr", "1e-2",
         "--report", str(report)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    data = json.loads(report.read_text())
    assert data["zero_stage"] == 1 and len(data["losses"]) == 6
    assert data["losses"][-1] < data["losses"][0], data["losses"]
    ranks = [data["ranks"][str(r)] for r in range(RANKS)]
    assert [r["expert_parallel_ranks"] for r in ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["expert_data_parallel_ranks"] for r in ranks] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    # every rank: the dense parameters and 2 experts in each of the 2 MoE blocks (ZeRO-1 keeps weights whole)
    assert [r["local_params"] for r in ranks] == [DENSE + 2 * 2 * EXPERT] * RANKS
    sums = [r["expert_w1_sums"] for r in ranks]
    assert sums[0] == sums[2] and sums[1] == sums[3] and sums[0] != sums[1]
