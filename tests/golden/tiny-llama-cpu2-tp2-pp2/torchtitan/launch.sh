#!/usr/bin/env bash
# torchtitan launch for tiny-llama on cpu:2 (torchtitan v0.1.0).
# Run on every node from a torchtitan checkout or install, with NODE_RANK set per node.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
NNODES=${NNODES:-2}
NPROC_PER_NODE=${NPROC_PER_NODE:-4}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    -m torchtitan.train --job.config_file ./train.toml "$@"
