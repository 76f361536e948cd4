"""The README's own example of an experiment outside the repository, run as written: its files
(a line `mine/PATH`: then a fenced block) and its shell block, in an empty folder."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> tuple[dict[str, str], list[str]]:
    """The example's files by path, and its shell lines."""
    text = README.read_text()
    files = dict(re.findall(r"^`(mine/[^`]+)`:\n\n```\w*\n(.*?)```", text, re.S | re.M))
    (shell,) = re.findall(r"```sh\n(export PYTHONPATH=mine\n.*?)```", text, re.S)
    return files, shell.strip().splitlines()


@pytest.mark.slow
def test_the_readme_example_of_an_experiment_of_ones_own_runs_as_written(tmp_path):
    files, lines = example()
    assert set(files) == {"mine/sdpa_rounding.py", "mine/conf/experiment/sdpa_rounding.yaml"}
    for path, content in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    script = "set -e\n" + "\n".join(lines)
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "length    int" in result.stdout  # --help's parameters
    assert result.stdout.count("claim PASS: SDPA in float32 is its float64 answer") == 2
    assert "PASS       sdpa_rounding" in result.stdout  # python -m analysis --check
