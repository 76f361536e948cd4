"""The Parquet result store: one file per job under ROOT/experiment=NAME/sweep=ID/.

A job's rows are written whole or not at all (harness.files: a temporary name, renamed; page
checksums and a digest of the rows, checked when read), so a reader never sees a partial file,
and a job that runs again (resume, a SLURM requeue) replaces its own file instead of adding
rows. The experiment and sweep live in the Hive-style path, not in the files, so pyarrow,
pandas and DuckDB all read them as partition columns. Sweep-level files (the
manifest, package lists, the compaction lock) start with "_", which those readers skip; ROOT's
file "columns" holds the schema of every file, which pyarrow's and pandas' folder readers take
as theirs (harness.store.common_schema).

A training job that is still running lands its rows as segments, append-only files beside its
job file (job-N.part-K.parquet, K = 1, 2, ...: the rows logged since the previous one, status
"running", written as any row file is), and writes its job file once when it ends, which
replaces them (`write_rows(..., replacing=segments(path))`). A point that runs as several
processes (harness.running.distributed) lands each one's rows as segments of its own,
job-N.rank-R.part-K.parquet, read after one another by rank; its rank 0 writes the job file.

A finished sweep's job files can be merged into one, compacted-N.parquet (`compact`). The rule
that keeps every row exactly once for `read`, even while a compaction runs or a training job
ends: each job's rows come from one place, its own job file when it has one (a job file is never
older than its segments or the compacted rows of its job), else its segments in order, else the
newest compacted file holding the job. A plain folder reader (pandas, pyarrow, DuckDB over
*.parquet) sees what lies there: each row once, except in the moment between a job file's rename
and the removal of the segments it replaces, and in the one between a restore's writing an
ended job's checkpointed rows back as its first segment and its removing the job file (signals
are held off meanwhile: only a SIGKILL can leave both, and `read` still sees each row once; the
job's next run, or the sweep's compaction, removes the segments a job file replaced).

A file that cannot be trusted is skipped by every reader, named once per process on stderr,
and its point counts as not run: one that cannot be read, fails its Parquet page checksums,
whose rows no longer match the digest written into its metadata (a flipped byte that Parquet
itself would read as another value) or carries none, or a job file holding another job's
rows. Resume reads the sweep, moves the files that read skipped aside (set_aside) under a
name no Parquet reader lists, and reruns their points.


Its rooms: harness.store.layout (where a sweep's and a job's files lie, SweepPaths and JobPaths;
names, columns, locks and marks), .manifest (the
manifest, the listing of sweeps), .rows (row tables and their files), .reading (the reading
rule, statuses, planned points) and .compaction (merging, releasing, setting aside). This
package is the one surface the rest of the harness uses.
"""

from harness.store.compaction import (  # noqa: F401
    compact,
    prune,
    release,
    set_aside,
)
from harness.store.layout import (  # noqa: F401
    COMPACTED,
    DONE,
    GENERATED,
    HARNESS_COLUMNS,
    JOB,
    LOCK,
    MANIFEST,
    MANIFEST_KINDS,
    PARTITIONS,
    READ_ATTEMPTS,
    RESERVED,
    ROW_SETS,
    ROW_STATUSES,
    RUN_LOCK,
    RUNNING,
    RUNNING_MARK,
    SEGMENT,
    SET_ASIDE,
    Claimed,
    JobPaths,
    SweepPaths,
    claim,
    hold_running,
    read_job_file,
    release_running,
    run_by,
    segment_file,
    segment_number,
    segment_rank,
    segments,
    skipped,  # noqa: F401
    still_running,
)
from harness.store.manifest import (  # noqa: F401
    TAG,
    experiment_of,
    experiments,
    named_sweep,
    newest_sweep,
    read_manifest,
    sweeps,
    write_manifest,
)
from harness.store.reading import (  # noqa: F401
    LAST,
    as_planned,
    has_rows,
    job_statuses,
    jobs_with_rows,
    parameter_columns,
    read,
    read_table,
    result_files,
    status_counts,
)
from harness.store.rows import (  # noqa: F401
    PLAIN_TYPES,
    SET,
    as_running,
    check_columns,
    check_values,
    concat,
    end_segments,
    first_numbers,
    job_rows,
    job_table,
    metrics,
    rows_to_table,
    segment_table,
    settled,
    settled_table,
    telling,
    trusted_tables,
    values,
    write_file,
    write_rows,
)
