"""python -m harness report [--check] [--sweep ID ...] [--all] [--watch]: regenerate
outputs/report/REPORT.md and index.html (one page, interactive, with no server or network
needed) from outputs/results: each experiment's newest sweep, or every sweep (--all); the
sweeps --sweep chooses get a page of their own, outputs/report/sweeps/ID/.
--watch keeps them up to date while sweeps run and serves the page on http://127.0.0.1:PORT
(the page reloads itself when it changes); Ctrl-C stops it.
python -m harness report compare SWEEP_A SWEEP_B [--fail-on-regression FACTOR]: two sweeps side by
side, written to outputs/report/compare-A-vs-B.md; a side may be several sweeps of one grid,
A1,A2,A3, each a process of its own, judged by the spread between them. The gate exits 0 when
it passes, 1 for a regression or an answer lost, 2 for bad input, 3 when it could judge no
timing (each side one sweep, or every timing busy machine, without samples or a value)."""

import argparse
import sys
from pathlib import Path

from harness import files, store
from harness.errors import BadInput, os_error, reader_gone
from harness.results.claims import FAILING, outcome
from harness.store import common_schema
from octlm_analysis import point_lines
from octlm_analysis.compare import RULE
from octlm_analysis.report import claims_changed, claims_note, write_report


def main(argv: list[str] | None = None) -> int:
    """The command; a filesystem error (a report folder this user may not write, a store gone
    mid-read) is one line and exit 1, a symlink in the report folder one line and exit 2."""
    try:
        return _main(argv)
    except files.Linked as error:  # in the report folder: nothing written through it
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise
    except OSError as error:
        print(f"error: {os_error(error)}{_elsewhere(error)}", file=sys.stderr)
        return 1


def _elsewhere(error: OSError) -> str:
    """The way round a report folder that cannot be written."""
    kinds = PermissionError | IsADirectoryError | NotADirectoryError | FileExistsError
    if isinstance(error, kinds):
        return " (the report can go elsewhere: --report DIR)"
    return ""


def _parser() -> argparse.ArgumentParser:
    """The command line's arguments: the report's, and compare's."""
    parser = argparse.ArgumentParser(
        prog="python -m harness report",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("outputs"), help="the harness's out dir")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="where the report goes (default: OUT/report), for a store this user may not write",
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of experiments of your own (DIR/experiment/NAME.yaml), as the harness "
        "takes it: their tables and report modules load only as their own configs name them",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a claim of a sweep shown fails, is incomplete or errs",
    )
    parser.add_argument(
        "--current-claims",
        action="store_true",
        help="judge each sweep by the claims its experiment's YAML states today, not those the "
        "sweep recorded when it ran (a claim fixed since)",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="ID",
        help="show this sweep (repeat for several) instead of each experiment's newest",
    )
    parser.add_argument("--all", action="store_true", help="show every sweep of every experiment")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="rewrite the report whenever rows land (the page reloads itself) until Ctrl-C",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="with --watch: serve the report folder here (0: any free port; -1: do not serve)",
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="with --watch: seconds between looks"
    )
    commands = parser.add_subparsers(dest="command", title="commands", metavar="compare")
    compare = commands.add_parser(
        "compare",
        help="compare two sweeps of one experiment, point by point",
        description=f"Compare two sweeps of one experiment, point by point. {RULE}",
    )
    several = "; or several sweeps of one grid, joined by commas (each a process of its own)"
    compare.add_argument("sweep_a", metavar="SWEEP_A", help=f"a sweep's id{several}")
    compare.add_argument("sweep_b", metavar="SWEEP_B", help=f"as SWEEP_A{several[1:]}")
    compare.add_argument(
        "--fail-on-regression",
        type=float,
        metavar="FACTOR",
        help="exit 1 when a timing in B is slower than FACTOR x A (e.g. 1.10) by the rule, or an "
        "answer of A is lost in B; 3 when a timing is not decided; else 0",
    )
    compare.add_argument(
        "--looks",
        type=int,
        default=1,
        metavar="N",
        help="the processes were judged N times while they were gathered, stopping once decided "
        "(python -m harness again): each look is judged at 5%% / N",
    )
    compare.add_argument("--out", type=Path, default=argparse.SUPPRESS, help="as above")
    compare.add_argument("--report", type=Path, default=argparse.SUPPRESS, help="as above")
    return parser


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    args.report = args.report or args.out / "report"
    results = args.out / "results"
    if not results.is_dir():
        print(
            f"error: no results in {results}; run python -m harness +experiment=NAME first",
            file=sys.stderr,
        )
        return 2
    mended = common_schema.mend(results)
    if mended:
        print(f"warning: {mended}", file=sys.stderr)
    if args.command == "compare":
        return _compare(results, args)
    config_dirs = [folder.resolve() for folder in args.config_dir]
    try:
        args.sweep = _last(results, args.sweep)  # sweeps/ID/, not sweeps/last/
        shown = _chosen(results, args.sweep, args.all)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.watch:
        from octlm_analysis.watch import watch

        if not args.interval > 0:
            print(f"error: --interval takes seconds above 0, got {args.interval}", file=sys.stderr)
            return 2
        if not -1 <= args.port <= 65535:
            print(f"error: --port takes -1 to 65535, got {args.port}", file=sys.stderr)
            return 2

        def choose():  # again each time: --all takes the sweeps that start meanwhile
            return _chosen(results, args.sweep, args.all)

        return watch(results, args.report, config_dirs, choose, args.port, args.interval,
                     _page_dir(args), args.current_claims)  # fmt: skip
    histories = {}
    path, claims = write_report(results, args.report, config_dirs, shown,
                                page_dir=_page_dir(args), current_claims=args.current_claims,
                                histories=histories)  # fmt: skip
    pairs = claims.attrs["shown"]
    said = ", ".join(f"{e} {s}" for e, s in pairs) or "none"
    print(f"sweeps shown{' and checked' if args.check else ''}: {said}")
    for claim in claims.itertuples():
        print(
            f"{claim.result:10} {claim.experiment} {claim.sweep}: {claim.claim} ({outcome(claim)})"
        )
    for experiment, sweep in pairs:
        manifest = store.read_manifest(store.SweepPaths(results, experiment, sweep))
        if claims_changed(manifest, experiment, config_dirs):
            note = claims_note(args.current_claims).replace("**", "")
            print(f"sweep {sweep} ({experiment}): {note}")
        smaller = _smaller_than_its_grid(manifest, experiment)
        if smaller:
            print(f"sweep {sweep} ({experiment}): {smaller}", file=sys.stderr if args.check else
                  sys.stdout)  # fmt: skip
    print(f"report: {path} and {path.with_name('index.html')}")
    failing = claims[claims["result"].isin(FAILING)]
    notes = _notes(results, config_dirs)
    worse = _history_checked(results, args.report, dict.fromkeys(e for e, _ in pairs), histories)
    return 1 if args.check and (not failing.empty or notes or worse) else 0


def _notes(results: Path, config_dirs: list[Path]) -> bool:
    """The notes report.yaml names (notes: [docs/notes/*.md]) checked, a line each binding that
    no longer stands; whether one fails, as a failing claim does."""
    from octlm_analysis.note_command import check_notes

    try:
        said = check_notes(results, config_dirs)
    except ValueError as error:
        said = [("ERROR", str(error))]
    for result, line in said:
        print(f"{result:10} note {line}")
    return any(result != "PASS" for result, _ in said)


def _history_checked(results: Path, report: Path, experiments, histories: dict) -> int:
    """Of each experiment whose YAML says `history: true` (its newest sweep's config), its
    history's steps that made a metric worse, a line each (FAIL), or that it has none; how
    many (the report's --check fails on any). A history the page judged (`histories`, by
    experiment) is not judged again; one it has none of is, to say why."""
    from octlm_analysis.history import judge, worse_lines

    worse = 0
    for experiment in experiments:
        newest = store.newest_sweep(results, experiment)
        manifest = store.read_manifest(store.SweepPaths(results, experiment, newest))
        if not (manifest or {}).get("experiment_config", {}).get("history"):
            continue
        try:
            judged = histories.get(experiment) or judge(
                results, experiment, point_lines.of_experiment(results, experiment, report), []
            )
        except BadInput as nothing:
            print(f"{'N/A':10} {experiment} history: {nothing}")
            continue
        lines = worse_lines(judged)
        for line in lines:
            print(f"{'FAIL':10} {experiment} history: {line}")
        if not lines:
            print(f"{'PASS':10} {experiment} history: no step made a metric worse "
                  f"({len(judged.found)} step(s) in {len(judged.series)} series)")  # fmt: skip
        worse += len(lines)
    return worse


def _smaller_than_its_grid(manifest: dict | None, experiment: str) -> str:
    """A line where the sweep planned fewer points (a search's: cells) than its experiment's
    own grid had when it was planned (its YAML's hydra.sweeper.params): a grid narrowed on the
    command line stands in for the experiment's; "" otherwise."""
    size = (manifest or {}).get("own_grid_points")
    points = (manifest or {}).get("points") or []
    cells = {point.get("cell") for point in points if isinstance(point, dict)} - {None}
    planned = len(cells) if cells else len(points)
    if not isinstance(size, int) or planned >= size:
        return ""
    command = manifest.get("command") or "a narrower grid"
    return (f"{planned} of the {size} points of {experiment}'s own grid ({command}); "
            f"--sweep ID judges another")  # fmt: skip


def _page_dir(args: argparse.Namespace) -> Path | None:
    """Where the page of the sweeps --sweep chose goes: a folder of its own, report/sweeps/ID
    (IDs joined by +), so that the main page keeps every experiment; None: the main page."""
    from octlm_analysis.report import SWEEPS

    if not args.sweep:
        return None
    return args.report / SWEEPS / "+".join(dict.fromkeys(args.sweep))


def _chosen(results: Path, sweeps: list[str], every: bool) -> dict[str, list[str]] | None:
    """experiment -> the sweeps to show, in order (--sweep, --all); None: the newest of each.
    BadInput for a sweep the store does not hold."""
    from harness import store
    from harness.names import check_name

    if every:
        return {e: store.sweeps(results, e) for e in store.experiments(results)}
    if not sweeps:
        return None
    chosen: dict[str, list[str]] = {}
    for sweep in dict.fromkeys(sweeps):
        check_name("--sweep", sweep)
        experiment = store.experiment_of(results, sweep)
        if experiment is None:
            raise BadInput(f"--sweep {sweep}: no such sweep in {results}")
        chosen.setdefault(experiment, []).append(sweep)
    return chosen


def _last(results: Path, sweeps: list[str]) -> list[str]:
    """The sweep ids with `last` as the newest sweep and `tag:NAME` as the newest tagged NAME:
    of the experiment of the other ids given, where they name one, else of any (BadInput where
    there is none)."""
    named = [s for s in sweeps if s != store.LAST and not s.startswith(store.TAG)]
    experiments = {store.experiment_of(results, s) for s in named} - {None}
    experiment = experiments.pop() if len(experiments) == 1 else None
    return [store.named_sweep(results, sweep, experiment) for sweep in sweeps]


def _compare(results: Path, args: argparse.Namespace) -> int:
    from octlm_analysis.compare import CompareError, compare, in_common, nothing_in_common
    from octlm_analysis.comparison import document, write
    from octlm_analysis.sides import DamagedSide, load

    factor = args.fail_on_regression
    if factor is not None and not factor > 1:
        print(f"error: --fail-on-regression takes a factor above 1, got {factor}", file=sys.stderr)
        return 2
    if args.looks < 1:
        print(f"error: --looks takes a whole number of 1 or more, got {args.looks}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        given = args.sweep_a.split(",") + args.sweep_b.split(",")
        resolved = iter(_last(results, given))
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.sweep_a = ",".join(next(resolved) for _ in args.sweep_a.split(","))
    args.sweep_b = ",".join(next(resolved) for _ in args.sweep_b.split(","))
    both = set(args.sweep_a.split(",")) & set(args.sweep_b.split(","))
    if both:
        print(f"error: sweep {', '.join(sorted(both))} is on both sides: compare sweeps of A's "
              "code with other sweeps of B's", file=sys.stderr)  # fmt: skip
        return 2
    try:
        folders = [folder.resolve() for folder in args.config_dir]
        comparison = compare(*(load(results, s, folders) for s in (args.sweep_a, args.sweep_b)))
    except DamagedSide as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except CompareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text, code = document(comparison, factor, args.looks)
    path, text = write(args.report, comparison, text)
    print(text, end="")
    print(f"comparison: {path}")
    if not in_common(comparison):
        print(f"error: {nothing_in_common(comparison)}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader went away (python -m harness report | head)
        sys.exit(reader_gone())
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
