"""Issue #26: nothing outside planner's own files is deleted or replaced.

* `--force` replaces a folder only when everything in it is a file its planner-manifest.json lists,
  unchanged (defects 4 and 5: a folder that merely held plan.json or results.csv, checkpoints added to a
  plan folder); checkpoints are refused inside a plan folder where the launch would put them;
* `--csv`, `--trace`, `--plot`, `--memory-plot` are written as cp writes (defect 6): through a symbolic
  link, keeping the permissions of the file they replace; a FIFO, device, directory or read-only file is
  refused with one line;
* a symbolic link as the output folder, and `-o '~/x'` (defect 16).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.plan.manifest import MANIFEST

TINY = ["tiny-llama", "cpu:2", "-b", "8", "-s", "64", "--work-limit", "5"]
SWEEP = "models: [tiny-llama]\nclusters: [cpu:1]\nbatches: [8]\nseq_lens: [64]\nstrategies: [zero1]\ntime_limit: 5\n"


def run(*args, cwd: Path | None = None):
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args])
    finally:
        os.chdir(old)


def one_line(result, *fragments: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- the manifest


def test_every_output_folder_lists_its_files_with_their_hashes(tmp_path):
    assert run("compile", *TINY, "-o", tmp_path / "plan", "--target", "torch").exit_code == 0
    files = tree(tmp_path / "plan")
    manifest = json.loads(files.pop(MANIFEST))
    assert manifest["schema"] == "planner.manifest/1"
    assert manifest["files"] == {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                                 for name, data in files.items()}
    assert {"plan.json", "report.md", "torch/launch.sh"} <= set(files)


def test_force_on_a_folder_that_merely_holds_a_marker_deletes_nothing(tmp_path):
    # defect 4: mkdir -p proj/src; touch proj/results.csv proj/src/main.py; planner sweep s.yaml -o proj --force
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "results.csv").touch()
    (proj / "plan.json").touch()
    (proj / "src" / "main.py").write_text("print('mine')\n")
    before = tree(proj)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP)
    for command in (["sweep", sweep, "-o", proj, "--force", "--workers", "1"],
                    ["compile", *TINY, "-o", proj, "--force"]):
        one_line(run(*command), str(proj), "holds no planner-manifest.json", "nothing was replaced")
        assert tree(proj) == before


def test_force_on_an_earlier_plan_keeps_what_was_added_since(tmp_path):
    # defect 5: checkpoints (and any file) added to a plan folder stop the replace, named
    old = tmp_path / "old"
    assert run("compile", *TINY, "-o", old, "--target", "torch").exit_code == 0
    (old / "checkpoints" / "step-00000002").mkdir(parents=True)
    (old / "checkpoints" / "step-00000002" / "__0_0.distcp").write_bytes(b"weights")
    before = tree(old)
    one_line(run("compile", *TINY, "-o", old, "--force"),
             "checkpoints is a folder planner did not write", "nothing was replaced")
    one_line(run("replan", old / "plan.json", "cpu:1", "-o", old, "--force"), "checkpoints is a folder planner")
    assert tree(old) == before
    (old / "checkpoints" / "step-00000002" / "__0_0.distcp").unlink()
    (old / "checkpoints" / "step-00000002").rmdir()
    (old / "checkpoints").rmdir()
    (old / "report.md").write_text("my notes\n")
    one_line(run("compile", *TINY, "-o", old, "--force"), "report.md is changed since planner wrote it")
    (old / "report.md").write_bytes(before["report.md"])
    (old / "link").symlink_to(tmp_path)
    one_line(run("compile", *TINY, "-o", old, "--force"), "link is a symbolic link planner did not write")
    (old / "link").unlink()
    assert run("compile", *TINY, "-o", old, "--force").exit_code == 0  # planner's own, unchanged: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no staging or backup folder left


def test_a_deleted_file_does_not_stop_the_replace(tmp_path):
    out = tmp_path / "out"
    assert run("compile", *TINY, "-o", out).exit_code == 0
    (out / "time.png").unlink()  # nothing of the user's is lost by replacing the rest
    assert run("compile", *TINY, "-o", out, "--force").exit_code == 0 and (out / "time.png").is_file()


def test_checkpoints_are_refused_where_the_launch_would_put_them_inside_the_plan_folder(tmp_path):
    for folder in ("checkpoints", "./ckpt/run1", str(tmp_path / "plan" / "ck")):
        one_line(run("compile", *TINY, "-o", tmp_path / "plan", "--target", "torch", "--checkpoint-dir", folder),
                 "--checkpoint-dir", "inside the output folder")
    assert not (tmp_path / "plan").exists()
    # relative to the plan folder (torch): beside it is fine; megatron reads it from the launch directory
    assert run("compile", *TINY, "-o", tmp_path / "plan", "--target", "torch", "--checkpoint-dir",
               "../checkpoints").exit_code == 0
    assert run("compile", *TINY, "-o", tmp_path / "mega", "--target", "megatron", "--fix", "tp=2",
               "--checkpoint-dir", "checkpoints").exit_code == 0
    one_line(run("replan", tmp_path / "plan" / "plan.json", "cpu:1", "-o", tmp_path / "new", "--checkpoint-dir",
                 "ck"), "inside the output folder")


# ---------------------------------------------------------------- side files as cp writes them


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan"
    assert run("compile", *TINY, "-o", out).exit_code == 0
    return out / "plan.json"


@pytest.mark.parametrize("option", ["--trace", "--plot", "--memory-plot"])
def test_simulate_files_go_through_links_and_keep_permissions(tmp_path, plan_file, option):
    target = tmp_path / "real.out"
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "link.out"
    link.symlink_to(target)
    assert run("simulate", plan_file, option, link).exit_code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)  # written through, the link kept
    assert target.read_bytes() != b"old" and stat.S_IMODE(target.stat().st_mode) == 0o600
    dangling = tmp_path / "dangling.out"
    dangling.symlink_to(tmp_path / "new.out")
    assert run("simulate", plan_file, option, dangling).exit_code == 0 and (tmp_path / "new.out").is_file()


@pytest.mark.parametrize("option", ["--csv", "--plot"])
def test_compare_files_keep_permissions(tmp_path, option):
    target = tmp_path / "rows.out"
    target.write_text("old")
    target.chmod(0o640)
    result = run("compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--only", "zero1", option, target)
    assert result.exit_code == 0, result.output
    assert target.read_bytes() != b"old" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_fifo_device_directory_and_read_only_files_are_refused(tmp_path, plan_file):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read_only = tmp_path / "ro.json"
    read_only.write_text("keep")
    read_only.chmod(0o400)
    for path, fragment in ((fifo, "is not a regular file"), (Path("/dev/null"), "is not a regular file"),
                           (tmp_path, "is a directory"), (read_only, "is read-only")):
        one_line(run("simulate", plan_file, "--trace", path), str(path), fragment)
        one_line(run("compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--only", "zero1", "--csv", path),
                 fragment)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and read_only.read_text() == "keep"
    link = tmp_path / "to-fifo"
    link.symlink_to(fifo)
    one_line(run("simulate", plan_file, "--trace", link), "is not a regular file")


# ---------------------------------------------------------------- output folders: links and ~


def test_a_link_as_the_output_folder_says_so(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    link = tmp_path / "out"
    link.symlink_to(empty)
    one_line(run("compile", *TINY, "-o", link), "is a symbolic link", str(empty))
    assert list(empty.iterdir()) == [] and link.is_symlink()


def test_a_quoted_tilde_is_the_home_directory_for_the_check_and_the_write(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    assert run("compile", *TINY, "-o", "~/x", cwd=work).exit_code == 0
    assert (home / "x" / "plan.json").is_file() and not (work / "~").exists()
