"""Malformed input never costs a traceback: every command, run in-process on generated files and SPECs.

Each example writes a generated model spec, HF config.json, cluster file, SPEC string,
sweep file or sharding plan and runs the command that reads it.  Whatever the input:

- the exit code is 0, 1 or 2 (1: infeasible, 2: bad input), never an uncaught exception;
- exit 2 prints exactly one line on stderr, and no output anywhere is a traceback;
- a failed command leaves nothing behind: no output folder, no staging folder beside it.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import cli

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# values of every type a hand-edited file holds, the edge cases included
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-3, max_value=70_000),
    st.sampled_from([0, -1, 10**160, 2**63, 10**320 // 10**300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["1e160", "8", "llama", "gpt", "nan", "", "∞", "\x00"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)

MODEL_KEYS = ["builder", "name", "num_layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions",
              "base", "overrides", "num_experts", "top_k", "source", "tied_embeddings"]
HF_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "intermediate_size", "vocab_size", "max_position_embeddings", "num_local_experts", "num_experts_per_tok",
           "n_embd", "n_layer", "n_head", "tie_word_embeddings"]
POOL_KEYS = ["name", "preset", "nodes", "overrides", "device", "gpus_per_node"]
SPEC_KEYS = ["tp", "pp", "dp", "cp", "ep", "mbs", "vpp", "sp", "zero", "shard", "recompute", "recompute_layers",
             "offload", "offload_device", "offload_ratio", "regather", "schedule", "tp_overlap", "split", "bogus"]
SPEC_VALUES = ["0", "1", "2", "3", "4", "-1", "8", "on", "off", "full", "node", "selective", "none", "all", "cpu",
               "nvme", "0.5", "2/2", "1f1b", "interleaved", "gpipe", "x", "", "1e9", "a/b"]


def _mapping(keys: list[str], required: dict) -> st.SearchStrategy[dict]:
    base = st.fixed_dictionaries(required)
    extra = st.dictionaries(st.sampled_from(keys), VALUES, max_size=len(keys))
    return st.tuples(base, extra).map(lambda pair: {**pair[0], **pair[1]})


MODEL_SPECS = _mapping(MODEL_KEYS, {"builder": st.sampled_from(["llama", "gpt", "mixtral", "x"]),
                                    "name": st.just("fuzz")})
HF_CONFIGS = _mapping(HF_KEYS, {"model_type": st.sampled_from(["llama", "mistral", "mixtral", "qwen2", "gpt2",
                                                               "gpt_neox", "deepseek_v3", "bert", "t5"])})
POOLS = _mapping(POOL_KEYS, {"name": st.sampled_from(["a", "b"]), "preset": st.sampled_from(["dgx-h100", "cpu", "x"]),
                             "nodes": st.sampled_from([1, 2, 0, -1, True, "2"])})
CLUSTERS = st.fixed_dictionaries({"name": st.just("fuzz"), "pools": st.one_of(st.lists(POOLS, max_size=3), VALUES)})
SPECS = st.lists(st.tuples(st.sampled_from(SPEC_KEYS), st.sampled_from(SPEC_VALUES)), max_size=5).map(
    lambda items: ",".join(f"{k}={v}" for k, v in items))
RAW = st.one_of(st.binary(max_size=64), st.sampled_from([b"\xff\xfe\x00bad", b"a: [1, 2", b"{", b"- 1\n- 2\n",
                                                          b"a: 1\na: 2\n", "hidden: 64\n".encode("utf-16")]))


def _dump(data: object, suffix: str) -> bytes:
    if suffix == ".json":
        return json.dumps(data, allow_nan=True, default=str).encode("utf-8")
    return yaml.safe_dump(data, allow_unicode=True).encode("utf-8")


def _invoke(folder: Path, *args: str):
    """Run the CLI in-process in `folder`; check the contract; the result."""
    before = set(os.listdir(folder))
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args, repr(result.exception), result.output[-2000:])
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, result.stderr)
    if result.exit_code != 0:
        left = set(os.listdir(folder)) - before
        assert not left, (args, left)  # no output folder, no staging folder
    return result


def _file(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


@SETTINGS
@given(spec=st.one_of(MODEL_SPECS.map(lambda d: (d, ".yaml")), MODEL_SPECS.map(lambda d: (d, ".json")),
                      RAW.map(lambda b: (b, ".yaml"))))
def test_model_specs(spec):
    data, suffix = spec
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _file(folder, f"model{suffix}", data if isinstance(data, bytes) else _dump(data, suffix))
        _invoke(folder, "show", path, "--json")
        _invoke(folder, "estimate", path, "cpu:1", "-b", "8", "-s", "64")
        _invoke(folder, "compile", path, "cpu:1", "-b", "8", "-s", "64", "--time-limit", "5", "-o", folder / "out")


@SETTINGS
@given(config=st.one_of(HF_CONFIGS.map(lambda d: _dump(d, ".json")), RAW))
def test_hf_configs(config):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _file(folder, "config.json", config)
        _invoke(folder, "show", path)
        _invoke(folder, "estimate", path, "dgx-h100:1", "-b", "8", "-s", "128")


@SETTINGS
@given(cluster=st.one_of(CLUSTERS.map(lambda d: _dump(d, ".yaml")), RAW))
def test_cluster_files(cluster):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _file(folder, "cluster.yaml", cluster)
        _invoke(folder, "show", path, "--json")
        _invoke(folder, "estimate", "tiny-llama", path, "-b", "8", "-s", "64")


@SETTINGS
@given(spec=SPECS)
def test_strategy_specs(spec):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _invoke(folder, "estimate", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--strategy", spec)
        _invoke(folder, "compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--fix", spec, "--time-limit", "5",
                "-o", folder / "out")


SWEEPS = st.fixed_dictionaries({}, optional={
    "models": st.one_of(st.lists(st.sampled_from(["tiny-llama", "nope", "", "llama3-8b"]), max_size=2), VALUES),
    "clusters": st.one_of(st.lists(st.sampled_from(["cpu:1", "cpu:0", "x:1", "dgx-h100:1"]), max_size=2), VALUES),
    "batches": st.one_of(st.lists(st.sampled_from([8, 0, -1, True, "8"]), max_size=2), VALUES),
    "seq_lens": st.one_of(st.lists(st.sampled_from([64, 0, 1.5]), max_size=2), VALUES),
    "strategies": st.one_of(st.lists(st.sampled_from(["zero1", "nope", "ddp"]), max_size=2), VALUES),
    "time_limit": st.one_of(st.sampled_from([5, 0, -1, float("inf")]), VALUES),
    "scenarios": VALUES,
    "bogus": VALUES,
})


@settings(SETTINGS, max_examples=40)
@given(sweep=st.one_of(SWEEPS.map(lambda d: _dump(d, ".yaml")), RAW))
def test_sweep_files(sweep):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = _file(folder, "sweep.yaml", sweep)
        # one worker in-process: a generated file that happens to be valid runs a tiny job
        _invoke(folder, "sweep", path, "-o", folder / "out", "--workers", "1")


SHARD_TYPES = ["data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "bogus"]
SHARDS = st.fixed_dictionaries({
    "sharding_type": st.sampled_from(SHARD_TYPES),
    "ranks": st.one_of(st.lists(st.integers(min_value=-2, max_value=9), max_size=4), VALUES),
}, optional={"cache_params": st.one_of(st.fixed_dictionaries({"load_factor": st.floats(min_value=-1, max_value=2)}),
                                        VALUES),
             "compute_kernel": st.sampled_from(["fused", "dense", "fused_uvm", "fused_uvm_caching", "x"]),
             "bogus": VALUES})


@functools.lru_cache(maxsize=1)
def _sharding_plan() -> str:
    """The sharding_plan.json that `compile` writes for tiny-dlrm on cpu:1 (compiled once)."""
    with tempfile.TemporaryDirectory() as tmp:
        ok = CliRunner().invoke(cli, ["compile", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "--time-limit", "5",
                                      "-o", str(Path(tmp) / "plan")])
        assert ok.exit_code == 0, ok.output
        return (Path(tmp) / "plan" / "sharding_plan.json").read_text()


@SETTINGS
@given(tables=st.lists(SHARDS, max_size=4), raw=st.one_of(st.none(), RAW))
def test_sharding_plans(tables, raw):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        good = json.loads(_sharding_plan())
        if raw is not None:
            data = raw
        else:
            names = sorted(good["tables"])
            for i, table in enumerate(tables):
                name = names[i % len(names)]
                good["tables"][name] = {**good["tables"][name], **table}
            data = json.dumps(good).encode("utf-8")
        path = _file(folder, "sharding_plan.json", data)
        _invoke(folder, "estimate", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "--sharding", path)


# ---------------------------------------------------------------- issue #26: emitted files, plan.json readers

# names and launch inputs a user (or an attacker) might write: every character class the launch files'
# languages treat specially, and arbitrary text
HOSTILE_TEXT = st.one_of(
    st.text(max_size=24),
    st.text(alphabet=st.sampled_from(list("\n\r\t\x00\x1b\x7f\x85\u2028\u2029'\"`$(){}[];&|<>#*?~\\ -:=,/.aZ9ü✓")),
            min_size=1, max_size=24),
    st.sampled_from(["demo\ntouch PWNED #", "$(touch PWNED)", "`touch PWNED`", "x\n---\nkind: Pod", "a'b\"c",
                     "#SBATCH --exclusive", "-rf", "--help", "${PLANNER_DATA}", "\\", "nul\x00x"]),
)


@functools.lru_cache(maxsize=1)
def _tiny_plan():
    from launch_plans import plan_of

    return plan_of("tiny-llama", "cpu:2", "tp=1,pp=2,dp=4,mbs=1,zero=1", batch=8, seq=128)


def _emit_hostile(target: str, name: str, value: str):
    """The target's files for the tiny plan with `name` as cluster, model and strategy line and `value` in
    every text launch input (no validation: the emitter's quoting alone), or None when it refuses them."""
    from planner.emit import UnsupportedPlan, emitter
    from planner.emit.inputs import LaunchInputs
    from planner.errors import PlannerInputError

    plan, job = _tiny_plan()
    inputs = LaunchInputs.model_construct(data=value, tokenizer=value, checkpoint_dir=value, image=value,
                                          partition=None, megatron_dir=value, train_steps=3, save_every=2)
    for with_model in (True, False):  # torch, Slurm and Kubernetes build zoo models only
        names = {"cluster": name, **({"model": name} if with_model else {})}
        hostile = plan.model_copy(update={"job": plan.job.model_copy(update=names),
                                          "strategy_spec": plan.strategy_spec + name})
        hostile_job = job.model_copy(update={"model": job.model.model_copy(update={"name": name})}) \
            if with_model else job
        try:
            return emitter(target)(hostile, hostile_job, inputs)
        except UnsupportedPlan:
            continue
        except PlannerInputError as err:  # only a value no file can carry
            assert "\x00" in value or (target == "k8s" and "$" in value), (target, name, value, err)
            return None
    raise AssertionError(f"{target} refused the plan with a zoo model")


@settings(SETTINGS, max_examples=30)
@given(name=HOSTILE_TEXT, value=HOSTILE_TEXT)
def test_hostile_names_and_inputs_through_every_target(name, value):
    from launch_checks import check_files
    from planner.emit import TARGETS

    with tempfile.TemporaryDirectory() as tmp:
        for target in TARGETS:
            files = _emit_hostile(target, name, value)
            if files is None:
                continue
            folder = Path(tmp) / target
            for rel, text in files.items():
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_text(text, encoding="utf-8")
            assert check_files(files, str(folder)) == [], (target, name, value)


@settings(SETTINGS, max_examples=15)
@given(name=HOSTILE_TEXT)
def test_hostile_cluster_names_through_compile(name):
    from launch_checks import check_files

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cluster = _file(folder, "cluster.yaml", _dump({"name": name, "pools": [{"name": "a", "preset": "cpu",
                                                                                 "nodes": 2}]}, ".yaml"))
        out = folder / "out"
        result = _invoke(folder, "compile", "tiny-llama", cluster, "-b", "8", "-s", "64", "--time-limit", "5",
                         "--target", "torch", "--target", "slurm", "--target", "k8s", "-o", out)
        if result.exit_code == 0:  # a name the loader accepts: the files hold it as data
            files = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()
                     and p.suffix != ".png"}
            assert check_files(files, str(out)) == []


@functools.lru_cache(maxsize=1)
def _plan_json() -> str:
    """The plan.json that `compile` writes for tiny-llama on cpu:2 (compiled once)."""
    with tempfile.TemporaryDirectory() as tmp:
        ok = CliRunner().invoke(cli, ["compile", "tiny-llama", "cpu:2", "-b", "8", "-s", "64", "--time-limit", "5",
                                      "--fix", "pp=2", "-o", str(Path(tmp) / "plan")])
        assert ok.exit_code == 0, ok.output
        return (Path(tmp) / "plan" / "plan.json").read_text()


def _paths(data: object, path: tuple = ()) -> list[tuple]:
    """Every key or index path of a JSON document (containers and leaves)."""
    out = [path]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _paths(value, (*path, i))
    return out


def _trainer_contract(path: Path) -> None:
    """The trainer on `path`, started without torchrun: whatever the plan, one line and exit 2 (the plan is
    refused, or it is fine and the missing torchrun environment is), never a traceback."""
    import contextlib
    import io

    from planner.runtime import train

    saved = {name: os.environ.pop(name) for name in train.TORCHRUN_ENV if name in os.environ}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                train.main(["--plan", str(path)])
            except SystemExit as exit_:
                assert exit_.code == 2, (exit_.code, err.getvalue())
            else:
                raise AssertionError("the trainer ran without torchrun")
    finally:
        os.environ.update(saved)
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m planner.runtime.train: error: "), err.getvalue()


@settings(SETTINGS, max_examples=30)
@given(data=st.data())
def test_edited_plan_json_through_replan_simulate_and_the_trainer(data):
    pytest_torch = __import__("importlib").util.find_spec("torch")
    plan = json.loads(_plan_json())
    path = data.draw(st.sampled_from(_paths(plan)[1:]))
    value = data.draw(st.one_of(VALUES, HOSTILE_TEXT))
    target = plan
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        edited = _file(folder, "plan.json", json.dumps(plan, allow_nan=True, default=str).encode("utf-8"))
        _invoke(folder, "simulate", edited)
        _invoke(folder, "replan", edited, "cpu:1", "--time-limit", "5")
        if pytest_torch is not None:
            _trainer_contract(edited)
