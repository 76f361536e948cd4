"""The one place the harness leans on Hydra's private parts, so that a Hydra that changes them
fails one test (tests/test_hydra_internals.py) with a message, not a sweep.

- hydra._internal.callbacks.Callbacks: every launcher's setup() takes a HydraContext, whose
  callbacks Hydra's own run path builds from the config; the compose API builds none.
- The Hydra object behind GlobalHydra (hydra._internal.hydra.Hydra) and its show_info, which
  prints what Hydra's --info prints.

Both exist, unchanged in the parts used here, throughout hydra-core 1.3 (pyproject.toml pins
>=1.3.2,<1.4).
"""

import logging

from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.types import HydraContext
from omegaconf import DictConfig


def hydra_context(cfg: DictConfig) -> HydraContext:
    """The context a launcher is set up with, for Hydra's initialized config search path."""
    loader = GlobalHydra.instance().config_loader()
    return HydraContext(config_loader=loader, callbacks=Callbacks(cfg))


def show_info(topic: str, overrides: list[str]) -> None:
    """Print Hydra's --info TOPIC for the root config composed with `overrides`. Hydra sets up
    a stdout log handler for it, taken away again here."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        GlobalHydra.instance().hydra.show_info(topic, "config", overrides)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
