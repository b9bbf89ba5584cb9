"""Errors as Pub/Sub reports them: one exception carrying a status code.

Every protocol face (gRPC, REST, gRPC-Web) turns :class:`RpcError` into its own
form; streamsub errors become one here and nowhere else, with Pub/Sub's codes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from google.rpc import error_details_pb2, status_pb2

from .._errors import (
    AlreadyExistsError,
    BackendError,
    ClosedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    StreamsubError,
    UnavailableError,
)

__all__ = [
    "Code",
    "RpcError",
    "already_exists",
    "from_streamsub",
    "not_found",
    "status_message",
]


class Code(enum.IntEnum):
    """The google.rpc.Code values the gateway answers with."""

    OK = 0
    CANCELLED = 1
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14

    @property
    def http_status(self) -> int:
        """The HTTP status Google's REST APIs pair with the code."""
        return _HTTP[self]


_HTTP = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.INVALID_ARGUMENT: 400,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.FAILED_PRECONDITION: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
}


class RpcError(Exception):
    """A call failed with ``code``; ``ack_errors`` maps ack ids to Pub/Sub's
    exactly-once failure reasons (sent as a google.rpc.ErrorInfo)."""

    def __init__(
        self, code: Code, message: str, *, ack_errors: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.ack_errors = dict(ack_errors or {})


def status_message(exc: RpcError) -> Any:
    """The google.rpc.Status of ``exc``, with ErrorInfo for ack failures (every
    face sends it: gRPC and gRPC-Web as grpc-status-details-bin, REST as the
    error body's details)."""
    status = status_pb2.Status(code=int(exc.code), message=exc.message)
    if exc.ack_errors:
        info = error_details_pb2.ErrorInfo(
            reason="EXACTLY_ONCE_ACKID_FAILURE",
            domain="pubsub.googleapis.com",
            metadata=exc.ack_errors,
        )
        status.details.add().Pack(info)
    return status


def not_found(resource: str) -> RpcError:
    """Pub/Sub's wording for a missing topic or subscription."""
    return RpcError(Code.NOT_FOUND, f"Resource not found (resource={resource}).")


def already_exists(resource: str) -> RpcError:
    """Pub/Sub's wording for a name taken."""
    return RpcError(
        Code.ALREADY_EXISTS, f"Resource already exists in the project (resource={resource})."
    )


def from_streamsub(exc: StreamsubError) -> RpcError:
    """The status a streamsub error is reported with."""
    code = Code.INTERNAL
    if isinstance(exc, InvalidArgumentError):
        code = Code.INVALID_ARGUMENT
    elif isinstance(exc, NotFoundError):
        code = Code.NOT_FOUND
    elif isinstance(exc, AlreadyExistsError):
        code = Code.ALREADY_EXISTS
    elif isinstance(exc, FailedPreconditionError):
        code = Code.FAILED_PRECONDITION
    elif isinstance(exc, UnavailableError | ClosedError):
        code = Code.UNAVAILABLE
    elif isinstance(exc, BackendError):
        code = Code.INTERNAL
    return RpcError(code, str(exc))
