"""NCCL collectives against published nccl-tests / all_reduce_bench sweeps, by payload, fabric and node count.

    python tests/bench/terms/collectives.py [--quick]

Measurements (tests/data/terms/collectives.csv): all-reduce sweeps from 32 KiB to 16 GiB on one DGX A100 node
(nccl-tests, time per call), one 8x H200 node (NCCL's NVLS in-switch reduction from 2 MiB; and one ring run with
NVLS off), one and four P6-B200 nodes (8x 50 GB/s EFA each); NVIDIA's GTC25 bus-bandwidth plateaus for all-reduce
and all-to-all on 8 and 32 GPUs of DGX A100 / H100 / B200.  A bus bandwidth becomes seconds with nccl-tests' own
factors (doc/PERFORMANCE.md): all-reduce t = S * 2(n-1)/n / busbw, all-to-all t = S * (n-1)/n / busbw, S the
payload per rank.  The GTC slides print no payload; they are the large-payload plateau, evaluated at 8 GiB.

Model: `hardware.collectives.all_reduce` / `all_to_all` for S bytes over a group of every GPU of the preset's
nodes, placed by `planner.cost.layout.comm_group` (consecutive ranks, as a data-parallel group), with the
catalog's link rates, efficiencies, latencies and NCCL launch constant.  The model has no NVLS/SHARP path and no
LL/LL128 protocols; the sweep shows where that matters.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, QUICK_ROWS, group_summaries, load_rows, parse_args, print_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import collectives as coll  # noqa: E402
from hardware import load_catalog, load_cluster  # noqa: E402
from planner.cost.layout import comm_group  # noqa: E402

MODEL = {"all_reduce": coll.all_reduce, "all_to_all": coll.all_to_all}


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor (doc/PERFORMANCE.md)."""
    return 2.0 * (ranks - 1) / ranks if collective == "all_reduce" else (ranks - 1) / ranks


def measured_seconds(row: dict[str, str], ranks: int) -> float:
    """The measured seconds of one call of the row's collective."""
    value = float(row["measured"])
    if row["unit"] == "us":
        return value * 1e-6
    return float(row["payload_bytes"]) * bus_factor(row["collective"], ranks) / (value * 1e9)


def human(size: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}B"


def compare(row: dict[str, str]) -> Compared:
    cluster = load_cluster(f"{row['preset']}:{row['nodes']}")
    ranks = cluster.num_gpus
    group = comm_group(cluster, tuple(cluster.pools), ranks, 1)
    size = float(row["payload_bytes"])
    model_s = MODEL[row["collective"]](size, group, load_catalog())
    measured_s = measured_seconds(row, ranks)
    factor = bus_factor(row["collective"], ranks)
    config = f"{row['collective']} {row['preset']} x{row['nodes']} n={ranks} {human(size)}"
    return Compared(config=config, measured=f"{size * factor / measured_s / 1e9:.1f} GB/s",
                    modelled=f"{size * factor / model_s / 1e9:.1f} GB/s", ratio=model_s / measured_s,
                    source=row["source_id"])


def main(argv: list[str] | None = None) -> list[Compared]:
    args = parse_args(__doc__.splitlines()[0], argv)
    rows = load_rows("collectives")
    if args.quick:
        rows = rows[:QUICK_ROWS]
    compared = [compare(row) for row in rows]
    print_table("Collectives: measured vs hardware.collectives (bus bandwidth, nccl-tests convention)", compared)
    print("by source and node count, payload >= 256MiB (bandwidth regime) and < 1MiB (latency regime):")
    for label, keep in (("large", lambda r: _size(r) >= 2**28), ("small", lambda r: _size(r) < 2**20)):
        group_summaries([r for r in compared if keep(r)],
                        key=lambda r, label=label: f"{label} {r.source} {' '.join(r.config.split()[:3])}")
    return compared


def _size(row: Compared) -> float:
    """The payload of a compared row, back from its printed configuration."""
    text = row.config.split()[-1]
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if text.endswith(unit):
            return float(text[:-3]) * scale
    return float(text[:-1])


if __name__ == "__main__":
    main()
