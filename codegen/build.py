"""`build(kernels) -> {name: fn}`: compile a plan's kernels into one cached shared library.

    fns = build(plan.kernels(), name="adam")
    fns[k.name](begin, end, rank, [tensor of buffer id for id in k.args()])

Contract
- All kernels render (`CppRenderer.render_module`) into ONE translation unit; identical kernel
  functions appear once (in name order: the order of `kernels` does not matter), two different
  ones with the same name are a `BuildError`.
- The module is a plain shared library (C ABI, no torch or Python header: about 0.2 s to compile
  a module where a torch extension took 4 s), loaded with `ctypes`. Each function is wrapped as
  a `CKernel`: it checks the tensors' count and dtypes (`CppRenderer.arg_dtypes`) and passes
  their data pointers and `torch.get_num_threads()`; ctypes releases the GIL during the call.
- The module's name is `<name or "coconet">_<hash>`, the hash covering the source, the compiler
  and its version, the flags and the CPU that `-march=native` resolves to: identical sources
  reuse the compiled module, in this process (a dict) and across processes (the build cache).
- The build cache is `$COCONET_KERNELS_DIR` if set, else `kernels/` in the suite's cache
  (`codegen.cache.cache_dir`); each module builds in its own folder there (`<cache>/<module>/`,
  with `main.cpp`, `<module>.so`, and `build.log` when a build fails).
- Flags: `-O3 -fno-math-errno -ffp-contract=off -fopenmp -fPIC -shared` (+ `-march=native` where
  the compiler accepts it); `-fno-math-errno` lets gcc vectorise sqrt, `-ffp-contract=off` keeps
  f32/f64 results bit-equal to `dsl.interpret` (no FMA contraction). `$CXX` is the compiler
  (default `c++`).
- Concurrency: builds of one module are serialised by an `fcntl` lock on `<cache>/<module>.lock`
  (released by the OS if the holder dies), so ranks may call `build` at once: one compiles, the
  others wait and then load the result. The library is written under a temporary name and
  renamed, so no process ever loads a half-written one.
- A failed compile raises `BuildError` with a one-line message (the first compiler error) and the
  whole log in `.log` and in `<cache>/<module>/build.log`.
- A cached module that is damaged (not an ELF file: a zero-byte `.so` a full disk left) or
  that will not load is said in one line and built again, once.
- `write_sources(kernels, directory, name)` writes the same module source as
  `<directory>/<name>.cpp` (the run's `kernels/` folder) and returns its path.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import torch

from dsl.types import DType

from . import cache
from .plan import Kernel
from .render import RenderError
from .render_cpp import CppRenderer

log = logging.getLogger(__name__)

CFLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
COMPILE_TIMEOUT_S = 600
TORCH_DTYPE = {
    DType.f16: torch.float16,
    DType.bf16: torch.bfloat16,
    DType.f32: torch.float32,
    DType.f64: torch.float64,
    DType.i32: torch.int32,
    DType.i64: torch.int64,
    DType.bool: torch.bool,
}

_LOADED: dict[str, ctypes.CDLL] = {}
_KERNELS: dict[tuple[str, str], "CKernel"] = {}  # (module, kernel) -> its wrapper


class BuildError(Exception):
    """A module that does not compile or load; `log` holds the compiler's output."""

    def __init__(self, message: str, log: str = "", log_path: Optional[Path] = None):
        super().__init__(message)
        self.log, self.log_path = log, log_path


def cache_dir() -> Path:
    """Where compiled modules live (created on first use)."""
    path = Path(os.environ.get("COCONET_KERNELS_DIR") or cache.cache_dir() / "kernels")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(
            f"the kernel cache {path} cannot be made ({e.strerror}): "
            "set COCONET_KERNELS_DIR to a writable folder"
        ) from None
    return path


@functools.lru_cache(maxsize=None)
def native_arch() -> Optional[str]:
    """The CPU `-march=native` resolves to (e.g. "znver3"), or None where it is not accepted."""
    try:
        out = subprocess.run(
            [compiler(), "-march=native", "-Q", "--help=target"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^\s*-march=\s*(\S+)", out.stdout, re.M)
    return found.group(1) if out.returncode == 0 and found else None


def compiler() -> str:
    return os.environ.get("CXX", "c++")


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    """The first line of `cxx --version` ("" where it does not run): part of a module's key."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout.splitlines() or [""])[0]


def cflags() -> list[str]:
    return list(CFLAGS) + (["-march=native"] if native_arch() else [])


def module_source(kernels: Sequence[Kernel]) -> str:
    try:
        return CppRenderer().render_module(list(kernels))
    except RenderError as e:
        raise BuildError(str(e)) from None


def module_name(source: str, name: Optional[str] = None) -> str:
    cxx = compiler()
    key = "\n".join([source, cxx, compiler_version(cxx), " ".join(cflags()), str(native_arch())])
    prefix = re.sub(r"\W", "_", name or "coconet")[:40]
    return f"{prefix}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def build(kernels: Sequence[Kernel], name: Optional[str] = None) -> dict[str, Callable]:
    """Compile (or load from the cache) all `kernels` as one module; their functions by name."""
    source = module_source(kernels)
    mname = module_name(source, name)
    lib = _load(source, mname)
    fns = {}
    for k in kernels:
        if (mname, k.name) not in _KERNELS:
            fn = CKernel(k.name, getattr(lib, k.name), CppRenderer().arg_dtypes(k))
            _KERNELS[mname, k.name] = fn
        fns[k.name] = _KERNELS[mname, k.name]
    return fns


def write_sources(kernels: Sequence[Kernel], directory, name: Optional[str] = None) -> Path:
    source = module_source(kernels)
    path = Path(directory) / f"{name or module_name(source)}.cpp"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class CKernel:
    """One compiled kernel: `fn(begin, end, rank, bufs)`, `bufs` the tensors of `Kernel.args()`
    in order (contiguous; each of the dtype the kernel uses it as)."""

    def __init__(self, name: str, fn, dtypes: Sequence[Optional[DType]]):
        fn.argtypes = [
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int,
        ]
        fn.restype = None
        self.name, self.fn = name, fn
        self.dtypes = tuple(TORCH_DTYPE[d] if d is not None else None for d in dtypes)
        self.pointers = ctypes.c_void_p * len(self.dtypes)

    def __call__(self, begin: int, end: int, rank: int, bufs: Sequence[torch.Tensor]) -> None:
        if len(bufs) != len(self.dtypes) or not all(map(_fits, bufs, self.dtypes)):
            self._refuse(bufs)
        ptrs = self.pointers(*[t.data_ptr() for t in bufs])
        self.fn(begin, end, rank, ptrs, torch.get_num_threads())

    def _refuse(self, bufs: Sequence[torch.Tensor]) -> None:
        if len(bufs) != len(self.dtypes):
            raise ValueError(f"{self.name} takes {len(self.dtypes)} buffers, not {len(bufs)}")
        j, t, dt = next(
            (j, t, d) for j, (t, d) in enumerate(zip(bufs, self.dtypes)) if not _fits(t, d)
        )
        raise TypeError(f"{self.name}: buffer {j} is {t.dtype}, the kernel reads {dt}")


def _fits(t: torch.Tensor, dtype: Optional[torch.dtype]) -> bool:
    return dtype is None or t.dtype is dtype


def _load(source: str, mname: str) -> ctypes.CDLL:
    if mname in _LOADED:
        return _LOADED[mname]
    root = cache_dir()
    directory = root / mname
    directory.mkdir(exist_ok=True)
    so = directory / f"{mname}.so"
    with _locked(root / f"{mname}.lock"):
        for attempt in (0, 1):
            if attempt or not _whole(so):
                _drop(so)  # damaged, or it failed to load: build again
            if not so.exists():
                _compile(source, directory, so)
            try:
                lib = ctypes.CDLL(str(so))
                break
            except OSError as e:  # the cached module would not load: once more, rebuilt
                if attempt:
                    raise _error(mname, directory, str(e)) from None
    _LOADED[mname] = lib
    return lib


def _compile(source: str, directory: Path, so: Path) -> None:
    """`main.cpp` in `directory`, compiled to `so` (written under a temporary name, renamed)."""
    cpp = directory / "main.cpp"
    cpp.write_text(source)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        out = subprocess.run(
            [compiler(), *cflags(), str(cpp), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        ok, text = out.returncode == 0, out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, text = False, str(e)
    if not ok:
        os.unlink(tmp)
        raise _error(so.stem, directory, text)
    os.replace(tmp, so)


def _whole(so: Path) -> bool:
    """A cached module that can be a built one: absent (nothing to check) or an ELF file."""
    if not so.exists():
        return True
    with so.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def _drop(so: Path) -> None:
    if so.exists():
        log.warning(f"the cached build {so} is damaged or would not load: building it again")
        so.unlink()


def _error(mname: str, directory: Path, log: str) -> BuildError:
    log_path = directory / "build.log"
    log_path.write_text(log)
    lines = [ln.strip() for ln in log.splitlines()]
    first = next(
        (ln for ln in lines if "error" in ln.lower() and ln and "Error building" not in ln),
        lines[0] if lines else "unknown error",
    )
    return BuildError(f"building {mname} failed: {first[:300]} (log: {log_path})", log, log_path)
