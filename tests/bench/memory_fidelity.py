"""Memory ground truth (issue 15, item 1): the planner runtime's measured memory vs the cost model's.

    python tests/bench/memory_fidelity.py            # the whole grid (about 5 minutes on 2 cores)
    python tests/bench/memory_fidelity.py --quick    # 4 plans (about a minute)
    python tests/bench/memory_fidelity.py --only pp=2 --json out.json

Each plan is built from its SPEC with the library (`evaluate` under the `planner` runtime profile, then
`build_single_plan`: the plan.json `planner compile --target torch` would write for that strategy), run
for 2 steps on `cpu:1` (4 "GPUs": 4 torchrun processes, gloo, OMP_NUM_THREADS=1) by
`python -m planner.runtime.train --measure-memory`, which measures the last step on every rank
(planner/runtime/memory_probe.py: states at rest from the objects, saved-for-backward bytes through
saved_tensors_hooks, live tensor bytes through a TorchDispatchMode, FSDP2's gathered parameters).

Per plan, one column per group of ranks that measured the same (ranks of one stage usually do), and one
row per component: measured bytes, predicted bytes (plan.json `stages[i].memory.hbm`, the cost model's
per-stage terms), measured / predicted:

  weights      local parameter bytes                   vs weights_bytes
  grads        local gradient bytes after the step     vs grads_bytes
  optimizer    bytes in optimizer.state                vs optimizer_bytes
  act/mb       saved for backward per micro-batch      vs the stage's kept activations per micro-batch
  in-flight    forward-saved peak / saved per micro-batch   vs in_flight_microbatches()
  activations  saved bytes at their peak, recomputation included   vs the saved part of activations_bytes
               (kept x in-flight + a recomputed block's extra, StageSums.recompute_extra; the loss's transient
               and the logits a pipeline keeps are not saved tensors: the peak row holds them)
  buffers      FSDP2 gathered weights + unsharded grads at their peak  vs buffers_bytes
  peak         live tensor bytes at the step's peak    vs the plan's peak less its reserve: weights + grads +
               optimizer + activations + buffers, less the gradients allocated after the peak

then the summary per component over every rank of every plan (median and range of measured / predicted)
and the saved-for-backward bytes per layer kind (measured / predicted) that explain the activations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from hardware import load_catalog, load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from models.graph import LayerKind  # noqa: E402
from planner.cost import evaluate  # noqa: E402
from planner.cost.evaluate import micro_batches, stage_cost  # noqa: E402
from planner.cost.layout import place_stages  # noqa: E402
from planner.cost.memory import head_in_flight, in_flight_microbatches, saved_bytes  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.plan.build import build_single_plan  # noqa: E402
from planner.plan.schema import Plan, plan_json  # noqa: E402
from planner.profile import RuntimeProfile, load_runtime  # noqa: E402
from planner.search.result import Certificate, CompileOptions, CompileResult  # noqa: E402
from planner.strategy import parse_strategy  # noqa: E402
from planner.validation import check_strategy  # noqa: E402
from ports import free_port  # noqa: E402

CLUSTER = "cpu:1"
# A llama of 27M parameters (6 x 3.15M blocks, 4.2M embedding and head) that trains 2 steps in seconds.
SMALL = {"builder": "llama", "name": "small-llama-27m", "num_layers": 6, "hidden": 512, "heads": 8, "kv_heads": 4,
         "ffn": 1536, "vocab": 8192, "max_positions": 512}

# (model, global batch, seq_len, SPEC); the model is a zoo name or "small" (SMALL above)
GRID = [
    ("tiny-llama", 8, 64, "dp=4,zero=0"),
    ("tiny-llama", 8, 64, "dp=4,zero=1"),
    ("tiny-llama", 8, 64, "dp=4,zero=2"),
    ("tiny-llama", 8, 64, "dp=4,zero=3"),
    ("tiny-llama", 8, 64, "tp=2,dp=2,zero=0"),
    ("tiny-llama", 8, 64, "tp=2,dp=2,zero=2"),
    ("tiny-llama", 8, 64, "tp=2,dp=2,zero=3,sp=off"),
    ("tiny-llama", 8, 64, "pp=2,dp=2,zero=0"),
    ("tiny-llama", 8, 64, "pp=2,dp=2,zero=1"),
    ("tiny-llama", 8, 64, "pp=2,dp=2,zero=3"),
    ("tiny-llama", 8, 64, "pp=2,tp=2"),
    ("tiny-llama", 8, 64, "pp=2,vpp=2,dp=2,zero=2,schedule=interleaved"),
    ("tiny-llama", 8, 64, "pp=2,vpp=2,tp=2,schedule=interleaved"),
    ("tiny-llama", 8, 64, "cp=2,dp=2,zero=2"),
    ("tiny-llama", 8, 64, "cp=2,tp=2"),
    ("tiny-llama", 8, 64, "dp=4,zero=1,recompute=full"),
    ("tiny-llama", 8, 64, "dp=4,zero=0,recompute=full,recompute_layers=2"),
    ("tiny-llama", 8, 64, "pp=2,dp=2,zero=0,recompute=full,recompute_layers=1/2"),
    ("tiny-llama", 8, 64, "dp=4,zero=2,recompute=selective"),
    ("small", 8, 128, "dp=4,zero=2"),
    ("small", 8, 128, "tp=2,dp=2,zero=3"),
    ("small", 8, 128, "pp=2,dp=2,zero=1"),
]
QUICK = [GRID[3], GRID[5], GRID[9], GRID[15]]

# ---------------------------------------------------------------- what the runtime saves


def runtime_saved_bytes(kind: str, *, hidden: int, ffn: int, heads: int, head_dim: int, vocab: int, mbs: int,
                        seq_len: int, tp: int = 1, sp: bool = False, cp: int = 1, checkpointed: bool = False) -> float:
    """Bytes the planner runtime saves for backward per micro-batch for one layer of `kind`, derived from its
    autograd graph (fp32 everywhere; tests/test_memory_fidelity.py holds the measurement to it):

    attention  4 T [(2h+1)/t_sp + h + a d (2 + 2 cp)/tp + a/tp] + 4 (S/cp) S [cp > 1]
               RMSNorm keeps its input, x * rstd and rstd (2h+1, split by sequence parallelism); the Q/K/V
               projections keep the norm's output, all-gathered to the whole sequence under sequence
               parallelism (h); SDPA keeps Q, K and V (K and V after repeat_interleave to every head, and
               all-gathered over cp), its output (also the input of wo) and its logsumexp (a per token);
               under cp the causal mask goes to SDPA as an fp32 (S/cp) x S matrix per layer.
    mlp        4 T [(2h+1)/t_sp + h + 4 f/tp]: norm as above, w1/w3 input, silu input, silu output, up, product.
    final_norm 4 T (2h+1)/t_sp.
    head       4 T (h + V): its input all-gathered, fp32 log-softmax of logits gathered to the whole vocab.
    embedding  0: it keeps the token ids, which are the input batch.
    A block under full activation checkpointing keeps only its input: 4 T h / t_sp (on its attention).

    T = mbs x seq_len / cp tokens of the micro-batch on this rank, S = seq_len, t_sp = tp with sequence
    parallelism, else 1.
    """
    tokens = mbs * seq_len / cp
    t_sp = tp if sp else 1
    h = hidden
    if kind == "attention":
        if checkpointed:
            return 4 * tokens * h / t_sp
        mask = 4 * (seq_len / cp) * seq_len if cp > 1 else 0.0
        return 4 * tokens * ((2 * h + 1) / t_sp + h + heads * head_dim * (2 + 2 * cp) / tp + heads / tp) + mask
    if kind == "mlp":
        return 0.0 if checkpointed else 4 * tokens * ((2 * h + 1) / t_sp + h + 4 * ffn / tp)
    if kind == "final_norm":
        return 4 * tokens * (2 * h + 1) / t_sp
    if kind == "head":
        return 4 * tokens * (h + vocab)
    return 0.0


def runtime_stage_saved(plan: Plan, job: Job, stage: int, config) -> dict[str, float]:
    """runtime_saved_bytes summed by layer kind over the layers of `stage`, per micro-batch."""
    s = check_strategy(job, plan.strategy)
    placement = place_stages(job, s, load_catalog())[stage]
    view = s.for_stage(stage)
    out: dict[str, float] = defaultdict(float)
    for layer in placement.layers:
        kind = LAYER_KINDS.get(layer.kind, layer.kind.value)
        mode = view.layer_recompute(layer.block, stage, placement.blocks)
        out[kind] += runtime_saved_bytes(
            kind, hidden=config.hidden, ffn=config.ffn, heads=config.heads, head_dim=config.head_dim,
            vocab=config.vocab, mbs=s.mbs, seq_len=job.seq_len, tp=s.tp, sp=s.sequence_parallel, cp=s.cp,
            checkpointed=mode == "full")
    return dict(out)


def transformer_config(model: str):
    """The TransformerConfig of a GRID model."""
    from models.zoo import get_entry
    from planner.runtime.train import spec_config

    if model == "small":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "small.json"
            path.write_text(json.dumps(SMALL))
            return spec_config(path)
    return get_entry(model).config


COMPONENTS = ("weights", "grads", "optimizer", "act/mb", "in-flight", "activations", "buffers", "peak")
LAYER_KINDS = {LayerKind.EMBEDDING: "embedding", LayerKind.ATTENTION: "attention", LayerKind.MLP: "mlp",
               LayerKind.NORM: "final_norm", LayerKind.HEAD: "head"}


# ---------------------------------------------------------------- plans and predictions


def model_arg(model: str, workdir: Path) -> tuple[str, Path | None]:
    """(what load_model takes, the --model-spec file or None) of a GRID model."""
    if model != "small":
        return model, None
    spec = workdir / "small-llama.json"
    spec.write_text(json.dumps(SMALL))
    return str(spec), spec


def fp32_runtime() -> RuntimeProfile:
    """The planner profile as the bench runs it (`--precision fp32`): every compute-dtype save of its
    activations section is 4 bytes, and so are the logits a pipeline's last stage keeps (the model's output
    dtype) and FSDP2's gathered copies and unsharded gradients; its states and loss are the fp32 ones already."""
    runtime = load_runtime("planner")
    activations = runtime.activations.model_copy(update={"compute_bytes": 4.0})
    loss = runtime.loss.model_copy(update={"pipeline_outputs": 4.0})
    gathering = runtime.gathering.model_copy(update={"bytes_per_param": 4.0, "grad_bytes_per_param": 4.0,
                                                     "accumulated_grad_bytes_per_param": 4.0})
    return runtime.model_copy(update={"activations": activations, "loss": loss, "gathering": gathering})


def build_plan(model: str, batch: int, seq_len: int, spec: str, precision: str = "fp32") -> tuple[Job, Plan]:
    """The plan of `spec` for the job, costed under the planner runtime profile (as `precision` runs it),
    as compile would write it."""
    runtime = fp32_runtime() if precision == "fp32" else load_runtime("planner")
    job = Job(model=load_model(model), cluster=load_cluster(CLUSTER), global_batch=batch,
              seq_len=seq_len).on(runtime)
    strategy = parse_strategy(spec)
    problems = job.runtime.cannot_express(strategy)
    if problems:
        raise ValueError(f"{spec}: the planner runtime cannot run {', '.join(problems)}")
    estimate = evaluate(job, strategy)
    cert = Certificate(status="OPTIMAL", objective=estimate.step_time_s, bound=estimate.step_time_s, gap=0.0,
                       wall_s=0.0, configurations=1, solved=1, pruned=0)
    result = CompileResult(strategy=strategy, estimate=estimate, certificate=cert, runners_up=[])
    return job, build_single_plan(job, result, CompileOptions())


def predict(job: Job, plan: Plan) -> list[dict]:
    """Per stage: the plan's memory terms and the cost model's pieces of the activations."""
    catalog = load_catalog()
    s = check_strategy(job, plan.strategy)
    m = micro_batches(job, s)
    out = []
    for stage, placement in zip(plan.stages, place_stages(job, s, catalog)):
        hbm = stage.memory.hbm
        view = s.for_stage(placement.index)
        sums = stage_cost(job, s, placement, catalog).sums
        by_layer: dict[str, float] = defaultdict(float)
        for layer in placement.layers:
            mode = view.layer_recompute(layer.block, placement.index, placement.blocks)
            by_layer[LAYER_KINDS.get(layer.kind, layer.kind.value)] += saved_bytes(layer, job, view, mode)
        in_flight = in_flight_microbatches(view, placement.index, m)
        # a recomputed block's saves count, the loss's transient (not saved tensors) does not
        saved_peak = (sums.kept_activations * in_flight + sums.head_activations * head_in_flight(view, m)
                      + sums.recompute_extra)
        allocated = hbm.peak_bytes - hbm.reserve_bytes  # the parts that coincide at the peak, without the reserve
        out.append({
            "weights": hbm.weights_bytes, "grads": hbm.grads_bytes, "optimizer": hbm.optimizer_bytes,
            "act/mb": sums.kept_activations + sums.head_activations, "in-flight": in_flight, "activations": saved_peak,
            "working_set": sums.backward_extra, "buffers": hbm.buffers_bytes, "peak": allocated,
            "by_layer": dict(by_layer),
        })
    return out


def measured_components(mem: dict) -> dict:
    """The bench's components from one rank's `memory` report."""
    per_mb = mem["saved_per_microbatch"]
    return {
        "weights": mem["param_bytes"], "grads": mem["grad_bytes"], "optimizer": mem["optimizer_bytes"],
        "act/mb": per_mb, "in-flight": mem["saved_forward_peak"] / per_mb if per_mb else 0.0,
        "activations": mem["saved_peak"], "buffers": mem["gathered_peak"], "peak": mem["live_peak"],
    }


# ---------------------------------------------------------------- running


TORCHRUN = (sys.executable, "-m", "torch.distributed.run")


def run_plan(plan: Plan, workdir: Path, *, model_spec: Path | None = None, steps: int = 2,
             timeout: float = 300, precision: str = "fp32", torchrun: Sequence[str] = TORCHRUN) -> dict[int, dict]:
    """Train `plan` for `steps` steps under torchrun with --measure-memory; each rank's `memory` report.
    `torchrun`: the launcher's argv before torchrun's arguments (the suite passes tests/warm_torchrun.py)."""
    data = run_report(plan, workdir, model_spec=model_spec, steps=steps, timeout=timeout, precision=precision,
                      torchrun=torchrun)
    return {int(rank): mem for rank, mem in data["memory"].items()}


def run_report(plan: Plan, workdir: Path, *, model_spec: Path | None = None, steps: int = 2,
               timeout: float = 300, precision: str = "fp32", torchrun: Sequence[str] = TORCHRUN) -> dict:
    """run_plan's launch; the trainer's whole JSON report (`memory` per rank, `compute_dtype`, losses, ...)."""
    workdir.mkdir(parents=True, exist_ok=True)
    plan_path, report = workdir / "plan.json", workdir / "report.json"
    plan_path.write_text(plan_json(plan))
    port = free_port()
    cmd = [*torchrun, "--nnodes", "1",
           "--nproc_per_node", str(plan.job.num_gpus), "--rdzv_backend", "c10d",
           "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"memory-{port}",
           "-m", "planner.runtime.train", "--plan", str(plan_path), "--steps", str(steps),
           "--measure-memory", "--report", str(report),
           # fp32 by default: runtime_saved_bytes is the fp32 runtime's (the trainer's default is the plan's
           # bf16 mixed precision, which --precision bf16 measures)
           "--precision", precision]
    if model_spec is not None:
        cmd += ["--model-spec", str(model_spec)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=workdir)
    if run.returncode != 0:
        raise RuntimeError(f"{plan.strategy_spec}: torchrun failed\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return json.loads(report.read_text())


def stage_of(plan: Plan, rank: int) -> int:
    s = plan.strategy
    return rank // (s.tp * s.cp * s.dp)


def compare(plan: Plan, predicted: list[dict], measured: dict[int, dict],
            formula: list[dict] | None = None) -> list[dict]:
    """One row per rank: stage, then per component (measured, predicted, measured / predicted); by layer
    kind the saved bytes per micro-batch (measured, predicted, ratio, runtime_saved_bytes)."""
    rows = []
    for rank in sorted(measured):
        stage = stage_of(plan, rank)
        got, want = measured_components(measured[rank]), predicted[stage]
        row = {"rank": rank, "stage": stage, "components": {}, "by_layer": {}}
        for c in COMPONENTS:
            row["components"][c] = (got[c], want[c], got[c] / want[c] if want[c] else None)
        saved = dict(measured[rank]["saved_by_layer"])
        saved["head"] = saved.get("head", 0.0) + saved.pop("loss", 0.0)  # the model's head holds the loss's logits
        for kind in sorted(set(saved) | set(want["by_layer"])):
            got_k, want_k = saved.get(kind, 0.0), want["by_layer"].get(kind, 0.0)
            derived = formula[stage].get(kind, 0.0) if formula else None
            row["by_layer"][kind] = (got_k, want_k, got_k / want_k if want_k else None, derived)
        row["peak_by_kind"] = measured[rank]["peak_by_kind"]
        row["gathered"] = {k: measured[rank][k] for k in ("gathered_weights_peak", "gathered_grads_peak")}
        row["raw"] = measured[rank]
        row["working_set"] = want["working_set"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------- printing


def _bytes(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.3g}"


def _ratio(r: float | None) -> str:
    return "  -  " if r is None else f"{r:.3f}"


def print_plan(title: str, rows: list[dict]) -> None:
    """The plan's table: a column group per set of ranks that measured the same."""
    groups: dict[tuple, list[int]] = {}
    first: dict[tuple, dict] = {}
    for row in rows:
        key = (row["stage"], tuple(row["components"][c][0] for c in COMPONENTS))
        groups.setdefault(key, []).append(row["rank"])
        first.setdefault(key, row)
    print(title)
    head = f"  {'component':<12}" + "".join(
        f" | {'ranks ' + ','.join(map(str, ranks)) + ' (st ' + str(key[0]) + ')':<27}" for key, ranks in groups.items())
    print(head)
    print(f"  {'':<12}" + "".join(f" | {'measured':>9} {'predicted':>9} {'m/p':>6}" for _ in groups))
    for c in COMPONENTS:
        line = f"  {c:<12}"
        for key in groups:
            got, want, ratio = first[key]["components"][c]
            if c == "in-flight":
                line += f" | {got:>9.2f} {want:>9.2f} {_ratio(ratio):>6}"
            else:
                line += f" | {_bytes(got):>9} {_bytes(want):>9} {_ratio(ratio):>6}"
        print(line)
    for key in groups:
        row = first[key]
        kinds = ", ".join(f"{k} {_bytes(v)}" for k, v in row["peak_by_kind"].items())
        layers = ", ".join(f"{k} {_bytes(g)}/{_bytes(w)}" for k, (g, w, _, _) in row["by_layer"].items() if g or w)
        print(f"  st {key[0]} peak = {kinds}")
        if any(row["gathered"].values()):
            gathered = row["gathered"]
            print(f"  st {key[0]} FSDP2 gathered at their peaks: weights {_bytes(gathered['gathered_weights_peak'])}"
                  f", unsharded grads {_bytes(gathered['gathered_grads_peak'])}")
        print(f"  st {key[0]} saved per micro-batch by layer, measured/predicted: {layers}"
              + (f"; predicted working set {_bytes(row['working_set'])}" if row["working_set"] else ""))
    print()


def print_summary(results: list[dict]) -> None:
    print("summary: measured / predicted over every rank of every plan (median [min, max]; n)")
    for c in COMPONENTS:
        ratios = [row["components"][c][2] for res in results for row in res["rows"]
                  if row["components"][c][2] is not None]
        zero = sum(1 for res in results for row in res["rows"] if row["components"][c][2] is None)
        within = sum(1 for r in ratios if abs(r - 1) <= 0.03)
        if ratios:
            print(f"  {c:<12} {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]; n={len(ratios)}, "
                  f"within 3%: {within}" + (f"; predicted 0 on {zero} ranks" if zero else ""))
    unmodelled = [(row["peak_by_kind"].get("other", 0), sum(row["peak_by_kind"].get(k, 0) for k in
                   ("other", "pipeline", "buffers", "inputs")), row["components"]["peak"][0])
                  for res in results for row in res["rows"]]
    print(f"  at the peak, share of bytes no cost-model term covers: transients (other) "
          f"{statistics.median(o / p for o, _, p in unmodelled):.1%} [{min(o / p for o, _, p in unmodelled):.1%}, "
          f"{max(o / p for o, _, p in unmodelled):.1%}]; with pipeline receive buffers, RoPE tables and the batch "
          f"{statistics.median(u / p for _, u, p in unmodelled):.1%} [{min(u / p for _, u, p in unmodelled):.1%}, "
          f"{max(u / p for _, u, p in unmodelled):.1%}]")
    print("saved for backward per micro-batch by layer kind (plans without recompute): measured / predicted "
          "(median [min, max]), and measured / runtime_saved_bytes (the runtime's own formula)")
    by_kind: dict[tuple, list[tuple]] = defaultdict(list)
    for res in results:
        if "recompute=full" in res["spec"]:
            continue
        for row in res["rows"]:
            for kind, (got, _, r, derived) in row["by_layer"].items():
                if r is not None:
                    by_kind[(res["model"], kind, res["tp"], res["sp"], res["cp"])].append(
                        (r, got / derived if derived else float("nan")))
    for (model, kind, tp, sp, cp), pairs in sorted(by_kind.items()):
        ratios, exact = [p[0] for p in pairs], [p[1] for p in pairs]
        print(f"  {model:<16} {kind:<11} tp={tp} sp={'on' if sp else 'off'} cp={cp}: {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}, {max(ratios):.3f}]   formula {min(exact):.4f}..{max(exact):.4f}")
    print("recompute=full plans, measured / runtime_saved_bytes per layer kind:")
    for res in results:
        if "recompute=full" not in res["spec"]:
            continue
        for row in res["rows"][:: max(1, len(res["rows"]) // 2)]:
            parts = [f"{k} {got / derived:.4f}" for k, (got, _, _, derived) in row["by_layer"].items() if derived]
            print(f"  {res['spec']} stage {row['stage']}: {', '.join(parts)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 plans instead of the whole grid.")
    parser.add_argument("--only", default=None, help="Plans whose model or SPEC contains this text.")
    parser.add_argument("--steps", type=int, default=2, help="Training steps per plan (the last is measured).")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="The trainer's precision (fp32: the whole table; bf16: the profile's own dtypes, with "
                        "FSDP2 mixed precision or autocast).")
    parser.add_argument("--json", type=Path, default=None, help="Write every row as JSON here.")
    args = parser.parse_args(argv)
    grid = QUICK if args.quick else GRID
    if args.only:
        grid = [g for g in grid if args.only in (SMALL["name"] if g[0] == "small" else g[0]) or args.only in g[3]]
    if not grid:
        parser.error(f"--only {args.only}: no plan of the grid matches")
    results = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memory-fidelity-") as tmp:
        for i, (model, batch, seq_len, spec) in enumerate(grid):
            workdir = Path(tmp) / f"plan-{i}"
            workdir.mkdir()
            arg, model_spec = model_arg(model, workdir)
            job, plan = build_plan(arg, batch, seq_len, spec, args.precision)
            t0 = time.perf_counter()
            measured = run_plan(plan, workdir, model_spec=model_spec, steps=args.steps, precision=args.precision)
            wall = time.perf_counter() - t0
            config = transformer_config(model)
            formula = [runtime_stage_saved(plan, job, i, config) for i in range(len(plan.stages))]
            rows = compare(plan, predict(job, plan), measured, formula)
            s = plan.strategy
            title = (f"{plan.job.model} b={batch} s={seq_len} {spec} -> m={plan.time.micro_batches} "
                     f"schedule={s.pipeline_schedule} ({wall:.1f} s)")
            print_plan(title, rows)
            sys.stdout.flush()
            results.append({"model": plan.job.model, "batch": batch, "seq_len": seq_len, "spec": spec,
                            "strategy": plan.strategy_spec, "tp": s.tp, "sp": s.sequence_parallel, "cp": s.cp,
                            "wall_s": wall, "rows": rows})
    print_summary(results)
    print(f"\n{len(results)} plans in {time.perf_counter() - start:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
