"""Reuse copies an answer only where a fresh run would give the same rows
(harness/pinning/reuse.py): every input that decides it is in the key, or read again before a
copy (harness/pinning/reads.py). An experiment of one's own in a folder of its own, run as a
user runs it, each input changed for real between two sweeps, and the store read back."""

import json
import os
import time
from pathlib import Path
from unittest.mock import ANY

import pytest
from commands import call_command

from harness import store

YAML = """# @package _global_
experiment:
  name: mine
  run: {run}
{extra}hydra:
  sweeper:
    params:
      x: 1,2
"""


@pytest.fixture
def mine(harness, tmp_path):
    """A package of one's own, minepkg (its module kernel.py given as text), on PYTHONPATH,
    with an experiment config of its own; mine(*args) runs a sweep of it, mine.rows() reads
    the newest sweep's rows in job order."""
    folder = tmp_path / "mine"
    (folder / "experiment").mkdir(parents=True)
    (folder / "minepkg").mkdir()
    (folder / "minepkg" / "__init__.py").write_text("")
    paths = [str(folder)]

    def write(kernel: str, run: str = "minepkg.kernel.run", extra: str = "") -> None:
        touched(folder / "minepkg" / "kernel.py", kernel)
        (folder / "experiment" / "mine.yaml").write_text(YAML.format(run=run, extra=extra))

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


def touched(path: Path, text: str) -> None:
    """The file written with a modification time of its own, a second on (the file system's
    granularity would hide an edit within it)."""
    path.write_text(text)
    stamp = time.time_ns() + 10**9
    os.utime(path, ns=(stamp, stamp))


def copied_until(mine, change, values: list, *args: str):
    """The sweep of `args` again: every answer copied; once change() is made, the next runs
    every point again and gives `values`. That last sweep's result."""
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


def test_the_run_target_decides_an_answer(mine):
    mine.write("def run(x: int = 1):\n    return [{'v': x}]\n\n"
               "def doubled(x: int = 1):\n    return [{'v': 2 * x}]\n")  # fmt: skip
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
    in the snapshot), and an edit of it is new code."""
    mine.write("import json\nfrom pathlib import Path\n\ndef run(x: int = 1):\n"
               "    heads = json.loads(Path(__file__).with_name('shapes.json').read_text())\n"
               "    return [{'heads': heads['heads'] * x}]\n")  # fmt: skip
    data = mine.folder / "minepkg" / "shapes.json"
    touched(data, '{"heads": 8}')
    mine()
    assert mine.rows()["heads"].tolist() == [8, 16]
    touched(data, '{"heads": 4}')
    mine()
    rows = mine.rows()
    assert rows["heads"].tolist() == [4, 8] and reused(rows) == [False, False]
    assert set(rows["files_read"]) == {"{}"}, "a file of the snapshot is pinned, not a read"


def test_a_file_a_parameter_names_is_read_again_before_a_copy(mine, tmp_path):
    """A path parameter: its file is recorded as read, with its digest; unchanged, the answer
    is copied; edited, the point runs again; the rows and status name the file."""
    mine.write("from pathlib import Path\n\ndef run(x: int = 1, data: str = ''):\n"
               "    return [{'v': int(Path(data).read_text()) * x}]\n")  # fmt: skip
    data = tmp_path / "elsewhere" / "numbers.txt"
    data.parent.mkdir()
    touched(data, "3")
    mine(f"+data={data}")
    first = mine.rows()
    assert json.loads(first["files_read"][0]) == {str(data.resolve()): json.loads(
        first["files_read"][0])[str(data.resolve())]}  # fmt: skip
    result = copied_until(mine, lambda: touched(data, "5"), [5, 10], f"+data={data}")
    assert f"{data.resolve()} (2 points)" in result.stdout


def test_a_helper_imported_from_another_folder_is_read_again_before_a_copy(mine, tmp_path):
    """A module of the user's on PYTHONPATH outside the experiment's package: not pinned, but
    recorded as read, and its edit runs the points again."""
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    touched(helpers / "scale.py", "FACTOR = 3\n")
    mine.paths.append(str(helpers))
    mine.write("import scale\n\ndef run(x: int = 1):\n    return [{'v': scale.FACTOR * x}]\n")
    mine()
    assert str((helpers / "scale.py").resolve()) in mine.rows()["files_read"][0]
    copied_until(mine, lambda: touched(helpers / "scale.py", "FACTOR = 7\n"), [7, 14])


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


def test_a_timing_experiment_measures_again_unless_it_asks_for_reuse(mine):
    """A point that timed a call (harness.measuring) is measured again with the default reuse,
    and nothing is recorded for it; reuse=true (the experiment's, or the command line's) copies
    it; reuse=false records nothing."""
    mine.write("from harness.measuring.timing import time_call\n\ndef run(x: int = 1):\n"
               "    return [{**time_call(lambda: sum(range(100)), min_repeats=3, "
               "min_time_s=0)}]\n")  # fmt: skip
    mine()
    mine()
    assert reused(mine.rows()) == [False, False]
    answers = mine.harness.results / "experiment=mine" / "_answers"
    assert not answers.exists() or not list(answers.rglob("*.json"))
    mine("reuse=true")
    mine("reuse=true")
    assert reused(mine.rows()) == [True, True]
    mine("reuse=false")
    assert reused(mine.rows()) == [False, False]


def test_a_pipe_among_the_answers_is_skipped(mine):
    """A FIFO where an answer's hint would be: read as no hint, and the sweep goes on (it would
    block every sweep of that config)."""
    mine.write("def run(x: int = 1):\n    return [{'v': x}]\n")
    mine()
    hint = next((mine.harness.results / "experiment=mine" / "_answers").rglob("*.json"))
    os.mkfifo(hint.with_name("20991231-000000-0000.0.json"))
    mine()
    assert reused(mine.rows()) == [True, True]


def test_a_file_a_helper_reads_as_it_is_imported_is_read_again_before_a_copy(mine, tmp_path):
    """A helper module on PYTHONPATH reads its data once, as it is imported (before any point
    runs): that file is recorded for every point of the process, with the digest it had then."""
    helpers, data = tmp_path / "helpers", tmp_path / "scale.txt"
    helpers.mkdir()
    touched(data, "3")
    touched(
        helpers / "loaded.py",
        f"from pathlib import Path\nSCALE = int(Path({str(data)!r}).read_text())\n",
    )
    mine.paths.append(str(helpers))
    mine.write("import loaded\n\ndef run(x: int = 1):\n    return [{'v': loaded.SCALE * x}]\n")
    mine()
    assert str(data.resolve()) in mine.rows()["files_read"][0]
    copied_until(mine, lambda: touched(data, "5"), [5, 10])


def test_a_path_read_relative_to_the_working_directory_is_read_there(mine, tmp_path):
    """rel.txt read from one folder, then the same sweep run from another, whose rel.txt
    differs: the answer is not copied, as a fresh run there reads the other file."""
    mine.write("from pathlib import Path\n\ndef run(x: int = 1):\n"
               "    return [{'v': int(Path('rel.txt').read_text()) * x}]\n")  # fmt: skip
    here, there = tmp_path / "here", tmp_path / "there"
    for folder, value in ((here, "8"), (there, "100")):
        folder.mkdir()
        touched(folder / "rel.txt", value)
    mine(cwd=here)
    assert json.loads(mine.rows()["files_read"][0]) == {"rel.txt": ANY}
    mine(cwd=here)
    assert reused(mine.rows()) == [True, True]
    mine(cwd=there)
    rows = mine.rows()
    assert rows["v"].tolist() == [100, 200] and reused(rows) == [False, False]


def test_a_folder_a_point_listed_is_listed_again_before_a_copy(mine, tmp_path):
    """A glob's folder: a file added to it runs the points again (a fresh run would see it)."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    touched(folder / "a.txt", "1")
    mine.write(
        "from pathlib import Path\n\ndef run(x: int = 1, inputs: str = ''):\n"
        "    return [{'v': sum(int(p.read_text()) for p in Path(inputs).glob('*.txt'))}]\n"
    )
    mine(f"+inputs={folder}")
    copied_until(mine, lambda: touched(folder / "b.txt", "2"), [3, 3], f"+inputs={folder}")


def test_a_file_under_the_out_folder_that_the_harness_did_not_write_is_a_read(mine, tmp_path):
    data = tmp_path / "outputs" / "data" / "n.txt"
    data.parent.mkdir(parents=True)
    touched(data, "2")
    mine.write("from pathlib import Path\n\ndef run(x: int = 1, data: str = ''):\n"
               "    return [{'v': int(Path(data).read_text()) * x}]\n")  # fmt: skip
    mine(f"+data={data}")
    touched(data, "4")
    mine(f"+data={data}")
    rows = mine.rows()
    assert rows["v"].tolist() == [4, 8] and reused(rows) == [False, False]


def test_a_pipe_a_point_reads_is_no_file_and_hangs_nothing(mine, tmp_path):
    """A point that reads a named pipe (fed by a thread of its own): its reads are recorded
    without opening the pipe again, and the sweep ends."""
    pipe = tmp_path / "feed"
    os.mkfifo(pipe)
    mine.write("import threading\n\ndef run(x: int = 1, pipe: str = ''):\n"
               "    def feed():\n        with open(pipe, 'w') as f:\n            f.write(str(x))\n"
               "    threading.Thread(target=feed).start()\n"
               "    with open(pipe) as f:\n        return [{'v': int(f.read())}]\n")  # fmt: skip
    mine(f"+pipe={pipe}")
    assert mine.rows()["v"].tolist() == [1, 2]


def test_a_threads_setting_equal_to_the_default_reuses_its_answers(mine):
    """threads is no key of the config's own: the count a point ran with is (its kind of
    machine), so threads=N where N is what the point had anyway copies the answer."""
    import torch

    mine.write("def run(x: int = 1):\n    return [{'v': x}]\n")
    mine()
    mine(f"threads={torch.get_num_threads()}")
    assert reused(mine.rows()) == [True, True]


def test_a_resume_whose_config_decides_other_answers_than_planned_is_refused(mine):
    """The YAML's seed changed before a resume: its points would run another seed under the
    planned points' config_hash; one line, exit 2, nothing run."""
    mine.write("def run(x: int = 1):\n    if x == 2:\n        raise ValueError('two')\n"
               "    return [{'v': x}]\n", extra="seed: 0\n")  # fmt: skip
    mine(code=1)
    sweep = store.newest_sweep(mine.harness.results, "mine")
    mine.write("def run(x: int = 1):\n    return [{'v': x}]\n", extra="seed: 1\n")
    refused = mine(f"resume={sweep}", code=2)
    assert refused.stderr.count("\n") == 1 and "seed is 1 in the config now" in refused.stderr


@pytest.mark.parametrize("setting", ["reuse=0", "reuse=1", "seed=abc", "seed=1.5", "code=old"])
def test_a_setting_of_the_wrong_kind_is_one_line(mine, setting):
    mine.write("def run(x: int = 1):\n    return [{'v': x}]\n")
    refused = mine(setting, code=2)
    assert refused.stderr.count("\n") == 1, refused.stderr


def test_a_file_looked_for_beside_the_code_but_not_pinned_says_why(mine, tmp_path):
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


def test_a_file_an_earlier_point_read_into_a_cache_counts_for_the_points_after(mine, tmp_path):
    """The points of a sweep run one after another in one process: a loader cached by the
    first point (functools.cache) serves the second without a read; an edit of the file runs
    both again."""
    data = tmp_path / "cached.txt"
    touched(data, "4")
    mine.write("import functools\nfrom pathlib import Path\n\n@functools.cache\n"
               f"def load():\n    return int(Path({str(data)!r}).read_text())\n\n"
               "def run(x: int = 1):\n    return [{'v': load() * x}]\n")  # fmt: skip
    mine()
    assert all(str(data.resolve()) in read for read in mine.rows()["files_read"])
    touched(data, "6")
    mine()
    rows = mine.rows()
    assert rows["v"].tolist() == [6, 12] and reused(rows) == [False, False]


def test_an_optional_file_looked_for_and_absent_is_looked_for_again(mine, tmp_path):
    """A point that reads a file where there is one: absent, that is recorded too, and the
    answer is not copied once the file is there."""
    extra = tmp_path / "extra.txt"
    mine.write("def run(x: int = 1):\n    try:\n"
               f"        with open({str(extra)!r}) as f:\n"
               "            return [{'v': x + int(f.read())}]\n"
               "    except FileNotFoundError:\n        return [{'v': x}]\n")  # fmt: skip
    mine()
    copied_until(mine, lambda: touched(extra, "100"), [101, 102])


def test_what_a_library_lists_on_the_import_path_is_no_read(mine, tmp_path):
    """A library that looks a package's version up (importlib.metadata lists every folder on the
    import path, the working directory among them) reads nothing of the point's: a file added
    to the working directory since changes no answer."""
    mine.write("from importlib import metadata\n\ndef run(x: int = 1):\n"
               "    return [{'v': x, 'torch': metadata.version('torch')}]\n")  # fmt: skip
    mine()
    touched(tmp_path / "notes.txt", "a new file here")
    mine()
    assert reused(mine.rows()) == [True, True]


def test_what_a_thread_reads_while_another_is_paused_is_recorded(tmp_path):
    """reads.paused() keeps the harness's own reading out of a point's (a row landed by the
    tracker's thread): another thread's reads meanwhile are the point's, and recorded."""
    import threading

    from harness.pinning import reads

    data = tmp_path / "read.txt"
    data.write_text("x")
    inside, done = threading.Event(), threading.Event()

    def harness_work():
        with reads.paused():
            inside.set()
            done.wait(30)

    with reads.recorded((), frozenset(), frozenset()) as recording:
        worker = threading.Thread(target=harness_work)
        worker.start()
        inside.wait(30)
        data.read_text()
        done.set()
        worker.join()
    assert str(data.resolve()) in recording.files_read()
