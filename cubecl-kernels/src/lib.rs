//! Portable kernels of quattn, written once in CubeCL: forward attention
//! `O = softmax(scale · Q·Kᵀ) · V` with the FlashAttention-2 structure (online softmax over
//! KV tiles, f32 statistics and accumulation). One source lowers to WGSL/SPIR-V through wgpu
//! and to CUDA through NVRTC. The crate takes quattn-core's [`AttentionShape`] and CubeCL
//! handles, and does not depend on the `quattn` facade.
//!
//! Selection and launch are apart: [`select`] resolves a [`PortableKernel`] for a shape, an
//! element type and an accumulation on one runtime (or [`select_int8`] for INT8 Q/K,
//! [`select_fp8`] for FP8 Q/K/V), a plan stores it, and [`launch`] / [`launch_int8`] /
//! [`launch_fp8`] run exactly that kernel every time.
//!
//! # Levels
//!
//! - **tile** (one unit or one plane): `thread_score_matmul` / `thread_value_matmul` (FMA,
//!   an `rm x rn` register block per unit, on 4-wide vectors in `fma_vec`),
//!   16x16x16 `cmma` fragments per plane, or m16n8k16 manual-MMA register fragments per plane
//!   (`mma`: the softmax runs on the score registers, P is fed back as the A operand).
//! - **stage** (one cube, one KV tile): stage K and V in shared memory, S = Q·Kᵀ, online
//!   softmax (row max across the units/lanes of a row, conditional rescale, P to shared memory),
//!   acc += P·V.
//! - **global** (one cube, one query tile of one (batch, head)): stage Q once, walk the KV tiles
//!   — fully visible tiles first with no mask code, then the tiles cut by the causal diagonal or
//!   the end of the keys with the mask (a comptime flag, so two specializations); tiles above
//!   the diagonal are never visited. Epilogue `O = acc / l`, `LSE = m·scale + ln l`.
//! - **batch** (grid): `(ceil(q_len / bq), q_heads, batch)`; the KV head is
//!   `q_head / (q_heads / kv_heads)` (GQA/MQA without copies); any (batch, head, seq) strides
//!   with a unit head-dim stride (BHSD, BSHD, ...).
//!
//! Causal masking is bottom-right aligned: query `i` sees key `j` iff `j <= i + kv_len - q_len`.
//! Rows that see no key get `O = 0` and `LSE = -inf`.
//!
//! # Numerics
//!
//! Scores are scaled inside the exponent (`exp(fma(s, scale, -m·scale))`, one FMA per score);
//! CubeCL 0.10's IR has no `exp2`, and on CUDA `exp` under fast math is `__expf`, i.e. `ex2` of
//! a pre-multiplied argument, so folding `log2 e` by hand would buy nothing. The kernels never
//! compute with infinities (WGSL has no infinity literal and llvmpipe does not follow IEEE for
//! `inf - inf`): masked scores are a finite sentinel (-1e30), the LSE of empty rows is passed in.
//! Scores are assumed to stay above -1e29.
//!
//! The FlashAttention-4 rescale trick is on in every kernel but the packed-f16 one with f16
//! P·V: the running max is only moved when the new tile max exceeds it by more than 8·ln 2,
//! otherwise the stale max keeps being used for both the running sum and the accumulator
//! (exact either way). On an H100 it is worth ~20% for the cmma kernel (which rescales through
//! shared memory), and noise for the FMA kernel.
//!
//! # Kernels and what each runtime gets
//!
//! [`select`] tries [`Family::BEST_FIRST`] (mma, cmma, FMA) unless a family is forced.
//!
//! | [`PortableKernel`] | inputs | needs | chosen |
//! | --- | --- | --- | --- |
//! | `Mma` ([`MmaTiles`]) | f16, bf16 | m16n8k16 manual MMA with f32 accumulation, `ldmatrix`, 32-wide planes, CUDA's register layout | CUDA sm_80+ (f16/bf16) |
//! | `Cmma` ([`CmmaTiles`]) | f16, bf16 | 16x16x16 cmma with f32 accumulation, 32-wide planes | where the mma kernel is not (SPIR-V cooperative matrices; CUDA before sm_80) |
//! | `Fma` ([`FmaVecTiles`]) | f32, f16, bf16 where the runtime has it | head dims and strides multiples of 4 ([`vector_layout_ok`]), every buffer at least 4 elements | everywhere else |
//! | `Half` ([`HalfTiles`]) | f16 | as `Fma` | the f16-accumulating modes (any `Accumulation` but f32 everywhere) |
//! | `Int8` ([`Int8Tiles`]) | INT8 Q/K codes and scales from [`quantize_int8`], f16 or f32 V | as `Fma`; the prepass's blocking = [`Int8Tiles::blocking`] | INT8 inputs ([`select_int8`]) |
//! | `Fp8` ([`Fp8Tiles`], [`Fp8Tiling::Mma`]) | FP8 Q/K/V codes (e4m3 or e5m2) with f32 descales per tensor, head or block; O f32, f16, bf16 | as `Mma` (on f16), head dims and Q/K/V strides multiples of 8, code buffers in bytes; per-block descales over [`Fp8Tiles::descale_blocks`] | FP8 inputs ([`select_fp8`]) where the f16 mma kernel runs |
//! | `Fp8` ([`Fp8Tiles`], [`Fp8Tiling::Fma`]) | as above; bf16 O where the runtime has it | as `Fma`, code buffers in bytes (the strided extent, at least 4), f16 on the runtime; per-block descales over [`Fp8Tiles::descale_blocks`] | FP8 inputs ([`select_fp8`]) elsewhere |
//! | `Fp8` ([`Fp8Tiles`], [`Fp8Tiling::Decode`]) | as above | as `Decode` with [`DecodeTiling::Rows`]; per-block descales over [`Fp8Tiles::descale_blocks`] | FP8 inputs ([`select_fp8`]) on decode shapes, first |
//! | `Decode` ([`DecodeTiles`]) | f32, f16, bf16 where the runtime has it | as `Fma`; at most [`DECODE_MAX_ROWS`] rows `group · q_len` per KV head, at least [`DECODE_MIN_KV`] keys | [`select`] with [`Family::Decode`] (the facade tries it first on decode shapes) |
//! | `Fp4` ([`Fp4Tiles`]) | NVFP4 or MXFP4 Q/K codes and byte block scales in dense rows, bf16 V or NVFP4 `Vᵀ` ([`Fp4Operands`]); O f32 | as `Fma` for V and O (`v_head_dim` and O strides multiples of 4), head dim a multiple of the format's block; stages in f32 | 4-bit inputs ([`select_fp4`]) |
//!
//! 4-bit ([`launch_fp4`], one launch, the codes quantized by the caller): NVFP4 or MXFP4 Q and K
//! (E2M1 codes, 8 per word, one-byte block scales along the head dim) and bf16 or NVFP4 V,
//! decoded when staged (each element `e2m1 · block_scale`, exact in f32); f32 softmax and
//! accumulation, P rounded to bf16 or quantized to NVFP4 per 16 keys (bit-exact with the CPU
//! codec), O in f32. The vector FMA kernel, every runtime ([`select_fp4`]).
//!
//! INT8 (SageAttention style) is two launches: [`quantize_int8`] (the prepass: per-block /
//! per-warp / per-thread Q scales with `softmax_scale · log2 e` folded in, per-block K scales,
//! optional K smoothing with its LSE shift; bit-exact with the facade's CPU codec) and
//! [`launch_int8`], the vectorized FMA kernel decoding the codes when it stages Q and K.
//!
//! FP8 ([`launch_fp8`], one launch, the codes quantized by the caller): Q, K and V arrive as
//! one-byte OCP codes in the float kernels' layout (strides in elements = bytes), read as words
//! of 4 codes (so head dims and strides are multiples of 4) and decoded bit-exactly when staged
//! (normal codes assembled as f32 bit patterns, subnormal ones as exact products; the decoded
//! values are exact in f16 too, so the f16-staged tilings lose nothing). Descales are folded
//! where they are constant: `s = (Σ q·k) · (q_descale · k_descale)` per (query block, key
//! tile), and the tile's V descale scales P after its rounding, `Σ_j (p̃_j · v_descale) · v_j`
//! (exact products up to f32 rounding). P is rounded to f16 before P·V, as the facade's FP8
//! emulation and CPU kernel do; scores, softmax, row sums (of the unrounded P) and accumulation
//! are f32. Non-finite codes (NaN; e5m2 ±inf) are staged as 0 and make every row that sees them
//! NaN in O and LSE (a NaN in K row j: every query row that sees key j; in Q row i: O row i
//! only), through explicit records rather than NaN arithmetic, which WGSL does not promise.
//! Descale values are not checked (that needs a read): the facade checks them on the host.
//! Two kernels do this: the vector FMA one (`fma_vec_fp8`, every runtime) and, where the f16
//! mma kernel runs (CUDA sm_80+), the manual-MMA one (`mma_fp8`: 8 codes per load, decoded to
//! f16 pairs with bit operations and one f16 multiply, staged for `ldmatrix`; constant descales
//! folded into the softmax scale and the epilogue, per-block ones folded into each KV tile's
//! softmax: its row max scaled once, the V descale's log added to the exponent).
//!
//! - wgpu/WGSL on llvmpipe (CI): FMA kernels (FP8 too); f16 yes, bf16 no (refused with
//!   [`LaunchError::UnsupportedDtype`]), no subgroups (wgpu disables them on CPU adapters),
//!   32 KiB of shared memory, no cmma.
//! - wgpu/Vulkan on an H100 through WGSL: FMA kernels with 48 KiB, f16 and subgroup row
//!   reductions; WGSL has no cooperative matrices. Through SPIR-V (feature `spirv`): the cmma
//!   kernel on the driver's cooperative matrices, 4 planes x bk 32 (31 KiB at d=128).
//! - CUDA: the mma kernel for f16/bf16 on sm_80+ (d=128: 8 planes x bk 64), the cmma kernel
//!   where manual MMA is missing (4 planes x bk 32), the FMA kernel for f32; plane shuffles for
//!   row reductions.
//!
//! # Tile tables
//!
//! One table per kernel and head dim ([`fma_vec_candidates`], also for the INT8 and FP8
//! kernels, [`fma_half_candidates`], [`cmma_candidates`], [`mma_candidates`],
//! [`mma_fp8_candidates`]; the reasons are
//! next to the tables); the first entry
//! that fits the runtime's shared-memory and units-per-cube limits wins
//! ([`PortableKernel::check_fits`], the one check of the selection and of every launch).
//!
//! Everything is validated before anything is enqueued ([`LaunchError`]); the launch itself is
//! asynchronous, so device failures surface at the client's next sync or read.

mod decode;
mod error;
mod fp4_quant;
mod kernel;
mod launch;
mod problem;
mod quant;
mod tiling;

pub use decode::{
    launch_paged, launch_paged_append, launch_paged_modified, select_paged, select_paged_modified, PagedCache, decode_candidates, decode_split, decode_split_with, mma_decode_candidates, row_candidates, DecodeTiles, DecodeTiling, MmaDecodeTiles, RowTiles, ASSUMED_SMS, CUBES_PER_SM, ROW_CUBES_PER_SM, MMA_CUBES_PER_SM, FP4_MMA_CUBES_PER_SM, DECODE_MAX_ROWS, DECODE_MIN_KV, MAX_SPLITS,
    MIN_TILES_PER_SPLIT,
};
pub use error::LaunchError;
pub use fp4_quant::{blocked_scale_bytes, blocked_scale_offset, quantize_nvfp4, scales_from_blocked, Nvfp4DeviceTensor, SCALE_BLOCK_COLS, SCALE_BLOCK_ROWS};
pub use kernel::decode_mma_fp4::{FP4_DECODE_MAX_ROWS, FP4_DECODE_WARP_KEYS};
pub use launch::{
    check_dtype_supported, first_fit, fp4_operand_bytes, launch, launch_fp4, launch_fp8, launch_int8, launch_modified, launch_modified_varlen,
    launch_varlen,
    select, select_modified, select_fp4, select_fp8, select_int8, vector_layout_ok, CubeLimits, Family, Fp4Format, Fp4Operands, Fp4Tiles, Fp4V,
    Fp8Tiles, Fp8Tiling, HalfTiles, Int8Tiles, LaunchInfo, PortableKernel, ScoreMods, Selection, VarlenBatch,
};
pub use problem::SUPPORTED_HEAD_DIMS;
pub use quant::{q_scale_fold, quantize_int8, Int8DeviceOperands, Int8Quant};
pub use quattn_core::{
    Accumulation, AttentionShape, DescaleGranularity, Dtype, Fp8Format, Int8Blocking, Int8Granularity, PvAccum, QkAccum,
};
pub use tiling::{
    cmma_candidates, fma_half_candidates, fma_vec_candidates, mma_candidates, mma_fp8_candidates, CmmaTiles, FmaVecTiles,
    MmaTiles,
    MMA_FRAGMENT_REGISTERS,
};
