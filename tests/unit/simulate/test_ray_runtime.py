"""Flower's simulation engine without Ray installed (the image leaves it out): one line."""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec

import pytest

from fedshard.errors import RoundError
from fedshard.simulate.ray_runtime import start_ray


def test_without_ray_the_engine_is_refused_in_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def without_ray(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "ray" else real(name, package)

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", without_ray)
    with pytest.raises(RoundError, match=r"pip install 'fedshard\[simulation\]', or simulate with --engine inprocess"):
        start_ray()
