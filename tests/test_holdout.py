"""The frozen holdouts (tests/data/holdout_runs.csv, holdout2_runs.csv, holdout3_runs.csv, holdout4_runs.csv,
holdout5_runs.csv, holdout6_runs.csv, holdout7_runs.csv, holdout8_runs.csv and holdout9_runs.csv; docs/benchmarks.md
"Frozen holdout", "Second holdout", "Third holdout", "Fourth holdout", "Fifth holdout", "Sixth holdout", "Seventh
holdout", "Eighth holdout" and "Ninth holdout").

Published training runs from documents that no earlier file cites, each frozen before it is scored and scored once
(the first eight have been scored and are in-sample since; the third was frozen to score the model as it stood,
the fourth to the ninth before the modelling changes they are scored after; the ninth has not been scored yet). These
tests hold each file to that: it reads as the published runs do, every row builds into a job and a strategy, no row
comes from a document an earlier file cites, its ids follow the earlier files', its documents table lists every
document once, and the file is byte for byte the one whose SHA-256 the docs record. Nothing here evaluates a row.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from benches import load_bench

from planner.profile import load_runtime

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
PUBLISHED = DATA / "published_runs.csv"
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Frozen:
    """One frozen holdout file and what it was frozen against."""

    path: Path
    first_id: int  # ids below belong to the files frozen before it
    earlier: tuple[Path, ...]  # files whose documents it may not cite
    heading: str  # the docs/benchmarks.md heading that records its hash and documents


HOLDOUT = Frozen(DATA / "holdout_runs.csv", 1001, (PUBLISHED,), "## Frozen holdout")
HOLDOUT2 = Frozen(DATA / "holdout2_runs.csv", 2001, (PUBLISHED, HOLDOUT.path), "### Second holdout")
HOLDOUT3 = Frozen(DATA / "holdout3_runs.csv", 3001, (PUBLISHED, HOLDOUT.path, HOLDOUT2.path), "### Third holdout")
HOLDOUT4 = Frozen(DATA / "holdout4_runs.csv", 4001, (PUBLISHED, HOLDOUT.path, HOLDOUT2.path, HOLDOUT3.path),
                  "### Fourth holdout")
HOLDOUT5 = Frozen(DATA / "holdout5_runs.csv", 5001,
                  (PUBLISHED, HOLDOUT.path, HOLDOUT2.path, HOLDOUT3.path, HOLDOUT4.path), "### Fifth holdout")
HOLDOUT6 = Frozen(DATA / "holdout6_runs.csv", 6001,
                  (PUBLISHED, HOLDOUT.path, HOLDOUT2.path, HOLDOUT3.path, HOLDOUT4.path, HOLDOUT5.path),
                  "### Sixth holdout")
HOLDOUT7 = Frozen(DATA / "holdout7_runs.csv", 7001,
                  (PUBLISHED, HOLDOUT.path, HOLDOUT2.path, HOLDOUT3.path, HOLDOUT4.path, HOLDOUT5.path, HOLDOUT6.path),
                  "### Seventh holdout")
HOLDOUT8 = Frozen(DATA / "holdout8_runs.csv", 8001,
                  (PUBLISHED, HOLDOUT.path, HOLDOUT2.path, HOLDOUT3.path, HOLDOUT4.path, HOLDOUT5.path, HOLDOUT6.path,
                   HOLDOUT7.path),
                  "### Eighth holdout")
HOLDOUT9 = Frozen(DATA / "holdout9_runs.csv", 9001,
                  (PUBLISHED, HOLDOUT.path, HOLDOUT2.path, HOLDOUT3.path, HOLDOUT4.path, HOLDOUT5.path, HOLDOUT6.path,
                   HOLDOUT7.path, HOLDOUT8.path),
                  "### Ninth holdout")
FROZEN = [pytest.param(HOLDOUT, id="holdout"), pytest.param(HOLDOUT2, id="holdout2"),
          pytest.param(HOLDOUT3, id="holdout3"), pytest.param(HOLDOUT4, id="holdout4"),
          pytest.param(HOLDOUT5, id="holdout5"), pytest.param(HOLDOUT6, id="holdout6"),
          pytest.param(HOLDOUT7, id="holdout7"), pytest.param(HOLDOUT8, id="holdout8"),
          pytest.param(HOLDOUT9, id="holdout9")]


@pytest.fixture(scope="module")
def bench():
    return load_bench("published_runs")


@pytest.fixture(scope="module")
def published(bench):
    return bench.read_rows("all", PUBLISHED)


def _rows(bench, frozen: Frozen) -> list[dict]:
    return bench.read_rows("all", frozen.path)


def _earlier_rows(bench, frozen: Frozen) -> list[dict]:
    return [row for path in frozen.earlier for row in bench.read_rows("all", path)]


def _section(frozen: Frozen) -> str:
    """The text under the file's heading, up to the next heading of any level."""
    parts = re.split(rf"\n{re.escape(frozen.heading)}(?: [^\n]*)?\n", BENCHMARKS_DOC.read_text(), maxsplit=1)
    assert len(parts) == 2, f"docs/benchmarks.md has no {frozen.heading!r} heading"
    return re.split(r"\n#{1,6} ", parts[1], maxsplit=1)[0]


@pytest.mark.parametrize("frozen", FROZEN)
def test_holdout_has_the_published_runs_columns(frozen):
    with frozen.path.open(newline="") as handle, PUBLISHED.open(newline="") as reference:
        assert next(csv.reader(handle)) == next(csv.reader(reference))


@pytest.mark.parametrize("frozen", FROZEN)
def test_holdout_ids_are_new_and_unique(bench, frozen):
    ids = [int(row["id"]) for row in _rows(bench, frozen)]
    assert len(ids) == len(set(ids))
    assert min(ids) >= frozen.first_id
    assert not set(ids) & {int(row["id"]) for row in _earlier_rows(bench, frozen)}


@pytest.mark.parametrize("frozen", FROZEN)
def test_every_holdout_row_publishes_a_throughput_a_runtime_and_its_source(bench, frozen):
    for row in _rows(bench, frozen):
        assert float(row["tokens_per_s_per_gpu"]) > 0, row["id"]
        assert load_runtime(row["runtime"]).name == row["runtime"], row["id"]
        assert row["source"].strip() and row["notes"].strip(), row["id"]


@pytest.mark.parametrize("frozen", FROZEN)
def test_every_holdout_row_builds(bench, frozen):
    assert bench.check_rows(_rows(bench, frozen)) == []


@pytest.mark.parametrize("frozen", FROZEN)
def test_check_reports_only_which_rows_build(bench, frozen):
    """--check prints one line per failing row and a count: no prediction, error or memory verdict."""
    rows, out = _rows(bench, frozen), io.StringIO()
    assert bench.print_check(rows, frozen.path, out=out) == 0
    assert out.getvalue() == f"{frozen.path}: {len(rows)} of {len(rows)} rows build\n"


@pytest.mark.parametrize("frozen", FROZEN)
def test_no_holdout_row_comes_from_a_document_an_earlier_file_cites(bench, frozen):
    earlier = _earlier_rows(bench, frozen)
    for row in _rows(bench, frozen):
        document = bench.source_document(row)
        overlapping = [p["id"] for p in earlier if bench.cites(document, p["source"])]
        assert overlapping == [], f"row {row['id']} ({document}) is cited by earlier rows {overlapping}"


@pytest.mark.parametrize("frozen", FROZEN)
def test_holdout_is_the_frozen_file(bench, frozen):
    """The SHA-256, row count and document count written under the file's heading are the file's: a row
    changed, added or removed after the freeze fails here (a correction is a new, dated re-freeze)."""
    section, rows = _section(frozen), _rows(bench, frozen)
    recorded = re.search(r"SHA-256 `([0-9a-f]{64})`", section)
    assert recorded is not None, f"docs/benchmarks.md {frozen.heading!r} records no SHA-256"
    assert hashlib.sha256(frozen.path.read_bytes()).hexdigest() == recorded.group(1)
    counts = re.search(r"(\d+) rows from (\d+) documents", section)
    assert counts is not None and int(counts.group(1)) == len(rows)
    assert int(counts.group(2)) == len({bench.source_document(row) for row in rows})


# the first holdout's table names one document by its repository alone (MLCommons' results), so only the
# later ones are held to one line per document
@pytest.mark.parametrize("frozen", [pytest.param(HOLDOUT2, id="holdout2"), pytest.param(HOLDOUT3, id="holdout3"),
                                    pytest.param(HOLDOUT4, id="holdout4"), pytest.param(HOLDOUT5, id="holdout5"),
                                    pytest.param(HOLDOUT6, id="holdout6"), pytest.param(HOLDOUT7, id="holdout7"),
                                    pytest.param(HOLDOUT8, id="holdout8"), pytest.param(HOLDOUT9, id="holdout9")])
def test_the_documents_table_lists_every_document_once(bench, frozen):
    """Each document of the file has one line of its section's table, with its ids and its row count."""
    section, rows = _section(frozen), _rows(bench, frozen)
    for document in {bench.source_document(row) for row in rows}:
        ids = sorted(int(row["id"]) for row in rows if bench.source_document(row) == document)
        lines = [line for line in section.splitlines() if line.startswith("|") and all(p in line for p in document)]
        assert len(lines) == 1, (document, lines)
        span = f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else f"{ids[0]}"
        assert f"| {span} | {len(ids)} |" in lines[0], (document, lines[0])


def test_check_names_a_row_that_does_not_build(bench):
    broken = dict(_rows(bench, HOLDOUT)[0], id="9999", runtime="no-such-runtime")
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


