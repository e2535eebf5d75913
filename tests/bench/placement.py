"""Cache and offload placement: what the compiler places in which memory tier, and how fast.

    python tests/bench/placement.py              # every scenario
    python tests/bench/placement.py --only dlrm  # scenarios whose name contains "dlrm"

One row per plan: scenario, GPUs, who planned it, the plan in short, the
predicted step time and its ratio to the scenario's baseline, the peak of each
memory tier (HBM per GPU, host DRAM per node, NVMe per node) and the solve time.

Scenarios (the cache issue's):

* dlrm-criteo-terabyte (dim 128, MLPerf multi-hot pooling), batch 65,536, on
  1 and 8 nodes of dgx-a100-40g and on a 4 x L4 PCIe box (examples/clusters/
  l4-box.yaml, 96 GB of HBM for 91 GB of tables: caching is forced).  Baseline:
  planner's greedy TorchRec-style planner over the same cost model
  (tests/bench/torchrec_side_by_side.py compares with TorchRec's own).
* dlrm-meta-2021-synthetic (856 tables, ~15.8 lookups per table per sample),
  batch 65,536, on 128 GPUs (dgx-a100-80g:16), planned in at most 60 s.
* llama3-70b fine-tuning on 2 nodes of 8 x L4 (pcie-l4:2), batch 64 x 4096:
  must offload.  gpt3-175b on one dgx-a100-80g node, batch 32 x 2048: NVMe.
* gpt-neox-20b on 4 DGX A100 40GB nodes behind one 100 Gb/s port each
  (examples/clusters/a100-slow-fabric.yaml), batch 256 x 2048: the best
  ZeRO-3, the best HSDP and the best FCDP plan (regather=host) without
  pipelining, and the compiler's plan over the whole space.

Timings are single runs on a shared machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.embedding.compile import compile_embedding  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.search.compile import compile_job  # noqa: E402
from planner.search.result import CompileOptions  # noqa: E402
from planner.search.space import SpaceOptions  # noqa: E402

GB = 1e9
CLUSTERS = ROOT / "examples" / "clusters"


@dataclass
class Row:
    scenario: str
    gpus: int
    planner: str
    plan: str
    step_s: float | None
    baseline_s: float | None
    hbm_gb: float | None
    host_gb: float | None
    nvme_gb: float | None
    solve_s: float
    status: str


def _job(model: str, cluster: str, batch: int, seq: int) -> Job:
    return Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq)


def _mix(result) -> str:
    counts = Counter((t.sharding_type.value.replace("_wise", "").replace("data_parallel", "dp")
                      + (f"/{t.column_shards}" if t.column_shards > 1 else ""),
                      t.cache_fraction) for t in result.tables)
    parts = [f"{n} {kind}" + ("" if cache >= 1.0 else f"@{cache:g}")
             for (kind, cache), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return ", ".join(parts[:4]) + (", ..." if len(parts) > 4 else "")


def embedding_rows(name: str, job: Job, time_limit: float = 60.0) -> list[Row]:
    """The compiler's and the greedy TorchRec-style plan of a recommendation job."""
    rows = []
    for strategy in ("planner", "greedy-torchrec-style"):
        start = time.perf_counter()
        try:
            result = compile_embedding(job, strategy=strategy, time_limit=time_limit)
        except InfeasibleError as err:
            rows.append(Row(name, job.cluster.num_gpus, strategy, f"infeasible: {err}"[:60], None, None, None,
                            None, None, time.perf_counter() - start, "-"))
            continue
        e = result.estimate
        cert = result.certificate
        baseline = result.baseline.step_time_s if result.baseline is not None and result.baseline.fits else None
        rows.append(Row(name, job.cluster.num_gpus, strategy, _mix(result), e.step_time_s, baseline,
                        e.peak_hbm_bytes / GB, e.peak_host_bytes / GB, 0.0, time.perf_counter() - start,
                        f"{cert.status} {100 * cert.gap:.1f}%" if cert.status != "BASELINE" else "BASELINE"))
    return rows


_QUIET = ("ep=1", "offload=none", "tp_overlap=off", "schedule=1f1b", "sp=on", "sp=off", "cp=1", "vpp=1",
          "offload_device=cpu")


def dense_row(name: str, job: Job, label: str, space: SpaceOptions, baseline_s: float | None = None) -> Row:
    """One compile of a dense model within `space`."""
    start = time.perf_counter()
    try:
        result = compile_job(job, CompileOptions(time_limit=60.0, space=space))
    except InfeasibleError as err:
        return Row(name, job.cluster.num_gpus, label, f"infeasible: {str(err).splitlines()[0]}"[:60], None,
                   baseline_s, None, None, None, time.perf_counter() - start, "-")
    e = result.estimate
    spec = ",".join(p for p in e.strategy_spec.split(",") if p not in _QUIET and not p.startswith("split=")
                    and not p.startswith("recompute_layers="))
    return Row(name, job.cluster.num_gpus, label, spec, e.step_time_s, baseline_s, e.memory.peak_bytes / GB,
               e.memory.host.dram_bytes / GB, e.memory.host.nvme_bytes / GB, time.perf_counter() - start,
               f"{result.certificate.status} {100 * result.certificate.gap:.1f}%")


def fcdp_rows() -> list[Row]:
    name = "gpt-neox-20b/a100-slow-fabric"
    job = _job("gpt-neox-20b", str(CLUSTERS / "a100-slow-fabric.yaml"), 256, 2048)
    families = [
        ("zero-3", {"zero": 3, "shard": "full", "regather": "network", "pp": 1}),
        ("hsdp", {"zero": 3, "shard": "node", "pp": 1}),
        ("fcdp", {"zero": 3, "shard": "full", "regather": "host", "pp": 1}),
    ]
    rows = [dense_row(name, job, label, SpaceOptions(fixed=fixed)) for label, fixed in families]
    zero3 = rows[0].step_s
    for row in rows:
        row.baseline_s = zero3
    rows.append(dense_row(name, job, "planner", SpaceOptions(), zero3))
    return rows


def scenarios() -> list[tuple[str, callable]]:
    terabyte = "dlrm-criteo-terabyte"
    return [
        (f"{terabyte}/dgx-a100-40g:1", lambda: embedding_rows(f"{terabyte}/dgx-a100-40g:1",
                                                              _job(terabyte, "dgx-a100-40g:1", 65536, 1))),
        (f"{terabyte}/dgx-a100-40g:8", lambda: embedding_rows(f"{terabyte}/dgx-a100-40g:8",
                                                              _job(terabyte, "dgx-a100-40g:8", 65536, 1))),
        (f"{terabyte}/l4-box", lambda: embedding_rows(f"{terabyte}/l4-box",
                                                      _job(terabyte, str(CLUSTERS / "l4-box.yaml"), 65536, 1))),
        ("dlrm-meta-2021-synthetic/dgx-a100-80g:16",
         lambda: embedding_rows("dlrm-meta-2021-synthetic/dgx-a100-80g:16",
                                _job("dlrm-meta-2021-synthetic", "dgx-a100-80g:16", 65536, 1))),
        ("llama3-70b/pcie-l4:2", lambda: [dense_row("llama3-70b/pcie-l4:2", _job("llama3-70b", "pcie-l4:2", 64, 4096),
                                                    "planner", SpaceOptions())]),
        ("gpt3-175b/dgx-a100-80g:1", lambda: [dense_row("gpt3-175b/dgx-a100-80g:1",
                                                        _job("gpt3-175b", "dgx-a100-80g:1", 32, 2048),
                                                        "planner", SpaceOptions())]),
        ("gpt-neox-20b/a100-slow-fabric", fcdp_rows),
    ]


def _num(value: float | None, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


HEADER = (f"{'scenario':<42} {'gpus':>5} {'planner':<15} {'plan':<62} {'step s':>9} {'x base':>7} "
          f"{'HBM GB':>7} {'host GB':>8} {'NVMe GB':>8} {'solve s':>8}  status")


def format_row(row: Row) -> str:
    ratio = f"{row.baseline_s / row.step_s:.2f}" if row.step_s and row.baseline_s else "-"
    return (f"{row.scenario:<42} {row.gpus:>5} {row.planner:<15} {row.plan[:62]:<62} {_num(row.step_s, '.4g'):>9} "
            f"{ratio:>7} {_num(row.hbm_gb, '.1f'):>7} {_num(row.host_gb, '.1f'):>8} {_num(row.nvme_gb, '.0f'):>8} "
            f"{row.solve_s:>8.1f}  {row.status}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run scenarios whose name contains this")
    args = parser.parse_args(argv)
    print(HEADER)
    print("-" * len(HEADER))
    for name, run in scenarios():
        if args.only and args.only not in name:
            continue
        for row in run():
            print(format_row(row), flush=True)
    print("\nx base: baseline step time / this plan's (embedding rows: greedy-torchrec-style; "
          "slow-fabric rows: the best ZeRO-3 plan). HBM per GPU, host DRAM and NVMe per node at the peak.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
