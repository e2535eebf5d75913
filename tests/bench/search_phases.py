"""Where a compile's time goes: wall seconds and call counts per phase of the search, for one job.

    python tests/bench/search_phases.py                        # llama3-70b on hetero-3pool, -b 512 -s 4096, 60 s
    python tests/bench/search_phases.py --time-limit 120
    python tests/bench/search_phases.py --incumbent 20.78      # the configurations alone, from a given incumbent
    python tests/bench/search_phases.py --slow 5               # also name each CP-SAT program of 5 s or more

The phases are timed by wrapping the search's own functions (nothing in the library changes): the replica
groups' pool compiles (each printed: pool, batch, cap, value, bound, seconds), the listing and bounding of the
configurations, the memory-aware bounds, the tables built and the CP-SAT solves.  The counts are deterministic
for a run the wall clock did not cut; the seconds are not (a shared machine inflates them).

`--incumbent X` skips the replica groups and walks the configurations with X as the incumbent (as if a warm start
had found it), printing the bound frontier every 250 configurations: how fast the certificate's bound rises.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import load_catalog, load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import CLI_RUNTIME, load_runtime  # noqa: E402
from planner.search import branch, compile as compile_module, config_solve  # noqa: E402
from planner.search.ilp.tables import TableBuilder  # noqa: E402
from planner.search.result import CompileOptions  # noqa: E402
from planner.search.space import narrow_to_runtime  # noqa: E402
from planner.search.state import Search  # noqa: E402

MARGIN = 0.1  # the command line's default share of HBM left free
CALLS: collections.Counter = collections.Counter()
SECONDS: collections.Counter = collections.Counter()


def timed(owner, name: str, phase: str, report=None) -> None:
    """Replace owner.name by a wrapper that adds its calls and seconds to `phase` (and prints `report`'s line)."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = real(*args, **kwargs)
        SECONDS[phase] += time.perf_counter() - start
        CALLS[phase] += 1
        line = report(args, out, time.perf_counter() - start) if report is not None else None
        if line is not None:
            print(line, flush=True)
        return out

    setattr(owner, name, wrapper)


def _pool_line(args, out, seconds: float) -> str:
    sub, cap = args[1], args[2]
    value, bound, result = out
    status = f"{result.certificate.status} {result.certificate.solved} solved" if result is not None else "none"
    return (f"  pool {sub.cluster.pools[0].name} batch {sub.global_batch}: cap {cap:.4g} value {value:.5g} "
            f"bound {bound:.5g} ({status}) {seconds:.2f} s")


def _slow_programs(least_s: float):
    """A report for `timed` naming each CP-SAT program of at least `least_s` wall seconds: its configuration, size
    and status, and the deterministic seconds it spent (what the search's work limit counts)."""
    def report(args, out, seconds: float) -> str | None:
        if seconds < least_s:
            return None
        program, (solver, status) = args[1], out
        rows = sum(len(stage.rows) for stage in program.stage_rows)
        return (f"  slow CP-SAT program {seconds:.1f} s ({solver.deterministic_time:.1f} deterministic s, "
                f"{solver.status_name(status)}, {rows} stage rows): {program.tables.strategy.spec()}")
    return report


def _job(args) -> Job:
    return Job(model=load_model(args.model), cluster=load_cluster(args.cluster), global_batch=args.batch,
               seq_len=args.seq_len, memory_margin=MARGIN, runtime=load_runtime(args.runtime))


def _frontier(search: Search) -> None:
    """Print the bound of every 250th configuration popped, with the work so far."""
    real = branch.BoundQueue.pop
    popped = [0]
    start = time.perf_counter()

    def pop(queue):
        item = real(queue)
        popped[0] += 1
        if popped[0] % 250 == 0 and item[0] < search.incumbent and not search.spent():
            work = " ".join(f"{phase}={CALLS[phase]}" for phase in sorted(CALLS))
            print(f"  {time.perf_counter() - start:7.1f} s  {popped[0]:6d} configurations, frontier {item[0]:.4f} s, "
                  f"{search.pruned} pruned  {work}", flush=True)
        return item

    branch.BoundQueue.pop = pop


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--cluster", default=str(ROOT / "examples" / "clusters" / "hetero-3pool.yaml"))
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--runtime", default=CLI_RUNTIME)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--incumbent", type=float, default=None)
    parser.add_argument("--slow", type=float, default=None, metavar="SEC",
                        help="name each CP-SAT program that takes at least SEC wall seconds")
    args = parser.parse_args(argv)
    job, catalog = _job(args), load_catalog()
    timed(compile_module, "_compile_pool", "pool compiles", _pool_line)
    timed(compile_module, "legal_configs", "listing")
    timed(branch, "bounded_configs", "cheap bounds")
    timed(TableBuilder, "refined_bound", "memory-aware bounds")
    timed(config_solve, "build_tables", "tables")
    timed(config_solve, "_solve", "CP-SAT", None if args.slow is None else _slow_programs(args.slow))
    options = CompileOptions(time_limit=args.time_limit)
    start = time.perf_counter()
    if args.incumbent is None:
        result = compile_module.compile_job(job, options, catalog, progress=lambda line: print(line, flush=True))
        cert = result.certificate
        print(f"{cert.status} objective {cert.objective:.6g} s, bound {cert.bound:.6g} s, gap {cert.gap:.2%}, "
              f"{cert.configurations} configurations ({cert.solved} solved, {cert.pruned} pruned), "
              f"stopped: {cert.stopped}")
    else:
        options = options.model_copy(update={"space": narrow_to_runtime(options.space, job.runtime, job)})
        search = Search(job=job, options=options, catalog=catalog, builder=TableBuilder(job, catalog),
                        progress=lambda line: print(line, flush=True))
        legal = compile_module.legal_configs(job, options.space)
        search.incumbent = args.incumbent
        _frontier(search)
        branch.search_configs(search, legal, retry_offload=False)
        frontier = min(search.bounds_left, default=search.incumbent)
        print(f"incumbent {search.incumbent:.6g} s, bound {min(frontier, search.incumbent):.6g} s, "
              f"{search.pruned} pruned, {len(search.solved)} solved, stopped: {search.cut_short}")
    print(f"wall {time.perf_counter() - start:.2f} s")
    for phase in SECONDS:
        print(f"  {phase:<22} {CALLS[phase]:>8} calls {SECONDS[phase]:>8.2f} s")


if __name__ == "__main__":
    main()
