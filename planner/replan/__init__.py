"""Re-planning when the allocation changes (`planner replan`): a new plan for the new cluster chosen by
migration time + steps left x step time, the state migration between the layouts, and the commands that
resume the old run's checkpoint under the new layout.

layout      where each rank sits and which share of each layer's state it holds
nodes       which old node is which new node
migration   the moves from the old layout to a new one, their links and time (migration.json)
candidates  the compile, the candidates, the choice and its certificate
convert     resuming the checkpoint per target (DCP, DeepSpeed universal checkpoints, Megatron torch_dist)
report      report.md of a re-plan
output      every file a re-plan writes
"""
