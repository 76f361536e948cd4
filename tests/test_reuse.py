"""Reuse copies an answer only where a fresh run would give the same rows
(harness/pinning/reuse.py): every input that decides it is in the key, or read again before a
copy (harness/pinning/reads.py). An experiment of one's own in a folder of its own, run as a
user runs it, each input changed for real between two sweeps, and the store read back."""

import json
import os
import time
from pathlib import Path

import pytest

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

    def run(*args: str, env: dict | None = None):
        given = {"PYTHONPATH": os.pathsep.join(paths), **(env or {})}
        result = harness("--config-dir", str(folder), "+experiment=mine",
                         f"code_store={tmp_path / 'codes'}", *args, env=given)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
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
    mine(f"+data={data}")
    assert reused(mine.rows()) == [True, True]
    touched(data, "5")
    result = mine(f"+data={data}")
    rows = mine.rows()
    assert rows["v"].tolist() == [5, 10] and reused(rows) == [False, False]
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
    mine()
    assert reused(mine.rows()) == [True, True]
    touched(helpers / "scale.py", "FACTOR = 7\n")
    mine()
    rows = mine.rows()
    assert rows["v"].tolist() == [7, 14] and reused(rows) == [False, False]


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
