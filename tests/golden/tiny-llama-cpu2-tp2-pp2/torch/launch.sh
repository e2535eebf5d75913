#!/usr/bin/env bash
# tiny-llama on cpu:2: tp=2,pp=2,dp=2,cp=1,ep=1,mbs=2,vpp=1,sp=on,zero=2,shard=full,recompute=none,offload=none,offload_device=cpu,schedule=1f1b,tp_overlap=off,split=2/2
# 8 ranks = 2 node(s) x 4 processes. Run this script on EVERY node
# (same MASTER_ADDR, MASTER_PORT and RUN_ID everywhere); extra arguments go to planner.runtime.train,
# e.g. ./launch.sh --steps 100 --lr 3e-4 --report report.json
set -euo pipefail
cd "$(dirname "$0")"
exec torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d \
    --rdzv_endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" --rdzv_id "${RUN_ID:-planner}" \
    -m planner.runtime.train --plan ../plan.json "$@"
