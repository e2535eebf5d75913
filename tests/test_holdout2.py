"""The second frozen holdout (tests/data/holdout2_runs.csv, docs/benchmarks.md "Second holdout").

The first holdout was scored once (docs/benchmarks.md "First evaluation") and has been read since, so it is
in-sample for every later change.  The second one was frozen before the next modelling change from documents
that neither tests/data/published_runs.csv nor tests/data/holdout_runs.csv cites.  These tests hold the file
to that: it reads as the published runs do, every row builds into a job and a strategy, no row comes from a
document either other file cites, and the file is byte for byte the one whose SHA-256 the docs record.
Nothing here evaluates a row.
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
HOLDOUT2 = ROOT / "tests" / "data" / "holdout2_runs.csv"
HOLDOUT1 = ROOT / "tests" / "data" / "holdout_runs.csv"
PUBLISHED = ROOT / "tests" / "data" / "published_runs.csv"
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def bench():
    return load_bench("published_runs")


@pytest.fixture(scope="module")
def holdout2(bench):
    return bench.read_rows("all", HOLDOUT2)


@pytest.fixture(scope="module")
def earlier(bench):
    """Every row the project had before the second freeze: the published runs and the first holdout."""
    return bench.read_rows("all", PUBLISHED) + bench.read_rows("all", HOLDOUT1)


def _section() -> str:
    """docs/benchmarks.md's "Second holdout" subsection, up to the next heading of its level or above."""
    text = BENCHMARKS_DOC.read_text()
    assert "### Second holdout" in text, "docs/benchmarks.md has no 'Second holdout' subsection"
    return re.split(r"\n##?#? ", text.split("### Second holdout", 1)[1], maxsplit=1)[0]


def test_holdout2_has_the_published_runs_columns():
    with HOLDOUT2.open(newline="") as handle, PUBLISHED.open(newline="") as reference:
        assert next(csv.reader(handle)) == next(csv.reader(reference))


def test_holdout2_ids_are_new_and_unique(holdout2, earlier):
    ids = [int(row["id"]) for row in holdout2]
    assert len(ids) == len(set(ids))
    assert min(ids) >= 2001  # the first holdout ends below 2000
    assert not set(ids) & {int(row["id"]) for row in earlier}


def test_every_holdout2_row_publishes_a_throughput_a_runtime_and_its_source(holdout2):
    for row in holdout2:
        assert float(row["tokens_per_s_per_gpu"]) > 0, row["id"]
        assert load_runtime(row["runtime"]).name == row["runtime"], row["id"]
        assert row["source"].strip() and row["notes"].strip(), row["id"]


def test_every_holdout2_row_builds(bench, holdout2):
    assert bench.check_rows(holdout2) == []


def test_check_reports_only_which_rows_build(bench, holdout2):
    """--check prints one line: the count of rows that build, no prediction, error or memory verdict."""
    out = io.StringIO()
    assert bench.print_check(holdout2, HOLDOUT2, out=out) == 0
    assert out.getvalue() == f"{HOLDOUT2}: {len(holdout2)} of {len(holdout2)} rows build\n"


def test_no_holdout2_row_comes_from_a_document_the_earlier_files_cite(bench, holdout2, earlier):
    for row in holdout2:
        document = bench.source_document(row)
        overlapping = [p["id"] for p in earlier if bench.cites(document, p["source"])]
        assert overlapping == [], f"holdout-2 row {row['id']} ({document}) is cited by rows {overlapping}"


def test_holdout2_is_the_frozen_file(bench, holdout2):
    """The SHA-256, row count and document count written under "Second holdout" are the file's: a row changed,
    added or removed after the freeze fails here (a correction is a new, dated re-freeze in that section)."""
    section = _section()
    recorded = re.search(r"SHA-256 `([0-9a-f]{64})`", section)
    assert recorded is not None, "docs/benchmarks.md 'Second holdout' records no SHA-256"
    assert hashlib.sha256(HOLDOUT2.read_bytes()).hexdigest() == recorded.group(1)
    counts = re.search(r"(\d+) rows from (\d+) documents", section)
    assert counts is not None and int(counts.group(1)) == len(holdout2)
    assert int(counts.group(2)) == len({bench.source_document(row) for row in holdout2})


def test_the_documents_table_lists_every_document_once(bench, holdout2):
    """Each document of the file has one line of the section's table, with its ids and its row count."""
    section = _section()
    for document in {bench.source_document(row) for row in holdout2}:
        ids = sorted(int(row["id"]) for row in holdout2 if bench.source_document(row) == document)
        lines = [line for line in section.splitlines() if line.startswith("|") and all(p in line for p in document)]
        assert len(lines) == 1, (document, lines)
        span = f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else f"{ids[0]}"
        assert f"| {span} | {len(ids)} |" in lines[0], (document, lines[0])
