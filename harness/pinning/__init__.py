"""Pinning a sweep's code: sources collects the source its points import (its bundles, hashed) and
codestore keeps it by digest in a code store of the user's own; boot starts a process on that
snapshot (standard library only, run as a file) and checks each module as it is imported. May
import store, provenance and the root modules."""
