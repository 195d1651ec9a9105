// Shared device helpers for every quattn native kernel.
//
// NVRTC 13.0 ships no cuda_fp16.h / cuda_bf16.h among its builtin headers and the GPU-less CI
// has no toolkit, so nothing here includes a header: half-precision values travel as raw bits in
// `unsigned short` / packed `unsigned int`, and every conversion or tensor-core op is inline PTX.
// Names say who executes the op: `thread_*` (one lane), `quad_*` (the 4 lanes that share an MMA
// accumulator row), `warp_*` (a whole warp, e.g. ldmatrix / mma.sync), `cta_*` (the block).
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// -inf without <cmath>/<limits>: masks and "row sees no key" both rely on it.
#define QA_NEG_INF __int_as_float(0xff800000u)

// ---- shared-memory addressing -------------------------------------------------------------

// ldmatrix / cp.async / st.shared take 32-bit shared-window addresses; converting once keeps
// the 64-bit generic pointer arithmetic out of the main loop.
__device__ __forceinline__ u32 cta_smem_addr(const void* p) {
    u32 a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(a) : "l"(p));
    return a;
}

// ---- global -> shared copies (Ampere cp.async) --------------------------------------------

// 16-byte async copy that bypasses L1 (.cg): K/V tiles are read once per CTA, L2 is where the
// reuse across CTAs happens. `src_bytes` = 0 zero-fills the destination, which is how rows past
// the sequence end become harmless zeros (a NaN garbage row of V would poison P·V even with P=0).
__device__ __forceinline__ void thread_cp_async_16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void thread_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void thread_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// ---- shared -> register fragments ---------------------------------------------------------

__device__ __forceinline__ void warp_ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// Transposed load: turns a row-major [key][dim] V tile into the "col" B operand of P·V.
__device__ __forceinline__ void warp_ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ---- tensor-core MMA m16n8k16 (row.col) ----------------------------------------------------
// Fragment layout (lane = 4*g + t): accumulator c0,c1 -> row g, cols 2t,2t+1; c2,c3 -> row g+8.
// A a0:(g, 2t..) a1:(g+8, 2t..) a2:(g, 2t+8..) a3:(g+8, 2t+8..); B b0:(k 2t.., n g) b1:(k 2t+8.., n g).

// fp16 inputs, f32 accumulators (SASS HMMA.16816.F32).
__device__ __forceinline__ void warp_mma_f16_f32acc(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// bf16 inputs, f32 accumulators (SASS HMMA.16816.F32.BF16); bf16 has no f16-accumulating form.
__device__ __forceinline__ void warp_mma_bf16_f32acc(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// fp16 inputs, fp16 accumulators (SASS HMMA.16816.F16): twice the rate on consumer parts,
// accumulator holds two packed halves per register.
__device__ __forceinline__ void warp_mma_f16_f16acc(u32 (&d)[2], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 "
                 "{%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
                 : "+r"(d[0]), "+r"(d[1])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- tensor-core MMA m16n8k32 (row.col), 8-bit integers ----------------------------------
// Byte for byte the fragments of m16n8k16 with 16-bit elements: a0 = row g, bytes 4t..4t+3 of
// the 32-byte k step, a1 = row g+8, a2/a3 = bytes 16+4t.. of rows g / g+8; b0/b1 = key g, bytes
// 4t.. / 16+4t..; c0,c1 -> row g, cols 2t,2t+1; c2,c3 -> row g+8. So ldmatrix .b16 of a
// swizzled int8 tile yields them unchanged, 32 bytes per k step.

// s8 x s8 -> s32 (SASS IMMA.16832.S8.S8). Exact: |sum| <= 127^2 * head_dim never wraps for any
// head dim this project has, so no .satfinite.
__device__ __forceinline__ void warp_mma_s8_s32acc(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An s32 accumulator started at THREAD_I2F_BIAS instead of 0 holds bits(1.5 * 2^23 + x) for the
// sum x, as long as |x| < 2^22 (|x| <= 127^2 * 256 = 4129024 < 4194304 = 2^22 up to head dim
// 256): floats in [2^23, 2^24) have unit spacing, so integer and float addition agree there.
// thread_biased_to_f32 then recovers float(x) exactly with one FADD instead of one I2F per
// score, the conversion sm_80 has (on the slow conversion pipe). sm_86 and later also have I2FP,
// one integer-ALU instruction that the s8 wgmma kernels use instead (fwd_wgmma_int8.cu); the
// mma.sync kernel (fwd_int8.cu) keeps this form, with which its f32-P·V hd128 tiles do not spill.
#define THREAD_I2F_BIAS 0x4B400000
__device__ __forceinline__ float thread_biased_to_f32(int biased) {
    return __int_as_float(biased) - 12582912.0f;
}

// ---- conversions (register-level, round to nearest even) ----------------------------------

// cvt.*x2.f32 puts its FIRST source in the UPPER half, so `hi` goes first: the lower half must
// hold the element with the smaller column index to match the MMA fragment layout.
__device__ __forceinline__ u32 thread_pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 thread_pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ void thread_unpack_f16x2(u32 v, float& lo, float& hi) {
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }\n"
        : "=f"(lo), "=f"(hi) : "r"(v));
}

// Adds an f16 m16n8 accumulator fragment (two packed registers) into the matching four f32
// accumulators: the fold of two-stage and f16-per-tile accumulation.
__device__ __forceinline__ void thread_fold_f16_frag(const u32 (&h)[2], float (&acc)[4]) {
    float e0, e1, e2, e3;
    thread_unpack_f16x2(h[0], e0, e1);
    thread_unpack_f16x2(h[1], e2, e3);
    acc[0] += e0; acc[1] += e1; acc[2] += e2; acc[3] += e3;
}

// ---- softmax pieces ------------------------------------------------------------------------

// MUFU.EX2 directly: the softmax scale is folded into the argument by the caller with one FMA
// (x = s*c - m*c, c = scale*log2 e), so no extra multiply by log2 e hides in here.
// ex2.approx(-inf) = +0, which is what masked scores need.
__device__ __forceinline__ float thread_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float thread_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// A row of an MMA accumulator is spread over the 4 lanes of a quad: two xor-shuffles reduce it.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// Row max and row sum of one lane's part of an m64nN wgmma accumulator (N / 2 f32 values: entry
// e belongs to row (e >> 1) & 1, i.e. g or g + 8, and column group e >> 2), each in four
// independent partials per row. One running value per row would be a chain of N / 4 dependent
// FMNMX or FADD; the softmax runs with one warp per scheduler (the other warpgroup is in its
// MMAs), so that chain's latency, not the issue rate, would bound it.
template <int N>
__device__ __forceinline__ void thread_row_max(const float (&s)[N / 2], const float (&m)[2], float (&mx)[2]) {
    static_assert(N % 32 == 0, "column groups of 8, four partials");
    float p[2][4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        p[0][a] = fmaxf(s[4 * a], s[4 * a + 1]);
        p[1][a] = fmaxf(s[4 * a + 2], s[4 * a + 3]);
    }
#pragma unroll
    for (int n = 4; n < N / 8; ++n) {
        p[0][n % 4] = fmaxf(p[0][n % 4], fmaxf(s[4 * n], s[4 * n + 1]));
        p[1][n % 4] = fmaxf(p[1][n % 4], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) mx[i] = fmaxf(fmaxf(m[i], fmaxf(p[i][0], p[i][1])), fmaxf(p[i][2], p[i][3]));
}
template <int N>
__device__ __forceinline__ void thread_row_sum_add(const float (&s)[N / 2], float (&l)[2]) {
    static_assert(N % 32 == 0, "column groups of 8, four partials");
    float p[2][4];
#pragma unroll
    for (int a = 0; a < 4; ++a) p[0][a] = p[1][a] = 0.f;
#pragma unroll
    for (int e = 0; e < N / 2; ++e) p[(e >> 1) & 1][(e >> 2) % 4] += s[e];
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] += (p[i][0] + p[i][1]) + (p[i][2] + p[i][3]);
}

// ---- swizzled shared-memory tiles ----------------------------------------------------------

// XOR pattern of row `row`'s 16-byte chunk index in a swizzled tile (see tile_swizzle).
// 128-byte (or longer) rows: (row & 7), so the 8 rows of one ldmatrix 8x8 matrix hit 8 distinct
// 16-byte bank groups. 64-byte rows (int8 at head dim 64): two rows share a 128-byte bank line,
// so rows r and r+2 collide unless their 4 chunks are permuted by (row >> 1) & 3; row parity
// already separates the two halves of the line. Either pattern is unchanged by a multiple of 16
// rows, which is what lets TileLane turn 16-row steps into immediate offsets.
template <int ROW_BYTES>
__device__ __forceinline__ int tile_swizzle_bits(int row) {
    static_assert(ROW_BYTES % 128 == 0 || ROW_BYTES == 64, "swizzle needs 64-byte or 128-byte-multiple rows");
    if constexpr (ROW_BYTES == 64) return (row >> 1) & 3;
    else return row & 7;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows are ROW_BYTES long.
// The chunk index is XOR-ed with tile_swizzle_bits(row): the 8 row addresses of one ldmatrix
// 8x8 matrix then fall in 8 distinct 16-byte bank groups, and cp.async writes of consecutive
// chunks stay a permutation of those groups, so neither side has bank conflicts.
template <int ROW_BYTES>
__device__ __forceinline__ u32 tile_swizzle(int row, int chunk) {
    return (u32)(row * ROW_BYTES + ((chunk ^ tile_swizzle_bits<ROW_BYTES>(row)) << 4));
}

// A lane's ldmatrix row inside a swizzled tile, split so that the per-k-step part is one XOR:
// tile_swizzle(row + 16 * i, 2 * c + hi) == row * ROW_BYTES + 16 * i * ROW_BYTES
// + ((32 * c) ^ xr) with xr = (hi ^ tile_swizzle_bits(row)) << 4 (XOR is associative and
// 2c + hi == 2c ^ hi), because a multiple of 16 rows leaves the swizzle bits alone. The 16-row
// steps (m tiles, key pairs) become immediate offsets of LDSM. A 32-byte chunk pair is one k16
// step of a 16-bit operand or one k32 step of an 8-bit one.
template <int ROW_BYTES>
struct TileLane {
    u32 off;   // row * ROW_BYTES
    u32 xr;    // (hi ^ swizzle bits of row) << 4
    __device__ __forceinline__ TileLane(int row, int hi)
        : off((u32)(row * ROW_BYTES)), xr((u32)((hi ^ tile_swizzle_bits<ROW_BYTES>(row)) << 4)) {}
    // Address of chunk pair c (chunks 2c, 2c+1) of this lane's row, 16*i rows further down.
    __device__ __forceinline__ u32 at(u32 tile, int i, int c) const {
        return tile + off + (u32)(i * 16 * ROW_BYTES) + (((u32)c << 5) ^ xr);
    }
};

// threadIdx.x through a volatile move: what is derived from it (a copy's row, chunk, swizzled
// destination and 64-bit row offset) is recomputed at each use instead of being hoisted out of
// the KV loop as live registers.
__device__ __forceinline__ int cta_tid() {
    int v;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
    return v;
}

// The value through an opaque move: what is computed from it inside a loop stays inside the
// loop instead of being hoisted as a live register (a kernel parameter is re-read from the
// constant bank at the move).
template <typename T>
__device__ __forceinline__ T opaque(T v) {
    if constexpr (sizeof(T) == 8) asm volatile("" : "+l"(v));
    else asm volatile("" : "+r"(v));
    return v;
}

// Copies ROWS rows of ROW_BYTES bytes (row stride `stride` bytes) into a swizzled tile with
// THREADS threads; rows at or past `rows_valid` are zero-filled (their source address is
// clamped to row 0, never read). FULL: every row is valid (in-loop prefetches of whole tiles),
// no predicate at all. A thread copies the same chunk of rows row0, row0 + STEP, ...:
// STEP is a multiple of 8 rows, so the swizzle is the same for all of them and destinations
// are one register plus immediates. Sources walk by one 64-bit step made opaque on every call,
// and the thread index is read opaquely: otherwise the compiler hoists every row's
// `row * stride` and predicate out of the KV loop and keeps them alive across it (what made
// wide tiles spill).
template <int ROWS, int ROW_BYTES, int THREADS, bool FULL = false>
__device__ __forceinline__ void cta_copy_rows(u32 dst, const unsigned char* src, i64 stride, int rows_valid) {
    constexpr int CHUNKS = ROW_BYTES / 16;
    constexpr int STEP = THREADS / CHUNKS;
    static_assert(THREADS % CHUNKS == 0 && ROWS % STEP == 0 && STEP % 8 == 0, "even copy split");
    const int tid = cta_tid();
    const int row0 = tid / CHUNKS;
    const int chunk = tid % CHUNKS;
    stride = opaque(stride);
    const i64 step = opaque((i64)STEP * stride);
    const unsigned char* s = src + (i64)row0 * stride + chunk * 16;
    const u32 d = dst + tile_swizzle<ROW_BYTES>(row0, chunk);
#pragma unroll
    for (int i = 0; i < ROWS / STEP; ++i) {
        if constexpr (FULL) {
            thread_cp_async_16(d + i * STEP * ROW_BYTES, s, 16);
        } else {
            const int row = row0 + i * STEP;
            const bool ok = row < rows_valid;
            thread_cp_async_16(d + i * STEP * ROW_BYTES, ok ? s : src, ok ? 16 : 0);
        }
        s += step;
    }
}

// ---- flash-attention mainloop pieces shared by the mma.sync kernels --------------------------
// A warp owns MT m16 tiles of query rows; rows g and g+8 of each m tile live in a lane's c0,c1 /
// c2,c3 accumulator halves, so per-row quantities are indexed [2 * mt + half].

// O += P·V for one KV tile of 16 * P_STEPS keys, P (16-bit, packed as m16k16 A fragments) and V
// (16-bit, a swizzled [key][dim] tile of D dims) both f16, or both bf16 with BF16. ldmatrix.x4
// .trans lane -> row address: matrices (keys +0..7, dims +0..7), (keys +8..15, dims +0..7),
// (keys +0..7, dims +8..15), (keys +8..15, dims +8..15) = b0,b1 of two n8 tiles, so each V
// fragment feeds 2 * MT MMAs. Head-dim pairs outermost so the f16 accumulator of F16_PER_TILE
// is MT * 4 registers, not a whole O row; per output element the keys are summed in ascending
// k16 steps either way. F16_PER_TILE: P <= 1, so one tile's P·V stays far inside fp16 range;
// it is folded into the f32 O once per tile (bf16 MMAs have no f16 accumulator).
template <int MT, int P_STEPS, int D, bool F16_PER_TILE, bool BF16>
__device__ __forceinline__ void warp_value_matmul(float (&o)[MT][D / 8][4], const u32 (&p)[MT][P_STEPS][4],
                                                  u32 v_tile, const TileLane<2 * D>& vr) {
    static_assert(!(F16_PER_TILE && BF16), "bf16 MMAs accumulate in f32 only");
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
        if constexpr (!F16_PER_TILE) {
#pragma unroll
            for (int kp = 0; kp < P_STEPS; ++kp) {
                u32 b[4];
                warp_ldmatrix_x4_trans(b, vr.at(v_tile, kp, dp));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if constexpr (BF16) {
                        warp_mma_bf16_f32acc(o[mt][2 * dp], p[mt][kp], b[0], b[1]);
                        warp_mma_bf16_f32acc(o[mt][2 * dp + 1], p[mt][kp], b[2], b[3]);
                    } else {
                        warp_mma_f16_f32acc(o[mt][2 * dp], p[mt][kp], b[0], b[1]);
                        warp_mma_f16_f32acc(o[mt][2 * dp + 1], p[mt][kp], b[2], b[3]);
                    }
                }
            }
        } else {
            u32 h[MT][2][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) h[mt][0][0] = h[mt][0][1] = h[mt][1][0] = h[mt][1][1] = 0u;
#pragma unroll
            for (int kp = 0; kp < P_STEPS; ++kp) {
                u32 b[4];
                warp_ldmatrix_x4_trans(b, vr.at(v_tile, kp, dp));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    warp_mma_f16_f16acc(h[mt][0], p[mt][kp], b[0], b[1]);
                    warp_mma_f16_f16acc(h[mt][1], p[mt][kp], b[2], b[3]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int x = 0; x < 2; ++x) thread_fold_f16_frag(h[mt][x], o[mt][2 * dp + x]);
        }
    }
}

// Key j of row entry i (row g + 8 * (i % 2) of m tile i / 2) is kept iff j < min(kv_len,
// diag + 16 * (i / 2) + 8 * (i % 2)), where `diag` is the first key row entry 0 no longer sees
// (bottom-right causal) or far past kv_len (no causal mask). Masked scores become -inf. Only
// diagonal / sequence-end tiles call this; recomputed from two scalars per masked tile rather
// than kept as 2 * MT live registers across the whole KV loop.
template <int MT, int N_FRAGS>
__device__ __forceinline__ void warp_mask_tile(float (&s)[MT][N_FRAGS][4], int key0, int kv_len, int diag, int lane) {
    const int col = key0 + 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        const int limit = min(kv_len, diag + 16 * (i >> 1) + 8 * (i & 1)) - col;
#pragma unroll
        for (int n = 0; n < N_FRAGS; ++n)
#pragma unroll
            for (int x = 0; x < 2; ++x)
                if (n * 8 + x >= limit) s[i >> 1][n][2 * (i & 1) + x] = QA_NEG_INF;
    }
}

// Stores a warp's O rows (f32 accumulators times the per-row factor `inv`) as 16-bit values:
// through the warp's own rows of a swizzled [row][dim] shared tile `o_tile` (rows warp_row0..
// +16 * MT), then 16-byte coalesced global stores of the rows below `rows_valid`. The caller
// guarantees no other warp touches those shared rows meanwhile.
template <int MT, int D, bool BF16>
__device__ __forceinline__ void warp_store_o(const float (&o)[MT][D / 8][4], const float (&inv)[2 * MT], u32 o_tile,
                                             int warp_row0, unsigned short* o_rows, i64 o_seq_stride,
                                             int rows_valid, int lane) {
    constexpr int ROW_BYTES = 2 * D;
    constexpr int CHUNKS = D / 8;
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int d = 0; d < D / 8; ++d)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float sc = inv[2 * mt + r];
                const u32 packed = BF16 ? thread_pack_bf16x2(o[mt][d][2 * r] * sc, o[mt][d][2 * r + 1] * sc)
                                        : thread_pack_f16x2(o[mt][d][2 * r] * sc, o[mt][d][2 * r + 1] * sc);
                const int row = warp_row0 + 16 * mt + 8 * r + (lane >> 2);
                const u32 addr = o_tile + tile_swizzle<ROW_BYTES>(row, d) + 4 * (lane & 3);
                asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(packed) : "memory");
            }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * MT * CHUNKS / 32; ++i) {
        const int idx = lane + 32 * i;
        const int r = warp_row0 + idx / CHUNKS;
        const int chunk = idx % CHUNKS;
        u32 x, y, z, w;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                     : "r"(o_tile + tile_swizzle<ROW_BYTES>(r, chunk)));
        if (r < rows_valid) {
            unsigned short* dst = o_rows + (i64)r * o_seq_stride + chunk * 8;
            asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                         :: "l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
        }
    }
}

// ---- exactly rounded f32 arithmetic ----------------------------------------------------------

// Explicit `.rn` keeps ptxas from contracting a multiply and a following add into one FMA: the
// INT8 kernels round `s = dot * scale` and `l * alpha` exactly where the CPU emulation does.
__device__ __forceinline__ float thread_mul_rn(float a, float b) {
    float y;
    asm("mul.rn.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
__device__ __forceinline__ float thread_add_rn(float a, float b) {
    float y;
    asm("add.rn.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
__device__ __forceinline__ float thread_sub_rn(float a, float b) {
    float y;
    asm("sub.rn.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
__device__ __forceinline__ float thread_div_rn(float a, float b) {
    float y;
    asm("div.rn.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
    return y;
}

// ---- proxies and mbarriers (sm_90+) ----------------------------------------------------------

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async once waited for)
// visible to the async proxy that tensor-core operand reads (wgmma / tcgen05.mma) go through.
__device__ __forceinline__ void thread_fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void thread_mbarrier_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// Publishes mbarrier.init to the async proxy (tcgen05.commit arrives from there); a CTA
// barrier must follow before any other thread uses the mbarrier.
__device__ __forceinline__ void thread_fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Spins until the phase of parity `parity` has completed (the first phase has parity 0).
__device__ __forceinline__ void thread_mbarrier_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// One arrival (count 1) on the current phase.
__device__ __forceinline__ void thread_mbarrier_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// One arrival that also announces `bytes` of asynchronous transactions (TMA) for this phase:
// the phase completes when every arrival came and every announced byte landed.
__device__ __forceinline__ void thread_mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}

// ---- the tensor memory accelerator (TMA, sm_90+) ---------------------------------------------
// A CUtensorMap is 128 opaque bytes (aligned to 128 as CUDA 13 declares it), built on the host by
// cuTensorMapEncodeTiled; kernels take it by value as a `__grid_constant__` parameter and TMA
// instructions take its generic address.
struct __align__(128) TmaMap {
    u64 opaque[16];
};
// Loads the box at coordinates (c0 innermost .. c3) of a rank-4 tensor map into shared memory
// at `dst` (the map's swizzle applied; out-of-bounds elements zero-filled); the bytes complete
// on `bar`. One thread issues it.
__device__ __forceinline__ void thread_tma_load_4d(u32 dst, const TmaMap* map, u32 bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void thread_tma_prefetch_map(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(reinterpret_cast<u64>(map)) : "memory");
}

// ---- named barriers and register reallocation ------------------------------------------------
// bar.sync / bar.arrive on barrier `id` (1..15; 0 is __syncthreads) with `count` threads in all
// (a multiple of 32): the arriving warps do not wait.
__device__ __forceinline__ void cta_named_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void cta_named_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
#endif

// ---- query-block bookkeeping and the O epilogue of the wgmma kernels -------------------------

// ---- score modifiers (the MODS variants of fwd_wgmma, fwd_hmma and fwd_decode) -----------------
//
// Row i sits at a(i) = i + offset among the keys and sees keys a(i) - left ..= a(i) + right
// (causal: right = 0). Extents at or above MOD_UNBOUNDED are unbounded; the host keeps q_len and
// kv_len below it too, so a(i) ± extent + 1 stays inside int. Rust mirror: `ModParams` in
// src/mods.rs; it travels as a __grid_constant__ kernel argument (per-head arrays indexed by
// the CTA's head read the parameter space, no local copy). A dense launch has one offset for
// every row (`offset`); the VARLEN variants align each sequence against its own lengths, so
// they take the alignment (`top_left`) and compute the offset per sequence (mod_offset).

// The modifier switches of the kernels with MODS variants (-D on the NVRTC command line; off
// when absent). Softcap and ALiBi are parts of a MODS variant.
#ifndef MODS
#define MODS 0
#endif
#ifndef MOD_SOFTCAP
#define MOD_SOFTCAP 0
#endif
#ifndef MOD_ALIBI
#define MOD_ALIBI 0
#endif
#if (MOD_SOFTCAP || MOD_ALIBI) && !MODS
#error "MOD_SOFTCAP and MOD_ALIBI need MODS"
#endif
#define MOD_UNBOUNDED (1 << 29)
#define MOD_MAX_HEADS 128
struct ModParams {
    int offset;                        // a(i) = i + offset (dense launches)
    int left, right;                   // window extents (causal: right = 0); MOD_UNBOUNDED: none
    int top_left;                      // 1: offset 0 whatever the lengths; 0: kv_len - q_len
    float cap_raw;                     // softcap / scale (raw score units)
    float inv_cap_raw;                 // scale / softcap
    float alibi_raw[MOD_MAX_HEADS];    // ALiBi slope / scale per q head
    float sink_log2[MOD_MAX_HEADS];    // sink · log2(e) per q head; -inf: no sink
};

// a(0) of a sequence of q_len queries over kv_len keys, as the alignment says.
__device__ __forceinline__ int mod_offset(const ModParams& mp, int q_len, int kv_len) {
    return mp.top_left ? 0 : kv_len - q_len;
}

// The keys of rows at aligned positions a_first ..= a_last, in keys rather than the tiles of
// `cta_mod_tiles` (the decode kernel's splits start anywhere): some row sees lo ..< hi (none
// when hi <= lo), every row sees full_lo ..< full_hi (none when full_hi <= full_lo).
struct ModKeys {
    int lo, hi, full_lo, full_hi;
};
__device__ __forceinline__ ModKeys mod_keys(int kv_len, const ModParams& mp, int a_first, int a_last) {
    ModKeys k;
    k.lo = max(0, a_first - mp.left);
    k.hi = min(kv_len, a_last + mp.right + 1);
    k.full_lo = max(0, a_last - mp.left);
    k.full_hi = min(kv_len, a_first + mp.right + 1);
    return k;
}

// The KV tiles of a CTA of BM rows from m0: t_lo .. t_lo + n_tiles - 1, of which full_lo ..=
// full_hi every row of the CTA sees whole (no mask needed).
struct ModTiles {
    int t_lo, n_tiles, full_lo, full_hi;
};
template <int BM, int BN>
__device__ __forceinline__ ModTiles cta_mod_tiles(int kv_len, int offset, const ModParams& mp, int m0) {
    const int a_first = m0 + offset;
    const int a_last = m0 + BM - 1 + offset;
    const int hi = min(kv_len, a_last + mp.right + 1);   // keys below hi are seen by some row
    const int lo = max(0, a_first - mp.left);            // keys from lo on are seen by some row
    ModTiles t;
    if (hi <= lo) {
        t.t_lo = 0;
        t.n_tiles = 0;
        t.full_lo = 0;
        t.full_hi = -1;
        return t;
    }
    t.t_lo = lo / BN;
    t.n_tiles = (hi + BN - 1) / BN - t.t_lo;
    // Whole for every row: keys below min(kv_len, a_first + right + 1) and from a_last - left on.
    const int full_end = min(kv_len, a_first + mp.right + 1);
    t.full_hi = full_end >= BN ? full_end / BN - 1 : -1;
    const int full_start = a_last - mp.left;
    t.full_lo = full_start > 0 ? (full_start + BN - 1) / BN : 0;
    return t;
}

// tanh x = 1 - 2 / (1 + 2^(2x log2 e)): MUFU exp2 and a fast division, absolute error ~1e-7
// (tanh.approx's 2^-11 relative error is too coarse once multiplied by the cap). ±inf give ±1.
__device__ __forceinline__ float thread_tanh(float x) {
    const float e = thread_exp2(x * 2.8853900817779268f);
    return 1.f - __fdividef(2.f, 1.f + e);
}

// One score after the modifiers, in raw units: softcap, ALiBi (slope already / scale), then the
// band and sequence-end mask when MASK (lo ..< hi: this row's visible keys).
template <bool MASK, bool SOFTCAP, bool ALIBI>
__device__ __forceinline__ float thread_mod_score(float v, const ModParams& mp, float slope, int a, int key, int lo, int hi) {
    if (SOFTCAP) v = mp.cap_raw * thread_tanh(v * mp.inv_cap_raw);
    if (ALIBI) v -= slope * fabsf((float)(a - key));
    if (MASK && (key < lo || key >= hi)) v = QA_NEG_INF;
    return v;
}

// The epilogue with sinks: the sink joins the denominator of a row that saw keys. `m2` is the
// row's running max in log2 units and `sum` its sum of exp2(s·c - m2); both come back relative
// to max(m2, sink) so neither term overflows; `f` is the factor O's unnormalized sum takes.
__device__ __forceinline__ void thread_add_sink(float& m2, float& sum, float& f, float sink_log2) {
    const float mx = fmaxf(m2, sink_log2);
    f = thread_exp2(m2 - mx);
    sum = fmaf(sum, f, thread_exp2(sink_log2 - mx));
    m2 = mx;
}


// The KV tiles a query block of BM rows starting at m0 visits, with BN keys per tile: n_tiles,
// processed last tile first (j = 0 is tile n_tiles - 1), the first n_masked of them (in
// processing order) masked (bottom-right causal alignment; tiles past the diagonal skipped).
// P: a kernel parameter block with q_len, kv_len and causal.
struct CtaTiles {
    int n_tiles;
    int n_masked;
};
template <int BM, int BN, class P>
__device__ __forceinline__ CtaTiles cta_tiles(const P& p, int m0) {
    const int offset = p.kv_len - p.q_len;
    int n_end = p.kv_len;
    int full_end = p.kv_len / BN;
    if (p.causal) {
        n_end = min(n_end, m0 + BM + offset);
        const int first_row_sees = m0 + offset + 1;
        full_end = min(full_end, first_row_sees >= 0 ? first_row_sees / BN : 0);
    }
    CtaTiles t;
    t.n_tiles = n_end > 0 ? (n_end + BN - 1) / BN : 0;
    t.n_masked = t.n_tiles - min(max(full_end, 0), t.n_tiles);
    return t;
}

// Stores a staged f16 O block of BM rows x D (128B-swizzle column blocks at `stage`, as the
// wgmma kernels stage it) to global memory with 16-byte coalesced stores, by the `tid`-th of
// THREADS threads. P: a kernel parameter block with o, o_batch_stride, o_head_stride,
// o_seq_stride and q_len; grid y = head, z = batch.
template <int BM, int D, int THREADS, class P>
__device__ __forceinline__ void cta_store_o(const P& p, u32 stage, int m0, int tid) {
    int head, batch;   // volatile reads, as the kernels' cta_head / cta_batch: not kept live
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(head));
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(batch));
    unsigned short* o_head = reinterpret_cast<unsigned short*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int k = 0; k < BM * CHUNKS / THREADS; ++k) {
        const int idx = tid + THREADS * k;
        const int r = idx / CHUNKS;
        const int chunk = idx % CHUNKS;
        u32 x, y, z, w;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                     : "r"(stage + (u32)((chunk >> 3) * BM * 128) + tile_swizzle<128>(r, chunk & 7)));
        if (m0 + r < p.q_len) {
            unsigned short* dst = o_head + (i64)(m0 + r) * p.o_seq_stride + chunk * 8;
            asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                         :: "l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
        }
    }
}

// ---- variable-length batches (the VARLEN variants of fwd_wgmma and fwd_hmma) -----------------
//
// Sequences packed token-major: Q and O rows [cu_q[b], cu_q[b + 1]), K and V rows [cu_k[b],
// cu_k[b + 1]) belong to sequence b = blockIdx.z; a row's head h starts at row * seq_stride +
// h * head_stride (the batch strides are unused). LSE is [q_heads, total_q]. Rust mirror:
// `VarlenParams` in src/varlen.rs; the host checks the cumulative lengths before a launch.
struct VarlenParams {
    u64 cu_q, cu_k;   // int32 [batch + 1], from 0, non-decreasing
    int total_q;      // cu_q[batch]: the LSE's row count per head
    int pad_;
};

// One sequence's rows: Q/O from q0, K/V from k0, its own lengths, and the launch's causal flag
// (so that cta_tiles takes it as it takes the kernel parameters).
struct SeqSpan {
    int q0, k0, q_len, kv_len, causal;
};
__device__ __forceinline__ SeqSpan cta_seq_span(const VarlenParams& vp, int b, int causal) {
    const int* cq = reinterpret_cast<const int*>(vp.cu_q);
    const int* ck = reinterpret_cast<const int*>(vp.cu_k);
    SeqSpan s;
    s.q0 = cq[b];
    s.k0 = ck[b];
    s.q_len = cq[b + 1] - s.q0;
    s.kv_len = max(ck[b + 1] - s.k0, 0);
    s.causal = causal;
    return s;
}

// cta_store_o for rows addressed directly: `o_rows` is the CTA's first row (m0) of its head,
// rows below `rows_valid` are stored, the others never touched.
template <int BM, int D, int THREADS>
__device__ __forceinline__ void cta_store_o_rows(unsigned short* o_rows, i64 o_seq_stride, int rows_valid, u32 stage,
                                                 int tid) {
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int k = 0; k < BM * CHUNKS / THREADS; ++k) {
        const int idx = tid + THREADS * k;
        const int r = idx / CHUNKS;
        const int chunk = idx % CHUNKS;
        u32 x, y, z, w;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                     : "r"(stage + (u32)((chunk >> 3) * BM * 128) + tile_swizzle<128>(r, chunk & 7)));
        if (r < rows_valid) {
            unsigned short* dst = o_rows + (i64)r * o_seq_stride + chunk * 8;
            asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                         :: "l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
        }
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// ---- the mbarriers of a warp-specialized K/V pipeline -----------------------------------------
// 8 bytes each at `base` (8-byte aligned): Q full, then per stage s K full, V full, K empty,
// V empty. A producer thread arrives on a "full" barrier with the tile's byte count (TMA
// completes it); each consumer warp arrives on an "empty" barrier once its wgmmas have read the
// stage. Phases alternate per use of a stage: use u = j / stages waits for parity u & 1 on
// "full"; the producer's refill waits for parity (u & 1) ^ 1 on "empty" (the previous use).
struct KvBarriers {
    u32 base;
    __host__ __device__ static constexpr int count(int stages) { return 1 + 4 * stages; }
    __device__ __forceinline__ u32 q_full() const { return base; }
    __device__ __forceinline__ u32 k_full(int s) const { return base + 8u * (1 + 4 * s); }
    __device__ __forceinline__ u32 v_full(int s) const { return base + 8u * (2 + 4 * s); }
    __device__ __forceinline__ u32 k_empty(int s) const { return base + 8u * (3 + 4 * s); }
    __device__ __forceinline__ u32 v_empty(int s) const { return base + 8u * (4 + 4 * s); }
    // One thread, before the CTA barrier that publishes them.
    __device__ __forceinline__ void init(int stages, u32 empty_arrivals) const {
        thread_mbarrier_init(q_full(), 1);
        for (int s = 0; s < stages; ++s) {
            thread_mbarrier_init(k_full(s), 1);
            thread_mbarrier_init(v_full(s), 1);
            thread_mbarrier_init(k_empty(s), empty_arrivals);
            thread_mbarrier_init(v_empty(s), empty_arrivals);
        }
        thread_fence_mbarrier_init();
    }
};

// Ping-pong of WG consumer warpgroups (FlashAttention-3; 2 unless a kernel says otherwise):
// consumer cw (0 .. WG - 1) waits on named barrier 1 + cw before it issues a tile's wgmmas and
// arrives on the next one's after, so they take the tensor cores round robin and one's softmax
// overlaps the others' products. 256 threads per barrier: the waiting warpgroup and the arriving
// one. The last consumer gives consumer 0 the first turn and no turn after its last issue, so
// every barrier sees as many arrivals as waits.
__device__ __forceinline__ void wg_wait_turn(int cw) {
    cta_named_sync(1 + cw, 256);
}
template <int WG = 2>
__device__ __forceinline__ void wg_give_turn(int cw) {
    cta_named_arrive(WG == 2 ? 2 - cw : 1 + (cw + 1) % WG, 256);
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// setmaxnreg (sm_90a): a warpgroup gives registers back (dec) or takes them (inc); the whole
// warpgroup executes it. Needs a register cap at kernel entry (__launch_bounds__(n, 1)).
template <int N>
__device__ __forceinline__ void wg_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N>
__device__ __forceinline__ void wg_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
#endif

// ---- tcgen05: tensor memory and the 5th-generation tensor core (sm_100a only) ----------------
//
// Tensor memory (TMEM) is 128 lanes x 512 columns of 32-bit cells per SM, addressed as
// (lane << 16) | column. A warp may touch only lanes 32 * (warp % 4) .. + 31 of it.
// `tcgen05.mma` is issued by one thread, runs asynchronously, reads A and B from shared memory
// through 64-bit matrix descriptors and accumulates D in TMEM; `tcgen05.commit` makes an
// mbarrier track the completion of every tcgen05 op the thread issued before it.
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)

// Allocates `ncols` columns (a power of 2, >= 32) for the CTA and writes their base address
// to shared memory at `dst`. Whole warp; the same warp must deallocate.
__device__ __forceinline__ void warp_tmem_alloc(u32 dst, u32 ncols) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n"
                 :: "r"(dst), "r"(ncols) : "memory");
}
// Gives up this CTA's right to allocate again, so that other CTAs on the SM are not held back.
__device__ __forceinline__ void warp_tmem_relinquish_alloc_permit() {
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void warp_tmem_dealloc(u32 taddr, u32 ncols) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n"
                 :: "r"(taddr), "r"(ncols) : "memory");
}

// Orders this thread's prior tcgen05 ops before a following thread barrier / the barrier
// before this thread's following tcgen05 ops. Used on both sides of every __syncthreads or
// mbarrier wait that hands TMEM or tcgen05 results from one thread to another.
__device__ __forceinline__ void thread_tcgen05_fence_before_sync() {
    asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
}
__device__ __forceinline__ void thread_tcgen05_fence_after_sync() {
    asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
}

// Shared-memory matrix descriptor (PTX ISA "tcgen05 shared memory descriptor"): start address
// >> 4 in bits 0-13, leading-dimension byte offset >> 4 in 16-29, stride-dimension byte offset
// >> 4 in 32-45, the fixed sm100 version 0b001 in 46-48, base offset 0 (49-51), relative LBO
// mode (52), layout type in 61-63 (0: no swizzle, the "interleaved" canonical layout).
__device__ __forceinline__ u64 thread_umma_smem_desc_noswizzle(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lbo >> 4) & 0x3fffu) << 16) |
           ((u64)((sbo >> 4) & 0x3fffu) << 32) | (1ull << 46);
}

// Instruction descriptors (PTX ISA "Instruction descriptor" of tcgen05.mma, dense):
// bits 4-5 D format (0 f16, 1 f32, 2 s32), 7-9 A format, 10-12 B format (kind::f16: 0 f16,
// 1 bf16; kind::i8: 0 u8, 1 s8), 15 A MN-major, 16 B MN-major, 17-22 N >> 3, 24-28 M >> 4.
__host__ __device__ constexpr u32 umma_idesc_s8_s32(int m, int n, bool a_mn_major, bool b_mn_major) {
    return (2u << 4) | (1u << 7) | (1u << 10) | ((u32)a_mn_major << 15) | ((u32)b_mn_major << 16) |
           ((u32)(n >> 3) << 17) | ((u32)(m >> 4) << 24);
}
__host__ __device__ constexpr u32 umma_idesc_f16_f32(int m, int n, bool a_mn_major, bool b_mn_major) {
    return (1u << 4) | ((u32)a_mn_major << 15) | ((u32)b_mn_major << 16) | ((u32)(n >> 3) << 17) |
           ((u32)(m >> 4) << 24);
}

// D[tmem] (+)= A[smem] * B[smem], issued by one thread. `accumulate` false overwrites D.
__device__ __forceinline__ void thread_umma_i8(u32 d_tmem, u64 a_desc, u64 b_desc, u32 idesc, bool accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %4, 0;\n"
                 "tcgen05.mma.cta_group::1.kind::i8 [%0], %1, %2, %3, p; }\n"
                 :: "r"(d_tmem), "l"(a_desc), "l"(b_desc), "r"(idesc), "r"((u32)accumulate) : "memory");
}
__device__ __forceinline__ void thread_umma_f16(u32 d_tmem, u64 a_desc, u64 b_desc, u32 idesc, bool accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %4, 0;\n"
                 "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p; }\n"
                 :: "r"(d_tmem), "l"(a_desc), "l"(b_desc), "r"(idesc), "r"((u32)accumulate) : "memory");
}
// The mbarrier at `bar` gets one arrival once every tcgen05.mma this thread issued completed.
__device__ __forceinline__ void thread_umma_commit(u32 bar) {
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n"
                 :: "r"(bar) : "memory");
}

// 32 consecutive 32-bit columns of the warp's 32 lanes (32x32b shape: lane i of the warp gets
// TMEM lane base + i), waited for inside the same asm statement so that no use of the
// registers can be scheduled before the data has arrived.
__device__ __forceinline__ void warp_tmem_ld_32x32b_x32(u32 (&r)[32], u32 taddr) {
    asm volatile("tcgen05.ld.sync.aligned.32x32b.x32.b32 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, [%32];\n"
                 "tcgen05.wait::ld.sync.aligned;\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]),
                   "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]),
                   "=r"(r[13]), "=r"(r[14]), "=r"(r[15]), "=r"(r[16]), "=r"(r[17]), "=r"(r[18]),
                   "=r"(r[19]), "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]),
                   "=r"(r[25]), "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]),
                   "=r"(r[31])
                 : "r"(taddr) : "memory");
}
// The inverse of warp_tmem_ld_32x32b_x32; completion is waited for with warp_tmem_wait_st.
__device__ __forceinline__ void warp_tmem_st_32x32b_x32(u32 taddr, const u32 (&r)[32]) {
    asm volatile("tcgen05.st.sync.aligned.32x32b.x32.b32 [%0], "
                 "{%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,"
                 "%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32};\n"
                 :: "r"(taddr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[4]), "r"(r[5]),
                    "r"(r[6]), "r"(r[7]), "r"(r[8]), "r"(r[9]), "r"(r[10]), "r"(r[11]), "r"(r[12]),
                    "r"(r[13]), "r"(r[14]), "r"(r[15]), "r"(r[16]), "r"(r[17]), "r"(r[18]),
                    "r"(r[19]), "r"(r[20]), "r"(r[21]), "r"(r[22]), "r"(r[23]), "r"(r[24]),
                    "r"(r[25]), "r"(r[26]), "r"(r[27]), "r"(r[28]), "r"(r[29]), "r"(r[30]), "r"(r[31])
                 : "memory");
}
__device__ __forceinline__ void warp_tmem_wait_st() {
    asm volatile("tcgen05.wait::st.sync.aligned;\n" ::: "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM100_ALL

// ---- warpgroup MMA (wgmma, sm_90a only) -----------------------------------------------------
// Shared by fwd_wgmma.cu and fwd_wgmma_int8.cu: descriptors, fences, commit/wait, register
// fences and the register-A f16 x f16 -> f32 P·V wrappers (fwd_wgmma.cu's header explains the
// layouts and why the register fences are needed).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor, 128-byte swizzle (see the header).
__device__ __forceinline__ u64 sw128_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lbo >> 4) & 0x3fffu) << 16) |
           ((u64)((sbo >> 4) & 0x3fffu) << 32) | (1ull << 62);
}
// Shared-memory matrix descriptor, 64-byte swizzle (layout type 2): the canonical K-major SW64
// layout of 64-byte rows (8-row atoms of 512 bytes, chunk c of row r at c ^ ((r >> 1) & 3), which
// is tile_swizzle<64> on a 512-byte-aligned tile).
__device__ __forceinline__ u64 sw64_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lbo >> 4) & 0x3fffu) << 16) |
           ((u64)((sbo >> 4) & 0x3fffu) << 32) | (2ull << 62);
}
// Shared-memory matrix descriptor, 32-byte swizzle (layout type 3): K-major 32-byte rows in
// 8-row atoms of 256 bytes, written by TMA with CU_TENSOR_MAP_SWIZZLE_32B.
__device__ __forceinline__ u64 sw32_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lbo >> 4) & 0x3fffu) << 16) |
           ((u64)((sbo >> 4) & 0x3fffu) << 32) | (3ull << 62);
}
// A descriptor moved by `units` 16-byte units. The start address is the low 14 bits of the low
// word and shared memory ends below 2^18 bytes, so the sum never carries out of its field: the
// descriptors of a KV loop are a base each and compile-time offsets (one add, not the field
// arithmetic of building a descriptor per wgmma).
__device__ __forceinline__ u64 desc_add(u64 d, u32 units) {
    return (d & 0xffffffff00000000ull) | (u32)((u32)d + units);
}
__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Empty asm that "reads and writes" the registers: keeps accumulator reads after a wait and keeps
// register operands of an in-flight wgmma alive (asm volatile statements keep their order).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(int (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]) :: "memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(u32 (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int x = 0; x < 4; ++x) asm volatile("" : "+r"(r[i][x]) :: "memory");
}

// D[64 x 64] += A[64 x 16] (registers, f16x2) * B[16 x 64] (shared, descriptor, MN-major: tnspB = 1).
__device__ __forceinline__ void wg_mma_rs_n64(float (&d)[32], const u32 (&a)[4], u64 b_desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc) : "memory");
}

// D[64 x 128] += A[64 x 16] (registers, f16x2) * B[16 x 128] (shared, descriptor, MN-major: tnspB = 1).
__device__ __forceinline__ void wg_mma_rs_n128(float (&d)[64], const u32 (&a)[4], u64 b_desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc) : "memory");
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
