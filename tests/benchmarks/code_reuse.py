"""Reuse of answered points (harness.reuse) and the code digest (harness.pinning.codestore),
measured through the real commands in a scratch directory with a code store of its own
(XDG_CACHE_HOME):

1. exp014_tiled's seeded grid (`python -m harness +experiment=exp014_tiled`) run twice in a new
   out folder: the first run computes its 9 points, the second should reuse every one (checked
   from its output and the store: points computed, rows with reused_from, claims that PASS).
   Wall times of both, and the sweeps' own "in X s" from their summary lines, with the ratios
   second/first; the pair is run REPEATS times, each in a new out folder (medians). The code
   store is shared: the first pair's first run also pins the code into it.
2. Widening: `length=128,512`, then `length=128,512,1024` in the same out folder: how many of
   the wider sweep's points were computed and how many reused (the store's reused_from).
3. Start cost on a big store: SWEEPS sweeps of EACH trivial points (sweep_scale's way: a real
   sweep, its folder copied under older ids), then `... length=128 block=64 out=big` against
   `out=empty` (a folder with nothing in it at first), interleaved. The first run in each folder
   computes its point; the later REPEATS runs reuse it (medians). The copies have no answer
   records (_answers/), which is what reuse reads: this times everything else a command does
   with a big store, and a lookup in a folder of one answer. Then, in this process, reuse.find
   where the point's _answers/CONFIG_HASH/ holds SWEEPS-1 more answers of other code: the
   newest matching (read first), and none matching (every record read).
4. The digest: harness.pinning.codestore.collect of exp014_tiled's experiment block in this process,
   cold (an empty code store: no stat cache) and warm (median of WARM calls), in ms, with the
   number of files and bytes it hashes.
5. Planning a sweep of a package of 2,000 files (the most an experiment's folder may hold): a
   one-point sweep of it, nothing reused, each command in a new out folder and its code store
   warm (its first run, left out, kept the package), side by side with the harness of each
   checkout AGAINST names (AGAINST=DIR, as harness_overhead.py), REPEATS times each.

No assertion on time; a check that fails (a point computed that should have been reused, a
claim that does not PASS) is printed, not raised.
Run: python tests/benchmarks/code_reuse.py [REPEATS] [SWEEPS] [EACH] [WARM]
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweep_scale  # noqa: E402
from harness_overhead import harnesses, side_by_side, wall_time  # noqa: E402

from harness import reuse, store  # noqa: E402
from harness.pinning import codestore  # noqa: E402

EXPERIMENT = "exp014_tiled"
SUMMARY = re.compile(r"^sweep (\S+): (\d+) points: (.*); in ([\d.]+) s; rows in ", re.M)
POINT = re.compile(r"^\[\d+/\d+\] job (\d+) [^:]*: (\w+)( reused from \S+)?", re.M)


class Sweep:
    """One `python -m harness` command's outcome, from its output and the store."""

    def __init__(self, scratch: Path, out: str, overrides: list[str]):
        command = [sys.executable, "-m", "harness", f"+experiment={EXPERIMENT}", *overrides]
        command.append(f"out={out}")
        started = time.perf_counter()
        done = subprocess.run(command, cwd=scratch, capture_output=True, text=True)
        self.wall = time.perf_counter() - started
        if done.returncode or not SUMMARY.search(done.stdout):
            sys.exit(f"{' '.join(command[1:])} ended with {done.returncode}:\n"
                     f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")  # fmt: skip
        found = SUMMARY.search(done.stdout)
        self.id, self.points, self.counts = found[1], int(found[2]), found[3]
        self.own = float(found[4])  # the sweep's own "in X s" (one decimal)
        lines = POINT.findall(done.stdout)
        self.said_reused = sum(1 for _, _, reused in lines if reused)
        self.said_computed = len(lines) - self.said_reused
        claims = re.findall(r"^claim (\w+):", done.stdout, re.M)
        self.claims, self.passed = len(claims), claims.count("PASS")
        rows = store.read(scratch / out / "results", EXPERIMENT, self.id)
        reused = rows["reused_from"].notna() if "reused_from" in rows else rows["job"] < 0
        self.rows, self.rows_reused = len(rows), int(reused.sum())
        self.jobs_reused = rows[reused]["job"].nunique()
        self.jobs_computed = rows[~reused]["job"].nunique()
        self.config_hashes = sorted(rows["config_hash"].unique())
        self.codes = sorted(rows["code_digest"].dropna().unique())  # the code its rows name

    def checks(self) -> str:
        return (f"{self.counts}; output: {self.said_computed} computed, {self.said_reused} "
                f"reused; store: {self.rows_reused} of {self.rows} rows have reused_from; "
                f"claims {self.passed} of {self.claims} PASS; "
                f"code {','.join(c[:8] for c in self.codes)}")  # fmt: skip


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], unit: str = "s", digits: int = 2) -> str:
    return (f"median {median(values):.{digits}f} {unit} ({min(values):.{digits}f} to "
            f"{max(values):.{digits}f}, {len(values)} runs)")  # fmt: skip


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def seeded_grid(scratch: Path, repeats: int) -> dict:
    print(f"1. {EXPERIMENT}'s seeded grid, run twice in a new out folder, {repeats} times",
          flush=True)  # fmt: skip
    walls, owns, ok, changed = [], [], True, 0
    for i in range(repeats):
        first = Sweep(scratch, f"grid-{i}", [])
        second = Sweep(scratch, f"grid-{i}", [])
        all_reused = (second.said_computed == 0 and second.jobs_computed == 0
                      and second.rows_reused == second.rows > 0)  # fmt: skip
        passed = second.claims > 0 and second.passed == second.claims
        if first.codes != second.codes:  # the project's source was edited between the two
            note, changed = "  <-- the code changed between the runs: left out", changed + 1
            ok = ok and passed and second.rows_reused == 0  # nothing may be reused then
        else:
            note = "" if all_reused and passed else "  <-- NOT ALL REUSED/PASS"
            ok = ok and all_reused and passed and first.rows_reused == 0
            walls.append((first.wall, second.wall))
            owns.append((first.own, second.own))
        print(f"  pair {i + 1}: first  {first.wall:5.2f} s wall, in {first.own:.1f} s; "
              f"{first.checks()}")  # fmt: skip
        print(f"          second {second.wall:5.2f} s wall, in {second.own:.1f} s; "
              f"{second.checks()}{note}")  # fmt: skip
    if changed:
        print(
            f"  {changed} of {repeats} pairs left out: someone edited the project's source "
            "while they ran (a new code_digest), so their second run rightly reused nothing"
        )
    if not walls:
        sys.exit("every pair's code changed between its runs: nothing to measure; run it again")
    firsts, seconds = [w[0] for w in walls], [w[1] for w in walls]
    own_firsts, own_seconds = [o[0] for o in owns], [o[1] for o in owns]
    wall_ratio = [ratio(b, a) for a, b in walls]
    own_ratio = [ratio(b, a) for a, b in owns]
    print(f"  first run, wall:          {spread(firsts)}")
    print(f"  second run, wall:         {spread(seconds)}")
    print(f"  second/first, wall:       {spread(wall_ratio, '', 2)}")
    print(f"  first sweep's own time:   {spread(own_firsts, 's', 1)}")
    print(f"  second sweep's own time:  {spread(own_seconds, 's', 1)}")
    print(f"  second/first, own time:   {spread(own_ratio, '', 2)} (from one-decimal figures)")
    return {"first": median(firsts), "second": median(seconds), "ratio": median(wall_ratio),
            "own_first": median(own_firsts), "own_second": median(own_seconds),
            "own_ratio": median(own_ratio), "ok": ok}  # fmt: skip


def widening(scratch: Path) -> dict:
    print("2. widening: length=128,512, then length=128,512,1024 in the same out folder",
          flush=True)  # fmt: skip
    narrow = Sweep(scratch, "widen", ["length=128,512"])
    wide = Sweep(scratch, "widen", ["length=128,512,1024"])
    print(f"  length=128,512:      {narrow.points} points, {narrow.wall:.2f} s wall, "
          f"in {narrow.own:.1f} s; {narrow.checks()}")  # fmt: skip
    print(f"  length=128,512,1024: {wide.points} points, {wide.wall:.2f} s wall, "
          f"in {wide.own:.1f} s; {wide.checks()}")  # fmt: skip
    print(f"  the wider sweep (store): {wide.jobs_computed} points computed, "
          f"{wide.jobs_reused} reused")  # fmt: skip
    if narrow.codes != wide.codes:
        print("  (the code changed between the two sweeps: the wider one may reuse nothing)")
    return {"points": wide.points, "computed": wide.jobs_computed, "reused": wide.jobs_reused}


def big_store(scratch: Path, sweeps: int, each: int, repeats: int) -> dict:
    print(f"3. start cost on a store of {sweeps:,} sweeps and {sweeps * each:,} points",
          flush=True)  # fmt: skip
    started = time.perf_counter()
    sweep_scale.run([*sweep_scale.trivial(each), "out=big"], scratch)
    swept = time.perf_counter() - started
    results = scratch / "big" / "results"
    (sweep,) = store.sweeps(results, EXPERIMENT)
    started = time.perf_counter()
    sweep_scale.copies(results, sweep, sweeps - 1)
    copied = time.perf_counter() - started
    found = store.sweeps(results, EXPERIMENT)
    answers = results / f"experiment={EXPERIMENT}" / "_answers"
    print(f"  built in {swept + copied:.1f} s (a sweep of {each} points {swept:.1f} s, "
          f"{sweeps - 1} copies {copied:.1f} s): {len(found):,} sweeps, "
          f"{len(list(answers.iterdir()))} answer folders")  # fmt: skip
    (scratch / "empty").mkdir()
    point = ["length=128", "block=64"]
    times: dict[str, list[Sweep]] = {"big": [], "empty": []}
    for _ in range(repeats + 1):  # the first run in each folder computes the point
        for out in times:
            times[out].append(Sweep(scratch, out, point))
    reused = {}  # the later runs that did reuse their point (the code did not change)
    for out, runs in times.items():
        reused[out] = [r.wall for r in runs[1:] if r.jobs_computed == 0] or [float("nan")]
        how = [f"{r.jobs_computed} computed/{r.jobs_reused} reused, code "
               f"{','.join(c[:8] for c in r.codes)}" for r in runs]  # fmt: skip
        print(f"  out={out:5}: first run {runs[0].wall:.2f} s; later runs that reused "
              f"{spread(reused[out])}; ({'; '.join(how)})")  # fmt: skip
    first = times["big"][0].wall - times["empty"][0].wall
    later = median(reused["big"]) - median(reused["empty"])
    print(f"  planning with reuse on a store of {len(found):,} sweeps adds {later:+.2f} s "
          f"(point reused; {first:+.2f} s on the first run, point computed)")  # fmt: skip
    if any(r.jobs_computed for runs in times.values() for r in runs[1:]):
        print("  (a later run computed its point, left out above: the code changed while these "
              "ran)")  # fmt: skip
    lookup = stale_lookup(results, times["big"][-1], sweeps - 1)
    return {"sweeps": len(found), "added": later, "added_first": first, "lookup": lookup}


def stale_lookup(results: Path, sweep: "Sweep", stale: int) -> dict:
    """reuse.find in this process, where the point's _answers/CONFIG_HASH/ holds `stale` more
    answers of other code (a copy of its real record, another code_digest, an older sweep):
    the worst case, a lookup that reads every record and finds none."""
    (config_hash,) = sweep.config_hashes
    folder = results / f"experiment={EXPERIMENT}" / reuse.ANSWERS / config_hash
    real = sorted(folder.iterdir())
    entry = json.loads(real[0].read_text())
    for i in range(stale):
        old = f"20190101-000000-{i:04x}"
        other = {**entry, "sweep": old, "code_digest": f"{i:016x}"}
        (folder / f"{old}.0.json").write_text(json.dumps(other, indent=2) + "\n")
    key = {name: entry.get(name) for name in ("code_digest", *reuse.KIND, "inputs")}
    timed = {}
    for name, code in (("matching", entry["code_digest"]), ("none matching", "0" * 16)):
        seconds = []
        for _ in range(5):
            started = time.perf_counter()
            reuse.find(store.SweepPaths(results, EXPERIMENT, "20991231-000000-0000"),
                       config_hash, {**key, "code_digest": code}, "all")  # fmt: skip
            seconds.append((time.perf_counter() - started) * 1000)
        timed[name] = median(seconds)
        print(f"  reuse.find among {len(real) + stale:,} answers of one config, {name}: "
              f"{spread(seconds, 'ms', 1)}")  # fmt: skip
    return timed


def digest(scratch: Path, warm: int) -> dict:
    config = yaml.safe_load((ROOT / "conf" / "experiment" / f"{EXPERIMENT}.yaml").read_text())
    node = {key: config["experiment"][key] for key in ("name", "run")}
    print(f"4. codestore.collect({node}) in this process", flush=True)
    out, code_store = scratch / "digest-out", scratch / "digest-store"
    out.mkdir()
    codestore.private_store(code_store)  # as a sweep makes it: an empty one
    started = time.perf_counter()
    code = codestore.collect(node, out, code_store)
    cold = (time.perf_counter() - started) * 1000
    paths = [path for bundle in code.bundles for path in bundle.files.values()]
    size = sum(path.stat().st_size for path in paths)
    warms = []
    for _ in range(warm):
        started = time.perf_counter()
        again = codestore.collect(node, out, code_store)
        warms.append((time.perf_counter() - started) * 1000)
        assert again.digest == code.digest, "the digest changed between calls"
    cache = code_store / codestore.STAT_CACHE
    print(
        f"  {len(code.bundles)} bundle(s), {len(paths)} files, {size / 1024:,.0f} KiB hashed; "
        f"digest {code.digest[:16]}; stat cache {cache.stat().st_size / 1024:,.0f} KiB"
    )
    print(f"  cold (empty stat cache): {cold:.1f} ms")
    print(f"  warm: {spread(warms, 'ms', 1)}")
    return {"files": len(paths), "bytes": size, "cold": cold, "warm": median(warms)}


BIG_PACKAGE = 2000  # files: codestore.MAX_FILES


def big_package(scratch: Path, repeats: int) -> dict:
    print(f"5. a one-point sweep of a package of {BIG_PACKAGE:,} files, side by side", flush=True)
    root = scratch / "bigpkg-root"
    package = root / "bigpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "kernel.py").write_text("def run(x: int = 1):\n    return [{'v': x}]\n")
    for n in range(BIG_PACKAGE - 2):
        (package / f"module_{n:04d}.py").write_text(f"VALUE = {n}\n" + "# a line\n" * 20)
    conf = scratch / "bigpkg-conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "bigpkg.yaml").write_text(
        "# @package _global_\nexperiment:\n  name: bigpkg\n  run: bigpkg.kernel.run\n"
    )
    arguments = ["--config-dir", str(conf), "+experiment=bigpkg", "+x=1", "reuse=false"]
    commands = harnesses(arguments, [str(root)])
    for command in commands.values():  # each code store keeps the package: warm from now on
        wall_time(command)
    medians = dict(zip(commands, side_by_side(commands, repeats), strict=True))
    this = medians.pop("python -m harness")
    for name, median_s in medians.items():
        print(f"  python -m harness - {name}: {(this - median_s) * 1000:+.0f} ms a command")
    return {"this": this, **medians}


def main(repeats: int, sweeps: int, each: int, warm: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        os.environ["XDG_CACHE_HOME"] = str(scratch / "cache")  # every command's code store
        print(f"in {scratch} (code store {codestore.default_store()}); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
        began = time.perf_counter()
        grid = seeded_grid(scratch, repeats)
        wide = widening(scratch)
        big = big_store(scratch, sweeps, each, repeats)
        code = digest(scratch, warm)
        package = big_package(scratch, repeats)
        total = time.perf_counter() - began
    print("summary:")
    print(f"  seeded grid: first run {grid['first']:.2f} s, rerun (all reused) "
          f"{grid['second']:.2f} s wall = {grid['ratio']:.2f} of it; the sweeps' own time "
          f"{grid['own_first']:.1f} s -> {grid['own_second']:.1f} s = {grid['own_ratio']:.2f}; "
          f"checks {'passed' if grid['ok'] else 'FAILED'}")  # fmt: skip
    print(f"  widening to {wide['points']} points: {wide['computed']} computed, "
          f"{wide['reused']} reused")  # fmt: skip
    print(f"  a store of {big['sweeps']:,} sweeps adds {big['added']:+.2f} s to a one-point "
          f"command ({big['added_first']:+.2f} s on its first run); a lookup through "
          f"{big['sweeps']:,} answers of one config: {big['lookup']['none matching']:.0f} ms "
          f"when none match, {big['lookup']['matching']:.1f} ms when the newest does")  # fmt: skip
    print(f"  the code digest: {code['files']} files, {code['bytes'] / 1024:,.0f} KiB; "
          f"{code['cold']:.0f} ms cold, {code['warm']:.1f} ms warm")  # fmt: skip
    others = ", ".join(f"{name} {s:.2f} s" for name, s in package.items() if name != "this")
    print(f"  a one-point sweep of a {BIG_PACKAGE:,}-file package: {package['this']:.2f} s"
          f"{'; ' + others if others else ''}")  # fmt: skip
    print(f"  this script: {total:.0f} s; load average at its end {os.getloadavg()[0]:.1f} "
          f"(other processes' load makes every figure above noisier)")  # fmt: skip


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    main(*(arguments + [3, 1_000, 100, 20][len(arguments) :]))
