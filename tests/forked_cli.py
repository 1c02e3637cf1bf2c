"""`zbench ARGS` as its own process, forked from the tests' fork server (forkserver.py) instead of a new
interpreter: the same entry point, exit code and output as `python -m zbench ARGS`, without importing torch
again for every command. Signals and process trees are its own (a new session), as a subprocess's are."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback

from forkserver import CONTEXT

_TESTS = os.path.dirname(os.path.realpath(__file__))


def _command(args: list[str], env: dict, cwd: str, out_path: str, err_path: str) -> None:
    os.setsid()  # its ranks and it form one group: a timeout stops them all
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["zbench", *args]
    # the path `python -m zbench` has from the repository root: not the test folders pytest put on it
    sys.path[:] = [cwd, *(p for p in sys.path if p and not os.path.realpath(p).startswith(_TESTS))]
    code = 0
    try:
        from zbench.cli import main

        main(args, prog_name="zbench")
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # as the interpreter would: the traceback on stderr, exit code 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def run_zbench(args: list[str], env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        for path in (out_path, err_path):
            open(path, "w").close()
        child = CONTEXT.Process(target=_command, args=(list(args), dict(env), str(cwd), out_path, err_path))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            os.killpg(child.pid, 9)
            child.join()
            raise subprocess.TimeoutExpired(["zbench", *args], timeout)
        with open(out_path, encoding="utf-8", errors="replace") as out, \
                open(err_path, encoding="utf-8", errors="replace") as err:
            return subprocess.CompletedProcess(["zbench", *args], child.exitcode, out.read(), err.read())
