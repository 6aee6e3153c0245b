"""NVRTC through ctypes: CUDA C++ source -> PTX or CUBIN, on any machine, GPU or not.

    lib = load()                                     # NvrtcError if no libnvrtc is found
    ptx = lib.compile(source, "compute_90", options)  # bytes; "sm_90" gives a CUBIN instead

Contract
- `load()` finds and opens libnvrtc once per process, looking in this order: the NVIDIA wheels on
  `sys.path` (`nvidia/cuda_nvrtc/lib/libnvrtc.so.12` from `nvidia-cuda-nvrtc-cu12`, the project's
  `gpu` and `dev` extras, then `nvidia/cu13/lib/libnvrtc.so.13` from CUDA 13 builds of torch), the
  CUDA toolkit (`$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`), then the loader's search path.
  No GPU, driver or CuPy is needed: NVRTC only compiles.
- `Nvrtc.compile(source, arch, options, name)`: `arch` "compute_XY" returns PTX (text, as bytes,
  without the trailing NUL), "sm_XY" a CUBIN for that GPU. A compile error raises `NvrtcError`
  whose message is the first error line of the log and whose `.log` holds the whole log.
- `Nvrtc.version` is (major, minor); `Nvrtc.archs` the `sm_XY` it can target (NVRTC 13 dropped
  sm_70, the V100 of the paper; NVRTC 12.9 still builds it).

Why ctypes rather than `cupy.cuda.nvrtc`: the same calls, without a 290 MB CuPy install that
compile-only machines (CI) do not otherwise need, and with whichever libnvrtc torch ships.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

_WHEEL_DIRS = ("nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib")


class NvrtcError(RuntimeError):
    """NVRTC is missing or a compile failed; `log` holds NVRTC's log ('' when there is none)."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def candidates() -> list[Path]:
    """Where libnvrtc may be, in the order `load` tries them."""
    found: list[Path] = []
    for entry in sys.path:
        for sub in _WHEEL_DIRS:
            folder = Path(entry or ".") / sub
            if folder.is_dir():
                found += sorted((p for p in folder.glob("libnvrtc.so.*")
                                 if "builtins" not in p.name and ".alt." not in p.name),
                                reverse=True)
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in filter(None, homes):
        for lib in ("lib64", "lib"):
            found += sorted(Path(home, lib).glob("libnvrtc.so*"), reverse=True)
    name = ctypes.util.find_library("nvrtc")
    if name:
        found.append(Path(name))
    return list(dict.fromkeys(found))


@functools.lru_cache(maxsize=None)
def load() -> "Nvrtc":
    """The first libnvrtc of `candidates()` that opens; NvrtcError naming where it looked."""
    tried = []
    for path in candidates():
        try:
            return Nvrtc(ctypes.CDLL(str(path)), path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    where = "; ".join(tried) or "no libnvrtc in the nvidia wheels, $CUDA_HOME or the loader path"
    raise NvrtcError("NVRTC not found: install the gpu extra (pip install -e '.[gpu]', which "
                     f"brings nvidia-cuda-nvrtc-cu12) or a CUDA toolkit; tried: {where}")


def available() -> bool:
    try:
        load()
    except NvrtcError:
        return False
    return True


class Nvrtc:
    """One opened libnvrtc (see the module doc)."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.lib, self.path = lib, path
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        self.archs = self._archs()

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            text = self.lib.nvrtcGetErrorString(result) or b"unknown error"
            raise NvrtcError(f"{what} failed: {text.decode()} ({result})")

    def _archs(self) -> tuple[str, ...]:
        n = ctypes.c_int()
        self._check(self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
        arr = (ctypes.c_int * n.value)()
        self._check(self.lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
        return tuple(f"sm_{a}" for a in arr)

    def compile(self, source: str, arch: str, options: Sequence[str] = (),
                name: str = "kernels.cu") -> bytes:
        """PTX for arch "compute_XY", CUBIN for "sm_XY" (see the module doc)."""
        kind, _, number = arch.partition("_")
        if kind not in ("compute", "sm") or not number.isdigit():
            raise NvrtcError(f"arch {arch!r} is neither compute_XY (PTX) nor sm_XY (CUBIN)")
        if f"sm_{number}" not in self.archs:
            raise NvrtcError(f"NVRTC {self.version[0]}.{self.version[1]} ({self.path}) cannot "
                             f"target {arch}; it supports {', '.join(self.archs)}")
        lib, prog = self.lib, ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                           0, None, None), "nvrtcCreateProgram")
        try:
            opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options]
            result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            log = self._log(prog)
            if result != 0:
                first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:300])
                raise NvrtcError(f"NVRTC could not compile {name} for {arch}: {first.strip()}", log)
            getter = "CUBIN" if kind == "sm" else "PTX"
            return self._output(prog, getter)
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value)
        self._check(self.lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        return buf.value.decode(errors="replace")

    def _output(self, prog: ctypes.c_void_p, kind: str) -> bytes:
        size = ctypes.c_size_t()
        self._check(getattr(self.lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)),
                    f"nvrtcGet{kind}Size")
        buf = ctypes.create_string_buffer(size.value)
        self._check(getattr(self.lib, f"nvrtcGet{kind}")(prog, buf), f"nvrtcGet{kind}")
        raw = buf.raw
        return raw.rstrip(b"\0") if kind == "PTX" else raw


def version_string(lib: Optional[Nvrtc] = None) -> str:
    lib = lib or load()
    return f"NVRTC {lib.version[0]}.{lib.version[1]} ({lib.path})"
