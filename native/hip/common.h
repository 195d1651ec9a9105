// Shared pieces of the HIP attention families (fwd_mfma.hip, fwd_mfma_fp8.hip): the language
// macros when compiled by plain clang (hipRTC supplies its own), vector types, work-item and
// barrier helpers, the MFMA lane layout and the online-softmax helpers.
//
// MFMA lane layout of v_mfma_f32_32x32x{K}_* (one wave of 64 lanes; g = lane / 32 is the lane
// group, c = lane % 32). The host mirror is native/src/hip/layout.rs (`MfmaShape`), which also
// supplies MFMA_K to the kernels so both read one table:
//   A (M x K, row-major):  lane holds A[c][g * KPL + i]          for i < KPL = K / 2
//   B (K x N):             lane holds B[g * KPL + i][c]          for i < KPL
//   C/D (M x N, 16 f32):   lane holds C[mfma_c_row(g, r)][c]     for r < 16
// with mfma_c_row(g, r) = 8 * (r / 4) + 4 * g + r % 4.
#pragma once

#if !defined(__HIPCC_RTC__)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#endif
#define QA_LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))

#if !defined(MFMA_K) || !defined(HEAD_DIM) || !defined(WAVES) || !defined(BLOCK_N)
#error "the HIP attention kernels need MFMA_K, HEAD_DIM, WAVES and BLOCK_N"
#endif
// P·V may use another MFMA than Q·Kᵀ (the FP8 family's f16 P·V on gfx942: 32x32x8).
#ifndef PV_MFMA_K
#define PV_MFMA_K MFMA_K
#endif
#if !defined(__gfx950__) && !defined(__gfx942__)
#error "the HIP attention kernels target gfx950 and gfx942"
#endif

typedef long long i64;
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x8 __attribute__((ext_vector_type(8)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef unsigned int u32x2 __attribute__((ext_vector_type(2)));
typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));

#define QA_NEG_INF (-__builtin_inff())
#define QA_LOG2E 1.4426950408889634f
#define QA_LN2 0.6931471805599453f

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int WAVE = 64;
constexpr int THREADS = WAVES * WAVE;
constexpr int BM = 32 * WAVES;       // each wave owns 32 query rows (one MFMA N dimension)
constexpr int BN = BLOCK_N;          // keys per KV tile
constexpr int NT = BN / 32;          // 32-key Sᵀ tiles per KV tile
constexpr int DT = D / 32;           // 32-dim Oᵀ tiles
constexpr int KPL = MFMA_K / 2;      // operand elements per lane per Q·Kᵀ MFMA
constexpr int PV_KPL = PV_MFMA_K / 2;// operand elements per lane per P·V MFMA
constexpr int QK_STEPS = D / MFMA_K; // MFMAs per 32x32 Sᵀ tile
// P·V MFMAs per (KV tile, 32-dim Oᵀ tile). Step ps reads Pᵀ slots j = ps * PV_KPL + i of the
// lane's Sᵀ registers flattened over the tile's 32-key tiles (tile j / 16, register j % 16).
constexpr int PV_STEPS = BN / PV_MFMA_K;
static_assert(D == 64 || D == 128, "head dims 64 and 128");
static_assert(BN % 32 == 0 && BN >= 32, "KV tiles are whole 32-key Sᵀ tiles");
static_assert(MFMA_K == 8 || MFMA_K == 16 || MFMA_K == 64, "32x32x8, 32x32x16 or 32x32x64 MFMAs");
static_assert(PV_MFMA_K == 8 || PV_MFMA_K == 16 || PV_MFMA_K == 64, "32x32x8, 32x32x16 or 32x32x64 MFMAs");
static_assert(BN % PV_MFMA_K == 0 && D % MFMA_K == 0, "whole MFMAs per tile");
}  // namespace cfg

__device__ inline int thread_id() { return __builtin_amdgcn_workitem_id_x(); }
__device__ inline int lane_id() { return thread_id() & 63; }

// Workgroup barrier with LDS visibility both ways (HIP's __syncthreads).
__device__ inline void cta_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// Row of the 32x32 C/D tile held by register r of a lane of group g (layout above).
__device__ inline constexpr int mfma_c_row(int g, int r) { return 8 * (r >> 2) + 4 * g + (r & 3); }

// The value of lane ^ 32 (the other lane group, same column c): Sᵀ columns are split between
// the two groups, so per-query reductions finish with one exchange.
__device__ inline float wave_swap_groups(float x) {
    const int src = (lane_id() ^ 32) << 2;
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src, __builtin_bit_cast(int, x)));
}

__device__ inline float thread_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
__device__ inline float thread_log2(float x) { return __builtin_amdgcn_logf(x); }

// Online softmax of one lane's query over one KV tile of Sᵀ (s[t][r]: key mfma_c_row(g, r) of
// 32-key tile t, already masked to -inf). Scores are raw (c = scale·log2e·descales > 0 turns them
// into log2 units, so the max commutes with it). Updates m (raw units) and l (this lane
// group's partial sum of the unrounded p), writes p in place, returns alpha for O.
// A query that has seen no key keeps m = -inf: m_use = 0 then makes p = exp2(-inf) = 0 and
// alpha = 1 · (O = 0, l = 0), never NaN.
__device__ inline float thread_online_softmax(f32x16 (&s)[cfg::NT], float& m, float& l, float c, float p_log2) {
    float mx = m;
#pragma unroll
    for (int t = 0; t < cfg::NT; ++t)
#pragma unroll
        for (int r = 0; r < 16; ++r) mx = __builtin_fmaxf(mx, s[t][r]);
    mx = __builtin_fmaxf(mx, wave_swap_groups(mx));
    const float m_use = mx == QA_NEG_INF ? 0.f : mx;
    const float alpha = m == QA_NEG_INF ? (mx == QA_NEG_INF ? 1.f : 0.f) : thread_exp2((m - m_use) * c);
    // p_log2 shifts P into the P format's range (log2 of 448 or 240 for FP8 P, 0 otherwise).
    const float bias = p_log2 - m_use * c;
    float sum = 0.f;
#pragma unroll
    for (int t = 0; t < cfg::NT; ++t)
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            const float p = thread_exp2(__builtin_fmaf(s[t][r], c, bias));
            s[t][r] = p;
            sum += p;
        }
    l = l * alpha + sum;
    m = mx;
    return alpha;
}

// Keys [n0, n0 + BN) of a KV tile for one query row: -inf past the sequence end and, causal,
// past the row's last visible key `diag - 1` (bottom-right alignment).
__device__ inline void thread_mask(f32x16 (&s)[cfg::NT], int n0, int g, int kv_len, int diag) {
    const int limit = diag < kv_len ? diag : kv_len;
    if (n0 + cfg::BN <= limit) return;
#pragma unroll
    for (int t = 0; t < cfg::NT; ++t)
#pragma unroll
        for (int r = 0; r < 16; ++r)
            if (n0 + 32 * t + mfma_c_row(g, r) >= limit) s[t][r] = QA_NEG_INF;
}

// Launch ABI shared by both families; Rust mirror `HipFwdParams` in native/src/hip/config.rs.
struct FwdParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;                // [batch, q_heads, q_len]; null: not written
    const float* q_descale;    // FP8 only: [1] or [batch * q_heads]
    const float* k_descale;    // FP8 only: [1] or [batch * kv_heads]
    const float* v_descale;
    i64 q_stride[3];           // batch, head, seq (elements)
    i64 k_stride[3];
    i64 v_stride[3];
    i64 o_stride[3];
    int q_len;
    int kv_len;
    int q_heads;
    int kv_group;              // q_heads / kv_heads
    float scale;               // softmax scale (> 0)
    int causal;                // bottom-right aligned
    int descale_per_head;      // FP8 only
    int pad_;
};
