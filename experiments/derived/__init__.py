"""The tables an experiment derives from its rows for its claims (a config's `derive`), which
the harness checks at a sweep's end and the report shows: pandas only, no torch and none of the
code that measures, so that a report loads them in a moment."""
