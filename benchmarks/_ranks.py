"""Launching a distributed benchmark: this machine's ranks as fresh processes of the
same script, each told its rank and a free loopback port for the rendezvous."""
import socket
import subprocess
import sys


def launch(script: str, world: int, args: list) -> int:
    """Runs `script args --rank r --port p` for every rank; the worst exit code."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, script, "--rank", str(r), "--port", str(port)]
                              + list(args)) for r in range(world)]
    return max(p.wait() for p in procs)


def run_ranks(script: str, world: int) -> None:
    sys.exit(launch(script, world, sys.argv[1:]))
