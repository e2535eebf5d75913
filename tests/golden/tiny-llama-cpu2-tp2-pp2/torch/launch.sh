#!/usr/bin/env bash
# tiny-llama on cpu:2: tp=2,pp=2,dp=2,cp=1,ep=1,mbs=2,vpp=1,sp=on,zero=2,shard=full,recompute=none,offload=none,offload_device=cpu,schedule=1f1b,tp_overlap=off,split=2/2
# 8 ranks = 2 node(s) x 4 processes. Run this script on EVERY node
# (same MASTER_ADDR, MASTER_PORT and RUN_ID everywhere); extra arguments go to planner.runtime.train,
# e.g. ./launch.sh --lr 3e-4 --warmup-steps 2000 --report report.json
set -euo pipefail
cd "$(dirname "$0")/.."  # the plan folder: plan.json and relative paths resolve here
exec torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d \
    --rdzv_endpoint "${MASTER_ADDR:?set MASTER_ADDR to the address of one of the nodes, the same on every node}:${MASTER_PORT:-29500}" --rdzv_id "${RUN_ID:-planner}" \
    -m planner.runtime.train \
    --plan plan.json \
    --data "${PLANNER_DATA:?set PLANNER_DATA: the training data, in the format of the target that reads it (report.md, Launch inputs)}" \
    --tokenizer "${PLANNER_TOKENIZER:?set PLANNER_TOKENIZER: tokenizer name or folder the dataset was written with}" \
    --checkpoint-dir "${PLANNER_CHECKPOINTS:?set PLANNER_CHECKPOINTS: folder for distributed checkpoints (saved and resumed from)}" \
    --train-steps "${PLANNER_TRAIN_STEPS:?set PLANNER_TRAIN_STEPS: optimizer steps to train for}" \
    --save-every 1000 \
    "$@"
