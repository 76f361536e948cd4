"""An experiment of one's own, as a researcher writes one (docs/own-experiments.md): its YAML in a
config dir of their own (FOLDER/experiment/NAME.yaml, running PACKAGE.kernel.run) and its
package beside it, which the commands find on PYTHONPATH."""

import os
import subprocess
import time
from pathlib import Path


class OwnExperiment:
    def __init__(self, folder: Path, name: str, package: str, more: str = ""):
        """Write its YAML (`more`: lines after its experiment block's name and run) and its
        package's __init__.py under `folder`; its kernel is edit()'s."""
        self.folder, self.name, self.package = Path(folder), name, package
        (self.folder / "experiment").mkdir(parents=True)
        (self.folder / package).mkdir()
        (self.folder / package / "__init__.py").write_text("")
        (self.folder / "experiment" / f"{name}.yaml").write_text(
            f"# @package _global_\nexperiment:\n  name: {name}\n  run: {package}.kernel.run\n{more}"
        )
        self.stamp = 0

    @property
    def args(self) -> list[str]:
        """What a command line names it by: its config dir and +experiment=NAME."""
        return ["--config-dir", str(self.folder), f"+experiment={self.name}"]

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.folder)}

    def edit(self, text: str) -> None:
        """Its kernel.py, written anew: with a modification time a second past the last one's,
        and past now, so that an edit within the file system's granularity is seen as one."""
        path = self.folder / self.package / "kernel.py"
        path.write_text(text)
        self.stamp = max(time.time_ns(), self.stamp) + 10**9
        os.utime(path, ns=(self.stamp, self.stamp))

    def commit(self, message: str) -> str:
        """Its folder committed as it is (a git repository made the first time); the commit."""
        return commit_all(self.folder, message)


def commit_all(folder: Path, message: str) -> str:
    """Everything in `folder` committed by a researcher (a git repository made where there is
    none); the commit."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    if not (folder / ".git").exists():
        git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=A Researcher", "-c", "user.email=r@example.org", "commit", "-qm", message)
    return git("rev-parse", "HEAD")
