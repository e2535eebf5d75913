"""Shared plumbing of the per-term scripts in tests/bench/terms: read a term's published measurements
(tests/data/terms/TERM.csv, every row with its source and the quoted figure), print a table of measured
against modelled, and summarise the error.

The scripts compare TIMES: `ratio` is the cost model's seconds over the measured seconds for exactly the
measured configuration (above 1: the model is slower than the hardware, i.e. it under-predicts throughput).
A measurement published as a rate (TFLOP/s, GB/s) is turned into seconds with the source's own convention,
which each script states.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "terms"
QUICK_ROWS = 3  # --quick: the first rows of each table (tests/test_terms.py)
SOURCE_COLUMNS = ("source", "notes")


def load_rows(term: str, data: Path = DATA) -> list[dict[str, str]]:
    """The rows of DATA/TERM.csv (tests/data/terms); ValueError naming the file, row and column when a row
    lacks its source or its quoted figure.  Lines starting with '#' are comments."""
    path = data / f"{term}.csv"
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(row for row in handle if not row.startswith("#")))
    for number, row in enumerate(rows, start=1):
        for column in SOURCE_COLUMNS:
            if not (row.get(column) or "").strip():
                raise ValueError(f"{path.name}: data row {number}: column {column!r} is empty")
    return rows


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The options every terms script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=f"only the first {QUICK_ROWS} rows (a smoke test)")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Compared:
    """One configuration: what was measured, what the model says, and where the measurement comes from."""

    config: str  # the configuration, as printed
    measured: str  # the measured figure, in the source's unit
    modelled: str  # the model's figure for the same configuration, same unit
    ratio: float  # model seconds / measured seconds
    source: str  # short source label (the CSV's source_id)


def print_table(title: str, rows: list[Compared], out: TextIO | None = None) -> None:
    """The rows as a fixed-width table, then the summary line (on `out`, default the current sys.stdout)."""
    out = out or sys.stdout
    headers = ("configuration", "measured", "model", "model/measured", "source")
    cells = [(r.config, r.measured, r.modelled, f"{r.ratio:.2f}", r.source) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(title, file=out)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for cell in cells:
        print("  ".join(c.ljust(w) for c, w in zip(cell, widths)), file=out)
    print(summary(rows), file=out)


def summary(rows: list[Compared]) -> str:
    """`summary: N rows, median |error| X%, worst Y% (configuration)`, the error being model/measured - 1 in
    time."""
    if not rows:
        return "summary: no rows"
    errors = [abs(r.ratio - 1.0) for r in rows]
    worst = max(rows, key=lambda r: abs(r.ratio - 1.0))
    return (f"summary: {len(rows)} rows, median |error| {100 * statistics.median(errors):.0f}%, "
            f"worst {100 * (worst.ratio - 1.0):+.0f}% ({worst.config})")


def group_summaries(rows: list[Compared], key, out: TextIO | None = None) -> None:
    """One summary line per group of rows (`key(row)` names the group), in first-seen order."""
    out = out or sys.stdout
    groups: dict[str, list[Compared]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    for name, members in groups.items():
        ratios = [r.ratio for r in members]
        print(f"  {name}: {len(members)} rows, model/measured median {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})", file=out)


def run_table(term: str, doc: str, argv: list[str] | None, compare: Callable[[dict[str, str]], Compared],
              title: str, by: str | None = None, key: Callable[[Compared], str] | None = None,
              implied: Callable[[list[dict[str, str]]], None] | None = None) -> list[Compared]:
    """What a term script's main does: read the term's rows (the first QUICK_ROWS with --quick; `doc`'s first line
    describes the options), compare each, print the table and, with `by` and `key`, one summary per group.  A script
    run as `python SCRIPT --implied` (argv None) with an `implied` printer prints what its rows imply instead."""
    if implied is not None and argv is None and "--implied" in sys.argv:
        implied(load_rows(term))
        return []
    args = parse_args(doc.splitlines()[0], argv)
    rows = load_rows(term)
    if args.quick:
        rows = rows[:QUICK_ROWS]
    compared = [compare(row) for row in rows]
    print_table(title, compared)
    if by is not None and key is not None:
        print(f"by {by} (model/measured in time):")
        group_summaries(compared, key=key)
    return compared
