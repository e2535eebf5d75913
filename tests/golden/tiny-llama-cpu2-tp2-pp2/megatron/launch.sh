#!/usr/bin/env bash
# Megatron-LM launch for tiny-llama on cpu:2: tp=2,pp=2,dp=2,cp=1,ep=1,mbs=2,vpp=1,sp=on,zero=2,shard=full,recompute=none,offload=none,offload_device=cpu,schedule=1f1b,tp_overlap=off,split=2/2
# Run on every node from the Megatron-LM checkout (MEGATRON_DIR), with NODE_RANK set per node.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MEGATRON_DIR=${MEGATRON_DIR:-.}
NNODES=${NNODES:-2}
NPROC_PER_NODE=${NPROC_PER_NODE:-4}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
# Data and schedule are not part of the plan: mock data and a short run by default.
DATA_ARGS=${DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size 256}
TRAIN_ARGS=${TRAIN_ARGS:---train-iters 100 --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine}
export CUDA_DEVICE_MAX_CONNECTIONS=1
# shellcheck disable=SC2046,SC2086
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$MEGATRON_DIR/pretrain_gpt.py" $(cat "$HERE/args.txt") $DATA_ARGS $TRAIN_ARGS
