"""How a ``redis+cluster://`` URL becomes the nodes and client options of the
cluster backend (no server)."""

from __future__ import annotations

import pytest

from streamsub._backends.redis._cluster import _nodes


@pytest.mark.parametrize(
    ("url", "nodes", "options"),
    [
        ("redis+cluster://10.0.0.1:6379", [("10.0.0.1", 6379)], {}),
        (
            "redis+cluster://a:7000, b:7001,[::1]:7002/0",
            [("a", 7000), ("b", 7001), ("::1", 7002)],
            {},
        ),
        (
            "redis+cluster://app:p%40ss%2Fw@a:7000,b:7001/",
            [("a", 7000), ("b", 7001)],
            {"username": "app", "password": "p@ss/w"},
        ),
        (
            "rediss+cluster://a:7000?ssl_ca_certs=/etc/ssl/redis-ca.pem",
            [("a", 7000)],
            {"ssl": True, "ssl_ca_certs": "/etc/ssl/redis-ca.pem"},
        ),
        (
            "rediss+cluster://a:7000,b:7001/?ssl_ca_certs=/etc/ssl/ca.pem&ssl_cert_reqs=none",
            [("a", 7000), ("b", 7001)],
            {"ssl": True, "ssl_ca_certs": "/etc/ssl/ca.pem", "ssl_cert_reqs": "none"},
        ),
        (
            "rediss+cluster://a:7000/0?password=s3/cret&ssl_ca_certs=/ca.pem",
            [("a", 7000)],
            {"ssl": True, "password": "s3/cret", "ssl_ca_certs": "/ca.pem"},
        ),
    ],
)
def test_a_cluster_url_gives_its_nodes_and_options(
    url: str, nodes: list[tuple[str, int]], options: dict[str, object]
) -> None:
    """Each node, the credentials (unquoted) and the query's options come out
    of the URL; a '/' inside a query value (a CA file's path) is not a path."""
    assert _nodes(url) == (nodes, options)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+cluster://a:7000/1", "only database 0"),
        ("redis+cluster://a:7000/1?ssl_ca_certs=/ca.pem", "only database 0"),
        ("redis+cluster://a:7000?db=0", "unknown option 'db'"),
        ("redis+cluster://a:7000,b", "'b' is not host:port"),
        ("redis+cluster://a:70000", "is not host:port"),
    ],
)
def test_a_cluster_url_with_a_database_an_unknown_option_or_no_port_is_refused(
    url: str, reason: str
) -> None:
    """A database other than 0, an option the backend does not know, or a node
    without a valid port is refused, saying which."""
    with pytest.raises(ValueError, match=reason):
        _nodes(url)
