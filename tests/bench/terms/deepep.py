"""MoE expert dispatch and combine (the expert-parallel all-to-alls) against DeepEP's and UCCL-EP's published
figures, intra-node (NVLink) and inter-node (RDMA), EP 8 to 64.

    python tests/bench/terms/deepep.py [--quick]

Measurements (tests/data/terms/deepep.csv), all in DeepSeek-V3's pretraining setting (4096 tokens per rank,
hidden 7168, top-8 of 256/288 experts, top-4 node groups, FP8 dispatch, BF16 combine):
* DeepEP V1 on H800 + CX7 400 Gb/s: the "bottleneck bandwidth" (bytes over the bottleneck link per second).
  The model's figure is the rate `hardware.collectives.all_to_all` moves bytes over that same link: the link's
  share of the per-rank payload ((k-1)/n over NVLink, (n-k)/n over the NICs, k ranks per node) over its
  seconds.  The H800 preset is dgx-h100 with NVLink at DeepEP's ~160 GB/s.
* UCCL-EP (DeepEP's kernels over AWS EFA) on p5en (8x H200, 2x 200 Gb/s EFA per GPU) and p6-b200 (8x B200,
  400 Gb/s EFA per GPU): the time per dispatch and per combine.  The model's seconds are
  `planner.cost.comm.expert_all_to_all_seconds` for one DeepSeek-V3 MoE layer, one micro-batch of 4096
  tokens per rank, ep = dp = EP, balanced routing, no overlap, divided by its 4 all-to-alls (dispatch and
  combine, forward and backward: the model prices each alike).  That function carries the model's byte
  count (top_k copies of each token in 16-bit); DeepEP dispatches in FP8 and forwards tokens from the RDMA
  domain over NVLink (its README), so the rows test bytes and rates together.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, QUICK_ROWS, group_summaries, load_rows, parse_args, print_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from functools import lru_cache  # noqa: E402

from hardware import collectives as coll  # noqa: E402
from hardware import load_catalog, load_cluster  # noqa: E402
from hardware.topology import Cluster  # noqa: E402
from models import load_model  # noqa: E402
from models.graph import LayerKind  # noqa: E402
from planner.cost.compute import LayerTime  # noqa: E402
from planner.cost.comm import ACT_BYTES, expert_all_to_all_seconds  # noqa: E402
from planner.cost.layout import comm_group, place_stages, stage_comms  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402
from planner.strategy import Strategy  # noqa: E402

ALL_TO_ALLS = 4  # expert_all_to_all_seconds: dispatch + combine, forward + backward (no recompute)


def cluster_for(row: dict[str, str]) -> Cluster:
    """EP/8 nodes of the row's preset (NVLink set to the row's override, where it has one)."""
    nodes = max(1, int(row["ep"]) // 8)
    cluster = load_cluster(f"{row['preset']}:{nodes}")
    if not row["intra_override_gbps"]:
        return cluster
    pool = cluster.pools[0]
    link = pool.node.intra_link.model_copy(update={"bandwidth": float(row["intra_override_gbps"]) * 1e9})
    node = pool.node.model_copy(update={"intra_link": link})
    return cluster.model_copy(update={"pools": [pool.model_copy(update={"node": node})]})


def model_bottleneck_gbps(row: dict[str, str]) -> float:
    """GB/s the model moves over the row's bottleneck link in one all-to-all of the rows' routed bytes."""
    cluster = cluster_for(row)
    n = int(row["ep"])
    group = comm_group(cluster, tuple(cluster.pools), n, 1)
    size = int(row["tokens"]) * int(row["top_k"]) * int(row["hidden"]) * ACT_BYTES
    seconds = coll.all_to_all(size, group, load_catalog())
    k = group.ranks_per_node
    share = (k - 1) / n if row["link"] == "NVLink" else (n - k) / n
    return share * size / seconds / 1e9


@lru_cache(maxsize=1)
def deepseek_v3():
    return load_model("deepseek-v3")


def model_call_seconds(row: dict[str, str]) -> float:
    """The model's seconds of one dispatch (or combine) of a DeepSeek-V3 MoE layer at the row's EP."""
    cluster, ep = cluster_for(row), int(row["ep"])
    graph = deepseek_v3()
    job = Job(model=graph, cluster=cluster, global_batch=ep, seq_len=int(row["tokens"]), moe_routing="balanced",
              runtime=load_runtime("reference"))
    strategy = Strategy(ep=ep, dp=ep, mbs=1)
    catalog = load_catalog()
    groups = stage_comms(job, strategy, place_stages(job, strategy, catalog)[0].site)
    layer = next(layer for layer in graph.layers if layer.kind == LayerKind.MOE)
    idle = LayerTime(forward=0.0, backward=0.0, recompute=0.0, attention_forward=0.0)
    return expert_all_to_all_seconds(layer, job, strategy, groups, idle, catalog, "none") / ALL_TO_ALLS


def compare(row: dict[str, str]) -> Compared:
    config = f"{row['library']} {row['preset']} {row['op']} EP{row['ep']} {row['link']}"
    measured = float(row["measured"])
    if row["unit"] == "GBps":
        modelled = model_bottleneck_gbps(row)
        return Compared(config=config, measured=f"{measured:.0f} GB/s", modelled=f"{modelled:.0f} GB/s",
                        ratio=measured / modelled, source=row["source_id"])
    seconds = model_call_seconds(row)
    return Compared(config=config, measured=f"{measured:.0f} us", modelled=f"{seconds * 1e6:.0f} us",
                    ratio=seconds / (measured * 1e-6), source=row["source_id"])


def main(argv: list[str] | None = None) -> list[Compared]:
    args = parse_args(__doc__.splitlines()[0], argv)
    rows = load_rows("deepep")
    if args.quick:
        rows = rows[:QUICK_ROWS]
    compared = [compare(row) for row in rows]
    print_table("Expert dispatch/combine: measured vs hardware.collectives.all_to_all (bandwidth rows) and "
                "planner.cost.comm.expert_all_to_all_seconds (time rows)", compared)
    print("by library, platform, operation and link (model/measured in time):")
    group_summaries(compared, key=lambda r: " ".join(r.config.split()[:3]) + " " + r.config.split()[-1])
    return compared


if __name__ == "__main__":
    main()
