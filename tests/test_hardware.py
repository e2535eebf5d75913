"""Hardware catalog, node presets and cluster loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware import (
    Cluster,
    Fabric,
    HardwareInputError,
    Pool,
    load_catalog,
    load_cluster,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "clusters"

DEVICES = {
    "a100-40g", "a100-80g", "h100-sxm", "h100-pcie", "h100-96g", "h200",
    "b200", "gb200", "mi300x", "v100-32g", "l4", "t4", "cpu",
}
NODES = {
    "dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "hgx-h200", "dgx-b200", "mi300x-8",
    "dgx2-v100", "pcie-l4", "pcie-t4", "h100-96g-8", "gb200-nvl72", "jean-zay-a100", "cpu",
}


# ---------------------------------------------------------------- catalog


def test_catalog_has_every_device_and_preset():
    catalog = load_catalog()
    assert set(catalog.devices) == DEVICES
    assert set(catalog.nodes) == NODES


@pytest.mark.parametrize("key", sorted(DEVICES))
def test_device_is_documented(key):
    device = load_catalog().device(key)
    assert device.name == key
    assert device.sources and all(s.strip() for s in device.sources)
    assert device.price_per_hour > 0
    assert device.matmul_efficiency[-1].efficiency >= device.matmul_efficiency[0].efficiency


@pytest.mark.parametrize("key", sorted(NODES))
def test_preset_device_exists(key):
    catalog = load_catalog()
    node = catalog.node(key)
    assert node.device in catalog.devices
    assert node.sources


def test_jean_zay_nodes_are_blooms_cluster():
    # BLOOM's model card: "8 GPUs per node Using NVLink 4 inter-gpu connects, 4 OmniPath links" (100 Gb/s each)
    node = load_catalog().node("jean-zay-a100")
    assert node.intra_link.bandwidth == 4 * 25e9  # four NVLink3 links of 25 GB/s per direction
    assert node.nic_bandwidth_per_gpu == 4 * 100e9 / 8 / 8  # four 100 Gb/s links shared by 8 GPUs, in bytes/s


# Dense peaks, FLOP/s, from the datasheets cited in devices.yaml.
@pytest.mark.parametrize(
    ("key", "dtype", "flops"),
    [
        ("a100-80g", "bf16", 312e12),  # A100 datasheet: 624 TF sparse
        ("a100-80g", "tf32", 156e12),
        ("a100-40g", "fp32", 19.5e12),
        ("h100-sxm", "bf16", 989.4e12),  # H100 datasheet: 1,979 TF sparse
        ("h100-sxm", "fp8", 1979e12),
        ("h100-pcie", "bf16", 756e12),
        ("h200", "bf16", 989.4e12),  # same compute as H100 SXM
        ("b200", "bf16", 2.25e15),  # DGX B200: 36 PF sparse / 8 GPUs / 2
        ("b200", "fp8", 4.5e15),
        ("gb200", "bf16", 2.5e15),  # GB200 NVL72: 360 PF sparse per 72-GPU rack / 72 / 2
        ("gb200", "fp8", 5.0e15),
        ("mi300x", "bf16", 1307.4e12),
        ("mi300x", "fp8", 2614.9e12),
        ("l4", "bf16", 121e12),
        ("l4", "fp8", 242e12),
        ("t4", "fp16", 65e12),
    ],
)
def test_dense_peaks(key, dtype, flops):
    assert load_catalog().device(key).peak(dtype) == pytest.approx(flops)


def test_peak_fallbacks():
    catalog = load_catalog()
    # Volta/Turing have no bf16: the fp16 tensor peak stands in.
    assert catalog.device("v100-32g").peak("bf16") == pytest.approx(125e12)
    assert catalog.device("t4").peak("bf16") == pytest.approx(65e12)
    # No fp8 on A100: runs at the bf16 rate.
    assert catalog.device("a100-80g").peak("fp8") == pytest.approx(312e12)
    with pytest.raises(HardwareInputError, match="v100-32g has no tf32"):
        catalog.device("v100-32g").peak("tf32")


def test_memory_figures():
    catalog = load_catalog()
    assert catalog.device("h100-sxm").hbm_bytes == 80e9
    assert catalog.device("h200").hbm_bytes == 141e9
    assert catalog.device("b200").hbm_bytes == 180e9  # DGX B200: 1,440 GB / 8
    assert catalog.device("mi300x").hbm_bandwidth == pytest.approx(5.3e12)
    assert catalog.node("dgx-h100").intra_link.bandwidth == 450e9  # 900 GB/s bidirectional
    assert catalog.node("dgx2-v100").gpus_per_node == 16


def test_capacity_is_what_the_runtime_reports():
    # the figures PyTorch's out-of-memory message prints ("GPU 0 has a total capacity of X GiB"), read off the
    # published messages by hand; the datasheet's decimal GB stays in hbm_bytes
    catalog = load_catalog()
    published_gib = {"h100-sxm": 79.11, "a100-80g": 79.14, "a100-40g": 39.50, "h200": 139.80, "b200": 178.35,
                     "mi300x": 191.98}
    for name, gib in published_gib.items():
        assert catalog.device(name).capacity_bytes == pytest.approx(gib * 2**30, rel=1e-4), name
        # the old error: the datasheet's decimal GB counted as the capacity is 5-7% short of the runtime's
        assert catalog.device(name).hbm_bytes / 2**30 < catalog.device(name).capacity_bytes / 2**30
    # without a published figure the datasheet's capacity is used
    assert catalog.device("l4").capacity_bytes == catalog.device("l4").hbm_bytes


def test_fp8_only_where_hardware_has_it():
    with_fp8 = {k for k, d in load_catalog().devices.items() if "fp8" in d.peak_flops}
    assert with_fp8 == {"h100-sxm", "h100-pcie", "h100-96g", "h200", "b200", "gb200", "mi300x", "l4"}


def test_efficiency_is_a_step_function():
    device = load_catalog().device("h100-sxm")
    steps = device.matmul_efficiency
    assert [s.min_flops for s in steps] == [0, 1e9, 1e10, 1e11]
    assert device.efficiency(0) == steps[0].efficiency
    assert device.efficiency(1e9 - 1) == steps[0].efficiency
    assert device.efficiency(1e9) == steps[1].efficiency
    assert device.efficiency(5e10) == steps[2].efficiency
    assert device.efficiency(1e15) == steps[3].efficiency
    effs = [s.efficiency for s in steps]
    assert effs == sorted(effs)


def test_unknown_device_and_preset():
    catalog = load_catalog()
    with pytest.raises(HardwareInputError, match="unknown device 'h1000'"):
        catalog.device("h1000")
    with pytest.raises(HardwareInputError, match="unknown node preset 'dgx-h1000'"):
        catalog.node("dgx-h1000")


# ---------------------------------------------------------------- clusters


def test_shorthand():
    cluster = load_cluster("dgx-h100:16")
    assert cluster.name == "dgx-h100:16"
    assert cluster.num_nodes == 16
    assert cluster.num_gpus == 128
    assert cluster.is_homogeneous
    assert cluster.pools[0].device_spec().name == "h100-sxm"
    # 8 NICs x 50 GB/s shared by 8 GPUs.
    assert cluster.inter_node_bandwidth_per_gpu(cluster.pools[0]) == pytest.approx(50e9)


def test_example_hetero_3pool():
    cluster = load_cluster(str(EXAMPLES / "hetero-3pool.yaml"))
    assert cluster.name == "hetero-3pool"
    assert [(p.name, p.node.name, p.count) for p in cluster.pools] == [
        ("a100", "dgx-a100-80g", 16),
        ("h100", "dgx-h100", 8),
        ("l4", "pcie-l4", 8),
    ]
    assert cluster.num_gpus == 256
    assert not cluster.is_homogeneous
    assert cluster.inter_node_bandwidth_per_gpu("a100") == pytest.approx(25e9)
    assert cluster.inter_node_bandwidth_per_gpu("l4") == pytest.approx(12.5e9 / 8)
    assert "256 GPUs" in cluster.describe()


def test_example_dgx_h100_4_matches_shorthand():
    from_file = load_cluster(str(EXAMPLES / "dgx-h100-4.yaml"))
    shorthand = load_cluster("dgx-h100:4")
    assert from_file.pools[0].node == shorthand.pools[0].node
    assert from_file.num_gpus == shorthand.num_gpus == 32


def test_fabric_caps_and_oversubscription():
    node = load_catalog().node("dgx-h100")
    pool = Pool(name="h", node=node, count=2)
    slow = Cluster(name="c", pools=[pool], fabric=Fabric(bandwidth_per_nic=25e9, oversubscription=2))
    assert slow.inter_node_bandwidth_per_gpu(pool) == pytest.approx(25e9 * 8 / 8 / 2)
    with pytest.raises(ValueError):
        Fabric(oversubscription=0.5)


def test_overrides_and_inline_node(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        """
pools:
  - name: a
    preset: dgx-h100
    nodes: 2
    overrides: {host_dram_bytes: 1.0e+12}
  - name: b
    nodes: 1
    node:
      device: h100-sxm
      gpus_per_node: 4
      intra_link: {kind: nvlink, bandwidth: 450.0e+9, latency: 2.0e-6}
      nic_count: 4
      nic_bandwidth: 50.0e+9
      host_dram_bytes: 1.0e+12
      nvme_bytes: 0
      nvme_bandwidth: 0
      pcie_bandwidth: 64.0e+9
      sources: [test]
"""
    )
    cluster = load_cluster(str(path))
    assert cluster.name == "c"  # file stem
    assert cluster.pools[0].node.host_dram_bytes == 1e12
    assert cluster.pools[1].node.gpus_per_node == 4
    assert cluster.num_gpus == 20
    assert not cluster.is_homogeneous


def test_json_cluster_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"pools": [{"name": "a", "preset": "cpu", "nodes": 2}]}')
    assert load_cluster(str(path)).num_gpus == 8


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pools: [\n  {name: a,\n  nodes: 1\n", "bad.yaml: not valid YAML: "),
        ("- 1\n- 2\n", "bad.yaml: expected a mapping"),
        (
            "pools:\n  - {name: a, preset: dgx-h1000, nodes: 1}\n",
            "bad.yaml: pools[0].preset: unknown node preset 'dgx-h1000'; known: ",
        ),
        (
            "pools:\n  - {name: a, preset: dgx-h100, nodes: 1}\n  - {name: b, preset: dgx-h100, nodes: 0}\n",
            "bad.yaml: pools[1].nodes: must be a positive integer",
        ),
        ("pools:\n  - {name: a, preset: dgx-h100, nodes: -3}\n",
         "bad.yaml: pools[0].nodes: must be a positive integer"),
        ("pools:\n  - {name: a, preset: dgx-h100, nodes: '4'}\n",
         "bad.yaml: pools[0].nodes: must be a positive integer"),
        ("pools:\n  - {name: a, preset: dgx-h100, nodes: 1, gpus: 8}\n", "bad.yaml: pools[0].gpus: unknown key"),
        ("clusterz: 1\npools:\n  - {name: a, preset: dgx-h100, nodes: 1}\n", "bad.yaml: clusterz: unknown key"),
        ("name: x\n", "bad.yaml: pools: Field required"),
        (
            "pools:\n  - {name: a, preset: dgx-h100, nodes: 1, overrides: {nic_bandwidth: -1.0}}\n",
            "bad.yaml: pools[0].overrides.nic_bandwidth: Input should be greater than 0",
        ),
        (
            "pools:\n  - {name: a, preset: dgx-h100, nodes: 1, overrides: {nic_speed: 1.0}}\n",
            "bad.yaml: pools[0].overrides.nic_speed: unknown key",
        ),
        (
            "fabric: {bandwidth_per_nic: -5.0}\npools:\n  - {name: a, preset: dgx-h100, nodes: 1}\n",
            "bad.yaml: fabric.bandwidth_per_nic: Input should be greater than 0",
        ),
        (
            "fabric: {oversubscription: 0.5}\npools:\n  - {name: a, preset: dgx-h100, nodes: 1}\n",
            "bad.yaml: fabric.oversubscription:",
        ),
        ("pools:\n  - {name: a, nodes: 1}\n", "bad.yaml: pools[0]: give exactly one of 'preset' or 'node'"),
        (
            "pools:\n  - {name: a, preset: dgx-h100, nodes: 1}\n  - {name: a, preset: cpu, nodes: 1}\n",
            "bad.yaml: pools[1].name: duplicate pool name 'a'",
        ),
    ],
)
def test_bad_cluster_file(tmp_path, monkeypatch, text, expected):
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text(text)
    with pytest.raises(HardwareInputError) as info:
        load_cluster("bad.yaml")
    message = str(info.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_bad_inline_node(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("c.yaml").write_text(
        "pools:\n  - name: a\n    nodes: 1\n    node:\n      device: h1000\n      gpus_per_node: 8\n"
        "      intra_link: {kind: nvlink, bandwidth: -1.0, latency: 0.0}\n"
    )
    with pytest.raises(HardwareInputError) as info:
        load_cluster("c.yaml")
    message = str(info.value)
    assert message.startswith("c.yaml: ")
    assert "pools[0].node.intra_link.bandwidth: Input should be greater than 0" in message
    assert "pools[0].node.nic_count: Field required" in message
    assert "\n" not in message

    Path("d.yaml").write_text(
        "pools:\n  - name: a\n    preset: dgx-h100\n    nodes: 1\n    overrides: {device: h1000}\n"
    )
    with pytest.raises(HardwareInputError, match=r"^d.yaml: pools\[0\].overrides.device: unknown device 'h1000'"):
        load_cluster("d.yaml")


def test_bad_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("c.json").write_text('{"pools": [}')
    with pytest.raises(HardwareInputError, match=r"^c.json: not valid JSON: .* at line 1 column "):
        load_cluster("c.json")


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("dgx-h100:0", "dgx-h100:0: node count must be a positive integer"),
        ("dgx-h100:-2", "dgx-h100:-2: node count must be a positive integer"),
        ("dgx-h100:two", "dgx-h100:two: node count must be a positive integer"),
        ("dgx-h1000:4", "dgx-h1000:4: unknown node preset 'dgx-h1000'; known: "),
        ("foo", "unknown cluster 'foo': not a PRESET:NODES shorthand nor an existing file"),
        ("missing.yaml", "missing.yaml: no such cluster file"),
    ],
)
def test_bad_shorthand(arg, expected):
    with pytest.raises(HardwareInputError) as info:
        load_cluster(arg)
    assert str(info.value).startswith(expected)


def test_compute_nic_names_come_with_their_source():
    # the launch files' NCCL_IB_HCA comes from the node data; a name list without its source is refused
    from hardware import load_catalog
    from hardware.catalog import NodeSpec
    node = load_catalog().node("dgx-h100")
    assert len(node.compute_hcas) == node.nic_count and "DGX H100 User Guide" in node.compute_hcas_source
    data = node.model_dump()
    data["sources"] = [s for s in data["sources"] if not s.startswith("compute_hcas:")]
    with pytest.raises(ValueError, match="compute_hcas needs a source"):
        NodeSpec.model_validate(data)
    assert load_catalog().node("dgx-a100-80g").compute_hcas == ()
