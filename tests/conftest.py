"""Shared fixtures: a short temp dir, a daemon environment, and a ``Daemons`` factory that cleans up."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Iterable

import pytest

from tests.support import Daemons, daemon_env, short_tmpdir


@pytest.fixture
def short_tmp() -> Path:
    """A fresh folder under /tmp with a short name (ipc socket paths must stay under ~100 bytes)."""
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(short_tmp: Path) -> dict[str, str]:
    """Daemon environment rooted in ``short_tmp``: run/ (sockets), data/ (indexes), no user config,
    2 s reconcile interval, 100 ms debounce. Edit it before starting daemons to change settings."""
    return daemon_env(short_tmp)


@pytest.fixture
def workspace(short_tmp: Path) -> Path:
    """An empty workspace folder ``<short_tmp>/w`` (not registered yet)."""
    root = short_tmp / "w"
    root.mkdir()
    return root


@pytest.fixture
def daemons(short_tmp: Path, env: dict[str, str], request: pytest.FixtureRequest) -> Callable[..., Daemons]:
    """Factory ``daemons(names, env=None) -> Daemons`` (nothing started yet); every Daemons it made
    is stopped at teardown (asserting none is left running), with the logs printed on failure."""
    made: list[Daemons] = []

    def factory(names: Iterable[str] = ("watcher", "chunker", "embedder"), env_: dict[str, str] | None = None) -> Daemons:
        d = Daemons(names, env_ or env, short_tmp)
        made.append(d)
        return d

    yield factory
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    errors = []
    for d in made:
        if failed:
            print(d.log_tail())
        try:
            d.stop_all()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, errors


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
