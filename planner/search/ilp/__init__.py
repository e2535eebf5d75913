"""The search's CP-SAT programs: cost tables per configuration (tables, build), bounds on them (bounds) and
the program built section by section (model)."""
