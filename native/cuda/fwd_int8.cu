// SageAttention-style forward: INT8 Q·Kᵀ on mma.sync m16n8k32 (IMMA, exact s32 sums), f32
// online softmax, f16 P·V on mma.sync m16n8k16 (HMMA).
//
// Same skeleton as fwd_hmma.cu (read its header first): one CTA = BLOCK_M = ROWS_PER_WARP *
// WARPS query rows of one (batch, head), warp w owns rows [w * ROWS_PER_WARP, +ROWS_PER_WARP)
// as MT m16 tiles, K/V tiles of BLOCK_N keys stream through two cp.async stages, tiles run
// from the last (masked) one to the first, P never leaves registers. What differs:
//   * Q and K arrive as int8 codes (same element strides as the f16 tensors they came from), K
//     tiles are int8 in shared memory: a K row is HEAD_DIM bytes, so one 32-byte chunk pair is
//     one k32 step, and the m16n8k32 s8 fragments are byte for byte the m16n8k16 f16 ones
//     (common.cuh), loaded with the same ldmatrix. Q's fragments are half the f16 size: at
//     32 rows per warp they fit in registers where f16 Q did not.
//   * Dequantization: score = float(dot) * (q_scale * k_scale), in log2 units (the host folded
//     softmax_scale * log2 e into the Q scales). K scales are per KV tile (one value per tile
//     and KV head); Q scales per CTA block, per warp, or per m16 row group (Q_GRAN), re-read
//     (one L1 hit) per KV tile next to the K scale.
//   * The s32 accumulators start at 0 and the int -> float conversion is one IADD of
//     THREAD_I2F_BIAS and one FADD (exact, common.cuh). Starting the accumulators at the bias
//     saves the IADD but holds the bias in four registers through the first k32 step, enough
//     to tip the 32-row hd128 tile into spills.
//   * Since every scale is positive, max_j fl(x_j * sc) = fl(max_j x_j * sc): the row max is
//     taken on the exact float dots x and scaled once per row, and p = exp2(fma(x, sc, -m)).
//     Against the emulation's exp2(fl(x * sc) - m) that skips one rounding of the exponent
//     argument (< 2^-24 relative of |x * sc|, below ex2.approx's own error).
//   * Conditional rescale (RESCALE_LOG2, as fwd_hmma.cu): the running max m only moves when
//     some row of the warp grew by more than RESCALE_LOG2 log2 units (8 with f32 P·V, 0 with
//     f16 per-tile P·V), so P <= 2^RESCALE_LOG2 and most tiles skip the O and l rescale. Every
//     m the kernel uses is one of the emulation's running maxima (the max of the tiles seen so
//     far when it last moved) but it may lag behind it: O = acc / l and LSE = m + log2 l are
//     the same for any such m, only the binade in which P is rounded to f16 changes, not its
//     relative error. With RESCALE_LOG2 0 the max moves whenever it grows, as the emulation.
//   * A row's max starts at M_EMPTY (finite) instead of -inf, so that neither the exponent
//     offset nor alpha needs a -inf guard.
//   * Register budget of the 32-row hd128 tile (255 with O = 128 and S = 64 registers):
//     lane-derived ldmatrix offsets, copy rows and Q scales come from an opaque thread index
//     inside the KV loop (cta_tid), and in-loop prefetches of whole tiles carry no predicate,
//     so nothing of them is hoisted across the loop as live registers.
//   * LSE = m * ln 2 + ln(l) + lse_shift (the K-smoothing correction, when given).
//   * O is staged for its coalesced stores through the start of shared memory after a CTA
//     barrier: an f16 O tile can be larger than one (int8 K + f16 V) stage.
//
// Compile-time parameters (all -D defines, built by Int8Config in src/int8.rs):
//   HEAD_DIM      64 | 128
//   WARPS         warps per CTA
//   ROWS_PER_WARP 16 | 32 (BLOCK_M = ROWS_PER_WARP * WARPS)
//   Q_IN_REGS     1: Q fragments in registers, 0: Q resident in shared memory
//   BLOCK_N       keys per KV tile (= keys per K scale)
//   Q_GRAN        0: one Q scale per CTA block, 1: per warp, 2: per m16 row group of 8 lanes
//   PV_ACC        0: f32, 1: f16 within one KV tile, folded into f32 per tile
//   QK_SPLIT      0: scores of all MT m tiles at once (each K fragment feeds 2 * MT IMMAs),
//                 1: one m tile after the other, scores and softmax (half the score registers,
//                 each K fragment read MT times; V fragments still feed 2 * MT HMMAs)
//   Q_LAYOUT_WARPS warps of the Q scale layout (default WARPS; fewer when a per-arch tile
//                 splits the table tile's warps, per-warp scales are then shared)
//   RESCALE_LOG2  conditional-rescale threshold (default 8 for PV_ACC 0, 0 for PV_ACC 1)
// The launch ABI is `Int8FwdParams` below; the Rust mirror is `Int8Params` in src/int8.rs,
// and `Int8Config::smem_bytes` mirrors cfg::SMEM_BYTES.
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(WARPS) || !defined(BLOCK_N) || !defined(ROWS_PER_WARP) || \
    !defined(Q_IN_REGS) || !defined(Q_GRAN) || !defined(PV_ACC) || !defined(QK_SPLIT)
#error "fwd_int8.cu needs HEAD_DIM, WARPS, BLOCK_N, ROWS_PER_WARP, Q_IN_REGS, Q_GRAN, PV_ACC, QK_SPLIT"
#endif

// Conditional-rescale threshold in log2 units (see warp_online_softmax): P may reach
// 2^RESCALE_LOG2 between rescales. 8 with f32 P·V accumulation (P <= 256 is far from fp16
// overflow and f32 sums are unaffected); 0 with f16 per-tile P·V, whose per-tile f16 sums must
// stay well inside fp16 range, so there the max moves whenever it grows at all.
#ifndef RESCALE_LOG2
#define RESCALE_LOG2 (PV_ACC == 0 ? 8 : 0)
#endif

// The running max of a row that has seen no key yet: finite, so that masked scores give
// exp2(-inf - M_EMPTY) = 0 and a row's first visible key moves the max (by ~2^127 > any
// RESCALE_LOG2) with alpha = exp2(M_EMPTY - m) = 0, without the -inf - -inf NaN guards.
// Scores are bounded by 127^2 * HEAD_DIM times the scales, far above it.
#define M_EMPTY (-1.7014118e38f)

#ifndef Q_LAYOUT_WARPS
#define Q_LAYOUT_WARPS WARPS
#endif

#define Q_GRAN_BLOCK 0
#define Q_GRAN_WARP 1
#define Q_GRAN_THREAD 2

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int MT = ROWS_PER_WARP / 16;     // m16 tiles per warp
constexpr int ROWS = 2 * MT;               // accumulator rows per lane (g, g+8 of each m tile)
constexpr int BM = ROWS_PER_WARP * WARPS;
constexpr int BN = BLOCK_N;
constexpr int THREADS = 32 * WARPS;
constexpr int QK_ROW_BYTES = D;             // int8 Q and K rows
constexpr int V_ROW_BYTES = 2 * D;          // f16 V and O rows
constexpr int K_STEPS = D / 32;             // k32 steps of Q·K^T
constexpr int P_STEPS = BN / 16;            // k16 steps of P·V
constexpr int N_FRAGS = BN / 8;             // n8 accumulator tiles of S per m tile
constexpr int D_FRAGS = D / 8;              // n8 accumulator tiles of O per m tile
constexpr int K_TILE_BYTES = BN * QK_ROW_BYTES;
constexpr int V_TILE_BYTES = BN * V_ROW_BYTES;
constexpr int STAGE_BYTES = K_TILE_BYTES + V_TILE_BYTES;
constexpr int Q_TILE_BYTES = BM * QK_ROW_BYTES;
constexpr int O_TILE_BYTES = BM * V_ROW_BYTES;
// Q_IN_REGS: Q is staged through the second stage before the first prefetch lands there.
// Otherwise Q has its own region after the stages.
constexpr int Q_OFFSET = Q_IN_REGS ? STAGE_BYTES : 2 * STAGE_BYTES;
constexpr int SMEM_BYTES = 2 * STAGE_BYTES + (Q_IN_REGS ? 0 : Q_TILE_BYTES);
// Q scales per CTA block in the layout the host builds (src/codec/int8.rs Int8ScaleLayout):
// per thread means 8 row groups per 16-row m tile, i.e. the layout's "warps" are m16 tiles.
// Per warp: the layout's warps (Q_LAYOUT_WARPS, default WARPS) may be fewer than the CTA's when a
// per-arch fallback tile splits the table tile's warps (8 x 16 rows reading the scales of a
// 4 x 32-row layout): warp w then reads layout warp w * Q_LAYOUT_WARPS / WARPS.
constexpr int Q_LAYOUT_W = Q_LAYOUT_WARPS;
constexpr int Q_SCALES_PER_BLOCK = Q_GRAN == Q_GRAN_BLOCK ? 1 : Q_GRAN == Q_GRAN_WARP ? Q_LAYOUT_W : (BM / 16) * 8;
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 block may have");
static_assert(O_TILE_BYTES <= 2 * STAGE_BYTES, "O is staged through the two K/V stages");
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(ROWS_PER_WARP == 16 || ROWS_PER_WARP == 32, "16 or 32 rows per warp");
static_assert(BN % 16 == 0 && BN >= 16, "BLOCK_N multiple of 16");
static_assert(!Q_IN_REGS || Q_TILE_BYTES <= STAGE_BYTES, "Q must fit in one K+V stage");
static_assert(Q_GRAN >= 0 && Q_GRAN <= 2, "Q_GRAN 0, 1 or 2");
static_assert(WARPS % Q_LAYOUT_W == 0, "layout warps divide the CTA's warps");
}  // namespace cfg

struct Int8FwdParams {
    u64 q, k, v, o, lse;                       // device pointers: int8, int8, f16, f16, f32
    u64 q_scale, k_scale;                      // f32 scales (Int8ScaleLayout)
    u64 lse_shift;                             // f32 [batch, q_heads, q_len], 0 = none
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // in elements; head dim is contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    i64 v_batch_stride, v_head_stride, v_seq_stride;
    i64 o_batch_stride, o_head_stride, o_seq_stride;
    int q_len, kv_len, q_heads, kv_heads;
    int kv_group;                              // q_heads / kv_heads (GQA)
    int causal;                                // bottom-right aligned
};

typedef TileLane<cfg::QK_ROW_BYTES> QkLane;
typedef TileLane<cfg::V_ROW_BYTES> VLane;

// ---- Q operand -----------------------------------------------------------------------------

// The A operand of S = Q·K^T for the warp's MT m tiles, one u32[4] per (m tile, k32 step).
// ldmatrix.x4 lane -> row address: matrices (rows +0..7, bytes +0..15), (rows +8..15,
// bytes +0..15), (rows +0..7, bytes +16..31), (rows +8..15, bytes +16..31) = a0..a3.
struct WarpQ {
#if Q_IN_REGS
    u32 f[cfg::MT][cfg::K_STEPS][4];
#else
    u32 tile;
    QkLane lr;
#endif
    __device__ __forceinline__ WarpQ(u32 q_tile, int warp, int lane)
#if !Q_IN_REGS
        : tile(q_tile), lr(warp * ROWS_PER_WARP + (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4)
#endif
    {
#if Q_IN_REGS
        const QkLane lr(warp * ROWS_PER_WARP + (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
#pragma unroll
        for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < cfg::K_STEPS; ++kk) warp_ldmatrix_x4(f[mt][kk], lr.at(q_tile, mt, kk));
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

// x = Q·K^T for the warp's m tiles [MT0, MT0 + MTN) and BN keys, as exact floats (the integer
// dots). ldmatrix.x4 lane -> row address: matrices (keys +0..7, bytes +0..15), (keys +0..7,
// bytes +16..31), (keys +8..15, bytes +0..15), (keys +8..15, bytes +16..31) = b0,b1 of two n8
// tiles. Each K fragment feeds 2 * MTN IMMAs.
template <int MT0, int MTN>
__device__ __forceinline__ void warp_score_matmul(float (&x)[MTN][cfg::N_FRAGS][4], const WarpQ& q, u32 k_tile,
                                                  const QkLane& kr) {
    int acc[MTN][cfg::N_FRAGS][4];
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n)
            acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0;
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk) {
        u32 a[MTN][4];
#pragma unroll
        for (int mt = 0; mt < MTN; ++mt) q.get(a[mt], MT0 + mt, kk);
#pragma unroll
        for (int np = 0; np < cfg::P_STEPS; ++np) {
            u32 b[4];
            warp_ldmatrix_x4(b, kr.at(k_tile, np, kk));
#pragma unroll
            for (int mt = 0; mt < MTN; ++mt) {
                warp_mma_s8_s32acc(acc[mt][2 * np], a[mt], b[0], b[1]);
                warp_mma_s8_s32acc(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) x[mt][n][e] = thread_biased_to_f32(acc[mt][n][e] + THREAD_I2F_BIAS);
}

// Online softmax over one tile in log2 units for the m tiles [MT0, MT0 + MTN): x are the
// integer dots (masked ones -inf), sc the rows' q_scale * k_scale. Updates the running max `m`
// (log2 units) and per-lane partial row sums `l`, rescales O when the max moved, and returns P
// packed as the f16 A operand of P·V.
// Conditional rescale (as fwd_hmma.cu): the running max only moves when some row of the warp
// grew by more than RESCALE_LOG2 since it was last set; otherwise every row keeps its stale
// max, p = exp2(x * sc - m) stays <= 2^RESCALE_LOG2 and neither O nor l is touched. The
// decision is warp-uniform (a vote), so skipping costs no divergence.
template <int MT0, int MTN>
__device__ __forceinline__ void warp_online_softmax(float (&x)[MTN][cfg::N_FRAGS][4], const float (&sc)[cfg::ROWS],
                                                    float (&m)[cfg::ROWS], float (&l)[cfg::ROWS],
                                                    float (&o)[cfg::MT][cfg::D_FRAGS][4],
                                                    u32 (&p)[cfg::MT][cfg::P_STEPS][4]) {
    constexpr int R0 = 2 * MT0, RN = 2 * MTN;   // row entries [R0, R0 + RN)
    float mx[RN];
#pragma unroll
    for (int i = 0; i < RN; ++i) mx[i] = QA_NEG_INF;
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) {
            mx[2 * mt] = fmaxf(mx[2 * mt], fmaxf(x[mt][n][0], x[mt][n][1]));
            mx[2 * mt + 1] = fmaxf(mx[2 * mt + 1], fmaxf(x[mt][n][2], x[mt][n][3]));
        }
    bool need = false;
#pragma unroll
    for (int r = 0; r < RN; ++r) {
        // fl(max x * sc) = max fl(x * sc) because sc > 0 and rounding is monotone.
        mx[r] = quad_max(mx[r]) * sc[R0 + r];
        // m starts at M_EMPTY (finite): the first visible key is ~2^127 above it and always
        // sets m; a tile of masked keys only (-inf) never does.
        need |= mx[r] - m[R0 + r] > (float)RESCALE_LOG2;
    }
    const bool rescale = __any_sync(0xffffffffu, need);
    float alpha[RN];
#pragma unroll
    for (int r = 0; r < RN; ++r) {
        const int i = R0 + r;
        const float mn = rescale ? fmaxf(m[i], mx[r]) : m[i];
        // alpha from the difference of the maxima: exactly 1 for an unchanged max, 0 when the
        // old max was M_EMPTY (O and l are 0 anyway).
        alpha[r] = (mn == m[i]) ? 1.f : thread_exp2(m[i] - mn);
        m[i] = mn;
    }
    if (rescale) {
#pragma unroll
        for (int r = 0; r < RN; ++r) l[R0 + r] *= alpha[r];
    }
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = 2 * mt + (e >> 1);
                x[mt][n][e] = thread_exp2(fmaf(x[mt][n][e], sc[R0 + r], -m[R0 + r]));
                l[R0 + r] += x[mt][n][e];
            }
    // Two adjacent n8 accumulator tiles are exactly one m16k16 A fragment.
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int kp = 0; kp < cfg::P_STEPS; ++kp) {
            p[MT0 + mt][kp][0] = thread_pack_f16x2(x[mt][2 * kp][0], x[mt][2 * kp][1]);
            p[MT0 + mt][kp][1] = thread_pack_f16x2(x[mt][2 * kp][2], x[mt][2 * kp][3]);
            p[MT0 + mt][kp][2] = thread_pack_f16x2(x[mt][2 * kp + 1][0], x[mt][2 * kp + 1][1]);
            p[MT0 + mt][kp][3] = thread_pack_f16x2(x[mt][2 * kp + 1][2], x[mt][2 * kp + 1][3]);
        }
    // O last, where the f32 scores are dead (only the packed P is live).
    if (rescale) {
#pragma unroll
        for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
            for (int d = 0; d < cfg::D_FRAGS; ++d) {
                o[MT0 + mt][d][0] *= alpha[2 * mt]; o[MT0 + mt][d][1] *= alpha[2 * mt];
                o[MT0 + mt][d][2] *= alpha[2 * mt + 1]; o[MT0 + mt][d][3] *= alpha[2 * mt + 1];
            }
    }
}

// Scores, mask and softmax of the m tiles [MT0, MT0 + MTN) of one KV tile.
template <bool MASK, int MT0, int MTN>
__device__ __forceinline__ void warp_scores_to_p(const WarpQ& q, u32 k_tile, const QkLane& kr, const float (&sc)[cfg::ROWS],
                                                 float (&m)[cfg::ROWS], float (&l)[cfg::ROWS],
                                                 float (&o)[cfg::MT][cfg::D_FRAGS][4], u32 (&p)[cfg::MT][cfg::P_STEPS][4],
                                                 int key0, int kv_len, int diag, int lane) {
    float x[MTN][cfg::N_FRAGS][4];
    warp_score_matmul<MT0, MTN>(x, q, k_tile, kr);
    // Row entry r of this range is entry R0 + r of the warp: its causal limit is 16 * MT0 rows on.
    if (MASK) warp_mask_tile<MTN, cfg::N_FRAGS>(x, key0, kv_len, diag + 16 * MT0, lane);
    warp_online_softmax<MT0, MTN>(x, sc, m, l, o, p);
}

// ---- the kernel ----------------------------------------------------------------------------

// Read through volatile moves so that what depends on them is recomputed where it is used
// instead of being hoisted across the KV loop as live 64-bit registers (see fwd_hmma.cu).
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
__device__ __forceinline__ int cta_kv_head(const Int8FwdParams& p) { return cta_head() / p.kv_group; }
// First byte of key `key0` of this CTA's K head (int8) and V head (f16).
__device__ __forceinline__ const unsigned char* cta_k_rows(const Int8FwdParams& p, int key0) {
    return reinterpret_cast<const unsigned char*>(p.k) + cta_batch() * p.k_batch_stride +
           cta_kv_head(p) * p.k_head_stride + (i64)key0 * p.k_seq_stride;
}
__device__ __forceinline__ const unsigned char* cta_v_rows(const Int8FwdParams& p, int key0) {
    return reinterpret_cast<const unsigned char*>(
        reinterpret_cast<const unsigned short*>(p.v) + cta_batch() * p.v_batch_stride +
        cta_kv_head(p) * p.v_head_stride + (i64)key0 * p.v_seq_stride);
}
// The K scale of tile t (one per BLOCK_N keys and KV head).
__device__ __forceinline__ float cta_k_scale(const Int8FwdParams& p, int t) {
    const int k_blocks = (opaque(p.kv_len) + cfg::BN - 1) / cfg::BN;
    const float* ks = reinterpret_cast<const float*>(p.k_scale);
    return __ldg(ks + ((i64)cta_batch() * p.kv_heads + cta_kv_head(p)) * k_blocks + t);
}

// This lane's rows' Q scales (Int8ScaleLayout), re-read per KV tile (one L1 hit, in flight
// during the barrier wait) rather than held across the loop: block (b, h, m_block) holds
// Q_SCALES_PER_BLOCK values; per warp: warp w; per thread: m16 tile (warp * MT + mt), row group
// g = lane / 4, shared by its rows g and g + 8.
__device__ __forceinline__ void cta_q_scales(const Int8FwdParams& p, float (&qs)[cfg::ROWS]) {
    int m_block;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(m_block));
    m_block = gridDim.x - 1 - m_block;
    const float* base = reinterpret_cast<const float*>(p.q_scale) +
                        (((i64)cta_batch() * p.q_heads + cta_head()) * gridDim.x + m_block) * cfg::Q_SCALES_PER_BLOCK;
#if Q_GRAN == Q_GRAN_BLOCK
    const float s = __ldg(base);
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) qs[i] = s;
#elif Q_GRAN == Q_GRAN_WARP
    const float s = __ldg(base + (cta_tid() >> 5) * cfg::Q_LAYOUT_W / WARPS);
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) qs[i] = s;
#else
    const int tid = cta_tid();
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
        qs[2 * mt] = qs[2 * mt + 1] = __ldg(base + ((tid >> 5) * cfg::MT + mt) * 8 + ((tid & 31) >> 2));
#endif
}

struct WarpState {
    float o[cfg::MT][cfg::D_FRAGS][4];
    float m[cfg::ROWS];
    float l[cfg::ROWS];
};

// Per-lane ldmatrix rows of the K (non-transposed, int8) and V (transposed, f16) fragments.
struct KvLanes {
    QkLane k;
    VLane v;
    __device__ __forceinline__ explicit KvLanes(int lane)
        : k((((lane >> 4) & 1) << 3) + (lane & 7), (lane >> 3) & 1),
          v((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4) {}
};

// One KV tile: wait for K, prefetch the next K, scores + softmax, wait for V, prefetch the next
// V, P·V. Two barriers per tile: the first frees the other stage, the second publishes V.
template <bool MASK>
__device__ __forceinline__ void cta_kv_tile(WarpState& st, const WarpQ& q_arg, u32 smem, int j,
                                            int n_tiles, const Int8FwdParams& p, int diag, int lane) {
    const int t = n_tiles - 1 - j;          // tiles run from the last (masked) to the first
    const int stage = j & 1;
    const u32 k_tile = smem + stage * cfg::STAGE_BYTES;
    const u32 v_tile = k_tile + cfg::K_TILE_BYTES;
    const u32 next_k = smem + (stage ^ 1) * cfg::STAGE_BYTES;
    const u32 next_v = next_k + cfg::K_TILE_BYTES;
    const float ks = cta_k_scale(p, t);     // in flight during the wait and the MMAs
    float qs[cfg::ROWS];
    cta_q_scales(p, qs);
    // Lane-derived ldmatrix offsets from an opaque thread index, per tile: hoisted out of the
    // loop they were ~20 live registers of swizzled addresses (one per chunk pair and tensor).
    const int tid = cta_tid();
    const KvLanes kv(tid & 31);
#if Q_IN_REGS
    const WarpQ& q = q_arg;
#else
    const WarpQ q(q_arg.tile, tid >> 5, tid & 31);
#endif

    thread_cp_async_wait<1>();   // everything but V_t landed -> K_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_copy_rows<cfg::BN, cfg::QK_ROW_BYTES, cfg::THREADS, true>(next_k, cta_k_rows(p, (t - 1) * cfg::BN),
                                                                       p.k_seq_stride, cfg::BN);
    thread_cp_async_commit();

    float sc[cfg::ROWS];
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) sc[i] = qs[i] * ks;   // (q_scale * k_scale), as the emulation
    u32 pf[cfg::MT][cfg::P_STEPS][4];
#if QK_SPLIT
    // One m tile at a time: half the score registers live, each K fragment read MT times.
    warp_scores_to_p<MASK, 0, 1>(q, k_tile, kv.k, sc, st.m, st.l, st.o, pf, t * cfg::BN, p.kv_len, diag, lane);
    if constexpr (cfg::MT == 2)
        warp_scores_to_p<MASK, 1, 1>(q, k_tile, kv.k, sc, st.m, st.l, st.o, pf, t * cfg::BN, p.kv_len, diag, lane);
#else
    warp_scores_to_p<MASK, 0, cfg::MT>(q, k_tile, kv.k, sc, st.m, st.l, st.o, pf, t * cfg::BN, p.kv_len, diag, lane);
#endif

    thread_cp_async_wait<1>();   // everything but K_{t-1} landed -> V_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_copy_rows<cfg::BN, cfg::V_ROW_BYTES, cfg::THREADS, true>(next_v, cta_v_rows(p, (t - 1) * cfg::BN),
                                                                      2 * opaque(p.v_seq_stride), cfg::BN);
    thread_cp_async_commit();

    warp_value_matmul<cfg::MT, cfg::P_STEPS, cfg::D, PV_ACC == 1, false>(st.o, pf, v_tile, kv.v);
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) fwd_int8(const Int8FwdParams p) {
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

    const int warp_row0 = warp * ROWS_PER_WARP;   // first row of this warp in the CTA
    const int row0 = m0 + warp_row0 + (lane >> 2);   // query index of this lane's row entry 0
    const int diag = p.causal ? row0 + offset + 1 : 0x3fffffff;

    WarpState st;
#pragma unroll
    for (int mt = 0; mt < cfg::MT; ++mt)
#pragma unroll
        for (int d = 0; d < cfg::D_FRAGS; ++d) st.o[mt][d][0] = st.o[mt][d][1] = st.o[mt][d][2] = st.o[mt][d][3] = 0.f;
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
        st.m[i] = M_EMPTY;
        st.l[i] = 0.f;
    }
    if (n_tiles > 0) {
        const int t0 = n_tiles - 1;
        const unsigned char* q_rows = reinterpret_cast<const unsigned char*>(p.q) + batch * p.q_batch_stride +
                                      head * p.q_head_stride + (i64)m0 * p.q_seq_stride;
        cta_copy_rows<cfg::BM, cfg::QK_ROW_BYTES, cfg::THREADS>(q_smem, q_rows, p.q_seq_stride, p.q_len - m0);
        thread_cp_async_commit();
        cta_copy_rows<cfg::BN, cfg::QK_ROW_BYTES, cfg::THREADS>(smem, cta_k_rows(p, t0 * cfg::BN), p.k_seq_stride,
                                                                 p.kv_len - t0 * cfg::BN);
        thread_cp_async_commit();
        cta_copy_rows<cfg::BN, cfg::V_ROW_BYTES, cfg::THREADS>(smem + cfg::K_TILE_BYTES, cta_v_rows(p, t0 * cfg::BN),
                                                                2 * p.v_seq_stride, p.kv_len - t0 * cfg::BN);
        thread_cp_async_commit();
        thread_cp_async_wait<2>();   // Q landed
        __syncthreads();
        const WarpQ q(q_smem, warp, lane);
        int j = 0;
        for (; j < n_masked; ++j) cta_kv_tile<true>(st, q, smem, j, n_tiles, p, diag, lane);
        for (; j < n_tiles; ++j) cta_kv_tile<false>(st, q, smem, j, n_tiles, p, diag, lane);
    }

    // ---- epilogue: normalise, LSE, stage O through shared memory, 16-byte stores ------------
    float inv[cfg::ROWS], lse[cfg::ROWS];
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
        const float sum = quad_sum(st.l[i]);
        // A row that saw no key (sum 0) writes O = 0 and LSE = -inf; guards NaN sums too.
        const bool empty = !(sum > 0.f);
        inv[i] = empty ? 0.f : 1.f / sum;
        lse[i] = empty ? QA_NEG_INF : (st.m[i] + thread_log2(sum)) * 0.6931471805599453f;
    }
    if ((lane & 3) == 0) {
        const i64 base = ((i64)batch * p.q_heads + head) * p.q_len;
        float* lse_out = reinterpret_cast<float*>(p.lse) + base;
        const float* shift = reinterpret_cast<const float*>(p.lse_shift);
#pragma unroll
        for (int i = 0; i < cfg::ROWS; ++i) {
            const int row = row0 + 16 * (i >> 1) + 8 * (i & 1);
            if (row < p.q_len) lse_out[row] = (shift && lse[i] != QA_NEG_INF) ? lse[i] + __ldg(shift + base + row) : lse[i];
        }
    }

    // Every warp is past its last read of both stages (and of a resident Q) after this barrier;
    // each warp then stages its own O rows at the start of shared memory.
    __syncthreads();
    unsigned short* o_rows = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                             head * p.o_head_stride + (i64)m0 * p.o_seq_stride;
    warp_store_o<cfg::MT, cfg::D, false>(st.o, inv, smem, warp_row0, o_rows, p.o_seq_stride, p.q_len - m0, lane);
}
