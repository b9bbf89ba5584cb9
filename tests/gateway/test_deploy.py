"""deploy/docker-compose.yml is accepted by `docker compose config` where docker has compose."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

COMPOSE = Path(__file__).parents[2] / "deploy" / "docker-compose.yml"


def test_compose_file_is_valid() -> None:
    """docker compose parses the file and finds its three services."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    if subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker has no compose plugin")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--services"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["gateway", "nginx", "redis"]
