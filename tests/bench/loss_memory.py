"""What a cross-entropy loss holds per logit: the measurement behind the runtime profiles' `loss` sections.

    python tests/bench/loss_memory.py                          # every implementation (the compiled ones take a minute)
    python tests/bench/loss_memory.py --only eager,vocab-parallel --json out.json

Each implementation runs in a fresh process on CPU: bf16 logits of one micro-batch come out of an output
projection (h @ w, which saves h and w, not the logits), the loss runs on them, the train step drops its
reference to the logits (torchtitan's and planner's `del pred`), and backward runs.  The process's resident
memory (Linux /proc/self/status VmRSS, its high-water mark VmHWM reset through /proc/self/clear_refs) is read
before the step, after the loss's forward and at the peaks of forward and backward; every tensor here is far
above glibc's mmap threshold (32 MiB at most), so each is mapped on allocation and unmapped when freed, and the
resident bytes are the tensor bytes.  Reported per logit (token x vocabulary entry):

  kept           alive between the loss's forward and its backward (what it saves for backward)
  forward peak   the most alive during the forward (the logits included)
  backward peak  the most alive during the backward
  peak           the larger of the two: `peak` of the profile's `loss` section, `kept` its `saved`

Implementations:

  eager                    F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)): torchtitan's loss
                           (components/loss.py; train.py before #1033) and planner's (planner/runtime/parallelize.py)
  vocab-parallel           the same on DTensor logits sharded over the vocabulary, under
                           torch.distributed.tensor.parallel.loss_parallel (torchtitan with tensor parallelism;
                           a one-rank gloo mesh runs the same handlers as eight ranks, on a local shard)
  compiled                 torch.compile of `eager` (torchtitan since #1033 with compile on)
  compiled-vocab-parallel  torch.compile of `vocab-parallel`
  chunked-8                torchtitan #996's chunked loss: the logits in 8 chunks along the sequence, one
                           cross entropy each (compare: that PR measured 49.58 GiB -> 42.26 GiB for Llama 3 8B)
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

MODES = ("eager", "vocab-parallel", "compiled", "compiled-vocab-parallel", "chunked-8")
TOKENS, HIDDEN, VOCAB = 1024, 64, 65536  # 67M logits: 0.27-1.1 GB at 4-16 bytes per logit


def _rss() -> tuple[int, int]:
    """Resident bytes now and at their high-water mark."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)


def _loss_fn(mode: str):
    import torch
    import torch.nn.functional as F

    def cross_entropy(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    def chunked(pred, labels, chunks: int = 8):
        total = 0.0
        for logits, target in zip(pred.chunk(chunks, dim=1), labels.chunk(chunks, dim=1)):
            total = total + cross_entropy(logits, target)
        return total / chunks

    if mode == "chunked-8":
        return chunked
    return torch.compile(cross_entropy) if mode.startswith("compiled") else cross_entropy


def measure(mode: str, tokens: int = TOKENS, hidden: int = HIDDEN, vocab: int = VOCAB, repeats: int = 2) -> dict:
    """Bytes per logit the loss `mode` holds (this process; the last of `repeats` steps, after warm-up)."""
    import torch

    torch.set_num_threads(1)
    parallel = mode.endswith("vocab-parallel")
    mesh = None
    if parallel:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    h = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(hidden, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    fn = _loss_fn(mode)
    if parallel:
        from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
        from torch.distributed.tensor.parallel import loss_parallel

        w = distribute_tensor(w.detach(), mesh, [Shard(1)]).requires_grad_()
    logits = tokens * vocab
    out = {}
    for _ in range(repeats):
        h.grad = w.grad = None
        gc.collect()
        start, _ = _rss()
        _reset_peak()
        with loss_parallel() if parallel else nullcontext():
            pred = (DTensor.from_local(h, mesh, [Replicate()]) @ w) if parallel else h @ w
            loss = fn(pred, labels)
            del pred
            gc.collect()
            kept, forward_peak = _rss()
            _reset_peak()
            loss.backward()
        _, backward_peak = _rss()
        out = {key: round((value - start) / logits, 2) for key, value in
               (("kept", kept), ("forward_peak", forward_peak), ("backward_peak", backward_peak))}
    out["peak"] = max(out["forward_peak"], out["backward_peak"])
    if parallel:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {"mode": mode, "torch": torch.__version__, **out}


def run(modes: list[str], tokens: int = TOKENS, vocab: int = VOCAB, timeout: float = 600.0,
        one_process: bool = False, hidden: int = HIDDEN) -> list[dict]:
    """Measure each mode in a fresh process (`one_process`: all in one, in order, which saves the start-up of
    torch but lets compiled modes share caches); a mode that fails gives its error instead of numbers."""
    groups = [modes] if one_process else [[mode] for mode in modes]
    results = []
    for group in groups:
        cmd = [sys.executable, __file__, "--worker", ",".join(group), "--tokens", str(tokens), "--vocab", str(vocab),
               "--hidden", str(hidden)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        got = {r["mode"]: r for r in (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))}
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        results += [got.get(mode, {"mode": mode, "error": tail}) for mode in group]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma-separated modes (default: all of {', '.join(MODES)})")
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--hidden", type=int, default=HIDDEN,
                        help="width of the output projection (its bf16 matmul is most of the time on CPU)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # measure these modes in this process
    args = parser.parse_args(argv)
    if not Path("/proc/self/clear_refs").exists():
        print("loss_memory: needs Linux /proc/self/clear_refs to read peak resident memory", file=sys.stderr)
        return 2
    modes = (args.worker or args.only or ",".join(MODES)).split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    if args.worker:
        for mode in modes:  # the process group of a vocab-parallel mode is torn down after it
            print(json.dumps(measure(mode, args.tokens, args.hidden, vocab=args.vocab)), flush=True)
        return 0
    results = run(modes, args.tokens, args.vocab, hidden=args.hidden)
    print(f"bytes per logit ({args.tokens} tokens x {args.vocab} vocabulary, bf16 logits, CPU)")
    print(f"{'mode':<25} {'kept':>6} {'fwd peak':>9} {'bwd peak':>9} {'peak':>6}")
    for r in results:
        if "error" in r:
            print(f"{r['mode']:<25} failed: {r['error']}")
        else:
            print(f"{r['mode']:<25} {r['kept']:>6.2f} {r['forward_peak']:>9.2f} {r['backward_peak']:>9.2f} "
                  f"{r['peak']:>6.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
