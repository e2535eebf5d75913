"""The `planner` command group: parse arguments, call the library, print.

Exit codes (docs/design.md): 0 success, 1 infeasible (does not fit, no legal
strategy), 2 bad usage or input.  Every error is one `Error: ...` line on
stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from planner.version import __version__
from planner.cli.signals import interrupted_by_sigint
from planner.cli.text import one_line, printable

# Each command: (its module, the click command there, the first sentence of its help).  A command's module is
# imported when the command runs, so `planner --help` and `planner show` do not load the solver, the cost model
# or matplotlib; tests/test_cli.py holds each summary to the command's own docstring.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "compare": ("compare_cmd", "compare_", "Score every applicable strategy on one job: step time, tokens/s per GPU, "
                "MFU, memory, fit, planning time."),
    "compile": ("compile_cmd", "compile_", "Search every strategy for the fastest (or cheapest) plan that fits, with "
                "a certificate."),
    "estimate": ("estimate_cmd", "estimate", "Score one strategy: step time, throughput, MFU, memory per stage, time "
                 "breakdown."),
    "list": ("inspect_cmd", "list_", "List the model zoo or the hardware catalog (devices and node presets)."),
    "replan": ("replan_cmd", "replan_", "Re-plan a compiled job for a changed allocation (lost nodes, a new pool)."),
    "schema": ("compile_cmd", "schema", "Print the JSON Schema of plan.json, a model graph, a cluster file, a data "
               "profile or a routing file."),
    "show": ("inspect_cmd", "show", "Summarise a model (zoo name or file) or a cluster (PRESET:NODES, preset, or "
             "file)."),
    "simulate": ("simulate_cmd", "simulate_", "Simulate one training step of a compiled plan, event by event, and "
                 "compare it with the analytic model."),
    "sweep": ("sweep_cmd", "sweep_", "Score every strategy on a grid of models x clusters x batch sizes x sequence "
              "lengths."),
}


def summary_at(name: str, width: int) -> str:
    """The command's summary as click shortens a command's help to `width` characters."""
    return click.Command(name, help=COMMANDS[name][2]).get_short_help_str(width)


def load_command(name: str) -> click.Command:
    """The click command `name` (a key of COMMANDS), its module imported now."""
    module, attribute, _ = COMMANDS[name]
    return getattr(importlib.import_module(f"planner.cli.{module}"), attribute)


class PlannerGroup(click.Group):
    """A click group whose usage errors are one `Error: ...` line, like the library's."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:
            err.show()  # bare `planner`: the help text
            sys.exit(err.exit_code)
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
            click.echo(f"Error: {one_line(err.format_message())}{hint}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            # what err.show() prints (click's message is final), made printable: an Infeasible explanation keeps
            # its lines
            click.echo(f"Error: {printable(err.format_message())}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own listing, from the summaries: loading every command for its help would import them all
        width = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, summary_at(name, width)) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # click would turn it into Abort after printing an empty line; the entry point prints one line
            raise interrupted_by_sigint() from None


@click.group(cls=PlannerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="planner")
def cli() -> None:
    """Plan distributed training: score strategies for a model on a cluster.

    MODEL is a zoo name (see `planner list models`), a model spec file
    (YAML/JSON, examples/models/) or a Hugging Face config.json.  CLUSTER is
    PRESET:NODES (see `planner list hardware`) or a cluster YAML file
    (examples/clusters/).  Exit codes: 0 ok, 1 infeasible, 2 bad input.

    \b
    Example:
        planner estimate llama3-8b dgx-h100:1 --batch 8 --seq-len 8192 \\
            --strategy tp=2,sp=on,zero=3
    """
