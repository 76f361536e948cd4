"""A sweep from the command line: compose, plan (or resume), launch, summarize.

The harness composes the config with Hydra's compose API (harness.config), expands and checks
the grid itself (harness.plan) so that every point is checked before any runs and has a stable
job number, on resume launches only the points without an answer (harness.resume), hands the
points to the Hydra launcher the config names (harness.launch), and prints the sweep's table
and claims (harness.summary).
"""

import shlex
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from hydra import initialize_config_dir

from harness import store
from harness.config import (
    CONF,
    check_harness_keys,
    compose_config,
    experiment_name,
    parse,
    split_flags,
)
from harness.describe import show
from harness.experiment import BadInput
from harness.launch import launch, prepare_launcher
from harness.launchers import SlurmLauncher
from harness.plan import discard, new_sweep_id, plan, write_manifest
from harness.resume import resumed
from harness.status import compact_if_finished
from harness.summary import report, resume_command, status_command


def run(argv: list[str]) -> int:
    """Run the sweep that the overrides in `argv` describe; returns the exit code."""
    arguments, flags = split_flags(argv)
    config_dirs = flags.config_dirs
    overrides = parse(arguments)
    with initialize_config_dir(config_dir=str(CONF), job_name="harness", version_base=None):
        if flags.help or flags.cfg or flags.info:
            return show(overrides, flags)  # runs nothing
        experiment = experiment_name(overrides, config_dirs)
        check_harness_keys(overrides)
        resume = next((o.value() for o in overrides if o.get_key_element() == "resume"), None)
        if resume:
            sweep, cfg = resumed(overrides, experiment, str(resume), config_dirs)
            launcher = prepare_launcher(cfg, sweep.command)
        else:
            command = shlex.join(["python", "-m", "harness", *argv])
            fixed = [o.input_line for o in overrides if not o.is_sweep_override()]
            cfg = compose_config([*fixed, f"sweep_id={new_sweep_id()}"], experiment, config_dirs)
            launcher = prepare_launcher(cfg, command)
            sweep = plan(cfg, [o for o in overrides if o.is_sweep_override()])
            sweep.command = command
            write_manifest(sweep)
        sweep.config_dirs = config_dirs
        print(f"sweep {sweep.id}: {experiment}, {len(sweep.points)} points to run", flush=True)
        started = time.perf_counter()
        try:
            with _terminate_as_interrupt():
                ended = launch(cfg, sweep, launcher)
        except KeyboardInterrupt as stop:
            if isinstance(launcher, SlurmLauncher):
                advice = f"its SLURM tasks run on; follow them with: {status_command(sweep)}"
            else:
                advice = f"finish it with: {resume_command(sweep)}"
            print(f"\ninterrupted; {advice}", file=sys.stderr)
            return 143 if isinstance(stop, Terminated) else 130
        except BadInput:  # nothing was launched: a new sweep leaves no trace
            if not resume:
                discard(sweep)
            raise
        except OSError as error:  # the store cannot be written: disk full, permissions
            said = f"{error.strerror or error}: {error.filename}" if error.filename else error
            print(
                f"error: cannot write the sweep's rows ({said}); the sweep stopped. Once it "
                f"can be written, finish it with: {resume_command(sweep)}",
                file=sys.stderr,
            )
            return 1
    if not ended:
        print(f"sweep {sweep.id}: follow it with: {status_command(sweep)}")
        return 0
    seconds = time.perf_counter() - started
    manifest = store.read_manifest(sweep.results, experiment, sweep.id)
    compact_if_finished(sweep.results, experiment, sweep.id, manifest)  # reports read one file
    return report(sweep, manifest, seconds)


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
