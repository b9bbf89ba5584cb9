"""A real gateway process stopped with SIGTERM and started again during a streaming pull."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from google.cloud import pubsub_v1

from streamsub.testing import RedisServer

from .test_streaming import wait_for

# The client's gRPC channel backs off reconnecting (up to 120 s between tries)
# while the gateway is down: on a busy machine the catch-up takes a while.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _outcome(future: Any) -> BaseException | None:
    """What ended the streaming pull (None while it runs)."""
    return None if future.running() else future.exception(timeout=0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayProcess:
    """``streamsub gateway`` as a child process; its log lines are collected."""

    def __init__(self, url: str, port: int, *options: str) -> None:
        command = Path(sys.executable).parent / "streamsub"
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [
                *(str(command), "gateway", "--redis", url),
                *("--grpc", f"127.0.0.1:{port}", "--http", "127.0.0.1:0"),
                *options,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            wait_for(lambda: any("gRPC on" in line for line in self.lines), 20, "its start")
        except BaseException:
            self.process.kill()
            raise

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(30)
        self._reader.join(5)
        return code


def test_sigterm_and_restart_during_streaming_pull_lose_nothing(
    server: RedisServer, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM stops the gateway gracefully (one start line with its port, exit 0);
    started again on the same port, the same client carries on and receives every
    message published before, during and after the restart."""
    port = _free_port()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port}")
    first = GatewayProcess(server.url, port)
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic)
    received: set[str] = set()
    lock = threading.Lock()

    def callback(message: Any) -> None:
        time.sleep(0.001)
        with lock:
            received.add(message.message_id)
        message.ack()

    future = subscriber.subscribe(name, callback)
    published: set[str] = set()
    second: GatewayProcess | None = None
    try:
        for _ in range(10):
            published |= {f.result() for f in [publisher.publish(topic, b"a") for _ in range(200)]}
        wait_for(lambda: len(received) >= 500, 30, "the stream to be delivering")
        starts = [line for line in first.lines if "gRPC on" in line]
        assert len(starts) == 1
        assert f":{port}" in starts[0]
        assert first.terminate() == 0
        assert any("stopped" in line for line in first.lines)
        in_flight = [publisher.publish(topic, b"b") for _ in range(500)]
        second = GatewayProcess(server.url, port)
        published |= {f.result(timeout=60) for f in in_flight}
        for _ in range(5):
            published |= {f.result() for f in [publisher.publish(topic, b"c") for _ in range(200)]}
        try:
            wait_for(
                lambda: received >= published or not future.running(),
                180,
                "every published message",
            )
            assert future.running(), f"the streaming pull ended: {_outcome(future)!r}"
        except AssertionError as exc:
            missing = sorted(published - received)
            raise AssertionError(
                f"{exc}: {len(missing)} missing (e.g. {missing[:5]}), streaming pull "
                f"running={future.running()}, gateway log: {''.join(second.lines)[-3000:]}"
            ) from None
        assert future.running()
        # The client's lease thread ends with its streaming pull: before the
        # gateway stops, or its last modacks meet a closed channel.
        future.cancel()
        future.result(timeout=30)
        assert second.terminate() == 0
    finally:
        future.cancel()
        with contextlib.suppress(Exception):  # its threads are done before the channel closes
            future.result(timeout=30)
        subscriber.close()
        publisher.stop()
        for gateway in (first, second):
            if gateway is not None and gateway.process.poll() is None:
                gateway.process.kill()
    assert len(published) == 3500
