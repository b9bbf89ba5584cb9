"""The HTTP face: Pub/Sub's v1 REST mapping and gRPC-Web, as one ASGI app.

REST follows the HTTP rules of google.pubsub.v1 (``PUT /v1/projects/P/topics/T``,
``POST /v1/...:publish``, JSON with lowerCamelCase names and base64 ``data``);
errors are Google's JSON body ``{"error": {"code", "message", "status"}}``.
gRPC-Web (``application/grpc-web``, ``+proto``, and the base64 ``-text`` forms
browsers use by default) carries the same methods as
length-prefixed frames, unary and server-streaming (a StreamingPull whose
single request opens it; acks then come as unary calls), with the status in a
trailer frame. CORS is answered for browsers, preflight included.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import struct
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from google.protobuf import json_format

from .._errors import StreamsubError
from ._proto import METHODS, pb
from ._service import PubSubService
from ._status import Code, RpcError, from_streamsub, status_message

__all__ = ["HttpApp"]

log = logging.getLogger("streamsub.gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_MAX_BODY = 20 * 2**20
_TOPIC = r"projects/[^/:]+/topics/[^/:]+"
_SUB = r"projects/[^/:]+/subscriptions/[^/:]+"
_SNAPSHOT = r"projects/[^/:]+/snapshots/[^/:]+"
_PROJECT = r"projects/[^/:]+"

# (HTTP method, path pattern, RPC method, request class, field the path fills,
# whether the body is the request (True) or the path field's message ("*")).
_ROUTES: list[tuple[str, re.Pattern[str], str, Any, str]] = [
    (m, re.compile(p), rpc, cls, field)
    for m, p, rpc, cls, field in (
        ("PUT", rf"/v1/({_TOPIC})", "CreateTopic", pb.Topic, "name"),
        ("GET", rf"/v1/({_TOPIC})", "GetTopic", pb.GetTopicRequest, "topic"),
        ("PATCH", rf"/v1/({_TOPIC})", "UpdateTopic", pb.UpdateTopicRequest, "topic.name"),
        ("DELETE", rf"/v1/({_TOPIC})", "DeleteTopic", pb.DeleteTopicRequest, "topic"),
        ("GET", rf"/v1/({_PROJECT})/topics", "ListTopics", pb.ListTopicsRequest, "project"),
        (
            "GET",
            rf"/v1/({_TOPIC})/subscriptions",
            "ListTopicSubscriptions",
            pb.ListTopicSubscriptionsRequest,
            "topic",
        ),
        ("POST", rf"/v1/({_TOPIC}):publish", "Publish", pb.PublishRequest, "topic"),
        ("PUT", rf"/v1/({_SUB})", "CreateSubscription", pb.Subscription, "name"),
        ("GET", rf"/v1/({_SUB})", "GetSubscription", pb.GetSubscriptionRequest, "subscription"),
        (
            "PATCH",
            rf"/v1/({_SUB})",
            "UpdateSubscription",
            pb.UpdateSubscriptionRequest,
            "subscription.name",
        ),
        (
            "DELETE",
            rf"/v1/({_SUB})",
            "DeleteSubscription",
            pb.DeleteSubscriptionRequest,
            "subscription",
        ),
        (
            "GET",
            rf"/v1/({_PROJECT})/subscriptions",
            "ListSubscriptions",
            pb.ListSubscriptionsRequest,
            "project",
        ),
        ("POST", rf"/v1/({_SUB}):pull", "Pull", pb.PullRequest, "subscription"),
        (
            "POST",
            rf"/v1/({_SUB}):acknowledge",
            "Acknowledge",
            pb.AcknowledgeRequest,
            "subscription",
        ),
        (
            "POST",
            rf"/v1/({_SUB}):modifyAckDeadline",
            "ModifyAckDeadline",
            pb.ModifyAckDeadlineRequest,
            "subscription",
        ),
        ("POST", rf"/v1/({_SUB}):seek", "Seek", pb.SeekRequest, "subscription"),
        ("PUT", rf"/v1/({_SNAPSHOT})", "CreateSnapshot", pb.CreateSnapshotRequest, "name"),
        ("GET", rf"/v1/({_SNAPSHOT})", "GetSnapshot", pb.GetSnapshotRequest, "snapshot"),
        (
            "PATCH",
            rf"/v1/({_SNAPSHOT})",
            "UpdateSnapshot",
            pb.UpdateSnapshotRequest,
            "snapshot.name",
        ),
        ("DELETE", rf"/v1/({_SNAPSHOT})", "DeleteSnapshot", pb.DeleteSnapshotRequest, "snapshot"),
        (
            "GET",
            rf"/v1/({_PROJECT})/snapshots",
            "ListSnapshots",
            pb.ListSnapshotsRequest,
            "project",
        ),
        (
            "GET",
            rf"/v1/({_TOPIC})/snapshots",
            "ListTopicSnapshots",
            pb.ListTopicSnapshotsRequest,
            "topic",
        ),
    )
]

_UNIMPLEMENTED = re.compile(rf"/v1/({_SUB}):(modifyPushConfig|detach)")
"""Pub/Sub's REST calls the gateway does not serve: 501, not 404."""

_CORS_ALLOW_HEADERS = (
    "content-type, x-grpc-web, x-user-agent, grpc-timeout, authorization, x-goog-api-client"
)
_CORS_EXPOSE_HEADERS = "grpc-status, grpc-message, grpc-status-details-bin"
_FRAME = struct.Struct(">BI")
_GRPC_WEB_TYPES = (
    "application/grpc-web",
    "application/grpc-web+proto",
    "application/grpc-web-text",
    "application/grpc-web-text+proto",
)
_TRAILER_FLAG = 0x80


def _set_path(message: Any, field: str, value: str) -> None:
    *parents, last = field.split(".")
    for parent in parents:
        message = getattr(message, parent)
    setattr(message, last, value)


def _error_body(exc: RpcError) -> bytes:
    error: dict[str, Any] = {
        "code": exc.code.http_status,
        "message": exc.message,
        "status": exc.code.name,
    }
    if exc.ack_errors:  # Google's REST errors carry the Status's details
        error["details"] = json_format.MessageToDict(status_message(exc))["details"]
    return json.dumps({"error": error}).encode()


class HttpApp:
    """The ASGI application of the HTTP port."""

    def __init__(self, service: PubSubService) -> None:
        self._service = service
        self._unary: dict[str, tuple[Callable[[Any], Awaitable[Any]], Any]] = {
            f"/{service_name}/{name}": (getattr(service, name), request)
            for service_name, methods in METHODS.items()
            for name, (request, _) in methods.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        cors = self._cors(headers)
        if scope["method"] == "OPTIONS":
            await self._respond(send, 204, [*cors, (b"access-control-max-age", b"86400")], b"")
            return
        content_type = headers.get("content-type", "")
        if content_type.startswith("application/grpc-web"):
            await self._grpc_web(scope, receive, send, content_type, cors)
        else:
            await self._rest(scope, receive, send, cors)

    @staticmethod
    def _cors(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
        origin = headers.get("origin", "*")
        return [
            (b"access-control-allow-origin", origin.encode()),
            (b"access-control-allow-methods", b"GET, PUT, POST, PATCH, DELETE, OPTIONS"),
            (b"access-control-allow-headers", _CORS_ALLOW_HEADERS.encode()),
            (b"access-control-expose-headers", _CORS_EXPOSE_HEADERS.encode()),
            (b"vary", b"origin"),
        ]

    @staticmethod
    async def _respond(
        send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _body(receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RpcError(Code.CANCELLED, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > _MAX_BODY:
                raise RpcError(Code.INVALID_ARGUMENT, "The request is larger than 20 MiB.")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    # --- REST ------------------------------------------------------------------
    async def _rest(self, scope: Scope, receive: Receive, send: Send, cors: list[Any]) -> None:
        json_headers = [*cors, (b"content-type", b"application/json; charset=utf-8")]
        try:
            try:
                method, request = await self._rest_request(scope, receive)
                response = await method(request)
            except StreamsubError as exc:  # Redis went away, say: 503, not 500
                raise from_streamsub(exc) from None
            body = json_format.MessageToJson(response, indent=None).encode()
            await self._respond(send, 200, json_headers, body)
        except RpcError as exc:
            await self._respond(send, exc.code.http_status, json_headers, _error_body(exc))

    async def _rest_request(
        self, scope: Scope, receive: Receive
    ) -> tuple[Callable[[Any], Awaitable[Any]], Any]:
        path = scope["path"]  # ASGI servers hand it over percent-decoded already
        allowed = False
        for verb, pattern, rpc, request_class, field in _ROUTES:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            allowed = True
            if verb != scope["method"]:
                continue
            body = await self._body(receive)
            request = request_class()
            try:
                if body.strip():
                    json_format.Parse(body, request)
                query = urllib.parse.parse_qs(scope.get("query_string", b"").decode())
                if query:
                    json_format.ParseDict(
                        {k: int(v[-1]) if k == "pageSize" else v[-1] for k, v in query.items()},
                        request,
                        ignore_unknown_fields=True,
                    )
            except (json_format.ParseError, ValueError) as exc:
                raise RpcError(
                    Code.INVALID_ARGUMENT, f"Invalid JSON payload received. {exc}"
                ) from None
            _set_path(request, field, match.group(1))
            return getattr(self._service, rpc), request
        if allowed:
            raise RpcError(Code.INVALID_ARGUMENT, f"{scope['method']} is not allowed on {path}.")
        if _UNIMPLEMENTED.fullmatch(path):
            raise RpcError(
                Code.UNIMPLEMENTED, f"{path} is not implemented by the streamsub gateway."
            )
        raise RpcError(Code.NOT_FOUND, f"The requested URL {path} was not found on this server.")

    # --- gRPC-Web --------------------------------------------------------------
    async def _grpc_web(
        self, scope: Scope, receive: Receive, send: Send, content_type: str, cors: list[Any]
    ) -> None:
        if content_type not in _GRPC_WEB_TYPES:
            await self._respond(send, 415, cors, b"served: application/grpc-web(-text)(+proto)")
            return
        # The text forms (browsers' default) carry the same frames in base64.
        encode = _base64 if "-text" in content_type else _identity
        headers = [*cors, (b"content-type", content_type.encode())]
        path = scope["path"]
        try:
            body = await self._body(receive)
            if encode is _base64:
                try:
                    body = base64.b64decode(body)
                except ValueError:
                    raise RpcError(Code.INVALID_ARGUMENT, "The body is not base64.") from None
            messages = _read_frames(body)
            if len(messages) != 1:
                raise RpcError(Code.INVALID_ARGUMENT, "Expected exactly one request message.")
            if path == "/google.pubsub.v1.Subscriber/StreamingPull":
                await self._grpc_web_stream(receive, send, headers, messages[0], encode)
                return
            unary = self._unary.get(path)
            if unary is None:
                raise RpcError(Code.UNIMPLEMENTED, f"Method {path} is not implemented.")
            method, request_class = unary
            try:
                request = request_class.FromString(messages[0])
            except Exception:
                raise RpcError(Code.INVALID_ARGUMENT, "The request could not be parsed.") from None
            try:
                response = await method(request)
            except StreamsubError as exc:
                raise from_streamsub(exc) from None
            body = encode(_frame(0, response.SerializeToString()) + _trailer(Code.OK, ""))
            await self._respond(send, 200, headers, body)
        except RpcError as exc:
            details = _details(exc)
            trailers_only = [
                *headers,
                (b"grpc-status", str(int(exc.code)).encode()),
                (b"grpc-message", urllib.parse.quote(exc.message).encode()),
            ]
            if details:
                trailers_only.append((b"grpc-status-details-bin", details.encode()))
            trailer = _trailer(exc.code, exc.message, details)
            await self._respond(send, 200, trailers_only, encode(trailer))

    async def _grpc_web_stream(
        self,
        receive: Receive,
        send: Send,
        headers: list[Any],
        first: bytes,
        encode: Callable[[bytes], bytes],
    ) -> None:
        try:
            request = pb.StreamingPullRequest.FromString(first)
        except Exception:
            raise RpcError(Code.INVALID_ARGUMENT, "The request could not be parsed.") from None
        gone = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield request
            await gone.wait()  # gRPC-Web sends one request; acks come as unary calls

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.get_running_loop().create_task(watch())
        started = False
        code, message = Code.OK, ""
        try:
            async for response in self._service.streaming_pull(requests()):
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    started = True
                chunk = encode(_frame(0, response.SerializeToString()))
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (RpcError, StreamsubError) as exc:
            failure = exc if isinstance(exc, RpcError) else from_streamsub(exc)
            if not started:
                raise failure from None
            code, message = failure.code, failure.message
        finally:
            watcher.cancel()
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": encode(_trailer(code, message))})


def _identity(data: bytes) -> bytes:
    return data


def _base64(data: bytes) -> bytes:
    """One chunk of a grpc-web-text body: each is padded on its own, which the
    clients decode four characters at a time."""
    return base64.b64encode(data)


def _frame(flag: int, payload: bytes) -> bytes:
    return _FRAME.pack(flag, len(payload)) + payload


def _details(exc: RpcError) -> str:
    """grpc-status-details-bin (base64, unpadded, as gRPC sends binary headers),
    where there are details (exactly-once ack failures), else ''."""
    if not exc.ack_errors:
        return ""
    return base64.b64encode(status_message(exc).SerializeToString()).decode().rstrip("=")


def _trailer(code: Code, message: str, details: str = "") -> bytes:
    text = f"grpc-status:{int(code)}\r\ngrpc-message:{urllib.parse.quote(message)}\r\n"
    if details:
        text += f"grpc-status-details-bin:{details}\r\n"
    return _frame(_TRAILER_FLAG, text.encode())


def _read_frames(body: bytes) -> list[bytes]:
    messages: list[bytes] = []
    pos = 0
    while pos < len(body):
        if len(body) - pos < _FRAME.size:
            raise RpcError(Code.INVALID_ARGUMENT, "A gRPC-Web frame is cut short.")
        flag, length = _FRAME.unpack_from(body, pos)
        pos += _FRAME.size
        if length > len(body) - pos:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                f"A gRPC-Web frame says {length} bytes; the body holds {len(body) - pos}.",
            )
        if flag & _TRAILER_FLAG == 0:
            messages.append(body[pos : pos + length])
        pos += length
    return messages
