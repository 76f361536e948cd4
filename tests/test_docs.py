"""The README's and docs/'s commands, run as written, as a doctest would: each page's blocks in
order in an empty folder of its own.

- A line "`PATH`:" then a fenced block: the block is that file's text, written first.
- A ```sh block runs in bash (`set -e`), a ```python block in Python; each must exit 0, or
  the N that an `<!-- exits N -->` line just above it says, and write no traceback. A sh
  block of nothing but `python -m harness|analysis ...` lines (and `export NAME=VALUE`) runs
  its lines as calls of the commands' mains in this process, one after another as bash would
  (the same argv, the same environment, the first that fails ends the block): a process
  start each is what tests/test_install.py pays, where the commands run installed.
- An `<!-- not run: REASON -->` line above a block leaves it out, saying why.
- Any other block (a tree, a YAML shown but not written) is text.
"""

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from commands import call_command

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("sh", "python")
COMMANDS = re.compile(r"^(python -m |python3 -m |pip |make )", re.M)  # what a run block holds
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.S | re.M)
MARK = re.compile(r"<!-- (not run: (?P<why>.+?)|exits (?P<code>\d+)) -->\s*$")
FILE = re.compile(r"^`(?P<path>[\w./-]+)`:\s*$")
TIMEOUT_S = 600


@dataclass
class Block:
    language: str
    text: str
    line: int  # where its fence opens, from 1
    skipped: str | None = None  # the reason it is not run
    exits: int = 0
    path: str | None = None  # the file it is the text of


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, with what the line above each says about it."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, match.start()) + 1
        block = Block(match[1], match[2], line)
        if mark := MARK.search(before):
            block.skipped = mark["why"]
            block.exits = int(mark["code"] or 0)
        elif named := FILE.match(before):
            block.path = named["path"]
        found.append(block)
    return found


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.language in RUN and not b.skipped and not b.path]


def test_every_page_is_linked_from_the_readme_and_every_link_leads_somewhere():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", readme))
    assert linked == {f"docs/{p.name}" for p in PAGES[1:]}, "a page the README does not list"
    for page in PAGES:
        for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} links to {target}"


def test_every_block_of_commands_is_run_or_says_why_not():
    """A block that holds commands is a sh block, so that it runs; one left out says why; a
    file block names a relative path inside the folder."""
    for page in PAGES:
        for block in blocks(page):
            where = f"{page.relative_to(ROOT)}:{block.line}"
            if COMMANDS.search(block.text) and not block.path:
                assert block.language in RUN, f"{where}: commands in a ```{block.language} block"
            if block.skipped is not None:
                assert len(block.skipped) > 10, f"{where}: say why it is not run"
            if block.path:
                assert not block.path.startswith("/") and ".." not in block.path, where
    assert sum(len(runnable(page)) for page in PAGES) >= 8, "the parser found no blocks"


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [p for p in PAGES if runnable(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_commands_of_a_page_run_as_written(page, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    for block in blocks(page):
        if block.path:
            (tmp_path / block.path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / block.path).write_text(block.text)
    for block in runnable(page):
        calls = in_process(block)
        if calls is not None:
            done = _called(calls, tmp_path)
        else:
            command = (["bash", "-e", "-o", "pipefail", "-c", block.text] if block.language == "sh"
                       else [sys.executable, "-c", block.text])  # fmt: skip
            done = subprocess.run(
                command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
            )
        said = f"{page.name}:{block.line} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert done.returncode == block.exits, said
        assert "Traceback" not in done.stderr, said


CALLED = re.compile(r"python3? -m (harness|analysis)(\s.*)?")
EXPORT = re.compile(r"export (\w+)=(\S+)")


def in_process(block: Block) -> list[tuple[str, list[str] | dict]] | None:
    """A sh block's lines as calls in this process, (module, argv) or ("export", {NAME: VALUE}),
    comments dropped; None for a block with anything else (a pipe, a $(...), another program)."""
    if block.language != "sh":
        return None
    calls = []
    for line in block.text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        text = shlex.join(words)
        if (called := CALLED.fullmatch(text)) and not set("|;&<>$`") & set(text):
            calls.append((called[1], words[3:]))
        elif (exported := EXPORT.fullmatch(text)) and not set("$`") & set(text):
            calls.append(("export", {exported[1]: exported[2]}))
        else:
            return None
    return calls


def _called(calls: list, cwd: Path) -> subprocess.CompletedProcess:
    """The calls one after another, as `bash -e` runs their lines: the first that exits other
    than 0 ends them; what all printed, and that exit code."""
    env, out, err, code = {}, [], [], 0
    for module, argv in calls:
        if module == "export":
            env |= argv
            continue
        done = call_command(module, *argv, cwd=cwd, env=env, timeout=TIMEOUT_S)
        out.append(done.stdout)
        err.append(done.stderr)
        if done.returncode:
            code = done.returncode
            break
    return subprocess.CompletedProcess(calls, code, "".join(out), "".join(err))
