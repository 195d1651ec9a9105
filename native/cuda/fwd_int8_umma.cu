// INT8 Q·Kᵀ attention forward on Blackwell's tcgen05 UMMA (sm_100a only).
//
// STATUS: compiled for sm_100a and disassembled (quattn kernels / tests/compile_umma.rs check
// the UMMA and TMEM instructions and the absence of spills). It has NOT been run on hardware:
// no sm_100 device was available. Every statement below about what the hardware does is taken
// from the PTX ISA and CUTLASS's descriptor definitions, not observed.
//
// ---- what is computed (the order of src/emulation, rounding for rounding) -------------------
// Per query row i and KV tile t (ascending, BLOCK_K keys each):
//   S_i32 = Q_i8 · K_i8ᵀ                 tcgen05.mma kind::i8, s32 accumulator in TMEM (exact)
//   s     = (float)S_i32 * (q_scale * k_scale)   two f32 roundings (cvt exact for |S| < 2^24);
//           q_scale already carries softmax_scale · log2 e, so s is in log2 units
//   s     = -inf for masked keys (past kv_len, or past the bottom-right causal diagonal)
//   m_new = max(m, max_j s_j);  p_j = exp2(s_j - m_new);  alpha = exp2(m - m_new)
//   l     = l * alpha + Σ_j p_j         f32, p unrounded, summed in key order
//   O     = O * alpha (in TMEM) + P_f16 · V_f16   tcgen05.mma kind::f16, f32 accumulator
// and at the end O = O / l (true division), LSE = m·ln2 + ln(l) + lse_shift; a row that sees no
// key writes O = 0 and LSE = -inf. Differences from the CPU emulation, all below f32 noise of
// the INT8 mode: exp2 / log2 are MUFU.EX2 / MUFU.LG2 (ex2.approx, lg2.approx: a few ulp);
// inside one UMMA k-step (16 keys of P·V) the tensor core adds the products in its own order
// with at least f32 precision where the emulation adds them in key order (src/emulation/mma.rs
// documents that model); O is rounded to f16 on the way out (the emulation returns f32).
// Tiles a row cannot see are skipped by the emulation but processed with p = 0 here when
// another row of the CTA needs them: alpha = exp2(0) = 1 and P·V adds exact zeros, so the
// row's m, l and O do not change.
//
// ---- CTA shape --------------------------------------------------------------------------------
// One CTA = BLOCK_Q = 128 query rows of one (batch, head) = the UMMA M. 4 warps, 128 threads;
// thread t of warp w owns query row 32w + t: tcgen05.ld's 32x32b shape hands warp w exactly
// TMEM lanes 32w..32w+31 = accumulator rows 32w..32w+31, so the whole softmax of a row lives
// in one thread and needs no shuffles. Warp w is also the "warp" of the per-warp Q scales
// (Int8ScaleLayout PerWarp with warps = 4: 32 rows each). Per-thread scales do not map onto
// this layout (they follow an m16 mma.sync fragment) and are refused by the host.
//
// ---- tensor memory ----------------------------------------------------------------------------
// Warp 0 allocates TMEM_COLS = next power of two >= BLOCK_K + HEAD_DIM columns (256 for both
// head dims) with tcgen05.alloc, writes the base address to shared memory, relinquishes the
// allocation permit at once (other CTAs on the SM may allocate), and deallocates after the
// epilogue's last tcgen05.ld. Columns [0, BLOCK_K) hold S (s32), [BLOCK_K, BLOCK_K + HEAD_DIM)
// hold O (f32). M = 128 with cta_group::1 puts accumulator row r in TMEM lane r, column n in
// column base + n.
//
// ---- shared memory and descriptors ------------------------------------------------------------
// All operand tiles use the no-swizzle ("interleaved") canonical layouts of the PTX ISA, built
// from core matrices of 8 rows x 16 bytes stored as 128 contiguous bytes (row r of the core
// matrix at +16r). Descriptor fields: LBO = leading-dimension byte offset, SBO = stride-
// dimension byte offset, version 1 (bit 46), base offset 0, layout type 0.
//   * K-major operands ((8,m),(T,2k)):((1T,SBO),(1,LBO)) — Q (A of QK, int8, 128 x HEAD_DIM
//     bytes), K (B of QK, BLOCK_K x HEAD_DIM bytes), P (A of PV, f16, 128 x 2*BLOCK_K bytes):
//     byte (row, chunk c of 16 bytes) at c * ROWS * 16 + row * 16, i.e. each 16-byte column of
//     the tile is stored as ROWS consecutive rows. SBO = 128 (next 8 rows), LBO = ROWS * 16
//     (next 16 bytes of K). One UMMA consumes 32 bytes of K (k32 for i8, k16 for f16): k-step
//     s starts at tile + 2 * s * LBO.
//   * V (B of PV, f16) is MN-major: its memory rows are keys (= K of P·V) with the head dim
//     (= N) contiguous, ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)). Byte (key, chunk c of 8 dims) at
//     (key / 8) * HEAD_DIM * 16 + c * 128 + (key % 8) * 16: SBO = 128 (next 8 dims), LBO =
//     HEAD_DIM * 16 (next 8 keys); the instruction descriptor sets "B is MN-major" (bit 16).
//     k-step s (16 keys) starts at tile + 2 * s * LBO.
// No swizzle costs tensor-core read bandwidth (bank conflicts on the operand fetch) but keeps
// every address computation checkable by hand; cp.async writes and the st.shared of P are
// conflict-free (8 consecutive threads write one 128-byte core matrix).
// Instruction descriptors: kind::i8 s8 x s8 -> s32, M = 128, N = BLOCK_K, both K-major;
// kind::f16 f16 x f16 -> f32, M = 128, N = HEAD_DIM, A K-major, B MN-major.
//
// ---- pipeline (one CTA, all warps do everything; thread 0 issues the MMAs) ------------------
// K and V tiles stream through two cp.async stages. Per tile j:
//   1. wait for this thread's cp.async groups, fence.proxy.async (generic writes -> async
//      proxy), tcgen05.fence::before_thread_sync, __syncthreads.
//   2. thread 0: fence::after_thread_sync, HEAD_DIM/32 UMMAs S = Q·K_jᵀ, commit -> bar_s.
//   3. everyone: wait bar_s (parity j & 1), fence::after_thread_sync, tcgen05.ld S (4 x 32
//      columns), scale, mask, row max.
//   4. wait bar_o for P·V of tile j-1 (parity (j-1) & 1): from here the P buffer, the other
//      K/V stage and O in TMEM are free; prefetch K_{j+1}, V_{j+1} into the other stage.
//   5. p, l; P as f16 into shared memory; if any row of the warp grew its max, O *= alpha in
//      TMEM (tcgen05.ld -> multiply -> tcgen05.st -> wait::st); alpha == 1 exactly otherwise.
//      The first tile skips the rescale: its first P·V UMMA overwrites O (enable-input-d 0).
//   6. fence.proxy.async (P), fence::before_thread_sync (TMEM st), __syncthreads; thread 0:
//      fence::after_thread_sync, BLOCK_K/16 UMMAs O += P·V_j, commit -> bar_o.
// P·V of tile j runs while tile j+1's S is computed and loaded. The epilogue waits bar_o once
// more, reads O from TMEM, divides by l, writes f16 rows with 16-byte stores.
//
// Compile-time parameters (-D, built by src/int8_umma.rs from one config):
//   HEAD_DIM       64 | 128
//   BLOCK_K        keys per KV tile (= the UMMA N of Q·Kᵀ and the K-scale block)
//   Q_SCALE_WARP   0: one Q scale per 128-row block, 1: one per warp (32 rows)
// The launch ABI is `UmmaParams` below; the Rust mirror is `Int8UmmaParams` in
// src/int8_umma.rs and `Int8UmmaConfig::smem_bytes` mirrors cfg::SMEM_BYTES.
#include "common.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM100_ALL)
#error "fwd_int8_umma.cu uses tcgen05 and compiles for sm_100a only"
#endif
#if !defined(HEAD_DIM) || !defined(BLOCK_K) || !defined(Q_SCALE_WARP)
#error "fwd_int8_umma.cu needs HEAD_DIM, BLOCK_K, Q_SCALE_WARP"
#endif

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int BQ = 128;                    // query rows per CTA = UMMA M = TMEM lanes
constexpr int BK = BLOCK_K;
constexpr int WARPS = 4;
constexpr int THREADS = 32 * WARPS;
constexpr int ROWS_PER_WARP = BQ / WARPS;  // = 32 = one TMEM lane quarter
// TMEM columns: S then O, rounded up to the allocation granule (a power of 2, >= 32).
constexpr int S_COL = 0;
constexpr int O_COL = BK;
constexpr int TMEM_COLS = (BK + D) <= 32 ? 32 : (BK + D) <= 64 ? 64 : (BK + D) <= 128 ? 128
                        : (BK + D) <= 256 ? 256 : 512;
// Shared memory, in bytes.
constexpr int Q_BYTES = BQ * D;            // int8
constexpr int K_BYTES = BK * D;            // int8
constexpr int V_BYTES = BK * D * 2;        // f16
constexpr int P_BYTES = BQ * BK * 2;       // f16
constexpr int Q_OFF = 0;
constexpr int K_OFF = Q_OFF + Q_BYTES;                 // two stages
constexpr int V_OFF = K_OFF + 2 * K_BYTES;             // two stages
constexpr int P_OFF = V_OFF + 2 * V_BYTES;
constexpr int BAR_OFF = P_OFF + P_BYTES;               // bar_s, bar_o (8 bytes each), TMEM address
constexpr int SMEM_BYTES = BAR_OFF + 32;
// Descriptor strides (see the header).
constexpr u32 Q_LBO = BQ * 16, K_LBO = BK * 16, P_LBO = BQ * 16, V_LBO = D * 16;
constexpr u32 CM_SBO = 128;
constexpr u32 IDESC_QK = umma_idesc_s8_s32(BQ, BK, false, false);
constexpr u32 IDESC_PV = umma_idesc_f16_f32(BQ, D, false, true);
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(BK % 32 == 0 && BK >= 32 && BK <= 256, "BLOCK_K: a multiple of 32 in [32, 256] (UMMA N, x32 loads)");
static_assert(BK + D <= 512, "S and O must fit in TMEM");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_100 block may have");
static_assert((BQ * D / 16) % THREADS == 0 && (BK * D / 16) % THREADS == 0, "even copy split");
}  // namespace cfg

struct UmmaParams {
    u64 q, k, v, o, lse;                       // int8 Q, int8 K, f16 V, f16 O, f32 LSE
    u64 q_scale, k_scale, lse_shift;           // f32; lse_shift 0 = none
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // in elements; head dim is contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    i64 v_batch_stride, v_head_stride, v_seq_stride;
    i64 o_batch_stride, o_head_stride, o_seq_stride;
    int q_len, kv_len, q_heads, kv_group;      // kv_group = q_heads / kv_heads (GQA)
    int q_blocks, k_blocks;                    // ceil(q_len / 128), ceil(kv_len / BLOCK_K)
    int causal;                                // bottom-right aligned
    int pad_;
};

// ---- global -> shared ----------------------------------------------------------------------

// Copies ROWS rows of CHUNKS 16-byte chunks into core-matrix layout: byte (row, c) goes to
// (row / 8) * GROUP + c * CHUNK + (row % 8) * 16. Rows at or past `rows_valid` are zero-filled
// (source clamped to row 0, never read): zero K rows give S = 0 that the mask turns into -inf,
// zero V rows keep P·V finite. Eight consecutive threads fill one 128-byte core matrix.
template <int ROWS, int CHUNKS, u32 GROUP, u32 CHUNK>
__device__ __forceinline__ void cta_load_core_matrices(u32 dst, const unsigned char* src, i64 stride_bytes,
                                                       int rows_valid) {
    constexpr int TOTAL = ROWS * CHUNKS;
    static_assert(TOTAL % cfg::THREADS == 0, "even copy split");
#pragma unroll
    for (int i = 0; i < TOTAL / cfg::THREADS; ++i) {
        const int idx = threadIdx.x + i * cfg::THREADS;
        const int c = (idx >> 3) % CHUNKS;
        const int row = (idx / (8 * CHUNKS)) * 8 + (idx & 7);
        const bool ok = row < rows_valid;
        const u32 d = dst + (u32)(row >> 3) * GROUP + (u32)c * CHUNK + (u32)(row & 7) * 16;
        thread_cp_async_16(d, ok ? src + row * stride_bytes + c * 16 : src, ok ? 16 : 0);
    }
}

// K-major Q / K tile (int8): SBO 128, LBO ROWS * 16.
template <int ROWS>
__device__ __forceinline__ void cta_load_kmajor_i8(u32 dst, const signed char* src, i64 stride, int rows_valid) {
    cta_load_core_matrices<ROWS, cfg::D / 16, 128u, (u32)ROWS * 16u>(
        dst, reinterpret_cast<const unsigned char*>(src), stride, rows_valid);
}
// MN-major V tile (f16): SBO 128, LBO HEAD_DIM * 16.
__device__ __forceinline__ void cta_load_mnmajor_v(u32 dst, const unsigned short* src, i64 stride, int rows_valid) {
    cta_load_core_matrices<cfg::BK, cfg::D / 8, (u32)cfg::D * 16u, 128u>(
        dst, reinterpret_cast<const unsigned char*>(src), stride * 2, rows_valid);
}

// ---- the MMAs (thread 0) -------------------------------------------------------------------

// S[tmem] = Q·Kᵀ: HEAD_DIM / 32 k-steps of 32 bytes.
__device__ __forceinline__ void thread_score_matmul(u32 s_tmem, u32 q_tile, u32 k_tile) {
#pragma unroll
    for (int ks = 0; ks < cfg::D / 32; ++ks) {
        const u64 a = thread_umma_smem_desc_noswizzle(q_tile + 2 * ks * cfg::Q_LBO, cfg::Q_LBO, cfg::CM_SBO);
        const u64 b = thread_umma_smem_desc_noswizzle(k_tile + 2 * ks * cfg::K_LBO, cfg::K_LBO, cfg::CM_SBO);
        thread_umma_i8(s_tmem, a, b, cfg::IDESC_QK, ks > 0);
    }
}

// O[tmem] (+)= P·V: BLOCK_K / 16 k-steps of 16 keys. `accumulate` false on the first tile.
__device__ __forceinline__ void thread_value_matmul(u32 o_tmem, u32 p_tile, u32 v_tile, bool accumulate) {
#pragma unroll
    for (int ks = 0; ks < cfg::BK / 16; ++ks) {
        const u64 a = thread_umma_smem_desc_noswizzle(p_tile + 2 * ks * cfg::P_LBO, cfg::P_LBO, cfg::CM_SBO);
        const u64 b = thread_umma_smem_desc_noswizzle(v_tile + 2 * ks * cfg::V_LBO, cfg::V_LBO, cfg::CM_SBO);
        thread_umma_f16(o_tmem, a, b, cfg::IDESC_PV, accumulate || ks > 0);
    }
}

// ---- softmax (one thread = one query row) --------------------------------------------------

struct RowState {
    float m;   // running max, log2 units; -inf until a visible key was seen
    float l;   // running sum of p
};

// Scores of this thread's row for one tile: S from TMEM, dequantized, masked (keys at or past
// `limit`, relative to the tile start, are -inf). Returns the tile's row max folded into m.
template <bool MASK>
__device__ __forceinline__ float thread_load_scores(float (&s)[cfg::BK], u32 s_taddr, float qk_scale, int limit,
                                                    float m) {
#pragma unroll
    for (int c = 0; c < cfg::BK / 32; ++c) {
        u32 r[32];
        warp_tmem_ld_32x32b_x32(r, s_taddr + c * 32);
#pragma unroll
        for (int x = 0; x < 32; ++x) {
            const int jj = c * 32 + x;
            float v = thread_mul_rn((float)(int)r[x], qk_scale);
            if (MASK && jj >= limit) v = QA_NEG_INF;
            s[jj] = v;
            m = fmaxf(m, v);
        }
    }
    return m;
}

// p = exp2(s - m_off) for this thread's row: every 8 keys (one 16-byte chunk) are packed to
// f16 and stored into the K-major P tile at once, so P never needs 128 more registers; the
// returned sum adds the unrounded p in key order.
__device__ __forceinline__ float thread_probabilities(const float (&s)[cfg::BK], float m_off, u32 p_row) {
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < cfg::BK / 8; ++c) {
        u32 h[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const float p0 = thread_exp2(thread_sub_rn(s[8 * c + 2 * x], m_off));
            const float p1 = thread_exp2(thread_sub_rn(s[8 * c + 2 * x + 1], m_off));
            sum = thread_add_rn(sum, p0);
            sum = thread_add_rn(sum, p1);
            h[x] = thread_pack_f16x2(p0, p1);
        }
        asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n"
                     :: "r"(p_row + (u32)c * cfg::P_LBO), "r"(h[0]), "r"(h[1]), "r"(h[2]), "r"(h[3]) : "memory");
    }
    return sum;
}

// O *= alpha for this warp's rows, in TMEM. Warp-collective.
__device__ __forceinline__ void warp_rescale_o(u32 o_taddr, float alpha) {
#pragma unroll
    for (int c = 0; c < cfg::D / 32; ++c) {
        u32 r[32];
        warp_tmem_ld_32x32b_x32(r, o_taddr + c * 32);
#pragma unroll
        for (int x = 0; x < 32; ++x) r[x] = __float_as_uint(thread_mul_rn(__uint_as_float(r[x]), alpha));
        warp_tmem_st_32x32b_x32(o_taddr + c * 32, r);
    }
    warp_tmem_wait_st();
}

// ---- the kernel ----------------------------------------------------------------------------

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

// K (IS_V false) or V rows of tile t of this CTA's KV head.
template <bool IS_V>
__device__ __forceinline__ void cta_load_kv(const UmmaParams& p, u32 dst, int t) {
    const int kv_head = cta_head() / p.kv_group;
    const int batch = cta_batch();
    const int rows = p.kv_len - t * cfg::BK;
    if (IS_V) {
        const unsigned short* v = reinterpret_cast<const unsigned short*>(p.v) + batch * p.v_batch_stride +
                                  kv_head * p.v_head_stride + (i64)t * cfg::BK * p.v_seq_stride;
        cta_load_mnmajor_v(dst, v, p.v_seq_stride, rows);
    } else {
        const signed char* k = reinterpret_cast<const signed char*>(p.k) + batch * p.k_batch_stride +
                               kv_head * p.k_head_stride + (i64)t * cfg::BK * p.k_seq_stride;
        cta_load_kmajor_i8<cfg::BK>(dst, k, p.k_seq_stride, rows);
    }
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) fwd_int8_umma(const UmmaParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem = cta_smem_addr(smem_raw);
    const u32 q_tile = smem + cfg::Q_OFF;
    const u32 p_tile = smem + cfg::P_OFF;
    const u32 bar_s = smem + cfg::BAR_OFF;
    const u32 bar_o = bar_s + 8;
    const u32 tmem_slot = bar_s + 16;
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    // Causal CTAs near the end of the sequence do the most work: launch them first.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int m0 = m_block * cfg::BQ;
    const int row = m0 + tid;                    // this thread's query row
    const int offset = p.kv_len - p.q_len;       // bottom-right causal alignment

    // Keys any row of the CTA can see, and the tiles that need no mask (ascending order: the
    // masked tiles, sequence end and causal diagonal, come last).
    int n_end = p.kv_len;
    int n_full = p.kv_len / cfg::BK;
    if (p.causal) {
        n_end = min(n_end, m0 + cfg::BQ + offset);
        const int first_row_sees = m0 + offset + 1;
        n_full = min(n_full, first_row_sees > 0 ? first_row_sees / cfg::BK : 0);
    }
    const int n_tiles = n_end > 0 ? (n_end + cfg::BK - 1) / cfg::BK : 0;
    n_full = min(max(n_full, 0), n_tiles);
    // Keys [0, row_limit) are visible to this row.
    const int row_limit = p.causal ? min(p.kv_len, max(row + offset + 1, 0)) : p.kv_len;

    // Scales: the Q scale of this row (block- or warp-uniform), the K scales of this KV head.
    const float* q_scales = reinterpret_cast<const float*>(p.q_scale);
    const i64 q_block_index = ((i64)batch * p.q_heads + head) * p.q_blocks + m_block;
    const float q_scale = Q_SCALE_WARP ? q_scales[q_block_index * cfg::WARPS + warp] : q_scales[q_block_index];
    const float* k_scales = reinterpret_cast<const float*>(p.k_scale) +
                            ((i64)batch * (p.q_heads / p.kv_group) + head / p.kv_group) * p.k_blocks;

    RowState st{QA_NEG_INF, 0.f};
    u32 tmem = 0;

    if (n_tiles > 0) {
        if (tid == 0) {
            thread_mbarrier_init(bar_s, 1);
            thread_mbarrier_init(bar_o, 1);
            thread_fence_mbarrier_init();
        }
        if (warp == 0) {
            warp_tmem_alloc(tmem_slot, cfg::TMEM_COLS);
            warp_tmem_relinquish_alloc_permit();
        }
        // Prologue: Q, then K_0 and V_0 into stage 0, one group.
        const signed char* q_head = reinterpret_cast<const signed char*>(p.q) + batch * p.q_batch_stride +
                                    head * p.q_head_stride + (i64)m0 * p.q_seq_stride;
        cta_load_kmajor_i8<cfg::BQ>(q_tile, q_head, p.q_seq_stride, p.q_len - m0);
        cta_load_kv<false>(p, smem + cfg::K_OFF, 0);
        cta_load_kv<true>(p, smem + cfg::V_OFF, 0);
        thread_cp_async_commit();
        thread_tcgen05_fence_before_sync();
        __syncthreads();
        thread_tcgen05_fence_after_sync();
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(tmem) : "r"(tmem_slot) : "memory");
        const u32 lane_base = (u32)(warp * cfg::ROWS_PER_WARP) << 16;
        const u32 s_taddr = tmem + lane_base + cfg::S_COL;
        const u32 o_taddr = tmem + lane_base + cfg::O_COL;
        const u32 p_row = p_tile + (u32)tid * 16;

        for (int j = 0; j < n_tiles; ++j) {
            const int stage = j & 1;
            const u32 k_tile = smem + cfg::K_OFF + stage * cfg::K_BYTES;
            const u32 v_tile = smem + cfg::V_OFF + stage * cfg::V_BYTES;

            // 1. K_j, V_j (and Q) landed; hand them to the async proxy.
            thread_cp_async_wait<0>();
            thread_fence_proxy_async_smem();
            thread_tcgen05_fence_before_sync();
            __syncthreads();
            // 2. S = Q·K_jᵀ.
            if (tid == 0) {
                thread_tcgen05_fence_after_sync();
                thread_score_matmul(tmem + cfg::S_COL, q_tile, k_tile);
                thread_umma_commit(bar_s);
            }
            // 3. Scores, max.
            thread_mbarrier_wait(bar_s, (u32)(j & 1));
            thread_tcgen05_fence_after_sync();
            const float qk_scale = thread_mul_rn(q_scale, k_scales[j]);
            float s[cfg::BK];
            const float m_new = (j < n_full)
                ? thread_load_scores<false>(s, s_taddr, qk_scale, cfg::BK, st.m)
                : thread_load_scores<true>(s, s_taddr, qk_scale, row_limit - j * cfg::BK, st.m);
            // 4. P·V of tile j-1 done: P, the other stage and O are free.
            if (j > 0) {
                thread_mbarrier_wait(bar_o, (u32)((j - 1) & 1));
                thread_tcgen05_fence_after_sync();
            }
            if (j + 1 < n_tiles) {
                const u32 next = (u32)(stage ^ 1);
                cta_load_kv<false>(p, smem + cfg::K_OFF + next * cfg::K_BYTES, j + 1);
                cta_load_kv<true>(p, smem + cfg::V_OFF + next * cfg::V_BYTES, j + 1);
            }
            thread_cp_async_commit();
            // 5. p, l, P; rescale O where the max grew. A row that has seen only masked keys
            // keeps m = -inf; offset 0 then gives p = exp2(-inf) = 0 instead of NaN.
            const float m_off = (m_new == QA_NEG_INF) ? 0.f : m_new;
            const float alpha = thread_exp2(thread_sub_rn(st.m, m_off));   // old -inf -> 0
            const float tile_sum = thread_probabilities(s, m_off, p_row);
            st.l = thread_add_rn(thread_mul_rn(st.l, alpha), tile_sum);
            st.m = m_new;
            if (j > 0 && __any_sync(0xffffffffu, alpha != 1.f)) warp_rescale_o(o_taddr, alpha);
            // 6. O += P·V_j.
            thread_fence_proxy_async_smem();
            thread_tcgen05_fence_before_sync();
            __syncthreads();
            if (tid == 0) {
                thread_tcgen05_fence_after_sync();
                thread_value_matmul(tmem + cfg::O_COL, p_tile, v_tile, j > 0);
                thread_umma_commit(bar_o);
            }
        }
        thread_mbarrier_wait(bar_o, (u32)((n_tiles - 1) & 1));
        thread_tcgen05_fence_after_sync();
    }

    // ---- epilogue: O = acc / l in f16, LSE -----------------------------------------------
    // A row that saw no key (l = 0; also guards NaN) writes O = 0 and LSE = -inf.
    const bool empty = !(st.l > 0.f);
    if (row < p.q_len) {
        float lse = QA_NEG_INF;
        if (!empty) {
            constexpr float LN2 = 0.6931471805599453f;
            lse = thread_add_rn(thread_mul_rn(st.m, LN2), thread_mul_rn(thread_log2(st.l), LN2));
            if (p.lse_shift)
                lse = thread_add_rn(lse, reinterpret_cast<const float*>(p.lse_shift)[((i64)batch * p.q_heads + head) * p.q_len + row]);
        }
        reinterpret_cast<float*>(p.lse)[((i64)batch * p.q_heads + head) * p.q_len + row] = lse;
    }
    unsigned short* o_row = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                            head * p.o_head_stride + (i64)row * p.o_seq_stride;
#pragma unroll
    for (int c = 0; c < cfg::D / 32; ++c) {
        u32 r[32];
        if (n_tiles > 0) {
            // Warp-collective: every lane loads, rows past q_len just do not store.
            warp_tmem_ld_32x32b_x32(r, tmem + ((u32)(warp * cfg::ROWS_PER_WARP) << 16) + cfg::O_COL + c * 32);
        } else {
#pragma unroll
            for (int x = 0; x < 32; ++x) r[x] = 0u;
        }
        if (row < p.q_len) {
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                u32 h[4];
#pragma unroll
                for (int y = 0; y < 4; ++y) {
                    const int e = 8 * x + 2 * y;
                    const float o0 = empty ? 0.f : thread_div_rn(__uint_as_float(r[e]), st.l);
                    const float o1 = empty ? 0.f : thread_div_rn(__uint_as_float(r[e + 1]), st.l);
                    h[y] = thread_pack_f16x2(o0, o1);
                }
                asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                             :: "l"(o_row + c * 32 + 8 * x), "r"(h[0]), "r"(h[1]), "r"(h[2]), "r"(h[3]) : "memory");
            }
        }
    }
    if (n_tiles > 0) {
        // Every warp's last tcgen05.ld is complete (waited inside the load); then warp 0 frees.
        thread_tcgen05_fence_before_sync();
        __syncthreads();
        if (warp == 0) {
            thread_tcgen05_fence_after_sync();
            warp_tmem_dealloc(tmem, cfg::TMEM_COLS);
        }
    }
}
