"""Shell lines and launch-README text that the launch scripts share.

Both scripts run from the plan folder (report.md says so). They find their own files through the
script's folder (`here`), so relative input paths keep meaning "relative to where you launch".
"""

from __future__ import annotations

from planner.emit import optim
from planner.emit.inputs import LaunchInputs

HERE = 'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"'


def rendezvous_host(nnodes: int) -> str:
    """The rendezvous address a launch script expands: one node meets on itself (localhost unless MASTER_ADDR
    says otherwise); several need one node's address, so the script stops naming MASTER_ADDR when it is unset
    (a localhost default would leave every node waiting on itself)."""
    if nnodes == 1:
        return "${MASTER_ADDR:-localhost}"
    return "${MASTER_ADDR:?set MASTER_ADDR to the address of one of the nodes, the same on every node}"


def trainer_inputs(inputs: LaunchInputs, warmup: bool = True) -> list[str]:
    """Set data, tokenizer, checkpoint_dir, train_steps (and warmup_steps) from the launch inputs. Stop with a
    message naming the variable when one of them is unset, and with exit 2 when the step count is not a
    positive integer. A relative checkpoint folder is made absolute against the launch directory, because
    frameworks join relative folders to their own output folder."""
    return [
        f"data={inputs.shell('data')}",
        f"tokenizer={inputs.shell('tokenizer')}",
        f"checkpoint_dir={inputs.shell('checkpoint_dir')}",
        f"train_steps={inputs.shell('train_steps')}",
        'if [[ ! "$train_steps" =~ ^[1-9][0-9]*$ ]]; then',
        '  echo "launch.sh: the number of training steps must be a positive integer, not \'$train_steps\'" >&2',
        "  exit 2",
        "fi",
        'case "$checkpoint_dir" in',
        "  /*) ;;",
        '  *) checkpoint_dir="$PWD/$checkpoint_dir" ;;',
        "esac",
        *([f"warmup_steps={optim.warmup_shell('train_steps')}"] if warmup else []),
    ]


def run_on_every_node(command: str, notes: str) -> list[str]:
    """The launch README's "## Run" section for a torchrun launcher started on every node: `command`, then
    `notes` (what the script does with relative paths and extra flags)."""
    return ["## Run", "", "From the plan folder, on every node:", "", "```", command, "```", "",
            "Relative paths are read from the directory you launch in. " + notes]
