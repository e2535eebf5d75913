"""Comparisons on one cost model: the baselines (ddp, ZeRO, Megatron's recipe, uniform-pp, Metis-style), the
table of every strategy on a job (table) and its bar charts (plots)."""
