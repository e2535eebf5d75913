"""The search: the strategy space (space), the cost tables and CP-SAT programs (ilp/), branch and bound with a
certificate (compile), replica groups on mixed clusters (groups), and the exhaustive oracle and explanations."""
