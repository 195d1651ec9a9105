//! Portable kernels of quattn, written once in CubeCL: forward attention
//! `O = softmax(scale · Q·Kᵀ) · V` with the FlashAttention-2 structure (online softmax over
//! KV tiles, f32 statistics and accumulation). One source lowers to WGSL/SPIR-V through wgpu
//! and to CUDA through NVRTC. The crate takes plain launch parameters ([`AttentionArgs`] and
//! CubeCL handles) and does not depend on the `quattn` facade.
//!
//! # Levels
//!
//! - **tile** (one unit or one plane): `thread_score_matmul` / `thread_value_matmul` (FMA,
//!   an `rm x rn` register block per unit, on 4-wide vectors in `fma_vec`, scalar in `fma`),
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
//! The FlashAttention-4 rescale trick is the `lazy_rescale` option (default on): the running
//! max is only moved when the new tile max exceeds it by more than 8·ln 2, otherwise the stale
//! max keeps being used for both the running sum and the accumulator (exact either way). On an
//! H100 it is worth ~20% for the cmma kernel (which rescales through shared memory), and noise
//! for the FMA kernel.
//!
//! # Variants and what each runtime gets
//!
//! | variant | inputs | needs | picked by `Variant::Auto` |
//! | --- | --- | --- | --- |
//! | `portable_fma_vec_*` ([`FmaVecTiles`]) | f32, f16, bf16 where the runtime has it | head dims and strides multiples of 4 | everywhere the cmma kernel is not available |
//! | `portable_fma_*` ([`FmaTiles`], `Variant::PortableFmaScalar`) | same | nothing | when the vector kernel cannot run (unaligned strides, empty tensors, no tiling fits) |
//! | `mma_*` ([`MmaTiles`], `Variant::Mma`) | f16, bf16 | m16n8k16 manual MMA with f32 accumulation, `ldmatrix`, 32-wide planes, CUDA's register layout | CUDA sm_80+ (f16/bf16) |
//! | `cmma_*` ([`CmmaTiles`]) | f16, bf16 | 16x16x16 cmma with f32 accumulation, 32-wide planes | where the mma kernel is not (SPIR-V cooperative matrices; CUDA before sm_80) |
//! | `portable_fma_vec_int8_*` ([`launch_int8`]) | INT8 Q/K codes and scales from [`quantize_int8`], f16 or f32 V | the prepass's blocking = the kernel's `bq`/`bk` ([`int8_blocking`]) | always, for INT8 inputs |
//!
//! INT8 (SageAttention style) is two launches: [`quantize_int8`] (the prepass: per-block /
//! per-warp / per-thread Q scales with `softmax_scale · log2 e` folded in, per-block K scales,
//! optional K smoothing with its LSE shift; bit-exact with the facade's CPU codec) and
//! [`launch_int8`], the vectorized FMA kernel decoding the codes when it stages Q and K.
//!
//! - wgpu/WGSL on llvmpipe (CI): FMA kernel; f16 yes, bf16 no (refused with
//!   [`LaunchError::UnsupportedElemType`]), no subgroups (wgpu disables them on CPU adapters),
//!   32 KiB of shared memory, no cmma.
//! - wgpu/Vulkan on an H100 through WGSL: FMA kernel with 48 KiB, f16 and subgroup row
//!   reductions; WGSL has no cooperative matrices. Through SPIR-V (feature `spirv`): the cmma
//!   kernel on the driver's cooperative matrices, 4 planes x bk 32 (31 KiB at d=128).
//! - CUDA: the mma kernel for f16/bf16 on sm_80+ (4 planes x bk 64 at d=128, 34 KiB, 241
//!   registers), the cmma kernel where manual MMA is missing (4 planes x bk 32), the FMA kernel
//!   for f32; plane shuffles for row reductions. `Variant::Cmma` / `Variant::Mma` force one.
//!
//! The vectorized FMA kernel replaced the scalar one as the default after the scalar one
//! measured ~5 TFLOP/s on an H100 through Vulkan; its module doc says what changed and why.
//!
//! # Tile tables
//!
//! One table per head dim and kernel, filtered by the runtime's shared-memory and
//! units-per-cube limits ([`fma_candidates`], [`cmma_candidates`], [`mma_candidates`]; the
//! reasons are next to the tables). FMA, first fitting entry wins, `(bq, bk, units)`:
//!
//! | head dim | candidates |
//! | --- | --- |
//! | ≤ 64 | (64, 64, 128), (64, 32, 128), (32, 32, 64), (16, 16, 32) |
//! | 96, 128 | (64, 32, 128), (32, 32, 64), (32, 16, 64), (16, 16, 32) |
//! | 256 | (32, 32, 128), (32, 16, 128), (16, 16, 64), (16, 8, 64), (8, 8, 64) |
//!
//! On llvmpipe (32 KiB) f32 gets d64 → bq32/bk32, d128 → bq32/bk16, d256 → bq16/bk8.
//! The vectorized kernel's table ([`fma_vec_candidates`]) is separate; its first entries are
//! sized for 48 KiB (Vulkan on NVIDIA), the last ones for llvmpipe.
//! cmma: 4 planes (bq = 64) with bk = 64 up to d=128, bk = 32 at d=256; within 48 KiB
//! (Vulkan on NVIDIA) bk = 64 up to d=64, bk = 32 above.
//! mma (first entries): 4 planes x 2 m-tiles (bq = 128), bk = 64 up to d=64; 4 planes,
//! bk = 64 at d=96 and 128; 8 planes, bk = 16 at d=256 (the register budget decides, not
//! shared memory).
//!
//! Everything is validated before anything is enqueued ([`LaunchError`]); the launch itself is
//! asynchronous, so device failures surface at the client's next sync or read.

mod error;
mod kernel;
mod launch;
mod problem;
mod quant;
mod select;
mod tiling;

pub use error::LaunchError;
pub use launch::{
    auto_variant, check_elem_supported, half_tiles, int8_blocking, launch, launch_int8, launch_with,
    variant_unavailable, KvLoads, LaunchInfo, LaunchOptions, Variant,
};
pub use problem::{
    bhsd_strides, bshd_strides, Accumulation, AttentionArgs, ElemType, QkAccumulation, SUPPORTED_HEAD_DIMS,
};
pub use select::{launch_selected, launch_selected_int8, select, PortableFamily, PortableKernel, Selection};
pub use quant::{q_scale_fold, quantize_int8, Int8Blocking, Int8Granularity, Int8Operands, Int8Quant};
pub use tiling::{
    cmma_candidates, fma_candidates, fma_half_candidates, fma_vec_candidates, mma_candidates, select_cmma_tiles,
    select_fma_half_tiles, select_fma_tiles, select_fma_vec_tiles, select_mma_tiles, CmmaTiles, FmaTiles, FmaVecTiles,
    MmaTiles, MMA_FRAGMENT_REGISTERS,
};
