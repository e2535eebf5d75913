#!/usr/bin/env bash
# Megatron-LM core_v0.16.1 launch for llama3-8b on dgx-h100:2: tp=1,pp=1,dp=16,cp=1,ep=1,mbs=1,vpp=1,sp=off,zero=2,shard=full,recompute=none,offload=none,offload_device=cpu,schedule=1f1b,tp_overlap=off
# 16 ranks = 2 node(s) x 8 processes. Run it on EVERY node, from the plan
# folder (bash megatron/launch.sh), with the same MASTER_ADDR, MASTER_PORT and RUN_ID everywhere and
# MEGATRON_DIR set (or compile --megatron-dir). Extra arguments go to pretrain_gpt.py (a flag given again overrides args.txt).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
megatron_dir="${MEGATRON_DIR:?set MEGATRON_DIR: a Megatron-LM checkout at core_v0.16.1 (the folder of pretrain_gpt.py)}"
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

# args.txt: one flag and its value per line; read -a splits the words without globbing them
args=()
while read -r -a words; do
  args+=("${words[@]}")
done < "$here/args.txt"

# Megatron FSDP overlaps its gathers on more than one hardware queue (validate_args)
unset CUDA_DEVICE_MAX_CONNECTIONS
# NCCL over the nodes' compute fabric (a value already in the environment wins)
export NCCL_IB_HCA="${NCCL_IB_HCA:-=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11}"  # compute NICs only; NVIDIA DGX H100 User Guide, Network Modules table: default RDMA names of the 8 ConnectX-7 compute ports
# NCCL_SOCKET_IFNAME: not set: NCCL bootstraps over an interface that is not docker or loopback (ib* first); name one (e.g. bond0) if that cannot reach the other nodes
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # NCCL reports failures, not every setting (INFO to debug)

exec torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \
    --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR to the address of one of the nodes, the same on every node}:${MASTER_PORT:-29500}" --rdzv-id "${RUN_ID:-planner}" \
    "$megatron_dir/pretrain_gpt.py" "${args[@]}" \
    --data-path "$data" --tokenizer-model "$tokenizer" \
    --save "$checkpoint_dir" --load "$checkpoint_dir" --save-interval 1000 --eval-interval 1000 \
    --train-iters "$train_steps" --lr-warmup-iters "$warmup_steps" "$@"
