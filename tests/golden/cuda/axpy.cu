extern "C" __global__ void __launch_bounds__(256)
axpy(const int64_t begin, const int64_t end, const int64_t rank, const float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2, float* __restrict__ b4) {
  const float v2 = b2[0];
  const int64_t cc_tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cc_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t cc_rest = begin;
  if (cc_aligned(b0 + begin, 16) && cc_aligned(b1 + begin, 16) && cc_aligned(b4 + begin, 16)) {
    const int64_t cc_nvec = (end - begin) / 4;
    for (int64_t cc_q = cc_tid; cc_q < cc_nvec; cc_q += cc_stride) {
      const int64_t e0 = begin + cc_q * 4;
      float r0[4];
      cc_ldv(b0 + e0, r0);
      float r1[4];
      cc_ldv(b1 + e0, r1);
      float w4[4];
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float v0 = r0[j];
        const float v1 = r1[j];
        const float v3 = (v2 * v0);  // t3
        const float v4 = (v3 + v1);  // out
        w4[j] = v4;
      }
      cc_stv(b4 + e0, w4);
    }
    cc_rest = begin + cc_nvec * 4;
  }
  for (int64_t e = cc_rest + cc_tid; e < end; e += cc_stride) {
    const float v0 = b0[e];
    const float v1 = b1[e];
    const float v3 = (v2 * v0);  // t3
    const float v4 = (v3 + v1);  // out
    b4[e] = v4;
  }
}
