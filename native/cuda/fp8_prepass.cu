// FP8 quantization prepass of the native FP8 families: Q, K and V (f16 or bf16) to e4m3 or e5m2
// codes with f32 descales, one per tensor or one per (batch, head), on the stream the attention
// kernel then runs on. The numerics are the CPU codec's (`quattn::codec::fp8_scaled`), rounding
// at the same points, so codes and descales are bit-exact:
//   amax    = max |x| over the descale group (exact; fmaxf skips NaN elements)
//   descale = amax / MAX (div.rn.f32: IEEE, subnormals kept), 1 when amax = 0; MAX = 448 (e4m3) or 57344 (e5m2)
//   code    = cvt.rn.satfinite(x / descale): the quotient rounded to f32 (div.rn.f32), then to
//             the format, ties to even, saturating to +-MAX
// Codes keep the input's strides (one byte per element).
//
// Work unit: a tile of TILE = 8192 elements, whole rows of one (batch, head) (TILE / HEAD_DIM
// rows; the last tile of a head is partial). 256 threads; thread t loads the 16-byte pieces
// (8 elements) t + 256 j, j < PIECES, all before using any: consecutive threads read consecutive
// pieces of a row (coalesced), and each thread has PIECES loads in flight. The tiles of Q, K and
// V form one sequence (tensor, batch, head, tile) in which every descale group is a contiguous
// range of tiles.
//
// One source, two passes (-D PASS), each its own cubin with the entry `fp8_prepass`:
//   PASS 0  amax: each tile writes its partial max; the last tile of a group to finish (an atomic
//           arrival counter per group, which that tile resets to 0) reduces the group's partials
//           and writes the descale.
//   PASS 1  quantize: each tile reads its group's descale and writes its codes, tiles in reverse
//           order of the amax pass so that the first ones read what that pass read last (still
//           in L2).
// A launch covers the tiles [tile_begin, tile_end), whole groups; the host splits a call into
// such slabs of about the L2's size, each amax launch followed by its quantize launch, so that
// the quantize pass finds its input in L2 instead of reading it from DRAM a second time.
//   PASS 2  one read: a persistent launch of at most as many CTAs as can be co-resident. Each
//           CTA takes tiles in increasing order from an atomic work counter, keeps each tile's
//           pieces in shared memory, publishes the tile's max to its group (atomicMax on the
//           bits of the non-negative float, which order as unsigned integers, then an arrival on
//           the group's counter), takes, loads and publishes its next tile, then waits until
//           every tile of the current tile's group has arrived, computes the descale from the
//           group's max and quantizes the pieces it holds: the input is read once, and loads
//           stay in flight while groups gather. A CTA waits only on the group of its older
//           tile, and a tile of a later group is handed out only once every tile of the earlier
//           ones is, so the launch cannot deadlock when no group has more tiles than there are
//           co-resident CTAs (the host checks, else it runs PASS 0 and 1). Scratch `counter`, u32, all zero between
//           launches: [groups] arrivals then departures (the last departure writes the
//           descale and resets the group), [groups] max bits, then the work counter and the
//           count of CTAs that finished (the last one resets both).
//
// Compile-time parameters: ELEM 0 f16 | 1 bf16, FORMAT 0 e4m3 | 1 e5m2, PASS 0 | 1 | 2.
// ABI: `Fp8PrepassParams` (Rust mirror `Fp8PrepassParams` in src/fp8_prepass.rs).
#include "common.cuh"

#if !defined(ELEM) || !defined(FORMAT) || !defined(PASS)
#error "fp8_prepass.cu needs ELEM, FORMAT, PASS"
#endif
static_assert(ELEM == 0 || ELEM == 1, "ELEM 0 (f16) or 1 (bf16)");
static_assert(FORMAT == 0 || FORMAT == 1, "FORMAT 0 (e4m3) or 1 (e5m2)");
static_assert(PASS >= 0 && PASS <= 2, "PASS 0 (amax), 1 (quantize) or 2 (one read)");

namespace cfg {
constexpr int THREADS = 256;
constexpr int PIECES = 4;                      // 16-byte input pieces per thread per tile
constexpr int TILE_PIECES = THREADS * PIECES;  // 1024 pieces = 8192 elements
constexpr float MAX_FINITE = FORMAT == 0 ? 448.f : 57344.f;
// PASS 2: CTAs per SM the register budget is cut for (more co-resident CTAs: larger groups
// qualify for the one-read pass).
constexpr int ONEPASS_MIN_CTAS = 5;
}  // namespace cfg

// One of Q, K, V.
struct Fp8PrepassTensor {
    u64 x;                                  // input, ELEM
    u64 codes;                              // u8, the input's strides
    u64 descale;                            // f32 [groups of the tensor]
    i64 batch_stride, head_stride, seq_stride;  // elements; head dim contiguous
    int batch, heads, len;
    int tiles_per_head;                     // ceil(len / rows per tile)
    int tile_begin;                         // its first tile in the sequence
    int group_begin;                        // its first arrival counter
};

struct Fp8PrepassParams {
    Fp8PrepassTensor t[3];                  // Q, K, V
    u64 partial;                            // f32 [tiles of the sequence] (PASS 0)
    u64 counter;                            // u32 [groups of the sequence] (PASS 0; PASS 2: [2 groups + 2]), 0 between launches
    int tile_begin, tile_end;               // this launch's tiles
    int piece_shift;                        // log2(pieces per row) = log2(HEAD_DIM / 8)
    int per_head;                           // 1: a group per (batch, head); 0: per tensor
};

// Where tile g lies: its tensor, the row offset of its first element, its rows, its group.
struct TileAt {
    Fp8PrepassTensor t;
    i64 base;           // element offset of (b, h, row 0 of the tile)
    int row0;           // first row of the tile within the head
    int group;          // descale index within the tensor
    int counter;        // arrival counter index
    int group_tiles;    // tiles of the group
    int group_tile0;    // first tile of the group in the sequence
};

__device__ __forceinline__ TileAt tile_at(const Fp8PrepassParams& p, int g) {
    // Selects, not an indexed read of the parameter array.
    const int i = g >= p.t[2].tile_begin ? 2 : (g >= p.t[1].tile_begin ? 1 : 0);
    TileAt a;
    a.t = i == 0 ? p.t[0] : (i == 1 ? p.t[1] : p.t[2]);
    const int local = g - a.t.tile_begin;
    const int bh = local / a.t.tiles_per_head;
    const int tt = local - bh * a.t.tiles_per_head;
    const int b = bh / a.t.heads, h = bh - b * a.t.heads;
    const int rows_per_tile = cfg::TILE_PIECES >> p.piece_shift;
    a.row0 = tt * rows_per_tile;
    a.base = (i64)b * a.t.batch_stride + (i64)h * a.t.head_stride;
    a.group = p.per_head ? bh : 0;
    a.counter = a.t.group_begin + a.group;
    a.group_tiles = p.per_head ? a.t.tiles_per_head : a.t.batch * a.t.heads * a.t.tiles_per_head;
    a.group_tile0 = a.t.tile_begin + (p.per_head ? bh * a.t.tiles_per_head : 0);
    return a;
}

// Element offset of piece j of this thread, or -1 past the head's last row.
__device__ __forceinline__ i64 piece_offset(const Fp8PrepassParams& p, const TileAt& a, int j) {
    const int pc = threadIdx.x + cfg::THREADS * j;
    const int row = a.row0 + (pc >> p.piece_shift);
    if (row >= a.t.len) return -1;
    const int col = (pc & ((1 << p.piece_shift) - 1)) * 8;
    return a.base + (i64)row * a.t.seq_stride + col;
}

// The 16-byte pieces of this thread, loaded before any is used (zeros past the last row).
__device__ __forceinline__ void thread_load_pieces(const Fp8PrepassParams& p, const TileAt& a, uint4 (&v)[cfg::PIECES],
                                                   i64 (&off)[cfg::PIECES]) {
    const unsigned char* x = reinterpret_cast<const unsigned char*>(a.t.x);
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        off[j] = piece_offset(p, a, j);
        v[j] = off[j] >= 0 ? __ldg(reinterpret_cast<const uint4*>(x + off[j] * 2)) : make_uint4(0, 0, 0, 0);
    }
}

// The two 16-bit elements of w as f32 (exact): low half first.
__device__ __forceinline__ void thread_unpack2(u32 w, float& lo, float& hi) {
#if ELEM == 0
    thread_unpack_f16x2(w, lo, hi);
#else
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
#endif
}

__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

// The max over the CTA, in every thread.
__device__ __forceinline__ float cta_max(float m, float* scratch) {
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
    __syncthreads();
    m = threadIdx.x < cfg::THREADS / 32 ? scratch[threadIdx.x] : 0.f;
    m = warp_max(m);
    __syncthreads();
    return m;
}

#if PASS == 0
extern "C" __global__ void __launch_bounds__(cfg::THREADS) fp8_prepass(const Fp8PrepassParams p) {
    __shared__ float scratch[cfg::THREADS / 32];
    __shared__ int last;
    const int g = p.tile_begin + blockIdx.x;
    const TileAt a = tile_at(p, g);
    uint4 v[cfg::PIECES];
    i64 off[cfg::PIECES];
    thread_load_pieces(p, a, v, off);
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        const u32 w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float lo, hi;
            thread_unpack2(w[i], lo, hi);
            m = fmaxf(m, fmaxf(fabsf(lo), fabsf(hi)));
        }
    }
    m = cta_max(m, scratch);
    float* partial = reinterpret_cast<float*>(p.partial);
    unsigned* counter = reinterpret_cast<unsigned*>(p.counter);
    if (threadIdx.x == 0) {
        partial[g] = m;
        // The partial is visible device-wide before the arrival that may let another CTA read it.
        __threadfence();
        last = atomicAdd(counter + a.counter, 1u) == (unsigned)(a.group_tiles - 1);
    }
    __syncthreads();
    if (!last) return;
    // Every partial of the group was written before its tile's arrival (fence above); read them
    // from L2 (ld.cg), not a stale L1 line.
    __threadfence();
    float gm = 0.f;
    for (int i = threadIdx.x; i < a.group_tiles; i += cfg::THREADS) gm = fmaxf(gm, __ldcg(partial + a.group_tile0 + i));
    gm = cta_max(gm, scratch);
    if (threadIdx.x == 0) {
        reinterpret_cast<float*>(a.t.descale)[a.group] = gm > 0.f ? thread_div_rn(gm, cfg::MAX_FINITE) : 1.f;
        // Ready for the next launch on this scratch.
        counter[a.counter] = 0u;
    }
}
#else
// Codes of 2 values in one 16-bit word: `lo` in the low byte. cvt.{e4m3,e5m2}x2.f32 puts its
// FIRST source in the UPPER byte.
__device__ __forceinline__ u32 thread_code2(float lo, float hi) {
    unsigned short r;
#if FORMAT == 0
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// x / d rounded to the nearest f32, as div.rn.f32 gives it, from r = RN(1/d) in three FMA-pipe
// operations instead of the division's dozen: q0 = RN(x·r) is within one ulp of x / d, the fma
// gives its residual exactly, and one correction step from a correctly rounded reciprocal
// rounds correctly (Markstein's theorem), barring underflow of the residual, which the range
// of d admitted by `fast_descale` excludes wherever the quotient can round to a nonzero code.
// The residual is taken as q0·d − x and negated in the last fma so that ±0 keeps its sign.
// The host twin (`fp8_prepass::tests`) checks it against the division for every f16 input
// and descale.
__device__ __forceinline__ float thread_div_by(float x, float d, float r) {
    const float q0 = x * r;
    const float e = fmaf(q0, d, -x);
    return fmaf(-e, r, q0);
}

// Whether `thread_div_by` is exact for every input under descale d: 1/d and the residuals are
// normal numbers. Every descale of f16 inputs is (amax / MAX lies in [2^-40, 2^8]); bf16 or an
// infinite or NaN descale takes the division.
__device__ __forceinline__ bool fast_descale(float d) { return d >= 0x1p-60f && d <= 0x1p60f; }

template <bool FAST>
__device__ __forceinline__ void thread_store_codes_by(const TileAt& a, const uint4 (&v)[cfg::PIECES], const i64 (&off)[cfg::PIECES], float d, float r) {
    unsigned char* codes = reinterpret_cast<unsigned char*>(a.t.codes);
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        if (off[j] < 0) continue;
        const u32 w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
        u32 c[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float lo, hi;
            thread_unpack2(w[i], lo, hi);
            if (FAST) {
                c[i] = thread_code2(thread_div_by(lo, d, r), thread_div_by(hi, d, r));
            } else {
                c[i] = thread_code2(thread_div_rn(lo, d), thread_div_rn(hi, d));
            }
        }
        // st.global spelled out: from a u64 address some targets emit a generic store.
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(codes + off[j]), "r"(c[0] | (c[1] << 16)), "r"(c[2] | (c[3] << 16))
                     : "memory");
    }
}

// The codes of this thread's pieces of tile `a` under descale d (uniform over the CTA).
__device__ __forceinline__ void thread_store_codes(const TileAt& a, const uint4 (&v)[cfg::PIECES], const i64 (&off)[cfg::PIECES], float d) {
    if (fast_descale(d)) {
        thread_store_codes_by<true>(a, v, off, d, __frcp_rn(d));
    } else {
        thread_store_codes_by<false>(a, v, off, d, 0.f);
    }
}

#if PASS == 1
extern "C" __global__ void __launch_bounds__(cfg::THREADS) fp8_prepass(const Fp8PrepassParams p) {
    const int g = p.tile_end - 1 - blockIdx.x;
    const TileAt a = tile_at(p, g);
    uint4 v[cfg::PIECES];
    i64 off[cfg::PIECES];
    thread_load_pieces(p, a, v, off);
    // Written by the amax launch before this one on the stream.
    const float d = __ldg(reinterpret_cast<const float*>(a.t.descale) + a.group);
    thread_store_codes(a, v, off, d);
}
#else
// A word other CTAs update (no L1 copy, no ordering: the caller fences once it has seen the
// value it waits for; ld.acquire in the loop would invalidate L1 at every poll).
__device__ __forceinline__ u32 thread_ld_relaxed(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The next tile from the work counter (all threads; one barrier). `slot` alternates by
// iteration: thread 0 writes it before the barrier while other threads may still be reading the
// slot of the iteration before, never the one of two iterations before.
__device__ __forceinline__ int cta_take(const Fp8PrepassParams& p, u32* work, int* slot) {
    if (threadIdx.x == 0) *slot = p.tile_begin + (int)atomicAdd(work, 1u);
    __syncthreads();
    return *slot;
}

// Loads tile g into this thread's slots of `held` and publishes the tile's max to its group:
// an atomic max on the bits of the non-negative float, then the arrival.
__device__ __forceinline__ void cta_load_publish(const Fp8PrepassParams& p, int g, uint4 (*held)[cfg::THREADS], float* scratch, u32* arrive, u32* gmax) {
    const TileAt a = tile_at(p, g);
    uint4 v[cfg::PIECES];
    i64 off[cfg::PIECES];
    thread_load_pieces(p, a, v, off);
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        held[j][threadIdx.x] = v[j];
        const u32 w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float lo, hi;
            thread_unpack2(w[i], lo, hi);
            m = fmaxf(m, fmaxf(fabsf(lo), fabsf(hi)));
        }
    }
    m = cta_max(m, scratch);
    if (threadIdx.x == 0) {
        atomicMax(gmax + a.counter, __float_as_uint(m));
        // The max is visible device-wide before the arrival that may release a waiter.
        __threadfence();
        atomicAdd(arrive + a.counter, 1u);
    }
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, cfg::ONEPASS_MIN_CTAS) fp8_prepass(const Fp8PrepassParams p) {
    __shared__ float scratch[cfg::THREADS / 32];
    __shared__ int next[2];
    __shared__ float descale;
    // Two tiles across the wait, each thread its own slots (2 x 16 KB): the next tile is loaded
    // and its max published before the CTA waits for the current tile's group, so loads stay in
    // flight while groups gather. Registers hold nothing but the loop's state during the wait.
    __shared__ uint4 held[2][cfg::PIECES][cfg::THREADS];
    u32* arrive = reinterpret_cast<u32*>(p.counter);
    const int groups = p.t[2].group_begin + (p.per_head ? p.t[2].batch * p.t[2].heads : 1);
    u32* gmax = arrive + groups;
    u32* work = arrive + 2 * groups;   // [0] tiles handed out, [1] CTAs finished
    int cur = cta_take(p, work, &next[0]);
    if (cur < p.tile_end) cta_load_publish(p, cur, held[0], scratch, arrive, gmax);
    // The tile taken in an iteration of parity `it` is held in held[it]; `cur` in held[it ^ 1].
    for (int it = 1; cur < p.tile_end; it ^= 1) {
        const int nxt = cta_take(p, work, &next[it]);
        if (nxt < p.tile_end) cta_load_publish(p, nxt, held[it], scratch, arrive, gmax);
        const TileAt a = tile_at(p, cur);
        if (threadIdx.x == 0) {
            const u32 n = (u32)a.group_tiles;
            for (unsigned ns = 32; thread_ld_relaxed(arrive + a.counter) < n; ns = ns < 512 ? 2 * ns : ns) __nanosleep(ns);
            // Every arrival of the group seen: read the max they published (from L2).
            __threadfence();
            const float gm = __uint_as_float(thread_ld_relaxed(gmax + a.counter));
            const float d = gm > 0.f ? thread_div_rn(gm, cfg::MAX_FINITE) : 1.f;
            descale = d;
            // The max is read before the departure that may let the last one reset it.
            __threadfence();
            if (atomicAdd(arrive + a.counter, 1u) == 2u * n - 1u) {
                reinterpret_cast<float*>(a.t.descale)[a.group] = d;
                gmax[a.counter] = 0u;
                arrive[a.counter] = 0u;
            }
        }
        // `descale` is rewritten by thread 0 only after the next iteration's take barrier.
        __syncthreads();
        uint4 v[cfg::PIECES];
        i64 off[cfg::PIECES];
#pragma unroll
        for (int j = 0; j < cfg::PIECES; ++j) {
            off[j] = piece_offset(p, a, j);
            v[j] = held[it ^ 1][j][threadIdx.x];
        }
        thread_store_codes(a, v, off, descale);
        cur = nxt;
    }
    if (threadIdx.x == 0) {
        // This CTA's last take of the work counter precedes its finishing count.
        __threadfence();
        if (atomicAdd(work + 1, 1u) == gridDim.x - 1u) {
            work[0] = 0u;
            work[1] = 0u;
        }
    }
}
#endif
#endif
