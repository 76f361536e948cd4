"""What the measuring experiments share (exp015_backends, exp016_backward_memory,
exp018_window): a point measured in a fresh child process, its inputs, and the calls timed in
turns with its own for the time ratios its claims bound.

isolated_row runs a point's measure in a child that did nothing else (harness.measuring.memory's
run_isolated) and turns its outcome into the point's row: the child's row, or one of its
status (oom, timeout, ...) with the device used, so that every row says where it ran. The
rest runs in that child: inputs makes the (B, H, L, D) inputs from the seed; half_length_inputs,
timed_beside and own_ratios time the point's call in turns with the same call at half the
length and with a reference (harness.measuring.timing.time_call's beside), and give each ratio as
the median of the rounds' ratios, of CPU time on one CPU thread (which other processes leave
alone), else of wall time.
"""

import importlib

import torch

from harness.measuring.memory import MIB, is_out_of_memory, run_isolated
from harness.measuring.timing import paired_ratio, time_call
from octlm_experiments.paths import registering_modules

HALF_LENGTH_FLOOR = 128  # shorter halves time call overheads more than attention: no growth


def isolated_row(measure, point: dict, used: torch.device, memory_cap_mib, timeout_s) -> list[dict]:
    """measure(**point) in a fresh child (run_isolated): its row, or a row of the child's
    status (oom, timeout, ...) on the device used. The memory cap is the CPU's only: CUDA
    reserves huge address ranges."""
    cap = 0 if used.type == "cuda" else memory_cap_mib
    outcome = run_isolated(_knowing_the_paths, (registering_modules(), measure), point,
                           memory_cap_mib=cap, timeout_s=timeout_s)  # fmt: skip
    if outcome.status != "ok":
        return [{"status": outcome.status, "error": outcome.error, "device_used": str(used)}]
    return [outcome.value]


def _knowing_the_paths(modules: list[str], measure, **point):
    """In the child: the modules that registered attention paths in the parent, imported first
    (a path of a user's own, registered outside experiments/, is one to take here too)."""
    for module in modules:
        importlib.import_module(module)
    return measure(**point)


def inputs(device: str, shape: tuple, dtype: str, seed: int, num_threads: int) -> tuple:
    """In a measuring child: its thread count (0: torch's default), random query, key and value
    (B, H, L, D) from the seed, and the row's first columns (status, device_used, the GPU's
    capability on CUDA, inputs_mib). Returns (device, (query, key, value), row)."""
    device = torch.device(device)
    if num_threads:
        torch.set_num_threads(num_threads)
    generator = torch.Generator(device).manual_seed(seed)
    tensors = tuple(
        torch.randn(shape, generator=generator, device=device, dtype=getattr(torch, dtype))
        for _ in range(3)
    )
    row = {"status": "ok", "error": None, "device_used": str(device)}
    if device.type == "cuda":  # 8.0 for sm80: what the fused kernels need is told by it
        major, minor = torch.cuda.get_device_capability(device)
        row["capability"] = major + minor / 10
    row["inputs_mib"] = 3 * tensors[0].nbytes / MIB
    return device, tensors, row


def half_length_inputs(tensors: tuple, floor: int = 0) -> tuple | None:
    """Contiguous copies of the (B, H, L, D) inputs' first L // 2 positions (a causal problem of
    half the length), where L // 2 is at least `floor` and HALF_LENGTH_FLOOR; else None."""
    half = tensors[0].shape[-2] // 2
    if half < max(floor, HALF_LENGTH_FLOOR):
        return None
    return tuple(tensor[..., :half, :].contiguous() for tensor in tensors)


def timed_beside(forward, beside: dict, device: torch.device, timing: dict) -> dict:
    """time_call of forward with `beside` timed in turns. Where that runs out of memory (a
    reference that holds the square, at a length where the method fits), the last call beside
    it is left out (references come last: they hold the most) and the rest timed again; each
    one left out is named, with its error, in beside_error."""
    beside, errors = dict(beside), []
    while True:
        try:
            times = time_call(forward, device=device, beside=beside, **timing)
            return times | ({"beside_error": "; ".join(errors)} if errors else {})
        except (MemoryError, RuntimeError) as error:
            if not beside or not is_out_of_memory(error):
                raise
            name = list(beside)[-1]
            del beside[name]
            errors.append(f"{name}: {type(error).__name__}: {error}".strip())
        if device.type == "cuda":
            torch.cuda.empty_cache()


def own_ratios(row: dict, reference: str) -> dict:
    """The time ratios of a row whose timing had calls beside it (timed_beside): time_growth,
    its time over half the length's, and speedup_over_REFERENCE, the reference's time over its
    own; each the median of the rounds' ratios (paired_ratio), where the row has the samples.
    ratios_of says of which time: on the CPU with one thread, the process's CPU time (the
    calls' own work, which other processes on the machine leave alone: harness.measuring.memory),
    else the wall time."""
    cpu = row.get("threads_used") == 1 and "cpu_time_samples_ms" in row
    kind = "cpu_time" if cpu else "time"
    samples, ratios = row[f"{kind}_samples_ms"], {}
    if f"half_length_{kind}_samples_ms" in row:
        ratios["time_growth"] = paired_ratio(samples, row[f"half_length_{kind}_samples_ms"])
    if f"{reference}_{kind}_samples_ms" in row:
        reference_samples = row[f"{reference}_{kind}_samples_ms"]
        ratios[f"speedup_over_{reference}"] = paired_ratio(reference_samples, samples)
    if ratios:
        ratios["ratios_of"] = "CPU time, one thread" if cpu else "wall time"
    return ratios
