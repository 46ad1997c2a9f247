"""Test ordering: the tests that make pytest's own process a Ray driver run last.

A process that has been a Ray driver keeps Ray's threads' state after ray.shutdown(); a DataLoader
worker forked from it later can segfault. Every other module forks workers from pytest's process,
so those modules run before any test marked ``ray_in_process`` (tests/test_offload_ray.py).
"""
from __future__ import annotations


def pytest_collection_modifyitems(session, config, items) -> None:
    items.sort(key=lambda item: item.get_closest_marker("ray_in_process") is not None)  # stable: order kept
