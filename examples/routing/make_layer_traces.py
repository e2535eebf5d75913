"""Write the per-layer example traces of this folder (deterministic: Python's random with fixed seeds).

These are NOT measurements: no public source publishes per-expert token counts of Mixtral-8x7B or
DeepSeek-V3 per layer.  They are drawn in the format a measured trace has (routed token copies per expert
per MoE layer, as Megatron-Core's router logging or planner's trainer count them), each layer's shares a
Dirichlet(alpha) draw, capped at 1/top_k (a token visits an expert once).  Rerun to regenerate:

    python examples/routing/make_layer_traces.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent

# (file, model, MoE layers, experts, top_k, Dirichlet alpha, tokens per step, redundant slots, groups, seed)
TRACES = [
    ("mixtral-8x7b-layers.json", "mixtral-8x7b", 32, 8, 2, 3.0, 256 * 4096, 8, 1, 7),
    ("deepseek-v3-layers.json", "deepseek-v3", 58, 256, 8, 1.5, 1024 * 4096, 32, 8, 11),
]


def shares(rng: random.Random, experts: int, top_k: int, alpha: float) -> list[float]:
    """One layer's Dirichlet(alpha) shares, capped at 1/top_k (the excess spread over the others)."""
    draws = [rng.gammavariate(alpha, 1.0) for _ in range(experts)]
    out = [d / sum(draws) for d in draws]
    cap = 1.0 / top_k
    while max(out) > cap:
        over = sum(s - cap for s in out if s > cap)
        free = sum(s for s in out if s < cap)
        out = [cap if s >= cap else s + over * s / free for s in out]
    return out


def main() -> None:
    for name, model, layers, experts, top_k, alpha, tokens, redundant, groups, seed in TRACES:
        rng = random.Random(seed)
        copies = tokens * top_k
        entries = [{"layer": i, "tokens": [round(s * copies) for s in shares(rng, experts, top_k, alpha)]}
                   for i in range(layers)]
        doc = {
            "source": f"illustrative, not measured: per-layer Dirichlet(alpha={alpha}) shares of {model}'s "
                      f"{experts} experts (top_k {top_k}), {tokens} tokens per step, drawn by "
                      f"examples/routing/make_layer_traces.py seed {seed}",
            "redundant_slots": redundant,
            "expert_groups": groups,
            "layers": entries,
        }
        (HERE / name).write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
