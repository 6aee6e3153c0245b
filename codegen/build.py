"""`build(kernels) -> {name: fn}`: compile a plan's kernels into one cached C++ extension module.

    fns = build(plan.kernels(), name="adam")
    fns[k.name](begin, end, rank, [tensor of buffer id for id in k.args()])

Contract
- All kernels render (`CppRenderer.render_module`) into ONE translation unit; identical kernel
  functions appear once (in name order: the order of `kernels` does not matter), two different
  ones with the same name are a `BuildError`.
- The module's name is `<name or "coconet">_<hash>`, the hash covering the source, the compiler
  flags, the CPU that `-march=native` resolves to, and the torch version: identical sources reuse
  the compiled module, in this process (a dict) and across processes (the build cache).
- The build cache is `$TORCH_EXTENSIONS_DIR` if set, else `torch_extensions/` in the suite's
  cache (`codegen.cache.cache_dir`); each module builds in its own folder there (`<cache>/<module>/`, with `main.cpp`, the `.so`, and
  `build.log` when a build fails).
- Flags: `-O3 -fno-math-errno -ffp-contract=off -fopenmp` (+ `-march=native` where the compiler
  accepts it); `-fno-math-errno` lets gcc vectorise sqrt, `-ffp-contract=off` keeps f32/f64
  results bit-equal to `dsl.interpret` (no FMA contraction).
- Concurrency: builds of one module are serialised by an `fcntl` lock on `<cache>/<module>.lock`
  (released by the OS if the holder dies), so ranks may call `build` at once: one compiles, the
  others wait and then load the result. A stale lock left by torch's own builder is removed.
- A failed compile raises `BuildError` with a one-line message (the first compiler error) and the
  whole log in `.log` and in `<cache>/<module>/build.log`.
- A cached module that is damaged (not an ELF file: a zero-byte `.so` a full disk left) or
  that will not load is said in one line and built again, once.
- The modules' common headers (`render_cpp.INCLUDES`) are precompiled once per compiler, flags
  and torch into the suite's cache (`codegen.cache.cache_dir()/prelude/<hash>/
  coconet_prelude.h.gch`, built under its own lock, shared by every build cache) and each module
  is compiled with `#include "coconet_prelude.h"` in their place: about 40% less compile time.
  Without it (the header will not precompile) a module still builds, from the headers.
- `write_sources(kernels, directory, name)` writes the same module source as
  `<directory>/<name>.cpp` (the run's `kernels/` folder) and returns its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import logging
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator, Optional, Sequence

from . import cache
from .plan import Kernel
from .render import RenderError
from .render_cpp import INCLUDES, CppRenderer

log = logging.getLogger(__name__)

CFLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp")
LDFLAGS = ("-fopenmp",)
PRELUDE = "coconet_prelude.h"  # INCLUDES, precompiled: each module includes this instead

_LOADED: dict[str, ModuleType] = {}


class BuildError(Exception):
    """A module that does not compile or load; `log` holds the compiler's output."""

    def __init__(self, message: str, log: str = "", log_path: Optional[Path] = None):
        super().__init__(message)
        self.log, self.log_path = log, log_path


def cache_dir() -> Path:
    """Where compiled modules live (created on first use)."""
    path = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cache.cache_dir() / "torch_extensions")
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=None)
def native_arch() -> Optional[str]:
    """The CPU `-march=native` resolves to (e.g. "znver3"), or None where it is not accepted."""
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run(
            [cxx, "-march=native", "-Q", "--help=target"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^\s*-march=\s*(\S+)", out.stdout, re.M)
    return found.group(1) if out.returncode == 0 and found else None


def cflags() -> list[str]:
    return list(CFLAGS) + (["-march=native"] if native_arch() else [])


def module_source(kernels: Sequence[Kernel]) -> str:
    try:
        return CppRenderer().render_module(list(kernels))
    except RenderError as e:
        raise BuildError(str(e)) from None


def module_name(source: str, name: Optional[str] = None) -> str:
    key = "\n".join(
        [source, " ".join(cflags() + list(LDFLAGS)), str(native_arch()), _torch_version(), PRELUDE]
    )
    prefix = re.sub(r"\W", "_", name or "coconet")[:40]
    return f"{prefix}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def build(kernels: Sequence[Kernel], name: Optional[str] = None) -> dict[str, Callable]:
    """Compile (or load from the cache) all `kernels` as one module; their functions by name."""
    source = module_source(kernels)
    mod = _load(source, module_name(source, name))
    return {k.name: getattr(mod, k.name) for k in kernels}


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


def _load(source: str, mname: str) -> ModuleType:
    if mname in _LOADED:
        return _LOADED[mname]
    from torch.utils.cpp_extension import load_inline

    _ninja_on_path()
    root = cache_dir()
    directory = root / mname
    directory.mkdir(exist_ok=True)
    extra = {}
    if "no_implicit_headers" in inspect.signature(load_inline).parameters:
        extra["no_implicit_headers"] = True  # the source includes lighter headers (~3x faster)
    flags = cflags()
    if INCLUDES in source:  # the same translation unit, its headers read precompiled
        prelude = _prelude(precompile=not (directory / f"{mname}.so").exists())
        source = source.replace(INCLUDES, f'#include "{PRELUDE}"\n', 1)
        flags.append(f"-I{prelude}")
    with _locked(root / f"{mname}.lock"):
        (directory / "lock").unlink(missing_ok=True)  # torch's baton, stale if we hold the lock
        for attempt in (0, 1):
            if attempt or not _whole(directory / f"{mname}.so"):
                _drop(directory / f"{mname}.so")  # damaged, or it failed to load: build again
            try:
                mod = load_inline(
                    mname,
                    [source],
                    extra_cflags=flags,
                    extra_ldflags=list(LDFLAGS),
                    build_directory=str(directory),
                    verbose=False,
                    **extra,
                )
                break
            except ImportError as e:  # the cached module would not load: once more, rebuilt
                if attempt:
                    raise _error(mname, directory, str(e)) from None
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                raise _error(mname, directory, str(e)) from None
    _LOADED[mname] = mod
    return mod


def _prelude(precompile: bool = True) -> Path:
    """The folder of `PRELUDE` and, where the compiler takes it (and `precompile`), its `.gch`.

    The header is compiled with the flags torch's `load_inline` gives a module (its defines,
    include folders, `-fPIC -std=c++20`) and ours; gcc uses the `.gch` only where they match and
    otherwise reads the header itself, so a mismatch costs time, never correctness.
    """
    from torch.utils.cpp_extension import include_paths

    cxx = os.environ.get("CXX", "c++")
    python = sysconfig.get_path("include", scheme="posix_prefix")
    flags = ["-DTORCH_API_INCLUDE_EXTENSION_H"]
    for folder in include_paths("cpu") + ([python] if python else []):
        flags += ["-isystem", folder]
    flags += ["-fPIC", "-std=c++20"] + cflags()
    key = "\n".join([INCLUDES, cxx, " ".join(flags), str(native_arch()), _torch_version()])
    folder = cache.cache_dir() / "prelude" / hashlib.sha256(key.encode()).hexdigest()[:16]
    header, pch = folder / PRELUDE, folder / f"{PRELUDE}.gch"
    if pch.exists() or (folder / "failed.log").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_suffix(".lock")):
        if not header.exists():
            header.write_text(INCLUDES)
        if pch.exists() or (folder / "failed.log").exists() or not precompile:
            return folder
        fd, tmp = tempfile.mkstemp(suffix=".gch", dir=folder)
        os.close(fd)
        try:
            out = subprocess.run(
                [cxx, *flags, "-x", "c++-header", str(header), "-o", tmp],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            ok = out.returncode == 0
            log_text = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, log_text = False, str(e)
        if ok:
            os.replace(tmp, pch)
        else:
            os.unlink(tmp)
            (folder / "failed.log").write_text(log_text)
            log.warning(f"the kernels' headers did not precompile (see {folder}/failed.log)")
    return folder


def _torch_version() -> str:
    import torch

    return torch.__version__


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


def _ninja_on_path() -> None:
    """torch runs `ninja` from PATH; where only the pip package has it, add its folder."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _error(mname: str, directory: Path, log: str) -> BuildError:
    log_path = directory / "build.log"
    log_path.write_text(log)
    lines = [ln.strip() for ln in log.splitlines()]
    first = next(
        (ln for ln in lines if "error" in ln.lower() and ln and "Error building" not in ln),
        lines[0] if lines else "unknown error",
    )
    return BuildError(f"building {mname} failed: {first[:300]} (log: {log_path})", log, log_path)
