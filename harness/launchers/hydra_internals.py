"""The one place the harness leans on Hydra's private parts, so that a Hydra that changes them
fails one test (tests/test_hydra_internals.py) with a message, not a sweep.

- hydra._internal.callbacks.Callbacks: every launcher's setup() takes a HydraContext, whose
  callbacks Hydra's own run path builds from the config; the compose API builds none.
- hydra._internal.core_plugins.basic_launcher.BasicLauncher: the launcher whose jobs the
  harness runs itself, in this process (harness.launchers.in_process).
- The Hydra object behind GlobalHydra (hydra._internal.hydra.Hydra) and its show_info, which
  prints what Hydra's --info prints.

Both exist, unchanged in the parts used here, throughout hydra-core 1.3 (pyproject.toml pins
>=1.3.2,<1.4).
"""

import logging

from hydra._internal.callbacks import Callbacks
from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.global_hydra import GlobalHydra
from hydra.types import HydraContext
from omegaconf import DictConfig


def hydra_context(cfg: DictConfig) -> HydraContext:
    """The context a launcher is set up with, for Hydra's initialized config search path."""
    loader = GlobalHydra.instance().config_loader()
    return HydraContext(config_loader=loader, callbacks=Callbacks(cfg))


def is_basic_launcher(launcher) -> bool:
    """Whether `launcher` is Hydra's BasicLauncher (hydra/launcher=basic, the default). By
    its module and name: Hydra's plugin registry loads its core plugins as modules of their
    own, so the instance's class is not the one an import gives."""
    kind = type(launcher)
    return (kind.__module__, kind.__qualname__) == (BasicLauncher.__module__, "BasicLauncher")


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
