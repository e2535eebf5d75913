"""Run every example of the command line's help texts, in the order `planner --help` and each command list them.

    python tests/bench/help_examples.py           # all of them (about 4 minutes on 2 cores)
    python tests/bench/help_examples.py --only show

Each runs in one fresh folder (with `examples/` linked in), so an example that reads `out/...` finds what an
earlier example of its command wrote there, as a reader following the help text would.  One line per example:
exit code, wall seconds, the command, and the last line of its error output when it fails.  The examples that
need a running Ray cluster (`--address auto`) are listed as skipped.  tests/test_cli.py parses every example
with the command's own options on each test run; this runs them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.cli.app import COMMANDS, cli, load_command  # noqa: E402

NEEDS_A_CLUSTER = "--address auto"  # a Ray cluster to connect to


def help_examples(command) -> list[str]:
    """The `planner ...` lines of a command's help (backslash continuations joined)."""
    found, current = [], None
    for line in (command.help or "").splitlines():
        text = line.strip()
        if current is None and text.startswith("planner "):
            current = text
        elif current is not None:
            current = current[:-1].rstrip() + " " + text
        else:
            continue
        if not current.endswith("\\"):
            found.append(current)
            current = None
    return found


def all_examples() -> list[str]:
    return help_examples(cli) + [e for name in COMMANDS for e in help_examples(load_command(name))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only examples containing TEXT")
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="planner-help-") as folder:
        (Path(folder) / "examples").symlink_to(ROOT / "examples")
        for example in all_examples():
            if args.only not in example:
                continue
            if NEEDS_A_CLUSTER in example:
                print(f"skip        {example}  (needs a running Ray cluster)")
                continue
            start = time.perf_counter()
            run = subprocess.run(["bash", "-c", example], cwd=folder, capture_output=True, text=True, timeout=900)
            why = run.stderr.strip().splitlines()[-1][:150] if run.returncode and run.stderr.strip() else ""
            failed += run.returncode != 0
            print(f"{run.returncode:<3} {time.perf_counter() - start:6.1f}s {example}" + (f"  :: {why}" if why else ""),
                  flush=True)
    print(f"\nfailed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
