"""The expert-parallel MoE layer under a placement map (planner/runtime/moe.py), trained under torchrun (gloo,
CPU, 4 processes): a replicated placement from planner's program trains to the same losses and weights as
Megatron's contiguous placement on the same tokens."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from planner.routing.placement import placement_summary
from planner.routing.stats import RoutingStats
from planner.runtime.moe import check_placement
from ports import MULTIPROCESS, free_port
from warm_torchrun import command

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "moe_placement_run.py"


def _train(ranks: list[list[int]], out: Path) -> dict:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    run = subprocess.run([*command(), "--nnodes", "1", "--nproc_per_node", "4",
                          "--master_addr", "127.0.0.1", "--master_port", str(port), str(SCRIPT), json.dumps(ranks),
                          str(out)], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


@MULTIPROCESS
def test_replicated_placement_trains_like_contiguous(tmp_path: Path) -> None:
    # 8 experts on 4 ranks with 4 redundant slots, placed by planner's program for a Zipf(1.2) skew
    stats = RoutingStats(source="test", redundant_slots=4, synthetic={"exponent": 1.2})
    replicated = placement_summary(stats, 8, 4, 1).layers[0].ranks
    assert sum(len(r) for r in replicated) == 12  # the program used the redundant slots
    contiguous = [[0, 1], [2, 3], [4, 5], [6, 7]]
    base = _train(contiguous, tmp_path / "contiguous.json")
    placed = _train(replicated, tmp_path / "replicated.json")
    # EPLB's packing may hold two replicas of one expert on a rank: each slot is a replica all the same
    doubled = _train([[0, 0, 1], [2, 3, 3], [4, 5, 6], [7, 7, 0]], tmp_path / "doubled.json")
    assert doubled["losses"] == pytest.approx(base["losses"], rel=1e-12)
    for expert, [weights] in base["experts"].items():
        for copy in doubled["experts"][expert]:
            for got, want in zip(copy, weights):
                assert got == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert placed["losses"] == pytest.approx(base["losses"], rel=1e-12)
    assert base["losses"][1] < base["losses"][0]  # the steps trained: the second loss is lower
    assert placed["router"] == pytest.approx(base["router"], rel=1e-10, abs=1e-12)
    for expert, [weights] in base["experts"].items():
        replicas = placed["experts"][expert]
        assert len(replicas) == sum(r.count(int(expert)) for r in replicated)
        for copy in replicas:  # every replica took the contiguous copy's update
            for got, want in zip(copy, weights):
                assert got == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_placement_map_is_checked() -> None:
    with pytest.raises(ValueError, match="expert 3 sits on no rank"):
        check_placement([[0, 1], [2, 0]], 4, 2)
    with pytest.raises(ValueError, match="rank 1 holds expert 5"):
        check_placement([[0, 1], [2, 5]], 3, 2)
    with pytest.raises(ValueError, match="same number of expert slots"):
        check_placement([[0, 1, 2], [3]], 4, 2)
