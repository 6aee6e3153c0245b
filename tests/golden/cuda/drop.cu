extern "C" __global__ void __launch_bounds__(256)
drop(const int64_t begin, const int64_t end, const int64_t rank, const uint16_t* __restrict__ b0, uint16_t* __restrict__ b1) {
  const int64_t ro8 = rank * 8;
  const int64_t cc_tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cc_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t cc_rest = begin;
  if (cc_aligned(b0 + begin, 16) && cc_aligned(b1 + begin, 16)) {
    const int64_t cc_nvec = (end - begin) / 8;
    for (int64_t cc_q = cc_tid; cc_q < cc_nvec; cc_q += cc_stride) {
      const int64_t e0 = begin + cc_q * 8;
      uint16_t r0[8];
      cc_ldv(b0 + e0, r0);
      uint16_t w1[8];
      #pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t e = e0 + j;
        const int64_t i0 = e / 8;
        const int64_t i1 = e % 8;
        const float v0 = cc_h2f(r0[j]);
        const float v1 = cc_dropout(v0, static_cast<uint64_t>(i0 * 16 + i1 + ro8), 0xa0df3600u, 1677722u, 1.1113281f);  // y
        w1[j] = cc_f2h(v1);
      }
      cc_stv(b1 + e0, w1);
    }
    cc_rest = begin + cc_nvec * 8;
  }
  for (int64_t e = cc_rest + cc_tid; e < end; e += cc_stride) {
    const int64_t i0 = e / 8;
    const int64_t i1 = e % 8;
    const float v0 = cc_h2f(b0[e]);
    const float v1 = cc_dropout(v0, static_cast<uint64_t>(i0 * 16 + i1 + ro8), 0xa0df3600u, 1677722u, 1.1113281f);  // y
    b1[e] = cc_f2h(v1);
  }
}
