// FlashAttention-2-style forward on mma.sync m16n8k16 (HMMA), fp16 or bf16 inputs.
//
// One CTA = BLOCK_M = 16 * WARPS query rows of one (batch, head); each warp owns 16 rows, holds
// its Q fragments in registers for the whole KV sweep and its O accumulator in f32 registers.
// K/V tiles of BLOCK_N keys stream through STAGES-deep cp.async buffers in swizzled shared
// memory. Compile-time parameters (all -D defines, the host builds them from one config):
//   HEAD_DIM      64 | 128
//   WARPS         warps per CTA (BLOCK_M = 16 * WARPS)
//   BLOCK_N       keys per KV tile
//   IN_BF16       0: fp16 inputs/outputs, 1: bf16
//   QK_ACC        0: f32 (HMMA.F32), 1: f16 (HMMA.F16), 2: two-stage (f16 MMAs over QK_CHUNK
//                 head dims, folded into f32 after each chunk)
//   QK_CHUNK      head-dim chunk of the two-stage mode (multiple of 16)
//   PV_ACC        0: f32, 1: f16 within one KV tile, folded into f32 per tile
// The launch ABI is `FwdParams` below; the Rust mirror is `HmmaParams` in src/hmma.rs.
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(WARPS) || !defined(BLOCK_N) || !defined(IN_BF16) || \
    !defined(QK_ACC) || !defined(QK_CHUNK) || !defined(PV_ACC)
#error "fwd_hmma.cu needs HEAD_DIM, WARPS, BLOCK_N, IN_BF16, QK_ACC, QK_CHUNK, PV_ACC"
#endif

#define QK_ACC_F32 0
#define QK_ACC_F16 1
#define QK_ACC_TWO_STAGE 2

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int BM = 16 * WARPS;
constexpr int BN = BLOCK_N;
constexpr int THREADS = 32 * WARPS;
constexpr int ROW_BYTES = D * 2;           // 16-bit elements
constexpr int CHUNKS = D / 8;              // 16-byte chunks per row
constexpr int KV_TILE_BYTES = BN * ROW_BYTES;
constexpr int STAGE_BYTES = 2 * KV_TILE_BYTES;   // K then V
constexpr int N_FRAGS = BN / 8;            // n8 accumulator tiles of S per warp
constexpr int D_FRAGS = D / 8;             // n8 accumulator tiles of O per warp
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(BN % 16 == 0 && BN >= 16, "BLOCK_N multiple of 16");
// Q is staged through the second K/V buffer before the first prefetch lands there, and O is
// staged through a free buffer in the epilogue: both need BM rows to fit in one stage.
static_assert(BM <= 2 * BN, "BLOCK_M rows must fit in one K+V stage");
static_assert((BM * CHUNKS) % THREADS == 0 && (BN * CHUNKS) % THREADS == 0, "even copy split");
static_assert(QK_ACC == QK_ACC_F32 || !IN_BF16, "bf16 MMAs accumulate in f32 only");
static_assert(PV_ACC == 0 || !IN_BF16, "bf16 MMAs accumulate in f32 only");
static_assert(QK_ACC != QK_ACC_TWO_STAGE || (QK_CHUNK % 16 == 0 && D % QK_CHUNK == 0), "chunk");
}  // namespace cfg

struct FwdParams {
    u64 q, k, v, o, lse;                       // device pointers
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // in elements; head dim is contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    i64 v_batch_stride, v_head_stride, v_seq_stride;
    i64 o_batch_stride, o_head_stride, o_seq_stride;
    int q_len, kv_len, q_heads, kv_group;      // kv_group = q_heads / kv_heads (GQA)
    float scale_log2;                          // softmax scale * log2(e)
    float scale;                               // softmax scale (natural-log LSE)
    int causal;                                // bottom-right aligned
    int pad_;
};

__device__ __forceinline__ void warp_mma_f32acc(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if IN_BF16
    warp_mma_bf16_f32acc(d, a, b0, b1);
#else
    warp_mma_f16_f32acc(d, a, b0, b1);
#endif
}
__device__ __forceinline__ u32 thread_pack_in(float lo, float hi) {
#if IN_BF16
    return thread_pack_bf16x2(lo, hi);
#else
    return thread_pack_f16x2(lo, hi);
#endif
}

// ---- global -> shared ----------------------------------------------------------------------

// Copies `ROWS` rows of one head (row stride `stride` elements) into a swizzled tile; rows at or
// past `rows_valid` are zero-filled (their source address is clamped to row 0, never read).
template <int ROWS>
__device__ __forceinline__ void cta_load_tile(u32 dst, const unsigned short* src, i64 stride,
                                              int rows_valid) {
    constexpr int PER_THREAD = ROWS * cfg::CHUNKS / cfg::THREADS;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
        const int idx = threadIdx.x + i * cfg::THREADS;
        const int row = idx / cfg::CHUNKS;
        const int chunk = idx % cfg::CHUNKS;
        const bool ok = row < rows_valid;
        const unsigned short* s = src + (ok ? (i64)row * stride : 0) + chunk * 8;
        thread_cp_async_16(dst + tile_swizzle<cfg::ROW_BYTES>(row, chunk), s, ok ? 16 : 0);
    }
}

// ---- mainloop pieces (one warp, 16 query rows) ---------------------------------------------

// S = Q·K^T for the warp's 16 rows and BN keys, in f32 whatever the accumulation mode.
__device__ __forceinline__ void warp_score_matmul(float (&s)[cfg::N_FRAGS][4],
                                                  const u32 (&qf)[cfg::D / 16][4], u32 k_tile,
                                                  int lane) {
    // ldmatrix.x4 lane -> row address: matrices (keys +0..7, dims +0..7), (keys +0..7, dims
    // +8..15), (keys +8..15, dims +0..7), (keys +8..15, dims +8..15) = b0,b1 of two n8 tiles.
    const int mi = lane >> 3;
    const int key = ((mi >> 1) << 3) + (lane & 7);
    const int chunk_lo = mi & 1;
#pragma unroll
    for (int n = 0; n < cfg::N_FRAGS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;

#if QK_ACC == QK_ACC_F32
#pragma unroll
    for (int kk = 0; kk < cfg::D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < cfg::BN / 16; ++np) {
            u32 b[4];
            warp_ldmatrix_x4(b, k_tile + tile_swizzle<cfg::ROW_BYTES>(np * 16 + key, kk * 2 + chunk_lo));
            warp_mma_f32acc(s[2 * np], qf[kk], b[0], b[1]);
            warp_mma_f32acc(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
    }
#else
    // F16: one chunk spanning the whole head dim; TWO_STAGE: f16 partial sums over QK_CHUNK
    // dims stay small enough that fp16 rounding of the running sum is bounded per chunk.
    constexpr int CHUNK = (QK_ACC == QK_ACC_F16) ? cfg::D : QK_CHUNK;
#pragma unroll
    for (int c0 = 0; c0 < cfg::D; c0 += CHUNK) {
        u32 h[cfg::N_FRAGS][2];
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) h[n][0] = h[n][1] = 0u;
#pragma unroll
        for (int kk = c0 / 16; kk < (c0 + CHUNK) / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < cfg::BN / 16; ++np) {
                u32 b[4];
                warp_ldmatrix_x4(b, k_tile + tile_swizzle<cfg::ROW_BYTES>(np * 16 + key, kk * 2 + chunk_lo));
                warp_mma_f16_f16acc(h[2 * np], qf[kk], b[0], b[1]);
                warp_mma_f16_f16acc(h[2 * np + 1], qf[kk], b[2], b[3]);
            }
        }
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) {
            float a, b, c, d;
            thread_unpack_f16x2(h[n][0], a, b);
            thread_unpack_f16x2(h[n][1], c, d);
            s[n][0] += a; s[n][1] += b; s[n][2] += c; s[n][3] += d;
        }
    }
#endif
}

// Online softmax over one tile: updates the running max `m` (raw score units) and per-lane
// partial row sums `l`, rescales O, and returns P packed as the A operand of P·V.
// Rows are g = lane/4 (index 0) and g + 8 (index 1) of the warp's 16.
template <bool MASK>
__device__ __forceinline__ void warp_online_softmax(float (&s)[cfg::N_FRAGS][4], float (&m)[2],
                                                    float (&l)[2], float (&o)[cfg::D_FRAGS][4],
                                                    u32 (&p)[cfg::BN / 16][4], int key0,
                                                    const int (&limit)[2], float c, int lane) {
    if (MASK) {
        // Only diagonal / sequence-end tiles get here: key j of row r is kept iff j < limit[r].
        const int col = key0 + 2 * (lane & 3);
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (col + n * 8 + (e & 1) >= limit[e >> 1]) s[n][e] = QA_NEG_INF;
            }
        }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < cfg::N_FRAGS; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
    }
    float mc[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = quad_max(mx[r]);
        // A row that has seen only masked keys keeps max -inf; use 0 as its offset so that
        // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
        mc[r] = (mx[r] == QA_NEG_INF) ? 0.f : mx[r] * c;
        alpha[r] = thread_exp2(m[r] * c - mc[r]);   // old max -inf -> 0 (O and l are 0 anyway)
        m[r] = mx[r];
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < cfg::N_FRAGS; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            // exp2(s*c - m*c): the scale rides in the FMA, one FFMA + one MUFU per score.
            s[n][e] = thread_exp2(fmaf(s[n][e], c, -mc[e >> 1]));
            l[e >> 1] += s[n][e];
        }
    }
#pragma unroll
    for (int d = 0; d < cfg::D_FRAGS; ++d) {
        o[d][0] *= alpha[0]; o[d][1] *= alpha[0];
        o[d][2] *= alpha[1]; o[d][3] *= alpha[1];
    }
    // Two adjacent n8 accumulator tiles are exactly one m16k16 A fragment.
#pragma unroll
    for (int kp = 0; kp < cfg::BN / 16; ++kp) {
        p[kp][0] = thread_pack_in(s[2 * kp][0], s[2 * kp][1]);
        p[kp][1] = thread_pack_in(s[2 * kp][2], s[2 * kp][3]);
        p[kp][2] = thread_pack_in(s[2 * kp + 1][0], s[2 * kp + 1][1]);
        p[kp][3] = thread_pack_in(s[2 * kp + 1][2], s[2 * kp + 1][3]);
    }
}

// O += P·V for one tile.
__device__ __forceinline__ void warp_value_matmul(float (&o)[cfg::D_FRAGS][4],
                                                  const u32 (&p)[cfg::BN / 16][4], u32 v_tile,
                                                  int lane) {
    // ldmatrix.x4.trans lane -> row address: matrices (keys +0..7, dims +0..7), (keys +8..15,
    // dims +0..7), (keys +0..7, dims +8..15), (keys +8..15, dims +8..15) = b0,b1 of two n8 tiles.
    const int mi = lane >> 3;
    const int key = ((mi & 1) << 3) + (lane & 7);
    const int chunk_lo = mi >> 1;
#if PV_ACC == 0
#pragma unroll
    for (int kp = 0; kp < cfg::BN / 16; ++kp) {
#pragma unroll
        for (int dp = 0; dp < cfg::D / 16; ++dp) {
            u32 b[4];
            warp_ldmatrix_x4_trans(b, v_tile + tile_swizzle<cfg::ROW_BYTES>(kp * 16 + key, dp * 2 + chunk_lo));
            warp_mma_f32acc(o[2 * dp], p[kp], b[0], b[1]);
            warp_mma_f32acc(o[2 * dp + 1], p[kp], b[2], b[3]);
        }
    }
#else
    // P <= 1, so a tile's worth of P·V stays well inside fp16 range; fold into f32 once per tile.
    u32 h[cfg::D_FRAGS][2];
#pragma unroll
    for (int d = 0; d < cfg::D_FRAGS; ++d) h[d][0] = h[d][1] = 0u;
#pragma unroll
    for (int kp = 0; kp < cfg::BN / 16; ++kp) {
#pragma unroll
        for (int dp = 0; dp < cfg::D / 16; ++dp) {
            u32 b[4];
            warp_ldmatrix_x4_trans(b, v_tile + tile_swizzle<cfg::ROW_BYTES>(kp * 16 + key, dp * 2 + chunk_lo));
            warp_mma_f16_f16acc(h[2 * dp], p[kp], b[0], b[1]);
            warp_mma_f16_f16acc(h[2 * dp + 1], p[kp], b[2], b[3]);
        }
    }
#pragma unroll
    for (int d = 0; d < cfg::D_FRAGS; ++d) {
        float a, b, c, e;
        thread_unpack_f16x2(h[d][0], a, b);
        thread_unpack_f16x2(h[d][1], c, e);
        o[d][0] += a; o[d][1] += b; o[d][2] += c; o[d][3] += e;
    }
#endif
}

// ---- the kernel ----------------------------------------------------------------------------

struct CtaState {
    u32 qf[cfg::D / 16][4];
    float o[cfg::D_FRAGS][4];
    float m[2];
    float l[2];
};

// One KV tile: wait for K, prefetch the next K, scores + softmax, wait for V, prefetch the next
// V, P·V. Two barriers per tile: the first frees the other stage (everyone is past the previous
// tile's reads), the second publishes V.
template <bool MASK>
__device__ __forceinline__ void cta_kv_tile(CtaState& st, u32 smem, int j, int n_tiles,
                                            const unsigned short* k_head, const unsigned short* v_head,
                                            const FwdParams& p, const int (&limit)[2], int lane) {
    const int t = n_tiles - 1 - j;          // tiles run from the last (masked) to the first
    const int stage = j & 1;
    const u32 k_tile = smem + stage * cfg::STAGE_BYTES;
    const u32 v_tile = k_tile + cfg::KV_TILE_BYTES;
    const u32 next_k = smem + (stage ^ 1) * cfg::STAGE_BYTES;
    const u32 next_v = next_k + cfg::KV_TILE_BYTES;

    thread_cp_async_wait<1>();   // everything but V_t landed -> K_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_load_tile<cfg::BN>(next_k, k_head + (i64)(t - 1) * cfg::BN * p.k_seq_stride,
                               p.k_seq_stride, cfg::BN);
    thread_cp_async_commit();

    float s[cfg::N_FRAGS][4];
    warp_score_matmul(s, st.qf, k_tile, lane);
    u32 pf[cfg::BN / 16][4];
    warp_online_softmax<MASK>(s, st.m, st.l, st.o, pf, t * cfg::BN, limit, p.scale_log2, lane);

    thread_cp_async_wait<1>();   // everything but K_{t-1} landed -> V_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_load_tile<cfg::BN>(next_v, v_head + (i64)(t - 1) * cfg::BN * p.v_seq_stride,
                               p.v_seq_stride, cfg::BN);
    thread_cp_async_commit();

    warp_value_matmul(st.o, pf, v_tile, lane);
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) fwd_hmma(const FwdParams p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 smem = cta_smem_addr(smem_raw);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    // Causal CTAs near the end of the sequence do the most work: launch them first.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.kv_group;
    const int m0 = m_block * cfg::BM;
    const int offset = p.kv_len - p.q_len;       // bottom-right causal alignment

    // Keys any row of this CTA can see, and which tiles need no mask at all.
    int n_end = p.kv_len;
    int full_end = p.kv_len / cfg::BN;           // tiles fully inside the sequence
    if (p.causal) {
        n_end = min(n_end, m0 + cfg::BM + offset);
        const int first_row_sees = m0 + offset + 1;   // keys [0, this) visible to row m0
        full_end = min(full_end, first_row_sees >= 0 ? first_row_sees / cfg::BN : 0);
    }
    const int n_tiles = n_end > 0 ? (n_end + cfg::BN - 1) / cfg::BN : 0;
    const int n_masked = n_tiles - min(max(full_end, 0), n_tiles);

    const int row_in_cta = warp * 16 + (lane >> 2);
    const int row0 = m0 + row_in_cta;            // query index of this lane's first row
    int limit[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
        limit[r] = p.causal ? min(p.kv_len, row0 + 8 * r + offset + 1) : p.kv_len;

    const unsigned short* q_head = reinterpret_cast<const unsigned short*>(p.q) +
                                   batch * p.q_batch_stride + head * p.q_head_stride;
    const unsigned short* k_head = reinterpret_cast<const unsigned short*>(p.k) +
                                   batch * p.k_batch_stride + kv_head * p.k_head_stride;
    const unsigned short* v_head = reinterpret_cast<const unsigned short*>(p.v) +
                                   batch * p.v_batch_stride + kv_head * p.v_head_stride;

    CtaState st;
#pragma unroll
    for (int d = 0; d < cfg::D_FRAGS; ++d) st.o[d][0] = st.o[d][1] = st.o[d][2] = st.o[d][3] = 0.f;
    st.m[0] = st.m[1] = QA_NEG_INF;
    st.l[0] = st.l[1] = 0.f;

    if (n_tiles > 0) {
        // Prologue: Q into stage 1 (free until the first prefetch), first K and V into stage 0.
        const int t0 = n_tiles - 1;
        cta_load_tile<cfg::BM>(smem + cfg::STAGE_BYTES, q_head + (i64)m0 * p.q_seq_stride,
                               p.q_seq_stride, p.q_len - m0);
        thread_cp_async_commit();
        cta_load_tile<cfg::BN>(smem, k_head + (i64)t0 * cfg::BN * p.k_seq_stride, p.k_seq_stride,
                               p.kv_len - t0 * cfg::BN);
        thread_cp_async_commit();
        cta_load_tile<cfg::BN>(smem + cfg::KV_TILE_BYTES, v_head + (i64)t0 * cfg::BN * p.v_seq_stride,
                               p.v_seq_stride, p.kv_len - t0 * cfg::BN);
        thread_cp_async_commit();
        thread_cp_async_wait<2>();   // Q landed
        __syncthreads();
        {
            // Q A-fragments, loaded once: matrices (rows +0..7, dims +0..7), (rows +8..15,
            // dims +0..7), (rows +0..7, dims +8..15), (rows +8..15, dims +8..15) = a0..a3.
            const int mi = lane >> 3;
            const int row = warp * 16 + ((mi & 1) << 3) + (lane & 7);
#pragma unroll
            for (int kk = 0; kk < cfg::D / 16; ++kk)
                warp_ldmatrix_x4(st.qf[kk], smem + cfg::STAGE_BYTES +
                                                tile_swizzle<cfg::ROW_BYTES>(row, kk * 2 + (mi >> 1)));
        }
        // Masked tiles (sequence end, causal diagonal) come first, then mask-free tiles: full
        // tiles carry no mask code at all. Tiles no row can see were never counted.
        int j = 0;
        for (; j < n_masked; ++j) cta_kv_tile<true>(st, smem, j, n_tiles, k_head, v_head, p, limit, lane);
        for (; j < n_tiles; ++j) cta_kv_tile<false>(st, smem, j, n_tiles, k_head, v_head, p, limit, lane);
    }

    // ---- epilogue: normalise, LSE, stage O through the free buffer, 16-byte stores ----------
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float sum = quad_sum(st.l[r]);
        // A row that saw no key (sum 0) writes O = 0 and LSE = -inf; guards NaN sums too.
        const bool empty = !(sum > 0.f);
        inv[r] = empty ? 0.f : 1.f / sum;
        lse[r] = empty ? QA_NEG_INF
                       : (st.m[r] * p.scale_log2 + thread_log2(sum)) * 0.6931471805599453f;
    }
    if ((lane & 3) == 0) {
        float* lse_out = reinterpret_cast<float*>(p.lse) + ((i64)batch * p.q_heads + head) * p.q_len;
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (row0 + 8 * r < p.q_len) lse_out[row0 + 8 * r] = lse[r];
    }

    // The last tile read stage (n_tiles-1)&1; the other one has been free since that tile's
    // first barrier. Each warp only touches its own 16 rows, so a warp barrier suffices.
    const u32 o_tile = smem + (n_tiles & 1) * cfg::STAGE_BYTES;
#pragma unroll
    for (int d = 0; d < cfg::D_FRAGS; ++d) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const u32 packed = thread_pack_in(st.o[d][2 * r] * inv[r], st.o[d][2 * r + 1] * inv[r]);
            const u32 addr = o_tile + tile_swizzle<cfg::ROW_BYTES>(row_in_cta + 8 * r, d) + 4 * (lane & 3);
            asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(packed) : "memory");
        }
    }
    __syncwarp();
    unsigned short* o_head = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                             head * p.o_head_stride;
#pragma unroll
    for (int i = 0; i < 16 * cfg::CHUNKS / 32; ++i) {
        const int idx = lane + 32 * i;
        const int r = idx / cfg::CHUNKS;
        const int chunk = idx % cfg::CHUNKS;
        const int row = m0 + warp * 16 + r;
        u32 x, y, z, w;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                     : "r"(o_tile + tile_swizzle<cfg::ROW_BYTES>(warp * 16 + r, chunk)));
        if (row < p.q_len) {
            unsigned short* dst = o_head + (i64)row * p.o_seq_stride + chunk * 8;
            asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                         :: "l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
        }
    }
}
