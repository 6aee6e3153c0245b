"""The few CUDA driver calls the CUDA backend needs, through ctypes: load a compiled module into the
context torch uses, and launch its kernels on torch's streams with torch's tensors.

    mod = Module(image, device=0)             # image: a CUBIN (or PTX, JIT-compiled by the driver)
    fn = mod.function("adam_k1_...")
    launch(fn, grid, block, [c_int64(b), c_int64(e), c_int64(r), c_void_p(ptr), ...], stream)

Contract
- The driver is `libcuda.so.1` (installed with the NVIDIA driver, never by pip); `driver()` opens it
  once and calls `cuInit`. Without a driver, `CudaDriverError` says so in one line.
- `Module` loads into the device's primary context, the one torch's runtime uses, so kernels and
  torch operations share memory and streams. It makes sure torch has created that context first.
- `launch` passes each argument by address as `cuLaunchKernel` wants (`kernelParams`); the ctypes
  values must match the kernel's parameter types (int64_t: c_int64, pointers: c_void_p). `stream`
  is a `torch.cuda.Stream` (or its integer handle); launches are asynchronous, as torch's are.
The same calls as `torch.cuda._utils` (torch's own NVRTC-kernel path) makes, without its private API.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Sequence

_VOIDP = ctypes.c_void_p
_UINT = ctypes.c_uint


class CudaDriverError(RuntimeError):
    """A failed driver call (or no driver), in one line."""


@functools.lru_cache(maxsize=None)
def driver() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CudaDriverError(f"no CUDA driver on this machine (libcuda.so.1: {e})") from None
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(_VOIDP), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(_VOIDP), _VOIDP, ctypes.c_char_p]
    lib.cuModuleUnload.argtypes = [_VOIDP]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(_VOIDP)]
    lib.cuLaunchKernel.argtypes = [_VOIDP, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _VOIDP,
                                   ctypes.POINTER(_VOIDP), ctypes.POINTER(_VOIDP)]
    check(lib.cuInit(0), "cuInit", lib)
    return lib


def check(result: int, what: str, lib: ctypes.CDLL | None = None) -> None:
    if result == 0:
        return
    lib = lib or driver()
    text = ctypes.c_char_p()
    lib.cuGetErrorString(result, ctypes.byref(text))
    raise CudaDriverError(f"{what} failed: CUDA error {result} "
                          f"({text.value.decode() if text.value else 'unknown'})")


class Module:
    """A module loaded on `device` (an int index); its functions by name."""

    def __init__(self, image: bytes, device: int):
        import torch

        lib = driver()
        torch.cuda.set_device(device)
        torch.empty(1, device=f"cuda:{device}")  # torch's runtime makes the primary context current
        ctx = _VOIDP()
        check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise CudaDriverError(f"no current CUDA context on device {device} after torch's init")
        self.device, self.handle = device, _VOIDP()
        self._image = image  # kept alive with the module
        check(lib.cuModuleLoadData(ctypes.byref(self.handle), image), "cuModuleLoadData")
        self._functions: dict[str, _VOIDP] = {}

    def function(self, name: str) -> _VOIDP:
        if name not in self._functions:
            fn = _VOIDP()
            check(driver().cuModuleGetFunction(ctypes.byref(fn), self.handle, name.encode()),
                  f"cuModuleGetFunction({name})")
            self._functions[name] = fn
        return self._functions[name]


def launch(fn: _VOIDP, grid: int, block: int, args: Sequence[ctypes._SimpleCData], stream) -> None:
    """Launch fn on a 1-D grid (see the module doc); `args` are kept alive through the call."""
    handle = stream if isinstance(stream, int) else stream.cuda_stream
    params = (_VOIDP * len(args))(*[ctypes.addressof(a) for a in args])
    check(driver().cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, _VOIDP(handle), params, None),
          "cuLaunchKernel")
