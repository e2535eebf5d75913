"""Kubernetes target: a Kubeflow Training Operator PyTorchJob (kubeflow.org/v1), its checkpoint volume
claim and `apply.sh`, which submits both.

* One pod per node: replica Master (1) plus Worker (nodes - 1, omitted on one node).  `nprocPerNode`
  makes the operator set torchrun's PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK / PET_MASTER_ADDR /
  PET_MASTER_PORT, so the container runs `torchrun -m MODULE ARGS` with no rendezvous options, in
  /workspace, the plan folder of the container: plan.json is mounted there from the ConfigMap
  `<job>-plan` (so the trainer's plan-relative paths hold).  A ConfigMap holds at most 1 MiB.
* NCCL over InfiniBand: each GPU pod asks for every GPU of its node (`nvidia.com/gpu`) and one RDMA
  device (RDMA_RESOURCE, the NVIDIA Network Operator's RDMA shared device plugin's example name: a
  cluster-specific name, see `kubectl describe node`), runs in the node's network namespace
  (`hostNetwork`, with `dnsPolicy: ClusterFirstWithHostNet` so the operator's Master service name
  still resolves) and may lock memory for RDMA registration (`IPC_LOCK`); the NCCL settings are
  planner.emit.nodes.nccl_env's.  /dev/shm is a memory emptyDir (the 64 MiB default is too small).
* Requests: CPU_PER_RANK cores per rank (the hardware catalog carries no CPU count; no CPU limit, so a
  pod may use more) and MEMORY_SHARE of the node's host DRAM (the rest is the kubelet's and the
  system's reservation); no memory limit.
* Checkpoints: the claim `<job>-checkpoints` (checkpoints-pvc.yaml: ReadWriteMany, since every pod
  writes its shards; the cluster's default storage class unless one is named there), sized for every
  checkpoint of the run (the trainer keeps each step-N folder: train_steps / save_every of them, or
  CHECKPOINTS_KEPT when the step count is read at launch, and the file says so) of
  CHECKPOINT_BYTES_PER_PARAM bytes per parameter, mounted at the
  checkpoint folder the trainer is given (a relative one under /workspace; $PLANNER_CHECKPOINTS must
  be absolute, apply.sh checks).
* Launch inputs not given to `planner compile` are `${VAR}` in the YAML (image, data, tokenizer,
  checkpoint folder, steps); apply.sh stops naming any that is unset and fills in exactly those with
  `envsubst 'LIST'`, which leaves every other `$` alone.  The dataset and tokenizer paths must be
  readable in the container (in the image, or on a volume added to the pod template).

YAML is written by PyYAML's safe dumper in a fixed key order (deterministic).
"""

from __future__ import annotations

import math
import posixpath

import yaml
from pydantic import BaseModel, ConfigDict, Field

from planner.emit import UnsupportedPlan, strategy_writer
from planner.emit.inputs import ENV, TARGET_INPUTS, LaunchInputs
from planner.emit.nodes import EnvSetting, job_name, launch_shape, nccl_env, node_spec, on_gpus
from planner.emit.quote import argument, comment
from planner.emit.torch import train_argv
from planner.plan.runnable import runtime_problem
from planner.errors import PlannerInputError
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Strategy

API_VERSION = "kubeflow.org/v1"
RDMA_RESOURCE = "rdma/rdma_shared_device_a"  # cluster-specific: the RDMA device plugin's resource name
OPERATOR_PORT = 23456  # the training operator's default PyTorchJob port ("pytorchjob-port")
CPU_PER_RANK = 8  # CPU cores requested per rank: data loading and the launcher's threads (a floor)
MEMORY_SHARE = 0.75  # share of the node's host DRAM requested; kubelet and system reservations need the rest
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two fp32 moments, as torch.distributed.checkpoint saves
CHECKPOINTS_KEPT = 2  # checkpoints the claim holds when the run's length is unknown: the latest and the next
WORKDIR = "/workspace"  # the plan folder inside the container


class PodSpec(BaseModel):
    """What each pod of a PyTorchJob runs and asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    title: str = Field(description="One line on what runs (model, cluster, strategy).")
    name: str = Field(description="Job name (Kubernetes object name).")
    nnodes: int = Field(ge=1, description="Pods, one per node.")
    nproc_per_node: int = Field(ge=1, description="Ranks per pod (GPUs per node).")
    gpus: bool = Field(description="GPU nodes: GPUs, RDMA, hostNetwork and IPC_LOCK; else CPU ranks on gloo.")
    host_dram_bytes: float = Field(gt=0, description="Host DRAM of a node (sizes the memory request).")
    image: str = Field(description="Container image, or ${PLANNER_IMAGE} for envsubst.")
    module: str = Field(description="Python module each rank runs.")
    args: list[str] = Field(description="Its arguments (argv, no shell), paths relative to the plan folder.")
    env: list[EnvSetting] = Field(description="Environment of the container (the NCCL settings).")
    checkpoint_dir: str | None = Field(description="Absolute path the checkpoint claim is mounted at (or "
                                       "${PLANNER_CHECKPOINTS}); None: no checkpoints.")
    checkpoints: int = Field(0, ge=0, description="Checkpoints the claim is sized for.")
    checkpoint_bytes: float = Field(0.0, ge=0, description="Storage the checkpoint claim asks for.")
    run_length_known: bool = Field(True, description="Whether `checkpoints` is the run's count (else a floor).")
    from_env: tuple[str, ...] = Field(description="Launch inputs (LaunchInputs fields) read from the environment: "
                                      "${VAR} in the YAML, filled in by apply.sh with envsubst.")


def _gib(size: float) -> str:
    return f"{max(1, math.ceil(size / 2**30))}Gi"


def _resources(spec: PodSpec) -> dict:
    requests = {"cpu": str(CPU_PER_RANK * spec.nproc_per_node),
                "memory": f"{max(1, int(MEMORY_SHARE * spec.host_dram_bytes // 2**30))}Gi"}
    if not spec.gpus:
        return {"requests": requests}
    return {"requests": requests, "limits": {"nvidia.com/gpu": spec.nproc_per_node, RDMA_RESOURCE: 1}}


def _volumes(spec: PodSpec) -> tuple[list[dict], list[dict]]:
    """(volumeMounts, volumes) of the pod: plan.json, /dev/shm and the checkpoint claim."""
    mounts: list[dict] = [
        {"name": "plan", "mountPath": f"{WORKDIR}/plan.json", "subPath": "plan.json", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict] = [{"name": "plan", "configMap": {"name": f"{spec.name}-plan"}},
               {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if spec.checkpoint_dir is not None:
        mounts.append({"name": "checkpoints", "mountPath": spec.checkpoint_dir})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"{spec.name}-checkpoints"}})
    return mounts, volumes


def _container(spec: PodSpec) -> dict:
    mounts, _ = _volumes(spec)
    env = [{"name": s.name, "value": s.value} for s in spec.env if s.value is not None]
    env.append({"name": "OMP_NUM_THREADS", "value": str(CPU_PER_RANK)})
    container = {
        "name": "pytorch", "image": spec.image, "imagePullPolicy": "IfNotPresent", "workingDir": WORKDIR,
        "command": ["torchrun", "-m", spec.module, *spec.args], "env": env,
        "ports": [{"name": "pytorchjob-port", "containerPort": OPERATOR_PORT}],
        "resources": _resources(spec), "volumeMounts": mounts,
    }
    if spec.gpus:  # RDMA registers (pins) memory
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return container


def _replica(spec: PodSpec, replicas: int) -> dict:
    _, volumes = _volumes(spec)
    pod: dict = {"containers": [_container(spec)], "volumes": volumes}
    if spec.gpus:  # NCCL sees the node's InfiniBand NICs; service names still resolve
        pod = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet", **pod}
    return {"replicas": replicas, "restartPolicy": "OnFailure", "template": {"spec": pod}}


class _Dumper(yaml.SafeDumper):
    """Double-quotes the strings envsubst fills in, so a number put there stays a string."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if "${" in value else None)


_Dumper.add_representer(str, _str)


def _dump(comments: list[str], document: dict) -> str:
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)
    return "".join(f"# {comment(line)}\n" if line else "#\n" for line in comments) + body


def pytorchjob_yaml(spec: PodSpec) -> str:
    """pytorchjob.yaml of `spec`."""
    replicas = {"Master": _replica(spec, 1)}
    if spec.nnodes > 1:
        replicas["Worker"] = _replica(spec, spec.nnodes - 1)
    document = {
        "apiVersion": API_VERSION, "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "labels": {"app.kubernetes.io/managed-by": "planner"}},
        "spec": {"nprocPerNode": str(spec.nproc_per_node), "runPolicy": {"cleanPodPolicy": "Running"},
                 "pytorchReplicaSpecs": replicas},
    }
    fabric = ([f"GPU pods: {RDMA_RESOURCE} is the RDMA device plugin's resource name (cluster-specific: "
               "kubectl describe node | grep rdma)."] if spec.gpus else [])
    comments = [
        f"Kubeflow Training Operator PyTorchJob, apiVersion {API_VERSION} (training-operator v1.7+).",
        spec.title,
        f"{spec.nnodes * spec.nproc_per_node} ranks = {spec.nnodes} pod(s) x {spec.nproc_per_node}; the operator "
        "sets torchrun's PET_* rendezvous environment.",
        "Submit with k8s/apply.sh from the plan folder (ConfigMap of plan.json, checkpoint claim, envsubst).",
        *fabric,
    ]
    return _dump(comments, document)


def checkpoint_claim_yaml(spec: PodSpec) -> str:
    """checkpoints-pvc.yaml: the claim the pods mount at the checkpoint folder."""
    document = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{spec.name}-checkpoints", "labels": {"app.kubernetes.io/managed-by": "planner"}},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": _gib(spec.checkpoint_bytes)}}},
    }
    count = (f"{spec.checkpoints} checkpoints (train_steps / save_every)" if spec.run_length_known else
             f"{spec.checkpoints} checkpoints: the step count is read at launch, and the trainer keeps every "
             "step-N folder; resize for the run, or delete old ones")
    comments = [
        f"Checkpoint volume of {spec.name}: {CHECKPOINT_BYTES_PER_PARAM} B/parameter per checkpoint x {count}.",
        "ReadWriteMany: every pod writes its own shards. Add spec.storageClassName for a class other than the "
        "cluster's default (it must offer ReadWriteMany: NFS, CephFS, a parallel file system).",
    ]
    return _dump(comments, document)


def _input_checks(spec: PodSpec) -> list[str]:
    """Lines of apply.sh that stop, naming the variable, when a launch input read from the environment is unset
    (or, for the checkpoint folder, not an absolute path: the claim is mounted there)."""
    lines = [f": {LaunchInputs().shell(field)}" for field in spec.from_env]
    if spec.from_env:  # envsubst pastes the values into double-quoted YAML strings, unescaped
        lines += ["# envsubst pastes these into double-quoted YAML strings as they are: printable ASCII, no \" or \\",
                  "yaml_text() {", "  local LC_ALL=C",
                  '  if [[ $2 == *[![:print:]]* || $2 == *[\\"\\\\]* ]]; then',
                  '    echo "apply.sh: $1 holds a quote, a backslash, a control or non-ASCII character, which '
                  'the job\'s YAML cannot take as is" >&2', "    exit 2", "  fi", "}",
                  *(f'yaml_text {ENV[field][0]} "${ENV[field][0]}"' for field in spec.from_env)]
    if "checkpoint_dir" in spec.from_env and spec.checkpoint_dir is not None:
        var = ENV["checkpoint_dir"][0]
        lines += [f'case "${var}" in', "  /*) ;;",
                  f'  *) echo "apply.sh: {var} must be an absolute path in the container (the checkpoint volume is '
                  f"mounted there), not '${var}'\" >&2", "     exit 2 ;;", "esac"]
    return lines


def apply_script(spec: PodSpec) -> str:
    """apply.sh: the ConfigMap of plan.json, the checkpoint claim, then the job with its inputs filled in."""
    checks = _input_checks(spec)
    names = " ".join(f"${{{ENV[field][0]}}}" for field in spec.from_env)
    submit = (["# shellcheck disable=SC2016  # the quoted list names the variables envsubst may replace",
               f"envsubst '{names}' < pytorchjob.yaml | kubectl apply -f -"] if spec.from_env
              else ["kubectl apply -f pytorchjob.yaml"])
    claim = ["kubectl apply -f checkpoints-pvc.yaml"] if spec.checkpoint_dir is not None else []
    lines = [
        "#!/usr/bin/env bash",
        f"# Submit the PyTorchJob {spec.name}: {comment(spec.title)}",
        "# Run from anywhere (it works in its own folder); kubectl's current context and namespace are used.",
        "set -euo pipefail",
        "cd \"$(dirname \"$0\")\"",
        *(["", "# launch inputs not given to `planner compile`: read from the environment", *checks] if checks else []),
        "",
        f"kubectl create configmap {spec.name}-plan --from-file=plan.json=../plan.json --dry-run=client -o yaml "
        "| kubectl apply -f -",
        *claim,
        *submit,
    ]
    return "\n".join(lines) + "\n"


def emit_files(spec: PodSpec) -> dict[str, str]:
    """The k8s/ files of `spec`."""
    files = {"apply.sh": apply_script(spec), "pytorchjob.yaml": pytorchjob_yaml(spec)}
    if spec.checkpoint_dir is not None:
        files["checkpoints-pvc.yaml"] = checkpoint_claim_yaml(spec)
    return files


def check_values(inputs: LaunchInputs, fields: tuple[str, ...]) -> None:
    """PlannerInputError when a given value cannot be an argument (a NUL), or holds a `$` while apply.sh runs
    envsubst over the YAML: envsubst has no escape, so `${PLANNER_DATA}` inside a given path would be replaced."""
    for field in fields:
        if isinstance(getattr(inputs, field), str):
            argument(getattr(inputs, field))
    if all(getattr(inputs, f) is not None for f in fields):
        return  # nothing read at launch: apply.sh applies the YAML as it is
    for field in fields:
        value = getattr(inputs, field)
        if isinstance(value, str) and "$" in value:
            raise PlannerInputError(f"k8s: {field} '{comment(value)}' holds '$', which apply.sh's envsubst would "
                                    "read as a variable; give the value without it, or every launch input")


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """apply.sh, pytorchjob.yaml and checkpoints-pvc.yaml of the plan; UnsupportedPlan when the torch
    runtime cannot run it."""
    problem = runtime_problem(plan)
    if problem is not None:
        raise UnsupportedPlan(problem)
    shape = launch_shape(plan)
    fields = TARGET_INPUTS["k8s"]
    check_values(inputs, fields)
    checkpoints = (CHECKPOINTS_KEPT if inputs.train_steps is None else
                   max(1, math.ceil(inputs.train_steps / inputs.save_every)))
    spec = PodSpec(
        title=f"{plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}", name=job_name(plan.job.model),
        nnodes=shape["nnodes"], nproc_per_node=shape["nproc_per_node"], gpus=on_gpus(job),
        host_dram_bytes=node_spec(job).host_dram_bytes, image=inputs.env_ref("image"),
        module="planner.runtime.train", args=train_argv(inputs), env=nccl_env(job),
        checkpoint_dir=(posixpath.join(WORKDIR, inputs.checkpoint_dir) if inputs.checkpoint_dir is not None
                        else inputs.env_ref("checkpoint_dir")),  # the trainer resolves a relative one in WORKDIR
        checkpoints=checkpoints, checkpoint_bytes=checkpoints * CHECKPOINT_BYTES_PER_PARAM * plan.job.model_params,
        run_length_known=inputs.train_steps is not None,
        from_env=tuple(f for f in fields if getattr(inputs, f) is None),
    )
    return emit_files(spec)


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The PyTorchJob runs planner.runtime.train on plan.json: the torch target's strategy (the plan's own)."""
    return strategy_writer("torch")(plan, job)
