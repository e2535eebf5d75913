"""Run every command example of README.md and docs/*.md and check the output its text shows (tests/doc_examples.py).

    python tests/bench/doc_examples.py                 # all of them (about 2 minutes on 2 cores)
    python tests/bench/doc_examples.py --only compare  # the examples whose first command contains TEXT
    python tests/bench/doc_examples.py --write         # also rewrite each stale line from the fresh output

One line per example: ok or the number of stale lines, wall seconds, where it is and its first command; then
each stale line with the fresh line it stands for.  `--write` replaces a stale line by its fresh line (each
`...` kept where it was); a line whose fresh counterpart it cannot find (a word changed, not only a figure)
is listed as `by hand`.  The examples in NOT_RUN are listed as skipped; tests/test_doc_examples.py runs all
but SLOW and NOT_RUN on every test run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

from doc_examples import NOT_RUN, Example, Mismatch, compare, examples, inside, run_step  # noqa: E402


def check(example: Example) -> list[Mismatch]:
    """Run the example's steps in one fresh folder; the stale lines of its excerpts."""
    stale = []
    with tempfile.TemporaryDirectory(prefix="planner-doc-") as folder, inside(Path(folder)):
        for step in example.steps:
            stale += compare(step.expected, run_step(step.command))
    return stale


def write(path: Path, stale: list[Mismatch]) -> int:
    """Replace each stale line that has a fresh counterpart; how many were replaced."""
    lines = path.read_text(encoding="utf-8").split("\n")
    done = 0
    for m in stale:
        if m.fresh is not None and lines[m.line - 1].rstrip() == m.expected:
            lines[m.line - 1] = m.fresh
            done += 1
    path.write_text("\n".join(lines), encoding="utf-8")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the examples whose first command contains TEXT")
    parser.add_argument("--write", action="store_true", help="rewrite the stale lines from the fresh output")
    args = parser.parse_args()
    failed = 0
    for example in examples():
        if args.only not in example.first:
            continue
        if example.first in NOT_RUN:
            print(f"skip         {example.name}  {example.first}  ({NOT_RUN[example.first]})")
            continue
        start = time.perf_counter()
        stale = check(example)
        status = "ok" if not stale else f"{len(stale)} stale"
        print(f"{status:<8} {time.perf_counter() - start:5.1f}s {example.name}  {example.first}", flush=True)
        for m in stale:
            print(f"    {m.line}: {m.expected}\n    {'fresh' if m.fresh else 'by hand'}: {m.fresh or ''}")
        if stale and args.write:
            replaced = write(example.path, stale)
            print(f"    rewrote {replaced} of {len(stale)} lines")
        failed += bool(stale)
    print(f"\nexamples with stale lines: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
