"""Installed, not run from the checkout: a built wheel (conf/ shipped inside it) runs the
README's quick start from a scratch directory, the repository nowhere on the path."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_SOURCE = (".git", ".venv", "outputs", "build", "*.egg-info", "__pycache__", ".*_cache")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder holding the wheel's packages, installed from a copy of the source tree."""
    work = tmp_path_factory.mktemp("install")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "wheel")]
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (work / "wheel").glob("octlm_harness-*.whl")
    site = work / "site"
    install = [*pip, "install", "--no-deps", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    return site


def run(*args: str, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    """python ARGS in cwd, with only the installed folder on the path."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(cwd)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_the_installed_packages_are_the_wheels_with_its_conf(installed, tmp_path):
    code = "import harness, analysis, harness.names as c; print(harness.__file__, c.CONF)"
    result = run("-c", code, site=installed, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    module, conf = result.stdout.split()
    assert Path(module).is_relative_to(installed) and Path(conf) == installed / "harness" / "conf"
    assert (Path(conf) / "experiment" / "exp014_tiled.yaml").is_file()


@pytest.mark.slow
def test_the_quick_start_runs_from_a_scratch_directory(installed, tmp_path):
    listed = run("-m", "harness", "--help", site=installed, cwd=tmp_path)
    assert "exp014_tiled" in listed.stdout, listed.stderr
    shown = run(
        "-m", "harness", "+experiment=exp014_tiled", "--cfg", "job", site=installed, cwd=tmp_path
    )  # fmt: skip
    assert shown.returncode == 0 and "name: exp014_tiled" in shown.stdout, shown.stderr
    swept = run(
        "-m", "harness", "+experiment=exp014_tiled", "length=64,128", "block=32",
        site=installed, cwd=tmp_path,
    )  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    assert "2 ok" in swept.stdout and "claim PASS" in swept.stdout
    report = run("-m", "analysis", "--check", site=installed, cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert (tmp_path / "outputs" / "report" / "REPORT.md").is_file()


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
