// FP8 (e4m3) attention forward on warp-level mma.sync: Q·Kᵀ on m16n8k32 e4m3 x e4m3 -> f32,
// f32 online softmax, P·V either with P in f16 and V decoded to f16 on m16n8k16 (P_FP8 0,
// "variant A") or with P in e4m3 on the e4m3 m16n8k32 (P_FP8 1, "variant B").
//
// Targets: sm_89 and sm_120a run the e4m3 mma natively; sm_90 accepts the same PTX and ptxas
// lowers it to a sequence of other instructions (see src/mma_fp8.rs for what the SASS is).
// Not run on sm_89 / sm_120 hardware: the H100 (sm_90 build) checks the numerics only.
//
// Same skeleton as fwd_int8.cu (read its header and fwd_hmma.cu's first): one CTA = BLOCK_M =
// ROWS_PER_WARP * WARPS query rows of one (batch, head), warp w owns rows [w * ROWS_PER_WARP,
// +ROWS_PER_WARP) as MT m16 tiles, K and V tiles of BLOCK_N keys stream through two cp.async
// stages, tiles run from the last (masked) one to the first, P never leaves registers.
//
// Operands.
//   * Q and K are e4m3 codes in their [batch, head, seq, dim] layout (element = byte strides).
//     The m16n8k32 fragments of 8-bit types are byte for byte those of m16n8k16 with 16-bit
//     elements (common.cuh), so Q and K tiles are loaded with ldmatrix .b16 exactly as the
//     INT8 kernel loads its int8 tiles; a 32-byte chunk pair is one k32 step.
//   * V arrives transposed and key-permuted from the prepass (mma_fp8_vt.cu): Vt[b][kvh][dim]
//     [vt_len] e4m3, where within each group of 16 keys, byte position L holds key
//     perm(L) = 2 * (L / 4) + (L % 2) + 8 * ((L / 2) % 2), i.e. positions 4t..4t+3 hold keys
//     2t, 2t+1, 2t+8, 2t+9. A Vt tile in shared memory is [dim][BLOCK_N keys]: for P·V it is
//     the "col" B operand with k = keys contiguous, loaded with the same non-transposed
//     ldmatrix as K. Why a prepass and not in-register byte shuffles of a [key][dim] tile: the
//     transpose (and the key permutation below) is paid once per V element instead of once per
//     (CTA, KV tile), i.e. q_len / BLOCK_M times less, it frees the kernel of the prmt/shfl
//     sequences and their registers, and both P·V variants read the same layout.
//   * Why the permutation. Lane (g, t) holds the f32 scores of row g (c0, c1) and g + 8
//     (c2, c3) at keys 8n + 2t, 8n + 2t + 1 of each n8 tile n. The m16n8k32 8-bit A fragment
//     wants, in register 0, row g at k = 4t..4t+3 (register 1: row g + 8; registers 2, 3: k + 16).
//     Packing the lane's own keys {2t, 2t+1, 8+2t, 9+2t} of n8 tiles 0 and 1 into register 0
//     (tiles 2 and 3 into register 2) needs no data movement between lanes: it is the A
//     fragment of the k-permuted product, and a product is unchanged when A's k index and B's
//     k index are permuted alike, which is what the prepass does to V's keys. For variant A the
//     same layout is the m16n8k16 B fragment directly: b0 = keys 2t, 2t+1 and b1 = keys 2t+8,
//     2t+9 are the low and high halves of the lane's ldmatrix word, and one
//     cvt.rn.f16x2.e4m3x2 per half decodes them (exact: every e4m3 value is an f16).
//
// Numerics (what the emulation in examples/mma_fp8_check.rs reproduces):
//   * s = Σ q·k over the head dim (codes decoded, products exact, f32 accumulation); the row
//     max m is tracked on these raw dots; c = scale_log2 * (q_descale * k_descale) (two
//     f32 roundings, once per CTA); p = exp2(fma(s, c, -off)) with off = fl(fl(m * c) - PL),
//     PL = log2(448) for e4m3 P (P is e4m3(448 * p): p <= 1 uses the whole e4m3 range, the
//     facade's recipe, and the factor rides in the exponent instead of a multiply) and PL = 0
//     for f16 P. l sums the unrounded f32 p (448 p), so O = acc / l needs no 1/448.
//   * The max moves whenever a row's tile max exceeds it (no conditional-rescale threshold):
//     P is rounded against the exact running max of the tiles processed so far, in the
//     kernel's tile order (last tile first), so an emulation can reproduce every rounding of P;
//     and e4m3(448 p) must not exceed 448, which a stale max would allow.
//   * O = acc * (v_descale / l) rounded to f16 (bf16 with OUT_BF16); LSE = (fl(m * c) +
//     log2 l - PL) * ln 2 in natural-log units. Rows that see no key: O = 0, LSE = -inf.
//   * Descales: Q's index = batch * q_desc_batch + head * q_desc_head, K's and V's =
//     batch * kv_desc_batch + kv_head * kv_desc_head (per tensor: both 0; per head: heads, 1).
//
// Compile-time parameters (-D defines, built by Fp8MmaConfig in src/mma_fp8.rs):
//   HEAD_DIM      64 | 128
//   WARPS         warps per CTA
//   ROWS_PER_WARP 16 | 32 (BLOCK_M = ROWS_PER_WARP * WARPS)
//   Q_IN_REGS     1: Q fragments in registers, 0: Q resident in shared memory
//   BLOCK_N       keys per KV tile (64, or a multiple of 128: the Vt tile's row swizzle)
//   P_FP8         0: f16 P and f16-decoded V on m16n8k16; 1: e4m3 P on m16n8k32
//   OUT_BF16      0: f16 O, 1: bf16 O
// The launch ABI is `Fp8FwdParams` below; the Rust mirror is `Fp8MmaParams` in src/mma_fp8.rs,
// and `Fp8MmaConfig::smem_bytes` mirrors cfg::SMEM_BYTES.
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(WARPS) || !defined(BLOCK_N) || !defined(ROWS_PER_WARP) || \
    !defined(Q_IN_REGS) || !defined(P_FP8) || !defined(OUT_BF16)
#error "fwd_mma_fp8.cu needs HEAD_DIM, WARPS, BLOCK_N, ROWS_PER_WARP, Q_IN_REGS, P_FP8, OUT_BF16"
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "fwd_mma_fp8.cu needs sm_89 or newer (e4m3 mma.sync and cvt)"
#endif

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int MT = ROWS_PER_WARP / 16;     // m16 tiles per warp
constexpr int ROWS = 2 * MT;               // accumulator rows per lane (g, g+8 of each m tile)
constexpr int BM = ROWS_PER_WARP * WARPS;
constexpr int BN = BLOCK_N;
constexpr int THREADS = 32 * WARPS;
constexpr int QK_ROW_BYTES = D;             // e4m3 Q and K rows
constexpr int VT_ROW_BYTES = BN;            // e4m3 Vt rows: one dim, BN keys
constexpr int K_STEPS = D / 32;             // k32 steps of Q·K^T
constexpr int KEY_PAIRS = BN / 32;          // 32-key steps of P·V (one Vt ldmatrix.x4 per 16 dims)
constexpr int N_FRAGS = BN / 8;             // n8 accumulator tiles of S per m tile
constexpr int D_FRAGS = D / 8;              // n8 accumulator tiles of O per m tile
// P's A fragments per m tile: k16 steps (f16 P) or k32 steps (e4m3 P), 4 registers each.
constexpr int P_FRAGS = P_FP8 ? BN / 32 : BN / 16;
constexpr int K_TILE_BYTES = BN * QK_ROW_BYTES;
constexpr int VT_TILE_BYTES = D * VT_ROW_BYTES;
constexpr int STAGE_BYTES = K_TILE_BYTES + VT_TILE_BYTES;
constexpr int Q_TILE_BYTES = BM * QK_ROW_BYTES;
constexpr int O_TILE_BYTES = BM * 2 * D;
// Q_IN_REGS: Q is staged through the second stage before the first prefetch lands there.
// Otherwise Q has its own region after the stages.
constexpr int Q_OFFSET = Q_IN_REGS ? STAGE_BYTES : 2 * STAGE_BYTES;
constexpr int SMEM_BYTES = 2 * STAGE_BYTES + (Q_IN_REGS ? 0 : Q_TILE_BYTES);
static_assert(SMEM_BYTES <= 99 * 1024, "more shared memory than an sm_89 / sm_120 block may have");
static_assert(O_TILE_BYTES <= 2 * STAGE_BYTES, "O is staged through the two K/V stages");
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(ROWS_PER_WARP == 16 || ROWS_PER_WARP == 32, "16 or 32 rows per warp");
static_assert(BN == 64 || (BN % 128 == 0 && BN <= 256), "BLOCK_N 64 or a multiple of 128 (Vt row swizzle)");
static_assert(!Q_IN_REGS || Q_TILE_BYTES <= STAGE_BYTES, "Q must fit in one K+V stage");
static_assert(P_FP8 == 0 || P_FP8 == 1, "P_FP8 0 or 1");
}  // namespace cfg

struct Fp8FwdParams {
    u64 q, k, vt, o, lse;                      // e4m3, e4m3, e4m3 (prepass layout), f16/bf16, f32
    u64 q_desc, k_desc, v_desc;                // f32 descales
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // bytes; head dim contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;   // bytes
    i64 o_batch_stride, o_head_stride, o_seq_stride;   // 16-bit elements
    int q_len, kv_len, q_heads, kv_heads;
    int kv_group;                              // q_heads / kv_heads (GQA)
    int causal;                                // bottom-right aligned
    int vt_len;                                // keys per Vt row (kv_len rounded up, see prepass)
    int q_desc_batch, q_desc_head;             // Q descale index strides
    int kv_desc_batch, kv_desc_head;           // K and V descale index strides
    float scale_log2;                          // softmax scale * log2(e)
};

typedef TileLane<cfg::QK_ROW_BYTES> QkLane;
typedef TileLane<cfg::VT_ROW_BYTES> VtLane;

// log2(448) as the f32 the emulation uses: e4m3 P is e4m3(448 p).
#define P_LOG2_SCALE (P_FP8 ? 8.807354922057604f : 0.f)

// ---- e4m3 operations (sm_89+) ----------------------------------------------------------------

// e4m3 x e4m3 -> f32 (SASS on sm_89 / sm_120: an FP8 HMMA / QMMA of shape 16832). Fragments as
// warp_mma_s8_s32acc in common.cuh.
__device__ __forceinline__ void warp_mma_e4m3_f32acc(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four e4m3 codes (byte i of v) -> two f16x2: lo = bytes 0, 1 (byte 0 in the low half), hi =
// bytes 2, 3. Exact. cvt.f16x2.e4m3x2 keeps the byte order (low byte -> low half).
__device__ __forceinline__ void thread_e4m3x4_to_f16x2x2(u32 v, u32& lo, u32& hi) {
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2;\n"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n"
        "cvt.rn.f16x2.e4m3x2 %1, h; }\n"
        : "=r"(lo), "=r"(hi) : "r"(v));
}

// e4m3 codes of a, b, c, d (RNE, saturating to ±448) in bytes 0, 1, 2, 3. cvt.e4m3x2.f32 puts
// its FIRST source in the UPPER byte.
__device__ __forceinline__ u32 thread_pack_e4m3x4(float a, float b, float c, float d) {
    u32 r;
    asm("{ .reg .b16 l, h;\n"
        "cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n"
        "mov.b32 %0, {l, h}; }\n"
        : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

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

// s = Q·K^T (decoded e4m3 codes) for the warp's m tiles [MT0, MT0 + MTN) and BN keys.
// ldmatrix.x4 lane -> row address: matrices (keys +0..7, bytes +0..15), (keys +0..7,
// bytes +16..31), (keys +8..15, bytes +0..15), (keys +8..15, bytes +16..31) = b0,b1 of two n8
// tiles. Each K fragment feeds 2 * MTN MMAs.
template <int MT0, int MTN>
__device__ __forceinline__ void warp_score_matmul(float (&s)[MTN][cfg::N_FRAGS][4], const WarpQ& q, u32 k_tile,
                                                  const QkLane& kr) {
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk) {
        u32 a[MTN][4];
#pragma unroll
        for (int mt = 0; mt < MTN; ++mt) q.get(a[mt], MT0 + mt, kk);
#pragma unroll
        for (int np = 0; np < cfg::BN / 16; ++np) {
            u32 b[4];
            warp_ldmatrix_x4(b, kr.at(k_tile, np, kk));
#pragma unroll
            for (int mt = 0; mt < MTN; ++mt) {
                warp_mma_e4m3_f32acc(s[mt][2 * np], a[mt], b[0], b[1]);
                warp_mma_e4m3_f32acc(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// Online softmax over one tile for the m tiles [MT0, MT0 + MTN): s holds the raw dots (masked
// ones -inf), c the score scale (log2 units per dot unit). Updates the running max `m` (raw
// dot units) and per-lane partial row sums `l`, rescales O when some row's max grew, and
// returns P packed as the A operand of P·V (f16 k16 fragments, or e4m3 k32 fragments in the
// key order of the Vt prepass).
template <int MT0, int MTN>
__device__ __forceinline__ void warp_online_softmax(float (&s)[MTN][cfg::N_FRAGS][4], float c,
                                                    float (&m)[cfg::ROWS], float (&l)[cfg::ROWS],
                                                    float (&o)[cfg::MT][cfg::D_FRAGS][4],
                                                    u32 (&p)[cfg::MT][cfg::P_FRAGS][4]) {
    constexpr int R0 = 2 * MT0, RN = 2 * MTN;   // row entries [R0, R0 + RN)
    float mx[RN];
#pragma unroll
    for (int i = 0; i < RN; ++i) mx[i] = QA_NEG_INF;
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt)
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n) {
            mx[2 * mt] = fmaxf(mx[2 * mt], fmaxf(s[mt][n][0], s[mt][n][1]));
            mx[2 * mt + 1] = fmaxf(mx[2 * mt + 1], fmaxf(s[mt][n][2], s[mt][n][3]));
        }
    // The max moves as soon as any row of the warp grew (warp-uniform decision, so no
    // divergence); rows that did not grow keep theirs (fmaxf), so every row's m is exactly the
    // max of the dots it has seen. -inf (nothing visible yet) never counts as growth.
    bool need = false;
#pragma unroll
    for (int r = 0; r < RN; ++r) {
        mx[r] = quad_max(mx[r]);
        need |= mx[r] > m[R0 + r];
    }
    const bool rescale = __any_sync(0xffffffffu, need);
    float alpha[RN], off[RN];
#pragma unroll
    for (int r = 0; r < RN; ++r) {
        const int i = R0 + r;
        const float mn = rescale ? fmaxf(m[i], mx[r]) : m[i];
        // 1 for an unchanged max; 0 when the old max was -inf (O and l are 0 anyway).
        alpha[r] = (mn == m[i]) ? 1.f : thread_exp2(thread_mul_rn(m[i] - mn, c));
        m[i] = mn;
        // Explicit roundings (no FMA contraction) so that the emulation can repeat them; a row
        // that has seen no key uses 0 so that exp2(-inf * c - off) = 0 without a NaN.
        const float mc = (mn == QA_NEG_INF) ? 0.f : thread_mul_rn(mn, c);
        off[r] = thread_sub_rn(mc, P_LOG2_SCALE);
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
                s[mt][n][e] = thread_exp2(fmaf(s[mt][n][e], c, -off[r]));
                l[R0 + r] += s[mt][n][e];
            }
#pragma unroll
    for (int mt = 0; mt < MTN; ++mt) {
#if P_FP8
        // k32 step kc: n8 tiles 4kc..4kc+3; register 0 = row g, tiles 4kc and 4kc+1 (keys 2t,
        // 2t+1, 2t+8, 2t+9 of the step's first 16), register 1 = row g+8, registers 2/3 the
        // same of tiles 4kc+2, 4kc+3 (see the header: the Vt prepass permutes V's keys alike).
#pragma unroll
        for (int kc = 0; kc < cfg::P_FRAGS; ++kc) {
            const float (*t)[4] = &s[mt][4 * kc];
            p[MT0 + mt][kc][0] = thread_pack_e4m3x4(t[0][0], t[0][1], t[1][0], t[1][1]);
            p[MT0 + mt][kc][1] = thread_pack_e4m3x4(t[0][2], t[0][3], t[1][2], t[1][3]);
            p[MT0 + mt][kc][2] = thread_pack_e4m3x4(t[2][0], t[2][1], t[3][0], t[3][1]);
            p[MT0 + mt][kc][3] = thread_pack_e4m3x4(t[2][2], t[2][3], t[3][2], t[3][3]);
        }
#else
        // Two adjacent n8 accumulator tiles are exactly one m16k16 f16 A fragment.
#pragma unroll
        for (int kp = 0; kp < cfg::P_FRAGS; ++kp) {
            p[MT0 + mt][kp][0] = thread_pack_f16x2(s[mt][2 * kp][0], s[mt][2 * kp][1]);
            p[MT0 + mt][kp][1] = thread_pack_f16x2(s[mt][2 * kp][2], s[mt][2 * kp][3]);
            p[MT0 + mt][kp][2] = thread_pack_f16x2(s[mt][2 * kp + 1][0], s[mt][2 * kp + 1][1]);
            p[MT0 + mt][kp][3] = thread_pack_f16x2(s[mt][2 * kp + 1][2], s[mt][2 * kp + 1][3]);
        }
#endif
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

// O += P·V for one tile. Vt tile: [D dims][BN keys] e4m3, keys permuted per 16 (header).
// ldmatrix.x4 lane -> row address as for K: matrices (dims +0..7, keys +0..15), (dims +0..7,
// keys +16..31), (dims +8..15, keys +0..15), (dims +8..15, keys +16..31) of one 32-key step.
// Each Vt fragment feeds 4 * MT (f16 P) or 2 * MT (e4m3 P) MMAs.
__device__ __forceinline__ void warp_value_matmul(float (&o)[cfg::MT][cfg::D_FRAGS][4],
                                                  const u32 (&p)[cfg::MT][cfg::P_FRAGS][4], u32 v_tile,
                                                  const VtLane& vr) {
#pragma unroll
    for (int dp = 0; dp < cfg::D / 16; ++dp) {
#pragma unroll
        for (int kc = 0; kc < cfg::KEY_PAIRS; ++kc) {
            u32 b[4];
            warp_ldmatrix_x4(b, vr.at(v_tile, dp, kc));
#if P_FP8
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt) {
                warp_mma_e4m3_f32acc(o[mt][2 * dp], p[mt][kc], b[0], b[1]);
                warp_mma_e4m3_f32acc(o[mt][2 * dp + 1], p[mt][kc], b[2], b[3]);
            }
#else
            // b[j]'s bytes are keys 2t, 2t+1, 2t+8, 2t+9 of dim g: the low half is the
            // m16n8k16 b0, the high half b1.
            u32 h[4][2];
#pragma unroll
            for (int j = 0; j < 4; ++j) thread_e4m3x4_to_f16x2x2(b[j], h[j][0], h[j][1]);
#pragma unroll
            for (int mt = 0; mt < cfg::MT; ++mt) {
                warp_mma_f16_f32acc(o[mt][2 * dp], p[mt][2 * kc], h[0][0], h[0][1]);
                warp_mma_f16_f32acc(o[mt][2 * dp], p[mt][2 * kc + 1], h[1][0], h[1][1]);
                warp_mma_f16_f32acc(o[mt][2 * dp + 1], p[mt][2 * kc], h[2][0], h[2][1]);
                warp_mma_f16_f32acc(o[mt][2 * dp + 1], p[mt][2 * kc + 1], h[3][0], h[3][1]);
            }
#endif
        }
    }
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
__device__ __forceinline__ int cta_kv_head(const Fp8FwdParams& p) { return cta_head() / p.kv_group; }
// First byte of key `key0` of this CTA's K head.
__device__ __forceinline__ const unsigned char* cta_k_rows(const Fp8FwdParams& p, int key0) {
    return reinterpret_cast<const unsigned char*>(p.k) + cta_batch() * p.k_batch_stride +
           cta_kv_head(p) * p.k_head_stride + (i64)key0 * p.k_seq_stride;
}
// Byte `key0` of dim 0 of this CTA's Vt head ([dim][vt_len] rows).
__device__ __forceinline__ const unsigned char* cta_vt_rows(const Fp8FwdParams& p, int key0) {
    const i64 head = (i64)cta_batch() * p.kv_heads + cta_kv_head(p);
    return reinterpret_cast<const unsigned char*>(p.vt) + head * cfg::D * (i64)p.vt_len + key0;
}

struct WarpState {
    float o[cfg::MT][cfg::D_FRAGS][4];
    float m[cfg::ROWS];
    float l[cfg::ROWS];
};

// Per-lane ldmatrix rows of the K and Vt fragments (both non-transposed, 8-bit, 32-byte steps).
struct KvLanes {
    QkLane k;
    VtLane v;
    __device__ __forceinline__ explicit KvLanes(int lane)
        : k((((lane >> 4) & 1) << 3) + (lane & 7), (lane >> 3) & 1),
          v((((lane >> 4) & 1) << 3) + (lane & 7), (lane >> 3) & 1) {}
};

// One KV tile: wait for K, prefetch the next K, scores + softmax, wait for Vt, prefetch the
// next Vt, P·V. Two barriers per tile: the first frees the other stage, the second publishes Vt.
template <bool MASK>
__device__ __forceinline__ void cta_kv_tile(WarpState& st, const WarpQ& q_arg, u32 smem, int j, int n_tiles,
                                            const Fp8FwdParams& p, float c, int diag, int lane) {
    const int t = n_tiles - 1 - j;          // tiles run from the last (masked) to the first
    const int stage = j & 1;
    const u32 k_tile = smem + stage * cfg::STAGE_BYTES;
    const u32 v_tile = k_tile + cfg::K_TILE_BYTES;
    const u32 next_k = smem + (stage ^ 1) * cfg::STAGE_BYTES;
    const u32 next_v = next_k + cfg::K_TILE_BYTES;
    // Lane-derived ldmatrix offsets from an opaque thread index, per tile (not hoisted across
    // the loop as live registers; see fwd_int8.cu).
    const int tid = cta_tid();
    const KvLanes kv(tid & 31);
#if Q_IN_REGS
    const WarpQ& q = q_arg;
#else
    const WarpQ q(q_arg.tile, tid >> 5, tid & 31);
#endif

    thread_cp_async_wait<1>();   // everything but Vt_t landed -> K_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_copy_rows<cfg::BN, cfg::QK_ROW_BYTES, cfg::THREADS, true>(next_k, cta_k_rows(p, (t - 1) * cfg::BN),
                                                                       p.k_seq_stride, cfg::BN);
    thread_cp_async_commit();

    u32 pf[cfg::MT][cfg::P_FRAGS][4];
    {
        float s[cfg::MT][cfg::N_FRAGS][4];
        warp_score_matmul<0, cfg::MT>(s, q, k_tile, kv.k);
        if (MASK) warp_mask_tile<cfg::MT, cfg::N_FRAGS>(s, t * cfg::BN, p.kv_len, diag, lane);
        warp_online_softmax<0, cfg::MT>(s, c, st.m, st.l, st.o, pf);
    }

    thread_cp_async_wait<1>();   // everything but K_{t-1} landed -> Vt_t is here
    __syncthreads();
    if (j + 1 < n_tiles)
        cta_copy_rows<cfg::D, cfg::VT_ROW_BYTES, cfg::THREADS, true>(next_v, cta_vt_rows(p, (t - 1) * cfg::BN),
                                                                      opaque(p.vt_len), cfg::D);
    thread_cp_async_commit();

    warp_value_matmul(st.o, pf, v_tile, kv.v);
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) fwd_mma_fp8(const Fp8FwdParams p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 smem = cta_smem_addr(smem_raw);
    const u32 q_smem = smem + cfg::Q_OFFSET;
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

    const int warp_row0 = warp * ROWS_PER_WARP;   // first row of this warp in the CTA
    const int row0 = m0 + warp_row0 + (lane >> 2);   // query index of this lane's row entry 0
    const int diag = p.causal ? row0 + offset + 1 : 0x3fffffff;

    // Score scale in log2 units per raw dot: softmax scale, log2 e and both descales.
    const float qd = __ldg(reinterpret_cast<const float*>(p.q_desc) + batch * p.q_desc_batch + head * p.q_desc_head);
    const float kd = __ldg(reinterpret_cast<const float*>(p.k_desc) + batch * p.kv_desc_batch + kv_head * p.kv_desc_head);
    const float c = thread_mul_rn(p.scale_log2, thread_mul_rn(qd, kd));

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
        const int t0 = n_tiles - 1;
        const unsigned char* q_rows = reinterpret_cast<const unsigned char*>(p.q) + batch * p.q_batch_stride +
                                      head * p.q_head_stride + (i64)m0 * p.q_seq_stride;
        cta_copy_rows<cfg::BM, cfg::QK_ROW_BYTES, cfg::THREADS>(q_smem, q_rows, p.q_seq_stride, p.q_len - m0);
        thread_cp_async_commit();
        cta_copy_rows<cfg::BN, cfg::QK_ROW_BYTES, cfg::THREADS>(smem, cta_k_rows(p, t0 * cfg::BN), p.k_seq_stride,
                                                                 p.kv_len - t0 * cfg::BN);
        thread_cp_async_commit();
        // Vt rows are whole (vt_len covers every tile; the prepass zeroed keys past kv_len).
        cta_copy_rows<cfg::D, cfg::VT_ROW_BYTES, cfg::THREADS>(smem + cfg::K_TILE_BYTES, cta_vt_rows(p, t0 * cfg::BN),
                                                                p.vt_len, cfg::D);
        thread_cp_async_commit();
        thread_cp_async_wait<2>();   // Q landed
        __syncthreads();
        const WarpQ q(q_smem, warp, lane);
        int j = 0;
        for (; j < n_masked; ++j) cta_kv_tile<true>(st, q, smem, j, n_tiles, p, c, diag, lane);
        for (; j < n_tiles; ++j) cta_kv_tile<false>(st, q, smem, j, n_tiles, p, c, diag, lane);
    }

    // ---- epilogue: normalise with the V descale, LSE, stage O through shared memory ----------
    const float vd = __ldg(reinterpret_cast<const float*>(p.v_desc) + batch * p.kv_desc_batch + kv_head * p.kv_desc_head);
    float inv[cfg::ROWS], lse[cfg::ROWS];
#pragma unroll
    for (int i = 0; i < cfg::ROWS; ++i) {
        const float sum = quad_sum(st.l[i]);
        // A row that saw no key (sum 0) writes O = 0 and LSE = -inf; guards NaN sums too.
        const bool empty = !(sum > 0.f);
        inv[i] = empty ? 0.f : thread_div_rn(vd, sum);
        lse[i] = empty ? QA_NEG_INF
                       : (thread_mul_rn(st.m[i], c) + thread_log2(sum) - P_LOG2_SCALE) * 0.6931471805599453f;
    }
    if ((lane & 3) == 0) {
        float* lse_out = reinterpret_cast<float*>(p.lse) + ((i64)batch * p.q_heads + head) * p.q_len;
#pragma unroll
        for (int i = 0; i < cfg::ROWS; ++i) {
            const int row = row0 + 16 * (i >> 1) + 8 * (i & 1);
            if (row < p.q_len) lse_out[row] = lse[i];
        }
    }

    // Every warp is past its last read of both stages (and of a resident Q) after this barrier;
    // each warp then stages its own O rows at the start of shared memory.
    __syncthreads();
    unsigned short* o_rows = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                             head * p.o_head_stride + (i64)m0 * p.o_seq_stride;
    warp_store_o<cfg::MT, cfg::D, OUT_BF16 != 0>(st.o, inv, smem, warp_row0, o_rows, p.o_seq_stride, p.q_len - m0,
                                                 lane);
}
