// INT8 quantization prepass of the native INT8 families (SageAttention style), on the stream the
// attention kernel runs on: Q and K to symmetric INT8 codes with f32 scales, optional K
// smoothing (subtract the per-channel mean of K over the key sequence) and the LSE shift that
// smoothing implies; with V_FP8, V to E4M3 codes with one f32 scale per (batch, kv head,
// channel), written transposed (Vᵀ) for the e4m3 P·V of fwd_wgmma_int8.cu. Numerics are the CPU
// codec's (`quattn::codec::int8`), rounding at the same points, so codes and scales are
// bit-exact given the mean (checked on the GPU by `quattn selftest`):
//   scale = amax / 127 (1 when amax = 0), correctly rounded      (f64 product, see below)
//   code  = clamp(round_half_even(x / scale), -127, 127), the quotient rounded to f32 first
//                                                                 (thread_code, below)
//   K smoothed: x = k - mu[c] in f32                              (sub.rn)
//   stored Q scale = scale * fold, fold = softmax_scale * log2 e  (mul.rn)
//   lse_shift[row] = (q . mu) * softmax_scale, the dot in the codec's order (each 8 channels
//                    summed left to right, then a pairwise tree over those partial sums), every
//                    product and sum rounded to f32 (mul.rn / add.rn, no FMA contraction)
//   V: v_scale[c] = amax_c / 448 (1 when amax_c = 0), v_inv[c] = 1 / v_scale[c] (div.rn),
//      code = e4m3_rn_satfinite(v * v_inv[c]) (mul.rn, then cvt.rn.satfinite.e4m3x2)
// The mean is accumulated in f64 (the codec's too) in another order, then rounded to f32 once.
//
// 256 threads per CTA, one work item per CTA. Items of one (batch, kv head) group:
//   stats (only with SMOOTH or V_FP8): CHUNK keys of K (f64 channel sums) and V (f32 channel
//     amax), written as per-chunk partials. The item that finishes a group's chunks last (an
//     atomic ticket per group) reduces the partials into the mean (f64, rounded to f32 once)
//     and the V scales, and sets the ticket back to zero for the next launch.
//   quantize: the group's V tiles (V_FP8), K CTAs, then the Q CTAs of its kv_group query heads.
// Two launches with stats: int8_prepass_stats runs every stats item (an entry of its own: four
// CTAs per SM where the quantize items' registers allow three), then int8_prepass the quantize
// items, blockIdx.x in group order, which read the statistics without waiting; K and V are read
// a second time, from DRAM. Without stats, the quantize launch alone. A one-launch form whose
// quantize items waited for their head's statistics (a work order drawn from an atomic counter
// that had them read K and V again from L2) measured slower on every benchmark shape: its waits
// and per-item ticket traffic cost more than the second read.
//
// Quantize CTAs of Q and K. A CTA covers as many whole scale blocks as fit in 128 rows (BLOCK
// rows each: ROWS = BLOCK * (128 / BLOCK)), warp w rows 16w .. 16w + 15 (a warp never straddles
// two blocks: BLOCK is a multiple of 16); lane l holds the 8 channels 8 (l % CPR) .. +7 of rows
// l / CPR + RPI * i (CPR = HEAD_DIM / 8 lanes per row, RPI = 32 / CPR rows per load, NR = 16 /
// RPI rows per lane): loads are coalesced, and rows g and g + 8 of a warp (the per-thread
// group) sit in the same lane (entries i and i + NR / 2). Group amax: per row pair with a
// CPR-lane shuffle (Q PerThread), else per warp (shuffles) and then over the group's warps
// through shared memory (Q PerWarp: Q_RPW / 16 warps; Q PerBlock and K: BLOCK / 16 warps).
//
// Each lane keeps its loaded rows as raw 16-byte pieces (4 registers per 8 channels of f16 or
// bf16) and converts each row to f32 once, for its codes and LSE products; the amax comes from
// the raw halves (max.f16x2 of the magnitudes: the order of non-negative halves is the order of
// their values; for smoothed K the per-channel min and max, since max |rn(k - mu)| is the
// larger of |rn(kmax - mu)| and |rn(kmin - mu)|), NaN skipped as fmaxf skips it. No f32 copy
// of the rows stays live: at most 80 registers, three CTAs (24 warps) per SM.
//
// Codes. x / scale rounded to f32 then to an integer is the codec's code; the kernel computes
// q' = x * r with r = fl(1 / scale) instead: |q' - x / scale| <= 2^-23 * 127.5 < 1.6e-5 and
// |fl(x / scale) - x / scale| <= 2^-24 * 127.5, so where q' is farther than 2^-14 from a
// half-integer both round to the same integer (and that integer is within [-127, 127]); else
// (about 1 code in 4000) the exact path divides with the correctly rounded thread_div_inline:
// at hd 128 a rolled loop after all rows reads such a row's elements again and stores its codes
// again (instruction fetch, below); at hd 64 each row takes it inline.
// q' rounds to an integer by adding 1.5 * 2^23 (the sum's ulp is 1): the code is the low byte
// of the sum's bits.
//
// LSE shift. Each lane sums its 8 channels' products of a row left to right, then the row's
// CPR lanes add their sums in a butterfly (xor 1, 2, 4, ...): the pairwise tree of the codec's
// order, every lane of the row ending with the same sum. Eleven dependent adds a row (seven at
// hd 64) on every lane, instead of a chain of D adds on a few lanes.
//
// V tiles (V_FP8): 128 keys of one (batch, kv head) per CTA, loaded as the Q/K rows are; codes
// go to a shared [128][D + 4] byte tile; then each thread writes 4 Vᵀ rows d .. d + 3 x 16
// keys: 16 32-bit loads (4 keys x 4 channels each), four 4x4 byte transposes (byte_perm), four
// 16-byte stores. Column 32c + k of a Vᵀ row holds key 32c + sigma(k) (fwd_wgmma_int8.cu's key
// permutation: the 4 columns 4j .. 4j + 3 of a 16-column half hold keys 2j, 2j + 1, 2j + 8,
// 2j + 9 of that half); keys past kv_len up to kv_pad (a multiple of 128) are zeros.
//
// Scale layouts (the codec's Int8ScaleLayout with blocking (BLOCK_Q, BLOCK_K, Q_WARPS)):
//   Q: [batch][q_heads][q_blocks][slots], slot of block row r: PerBlock 0, PerWarp r / Q_RPW,
//      PerThread (r / 16) * 8 + (r % 16) % 8 (needs Q_RPW = 16).
//   K: [batch][kv_heads][k_blocks]. Codes keep the input's strides (one byte per element).
//   V: v_scale, v_inv [batch][kv_heads][D]; Vᵀ [batch][kv_heads][D][kv_pad].
//
// Compile-time parameters: HEAD_DIM 64 | 128, ELEM 0 f16 | 1 bf16 | 2 f32, SMOOTH 0 | 1, V_FP8
// 0 | 1, BLOCK_Q, BLOCK_K (multiples of 16, at most 128), Q_GRAN 0 | 1 | 2, Q_RPW (rows per
// layout warp, a multiple of 16). ABI: `PrepassParams` (Rust mirror `PrepassParams` in
// src/int8_prepass.rs).
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(ELEM) || !defined(SMOOTH) || !defined(V_FP8)
#error "int8_prepass.cu needs HEAD_DIM, ELEM, SMOOTH, V_FP8"
#endif
#if !defined(BLOCK_Q) || !defined(BLOCK_K) || !defined(Q_GRAN) || !defined(Q_RPW)
#error "int8_prepass.cu needs BLOCK_Q, BLOCK_K, Q_GRAN, Q_RPW"
#endif
static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "head dim 64 or 128");
static_assert(ELEM >= 0 && ELEM <= 2, "ELEM 0 (f16), 1 (bf16) or 2 (f32)");
static_assert(BLOCK_Q % 16 == 0 && BLOCK_Q <= 128 && BLOCK_K % 16 == 0 && BLOCK_K <= 128, "blocks of 16..128 rows");
static_assert(Q_RPW % 16 == 0 && BLOCK_Q % Q_RPW == 0, "layout warps of 16k rows");
static_assert(Q_GRAN != 2 || Q_RPW == 16, "per-thread scales need 16 rows per layout warp");
#if V_FP8 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "V_FP8 writes e4m3 codes (cvt ... e4m3x2): sm_89 or newer"
#endif
// The stats items: the K mean (SMOOTH) and the V scales (V_FP8).
#define STATS (SMOOTH || V_FP8)

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int CPR = D / 8;          // lanes (8-channel chunks) per row
constexpr int RPI = 32 / CPR;       // rows per warp-wide load
constexpr int NR = 16 / RPI;        // rows per lane
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int ELEM_BYTES = ELEM == 2 ? 4 : 2;
constexpr int CHUNK = 256;                          // keys per stats item
constexpr int STAT_ROWS = THREADS / CPR;            // keys a stats item loads at once
constexpr float E4M3_MAX = 448.f;
constexpr int VT_KEYS = 128;                        // keys per V tile (and the Vᵀ row padding)
constexpr int Q_SLOTS = Q_GRAN == 0 ? 1 : Q_GRAN == 1 ? BLOCK_Q / Q_RPW : (BLOCK_Q / 16) * 8;
constexpr int Q_ROWS = BLOCK_Q * (128 / BLOCK_Q);   // rows per Q CTA: whole blocks
constexpr int K_ROWS = BLOCK_K * (128 / BLOCK_K);   // rows per K CTA
constexpr int VT_STRIDE = D + 4;                    // bytes per key of the V code tile
}  // namespace cfg

struct PrepassParams {
    u64 q, k, v;                        // inputs, ELEM
    u64 q_codes, k_codes;               // int8, the inputs' strides
    u64 vt_codes;                       // e4m3 Vᵀ [batch][kv_heads][D][kv_pad]       (V_FP8)
    u64 q_scale, k_scale;               // f32 scale layouts
    u64 mean;                           // f32 [batch][kv_heads][D]                 (SMOOTH)
    u64 k_partial;                      // f64 [batch][kv_heads][chunks][D]         (SMOOTH)
    u64 v_scale, v_inv;                 // f32 [batch][kv_heads][D]                 (V_FP8)
    u64 v_partial;                      // f32 [batch][kv_heads][chunks][D]         (V_FP8)
    u64 tickets;                        // u32 [batch * kv_heads]: a ticket per group, 0
                                        // between launches                          (STATS)
    u64 lse_shift;                      // f32 [batch][q_heads][q_len]              (SMOOTH)
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // elements; head dim contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    i64 v_batch_stride, v_head_stride, v_seq_stride;
    int batch, q_heads, kv_heads, q_len, kv_len, kv_group;
    int q_blocks, k_blocks, chunks, kv_pad;
    int q_ctas, k_ctas, v_ctas;         // quantize items per (batch, head) of Q, K, V
    float fold;                         // softmax_scale * log2 e, into the stored Q scales
    float softmax_scale;                // of the LSE shift
};

// 8 consecutive input elements as loaded (16-byte aligned for 2-byte types, 32 for f32).
#if ELEM == 2
struct Raw8 {
    float4 a, b;
};
#else
struct Raw8 {
    uint4 a;
};
#endif

__device__ __forceinline__ void thread_load_raw8(Raw8& r, const void* src) {
#if ELEM == 2
    r.a = __ldg(reinterpret_cast<const float4*>(src));
    r.b = __ldg(reinterpret_cast<const float4*>(src) + 1);
#else
    r.a = __ldg(reinterpret_cast<const uint4*>(src));
#endif
}

__device__ __forceinline__ void thread_zero_raw8(Raw8& r) {
#if ELEM == 2
    r.a = make_float4(0.f, 0.f, 0.f, 0.f);
    r.b = r.a;
#else
    r.a = make_uint4(0, 0, 0, 0);
#endif
}

// The 8 elements of r as f32 (exact). Volatile: each use converts again rather than the
// compiler keeping all converted rows live from the first (twice the registers).
__device__ __forceinline__ void thread_unpack8(float (&x)[8], const Raw8& r) {
#if ELEM == 2
    x[0] = r.a.x; x[1] = r.a.y; x[2] = r.a.z; x[3] = r.a.w;
    x[4] = r.b.x; x[5] = r.b.y; x[6] = r.b.z; x[7] = r.b.w;
#else
    const u32 w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if ELEM == 0
        asm volatile("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }\n"
                     : "=f"(x[2 * i]), "=f"(x[2 * i + 1]) : "r"(w[i]));
#else
        asm volatile("{ shl.b32 %0, %2, 16; and.b32 %1, %2, 0xffff0000; }\n"
                     : "=f"(x[2 * i]), "=f"(x[2 * i + 1]) : "r"(w[i]));
#endif
    }
#endif
}

#if ELEM != 2
// Channel-wise max / min of two words of 2 elements each; a NaN element yields the other.
__device__ __forceinline__ u32 thread_max2(u32 a, u32 b) {
    u32 d;
#if ELEM == 0
    asm("max.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#else
    asm("max.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#endif
    return d;
}
__device__ __forceinline__ u32 thread_min2(u32 a, u32 b) {
    u32 d;
#if ELEM == 0
    asm("min.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#else
    asm("min.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#endif
    return d;
}
#endif

// Every element NaN (the start of a min / max that skips NaN).
__device__ __forceinline__ void thread_nan_raw8(Raw8& r) {
#if ELEM == 2
    const float n = __int_as_float(0x7fffffff);
    r.a = make_float4(n, n, n, n);
    r.b = r.a;
#else
    r.a = make_uint4(0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu);
#endif
}

// lo, hi = the element-wise min and max of (lo, x) and (hi, x); NaN elements skipped.
__device__ __forceinline__ void thread_minmax_raw8(Raw8& lo, Raw8& hi, const Raw8& x) {
#if ELEM == 2
    lo.a = make_float4(fminf(lo.a.x, x.a.x), fminf(lo.a.y, x.a.y), fminf(lo.a.z, x.a.z), fminf(lo.a.w, x.a.w));
    lo.b = make_float4(fminf(lo.b.x, x.b.x), fminf(lo.b.y, x.b.y), fminf(lo.b.z, x.b.z), fminf(lo.b.w, x.b.w));
    hi.a = make_float4(fmaxf(hi.a.x, x.a.x), fmaxf(hi.a.y, x.a.y), fmaxf(hi.a.z, x.a.z), fmaxf(hi.a.w, x.a.w));
    hi.b = make_float4(fmaxf(hi.b.x, x.b.x), fmaxf(hi.b.y, x.b.y), fmaxf(hi.b.z, x.b.z), fmaxf(hi.b.w, x.b.w));
#else
    lo.a = make_uint4(thread_min2(lo.a.x, x.a.x), thread_min2(lo.a.y, x.a.y), thread_min2(lo.a.z, x.a.z), thread_min2(lo.a.w, x.a.w));
    hi.a = make_uint4(thread_max2(hi.a.x, x.a.x), thread_max2(hi.a.y, x.a.y), thread_max2(hi.a.z, x.a.z), thread_max2(hi.a.w, x.a.w));
#endif
}

// max |x| over the 8 elements of r as f32, NaN elements skipped (0 if all are): what fmaxf
// over their fabsf gives, without converting each element.
__device__ __forceinline__ float thread_absmax8(const Raw8& r) {
#if ELEM == 2
    float x[8];
    thread_unpack8(x, r);
    float a = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(x[e]));
    return a;
#else
    // Magnitudes (sign bits cleared), max against 0: NaN elements yield the other operand.
    u32 m = thread_max2(thread_max2(r.a.x & 0x7fff7fffu, r.a.y & 0x7fff7fffu), thread_max2(r.a.z & 0x7fff7fffu, r.a.w & 0x7fff7fffu));
    m = thread_max2(m, 0u);
    // Two non-negative halves: their order is the order of their bits.
    const u32 top = max(m & 0xffffu, m >> 16);
#if ELEM == 0
    float f;
    asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }\n" : "=f"(f) : "h"((unsigned short)top));
    return f;
#else
    return __uint_as_float(top << 16);
#endif
#endif
}

// 8 f32 the stats launch wrote (from L2: ld.global.cg), from a 32-byte aligned address.
__device__ __forceinline__ void thread_load8_f32_cg(float (&x)[8], const float* src) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(src));
    const float4 b = __ldcg(reinterpret_cast<const float4*>(src) + 1);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}

// The input tensor rows of one (batch, head): base address and row stride in bytes.
struct Rows {
    const unsigned char* base;
    i64 stride;
    __device__ __forceinline__ Rows(u64 ptr, i64 bs, i64 hs, i64 ss, int b, int h)
        : base(reinterpret_cast<const unsigned char*>(ptr) + ((i64)b * bs + (i64)h * hs) * cfg::ELEM_BYTES),
          stride(ss * cfg::ELEM_BYTES) {}
    // Channels 8c .. 8c + 7 of row `row`.
    __device__ __forceinline__ const unsigned char* at(int row, int c) const {
        return base + (i64)row * stride + 8 * c * cfg::ELEM_BYTES;
    }
};

// Shared memory of a CTA: the stats partials, the LSE-shift products (Q) or the V code tile.
union Smem {
    struct {
#if SMOOTH
        double k[cfg::STAT_ROWS][cfg::D];
#endif
#if V_FP8
        float v[cfg::STAT_ROWS][cfg::D];
#endif
    } part;
    unsigned char vt[cfg::VT_KEYS][cfg::VT_STRIDE];
};

// Quantize items per group.
__device__ __forceinline__ int quantize_items(const PrepassParams& p) {
    return (V_FP8 ? p.v_ctas : 0) + p.k_ctas + p.kv_group * p.q_ctas;
}

// ---- stats items --------------------------------------------------------------------------------

#if STATS
// fence.acq_rel at GPU scope: with a relaxed store or atomic after it, a release; with a
// relaxed atomic before it, an acquire (PTX memory model). Lighter than __threadfence's
// sequentially consistent fence, which the ticket protocol does not need.
__device__ __forceinline__ void thread_fence_acq_rel_gpu() {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// Chunk `chunk` of group g = (b, h): thread t sums (K) and maxes (|V|) channels 8 (t % CPR) ..
// +7 of keys t / CPR + STAT_ROWS i, the CTA combines its STAT_ROWS row partials and writes the
// chunk's; the last chunk of the group to finish reduces every chunk's into the mean and the
// V scales (read by the quantize launch that follows) and zeroes the group's ticket.
__device__ __forceinline__ void cta_stats(const PrepassParams& p, Smem& sm, int g, int chunk) {
    constexpr int ROWS = cfg::STAT_ROWS;
    constexpr int SLICES = cfg::THREADS / cfg::D;   // threads per channel in the final reduction
    __shared__ bool last;
    const int tid = threadIdx.x;
    const int c = tid % cfg::CPR;
    const int r = tid / cfg::CPR;
    const int b = g / p.kv_heads, h = g % p.kv_heads;
    const i64 bh = g;
    const int key_end = min(p.kv_len, (chunk + 1) * cfg::CHUNK);
    // CHUNK / ROWS keys per thread, loaded BATCH at a time before they are used.
    constexpr int PER = cfg::CHUNK / ROWS, BATCH = (SMOOTH && V_FP8) ? 4 : 8;
    static_assert(PER % BATCH == 0, "whole batches");
#if SMOOTH
    const Rows k(p.k, p.k_batch_stride, p.k_head_stride, p.k_seq_stride, b, h);
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#endif
#if V_FP8
    const Rows v(p.v, p.v_batch_stride, p.v_head_stride, p.v_seq_stride, b, h);
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#endif
#pragma unroll 1
    for (int i0 = 0; i0 < PER; i0 += BATCH) {
#if SMOOTH
        Raw8 rk[BATCH];
#endif
#if V_FP8
        Raw8 rv[BATCH];
#endif
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            const int j = chunk * cfg::CHUNK + r + ROWS * (i0 + i);
            const bool in = j < key_end;
#if SMOOTH
            if (in) thread_load_raw8(rk[i], k.at(j, c));
            else thread_zero_raw8(rk[i]);
#endif
#if V_FP8
            if (in) thread_load_raw8(rv[i], v.at(j, c));
            else thread_zero_raw8(rv[i]);
#endif
        }
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            float x[8];
#if SMOOTH
            thread_unpack8(x, rk[i]);
#pragma unroll
            for (int e = 0; e < 8; ++e) s[e] += (double)x[e];
#endif
#if V_FP8
            thread_unpack8(x, rv[i]);
#pragma unroll
            for (int e = 0; e < 8; ++e) a[e] = fmaxf(a[e], fabsf(x[e]));
#endif
        }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
#if SMOOTH
        sm.part.k[r][8 * c + e] = s[e];
#endif
#if V_FP8
        sm.part.v[r][8 * c + e] = a[e];
#endif
    }
    __syncthreads();
    for (int ch = tid; ch < cfg::D; ch += cfg::THREADS) {
        const i64 at = (bh * p.chunks + chunk) * cfg::D + ch;
#if SMOOTH
        double t = 0;
#pragma unroll 4
        for (int i = 0; i < ROWS; ++i) t += sm.part.k[i][ch];
        reinterpret_cast<double*>(p.k_partial)[at] = t;
#endif
#if V_FP8
        float m = 0.f;
#pragma unroll 4
        for (int i = 0; i < ROWS; ++i) m = fmaxf(m, sm.part.v[i][ch]);
        reinterpret_cast<float*>(p.v_partial)[at] = m;
#endif
    }
    // Publish the partials, then take a ticket: the CTA that draws the last one sees every
    // other chunk's partials (their writes were released before their tickets).
    thread_fence_acq_rel_gpu();
    __syncthreads();
    u32* ticket = reinterpret_cast<u32*>(p.tickets) + bh;
    if (tid == 0) last = atomicAdd(ticket, 1u) == (u32)(p.chunks - 1);
    __syncthreads();
    if (!last) return;
    thread_fence_acq_rel_gpu();   // acquire: every chunk's partials are read after their tickets
    // SLICES threads per channel, each over the chunks s, s + SLICES, ... (L2 reads: other
    // CTAs wrote them), then combined through shared memory.
    const int ch = tid % cfg::D;
    const int slice = tid / cfg::D;
#if SMOOTH
    {
        const double* src = reinterpret_cast<const double*>(p.k_partial) + bh * p.chunks * cfg::D + ch;
        // Eight chains over whole rounds of 8 SLICES chunks, then the remaining chunks, then the
        // chains in order: a fixed order, with eight L2 reads in flight instead of one.
        double c8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = slice;
        for (; i + 7 * SLICES < p.chunks; i += 8 * SLICES) {
#pragma unroll
            for (int j = 0; j < 8; ++j) c8[j] += __ldcg(src + (i64)(i + j * SLICES) * cfg::D);
        }
        double t = 0;
        for (; i < p.chunks; i += SLICES) t += __ldcg(src + (i64)i * cfg::D);   // the last chunks
#pragma unroll
        for (int j = 0; j < 8; ++j) t += c8[j];
        __syncthreads();   // the partials' shared memory is reused
        sm.part.k[slice][ch] = t;
        __syncthreads();
        if (slice == 0) {
            double sum = 0;
#pragma unroll
            for (int i = 0; i < SLICES; ++i) sum += sm.part.k[i][ch];
            reinterpret_cast<float*>(p.mean)[bh * cfg::D + ch] = (float)(sum / (double)p.kv_len);
        }
    }
#endif
#if V_FP8
    {
        const float* src = reinterpret_cast<const float*>(p.v_partial) + bh * p.chunks * cfg::D + ch;
        float m8[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};   // eight reads in flight (max: any order)
        int i = slice;
        for (; i + 7 * SLICES < p.chunks; i += 8 * SLICES) {
#pragma unroll
            for (int j = 0; j < 8; ++j) m8[j] = fmaxf(m8[j], __ldcg(src + (i64)(i + j * SLICES) * cfg::D));
        }
        for (; i < p.chunks; i += SLICES) m8[0] = fmaxf(m8[0], __ldcg(src + (i64)i * cfg::D));
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) m = fmaxf(m, m8[j]);
        __syncthreads();
        sm.part.v[slice][ch] = m;
        __syncthreads();
        if (slice == 0) {
            float amax = 0.f;
#pragma unroll
            for (int i = 0; i < SLICES; ++i) amax = fmaxf(amax, sm.part.v[i][ch]);
            const float scale = amax > 0.f ? thread_div_rn(amax, cfg::E4M3_MAX) : 1.f;
            reinterpret_cast<float*>(p.v_scale)[bh * cfg::D + ch] = scale;
            reinterpret_cast<float*>(p.v_inv)[bh * cfg::D + ch] = thread_div_rn(1.f, scale);
        }
    }
#endif
    // Every other chunk has taken its ticket: zero for the next launch (the quantize launch that
    // reads the statistics comes after this one ends).
    if (tid == 0) *ticket = 0u;
}
#endif

// ---- quantize items -----------------------------------------------------------------------------

// amax / 127 correctly rounded, without div.rn's out-of-line slow path (its call forces
// ptxas to spill the 64 live values around every call site): the f64 product with 1/127 is
// within 2^-52 relative of the quotient, while amax / 127 (amax = M 2^e, 127 odd, not a power
// of 2) is never closer than 2^-32 relative to an f32 rounding midpoint unless it is exactly
// representable, so one rounding to f32 gives the correctly rounded quotient (normal or not).
__device__ __forceinline__ float thread_scale_for(float amax) {
    return amax > 0.f ? (float)((double)amax * (1.0 / 127.0)) : 1.f;
}

// a / b rounded to nearest even, inline, for normal b with normal 1/b (the caller pre-scales):
// the fast path of div.rn (reciprocal, one Newton step, two Markstein corrections with exact
// FMA remainders). int8_prepass.rs's tests run the same sequence against true division.
__device__ __forceinline__ float thread_div_inline(float a, float b) {
    float y, e, q, r;
    asm("rcp.approx.f32 %0, %1;" : "=f"(y) : "f"(b));
    asm("fma.rn.f32 %0, %1, %2, 0f3F800000;" : "=f"(e) : "f"(-b), "f"(y));
    asm("fma.rn.f32 %0, %1, %2, %1;" : "=f"(y) : "f"(y), "f"(e));
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(y));
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(-b), "f"(q), "f"(a));
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(q) : "f"(r), "f"(y), "f"(q));
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(-b), "f"(q), "f"(a));
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(q) : "f"(r), "f"(y), "f"(q));
    return q;
}

// Scales below 2^-60 (and the values they divide) are multiplied by 2^64, exactly (powers of
// two, |x| <= 127.5 scale): the quotient is unchanged and b, 1/b stay normal.
__device__ __forceinline__ float thread_prescale(float scale) {
    return scale < 8.6736174e-19f ? 1.8446744e19f : 1.f;
}

// The code of x under scale, exactly as the codec rounds (the quotient rounded to f32, then
// half to even), clamped; f = thread_prescale(scale).
__device__ __forceinline__ int thread_code_exact(float x, float scale, float f) {
    const float q = thread_div_inline(thread_mul_rn(x, f), thread_mul_rn(scale, f));
    int c;
    asm("cvt.rni.s32.f32 %0, %1;\n" : "=r"(c) : "f"(q));
    return max(-127, min(127, c));
}

// max(a, b), NaN if either is NaN (max.NaN; fmaxf would return the other operand).
__device__ __forceinline__ float thread_max_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

// One group's quantization constants: the scale and fl(1 / scale) (inf for a scale too small
// to invert, which sends every nonzero code to the exact path).
struct CodeScale {
    float s, r;
    __device__ __forceinline__ void set(float scale) {
        s = scale;
        const float f = thread_prescale(scale);
        r = thread_mul_rn(thread_div_inline(1.f, thread_mul_rn(scale, f)), f);
    }
    // The code bytes of 8 values of one row, 4 per word, element 0 in the lowest byte (header:
    // the product path, and the exact division where a quotient lies within 2^-14 of a
    // half-integer, one branch per row, rarely taken). The scale itself (needed on the exact
    // path only) from `scale_of()`.
    template <class ScaleOf>
    __device__ __forceinline__ void codes8(const float (&x)[8], u32& lo, u32& hi, ScaleOf scale_of) const {
        u32 c[8];
        const float dmax = product_codes(x, c);
        if (!(dmax < 0.49993896484375f)) {
            // d recomputed here rather than kept live through the common path (registers).
            const float s = scale_of();
            const float f = thread_prescale(s);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const float q = thread_mul_rn(x[e], r);
                const float dd = thread_sub_rn(q, thread_sub_rn(thread_add_rn(q, 12582912.f), 12582912.f));
                if (!(fabsf(dd) < 0.49993896484375f)) c[e] = (u32)thread_code_exact(x[e], s, f);
            }
        }
        pack8(c, lo, hi);
    }
    // The product path's codes only; true where the row needs the exact path, which the caller
    // then takes with codes8.
    __device__ __forceinline__ bool codes8_product(const float (&x)[8], u32& lo, u32& hi) const {
        u32 c[8];
        const float dmax = product_codes(x, c);
        pack8(c, lo, hi);
        return !(dmax < 0.49993896484375f);
    }
    // The row's largest |q - rne(q)|, NaN if any is (a NaN or infinite x): one test per row
    // instead of a compare, select and or per element. Every one <= 0.5 - 2^-14: each q is
    // safely away from a half-integer; else (rarely) the elements that are not take the exact
    // path. A running max, so that each difference dies at once (registers).
    __device__ __forceinline__ float product_codes(const float (&x)[8], u32 (&c)[8]) const {
        float dmax = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float q = thread_mul_rn(x[e], r);
            const float b = thread_add_rn(q, 12582912.f);      // 1.5 * 2^23 + rne(q)
            const float d = fabsf(thread_sub_rn(q, thread_sub_rn(b, 12582912.f)));
            dmax = e == 0 ? d : thread_max_nan(dmax, d);
            c[e] = __float_as_uint(b);                         // the code in the low byte
        }
        return dmax;
    }
    __device__ __forceinline__ static void pack8(const u32 (&c)[8], u32& lo, u32& hi) {
        lo = __byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410);
        hi = __byte_perm(__byte_perm(c[4], c[5], 0x0040), __byte_perm(c[6], c[7], 0x0040), 0x5410);
    }
};

// Max over the CPR lanes of a row (they are consecutive, CPR-aligned).
__device__ __forceinline__ float row_max(float a) {
#pragma unroll
    for (int o = 1; o < cfg::CPR; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

// The V tile of keys [128 t, 128 t + 128) of group g = (b, h): codes into the shared tile,
// then Vᵀ.
__device__ __forceinline__ void cta_quantize_v(const PrepassParams& p, Smem& sm, int g, int t) {
#if V_FP8
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = lane % cfg::CPR;
    const int b = g / p.kv_heads, h = g % p.kv_heads;
    const i64 bh = g;
    const Rows v(p.v, p.v_batch_stride, p.v_head_stride, p.v_seq_stride, b, h);
    Raw8 raw[cfg::NR];
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int key = cfg::VT_KEYS * t + 16 * warp + lane / cfg::CPR + cfg::RPI * i;
        if (key < p.kv_len) thread_load_raw8(raw[i], v.at(key, c));
        else thread_zero_raw8(raw[i]);
    }
    float inv[8];
    thread_load8_f32_cg(inv, reinterpret_cast<const float*>(p.v_inv) + bh * cfg::D + 8 * c);
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int r = 16 * warp + lane / cfg::CPR + cfg::RPI * i;
        float x[8];
        thread_unpack8(x, raw[i]);
        u32 w[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float* y = x + 4 * half;
            const float* iv = inv + 4 * half;
            // cvt.*x2 puts its first source in the upper byte.
            asm("{ .reg .b16 l, h;\n"
                "cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n"
                "cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n"
                "mov.b32 %0, {l, h}; }\n"
                : "=r"(w[half])
                : "f"(thread_mul_rn(y[0], iv[0])), "f"(thread_mul_rn(y[1], iv[1])), "f"(thread_mul_rn(y[2], iv[2])),
                  "f"(thread_mul_rn(y[3], iv[3])));
        }
        *reinterpret_cast<u32*>(&sm.vt[r][8 * c]) = w[0];
        *reinterpret_cast<u32*>(&sm.vt[r][8 * c + 4]) = w[1];
    }
    __syncthreads();
    // Thread = 4 Vᵀ rows (channel group dg) x 16 columns (group cg of the tile).
    constexpr int DG = cfg::D / 4;
    if (tid >= DG * (cfg::VT_KEYS / 16)) return;
    const int dg = tid % DG, cg = tid / DG;
    u32 out[4][4];   // [channel dd][column word j]
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u32 w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = 16 * cg + 2 * j + (e & 1) + 8 * (e >> 1);
            w[e] = *reinterpret_cast<const u32*>(&sm.vt[key][4 * dg]);
        }
        const u32 t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
        const u32 t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
        out[0][j] = __byte_perm(t0, t2, 0x5410);
        out[1][j] = __byte_perm(t0, t2, 0x7632);
        out[2][j] = __byte_perm(t1, t3, 0x5410);
        out[3][j] = __byte_perm(t1, t3, 0x7632);
    }
    unsigned char* vt = reinterpret_cast<unsigned char*>(p.vt_codes) + (bh * cfg::D + 4 * dg) * p.kv_pad + cfg::VT_KEYS * t + 16 * cg;
#pragma unroll
    for (int dd = 0; dd < 4; ++dd)
        asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                     :: "l"(vt + (i64)dd * p.kv_pad), "r"(out[dd][0]), "r"(out[dd][1]), "r"(out[dd][2]), "r"(out[dd][3]) : "memory");
#else
    (void)p; (void)sm; (void)g; (void)t;
#endif
}

// The 8 means of a lane's channels from shared memory at `at`. Volatile: read again at each
// use rather than kept live across the rows (registers).
__device__ __forceinline__ void thread_load_mu(float (&mu)[8], u32 at) {
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(mu[0]), "=f"(mu[1]), "=f"(mu[2]), "=f"(mu[3]) : "r"(at));
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(mu[4]), "=f"(mu[5]), "=f"(mu[6]), "=f"(mu[7]) : "r"(at + 16));
}

// The Q (IS_Q) or K CTA `tile` of head h of batch b, whose statistics are group g's. One
// instantiation each: K keeps one scale per lane, Q per-thread scales and the LSE shift.
template <bool IS_Q>
__device__ __forceinline__ void cta_quantize_qk(const PrepassParams& p, Smem& sm, float* warp_amax, int g, int b, int h,
                                                int tile) {
    constexpr bool is_q = IS_Q;
    constexpr bool lse = IS_Q && SMOOTH;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = lane % cfg::CPR;
    constexpr int block = is_q ? BLOCK_Q : BLOCK_K;
    constexpr int rows = is_q ? cfg::Q_ROWS : cfg::K_ROWS;
    const int len = is_q ? p.q_len : p.kv_len;
    const int nblocks = is_q ? p.q_blocks : p.k_blocks;
    const int row0 = tile * rows;                         // first sequence row of the CTA
    const int blk = (row0 + 16 * warp) / block;           // this warp's scale block
    const Rows src = is_q ? Rows(p.q, p.q_batch_stride, p.q_head_stride, p.q_seq_stride, b, h)
                          : Rows(p.k, p.k_batch_stride, p.k_head_stride, p.k_seq_stride, b, h);
    const bool active = 16 * warp < rows && blk < nblocks;   // warps past the last block idle
    auto row_of = [&](int i) { return row0 + 16 * warp + lane / cfg::CPR + cfg::RPI * i; };

    // Load (rows past the sequence end stay 0 and add nothing to amax). A warp whose 16 rows
    // all exist (every warp but the last CTA's) loads without a test per row.
    Raw8 raw[cfg::NR];
    if (active && row0 + 16 * warp + 16 <= len) {
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) thread_load_raw8(raw[i], src.at(row_of(i), c));
    } else {
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) {
            if (active && row_of(i) < len) thread_load_raw8(raw[i], src.at(row_of(i), c));
            else thread_zero_raw8(raw[i]);
        }
    }

    // The mean of this lane's channels (K: subtracted; Q: for the LSE shift), in shared memory
    // and read again for each row (thread_load_mu): registers for the rows and their codes.
    float mu[8];
#if SMOOTH
    __shared__ __align__(16) float mu_sh[cfg::D];
    if (tid < cfg::D / 4) *reinterpret_cast<float4*>(&mu_sh[4 * tid]) = __ldcg(reinterpret_cast<const float4*>(p.mean) + (i64)g * cfg::D / 4 + tid);
    __syncthreads();
    const u32 mu_at = cta_smem_addr(&mu_sh[8 * c]);
    thread_load_mu(mu, mu_at);
#else
#pragma unroll
    for (int e = 0; e < 8; ++e) mu[e] = 0.f;
#endif

    // amax per row (Q, unsmoothed K) or per lane (smoothed K), from the raw elements (header).
    float amax[cfg::NR];
#if SMOOTH
    if (!is_q) {
        // max |k - mu| over the rows = max(|kmax - mu|, |kmin - mu|) per channel: f32
        // subtraction rounds monotonically. The extremes start as NaN (which min / max skip),
        // so rows past the end and NaN elements count for nothing, as in the codes' fmaxf.
        Raw8 hi, lo;
        thread_nan_raw8(hi);
        thread_nan_raw8(lo);
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i)
            if (row_of(i) < len) thread_minmax_raw8(lo, hi, raw[i]);
        float xh[8], xl[8];
        thread_unpack8(xh, hi);
        thread_unpack8(xl, lo);
        float a = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e)
            a = fmaxf(a, fmaxf(fabsf(thread_sub_rn(xh[e], mu[e])), fabsf(thread_sub_rn(xl[e], mu[e]))));
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) amax[i] = a;
    } else
#endif
    {
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) amax[i] = thread_absmax8(raw[i]);
    }

    // Group amax per row. Q PerThread: rows g and g + 8 of the warp (entries i and i + NR / 2
    // of the same lane, after the row's CPR-lane reduction). Else the warp's amax, combined
    // over the group's warps: Q PerWarp Q_RPW rows, Q PerBlock and K the block.
    constexpr int gran = is_q ? Q_GRAN : 0;
    float g_amax[cfg::NR];
    if (gran == 2) {
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) amax[i] = row_max(amax[i]);
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) g_amax[i] = fmaxf(amax[i], amax[(i + cfg::NR / 2) % cfg::NR]);
    } else {
        float w = 0.f;
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) w = fmaxf(w, amax[i]);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
        if (lane == 0) warp_amax[warp] = active ? w : 0.f;
        __syncthreads();
        constexpr int span = gran == 1 ? Q_RPW / 16 : block / 16;   // warps per group
        const int first = (warp / span) * span;
        float t = 0.f;
        for (int v = first; v < min(first + span, cfg::WARPS); ++v) t = fmaxf(t, warp_amax[v]);
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) g_amax[i] = t;
    }
    if (!active) return;

    // Scales: one writer per slot.
    float* scales = reinterpret_cast<float*>(is_q ? p.q_scale : p.k_scale);
    if (is_q) {
        const i64 sbase = (((i64)b * p.q_heads + h) * p.q_blocks + blk) * cfg::Q_SLOTS;
        if (c == 0) {
#pragma unroll
            for (int i = 0; i < cfg::NR / 2; ++i) {
                const int r = (16 * warp + lane / cfg::CPR + cfg::RPI * i) % BLOCK_Q;   // rows 0..7 of the warp
                int slot = -1;
                if (Q_GRAN == 0) slot = (r == 0) ? 0 : -1;
                else if (Q_GRAN == 1) slot = (r % Q_RPW == 0) ? r / Q_RPW : -1;
                else slot = (r / 16) * 8 + (r % 16);
                if (slot >= 0) scales[sbase + slot] = thread_mul_rn(thread_scale_for(g_amax[i]), p.fold);
            }
        }
    } else if (lane == 0 && (16 * warp) % BLOCK_K == 0) {
        scales[((i64)b * p.kv_heads + h) * p.k_blocks + blk] = thread_scale_for(g_amax[0]);
    }

    // Codes: 8 bytes per lane and row, coalesced per row. Rows i and i + NR / 2 share their
    // group amax in every granularity (the per-thread pair g, g + 8; else the whole warp).
    // With the LSE shift (header), each half of the rows (rows 0..7, then 8..15 of the warp)
    // also leaves its products q * mu in shared memory, and 8 lanes add them in channel order.
    const i64 cbase = is_q ? (i64)b * p.q_batch_stride + (i64)h * p.q_head_stride + 8 * c
                           : (i64)b * p.k_batch_stride + (i64)h * p.k_head_stride + 8 * c;
    const i64 cstride = is_q ? p.q_seq_stride : p.k_seq_stride;
    unsigned char* dst = reinterpret_cast<unsigned char*>(is_q ? p.q_codes : p.k_codes);
    constexpr int NCS = (is_q && Q_GRAN == 2) ? cfg::NR / 2 : 1;
    CodeScale cs[NCS];
#pragma unroll
    for (int i = 0; i < NCS; ++i) cs[i].set(thread_scale_for(g_amax[i]));
    // Several scales a lane (Q per thread): the scales themselves, which only the rare exact
    // path reads, wait in shared memory (registers).
    __shared__ float scale_sh[NCS > 1 ? NCS : 1][cfg::THREADS];
    if (NCS > 1) {
#pragma unroll
        for (int i = 0; i < NCS; ++i) scale_sh[i][tid] = cs[i].s;
    }
    // The exact path (header) in a rolled loop after the rows where a lane has 8 rows (hd 128):
    // one copy of it instead of one in each unrolled row keeps the code the SM fetches small
    // (with the per-row copies, instruction-fetch stalls made the per-thread form 10-17%
    // slower). With 4 rows (hd 64) the copies are few, and inline measured faster. For sm_100a
    // and sm_120a ptxas spills 4 bytes with the rolled loop in the per-thread form, which there
    // keeps the inline path (not run on hardware).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
    constexpr bool ROLLED_EXACT = cfg::NR >= 8 && NCS == 1;
#else
    constexpr bool ROLLED_EXACT = cfg::NR >= 8;
#endif
    u32 exact_rows = 0;   // bit i: row i needs the exact path (ROLLED_EXACT)
    float dot[cfg::NR];   // LSE shift: this lane's part of each row's q . mu
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int row = row_of(i);
        float x[8];
        thread_unpack8(x, raw[i]);
#if SMOOTH
        if (!is_q && row < len) {
            thread_load_mu(mu, mu_at);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = thread_sub_rn(x[e], mu[e]);   // K - mu, one f32 subtraction
        }
#endif
        if (row < len) {
            u32 lo, hi;
            if (ROLLED_EXACT) {
                if (cs[i % NCS].codes8_product(x, lo, hi)) exact_rows |= 1u << i;
            } else if (NCS > 1) {
                cs[i % NCS].codes8(x, lo, hi, [&] { return *(volatile float*)&scale_sh[i % NCS][tid]; });
            } else {
                cs[0].codes8(x, lo, hi, [&] { return cs[0].s; });
            }
            unsigned char* out = dst + cbase + (i64)row * cstride;
            asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" :: "l"(out), "r"(lo), "r"(hi) : "memory");
        }
        if (lse) {
#if SMOOTH
            thread_load_mu(mu, mu_at);
#endif
            // The codec's order (`codec::int8::lse_shift`): the lane's 8 products summed left
            // to right here, the row's CPR lane sums below.
            dot[i] = thread_mul_rn(x[0], mu[0]);
#pragma unroll
            for (int e = 1; e < 8; ++e) dot[i] = thread_add_rn(dot[i], thread_mul_rn(x[e], mu[e]));
        }
    }
    if (lse) {
        // The pairwise tree over each row's CPR lanes, as a butterfly (f32 addition commutes,
        // so every lane ends with the tree's sum); the rows' chains are independent.
#pragma unroll
        for (int o = 1; o < cfg::CPR; o <<= 1)
#pragma unroll
            for (int i = 0; i < cfg::NR; ++i) dot[i] = thread_add_rn(dot[i], __shfl_xor_sync(0xffffffffu, dot[i], o));
        float* shift = reinterpret_cast<float*>(p.lse_shift) + ((i64)b * p.q_heads + h) * p.q_len;
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i)
            if (c == 0 && row_of(i) < len) shift[row_of(i)] = thread_mul_rn(dot[i], p.softmax_scale);
    }

    // ROLLED_EXACT: the rare rows whose product codes may differ from the codec's (header):
    // their elements read again from global memory and their codes stored again (the same
    // thread's store to the same address, so the later one stays).
#pragma unroll 1
    while (ROLLED_EXACT && exact_rows != 0) {
        const int i = __ffs(exact_rows) - 1;
        exact_rows &= exact_rows - 1;
        const int row = row_of(i);
        Raw8 r8;
        thread_load_raw8(r8, src.at(row, c));
        float x[8];
        thread_unpack8(x, r8);
#if SMOOTH
        if (!is_q) {
            thread_load_mu(mu, mu_at);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = thread_sub_rn(x[e], mu[e]);
        }
#endif
        CodeScale e = cs[0];
        if (NCS > 1) e.set(scale_sh[i % NCS][tid]);   // r recomputed from s as set computed it
        u32 lo, hi;
        e.codes8(x, lo, hi, [&] { return e.s; });
        unsigned char* out = dst + cbase + (i64)row * cstride;
        asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" :: "l"(out), "r"(lo), "r"(hi) : "memory");
    }
}

// Three CTAs per SM (24 warps): each lane's loads are all issued before their first use. With
// stats, after int8_prepass_stats on the same stream, whose results it reads.
extern "C" __global__ void __launch_bounds__(cfg::THREADS, 3) int8_prepass(const PrepassParams p) {
    __shared__ float warp_amax[cfg::WARPS];
    __shared__ __align__(16) Smem sm;
    const int qn = quantize_items(p);
    const int g = blockIdx.x / qn;
    int r = blockIdx.x % qn;
    const int v_ctas = V_FP8 ? p.v_ctas : 0;
    if (r < v_ctas) {
        cta_quantize_v(p, sm, g, v_ctas - 1 - r);   // reverse order: the last V rows read first
        return;
    }
    r -= v_ctas;
    const int b = g / p.kv_heads, h = g % p.kv_heads;
    if (r < p.k_ctas) {
        cta_quantize_qk<false>(p, sm, warp_amax, g, b, h, p.k_ctas - 1 - r);
        return;
    }
    r -= p.k_ctas;
    cta_quantize_qk<true>(p, sm, warp_amax, g, b, h * p.kv_group + r / p.q_ctas, r % p.q_ctas);
}

#if STATS
// The stats launch: one chunk of one (batch, kv head) per CTA, grid = chunks * groups. An entry
// of its own for its occupancy: without the quantize items' registers, four CTAs fit an SM
// instead of three; for K and V at once on sm_100a / sm_120a (whose ptxas then spills 72 bytes)
// three.
#if SMOOTH && V_FP8 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define STATS_CTAS_PER_SM 3
#else
#define STATS_CTAS_PER_SM 4
#endif
extern "C" __global__ void __launch_bounds__(cfg::THREADS, STATS_CTAS_PER_SM) int8_prepass_stats(const PrepassParams p) {
    __shared__ __align__(16) Smem sm;
    cta_stats(p, sm, blockIdx.x / p.chunks, blockIdx.x % p.chunks);
}
#endif
