"""A toolkit for experiments, not part of the runner: timing (time and FLOP/s, in turns with
a baseline) and memory (peak memory, and a function run in an isolated child process, forked
from a forkserver that has imported torch and this module). Experiments import it; of the
harness, only the warm workers read a process's memory with it. Imports nothing of the harness
but the root modules."""
