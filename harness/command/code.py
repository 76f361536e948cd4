"""python -m harness code: the files of the code a sweep pinned (its snapshot in the code
store, harness.pinning.codestore), the files that differ between two sweeps' code and their
unified diff, and the code store rid of the codes no sweep kept ran (prune)."""

import difflib
import os
import sys
from pathlib import Path

from harness import store
from harness.command.status import pinned_sweep
from harness.errors import BadInput
from harness.pinning import boot, codestore


def code(ids: list[str], out: str, code_store: str | None) -> int:
    """python -m harness code SWEEP [OTHER]: the files of the code a sweep pinned, or which
    files differ between two sweeps' code and their unified diff."""
    results, kept = Path(out).resolve() / "results", codestore.store_of(code_store)
    digests = []
    for sweep_id in ids:
        sweep_id, _, digest = pinned_sweep(results, sweep_id)
        digests.append((sweep_id, digest))
    if len(digests) == 1:
        ((sweep_id, digest),) = digests
        found = listing(kept, digest)
        print(f"sweep {sweep_id}: code {digest}, {len(found)} files in {kept}")
        for rel, path in found.items():
            print(f"{rel}  {path.stat().st_size:,} bytes")
        return 0
    (old_id, old), (new_id, new) = digests
    if old == new:
        print(f"sweeps {old_id} and {new_id} ran the same code {old}")
        return 0
    changed, text = diff(kept, old, new, (old_id, new_id))
    print(f"sweeps {old_id} ({old}) and {new_id} ({new}): {len(changed)} files differ: "
          f"{', '.join(changed)}")  # fmt: skip
    sys.stdout.write(text)
    return 0


def prune_code(outs: list[str], code_store: str | None) -> int:
    """python -m harness code prune [out=DIR ...]: the code store rid of every code that no
    sweep under these out folders ran (but those pinned in the last hour: a sweep being planned
    now), of the bundles no code left names, and of what pins killed midway left."""
    named = set()
    for out in outs:
        results = Path(out).resolve() / "results"
        if not results.is_dir():
            raise BadInput(f"{out} holds no store (results/): name the out folders whose sweeps "
                           "keep their code (out=DIR, once each)")  # fmt: skip
        for experiment in store.experiments(results):
            for sweep in store.sweeps(results, experiment):
                named |= _codes_of(store.SweepPaths(results, experiment, sweep))
    kept = codestore.store_of(code_store)
    removed, freed = codestore.prune(kept, named)
    print(f"code store {kept}: {len(removed)} codes removed ({freed / 2**20:,.1f} MiB freed); "
          f"kept the codes of the sweeps under {', '.join(outs)} and those pinned within the "
          "hour")  # fmt: skip
    return 0


def _codes_of(sweep: store.SweepPaths) -> set[str]:
    """The codes a sweep ran: its manifest's, and each its rows name (a code=current resume's);
    BadInput where its manifest cannot be read (prune would remove what it pinned)."""
    manifest = store.read_manifest(sweep)
    if manifest is None:
        raise BadInput(
            f"sweep {sweep.sweep} ({sweep.experiment}) has no readable manifest in {sweep.root}: "
            "prune keeps the code of each sweep it can read; mend or remove it first"
        )
    rows = store.read_table(sweep.root, sweep.experiment, sweep.sweep, partitions=False)
    ran = store.values(rows, "code_digest") if "code_digest" in rows.column_names else []
    return {code for code in [manifest.get("code_digest"), *ran] if isinstance(code, str)}


def listing(code_store: Path, digest: str) -> dict[str, Path]:
    """The files of the snapshot of `digest` by relative path (the experiment's own first);
    BadInput when the code store has no such snapshot."""
    pinned = codestore.verify(code_store, digest)
    found: dict[str, Path] = {}
    for folder in pinned.folders:
        for where, _, names in os.walk(folder):
            for name in names:
                path = Path(where) / name
                found.setdefault(path.relative_to(folder).as_posix(), path)
    return found


def diff(code_store: Path, old: str, new: str, names: tuple[str, str]) -> tuple[list[str], str]:
    """The files that differ between two snapshots, and their unified diff."""
    before, after = listing(code_store, old), listing(code_store, new)
    changed, lines = [], []
    for rel in sorted(set(before) | set(after)):
        a = before[rel].read_text(errors="replace").splitlines(True) if rel in before else []
        b = after[rel].read_text(errors="replace").splitlines(True) if rel in after else []
        if a == b:
            continue
        changed.append(rel)
        lines += difflib.unified_diff(a, b, f"{names[0]}/{rel}", f"{names[1]}/{rel}")
    return changed, "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def differing(code_store: Path, old: str, new: str) -> int | None:
    """How many files differ between two snapshots; None where either is not in the code
    store."""
    try:
        before, after = listing(code_store, old), listing(code_store, new)
    except BadInput:
        return None
    old_hashes, new_hashes = ({rel: boot.file_hash(p.read_bytes()) for rel, p in found.items()}
                              for found in (before, after))  # fmt: skip
    return sum(old_hashes.get(rel) != new_hashes.get(rel) for rel in {*old_hashes, *new_hashes})
