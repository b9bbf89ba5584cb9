"""A callback for the official client's ``subscribe`` that acks and collects."""

from __future__ import annotations

import threading
from typing import Any


class AckingCollector:
    """Acks every message it is called with and keeps its id (the client calls it
    from its threads)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, message: Any) -> None:
        with self._lock:
            self.ids.add(message.message_id)
        message.ack()
