"""Shared fixtures: a real redis-server (the embedded one the launcher uses), never a mock.

A test that uses it is marked `redis`, as is every test of a module that starts its own servers
(`pytestmark`): `pytest -m "not redis"` runs the tests that need none.
"""

from __future__ import annotations

import uuid

import pytest

from impala_league.distributed.launch.launcher import EmbeddedRedis
from impala_league.distributed.wire.transport import connect


@pytest.fixture(scope="session")
def redis_server():
    server = EmbeddedRedis()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def redis_client(redis_url):
    client = connect(redis_url)
    yield client
    client.close()


@pytest.fixture
def run_name() -> str:
    """A fresh key namespace per test, so tests sharing the server never see each other's keys."""
    return f"test-{uuid.uuid4().hex[:8]}"


def pytest_collection_modifyitems(items):
    for item in items:
        if "redis_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.redis)
