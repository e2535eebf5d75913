"""Resuming the old run's checkpoint under the new layout, with each framework's own tools.

* torch (planner.runtime.train): nothing to convert.  Its torch.distributed.checkpoint folders name every
  tensor by its whole-model name, so the new launch.sh, pointed at the old run's checkpoint folder
  (--checkpoint-dir), resumes from the latest one there: DCP reshards on load (each rank reads the
  pieces of its new shards), optimizer state and data position included.
* DeepSpeed: `python -m deepspeed.checkpoint.ds_to_universal --input_folder CKPT/TAG --output_folder
  CKPT/TAG_universal` turns the latest checkpoint (CKPT/latest names it) into a universal checkpoint,
  which also writes CKPT/latest_universal; the new ds_config.json carries `"checkpoint":
  {"load_universal": true}`, so `engine.load_checkpoint(CKPT)` loads it under the new layout
  (`deepspeed/convert.sh`, then `deepspeed/launch.sh`).
* Megatron-LM: its `--ckpt-format torch_dist` checkpoints reshard on load.  The model's weights reshard
  over any tp, pp and dp.  The optimizer's state, as planner's args.txt saves it (Megatron-LM
  core_v0.16.1, megatron/training/checkpointing.py): a plain optimizer's state is per parameter and
  reshards over any layout; the distributed optimizer's is `dp_reshardable` (args.txt does not write
  `--dist-ckpt-optim-fully-reshardable`, whose save gathers the optimizer state over dp, memory the plan
  does not hold), which loads over a changed dp only: load_checkpoint raises "(TP, PP) mismatch ... not
  supported for DistributedOptimizer with sharding type dp_reshardable"; and the two do not load into each
  other (the distributed optimizer's state is keyed by dp group, and loading into it looks up the
  checkpoint's distrib_optim_sharding_type, which a plain optimizer's checkpoint lacks).
  `megatron/reshard.sh` runs the new launch.sh with `--ckpt-fully-parallel-load`, and adds
  `--no-load-optim --no-load-rng` when the optimizer state cannot reshard (the weights and the iteration
  resume, Adam's moments start again); FULLY_RESHARDABLE=1 keeps the optimizer state when the old run
  added `--dist-ckpt-optim-fully-reshardable` itself.
  (tools/checkpoint/convert.py converts model weights only, so it buys nothing over the resharding load.)
  A new plan that runs Megatron FSDP (zero 2/3 without pipelining: fsdp_dtensor checkpoints) from a
  torch_dist run, or the reverse, gets no megatron/ files (`megatron_format_change` says why).
"""

from __future__ import annotations

import json

from planner.emit.inputs import LaunchInputs
from planner.emit.megatron import checkpoint_format
from planner.emit.quote import comment
from planner.strategy import Strategy

DS_TO_UNIVERSAL = "deepspeed.checkpoint.ds_to_universal"


def deepspeed_convert_sh(old: Strategy, new: Strategy, inputs: LaunchInputs) -> str:
    """deepspeed/convert.sh: the old run's latest DeepSpeed checkpoint to a universal checkpoint."""
    return f"""#!/usr/bin/env bash
# Convert the old run's latest DeepSpeed checkpoint ({old.spec()})
# into a universal checkpoint that loads under the new layout ({new.spec()}).
# Run once, from the plan folder, before deepspeed/launch.sh (which loads it: ds_config.json has
# "checkpoint": {{"load_universal": true}}).
set -euo pipefail
checkpoint_dir={inputs.shell('checkpoint_dir')}
case "$checkpoint_dir" in
  /*) ;;
  *) checkpoint_dir="$PWD/$checkpoint_dir" ;;
esac
if [[ ! -f "$checkpoint_dir/latest" ]]; then
  echo "convert.sh: $checkpoint_dir/latest: no DeepSpeed checkpoint to convert" >&2
  exit 2
fi
tag="$(cat "$checkpoint_dir/latest")"
python -m {DS_TO_UNIVERSAL} \\
    --input_folder "$checkpoint_dir/$tag" \\
    --output_folder "$checkpoint_dir/${{tag}}_universal"
# ds_to_universal wrote $checkpoint_dir/latest_universal, naming the converted folder
"""


def deepspeed_universal_config(text: str) -> str:
    """ds_config.json text with `"checkpoint": {"load_universal": true}` (the emitter's JSON layout)."""
    config = json.loads(text)
    config["checkpoint"] = {**config.get("checkpoint", {}), "load_universal": True}
    return json.dumps(config, sort_keys=True, indent=2, allow_nan=False) + "\n"


def model_parallel_changed(old: Strategy, new: Strategy) -> list[str]:
    """'tp 2 -> 4'-style items for every model-parallel degree that differs (what dp-only resharding cannot do)."""
    return [f"{key} {getattr(old, key)} -> {getattr(new, key)}" for key in ("tp", "pp", "cp", "ep", "vpp")
            if getattr(old, key) != getattr(new, key)]


def optimizer_state_reshards(old: Strategy, new: Strategy) -> bool:
    """Whether Megatron loads the old run's optimizer state, as planner's args.txt saves it, under the new
    layout (module docstring): both plain optimizers, or both distributed with only dp changed."""
    if (old.zero >= 1) != (new.zero >= 1):
        return False
    return old.zero == 0 or not model_parallel_changed(old, new)


def megatron_format_change(old: Strategy, new: Strategy) -> str:
    """Why the new Megatron files cannot resume the old run: its checkpoints are in another format.  Megatron FSDP
    (zero 2/3 without pipelining) saves and loads fsdp_dtensor only; Megatron-LM core_v0.16.1 converts
    torch_dist to it with tools/checkpoint/checkpoint_inspector.py convert-torch-dist-to-fsdp-dtensor, which
    needs the map the old run writes with --dump-param-to-param-group-map (args.txt does not ask for it)."""
    return (f"the old run saved {checkpoint_format(old)} checkpoints and the new plan's Megatron files load "
            f"{checkpoint_format(new)} (Megatron FSDP is zero 2/3 without pipelining); Megatron-LM converts one "
            "into the other only with the old run's --dump-param-to-param-group-map map")


def megatron_reshard_sh(old: Strategy, new: Strategy) -> str:
    """megatron/reshard.sh: the new launch.sh with the flags of a resharding load."""
    changed = model_parallel_changed(old, new)
    restart = "the weights and the iteration resume, Adam's moments start again (--no-load-optim --no-load-rng)"
    if optimizer_state_reshards(old, new):
        why = ("# Only dp changes: torch_dist checkpoints (weights and the distributed optimizer) reshard over dp.\n"
               if old.zero >= 1 else
               "# torch_dist checkpoints reshard the weights and the plain optimizer's per-parameter state over\n"
               "# any layout.\n")
        fallback = ""
    elif (old.zero >= 1) != (new.zero >= 1):
        why = (f"# The optimizer changes (zero {old.zero} -> {new.zero}): the state of a plain optimizer and of "
               f"Megatron's\n# distributed optimizer do not load into each other, so {restart}.\n")
        fallback = "extra+=(--no-load-optim --no-load-rng)\n"
    else:
        why = (f"# The model-parallel layout changes ({', '.join(changed)}): the weights reshard on load; the\n"
               "# distributed optimizer's state saved by args.txt is dp_reshardable only, so " + restart + ".\n"
               "# Set FULLY_RESHARDABLE=1 if the old run was started with --dist-ckpt-optim-fully-reshardable\n"
               "# (not in args.txt): its optimizer state then reshards too.\n")
        fallback = ('if [[ "${FULLY_RESHARDABLE:-0}" != 1 ]]; then\n'
                    "  extra+=(--no-load-optim --no-load-rng)\n"
                    "fi\n")
    return f"""#!/usr/bin/env bash
# Resume the old run's torch_dist checkpoint ({old.spec()})
# under the new layout ({new.spec()}): Megatron reshards on load.
{why}set -euo pipefail
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
extra=(--ckpt-fully-parallel-load)
{fallback}exec "$here/launch.sh" "${{extra[@]}}" "$@"
"""


def resume_lines(targets: tuple[str, ...], old: Strategy, new: Strategy, inputs: LaunchInputs) -> list[str]:
    """report.md bullets: how each written target resumes the old run's checkpoint."""
    folder = (f"`{comment(inputs.checkpoint_dir)}`" if inputs.checkpoint_dir
              else "`$PLANNER_CHECKPOINTS` (read at launch)")
    lines = []
    if "torch" in targets:
        lines.append(f"- **torch**: run `torch/launch.sh` as before; it resumes from the latest "
                     f"`torch.distributed.checkpoint` folder in {folder}, and DCP reshards it on load into the new "
                     "layout (weights, AdamW state, step and data position).")
    if "deepspeed" in targets:
        lines.append(f"- **deepspeed**: run `bash deepspeed/convert.sh` once (DeepSpeed's `ds_to_universal` on the "
                     f"latest checkpoint in {folder}), then `bash deepspeed/launch.sh`; its ds_config.json loads "
                     "the universal checkpoint (`checkpoint.load_universal`).")
    if "megatron" in targets:
        if optimizer_state_reshards(old, new):
            extra = " Weights and optimizer state reshard."
        elif (old.zero >= 1) != (new.zero >= 1):
            extra = (" The optimizer changes between plain and distributed, so the optimizer state does not load: "
                     "weights and iteration resume, Adam restarts (`--no-load-optim`).")
        else:
            extra = (" The model-parallel degrees change and the distributed optimizer's state, as args.txt saves "
                     "it, reshards over dp only: weights and iteration resume, Adam restarts (`--no-load-optim`); "
                     "`FULLY_RESHARDABLE=1` keeps it when the old run added `--dist-ckpt-optim-fully-reshardable`.")
        lines.append(f"- **megatron**: run `megatron/reshard.sh` (the new launch.sh with `--ckpt-fully-parallel-load`; "
                     f"`--load` is {folder}, `--ckpt-format torch_dist`).{extra}")
    return lines
