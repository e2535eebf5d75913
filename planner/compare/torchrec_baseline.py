"""TorchRec's own sharding planner as the baseline of recommendation models, and TorchRec's estimators as a
second cost model.

* `plan_with_torchrec`: TorchRec 1.8's `EmbeddingShardingPlanner` (its default enumerator, storage
  reservation, proposers and GreedyPerfPartitioner) plans the job's tables on a TorchRec `Topology` of the
  job's cluster (`torchrec_topology`), and its plan comes back as this project's placements, so
  `EmbeddingCostModel.evaluate` scores it like any other plan.
* `score_with_torchrec`: any placements (planner's, or TorchRec's own) as TorchRec ShardingOptions, costed
  by TorchRec's EmbeddingPerfEstimator and EmbeddingStorageEstimator; the step figure is TorchRec's
  `NoopPerfModel` rating, the slowest rank's sum of its shards' forward and backward compute and
  communication (the number TorchRec's planner minimises; no dense part).

The tables are given to TorchRec as TorchRec's DLRM example gives them (facebookresearch/dlrm
torchrec_dlrm/dlrm_main.py): `EmbeddingBagConfig(name="t_cat_<j>", feature_names=["cat_<j>"])` in an
EmbeddingBagCollection on the meta device, row-wise Adagrad fused into the backward
(`apply_optimizer_in_backward`, which is what TorchRec's storage estimator reads), each table's
pooling factor as a ParameterConstraints.  The cluster's own figures replace TorchRec's defaults in the
Topology: world and local world size, HBM per GPU, host DRAM per GPU, HBM bandwidth, the host link a GPU
gets while all GPUs of its node stream, the intra-node link and the NIC bandwidth per GPU, all raw line
rates as TorchRec's constants are.  TorchRec's Topology has one kind of device, so a cluster of several
pools is not applicable.

Mapping TorchRec's plan to this project's options: table_wise, row_wise, table_row_wise and data_parallel
map one to one; column_wise and table_column_wise become column_wise with one unit per shard (TorchRec may
put two shards of a table on one rank; `evaluate` then adds both); the kernel gives the HBM share: fused
and dense 1.0, fused_uvm 0.0, fused_uvm_caching its cache load factor (TorchRec's default 0.2).

torchrec is optional: it is imported only inside these functions, and `why_not` names what is missing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, Field

from planner.embedding.evaluate import GB, EmbeddingCostModel, TablePlacement
from planner.embedding.options import ShardingType, TableOption
from planner.embedding.sharding_plan import FUSED_UVM, FUSED_UVM_CACHING, compute_kernel, table_names
from planner.embedding.torchrec_plan import feature_name
from planner.errors import InfeasibleError

TORCHREC_MODEL = "torchrec-model"  # the label of numbers that come from TorchRec's estimators
MS = 1e-3  # TorchRec's planner counts bandwidths in bytes/ms and perf in ms
# The share of HBM TorchRec's planner keeps back by default (EmbeddingShardingPlanner's
# heuristical_storage_reservation_percentage, torchrec/distributed/planner/planners.py); the same reservation
# decides whether a plan fits in `score_with_torchrec`
TORCHREC_RESERVED_SHARE = 0.15
# TorchRec's column-split sharding types (ShardingType values); both map to column_wise here
_COLUMN_TYPES = ("column_wise", "table_column_wise")


class TorchRecTopology(BaseModel):
    """The figures of the job's cluster given to TorchRec's Topology (SI units; TorchRec gets bytes/ms)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    world_size: int = Field(description="Ranks of the job.")
    local_world_size: int = Field(description="GPUs per node.")
    hbm_cap_bytes: float = Field(description="HBM per GPU (TorchRec reserves its own 15% and the dense part).")
    ddr_cap_bytes: float = Field(description="Usable host DRAM of a node divided by its GPUs.")
    hbm_bandwidth: float = Field(description="HBM bytes/s of a GPU (TorchRec's hbm_mem_bw).")
    hbm_to_ddr_bandwidth: float = Field(description="Host-to-GPU bytes/s a GPU gets while every GPU of its node "
                                        "streams (TorchRec's hbm_to_ddr_mem_bw).")
    intra_host_bandwidth: float = Field(description="Intra-node link bytes/s per GPU (TorchRec's intra_host_bw).")
    inter_host_bandwidth: float = Field(description="NIC bytes/s per GPU (TorchRec's inter_host_bw).")
    batch_size: int = Field(description="Samples per rank per step (TorchRec's batch_size).")


class TorchRecScore(BaseModel):
    """A plan as TorchRec's estimators see it."""

    model_config = ConfigDict(extra="forbid")
    step_s: float = Field(description="TorchRec's NoopPerfModel rating in seconds: the slowest rank's sum of its "
                          "shards' forward and backward compute and communication (embedding part only).")
    rank_s: list[float] = Field(description="That sum for every rank, seconds.")
    fits: bool = Field(description="Every rank's shards fit the HBM and host DRAM TorchRec leaves after its "
                       "storage reservation.")
    problems: list[str] = Field(description="What does not fit where, in TorchRec's storage model.")
    peak_hbm_bytes: float = Field(description="Largest HBM of any rank's shards, as TorchRec estimates them.")


@dataclass(frozen=True)
class TorchRecPlan:
    """TorchRec's plan of a job, as placements of this project, with what planning it took."""

    placements: list[TablePlacement]
    planning_s: float  # wall seconds of EmbeddingShardingPlanner.plan (not the import of torchrec)
    proposals: int  # proposals TorchRec's proposers made
    own_rating_s: float  # the rating TorchRec's planner gave its best plan, seconds
    timed_out: bool  # the planner stopped at its timeout and returned the best plan so far
    sharding_plan: Any  # TorchRec's ShardingPlan as its planner returned it (module path "": the tables' collection)


def why_not(model: EmbeddingCostModel) -> str | None:
    """Why TorchRec's planner cannot take this job here, or None when it can."""
    if len(model.job.cluster.pools) > 1:
        return (f"TorchRec's Topology has one kind of device; the cluster has {len(model.job.cluster.pools)} pools")
    try:
        with _quiet():  # fbgemm_gpu warns about the CUDA operators a CPU build lacks
            import torchrec.distributed.planner  # noqa: F401
    except Exception as err:  # ImportError, or fbgemm_gpu failing to load its operators
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"torchrec is not importable ({first}); pip install -e '.[torchrec]' installs it"
    return None


def torchrec_topology(model: EmbeddingCostModel) -> TorchRecTopology:
    """The figures of the job's (one-pool) cluster that TorchRec's Topology takes."""
    sites, job = model.sites, model.job
    node, device = sites.node_spec(0), sites.device(0)
    g = node.gpus_per_node
    return TorchRecTopology(
        world_size=sites.world, local_world_size=min(g, sites.world), hbm_cap_bytes=device.capacity_bytes,
        ddr_cap_bytes=sites.host_capacity(0) / g, hbm_bandwidth=device.hbm_bandwidth,
        hbm_to_ddr_bandwidth=node.host_bandwidth_per_gpu(g), intra_host_bandwidth=node.intra_link.bandwidth,
        inter_host_bandwidth=job.cluster.inter_node_bandwidth_per_gpu(job.cluster.pools[0]),
        batch_size=max(1, job.global_batch // sites.world),
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """TorchRec logs its search (some of it on the root logger) and warns about its own defaults on every call:
    keep both off the terminal while it runs."""
    import warnings

    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


class _Session:
    """TorchRec's objects for one job: topology, the meta-device tables, the sharder, base constraints."""

    def __init__(self, model: EmbeddingCostModel):
        import torch
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import Topology
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
        from torchrec.optim import RowWiseAdagrad, apply_optimizer_in_backward

        self.model = model
        self.figures = torchrec_topology(model)
        f = self.figures
        self.topology = Topology(
            world_size=f.world_size, local_world_size=f.local_world_size, compute_device="cuda",
            hbm_cap=int(f.hbm_cap_bytes), ddr_cap=int(f.ddr_cap_bytes), hbm_mem_bw=f.hbm_bandwidth * MS,
            hbm_to_ddr_mem_bw=f.hbm_to_ddr_bandwidth * MS, intra_host_bw=f.intra_host_bandwidth * MS,
            inter_host_bw=f.inter_host_bandwidth * MS,
        )
        self.tables = model.costs.tables
        self.names = table_names(len(self.tables))
        configs = [EmbeddingBagConfig(name=name, num_embeddings=t.rows, embedding_dim=t.dim,
                                      feature_names=[feature_name(name)]) for name, t in zip(self.names, self.tables)]
        self.module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        # TorchRec's DLRM trains its tables with row-wise Adagrad fused into the backward; the storage
        # estimator reads the optimizer from the parameters
        apply_optimizer_in_backward(RowWiseAdagrad, self.module.parameters(), {"lr": 0.01})
        self.sharders = [EmbeddingBagCollectionSharder()]

    def constraints(self, fixed: dict[int, TableOption] | None = None) -> dict[str, Any]:
        """Per-table ParameterConstraints: the pooling factor, and when `fixed` gives it, the option."""
        from torchrec.distributed.planner.types import ParameterConstraints
        from torchrec.distributed.types import CacheParams

        out = {}
        for t, (name, table) in enumerate(zip(self.names, self.tables)):
            extra: dict[str, Any] = {}
            if fixed is not None:
                option = fixed[t]
                kernel = compute_kernel(option.kind, option.cache)
                extra = {"sharding_types": [option.kind.value], "compute_kernels": [kernel]}
                if option.kind == ShardingType.COLUMN_WISE:
                    extra["min_partition"] = table.dim // option.shards
                if kernel == FUSED_UVM_CACHING:
                    extra["cache_params"] = CacheParams(load_factor=option.cache)
            out[name] = ParameterConstraints(pooling_factors=[table.pooling_factor], **extra)
        return out

    def reserved(self, constraints: dict[str, Any]) -> Any:
        """The topology TorchRec's planner partitions into: HBM less its 15% reserve, the dense part, inputs."""
        from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

        return HeuristicalStorageReservation(percentage=TORCHREC_RESERVED_SHARE).reserve(
            topology=self.topology, batch_size=self.figures.batch_size, module=self.module, sharders=self.sharders,
            constraints=constraints)


def _rank_sums(topology: Any, options: list[Any]) -> tuple[list[float], list[float], list[float]]:
    """Per-rank perf (ms), HBM and DDR bytes of TorchRec sharding options whose shards carry ranks."""
    world = topology.world_size
    perf, hbm, ddr = [0.0] * world, [0.0] * world, [0.0] * world
    for option in options:
        for shard in option.shards:
            perf[shard.rank] += shard.perf.total
            hbm[shard.rank] += shard.storage.hbm
            ddr[shard.rank] += shard.storage.ddr
    return perf, hbm, ddr


def _score(session: _Session, options: list[Any], constraints: dict[str, Any]) -> TorchRecScore:
    perf, hbm, ddr = _rank_sums(session.topology, options)
    limits = session.reserved(constraints).devices
    problems = []
    for rank, device in enumerate(limits):
        for tier, used, cap in (("HBM", hbm[rank], device.storage.hbm), ("host DRAM", ddr[rank], device.storage.ddr)):
            if used > cap:
                problems.append(f"rank {rank} needs {used / GB:.1f} GB of {tier} for its shards, TorchRec leaves "
                                f"{cap / GB:.1f} GB")
    return TorchRecScore(step_s=max(perf) * MS, rank_s=[p * MS for p in perf], fits=not problems, problems=problems,
                         peak_hbm_bytes=max(hbm))


def _shard_ranks(placement: TablePlacement, shards: int) -> list[int]:
    """The rank of each of TorchRec's shards of a table, in shard order: a placement's ranks are in shard order
    (row blocks in rank order as TorchRec splits them, column shards as placed, a replica on every rank)."""
    if len(placement.ranks) != shards:
        raise ValueError(f"table {placement.table}: {shards} TorchRec shards for {len(placement.ranks)} ranks")
    return list(placement.ranks)


def score_with_torchrec(model: EmbeddingCostModel, placements: list[TablePlacement]) -> TorchRecScore:
    """`placements` costed by TorchRec's own estimators (see the module docstring)."""
    with _quiet():
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

        session = _Session(model)
        fixed = {p.table: p.option for p in placements}
        constraints = session.constraints(fixed)
        enumerator = EmbeddingEnumerator(topology=session.topology, batch_size=session.figures.batch_size,
                                         constraints=constraints)
        options = enumerator.enumerate(module=session.module, sharders=session.sharders)
        by_name = {}
        for option in options:
            if option.name in by_name:
                raise ValueError(f"{option.name}: TorchRec enumerated more than one option for a fixed choice")
            by_name[option.name] = option
        for placement in placements:
            option = by_name[session.names[placement.table]]
            for shard, rank in zip(option.shards, _shard_ranks(placement, len(option.shards))):
                shard.rank = rank
        return _score(session, list(by_name.values()), constraints)


def _option_of(table_dim: int, sharding: Any) -> TableOption:
    """This project's option for one of TorchRec's ParameterShardings."""
    kind = sharding.sharding_type
    if kind in _COLUMN_TYPES:
        widths = {s.shard_sizes[1] for s in sharding.sharding_spec.shards}
        if len(widths) > 1:
            raise ValueError(f"uneven column shards {sorted(widths)}")
        shards, kind = table_dim // widths.pop(), ShardingType.COLUMN_WISE
    else:
        shards, kind = 1, ShardingType(kind)
    if sharding.compute_kernel == FUSED_UVM:
        cache = 0.0
    elif sharding.compute_kernel == FUSED_UVM_CACHING:
        from torchrec.distributed.planner.constants import UVM_CACHING_RATIO

        factor = sharding.cache_params.load_factor if sharding.cache_params is not None else None
        cache = UVM_CACHING_RATIO if factor is None else factor
    else:
        cache = 1.0  # fused (HBM) and dense (data-parallel replicas)
    return TableOption(kind, shards, cache)


def _placements(session: _Session, plan: Any) -> list[TablePlacement]:
    """TorchRec's plan as placements; InfeasibleError naming the table when one has no counterpart here (a sharding
    type this project lacks, uneven column shards)."""
    index = {name: t for t, name in enumerate(session.names)}
    out = []
    for module_plan in plan.plan.values():
        for name, sharding in module_plan.items():
            t = index[name]
            try:
                option = _option_of(session.tables[t].dim, sharding)
            except ValueError as err:
                raise InfeasibleError(f"TorchRec's plan of {name} ({sharding.sharding_type}) has no counterpart "
                                      f"here: {err}") from None
            # ranks in shard order; TorchRec may put two column shards of a table on one rank
            out.append(TablePlacement(t, option, tuple(sharding.ranks)))
    if len(out) != len(session.names):
        raise InfeasibleError(f"TorchRec planned {len(out)} of {len(session.names)} tables")
    return sorted(out, key=lambda p: p.table)


def plan_with_torchrec(model: EmbeddingCostModel, timeout_s: float | None = None) -> TorchRecPlan:
    """TorchRec's EmbeddingShardingPlanner on the job's tables and cluster; InfeasibleError when it finds no plan.
    `timeout_s` is TorchRec's own timeout (whole seconds; it then returns the best plan found so far; it is checked
    between proposals only, so on hundreds of tables the planner can run well past it)."""
    with _quiet():
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.perf_models import NoopPerfModel
        from torchrec.distributed.planner.types import PlannerError

        session = _Session(model)
        timeout = None if timeout_s is None else max(1, math.ceil(timeout_s))
        planner = EmbeddingShardingPlanner(topology=session.topology, batch_size=session.figures.batch_size,
                                           constraints=session.constraints(), stats=[], debug=False,
                                           timeout_seconds=timeout)
        start = time.perf_counter()
        try:
            plan = planner.plan(module=session.module, sharders=session.sharders)
        except PlannerError as err:
            raise InfeasibleError(f"TorchRec's planner finds no plan: {str(err).splitlines()[0]}") from None
        elapsed = time.perf_counter() - start
        rating = NoopPerfModel(session.topology).rate(planner._best_plan) * MS
    return TorchRecPlan(placements=_placements(session, plan), planning_s=elapsed,
                        proposals=planner._num_proposals, own_rating_s=rating,
                        timed_out=timeout is not None and elapsed >= timeout, sharding_plan=plan)
