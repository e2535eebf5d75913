"""`planner sweep`: a grid of scenarios x strategies scored in parallel, written as CSV, plots and a summary.

scenarios.py (the sweep file and its expansion), tasks.py (one task, picklable),
executors.py (local processes or Ray), results.py (CSV and summary text),
plots.py (scaling plots), progress.py (the stderr progress bar), run.py (the pipeline).
"""
