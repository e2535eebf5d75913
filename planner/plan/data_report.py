"""report.md's "Data" section: the data plan against the static layouts, and what each framework's launch
files can carry of it."""

from __future__ import annotations

from collections.abc import Callable

from planner.plan.schema import Plan

Table = Callable[..., str]  # report.md's table writer (planner.plan.report.md_table)

# What each launch target can hold of a data plan (the frameworks' own options, as of the versions the
# emitters target); the section lists them so a user knows which parts of the plan a target runs.
FRAMEWORK_NOTES = (
    ("torch", "runs the plan's sampler (planner.runtime.sampler): whole documents packed into the token budget, "
              "micro-batches balanced over the data-parallel ranks by the plan's fitted seconds, document-masked "
              "attention; on data-parallel strategies (tp = cp = pp = 1) only: it has no per-bucket "
              "context-parallel groups."),
    ("megatron", "--context-parallel-size is one degree for every sequence and its sampler hands each data-parallel "
                 "rank a contiguous slice: no per-bucket degrees, no balancing. The launch files set no packing "
                 "flags: `--reset-position-ids --reset-attention-mask` make GPTDataset build a dense seq x seq mask "
                 "per sample, attention the plan does not price (unfused, quadratic memory); variable-length "
                 "attention over packed documents (Transformer Engine's THD format, packed_seq_params) comes with "
                 "NeMo's packed datasets, not with pretrain_gpt.py's arguments."),
    ("torchtitan", "the launch files ask for the model's variable-length flavor where torchtitan has one (llama3-8b: "
                   "8B_varlen, attention under a block-causal document mask) and the plan has no context "
                   "parallelism (torchtitan's runs SDPA without the mask); one context-parallel degree for the run "
                   "and no balancing: no per-bucket degrees."),
    ("deepspeed", "no packing or variable-length attention in ds_config.json (the model code decides); "
                  "sequence parallelism (Ulysses) is one degree for the run."),
)


def _s(x: float) -> str:
    return f"{x:.3f}"


def data_section(plan: Plan, md_table: Table) -> list[str]:
    """The section's lines (none without a data plan), its tables written by `md_table`."""
    data = plan.data
    if data is None:
        return []
    lines = ["## Data", "",
             f"Profile `{data.profile}` ({data.source}): {data.sequences} sequences, {data.tokens:,} tokens per step "
             "(drawn from the profile's quantiles). Predictions of the cost model, not measurements.", "",
             f"- plan: {data.layout}, {_s(data.step_time_s)} s per step (bound {_s(data.bound_s)} s, gap "
             f"{100 * data.gap:.2f}%: the same micro-batches on the data ranks can do no better than the bound)",
             f"- best static plan on the same data: {_s(data.baseline_step_time_s)} s ({data.baseline}); "
             f"speed-up {data.speedup:.3f}x",
             f"- token budget per rank and micro-batch: {data.token_budget:,}",
             *([f"- encoders: {data.encoder_placement} (co-located: with their samples; spread: evenly over the "
                "data ranks, embeddings moved by an all-to-all)"] if data.encoder_placement else []),
             *(f"- note: {note}" for note in data.notes), ""]
    if data.buckets:
        rows = [[str(b.cp), f"{b.min_tokens:,}-{b.max_tokens:,}", str(b.sequences), f"{b.tokens:,}",
                 str(b.micro_batches)] for b in data.buckets]
        lines += [md_table(["cp", "lengths", "sequences", "tokens", "micro-batches"], rows, right=(0, 2, 3, 4)), ""]
    rows = [[x.layout, str(x.cp), _s(x.step_time_s), "yes" if x.fits else "no", f"`{x.strategy}`"]
            for x in data.static]
    lines += ["Static layouts priced (pad: one sequence per seq_len row; pack-unmasked: rows attend across "
              "documents; pack: whole documents per row, document mask):", "",
              md_table(["layout", "cp", "step s", "fits", "strategy"], rows, right=(1, 2)), "",
              "What the launch targets carry of the data plan:", ""]
    lines += [f"- {target}: {note}" for target, note in FRAMEWORK_NOTES]
    return lines + [""]
