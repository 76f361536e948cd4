"""The sinks' side of a training point (harness.running.sinks): its rows as they land, in order,
then the rows the experiment returned, once its job's file is written. The sinks open once: after
the last row of the checkpoint a point resumed from (its run continues there), else from the
start at the first row that lands."""

import pyarrow as pa

from harness import store


class Feed:
    """What the point's sinks (harness.running.sinks.Sinks, or None: the point has none) get."""

    def __init__(self, sinks):
        self.sinks, self.opened = sinks, False

    def resume(self, kept: pa.Table) -> None:
        """Open the sinks after the last of `kept`, the rows a checkpoint restored."""
        if self.sinks is None:
            return
        last = kept.slice(max(kept.num_rows - 1, 0)).to_pylist()  # [] where it restored none
        self.sinks.open(store.settled(last)[0] if last else None)
        self.opened = True

    def landed(self, table: pa.Table) -> None:
        """A segment that landed, its rows as they will read once the point ends."""
        if self.sinks is not None:
            self.write(store.settled(table.to_pylist()))

    def close(self, returned: list[dict]) -> None:
        """The point has ended: the rows it returned, then the sinks close."""
        if self.sinks is not None:
            self.write(returned)
            self.sinks.close()

    def write(self, rows: list[dict]) -> None:
        if not self.opened:
            self.sinks.open(None)
            self.opened = True
        self.sinks.write(rows)
