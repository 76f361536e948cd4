"""Planning a sweep: config composes the config from the command line's overrides with Hydra,
experiment reads an experiment's function and checks a point's values against its signature,
plan expands the grid into numbered points and writes the manifest. May import results,
searching, pinning, store and the root modules."""
