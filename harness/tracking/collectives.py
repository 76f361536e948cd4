"""What the processes of a training point of several (harness.running.distributed) do together with
its rows, each call a collective that every rank makes alike: the record a checkpoint keeps of
every rank's rows, and the job's file at the end, which rank 0 writes from every rank's
segments, in rank order, and the rows it returned. A rank whose experiment raised (so that the
group no longer meets) ends alone: its returned rows land as its last segment, for the sweep to
settle (harness.launchers.dispatch.finish). A point of one process does the same by itself.
"""

from pathlib import Path

import pyarrow as pa

from harness import store
from harness.tracking.landing import Landing


def checkpoint(group, state: dict, count: int, numbered: int) -> dict:
    """What save writes: `state`, with the rows that landed (`count`, in `numbered` segments);
    in a group, every rank's, gathered (rank 0 writes it)."""
    if not group:
        return {"state": state, "rows": count, "segments": numbered}
    ranks = group.gather([count, numbered])
    return {"state": state, "ranks": ranks, "world_size": group.world_size}


def end(landing: Landing, group, table: pa.Table | None, raised: bool) -> list[dict]:
    """The point's job file from its segments and `table` (the rows it returned, prepared), or,
    in a group that no longer meets, this rank's last segment; the rows it tells (store.telling).
    Its caller holds landing.writing."""
    if not group:
        return store.end_segments(landing.path, landing.segments, table, landing.statuses)
    if not raised:
        try:
            return _end_group(landing, group, table)
        except RuntimeError as error:  # a process of the group is gone: this one ends alone
            said = f"a process of the point's group is gone at its end: {error}"
            table = store.rows_to_table([landing.prepare({"status": "failed", "error": said})])
    return _end_alone(landing, table)


def _end_group(landing: Landing, group, table: pa.Table | None) -> list[dict]:
    """end's job file in a group: rank 0 writes it from every rank's segments, in rank order,
    and its own returned rows; the rows it tells, on every rank."""
    own = [[str(segment) for segment in landing.segments], landing.statuses, landing.landed]
    ranks = group.gather(own)
    told = None
    if not group.rank:
        segments, statuses, first = [], {}, 0
        for listed, numbered, landed in ranks:
            segments += [Path(segment) for segment in listed]
            statuses |= {first + number: status for number, status in numbered.items()}
            first += landed
        try:
            told = store.end_segments(landing.path, segments, table, statuses)
        except OSError:
            group.first(None)
            raise
    told = group.first(told)
    if told is None:
        raise OSError(f"rank 0 could not write {landing.path}")
    return told


def _end_alone(landing: Landing, table: pa.Table | None) -> list[dict]:
    """end of a rank whose experiment raised: its returned rows (their status kept) land as its
    last segment; the rows it tells."""
    if table is None:
        return []
    landing.fresh_start()  # a run that restored nothing: its earlier rows go first
    segment = landing.segment_file(len(landing.segments) + 1)
    store.write_file(segment, table, sync=False)
    landing.segments.append(segment)
    return store.telling(table)
