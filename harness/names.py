"""The command line's words as the harness takes them before Hydra reads any: its flags, the
names it allows, the experiments that conf/ and the --config-dir folders offer, and its usage.
The standard library alone: --help, status and compact start without Hydra, pandas or torch."""

import difflib
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import BadInput

HERE = Path(__file__).resolve().parent
# A checkout's conf/ (harness/conf links to it), or the wheel's; a sweep's snapshot of the code
# holds none, and its harness reads the conf/ of the install that pinned it (harness.pinning.boot).
CONF = (HERE / "conf").resolve()
if not CONF.is_dir() and os.environ.get("HARNESS_CONF"):
    CONF = Path(os.environ["HARNESS_CONF"])


@dataclass(frozen=True)
class Key:
    """One of the harness's own keys (conf/config.yaml holds its default): whether it decides a
    point's answer (its config_hash: harness.planning.experiment.keyed_config), whether a
    resume may set it, whether `again` sets it itself (in place of the sweep's own), and who
    gives it (False: the harness, for every job; the user never does)."""

    name: str
    decides: bool = False
    resume: bool = False
    again: bool = False
    user: bool = True


# Every key of the harness, declared once. threads decides no config_hash: the count a point
# ran with is its kind of machine's (harness.reuse).
KEYS = (
    Key("out", resume=True, again=True),
    Key("resume", resume=True, again=True),
    Key("wait", resume=True, again=True),
    Key("tag"),
    Key("seed", decides=True),
    Key("threads"),
    Key("max_points"),
    Key("fail_fast"),
    Key("check"),
    Key("stream_rows"),
    Key("stream_s"),
    Key("checkpoint"),  # checkpoint.keep, .best, .mode: harness.tracking.checkpoints
    Key("reuse", resume=True, again=True),
    Key("code", resume=True, again=True),
    Key("code_store", resume=True, again=True),
    Key("again_of", again=True),
    Key("sinks", resume=True, user=False),  # conf/sinks/: chosen as a config group
    Key("search", user=False),  # search.*: harness.searching.search
    Key("sweep_id", user=False),
    Key("job", user=False),
)


@dataclass(frozen=True)
class Keeping:
    """What a point keeps of its checkpoints (the config's `checkpoint`): the latest `keep`, and
    where `best` names a metric, the one at which it was best (`mode`: min or max)."""

    keep: int = 1
    best: str | None = None
    mode: str = "min"


def keeping(setting: dict | None) -> Keeping:
    """The config's `checkpoint` block, checked; BadInput naming the key that is wrong."""
    if setting is not None and not hasattr(setting, "keys"):
        raise BadInput(f"checkpoint must be a mapping of keep, best and mode (checkpoint.keep=3),"
                       f" not {setting!r:.40}")  # fmt: skip
    setting = dict(setting or {})
    for key in setting:
        if key not in ("keep", "best", "mode"):
            raise BadInput(f"checkpoint.{key} is no setting of checkpoint: it takes keep, best "
                           f"and mode{closest(key, ('keep', 'best', 'mode'))}")  # fmt: skip
    keep, best, mode = setting.get("keep", 1), setting.get("best"), setting.get("mode", "min")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise BadInput(f"checkpoint.keep must be a whole number of checkpoints, 1 or more, got "
                       f"{keep!r}")  # fmt: skip
    if best is not None and (not isinstance(best, str) or not best):
        raise BadInput(f"checkpoint.best must be a metric's name (a column of the logged rows) "
                       f"or null, got {best!r}")  # fmt: skip
    if mode not in ("min", "max"):
        raise BadInput(f"checkpoint.mode must be min or max, got {mode!r}")
    return Keeping(keep, best, mode)


USER_KEYS = tuple(key.name for key in KEYS if key.user)  # what --help lists
HARNESS_KEYS = tuple(key.name for key in KEYS)
SET_BY_HARNESS = ("out", "sweep_id", "job")  # given to every job by the harness
NOT_IN_KEY = tuple(key.name for key in KEYS if not key.decides)
RESUME_SETTINGS = tuple(key.name for key in KEYS if key.resume)
AGAIN_REPLACED = tuple(key.name for key in KEYS if key.again)
# The experiment block's keys that decide no answer: what the report makes of its rows, what
# checks them (history: the report's --check judges the history too), how a launcher runs them,
# and the environment variables and inputs it names
# (their values and digests are reuse's key of their own: harness.reuse).
NOT_IN_KEY_OF_EXPERIMENT = ("table", "plots", "claims", "derive", "report", "search", "check",
                            "resources", "fresh", "environment", "inputs", "history")  # fmt: skip
# What an experiment's name or a sweep id may be: it becomes a folder name and part of a glob.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
PLAIN = re.compile(r"[\w./+-]+")  # a string Hydra may read unquoted (if it reads it as a string)


def available_experiments(config_dirs: list[Path] = ()) -> list[str]:
    """The experiments in conf/experiment/ and in each config dir's experiment/."""
    folders = [CONF, *config_dirs]
    return sorted({p.stem for folder in folders for p in (folder / "experiment").glob("*.yaml")})


def experiment_file(experiment: str, config_dirs: list[Path]) -> Path:
    """The experiment's YAML: conf/'s, else the first config dir's that has it."""
    files = [folder / "experiment" / f"{experiment}.yaml" for folder in (CONF, *config_dirs)]
    return next(path for path in files if path.exists())


@dataclass
class Flags:
    """Hydra's flags on the command line, as the harness honours them."""

    config_dirs: list[Path] = field(default_factory=list)  # --config-dir DIR, -cd DIR
    cfg: str | None = None  # --cfg job|hydra|all, -c: print the config, run nothing
    resolve: bool = False  # --resolve: with --cfg, interpolations resolved
    package: str | None = None  # --package KEY, -p: with --cfg, only that node
    info: str | None = None  # --info [TOPIC], -i: Hydra's information, run nothing
    help: bool = False  # --help, -h


CFG = ("job", "hydra", "all")
INFO = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
TAKES_VALUE = {"--config-dir": "config_dir", "-cd": "config_dir", "--cfg": "cfg", "-c": "cfg",
               "--package": "package", "-p": "package"}  # fmt: skip


def split_flags(argv: list[str], recorded: bool = False) -> tuple[list[str], Flags]:
    """Hydra's flags (--config-dir folders with experiment/NAME.yaml files of the user's own,
    searched after conf/; --cfg, --resolve, --package, --info, --help; -m/--multirun, which
    changes nothing: every run is a sweep), and the other arguments, the overrides. `recorded`:
    a sweep's command as its manifest records it, whose --config-dir folders are not looked for
    (given relative to a folder it ran in; the manifest's config_dirs has them whole)."""
    rest, flags, args = [], Flags(), list(argv)
    while args:
        arg = args.pop(0)
        name, equals, value = arg.partition("=")
        if not arg.startswith("-"):
            rest.append(arg)
        elif name in TAKES_VALUE:
            value = value if equals else (args.pop(0) if args else "")
            if not (recorded and TAKES_VALUE[name] == "config_dir"):
                _set_flag(flags, TAKES_VALUE[name], name, value)
        elif arg in ("--info", "-i"):
            flags.info = args.pop(0) if args and args[0] in INFO else "all"
        elif arg in ("-m", "--multirun"):
            continue
        elif arg in ("--resolve", "-h", "--help"):
            setattr(flags, "resolve" if arg == "--resolve" else "help", True)
        else:
            raise BadInput(
                f"unknown option {arg}: the harness takes --config-dir, --cfg, --resolve, "
                "--package, --info, --help and -m"
            )
    return rest, flags


def _set_flag(flags: Flags, key: str, name: str, value: str) -> None:
    if key == "config_dir":
        folder = Path(value).expanduser().resolve()
        if not value or not folder.is_dir():
            raise BadInput(f"{name} takes a folder, got {value!r}")
        flags.config_dirs.append(folder)
    elif key == "cfg":
        if value not in CFG:
            raise BadInput(f"{name} takes one of {', '.join(CFG)}, got {value!r}")
        flags.cfg = value
    elif not value:
        raise BadInput(f"{name} takes a config key, such as hydra.launcher")
    else:
        flags.package = value


def check_name(what: str, name: str) -> str:
    """`name` if it can be a folder name and a glob's literal part; one line otherwise."""
    if not NAME.fullmatch(name):
        raise BadInput(
            f"{what} {name!r} is not a plain name: letters, digits, '_', '-', '+' and '.', "
            "starting with a letter or digit"
        )
    return name


def point_words(point: dict) -> str:
    """A point by its varying parameters, as a history and its bisection say it: x=2 y=a, or
    "its one point" where none varies."""
    return " ".join(f"{k}={v}" for k, v in point.items()) or "its one point"


def setting(name: str, value) -> str:
    """A parameter as on the command line, a float to 4 significant digits: lr=0.006466 (the
    row keeps the whole value)."""
    return f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"


def closest(name: str, names) -> str:
    """ "; did you mean gflops?" for a name that is not among `names` but near some (up to
    three, the nearest first), else ""."""
    near = nearest(name, names)
    return f"; did you mean {' or '.join(near)}?" if near else ""


def nearest(name: str, names) -> list[str]:
    """The names of `names` near `name` (up to three, the nearest first), each once: a key and a
    parameter of the same name are one suggestion."""
    return difflib.get_close_matches(name, list(dict.fromkeys(map(str, names))), n=3, cutoff=0.6)


def typo_of(name: str, names) -> str | None:
    """The one name of `names` that `name` is a typo of: a letter left out, added, changed or
    two swapped (lenght, scal, dtpye), the longer of the two at least 3 letters, and not a
    plural of the other (step and steps are often a column and a parameter); None where there
    is none or several. Stricter than closest(): what it finds is refused, and a metric of
    one's own may well be near a parameter's name (value, scale)."""
    found = [n for n in dict.fromkeys(map(str, names)) if n != name and _one_edit(name, n)
             and name.rstrip("s") != n.rstrip("s")]  # fmt: skip
    return found[0] if len(found) == 1 and max(len(name), len(found[0])) >= 3 else None


def _one_edit(a: str, b: str) -> bool:
    """Whether b is a one letter left out of, added to, changed in or swapped in a."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        differ = [i for i in range(len(a)) if a[i] != b[i]]
        swapped = len(differ) == 2 and differ[1] == differ[0] + 1 and a[differ[0]] == b[
            differ[1]] and a[differ[1]] == b[differ[0]]  # fmt: skip
        return len(differ) == 1 or swapped
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def refuse_typo(what: str, name: str, names) -> None:
    """ValueError where `name` is a typo of one of `names` (typo_of): "WHAT names 'lenght', no
    parameter; did you mean length?"."""
    typo = typo_of(name, names)
    if typo:
        raise ValueError(f"{what} names {name!r}, no parameter; did you mean {typo}?")


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


USAGE = """usage: python -m harness [--config-dir DIR] +experiment=NAME [key=value | key=a,b,c ...]
                         [resume=SWEEP_ID]
       python -m harness [--config-dir DIR] +experiment=NAME --help
       python -m harness [--config-dir DIR] +experiment=NAME ... --cfg job|hydra|all
                         [--resolve] [--package KEY]
       python -m harness [--config-dir DIR] +experiment=NAME ... --info [TOPIC]
       python -m harness status SWEEP_ID [out=DIR] [+experiment=NAME]
       python -m harness compact SWEEP_ID [out=DIR] [+experiment=NAME]
       python -m harness code SWEEP_ID [OTHER_SWEEP_ID] [out=DIR] [code_store=DIR]
       python -m harness again SWEEP_A SWEEP_B [times=N] [most=N] [factor=F] [budget_s=S]
                         [out=DIR] [code_store=DIR]
       python -m harness report [--check] [--sweep ID ...] [--all] [--watch] [--out DIR]
       python -m harness report compare SWEEP_A SWEEP_B [--fail-on-regression FACTOR]
       python -m harness history EXPERIMENT [METRIC ...] [out=DIR] [--check] [--confirm]
       python -m harness note NOTE.md [--check] [--accept] [--config-dir DIR] [out=DIR]

Runs the experiment's grid (its hydra.sweeper.params; key=a,b,c on the command line replaces a
key's values, key=value fixes it) and writes one Parquet row per measurement under
outputs/results. hydra/launcher=local runs points in parallel here, hydra/launcher=slurm as
SLURM job arrays (wait=false: submit and return). compact merges a finished sweep's job files
into one Parquet file. code lists the files of the code a sweep pinned, or diffs two sweeps'
code; again runs sweeps again, each on its own code, in turns, until each has N sweeps (3), and
of two sweeps it is the timing gate: it compares them, adding one of each while a timing is not
decided, at most `most` a side (8), and exits as the comparison (0, 1 or 3). report writes
outputs/report/REPORT.md and its page from the store (report --help: its options). history
finds the steps in each metric over an experiment's sweeps, and the two sweeps and codes each
lies between (--confirm: both rerun by the gate). note writes a note of your own with the
store's values of its bindings ({{{{ EXPERIMENT METRIC REDUCER -> VALUE }}}}; --check: exit 1
where one moved). SWEEP_ID may be last: the newest sweep (of +experiment=NAME, if given).
--config-dir DIR also finds experiments of your own in DIR/experiment/NAME.yaml. --help with
+experiment=NAME lists its parameters; --cfg prints the config of the sweep's first point and
the grid, --info Hydra's information (TOPIC: all, config, defaults, defaults-tree, plugins,
searchpath); neither runs anything. -m is accepted: every run is a sweep. Experiments:
{experiments}"""


def usage(config_dirs: list[Path]) -> str:
    return USAGE.format(experiments=", ".join(available_experiments(config_dirs)))


def override(key: str, text: str) -> str:
    """The override line that sets `key` to the string `text`, whatever it holds (spaces, "=",
    quotes, backslashes, "${"): quoted and escaped for Hydra's parser and OmegaConf's
    interpolation where Hydra would read it otherwise."""
    line = f"{key}={text}"
    return line if PLAIN.fullmatch(text) and reads_as(line) == text else f"{key}={quote(text)}"


def quote(text: str) -> str:
    """`text` as a quoted Hydra value that reads back as exactly `text`: an interpolation's
    "${" escaped for OmegaConf, then quotes and the backslashes before them for Hydra."""
    text = re.sub(r"(\\*)\$\{", lambda m: m[1] * 2 + "\\${", text)
    text = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m[1] * 2, text)
    return f"'{text}'"


@functools.lru_cache(maxsize=256)
def reads_as(line: str):
    """The value Hydra reads from an override line; None where it cannot parse it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        (parsed,) = OverridesParser.create().parse_overrides([line])
    except OverrideParseException:
        return None
    return parsed.value()
