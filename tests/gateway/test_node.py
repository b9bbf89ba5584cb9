"""Node's official @google-cloud/pubsub client through the gateway (from npm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import GatewayThread

NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="session")
def node_client() -> Path:
    """tests/gateway/node with @google-cloud/pubsub installed from npm."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    if not (NODE_DIR / "node_modules" / "@google-cloud" / "pubsub").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            check=True,
            timeout=300,
        )
    return NODE_DIR


def test_node_client_publishes_and_receives(
    node_client: Path, gateway: GatewayThread, project: str
) -> None:
    """Node's client creates, publishes 500 messages with attributes and ordering keys,
    receives every one of them intact, and sees NOT_FOUND as code 5."""
    count = 500
    result = subprocess.run(
        ["node", str(node_client / "roundtrip.js"), project, str(count)],
        env={**os.environ, "PUBSUB_EMULATOR_HOST": gateway.host},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["notFound"] == 5
    assert len(set(report["published"])) == count
    assert set(report["received"]) == set(report["published"])
    for message in report["received"].values():
        index = int(message["index"])
        assert message["data"] == f"node {index}"
        assert message["orderingKey"] == f"key-{index % 10}"
