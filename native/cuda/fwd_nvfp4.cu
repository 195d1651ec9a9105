// NVFP4 attention forward for consumer Blackwell (sm_120a): Q·Kᵀ on the block-scaled
// `mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64` (E2M1 x E2M1, one UE4M3
// scale per 16 elements of each operand, f32 accumulation; SASS OMMA.SF.16864), an f32 online
// softmax, and P·V either on f16/bf16 `mma.sync` m16n8k16 with V in its 16-bit type (PV_MODE 0)
// or on the same block-scaled MMA with P and V in NVFP4 along the keys (PV_MODE 1).
//
// Compiled and disassembled, not run on hardware: no sm_120 device was available. The index math
// (which lane holds which A/B/C element and which scale byte) is mirrored on the CPU by
// `quattn_native::nvfp4::lanes` and driven through the tile order of this kernel by the facade's
// `tests/nvfp4_mma_emulation.rs`.
//
// Inputs come from the NVFP4 prepass (`nvfp4_quant.cu`): Q and K codes `[rows, HEAD_DIM / 2]`
// and scales `[rows, HEAD_DIM / 16]`, rows in (batch, head, seq) order, one f32 tensor scale each
// (device pointers, read once). The logit is `acc · (ts_q · ts_k)` where acc is the MMA's
// block-scaled sum, exactly the quattn emulation's NVFP4 order; p = exp2(fma(s, c, -m c)) with
// c = softmax_scale · log2 e; LSE = m · softmax_scale + ln l.
// PV_MODE 1 V operand: Vᵀ codes `[batch, kv_heads, HEAD_DIM, kv_pad / 2]` with kv_pad = kv_len
// rounded up to BLOCK_K (zero codes past kv_len), scales `[batch, kv_heads, HEAD_DIM, kv_pad / 16]`
// (16-key blocks per channel), one tensor scale; P is quantized per 16 keys of a row with the
// fixed tensor scale 1/2688 (p <= 1 without the conditional rescale; the rescale is off there).
//
// CTA: 4 consumer warps of 16 query rows (BLOCK_Q 64) and one producer warp. The producer moves
// K codes and V rows with the bulk-copy engine (`cp.async.bulk`, one copy per row so smem rows
// can be padded against bank conflicts: no tensor map needed for rows that are contiguous in
// global memory) and K scales with plain loads, into a STAGES-deep ring guarded by full/empty
// mbarriers; consumers wait on `full`, release with one arrival per warp on `empty`.
//
// Defines: HEAD_DIM (64 | 128), BLOCK_K (64), STAGES (2..4), VDTYPE (0 f16, 1 bf16; PV_MODE 0),
// PV_MODE (0 | 1), RESCALE_LOG2 (0: the max moves on every increase, as the emulation; r > 0:
// it moves only once it grew by more than r in log2 units, FA4's conditional rescale),
// EXP2_POLY (0: MUFU.EX2 only; k: every k-th score of a lane through a cubic on the FMA pipes).
#include "common.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM120_ALL)
#error "fwd_nvfp4.cu compiles for sm_120a only (block-scaled mma.sync kind::mxf4nvf4)"
#endif

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef BLOCK_K
#define BLOCK_K 64
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef VDTYPE
#define VDTYPE 0
#endif
#ifndef PV_MODE
#define PV_MODE 0
#endif
#ifndef RESCALE_LOG2
#define RESCALE_LOG2 0
#endif
#ifndef EXP2_POLY
#define EXP2_POLY 0
#endif

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "HEAD_DIM must be 64 or 128 (whole 64-element k-steps)");
static_assert(BLOCK_K == 64, "BLOCK_K must be 64: one m16n8k64 k-step of keys for the FP4 P·V");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES must be 2..4");
static_assert(PV_MODE == 0 || RESCALE_LOG2 == 0, "FP4 P needs p <= 1: no conditional rescale");

namespace cfg {
constexpr int BLOCK_Q = 64;
constexpr int CONSUMER_WARPS = 4;
constexpr int THREADS = 32 * (CONSUMER_WARPS + 1);
constexpr int KSTEPS = HEAD_DIM / 64;            // m16n8k64 steps of Q·Kᵀ
constexpr int N_TILES = BLOCK_K / 8;             // 8-key n-tiles of S
constexpr int K_ROW = HEAD_DIM / 2;              // code bytes of one key
constexpr int K_ROW_SMEM = K_ROW + 16;           // padded: the 8 keys of a B fragment hit 8 bank groups
constexpr int K_SC = HEAD_DIM / 16;              // scale bytes of one key
#if PV_MODE == 0
constexpr int V_ROW = HEAD_DIM * 2;              // bytes of one 16-bit V row
constexpr int V_ROW_SMEM = V_ROW + 16;           // padded for ldmatrix.trans
constexpr int V_ROWS = BLOCK_K;
constexpr int V_SC_BYTES = 0;
#else
constexpr int V_ROW = BLOCK_K / 2;               // code bytes of one channel's 64 keys
constexpr int V_ROW_SMEM = V_ROW + 16;
constexpr int V_ROWS = HEAD_DIM;
constexpr int V_SC_BYTES = HEAD_DIM * (BLOCK_K / 16);
#endif
constexpr int K_BYTES = BLOCK_K * K_ROW_SMEM;
constexpr int KS_BYTES = BLOCK_K * K_SC;
constexpr int V_BYTES = V_ROWS * V_ROW_SMEM;
constexpr int STAGE_BYTES = K_BYTES + KS_BYTES + V_BYTES + V_SC_BYTES;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 2 * STAGES * 8;
static_assert(STAGE_BYTES % 16 == 0 && K_BYTES % 16 == 0 && KS_BYTES % 16 == 0 && V_BYTES % 16 == 0, "16-byte regions");
static_assert(SMEM_BYTES <= 99 * 1024, "sm_120 has 99 KB of shared memory per CTA");
}  // namespace cfg

struct Nvfp4FwdParams {
    u64 q_codes;
    u64 q_scales;
    u64 k_codes;
    u64 k_scales;
    u64 q_ts;         // f32
    u64 k_ts;         // f32
    u64 v;            // PV_MODE 0: 16-bit V with strides; 1: Vᵀ codes
    u64 v_scales;     // PV_MODE 1
    u64 v_ts;         // PV_MODE 1: f32
    u64 o;            // 16-bit O with strides (VDTYPE; f16 for PV_MODE 1)
    u64 lse;          // f32 [batch, q_heads, q_len] or 0
    i64 v_batch_stride;
    i64 v_head_stride;
    i64 v_seq_stride;
    i64 o_batch_stride;
    i64 o_head_stride;
    i64 o_seq_stride;
    int q_len;
    int kv_len;
    int q_heads;
    int kv_group;     // q_heads / kv_heads
    int causal;       // bottom-right aligned
    int kv_pad;       // PV_MODE 1: kv_len rounded up to BLOCK_K
    float scale_log2; // softmax_scale · log2 e
    float scale_nat;  // softmax_scale
};

// ---- the block-scaled MMA -------------------------------------------------------------------
// m16n8k64, E2M1 operands, lane = 4g + t:
//   A a0: row g, k 8t..8t+7  a1: row g+8, k 8t..  a2: row g, k 32+8t..  a3: row g+8, k 32+8t..
//   B b0: col g, k 8t..8t+7  b1: col g, k 32+8t..   (element k+i in nibble i: the codec packing)
//   C c0, c1: row g, cols 2t, 2t+1   c2, c3: row g+8
//   scale_vec::4X, selectors {byte 0, thread 0}: scale A of row g from lane 4g, of row g+8 from
//   lane 4g+1; scale B of col g from lane 4g; byte j of a scale register scales k 16j..16j+15.
__device__ __forceinline__ void warp_mma_nvfp4(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, u32 sa, u32 sb) {
    asm volatile(
        "mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue4m3 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sa), "r"(sb));
}

// ---- bulk copies ------------------------------------------------------------------------------
__device__ __forceinline__ void thread_bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// ---- exp2 -------------------------------------------------------------------------------------
// 2^x = 2^floor(x) · p(frac) with a cubic p fitted to 2^f on [0, 1) (p(0) = 1, p(1) = 2, relative
// error <= 1.1e-4, below half an f16 ulp of P), evaluated in three FMAs; the integer part goes
// into the exponent field. x < -126 gives 0 (masked scores are -inf).
__device__ __forceinline__ float thread_exp2_poly(float x) {
    if (x < -126.f) return 0.f;
    const float j = floorf(x);
    const float f = x - j;
    float p = fmaf(0.078228176f, f, 0.22626981f);
    p = fmaf(p, f, 0.695502f);
    p = fmaf(p, f, 1.f);
    return __int_as_float(__float_as_int(p) + ((int)j << 23));
}

__device__ __forceinline__ float thread_softmax_exp2(float x, int e) {
#if EXP2_POLY > 0
    if (e % EXP2_POLY == 0) return thread_exp2_poly(x);
#endif
    return thread_exp2(x);
}

#if PV_MODE == 1
// E2M1 code of x >= 0 (P is non-negative), round to nearest even, saturating: the codec's rule.
__device__ __forceinline__ u32 thread_e2m1_code_pos(float y) {
    // Grid 0, .5, 1, 1.5, 2, 3, 4, 6; ties to the even code.
    u32 c = (y > 0.25f) + (y >= 0.75f) + (y > 1.25f) + (y >= 1.75f) + (y > 2.5f) + (y >= 3.5f) + (y > 5.f);
    return c;
}
// UE4M3 code of a positive block scale target (RNE, saturating), via the e4m3x2 conversion.
__device__ __forceinline__ u32 thread_ue4m3_code(float x) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.f), "f"(x));
    return r & 0x7fu;
}
__device__ __forceinline__ float thread_ue4m3_value(u32 code) {
    const int ef = (int)(code >> 3);
    const u32 man = code & 7u;
    return ef == 0 ? (float)man * 0.001953125f : __int_as_float((ef + 120) << 23) * (1.f + 0.125f * (float)man);
}
#endif

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) fwd_nvfp4(const Nvfp4FwdParams p) {
    using namespace cfg;
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int q_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / p.kv_group;
    const int kv_heads = p.q_heads / p.kv_group;

    const u32 smem0 = cta_smem_addr(smem);
    const u32 bars = smem0 + STAGES * STAGE_BYTES;
    auto full = [&](int s) { return bars + 8u * s; };
    auto empty = [&](int s) { return bars + 8u * (STAGES + s); };
    auto k_smem = [&](int s) { return smem0 + s * STAGE_BYTES; };
    auto ks_smem = [&](int s) { return smem0 + s * STAGE_BYTES + K_BYTES; };
    auto v_smem = [&](int s) { return smem0 + s * STAGE_BYTES + K_BYTES + KS_BYTES; };

    // Keys this CTA's last row sees (bottom-right causal rule), hence its tile count.
    const int shift = p.kv_len - p.q_len;
    const int last_row = min(p.q_len, (q_block + 1) * BLOCK_Q) - 1;
    const int kv_end = p.causal ? max(0, min(p.kv_len, last_row + shift + 1)) : p.kv_len;
    const int n_tiles = (kv_end + BLOCK_K - 1) / BLOCK_K;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            thread_mbarrier_init(full(s), 1);
            thread_mbarrier_init(empty(s), CONSUMER_WARPS);
        }
        thread_fence_mbarrier_init();
    }
    __syncthreads();

    const i64 kv_row0 = ((i64)b * kv_heads + kvh) * p.kv_len;

    if (warp == CONSUMER_WARPS) {
        // ---- producer ----
        const unsigned char* kc = reinterpret_cast<const unsigned char*>(p.k_codes) + kv_row0 * K_ROW;
        const unsigned char* ks = reinterpret_cast<const unsigned char*>(p.k_scales) + kv_row0 * K_SC;
        for (int t = 0; t < n_tiles; ++t) {
            const int s = t % STAGES;
            thread_mbarrier_wait(empty(s), ((t / STAGES) & 1) ^ 1);
            const int key0 = t * BLOCK_K;
            const int nk = min(BLOCK_K, p.kv_len - key0);
            // K scales by plain loads (8 bytes a key is below the bulk-copy granule); zeros past
            // the end, so no NaN scale code (0x7F) reaches the MMA.
            for (int w = lane; w < KS_BYTES / 4; w += 32) {
                const int key = (4 * w) / K_SC;
                const u32 v = key < nk ? *reinterpret_cast<const u32*>(ks + (i64)key0 * K_SC + 4 * w) : 0u;
                asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(ks_smem(s) + 4 * w), "r"(v) : "memory");
            }
#if PV_MODE == 0
            // Rows of V past kv_len become zeros: P is 0 there, but stale smem could hold NaN.
            for (int i = lane; i < (BLOCK_K - nk) * (V_ROW / 16); i += 32) {
                const int r = nk + i / (V_ROW / 16), c = i % (V_ROW / 16);
                asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" :: "r"(v_smem(s) + r * V_ROW_SMEM + 16 * c), "r"(0) : "memory");
            }
            const u32 tx = nk * (K_ROW + V_ROW);
#else
            // Vᵀ scales (4 bytes a channel for the tile's four 16-key blocks) by plain loads.
            const i64 vt_row0 = ((i64)b * kv_heads + kvh) * HEAD_DIM;
            for (int r = lane; r < HEAD_DIM; r += 32) {
                const u32 sc = *reinterpret_cast<const u32*>(reinterpret_cast<const unsigned char*>(p.v_scales) +
                                                              (vt_row0 + r) * (p.kv_pad / 16) + key0 / 16);
                asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(v_smem(s) + V_BYTES + 4 * r), "r"(sc) : "memory");
            }
            const u32 tx = nk * K_ROW + HEAD_DIM * V_ROW;
#endif
            __syncwarp();
            if (lane == 0) thread_mbarrier_arrive_expect_tx(full(s), tx);
            __syncwarp();
            for (int r = lane; r < nk; r += 32) {
                thread_bulk_g2s(k_smem(s) + r * K_ROW_SMEM, kc + (i64)(key0 + r) * K_ROW, K_ROW, full(s));
#if PV_MODE == 0
                const unsigned short* vrow = reinterpret_cast<const unsigned short*>(p.v) + b * p.v_batch_stride +
                                             kvh * p.v_head_stride + (i64)(key0 + r) * p.v_seq_stride;
                thread_bulk_g2s(v_smem(s) + r * V_ROW_SMEM, vrow, V_ROW, full(s));
#endif
            }
#if PV_MODE == 1
            // Vᵀ: HEAD_DIM channel rows of BLOCK_K keys (zero-padded to kv_pad by the prepass).
            for (int r = lane; r < HEAD_DIM; r += 32) {
                const unsigned char* src = reinterpret_cast<const unsigned char*>(p.v) + (vt_row0 + r) * (p.kv_pad / 2) + key0 / 2;
                thread_bulk_g2s(v_smem(s) + r * V_ROW_SMEM, src, V_ROW, full(s));
            }
#endif
        }
        return;
    }

    // ---- consumers: warp `warp` owns query rows row0 + g and row0 + g + 8 ----
    const int g = lane >> 2, tq = lane & 3;
    const int row0 = q_block * BLOCK_Q + warp * 16;
    const int rows[2] = {row0 + g, row0 + g + 8};
    const i64 q_row_base = ((i64)b * p.q_heads + h) * p.q_len;

    // Q fragments for the whole tile loop: codes of rows g / g+8, and this lane's scale register
    // (lane 4g: row g, lane 4g+1: row g+8; the others are ignored by the MMA).
    u32 qa[KSTEPS][4], qs[KSTEPS];
    {
        const unsigned char* qc = reinterpret_cast<const unsigned char*>(p.q_codes);
        const unsigned char* qsc = reinterpret_cast<const unsigned char*>(p.q_scales);
        const int srow = rows[tq & 1];
#pragma unroll
        for (int c = 0; c < KSTEPS; ++c) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = rows[i & 1];
                qa[c][i] = r < p.q_len ? *reinterpret_cast<const u32*>(qc + (q_row_base + r) * K_ROW + 32 * c + 16 * (i >> 1) + 4 * tq) : 0u;
            }
            qs[c] = srow < p.q_len ? *reinterpret_cast<const u32*>(qsc + (q_row_base + srow) * K_SC + 4 * c) : 0u;
        }
    }
    const float ts_qk = *reinterpret_cast<const float*>(p.q_ts) * *reinterpret_cast<const float*>(p.k_ts);
    const float c_log2 = p.scale_log2;
    int visible[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) visible[r] = p.causal ? max(0, min(p.kv_len, rows[r] + shift + 1)) : p.kv_len;

    float m[2] = {QA_NEG_INF, QA_NEG_INF};
    float l[2] = {0.f, 0.f};  // this lane's partial row sums
    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#if PV_MODE == 1
    const float ts_pv = (1.f / 2688.f) * *reinterpret_cast<const float*>(p.v_ts);
#endif

    for (int t = 0; t < n_tiles; ++t) {
        const int s = t % STAGES;
        thread_mbarrier_wait(full(s), (t / STAGES) & 1);
        const int key0 = t * BLOCK_K;

        // ---- mainloop: S = Q·Kᵀ on the block-scaled MMA ----
        float sc[N_TILES][4];
#pragma unroll
        for (int j = 0; j < N_TILES; ++j) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
            const u32 krow = k_smem(s) + (8 * j + g) * K_ROW_SMEM + 4 * tq;
#pragma unroll
            for (int c = 0; c < KSTEPS; ++c) {
                u32 b0, b1, sb;
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(b0) : "r"(krow + 32 * c));
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(b1) : "r"(krow + 32 * c + 16));
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sb) : "r"(ks_smem(s) + (8 * j + g) * K_SC + 4 * c));
                warp_mma_nvfp4(sc[j], qa[c], b0, b1, qs[c], sb);
            }
        }

        // ---- softmax: scale, mask, row max, conditional rescale, exp2, row sums ----
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = QA_NEG_INF;
#pragma unroll
            for (int j = 0; j < N_TILES; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = key0 + 8 * j + 2 * tq + e;
                    float v = sc[j][2 * r + e] * ts_qk;
                    v = key < visible[r] ? v : QA_NEG_INF;
                    sc[j][2 * r + e] = v;
                    mx = fmaxf(mx, v);
                }
            mx = quad_max(mx);
            const float m_new = fmaxf(m[r], mx);
            float m_use = m_new;
#if RESCALE_LOG2 > 0
            // The max moves only once it grew by more than RESCALE_LOG2 (log2 units): P stays
            // below 2^RESCALE_LOG2 and O is rescaled far less often.
            if (m[r] != QA_NEG_INF && (m_new - m[r]) * c_log2 <= (float)RESCALE_LOG2) m_use = m[r];
#endif
            alpha[r] = (m_use == m[r]) ? 1.f : (m[r] == QA_NEG_INF ? 0.f : thread_exp2((m[r] - m_use) * c_log2));
            // A row with nothing visible yet keeps m = -inf and gets p = 0 (exp2(-inf)).
            const float mc = m_use == QA_NEG_INF ? 0.f : m_use * c_log2;
            m[r] = m_use;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < N_TILES; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float x = fmaf(sc[j][2 * r + e], c_log2, -mc);
                    const float pv = thread_softmax_exp2(x, 2 * j + e);
                    sc[j][2 * r + e] = pv;
                    sum += pv;
                }
            l[r] = l[r] * alpha[r] + sum;
        }
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                o[n][2] *= alpha[1];
                o[n][3] *= alpha[1];
            }
        }

        // ---- P·V ----
#if PV_MODE == 0
#pragma unroll
        for (int kk = 0; kk < BLOCK_K / 16; ++kk) {
            u32 pa[4];
#if VDTYPE == 0
            pa[0] = thread_pack_f16x2(sc[2 * kk][0], sc[2 * kk][1]);
            pa[1] = thread_pack_f16x2(sc[2 * kk][2], sc[2 * kk][3]);
            pa[2] = thread_pack_f16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[3] = thread_pack_f16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#else
            pa[0] = thread_pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]);
            pa[1] = thread_pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]);
            pa[2] = thread_pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[3] = thread_pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#endif
            // ldmatrix.x4.trans: matrices (keys +0..7 | +8..15) x (cols n0..n0+7 | n0+8..15).
            const int mi = lane >> 3;
            const u32 vaddr = v_smem(s) + (16 * kk + (mi & 1) * 8 + (lane & 7)) * V_ROW_SMEM + ((mi >> 1) * 8) * 2;
#pragma unroll
            for (int n2 = 0; n2 < HEAD_DIM / 16; ++n2) {
                u32 vb[4];
                warp_ldmatrix_x4_trans(vb, vaddr + n2 * 32);
#if VDTYPE == 0
                warp_mma_f16_f32acc(o[2 * n2], pa, vb[0], vb[1]);
                warp_mma_f16_f32acc(o[2 * n2 + 1], pa, vb[2], vb[3]);
#else
                warp_mma_bf16_f32acc(o[2 * n2], pa, vb[0], vb[1]);
                warp_mma_bf16_f32acc(o[2 * n2 + 1], pa, vb[2], vb[3]);
#endif
            }
        }
#else
        {
            // P to NVFP4 per 16 keys of a row: a 16-key block is n-tiles 2q, 2q+1, held by the
            // four lanes of the quad; its amax is two shuffles away.
            u32 pscale[2];  // this lane's row-g / row-g+8 scale register (bytes = 16-key blocks)
            u32 pbytes[2][N_TILES];  // per row, per n-tile: this lane's two codes in one byte
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                pscale[r] = 0;
#pragma unroll
                for (int q = 0; q < BLOCK_K / 16; ++q) {
                    float am = fmaxf(fmaxf(sc[2 * q][2 * r], sc[2 * q][2 * r + 1]), fmaxf(sc[2 * q + 1][2 * r], sc[2 * q + 1][2 * r + 1]));
                    am = quad_max(am);
                    const u32 code = thread_ue4m3_code(__fdiv_rn(__fdiv_rn(am, 6.f), 1.f / 2688.f));
                    const float denom = __fmul_rn(thread_ue4m3_value(code), 1.f / 2688.f);
                    pscale[r] |= code << (8 * q);
#pragma unroll
                    for (int jj = 0; jj < 2; ++jj) {
                        const int j = 2 * q + jj;
                        const u32 c0 = denom == 0.f ? 0u : thread_e2m1_code_pos(__fdiv_rn(sc[j][2 * r], denom));
                        const u32 c1 = denom == 0.f ? 0u : thread_e2m1_code_pos(__fdiv_rn(sc[j][2 * r + 1], denom));
                        pbytes[r][j] = c0 | (c1 << 4);
                    }
                }
            }
            // The A operand wants row g, keys 8t'..8t'+7 in lane t': byte t' of n-tile (4·half + t')
            // from each of the four lanes of the quad, a 4x4 byte transpose. In round k lane t
            // reads quad lane (t + k) & 3, which sends its byte for the reader, n-tile index
            // (sender's t - k) & 3 (register arrays are indexed by unrolled selects only).
            u32 pa[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = i & 1, half = i >> 1;
                u32 word = 0;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int want = (tq - k) & 3;
                    u32 send = 0;
#pragma unroll
                    for (int j = 0; j < 4; ++j) send = (j == want) ? pbytes[r][4 * half + j] : send;
                    const int src = (tq + k) & 3;
                    const u32 got = __shfl_sync(0xffffffffu, send, (lane & ~3) | src);
                    word |= got << (8 * src);
                }
                pa[i] = word;
            }
            const u32 sa = pscale[tq & 1];
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; ++n) {
                const u32 vrow = v_smem(s) + (8 * n + g) * V_ROW_SMEM + 4 * tq;
                u32 b0, b1, sb;
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(b0) : "r"(vrow));
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(b1) : "r"(vrow + 16));
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sb) : "r"(v_smem(s) + V_BYTES + 4 * (8 * n + g)));
                float tile[4] = {0.f, 0.f, 0.f, 0.f};
                warp_mma_nvfp4(tile, pa, b0, b1, sa, sb);
#pragma unroll
                // acc·alpha + tile·(ts_p·ts_v), two roundings: the emulation's order.
                for (int e = 0; e < 4; ++e) o[n][e] = __fadd_rn(o[n][e], __fmul_rn(tile[e], ts_pv));
            }
        }
#endif
        __syncwarp();
        if (lane == 0) thread_mbarrier_arrive(empty(s));
    }

    // ---- epilogue: O = acc / l, LSE = m · scale + ln l ----
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lr = quad_sum(l[r]);
        const int row = rows[r];
        if (row >= p.q_len) continue;
        const bool empty_row = lr == 0.f || lr != lr;
        const float inv = empty_row ? 0.f : 1.f / lr;
        unsigned short* orow = reinterpret_cast<unsigned short*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + (i64)row * p.o_seq_stride;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n) {
#if PV_MODE == 0 && VDTYPE == 1
            const u32 packed = thread_pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
#else
            const u32 packed = thread_pack_f16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
#endif
            *reinterpret_cast<u32*>(orow + 8 * n + 2 * tq) = packed;
        }
        if (p.lse != 0 && tq == 0) {
            reinterpret_cast<float*>(p.lse)[q_row_base + row] =
                empty_row ? QA_NEG_INF : m[r] * p.scale_nat + thread_log2(lr) * 0.69314718055994531f;
        }
    }
}
