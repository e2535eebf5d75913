"""The plan: its schema (plan.json), how a compile result becomes one (assemble: build for one strategy,
replica_groups for groups), and what is written beside it: report.md (report), its figures (plots) and the
atomic output folder (output)."""
