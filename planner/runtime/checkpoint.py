"""Distributed checkpoints of the torch runtime with `torch.distributed.checkpoint` (DCP).

Layout: CHECKPOINT_DIR/step-00000100/ holds one DCP checkpoint (every rank writes its own shards; the
`.metadata` file lists them); a save goes to `.step-00000100.partial` first and is renamed once every
rank has written, so a folder named `step-N` is always complete and the latest one is where a run
resumes.  A checkpoint holds:

* `model`: every parameter by its whole-model name (`layers.3.attention.wq.weight`; wrappers' prefixes
  dropped by torch.distributed.checkpoint.state_dict), each rank its local shards (DTensor);
* `optim`: AdamW's state and parameter groups, flattened to the same names;
* `progress`: the step reached, the data position (samples the whole job consumed) and the
  learning-rate schedule's settings: the schedule is a function of the step (planner/runtime/optim.py),
  so the step restores it.

The names do not depend on the plan's layout, so DCP can also load a checkpoint into another layout.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def step_dir(root: Path, step: int) -> Path:
    """The folder of the checkpoint taken after `step` optimizer steps."""
    return root / f"step-{step:08d}"


def latest(root: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest checkpoint folder under `root`, or None."""
    found = newest_first(root)
    return found[0] if found else None


def newest_first(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint folder under `root`, the newest first."""
    if not root.is_dir():
        return []
    return sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()),
                  reverse=True)


def resume(root: Path, state: "TrainerState") -> tuple[Path | None, list[str]]:
    """Load the newest checkpoint under `root` that loads (collective): (its folder, or None when none does;
    one line per newer folder passed over and why).  A folder without `.metadata` is a save that never
    finished; one whose files do not read (truncated shards, a garbage `.metadata`) fails on every rank alike
    (DCP gathers each rank's exception and raises it on all), so every rank passes over the same folders.  A
    failed load may have overwritten some tensors: the older checkpoint that then loads writes them all."""
    skipped = []
    # DCP logs each failed read with its traceback on the root logger; the lines below say why, once
    quiet, level = logging.getLogger(), logging.getLogger().level
    quiet.setLevel(logging.CRITICAL)
    try:
        for _, folder in newest_first(root):
            if not (folder / ".metadata").is_file():
                skipped.append(f"{folder}: no .metadata (a save that did not finish)")
                continue
            try:
                load(folder, state)
            except (Exception, CheckpointException) as err:  # noqa: BLE001 (whatever a damaged file raises)
                skipped.append(f"{folder}: does not load ({_first_line(err)})")
                continue
            return folder, skipped
    finally:
        quiet.setLevel(level)
    return None, skipped


def _first_line(err: BaseException) -> str:
    """The innermost reason a load failed, on one line (DCP wraps each rank's exception with its traceback)."""
    if isinstance(err, CheckpointException) and err.failures:
        first = next(iter(err.failures.values()))
        err = first[0] if isinstance(first, tuple) else first
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:160]}" if text else type(err).__name__


class TrainerState(Stateful):
    """What a checkpoint saves and restores: the chunks' parameters, their optimizers, and `progress`."""

    def __init__(self, chunks: list[nn.Module], optimizers: list, progress: dict[str, int | float]):
        self.chunks, self.optimizers, self.progress = chunks, optimizers, progress
        self._keys: list[tuple[set[str], set[str]]] = []

    def state_dict(self) -> dict:
        model: dict = {}
        optim: dict = {}
        self._keys = []
        for chunk, optimizer in zip(self.chunks, self.optimizers):
            m, o = get_state_dict(chunk, optimizer, options=_OPTIONS)
            self._keys.append((set(m), set(o)))
            model.update(m)
            optim.update(o)
        return {"model": model, "optim": optim, "progress": dict(self.progress)}

    def load_state_dict(self, state: dict) -> None:
        # DCP filled the dicts `state_dict()` returned: hand each chunk back its own keys
        for (model_keys, optim_keys), chunk, optimizer in zip(self._keys, self.chunks, self.optimizers):
            set_state_dict(chunk, optimizer, model_state_dict={k: state["model"][k] for k in model_keys},
                           optim_state_dict={k: state["optim"][k] for k in optim_keys}, options=_OPTIONS)
        self.progress.update(state["progress"])


def save(root: Path, step: int, state: TrainerState) -> Path:
    """Write the checkpoint of `step` (collective: every rank calls it) and return its folder."""
    final = step_dir(root, step)
    partial = root / f".{final.name}.partial"
    dcp.save({"trainer": state}, checkpoint_id=str(partial))  # returns after every rank wrote and .metadata is in
    if dist.get_rank() == 0:
        if final.exists():  # a run that resumed before this step wrote it again: replace it whole
            _remove_tree(final)
        os.replace(partial, final)
    dist.barrier()
    return final


def load(folder: Path, state: TrainerState) -> None:
    """Restore `state` from the checkpoint in `folder` (collective)."""
    dcp.load({"trainer": state}, checkpoint_id=str(folder))


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()
