"""What produced a row: the code's commit, the versions, the installed packages, the host, the
device, SLURM's ids, and the environment variables that change what a computation returns."""

import functools
import glob
import hashlib
import json
import os
import platform
import site
import socket
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from harness.lifetime import per_command

# Environment variables that change what a computation returns, or which kernels compute it:
# thread counts (a reduction's order), TF32 overrides, cuBLAS's workspace (its determinism) and
# kernel choice, oneDNN's and MKL's instruction sets and numerical modes, the CPU capability
# torch dispatches to, Python's hash seed (the order of a set). An experiment names others in
# its YAML (experiment.environment).
NUMERICS_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NVIDIA_TF32_OVERRIDE",
                "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG",
                "CUBLASLT_WORKSPACE_SIZE", "TORCH_BLAS_PREFER_CUBLASLT",
                "TORCH_BLAS_PREFER_HIPBLASLT", "TORCH_CUDNN_SDPA_ENABLED", "MKL_CBWR",
                "MKL_ENABLE_INSTRUCTIONS", "KMP_DETERMINISTIC_REDUCTION", "ATEN_CPU_CAPABILITY",
                "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE", "ONEDNN_MAX_CPU_ISA",
                "DNNL_MAX_CPU_ISA", "PYTHONHASHSEED")  # fmt: skip


@per_command
@functools.cache
def git_state(folder: Path | None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git repository that tracks files in `folder` (an experiment's
    code: work_tree), as a sweep is planned; (None, None) where none does.

    Dirty counts every file of the repository that differs from the commit, files git does not
    track yet too (a new experiment module, say), but not the ones it ignores (outputs/,
    .venv/)."""
    top = work_tree(folder)
    if top is None:
        return None, None
    try:
        head = git(top, "rev-parse", "HEAD", timeout=30)
        status = git(top, "status", "--porcelain", timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if head.returncode or status.returncode:  # a repository without a commit yet, say
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip())


def work_tree(folder: Path | None) -> Path | None:
    """The top folder of the git work tree that tracks files in `folder` (an experiment's
    code): the harness's checkout for its own experiments, a researcher's repository for
    theirs. None where none does: a folder in no repository, or one its repository does not
    track (an installed package in a venv inside it, an experiment never committed, a folder
    under a home directory's repository of settings)."""
    if folder is None:
        return None
    try:
        top = git(folder, "rev-parse", "--show-toplevel", timeout=30)
        tracked = git(folder, "ls-files", "--", ".", timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no git, or a file system that hangs
        return None
    if top.returncode or tracked.returncode or not tracked.stdout.strip():
        return None
    return Path(top.stdout.strip()).resolve()


def git(folder: Path, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`git args` in `folder`, its output captured as text, whatever its exit code."""
    # --no-optional-locks: git status would otherwise take .git/index.lock to refresh the index,
    # and a command killed meanwhile would leave it behind, blocking the user's next commit.
    return subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@functools.cache
def installed() -> tuple[str, ...]:
    """Python's own folders and the installed packages' (each ending in a separator, as given
    and with its links resolved): the site-packages folders and the folders of distributions
    their .pth files add to the import path. What no sweep pins, and what packages_digest
    names."""
    paths = sysconfig.get_paths()
    given = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
             *site.getsitepackages(), site.getusersitepackages(), *_added()}  # fmt: skip
    both = {way(root) for root in given if root for way in (os.path.abspath, os.path.realpath)}
    return tuple(sorted(root.rstrip(os.sep) + os.sep for root in both if root != os.sep))


def _pth_files() -> list[str]:
    """The .pth files of the installed packages' folders, whose lines add folders to the import
    path or run code as Python starts."""
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    return sorted(path for folder in sites
                  for path in glob.glob(os.path.join(glob.escape(folder), "*.pth")))  # fmt: skip


def _added() -> list[str]:
    """The folders of installed distributions (holding a *.dist-info) that the .pth files add
    to the import path, as Python's site module reads them: each line that is no comment and no
    import, a folder relative to its file's. Not a project's own folder that a .pth of an
    editable install adds: its files are no installed package's."""
    found = []
    for pth in _pth_files():
        try:
            lines = Path(pth).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in (line.rstrip() for line in lines):
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            added = os.path.join(os.path.dirname(pth), line)
            if glob.glob(os.path.join(glob.escape(added), "*.dist-info")):
                found.append(added)
    return found


@per_command
@functools.lru_cache(maxsize=1)
def packages() -> tuple[str, ...]:
    """Every installed distribution as name==version, sorted."""
    return tuple(listed for listed, _ in _installed())


@per_command
@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str], ...]:
    """Every installed distribution (its metadata in one of the installed packages' folders:
    not one a checkout on the import path lists, nor one a package vendors and puts on the
    path when it is imported, as setuptools does) as (name==version, where and when it was
    installed: its metadata folder, that folder's inode and modification time), sorted: a
    package installed again at the same version (an edit of one's own, reinstalled) is another
    install."""
    found, sites = {}, installed()
    for distribution in metadata.distributions():
        where = os.path.abspath(getattr(distribution, "_path", "") or "")  # its .dist-info
        if os.path.join(os.path.dirname(where), "") not in sites:
            continue
        name, version = _name_and_version(distribution)
        try:
            status = os.stat(where)
        except OSError:
            continue
        found[name] = (f"{name}=={version}", f"{where} {status.st_ino}:{status.st_mtime_ns}")
    return tuple(found[name] for name in sorted(found) if name)


def _name_and_version(distribution: metadata.Distribution) -> tuple[str, str | None]:
    """A distribution's Name and Version, read from its metadata's header lines: what
    distribution.metadata holds for them, without parsing the whole file as an email (20 ms
    for 40 packages, the better part of a short sweep's start)."""
    text = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line:  # the headers end here
            break
        key, _, value = line.partition(":")
        fields.setdefault(key, value.strip())
    return fields.get("Name", "").lower(), fields.get("Version")


@per_command
@functools.lru_cache(maxsize=1)
def packages_digest() -> str:
    """The digest of the installed packages: their names and versions, and each one's install
    (_installed); and of what Python runs as it starts or imports beside them (_startup). The
    package list a sweep keeps (packages()) is named by it."""
    text = "\n".join(f"{listed} {stamp}" for listed, stamp in [*_installed(), *_startup()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _startup() -> list[tuple[str, str]]:
    """What Python runs or imports from beside the installed packages, each by the digest of its
    bytes: the installed packages' folders' .pth files (whose lines add folders to the path or
    run code), the sitecustomize and usercustomize this process ran, and every zip archive on
    the import path."""
    paths = _pth_files()
    paths += [getattr(sys.modules.get(name), "__file__", None) or ""
              for name in ("sitecustomize", "usercustomize")]  # fmt: skip
    paths += [entry for entry in sys.path if os.path.isfile(entry)]
    return [(path, _bytes_digest(path)) for path in dict.fromkeys(paths) if path]


def _bytes_digest(path: str) -> str:
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()[:16]
    except OSError as error:
        return f"unreadable ({error.strerror or error})"


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device ("auto" is CUDA when there is one), else the CPU's."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return _cpu_name()


@functools.cache
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device: str, named_env=(), code_digest: str | None = None,
               code_commit: tuple[str | None, bool | None] = (None, None)) -> dict:  # fmt: skip
    """The provenance columns of a row measured on `device` in this process by the code of
    `code_digest`, whose repository's commit and whether it was dirty are `code_commit`
    (git_state of the experiment's code where the sweep was planned, as its manifest records
    them: a point runs from the pinned snapshot, in no repository) (`named_env`: the environment
    variables its experiment names besides NUMERICS_ENV)."""
    import torch

    commit, dirty = code_commit
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "code_digest": code_digest,
        **machine(device),
        "threads": torch.get_num_threads(),
        "environment": environment(named_env),
        "hostname": socket.gethostname(),
        **slurm(),
    }


def machine(device: str) -> dict:
    """The kind of machine a point on `device` runs on here: the device's name, the versions of
    torch, CUDA, cuDNN, the GPU's driver and Python, and the installed packages' digest."""
    import torch

    name = device_name(device)
    return {
        "device_name": name,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": _cudnn(),
        "driver_version": _driver() if name != _cpu_name() else None,
        "python_version": python_version(),
        "packages_digest": packages_digest(),
    }


def python_version() -> str:
    """Python's version, with its optimization level where it has one (-O, -OO: asserts and
    docstrings left out, which a computation may read)."""
    optimized = sys.flags.optimize
    return platform.python_version() + (f" -{'O' * optimized}" if optimized else "")


def environment(named=(), environ=None) -> str:
    """The variables of NUMERICS_ENV and `named` that `environ` (None: this process's) sets,
    as sorted JSON text."""
    env = os.environ if environ is None else environ
    return json.dumps({n: env[n] for n in sorted({*NUMERICS_ENV, *named}) if n in env})


@functools.cache
def _cudnn() -> str | None:
    """cuDNN's version where torch has it (a CUDA build), else None."""
    import torch

    if torch.version.cuda is None:  # a CPU build: no cuDNN to load
        return None
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return None if version is None else str(version)


@functools.cache
def _driver() -> str | None:
    """The NVIDIA driver's version, as the kernel module states it; None without one."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    found = [w for w in text.split() if w.count(".") >= 1 and w.replace(".", "").isdigit()]
    return found[0] if found else None


def slurm() -> dict:
    """SLURM's ids for this task (None outside SLURM), how often SLURM requeued it, and the
    GPUs it was given (CUDA_VISIBLE_DEVICES)."""
    env = os.environ
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    return {
        "slurm_job_id": f"{array_job}_{task}" if array_job and task else env.get("SLURM_JOB_ID"),
        "slurm_array_task_id": int(task) if task else None,
        "slurm_node": env.get("SLURMD_NODENAME"),
        "slurm_restarts": int(env.get("SLURM_RESTART_COUNT", 0)) if "SLURM_JOB_ID" in env else None,
        "gpus": env.get("CUDA_VISIBLE_DEVICES"),
    }
