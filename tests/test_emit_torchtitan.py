"""torchtitan 0.2.2 reads every emitted train.toml with its own ConfigManager, as launch.sh runs it.

For each variant (DDP, FSDP, HSDP, tensor parallel with and without async TP, context parallel, pipelines
with 1F1B, GPipe and interleaving, float8, activation checkpointing modes, CPU offload, DeepSeek-V3's
MoE), the test writes the torchtitan folder into a plan folder. It runs launch.sh from there under bash,
with a fake `torchrun` that records its arguments. torch's own torchrun parser reads the launcher flags,
and torchtitan's ConfigManager reads the rest (`--job.config_file <folder>/train.toml` plus the launch
inputs), as `torchtitan.train` would. torchtitan's ParallelDims checks the degrees against the plan's
world size. The pipeline schedule is resolved by torch.distributed.pipelining. Model names and flavors are
checked against the installed release's own model tables.

torchtitan/__init__.py imports its float8 converter, which imports MoE kernels written in triton, and
triton is not installed on CPU-only machines. The config, parallel-dims and model-registry modules need
only torch and tyro. Without triton they are loaded without running the package's __init__, and the
model tables are read from the release's source (`ast`), not imported.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tomllib
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from hardware import load_cluster
from models import load_model
from tools import shellcheck
from planner.emit import UnsupportedPlan, emitter
from planner.emit.inputs import LaunchInputs
from planner.emit.torchtitan_model import FLAVORS, RELEASE
from planner.job import Job
from planner.strategy import parse_strategy
from launch_plans import certified_plan

GIVEN = LaunchInputs(data="data/c4", tokenizer="assets/tokenizer", checkpoint_dir="ckpt", train_steps=1000,
                     save_every=250)
ENV = {"PLANNER_DATA": "/data/c4", "PLANNER_TOKENIZER": "/assets/llama3", "PLANNER_CHECKPOINTS": "runs/ckpt",
       "PLANNER_TRAIN_STEPS": "350"}


@pytest.fixture(scope="module")
def titan():
    """The installed torchtitan's ConfigManager, ParallelDims, model names and package folder."""
    pytest.importorskip("tyro")
    # a module that shares this fixture (tests/test_recipes.py) may have put the bare package in sys.modules
    # already, and find_spec refuses a module without a __spec__
    loaded = sys.modules.get("torchtitan")
    spec = None if loaded is not None else importlib.util.find_spec("torchtitan")
    if loaded is None and spec is None:
        pytest.skip("torchtitan is not installed (pip install -e '.[test]')")
    locations = list(loaded.__path__) if loaded is not None else list(spec.submodule_search_locations)
    version = importlib.metadata.version("torchtitan")
    assert RELEASE == f"torchtitan {version}", f"planner writes {RELEASE} configs, torchtitan {version} is installed"
    if loaded is None and importlib.util.find_spec("triton") is None:
        package = types.ModuleType("torchtitan")  # the package without its __init__ (see the module docstring)
        package.__path__ = locations
        sys.modules["torchtitan"] = package
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models import _supported_models

    return SimpleNamespace(ConfigManager=ConfigManager, ParallelDims=ParallelDims, models=_supported_models,
                           root=Path(locations[0]))


# ---------------------------------------------------------------- plans


def _plan_of(job: Job, spec: str):
    """The plan of a hand-written strategy (scored by evaluate, certified as itself)."""
    return certified_plan(job, parse_strategy(spec).with_dp(job.cluster.num_gpus))


JOBS = {  # name: (model, cluster, global batch, sequence)
    "tiny": ("tiny-llama", "cpu:2", 16, 128),
    "8b": ("llama3-8b", "dgx-h100:2", 64, 4096),
    "8b-gb200": ("llama3-8b", "gb200-nvl72:4", 64, 4096),
    "70b": ("llama3-70b", "dgx-h100:8", 512, 4096),
    "dsv3": ("deepseek-v3", "dgx-h100:32", 1024, 4096),
}

# variant: (job, strategy, precision)
VARIANTS = {
    "ddp": ("tiny", "tp=1,pp=1,zero=0,mbs=1", "bf16"),
    "fsdp": ("8b", "tp=1,pp=1,zero=3,mbs=1,recompute=full", "bf16"),
    "fsdp-zero2": ("8b", "tp=1,pp=1,zero=2,mbs=1,recompute=full", "bf16"),
    "hsdp": ("8b", "tp=1,pp=1,zero=3,shard=node,mbs=1,recompute=full", "bf16"),
    "tp": ("8b", "tp=8,pp=1,zero=1,mbs=1", "bf16"),
    "tp-async": ("8b", "tp=4,pp=1,zero=1,mbs=1,tp_overlap=on", "bf16"),
    "cp": ("8b", "tp=2,cp=2,pp=1,zero=3,mbs=1", "bf16"),
    "pp-1f1b": ("70b", "tp=8,pp=4,zero=1,mbs=1,recompute=full,split=19/21/21/19", "bf16"),
    "pp-gpipe": ("tiny", "tp=1,pp=2,zero=0,mbs=1,schedule=gpipe", "bf16"),
    "pp-interleaved": ("70b", "tp=8,pp=4,vpp=2,zero=1,mbs=1,schedule=interleaved,recompute=full", "bf16"),
    "pp-zbv": ("70b", "tp=8,pp=4,vpp=2,zero=1,mbs=1,schedule=zbv,recompute=full", "bf16"),
    "pp-dualpipev": ("70b", "tp=8,pp=4,vpp=2,zero=1,mbs=1,schedule=dualpipev", "bf16"),
    "fp8": ("8b", "tp=1,pp=1,zero=3,mbs=1,recompute=full", "fp8"),
    "mxfp8": ("8b-gb200", "tp=1,pp=1,zero=3,mbs=1,recompute=full", "mxfp8"),
    "ac-selective": ("8b", "tp=2,pp=1,zero=3,mbs=1,recompute=selective", "bf16"),
    "ac-every-2nd": ("8b", "tp=1,pp=1,zero=3,mbs=1,recompute=full,recompute_every=2", "bf16"),
    "ac-per-stage": ("70b", "tp=8,pp=4,zero=1,mbs=1,recompute=full,recompute_layers=2/0/0/0,"
                            "split=19/21/21/19", "bf16"),
    "cpu-offload": ("8b", "tp=1,pp=1,zero=3,mbs=1,recompute=full,offload=all", "bf16"),
    "moe-deepseek-v3": ("dsv3", "tp=4,pp=8,ep=8,zero=1,mbs=1,recompute=full", "bf16"),
}


@pytest.fixture(scope="module")
def jobs():
    return {name: Job(model=load_model(m), cluster=load_cluster(c), global_batch=b, seq_len=s)
            for name, (m, c, b, s) in JOBS.items()}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, jobs):
    job_name, spec, precision = VARIANTS[request.param]
    job = jobs[job_name].model_copy(update={"precision": precision})
    return request.param, job, _plan_of(job, spec)


# ---------------------------------------------------------------- running launch.sh


def _launch(tmp_path: Path, files: dict[str, str], env: dict[str, str]) -> tuple[Path, list[str], list[str]]:
    """Run torchtitan/launch.sh from a plan folder with a fake torchrun. Return (plan folder, torchrun's own
    arguments, torchtitan.train's arguments)."""
    plan_dir = tmp_path / "plan"
    folder = plan_dir / "torchtitan"
    folder.mkdir(parents=True)
    for path, text in files.items():
        (folder / path).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{tmp_path}/torchrun.args"\n')
    (bin_dir / "torchrun").chmod(stat.S_IRWXU)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PLANNER_", "MASTER_"))}
    result = subprocess.run(["bash", "torchtitan/launch.sh"], cwd=plan_dir, capture_output=True, text=True,
                            env={**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MASTER_ADDR": "node-0",
                                 **env})
    assert result.returncode == 0, result.stderr
    args = (tmp_path / "torchrun.args").read_text().splitlines()
    split = args.index("torchtitan.train")
    assert args[split - 1] == "-m"
    return plan_dir, args[:split - 1], args[split + 1:]


def _config(titan, plan_dir: Path, args: list[str], monkeypatch):
    """torchtitan's JobConfig from `args`, parsed as torchtitan.train does, in the launch directory."""
    monkeypatch.chdir(plan_dir)
    return titan.ConfigManager().parse_args(args)


# ---------------------------------------------------------------- every variant


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_torchtitan_loads_the_emitted_config(variant, titan, tmp_path, monkeypatch):
    name, job, plan = variant
    s = plan.strategy
    files = emitter("torchtitan")(plan, job, GIVEN)
    plan_dir, launcher, train_args = _launch(tmp_path, files, {})
    torchrun = __import__("torch.distributed.run", fromlist=["get_args_parser"]).get_args_parser().parse_args(
        [*launcher, "train.py"])
    assert int(torchrun.nnodes) * int(torchrun.nproc_per_node) == plan.job.num_gpus
    assert torchrun.rdzv_endpoint == "node-0:29500" and torchrun.rdzv_backend == "c10d"
    assert train_args[:2] == ["--job.config_file", str(plan_dir / "torchtitan" / "train.toml")]
    config = _config(titan, plan_dir, train_args, monkeypatch)

    # the model
    assert config.model.name in titan.models
    if job.model.name in FLAVORS:
        assert (config.model.name, config.model.flavor) == FLAVORS[job.model.name]
    # the degrees: torchtitan's own check against the world size, then the plan's values
    p = config.parallelism
    titan.ParallelDims(dp_shard=p.data_parallel_shard_degree, dp_replicate=p.data_parallel_replicate_degree,
                       cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                       ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                       world_size=plan.job.num_gpus)
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    assert (dp, p.tensor_parallel_degree, p.context_parallel_degree, p.pipeline_parallel_degree,
            p.expert_parallel_degree) == (s.dp, s.tp, s.cp, s.pp, s.ep)
    if s.shard == "node" and s.zero == 3:
        assert p.data_parallel_replicate_degree == 2 and p.data_parallel_shard_degree == 8  # one node shards
    # the batch, as torchtitan's train.py and pipeline_parallel.py split it
    t = config.training
    assert (t.global_batch_size, t.seq_len) == (job.global_batch, job.seq_len)
    assert t.global_batch_size % (t.local_batch_size * dp) == 0
    accumulation = t.global_batch_size // (t.local_batch_size * dp)
    if s.pp > 1:
        assert t.local_batch_size % p.pipeline_parallel_microbatch_size == 0
        assert t.local_batch_size // p.pipeline_parallel_microbatch_size == plan.time.micro_batches
        assert accumulation == 1
        _check_pipeline(p, plan, job)
    else:
        assert t.local_batch_size == s.mbs and accumulation == plan.time.micro_batches
    # precision, compile, checkpointing, offload
    # compile on, but under the V schedules, which torch refuses on compiled stages
    assert t.mixed_precision_param == "bfloat16" and config.compile.enable == (s.schedule not in ("zbv", "dualpipev"))
    assert p.enable_async_tensor_parallel == (s.tp_overlap and s.tp > 1)
    if job.precision == "fp8":
        assert config.model.converters == ["quantize.linear.float8"]
        assert config.quantize.linear.float8.enable_fsdp_float8_all_gather == (p.data_parallel_shard_degree > 1)
        float8 = (titan.root / "components" / "quantization" / "float8.py").read_text()
        assert 'register_model_converter(Float8LinearConverter, "quantize.linear.float8")' in float8
    elif job.precision == "mxfp8":
        assert config.model.converters == ["quantize.linear.mx"]
        assert config.quantize.linear.mx.recipe_name == "mxfp8_cublas"  # torchao's MXLinearConfig recipe
        assert config.quantize.linear.mx.filter_fqns == ["output"]
        assert config.quantize.linear.mx.mxfp8_dim1_cast_kernel_choice == "cuda"
        mx = (titan.root / "components" / "quantization" / "mx.py").read_text()
        assert 'register_model_converter(MXLinearConverter, "quantize.linear.mx")' in mx
    else:
        assert config.model.converters == []
    assert t.enable_cpu_offload == (s.offload == "all")
    ac = config.activation_checkpoint
    expected_mode = {"none": "none", "selective": "selective"}.get(s.recompute, "full")
    if s.recompute_layers is not None and len(set(s.recompute_layers)) > 1:
        expected_mode = "selective"  # per-stage counts: every n-th block
        assert ac.selective_ac_option.isdigit()
    if s.recompute == "selective":  # per-op SAC, the policy the torchtitan profile's `selective` section costs
        assert ac.selective_ac_option == "op"
    if s.recompute_every is not None:  # layer SAC: every k-th block
        expected_mode = "selective"
        assert ac.selective_ac_option == str(s.recompute_every)
    assert ac.mode == expected_mode
    # the launch inputs and the schedule
    assert (t.dataset, t.dataset_path, config.model.hf_assets_path) == ("c4", "data/c4", "assets/tokenizer")
    assert config.checkpoint.folder == str(plan_dir / "ckpt") and config.checkpoint.enable
    assert (config.checkpoint.interval, t.steps) == (250, 1000)
    assert config.lr_scheduler.warmup_steps == 10 and config.lr_scheduler.decay_type == "cosine"
    assert t.max_norm == 1.0 and config.optimizer.name == "AdamW"


def _check_pipeline(p, plan, job) -> None:
    """module_fqns_per_model_part covers every module once, in order; torchtitan's looped assignment (chunk k
    on rank k % pp) gives each rank the plan's blocks; torch knows the schedule, looped exactly when vpp > 1."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

    s = plan.strategy
    parts = p.module_fqns_per_model_part
    names = ["tok_embeddings", *(f"layers.{i}" for i in range(job.model.num_blocks)), "norm", "output"]
    assert [name for part in parts for name in part] == names
    assert len(parts) == s.pp * s.vpp
    per_rank = [sum(sum(n.startswith("layers.") for n in parts[k]) for k in range(r, len(parts), s.pp))
                for r in range(s.pp)]
    if s.vpp == 1:
        assert per_rank == [stage.blocks[1] - stage.blocks[0] + 1 for stage in plan.stages]
    assert sum(per_rank) == job.model.num_blocks
    schedule = get_schedule_class(p.pipeline_parallel_schedule)
    assert issubclass(schedule, PipelineScheduleMulti) == (s.vpp > 1)
    assert p.pipeline_parallel_schedule == {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B",
                                            "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}[s.schedule]
    if s.schedule in ("zbv", "dualpipev"):
        # torch's own V assignment (the one torchtitan's pipeline_parallel.py uses: style "v") gives each rank the
        # plan's chunks: the first rank the embedding's and the head's
        from torch.distributed.pipelining.schedules import generate_rank_to_stage_mapping

        ranks = generate_rank_to_stage_mapping(s.pp, len(parts), style="v")
        for rank, stage in enumerate(plan.stages):
            chunks = [[int(n.split(".")[1]) for n in parts[k] if n.startswith("layers.")] for k in ranks[rank]]
            assert [[c[0], c[-1]] for c in chunks] == stage.chunks
        assert "output" in parts[ranks[0][1]] and "tok_embeddings" in parts[ranks[0][0]]
        if s.schedule == "dualpipev":  # torchtitan's default (on) overlaps the pairs' all-to-alls with ep > 1
            assert p.pipeline_parallel_expert_parallel_overlap is s.ep_overlap


def test_launch_sh_passes_shellcheck(variant, tmp_path):
    _, job, plan = variant
    for inputs in (GIVEN, LaunchInputs()):
        path = tmp_path / "launch.sh"
        path.write_text(emitter("torchtitan")(plan, job, inputs)["launch.sh"])
        result = subprocess.run([shellcheck(), "--shell=bash", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


# ---------------------------------------------------------------- inputs read at launch


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_inputs_not_given_come_from_the_environment(jobs, titan, tmp_path, monkeypatch):
    plan = _plan_of(jobs["tiny"], "tp=2,pp=2,zero=1,mbs=1")
    files = emitter("torchtitan")(plan, jobs["tiny"])
    written = tomllib.loads(files["train.toml"])  # nothing the user did not give is written as a default
    assert not {"dataset_path", "steps"} & set(written["training"]) and "hf_assets_path" not in written["model"]
    assert "warmup_steps" not in written["lr_scheduler"] and "folder" not in written["checkpoint"]
    plan_dir, _, train_args = _launch(tmp_path, files, ENV)
    config = _config(titan, plan_dir, train_args, monkeypatch)
    assert (config.training.dataset_path, config.model.hf_assets_path) == ("/data/c4", "/assets/llama3")
    assert config.checkpoint.folder == str(plan_dir / "runs" / "ckpt")  # relative to where launch.sh ran
    assert (config.training.steps, config.lr_scheduler.warmup_steps) == (350, 4)
    script = plan_dir / "torchtitan" / "launch.sh"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    missing = subprocess.run(["bash", str(script)], cwd=plan_dir, capture_output=True, text=True,
                             env={**clean, **{k: v for k, v in ENV.items() if k != "PLANNER_CHECKPOINTS"}})
    assert missing.returncode != 0 and "set PLANNER_CHECKPOINTS" in missing.stderr
    bad = subprocess.run(["bash", str(script)], cwd=plan_dir, capture_output=True, text=True,
                         env={**clean, **ENV, "PLANNER_TRAIN_STEPS": "0"})
    assert bad.returncode == 2 and "positive integer, not '0'" in bad.stderr


def test_config_manager_rejects_what_the_release_does_not_know(jobs, titan, tmp_path, monkeypatch):
    """The loader is strict: a key of another torchtitan release ([training] compile, from v0.1.0) fails."""
    plan = _plan_of(jobs["tiny"], "tp=1,pp=1,zero=3,mbs=1")
    text = emitter("torchtitan")(plan, jobs["tiny"], GIVEN)["train.toml"]
    stale = text.replace("[training]\n", "[training]\ncompile = true\n")
    (tmp_path / "train.toml").write_text(stale)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="Invalid field names"):
        titan.ConfigManager().parse_args(["--job.config_file", "train.toml"])


# ---------------------------------------------------------------- models and flavors


def _literal(node: ast.expr):
    """A literal, or the keyword arguments of a call (nested model-argument classes), as plain values."""
    if isinstance(node, ast.Call):
        return {kw.arg: _literal(kw.value) for kw in node.keywords}
    return ast.literal_eval(node)


def _flavors(titan, name: str) -> dict[str, dict]:
    """torchtitan/models/<name>/__init__.py's flavor table: {flavor: model-argument keywords}."""
    tree = ast.parse((titan.root / "models" / name / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and node.value.keys and all(
                isinstance(value, ast.Call) for value in node.value.values):
            return {ast.literal_eval(k): _literal(v) for k, v in zip(node.value.keys, node.value.values)}
    raise AssertionError(f"no flavor table in torchtitan/models/{name}/__init__.py")


def _defaults(titan, path: str, cls: str) -> dict:
    """Literal field defaults of a model-argument dataclass in the release's source."""
    tree = ast.parse((titan.root / path).read_text())
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls).body
    out = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            try:
                out[node.target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


@pytest.mark.parametrize("zoo_name", sorted(FLAVORS))
def test_flavors_have_the_zoo_models_sizes(zoo_name, titan):
    name, flavor = FLAVORS[zoo_name]
    assert name in titan.models
    table = _flavors(titan, name)
    assert flavor in table, f"{name} has flavors {sorted(table)}"
    model = load_model(zoo_name)
    if name == "llama3":
        args = {**_defaults(titan, "models/llama3/model/args.py", "TransformerModelArgs"), **table[flavor]}
        assert (args["dim"], args["n_layers"], args["n_heads"], args["n_kv_heads"], args["vocab_size"]) == (
            model.hidden, model.num_blocks, model.heads, model.kv_heads, model.vocab)
        return
    assert name == "deepseek_v3"
    from models.zoo import get_entry

    config = get_entry(zoo_name).config
    args = {**_defaults(titan, "models/deepseek_v3/model/args.py", "DeepSeekV3ModelArgs"), **table[flavor]}
    moe = args["moe_args"]
    assert (args["dim"], args["n_layers"], args["n_heads"], args["vocab_size"], args["inter_dim"]) == (
        config.hidden, config.num_layers, config.heads, config.vocab, config.ffn)
    assert (args["moe_inter_dim"], args["n_dense_layers"]) == (config.moe.expert_ffn, config.moe.first_dense_layers)
    assert (moe["num_experts"], moe["top_k"], moe["num_shared_experts"]) == (
        config.moe.num_experts, config.moe.top_k, config.moe.shared_experts)
    assert (args["q_lora_rank"], args["kv_lora_rank"]) == (config.mla.q_lora_rank, config.mla.kv_lora_rank)


def test_mixtral_is_skipped_with_a_note(jobs, titan):
    """torchtitan 0.2.2 has no Mixtral: its MoE models route and shape experts otherwise, so writing one of
    them (or a dense llama3, as planner once did) would train another model. The emitter refuses with a note."""
    assert not any("mixtral" in name or "mistral" in name for name in titan.models)
    job = Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100:8"), global_batch=256, seq_len=4096)
    plan = _plan_of(job, "tp=8,pp=1,ep=8,zero=1,mbs=1,recompute=full")
    with pytest.raises(UnsupportedPlan, match="torchtitan 0.2.2 has no model that builds mixtral-8x7b's mixture "
                                              "of experts; its MoE models are deepseek_v3, llama4"):
        emitter("torchtitan")(plan, job)


@pytest.mark.parametrize("model, why", [("gpt2-xl", "activation=gelu"), ("qwen2-7b", "qkv_bias"),
                                        ("bert-large", "bidirectional encoder")])
def test_other_layouts_are_refused(model, why):
    job = Job(model=load_model(model), cluster=load_cluster("dgx-h100:1"), global_batch=64, seq_len=512)
    plan = _plan_of(job, "tp=1,pp=1,zero=1,mbs=1")
    with pytest.raises(UnsupportedPlan, match=f"llama3 model cannot build {model} .*{why}"):
        emitter("torchtitan")(plan, job)


def test_an_unregistered_llama_layout_names_its_flavor(jobs, titan):
    files = emitter("torchtitan")(_plan_of(jobs["tiny"], "tp=1,pp=1,zero=3,mbs=1"), jobs["tiny"])
    assert "tiny-llama" not in _flavors(titan, "llama3")
    assert 'flavor = "tiny-llama"' in files["train.toml"]
    assert ('register flavor "tiny-llama" in torchtitan/models/llama3/__init__.py (`llama3_args`) as '
            "TransformerModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=256)") in files["README.md"]


# ---------------------------------------------------------------- a data plan


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_data_plan_asks_for_the_document_masking_flavor(titan, tmp_path, monkeypatch):
    """A plan compiled with --data-profile (no context parallelism) runs llama3's variable-length flavor, as
    torchtitan's own flavor table defines it: the plain flavor's sizes, varlen attention, block-causal mask."""
    from planner import api
    from planner.data.profile import DataProfile, LengthBin
    from planner.emit.torchtitan_model import DOCUMENT_FLAVORS

    job = api.load_job("llama3-8b", "dgx-h100:1", batch=16, seq_len=8192)
    profile = DataProfile(name="mix", source="test", bins=[LengthBin(min_tokens=100, max_tokens=2000, count=8),
                                                           LengthBin(min_tokens=4000, max_tokens=8192, count=1)])
    compiled = api.compile(job, targets=("torchtitan",), fixed={"cp": 1}, data_profile=profile, work_limit=2)
    files = emitter("torchtitan")(compiled.plan, compiled.job, GIVEN)
    plan_dir, _, train_args = _launch(tmp_path, files, {})
    config = _config(titan, plan_dir, train_args, monkeypatch)
    assert (config.model.name, config.model.flavor) == DOCUMENT_FLAVORS["llama3-8b"]
    table = _flavors(titan, "llama3")
    varlen, plain = table[config.model.flavor], table[FLAVORS["llama3-8b"][1]]
    assert (varlen.pop("attn_type"), varlen.pop("attn_mask_type")) == ("varlen", "block_causal")
    assert varlen == plain
    assert "neither balances" in files["README.md"]
