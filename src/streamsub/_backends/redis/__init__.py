"""The Redis backends, standalone and Cluster; scripts are the ``.lua`` files beside them."""

from ._backend import RedisBackend
from ._cluster import RedisClusterBackend

__all__ = ["RedisBackend", "RedisClusterBackend"]
