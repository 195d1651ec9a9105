// 4-bit block-scaled quantization prepass (NVFP4 or MXFP4) of one attention input, on the
// attention kernel's stream. The recipe is quattn's `codec::nvfp4` / `codec::mxfp4`, bit for bit:
// every rounding below is the codec's (f32, round to nearest even, no contraction: the products
// and quotients are __fmul_rn / __fdiv_rn so no compiler flag can fuse or approximate them).
//
// NVFP4 (FORMAT 0), two launches of this entry:
//   MODE 0: amax = max |x| over the tensor, as f32 bits through atomicMax on an unsigned word
//           (non-negative floats order like their bit patterns); the word must be 0 before.
//   MODE 1: tensor_scale = amax / 2688 (1 if amax == 0, at least FLT_MIN); per block of 16 along
//           the head dim: code = ue4m3((amax_block / 6) / tensor_scale); per element:
//           e2m1(x / (ue4m3_value(code) * tensor_scale)), 0 if that divisor is 0.
// MXFP4 (FORMAT 1), MODE 1 only: per block of 32, e8m0 code of 2^(floor(log2 amax_block) - 2)
//   (clamped to [-127, 127], 2^-127 for a zero block), element e2m1(x / 2^e).
//
// Output layout (the one the sm_120a block-scaled MMA reads without conversion; see
// native/src/nvfp4_quant.rs): rows in (batch, head, seq) order whatever the source strides,
// codes `[rows, HEAD_DIM / 2]` bytes with element 2i in the low nibble, scales
// `[rows, HEAD_DIM / BLOCK]` bytes. For NVFP4 the four scales of a 64-element MMA k-step of one
// row are then one little-endian u32 (byte j = elements 16j..16j+15), which is exactly the
// scale_vec::4X operand of `mma...kind::mxf4nvf4.block_scale`.
//
// VT 1 (the V operand of the FP4 P·V MMA): the quantize pass reads V and writes Vᵀ, rows
// (batch, head, channel), `kv_pad = ceil(seq / 64) · 64` keys per row, blocks along the keys;
// keys past seq are zeros (code 0; an all-padding block gets scale 0). The amax pass is the same
// (it reads every element once in any order).
//
// Defines: HEAD_DIM (multiple of 32), FORMAT (0 NVFP4, 1 MXFP4), DTYPE (0 f16, 1 bf16 source),
// VT (0 | 1).
// One thread per scale block: two (NVFP4) or four (MXFP4) 16-byte loads, one 8- or 16-byte code
// store, one scale byte.
#include "common.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef FORMAT
#define FORMAT 0
#endif
#ifndef DTYPE
#define DTYPE 0
#endif
#ifndef VT
#define VT 0
#endif
// Keys per Vᵀ row are padded to the attention kernel's K/V tile.
#define VT_PAD 64

#define BLOCK (FORMAT == 0 ? 16 : 32)
static_assert(HEAD_DIM % 32 == 0, "HEAD_DIM must be a multiple of 32 (16-byte loads of whole blocks)");
#define BLOCKS_PER_ROW (HEAD_DIM / BLOCK)
#define THREADS 256
// Largest grid of the amax pass (a few CTAs per SM on every target; more would only add atomics).
#define AMAX_CTAS 1024

struct Nvfp4QuantParams {
    u64 src;          // f16 / bf16 elements with the strides below (head dim contiguous)
    u64 codes;        // u8 [rows, HEAD_DIM / 2]
    u64 scales;       // u8 [rows, HEAD_DIM / BLOCK]
    u64 amax;         // u32: f32 bits of max |x| (NVFP4)
    u64 tensor_scale; // f32 out (NVFP4; written by MODE 1)
    i64 batch_stride;
    i64 head_stride;
    i64 seq_stride;
    int heads;
    int seq_len;
    int rows;         // batch * heads * seq_len
    int mode;         // 0: amax, 1: quantize
};

// 2^e for e in [-149, 127], exact (built from bits, like the codec's pow2).
__device__ __forceinline__ float thread_pow2(int e) {
    return e >= -126 ? __uint_as_float((u32)(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

// The codec's Minifloat::encode_magnitude: code of the grid point nearest to a >= 0 (finite),
// ties to even, exponent range unbounded above (the caller saturates).
__device__ __forceinline__ u32 thread_encode_magnitude(float a, int man_bits, int bias) {
    if (a == 0.f) return 0;
    const int emin = 1 - bias;
    const u32 bits = __float_as_uint(a);
    const int exp_field = (int)(bits >> 23);
    const int e = exp_field == 0 ? emin - 1 : exp_field - 127;
    const int e_eff = e > emin ? e : emin;
    const float n = rintf(__fmul_rn(a, thread_pow2(man_bits - e_eff)));
    return ((u32)(e_eff + bias - 1) << man_bits) + (u32)n;
}

// E2M1 code (sign in bit 3), saturating to +-6, non-finite -> +-6 (codec e2m1::encode).
__device__ __forceinline__ u32 thread_e2m1_encode(float x) {
    const u32 sign = (__float_as_uint(x) >> 31) << 3;
    const float a = fabsf(x);
    if (!(a <= 3.402823466e38f)) return sign | 7u;
    const u32 c = thread_encode_magnitude(a, 1, 1);
    return sign | (c < 7u ? c : 7u);
}

// UE4M3 scale code (codec ue4m3::encode): NaN -> 0x7F, <= 0 -> 0, saturating at 448 (0x7E).
__device__ __forceinline__ u32 thread_ue4m3_encode(float x) {
    if (x != x) return 0x7Fu;
    if (x <= 0.f) return 0u;
    if (x > 3.402823466e38f) return 0x7Eu;
    const u32 c = thread_encode_magnitude(x, 3, 7);
    return c < 0x7Eu ? c : 0x7Eu;
}

// Value of a UE4M3 code below 0x7F (exact).
__device__ __forceinline__ float thread_ue4m3_decode(u32 code) {
    const int exp_field = (int)(code >> 3);
    const u32 man = code & 7u;
    return exp_field == 0 ? (float)man * thread_pow2(-9) : (float)(8u + man) * thread_pow2(exp_field - 10);
}

// floor(log2 a) of a positive finite float from its bits (subnormals included).
__device__ __forceinline__ int thread_floor_log2(float a) {
    const u32 bits = __float_as_uint(a) & 0x7fffffffu;
    const int exp_field = (int)(bits >> 23);
    return exp_field != 0 ? exp_field - 127 : -149 + (31 - __clz((int)bits));
}

__device__ __forceinline__ float thread_half_to_f32(unsigned short h) {
#if DTYPE == 0
    float f;
    asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }\n" : "=f"(f) : "h"(h));
    return f;
#else
    return __uint_as_float((u32)h << 16);
#endif
}

// The BLOCK source elements of scale block `blk` (row-major over (batch, head, seq, block)).
__device__ __forceinline__ void thread_load_block(const Nvfp4QuantParams& p, int blk, float (&x)[BLOCK]) {
    const int row = blk / BLOCKS_PER_ROW;
    const int bi = blk - row * BLOCKS_PER_ROW;
    const int s = row % p.seq_len;
    const int h = (row / p.seq_len) % p.heads;
    const int b = row / (p.seq_len * p.heads);
    const unsigned short* src = reinterpret_cast<const unsigned short*>(p.src) + b * p.batch_stride +
                                h * p.head_stride + (i64)s * p.seq_stride + bi * BLOCK;
#pragma unroll
    for (int v = 0; v < BLOCK / 8; ++v) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(src) + v);
        const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            x[8 * v + 2 * j] = thread_half_to_f32((unsigned short)(ws[j] & 0xffffu));
            x[8 * v + 2 * j + 1] = thread_half_to_f32((unsigned short)(ws[j] >> 16));
        }
    }
}

#if VT
// The BLOCK keys of Vᵀ block `blk`, channel fastest across threads (coalesced 2-byte loads):
// blk = ((bh · key_blocks) + kb) · HEAD_DIM + c. Returns the output row.
__device__ __forceinline__ int thread_load_vt_block(const Nvfp4QuantParams& p, int blk, int key_blocks, float (&x)[BLOCK]) {
    const int c = blk % HEAD_DIM;
    const int kb = (blk / HEAD_DIM) % key_blocks;
    const int bh = blk / (HEAD_DIM * key_blocks);
    const int h = bh % p.heads, b = bh / p.heads;
    const unsigned short* src = reinterpret_cast<const unsigned short*>(p.src) + b * p.batch_stride + h * p.head_stride + c;
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) {
        const int key = kb * BLOCK + i;
        x[i] = key < p.seq_len ? thread_half_to_f32(__ldg(src + (i64)key * p.seq_stride)) : 0.f;
    }
    return bh * HEAD_DIM + c;
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS) nvfp4_quant(const Nvfp4QuantParams p) {
    const int blk = blockIdx.x * THREADS + threadIdx.x;
    const int n_blocks = p.rows * BLOCKS_PER_ROW;
    float x[BLOCK];
#if FORMAT == 0
    if (p.mode == 0) {
        // Grid-stride over the blocks with a grid of at most AMAX_CTAS, then one atomic per CTA:
        // atomics on one word serialize in L2, so their count, not the read, would set the time.
        float m = 0.f;
        for (int i = blk; i < n_blocks; i += gridDim.x * THREADS) {
            thread_load_block(p, i, x);
#pragma unroll
            for (int j = 0; j < BLOCK; ++j) m = fmaxf(m, fabsf(x[j]));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        __shared__ float warp_max[THREADS / 32];
        if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
        __syncthreads();
        if (threadIdx.x == 0) {
#pragma unroll
            for (int w = 1; w < THREADS / 32; ++w) m = fmaxf(m, warp_max[w]);
            atomicMax(reinterpret_cast<u32*>(p.amax), __float_as_uint(m));
        }
        return;
    }
#endif
    float bamax = 0.f;
#if VT
    const int kv_pad = (p.seq_len + VT_PAD - 1) / VT_PAD * VT_PAD;
    const int key_blocks = kv_pad / BLOCK;
    const int out_blocks = (p.rows / p.seq_len) * HEAD_DIM * key_blocks;
    int out_row = 0;
    if (blk < out_blocks) {
        out_row = thread_load_vt_block(p, blk, key_blocks, x);
#else
    const int out_blocks = n_blocks;
    if (blk < n_blocks) {
        thread_load_block(p, blk, x);
#endif
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) bamax = fmaxf(bamax, fabsf(x[i]));
    }
#if FORMAT == 0
    const float amax = __uint_as_float(*reinterpret_cast<const u32*>(p.amax));
    float ts = 1.f;
    if (amax != 0.f) ts = fmaxf(__fdiv_rn(amax, 2688.f), 1.175494351e-38f);
    if (blk == 0) *reinterpret_cast<float*>(p.tensor_scale) = ts;
    if (blk >= out_blocks) return;
    const u32 sc = thread_ue4m3_encode(__fdiv_rn(__fdiv_rn(bamax, 6.f), ts));
    const float denom = __fmul_rn(thread_ue4m3_decode(sc), ts);
#else
    if (blk >= out_blocks) return;
    const int e = bamax == 0.f ? -127 : max(-127, min(127, thread_floor_log2(bamax) - 2));
    const u32 sc = (u32)(e + 127);
    const float denom = thread_pow2(e);
#endif
    u32 packed[BLOCK / 8];
#pragma unroll
    for (int w = 0; w < BLOCK / 8; ++w) {
        u32 word = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const u32 c = denom == 0.f ? 0u : thread_e2m1_encode(__fdiv_rn(x[8 * w + j], denom));
            word |= c << (4 * j);
        }
        packed[w] = word;
    }
#if VT
    const i64 out_blk = (i64)out_row * key_blocks + (blk / HEAD_DIM) % key_blocks;
#else
    const i64 out_blk = blk;
#endif
    unsigned char* codes = reinterpret_cast<unsigned char*>(p.codes) + out_blk * (BLOCK / 2);
#if FORMAT == 0
    *reinterpret_cast<uint2*>(codes) = make_uint2(packed[0], packed[1]);
#else
    *reinterpret_cast<uint4*>(codes) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
#endif
    reinterpret_cast<unsigned char*>(p.scales)[out_blk] = (unsigned char)sc;
}
