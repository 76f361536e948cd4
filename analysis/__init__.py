"""python -m harness report: the Parquet store as Markdown tables, PNG plots and checked claims."""
