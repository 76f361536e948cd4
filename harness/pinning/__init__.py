"""Pinning a sweep's code, saying what produced a row, and reusing answers: codestore collects
the source a sweep's points import and keeps it by digest, boot starts a process on that
snapshot (standard library only, run as a file), provenance names what produced a row (commit,
code digest, versions, machine), reuse copies an answer the store holds already. May import
store and the root modules."""
