// INT8 Q·Kᵀ on Hopper's warpgroup MMA (s8 wgmma, SASS IGMMA), f32 online softmax in log2 units,
// then P·V on a second warpgroup MMA with P in registers: f16 P and V on the f16 wgmma (HGMMA),
// or (PV_FP8) e4m3 P and V on the e4m3 wgmma (QGMMA, SageAttention2's design). sm_90a only.
// SageAttention numerics of fwd_int8.cu (same host contract: Int8FwdParams, scale layouts, LSE
// shift) on the CTA and pipeline of fwd_wgmma.cu (read both headers first).
//
// Warp specialized, 384 threads: a producer warpgroup loads through TMA into KV_STAGES stages,
// the two consumer warpgroups ping-pong (see the kernel section below). On the H100 this is
// 1.2-1.3x a kernel in which every thread issues cp.async and both consumer warpgroups run in
// lockstep with a CTA barrier per KV tile. The f16 P·V variant is checked on an H100 by
// `examples/int8_check.rs` and `quattn selftest`; the e4m3 P·V variants' check is the facade's
// `examples/int8_fp8_check.rs` (f64, the emulation, the prepass's operands, timings).
//
// CTA. 2 consumer warpgroups x 64 query rows: BLOCK_M = 128, BLOCK_N (BN) keys per KV tile (128;
// PV_FP8 also 192), K_BLOCK keys per K scale (BN or, with PV_FP8, 64: a tile then holds
// BN / K_BLOCK scale blocks).
//
// Shared memory (base rounded up to 1024 bytes):
//   Q   int8 [128 rows][HEAD_DIM bytes]                      (resident)
//   K   int8 [BN keys][HEAD_DIM bytes] x KV_STAGES
//   V   f16 P·V: f16 [128 keys][HEAD_DIM] x KV_STAGES, in fwd_wgmma.cu's 128B-swizzle column blocks
//       PV_FP8:  e4m3 Vᵀ [BN / VT_BLOCK][HEAD_DIM rows][VT_BLOCK keys] x KV_STAGES (below)
//   mbarriers, 8 bytes each: Q full, then per stage K full, V full, K empty, V empty
//   PV_FLUSH > 0: the f32 O sums, [2 warpgroups][O_REGS / 4][128 threads][4] floats (below)
// int8 rows are HEAD_DIM bytes, stored densely and swizzled in place:
//   * hd128: a row is 128 bytes = one row of the 128B swizzle atom: chunk c of row r at
//     c ^ (r & 7) (tile_swizzle<128>), layout type 1, 8-row groups SBO = 1024 bytes.
//   * hd64: a row is 64 bytes; the 64B swizzle (layout type 2, Swizzle<2,4,3>: address bits 4-5
//     ^= bits 7-8) of a dense [R][64 B] tile is chunk c of row r at c ^ ((r >> 1) & 3), which is
//     exactly tile_swizzle<64> of common.cuh; 8-row atoms of 512 bytes, SBO = 512. Chosen over
//     padding to 128-byte rows: no wasted shared memory or copy bandwidth, and a TMA box of
//     64-byte rows with the map's 64B swizzle writes it.
//   Both are the canonical K-major layouts for 8-bit elements (T = 128 resp. 64 elements per
//   swizzle row). A k32 step of s8 is 32 bytes: step kk starts 32 * kk bytes into the first row
//   (the hardware swizzles the computed addresses, as for fwd_wgmma's k16 steps of f16); LBO is
//   unused (1). Warpgroup w's Q rows start 64 * w * HEAD_DIM bytes in (a multiple of the atom).
//   Every tile offset is a multiple of 1024.
//
// MMAs per KV tile and warpgroup: S[64 x BN] s32 = Q_wg · K_tileᵀ as HEAD_DIM / 32 wgmmas
// m64nBNk32.s32.s8.s8 (A and B by descriptor); O[64 x HEAD_DIM] += P · V as
//   f16 P·V: 8 register-A m64nHEAD_DIMk16 f16 wgmmas (V MN-major by descriptor with the transpose
//            bit: fwd_wgmma.cu);
//   PV_FP8:  BN / 32 register-A m64nHEAD_DIMk32 e4m3 wgmmas, B = the Vᵀ tile (K-major: 8-bit
//            wgmma has no transpose, so V arrives transposed from the prepass).
// The s32 accumulator fragment is the f32 one: warp q of the warpgroup holds rows 16q .. 16q+15,
// lane 4g + t holds d[4n + 0, 1] = (row g, keys 8n + 2t, +1), d[4n + 2, 3] = (row g + 8, same).
//
// PV_FP8: the e4m3 A fragment and the key permutation. Register A of an 8-bit m64k32 wgmma (PTX
// ISA, "register fragment layout for matrix A"; byte i of register r is element 4r + i) is per
// warp a0 = (row g, k 4t .. 4t + 3), a1 = (row g + 8, same k), a2 = (row g, k 16 + 4t ..),
// a3 = (row g + 8, k 16 + 4t ..). For the 32 keys of k-step kk (accumulator groups n = 4kk ..
// 4kk + 3) lane t holds, per row, keys {2t, 2t+1, 8+2t, 9+2t, 16+2t, 17+2t, 24+2t, 25+2t} of the
// step. The kernel feeds its accumulator entries in register order, so position k of the step
// carries key sigma(k) = 16 (k / 16) + 8 ((k % 4) / 2) + 2 ((k % 16) / 4) + (k % 2):
//     a0 = bytes (d[16kk + 0], d[16kk + 1], d[16kk + 4],  d[16kk + 5])    row g
//     a1 = bytes (d[16kk + 2], d[16kk + 3], d[16kk + 6],  d[16kk + 7])    row g + 8
//     a2 = bytes (d[16kk + 8], d[16kk + 9], d[16kk + 12], d[16kk + 13])   row g
//     a3 = bytes (d[16kk + 10], d[16kk + 11], d[16kk + 14], d[16kk + 15]) row g + 8
// and the prepass (int8_prepass.cu) stores key 32c + sigma(k) of V at Vᵀ column 32c + k, so the
// products P·V sums are the same without a shuffle. Vᵀ in global memory: [b][kv_heads][D][kv_pad]
// e4m3 codes, kv_pad = kv_len rounded up to 128, zeros past kv_len; in shared memory column
// blocks of VT_BLOCK keys (128 at BN 128: one 128B-swizzle row, layout type 1, SBO 1024; 64 at
// BN 192: one 64B-swizzle row, layout type 2, SBO 512), one TMA box of [D rows][VT_BLOCK keys]
// per block; k-step kk starts at byte (32 kk) % VT_BLOCK of block (32 kk) / VT_BLOCK. Keys
// past kv_pad (a 192-key tile's end) arrive from TMA as zeros.
//
// Scales (Int8ScaleLayout of quattn's codec with blocking (block_q 128, block_k K_BLOCK, warps 8)):
// CTA warp W = tid / 32 = 4 * warpgroup + warp-in-warpgroup owns CTA rows 16W .. 16W + 15, lane
// quad g rows 16W + g and 16W + g + 8, so
//   Q_GRAN 0 (per block):  one scale per CTA                  -> q_scale[bh][m_block]
//   Q_GRAN 1 (per warp):   8 warps of 16 rows                  -> q_scale[bh][m_block][W]
//   Q_GRAN 2 (per thread): 8 warps x 8 row groups {g, g + 8}   -> q_scale[bh][m_block][W][g]
// which is the codec's layout (PerWarp: w = (i % 128) / 16; PerThread: block_q / warps = 16,
// group (i % 128 % 16) % 8). K: k_scale[b][kv_head][kb] for keys [K_BLOCK kb, K_BLOCK (kb + 1)).
// PV_FP8, V: v_scale[b][kv_head][c] (f32, the codec's per-channel E4M3 scale amax / 448).
//
// Numerics, f16 P·V (as fwd_int8.cu): x = float(dot) exactly (one I2FP.F32.S32;
// |dot| <= 127^2 * 128 < 2^22), sc = q_scale * k_scale per row and tile, the row max taken on x
// and scaled once (sc > 0), p = exp2(fma(x, sc, -m)) with m in log2 units, conditional rescale by
// RESCALE_LOG2 (default 8) decided per warp, a row's max starting at the finite M_EMPTY, P
// rounded to f16, f32 O, O = acc / l, LSE = (m + log2 l) ln 2 + lse_shift.
//
// Numerics, PV_FP8: x = float(dot) as above (one I2FP a score, exact whatever the scales; a
// biased float needing no conversion would put 1.5 * 2^23 sc into the per-row exp2 constant,
// whose rounding grows with the score scale), the row max per K-scale block taken on x and
// scaled by the block's sc, p = exp2(fma(x, sc, P_LOG2 - m)). P_LOG2 = log2(448) -
// RESCALE_LOG2 (default 0): P is stored as e4m3(p * 448 * 2^-RESCALE_LOG2) with p relative to
// the running max, rounded to nearest, saturating; a stale max (the max moves once some row of
// the warp grew by more than RESCALE_LOG2) keeps every P <= 448. With RESCALE_LOG2 0 this is
// quattn's emulation of the mode, P = e4m3(448 p). l adds the unrounded f32 P, so
// O = acc * v_scale[c] / l and LSE = (m - P_LOG2 + log2 l) ln 2 + lse_shift.
//
// Two-level P·V accumulation (PV_FLUSH = F > 0, SageAttention2): the e4m3 wgmma adds its products
// into its f32 accumulator with a shorter significand than f32 (about 13 bits), which over
// thousands of keys biases O. With F > 0 the wgmma accumulator holds the products of at most F
// KV tiles (its first k-step after a flush overwrites), and every F tiles it is added in f32 into
// per-thread sums kept in shared memory (O_ACC: 16-byte vectors, lane-contiguous, no bank
// conflict). A rescale multiplies the accumulator and a per-row factor `cum` that the next flush
// applies to the stored sums: invariant O = sums * cum + acc. PV_FLUSH 0: one level (the
// accumulator holds everything).
//
// Pipeline (per consumer warpgroup): fwd_wgmma.cu's. Tile j: wait on the full barriers of K_j
// and V_{j-1}; in this warpgroup's turn issue S_j, commit, issue P_{j-1}·V_{j-1}, commit;
// wait_group 1 (S_j done), release K_j's stage; convert, mask, softmax (overlapping the P·V);
// wait_group 0, release V_{j-1}'s stage; pack P_j; flush (PV_FLUSH); rescale O.
//
// Epilogue: O · 1/l (PV_FP8: · v_scale) packed to f16 and staged through the start of shared
// memory (Q and K regions: 2 * 128 * HEAD_DIM bytes needed, at least 3 * 128 * HEAD_DIM there)
// in fwd_wgmma.cu's 128B-swizzle column blocks, then 16-byte coalesced stores, after a consumer
// barrier that every consumer reaches past its last wgmma.
//
// Compile-time parameters (-D, built by src/wgmma_int8.rs): HEAD_DIM 64 | 128, Q_GRAN 0 | 1 | 2,
// KV_STAGES (2..4), PRODUCER_REGS and CONSUMER_REGS (setmaxnreg); PV_FP8 0 | 1 and with it
// BLOCK_N 128 | 192, K_BLOCK 64 | 128 (dividing BLOCK_N), PV_FLUSH (0: one level; F: flush every
// F tiles), RESCALE_LOG2. ABI: `Int8FwdParams` of fwd_int8.cu (Rust mirror `Int8Params` in
// src/int8.rs), `Int8TmaMaps` (three CUtensorMaps, built on the host per launch) and, with
// the device address of v_scale (0 without PV_FP8).
#include "common.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "fwd_wgmma_int8.cu compiles for sm_90a only (wgmma)"
#endif
#if !defined(HEAD_DIM) || !defined(Q_GRAN) || !defined(KV_STAGES) || !defined(PRODUCER_REGS) || \
    !defined(CONSUMER_REGS)
#error "fwd_wgmma_int8.cu needs HEAD_DIM, Q_GRAN, KV_STAGES, PRODUCER_REGS, CONSUMER_REGS"
#endif
#ifndef PV_FP8
#define PV_FP8 0
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef K_BLOCK
#define K_BLOCK BLOCK_N
#endif
#ifndef PV_FLUSH
#define PV_FLUSH 0
#endif
#ifndef RESCALE_LOG2
#if PV_FP8
#define RESCALE_LOG2 0
#else
#define RESCALE_LOG2 8
#endif
#endif
#define M_EMPTY (-1.7014118e38f)

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int WG = 2;
constexpr int BM = 64 * WG;
constexpr int BN = BLOCK_N;
constexpr int KB = K_BLOCK;                // keys per K scale
constexpr int K_SCALES = BN / KB;          // K scales per KV tile
constexpr int THREADS = 128 * WG;          // consumer threads
constexpr int WARPS = THREADS / 32;
constexpr int S_REGS = BN / 2;             // s32 scores per thread (m64nBN accumulator)
constexpr int O_REGS = D / 2;              // f32 outputs per thread (m64nD accumulator)
constexpr int K_STEPS = D / 32;            // k32 steps of Q·Kᵀ (s8)
constexpr int Q_BYTES = BM * D;
constexpr int K_TILE_BYTES = BN * D;
#if PV_FP8
constexpr int P_STEPS = BN / 32;           // k32 steps of P·V (e4m3)
constexpr int VT_BLOCK = BN == 128 ? 128 : 64;   // keys per Vᵀ column block (= its swizzle span)
constexpr int VT_BLOCK_BYTES = D * VT_BLOCK;
constexpr int VT_BLOCKS = BN / VT_BLOCK;
constexpr int V_TILE_BYTES = D * BN;
// log2(448) - RESCALE_LOG2: a probability of 2^RESCALE_LOG2 (the largest a stale max allows) is
// stored as 448, the largest finite E4M3.
constexpr float P_LOG2 = 8.807354922057604f - (float)RESCALE_LOG2;
#else
constexpr int P_STEPS = BN / 16;           // k16 steps of P·V (f16)
constexpr int V_BLOCKS = D / 64;           // 128-byte column blocks of an f16 V row
constexpr int V_TILE_BYTES = BN * D * 2;
#endif
constexpr int O_STAGE_BYTES = BM * D * 2;
constexpr int Q_SCALES_PER_BLOCK = Q_GRAN == 0 ? 1 : Q_GRAN == 1 ? WARPS : WARPS * 8;
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(Q_GRAN >= 0 && Q_GRAN <= 2, "Q_GRAN 0, 1 or 2");
static_assert(PV_FP8 || (BN == 128 && KB == 128 && PV_FLUSH == 0), "f16 P·V: 128-key tiles and scales, one level");
static_assert(BN == 128 || BN == 192, "BLOCK_N 128 or 192");
static_assert((KB == 64 || KB == 128) && BN % KB == 0, "K_BLOCK 64 or 128, dividing BLOCK_N");
static_assert(PV_FLUSH >= 0, "PV_FLUSH: 0 (one level) or tiles per flush");
static_assert(RESCALE_LOG2 >= 0 && (!PV_FP8 || RESCALE_LOG2 <= 8), "a stale max must keep P within E4M3");
static_assert(Q_BYTES % 1024 == 0 && K_TILE_BYTES % 1024 == 0 && V_TILE_BYTES % 1024 == 0, "aligned tiles");
}  // namespace cfg

struct Int8FwdParams {
    u64 q, k, v, o, lse;                       // device pointers: int8, int8, f16, f16, f32
    u64 q_scale, k_scale;                      // f32 scales (Int8ScaleLayout)
    u64 lse_shift;                             // f32 [batch, q_heads, q_len], 0 = none
    i64 q_batch_stride, q_head_stride, q_seq_stride;   // in elements; head dim is contiguous
    i64 k_batch_stride, k_head_stride, k_seq_stride;
    i64 v_batch_stride, v_head_stride, v_seq_stride;
    i64 o_batch_stride, o_head_stride, o_seq_stride;
    int q_len, kv_len, q_heads, kv_heads;
    int kv_group;                              // q_heads / kv_heads (GQA)
    int causal;                                // bottom-right aligned
};

// ---- wgmma -----------------------------------------------------------------------------------

// S[64 x 128] (+)= A[64 x 32] (shared, descriptor) * B[32 x 128] (shared, descriptor), s8 x s8 ->
// s32, both K-major. ACC 0 overwrites (scale-d false). Integer wgmma has no negate / transpose
// immediates.
template <int ACC>
__device__ __forceinline__ void wg_mma_s8_n128(int (&d)[64], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p; }\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// S[64 x 192] (+)= A[64 x 32] * B[32 x 192], as wg_mma_s8_n128 (BLOCK_N 192).
template <int ACC>
__device__ __forceinline__ void wg_mma_s8_n192(int (&d)[96], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p; }\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]), "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]), "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]), "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// O[64 x 64] (+)= A[64 x 32] (registers, e4m3) * B[32 x 64] (shared, descriptor, K-major);
// `accumulate` 0 overwrites (scale-d false).
__device__ __forceinline__ void wg_mma_e4m3_rs_n64(float (&d)[32], const u32 (&a)[4], u64 b_desc, int accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate) : "memory");
}

// O[64 x 128] (+)= A[64 x 32] (registers, e4m3) * B[32 x 128] (shared, descriptor, K-major);
// `accumulate` 0 overwrites (scale-d false).
__device__ __forceinline__ void wg_mma_e4m3_rs_n128(float (&d)[64], const u32 (&a)[4], u64 b_desc, int accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate) : "memory");
}

// Descriptor of the int8 tile at `addr` (K-major, 8-row atoms; see the header).
__device__ __forceinline__ u64 qk_desc(u32 addr) {
#if HEAD_DIM == 128
    return sw128_desc(addr, 16, 1024);
#else
    return sw64_desc(addr, 16, 512);
#endif
}

// How the loop names a shared tile. Head dim 128: by its descriptor, each wgmma's descriptor
// one add away (desc_add); head dim 64: by its shared address, each wgmma's descriptor built
// from the address. Measured on the H200 (int8_check, int8_fp8_check, alternating builds):
// descriptors from bases gain 7% at head dim 128 with f16 P·V and 2% with e4m3 P·V, and lose
// 4.5% at head dim 64.
#define DESC_BASES (HEAD_DIM == 128)
#if DESC_BASES
using TileRef = u64;
__device__ __forceinline__ TileRef tile_ref_at(TileRef r, u32 bytes) { return desc_add(r, bytes >> 4); }
#else
using TileRef = u32;
__device__ __forceinline__ TileRef tile_ref_at(TileRef r, u32 bytes) { return r + bytes; }
#endif
// The reference to the tile at shared address `addr`; BUILD makes its descriptor.
template <u64 (*BUILD)(u32)>
__device__ __forceinline__ TileRef tile_ref(u32 addr) {
#if DESC_BASES
    return BUILD(addr);
#else
    return addr;
#endif
}
// The descriptor `bytes` into the tile `r` names; BUILD makes it from a shared address.
template <u64 (*BUILD)(u32)>
__device__ __forceinline__ u64 desc_at(TileRef r, u32 bytes) {
#if DESC_BASES
    return tile_ref_at(r, bytes);
#else
    return BUILD(tile_ref_at(r, bytes));
#endif
}

// S[64 x BN] = Q_wg · K_tileᵀ (s32): K_STEPS wgmmas, the first overwrites. q, k: the
// warpgroup's Q rows and the K tile; step kk is 32 bytes on.
__device__ __forceinline__ void wg_issue_scores(int (&s)[cfg::S_REGS], TileRef q, TileRef k) {
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk) {
        const u64 a = desc_at<qk_desc>(q, 32u * kk);
        const u64 b = desc_at<qk_desc>(k, 32u * kk);
#if BLOCK_N == 192
        if (kk == 0) wg_mma_s8_n192<0>(s, a, b); else wg_mma_s8_n192<1>(s, a, b);
#else
        if (kk == 0) wg_mma_s8_n128<0>(s, a, b); else wg_mma_s8_n128<1>(s, a, b);
#endif
    }
}

// Descriptor of a V tile: with PV_FP8 of a Vᵀ tile's first block (see the header), else of an
// MN-major V tile (128B swizzle).
__device__ __forceinline__ u64 v_tile_desc(u32 v_tile) {
#if PV_FP8 && BLOCK_N == 128
    return sw128_desc(v_tile, 16, 1024);
#elif PV_FP8
    return sw64_desc(v_tile, 16, 512);
#else
    return sw128_desc(v_tile, cfg::BN * 128, 1024);
#endif
}

#if PV_FP8
// Descriptor of k-step kk's Vᵀ slice: block (32 kk) / VT_BLOCK, byte (32 kk) % VT_BLOCK of its
// first row.
__device__ __forceinline__ u64 vt_desc(TileRef tile, int kk) {
    const int key_byte = 32 * kk;
    return desc_at<v_tile_desc>(tile, (u32)((key_byte / cfg::VT_BLOCK) * cfg::VT_BLOCK_BYTES + key_byte % cfg::VT_BLOCK));
}

// O[64 x D] (+)= P[64 x BN] · V_tile[BN x D]: P_STEPS register-A e4m3 wgmmas, B = the Vᵀ tile.
// `accumulate` 0: the first k-step overwrites O (a fresh accumulator after a flush).
__device__ __forceinline__ void wg_issue_values(float (&o)[cfg::O_REGS], const u32 (&pf)[cfg::P_STEPS][4], TileRef vt,
                                                int accumulate) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk) {
#if HEAD_DIM == 128
        wg_mma_e4m3_rs_n128(o, pf[kk], vt_desc(vt, kk), kk == 0 ? accumulate : 1);
#else
        wg_mma_e4m3_rs_n64(o, pf[kk], vt_desc(vt, kk), kk == 0 ? accumulate : 1);
#endif
    }
}
#else
// O[64 x D] += P[64 x BN] · V_tile[BN x D]: P_STEPS register-A f16 wgmmas, V MN-major, step kk
// 2048 bytes on.
__device__ __forceinline__ void wg_issue_values(float (&o)[cfg::O_REGS], const u32 (&pf)[cfg::P_STEPS][4], TileRef v,
                                                int accumulate) {
    (void)accumulate;
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk) {
        const u64 b = desc_at<v_tile_desc>(v, 2048u * kk);
#if HEAD_DIM == 128
        wg_mma_rs_n128(o, pf[kk], b);
#else
        wg_mma_rs_n64(o, pf[kk], b);
#endif
    }
}
#endif

// ---- block indices ------------------------------------------------------------------------

__device__ __forceinline__ int cta_head() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(v));
    return v;
}
__device__ __forceinline__ int cta_batch() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(v));
    return v;
}
__device__ __forceinline__ int cta_kv_head(const Int8FwdParams& p) { return cta_head() / p.kv_group; }

// ---- scales ----------------------------------------------------------------------------------

// K scale blocks of the KV walk (K_BLOCK keys each), and the first of the CTA's (batch, KV head).
__device__ __forceinline__ int cta_k_blocks(const Int8FwdParams& p) { return (p.kv_len + cfg::KB - 1) / cfg::KB; }
__device__ __forceinline__ const float* cta_k_scales(const Int8FwdParams& p, int k_blocks) {
    return reinterpret_cast<const float*>(p.k_scale) + ((i64)cta_batch() * p.kv_heads + cta_kv_head(p)) * k_blocks;
}
// This lane's Q scale (rows g and g + 8 of its warp share it in every granularity; header).
// `tid`: the thread's index among the CTA's consumer threads.
__device__ __forceinline__ float cta_q_scale(const Int8FwdParams& p, int tid) {
    int m_block;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(m_block));
    m_block = gridDim.x - 1 - m_block;
    const float* base = reinterpret_cast<const float*>(p.q_scale) +
                        (((i64)cta_batch() * p.q_heads + cta_head()) * gridDim.x + m_block) * cfg::Q_SCALES_PER_BLOCK;
#if Q_GRAN == 0
    (void)tid;
    return __ldg(base);
#elif Q_GRAN == 1
    return __ldg(base + (tid >> 5));
#else
    return __ldg(base + (tid >> 5) * 8 + ((tid & 31) >> 2));
#endif
}

// ---- softmax (log2 units) -------------------------------------------------------------------

struct RowState {
    float m[2];   // running max (log2 units) of row entries 0 (g) and 1 (g + 8); M_EMPTY at first
    float l[2];   // this lane's partial row sums
};

// Sets masked scores to -inf (MASK): keys at or past kv_len, and past each row's diagonal.
template <bool MASK>
__device__ __forceinline__ void thread_mask(float (&x)[cfg::S_REGS], int key0, int kv_len, int diag, int lane) {
    if (MASK) {
        const int col = key0 + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int limit = min(kv_len, diag + 8 * i) - col;
#pragma unroll
            for (int n = 0; n < cfg::BN / 8; ++n)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    if (n * 8 + c >= limit) x[4 * n + 2 * i + c] = QA_NEG_INF;
        }
    }
}

// Moves the row maxima to mx (log2 units, quad-reduced) when some row of the warp asks for it
// (grew by more than RESCALE_LOG2); alpha: the factor for l and O (1 where a row's max stays).
__device__ __forceinline__ void warp_update_max(float (&mx)[2], RowState& st, float (&alpha)[2], bool& rescale) {
    bool need = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = quad_max(mx[i]);
        need |= mx[i] - st.m[i] > (float)RESCALE_LOG2;
    }
    rescale = __any_sync(0xffffffffu, need);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = rescale ? fmaxf(st.m[i], mx[i]) : st.m[i];
        alpha[i] = (mn == st.m[i]) ? 1.f : thread_exp2(st.m[i] - mn);
        st.m[i] = mn;
        st.l[i] *= alpha[i];
    }
}

#if PV_FP8
// Biased scores in place (xb, header), mask, row max, rescale decision, P = exp2 in place (x
// becomes P in units of 448 * 2^-RESCALE_LOG2 of the running max), row sums. Returns the per-row
// factor for O in alpha (rescale false: O untouched). Does not touch O: the P·V of the previous
// tile may still be accumulating into it.
template <bool MASK>
__device__ __forceinline__ void warp_softmax(const int (&acc)[cfg::S_REGS], float (&x)[cfg::S_REGS], RowState& st,
                                             float (&alpha)[2], bool& rescale, const float (&sc)[cfg::K_SCALES],
                                             int key0, int kv_len, int diag, int lane) {
    constexpr int N_PER_BLOCK = cfg::KB / 8;
    // I2FP.F32.S32, one instruction a score, exact (|dot| < 2^22); the 3-12% this gained over
    // IADD of THREAD_I2F_BIAS + FADD (common.cuh) were measured on the H200.
#pragma unroll
    for (int e = 0; e < cfg::S_REGS; ++e) x[e] = __int2float_rn(acc[e]);
    thread_mask<MASK>(x, key0, kv_len, diag, lane);
    float mx[2] = {QA_NEG_INF, QA_NEG_INF};
#pragma unroll
    for (int b = 0; b < cfg::K_SCALES; ++b) {
        float mb[2] = {QA_NEG_INF, QA_NEG_INF};
#pragma unroll
        for (int n = b * N_PER_BLOCK; n < (b + 1) * N_PER_BLOCK; ++n) {
            mb[0] = fmaxf(mb[0], fmaxf(x[4 * n], x[4 * n + 1]));
            mb[1] = fmaxf(mb[1], fmaxf(x[4 * n + 2], x[4 * n + 3]));
        }
        // sc > 0 keeps the order: fl(max x * sc) = max fl(x * sc).
#pragma unroll
        for (int i = 0; i < 2; ++i) mx[i] = fmaxf(mx[i], mb[i] * sc[b]);
    }
    warp_update_max(mx, st, alpha, rescale);
    const float kc[2] = {cfg::P_LOG2 - st.m[0], cfg::P_LOG2 - st.m[1]};
#pragma unroll
    for (int b = 0; b < cfg::K_SCALES; ++b) {
#pragma unroll
        for (int e = 4 * N_PER_BLOCK * b; e < 4 * N_PER_BLOCK * (b + 1); ++e) {
            const int i = (e >> 1) & 1;
            x[e] = thread_exp2(fmaf(x[e], sc[b], kc[i]));
            st.l[i] += x[e];
        }
    }
}
#else
// s32 scores -> exact floats, mask (MASK), row max, rescale decision, exp2 in place (x becomes
// P), row sums. Returns the per-row factor for O in alpha (rescale false: O untouched). Does not
// touch O: the P·V of the previous tile may still be accumulating into it.
template <bool MASK>
__device__ __forceinline__ void warp_softmax(const int (&acc)[cfg::S_REGS], float (&x)[cfg::S_REGS], RowState& st,
                                             float (&alpha)[2], bool& rescale, const float (&sc_tile)[cfg::K_SCALES],
                                             int key0, int kv_len, int diag, int lane) {
    const float sc = sc_tile[0];
#pragma unroll
    for (int e = 0; e < cfg::S_REGS; ++e) x[e] = __int2float_rn(acc[e]);   // I2FP (above)
    thread_mask<MASK>(x, key0, kv_len, diag, lane);
    float mx[2] = {QA_NEG_INF, QA_NEG_INF};
#pragma unroll
    for (int n = 0; n < cfg::BN / 8; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(x[4 * n], x[4 * n + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(x[4 * n + 2], x[4 * n + 3]));
    }
    // fl(max x * sc) = max fl(x * sc): sc > 0 and rounding is monotone.
#pragma unroll
    for (int i = 0; i < 2; ++i) mx[i] *= sc;
    warp_update_max(mx, st, alpha, rescale);
#pragma unroll
    for (int e = 0; e < cfg::S_REGS; ++e) {
        const int i = (e >> 1) & 1;
        x[e] = thread_exp2(fmaf(x[e], sc, -st.m[i]));
        st.l[i] += x[e];
    }
}
#endif

__device__ __forceinline__ void thread_rescale_o(float (&o)[cfg::O_REGS], const float (&alpha)[2]) {
#pragma unroll
    for (int e = 0; e < cfg::O_REGS; ++e) o[e] *= alpha[(e >> 1) & 1];
}

#if PV_FP8
// Four f32 values to one register of E4M3 bytes, `a` in the lowest byte (cvt.*x2 puts its first
// source in the upper byte). Round to nearest even, saturating to +-448.
__device__ __forceinline__ u32 thread_pack_e4m3x4(float a, float b, float c, float d) {
    u32 r;
    asm("{ .reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi}; }\n"
        : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

// The accumulator entries of k32 step kk, in register order, as the e4m3 A operand (header).
__device__ __forceinline__ void thread_pack_p(u32 (&pf)[cfg::P_STEPS][4], const float (&x)[cfg::S_REGS]) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk) {
        const float* v = x + 16 * kk;
        pf[kk][0] = thread_pack_e4m3x4(v[0], v[1], v[4], v[5]);
        pf[kk][1] = thread_pack_e4m3x4(v[2], v[3], v[6], v[7]);
        pf[kk][2] = thread_pack_e4m3x4(v[8], v[9], v[12], v[13]);
        pf[kk][3] = thread_pack_e4m3x4(v[10], v[11], v[14], v[15]);
    }
}
#else
__device__ __forceinline__ void thread_pack_p(u32 (&pf)[cfg::P_STEPS][4], const float (&x)[cfg::S_REGS]) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk)
#pragma unroll
        for (int c = 0; c < 4; ++c) pf[kk][c] = thread_pack_f16x2(x[8 * kk + 2 * c], x[8 * kk + 2 * c + 1]);
}
#endif

// ---- epilogue ----------------------------------------------------------------------------------

// Normalises this lane's rows (PV_FP8: times V's per-channel scale, `v_scale` the (batch, kv
// head)'s D scales), writes their LSE (+ shift) and stages O (f16) in fwd_wgmma.cu's 128B-swizzle
// column blocks at `stage` (BM * D * 2 bytes). The caller synchronizes the consumer threads
// before (nobody still reads the region) and after (before cta_store_o).
__device__ __forceinline__ void thread_finish_rows(const Int8FwdParams& p, const float (&o)[cfg::O_REGS],
                                                   const RowState& st, u32 stage, int local_row0, int row0,
                                                   int lane, const float* v_scale) {
    float inv[2];
    const i64 lse_base = ((i64)cta_batch() * p.q_heads + cta_head()) * p.q_len;
#if PV_FP8
    constexpr float LSE_OFFSET = cfg::P_LOG2;
#else
    constexpr float LSE_OFFSET = 0.f;
    (void)v_scale;
#endif
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float sum = quad_sum(st.l[i]);
        // A row that saw no key (sum 0) writes O = 0 and LSE = -inf; guards NaN sums too.
        const bool empty = !(sum > 0.f);
        inv[i] = empty ? 0.f : 1.f / sum;
        float lse = empty ? QA_NEG_INF : (st.m[i] - LSE_OFFSET + thread_log2(sum)) * 0.6931471805599453f;
        const int row = row0 + 8 * i;
        if ((lane & 3) == 0 && row < p.q_len) {
            const float* shift = reinterpret_cast<const float*>(p.lse_shift);
            if (shift && !empty) lse += __ldg(shift + lse_base + row);
            reinterpret_cast<float*>(p.lse)[lse_base + row] = lse;
        }
    }
#pragma unroll
    for (int n = 0; n < cfg::D / 8; ++n) {
#if PV_FP8
        const float2 vs = __ldg(reinterpret_cast<const float2*>(v_scale + 8 * n + 2 * (lane & 3)));
#else
        const float2 vs = make_float2(1.f, 1.f);
#endif
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 packed = thread_pack_f16x2(o[4 * n + 2 * i] * inv[i] * vs.x, o[4 * n + 2 * i + 1] * inv[i] * vs.y);
            const int r = local_row0 + 8 * i;
            const u32 addr = stage + (u32)((n >> 3) * cfg::BM * 128) + tile_swizzle<128>(r, n & 7) + 4 * (lane & 3);
            asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(packed) : "memory");
        }
    }
}

// ---- the kernel: a TMA producer warpgroup and two ping-ponging consumer warpgroups -----------
//
// 3 warpgroups, 384 threads. Warpgroup 0 is the producer: it gives registers back
// (setmaxnreg.dec) and one thread issues every load as a TMA box (Q once; per KV tile the K
// box and the V boxes: HEAD_DIM / 64 f16 column blocks, or BN / VT_BLOCK Vᵀ blocks), each
// completing on the stage's "full" mbarrier; before it refills a stage it waits on the stage's
// "empty" mbarrier, on which each consumer warp arrives once its wgmmas have read the stage. The
// tensor maps apply the swizzles of the header (K, Q: 128B / 64B by head dim; V: 128B column
// blocks; Vᵀ: VT_BLOCK-byte rows), and zero-fill the rows past the sequence ends. Warpgroups 1
// and 2 are the consumers (setmaxnreg.inc), each with 64 query rows, running the pipeline of the
// header without any CTA-wide barrier. Their wgmma issues alternate (FlashAttention-3's
// ping-pong): consumer c waits on named barrier 1 + c before it issues a tile's wgmmas and
// arrives on the other's barrier after, so one warpgroup's softmax runs while the other's matrix
// products use the tensor cores.

namespace ws {
constexpr int STAGES = KV_STAGES;
constexpr int THREADS = 128 * (cfg::WG + 1);
constexpr int K_OFFSET = cfg::Q_BYTES;
constexpr int V_OFFSET = cfg::Q_BYTES + STAGES * cfg::K_TILE_BYTES;
constexpr int BAR_OFFSET = V_OFFSET + STAGES * cfg::V_TILE_BYTES;
// The f32 O sums of the two-level accumulation, after the barriers, 1024-aligned.
constexpr int O_ACC_OFFSET = (BAR_OFFSET + 8 * KvBarriers::count(STAGES) + 1023) / 1024 * 1024;
constexpr int O_ACC_BYTES = PV_FLUSH > 0 ? cfg::THREADS * cfg::O_REGS * 4 : 0;
constexpr int SMEM_BYTES = (PV_FLUSH > 0 ? O_ACC_OFFSET + O_ACC_BYTES : BAR_OFFSET + 8 * KvBarriers::count(STAGES)) + 1024;
constexpr u32 EMPTY_ARRIVALS = 4 * cfg::WG;   // one per consumer warp
constexpr int CONSUMERS = cfg::THREADS;       // consumer threads (named barriers 1..3)
constexpr int BAR_EPILOGUE = 3;
static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 K/V stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 block may have");
static_assert(cfg::O_STAGE_BYTES <= V_OFFSET, "O is staged through the Q and K regions");
}  // namespace ws

// The three tensor maps (built by src/wgmma_int8.rs): int8 Q and K boxes of [128 | BN rows]
// [HEAD_DIM bytes], rank 4 (dim, seq, head, batch); V: f16 boxes of [128 rows][64 halves], or
// (PV_FP8) e4m3 Vᵀ boxes of [HEAD_DIM rows][VT_BLOCK keys], rank 4 (key, dim, kv head, batch).
struct Int8TmaMaps {
    TmaMap q, k, v;
};

// Shared-memory map of the CTA: tiles and the pipeline's mbarriers.
struct WsSmem {
    u32 q, k, v, o_acc;
    KvBarriers bars;
    __device__ __forceinline__ explicit WsSmem(u32 base)
        : q(base), k(base + ws::K_OFFSET), v(base + ws::V_OFFSET), o_acc(base + ws::O_ACC_OFFSET),
          bars{base + ws::BAR_OFFSET} {}
    __device__ __forceinline__ u32 q_full() const { return bars.q_full(); }
    __device__ __forceinline__ u32 k_full(int s) const { return bars.k_full(s); }
    __device__ __forceinline__ u32 v_full(int s) const { return bars.v_full(s); }
    __device__ __forceinline__ u32 k_empty(int s) const { return bars.k_empty(s); }
    __device__ __forceinline__ u32 v_empty(int s) const { return bars.v_empty(s); }
    __device__ __forceinline__ u32 k_tile(int s) const { return k + (u32)(s * cfg::K_TILE_BYTES); }
    __device__ __forceinline__ u32 v_tile(int s) const { return v + (u32)(s * cfg::V_TILE_BYTES); }
};

// Producer: one thread loads Q, then K_j and V_j for j = 0 .. n_tiles - 1 (tile n_tiles - 1 - j),
// refilling a stage once its empty barrier says both consumers are done with it.
__device__ __forceinline__ void thread_produce(const Int8FwdParams& p, const Int8TmaMaps& maps, const WsSmem& sm,
                                               int m0, int n_tiles) {
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.kv_group;
    thread_mbarrier_arrive_expect_tx(sm.q_full(), cfg::Q_BYTES);
    thread_tma_load_4d(sm.q, &maps.q, sm.q_full(), 0, m0, head, batch);
    for (int j = 0; j < n_tiles; ++j) {
        const int t = n_tiles - 1 - j;
        const int s = j % ws::STAGES;
        const u32 parity = ((j / ws::STAGES) & 1) ^ 1;   // the stage's previous use
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.k_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.k_full(s), cfg::K_TILE_BYTES);
        thread_tma_load_4d(sm.k_tile(s), &maps.k, sm.k_full(s), 0, t * cfg::BN, kv_head, batch);
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.v_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.v_full(s), cfg::V_TILE_BYTES);
#if PV_FP8
#pragma unroll
        for (int b = 0; b < cfg::VT_BLOCKS; ++b)
            thread_tma_load_4d(sm.v_tile(s) + b * cfg::VT_BLOCK_BYTES, &maps.v, sm.v_full(s),
                               t * cfg::BN + b * cfg::VT_BLOCK, 0, kv_head, batch);
#else
#pragma unroll
        for (int h = 0; h < cfg::V_BLOCKS; ++h)
            thread_tma_load_4d(sm.v_tile(s) + h * cfg::BN * 128, &maps.v, sm.v_full(s), 64 * h, t * cfg::BN, kv_head,
                               batch);
#endif
    }
}

// One consumer warpgroup's state over the KV walk.
struct WgConsumer {
    float o[cfg::O_REGS];                     // the P·V accumulator
    u32 pf[cfg::P_STEPS][4];
    int s[cfg::S_REGS];
    RowState st;
    float qs;
    float cum[2];                             // PV_FLUSH: the factor the stored sums still owe
    int n_tiles, n_masked, diag, lane, cw;
    TileRef q_ref, k_ref0, v_ref0;            // Q rows of the warpgroup; K and V of stage 0
#if PV_FLUSH != 1
    const float* k_scales;                    // the (batch, KV head)'s K scales
    int k_blocks;
#endif
    u32 o_acc;                                // PV_FLUSH: this thread's first 16-byte slot

    __device__ __forceinline__ TileRef k_ref(int stage) const { return tile_ref_at(k_ref0, (u32)(stage * cfg::K_TILE_BYTES)); }
    __device__ __forceinline__ TileRef v_ref(int stage) const { return tile_ref_at(v_ref0, (u32)(stage * cfg::V_TILE_BYTES)); }

    __device__ __forceinline__ void wait_turn() const { wg_wait_turn(cw); }
    __device__ __forceinline__ void give_turn() const { wg_give_turn(cw); }

    // Whether the P·V of tile j (processing order) starts a fresh accumulator.
    __device__ __forceinline__ static int pv_accumulates(int j) {
        return PV_FLUSH > 0 ? (j % (PV_FLUSH > 0 ? PV_FLUSH : 1)) != 0 : 1;
    }
    // Whether the P·V of tile j completes a group of PV_FLUSH tiles (then flushed).
    __device__ __forceinline__ static bool pv_flushes(int j) {
        return PV_FLUSH > 0 && (j % (PV_FLUSH > 0 ? PV_FLUSH : 1)) == (PV_FLUSH > 0 ? PV_FLUSH : 1) - 1;
    }

    // sums = sums * cum + o (16-byte slots, lane-contiguous), cum = 1. The accumulator is then
    // stale: the next P·V overwrites it.
    __device__ __forceinline__ void flush() {
#pragma unroll
        for (int v = 0; v < cfg::O_REGS / 4; ++v) {
            const u32 addr = o_acc + (u32)(v * 128 * 16);
            float a, b, c, d;
            asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "r"(addr));
            a = fmaf(a, cum[0], o[4 * v]);
            b = fmaf(b, cum[0], o[4 * v + 1]);
            c = fmaf(c, cum[1], o[4 * v + 2]);
            d = fmaf(d, cum[1], o[4 * v + 3]);
            asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};\n" :: "r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
        }
        cum[0] = cum[1] = 1.f;
    }
    // o = sums * cum + o: the final O of a two-level accumulation, in registers.
    __device__ __forceinline__ void gather() {
#pragma unroll
        for (int v = 0; v < cfg::O_REGS / 4; ++v) {
            const u32 addr = o_acc + (u32)(v * 128 * 16);
            float a, b, c, d;
            asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "r"(addr));
            o[4 * v] = fmaf(a, cum[0], o[4 * v]);
            o[4 * v + 1] = fmaf(b, cum[0], o[4 * v + 1]);
            o[4 * v + 2] = fmaf(c, cum[1], o[4 * v + 2]);
            o[4 * v + 3] = fmaf(d, cum[1], o[4 * v + 3]);
        }
    }

    // KV tile j (tile n_tiles - 1 - j): issue S_j (and, unless FIRST, P_{j-1}·V_{j-1}) in this
    // warpgroup's turn, softmax S_j while the P·V runs, then pack P_j, flush and rescale O. FIRST
    // is a template parameter, not a run-time branch, so that ptxas sees one fixed wgmma
    // pipeline in each instantiation (a conditional wait makes it serialize every wgmma).
    template <bool FIRST>
    __device__ __forceinline__ void step(const Int8FwdParams& p, const WsSmem& sm, int j) {
        const int t = n_tiles - 1 - j;
        const int stage = j % ws::STAGES;
        const int prev = (j + ws::STAGES - 1) % ws::STAGES;
        thread_mbarrier_wait(sm.k_full(stage), (j / ws::STAGES) & 1);
        if (!FIRST) thread_mbarrier_wait(sm.v_full(prev), ((j - 1) / ws::STAGES) & 1);
        wait_turn();
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_scores(s, q_ref, k_ref(stage));
        wg_commit();
        if (!FIRST) {
            wg_issue_values(o, pf, v_ref(prev), pv_accumulates(j - 1));
            wg_commit();
        }
        give_turn();
        // This tile's K scales (K_SCALES blocks of K_BLOCK keys; blocks past the last one, which
        // only masked keys would use, read the last one), loaded while S_j runs: nothing of
        // them is live across the wgmma issue, where the accumulators of both products and P
        // hold most registers.
        float ks[cfg::K_SCALES];
#if PV_FLUSH == 1
        // Flushing every tile leaves no register for the base across the walk (it spills).
        const int k_blocks = cta_k_blocks(p);
        const float* k_scales = cta_k_scales(p, k_blocks);
#endif
#pragma unroll
        for (int b = 0; b < cfg::K_SCALES; ++b) ks[b] = __ldg(k_scales + min(t * cfg::K_SCALES + b, k_blocks - 1));
        if (FIRST) wg_wait<0>(); else wg_wait<1>();   // S_j done
        reg_fence(s);
        if (lane == 0) thread_mbarrier_arrive(sm.k_empty(stage));
        float x[cfg::S_REGS];
        float alpha[2];
        bool rescale;
        float sc[cfg::K_SCALES];
#pragma unroll
        for (int b = 0; b < cfg::K_SCALES; ++b) sc[b] = qs * ks[b];
        if (j < n_masked) warp_softmax<true>(s, x, st, alpha, rescale, sc, t * cfg::BN, p.kv_len, diag, lane);
        else warp_softmax<false>(s, x, st, alpha, rescale, sc, t * cfg::BN, p.kv_len, diag, lane);
        wg_wait<0>();                                 // P_{j-1}·V_{j-1} done
        reg_fence(o);
        reg_fence(pf);
        if (!FIRST && lane == 0) thread_mbarrier_arrive(sm.v_empty(prev));
        // P first: x is dead afterwards, which leaves the flush the registers it needs.
        thread_pack_p(pf, x);
        bool stale = FIRST && PV_FLUSH > 0;           // the accumulator holds nothing to keep
        if (!FIRST && pv_flushes(j - 1)) {
            flush();
            stale = true;
        }
        if (rescale) {
            if (!stale) thread_rescale_o(o, alpha);
            if (PV_FLUSH > 0) {
                cum[0] *= alpha[0];
                cum[1] *= alpha[1];
            }
        }
    }

    // The last P·V, in its turn too; consumer 1 opens no turn after it (nobody would wait).
    // PV_FLUSH: O is then gathered from the stored sums.
    __device__ __forceinline__ void finish(const WsSmem& sm) {
        const int last = n_tiles - 1;
        thread_mbarrier_wait(sm.v_full(last % ws::STAGES), (last / ws::STAGES) & 1);
        wait_turn();
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_values(o, pf, v_ref(last % ws::STAGES), pv_accumulates(last));
        wg_commit();
        if (cw == 0) give_turn();
        wg_wait<0>();
        reg_fence(o);
        reg_fence(pf);
        if (PV_FLUSH > 0) gather();
    }
};

// `v_scale`: the device address of V's per-channel scales (PV_FP8; unused and 0 otherwise).
extern "C" __global__ void __launch_bounds__(ws::THREADS, 1)
fwd_wgmma_int8(const Int8FwdParams p, const __grid_constant__ Int8TmaMaps maps, const u64 v_scale) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const WsSmem sm((cta_smem_addr(smem_raw) + 1023u) & ~1023u);
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * cfg::BM;
    const CtaTiles tiles = cta_tiles<cfg::BM, cfg::BN>(p, m0);

    if (tid == 0) sm.bars.init(ws::STAGES, ws::EMPTY_ARRIVALS);
    __syncthreads();

    if (wg == 0) {
        wg_setmaxnreg_dec<PRODUCER_REGS>();
        if (tid == 0 && tiles.n_tiles > 0) {
            thread_tma_prefetch_map(&maps.k);
            thread_tma_prefetch_map(&maps.v);
            thread_produce(p, maps, sm, m0, tiles.n_tiles);
        }
    } else {
        wg_setmaxnreg_inc<CONSUMER_REGS>();
        const int ctid = tid - 128;               // index among the consumer threads
        WgConsumer c;
        c.cw = wg - 1;
        c.lane = tid & 31;
        c.n_tiles = tiles.n_tiles;
        c.n_masked = tiles.n_masked;
        const int local_row0 = 64 * c.cw + 16 * ((tid >> 5) & 3) + (c.lane >> 2);
        const int row0 = m0 + local_row0;
        c.diag = p.causal ? row0 + p.kv_len - p.q_len + 1 : 0x3fffffff;
        c.q_ref = tile_ref<qk_desc>(sm.q + (u32)(64 * c.cw * cfg::D));
        c.k_ref0 = tile_ref<qk_desc>(sm.k_tile(0));
        c.v_ref0 = tile_ref<v_tile_desc>(sm.v_tile(0));
#if PV_FLUSH != 1
        c.k_blocks = cta_k_blocks(p);
        c.k_scales = cta_k_scales(p, c.k_blocks);
#endif
        c.o_acc = sm.o_acc + (u32)((c.cw * (cfg::O_REGS / 4) * 128 + (ctid & 127)) * 16);
#pragma unroll
        for (int e = 0; e < cfg::O_REGS; ++e) c.o[e] = 0.f;
        c.st.m[0] = c.st.m[1] = M_EMPTY;
        c.st.l[0] = c.st.l[1] = 0.f;
        c.cum[0] = c.cum[1] = 1.f;
        if (PV_FLUSH > 0) {
#pragma unroll
            for (int v = 0; v < cfg::O_REGS / 4; ++v)
                asm volatile("st.shared.v4.f32 [%0], {%1,%1,%1,%1};\n" :: "r"(c.o_acc + (u32)(v * 128 * 16)), "f"(0.f) : "memory");
        }
        if (c.n_tiles > 0) {
            c.qs = cta_q_scale(p, ctid);
            if (c.cw == 1) c.give_turn();         // consumer 0 issues first
            thread_mbarrier_wait(sm.q_full(), 0);
            c.step<true>(p, sm, 0);
            for (int j = 1; j < c.n_tiles; ++j) c.step<false>(p, sm, j);
            c.finish(sm);
        }
#if PV_FP8
        const float* vs = reinterpret_cast<const float*>(v_scale) + ((i64)cta_batch() * p.kv_heads + cta_kv_head(p)) * cfg::D;
#else
        const float* vs = nullptr;
        (void)v_scale;
#endif
        // Epilogue: every consumer is past its last wgmma before O overwrites Q and K (the
        // producer loaded nothing the consumers did not wait for, so no TMA write is pending).
        cta_named_sync(ws::BAR_EPILOGUE, ws::CONSUMERS);
        thread_finish_rows(p, c.o, c.st, sm.q, local_row0, row0, c.lane, vs);
        cta_named_sync(ws::BAR_EPILOGUE, ws::CONSUMERS);
        cta_store_o<cfg::BM, cfg::D, cfg::THREADS>(p, sm.q, m0, ctid);
    }
}
