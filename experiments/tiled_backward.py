"""exp016: the tiled backward pass against SDPA's gradients, and forward + backward memory.

run (exp016_tiled_backward): one (B, H, L, D) attention with random inputs and a random upstream
gradient, through tiled_attention and through SDPA; how far apart their outputs and their
gradients of query, key and value are, and how far each is from the float64 reference (naive
attention in float64 on float64 copies of the same inputs and upstream gradient).

memory (exp016_backward_memory): the peak memory of one forward + backward through one method
(an attention path of octlm_experiments.attention's registry: naive, tiled, ...; or SDPA forced onto
its math or flash backend, sdpa_math and sdpa_flash), measured in a fresh child process
(octlm_experiments.measuring.isolated_row) with the inputs and upstream gradient allocated before
the
baseline. Running out of memory is a row with status "oom", a backend that cannot run these
inputs a row with status "unsupported" and PyTorch's reason; every row names the device used
(device_used), as exp015's and exp018's do.
"""

import contextlib
import functools
import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.measuring.memory import MIB, default_memory_cap_mib, measure_memory
from octlm_experiments import checks, measuring, paths
from octlm_experiments.attention import (
    reference_attention,
    sdpa_attention,
    sdpa_refusal,
    tiled_attention,
)
from octlm_experiments.paths import attend, check_path

# memory's methods beside the registered attention paths: SDPA forced onto one backend.
SDPA_BACKENDS = {"sdpa_math": SDPBackend.MATH, "sdpa_flash": SDPBackend.FLASH_ATTENTION}


def check(
    *,
    length: int,
    block: int,
    kv_heads: int,
    heads: int,
    head_dim: int,
    batch: int,
    causal: bool,
    window: int,
    device: str,
) -> None:
    """Reject out-of-domain values of run's parameters: a one-line ValueError."""
    checks.positive(length=length, block=block, head_dim=head_dim, batch=batch)
    checks.heads(heads, kv_heads)
    checks.window(window, causal)
    checks.device(device)


def check_memory(
    *, method: str, warmup_length: int, memory_cap_mib: int | None, timeout_s: float
) -> None:
    """Reject out-of-domain values of the parameters memory has beyond run's (for
    exp016_backward_memory, beside check): a method is a registered attention path or one of
    SDPA_BACKENDS."""
    check_path(method, "method", also=tuple(SDPA_BACKENDS))
    checks.positive(timeout_s=timeout_s)
    checks.not_negative(warmup_length=warmup_length, memory_cap_mib=memory_cap_mib)
    if memory_cap_mib is None:
        default_memory_cap_mib()  # its environment variable, checked before any point runs


def run(
    *,
    length: int,
    block: int,
    kv_heads: int = 8,
    heads: int = 8,
    head_dim: int = 32,
    batch: int = 1,
    dtype: checks.Dtype = "float32",
    causal: bool = True,
    window: int = 0,
    seed: int = 0,
    device: str = "cpu",
) -> list[dict]:
    """One row: the largest differences of the output and of dq, dk, dv, tiled against SDPA
    (max_abs_diff, max_grad_diff_q, ...), and each path's largest errors against the float64
    reference (tiled_err64, tiled_grad_err64_q, ..., sdpa_err64, sdpa_grad_err64_q, ...; the
    largest of the three gradients' as tiled_grad_err64 and sdpa_grad_err64)."""
    checks.point(check, locals())
    device = str(checks.usable_device(device))
    shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, length=length, head_dim=head_dim)
    inputs = _inputs(**shape, dtype=dtype, seed=seed, device=device)
    mask = {"causal": causal, "window": window}
    tiled = functools.partial(tiled_attention, block=block)
    expected, *expected_grads = _forward_backward(sdpa_attention, *inputs, **mask)
    actual, *actual_grads = _forward_backward(tiled, *inputs, **mask)
    row = {"max_abs_diff": _largest(actual - expected)}
    for name, got, want in zip("qkv", actual_grads, expected_grads, strict=True):
        row[f"max_grad_diff_{name}"] = _largest(got - want)
    row["max_grad_diff"] = max(row[f"max_grad_diff_{name}"] for name in "qkv")
    row["max_abs_grad"] = max(_largest(grad) for grad in expected_grads)
    reference = reference_attention(*inputs, **mask)
    for path, results in (
        ("tiled", (actual, *actual_grads)),
        ("sdpa", (expected, *expected_grads)),
    ):
        errors = [
            _largest(got.double() - want) for got, want in zip(results, reference, strict=True)
        ]
        row[f"{path}_err64"] = errors[0]
        for name, error in zip("qkv", errors[1:], strict=True):
            row[f"{path}_grad_err64_{name}"] = error
        row[f"{path}_grad_err64"] = max(errors[1:])
    return [row]


def memory(
    *,
    method: str,
    length: int,
    block: int = 128,
    kv_heads: int = 8,
    heads: int = 8,
    head_dim: int = 32,
    batch: int = 1,
    dtype: checks.Dtype = "float32",
    causal: bool = True,
    window: int = 0,
    seed: int = 0,
    device: str = "cpu",
    warmup_length: int = 16,
    memory_cap_mib: int | None = None,
    timeout_s: float = 1800.0,
) -> list[dict]:
    """One row: peak memory of one forward + backward through `method`, in a fresh child.

    The row has inputs_mib (query, key, value and the upstream gradient) and rss_delta_mib on the
    CPU, or cuda_peak_mib and cuda_reserved_mib on CUDA (harness.measuring.memory.measure_memory).
    Before the inputs exist, the child runs one forward + backward at warmup_length tokens (0:
    none), so that one-off costs (thread pools, the autograd engine, first-use buffers: some 45 MiB
    of resident memory on CPU) are not counted as the cost of the length. A path without a backward
    pass on the device, or that does not take the dtype (its Capabilities), is an "unsupported"
    row saying so. memory_cap_mib bounds the CPU child (None: harness.measuring.memory's default, 8
    GiB); CUDA children run uncapped, since the CUDA driver maps far more address space than it
    uses.
    """
    checks.point(check, locals())
    checks.point(check_memory, locals())
    used = checks.usable_device(device)
    path = "sdpa" if method in SDPA_BACKENDS else method
    refused = paths.unsupported(path, used, dtype, backward=True)
    if refused:
        return [{"status": "unsupported", "error": refused, "device_used": str(used)}]
    shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, length=length, head_dim=head_dim)
    point = dict(method=method, block=block, causal=causal, window=window)
    inputs = dict(**shape, dtype=dtype, seed=seed, device=str(used))
    child = dict(point=point, inputs=inputs, warmup_length=warmup_length)
    return measuring.isolated_row(_measure_memory, child, used, memory_cap_mib, timeout_s)


def _inputs(
    *,
    batch: int,
    heads: int,
    kv_heads: int,
    length: int,
    head_dim: int,
    dtype: str,
    seed: int,
    device: str,
) -> list[Tensor]:
    """query (B, H, L, D), key and value (B, H_kv, L, D) requiring grad; grad_output (B, H, L, D).

    Drawn in float32 on the CPU, so a point's numbers are the same on every device and dtype.
    """
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, h, length, head_dim) for h in (heads, kv_heads, kv_heads, heads)]
    tensors = [
        torch.randn(shape, generator=generator).to(device=device, dtype=getattr(torch, dtype))
        for shape in shapes
    ]
    for tensor in tensors[:3]:
        tensor.requires_grad_()
    return tensors


def _forward_backward(
    attend: Callable[..., Tensor],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    grad_output: Tensor,
    **mask,
) -> tuple[Tensor, ...]:
    """The output and the gradients of sum(output * grad_output) for query, key and value."""
    output = attend(query, key, value, **mask)
    grads = torch.autograd.grad(output, (query, key, value), grad_output)
    return output.detach(), *grads


def _largest(tensor: Tensor) -> float:
    return tensor.abs().max().item()


# In the child process


def _measure_memory(*, point: dict, inputs: dict, warmup_length: int) -> dict:
    """A small warm-up, the inputs, then one forward + backward's peak memory over that baseline."""
    method = point["method"]
    path = "sdpa" if method in SDPA_BACKENDS else method
    attention = functools.partial(attend, path, block=point["block"])
    mask = {"causal": point["causal"], "window": point["window"]}
    on_cuda = torch.device(inputs["device"]).type == "cuda"
    device_used = {"device_used": inputs["device"]}
    with warnings.catch_warnings(record=True) as caught, _backend(method):
        warnings.simplefilter("always")
        try:
            if warmup_length:
                warm = _inputs(**{**inputs, "length": warmup_length})
                _forward_backward(attention, *warm, **mask)
            tensors = _inputs(**inputs)
            step = functools.partial(_forward_backward, attention, *tensors, **mask)
            row = device_used | {"inputs_mib": sum(tensor.nbytes for tensor in tensors) / MIB}
            return row | measure_memory(step, device=inputs["device"], warmup=int(on_cuda))
        except RuntimeError as error:
            refusal = sdpa_refusal(error, caught)
            if refusal is None:
                raise
            return {"status": "unsupported", "error": refusal, **device_used}


def _backend(method: str) -> contextlib.AbstractContextManager:
    """SDPA forced onto the method's backend; nothing for an attention path."""
    if method in SDPA_BACKENDS:
        return sdpa_kernel(SDPA_BACKENDS[method])
    return contextlib.nullcontext()
