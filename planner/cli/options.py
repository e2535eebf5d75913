"""Shared option decorators and the mapping from library errors to exit codes.

Commands stack these instead of repeating options (sqlite-utils style)::

    @json_option
    @job_options
    def estimate(..., batch, seq_len, precision, flash_attention, as_json): ...

Library errors are typed; `user_errors` turns them into one-line
`Error: ...` messages with the exit codes of docs/design.md: 2 for bad input
(ModelInputError, HardwareInputError, PlannerInputError, pydantic
ValidationError), 1 for infeasible jobs (InfeasibleError).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from hardware import HardwareInputError
from models import ModelInputError
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import MAX_COUNT  # batch and sequence length: the search counts in 64-bit integers
from planner.cli.text import one_line
from planner.plan.output import refuse_unsafe_path

PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8")


class InputError(click.ClickException):
    """Bad input (model, cluster, strategy, job): `Error: <message>`, exit code 2."""

    exit_code = 2


class Infeasible(click.ClickException):
    """The job cannot run as asked: `Error: <message>`, exit code 1."""

    exit_code = 1


def validation_message(err: ValidationError) -> str:
    """A pydantic error as 'field.path: message; ...' on one line."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return f"{err.title}: {'; '.join(parts)}"


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body, mapping typed library errors to click exceptions."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ModelInputError, HardwareInputError, PlannerInputError) as err:
            raise InputError(one_line(str(err))) from None
        except ValidationError as err:
            raise InputError(one_line(validation_message(err))) from None
        except InfeasibleError as err:
            raise Infeasible(one_line(str(err))) from None

    return wrapper


MAX_STEP_TIME_S = 1e7  # --max-step-time: 115 days a step; the search counts nanoseconds in 64-bit integers


def finite_seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Callback of --time-limit and the like: a finite number of seconds (plan.json records it; JSON has no
    infinity)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"expected a finite number of seconds, got {value}; for a long search give a "
                                 "large one, e.g. 86400", ctx=ctx, param=param)
    return value


def finite_number(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Callback of float options: nan and infinity pass click's FloatRange, and are no number of anything."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"expected a finite number, got {value}", ctx=ctx, param=param)
    return value


def note_default_runtime(job: Any, runtime: str | None) -> None:
    """On stderr, why the job runs under another runtime than planner's own when no --runtime was named (a
    mixture-of-experts model: megatron); recommendation models have no runtime profile."""
    if runtime or job.model.family == "recsys":
        return
    from planner import api  # the solver and emitters load with the commands that use them, not with `show`

    note = api.default_runtime(job)[1]
    if note:
        click.echo(f"note: {note}", err=True)


def emit_json(data: Any) -> None:
    """Print `data` as the commands' --json output: indented JSON, one document."""
    click.echo(json.dumps(data, indent=2))


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--json`: print the result as JSON (SI units) instead of text; passed as `as_json`."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (SI units) instead of text.")(func)


def job_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The job's batch, sequence length, precision, attention kernel and MoE routing (estimate, compile, compare)."""
    decorators = [
        click.option("--batch", "-b", type=click.IntRange(min=1, max=MAX_COUNT), required=True,
                     help="Global batch in sequences (samples for recsys models) per optimizer step."),
        click.option("--seq-len", "-s", type=click.IntRange(min=1, max=MAX_COUNT), required=True,
                     help="Tokens per sequence (1 for recsys models)."),
        click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True,
                     help="bf16/fp16 mixed precision, fp8 GEMMs with bf16 elsewhere, or mxfp8 (block-scaled "
                          "FP8 GEMMs, Blackwell: b200, gb200)."),
        click.option("--flash-attention/--no-flash-attention", default=True, show_default=True,
                     help="Fused flash attention (no s^2 score tensors); off for 2021-22 era kernels."),
        click.option("--fp8-params", is_flag=True, default=False,
                     help="With --precision fp8 or mxfp8: the weights are FP8 tensors (Megatron --fp8-param-gather, "
                     "NeMo's FP8 recipes), so no FP8 weight copies sit beside 16-bit ones."),
        click.option("--moe-routing", type=click.Choice(["learned", "balanced"]), default="learned",
                     show_default=True,
                     help="Mixture-of-experts models: learned routing (the busiest expert rank waits on "
                     "moe_routing_imbalance x the mean) or balanced (forced, as published MoE benchmarks run)."),
        click.option("--routing", "routing", type=click.UNPROCESSED, default=None, metavar="FILE",
                     help="Mixture-of-experts models: per-layer expert loads (YAML/JSON, `planner schema routing`; "
                     "examples/routing/): experts and their replicas are placed per expert-parallel degree and the "
                     "busiest rank replaces the moe_routing_imbalance constant."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def data_profile_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--data-profile FILE: sample lengths (and modalities) of the training data (planner.data.profile), passed
    as `data_profile`."""
    return click.option("--data-profile", "data_profile", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, metavar="FILE",
                        help="Histogram of sample lengths (YAML/JSON, `planner schema data-profile`): plan packing, "
                             "per-bucket context parallelism and balancing for it, against the best static plan "
                             "on the same data.")(func)


def runtime_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--runtime NAME: the framework profile (hardware/data/runtimes) a command costs under."""
    from planner.profile import runtime_names

    return click.option("--runtime", "runtime", type=click.Choice(runtime_names()), default=None, metavar="NAME",
                        help=help_text + f" ({', '.join(runtime_names())})")


def memory_margin_option(default: float | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--memory-margin FRACTION: the share of HBM every plan leaves free (Job.memory_margin); default None:
    constants.yaml's memory_margin_default, the cost model's measured memory error."""
    shown = "the measured memory error, memory_margin_default in hardware/data/constants.yaml" if default is None \
        else f"{default:g}"
    return click.option("--memory-margin", "memory_margin", type=click.FloatRange(min=0.0, max=1.0, max_open=True),
                        default=default, metavar="FRACTION",
                        help=f"Share of each GPU's HBM a plan must leave free (default: {shown}).")


def output_dir_path(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """Callback of `-o DIR` options: the raw value checked before click turns '' into '.'; a leading `~` is the
    home directory, for the check and the write alike (a shell leaves a quoted '~/x' to us)."""
    if value is None:
        return None
    try:
        refuse_unsafe_path(value)
    except PlannerInputError as err:
        raise click.BadParameter(str(err).removeprefix("output directory "), ctx=ctx, param=param) from None
    return Path(value).expanduser()


def launch_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What the launch files need that the plan does not decide (planner.emit.inputs.LaunchInputs), passed to
    the command as `inputs`; one not given is read from its environment variable at launch."""
    from planner.emit.inputs import ENV, LaunchInputs

    def env(field: str) -> str:
        return f"(default: ${ENV[field][0]} at launch)"

    decorators = [
        click.option("--data", "data", default=None, metavar="PATH",
                     help=f"Training data in the target's format (report.md says which) {env('data')}."),
        click.option("--tokenizer", default=None, metavar="NAME",
                     help=f"Tokenizer the dataset was written with {env('tokenizer')}."),
        click.option("--checkpoint-dir", default=None, metavar="DIR",
                     help="Distributed checkpoints: saved every --save-every steps, resumed from "
                          f"{env('checkpoint_dir')}."),
        click.option("--save-every", type=click.IntRange(min=1), default=1000, show_default=True, metavar="STEPS",
                     help="Steps between checkpoints."),
        click.option("--train-steps", type=click.IntRange(min=1), default=None, metavar="STEPS",
                     help=f"Optimizer steps to train for {env('train_steps')}."),
        click.option("--image", default=None, metavar="IMAGE",
                     help=f"Container image for Kubernetes {env('image')}."),
        click.option("--partition", default=None, metavar="NAME",
                     help=f"Slurm partition {env('partition')}."),
        click.option("--megatron-dir", default=None, metavar="DIR",
                     help=f"Megatron-LM checkout for the megatron target {env('megatron_dir')}."),
    ]
    fields = ("data", "tokenizer", "checkpoint_dir", "save_every", "train_steps", "image", "partition", "megatron_dir")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            kwargs["inputs"] = LaunchInputs(**{field: kwargs.pop(field) for field in fields})
        except ValidationError as err:  # the first bad value, named by its option
            first = err.errors()[0]
            option = "--" + str(first["loc"][0]).replace("_", "-")
            raise click.BadParameter(first["msg"].removeprefix("Value error, "), param_hint=option) from None
        return func(*args, **kwargs)

    for decorator in reversed(decorators):
        wrapper = decorator(wrapper)
    return wrapper
