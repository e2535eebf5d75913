"""Kubernetes target: a Kubeflow Training Operator PyTorchJob (apiVersion kubeflow.org/v1).

One pod per node: replica type Master (1 replica) plus Worker (nodes - 1
replicas, omitted on one node), each asking for every GPU of its node
(`nvidia.com/gpu`).  `spec.nprocPerNode` makes the operator set torchrun's
PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK / PET_MASTER_ADDR /
PET_MASTER_PORT, so the container runs `torchrun -m planner.runtime.train
--plan /plan/plan.json` without rendezvous options.  plan.json is mounted
from a ConfigMap (`<job>-plan`, created from the plan folder's plan.json).
YAML is written by hand (deterministic); the image is a placeholder.
"""

from __future__ import annotations

from planner.emit.slurm import job_name, launch_shape
from planner.emit import strategy_writer
from planner.job import Job
from planner.plan.schema import Plan
from planner.strategy import Strategy
from planner.emit.inputs import LaunchInputs

API_VERSION = "kubeflow.org/v1"
IMAGE = "REGISTRY/planner-runtime:latest"


def _replica(kind: str, replicas: int, name: str, gpus: int, cpu_only: bool) -> list[str]:
    limits = [] if cpu_only else ["                  nvidia.com/gpu: " + str(gpus)]
    return [
        f"    {kind}:",
        f"      replicas: {replicas}",
        "      restartPolicy: OnFailure",
        "      template:",
        "        spec:",
        "          containers:",
        "            - name: pytorch",
        f"              image: {IMAGE}",
        "              imagePullPolicy: IfNotPresent",
        "              command:",
        "                - torchrun",
        "                - -m",
        "                - planner.runtime.train",
        "                - --plan",
        "                - /plan/plan.json",
        "              resources:",
        "                limits:",
        *(limits or ["                  cpu: \"" + str(gpus) + "\""]),
        "              volumeMounts:",
        "                - name: plan",
        "                  mountPath: /plan",
        "                  readOnly: true",
        "                - name: dshm",
        "                  mountPath: /dev/shm",
        "          volumes:",
        "            - name: plan",
        "              configMap:",
        f"                name: {name}-plan",
        "            - name: dshm",
        "              emptyDir:",
        "                medium: Memory",
    ]


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """pytorchjob.yaml for the plan."""
    shape = launch_shape(plan)
    nnodes, gpn = shape["nnodes"], shape["nproc_per_node"]
    name = job_name(plan)
    cpu_only = all(stage.device.lower().startswith("cpu") for stage in plan.stages)
    lines = [
        f"# Kubeflow Training Operator PyTorchJob, apiVersion {API_VERSION} (training-operator v1.7+).",
        f"# {plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}",
        f"# {plan.job.num_gpus} GPUs = {nnodes} pods x {gpn}; the operator sets torchrun's PET_* rendezvous env.",
        f"# First: kubectl create configmap {name}-plan --from-file=plan.json=../plan.json",
        f"# Then:  kubectl apply -f pytorchjob.yaml   (image is a placeholder: {IMAGE})",
        f"apiVersion: {API_VERSION}",
        "kind: PyTorchJob",
        "metadata:",
        f"  name: {name}",
        "  labels:",
        "    app.kubernetes.io/managed-by: planner",
        "spec:",
        f"  nprocPerNode: \"{gpn}\"",
        "  runPolicy:",
        "    cleanPodPolicy: Running",
        "  pytorchReplicaSpecs:",
        *_replica("Master", 1, name, gpn, cpu_only),
    ]
    if nnodes > 1:
        lines += _replica("Worker", nnodes - 1, name, gpn, cpu_only)
    return {"pytorchjob.yaml": "\n".join(lines) + "\n"}


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """the PyTorchJob runs planner.runtime.train on plan.json: the torch target's strategy (the plan's own)."""
    return strategy_writer("torch")(plan, job)
