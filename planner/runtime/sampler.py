"""The plan's data layout at run time: whole documents, packed and balanced over the data-parallel ranks.

A plan compiled with `--data-profile` carries a `data` section (planner.data.result.DataPlan): the token
budget of a micro-batch and the seconds a micro-batch costs (`cost_fit`).  Each step this sampler takes the
next whole documents that fill the step's batch x seq_len tokens, packs them first-fit decreasing into
micro-batches of at most the budget (planner.data.balance.pack, the planner's own packer) and assigns the
micro-batches to the data-parallel ranks longest-processing-time first by their fitted seconds
(planner.data.balance.schedule): every rank gets about the same attention-weighted work, not the same
number of sequences.  `balance=False` deals the same micro-batches out in order instead (the unbalanced run
on the same samples: the loss is the same, only who computes what differs).

A micro-batch is one packed row: its tokens, their next-token labels (inside the document) and each token's
document index (planner.runtime.model: positions restart and attention stays inside
each document).  The trainer runs it with variable-length attention on CPU through an explicit mask.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from planner.data.balance import Packed, pack, schedule
from planner.data.result import CostFit, DataPlan

@dataclass(frozen=True)
class MicroBatch:
    """One packed row: tokens, labels and document indices, each (1, T)."""

    tokens: torch.Tensor
    labels: torch.Tensor
    documents: torch.Tensor


@dataclass(frozen=True)
class StepBatch:
    """This rank's micro-batches of a step and the label tokens of the whole step (every rank)."""

    micro: list[MicroBatch]
    label_tokens: int
    rank_seconds: tuple[float, ...]  # every data-parallel rank's fitted seconds of its micro-batches


def micro_seconds(fit: CostFit, lengths: list[int]) -> float:
    """The plan's fitted seconds of a packed micro-batch."""
    return fit.fixed_s + fit.per_token_s * sum(lengths) + fit.per_token_squared_s * sum(n * n for n in lengths)


def synthetic_document(index: int, *, seq_len: int, vocab: int, seed: int) -> np.ndarray:
    """Document `index` of the synthetic stream: 2 to seq_len + 1 tokens (a skewed length, hashed from the
    index and seed), counting up through the vocabulary from a hashed start."""
    digest = hashlib.blake2b(f"planner-doc:{seed}:{index}".encode(), digest_size=16).digest()
    u = int.from_bytes(digest[:8], "little") / 2**64
    length = 2 + int((seq_len - 1) * u ** 3)  # cubed: most documents short, a few near seq_len
    start = int.from_bytes(digest[8:], "little") % vocab
    return (start + np.arange(length)) % vocab


class PlanSampler:
    """Each step's documents as the plan packs and balances them; `position` counts documents consumed."""

    def __init__(self, document: Callable[[int], np.ndarray], documents: int | None, plan: DataPlan, *,
                 seq_len: int, global_batch: int, dp_rank: int, dp_size: int, balance: bool = True):
        fits = {f.cp: f for f in plan.cost_fit}
        if 1 not in fits:
            raise ValueError("the plan's data section has no cost of a one-rank micro-batch (cost_fit cp=1)")
        self.document, self.documents, self.fit = document, documents, fits[1]
        self.budget, self.step_tokens = plan.token_budget, global_batch * seq_len
        self.seq_len, self.dp_rank, self.dp_size, self.balance = seq_len, dp_rank, dp_size, balance
        self.position = 0

    def _take(self) -> list[np.ndarray]:
        """The next whole documents (at most seq_len + 1 tokens each) that fill the step's tokens."""
        docs: list[np.ndarray] = []
        total = 0
        while True:
            if self.documents is not None and self.position >= self.documents:
                self.position = 0  # the next epoch starts over
            doc = np.asarray(self.document(self.position))[:self.seq_len + 1]
            if len(doc) >= 2 and total + len(doc) - 1 > self.step_tokens and docs:
                return docs
            self.position += 1
            if len(doc) >= 2:  # a document of one token has nothing to predict
                docs.append(doc)
                total += len(doc) - 1

    def assign(self, lengths: list[int]) -> tuple[list[Packed], list[int], list[float]]:
        """(the step's micro-batches, the data-parallel rank of each, each rank's fitted seconds)."""
        packed = pack(lengths, self.budget, lambda n: 1)
        seconds = [micro_seconds(self.fit, [lengths[i] for i in p.members]) for p in packed]
        if self.balance:
            ranks = list(schedule([1] * len(packed), seconds, self.dp_size).groups)
        else:  # in packing order, contiguous slices
            per = -(-len(packed) // self.dp_size)
            ranks = [j // per for j in range(len(packed))]
        loads = [0.0] * self.dp_size
        for r, t in zip(ranks, seconds):
            loads[r] += t
        return packed, ranks, loads

    def next_step(self) -> StepBatch:
        docs = self._take()
        lengths = [len(d) - 1 for d in docs]
        packed, ranks, loads = self.assign(lengths)
        mine = [p for p, r in zip(packed, ranks) if r == self.dp_rank]
        return StepBatch(micro=[_row(docs, p) for p in mine], label_tokens=sum(lengths), rank_seconds=tuple(loads))

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


def _row(docs: list[np.ndarray], packed: Packed) -> MicroBatch:
    tokens, labels, index = [], [], []
    for k, i in enumerate(packed.members):
        doc = docs[i].astype(np.int64)
        tokens.append(doc[:-1])
        labels.append(doc[1:])
        index.append(np.full(len(doc) - 1, k))
    as_row = lambda parts: torch.from_numpy(np.concatenate(parts))[None]  # noqa: E731
    return MicroBatch(tokens=as_row(tokens), labels=as_row(labels), documents=as_row(index))
