"""DLRM zoo entries on the Criteo datasets.

Table row counts come from models/data/criteo_tables.csv (26 categorical
features of Criteo Kaggle and Criteo Terabyte), read through
importlib.resources so an installed package finds it.  The published count of
each entry is sum(rows x dim) + MLP weights and biases computed from that CSV
and the benchmark's MLP widths: DLRM papers quote table sizes, not one total.

Assumption: every table's access skew is Zipf(alpha=1.05) (EmbeddingTable's
default); the Criteo papers publish per-table access counts, not alpha.
"""

from __future__ import annotations

import csv
import io
from importlib import resources

from models.graph import EmbeddingTable
from models.recsys import DLRMConfig
from models.zoo.entry import ZooEntry

DLRM_REPO = "https://github.com/facebookresearch/dlrm"


def criteo_rows() -> list[dict[str, str]]:
    """Rows of criteo_tables.csv, one per categorical feature, in table order."""
    text = resources.files("models").joinpath("data/criteo_tables.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    return sorted(rows, key=lambda row: int(row["table_index"]))


def criteo_tables(rows_column: str, dim: int, pooling_column: str | None = None) -> list[EmbeddingTable]:
    """One EmbeddingTable per Criteo feature from the named CSV columns."""
    return [
        EmbeddingTable(
            rows=int(row[rows_column]), dim=dim,
            pooling_factor=float(row[pooling_column]) if pooling_column else 1.0,
        )
        for row in criteo_rows()
    ]


def _published(cfg: DLRMConfig) -> int:
    return cfg.table_params() + cfg.mlp_params()


_KAGGLE = DLRMConfig(
    name="dlrm-criteo-kaggle",
    dense_features=13, bottom_mlp=[512, 256, 64, 16], top_mlp=[512, 256, 1],
    tables=criteo_tables("kaggle_rows", dim=16), interaction="dot",
    source=f"Naumov et al. 2019, arXiv 1906.00091; {DLRM_REPO} bench/dlrm_s_criteo_kaggle.sh "
    "(--arch-sparse-feature-size=16 --arch-mlp-bot=13-512-256-64-16 --arch-mlp-top=512-256-1)",
)

# MLPerf DLRM sizes on Criteo Terabyte (dim 128, bottom 13-512-256-128, top
# 1024-1024-512-256-1, dot interaction) with the full, uncapped tables and the
# multi-hot pooling sizes of MLPerf's DLRM-DCNv2 (synthetic multi-hot Criteo).
_TERABYTE = DLRMConfig(
    name="dlrm-criteo-terabyte",
    dense_features=13, bottom_mlp=[512, 256, 128], top_mlp=[1024, 1024, 512, 256, 1],
    tables=criteo_tables("terabyte_rows_full", dim=128, pooling_column="mlperf_dcnv2_multi_hot_size"),
    interaction="dot",
    source=f"{DLRM_REPO} bench/run_and_time.sh (MLPerf DLRM: --arch-sparse-feature-size=128 "
    "--arch-mlp-bot=13-512-256-128 --arch-mlp-top=1024-1024-512-256-1); multi-hot sizes from "
    "MLPerf Training DLRM-DCNv2 (github.com/mlcommons/training, recommendation_v2)",
)

ENTRIES: list[ZooEntry] = [
    ZooEntry("dlrm-criteo-kaggle", _KAGGLE, published_params=_published(_KAGGLE),
             source="computed: Kaggle rows x 16 from criteo_tables.csv + MLPs of " + DLRM_REPO),
    ZooEntry("dlrm-criteo-terabyte", _TERABYTE, published_params=_published(_TERABYTE),
             source="computed: terabyte_rows_full x 128 from criteo_tables.csv + MLPerf DLRM MLPs"),
]


def meta_2021_synthetic_tables(count: int = 856, mean_pooling: float = 15.8, seed: int = 2021) -> list[EmbeddingTable]:
    """Tables with the statistics of Meta's 2021 DLRM embedding dataset (synthetic, seeded).

    facebookresearch/dlrm_datasets (embedding_bag/2021) holds 856 tables whose
    traces average about 15.8 lookups per table per sample, with heavy-tailed
    table sizes and skewed row access (Sethi et al., RecShard, ASPLOS 2022;
    Zha et al., AutoShard/DreamShard, KDD 2022 / NeurIPS 2022 describe it).  The
    traces are not shipped here, so sizes are drawn: rows log-normal (median 1M,
    clipped to [1,000, 50M]), dims from {32, 64, 128, 256}, pooling factors
    log-normal rescaled to the mean, Zipf alpha uniform in [0.8, 1.3].
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = np.clip(rng.lognormal(mean=np.log(1e6), sigma=1.6, size=count), 1e3, 5e7).astype(int)
    dims = rng.choice([32, 64, 128, 256], size=count, p=[0.2, 0.35, 0.3, 0.15])
    pooling = rng.lognormal(mean=0.0, sigma=1.0, size=count)
    pooling = np.maximum(1.0, pooling * mean_pooling / pooling.mean())
    alphas = rng.uniform(0.8, 1.3, size=count)
    return [EmbeddingTable(rows=int(r), dim=int(d), pooling_factor=round(float(p), 3), zipf_alpha=round(float(a), 3))
            for r, d, p, a in zip(rows, dims, pooling, alphas)]



META_2021_CSV = "data/meta_2021_synthetic_tables.csv"
META_2021_COLUMNS = ("rows", "dim", "pooling_factor", "zipf_alpha")


def meta_2021_tables() -> list[EmbeddingTable]:
    """meta_2021_synthetic_tables() as written to models/data/meta_2021_synthetic_tables.csv (numpy, which
    draws them, takes a tenth of a second to import; tests/test_zoo_tables.py checks the file against it)."""
    text = resources.files("models").joinpath(META_2021_CSV).read_text(encoding="utf-8")
    return [EmbeddingTable(rows=int(row["rows"]), dim=int(row["dim"]), pooling_factor=float(row["pooling_factor"]),
                           zipf_alpha=float(row["zipf_alpha"])) for row in csv.DictReader(io.StringIO(text))]


def meta_2021_csv(tables: list[EmbeddingTable]) -> str:
    """The CSV text of `tables` (python -c "from models.zoo.recsys import *; print(meta_2021_csv(
    meta_2021_synthetic_tables()), end='')" > models/data/meta_2021_synthetic_tables.csv)."""
    lines = [",".join(META_2021_COLUMNS)]
    lines += [",".join(repr(getattr(t, c)) for c in META_2021_COLUMNS) for t in tables]
    return "\n".join(lines) + "\n"

_META_2021 = DLRMConfig(
    name="dlrm-meta-2021-synthetic",
    dense_features=13, bottom_mlp=[512, 256, 128], top_mlp=[1024, 1024, 512, 256, 1],
    tables=meta_2021_tables(), interaction="cat",
    source="synthetic tables with the statistics of Meta's 2021 DLRM dataset (github.com/facebookresearch/"
    "dlrm_datasets; 856 tables, ~15.8 lookups per table per sample); MLPs as MLPerf DLRM; cat interaction "
    "(table dims differ)",
)

# A DLRM small enough to train on CPU processes in tests (8 tables, dim 16).
_TINY = DLRMConfig(
    name="tiny-dlrm",
    dense_features=13, bottom_mlp=[32, 16], top_mlp=[32, 16, 1],
    tables=[EmbeddingTable(rows=r, dim=16, pooling_factor=p) for r, p in
            [(1000, 2.0), (500, 1.0), (2000, 3.0), (100, 1.0), (50, 1.0), (3000, 2.0), (800, 1.0), (200, 2.0)]],
    interaction="dot",
    source="planner test model: Criteo-shaped DLRM scaled down to run on CPU",
)

ENTRIES += [
    ZooEntry("dlrm-meta-2021-synthetic", _META_2021, published_params=_published(_META_2021),
             source="computed: the seeded synthetic tables + MLPs"),
    ZooEntry("tiny-dlrm", _TINY, published_params=_published(_TINY), source="computed: tables + MLPs"),
]
