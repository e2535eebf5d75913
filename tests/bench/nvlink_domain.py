"""NVLink domains wider than a node: the same GB200 trays priced as NVL72 racks, as trays alone, and DGX B200.

    python tests/bench/nvlink_domain.py              # every scenario
    python tests/bench/nvlink_domain.py --only 70b   # scenarios whose name contains "70b"

One row per (scenario, cluster, precision): `planner estimate` of a fixed strategy under the megatron runtime,
its tokens/s per GPU, step time and the communication terms the NVLink domain changes (tensor-, expert- and
data-parallel seconds per step).  Clusters:

* rack: gb200-nvl72 trays, 18 (or, for power-of-two jobs, 16 of a rack's 18) to one 72-GPU NVLink domain;
* trays: the same trays with the domain cut at the tray (nvlink_domain_nodes 1, what a node-based model assumes);
* dgx-b200: 8-GPU DGX B200 nodes (1,000 W B200s, NVLink 5 inside the node) with the same GPU count.

Predictions, not measurements: no published GB200 run is in tests/data/published_runs.csv yet.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import Cluster, load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.cost import evaluate  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402
from planner.strategy import parse_strategy  # noqa: E402
from planner.validation import check_strategy  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    batch: int
    seq: int
    strategy: str
    trays: int  # GB200 compute trays
    domain: int  # trays per NVLink domain
    b200_nodes: int  # DGX B200 nodes with as many GPUs
    precisions: tuple[str, ...]


SCENARIOS = (
    Scenario("llama3-70b tp2 pp4", "llama3-70b", 576, 8192, "tp=2,pp=4,sp=on,zero=1,recompute=selective", 18, 18, 9,
             ("bf16", "fp8", "mxfp8")),
    Scenario("llama3-70b tp8 fsdp", "llama3-70b", 576, 8192, "tp=8,sp=on,zero=3,recompute=full", 18, 18, 9,
             ("bf16", "mxfp8")),
    Scenario("llama3-405b tp8 pp8 2 racks", "llama3-405b", 512, 8192, "tp=8,pp=8,vpp=2,sp=on,zero=1,"
             "recompute=selective", 32, 16, 16, ("bf16", "mxfp8")),
    Scenario("deepseek-v3 ep64 pp8", "deepseek-v3", 2048, 4096, "tp=1,pp=8,ep=64,zero=1,recompute=full", 128, 16, 64,
             ("bf16", "mxfp8")),
)


@dataclass
class Row:
    scenario: str
    cluster: str
    precision: str
    tokens_per_gpu: float
    step_s: float
    tp_s: float
    ep_s: float
    dp_s: float
    fits: bool


def _trays(folder: Path, trays: int, domain: int) -> Cluster:
    path = folder / f"trays-{trays}-{domain}.yaml"
    path.write_text(f"name: gb200-trays-{trays}-domain-{domain}\npools:\n  - {{name: trays, preset: gb200-nvl72, "
                    f"nodes: {trays}, overrides: {{nvlink_domain_nodes: {domain}}}}}\n")
    return load_cluster(str(path))


def _row(scenario: Scenario, cluster: Cluster, label: str, precision: str) -> Row:
    job = Job(model=load_model(scenario.model), cluster=cluster, global_batch=scenario.batch, seq_len=scenario.seq,
              precision=precision, runtime=load_runtime("megatron"))
    estimate = evaluate(job, check_strategy(job, parse_strategy(scenario.strategy)))
    b = estimate.breakdown
    return Row(scenario.name, label, precision, estimate.tokens_per_s_per_gpu, estimate.step_time_s, b.tp_comm_s,
               b.ep_comm_s, b.dp_comm_total_s, estimate.memory.fits)


def rows(scenarios: tuple[Scenario, ...] = SCENARIOS) -> list[Row]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in scenarios:
            racks = _trays(Path(tmp), s.trays, s.domain)
            trays = _trays(Path(tmp), s.trays, 1)
            for precision in s.precisions:
                out.append(_row(s, racks, f"{s.trays} trays, {s.domain} per domain", precision))
            out.append(_row(s, trays, f"{s.trays} trays, domain = tray", s.precisions[0]))
            out.append(_row(s, load_cluster(f"dgx-b200:{s.b200_nodes}"), f"dgx-b200:{s.b200_nodes}",
                            s.precisions[0]))
    return out


def render(table: list[Row]) -> str:
    head = ["scenario", "cluster", "precision", "tok/s/GPU", "step s", "tp s", "ep s", "dp s", "fits"]
    body = [[r.scenario, r.cluster, r.precision, f"{r.tokens_per_gpu:,.0f}", f"{r.step_s:.2f}", f"{r.tp_s:.2f}",
             f"{r.ep_s:.2f}", f"{r.dp_s:.2f}", "yes" if r.fits else "NO"] for r in table]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="scenarios whose name contains TEXT")
    args = parser.parse_args(argv)
    print(render(rows(tuple(s for s in SCENARIOS if args.only in s.name))))


if __name__ == "__main__":
    main()
