//! Portable kernels of quattn, written once in CubeCL: forward attention
//! `O = softmax(scale · Q·Kᵀ) · V` with the FlashAttention-2 structure (online softmax over
//! KV tiles, f32 statistics and accumulation). One source lowers to WGSL/SPIR-V through wgpu
//! and to CUDA through NVRTC. The crate takes quattn-core's [`AttentionShape`] and CubeCL
//! handles, and does not depend on the `quattn` facade.
//!
//! Selection and launch are apart: [`select`] resolves a [`PortableKernel`] for a shape, an
//! element type and an accumulation on one runtime (or [`select_int8`] for INT8 Q/K), a plan
//! stores it, and [`launch`] / [`launch_int8`] run exactly that kernel every time.
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
//!
//! INT8 (SageAttention style) is two launches: [`quantize_int8`] (the prepass: per-block /
//! per-warp / per-thread Q scales with `softmax_scale · log2 e` folded in, per-block K scales,
//! optional K smoothing with its LSE shift; bit-exact with the facade's CPU codec) and
//! [`launch_int8`], the vectorized FMA kernel decoding the codes when it stages Q and K.
//!
//! - wgpu/WGSL on llvmpipe (CI): FMA kernels; f16 yes, bf16 no (refused with
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
//! One table per kernel and head dim ([`fma_vec_candidates`], [`fma_half_candidates`],
//! [`cmma_candidates`], [`mma_candidates`]; the reasons are next to the tables); the first entry
//! that fits the runtime's shared-memory and units-per-cube limits wins
//! ([`PortableKernel::check_fits`], the one check of the selection and of every launch).
//!
//! Everything is validated before anything is enqueued ([`LaunchError`]); the launch itself is
//! asynchronous, so device failures surface at the client's next sync or read.

mod error;
mod kernel;
mod launch;
mod problem;
mod quant;
mod tiling;

pub use error::LaunchError;
pub use launch::{
    check_dtype_supported, first_fit, launch, launch_fp8, launch_int8, select, select_fp8, select_int8, vector_layout_ok,
    CubeLimits, Family, Fp8Tiles, HalfTiles, Int8Tiles, LaunchInfo, PortableKernel, Selection,
};
pub use problem::SUPPORTED_HEAD_DIMS;
pub use quant::{q_scale_fold, quantize_int8, Int8DeviceOperands, Int8Quant};
pub use quattn_core::{
    Accumulation, AttentionShape, DescaleGranularity, Dtype, Fp8Format, Int8Blocking, Int8Granularity, PvAccum, QkAccum,
};
pub use tiling::{
    cmma_candidates, fma_half_candidates, fma_vec_candidates, mma_candidates, CmmaTiles, FmaVecTiles, MmaTiles,
    MMA_FRAGMENT_REGISTERS,
};
