"""The plan: its schema (plan.json), how a compile result becomes one (build, groups), and what is written
beside it: report.md (report), its figures (plots) and the atomic output folder (output)."""
