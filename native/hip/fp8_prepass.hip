// FP8 quantization prepass of the HIP FP8 family (fwd_mfma_fp8.hip): Q, K and V (f16 or bf16)
// to the target's e4m3 codes with f32 descales, one per tensor or one per (batch, head), on the
// stream the attention kernel then runs on. Compiled and disassembly-checked; not run on
// hardware. The conventions are the CUDA prepass's (native/cuda/fp8_prepass.cu) on the target's
// encoding: OCP e4m3fn (max 448) on gfx950, e4m3fnuz (max 240, one zero, NaN = 0x80) on gfx942:
//   amax    = max |x| over the descale group (exact; fmaxf skips NaN elements)
//   descale = amax / MAX (IEEE division, subnormals kept), 1 when amax = 0; an infinite element
//             makes the group's descale infinite
//   code    = encode(x / descale): the quotient rounded to f32 (IEEE division), then to e4m3,
//             ties to even, saturating to +-MAX; NaN to the NaN code
// bit-exact with `quattn::codec::fp8_scaled` (e4m3fn) and `codec::fp8::e4m3fnuz` (gfx942); the
// host transliteration of `thread_encode` is `encode_e4m3` in native/src/hip/prepass.rs.
//
// Why not v_cvt_pk_fp8_f32 (`__builtin_amdgcn_cvt_pk_fp8_f32`): its rounding follows the wave's
// round mode (nearest even by default), but the builtin leaves the instruction's clamp bit off,
// so magnitudes past the format's max do not saturate (code that uses it clamps the input with
// v_med3_f32 first, and must then special-case NaN and infinity, which v_med3 does not order the
// way the codec does); how it treats f32 subnormal inputs under the wave's denormal mode, and
// which NaN code it writes on e4m3fn, are not pinned down by the ISA guides. None of that can be
// checked bit for bit against the codec without the hardware. The integer encode below is
// IEEE-defined arithmetic that the host mirror runs identically, so the codes are the codec's
// by construction. The
// quotient x / descale is the compiler's correctly rounded f32 division (v_div_scale / v_div_fmas
// / v_div_fixup, subnormals kept: HIP does not flush f32 denormals by default), which the
// compile report checks for.

// Tiling, work split and launch ABI are the CUDA prepass's, so the host side
// (`Fp8PrepassConfig::{slabs, params}` in native/src/fp8_prepass.rs) builds the parameters of
// both: a tile of 8192 elements (whole rows of one (batch, head)), 256 threads (4 waves), thread
// t loads the 16-byte pieces t + 256 j, j < 4, all before using any; Q, K, V tiles form one
// sequence in which every descale group is a contiguous range of tiles.
//   PASS 0  amax: each tile writes its partial max; the last tile of a group to arrive (an
//           atomic counter per group, reset to 0 by that tile) reduces the partials and writes
//           the descale.
//   PASS 1  quantize: each tile reads its group's descale and writes its codes, tiles in
//           reverse order of the amax pass (the first ones read what that pass read last).
//
// Compile-time parameters: ELEM 0 f16 | 1 bf16, PASS 0 | 1. ABI: `Fp8PrepassParams` (Rust
// mirror in native/src/fp8_prepass.rs); grid (tiles of the slab), block 256.
#if !defined(__HIPCC_RTC__)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#endif

#if !defined(ELEM) || !defined(PASS)
#error "fp8_prepass.hip needs ELEM and PASS"
#endif
static_assert(ELEM == 0 || ELEM == 1, "ELEM 0 (f16) or 1 (bf16)");
#if defined(__gfx950__)
#define FNUZ 0
#elif defined(__gfx942__)
#define FNUZ 1
#else
#error "fp8_prepass.hip targets gfx950 and gfx942"
#endif

typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned int u32x2 __attribute__((ext_vector_type(2)));
typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));
// Global address space: global_load/global_store rather than flat ones.
#define GLOBAL __attribute__((address_space(1)))

namespace cfg {
constexpr int THREADS = 256;
constexpr int PIECES = 4;                      // 16-byte input pieces per thread per tile
constexpr int TILE_PIECES = THREADS * PIECES;  // 1024 pieces = 8192 elements
constexpr float MAX_FINITE = FNUZ ? 240.f : 448.f;
constexpr u32 BIAS = FNUZ ? 8 : 7;
constexpr u32 MAX_CODE = FNUZ ? 0x7f : 0x7e;   // magnitude code of MAX_FINITE
}  // namespace cfg

struct Fp8PrepassTensor {
    u64 x;                                      // input, ELEM
    u64 codes;                                  // u8, the input's strides
    u64 descale;                                // f32 [groups of the tensor]
    i64 batch_stride, head_stride, seq_stride;  // elements; head dim contiguous
    int batch, heads, len;
    int tiles_per_head;
    int tile_begin;
    int group_begin;
};

struct Fp8PrepassParams {
    Fp8PrepassTensor t[3];  // Q, K, V
    u64 partial;            // f32 [tiles of the sequence]
    u64 counter;            // u32 [groups of the sequence], 0 between launches
    int tile_begin, tile_end;
    int piece_shift;        // log2(HEAD_DIM / 8)
    int per_head;
};

__device__ inline int thread_id() { return __builtin_amdgcn_workitem_id_x(); }

__device__ inline void cta_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

struct TileAt {
    Fp8PrepassTensor t;
    i64 base;
    int row0;
    int group;
    int counter;
    int group_tiles;
    int group_tile0;
};

__device__ inline TileAt tile_at(const Fp8PrepassParams& p, int g) {
    const int i = g >= p.t[2].tile_begin ? 2 : (g >= p.t[1].tile_begin ? 1 : 0);
    TileAt a;
    a.t = i == 0 ? p.t[0] : (i == 1 ? p.t[1] : p.t[2]);
    const int local = g - a.t.tile_begin;
    const int bh = local / a.t.tiles_per_head;
    const int tt = local - bh * a.t.tiles_per_head;
    const int b = bh / a.t.heads, h = bh - b * a.t.heads;
    a.row0 = tt * (cfg::TILE_PIECES >> p.piece_shift);
    a.base = (i64)b * a.t.batch_stride + (i64)h * a.t.head_stride;
    a.group = p.per_head ? bh : 0;
    a.counter = a.t.group_begin + a.group;
    a.group_tiles = p.per_head ? a.t.tiles_per_head : a.t.batch * a.t.heads * a.t.tiles_per_head;
    a.group_tile0 = a.t.tile_begin + (p.per_head ? bh * a.t.tiles_per_head : 0);
    return a;
}

// Element offset of piece j of this thread, or -1 past the head's last row.
__device__ inline i64 piece_offset(const Fp8PrepassParams& p, const TileAt& a, int j) {
    const int pc = thread_id() + cfg::THREADS * j;
    const int row = a.row0 + (pc >> p.piece_shift);
    if (row >= a.t.len) return -1;
    const int col = (pc & ((1 << p.piece_shift) - 1)) * 8;
    return a.base + (i64)row * a.t.seq_stride + col;
}

__device__ inline void thread_load_pieces(const Fp8PrepassParams& p, const TileAt& a, u32x4 (&v)[cfg::PIECES], i64 (&off)[cfg::PIECES]) {
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        off[j] = piece_offset(p, a, j);
        v[j] = off[j] >= 0 ? *(const GLOBAL u32x4*)(a.t.x + (u64)off[j] * 2) : u32x4{0, 0, 0, 0};
    }
}

// Element e (0 low, 1 high) of a 32-bit word of two inputs, as f32 (exact).
__device__ inline float thread_unpack(u32 w, int e) {
    const u32 h = e ? w >> 16 : w & 0xffffu;
#if ELEM == 0
    return (float)__builtin_bit_cast(_Float16, (unsigned short)h);
#else
    return __builtin_bit_cast(float, h << 16);
#endif
}

// The max over the workgroup, in every thread (LDS tree).
__device__ inline float cta_max(float m, float* red) {
    const int t = thread_id();
    red[t] = m;
    cta_sync();
#pragma unroll
    for (int s = cfg::THREADS / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = __builtin_fmaxf(red[t], red[t + s]);
        cta_sync();
    }
    const float r = red[0];
    cta_sync();
    return r;
}

// The target's e4m3 code of y: round to nearest even, saturating, NaN to the NaN code
// (e4m3fn: sign | 0x7f; e4m3fnuz: 0x80), and on e4m3fnuz -0 and what rounds to zero to 0x00.
__device__ inline u32 thread_encode(float y) {
    const u32 b = __builtin_bit_cast(u32, y);
    const u32 sign = (b >> 24) & 0x80u;
    const u32 a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return FNUZ ? 0x80u : (sign | 0x7fu);
    u32 code;
    if (a >= (128u - cfg::BIAS) << 23) {
        // A normal e4m3 magnitude (or past the max): rebias the exponent in place and round the
        // 23 mantissa bits to 3, ties to even (add just under half, plus the kept lsb); a carry
        // moves into the exponent as it should. Infinity lands far past MAX_CODE.
        const u32 r = a - ((127u - cfg::BIAS) << 23);
        code = (r + 0x7ffffu + ((r >> 20) & 1u)) >> 20;
    } else {
        // Subnormal e4m3: multiples of 2^(-2 - BIAS). |y| scaled by 2^(2 + BIAS) is exact (it is
        // below 2^3), so rounding it to an integer, ties to even, is the code.
        code = (u32)__builtin_rintf(__builtin_bit_cast(float, a) * (float)(1u << (2u + cfg::BIAS)));
    }
    if (code > cfg::MAX_CODE) code = cfg::MAX_CODE;
#if FNUZ
    return code == 0u ? 0u : (sign | code);
#else
    return sign | code;
#endif
}

#if PASS == 0
extern "C" __global__ void __attribute__((amdgpu_flat_work_group_size(1, 256))) fp8_prepass(const Fp8PrepassParams p) {
    __shared__ float red[cfg::THREADS];
    __shared__ int last;
    const int g = p.tile_begin + (int)__builtin_amdgcn_workgroup_id_x();
    const TileAt a = tile_at(p, g);
    u32x4 v[cfg::PIECES];
    i64 off[cfg::PIECES];
    thread_load_pieces(p, a, v, off);
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) m = __builtin_fmaxf(m, __builtin_fabsf(thread_unpack(v[j][i], e)));
    m = cta_max(m, red);
    GLOBAL float* partial = (GLOBAL float*)p.partial;
    GLOBAL u32* counter = (GLOBAL u32*)p.counter;
    if (thread_id() == 0) {
        partial[g] = m;
        // The partial is visible device-wide before the arrival that may let another
        // workgroup read it.
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
        const u32 before = __hip_atomic_fetch_add(counter + a.counter, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
        last = before == (u32)(a.group_tiles - 1);
    }
    cta_sync();
    if (!last) return;
    // Every partial of the group was released before its arrival; acquire at agent scope so
    // that no stale (non-coherent) L1 line is read.
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");
    float gm = 0.f;
    for (int i = thread_id(); i < a.group_tiles; i += cfg::THREADS) gm = __builtin_fmaxf(gm, partial[a.group_tile0 + i]);
    gm = cta_max(gm, red);
    if (thread_id() == 0) {
        ((GLOBAL float*)a.t.descale)[a.group] = gm > 0.f ? gm / cfg::MAX_FINITE : 1.f;
        // Ready for the next launch on this scratch.
        counter[a.counter] = 0u;
    }
}
#else
extern "C" __global__ void __attribute__((amdgpu_flat_work_group_size(1, 256))) fp8_prepass(const Fp8PrepassParams p) {
    const int g = p.tile_end - 1 - (int)__builtin_amdgcn_workgroup_id_x();
    const TileAt a = tile_at(p, g);
    u32x4 v[cfg::PIECES];
    i64 off[cfg::PIECES];
    thread_load_pieces(p, a, v, off);
    // Written by the amax launch before this one on the stream.
    const float d = ((const GLOBAL float*)a.t.descale)[a.group];
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        if (off[j] < 0) continue;
        u32 c[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            c[i] = thread_encode(thread_unpack(v[j][i], 0) / d) | (thread_encode(thread_unpack(v[j][i], 1) / d) << 8);
        *(GLOBAL u32x2*)(a.t.codes + (u64)off[j]) = u32x2{c[0] | (c[1] << 16), c[2] | (c[3] << 16)};
    }
}
#endif
