"""sharding_plan.json loads into TorchRec: every table's ParameterSharding is the one TorchRec's own helpers
build for that sharding type and those ranks, with a compute kernel TorchRec's EmbeddingBagCollection sharder
accepts for the type, cache params where the table lives in host DRAM, and the model's table names; and a
compiled plan shards a real EmbeddingBagCollection through DistributedModelParallel (on CPU).

Needs torchrec with fbgemm-gpu-cpu (pyproject's `torchrec` extra, then `pip install --no-deps torchrec==1.8.0`).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

try:  # fbgemm_gpu raises OSError, not ImportError, when its libraries do not match the installed torch
    import torch
    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import (column_wise, construct_module_sharding_plan, data_parallel,
                                                    row_wise, table_row_wise, table_wise)
    from torchrec.distributed.types import CacheParams, EnumerableShardingSpec, ShardingPlan
except (ImportError, OSError) as err:  # pragma: no cover - depends on the environment
    pytest.skip(f"torchrec is not importable ({type(err).__name__}: {str(err)[:120]}); install it with "
                "pip install '.[torchrec]' && pip install --no-deps torchrec==1.8.0", allow_module_level=True)

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cli import cli
from planner.embedding.compile import TableChoice
from planner.embedding.options import ShardingType
from planner.embedding.sharding_plan import ShardingPlanFile, sharding_plan
from planner.embedding.sites import JobSites
from planner.embedding.torchrec_plan import (DLRM_MODULE_PATH, embedding_bag_configs, module_sharding_plan,
                                             read_plan_file, torchrec_sharding_plan)
from ports import free_port

SHARDER = EmbeddingBagCollectionSharder()


def _every_type() -> ShardingPlanFile:
    """tiny-dlrm on cpu:2 (2 nodes x 4 ranks) with every sharding type and every kernel."""
    sites = JobSites(load_cluster("cpu:2"), load_catalog())
    tables = [layer.table for layer in load_model("tiny-dlrm").layers if layer.table is not None]
    kinds = [(ShardingType.ROW_WISE, 1, range(8)), (ShardingType.COLUMN_WISE, 2, (1, 6)),
             (ShardingType.TABLE_ROW_WISE, 1, (4, 5, 6, 7)), (ShardingType.DATA_PARALLEL, 1, range(8)),
             (ShardingType.TABLE_WISE, 1, (2,)), (ShardingType.TABLE_WISE, 1, (3,)),
             (ShardingType.COLUMN_WISE, 4, (0, 2, 5, 7)), (ShardingType.ROW_WISE, 1, range(8))]
    caches = {5: 0.2, 6: 0.1, 7: 0.0}  # host DRAM with an HBM cache (5, 6), without one (7)
    choices = [TableChoice(table=t, name=f"table.{t}", sharding_type=k, column_shards=c,
                           cache_fraction=caches.get(t, 1.0), ranks=list(r)) for t, (k, c, r) in enumerate(kinds)]
    return sharding_plan(SimpleNamespace(tables=choices), "tiny-dlrm", tables, sites)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """The folder `planner compile` writes for the Criteo Kaggle DLRM on 2 DGX A100 nodes."""
    out = tmp_path_factory.mktemp("torchrec") / "dlrm"
    result = CliRunner().invoke(cli, ["compile", "dlrm-criteo-kaggle", "dgx-a100-40g:2", "-b", "65536", "-s", "1",
                                      "--time-limit", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _torchrec_generator(kind: str, ranks: list[int], kernel: str, local: int):
    """TorchRec's own ParameterSharding generator for a table of `kind` on `ranks`."""
    if kind == "table_wise":
        return table_wise(rank=ranks[0], compute_kernel=kernel)
    if kind == "column_wise":
        return column_wise(ranks=ranks, compute_kernel=kernel)
    if kind == "row_wise":
        return row_wise(compute_kernel=kernel)
    if kind == "table_row_wise":
        return table_row_wise(host_index=ranks[0] // local)
    return data_parallel()


def _shards(sharding) -> list[tuple]:
    spec = sharding.sharding_spec
    return None if spec is None else [(s.shard_offsets, s.shard_sizes, s.placement) for s in spec.shards]


def _assert_torchrec_agrees(plan: ShardingPlanFile) -> None:
    ours = module_sharding_plan(plan)
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(plan), device=torch.device("meta"))
    generators = {name: _torchrec_generator(str(e.sharding_type), e.ranks, e.compute_kernel, plan.local_world_size)
                  for name, e in plan.tables.items()}
    theirs = construct_module_sharding_plan(ebc, generators, local_size=plan.local_world_size,
                                            world_size=plan.world_size, device_type="cuda")
    assert list(ours) == list(theirs) == [c.name for c in ebc.embedding_bag_configs()]
    for name, entry in plan.tables.items():
        mine, reference = ours[name], theirs[name]
        assert (mine.sharding_type, mine.ranks, _shards(mine)) == \
               (reference.sharding_type, reference.ranks, _shards(reference)), name
        # the sharder lists the kernels it can run each sharding type with on GPUs
        assert mine.compute_kernel in SHARDER.compute_kernels(mine.sharding_type, "cuda"), name
        if mine.sharding_spec is not None:  # the shards tile the table: no gap, no overlap
            assert isinstance(mine.sharding_spec, EnumerableShardingSpec)
            mine.sharding_spec.build_metadata(torch.Size([entry.rows, entry.dim]), TensorProperties())
        if mine.compute_kernel == "fused_uvm_caching":
            assert isinstance(mine.cache_params, CacheParams) and 0 < mine.cache_params.load_factor < 1, name
        else:
            assert mine.cache_params is None, name


def test_every_sharding_type_and_kernel_is_torchrecs_own():
    plan = _every_type()
    kernels = {name: e.compute_kernel for name, e in plan.tables.items()}
    # data_parallel replicas take dense (TorchRec's only kernel there); tables in host DRAM: uvm kernels
    assert kernels["t_cat_3"] == "dense" and kernels["t_cat_0"] == "fused"
    assert kernels["t_cat_5"] == kernels["t_cat_6"] == "fused_uvm_caching" and kernels["t_cat_7"] == "fused_uvm"
    assert plan.tables["t_cat_6"].cache_params.load_factor == 0.1
    _assert_torchrec_agrees(plan)


def test_compiled_files_load_as_a_torchrec_sharding_plan(compiled):
    for name in ("sharding_plan.json", "plan.json"):
        plan = read_plan_file(compiled / name)
        assert list(plan.tables) == [f"t_cat_{j}" for j in range(26)]  # TorchRec's Criteo DLRM table names
        _assert_torchrec_agrees(plan)
        sharding = torchrec_sharding_plan(plan)
        assert isinstance(sharding, ShardingPlan)
        assert sharding.get_plan_for_module(DLRM_MODULE_PATH) == module_sharding_plan(plan)


def test_a_compiled_plan_shards_an_embedding_bag_collection(tmp_path):
    """DistributedModelParallel shards TorchRec's EmbeddingBagCollection as the compiled file says (one CPU
    rank: TorchRec's CPU sharding, gloo) and runs a lookup."""
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel

    cluster = tmp_path / "one.yaml"
    cluster.write_text("pools:\n  - {name: one, preset: cpu, nodes: 1, overrides: {gpus_per_node: 1}}\n")
    out = tmp_path / "dlrm"
    result = CliRunner().invoke(cli, ["compile", "tiny-dlrm", str(cluster), "-b", "64", "-s", "1", "--time-limit", "5",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = read_plan_file(out / "sharding_plan.json")
    assert {e.compute_kernel for e in plan.tables.values()} == {"fused"}  # what TorchRec's CPU sharding runs
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ebc = EmbeddingBagCollection(tables=embedding_bag_configs(plan), device=torch.device("meta"))
        model = DistributedModelParallel(ebc, device=torch.device("cpu"), sharders=[SHARDER],
                                         plan=torchrec_sharding_plan(plan, module_path="", device="cpu"))
        assert type(model.module).__name__ == "ShardedEmbeddingBagCollection"
        features = [c.feature_names[0] for c in ebc.embedding_bag_configs()]
        ids = KeyedJaggedTensor.from_lengths_sync(keys=features,
                                                  values=torch.zeros(2 * len(features), dtype=torch.long),
                                                  lengths=torch.ones(2 * len(features), dtype=torch.int32))
        pooled = model(ids).to_dict()
        assert sorted(pooled) == sorted(features)
        assert all(tuple(v.shape) == (2, plan.tables[f"t_{k}"].dim) for k, v in pooled.items())
        assert json.loads((out / "sharding_plan.json").read_text())["tables"].keys() == plan.tables.keys()
    finally:
        torch.distributed.destroy_process_group()
