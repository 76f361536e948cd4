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
