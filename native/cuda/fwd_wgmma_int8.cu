// INT8 Q·Kᵀ on Hopper's warpgroup MMA (s8 wgmma, SASS IGMMA), f32 online softmax in log2 units,
// f16 P·V on f16 wgmma (HGMMA) with P in registers. sm_90a only. SageAttention numerics of
// fwd_int8.cu (same host contract: Int8FwdParams, scale layouts, LSE shift) on the CTA and
// pipeline of fwd_wgmma.cu (read both headers first).
//
// Warp specialized, 384 threads: a producer warpgroup loads through TMA into KV_STAGES stages,
// the two consumer warpgroups ping-pong (see the kernel section below). On the H100 this is
// 1.2-1.3x a kernel in which every thread issues cp.async and both consumer warpgroups run in
// lockstep with a CTA barrier per KV tile. Checked on an H100 by `examples/int8_check.rs` and
// `quattn selftest`.
//
// CTA. 2 consumer warpgroups x 64 query rows: BLOCK_M = 128, BLOCK_N = 128 keys per KV tile (=
// keys per K scale).
//
// Shared memory (base rounded up to 1024 bytes):
//   Q   int8 [128 rows][HEAD_DIM bytes]                      (resident)
//   K   int8 [128 keys][HEAD_DIM bytes] x KV_STAGES
//   V   f16  [128 keys][HEAD_DIM] x KV_STAGES, in fwd_wgmma.cu's 128B-swizzle column blocks
//   mbarriers, 8 bytes each: Q full, then per stage K full, V full, K empty, V empty
// int8 rows are HEAD_DIM bytes, stored densely and swizzled in place:
//   * hd128: a row is 128 bytes = one row of the 128B swizzle atom: chunk c of row r at
//     c ^ (r & 7) (tile_swizzle<128>), layout type 1, 8-row groups SBO = 1024 bytes.
//   * hd64: a row is 64 bytes; the 64B swizzle (layout type 2, Swizzle<2,4,3>: address bits 4-5
//     ^= bits 7-8) of a dense [R][64 B] tile is chunk c of row r at c ^ ((r >> 1) & 3), which is
//     exactly tile_swizzle<64> of common.cuh; 8-row atoms of 512 bytes, SBO = 512. Chosen over
//     padding to 128-byte rows: no wasted shared memory or copy bandwidth, and a TMA box of
//     64-byte rows with the map's 64B swizzle writes it.
//   Both are the canonical K-major layouts for 8-bit elements (T = 128 resp. 64 elements per
//   swizzle row). A k32 step of s8 is 32 bytes: step kk starts 32 * kk bytes into the first row
//   (the hardware swizzles the computed addresses, as for fwd_wgmma's k16 steps of f16); LBO is
//   unused (1). Warpgroup w's Q rows start 64 * w * HEAD_DIM bytes in (a multiple of the atom).
//   Every tile offset is a multiple of 1024.
//
// MMAs per KV tile and warpgroup: S[64 x 128] s32 = Q_wg · K_tileᵀ as HEAD_DIM / 32 wgmmas
// m64n128k32.s32.s8.s8 (A and B by descriptor); O[64 x HEAD_DIM] += P · V as 8 register-A
// m64nHEAD_DIMk16 f16 wgmmas (V MN-major by descriptor with the transpose bit: fwd_wgmma.cu).
// The s32 accumulator fragment is the f32 one: warp q of the warpgroup holds rows 16q .. 16q+15,
// lane 4g + t holds d[4n + 0, 1] = (row g, keys 8n + 2t, +1), d[4n + 2, 3] = (row g + 8, same).
//
// Scales (Int8ScaleLayout of quattn's codec with blocking (block_q 128, block_k 128, warps 8)):
// CTA warp W = tid / 32 = 4 * warpgroup + warp-in-warpgroup owns CTA rows 16W .. 16W + 15, lane
// quad g rows 16W + g and 16W + g + 8, so
//   Q_GRAN 0 (per block):  one scale per CTA                  -> q_scale[bh][m_block]
//   Q_GRAN 1 (per warp):   8 warps of 16 rows                  -> q_scale[bh][m_block][W]
//   Q_GRAN 2 (per thread): 8 warps x 8 row groups {g, g + 8}   -> q_scale[bh][m_block][W][g]
// which is the codec's layout (PerWarp: w = (i % 128) / 16; PerThread: block_q / warps = 16,
// group (i % 128 % 16) % 8). K: k_scale[b][kv_head][t] for keys [128 t, 128 t + 128).
//
// Numerics (as fwd_int8.cu): x = float(dot) exactly (s32 + THREAD_I2F_BIAS, one FADD; |dot| <=
// 127^2 * 128 < 2^22), sc = q_scale * k_scale per row and tile, the row max taken on x and
// scaled once (sc > 0), p = exp2(fma(x, sc, -m)) with m in log2 units, conditional rescale by
// RESCALE_LOG2 = 8 decided per warp, a row's max starting at the finite M_EMPTY, P rounded to
// f16, f32 O, O = acc / l, LSE = (m + log2 l) ln 2 + lse_shift.
//
// Pipeline (per consumer warpgroup): fwd_wgmma.cu's. Tile j: wait on the full barriers of K_j
// and V_{j-1}; in this warpgroup's turn issue S_j, commit, issue P_{j-1}·V_{j-1}, commit;
// wait_group 1 (S_j done), release K_j's stage; convert, mask, softmax (overlapping the P·V);
// wait_group 0, release V_{j-1}'s stage; rescale O; pack P_j.
//
// Epilogue: O · 1/l packed to f16 and staged through the start of shared memory (Q and K
// regions: 2 * 128 * HEAD_DIM bytes needed, at least 3 * 128 * HEAD_DIM there) in
// fwd_wgmma.cu's 128B-swizzle column blocks, then 16-byte coalesced stores, after a consumer
// barrier that every consumer reaches past its last wgmma.
//
// Compile-time parameters (-D, built by src/wgmma_int8.rs): HEAD_DIM 64 | 128, Q_GRAN 0 | 1 | 2,
// KV_STAGES (2..4), PRODUCER_REGS and CONSUMER_REGS (setmaxnreg). ABI: `Int8FwdParams` of
// fwd_int8.cu (Rust mirror `Int8Params` in src/int8.rs) and `Int8TmaMaps` (three CUtensorMaps,
// built on the host per launch).
#include "common.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "fwd_wgmma_int8.cu compiles for sm_90a only (wgmma)"
#endif
#if !defined(HEAD_DIM) || !defined(Q_GRAN) || !defined(KV_STAGES) || !defined(PRODUCER_REGS) || \
    !defined(CONSUMER_REGS)
#error "fwd_wgmma_int8.cu needs HEAD_DIM, Q_GRAN, KV_STAGES, PRODUCER_REGS, CONSUMER_REGS"
#endif
#ifndef RESCALE_LOG2
#define RESCALE_LOG2 8
#endif
#define M_EMPTY (-1.7014118e38f)

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int WG = 2;
constexpr int BM = 64 * WG;
constexpr int BN = 128;
constexpr int THREADS = 128 * WG;          // consumer threads
constexpr int WARPS = THREADS / 32;
constexpr int S_REGS = BN / 2;             // s32 scores per thread (m64n128 accumulator)
constexpr int O_REGS = D / 2;              // f32 outputs per thread (m64nD accumulator)
constexpr int K_STEPS = D / 32;            // k32 steps of Q·Kᵀ (s8)
constexpr int P_STEPS = BN / 16;           // k16 steps of P·V (f16)
constexpr int V_BLOCKS = D / 64;           // 128-byte column blocks of an f16 V row
constexpr int Q_BYTES = BM * D;
constexpr int K_TILE_BYTES = BN * D;
constexpr int V_TILE_BYTES = BN * D * 2;
constexpr int O_STAGE_BYTES = BM * D * 2;
constexpr int Q_SCALES_PER_BLOCK = Q_GRAN == 0 ? 1 : Q_GRAN == 1 ? WARPS : WARPS * 8;
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(Q_GRAN >= 0 && Q_GRAN <= 2, "Q_GRAN 0, 1 or 2");
static_assert(Q_BYTES % 1024 == 0 && K_TILE_BYTES % 1024 == 0 && V_TILE_BYTES % 1024 == 0, "aligned tiles");
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

// ---- wgmma -----------------------------------------------------------------------------------

// S[64 x 128] (+)= A[64 x 32] (shared, descriptor) * B[32 x 128] (shared, descriptor), s8 x s8 ->
// s32, both K-major. ACC 0 overwrites (scale-d false). Integer wgmma has no negate / transpose
// immediates.
template <int ACC>
__device__ __forceinline__ void wg_mma_s8_n128(int (&d)[64], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p; }\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// Descriptor of the int8 tile at `addr` (K-major, 8-row atoms; see the header).
__device__ __forceinline__ u64 qk_desc(u32 addr) {
#if HEAD_DIM == 128
    return sw128_desc(addr, 16, 1024);
#else
    return sw64_desc(addr, 16, 512);
#endif
}

// S[64 x BN] = Q_wg · K_tileᵀ (s32): K_STEPS wgmmas, the first overwrites.
__device__ __forceinline__ void wg_issue_scores(int (&s)[cfg::S_REGS], u32 q_wg, u32 k_tile) {
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk) {
        const u64 a = qk_desc(q_wg + (u32)kk * 32u);
        const u64 b = qk_desc(k_tile + (u32)kk * 32u);
        if (kk == 0) wg_mma_s8_n128<0>(s, a, b); else wg_mma_s8_n128<1>(s, a, b);
    }
}

// O[64 x D] += P[64 x BN] · V_tile[BN x D]: P_STEPS register-A f16 wgmmas, V MN-major.
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

// ---- scales ----------------------------------------------------------------------------------

// The K scale of tile t.
__device__ __forceinline__ float cta_k_scale(const Int8FwdParams& p, int t) {
    const int k_blocks = (p.kv_len + cfg::BN - 1) / cfg::BN;
    return __ldg(reinterpret_cast<const float*>(p.k_scale) + ((i64)cta_batch() * p.kv_heads + cta_kv_head(p)) * k_blocks + t);
}
// This lane's Q scale (rows g and g + 8 of its warp share it in every granularity; header).
// `tid`: the thread's index among the CTA's consumer threads.
__device__ __forceinline__ float cta_q_scale(const Int8FwdParams& p, int tid) {
    int m_block;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(m_block));
    m_block = gridDim.x - 1 - m_block;
    const float* base = reinterpret_cast<const float*>(p.q_scale) +
                        (((i64)cta_batch() * p.q_heads + cta_head()) * gridDim.x + m_block) * cfg::Q_SCALES_PER_BLOCK;
#if Q_GRAN == 0
    (void)tid;
    return __ldg(base);
#elif Q_GRAN == 1
    return __ldg(base + (tid >> 5));
#else
    return __ldg(base + (tid >> 5) * 8 + ((tid & 31) >> 2));
#endif
}

// ---- softmax (log2 units) -------------------------------------------------------------------

struct RowState {
    float m[2];   // running max (log2 units) of row entries 0 (g) and 1 (g + 8); M_EMPTY at first
    float l[2];   // this lane's partial row sums
};

// s32 scores -> exact floats, mask (MASK), row max, rescale decision, exp2 in place (x becomes
// P), row sums. Returns the per-row factor for O in alpha (rescale false: O untouched). Does not
// touch O: the P·V of the previous tile may still be accumulating into it.
template <bool MASK>
__device__ __forceinline__ void warp_softmax(const int (&acc)[cfg::S_REGS], float (&x)[cfg::S_REGS], RowState& st,
                                             float (&alpha)[2], bool& rescale, float sc, int key0, int kv_len,
                                             int diag, int lane) {
#pragma unroll
    for (int e = 0; e < cfg::S_REGS; ++e) x[e] = thread_biased_to_f32(acc[e] + THREAD_I2F_BIAS);
    if (MASK) {
        const int col = key0 + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int limit = min(kv_len, diag + 8 * i) - col;
#pragma unroll
            for (int n = 0; n < cfg::BN / 8; ++n)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    if (n * 8 + c >= limit) x[4 * n + 2 * i + c] = QA_NEG_INF;
        }
    }
    float mx[2] = {QA_NEG_INF, QA_NEG_INF};
#pragma unroll
    for (int n = 0; n < cfg::BN / 8; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(x[4 * n], x[4 * n + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(x[4 * n + 2], x[4 * n + 3]));
    }
    bool need = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        // fl(max x * sc) = max fl(x * sc): sc > 0 and rounding is monotone.
        mx[i] = quad_max(mx[i]) * sc;
        need |= mx[i] - st.m[i] > (float)RESCALE_LOG2;
    }
    rescale = __any_sync(0xffffffffu, need);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = rescale ? fmaxf(st.m[i], mx[i]) : st.m[i];
        alpha[i] = (mn == st.m[i]) ? 1.f : thread_exp2(st.m[i] - mn);
        st.m[i] = mn;
        st.l[i] *= alpha[i];
    }
#pragma unroll
    for (int e = 0; e < cfg::S_REGS; ++e) {
        const int i = (e >> 1) & 1;
        x[e] = thread_exp2(fmaf(x[e], sc, -st.m[i]));
        st.l[i] += x[e];
    }
}

__device__ __forceinline__ void thread_rescale_o(float (&o)[cfg::O_REGS], const float (&alpha)[2]) {
#pragma unroll
    for (int e = 0; e < cfg::O_REGS; ++e) o[e] *= alpha[(e >> 1) & 1];
}

__device__ __forceinline__ void thread_pack_p(u32 (&pf)[cfg::P_STEPS][4], const float (&x)[cfg::S_REGS]) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk)
#pragma unroll
        for (int c = 0; c < 4; ++c) pf[kk][c] = thread_pack_f16x2(x[8 * kk + 2 * c], x[8 * kk + 2 * c + 1]);
}

// ---- epilogue ----------------------------------------------------------------------------------

// Normalises this lane's rows, writes their LSE (+ shift) and stages O (f16) in fwd_wgmma.cu's
// 128B-swizzle column blocks at `stage` (BM * D * 2 bytes). The caller synchronizes the
// consumer threads before (nobody still reads the region) and after (before cta_store_o).
__device__ __forceinline__ void thread_finish_rows(const Int8FwdParams& p, const float (&o)[cfg::O_REGS],
                                                   const RowState& st, u32 stage, int local_row0, int row0,
                                                   int lane) {
    float inv[2];
    const i64 lse_base = ((i64)cta_batch() * p.q_heads + cta_head()) * p.q_len;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float sum = quad_sum(st.l[i]);
        // A row that saw no key (sum 0) writes O = 0 and LSE = -inf; guards NaN sums too.
        const bool empty = !(sum > 0.f);
        inv[i] = empty ? 0.f : 1.f / sum;
        float lse = empty ? QA_NEG_INF : (st.m[i] + thread_log2(sum)) * 0.6931471805599453f;
        const int row = row0 + 8 * i;
        if ((lane & 3) == 0 && row < p.q_len) {
            const float* shift = reinterpret_cast<const float*>(p.lse_shift);
            if (shift && !empty) lse += __ldg(shift + lse_base + row);
            reinterpret_cast<float*>(p.lse)[lse_base + row] = lse;
        }
    }
#pragma unroll
    for (int n = 0; n < cfg::D / 8; ++n)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 packed = thread_pack_f16x2(o[4 * n + 2 * i] * inv[i], o[4 * n + 2 * i + 1] * inv[i]);
            const int r = local_row0 + 8 * i;
            const u32 addr = stage + (u32)((n >> 3) * cfg::BM * 128) + tile_swizzle<128>(r, n & 7) + 4 * (lane & 3);
            asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(packed) : "memory");
        }
}

// ---- the kernel: a TMA producer warpgroup and two ping-ponging consumer warpgroups -----------
//
// 3 warpgroups, 384 threads. Warpgroup 0 is the producer: it gives registers back
// (setmaxnreg.dec) and one thread issues every load as a TMA box (Q once; per KV tile the K
// box and HEAD_DIM / 64 V boxes), each completing on the stage's "full" mbarrier; before it
// refills a stage it waits on the stage's "empty" mbarrier, on which each consumer warp arrives
// once its wgmmas have read the stage. The tensor maps apply the swizzles of the header (K, Q:
// 128B / 64B by head dim; V: 128B column blocks), and zero-fill the rows past the sequence ends.
// Warpgroups 1 and 2 are the consumers (setmaxnreg.inc), each with 64 query rows, running the
// pipeline of the header without any CTA-wide barrier. Their wgmma issues
// alternate (FlashAttention-3's ping-pong): consumer c waits on named barrier 1 + c before it
// issues a tile's wgmmas and arrives on the other's barrier after, so one warpgroup's softmax
// runs while the other's matrix products use the tensor cores.

namespace ws {
constexpr int STAGES = KV_STAGES;
constexpr int THREADS = 128 * (cfg::WG + 1);
constexpr int K_OFFSET = cfg::Q_BYTES;
constexpr int V_OFFSET = cfg::Q_BYTES + STAGES * cfg::K_TILE_BYTES;
constexpr int BAR_OFFSET = V_OFFSET + STAGES * cfg::V_TILE_BYTES;
constexpr int SMEM_BYTES = BAR_OFFSET + 8 * KvBarriers::count(STAGES) + 1024;
constexpr u32 EMPTY_ARRIVALS = 4 * cfg::WG;   // one per consumer warp
constexpr int CONSUMERS = cfg::THREADS;       // consumer threads (named barriers 1..3)
constexpr int BAR_EPILOGUE = 3;
static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 K/V stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 block may have");
static_assert(cfg::O_STAGE_BYTES <= V_OFFSET, "O is staged through the Q and K regions");
}  // namespace ws

// The three tensor maps (built by src/wgmma_int8.rs): int8 Q and K boxes of [128 rows][HEAD_DIM
// bytes] and f16 V boxes of [128 rows][64 halves], rank 4 (dim, seq, head, batch).
struct Int8TmaMaps {
    TmaMap q, k, v;
};

// Shared-memory map of the CTA: tiles and the pipeline's mbarriers.
struct WsSmem {
    u32 q, k, v;
    KvBarriers bars;
    __device__ __forceinline__ explicit WsSmem(u32 base)
        : q(base), k(base + ws::K_OFFSET), v(base + ws::V_OFFSET), bars{base + ws::BAR_OFFSET} {}
    __device__ __forceinline__ u32 q_full() const { return bars.q_full(); }
    __device__ __forceinline__ u32 k_full(int s) const { return bars.k_full(s); }
    __device__ __forceinline__ u32 v_full(int s) const { return bars.v_full(s); }
    __device__ __forceinline__ u32 k_empty(int s) const { return bars.k_empty(s); }
    __device__ __forceinline__ u32 v_empty(int s) const { return bars.v_empty(s); }
    __device__ __forceinline__ u32 k_tile(int s) const { return k + (u32)(s * cfg::K_TILE_BYTES); }
    __device__ __forceinline__ u32 v_tile(int s) const { return v + (u32)(s * cfg::V_TILE_BYTES); }
};

// Producer: one thread loads Q, then K_j and V_j for j = 0 .. n_tiles - 1 (tile n_tiles - 1 - j),
// refilling a stage once its empty barrier says both consumers are done with it.
__device__ __forceinline__ void thread_produce(const Int8FwdParams& p, const Int8TmaMaps& maps, const WsSmem& sm,
                                               int m0, int n_tiles) {
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.kv_group;
    thread_mbarrier_arrive_expect_tx(sm.q_full(), cfg::Q_BYTES);
    thread_tma_load_4d(sm.q, &maps.q, sm.q_full(), 0, m0, head, batch);
    for (int j = 0; j < n_tiles; ++j) {
        const int t = n_tiles - 1 - j;
        const int s = j % ws::STAGES;
        const u32 parity = ((j / ws::STAGES) & 1) ^ 1;   // the stage's previous use
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.k_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.k_full(s), cfg::K_TILE_BYTES);
        thread_tma_load_4d(sm.k_tile(s), &maps.k, sm.k_full(s), 0, t * cfg::BN, kv_head, batch);
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.v_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.v_full(s), cfg::V_TILE_BYTES);
#pragma unroll
        for (int h = 0; h < cfg::V_BLOCKS; ++h)
            thread_tma_load_4d(sm.v_tile(s) + h * cfg::BN * 128, &maps.v, sm.v_full(s), 64 * h, t * cfg::BN, kv_head,
                               batch);
    }
}

// One consumer warpgroup's state over the KV walk.
struct WgConsumer {
    float o[cfg::O_REGS];
    u32 pf[cfg::P_STEPS][4];
    int s[cfg::S_REGS];
    RowState st;
    float qs, ks;
    int n_tiles, n_masked, diag, lane, cw;
    u32 q_wg;

    __device__ __forceinline__ void wait_turn() const { wg_wait_turn(cw); }
    __device__ __forceinline__ void give_turn() const { wg_give_turn(cw); }

    // KV tile j (tile n_tiles - 1 - j): issue S_j (and, unless FIRST, P_{j-1}·V_{j-1}) in this
    // warpgroup's turn, softmax S_j while the P·V runs, then rescale O and pack P_j. FIRST is a
    // template parameter, not a run-time branch, so that ptxas sees one fixed wgmma pipeline in
    // each instantiation (a conditional wait makes it serialize every wgmma).
    template <bool FIRST>
    __device__ __forceinline__ void step(const Int8FwdParams& p, const WsSmem& sm, int j) {
        const int t = n_tiles - 1 - j;
        const int stage = j % ws::STAGES;
        const int prev = (j + ws::STAGES - 1) % ws::STAGES;
        const float ks_next = j + 1 < n_tiles ? cta_k_scale(p, t - 1) : 0.f;
        thread_mbarrier_wait(sm.k_full(stage), (j / ws::STAGES) & 1);
        if (!FIRST) thread_mbarrier_wait(sm.v_full(prev), ((j - 1) / ws::STAGES) & 1);
        wait_turn();
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_scores(s, q_wg, sm.k_tile(stage));
        wg_commit();
        if (!FIRST) {
            wg_issue_values(o, pf, sm.v_tile(prev));
            wg_commit();
        }
        give_turn();
        if (FIRST) wg_wait<0>(); else wg_wait<1>();   // S_j done
        reg_fence(s);
        if (lane == 0) thread_mbarrier_arrive(sm.k_empty(stage));
        float x[cfg::S_REGS];
        float alpha[2];
        bool rescale;
        if (j < n_masked) warp_softmax<true>(s, x, st, alpha, rescale, qs * ks, t * cfg::BN, p.kv_len, diag, lane);
        else warp_softmax<false>(s, x, st, alpha, rescale, qs * ks, t * cfg::BN, p.kv_len, diag, lane);
        wg_wait<0>();                                 // P_{j-1}·V_{j-1} done
        reg_fence(o);
        reg_fence(pf);
        if (!FIRST && lane == 0) thread_mbarrier_arrive(sm.v_empty(prev));
        if (rescale) thread_rescale_o(o, alpha);
        thread_pack_p(pf, x);
        ks = ks_next;
    }

    // The last P·V, in its turn too; consumer 1 opens no turn after it (nobody would wait).
    __device__ __forceinline__ void finish(const WsSmem& sm) {
        const int last = n_tiles - 1;
        thread_mbarrier_wait(sm.v_full(last % ws::STAGES), (last / ws::STAGES) & 1);
        wait_turn();
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_values(o, pf, sm.v_tile(last % ws::STAGES));
        wg_commit();
        if (cw == 0) give_turn();
        wg_wait<0>();
        reg_fence(o);
        reg_fence(pf);
    }
};

extern "C" __global__ void __launch_bounds__(ws::THREADS, 1)
fwd_wgmma_int8(const Int8FwdParams p, const __grid_constant__ Int8TmaMaps maps) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const WsSmem sm((cta_smem_addr(smem_raw) + 1023u) & ~1023u);
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * cfg::BM;
    const CtaTiles tiles = cta_tiles<cfg::BM, cfg::BN>(p, m0);

    if (tid == 0) sm.bars.init(ws::STAGES, ws::EMPTY_ARRIVALS);
    __syncthreads();

    if (wg == 0) {
        wg_setmaxnreg_dec<PRODUCER_REGS>();
        if (tid == 0 && tiles.n_tiles > 0) {
            thread_tma_prefetch_map(&maps.k);
            thread_tma_prefetch_map(&maps.v);
            thread_produce(p, maps, sm, m0, tiles.n_tiles);
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
        c.diag = p.causal ? row0 + p.kv_len - p.q_len + 1 : 0x3fffffff;
        c.q_wg = sm.q + (u32)(64 * c.cw * cfg::D);
#pragma unroll
        for (int e = 0; e < cfg::O_REGS; ++e) c.o[e] = 0.f;
        c.st.m[0] = c.st.m[1] = M_EMPTY;
        c.st.l[0] = c.st.l[1] = 0.f;
        if (c.n_tiles > 0) {
            c.qs = cta_q_scale(p, ctid);
            c.ks = cta_k_scale(p, c.n_tiles - 1);
            if (c.cw == 1) c.give_turn();         // consumer 0 issues first
            thread_mbarrier_wait(sm.q_full(), 0);
            c.step<true>(p, sm, 0);
            for (int j = 1; j < c.n_tiles; ++j) c.step<false>(p, sm, j);
            c.finish(sm);
        }
        // Epilogue: every consumer is past its last wgmma before O overwrites Q and K (the
        // producer loaded nothing the consumers did not wait for, so no TMA write is pending).
        cta_named_sync(ws::BAR_EPILOGUE, ws::CONSUMERS);
        thread_finish_rows(p, c.o, c.st, sm.q, local_row0, row0, c.lane);
        cta_named_sync(ws::BAR_EPILOGUE, ws::CONSUMERS);
        cta_store_o<cfg::BM, cfg::D, cfg::THREADS>(p, sm.q, m0, ctid);
    }
}
