"""The frozen holdout (tests/data/holdout_runs.csv, docs/benchmarks.md "Frozen holdout").

Published training runs from documents tests/data/published_runs.csv never cites, frozen before the next
modelling change and scored only at its end.  These tests hold the file to that: it reads as the published
runs do, every row builds into a job and a strategy, no row comes from a document the published runs cite,
and the file is byte for byte the one whose SHA-256 the docs record.  Nothing here evaluates a row.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from pathlib import Path

import pytest
from benches import load_bench

from planner.profile import load_runtime

ROOT = Path(__file__).resolve().parents[1]
HOLDOUT = ROOT / "tests" / "data" / "holdout_runs.csv"
PUBLISHED = ROOT / "tests" / "data" / "published_runs.csv"
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def bench():
    return load_bench("published_runs")


@pytest.fixture(scope="module")
def holdout(bench):
    return bench.read_rows("all", HOLDOUT)


@pytest.fixture(scope="module")
def published(bench):
    return bench.read_rows("all", PUBLISHED)


def test_holdout_has_the_published_runs_columns():
    with HOLDOUT.open(newline="") as handle, PUBLISHED.open(newline="") as reference:
        assert next(csv.reader(handle)) == next(csv.reader(reference))


def test_holdout_ids_are_new_and_unique(holdout, published):
    ids = [int(row["id"]) for row in holdout]
    assert len(ids) == len(set(ids))
    assert min(ids) >= 1001  # the published runs end below 1000: no id is shared
    assert not set(ids) & {int(row["id"]) for row in published}


def test_every_holdout_row_publishes_a_throughput_a_runtime_and_its_source(holdout):
    for row in holdout:
        assert float(row["tokens_per_s_per_gpu"]) > 0, row["id"]
        assert load_runtime(row["runtime"]).name == row["runtime"], row["id"]
        assert row["source"].strip() and row["notes"].strip(), row["id"]


def test_every_holdout_row_builds(bench, holdout):
    assert bench.check_rows(holdout) == []


def test_check_reports_only_which_rows_build(bench, holdout):
    """--check prints one line per failing row and a count: no prediction, error or memory verdict."""
    out = io.StringIO()
    assert bench.print_check(holdout, HOLDOUT, out=out) == 0
    assert out.getvalue() == f"{HOLDOUT}: {len(holdout)} of {len(holdout)} rows build\n"


def test_check_names_a_row_that_does_not_build(bench, holdout):
    broken = dict(holdout[0], id="9999", runtime="no-such-runtime")
    failures = bench.check_rows([broken])
    assert [row_id for row_id, _ in failures] == ["9999"]


def test_source_document_reads_papers_files_and_pages(bench):
    assert bench.source_document({"source": "arXiv 2201.11990 Sec 2.4"}) == ("2201.11990",)
    assert bench.source_document({"source": "NVIDIA/dgxc-benchmarking llama3.1/README_70b.md"}) == (
        "NVIDIA/dgxc-benchmarking", "llama3.1/README_70b.md")
    assert bench.source_document({"source": "https://example.org/post; table 2"}) == ("https://example.org/post",)
    with pytest.raises(ValueError, match="names no arXiv paper"):
        bench.source_document({"id": "7", "source": "a blog post"})


def test_the_overlap_check_finds_a_document_the_published_runs_cite(bench, published):
    # published_runs.csv row 54 cites "NVIDIA/dgxc-benchmarking llama3.1/README_70b.md" (read off the file);
    # another file of that repository is not cited
    cited = ("NVIDIA/dgxc-benchmarking", "llama3.1/README_70b.md")
    assert [row["id"] for row in published if bench.cites(cited, row["source"])] == ["54"]
    assert not any(bench.cites(("NVIDIA/dgxc-benchmarking", "llama3.1/README_8b.md"), row["source"])
                   for row in published)


def test_no_holdout_row_comes_from_a_document_the_published_runs_cite(bench, holdout, published):
    for row in holdout:
        document = bench.source_document(row)
        overlapping = [p["id"] for p in published if bench.cites(document, p["source"])]
        assert overlapping == [], f"holdout row {row['id']} ({document}) is cited by published rows {overlapping}"


def test_holdout_is_the_frozen_file(holdout):
    """The SHA-256 written under docs/benchmarks.md "Frozen holdout" is the file's: a row changed, added or
    removed after the freeze fails here (re-freezing is a new, dated entry in that section)."""
    section = BENCHMARKS_DOC.read_text().split("## Frozen holdout", 1)[1].split("\n## ", 1)[0]
    recorded = re.search(r"SHA-256 `([0-9a-f]{64})`", section)
    assert recorded is not None, "docs/benchmarks.md 'Frozen holdout' records no SHA-256"
    assert hashlib.sha256(HOLDOUT.read_bytes()).hexdigest() == recorded.group(1)
    counts = re.search(r"(\d+) rows from (\d+) documents", section)
    assert counts is not None and int(counts.group(1)) == len(holdout)
    assert int(counts.group(2)) == len({load_bench("published_runs").source_document(row) for row in holdout})
