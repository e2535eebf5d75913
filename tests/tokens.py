"""A tiny byte-level training set for the runtime's end-to-end tests, written by the real writer command
(`python -m planner.runtime.data write --tokenizer bytes`): 300 short documents over an 8-word vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WORDS = ("plan", "shard", "stage", "rank", "token", "step", "loss", "mesh")


def write_tokens(folder: Path) -> Path:
    """Write folder/train.bin and folder/train.idx; return the prefix folder/train."""
    lines = [json.dumps({"text": " ".join(WORDS[(7 * d + 3 * i) % 8] for i in range(24)) + "."}) for d in range(300)]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "planner.runtime.data", "write", "--tokenizer", "bytes", "--input",
                    str(folder / "corpus.jsonl"), "--output", str(folder / "train")], check=True, timeout=60,
                   capture_output=True)
    return folder / "train"
