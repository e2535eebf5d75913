"""Fixtures and the job factory shared by several test modules (`from conftest import make_job`)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hardware import Cluster, load_cluster
from models import load_model
from models.graph import ModelGraph
from planner.job import Job
from ports import one_launch_at_a_time
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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before a multiprocess test's fixtures (a module's may launch): the warm launches' interpreter, started once
    and kept from one launch to the next (tests/warm_torchrun.py)."""
    if item.get_closest_marker("multiprocess") is not None:
        from warm_torchrun import start_server

        start_server()


@pytest.fixture(autouse=True)
def _one_multiprocess_test_at_a_time(request, tmp_path_factory):
    """Tests marked `multiprocess` (tests/ports.py) hold an exclusive lock shared by every xdist worker."""
    if request.node.get_closest_marker("multiprocess") is None:
        yield
        return
    with one_launch_at_a_time(tmp_path_factory):
        yield


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """The byte-level training set of the runtime's end-to-end tests (tests/tokens.py), written once."""
    from tokens import write_tokens

    return write_tokens(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def pipeline_run(dataset, tmp_path_factory):
    """One torchrun launch that the runtime's, the trainer's and the re-plan's tests all read
    (tests/trainer_runs.py PipelineRun): its losses, parameter bytes and checkpoints."""
    from trainer_runs import pipeline_run as run

    root = tmp_path_factory.mktemp("pipeline-run")
    with one_launch_at_a_time(tmp_path_factory):
        return run(root, dataset)


# ---------------------------------------------------------------- --dist loadgroup under pytest 9
#
# pytest-xdist 3.8 tells its controller a test's xdist_group by renaming the item (`item._nodeid`), which
# pytest 9 no longer reads, so every test became its own group and the multiprocess tests were spread
# over the workers, one waiting for another's lock.  Here each worker writes its tests' groups to a file
# before it reports its collection, and the controller's scheduler reads them: each group is one unit of
# work for one worker (the multiprocess tests, run one after another while the other workers run the rest).
#
# Tests without a mark that share a module-scoped fixture (a compiled plan, written launch files) form one
# unit too, so that the fixture is built once, not once on every worker that draws one of its tests.

GROUPS_KEY = "planner_xdist_groups"
LAUNCHES = "group:multiprocess"  # the unit of the tests ports.MULTIPROCESS marks
_GROUPS_FOLDER = pytest.StashKey[Path]()


def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist"):
        config.stash[_GROUPS_FOLDER] = Path(tempfile.mkdtemp(prefix="planner-xdist-groups-"))


def pytest_unconfigure(config):
    folder = config.stash.get(_GROUPS_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The controller tells each worker where to write its groups."""
    node.workerinput[GROUPS_KEY] = str(node.config.stash[_GROUPS_FOLDER])


def _module_fixtures(item) -> list[str]:
    """'module path::fixture' of each module-scoped fixture the test uses, directly or through another."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [f"{item.path}::{name}" for name in info.names_closure
            if (defs := info.name2fixturedefs.get(name)) and defs[-1].scope == "module"]


def _shared_fixture_units(items) -> dict[str, str]:
    """nodeid -> unit of each test that shares a module-scoped fixture with another: the tests joined, directly
    or through a chain, by the fixtures they use (a union-find over tests and fixtures)."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    used = {item.nodeid: _module_fixtures(item) for item in items}
    for nodeid, fixtures in used.items():
        for fixture in fixtures:
            parent[root(nodeid)] = root(fixture)
    size: dict[str, int] = {}
    for nodeid, fixtures in used.items():
        if fixtures:
            size[root(nodeid)] = size.get(root(nodeid), 0) + 1
    return {nodeid: f"shared:{root(nodeid)}" for nodeid, fixtures in used.items()
            if fixtures and size[root(nodeid)] > 1}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    folder = getattr(config, "workerinput", {}).get(GROUPS_KEY)
    if folder is None:
        return
    groups = _shared_fixture_units(items)
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names:  # a mark names the unit, whatever fixtures the test shares
            groups[item.nodeid] = "_".join(names)
    path = Path(folder) / f"{config.workerinput['workerid']}.json"
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(groups))
    os.replace(partial, path)  # whole, before this worker reports its collection


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    folder = config.stash[_GROUPS_FOLDER]

    class MarkedGroups(LoadGroupScheduling):
        """loadgroup's scheduling with the groups the workers wrote (every worker has reported its
        collection, so has written its file, before the first call)."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for path in sorted(folder.glob("*.json")):
                    self.groups.update(json.loads(path.read_text()))
            group = self.groups.get(nodeid)
            return f"group:{group}" if group is not None else nodeid

        def schedule(self) -> None:
            """The first distribution as xdist's (LoadScopeScheduling.schedule), with the launches' unit first:
            the longest (one launch after another), it must not wait behind units with more tests, which
            xdist's order by test count puts first."""
            if self.collection is not None or not self._check_nodes_have_same_collection():
                return super().schedule()
            self.collection = list(next(iter(self.registered_collections.values())))
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            for scope in sorted(units, key=lambda scope: (scope != LAUNCHES, -len(units[scope]))):
                self.workqueue[scope] = units[scope]
            for _ in range(max(0, len(self.nodes) - len(self.workqueue))):  # more workers than work
                unused, _ = self.assigned_work.popitem()
                unused.shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:  # at least two units each, when there are (xdist #277)
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()
            return None

    return MarkedGroups(config, log)
