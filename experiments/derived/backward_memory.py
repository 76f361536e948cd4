"""exp016_backward_memory's derived tables: every point with its memory, and its growth per
doubling of length (4x is the square, 2x linear)."""

import pandas as pd

from octlm_experiments.derived.scaling import keys, per_doubling, with_memory

SHAPE = ["device", "dtype", "batch", "heads", "kv_heads", "head_dim", "causal", "window"]
OTHERS = ["block", "seed", "warmup_length", "memory_cap_mib", "timeout_s"]


def tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    data = with_memory(rows)
    growth = per_doubling(
        data, keys(rows, SHAPE, OTHERS) + ["method"], {"memory_mib": "memory_growth"}
    )
    return {"measurements": data, "growth": growth}
