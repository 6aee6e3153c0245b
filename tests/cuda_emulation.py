"""Run generated CUDA kernels on the CPU, for tests on machines without a GPU.

The module source from `codegen.render_cuda` is compiled by the host C++ compiler after `SHIM`,
which defines the CUDA features the kernels use: `__global__` functions become plain functions run
by `block` std::threads per block, one block after another (the real grid-stride loop, vector and
tail paths, warp shuffles through a per-warp barrier, `__syncthreads` as a block barrier, the
grid-wide sums' partials, atomic counter and last-block logic). What it cannot show: timing,
memory-model subtleties of real hardware (blocks here never run at once), CUDA's own math library
(exp and pow come from libm here) and anything of the driver, NCCL or streams.

comm=symm's fused kernels (`codegen.render_symm`, given as `steps`) run differently: every block
of every member (grid (B, P), blockIdx.y = member) at once, one std::thread per CUDA thread, so
that the signal-pad waits make progress (spins yield); the flags are GCC atomics with the
kernel's acquire/release orders. Their blocks use no shared memory (each block's barriers and
shuffle slots are its own: thread-local pointers).

    lib = EmulatedModule(kernels, workdir)
    lib.run(kernel, begin, end, rank, [tensor per kernel.args()], workspace)  # CPU torch tensors
    fns = lib.functions()  # {name: fn}, Kernels as codegen.runtime.backend says: fn(b, e, r, bufs,
                           # workspace), fn.workspace_bytes: what PlanRunner takes
    lib = EmulatedModule(kernels, workdir, steps=[symm_step])
    lib.run_symm(step, blocks, members, rank0, table)  # table: an int64 tensor of addresses
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from codegen import render_symm
from codegen.render_cuda import CudaRenderer

BLOCK = 64  # threads per block here (the kernels take any multiple of 32)
MAX_GRID = 3  # blocks at most: enough for the grid-stride loop to wrap and sums to span blocks
SYMM_BLOCK = 32  # threads per block of comm=symm's kernels (every block of every member at once)

SHIM = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)
struct cc_dim3 { unsigned int x = 0, y = 1, z = 1; };
thread_local cc_dim3 threadIdx, blockIdx;
cc_dim3 blockDim, gridDim;
struct cc_block_ctx {  // one block's barrier, per-warp barriers and shuffle slots
  std::barrier<> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  uint64_t slots[32][32];
  explicit cc_block_ctx(int block) : bar(block) {
    for (int w = 0; w < block / 32; ++w) warps.emplace_back(new std::barrier<>(32));
  }
};
static thread_local cc_block_ctx* cc_ctx;
inline void __syncthreads() { cc_ctx->bar.arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void cc_host_pause() { std::this_thread::yield(); }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <class T> T __shfl_down_sync(unsigned int, T v, unsigned int delta) {
  const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::memcpy(&cc_ctx->slots[warp][lane], &v, sizeof(T));
  cc_ctx->warps[warp]->arrive_and_wait();
  T out = v;
  if (lane + delta < 32) std::memcpy(&out, &cc_ctx->slots[warp][lane + delta], sizeof(T));
  cc_ctx->warps[warp]->arrive_and_wait();
  return out;
}
template <class T> T __shfl_xor_sync(unsigned int, T v, unsigned int mask) {
  const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::memcpy(&cc_ctx->slots[warp][lane], &v, sizeof(T));
  cc_ctx->warps[warp]->arrive_and_wait();
  T out;
  std::memcpy(&out, &cc_ctx->slots[warp][lane ^ mask], sizeof(T));
  cc_ctx->warps[warp]->arrive_and_wait();
  return out;
}
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline double __longlong_as_double(long long u) { double d; std::memcpy(&d, &u, 8); return d; }
"""

LAUNCHER = r"""
template <class... Ps, std::size_t... I>
static void cc_call(void (*f)(int64_t, int64_t, int64_t, Ps...), int64_t b, int64_t e, int64_t r,
                    void** p, std::index_sequence<I...>) {
  f(b, e, r, static_cast<Ps>(p[I])...);
}
template <class... Ps>
static void cc_emulate(void (*f)(int64_t, int64_t, int64_t, Ps...), int grid, int block,
                       int64_t b, int64_t e, int64_t r, void** p) {
  blockDim.x = block;
  gridDim.x = grid;
  gridDim.y = 1;
  for (int g = 0; g < grid; ++g) {
    cc_block_ctx ctx(block);
    std::vector<std::thread> threads;
    for (int t = 0; t < block; ++t)
      threads.emplace_back([=, &ctx] {
        cc_ctx = &ctx;
        blockIdx.x = g;
        threadIdx.x = t;
        cc_call(f, b, e, r, p, std::index_sequence_for<Ps...>{});
      });
    for (auto& t : threads) t.join();
  }
}
// comm=symm: every block of every member at once (grid gx x gy), so flag waits make progress
static void cc_emulate_all(void (*f)(int64_t, const uint64_t*), int gx, int gy, int block,
                           int64_t rank0, const uint64_t* table) {
  blockDim.x = block;
  gridDim.x = gx;
  gridDim.y = gy;
  std::vector<std::unique_ptr<cc_block_ctx>> ctxs;
  for (int g = 0; g < gx * gy; ++g) ctxs.emplace_back(new cc_block_ctx(block));
  std::vector<std::thread> threads;
  for (int g = 0; g < gx * gy; ++g)
    for (int t = 0; t < block; ++t)
      threads.emplace_back([=, &ctxs] {
        cc_ctx = ctxs[g].get();
        blockIdx.x = g % gx;
        blockIdx.y = g / gx;
        threadIdx.x = t;
        f(rank0, table);
      });
  for (auto& t : threads) t.join();
}
"""


class EmulatedKernel:
    def __init__(self, module: "EmulatedModule", kernel):
        self.module, self.kernel, self.launch = module, kernel, module.launches[kernel.name]
        self.workspace_bytes = self.launch.workspace_bytes

    def __call__(self, begin, end, rank, bufs, workspace=None) -> None:
        self.module.run(self.kernel, begin, end, rank, bufs, workspace)


class EmulatedModule:
    """The kernels' CUDA module compiled for the host (cached in `workdir` by source hash)."""

    def __init__(self, kernels: Sequence, workdir: Path, steps: Sequence = ()):
        renderer = CudaRenderer()
        unique = {k.name: k for k in kernels}
        self.kernels = unique
        self.launches = {n: renderer.launch(k) for n, k in unique.items()}
        self.steps = {s.name: s for s in steps}
        text = (
            render_symm.module(list(unique.values()), list(self.steps.values()))
            if steps
            else renderer.render_module(list(unique.values()))
        )
        source = (
            SHIM
            + text
            + LAUNCHER
            + "".join(
                f'extern "C" void emu_{n}(int g, int b, int64_t s, int64_t e, int64_t r, void** p) '
                f"{{ cc_emulate(&{n}, g, b, s, e, r, p); }}\n"
                for n in sorted(unique)
            )
            + "".join(
                f'extern "C" void emu_{n}(int gx, int gy, int b, int64_t r0, const uint64_t* t) '
                f"{{ cc_emulate_all(&{n}, gx, gy, b, r0, t); }}\n"
                for n in sorted(self.steps)
            )
        )
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        lib = Path(workdir) / f"emulated_{digest}.so"
        if not lib.exists():
            src = lib.with_suffix(".cpp")
            src.write_text(source)
            cmd = [
                shutil.which("g++") or "c++",
                "-std=c++20",
                "-O1",
                "-shared",
                "-fPIC",
                "-pthread",
                "-ffp-contract=off",
                "-w",
                str(src),
                "-o",
                str(lib),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode:
                raise RuntimeError(
                    f"host compile of the emulated kernels failed:\n{out.stderr[-4000:]}"
                )
        self.lib = ctypes.CDLL(str(lib))

    def run(self, kernel, begin: int, end: int, rank: int, bufs: Sequence, workspace=None) -> None:
        launch = self.launches[kernel.name]
        if end <= begin:
            return
        ptrs = [t.data_ptr() for t in bufs] + ([workspace.data_ptr()] if launch.sums else [])
        work = -(-(end - begin) // launch.vec)
        grid = max(1, min(-(-work // BLOCK), MAX_GRID))
        fn = getattr(self.lib, f"emu_{kernel.name}")
        fn(
            ctypes.c_int(grid),
            ctypes.c_int(BLOCK),
            ctypes.c_int64(begin),
            ctypes.c_int64(end),
            ctypes.c_int64(rank),
            (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs),
        )

    def run_symm(self, step, blocks: int, members: int, rank0: int, table) -> None:
        """comm=symm's kernel of `step` on grid (blocks, members), every block at once; `table`
        a CPU int64 tensor of addresses (`codegen.render_symm`'s pointer table)."""
        fn = getattr(self.lib, f"emu_{step.name}")
        fn(
            ctypes.c_int(blocks),
            ctypes.c_int(members),
            ctypes.c_int(SYMM_BLOCK),
            ctypes.c_int64(rank0),
            ctypes.c_void_p(table.data_ptr()),
        )

    def functions(self) -> dict:
        return {n: EmulatedKernel(self, k) for n, k in self.kernels.items()}
