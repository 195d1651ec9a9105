// FlashAttention-3-style forward on Hopper's warpgroup MMA (wgmma), fp16 in, f32 accumulation.
// sm_90a only (wgmma exists on no other target).
//
// Run on the H100: `examples/wgmma_check.rs` passes on every variant against an f64
// reference, and `quattn selftest` checks it through the facade. Descriptor encodings and
// layouts below follow the PTX ISA ("Matrix Descriptor Format", "Shared Memory Matrix Layout",
// canonical layouts).
//
// CTA. Warp specialized, 3 warpgroups of 4 warps (384 threads): a TMA producer warpgroup and
// 2 consumer warpgroups of 64 query rows each (the M of every wgmma is 64), BLOCK_M = 128 rows
// of one (batch, head). KV_STAGES K/V stages guarded by mbarriers, setmaxnreg, ping-pong
// consumers: the kernel section below, as fwd_wgmma_int8.cu's.
//
// Shared memory layout: the canonical K-major 128-byte-swizzle layout of wgmma, for Q, K and V
// alike. A tile of R rows x D f16 (row = query or key, D = head dim contiguous in global memory)
// is split into D / 64 column blocks of 64 elements = 128 bytes. Column block h occupies
// [h * R * 128, (h + 1) * R * 128); row r of it starts at r * 128; its 16-byte chunk c (elements
// 8c .. 8c + 7 of the block) sits at chunk position c ^ (r & 7):
//     byte(r, e) = (e / 64) * R * 128 + r * 128 + (((e % 64) / 8) ^ (r & 7)) * 16 + (e % 8) * 2
// With every tile base 1024-byte aligned (the dynamic base is rounded up in the kernel), bits 7-9
// of the address are r & 7, so this is exactly the hardware's 128B swizzle (address bits 4-6 ^=
// bits 7-9) applied to a dense [R][64] block: the Swizzle<3,4,3> of the PTX canonical layouts.
// A TMA box of [rows][64 halves] with the 128B swizzle writes chunk c of row r to that position.
//
// Descriptors (PTX "Matrix Descriptor Format", sm_90): start address >> 4 in bits 0-13, leading
// byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, base offset 0, layout type 1 =
// 128B swizzle in bits 62-63.
//   * Q (A, K-major) and K (B of S = Q·Kᵀ, K-major: keys are the N rows, head dim the K dim).
//     Canonical K-major SW128 layout ((8,m),(T,2k)):((8T,SBO),(1,T)): 8-row groups at SBO =
//     1024 bytes, LBO unused (a k16 step is 32 bytes, inside one 128-byte row; set to 1 as is
//     customary). k16 step kk of the head dim starts at block (kk / 4), byte 32 * (kk % 4): the
//     hardware swizzles the computed address, so an un-swizzled +32 start inside the 1024-byte
//     atom selects the right chunks of every row. Warpgroup w's Q rows start 64 * w * 128 bytes
//     into each block (a multiple of 1024).
//   * V (B of O = P·V: K dim = keys, N dim = head dim). V is stored like K ([key][dim], dims
//     contiguous), which for this product is MN-major, so the wgmma's transpose-B bit is 1 and
//     the descriptor follows the canonical MN-major SW128 layout ((T,8,m),(8,k)):((1,T,LBO),
//     (8T,SBO)): 64 dims contiguous per 128-byte row, the next 64 dims (hd128) LBO = BLOCK_N *
//     128 bytes further (the next column block), 8-key groups SBO = 1024 bytes apart. k16 step
//     kk of the keys starts at byte kk * 16 * 128 = 2048 * kk. No transposed copy of V exists.
//
// Register layouts (wgmma m64nNk16, f32 accumulators): warp q of the warpgroup holds rows
// 16q .. 16q + 15; lane 4g + t holds, for each n8 column group n, d[4n + 0, 1] = (row g, cols 8n +
// 2t, +1) and d[4n + 2, 3] = (row g + 8, same cols): two rows per thread, entries i = 0, 1. The
// register A fragment of a m64k16 f16 wgmma has the m16n8k16 mma.sync A layout per warp, so the
// scores of key step kk (n groups 2kk, 2kk + 1) pack into P's A operand as pack(d[8kk + 0, 1]),
// pack(d[8kk + 2, 3]), pack(d[8kk + 4, 5]), pack(d[8kk + 6, 7]) and P never leaves registers.
//
// Pipeline (per consumer warpgroup; FA3's intra-warpgroup overlap). K and V have separate
// KV_STAGES-deep rings filled by the producer. Tile j (keys of KV tile t = n_tiles - 1 - j:
// masked tiles first, like fwd_hmma):
//   wait on the full barriers of K_j (and V_{j-1}), then for this warpgroup's turn
//   wgmma.fence; issue S_j = Q·K_jᵀ (D/16 wgmmas), commit; issue O += P_{j-1}·V_{j-1}
//     (BLOCK_N/16 register-A wgmmas), commit; hand the turn to the other consumer
//   wait_group 1: S_j is done while P_{j-1}·V_{j-1} may still run on the tensor cores; release
//     K_j's stage; mask, row max, rescale decision, exp2 in place, row sums  (overlaps the P·V)
//   wait_group 0: P·V done; release V_{j-1}'s stage; rescale O if needed; pack P_j from S_j.
// After the last tile one more P·V. Register operands of in-flight wgmmas (S, O, P) are pinned
// with empty asm "+r/+f" fences around every issue and wait so that the compiler neither reads
// an accumulator before its wait_group nor reuses P's registers while a P·V reads them.
//
// Softmax: as fwd_hmma (bottom-right causal, sequence-end masks on masked tiles only, GQA,
// natural-log LSE, conditional rescale by RESCALE_LOG2 = 8 decided per warp, which owns its 16
// rows). Epilogue: O · 1/l packed to f16 into the warpgroup's own rows of the Q region (same
// swizzled layout), then 16-byte coalesced global stores.
//
// Compile-time parameters (-D, built by src/wgmma.rs): HEAD_DIM 64 | 128, BLOCK_N 64 | 128,
// KV_STAGES 2..4, PRODUCER_REGS, CONSUMER_REGS (setmaxnreg). ABI: `FwdParams`, identical to
// fwd_hmma's (Rust mirror `HmmaParams`), and `TmaMaps` (three CUtensorMaps built on the host per
// launch, src/tma.rs).
//
// Score modifiers (MODS = 1, a third kernel argument `ModParams` of common.cuh, Rust mirror `ModParams`):
// row i sits at a(i) = i + offset among the keys (bottom-right or top-left alignment) and sees
// keys a(i) - left ..= a(i) + right (a sliding window; causal is right = 0; MOD_UNBOUNDED is no
// bound). The CTA walks only the KV tiles its rows' bands touch and masks only tiles some row
// sees in part, so a window's cost follows its visible pairs. MOD_SOFTCAP applies
// cap · tanh(s / cap) to the scaled logit, MOD_ALIBI then adds -slope[h] · |a(i) - j|, both on
// every tile (in raw score units: the constants arrive divided by the softmax scale). Sinks
// join the softmax denominator in the epilogue: O = Σ p v / (Σ p + e^sink), LSE =
// ln(Σ e^s + e^sink); a row that sees no key keeps O = 0, LSE = -inf.
//
// Variable-length batches (VARLEN = 1, a third kernel argument `VarlenParams` of common.cuh, Rust
// mirror in src/varlen.rs): Q/K/V/O packed token-major, sequence blockIdx.z owns
// Q/O rows cu_q[b] .. cu_q[b + 1] and K/V rows cu_k[b] .. cu_k[b + 1]. FwdParams carries the
// longest sequence's lengths (the grid) and no batch strides; the tensor maps span all rows of
// each tensor with a batch extent of 1. A CTA whose query block starts past its sequence's end
// exits before anything else; the others run the dense pipeline on their sequence's lengths
// (its own bottom-right causal alignment and tile counts), with boxes starting at the
// sequence's first row. A box running past the sequence's end reads the next sequence's rows
// (or TMA's zeros after the last row): those keys are masked like the sequence-end keys of the
// dense kernel (P = 0, so they must be finite, as every row of the packed tensors is), and
// those Q rows only produce O rows that are never stored: the epilogue stores and writes the
// LSE ([q_heads, total_q], none when lse is 0) for the sequence's rows alone.
//
// Both (VARLEN = MODS = 1, `VarlenParams` then `ModParams`): positions are measured against the
// sequence's own lengths. a(i) = i + kv_len_b - q_len_b (bottom-right) or i (top-left) per
// sequence (ModParams.offset is not read), the band's tiles and masks stop at the sequence's
// kv_len, and the box rows past it are masked keys as above.
#include "common.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "fwd_wgmma.cu compiles for sm_90a only (wgmma)"
#endif
#if !defined(HEAD_DIM) || !defined(BLOCK_N) || !defined(KV_STAGES) || !defined(PRODUCER_REGS) || \
    !defined(CONSUMER_REGS)
#error "fwd_wgmma.cu needs HEAD_DIM, BLOCK_N, KV_STAGES, PRODUCER_REGS, CONSUMER_REGS"
#endif
#ifndef RESCALE_LOG2
#define RESCALE_LOG2 8
#endif
#ifndef VARLEN
#define VARLEN 0
#endif

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int WG = 2;                      // consumer warpgroups
constexpr int BM = 64 * WG;
constexpr int BN = BLOCK_N;
constexpr int THREADS = 128 * WG;          // consumer threads
constexpr int BLOCKS = D / 64;             // 128-byte column blocks per row
constexpr int S_REGS = BN / 2;             // f32 scores per thread (m64nBN accumulator)
constexpr int O_REGS = D / 2;              // f32 outputs per thread (m64nD accumulator)
constexpr int K_STEPS = D / 16;            // k16 steps of Q·Kᵀ
constexpr int P_STEPS = BN / 16;           // k16 steps of P·V
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_TILE_BYTES = BN * D * 2;
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(BN == 64 || BN == 128, "BLOCK_N 64 or 128");
static_assert(Q_BYTES % 1024 == 0 && KV_TILE_BYTES % 1024 == 0, "1024-byte aligned tiles");
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

#if MODS
#define MOD_ARG const ModParams &mp,
#define MOD_PASS mp,

// Softcap, ALiBi and (MASK) the band and sequence-end masks on a tile of scores in raw units,
// before warp_softmax<false> takes the row max. `a0` is a(row) of this lane's entry-0 row.
template <bool MASK>
__device__ __forceinline__ void warp_mods(float (&s)[cfg::S_REGS], const ModParams& mp, float slope, int key0, int kv_len,
                                          int a0, int lane) {
    const int col = key0 + 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int a = a0 + 8 * i;
        const int lo = a - mp.left;
        const int hi = min(kv_len, a + mp.right + 1);
#pragma unroll
        for (int n = 0; n < cfg::BN / 8; ++n)
#pragma unroll
            for (int x = 0; x < 2; ++x)
                s[4 * n + 2 * i + x] = thread_mod_score<MASK, MOD_SOFTCAP != 0, MOD_ALIBI != 0>(s[4 * n + 2 * i + x], mp, slope, a,
                                                                                     col + n * 8 + x, lo, hi);
    }
}
#else
#define MOD_ARG
#define MOD_PASS
#endif

#if VARLEN
// The sequence of the CTA (SeqSpan, VarlenParams of common.cuh) where the dense kernel reads
// FwdParams' lengths and batch index.
#define VL_ARG const VarlenParams &vp, const SeqSpan &sq,
#define VL_PASS vp, sq,
#else
#define VL_ARG
#define VL_PASS
#endif

// ---- wgmma primitives: common.cuh (descriptors, fences, commit/wait, register fences, the
// register-A f16 P·V wrappers wg_mma_rs_n64 / wg_mma_rs_n128) --------------------------------

// ---- wgmma wrappers (one asm statement per shape; operand lists written out) --------------

// D[64 x 64] (+)= A[64 x 16] (shared, descriptor) * B[16 x 64] (shared, descriptor), both K-major.
template <int ACC>
__device__ __forceinline__ void wg_mma_ss_n64(float (&d)[32], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// D[64 x 128] (+)= A[64 x 16] (shared, descriptor) * B[16 x 128] (shared, descriptor), both K-major.
template <int ACC>
__device__ __forceinline__ void wg_mma_ss_n128(float (&d)[64], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// S[64 x BN] = Q_wg · K_tileᵀ: K_STEPS wgmmas, the first overwrites (scale-d 0).
__device__ __forceinline__ void wg_issue_scores(float (&s)[cfg::S_REGS], u32 q_wg, u32 k_tile) {
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk) {
        // Column block kk / 4, byte 32 * (kk % 4) of its first row (see the header).
        const u64 a = sw128_desc(q_wg + (u32)((kk >> 2) * cfg::BM * 128 + (kk & 3) * 32), 16, 1024);
        const u64 b = sw128_desc(k_tile + (u32)((kk >> 2) * cfg::BN * 128 + (kk & 3) * 32), 16, 1024);
#if BLOCK_N == 128
        if (kk == 0) wg_mma_ss_n128<0>(s, a, b); else wg_mma_ss_n128<1>(s, a, b);
#else
        if (kk == 0) wg_mma_ss_n64<0>(s, a, b); else wg_mma_ss_n64<1>(s, a, b);
#endif
    }
}

// O[64 x D] += P[64 x BN] · V_tile[BN x D]: P_STEPS register-A wgmmas, V MN-major.
__device__ __forceinline__ void wg_issue_values(float (&o)[cfg::O_REGS], const u32 (&pf)[cfg::P_STEPS][4], u32 v_tile) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk) {
        const u64 b = sw128_desc(v_tile + (u32)kk * 2048u, cfg::BN * 128, 1024);
#if HEAD_DIM == 128
        wg_mma_rs_n128(o, pf[kk], b);
#else
        wg_mma_rs_n64(o, pf[kk], b);
#endif
    }
}

// ---- block indices ------------------------------------------------------------------------

// Volatile reads of the block indices: recomputed where used rather than kept live (fwd_hmma).
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
// ---- softmax -------------------------------------------------------------------------------

struct RowState {
    float m[2];   // running max (raw score units) of row entries 0 (g) and 1 (g + 8)
    float l[2];   // this lane's partial row sums
};

// Mask (MASK), row max, rescale decision, exp2 in place, row sums. Returns the per-row factor
// by which O must be multiplied (1 when `rescale` comes back false). Does not touch O: the
// P·V of the previous tile may still be accumulating into it.
template <bool MASK>
__device__ __forceinline__ void warp_softmax(float (&s)[cfg::S_REGS], RowState& st, float (&alpha)[2], bool& rescale,
                                             int key0, int kv_len, int diag, float c, int lane) {
    if (MASK) {
        const int col = key0 + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int limit = min(kv_len, diag + 8 * i) - col;
#pragma unroll
            for (int n = 0; n < cfg::BN / 8; ++n)
#pragma unroll
                for (int x = 0; x < 2; ++x)
                    if (n * 8 + x >= limit) s[4 * n + 2 * i + x] = QA_NEG_INF;
        }
    }
    float mx[2] = {st.m[0], st.m[1]};
#pragma unroll
    for (int n = 0; n < cfg::BN / 8; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * n], s[4 * n + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    // Conditional rescale (see fwd_hmma): the max only moves when some row of the warp grew by
    // more than RESCALE_LOG2 in log2 units; m = -inf with finite mx always moves (+inf > 8).
    bool need = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = quad_max(mx[i]);
        need |= (mx[i] - st.m[i]) * c > (float)RESCALE_LOG2;
    }
    rescale = __any_sync(0xffffffffu, need);
    float mc[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = rescale ? mx[i] : st.m[i];
        alpha[i] = (mn == st.m[i]) ? 1.f : thread_exp2((st.m[i] - mn) * c);
        st.m[i] = mn;
        st.l[i] *= alpha[i];
        mc[i] = (mn == QA_NEG_INF) ? 0.f : mn * c;
    }
#pragma unroll
    for (int e = 0; e < cfg::S_REGS; ++e) {
        const int i = (e >> 1) & 1;
        s[e] = thread_exp2(fmaf(s[e], c, -mc[i]));
        st.l[i] += s[e];
    }
}

__device__ __forceinline__ void thread_rescale_o(float (&o)[cfg::O_REGS], const float (&alpha)[2]) {
#pragma unroll
    for (int e = 0; e < cfg::O_REGS; ++e) o[e] *= alpha[(e >> 1) & 1];
}

__device__ __forceinline__ void thread_pack_p(u32 (&pf)[cfg::P_STEPS][4], const float (&s)[cfg::S_REGS]) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) pf[kk][x] = thread_pack_f16x2(s[8 * kk + 2 * x], s[8 * kk + 2 * x + 1]);
}

// ---- epilogue ----------------------------------------------------------------------------------

// Normalises this lane's rows, writes their LSE and stages O (f16) into the warpgroup's own
// rows of the Q tile at `q_smem` (same swizzled layout). The caller makes sure every wgmma of
// this warpgroup completed (the other warpgroup never reads these rows), and synchronizes the
// consumer threads before cta_store_o.
__device__ __forceinline__ void thread_finish_rows(const FwdParams& p, VL_ARG const float (&o)[cfg::O_REGS], const RowState& st,
                                                   u32 q_smem, int local_row0, int row0, int lane, float sink_log2) {
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float sum = quad_sum(st.l[i]);
        const bool empty = !(sum > 0.f);
        float m2 = st.m[i] * p.scale_log2;   // the running max in log2 units
        float f = 1.f;
#if MODS
        // The sink joins the denominator (a row that sees no key stays empty): both terms
        // relative to the larger of the row max and the sink, so neither overflows.
        if (!empty) thread_add_sink(m2, sum, f, sink_log2);
#else
        (void)sink_log2;
#endif
        inv[i] = empty ? 0.f : f / sum;
        const float lse = empty ? QA_NEG_INF : (m2 + thread_log2(sum)) * 0.6931471805599453f;
        const int row = row0 + 8 * i;
#if VARLEN
        // LSE [q_heads, total_q]; no LSE buffer (address 0): not written.
        if ((lane & 3) == 0 && row < sq.q_len && p.lse != 0)
            reinterpret_cast<float*>(p.lse)[(i64)cta_head() * vp.total_q + sq.q0 + row] = lse;
#else
        if ((lane & 3) == 0 && row < p.q_len)
            reinterpret_cast<float*>(p.lse)[((i64)cta_batch() * p.q_heads + cta_head()) * p.q_len + row] = lse;
#endif
    }
#pragma unroll
    for (int n = 0; n < cfg::D / 8; ++n)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 packed = thread_pack_f16x2(o[4 * n + 2 * i] * inv[i], o[4 * n + 2 * i + 1] * inv[i]);
            const int r = local_row0 + 8 * i;
            const u32 addr = q_smem + (u32)((n >> 3) * cfg::BM * 128) + tile_swizzle<128>(r, n & 7) + 4 * (lane & 3);
            asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(packed) : "memory");
        }
}

// ---- the kernel: a TMA producer warpgroup and two ping-ponging consumer warpgroups -----------
//
// As fwd_wgmma_int8.cu's kernel: 3 warpgroups, 384 threads. Warpgroup 0 gives registers
// back (setmaxnreg.dec) and one of its threads loads Q once and every K and V tile as TMA boxes
// of [rows][64 halves] (one per 128-byte column block, the map's 128B swizzle = the layout of the
// header; rows past the sequence end arrive as zeros) into KV_STAGES stages guarded by
// KvBarriers. Warpgroups 1 and 2 (setmaxnreg.inc) run the pipeline of the header with no
// CTA-wide barrier and alternate their wgmma issues (wg_wait_turn / wg_give_turn).

namespace ws {
constexpr int STAGES = KV_STAGES;
constexpr int THREADS = 128 * (cfg::WG + 1);
constexpr int K_OFFSET = cfg::Q_BYTES;
constexpr int V_OFFSET = cfg::Q_BYTES + STAGES * cfg::KV_TILE_BYTES;
constexpr int BAR_OFFSET = V_OFFSET + STAGES * cfg::KV_TILE_BYTES;
constexpr int SMEM_BYTES = BAR_OFFSET + 8 * KvBarriers::count(STAGES) + 1024;
constexpr u32 EMPTY_ARRIVALS = 4 * cfg::WG;   // one per consumer warp
constexpr int BAR_EPILOGUE = 3;               // consumers only (1 and 2 are the turns)
static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 K/V stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 block may have");
}  // namespace ws

// Q, K, V tensor maps (built by src/wgmma.rs): f16 boxes of [BM or BN rows][64 halves], rank 4
// (dim, seq, head, batch).
struct TmaMaps {
    TmaMap q, k, v;
};

struct WsSmem {
    u32 q, k, v;
    KvBarriers bars;
    __device__ __forceinline__ explicit WsSmem(u32 base)
        : q(base), k(base + ws::K_OFFSET), v(base + ws::V_OFFSET), bars{base + ws::BAR_OFFSET} {}
    __device__ __forceinline__ u32 k_tile(int s) const { return k + (u32)(s * cfg::KV_TILE_BYTES); }
    __device__ __forceinline__ u32 v_tile(int s) const { return v + (u32)(s * cfg::KV_TILE_BYTES); }
};

// ROWS rows starting at `row` of a (batch, head) into the column-block tile at `dst`: one box per
// 64 columns, all completing on `bar`.
template <int ROWS>
__device__ __forceinline__ void thread_tma_rows(u32 dst, const TmaMap* map, u32 bar, int row, int head, int batch) {
#pragma unroll
    for (int h = 0; h < cfg::BLOCKS; ++h) thread_tma_load_4d(dst + (u32)(h * ROWS * 128), map, bar, 64 * h, row, head, batch);
}

// Producer: one thread loads Q, then K_j and V_j for j = 0 .. n_tiles - 1 (tile
// t_lo + n_tiles - 1 - j), refilling a stage once its empty barrier says both consumers are done
// with it.
__device__ __forceinline__ void thread_produce(const FwdParams& p, VL_ARG const TmaMaps& maps, const WsSmem& sm, int m0,
                                               int t_lo, int n_tiles) {
    const int head = blockIdx.y;
#if VARLEN
    // The maps span every sequence's rows (batch extent 1): boxes start at the sequence's
    // first row; rows past its end are the next sequence's (masked keys, Q rows never stored)
    // or TMA's zero fill past the last one.
    const int batch = 0;
    const int q_row0 = sq.q0;
    const int k_row0 = sq.k0;
#define KV_ROW(t) (k_row0 + (t) * cfg::BN)
#else
    const int batch = blockIdx.z;
#define KV_ROW(t) ((t) * cfg::BN)
#endif
    const int kv_head = head / p.kv_group;
    thread_mbarrier_arrive_expect_tx(sm.bars.q_full(), cfg::Q_BYTES);
#if VARLEN
    thread_tma_rows<cfg::BM>(sm.q, &maps.q, sm.bars.q_full(), q_row0 + m0, head, batch);
#else
    thread_tma_rows<cfg::BM>(sm.q, &maps.q, sm.bars.q_full(), m0, head, batch);
#endif
    for (int j = 0; j < n_tiles; ++j) {
        const int t = t_lo + n_tiles - 1 - j;
        const int s = j % ws::STAGES;
        const u32 parity = ((j / ws::STAGES) & 1) ^ 1;   // the stage's previous use
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.bars.k_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.bars.k_full(s), cfg::KV_TILE_BYTES);
        thread_tma_rows<cfg::BN>(sm.k_tile(s), &maps.k, sm.bars.k_full(s), KV_ROW(t), kv_head, batch);
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.bars.v_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.bars.v_full(s), cfg::KV_TILE_BYTES);
        thread_tma_rows<cfg::BN>(sm.v_tile(s), &maps.v, sm.bars.v_full(s), KV_ROW(t), kv_head, batch);
    }
}
#undef KV_ROW

// One consumer warpgroup's state over the KV walk.
struct WgConsumer {
    float o[cfg::O_REGS];
    u32 pf[cfg::P_STEPS][4];
    float s[cfg::S_REGS];
    RowState st;
    int n_tiles, n_masked, diag, lane, cw;
    u32 q_wg;
#if VARLEN
    int kv_len;   // the sequence's
#endif
#if MODS
    int t_lo, full_lo, full_hi, a0;
    float slope;
#endif

    // KV tile j: issue S_j (and, unless FIRST, P_{j-1}·V_{j-1}) in this warpgroup's turn, softmax
    // S_j while the P·V runs, then rescale O and pack P_j. FIRST is a template parameter so that
    // ptxas sees one fixed wgmma pipeline per instantiation.
    template <bool FIRST>
    __device__ __forceinline__ void step(const FwdParams& p, MOD_ARG const WsSmem& sm, int j) {
#if VARLEN
        const int seq_kv_len = kv_len;
#else
        const int seq_kv_len = p.kv_len;
#endif
#if MODS
        const int t = t_lo + n_tiles - 1 - j;
#else
        const int t = n_tiles - 1 - j;
#endif
        const int stage = j % ws::STAGES;
        const int prev = (j + ws::STAGES - 1) % ws::STAGES;
        thread_mbarrier_wait(sm.bars.k_full(stage), (j / ws::STAGES) & 1);
        if (!FIRST) thread_mbarrier_wait(sm.bars.v_full(prev), ((j - 1) / ws::STAGES) & 1);
        wg_wait_turn(cw);
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_scores(s, q_wg, sm.k_tile(stage));
        wg_commit();
        if (!FIRST) {
            wg_issue_values(o, pf, sm.v_tile(prev));
            wg_commit();
        }
        wg_give_turn(cw);
        if (FIRST) wg_wait<0>(); else wg_wait<1>();   // S_j done
        reg_fence(s);
        if (lane == 0) thread_mbarrier_arrive(sm.bars.k_empty(stage));
        float alpha[2];
        bool rescale;
#if MODS
        if (t < full_lo || t > full_hi) warp_mods<true>(s, mp, slope, t * cfg::BN, seq_kv_len, a0, lane);
        else warp_mods<false>(s, mp, slope, t * cfg::BN, seq_kv_len, a0, lane);
        warp_softmax<false>(s, st, alpha, rescale, t * cfg::BN, seq_kv_len, diag, p.scale_log2, lane);
#else
        if (j < n_masked) warp_softmax<true>(s, st, alpha, rescale, t * cfg::BN, seq_kv_len, diag, p.scale_log2, lane);
        else warp_softmax<false>(s, st, alpha, rescale, t * cfg::BN, seq_kv_len, diag, p.scale_log2, lane);
#endif
        wg_wait<0>();                                 // P_{j-1}·V_{j-1} done
        reg_fence(o);
        reg_fence(pf);
        if (!FIRST && lane == 0) thread_mbarrier_arrive(sm.bars.v_empty(prev));
        if (rescale) thread_rescale_o(o, alpha);
        thread_pack_p(pf, s);
    }

    // The last P·V, in its turn too; consumer 1 opens no turn after it (nobody would wait).
    __device__ __forceinline__ void finish(const WsSmem& sm) {
        const int last = n_tiles - 1;
        thread_mbarrier_wait(sm.bars.v_full(last % ws::STAGES), (last / ws::STAGES) & 1);
        wg_wait_turn(cw);
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_values(o, pf, sm.v_tile(last % ws::STAGES));
        wg_commit();
        if (cw == 0) wg_give_turn(cw);
        wg_wait<0>();
        reg_fence(o);
        reg_fence(pf);
    }
};

extern "C" __global__ void __launch_bounds__(ws::THREADS, 1)
fwd_wgmma(const FwdParams p, const __grid_constant__ TmaMaps maps
#if VARLEN
          , const VarlenParams vp
#endif
#if MODS
          , const __grid_constant__ ModParams mp
#endif
) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const WsSmem sm((cta_smem_addr(smem_raw) + 1023u) & ~1023u);
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * cfg::BM;
#if VARLEN
    // The grid covers the longest sequence: a block past this one's end has nothing to do
    // (uniform over the CTA, before any barrier).
    const SeqSpan sq = cta_seq_span(vp, blockIdx.z, p.causal);
    if (m0 >= sq.q_len) return;
#endif
#if MODS
#if VARLEN
    // The band against the sequence's own lengths.
    const int a_offset = mod_offset(mp, sq.q_len, sq.kv_len);
    const ModTiles mt = cta_mod_tiles<cfg::BM, cfg::BN>(sq.kv_len, a_offset, mp, m0);
#else
    const int a_offset = mp.offset;
    const ModTiles mt = cta_mod_tiles<cfg::BM, cfg::BN>(p.kv_len, a_offset, mp, m0);
#endif
    const CtaTiles tiles{mt.n_tiles, 0};
    const int t_lo = mt.t_lo;
#elif VARLEN
    const CtaTiles tiles = cta_tiles<cfg::BM, cfg::BN>(sq, m0);
    const int t_lo = 0;
#else
    const CtaTiles tiles = cta_tiles<cfg::BM, cfg::BN>(p, m0);
    const int t_lo = 0;
#endif

    if (tid == 0) sm.bars.init(ws::STAGES, ws::EMPTY_ARRIVALS);
    __syncthreads();

    if (wg == 0) {
        wg_setmaxnreg_dec<PRODUCER_REGS>();
        if (tid == 0 && tiles.n_tiles > 0) {
            thread_tma_prefetch_map(&maps.k);
            thread_tma_prefetch_map(&maps.v);
            thread_produce(p, VL_PASS maps, sm, m0, t_lo, tiles.n_tiles);
        }
    } else {
        wg_setmaxnreg_inc<CONSUMER_REGS>();
        const int ctid = tid - 128;               // index among the consumer threads
        WgConsumer c;
        c.cw = wg - 1;
        c.lane = tid & 31;
        c.n_tiles = tiles.n_tiles;
        c.n_masked = tiles.n_masked;
        const int local_row0 = 64 * c.cw + 16 * ((tid >> 5) & 3) + (c.lane >> 2);
        const int row0 = m0 + local_row0;
#if VARLEN
        c.diag = p.causal ? row0 + sq.kv_len - sq.q_len + 1 : 0x3fffffff;
        c.kv_len = sq.kv_len;
#else
        c.diag = p.causal ? row0 + p.kv_len - p.q_len + 1 : 0x3fffffff;
#endif
        c.q_wg = sm.q + (u32)(64 * c.cw * 128);
#if MODS
        c.t_lo = mt.t_lo;
        c.full_lo = mt.full_lo;
        c.full_hi = mt.full_hi;
        c.a0 = row0 + a_offset;
        c.slope = MOD_ALIBI ? mp.alibi_raw[cta_head()] : 0.f;
        const float sink_log2 = mp.sink_log2[cta_head()];
#else
        const float sink_log2 = 0.f;
#endif
#pragma unroll
        for (int e = 0; e < cfg::O_REGS; ++e) c.o[e] = 0.f;
        c.st.m[0] = c.st.m[1] = QA_NEG_INF;
        c.st.l[0] = c.st.l[1] = 0.f;
        if (c.n_tiles > 0) {
            if (c.cw == 1) wg_give_turn(c.cw);    // consumer 0 issues first
            thread_mbarrier_wait(sm.bars.q_full(), 0);
            c.step<true>(p, MOD_PASS sm, 0);
            for (int j = 1; j < c.n_tiles; ++j) c.step<false>(p, MOD_PASS sm, j);
            c.finish(sm);
        }
        // Epilogue: this warpgroup's wgmmas are done and the other never reads its Q rows.
        thread_finish_rows(p, VL_PASS c.o, c.st, sm.q, local_row0, row0, c.lane, sink_log2);
        cta_named_sync(ws::BAR_EPILOGUE, cfg::THREADS);
#if VARLEN
        unsigned short* o_rows = reinterpret_cast<unsigned short*>(p.o) + (i64)cta_head() * p.o_head_stride +
                                 (i64)(sq.q0 + m0) * p.o_seq_stride;
        cta_store_o_rows<cfg::BM, cfg::D, cfg::THREADS>(o_rows, p.o_seq_stride, sq.q_len - m0, sm.q, ctid);
#else
        cta_store_o<cfg::BM, cfg::D, cfg::THREADS>(p, sm.q, m0, ctid);
#endif
    }
}
