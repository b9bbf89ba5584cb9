"""The Redis backend (standalone server); scripts are the ``.lua`` files beside it."""

from ._backend import RedisBackend

__all__ = ["RedisBackend"]
