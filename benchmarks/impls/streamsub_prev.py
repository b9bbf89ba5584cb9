"""streamsub 0.1 -- the release before the receiver was reshaped -- next to today's.

Commit 7d5c162 (version 0.1.0; the parent of 5d0d20c, which gave handlers asyncio
tasks of their own) started an ``async def`` handler *eagerly*: its
first step ran inline in the dispatching task, and a Task was created only if it
suspended. The same consumer and publisher as ``streamsub`` (``impls/
streamsub_impl.py``), but importing that commit's code, so the ratio
``streamsub / streamsub-0.1`` is what real handler tasks (and the rest of the
reshape) cost.

The old code is never committed: at the start of a run the orchestrating process
extracts it with ``git archive 7d5c162 src/streamsub`` into a temporary
directory (deleted at exit). Every spawned child of this implementation puts that
directory first on ``sys.path`` before anything there imports ``streamsub``
(:meth:`StreamsubPrevious.lib`), and checks that the package it got comes from
there. The orchestrating process itself keeps today's streamsub (the ``streamsub``
implementation may have imported it), so the untimed ``setup`` -- creating the
topic and subscription with the old code -- runs in a spawned child too. Outside
a git checkout (or without git) the implementation is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import io
import multiprocessing
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType
from typing import ClassVar

from .base import BenchmarkError, Env, Implementation
from .streamsub_impl import Streamsub

COMMIT = "7d5c162"
REPO_ROOT = Path(__file__).resolve().parents[2]


def extract(commit: str, repo: Path) -> Path:
    """``git archive commit src/streamsub`` into a fresh temporary directory (removed
    when this process exits); returns the directory that holds ``streamsub/``."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", commit, "src/streamsub"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        reason = archive.stderr.decode(errors="replace").strip() or f"exit {archive.returncode}"
        msg = f"git archive {commit} failed in {repo}: {reason}"
        raise RuntimeError(msg)
    target = Path(tempfile.mkdtemp(prefix=f"streamsub-{commit}-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(target, filter="data")
    src = target / "src"
    if not (src / "streamsub" / "__init__.py").is_file():
        msg = f"git archive {commit} has no src/streamsub/__init__.py"
        raise RuntimeError(msg)
    return src


def _setup_in_child(impl: StreamsubPrevious) -> None:
    asyncio.run(Streamsub.setup(impl))


class StreamsubPrevious(Streamsub):
    name = "streamsub-0.1"
    commit: ClassVar[str] = COMMIT
    _extracted: ClassVar[Path | None] = None

    @classmethod
    def unavailable(cls) -> str | None:
        if cls._extracted is None:
            try:
                cls._extracted = extract(cls.commit, REPO_ROOT)
            except (OSError, RuntimeError) as exc:
                return f"cannot extract streamsub {cls.commit} (not a git checkout?): {exc}"
        return None

    @classmethod
    def cluster_variant(cls) -> type[Implementation] | None:
        """None: the cluster rows measure today's code only."""
        return None

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        reason = self.unavailable()
        if reason is not None:
            raise BenchmarkError(reason)
        assert self._extracted is not None
        self.src = str(self._extracted)
        """Travels with the pickled instance to the spawned children."""

    def lib(self) -> ModuleType:
        if "streamsub" not in sys.modules:
            sys.path.insert(0, self.src)
        import streamsub

        origin = Path(streamsub.__file__ or "").resolve()
        if not origin.is_relative_to(Path(self.src).resolve()):
            msg = (
                f"{self.name} must run streamsub {self.commit} from {self.src}, "
                f"but this process imported {origin}"
            )
            raise BenchmarkError(msg)
        return streamsub

    async def setup(self) -> None:
        # The orchestrating process may hold today's streamsub: create the topic and
        # subscription with the old code, in a child of its own.
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            await asyncio.get_running_loop().run_in_executor(pool, _setup_in_child, self)


class StreamsubBeforeAdaptive(StreamsubPrevious):
    """streamsub at ``5c5fb4b``, the last commit before adaptive publish batching
    (every batch that is not full waited ``max_latency``): the "before" of the
    publish-path scenarios, measured in the same run."""

    name = "streamsub-fixed"
    commit: ClassVar[str] = "5c5fb4b"
    _extracted: ClassVar[Path | None] = None


class StreamsubAdaptive(StreamsubPrevious):
    """streamsub at ``5a2cd57``: adaptive publish batching, before the publish
    path's Python per message was cut (runs, one write's ids in one reply,
    publish() queueing without the publisher's coroutine): the "before" of that
    work, measured in the same run."""

    name = "streamsub-adaptive"
    commit: ClassVar[str] = "5a2cd57"
    _extracted: ClassVar[Path | None] = None


class StreamsubBeforeReceivePath(StreamsubAdaptive):
    """The same commit, ``5a2cd57``, under the name the receive-path work of
    issue 11 measured it by (a handler's outcome settled and acked one message
    at a time): the "before" of the e2e scenario in the same run."""

    name = "streamsub-pre-recv"


class StreamsubBeforeDataRuns(StreamsubPrevious):
    """streamsub at ``ce8a04d``, the last commit before messages that are data
    alone went to ``append.lua`` as runs (each one its own record, unpacked
    into a table): the "before" of that change, measured in the same run."""

    name = "streamsub-pre-runs"
    commit: ClassVar[str] = "ce8a04d"
    _extracted: ClassVar[Path | None] = None


class StreamsubBeforeLonePublish(StreamsubPrevious):
    """streamsub at ``67a0c2f``, before a publish of one message queued itself
    without a waiter (``submit_one``), runs carried their lengths first, the
    in-order connection packed its own commands and ``OutgoingMessage`` got its
    own ``__init__``: the "before" of "A lone publish, counted", in the same run."""

    name = "streamsub-pre-lone"
    commit: ClassVar[str] = "67a0c2f"
    _extracted: ClassVar[Path | None] = None


class StreamsubTaskPerHandler(StreamsubPrevious):
    """streamsub at ``41be509``, the last commit that ran each handler in an
    ``asyncio.Task`` of its own (before the handler runners): the "before" of
    "Handler runners", measured in the same run."""

    name = "streamsub-tasks"
    commit: ClassVar[str] = "41be509"
    _extracted: ClassVar[Path | None] = None


class StreamsubBeforeSplit(StreamsubPrevious):
    """streamsub at ``adbfcdd``, the last commit that wrote a crowd of callers
    each awaiting ``publish()`` as one batch of all of them (before
    ``SPLIT_AT``): the "before" of "A crowd of callers, written in halves", in
    the same run."""

    name = "streamsub-pre-split"
    commit: ClassVar[str] = "adbfcdd"
    _extracted: ClassVar[Path | None] = None


class StreamsubBeforeInlineRead(StreamsubPrevious):
    """streamsub at ``c6fb584``, the code before the write that read its own
    reply (tried and reverted: benchmarks/README.md, "A write that reads its
    own reply, tried"), measured beside it; its publish path is main's."""

    name = "streamsub-pre-inline"
    commit: ClassVar[str] = "c6fb584"
    _extracted: ClassVar[Path | None] = None


class StreamsubBeforeLane(StreamsubPrevious):
    """streamsub at ``b0b9ca3``, the last commit that queued each single
    publish of data alone as an entry and token of its own (before the batch's
    lane): the "before" of "Single publishes in the batch's lane", in the same
    run."""

    name = "streamsub-pre-lane"
    commit: ClassVar[str] = "b0b9ca3"
    _extracted: ClassVar[Path | None] = None
