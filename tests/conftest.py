"""Fixtures and the job factory shared by several test modules (`from conftest import make_job`)."""

from __future__ import annotations

import pytest

from hardware import Cluster, load_cluster
from models import load_model
from models.graph import ModelGraph
from planner.job import Job
from tools import missing_tools


def pytest_sessionstart(session):
    """Stop before the first test when a program the suite runs is missing (tests/tools.py)."""
    missing = missing_tools()
    if missing:
        pytest.exit(f"required tools are missing: {', '.join(missing)}", returncode=4)


# a cluster file of one CPU node with two ranks (the re-plan tests shrink onto it)
TWO_GPUS = """name: cpu-2
pools:
  - name: cpu
    nodes: 1
    preset: cpu
    overrides: {gpus_per_node: 2}
"""


def make_job(model: str | ModelGraph = "llama3-8b", cluster: str | Cluster = "dgx-h100:1", batch: int = 8,
             seq: int = 4096, **fields) -> Job:
    """A Job from zoo / file names or ready objects; `fields` are Job's other fields (precision, ...)."""
    graph = load_model(model) if isinstance(model, str) else model
    topology = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return Job(model=graph, cluster=topology, global_batch=batch, seq_len=seq, **fields)


@pytest.fixture
def mixed_job_files(tmp_path):
    """(model spec, cluster file) of a small job whose best plan is replica groups: a wide 2-layer
    llama on one A100 node of 4 GPUs and one H100 node of 2."""
    cluster = tmp_path / "mix.yaml"
    cluster.write_text("name: mix\npools:\n"
                       "  - {name: a100, preset: dgx-a100-80g, nodes: 1, overrides: {gpus_per_node: 4}}\n"
                       "  - {name: h100, preset: dgx-h100, nodes: 1, overrides: {gpus_per_node: 2}}\n")
    spec = tmp_path / "wide.yaml"
    spec.write_text("builder: llama\nname: wide\nnum_layers: 2\nhidden: 8192\nheads: 64\nkv_heads: 8\n"
                    "ffn: 28672\nvocab: 32000\n")
    return spec, cluster


@pytest.fixture(autouse=True)
def _one_multiprocess_test_at_a_time(request, tmp_path_factory):
    """Tests marked `multiprocess` (tests/ports.py) hold an exclusive lock shared by every xdist worker."""
    if request.node.get_closest_marker("multiprocess") is None:
        yield
        return
    import fcntl

    # every worker's basetemp (…/popen-gwN) sits in the session's shared folder
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if root.name.startswith("popen-gw") else root
    with open(shared / "multiprocess.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
