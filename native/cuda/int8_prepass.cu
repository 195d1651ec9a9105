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
//   lse_shift[row] = (sum over c in channel order of q[c] * mu[c]) * softmax_scale, every
//                    product and sum rounded to f32 (mul.rn / add.rn, no FMA contraction)
//   V: v_scale[c] = amax_c / 448 (1 when amax_c = 0), v_inv[c] = 1 / v_scale[c] (div.rn),
//      code = e4m3_rn_satfinite(v * v_inv[c]) (mul.rn, then cvt.rn.satfinite.e4m3x2)
// The mean is accumulated in f64 (the codec's too) in another order, then rounded to f32 once.
//
// One source, two passes (-D PASS), each its own cubin with the entry `int8_prepass`:
//   PASS 0  stats (only with SMOOTH or V_FP8): grid (chunks, kv_heads, batch), CHUNK keys per
//           CTA: f64 channel sums of K, f32 channel amax of |V|, written as per-chunk partials.
//           The CTA that finishes a (batch, kv head) last (an atomic ticket per (batch, kv
//           head), reset by that CTA for the next launch) reduces its partials into the mean
//           (f64, rounded to f32 once) and the V scales: no second launch, no host wait.
//   PASS 1  quantize: 1-D grid. V tiles (V_FP8), then K CTAs, both in reverse order of the
//           stats pass's reads (the last K and V rows it read are the likeliest still in L2),
//           then Q CTAs. 256 threads per CTA.
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
// Codes. x / scale rounded to f32 then to an integer is the codec's code; the kernel computes
// q' = x * r with r = fl(1 / scale) instead: |q' - x / scale| <= 2^-23 * 127.5 < 1.6e-5 and
// |fl(x / scale) - x / scale| <= 2^-24 * 127.5, so where q' is farther than 2^-14 from a
// half-integer both round to the same integer (and that integer is within [-127, 127]); else
// (about 1 code in 4000) the exact path divides with the correctly rounded thread_div_inline.
// q' rounds to an integer by adding 1.5 * 2^23 (the sum's ulp is 1): the code is the low byte
// of the sum's bits.
//
// LSE shift. Each Q row's dot with mu is a chain of 128 (64) dependent f32 adds in channel order.
// Per warp, the products of 8 rows at a time go to shared memory ([8][D + 4] floats: the
// padding puts the 8 rows' same columns in distinct bank groups) and 8 lanes each run one row's
// chain with 16-byte loads.
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
// Compile-time parameters: HEAD_DIM 64 | 128, ELEM 0 f16 | 1 bf16 | 2 f32, PASS 0 | 1, SMOOTH
// 0 | 1, V_FP8 0 | 1; PASS 1 also BLOCK_Q, BLOCK_K (multiples of 16, at most 128), Q_GRAN 0 |
// 1 | 2, Q_RPW (rows per layout warp, a multiple of 16). ABI: `PrepassParams` (Rust mirror
// `PrepassParams` in src/int8_prepass.rs).
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(ELEM) || !defined(PASS) || !defined(SMOOTH) || !defined(V_FP8)
#error "int8_prepass.cu needs HEAD_DIM, ELEM, PASS, SMOOTH, V_FP8"
#endif
static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "head dim 64 or 128");
static_assert(ELEM >= 0 && ELEM <= 2, "ELEM 0 (f16), 1 (bf16) or 2 (f32)");
static_assert(PASS == 1 || SMOOTH || V_FP8, "the stats pass computes the K mean or the V scales");
#if V_FP8 && PASS == 1 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "V_FP8 writes e4m3 codes (cvt ... e4m3x2): sm_89 or newer"
#endif

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int CPR = D / 8;          // lanes (8-channel chunks) per row
constexpr int RPI = 32 / CPR;       // rows per warp-wide load
constexpr int NR = 16 / RPI;        // rows per lane
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int ELEM_BYTES = ELEM == 2 ? 4 : 2;
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
    u64 tickets;                        // u32 [batch][kv_heads], 0 between launches (stats)
    u64 lse_shift;                      // f32 [batch][q_heads][q_len]              (SMOOTH)
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // elements; head dim contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    i64 v_batch_stride, v_head_stride, v_seq_stride;
    int batch, q_heads, kv_heads, q_len, kv_len, kv_group;
    int q_blocks, k_blocks, chunks, kv_pad;
    int q_ctas, k_ctas, v_ctas;         // quantize CTAs per (batch, head) of Q, K, V
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

// 8 f32 from a 32-byte aligned address.
__device__ __forceinline__ void thread_load8_f32(float (&x)[8], const float* src) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src));
    const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 1);
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

#if PASS == 0
namespace cfg {
constexpr int CHUNK = 256;          // keys per stats CTA
constexpr float E4M3_MAX = 448.f;
}

// Per chunk: thread t sums (K) and maxes (|V|) channels 8 (t % CPR) .. +7 of keys t / CPR +
// (THREADS / CPR) * i, the CTA combines its THREADS / CPR row partials and writes the chunk's;
// the last CTA of a (batch, kv head) reduces every chunk's.
extern "C" __global__ void __launch_bounds__(cfg::THREADS, 2) int8_prepass(const PrepassParams p) {
    constexpr int ROWS = cfg::THREADS / cfg::CPR;
    constexpr int SLICES = cfg::THREADS / cfg::D;   // threads per channel in the final reduction
#if SMOOTH
    __shared__ double part_k[ROWS][cfg::D];
#endif
#if V_FP8
    __shared__ float part_v[ROWS][cfg::D];
#endif
    __shared__ bool last;
    const int tid = threadIdx.x;
    const int c = tid % cfg::CPR;
    const int r = tid / cfg::CPR;
    const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const i64 bh = (i64)b * p.kv_heads + h;
    const int key_end = min(p.kv_len, (chunk + 1) * cfg::CHUNK);
    // CHUNK / ROWS keys per thread, loaded 4 at a time before they are used (one load in
    // flight per thread leaves this pass latency-bound).
    constexpr int PER = cfg::CHUNK / ROWS, BATCH = 4;
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
        float xk[BATCH][8];
#endif
#if V_FP8
        float xv[BATCH][8];
#endif
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            const int j = chunk * cfg::CHUNK + r + ROWS * (i0 + i);
            const bool in = j < key_end;
#if SMOOTH
            if (in) thread_load8(xk[i], k.at(j, c));
            else
#pragma unroll
                for (int e = 0; e < 8; ++e) xk[i][e] = 0.f;
#endif
#if V_FP8
            if (in) thread_load8(xv[i], v.at(j, c));
            else
#pragma unroll
                for (int e = 0; e < 8; ++e) xv[i][e] = 0.f;
#endif
        }
#pragma unroll
        for (int i = 0; i < BATCH; ++i)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
#if SMOOTH
                s[e] += (double)xk[i][e];
#endif
#if V_FP8
                a[e] = fmaxf(a[e], fabsf(xv[i][e]));
#endif
            }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
#if SMOOTH
        part_k[r][8 * c + e] = s[e];
#endif
#if V_FP8
        part_v[r][8 * c + e] = a[e];
#endif
    }
    __syncthreads();
    for (int ch = tid; ch < cfg::D; ch += cfg::THREADS) {
        const i64 at = (bh * p.chunks + chunk) * cfg::D + ch;
#if SMOOTH
        double t = 0;
#pragma unroll 4
        for (int i = 0; i < ROWS; ++i) t += part_k[i][ch];
        reinterpret_cast<double*>(p.k_partial)[at] = t;
#endif
#if V_FP8
        float m = 0.f;
#pragma unroll 4
        for (int i = 0; i < ROWS; ++i) m = fmaxf(m, part_v[i][ch]);
        reinterpret_cast<float*>(p.v_partial)[at] = m;
#endif
    }
    // Publish the partials, then take a ticket: the CTA that draws the last one sees every
    // other CTA's partials (their writes were fenced before their tickets).
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const u32 ticket = atomicAdd(reinterpret_cast<u32*>(p.tickets) + bh, 1u);
        last = ticket == (u32)(p.chunks - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // SLICES threads per channel, each over the chunks s, s + SLICES, ... (L2 reads: other
    // CTAs wrote them), then combined through shared memory.
    const int ch = tid % cfg::D;
    const int slice = tid / cfg::D;
#if SMOOTH
    {
        const double* src = reinterpret_cast<const double*>(p.k_partial) + bh * p.chunks * cfg::D + ch;
        double t = 0;
#pragma unroll 4
        for (int i = slice; i < p.chunks; i += SLICES) t += __ldcg(src + (i64)i * cfg::D);
        __syncthreads();   // part_k is reused
        part_k[slice][ch] = t;
        __syncthreads();
        if (slice == 0) {
            double sum = 0;
#pragma unroll
            for (int i = 0; i < SLICES; ++i) sum += part_k[i][ch];
            reinterpret_cast<float*>(p.mean)[bh * cfg::D + ch] = (float)(sum / (double)p.kv_len);
        }
    }
#endif
#if V_FP8
    {
        const float* src = reinterpret_cast<const float*>(p.v_partial) + bh * p.chunks * cfg::D + ch;
        float m = 0.f;
#pragma unroll 4
        for (int i = slice; i < p.chunks; i += SLICES) m = fmaxf(m, __ldcg(src + (i64)i * cfg::D));
        __syncthreads();   // part_v is reused
        part_v[slice][ch] = m;
        __syncthreads();
        if (slice == 0) {
            float amax = 0.f;
#pragma unroll
            for (int i = 0; i < SLICES; ++i) amax = fmaxf(amax, part_v[i][ch]);
            const float scale = amax > 0.f ? thread_div_rn(amax, cfg::E4M3_MAX) : 1.f;
            reinterpret_cast<float*>(p.v_scale)[bh * cfg::D + ch] = scale;
            reinterpret_cast<float*>(p.v_inv)[bh * cfg::D + ch] = thread_div_rn(1.f, scale);
        }
    }
#endif
    if (tid == 0) reinterpret_cast<u32*>(p.tickets)[bh] = 0u;
}
#else
#if !defined(BLOCK_Q) || !defined(BLOCK_K) || !defined(Q_GRAN) || !defined(Q_RPW)
#error "PASS 1 needs BLOCK_Q, BLOCK_K, Q_GRAN, Q_RPW"
#endif
static_assert(BLOCK_Q % 16 == 0 && BLOCK_Q <= 128 && BLOCK_K % 16 == 0 && BLOCK_K <= 128, "blocks of 16..128 rows");
static_assert(Q_RPW % 16 == 0 && BLOCK_Q % Q_RPW == 0, "layout warps of 16k rows");
static_assert(Q_GRAN != 2 || Q_RPW == 16, "per-thread scales need 16 rows per layout warp");

namespace cfg {
constexpr int VT_KEYS = 128;                        // keys per V tile (and the Vᵀ row padding)
constexpr int Q_SLOTS = Q_GRAN == 0 ? 1 : Q_GRAN == 1 ? BLOCK_Q / Q_RPW : (BLOCK_Q / 16) * 8;
constexpr int Q_ROWS = BLOCK_Q * (128 / BLOCK_Q);   // rows per Q CTA: whole blocks
constexpr int K_ROWS = BLOCK_K * (128 / BLOCK_K);   // rows per K CTA
constexpr int LSE_STRIDE = D + 4;                   // floats per row of the LSE-shift products
constexpr int VT_STRIDE = D + 4;                    // bytes per key of the V code tile
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

// The code of x under scale, exactly as the codec rounds (the quotient rounded to f32, then
// half to even), clamped; f = thread_prescale(scale).
__device__ __forceinline__ int thread_code_exact(float x, float scale, float f) {
    const float q = thread_div_inline(thread_mul_rn(x, f), thread_mul_rn(scale, f));
    int c;
    asm("cvt.rni.s32.f32 %0, %1;\n" : "=r"(c) : "f"(q));
    return max(-127, min(127, c));
}

// One group's quantization constants: the scale, fl(1 / scale) (inf for a scale too small to
// invert, which sends every nonzero code to the exact path) and the prescale of the exact path.
struct CodeScale {
    float s, r, f;
    __device__ __forceinline__ void set(float scale) {
        s = scale;
        f = thread_prescale(scale);
        r = thread_mul_rn(thread_div_inline(1.f, thread_mul_rn(scale, f)), f);
    }
    // The code bytes of 8 values of one row, 4 per word, element 0 in the lowest byte (header:
    // the product path, and the exact division where a quotient lies within 2^-14 of a
    // half-integer, one branch per row, rarely taken).
    __device__ __forceinline__ void codes8(const float (&x)[8], u32& lo, u32& hi) const {
        u32 c[8];
        float d[8];
        bool ok = true;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float q = thread_mul_rn(x[e], r);
            const float b = thread_add_rn(q, 12582912.f);      // 1.5 * 2^23 + rne(q)
            d[e] = thread_sub_rn(q, thread_sub_rn(b, 12582912.f));
            c[e] = __float_as_uint(b);                         // the code in the low byte
            // |d| <= 0.5 - 2^-14 (false for NaN and inf): q is safely away from a half-integer.
            ok &= fabsf(d[e]) < 0.49993896484375f;
        }
        if (!ok) {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (!(fabsf(d[e]) < 0.49993896484375f)) c[e] = (u32)thread_code_exact(x[e], s, f);
        }
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

// Shared memory of a quantize CTA: the LSE-shift products (Q CTAs) or the V code tile (V CTAs).
union QuantSmem {
    float lse[cfg::WARPS][8][cfg::LSE_STRIDE];
    unsigned char vt[cfg::VT_KEYS][cfg::VT_STRIDE];
};

// The V tile of keys [128 t, 128 t + 128) of (b, h): codes into the shared tile, then Vᵀ.
__device__ __forceinline__ void cta_quantize_v(const PrepassParams& p, QuantSmem& sm, int b, int h, int t) {
#if V_FP8
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = lane % cfg::CPR;
    const i64 bh = (i64)b * p.kv_heads + h;
    const Rows v(p.v, p.v_batch_stride, p.v_head_stride, p.v_seq_stride, b, h);
    float inv[8];
    thread_load8_f32(inv, reinterpret_cast<const float*>(p.v_inv) + bh * cfg::D + 8 * c);
    float x[cfg::NR][8];
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int key = cfg::VT_KEYS * t + 16 * warp + lane / cfg::CPR + cfg::RPI * i;
        if (key < p.kv_len) thread_load8(x[i], v.at(key, c));
        else
#pragma unroll
            for (int e = 0; e < 8; ++e) x[i][e] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int r = 16 * warp + lane / cfg::CPR + cfg::RPI * i;
        u32 w[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float* y = x[i] + 4 * half;
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
    (void)p; (void)sm; (void)b; (void)h; (void)t;
#endif
}

// At least 2 CTAs (16 warps) per SM: the loads of a CTA are all issued before its first use.
extern "C" __global__ void __launch_bounds__(cfg::THREADS, 2) int8_prepass(const PrepassParams p) {
    __shared__ float warp_amax[cfg::WARPS];
    __shared__ __align__(16) QuantSmem sm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = lane % cfg::CPR;
    const int v_all = V_FP8 ? p.batch * p.kv_heads * p.v_ctas : 0;
    const int k_all = p.batch * p.kv_heads * p.k_ctas;
    int cta = blockIdx.x;
    if (cta < v_all) {
        const int idx = v_all - 1 - cta;                  // reverse order (header)
        cta_quantize_v(p, sm, idx / (p.kv_heads * p.v_ctas), (idx / p.v_ctas) % p.kv_heads, idx % p.v_ctas);
        return;
    }
    cta -= v_all;
    const bool is_q = cta >= k_all;
    const int idx = is_q ? cta - k_all : k_all - 1 - cta;   // K in reverse order
    const int nctas = is_q ? p.q_ctas : p.k_ctas;
    const int heads = is_q ? p.q_heads : p.kv_heads;
    const int tile = idx % nctas;
    const int h = (idx / nctas) % heads;
    const int b = idx / (nctas * heads);
    const int block = is_q ? BLOCK_Q : BLOCK_K;
    const int rows = is_q ? cfg::Q_ROWS : cfg::K_ROWS;
    const int len = is_q ? p.q_len : p.kv_len;
    const int nblocks = is_q ? p.q_blocks : p.k_blocks;
    const int row0 = tile * rows;                         // first sequence row of the CTA
    const int blk = (row0 + 16 * warp) / block;           // this warp's scale block
    const Rows src = is_q ? Rows(p.q, p.q_batch_stride, p.q_head_stride, p.q_seq_stride, b, h)
                          : Rows(p.k, p.k_batch_stride, p.k_head_stride, p.k_seq_stride, b, h);
    const i64 cbase = is_q ? (i64)b * p.q_batch_stride + (i64)h * p.q_head_stride + 8 * c
                           : (i64)b * p.k_batch_stride + (i64)h * p.k_head_stride + 8 * c;
    const i64 cstride = is_q ? p.q_seq_stride : p.k_seq_stride;
    unsigned char* dst = reinterpret_cast<unsigned char*>(is_q ? p.q_codes : p.k_codes);
    const bool active = 16 * warp < rows && blk < nblocks;   // warps past the last block idle

    // The mean of this lane's channels (K: subtracted; Q: for the LSE shift).
    float mu[8];
#if SMOOTH
    thread_load8_f32(mu, reinterpret_cast<const float*>(p.mean) + ((i64)b * p.kv_heads + (is_q ? h / p.kv_group : h)) * cfg::D + 8 * c);
#else
#pragma unroll
    for (int e = 0; e < 8; ++e) mu[e] = 0.f;
#endif

    // Load (rows past the sequence end stay 0 and add nothing to amax), smooth K, amax.
    float x[cfg::NR][8];
    float amax[cfg::NR];
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int row = row0 + 16 * warp + lane / cfg::CPR + cfg::RPI * i;
        if (active && row < len) {
            thread_load8(x[i], src.at(row, c));
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
        amax[i] = a;
    }

    // Group amax per row. Q PerThread: rows g and g + 8 of the warp (entries i and i + NR / 2
    // of the same lane, after the row's CPR-lane reduction). Else the warp's amax, combined
    // over the group's warps: Q PerWarp Q_RPW rows, Q PerBlock and K the block.
    const int gran = is_q ? Q_GRAN : 0;
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
        const int span = gran == 1 ? Q_RPW / 16 : block / 16;   // warps per group
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
    CodeScale cs[cfg::NR / 2];
#pragma unroll
    for (int i = 0; i < cfg::NR / 2; ++i) cs[i].set(thread_scale_for(g_amax[i]));
#pragma unroll
    for (int i = 0; i < cfg::NR; ++i) {
        const int row = row0 + 16 * warp + lane / cfg::CPR + cfg::RPI * i;
        if (row < len) {
            u32 lo, hi;
            cs[i % (cfg::NR / 2)].codes8(x[i], lo, hi);
            unsigned char* out = dst + cbase + (i64)row * cstride;
            asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" :: "l"(out), "r"(lo), "r"(hi) : "memory");
        }
    }

#if SMOOTH
    // LSE shift of each Q row (header): 8 rows of the warp at a time, their products through
    // shared memory, one lane per row adding them in channel order.
    if (is_q) {
        float (&buf)[8][cfg::LSE_STRIDE] = sm.lse[warp];
        float* shift = reinterpret_cast<float*>(p.lse_shift) + ((i64)b * p.q_heads + h) * p.q_len;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int i = half * cfg::NR / 2; i < (half + 1) * cfg::NR / 2; ++i) {
                const int r = lane / cfg::CPR + cfg::RPI * i - 8 * half;   // 0..7
                float pr[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) pr[e] = thread_mul_rn(x[i][e], mu[e]);
                *reinterpret_cast<float4*>(&buf[r][8 * c]) = make_float4(pr[0], pr[1], pr[2], pr[3]);
                *reinterpret_cast<float4*>(&buf[r][8 * c + 4]) = make_float4(pr[4], pr[5], pr[6], pr[7]);
            }
            __syncwarp();
            if (lane < 8) {
                float acc = 0.f;
#pragma unroll 8
                for (int ch = 0; ch < cfg::D; ch += 4) {
                    const float4 v = *reinterpret_cast<const float4*>(&buf[lane][ch]);
                    acc = thread_add_rn(acc, v.x);
                    acc = thread_add_rn(acc, v.y);
                    acc = thread_add_rn(acc, v.z);
                    acc = thread_add_rn(acc, v.w);
                }
                const int row = row0 + 16 * warp + 8 * half + lane;
                if (row < len) shift[row] = thread_mul_rn(acc, p.softmax_scale);
            }
            __syncwarp();
        }
    }
#endif
}
#endif
