"""python -m harness note NOTE.md [--check] [--accept] [--config-dir DIR] [out=DIR]: a
researcher's note with the store's values (octlm_analysis.notes for the bindings it holds).

It writes OUT/notes/NOTE.md and NOTE.html with each bound number as the store says it now,
linked to its sweep, its rows and its code. --check writes nothing: it exits 1 naming each
binding whose value moved beyond the precision the note wrote it with, whose claim's verdict
changed, whose sweep or rows are gone, or that states no value yet; 0 when all stand.
--accept writes the store's values into NOTE.md itself (a diff to review and commit), then the
note. It never runs an experiment: it reads the store as `python -m harness report` does. A
binding that cannot work (an experiment, reducer, claim or column that is not there) is one
line each on stderr and exit 2, before anything is written.
"""

import argparse
import sys
from pathlib import Path

from harness import files
from harness.errors import os_error
from harness.names import CONF
from harness.yaml_files import read_yaml
from octlm_analysis.note_values import Sweeps, Value, accepted, evaluate, shown
from octlm_analysis.notes import BadBinding, parse, stands


def main(argv: list[str] | None = None) -> int:
    """The command; its exit code (0, 1 for a stale binding under --check, 2 for bad input)."""
    argv = sys.argv[1:] if argv is None else argv
    argv = [f"--out={a[4:]}" if a.startswith("out=") else a for a in argv]
    args = _parser().parse_args(argv)
    try:
        text = args.note.read_text()
    except (OSError, UnicodeDecodeError) as error:
        print(f"error: cannot read the note {args.note}: {_said(error)}", file=sys.stderr)
        return 2
    values, bad = read_values(text, Path(args.out) / "results", args.config_dir)
    if bad:
        for line, said in bad:
            print(f"error: {args.note}:{line}: {said}", file=sys.stderr)
        return 2
    written = []
    try:
        if args.accept:
            _accept(args.note, text, values)
            text = args.note.read_text()
            values, _ = read_values(text, Path(args.out) / "results", args.config_dir)
        if not args.check or args.accept:  # a check reads, and writes nothing
            from octlm_analysis.note_render import render

            written = render(text, values, Path(args.out) / "notes", args.note.stem,
                             Path(args.out) / "results")  # fmt: skip
    except files.Linked as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {os_error(error)}", file=sys.stderr)
        return 1
    stale = [found for found in values if moved(found)]
    unswept = {} if args.check else {f.binding.experiment: f for f in stale if f.unswept}
    for found in stale:
        if found.binding.experiment not in unswept:
            print(f"STALE {args.note}:{found.binding.line}: {found.binding.said()}: "
                  f"{moved(found)}", file=sys.stdout if args.check else sys.stderr)  # fmt: skip
    if unswept:  # a store that has not run them yet (make run's): one line, not one a binding
        count = sum(found.unswept for found in stale)
        print(
            f"note: {count} bindings read experiments with no sweep in {Path(args.out)}/results"
            f" ({', '.join(unswept)}): they show no value",
            file=sys.stderr,
        )
    where = f"{written[0]} and {written[1]}" if written else f"{args.note} checked"
    print(f"note: {where} ({len(values)} bindings, {len(stale)} stale)")
    return 1 if args.check and stale else 0


def read_values(text: str, results: Path, config_dirs) -> tuple[list[Value], list]:
    """Each binding's value from the store, and the bad bindings (line, what is wrong)."""
    bindings, bad = parse(text)
    sweeps = Sweeps(results, [Path(d).resolve() for d in config_dirs])
    values = []
    for binding in bindings:
        try:
            values.append(evaluate(binding, sweeps))
        except BadBinding as error:
            bad.append((binding.line, str(error)))
    return values, sorted(bad)


REPORT_CONFIG = "report.yaml"  # in conf/ and each --config-dir: `notes:`, globs of notes


def configured_notes(config_dirs) -> list[Path]:
    """The notes `python -m harness report` checks: the globs of `notes:` in conf/report.yaml
    and each config dir's report.yaml, from the working folder; ValueError for a `notes:`
    that is no list of text."""
    found = []
    for folder in (CONF, *map(Path, config_dirs)):
        path = folder / REPORT_CONFIG
        globs = (read_yaml(path) or {}).get("notes") or [] if path.is_file() else []
        if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
            raise ValueError(f"{path}: notes is a list of globs (docs/notes/*.md), not {globs!r}")
        for pattern in globs:
            found += sorted(Path().glob(pattern)) if not Path(pattern).is_absolute() else sorted(
                Path("/").glob(pattern.lstrip("/")))  # fmt: skip
    return list(dict.fromkeys(found))


def check_notes(results: Path, config_dirs) -> list[tuple[str, str]]:
    """Each configured note checked as --check checks it: (PASS, "NOTE.md: N bindings stand"),
    or a line (STALE, "NOTE.md:LINE: {{ ... }}: why") per binding that no longer stands and
    (ERROR, "NOTE.md:LINE: what is wrong") per bad one."""
    said = []
    for note in configured_notes(config_dirs):
        try:
            values, bad = read_values(note.read_text(), results, config_dirs)
        except (OSError, UnicodeDecodeError) as error:
            said.append(("ERROR", f"{note}: cannot be read: {_said(error)}"))
            continue
        said += [("ERROR", f"{note}:{line}: {why}") for line, why in bad]
        stale = [found for found in values if moved(found)] if not bad else []
        said += [("STALE", f"{note}:{found.binding.line}: {found.binding.said()}: {moved(found)}")
                 for found in stale]  # fmt: skip
        if not bad and not stale:
            said.append(("PASS", f"{note}: {len(values)} bindings stand"))
    return said


def moved(found: Value) -> str:
    """Why a binding no longer stands ("" where it does): its sweep or rows gone, no value
    written, or the store's value beyond the written one's precision."""
    binding = found.binding
    if found.problem:
        return found.problem
    if binding.block:
        return ""
    if binding.written is None:
        return f"it states no value; the store says {shown(found)} (--accept writes it)"
    if not stands(binding.written, found.value):
        return f"the store says {shown(found)} (sweep {found.sweep}), not {binding.written}"
    return ""


def _accept(note: Path, text: str, values: list[Value]) -> None:
    """NOTE.md with the store's values, each change said."""
    new = accepted(text, values)
    for found in values:
        if not found.binding.block and not found.problem and moved(found):
            print(f"accepted {note}:{found.binding.line}: {found.binding.written or 'none'} -> "
                  f"{shown(found)}")  # fmt: skip
    if new != text:
        files.write_text(note, new)


def _said(error: Exception) -> str:
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)


USAGE = "python -m harness note NOTE.md [--check] [--accept] [--config-dir DIR] [out=DIR]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"error: note: {message} (usage: {USAGE})", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m harness note", description=__doc__, usage=USAGE,
                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("note", type=Path, metavar="NOTE.md", help="the note, plain Markdown")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 naming each binding the store no longer bears out",
    )
    parser.add_argument(
        "--accept",
        action="store_true",
        help="write the store's values into NOTE.md (a diff to review)",
    )
    parser.add_argument(
        "--config-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of experiments of your own (DIR/experiment/NAME.yaml)",
    )
    parser.add_argument("--out", default="outputs", metavar="DIR",
                        help="out=DIR: the out folder whose store (DIR/results) it reads; the "
                        "note goes to DIR/notes")  # fmt: skip
    return parser
