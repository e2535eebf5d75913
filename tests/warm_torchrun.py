"""torchrun with its ranks forked from a warm interpreter: the suite's launcher for the end-to-end runs that
test the trainers, not how processes start (tests/trainer_runs.py `launch`, the memory-fidelity bench, the
MoE placement, DLRM and DeepSpeed trainer runs).

Why.  A rank started by torchrun is a fresh interpreter that imports torch, torch.distributed's FSDP2 and
DTensor, and torch._dynamo (DTensor's constructor imports it on first use): about 4.5 CPU-seconds before
its first line of training, against about 1 for a tiny plan's training.  With 4 ranks per launch and two
cores that import is most of the suite's time.  Here torch's own torchrun does everything it does
(`torch.distributed.run.parse_args` and `config_from_args`, the elastic agent, the c10d rendezvous, the
environment each rank gets), with one change: the agent forks the ranks (`start_method="fork"`, which
torchrun offers for function entrypoints) from this process once it has imported those modules, and
each rank runs its module or script as `__main__`, as `python -m` / `python script` would.

One difference the forked rank needs: the trainers end with `planner.runtime.shutdown._leave` (`os._exit`,
so that the interpreter's finalization does not race gloo's threads).  A forked rank must instead return
to the agent's wrapper, which reports the rank's result and then leaves through multiprocessing's own
`os._exit`; so `_leave` here flushes and raises SystemExit with the same status (0 is a normal return
for torch's `record`).  Everything before it, the barrier and the groups' destruction, runs unchanged.

Three launches of the default run still start their ranks with the `torchrun` executable: the shared
pipeline run (tests/conftest.py `pipeline_run`), DLRM's torch/launch.sh (tests/test_embedding_cli.py) and
Slurm's job script (tests/test_emit_slurm.py).

Used as a program (`python tests/warm_torchrun.py TORCHRUN-ARGS`), or as `torchrun` itself on PATH
(`shim_dir`).
"""

from __future__ import annotations

import importlib
import runpy
import sys
import warnings
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve()

# imported once in the agent, before it forks: what every rank of these launches imports
WARM = ("torch", "torch.distributed.fsdp", "torch.distributed.tensor", "torch._dynamo")


def shim_dir(folder: Path) -> Path:
    """folder/torchrun: this launcher under the name launch scripts call (put the folder first on PATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "torchrun"
    shim.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(HERE)!r}, run_name='__main__')\n")
    shim.chmod(0o755)
    return folder


def command(*torchrun_args: str) -> list[str]:
    """The argv of a launch: this launcher with torchrun's arguments."""
    return [sys.executable, str(HERE), *torchrun_args]


def _leave(exit_code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(exit_code)


def _rank(target: str, is_module: bool, argv: list[str]) -> None:
    """One forked rank: the module or script as `__main__` with `argv`, leaving through SystemExit."""
    from planner.runtime import shutdown

    shutdown._leave = _leave  # noqa: SLF001 (the module docstring says why)
    sys.argv = [target, *argv]
    if is_module:
        # the agent imported the module for its imports; running it again as __main__ is what `python -m` does
        warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, str(Path(target).resolve().parent))
        runpy.run_path(target, run_name="__main__")


def main(argv: list[str]) -> None:
    import torch.distributed.run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    args = torchrun.parse_args(argv)
    config, _, _ = torchrun.config_from_args(args)
    for name in WARM:
        importlib.import_module(name)
    if args.module:
        importlib.import_module(args.training_script)  # its imports; its body runs again as __main__ per rank
    config.start_method = "fork"
    elastic_launch(config=config, entrypoint=_rank)(args.training_script, bool(args.module),
                                                    list(args.training_script_args))


if __name__ == "__main__":
    main(sys.argv[1:])
