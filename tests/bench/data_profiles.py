"""The data plan against the best static plan, per example profile and context length.

    python tests/bench/data_profiles.py [--model llama3-8b] [--cluster dgx-h100:4] [--tokens 8388608]
                                        [--seq-lens 32768,131072] [--only NAME]

For each profile of examples/data and each context length S, compiles MODEL on CLUSTER with a batch of
TOKENS / S sequences and `--data-profile` (the profile's bins clipped at S: longer samples are cut to S, as
a run at that context would cut them) and prints the best static layout, its step, the plan's step, the
speed-up, the plan's gap to its bound and the compile's wall time.  Every step time is a prediction of the
cost model, not a measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from planner import api  # noqa: E402
from planner.data.profile import DataProfile, load_data_profile  # noqa: E402


def row(model: str, cluster: str, tokens: int, seq_len: int, profile: DataProfile) -> list[str]:
    job = api.load_job(model, cluster, batch=max(1, tokens // seq_len), seq_len=seq_len)
    start = time.perf_counter()
    compiled = api.compile(job, work_limit=5.0, data_profile=profile.clipped(seq_len))
    wall = time.perf_counter() - start
    data = compiled.plan.data
    base_layout, base_spec = data.baseline.split(" ", 1)
    base_cp = base_spec.split("cp=")[1].split(",")[0]
    degrees = "/".join(str(b.cp) for b in data.buckets) or "-"
    return [profile.name, str(seq_len), f"{base_layout} cp={base_cp}", f"{data.baseline_step_time_s:.2f}",
            f"{data.layout} [{degrees}]", f"{data.step_time_s:.2f}", f"{data.speedup:.3f}x",
            f"{100 * data.gap:.2f}%", f"{wall:.1f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--cluster", default="dgx-h100:4")
    parser.add_argument("--tokens", type=int, default=64 * 131072, help="Tokens per step (batch x seq_len).")
    parser.add_argument("--seq-lens", default="32768,131072")
    parser.add_argument("--only", default=None, help="Profiles whose name contains this.")
    args = parser.parse_args(argv)
    headers = ["profile", "S", "best static", "static s", "plan [bucket cp]", "plan s", "speed-up", "gap",
               "wall s"]
    print("| " + " | ".join(headers) + " |")
    print("| " + " | ".join("---" for _ in headers) + " |")
    for path in sorted((ROOT / "examples" / "data").glob("*.yaml")):
        profile = load_data_profile(path)
        if args.only and args.only not in profile.name:
            continue
        for seq_len in (int(x) for x in args.seq_lens.split(",")):
            print("| " + " | ".join(row(args.model, args.cluster, args.tokens, seq_len, profile)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
