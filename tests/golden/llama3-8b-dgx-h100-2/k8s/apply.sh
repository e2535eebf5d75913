#!/usr/bin/env bash
# Submit the PyTorchJob planner-llama3-8b: llama3-8b on dgx-h100:2: tp=1,pp=1,dp=16,cp=1,ep=1,mbs=1,vpp=1,sp=off,zero=2,shard=full,recompute=none,offload=none,offload_device=cpu,schedule=1f1b,tp_overlap=off
# Run from anywhere (it works in its own folder); kubectl's current context and namespace are used.
set -euo pipefail
cd "$(dirname "$0")"

# launch inputs not given to `planner compile`: read from the environment
: "${PLANNER_DATA:?set PLANNER_DATA: the training data, in the format of the target that reads it (report.md, Launch inputs)}"
: "${PLANNER_TOKENIZER:?set PLANNER_TOKENIZER: tokenizer name or folder the dataset was written with}"
: "${PLANNER_CHECKPOINTS:?set PLANNER_CHECKPOINTS: folder for distributed checkpoints (saved and resumed from)}"
: "${PLANNER_TRAIN_STEPS:?set PLANNER_TRAIN_STEPS: optimizer steps to train for}"
: "${PLANNER_IMAGE:?set PLANNER_IMAGE: container image with the runtime (the repository\'s Dockerfile builds one)}"
# envsubst pastes these into double-quoted YAML strings as they are: printable ASCII, no " or \
yaml_text() {
  local LC_ALL=C
  if [[ $2 == *[![:print:]]* || $2 == *[\"\\]* ]]; then
    echo "apply.sh: $1 holds a quote, a backslash, a control or non-ASCII character, which the job's YAML cannot take as is" >&2
    exit 2
  fi
}
yaml_text PLANNER_DATA "$PLANNER_DATA"
yaml_text PLANNER_TOKENIZER "$PLANNER_TOKENIZER"
yaml_text PLANNER_CHECKPOINTS "$PLANNER_CHECKPOINTS"
yaml_text PLANNER_TRAIN_STEPS "$PLANNER_TRAIN_STEPS"
yaml_text PLANNER_IMAGE "$PLANNER_IMAGE"
case "$PLANNER_CHECKPOINTS" in
  /*) ;;
  *) echo "apply.sh: PLANNER_CHECKPOINTS must be an absolute path in the container (the checkpoint volume is mounted there), not '$PLANNER_CHECKPOINTS'" >&2
     exit 2 ;;
esac

kubectl create configmap planner-llama3-8b-plan --from-file=plan.json=../plan.json --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f checkpoints-pvc.yaml
# shellcheck disable=SC2016  # the quoted list names the variables envsubst may replace
envsubst '${PLANNER_DATA} ${PLANNER_TOKENIZER} ${PLANNER_CHECKPOINTS} ${PLANNER_TRAIN_STEPS} ${PLANNER_IMAGE}' < pytorchjob.yaml | kubectl apply -f -
