"""Test options: slow tests (QEMU, network, downloads, full installs) run only with --slow.

The tests run the interpreted modules, the reference, even where a compiled build is made
(``unwind accel build``); ``tests/core/test_accel.py`` checks the compiled build's output against them.
``UNWIND_PURE=0`` runs them on the compiled build instead."""

import os

import pytest

os.environ.setdefault("UNWIND_PURE", "1")  # before any test module imports unwind


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: needs --slow (QEMU, network, downloads or a full install)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
