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

// ---- swizzled shared-memory tiles ----------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows are ROW_BYTES long.
// The chunk index is XOR-ed with (row & 7): the 8 row addresses of one ldmatrix 8x8 matrix then
// fall in 8 distinct 16-byte bank groups, and cp.async writes of 8 consecutive chunks of one row
// stay a permutation of those groups, so neither side has bank conflicts. Requires ROW_BYTES to
// be a multiple of 128 (head dim >= 64 in 16-bit types).
template <int ROW_BYTES>
__device__ __forceinline__ u32 tile_swizzle(int row, int chunk) {
    static_assert(ROW_BYTES % 128 == 0, "swizzle needs 128-byte rows");
    return (u32)(row * ROW_BYTES + ((chunk ^ (row & 7)) << 4));
}
