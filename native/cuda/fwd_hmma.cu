// FlashAttention-2-style forward on mma.sync m16n8k16 (HMMA), fp16 or bf16 inputs.
//
// Layout. One CTA = BLOCK_M = ROWS_PER_WARP * WARPS query rows of one (batch, head). Warp w owns
// the contiguous rows [w * ROWS_PER_WARP, +ROWS_PER_WARP) as MT = ROWS_PER_WARP / 16 m16 tiles
// and keeps their O accumulator in f32 registers for the whole KV sweep. K/V tiles of BLOCK_N
// keys stream through two cp.async stages in swizzled shared memory.
//   * ROWS_PER_WARP 32 (MT = 2) is FA2's layout: every K fragment (ldmatrix.x4) of Q·Kᵀ and
//     every V fragment (ldmatrix.x4.trans) of P·V feeds 2 * MT = 4 MMAs instead of 2, which
//     halves the shared-memory traffic per MMA; at 16 rows per warp an H100 SM is bound by
//     ldmatrix bandwidth (one .x4 = 512 B = 4 clocks of the 128 B/clk crossbar against ~1.5
//     clocks per SM per m16n8k16), at 32 it is bound by the tensor cores.
//   * Q_IN_REGS 1 loads Q's A fragments once (MT * D/16 * 4 registers); 0 keeps Q resident in
//     its own shared-memory region and reloads one A fragment per (m tile, k step), which costs
//     MT ldmatrix per D/16 step but frees those registers (FA2's default at hd128, where Q in
//     registers plus 32 rows of O do not fit in 255).
//   * Rows g and g+8 of each m tile live in the lane's c0,c1 / c2,c3 accumulator halves, so
//     every per-row quantity (max, sum, causal limit, LSE) is indexed [mt][half], flattened
//     to ROWS = 2 * MT entries: row of entry i = warp_row0 + 16 * (i / 2) + 8 * (i % 2) + g.
//   * P never leaves registers: two adjacent n8 accumulator tiles of S are, after packing, the
//     m16k16 A fragment of P·V for the same m tile.
//   * Conditional rescale (RESCALE_LOG2): the running max moves, and O is rescaled, only when
//     some row of the warp grew by more than RESCALE_LOG2 = 8 in log2 units (a factor 256).
//     The previous exact skip (rescale iff some alpha != 1) never fired: alpha came out of
//     exp2(m*c - mx*c) contracted to an FMA, which is the rounding error of mx*c, not 0, so
//     every tile paid the ~130 FMULs of the O rescale (ncu, BENCHMARKS.md).
//
// Compile-time parameters (all -D defines, the host builds them from one config):
//   HEAD_DIM      64 | 128
//   WARPS         warps per CTA
//   ROWS_PER_WARP 16 | 32 (BLOCK_M = ROWS_PER_WARP * WARPS)
//   Q_IN_REGS     1: Q fragments in registers, 0: Q resident in shared memory
//   BLOCK_N       keys per KV tile
//   IN_BF16       0: fp16 inputs/outputs, 1: bf16
//   QK_ACC        0: f32 (HMMA.F32), 1: f16 (HMMA.F16), 2: two-stage (f16 MMAs over QK_CHUNK
//                 head dims, folded into f32 after each chunk)
//   QK_CHUNK      head-dim chunk of the two-stage mode (multiple of 16)
//   PV_ACC        0: f32, 1: f16 within one KV tile, folded into f32 per tile
//   MODS          1: score modifiers (a second kernel argument, `ModParams` of common.cuh):
//                 the window/causal band with its alignment (only the KV tiles the CTA's bands
//                 touch are visited, only partly visible ones masked) and sinks in the epilogue;
//                 MOD_SOFTCAP and MOD_ALIBI compile softcap and ALiBi in (applied to every score).
//   VARLEN        1: variable-length batches (a second kernel argument, `VarlenParams` of
//                 common.cuh): packed token-major Q/K/V/O, sequence blockIdx.z owns the rows its
//                 cumulative lengths give; FwdParams' lengths are the longest sequence's (the
//                 grid), its batch strides unused. A block past its sequence's end exits at once,
//                 lengths and causal alignment are the sequence's own, loads zero-fill past the
//                 sequence's rows, stores and LSE (`[q_heads, total_q]`, none when lse is 0) stop
//                 at them. With MODS (`VarlenParams` then `ModParams`), each sequence's band is
//                 aligned against its own lengths (a(i) = i + kv_len_b - q_len_b bottom-right, i
//                 top-left; ModParams.offset is not read) and stops at its kv_len.
// The launch ABI is `FwdParams` below; the Rust mirror is `HmmaParams` in src/hmma.rs, and
// `HmmaTile::smem_bytes` mirrors cfg::SMEM_BYTES.
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(WARPS) || !defined(BLOCK_N) || !defined(IN_BF16) || \
    !defined(QK_ACC) || !defined(QK_CHUNK) || !defined(PV_ACC)
#error "fwd_hmma.cu needs HEAD_DIM, WARPS, BLOCK_N, IN_BF16, QK_ACC, QK_CHUNK, PV_ACC"
#endif
// The original tiling (16 rows per warp, Q in registers) when the host does not say.
#ifndef ROWS_PER_WARP
#define ROWS_PER_WARP 16
#endif
#ifndef Q_IN_REGS
#define Q_IN_REGS 1
#endif
#ifndef VARLEN
#define VARLEN 0
#endif

// Conditional-rescale threshold in log2 units (see warp_online_softmax): P may reach
// 2^RESCALE_LOG2 between rescales. 8 with f32 P·V accumulation (P ≤ 256 is far from fp16/bf16
// overflow and f32 sums are unaffected); 0 with f16 per-tile P·V accumulation, whose tile sums
// of P·V must stay well inside fp16 range, so there the max moves whenever it grows at all.
#ifndef RESCALE_LOG2
#define RESCALE_LOG2 (PV_ACC == 0 ? 8 : 0)
#endif

#define QK_ACC_F32 0
#define QK_ACC_F16 1
#define QK_ACC_TWO_STAGE 2

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int MT = ROWS_PER_WARP / 16;    // m16 tiles per warp
constexpr int ROWS = 2 * MT;              // accumulator rows per lane (g, g+8 of each m tile)
constexpr int BM = ROWS_PER_WARP * WARPS;
constexpr int BN = BLOCK_N;
constexpr int THREADS = 32 * WARPS;
constexpr int ROW_BYTES = D * 2;           // 16-bit elements
constexpr int CHUNKS = D / 8;              // 16-byte chunks per row
constexpr int K_STEPS = D / 16;            // k16 steps of Q·K^T
constexpr int P_STEPS = BN / 16;           // k16 steps of P·V
constexpr int N_FRAGS = BN / 8;            // n8 accumulator tiles of S per m tile
constexpr int D_FRAGS = D / 8;             // n8 accumulator tiles of O per m tile
constexpr int MT_BYTES = 16 * ROW_BYTES;   // one m16 tile of a swizzled [row][dim] tile
constexpr int KV_TILE_BYTES = BN * ROW_BYTES;
constexpr int STAGE_BYTES = 2 * KV_TILE_BYTES;   // K then V
// Q_IN_REGS: Q is staged through the second stage before the first prefetch lands there and O
// through the free stage in the epilogue. Otherwise Q has its own region after the stages,
// which also stages O (each warp rewrites only its own rows, after its last read of them).
constexpr int Q_OFFSET = Q_IN_REGS ? STAGE_BYTES : 2 * STAGE_BYTES;
constexpr int SMEM_BYTES = 2 * STAGE_BYTES + (Q_IN_REGS ? 0 : BM * ROW_BYTES);
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 block may have");
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(ROWS_PER_WARP == 16 || ROWS_PER_WARP == 32, "16 or 32 rows per warp");
static_assert(BN % 16 == 0 && BN >= 16, "BLOCK_N multiple of 16");
static_assert(!Q_IN_REGS || BM <= 2 * BN, "BLOCK_M rows must fit in one K+V stage");
static_assert(THREADS % CHUNKS == 0 && (BM * CHUNKS) % THREADS == 0 &&
              (BN * CHUNKS) % THREADS == 0, "even copy split");
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

// ---- swizzled ldmatrix addressing ----------------------------------------------------------

// A lane's ldmatrix row inside a swizzled tile, split so that the per-k-step part is one XOR:
// tile_swizzle(row + 16 * i, 2 * c + hi) == row * ROW_BYTES + 16 * i * ROW_BYTES
// + ((32 * c) ^ xr) with xr = (hi ^ (row & 7)) << 4, because 2c and hi share no bit and a
// multiple of 16 rows leaves row & 7 alone. The 16-row steps (m tiles, key pairs) become
// immediate offsets of LDSM.
struct LaneRow {
    u32 off;   // row * ROW_BYTES
    u32 xr;    // (hi ^ (row & 7)) << 4
    __device__ __forceinline__ LaneRow(int row, int hi)
        : off((u32)(row * cfg::ROW_BYTES)), xr((u32)((hi ^ (row & 7)) << 4)) {}
    // Address of chunk pair c (chunks 2c, 2c+1) of this lane's row, 16*i rows further down.
    __device__ __forceinline__ u32 at(u32 tile, int i, int c) const {
        return tile + off + (u32)(i * cfg::MT_BYTES) + (((u32)c << 5) ^ xr);
    }
};

// ---- global -> shared ----------------------------------------------------------------------

// Copies `ROWS` rows of one head (row stride `stride` elements) into a swizzled tile; rows at or
// past `rows_valid` are zero-filled (their source address is clamped to row 0, never read).
// A thread copies the same chunk of rows row0, row0 + STEP, ...: when STEP is a multiple of 8
// the swizzle is the same for all of them, so destinations are one register plus immediates.
// Sources walk by one 64-bit step that is made opaque on every call: otherwise the compiler
// hoists every row's `row * stride` out of the KV loop and keeps 2 * ROWS / STEP 64-bit
// offsets per tensor alive across it, which is what made the wide tiles spill.
template <int ROWS>
__device__ __forceinline__ void cta_load_tile(u32 dst, const unsigned short* src, i64 stride,
                                              int rows_valid) {
    constexpr int STEP = cfg::THREADS / cfg::CHUNKS;
    const int row0 = threadIdx.x / cfg::CHUNKS;
    const int chunk = threadIdx.x % cfg::CHUNKS;
    i64 step = (i64)STEP * stride;
    asm volatile("" : "+l"(step));
    const unsigned short* s = src + (i64)row0 * stride + chunk * 8;
#pragma unroll
    for (int i = 0; i < ROWS / STEP; ++i) {
        const int row = row0 + i * STEP;
        const bool ok = row < rows_valid;
        thread_cp_async_16(dst + tile_swizzle<cfg::ROW_BYTES>(row, chunk), ok ? s : src, ok ? 16 : 0);
        s += step;
    }
}

// ---- Q operand -----------------------------------------------------------------------------

// The A operand of S = Q·K^T for the warp's MT m tiles. ldmatrix.x4 lane -> row address:
// matrices (rows +0..7, dims +0..7), (rows +8..15, dims +0..7), (rows +0..7, dims +8..15),
// (rows +8..15, dims +8..15) = a0..a3.
struct WarpQ {
#if Q_IN_REGS
    u32 f[cfg::MT][cfg::D / 16][4];
#else
    u32 tile;   // shared address of the Q region
    LaneRow lr;
#endif
    __device__ __forceinline__ WarpQ(u32 q_tile, int warp, int lane)
#if !Q_IN_REGS
        : tile(q_tile), lr(warp * ROWS_PER_WARP + (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4)
#endif
    {
#if Q_IN_REGS
        const LaneRow lr(warp * ROWS_PER_WARP + (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
#pragma unroll
        for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < cfg::D / 16; ++kk) warp_ldmatrix_x4(f[mt][kk], lr.at(q_tile, mt, kk));
#endif
    }
    __device__ __forceinline__ void get(u32 (&a)[4], int mt, int kk) const {
#if Q_IN_REGS
        a[0] = f[mt][kk][0]; a[1] = f[mt][kk][1]; a[2] = f[mt][kk][2]; a[3] = f[mt][kk][3];
#else
        warp_ldmatrix_x4(a, lr.at(tile, mt, kk));
#endif
    }
};

// ---- mainloop pieces (one warp, MT m16 tiles) ----------------------------------------------

// S = Q·K^T for the warp's rows and BN keys, in f32 whatever the accumulation mode.
// ldmatrix.x4 lane -> row address: matrices (keys +0..7, dims +0..7), (keys +0..7, dims
// +8..15), (keys +8..15, dims +0..7), (keys +8..15, dims +8..15) = b0,b1 of two n8 tiles.
// Each K fragment feeds 2 * MT MMAs.
__device__ __forceinline__ void warp_score_matmul(float (&s)[cfg::MT][cfg::N_FRAGS][4],
                                                  const WarpQ& q, u32 k_tile, const LaneRow& kr) {
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;

#if QK_ACC == QK_ACC_F32
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk) {
        u32 a[cfg::MT][4];
#pragma unroll
        for (int mt = 0; mt < cfg::MT; ++mt) q.get(a[mt], mt, kk);
#pragma unroll
        for (int np = 0; np < cfg::P_STEPS; ++np) {
            u32 b[4];
            warp_ldmatrix_x4(b, kr.at(k_tile, np, kk));
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt) {
                warp_mma_f32acc(s[mt][2 * np], a[mt], b[0], b[1]);
                warp_mma_f32acc(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
#else
    // F16: one chunk spanning the whole head dim; TWO_STAGE: f16 partial sums over QK_CHUNK
    // dims stay small enough that fp16 rounding of the running sum is bounded per chunk. Per
    // output element both orders below sum the chunk's k-steps in ascending order into a zeroed
    // f16 accumulator and then add it to s, chunk by chunk.
    constexpr int CHUNK = (QK_ACC == QK_ACC_F16) ? cfg::D : QK_CHUNK;
    constexpr int CK = CHUNK / 16;   // k-steps per chunk
#pragma unroll
    for (int c0 = 0; c0 < cfg::K_STEPS; c0 += CK) {
        if constexpr (QK_ACC == QK_ACC_TWO_STAGE) {
            // Key pairs outermost: the chunk's Q fragments (MT * CK * 4 registers) stay live
            // and the f16 partial sum is 2 * MT * 2 registers next to the f32 scores, instead
            // of a whole S worth (which spilled at hd128 with 32 rows per warp).
            u32 a[cfg::MT][CK][4];
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
                for (int x = 0; x < CK; ++x) q.get(a[mt][x], mt, c0 + x);
#pragma unroll
            for (int np = 0; np < cfg::P_STEPS; ++np) {
                u32 h[cfg::MT][2][2];
#pragma unroll
                for (int mt = 0; mt < cfg::MT; ++mt) h[mt][0][0] = h[mt][0][1] = h[mt][1][0] = h[mt][1][1] = 0u;
#pragma unroll
                for (int x = 0; x < CK; ++x) {
                    u32 b[4];
                    warp_ldmatrix_x4(b, kr.at(k_tile, np, c0 + x));
#pragma unroll
                    for (int mt = 0; mt < cfg::MT; ++mt) {
                        warp_mma_f16_f16acc(h[mt][0], a[mt][x], b[0], b[1]);
                        warp_mma_f16_f16acc(h[mt][1], a[mt][x], b[2], b[3]);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
                    for (int y = 0; y < 2; ++y) thread_fold_f16_frag(h[mt][y], s[mt][2 * np + y]);
            }
        } else {
            // One chunk: s is not live yet, the f16 accumulator of all of S is.
            u32 h[cfg::MT][cfg::N_FRAGS][2];
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
                for (int n = 0; n < cfg::N_FRAGS; ++n) h[mt][n][0] = h[mt][n][1] = 0u;
#pragma unroll
            for (int kk = c0; kk < c0 + CK; ++kk) {
                u32 a[cfg::MT][4];
#pragma unroll
                for (int mt = 0; mt < cfg::MT; ++mt) q.get(a[mt], mt, kk);
#pragma unroll
                for (int np = 0; np < cfg::P_STEPS; ++np) {
                    u32 b[4];
                    warp_ldmatrix_x4(b, kr.at(k_tile, np, kk));
#pragma unroll
                    for (int mt = 0; mt < cfg::MT; ++mt) {
                        warp_mma_f16_f16acc(h[mt][2 * np], a[mt], b[0], b[1]);
                        warp_mma_f16_f16acc(h[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
                for (int n = 0; n < cfg::N_FRAGS; ++n) thread_fold_f16_frag(h[mt][n], s[mt][n]);
        }
    }
#endif
}

// Online softmax over one tile: updates the running max `m` (raw score units) and per-lane
// partial row sums `l`, rescales O, and returns P packed as the A operand of P·V.
// Row entry i (see the header) = accumulator half i % 2 of m tile i / 2.
template <bool MASK>
__device__ __forceinline__ void warp_online_softmax(float (&s)[cfg::MT][cfg::N_FRAGS][4],
                                                    float (&m)[cfg::ROWS], float (&l)[cfg::ROWS],
                                                    float (&o)[cfg::MT][cfg::D_FRAGS][4],
                                                    u32 (&p)[cfg::MT][cfg::P_STEPS][4], int key0,
                                                    int kv_len, int diag, float c, int lane) {
    if (MASK) {
        // Only diagonal / sequence-end tiles get here: key j of row entry i is kept iff
        // j < min(kv_len, diag + 16 * (i / 2) + 8 * (i % 2)). Recomputed from two scalars per
        // masked tile rather than kept as ROWS live registers across the whole KV loop.
        const int col = key0 + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < cfg::ROWS; ++i) {
            const int limit = min(kv_len, diag + 16 * (i >> 1) + 8 * (i & 1)) - col;
#pragma unroll
            for (int n = 0; n < cfg::N_FRAGS; ++n)
#pragma unroll
                for (int x = 0; x < 2; ++x)
                    if (n * 8 + x >= limit) s[i >> 1][n][2 * (i & 1) + x] = QA_NEG_INF;
        }
    }
    float mx[cfg::ROWS];
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) mx[i] = m[i];
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) {
            mx[2 * mt] = fmaxf(mx[2 * mt], fmaxf(s[mt][n][0], s[mt][n][1]));
            mx[2 * mt + 1] = fmaxf(mx[2 * mt + 1], fmaxf(s[mt][n][2], s[mt][n][3]));
        }
    // Conditional rescale (FlashAttention-4): the running max m only moves when some row of the
    // warp has grown by more than RESCALE_LOG2 (in log2 units) since it was last set; otherwise
    // every row keeps its stale max, its probabilities p = exp2(s·c − m·c) stay ≤ 2^RESCALE_LOG2,
    // and O and l need no rescale at all. The result is the same softmax either way (O = acc / l
    // and LSE = m·scale + ln l hold for any reference m that keeps p finite); only the binade in
    // which P is rounded to 16 bits changes, not its relative error.
    // The decision is warp-uniform, so skipping costs no divergence.
    bool need = false;
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
        mx[i] = quad_max(mx[i]);
        // m = -inf and a finite mx: +inf > threshold, the first visible key always sets m.
        // Both -inf (row has seen only masked keys): NaN > threshold is false, m stays -inf.
        need |= (mx[i] - m[i]) * c > (float)RESCALE_LOG2;
    }
    const bool rescale = __any_sync(0xffffffffu, need);
    float alpha[cfg::ROWS], mc[cfg::ROWS];
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
        const float mn = rescale ? mx[i] : m[i];
        // alpha from the difference of the two maxima: exactly 1 for an unchanged max, and no
        // -inf - -inf NaN for a row that has seen nothing (its O and l are 0 anyway).
        alpha[i] = (mn == m[i]) ? 1.f : thread_exp2((m[i] - mn) * c);
        m[i] = mn;
        l[i] *= alpha[i];
        // A row that has seen only masked keys keeps max -inf; use 0 as its offset so that
        // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
        mc[i] = (mn == QA_NEG_INF) ? 0.f : mn * c;
    }
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                // exp2(s*c - m*c): the scale rides in the FMA, one FFMA + one MUFU per score.
                s[mt][n][e] = thread_exp2(fmaf(s[mt][n][e], c, -mc[2 * mt + (e >> 1)]));
                l[2 * mt + (e >> 1)] += s[mt][n][e];
            }
    if (rescale) {
#pragma unroll
        for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
            for (int d = 0; d < cfg::D_FRAGS; ++d) {
                o[mt][d][0] *= alpha[2 * mt]; o[mt][d][1] *= alpha[2 * mt];
                o[mt][d][2] *= alpha[2 * mt + 1]; o[mt][d][3] *= alpha[2 * mt + 1];
            }
    }
    // Two adjacent n8 accumulator tiles are exactly one m16k16 A fragment.
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
        for (int kp = 0; kp < cfg::P_STEPS; ++kp) {
            p[mt][kp][0] = thread_pack_in(s[mt][2 * kp][0], s[mt][2 * kp][1]);
            p[mt][kp][1] = thread_pack_in(s[mt][2 * kp][2], s[mt][2 * kp][3]);
            p[mt][kp][2] = thread_pack_in(s[mt][2 * kp + 1][0], s[mt][2 * kp + 1][1]);
            p[mt][kp][3] = thread_pack_in(s[mt][2 * kp + 1][2], s[mt][2 * kp + 1][3]);
        }
}

// O += P·V for one tile. ldmatrix.x4.trans lane -> row address: matrices (keys +0..7, dims
// +0..7), (keys +8..15, dims +0..7), (keys +0..7, dims +8..15), (keys +8..15, dims +8..15) =
// b0,b1 of two n8 tiles. Each V fragment feeds 2 * MT MMAs. Head-dim pairs outermost so the
// f16 accumulator of PV_ACC 1 is MT * 4 registers, not a whole O row; per output element the
// keys are still summed in ascending k16 steps, as before.
__device__ __forceinline__ void warp_value_matmul(float (&o)[cfg::MT][cfg::D_FRAGS][4],
                                                  const u32 (&p)[cfg::MT][cfg::P_STEPS][4],
                                                  u32 v_tile, const LaneRow& vr) {
#pragma unroll
    for (int dp = 0; dp < cfg::D / 16; ++dp) {
#if PV_ACC == 0
#pragma unroll
        for (int kp = 0; kp < cfg::P_STEPS; ++kp) {
            u32 b[4];
            warp_ldmatrix_x4_trans(b, vr.at(v_tile, kp, dp));
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt) {
                warp_mma_f32acc(o[mt][2 * dp], p[mt][kp], b[0], b[1]);
                warp_mma_f32acc(o[mt][2 * dp + 1], p[mt][kp], b[2], b[3]);
            }
        }
#else
        // P <= 1, so a tile's worth of P·V stays well inside fp16 range; fold into f32 per tile.
        u32 h[cfg::MT][2][2];
#pragma unroll
        for (int mt = 0; mt < cfg::MT; ++mt) h[mt][0][0] = h[mt][0][1] = h[mt][1][0] = h[mt][1][1] = 0u;
#pragma unroll
        for (int kp = 0; kp < cfg::P_STEPS; ++kp) {
            u32 b[4];
            warp_ldmatrix_x4_trans(b, vr.at(v_tile, kp, dp));
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt) {
                warp_mma_f16_f16acc(h[mt][0], p[mt][kp], b[0], b[1]);
                warp_mma_f16_f16acc(h[mt][1], p[mt][kp], b[2], b[3]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
            for (int x = 0; x < 2; ++x) thread_fold_f16_frag(h[mt][x], o[mt][2 * dp + x]);
#endif
    }
}

// ---- the kernel ----------------------------------------------------------------------------

// Grid: x = query block (reversed, see fwd_hmma), y = query head, z = batch.
// Read through volatile moves so the compiler recomputes what depends on them where it is used
// instead of hoisting it: two 64-bit K/V head pointers live across the whole KV loop were what
// tipped the 32-row hd128 tile over 255 registers on sm_80. The recompute (an integer
// division included) runs once per prefetch, next to 2 * BLOCK_N * D / 8 / THREADS copies.
__device__ __forceinline__ int cta_head() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(v));
    return v;
}
__device__ __forceinline__ int cta_batch() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(v));
    return v;
}
#if VARLEN
// First element of this CTA's K (IS_V false) or V head at the first key of its sequence
// (cu_k[batch] re-read here, as the block indices are, rather than kept live).
template <bool IS_V>
__device__ __forceinline__ const unsigned short* cta_kv_head(const FwdParams& p, const VarlenParams& vp) {
    const int kv_head = cta_head() / p.kv_group;
    const i64 k0 = reinterpret_cast<const int*>(opaque(vp.cu_k))[cta_batch()];
    return IS_V ? reinterpret_cast<const unsigned short*>(p.v) + k0 * p.v_seq_stride + kv_head * p.v_head_stride
                : reinterpret_cast<const unsigned short*>(p.k) + k0 * p.k_seq_stride + kv_head * p.k_head_stride;
}
// The sequence's key count, for the masks of a masked tile: re-read there rather than kept in
// a register across the KV loop (the 32-row hd128 tile has none to spare).
__device__ __forceinline__ int cta_seq_kv_len(const VarlenParams& vp) {
    const int* ck = reinterpret_cast<const int*>(opaque(vp.cu_k));
    const int b = cta_batch();
    return max(ck[b + 1] - ck[b], 0);
}
#define KV_HEAD_ARGS p, vp
#define VL_ARG const VarlenParams &vp,
#define VL_PASS vp,
#else
// First element of this CTA's K (IS_V false) or V head.
template <bool IS_V>
__device__ __forceinline__ const unsigned short* cta_kv_head(const FwdParams& p) {
    const int kv_head = cta_head() / p.kv_group;
    const int batch = cta_batch();
    return IS_V ? reinterpret_cast<const unsigned short*>(p.v) + batch * p.v_batch_stride +
                      kv_head * p.v_head_stride
                : reinterpret_cast<const unsigned short*>(p.k) + batch * p.k_batch_stride +
                      kv_head * p.k_head_stride;
}
#define KV_HEAD_ARGS p
#define VL_ARG
#define VL_PASS
#endif

struct WarpState {
    float o[cfg::MT][cfg::D_FRAGS][4];
    float m[cfg::ROWS];
    float l[cfg::ROWS];
};

// Per-lane ldmatrix rows of the K (non-transposed) and V (transposed) fragments.
struct KvLanes {
    LaneRow k, v;
    __device__ __forceinline__ explicit KvLanes(int lane)
        : k((((lane >> 4) & 1) << 3) + (lane & 7), (lane >> 3) & 1),
          v((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4) {}
};

#if MODS
// Softcap, ALiBi and (MASK) the band and sequence-end masks on a tile of scores in raw units,
// before the softmax. Row entry i (see the header) sits at a(row0 + 16 (i / 2) + 8 (i % 2)).
template <bool MASK>
__device__ __forceinline__ void warp_mods(float (&s)[cfg::MT][cfg::N_FRAGS][4], const ModParams& mp, float slope, int key0,
                                          int kv_len, int a0, int lane) {
    const int col = key0 + 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
        const int a = a0 + 16 * (i >> 1) + 8 * (i & 1);
        const int lo = a - mp.left;
        const int hi = min(kv_len, a + mp.right + 1);
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                float& v = s[i >> 1][n][2 * (i & 1) + x];
                v = thread_mod_score<MASK, MOD_SOFTCAP != 0, MOD_ALIBI != 0>(v, mp, slope, a, col + n * 8 + x, lo, hi);
            }
    }
}
struct ModState {
    const ModParams& mp;
    float slope;
    int a0, t_top;
};
#define MOD_ARG const ModState &ms,
#define MOD_PASS ms,
#else
#define MOD_ARG
#define MOD_PASS
#endif

// One KV tile: wait for K, prefetch the next K, scores + softmax, wait for V, prefetch the next
// V, P·V. Two barriers per tile: the first frees the other stage (everyone is past the previous
// tile's reads), the second publishes V.
template <bool MASK>
__device__ __forceinline__ void cta_kv_tile(WarpState& st, const WarpQ& q, const KvLanes& kv,
                                            u32 smem, int j, int n_tiles,
                                            const FwdParams& p, MOD_ARG VL_ARG int diag, int lane) {
#if MODS
    const int t = ms.t_top - j;             // tiles run from the band's last to its first
#else
    const int t = n_tiles - 1 - j;          // tiles run from the last (masked) to the first
#endif
    const int stage = j & 1;
    const u32 k_tile = smem + stage * cfg::STAGE_BYTES;
    const u32 v_tile = k_tile + cfg::KV_TILE_BYTES;
    const u32 next_k = smem + (stage ^ 1) * cfg::STAGE_BYTES;
    const u32 next_v = next_k + cfg::KV_TILE_BYTES;

    thread_cp_async_wait<1>();   // everything but V_t landed -> K_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_load_tile<cfg::BN>(next_k, cta_kv_head<false>(KV_HEAD_ARGS) + (i64)(t - 1) * cfg::BN * p.k_seq_stride,
                               p.k_seq_stride, cfg::BN);
    thread_cp_async_commit();

    float s[cfg::MT][cfg::N_FRAGS][4];
    warp_score_matmul(s, q, k_tile, kv.k);
    u32 pf[cfg::MT][cfg::P_STEPS][4];
#if MODS && VARLEN
    warp_mods<MASK>(s, ms.mp, ms.slope, t * cfg::BN, MASK ? cta_seq_kv_len(vp) : 0, ms.a0, lane);
    warp_online_softmax<false>(s, st.m, st.l, st.o, pf, t * cfg::BN, 0, diag, p.scale_log2, lane);
#elif MODS
    warp_mods<MASK>(s, ms.mp, ms.slope, t * cfg::BN, p.kv_len, ms.a0, lane);
    warp_online_softmax<false>(s, st.m, st.l, st.o, pf, t * cfg::BN, p.kv_len, diag, p.scale_log2, lane);
#elif VARLEN
    warp_online_softmax<MASK>(s, st.m, st.l, st.o, pf, t * cfg::BN, MASK ? cta_seq_kv_len(vp) : 0, diag, p.scale_log2, lane);
#else
    warp_online_softmax<MASK>(s, st.m, st.l, st.o, pf, t * cfg::BN, p.kv_len, diag, p.scale_log2, lane);
#endif

    thread_cp_async_wait<1>();   // everything but K_{t-1} landed -> V_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_load_tile<cfg::BN>(next_v, cta_kv_head<true>(KV_HEAD_ARGS) + (i64)(t - 1) * cfg::BN * p.v_seq_stride,
                               p.v_seq_stride, cfg::BN);
    thread_cp_async_commit();

    warp_value_matmul(st.o, pf, v_tile, kv.v);
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) fwd_hmma(const FwdParams p
#if VARLEN
                                                                        , const VarlenParams vp
#endif
#if MODS
                                                                        , const __grid_constant__ ModParams mp
#endif
) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 smem = cta_smem_addr(smem_raw);
    const u32 q_smem = smem + cfg::Q_OFFSET;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    // Causal CTAs near the end of the sequence do the most work: launch them first.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int m0 = m_block * cfg::BM;
#if VARLEN
    // The grid covers the longest sequence: a block past this one's end has nothing to do
    // (uniform over the CTA, before any barrier). Below, `sq` stands where the dense kernel
    // reads FwdParams' lengths, and rows start at the sequence's first.
    const SeqSpan sq = cta_seq_span(vp, batch, p.causal);
    if (m0 >= sq.q_len) return;
    const int offset = sq.kv_len - sq.q_len;     // bottom-right causal alignment, per sequence
    int n_end = sq.kv_len;
    int full_end = sq.kv_len / cfg::BN;
#else
    const int offset = p.kv_len - p.q_len;       // bottom-right causal alignment

    // Keys any row of this CTA can see, and which tiles need no mask at all.
    int n_end = p.kv_len;
    int full_end = p.kv_len / cfg::BN;           // tiles fully inside the sequence
#endif
    if (p.causal) {
        n_end = min(n_end, m0 + cfg::BM + offset);
        const int first_row_sees = m0 + offset + 1;   // keys [0, this) visible to row m0
        full_end = min(full_end, first_row_sees >= 0 ? first_row_sees / cfg::BN : 0);
    }
#if MODS && VARLEN
    // The band against the sequence's own lengths.
    const int a_offset = mod_offset(mp, sq.q_len, sq.kv_len);
    const ModTiles mt = cta_mod_tiles<cfg::BM, cfg::BN>(sq.kv_len, a_offset, mp, m0);
#elif MODS
    const int a_offset = mp.offset;
    const ModTiles mt = cta_mod_tiles<cfg::BM, cfg::BN>(p.kv_len, a_offset, mp, m0);
#endif
#if MODS
    const int n_tiles = mt.n_tiles;
    const int t_top = mt.t_lo + n_tiles - 1;
    (void)n_end;
    (void)full_end;
#else
    const int n_tiles = n_end > 0 ? (n_end + cfg::BN - 1) / cfg::BN : 0;
    const int n_masked = n_tiles - min(max(full_end, 0), n_tiles);
#endif

    const int warp_row0 = warp * ROWS_PER_WARP;   // first row of this warp in the CTA
    const int row0 = m0 + warp_row0 + (lane >> 2);   // query index of this lane's row entry 0
    // Causal: row entry 0 sees keys [0, diag) (see warp_online_softmax); otherwise only the
    // sequence end masks, and diag is far enough past it for diag + 24 not to overflow.
    const int diag = p.causal ? row0 + offset + 1 : 0x3fffffff;

#if VARLEN
    const unsigned short* q_head = reinterpret_cast<const unsigned short*>(p.q) + (i64)sq.q0 * p.q_seq_stride +
                                   head * p.q_head_stride;
#else
    const unsigned short* q_head = reinterpret_cast<const unsigned short*>(p.q) +
                                   batch * p.q_batch_stride + head * p.q_head_stride;
#endif

    WarpState st;
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
        for (int d = 0; d < cfg::D_FRAGS; ++d) st.o[mt][d][0] = st.o[mt][d][1] = st.o[mt][d][2] = st.o[mt][d][3] = 0.f;
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
        st.m[i] = QA_NEG_INF;
        st.l[i] = 0.f;
    }

    if (n_tiles > 0) {
        // Prologue: Q into its region (or stage 1, free until the first prefetch), the first
        // K and V into stage 0.
#if MODS
        const int t0 = t_top;
#else
        const int t0 = n_tiles - 1;
#endif
#if VARLEN
        cta_load_tile<cfg::BM>(q_smem, q_head + (i64)m0 * p.q_seq_stride, p.q_seq_stride, sq.q_len - m0);
        thread_cp_async_commit();
        cta_load_tile<cfg::BN>(smem, cta_kv_head<false>(p, vp) + (i64)t0 * cfg::BN * p.k_seq_stride, p.k_seq_stride,
                               sq.kv_len - t0 * cfg::BN);
        thread_cp_async_commit();
        cta_load_tile<cfg::BN>(smem + cfg::KV_TILE_BYTES, cta_kv_head<true>(p, vp) + (i64)t0 * cfg::BN * p.v_seq_stride,
                               p.v_seq_stride, sq.kv_len - t0 * cfg::BN);
#else
        cta_load_tile<cfg::BM>(q_smem, q_head + (i64)m0 * p.q_seq_stride, p.q_seq_stride, p.q_len - m0);
        thread_cp_async_commit();
        cta_load_tile<cfg::BN>(smem, cta_kv_head<false>(p) + (i64)t0 * cfg::BN * p.k_seq_stride, p.k_seq_stride,
                               p.kv_len - t0 * cfg::BN);
        thread_cp_async_commit();
        cta_load_tile<cfg::BN>(smem + cfg::KV_TILE_BYTES, cta_kv_head<true>(p) + (i64)t0 * cfg::BN * p.v_seq_stride,
                               p.v_seq_stride, p.kv_len - t0 * cfg::BN);
#endif
        thread_cp_async_commit();
        thread_cp_async_wait<2>();   // Q landed
        __syncthreads();
        const WarpQ q(q_smem, warp, lane);
        const KvLanes kv(lane);
        // Masked tiles (sequence end, causal diagonal) come first, then mask-free tiles: full
        // tiles carry no mask code at all. Tiles no row can see were never counted.
#if MODS
        // Partly visible tiles sit at both ends of the band: the tiles above full_hi (the
        // diagonal, the sequence end), then the whole ones, then those below full_lo (the
        // window's left edge). Three loops with their bounds counted once, as the plain
        // kernel's two: with one loop choosing the mask per tile, the 32-row tiles spilled at
        // 255 registers (sm_80 and sm_90).
        const ModState ms{mp, MOD_ALIBI ? mp.alibi_raw[head] : 0.f, row0 + a_offset, t_top};
        const int j_full = min(max(t_top - mt.full_hi, 0), n_tiles);
        const int j_low = min(max(t_top - mt.full_lo + 1, j_full), n_tiles);
        int j = 0;
        for (; j < j_full; ++j) cta_kv_tile<true>(st, q, kv, smem, j, n_tiles, p, ms, VL_PASS diag, lane);
        for (; j < j_low; ++j) cta_kv_tile<false>(st, q, kv, smem, j, n_tiles, p, ms, VL_PASS diag, lane);
        for (; j < n_tiles; ++j) cta_kv_tile<true>(st, q, kv, smem, j, n_tiles, p, ms, VL_PASS diag, lane);
#else
        int j = 0;
        for (; j < n_masked; ++j) cta_kv_tile<true>(st, q, kv, smem, j, n_tiles, p, VL_PASS diag, lane);
        for (; j < n_tiles; ++j) cta_kv_tile<false>(st, q, kv, smem, j, n_tiles, p, VL_PASS diag, lane);
#endif
    }

    // ---- epilogue: normalise, LSE, stage O through shared memory, 16-byte stores ------------
#if VARLEN
    // The sequence's rows, re-read after the KV loop (whose barriers and copies clobber memory,
    // so the loads happen here) rather than kept in registers across it.
    const SeqSpan se = cta_seq_span(vp, cta_batch(), p.causal);
#define ROWS_END se.q_len
#else
#define ROWS_END p.q_len
#endif
    float inv[cfg::ROWS], lse[cfg::ROWS];
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
#if MODS
        float sum = quad_sum(st.l[i]);
        const bool empty = !(sum > 0.f);
        float m2 = st.m[i] * p.scale_log2;
        float f = 1.f;
        if (!empty) thread_add_sink(m2, sum, f, mp.sink_log2[head]);
        inv[i] = empty ? 0.f : f / sum;
        lse[i] = empty ? QA_NEG_INF : (m2 + thread_log2(sum)) * 0.6931471805599453f;
#else
        const float sum = quad_sum(st.l[i]);
        // A row that saw no key (sum 0) writes O = 0 and LSE = -inf; guards NaN sums too.
        const bool empty = !(sum > 0.f);
        inv[i] = empty ? 0.f : 1.f / sum;
        lse[i] = empty ? QA_NEG_INF
                       : (st.m[i] * p.scale_log2 + thread_log2(sum)) * 0.6931471805599453f;
#endif
    }
#if VARLEN
    // LSE [q_heads, total_q]; no LSE buffer (address 0): not written.
    if ((lane & 3) == 0 && p.lse != 0) {
        float* lse_out = reinterpret_cast<float*>(p.lse) + (i64)cta_head() * vp.total_q + se.q0;
#else
    if ((lane & 3) == 0) {
        float* lse_out = reinterpret_cast<float*>(p.lse) + ((i64)batch * p.q_heads + head) * p.q_len;
#endif
#pragma unroll
        for (int i = 0; i < cfg::ROWS; ++i) {
            const int row = row0 + 16 * (i >> 1) + 8 * (i & 1);
            if (row < ROWS_END) lse_out[row] = lse[i];
        }
    }

    // Q in registers: the last tile read stage (n_tiles-1)&1; the other one has been free since
    // that tile's first barrier. Q in shared memory: the warp's own Q rows, whose last reader
    // was this warp. Either way each warp only touches its own rows: a warp barrier suffices.
    const u32 o_tile = Q_IN_REGS ? smem + (n_tiles & 1) * cfg::STAGE_BYTES : q_smem;
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
        for (int d = 0; d < cfg::D_FRAGS; ++d)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float sc = inv[2 * mt + r];
                const u32 packed = thread_pack_in(st.o[mt][d][2 * r] * sc, st.o[mt][d][2 * r + 1] * sc);
                const int row = warp_row0 + 16 * mt + 8 * r + (lane >> 2);
                const u32 addr = o_tile + tile_swizzle<cfg::ROW_BYTES>(row, d) + 4 * (lane & 3);
                asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(packed) : "memory");
            }
    __syncwarp();
#if VARLEN
    unsigned short* o_head = reinterpret_cast<unsigned short*>(p.o) + (i64)se.q0 * p.o_seq_stride +
                             cta_head() * p.o_head_stride;
#else
    unsigned short* o_head = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                             head * p.o_head_stride;
#endif
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP * cfg::CHUNKS / 32; ++i) {
        const int idx = lane + 32 * i;
        const int r = warp_row0 + idx / cfg::CHUNKS;
        const int chunk = idx % cfg::CHUNKS;
        const int row = m0 + r;
        u32 x, y, z, w;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                     : "r"(o_tile + tile_swizzle<cfg::ROW_BYTES>(r, chunk)));
        if (row < ROWS_END) {
            unsigned short* dst = o_head + (i64)row * p.o_seq_stride + chunk * 8;
            asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                         :: "l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
        }
    }
}
#undef ROWS_END
