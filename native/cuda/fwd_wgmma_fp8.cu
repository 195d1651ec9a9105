// FP8 (E4M3) attention forward on Hopper's warpgroup MMA: Q·Kᵀ and P·V both on dense
// `wgmma.mma_async ... k32.f32.e4m3.e4m3` (SASS QGMMA ...E4M3.E4M3), f32 accumulators, f32 online
// softmax, P rounded to E4M3 in registers. sm_90a only. The CTA and pipeline are those of the
// warp-specialized kernels of fwd_wgmma.cu / fwd_wgmma_int8.cu (read their headers first): a TMA
// producer warpgroup and CONSUMER_WGS (2 or 3) consumer warpgroups of 64 query rows each, issuing
// their wgmmas in turns.
//
// Run on the H100: `examples/wgmma_fp8_check.rs` passes on every variant (f64 reference,
// emulation of this arithmetic, Vᵀ read back; stale-max, GQA, causal, ragged, bshd, 16k-key
// cases) and times it against fwd_wgmma.cu.
//
// Two kernels from this file:
//   VT_PREPASS 0 (default)  fwd_wgmma_fp8: the attention kernel.
//   VT_PREPASS 1            fp8_vt_prepass: writes Vᵀ codes for the attention kernel (below).
//
// ---- Inputs ----------------------------------------------------------------------------------
// Q [b][q_heads][q_len][D], K and V [b][kv_heads][kv_len][D]: E4M3 codes (one byte per element,
// strides multiples of 16 bytes; TMA reads Q and K, the prepass V). V reaches the attention
// kernel only as Vᵀ, written by the prepass: [b][kv_heads][D][kv_pad] codes, kv_pad = kv_len
// rounded up to 128, keys permuted inside every group of 32 (below), keys >= kv_len zero.
// Descales: f32, one per tensor (descale_per_head 0) or one per (batch, head) (descale_per_head
// 1; Q per Q head, K and V per KV head). O: f16 or bf16 (OUT_BF16), LSE: f32 [b][q_heads][q_len],
// natural log.
//
// ---- Shared memory (base rounded up to 1024 bytes) ---------------------------------------------
// BLOCK_N (BN) keys per KV tile: 128, 160, 192, 224 or 256; BM = 64 * CONSUMER_WGS query rows.
//   Q   [BM rows][D bytes]                        resident
//   K   [BN keys][D bytes] x KV_STAGES
//   Vᵀ  [BN / VT_BLOCK][D rows][VT_BLOCK keys] x KV_STAGES   (VT_BLOCK: 128, 64 or 32, the widest dividing BN)
//   mbarriers (8 bytes each): Q full, then per stage K full, V full, K empty, V empty
// Q and K rows are D bytes, swizzled exactly as fwd_wgmma_int8.cu's int8 tiles (hd128: 128B
// swizzle, layout type 1, SBO 1024; hd64: 64B swizzle, layout type 2, SBO 512), written by TMA
// boxes of [rows][D bytes] with the matching CU_TENSOR_MAP_SWIZZLE. Vᵀ is the B operand of P·V
// in the canonical K-major layout (K = keys contiguous, N = head dim rows): column blocks of
// VT_BLOCK keys, each [D rows][VT_BLOCK bytes], one row per head-dim index; VT_BLOCK 128 is one
// 128B-swizzle row (layout type 1, 8-row groups SBO = 1024), VT_BLOCK 64 one 64B-swizzle row
// (layout type 2, SBO = 512, BN 192 = 3 blocks), VT_BLOCK 32 one 32B-swizzle row (layout type 3,
// SBO = 256; BN 160 and 224: 5 and 7 blocks, each k32 step a whole block); one TMA box of [D rows][VT_BLOCK bytes] per
// block with that swizzle. A k32 step of 8-bit operands is 32 bytes: step kk starts 32 * kk
// bytes into the first row (of Q and K), or at byte (32 kk) % VT_BLOCK of Vᵀ block (32 kk) /
// VT_BLOCK (the hardware applies the swizzle to the computed addresses); LBO unused (1).
//
// ---- MMAs per KV tile and consumer warpgroup ---------------------------------------------------
//   S[64 x BN] = Q_wg · K_tileᵀ    D / 32 wgmmas m64nBNk32.f32.e4m3.e4m3, A and B by descriptor
//   O[64 x D]  += P · V_tile        BN / 32 wgmmas m64nDk32.f32.e4m3.e4m3, A (P) in registers,
//                                   B = Vᵀ (m64n(D + 8)k32 with ROWSUM_MMA: the row sums too)
// FP8 wgmma has no transpose immediates: both shared operands must be K-major, which Q, K and Vᵀ
// are.
//
// ---- Register layouts and the key permutation ----------------------------------------------------
// Accumulator (any wgmma m64nN, f32): warp q of the warpgroup holds rows 16q .. 16q + 15; lane
// 4g + t holds d[4n + 0, 1] = (row g, cols 8n + 2t, +1) and d[4n + 2, 3] = (row g + 8, same).
// Register A of an 8-bit m64k32 wgmma (PTX ISA, "WGMMA .m64nNk32 register fragment layout for
// matrix A"; byte i of register r is element 4r + i): per warp the m16n8k32 A layout, a0 = (row
// g, k 4t .. 4t + 3), a1 = (row g + 8, k 4t ..), a2 = (row g, k 16 + 4t ..), a3 = (row g + 8, k
// 16 + 4t ..). For the 32 keys of P·V k-step kk (accumulator groups n = 4kk .. 4kk + 3) lane t
// holds, per row, keys {2t, 2t+1, 8+2t, 9+2t, 16+2t, 17+2t, 24+2t, 25+2t} of the step, while
// the A operand wants k positions {4t .. 4t+3, 16+4t .. 16+4t+3}. So the kernel feeds its own
// accumulator entries in register order, and position k of the step carries key
//     sigma(k) = 16 (k / 16) + 8 ((k % 4) / 2) + 2 ((k % 16) / 4) + (k % 2)
// (positions 4t + e <- keys 2t + (e % 2) + 8 (e / 2); positions 16 + 4t + e likewise + 16):
//     a0 = bytes (d[16kk + 0], d[16kk + 1], d[16kk + 4],  d[16kk + 5])    row g
//     a1 = bytes (d[16kk + 2], d[16kk + 3], d[16kk + 6],  d[16kk + 7])    row g + 8
//     a2 = bytes (d[16kk + 8], d[16kk + 9], d[16kk + 12], d[16kk + 13])   row g
//     a3 = bytes (d[16kk + 10], d[16kk + 11], d[16kk + 14], d[16kk + 15]) row g + 8
// and the prepass stores key 32c + sigma(k) of V at Vᵀ column 32c + k, so that B's k index
// matches: P·V sums the same products, no shuffle at run time. sigma permutes each aligned group
// of 32 keys, and tiles are multiples of 32 keys, so the prepass needs no knowledge of the tiles.
//
// ---- Softmax and numerics --------------------------------------------------------------------
// s = the dot product of the codes (exact products, summed by the tensor core into f32 registers
// with a significand of about 13 bits: ~1e-3 relative, measured);
// c = softmax_scale * log2(e) * q_descale * k_descale (per CTA), the row max m kept in raw score
// units (c > 0, so max commutes with the scaling), p = exp2(fma(s, c, -(m c - P_LOG2))) with
// P_LOG2 = log2(448) - RESCALE_LOG2: P is stored as e4m3(p), i.e. the probability relative to the
// running max times 448 * 2^-RESCALE_LOG2. The max moves (with alpha = exp2((m_old - m_new) c) on
// l and O) once some row of the warp grew by more than RESCALE_LOG2 in log2 units, so a stale max
// leaves every probability <= 2^RESCALE_LOG2 and every stored P <= 448 (cvt .satfinite clamps the
// last ulp that ex2.approx may add). RESCALE_LOG2 0 (the table variants) moves the max whenever
// it grows: P = e4m3(448 p) with p <= 1 relative to the exact running max, the quantization of
// quattn's FP8 emulation. The row sum l adds the unrounded f32 values, so O = acc * v_descale / l
// and LSE = (m c + log2 l - P_LOG2) ln 2 need no other factor. Masks as fwd_wgmma.cu (bottom-right
// causal, sequence ends on masked tiles only); a row that sees no key writes O = 0, LSE = -inf.
//
// ROWSUM_MMA 1: l comes from the tensor core instead of one FADD per score. Each Vᵀ block in
// shared memory has 8 more rows after its D rows, set to E4M3 1.0 once at kernel start (TMA
// writes only the first D rows), and P·V is m64n(D + 8)k32: its columns D .. D + 7 are the row
// sums of the stored (E4M3-rounded) P, rescaled with O. After each P·V they are added to l in f32
// and zeroed (thread_flush_rowsum: the accumulator's short significand would drop small terms of
// a long running sum). So l sums the rounded P, the weights P·V actually applied; every lane
// holds the whole sum of its rows (no quad reduction). At head dim 64 the
// softmax, not the tensor core, bounds the kernel (MUFU.EX2 and issue slots, about 7
// instructions per score), so trading 1/8 more P·V MMA for one instruction per score pays.
// Epilogue: O staged (f16 or bf16) through the Q and K regions in fwd_wgmma.cu's 128B-swizzle
// column blocks, then 16-byte coalesced stores (cta_store_o); as fwd_wgmma_int8.cu's WS kernel.
//
// Compile-time parameters (-D, built by src/wgmma_fp8.rs): HEAD_DIM 64 | 128, OUT_BF16 0 | 1,
// BLOCK_N 128 | 160 | 192 | 224 | 256, CONSUMER_WGS 2 | 3 (default 2), ROWSUM_MMA 0 | 1 (default
// 0), KV_STAGES 2..4, PRODUCER_REGS, CONSUMER_REGS, RESCALE_LOG2, EXP2_POLY (0:
// every exp2 on MUFU.EX2; k: every k-th score of the unmasked tiles by thread_exp2_poly on the
// FMA pipes, relieving the MUFU unit; measured slower on the H100, kept for sweeps); with
// VT_PREPASS 1 only HEAD_DIM.
// ABI: `Fp8FwdParams` (Rust mirror `Fp8WgmmaParams`) and `Fp8TmaMaps` (three CUtensorMaps).
#include "common.cuh"

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "fwd_wgmma_fp8.cu compiles for sm_90a only (wgmma)"
#endif
#if !defined(HEAD_DIM)
#error "fwd_wgmma_fp8.cu needs HEAD_DIM"
#endif
#ifndef VT_PREPASS
#define VT_PREPASS 0
#endif
#ifndef CONSUMER_WGS
#define CONSUMER_WGS 2
#endif
#ifndef ROWSUM_MMA
#define ROWSUM_MMA 0
#endif

#if VT_PREPASS
// ---- the Vᵀ prepass -------------------------------------------------------------------------
// Vt[b][kvh][d][kv_pad], column 32c + k = V[b][kvh][32c + sigma(k)][d] (0 past kv_len). One CTA
// per 64 keys of one (batch, kv head): the 64 V rows are copied into shared memory with 16-byte
// loads (rows past kv_len as zeros), then each thread gathers 16 consecutive columns of one Vᵀ
// row d from shared memory (one byte per column; the 32 lanes of a warp take consecutive d, so a
// read instruction touches 32 consecutive bytes of one key row: no bank conflict) and writes
// them as one 16-byte store. V strides and address are multiples of 16 bytes (host checks).
struct Fp8VtParams {
    u64 v, vt;                                 // E4M3 codes
    i64 v_batch_stride, v_head_stride, v_seq_stride;   // bytes
    int kv_len, kv_pad, kv_heads, batch;
};

__device__ __forceinline__ int vt_sigma(int k) {
    return 16 * (k >> 4) + 8 * ((k & 3) >> 1) + 2 * ((k & 15) >> 2) + (k & 1);
}

// Grid: x = 64-key tile, y = kv head, z = batch; 256 threads.
extern "C" __global__ void __launch_bounds__(256) fp8_vt_prepass(const Fp8VtParams p) {
    constexpr int D = HEAD_DIM;
    constexpr int KT = 64;
    constexpr int THREADS = 256;
    __shared__ __align__(16) unsigned char tile[KT * D];
    const int tid = threadIdx.x;
    const int k0 = blockIdx.x * KT;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z;
    const unsigned char* v = reinterpret_cast<const unsigned char*>(p.v) + b * p.v_batch_stride + kvh * p.v_head_stride;
#pragma unroll
    for (int i = tid; i < KT * D / 16; i += THREADS) {
        const int r = i / (D / 16);
        const int c = i % (D / 16);
        u32 x = 0, y = 0, z = 0, w = 0;
        if (k0 + r < p.kv_len)
            asm volatile("ld.global.nc.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(v + (i64)(k0 + r) * p.v_seq_stride + 16 * c));
        asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n"
                     :: "r"(cta_smem_addr(tile + r * D + 16 * c)), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
    }
    __syncthreads();
    unsigned char* vt = reinterpret_cast<unsigned char*>(p.vt) + ((i64)(b * p.kv_heads + kvh) * D) * p.kv_pad + k0;
#pragma unroll
    for (int i = tid; i < D * KT / 16; i += THREADS) {
        const int d = i % D;
        const int c = i / D;
        u32 w[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            u32 acc = 0;
#pragma unroll
            for (int y = 0; y < 4; ++y) {
                const int col = 16 * c + 4 * x + y;
                const int key = (col & ~31) + vt_sigma(col & 31);
                acc |= (u32)tile[key * D + d] << (8 * y);
            }
            w[x] = acc;
        }
        asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n"
                     :: "l"(vt + (i64)d * p.kv_pad + 16 * c), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
    }
}

#else
// ---- the attention kernel ----------------------------------------------------------------------

#if !defined(KV_STAGES) || !defined(PRODUCER_REGS) || !defined(CONSUMER_REGS) || !defined(OUT_BF16) || !defined(BLOCK_N)
#error "fwd_wgmma_fp8.cu needs KV_STAGES, PRODUCER_REGS, CONSUMER_REGS, OUT_BF16, BLOCK_N"
#endif
#ifndef RESCALE_LOG2
#define RESCALE_LOG2 0
#endif
#ifndef EXP2_POLY
#define EXP2_POLY 0
#endif
#ifndef EXP2_POLY_DEG
#define EXP2_POLY_DEG 6
#endif

namespace cfg {
constexpr int D = HEAD_DIM;
constexpr int WG = CONSUMER_WGS;
constexpr int BM = 64 * WG;
constexpr int BN = BLOCK_N;
// Keys per Vᵀ column block (= its swizzle span in bytes): the widest swizzle that divides BN.
constexpr int VT_BLOCK = BN % 128 == 0 ? 128 : BN % 64 == 0 ? 64 : 32;
// ROWSUM_MMA: the P·V wgmma is m64n(D + 8): the 8 extra Vᵀ rows hold E4M3 ones, so columns
// D .. D + 7 of its accumulator are the row sums of the stored P (see the header).
constexpr int ON = D + (ROWSUM_MMA ? 8 : 0);   // columns of the P·V accumulator
constexpr int VT_BLOCK_BYTES = ON * VT_BLOCK;   // a block's rows in shared memory (ones rows included)
constexpr int VT_BLOCKS = BN / VT_BLOCK;
constexpr int THREADS = 128 * WG;          // consumer threads
constexpr int S_REGS = BN / 2;             // f32 scores per thread (m64nBN accumulator)
constexpr int O_REGS = ON / 2;             // f32 outputs per thread (m64nON accumulator)
constexpr int K_STEPS = D / 32;            // k32 steps of Q·Kᵀ
constexpr int P_STEPS = BN / 32;           // k32 steps of P·V
constexpr int Q_BYTES = BM * D;
constexpr int K_TILE_BYTES = BN * D;
constexpr int V_LOAD_BYTES = D * BN;       // what TMA writes per stage
constexpr int V_TILE_BYTES = (ON * BN + 1023) / 1024 * 1024;   // a stage in shared memory
constexpr int O_STAGE_BYTES = BM * D * 2;
// log2(448) - RESCALE_LOG2: the exponent offset that makes a probability of 2^RESCALE_LOG2 (the
// largest a stale max allows) exactly 448, the largest finite E4M3.
constexpr float P_LOG2 = 8.807354922057604f - (float)RESCALE_LOG2;
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(BN == 128 || BN == 160 || BN == 192 || BN == 224 || BN == 256, "BLOCK_N 128, 160, 192, 224 or 256");
static_assert(WG == 2 || WG == 3, "2 or 3 consumer warpgroups");
static_assert(RESCALE_LOG2 >= 0 && RESCALE_LOG2 <= 8, "a stale max must keep P within E4M3");
static_assert(Q_BYTES % 1024 == 0 && K_TILE_BYTES % 1024 == 0 && V_TILE_BYTES % 1024 == 0, "aligned tiles");
}  // namespace cfg

struct Fp8FwdParams {
    u64 o, lse;                                // f16/bf16 O, f32 LSE
    u64 q_descale, k_descale, v_descale;       // f32: [1] or [batch * heads]
    i64 o_batch_stride, o_head_stride, o_seq_stride;   // elements
    int q_len, kv_len, q_heads, kv_heads;
    int kv_group;                              // q_heads / kv_heads (GQA)
    int causal;                                // bottom-right aligned
    int descale_per_head;                      // 0: one descale per tensor; 1: per (batch, head)
    float scale_log2;                          // softmax scale * log2(e)
};

// ---- wgmma ---------------------------------------------------------------------------------------

// S[64 x 128] (+)= A[64 x 32] (shared, descriptor) * B[32 x 128] (shared, descriptor), e4m3 x
// e4m3 -> f32, both K-major (8-bit wgmma has no transpose immediates). ACC 0 overwrites.
template <int ACC>
__device__ __forceinline__ void wg_mma_e4m3_ss_n128(float (&d)[64], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// S[64 x 192] (+)= A[64 x 32] * B[32 x 192], as wg_mma_e4m3_ss_n128 (BLOCK_N 192).
template <int ACC>
__device__ __forceinline__ void wg_mma_e4m3_ss_n192(float (&d)[96], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// S[64 x 160] (+)= A[64 x 32] * B[32 x 160], as wg_mma_e4m3_ss_n128 (BLOCK_N 160).
template <int ACC>
__device__ __forceinline__ void wg_mma_e4m3_ss_n160(float (&d)[80], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %82, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n160k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79}, %80, %81, p, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// S[64 x 224] (+)= A[64 x 32] * B[32 x 224], as wg_mma_e4m3_ss_n128 (BLOCK_N 224).
template <int ACC>
__device__ __forceinline__ void wg_mma_e4m3_ss_n224(float (&d)[112], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %114, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n224k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111}, %112, %113, p, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// S[64 x 256] (+)= A[64 x 32] * B[32 x 256], as wg_mma_e4m3_ss_n128 (BLOCK_N 256).
template <int ACC>
__device__ __forceinline__ void wg_mma_e4m3_ss_n256(float (&d)[128], u64 a_desc, u64 b_desc) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(a_desc), "l"(b_desc), "n"(ACC) : "memory");
}

// D[64 x 64] += A[64 x 32] (registers, e4m3) * B[32 x 64] (shared, descriptor, K-major).
__device__ __forceinline__ void wg_mma_e4m3_rs_n64(float (&d)[32], const u32 (&a)[4], u64 b_desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc) : "memory");
}

// D[64 x 128] += A[64 x 32] (registers, e4m3) * B[32 x 128] (shared, descriptor, K-major).
__device__ __forceinline__ void wg_mma_e4m3_rs_n128(float (&d)[64], const u32 (&a)[4], u64 b_desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc) : "memory");
}

// D[64 x 72] += A[64 x 32] (registers, e4m3) * B[32 x 72] (shared, descriptor, K-major): P·V with
// the ones rows (ROWSUM_MMA, head dim 64).
__device__ __forceinline__ void wg_mma_e4m3_rs_n72(float (&d)[36], const u32 (&a)[4], u64 b_desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}, {%36,%37,%38,%39}, %40, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc) : "memory");
}

// D[64 x 136] += A[64 x 32] (registers, e4m3) * B[32 x 136] (shared, descriptor, K-major): P·V with
// the ones rows (ROWSUM_MMA, head dim 128).
__device__ __forceinline__ void wg_mma_e4m3_rs_n136(float (&d)[68], const u32 (&a)[4], u64 b_desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n136k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67}, {%68,%69,%70,%71}, %72, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc) : "memory");
}

// Descriptor of a Q or K tile at `addr` (K-major, D-byte rows; see the header).
__device__ __forceinline__ u64 qk_desc(u32 addr) {
#if HEAD_DIM == 128
    return sw128_desc(addr, 16, 1024);
#else
    return sw64_desc(addr, 16, 512);
#endif
}

// S[64 x BN] = Q_wg · K_tileᵀ: K_STEPS wgmmas, the first overwrites. q_desc, k_desc: the
// descriptors of the warpgroup's Q rows and of the K tile (qk_desc); step kk is 32 bytes on.
__device__ __forceinline__ void wg_issue_scores(float (&s)[cfg::S_REGS], u64 q_desc, u64 k_desc) {
#pragma unroll
    for (int kk = 0; kk < cfg::K_STEPS; ++kk) {
        const u64 a = desc_add(q_desc, 2u * kk);
        const u64 b = desc_add(k_desc, 2u * kk);
#if BLOCK_N == 256
        if (kk == 0) wg_mma_e4m3_ss_n256<0>(s, a, b); else wg_mma_e4m3_ss_n256<1>(s, a, b);
#elif BLOCK_N == 224
        if (kk == 0) wg_mma_e4m3_ss_n224<0>(s, a, b); else wg_mma_e4m3_ss_n224<1>(s, a, b);
#elif BLOCK_N == 192
        if (kk == 0) wg_mma_e4m3_ss_n192<0>(s, a, b); else wg_mma_e4m3_ss_n192<1>(s, a, b);
#elif BLOCK_N == 160
        if (kk == 0) wg_mma_e4m3_ss_n160<0>(s, a, b); else wg_mma_e4m3_ss_n160<1>(s, a, b);
#else
        if (kk == 0) wg_mma_e4m3_ss_n128<0>(s, a, b); else wg_mma_e4m3_ss_n128<1>(s, a, b);
#endif
    }
}

// O[64 x D] += P[64 x BN] · V_tile[BN x D]: P_STEPS register-A wgmmas, B = the Vᵀ tile (column
// blocks of [D rows][VT_BLOCK keys], K-major, see the header), k32 step kk at byte 32 * kk of
// the keys: block (32 kk) / VT_BLOCK, byte (32 kk) % VT_BLOCK of its first row.
__device__ __forceinline__ u64 vt_desc(u32 addr) {
    if (cfg::VT_BLOCK == 128) return sw128_desc(addr, 16, 1024);
    if (cfg::VT_BLOCK == 64) return sw64_desc(addr, 16, 512);
    return sw32_desc(addr, 16, 256);
}
// vt_tile_desc: vt_desc of the Vᵀ tile's first block.
__device__ __forceinline__ void wg_issue_values(float (&o)[cfg::O_REGS], const u32 (&pf)[cfg::P_STEPS][4], u64 vt_tile_desc) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk) {
        const int key_byte = 32 * kk;
        const u64 b = desc_add(vt_tile_desc, (u32)((key_byte / cfg::VT_BLOCK) * cfg::VT_BLOCK_BYTES + key_byte % cfg::VT_BLOCK) >> 4);
#if HEAD_DIM == 128 && ROWSUM_MMA
        wg_mma_e4m3_rs_n136(o, pf[kk], b);
#elif HEAD_DIM == 128
        wg_mma_e4m3_rs_n128(o, pf[kk], b);
#elif ROWSUM_MMA
        wg_mma_e4m3_rs_n72(o, pf[kk], b);
#else
        wg_mma_e4m3_rs_n64(o, pf[kk], b);
#endif
    }
}

// ---- small helpers -------------------------------------------------------------------------------

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

// Four f32 values to one register of E4M3 bytes, `a` in the lowest byte. cvt.*x2 puts its first
// source in the upper byte. Round to nearest even, saturating to +-448 (never NaN).
__device__ __forceinline__ u32 thread_pack_e4m3x4(float a, float b, float c, float d) {
    u32 r;
    asm("{ .reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi}; }\n"
        : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

__device__ __forceinline__ u32 thread_pack_out(float lo, float hi) {
#if OUT_BF16
    return thread_pack_bf16x2(lo, hi);
#else
    return thread_pack_f16x2(lo, hi);
#endif
}

// ---- softmax ---------------------------------------------------------------------------------

// 2^x on the FMA pipes, for x in [-125, 9] (scores of unmasked tiles: finite, at most P_LOG2 plus
// rounding; anything below -125 is clamped there, which E4M3 stores as 0 and which the row sum,
// holding the row max's 448 * 2^-RESCALE_LOG2, cannot notice). x = j + f with j = rint(x) (the
// 1.5 * 2^23 shift leaves j in the low significand bits of t), f in [-0.5, 0.5]; 2^f by its
// degree-6 Taylor polynomial (truncation < ln(2)^7 / 7! / 2^7 = 1.2e-7 relative, as accurate as
// ex2.approx), then j added to the exponent field: (bits(t) << 23) is j << 23 because the
// shift constant's bits above the low 9 fall off the word.
__device__ __forceinline__ float thread_exp2_poly(float x) {
    x = fmaxf(x, -125.f);
    const float t = x + 12582912.f;
    const float f = x - (t - 12582912.f);
#if EXP2_POLY_DEG == 3
    // EXP2_POLY_DEG 3: a cubic fitted to 2^f's relative error on [-0.5, 0.5] (at most 7.5e-5,
    // a six-hundredth of half an E4M3 step), three FMAs fewer.
    float p = 5.5171322e-2f;
    p = fmaf(p, f, 2.4261054e-1f);
    p = fmaf(p, f, 6.9326097e-1f);
    p = fmaf(p, f, 9.9992812e-1f);
#else
    float p = 1.5403530e-4f;
    p = fmaf(p, f, 1.3333558e-3f);
    p = fmaf(p, f, 9.6181291e-3f);
    p = fmaf(p, f, 5.5504109e-2f);
    p = fmaf(p, f, 2.4022651e-1f);
    p = fmaf(p, f, 6.9314718e-1f);
    p = fmaf(p, f, 1.f);
#endif
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

struct RowState {
    float m[2];   // running max (raw score units) of row entries 0 (g) and 1 (g + 8)
    float l[2];   // this lane's partial row sums (of the stored-scale probabilities)
};

// Mask (MASK), row max, rescale decision, exp2 in place, row sums. alpha: the per-row factor for
// O (rescale false: O untouched). Does not touch O: the previous P·V may still accumulate into it.
template <bool MASK>
__device__ __forceinline__ void warp_softmax(float (&s)[cfg::S_REGS], RowState& st, float (&alpha)[2], bool& rescale,
                                             int key0, int kv_len, int diag, float c, int lane) {
    if (MASK) {
        const int col = key0 + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int limit = min(kv_len, diag + 8 * i) - col;
#pragma unroll
            for (int n = 0; n < cfg::BN / 8; ++n)
#pragma unroll
                for (int x = 0; x < 2; ++x)
                    if (n * 8 + x >= limit) s[4 * n + 2 * i + x] = QA_NEG_INF;
        }
    }
    // Head dim 64: the row max and sum in four independent partials (common.cuh); head dim 128:
    // one running value per row. Measured on the H100 (every variant, alternating binaries):
    // partials gain 2-7% at hd 64, where the MMAs are short and the softmax is the longer phase,
    // and lose 2-3% at hd 128.
    float mx[2];
#if HEAD_DIM == 64
    thread_row_max<cfg::BN>(s, st.m, mx);
#else
    mx[0] = st.m[0];
    mx[1] = st.m[1];
#pragma unroll
    for (int n = 0; n < cfg::BN / 8; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * n], s[4 * n + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
#endif
    // The max moves (for every row of the warp) once some row grew by more than RESCALE_LOG2 in
    // log2 units; m = -inf with finite mx always moves (+inf > threshold). With RESCALE_LOG2 0 a
    // row that did not grow has mx == m, so its state is unchanged either way.
    bool need = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = quad_max(mx[i]);
        need |= (mx[i] - st.m[i]) * c > (float)RESCALE_LOG2;
    }
    rescale = __any_sync(0xffffffffu, need);
    float mc[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = rescale ? mx[i] : st.m[i];
        alpha[i] = (mn == st.m[i]) ? 1.f : thread_exp2((st.m[i] - mn) * c);
        st.m[i] = mn;
        st.l[i] *= alpha[i];
        mc[i] = ((mn == QA_NEG_INF) ? 0.f : mn * c) - cfg::P_LOG2;
    }
#pragma unroll
    for (int e = 0; e < cfg::S_REGS; ++e) {
        const float x = fmaf(s[e], c, -mc[(e >> 1) & 1]);
        // EXP2_POLY k > 0: every k-th score of an unmasked tile goes through the FMA pipes.
        s[e] = (!MASK && EXP2_POLY > 0 && e % (EXP2_POLY > 0 ? EXP2_POLY : 1) == 0) ? thread_exp2_poly(x) : thread_exp2(x);
#if HEAD_DIM != 64 && !ROWSUM_MMA
        st.l[(e >> 1) & 1] += s[e];
#endif
    }
#if HEAD_DIM == 64 && !ROWSUM_MMA
    thread_row_sum_add<cfg::BN>(s, st.l);
#endif
}

__device__ __forceinline__ void thread_rescale_o(float (&o)[cfg::O_REGS], const float (&alpha)[2]) {
#pragma unroll
    for (int e = 0; e < cfg::O_REGS; ++e) o[e] *= alpha[(e >> 1) & 1];
}

// ROWSUM_MMA: after a P·V completes (and O, with its sum columns, is rescaled), adds the tile's
// row sums (columns D .. D + 7, each the whole row's sum, so every lane has them) to l in f32 and
// zeroes them. The accumulator then sums one tile's P at a time: it keeps about 13 significand
// bits, and a running sum over thousands of positive terms would drop the small ones (O's terms
// have both signs and grow far less).
__device__ __forceinline__ void thread_flush_rowsum(float (&o)[cfg::O_REGS], RowState& st) {
#if ROWSUM_MMA
#pragma unroll
    for (int i = 0; i < 2; ++i) st.l[i] += o[cfg::D / 2 + 2 * i];
#pragma unroll
    for (int e = 0; e < 4; ++e) o[cfg::D / 2 + e] = 0.f;
#endif
}

// The accumulator entries of k32 step kk, in register order, as the A operand (see the header).
__device__ __forceinline__ void thread_pack_p(u32 (&pf)[cfg::P_STEPS][4], const float (&s)[cfg::S_REGS]) {
#pragma unroll
    for (int kk = 0; kk < cfg::P_STEPS; ++kk) {
        const float* x = s + 16 * kk;
        pf[kk][0] = thread_pack_e4m3x4(x[0], x[1], x[4], x[5]);
        pf[kk][1] = thread_pack_e4m3x4(x[2], x[3], x[6], x[7]);
        pf[kk][2] = thread_pack_e4m3x4(x[8], x[9], x[12], x[13]);
        pf[kk][3] = thread_pack_e4m3x4(x[10], x[11], x[14], x[15]);
    }
}

// The f32 descale of tensor `t` for (batch, head) (index 0 when one per tensor).
__device__ __forceinline__ float cta_descale(const Fp8FwdParams& p, u64 t, int heads, int head) {
    const i64 i = p.descale_per_head ? (i64)cta_batch() * heads + head : 0;
    return __ldg(reinterpret_cast<const float*>(t) + i);
}

// Normalises this lane's rows (times V's descale), writes their LSE and stages O (16-bit) in
// fwd_wgmma.cu's 128B-swizzle column blocks at `stage` (BM * D * 2 bytes). The caller
// synchronizes the consumer threads before (nobody still reads the region) and after.
__device__ __forceinline__ void thread_finish_rows(const Fp8FwdParams& p, const float (&o)[cfg::O_REGS],
                                                   const RowState& st, float c, float v_descale, u32 stage,
                                                   int local_row0, int row0, int lane) {
    float inv[2];
    const i64 lse_base = ((i64)cta_batch() * p.q_heads + cta_head()) * p.q_len;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#if ROWSUM_MMA
        // l holds the whole row's sum in every lane (thread_flush_rowsum): no reduction.
        const float sum = st.l[i];
#else
        const float sum = quad_sum(st.l[i]);
#endif
        const bool empty = !(sum > 0.f);
        inv[i] = empty ? 0.f : v_descale / sum;
        const float lse = empty ? QA_NEG_INF : (st.m[i] * c + thread_log2(sum) - cfg::P_LOG2) * 0.6931471805599453f;
        const int row = row0 + 8 * i;
        if ((lane & 3) == 0 && row < p.q_len) reinterpret_cast<float*>(p.lse)[lse_base + row] = lse;
    }
#pragma unroll
    for (int n = 0; n < cfg::D / 8; ++n)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 packed = thread_pack_out(o[4 * n + 2 * i] * inv[i], o[4 * n + 2 * i + 1] * inv[i]);
            const int r = local_row0 + 8 * i;
            const u32 addr = stage + (u32)((n >> 3) * cfg::BM * 128) + tile_swizzle<128>(r, n & 7) + 4 * (lane & 3);
            asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(packed) : "memory");
        }
}

// ---- the warp-specialized kernel --------------------------------------------------------------

namespace ws {
constexpr int STAGES = KV_STAGES;
constexpr int THREADS = 128 * (cfg::WG + 1);
constexpr int K_OFFSET = cfg::Q_BYTES;
constexpr int V_OFFSET = cfg::Q_BYTES + STAGES * cfg::K_TILE_BYTES;
constexpr int BAR_OFFSET = V_OFFSET + STAGES * cfg::V_TILE_BYTES;
constexpr int SMEM_BYTES = BAR_OFFSET + 8 * KvBarriers::count(STAGES) + 1024;
constexpr u32 EMPTY_ARRIVALS = 4 * cfg::WG;   // one per consumer warp
constexpr int CONSUMERS = cfg::THREADS;       // consumer threads
// Named barriers: 1 .. WG the consumers' turns (below), then the epilogue's.
constexpr int BAR_EPILOGUE = 1 + cfg::WG;
static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 K/V stages");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than an sm_90 block may have");
static_assert(cfg::O_STAGE_BYTES <= V_OFFSET, "O is staged through the Q and K regions");
}  // namespace ws

// Q boxes of [BM rows][D bytes], K boxes of [BN rows][D bytes] (rank 4: dim, seq, head, batch),
// Vᵀ boxes of [D rows][VT_BLOCK keys] (rank 4: key, dim, kv head, batch). Built by
// src/wgmma_fp8.rs per launch.
struct Fp8TmaMaps {
    TmaMap q, k, v;
};

struct WsSmem {
    u32 q, k, v;
    KvBarriers bars;
    __device__ __forceinline__ explicit WsSmem(u32 base)
        : q(base), k(base + ws::K_OFFSET), v(base + ws::V_OFFSET), bars{base + ws::BAR_OFFSET} {}
    __device__ __forceinline__ u32 k_tile(int s) const { return k + (u32)(s * cfg::K_TILE_BYTES); }
    __device__ __forceinline__ u32 v_tile(int s) const { return v + (u32)(s * cfg::V_TILE_BYTES); }
};

// Producer: one thread loads Q, then K_j and Vᵀ_j for j = 0 .. n_tiles - 1 (tile n_tiles - 1 - j),
// refilling a stage once its empty barrier says both consumers are done with it.
__device__ __forceinline__ void thread_produce(const Fp8FwdParams& p, const Fp8TmaMaps& maps, const WsSmem& sm,
                                               int m0, int n_tiles) {
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.kv_group;
    thread_mbarrier_arrive_expect_tx(sm.bars.q_full(), cfg::Q_BYTES);
    thread_tma_load_4d(sm.q, &maps.q, sm.bars.q_full(), 0, m0, head, batch);
    for (int j = 0; j < n_tiles; ++j) {
        const int t = n_tiles - 1 - j;
        const int s = j % ws::STAGES;
        const u32 parity = ((j / ws::STAGES) & 1) ^ 1;   // the stage's previous use
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.bars.k_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.bars.k_full(s), cfg::K_TILE_BYTES);
        thread_tma_load_4d(sm.k_tile(s), &maps.k, sm.bars.k_full(s), 0, t * cfg::BN, kv_head, batch);
        if (j >= ws::STAGES) thread_mbarrier_wait(sm.bars.v_empty(s), parity);
        thread_mbarrier_arrive_expect_tx(sm.bars.v_full(s), cfg::V_LOAD_BYTES);
#pragma unroll
        for (int b = 0; b < cfg::VT_BLOCKS; ++b)
            thread_tma_load_4d(sm.v_tile(s) + b * cfg::VT_BLOCK_BYTES, &maps.v, sm.bars.v_full(s),
                               t * cfg::BN + b * cfg::VT_BLOCK, 0, kv_head, batch);
    }
}

// One consumer warpgroup's state over the KV walk.
struct WgConsumer {
    float o[cfg::O_REGS];
    u32 pf[cfg::P_STEPS][4];
    float s[cfg::S_REGS];
    RowState st;
    float c;                                  // scale * log2(e) * q_descale * k_descale
    int n_tiles, n_masked, diag, lane, cw;
    u64 q_desc, k_desc0, v_desc0;             // Q rows of the warpgroup; K and Vᵀ of stage 0
    __device__ __forceinline__ u64 k_desc(int stage) const {
        return desc_add(k_desc0, (u32)(stage * (cfg::K_TILE_BYTES >> 4)));
    }
    __device__ __forceinline__ u64 v_desc(int stage) const {
        return desc_add(v_desc0, (u32)(stage * (cfg::V_TILE_BYTES >> 4)));
    }

    // KV tile j (tile n_tiles - 1 - j): issue S_j (and, unless FIRST, P_{j-1}·V_{j-1}) in this
    // warpgroup's turn, softmax S_j while the P·V runs, then rescale O and pack P_j. FIRST is a
    // template parameter so that ptxas sees one fixed wgmma pipeline per instantiation.
    template <bool FIRST>
    __device__ __forceinline__ void step(const Fp8FwdParams& p, const WsSmem& sm, int j) {
        const int t = n_tiles - 1 - j;
        const int stage = j % ws::STAGES;
        const int prev = (j + ws::STAGES - 1) % ws::STAGES;
        thread_mbarrier_wait(sm.bars.k_full(stage), (j / ws::STAGES) & 1);
        if (!FIRST) thread_mbarrier_wait(sm.bars.v_full(prev), ((j - 1) / ws::STAGES) & 1);
        wg_wait_turn(cw);
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_scores(s, q_desc, k_desc(stage));
        wg_commit();
        if (!FIRST) {
            wg_issue_values(o, pf, v_desc(prev));
            wg_commit();
        }
        wg_give_turn<cfg::WG>(cw);
        if (FIRST) wg_wait<0>(); else wg_wait<1>();   // S_j done
        reg_fence(s);
        if (lane == 0) thread_mbarrier_arrive(sm.bars.k_empty(stage));
        float alpha[2];
        bool rescale;
        if (j < n_masked) warp_softmax<true>(s, st, alpha, rescale, t * cfg::BN, p.kv_len, diag, c, lane);
        else warp_softmax<false>(s, st, alpha, rescale, t * cfg::BN, p.kv_len, diag, c, lane);
        wg_wait<0>();                                 // P_{j-1}·V_{j-1} done
        reg_fence(o);
        reg_fence(pf);
        if (!FIRST && lane == 0) thread_mbarrier_arrive(sm.bars.v_empty(prev));
        if (rescale) thread_rescale_o(o, alpha);
        if (!FIRST) thread_flush_rowsum(o, st);
        thread_pack_p(pf, s);
    }

    // The last P·V, in its turn too; the last consumer opens no turn after it (nobody would wait).
    __device__ __forceinline__ void finish(const WsSmem& sm) {
        const int last = n_tiles - 1;
        thread_mbarrier_wait(sm.bars.v_full(last % ws::STAGES), (last / ws::STAGES) & 1);
        wg_wait_turn(cw);
        reg_fence(o);
        reg_fence(pf);
        wg_fence();
        wg_issue_values(o, pf, v_desc(last % ws::STAGES));
        wg_commit();
        if (cw != cfg::WG - 1) wg_give_turn<cfg::WG>(cw);
        wg_wait<0>();
        reg_fence(o);
        reg_fence(pf);
        thread_flush_rowsum(o, st);
    }
};

// Grid: x = query block (reversed: causal blocks near the end do the most work and go first),
// y = query head, z = batch. 128 (WG + 1) threads: producer warpgroup 0, consumer warpgroups 1 .. WG.
extern "C" __global__ void __launch_bounds__(ws::THREADS, 1)
fwd_wgmma_fp8(const Fp8FwdParams p, const __grid_constant__ Fp8TmaMaps maps) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const WsSmem sm((cta_smem_addr(smem_raw) + 1023u) & ~1023u);
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * cfg::BM;
    const CtaTiles tiles = cta_tiles<cfg::BM, cfg::BN>(p, m0);

    if (tid == 0) sm.bars.init(ws::STAGES, ws::EMPTY_ARRIVALS);
#if ROWSUM_MMA
    // The ones rows D .. D + 7 of every Vᵀ block of every stage (TMA writes rows 0 .. D - 1
    // only), made visible to the wgmma's async proxy before any consumer issues.
    for (int i = tid; i < ws::STAGES * cfg::VT_BLOCKS * 2 * cfg::VT_BLOCK; i += ws::THREADS) {
        const int per_block = 2 * cfg::VT_BLOCK;   // 8 rows of VT_BLOCK bytes, in words
        const u32 addr = sm.v_tile(i / (cfg::VT_BLOCKS * per_block)) + (u32)(((i / per_block) % cfg::VT_BLOCKS) * cfg::VT_BLOCK_BYTES +
                         cfg::D * cfg::VT_BLOCK + 4 * (i % per_block));
        asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(0x38383838u) : "memory");
    }
    thread_fence_proxy_async_smem();
#endif
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
        c.q_desc = qk_desc(sm.q + (u32)(64 * c.cw * cfg::D));
        c.k_desc0 = qk_desc(sm.k_tile(0));
        c.v_desc0 = vt_desc(sm.v_tile(0));
        const int head = cta_head();
        const int kv_head = head / p.kv_group;
        c.c = p.scale_log2 * cta_descale(p, p.q_descale, p.q_heads, head) * cta_descale(p, p.k_descale, p.kv_heads, kv_head);
#pragma unroll
        for (int e = 0; e < cfg::O_REGS; ++e) c.o[e] = 0.f;
        c.st.m[0] = c.st.m[1] = QA_NEG_INF;
        c.st.l[0] = c.st.l[1] = 0.f;
        if (c.n_tiles > 0) {
            if (c.cw == cfg::WG - 1) wg_give_turn<cfg::WG>(c.cw);   // consumer 0 issues first
            thread_mbarrier_wait(sm.bars.q_full(), 0);
            c.step<true>(p, sm, 0);
            for (int j = 1; j < c.n_tiles; ++j) c.step<false>(p, sm, j);
            c.finish(sm);
        }
        const float v_descale = cta_descale(p, p.v_descale, p.kv_heads, kv_head);
        // Epilogue: every consumer is past its last wgmma before O overwrites Q and K (the
        // producer loaded nothing the consumers did not wait for, so no TMA write is pending).
        cta_named_sync(ws::BAR_EPILOGUE, ws::CONSUMERS);
        thread_finish_rows(p, c.o, c.st, c.c, v_descale, sm.q, local_row0, row0, c.lane);
        cta_named_sync(ws::BAR_EPILOGUE, ws::CONSUMERS);
        cta_store_o<cfg::BM, cfg::D, cfg::THREADS>(p, sm.q, m0, ctid);
    }
}
#endif  // VT_PREPASS
