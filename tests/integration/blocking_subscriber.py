"""A plain (non-async) script, run as a subprocess by test_blocking.py: it subscribes
with ``streamsub.blocking`` and stops on SIGTERM through ``future.cancel()``.

Usage: ``python blocking_subscriber.py URL SUBSCRIPTION def|lambda``. With ``def``
the callback acks and prints ``handled <message id>`` for each message.
"""

import signal
import sys
import threading

import streamsub
import streamsub.blocking


def main() -> int:
    url, subscription, kind = sys.argv[1:4]
    client = streamsub.blocking.connect(url)
    printing = threading.Lock()  # callbacks run in several threads at once

    def handle(message: streamsub.Message) -> None:
        message.ack()
        with printing:
            print(f"handled {message.message_id}", flush=True)

    callback = handle if kind == "def" else (lambda m: m.ack())
    future = client.subscribe(subscription, callback, ack_mode="manual")
    signal.signal(signal.SIGTERM, lambda signum, frame: future.cancel())
    print("ready", flush=True)
    future.result()
    client.close()
    print(f"stopped cancelled={future.cancelled()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
