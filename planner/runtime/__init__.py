"""The plan runtime (needs torch): a reference model and the passes that apply a Plan to it.

`planner.runtime` imports torch, so nothing else in planner imports it; the
torch target's launch.sh runs `python -m planner.runtime.train` under torchrun.
The names below load on first use, so `python -m planner.runtime.data` (the
dataset writer: numpy and a tokenizer only) starts without importing torch.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "Transformer": "planner.runtime.model",
    "Parallelized": "planner.runtime.parallelize",
    "apply_plan": "planner.runtime.parallelize",
    "build_mesh": "planner.runtime.parallelize",
    "local_param_bytes": "planner.runtime.parallelize",
    "mesh_shape": "planner.runtime.parallelize",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'planner.runtime' has no attribute {name!r}")
    return getattr(import_module(module), name)
