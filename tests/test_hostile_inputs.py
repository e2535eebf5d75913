"""Issue #26: names and launch inputs are data, never code, in every launch file.

Every emitter is rendered through the library with hostile values in every field that reaches a file (the
model and cluster names, the strategy line, each launch input), bypassing the input validation that the
command line applies, so that each file's own quoting is what is tested.  Then:

* each file parses to exactly what was meant (tests/launch_checks.py: bash -n, comment lines, #SBATCH
  directives, one YAML document, TOML sections);
* each script runs under bash with stand-in launchers (torchrun, deepspeed, srun, scontrol, kubectl,
  envsubst) that record their arguments: the launcher gets each value as one argument, exactly, and the run
  creates no file but the ones the script is meant to write (a `touch PWNED` in a value would show);
* a value no file can hold (a NUL; anything outside Slurm's directive syntax) is refused with
  PlannerInputError, never written.

The command line refuses the same values where they enter (one line, exit 2): the last tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launch_checks import check_files
from launch_plans import plan_of
from planner.cli import cli
from planner.emit import TARGETS, UnsupportedPlan, emitter
from planner.emit.inputs import ENV, LaunchInputs
from planner.errors import PlannerInputError

HOSTILE = {
    "newline": "demo\ntouch PWNED-newline #",
    "substitution": "$(touch PWNED-dollar)`touch PWNED-tick`;touch PWNED-semi&&touch PWNED-and|tee PWNED-pipe",
    "quotes": "a'b\"c\\ $HOME ${PATH} * ? [x] ~ # end",
    "yaml": "x\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: evil}\n#SBATCH --exclusive",
    "unicode": "ünï ✓\u2028\u2029\x85\x1b]0;t\x07\r\t\x7f' x",
    "nul": "nul\x00;touch PWNED-nul",
}
# the files a script writes on purpose (besides the stand-ins' record)
MAY_WRITE = {"deepspeed": ("hostfile.slurm", "ds_config.steps-3.json")}
STANDIN = r"""#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
entry = {{"argv": sys.argv}}
if name == "kubectl" and sys.argv[-2:] == ["-f", "-"]:
    entry["stdin"] = sys.stdin.read()
with open(os.environ["ARGV_LOG"], "a") as log:
    log.write(json.dumps(entry) + "\n")
if name == "scontrol":
    print("host-a\nhost-b")
elif name == "envsubst":  # the shell-format list names the only variables it replaces
    text = sys.stdin.read()
    for var in sys.argv[1].replace("$", " ").replace("{{", " ").replace("}}", " ").split():
        text = text.replace("${{" + var + "}}", os.environ.get(var, ""))
    sys.stdout.write(text)
elif name == "srun":  # run the command after srun's own options
    command = [a for a in sys.argv[1:]]
    while command and command[0].startswith("--"):
        command.pop(0)
    os.execvp(command[0], command)
"""
LAUNCHERS = ("torchrun", "deepspeed", "srun", "scontrol", "kubectl", "envsubst")
# the flag each target's launcher passes the data and tokenizer under
DATA_FLAGS = {"torch": "--data", "slurm": "--data", "k8s": "--data", "deepspeed": "--data",
              "megatron": "--data-path", "torchtitan": "--training.dataset_path"}
TOKENIZER_FLAGS = {"torch": "--tokenizer", "slurm": "--tokenizer", "k8s": "--tokenizer", "deepspeed": "--tokenizer",
                   "megatron": "--tokenizer-model", "torchtitan": "--model.hf_assets_path"}


@pytest.fixture(scope="module")
def plan_and_job():
    # two nodes, a pipeline: every target writes its files for it (hostfile, directives, Worker replicas)
    return plan_of("tiny-llama", "cpu:2", "tp=1,pp=2,dp=4,mbs=1,zero=1", batch=8, seq=128)


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bin")
    for name in LAUNCHERS:
        path = folder / name
        path.write_text(STANDIN.format(python=sys.executable))
        path.chmod(0o755)
    return folder


def _hostile_plan(plan, job, value: str, model: bool):
    """The plan (and job) with hostile cluster and strategy lines, and a hostile model name when `model`
    (model_copy does not validate: the emitters get the values as they are)."""
    names = {"cluster": value, **({"model": value} if model else {})}
    plan = plan.model_copy(update={"job": plan.job.model_copy(update=names),
                                   "strategy_spec": plan.strategy_spec + " " + value})
    if model:
        job = job.model_copy(update={"model": job.model.model_copy(update={"name": value})})
    return plan, job


def _inputs(value: str | None, given: bool) -> LaunchInputs:
    """Every text launch input `value` (given to compile), or none given (the hostile value then comes from
    the environment at launch)."""
    if not given:
        return LaunchInputs(train_steps=None, save_every=2)
    return LaunchInputs.model_construct(data=value, tokenizer=value, checkpoint_dir=value, image=value,
                                        partition=None, megatron_dir=value, train_steps=3, save_every=2)


def _environment(root: Path, standins: Path, value: str) -> dict[str, str]:
    env = {"PATH": f"{standins}:/usr/bin:/bin", "HOME": str(root), "ARGV_LOG": str(root / "argv.log"),
           "SLURM_SUBMIT_DIR": str(root / "plan"), "SLURM_JOB_NODELIST": "host-[a-b]", "SLURM_CPUS_ON_NODE": "8",
           "SLURM_JOB_ID": "7", "MASTER_ADDR": "localhost", "LC_ALL": "C.UTF-8"}
    env.update({var: value for var, _ in ENV.values()})  # read at launch when not given
    env["PLANNER_TRAIN_STEPS"] = "3"
    env["PLANNER_CHECKPOINTS"] = "/ck/" + value  # Kubernetes mounts the claim there: an absolute path
    return env


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run(target: str, root: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    script = {"slurm": "plan/slurm/job.sbatch", "k8s": "plan/k8s/apply.sh"}.get(target, f"plan/{target}/launch.sh")
    proc = subprocess.run(["bash", script], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    log = root / "argv.log"
    return proc, [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _yaml_text(value: str) -> bool:
    """What apply.sh lets envsubst paste into a double-quoted YAML string: printable ASCII, no quote or backslash."""
    return all(" " <= c <= "~" and c not in '"\\' for c in value)


def _value_after(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def _expected_checkpoint(target: str, value: str, root: Path) -> str:
    """The checkpoint folder the launcher gets: torch and Slurm pass it to the trainer as written; the others
    make a relative one absolute against the launch directory."""
    if target in ("torch", "slurm", "k8s") or value.startswith("/"):
        return value
    return f"{root}/{value}"


def _check_launch(target: str, files: dict[str, str], root: Path, standins: Path, value: str, given: bool) -> None:
    _write(root / "plan" / target, files)
    (root / "plan" / "plan.json").write_text("{}")
    problems = check_files(files, str(root / "plan" / target))
    assert not problems, (target, problems)
    before = _tree(root)
    env = _environment(root, standins, value)
    proc, records = _run(target, root, env)
    if target == "k8s" and not given and not _yaml_text(value):  # stopped before anything is applied
        assert proc.returncode == 2 and "apply.sh: PLANNER_DATA holds a quote" in proc.stderr, proc.stderr
        assert records == [] and _tree(root) == before
        return
    assert proc.returncode == 0, (target, proc.stderr[-2000:])
    checkpoint = value if given else env["PLANNER_CHECKPOINTS"]
    created = _tree(root) - before - {"argv.log"} - {f"plan/{target}/{n}" for n in MAY_WRITE.get(target, ())}
    assert not created, (target, created)  # nothing ran that the script did not mean to run
    if target == "k8s":
        _check_k8s(records, files, value)
        return
    launcher = next(r["argv"] for r in records if Path(r["argv"][0]).name in ("torchrun", "deepspeed"))
    assert _value_after(launcher, DATA_FLAGS[target]) == value
    assert _value_after(launcher, TOKENIZER_FLAGS[target]) == value
    if target == "torchtitan":
        assert _value_after(launcher, "--checkpoint.folder") == _expected_checkpoint(target, checkpoint, root)
    elif target == "megatron":
        assert _value_after(launcher, "--save") == _expected_checkpoint(target, checkpoint, root)
        assert launcher[launcher.index("--rdzv-id") + 2] == f"{value}/pretrain_gpt.py"
    else:
        assert _value_after(launcher, "--checkpoint-dir") == _expected_checkpoint(target, checkpoint, root)


def _check_k8s(records: list[dict], files: dict[str, str], value: str) -> None:
    """The job kubectl applies (after envsubst) is one PyTorchJob whose container gets each value as one
    argument."""
    applied = [r["stdin"] for r in records if "stdin" in r and "PyTorchJob" in r["stdin"]]
    documents = [doc for text in (applied or [files["pytorchjob.yaml"]]) for doc in yaml.safe_load_all(text)]
    assert [doc["kind"] for doc in documents] == ["PyTorchJob"]
    for replica in documents[0]["spec"]["pytorchReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        command = container["command"]
        assert command[:3] == ["torchrun", "-m", "planner.runtime.train"]
        if applied:  # read from the environment: envsubst put the value in
            assert _value_after(command, "--data") == _value_after(command, "--tokenizer") == value
            assert container["image"] == value


def _emit(target: str, plan_and_job, value: str, inputs: LaunchInputs) -> dict[str, str]:
    """The target's files with every name hostile; with a zoo model name where the target builds only models
    it knows (torch, Slurm and Kubernetes run zoo models; Megatron and torchtitan rebuild the model, whose
    name is then checked): the cluster's name and the strategy line stay hostile."""
    try:
        return emitter(target)(*_hostile_plan(*plan_and_job, value, model=True), inputs)
    except UnsupportedPlan:
        return emitter(target)(*_hostile_plan(*plan_and_job, value, model=False), inputs)


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("given", [True, False], ids=["given", "from-env"])
@pytest.mark.parametrize("target", TARGETS)
def test_hostile_values_stay_data_in_every_launch_file(plan_and_job, standins, tmp_path, case, given, target):
    value = HOSTILE[case]
    refused = given and "\x00" in value
    try:
        files = _emit(target, plan_and_job, value, _inputs(value, given))
    except PlannerInputError as err:  # a value this file cannot hold: refused, naming it
        assert refused, (target, case, err)
        return
    assert not refused, f"{target} wrote a value it cannot hold: {value!r}"
    if "\x00" in value and not given:
        return  # no environment variable can hold a NUL: nothing to run
    _check_launch(target, files, tmp_path, standins, value, given)


def test_a_cluster_name_reaches_the_torch_comment_escaped(plan_and_job):
    # the torch target builds zoo models only, so its comment carries the cluster's hostile name
    plan, job = _hostile_plan(*plan_and_job, HOSTILE["newline"], model=False)
    text = emitter("torch")(plan, job, LaunchInputs())["launch.sh"]
    assert "# tiny-llama on demo\\ntouch PWNED-newline #: " in text
    assert "\ntouch PWNED-newline" not in text


def test_toml_strings_load_back_exactly(plan_and_job):
    import tomllib

    value = HOSTILE["unicode"] + HOSTILE["quotes"]
    plan, job = _hostile_plan(*plan_and_job, value, model=True)
    files = emitter("torchtitan")(plan, job, LaunchInputs())
    config = tomllib.loads(files["train.toml"])
    assert config["model"]["flavor"] == value
    assert config["job"]["description"] == f"{value}: {plan.strategy_spec}"


@pytest.mark.parametrize("partition", ["gpu\ntouch PWNED #", "gpu --exclusive", "a#b", "x\x00"])
def test_a_partition_outside_the_directive_syntax_is_refused(plan_and_job, partition):
    inputs = LaunchInputs.model_construct(**{**LaunchInputs().model_dump(), "partition": partition})
    with pytest.raises(PlannerInputError, match="--partition"):
        emitter("slurm")(*plan_and_job, inputs)


def test_a_dollar_that_envsubst_would_replace_is_refused(plan_and_job):
    # the image is read at launch, so apply.sh runs envsubst over the YAML, which has no escape for '$'
    inputs = LaunchInputs(data="/data/${PLANNER_IMAGE}", tokenizer="t", checkpoint_dir="/c", train_steps=3)
    with pytest.raises(PlannerInputError, match="k8s: data '/data/\\$\\{PLANNER_IMAGE\\}' holds '\\$'"):
        emitter("k8s")(*plan_and_job, inputs)
    given = inputs.model_copy(update={"image": "reg/planner:1"})  # nothing read at launch: no envsubst
    assert "/data/${PLANNER_IMAGE}" in emitter("k8s")(*plan_and_job, given)["pytorchjob.yaml"]


def test_the_directives_are_the_intended_set(plan_and_job, tmp_path):
    files = emitter("slurm")(*plan_and_job, LaunchInputs(partition="gpu,debug"))
    _write(tmp_path, files)
    expected = {"--job-name", "--partition", "--nodes", "--ntasks-per-node", "--exclusive", "--output"}
    assert check_files(files, str(tmp_path), sbatch=expected) == []
    assert "#SBATCH --partition=gpu,debug\n" in files["job.sbatch"]


# ---------------------------------------------------------------- where the values enter: one line, exit 2


def _one_line(result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "\x1b" not in lines[0] and "\x00" not in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _compile(tmp_path: Path, *args) -> object:
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        return CliRunner().invoke(cli, ["compile", *map(str, args), "-b", "8", "-s", "64", "--time-limit", "5",
                                        "-o", "out"])
    finally:
        os.chdir(old)


@pytest.mark.parametrize("case", ["newline", "substitution", "yaml", "unicode"])
def test_a_hostile_cluster_name_is_refused_naming_the_file_and_field(tmp_path, case):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"name": HOSTILE[case], "pools": [{"name": "a", "preset": "cpu", "nodes": 2}]}))
    _one_line(_compile(tmp_path, "tiny-llama", cluster, "--target", "torch"), "c.yaml: name: ", "is not a name")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("PWNED*"))


def test_a_hostile_pool_name_and_model_name_are_refused(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"pools": [{"name": "a\nb", "preset": "cpu", "nodes": 1}]}))
    _one_line(_compile(tmp_path, "tiny-llama", cluster), "c.yaml: pools[0].name: ")
    model = tmp_path / "m.json"
    model.write_text(json.dumps({"builder": "llama", "name": "m$(id)", "num_layers": 2, "hidden": 64, "heads": 4,
                                 "ffn": 128, "vocab": 256}))
    _one_line(_compile(tmp_path, model, "cpu:1"), "m.json: name: ")


def test_names_read_off_file_names_are_made_names(tmp_path):
    folder = tmp_path / "My Model (v2)\n$(x)"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 256}))
    result = CliRunner().invoke(cli, ["show", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["name"] == "My-Model-v2-x"
    cluster = tmp_path / "my lab;rm.yaml"
    cluster.write_text("pools:\n  - {name: a, preset: cpu, nodes: 1}\n")
    result = CliRunner().invoke(cli, ["show", str(cluster), "--json"])
    assert json.loads(result.output)["name"] == "my-lab-rm"


@pytest.mark.parametrize("option, value, fragment", [
    ("--partition", "gpu\ntouch PWNED #", "not a Slurm partition name"),
    ("--partition", "gpu --exclusive", "not a Slurm partition name"),
    ("--image", "img\n---\nkind: Pod", "not a container image reference"),
    ("--image", "${EVIL}", "not a container image reference"),
    ("--data", "d\ntouch PWNED", "control character"),
    ("--tokenizer", "t\x1b]0;x\x07", "control character"),
    ("--checkpoint-dir", "ck\u2028pt", "control character"),
    ("--megatron-dir", "--help", "starts with '-'"),
    ("--data", "", "must not be empty"),
])
def test_hostile_launch_options_are_refused_naming_the_option(tmp_path, option, value, fragment):
    line = _one_line(_compile(tmp_path, "tiny-llama", "cpu:1", "--target", "torch", option, value), option, fragment)
    assert "\n" not in line and not (tmp_path / "out").exists()


def test_a_hostile_plan_name_is_refused_by_simulate_and_replan(tmp_path):
    assert _compile(tmp_path, "tiny-llama", "cpu:2").exit_code == 0
    data = json.loads((tmp_path / "out" / "plan.json").read_text())
    data["job"]["cluster"] = "cpu:2\ntouch PWNED #"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    for command in (["simulate", str(edited)], ["replan", str(edited), "cpu:1"]):
        _one_line(CliRunner().invoke(cli, command), "job.cluster")
