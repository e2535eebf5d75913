"""No input or signal costs the user data: unsafe output paths, --force on foreign folders, racing runs,
unwritable side files, and Ctrl-C / SIGTERM at any moment of a compile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.plan import output
from planner.cli import cli
from planner.errors import PlannerInputError
from planner.plan.output import write_outputs

TINY = ["tiny-llama", "dgx-h100:1", "-b", "8", "-s", "256"]
ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd: Path | None = None):
    if cwd is None:
        return CliRunner().invoke(cli, [str(a) for a in args])
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args])
    finally:
        os.chdir(old)


def _one_error_line(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def _user_files(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "thesis.tex").write_text("years of work")
    return folder


# ---------------------------------------------------------------- unsafe paths


@pytest.mark.parametrize("path", ["", ".", "./", "..", "/"])
def test_unsafe_output_paths_are_refused_and_nothing_is_deleted(tmp_path, path):
    home = _user_files(tmp_path / "work")
    result = run("compile", *TINY, "-o", path, "--force", cwd=home)
    _one_error_line(result, "-o")
    assert (home / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in home.iterdir()) == ["thesis.tex"]


def test_home_directory_and_repository_root_are_refused(tmp_path, monkeypatch):
    home = _user_files(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    _one_error_line(run("compile", *TINY, "-o", "~", "--force"), "home directory")
    _one_error_line(run("compile", *TINY, "-o", home, "--force"), "home directory")
    repo = _user_files(tmp_path / "repo")
    (repo / ".git").mkdir()
    _one_error_line(run("compile", *TINY, "-o", repo, "--force"), "git repository")
    _one_error_line(run("compile", *TINY, "-o", ROOT, "--force"), "-o")  # this checkout (also the cwd here)
    assert (home / "thesis.tex").exists() and (repo / "thesis.tex").exists()


def test_force_replaces_only_what_planner_wrote(tmp_path):
    foreign = _user_files(tmp_path / "results")
    _one_error_line(run("compile", *TINY, "-o", foreign, "--force"), "holds no planner-manifest.json")
    assert sorted(p.name for p in foreign.iterdir()) == ["thesis.tex"]
    out = tmp_path / "plan"
    assert run("compile", *TINY, "-o", out).exit_code == 0
    assert run("compile", *TINY, "-o", out, "--force").exit_code == 0  # planner's own: replaced
    assert (out / "plan.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan", "results"]  # nothing left beside


def test_a_folder_that_appears_during_the_write_is_never_replaced(tmp_path, monkeypatch):
    # Two runs racing for one new folder: the check passed before the other run created it.
    out = tmp_path / "out"
    real = output._write_file

    def other_run_wins(target, content):
        if not out.exists():
            _user_files(out)
        real(target, content)

    monkeypatch.setattr(output, "_write_file", other_run_wins)
    with pytest.raises(PlannerInputError, match="appeared while planner was working"):
        write_outputs(out, {"plan.json": "{}"})
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left


def test_racing_forced_run_does_not_replace_a_foreign_folder(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write_outputs(out, {"plan.json": "{}"})
    real = output._write_file

    def user_swaps_in_own_folder(target, content):
        if (out / "plan.json").exists():
            (out / "plan.json").unlink()
            (out / "thesis.tex").write_text("years of work")
        real(target, content)

    monkeypatch.setattr(output, "_write_file", user_swaps_in_own_folder)
    with pytest.raises(PlannerInputError, match="thesis.tex is not written by planner; nothing was replaced"):
        write_outputs(out, {"plan.json": "{}"}, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["planner-manifest.json", "thesis.tex"]


# ---------------------------------------------------------------- side files


@pytest.mark.parametrize("option", ["--csv", "--plot"])
def test_unwritable_compare_files_are_one_line(tmp_path, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = run("compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--only", "zero1", option,
                 blocker / "out.file")
    _one_error_line(result, str(blocker))
    result = run("compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--only", "zero1", option, tmp_path)
    _one_error_line(result, "directory")


@pytest.mark.parametrize("option", ["--trace", "--plot", "--memory-plot"])
def test_unwritable_simulate_files_are_one_line(tmp_path, option):
    out = tmp_path / "plan"
    assert run("compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "-o", out).exit_code == 0
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = run("simulate", out / "plan.json", option, blocker / "x")
    _one_error_line(result, str(blocker))


def test_write_file_maps_os_errors_to_one_line(tmp_path):
    with pytest.raises(PlannerInputError, match="cannot write"):
        output.write_file(Path("/proc/planner-test/x.csv"), "a")
    target = tmp_path / "x.csv"
    output.write_file(target, "a,b\n")
    assert target.read_text() == "a,b\n" and sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]


# ---------------------------------------------------------------- signals


def _default_sigint() -> None:
    # A shell that starts the suite in the background hands its children SIGINT ignored, and Python then
    # never installs its handler: give the child the disposition a terminal's Ctrl-C meets.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _holding_signals(pid: int) -> bool:
    """Whether process `pid` has SIGINT blocked (the command line holds it while its modules import)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    blocked = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return bool(blocked >> (signal.SIGINT - 1) & 1)


def _interrupt(tmp_path: Path, delay: float | str, signum: int) -> tuple[int, str]:
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "planner", "compile", "llama3-70b", "dgx-h100:4", "-b", "256",
                             "-s", "4096", "-o", str(out)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    if delay == "imports":
        # while the modules import, whatever the machine's load: a fixed delay landed in the interpreter's
        # own start-up (before any planner code runs) when the machine was busy
        deadline = time.monotonic() + 60
        while not _holding_signals(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
    else:
        time.sleep(delay)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "out")
    assert left == [], left  # no staging folder, no moved-aside folder
    if out.exists():  # the whole output: a signal during the write is delivered once the folder is in place
        assert (out / "plan.json").is_file() and (out / "report.md").is_file()
    else:
        assert proc.returncode != 0
    return proc.returncode, err


# 3.0 and 6.0 s land between the others (each run holds a worker for its delay): `-m long` adds them
@pytest.mark.parametrize("delay", ["imports", 1.5, pytest.param(3.0, marks=pytest.mark.long), 4.5,
                                   pytest.param(6.0, marks=pytest.mark.long)])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_interrupt_at_any_moment_leaves_nothing_half_written(tmp_path, delay, signame):
    # "imports" lands while the modules import (the signals held), later ones during the searches (the
    # CP-SAT solves must not take SIGINT's handler away) or the write.
    code, err = _interrupt(tmp_path, delay, getattr(signal, signame))
    assert "Traceback" not in err, err
    expected = 130 if signame == "SIGINT" else 143
    assert code in (0, expected), (code, err)
    if code == expected:
        lines = err.strip().splitlines()
        # one error line, after any notes the command printed before the signal came
        assert lines[-1].startswith("Error: interrupted") and all(x.startswith("note: ") for x in lines[:-1]), err


def test_sigint_still_reaches_python_after_a_cp_sat_solve():
    # CP-SAT restores SIG_DFL after a solve unless told not to catch SIGINT; then Ctrl-C killed the process
    # outright, skipping the cleanup of the staging folder.
    code = ("import os, signal\n"
            "from planner.cli import cli\n"
            "cli.main(['compile', 'tiny-llama', 'cpu:1', '-b', '8', '-s', '64'], standalone_mode=False)\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    import time; time.sleep(5)\n"
            "except KeyboardInterrupt:\n"
            "    print('caught')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          preexec_fn=_default_sigint)
    assert done.returncode == 0 and done.stdout.strip().endswith("caught"), (done.returncode, done.stderr[-2000:])


def test_an_interrupt_inside_pydantic_serialization_is_an_interrupt():
    # a Ctrl-C that lands while pydantic-core serializes (planner.cost.stage.layer_key in the search) reaches us as
    # a PydanticSerializationError holding only its text; it must still end as an interrupt, not a traceback
    from pydantic import BaseModel, field_serializer

    from planner.cli.signals import Interrupted, _interrupt_inside

    class Slow(BaseModel):
        x: int = 1

        @field_serializer("x")
        def _x(self, value: int) -> int:
            raise self.signal

    for raised, code in ((KeyboardInterrupt(), 130), (Interrupted("SIGTERM", 143), 143)):
        model = Slow()
        object.__setattr__(model, "signal", raised)
        with pytest.raises(Exception) as caught:
            model.model_dump_json()
        found = _interrupt_inside(caught.value)
        assert found is not None and found.exit_code == code
    assert _interrupt_inside(ValueError("unrelated")) is None
