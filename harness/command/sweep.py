"""A sweep from the command line: compose, plan (or resume), launch, summarize.

The harness composes the config with Hydra's compose API (harness.planning.config), expands and
checks the grid itself (harness.planning.plan) so that every point is checked before any runs and
has a stable job number, on resume launches only the points without an answer
(harness.command.resume), hands the points to the launcher the config names
(harness.launchers.dispatch), and prints the sweep's table and claims (harness.command.closing).
"""

import contextlib
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra import initialize_config_dir

from harness import files, store
from harness.command.closing import report, resume_command, status_command
from harness.command.resume import resumed
from harness.command.show import show
from harness.command.status import compact_if_finished
from harness.errors import BadInput, os_error
from harness.launchers.dispatch import check_devices, launch, launcher_boots, prepare_launcher
from harness.names import CONF, split_flags
from harness.pinning.codestore import RunFrom, runs_project
from harness.planning.config import check_harness_keys, experiment_name, parse
from harness.planning.plan import SweepExists, discard, new_sweep_id, plan_command, record_plan
from harness.store import common_schema

ID_ATTEMPTS = 5  # new ids to try when one is taken


def run(argv: list[str]) -> int:
    """Run the sweep that the overrides in `argv` describe; returns the exit code."""
    arguments, flags = split_flags(argv)
    config_dirs = flags.config_dirs
    overrides = parse(arguments)
    with (
        initialize_config_dir(config_dir=str(CONF), job_name="harness", version_base=None),
        contextlib.ExitStack() as hold,  # the sweep claimed while this command runs it
    ):
        if flags.help or flags.cfg or flags.info:
            return show(overrides, flags)  # runs nothing
        check_harness_keys(overrides)
        resume = next((o.value() for o in overrides if o.get_key_element() == "resume"), None)
        if resume:
            sweep, cfg = resumed(overrides, str(resume), config_dirs, hold)
            _no_links(cfg, sweep)
            launcher = prepare_launcher(cfg, sweep.command)
            check_devices(sweep.points, launcher)
            if not launcher_boots(launcher) and not runs_project(sweep.code_store, sweep.code):
                raise RunFrom(sweep.code_store, sweep.code)  # its points would run here
        else:
            experiment = experiment_name(overrides, config_dirs)
            sweep, cfg, launcher = _new_sweep(argv, overrides, experiment, config_dirs)
            hold.enter_context(store.claim(sweep.paths))
        experiment = sweep.experiment.name
        print(f"sweep {sweep.id}: {experiment}, {len(sweep.points)} points to run", flush=True)
        started, ended = time.perf_counter(), False
        try:
            with _terminate_as_interrupt():
                ended = launch(cfg, sweep, launcher)
                if ended:  # reports read one file
                    manifest = store.read_manifest(sweep.paths)
                    compact_if_finished(sweep.paths, manifest)
        except KeyboardInterrupt as stop:
            if ended:
                advice = f"its points had ended; see them with: {status_command(sweep)}"
            elif launcher.detached:
                advice = f"its jobs run on; follow them with: {status_command(sweep)}"
            else:
                advice = f"finish it with: {resume_command(sweep)}"
            print(f"\ninterrupted; {advice}", file=sys.stderr)
            return 143 if isinstance(stop, Terminated) else 130
        except BadInput:  # nothing was launched: a new sweep leaves no trace
            if not resume:
                discard(sweep)
            raise
        except OSError as error:  # the store cannot be written: disk full, permissions
            print(
                f"error: cannot write the sweep's outputs ({os_error(error)}); the sweep stopped. "
                f"Once it can be written, finish it with: {resume_command(sweep)}",
                file=sys.stderr,
            )
            return 1
    if not ended:
        print(f"sweep {sweep.id}: follow it with: {status_command(sweep)}")
        return 0
    return report(sweep, manifest, time.perf_counter() - started, bool(cfg.get("check")))


def _new_sweep(argv: list[str], overrides: list, experiment: str, config_dirs: list) -> tuple:
    """A new sweep's plan, written to its manifest under an id of its own; its config and
    launcher."""
    command = shlex.join(["python", "-m", "harness", *argv])
    first = None  # the first plan: it found the experiment's code where it lies, and its
    # commit; a second one finds it in the snapshot the first entered, in no repository
    for _ in range(ID_ATTEMPTS):
        cfg, sweep, _ = plan_command(overrides, experiment, config_dirs, new_sweep_id(), pin=True)
        first = first or sweep
        launcher = prepare_launcher(cfg, command)
        sweep.command, sweep.config_dirs = command, config_dirs
        sweep.code_commit = first.code_commit
        check_devices(sweep.points, launcher)
        _no_links(cfg, sweep)
        try:
            record_plan(sweep)
        except SweepExists:
            continue
        return sweep, cfg, launcher
    raise BadInput(f"no free sweep id in {ID_ATTEMPTS} tries: is the clock stuck?")


def _no_links(cfg, sweep) -> None:
    """BadInput (one line), before anything of the sweep is written, where a folder or file it
    would write under the out dir is a symlink: its runs folder and everything in it but
    submitit's folder (Hydra opens its files as they are), its results folder (and the folders
    down to both), and the store's columns file and its lock. The results folder's own files
    are replaced by rename or opened without following a link (a link there is a damaged
    entry, moved aside); where a link appears while the sweep runs, the write that meets it
    stops the sweep."""
    out, runs = Path(cfg.out).absolute(), Path(cfg.hydra.sweep.dir).absolute()
    results = sweep.paths.folder.absolute()
    try:
        files.no_links_within(out, runs)
        files.no_links_below(runs, skip={".submitit"})  # submitit's: it links its own files
        files.no_links_within(out, results)
        for name in (common_schema.NAME, common_schema.LOCK):
            files.no_links(results.parent.parent / name)
    except files.Linked as linked:
        raise BadInput(str(linked)) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM, stopping a sweep as Ctrl-C does (exit code 143)."""


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While a sweep runs here, SIGTERM stops it as Ctrl-C does: its points keep what they
    wrote and the resume command is printed."""

    def stop(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
