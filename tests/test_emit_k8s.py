"""Kubernetes target: pytorchjob.yaml, checkpoints-pvc.yaml and apply.sh, and the repository's Dockerfile.

apply.sh runs here with a stand-in `kubectl` on PATH that records what it is asked and what it is fed, and
the real `envsubst`; what it would apply is checked against the Kubeflow training-operator v1.9.0
PyTorchJob CRD's OpenAPI schema (vendored: tests/data/kubeflow_pytorchjob_crd_v1.9.0.yaml) with
jsonschema, field by field (the API server drops fields its schema does not declare, so a misspelt
`hostNetwork` would vanish silently), against the operator's admission webhook rules
(pkg/webhooks/pytorch/pytorchjob_webhook.go: DNS-1035 name, Master/Worker only, one Master, a
container named pytorch with an image), and against the core Pod rules the schema cannot state
(volume references, absolute mount paths, extended resources as integer limits).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from hardware import load_cluster
from tools import shellcheck
from planner.emit import emitter
from planner.emit.inputs import LaunchInputs
from launch_plans import big_plan, tiny_plan

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "tests" / "data" / "kubeflow_pytorchjob_crd_v1.9.0.yaml"
ENVSUBST = shutil.which("envsubst")
INPUTS = {"PLANNER_DATA": "/data/tok/corpus", "PLANNER_TOKENIZER": "meta-llama/Meta-Llama-3-70B",
          "PLANNER_CHECKPOINTS": "/checkpoints/llama3-70b", "PLANNER_TRAIN_STEPS": "1000",
          "PLANNER_IMAGE": "registry.example.com/planner-runtime:0.1.0"}
KNOWN_INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                      "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


@pytest.fixture(scope="module")
def schema() -> dict:
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == "PyTorchJob"
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

@pytest.fixture(scope="module")
def big():
    return big_plan()


@pytest.fixture(scope="module")
def tiny():
    return tiny_plan()


# ---------------------------------------------------------------- validators


def unknown_fields(doc, schema: dict, path: str = "") -> list[str]:
    """Paths of the keys `schema` does not declare (the API server prunes them)."""
    if isinstance(doc, list):
        return [u for i, item in enumerate(doc) for u in unknown_fields(item, schema.get("items", {}), f"{path}[{i}]")]
    if not isinstance(doc, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    declared, extra = schema.get("properties", {}), schema.get("additionalProperties")
    out = []
    for key, value in doc.items():
        if key in declared:
            out += unknown_fields(value, declared[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            out += unknown_fields(value, extra, f"{path}.{key}")
        else:
            out.append(f"{path}.{key}")
    return out


def schema_problems(doc: dict, schema: dict) -> list[str]:
    """jsonschema errors and undeclared fields of a PyTorchJob (ObjectMeta is the API server's own)."""
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft4Validator(schema).iter_errors(doc)]
    body = {k: v for k, v in doc.items() if k != "metadata"}
    problems += unknown_fields(body, schema)
    problems += [f".metadata.{k}" for k in doc.get("metadata", {}) if k not in ("name", "labels", "annotations")]
    return problems


def webhook_problems(doc: dict) -> list[str]:
    """The training operator's admission rules for a PyTorchJob (pytorchjob_webhook.go, v1.9.0)."""
    problems = []
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]) or len(doc["metadata"]["name"]) > 63:
        problems.append("metadata.name: not a DNS-1035 label")
    for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
        containers = spec["template"]["spec"].get("containers", [])
        if role not in ("Master", "Worker"):
            problems.append(f"{role}: not Master or Worker")
        if not containers or any(not c.get("image") for c in containers):
            problems.append(f"{role}: containers and their images are required")
        if "pytorch" not in [c["name"] for c in containers]:
            problems.append(f"{role}: no container named pytorch")
        if (role == "Master" and spec.get("replicas") != 1) or spec.get("replicas", 1) < 1:
            problems.append(f"{role}: replicas")
    return problems


def pod_problems(pod: dict) -> list[str]:
    """Core Pod rules the CRD schema does not state."""
    problems = []
    volumes = [v["name"] for v in pod.get("volumes", [])]
    if len(volumes) != len(set(volumes)):
        problems.append("volume names repeat")
    for c in pod["containers"]:
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if len(mounts) != len(set(mounts)) or any(not m.startswith("/") for m in mounts):
            problems.append(f"{c['name']}: mount paths must be absolute and distinct")
        problems += [f"{c['name']}: mount of unknown volume {m['name']}" for m in c.get("volumeMounts", [])
                     if m["name"] not in volumes]
        resources = c.get("resources", {})
        for name, value in resources.get("limits", {}).items():
            if "/" in name and not isinstance(value, int):  # extended resources: whole units
                problems.append(f"{c['name']}: {name} must be an integer")
        for name in resources.get("requests", {}):
            if "/" in name and resources["requests"][name] != resources.get("limits", {}).get(name):
                problems.append(f"{c['name']}: extended resource {name} requested but not limited alike")
    return problems


# ---------------------------------------------------------------- apply.sh with a stand-in kubectl


FAKE_KUBECTL = """#!/usr/bin/env bash
# stand-in for kubectl: record the call (and what it reads from stdin) in a folder of its own (the two ends
# of a pipe run at once), print a manifest for `create`
call=$(mktemp -d "$KUBE_LOG/call.XXXXXX")
{ printf '%s\\n' "$PWD"; printf '%s\\n' "$@"; } > "$call/args"
if [[ $1 == create ]]; then printf 'apiVersion: v1\\nkind: ConfigMap\\n'; fi
if [[ " $* " == *" -f - "* ]]; then cat > "$call/stdin"; fi
"""


def _folder(tmp: Path, files: dict[str, str]) -> Path:
    """A plan folder: plan.json and the k8s/ files."""
    folder = tmp / "plan"
    (folder / "k8s").mkdir(parents=True)
    (folder / "plan.json").write_text("{}\n")
    for path, text in files.items():
        (folder / "k8s" / path).write_text(text)
    return folder


def apply(tmp: Path, files: dict[str, str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run k8s/apply.sh from elsewhere; the calls kubectl got: {cwd, args, stdin}."""
    folder = _folder(tmp, files)
    log = tmp / "kubectl"
    log.mkdir()
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(FAKE_KUBECTL)
    (bin_dir / "kubectl").chmod(0o755)
    full = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp), "KUBE_LOG": str(log), **env}
    done = subprocess.run(["bash", str(folder / "k8s" / "apply.sh")], cwd=tmp, env=full, capture_output=True,
                          text=True, timeout=60)
    calls = []
    for call in sorted(log.iterdir()):
        cwd, *args = (call / "args").read_text().splitlines()
        stdin = call / "stdin"
        calls.append({"cwd": cwd, "args": args, "stdin": stdin.read_text() if stdin.exists() else None})
    return done, sorted(calls, key=lambda c: c["args"])


def _job(calls: list[dict]) -> dict:
    return next(yaml.safe_load(c["stdin"]) for c in calls if c["stdin"] and "PyTorchJob" in c["stdin"])


def _pod(job: dict, role: str = "Master") -> dict:
    return job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]


# ---------------------------------------------------------------- tests


needs_envsubst = pytest.mark.skipif(ENVSUBST is None, reason="envsubst is not installed (Debian package gettext-base)")


@needs_envsubst
def test_applied_job_is_valid_for_the_operator_and_asks_for_the_fabric(big, schema, tmp_path):
    files = emitter("k8s")(*big)
    assert sorted(files) == ["apply.sh", "checkpoints-pvc.yaml", "pytorchjob.yaml"]
    done, calls = apply(tmp_path, files, INPUTS)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "plan" / "k8s"
    assert [c["cwd"] for c in calls] == [str(folder)] * 4
    piped, piped_too, claim, create = (c["args"] for c in calls)  # sorted by their arguments
    assert create[:3] == ["create", "configmap", "planner-llama3-70b-plan"]
    assert "--from-file=plan.json=../plan.json" in create and (folder / "../plan.json").is_file()
    assert claim == ["apply", "-f", "checkpoints-pvc.yaml"] and piped == piped_too == ["apply", "-f", "-"]
    assert sorted(yaml.safe_load(c["stdin"])["kind"] for c in calls if c["stdin"]) == ["ConfigMap", "PyTorchJob"]
    job = _job(calls)
    assert schema_problems(job, schema) == [] and webhook_problems(job) == []
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert job["spec"]["nprocPerNode"] == "8" and specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 7
    for role in ("Master", "Worker"):
        pod = _pod(job, role)
        assert pod_problems(pod) == []
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        container = pod["containers"][0]
        assert container["image"] == INPUTS["PLANNER_IMAGE"]
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert limits["nvidia.com/gpu"] == 8 and any(name.startswith("rdma/") for name in limits)
        node = load_cluster("dgx-h100:8").pools[0].node
        memory = int(requests["memory"].removesuffix("Gi")) * 2**30
        assert node.host_dram_bytes / 2 < memory < node.host_dram_bytes and int(requests["cpu"]) >= 8
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"


@needs_envsubst
def test_trainer_runs_in_the_plan_folder_with_its_inputs_and_checkpoint_volume(big, schema, tmp_path):
    done, calls = apply(tmp_path, emitter("k8s")(*big), INPUTS)
    assert done.returncode == 0, done.stderr
    job = _job(calls)
    pod = _pod(job)
    container = pod["containers"][0]
    command = container["command"]
    assert command[:5] == ["torchrun", "-m", "planner.runtime.train", "--plan", "plan.json"]
    options = dict(zip(command[3::2], command[4::2]))
    assert all(isinstance(word, str) for word in command)  # "1000" stays a string after envsubst
    assert options["--data"] == INPUTS["PLANNER_DATA"] and options["--train-steps"] == "1000"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # plan.json where the trainer looks for it: the working folder
    assert mounts["plan"]["mountPath"] == f"{container['workingDir']}/{options['--plan']}"
    configmap = [c["args"][2] for c in calls if c["args"][:2] == ["create", "configmap"]]
    assert volumes["plan"]["configMap"]["name"] == configmap[0] and mounts["plan"]["subPath"] == "plan.json"
    # checkpoints: the claim is mounted where the trainer saves
    assert mounts["checkpoints"]["mountPath"] == options["--checkpoint-dir"] == INPUTS["PLANNER_CHECKPOINTS"]
    claim = yaml.safe_load((tmp_path / "plan" / "k8s" / "checkpoints-pvc.yaml").read_text())
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"} and mounts["dshm"]["mountPath"] == "/dev/shm"
    # the claim's spec is a core PersistentVolumeClaimSpec (the CRD holds its schema under ephemeral volumes)
    pvc_spec = (schema["properties"]["spec"]["properties"]["pytorchReplicaSpecs"]["additionalProperties"]
                ["properties"]["template"]["properties"]["spec"]["properties"]["volumes"]["items"]["properties"]
                ["ephemeral"]["properties"]["volumeClaimTemplate"]["properties"]["spec"])
    assert list(jsonschema.Draft4Validator(pvc_spec).iter_errors(claim["spec"])) == []
    assert unknown_fields(claim["spec"], pvc_spec) == [] and claim["kind"] == "PersistentVolumeClaim"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    params = big[0].job.model_params
    storage = int(claim["spec"]["resources"]["requests"]["storage"].removesuffix("Gi")) * 2**30
    assert storage >= 12 * params  # at least fp32 weights and two AdamW moments


@needs_envsubst
def test_envsubst_fills_in_only_the_launch_inputs(big, tmp_path):
    files = emitter("k8s")(*big)
    files["pytorchjob.yaml"] += "# keep $HOME and ${HOME} as they are\n"
    done, calls = apply(tmp_path, files, INPUTS)
    assert done.returncode == 0, done.stderr
    rendered = next(c["stdin"] for c in calls if c["stdin"] and "PyTorchJob" in c["stdin"])
    assert "# keep $HOME and ${HOME} as they are" in rendered and "${PLANNER" not in rendered


@pytest.mark.parametrize("drop, expected", [("PLANNER_IMAGE", "PLANNER_IMAGE"), ("PLANNER_DATA", "PLANNER_DATA")])
def test_an_input_not_given_stops_apply_before_kubectl_runs(big, tmp_path, drop, expected):
    done, calls = apply(tmp_path, emitter("k8s")(*big), {k: v for k, v in INPUTS.items() if k != drop})
    assert done.returncode != 0 and expected in done.stderr and calls == []


def test_a_relative_checkpoint_folder_from_the_environment_is_refused(big, tmp_path):
    done, calls = apply(tmp_path, emitter("k8s")(*big), {**INPUTS, "PLANNER_CHECKPOINTS": "ckpt"})
    assert done.returncode == 2 and calls == []
    assert "PLANNER_CHECKPOINTS must be an absolute path in the container" in done.stderr


def test_given_inputs_need_no_envsubst(big, schema, tmp_path):
    given = LaunchInputs(data="/d/corpus", tokenizer="tok", checkpoint_dir="ckpt", train_steps=7, image="reg/img:1")
    files = emitter("k8s")(*big, given)
    assert "${" not in files["pytorchjob.yaml"] and "envsubst" not in files["apply.sh"]
    done, calls = apply(tmp_path, files, {})
    assert done.returncode == 0, done.stderr
    assert ["apply", "-f", "pytorchjob.yaml"] in [c["args"] for c in calls]
    job = yaml.safe_load(files["pytorchjob.yaml"])
    assert schema_problems(job, schema) == [] and webhook_problems(job) == []
    container = _pod(job)["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["checkpoints"] == f"{container['workingDir']}/ckpt"  # where the trainer resolves "ckpt"
    assert container["command"][container["command"].index("--checkpoint-dir") + 1] == "ckpt"


def test_cpu_nodes_get_gloo_ranks_without_gpus_or_rdma(tiny, schema):
    given = LaunchInputs(data="/d/corpus", tokenizer="tok", checkpoint_dir="/ck", train_steps=7, image="reg/img:1")
    job = yaml.safe_load(emitter("k8s")(*tiny, given)["pytorchjob.yaml"])
    assert schema_problems(job, schema) == [] and webhook_problems(job) == []
    pod = _pod(job)
    assert "hostNetwork" not in pod and pod_problems(pod) == []
    container = pod["containers"][0]
    assert "limits" not in container["resources"] and "securityContext" not in container
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


def test_dlrm_job_is_valid_and_keeps_no_checkpoints(schema, tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli

    out = tmp_path / "dlrm"
    result = CliRunner().invoke(cli, ["compile", "tiny-dlrm", "dgx-a100-40g:2", "-b", "64", "-s", "1", "--time-limit",
                                      "1", "--target", "k8s", "--image", "reg/img:1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (out / "k8s").iterdir()) == ["apply.sh", "pytorchjob.yaml"]  # no claim
    report = (out / "report.md").read_text()
    assert "bash k8s/apply.sh" in report and "`reg/img:1` (given)" in report
    document = yaml.safe_load((out / "k8s" / "pytorchjob.yaml").read_text())
    assert schema_problems(document, schema) == [] and webhook_problems(document) == []
    pod = _pod(document)
    assert pod_problems(pod) == [] and pod["hostNetwork"] is True
    assert pod["containers"][0]["command"] == ["torchrun", "-m", "planner.runtime.dlrm", "--plan", "plan.json"]
    assert document["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


def test_apply_scripts_pass_shellcheck_and_bash_n(big, tiny, tmp_path):
    given = LaunchInputs(data="/d", tokenizer="t", checkpoint_dir="c d", train_steps=3, image="reg/img:1")
    scripts = {"gpu": emitter("k8s")(*big)["apply.sh"], "gpu-given": emitter("k8s")(*big, given)["apply.sh"],
               "cpu": emitter("k8s")(*tiny)["apply.sh"]}
    for name, text in scripts.items():
        path = tmp_path / f"{name}.sh"
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, name
        lint = subprocess.run([shellcheck(), "--severity=style", str(path)], capture_output=True, text=True)
        assert lint.returncode == 0, (name, lint.stdout)


def test_dockerfile_builds_the_runtime_image_from_a_pinned_cuda_pytorch():
    """No docker here: every instruction is a Dockerfile instruction, the base image is pinned by tag, what it
    copies exists, and it installs the runtime extra whose torch pin matches the base image's."""
    import tomllib

    text = (ROOT / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)  # join continued lines
    instructions = [line.split()[0].upper() for line in logical.splitlines() if line.strip() and
                    not line.lstrip().startswith("#")]
    assert set(instructions) <= KNOWN_INSTRUCTIONS, set(instructions) - KNOWN_INSTRUCTIONS
    assert instructions[0] in ("ARG", "FROM") and "FROM" in instructions
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", logical, re.M))
    base = args.get("BASE_IMAGE") or re.search(r"^FROM (\S+)", logical, re.M).group(1)
    repository, _, tag = base.rpartition(":")
    assert repository == "pytorch/pytorch" and "cuda" in tag and tag != "latest"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    torch_pin = next(p for p in pyproject["project"]["optional-dependencies"]["runtime"] if p.startswith("torch=="))
    assert tag.startswith(torch_pin.removeprefix("torch==") + "-")  # pip keeps the image's torch
    for line in logical.splitlines():
        if line.startswith(("COPY", "ADD")):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert re.search(r"pip install [^\n]*\.\[runtime\]", logical)
