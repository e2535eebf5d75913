"""The data profile: a histogram of sample lengths (tokens), optionally with the modalities that make them.

`--data-profile FILE` (YAML or JSON, `planner schema data-profile`) replaces compile's assumption that every
sequence is `--seq-len` long.  A bin counts the samples whose length, in tokens the language model sees (text
and every modality's tokens together), lies in [min_tokens, max_tokens].  A modality says how many of those
tokens an encoder produced (images x tokens per image, video frames x tokens per frame, audio seconds x
tokens per second) and which encoder did: the encoder's own work is priced per sample (planner.data.encoder).

A step's data is drawn from the profile deterministically (`step_lengths`): the samples that fill the step's
`batch x seq_len` tokens, one per quantile of the histogram (lengths uniform inside a bin), in a fixed
shuffled order (seeded), so the same inputs give the same plan.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import PlannerInputError

ModalityKind = Literal["image", "video", "audio"]
# the order in which a step's samples arrive: a fixed seed, so plans are byte-identical run to run
ORDER_SEED = 0


class LengthBin(BaseModel):
    """Samples whose length lies in [min_tokens, max_tokens]."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min_tokens: int = Field(ge=1, strict=True, description="Shortest sample of the bin, in tokens (>= 1).")
    max_tokens: int = Field(ge=1, strict=True, description="Longest sample of the bin, in tokens (>= min_tokens).")
    count: float = Field(gt=0, allow_inf_nan=False,
                         description="Samples in the bin (a count or a share: bins are normalised together).")

    @model_validator(mode="after")
    def _ordered(self) -> "LengthBin":
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens {self.max_tokens} is below min_tokens {self.min_tokens}")
        return self


class Modality(BaseModel):
    """Tokens of a sample that an encoder produced from another modality."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ModalityKind = Field(description="image, video (frames) or audio (seconds).")
    sample_share: float = Field(gt=0, le=1, allow_inf_nan=False,
                                description="Share of the samples that carry this modality (0-1].")
    items_per_sample: float = Field(gt=0, allow_inf_nan=False,
                                    description="Images, video frames or audio seconds per sample that has it.")
    tokens_per_item: int = Field(ge=1, strict=True,
                                 description="Language-model tokens per image, frame or second (after the "
                                             "projector; e.g. 576 for CLIP ViT-L/14 at 336 px).")
    encoder: str | None = Field(None, description="The encoder that produces them: a zoo name, a model spec or a "
                                                  "Hugging Face config.json (None: not costed, e.g. frozen and "
                                                  "precomputed features).")
    encoder_tokens_per_item: int | None = Field(
        None, ge=1, strict=True,
        description="Tokens (patches) the encoder itself runs per item (None: tokens_per_item).")
    encoder_trained: bool = Field(False, description="The encoder trains too (forward and backward); False: "
                                                     "frozen, forward only (LLaVA-1.5's instruction tuning).")

    @property
    def encoder_tokens(self) -> int:
        """Patches the encoder runs per item."""
        return self.encoder_tokens_per_item or self.tokens_per_item


class DataProfile(BaseModel):
    """Sample lengths of a training data mix: what `--data-profile FILE` holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=128, description="Name of the profile, shown in reports.")
    source: str = Field(min_length=1, description="Where the histogram comes from (a public dataset, paper or "
                                                  "the shards `planner.runtime.data profile` read).")
    derivation: str = Field("", description="How the bins were obtained from the source (counted, read off a "
                                            "figure, assumed), so a reader can judge them.")
    bins: list[LengthBin] = Field(min_length=1, description="The length histogram (tokens per sample, all "
                                                            "modalities together).")
    modalities: list[Modality] = Field(default_factory=list,
                                       description="Non-text tokens of the samples and their encoders (empty: text).")

    @model_validator(mode="after")
    def _one_per_kind(self) -> "DataProfile":
        kinds = [m.kind for m in self.modalities]
        for kind in kinds:
            if kinds.count(kind) > 1:
                raise ValueError(f"modality {kind} is given twice")
        return self

    @property
    def max_tokens(self) -> int:
        """The longest sample the histogram allows."""
        return max(b.max_tokens for b in self.bins)

    def mean_tokens(self) -> float:
        """Mean sample length (lengths uniform within each bin)."""
        total = sum(b.count for b in self.bins)
        return sum(b.count * (b.min_tokens + b.max_tokens) / 2 for b in self.bins) / total

    def clipped(self, seq_len: int) -> "DataProfile":
        """The profile with every sample longer than seq_len cut to seq_len (a run at that context cuts them)."""
        bins = [b if b.max_tokens <= seq_len else
                LengthBin(min_tokens=min(b.min_tokens, seq_len), max_tokens=seq_len, count=b.count)
                for b in self.bins]
        return self.model_copy(update={"bins": bins})

    def check_fits(self, seq_len: int, where: str) -> None:
        """PlannerInputError when a bin holds samples longer than `--seq-len` (the longest sequence a plan may
        run; longer ones would be cut, which changes the data)."""
        for i, b in enumerate(self.bins):
            if b.max_tokens > seq_len:
                raise PlannerInputError(f"{where}: bins[{i}].max_tokens: {b.max_tokens} tokens is above --seq-len "
                                        f"{seq_len}; raise --seq-len or cut the profile")


def _location(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts[-1:] = [f"{parts[-1]}[{p}]"] if parts else [f"[{p}]"]
        else:
            parts.append(str(p))
    return ".".join(parts)


def load_data_profile(path: str | Path) -> DataProfile:
    """A profile from a YAML or JSON file; PlannerInputError `FILE: field: message` (one line) on any problem."""
    from models import ModelInputError
    from models.spec import read_mapping

    try:
        data = read_mapping(path, "data profile")
        profile = DataProfile.model_validate(data)
    except ModelInputError as err:
        raise PlannerInputError(str(err)) from None
    except ValidationError as err:
        first = err.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        where = _location(first["loc"])
        raise PlannerInputError(f"{path}: {where}: {message}" if where else f"{path}: {message}") from None
    return _encoders_beside(profile, Path(path).parent)


def _encoders_beside(profile: DataProfile, folder: Path) -> DataProfile:
    """An encoder named by a relative path is read beside the profile file (where that file exists)."""
    modalities = []
    for m in profile.modalities:
        if m.encoder and not Path(m.encoder).is_absolute() and (folder / m.encoder).is_file():
            m = m.model_copy(update={"encoder": str(folder / m.encoder)})
        modalities.append(m)
    return profile.model_copy(update={"modalities": modalities})


def quantile_lengths(profile: DataProfile, n: int) -> np.ndarray:
    """`n` sample lengths, the (i + 0.5) / n quantiles of the histogram (uniform inside each bin), ascending."""
    counts = np.array([b.count for b in profile.bins], dtype=float)
    order = np.argsort([b.min_tokens for b in profile.bins], kind="stable")
    counts = counts[order]
    lows = np.array([profile.bins[i].min_tokens for i in order], dtype=float)
    highs = np.array([profile.bins[i].max_tokens for i in order], dtype=float)
    edges = np.concatenate([[0.0], np.cumsum(counts) / counts.sum()])
    q = (np.arange(n) + 0.5) / n
    which = np.clip(np.searchsorted(edges, q, side="right") - 1, 0, len(counts) - 1)
    inside = (q - edges[which]) / (edges[which + 1] - edges[which])
    # integer lengths spread over [min, max] inclusive
    lengths = np.floor(lows[which] + inside * (highs[which] - lows[which] + 1))
    return np.minimum(lengths, highs[which]).astype(np.int64)


def step_lengths(profile: DataProfile, tokens: int) -> list[int]:
    """One step's samples: as many quantile samples as fill `tokens` (batch x seq_len), in a fixed shuffled
    order (the order a sampler without a plan would see them)."""
    n = max(1, math.floor(tokens / profile.mean_tokens()))
    lengths = quantile_lengths(profile, n)
    while n > 1 and int(lengths.sum()) > tokens:  # quantiles of a skewed mix can overshoot the mean's count
        n -= 1
        lengths = quantile_lengths(profile, n)
    order = np.random.default_rng(ORDER_SEED).permutation(n)
    return [int(x) for x in lengths[order]]


def step_items(profile: DataProfile, lengths: list[int], modality: Modality) -> list[int]:
    """Items (images, frames, seconds) of `modality` in each of the step's samples: spread evenly over the
    samples long enough to hold one item's tokens, sample_share x items_per_sample of them per sample on
    average (cumulative rounding, so the step's total is exact to one item)."""
    eligible = [i for i, n in enumerate(lengths) if n >= modality.tokens_per_item]
    items = [0] * len(lengths)
    if not eligible:
        return items
    per = min(modality.sample_share * len(lengths) / len(eligible), 1.0) * modality.items_per_sample
    for k, i in enumerate(eligible):
        fit = lengths[i] // modality.tokens_per_item  # never more items than the sample has tokens for
        items[i] = min(fit, math.floor((k + 1) * per) - math.floor(k * per))
    return items
