"""python -m analysis: the Parquet store as Markdown tables, PNG plots and checked claims."""
