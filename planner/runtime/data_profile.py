"""A data profile (planner.data.profile) counted from real data: `python -m planner.runtime.data profile`.

From token shards (`--data PREFIX`: every document's tokens, its end-of-document id included, as the
trainer's sampler reads them) or from a sample of a Hugging Face dataset (`--hf-dataset NAME`, where the
`datasets` package is installed: the first `--samples` rows of a split, each row's `--json-key` text
tokenized with `--tokenizer`).  The histogram's bins double in width: [1, 1], [2, 3], [4, 7], ..., each
narrowed to the lengths counted in it, with the number of documents (empty bins are left out).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml


def histogram(lengths: Iterable[int]) -> list[dict[str, int]]:
    """Bins within [2^k, 2^(k+1) - 1], each narrowed to the shortest and longest length counted in it (so no
    bin claims a length the data lacks), with their counts, shortest first; lengths below 1 are dropped."""
    bins: dict[int, list[int]] = {}  # k -> [count, shortest, longest]
    for n in (int(x) for x in lengths):
        if n >= 1:
            k = n.bit_length() - 1
            c, lo, hi = bins.get(k, [0, n, n])
            bins[k] = [c + 1, min(lo, n), max(hi, n)]
    return [{"min_tokens": lo, "max_tokens": hi, "count": c} for _, (c, lo, hi) in sorted(bins.items())]


def hf_texts(name: str, *, split: str, samples: int, key: str, data_files: str | None = None) -> list[str]:
    """The `key` text of the first `samples` rows of a Hugging Face dataset split; ValueError (one line) when
    they cannot be read."""
    try:
        import datasets
    except ImportError:
        raise ValueError("--hf-dataset needs `pip install datasets`") from None
    try:
        rows = datasets.load_dataset(name, data_files=data_files, split=split, streaming=True)
        texts = [row[key] for _, row in zip(range(samples), rows)]
    except KeyError:
        raise ValueError(f"--json-key {key}: no such field in {name}") from None
    except Exception as err:  # datasets raises many kinds (network, missing split, format)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"--hf-dataset {name}: {first}") from None
    if not texts:
        raise ValueError(f"--hf-dataset {name}: split {split} has no rows")
    return texts


def write_profile(path: Path, name: str, lengths: Iterable[int], source: str) -> dict:
    """Write the profile YAML; returns it."""
    bins = histogram(lengths)
    if not bins:
        raise ValueError(f"{source}: no document has a token: nothing to profile")
    doc = {"name": name, "source": source, "derivation": "counted by python -m planner.runtime.data profile",
           "bins": bins}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return doc
