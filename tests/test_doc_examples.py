"""The command examples of README.md and docs/*.md print what their text shows (tests/doc_examples.py).

The quick examples run here on every test run; the slow ones (SLOW) run with the rest under
`python tests/bench/doc_examples.py`, whose `--write` rewrites stale figures from a fresh run.
"""

from __future__ import annotations

import pytest

from doc_examples import NOT_RUN, ROOT, SLOW, Example, compare, examples, inside, run_step

EXAMPLES = examples()
QUICK = [e for e in EXAMPLES if e.first not in SLOW and e.first not in NOT_RUN]


def test_every_example_is_run_here_or_by_the_bench():
    firsts = {e.first for e in EXAMPLES}
    assert set(SLOW) <= firsts, set(SLOW) - firsts  # no entry for an example the docs dropped
    assert set(NOT_RUN) <= firsts, set(NOT_RUN) - firsts
    files = {str(e.path.relative_to(ROOT)) for e in QUICK}
    assert {"README.md", "docs/cli.md", "docs/embedding.md"} <= files
    # README's worked example (estimate, then compile) and its two one-line errors are among them
    assert sum(len(e.steps) for e in QUICK if e.path.name == "README.md") == 6


def _stale(example: Example) -> list[str]:
    stale = [m for step in example.steps for m in compare(step.expected, run_step(step.command))]
    return [f"{example.path.name}:{m.line}: {m.expected}\n    fresh: {m.fresh or '(no such line)'}" for m in stale]


@pytest.mark.parametrize("example", QUICK, ids=lambda e: e.name)
def test_example_prints_what_the_docs_show(example, tmp_path):
    with inside(tmp_path):
        stale = _stale(example)
    assert not stale, "\n".join(stale) + "\n(python tests/bench/doc_examples.py --write rewrites the figures)"


# ---------------------------------------------------------------- the matcher itself

OUTPUT = ["planner v1", "", "throughput   58,273 tokens/s (7,284 per GPU, 8 GPUs)",
          "solver       OPTIMAL: objective 1.12465 s", "             492 configurations, in 0.45 s",
          "wrote out/x: plan.json, torch/ (search 0.45 s)", "exit 1"]


def test_an_excerpt_matches_in_order_with_elisions_and_any_wall_clock_time():
    expected = [(1, "throughput   58,273 tokens/s (7,284 per GPU, ...)"), (2, "..."),
                (3, "             492 configurations, in 9.99 s"), (4, "wrote out/x: ... (search 0.04 s)"),
                (5, "exit 1")]
    assert compare(expected, OUTPUT) == []


def test_a_changed_figure_is_stale_and_its_fresh_line_found():
    [stale] = compare([(7, "solver       OPTIMAL: objective 1.03955 s")], OUTPUT)
    assert (stale.line, stale.fresh) == (7, "solver       OPTIMAL: objective 1.12465 s")
    [stale] = compare([(8, "throughput   63,042 tokens/s (7,880 per GPU, ...)")], OUTPUT)
    assert stale.fresh == "throughput   58,273 tokens/s (7,284 per GPU, ...)"  # the elision kept


def test_a_changed_word_order_or_exit_code_is_stale():
    assert compare([(1, "solver       FEASIBLE: objective 1.12465 s")], OUTPUT)[0].fresh is None
    out_of_order = [(1, "solver       OPTIMAL: objective 1.12465 s"), (2, "throughput   58,273 tokens/s ...")]
    assert [m.line for m in compare(out_of_order, OUTPUT)] == [2]
    assert [m.line for m in compare([(3, "exit 2")], OUTPUT)] == [3]
    assert [m.line for m in compare([(4, "exit 1")], OUTPUT[:-1])] == [4]  # it exited 0
