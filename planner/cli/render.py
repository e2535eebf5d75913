"""Text rendering for the command line: pure functions from library objects to strings.

Nothing here prints or imports click; `app.py` echoes what these return.
Units on screen: GB = 1e9 bytes, TB/s = 1e12 bytes/s, TFLOP/s = 1e12 FLOP/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hardware import Catalog, Cluster, DeviceSpec, NodeSpec, Pool
from hardware.catalog import Dtype
from models.graph import ModelGraph
from planner.strategy import short_spec

if TYPE_CHECKING:  # type names only: `planner show` renders without loading the cost model
    from planner.cost import Estimate
    from planner.data.result import DataPlan
    from planner.plan.schema import Plan

GB = 1e9


def count(n: float) -> str:
    """A parameter or token count with an SI suffix: 70.6B, 106.8K."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{suffix}"
    return f"{n:.0f}"


def gb(n: float) -> str:
    """Bytes as GB with one decimal."""
    return f"{n / GB:.1f}"


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """A plain aligned table; columns whose index is in `right` are right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(out).rstrip()

    return "\n".join([line(cells[0]), line(["-" * w for w in widths]), *(line(r) for r in cells[1:])])


def family(graph: ModelGraph) -> str:
    """Family with a MoE marker: 'decoder', 'decoder moe', 'recsys'."""
    return f"{graph.family} moe" if graph.num_experts else graph.family


def models_table(rows: Sequence[dict[str, Any]]) -> str:
    """`list models`: rows with name, params, active_params, family, source."""
    body = [
        [r["name"], count(r["params"]),
         count(r["active_params"]) if r["active_params"] != r["params"] else "", r["family"],
         _truncate(r["source"], 72)]
        for r in rows
    ]
    return table(["name", "params", "active", "family", "source"], body, right=(1, 2))


def _peak_flops(device: DeviceSpec) -> float:
    """The 16-bit dense peak the cost model uses (bf16, else fp16), 0 when absent."""
    try:
        return device.peak("bf16")
    except ValueError:  # HardwareInputError: no 16-bit peak in the catalog
        return 0.0


def _peak(device: DeviceSpec, dtype: Dtype = "bf16") -> str:
    """TFLOP/s of `dtype` as a column value: bf16 falls back to fp16; others as listed."""
    flops = _peak_flops(device) if dtype == "bf16" else device.peak_flops.get(dtype, 0.0)
    return f"{flops / 1e12:.0f}" if flops else "-"


def _limit(node: NodeSpec, device: DeviceSpec) -> str:
    """' (x0.82 at 750 W)': the share of the peak a node's power or clock limit leaves its GPUs, if any."""
    if device.throughput_scale == 1.0:
        return ""
    limits = [f"{node.gpu_power_limit:g} W" if node.gpu_power_limit else "",
              f"{node.gpu_clock_limit:g} MHz" if node.gpu_clock_limit else ""]
    return f" (x{device.throughput_scale:.2f} at {', '.join(filter(None, limits))})"


def hardware_tables(catalog: Catalog) -> str:
    """`list hardware`: the device catalog and the node presets."""
    devices = [
        [d.name, d.vendor, _peak(d, "bf16"), _peak(d, "fp8"), f"{d.hbm_bytes / GB:.0f}",
         f"{d.hbm_bandwidth / 1e12:.2f}", f"{d.price_per_hour:.2f}"]
        for d in catalog.devices.values()
    ]
    nodes = [
        [n.name, f"{n.device} x {n.gpus_per_node}", n.intra_link.kind, f"{n.intra_link.bandwidth / GB:.0f}",
         f"{n.gpus_per_node * n.nvlink_domain_nodes}", f"{n.nic_count} x {n.nic_bandwidth * 8 / GB:.0f} Gb/s",
         f"{n.host_dram_bytes / GB:.0f}"]
        for n in catalog.nodes.values()
    ]
    return "\n".join([
        "devices",
        table(["name", "vendor", "bf16/fp16 TFLOP/s", "fp8 TFLOP/s", "HBM GB", "HBM TB/s", "$/GPU-h"],
              devices, right=(2, 3, 4, 5, 6)),
        "",
        "node presets (link GB/s per GPU per direction; domain: GPUs the intra link joins, 18 trays' on "
        "gb200-nvl72; use as PRESET:NODES, e.g. dgx-h100:4)",
        table(["name", "gpus", "intra link", "GB/s", "domain", "NICs", "host DRAM GB"], nodes, right=(3, 4, 6)),
    ])


def model_summary(graph: ModelGraph, seq_len: int) -> str:
    """`show MODEL`: sizes, layers by kind, FLOPs per token."""
    heads = f"{graph.heads}/{graph.kv_heads}" if graph.family != "recsys" else "-"
    lines = [
        f"{graph.name} ({family(graph)})",
        f"  params         {count(graph.params)} ({graph.params:,})",
        f"  active params  {count(graph.active_params)} ({graph.active_params:,})",
        f"  blocks         {graph.num_blocks}",
        f"  hidden         {graph.hidden}",
        f"  heads/kv       {heads}",
        f"  vocab          {graph.vocab or '-'}",
        f"  experts        {graph.num_experts or '-'}",
    ]
    if graph.source:
        lines.append(f"  source         {graph.source}")
    if graph.family == "recsys":
        lines.append(f"  FLOPs/sample   {graph.model_flops_per_token(1):.3g} training (fwd+bwd)")
    else:
        flops = graph.model_flops_per_token(seq_len)
        lines.append(f"  FLOPs/token    {flops:.3g} training (fwd+bwd) at seq {seq_len}; "
                     f"6N = {6 * graph.active_params:.3g}")
    lines.append("")
    kinds: dict[str, list[int]] = {}
    for layer in graph.layers:
        entry = kinds.setdefault(str(layer.kind), [0, 0])
        entry[0] += 1
        entry[1] += layer.params
    rows = [[k, n, count(p), f"{100 * p / graph.params:.1f}%"] for k, (n, p) in kinds.items()]
    lines.append(table(["layer kind", "count", "params", "share"], rows, right=(1, 2, 3)))
    return "\n".join(lines)


def node_summary(node: NodeSpec, device: DeviceSpec) -> str:
    """`show PRESET`: one node preset and its device."""
    link = node.intra_link
    lines = [
        f"node preset {node.name}: {node.gpus_per_node}x {device.name} (use as {node.name}:NODES)",
        f"  device         {device.name} ({device.vendor}): bf16 {_peak(device)} TFLOP/s, "
        f"HBM {device.hbm_bytes / GB:.0f} GB at {device.hbm_bandwidth / 1e12:.2f} TB/s, "
        f"${device.price_per_hour:.2f}/GPU-h",
        f"  intra link     {link.kind}, {link.bandwidth / GB:.0f} GB/s per GPU per direction, "
        f"{link.latency * 1e6:.1f} us",
        *([f"  NVLink domain  {node.nvlink_domain_nodes} nodes ({node.nvlink_domain_nodes * node.gpus_per_node} "
           "GPUs): the intra link joins them too (use a multiple of it as NODES for whole domains)"]
          if node.nvlink_domain_nodes > 1 else []),
        f"  NICs           {node.nic_count} x {node.nic_bandwidth * 8 / GB:.0f} Gb/s "
        f"({node.nic_bandwidth_per_gpu / GB:.1f} GB/s per GPU)",
        f"  host DRAM      {node.host_dram_bytes / GB:.0f} GB",
        f"  NVMe           {node.nvme_bytes / 1e12:.2f} TB at {node.nvme_bandwidth / GB:.0f} GB/s",
        f"  PCIe           {node.pcie_bandwidth / GB:.0f} GB/s per GPU per direction",
        "  sources",
        *(f"    - {s}" for s in node.sources),
    ]
    return "\n".join(lines)


def _domains(pool: Pool) -> str:
    """'  pool p: NVLink domains 2 x 18 nodes + 1 x 4 nodes (4 GPUs per node)': how a pool's nodes share NVLink
    fabrics (ranks fill them in order)."""
    whole, rest = divmod(pool.count, pool.node.nvlink_domain_nodes)
    parts = [f"{whole} x {pool.node.nvlink_domain_nodes} nodes" if whole else "", f"1 x {rest} nodes" if rest else ""]
    return (f"  pool {pool.name}: NVLink domains {' + '.join(filter(None, parts))} "
            f"({pool.node.gpus_per_node} GPUs per node)")


def cluster_summary(cluster: Cluster, catalog: Catalog) -> str:
    """`show CLUSTER`: totals, fabric, and one row per pool."""
    fabric = cluster.fabric
    cap = f", NIC rate capped at {fabric.bandwidth_per_nic * 8 / GB:.0f} Gb/s" if fabric.bandwidth_per_nic else ""
    rows = []
    peak = hbm = 0.0
    for pool in cluster.pools:
        node = pool.node
        device = catalog.node_device(node)
        peak += pool.gpus * _peak_flops(device)
        hbm += pool.gpus * device.hbm_bytes
        rows.append([
            pool.name, pool.count, node.name, f"{device.name} x {node.gpus_per_node}", pool.gpus,
            _peak(device) + _limit(node, device), f"{device.hbm_bytes / GB:.0f}",
            f"{node.intra_link.kind} {node.intra_link.bandwidth / GB:.0f}",
            f"{node.nic_count} x {node.nic_bandwidth * 8 / GB:.0f} Gb/s",
            f"{cluster.inter_node_bandwidth_per_gpu(pool) / GB:.1f}", f"{node.host_dram_bytes / GB:.0f}",
        ])
    lines = [
        f"cluster {cluster.name}: {len(cluster.pools)} pool(s), {cluster.num_nodes} nodes, {cluster.num_gpus} GPUs"
        f"{'' if cluster.is_homogeneous else ' (heterogeneous)'}",
        f"  bf16 peak {peak / 1e15:.1f} PFLOP/s, HBM {hbm / 1e12:.2f} TB in total",
        f"  fabric: latency {fabric.latency * 1e6:.1f} us, oversubscription {fabric.oversubscription:g}{cap}",
        *(_domains(pool) for pool in cluster.pools if pool.node.nvlink_domain_nodes > 1),
        "",
        table(["pool", "nodes", "preset", "gpus/node", "GPUs", "bf16 TFLOP/s", "HBM GB", "intra link GB/s",
               "NICs", "inter GB/s/GPU", "host DRAM GB"], rows, right=(1, 4, 5, 6, 9, 10)),
    ]
    return "\n".join(lines)


_BREAKDOWN = [
    ("compute_s", "compute (fwd+bwd)"), ("recompute_s", "recompute"), ("tp_comm_s", "tensor-parallel comm"),
    ("cp_comm_s", "context-parallel comm"), ("ep_comm_s", "expert-parallel comm"),
    ("pp_comm_s", "pipeline p2p"), ("dp_comm_s", "data-parallel comm (exposed)"), ("bubble_s", "pipeline bubble"),
    ("optimizer_s", "optimizer step"), ("offload_s", "offload (exposed)"),
]


def estimate_report(estimate: Estimate, title: str) -> str:
    """`estimate`: throughput, step time, utilisation, memory per stage, time breakdown, fit."""
    mem = estimate.memory
    lines = [
        title,
        f"strategy     {short_spec(estimate.strategy_spec)}",
        "",
        f"throughput   {estimate.tokens_per_s:,.0f} tokens/s ({estimate.tokens_per_s_per_gpu:,.0f} per GPU, "
        f"{estimate.num_gpus} GPUs)",
        f"step time    {estimate.step_time_s:.3f} s ({estimate.micro_batches} micro-batch"
        f"{'' if estimate.micro_batches == 1 else 'es'} per replica)",
        f"             {estimate.interval.text()}",
        f"MFU          {100 * estimate.mfu:.1f}%  (HFU {100 * estimate.hfu:.1f}%)",
        "",
        "memory per GPU (GB)",
    ]
    rows = []
    for st in mem.per_stage:
        blocks = f"{st.blocks[0]}-{st.blocks[-1]}" if st.blocks else "-"
        other = st.buffers_bytes + st.reserve_bytes
        rows.append([
            st.stage, blocks, st.device, gb(st.weights_bytes), gb(st.grads_bytes), gb(st.optimizer_bytes),
            gb(st.activations_bytes), gb(other), gb(st.peak_bytes), gb(st.capacity_bytes),
            "yes" if st.fits else "NO",
        ])
    lines.append(table(["stage", "blocks", "device", "weights", "grads", "optimizer", "activations",
                        "buffers+reserve", "total", "capacity", "fits"], rows, right=tuple(range(3, 10))))
    host = mem.host
    if host.dram_bytes or host.nvme_bytes:
        lines.append(f"host per node: DRAM {gb(host.dram_bytes)} of {gb(host.dram_capacity_bytes)} GB, "
                     f"NVMe {gb(host.nvme_bytes)} of {gb(host.nvme_capacity_bytes)} GB")
    br = estimate.breakdown
    step = estimate.step_time_s or 1.0
    rows = [[label, f"{getattr(br, key):.4f}", f"{100 * getattr(br, key) / step:.1f}%"]
            for key, label in _BREAKDOWN if getattr(br, key)]
    rows.append(["exposed communication (total)", f"{br.exposed_comm_s:.4f}", f"{100 * br.exposed_comm_s / step:.1f}%"])
    rows.append(["data-parallel comm incl. hidden", f"{br.dp_comm_total_s:.4f}", ""])
    lines += ["", "time per step (s, critical path of the slowest stage)",
              table(["term", "seconds", "of step"], rows, right=(1, 2)), ""]
    lines.append("fits: yes" if mem.fits else "fits: no")
    lines += [f"  - {reason}" for reason in mem.reasons]
    lines += confidence_lines(estimate.confidence.reasons)
    return "\n".join(lines)


def confidence_lines(reasons: list[str]) -> list[str]:
    """`confidence` and one line per term no validated published run covers (nothing when all are covered)."""
    if not reasons:
        return ["confidence   validated regime (hardware/data/validated.yaml)"]
    return ["confidence   extrapolated (details: report.md, --json):", *(f"             - {r}" for r in reasons)]


def compile_summary(plan: "Plan", wall_s: float) -> str:
    """`compile`: the chosen strategy, throughput, stages, the certificate and the best runner-up."""
    job, t, s = plan.job, plan.time, plan.solver
    kernel = "" if job.flash_attention else ", no flash attention"
    lines = [
        f"{job.model} on {job.cluster_description}",
        f"batch {job.global_batch} x {job.seq_len} tokens, {job.precision}{kernel}, {job.runtime} runtime"
        + (f", {100 * job.memory_margin:g}% of HBM left free" if job.memory_margin else ""),
        f"strategy     {plan.strategy_spec if plan.groups else short_spec(plan.strategy_spec)}",
        "",
        f"throughput   {t.tokens_per_s:,.0f} tokens/s ({t.tokens_per_s_per_gpu:,.0f} per GPU, {job.num_gpus} GPUs)",
        f"step time    {t.step_time_s:.4g} s ({_step_detail(plan)})",
        *([f"             {t.interval.text()}"] if t.interval else []),
        f"MFU          {100 * t.mfu:.1f}%  (HFU {100 * t.hfu:.1f}%)",
        "",
    ]
    if plan.groups:
        rows = [[g.pool, g.batch, f"{g.first_rank}-{g.first_rank + g.plan.job.num_gpus - 1}",
                 short_spec(g.plan.strategy_spec), f"{g.plan.time.step_time_s:.4g}", gb(g.plan.memory.peak_bytes),
                 gb(g.plan.memory.capacity_bytes)] for g in plan.groups]
        lines.append(table(["group", "batch", "ranks", "strategy", "step s", "HBM GB", "capacity"], rows,
                           right=(1, 4, 5, 6)))
    else:
        lines.append(_stages(plan))
    unit = "s" if s.objective_kind == "time" else "USD"
    lines += [
        "",
        f"solver       {s.status}: objective {s.objective:.6g} {unit}, bound {s.bound:.6g} {unit}, "
        f"gap {100 * s.gap:.2f}%",
        f"             {s.configurations} configurations: {s.solved} solved, {s.pruned} pruned, in {wall_s:.2f} s",
    ]
    if s.stopped == "time_limit":
        lines.append(f"             stopped by the time limit ({s.time_limit_s:g} s): not reproducible, another run "
                     "may choose differently")
    pref = plan.preference
    if pref is not None and not pref.chose_optimum:
        worse = 100 * (t.step_time_s / pref.optimum_step_time_s - 1)
        lines += [f"optimum      {short_spec(pref.optimum_spec)} ({pref.optimum_step_time_s:.4g} s, the plan "
                  f"{worse:+.2f}%: inside the model's error)",
                  *(f"             set aside (--prefer validated): {r}" for r in pref.reasons)]
    elif plan.runners_up:
        r = plan.runners_up[0]
        within = ", inside the model's error" if r.within_error else ""
        lines.append(f"runner-up    {short_spec(r.strategy_spec)} ({r.worse_pct:+.2f}%{within})")
    lines += confidence_lines(plan.confidence.reasons)
    return "\n".join(lines)


def _step_detail(plan: "Plan") -> str:
    if plan.groups:
        return f"slowest of {len(plan.groups)} replica groups + gradient sync"
    m = plan.time.micro_batches
    return f"{m} micro-batch{'' if m == 1 else 'es'} per replica"


def _stages(plan: "Plan") -> str:
    rows = []
    for st in plan.stages:
        blocks = f"{st.blocks[0]}-{st.blocks[-1]}" if st.blocks else "-"
        r = st.ranks
        nodes = f"{r.nodes[0]}" if r.nodes[0] == r.nodes[1] else f"{r.nodes[0]}-{r.nodes[1]}"
        rows.append([st.index, blocks, "/".join(st.pools), st.device, f"{r.first_rank}-{r.last_rank}", nodes,
                     st.recompute_blocks, gb(st.memory.hbm.peak_bytes), gb(st.memory.hbm.capacity_bytes),
                     f"{1e3 * st.microbatch_time_s:.2f}"])
    return table(["stage", "blocks", "pool", "device", "ranks", "nodes", "recompute", "HBM GB", "capacity",
                  "micro-batch ms"], rows, right=(6, 7, 8, 9))


def data_summary(data: DataPlan) -> str:
    """compile's lines for a data plan: its step against the best static plan on the same data."""
    buckets = ", ".join(f"cp={b.cp}: {b.sequences} seq {b.min_tokens}-{b.max_tokens} tok" for b in data.buckets)
    return (f"data         {data.profile}: {data.sequences} sequences, {data.tokens:,} tokens per step\n"
            f"             plan {data.layout} {data.step_time_s:.4g} s (bound {data.bound_s:.4g} s) vs best static "
            f"{data.baseline_step_time_s:.4g} s ({data.baseline.split(' ')[0]}, "
            f"cp={data.baseline.split('cp=')[1].split(',')[0]}): {data.speedup:.3f}x (cost-model predictions)"
            + (f"\n             buckets {buckets}" if buckets else ""))
