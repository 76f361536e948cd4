"""Searching within a grid's cells: search turns each cell into Optuna trials, each trial a
point of the sweep, and finds a search's best rows. May import store and the root modules."""
