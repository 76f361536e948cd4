"""The command line: a sweep from Hydra overrides, a sweep's status, its compaction, its code,
its runs again, or the report (octlm_analysis's command line); bad input is one line on stderr
and exit code 2."""

import os
import sys
import time
from pathlib import Path

from harness.errors import BadInput, os_error, reader_gone
from harness.names import PLAIN, check_name, key_of, split_flags, usage


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not [a for a in argv if a not in ("-m", "--multirun")]:  # every run is a sweep already
        print(usage([]), file=sys.stderr)
        sys.exit(2)
    if argv[0] == "help":
        argv = ["--help", *argv[1:]]
    try:
        command = COMMANDS.get(argv[0])
        code = command(argv) if command else _sweep(argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    except BrokenPipeError:  # the reader went away (status | head): nothing more to say
        code = reader_gone()
    except OSError as error:  # a store this user may not write (compact), a folder gone
        print(f"error: {os_error(error)}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:  # status or compact: a compaction it started finished first
        print("\ninterrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


# Each command imports what it needs when it runs: --help, status and compact load neither
# Hydra, pandas nor torch (tests/test_layers.py holds them to it).


def _sweep(argv: list[str]) -> int:
    arguments, flags = split_flags(argv)
    if flags.help and not any(key_of(argument) == "experiment" for argument in arguments):
        print(usage(flags.config_dirs))
        return 0
    from harness.launchers import warm

    if warm.wanted(arguments):  # its imports run beside Hydra's and the experiment's
        warm.warm_up()
    from harness.command import sweep
    from harness.pinning.codestore import RunFrom, harness_from

    try:
        return sweep.run(argv)
    except RunFrom as again:  # a resume whose points run here, on the sweep's own code
        if getattr(sys.modules["__main__"].__spec__, "name", None) != "harness.__main__":
            raise BadInput(f"{again}: resume it with python -m harness") from None
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, *harness_from(again.store, again.digest, argv))


def _status(sweep_id: str, out: str, experiment: str | None) -> int:
    from harness.command.status import status

    return status(sweep_id, out, experiment)


def _compact(sweep_id: str, out: str, experiment: str | None) -> int:
    """Merge the sweep's job files into one (store.compact); refused while SLURM runs points."""
    from harness import store
    from harness.command.status import find_experiment, still_scheduled

    results = Path(out).resolve() / "results"
    sweep_id = store.named_sweep(results, sweep_id, experiment)
    experiment = find_experiment(results, sweep_id)
    running = still_scheduled(store.read_manifest(results, experiment, sweep_id) or {})
    if running:
        raise BadInput(
            f"sweep {sweep_id} still has {len(running)} points queued or running on SLURM; "
            f"compact it once they end (python -m harness status {sweep_id})"
        )
    started = time.perf_counter()
    path, absorbed = store.compact(results, experiment, sweep_id)
    if (
        path is None
        and (store.read(results, experiment, sweep_id)["status"] == store.RUNNING).any()
    ):
        print(f"sweep {sweep_id} ({experiment}) has a training point still running: compact it "
              "once it ends (or resume it)")  # fmt: skip
    elif path is None:
        print(f"sweep {sweep_id} ({experiment}) has no rows to compact")
    elif not absorbed:
        print(f"sweep {sweep_id} ({experiment}) is compacted already: {path}")
    else:
        seconds = time.perf_counter() - started
        print(
            f"sweep {sweep_id} ({experiment}): {len(absorbed)} files merged into {path} in "
            f"{seconds:.1f} s"
        )
    return 0


def _code(argv: list[str]) -> int:
    """The files of a sweep's code, the unified diff between two sweeps' code, or (prune) the
    code store rid of the codes that no sweep under the out folders given ran."""
    from harness.command.code import code, prune_code

    if argv[1:2] == ["prune"]:
        outs = [_out({"out": a.partition("=")[2]}) for a in argv[2:] if key_of(a) == "out"]
        rest = [argv[0], *(a for a in argv[2:] if key_of(a) != "out")]
        options, _ = _options(rest, {"code_store"}, "prune [out=DIR ...]", (0, 0))
        return prune_code(outs or ["outputs"], options.get("code_store"))
    options, ids = _options(argv, {"out", "code_store"}, "SWEEP_ID [OTHER_SWEEP_ID]", (1, 2))
    return code(ids, _out(options), options.get("code_store"))


def _again(argv: list[str]) -> int:
    """Sweeps run again, each on its own code, in turns (a timing gate's processes apart)."""
    from harness.command.status import again

    settings = ("times", "most", "factor", "budget_s")
    options, ids = _options(argv, {"out", "code_store", *settings}, "SWEEP_ID [SWEEP_ID ...]",
                            (1, 16))  # fmt: skip
    settings = {key: options[key] for key in settings if key in options}
    return again(ids, _out(options), options.get("code_store"), **settings)


def _report(argv: list[str]) -> int:
    """python -m harness report ARGS: the report's own command line (octlm_analysis), which only
    reads the store; the harness's layers below the command line never import it."""
    from octlm_analysis.__main__ import main

    return main(argv[1:])


COMMANDS = {
    "report": _report,
    "status": lambda argv: _status(*_sweep_and_out(argv)),
    "compact": lambda argv: _compact(*_sweep_and_out(argv)),
    "code": _code,
    "again": _again,
}


PLACEHOLDERS = {"times": "times=N", "most": "most=N", "factor": "factor=F",
                "budget_s": "budget_s=S", "experiment": "+experiment=NAME"}  # fmt: skip


def _options(argv: list[str], keys: set[str], usage_: str, count=(1, 1)) -> tuple[dict, list]:
    """A command's key=value options (of `keys`; +key=value as key=value) and its sweep ids
    (their count in `count`)."""
    options = {key.lstrip("+"): value for key, value in
               (a.split("=", 1) for a in argv[1:] if "=" in a)}  # fmt: skip
    ids = [check_name("sweep id", a) for a in argv[1:] if "=" not in a]
    if not count[0] <= len(ids) <= count[1] or set(options) - keys:
        shown = " ".join(f"[{PLACEHOLDERS.get(key, key + '=DIR')}]" for key in sorted(keys))
        raise BadInput(f"usage: python -m harness {argv[0]} {usage_} {shown}")
    return options, ids


def _sweep_and_out(argv: list[str]) -> tuple[str, str, str | None]:
    """`status SWEEP_ID [out=DIR] [+experiment=NAME]`'s sweep id, out dir and experiment (whose
    newest sweep `last` names; the same for compact)."""
    options, ids = _options(argv, {"out", "experiment"}, "SWEEP_ID")
    experiment = options.get("experiment")
    return ids[0], _out(options), experiment and check_name("experiment", experiment)


def _out(options: dict) -> str:
    out = options.get("out", "outputs")  # plain, or quoted and escaped as Hydra reads it
    if not PLAIN.fullmatch(out):
        from harness.names import reads_as

        said = reads_as(f"out={out}")
        out = said if isinstance(said, str) else out
    return out
