"""The encoders of a multimodal profile: their work per micro-batch through the one cost model, and where
they run.

A modality that names an encoder (a zoo name, a model spec or a Hugging Face config.json) is priced as that
model's own micro-batch on the data ranks (the language model's tensor-parallel degree, no pipeline or
context parallelism): a row of items x encoder tokens, each item attending only within itself (an image's
patches, a frame's, an audio second's), forward only when the encoder is frozen.  Two placements:

* co-located: each sample's items are encoded on the ranks that run the sample (LLaVA, Megatron's
  multimodal models): the encoder's seconds join the micro-batch's and the balancing sees them;
* spread: every data rank encodes an equal share of the step's items and an all-to-all over the data ranks
  moves the embeddings (items x tokens per item x the language model's hidden size, 16-bit) to the ranks
  that run their samples, and their gradients back when the encoder trains (DistTrain-style disaggregation
  within the ranks).

The plan takes the faster.  Encoders are priced only without pipeline parallelism (the encoder would sit on
the first stage); the data plan notes when it could not price one.
"""

from __future__ import annotations

from collections.abc import Sequence

import math
from dataclasses import dataclass
from typing import Literal

from hardware import Catalog, collectives as coll
from models import ModelInputError, load_model
from planner.cost.layout import place_stages, stage_comms
from planner.data.cost import MicroCoster
from planner.data.profile import DataProfile, Modality, step_items
from planner.errors import PlannerInputError
from planner.job import Job
from planner.strategy import Strategy, parse_strategy
from planner.validation import check_strategy

ACTIVATION_BYTES = 2.0  # an embedding handed to the language model: bf16/fp16

Placement = Literal["co-located", "spread"]


@dataclass
class EncoderCost:
    """One modality's encoder on the data ranks."""

    modality: Modality
    coster: MicroCoster
    items: list[int]  # per sample of the step

    def seconds(self, items: int) -> float:
        """Seconds one rank spends encoding `items` items (forward only for a frozen encoder)."""
        if items <= 0:
            return 0.0
        cost = self.coster.cost([self.modality.encoder_tokens] * items, 1)
        return cost.busiest if self.modality.encoder_trained else cost.forward


@dataclass
class Encoders:
    """Every priced encoder of the profile under one language-model strategy."""

    encoders: list[EncoderCost]
    job: Job
    strategy: Strategy
    catalog: Catalog

    def colocated(self, members: Sequence[int]) -> float:
        """Encoder seconds of a micro-batch of these samples, on its ranks."""
        return sum(e.seconds(sum(e.items[i] for i in members)) for e in self.encoders)

    def spread(self, ranks: int) -> float:
        """Seconds every data rank adds when the step's items are encoded evenly and their embeddings moved."""
        site = place_stages(self.job, self.strategy, self.catalog)[0].site
        group = stage_comms(self.job, self.strategy, site).dp
        total = 0.0
        for e in self.encoders:
            share = math.ceil(sum(e.items) / ranks)
            moved = share * e.modality.tokens_per_item * self.job.model.hidden * ACTIVATION_BYTES
            exchanges = 2 if e.modality.encoder_trained else 1
            total += e.seconds(share) + exchanges * coll.all_to_all(moved, group, self.catalog)
        return total


def encoders_for(job: Job, strategy: Strategy, profile: DataProfile, lengths: list[int], catalog: Catalog
                 ) -> tuple[Encoders | None, list[str]]:
    """The profile's priced encoders under `strategy` (None when there are none) and notes on those left out."""
    named = [m for m in profile.modalities if m.encoder]
    if not named:
        return None, []
    if strategy.pp > 1:
        return None, [f"modality {m.kind}: encoder {m.encoder} not priced under pipeline parallelism (pp="
                      f"{strategy.pp})" for m in named]
    out = []
    for m in named:
        assert m.encoder is not None  # `named` holds the modalities with one
        try:
            graph = load_model(m.encoder)
        except ModelInputError as err:
            raise PlannerInputError(f"data profile {profile.name}: modalities: encoder {m.encoder}: {err}") from None
        enc_job = job.model_copy(update={"model": graph, "seq_len": m.encoder_tokens, "attention_span": None,
                                         "global_batch": strategy.cp * strategy.data_parallel})
        enc = check_strategy(enc_job, parse_strategy(f"tp={strategy.tp},pp=1,cp=1,zero={strategy.zero},"
                                                     f"recompute=none"))
        out.append(EncoderCost(modality=m, coster=MicroCoster(enc_job, enc, catalog),
                               items=step_items(profile, lengths, m)))
    return Encoders(encoders=out, job=job, strategy=strategy, catalog=catalog), []
