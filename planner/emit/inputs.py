"""What a launch needs that a plan does not decide: data, tokenizer, checkpoints, image, partition, steps.

Each value is a `compile` option.  One the user did not give is never filled in with a default: the
launch files read it from an environment variable (`ENV` below) and stop with a message naming that
variable when it is unset (`${PLANNER_DATA:?...}` in shell, `${PLANNER_IMAGE}` in the Kubernetes YAML,
which `envsubst` fills in; Slurm reads SBATCH_PARTITION itself).  report.md lists every input, given or
read at launch (`input_lines`).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from planner.emit.quote import comment, sh

# field -> (environment variable read at launch when the option is not given, what it is)
ENV: dict[str, tuple[str, str]] = {
    "data": ("PLANNER_DATA", "the training data, in the format of the target that reads it (report.md, Launch inputs)"),
    "tokenizer": ("PLANNER_TOKENIZER", "tokenizer name or folder the dataset was written with"),
    "checkpoint_dir": ("PLANNER_CHECKPOINTS", "folder for distributed checkpoints (saved and resumed from)"),
    "image": ("PLANNER_IMAGE", "container image with the runtime (the repository's Dockerfile builds one)"),
    "partition": ("SBATCH_PARTITION", "Slurm partition to submit to"),
    "train_steps": ("PLANNER_TRAIN_STEPS", "optimizer steps to train for"),
    "megatron_dir": ("MEGATRON_DIR", "a Megatron-LM checkout at core_v0.16.1 (the folder of pretrain_gpt.py)"),
}

# what `data` is for each target: the frameworks read different formats
DATA_FORMATS: dict[str, str] = {
    "torch": "path prefix of planner's pre-tokenized shards, PREFIX.bin + PREFIX.idx (`python -m planner.runtime.data "
             "write` makes them from text; docs/data-format.md)",
    "deepspeed": "the same PREFIX.bin + PREFIX.idx shards as the torch target (planner.runtime.deepspeed_train)",
    "megatron": "path prefix of a Megatron indexed dataset (Megatron-LM tools/preprocess_data.py writes "
                "PREFIX_text_document.bin/.idx)",
    "torchtitan": "a Hugging Face dataset name or local folder torchtitan 0.2.2's text loader reads (e.g. c4)",
    "slurm": "as for the torch target, which it runs",
    "k8s": "as for the torch target, which it runs (a path inside the container)",
}


# the inputs each target's files read (report.md lists these for the targets written)
_TRAINER = ("data", "tokenizer", "checkpoint_dir", "train_steps")
TARGET_INPUTS: dict[str, tuple[str, ...]] = {
    "torch": _TRAINER, "deepspeed": _TRAINER, "megatron": (*_TRAINER, "megatron_dir"), "torchtitan": _TRAINER,
    "slurm": (*_TRAINER, "partition"), "k8s": (*_TRAINER, "image"),
}


# what each text input may hold (checked where it enters; the emitters quote whatever they get anyway): a
# container image reference, a Slurm partition (or a comma-separated list), and paths or names of one line
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
_PARTITION = re.compile(r"[A-Za-z0-9._-]{1,64}(,[A-Za-z0-9._-]{1,64})*")
_PATH_LIMIT = 4096  # PATH_MAX
# control and format characters (NUL, newline, ESC, bidi overrides) and line or paragraph separators
_UNPRINTABLE = ("Cc", "Cf", "Cs", "Zl", "Zp")


def path_problem(value: str) -> str | None:
    """Why `value` cannot be a launch path (None when it can): it must be one line of printable characters."""
    if not value.strip():
        return "must not be empty"
    if value.startswith("-"):
        return "starts with '-', which a command line reads as an option (write ./-name for such a file)"
    if len(value) > _PATH_LIMIT:
        return f"longer than {_PATH_LIMIT} characters"
    bad = next((c for c in value if unicodedata.category(c) in _UNPRINTABLE), None)
    if bad is not None:
        return f"holds the control character '{comment(bad)}': a path is one line of printable characters"
    return None


class LaunchInputs(BaseModel):
    """Launch inputs given on the command line; None means "read from ENV[field] at launch"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data: str | None = Field(None, description="Path prefix of the pre-tokenized dataset (PREFIX.bin/.idx).")
    tokenizer: str | None = Field(None, description="Tokenizer name or folder (Hugging Face id or local path).")
    checkpoint_dir: str | None = Field(None, description="Folder for distributed checkpoints.")
    image: str | None = Field(None, description="Container image for Kubernetes.")
    partition: str | None = Field(None, description="Slurm partition.")
    train_steps: int | None = Field(None, ge=1, description="Optimizer steps to train for.")
    megatron_dir: str | None = Field(None, description="Megatron-LM checkout (core_v0.16.1) for the megatron target.")
    save_every: int = Field(1000, ge=1, description="Steps between distributed checkpoints.")

    @field_validator("data", "tokenizer", "checkpoint_dir", "megatron_dir")
    @classmethod
    def _one_line_path(cls, value: str | None) -> str | None:
        problem = None if value is None else path_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE.fullmatch(value):
            raise ValueError(f"'{comment(value)}' is not a container image reference (letters, digits and "
                             "._/:@- only, e.g. registry.example.com/planner:1.0)")
        return value

    @field_validator("partition")
    @classmethod
    def _partition_name(cls, value: str | None) -> str | None:
        if value is not None and not _PARTITION.fullmatch(value):
            raise ValueError(f"'{comment(value)}' is not a Slurm partition name (letters, digits and ._- only; "
                             "several separated by commas)")
        return value

    def shell(self, field: str) -> str:
        """A shell word for `field`: its quoted value, or a parameter expansion that stops the script with
        a message naming the variable when it is unset."""
        value = getattr(self, field)
        if value is not None:
            return sh(value)
        var, what = ENV[field]
        # the message is expanded like the rest of the double-quoted word: escape what would run or expand,
        # and the quote bash pairs inside ${...} even there
        message = "".join(f"\\{c}" if c in '\\`$"\'' else c for c in f"set {var}: {what}")
        return f'"${{{var}:?{message}}}"'

    def env_ref(self, field: str) -> str:
        """`field` for files that `envsubst` renders: its value, or ${VAR}."""
        value = getattr(self, field)
        return str(value) if value is not None else f"${{{ENV[field][0]}}}"

    def missing(self, fields: tuple[str, ...]) -> tuple[str, ...]:
        """Environment variables the launch reads because `fields` were not given."""
        return tuple(ENV[f][0] for f in fields if getattr(self, f) is None)


# targets whose launch runs the trainer from the plan folder: a relative checkpoint folder lands inside it
PLAN_RELATIVE = ("torch", "slurm")


def checkpoints_inside(inputs: LaunchInputs, out_dir: Path, targets: tuple[str, ...]) -> str | None:
    """Why the given checkpoint folder is refused: it lands inside the output folder `out_dir`, which `--force`
    replaces (a relative folder of a target run from the plan folder, or an absolute one under it); None when
    it does not, or cannot be known before launch (relative, for targets run from the launch directory)."""
    if inputs.checkpoint_dir is None:
        return None
    out = Path(out_dir).expanduser().absolute().resolve()
    given = Path(inputs.checkpoint_dir).expanduser()
    if given.is_absolute():
        where = given.resolve()
    elif any(t in PLAN_RELATIVE for t in targets):
        where = (out / given).resolve()
    else:
        return None
    if where != out and out not in where.parents:
        return None
    return (f"--checkpoint-dir {comment(inputs.checkpoint_dir)}: the checkpoints would live inside the output "
            f"folder {comment(str(out_dir))}, which planner replaces (--force); give a folder outside it, e.g. "
            "../checkpoints (the torch and Slurm launches resolve a relative folder from the plan folder)")


def input_lines(inputs: LaunchInputs, fields: tuple[str, ...]) -> list[str]:
    """Markdown bullets: each of `fields`, its given value or the variable the launch reads it from."""
    lines = []
    for field in fields:
        var, what = ENV[field]
        value = getattr(inputs, field)
        given = f"`{comment(value)}` (given)" if value is not None else f"read from `${var}` at launch (not given)"
        lines.append(f"- **{field}**: {given}: {what}")
    return lines


def inputs_section(inputs: LaunchInputs, targets: tuple[str, ...]) -> str:
    """report.md's "Launch inputs" section for the targets written ("" when none reads any)."""
    fields = tuple(dict.fromkeys(f for t in targets for f in TARGET_INPUTS.get(t, ())))
    if not fields:
        return ""
    lines = ["## Launch inputs", "",
             "What the launch files need that the plan does not decide. A value not given to `planner compile` "
             "is read from its environment variable when the files run, and the launch stops naming the "
             "variable when it is unset.", "", *input_lines(inputs, fields),
             f"- **save_every**: `{inputs.save_every}` steps between checkpoints", "",
             "What `data` is for each target written (the frameworks read different formats):", "",
             *(f"- {t}: {DATA_FORMATS[t]}" for t in targets if t in DATA_FORMATS), ""]
    return "\n".join(lines)
