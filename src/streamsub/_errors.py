"""The one error tree of streamsub.

Every error streamsub raises derives from :class:`StreamsubError`. Redis errors
are translated once, at the backend boundary, with the original kept as
``__cause__``::

    StreamsubError
    ├── InvalidArgumentError (also ValueError)     bad input: fix the call
    │   ├── InvalidTypeError (also TypeError)      a value of the wrong type
    │   └── MessageTooLargeError                   over Limits.max_message_bytes
    ├── NotFoundError (also LookupError)           no such topic or subscription
    │   ├── TopicNotFoundError
    │   └── SubscriptionNotFoundError
    ├── AlreadyExistsError                         exists with other settings
    ├── FailedPreconditionError                    the state forbids it now
    │   └── OrderingKeyPausedError                 a key paused by a failed publish
    ├── ClosedError                                you closed it
    ├── AckError                                   an ack that did not take
    └── BackendError                               the world broke it
        ├── UnavailableError                       the server cannot be reached
        │   ├── AuthenticationError                it refused the user or password
        │   └── CertificateError                   its TLS certificate is not trusted
        └── ResourceExhaustedError                 the server is out of memory
            └── FlowControlLimitError              over PublishFlowControl (ERROR)

"Bad input", "you closed it" and "the world broke it" are different classes, so
a caller can retry the last kind and fix the first.
"""

from __future__ import annotations

import enum

__all__ = [
    "AckError",
    "AckStatus",
    "AlreadyExistsError",
    "AuthenticationError",
    "BackendError",
    "CertificateError",
    "ClosedError",
    "FailedPreconditionError",
    "FlowControlLimitError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "MessageTooLargeError",
    "NotFoundError",
    "OrderingKeyPausedError",
    "ResourceExhaustedError",
    "StreamsubError",
    "SubscriptionNotFoundError",
    "TopicNotFoundError",
    "UnavailableError",
]


class StreamsubError(Exception):
    """The root of every error streamsub raises."""


class InvalidArgumentError(StreamsubError, ValueError):
    """An argument is wrong; the message says which and how to fix it."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type."""


class MessageTooLargeError(InvalidArgumentError):
    """A message is larger than ``Limits.max_message_bytes``."""


class NotFoundError(StreamsubError, LookupError):
    """A topic or subscription does not exist."""


class TopicNotFoundError(NotFoundError):
    """The named topic does not exist: create it with ``create_topic`` first."""


class SubscriptionNotFoundError(NotFoundError):
    """The named subscription does not exist: create it first."""


class AlreadyExistsError(StreamsubError):
    """A topic or subscription exists already, with different settings."""


class FailedPreconditionError(StreamsubError):
    """The operation is not allowed in the current state (the message says why)."""


class OrderingKeyPausedError(FailedPreconditionError):
    """A publish with an ordering key that an earlier failed publish paused.

    Nothing of the call was written. ``topic`` and ``ordering_key`` name the
    paused key; call ``client.resume_publish(topic, ordering_key)`` once the
    cause is fixed, then publish again (the failed messages first, to keep
    their order).
    """

    def __init__(self, topic: str, ordering_key: str) -> None:
        super().__init__(
            f"publishing to topic {topic!r} with ordering key {ordering_key!r} is paused: "
            "an earlier publish with this key failed, so later ones would overtake it; "
            f"call client.resume_publish({topic!r}, {ordering_key!r}) and publish the "
            "failed messages again"
        )
        self.topic = topic
        self.ordering_key = ordering_key


class ClosedError(StreamsubError):
    """The client, publisher or subscriber was closed by its owner."""


class AckStatus(enum.Enum):
    """Why an acknowledgement failed (the names follow Pub/Sub's AcknowledgeStatus)."""

    SUCCESS = "success"
    INVALID_ACK_ID = "invalid_ack_id"
    """The lease was lost: another consumer may have this message now."""
    OTHER = "other"


class AckError(StreamsubError):
    """An ``ack_with_response()`` that did not take effect; see ``status``."""

    def __init__(self, message: str, *, status: AckStatus) -> None:
        super().__init__(message)
        self.status = status


class BackendError(StreamsubError):
    """The storage backend failed; the original error is ``__cause__``."""


class UnavailableError(BackendError):
    """The server cannot be reached; the message names the URL and what to try."""


class ResourceExhaustedError(BackendError):
    """The server refused a write for lack of memory (Redis ``OOM``): raise its
    ``maxmemory``, or tighten the topics' retention."""


class FlowControlLimitError(ResourceExhaustedError):
    """A publish refused by ``PublishFlowControl`` with ``ERROR``: the client has as
    many messages or bytes outstanding as allowed. Nothing of the call was
    written; the message says which limit. Publish again once earlier publishes
    complete, or raise the limit."""


class AuthenticationError(UnavailableError):
    """The server refused the user name or password (ACL ``WRONGPASS``, ``NOAUTH``).

    The message never contains the password; fix the URL's credentials or the
    server's ACL user.
    """


class CertificateError(UnavailableError):
    """The server's TLS certificate could not be verified against the trusted CAs.

    Check ``ssl_ca_certs`` (the CA that signed the server's certificate) and
    that the URL's host name is one the certificate names.
    """
