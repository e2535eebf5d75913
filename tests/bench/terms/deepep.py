"""MoE expert dispatch and combine (the expert-parallel all-to-alls) against DeepEP's and UCCL-EP's published
figures, intra-node (NVLink) and inter-node (RDMA), EP 8 to 64.

    python tests/bench/terms/deepep.py [--quick]

Measurements (tests/data/terms/deepep.csv), all in DeepSeek-V3's pretraining setting (4096 tokens per rank,
hidden 7168, top-8 of 256/288 experts, top-4 node groups, FP8 dispatch, BF16 combine).  The model is the cost
model's DeepEP dispatcher (Strategy.dispatcher = deepep, hardware/data/dispatchers.yaml): one row per distinct
destination node over RDMA and per distinct destination rank over NVLink
(`planner.cost.comm.dispatch_seconds`, `hardware.collectives.node_dispatch`), the expected counts under
DeepEP's test routing (tests/test_internode.py: as many groups as nodes, the token's experts in min(nodes, 4)
of them; `planner.cost.dispatch.expected_destinations`), FP8 rows on dispatch (1 + 4/128 bytes per element)
and BF16 on combine.  Column `alltoall` is the NCCL all-to-all the model prices for Megatron's alltoall
dispatcher (top_k bf16 rows per token), for comparison.
* DeepEP V1 on H800 + CX7 400 Gb/s: the "bottleneck bandwidth", DeepEP's logical bytes (rows times the
  distinct nodes, RDMA, or ranks, NVLink, own ones included) over the time; the model's figure is the same
  logical bytes over the model's time, so model/measured is a ratio of times.  The H800 preset is dgx-h100
  with NVLink at DeepEP's ~160 GB/s.
* UCCL-EP (DeepEP's kernels over AWS EFA) on p5en (8x H200, 2x 200 Gb/s EFA per GPU) and p6-b200 (8x B200,
  400 Gb/s EFA per GPU): the time per dispatch and per combine.  The two p5en EP8 rows set the DeepEP NVLink
  copy rate (dispatchers.yaml nvlink_rate_limit), so they read 1.0 by construction; the H800 and B200
  NVLink rows are its check.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, run_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from functools import lru_cache  # noqa: E402

from hardware import load_catalog, load_cluster  # noqa: E402
from hardware.topology import Cluster  # noqa: E402
from models import load_model  # noqa: E402
from models.graph import Layer, LayerKind  # noqa: E402
from planner.cost.comm import dispatch_seconds  # noqa: E402
from planner.cost.dispatch import expected_destinations  # noqa: E402
from planner.cost.layout import StageComms, place_stages, stage_comms  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402
from planner.strategy import Strategy  # noqa: E402

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


@lru_cache(maxsize=1)
def deepseek_v3():
    return load_model("deepseek-v3")


def setting(row: dict[str, str], dispatcher: str) -> tuple[Layer, Strategy, StageComms]:
    """A DeepSeek-V3 MoE layer routed as the row's benchmark routes (its experts, groups and group_topk), the
    row's EP with `dispatcher`, and its expert-parallel communicator."""
    cluster, ep = cluster_for(row), int(row["ep"])
    graph = deepseek_v3()
    layer = next(layer for layer in graph.layers if layer.kind == LayerKind.MOE)
    moe = layer.moe_shape.model_copy(update={"num_experts": int(row["experts"]), "top_k": int(row["top_k"]),
                                             "router_groups": int(row["groups"]),
                                             "router_group_topk": int(row["group_topk"])})
    layer = layer.model_copy(update={"moe": moe, "hidden": int(row["hidden"])})
    job = Job(model=graph, cluster=cluster, global_batch=ep, seq_len=int(row["tokens"]), moe_routing="balanced",
              runtime=load_runtime("reference"))
    strategy = Strategy(ep=ep, dp=ep, mbs=1, dispatcher=dispatcher)
    groups = stage_comms(job, strategy, place_stages(job, strategy, load_catalog())[0].site)
    return layer, strategy, groups


def model_seconds(row: dict[str, str], dispatcher: str) -> float:
    """The model's seconds of the row's call: FP8 rows on dispatch under DeepEP, BF16 rows otherwise."""
    catalog = load_catalog()
    layer, strategy, groups = setting(row, dispatcher)
    spec = catalog.dispatcher(dispatcher)
    fp8 = row["op"] == "dispatch" and spec.fp8_dispatch_bytes_per_element is not None
    element = spec.fp8_dispatch_bytes_per_element if fp8 else spec.combine_bytes_per_element
    return dispatch_seconds(layer, float(row["tokens"]), element, strategy, groups, catalog)


def logical_bytes(row: dict[str, str]) -> float:
    """DeepEP's logical bytes of the row's call: rows times the expected distinct nodes (RDMA) or ranks (NVLink)
    a token reaches, own ones included (tests/test_internode.py num_rdma_token_sent, test_intranode.py)."""
    catalog = load_catalog()
    layer, strategy, groups = setting(row, "deepep")
    units = max(1, groups.ep.size // groups.ep.ranks_per_node) if row["link"] == "RDMA" else groups.ep.size
    spec = catalog.dispatcher("deepep")
    element = spec.fp8_dispatch_bytes_per_element if row["op"] == "dispatch" else spec.combine_bytes_per_element
    assert element is not None
    return float(row["tokens"]) * layer.hidden * element * expected_destinations(units, layer.moe_shape)


def compare(row: dict[str, str]) -> Compared:
    config = f"{row['library']} {row['preset']} {row['op']} EP{row['ep']} {row['link']}"
    measured = float(row["measured"])
    seconds, nccl = model_seconds(row, "deepep"), model_seconds(row, "alltoall")
    if row["unit"] == "GBps":
        logical = logical_bytes(row)
        return Compared(config=config, measured=f"{measured:.0f} GB/s",
                        modelled=f"{logical / seconds / 1e9:.0f} GB/s (alltoall {logical / nccl / 1e9:.0f})",
                        ratio=seconds / (logical / (measured * 1e9)), source=row["source_id"])
    return Compared(config=config, measured=f"{measured:.0f} us",
                    modelled=f"{seconds * 1e6:.0f} us (alltoall {nccl * 1e6:.0f})",
                    ratio=seconds / (measured * 1e-6), source=row["source_id"])


def main(argv: list[str] | None = None) -> list[Compared]:
    return run_table(
        "deepep", __doc__, argv, compare,
        "Expert dispatch/combine: measured vs the cost model's DeepEP dispatcher "
        "(planner.cost.comm.dispatch_seconds; alltoall: the NCCL all-to-all, for comparison)",
        by="library, platform, operation and link",
        key=lambda r: " ".join(r.config.split()[:3]) + " " + r.config.split()[-1])


if __name__ == "__main__":
    main()
