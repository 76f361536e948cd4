"""octlm-harness: Hydra sweeps of plain experiment functions into a Parquet store."""
