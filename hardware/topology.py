"""The cluster model: pools of nodes joined by a fabric, and how to load one.

A `Cluster` is one or more `Pool`s (N identical nodes each, possibly of
different node types) joined by one `Fabric`.  `load_cluster` reads either

* the shorthand ``PRESET:NODES``, e.g. ``dgx-h100:16`` (16 DGX H100 nodes), or
* a cluster file (YAML, or JSON with a ``.json`` suffix)::

    name: my-cluster                  # optional; defaults to the file stem
    fabric:                           # optional; every key optional
      latency: 5.0e-6                 # seconds per inter-node message
      oversubscription: 1.0           # 2.0: the spine gives half the NIC rate
      bandwidth_per_nic: 25.0e+9      # bytes/s cap when the fabric is slower
    pools:
      - name: a100
        preset: dgx-a100-80g          # a node preset from hardware/data/nodes.yaml
        nodes: 16
        overrides: {host_dram_bytes: 1.0e+12}   # optional: replace NodeSpec fields
      - name: b200-capped
        preset: dgx-b200
        nodes: 4
        overrides: {gpu_power_limit: 750.0}     # W: tensor throughput follows the device's power_curve
      - name: gb200-racks
        preset: gb200-nvl72                   # a node is a 4-GPU compute tray
        nodes: 32
        overrides: {nvlink_domain_nodes: 16}  # 16 trays (64 GPUs) of each rack share one NVLink domain
      - name: custom
        nodes: 2
        node:                         # ... or an inline node: all NodeSpec fields
          device: h100-sxm
          gpus_per_node: 8
          intra_link: {kind: nvswitch, bandwidth: 450.0e+9, latency: 2.0e-6}
          nic_count: 8
          nic_bandwidth: 50.0e+9
          host_dram_bytes: 2.0e+12
          nvme_bytes: 30.72e+12
          nvme_bandwidth: 48.0e+9
          pcie_bandwidth: 64.0e+9
          sources: ["my lab's spec sheet"]

Unknown keys are errors.  Every bad input raises `HardwareInputError` with one
line naming the file and the field path, e.g.
``cluster.yaml: pools[1].nodes: must be a positive integer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hardware.catalog import DeviceSpec, NodeSpec, load_catalog
from hardware.errors import HardwareInputError
from models.yamlio import as_name, name_problem, read_mapping

_FROZEN = ConfigDict(extra="forbid", frozen=True)


def _name(value: str) -> str:
    problem = name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _pool_name(value: str) -> str:
    problem = name_problem(value, slash=False)
    if problem:
        raise ValueError(problem)
    return value


# cluster and pool names reach plan.json, strategy specs (stage_pools=a/b) and launch-file comments
Name = Annotated[str, AfterValidator(_name)]
PoolName = Annotated[str, AfterValidator(_pool_name)]


class Fabric(BaseModel):
    """The inter-node network joining all pools."""

    model_config = _FROZEN
    latency: float = Field(
        default=5e-6,
        ge=0,
        strict=True,
        allow_inf_nan=False,
        description="Inter-node small-message latency in seconds (alpha). Default 5 us: an RDMA "
        "fabric through a few switch tiers plus NCCL protocol overhead (NCCL tuning.cc network "
        "latencies are several us; Calculon's systems/*.json use 2 us for the NIC alone).",
    )
    oversubscription: float = Field(
        default=1.0,
        ge=1.0,
        strict=True,
        allow_inf_nan=False,
        description="Spine oversubscription ratio: 1.0 is a non-blocking fat tree, 2.0 means "
        "traffic crossing the spine gets half of the NIC rate.",
    )
    bandwidth_per_nic: float | None = Field(
        default=None,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="Bytes/s per NIC per direction when the fabric is slower than the nodes' "
        "NICs (e.g. 200 Gb/s switches behind 400 Gb/s adapters); None: the NIC rate.",
    )


class Pool(BaseModel):
    """`count` identical nodes of one type."""

    model_config = _FROZEN
    name: PoolName = Field(description="Pool name, unique in its cluster (letters, digits and ._+:-).")
    node: NodeSpec = Field(description="The node type (a catalog preset, possibly overridden).")
    count: int = Field(gt=0, description="Number of nodes in the pool.")

    @property
    def gpus(self) -> int:
        """GPUs in the pool."""
        return self.count * self.node.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs that reach each other over NVLink: the node's NVLink domain (a GB200 NVL72 rack's 18 trays), or
        the whole pool when it is smaller than one domain."""
        return self.node.gpus_per_node * min(self.count, self.node.nvlink_domain_nodes)

    def device_spec(self) -> DeviceSpec:
        """This pool's GPU as it runs there: the catalog entry under the node's power or clock limit."""
        return load_catalog().node_device(self.node)


class Cluster(BaseModel):
    """Pools of nodes joined by one fabric."""

    model_config = _FROZEN
    name: Name = Field(description="Cluster name (the shorthand or the file's `name`).")
    pools: list[Pool] = Field(min_length=1, description="The node pools, in file order.")
    fabric: Fabric = Field(default_factory=Fabric, description="The inter-node network.")

    @model_validator(mode="after")
    def _unique_pool_names(self) -> "Cluster":
        names = [pool.name for pool in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate pool names: {', '.join(duplicates)}")
        return self

    @property
    def num_gpus(self) -> int:
        """GPUs over all pools."""
        return sum(pool.gpus for pool in self.pools)

    @property
    def num_nodes(self) -> int:
        """Nodes over all pools."""
        return sum(pool.count for pool in self.pools)

    @property
    def is_homogeneous(self) -> bool:
        """One pool, or every pool has the same node (overrides included)."""
        return all(pool.node == self.pools[0].node for pool in self.pools)

    def pool(self, name: str) -> Pool:
        """The pool called `name`."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        known = ", ".join(p.name for p in self.pools)
        raise HardwareInputError(f"cluster {self.name}: unknown pool {name!r}; known: {known}")

    def inter_node_bandwidth_per_gpu(self, pool: Pool | str) -> float:
        """Inter-node bytes/s per GPU per direction when every GPU of a node sends at once.

        NICs are shared by the node's GPUs; a slower fabric caps each NIC; an
        oversubscribed spine divides what is left.
        """
        node = (self.pool(pool) if isinstance(pool, str) else pool).node
        rate = node.nic_bandwidth
        if self.fabric.bandwidth_per_nic is not None:
            rate = min(rate, self.fabric.bandwidth_per_nic)
        return rate * node.nic_count / node.gpus_per_node / self.fabric.oversubscription

    def describe(self) -> str:
        """One line: name, totals and each pool."""
        parts = [
            f"{p.name}: {p.count}x {p.node.name} ({p.gpus}x {p.node.device}{_limits(p.node)}{_domain(p)})"
            for p in self.pools
        ]
        nodes = f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''}"
        return f"{self.name}: {nodes}, {self.num_gpus} GPUs [{'; '.join(parts)}]"


def _limits(node: NodeSpec) -> str:
    """' at 750 W, 1500 MHz': the power and clock limits a node's GPUs run under, if any."""
    limits = [f"{node.gpu_power_limit:g} W" if node.gpu_power_limit else "",
              f"{node.gpu_clock_limit:g} MHz" if node.gpu_clock_limit else ""]
    text = ", ".join(filter(None, limits))
    return f" at {text}" if text else ""


def _domain(pool: Pool) -> str:
    """', NVLink domains of 72 GPUs': where a node's NVLink domain spans several nodes (GB200 NVL72)."""
    return f", NVLink domains of {pool.nvlink_domain_gpus} GPUs" if pool.node.nvlink_domain_nodes > 1 else ""


# ---------------------------------------------------------------- file schema
# The file is validated against these models first, so that pydantic's error
# locations are the file's own keys (`nodes`, not Pool.count).


class PoolEntry(BaseModel):
    """One pool as written in a cluster file."""

    model_config = ConfigDict(extra="forbid")
    name: PoolName = Field(description="Pool name, unique in the file (letters, digits and ._+:-).")
    nodes: int = Field(description="Number of nodes (a positive integer).")
    preset: str | None = Field(default=None, description="Node preset key; or give `node`.")
    node: dict[str, Any] | None = Field(default=None, description="Inline NodeSpec fields.")
    overrides: dict[str, Any] | None = Field(
        default=None, description="NodeSpec fields replacing the preset's (or the inline node's)."
    )

    @field_validator("nodes", mode="before")
    @classmethod
    def _positive_int(cls, value: Any) -> int:
        # bool is an int subclass and "16" would be coerced: both are mistakes.
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError("must be a positive integer")
        return value


class ClusterFile(BaseModel):
    """A cluster file: optional name and fabric, one or more pools."""

    model_config = ConfigDict(extra="forbid")
    name: Name | None = Field(default=None, description="Cluster name (letters, digits and ._+:-/); default: the "
                              "file stem, other characters made '-'.")
    fabric: Fabric = Field(default_factory=Fabric, description="The inter-node network.")
    pools: list[PoolEntry] = Field(min_length=1, description="The node pools.")


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _render(error: ValidationError, prefix: Callable[[tuple], tuple] = lambda loc: ()) -> str:
    """Pydantic errors as 'loc.path: message' joined on one line; `prefix(loc)` is prepended."""
    items = []
    for e in error.errors():
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing" and tuple(e["loc"]) == ("pools",):
            msg += " (a cluster file lists its node pools there; see examples/clusters/)"
        msg = msg.removeprefix("Value error, ")
        loc = _loc(prefix(e["loc"]) + tuple(e["loc"]))
        items.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(items)


def _build_node(entry: PoolEntry, index: int, label: str) -> NodeSpec:
    catalog = load_catalog()
    where = f"{label}: pools[{index}]"
    if (entry.preset is None) == (entry.node is None):
        raise HardwareInputError(f"{where}: give exactly one of 'preset' or 'node'")
    if entry.preset is not None:
        if entry.preset not in catalog.nodes:
            known = ", ".join(sorted(catalog.nodes))
            raise HardwareInputError(
                f"{where}.preset: unknown node preset {entry.preset!r}; known: {known}"
            )
        fields = catalog.nodes[entry.preset].model_dump()
    else:
        fields = {"name": entry.name, **(entry.node or {})}  # given: checked above
    overrides = entry.overrides or {}
    fields.update(overrides)

    def blame(loc: tuple) -> tuple:
        # A preset is valid, so a bad field came from `overrides` or the inline `node`.
        key = "overrides" if (loc and loc[0] in overrides) or entry.node is None else "node"
        return ("pools", index, key)

    try:
        node = NodeSpec.model_validate(fields)
    except ValidationError as exc:
        raise HardwareInputError(f"{label}: {_render(exc, blame)}") from None
    if node.device not in catalog.devices:
        known = ", ".join(sorted(catalog.devices))
        field = _loc(blame(("device",)) + ("device",))
        raise HardwareInputError(f"{label}: {field}: unknown device {node.device!r}; known: {known}")
    _check_limits(node, catalog.devices[node.device], lambda key: f"{label}: {_loc(blame((key,)) + (key,))}")
    return node


def _check_limits(node: NodeSpec, device: DeviceSpec, where: Callable[[str], str]) -> None:
    """A power or clock limit the node's device publishes no throughput for is an error naming the field."""
    for key, throughput in (("gpu_power_limit", device.power_throughput),
                            ("gpu_clock_limit", device.clock_throughput)):
        value = getattr(node, key)
        if value is None:
            continue
        try:
            throughput(value)
        except ValueError as exc:
            raise HardwareInputError(f"{where(key)}: {exc}") from None


def _load_file(path: Path, label: str) -> Cluster:
    data = read_mapping(path, label, HardwareInputError, "cluster file")
    try:
        spec = ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise HardwareInputError(f"{label}: {_render(exc)}") from None
    pools: list[Pool] = []
    seen: set[str] = set()
    for i, entry in enumerate(spec.pools):
        if entry.name in seen:
            raise HardwareInputError(f"{label}: pools[{i}].name: duplicate pool name {entry.name!r}")
        seen.add(entry.name)
        pools.append(Pool(name=entry.name, node=_build_node(entry, i, label), count=entry.nodes))
    return Cluster(name=spec.name or as_name(path.stem, "cluster"), pools=pools, fabric=spec.fabric)


def _load_shorthand(arg: str) -> Cluster:
    preset, _, count = arg.rpartition(":")
    if not (count.isascii() and count.isdigit()) or int(count) <= 0:
        raise HardwareInputError(f"{arg}: node count must be a positive integer")
    catalog = load_catalog()
    if preset not in catalog.nodes:
        known = ", ".join(sorted(catalog.nodes))
        raise HardwareInputError(f"{arg}: unknown node preset {preset!r}; known: {known}")
    pool = Pool(name=preset, node=catalog.nodes[preset], count=int(count))
    return Cluster(name=arg, pools=[pool])


def load_cluster(arg: str) -> Cluster:
    """A cluster from ``PRESET:NODES`` (e.g. ``dgx-h100:16``) or a YAML/JSON cluster file."""
    path = Path(arg)
    if path.is_dir():
        raise HardwareInputError(f"{arg}: is a directory, not a cluster file")
    if path.is_file():
        return _load_file(path, arg)
    if path.exists():  # reading a FIFO or device would block or never end
        raise HardwareInputError(f"{arg}: is not a regular file (a FIFO, socket or device); give a cluster file")
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        raise HardwareInputError(f"{arg}: no such cluster file")
    if ":" in arg:
        return _load_shorthand(arg)
    hint = f" (did you mean '{arg}:1'?)" if arg in load_catalog().nodes else ""
    raise HardwareInputError(
        f"unknown cluster {arg!r}: not a PRESET:NODES shorthand nor an existing file{hint}"
    )
