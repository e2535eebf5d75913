"""Power and clock limits: a capped device runs its tensor work slower by its documented derating, and a
limit the device publishes nothing for is one line naming the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from conftest import make_job
from hardware import HardwareInputError, load_catalog, load_cluster
from hardware.catalog import DeviceSpec
from planner.cli import cli
from planner.cost import evaluate
from planner.cost.compute import gemm_rate
from planner.strategy import Strategy

DEVICES = yaml.safe_load((Path(__file__).resolve().parents[1] / "hardware" / "data" / "devices.yaml").read_text())


def _cluster(tmp_path: Path, overrides: str, preset: str = "dgx-b200", name: str = "c.yaml"):
    path = tmp_path / name
    path.write_text(f"pools:\n  - {{name: a, preset: {preset}, nodes: 1, overrides: {overrides}}}\n")
    return load_cluster(str(path))


def test_power_curve_of_the_data_file_is_what_a_capped_pool_runs_at(tmp_path):
    # devices.yaml's B200 curve: the 700 W point (HGX B100's datasheet peak over HGX B200's), linear to the TDP
    curve = DEVICES["b200"]["power_curve"]
    low, tdp = curve[0], curve[-1]
    for watts, expected in ((low["watts"], low["throughput"]), (tdp["watts"], 1.0),
                            ((low["watts"] + tdp["watts"]) / 2, (low["throughput"] + 1.0) / 2)):
        device = _cluster(tmp_path, f"{{gpu_power_limit: {watts}}}").pools[0].device_spec()
        assert device.throughput_scale == pytest.approx(expected)
        assert device.peak("bf16") == DEVICES["b200"]["peak_flops"]["bf16"]  # MFU stays against the nominal peak


def test_a_capped_device_is_slower_by_its_derating(tmp_path):
    capped = _cluster(tmp_path, "{gpu_power_limit: 700.0}")
    throughput = DEVICES["b200"]["power_curve"][0]["throughput"]
    full, slow = (make_job("llama3-8b", cluster, batch=8, seq=8192) for cluster in ("dgx-b200:1", capped))
    catalog = load_catalog()
    device, limited = full.cluster.pools[0].device_spec(), slow.cluster.pools[0].device_spec()
    assert gemm_rate(limited, slow, 1e11, catalog) == pytest.approx(throughput * gemm_rate(device, full, 1e11, catalog))
    strategy = Strategy(dp=8, zero=1)
    fast_step, slow_step = (evaluate(job, strategy) for job in (full, slow))
    # tensor work stretches by 1 / throughput; element-wise kernels (HBM-bound) and communication do not
    assert fast_step.step_time_s < slow_step.step_time_s < fast_step.step_time_s / throughput
    assert slow_step.breakdown.compute_s > 1.15 * fast_step.breakdown.compute_s
    assert slow_step.mfu < fast_step.mfu


def test_a_clock_limit_scales_by_the_boost_clock(tmp_path):
    boost = DEVICES["h100-sxm"]["boost_clock_mhz"]
    device = _cluster(tmp_path, "{gpu_clock_limit: 1500.0}", preset="dgx-h100").pools[0].device_spec()
    assert device.throughput_scale == pytest.approx(1500.0 / boost)
    above = _cluster(tmp_path, f"{{gpu_clock_limit: {boost + 100}}}", preset="dgx-h100").pools[0].device_spec()
    assert above.throughput_scale == 1.0  # a limit above the boost clock does not bind


@pytest.mark.parametrize(("preset", "overrides", "expected"), [
    ("dgx-b200", "{gpu_power_limit: 500.0}",
     "c.yaml: pools[0].overrides.gpu_power_limit: 500 W is below the lowest power limit the b200 publishes a "
     "throughput for (700 W)"),
    ("dgx-b200", "{gpu_power_limit: 1200.0}",
     "c.yaml: pools[0].overrides.gpu_power_limit: 1200 W is above the b200's board power of 1000 W"),
    ("dgx-a100-80g", "{gpu_power_limit: 300.0}",
     "c.yaml: pools[0].overrides.gpu_power_limit: device a100-80g has no tdp_watts, so no power limit applies"),
    ("dgx-b200", "{gpu_clock_limit: 1500.0}",
     "c.yaml: pools[0].overrides.gpu_clock_limit: device b200 has no boost_clock_mhz, so no clock limit applies"),
    ("dgx-b200", "{gpu_power_limit: -5.0}",
     "c.yaml: pools[0].overrides.gpu_power_limit: Input should be greater than 0"),
])
def test_a_limit_without_data_names_the_file_and_field(tmp_path, monkeypatch, preset, overrides, expected):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HardwareInputError) as info:
        _cluster(Path(), overrides, preset=preset)
    assert str(info.value).startswith(expected), str(info.value)
    assert "\n" not in str(info.value)


def test_an_inline_node_limit_is_blamed_on_the_node(tmp_path):
    node = load_catalog().nodes["dgx-b200"].model_dump(exclude={"name"})
    node["gpu_power_limit"] = 650.0
    (tmp_path / "n.yaml").write_text(yaml.safe_dump({"pools": [{"name": "a", "nodes": 1, "node": node}]}))
    with pytest.raises(HardwareInputError, match=r"^.*n\.yaml: pools\[0\]\.node\.gpu_power_limit: 650 W is below"):
        load_cluster(str(tmp_path / "n.yaml"))


def test_the_cli_refuses_a_bad_limit_with_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("c.yaml").write_text("pools:\n  - {name: a, preset: dgx-b200, nodes: 1, overrides: {gpu_power_limit: 90.0}}\n")
    result = CliRunner().invoke(cli, ["estimate", "llama3-8b", "c.yaml", "--batch", "8", "--seq-len", "4096",
                                      "--strategy", "dp=8"])
    assert result.exit_code == 2, result.output
    assert "c.yaml: pools[0].overrides.gpu_power_limit: 90 W is below" in result.output
    assert "Traceback" not in result.output


def test_a_power_curve_must_end_at_the_tdp():
    fields = {k: v for k, v in DEVICES["b200"].items() if k != "power_curve"}
    with pytest.raises(ValueError, match="the last step must be tdp_watts with throughput 1"):
        DeviceSpec(name="b200", power_curve=[{"watts": 700.0, "throughput": 0.8}], **fields)
    with pytest.raises(ValueError, match="ascending watts"):
        DeviceSpec(name="b200", power_curve=[{"watts": 1000.0, "throughput": 1.0}, {"watts": 700.0, "throughput": 0.8}],
                   **fields)
