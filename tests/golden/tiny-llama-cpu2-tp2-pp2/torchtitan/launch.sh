#!/usr/bin/env bash
# torchtitan launch (torchtitan 0.2.2) for tiny-llama on cpu:2: tp=2,pp=2,dp=2,cp=1,ep=1,mbs=2,vpp=1,sp=on,zero=2,shard=full,recompute=none,offload=none,offload_device=cpu,schedule=1f1b,tp_overlap=off,split=2/2
# 8 ranks = 2 node(s) x 4 processes. Run it on EVERY node, from the plan
# folder (bash torchtitan/launch.sh), with the same MASTER_ADDR, MASTER_PORT and RUN_ID everywhere.
# Extra arguments go to torchtitan.train (they override train.toml, e.g. --metrics.enable_tensorboard).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${PLANNER_DATA:?set PLANNER_DATA: the training data, in the format of the target that reads it (report.md, Launch inputs)}"
tokenizer="${PLANNER_TOKENIZER:?set PLANNER_TOKENIZER: tokenizer name or folder the dataset was written with}"
checkpoint_dir="${PLANNER_CHECKPOINTS:?set PLANNER_CHECKPOINTS: folder for distributed checkpoints (saved and resumed from)}"
train_steps="${PLANNER_TRAIN_STEPS:?set PLANNER_TRAIN_STEPS: optimizer steps to train for}"
if [[ ! "$train_steps" =~ ^[1-9][0-9]*$ ]]; then
  echo "launch.sh: the number of training steps must be a positive integer, not '$train_steps'" >&2
  exit 2
fi
case "$checkpoint_dir" in
  /*) ;;
  *) checkpoint_dir="$PWD/$checkpoint_dir" ;;
esac
warmup_steps=$(( (train_steps * 1 + 99) / 100 ))

exec torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
    --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR to the address of one of the nodes, the same on every node}:${MASTER_PORT:-29500}" --rdzv-id "${RUN_ID:-planner}" \
    -m torchtitan.train --job.config_file "$here/train.toml" \
    --training.dataset_path "$data" --model.hf_assets_path "$tokenizer" \
    --checkpoint.folder "$checkpoint_dir" --training.steps "$train_steps" \
    --lr_scheduler.warmup_steps "$warmup_steps" "$@"
