"""Counts the bytes each rank loads from a torch.distributed.checkpoint (tests/test_replan_resume.py).

Python imports `sitecustomize` at start-up from sys.path, so putting this folder on PYTHONPATH of an
unchanged `torch/launch.sh` reaches every torchrun worker.  With REPLAN_PROBE_DIR set, every
`torch.distributed.checkpoint.load` counts the bytes of each tensor piece DCP's load planner resolves for
this rank (the destination shards it fills, exactly what the rank reads of the checkpoint's tensors) and
writes REPLAN_PROBE_DIR/loaded-<rank>.json after the load: {"state": bytes of weights and optimizer
moments, "step": bytes of AdamW's per-parameter step counters}.
"""

import json
import os

_DIR = os.environ.get("REPLAN_PROBE_DIR")

if _DIR:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    _counts = {"state": 0, "step": 0}
    _resolve = DefaultLoadPlanner.resolve_tensor
    _load = dcp.load

    def _counting_resolve(self, read_item):
        tensor = _resolve(self, read_item)
        kind = "step" if read_item.dest_index.fqn.endswith(".step") else "state"
        _counts[kind] += tensor.numel() * tensor.element_size()
        return tensor

    def _counting_load(*args, **kwargs):
        _counts.update(state=0, step=0)
        result = _load(*args, **kwargs)
        with open(os.path.join(_DIR, f"loaded-{dist.get_rank()}.json"), "w", encoding="utf-8") as out:
            json.dump(_counts, out)
        return result

    DefaultLoadPlanner.resolve_tensor = _counting_resolve
    dcp.load = _counting_load
