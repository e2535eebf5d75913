"""Training strategy: parallel degrees, sharding, recompute, offload, schedule.

`Strategy` owns the degrees and checks them against a job with messages that
list every factor (as torchtitan's ParallelDims does).  `parse_strategy`
reads the SPEC string (docs/strategy-spec.md): comma-separated key=value pairs.
"""

from __future__ import annotations

from functools import lru_cache
from operator import attrgetter
from typing import Literal, Sequence, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.chunks import even_chunks, stage_chunks
from planner.errors import PlannerInputError

Recompute = Literal["none", "selective", "full"]
Offload = Literal["none", "optimizer", "params", "all"]
OffloadDevice = Literal["cpu", "nvme"]
Schedule = Literal["1f1b", "gpipe", "interleaved", "zbv", "dualpipev"]
# Schedules that place two model chunks per rank in a V (rank r holds chunks r and 2 pp - 1 - r) and split the
# backward into its input-gradient (I) and weight-gradient (W) halves: torch.distributed.pipelining's
# ScheduleZBVZeroBubble (Qi et al. 2023, arXiv 2401.10241 Sec. 6) and ScheduleDualPipeV (DeepSeek-V3,
# arXiv 2412.19437 Sec. 3.2.1, cut in half as github.com/deepseek-ai/DualPipe's DualPipeV).
V_SCHEDULES: tuple[Schedule, ...] = ("zbv", "dualpipev")
ShardScope = Literal["full", "node"]
Regather = Literal["network", "host"]
# MoE token dispatchers (hardware/data/dispatchers.yaml): Megatron's NCCL all-to-all, or its flex dispatcher
# with the DeepEP backend (a token crosses the fabric once per destination node) or the HybridEP one
Dispatcher = Literal["alltoall", "deepep", "hybridep"]
# how much of the data-parallel sync overlaps compute: all the runtime hides, the gradient reduction only, nothing
DpOverlap = Literal["on", "grad", "off"]


PLACEMENT_KEYS = ("offload", "offload_device", "offload_ratio", "regather")
_STAGE_FIELDS = tuple(f"stage_{key}" for key in PLACEMENT_KEYS)  # their per-stage fields


class Strategy(BaseModel):
    """How a job is parallelised and where its state lives.

    Rank order is Megatron's: tp fastest, then cp, then dp, then pp; expert
    groups fold over a stage's tp x cp x dp ranks (etp fastest, then ep).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    tp: int = Field(1, gt=0, description="Tensor-parallel degree.")
    pp: int = Field(1, gt=0, description="Pipeline-parallel stages.")
    dp: int | None = Field(None, gt=0, description="Data-parallel degree; derived from the GPU count when omitted.")
    cp: int = Field(1, gt=0, description="Context-parallel degree (sequence split for attention).")
    ep: int = Field(1, gt=0, description="Expert-parallel degree (MoE): ranks the routed experts are spread over.")
    etp: int | None = Field(
        None, gt=0,
        description="Expert tensor-parallel degree: ways each routed expert's GEMMs are split (Megatron "
        "--expert-tensor-parallel-size).  Expert groups of etp x ep ranks are folded over the tp x cp x dp ranks "
        "of a stage, consecutive ranks first (MoE parallel folding, arXiv 2504.14960).  Default: tp.",
    )
    ep_overlap: bool = Field(
        False,
        description="Hide the expert all-to-alls behind another micro-batch's compute (Megatron "
        "--overlap-moe-expert-parallel-comm with --delay-wgrad-compute).",
    )
    dispatcher: Dispatcher = Field(
        "alltoall",
        description="MoE token dispatcher: alltoall (Megatron --moe-token-dispatcher-type alltoall: every "
        "(token, expert) pair crosses), deepep (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend "
        "deepep: a token crosses the fabric once per destination node, then fans out over NVLink) or hybridep "
        "(--moe-flex-dispatcher-backend hybridep, costed at the all-to-all's volume until measured).",
    )
    mbs: int = Field(1, gt=0, description="Micro-batch size in sequences.")
    vpp: int = Field(1, gt=0, description="Virtual pipeline chunks per stage (interleaved schedule; 2 in a V "
                     "under zbv and dualpipev).")
    sp: bool | None = Field(None, description="Sequence parallelism with tp; default on when tp > 1.")
    zero: int = Field(0, ge=0, le=3, description="ZeRO stage: 1 optimizer, 2 +gradients, 3 +weights sharded.")
    shard: ShardScope = Field("full", description="ZeRO/FSDP sharding over the whole dp group or within a node (HSDP).")
    recompute: Recompute = Field("none", description="Activation recomputation.")
    recompute_layers: tuple[int, ...] | None = Field(
        None,
        description="With recompute=full: blocks that recompute, counted from the start of each stage (of each "
        "chunk with vpp > 1); one value for every stage (Megatron --recompute-num-layers, block method) or "
        "one per stage; the other blocks keep their activations. Default: all blocks.",
    )
    recompute_every: int | None = Field(
        None, gt=0,
        description="With recompute=full: only every k-th block recomputes, blocks k, 2k, ... counted from 1 over "
        "each stage's blocks in order (torchtitan's activation_checkpoint.selective_ac_option = k, an FSDP "
        "check_fn that checkpoints every k-th block); the other blocks keep their activations. Default: all "
        "blocks (or recompute_layers).",
    )
    regather: Regather = Field(
        "network",
        description="ZeRO-3 weights for later gathers within a step: network re-gathers them over the "
        "sharding group each time; host keeps the first forward's gathered weights in host DRAM (one copy "
        "per node, Fully Cached Data Parallel) so later gathers read them over PCIe and all-gather inside "
        "the node. (Weights kept on the GPU, no reshard, is zero=2.)",
    )
    offload: Offload = Field("none", description="State offloaded from HBM: optimizer, params, or both.")
    offload_device: OffloadDevice = Field("cpu", description="Offload target: host DRAM or NVMe.")
    offload_ratio: float = Field(
        1.0, gt=0.0, le=1.0,
        description="Share of the optimizer states offloaded (and updated by CPU Adam); the rest stays in HBM and "
        "is updated on the GPU (DeepSpeed ZeRO-Offload++ offload_optimizer.ratio, Megatron "
        "--optimizer-offload-fraction). Below 1 needs zero=3 and offload_device=cpu.",
    )
    schedule: Schedule | None = Field(
        None, description="Pipeline schedule; default 1f1b, or interleaved when vpp > 1.  zbv (torch "
        "ScheduleZBVZeroBubble) and dualpipev (torch ScheduleDualPipeV) run vpp=2 chunks per stage in a V and "
        "split each backward into input- and weight-gradient passes."
    )
    tp_overlap: bool = Field(
        False, description="Overlap TP collectives with GEMMs (Megatron --tp-comm-overlap, torchtitan AsyncTP)."
    )
    dp_overlap: DpOverlap = Field(
        "on", description="Data-parallel sync that overlaps compute: on, what the runtime hides (its profile's "
        "`overlap`: Megatron --overlap-grad-reduce and --overlap-param-gather, FSDP2's and DeepSpeed's buckets); "
        "grad, the gradient reduction only (--overlap-grad-reduce alone: the distributed optimizer's parameter "
        "all-gather runs after the step); off, neither (Megatron-LM's defaults without those flags: the reduction "
        "after the last backward, the all-gather after the optimizer step); grad and off need zero 0 or 1."
    )
    split: tuple[int, ...] | None = Field(
        None, description="Transformer blocks per pipeline stage (uneven splits); default even."
    )
    stage_pools: tuple[str, ...] | None = Field(
        None,
        description="Cluster pool of each pipeline stage (mixed clusters); default: ranks fill the pools in "
        "order. With it the job may use only part of the cluster.",
    )
    # Per-stage placement (SPEC: the same keys with one value per stage, e.g. offload=all/optimizer/none/none).
    # Stages differ in what they hold (1F1B keeps p - i micro-batches in flight on stage i; the first and
    # last carry embedding and head), so each stage's ranks may park their state differently.
    stage_offload: tuple[Offload, ...] | None = Field(
        None, description="offload per pipeline stage (overrides offload); None: offload for every stage.")
    stage_offload_device: tuple[OffloadDevice, ...] | None = Field(
        None, description="offload_device per pipeline stage; None: offload_device for every stage.")
    stage_offload_ratio: tuple[float, ...] | None = Field(
        None, description="offload_ratio per pipeline stage; None: offload_ratio for every stage.")
    stage_regather: tuple[Regather, ...] | None = Field(
        None, description="regather per pipeline stage; None: regather for every stage.")

    @model_validator(mode="before")
    @classmethod
    def _collapse_uniform_stages(cls, data):
        """A per-stage value that is the same on every stage is the plain key (one spelling per strategy)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in PLACEMENT_KEYS:
            values = data.get(f"stage_{key}")
            if values is None:
                continue
            values = tuple(values)
            if data.get(key) not in (None, cls.model_fields[key].default) and len(set(values)) > 1:
                raise ValueError(f"{key}: give one value or one per stage, not both")
            if len(set(values)) == 1:
                data[key], data[f"stage_{key}"] = values[0], None
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "Strategy":
        if self.schedule == "interleaved" and self.vpp < 2:
            raise ValueError("schedule=interleaved needs vpp >= 2")
        if self.schedule in V_SCHEDULES and self.vpp != 2:
            raise ValueError(f"schedule={self.schedule} needs vpp=2 (two chunks per stage in a V), not vpp={self.vpp}")
        if self.vpp > 1 and self.schedule not in (None, "interleaved", *V_SCHEDULES):
            raise ValueError(f"vpp={self.vpp} needs schedule=interleaved, zbv or dualpipev, not {self.schedule}")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError("vpp > 1 needs pp > 1")
        if self.sp and self.tp == 1:
            raise ValueError("sp=on needs tp > 1")
        if self.dp_overlap != "on" and self.zero > 1:  # sharded gradients or weights sync per micro-batch
            raise ValueError(f"dp_overlap={self.dp_overlap} needs zero 0 or 1 (the step's sync is what it exposes)")
        if self.ep_overlap:  # Megatron-Core's TransformerConfig asserts these for the all-to-all overlap
            if self.ep == 1:
                raise ValueError("ep_overlap=on needs ep > 1")
            if self.recompute == "full":
                raise ValueError("ep_overlap=on needs recompute other than full (Megatron's all-to-all overlap)")
            if self.pp > 1 and self.vpp == 1:
                raise ValueError("ep_overlap=on with pp > 1 needs vpp > 1 (Megatron's all-to-all overlap)")
            if self.schedule == "zbv":
                raise ValueError("ep_overlap=on needs overlapped forward-backward pairs: schedule=dualpipev or "
                                 "interleaved, not zbv")
        if self.dispatcher != "alltoall" and self.ep == 1:
            raise ValueError(f"dispatcher={self.dispatcher} needs ep > 1")
        if self.regather == "host" and (self.zero != 3 or self.shard != "full"):
            raise ValueError("regather=host needs zero=3 and shard=full (it caches what the full group gathers)")
        if self.offload_ratio < 1.0 and not (self.offloads_optimizer and self.zero == 3
                                             and self.offload_device == "cpu"):
            raise ValueError("offload_ratio < 1 needs offload=optimizer or all, zero=3 and offload_device=cpu "
                             "(partial optimizer offload as DeepSpeed runs it)")
        if self.offload in ("params", "all") and self.zero != 3:
            raise ValueError(f"offload={self.offload} needs zero=3 (parameters must be sharded to be offloaded)")
        if self.recompute_layers is not None:
            if self.recompute != "full":
                raise ValueError("recompute_layers needs recompute=full")
            if len(self.recompute_layers) not in (1, self.pp):
                raise ValueError(f"recompute_layers has {len(self.recompute_layers)} values; give 1 or pp={self.pp}")
            if min(self.recompute_layers) < 0:
                raise ValueError("recompute_layers must be >= 0")
        if self.recompute_every is not None:
            if self.recompute != "full":
                raise ValueError("recompute_every needs recompute=full")
            if self.recompute_layers is not None:
                raise ValueError("recompute_every and recompute_layers: give one (every k-th block, or the first k)")
        if self.stage_pools is not None and len(self.stage_pools) != self.pp:
            raise ValueError(f"stage_pools has {len(self.stage_pools)} entries, pp={self.pp}")
        if self.split is not None and len(self.split) != self.pp:
            raise ValueError(f"split has {len(self.split)} stages, pp={self.pp}")
        for key in PLACEMENT_KEYS:
            values = getattr(self, f"stage_{key}")
            if values is not None and len(values) != self.pp:
                raise ValueError(f"{key} has {len(values)} per-stage values, pp={self.pp}")
        if self.per_stage_placement:
            for stage in range(self.pp):  # every stage's own placement must be a valid strategy
                try:
                    Strategy.model_validate(self.for_stage(stage).model_dump())
                except ValidationError as err:
                    raise ValueError(f"stage {stage}: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        return self

    @property
    def per_stage_placement(self) -> bool:
        """Whether stages park their state differently (some stage_* field is set)."""
        return any(getattr(self, name) is not None for name in _STAGE_FIELDS)

    def for_stage(self, stage: int) -> "Strategy":
        """This strategy as stage `stage` runs it: its own offload, device, ratio and regather."""
        if not self.per_stage_placement:
            return self
        update: dict = {}
        for key in PLACEMENT_KEYS:
            values = getattr(self, f"stage_{key}")
            if values is not None:
                update[key] = values[stage]
            update[f"stage_{key}"] = None
        return self.model_copy(update=update)

    def with_stage_placements(self, placements: "Sequence[dict]", **update) -> "Strategy":
        """This strategy (with `update`) where stage i takes placement placements[i] (keys of PLACEMENT_KEYS
        that differ from this strategy's; {} keeps its own).  Values equal on every stage fold into the
        plain key."""
        if not any(placements):
            return self.model_copy(update=update)
        stages = {f"stage_{key}": tuple(p.get(key, getattr(self, key)) for p in placements) for key in PLACEMENT_KEYS}
        return Strategy.model_validate({**self.model_dump(), **update, **stages})

    def stage_placement(self, stage: int) -> dict:
        """{offload, offload_device, offload_ratio, regather} of one stage."""
        view = self.for_stage(stage)
        return {key: getattr(view, key) for key in PLACEMENT_KEYS}

    @property
    def pipelined(self) -> bool:
        """More than one pipeline stage (first and last stages differ from the middle ones)."""
        return self.pp > 1

    @property
    def sequence_parallel(self) -> bool:
        """Resolved sequence-parallel flag."""
        return self.tp > 1 if self.sp is None else self.sp

    @property
    def data_parallel(self) -> int:
        """Resolved data-parallel degree: dp of a strategy that `with_dp` resolved (every plan's, every
        estimate's).  ValueError for one whose dp is still to be derived from the GPU count (a programmer's
        error: the cost model and the emitters read only resolved strategies)."""
        if self.dp is None:
            raise ValueError(f"strategy {self.spec()}: dp is not resolved (Strategy.with_dp)")
        return self.dp

    @property
    def expert_tp(self) -> int:
        """Resolved expert tensor-parallel degree (etp, default tp)."""
        return self.tp if self.etp is None else self.etp

    @property
    def pipeline_schedule(self) -> Schedule:
        """Resolved schedule."""
        if self.schedule is not None:
            return self.schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    @property
    def v_shape(self) -> bool:
        """Two chunks per stage in a V (zbv, dualpipev): stage i runs model chunks i and 2 pp - 1 - i, so the
        first stage holds the embedding and the head."""
        return self.pp > 1 and self.pipeline_schedule in V_SCHEDULES

    @property
    def offloads_optimizer(self) -> bool:
        """Optimizer states live off the GPU (on some stage)."""
        if self.stage_offload is None:
            return self.offload in ("optimizer", "all")
        return any(o in ("optimizer", "all") for o in self.stage_offload)

    @property
    def offloads_params(self) -> bool:
        """Weights live off the GPU between uses (on some stage)."""
        if self.stage_offload is None:
            return self.offload in ("params", "all")
        return any(o in ("params", "all") for o in self.stage_offload)

    @property
    def blocks_recomputable(self) -> bool:
        """The search may fully recompute chosen blocks on top of this configuration: its base recompute is
        none and no expert all-to-all overlap forbids full recompute (Megatron's TransformerConfig)."""
        return self.recompute == "none" and not self.ep_overlap

    def stage_recompute_count(self, stage: int) -> int | None:
        """Fully recomputed blocks per stage (per chunk), None for all."""
        if self.recompute_layers is None:
            return None
        return self.recompute_layers[0 if len(self.recompute_layers) == 1 else stage]

    def layer_recompute(self, layer_block: int | None, stage: int, stage_blocks: tuple[int, ...]) -> Recompute:
        """Recompute mode of one layer: only transformer blocks recompute, with recompute_layers only the first
        that many blocks of each stage (each chunk), with recompute_every every k-th block of the stage."""
        if layer_block is None or self.recompute == "none":
            return "none"
        if self.recompute_every is not None:
            position = stage_blocks.index(layer_block) + 1 if layer_block in stage_blocks else 0
            return "full" if position and position % self.recompute_every == 0 else "none"
        count = self.stage_recompute_count(stage)
        if self.recompute == "selective" or count is None:
            return self.recompute
        position = 0
        if layer_block in stage_blocks:  # its place in its chunk (planner.chunks: uneven chunks too)
            index = stage_blocks.index(layer_block)
            even = self.split is None or even_chunks(self.split, self.vpp)
            for size in stage_chunks(len(stage_blocks), self.vpp, stage == 0, stage == self.pp - 1, even):
                if index < size:
                    break
                index -= size
            position = index
        return "full" if position < count else "none"

    def with_dp(self, world_size: int) -> "Strategy":
        """This strategy with dp resolved from the world size, checking the product."""
        model_ranks = self.tp * self.pp * self.cp
        if self.dp is None:
            if world_size % model_ranks:
                raise PlannerInputError(
                    f"world_size({world_size}) is not divisible by tp({self.tp}) * pp({self.pp}) * cp({self.cp})"
                    f" = {model_ranks}"
                )
            return self.model_copy(update={"dp": world_size // model_ranks})
        if model_ranks * self.dp != world_size:
            raise PlannerInputError(
                f"tp({self.tp}) * pp({self.pp}) * cp({self.cp}) * dp({self.dp}) = {model_ranks * self.dp}"
                f" != world_size({world_size})"
            )
        return self

    def resolved(self) -> dict:
        """Every field with defaults resolved (sp, schedule), as JSON-ready values."""
        data = self.model_dump(mode="json")
        data.update(sp=self.sequence_parallel, schedule=self.pipeline_schedule)
        return data

    def spec(self) -> str:
        """The canonical SPEC string of this strategy (round-trips through parse_strategy)."""
        parts = [
            f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}" if self.dp else None, f"cp={self.cp}",
            f"ep={self.ep}", f"etp={self.etp}" if self.etp is not None else None, f"mbs={self.mbs}", f"vpp={self.vpp}",
            f"sp={'on' if self.sequence_parallel else 'off'}", f"zero={self.zero}", f"shard={self.shard}",
            f"recompute={self.recompute}",
            self._placement_spec("regather", "network"),
            f"recompute_layers={'/'.join(map(str, self.recompute_layers))}" if self.recompute_layers else None,
            f"recompute_every={self.recompute_every}" if self.recompute_every is not None else None,
            self._placement_spec("offload", None), self._placement_spec("offload_device", None),
            self._placement_spec("offload_ratio", 1.0),
            f"schedule={self.pipeline_schedule}", f"tp_overlap={'on' if self.tp_overlap else 'off'}",
            f"dp_overlap={self.dp_overlap}" if self.dp_overlap != "on" else None,
            "ep_overlap=on" if self.ep_overlap else None,
            f"dispatcher={self.dispatcher}" if self.dispatcher != "alltoall" else None,
            f"split={'/'.join(map(str, self.split))}" if self.split else None,
            f"stage_pools={'/'.join(self.stage_pools)}" if self.stage_pools else None,
        ]
        return ",".join(p for p in parts if p)

    def _placement_spec(self, key: str, omit_when) -> str | None:
        """`key=value`, or one value per stage joined by '/'; None when it is `omit_when` everywhere."""
        values = getattr(self, f"stage_{key}")
        if values is None:  # the common case, kept cheap: specs sort the solver's configurations
            value = getattr(self, key)
            return None if value == omit_when else f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
        if omit_when is not None and all(v == omit_when for v in values):
            return None
        return f"{key}={'/'.join(f'{v:g}' if isinstance(v, float) else str(v) for v in values)}"


_ALIASES = {"zero": {"fsdp": "3", "ddp": "0"}}


def short_spec(spec: str) -> str:
    """`spec` without the keys at their defaults: each key whose removal leaves the same resolved strategy is
    dropped (dp stays: a plan's data-parallel degree is resolved, never a default), so text output shows what
    was chosen.  The full SPEC stays in plan.json and --json."""
    full, kept = parse_strategy(spec).spec(), [p for p in spec.split(",") if p]
    for part in list(kept):
        trial = [p for p in kept if p != part]
        try:
            same = parse_strategy(",".join(trial)).spec() == full
        except (PlannerInputError, ValueError):  # another key needs this one (sp=on needs tp > 1)
            same = False
        if same:
            kept = trial
    return ",".join(kept) or "(defaults)"


def spec_kind(key: str) -> str:
    """How the SPEC spells a field's value, read off its annotation: int, bool, ints (a/b/c), names (a/b/c),
    or a word."""
    annotation = Strategy.model_fields[key].annotation
    args = set(get_args(annotation)) - {type(None)} or {annotation}
    if args == {int}:
        return "int"
    if args == {bool}:
        return "bool"
    if args == {tuple[int, ...]}:
        return "ints"
    if args == {tuple[str, ...]}:
        return "names"
    return "word"


def parse_int(key: str, raw: str) -> int:
    """An integer field's value."""
    try:
        return int(raw)
    except ValueError:
        raise PlannerInputError(f"strategy: {key}: expected an integer, got {raw!r}") from None


def _parse_bool(key: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise PlannerInputError(f"strategy: {key}: expected on|off, got {raw!r}")


def parse_strategy(spec: str) -> Strategy:
    """Parse a SPEC string such as 'tp=8,pp=4,mbs=1,recompute=selective'."""
    values: dict[str, object] = {}
    known = set(Strategy.model_fields)
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        raw = raw.strip()
        if not sep or not raw:
            raise PlannerInputError(f"strategy: {item!r}: expected key=value")
        if key not in known:
            raise PlannerInputError(f"strategy: unknown key {key!r}; known: {', '.join(sorted(known))}")
        if key in values:
            raise PlannerInputError(f"strategy: {key}: given twice")
        raw = _ALIASES.get(key, {}).get(raw.lower(), raw)
        kind = spec_kind(key)
        if kind == "int":
            values[key] = parse_int(key, raw)
        elif kind == "bool":
            values[key] = _parse_bool(key, raw)
        elif kind == "ints":
            try:
                values[key] = tuple(int(x) for x in raw.split("/"))
            except ValueError:
                raise PlannerInputError(f"strategy: {key}: expected integers per stage like 10/12/12/10, "
                                        f"got {raw!r}") from None
        elif kind == "names":
            values[key] = tuple(raw.split("/"))
        elif key in PLACEMENT_KEYS and "/" in raw:
            parts = [part.strip().lower() for part in raw.split("/")]
            if key == "offload_ratio":
                try:
                    values[f"stage_{key}"] = tuple(float(x) for x in parts)
                except ValueError:
                    raise PlannerInputError(f"strategy: {key}: expected numbers per stage like 1/0.5, "
                                            f"got {raw!r}") from None
            else:
                values[f"stage_{key}"] = tuple(parts)
        else:
            values[key] = raw.lower()
    try:
        return Strategy.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        where = ".".join(str(p) for p in first["loc"])
        raise PlannerInputError(f"strategy: {where}: {message}" if where else f"strategy: {message}") from None


def strategy_key(strategy: Strategy, reads: tuple[str, ...]) -> tuple:
    """The values of the fields (or properties) in `reads`: the cache key of a quantity computed from
    exactly those (planner.fields declares what each cached computation reads)."""
    return _getter(reads)(strategy)


@lru_cache(maxsize=None)
def _getter(reads: tuple[str, ...]):
    """One attrgetter per key shape (the search builds hundreds of thousands of keys), always a tuple."""
    if len(reads) == 1:
        single = attrgetter(reads[0])
        return lambda strategy: (single(strategy),)
    return attrgetter(*reads)

