"""A local kvtier cluster for the Python tests: kvtier-server processes on 127.0.0.1, port 0, each
writing its bound ports to a port file. One 3-node cluster is shared by every test module of a run
(started on first use, stopped at interpreter exit); tests that kill servers start their own.

Also here, for suites that need them: servers on other loopback addresses (127.0.0.2, ...) sharing one
port, with UCX, KV events or a YAML config; a test CA whose certificates the openssl CLI makes in a
temporary directory (TestCA, as tests/integration/security/ makes them); and a dnsmasq on a high
loopback port serving A records from a directory (Dnsmasq, as tests/integration/dns_membership_test.cc
runs it).

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
import socket
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

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
    """One kvtier-server child process. `host` is its loopback address and `port` its gRPC port (0: the
    kernel picks); `ucx` adds a UCX listener (on 127.0.0.1), `events` a KV-event PUB socket, and
    `extra_args` any other flags (e.g. --config=FILE)."""

    def __init__(self, node_id: str, workdir: str, host_cache_bytes: str = "128MiB", *, host: str = "127.0.0.1",
                 port: int = 0, ucx: bool = False, events: bool = False, extra_args: Sequence[str] = ()):
        self.node_id = node_id
        self.host = host
        self.port_file = os.path.join(workdir, f"{node_id}.port")
        self.log_path = os.path.join(workdir, f"{node_id}.log")
        self._log = open(self.log_path, "ab")
        args = [
            server_binary(),
            f"--node_id={node_id}",
            f"--listen_address={host}:{port}",
            "--metrics_address=none",
            f"--port_file={self.port_file}",
            f"--host_cache_bytes={host_cache_bytes}",
            # 16 slabs of 8 MiB: every block size the suites use (KV pages, and the extra pools of a
            # hybrid model, each a size of its own) gets slabs without evicting another size's.
            "--slab_bytes=8MiB",
            "--max_block_bytes=8MiB",
            # UCX 1.13 serves only the first address of a network device, so the listener stays on
            # 127.0.0.1 whatever `host` is; clients dial the address a listener is bound to.
            "--ucx_listen_address=127.0.0.1:0" if ucx else "--ucx_listen_address=none",
        ]
        if events:
            args.append(f"--events_pub_endpoint=tcp://{host}:0")
        args += list(extra_args)  # after the defaults: a repeated flag takes its last value
        self.args = args
        self.ucx_port = 0
        self._start()

    def _start(self) -> None:
        try:
            os.remove(self.port_file)
        except FileNotFoundError:
            pass
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=_die_with_parent)
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
                    self.ucx_port = int(fields[2]) if len(fields) > 2 else 0
                    return int(fields[0])
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.02)
        raise RuntimeError(f"kvtier-server {self.node_id} wrote no port file in {timeout_s} s")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Ends the process with `sig` (SIGTERM: a clean shutdown), then runs the same command again (a
        gRPC port of 0 gets a new port)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._start()

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
    """N servers in a temporary directory; stop() ends them and removes it.

    With `distinct_hosts`, server i listens on 127.0.0.i, all on one gRPC port (the first server's, picked
    by the kernel), as members found through DNS must be (an A record carries no port). The other
    keywords go to every Server."""

    def __init__(self, nodes: int = 3, prefix: str = "py", host_cache_bytes: str = "128MiB", *,
                 distinct_hosts: bool = False, hosts: Optional[Sequence[str]] = None, **server_kwargs):
        self.workdir = tempfile.mkdtemp(prefix="kvtier-pytest-")
        self.servers: List[Server] = []
        try:
            port = 0
            for i in range(1, nodes + 1):
                host = hosts[i - 1] if hosts else f"127.0.0.{i}" if distinct_hosts else "127.0.0.1"
                server = Server(f"{prefix}-{i}", self.workdir, host_cache_bytes, host=host, port=port,
                                **server_kwargs)
                if distinct_hosts or hosts:
                    port = server.port
                self.servers.append(server)
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


# ---- TLS: a test CA made with the openssl CLI ------------------------------------------------------------

class TestCA:
    """A CA, a server certificate and client certificates, made by the openssl CLI in `directory`
    (prime256v1 keys, valid 2 days). The server certificate names `server_names` (DNS names and IP
    addresses). `untrusted` issues certificates of a second CA that no server trusts."""

    _KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def __init__(self, directory: str, server_names: Sequence[str] = ("localhost", "127.0.0.1")):
        self.dir = directory
        for ca in ("ca", "untrusted-ca"):
            self._openssl("req", "-x509", *self._KEY, "-keyout", self.path(f"{ca}.key"), "-out", self.path(f"{ca}.pem"),
                          "-days", "2", "-subj", f"/CN=kvtier-test-{ca}")
        sans = ",".join(("IP:" if _is_ip(n) else "DNS:") + n for n in server_names)
        self._write("server.ext", f"subjectAltName={sans}\n")
        self._write("client.ext", "extendedKeyUsage=clientAuth\n")
        self.issue("server", "ca", "server.ext")
        self.issue("client", "ca", "client.ext")
        self.issue("untrusted-client", "untrusted-ca", "client.ext")

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def issue(self, name: str, ca: str, ext: str) -> None:
        self._openssl("req", *self._KEY, "-keyout", self.path(f"{name}.key"), "-out", self.path(f"{name}.csr"),
                      "-subj", f"/CN={name}")
        self._openssl("x509", "-req", "-in", self.path(f"{name}.csr"), "-CA", self.path(f"{ca}.pem"),
                      "-CAkey", self.path(f"{ca}.key"), "-CAcreateserial", "-days", "2",
                      "-out", self.path(f"{name}.pem"), "-extfile", self.path(ext))

    def client_options(self, cert: str = "client") -> Dict[str, str]:
        """The Client keywords of mutual TLS with certificate `cert` ("client" or "untrusted-client")."""
        return {"tls_ca_file": self.path("ca.pem"), "tls_cert_file": self.path(f"{cert}.pem"),
                "tls_key_file": self.path(f"{cert}.key")}

    def server_config(self, tokens: Sequence[Dict[str, str]] = ()) -> str:
        """YAML of a server with mutual TLS (tls.require_client_cert) and, when given, these auth tokens
        ({"token", "tenant", "role"} entries)."""
        lines = ["tls:", f"  cert_file: {self.path('server.pem')}", f"  key_file: {self.path('server.key')}",
                 f"  client_ca_file: {self.path('ca.pem')}", "  require_client_cert: true"]
        if tokens:
            lines += ["auth:", "  tokens:"]
            for t in tokens:
                lines.append("    - {" + ", ".join(f"{k}: {v}" for k, v in t.items()) + "}")
        return "\n".join(lines) + "\n"

    def _write(self, name: str, text: str) -> None:
        with open(self.path(name), "w") as f:
            f.write(text)

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _is_ip(name: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET, name)
        return True
    except OSError:
        return False


# ---- DNS: dnsmasq on a high loopback port ---------------------------------------------------------------

def find_dnsmasq() -> Optional[str]:
    for p in ("/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq", "/usr/local/sbin/dnsmasq"):
        if os.access(p, os.X_OK):
            return p
    return None


class Dnsmasq:
    """A dnsmasq child answering for *.kvtier.test from the files of a directory (one file per record:
    add() renames a file in, remove() deletes it; dnsmasq watches the directory). It listens on
    127.0.0.1 at a UDP port the kernel handed out (dnsmasq cannot report the port it bound, so a port
    taken meanwhile means another try). `server` is "127.0.0.1:PORT", for ClientOptions.dns_server."""

    NAME = "kvtier.kvtier.test"

    def __init__(self, binary: str):
        self.dir = tempfile.mkdtemp(prefix="kvtier-pydns-")
        os.mkdir(os.path.join(self.dir, "hosts"))
        os.chmod(self.dir, 0o755)  # dnsmasq started as root reads the records as an unprivileged user
        os.chmod(os.path.join(self.dir, "hosts"), 0o755)
        self.process = None
        self._log = open(os.path.join(self.dir, "dnsmasq.log"), "wb")
        for _ in range(5):
            port = _free_udp_port()
            self.process = subprocess.Popen(
                [binary, "--no-daemon", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
                 "--listen-address=127.0.0.1", f"--port={port}", f"--hostsdir={self.dir}/hosts",
                 "--local=/kvtier.test/", f"--pid-file={self.dir}/pid", "--log-facility=-"],
                stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
            self.server = f"127.0.0.1:{port}"
            if self._answers(port):
                return
            self.process.kill()
            self.process.wait()
        raise RuntimeError(f"dnsmasq did not start; see {self.dir}/dnsmasq.log")

    def _answers(self, port: int, timeout_s: float = 10.0) -> bool:
        """True once dnsmasq answers a query (any answer), False if it exited or never answered."""
        query = bytes.fromhex("1234 0100 0001 0000 0000 0000".replace(" ", "")) + \
            b"".join(bytes([len(p)]) + p.encode() for p in "probe.kvtier.test".split(".")) + b"\x00\x00\x01\x00\x01"
        deadline = time.monotonic() + timeout_s
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.2)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False
                s.sendto(query, ("127.0.0.1", port))
                try:
                    reply = s.recv(512)
                    if reply[:2] == query[:2]:
                        return True
                except socket.timeout:
                    pass
        return False

    def add(self, ip: str) -> None:
        tmp = os.path.join(self.dir, f"{ip}.tmp")
        with open(tmp, "w") as f:
            f.write(f"{ip} {self.NAME}\n")
        os.chmod(tmp, 0o644)
        os.rename(tmp, os.path.join(self.dir, "hosts", ip))

    def remove(self, ip: str) -> None:
        os.remove(os.path.join(self.dir, "hosts", ip))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
