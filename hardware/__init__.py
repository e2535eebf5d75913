"""The machine: devices, node presets, clusters (and, next, collectives).

Figures live in `hardware/data/*.yaml` with their sources; `load_catalog()`
reads them and `load_cluster("dgx-h100:16")` or `load_cluster("cluster.yaml")`
builds a `Cluster` of node pools.
"""

from hardware.catalog import Catalog, DeviceSpec, LinkSpec, NodeSpec, load_catalog
from hardware.errors import HardwareInputError
from hardware.topology import Cluster, Fabric, Pool, load_cluster

# collectives: the lead adds its imports here.

__all__ = [
    "Catalog",
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
