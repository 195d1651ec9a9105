// FP8 flash-attention forward on AMD MFMA (CDNA3 gfx942, CDNA4 gfx950): e4m3 Q/K/V codes with
// f32 descales (per tensor or per head), f32 accumulation, online softmax in f32, O in f16 or
// bf16. Compiled and disassembly-checked; not run on hardware.
//
// The FP8 encoding is the target's: OCP e4m3fn (max 448) on gfx950, e4m3fnuz (max 240, bias 8,
// no -0) on gfx942; the host quantizes to the one the device's MFMA reads.
//
// Same layout as fwd_mfma.hip (read its header): Sᵀ = K·Qᵀ so that a lane holds one query,
// Oᵀ = Vᵀ·Pᵀ with Pᵀ taken from the lane's own Sᵀ registers and Vᵀ staged transposed in LDS.
// Q·Kᵀ: v_mfma_f32_32x32x16_fp8_fp8 on both targets (8 codes = 64 bits per lane and operand),
// or (MFMA_K 64, gfx950 only) v_mfma_scale_f32_32x32x64_f8f6f4 with unit scales (E8M0 127):
// 32 codes per lane and operand, a quarter of the MFMAs at twice the issue cycles of the
// 32x32x16 form per the CDNA4 ISA guide, so half the matrix-core time.
// P·V, by P_FP8:
//   1 (the seed's option B): P quantized to the device's e4m3 as e4m3(P_MAX · p), p ≤ 1 relative
//     to the running max, which moves whenever it grows (v_cvt_pk_fp8_f32, round to nearest
//     even), against V's codes on the same fp8 MFMA. The factor P_MAX cancels in O = acc / l
//     because l sums the unrounded P_MAX · p; the LSE subtracts log2(P_MAX).
//   0 (option A): P rounded to f16, V's codes decoded exactly to f16 as they are staged (every
//     e4m3 value is an f16), on the f16 MFMA (32x32x16 on gfx950, 32x32x8 on gfx942).
// Scores: s = Σ q·k of the codes (exact products, f32 sums); c = scale · log2e · q_descale ·
// k_descale; O = acc / l · v_descale.
//
// Compile-time parameters (-D, from native/src/hip/config.rs): HEAD_DIM 64 | 128, WAVES,
// BLOCK_N, MFMA_K 16 | 64 (gfx950), PV_MFMA_K (8 or 16 for f16 P; 16 or 64 (gfx950) for FP8 P),
// P_FP8 0 | 1, OUT_BF16 0 | 1.
// ABI: `FwdParams` in common.h; grid (ceil(q_len / BM), q_heads, batch), block 64 * WAVES.
#include "common.h"

#if !defined(P_FP8) || !defined(OUT_BF16)
#error "fwd_mfma_fp8.hip needs P_FP8 and OUT_BF16"
#endif
#if defined(__gfx950__)
static_assert(MFMA_K == 16 || MFMA_K == 64, "Q·Kᵀ on 32x32x16_fp8_fp8 or 32x32x64_f8f6f4");
#else
static_assert(MFMA_K == 16, "Q·Kᵀ on 32x32x16_fp8_fp8 (gfx942 has no f8f6f4 MFMA)");
#endif
#if P_FP8
static_assert(PV_MFMA_K == MFMA_K, "FP8 P·V uses the Q·Kᵀ MFMA");
#elif defined(__gfx950__)
static_assert(PV_MFMA_K == 16, "f16 P·V on gfx950: v_mfma_f32_32x32x16_f16");
#else
static_assert(PV_MFMA_K == 8, "f16 P·V on gfx942: v_mfma_f32_32x32x8_f16");
#endif

#if defined(__gfx950__)
#define P_MAX 448.f      // OCP e4m3fn
#else
#define P_MAX 240.f      // e4m3fnuz
#endif
#if OUT_BF16
typedef __bf16 out_t;
#else
typedef _Float16 out_t;
#endif
typedef out_t out4_t __attribute__((ext_vector_type(4)));
typedef int i32x8 __attribute__((ext_vector_type(8)));
#if MFMA_K == 64
typedef i32x8 qk_opnd_t;         // 32 codes
#else
typedef long qk_opnd_t;          // 8 codes
#endif
#if P_FP8
typedef unsigned char vt_t;      // V's codes
typedef qk_opnd_t pv_opnd_t;
typedef unsigned pv_words_t __attribute__((ext_vector_type(cfg::PV_KPL / 4)));
#define VT_PAD 16
#else
typedef _Float16 vt_t;           // V decoded
typedef _Float16 pv_opnd_t __attribute__((ext_vector_type(PV_MFMA_K / 2)));
#define VT_PAD 8
#endif

namespace lds {
constexpr int K_ROW = cfg::D + 16;          // bytes; padding as in fwd_mfma.hip
constexpr int VT_ROW = cfg::BN + VT_PAD;    // elements of vt_t
constexpr int K_BYTES = cfg::BN * K_ROW;
constexpr int VT_ELEMS = cfg::D * VT_ROW;
}  // namespace lds

__device__ inline f32x16 wave_mfma_fp8(qk_opnd_t a, qk_opnd_t b, f32x16 c) {
#if MFMA_K == 64
    // A and B formats 0 (fp8 e4m3), scales 127 (E8M0 2^0).
    return __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(a, b, c, 0, 0, 0, 127, 0, 127);
#else
    return __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(a, b, c, 0, 0, 0);
#endif
}

#if !P_FP8
__device__ inline f32x16 wave_mfma_pv(pv_opnd_t a, pv_opnd_t b, f32x16 c) {
#if defined(__gfx950__)
    return __builtin_amdgcn_mfma_f32_32x32x16_f16(a, b, c, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, 0, 0, 0);
#endif
}
#endif

// Four f32 to four codes of the device's e4m3 (round to nearest even), byte i from x[i].
__device__ inline unsigned thread_pack_fp8x4(float x0, float x1, float x2, float x3) {
    const int lo = __builtin_amdgcn_cvt_pk_fp8_f32(x0, x1, 0, false);
    return (unsigned)__builtin_amdgcn_cvt_pk_fp8_f32(x2, x3, lo, true);
}

// The 4 codes of a word decoded (exactly) to f16.
__device__ inline f16x4 thread_decode_fp8x4(unsigned w) {
    const int x = (int)w;
    return f16x4{(_Float16)__builtin_amdgcn_cvt_f32_fp8(x, 0), (_Float16)__builtin_amdgcn_cvt_f32_fp8(x, 1),
                 (_Float16)__builtin_amdgcn_cvt_f32_fp8(x, 2), (_Float16)__builtin_amdgcn_cvt_f32_fp8(x, 3)};
}

// K codes [BN][D] row-major and V transposed [D][BN] (codes, or f16 values with P_FP8 0) into
// LDS, keys past kv_len as zeros; 16-byte pieces (strides are multiples of 16 codes).
__device__ inline void cta_load_kv(unsigned char* ks, vt_t* vt, const unsigned char* k, const unsigned char* v, i64 k_seq,
                                   i64 v_seq, int n0, int kv_len) {
    constexpr int CHUNKS = cfg::D / 16;
    for (int i = thread_id(); i < cfg::BN * CHUNKS; i += cfg::THREADS) {
        const int key = i / CHUNKS, d0 = (i % CHUNKS) * 16;
        u32x4 kx = {0, 0, 0, 0}, vx = {0, 0, 0, 0};
        if (n0 + key < kv_len) {
            kx = *reinterpret_cast<const u32x4*>(k + (i64)(n0 + key) * k_seq + d0);
            vx = *reinterpret_cast<const u32x4*>(v + (i64)(n0 + key) * v_seq + d0);
        }
        *reinterpret_cast<u32x4*>(ks + key * lds::K_ROW + d0) = kx;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#if P_FP8
#pragma unroll
            for (int e = 0; e < 4; ++e) vt[(d0 + 4 * w + e) * lds::VT_ROW + key] = (unsigned char)(vx[w] >> (8 * e));
#else
            const f16x4 x = thread_decode_fp8x4(vx[w]);
#pragma unroll
            for (int e = 0; e < 4; ++e) vt[(d0 + 4 * w + e) * lds::VT_ROW + key] = x[e];
#endif
        }
    }
}

extern "C" __global__ QA_LAUNCH_BOUNDS(cfg::THREADS) void fwd_mfma_fp8(FwdParams p) {
    __shared__ __attribute__((aligned(16))) unsigned char ks[lds::K_BYTES];
    __shared__ __attribute__((aligned(16))) vt_t vt[lds::VT_ELEMS];

    const int lane = lane_id();
    const int wave = thread_id() >> 6;
    const int g = lane >> 5, c = lane & 31;
    const int m_block = __builtin_amdgcn_grid_size_x() / cfg::THREADS - 1 - __builtin_amdgcn_workgroup_id_x();
    const int head = __builtin_amdgcn_workgroup_id_y();
    const int batch = __builtin_amdgcn_workgroup_id_z();
    const int kv_head = head / p.kv_group;
    const int m0 = m_block * cfg::BM;
    const int row = m0 + 32 * wave + c;
    const int offset = p.kv_len - p.q_len;
    const int diag = p.causal ? row + offset + 1 : 0x3fffffff;
    int n_end = p.kv_len;
    if (p.causal) n_end = n_end < m0 + cfg::BM + offset ? n_end : m0 + cfg::BM + offset;

    const int kv_heads = p.q_heads / p.kv_group;
    const int qd = p.descale_per_head ? batch * p.q_heads + head : 0;
    const int kd = p.descale_per_head ? batch * kv_heads + kv_head : 0;
    const float c_log2 = p.scale * QA_LOG2E * (p.q_descale[qd] * p.k_descale[kd]);
    const float v_descale = p.v_descale[kd];

    const unsigned char* q = reinterpret_cast<const unsigned char*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1];
    const unsigned char* k = reinterpret_cast<const unsigned char*>(p.k) + batch * p.k_stride[0] + kv_head * p.k_stride[1];
    const unsigned char* v = reinterpret_cast<const unsigned char*>(p.v) + batch * p.v_stride[0] + kv_head * p.v_stride[1];

    // Qᵀ fragments: KPL codes Q[row][s * MFMA_K + g * KPL + i] per MFMA.
    qk_opnd_t qf[cfg::QK_STEPS];
#pragma unroll
    for (int s = 0; s < cfg::QK_STEPS; ++s) {
        qf[s] = qk_opnd_t{};
        if (row < p.q_len) qf[s] = *reinterpret_cast<const qk_opnd_t*>(q + (i64)row * p.q_stride[2] + s * MFMA_K + g * cfg::KPL);
    }

    f32x16 o[cfg::DT];
#pragma unroll
    for (int dt = 0; dt < cfg::DT; ++dt) o[dt] = f32x16{};
    float m = QA_NEG_INF, l = 0.f;
    const float p_log2 = P_FP8 ? __builtin_log2f(P_MAX) : 0.f;

    for (int n0 = 0; n0 < n_end; n0 += cfg::BN) {
        cta_sync();
        cta_load_kv(ks, vt, k, v, p.k_stride[2], p.v_stride[2], n0, p.kv_len);
        cta_sync();

        // ---- mainloop, Q·Kᵀ on fp8 codes ----
        f32x16 s[cfg::NT];
#pragma unroll
        for (int t = 0; t < cfg::NT; ++t) {
            s[t] = f32x16{};
#pragma unroll
            for (int st = 0; st < cfg::QK_STEPS; ++st) {
                const qk_opnd_t a = *reinterpret_cast<const qk_opnd_t*>(ks + (32 * t + c) * lds::K_ROW + st * MFMA_K + g * cfg::KPL);
                s[t] = wave_mfma_fp8(a, qf[st], s[t]);
            }
        }

        // ---- softmax (P scaled by P_MAX for FP8 P) ----
        thread_mask(s, n0, g, p.kv_len, diag);
        const float alpha = thread_online_softmax(s, m, l, c_log2, p_log2);
#pragma unroll
        for (int dt = 0; dt < cfg::DT; ++dt) o[dt] *= alpha;

        // ---- mainloop, P·V ----
        // Slot j = ps * PV_KPL + i of a step is register j % 16 of Sᵀ tile j / 16, i.e. key
        // 32 (j / 16) + mfma_c_row(g, j % 16); Vᵀ is read at the same keys, in runs of 4.
#pragma unroll
        for (int ps = 0; ps < cfg::PV_STEPS; ++ps) {
#if P_FP8
            pv_words_t bw;
#pragma unroll
            for (int w = 0; w < cfg::PV_KPL / 4; ++w) {
                const int j = ps * cfg::PV_KPL + 4 * w;
                const f32x16& st = s[j / 16];
                bw[w] = thread_pack_fp8x4(st[j % 16], st[j % 16 + 1], st[j % 16 + 2], st[j % 16 + 3]);
            }
            const pv_opnd_t b = __builtin_bit_cast(pv_opnd_t, bw);
#else
            pv_opnd_t b;
#pragma unroll
            for (int i = 0; i < cfg::PV_KPL; ++i) {
                const int j = ps * cfg::PV_KPL + i;
                b[i] = (_Float16)s[j / 16][j % 16];
            }
#endif
#pragma unroll
            for (int dt = 0; dt < cfg::DT; ++dt) {
                const vt_t* vrow = vt + (32 * dt + c) * lds::VT_ROW;
#if P_FP8
                pv_words_t aw;
#pragma unroll
                for (int w = 0; w < cfg::PV_KPL / 4; ++w) {
                    const int j = ps * cfg::PV_KPL + 4 * w;
                    aw[w] = *reinterpret_cast<const unsigned*>(vrow + 32 * (j / 16) + mfma_c_row(g, j % 16));
                }
                o[dt] = wave_mfma_fp8(__builtin_bit_cast(pv_opnd_t, aw), b, o[dt]);
#else
                pv_opnd_t a;
#pragma unroll
                for (int run = 0; run < cfg::PV_KPL / 4; ++run) {
                    const int j = ps * cfg::PV_KPL + 4 * run;
                    const f16x4 x = *reinterpret_cast<const f16x4*>(vrow + 32 * (j / 16) + mfma_c_row(g, j % 16));
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[4 * run + e] = x[e];
                }
                o[dt] = wave_mfma_pv(a, b, o[dt]);
#endif
            }
        }
    }

    // ---- epilogue: O = acc · v_descale / l, LSE = (m·c + log2 l − log2 P_MAX) · ln 2 ----
    const float l_all = l + wave_swap_groups(l);
    const bool empty = !(l_all > 0.f);
    const float f = empty ? 0.f : v_descale / l_all;
    if (row >= p.q_len) return;
    out_t* out = reinterpret_cast<out_t*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1] + (i64)row * p.o_stride[2];
#pragma unroll
    for (int dt = 0; dt < cfg::DT; ++dt)
#pragma unroll
        for (int r = 0; r < 16; r += 4) {
            out4_t x;
#pragma unroll
            for (int e = 0; e < 4; ++e) x[e] = (out_t)(o[dt][r + e] * f);
            *reinterpret_cast<out4_t*>(out + 32 * dt + mfma_c_row(g, r)) = x;
        }
    if (p.lse != nullptr && g == 0)
        p.lse[((i64)batch * p.q_heads + head) * p.q_len + row] =
            empty ? QA_NEG_INF : (m * c_log2 + thread_log2(l_all) - p_log2) * QA_LN2;
}
