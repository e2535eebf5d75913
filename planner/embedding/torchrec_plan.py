"""sharding_plan.json as TorchRec objects: a ParameterSharding per table and the ShardingPlan of a DLRM.

    from planner.embedding.torchrec_plan import read_plan_file, torchrec_sharding_plan
    plan = torchrec_sharding_plan(read_plan_file("out/dlrm/sharding_plan.json"))
    model = DistributedModelParallel(DLRMTrain(dlrm), plan=plan, ...)

The plan is keyed as TorchRec's DLRM example builds its model (facebookresearch/dlrm
torchrec_dlrm/dlrm_main.py): `DLRMTrain(DLRM(EmbeddingBagCollection(tables)))`, so the tables'
EmbeddingBagCollection sits at DLRM_MODULE_PATH, and table j is `EmbeddingBagConfig(name="t_cat_<j>",
feature_names=["cat_<j>"])` (`embedding_bag_configs` builds them).  Another model passes its own
module path.  Each entry becomes `ParameterSharding(sharding_type, compute_kernel, ranks,
sharding_spec=EnumerableShardingSpec([ShardMetadata...]), cache_params=CacheParams(load_factor))`.

torchrec is an optional dependency, imported here only when a function runs (the `torchrec` extra
of pyproject.toml: fbgemm-gpu-cpu and torchrec's other dependencies; torchrec itself installs with
`pip install --no-deps torchrec==1.8.0`, since its wheel asks for the CUDA fbgemm-gpu).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.embedding.sharding_plan import ParameterSharding, ShardingPlanFile
from planner.errors import PlannerInputError

DLRM_MODULE_PATH = "model.sparse_arch.embedding_bag_collection"  # DLRMTrain.model (DLRM).sparse_arch (SparseArch)


def feature_name(table: str) -> str:
    """The feature a table of the file pools (`t_cat_3` -> `cat_3`, TorchRec's Criteo feature names)."""
    return table.removeprefix("t_")


def read_plan_file(path: Path | str) -> ShardingPlanFile:
    """The sharding plan in a sharding_plan.json, or in the plan.json of a recommendation model around one;
    PlannerInputError `FILE: what is wrong` when it is not one."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise PlannerInputError(f"{path}: not a readable JSON file: {err}") from None
    section = document.get("sharding", document) if isinstance(document, dict) else document
    try:
        return ShardingPlanFile.model_validate(section)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PlannerInputError(f"{path}: {where}: {first['msg']}") from None


def placement(text: str, device: str) -> str:
    """A file's placement 'rank:R/cuda:L' on `device`: unchanged for cuda, TorchRec's 'rank:R/cpu' for cpu."""
    return text if device == "cuda" else f"{text.split('/')[0]}/{device}"


def parameter_sharding(entry: ParameterSharding, device: str = "cuda") -> Any:
    """TorchRec's ParameterSharding of one entry (the kernel and type checked against TorchRec's enums); `device`
    "cpu" places the shards on CPU ranks (TorchRec's CPU sharding: a test without GPUs)."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.types import (CacheParams, EnumerableShardingSpec, ParameterSharding as TRSharding,
                                            ShardingType, ShardMetadata)

    spec = None
    if entry.sharding_spec is not None:
        spec = EnumerableShardingSpec([ShardMetadata(shard_offsets=list(s.shard_offsets),
                                                     shard_sizes=list(s.shard_sizes),
                                                     placement=placement(s.placement, device))
                                       for s in entry.sharding_spec])
    cache = None if entry.cache_params is None else CacheParams(load_factor=entry.cache_params.load_factor)
    return TRSharding(sharding_type=ShardingType(str(entry.sharding_type)).value,
                      compute_kernel=EmbeddingComputeKernel(entry.compute_kernel).value,
                      ranks=list(entry.ranks), sharding_spec=spec, cache_params=cache)


def module_sharding_plan(plan: ShardingPlanFile, device: str = "cuda") -> Any:
    """TorchRec's EmbeddingModuleShardingPlan of the tables: table name -> ParameterSharding."""
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    return EmbeddingModuleShardingPlan({name: parameter_sharding(entry, device) for name, entry in plan.tables.items()})


def torchrec_sharding_plan(plan: ShardingPlanFile, module_path: str = DLRM_MODULE_PATH, device: str = "cuda") -> Any:
    """TorchRec's ShardingPlan with the tables' plan at `module_path` (the model's EmbeddingBagCollection)."""
    from torchrec.distributed.types import ShardingPlan

    return ShardingPlan({module_path: module_sharding_plan(plan, device)})


def embedding_bag_configs(plan: ShardingPlanFile) -> list[Any]:
    """TorchRec EmbeddingBagConfigs of the file's tables (name, rows, dim, one feature each), in file order."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=name, num_embeddings=entry.rows, embedding_dim=entry.dim,
                               feature_names=[feature_name(name)]) for name, entry in plan.tables.items()]
