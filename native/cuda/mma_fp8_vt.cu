// The V prepass of fwd_mma_fp8.cu: e4m3 V codes [batch, kv_head, key, dim] (any strides, dim
// contiguous) -> Vt [batch][kv_head][dim][vt_len] e4m3, keys permuted within each group of 16
// so that byte position L of a group holds key perm(L) = 2 * (L / 4) + (L % 2) + 8 * ((L / 2) % 2)
// (positions 4t..4t+3: keys 2t, 2t+1, 2t+8, 2t+9; fwd_mma_fp8.cu's header says why). Keys
// kv_len..vt_len-1 are written as code 0 (+0), so that the kernel can copy whole tiles and
// never multiplies a P of 0 by a stray NaN code.
//
// Grid (vt_len / 64, kv_heads, batch), 256 threads: a CTA reads 64 keys x HEAD_DIM bytes with
// 4-byte loads along the dim, and writes HEAD_DIM rows of 64 bytes with 4-byte stores along
// the keys. Codes are moved, never converted: the prepass is exact.
//
// Compile-time parameters: HEAD_DIM (64 | 128). Launch ABI `Fp8VtParams`; Rust mirror
// `Fp8VtParams` in src/mma_fp8.rs.
#include "common.cuh"

#ifndef HEAD_DIM
#error "mma_fp8_vt.cu needs HEAD_DIM"
#endif

namespace vt {
constexpr int D = HEAD_DIM;
constexpr int KEYS = 64;                    // keys per CTA
constexpr int THREADS = 256;
constexpr int ROW = D + 4;                  // shared row pitch: breaks the column reads' bank conflicts
static_assert(D % 4 == 0, "4-byte words along the dim");
}  // namespace vt

struct Fp8VtParams {
    u64 v, vt;                                 // e4m3 codes in, Vt out
    i64 v_batch_stride, v_head_stride, v_seq_stride;   // bytes
    int kv_len, kv_heads, vt_len, pad_;
};

extern "C" __global__ void __launch_bounds__(vt::THREADS) mma_fp8_vt(const Fp8VtParams p) {
    __shared__ __align__(16) unsigned char tile[vt::KEYS * vt::ROW];
    const int key0 = blockIdx.x * vt::KEYS;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const unsigned char* src = reinterpret_cast<const unsigned char*>(p.v) + b * p.v_batch_stride + h * p.v_head_stride;
    constexpr int WORDS = vt::D / 4;         // 4-byte words per V row
    for (int idx = threadIdx.x; idx < vt::KEYS * WORDS; idx += vt::THREADS) {
        const int r = idx / WORDS;
        const int w = idx % WORDS;
        const int key = key0 + r;
        u32 x = 0;
        if (key < p.kv_len) x = __ldg(reinterpret_cast<const u32*>(src + (i64)key * p.v_seq_stride) + w);
        *reinterpret_cast<u32*>(tile + r * vt::ROW + 4 * w) = x;
    }
    __syncthreads();
    unsigned char* dst = reinterpret_cast<unsigned char*>(p.vt) + ((i64)b * p.kv_heads + h) * vt::D * (i64)p.vt_len + key0;
    // Word j of a 64-key row: group j / 4 of 16 keys, positions 4t..4t+3 with t = j % 4.
    for (int idx = threadIdx.x; idx < vt::D * (vt::KEYS / 4); idx += vt::THREADS) {
        const int d = idx / (vt::KEYS / 4);
        const int j = idx % (vt::KEYS / 4);
        const int k = 16 * (j >> 2) + 2 * (j & 3);
        const u32 w = (u32)tile[k * vt::ROW + d] | ((u32)tile[(k + 1) * vt::ROW + d] << 8) |
                      ((u32)tile[(k + 8) * vt::ROW + d] << 16) | ((u32)tile[(k + 9) * vt::ROW + d] << 24);
        *reinterpret_cast<u32*>(dst + (i64)d * p.vt_len + 4 * j) = w;
    }
}
