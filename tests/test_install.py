"""Installed as a user installs it, not run from the checkout: a wheel built from a clean copy of
the source tree, installed into a fresh venv, runs a researcher's own experiment (a folder of
their own, --config-dir) and a built-in one from an empty folder, the repository nowhere on the
path. The fresh venv borrows the test venv's dependencies (a path in a .pth file, whose own
.pth files, the checkout's editable install among them, are not read), so nothing is
downloaded."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_SOURCE = (".git", ".venv", "outputs", "build", "*.egg-info", "__pycache__", ".*_cache")
# Each folder of the project and the name it installs as (pyproject.toml's package-dir).
PACKAGES = {"harness": "harness", "experiments": "octlm_experiments", "analysis": "octlm_analysis"}

OWN_EXPERIMENT = '''
"""Softcapped attention (scores through cap * tanh(s / cap)) in float32 against float64."""

import os
from pathlib import Path

import torch

from harness.measuring.timing import time_call


def run(*, length: int, cap: float = 30.0, seed: int = 0) -> list[dict]:
    """One row: the float32 error against float64, and the float32 call's timing."""
    once = Path(os.environ["FAIL_ONCE"])
    if once.exists():  # the first point to see it fails, as asked, and takes it away
        once.unlink()
        raise RuntimeError("failing once, as asked")
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, length, 16, generator=generator, dtype=torch.float64)
               for _ in range(3))

    def attend(q, k, v):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return torch.softmax(cap * torch.tanh(scores / cap), dim=-1) @ v

    exact = attend(q, k, v)
    rounded = attend(q.float(), k.float(), v.float())
    timing = time_call(lambda: attend(q.float(), k.float(), v.float()), min_time_s=0.01)
    return [{"err64": (rounded.double() - exact).abs().max().item(), **timing}]
'''

OWN_CONFIG = """# @package _global_
experiment:
  name: softcap
  run: softcap.run
  table: {index: length, values: err64}
  claims:
    # Rounding: about 1e-7. Zero would mean float64 ran twice; 1e-5, a real error.
    - {metric: err64, min: 1.0e-10, max: 1.0e-5, text: float32 is float64 up to rounding}
length: 64
cap: 30.0
hydra:
  sweeper:
    params:
      length: 64,128
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the source tree (what a clean checkout holds)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work), str(source)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    (built,) = work.glob("octlm_harness-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed, its dependencies the test venv's."""
    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(folder)}))
    borrowed = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "borrowed_dependencies.pth").write_text("".join(f"{path}\n" for path in borrowed))
    python = folder / "bin" / "python"
    install = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, timeout=300)
    return folder


@pytest.mark.process
def test_the_wheel_holds_every_module_and_config_of_the_source_tree(wheel):
    held = set(zipfile.ZipFile(wheel).namelist())
    modules = [Path(name) / p.relative_to(ROOT / top) for top, name in PACKAGES.items()
               for p in (ROOT / top).rglob("*.py")]  # fmt: skip
    configs = [Path("harness") / p.relative_to(ROOT) for p in (ROOT / "conf").rglob("*.yaml")]
    missing = sorted(str(path) for path in [*modules, *configs] if str(path) not in held)
    assert not missing, f"the wheel lacks {len(missing)} files: {', '.join(missing[:20])}"
    assert not [name for name in held if name.startswith(("tests/", "conf/", "experiments/",
                                                           "analysis/"))]  # fmt: skip


@pytest.mark.slow
@pytest.mark.process
def test_an_installed_harness_runs_a_researchers_own_experiment_from_an_empty_folder(
    venv, tmp_path
):
    """From an empty folder: --help, a sweep of one's own experiment with a point that fails,
    status, resume, the same experiment on the local launcher's warm workers, a grid of
    exp014_tiled, and the report with its claims checked and its page written."""
    (tmp_path / "mine" / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "softcap.py").write_text(OWN_EXPERIMENT)
    (tmp_path / "mine" / "conf" / "experiment" / "softcap.yaml").write_text(OWN_CONFIG)
    work = tmp_path / "work"  # the empty folder the commands run in
    work.mkdir()
    once = tmp_path / "fail-once"
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(tmp_path / "mine"),
        "FAIL_ONCE": str(once),
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / "python", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip

    mine = ("-m", "harness", "--config-dir", str(tmp_path / "mine" / "conf"), "+experiment=softcap")
    where = run("-c", "import harness, octlm_experiments, octlm_analysis; print(harness.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr

    helped = run(*mine, "--help")
    assert helped.returncode == 0 and "softcap: softcap.run" in helped.stdout, helped.stderr

    once.touch()
    first = run(*mine)
    assert first.returncode == 1, first.stdout + first.stderr  # a point failed, the other ran
    assert "1 ok" in first.stdout and "failing once, as asked" in first.stdout
    sweep = re.search(r"^sweep (\S+): softcap", first.stdout, re.M)[1]
    shown = run("-m", "harness", "status", "last")
    assert shown.returncode == 0 and "failed" in shown.stdout and f"resume={sweep}" in shown.stdout
    assert "did not pin" not in shown.stdout and "read files" not in shown.stdout, shown.stdout
    resumed = run(*mine[:4], f"resume={sweep}")  # as status says, with the --config-dir
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 points to run" in resumed.stdout and "claim PASS" in resumed.stdout

    warm = run(*mine, "hydra/launcher=local", "length=32,48,96")
    assert warm.returncode == 0 and "3 ok" in warm.stdout, warm.stdout + warm.stderr
    assert "err64 by length" in warm.stdout  # the table of one index and its values

    built_in = run("-m", "harness", "+experiment=exp014_tiled", "length=64,128", "block=32")
    assert built_in.returncode == 0, built_in.stdout + built_in.stderr
    assert "2 ok" in built_in.stdout and "claim PASS" in built_in.stdout
    again = run("-m", "harness", "+experiment=exp014_tiled", "length=64,128", "block=32")
    assert "2 points reused" in again.stdout, again.stdout + again.stderr  # its YAML asks
    assert "do not declare" not in built_in.stdout + again.stdout, "the harness's own files"

    config_dir = str(tmp_path / "mine" / "conf")
    report = run("-m", "harness", "report", "--check", "--config-dir", config_dir)
    assert report.returncode == 0, report.stdout + report.stderr
    page = (work / "outputs" / "report" / "index.html").read_text()
    assert "softcap" in page and "exp014_tiled" in page
    assert "err64 by length" in (work / "outputs" / "report" / "REPORT.md").read_text()
    assert not (work / "harness").exists() and not list(work.glob("*.py"))
    assert os.listdir(work) == ["outputs"], "everything it wrote is under outputs/"


@pytest.mark.slow
@pytest.mark.process
def test_a_research_folder_with_its_own_experiments_and_analysis_runs_the_harnesss(venv, tmp_path):
    """A research repository's own experiments/ and analysis/ packages in the working folder
    (the first on the path of python -m): the harness still runs, pins and reports its own. The
    user's packages fail loudly if imported (their __init__ raises), as python -m analysis,
    the user's own, does."""
    work = tmp_path / "research"
    for package in ("experiments", "analysis"):
        (work / package).mkdir(parents=True)
        (work / package / "__init__.py").write_text(
            f"raise RuntimeError('the research folder has its own {package}')\n"
        )
        (work / package / "tiled.py").write_text("def run(**kwargs):\n    return []\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / "python", "-m", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip

    swept = run("harness", "+experiment=exp014_tiled", "length=64,128", "block=32")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "2 ok" in swept.stdout and "claim PASS" in swept.stdout
    pinned = run("harness", "code", "last")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert "octlm_experiments/tiled.py" in pinned.stdout
    listed = [line.split()[0] for line in pinned.stdout.splitlines()[1:]]
    assert not [path for path in listed if path.startswith(("experiments/", "analysis/"))]
    assert "the research folder" not in swept.stdout + swept.stderr + pinned.stdout
    reported = run("harness", "report", "--check")
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "PASS       exp014_tiled" in reported.stdout
    assert "exp014_tiled" in (work / "outputs" / "report" / "REPORT.md").read_text()
    assert "the research folder has its own analysis" in run("analysis").stderr


FAKE_PIP = """#!/bin/sh
# pip's lines as an install prints them, then its exit status
echo "Processing /src/octlm-harness"
echo "Requirement already satisfied: numpy in ./site-packages (2.3.0)"
echo "Collecting torch==2.13.0 (from octlm-harness==0.1.0)"
echo "WARNING: Location 'https://example.invalid/simple' is ignored: it is a non-existing path."
echo "  Using cached torch-2.13.0-cp311-none-linux_x86_64.whl (190 MB)"
echo "Collecting pandas==3.1.1"
echo "Successfully installed pandas-3.1.1 torch-2.13.0"
exit $FAKE_PIP_STATUS
"""


@pytest.mark.process
@pytest.mark.parametrize("status", [0, 1])
def test_make_shows_the_install_as_it_goes_and_fails_when_pip_does(tmp_path, status):
    """The Makefile's install recipe around a stand-in for the venv's python, which prints
    what pip prints: each package numbered against the pinned ones, pip's own noise dropped,
    and a failed install a failed make that leaves nothing marked installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PIP)
    (venv / "bin" / "python").chmod(0o755)
    pinned = sum("==" in line for line in (ROOT / "constraints.txt").read_text().splitlines())
    done = subprocess.run(
        ["make", "-C", str(ROOT), f"VENV={venv}", f"{venv}/.installed"],
        env={"PATH": "/usr/bin:/bin", "FAKE_PIP_STATUS": str(status)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    output = done.stdout
    assert f"installing the harness and its {pinned} pinned packages" in output
    assert f"[1 of ~{pinned}] Processing /src/octlm-harness" in output
    assert f"[2 of ~{pinned}] Collecting torch==2.13.0" in output
    assert f"[3 of ~{pinned}] Collecting pandas==3.1.1" in output
    assert "Using cached torch" in output and "Successfully installed" in output
    lines = output.splitlines()  # make's echo of the recipe names the dropped lines too
    assert not [line for line in lines if line.startswith(("Requirement", "WARNING: Location"))]
    assert (done.returncode == 0) == (status == 0), done.stderr
    assert (venv / ".installed").exists() == (status == 0)
