"""Mixture-of-experts routing statistics (`--routing FILE`) and the expert placements costed from them.

`stats` holds the input (measured per-layer expert shares or a named synthetic skew) and its loader;
`placement` places the experts and their replicas on the expert-parallel ranks: Megatron's contiguous order,
DeepSeek's EPLB (re-implemented from deepseek-ai/EPLB's eplb.py) and planner's own CP-SAT program.  The
package imports nothing eagerly: the solver loads when a placement is first asked for.
"""
