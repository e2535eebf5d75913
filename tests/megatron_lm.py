"""Megatron-LM core_v0.16.1's own argument parser, run on CPU on the arguments planner writes.

`pretrain_gpt.py` hands its command line to `megatron.training.arguments.parse_args` and `validate_args`
(through `initialize_megatron`). That package is Megatron-LM's, not megatron-core's: the six files it
needs to parse are vendored unmodified under tests/data/megatron_lm_core_v0.16.1/ (README.md there) and
run against the installed megatron-core 0.16.1.

Stubbed (`parser_module`), because importing them pulls in the trainer and parsing never calls them:
* the package `megatron.training` itself: its __init__.py imports initialize.py and training.py (the
  tokenizers, datasets, checkpointing). A bare package object whose path is the vendored folder stands in,
  carrying the three getters utils.py imports from it (get_args, get_timers, get_adlr_autoresume);
* `megatron.legacy.model.module` (utils.py imports param_is_not_shared; megatron.legacy is not in the
  megatron-core wheel).
Each stub raises if called.

What cannot run without a GPU, and what stands in (`validate`, `transformer_config`):
* `get_device_arch_version()` (torch.cuda.get_device_properties) answers the plan's GPU architecture, so
  the CUDA_DEVICE_MAX_CONNECTIONS rule for tp or cp > 1 runs on launch.sh's environment;
* `torch.cuda.get_device_capability()`, asked under --moe-grouped-gemm, answers the same GPU;
* `core_transformer_config_from_args` runs with apply_rope_fusion off: megatron-core's TransformerConfig
  refuses the rope fusion without Transformer Engine (pretrain_gpt.py leaves it on unless --no-rope-fusion).
Not run: what initialize_megatron does after validate_args besides the micro-batch calculator (the
tokenizer, which needs the Hugging Face model files; torch.distributed and NCCL; the model and data).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import io
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import Iterator
from unittest import mock

VENDORED = Path(__file__).parent / "data" / "megatron_lm_core_v0.16.1"
# pretrain_gpt.py (core_v0.16.1, line 347) passes these defaults to validate_args
PRETRAIN_GPT_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}
# CUDA compute capability (major) of the catalog's GPUs, by device-name prefix: NVIDIA's "CUDA GPUs"
# table (developer.nvidia.com/cuda-gpus): A100 8.0, H100/H200 9.0, B200 and GB200 10.0. The cpu presets, which
# Megatron cannot run on, are checked as Hopper.
GPU_ARCH = {"a100": 8, "h100": 9, "h200": 9, "b200": 10, "gb200": 10, "cpu": 9}
_STUBS = ("megatron.training", "megatron.legacy", "megatron.legacy.model", "megatron.legacy.model.module")


def _not_for_parsing(*_args, **_kwargs):
    raise RuntimeError("a stub of tests/megatron_lm.py: parsing arguments should not call it")


@contextlib.contextmanager
def parser_module() -> Iterator[types.ModuleType]:
    """megatron.training.arguments of the vendored Megatron-LM, with the stubs above; sys.modules is
    restored on exit."""
    before = set(sys.modules)
    package = types.ModuleType("megatron.training")
    package.__path__ = [str(VENDORED / "megatron" / "training")]
    package.get_args = package.get_timers = package.get_adlr_autoresume = _not_for_parsing
    legacy = {name: types.ModuleType(name) for name in _STUBS[1:]}
    for module in legacy.values():
        module.__path__ = []
    legacy["megatron.legacy.model.module"].param_is_not_shared = _not_for_parsing
    sys.modules.update({"megatron.training": package, **legacy})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
            arguments = importlib.import_module("megatron.training.arguments")
        yield arguments
    finally:
        for name in set(sys.modules) - before:
            if name.startswith(("megatron.training", "megatron.legacy")):
                del sys.modules[name]


class ArgparseError(AssertionError):
    """Megatron's parser refused the command line (argparse's last line: the unknown or malformed argument)."""


def parse(mlm: types.ModuleType, argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    """Megatron's parse_args(ignore_unknown_args=False) on `argv` as pretrain_gpt.py receives it; `env` is the
    whole process environment (launch.sh's, with the RANK and WORLD_SIZE torchrun exports)."""
    stderr = io.StringIO()
    with mock.patch.object(sys, "argv", ["pretrain_gpt.py", *argv]), mock.patch.dict(os.environ, env, clear=True), \
            contextlib.redirect_stderr(stderr):
        try:
            return mlm.parse_args(None, ignore_unknown_args=False)
        except SystemExit:
            raise ArgparseError(stderr.getvalue().strip().splitlines()[-1]) from None


def gpu_arch(device: str) -> int:
    """CUDA compute-capability major of a catalog device name (h100-sxm -> 9)."""
    return next(arch for prefix, arch in GPU_ARCH.items() if device.lower().startswith(prefix))


def validate(mlm: types.ModuleType, args: argparse.Namespace, env: dict[str, str], arch: int) -> argparse.Namespace:
    """Megatron's validate_args with pretrain_gpt.py's defaults, on GPU architecture `arch`, with `env` as the
    whole process environment; returns the namespace it completed (dp, vpp, dtypes, ...)."""
    import torch

    with mock.patch.object(mlm, "get_device_arch_version", lambda: arch), \
            mock.patch.object(torch.cuda, "get_device_capability", lambda *_: (arch, 0)), \
            mock.patch.dict(os.environ, env, clear=True), \
            contextlib.redirect_stdout(io.StringIO()):  # validate_args prints every argument
        mlm.validate_args(args, dict(PRETRAIN_GPT_DEFAULTS))
    return args


def transformer_config(mlm: types.ModuleType, args: argparse.Namespace):
    """megatron-core's TransformerConfig as Megatron-LM builds it from the validated arguments
    (core_transformer_config_from_args), rope fusion off (module docstring)."""
    cpu = copy.copy(args)
    cpu.apply_rope_fusion = False
    return mlm.core_transformer_config_from_args(cpu)


def num_microbatches(args: argparse.Namespace) -> int:
    """Micro-batches per step from megatron-core's calculator, set up as set_global_variables does."""
    from megatron.core import num_microbatches_calculator as calc

    calc.init_num_microbatches_calculator(args.rank, args.rampup_batch_size, args.global_batch_size,
                                          args.micro_batch_size, args.data_parallel_size,
                                          args.decrease_batch_size_if_needed)
    try:
        return calc.get_num_microbatches()
    finally:
        calc.destroy_num_microbatches_calculator()


# ---------------------------------------------------------------- running the emitted scripts

@dataclasses.dataclass
class Launch:
    """What a megatron/ script handed torchrun: torchrun's own options, pretrain_gpt.py's arguments, and
    torchrun's environment."""

    run: subprocess.CompletedProcess
    plan_dir: Path
    torchrun: list[str]
    script: str
    args: list[str]
    env: dict[str, str]

    def option(self, name: str) -> str:
        """A torchrun option's value (--nnodes -> '2')."""
        return self.torchrun[self.torchrun.index(name) + 1]

    @property
    def world_size(self) -> int:
        """WORLD_SIZE torchrun exports: nodes x processes per node."""
        return int(self.option("--nnodes")) * int(self.option("--nproc-per-node"))


def run_script(root: Path, files: dict[str, str], env: dict[str, str], *extra: str,
               script: str = "launch.sh") -> Launch:
    """bash megatron/SCRIPT from a plan folder under `root` holding `files` in megatron/, with a torchrun
    that prints its arguments one per line and saves its environment."""
    plan_dir, bin_dir = root / "plan", root / "bin"
    (plan_dir / "megatron").mkdir(parents=True)
    bin_dir.mkdir()
    for name, text in files.items():
        (plan_dir / "megatron" / name).write_text(text)
        if name.endswith(".sh"):
            (plan_dir / "megatron" / name).chmod(0o755)  # as planner/plan/output.py writes scripts
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(f'#!/usr/bin/env bash\nenv -0 > "{bin_dir}/env"\nprintf "%s\\n" "$@"\n')
    torchrun.chmod(0o755)
    (plan_dir / "(03+158)").write_text("")  # a file the MoE pattern ([0]*3+[1]*58) would glob to
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(root), "MASTER_ADDR": "node0"}
    run = subprocess.run(["bash", f"megatron/{script}", *extra], cwd=plan_dir, env={**base, **env},
                         capture_output=True, text=True)
    words = run.stdout.splitlines()
    at = next((i for i, word in enumerate(words) if word.endswith("/pretrain_gpt.py")), len(words))
    saved = bin_dir / "env"
    environment = dict(item.split("=", 1) for item in saved.read_text().split("\0") if "=" in item) \
        if saved.exists() else {}
    return Launch(run=run, plan_dir=plan_dir, torchrun=words[:at], script=(words[at:] or [""])[0],
                  args=words[at + 1:], env=environment)
