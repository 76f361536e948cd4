"""The command line: a sweep from Hydra's overrides (python -m harness +experiment=NAME
key=value ...), and beside it the commands, each an argparse subcommand: status, compact, code
and again, whose options are typed as a sweep's overrides are (out=DIR, or --out DIR), and
report, history and note, the report layer's (octlm_analysis's). Bad input is one line on stderr and
exit code 2."""

import argparse
import os
import re
import sys

from harness.errors import BadInput, os_error, reader_gone
from harness.names import PLAIN, check_name, key_of, split_flags, usage

PROG = "python -m harness"
OPTION = re.compile(r"\+?([a-z_]+)=(.*)", re.DOTALL)  # key=value, +key=value alike
MOST_AGAIN = 16  # sweeps again takes at once


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not [a for a in argv if a not in ("-m", "--multirun")]:  # every run is a sweep already
        print(usage([]), file=sys.stderr)
        sys.exit(2)
    if argv[0] == "help":
        argv = ["--help", *argv[1:]]
    try:
        if argv[0] == "report":
            code = _report(argv[1:])
        elif argv[0] == "note":
            code = _note(argv[1:])
        else:
            code = run_command(argv) if argv[0] in commands() else _sweep(argv)
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
        os.execve(sys.executable, *harness_from(again.code_store, again.digest, argv))


def _report(argv: list[str]) -> int:
    """python -m harness report ARGS: the report's own command line (octlm_analysis), which only
    reads the store; the harness's layers below the command line never import it."""
    from octlm_analysis.__main__ import main

    return main(argv)


def _note(argv: list[str]) -> int:
    """python -m harness note NOTE.md ...: a note's bindings read from the store and written
    (octlm_analysis.note_command), which, as the report, only reads the store."""
    from octlm_analysis.note_command import main

    return main(argv)


def run_command(argv: list[str]) -> int:
    """python -m harness COMMAND ARGS (status, compact, code, again): ARGS parsed by the
    command's parser, its key=value options as --key value (as_flags), and the command run."""
    parser = commands()[argv[0]]
    try:
        flags = as_flags(argv[1:], parser.keys, parser.switches)
    except ValueError as error:
        parser.error(str(error))
    arguments = parser.parse_args(flags)
    return arguments.run(arguments, parser)


def as_flags(tokens: list[str], keys, switches=()) -> list[str]:
    """A command's arguments as argparse reads them: each key=value (+key=value alike) as
    --key value, an _ in the key as -; the rest as given (a value after --key too, but after a
    flag of `switches`, which takes none). ValueError for a key=value of a key not in `keys`."""
    flags, value_next = [], False
    for token in tokens:
        found = None if value_next else OPTION.fullmatch(token)
        value_next = (
            token.startswith("--") and "=" not in token and token not in {"--help", *switches}
        )
        if found is None:
            flags.append(token)
            continue
        key, value = found.groups()
        if key not in keys:
            raise ValueError(f"unknown option {key}=")
        flags += [f"--{key.replace('_', '-')}", value]
    return flags


class Parser(argparse.ArgumentParser):
    """A command's parser: its errors are BadInput (one line, with the command's usage), and
    `keys` its options by key (out, code_store), each also key=value."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys: dict[str, str] = {}
        self.switches: set[str] = set()  # the flags that take no value (--check)

    def switch(self, flag: str, what: str) -> None:
        """A flag that takes no value (`flag`: --check)."""
        self.switches.add(flag)
        self.add_argument(flag, action="store_true", help=what)

    def option(self, key: str, metavar: str, what: str, plus: str = "", **kwargs) -> None:
        """The option `key`, given as key=VALUE or --key VALUE (an _ in key as -); `plus`: "+"
        where the documented form is +key=VALUE (as Hydra's for a key the config lacks)."""
        self.keys[key] = metavar
        self.add_argument(f"--{key.replace('_', '-')}", dest=key, metavar=metavar,
                          help=f"{plus}{key}={metavar}: {what}", **kwargs)  # fmt: skip

    def error(self, message: str):
        message = re.sub(r"argument --([\w-]+)", lambda m: m[1].replace("-", "_"), message)
        command = self.prog.removeprefix(f"{PROG} ")
        forms = self.format_usage().removeprefix("usage:").splitlines()
        raise BadInput(f"{command}: {message} (usage: {' or '.join(f.strip() for f in forms)})")


def sweep_id(text: str) -> str:
    """A sweep id as a command takes it: an id, last, or tag:NAME (the newest sweep tagged NAME,
    store.named_sweep)."""
    if text.startswith("tag:"):
        return "tag:" + check_name("tag", text.removeprefix("tag:"))
    return check_name("sweep id", text)


def experiment(text: str) -> str:
    return check_name("experiment", text)


def out_folder(text: str) -> str:
    """An out folder as given: plain, or quoted and escaped as Hydra reads it (the commands the
    harness prints quote it so)."""
    if PLAIN.fullmatch(text):
        return text
    from harness.names import reads_as

    said = reads_as(f"out={text}")
    return said if isinstance(said, str) else text


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def _status(arguments, parser) -> int:
    from harness.command.status import status

    return status(arguments.sweep_id, arguments.out, arguments.experiment)


def _compact(arguments, parser) -> int:
    from harness.command.compact import compact

    return compact(arguments.sweep_id, arguments.out, arguments.experiment)


def _code(arguments, parser) -> int:
    from harness.command.code import code, prune_code

    ids, outs = arguments.sweep_ids, arguments.out or []
    if ids[0] == "prune":
        if ids[1:]:
            parser.error(f"prune takes out folders (out=DIR), not {' '.join(ids[1:])}")
        return prune_code(outs or ["outputs"], arguments.code_store)
    if len(ids) > 2:
        parser.error(f"one sweep id, or two to compare, not {len(ids)}")
    return code([sweep_id(i) for i in ids], (outs or ["outputs"])[-1], arguments.code_store)


AGAIN_SETTINGS = ("times", "most", "factor", "budget_s")  # again's own defaults where not given


def _again(arguments, parser) -> int:
    from harness.command.again import again

    if len(arguments.sweep_ids) > MOST_AGAIN:
        parser.error(f"at most {MOST_AGAIN} sweeps, not {len(arguments.sweep_ids)}")
    given = {key: getattr(arguments, key) for key in AGAIN_SETTINGS}
    settings = {key: value for key, value in given.items() if value is not None}
    return again(arguments.sweep_ids, arguments.out, arguments.code_store, **settings)


OUT = "the out folder whose store (DIR/results) holds the sweep (default: outputs)"
CODE_STORE = "the code store the sweep kept its code in (default: its code_store setting)"


def commands() -> dict[str, Parser]:
    """The commands beside a sweep by name, each its parser, which names its function (`run`)."""
    top = argparse.ArgumentParser(prog=PROG, add_help=False)
    parsers = top.add_subparsers(dest="command", parser_class=Parser)
    for name, run, what in (
        ("status", _status, "Each point of a sweep: pending, running, ok, failed (its error), "
         "killed or not run, and the command that finishes it."),
        ("compact", _compact, "A sweep's job files merged into one Parquet file (refused while "
         "SLURM still runs its points)."),
    ):  # fmt: skip
        parser = parsers.add_parser(
            name, usage=f"{PROG} {name} SWEEP_ID [out=DIR] [+experiment=NAME]", description=what
        )
        parser.add_argument("sweep_id", metavar="SWEEP_ID", type=sweep_id,
                            help="a sweep id, or last: the newest sweep")  # fmt: skip
        parser.option("out", "DIR", OUT, type=out_folder, default="outputs")
        parser.option("experiment", "NAME", "the experiment whose newest sweep last names",
                      plus="+", type=experiment)  # fmt: skip
        parser.set_defaults(run=run)
    _code_parser(parsers)
    _again_parser(parsers)
    _history_parser(parsers)
    return parsers.choices


def _code_parser(parsers) -> None:
    parser = parsers.add_parser(
        "code",
        usage=f"{PROG} code SWEEP_ID [OTHER_SWEEP_ID] [out=DIR] [code_store=DIR]\n"
        f"       {PROG} code prune [out=DIR ...] [code_store=DIR]",
        description="The files of the code a sweep ran, or the files that differ between two "
        "sweeps' code and their unified diff; prune: the code store rid of every code that no "
        "sweep under the out folders ran.",
    )
    parser.add_argument(
        "sweep_ids", nargs="+", metavar="SWEEP_ID",
        help="a sweep id (last: the newest sweep), two to compare, or prune",
    )  # fmt: skip
    parser.option("out", "DIR", f"{OUT}; prune: once per out folder whose sweeps keep their code",
                  type=out_folder, action="append")  # fmt: skip
    parser.option("code_store", "DIR", CODE_STORE)
    parser.set_defaults(run=_code)


def _again_parser(parsers) -> None:
    parser = parsers.add_parser(
        "again",
        usage=f"{PROG} again SWEEP [SWEEP ...] [times=N] [most=N] [factor=F] [budget_s=S] "
        "[out=DIR] [code_store=DIR]",
        description="Each sweep run again on its own code, in turns, until each has `times` "
        "sweeps; of two sweeps of one experiment, the timing gate: it compares them, one more "
        "of each while a timing is not decided, and exits as the comparison (0, 1 or 3).",
    )
    parser.add_argument("sweep_ids", nargs="+", metavar="SWEEP", type=sweep_id,
                        help="a sweep id (last: the newest sweep)")  # fmt: skip
    parser.option("times", "N", "sweeps of each before the first comparison", type=whole)
    parser.option("most", "N", "sweeps of a side at most", type=whole)
    parser.option("factor", "F", "the slowdown the gate fails (B/A)", type=number)
    parser.option("budget_s", "S", "seconds after which it runs no more sweeps", type=number)
    parser.option("out", "DIR", OUT, type=out_folder, default="outputs")
    parser.option("code_store", "DIR", CODE_STORE)
    parser.set_defaults(run=_again)


def _history(arguments, parser) -> int:
    """python -m harness history: the report layer's (octlm_analysis.history), which only reads
    the store."""
    from pathlib import Path

    from octlm_analysis.history import main

    metrics = [check_name("metric", m) for m in arguments.metrics]
    code, pairs = main(arguments.experiment, metrics, Path(arguments.out), arguments.check)
    from harness.command.bisect import Target, bisect
    from harness.command.confirm import Pair, confirm

    found = [Pair(**pair) for pair in pairs]
    if arguments.confirm and found:
        code = confirm(found, arguments.out, arguments.code_store, arguments.check)
    for pair in found if arguments.bisect else []:
        target = Target(arguments.experiment, pair.before, pair.after, pair.commits, pair.metric,
                        pair.point, pair.log)  # fmt: skip
        bisected = bisect(target, arguments.out, arguments.code_store)
        code = code or bisected
    return code


def _history_parser(parsers) -> None:
    parser = parsers.add_parser(
        "history",
        usage=f"{PROG} history EXPERIMENT [METRIC ...] [out=DIR] [--check] [--confirm] "
        "[--bisect] [code_store=DIR]",
        description="Each metric of the experiment, per point, over its sweeps in the order "
        "planned (one value a sweep, each machine's sweeps apart): the steps found, each with "
        "its ratio after/before and the two sweeps (codes, commits) it lies between.",
    )
    parser.add_argument("experiment", metavar="EXPERIMENT", type=experiment,
                        help="the experiment whose sweeps make the history")  # fmt: skip
    parser.add_argument("metrics", nargs="*", metavar="METRIC", default=[],
                        help="the metrics judged (default: timings, claims' metrics)")  # fmt: skip
    parser.switch("--check", "exit 1 where a step made a metric worse (with --confirm: and "
                  "stands)")  # fmt: skip
    parser.switch("--confirm", "each step's two sweeps run again by the gate (again), on their "
                  "own codes: whether it stands, and the codes' difference")  # fmt: skip
    parser.switch(
        "--bisect",
        "of each step, the first commit on its far side: the step's "
        "point run at the commits between its two sweeps' (a git worktree each)",
    )
    parser.option("code_store", "DIR", CODE_STORE)
    parser.option("out", "DIR", "the out folder whose store (DIR/results) holds the sweeps "
                  "(default: outputs)", type=out_folder, default="outputs")  # fmt: skip
    parser.set_defaults(run=_history)
