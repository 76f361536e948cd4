"""Pinning a sweep's code and reusing its answers: codestore collects the source a sweep's
points import and keeps it by digest, boot starts a process on that snapshot (standard library
only, run as a file), reuse copies an answer the store holds already. May import store and the
root modules."""
