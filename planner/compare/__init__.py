"""Comparisons of strategies on one job: the baselines (ddp, ZeRO, Megatron's recipe, uniform-pp, Metis-style), each
costed under its framework's runtime profile or the job's, the table of every strategy (table) and its bar charts
(plots)."""
