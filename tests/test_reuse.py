"""Reuse on request (harness/reuse/): a copy only where the sweep asks for one, only
under the same key (config, code, kind of machine, the installed packages and what Python runs
beside them, declared inputs), and never for a point that read what its experiment does not
declare. An experiment of one's own in a folder of its own, run as a user runs it, each input
changed for real between two sweeps, and the store read back."""

import json
import os
import site
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
from commands import call_command

from harness import provenance, store

YAML = """# @package _global_
{top}experiment:
  name: mine
  run: {run}
{extra}hydra:
  sweeper:
    params:
      x: 1,2
"""
KERNEL = "def run(x: int = 1):\n    return [{'v': x}]\n"
READS = ("from pathlib import Path\n\ndef run(x: int = 1, data: str = ''):\n"
         "    return [{'v': int(Path(data).read_text()) * x}]\n")  # fmt: skip


@pytest.fixture
def mine(harness, tmp_path):
    """A package of one's own, minepkg (its module kernel.py given as text), on PYTHONPATH,
    with an experiment config of its own that says reuse: true (`top`: its top-level lines;
    `extra`: its experiment block's); mine(*args) runs a sweep of it, mine.rows() reads the
    newest sweep's rows in job order."""
    folder = tmp_path / "mine"
    (folder / "experiment").mkdir(parents=True)
    (folder / "minepkg").mkdir()
    (folder / "minepkg" / "__init__.py").write_text("")
    paths = [str(folder)]

    def write(kernel: str, run="minepkg.kernel.run", extra="", top="reuse: true\n") -> None:
        touched(folder / "minepkg" / "kernel.py", kernel)
        text = YAML.format(run=run, extra=extra, top=top)
        (folder / "experiment" / "mine.yaml").write_text(text)

    def run(*args: str, env: dict | None = None, cwd: Path | None = None, code: int = 0):
        given = {"PYTHONPATH": os.pathsep.join(paths), **(env or {})}
        stores = [f"code_store={tmp_path / 'codes'}", f"out={tmp_path / 'outputs'}"]
        arguments = ["--config-dir", str(folder), "+experiment=mine", *stores, *args]
        result = call_command("harness", *arguments, cwd=cwd or tmp_path, env=given)
        assert result.returncode == code, result.stdout + result.stderr
        return result

    def rows():
        newest = store.newest_sweep(harness.results, "mine")
        return store.read(harness.results, "mine", newest).sort_values("job").reset_index()

    run.write, run.rows, run.folder, run.paths, run.harness = write, rows, folder, paths, harness
    return run


def touched(path: Path, text: str | bytes) -> None:
    """The file written with a modification time of its own, a second on (the file system's
    granularity would hide an edit within it)."""
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    stamp = time.time_ns() + 10**9
    os.utime(path, ns=(stamp, stamp))


def copied_until(mine, change, values: list, *args: str):
    """The sweep of `args`, and again: every answer copied; once change() is made, the next
    runs every point again and gives `values`. That last sweep's result."""
    mine(*args)
    mine(*args)
    assert reused(mine.rows()) == [True, True]
    change()
    result = mine(*args)
    rows = mine.rows()
    assert rows["v"].tolist() == values and reused(rows) == [False, False]
    return result


def reused(rows) -> list[bool]:
    column = rows["reused_from"] if "reused_from" in rows else [None] * len(rows)
    return [isinstance(value, str) for value in column]


def test_the_seed_decides_an_answer_even_where_the_function_takes_none(mine):
    """run takes no seed, but the harness seeds Python's and torch's generators from it: seed=1
    after seed=0 runs again and draws anew; seed=0 again is copied."""
    mine.write("import random\n\ndef run(x: int = 1):\n    return [{'draw': random.random()}]\n")
    mine("seed=0")
    zero = mine.rows()["draw"].tolist()
    mine("seed=1")
    one = mine.rows()
    assert reused(one) == [False, False] and one["draw"].tolist() != zero
    mine("seed=0")
    again = mine.rows()
    assert reused(again) == [True, True] and again["draw"].tolist() == zero


def test_without_reuse_in_its_yaml_nothing_is_copied_or_recorded(mine):
    mine.write(KERNEL, top="")
    mine()
    mine()
    assert reused(mine.rows()) == [False, False]
    assert not (mine.harness.results / "experiment=mine" / "_answers").exists()
    assert mine.rows()["files_read"].isna().all(), "nothing watched without reuse"


def test_the_run_target_decides_an_answer(mine):
    mine.write(KERNEL + "\ndef doubled(x: int = 1):\n    return [{'v': 2 * x}]\n")
    mine()
    mine("experiment.run=minepkg.kernel.doubled")
    rows = mine.rows()
    assert rows["v"].tolist() == [2, 4] and reused(rows) == [False, False]


def test_threads_decide_an_answer(mine):
    mine.write("import torch\n\ndef run(x: int = 1):\n"
               "    return [{'t': torch.get_num_threads()}]\n")  # fmt: skip
    mine("threads=1")
    mine("threads=2")
    rows = mine.rows()
    assert rows["t"].tolist() == [2, 2] and reused(rows) == [False, False]


def test_a_data_file_beside_the_module_is_pinned_and_its_edit_runs_again(mine):
    """shapes.json, read through the module's own path: pinned with the package (so it is found
    in the snapshot, and no undeclared read), and an edit of it is new code."""
    mine.write("import json\nfrom pathlib import Path\n\ndef run(x: int = 1):\n"
               "    heads = json.loads(Path(__file__).with_name('shapes.json').read_text())\n"
               "    return [{'heads': heads['heads'] * x}]\n")  # fmt: skip
    data = mine.folder / "minepkg" / "shapes.json"
    touched(data, '{"heads": 8}')
    mine()
    assert set(mine.rows()["files_read"]) == {"[]"}, "a file of the snapshot is pinned"
    mine()
    assert reused(mine.rows()) == [True, True]
    touched(data, '{"heads": 4}')
    mine()
    rows = mine.rows()
    assert rows["heads"].tolist() == [4, 8] and reused(rows) == [False, False]


def test_a_declared_input_is_hashed_before_a_copy(mine, tmp_path):
    """inputs: [data], a parameter whose value is a path: unchanged, the answer is copied;
    edited, the points run again; each row names the file and its digest."""
    mine.write(READS, extra="  inputs: [data]\n")
    data = tmp_path / "elsewhere" / "numbers.txt"
    data.parent.mkdir()
    touched(data, "3")
    mine(f"+data={data}")
    declared = json.loads(mine.rows()["declared_inputs"][0])
    assert declared["data"]["paths"] == [[str(data)]] and len(declared["data"]["digest"]) == 16
    copied_until(mine, lambda: touched(data, "5"), [5, 10], f"+data={data}")


def test_a_declared_input_behind_a_link_pointed_elsewhere_runs_again(mine, tmp_path):
    """current.txt, a link to v1.txt, then to v2.txt: its target's bytes decide, and the chain
    is recorded; a link to a folder, pointed at another folder, alike."""
    mine.write(READS, extra="  inputs: [data]\n")
    for name, value in (("v1.txt", "2"), ("v2.txt", "7")):
        touched(tmp_path / name, value)
    link = tmp_path / "current.txt"
    link.symlink_to("v1.txt")
    mine(f"+data={link}")
    assert json.loads(mine.rows()["declared_inputs"][0])["data"]["paths"] == [
        [str(link), str(tmp_path / "v1.txt")]
    ]

    def repoint() -> None:
        link.unlink()
        link.symlink_to("v2.txt")

    copied_until(mine, repoint, [7, 14], f"+data={link}")


def test_a_declared_folder_is_hashed_by_its_names_and_contents(mine, tmp_path):
    mine.write("from pathlib import Path\n\ndef run(x: int = 1, data: str = ''):\n"
               "    return [{'v': sum(int(p.read_text()) for p in Path(data).glob('*.txt'))}]\n",
               extra="  inputs: [data]\n")  # fmt: skip
    folder = tmp_path / "shards"
    folder.mkdir()
    touched(folder / "a.txt", "1")
    copied_until(mine, lambda: touched(folder / "b.txt", "2"), [3, 3], f"+data={folder}")
    copied_until(mine, lambda: touched(folder / "a.txt", "5"), [7, 7], f"+data={folder}")


def test_a_declared_glob_is_relative_to_the_experiments_config_folder(mine):
    """inputs: ['tables/*.csv'], beside the experiment's YAML: a file added there runs the
    points again; a file it does not match changes nothing."""
    tables = mine.folder / "experiment" / "tables"
    tables.mkdir()
    touched(tables / "a.csv", "1")
    mine.write(f"from pathlib import Path\n\ndef run(x: int = 1):\n"
               f"    return [{{'v': sum(int(p.read_text()) for p in "
               f"Path({str(tables)!r}).glob('*.csv'))}}]\n",
               extra="  inputs: ['tables/*.csv']\n")  # fmt: skip
    mine()
    touched(tables / "notes.md", "a note")
    copied_until(mine, lambda: touched(tables / "b.csv", "4"), [5, 5])


@pytest.mark.parametrize("where", ["outputs/checkpoints", "outputs/report", "/dev/shm"])
def test_a_declared_input_anywhere_is_hashed(mine, tmp_path, where):
    """Under the out folder's own folders or in /dev/shm: a declared input is hashed wherever it
    lies."""
    folder = Path(where) if where.startswith("/") else tmp_path / where
    if not folder.is_dir() and where.startswith("/"):
        pytest.skip(f"no {folder} here")
    folder = folder / f"mine-{os.getpid()}-{time.time_ns()}"
    folder.mkdir(parents=True)
    try:
        data = folder / "n.txt"
        touched(data, "2")
        mine.write(READS, extra="  inputs: [data]\n")
        copied_until(mine, lambda: touched(data, "4"), [4, 8], f"+data={data}")
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


def test_an_input_read_in_c_is_seen_once_declared(mine, tmp_path):
    """pyarrow reads its file in C, which no audit hook sees: declared, its edit runs again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "table.parquet"
    pq.write_table(pa.table({"n": [3]}), data)
    mine.write("import pyarrow.parquet as pq\n\ndef run(x: int = 1, data: str = ''):\n"
               "    return [{'v': pq.read_table(data)['n'][0].as_py() * x}]\n",
               extra="  inputs: [data]\n")  # fmt: skip

    def rewrite() -> None:
        pq.write_table(pa.table({"n": [6]}), data)

    copied_until(mine, rewrite, [6, 12], f"+data={data}")


def test_an_undeclared_read_records_no_answer_and_names_the_file(mine, tmp_path):
    """A point that reads a file its experiment does not declare: the sweep says which, and the
    inputs: entry that declares it (the parameter that names it); no answer is recorded, so the
    next sweep computes again; status says so too. Declared, it is copied."""
    mine.write(READS)
    data = tmp_path / "numbers.txt"
    touched(data, "3")
    first = mine(f"+data={data}")
    assert f"read {data}" in first.stdout and "experiment.inputs: [data]" in first.stdout
    assert json.loads(mine.rows()["files_read"][0]) == [str(data)]
    mine(f"+data={data}")
    assert reused(mine.rows()) == [False, False], "nothing was recorded"
    sweep = store.newest_sweep(mine.harness.results, "mine")
    status = mine.harness("status", sweep)
    assert "2 points read files their experiment's inputs do not declare" in status.stdout
    mine.write(READS, extra="  inputs: [data]\n")
    mine(f"+data={data}")
    mine(f"+data={data}")
    assert reused(mine.rows()) == [True, True]


@pytest.mark.parametrize("how", ["mmap r+", "chdir", "a helper's import"])
def test_what_a_point_reads_undeclared_refuses_the_copy(mine, tmp_path, how):
    """np.load(mmap_mode='r+') only reads; a point that changes its working directory reads
    a relative path there (named absolute); a helper module imported from a folder the sweep
    did not pin reads its code: each is an undeclared read."""
    import numpy as np

    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "w.npy", np.arange(3))
    touched(data / "n.txt", "3")
    (tmp_path / "helpers").mkdir()
    touched(tmp_path / "helpers" / "scale.py", "FACTOR = 2\n")
    mine.paths.append(str(tmp_path / "helpers"))
    kernels = {
        "mmap r+": (
            "import numpy as np\n\ndef run(x: int = 1):\n"
            f"    w = np.load({str(data / 'w.npy')!r}, mmap_mode='r+')\n"
            "    return [{'v': int(w.sum()) * x}]\n",
            data / "w.npy",
        ),  # fmt: skip
        "chdir": (
            "import os\n\ndef run(x: int = 1):\n"
            f"    os.chdir({str(data)!r})\n"
            "    return [{'v': int(open('n.txt').read()) * x}]\n",
            data / "n.txt",
        ),  # fmt: skip
        "a helper's import": (
            "def run(x: int = 1):\n    import scale\n    return [{'v': scale.FACTOR * x}]\n",
            tmp_path / "helpers" / "scale.py",
        ),  # fmt: skip
    }
    kernel, read = kernels[how]
    mine.write(kernel)
    first = mine()
    assert f"read {read}" in first.stdout, first.stdout
    mine()
    assert reused(mine.rows()) == [False, False]


def test_a_file_an_earlier_point_read_into_a_cache_counts_for_the_points_after(mine, tmp_path):
    """The points of a sweep run one after another in one process: a loader cached by the
    first point serves the second without a read, which still records no answer."""
    data = tmp_path / "cached.txt"
    touched(data, "4")
    mine.write("import functools\nfrom pathlib import Path\n\n@functools.cache\n"
               f"def load():\n    return int(Path({str(data)!r}).read_text())\n\n"
               "def run(x: int = 1):\n    return [{'v': load() * x}]\n")  # fmt: skip
    mine()
    assert all(str(data) in read for read in mine.rows()["files_read"])
    assert not list((mine.harness.results / "experiment=mine" / "_answers").rglob("*.*.json"))


def test_an_input_that_cannot_be_read_refuses_the_copy_in_one_line(mine, tmp_path):
    mine.write(READS, extra="  inputs: [data]\n")
    data = tmp_path / "numbers.txt"
    touched(data, "3")
    mine(f"+data={data}")
    data.unlink()
    again = mine(f"+data={data}", code=1)
    assert f"the input data: cannot read {data}" in again.stdout
    assert mine.rows()["status"].tolist() == ["failed", "failed"]


@pytest.mark.parametrize("entry", ["dta", "7", "[data]"])
def test_inputs_that_are_no_list_of_names_and_globs_are_one_line(mine, entry):
    """A name one letter off a parameter, a number, a list inside the list: exit 2."""
    mine.write(READS, extra=f"  inputs: [{entry}]\n")
    refused = mine(code=2)
    assert refused.stderr.count("\n") == 1 and "experiment.inputs" in refused.stderr
    if entry == "dta":
        assert "did you mean data?" in refused.stderr


def test_an_environment_variable_that_changes_numbers_is_recorded_and_in_the_key(mine):
    """One the experiment names (experiment.environment) and one of the harness's own list
    (OMP_NUM_THREADS): each row records them, and a change runs the points again."""
    mine.write("import os\n\ndef run(x: int = 1):\n"
               "    return [{'v': int(os.environ.get('MINE_SCALE', '1')) * x}]\n",
               extra="  environment: [MINE_SCALE]\n")  # fmt: skip
    mine(env={"MINE_SCALE": "2", "OMP_NUM_THREADS": "1"})
    rows = mine.rows()
    assert json.loads(rows["environment"][0]) == {"MINE_SCALE": "2", "OMP_NUM_THREADS": "1"}
    mine(env={"MINE_SCALE": "2", "OMP_NUM_THREADS": "1"})
    assert reused(mine.rows()) == [True, True]
    mine(env={"MINE_SCALE": "3", "OMP_NUM_THREADS": "1"})
    rows = mine.rows()
    assert rows["v"].tolist() == [3, 6] and reused(rows) == [False, False]
    mine(env={"MINE_SCALE": "3", "OMP_NUM_THREADS": "2"})
    assert reused(mine.rows()) == [False, False]


def test_a_measurement_is_copied_only_where_the_command_line_asks(mine):
    """A point that timed a call (harness.measuring): its experiment's reuse: true copies
    answers but measures this one again; reuse=true on the command line copies it too; and
    with reuse=false nothing is copied."""
    mine.write("from harness.measuring.timing import time_call\n\ndef run(x: int = 1):\n"
               "    return [{**time_call(lambda: sum(range(100)), min_repeats=3, "
               "min_time_s=0)}]\n")  # fmt: skip
    mine()
    mine()
    assert reused(mine.rows()) == [False, False]
    mine("reuse=true")
    mine("reuse=true")
    assert reused(mine.rows()) == [True, True]
    mine()
    assert reused(mine.rows()) == [False, False], "the YAML's reuse copies no measurement"
    mine("reuse=false")
    assert reused(mine.rows()) == [False, False]


@pytest.fixture
def installed(monkeypatch, tmp_path, mine):
    """A folder the harness counts among the installed packages' (on PYTHONPATH), with a .pth
    file of the site's and a sitecustomize this process ran."""
    folder = tmp_path / "site-packages"
    folder.mkdir()
    real = provenance.installed()
    monkeypatch.setattr(provenance, "installed", lambda: (*real, f"{folder}{os.sep}"))
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(folder)])
    touched(folder / "extra.pth", "# nothing\n")
    custom = tmp_path / "sitecustomize.py"
    touched(custom, "")
    module = types.ModuleType("sitecustomize")
    module.__file__ = str(custom)
    monkeypatch.setitem(sys.modules, "sitecustomize", module)
    mine.paths.append(str(folder))
    return folder


@pytest.mark.parametrize("what", [".pth", "sitecustomize", "zip on the path", "patched"])
def test_what_python_runs_beside_the_installed_packages_decides_an_answer(
    mine, installed, tmp_path, what
):
    """A .pth file edited, the sitecustomize edited, a zip on the import path changed, an
    installed module patched in place (its version as it was): each runs the points again."""
    sys.modules.pop("libhelper", None)  # an installed package's module outlives a command here
    touched(installed / "libhelper.py", "FACTOR = 2\n")
    archive = tmp_path / "helpers.zip"
    with zipfile.ZipFile(archive, "w") as made:
        made.writestr("zipped.py", "X = 1\n")
    mine.paths.append(str(archive))
    mine.write(
        "import libhelper\n\ndef run(x: int = 1):\n    return [{'v': libhelper.FACTOR * x}]\n"
    )

    def change() -> None:
        if what == ".pth":
            touched(installed / "extra.pth", "# another line\n")
        elif what == "sitecustomize":
            touched(Path(sys.modules["sitecustomize"].__file__), "import os\n")
        elif what == "zip on the path":
            with zipfile.ZipFile(archive, "a") as made:
                made.writestr("more.py", "Y = 2\n")
        else:
            touched(installed / "libhelper.py", "FACTOR = 3 \n")
            sys.modules.pop("libhelper")  # as a new process would import it

    values = [3, 6] if what == "patched" else [2, 4]
    copied_until(mine, change, values)
    sys.modules.pop("libhelper", None)


def test_a_pipe_among_the_answers_is_skipped(mine):
    """A FIFO where an answer's hint would be: read as no hint, and the sweep goes on (it would
    block every sweep of that config)."""
    mine.write(KERNEL)
    mine()
    hint = next((mine.harness.results / "experiment=mine" / "_answers").rglob("*.*.json"))
    os.mkfifo(hint.with_name("20991231-000000-0000.0.json"))
    mine()
    assert reused(mine.rows()) == [True, True]


def test_a_threads_setting_equal_to_the_default_reuses_its_answers(mine):
    """threads is no key of the config's own: the count a point ran with is (its kind of
    machine), so threads=N where N is what the point had anyway copies the answer."""
    import torch

    mine.write(KERNEL)
    mine()
    mine(f"threads={torch.get_num_threads()}")
    assert reused(mine.rows()) == [True, True]


def test_what_a_library_lists_on_the_import_path_is_no_read(mine, tmp_path):
    """A library that looks a package's version up (importlib.metadata lists every folder on the
    import path, the working directory among them) reads nothing of the point's."""
    mine.write("from importlib import metadata\n\ndef run(x: int = 1):\n"
               "    return [{'v': x, 'torch': metadata.version('torch')}]\n")  # fmt: skip
    mine()
    touched(tmp_path / "notes.txt", "a new file here")
    mine()
    assert reused(mine.rows()) == [True, True]


def test_a_resume_whose_config_decides_other_answers_than_planned_is_refused(mine):
    """The YAML's seed changed before a resume: its points would run another seed under the
    planned points' config_hash; one line, exit 2, nothing run."""
    mine.write("def run(x: int = 1):\n    if x == 2:\n        raise ValueError('two')\n"
               "    return [{'v': x}]\n", top="seed: 0\n")  # fmt: skip
    mine(code=1)
    sweep = store.newest_sweep(mine.harness.results, "mine")
    mine.write(KERNEL, top="seed: 1\n")
    refused = mine(f"resume={sweep}", code=2)
    assert refused.stderr.count("\n") == 1 and "seed is 1 in the config now" in refused.stderr


@pytest.mark.parametrize("setting", ["reuse=0", "reuse=1", "reuse=null", "seed=abc", "code=old"])
def test_a_setting_of_the_wrong_kind_is_one_line(mine, setting):
    mine.write(KERNEL)
    refused = mine(setting, code=2)
    assert refused.stderr.count("\n") == 1, refused.stderr


def test_a_file_looked_for_beside_the_code_but_not_pinned_says_why(mine):
    """A module that reads ../data/p.txt from its own path: in the snapshot there is none; the
    failed row says what the path is and what to do."""
    (mine.folder / "data").mkdir()
    touched(mine.folder / "data" / "p.txt", "9")
    mine.write(
        "from pathlib import Path\n\ndef run(x: int = 1):\n"
        "    return [{'v': int((Path(__file__).parents[1] / 'data' / 'p.txt').read_text())}]\n"
    )
    mine(code=1)
    error = mine.rows()["error"][0]
    assert error.startswith("FileNotFoundError") and "the sweep pins the files of the" in error


def test_a_hidden_file_beside_the_module_is_named_as_left_out(mine):
    """.secrets.json beside the kernel: the snapshot leaves hidden files out, and the failed
    row says so."""
    touched(mine.folder / "minepkg" / ".shapes.json", "{}")
    mine.write("from pathlib import Path\n\ndef run(x: int = 1):\n"
               "    hidden = Path(__file__).with_name('.shapes.json')\n"
               "    return [{'v': len(hidden.read_text())}]\n")  # fmt: skip
    mine(code=1)
    error = mine.rows()["error"][0]
    assert "hidden" in error and ".shapes.json" in error, error


def test_what_a_point_makes_is_its_own_and_what_it_appends_to_or_another_thread_reads_is_not(
    tmp_path,
):
    """A file the point writes anew (or appends to where there was none), or one in a folder it
    made (a temporary folder, a file written in C there and read back), is its own output; a
    file that was there, appended to and read back, and a file another thread reads, are
    reads."""
    import tempfile
    import threading

    import torch

    from harness import reuse

    data, counter = tmp_path / "read.txt", tmp_path / "counter.txt"
    data.write_text("x")
    counter.write_text("1\n")
    with reuse.Watch((), {}) as watch:
        worker = threading.Thread(target=data.read_text)
        worker.start()
        worker.join()
        (tmp_path / "mine.txt").write_text("z")
        (tmp_path / "mine.txt").read_text()
        with open(tmp_path / "log.txt", "a") as log:
            log.write("a line")
        (tmp_path / "log.txt").read_text()
        with open(counter, "a") as appended:
            appended.write("2\n")
        counter.read_text()
        with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
            torch.save(torch.ones(2), Path(scratch) / "t.pt")
            torch.load(Path(scratch) / "t.pt")
    found = {path for path in watch.undeclared() if path.startswith(str(tmp_path))}
    assert found == {str(data), str(counter)}
