"""Language-model zoo entries: a family builder plus the published sizes.

Published counts are the ones the authors or their model cards state; the
tests hold every built model to within 1% of them.
"""

from __future__ import annotations

from models.transformer import MLAConfig, MoEConfig, bert, gpt, llama
from models.zoo.entry import ZooEntry

_HF = "https://huggingface.co/"


LLAMA2 = "Touvron et al. 2023, Llama 2 (arXiv 2307.09288) Table 1; sizes from " + _HF + "meta-llama/Llama-2-{}-hf"
LLAMA3 = "Llama Team 2024, The Llama 3 Herd of Models (arXiv 2407.21783) Table 3; sizes from " + _HF + "meta-llama/{}"

ENTRIES: list[ZooEntry] = [
    ZooEntry(
        "gpt2-xl",
        gpt(name="gpt2-xl", num_layers=48, hidden=1600, heads=25, max_positions=1024,
            source=_HF + "openai-community/gpt2-xl (config.json; 1,557,611,200 params)"),
        published_params=1_557_611_200,
        source="Radford et al. 2019 (GPT-2, 1.5B); exact count of " + _HF + "openai-community/gpt2-xl",
    ),
    ZooEntry(
        "gpt3-175b",
        gpt(name="gpt3-175b", num_layers=96, hidden=12288, heads=96, max_positions=2048,
            source="Brown et al. 2020, arXiv 2005.14165 Table 2.1"),
        published_params=175_000_000_000,
        source="Brown et al. 2020, Language Models are Few-Shot Learners, arXiv 2005.14165 Table 2.1 (175.0B)",
    ),
    ZooEntry(
        "bert-large",
        bert(name="bert-large", num_layers=24, hidden=1024, heads=16,
             source="Devlin et al. 2019, arXiv 1810.04805; " + _HF + "google-bert/bert-large-uncased"),
        # BertForPreTraining (encoder + pooler + MLM + NSP heads): 336,226,108 weights;
        # the model card states "336M parameters" (the paper's 340M is rounded).
        published_params=336_000_000,
        source=_HF + "google-bert/bert-large-uncased (model card: 336M parameters)",
    ),
    ZooEntry(
        "llama2-7b",
        llama(name="llama2-7b", num_layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000,
              max_positions=4096, source=LLAMA2.format("7b")),
        published_params=6_740_000_000, source=_HF + "meta-llama/Llama-2-7b-hf (6.74B params)",
    ),
    ZooEntry(
        "llama2-13b",
        llama(name="llama2-13b", num_layers=40, hidden=5120, heads=40, ffn=13824, vocab=32000,
              max_positions=4096, source=LLAMA2.format("13b")),
        published_params=13_020_000_000, source=_HF + "meta-llama/Llama-2-13b-hf (13.02B params)",
    ),
    ZooEntry(
        "llama2-70b",
        llama(name="llama2-70b", num_layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000,
              max_positions=4096, source=LLAMA2.format("70b")),
        published_params=68_980_000_000, source=_HF + "meta-llama/Llama-2-70b-hf (68.98B params)",
    ),
    ZooEntry(
        "llama3-8b",
        llama(name="llama3-8b", num_layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
              max_positions=8192, source=LLAMA3.format("Meta-Llama-3-8B")),
        published_params=8_030_000_000, source=_HF + "meta-llama/Meta-Llama-3-8B (8.03B params)",
    ),
    ZooEntry(
        "llama3-70b",
        llama(name="llama3-70b", num_layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256,
              max_positions=8192, source=LLAMA3.format("Meta-Llama-3-70B")),
        published_params=70_550_000_000, source=_HF + "meta-llama/Meta-Llama-3-70B (70.55B params)",
    ),
    ZooEntry(
        "llama3-405b",
        llama(name="llama3-405b", num_layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248,
              vocab=128256, max_positions=8192, source=LLAMA3.format("Llama-3.1-405B")),
        published_params=405_850_000_000, source=_HF + "meta-llama/Llama-3.1-405B (405.85B params)",
    ),
    ZooEntry(
        "mistral-7b",
        llama(name="mistral-7b", num_layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
              max_positions=32768, source="Jiang et al. 2023, arXiv 2310.06825; " + _HF + "mistralai/Mistral-7B-v0.1"),
        published_params=7_240_000_000, source=_HF + "mistralai/Mistral-7B-v0.1 (7.24B params)",
    ),
    ZooEntry(
        "mixtral-8x7b",
        llama(name="mixtral-8x7b", num_layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
              max_positions=32768, moe=MoEConfig(num_experts=8, top_k=2, expert_ffn=14336),
              source="Jiang et al. 2024, arXiv 2401.04088; " + _HF + "mistralai/Mixtral-8x7B-v0.1"),
        published_params=46_700_000_000, published_active_params=12_900_000_000,
        source=_HF + "mistralai/Mixtral-8x7B-v0.1 (46.7B params); 12.9B active per mistral.ai/news/mixtral-of-experts",
    ),
    ZooEntry(
        "mixtral-8x22b",
        # vocab 32768: the v3 tokenizer released with Mixtral-8x22B (32000 gives 140.62B, also within 0.1%)
        llama(name="mixtral-8x22b", num_layers=56, hidden=6144, heads=48, kv_heads=8, ffn=16384, vocab=32768,
              max_positions=65536, moe=MoEConfig(num_experts=8, top_k=2, expert_ffn=16384),
              source=_HF + "mistralai/Mixtral-8x22B-v0.1"),
        published_params=140_600_000_000, published_active_params=39_000_000_000,
        source=_HF + "mistralai/Mixtral-8x22B-v0.1 (140.6B params); 39B active per mistral.ai/news/mixtral-8x22b",
    ),
    ZooEntry(
        "qwen2-7b",
        # Qwen2 is the Llama layout with biases on Q, K and V only
        llama(name="qwen2-7b", num_layers=28, hidden=3584, heads=28, kv_heads=4, ffn=18944, vocab=152064,
              qkv_bias=True, max_positions=131072,
              source="Yang et al. 2024, Qwen2 Technical Report, arXiv 2407.10671; " + _HF + "Qwen/Qwen2-7B"),
        published_params=7_620_000_000, source=_HF + "Qwen/Qwen2-7B (7.62B params)",
    ),
    ZooEntry(
        "qwen3-30b-a3b",
        # config.json: head_dim 128 (wider than hidden / heads), every block a MoE block (decoder_sparse_step 1,
        # mlp_only_layers []), so intermediate_size 6144 is unused; untied embeddings.  The per-head q/k RMSNorm
        # weights (2 x 128 per block, 12,288 in all) are not modelled.
        llama(name="qwen3-30b-a3b", num_layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144,
              vocab=151936, max_positions=40960, moe=MoEConfig(num_experts=128, top_k=8, expert_ffn=768),
              source="Qwen Team 2025, Qwen3 Technical Report, arXiv 2505.09388; " + _HF + "Qwen/Qwen3-30B-A3B "
              "config.json"),
        published_params=30_500_000_000, published_active_params=3_300_000_000,
        source=_HF + "Qwen/Qwen3-30B-A3B (model card: 30.5B params, 3.3B activated)",
    ),
    ZooEntry(
        "qwen3-235b-a22b",
        # as qwen3-30b-a3b: head_dim 128, every block MoE (intermediate_size 12288 unused), untied embeddings
        llama(name="qwen3-235b-a22b", num_layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, ffn=12288,
              vocab=151936, max_positions=40960, moe=MoEConfig(num_experts=128, top_k=8, expert_ffn=1536),
              source="Qwen Team 2025, Qwen3 Technical Report, arXiv 2505.09388; " + _HF + "Qwen/Qwen3-235B-A22B "
              "config.json"),
        published_params=235_000_000_000, published_active_params=22_000_000_000,
        source=_HF + "Qwen/Qwen3-235B-A22B (model card: 235B params, 22B activated)",
    ),
    ZooEntry(
        "gpt-neox-20b",
        # RoPE on 25% of each head (no params), parallel residual (same params), untied embed_out
        gpt(name="gpt-neox-20b", num_layers=44, hidden=6144, heads=64, vocab=50432, position="rope",
            tied_embeddings=False, dropout=False,
            source="Black et al. 2022, arXiv 2204.06745; " + _HF + "EleutherAI/gpt-neox-20b"),
        published_params=20_550_000_000, source=_HF + "EleutherAI/gpt-neox-20b (20.55B params)",
    ),
    ZooEntry(
        "nemotron-4-340b",
        # Megatron GPT: LayerNorm (with its bias; no linear biases), RoPE, squared-ReLU MLP of 4h, untied
        gpt(name="nemotron-4-340b", num_layers=96, hidden=18432, heads=96, kv_heads=8, ffn=73728, vocab=256000,
            activation="squared_relu", bias=False, position="rope", max_positions=4096, tied_embeddings=False,
            dropout=False, source="NVIDIA 2024, Nemotron-4 340B Technical Report, arXiv 2406.11704 Table 1"),
        published_params=341_000_000_000,
        source="arXiv 2406.11704 (9.4B embedding + 331.6B non-embedding); " + _HF + "nvidia/Nemotron-4-340B-Base",
    ),
    ZooEntry(
        "deepseek-v3",
        # The multi-token-prediction module (11.5B more, num_nextn_predict_layers=1) is left out:
        # it is a training auxiliary that the 671B / 37B figures exclude.
        llama(name="deepseek-v3", num_layers=61, hidden=7168, heads=128, ffn=18432, vocab=129280,
              max_positions=163840,
              moe=MoEConfig(num_experts=256, top_k=8, shared_experts=1, expert_ffn=2048, first_dense_layers=3,
                            router_groups=8, router_group_topk=4),  # n_group 8, topk_group 4 (node-limited)
              mla=MLAConfig(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                            v_head_dim=128),
              source="DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv 2412.19437; "
              + _HF + "deepseek-ai/DeepSeek-V3"),
        published_params=671_000_000_000, published_active_params=37_000_000_000,
        source="arXiv 2412.19437 (671B total, 37B activated per token; MTP module excluded)",
    ),
    ZooEntry(
        "tiny-llama",
        llama(name="tiny-llama", num_layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256,
              max_positions=256, source="planner test model: small enough to run on CPU"),
        # 4 x (attention 12,352 + mlp 24,640) + embedding 16,384 + norm 64 + head 16,384
        published_params=180_800,
        source="exact count of the planner's CPU test model (Llama layout)",
    ),
    ZooEntry(
        "tiny-mixtral",
        llama(name="tiny-mixtral", num_layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256,
              max_positions=256, moe=MoEConfig(num_experts=4, top_k=2, expert_ffn=128),
              source="planner test model: tiny-llama's attention with Mixtral's routed SwiGLU experts, for CPU runs"),
        # 2 x (attention 12,352 + moe: 4 experts x 3 x 64 x 128 = 98,304, router 64 x 4 = 256, norm 64)
        # + embedding 16,384 + norm 64 + head 16,384
        published_params=254_784, published_active_params=2 * (12_352 + 2 * 24_576 + 256 + 64) + 32_832,
        source="exact count of the planner's CPU mixture-of-experts test model (Mixtral layout)",
    ),
]
