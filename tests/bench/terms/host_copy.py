"""Host <-> device copy bandwidth of one GPU against published bandwidthTest / nvbandwidth runs.

    python tests/bench/terms/host_copy.py [--quick]

Measurements (tests/data/terms/host_copy.csv): nvbandwidth on an 8x H200 node (each GPU its own PCIe 5 x16 link)
and CUDA's bandwidthTest on a T4 and a V100 (PCIe 3 x16, cloud VMs), pinned host memory, one GPU at a time.

Model: `planner.cost.stage.host_rate` (the node's per-GPU host link, `host_bandwidth_per_gpu`, x
`pcie_efficiency`) on a site of one node of the preset; the offload and FCDP host terms divide bytes by it.
host_rate assumes every GPU of the node streams at once; on these presets (no shared host_link_bandwidth)
that equals one GPU's rate, so the configurations match.  The model has one rate for both directions.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, run_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_catalog, load_cluster  # noqa: E402
from planner.cost.layout import make_site  # noqa: E402
from planner.cost.stage import host_rate  # noqa: E402


def model_gbps(preset: str) -> float:
    """The model's host-to-GPU GB/s of one GPU of `preset`."""
    cluster = load_cluster(f"{preset}:1")
    catalog = load_catalog()
    return host_rate(make_site(0, tuple(cluster.pools), catalog), catalog) / 1e9


def compare(row: dict[str, str]) -> Compared:
    measured, modelled = float(row["measured_gbps"]), model_gbps(row["preset"])
    size = int(row["bytes"])
    size_text = f"{size / 2**20:g}MiB" if size % 2**20 == 0 else f"{size / 1e6:g}MB"
    tool = "bandwidthTest" if "bandwidthTest" in row["tool"] else row["tool"].split()[0]
    config = f"{row['preset']} {row['direction']} {size_text} ({tool})"
    return Compared(config=config, measured=f"{measured:.1f} GB/s", modelled=f"{modelled:.1f} GB/s",
                    ratio=measured / modelled, source=row["source_id"])


def main(argv: list[str] | None = None) -> list[Compared]:
    return run_table(
        "host_copy", __doc__, argv, compare,
        "Host<->device copy: measured vs planner.cost.stage.host_rate",
        by="preset",
        key=lambda r: r.config.split()[0])


if __name__ == "__main__":
    main()
