"""Private redis-server and nats-server processes for one benchmark run.

Both listen on a free 127.0.0.1 port, keep their data in a private temporary
directory and are stopped (and the directory removed) when the context exits;
so does the private Redis Cluster of the runners' ``--cluster`` option.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis
import redis.asyncio

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    name = Path(str(proc.args[0] if isinstance(proc.args, list) else proc.args)).name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"{name} exited with {proc.returncode}; log:\n{_tail(log)}"
            raise RuntimeError(msg)
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.05)
    msg = f"{name} did not listen on {HOST}:{port} within {timeout}s"
    raise RuntimeError(msg)


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip()


async def cpu_seconds(client: redis.asyncio.Redis) -> float:
    """Seconds of CPU the server of ``client`` has used, user and system (``INFO cpu``)."""
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@contextlib.contextmanager
def redis_server(path: str) -> Iterator[str]:
    """Run a throwaway redis-server from ``path``, persisting nothing; yield its URL."""
    data_dir = Path(tempfile.mkdtemp(prefix="streamsub-bench-redis-"))
    port = free_port()
    log = data_dir / "redis.log"
    args = [
        path,
        "--bind", HOST,
        "--port", str(port),
        "--dir", str(data_dir),
        "--save", "",
        "--appendonly", "no",
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--logfile", str(log),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc, log, timeout=10)
        url = f"redis://{HOST}:{port}/0"
        client = redis.Redis.from_url(url)
        try:
            client.ping()
        finally:
            client.close()
        yield url
    finally:
        _stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


CLUSTER_MASTERS = 3


@contextlib.contextmanager
def redis_cluster(path: str) -> Iterator[str]:
    """Run a throwaway Redis Cluster of the same ``redis-server`` binary: three
    masters, no replicas, AOF off and no snapshots, as the single server; yield
    its ``redis+cluster://`` URL (:func:`streamsub.testing.redis_cluster`)."""
    from streamsub.testing import redis_cluster as cluster

    with cluster(
        masters=CLUSTER_MASTERS, replicas=0, binary=path, extra_args=("--appendonly", "no")
    ) as servers:
        yield servers.url


def find_binary(name: str) -> str | None:
    """``name`` on PATH, or in an sbin directory a non-root PATH often lacks."""
    found = shutil.which(name)
    if found is not None:
        return found
    candidates = (Path(d) / name for d in ("/usr/sbin", "/usr/local/sbin", "/sbin"))
    return next((str(p) for p in candidates if p.is_file()), None)


@contextlib.contextmanager
def nats_server(path: str) -> Iterator[str]:
    """Run a throwaway JetStream-enabled nats-server from ``path``; yield its URL."""
    data_dir = Path(tempfile.mkdtemp(prefix="streamsub-bench-nats-"))
    port = free_port()
    log = data_dir / "nats.log"
    args = [path, "-js", "-a", HOST, "-p", str(port), "-sd", str(data_dir), "-l", str(log)]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc, log, timeout=10)
        yield f"nats://{HOST}:{port}"
    finally:
        _stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def binaries(classes: dict[str, object], skipped: dict[str, str]) -> tuple[str, str | None] | None:
    """The redis-server (and, if the ``nats`` peer runs, nats-server) binaries;
    without nats-server that peer moves to ``skipped``. Prints the skipped ones;
    None (after saying why) when nothing can run."""
    redis_path = find_binary("redis-server")
    if redis_path is None:
        print("redis-server not found; nothing can run", file=sys.stderr)
        return None
    nats_path = find_binary("nats-server") if "nats" in classes else None
    if "nats" in classes and nats_path is None:
        del classes["nats"]
        skipped["nats"] = "nats-server not found (looked on PATH and in /usr/sbin)"
    for name, reason in skipped.items():
        print(f"NOTE: skipping {name}: {reason}")
    if not classes:
        print("no implementation left to run", file=sys.stderr)
        return None
    return redis_path, nats_path


def versions(redis_path: str, nats_path: str | None) -> dict[str, str]:
    found = {"redis-server": server_version(redis_path)}
    if nats_path is not None:
        found["nats-server"] = server_version(nats_path)
    return found
