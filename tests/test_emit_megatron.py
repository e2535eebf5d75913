"""Megatron-LM target: the arguments build, in megatron-core 0.16.1's own config classes, the model each zoo
family's plan costs; MoE, overlap, vocabulary and launch-script checks.

tests/megatron_config.py maps the emitted flags onto megatron-core's TransformerConfig (MLATransformerConfig),
DistributedDataParallelConfig and OptimizerConfig as Megatron-LM core_v0.16.1's pretrain_gpt.py does, and
counts the parameters of its GPTModel on the meta device.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_job
from launch_plans import MEGATRON_FAMILIES
from megatron_lm import run_script
from tools import shellcheck
from models.spec import spec_from_data
from models.zoo import get_entry
from planner.cost import evaluate
from planner.emit import UnsupportedPlan, emitter
from planner.emit.inputs import LaunchInputs
from planner.emit.megatron_check import check_megatron_args
from planner.plan.assemble import build_plan
from planner.search.result import Certificate, CompileOptions, CompileResult
from planner.profile import load_runtime
from planner.strategy import parse_strategy

TESTS = Path(__file__).parent

FAMILIES = MEGATRON_FAMILIES

# what the models' own configs say (Hugging Face config.json / NeMo; not the emitter's table):
# model -> {flag: value}
PUBLISHED = {
    "llama3-70b": {"rotary-base": "500000", "norm-epsilon": "1e-05"},
    "llama3-405b": {"rotary-base": "500000", "use-rope-scaling": True},
    "llama2-7b": {"rotary-base": "10000", "norm-epsilon": "1e-05"},
    "mistral-7b": {"window-size": "4096,0"},
    "qwen2-7b": {"rotary-base": "1000000", "norm-epsilon": "1e-06", "add-qkv-bias": True},
    "gpt-neox-20b": {"rotary-percent": "0.25", "norm-epsilon": "1e-05"},
    "nemotron-4-340b": {"rotary-percent": "0.5", "apply-layernorm-1p": True, "squared-relu": True},
    "mixtral-8x7b": {"rotary-base": "1000000", "moe-aux-loss-coeff": "0.02"},
    "deepseek-v3": {"norm-epsilon": "1e-06", "moe-router-score-function": "sigmoid",
                    "moe-router-topk-scaling-factor": "2.5", "moe-router-num-groups": "8", "moe-router-group-topk": "4",
                    "moe-router-enable-expert-bias": True},
}


@pytest.fixture(scope="module")
def mc():
    """tests/megatron_config.py, imported when a test here runs (it imports megatron-core, seconds)."""
    import megatron_config

    return megatron_config


def plan_of(job, spec: str):
    """The plan of a hand-written strategy (scored by evaluate, certified as itself)."""
    strategy = parse_strategy(spec)
    estimate = evaluate(job, strategy)
    cert = Certificate(status="OPTIMAL", objective=estimate.step_time_s, bound=estimate.step_time_s, gap=0.0,
                       wall_s=0.0, configurations=1, solved=1, pruned=0)
    result = CompileResult(strategy=strategy, estimate=estimate, certificate=cert, runners_up=[])
    return build_plan(job, result, CompileOptions())


def emitted(family: str, inputs: LaunchInputs = LaunchInputs(), **job_fields):
    """(plan, job, files) of a family's case."""
    model, cluster, batch, seq, spec = FAMILIES[family]
    job = make_job(model, cluster, batch, seq, **job_fields)
    plan = plan_of(job, spec)
    return plan, job, emitter("megatron")(plan, job, inputs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_megatron_core_builds_the_zoo_model(mc, family):
    plan, job, files = emitted(family)
    args = mc.parse_args_txt(files["args.txt"])
    assert check_megatron_args(args, plan.job.num_gpus) == []
    config = mc.core_config(args)  # megatron-core's own checks run in __post_init__
    zoo = get_entry(job.model.name).config
    s = plan.strategy
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size,
            config.expert_model_parallel_size) == (s.tp, s.pp, s.cp, s.ep)
    assert (config.num_layers, config.hidden_size, config.num_attention_heads, config.ffn_hidden_size) == \
        (zoo.num_layers, zoo.hidden, zoo.heads, zoo.ffn)
    if zoo.mla is None:
        assert (config.num_query_groups, config.kv_channels) == (zoo.kv_heads, zoo.head_dim)
    else:
        m = zoo.mla
        assert type(config).__name__ == "MLATransformerConfig"
        assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
                config.v_head_dim) == (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
                                       m.v_head_dim)
        assert config.qk_layernorm  # the latent norms the zoo counts
    assert config.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[zoo.norm]
    assert config.gated_linear_unit == zoo.gated
    activations = {"swiglu": mc.F.silu, "gelu": mc.F.gelu, "squared_relu": mc.squared_relu}
    assert config.activation_func is activations[zoo.activation]
    assert (config.add_bias_linear, config.add_qkv_bias) == (zoo.bias, zoo.qkv_bias)
    assert config.hidden_dropout == config.attention_dropout == (0.1 if zoo.dropout else 0.0)
    if zoo.moe is None:
        assert config.num_moe_experts is None
    else:
        moe = zoo.moe
        assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == \
            (moe.num_experts, moe.top_k, moe.expert_ffn)
        assert config.moe_shared_expert_intermediate_size == (moe.shared_experts * moe.expert_ffn or None)
        layers = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else \
            [int(i % config.moe_layer_freq == 0) for i in range(zoo.num_layers)]
        assert layers == [int(zoo.is_moe_block(i)) for i in range(zoo.num_layers)]
        assert config.expert_tensor_parallel_size == s.tp  # the cost model splits experts over tp too
    # what GPTModel reads from the arguments
    assert args["position-embedding-type"] == {"rope": "rope", "learned": "learned_absolute"}[zoo.position]
    assert bool(args.get("untie-embeddings-and-output-weights")) == (not zoo.tied_embeddings)
    assert int(args["seq-length"]) == job.seq_len <= int(args["max-position-embeddings"])
    if zoo.position == "learned":
        assert int(args["max-position-embeddings"]) == zoo.max_positions  # the table the plan costs
    rows = mc.padded_vocab(zoo.vocab, args)
    assert rows == zoo.vocab if zoo.vocab % s.tp == 0 else (rows % s.tp == 0 and 0 < rows - zoo.vocab < s.tp)
    for flag, value in PUBLISHED.get(job.model.name, {}).items():
        assert args.get(flag) == value, flag


def test_gpt_model_has_the_plans_parameters(mc):
    """megatron-core's GPTModel, built from the emitted arguments, holds exactly the zoo model's parameters
    (plus the vocabulary rows padding adds when tp does not divide it). DeepSeek-V3 is left out: MLA needs
    Transformer Engine (tests/megatron_config.py)."""
    cases, expected = {}, {}
    for family in sorted(set(FAMILIES) - {"deepseek", "llama3.1", "mixtral-8x22b", "llama2"}):
        plan, job, files = emitted(family)
        args = mc.parse_args_txt(files["args.txt"])
        extra_rows = mc.padded_vocab(job.model.vocab, args) - job.model.vocab
        tied = get_entry(job.model.name).config.tied_embeddings
        cases[family] = [files["args.txt"], job.model.vocab]
        expected[family] = sum(layer.params for layer in job.model.layers) + extra_rows * job.model.hidden * (
            1 if tied else 2)
    run = subprocess.run([sys.executable, "-W", "ignore", str(TESTS / "megatron_config.py")], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == expected


@pytest.mark.parametrize("family", ["mixtral", "deepseek"])
def test_moe_plans_carry_the_dispatcher_grouped_gemm_and_balancing(mc, family):
    plan, job, files = emitted(family)
    args = mc.parse_args_txt(files["args.txt"])
    config = mc.core_config(args)
    assert config.moe_token_dispatcher_type == "alltoall"  # the plan costs all-to-all token exchange
    assert config.moe_grouped_gemm and config.moe_router_dtype == "fp32"
    assert config.moe_aux_loss_coeff > 0
    assert config.moe_router_load_balancing_type == ("seq_aux_loss" if family == "deepseek" else "aux_loss")


def test_folded_experts_and_the_all_to_all_overlap_reach_megatron(mc):
    # etp=1 under tp=2 (expert groups folded over tp x dp) and ep_overlap: megatron-core's own config checks
    # (vpp with pp > 1, no full recompute, an all-to-all dispatcher) run on the written flags
    job = make_job("mixtral-8x7b", "dgx-h100:4", 256, 4096, moe_routing="balanced")
    plan = plan_of(job, "tp=2,pp=2,vpp=2,ep=8,etp=1,ep_overlap=on,zero=1,recompute=selective")
    files = emitter("megatron")(plan, job)
    assert "costed with balanced routing" in files["README.md"]  # the run itself routes by the learned router
    args = mc.parse_args_txt(files["args.txt"])
    assert check_megatron_args(args, plan.job.num_gpus) == []
    config = mc.core_config(args)
    assert (config.expert_tensor_parallel_size, config.expert_model_parallel_size) == (1, 8)
    assert config.overlap_moe_expert_parallel_comm and config.delay_wgrad_compute
    from planner.emit.megatron import written_strategy

    written = written_strategy(plan, job)  # what Megatron runs, read back from the flags
    assert (written.etp, written.ep_overlap, written.ep) == (1, True, 8)


def _overlap(mc, spec: str, **job_fields) -> dict:
    job = make_job("llama3-8b", "dgx-h100:2", 64, 4096, **job_fields)
    return mc.parse_args_txt(emitter("megatron")(plan_of(job, spec), job)["args.txt"])


def test_overlap_flags_follow_data_parallelism_and_the_distributed_optimizer(mc):
    # the megatron profile costs data-parallel traffic hidden behind compute (runtimes/megatron.yaml overlap)
    args = _overlap(mc, "tp=2,pp=2,zero=1")  # dp=4
    ddp = mc.ddp_config(args)
    assert ddp.overlap_grad_reduce and ddp.overlap_param_gather and ddp.use_distributed_optimizer
    assert mc.optimizer_config(args).overlap_param_gather
    args = _overlap(mc, "tp=2,pp=2,zero=0")
    assert args.get("overlap-grad-reduce") and "overlap-param-gather" not in args
    args = _overlap(mc, "tp=8,pp=2,zero=1")  # dp=1: nothing to reduce over
    assert "overlap-grad-reduce" not in args and "overlap-param-gather" not in args
    args = _overlap(mc, "tp=4,cp=2,pp=2,zero=1")  # dp=1
    assert args.get("overlap-grad-reduce")  # gradients reduce over dp x cp = 2


def test_optimizer_schedule_and_precision(mc):
    args = _overlap(mc, "tp=2,pp=2,zero=1")
    opt = mc.optimizer_config(args)
    assert opt.optimizer == "adam" and opt.decoupled_weight_decay  # AdamW
    assert 0 < opt.min_lr < opt.lr and opt.weight_decay > 0 and opt.clip_grad == 1.0 and opt.bf16
    assert args["lr-decay-style"] == "cosine" and args["ckpt-format"] == "torch_dist"
    fp8 = mc.core_config(_overlap(mc, "tp=2,pp=2,zero=1", precision="fp8"))
    assert fp8.fp8 == "hybrid" and fp8.bf16
    # MXFP8 on Blackwell: E4M3 data with 1x32 E8M0 scales (Megatron-Core's Fp8Recipe.mxfp8)
    job = make_job("llama3-8b", "dgx-b200:2", 64, 4096, precision="mxfp8")
    mx = mc.core_config(mc.parse_args_txt(emitter("megatron")(plan_of(job, "tp=2,pp=2,zero=1"), job)["args.txt"]))
    assert (mx.fp8, mx.fp8_recipe, mx.bf16) == ("e4m3", "mxfp8", True)
    unfused = _overlap(mc, "tp=2,pp=2,zero=1", flash_attention=False)
    assert mc.core_config(unfused).attention_backend.name == "unfused"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_vocab_padding_is_the_models_vocab(mc, tp):
    job = make_job("llama3-8b", "dgx-h100:2", 64, 4096)
    args = mc.parse_args_txt(emitter("megatron")(plan_of(job, f"tp={tp},pp=2,zero=1"), job)["args.txt"])
    assert mc.padded_vocab(128256, args) == 128256
    assert mc.padded_vocab(128000, args) == 128256  # a tokenizer without the special tokens pads to the same rows


def test_launch_script_passes_shellcheck_and_bash_n(tmp_path):
    for family, inputs in [("deepseek", LaunchInputs()),
                           ("llama3", LaunchInputs(data="data/corpus", tokenizer="meta-llama/Meta-Llama-3-70B",
                                                   checkpoint_dir="ckpt", train_steps=500))]:
        script = tmp_path / f"{family}.sh"
        script.write_text(emitted(family, inputs)[2]["launch.sh"])
        subprocess.run(["bash", "-n", str(script)], check=True)
        check = subprocess.run([shellcheck(), str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout


def _run_launch(tmp_path, files, env):
    """bash megatron/launch.sh from the plan folder with a torchrun that prints its arguments, one per line."""
    launch = run_script(tmp_path, files, env, "--log-interval", "1")
    return launch.run, launch.plan_dir


def test_launch_script_runs_from_the_plan_folder(mc, tmp_path):
    plan, job, files = emitted("deepseek")
    env = {"MEGATRON_DIR": "/opt/megatron", "PLANNER_DATA": "data/corpus_text_document", "PLANNER_TOKENIZER": "tok",
           "PLANNER_CHECKPOINTS": "ckpt", "PLANNER_TRAIN_STEPS": "500"}
    run, plan_dir = _run_launch(tmp_path, files, env)
    assert run.returncode == 0, run.stderr
    words = run.stdout.splitlines()
    script = words.index("/opt/megatron/pretrain_gpt.py")
    assert words[:script].count("--nnodes") == 1 and "c10d" in words[:script]
    given = words[script + 1:]
    flags = mc.parse_args_txt(files["args.txt"])
    assert given[given.index("--moe-layer-freq") + 1] == flags["moe-layer-freq"] == "([0]*3+[1]*58)"  # not globbed
    pairs = {given[i]: given[i + 1] for i in range(len(given) - 1) if given[i].startswith("--")}
    assert pairs["--data-path"] == "data/corpus_text_document" and pairs["--tokenizer-model"] == "tok"
    assert pairs["--save"] == pairs["--load"] == str(plan_dir / "ckpt")  # made absolute where launched
    assert pairs["--train-iters"] == "500" and int(pairs["--lr-warmup-iters"]) > 0
    assert given[-2:] == ["--log-interval", "1"]  # extra arguments come last: they override args.txt
    run, _ = _run_launch(tmp_path / "again", files, {k: v for k, v in env.items() if k != "PLANNER_DATA"})
    assert run.returncode != 0 and "PLANNER_DATA" in run.stderr


def test_given_inputs_are_written_into_the_script(tmp_path):
    inputs = LaunchInputs(data="/data/corpus", tokenizer="meta-llama/Meta-Llama-3-70B", checkpoint_dir="/ckpt",
                          train_steps=1000, save_every=250)
    plan, job, files = emitted("llama3", inputs)
    run, _ = _run_launch(tmp_path, files, {"MEGATRON_DIR": "/opt/megatron"})
    assert run.returncode == 0, run.stderr
    given = run.stdout.splitlines()
    pairs = {given[i]: given[i + 1] for i in range(len(given) - 1) if given[i].startswith("--")}
    assert (pairs["--data-path"], pairs["--save"], pairs["--save-interval"], pairs["--train-iters"]) == \
        ("/data/corpus", "/ckpt", "250", "1000")
    assert "PLANNER_DATA" not in files["launch.sh"]


def test_overridden_zoo_model_is_read_off_the_graph(mc):
    graph = spec_from_data({"zoo": "llama3-8b", "overrides": {"num_layers": 8, "ffn": 8192}})
    job = make_job(graph, "dgx-h100:1", 16, 4096)
    files = emitter("megatron")(plan_of(job, "tp=2,zero=1"), job)
    config = mc.core_config(mc.parse_args_txt(files["args.txt"]))
    assert (config.num_layers, config.ffn_hidden_size, config.num_query_groups, config.gated_linear_unit) == \
        (8, 8192, 8, True)
    assert "read off the model graph" in files["README.md"]
    gpt = spec_from_data({"builder": "gpt", "name": "my-gpt", "num_layers": 4, "hidden": 256, "heads": 4})
    job = make_job(gpt, "dgx-h100:1", 16, 1024)
    config = mc.core_config(mc.parse_args_txt(emitter("megatron")(plan_of(job, "tp=2"), job)["args.txt"]))
    assert (config.add_bias_linear, config.gated_linear_unit, config.hidden_dropout) == (True, False, 0.1)
    mla = spec_from_data({"zoo": "deepseek-v3", "overrides": {"num_layers": 4, "moe": {"first_dense_layers": 1}}})
    job = make_job(mla, "dgx-h100:1", 16, 4096)
    with pytest.raises(UnsupportedPlan, match="multi-latent attention"):
        emitter("megatron")(plan_of(job, "tp=2,ep=4"), job)


GOOD = {"tensor-model-parallel-size": 2, "pipeline-model-parallel-size": 1, "context-parallel-size": 1,
        "expert-model-parallel-size": 2, "micro-batch-size": 1, "global-batch-size": 8, "num-layers": 4,
        "num-attention-heads": 8, "seq-length": 128, "max-position-embeddings": 128, "num-experts": 4,
        "moe-router-topk": 2, "lr": 3e-4, "min-lr": 3e-5}


@pytest.mark.parametrize("change, message", [
    ({"no-such-flag": True}, "--no-such-flag is not a pretrain_gpt.py flag"),
    ({"moe-token-dispatcher-type": "all2all"}, "--moe-token-dispatcher-type must be one of allgather, alltoall, flex"),
    ({"swiglu": "yes"}, "--swiglu takes no value"),
    ({"num-layers": "four"}, "--num-layers needs an int"),
    ({"overlap-param-gather": True, "overlap-grad-reduce": True}, "--overlap-param-gather needs --use-distributed"),
    ({"optimizer-cpu-offload": True}, "--optimizer-cpu-offload needs --use-precision-aware-optimizer"),
    ({"num-query-groups": 2}, "--num-query-groups needs --group-query-attention"),
    ({"max-position-embeddings": 64}, "max-position-embeddings (64) is below seq-length (128)"),
    ({"min-lr": 1e-3}, "min-lr (0.001) exceeds lr"),
    ({"moe-router-topk": 8}, "moe-router-topk (8) exceeds num-experts (4)"),
    ({"moe-router-topk": 1}, "a top-1 softmax router needs --moe-router-pre-softmax"),
    ({"moe-router-enable-expert-bias": True}, "needs --moe-router-score-function sigmoid"),
    ({"moe-layer-freq": "([0]*1+[1]*2)"}, "moe-layer-freq lists 3 layers, num-layers is 4"),
    ({"moe-layer-freq": "__import__('os')"}, "is not an int or a layer list expression"),
    ({"expert-model-parallel-size": 4, "expert-tensor-parallel-size": 2}, "world size (4) is not divisible by expert"),
    ({"overlap-moe-expert-parallel-comm": True, "recompute-granularity": "full"}, "excludes --recompute-granularity"),
    ({"overlap-moe-expert-parallel-comm": True, "pipeline-model-parallel-size": 2, "tensor-model-parallel-size": 1},
     "needs --num-layers-per-virtual-pipeline-stage"),
    ({"overlap-moe-expert-parallel-comm": True, "expert-model-parallel-size": 1},
     "needs expert-model-parallel-size > 1"),
])
def test_megatron_check_rules_of_the_full_argument_set(change, message):
    assert check_megatron_args(GOOD, 4) == []
    errors = check_megatron_args({**GOOD, **change}, 4)
    assert any(message in e for e in errors), errors


def test_every_zoo_transformer_has_its_megatron_facts():
    """A zoo model added without its rotary base, epsilon and router recipe would get Megatron's defaults."""
    from models.transformer import TransformerConfig
    from models.zoo import list_models
    from planner.emit.megatron_model import FACTS

    names = {entry.name for entry in list_models() if isinstance(entry.config, TransformerConfig)}
    assert sorted(names - set(FACTS)) == []
    assert all(FACTS[name].router is not None for name in names if get_entry(name).config.moe is not None)


# issue #27: the recipes' interleaved layouts, blocks that do not fill pp x vpp chunks evenly
RECIPE_LAYOUTS = {
    # NeMo LLAMA31_405B (Megatron-Bridge): 126 blocks on PP8 x VPP8, the embedding and the loss counted as a
    # layer each (--account-for-embedding/loss-in-pipeline-split): 2 layers per chunk
    "llama3-405b": ("dgx-h100:128", 512, 8192, "tp=8,pp=8,vpp=8,cp=2,sp=on,zero=1,schedule=interleaved",
                    (15, 16, 16, 16, 16, 16, 16, 15), "Et*1|" + "t*2|" * 62 + "t*1L"),
    # DeepSeek-V3's 61 blocks on PP8 x VPP4 (Megatron-Bridge's layouts put the embedding with one block and the
    # loss alone in the last chunk)
    "deepseek-v3": ("dgx-h100:128", 8192, 4096, "tp=2,pp=8,vpp=4,ep=64,sp=on,zero=1,schedule=interleaved",
                    (7, 8, 8, 8, 8, 8, 8, 6), "Et*1|" + "t*2|" * 30 + "L"),
}


@pytest.mark.parametrize("model", sorted(RECIPE_LAYOUTS))
def test_interleaved_recipes_with_uneven_chunks_score_and_reach_megatron(mc, model):
    from planner.emit.megatron import strategy_of_args

    cluster, batch, seq, spec, split, layout = RECIPE_LAYOUTS[model]
    job = make_job(model, cluster, batch, seq).on(load_runtime("megatron"))
    plan = plan_of(job, spec)
    assert plan.strategy.split == split and plan.strategy.vpp == int(spec.split("vpp=")[1].split(",")[0])
    args = mc.parse_args_txt(emitter("megatron")(plan, job)["args.txt"])
    assert args["pipeline-model-parallel-layout"] == layout
    assert "num-layers-per-virtual-pipeline-stage" not in args and check_megatron_args(args, plan.job.num_gpus) == []
    config = mc.core_config(args)  # megatron-core parses and validates the layout (E first, L last, layer count)
    assert config.virtual_pipeline_model_parallel_size == plan.strategy.vpp
    layers = config.pipeline_model_parallel_layout.layout
    assert [sum(chunk.count(mc.LayerType.decoder) for chunk in stage) for stage in layers] == list(split)
    # and back: the arguments read as the plan's strategy
    assert strategy_of_args(args, plan.job.num_gpus).split == split


def test_accounted_chunks_follow_megatrons_flat_layer_order():
    # planner.chunks spreads pp x vpp chunks over the flat order [E, blocks..., L] (chunk c: virtual stage c // pp
    # of stage c % pp); each stage's chunks, rebuilt from its block count alone, must be the same
    from planner.chunks import accounted_split, split_chunks
    for blocks in range(4, 70):
        for pp in (2, 3, 4, 8):
            for vpp in (2, 3, 4, 5):
                split = accounted_split(blocks, pp, vpp)
                if split is None or blocks % (pp * vpp) == 0:
                    continue
                chunks, slots = pp * vpp, blocks + 2
                sizes = [slots // chunks + (c < slots % chunks) for c in range(chunks)]
                order = ["E"] + ["t"] * blocks + ["L"]
                flat, start = [], 0
                for size in sizes:
                    flat.append(order[start:start + size].count("t"))
                    start += size
                expected = [tuple(flat[v * pp + s] for v in range(vpp)) for s in range(pp)]
                assert split_chunks(split, vpp) == expected, (blocks, pp, vpp)


def test_the_deepep_dispatcher_reaches_megatron(mc):
    # dispatcher=deepep: the flex dispatcher with the DeepEP backend (core_v0.16.1 --moe-flex-dispatcher-backend),
    # accepted by megatron-core's own TransformerConfig, and read back from the flags
    job = make_job("mixtral-8x7b", "dgx-h100:4", 256, 4096)
    plan = plan_of(job, "tp=2,pp=2,ep=8,etp=1,zero=1,recompute=selective,dispatcher=deepep")
    files = emitter("megatron")(plan, job)
    args = mc.parse_args_txt(files["args.txt"])
    assert check_megatron_args(args, plan.job.num_gpus) == []
    config = mc.core_config(args)
    assert (config.moe_token_dispatcher_type, config.moe_flex_dispatcher_backend) == ("flex", "deepep")
    assert "deep_ep" in files["README.md"]
    from planner.emit.megatron import written_strategy

    assert written_strategy(plan, job).dispatcher == "deepep"
    alltoall = plan_of(job, "tp=2,pp=2,ep=8,etp=1,zero=1,recompute=selective")
    assert written_strategy(alltoall, job).dispatcher == "alltoall"
