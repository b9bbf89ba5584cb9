"""Helpers for testing code that uses streamsub, and for testing streamsub.

``redis_server()`` runs a private, real redis-server for a test session.
"""

from ._server import RedisServer, find_redis_server, redis_server

__all__ = ["RedisServer", "find_redis_server", "redis_server"]
