"""Launching a distributed benchmark: this machine's ranks as fresh processes of the
same script, each told its rank and a free loopback port for the rendezvous."""
import socket
import subprocess
import sys


def run_ranks(script: str, world: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, script, "--rank", str(r), "--port", str(port)]
                              + sys.argv[1:]) for r in range(world)]
    sys.exit(max(p.wait() for p in procs))
