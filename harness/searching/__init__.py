"""Searching within a grid's cells: space reads and checks a search's space and settings,
journal keeps each cell's Optuna study in the sweep's journal, and search runs a trial as a
point of the sweep and finds a search's best rows (its module is what callers import). May
import store and the root modules."""
