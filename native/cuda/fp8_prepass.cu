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
// rows; the last tile of a head is partial). 256 threads; thread t copies the 16-byte pieces
// (8 elements) t + 256 j, j < PIECES, to shared memory with cp.async, all before using any:
// consecutive threads read consecutive pieces of a row (coalesced), each thread has PIECES
// loads in flight, and no registers wait for them (six CTAs, 96 KB in flight per SM). The tiles of Q, K and
// V form one sequence (tensor, batch, head, tile) in which every descale group is a contiguous
// range of tiles.
//
// One launch; its CTAs draw 2 T items (T tiles) from an atomic counter, in this order (G
// descale groups, n(g) tiles in group g, cum(g) the tiles of the groups before g, lag a count
// of tiles):
//   amax items of tiles 0 .. min(n(0) + lag, T) - 1, then for each group g its n(g) quantize
//   items followed by the amax items up to min(cum(g + 2) + lag, T) - 1.
//   amax item: the tile's partial max; the last tile of a group to finish (an arrival counter
//     per group) reduces the group's partials, writes the descale and publishes it (the counter
//     moves past the group's tile count).
//   quantize item: loads the tile, waits until its group's descale is published, writes the
//     codes; tiles of a group in reverse order (the last read first).
// A quantize item of g is drawn `lag` amax items after g's last one: that item has finished by
// then in the steady state (no wait), and the tile, read by its amax item a few MB of traffic
// earlier, comes from L2 rather than DRAM. Every item a CTA waits for was drawn earlier by a
// running CTA that never waits, so the waits cannot deadlock. The CTA that draws the last item
// resets the item counter, and the last quantize item of a group its arrival counter: each
// launch leaves the scratch zero.
//
// Compile-time parameters: ELEM 0 f16 | 1 bf16, FORMAT 0 e4m3 | 1 e5m2. ABI: `Fp8FusedParams`
// (Rust mirror `Fp8FusedParams` in src/fp8_prepass.rs; its `Fp8PrepassParams` is also the HIP
// prepass's).
#include "common.cuh"

#if !defined(ELEM) || !defined(FORMAT)
#error "fp8_prepass.cu needs ELEM, FORMAT"
#endif
static_assert(ELEM == 0 || ELEM == 1, "ELEM 0 (f16) or 1 (bf16)");
static_assert(FORMAT == 0 || FORMAT == 1, "FORMAT 0 (e4m3) or 1 (e5m2)");

namespace cfg {
constexpr int THREADS = 256;
constexpr int PIECES = 4;                      // 16-byte input pieces per thread per tile
constexpr int TILE_PIECES = THREADS * PIECES;  // 1024 pieces = 8192 elements
constexpr float MAX_FINITE = FORMAT == 0 ? 448.f : 57344.f;
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
    u64 partial;                            // f32 [tiles of the sequence]
    u64 counter;                            // u32 [groups of the sequence + 1]: an arrival
                                            // counter per group, then the item counter; 0
                                            // between launches
    int tile_begin, tile_end;               // the tiles: 0 and T
    int piece_shift;                        // log2(pieces per row) = log2(HEAD_DIM / 8)
    int per_head;                           // 1: a group per (batch, head); 0: per tensor
};

struct Fp8FusedParams {
    Fp8PrepassParams p;
    int lag;                                // amax items between a group's last and its codes
    int groups;                             // G
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

// The tile in shared memory: piece j of thread t at [j][t] (each thread reads back only its own).
typedef uint4 TileSmem[cfg::PIECES][cfg::THREADS];

// Starts the copies of this thread's 16-byte pieces into its slots of `tile` (cp.async: no
// registers are held while they are in flight; zeros past the last row); thread_cp_async_wait
// <0> before reading them.
__device__ __forceinline__ void thread_fetch_pieces(const Fp8PrepassParams& p, const TileAt& a, TileSmem& tile) {
    const unsigned char* x = reinterpret_cast<const unsigned char*>(a.t.x);
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        const i64 off = piece_offset(p, a, j);
        thread_cp_async_16(cta_smem_addr(&tile[j][threadIdx.x]), off >= 0 ? x + off * 2 : x, off >= 0 ? 16 : 0);
    }
    thread_cp_async_commit();
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

// ---- the work order (header) ------------------------------------------------------------------

// Tiles of the groups before group g (0 <= g <= G): the groups of Q, then K, then V, each
// tensor's of equal size (a (batch, head) or the whole tensor).
__device__ __forceinline__ i64 tiles_before(const Fp8PrepassParams& p, i64 g) {
    i64 before = 0;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        const Fp8PrepassTensor& t = p.t[i];
        const i64 all = (i64)t.batch * t.heads * t.tiles_per_head;
        const i64 groups = p.per_head ? (i64)t.batch * t.heads : 1;
        const i64 per = p.per_head ? t.tiles_per_head : all;
        if (g <= groups) return before + g * per;
        before += all;
        g -= groups;
    }
    return before;
}

// Item n of the order: whether it quantizes, and its tile.
__device__ __forceinline__ void item_at(const Fp8FusedParams& f, i64 n, bool& quantize, int& tile) {
    const Fp8PrepassParams& p = f.p;
    const i64 total = p.tile_end;
    // The quantize items of group g start at S(g) = cum(g) + min(cum(g + 1) + lag, T).
    auto start = [&](i64 g) { return tiles_before(p, g) + min(tiles_before(p, g + 1) + f.lag, total); };
    quantize = false;
    if (n < start(0)) {
        tile = (int)n;
        return;
    }
    i64 lo = 0, hi = f.groups - 1;   // the last g with S(g) <= n
    while (lo < hi) {
        const i64 mid = (lo + hi + 1) / 2;
        if (start(mid) <= n) lo = mid;
        else hi = mid - 1;
    }
    const i64 first = tiles_before(p, lo), next = tiles_before(p, lo + 1);
    const i64 r = n - (first + min(next + f.lag, total));
    if (r < next - first) {
        quantize = true;
        tile = (int)(next - 1 - r);   // reverse order within the group
    } else {
        tile = (int)(min(next + f.lag, total) + (r - (next - first)));
    }
}

// A word other CTAs update (no L1 copy, no ordering: the caller fences once it has seen the
// value it waits for).
__device__ __forceinline__ u32 thread_ld_relaxed(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ---- the items ----------------------------------------------------------------------------------

// The amax of tile g; the group's last writes its descale and publishes it.
__device__ __forceinline__ void cta_amax(const Fp8PrepassParams& p, int g, float* scratch, TileSmem& tile) {
    __shared__ int last;
    const TileAt a = tile_at(p, g);
    thread_fetch_pieces(p, a, tile);
    thread_cp_async_wait<0>();
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        const uint4 v = tile[j][threadIdx.x];
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float lo, hi;
            thread_unpack2(w[i], lo, hi);
            m = fmaxf(m, fmaxf(fabsf(lo), fabsf(hi)));
        }
    }
    m = cta_max(m, scratch);
    float* partial = reinterpret_cast<float*>(p.partial);
    unsigned* counter = reinterpret_cast<unsigned*>(p.counter) + a.counter;
    if (threadIdx.x == 0) {
        partial[g] = m;
        // The partial is visible device-wide before the arrival that may let another CTA read it.
        __threadfence();
        last = atomicAdd(counter, 1u) == (unsigned)(a.group_tiles - 1);
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
        // The descale is visible before its publication.
        __threadfence();
        atomicAdd(counter, 1u);
    }
}

// The codes of tile g once its group's descale is published. The arrival counter of the group
// holds its tile count, 1 for the publication, then 1 per quantize item past the wait; the
// last of those resets it.
__device__ __forceinline__ void cta_quantize(const Fp8PrepassParams& p, int g, TileSmem& tile) {
    __shared__ float descale;
    const TileAt a = tile_at(p, g);
    thread_fetch_pieces(p, a, tile);
    if (threadIdx.x == 0) {
        unsigned* counter = reinterpret_cast<unsigned*>(p.counter) + a.counter;
        const unsigned ready = (unsigned)a.group_tiles + 1u;
        while (thread_ld_relaxed(counter) < ready) __nanosleep(200);
        __threadfence();   // the descale is read after the publication was seen
        if (atomicAdd(counter, 1u) == 2u * (unsigned)a.group_tiles) *counter = 0u;
        descale = __ldcg(reinterpret_cast<const float*>(a.t.descale) + a.group);
    }
    __syncthreads();
    const float d = descale;
    unsigned char* codes = reinterpret_cast<unsigned char*>(a.t.codes);
    thread_cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < cfg::PIECES; ++j) {
        const i64 off = piece_offset(p, a, j);
        if (off < 0) continue;
        const uint4 v = tile[j][threadIdx.x];
        const u32 w[4] = {v.x, v.y, v.z, v.w};
        u32 c[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float lo, hi;
            thread_unpack2(w[i], lo, hi);
            c[i] = thread_code2(thread_div_rn(lo, d), thread_div_rn(hi, d));
        }
        // st.global spelled out: from a u64 address some targets emit a generic store.
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(codes + off), "r"(c[0] | (c[1] << 16)), "r"(c[2] | (c[3] << 16))
                     : "memory");
    }
}

// Five CTAs per SM: 80 KB of loads in flight per SM.
extern "C" __global__ void __launch_bounds__(cfg::THREADS, 5) fp8_prepass(const Fp8FusedParams f) {
    __shared__ __align__(16) TileSmem tile;
    __shared__ float scratch[cfg::THREADS / 32];
    __shared__ int item_tile, item_quantize;
    if (threadIdx.x == 0) {
        unsigned* counter = reinterpret_cast<unsigned*>(f.p.counter) + f.groups;
        const unsigned n = atomicAdd(counter, 1u);
        // Every item has been drawn: the counter is free for the next launch.
        if (n == gridDim.x - 1) *counter = 0u;
        bool q;
        int t;
        item_at(f, n, q, t);
        item_tile = t;
        item_quantize = q;
    }
    __syncthreads();
    if (item_quantize) cta_quantize(f.p, item_tile, tile);
    else cta_amax(f.p, item_tile, scratch, tile);
}
