"""The process that holds a Triton server's process group together and takes it down with its
parent: ``python -m trt_spec.serving.reaper --shm-prefix P --workdir D -- tritonserver ...``.

:class:`~trt_spec.serving.server.TritonServer` starts this as the leader of a new session, and it
runs the server command as its child, so the server, its python-backend stubs and ``mpirun``'s
children are all in its process group. It is transparent to its parent: SIGTERM and SIGINT go on
to the server, and it ends as the server ended (the same exit code, or killed by the same
signal). Unlike the server, it watches its parent: when ``trt-spec serve`` is gone however it
went (SIGKILL, the OOM killer, a crash), it SIGKILLs its whole process group, removes the
server's shared-memory regions (``/dev/shm/P*``) and ``D``, and exits, so nothing outlives
``serve`` and no orphan keeps its ports. (A parent-death signal is not enough: Linux sends it
when the *thread* that forked dies, and ``serve`` restarts servers from its supervisor thread.)

Standard library only; started with the interpreter ``serve`` runs on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.1  # how often the parent is checked: an orphaned server is gone within about this


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies aside) of process group ``pgid``, this one excepted."""
    me, members = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me:
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in "ZX":
                members.append(int(entry.name))
    return members


def _take_down(shm_prefix: str, workdir: str) -> None:
    """SIGKILL every other process of the group, wait (5 s at most) until they are gone, then
    remove what the server leaves behind."""
    deadline = time.monotonic() + 5.0
    while (members := group_members(os.getpgrp())) and time.monotonic() < deadline:
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    if shm_prefix:
        for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
            region.unlink(missing_ok=True)
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trt_spec.serving.reaper")
    parser.add_argument("--shm-prefix", default="")
    parser.add_argument("--workdir", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command after --")
    parent = os.getppid()
    child = subprocess.Popen(command)

    def relay(signum, frame) -> None:
        if child.poll() is None:
            os.kill(child.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, relay)
    while child.poll() is None:
        if os.getppid() != parent:  # reparented: serve is gone
            _take_down(args.shm_prefix, args.workdir)
            return 1
        time.sleep(POLL_S)
    code = child.returncode
    if code < 0:  # end as the server ended: killed by the same signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)  # a stopped signal (SIGSTOP) does not end us: fall through
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
