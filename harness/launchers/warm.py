"""The forkserver that warm workers are forked from (harness.launchers.workers): one process that
imports torch and the libraries once (PRELOAD) and never touches a GPU, so that a worker starts in
milliseconds, each can still make its own CUDA context, and none inherits the sweep's threads
or locks. Standard library only: the command line starts it before it imports Hydra (wanted),
so that its imports run beside the sweep's composing and planning."""

import multiprocessing
import os
from multiprocessing import forkserver

# What the forkserver imports once, and every worker forked from it has: torch and the libraries
# the harness imports, never the harness itself, which a worker imports from its sweep's
# snapshot of the code (harness.pinning.codestore).
PRELOAD = ["torch", "pandas", "pyarrow.parquet", "pyarrow.dataset", "hydra.core.utils",
           "hydra.core.override_parser.overrides_parser", "omegaconf", "submitit",
           "cloudpickle", "numpy"]  # fmt: skip


def context() -> multiprocessing.context.BaseContext:
    forkserver.set_forkserver_preload(PRELOAD)
    return multiprocessing.get_context("forkserver")


def warm_up() -> None:
    """Start the forkserver now (once a process). It gets no stdout or stderr of ours: it would
    hold them open after the sweep ends, while it unloads torch, and a reader of the sweep's
    output (a pipe) would wait for that. Its workers write to their sweep's workers.log."""
    context()
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        forkserver.ensure_running()
    finally:
        for fd, copy in enumerate(saved, start=1):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(null)


def wanted(arguments: list[str]) -> bool:
    """Whether a sweep's command line picks the local launcher's warm workers: hydra/launcher=local
    without hydra.launcher.fresh=true, from its words alone (an experiment's own fresh, or a
    point of several processes, leaves the forkserver started unused)."""
    chosen = {}
    for argument in arguments:
        key, _, value = argument.partition("=")
        chosen[key.lstrip("+~")] = value.strip()
    return chosen.get("hydra/launcher") == "local" and chosen.get("hydra.launcher.fresh") != "true"
