"""`planner estimate MODEL CLUSTER --sharding FILE`: a sharding plan file is checked against the model
and the cluster before it is scored.  A compiled file scores as it is; each rule, broken on its own,
exits 2 with one stderr line naming the file, the table and the field, and no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cli import cli
from planner.embedding.compile import TableChoice
from planner.embedding.options import ShardingType
from planner.embedding.sharding_plan import sharding_plan
from planner.embedding.sites import JobSites

CLUSTER = "cpu:2"  # 2 nodes of 4 ranks: table_row_wise has a node boundary to cross
JOB = ("tiny-dlrm", CLUSTER, "-b", "64", "-s", "1")


def estimate(path: Path, *extra: str):
    return CliRunner().invoke(cli, ["estimate", *JOB, "--sharding", str(path), *extra])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """The folder `planner compile` writes for tiny-dlrm on 2 nodes."""
    out = tmp_path_factory.mktemp("sharding") / "dlrm"
    result = CliRunner().invoke(cli, ["compile", *JOB, "-o", str(out), "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    return out


def _every_type() -> dict:
    """A consistent sharding of tiny-dlrm on cpu:2 that uses every sharding type and every compute kernel."""
    sites = JobSites(load_cluster(CLUSTER), load_catalog())
    tables = [layer.table for layer in load_model("tiny-dlrm").layers if layer.table is not None]
    kinds = [(ShardingType.ROW_WISE, 1, range(8)), (ShardingType.COLUMN_WISE, 2, (1, 6)),
             (ShardingType.TABLE_ROW_WISE, 1, (4, 5, 6, 7)), (ShardingType.DATA_PARALLEL, 1, range(8)),
             (ShardingType.TABLE_WISE, 1, (2,)), (ShardingType.TABLE_WISE, 1, (3,)),
             (ShardingType.COLUMN_WISE, 4, (0, 2, 5, 7)), (ShardingType.TABLE_WISE, 1, (0,))]
    caches = {5: 0.2, 6: 0.0}  # t_cat_5 in host DRAM with an HBM cache (fused_uvm_caching), t_cat_6 without (fused_uvm)
    choices = [TableChoice(table=t, name=f"table.{t}", sharding_type=k, column_shards=c,
                           cache_fraction=caches.get(t, 1.0), ranks=list(r)) for t, (k, c, r) in enumerate(kinds)]
    document = sharding_plan(SimpleNamespace(tables=choices), "tiny-dlrm", tables, sites)
    return json.loads(document.model_dump_json(by_alias=True))


def _assert_refused(result, path: Path, *expected: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: {path}: "), lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in result.output and "validation error for" not in result.output
    return lines[0]


def test_compiled_files_still_score(compiled):
    plan = json.loads((compiled / "plan.json").read_text())
    for name in ("sharding_plan.json", "plan.json"):
        result = estimate(compiled / name, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["step_time_s"] == plan["estimate"]["step_time_s"]


def test_every_sharding_type_scores_when_consistent(tmp_path):
    path = tmp_path / "sharding_plan.json"
    path.write_text(json.dumps(_every_type()))
    result = estimate(path, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["fits"] and data["peak_host_bytes"] > 0  # t_cat_5's cache keeps its rows in host DRAM


def _table(doc: dict, name: str) -> dict:
    return doc["tables"][name]


def _set(name: str, **fields):
    def apply(doc: dict) -> None:
        _table(doc, name).update(fields)
    return apply


# (id, mutation of the compiled file, text the one error line holds)
COMPILED_MUTATIONS = [
    ("rank_out_of_range", _set("t_cat_3", ranks=[9]), "tables[3] (t_cat_3) ranks: rank 9 out of range 0-7"),
    ("negative_rank", _set("t_cat_3", ranks=[-1]), "tables[3] (t_cat_3) ranks: rank -1 out of range 0-7"),
    ("empty_ranks", _set("t_cat_2", ranks=[]), "tables[2] (t_cat_2) ranks: empty"),
    ("two_ranks_table_wise", _set("t_cat_4", ranks=[1, 2]), "tables[4] (t_cat_4) ranks: table_wise puts the whole "
                                                            "table on one rank"),
    ("row_wise_on_one_rank", _set("t_cat_0", sharding_type="row_wise", ranks=[0]),
     "tables[0] (t_cat_0) ranks: row_wise spans every rank once (0-7)"),
    ("table_row_wise_across_nodes", _set("t_cat_0", sharding_type="table_row_wise", ranks=[2, 3, 4, 5]),
     "tables[0] (t_cat_0) ranks: table_row_wise spans the GPUs of one node once"),
    ("column_wise_not_dividing_dim", _set("t_cat_1", sharding_type="column_wise", ranks=[0, 1, 2]),
     "tables[1] (t_cat_1) ranks: column_wise with 3 shards does not divide dim 16"),
    ("cache_above_one", _set("t_cat_6", cache_params={"load_factor": 1.5}, compute_kernel="fused_uvm_caching"),
     "tables[6] (t_cat_6) cache_params.load_factor: 1.5 is not a fraction between 0 and 1"),
    ("cache_below_zero", _set("t_cat_6", cache_params={"load_factor": -0.2}, compute_kernel="fused_uvm_caching"),
     "tables[6] (t_cat_6) cache_params.load_factor: -0.2 is not a fraction"),
    ("cache_of_everything", _set("t_cat_6", cache_params={"load_factor": 1.0}, compute_kernel="fused_uvm_caching"),
     "tables[6] (t_cat_6) cache_params.load_factor: 1.0 is not a fraction between 0 and 1 (no cache: fused_uvm; "
     "all in HBM: fused)"),
    ("kernel_contradicts_cache", _set("t_cat_6", cache_params={"load_factor": 0.2}),
     "tables[6] (t_cat_6) compute_kernel: fused keeps no HBM cache, but cache_params are given"),
    ("dense_kernel_on_a_shard", _set("t_cat_6", compute_kernel="dense"),
     "tables[6] (t_cat_6) compute_kernel: dense is for data_parallel tables; table_wise takes fused"),
    ("cache_without_load_factor", _set("t_cat_6", cache_params={}, compute_kernel="fused_uvm_caching"),
     "tables[6] (t_cat_6) cache_params.load_factor: Field required"),
    ("old_cache_field", _set("t_cat_6", cache_load_factor=0.2), "tables[6] (t_cat_6) cache_load_factor: unknown key"),
    ("unknown_kernel", _set("t_cat_6", compute_kernel="magic"), "tables[6] (t_cat_6) compute_kernel: 'magic'; known"),
    ("rows_contradict_model", _set("t_cat_0", rows=7), "tables[0] (t_cat_0) rows: 7 in the file, but the model's "
                                                       "table has 1000"),
    ("dim_contradicts_model", _set("t_cat_0", dim=32), "tables[0] (t_cat_0) dim: 32 in the file, but the model's "
                                                       "table has 16"),
    ("shards_contradict_ranks", lambda d: _table(d, "t_cat_3").update(ranks=[_table(d, "t_cat_3")["ranks"][0] ^ 1]),
     "tables[3] (t_cat_3) sharding_spec[0].placement"),
    ("hit_rate_above_one", _set("t_cat_0", expected_hit_rate=3.0), "tables[0] (t_cat_0) expected_hit_rate: 3.0"),
    ("world_size", lambda d: d.update(world_size=4), "world_size: 4 in the file, but the cluster has 8 ranks"),
    ("local_world_size", lambda d: d.update(local_world_size=8), "local_world_size: 8 in the file"),
    ("model_name", lambda d: d.update(model="dlrm-criteo-kaggle"), "model: 'dlrm-criteo-kaggle' in the file"),
    ("missing_table", lambda d: d["tables"].pop("t_cat_5"), "tables: missing t_cat_5"),
    ("unknown_table", lambda d: d["tables"].update(extra=d["tables"]["t_cat_0"]), "tables: not tables of the "
                                                                                   "model: 'extra'"),
    ("schema", lambda d: d.update(schema="planner.plan/1"), "schema: 'planner.plan/1', expected"),
    # pydantic's own errors keep the field (no bare "1 validation error for ShardingPlanFile")
    ("rank_not_an_int", _set("t_cat_3", ranks=["x"]), "tables[3] (t_cat_3) ranks[0]: Input should be a valid integer"),
    ("unknown_key", _set("t_cat_3", bogus=1), "tables[3] (t_cat_3) bogus: unknown key"),
    ("unknown_type", _set("t_cat_3", sharding_type="diagonal"), "tables[3] (t_cat_3) sharding_type: Input should be"),
    ("missing_field", lambda d: _table(d, "t_cat_3").pop("ranks"), "tables[3] (t_cat_3) ranks: Field required"),
    ("world_size_text", lambda d: d.update(world_size="eight"), "world_size: Input should be a valid integer"),
]


@pytest.mark.parametrize("mutate, expected", [pytest.param(m, e, id=i) for i, m, e in COMPILED_MUTATIONS])
def test_broken_rule_in_a_compiled_file_exits_2_naming_the_field(compiled, tmp_path, mutate, expected):
    document = json.loads((compiled / "sharding_plan.json").read_text())
    assert all(e["sharding_type"] == "table_wise" for e in document["tables"].values())  # what the edits assume
    mutate(document)
    path = tmp_path / "sharding_plan.json"
    path.write_text(json.dumps(document))
    _assert_refused(estimate(path), path, expected)


# rules that need a table of another type than the compiler chose: broken in the every-type file
EVERY_TYPE_MUTATIONS = [
    ("data_parallel_with_cache", _set("t_cat_3", cache_params={"load_factor": 0.2}, compute_kernel="dense"),
     "tables[3] (t_cat_3) cache_params: data_parallel replicas are whole tables in HBM"),
    ("data_parallel_fused", _set("t_cat_3", compute_kernel="fused"),
     "tables[3] (t_cat_3) compute_kernel: fused: data_parallel replicas take dense"),
    ("data_parallel_on_some_ranks", _set("t_cat_3", ranks=[0, 1]), "tables[3] (t_cat_3) ranks: data_parallel spans "
                                                                    "every rank once"),
    ("row_wise_rank_twice", _set("t_cat_0", ranks=[0, 1, 2, 3, 4, 5, 6, 6]), "tables[0] (t_cat_0) ranks: row_wise "
                                                                            "spans every rank once"),
    ("table_row_wise_part_of_a_node", _set("t_cat_2", ranks=[4, 5]), "tables[2] (t_cat_2) ranks: table_row_wise "
                                                                      "spans the GPUs of one node once (node 1"),
    ("row_blocks_uneven", lambda d: _table(d, "t_cat_0")["sharding_spec"][0]["shard_sizes"].__setitem__(0, 1),
     "tables[0] (t_cat_0) sharding_spec[0].shard_sizes: [1, 16], expected [125, 16]"),
    ("data_parallel_with_shards", lambda d: _table(d, "t_cat_3").update(
        sharding_spec=_table(d, "t_cat_4")["sharding_spec"]), "tables[3] (t_cat_3) sharding_spec: data_parallel"),
    ("uvm_kernel_without_cache", _set("t_cat_5", cache_params=None), "tables[5] (t_cat_5) compute_kernel: "
                                                                      "fused_uvm_caching needs cache_params"),
    ("host_table_with_cache", _set("t_cat_4", compute_kernel="fused_uvm", cache_params={"load_factor": 0.2}),
     "tables[4] (t_cat_4) compute_kernel: fused_uvm keeps no HBM cache, but cache_params are given"),
]


@pytest.mark.parametrize("mutate, expected", [pytest.param(m, e, id=i) for i, m, e in EVERY_TYPE_MUTATIONS])
def test_broken_rule_of_other_types_exits_2_naming_the_field(tmp_path, mutate, expected):
    document = _every_type()
    mutate(document)
    path = tmp_path / "sharding_plan.json"
    path.write_text(json.dumps(document))
    _assert_refused(estimate(path), path, expected)


def test_plan_json_fields_are_named_under_sharding(compiled, tmp_path):
    document = json.loads((compiled / "plan.json").read_text())
    _table(document["sharding"], "t_cat_3")["ranks"] = [9]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    _assert_refused(estimate(path), path, "sharding.tables[3] (t_cat_3) ranks: rank 9 out of range 0-7")


def test_several_problems_name_the_first_and_count_the_rest(compiled, tmp_path):
    document = json.loads((compiled / "sharding_plan.json").read_text())
    for name in ("t_cat_1", "t_cat_4", "t_cat_6"):
        _table(document, name)["ranks"] = [12]
    path = tmp_path / "sharding_plan.json"
    path.write_text(json.dumps(document))
    line = _assert_refused(estimate(path), path, "tables[1] (t_cat_1) ranks: rank 12 out of range 0-7")
    assert line.endswith("(and 2 more problems)")


@pytest.mark.parametrize("content, expected", [
    (b"{", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    (b"[1, 2]", "not a sharding plan (expected a JSON object, got list)"),
    (b"\xff\xfe\x00", "not UTF-8 text"),
    (b'{"schema": "planner.embedding-plan/1"}', "sharding: expected the sharding plan object"),
    (b"{}", "model: Field required (and 3 more problems)"),
])
def test_unreadable_files_exit_2(tmp_path, content, expected):
    path = tmp_path / "sharding_plan.json"
    path.write_bytes(content)
    _assert_refused(estimate(path), path, expected)


def test_huge_values_are_cut_short(compiled, tmp_path):
    document = json.loads((compiled / "sharding_plan.json").read_text())
    document["world_size"] = 10 ** 300
    path = tmp_path / "sharding_plan.json"
    path.write_text(json.dumps(document))
    line = _assert_refused(estimate(path), path, "world_size: 100000000000000000000...")
    assert len(line) < 200 + len(str(path))


def test_strategy_and_sharding_file_together_exit_2(compiled):
    path = compiled / "sharding_plan.json"
    result = estimate(path, "--strategy", "sharding=row_wise")
    assert result.exit_code == 2 and "give one" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
