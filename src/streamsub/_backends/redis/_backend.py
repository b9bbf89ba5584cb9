"""RedisBackend: the backend protocol on one Redis server (6.2 or newer).

Redis errors become streamsub errors here and nowhere else.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, Literal

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ..._errors import BackendError, InvalidArgumentError, TopicNotFoundError, UnavailableError
from ..base import (
    Entry,
    GroupInfo,
    LeaseMode,
    Reclaimed,
    ReclaimState,
    SubscriptionRecord,
    TopicRecord,
)
from . import _keys
from ._in_order import InOrderConnection

__all__ = ["RedisBackend"]

_RECLAIM_STATES: tuple[ReclaimState, ...] = ("deliver", "exhausted", "lost")
"""Index = the state number reclaim.lua returns."""


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("scripts", name).read_text()


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if any(name == "password" for name, _ in query):
        hidden = [(name, "***" if name == "password" else value) for name, value in query]
        parts = parts._replace(query=urllib.parse.urlencode(hidden, safe="*"))
    if parts.password is not None:
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        netloc = f"{parts.username}:***@{netloc}" if parts.username else f":***@{netloc}"
        if parts.port:
            netloc += f":{parts.port}"
        parts = parts._replace(netloc=netloc)
    # Not urlunsplit: it drops the "//" of unix:///path, whose netloc is empty.
    tail = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}{parts.path}{tail}"


def _raw(response: Any, **_: Any) -> Any:
    return response


class _Script:
    """A Lua script called by EVALSHA, loaded again when the server lost it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha: str | None = None

    async def load(self, client: Any) -> str:
        self.sha = str(await client.script_load(self.source))
        return self.sha


class RedisBackend:
    """The backend on a standalone Redis server, reached by ``url``."""

    def __init__(self, url: str, *, max_connections: int = 64) -> None:
        self._url = url
        # redis-py types its asyncio commands as ``Awaitable[T] | T``; the
        # results are checked where they are read instead.
        self._redis: Any
        try:
            self._redis = aioredis.Redis.from_url(
                url,
                decode_responses=False,
                max_connections=max_connections,
                socket_connect_timeout=5.0,
                health_check_interval=30,
            )
            # Entries stay flat lists (field, value, ...): redis-py's default
            # turns each into a dict, which costs more than decoding it.
            self._redis.set_response_callback("XREADGROUP", _raw)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"cannot use Redis URL {redact(url)!r}: {exc}; use redis://host:port/db, "
                "rediss://... for TLS or unix:///path/to/redis.sock"
            ) from exc
        self._append = _Script(_script("append.lua"))
        self._appender = InOrderConnection(self._redis)
        self._create_record = _Script(_script("create_record.lua"))
        self._ack = _Script(_script("ack.lua"))
        self._extend = _Script(_script("extend.lua"))
        self._nack = _Script(_script("nack.lua"))
        self._reclaim = _Script(_script("reclaim.lua"))
        self._dead_letter = _Script(_script("dead_letter.lua"))
        self._ack_owned = _Script(_script("ack_owned.lua"))
        self._delete_idle_consumers = _Script(_script("delete_idle_consumers.lua"))
        self._stream_keys: dict[tuple[str, int], list[str]] = {}
        self._partition_of: dict[bytes, int] = {}

    @property
    def url(self) -> str:
        return redact(self._url)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            if isinstance(exc, rexc.AuthenticationError | rexc.AuthorizationError):
                raise UnavailableError(
                    f"Redis at {self.url} refused the credentials: {exc}; check the user and "
                    "password in the URL (redis://user:password@host:port/db)"
                ) from exc
            raise UnavailableError(
                f"cannot reach Redis at {self.url}: {exc}; check that the server runs "
                "(`streamsub dev-server` starts one) and that STREAMSUB_URL or the URL is right"
            ) from exc
        except rexc.ResponseError as exc:
            if str(exc).startswith("NOTOPIC"):  # from append.lua
                raise TopicNotFoundError(
                    f"a topic was deleted while in use ({exc}): create it again with "
                    "create_topic() before publishing"
                ) from exc
            raise BackendError(f"Redis at {self.url} answered an error: {exc}") from exc
        except rexc.RedisError as exc:
            raise BackendError(f"Redis at {self.url} answered an error: {exc}") from exc

    def _keys(self, topic: TopicRecord) -> list[str]:
        cache_key = (topic.name, topic.partitions)
        keys = self._stream_keys.get(cache_key)
        if keys is None:
            keys = [_keys.stream_key(topic.name, p) for p in range(topic.partitions)]
            self._stream_keys[cache_key] = keys
            for partition, key in enumerate(keys):
                self._partition_of[key.encode()] = partition
        return keys

    async def _evalsha(self, script: _Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        sha = script.sha or await script.load(self._redis)
        try:
            return await self._redis.evalsha(sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            sha = await script.load(self._redis)
            return await self._redis.evalsha(sha, len(keys), *keys, *args)

    async def ping(self) -> None:
        with self._errors():
            await self._redis.ping()

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

    async def _get(self, key: str) -> dict[str, str] | None:
        with self._errors():
            raw = await self._redis.hgetall(key)
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def _list(self, registry: str) -> list[dict[str, str]]:
        with self._errors():
            names = sorted(n.decode() for n in await self._redis.smembers(registry))
            prefix = _keys.topic_key if registry == _keys.TOPICS else _keys.subscription_key
            async with self._redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hgetall(prefix(name))
                raws = await pipe.execute()
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
        }

    @staticmethod
    def _topic(fields: Mapping[str, str]) -> TopicRecord:
        return TopicRecord(
            name=fields["name"],
            partitions=int(fields["partitions"]),
            layout=fields["layout"],
            created=float(fields["created"]),
        )

    async def create_topic(self, record: TopicRecord) -> TopicRecord:
        record = TopicRecord(record.name, record.partitions, _keys.LAYOUT, record.created)
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
        with self._errors():
            await self._redis.delete(*self._keys(record), _keys.topic_key(record.name))
            await self._redis.srem(_keys.TOPICS, record.name)

    # --- subscriptions ---------------------------------------------------------
    @staticmethod
    def _subscription(fields: Mapping[str, str]) -> SubscriptionRecord:
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
                        _keys.delay_key(topic.name, partition, record.name),
                        _keys.times_key(topic.name, partition, record.name),
                    )
                pipe.delete(_keys.subscription_key(record.name))
                pipe.srem(_keys.SUBSCRIPTIONS, record.name)
                await pipe.execute(raise_on_error=False)

    async def group_info(self, topic: TopicRecord, group: str) -> list[GroupInfo]:
        keys = self._keys(topic)
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.xlen(key)
                    pipe.xinfo_groups(key)
                results = await pipe.execute(raise_on_error=False)
        infos = []
        for partition in range(len(keys)):
            length, groups = results[2 * partition], results[2 * partition + 1]
            if isinstance(length, Exception) or isinstance(groups, Exception):
                continue
            for g in groups:
                name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
                if name != group:
                    continue
                last = g["last-delivered-id"]
                infos.append(
                    GroupInfo(
                        partition=partition,
                        length=int(length),
                        pending=int(g["pending"]),
                        last_delivered_id=last.decode() if isinstance(last, bytes) else last,
                        lag=None if g.get("lag") is None else int(g["lag"]),
                        consumers=int(g["consumers"]),
                    )
                )
        return infos

    # --- data ------------------------------------------------------------------
    async def append(self, topic: TopicRecord, batch: Mapping[int, bytes]) -> dict[int, list[str]]:
        # EVAL, not EVALSHA: commands are in flight behind each other, and a
        # NOSCRIPT retry would let a later batch overtake an earlier one.
        keys = self._keys(topic)
        source = self._append.source
        partitions = list(batch)
        commands = [("EVAL", source, 1, keys[p], batch[p]) for p in partitions]
        with self._errors():
            replies = await self._appender.call_many(commands)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return {p: [i.decode() for i in ids] for p, ids in zip(partitions, replies, strict=True)}

    async def _evalsha_many(
        self, script: _Script, calls: Sequence[tuple[int, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run ``script`` once per (partition, keys, args) call in one round trip.

        A call that failed with NOSCRIPT did not run, so only those run again,
        after the script is loaded: nothing runs twice.
        """
        sha = script.sha or await script.load(self._redis)
        todo = list(range(len(calls)))
        results: list[Any] = [None] * len(calls)
        for _ in range(2):
            async with self._redis.pipeline(transaction=False) as pipe:
                for i in todo:
                    _, keys, args = calls[i]
                    pipe.evalsha(sha, len(keys), *keys, *args)
                replies = await pipe.execute(raise_on_error=False)
            missing = []
            for i, reply in zip(todo, replies, strict=True):
                if isinstance(reply, rexc.NoScriptError):
                    missing.append(i)
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    results[i] = reply
            if not missing:
                return results
            todo = missing
            sha = await script.load(self._redis)
        raise BackendError(f"Redis at {self.url} keeps losing its scripts")

    async def read(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partitions: Sequence[int],
        count: int,
        block_ms: int,
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
            _keys.delay_key(topic.name, partition, group),
            _keys.times_key(topic.name, partition, group),
        ]

    async def extend(
        self, topic: TopicRecord, group: str, consumer: str, ids: Mapping[int, Sequence[str]]
    ) -> dict[int, list[str]]:
        keys = self._keys(topic)
        calls = [(p, [keys[p]], [group, consumer, *entry_ids]) for p, entry_ids in ids.items()]
        with self._errors():
            replies = await self._evalsha_many(self._extend, calls)
        return {c[0]: [i.decode() for i in reply] for c, reply in zip(calls, replies, strict=True)}

    async def nack(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        items: Mapping[int, Sequence[tuple[str, int, int, bool]]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        calls = []
        for partition, entries in items.items():
            args: list[Any] = [group, consumer, min_idle_ms]
            for entry_id, delay_ms, delivered_ms, delivered in entries:
                args += (entry_id, delay_ms, delivered_ms, 1 if delivered else 0)
            calls.append((partition, self._companions(topic, partition, group), args))
        with self._errors():
            replies = await self._evalsha_many(self._nack, calls)
        return {c[0]: [i.decode() for i in reply] for c, reply in zip(calls, replies, strict=True)}

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
    ) -> tuple[list[Reclaimed], dict[int, str]]:
        skip = skip or {}
        calls = [
            (
                p,
                self._companions(topic, p, group),
                [
                    group,
                    consumer,
                    min_idle_ms,
                    cursor,
                    count,
                    max_attempts,
                    " ".join(skip.get(p, ())),
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

    async def ack_owned(
        self, topic: TopicRecord, group: str, consumer: str, ids: Mapping[int, Sequence[str]]
    ) -> dict[int, list[str]]:
        calls = [
            (p, self._companions(topic, p, group)[::2], [group, consumer, *entry_ids])
            for p, entry_ids in ids.items()
        ]
        with self._errors():
            replies = await self._evalsha_many(self._ack_owned, calls)
        return {c[0]: [i.decode() for i in reply] for c, reply in zip(calls, replies, strict=True)}

    async def dead_letter(
        self,
        topic: TopicRecord,
        group: str,
        partition: int,
        entry_id: str,
        target: TopicRecord,
        target_partition: int,
        packed: bytes,
        first_delivery_ms: int | None,
        last_delivery_ms: int | None,
    ) -> str:
        # One server: the step is atomic. (Cluster: append, then ack.)
        stream, delays, times = self._companions(topic, partition, group)
        keys = [stream, self._keys(target)[target_partition], times, delays]
        args = [
            group,
            entry_id,
            "" if first_delivery_ms is None else first_delivery_ms,
            "" if last_delivery_ms is None else last_delivery_ms,
            packed,
        ]
        with self._errors():
            new_id = await self._evalsha(self._dead_letter, keys, args)
        return f"{target_partition}-{new_id.decode()}"

    async def delete_idle_consumers(
        self, topic: TopicRecord, group: str, consumer: str, min_idle_ms: int
    ) -> list[str]:
        keys = self._keys(topic)
        calls = [(p, [keys[p]], [group, min_idle_ms, consumer]) for p in range(topic.partitions)]
        with self._errors():
            replies = await self._evalsha_many(self._delete_idle_consumers, calls)
        return sorted({name.decode() for reply in replies for name in reply})

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

    async def ack_deliveries(
        self,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[tuple[str, str, int]]],
    ) -> dict[int, list[str]]:
        return await self._delivery_calls("delivery_ack.lua", topic, group, items)

    async def lease_deliveries(
        self,
        topic: TopicRecord,
        group: str,
        items: Mapping[int, Sequence[tuple[str, str, int, int, LeaseMode]]],
        min_idle_ms: int,
    ) -> dict[int, list[str]]:
        return await self._delivery_calls("delivery_lease.lua", topic, group, items, (min_idle_ms,))

    async def update_subscription(self, record: SubscriptionRecord) -> bool:
        key = _keys.subscription_key(record.name)
        settings = json.dumps(dict(record.settings), sort_keys=True)
        with self._errors():
            # HSET only if the record exists: XX-like, via the exists check in one
            # transaction so a concurrent delete does not leave a half record.
            async with self._redis.pipeline(transaction=True) as pipe:
                await pipe.watch(key)
                if not await pipe.exists(key):
                    await pipe.reset()
                    return False
                pipe.multi()
                pipe.hset(key, "settings", settings)
                await pipe.execute()
        return True

    async def get_labels(self, kind: Literal["topic", "subscription"], name: str) -> dict[str, str]:
        with self._errors():
            raw = await self._redis.hgetall(_keys.labels_key(kind, name))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def set_labels(
        self, kind: Literal["topic", "subscription"], name: str, labels: Mapping[str, str]
    ) -> None:
        key = _keys.labels_key(kind, name)
        with self._errors():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                if labels:
                    pipe.hset(key, mapping=dict(labels))
                await pipe.execute()
