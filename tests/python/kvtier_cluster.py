"""A local kvtier cluster for the Python tests: kvtier-server processes on 127.0.0.1, port 0, each
writing its bound ports to a port file. One 3-node cluster is shared by every test module of a run
(started on first use, stopped at interpreter exit); tests that kill servers start their own.

The server binary comes from $KVTIER_SERVER_BINARY, else $KVTIER_BINARY_DIR/cache_server/kvtier-server
(the ctest entry sets both). $KVTIER_TEST_MEMBERS ("h:p,h:p") points the shared cluster at running
servers instead.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import List, Optional, Sequence

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If the test process is killed (ctest timeout), take the servers down with it.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def server_binary() -> str:
    path = os.environ.get("KVTIER_SERVER_BINARY")
    if not path and os.environ.get("KVTIER_BINARY_DIR"):
        path = os.path.join(os.environ["KVTIER_BINARY_DIR"], "cache_server", "kvtier-server")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(
            f"kvtier-server not found (KVTIER_SERVER_BINARY={os.environ.get('KVTIER_SERVER_BINARY')!r}); "
            "build it and set KVTIER_SERVER_BINARY or KVTIER_BINARY_DIR"
        )
    return path


class Server:
    """One kvtier-server child process."""

    def __init__(self, node_id: str, workdir: str, host_cache_bytes: str = "128MiB", extra_args: Sequence[str] = ()):
        self.node_id = node_id
        self.port_file = os.path.join(workdir, f"{node_id}.port")
        self.log_path = os.path.join(workdir, f"{node_id}.log")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [
                server_binary(),
                f"--node_id={node_id}",
                "--listen_address=127.0.0.1:0",
                "--metrics_address=none",
                f"--port_file={self.port_file}",
                f"--host_cache_bytes={host_cache_bytes}",
                # 16 slabs of 8 MiB: every block size the suites use (KV pages, and the extra pools of a
                # hybrid model, each a size of its own) gets slabs without evicting another size's.
                "--slab_bytes=8MiB",
                "--max_block_bytes=8MiB",
                *extra_args,  # after the defaults: a repeated flag takes its last value
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        self.port = self._wait_for_port()

    def _wait_for_port(self, timeout_s: float = 20.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kvtier-server {self.node_id} exited early; log: {self.log_path}")
            try:
                with open(self.port_file) as f:
                    fields = f.read().split()
                if fields:
                    return int(fields[0])
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.02)
        raise RuntimeError(f"kvtier-server {self.node_id} wrote no port file in {timeout_s} s")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Cluster:
    """N servers in a temporary directory; stop() ends them and removes it."""

    def __init__(self, nodes: int = 3, prefix: str = "py", host_cache_bytes: str = "128MiB",
                 extra_args: Sequence[str] = ()):
        self.workdir = tempfile.mkdtemp(prefix="kvtier-pytest-")
        self.servers: List[Server] = []
        try:
            for i in range(1, nodes + 1):
                self.servers.append(Server(f"{prefix}-{i}", self.workdir, host_cache_bytes, extra_args))
        except BaseException:
            self.stop()
            raise

    @property
    def members(self) -> List[str]:
        return [s.address for s in self.servers]

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        self.servers = []
        shutil.rmtree(self.workdir, ignore_errors=True)


_shared: Optional[Cluster] = None


def shared_members() -> List[str]:
    """Members of the run's shared 3-node cluster (started on first call)."""
    global _shared
    if os.environ.get("KVTIER_TEST_MEMBERS"):
        return [m for m in os.environ["KVTIER_TEST_MEMBERS"].split(",") if m]
    if _shared is None:
        _shared = Cluster(3, prefix="shared")
        atexit.register(_shared.stop)
    return _shared.members


_counter = 0


def unique(name: str) -> str:
    """A name unique within this run and across runs (tests share one cluster)."""
    global _counter
    _counter += 1
    return f"{name}-{os.getpid()}-{time.monotonic_ns()}-{_counter}"
