"""A pytest plugin that writes each test's CPU seconds to $CPU_LOG: where the suite's time goes.

    CPU_LOG=cpu.tsv PYTHONPATH=tests/bench python -m pytest -p cpu_plugin

One line per test: CPU seconds of the test's own process, CPU seconds of the child processes it waited for
(CLI runs, torchrun and its ranks), wall seconds, and the test's id, tab-separated.  The suite's wall time on
2 cores is about half its CPU seconds (docs/benchmarks.md "Test suite"), so this is the figure to cut.
"""

from __future__ import annotations

import os
import resource
import time

import pytest


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own, children), start = _cpu(), time.perf_counter()
    yield
    own_after, children_after = _cpu()
    with open(os.environ["CPU_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{own_after - own:.2f}\t{children_after - children:.2f}\t{time.perf_counter() - start:.2f}\t"
                  f"{item.nodeid}\n")
