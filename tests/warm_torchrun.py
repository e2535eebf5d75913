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

The warm interpreter is kept between launches.  Importing those modules costs each launch about 4.5
CPU-seconds; the multiprocess tests run one after another on one xdist worker (tests/conftest.py), and
that worker starts one server (`start_server`: the modules imported once, a Unix socket named by
$PLANNER_WARM_TORCHRUN).  A launch then sends the server its arguments, environment, working folder and
standard streams (`socket.send_fds`); the server forks, the child becomes the launch (its own session,
so the client's SIGINT/SIGTERM reach the agent and its ranks together) and the client exits with the
child's status.  A client that goes away (a test's timeout kills it) takes the child with it.  Without a
server, or when it cannot be reached, the launch imports the modules itself as above.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve()

# imported once in the agent, before it forks: what every rank of these launches imports
WARM = ("torch", "torch.distributed.fsdp", "torch.distributed.tensor", "torch._dynamo")
# the server also imports torchrun's own modules and the trainer most launches run
SERVED = (*WARM, "torch.distributed.run", "torch.distributed.launcher.api", "planner.runtime.train")
ADDRESS = "PLANNER_WARM_TORCHRUN"  # the environment variable naming the server's socket
REFUSED = b"refused"  # the server's answer to a launch it does not run
# seconds after which each rank of a launch prints every thread's Python stack to its stderr, once (faulthandler;
# the rank goes on): a launch that hangs until its test's timeout then says where its ranks waited.  Armed in the
# ranks only: an agent that armed it would fork its ranks with the timer's thread holding faulthandler's lock
HANG_DUMP = "PLANNER_TEST_HANG_DUMP_S"
HANG_DUMP_S = "150"  # the suite's (start_server); a launch takes 3-30 s, its tests' timeouts are 240-300 s


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


def _dump_stacks_if_hung() -> None:
    """Arm faulthandler's one-shot stack dump in this rank when $PLANNER_TEST_HANG_DUMP_S asks for it."""
    seconds = os.environ.get(HANG_DUMP)
    if seconds:
        faulthandler.dump_traceback_later(float(seconds), exit=False)


def _rank(target: str, is_module: bool, argv: list[str]) -> None:
    """One forked rank: the module or script as `__main__` with `argv`, leaving through SystemExit."""
    from planner.runtime import shutdown

    _dump_stacks_if_hung()
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


# ---------------------------------------------------------------- the server kept between launches


def start_server() -> None:
    """Start this process's server once and name it in os.environ (children of this process inherit it)."""
    if os.environ.get(ADDRESS):
        return
    os.environ.setdefault(HANG_DUMP, HANG_DUMP_S)  # every launch's environment is this process's
    address = str(Path(tempfile.mkdtemp(prefix="warm-torchrun-")) / "socket")
    # its stdin is a pipe from this process: at this process's exit the server reads its end and leaves
    server = subprocess.Popen([sys.executable, str(HERE), "--serve", address], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert server.stdout is not None
    if server.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"the warm torchrun server did not start (exit {server.wait()})")
    atexit.register(_stop, server)  # which also holds it, so its stdin pipe stays open until then
    os.environ[ADDRESS] = address


def _stop(server: subprocess.Popen) -> None:
    """Close the server's stdin and wait for it: it leaves, and its CPU time (its launches' too) counts as this
    process's children's (tests/bench/cpu_plugin.py, /usr/bin/time)."""
    assert server.stdin is not None
    server.stdin.close()
    server.wait(timeout=60)


def serve(address: str) -> None:
    """Import SERVED once, then fork one child per launch request, one at a time.  A launch whose environment
    changes what an interpreter reads at its start (PYTHONPATH, a sitecustomize on it, ...) is refused: the
    client runs it itself."""
    startup = _startup(os.environ)
    for name in SERVED:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen()
    print("ready", flush=True)
    while True:
        if sys.stdin in select.select([listener, sys.stdin], [], [])[0]:
            Path(address).unlink()
            return  # the process that started this server is gone
        conn, _ = listener.accept()
        with conn:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            launch = json.loads(message)
            if _startup(launch["env"]) != startup:
                for fd in fds:
                    os.close(fd)
                conn.send(REFUSED)
                continue
            child = os.fork()
            if child == 0:
                listener.close()
                _become_launch(launch, fds)
            for fd in fds:
                os.close(fd)
            try:
                conn.send(str(child).encode())
            except OSError:
                pass  # the client is gone: _wait sees it and ends the launch
            status = _wait(child, conn)
            try:
                conn.send(str(status).encode())
            except OSError:
                pass


def _startup(environ) -> dict[str, str]:
    """The variables an interpreter reads at its start: Python's own but PYTHONUNBUFFERED (a launch's setting is
    applied to its streams), PYTHONBREAKPOINT (read at each breakpoint(); Ray sets it in the process that imports
    it) and PYTHONPATH's folders without a sitecustomize or usercustomize (set on sys.path by `_search_path`)."""
    kept = {key: value for key, value in environ.items()
            if key.startswith("PYTHON") and key not in ("PYTHONUNBUFFERED", "PYTHONBREAKPOINT", "PYTHONPATH")}
    customize = [folder for folder in _folders(environ)
                 if any((Path(folder) / f"{name}.py").exists() for name in ("sitecustomize", "usercustomize"))]
    return {**kept, "customize": os.pathsep.join(customize)}


def _folders(environ) -> list[str]:
    """PYTHONPATH's folders, as the interpreter reads them (empty entries left out)."""
    return [folder for folder in environ.get("PYTHONPATH", "").split(os.pathsep) if folder]


def _search_path(served: list[str], launch: list[str]) -> None:
    """sys.path as the launch's interpreter would have it: its PYTHONPATH folders where the server's were, after
    the script's folder (sys.path[0])."""
    rest = sys.path[1 + len(served):] if sys.path[1:1 + len(served)] == served else sys.path[1:]
    sys.path[:] = [sys.path[0], *[os.path.abspath(folder) for folder in launch], *rest]


def _become_launch(request: dict, fds: list[int]) -> NoReturn:
    """In the forked child: a session of its own (one process group with the ranks it forks), the client's
    streams, folder and environment, then the launch; its exit status is the child's."""
    os.setsid()
    for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
    os.chdir(request["cwd"])
    served = [os.path.abspath(folder) for folder in _folders(os.environ)]
    os.environ.clear()
    os.environ.update(request["env"])
    _search_path(served, _folders(os.environ))
    if os.environ.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    code = 0
    try:
        main(request["argv"])
    except SystemExit as leave:
        code = leave.code if isinstance(leave.code, int) else 1
    except BaseException:  # noqa: BLE001 (the launch's error goes to its stderr, like an uncaught one)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _wait(child: int, conn: socket.socket) -> int:
    """The child's exit code (-N for signal N); if the client goes away first, the child's group is killed."""
    watching = [conn]
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if select.select(watching, [], [], 0.05)[0] and not conn.recv(16):
            watching = []
            os.killpg(child, signal.SIGKILL)


def request(address: str, argv: list[str]) -> int | None:
    """Run the launch in the server; its exit status (128+N for signal N, as a shell reports it), or None when
    no server answers (nothing has run)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        try:
            conn.connect(address)
        except OSError:
            return None
        message = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [message], [0, 1, 2])
        reply = conn.recv(32)
        if reply == REFUSED:
            return None
        child = int(reply)
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, lambda received, _: os.killpg(child, received))
        code = int(conn.recv(32))
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        status = request(os.environ[ADDRESS], sys.argv[1:]) if os.environ.get(ADDRESS) else None
        if status is None:
            main(sys.argv[1:])
        else:
            sys.exit(status)
