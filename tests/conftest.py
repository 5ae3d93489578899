"""Test options: slow tests (QEMU, network, downloads, full installs) run only with --slow."""

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: needs --slow (QEMU, network, downloads or a full install)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
