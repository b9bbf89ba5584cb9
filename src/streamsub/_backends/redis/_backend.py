"""RedisBackend: the backend protocol on one Redis server (6.2 or newer).

Redis errors become streamsub errors here and nowhere else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, Literal, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..._core.retention import Retention
from ..._core.seek import PartitionPosition, PartitionSeek, positions_from_json, positions_json
from ..._core.stats import GroupCounts, PartitionCounts
from ..._errors import (
    AlreadyExistsError,
    AuthenticationError,
    BackendError,
    CertificateError,
    ClosedError,
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidTypeError,
    ResourceExhaustedError,
    StreamsubError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    UnavailableError,
)
from ..._settings import Durability
from ..base import (
    BrokenLinkError,
    Entry,
    GroupInfo,
    LeaseMode,
    Link,
    NackItem,
    OwnedRead,
    Ownership,
    PartitionNode,
    Reclaimed,
    ReclaimState,
    ServerInfo,
    SnapshotRecord,
    SubscriptionRecord,
    TopicRecord,
)
from . import _keys
from ._in_order import ConnectionClosed, InOrderConnection, take_connection
from ._pool import WaitingConnectionPool

__all__ = ["RedisBackend"]

SOCKET_TIMEOUT = 10.0
"""Seconds a command waits for its reply before its connection counts as dead.

Twice the longest ``XREADGROUP`` block a subscriber uses (:data:`MAX_READ_BLOCK`),
so a blocking read never hits it; and what bounds a ``publish`` on a connection
gone silent (a cut cable, a dropped NAT entry: no reset, no reply): it raises
``UnavailableError`` about this long after it was called.
"""
MAX_READ_BLOCK = 5.0
"""The longest BLOCK of a subscriber's ``XREADGROUP`` that the socket timeout allows for."""
SOCKET_CONNECT_TIMEOUT = 5.0
"""Seconds to open a TCP connection (at most ``socket_timeout``)."""
HEALTH_CHECK_INTERVAL = 30
"""A connection idle this many seconds is PINGed before its next command."""
_KEEPALIVE_OPTIONS: dict[int, int] = {
    option: value
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if (option := getattr(socket, name, None)) is not None
}
"""TCP keepalive: probe an idle connection after 10 s, every 5 s, give up after 3,
so the kernel finds a dead peer in about 25 s even with no command outstanding."""

_RECLAIM_STATES: tuple[ReclaimState, ...] = ("deliver", "exhausted", "lost")
"""Index = the state number reclaim.lua returns."""


def _script(name: str, *helpers: str) -> str:
    """A script's source, with the sources of ``helpers`` (``_ids.lua``: entry id
    comparisons; ``_dead_letter_append.lua``) before it, and before those the
    prologue every script has (``_undeclared_keys.lua``: KEYS passed undeclared,
    for :class:`~._routing.SlotRouter`'s steps into a slot being imported)."""
    scripts = resources.files(__package__).joinpath("scripts")
    parts = ("_undeclared_keys.lua", *helpers, name)
    return "".join(scripts.joinpath(part).read_text() for part in parts)


def _without_comments(source: str) -> str:
    """``source`` without its comment lines: sent with every EVAL, whose cost
    at the server (reading it, hashing it to find the compiled script) grows
    with its length."""
    return "".join(
        line for line in source.splitlines(keepends=True) if not line.lstrip().startswith("--")
    )


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs; never raises.

    Done on the text, not by parsing: a password may hold an unencoded ``/``,
    ``?``, ``#`` or ``@``, which a URL parser takes for the end of the host part
    (leaking the rest), and a malformed port makes parsers raise. Everything
    between ``://`` and the last ``@`` is masked (the user name is kept when it
    is plain), and so is a ``password=`` query parameter.
    """
    try:
        scheme, separator, rest = url.partition("://")
        if separator:
            at = rest.rfind("@")
            if at >= 0:
                user, colon, _ = rest[:at].partition(":")
                shown = user if colon and not any(c in user for c in "/?#") else ""
                rest = f"{shown}:***{rest[at:]}"
            url = f"{scheme}://{rest}"
        return _QUERY_PASSWORD.sub(r"\1***", url)
    except Exception:  # a log line must never fail; show nothing of the URL then
        return "<Redis URL not shown>"


@contextlib.contextmanager
def _parsing(kind: str, fields: Mapping[str, str]) -> Iterator[None]:
    """Turn a damaged stored record (a field missing or malformed, e.g. written
    by hand or half-recreated by a racing writer) into a clear BackendError."""
    try:
        yield
    except (KeyError, ValueError, TypeError, InvalidArgumentError, InvalidTypeError) as exc:
        name = fields.get("name", "?")
        raise BackendError(
            f"the stored {kind} record {name!r} is damaged ({type(exc).__name__}: {exc}; "
            f"fields present: {sorted(fields)}): delete the {kind} and create it again"
        ) from exc


def _retention_json(retention: Retention | None) -> str:
    return "" if retention is None else json.dumps(retention.to_dict(), sort_keys=True)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_Step = TypeVar("_Step", bound=Callable[..., Awaitable[Any]])


def _group_checked(step: _Step) -> _Step:
    """For a backend method called ``(self, topic, group, ...)``: a NOGROUP answer
    while the subscription and its topic both exist becomes UnavailableError,
    which the engine retries, rather than SubscriptionNotFoundError, which ends
    the subscriber (see ``RedisBackend._group_missing``)."""

    @functools.wraps(step)
    async def checked(self: Any, topic: TopicRecord, group: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await step(self, topic, group, *args, **kwargs)
        except SubscriptionNotFoundError as exc:
            await self._group_missing(topic, group, exc)
            raise

    return checked  # type: ignore[return-value]


def _identity(topic: TopicRecord) -> tuple[Any, ...]:
    """What makes a topic this one and not one made anew under its name (its
    retention may change in between)."""
    return (topic.name, topic.created, topic.partitions, topic.layout, topic.salts)


def _no_group(exc: Exception) -> bool:
    """A NOGROUP reply: plain, or from a command inside a script (Redis 7
    passes the code through; 6.2 wraps it: "ERR Error running script ...:
    @user_script:N: NOGROUP ...")."""
    text = str(exc)
    return text.startswith("NOGROUP") or ("@user_script" in text and ": NOGROUP " in text)


def _is_missing(exc: Exception) -> bool:
    """A reply error that says the stream or the group does not exist."""
    text = str(exc)
    return text.startswith("NOGROUP") or "no such key" in text.lower()


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc`` or an exception it was raised from or during is a ``kind``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _tls_reason(exc: BaseException) -> str:
    """The TLS library's reason, e.g. 'certificate verify failed: self-signed certificate'."""
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, ssl.SSLCertVerificationError) and current.verify_message:
            return f"certificate verify failed: {current.verify_message}"
        if isinstance(current, ssl.SSLError) and current.reason:
            return str(current.reason)
        current = current.__cause__ or current.__context__
    return str(exc)


def _raw(response: Any, **_: Any) -> Any:
    return response


def _raw_pending(client: Any) -> None:
    """XPENDING's replies as they come: :meth:`RedisBackend.pending_owners`
    (its only sender) sends its range form through ``_pipelined``, where
    redis-py's callback would parse it as the summary form."""
    client.set_response_callback("XPENDING", _raw)


class _Script:
    """A Lua script called by EVALSHA, loaded again when the server lost it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha: str | None = None

    async def load(self, client: Any) -> str:
        self.sha = str(await client.script_load(self.source))
        return self.sha


class RedisBackend:
    """The backend on a standalone Redis server, reached by ``url``.

    ``socket_timeout`` (default :data:`SOCKET_TIMEOUT`) bounds how long a
    command waits for its reply before its connection counts as dead: a
    ``publish`` on a silent connection raises ``UnavailableError`` after about
    that long. ``durability`` (:class:`~streamsub.Durability`) makes a publish
    wait for replicas, or fsync. ``ssl_ca_certs`` names the CA file that signs a ``rediss://``
    server's certificate (also ``?ssl_ca_certs=/path`` in the URL).
    """

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 64,
        socket_timeout: float = SOCKET_TIMEOUT,
        ssl_ca_certs: str | None = None,
        durability: Durability | None = None,
    ) -> None:
        self._url = url
        self._durability = durability or Durability()
        if not isinstance(self._durability, Durability):
            raise InvalidArgumentError(
                f"durability must be a streamsub.Durability, got {type(durability).__name__}"
            )
        if (
            isinstance(socket_timeout, bool)
            or not isinstance(socket_timeout, int | float)
            or not 0 < socket_timeout <= 3600
        ):
            raise InvalidArgumentError(
                f"socket_timeout must be seconds from 0 to 3600, got {socket_timeout!r}; "
                f"keep it above the subscriber's longest read block ({MAX_READ_BLOCK:g} s)"
            )
        if self._durability.waits and not self._durability.timeout < socket_timeout:
            raise InvalidArgumentError(
                f"Durability.timeout ({self._durability.timeout:g} s) must be below the "
                f"socket timeout ({socket_timeout:g} s): the WAIT or WAITAOF behind a batch "
                "holds its reply"
            )
        parts = urllib.parse.urlsplit(url)
        scheme, query = parts.scheme, dict(urllib.parse.parse_qsl(parts.query))
        options: dict[str, Any] = {}
        if ssl_ca_certs is not None:
            options["ssl_ca_certs"] = str(ssl_ca_certs)
        tls = {**{k: v for k, v in query.items() if k.startswith("ssl_")}, **options}
        if scheme not in ("rediss", "rediss+cluster") and tls:
            raise InvalidArgumentError(
                f"TLS options ({', '.join(tls)}) need a rediss:// URL, not {redact(url)!r}"
            )
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            path = tls.get(name)
            if path is not None and not os.path.isfile(path):
                raise InvalidArgumentError(
                    f"{name} names {path!r}, which is not a file: give the PEM file of the "
                    "CA that signed the server's certificate (ssl_ca_certs) or your "
                    "client certificate and key"
                )
        if scheme != "unix":  # TCP: unix sockets take no keepalive
            options["socket_keepalive"] = True
            options["socket_keepalive_options"] = _KEEPALIVE_OPTIONS
        # redis-py types its asyncio commands as ``Awaitable[T] | T``; the
        # results are checked where they are read instead.
        self._redis: Any = self._open(url, options, socket_timeout, max_connections)
        self._socket_timeout = float(socket_timeout)
        self._append = _Script(_script("append.lua"))
        self._append_source = _without_comments(self._append.source).encode()
        self._appender = self._in_order(socket_timeout)
        self._create_record = _Script(_script("create_record.lua"))
        self._ack = _Script(_script("ack.lua"))
        self._extend = _Script(_script("extend.lua"))
        self._nack = _Script(_script("nack.lua"))
        self._reclaim = _Script(_script("reclaim.lua", "_ids.lua"))
        self._dead_letter = _Script(_script("dead_letter.lua", "_dead_letter_append.lua"))
        self._ack_owned = _Script(_script("ack_owned.lua"))
        self._delete_idle_consumers = _Script(_script("delete_idle_consumers.lua"))
        self._trim = _Script(_script("trim.lua", "_ids.lua"))
        self._unlock = _Script(_script("unlock.lua"))
        self._set_field = _Script(_script("set_field.lua"))
        self._replace_hash = _Script(_script("replace_hash.lua"))
        self._extend_lock = _Script(_script("extend_lock.lua"))
        self._seek = _Script(_script("seek.lua"))
        self._delete_entries = _Script(_script("delete_entries.lua"))
        self._claim_entries = _Script(_script("claim_entries.lua"))
        self._stats = _Script(_script("stats.lua"))
        self._own = _Script(_script("own.lua"))
        self._fence = _Script(_script("fence.lua"))
        self._read_owned = _Script(_script("read_owned.lua"))
        self._hold = _Script(_script("snapshot.lua", "_ids.lua"))
        self._partition_tags: dict[tuple[str, int, tuple[int, ...]], list[str]] = {}
        self._stream_keys: dict[tuple[str, int, tuple[int, ...]], list[str]] = {}
        self._partition_of: dict[bytes, int] = {}

    def _open(
        self, url: str, options: dict[str, Any], socket_timeout: float, max_connections: int
    ) -> Any:
        """The redis-py client for ``url``; ``options``: TLS and keepalive settings."""
        try:
            # With every connection busy (blocking reads hold theirs for up to a
            # read block), a command waits for one, up to socket_timeout,
            # instead of failing with "Too many connections".
            pool = WaitingConnectionPool.from_url(
                url,
                wait_timeout=socket_timeout,
                decode_responses=False,
                max_connections=max_connections,
                socket_timeout=socket_timeout,
                socket_connect_timeout=min(SOCKET_CONNECT_TIMEOUT, socket_timeout),
                health_check_interval=HEALTH_CHECK_INTERVAL,
                # Once more on a fresh connection after a reset (a pooled one the
                # server closed), never after a timeout: the command may have run,
                # and a blocking read would wait its whole block again.
                retry=Retry(NoBackoff(), 1, supported_errors=(rexc.ConnectionError,)),
                retry_on_error=[rexc.ConnectionError],
                **options,
            )
            client = aioredis.Redis.from_pool(pool)
            # Entries stay flat lists (field, value, ...): redis-py's default
            # turns each into a dict, which costs more than decoding it.
            client.set_response_callback("XREADGROUP", _raw)
            _raw_pending(client)
            return client
        except ValueError as exc:
            if "@" not in url and "password=" not in url:
                raise InvalidArgumentError(
                    f"cannot use Redis URL {redact(url)!r}: {exc}; use redis://host:port/db, "
                    "rediss://... for TLS or unix:///path/to/redis.sock"
                ) from exc
            # The parser's message (and so the cause) may quote part of the
            # password, e.g. as a port that "could not be cast to integer".
            raise InvalidArgumentError(
                f"cannot use Redis URL {redact(url)!r}: it is malformed; percent-encode "
                "'/', '?', '#', '@' and ':' in a user name or password (e.g. '/' as %2F) "
                "and use redis://user:password@host:port/db, rediss://... for TLS or "
                "unix:///path/to/redis.sock?password=..."
            ) from None

    def _in_order(self, socket_timeout: float) -> Any:
        """Where appends go: one connection, several batches in flight in order."""
        return InOrderConnection(
            self._redis, timeout=socket_timeout, health_check_interval=HEALTH_CHECK_INTERVAL
        )

    @property
    def url(self) -> str:
        return redact(self._url)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except ConnectionClosed as exc:
            raise ClosedError(
                f"the client's connection to Redis at {self.url} was closed ({exc}): "
                "publish before closing the client"
            ) from exc
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            if isinstance(exc, rexc.AuthenticationError | rexc.AuthorizationError):
                raise AuthenticationError(
                    f"Redis at {self.url} refused the credentials: {exc}; check the user and "
                    "password in the URL (redis://user:password@host:port/db) and that the "
                    "ACL user is enabled"
                ) from exc
            if _caused_by(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
                exc
            ):
                raise CertificateError(
                    f"the TLS certificate of Redis at {self.url} could not be verified: "
                    f"{_tls_reason(exc)}; check that ssl_ca_certs (in the URL or passed to "
                    "connect()) names the CA file that signed the server's certificate, and that "
                    "the host name in the URL is one the certificate names"
                ) from exc
            if _caused_by(exc, ssl.SSLError):
                raise UnavailableError(
                    f"the TLS handshake with Redis at {self.url} failed: {_tls_reason(exc)}; "
                    "check that the port serves TLS (rediss://) and the TLS options"
                ) from exc
            if isinstance(exc, rexc.TimeoutError):
                raise UnavailableError(
                    f"Redis at {self.url} did not answer within {self._socket_timeout:g} s "
                    f"({exc}): the network or the server stalls. A publish may or may not "
                    "have been stored; try again once Redis answers"
                ) from exc
            raise UnavailableError(self._unreachable(exc)) from exc
        except rexc.ResponseError as exc:
            # Plain commands answer "OOM ...", scripts "... used memory > 'maxmemory'".
            if str(exc).startswith("OOM") or "> 'maxmemory'" in str(exc):
                raise ResourceExhaustedError(
                    f"Redis at {self.url} is out of memory and refused a write ({exc}): raise "
                    "its maxmemory, or give the topics a tighter streamsub.Retention so that "
                    "acknowledged messages are trimmed; consumers behind keep entries alive"
                ) from exc
            if str(exc).startswith("NOTOPIC"):  # from append.lua
                raise TopicNotFoundError(
                    f"a topic was deleted while in use ({exc}): create it again with "
                    "create_topic() before publishing"
                ) from exc
            if _no_group(exc):
                raise SubscriptionNotFoundError(
                    f"a subscription's consumer group is gone ({exc}): the subscription or "
                    "its topic was deleted; create it again with create_subscription()"
                ) from exc
            if isinstance(exc, rexc.NoPermissionError):  # NOPERM, also inside a pipeline
                raise BackendError(
                    f"Redis at {self.url} denied this user a command or key: {exc}; give the "
                    "user streamsub's ACL rule (README, Security)"
                ) from exc
            raise BackendError(f"Redis at {self.url} answered an error: {exc}") from exc
        except rexc.RedisError as exc:
            raise BackendError(f"Redis at {self.url} answered an error: {exc}") from exc

    def _tags(self, topic: TopicRecord) -> list[str]:
        """Each partition's hash tag, as the topic's layout says (see ``_keys``)."""
        cache_key = (topic.name, topic.partitions, topic.salts)
        tags = self._partition_tags.get(cache_key)
        if tags is None:
            salts = topic.salts or (0,) * topic.partitions
            tags = [_keys.partition_tag(topic.name, p, salt) for p, salt in enumerate(salts)]
            self._partition_tags[cache_key] = tags
        return tags

    def _keys(self, topic: TopicRecord) -> list[str]:
        cache_key = (topic.name, topic.partitions, topic.salts)
        keys = self._stream_keys.get(cache_key)
        if keys is None:
            keys = [_keys.stream_key(tag) for tag in self._tags(topic)]
            self._stream_keys[cache_key] = keys
            for partition, key in enumerate(keys):
                self._partition_of[key.encode()] = partition
        return keys

    async def _routed(self, key: str | None, *command: Any, resend: bool = True) -> Any:
        """``command``'s reply. ``key``, one of its keys, names the slot whose
        node runs it on a cluster (see RedisClusterBackend); unused here.
        ``resend=False``: a command whose connection broke with it in flight is
        not sent again (its outcome is unknown: the caller learns so from the
        ConnectionError), where redis-py's connection retry would send it once
        more."""
        if resend:
            return await self._redis.execute_command(*command)
        pool = self._redis.connection_pool
        connection = await take_connection(pool)
        try:
            await connection.send_command(*command)
            return await connection.read_response()
        except rexc.ResponseError:
            raise  # an error reply: the connection is fine
        except BaseException:
            await connection.disconnect(nowait=True)  # a reply may still be on its way
            raise
        finally:
            await pool.release(connection)

    async def _pipelined(
        self, calls: Sequence[tuple[str | None, tuple[Any, ...]]], *, resend: bool = True
    ) -> list[Any]:
        """Each (key, command)'s reply, in one round trip; an error reply is the
        exception, in its place. ``key`` as for :meth:`_routed`. ``resend=False``:
        a command whose connection broke is not sent again (on a cluster; here
        redis-py's connection retry still sends it once more)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for _, command in calls:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))

    async def _evalsha(
        self, script: _Script, keys: Sequence[str], args: Sequence[Any], *, resend: bool = True
    ) -> Any:
        """``script``'s reply; ``resend`` as for :meth:`_routed`."""
        sha = script.sha or await script.load(self._redis)
        key = keys[0] if keys else None
        try:
            return await self._routed(key, "EVALSHA", sha, len(keys), *keys, *args, resend=resend)
        except rexc.NoScriptError:
            # Not run. The source, so it runs whichever server answers (a
            # promoted replica, a node that did not get SCRIPT LOAD); loaded
            # again for the next calls.
            await script.load(self._redis)
            source = script.source
            return await self._routed(key, "EVAL", source, len(keys), *keys, *args, resend=resend)

    async def ping(self) -> None:
        """PING; with ``Durability(fsync=True)``, also check that every master
        can fsync for it (``WAITAOF`` and ``appendonly yes``)."""
        with self._errors():
            await self._redis.ping()
        if self._durability.fsync:
            await self._check_fsync()

    async def _on_masters(self, *command: Any) -> dict[str, Any]:
        """``command``'s reply (or the error it answered) from every master, by
        where it is (``host:port``, or the URL on one server)."""
        with self._errors():
            try:
                return {self.url: await self._redis.execute_command(*command)}
            except rexc.ResponseError as exc:
                return {self.url: exc}

    async def _check_fsync(self) -> None:
        """Raise FailedPreconditionError unless every master has ``WAITAOF`` and
        ``appendonly yes``: asked with ``WAITAOF 1 0 1``, which answers at once
        (nothing of this connection's is waiting) or refuses saying why."""
        for where, reply in (await self._on_masters("WAITAOF", 1, 0, 1)).items():
            if isinstance(reply, Exception):
                raise self._fsync_refusal(reply, where) or self._translated(reply)

    def _fsync_refusal(self, exc: Exception, where: str) -> StreamsubError | None:
        """The error for a ``WAITAOF`` that ``where`` refused because it cannot
        fsync for ``Durability(fsync=True)``; None for any other error."""
        text = str(exc).lower()
        if "unknown command" in text and "waitaof" in text:
            return FailedPreconditionError(
                f"Redis at {where} has no WAITAOF (Redis and Valkey have it from 7.2), which "
                "Durability(fsync=True) needs: upgrade the server, or drop fsync "
                "(Durability(replicas=N) alone waits for replicas without fsync)"
            )
        if "appendonly is disabled" in text:
            return FailedPreconditionError(
                f"Redis at {where} runs with appendonly no, so Durability(fsync=True) has no "
                "file to fsync: turn AOF on (appendonly yes in its configuration, or CONFIG "
                "SET appendonly yes), or drop fsync"
            )
        return None

    async def close(self) -> None:
        await self._appender.close()
        await self._redis.aclose()

    # --- records ---------------------------------------------------------------
    async def _create(self, key: str, registry: str, name: str, fields: dict[str, str]) -> Any:
        flat = [item for pair in fields.items() for item in pair]
        with self._errors():
            existing = await self._evalsha(self._create_record, [key], flat)
            await self._redis.sadd(registry, name)
        return existing

    async def _read(self, *commands: tuple[Any, ...]) -> list[Any]:
        """The replies to ``commands``, read-only commands on records and
        registries (``HGETALL``, ``SMEMBERS``), in order; pipelined when there
        are several. (The cluster backend asks a replica while a master is down.)"""
        if len(commands) == 1:
            return [await self._redis.execute_command(*commands[0])]
        async with self._redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute())

    async def _get(self, key: str) -> dict[str, str] | None:
        with self._errors():
            (raw,) = await self._read(("HGETALL", key))
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def _list(self, registry: str) -> list[dict[str, str]]:
        with self._errors():
            (members,) = await self._read(("SMEMBERS", registry))
            names = sorted(n.decode() for n in members)
            prefix = {
                _keys.TOPICS: _keys.topic_key,
                _keys.SUBSCRIPTIONS: _keys.subscription_key,
                _keys.SNAPSHOTS: _keys.snapshot_key,
            }[registry]
            raws = await self._read(*(("HGETALL", prefix(name)) for name in names))
        return [{k.decode(): v.decode() for k, v in raw.items()} for raw in raws if raw]

    @staticmethod
    def _pairs(flat: Sequence[bytes]) -> dict[str, str]:
        return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}

    # --- topics ----------------------------------------------------------------
    @staticmethod
    def _topic_fields(record: TopicRecord) -> dict[str, str]:
        return {
            "name": record.name,
            "partitions": str(record.partitions),
            "layout": record.layout,
            "created": repr(record.created),
            "retention": _retention_json(record.retention),
            **({"salts": " ".join(map(str, record.salts))} if record.salts else {}),
        }

    @staticmethod
    def _topic(fields: Mapping[str, str]) -> TopicRecord:
        retention = fields.get("retention")
        with _parsing("topic", fields):
            return TopicRecord(
                name=fields["name"],
                partitions=int(fields["partitions"]),
                layout=fields["layout"],
                created=float(fields["created"]),
                retention=Retention.from_dict(json.loads(retention)) if retention else None,
                salts=tuple(int(salt) for salt in fields.get("salts", "").split()),
            )

    async def _layout(self, record: TopicRecord) -> TopicRecord:
        """``record`` with the layout a new topic gets here."""
        return dataclasses.replace(record, layout=_keys.LAYOUT, salts=())

    async def create_topic(self, record: TopicRecord) -> TopicRecord:
        record = await self._layout(record)
        stored = await self.get_topic(record.name)
        if stored is not None:
            return stored
        # Every partition's stream exists from now on: appends refuse a missing
        # stream, so a publisher that cached a since-deleted topic cannot
        # recreate its streams and lose what it writes.
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in self._keys(record):
                    pipe.xgroup_create(key, "streamsub-create", id="$", mkstream=True)
                    pipe.xgroup_destroy(key, "streamsub-create")
                await pipe.execute()
        existing = await self._create(
            _keys.topic_key(record.name), _keys.TOPICS, record.name, self._topic_fields(record)
        )
        return record if existing is None else self._topic(self._pairs(existing))

    async def get_topic(self, name: str) -> TopicRecord | None:
        fields = await self._get(_keys.topic_key(name))
        return None if fields is None else self._topic(fields)

    async def list_topics(self) -> list[TopicRecord]:
        return [self._topic(f) for f in await self._list(_keys.TOPICS)]

    async def delete_topic(self, record: TopicRecord) -> None:
        dropped = [
            key
            for tag in self._tags(record)
            for key in (_keys.dropped_key(tag), _keys.holds_key(tag))
        ]
        with self._errors():
            await self._redis.delete(*self._keys(record), *dropped, _keys.topic_key(record.name))
            await self._redis.srem(_keys.TOPICS, record.name)
            # Publishers' links (one per publisher and partition, expiring within a
            # minute anyway): found by name, as their writers are not known here.
            streams = {key + ":link:" for key in self._keys(record)}
            links = [
                key
                async for key in self._redis.scan_iter(match=_keys.link_pattern(record.name))
                if key.decode().partition(":link:")[0] + ":link:" in streams
            ]
            if links:
                await self._redis.delete(*links)

    # --- subscriptions ---------------------------------------------------------
    @staticmethod
    def _subscription(fields: Mapping[str, str]) -> SubscriptionRecord:
        with _parsing("subscription", fields):
            return SubscriptionRecord(
                name=fields["name"],
                topic=fields["topic"],
                created=float(fields["created"]),
                settings=json.loads(fields["settings"]),
            )

    async def create_subscription(
        self, record: SubscriptionRecord, topic: TopicRecord, start_id: str
    ) -> SubscriptionRecord:
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in self._keys(topic):
                    pipe.xgroup_create(key, record.name, id=start_id, mkstream=True)
                results = await pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, Exception) and not str(result).startswith("BUSYGROUP"):
                with self._errors():
                    raise result
        fields = {
            "name": record.name,
            "topic": record.topic,
            "created": repr(record.created),
            "settings": json.dumps(dict(record.settings), sort_keys=True),
        }
        existing = await self._create(
            _keys.subscription_key(record.name), _keys.SUBSCRIPTIONS, record.name, fields
        )
        return record if existing is None else self._subscription(self._pairs(existing))

    async def get_subscription(self, name: str) -> SubscriptionRecord | None:
        fields = await self._get(_keys.subscription_key(name))
        return None if fields is None else self._subscription(fields)

    async def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionRecord]:
        records = [self._subscription(f) for f in await self._list(_keys.SUBSCRIPTIONS)]
        return [r for r in records if topic is None or r.topic == topic]

    async def delete_subscription(self, record: SubscriptionRecord, topic: TopicRecord) -> None:
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for partition, key in enumerate(self._keys(topic)):
                    pipe.xgroup_destroy(key, record.name)
                    pipe.delete(
                        _keys.delay_key(self._tags(topic)[partition], record.name),
                        _keys.times_key(self._tags(topic)[partition], record.name),
                        _keys.fence_key(self._tags(topic)[partition], record.name),
                    )
                # One key per DEL: on a cluster the records live in other slots.
                pipe.delete(_keys.subscription_key(record.name))
                pipe.delete(_keys.members_key(record.name), _keys.owners_key(record.name))
                pipe.srem(_keys.SUBSCRIPTIONS, record.name)
                results = await pipe.execute(raise_on_error=False)
            # A partition whose stream or group is already gone is what deleting
            # wants; any other error is the server's and is raised.
            for result in results:
                if isinstance(result, Exception) and not _is_missing(result):
                    raise result

    async def group_info(self, topic: TopicRecord, group: str) -> list[GroupInfo]:
        keys = self._keys(topic)
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.xlen(key)
                    pipe.xinfo_groups(key)
                results = await pipe.execute(raise_on_error=False)
            for result in results:
                if isinstance(result, Exception):
                    raise result
        infos = []
        for partition in range(len(keys)):
            length, groups = results[2 * partition], results[2 * partition + 1]
            found = [g for g in groups if _text(g["name"]) == group]
            if not found:
                raise SubscriptionNotFoundError(
                    f"partition {partition} of topic {topic.name!r} has no consumer group "
                    f"{group!r}: the subscription was deleted or its topic recreated; "
                    "create the subscription again"
                )
            g = found[0]
            infos.append(
                GroupInfo(
                    partition=partition,
                    length=int(length),
                    pending=int(g["pending"]),
                    last_delivered_id=_text(g["last-delivered-id"]),
                    lag=None if g.get("lag") is None else int(g["lag"]),
                    consumers=int(g["consumers"]),
                )
            )
        return infos

    # --- data ------------------------------------------------------------------
    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        # EVAL, not EVALSHA: commands are in flight behind each other, and a
        # NOSCRIPT retry would let a later batch overtake an earlier one.
        keys = self._keys(topic)
        source = self._append_source
        partitions = list(batch)
        wakes = self._wakes()  # no await: calls must reach _append_many in order
        commands: list[tuple[Any, ...]] = []
        for p in partitions:
            link = links.get(p) if links else None
            wake = (_keys.wake_channel(keys[p]),) if wakes else ()
            if link is None:
                if wake:
                    commands.append(("EVAL", source, 1, keys[p], batch[p], "", "", *wake))
                else:
                    commands.append(("EVAL", source, 1, keys[p], batch[p]))
            else:
                after = "" if link.after is None else link.after
                link_key = _keys.link_key(keys[p], link.writer)
                commands.append(
                    ("EVAL", source, 2, keys[p], link_key, batch[p], link.number, after, *wake)
                )
        with self._errors():
            replies, confirmations = await self._append_many(commands, self._behind())
            self._raise_lost(replies)
        results: dict[int, list[str] | StreamsubError] = {}
        for p, reply in zip(partitions, replies, strict=True):
            if isinstance(reply, Exception):
                results[p] = self._translated(reply)
            else:
                ids = reply.decode().split()  # append.lua's ids, space-separated
                if ids and ids[-1] == "!":  # its SPUBLISH was refused
                    ids.pop()
                    self._wake_refused()
                results[p] = ids
        # Each node's confirmation judges what that node stored, and only that:
        # on a cluster, a master left without a replica fails its partitions'
        # writes, not those the other masters' replicas confirmed.
        for confirmation, indexes in confirmations:
            error = self._unconfirmed(topic, confirmation)
            if error is not None:
                for i in indexes:
                    if not isinstance(results[partitions[i]], StreamsubError):
                        results[partitions[i]] = error
        return results

    def write_groups(
        self, topic: TopicRecord, partitions: Iterable[int]
    ) -> dict[str | None, list[int]] | None:
        return None  # one server

    def _wakes(self) -> bool:
        """Whether appends announce themselves on their partition's wake-up
        channel (``SPUBLISH``): never on one server, where readers block on
        ``XREADGROUP`` already."""
        return False

    def _wake_refused(self) -> None:
        """An append's ``SPUBLISH`` was refused (see :meth:`_wakes`)."""

    def _raise_lost(self, replies: Sequence[Any]) -> None:
        """Raise a lost connection found among a write's replies: the outcome of
        every write on it is unknown, and on one server that is all of them,
        so the call fails as a whole (and the publisher fails what is queued
        behind it at once, not one socket timeout a batch)."""
        for reply in replies:
            if isinstance(reply, rexc.ConnectionError | rexc.TimeoutError | OSError):
                raise reply

    def _behind(self) -> tuple[Any, ...] | None:
        """What is sent behind a batch to wait for its durability (Durability)."""
        durability = self._durability
        timeout_ms = max(1, int(durability.timeout * 1000))
        if durability.fsync:
            return ("WAITAOF", 1, durability.replicas, timeout_ms)
        if durability.replicas:
            return ("WAIT", durability.replicas, timeout_ms)
        return None

    def _unconfirmed(self, topic: TopicRecord, reply: Any) -> StreamsubError | None:
        """Why a node's reply to :meth:`_behind`'s command does not confirm what
        Durability asks of the writes it covers; None when it does."""
        durability = self._durability
        if isinstance(reply, rexc.ResponseError):
            refusal = self._fsync_refusal(reply, self.url)
            if refusal is not None:
                error: StreamsubError = FailedPreconditionError(
                    f"a batch for topic {topic.name!r} was stored on its master, but "
                    f"not confirmed: {refusal}"
                )
                error.__cause__ = reply
                return error
        if durability.fsync:
            # A wait that failed (its connection lost, its node a replica now)
            # confirmed nothing.
            if isinstance(reply, Exception):
                error = UnavailableError(
                    f"a batch for topic {topic.name!r} was stored on its master but its "
                    f"fsync could not be confirmed ({type(reply).__name__}: {reply}): it may "
                    "be lost if that server fails now; publishing it again may store it twice"
                )
                error.__cause__ = reply
                return error
            local, replicas = map(int, reply)
            if local >= 1 and replicas >= durability.replicas:
                return None
            missing = (
                [] if local else ["the master did not fsync it (with appendfsync no it never does)"]
            )
            if replicas < durability.replicas:
                missing.append(
                    f"only {replicas} of the {durability.replicas} replicas asked for "
                    "fsynced it (a replica counts only with appendonly yes)"
                )
            return UnavailableError(
                f"a batch for topic {topic.name!r} was stored on its master but "
                f"{' and '.join(missing)} within {durability.timeout:g} s (Durability with "
                "fsync): it may be lost if that server fails now; publishing it again may "
                "store it twice"
            )
        replicas = 0 if isinstance(reply, Exception) else int(reply)
        if replicas >= durability.replicas:
            return None
        return UnavailableError(
            f"a batch for topic {topic.name!r} was stored on its master but only "
            f"{replicas} of the {durability.replicas} replicas asked for confirmed it "
            f"within {durability.timeout:g} s (Durability): it may be lost if that "
            "master fails now; publishing it again may store it twice"
        )

    def _unreachable(self, exc: Exception) -> str:
        """The message of the UnavailableError for a connection refused or lost."""
        return (
            f"cannot reach Redis at {self.url}: {exc}; check that the server runs "
            "(`streamsub dev-server` starts one) and that STREAMSUB_URL or the URL is right"
        )

    def _translated(self, exc: Exception) -> StreamsubError:
        """``exc`` (a reply in place of a result) as the error ``_errors`` makes of it."""
        if isinstance(exc, rexc.ResponseError) and str(exc).startswith("BROKENLINK"):
            return BrokenLinkError(f"Redis at {self.url} did not run a write: {exc}")
        try:
            with self._errors():
                raise exc
        except StreamsubError as translated:
            return translated
        raise AssertionError("unreachable")  # pragma: no cover

    async def _append_many(
        self, commands: list[tuple[Any, ...]], after: tuple[Any, ...] | None
    ) -> tuple[list[Any], list[tuple[Any, list[int]]]]:
        """Send the appends in order on the in-order connection, ``after`` (a WAIT
        or WAITAOF, maybe shared with other calls') behind them; return their
        replies, and ``after``'s with the indexes of the appends it confirms
        (every one: a single server stored them all)."""
        replies = await self._appender.call_many(commands, after)
        if not after:
            return replies, []
        return replies[:-1], [(replies[-1], list(range(len(commands))))]

    async def _evalsha_many(
        self,
        script: _Script,
        calls: Sequence[tuple[int, Sequence[str], Sequence[Any]]],
        *,
        resend: bool = True,
    ) -> list[Any]:
        """Run ``script`` once per (partition, keys, args) call in one round trip.

        A call that failed with NOSCRIPT did not run, so only those run again,
        with the script's source (so they run on whichever server answers, a
        promoted replica or a node that missed SCRIPT LOAD), and the script is
        loaded again for the next calls: nothing runs twice. ``resend`` as for
        :meth:`_pipelined`.
        """
        sha = script.sha or await script.load(self._redis)
        results: list[Any] = [None] * len(calls)
        replies = await self._pipelined(
            [
                (keys[0] if keys else None, ("EVALSHA", sha, len(keys), *keys, *args))
                for _, keys, args in calls
            ],
            resend=resend,
        )
        missing = []
        for i, reply in enumerate(replies):
            if isinstance(reply, rexc.NoScriptError):
                missing.append(i)
            elif isinstance(reply, Exception):
                raise reply
            else:
                results[i] = reply
        if not missing:
            return results
        await script.load(self._redis)
        again = [calls[i] for i in missing]
        replies = await self._pipelined(
            [
                (keys[0] if keys else None, ("EVAL", script.source, len(keys), *keys, *args))
                for _, keys, args in again
            ],
            resend=resend,
        )
        for i, reply in zip(missing, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            results[i] = reply
        return results

    async def _group_missing(
        self, topic: TopicRecord, group: str, exc: SubscriptionNotFoundError
    ) -> None:
        """A step was answered NOGROUP: return (the caller re-raises ``exc``: the
        subscription is gone for good) if the subscription or its topic was
        deleted, the topic made anew, or no partition has the group any more (a
        deletion under way, or one that stopped half done); otherwise raise
        UnavailableError, which the engine retries after its backoff. With the
        records in place and the group on other partitions, a missing group is
        a node that has not caught up: on a cluster, a node answering from an
        older view of a failover or a moved slot; anywhere, a failover that
        lost the group's creation (then it persists, and the log says what to
        do)."""
        subscription = await self.get_subscription(group)  # UnavailableError: retried
        current = await self.get_topic(topic.name)
        if (
            subscription is None
            or subscription.topic != topic.name
            or current is None
            or _identity(current) != _identity(topic)
            or not await self._group_anywhere(topic, group)
        ):
            return
        raise UnavailableError(
            f"a partition of topic {topic.name!r} has no consumer group {group!r} on the node "
            f"that answered, though the subscription exists ({exc.__cause__ or exc}): a node "
            "behind a failover or a slot move answers so for moments; if it persists, the "
            "group was lost (a failover lost its last writes, or a key was deleted by hand): "
            "delete and create the subscription again"
        ) from exc

    async def _group_anywhere(self, topic: TopicRecord, group: str) -> bool:
        """Whether some partition of ``topic`` has the consumer group ``group``."""
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in self._keys(topic):
                    pipe.xinfo_groups(key)
                results = await pipe.execute(raise_on_error=False)
        wanted = group.encode()
        for result in results:
            if isinstance(result, Exception):
                if _is_missing(result):
                    continue
                with self._errors():
                    raise result
            if any(g["name"] in (group, wanted) for g in result):
                return True
        return False

    @_group_checked
    async def read(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partitions: Sequence[int],
        count: int,
        block_ms: int | None,
    ) -> list[Entry]:
        keys = self._keys(topic)
        streams = {keys[p]: ">" for p in partitions}
        with self._errors():
            reply = await self._redis.xreadgroup(
                group,
                consumer,
                streams,
                count=count,
                block=block_ms,
            )
        entries: list[Entry] = []
        if not reply:
            return entries
        partition_of = self._partition_of
        for key, items in reply:
            partition = partition_of[key]
            for entry_id, fields in items:
                entries.append(Entry(partition, entry_id.decode(), fields, 1))
        return entries

    @_group_checked
    async def fence(self, topic: TopicRecord, group: str, tokens: Mapping[int, int]) -> set[int]:
        tags, keys = self._tags(topic), self._keys(topic)
        calls = [
            (p, [_keys.fence_key(tags[p], group), keys[p]], [token, group])
            for p, token in tokens.items()
        ]
        with self._errors():
            replies = await self._evalsha_many(self._fence, calls)
        return {p for (p, _, _), held in zip(calls, replies, strict=True) if not int(held)}

    def _read_owned_call(
        self, topic: TopicRecord, group: str, partitions: Sequence[int]
    ) -> list[str]:
        keys, tags = self._keys(topic), self._tags(topic)
        return [k for p in partitions for k in (keys[p], _keys.fence_key(tags[p], group))]

    def _owned_entries(
        self, partitions: Sequence[int], reply: Sequence[Any]
    ) -> tuple[list[Entry], set[int], dict[int, bytes]]:
        """A read_owned.lua reply: (entries, fenced partitions, partition -> last id)."""
        fenced, read, last = reply
        entries = [
            Entry(partitions[int(read[i]) - 1], entry_id.decode(), fields, 1)
            for i in range(0, len(read), 2)
            for entry_id, fields in read[i + 1]
        ]
        newest = {partitions[int(last[i]) - 1]: last[i + 1] for i in range(0, len(last), 2)}
        return entries, {partitions[int(i) - 1] for i in fenced}, newest

    @_group_checked
    async def read_owned(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        tokens: Mapping[int, int],
        count: int,
        block_ms: int | None,
    ) -> OwnedRead:
        # A script cannot block: the fenced read answers at once, and when it
        # found nothing a plain XREAD (no group: it delivers nothing) waits for
        # an entry after each stream's newest, then the fenced read runs again.
        partitions = list(tokens)
        keys = self._read_owned_call(topic, group, partitions)
        args = [group, consumer, count, *tokens.values()]
        # Never sent twice: a read whose reply was lost with its connection
        # delivered what the reader never saw; the reader learns so from the
        # error and takes it back before reading on (a second read would hand
        # it the keys' later entries first).
        with self._errors():
            reply = await self._evalsha(self._read_owned, keys, args, resend=False)
            entries, fenced, newest = self._owned_entries(partitions, reply)
            if entries or fenced or not block_ms or not newest:
                return OwnedRead(entries, frozenset(fenced))
            streams = {self._keys(topic)[p]: after for p, after in newest.items()}
            if not await self._redis.xread(streams, count=1, block=block_ms):
                return OwnedRead([], frozenset(fenced))
            reply = await self._evalsha(self._read_owned, keys, args, resend=False)
        entries, more_fenced, _ = self._owned_entries(partitions, reply)
        return OwnedRead(entries, frozenset(fenced | more_fenced))

    @_group_checked
    async def ack(
        self,
        topic: TopicRecord,
        group: str,
        ids: Mapping[int, Sequence[str]],
        forget: Mapping[int, Sequence[str]] | None = None,
    ) -> int:
        forget = forget or {}
        calls = [
            (
                p,
                self._companions(topic, p, group)[::2],
                [group, " ".join(entry_ids), " ".join(forget.get(p, ()))],
            )
            for p, entry_ids in ids.items()
        ]
        with self._errors():
            if len(calls) == 1:
                _, keys, args = calls[0]
                return int(await self._evalsha(self._ack, keys, args))
            replies = await self._evalsha_many(self._ack, calls)
        return sum(int(n) for n in replies)

    def _companions(self, topic: TopicRecord, partition: int, group: str) -> list[str]:
        return [
            self._keys(topic)[partition],
            _keys.delay_key(self._tags(topic)[partition], group),
            _keys.times_key(self._tags(topic)[partition], group),
        ]

    @_group_checked
    async def extend(
        self, topic: TopicRecord, group: str, consumer: str, ids: Mapping[int, Sequence[str]]
    ) -> dict[int, list[str]]:
        keys = self._keys(topic)
        calls = [(p, [keys[p]], [group, consumer, *entry_ids]) for p, entry_ids in ids.items()]
        with self._errors():
            replies = await self._evalsha_many(self._extend, calls)
        return {c[0]: [i.decode() for i in reply] for c, reply in zip(calls, replies, strict=True)}

    @_group_checked
    async def nack(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        items: Mapping[int, Sequence[NackItem]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        calls = []
        for partition, entries in items.items():
            args: list[Any] = [group, consumer, min_idle_ms]
            for item in entries:
                args += (
                    item.entry_id,
                    item.delay_ms,
                    item.delivered_ms,
                    item.attempt,
                    1 if item.handled else 0,
                )
            calls.append((partition, self._companions(topic, partition, group), args))
        with self._errors():
            replies = await self._evalsha_many(self._nack, calls)
        return {c[0]: [i.decode() for i in reply] for c, reply in zip(calls, replies, strict=True)}

    @_group_checked
    async def reclaim(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        cursors: Mapping[int, str],
        min_idle_ms: int,
        count: int,
        max_attempts: int,
        skip: Mapping[int, Sequence[str]] | None = None,
        *,
        take_parked: bool = False,
        tokens: Mapping[int, int] | None = None,
    ) -> tuple[list[Reclaimed], dict[int, str]]:
        skip = skip or {}
        calls = [
            (
                p,
                self._companions(topic, p, group)
                + ([_keys.fence_key(self._tags(topic)[p], group)] if tokens is not None else []),
                [
                    group,
                    consumer,
                    min_idle_ms,
                    cursor,
                    count,
                    max_attempts,
                    " ".join(skip.get(p, ())),
                    "1" if take_parked else "0",
                    *([tokens.get(p, 0)] if tokens is not None else []),
                ],
            )
            for p, cursor in cursors.items()
        ]
        with self._errors():
            replies = await self._evalsha_many(self._reclaim, calls)
        found: list[Reclaimed] = []
        next_cursors: dict[int, str] = {}
        for (partition, _, _), (cursor, items) in zip(calls, replies, strict=True):
            next_cursors[partition] = cursor.decode()
            for entry_id, flat, delivered, first, last, state in items:
                fields = flat or []
                found.append(
                    Reclaimed(
                        Entry(partition, entry_id.decode(), fields, int(delivered)),
                        state=_RECLAIM_STATES[int(state)],
                        first_delivery_ms=int(first),
                        last_delivery_ms=int(last),
                    )
                )
        return found, next_cursors

    @_group_checked
    async def ack_owned(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        ids: Mapping[int, Sequence[tuple[str, int]]],
    ) -> dict[int, list[str]]:
        calls = [
            (
                p,
                self._companions(topic, p, group)[::2],
                [group, consumer, *(value for pair in pairs for value in pair)],
            )
            for p, pairs in ids.items()
        ]
        with self._errors():
            replies = await self._evalsha_many(self._ack_owned, calls)
        return {c[0]: [i.decode() for i in reply] for c, reply in zip(calls, replies, strict=True)}

    @_group_checked
    async def dead_letter(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partition: int,
        entry_id: str,
        target: TopicRecord,
        target_partition: int,
        packed: bytes,
        first_delivery_ms: int | None,
        last_delivery_ms: int | None,
    ) -> str | None:
        # One server: the step is atomic. (Cluster: append, then ack.)
        stream, delays, times = self._companions(topic, partition, group)
        keys = [stream, self._keys(target)[target_partition], times, delays]
        args = [
            group,
            consumer,
            entry_id,
            "" if first_delivery_ms is None else first_delivery_ms,
            "" if last_delivery_ms is None else last_delivery_ms,
            packed,
        ]
        with self._errors():
            new_id = await self._evalsha(self._dead_letter, keys, args)
        if new_id is None:
            return None
        return f"{target_partition}-{new_id.decode()}"

    @_group_checked
    async def delete_idle_consumers(
        self, topic: TopicRecord, group: str, consumer: str, min_idle_ms: int
    ) -> list[str]:
        keys = self._keys(topic)
        calls = [(p, [keys[p]], [group, min_idle_ms, consumer]) for p in range(topic.partitions)]
        with self._errors():
            replies = await self._evalsha_many(self._delete_idle_consumers, calls)
        return sorted({name.decode() for reply in replies for name in reply})

    async def own_partitions(
        self,
        topic: TopicRecord,
        group: str,
        member: str,
        lease_ms: int,
        *,
        release: Sequence[int] = (),
        leave: bool = False,
        take: bool = True,
        instance: str = "",
        claim: bool = False,
    ) -> Ownership:
        keys = [_keys.members_key(group), _keys.owners_key(group)]
        args: list[str | int] = [
            member,
            lease_ms,
            topic.partitions,
            "1" if leave else "0",
            "1" if take else "0",
            "1" if claim else "0",
            instance,
            "0",
        ]
        args.extend(release)
        with self._errors():
            reply = await self._evalsha(self._own, keys, args)
            if int(reply[5]):
                # No records: the subscription was deleted (they went with it),
                # or they were never made (its first member, or none left).
                if leave or not await self._redis.exists(_keys.subscription_key(group)):
                    raise SubscriptionNotFoundError(
                        f"subscription {group!r} was deleted while its subscribers kept "
                        "partition ownership: create it again with create_subscription()"
                    )
                args[7] = "1"
                reply = await self._evalsha(self._own, keys, args)
        owned, give, members, waiting, fenced, _ = reply
        return Ownership(
            owned={int(owned[i]): int(owned[i + 1]) for i in range(0, len(owned), 2)},
            hand_back=frozenset(int(p) for p in give),
            members=int(members),
            waiting=int(waiting),
            fenced=bool(int(fenced)),
        )

    async def partition_owners(self, group: str) -> dict[int, tuple[str, int]]:
        with self._errors():
            raw = await self._redis.hgetall(_keys.owners_key(group))
            now = await self.server_time()
        owners: dict[int, tuple[str, int]] = {}
        for field, value in raw.items():
            name = field.decode()
            if not name.isdigit():
                continue  # a token counter
            member, token, expiry = value.decode().rsplit(" ", 2)
            if int(expiry) / 1000 > now:
                owners[int(name)] = (member, int(token))
        return owners

    @_group_checked
    async def pending_owners(
        self, topic: TopicRecord, group: str, ids: Mapping[int, Sequence[str]]
    ) -> dict[tuple[int, str], str | None]:
        keys = self._keys(topic)
        wanted = [(p, entry_id) for p, entry_ids in ids.items() for entry_id in entry_ids]
        # Through _pipelined: on a cluster its router follows a migrating slot
        # (redis-py's pipeline fails "TTL exhausted" there).
        with self._errors():
            replies = await self._pipelined(
                [(keys[p], ("XPENDING", keys[p], group, i, i, 1)) for p, i in wanted]
            )
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        owners: dict[tuple[int, str], str | None] = {}
        for where, reply in zip(wanted, replies, strict=True):
            # A range reply, raw: [[id, consumer, idle ms, deliveries]] or [].
            owners[where] = _text(reply[0][1]) if reply else None
        return owners

    # --- operations: retention --------------------------------------------------
    async def server_info(self) -> ServerInfo:
        try:
            with self._errors():
                info = await self._redis.info()
        except UnavailableError:
            raise
        except BackendError:  # INFO refused (an ACL): nothing is known, nothing assumed
            return ServerInfo((0, 0, 0), None)
        raw_version = str(info.get("redis_version", "0.0.0"))
        parts = [int(p) if p.isdigit() else 0 for p in raw_version.split(".")[:3]]
        major, minor, patch = ([*parts, 0, 0, 0])[:3]
        policy = info.get("maxmemory_policy")
        return ServerInfo((major, minor, patch), None if policy is None else str(policy))

    async def locate_partitions(self, topic: TopicRecord) -> list[PartitionNode]:
        """Every partition is on the one server: its address as connected to."""
        kwargs = self._redis.connection_pool.connection_kwargs
        path = kwargs.get("path")
        address = (
            str(path) if path else f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        )
        return [PartitionNode(partition, address) for partition in range(topic.partitions)]

    async def server_time(self) -> float:
        with self._errors():
            seconds, micros = await self._redis.time()
        return int(seconds) + int(micros) / 1_000_000

    async def set_retention(self, topic: TopicRecord, retention: Retention | None) -> None:
        # Only on a record that exists, in one step: an HSET racing delete_topic
        # would recreate a record that holds nothing but the policy.
        with self._errors():
            stored = await self._evalsha(
                self._set_field,
                [_keys.topic_key(topic.name)],
                ["retention", _retention_json(retention)],
            )
        if not stored:
            raise TopicNotFoundError(
                f"topic {topic.name!r} does not exist (deleted meanwhile?): create it first"
            )

    async def trim(
        self,
        topic: TopicRecord,
        partition: int,
        *,
        max_age: float | None,
        max_length: int | None,
        drop_unacked: bool,
        batch: int,
        acked_trim: bool,
        floor: str | None = None,
        dead_letters: bool = False,
    ) -> tuple[int, int, bool]:
        keys = [
            self._keys(topic)[partition],
            _keys.dropped_key(self._tags(topic)[partition]),
            _keys.holds_key(self._tags(topic)[partition]),
        ]
        args = [
            "" if max_age is None else repr(max_age * 1000),
            "" if max_length is None else max_length,
            1 if drop_unacked else 0,
            batch,
            1 if acked_trim else 0,
            floor or "",
            1 if dead_letters else 0,
        ]
        with self._errors():
            deleted, dropped, more = await self._evalsha(self._trim, keys, args)
        return int(deleted), int(dropped), bool(more)

    async def dropped_unacked(self, topic: TopicRecord) -> dict[int, int]:
        keys = [_keys.dropped_key(tag) for tag in self._tags(topic)]
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.get(key)
                values = await pipe.execute()
        return {p: int(v or 0) for p, v in enumerate(values)}

    async def try_lock(self, name: str, token: str, ttl: float) -> bool:
        with self._errors():
            taken = await self._redis.set(
                _keys.lock_key(name), token, nx=True, px=max(1, int(ttl * 1000))
            )
        return bool(taken)

    async def extend_lock(self, name: str, token: str, ttl: float) -> bool:
        with self._errors():
            kept = await self._evalsha(
                self._extend_lock, [_keys.lock_key(name)], [token, max(1, int(ttl * 1000))]
            )
        return bool(kept)

    async def unlock(self, name: str, token: str) -> None:
        with self._errors():
            await self._evalsha(self._unlock, [_keys.lock_key(name)], [token])

    # --- operations: seek and snapshots ----------------------------------------
    _RESTORED_IDLE_MS = 86_400_000
    """Entries a snapshot seek makes pending again look idle for a day, longer
    than any ack deadline, so the next reclaimer sweep delivers them."""

    SEEK_STEP = 10_000
    """Pending entries one seek step looks at (or ids it restores) at most."""

    async def seek_partition(
        self, topic: TopicRecord, group: str, partition: int, plan: PartitionSeek, consumer: str
    ) -> tuple[int, int]:
        tag = self._tags(topic)[partition]
        keys = [
            *self._companions(topic, partition, group),
            _keys.seek_key(tag, group),
            _keys.fence_key(tag, group),
        ]
        acked = restored = 0
        with self._errors():
            try:
                for i in range(0, len(plan.redeliver), self.SEEK_STEP):
                    chunk = plan.redeliver[i : i + self.SEEK_STEP]
                    args = [group, "restore", consumer, self._RESTORED_IDLE_MS, *chunk]
                    restored += int((await self._evalsha(self._seek, keys, args))[1])
                # Set after restoring: an ordered partition's next owner (see
                # seek.lua) must find the restored entries when it takes over.
                _, _, position = await self._evalsha(
                    self._seek, keys, [group, "set", plan.position, "1" if restored else "0"]
                )
                cursor = "-"
                while cursor:
                    args = [group, "ack", _text(position), cursor, self.SEEK_STEP]
                    n, _, next_cursor = await self._evalsha(self._seek, keys, args)
                    acked, cursor = acked + int(n), _text(next_cursor)
            finally:
                await self._evalsha(self._seek, keys, [group, "done"])
        return acked, restored

    async def hold_positions(
        self, topic: TopicRecord, group: str, name: str, lifetime: float, max_pending: int
    ) -> tuple[dict[int, PartitionPosition], float, float]:
        keys = self._keys(topic)
        args = [group, name, int(lifetime * 1000), max_pending]
        tags = self._tags(topic)
        calls = [(p, [key, _keys.holds_key(tags[p])], args) for p, key in enumerate(keys)]
        with self._errors():
            replies = await self._evalsha_many(self._hold, calls)
        held = [p for p, reply in enumerate(replies) if _text(reply[0]) == "ok"]
        failed = {_text(reply[0]) for reply in replies} - {"ok"}
        if failed:
            await self.release_holds(topic, name, held)
        if "exists" in failed:
            raise AlreadyExistsError(
                f"snapshot {name!r} exists: delete it first or use another name"
            )
        if "nogroup" in failed:
            raise SubscriptionNotFoundError(
                f"topic {topic.name!r} has no consumer group {group!r} on every partition: "
                "the subscription was deleted or its topic recreated; create it again"
            )
        if failed:
            partition = next(p for p, r in enumerate(replies) if _text(r[0]) == "toomany")
            raise FailedPreconditionError(
                f"subscription {group!r} has more than {max_pending} pending messages on "
                f"partition {partition}: a snapshot records at most that many; let "
                "subscribers catch up first"
            )
        positions = {
            p: PartitionPosition(_text(reply[1]), tuple(_text(i) for i in reply[4:]))
            for p, reply in enumerate(replies)
        }
        return positions, int(replies[0][2]) / 1000, int(replies[0][3]) / 1000

    async def release_holds(
        self, topic: TopicRecord, name: str, partitions: Sequence[int] | None = None
    ) -> None:
        chosen = range(topic.partitions) if partitions is None else partitions
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for p in chosen:
                    pipe.hdel(_keys.holds_key(self._tags(topic)[p]), name)
                await pipe.execute()

    async def create_snapshot(self, record: SnapshotRecord) -> bool:
        fields = {
            "name": record.name,
            "subscription": record.subscription,
            "topic": record.topic,
            "created": repr(record.created),
            "expires": repr(record.expires),
            "positions": json.dumps(positions_json(record.positions)),
        }
        existing = await self._create(
            _keys.snapshot_key(record.name), _keys.SNAPSHOTS, record.name, fields
        )
        return existing is None

    @staticmethod
    def _snapshot(fields: Mapping[str, str]) -> SnapshotRecord:
        with _parsing("snapshot", fields):
            return SnapshotRecord(
                name=fields["name"],
                subscription=fields["subscription"],
                topic=fields["topic"],
                created=float(fields["created"]),
                positions=positions_from_json(json.loads(fields["positions"])),
                expires=float(fields["expires"]),
            )

    async def get_snapshot(self, name: str) -> SnapshotRecord | None:
        fields = await self._get(_keys.snapshot_key(name))
        return None if fields is None else self._snapshot(fields)

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return [self._snapshot(f) for f in await self._list(_keys.SNAPSHOTS)]

    async def delete_snapshot(self, name: str) -> bool:
        with self._errors():
            topic_name = await self._redis.hget(_keys.snapshot_key(name), "topic")
        topic = None if topic_name is None else await self.get_topic(_text(topic_name))
        if topic is not None:
            await self.release_holds(topic, name)
        with self._errors():
            deleted = await self._redis.delete(_keys.snapshot_key(name))
            await self._redis.srem(_keys.SNAPSHOTS, name)
        return bool(deleted)

    # --- operations: reading and deleting entries (dead-letter tools) ----------
    async def read_range(
        self, topic: TopicRecord, partition: int, after: str, count: int
    ) -> list[tuple[str, Sequence[bytes]]]:
        key = self._keys(topic)[partition]
        with self._errors():
            reply = await self._redis.xrange(key, f"({after}", "+", count=count)
        # redis-py gives each entry's fields as a dict; the codec reads flat lists.
        return [
            (entry_id.decode(), [item for pair in fields.items() for item in pair])
            for entry_id, fields in reply
        ]

    async def delete_entries(self, topic: TopicRecord, ids: Mapping[int, Sequence[str]]) -> int:
        keys = self._keys(topic)
        calls = [
            (p, [keys[p], _keys.claims_key(self._tags(topic)[p])], list(entry_ids))
            for p, entry_ids in ids.items()
            if entry_ids
        ]
        if not calls:
            return 0
        with self._errors():
            replies = await self._evalsha_many(self._delete_entries, calls)
        return sum(int(n) for n in replies)

    async def claim_entries(
        self, topic: TopicRecord, ids: Mapping[int, Sequence[str]], ttl: float
    ) -> dict[int, list[str]]:
        keys = self._keys(topic)
        calls = [
            (
                p,
                [keys[p], _keys.claims_key(self._tags(topic)[p])],
                [max(1, int(ttl * 1000)), *entry_ids],
            )
            for p, entry_ids in ids.items()
            if entry_ids
        ]
        if not calls:
            return {}
        with self._errors():
            replies = await self._evalsha_many(self._claim_entries, calls)
        return {
            p: [_text(i) for i in reply] for (p, _, _), reply in zip(calls, replies, strict=True)
        }

    # --- operations: statistics --------------------------------------------------
    async def partition_counts(
        self,
        topic: TopicRecord,
        *,
        window: float,
        rate_sample: int,
        sample: int,
        backlog_cap: int,
    ) -> list[PartitionCounts]:
        keys = self._keys(topic)
        args = [int(window * 1000), rate_sample, sample, backlog_cap]
        calls = [(p, [key], args) for p, key in enumerate(keys)]
        with self._errors():
            replies = await self._evalsha_many(self._stats, calls)
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.memory_usage(key)
                memory = await pipe.execute(raise_on_error=False)

        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        counts = []
        for partition, (length, recent, span, now, groups) in enumerate(replies):
            used = memory[partition]
            counts.append(
                PartitionCounts(
                    partition=partition,
                    length=int(length),
                    memory=int(used) if isinstance(used, int) else None,
                    recent=int(recent),
                    recent_span=int(span) / 1000,
                    server_time=int(now) / 1000,
                    groups=[
                        GroupCounts(
                            name=text(name),
                            pending=int(pending),
                            last_delivered_id=text(last),
                            backlog=int(backlog),
                            first_pending_id=text(first_pending) or None,
                            first_undelivered_id=text(first_undelivered) or None,
                            consumers={
                                text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)
                            },
                            attempts=[int(a) for a in attempts],
                        )
                        for (
                            name,
                            pending,
                            last,
                            backlog,
                            first_pending,
                            first_undelivered,
                            flat,
                            attempts,
                        ) in groups
                    ],
                )
            )
        return counts

    # --- gateway (streamsub.gateway) ---------------------------------------------
    # Appended for the Pub/Sub gateway; the receiver's data path does not use them.
    async def _delivery_calls(
        self,
        script_name: str,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[Any]],
        extra: Sequence[Any] = (),
    ) -> dict[int, list[str]]:
        # Loaded lazily: the constructor belongs to the receiver's data path.
        scripts: dict[str, _Script] = self.__dict__.setdefault("_gateway_scripts", {})
        script = scripts.get(script_name)
        if script is None:
            script = scripts[script_name] = _Script(_script(script_name))
        calls = []
        for partition, deliveries in items.items():
            stream, _, times = self._companions(topic, partition, group)
            keys = [stream, times] if script_name == "delivery_ack.lua" else [stream]
            args: list[Any] = [group, *extra]
            for delivery in deliveries:
                args += delivery
            calls.append((partition, keys, args))
        with self._errors():
            replies = await self._evalsha_many(script, calls)
        return {c[0]: [i.decode() for i in reply] for c, reply in zip(calls, replies, strict=True)}

    @_group_checked
    async def ack_deliveries(
        self,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[tuple[str, str, int]]],
    ) -> dict[int, list[str]]:
        return await self._delivery_calls("delivery_ack.lua", topic, group, items)

    @_group_checked
    async def lease_deliveries(
        self,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[tuple[str, str, int, int, LeaseMode]]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        return await self._delivery_calls("delivery_lease.lua", topic, group, items, (min_idle_ms,))

    async def update_subscription(self, record: SubscriptionRecord) -> bool:
        settings = json.dumps(dict(record.settings), sort_keys=True)
        with self._errors():
            # Only on a record that exists, in one step: a write racing a delete
            # would leave a half record.
            stored = await self._evalsha(
                self._set_field, [_keys.subscription_key(record.name)], ["settings", settings]
            )
        return bool(stored)

    async def get_labels(self, kind: Literal["topic", "subscription"], name: str) -> dict[str, str]:
        with self._errors():
            raw = await self._redis.hgetall(_keys.labels_key(kind, name))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def set_labels(
        self, kind: Literal["topic", "subscription"], name: str, labels: Mapping[str, str]
    ) -> None:
        flat = [item for pair in labels.items() for item in pair]
        with self._errors():
            await self._evalsha(self._replace_hash, [_keys.labels_key(kind, name)], flat)
