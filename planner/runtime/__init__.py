"""The plan runtime (needs torch): a reference model and the passes that apply a Plan to it.

`planner.runtime` imports torch, so nothing else in planner imports it; the
torch target's launch.sh runs `python -m planner.runtime.train` under torchrun.
"""

from planner.runtime.model import Transformer
from planner.runtime.parallelize import Parallelized, apply_plan, build_mesh, local_param_bytes, mesh_shape

__all__ = ["Parallelized", "Transformer", "apply_plan", "build_mesh", "local_param_bytes", "mesh_shape"]
