"""Fixed per-kernel launch overhead of a layer: the kernels it launches times the seconds each costs.

A GPU kernel costs a fixed overhead on top of its work (launch latency, ramp-up and tail of the grid): about
2 us each when the host launches them one by one (torchao's roofline model measures 2 us for a one-element
kernel on H100; NVIDIA/cccl's nvbench 2.0 us per small kernel launched back to back on B200), under 1 us
when a CUDA graph replays them (constants.yaml `kernel_launch_seconds`, `graph_kernel_launch_seconds`).
How many kernels a layer launches is measured per layer kind, for eager PyTorch and for fused execution
(hardware/data/kernels.yaml, counted by tests/bench/kernel_counts.py); the runtime profile says which
applies (`kernels.fused_elementwise`) and whether it replays CUDA graphs (`kernels.cuda_graphs`).  Large
layers hide nothing of it but barely notice (hundreds of microseconds against tens of milliseconds); small
models and small micro-batches, whose kernels last a few microseconds, are dominated by it.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog
from models.graph import Layer, LayerKind
from planner.job import Job

_FIELD = ConfigDict(extra="forbid", frozen=True)


class LayerLaunches(BaseModel):
    """Kernels one layer launches per micro-batch on one rank."""

    model_config = _FIELD
    forward: float = Field(ge=0, description="Kernels of the forward pass.")
    backward: float = Field(ge=0, description="Kernels of the backward pass.")


_NO_LAUNCHES = LayerLaunches(forward=0.0, backward=0.0)  # a kind neither counted nor substituted


class KernelLaunches(BaseModel):
    """hardware/data/kernels.yaml: kernels per layer kind, eager and fused."""

    model_config = _FIELD
    source: str = Field(description="How the counts were measured.")
    eager: dict[LayerKind, LayerLaunches] = Field(description="Eager PyTorch: one kernel per operator.")
    fused: dict[LayerKind, LayerLaunches] = Field(description="Fused element-wise kernels (torch.compile, TE).")
    same_as: dict[LayerKind, LayerKind] = Field(
        default_factory=dict, description="Kinds counted as another kind (no runtime of ours builds them).")

    def per_layer(self, kind: LayerKind, fused: bool) -> LayerLaunches:
        """The kernels of one layer of `kind` (none for a kind neither counted nor substituted)."""
        table = self.fused if fused else self.eager
        kind = self.same_as.get(kind, kind)
        launches = table.get(kind)
        return _NO_LAUNCHES if launches is None else launches


@lru_cache(maxsize=1)
def load_kernel_launches() -> KernelLaunches:
    """The built-in table (hardware/data/kernels.yaml)."""
    text = resources.files("hardware").joinpath("data", "kernels.yaml").read_text()
    return KernelLaunches.model_validate(yaml.safe_load(text))


def kernel_seconds(job: Job, catalog: Catalog) -> float:
    """Fixed seconds one kernel costs under the job's runtime: launched one by one, or replayed in a CUDA graph."""
    graphs = job.runtime.kernels.cuda_graphs
    return catalog.constant("graph_kernel_launch_seconds" if graphs else "kernel_launch_seconds")


def launch_overhead(layer: Layer, job: Job, catalog: Catalog) -> tuple[float, float]:
    """(forward, backward) seconds of fixed per-kernel overhead of `layer` per micro-batch."""
    launches = load_kernel_launches().per_layer(layer.kind, fused=job.fused)
    each = kernel_seconds(job, catalog)
    return launches.forward * each, launches.backward * each
