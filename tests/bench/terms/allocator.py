"""Allocator reserve and fragmentation against the memory PyTorch reports a process holding beyond its
allocations.

    python tests/bench/terms/allocator.py [--quick]

Measurements (tests/data/terms/allocator.csv): PyTorch's CUDA OOM messages on a B200 and an H200 (single-GPU
scripts, no collectives): capacity, memory the process has in use, memory allocated by PyTorch, and memory
reserved by PyTorch but unallocated.  In use less allocated less reserved-unallocated is what lives outside
the caching allocator (CUDA context, cuBLAS workspaces); reserved-unallocated is the allocator's slack.  And one
row with NCCL: NVIDIA/nccl issue #1685's per-GPU memory outside PyTorch on 8 H100s once the process group is up
(CUDA context, cuBLAS and the NCCL communicator's buffers), the figure `memory_reserve_bytes` takes; it gives no
allocation, so it enters the fixed-part comparison only.  And a training run's fragmentation: Megatron's
report_memory on four pipeline stages of a DeepSeek-V3 proxy on H100 (NVIDIA/Megatron-LM pull request #1913),
max reserved less max allocated at the peak, against `memory_fragmentation` x max allocated; these rows print no
memory outside PyTorch, so they enter the fragmentation comparison only.

Model: planner/cost/memory.py charges every rank `memory_reserve_bytes + memory_fragmentation x allocated`
(hardware/data/constants.yaml).  No public function takes an allocation total without a whole training job,
so the two constants are read through `Catalog.constant` and the term evaluated at the measured allocation;
the ratio column is bytes, model over measured.  These scripts allocate a few huge tensors and run no NCCL
communicator, so they measure the fixed part without NCCL's buffers (which the model's constant includes)
and a lower bound on fragmentation; a training job's fragmentation needs a training measurement.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terms_common import ROOT, Compared, QUICK_ROWS, load_rows, parse_args, print_table  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_catalog  # noqa: E402

GIB = 2.0**30


def compare(row: dict[str, str]) -> Compared:
    catalog = load_catalog()
    allocated = float(row["allocated_gib"]) * GIB
    measured = float(row["non_pytorch_gib"]) * GIB + float(row["reserved_unallocated_mib"]) * 2.0**20
    modelled = catalog.constant("memory_reserve_bytes") + catalog.constant("memory_fragmentation") * allocated
    config = f"{row['gpu']} allocated {row['allocated_gib']} GiB ({row['source_id']})"
    return Compared(config=config, measured=f"{measured / GIB:.2f} GiB", modelled=f"{modelled / GIB:.2f} GiB",
                    ratio=modelled / measured, source=row["source_id"])


def fixed_part(row: dict[str, str]) -> Compared:
    """The fixed reserve alone against the memory outside the allocator."""
    measured = float(row["non_pytorch_gib"]) * GIB
    modelled = load_catalog().constant("memory_reserve_bytes")
    return Compared(config=f"{row['gpu']} fixed part only ({row['source_id']})", measured=f"{measured / GIB:.2f} GiB",
                    modelled=f"{modelled / GIB:.2f} GiB", ratio=modelled / measured, source=row["source_id"])


def fragmentation(row: dict[str, str]) -> Compared:
    """The fragmentation term alone against the reserved-but-unallocated bytes at the peak."""
    allocated = float(row["allocated_gib"]) * GIB
    measured = float(row["reserved_unallocated_mib"]) * 2.0**20
    modelled = load_catalog().constant("memory_fragmentation") * allocated
    return Compared(config=f"{row['gpu']} fragmentation at {row['allocated_gib']} GiB ({row['source_id']})",
                    measured=f"{measured / GIB:.2f} GiB", modelled=f"{modelled / GIB:.2f} GiB",
                    ratio=modelled / measured, source=row["source_id"])


def main(argv: list[str] | None = None) -> list[Compared]:
    args = parse_args(__doc__.splitlines()[0], argv)
    rows = load_rows("allocator")
    if args.quick:
        rows = rows[:QUICK_ROWS]
    # each row enters the comparisons its figures allow: the whole overhead needs both the memory outside
    # PyTorch and the allocation; the NCCL row has no allocation, the Megatron rows no memory outside PyTorch
    whole = [compare(row) for row in rows if row["allocated_gib"] and row["non_pytorch_gib"]]
    fixed = [fixed_part(row) for row in rows if row["non_pytorch_gib"]]
    # the H200 row's slack is cut from its message (taken as 0): no fragmentation figure
    slack = [fragmentation(row) for row in rows if row["allocated_gib"] and float(row["reserved_unallocated_mib"]) > 0]
    compared = whole + fixed + slack
    print_table("Allocator reserve + fragmentation: measured overhead vs constants.yaml (ratio in bytes)", compared)
    return compared


if __name__ == "__main__":
    main()
