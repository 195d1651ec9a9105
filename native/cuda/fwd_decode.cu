// Decode attention (flash-decoding) on mma.sync m16n8k16: few query rows against a long KV
// sequence, bound by the bandwidth of reading K and V once; and, for paged caches, prefill.
//
// Work split. One CTA = one (batch, KV head, row block, split). The query rows of every Q head of
// the KV head's GQA group at every query position are packed (row r = h * q_len + i for group
// head h and position i, rows = group * q_len); a row block is BM of them (one block for decode,
// rows <= BM; several for a prefill against a paged cache), against the keys
// [split * keys_per_split, +keys_per_split) of the sequence. K and V are thus read once per
// group and row block instead of once per Q head, and the grid (splits * row blocks, kv_heads,
// batch) fills the device when batch * kv_heads alone cannot (the host's split function,
// src/decode.rs, says how many splits). With one split the CTA writes the final O and LSE; with
// several it writes its normalized partial O (f32) and LSE per row, and the last split of the
// row block to finish (an atomic count per row block) merges them into O and the LSE
// (`cta_merge_splits`), so decode is one launch.
//
// Warps. WARPS_M warps own one m16 row tile each (BM = 16 * WARPS_M); the WN = 4 / WARPS_M
// warps of a row tile take disjoint KW = BLOCK_N / WN key slices of every KV tile and keep
// their own online-softmax state (max, sum, O in f32), merged through shared memory at the
// end. At 16 rows (q_len 1 over a group of up to 16) four warps share each tile's keys, so
// every warp's MMA work per loaded byte stays small and the loop stays bound by memory.
//
// Pipeline. STAGES K+V tiles of BLOCK_N keys in swizzled shared memory, filled by 16-byte
// cp.async of every thread (zero-filled past the sequence end): STAGES - 1 tiles are in flight
// while one is consumed, one barrier per tile. The bytes in flight per SM, not the MMAs, set
// the speed of this kernel.
//
// Masks. Keys past kv_len (the last tile of the last split) and, causal, bottom-right aligned:
// position i sees keys j < i + 1 + kv_len - q_len. Keys past the block's last position's limit
// are not loaded; only tiles that reach past its first position's limit carry mask code. Rows
// that see no key of the split keep max -inf and sum 0: their partial O is 0 and their LSE -inf,
// which the merge weighs as nothing.
//
// Score modifiers (MODS 1, a second kernel argument `ModParams` of common.cuh). Position i sits
// at a(i) = i + offset, offset = kv_len - q_len (bottom-right, with the sequence's own kv_len
// when PAGED) or 0 (top-left), and sees keys a(i) - left ..= a(i) + right. The splits divide
// only the keys some position of the row block sees, lo ..< hi (`mod_keys`; the host's split
// counts hi - lo over all positions at the longest length, which bounds every block's and
// sequence's: see `mod_key_range` in src/decode.rs): split s takes lo + s * keys_per_split
// onwards, so keys outside every row's band are never loaded (loads zero-fill from hi on) and a
// narrow window runs few tiles. Tiles every position
// sees whole carry no mask code; the others mask per row (its band and the sequence end). Each
// packed row has its own Q head and position: its ALiBi slope and a(i) are the row's, applied
// with softcap to every score (`thread_mod_score`). Sinks join the denominator once: in the
// epilogue with one split, in the merge with several, where the partial states leave them out;
// a row that sees no key keeps O = 0 and LSE = -inf.
//
// Paged KV (PAGED 1). K and V are pools [num_pages, page_size, kv_heads, D] read through the
// block table [batch, max_pages]: key j of sequence b is row j % page_size of page
// table[b][j / page_size], and each sequence has its own length (seq_lens[b], which replaces
// kv_len for its CTAs: the split's range, the sequence-end mask and the causal alignment). Page
// sizes are powers of two (16 .. 256), so a tile of BN keys may span several pages: every copied
// row looks its page up. Each thread reads the table entries of its rows of the next tile one
// tile ahead (registers), so the lookup's latency hides behind the current tile's math instead
// of delaying the next cp.async. A table entry outside [0, num_pages) zero-fills its row (the
// host validates the table; this keeps a bad one inside the pool).
//
// Compile-time parameters (-D defines, from DecodeConfig in src/decode.rs):
//   HEAD_DIM   64 | 128
//   WARPS_M    1 | 2 | 4   row tiles (BM = 16, 32, 64 query rows per CTA)
//   BLOCK_N    keys per KV tile (BLOCK_N / (4 / WARPS_M) a multiple of 16)
//   STAGES     K+V tiles in shared memory (>= 2)
//   IN_BF16    0: fp16 Q/K/V/O, 1: bf16
//   PAGED      0: K/V strided tensors, 1: K/V paged pools
//   MODS       1: score modifiers (above); MOD_SOFTCAP and MOD_ALIBI compile softcap and ALiBi
//              in (applied to every score)
// The launch ABI is `DecodeParams` below; the Rust mirror is `DecodeParams` in src/decode.rs,
// and `DecodeTile::smem_bytes` mirrors cfg::SMEM_BYTES.
#include "common.cuh"

#if !defined(HEAD_DIM) || !defined(WARPS_M) || !defined(BLOCK_N) || !defined(STAGES) || !defined(IN_BF16) || !defined(PAGED)
#error "fwd_decode.cu needs HEAD_DIM, WARPS_M, BLOCK_N, STAGES, IN_BF16, PAGED"
#endif

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int WM = WARPS_M;                 // row tiles (one warp row each)
constexpr int WN = 4 / WARPS_M;             // warps sharing one row tile's keys
constexpr int WARPS = WM * WN;
constexpr int THREADS = 32 * WARPS;
constexpr int BM = 16 * WM;                 // query rows per CTA (padded)
constexpr int BN = BLOCK_N;
constexpr int MAX_SPLITS = 128;             // src/decode.rs MAX_SPLITS: bounds the merge's weights
constexpr int KW = BN / WN;                 // keys per warp per tile
constexpr int ROW_BYTES = 2 * D;            // 16-bit elements
constexpr int CHUNKS = D / 8;               // 16-byte chunks per row
constexpr int K_STEPS = D / 16;             // k16 steps of Q·Kᵀ
constexpr int N_FRAGS = KW / 8;             // n8 score tiles per warp
constexpr int P_STEPS = KW / 16;            // k16 steps of P·V per warp
constexpr int D_FRAGS = D / 8;              // n8 tiles of O
constexpr int KV_TILE_BYTES = BN * ROW_BYTES;
constexpr int STAGE_BYTES = 2 * KV_TILE_BYTES;   // K then V
constexpr int Q_OFFSET = STAGES * STAGE_BYTES;
constexpr int SMEM_BYTES = Q_OFFSET + BM * ROW_BYTES;
// Epilogue, over the drained stages: one [16][O_PITCH] f32 slab of scaled O per warp, then the
// per-warp row max and sum, then the CTA's row LSE. The pitch of D + 4 floats keeps 16-byte
// rows aligned and spreads the 8 rows of a quad group over distinct banks.
constexpr int O_PITCH = D + 4;
constexpr int SLAB_FLOATS = 16 * O_PITCH;
constexpr int EPI_FLOATS = WARPS * SLAB_FLOATS + 2 * WARPS * 16 + BM;
constexpr int COPY_STEP = THREADS / CHUNKS;  // rows one copy instruction of the CTA covers
constexpr int COPY_ROWS = BN / COPY_STEP;    // rows of a tile one thread copies
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(WM == 1 || WM == 2 || WM == 4, "1, 2 or 4 row tiles");
static_assert(KW % 16 == 0 && KW >= 16, "every warp's key slice is whole k16 steps");
static_assert(STAGES >= 2, "at least double buffering");
static_assert(THREADS % CHUNKS == 0 && COPY_STEP % 8 == 0 && BN % COPY_STEP == 0, "even copy split");
static_assert(EPI_FLOATS * 4 <= STAGES * STAGE_BYTES, "epilogue fits in the stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 block may have");
}  // namespace cfg

struct DecodeParams {
    u64 q, k, v;                // inputs (16-bit)
    u64 o, lse;                 // final O (16-bit, strided) and LSE (f32 [batch, q_heads, q_len])
    u64 part_o, part_lse;       // splits > 1: f32 partial O [pair][split][rows][D], LSE [pair][split][rows]
    u64 counters;               // splits > 1: u32 [pair][row block], zero between launches
    u64 block_table, seq_lens;  // PAGED: i32 [batch, max_pages] and i32 [batch]
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // in elements; head dim is contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    i64 v_batch_stride, v_head_stride, v_seq_stride;
    i64 o_batch_stride, o_head_stride, o_seq_stride;
    int q_len, kv_len, q_heads, kv_heads;
    int group;                  // q_heads / kv_heads
    int rows;                   // group * q_len <= BM
    int splits;                 // gridDim.x
    int keys_per_split;         // a multiple of BLOCK_N
    float scale_log2;           // softmax scale * log2(e)
    float scale;
    int causal;                 // bottom-right aligned (MODS: folded into ModParams' right extent)
    int page_shift;             // PAGED: log2(page_size)
    int max_pages;              // PAGED: columns of the block table
    int num_pages;              // PAGED: pages in each pool
};

__device__ __forceinline__ void warp_mma_in(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if IN_BF16
    warp_mma_bf16_f32acc(d, a, b0, b1);
#else
    warp_mma_f16_f32acc(d, a, b0, b1);
#endif
}
__device__ __forceinline__ u32 thread_pack_in(float lo, float hi) {
#if IN_BF16
    return thread_pack_bf16x2(lo, hi);
#else
    return thread_pack_f16x2(lo, hi);
#endif
}

// 16-byte async copy through L2 only, with a 128-byte L2 prefetch: K and V are streamed once,
// and the prefetch turns a tile's scattered 16-byte requests into whole-line DRAM reads even
// where rows are strided (BSHD). `src_bytes` 0 zero-fills.
__device__ __forceinline__ void thread_cp_async_16_l2(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// One BN-row tile of K or V (row stride `stride` bytes) into a swizzled tile at `dst`; rows at or
// past `rows_valid` are zero-filled (their source clamped to row 0, never read). A thread copies
// one chunk of rows row0, row0 + COPY_STEP, ...: COPY_STEP is a multiple of 8, so the swizzle is
// the same for all of them.
template <bool FULL>
__device__ __forceinline__ void cta_load_kv_tile(u32 dst, const unsigned char* src, i64 stride, int rows_valid) {
    const int row0 = threadIdx.x / cfg::CHUNKS;
    const int chunk = threadIdx.x % cfg::CHUNKS;
    const unsigned char* s = src + (i64)row0 * stride + chunk * 16;
    const u32 d = dst + tile_swizzle<cfg::ROW_BYTES>(row0, chunk);
    const i64 step = (i64)cfg::COPY_STEP * stride;
#pragma unroll
    for (int i = 0; i < cfg::BN / cfg::COPY_STEP; ++i) {
        if (FULL) {
            thread_cp_async_16_l2(d + i * cfg::COPY_STEP * cfg::ROW_BYTES, s, 16);
        } else {
            const bool ok = row0 + i * cfg::COPY_STEP < rows_valid;
            thread_cp_async_16_l2(d + i * cfg::COPY_STEP * cfg::ROW_BYTES, ok ? (const void*)s : (const void*)src, ok ? 16 : 0);
        }
        s += step;
    }
}

// Where the CTA's keys live and which of its tiles need masks.
struct CtaKeys {
    const unsigned char* k;     // first byte of the split's first K row
    const unsigned char* v;
    i64 k_stride, v_stride;     // bytes per key
    int begin;                  // first key of the split
    int n_tiles;                // tiles of the split that hold keys
    int full_first, full_end;   // tiles full_first (MODS; else 0) ..< full_end no row masks
    int end;                    // keys from here on are loaded as zeros: kv_len, or (MODS) the
                                // split's end, at most the end of the keys some row sees
};

// K+V tile t of the split into stage buffer `stage`.
__device__ __forceinline__ void cta_load_stage(u32 stage, const CtaKeys& ck, int t) {
    const int key0 = ck.begin + t * cfg::BN;
    const int valid = ck.end - key0;
    const i64 ko = (i64)t * cfg::BN * ck.k_stride, vo = (i64)t * cfg::BN * ck.v_stride;
    if (valid >= cfg::BN) {
        cta_load_kv_tile<true>(stage, ck.k + ko, ck.k_stride, cfg::BN);
        cta_load_kv_tile<true>(stage + cfg::KV_TILE_BYTES, ck.v + vo, ck.v_stride, cfg::BN);
    } else {
        cta_load_kv_tile<false>(stage, ck.k + ko, ck.k_stride, valid);
        cta_load_kv_tile<false>(stage + cfg::KV_TILE_BYTES, ck.v + vo, ck.v_stride, valid);
    }
}

#if PAGED
// The pages of this thread's rows (row0 + i * COPY_STEP) of one tile, -1 past the keys loaded or
// for an entry outside the pool.
struct RowPages {
    int page[cfg::COPY_ROWS];
};

// Reads the table entries of this thread's rows of the tile starting at key `key0`; rows from
// `end` (CtaKeys::end) on get none.
__device__ __forceinline__ void thread_fetch_pages(RowPages& rp, const int* table, int key0, int end, int shift, int num_pages) {
    const int row0 = threadIdx.x / cfg::CHUNKS;
#pragma unroll
    for (int i = 0; i < cfg::COPY_ROWS; ++i) {
        const int key = key0 + row0 + i * cfg::COPY_STEP;
        const int page = key < end ? __ldg(table + (key >> shift)) : -1;
        rp.page[i] = (unsigned)page < (unsigned)num_pages ? page : -1;
    }
}

// One tile of K and V from the pools (`k`, `v`: the KV head's first element; `row_bytes`: bytes
// from one pool row to the next) into the stage at `dst`; rows without a page are zero-filled.
__device__ __forceinline__ void cta_load_stage_paged(u32 dst, const RowPages& rp, const unsigned char* k, const unsigned char* v,
                                                     i64 row_bytes, int key0, int shift) {
    const int row0 = threadIdx.x / cfg::CHUNKS;
    const int chunk = threadIdx.x % cfg::CHUNKS;
    const u32 d = dst + tile_swizzle<cfg::ROW_BYTES>(row0, chunk);
    const int slot_mask = (1 << shift) - 1;
#pragma unroll
    for (int i = 0; i < cfg::COPY_ROWS; ++i) {
        const int key = key0 + row0 + i * cfg::COPY_STEP;
        const bool ok = rp.page[i] >= 0;
        const i64 off = ok ? ((((i64)rp.page[i] << shift) + (key & slot_mask)) * row_bytes + chunk * 16) : 0;
        thread_cp_async_16_l2(d + i * cfg::COPY_STEP * cfg::ROW_BYTES, k + off, ok ? 16 : 0);
        thread_cp_async_16_l2(d + cfg::KV_TILE_BYTES + i * cfg::COPY_STEP * cfg::ROW_BYTES, v + off, ok ? 16 : 0);
    }
}
#endif

// Online-softmax state of one warp: rows g and g + 8 of its row tile, its key slice.
struct WarpState {
    float o[1][cfg::D_FRAGS][4];
    float m[2];   // running max of the raw scores
    float l[2];   // this lane's share of the running sum
};

// What the scores of this lane's two rows (g and g + 8 of its row tile) go through.
struct RowMask {
#if MODS
    int a[2];         // aligned position a(i): the band is a(i) - left ..= a(i) + right
    float slope[2];   // ALiBi slope / scale of the row's Q head
    int kv_len;       // the sequence's keys
#else
    int hi[2];        // keys from here on are masked (sequence end, causal limit)
#endif
};

#if MODS
#define MOD_ARG , const ModParams& mp
#define MOD_PASS , mp
#else
#define MOD_ARG
#define MOD_PASS
#endif

// One KV tile for one warp: S = Q·Kᵀ over its key slice, masks, online softmax, O += P·V.
template <bool MASK>
__device__ __forceinline__ void warp_decode_tile(WarpState& st, const u32 (&qf)[cfg::K_STEPS][4], u32 k_w, u32 v_w,
                                                 const TileLane<cfg::ROW_BYTES>& kl, const TileLane<cfg::ROW_BYTES>& vl,
                                                 int key_base, const RowMask& rm, float c MOD_ARG) {
    float s[cfg::N_FRAGS][4];
#pragma unroll
    for (int n = 0; n < cfg::N_FRAGS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    // ldmatrix.x4 lane -> row address: (keys +0..7, dims +0..7), (keys +0..7, dims +8..15),
    // (keys +8..15, dims +0..7), (keys +8..15, dims +8..15) = b0, b1 of two n8 tiles.
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk)
#pragma unroll
        for (int np = 0; np < cfg::P_STEPS; ++np) {
            u32 b[4];
            warp_ldmatrix_x4(b, kl.at(k_w, np, kk));
            warp_mma_in(s[2 * np], qf[kk], b[0], b[1]);
            warp_mma_in(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
    if (MASK || MODS) {
        // Element (n, e) holds row g + 8 * (e / 2), key key_base + 8 * n + (e % 2).
#pragma unroll
        for (int n = 0; n < cfg::N_FRAGS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
#if MODS
                // The band limits are derived here rather than kept: registers across the loop.
                const int a = rm.a[e >> 1];
                s[n][e] = thread_mod_score<MASK, MOD_SOFTCAP != 0, MOD_ALIBI != 0>(s[n][e], mp, rm.slope[e >> 1], a, key_base + 8 * n + (e & 1),
                                                                                   a - mp.left, min(rm.kv_len, a + mp.right + 1));
#else
                if (key_base + 8 * n + (e & 1) >= rm.hi[e >> 1]) s[n][e] = QA_NEG_INF;
#endif
            }
    }
    float mx[2] = {st.m[0], st.m[1]};
#pragma unroll
    for (int n = 0; n < cfg::N_FRAGS; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
    }
    float alpha[2], mc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = quad_max(mx[h]);
        // Unchanged max (both -inf included): factor 1; a first visible key after -inf: 0.
        alpha[h] = (mx[h] == st.m[h]) ? 1.f : thread_exp2((st.m[h] - mx[h]) * c);
        // A row that has seen only masked keys keeps max -inf: offset 0, so exp2(-inf) = 0.
        mc[h] = (mx[h] == QA_NEG_INF) ? 0.f : mx[h] * c;
        st.m[h] = mx[h];
        st.l[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < cfg::N_FRAGS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = thread_exp2(fmaf(s[n][e], c, -mc[e >> 1]));
            st.l[e >> 1] += s[n][e];
        }
#pragma unroll
    for (int d = 0; d < cfg::D_FRAGS; ++d) {
        st.o[0][d][0] *= alpha[0]; st.o[0][d][1] *= alpha[0];
        st.o[0][d][2] *= alpha[1]; st.o[0][d][3] *= alpha[1];
    }
    // Two adjacent n8 score tiles are one m16k16 A fragment of P·V.
    u32 p[1][cfg::P_STEPS][4];
#pragma unroll
    for (int kp = 0; kp < cfg::P_STEPS; ++kp) {
        p[0][kp][0] = thread_pack_in(s[2 * kp][0], s[2 * kp][1]);
        p[0][kp][1] = thread_pack_in(s[2 * kp][2], s[2 * kp][3]);
        p[0][kp][2] = thread_pack_in(s[2 * kp + 1][0], s[2 * kp + 1][1]);
        p[0][kp][3] = thread_pack_in(s[2 * kp + 1][2], s[2 * kp + 1][3]);
    }
    warp_value_matmul<1, cfg::P_STEPS, cfg::D, false, IN_BF16 != 0>(st.o, p, v_w, vl);
}

// The merge of the splits' states of rows [r0, r0 + n) of one (batch, KV head), by the last CTA
// of their row block to finish (after every split's partial O and LSE is visible to it). A state
// is O_s over the split's keys (normalized over them) and LSE_s, the natural log of their softmax
// denominator; over the union: LSE = M + ln W, M = max_s LSE_s, W = Σ_s exp(LSE_s - M), and O =
// Σ_s (exp(LSE_s - M) / W) O_s, so no exponent overflows. A state with LSE_s = -inf (no visible
// key) weighs 0 and its O is never read; a row whose states are all -inf gets O = 0 and LSE =
// -inf. MODS: the states leave the sinks out; the row's sink joins W here, once, for a row some
// state saw a key in. The partials are read through L2 (`ld.global.cg`): other CTAs wrote them.
// The weights go to shared memory first, so the O loads of a chunk (every split's) and of two
// chunks per thread are independent: the merge costs a few L2 round trips, not one per state.
constexpr int MERGE_FLOATS = (cfg::MAX_SPLITS + 1) * cfg::BM;
static_assert(MERGE_FLOATS * 4 <= STAGES * cfg::STAGE_BYTES, "the merge's weights fit in the stages");

__device__ __forceinline__ void thread_merge_chunk(const DecodeParams& p, const float* w_row, float inv, const float* o_row, int chunk,
                                                   float (&acc)[8]) {
#pragma unroll
    for (int x = 0; x < 8; ++x) acc[x] = 0.f;
#pragma unroll 4
    for (int s = 0; s < p.splits; ++s) {
        const float w = w_row[s * cfg::BM] * inv;
        if (w == 0.f) continue;   // an empty state's O is never read
        const float4* src = reinterpret_cast<const float4*>(o_row + (i64)s * p.rows * cfg::D + chunk * 8);
        const float4 a = __ldcg(src), b = __ldcg(src + 1);
        acc[0] += w * a.x; acc[1] += w * a.y; acc[2] += w * a.z; acc[3] += w * a.w;
        acc[4] += w * b.x; acc[5] += w * b.y; acc[6] += w * b.z; acc[7] += w * b.w;
    }
}

__device__ __forceinline__ void thread_store_chunk(const DecodeParams& p, int batch, int kv_head, int r, int chunk, const float (&acc)[8]) {
    const int head = kv_head * p.group + r / p.q_len, pos = r % p.q_len;
    unsigned short* dst = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride + (i64)head * p.o_head_stride +
                          (i64)pos * p.o_seq_stride + chunk * 8;
    const u32 x = thread_pack_in(acc[0], acc[1]), y = thread_pack_in(acc[2], acc[3]);
    const u32 z = thread_pack_in(acc[4], acc[5]), w = thread_pack_in(acc[6], acc[7]);
    asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n" :: "l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}

__device__ __forceinline__ void cta_merge_splits(const DecodeParams& p, float* smem_f, int pair, int r0, int n MOD_ARG) {
    constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
    float* row_inv = smem_f;              // [BM] 1 / W, 0 for an empty row
    float* wts = smem_f + cfg::BM;        // [splits][BM] exp(LSE_s - M), 0 for an empty state
    const i64 state_rows = (i64)p.splits * p.rows;   // from one pair's states to the next
    const float* lse_in = reinterpret_cast<const float*>(p.part_lse) + pair * state_rows + r0;
    const float* o_in = reinterpret_cast<const float*>(p.part_o) + (pair * state_rows + r0) * cfg::D;
    const int batch = pair / p.kv_heads, kv_head = pair % p.kv_heads;
    for (int t = threadIdx.x; t < n; t += cfg::THREADS) {
        float mx = QA_NEG_INF;
#pragma unroll 4
        for (int s = 0; s < p.splits; ++s) {
            const float l = __ldcg(lse_in + (i64)s * p.rows + t);
            wts[s * cfg::BM + t] = l;
            mx = fmaxf(mx, l);
        }
        const int r = r0 + t;
#if MODS
        const float sink = mx == QA_NEG_INF ? QA_NEG_INF : mp.sink_log2[kv_head * p.group + r / p.q_len] * LN2;
        mx = fmaxf(mx, sink);
#endif
        float w = 0.f;
        for (int s = 0; s < p.splits; ++s) {
            const float l = wts[s * cfg::BM + t];
            const float e = l == QA_NEG_INF ? 0.f : thread_exp2((l - mx) * LOG2E);
            wts[s * cfg::BM + t] = e;
            w += e;
        }
#if MODS
        if (sink != QA_NEG_INF) w += thread_exp2((sink - mx) * LOG2E);
#endif
        const bool empty = !(w > 0.f);
        row_inv[t] = empty ? 0.f : 1.f / w;
        const int head = kv_head * p.group + r / p.q_len, pos = r % p.q_len;
        reinterpret_cast<float*>(p.lse)[((i64)batch * p.q_heads + head) * p.q_len + pos] =
            empty ? QA_NEG_INF : (mx * LOG2E + thread_log2(w)) * LN2;
    }
    __syncthreads();
    // Two chunks per thread at a time: their loads are in flight together.
    const int items = n * cfg::CHUNKS;
    for (int idx = threadIdx.x; idx < items; idx += 2 * cfg::THREADS) {
        const int idx2 = idx + cfg::THREADS;
        const bool second = idx2 < items;
        const int t = idx / cfg::CHUNKS, chunk = idx % cfg::CHUNKS;
        const int t2 = second ? idx2 / cfg::CHUNKS : t, chunk2 = second ? idx2 % cfg::CHUNKS : chunk;
        float a[8], b[8];
        thread_merge_chunk(p, wts + t, row_inv[t], o_in + (i64)t * cfg::D, chunk, a);
        thread_merge_chunk(p, wts + t2, row_inv[t2], o_in + (i64)t2 * cfg::D, chunk2, b);
        thread_store_chunk(p, batch, kv_head, r0 + t, chunk, a);
        if (second) thread_store_chunk(p, batch, kv_head, r0 + t2, chunk2, b);
    }
}

// Grid: x = split + splits * row block, y = KV head, z = batch. 4 warps. The bounds tell ptxas
// that two CTAs per SM is the aim (the shared memory allows no more on sm_90): left to guess, it
// keeps to three CTAs' registers and spills at 32 and 64 rows.
extern "C" __global__ void __launch_bounds__(cfg::THREADS, 2) fwd_decode(const DecodeParams p
#if MODS
                                                                       , const __grid_constant__ ModParams mp
#endif
) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 smem = cta_smem_addr(smem_raw);
    const u32 q_smem = smem + cfg::Q_OFFSET;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wm = warp / cfg::WN;         // row tile
    const int wn = warp % cfg::WN;         // key slice
    const int split = blockIdx.x % p.splits;
    const int row_block = blockIdx.x / p.splits;
    const int kv_head = blockIdx.y;
    const int batch = blockIdx.z;
    const float c = p.scale_log2;
    // The CTA's packed rows r0 ..< r0 + n_rows, and the query positions they hold: consecutive
    // within one Q head, all of 0 ..< q_len when the block spans two heads.
    const int r0 = row_block * cfg::BM;
    const int n_rows = min(cfg::BM, p.rows - r0);
    const bool one_head = r0 / p.q_len == (r0 + n_rows - 1) / p.q_len;
    const int pos_first = one_head ? r0 % p.q_len : 0;
    const int pos_last = one_head ? (r0 + n_rows - 1) % p.q_len : p.q_len - 1;

    // The split's keys and which of its tiles no row masks.
#if PAGED
    // The host checks every length against the table; the clamp keeps a bad one inside it.
    const int kv_len = min(max(reinterpret_cast<const int*>(p.seq_lens)[batch], 0), p.max_pages << p.page_shift);
    const int* table = reinterpret_cast<const int*>(p.block_table) + (i64)batch * p.max_pages;
    const i64 pool_row_bytes = 2 * (i64)p.kv_heads * cfg::D;
    const unsigned char* k_pool = reinterpret_cast<const unsigned char*>(p.k) + 2 * (i64)kv_head * cfg::D;
    const unsigned char* v_pool = reinterpret_cast<const unsigned char*>(p.v) + 2 * (i64)kv_head * cfg::D;
    RowPages pages;
#else
    const int kv_len = p.kv_len;
#endif
    CtaKeys ck;
#if MODS
    // Only the keys some position sees are split; tiles every position sees whole are unmasked.
    const int offset = mp.top_left ? 0 : kv_len - p.q_len;
    const ModKeys mk = mod_keys(kv_len, mp, offset + pos_first, offset + pos_last);
    ck.begin = mk.lo + split * p.keys_per_split;
    ck.end = min(mk.hi, ck.begin + p.keys_per_split);
    ck.n_tiles = ck.end > ck.begin ? (ck.end - ck.begin + cfg::BN - 1) / cfg::BN : 0;
    ck.full_first = mk.full_lo > ck.begin ? (mk.full_lo - ck.begin + cfg::BN - 1) / cfg::BN : 0;
    ck.full_end = mk.full_hi > ck.begin ? min((mk.full_hi - ck.begin) / cfg::BN, ck.n_tiles) : 0;
#else
    // Keys past the last position's causal limit are seen by no row of the CTA: not loaded. The
    // first key some row no longer sees: the first position's limit (every other row's is at
    // least that), else the sequence end; tiles before it are unmasked.
    ck.begin = split * p.keys_per_split;
    const int seen = p.causal ? min(kv_len, pos_last + 1 + kv_len - p.q_len) : kv_len;
    const int end = min(seen, ck.begin + p.keys_per_split);
    ck.n_tiles = end > ck.begin ? (end - ck.begin + cfg::BN - 1) / cfg::BN : 0;
    const int mask_from = p.causal ? min(kv_len, pos_first + 1 + kv_len - p.q_len) : kv_len;
    ck.full_first = 0;
    ck.full_end = mask_from > ck.begin ? min((mask_from - ck.begin) / cfg::BN, ck.n_tiles) : 0;
    ck.end = kv_len;
#endif
    ck.k_stride = 2 * p.k_seq_stride;
    ck.v_stride = 2 * p.v_seq_stride;
    ck.k = reinterpret_cast<const unsigned char*>(p.k) +
           2 * (batch * p.k_batch_stride + kv_head * p.k_head_stride + (i64)ck.begin * p.k_seq_stride);
    ck.v = reinterpret_cast<const unsigned char*>(p.v) +
           2 * (batch * p.v_batch_stride + kv_head * p.v_head_stride + (i64)ck.begin * p.v_seq_stride);

    // This lane's rows (g and g + 8 of its row tile): the keys each sees and, with modifiers,
    // its position and Q head's slope (padding rows past `rows` take row 0's; never written).
    const int g = lane >> 2;
    RowMask rm;
#if MODS
    rm.kv_len = kv_len;
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = r0 + wm * 16 + g + 8 * h;
#if MODS
        const int rr = r < p.rows ? r : 0;
        rm.a[h] = rr % p.q_len + offset;
        rm.slope[h] = MOD_ALIBI ? mp.alibi_raw[kv_head * p.group + rr / p.q_len] : 0.f;
#else
        rm.hi[h] = (p.causal && r < p.rows) ? min(kv_len, r % p.q_len + 1 + kv_len - p.q_len) : kv_len;
#endif
    }

    WarpState st;
#pragma unroll
    for (int d = 0; d < cfg::D_FRAGS; ++d) st.o[0][d][0] = st.o[0][d][1] = st.o[0][d][2] = st.o[0][d][3] = 0.f;
    st.m[0] = st.m[1] = QA_NEG_INF;
    st.l[0] = st.l[1] = 0.f;

    if (ck.n_tiles > 0) {
        // Prologue: the CTA's Q rows (zero rows past `rows`) with tile 0 as one group,
        // then tiles 1 .. STAGES - 2, one group each (empty groups past the split's end keep
        // the count uniform).
        for (int idx = threadIdx.x; idx < cfg::BM * cfg::CHUNKS; idx += cfg::THREADS) {
            const int r = idx / cfg::CHUNKS, chunk = idx % cfg::CHUNKS;
            const bool ok = r < n_rows;
            const int rr = ok ? r0 + r : 0;
            const unsigned short* src = reinterpret_cast<const unsigned short*>(p.q) + batch * p.q_batch_stride +
                                        (i64)(kv_head * p.group + rr / p.q_len) * p.q_head_stride +
                                        (i64)(rr % p.q_len) * p.q_seq_stride + chunk * 8;
            thread_cp_async_16(q_smem + tile_swizzle<cfg::ROW_BYTES>(r, chunk), src, ok ? 16 : 0);
        }
#if PAGED
        thread_fetch_pages(pages, table, ck.begin, ck.end, p.page_shift, p.num_pages);
#endif
#pragma unroll
        for (int t = 0; t < STAGES - 1; ++t) {
            if (t < ck.n_tiles) {
#if PAGED
                cta_load_stage_paged(smem + t * cfg::STAGE_BYTES, pages, k_pool, v_pool, pool_row_bytes, ck.begin + t * cfg::BN, p.page_shift);
                thread_fetch_pages(pages, table, ck.begin + (t + 1) * cfg::BN, ck.end, p.page_shift, p.num_pages);
#else
                cta_load_stage(smem + t * cfg::STAGE_BYTES, ck, t);
#endif
            }
            thread_cp_async_commit();
        }
        thread_cp_async_wait<STAGES - 2>();   // Q and tile 0 landed
        __syncthreads();

        // Q's A fragments for this warp's row tile, kept in registers. ldmatrix.x4 lane -> row
        // address: (rows +0..7, dims +0..7), (rows +8..15, dims +0..7), (rows +0..7, dims
        // +8..15), (rows +8..15, dims +8..15) = a0..a3.
        u32 qf[cfg::K_STEPS][4];
        {
            const TileLane<cfg::ROW_BYTES> ql(wm * 16 + (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
#pragma unroll
            for (int kk = 0; kk < cfg::K_STEPS; ++kk) warp_ldmatrix_x4(qf[kk], ql.at(q_smem, 0, kk));
        }
        const TileLane<cfg::ROW_BYTES> kl((((lane >> 4) & 1) << 3) + (lane & 7), (lane >> 3) & 1);
        const TileLane<cfg::ROW_BYTES> vl((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
        const u32 slice = (u32)(wn * cfg::KW * cfg::ROW_BYTES);

        int stage = 0;                      // stage of tile j
        int fill = STAGES - 1;         // stage of tile j + STAGES - 1
        for (int j = 0; j < ck.n_tiles; ++j) {
            thread_cp_async_wait<STAGES - 2>();   // tile j landed (this thread's copies)
            __syncthreads();                           // everyone's; everyone is past tile j - 1
            const int t = j + STAGES - 1;
            if (t < ck.n_tiles) {
#if PAGED
                // `pages` holds tile t's entries (read one tile ago); read tile t + 1's now.
                cta_load_stage_paged(smem + fill * cfg::STAGE_BYTES, pages, k_pool, v_pool, pool_row_bytes, ck.begin + t * cfg::BN, p.page_shift);
                thread_fetch_pages(pages, table, ck.begin + (t + 1) * cfg::BN, ck.end, p.page_shift, p.num_pages);
#else
                cta_load_stage(smem + fill * cfg::STAGE_BYTES, ck, t);
#endif
            }
            thread_cp_async_commit();
            const u32 k_w = smem + stage * cfg::STAGE_BYTES + slice;
            const u32 v_w = k_w + cfg::KV_TILE_BYTES;
            const int key_base = ck.begin + j * cfg::BN + wn * cfg::KW + 2 * (lane & 3);
#if MODS
            const bool full = j >= ck.full_first && j < ck.full_end;
#else
            const bool full = j < ck.full_end;
#endif
            if (full) warp_decode_tile<false>(st, qf, k_w, v_w, kl, vl, key_base, rm, c MOD_PASS);
            else warp_decode_tile<true>(st, qf, k_w, v_w, kl, vl, key_base, rm, c MOD_PASS);
            stage = stage + 1 == STAGES ? 0 : stage + 1;
            fill = fill + 1 == STAGES ? 0 : fill + 1;
        }
    }

    // ---- epilogue: merge the key slices of each row tile, normalize, write -----------------
    thread_cp_async_wait<0>();
    __syncthreads();   // the stages are free
    float* slab = reinterpret_cast<float*>(smem_raw);                  // [WARPS][16][O_PITCH]
    float* st_m = slab + cfg::WARPS * cfg::SLAB_FLOATS;                 // [WARPS][16]
    float* st_l = st_m + cfg::WARPS * 16;                               // [WARPS][16]
    float* st_lse = st_l + cfg::WARPS * 16;                             // [BM]
    float l_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) l_row[h] = quad_sum(st.l[h]);
    if ((lane & 3) == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            st_m[warp * 16 + g + 8 * h] = st.m[h];
            st_l[warp * 16 + g + 8 * h] = l_row[h];
        }
    }
    __syncthreads();
    float f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        float mx = QA_NEG_INF;
#pragma unroll
        for (int w = 0; w < cfg::WN; ++w) mx = fmaxf(mx, st_m[(wm * cfg::WN + w) * 16 + row]);
        // Each slice weighs exp2((m_w - max) * c); slices (or whole rows) that saw no key weigh 0.
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < cfg::WN; ++w) {
            const float mw = st_m[(wm * cfg::WN + w) * 16 + row];
            sum += mw == QA_NEG_INF ? 0.f : thread_exp2((mw - mx) * c) * st_l[(wm * cfg::WN + w) * 16 + row];
        }
        const bool empty = !(sum > 0.f);
        const float mine = st.m[h] == QA_NEG_INF ? 0.f : thread_exp2((st.m[h] - mx) * c);
#if MODS
        // One split: the sink joins the denominator here (several: in the merge).
        float m2 = mx * c, fs = 1.f;
        const int r = r0 + wm * 16 + row;
        if (p.splits == 1 && !empty && r < p.rows) thread_add_sink(m2, sum, fs, mp.sink_log2[kv_head * p.group + r / p.q_len]);
        f[h] = empty ? 0.f : mine * fs / sum;
        if (wn == 0 && (lane & 3) == 0)
            st_lse[wm * 16 + row] = empty ? QA_NEG_INF : (m2 + thread_log2(sum)) * 0.6931471805599453f;
#else
        f[h] = empty ? 0.f : mine / sum;
        if (wn == 0 && (lane & 3) == 0)
            st_lse[wm * 16 + row] = empty ? QA_NEG_INF : (mx * c + thread_log2(sum)) * 0.6931471805599453f;
#endif
    }
    {
        float* my = slab + warp * cfg::SLAB_FLOATS;
#pragma unroll
        for (int d = 0; d < cfg::D_FRAGS; ++d)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float2 v2 = make_float2(st.o[0][d][2 * h] * f[h], st.o[0][d][2 * h + 1] * f[h]);
                *reinterpret_cast<float2*>(my + (g + 8 * h) * cfg::O_PITCH + d * 8 + 2 * (lane & 3)) = v2;
            }
    }
    __syncthreads();

    const int pair = batch * p.kv_heads + kv_head;
    const bool direct = p.splits == 1;
    for (int idx = threadIdx.x; idx < n_rows * cfg::CHUNKS; idx += cfg::THREADS) {
        const int rl = idx / cfg::CHUNKS, chunk = idx % cfg::CHUNKS;
        const int tile = rl / 16, rr = rl % 16, r = r0 + rl;
        float acc[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) acc[x] = 0.f;
#pragma unroll
        for (int w = 0; w < cfg::WN; ++w) {
            const float* src = slab + (tile * cfg::WN + w) * cfg::SLAB_FLOATS + rr * cfg::O_PITCH + chunk * 8;
            const float4 a = *reinterpret_cast<const float4*>(src);
            const float4 b = *reinterpret_cast<const float4*>(src + 4);
            acc[0] += a.x; acc[1] += a.y; acc[2] += a.z; acc[3] += a.w;
            acc[4] += b.x; acc[5] += b.y; acc[6] += b.z; acc[7] += b.w;
        }
        if (direct) {
            const int head = kv_head * p.group + r / p.q_len, pos = r % p.q_len;
            unsigned short* dst = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride +
                                  (i64)head * p.o_head_stride + (i64)pos * p.o_seq_stride + chunk * 8;
            const u32 x = thread_pack_in(acc[0], acc[1]), y = thread_pack_in(acc[2], acc[3]);
            const u32 z = thread_pack_in(acc[4], acc[5]), w = thread_pack_in(acc[6], acc[7]);
            asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n" :: "l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
        } else {
            float* dst = reinterpret_cast<float*>(p.part_o) + (((i64)pair * p.splits + split) * p.rows + r) * cfg::D + chunk * 8;
            *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
            *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
        }
    }
    for (int rl = threadIdx.x; rl < n_rows; rl += cfg::THREADS) {
        const int r = r0 + rl;
        if (direct) {
            const int head = kv_head * p.group + r / p.q_len, pos = r % p.q_len;
            reinterpret_cast<float*>(p.lse)[((i64)batch * p.q_heads + head) * p.q_len + pos] = st_lse[rl];
        } else {
            reinterpret_cast<float*>(p.part_lse)[((i64)pair * p.splits + split) * p.rows + r] = st_lse[rl];
        }
    }
    if (direct) return;

    // The last split of the row block to finish merges all of them: each CTA makes its partial
    // state visible device-wide, then counts itself in; the one that brings the count to
    // `splits` resets it for the next launch (every split has counted) and merges.
    __shared__ int merges;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* counter = reinterpret_cast<unsigned*>(p.counters) + (i64)pair * ((p.rows + cfg::BM - 1) / cfg::BM) + row_block;
        const bool last = atomicAdd(counter, 1u) == (unsigned)p.splits - 1;
        if (last) atomicExch(counter, 0u);
        merges = last;
    }
    __syncthreads();
    if (!merges) return;
    __threadfence();
    cta_merge_splits(p, reinterpret_cast<float*>(smem_raw), pair, r0, n_rows MOD_PASS);
}
