"""Launch files of the torchtitan, megatron, slurm and k8s targets, and golden files of every target."""

from __future__ import annotations

import importlib.util
import json
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from hardware import load_cluster
from models import load_model
from planner.cost import evaluate
from planner.emit import UnsupportedPlan, available_targets, emitter
from planner.emit.check import emit_targets
from planner.emit.megatron import megatron_args
from planner.emit.megatron_check import check_megatron_args
from planner.job import Job
from planner.plan.assemble import build_plan
from planner.search.compile import compile_job
from planner.search.result import Certificate, CompileOptions, CompileResult
from planner.search.space import SpaceOptions
from planner.profile import load_runtime
from planner.strategy import parse_strategy

GOLDEN = Path(__file__).parent / "golden"
REGEN = "python tests/golden/regenerate.py"


def _compile(model: str, cluster: str, batch: int, seq: int, fixed: dict, precision: str = "bf16"):
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq,
              precision=precision)
    options = CompileOptions(time_limit=20, space=SpaceOptions(fixed=fixed))
    return build_plan(job, compile_job(job, options), options), job


def _plan_of(job: Job, strategy):
    """The plan of a hand-written strategy (scored by evaluate, certified as itself)."""
    estimate = evaluate(job, strategy)
    cert = Certificate(status="OPTIMAL", objective=estimate.step_time_s, bound=estimate.step_time_s, gap=0.0,
                       wall_s=0.0, configurations=1, solved=1, pruned=0)
    result = CompileResult(strategy=strategy, estimate=estimate, certificate=cert, runners_up=[])
    return build_plan(job, result, CompileOptions())


def _with(plan, **strategy):
    """The plan with some strategy fields replaced (emitters read plan.strategy)."""
    return plan.model_copy(update={"strategy": plan.strategy.model_copy(update=strategy)})


@pytest.fixture(scope="module")
def tiny():
    return _compile("tiny-llama", "cpu:2", 8, 128, {"tp": 2, "pp": 2, "vpp": 1})


@pytest.fixture(scope="module")
def big():
    """llama3-70b on 64 H100s, tp=8 pp=4: the solver's split is 19/21/21/19."""
    return _compile("llama3-70b", "dgx-h100:8", 512, 4096, {"tp": 8, "pp": 4, "mbs": 1, "zero": 1})


@pytest.fixture(scope="module")
def interleaved():
    return _compile("llama3-70b", "dgx-h100:8", 512, 4096, {"tp": 8, "pp": 4, "mbs": 1, "vpp": 2, "zero": 1})


def _args(text: str) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for line in text.splitlines():
        flag, _, value = line.partition(" ")
        assert flag.startswith("--") and flag[2:] not in out, line
        out[flag[2:]] = value or True
    return out


# ---------------------------------------------------------------- torchtitan


def test_torchtitan_tiny(tiny):
    plan, job = tiny
    files = emitter("torchtitan")(plan, job)
    assert sorted(files) == ["README.md", "launch.sh", "train.toml"]
    cfg = tomllib.loads(files["train.toml"])
    p = cfg["parallelism"]
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["context_parallel_degree"]) == (2, 2, 1)
    assert p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] == plan.strategy.dp == 2
    assert p["pipeline_parallel_schedule"] == "1F1B"
    assert p["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0", "layers.1"],
                                               ["layers.2", "layers.3", "norm", "output"]]
    assert p["pipeline_parallel_microbatch_size"] == plan.strategy.mbs
    assert cfg["training"]["global_batch_size"] == 8 and cfg["training"]["seq_len"] == 128
    assert cfg["training"]["local_batch_size"] == 8 // 2  # all micro-batches of a replica go through the pipeline
    assert cfg["training"]["mixed_precision_param"] == "bfloat16"
    assert "quantize" not in cfg and "converters" not in cfg["model"]
    assert cfg["compile"] == {"enable": True, "components": ["model", "loss"]}
    assert '-m torchtitan.train --job.config_file "$here/train.toml"' in files["launch.sh"]
    assert "--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d" in files["launch.sh"]
    assert "torchtitan 0.2.2" in files["README.md"] and "v0.1.0" not in files["README.md"]


def test_torchtitan_dp_degrees(tiny):
    plan, job = tiny

    def degrees(**strategy):
        p = tomllib.loads(emitter("torchtitan")(_with(plan, **strategy), job)["train.toml"])["parallelism"]
        return p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"], p["fsdp_reshard_after_forward"]

    assert degrees(zero=0) == (2, 1, "default")
    assert degrees(zero=3, shard="full") == (1, 2, "default")
    assert degrees(zero=1, shard="full") == (1, 2, "never")
    assert degrees(zero=3, shard="node") == (1, 2, "default")  # both dp ranks sit in one 4-GPU node with tp=2


def test_torchtitan_hsdp_split(big):
    plan, job = big
    wide = _with(plan, tp=1, cp=1, pp=1, dp=64, zero=3, shard="node")
    wide = wide.model_copy(update={"stages": plan.stages[:1]})
    p = tomllib.loads(emitter("torchtitan")(wide, job)["train.toml"])["parallelism"]
    assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]) == (8, 8)


def _torchtitan_big(big):
    """llama3-70b on 64 H100s, tp=8 pp=4 split 19/21/21/19, as written (not whatever the solver picks today)."""
    _, job = big
    return _plan_of(job, parse_strategy("tp=8,pp=4,mbs=1,zero=1,split=19/21/21/19").with_dp(64)), job


def test_torchtitan_big(big):
    plan, job = _torchtitan_big(big)
    files = emitter("torchtitan")(plan, job)
    cfg = tomllib.loads(files["train.toml"])
    p = cfg["parallelism"]
    assert cfg["model"]["flavor"] == "70B"
    parts = p["module_fqns_per_model_part"]
    assert [part[0] for part in parts] == ["tok_embeddings", "layers.19", "layers.40", "layers.61"]
    assert [sum(name.startswith("layers.") for name in part) for part in parts] == [19, 21, 21, 19]
    assert cfg["training"]["local_batch_size"] == 512 // plan.strategy.dp


def test_torchtitan_interleaved(interleaved):
    plan, job = interleaved
    p = tomllib.loads(emitter("torchtitan")(plan, job)["train.toml"])["parallelism"]
    assert p["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = p["module_fqns_per_model_part"]  # 8 chunks of 10 blocks; chunk k on pipeline rank k % 4
    assert [sum(name.startswith("layers.") for name in part) for part in parts] == [10] * 8
    assert [part[1 if k == 0 else 0] for k, part in enumerate(parts)] == [f"layers.{10 * k}" for k in range(8)]


def test_torchtitan_recompute_fp8_offload(tiny, big):
    plan, job = _torchtitan_big(big)

    def ac(**strategy):
        files = emitter("torchtitan")(_with(plan, **strategy), job)
        return tomllib.loads(files["train.toml"])["activation_checkpoint"], files["README.md"]

    assert ac(recompute="none")[0] == {"mode": "none"}
    assert ac(recompute="selective")[0] == {"mode": "selective", "selective_ac_option": "op"}
    assert ac(recompute="full", recompute_layers=None)[0] == {"mode": "full"}
    section, readme = ac(recompute="full", recompute_layers=[2, 0, 0, 0])
    assert section == {"mode": "selective", "selective_ac_option": "9"}  # 19 // 2: every 9th block
    assert "2/0/0/0" in readme
    fp8_job = job.model_copy(update={"precision": "fp8"})
    cfg = tomllib.loads(emitter("torchtitan")(plan, fp8_job)["train.toml"])
    assert cfg["model"]["converters"] == ["quantize.linear.float8"]
    assert cfg["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True
    files = emitter("torchtitan")(_with(plan, zero=3, offload="params", offload_device="nvme"), job)
    assert tomllib.loads(files["train.toml"])["training"]["enable_cpu_offload"] is False
    assert "offload=params to nvme" in files["README.md"]
    files = emitter("torchtitan")(_with(plan, zero=3, offload="all"), job)
    assert tomllib.loads(files["train.toml"])["training"]["enable_cpu_offload"] is True
    files = emitter("torchtitan")(_with(plan, tp_overlap=True), job)
    cfg = tomllib.loads(files["train.toml"])
    assert cfg["parallelism"]["enable_async_tensor_parallel"] is True and cfg["compile"]["enable"] is True


# ---------------------------------------------------------------- megatron
# (tests/test_emit_megatron.py builds megatron-core's configs and model from the arguments)


def _megatron_big():
    """llama3-70b on 64 H100s, tp=8 pp=4, split 19/21/21/19 (hand-written: the solver's choice may change)."""
    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:8"), global_batch=512, seq_len=4096)
    return _plan_of(job, parse_strategy("tp=8,pp=4,mbs=1,zero=1,split=19/21/21/19")), job


def test_megatron_tiny(tiny):
    plan, job = tiny
    files = emitter("megatron")(plan, job)
    args = _args(files["args.txt"])
    assert args["tensor-model-parallel-size"] == "2" and args["pipeline-model-parallel-size"] == "2"
    assert args["sequence-parallel"] is True and args["use-distributed-optimizer"] is True
    assert args["micro-batch-size"] == str(plan.strategy.mbs) and args["global-batch-size"] == "8"
    assert (args["num-layers"], args["hidden-size"], args["num-attention-heads"]) == ("4", "64", "4")
    assert args["group-query-attention"] is True and args["num-query-groups"] == "2"
    assert args["ffn-hidden-size"] == "128" and args["bf16"] is True
    assert (args["normalization"], args["position-embedding-type"], args["swiglu"]) == ("RMSNorm", "rope", True)
    assert args["disable-bias-linear"] is True and args["untie-embeddings-and-output-weights"] is True
    assert "decoder-first-pipeline-num-layers" not in args
    assert 'done < "$here/args.txt"' in files["launch.sh"] and '"$megatron_dir/pretrain_gpt.py" "${args[@]}"' in \
        files["launch.sh"]
    assert check_megatron_args(args, 8) == []


def test_megatron_big():
    plan, job = _megatron_big()
    files = emitter("megatron")(plan, job)
    args = _args(files["args.txt"])
    assert args["decoder-first-pipeline-num-layers"] == "19" and args["decoder-last-pipeline-num-layers"] == "19"
    assert args["num-layers"] == "80" and args["ffn-hidden-size"] == "28672" and args["swiglu"] is True
    assert args["rotary-base"] == "500000"  # Llama 3's rope_theta
    assert "recompute-granularity" not in args and "num-layers-per-virtual-pipeline-stage" not in args
    # every line is one flag and at most one value
    assert all(len(shlex.split(line)) <= 2 for line in files["args.txt"].splitlines())


def test_megatron_interleaved_recompute_precision(interleaved):
    plan, job = interleaved
    args = _args(emitter("megatron")(plan, job)["args.txt"])
    assert args["num-layers-per-virtual-pipeline-stage"] == "10"
    plan, job = _megatron_big()
    recomputing = _with(plan, recompute="full", recompute_layers=[1, 0, 3, 0])
    files = emitter("megatron")(recomputing, job)
    args = _args(files["args.txt"])
    assert (args["recompute-granularity"], args["recompute-method"], args["recompute-num-layers"]) == \
        ("full", "block", "3")
    assert "1/0/3/0" in files["README.md"] and "maximum (3)" in files["README.md"]
    args = _args(emitter("megatron")(_with(plan, recompute="selective"), job)["args.txt"])
    assert args["recompute-granularity"] == "selective" and "recompute-method" not in args
    args = _args(emitter("megatron")(plan, job.model_copy(update={"precision": "fp8"}))["args.txt"])
    assert args["bf16"] is True and args["fp8-format"] == "hybrid"
    args = _args(emitter("megatron")(plan, job.model_copy(update={"precision": "fp16"}))["args.txt"])
    assert args["fp16"] is True and "bf16" not in args
    args = _args(emitter("megatron")(_with(plan, tp=1, sp=False, dp=16), job)["args.txt"])
    assert "sequence-parallel" not in args


def test_megatron_unexpressible_split():
    plan, job = _megatron_big()
    stages = [s.model_copy(update={"blocks": list(b)}) for s, b in
              zip(plan.stages, [(0, 19), (20, 37), (38, 59), (60, 79)])]  # 20/18/22/20
    files = emitter("megatron")(plan.model_copy(update={"stages": stages}), job)
    args = _args(files["args.txt"])
    assert "decoder-first-pipeline-num-layers" not in args
    assert "20/18/22/20" in files["README.md"] and "20 layers on every stage" in files["README.md"]


def test_megatron_emitter_fails_loudly(tiny):
    plan, job = tiny
    with pytest.raises(ValueError, match="num-attention-heads \\(4\\) is not divisible"):
        emitter("megatron")(_with(plan, tp=8, pp=1, dp=1), job)


GOOD = {"tensor-model-parallel-size": 2, "pipeline-model-parallel-size": 2, "context-parallel-size": 1,
        "expert-model-parallel-size": 1, "micro-batch-size": 1, "global-batch-size": 8, "num-layers": 8,
        "num-attention-heads": 8, "group-query-attention": True, "num-query-groups": 2, "seq-length": 128,
        "sequence-parallel": True}
NO_SP = None  # a change that removes --sequence-parallel (a store-true flag is written or left out)


@pytest.mark.parametrize("change, world, message", [
    ({}, 6, "world size (6) is not divisible by tensor-model-parallel-size (2) x pipeline-model-parallel-size (2)"),
    ({"global-batch-size": 7}, 8, "global-batch-size (7) is not divisible by micro-batch-size (1) x data-parallel"),
    ({"tensor-model-parallel-size": 1, "pipeline-model-parallel-size": 4}, 8, "--sequence-parallel needs"),
    ({"num-layers-per-virtual-pipeline-stage": 3}, 8, "num-layers (8) is not divisible by pipeline-model-parallel"),
    ({"num-layers-per-virtual-pipeline-stage": 2, "pipeline-model-parallel-size": 1,
      "tensor-model-parallel-size": 4}, 8, "--num-layers-per-virtual-pipeline-stage needs pipeline"),
    ({"num-layers": 7}, 8, "num-layers (7) is not divisible by pipeline-model-parallel-size (2)"),
    ({"pipeline-model-parallel-size": 4, "tensor-model-parallel-size": 1, "sequence-parallel": NO_SP,
      "num-layers": 11, "decoder-first-pipeline-num-layers": 1, "global-batch-size": 2}, 4,
     "does not divide evenly over the other 3 stages"),
    ({"num-experts": 6, "expert-model-parallel-size": 4}, 8, "num-experts (6) is not divisible by expert-model"),
    ({"recompute-granularity": "full", "recompute-method": "block", "recompute-num-layers": 5}, 8,
     "recompute-num-layers (5) exceeds the layers per pipeline stage (4)"),
    ({"recompute-granularity": "selective", "recompute-method": "block"}, 8, "needs --recompute-granularity full"),
    ({"num-attention-heads": 5}, 8, "num-attention-heads (5) is not divisible by tensor-model-parallel-size (2)"),
    ({"num-query-groups": 1}, 8, "num-query-groups (1) is not divisible"),
    ({"context-parallel-size": 2, "seq-length": 130}, 8, "seq-length (130) is not divisible by 2 x context"),
    ({"num-layers-per-virtual-pipeline-stage": 2, "decoder-first-pipeline-num-layers": 2}, 8, "cannot be combined"),
])
def test_megatron_check_rules(change, world, message):
    assert check_megatron_args(GOOD, 8) == []
    args = {k: v for k, v in {**GOOD, **change}.items() if v is not NO_SP}
    errors = check_megatron_args(args, world)
    assert any(message in e for e in errors), errors


def test_megatron_check_uneven_ok():
    args = {k: v for k, v in GOOD.items() if k != "sequence-parallel"}
    args.update({"pipeline-model-parallel-size": 4, "tensor-model-parallel-size": 1, "num-layers": 10,
                 "decoder-first-pipeline-num-layers": 1, "decoder-last-pipeline-num-layers": 3,
                 "global-batch-size": 2})
    assert check_megatron_args(args, 4) == []
    assert check_megatron_args({**args, "recompute-granularity": "full", "recompute-method": "block",
                                "recompute-num-layers": 4}, 4) == [
        "recompute-num-layers (4) exceeds the layers per pipeline stage (3)"]


def test_megatron_args_dict_matches_file():
    plan, job = _megatron_big()
    args, _ = megatron_args(plan, job)
    assert {k: (True if v is True else str(v)) for k, v in args.items()} == \
        _args(emitter("megatron")(plan, job)["args.txt"])


# ---------------------------------------------------------------- slurm and k8s


def test_slurm(big, tiny):
    # the full checks (srun, torchrun rendezvous, inputs, shellcheck) are in tests/test_emit_slurm.py
    text = emitter("slurm")(*big)["job.sbatch"]
    for line in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --exclusive"):
        assert line in text
    assert "../torch/launch.sh" not in text and "torchrun --nnodes 8 --nproc-per-node 8" in text  # self-contained
    assert "#SBATCH --nodes=2" in emitter("slurm")(*tiny)["job.sbatch"]


def test_k8s(big, tiny):
    # schema, webhook and apply.sh checks are in tests/test_emit_k8s.py
    doc = yaml.safe_load(emitter("k8s")(*big)["pytorchjob.yaml"])
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert doc["spec"]["nprocPerNode"] == "8" and specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 7
    plan, job = big
    # one node (the first stage's first 8 ranks only): no Worker replicas
    stage = plan.stages[0]
    span = stage.ranks.spans[0].model_copy(update={"first_node": 0, "last_node": 0})
    stage = stage.model_copy(update={"ranks": stage.ranks.model_copy(update={"spans": [span]})})
    single = plan.model_copy(update={"job": plan.job.model_copy(update={"num_gpus": 8}), "stages": [stage]})
    doc = yaml.safe_load(emitter("k8s")(single, job)["pytorchjob.yaml"])
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    doc = yaml.safe_load(emitter("k8s")(*tiny)["pytorchjob.yaml"])
    assert doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


# ---------------------------------------------------------------- determinism and goldens


def test_deterministic(tiny):
    plan, job = tiny
    for target in ("torchtitan", "megatron", "slurm", "k8s"):
        assert emitter(target)(plan, job) == emitter(target)(plan, job)


def _regen():
    spec = importlib.util.spec_from_file_location("golden_regenerate", GOLDEN / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REGEN_MODULE = _regen()


@pytest.mark.parametrize("case", sorted(REGEN_MODULE.CASES))
def test_golden(case):
    produced = REGEN_MODULE.case_files(case)
    assert set(produced) == set(available_targets())
    for target, files in produced.items():
        folder = GOLDEN / case / target
        if not files:  # the target refuses this plan (UnsupportedPlan)
            assert not folder.exists(), f"{case}/{target} is refused now; run `{REGEN}`"
            continue
        assert folder.is_dir(), f"no golden files for {case}/{target}: run `{REGEN}`"
        stored = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        assert sorted(stored) == sorted(files), f"{case}/{target}: file set changed; run `{REGEN}`"
        for path, text in files.items():
            assert text.encode("utf-8") == stored[path], \
                f"{case}/{target}/{path} differs from its golden file; if intended, run `{REGEN}`"


# ---------------------------------------------------------------- targets narrow the search


def test_named_targets_search_the_intersection_of_their_runtimes_spaces(tmp_path):
    # each target's runtime profile states what it can express, and `--target A --target B` searches what
    # both can, so both folders are written
    out = tmp_path / "out"
    result = _cli_compile("tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--fix", "pp=2", "-o", str(out),
                          "--target", "deepspeed", "--target", "megatron")
    assert result.exit_code == 0, result.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["job"]["runtime"] == "deepspeed"  # the first target's
    assert plan["solver"]["space_runtimes"] == ["megatron"]  # and the certificate says over which space
    assert ("the strategies the deepspeed and megatron runtimes can all express" in (out / "report.md").read_text())
    strategy = parse_strategy(plan["strategy_spec"])
    for runtime in ("deepspeed", "megatron"):
        assert load_runtime(runtime).cannot_express(strategy, split_blocks=strategy.split) == []
    assert (out / "deepspeed" / "ds_config.json").exists() and (out / "megatron" / "args.txt").exists()


def test_one_setting_targets_refuse_per_stage_placement():
    # DeepSpeed, Megatron-LM and torchtitan apply one offload setting to every rank; the torch runtime, its own
    # per stage
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:1"), global_batch=16, seq_len=2048)
    strategy = parse_strategy("tp=2,pp=2,dp=2,zero=3,offload=all/none")
    plan = _plan_of(job, strategy)
    for target in ("deepspeed", "megatron", "torchtitan"):
        with pytest.raises(UnsupportedPlan, match="offload=all/none"):
            emit_targets(plan, job, (target,))
        with pytest.raises(UnsupportedPlan, match="offload=all/none"):  # the emitter alone refuses it too
            emitter(target)(plan, job)
    assert [s.placement.offload for s in plan.stages] == ["all", "none"]
    assert emit_targets(plan, job, ("torch",))


def _cli_compile(*args: str):
    from click.testing import CliRunner

    from planner.cli import cli

    return CliRunner().invoke(cli, ["compile", *args], catch_exceptions=False)


def test_target_deepspeed_keeps_zero_below_2_under_pipeline(tmp_path):
    common = ["tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--fix", "pp=2,dp=2", "--json"]
    free = json.loads(_cli_compile(*common, "--runtime", "reference").output)
    assert free["plan"]["strategy"]["zero"] >= 2  # faster, but DeepSpeed's PipelineEngine refuses it
    result = _cli_compile(*common, "-o", str(tmp_path / "ds"), "--target", "deepspeed")
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "ds" / "plan.json").read_text())
    assert plan["strategy"]["zero"] <= 1 and plan["strategy"]["pp"] == 2 and plan["strategy"]["vpp"] == 1
    readme = (tmp_path / "ds" / "deepspeed" / "README.md").read_text()
    assert "->" not in readme  # nothing substituted: DeepSpeed runs the plan as compiled


def test_target_torch_never_offloads_to_nvme():
    # llama3-70b fits 16 L4s only with the optimizer on NVMe (DeepSpeed's ZeRO-Infinity: its optimum, OPTIMAL); the
    # torch runtime (FSDP2) offloads to CPU only
    common = ["llama3-70b", "pcie-l4:2", "-b", "16", "-s", "4096", "--work-limit", "20"]
    free = _cli_compile(*common, "--json", "--runtime", "deepspeed")
    assert free.exit_code == 0 and json.loads(free.stdout)["plan"]["strategy"]["offload_device"] == "nvme"
    torch_only = _cli_compile(*common, "--target", "torch", "--json")
    assert torch_only.exit_code == 1
    assert "offload to cpu (the --target's limit)" in torch_only.output
    assert "would fit on 8 nodes" in torch_only.output and "nvme" not in torch_only.output


def test_every_registered_target_module_has_the_target_functions():
    # planner.emit.REGISTRY is the one list of targets: each module writes files and says what they run
    import inspect

    from planner.emit import REGISTRY, TARGET_RUNTIMES, TARGETS
    from planner.profile import runtime_names

    assert TARGETS == tuple(REGISTRY) and TARGET_RUNTIMES == {n: t.runtime for n, t in REGISTRY.items()}
    for name, registered in REGISTRY.items():
        assert registered.runtime in runtime_names(), name
        module = registered.code
        assert list(inspect.signature(module.emit).parameters) == ["plan", "job", "inputs"], name
        assert list(inspect.signature(module.written_strategy).parameters) == ["plan", "job"], name


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_multi_node_torch_launch_needs_master_addr(tmp_path, nodes):
    # issue #27: a localhost default on several nodes would leave every node waiting on itself
    import subprocess

    import planner

    compiled = planner.compile(planner.load_job("tiny-llama", f"cpu:{nodes}", batch=8 * nodes, seq_len=64),
                               targets=("torch",), fixed={"tp": 1, "pp": 1, "cp": 1}, work_limit=10)
    files = compiled.files()
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "launch.sh").write_text(files["torch/launch.sh"])
    standin = tmp_path / "bin" / "torchrun"
    standin.parent.mkdir()
    standin.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    standin.chmod(0o755)
    env = {"PATH": f"{standin.parent}:/usr/bin:/bin", "PLANNER_DATA": "d", "PLANNER_TOKENIZER": "bytes",
           "PLANNER_CHECKPOINTS": "/ck", "PLANNER_TRAIN_STEPS": "3"}
    unset = subprocess.run(["bash", "torch/launch.sh"], cwd=tmp_path, env=env, capture_output=True, text=True)
    given = subprocess.run(["bash", "torch/launch.sh"], cwd=tmp_path, env={**env, "MASTER_ADDR": "10.1.2.3"},
                           capture_output=True, text=True)
    assert given.returncode == 0 and "10.1.2.3:29500" in given.stdout.splitlines(), given.stdout + given.stderr
    if nodes == 1:
        assert unset.returncode == 0 and "localhost:29500" in unset.stdout.splitlines(), unset.stderr
    else:
        assert unset.returncode != 0 and unset.stdout == "", unset.stdout
        assert "set MASTER_ADDR to the address of one of the nodes" in unset.stderr, unset.stderr
