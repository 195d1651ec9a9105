// INT8 quantization prepass of the native INT8 families (SageAttention style), on the stream the
// attention kernel runs on: Q and K to symmetric INT8 codes with f32 scales, optional K
// smoothing (subtract the per-channel mean of K over the key sequence) and the LSE shift that
// smoothing implies. Numerics are the CPU codec's (`quattn::codec::int8`), rounding at the same
// points, so codes and scales are bit-exact given the mean (checked on the GPU by `quattn
// selftest`):
//   scale = amax / 127 (1 when amax = 0), correctly rounded      (f64 product, see below)
//   code  = clamp(round_half_even(x / scale), -127, 127), the quotient rounded to f32 first
//                                                                 (inline division, cvt.rni)
//   K smoothed: x = k - mu[c] in f32                              (sub.rn)
//   stored Q scale = scale * fold, fold = softmax_scale * log2 e  (mul.rn)
//   lse_shift[row] = (sum over c in channel order of q[c] * mu[c]) * softmax_scale, every
//                    product and sum rounded to f32 (mul.rn / add.rn, no FMA contraction)
// The mean is accumulated in f64 (the codec's too) in another order, then rounded to f32 once.
//
// One source, three passes (-D PASS), each its own cubin with the entry `int8_prepass`:
//   PASS 0  mean partials: grid (chunks, kv_heads, batch), CHUNK keys per CTA, f64 sums.
//   PASS 1  mean: grid (batch * kv_heads), HEAD_DIM threads, partials summed in chunk order,
//           divided by kv_len in f64, rounded to f32.
//   PASS 2  quantize: 1-D grid, Q blocks first (batch, q head, block) then K blocks; one CTA of
//           256 threads per block of at most 128 rows. Warp w owns rows 16w .. 16w + 15 of the
//           block; lane l holds the 8 channels 8 (l % CPR) .. +7 of rows l / CPR + RPI * i
//           (CPR = HEAD_DIM / 8 lanes per row, RPI = 32 / CPR rows per load, NR = 16 / RPI
//           rows per lane): loads are coalesced, a row's amax is a CPR-lane shuffle reduction,
//           and rows g and g + 8 of a warp (the per-thread group) sit in the same lane
//           (entries i and i + NR / 2).
//
// Scale layouts (the codec's Int8ScaleLayout with blocking (BLOCK_Q, BLOCK_K, Q_WARPS)):
//   Q: [batch][q_heads][q_blocks][slots], slot of block row r: PerBlock 0, PerWarp r / Q_RPW,
//      PerThread (r / 16) * 8 + (r % 16) % 8 (needs Q_RPW = 16).
//   K: [batch][kv_heads][k_blocks]. Codes keep the input's strides (one byte per element).
//
// Compile-time parameters: HEAD_DIM 64 | 128, ELEM 0 f16 | 1 bf16 | 2 f32, PASS 0 | 1 | 2;
// PASS 2 also BLOCK_Q, BLOCK_K (multiples of 16, at most 128), Q_GRAN 0 | 1 | 2, Q_RPW (rows
// per layout warp, a multiple of 16), SMOOTH 0 | 1. ABI: `PrepassParams` (Rust mirror
// `PrepassParams` in src/int8_prepass.rs).
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(ELEM) || !defined(PASS)
#error "int8_prepass.cu needs HEAD_DIM, ELEM, PASS"
#endif
static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "head dim 64 or 128");
static_assert(ELEM >= 0 && ELEM <= 2, "ELEM 0 (f16), 1 (bf16) or 2 (f32)");

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int CPR = D / 8;          // lanes (8-channel chunks) per row
constexpr int RPI = 32 / CPR;       // rows per warp-wide load
constexpr int NR = 16 / RPI;        // rows per lane
constexpr int THREADS = 256;
constexpr int CHUNK = 256;          // keys per PASS 0 CTA
constexpr int ELEM_BYTES = ELEM == 2 ? 4 : 2;
}  // namespace cfg

struct PrepassParams {
    u64 q, k;                           // inputs, ELEM
    u64 q_codes, k_codes;               // int8, the inputs' strides
    u64 q_scale, k_scale;               // f32 scale layouts
    u64 mean;                           // f32 [batch][kv_heads][D]         (SMOOTH)
    u64 partial;                        // f64 [batch][kv_heads][chunks][D] (SMOOTH)
    u64 lse_shift;                      // f32 [batch][q_heads][q_len]      (SMOOTH)
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // elements; head dim contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    int batch, q_heads, kv_heads, q_len, kv_len, kv_group;
    int q_blocks, k_blocks, chunks;
    float fold;                         // softmax_scale * log2 e, into the stored Q scales
    float softmax_scale;                // of the LSE shift
};

// 8 consecutive input elements (16-byte aligned for 2-byte types, 32 for f32) as f32.
__device__ __forceinline__ void thread_load8(float (&x)[8], const void* src) {
#if ELEM == 2
    const float4 a = __ldg(reinterpret_cast<const float4*>(src));
    const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 1);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
#else
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if ELEM == 0
        thread_unpack_f16x2(w[i], x[2 * i], x[2 * i + 1]);
#else
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
#endif
    }
#endif
}

#if PASS == 0
// Partial channel sums of CHUNK keys in f64: thread t sums channels 8 (t % CPR) .. +7 of keys
// t / CPR + (THREADS / CPR) * i, then the CTA adds its THREADS / CPR row partials.
extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) int8_prepass(const PrepassParams p) {
    constexpr int ROWS = cfg::THREADS / cfg::CPR;
    __shared__ double part[ROWS][cfg::D];
    const int tid = threadIdx.x;
    const int c = tid % cfg::CPR;
    const int r = tid / cfg::CPR;
    const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const unsigned char* k = reinterpret_cast<const unsigned char*>(p.k) +
                             ((i64)b * p.k_batch_stride + (i64)h * p.k_head_stride + 8 * c) * cfg::ELEM_BYTES;
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int key_end = min(p.kv_len, (chunk + 1) * cfg::CHUNK);
    // CHUNK / ROWS keys per thread, loaded 4 at a time before they are added (one load in
    // flight per thread left this pass latency-bound).
    constexpr int PER = cfg::CHUNK / ROWS, BATCH = 4;
    static_assert(PER % BATCH == 0, "whole batches");
#pragma unroll 1
    for (int i0 = 0; i0 < PER; i0 += BATCH) {
        float x[BATCH][8];
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            const int j = chunk * cfg::CHUNK + r + ROWS * (i0 + i);
            if (j < key_end) thread_load8(x[i], k + (i64)j * p.k_seq_stride * cfg::ELEM_BYTES);
            else
#pragma unroll
                for (int e = 0; e < 8; ++e) x[i][e] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < BATCH; ++i)
#pragma unroll
            for (int e = 0; e < 8; ++e) s[e] += (double)x[i][e];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) part[r][8 * c + e] = s[e];
    __syncthreads();
    for (int ch = tid; ch < cfg::D; ch += cfg::THREADS) {
        double t = 0;
#pragma unroll 4
        for (int i = 0; i < ROWS; ++i) t += part[i][ch];
        reinterpret_cast<double*>(p.partial)[(((i64)b * p.kv_heads + h) * p.chunks + chunk) * cfg::D + ch] = t;
    }
}
#elif PASS == 1
// mu = (sum of the chunk partials, in chunk order) / kv_len in f64, rounded to f32 once.
extern "C" __global__ void __launch_bounds__(cfg::D) int8_prepass(const PrepassParams p) {
    const i64 bh = blockIdx.x;
    const int ch = threadIdx.x;
    const double* part = reinterpret_cast<const double*>(p.partial) + bh * p.chunks * cfg::D + ch;
    double t = 0;
#pragma unroll 8
    for (int i = 0; i < p.chunks; ++i) t += part[(i64)i * cfg::D];
    reinterpret_cast<float*>(p.mean)[bh * cfg::D + ch] = (float)(t / (double)p.kv_len);
}
#else
#if !defined(BLOCK_Q) || !defined(BLOCK_K) || !defined(Q_GRAN) || !defined(Q_RPW) || !defined(SMOOTH)
#error "PASS 2 needs BLOCK_Q, BLOCK_K, Q_GRAN, Q_RPW, SMOOTH"
#endif
static_assert(BLOCK_Q % 16 == 0 && BLOCK_Q <= 128 && BLOCK_K % 16 == 0 && BLOCK_K <= 128, "blocks of 16..128 rows");
static_assert(Q_RPW % 16 == 0 && BLOCK_Q % Q_RPW == 0, "layout warps of 16k rows");
static_assert(Q_GRAN != 2 || Q_RPW == 16, "per-thread scales need 16 rows per layout warp");

namespace cfg {
constexpr int Q_SLOTS = Q_GRAN == 0 ? 1 : Q_GRAN == 1 ? BLOCK_Q / Q_RPW : (BLOCK_Q / 16) * 8;
}

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

// The code byte of x under scale (f = thread_prescale(scale)), in the low 8 bits: the
// correctly rounded f32 quotient, then round half to even (the codec rounds at both points).
__device__ __forceinline__ u32 thread_code(float x, float scale, float f) {
    const float q = thread_div_inline(thread_mul_rn(x, f), thread_mul_rn(scale, f));
    int c;
    asm("cvt.rni.s32.f32 %0, %1;\n" : "=r"(c) : "f"(q));
    c = max(-127, min(127, c));
    return (u32)c & 0xffu;
}

// Max over the CPR lanes of a row (they are consecutive, CPR-aligned).
__device__ __forceinline__ float row_max(float a) {
#pragma unroll
    for (int o = 1; o < cfg::CPR; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

// At least 2 CTAs (16 warps) per SM: the loads of a CTA are all issued before its first use.
// (3 CTAs cap registers at 80, which spills the hd 128 tile.)
extern "C" __global__ void __launch_bounds__(cfg::THREADS, 2) int8_prepass(const PrepassParams p) {
    __shared__ float warp_amax[cfg::THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = lane % cfg::CPR;
    const int q_ctas = p.batch * p.q_heads * p.q_blocks;
    const bool is_q = (int)blockIdx.x < q_ctas;
    const int idx = is_q ? blockIdx.x : blockIdx.x - q_ctas;
    const int nblk = is_q ? p.q_blocks : p.k_blocks;
    const int heads = is_q ? p.q_heads : p.kv_heads;
    const int blk = idx % nblk;
    const int h = (idx / nblk) % heads;
    const int b = idx / (nblk * heads);
    const int rows = is_q ? BLOCK_Q : BLOCK_K;
    const int len = is_q ? p.q_len : p.kv_len;
    const int row0 = blk * rows;                         // first sequence row of the block
    const i64 bs = is_q ? p.q_batch_stride : p.k_batch_stride;
    const i64 hs = is_q ? p.q_head_stride : p.k_head_stride;
    const i64 ss = is_q ? p.q_seq_stride : p.k_seq_stride;
    const i64 base = (i64)b * bs + (i64)h * hs + 8 * c;  // element offset of this lane's channels
    const unsigned char* src = reinterpret_cast<const unsigned char*>(is_q ? p.q : p.k);
    unsigned char* dst = reinterpret_cast<unsigned char*>(is_q ? p.q_codes : p.k_codes);
    const bool active = 16 * warp < rows;                // warps past a short block idle

    // The mean of this lane's channels (K: subtracted; Q: for the LSE shift).
    float mu[8];
#if SMOOTH
    {
        const int kvh = is_q ? h / p.kv_group : h;
        const float* m = reinterpret_cast<const float*>(p.mean) + ((i64)b * p.kv_heads + kvh) * cfg::D + 8 * c;
        const float4 a = __ldg(reinterpret_cast<const float4*>(m));
        const float4 d = __ldg(reinterpret_cast<const float4*>(m) + 1);
        mu[0] = a.x; mu[1] = a.y; mu[2] = a.z; mu[3] = a.w;
        mu[4] = d.x; mu[5] = d.y; mu[6] = d.z; mu[7] = d.w;
    }
#else
#pragma unroll
    for (int e = 0; e < 8; ++e) mu[e] = 0.f;
#endif

    // Load (rows past the sequence end stay 0 and add nothing to amax), smooth K, row amax.
    float x[cfg::NR][8];
    float amax[cfg::NR];
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int r = 16 * warp + lane / cfg::CPR + cfg::RPI * i;   // block row
        const int row = row0 + r;
        if (active && r < rows && row < len) {
            thread_load8(x[i], src + (base + (i64)row * ss) * cfg::ELEM_BYTES);
#if SMOOTH
            if (!is_q) {
#pragma unroll
                for (int e = 0; e < 8; ++e) x[i][e] = thread_sub_rn(x[i][e], mu[e]);
            }
#endif
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[i][e] = 0.f;
        }
        float a = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(x[i][e]));
        amax[i] = row_max(a);
    }

    // Group amax per row. K and Q PerBlock: the block; Q PerWarp: Q_RPW rows; Q PerThread:
    // rows g and g + 8 of the warp (entries i and i + NR / 2 of the same lane).
    const int gran = is_q ? Q_GRAN : 0;
    float g_amax[cfg::NR];
    if (gran == 2) {
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) g_amax[i] = fmaxf(amax[i], amax[(i + cfg::NR / 2) % cfg::NR]);
    } else {
        float w = 0.f;
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) w = fmaxf(w, amax[i]);
#pragma unroll
        for (int o = cfg::CPR; o < 32; o <<= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
        if (lane == 0) warp_amax[warp] = active ? w : 0.f;
        __syncthreads();
        const int span = gran == 1 ? Q_RPW / 16 : cfg::THREADS / 32;   // warps per group
        const int first = gran == 1 ? (warp / span) * span : 0;
        float t = 0.f;
        for (int v = first; v < first + span; ++v) t = fmaxf(t, warp_amax[v]);
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
                const int r = 16 * warp + lane / cfg::CPR + cfg::RPI * i;   // rows 0..7 of the warp
                int slot = -1;
                if (Q_GRAN == 0) slot = (r == 0) ? 0 : -1;
                else if (Q_GRAN == 1) slot = (r % Q_RPW == 0) ? r / Q_RPW : -1;
                else slot = warp * 8 + (r % 16);
                if (slot >= 0) scales[sbase + slot] = thread_mul_rn(thread_scale_for(g_amax[i]), p.fold);
            }
        }
    } else if (tid == 0) {
        scales[((i64)b * p.kv_heads + h) * p.k_blocks + blk] = thread_scale_for(g_amax[0]);
    }

    // Codes: 8 bytes per lane and row, coalesced per row.
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int r = 16 * warp + lane / cfg::CPR + cfg::RPI * i;
        const int row = row0 + r;
        if (r < rows && row < len) {
            const float s = thread_scale_for(g_amax[i]);
            const float f = thread_prescale(s);
            u32 lo = 0, hi = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                lo |= thread_code(x[i][e], s, f) << (8 * e);
                hi |= thread_code(x[i][4 + e], s, f) << (8 * e);
            }
            unsigned char* out = dst + base + (i64)row * ss;
            asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" :: "l"(out), "r"(lo), "r"(hi) : "memory");
        }
    }

#if SMOOTH
    // LSE shift of each Q row: the dot with mu in channel order, lane c = 0, 1, ... in turn.
    if (is_q) {
        float acc[cfg::NR];
#pragma unroll
        for (int i = 0; i < cfg::NR; ++i) acc[i] = 0.f;
#pragma unroll 1
        for (int step = 0; step < cfg::CPR; ++step) {
            if (c == step) {
#pragma unroll
                for (int i = 0; i < cfg::NR; ++i)
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[i] = thread_add_rn(acc[i], thread_mul_rn(x[i][e], mu[e]));
            }
#pragma unroll
            for (int i = 0; i < cfg::NR; ++i) {
                const float prev = __shfl_up_sync(0xffffffffu, acc[i], 1);
                if (c == step + 1) acc[i] = prev;
            }
        }
        if (c == cfg::CPR - 1) {
            float* shift = reinterpret_cast<float*>(p.lse_shift) + ((i64)b * p.q_heads + h) * p.q_len;
#pragma unroll
            for (int i = 0; i < cfg::NR; ++i) {
                const int row = row0 + 16 * warp + lane / cfg::CPR + cfg::RPI * i;
                if (row < len) shift[row] = thread_mul_rn(acc[i], p.softmax_scale);
            }
        }
    }
#endif
}
#endif
