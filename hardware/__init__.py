"""The machine: devices, node presets, clusters and collective timings.

Figures live in `hardware/data/*.yaml` with their sources; `load_catalog()`
reads them and `load_cluster("dgx-h100:16")` or `load_cluster("cluster.yaml")`
builds a `Cluster` of node pools.
"""

from hardware.catalog import Catalog, DeviceSpec, LinkSpec, NodeSpec, load_catalog
from hardware.errors import HardwareInputError
from hardware.topology import Cluster, Fabric, Pool, load_cluster

from hardware.collectives import CommGroup

__all__ = [
    "Catalog",
    "CommGroup",
    "Cluster",
    "DeviceSpec",
    "Fabric",
    "HardwareInputError",
    "LinkSpec",
    "NodeSpec",
    "Pool",
    "load_catalog",
    "load_cluster",
]
