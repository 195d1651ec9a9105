// Flash-attention forward on AMD MFMA (CDNA3 gfx942, CDNA4 gfx950), f16 or bf16 Q/K/V/O, f32
// accumulation, online softmax in f32. Compiled and disassembly-checked; not run on hardware.
//
// Layout. One workgroup = WAVES waves = BM = 32 * WAVES query rows of one (batch, head); wave w
// owns rows [32 w, 32 w + 32). Scores are computed transposed, Sᵀ = K · Qᵀ, so that in the
// accumulator layout (common.h) each lane holds one query (column c) and 16 of its keys per
// 32-key tile; the other 16 sit in lane ^ 32. Every per-query quantity (max, sum, causal limit,
// LSE, the O rescale) is then per lane, with one cross-group exchange per reduction.
//   * Qᵀ is the B operand of Q·Kᵀ: lane (g, c) holds Q[row c][g * KPL + i], one contiguous run
//     of KPL elements per MFMA, loaded once into registers (QK_STEPS * KPL / 2 VGPRs).
//   * K tiles (the A operand: K[key c][g * KPL + i]) are staged row-major in LDS.
//   * Oᵀ = Vᵀ · Pᵀ accumulates in DT = D / 32 accumulator tiles (16 f32 per lane each), so
//     the O rescale is one multiply per register. Pᵀ is the B operand: its k index g * KPL + i
//     is, in the lane's Sᵀ registers, key mfma_c_row(g, ps * KPL + i) of the 32-key tile, which
//     the A operand (Vᵀ, staged transposed in LDS) reads at the same key, so the reduction over
//     keys pairs the right terms without moving P between lanes.
// Causal masks are bottom-right aligned; rows past q_len compute on zeros and are not written;
// keys past kv_len are masked in the last tile. A row that sees no key writes O = 0 and
// LSE = -inf.
//
// Compile-time parameters (-D, built by native/src/hip/config.rs from one table):
//   HEAD_DIM 64 | 128, WAVES (waves per workgroup), BLOCK_N (keys per tile, multiple of 32),
//   MFMA_K (8: v_mfma_f32_32x32x8_{f16,bf16} on gfx942; 16: v_mfma_f32_32x32x16_{f16,bf16} on
//   gfx950), IN_BF16 0 | 1.
// ABI: `FwdParams` in common.h; grid (ceil(q_len / BM), q_heads, batch), block 64 * WAVES.
#include "common.h"

#if PV_MFMA_K != MFMA_K
#error "fwd_mfma.hip uses one MFMA for Q·Kᵀ and P·V"
#endif

#ifndef IN_BF16
#error "fwd_mfma.hip needs IN_BF16"
#endif

#define KPL (MFMA_K / 2)
#if IN_BF16
typedef __bf16 elem_t;
#else
typedef _Float16 elem_t;
#endif
typedef elem_t opnd_t __attribute__((ext_vector_type(KPL)));
typedef elem_t elem4_t __attribute__((ext_vector_type(4)));

namespace lds {
// 16 bytes of padding per row move consecutive rows to other banks for the per-lane row reads.
constexpr int K_ROW = cfg::D + 8;
constexpr int VT_ROW = cfg::BN + 8;
constexpr int K_ELEMS = cfg::BN * K_ROW;
constexpr int VT_ELEMS = cfg::D * VT_ROW;
constexpr int BYTES = (K_ELEMS + VT_ELEMS) * 2;
}  // namespace lds

// One MFMA of the family on this target.
__device__ inline f32x16 wave_mfma(opnd_t a, opnd_t b, f32x16 c) {
#if defined(__gfx950__)
    static_assert(MFMA_K == 16, "gfx950 builds use the 32x32x16 16-bit MFMAs");
#if IN_BF16
    return __builtin_amdgcn_mfma_f32_32x32x16_bf16(a, b, c, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_f32_32x32x16_f16(a, b, c, 0, 0, 0);
#endif
#else
    static_assert(MFMA_K == 8, "gfx942 builds use the 32x32x8 16-bit MFMAs");
#if IN_BF16
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), c, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, 0, 0, 0);
#endif
#endif
}

// K tile [BN][D] row-major and V tile transposed [D][BN] into LDS, keys past kv_len as zeros.
// Each thread moves 16-byte pieces (8 elements of one key); strides are multiples of 8.
__device__ inline void cta_load_kv(elem_t* ks, elem_t* vt, const elem_t* k, const elem_t* v, i64 k_seq, i64 v_seq,
                                   int n0, int kv_len) {
    constexpr int CHUNKS = cfg::D / 8;
    for (int i = thread_id(); i < cfg::BN * CHUNKS; i += cfg::THREADS) {
        const int key = i / CHUNKS, d0 = (i % CHUNKS) * 8;
        u32x4 kx = {0, 0, 0, 0}, vx = {0, 0, 0, 0};
        if (n0 + key < kv_len) {
            kx = *reinterpret_cast<const u32x4*>(k + (i64)(n0 + key) * k_seq + d0);
            vx = *reinterpret_cast<const u32x4*>(v + (i64)(n0 + key) * v_seq + d0);
        }
        *reinterpret_cast<u32x4*>(ks + key * lds::K_ROW + d0) = kx;
        const elem_t* ve = reinterpret_cast<const elem_t*>(&vx);
#pragma unroll
        for (int e = 0; e < 8; ++e) vt[(d0 + e) * lds::VT_ROW + key] = ve[e];
    }
}

extern "C" __global__ QA_LAUNCH_BOUNDS(cfg::THREADS) void fwd_mfma(FwdParams p) {
    __shared__ __attribute__((aligned(16))) elem_t smem[lds::K_ELEMS + lds::VT_ELEMS];
    elem_t* ks = smem;
    elem_t* vt = smem + lds::K_ELEMS;

    const int lane = lane_id();
    const int wave = thread_id() >> 6;
    const int g = lane >> 5, c = lane & 31;
    // Causal workgroups near the end of the sequence do the most work: launch them first.
    const int m_block = __builtin_amdgcn_grid_size_x() / cfg::THREADS - 1 - __builtin_amdgcn_workgroup_id_x();
    const int head = __builtin_amdgcn_workgroup_id_y();
    const int batch = __builtin_amdgcn_workgroup_id_z();
    const int kv_head = head / p.kv_group;
    const int m0 = m_block * cfg::BM;
    const int row = m0 + 32 * wave + c;          // this lane's query
    const int offset = p.kv_len - p.q_len;       // bottom-right causal alignment
    const int diag = p.causal ? row + offset + 1 : 0x3fffffff;
    int n_end = p.kv_len;
    if (p.causal) n_end = n_end < m0 + cfg::BM + offset ? n_end : m0 + cfg::BM + offset;

    const elem_t* q = reinterpret_cast<const elem_t*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1];
    const elem_t* k = reinterpret_cast<const elem_t*>(p.k) + batch * p.k_stride[0] + kv_head * p.k_stride[1];
    const elem_t* v = reinterpret_cast<const elem_t*>(p.v) + batch * p.v_stride[0] + kv_head * p.v_stride[1];

    // Qᵀ fragments (B operand): Q[row][ks * MFMA_K + g * KPL + i].
    opnd_t qf[cfg::QK_STEPS];
#pragma unroll
    for (int s = 0; s < cfg::QK_STEPS; ++s) {
        qf[s] = opnd_t{};
        if (row < p.q_len) qf[s] = *reinterpret_cast<const opnd_t*>(q + (i64)row * p.q_stride[2] + s * MFMA_K + g * KPL);
    }

    f32x16 o[cfg::DT];
#pragma unroll
    for (int dt = 0; dt < cfg::DT; ++dt) o[dt] = f32x16{};
    float m = QA_NEG_INF, l = 0.f;
    const float c_log2 = p.scale * QA_LOG2E;

    for (int n0 = 0; n0 < n_end; n0 += cfg::BN) {
        cta_sync();  // every wave is done reading the previous tile
        cta_load_kv(ks, vt, k, v, p.k_stride[2], p.v_stride[2], n0, p.kv_len);
        cta_sync();

        // ---- mainloop, Q·Kᵀ: Sᵀ[key][query] over the head dim ----
        f32x16 s[cfg::NT];
#pragma unroll
        for (int t = 0; t < cfg::NT; ++t) {
            s[t] = f32x16{};
#pragma unroll
            for (int st = 0; st < cfg::QK_STEPS; ++st) {
                const opnd_t a = *reinterpret_cast<const opnd_t*>(ks + (32 * t + c) * lds::K_ROW + st * MFMA_K + g * KPL);
                s[t] = wave_mfma(a, qf[st], s[t]);
            }
        }

        // ---- softmax ----
        thread_mask(s, n0, g, p.kv_len, diag);
        const float alpha = thread_online_softmax(s, m, l, c_log2, 0.f);
#pragma unroll
        for (int dt = 0; dt < cfg::DT; ++dt) o[dt] *= alpha;

        // ---- mainloop, P·V: Oᵀ[dim][query] += Vᵀ[dim][key] Pᵀ[key][query] ----
#pragma unroll
        for (int ps = 0; ps < cfg::PV_STEPS; ++ps) {
            opnd_t b;
#pragma unroll
            for (int i = 0; i < KPL; ++i) {
                const int j = ps * KPL + i;
                b[i] = (elem_t)s[j / 16][j % 16];
            }
#pragma unroll
            for (int dt = 0; dt < cfg::DT; ++dt) {
                // Slot j holds key 32 (j / 16) + mfma_c_row(g, j % 16): runs of 4 keys.
                opnd_t a;
#pragma unroll
                for (int run = 0; run < KPL / 4; ++run) {
                    const int j = ps * KPL + 4 * run;
                    const elem4_t x = *reinterpret_cast<const elem4_t*>(vt + (32 * dt + c) * lds::VT_ROW + 32 * (j / 16) + mfma_c_row(g, j % 16));
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[4 * run + e] = x[e];
                }
                o[dt] = wave_mfma(a, b, o[dt]);
            }
        }
    }

    // ---- epilogue: O = acc / l, LSE = m·scale + ln l ----
    const float l_all = l + wave_swap_groups(l);
    const bool empty = !(l_all > 0.f);   // no visible key, or a NaN sum
    const float inv = empty ? 0.f : 1.f / l_all;
    if (row >= p.q_len) return;
    elem_t* out = reinterpret_cast<elem_t*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1] + (i64)row * p.o_stride[2];
#pragma unroll
    for (int dt = 0; dt < cfg::DT; ++dt)
#pragma unroll
        for (int r = 0; r < 16; r += 4) {
            elem4_t x;
#pragma unroll
            for (int e = 0; e < 4; ++e) x[e] = (elem_t)(o[dt][r + e] * inv);
            *reinterpret_cast<elem4_t*>(out + 32 * dt + mfma_c_row(g, r)) = x;
        }
    if (p.lse != nullptr && g == 0)
        p.lse[((i64)batch * p.q_heads + head) * p.q_len + row] = empty ? QA_NEG_INF : (m * c_log2 + thread_log2(l_all)) * QA_LN2;
}
