"""harness/launchers/hydra_internals.py, the one place the harness uses Hydra's private parts: this
fails, saying what moved, on a Hydra that changed them."""

import inspect

import pytest
from hydra.types import HydraContext

from harness.names import CONF
from harness.planning.config import compose_config


def test_the_private_names_are_where_the_harness_expects_them():
    try:
        from harness.launchers import hydra_internals
    except ImportError as error:  # hydra._internal.callbacks.Callbacks moved
        pytest.fail(f"Hydra moved what harness/launchers/hydra_internals.py imports: {error}")
    takes = inspect.signature(hydra_internals.Callbacks).parameters
    assert "config" in takes, f"Callbacks takes {list(takes)}, no longer the config"


def test_a_launcher_context_from_a_composed_config(initialized):
    from harness.launchers.hydra_internals import hydra_context

    cfg = compose_config(["+experiment=exp014_tiled", "sweep_id=x"], "exp014_tiled", [])
    context = hydra_context(cfg)
    assert isinstance(context, HydraContext)
    assert context.callbacks is not None and context.config_loader is not None


def test_show_info_prints_what_hydra_info_prints(initialized, capsys):
    from hydra.core.global_hydra import GlobalHydra

    from harness.launchers.hydra_internals import show_info
    from harness.names import INFO

    shows = inspect.signature(GlobalHydra.instance().hydra.show_info).parameters
    assert list(shows)[:3] == ["info", "config_name", "overrides"], list(shows)
    show_info("searchpath", ["+experiment=exp014_tiled", "sweep_id=x"])
    assert f"file://{CONF}" in capsys.readouterr().out
    assert set(INFO) == {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
