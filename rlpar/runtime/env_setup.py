"""Running an env's registration hook (`EnvConfig.setup`): a leaf that every env mode and worker
process can import."""

from __future__ import annotations

import importlib

__all__ = ["run_setup"]


def run_setup(setup: str | None) -> None:
    """Import "module" or call "module:function" (what `EnvConfig.setup` names)."""
    if not setup:
        return
    module_name, _, function = setup.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"env.setup: cannot import {module_name!r} ({e})") from e
    if function:
        fn = getattr(module, function, None)
        if not callable(fn):
            raise ValueError(f"env.setup: {module_name!r} has no function {function!r}")
        fn()
