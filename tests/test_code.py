"""A sweep pins the code it runs (harness/pinning/codestore.py, harness/pinning/boot.py) and reuses
the answers the store holds for the same config, code and kind of machine
(harness/reuse/): real files, edited for real, in a user's folder of their own, and the
store read back."""

import errno
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from commands import call_command
from own import OwnExperiment

from harness import provenance, store
from harness.command import sweep as sweep_command
from harness.names import HERE
from harness.pinning import codestore, sources
from harness.planning.plan import SweepExists

ROOT = HERE.parent

KERNEL = '''import pathlib
import time

VALUE = {value}


def run(x: int = 1, gate: str = "", seed: int = 0) -> list[dict]:
    """VALUE times x; x=-1 fails; with a gate, x=1 says it started and waits to be let go."""
    if x == -1:
        raise ValueError("x=-1 fails")
    if gate and x == 1:
        pathlib.Path(gate, "started").touch()
        deadline = time.monotonic() + 120
        while not pathlib.Path(gate, "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return [{{"value": VALUE * x}}]
'''


@pytest.fixture
def own(harness, tmp_path):
    """An experiment of one's own (--config-dir mine, its package minepkg on PYTHONPATH), run
    with a code store of the test's own; own.edit(value) rewrites its kernel."""
    mine = OwnExperiment(tmp_path / "mine", "own", "minepkg",
                         "hydra:\n  sweeper:\n    params:\n      x: 1,2\n")  # fmt: skip
    folder, codes = mine.folder, tmp_path / "codes"

    def edit(value) -> None:
        mine.edit(KERNEL.format(value=value))

    def run(*args: str, code_store=codes):
        return harness(*mine.args, f"code_store={code_store}", *args, env=mine.env)

    def start(*args: str):
        return harness.start(*mine.args, f"code_store={codes}", *args, env=mine.env)

    edit(1)
    run.edit, run.start, run.folder, run.codes, run.harness = edit, start, folder, codes, harness
    run.mine = mine
    return run


def sweep_rows(harness, sweep: str):
    return store.read(harness.results, "own", sweep).sort_values("job").reset_index(drop=True)


def reused(rows) -> list:
    """Each row's reused_from (None where it ran; the column is absent where none was reused)."""
    column = rows["reused_from"] if "reused_from" in rows else [None] * len(rows)
    return [value if isinstance(value, str) else None for value in column]


def newest(harness) -> str:
    return store.newest_sweep(harness.results, "own")


def test_a_sweep_again_copies_nothing_unless_it_asks(own):
    """Reuse is on request: the same grid again, with the default settings, computes every
    point."""
    assert own().returncode == 0
    again = own()
    assert again.returncode == 0 and "reused" not in again.stdout
    assert reused(sweep_rows(own.harness, newest(own.harness))) == [None, None]


def test_a_sweep_again_reuses_every_answer_and_a_wider_grid_runs_only_its_new_points(own):
    first = own("reuse=true")
    assert first.returncode == 0, first.stderr
    one = newest(own.harness)
    again = own("x=1,2,3", "reuse=true")
    assert again.returncode == 0, again.stderr
    two = newest(own.harness)
    assert f"2 points reused (not run again) from sweep {one}" in again.stdout
    assert f"ok reused from {one}/0" in again.stdout
    rows, before = sweep_rows(own.harness, two), sweep_rows(own.harness, one)
    assert rows["value"].tolist() == [1, 2, 3]
    assert reused(rows) == [f"{one}/0", f"{one}/1", None], "x=3 ran"
    assert rows["started_at"][:2].tolist() == before["started_at"].tolist(), "their own times"
    assert rows["code_digest"].nunique() == 1 and rows["code_digest"][0] == before["code_digest"][0]
    status = own.harness("status", two)
    assert f"reused from {one}/1" in status.stdout and "2 points reused" in status.stdout

    afresh = own("x=1,2,3", "reuse=false")
    assert afresh.returncode == 0 and "reused" not in afresh.stdout
    assert reused(sweep_rows(own.harness, newest(own.harness))) == [None] * 3


def test_an_edit_between_two_sweeps_reuses_nothing_and_the_code_command_shows_it(own):
    assert own().returncode == 0
    one = newest(own.harness)
    own.edit(7)
    assert own().returncode == 0
    two = newest(own.harness)
    rows = sweep_rows(own.harness, two)
    assert rows["value"].tolist() == [7, 14] and reused(rows) == [None, None]
    digests = {sweep_rows(own.harness, s)["code_digest"][0] for s in (one, two)}
    assert len(digests) == 2 and None not in digests

    diff = own.harness("code", one, two, f"code_store={own.codes}")
    assert diff.returncode == 0, diff.stderr
    assert "1 files differ: minepkg/kernel.py" in diff.stdout
    assert "-VALUE = 1\n+VALUE = 7\n" in diff.stdout
    listing = own.harness("code", two, f"code_store={own.codes}")
    assert "minepkg/kernel.py" in listing.stdout and "harness/running/job.py" in listing.stdout


def test_failed_points_are_never_reused(own):
    assert own("x=-1,1", "reuse=true").returncode == 1
    one = newest(own.harness)
    again = own("x=-1,1", "reuse=true")
    rows = sweep_rows(own.harness, newest(own.harness))
    assert rows["status"].tolist() == ["failed", "ok"]
    assert reused(rows) == [None, f"{one}/1"]
    assert "1 points reused" in again.stdout


def test_a_snapshot_changed_or_gone_is_one_line_and_runs_nothing(own):
    """The sweep's snapshot edited, then removed: its resume is one line (exit 2) each time,
    and no point runs on code that does not hash to the sweep's digest."""
    assert own("x=-1,1").returncode == 1
    sweep = newest(own.harness)
    digest = store.read_manifest(store.SweepPaths(own.harness.results, "own", sweep))["code_digest"]
    bundle = next(p for p in own.codes.glob("bundle-*") if (p / "minepkg").is_dir())
    kernel = bundle / "minepkg" / "kernel.py"
    kernel.chmod(0o644)
    kernel.write_text(KERNEL.format(value=99).replace("x == -1", "x == -5"))
    changed = own(f"resume={sweep}")
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert changed.stderr.count("\n") == 1 and "was changed or is gone" in changed.stderr
    assert digest in changed.stderr
    rows = sweep_rows(own.harness, sweep)
    assert rows["status"].tolist() == ["failed", "ok"], "nothing ran"
    anew = own("x=2,3")  # a new sweep of the same code keeps its snapshot anew, from the tree
    assert anew.returncode == 0 and "value=2" in anew.stdout, anew.stdout + anew.stderr
    assert "x == -1" in kernel.read_text()
    kernel.unlink()
    (bundle / "minepkg" / "__init__.py").unlink()
    gone = own(f"resume={sweep}", "hydra/launcher=local")
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr


@pytest.mark.parametrize("case", ["store-unwritable", "link-loop", "too-much-source"])
def test_what_cannot_be_pinned_is_one_line_and_leaves_no_sweep(own, monkeypatch, case):
    codes = own.codes
    if case == "store-unwritable":
        blocker = own.folder.parent / "a-file"
        blocker.write_text("")
        codes = blocker / "codes"
        said = "cannot keep the sweep's code in the code store"
    elif case == "link-loop":
        (own.folder / "minepkg" / "again").symlink_to(own.folder / "minepkg")
        said = "a link loop"
    else:
        monkeypatch.setattr(sources, "MAX_FILES", 5)
        for n in range(8):
            (own.folder / "minepkg" / f"extra{n}.py").write_text("#" * (100 * n))
        said = "holds more files than an experiment's folder should"
    result = own(code_store=codes)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert said in result.stderr
    assert not list(own.harness.results.glob("experiment=own/sweep=*"))


@pytest.mark.process
def test_an_edit_while_warm_workers_run_a_sweep_changes_none_of_its_rows(own, tmp_path):
    """Point x=1 holds on its worker; the kernel is edited; the worker's next points (and a
    fresh process's) still run the code the sweep planned, and say so."""
    gate = tmp_path / "gate"
    gate.mkdir()
    sweeping = own.start("x=1,2,3", f"+gate={gate}", "hydra/launcher=local",
                         "hydra.launcher.max_parallel=1")  # fmt: skip
    deadline = time.monotonic() + 120
    while not (gate / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    own.edit(5)
    (gate / "go").touch()
    output, _ = sweeping.communicate(timeout=180)
    assert sweeping.returncode == 0, output
    rows = sweep_rows(own.harness, newest(own.harness))
    assert rows["value"].tolist() == [1, 2, 3]
    planned = store.read_manifest(
        store.SweepPaths(own.harness.results, "own", newest(own.harness))
    )["code_digest"]
    assert rows["code_digest"].eq(planned).all()


@pytest.mark.process
def test_a_resume_runs_the_sweeps_own_code_and_code_current_runs_this_trees(own):
    """A point that failed under the sweep's code fails again on resume (python -m harness
    runs it from the sweep's snapshot, here where its points run in the command's process),
    and runs on this tree's code with code=current (the same command called in this process),
    whose rows carry the new digest."""
    assert own("x=-1,1").returncode == 1
    sweep = newest(own.harness)
    planned = store.read_manifest(store.SweepPaths(own.harness.results, "own", sweep))[
        "code_digest"
    ]
    text = (own.folder / "minepkg" / "kernel.py").read_text()
    (own.folder / "minepkg" / "kernel.py").write_text(text.replace("x == -1", "x == -5"))
    command = [sys.executable, "-m", "harness", "--config-dir", str(own.folder),
               f"code_store={own.codes}", f"resume={sweep}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(own.folder)}
    again = subprocess.run(command, cwd=own.harness.cwd, env=env, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert again.returncode == 1 and "x=-1 fails" in again.stdout, again.stdout + again.stderr
    assert f"note: the code has changed since sweep {sweep} pinned it" in again.stdout
    assert "code=current runs the code as it is now" in again.stdout
    rows = sweep_rows(own.harness, sweep)
    assert rows["status"].tolist() == ["failed", "ok"] and rows["code_digest"].eq(planned).all()
    current = own.harness(*command[3:], "code=current", env={"PYTHONPATH": str(own.folder)})
    assert current.returncode == 0, current.stdout + current.stderr
    assert "its points run this tree's code" in current.stdout
    rows = sweep_rows(own.harness, sweep)
    assert rows["status"].tolist() == ["ok", "ok"]
    assert rows["code_digest"][0] != planned and rows["code_digest"][1] == planned
    status = own.harness("status", sweep)
    assert "its points ran 2 different codes" in status.stdout


@pytest.mark.process
def test_a_resume_after_the_projects_own_code_changed_starts_again_from_the_snapshot(tmp_path):
    """A copy of the project whose harness and experiments are edited after a sweep (the
    experiment so that it no longer imports): the resume, whose harness is not the snapshot's,
    starts itself again from the snapshot, whose harness reads the copy's conf/ (a snapshot
    holds only Python), and reruns the failed point on the code it was planned with."""
    tree = tmp_path / "tree"
    for top in ("harness", "experiments", "conf"):
        shutil.copytree(ROOT / top, tree / top, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (tree / "experiments" / "fails.py").write_text(KERNEL.format(value=4))
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "experiment" / "fails.yaml").write_text(
        "# @package _global_\nexperiment:\n  name: fails\n  run: experiments.fails.run\n"
    )
    command = [sys.executable, "-m", "harness", "--config-dir", str(tmp_path / "mine"),
               "+experiment=fails", f"code_store={tmp_path / 'codes'}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}

    def harness(*args: str):
        return subprocess.run([*command, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    first = harness("x=1,-1")
    assert first.returncode == 1 and "x=-1 fails" in first.stdout, first.stdout + first.stderr
    results = tmp_path / "outputs" / "results"
    sweep = store.newest_sweep(results, "fails")
    planned = store.read_manifest(store.SweepPaths(results, "fails", sweep))["code_digest"]
    with (tree / "experiments" / "fails.py").open("a") as kernel:
        kernel.write('raise RuntimeError("the edited tree")\n')
    with (tree / "harness" / "command" / "closing.py").open("a") as summary:
        summary.write("# edited\n")
    again = harness(f"resume={sweep}")
    assert again.returncode == 1 and "x=-1 fails" in again.stdout, again.stdout + again.stderr
    assert "the edited tree" not in again.stdout + again.stderr
    rows = store.read(results, "fails", sweep).sort_values("job")
    assert rows["status"].tolist() == ["ok", "failed"] and rows["value"].iloc[0] == 4
    assert rows["code_digest"].eq(planned).all()


@pytest.mark.process
def test_a_sweep_names_the_commit_of_the_repository_that_holds_its_experiments_code(
    own, monkeypatch
):
    """git_commit and git_dirty: none while the experiment's folder lies in no repository; its
    commit once it is one (also where the sweep's first id was taken and it was planned again,
    from the snapshot the first plan entered), dirty with a file not committed; none for a
    folder the repository does not track (a venv's package, an experiment never committed)."""

    def ran() -> pd.DataFrame:
        assert own().returncode == 0
        return sweep_rows(own.harness, newest(own.harness))

    assert ran()[["git_commit", "git_dirty"]].isna().all().all()
    at = own.mine.commit("own experiment")
    recorded, tries = sweep_command.record_plan, []

    def taken_once(sweep) -> None:
        tries.append(sweep.id)
        if len(tries) == 1:
            raise SweepExists(sweep.id)
        recorded(sweep)

    monkeypatch.setattr(sweep_command, "record_plan", taken_once)
    clean = ran()
    assert len(tries) == 2
    monkeypatch.setattr(sweep_command, "record_plan", recorded)
    (own.folder / "NOTES.md").write_text("a file not committed\n")
    dirty = ran()
    assert clean["git_commit"].eq(at).all() and not clean["git_dirty"].any()
    assert dirty["git_commit"].eq(at).all() and dirty["git_dirty"].all()
    (own.folder / ".venv" / "pkg").mkdir(parents=True)
    assert provenance.work_tree(own.folder / ".venv" / "pkg") is None
    assert provenance.work_tree(own.folder / "minepkg") == own.folder.resolve()


@pytest.mark.process
def test_again_runs_each_sweep_anew_on_its_own_code_in_turns(own):
    """Two sweeps of two codes, the kernel edited a third time: again runs each once more on
    the code it pinned, nothing reused, and names the sides to compare."""
    commits = [own.mine.commit("value 1")]
    assert own().returncode == 0
    one = newest(own.harness)
    own.edit(7)
    commits.append(own.mine.commit("value 7"))
    assert own().returncode == 0
    two = newest(own.harness)
    own.edit(9)  # not committed: the reruns still name their originals' commits
    ran = own.harness("again", one, two, "times=2", f"code_store={own.codes}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    made = [s for s in store.sweeps(own.harness.results, "own") if s not in (one, two)]
    assert len(made) == 2
    for old, new, values, commit in ((one, made[0], [1, 2], commits[0]),
                                     (two, made[1], [7, 14], commits[1])):  # fmt: skip
        rows = sweep_rows(own.harness, new)
        assert rows["value"].tolist() == values and reused(rows) == [None, None]
        assert rows["code_digest"].eq(sweep_rows(own.harness, old)["code_digest"][0]).all()
        assert rows["git_commit"].eq(commit).all() and not rows["git_dirty"].any()
    assert f"compare {one},{made[0]} {two},{made[1]}" in ran.stdout
    # Each rerun names its original; the report judges the newest original, the rerun beside it.
    manifests = [
        store.read_manifest(store.SweepPaths(own.harness.results, "own", s))
        for s in (one, two, *made)
    ]
    assert [m.get("again_of") for m in manifests] == [None, None, one, two]
    report = call_command("analysis", cwd=own.harness.cwd)
    assert f"sweeps shown: own {two}" in report.stdout, report.stdout + report.stderr
    text = (own.harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert f"Run again (python -m harness again): `{made[1]}`" in text


def test_the_digest_covers_paths_and_bytes_and_the_stat_cache_sees_an_edit(tmp_path):
    folder = tmp_path / "pkgroot" / "somepkg"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "a.py").write_text("A = 1\n")
    sys.path.insert(0, str(folder.parent))
    try:
        node = {"name": "x", "run": "somepkg.a.run"}
        first = codestore.collect(node, tmp_path / "outputs", tmp_path / "codes")
        assert set(first.bundles[0].files) == {"somepkg/__init__.py", "somepkg/a.py"}
        again = codestore.collect(node, tmp_path / "outputs", tmp_path / "codes")
        assert again.digest == first.digest
        (folder / "a.py").write_text("A = 2\n")
        edited = codestore.collect(node, tmp_path / "outputs", tmp_path / "codes")
        assert edited.digest != first.digest
        (folder / "a.py").rename(folder / "b.py")
        moved = codestore.collect(node, tmp_path / "outputs", tmp_path / "codes")
        assert moved.digest not in (first.digest, edited.digest)
        space = folder.parent / "spacepkg"  # a namespace package: no __init__.py
        space.mkdir()
        (space / "k.py").write_text("def run(): ...\n")
        spaced = codestore.collect({"name": "x", "run": "spacepkg.k.run"}, tmp_path, tmp_path)
        assert set(spaced.bundles[0].files) == {"spacepkg/k.py"}
    finally:
        sys.path.remove(str(folder.parent))
        sys.modules.pop("somepkg", None)
        sys.modules.pop("spacepkg", None)
    assert Path(codestore.default_store()).name == "code"


@pytest.mark.e2e
def test_a_resume_of_a_manifest_that_names_no_code_is_one_line(harness):
    """A manifest edited so that it names no code_digest: the resume says so in one line and
    runs nothing, and code=current is the way on."""
    tiny = ["+experiment=exp014_tiled", "length=16", "block=8", "seed=0", "dtype=float32",
            f"code_store={harness.cwd / 'codes'}"]  # fmt: skip
    assert harness(*tiny).returncode == 0
    sweep = store.newest_sweep(harness.results, "exp014_tiled")
    manifest = store.read_manifest(store.SweepPaths(harness.results, "exp014_tiled", sweep))
    del manifest["code_digest"]
    store.write_manifest(harness.results, manifest)
    resumed = harness(f"resume={sweep}", f"code_store={harness.cwd / 'codes'}")
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1, resumed.stderr
    assert "names no code (code_digest): resume it with code=current" in resumed.stderr
    current = harness(f"resume={sweep}", "code=current", f"code_store={harness.cwd / 'codes'}")
    assert current.returncode == 0, current.stdout + current.stderr


def test_an_answers_hint_is_never_written_through_a_link_and_a_torn_one_reads_as_nothing(
    tmp_path,
):
    """reuse.record writes its hint in place: a link at the hint's name, or at its folders,
    is not written through; a hint cut short (a crash mid-write) is read as no answer."""
    from harness import reuse
    from harness.lifetime import forget

    key = {"code_digest": "c", "device_name": "cpu", "torch_version": "t", "cuda_version": None,
           "packages_digest": "p", "threads": 1, "environment": "{}", "inputs": {}}  # fmt: skip
    row = {"status": "ok", "config_hash": "h", "job": 0,
           **{k: v for k, v in key.items() if k != "inputs"}}  # fmt: skip
    victim = tmp_path / "victim"
    victim.write_text("a user's own words\n")
    hints = tmp_path / "results" / "experiment=e" / reuse.ANSWERS / "h"
    hints.mkdir(parents=True)
    (hints / "s1.0.json").symlink_to(victim)
    reuse.record(
        store.SweepPaths(tmp_path / "results", "e", "s1").job(0), [row], key, False, "answers"
    )
    assert victim.read_text() == "a user's own words\n"
    (hints / "s1.0.json").unlink()
    hints.rmdir()
    hints.symlink_to(tmp_path, target_is_directory=True)
    reuse.record(
        store.SweepPaths(tmp_path / "results", "e", "s1").job(0), [row], key, False, "answers"
    )
    assert not (tmp_path / "s1.0.json").exists()
    hints.unlink()
    hints.mkdir()
    (hints / "s1.0.json").write_text('{"sweep": "s1", "job": 0, "code_di')
    forget()
    assert (
        reuse.find(store.SweepPaths(tmp_path / "results", "e", "s2"), "h", key, "answers").rows
        is None
    )


def test_an_answers_hint_never_truncates_a_file_hard_linked_at_its_name(tmp_path):
    """A hard link planted at a hint's name (another name of a user's file) is left as it is."""
    from harness import reuse

    row = {"status": "ok", "config_hash": "h", "code_digest": "c", "job": 0}
    victim = tmp_path / "victim"
    victim.write_text("a user's own words\n")
    hints = tmp_path / "results" / "experiment=e" / reuse.ANSWERS / "h"
    hints.mkdir(parents=True)
    os.link(victim, hints / "s1.0.json")
    reuse.record(
        store.SweepPaths(tmp_path / "results", "e", "s1").job(0), [row], {}, False, "answers"
    )
    assert victim.read_text() == "a user's own words\n"
    reuse.record(
        store.SweepPaths(tmp_path / "results", "e", "s1").job(1),
        [{**row, "job": 1}],
        {},
        False,
        "answers",
    )
    assert json.loads((hints / "s1.1.json").read_text())["job"] == 1


def bundle_of(own) -> Path:
    """The code store's bundle of the experiment's own package."""
    return next(p for p in own.codes.glob("bundle-*") if (p / "minepkg").is_dir())


@pytest.mark.parametrize("planted", ["__pycache__/kernel.cpython-311.pyc", "kernel.abi3.so"])
def test_a_file_planted_in_a_snapshot_is_refused_and_never_run(own, planted):
    """Bytecode with the source's own header, or an extension module, put beside the kernel
    in its snapshot: the resume refuses the snapshot in one line, and a new sweep of the same
    code keeps its bundle anew and runs the kernel as written."""
    import importlib.util
    import marshal

    assert own("x=-1,1").returncode == 1
    sweep = newest(own.harness)
    bundle = bundle_of(own)
    target = bundle / "minepkg" / planted
    target.parent.mkdir(exist_ok=True)
    source = KERNEL.format(value=666)
    code = compile(source, str(bundle / "minepkg" / "kernel.py"), "exec")
    kernel = (bundle / "minepkg" / "kernel.py").stat()
    header = importlib.util.MAGIC_NUMBER + b"\0" * 4 + int(kernel.st_mtime).to_bytes(4, "little")
    target.write_bytes(header + kernel.st_size.to_bytes(4, "little") + marshal.dumps(code))
    resumed = own(f"resume={sweep}")
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1, resumed.stderr
    assert "was changed or is gone" in resumed.stderr
    anew = own("x=2,3", "reuse=false")
    planted_values = ("value=1332", "value=1998")  # 666 times x: the planted code's rows
    assert anew.returncode == 0 and "value=2" in anew.stdout
    assert not [said for said in planted_values if said in anew.stdout]  # (a sweep id may hold 666)
    assert not target.exists()
    assert sweep_rows(own.harness, newest(own.harness))["value"].tolist() == [2, 3]


@pytest.mark.parametrize("case", ["store-open-to-all", "bundle-of-another-user"])
def test_code_that_others_can_change_is_refused_in_one_line(own, case):
    """As ssh refuses a key that others can write: a code store of mode 0777, or a bundle
    that another user owns, runs nothing."""
    assert own().returncode == 0
    if case == "store-open-to-all":
        own.codes.chmod(0o777)
        said = "can be written by others (mode 0777)"
    else:
        os.chown(bundle_of(own), 65534, 65534)
        said = "belongs to another user (uid 65534)"
    refused = own("reuse=false")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert said in refused.stderr


def test_an_edit_of_the_same_size_with_its_mtime_set_back_is_new_code(own):
    """cp -p or touch -r after an edit: the stat cache keys on the change time too, which no
    user can set back."""
    assert own().returncode == 0
    path = own.folder / "minepkg" / "kernel.py"
    before = path.stat()
    path.write_text(KERNEL.format(value=2))  # VALUE = 1 -> VALUE = 2: the same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    assert own().returncode == 0
    rows = sweep_rows(own.harness, newest(own.harness))
    assert rows["value"].tolist() == [2, 4] and reused(rows) == [None, None]


def test_a_namespace_package_is_pinned_from_every_folder_of_it(tmp_path):
    """A namespace package (no __init__.py) in two folders on the path: both are the
    experiment's code, its data files too; a path that both hold is the one imported."""
    for n, folder in enumerate([tmp_path / "one", tmp_path / "two"]):
        (folder / "spaced").mkdir(parents=True)
        (folder / "spaced" / f"part{n}.py").write_text(f"N = {n}\n")
        (folder / "spaced" / "both.py").write_text(f"FROM = {n}\n")
    (tmp_path / "two" / "spaced" / "table.csv").write_text("a,b\n")
    sys.path[:0] = [str(tmp_path / "one"), str(tmp_path / "two")]
    try:
        node = {"name": "x", "run": "spaced.part0.run"}
        code = codestore.collect(node, tmp_path / "outputs", tmp_path / "codes")
    finally:
        del sys.path[:2]
        sys.modules.pop("spaced", None)
    files = code.bundles[0].files
    assert set(files) == {"spaced/part0.py", "spaced/part1.py", "spaced/both.py",
                          "spaced/table.csv"}  # fmt: skip
    assert files["spaced/both.py"] == tmp_path / "one" / "spaced" / "both.py"


def test_each_module_of_a_snapshot_is_checked_as_it_is_imported(tmp_path):
    """Entered, a snapshot's module edited or added in its bundle after the check at the start
    is refused when it is imported; each is compiled from the bytes checked, its bytecode kept
    nowhere (a .pyc planted where a store kept it is never run), and the bundle's folders are
    read-only."""
    import marshal

    from harness.launchers.fresh import ProcessState

    package = tmp_path / "src" / "checked"
    package.mkdir(parents=True)
    for name in ("__init__", "first", "late", "other"):
        (package / f"{name}.py").write_text(f"NAME = {name!r}\n")
    codes = tmp_path / "codes"
    state = ProcessState()
    sys.path.insert(0, str(package.parent))
    try:
        digest = codestore.pin({"name": "x", "run": "checked.first.run"}, tmp_path, codes)
        bundle = next(p for p in codes.glob("bundle-*") if (p / "checked").is_dir())
        sys.modules.pop("checked", None)
        codestore.enter(codes, digest)
        import checked.first

        assert Path(checked.first.__file__).parent == bundle / "checked"
        (bundle / "checked" / "late.py").write_text("NAME = 'edited'\n")
        with pytest.raises(ImportError, match="no longer hashes as the sweep pinned it"):
            import checked.late  # noqa: F401
        (bundle / "checked" / "new.py").write_text("NAME = 'added'\n")
        with pytest.raises(ImportError, match="is not a file of the sweep's code"):
            import checked.new  # noqa: F401
        import checked.other

        assert checked.other.NAME == "other"
        planted = importlib.util.MAGIC_NUMBER + marshal.dumps(
            compile("NAME = 'planted'", "x", "exec")
        )
        (codes / "bytecode").mkdir(exist_ok=True)
        for pyc in [*(codes / "bytecode").glob("*.pyc"), codes / "bytecode" / "any.pyc"]:
            pyc.write_bytes(planted)
        del sys.modules["checked.other"]
        import checked.other  # noqa: F811 - imported anew

        assert checked.other.NAME == "other", "a planted .pyc ran"
        assert not [p for p in codes.rglob("*.pyc") if p.parent.name != "bytecode"]
    finally:
        for name in [n for n in sys.modules if n.partition(".")[0] == "checked"]:
            del sys.modules[name]
        state.restore()
    assert not list(bundle.rglob("__pycache__"))
    modes = {stat.S_IMODE(p.stat().st_mode) for p in [bundle, *bundle.rglob("*")] if p.is_dir()}
    assert modes == {0o555}


def test_a_bundle_that_cannot_be_read_is_an_error_and_stays(own, monkeypatch):
    """A read error while a new sweep checks a bundle it would use (a transient NFS error) is
    one line, and the bundle stays where running tasks may import from it."""
    from harness.pinning import boot

    assert own().returncode == 0
    bundle = bundle_of(own)
    real = boot._private_hash  # where a bundle's file is read

    def failing(path):
        if Path(path).is_relative_to(bundle):
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path)

    monkeypatch.setattr(boot, "_private_hash", failing)
    refused = own("reuse=false")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "cannot read the code store" in refused.stderr and "Input/output error" in refused.stderr
    monkeypatch.undo()
    assert boot.intact(bundle, bundle.name.removeprefix("bundle-"))


def test_prune_keeps_the_code_of_the_sweeps_named_and_removes_the_rest(own, tmp_path):
    """Two sweeps of two codes in two out folders: code prune with the first's kept removes
    the second's code (pinned over an hour ago), whose resume then says so in one line."""
    assert own(f"out={tmp_path / 'kept'}").returncode == 0
    own.edit(7)
    assert own(f"out={tmp_path / 'gone'}", "x=-1,2").returncode == 1
    old = time.time() - 2 * codestore.RECENT_S
    for entry in own.codes.iterdir():  # all made over an hour ago
        os.utime(entry, (old, old))
    pruned = own.harness("code", "prune", f"out={tmp_path / 'kept'}", f"code_store={own.codes}")
    assert pruned.returncode == 0, pruned.stderr
    assert "1 codes removed" in pruned.stdout
    results = tmp_path / "kept" / "results"
    kept = store.read_manifest(store.SweepPaths(results, "own", store.newest_sweep(results, "own")))
    assert (own.codes / f"snapshot-{kept['code_digest']}.json").exists()
    gone = store.newest_sweep(tmp_path / "gone" / "results", "own")
    resumed = own(f"out={tmp_path / 'gone'}", f"resume={gone}")
    assert resumed.returncode == 2 and "has no snapshot" in resumed.stderr, resumed.stderr
    assert len(list(own.codes.glob("bundle-*"))) == 2, "its own and the project's"
    status = own.harness("status", gone, f"out={tmp_path / 'gone'}")
    assert "has no snapshot in the code store" in status.stdout, status.stdout
    assert f"resume={gone}" in status.stdout and "code=current" in status.stdout


def test_a_staging_folder_a_killed_pin_left_is_removed_by_the_next_pin_and_by_prune(own):
    """A pin killed while it wrote a bundle (its process gone) leaves a read-only staging
    folder: the next pin removes it, and so does code prune, however young; a pin in progress
    (its process alive) is left to finish."""
    import socket

    assert own().returncode == 0
    host = f"{socket.gethostname()}-{os.stat('/proc/self/ns/pid').st_ino}"

    def plant(pid: int, token: str) -> Path:
        staging = own.codes / f".bundle-{'0' * 16}.{host}.{pid}.{token}.tmp"
        (staging / "minepkg").mkdir(parents=True)
        (staging / "minepkg" / "kernel.py").write_text("")
        for path in (staging / "minepkg" / "kernel.py", staging / "minepkg", staging):
            path.chmod(0o555 if path.is_dir() else 0o444)
        return staging

    killed, alive = plant(_unused_pid(), "aaaaaaaa"), plant(os.getpid(), "bbbbbbbb")
    assert own().returncode == 0
    assert not killed.exists() and alive.exists()
    killed = plant(_unused_pid(), "cccccccc")
    assert own.harness("code", "prune", f"code_store={own.codes}").returncode == 0
    assert not killed.exists() and alive.exists()
    codestore._remove(alive)


def _unused_pid() -> int:
    """A pid no process has now."""
    for pid in range(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            continue
    raise AssertionError("every pid is taken")


@pytest.mark.process
def test_a_snapshot_gone_before_a_process_starts_is_the_harness_line_and_exit_3(own):
    """A SLURM task or a fresh point whose snapshot was removed while it queued: the calling
    harness's boot, not the snapshot's own (gone with it), says so and exits 3."""
    import shlex

    from harness.pinning import boot

    assert own().returncode == 0
    digest = store.read_manifest(store.SweepPaths(own.harness.results, "own", newest(own.harness)))[
        "code_digest"
    ]
    command = shlex.split(codestore.boot_command(own.codes, digest))
    codestore._remove(own.codes)
    ran = subprocess.run([*command, "-u", "-m", "harness", "--help"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert ran.returncode == boot.FAILED, ran.stderr
    assert ran.stderr.startswith("harness error: the sweep's code") and ran.stderr.count("\n") == 1


def test_a_link_to_a_folder_planted_in_a_snapshot_is_refused(own, tmp_path):
    """A link among a bundle's folders (to a package outside it, which Python would import
    in the kernel module's place): the snapshot no longer verifies."""
    assert own("x=-1,1").returncode == 1
    sweep = newest(own.harness)
    outside = tmp_path / "planted"
    outside.mkdir()
    (outside / "__init__.py").write_text("def run(x: int = 1, gate: str = '', seed: int = 0):\n"
                                         "    return [{'value': -999}]\n")  # fmt: skip
    (bundle_of(own) / "minepkg" / "kernel").symlink_to(outside, target_is_directory=True)
    resumed = own(f"resume={sweep}")
    assert resumed.returncode == 2 and "is a symbolic link" in resumed.stderr, resumed.stderr
    assert sweep_rows(own.harness, sweep)["status"].tolist() == ["failed", "ok"], "nothing ran"


def test_a_pipe_in_the_experiments_folder_is_no_file_to_pin(own):
    os.mkfifo(own.folder / "minepkg" / "feed")
    assert own().returncode == 0


def test_prune_keeps_the_code_that_a_resume_with_code_current_ran(own):
    """A kept sweep whose failed point a code=current resume ran on edited code: its rows name
    that code, which prune keeps with the sweep's own."""
    assert own("x=-1,1").returncode == 1
    sweep = newest(own.harness)
    own.edit(5)  # x=-1 still fails: code=current runs it on the edited code
    assert own(f"resume={sweep}", "code=current").returncode == 1
    codes = set(sweep_rows(own.harness, sweep)["code_digest"])
    assert len(codes) == 2
    old = time.time() - 2 * codestore.RECENT_S
    for entry in own.codes.iterdir():
        os.utime(entry, (old, old))
    pruned = own.harness("code", "prune", f"code_store={own.codes}")
    assert pruned.returncode == 0 and "0 codes removed" in pruned.stdout, pruned.stdout


def test_a_resume_takes_its_code_store_from_its_own_command_line(own):
    """The manifest names the code store the sweep was planned with; a resume that names none
    looks in the default one (a manifest names no folder to run code from), and says the
    sweep's code is not there; with code_store= it resumes."""
    assert own("x=-1,1").returncode == 1
    sweep = newest(own.harness)
    own.edit(1)
    elsewhere = own.harness("--config-dir", str(own.folder), f"resume={sweep}",
                            env={"PYTHONPATH": str(own.folder),
                                 "XDG_CACHE_HOME": str(own.folder.parent / "cache")})  # fmt: skip
    assert elsewhere.returncode == 2 and "has no snapshot" in elsewhere.stderr, elsewhere.stderr
    assert str(own.folder.parent / "cache") in elsewhere.stderr
    assert own(f"resume={sweep}").returncode == 1, "x=-1 fails again, on the sweep's own code"


def test_a_modules_folder_that_is_its_config_dir_pins_the_module_not_the_yaml(tmp_path):
    """A top-level module beside its configs (--config-dir mine, mine/experiment/NAME.yaml):
    the YAML is the command's to read, no code: a claim edited in it is the same code."""
    mine = tmp_path / "mine"
    (mine / "experiment").mkdir(parents=True)
    (mine / "topmod.py").write_text("def run(): ...\n")
    (mine / "experiment" / "top.yaml").write_text("# @package _global_\n")
    sys.path.insert(0, str(mine))
    try:
        node = {"name": "top", "run": "topmod.run"}
        code = codestore.collect(node, tmp_path / "outputs", tmp_path / "codes", [mine])
    finally:
        sys.path.remove(str(mine))
        sys.modules.pop("topmod", None)
    assert set(code.bundles[0].files) == {"topmod.py"}
