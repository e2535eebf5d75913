"""Start-up time of the command line: how long `planner --help` and `planner show` take beyond the interpreter.

    python tests/bench/startup.py               # 7 runs of each command
    python tests/bench/startup.py --repeat 15

Each command runs as a fresh process (`python -m planner ...`, as the console script does); the table gives the
median wall time, the interpreter's own start (`python -c pass`, same flags) and the difference, against the
target of issue #30: 0.4 s beyond the interpreter.  The commands load only what they need: the group lists its
commands from planner/cli/app.py COMMANDS without importing them, `show` loads models and hardware but not the
cost model, the solver, numpy, networkx or matplotlib (tests/test_cli.py checks which modules load).

Timings are medians on a shared machine: read them as a table, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET_S = 0.4
COMMANDS = (
    ("planner --help", ["-m", "planner", "--help"]),
    ("planner show llama3-70b", ["-m", "planner", "show", "llama3-70b"]),
    ("planner show dgx-h100:4", ["-m", "planner", "show", "dgx-h100:4"]),
    ("planner list models", ["-m", "planner", "list", "models"]),
)


def wall(args: list[str], repeat: int) -> list[float]:
    """Wall times of `python args` run `repeat` times (output discarded; a failure stops the bench)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per command (default 7)")
    args = parser.parse_args()
    base = statistics.median(wall(["-c", "pass"], args.repeat))
    print(f"{'command':<26} {'median s':>9} {'min-max':>13} {'beyond python s':>16} {'target':>7}")
    print("-" * 75)
    print(f"{'python -c pass':<26} {base:>9.3f}")
    within = True
    for label, argv in COMMANDS:
        times = wall(argv, args.repeat)
        median = statistics.median(times)
        beyond = median - base
        target = f"{TARGET_S:.1f}" if label.startswith(("planner --help", "planner show")) else "-"
        within &= target == "-" or beyond <= TARGET_S
        print(f"{label:<26} {median:>9.3f} {min(times):>6.3f}-{max(times):<6.3f} {beyond:>16.3f} {target:>7}")
    print(f"\nhelp and show within {TARGET_S} s beyond the interpreter: {'yes' if within else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
