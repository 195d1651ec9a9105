// Merge of attention states by their LSE: the second step of split-KV decode (fwd_decode.cu).
//
// A state is, per query row, the attention output O_s over a subset of the keys (normalized over
// that subset) and LSE_s, the natural log of its softmax denominator. Over the union of disjoint
// key subsets: LSE = log Σ_s exp(LSE_s) and O = Σ_s exp(LSE_s - LSE) O_s. Computed as
// M = max_s LSE_s, W = Σ_s exp(LSE_s - M), LSE = M + ln W, O = Σ_s (exp(LSE_s - M) / W) O_s, so no
// exponent overflows. States with LSE_s = -inf (no visible key) weigh 0 and their O is never
// read; a row whose states are all -inf gets O = 0 and LSE = -inf, the convention of every
// quattn kernel.
//
// Input: `splits` states per row as f32, O at part_o[(pair * splits + s) * rows + r][D] and LSE
// at part_lse[(pair * splits + s) * rows + r], pair = batch * kv_heads + kv_head, r = h * q_len
// + i (the packed rows of fwd_decode.cu). Output: O (16-bit, strided) at (batch, kv_head * group
// + h, i) and the LSE at [batch, q_heads, q_len]. One warp per row; each lane owns D / 32
// consecutive dims, so a state's O row is one coalesced warp load.
//
// Attention sinks (MODS 1, a second kernel argument `ModParams` of common.cuh, the decode
// kernel's): the states of fwd_decode.cu's MODS variants leave the sink out, and the merge adds
// exp(sink) of the row's Q head to the denominator once, for a row some state saw a key in (a
// row that sees no key stays O = 0, LSE = -inf, sink or not).
//
// Compile-time parameters: HEAD_DIM (64 | 128), OUT_BF16 (0: fp16 O, 1: bf16), MODS (0 | 1). The
// launch ABI is `MergeParams` below; the Rust mirror is `MergeParams` in src/decode.rs.
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(OUT_BF16)
#error "decode_merge.cu needs HEAD_DIM, OUT_BF16"
#endif

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int VEC = D / 32;          // dims per lane
constexpr int WARPS = 4;
static_assert(D == 64 || D == 128, "head dim 64 or 128");
}  // namespace cfg

struct MergeParams {
    u64 part_o, part_lse, o, lse;
    i64 o_batch_stride, o_head_stride, o_seq_stride;   // in elements
    int kv_heads, q_heads, q_len, group;
    int rows;            // group * q_len: rows of one (batch, KV head)
    int splits;          // states per row
    int total_rows;      // batch * kv_heads * rows
    int pad_;
};

__device__ __forceinline__ u32 thread_pack_out(float lo, float hi) {
#if OUT_BF16
    return thread_pack_bf16x2(lo, hi);
#else
    return thread_pack_f16x2(lo, hi);
#endif
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

extern "C" __global__ void __launch_bounds__(cfg::WARPS * 32) decode_merge(const MergeParams p
#if MODS
                                                                            , const __grid_constant__ ModParams mp
#endif
) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * cfg::WARPS + (threadIdx.x >> 5);
    if (row >= p.total_rows) return;   // whole warps leave together
    const int pair = row / p.rows, r = row % p.rows;
    const float* lse_in = reinterpret_cast<const float*>(p.part_lse) + (i64)pair * p.splits * p.rows + r;
    const float* o_in = reinterpret_cast<const float*>(p.part_o) + ((i64)pair * p.splits * p.rows + r) * cfg::D + lane * cfg::VEC;
    const i64 o_step = (i64)p.rows * cfg::D;   // from one state's row to the next state's

    float mx = QA_NEG_INF;
    for (int s = lane; s < p.splits; s += 32) mx = fmaxf(mx, lse_in[(i64)s * p.rows]);
    mx = warp_max(mx);
#if MODS
    // The sink, natural-log units, for a row some state saw a key in; -inf otherwise.
    const float sink = mx == QA_NEG_INF ? QA_NEG_INF : mp.sink_log2[(pair % p.kv_heads) * p.group + r / p.q_len] * LN2;
    mx = fmaxf(mx, sink);
#endif
    float w_sum = 0.f;
    for (int s = lane; s < p.splits; s += 32) {
        const float l = lse_in[(i64)s * p.rows];
        w_sum += l == QA_NEG_INF ? 0.f : thread_exp2((l - mx) * LOG2E);
    }
    w_sum = warp_sum(w_sum);
#if MODS
    if (sink != QA_NEG_INF) w_sum += thread_exp2((sink - mx) * LOG2E);
#endif
    const bool empty = !(w_sum > 0.f);
    const float inv = empty ? 0.f : 1.f / w_sum;

    float acc[cfg::VEC];
#pragma unroll
    for (int x = 0; x < cfg::VEC; ++x) acc[x] = 0.f;
    // 32 states at a time: lane s holds state base + s's weight, shuffled to the warp per state.
    for (int base = 0; base < p.splits; base += 32) {
        const int s_lane = base + lane;
        const float l = s_lane < p.splits ? lse_in[(i64)s_lane * p.rows] : QA_NEG_INF;
        const float w_lane = l == QA_NEG_INF ? 0.f : thread_exp2((l - mx) * LOG2E) * inv;
        const int n = min(32, p.splits - base);
#pragma unroll 4
        for (int s = 0; s < n; ++s) {
            const float w = __shfl_sync(0xffffffffu, w_lane, s);
            if (w == 0.f) continue;   // warp-uniform: an empty state's O is never read
            const float* src = o_in + (i64)(base + s) * o_step;
            if constexpr (cfg::VEC == 4) {
                const float4 x = *reinterpret_cast<const float4*>(src);
                acc[0] += w * x.x; acc[1] += w * x.y; acc[2] += w * x.z; acc[3] += w * x.w;
            } else {
                const float2 x = *reinterpret_cast<const float2*>(src);
                acc[0] += w * x.x; acc[1] += w * x.y;
            }
        }
    }

    const int batch = pair / p.kv_heads, kv_head = pair % p.kv_heads;
    const int head = kv_head * p.group + r / p.q_len, pos = r % p.q_len;
    unsigned short* dst = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride + (i64)head * p.o_head_stride +
                          (i64)pos * p.o_seq_stride + lane * cfg::VEC;
    if constexpr (cfg::VEC == 4) {
        const u32 a = thread_pack_out(acc[0], acc[1]), b = thread_pack_out(acc[2], acc[3]);
        asm volatile("st.global.v2.b32 [%0], {%1,%2};\n" :: "l"(dst), "r"(a), "r"(b) : "memory");
    } else {
        const u32 a = thread_pack_out(acc[0], acc[1]);
        asm volatile("st.global.b32 [%0], %1;\n" :: "l"(dst), "r"(a) : "memory");
    }
    if (lane == 0)
        reinterpret_cast<float*>(p.lse)[((i64)batch * p.q_heads + head) * p.q_len + pos] =
            empty ? QA_NEG_INF : (mx * LOG2E + thread_log2(w_sum)) * LN2;
}
