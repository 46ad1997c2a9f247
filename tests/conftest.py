"""The tiers, and test ordering.

Every test is marked with its tier by the folder it lives in: ``unit`` (tests/unit: records in, no
processes; ``pytest tests/unit`` while working, under 3 minutes on 2 cores), ``integration``
(tests/integration: real subprocesses, DataLoader workers, Ray, TensorFlow, a browser, tmux) and
``real`` (tests/real: training scripts written the way people write them, through the CLI).

The tests that make pytest's own process a Ray driver run last.

A process that has been a Ray driver keeps Ray's threads' state after ray.shutdown(); a DataLoader
worker forked from it later can segfault. Every other module forks workers from pytest's process,
so those modules run before any test marked ``ray_in_process`` (tests/integration/test_offload_ray.py).
"""
from __future__ import annotations

import pytest


TIERS = ("unit", "integration", "real")


def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        parts = item.path.relative_to(config.rootpath).parts
        tier = parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else None
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: a test belongs in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda item: item.get_closest_marker("ray_in_process") is not None)  # stable: order kept
