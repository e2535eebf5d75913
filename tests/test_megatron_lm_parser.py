"""Megatron-LM core_v0.16.1's own argument parser reads the Megatron files planner writes.

tests/megatron_lm.py runs Megatron-LM's `parse_args(ignore_unknown_args=False)` and `validate_args` (vendored
unmodified under tests/data/megatron_lm_core_v0.16.1/, against the installed megatron-core 0.16.1), then
`core_transformer_config_from_args` and megatron-core's micro-batch calculator, on:

* args.txt alone, and the whole command line launch.sh hands pretrain_gpt.py (run under bash with a torchrun
  that prints it), for one plan of every zoo family and for strategies that reach every branch of the
  emitter (interleaving, uneven first/last stages, recomputation, context parallelism, ZeRO 0/3, node-scoped
  optimizer instances, optimizer offload, tp overlap, fp8/fp16, unfused kernels, A100);
* megatron/reshard.sh of `planner replan` (planner/replan/convert.py): launch.sh with the resharding-load
  flags, --ckpt-format torch_dist and the checkpoint folder as --load and --save.

Megatron's reading must be the plan: world size, degrees, data-parallel size, micro-batches, layers per stage
(megatron-core's get_num_layers_to_build), recomputation, optimizer and overlap as planner costs them
(planner.emit.megatron.written_strategy), and the model: Megatron-LM's own TransformerConfig equals, field by
field, the one tests/megatron_config.py maps by hand for test_emit_megatron.py's parameter counts. The harness
is shown to refuse what Megatron refuses, and the flag table of planner.emit.megatron_check to be Megatron's.
What does not run on CPU, and what stands in, is listed in tests/megatron_lm.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import re

import pytest
from click.testing import CliRunner

from conftest import make_job
from launch_plans import MEGATRON_FAMILIES, certified_plan
from megatron_lm import (VENDORED, ArgparseError, gpu_arch, num_microbatches, parse, parser_module, run_script,
                         transformer_config, validate)
from planner.cli import cli
from planner.emit import emitter
from planner.emit.megatron import written_strategy
from planner.emit.megatron_check import FLAGS
from planner.emit.nodes import node_spec
from planner.replan.convert import megatron_reshard_sh
from planner.strategy import parse_strategy

# the launch inputs, given as the environment variables launch.sh reads
INPUTS = {"MEGATRON_DIR": "/opt/megatron", "PLANNER_DATA": "data/corpus_text_document",
          "PLANNER_TOKENIZER": "meta-llama/Meta-Llama-3-8B", "PLANNER_CHECKPOINTS": "ckpt",
          "PLANNER_TRAIN_STEPS": "500"}

# name -> (model, cluster, global batch, sequence length, strategy, other Job fields)
CASES = {family: (*case, {}) for family, case in MEGATRON_FAMILIES.items()}
CASES.update({
    "interleaved": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,vpp=2,zero=1", {}),
    "interleaved-pp2": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,vpp=4,zero=1", {}),
    "interleaved-uneven": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,vpp=2,split=7/9/9/7,zero=1", {}),
    "uneven-ends": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,split=7/9/9/7,zero=1", {}),
    "uneven-middle": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=4,split=6/9/10/7,zero=1", {}),
    "recompute-full": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,recompute=full,zero=1", {}),
    "recompute-block": ("llama3-8b", "dgx-h100:2", 64, 4096,
                        "tp=2,pp=4,recompute=full,recompute_layers=2/2/1/0,zero=1", {}),
    "recompute-selective": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,recompute=selective,zero=1", {}),
    "context-parallel": ("llama3-8b", "dgx-h100:2", 64, 8192, "tp=2,cp=2,pp=2,zero=1", {}),
    "zero0": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,zero=0", {}),
    "optimizer-offload": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,zero=1,offload=optimizer", {}),
    "zero3": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,zero=3", {}),
    "megatron-fsdp": ("llama3-8b", "dgx-h100:1", 128, 8192, "zero=3", {}),
    "megatron-fsdp-tp": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,zero=3,recompute=full", {}),
    "megatron-fsdp-grads": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,zero=2", {}),
    "optimizer-per-node": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,zero=1,shard=node", {}),
    "no-sp": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,sp=0,zero=1", {}),
    "tp-overlap": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=4,tp_overlap=1,zero=1", {}),
    "dp-overlap-off": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,zero=1,dp_overlap=off", {}),
    "dp-overlap-grad": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,zero=1,dp_overlap=grad", {}),
    "fp8": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,zero=1", {"precision": "fp8"}),
    "fp8-params": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,zero=1", {"precision": "fp8", "fp8_params": True}),
    "mxfp8-gb200": ("llama3-70b", "gb200-nvl72:18", 576, 4096, "tp=2,pp=4,zero=1", {"precision": "mxfp8"}),
    "fp16": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,zero=1", {"precision": "fp16"}),
    "unfused": ("llama3-8b", "dgx-h100:2", 64, 4096, "tp=2,pp=2,mbs=2,zero=1",
                {"flash_attention": False, "fused_kernels": False}),
    "a100": ("llama3-8b", "dgx-a100-80g:2", 64, 4096, "tp=2,pp=2,zero=1", {}),
    "mixtral-ep8-tp1": ("mixtral-8x7b", "dgx-h100:4", 256, 4096, "tp=1,pp=4,ep=8,zero=1", {}),
})

# TransformerConfig fields where tests/megatron_config.py's hand mapping (which counts GPTModel's parameters in
# test_emit_megatron.py) may differ from Megatron-LM's own: kernel and runtime settings that hold no weight
# (Megatron's argument defaults against TransformerConfig's; the interleaved schedule's p2p overlap, on by
# default in Megatron-LM), and YaRN's factor, unused under --rope-type rope
HAND_MAPPING_SKIPS = {"use_cpu_initialization", "gradient_accumulation_fusion", "bias_dropout_fusion",
                      "persist_layer_norm", "deallocate_pipeline_outputs", "batch_p2p_comm", "overlap_p2p_comm",
                      "cp_comm_type", "attention_softmax_in_fp32", "inference_sampling_seed",
                      "rotary_scaling_factor"}


@pytest.fixture(scope="module")
def mlm():
    """Megatron-LM's megatron.training.arguments (import: seconds)."""
    with parser_module() as module:
        yield module


def case_plan(name: str):
    """(plan, job) of a case: its hand-written strategy, certified as itself."""
    model, cluster, batch, seq, spec, fields = CASES[name]
    job = make_job(model, cluster, batch, seq, **fields)
    return certified_plan(job, parse_strategy(spec)), job


def args_txt_words(text: str) -> list[str]:
    """args.txt as launch.sh reads it: each line split on whitespace (read -r -a)."""
    return [word for line in text.splitlines() for word in line.split()]


def torchrun_env(launch) -> dict[str, str]:
    """The environment of rank 0 of the launch: launch.sh's, plus what torchrun exports."""
    return {**launch.env, "WORLD_SIZE": str(launch.world_size), "RANK": "0", "LOCAL_RANK": "0"}


def comparable(value):
    """A config value that compares by content: __post_init__ builds its init methods as fresh partials."""
    if isinstance(value, functools.partial):
        return comparable(value.func), value.args, sorted(value.keywords.items())
    return value.__qualname__ if callable(value) and hasattr(value, "__qualname__") else value


def megatron_split(mlm, args: argparse.Namespace) -> list[int]:
    """Transformer layers on each pipeline stage, as megatron-core builds them (all its virtual stages)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    config = transformer_config(mlm, args)
    chunks = args.virtual_pipeline_model_parallel_size or 1
    layout = config.pipeline_model_parallel_layout
    if layout is not None:  # megatron-core's own parse of the layout (its layer count asks the process groups)
        from megatron.core.transformer.enums import LayerType

        return [sum(stage[v].count(LayerType.decoder) for v in range(chunks)) for stage in layout.layout]
    return [sum(get_num_layers_to_build(config, vp_stage=v, pp_rank=r) for v in range(chunks))
            for r in range(args.pipeline_model_parallel_size)]


def assert_the_model_is_the_hand_mapped_one(mlm, args: argparse.Namespace, files, plan, job) -> None:
    """Megatron-LM's own core_transformer_config_from_args gives the config tests/megatron_config.py maps by
    hand (whose GPTModel test_emit_megatron.py counts), field by field, and the model's MoE layers."""
    import megatron_config as mc

    config = transformer_config(mlm, args)
    hand = mc.core_config(mc.parse_args_txt(files["args.txt"]))
    assert type(config) is type(hand)
    differ = [f.name for f in dataclasses.fields(config) if f.name not in HAND_MAPPING_SKIPS
              and comparable(getattr(config, f.name)) != comparable(getattr(hand, f.name))]
    assert differ == []
    moe = next((layer.moe for layer in job.model.layers if layer.moe is not None), None)
    if moe is not None:
        pattern = config.moe_layer_freq
        blocks = pattern if isinstance(pattern, list) else [int(i % pattern == 0) for i in range(job.model.num_blocks)]
        assert sum(blocks) == sum(1 for layer in job.model.layers if layer.moe)
        assert (config.num_moe_experts, config.moe_router_topk, config.moe_token_dispatcher_type) == \
            (moe.num_experts, moe.top_k, "alltoall")
        assert args.expert_tensor_parallel_size == plan.strategy.tp  # the cost model splits experts over tp


def megatron_fsdp_config(args: argparse.Namespace):
    """megatron-core's DistributedDataParallelConfig of validated arguments, as Megatron-LM core_v0.16.1's
    training.py get_model builds it: every field named like an argument, grad_reduce_in_fp32 from
    accumulate_allreduce_grads_in_fp32 (its __post_init__ checks the combination)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(DistributedDataParallelConfig)
              if hasattr(args, f.name)}
    kwargs["grad_reduce_in_fp32"] = args.accumulate_allreduce_grads_in_fp32
    return DistributedDataParallelConfig(**kwargs)


def read_launch(mlm, tmp_path, files, job, *extra: str, script="launch.sh", env=None):
    """(launch, namespace): the script (with `extra` arguments) run with a printing torchrun, its
    pretrain_gpt.py command line parsed and validated by Megatron-LM."""
    launch = run_script(tmp_path, files, {**INPUTS, **(env or {})}, *extra, script=script)
    assert launch.run.returncode == 0, launch.run.stderr
    assert launch.script == "/opt/megatron/pretrain_gpt.py"
    flags = [word for word in launch.args if word.startswith("--")]
    assert sorted({flag for flag in flags if flags.count(flag) > 1}) == []  # argparse keeps the last silently
    environment = torchrun_env(launch)
    args = validate(mlm, parse(mlm, launch.args, environment), environment, gpu_arch(node_spec(job).device))
    return launch, args


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_lm_reads_the_plan(mlm, tmp_path, name):
    plan, job = case_plan(name)
    files = emitter("megatron")(plan, job)
    launch, args = read_launch(mlm, tmp_path, files, job)
    parse(mlm, args_txt_words(files["args.txt"]), torchrun_env(launch))  # args.txt alone parses too
    s, model = plan.strategy, job.model
    assert launch.world_size == plan.job.num_gpus
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size,
            args.expert_model_parallel_size, args.data_parallel_size, args.micro_batch_size) == \
        (s.tp, s.pp, s.cp, s.ep, s.dp, s.mbs)
    assert args.virtual_pipeline_model_parallel_size == (s.vpp if s.vpp > 1 else None)
    assert args.global_batch_size == job.global_batch
    assert num_microbatches(args) == job.global_batch // (s.mbs * s.dp)
    assert (args.seq_length, args.num_layers, args.hidden_size, args.num_attention_heads) == \
        (job.seq_len, model.num_blocks, model.hidden, model.heads)
    # what planner costs as Megatron's run of the files (emit.check re-evaluates it) is what Megatron reads
    written = written_strategy(plan, job)
    assert megatron_split(mlm, args) == list(written.split or (model.num_blocks,))
    assert args.sequence_parallel == (s.sequence_parallel and s.tp > 1)
    assert (args.recompute_granularity or "none", args.tp_comm_overlap) == (written.recompute, written.tp_overlap)
    # the data-parallel overlap costed is the one Megatron runs (dp_overlap=off: Megatron-LM's own defaults)
    reduced = s.dp * s.cp > 1
    assert args.overlap_grad_reduce == (reduced and s.dp_overlap != "off")
    assert args.overlap_param_gather == (reduced and s.zero >= 1 and s.dp_overlap == "on")
    assert written.dp_overlap == (s.dp_overlap if reduced else "on")
    if written.recompute_layers is not None:
        assert (args.recompute_method, (args.recompute_num_layers,)) == ("block", written.recompute_layers)
    assert args.use_distributed_optimizer == (written.zero >= 1)
    # zero 2/3 without pipeline parallelism run as Megatron FSDP, sharding what the profile shards at that stage
    assert args.use_megatron_fsdp == (written.zero >= 2)
    assert args.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}.get(written.zero,
                                                                                                   "no_shard")
    if written.zero >= 2:  # megatron-core's own config of the run, built as training.py get_model builds it
        ddp = megatron_fsdp_config(args)
        assert ddp.use_megatron_fsdp and ddp.data_parallel_sharding_strategy == args.data_parallel_sharding_strategy
        assert ddp.grad_reduce_in_fp32  # the fp32 main gradients the megatron profile counts (4 B)
    assert (args.num_distributed_optimizer_instances > 1) == (written.shard == "node")
    assert (args.optimizer_cpu_offload, args.optimizer_offload_fraction) == \
        (written.offload == "optimizer", written.offload_ratio)
    # the megatron profile hides dp x cp gradient traffic, and the distributed optimizer's gather, behind compute,
    # as far as the strategy's dp_overlap says (off: Megatron-LM's defaults, neither flag)
    dtype = {"fp16": "float16"}.get(job.precision, "bfloat16")
    fp8 = {"fp8": "hybrid", "mxfp8": "e4m3"}.get(job.precision)  # MXFP8BlockScaling is E4M3 in both passes
    assert (str(args.params_dtype), args.fp8) == (f"torch.{dtype}", fp8)
    assert args.fp8_recipe == ("mxfp8" if job.precision == "mxfp8" else "delayed")  # delayed: Megatron's default
    # the launch inputs and the checkpoint format
    assert (args.data_path, args.tokenizer_model, args.train_iters) == \
        (["data/corpus_text_document"], "meta-llama/Meta-Llama-3-8B", 500)
    assert args.load == args.save == str(launch.plan_dir / "ckpt")
    assert args.ckpt_format == ("fsdp_dtensor" if written.zero >= 2 else "torch_dist")
    assert_the_model_is_the_hand_mapped_one(mlm, args, files, plan, job)


def test_the_vendored_files_are_megatron_lms_unmodified():
    """Each vendored file's git blob hash is the one its README records for tag core_v0.16.1."""
    table = re.findall(r"^\| `([^`]+)` \| [\d,]+ \| `([0-9a-f]{40})` \|", (VENDORED / "README.md").read_text(),
                       re.MULTILINE)
    # the files git tracks there: not the README, not the bytecode an import of them writes
    files = sorted(str(p.relative_to(VENDORED)) for p in VENDORED.rglob("*")
                   if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts)
    assert sorted(name for name, _ in table) == files
    for name, blob in table:
        data = (VENDORED / name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, name


def test_the_flag_table_of_megatron_check_is_megatrons(mlm):
    """planner.emit.megatron_check.FLAGS (names and types the emitter's own checker allows) against the
    actions of Megatron-LM's parser."""
    actions = mlm.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))._option_string_actions
    assert sorted(flag for flag in FLAGS if f"--{flag}" not in actions) == []
    for flag, kind in FLAGS.items():
        action = actions[f"--{flag}"]
        if isinstance(kind, tuple):
            assert sorted(getattr(c, "name", c) for c in action.choices) == sorted(kind), flag
        else:
            expected = {"true": lambda a: a.nargs == 0, "int": lambda a: a.type is int,
                        "float": lambda a: a.type is float, "str": lambda a: a.type in (None, str),
                        "pattern": lambda a: a.type is mlm.moe_freq_type, "pair": lambda a: a.type is mlm.tuple_type}
            assert expected[kind](action), (flag, kind, action)


def test_the_parser_refuses_what_megatron_refuses(mlm, tmp_path):
    """The harness is live: Megatron's parser and validate_args reject broken command lines."""
    plan, job = case_plan("llama3")  # tp=8
    files = emitter("megatron")(plan, job)
    launch, _ = read_launch(mlm, tmp_path, files, job)
    env = torchrun_env(launch)
    for extra, message in ((["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
                           (["--num-layers", "four"], "argument --num-layers: invalid int value: 'four'"),
                           (["--moe-token-dispatcher-type", "all2all"], "invalid choice: 'all2all'")):
        with pytest.raises(ArgparseError, match=message):
            parse(mlm, launch.args + extra, env)
    arch = gpu_arch(node_spec(job).device)
    without = {k: v for k, v in env.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS"):  # launch.sh exports it for tp > 1
        validate(mlm, parse(mlm, launch.args, without), without, arch)
    validate(mlm, parse(mlm, launch.args, without), without, 10)  # Blackwell no longer needs it
    odd = {**env, "WORLD_SIZE": "60"}
    with pytest.raises(AssertionError, match="world size .60. is not divisible"):
        validate(mlm, parse(mlm, launch.args, odd), odd, arch)


# ---------------------------------------------------------------- planner replan: megatron/reshard.sh

def loads_optimizer(old: argparse.Namespace, new: argparse.Namespace) -> bool:
    """Whether Megatron-LM core_v0.16.1's load_checkpoint can load the old run's optimizer state into the new
    run (megatron/training/checkpointing.py): with --no-load-optim it does not try. The distributed
    optimizer's state is saved 'fully_reshardable' with --dist-ckpt-optim-fully-reshardable, else
    'dp_reshardable' (_build_sharded_state_dict_metadata), and a changed (tp, pp) raises for the latter;
    between a plain and a distributed optimizer the state dicts differ (per parameter against per dp group)."""
    if new.no_load_optim:
        return False
    if old.use_distributed_optimizer != new.use_distributed_optimizer:
        raise AssertionError("the old optimizer state does not load into the new optimizer")
    layout = lambda a: (a.tensor_model_parallel_size, a.pipeline_model_parallel_size)  # noqa: E731
    if new.use_distributed_optimizer and layout(old) != layout(new) and not old.dist_ckpt_optim_fully_reshardable:
        raise AssertionError("(TP, PP) mismatch: not supported for DistributedOptimizer with sharding type "
                             "dp_reshardable")
    return True


# old strategy -> new strategy on one node fewer; whether the optimizer state comes along
RESHARDS = {
    "dp only": ("tp=2,pp=2,zero=1", "tp=2,pp=2,zero=1", {}, True),
    "tp changes": ("tp=2,pp=2,zero=1", "tp=4,pp=2,zero=1", {}, False),
    "tp changes, saved fully reshardable": ("tp=2,pp=2,zero=1", "tp=4,pp=2,zero=1", {"FULLY_RESHARDABLE": "1"}, True),
    "distributed to plain": ("tp=2,pp=2,zero=1", "tp=2,pp=2,zero=0", {"FULLY_RESHARDABLE": "1"}, False),
    "plain, tp and pp change": ("tp=2,pp=2,zero=0", "tp=8,pp=1,zero=0", {}, True),
}


@pytest.mark.parametrize("name", sorted(RESHARDS))
def test_reshard_command_is_megatrons_resharding_load(mlm, tmp_path, name):
    old_spec, new_spec, env, optimizer = RESHARDS[name]
    old_job, new_job = make_job("llama3-8b", "dgx-h100:2", 64, 4096), make_job("llama3-8b", "dgx-h100:1", 64, 4096)
    old_plan = certified_plan(old_job, parse_strategy(old_spec))
    new_plan = certified_plan(new_job, parse_strategy(new_spec))
    # FULLY_RESHARDABLE=1 says the old run was started with --dist-ckpt-optim-fully-reshardable added
    added = ("--dist-ckpt-optim-fully-reshardable",) if env.get("FULLY_RESHARDABLE") == "1" else ()
    _, old = read_launch(mlm, tmp_path / "old", emitter("megatron")(old_plan, old_job), old_job, *added)
    files = {**emitter("megatron")(new_plan, new_job),
             "reshard.sh": megatron_reshard_sh(old_plan.strategy, new_plan.strategy)}
    launch, new = read_launch(mlm, tmp_path / "new", files, new_job, script="reshard.sh", env=env)
    assert (new.ckpt_format, new.use_dist_ckpt, new.ckpt_fully_parallel_load) == ("torch_dist", True, True)
    assert new.load == new.save == str(launch.plan_dir / "ckpt")
    assert new.data_parallel_size == new_plan.strategy.dp
    assert loads_optimizer(old, new) == optimizer
    assert bool(new.no_load_rng) == (not optimizer)


def test_replan_cli_writes_a_reshard_command_megatron_accepts(mlm, tmp_path):
    """`planner compile --target megatron`, then `planner replan` onto one node: reshard.sh from the command
    line, read by Megatron-LM; the old run's distributed optimizer state (dp_reshardable) cannot follow
    tp 2 -> 1, so it is not loaded."""
    run = CliRunner()
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    result = run.invoke(cli, ["compile", "tiny-llama", "cpu:2", "-b", "8", "-s", "128", "--target", "megatron",
                              "--fix", "tp=2,pp=2,zero=1,vpp=1", "-o", str(old_dir)])
    assert result.exit_code == 0, result.output
    # zero 1 (the distributed optimizer, torch_dist checkpoints): Megatron FSDP would save another format
    result = run.invoke(cli, ["replan", str(old_dir / "plan.json"), "cpu:1", "--checkpoint-dir", "ckpt",
                              "--fix", "zero=1", "-o", str(new_dir)])
    assert result.exit_code == 0, result.output
    old_files = {p.name: p.read_text() for p in (old_dir / "megatron").iterdir()}
    _, old = read_launch(mlm, tmp_path / "run-old", old_files, make_job("tiny-llama", "cpu:2", 8, 128))
    new_files = {p.name: p.read_text() for p in (new_dir / "megatron").iterdir()}
    launch, new = read_launch(mlm, tmp_path / "run-new", new_files, make_job("tiny-llama", "cpu:1", 8, 128),
                              script="reshard.sh")
    assert new.load == new.save == str(launch.plan_dir / "ckpt")  # compile --checkpoint-dir ckpt
    assert new.ckpt_fully_parallel_load and new.ckpt_format == "torch_dist"
    assert (new.tensor_model_parallel_size, new.pipeline_model_parallel_size) != (2, 2)  # the premise: a new layout
    assert loads_optimizer(old, new) is False and new.no_load_optim  # would raise had reshard.sh loaded it


def test_replan_into_megatron_fsdp_writes_no_megatron_files(tmp_path):
    """A torch_dist run (zero 1) replanned into Megatron FSDP (zero 3 without pipelining: fsdp_dtensor, which
    validate_args requires) would not load the old checkpoint: no megatron/ files, and the report says why."""
    run = CliRunner()
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    result = run.invoke(cli, ["compile", "tiny-llama", "cpu:2", "-b", "8", "-s", "128", "--target", "megatron",
                              "--fix", "tp=2,pp=2,zero=1,vpp=1", "-o", str(old_dir)])
    assert result.exit_code == 0, result.output
    result = run.invoke(cli, ["replan", str(old_dir / "plan.json"), "cpu:1", "--fix", "pp=1,zero=3",
                              "-o", str(new_dir)])
    assert result.exit_code == 0, result.output
    assert not (new_dir / "megatron").exists()
    assert "no megatron/ files: the old run saved torch_dist checkpoints" in result.output + \
        (new_dir / "report.md").read_text()
