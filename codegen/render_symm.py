"""`backend.comm=symm`: a fused all-reduce (`codegen.symm_fuse.SymmStep`) as ONE CUDA kernel.

    text = render_step(step)                   # a device function and its __global__ kernel
    src = module(kernels, steps)               # one translation unit with the plan's kernels
    launch = symm_launch(step)                 # how to call it (`SymmLaunch`)

The kernel, per member `me` (= `rank0 + blockIdx.y`: one member per launch on real GPUs, all P
in one launch for virtual ranks on one GPU), with B = gridDim.x blocks per member:
1. epoch E = its signal pad's epoch + 1 (the pad is never reset: every launch counts one up,
   so a CUDA graph replays it as it is); block 0 posts `ready[me] = E` into every member's pad,
   every block waits until every member has posted E (their gradients and destinations are
   ready: their earlier work on their streams is done; and they are done with the previous step).
2. the chunk loop, in the order of `codegen.chunk_schedule.chunk_bounds` (the table rendered
   into the kernel is that function's value, the schedule comm=shm's `peer_fused` runs): every
   block runs its grid-stride share of chunk c of the step's kernel (`CudaRenderer`'s walk of
   `SymmStep.kernel`, rendered as a device function): it reads chunk c of block `me` of every
   member's gradient through the peer pointers, reduces it in member order (as `dsl.interpret`
   and the CPU's shm kernel), applies the update, writes block `me` of every gather's
   destination in every member's memory. Then each thread fences (`__threadfence_system`), and
   the last block to finish chunk c (a counter in the member's own pad, reset by that block)
   posts `done[me][c] = E` into every member's pad (a release store at system scope).
3. the last block to finish the loop waits until every member has posted `done[j][c] = E` for
   every chunk (acquire loads), then stores the epoch: the kernel returns only when every peer
   has written every chunk into this member's buffers.
Flags are 32-bit epochs compared modulo 2^32. Spin waits never wait on a block of the same
member, so B >= 1 of any size works across GPUs; over virtual ranks every block of the launch
must be resident at once (`SymmLaunch.virtual_grid`).

Signal pad of a member (uint32 words, `PadLayout`): epoch, exit counter, C chunk counters,
ready[P], done[P][C]; the launcher zeroes it once. Pointer table (uint64): `table[s*P + j]` =
member j's address of slot s (`SymmStep.slots`), then the P pads. Units: elements, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .plan import Kernel
from .render import RenderError, Walk
from .render_cuda import BLOCKS_PER_SM, HEADER, THREADS, CudaRenderer
from .symm_fuse import SymmStep

# Flags in peer memory: release/acquire at system scope (sm_70+); on the host (tests/
# cuda_emulation.py) the same orders through GCC's atomics.
SYMM_HEADER = r"""// comm=symm: signal pads (codegen.render_symm)
#if defined(__CUDA_ARCH__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ uint32_t cc_ld_acquire(const uint32_t* p) {
  uint32_t v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void cc_st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void cc_pause() { __nanosleep(64); }
#else
__device__ __forceinline__ uint32_t cc_ld_acquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
__device__ __forceinline__ void cc_st_release(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
__device__ __forceinline__ void cc_pause() { cc_host_pause(); }
#endif
// until *flag has reached epoch (modulo 2^32)
__device__ __forceinline__ void cc_wait_epoch(const uint32_t* flag, uint32_t epoch) {
  while (static_cast<int32_t>(cc_ld_acquire(flag) - epoch) < 0) cc_pause();
}
// one arrival of `total`; true for the last, which resets the counter for the next launch
__device__ __forceinline__ bool cc_arrive(uint32_t* count, uint32_t total) {
  if (atomicAdd(count, 1u) != total - 1u) return false;
  *count = 0u;
  __threadfence_system();
  return true;
}
"""


@dataclass(frozen=True)
class PadLayout:
    """Word offsets of a member's signal pad (uint32 words)."""

    P: int
    C: int

    epoch = 0
    exit = 1
    count = 2

    @property
    def ready(self) -> int:
        return self.count + self.C

    @property
    def done(self) -> int:
        return self.ready + self.P

    @property
    def words(self) -> int:
        return self.done + self.P * self.C

    @property
    def nbytes(self) -> int:
        return -(-self.words * 4 // 128) * 128


@dataclass(frozen=True)
class SymmLaunch:
    """How to launch a rendered SymmStep: `name(rank0, table)` with a grid of (B, members)."""

    name: str
    P: int
    table_len: int  # uint64 entries: (len(slots) + 1) * P
    pad_bytes: int
    threads: int = THREADS

    def grid(self, n: int, sms: int) -> int:
        """Blocks per member on one GPU of `sms` multiprocessors (n: the slice's elements)."""
        return max(1, min(-(-max(n, 1) // (self.threads * 4)), sms * BLOCKS_PER_SM))

    def virtual_grid(self, n: int, sms: int) -> int:
        """Blocks per member when all P members run in one launch on one GPU: at most one block
        per multiprocessor in all, so every block is resident and no spin wait can starve."""
        return max(1, min(self.grid(n, sms), sms // self.P))


class SymmRenderer(CudaRenderer):
    """The walk of a kernel as a device function, called once per chunk; its pointers are not
    `__restrict__` (block `me` of a gather's destination may be the local operand it reads)."""

    kernel_prefix = "__device__ __forceinline__ void"

    def _params(self, w: Walk, launch) -> list[str]:
        return [p.replace(" __restrict__", "") for p in super()._params(w, launch)]


RENDERER = SymmRenderer()


def symm_launch(step: SymmStep) -> SymmLaunch:
    return SymmLaunch(
        step.name,
        step.P,
        (len(step.slots) + 1) * step.P,
        PadLayout(step.P, len(step.chunks)).nbytes,
    )


def _args(step: SymmStep, w: Walk) -> list[str]:
    """The device function's arguments: pointers into the members' memory (see the module doc)."""
    P, slot = step.P, {b: i for i, b in enumerate(step.slots)}
    peer = {b: i for i, b in enumerate(step.peers)}
    push = {t: (p, j) for p in step.pushes for j, t in enumerate(p.targets)}
    out = []
    for b in step.kernel.args():
        t = RENDERER.storage_type[w.buffers[b]] if b in w.buffers else "void"
        if b in peer:
            out.append(
                f"reinterpret_cast<{t}*>(cc_ptrs[{slot[step.src] * P + peer[b]}]) + me * {step.n}"
            )
        elif b in push:
            p, j = push[b]
            out.append(f"reinterpret_cast<{t}*>(cc_ptrs[{slot[p.dst] * P + j}]) + me * {p.numel}")
        else:
            out.append(f"reinterpret_cast<{t}*>(cc_ptrs[{slot[b] * P} + me])")
    return out


def render_step(step: SymmStep) -> str:
    """The step's device function and its `extern "C" __global__` kernel (see the module doc)."""
    k: Kernel = step.kernel
    if k.reduces:
        raise RenderError(f"kernel {k.name}: sums are not rendered into a symm kernel")
    w = RENDERER.walk(k)
    P, C, lay = step.P, len(step.chunks), PadLayout(step.P, len(step.chunks))
    pads = len(step.slots) * P
    table = ", ".join(f"{{{lo}, {hi}}}" for lo, hi in step.chunks)
    args = ",\n      ".join(_args(step, w))
    return (
        RENDERER.function(w)
        + f"""
// comm=symm: {P} members, the {step.n}-element slice in {C} chunks (codegen.chunk_schedule)
__device__ const int64_t {step.name}_chunks[{C}][2] = {{{table}}};
extern "C" __global__ void __launch_bounds__({THREADS})
{step.name}(const int64_t cc_rank0, const uint64_t* __restrict__ cc_ptrs) {{
  const int64_t me = cc_rank0 + blockIdx.y;
  uint32_t* const cc_pad = reinterpret_cast<uint32_t*>(cc_ptrs[{pads} + me]);
  const uint32_t cc_epoch = cc_ld_acquire(cc_pad + {lay.epoch}) + 1u;
  if (blockIdx.x == 0 && threadIdx.x == 0)  // this member's buffers are ready for epoch E
    for (int j = 0; j < {P}; ++j)
      cc_st_release(reinterpret_cast<uint32_t*>(cc_ptrs[{pads} + j]) + {lay.ready} + me, cc_epoch);
  if (threadIdx.x == 0)
    for (int j = 0; j < {P}; ++j) cc_wait_epoch(cc_pad + {lay.ready} + j, cc_epoch);
  __syncthreads();
  for (int c = 0; c < {C}; ++c) {{
    {k.name}({step.name}_chunks[c][0], {step.name}_chunks[c][1], me,
      {args});
    __threadfence_system();  // this thread's writes to every member, before chunk c is posted
    __syncthreads();
    if (threadIdx.x == 0 && cc_arrive(cc_pad + {lay.count} + c, gridDim.x))
      for (int j = 0; j < {P}; ++j)
        cc_st_release(reinterpret_cast<uint32_t*>(cc_ptrs[{pads} + j]) + {lay.done} + me * {C} + c, cc_epoch);
  }}
  if (threadIdx.x == 0 && cc_arrive(cc_pad + {lay.exit}, gridDim.x)) {{
    for (int j = 0; j < {P}; ++j)  // every member's every chunk is in this member's buffers
      for (int c = 0; c < {C}; ++c) cc_wait_epoch(cc_pad + {lay.done} + j * {C} + c, cc_epoch);
    cc_st_release(cc_pad + {lay.epoch}, cc_epoch);
  }}
}}
"""
    )


def module(kernels: Sequence[Kernel], steps: Sequence[SymmStep]) -> str:
    """One translation unit: the CUDA header, the symm header, the plan's kernels (as
    `CudaRenderer.render_module`), then each distinct step (by name, sorted)."""
    base = CudaRenderer().render_module(list(kernels)) if kernels else HEADER
    texts: dict[str, str] = {}
    for s in steps:
        text = render_step(s)
        if texts.setdefault(s.name, text) != text:
            raise RenderError(f"two different symm steps are both named {s.name}")
    return "\n".join([base, SYMM_HEADER] + [texts[n] for n in sorted(texts)])


__all__ = [
    "PadLayout",
    "SYMM_HEADER",
    "SymmLaunch",
    "SymmRenderer",
    "module",
    "render_step",
    "symm_launch",
]
