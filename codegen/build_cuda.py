"""Compile a plan's kernels to PTX/CUBIN with NVRTC through CuPy, cache them, write them out, load
and launch them on a GPU with CuPy.

    src = module_source(kernels)                       # one CUDA translation unit (text)
    ptx = compile_module(src, "compute_90")            # bytes, cached under <repo>/.cache/cuda/
    paths = write_sources(kernels, "run/kernels", "adam_fusion_AR-C", archs=("sm_80", "sm_90"))
    fns = build(kernels, device=0)                     # needs a GPU: {name: CudaKernel}
    fns[k.name](begin, end, rank, [tensor of buffer id for id in k.args()], workspace)

Contract
- All kernels render (`CudaRenderer.render_module`) into ONE translation unit (identical kernels
  once, in name order; comm=symm's fused steps, `codegen.symm_fuse.SymmStep`s given among the
  kernels, after them: `codegen.render_symm`); a kernel the renderer cannot express is a `codegen.build.BuildError`
  (the CPU backend's error type, so callers catch one type), so is a compile error (one line: the
  first error of NVRTC's log; the whole log in `.log` and in `<cache>/<module>.<arch>.log`).
- Options `OPTIONS`: C++17 and `--fmad=false` (no FMA contraction, so f32/f64 results round as
  `dsl.interpret`'s numpy does; the kernels are memory-bound, contraction would buy no time).
- The cache: `<repo>/.cache/cuda/<hash>.<arch>.{ptx,cubin}`, the hash covering the source, the
  options and the NVRTC version (so schedules with the same kernels share one compile). Files are
  written to a temporary name and renamed, so ranks compiling the same module at once never read
  a partial file; each has a `.sha256` beside it, written first: a file that does not match it
  (damaged, cut short, or from before the checksums) is reported in one line and compiled again.
- `write_sources` writes `<name>.cu` and, for every `sm_XY` of `archs`, `<name>.sm_XY.ptx` (PTX for
  `compute_XY`: what the driver JIT-compiles for that GPU and any newer one); returns the paths.
- `build` compiles a CUBIN for the GPU's own `sm_XY` (PTX for the newest arch NVRTC knows, if it
  does not know that GPU's) and loads it with `cupy.RawModule`; a `CudaKernel` launches on CuPy's
  current stream (the CUDA backend makes its compute stream current), with its pointers and
  integers passed by value as CuPy passes Python ints (int64). Units: bytes, elements.
- NVRTC is `cupy.cuda.nvrtc`, which compiles without a GPU or driver (libnvrtc from the
  `nvidia-cuda-nvrtc-cu12` wheel or a CUDA toolkit); CI compiles every generated kernel this way.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import cupy
from cupy.cuda import nvrtc

from . import cache, render_symm
from .build import BuildError
from .plan import Kernel
from .render import RenderError
from .render_cuda import CudaRenderer, Launch
from .symm_fuse import SymmStep

log = logging.getLogger(__name__)

OPTIONS = ("--std=c++17", "--fmad=false")
DEFAULT_ARCHS = ("sm_80", "sm_90")
RENDERER = CudaRenderer()
_ARCH = re.compile(r"^sm_\d+$")


def cache_dir() -> Path:
    path = cache.cache_dir() / "cuda"
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_archs(archs: Sequence[str]) -> tuple[str, ...]:
    """The archs, checked: each `sm_XY` and known to this NVRTC; BuildError naming a bad one."""
    known = nvrtc_archs()
    for arch in archs:
        if not _ARCH.match(str(arch)):
            raise BuildError(f"arch {arch!r} is not of the form sm_XY (e.g. sm_80, sm_90)")
        if arch not in known:
            raise BuildError(f"{nvrtc_version()} cannot build {arch}; it builds {', '.join(known)}")
    return tuple(archs)


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> str:
    """ "NVRTC 12.9" (BuildError when CuPy finds no libnvrtc)."""
    try:
        major, minor = nvrtc.getVersion()
    except Exception as e:  # noqa: BLE001 - CuPy raises several types for a missing library
        raise BuildError(
            f"NVRTC not found ({type(e).__name__}: {e}): install the gpu extra "
            "(pip install -e '.[gpu]', which brings nvidia-cuda-nvrtc-cu12)"
        ) from None
    return f"NVRTC {major}.{minor}"


@functools.lru_cache(maxsize=None)
def nvrtc_archs() -> tuple[str, ...]:
    """The `sm_XY` this NVRTC can target (NVRTC 13 dropped sm_70, the V100 of the paper)."""
    nvrtc_version()
    return tuple(f"sm_{a}" for a in nvrtc.getSupportedArchs())


def module_source(kernels: Sequence[Kernel | SymmStep]) -> str:
    """The translation unit of `kernels`; comm=symm's fused steps (`SymmStep`s) among them are
    rendered after the plain kernels by `codegen.render_symm`."""
    steps = [k for k in kernels if isinstance(k, SymmStep)]
    plain = [k for k in kernels if not isinstance(k, SymmStep)]
    try:
        return render_symm.module(plain, steps) if steps else RENDERER.render_module(plain)
    except RenderError as e:
        raise BuildError(str(e)) from None


def launches(kernels: Sequence[Kernel | SymmStep]) -> dict[str, Launch]:
    """Launch descriptions of the plain kernels (a SymmStep's: `render_symm.symm_launch`)."""
    try:
        return {k.name: RENDERER.launch(k) for k in kernels if not isinstance(k, SymmStep)}
    except RenderError as e:
        raise BuildError(str(e)) from None


def source_hash(source: str) -> str:
    """What the compiled module depends on: the source, the options, the NVRTC version."""
    key = "\n".join([source, " ".join(OPTIONS), nvrtc_version()])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def module_name(source: str, name: Optional[str] = None) -> str:
    prefix = re.sub(r"[^\w.-]", "_", name or "coconet")[:60]
    return f"{prefix}_{source_hash(source)}"


def cache_path(source: str, arch: str) -> Path:
    """Where the compiled module lives: by hash only, so equal sources of any name share it."""
    return (
        cache_dir() / f"{source_hash(source)}.{arch}.{'cubin' if arch.startswith('sm_') else 'ptx'}"
    )


def compile_module(source: str, arch: str, name: Optional[str] = None) -> bytes:
    """PTX ("compute_XY") or CUBIN ("sm_XY") of `source`, from the cache when it is there."""
    path = cache_path(source, arch)
    cached = _checked(path)
    if cached is not None:
        return cached
    mname = module_name(source, name)
    kind, _, number = arch.partition("_")
    if kind not in ("compute", "sm") or f"sm_{number}" not in nvrtc_archs():
        raise BuildError(
            f"{nvrtc_version()} cannot target {arch}; it supports "
            f"{', '.join(nvrtc_archs())} (as sm_XY or compute_XY)"
        )
    prog = nvrtc.createProgram(source, f"{mname}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *OPTIONS])
        except nvrtc.NVRTCError:
            log = nvrtc.getProgramLog(prog)
            log_path = cache_dir() / f"{mname}.{arch}.log"
            log_path.write_text(log)
            first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:300])
            raise BuildError(
                f"NVRTC could not compile {mname}.cu for {arch}: {first.strip()} (log: {log_path})",
                log,
                log_path,
            ) from None
        image = nvrtc.getCUBIN(prog) if kind == "sm" else nvrtc.getPTX(prog).rstrip(b"\0")
    finally:
        nvrtc.destroyProgram(prog)
    _write_atomic(_sum_path(path), hashlib.sha256(image).hexdigest().encode())
    _write_atomic(path, image)
    return image


def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _checked(path: Path) -> Optional[bytes]:
    """The cached file's bytes where they match their checksum; None where there is none, or
    where they do not (one line on stderr, the file removed: it is compiled again)."""
    try:
        image = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        expected = _sum_path(path).read_text().strip()
    except FileNotFoundError:
        expected = ""
    if hashlib.sha256(image).hexdigest() == expected:
        return image
    log.warning(f"cuda cache: {path} does not match its checksum; compiling it again")
    path.unlink(missing_ok=True)
    return None


def ptx_arch(arch: str) -> str:
    """sm_XY -> compute_XY, the virtual arch whose PTX runs on sm_XY and newer GPUs."""
    return "compute_" + arch.split("_", 1)[1]


def write_sources(
    kernels: Sequence[Kernel], directory, name: str, archs: Sequence[str] = DEFAULT_ARCHS
) -> list[Path]:
    """`<name>.cu` and one `<name>.<arch>.ptx` per arch in `directory` (see the module doc)."""
    source = module_source(kernels)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.cu"]
    paths[0].write_text(source)
    for arch in check_archs(archs):
        paths.append(folder / f"{name}.{arch}.ptx")
        paths[-1].write_bytes(compile_module(source, ptx_arch(arch), name))
    return paths


# -- on a GPU ------------------------------------------------------------------------------------
@dataclass
class CudaKernel:
    """One loaded kernel, called as the Kernel interface says (`codegen.runtime.backend`)."""

    launch: Launch
    function: object  # cupy.RawKernel
    sms: int

    @property
    def workspace_bytes(self) -> int:
        return self.launch.workspace_bytes

    def __call__(self, begin: int, end: int, rank: int, bufs: Sequence, workspace=None) -> None:
        if end <= begin:
            return
        args = [begin, end, rank] + [t.data_ptr() for t in bufs]
        if self.launch.sums:
            if workspace is None or workspace.numel() < self.launch.workspace_bytes:
                raise ValueError(
                    f"{self.launch.name} needs a zeroed workspace of "
                    f"{self.launch.workspace_bytes} bytes"
                )
            args.append(workspace.data_ptr())
        grid = self.launch.grid(end - begin, self.sms)
        self.function((grid,), (self.launch.threads,), tuple(args))


def device_arch(device: int) -> str:
    """What to build for the GPU `device`: its sm_XY (CUBIN), else the newest compute_XY NVRTC
    knows below it (PTX, compiled by the driver)."""
    cc = int(cupy.cuda.Device(device).compute_capability)
    arch = f"sm_{cc}"
    if arch in nvrtc_archs():
        return arch
    older = [a for a in nvrtc_archs() if int(a[3:]) <= cc]
    if not older:
        raise BuildError(f"{nvrtc_version()} cannot build for {arch}")
    return ptx_arch(max(older, key=lambda a: int(a[3:])))


def build(
    kernels: Sequence[Kernel], name: Optional[str] = None, device: int = 0
) -> dict[str, CudaKernel]:
    """Compile (or take from the cache) and load all `kernels` on GPU `device`."""
    source = module_source(kernels)
    arch = device_arch(device)
    compile_module(source, arch, name)
    try:
        with cupy.cuda.Device(device):
            module = cupy.RawModule(path=str(cache_path(source, arch)))
            sms = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
            return {
                n: CudaKernel(info, module.get_function(n), sms)
                for n, info in launches(kernels).items()
            }
    except cupy.cuda.driver.CUDADriverError as e:
        raise BuildError(
            f"loading {module_name(source, name)} on cuda:{device} failed: {e}"
        ) from None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
