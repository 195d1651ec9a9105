//! Selection and launch, apart. [`select`] walks the kernel families best first and resolves one
//! [`PortableKernel`]: the family, its tiling and every compile-time choice that the shape does
//! not fix. [`launch`] launches exactly that kernel. Each family states its tile table, shared
//! memory, units and query block once ([`PortableKernel`]'s methods); the fit check of the
//! selection and the checks of the launch call the same functions.

use std::fmt;

use cubecl::features::Plane;
use cubecl::ir::features::TypeUsage;
use cubecl::prelude::*;
use cubecl::server::Handle;
use half::{bf16, f16};
use quattn_core::{
    Accumulation, AttentionShape, DescaleGranularity, Dtype, Fp8Format, Int8Blocking, Int8Granularity, PvAccum, QkAccum,
};

use crate::decode::DecodeTiles;
use crate::error::LaunchError;
use crate::kernel::cmma::{fwd_cmma, CmmaConfig};
use crate::kernel::fma_half::{fwd_portable_fma_half, HalfConfig};
use crate::kernel::fma_vec::{fwd_portable_fma_vec, fwd_portable_fma_vec_varlen, FmaVecConfig, W};
use crate::kernel::fma_vec_fp8::{fwd_portable_fma_vec_fp8, Fp8Config, Fp8ShapeLaunch};
use crate::kernel::fma_vec_fp4::{fwd_portable_fma_vec_fp4, Fp4Config, Fp4ShapeLaunch, P_BLOCK};
use crate::kernel::fma_vec_int8::{fwd_portable_fma_vec_int8, Int8Config, Int8ShapeLaunch};
use crate::kernel::fma_vec_mods::{fwd_portable_fma_vec_mods, fwd_portable_fma_vec_mods_varlen, ModArgsLaunch, ModsConfig};
use crate::kernel::mma::{fwd_mma, MmaFwdConfig};
use crate::kernel::mma_fp8::{fwd_mma_fp8, FP8_VEC};
use crate::kernel::AttnShapeLaunch;
use crate::problem::{storage, Args};
use crate::quant::{check_quant_args, scales_len, Int8DeviceOperands, Int8Quant};
use crate::tiling::{
    cmma_candidates, fma_half_candidates, fma_vec_candidates, mma_candidates, mma_fp8_candidates, mma_fp8_record_bytes,
    CmmaTiles, FmaVecTiles, MmaTiles,
};

/// A family of portable kernels, as a caller may force it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Register-resident manual MMA (m16n8k16, `ldmatrix`, 32-wide planes): CUDA sm_80+.
    Mma,
    /// 16x16x16 cooperative matrices with f32 accumulation on 32-wide planes: CUDA, SPIR-V.
    Cmma,
    /// Register-tiled FMA on 4-wide vectors: every runtime. The f16-accumulating modes and
    /// INT8 Q/K run on its variants.
    Fma,
    /// Split-KV decode on the FMA kernel's tile pieces: the q heads of a GQA group and their
    /// positions packed into one query tile per (batch, KV head), the keys split across cubes,
    /// a merge of the partial states (`decode.rs`). Every runtime; decode shapes only
    /// ([`crate::DECODE_MAX_ROWS`], [`crate::DECODE_MIN_KV`]), except on a paged cache
    /// ([`crate::select_paged`]: any KV length, any number of rows in blocks of the tile).
    Decode,
}

impl Family {
    /// The order [`select`] tries them in when none is forced.
    pub const BEST_FIRST: [Family; 3] = [Family::Mma, Family::Cmma, Family::Fma];

    pub const fn name(self) -> &'static str {
        match self {
            Family::Mma => "mma",
            Family::Cmma => "cmma",
            Family::Fma => "fma",
            Family::Decode => "decode",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The packed-f16 FMA kernel (`fma_half.rs`) resolved: its tiling (stages in f16), the
/// accumulation it compiles for (not f32 everywhere), and whether K and V get separate stages
/// (two barriers per tile instead of four, for `bk · dv` more halves of shared memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HalfTiles {
    pub tiles: FmaVecTiles,
    pub accumulation: Accumulation,
    pub split_kv: bool,
}

/// The INT8 kernel (`fma_vec_int8.rs`) resolved: the vector tiling it runs with, the Q scale
/// granularity and whether K was smoothed (its LSE shift is added back). The prepass must lay
/// the scales out for [`Int8Tiles::blocking`]; [`Int8Tiles::quant`] is that prepass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Int8Tiles {
    pub tiles: FmaVecTiles,
    pub granularity: Int8Granularity,
    pub smooth_k: bool,
}

/// Rows per warp of the INT8 scale layout (one MMA fragment of the per-thread model).
const INT8_ROWS_PER_WARP: u32 = quattn_core::INT8_MMA_M as u32;

impl Int8Tiles {
    /// `block_q = bq`, `block_k = bk`, 16 rows per warp.
    pub fn blocking(&self) -> Int8Blocking {
        Int8Blocking {
            block_q: self.tiles.bq as usize,
            block_k: self.tiles.bk as usize,
            warps: (self.tiles.bq / INT8_ROWS_PER_WARP) as usize,
        }
    }

    /// The prepass whose output this kernel reads.
    pub fn quant(&self) -> Int8Quant {
        Int8Quant { granularity: self.granularity, blocking: self.blocking(), smooth_k: self.smooth_k }
    }
}

/// Which FP8 kernel, with its tiling: the vector FMA kernel (`fma_vec_fp8.rs`, every runtime
/// with f16) or the manual-MMA kernel (`mma_fp8.rs`, where the f16 mma kernel runs: CUDA
/// sm_80+). Both decode the codes when they stage them and share the numerics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Tiling {
    Fma(FmaVecTiles),
    Mma(MmaTiles),
    /// The split-KV row decode kernel (`decode_rows.rs`) on decode shapes: at most
    /// `ROW_DECODE_MAX_ROWS` packed rows per KV head.
    Decode(DecodeTiles),
}

impl Fp8Tiling {
    /// Query rows per cube.
    pub const fn bq(&self) -> u32 {
        match self {
            Fp8Tiling::Fma(t) => t.bq,
            Fp8Tiling::Mma(t) => t.bq(),
            Fp8Tiling::Decode(d) => d.bq(),
        }
    }
    /// Keys per KV tile.
    pub const fn bk(&self) -> u32 {
        match self {
            Fp8Tiling::Fma(t) => t.bk,
            Fp8Tiling::Mma(t) => t.bk,
            Fp8Tiling::Decode(d) => d.bk(),
        }
    }
    pub const fn units(&self) -> u32 {
        match self {
            Fp8Tiling::Fma(t) => t.units(),
            Fp8Tiling::Mma(t) => t.units(),
            Fp8Tiling::Decode(d) => d.units(),
        }
    }
}

impl fmt::Display for Fp8Tiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fp8Tiling::Fma(t) => write!(f, "{t}"),
            Fp8Tiling::Mma(t) => write!(f, "{t}"),
            Fp8Tiling::Decode(d) => write!(f, "{d}"),
        }
    }
}

/// The FP8 kernel resolved: which kernel and tiling ([`Fp8Tiling`]), the code format of Q, K
/// and V, and the granularity of their descales. With `DescaleGranularity::PerBlock` the
/// descales must be computed over the blocks of [`Fp8Tiles::descale_blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fp8Tiles {
    pub tiles: Fp8Tiling,
    pub format: Fp8Format,
    pub granularity: DescaleGranularity,
}

impl Fp8Tiles {
    /// `(block rows of the Q descales, block rows of the K and V descales)` for
    /// `DescaleGranularity::PerBlock`: the query tile `bq` and the key tile `bk` (one Q descale
    /// per cube, one K and one V descale per KV tile); for the row decode kernel
    /// [`crate::kernel::decode_rows::ROW_FP8_Q_BLOCK`] positions and its key tile.
    pub fn descale_blocks(&self) -> (usize, usize) {
        match self.tiles {
            Fp8Tiling::Decode(d) => (crate::kernel::decode_rows::ROW_FP8_Q_BLOCK, d.bk() as usize),
            _ => (self.tiles.bq() as usize, self.tiles.bk() as usize),
        }
    }

    /// `(Q, K and V)` descale counts of `DescaleGranularity::count` for this shape.
    fn descale_counts(&self, args: &Args) -> (u64, u64) {
        let (bq, bk) = self.descale_blocks();
        let (b, hq, hk) = (args.batch as usize, args.q_heads as usize, args.kv_heads as usize);
        (
            self.granularity.count(b, hq, args.q_len as usize, bq) as u64,
            self.granularity.count(b, hk, args.kv_len as usize, bk) as u64,
        )
    }
}

fn descale_tag(granularity: DescaleGranularity) -> &'static str {
    match granularity {
        DescaleGranularity::PerTensor => "tensor",
        DescaleGranularity::PerHead => "head",
        DescaleGranularity::PerBlock => "block",
    }
}

/// One portable kernel with everything resolved: a plan stores it and every launch runs it as
/// is. The element type and the shape are not part of it (they come with each launch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortableKernel {
    /// The vector FMA kernel, f32 accumulation.
    Fma(FmaVecTiles),
    /// The packed-f16 FMA kernel, for the f16-accumulating modes (f16 inputs).
    Half(HalfTiles),
    /// The cooperative-matrix kernel (f16/bf16).
    Cmma(CmmaTiles),
    /// The manual-MMA kernel (f16/bf16).
    Mma(MmaTiles),
    /// The vector FMA kernel on INT8 Q/K codes from the prepass, f16 or f32 V.
    Int8(Int8Tiles),
    /// The FP8 kernel on Q/K/V codes with f32 descales, f16 P: the vector FMA one or the
    /// manual-MMA one ([`Fp8Tiling`]).
    Fp8(Fp8Tiles),
    /// The vector FMA kernel on 4-bit block-scaled Q/K codes (NVFP4 or MXFP4), bf16 or 4-bit V
    /// ([`launch_fp4`]).
    Fp4(Fp4Tiles),
    /// The split-KV decode kernel and its split ([`select`] with [`Family::Decode`]).
    Decode(DecodeTiles),
}

/// The 4-bit kernel (`fma_vec_fp4.rs`) resolved: its vector tiling (always staged in f32), the
/// Q/K format and the V format ([`Fp4Format`], [`Fp4V`]); on decode shapes where it applies,
/// the 4-bit MMA decode kernel (`decode_mma_fp4.rs`) and its split instead (`decode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fp4Tiles {
    pub tiles: FmaVecTiles,
    pub format: Fp4Format,
    pub v: Fp4V,
    /// The 4-bit MMA decode kernel's tiling (`DecodeTiling::Mma`, 4 key steps per warp) and
    /// split, which [`launch_fp4`] runs instead of `tiles` when set.
    pub decode: Option<crate::DecodeTiles>,
}

/// Block-scaled 4-bit format of Q and K: E2M1 codes, two per byte (element `2i` in the low
/// nibble), with one-byte block scales along the head dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp4Format {
    /// One UE4M3 scale per 16 elements and one f32 tensor scale per tensor.
    Nvfp4,
    /// One E8M0 scale per 32 elements (tensor scale 1).
    Mxfp4,
}

impl Fp4Format {
    /// Elements per block scale.
    pub const fn block(self) -> usize {
        match self {
            Fp4Format::Nvfp4 => 16,
            Fp4Format::Mxfp4 => 32,
        }
    }
}

/// V (and with it P) in the 4-bit kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp4V {
    /// bf16 V (two per `u32` word, dense rows), P rounded to bf16.
    Bf16,
    /// NVFP4 `Vᵀ`: per (batch, kv head, channel) a row of the keys padded to a multiple of 16,
    /// one UE4M3 scale per 16 keys, one tensor scale; P quantized to NVFP4 per 16 keys.
    Nvfp4,
    /// NVFP4 `Vᵀ` as for [`Fp4V::Nvfp4`] (the same buffers); P rounded to f16 (round to nearest
    /// even), P·V accumulated in f32.
    Nvfp4P16,
}

impl Fp4V {
    /// V is NVFP4 `Vᵀ` (either P format) rather than bf16.
    pub const fn is_4bit(self) -> bool {
        matches!(self, Fp4V::Nvfp4 | Fp4V::Nvfp4P16)
    }
}

/// The 4-bit operands of [`launch_fp4`] (layouts in `fma_vec_fp4`'s docs; every byte buffer is
/// read as `u32` words, so each holds a whole number of words).
#[derive(Debug, Clone, Copy)]
pub struct Fp4Operands<'a> {
    /// Q codes, dense rows `[batch, q_heads, q_len]` of `head_dim / 2` bytes.
    pub q: &'a Handle,
    /// Q block scale codes, `[batch · q_heads · q_len, head_dim / block]` bytes.
    pub q_scales: &'a Handle,
    pub k: &'a Handle,
    pub k_scales: &'a Handle,
    /// bf16 V (dense rows `[batch, kv_heads, kv_len]` of `v_head_dim` values), or NVFP4 `Vᵀ`
    /// codes `[batch · kv_heads · v_head_dim, v_cols / 2]` bytes (`v_cols` = `kv_len` rounded
    /// up to 16).
    pub v: &'a Handle,
    /// NVFP4 `Vᵀ` scale codes `[batch · kv_heads · v_head_dim, v_cols / 16]`; ignored for bf16 V.
    pub v_scales: &'a Handle,
    /// One f32 each: the tensor scales of Q, K and V (1 for MXFP4's Q and K; V's unused with
    /// bf16 V), as [`crate::quantize_nvfp4`] writes them.
    pub tensor_scales: [&'a Handle; 3],
    /// Where K was smoothed: f32 `[batch, q_heads, q_len]`, added to the LSE (`scale · q·μ`).
    pub lse_shift: Option<&'a Handle>,
}

/// What a runtime allows a cube: shared memory and units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubeLimits {
    pub max_shared_bytes: usize,
    pub max_units: u32,
}

impl CubeLimits {
    pub fn of<R: Runtime>(client: &ComputeClient<R>) -> Self {
        let hw = &client.properties().hardware;
        CubeLimits { max_shared_bytes: hw.max_shared_memory_size, max_units: hw.max_units_per_cube }
    }
}

impl PortableKernel {
    pub const fn family(&self) -> Family {
        match self {
            PortableKernel::Mma(_) | PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Mma(_), .. }) => Family::Mma,
            PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Decode(_), .. }) => Family::Decode,
            PortableKernel::Cmma(_) => Family::Cmma,
            PortableKernel::Fma(_)
            | PortableKernel::Half(_)
            | PortableKernel::Int8(_)
            | PortableKernel::Fp8(_)
            | PortableKernel::Fp4(_) => Family::Fma,
            PortableKernel::Decode(_) => Family::Decode,
        }
    }

    /// The kernel and its compile-time choices, e.g. `portable_fma_vec_bq64_bk32_t16x8_sin`.
    /// [`Self::kernel_name`] adds the element type and head dims.
    pub fn name(&self) -> String {
        self.name_with("")
    }

    /// [`Self::name`] with the element type and head dims: `portable_fma_vec_f16_d128_…`,
    /// `portable_fma_half_qk2s32_pv16_d128_…`, `cmma_f16_d64_bq64_bk32`, `mma_bf16_d128_…`,
    /// `portable_fma_vec_int8_block_f16_d64_…`, `portable_fma_vec_fp8_e4m3_head_f16_d128_…`,
    /// `mma_fp8_e4m3_head_f16_d128_…` (the
    /// element type of the FP8 kernel is O's; `d64v128` where the head dims differ).
    pub fn kernel_name(&self, dtype: Dtype, head_dim: usize, v_head_dim: usize) -> String {
        let dims = if head_dim == v_head_dim { format!("d{head_dim}") } else { format!("d{head_dim}v{v_head_dim}") };
        match self {
            // The half kernel's element type is always f16 and is not in its name.
            PortableKernel::Half(_) => self.name_with(&format!("_{dims}")),
            _ => self.name_with(&format!("_{dtype}_{dims}")),
        }
    }

    fn name_with(&self, mid: &str) -> String {
        match self {
            PortableKernel::Fma(t) => format!("portable_fma_vec{mid}_{t}"),
            PortableKernel::Half(h) => {
                let qk = match h.accumulation.qk {
                    QkAccum::F32 => String::new(),
                    QkAccum::F16 => "_qk16".into(),
                    QkAccum::TwoStage => format!("_qk2s{}", quattn_core::TWO_STAGE_CHUNK),
                };
                let pv = if h.accumulation.pv == PvAccum::F16PerTile { "_pv16" } else { "" };
                let split = if h.split_kv { "_split" } else { "" };
                format!("portable_fma_half{qk}{pv}{mid}_{}{split}", h.tiles)
            }
            PortableKernel::Cmma(t) => format!("cmma{mid}_bq{}_bk{}", t.bq(), t.bk),
            PortableKernel::Mma(t) => format!("mma{mid}_{t}"),
            PortableKernel::Int8(i) => format!("portable_fma_vec_int8_{}{mid}_{}", i.granularity.tag(), i.tiles),
            PortableKernel::Fp8(f) => {
                let kernel = match f.tiles {
                    Fp8Tiling::Fma(_) => "portable_fma_vec_fp8",
                    Fp8Tiling::Mma(_) => "mma_fp8",
                    Fp8Tiling::Decode(_) => "portable_decode_fp8",
                };
                format!("{kernel}_{}_{}{mid}_{}", f.format, descale_tag(f.granularity), f.tiles)
            }
            PortableKernel::Fp4(f) => {
                let format = match f.format {
                    Fp4Format::Nvfp4 => "nvfp4",
                    Fp4Format::Mxfp4 => "mxfp4",
                };
                let v = match f.v {
                    Fp4V::Bf16 => "vbf16",
                    Fp4V::Nvfp4 => "v4",
                    Fp4V::Nvfp4P16 => "v4p16",
                };
                match f.decode {
                    Some(d) => format!("portable_decode_mma_{format}_{v}{mid}_{d}"),
                    None => format!("portable_fma_vec_{format}_{v}{mid}_{}", f.tiles),
                }
            }
            PortableKernel::Decode(t) => format!("portable_decode{mid}_{t}"),
        }
    }

    /// The blocking the kernel's numerics follow, where they depend on it: the query block and
    /// KV tile of the packed-f16 kernel (its F16PerTile fold is per tile; one "warp", every row
    /// its own), the INT8 scale layout of the INT8 kernel, the descale blocks of the FP8 kernel
    /// (its query block and KV tile). `None` for the other f32-accumulating kernels.
    pub fn blocking(&self) -> Option<Int8Blocking> {
        match self {
            PortableKernel::Half(h) => {
                Some(Int8Blocking { block_q: h.tiles.bq as usize, block_k: h.tiles.bk as usize, warps: 1 })
            }
            PortableKernel::Int8(i) => Some(i.blocking()),
            PortableKernel::Fp8(f) => {
                let (block_q, block_k) = f.descale_blocks();
                Some(Int8Blocking { block_q, block_k, warps: 1 })
            }
            // The online softmax steps and P's 16-key blocks follow the KV tile (a warp's 64 keys
            // in the MMA decode kernel, whose streams `emulation_streams` describes).
            PortableKernel::Fp4(Fp4Tiles { decode: Some(d), .. }) => Some(Int8Blocking { block_q: d.bq() as usize, block_k: crate::kernel::decode_mma_fp4::FP4_DECODE_WARP_KEYS, warps: 1 }),
            PortableKernel::Fp4(f) => Some(Int8Blocking { block_q: f.tiles.bq as usize, block_k: f.tiles.bk as usize, warps: 1 }),
            _ => None,
        }
    }

    /// Query rows per cube.
    pub const fn block_q(&self) -> u32 {
        match self {
            PortableKernel::Fma(t) => t.bq,
            PortableKernel::Half(h) => h.tiles.bq,
            PortableKernel::Int8(i) => i.tiles.bq,
            PortableKernel::Fp8(f) => f.tiles.bq(),
            PortableKernel::Fp4(Fp4Tiles { decode: Some(d), .. }) => d.bq(),
            PortableKernel::Fp4(f) => f.tiles.bq,
            PortableKernel::Decode(d) => d.bq(),
            PortableKernel::Cmma(t) => t.bq(),
            PortableKernel::Mma(t) => t.bq(),
        }
    }

    /// Keys per KV tile.
    pub const fn block_k(&self) -> u32 {
        match self {
            PortableKernel::Fma(t) => t.bk,
            PortableKernel::Half(h) => h.tiles.bk,
            PortableKernel::Int8(i) => i.tiles.bk,
            PortableKernel::Fp8(f) => f.tiles.bk(),
            PortableKernel::Fp4(Fp4Tiles { decode: Some(d), .. }) => d.bk(),
            PortableKernel::Fp4(f) => f.tiles.bk,
            PortableKernel::Decode(d) => d.bk(),
            PortableKernel::Cmma(t) => t.bk,
            PortableKernel::Mma(t) => t.bk,
        }
    }

    /// Units per cube.
    pub const fn units(&self) -> u32 {
        match self {
            PortableKernel::Fma(t) => t.units(),
            PortableKernel::Half(h) => h.tiles.units(),
            PortableKernel::Int8(i) => i.tiles.units(),
            PortableKernel::Fp8(f) => f.tiles.units(),
            PortableKernel::Fp4(Fp4Tiles { decode: Some(d), .. }) => d.units(),
            PortableKernel::Fp4(f) => f.tiles.units(),
            PortableKernel::Decode(d) => d.units(),
            PortableKernel::Cmma(t) => t.units(),
            PortableKernel::Mma(t) => t.units(),
        }
    }

    /// Shared memory of one cube in bytes, on `dtype` inputs (V's type for INT8; FP8 stages
    /// decoded codes, whatever O's type).
    pub const fn smem_bytes(&self, head_dim: u32, v_head_dim: u32, dtype: Dtype) -> usize {
        let bytes = dtype.size_bytes() as u32;
        (match self {
            PortableKernel::Fma(t) => t.smem_bytes(head_dim, v_head_dim, bytes),
            PortableKernel::Decode(d) => d.smem_bytes(head_dim, v_head_dim, bytes),
            PortableKernel::Int8(i) => i.tiles.smem_bytes(head_dim, v_head_dim, bytes),
            PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Fma(t), .. }) => t.smem_bytes_fp8(head_dim, v_head_dim),
            // Decoded Q and the scratch in f32, then two u32 records; the total is whole
            // 16-byte blocks.
            PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Decode(d), .. }) => match d.tiling {
                // The merge, then two u32 records.
                crate::DecodeTiling::Mma(_) => d.smem_bytes(head_dim, v_head_dim, 1),
                _ => (d.smem_bytes(head_dim, v_head_dim, 4) + 8).next_multiple_of(16),
            },
            // The MMA decode kernel holds only its merge (as the 16-bit one does).
            PortableKernel::Fp4(Fp4Tiles { decode: Some(d), .. }) => d.smem_bytes(head_dim, v_head_dim, 2),
            // Decoded elements are staged in f32.
            PortableKernel::Fp4(f) => f.tiles.smem_bytes(head_dim, v_head_dim, 4),
            // The codes are staged decoded, in f16, after the non-finite records.
            PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Mma(t), .. }) => {
                t.smem_bytes(head_dim, v_head_dim, 2) + mma_fp8_record_bytes(t)
            }
            PortableKernel::Half(h) if h.split_kv => h.tiles.smem_bytes_half_split(head_dim, v_head_dim),
            PortableKernel::Half(h) => h.tiles.smem_bytes_half(head_dim, v_head_dim),
            PortableKernel::Cmma(t) => t.smem_bytes(head_dim, v_head_dim, bytes),
            PortableKernel::Mma(t) => t.smem_bytes(head_dim, v_head_dim, bytes),
        }) as usize
    }

    /// Whether the kernel's loops accept this tiling at these head dims.
    fn validate(&self, head_dim: u32, v_head_dim: u32) -> Result<(), LaunchError> {
        match self {
            PortableKernel::Fma(t) => t.validate(head_dim, v_head_dim),
            PortableKernel::Decode(d) => d.validate(head_dim, v_head_dim),
            PortableKernel::Half(h) => {
                h.tiles.validate(head_dim, v_head_dim)?;
                if h.tiles.stage_f32 {
                    return Err(LaunchError::InvalidTiles {
                        tiles: h.tiles.to_string(),
                        reason: "the packed-f16 kernel stages in f16".into(),
                    });
                }
                if h.accumulation.is_f32() {
                    return Err(LaunchError::InvalidTiles {
                        tiles: h.tiles.to_string(),
                        reason: "the packed-f16 kernel is for the f16-accumulating modes".into(),
                    });
                }
                Ok(())
            }
            PortableKernel::Int8(i) => {
                i.tiles.validate(head_dim, v_head_dim)?;
                if !i.tiles.bq.is_multiple_of(INT8_ROWS_PER_WARP) {
                    return Err(LaunchError::InvalidTiles {
                        tiles: i.tiles.to_string(),
                        reason: "INT8 scales are laid out for 16-row warps: bq must be a multiple of 16".into(),
                    });
                }
                i.blocking().check(i.granularity).map_err(|reason| LaunchError::InvalidProblem { reason })
            }
            PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Fma(t), .. }) => t.validate(head_dim, v_head_dim),
            PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Mma(t), .. }) => t.validate(head_dim, v_head_dim),
            PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Decode(d), .. }) => d.validate(head_dim, v_head_dim),
            PortableKernel::Fp4(Fp4Tiles { decode: Some(d), format, v, .. }) => {
                d.validate(head_dim, v_head_dim)?;
                crate::decode::fp4_decode_config(d, head_dim, v_head_dim, *format, *v, false, false, false)
                    .map(|_| ())
                    .map_err(|reason| LaunchError::InvalidTiles { tiles: d.to_string(), reason })
            }
            PortableKernel::Fp4(f) => {
                f.tiles.validate(head_dim, v_head_dim)?;
                // Vᵀ is staged in whole 16-key blocks (and NVFP4 P quantized in them), which must
                // not straddle KV tiles.
                if f.v.is_4bit() && !(f.tiles.bk as usize).is_multiple_of(P_BLOCK) {
                    return Err(LaunchError::InvalidTiles {
                        tiles: f.tiles.to_string(),
                        reason: format!("4-bit V needs bk % {P_BLOCK} == 0"),
                    });
                }
                Ok(())
            }
            PortableKernel::Cmma(t) => t.validate(),
            PortableKernel::Mma(t) => t.validate(head_dim, v_head_dim),
        }
    }

    /// The one fit check of a tiling, used by the selection and by every launch: the kernel's
    /// rules, then shared memory and units against the runtime's limits.
    pub fn check_fits(&self, limits: CubeLimits, head_dim: u32, v_head_dim: u32, dtype: Dtype) -> Result<(), LaunchError> {
        self.validate(head_dim, v_head_dim)?;
        let smem = self.smem_bytes(head_dim, v_head_dim, dtype);
        if smem > limits.max_shared_bytes {
            return Err(LaunchError::SharedMemoryExceeded {
                kernel: self.name(),
                required: smem,
                available: limits.max_shared_bytes,
            });
        }
        if self.units() > limits.max_units {
            return Err(LaunchError::TooManyUnits { kernel: self.name(), required: self.units(), available: limits.max_units });
        }
        Ok(())
    }
}

/// The tile table of `family` for these head dims and accumulation, best first. The packed-f16
/// kernel's entries take separate K and V stages where those fit `limits`.
fn candidates(family: Family, accumulation: Accumulation, d: u32, dv: u32, limits: CubeLimits) -> Vec<PortableKernel> {
    let dmax = d.max(dv);
    match family {
        Family::Mma => mma_candidates(dmax).iter().map(|&t| PortableKernel::Mma(t)).collect(),
        Family::Cmma => cmma_candidates(dmax).iter().map(|&t| PortableKernel::Cmma(t)).collect(),
        // Its tiling depends on the rows and the split on kv_len: resolved by `select`.
        Family::Decode => Vec::new(),
        Family::Fma if accumulation.is_f32() => fma_vec_candidates(dmax).iter().map(|&t| PortableKernel::Fma(t)).collect(),
        Family::Fma => fma_half_candidates(dmax)
            .iter()
            .map(|&tiles| {
                let split_kv = tiles.smem_bytes_half_split(d, dv) as usize <= limits.max_shared_bytes;
                PortableKernel::Half(HalfTiles { tiles, accumulation, split_kv })
            })
            .collect(),
    }
}

/// The first entry of `family`'s table that fits `limits` (no runtime capability check; see
/// [`select`]), or why none does.
pub fn first_fit(
    family: Family,
    accumulation: Accumulation,
    head_dim: u32,
    v_head_dim: u32,
    dtype: Dtype,
    limits: CubeLimits,
) -> Result<PortableKernel, LaunchError> {
    let all = candidates(family, accumulation, head_dim, v_head_dim, limits);
    first_fitting(all, limits, head_dim, v_head_dim, dtype).map_err(|last| LaunchError::FamilyUnavailable {
        family,
        reason: format!(
            "no tiling fits d={head_dim} dv={v_head_dim} in {} bytes of shared memory and {} units{}",
            limits.max_shared_bytes,
            limits.max_units,
            last.map(|e| format!(" (last candidate: {e})")).unwrap_or_default()
        ),
    })
}

/// The first of `kernels` that passes [`PortableKernel::check_fits`], or the last refusal.
fn first_fitting(
    kernels: impl IntoIterator<Item = PortableKernel>,
    limits: CubeLimits,
    head_dim: u32,
    v_head_dim: u32,
    dtype: Dtype,
) -> Result<PortableKernel, Option<LaunchError>> {
    let mut last = None;
    for kernel in kernels {
        match kernel.check_fits(limits, head_dim, v_head_dim, dtype) {
            Ok(()) => return Ok(kernel),
            Err(e) => last = Some(e),
        }
    }
    Err(last)
}

/// What [`select`] chose, and why each better family was passed over.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    pub kernel: PortableKernel,
    pub passed_over: Vec<(Family, String)>,
}

/// Chooses the kernel for `shape` on `dtype` inputs with `accumulation` on this runtime:
/// `family` forced, or the first of [`Family::BEST_FIRST`] whose capability check passes and
/// whose tile table has an entry that fits. f16 accumulation runs on the FMA family only (the
/// packed-f16 kernel). A forced family that cannot run is [`LaunchError::FamilyUnavailable`]
/// with the reason; a vector kernel that cannot read the tensors is
/// [`LaunchError::UnalignedLayout`] (see [`vector_layout_ok`]).
pub fn select<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    dtype: Dtype,
    accumulation: Accumulation,
    family: Option<Family>,
) -> Result<Selection, LaunchError> {
    select_with(client, shape, dtype, accumulation, family, None)
}

/// [`select`] for a launch with score modifiers ([`launch_modified`]): the decode family's split
/// divides the keys they leave visible rather than the whole sequence (the other families'
/// choices do not depend on them). Modifiers that change nothing select as [`select`] does.
pub fn select_modified<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    dtype: Dtype,
    accumulation: Accumulation,
    family: Option<Family>,
    mods: &ScoreMods<'_>,
) -> Result<Selection, LaunchError> {
    select_with(client, shape, dtype, accumulation, family, (!mods.is_none(shape)).then_some(mods))
}

fn select_with<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    dtype: Dtype,
    accumulation: Accumulation,
    family: Option<Family>,
    mods: Option<&ScoreMods<'_>>,
) -> Result<Selection, LaunchError> {
    let args = Args::new(shape)?;
    check_dtype_supported(client, dtype)?;
    let order: &[Family] = match &family {
        Some(f) => std::slice::from_ref(f),
        None => &Family::BEST_FIRST,
    };
    let mut passed_over = Vec::new();
    let mut last_err = None;
    for &fam in order {
        match select_family(client, &args, shape, dtype, accumulation, fam, mods) {
            Ok(kernel) => {
                for (f, why) in &passed_over {
                    log::debug!("{} kernel not chosen: {why}", f);
                }
                return Ok(Selection { kernel, passed_over });
            }
            Err(e) => {
                passed_over.push((fam, e.to_string()));
                last_err = Some(e);
            }
        }
    }
    Err(last_err.unwrap_or_else(|| LaunchError::InvalidProblem { reason: "no kernel family to try".into() }))
}

fn select_family<R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    shape: &AttentionShape,
    dtype: Dtype,
    accumulation: Accumulation,
    family: Family,
    mods: Option<&ScoreMods<'_>>,
) -> Result<PortableKernel, LaunchError> {
    if let Some(reason) = family_unavailable(client, family, dtype, accumulation) {
        return Err(LaunchError::FamilyUnavailable { family, reason });
    }
    if family == Family::Decode {
        return crate::decode::select(client, args, shape, dtype, accumulation, mods);
    }
    if family == Family::Fma {
        vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    }
    first_fit(family, accumulation, args.head_dim, args.v_head_dim, dtype, CubeLimits::of(client))
}

/// Why `family` cannot run `dtype` inputs with `accumulation` on this runtime, if it cannot
/// (what the runtime reports; the tiling is checked apart).
fn family_unavailable<R: Runtime>(
    client: &ComputeClient<R>,
    family: Family,
    dtype: Dtype,
    accumulation: Accumulation,
) -> Option<String> {
    match family {
        Family::Decode => (!accumulation.is_f32()).then(|| "it accumulates in f32 only".to_string()),
        Family::Fma => (!accumulation.is_f32() && dtype != Dtype::F16)
            .then(|| format!("f16 accumulation needs f16 inputs, not {dtype}")),
        Family::Mma | Family::Cmma if !accumulation.is_f32() => {
            Some("it accumulates in f32 only; f16 accumulation runs on the packed-f16 FMA kernel".into())
        }
        Family::Mma => mma_unavailable(client, dtype),
        Family::Cmma => cmma_unavailable(client, dtype),
    }
}

/// The manual MMA the mma kernel is written for: m16n8k16, `dtype` inputs, f32 accumulation.
fn mma_config(dtype: Dtype) -> cubecl::ir::features::MmaConfig {
    cubecl::ir::features::MmaConfig {
        a_type: storage(dtype),
        b_type: storage(dtype),
        cd_type: storage(Dtype::F32),
        m: 16,
        n: 8,
        k: 16,
    }
}

/// Whether the runtime's register layout of manual MMA fragments is the one the mma kernel
/// indexes (every fragment register a pair of elements, row-major A and accumulator,
/// column-major B, 32 lanes, no duplication): CUDA's. `None` when it is, else what differs.
pub(crate) fn mma_layout_mismatch<R: Runtime>(dtype: Dtype) -> Option<String> {
    use cubecl::ir::{Matrix, MatrixIdent, MatrixLayout};
    let props = R::target_properties().mma;
    let pair = |ident, storage| {
        let matrix = Matrix { ident, m: 16, n: 8, k: 16, storage, layout: MatrixLayout::ColMajor };
        props.contiguous_elements.apply(ident, matrix) == 2
    };
    let ok = props.const_plane_size == 32
        && props.register_layout_a == MatrixLayout::RowMajor
        && props.register_layout_b == MatrixLayout::ColMajor
        && props.register_layout_acc == MatrixLayout::RowMajor
        && props.register_duplication_a == 1
        && props.register_duplication_b == 1
        && props.register_duplication_acc == 1
        && pair(MatrixIdent::A, storage(dtype))
        && pair(MatrixIdent::B, storage(dtype))
        && pair(MatrixIdent::Accumulator, storage(Dtype::F32));
    (!ok).then(|| format!("the runtime's MMA register layout is not the one the kernel indexes: {props:?}"))
}

fn planes_of_32<R: Runtime>(client: &ComputeClient<R>) -> Option<String> {
    let hw = &client.properties().hardware;
    (!client.features().plane.contains(Plane::Ops) || hw.plane_size_min != 32 || hw.plane_size_max != 32)
        .then(|| "the kernel needs plane ops on 32-wide planes".into())
}

pub(crate) fn mma_unavailable<R: Runtime>(client: &ComputeClient<R>, dtype: Dtype) -> Option<String> {
    if dtype == Dtype::F32 {
        return Some("f32 inputs have no m16n8k16 f32-accumulating matrix op".into());
    }
    let mma = mma_config(dtype);
    let features = client.features();
    if !features.matmul.mma.contains(&mma) {
        return Some(format!("runtime `{}` reports no manual {mma:?}", R::name(client)));
    }
    if !features.matmul.ldmatrix.contains(&storage(dtype)) {
        return Some(format!("runtime `{}` reports no ldmatrix for {dtype}", R::name(client)));
    }
    planes_of_32(client).or_else(|| mma_layout_mismatch::<R>(dtype))
}

fn cmma_unavailable<R: Runtime>(client: &ComputeClient<R>, dtype: Dtype) -> Option<String> {
    if dtype == Dtype::F32 {
        return Some("f32 inputs have no 16x16x16 f32-accumulating matrix op".into());
    }
    let mma = cubecl::ir::features::MmaConfig {
        a_type: storage(dtype),
        b_type: storage(dtype),
        cd_type: storage(Dtype::F32),
        m: 16,
        n: 16,
        k: 16,
    };
    if !client.features().matmul.cmma.contains(&mma) {
        return Some(format!("runtime `{}` reports no {mma:?}", R::name(client)));
    }
    planes_of_32(client)
}

/// Whether the runtime behind `client` can load, store and convert `dtype` (every kernel
/// computes in f32 or f16 after loading), or the error naming it.
pub fn check_dtype_supported<R: Runtime>(client: &ComputeClient<R>, dtype: Dtype) -> Result<(), LaunchError> {
    let usage = client.features().type_usage(storage(dtype));
    if usage.contains(TypeUsage::Conversion) && usage.contains(TypeUsage::Buffer) {
        Ok(())
    } else {
        Err(LaunchError::UnsupportedDtype { dtype, runtime: R::name(client) })
    }
}

/// Why the 4-wide vector kernels (the FMA family: f32, packed-f16 and INT8) cannot read these
/// tensors, if they cannot: every head dim and every (batch, head, seq) stride must be a
/// multiple of 4, so that each row starts on a vector. A caller can realign at upload. (Every
/// buffer must also hold at least one vector, 4 elements, even for an empty tensor: the
/// launch checks that.)
pub fn vector_layout_ok(shape: &AttentionShape) -> Result<(), String> {
    let w = W;
    let mut all = vec![shape.head_dim, shape.v_head_dim];
    for s in [shape.q, shape.k, shape.v, shape.o] {
        all.extend(s.to_array());
    }
    if all.iter().any(|x| x % w != 0) {
        return Err(format!(
            "a head dim or stride is not a multiple of {w} (head dims {} / {}, strides q {:?} k {:?} v {:?} o {:?})",
            shape.head_dim,
            shape.v_head_dim,
            shape.q.to_array(),
            shape.k.to_array(),
            shape.v.to_array(),
            shape.o.to_array()
        ));
    }
    Ok(())
}

/// What was launched, for logs and benchmarks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// [`PortableKernel::kernel_name`].
    pub kernel: String,
    pub cube_count: (u32, u32, u32),
    pub units_per_cube: u32,
    pub shared_memory_bytes: usize,
    /// Row reductions through plane shuffles (the FMA family where the runtime has them).
    pub plane_reduce: bool,
    /// False when the grid was empty and nothing was enqueued.
    pub launched: bool,
}

/// Runs `kernel` (from [`select`], or built by hand) on `dtype` Q, K, V, O: `O = softmax(scale ·
/// Q·Kᵀ) · V`, LSE as f32 `[batch, q_heads, q_len]` when `shape.write_lse`. Chooses nothing:
/// it checks that the kernel fits the runtime and the buffers cover the strided extents, then
/// enqueues. The launch is asynchronous; device failures surface at the client's next sync or
/// read. INT8 runs through [`launch_int8`].
#[allow(clippy::too_many_arguments)]
pub fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    launch_with(client, kernel, shape, dtype, None, q, k, v, o, lse)
}

/// [`launch`], and with `mods` on the decode kernels their modifier variant.
#[allow(clippy::too_many_arguments)]
fn launch_with<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    mods: Option<&ScoreMods<'_>>,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let args = Args::new(shape)?;
    if let Some(m) = mods {
        m.check(&args)?;
    }
    check_dtype_supported(client, dtype)?;
    match kernel {
        PortableKernel::Int8(_) => {
            return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "INT8 inputs launch through launch_int8".into() })
        }
        PortableKernel::Fp8(_) => {
            return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "FP8 inputs launch through launch_fp8".into() })
        }
        PortableKernel::Fp4(_) => {
            return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "4-bit inputs launch through launch_fp4".into() })
        }
        _ => {}
    }
    if let Some(reason) = family_unavailable(client, kernel.family(), dtype, accumulation_of(kernel)) {
        return Err(LaunchError::FamilyUnavailable { family: kernel.family(), reason });
    }
    // The vector kernels bind every buffer as 4-wide vectors (at least one, also for an empty
    // tensor); the matrix kernels load Q, K, V as wide as their rows allow and write O by
    // element.
    let (vec, min_elems) = match kernel {
        PortableKernel::Cmma(_) | PortableKernel::Mma(_) => (load_vector_width(&args, dtype), 0),
        _ => {
            vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
            (W, W as u64)
        }
    };
    let extents = args.extents();
    let bytes = dtype.size_bytes() as u64;
    for ((tensor, elems), handle) in extents.into_iter().zip([q, k, v, o]) {
        check_extent(tensor, elems.max(min_elems), bytes, handle)?;
    }
    check_lse(&args, lse)?;
    if let PortableKernel::Decode(t) = kernel {
        let plane_reduce = t.reduce_lanes().is_some_and(|tc| plane_reduce_ok(client, tc));
        return crate::decode::launch(client, kernel, t, &args, dtype, [q, k, v, o], lse_binding(client, &args, lse), plane_reduce, None, mods);
    }
    let Some(mut info) = prepare(client, kernel, &args, dtype)? else {
        return Ok(empty_info(kernel, &args, dtype));
    };
    log::debug!("launching {} for {args:?}", info.kernel);

    let arr = |handle: &Handle, elems: u64, width: usize| {
        // SAFETY: `check_extent` proved the handle covers `max(elems, width)` elements; the
        // kernels access whole `width`-vectors inside rows, and every row start is a multiple
        // of `width` (vector_layout_ok / load_vector_width).
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(width).max(1)) }
    };
    let (lse_handle, lse_len) = lse_binding(client, &args, lse);
    // SAFETY: `check_lse` proved the caller's LSE buffer holds `lse_len` floats; without one the
    // kernels write nothing to the 1-float scratch.
    let lse_arg = || unsafe { ArrayArg::from_raw_parts(lse_handle.clone(), lse_len as usize) };
    let count = cube_count(kernel, &args);
    let count_arg = CubeCount::Static(count.0, count.1, count.2);
    let dim = CubeDim::new_1d(kernel.units());
    let shape_arg = || shape_arg::<R>(&args);
    let lazy_rescale = lazy_rescale(kernel);

    // Every launch below is unsafe for the same reason: the kernels guard each global index by
    // q_len / kv_len, and the buffers were checked to cover the strided extents.
    macro_rules! vector_kernel {
        ($kernel:ident::<$($t:ty),+>($($cfg:expr),+)) => {
            unsafe {
                $kernel::launch_unchecked::<$($t,)+ R>(
                    client, count_arg, dim, W,
                    arr(q, extents[0].1, W), arr(k, extents[1].1, W), arr(v, extents[2].1, W), arr(o, extents[3].1, W),
                    lse_arg(), shape_arg(), $($cfg),+
                )
            }
        };
    }
    macro_rules! matrix_kernel {
        ($kernel:ident::<$t:ty>($cfg:expr)) => {
            unsafe {
                $kernel::launch_unchecked::<$t, R>(
                    client, count_arg, dim, vec,
                    arr(q, extents[0].1, vec), arr(k, extents[1].1, vec), arr(v, extents[2].1, vec), arr(o, extents[3].1, 1),
                    lse_arg(), shape_arg(), $cfg
                )
            }
        };
    }
    match *kernel {
        PortableKernel::Fma(tiles) => {
            let cfg = fma_vec_config(&tiles, &args, lazy_rescale, info.plane_reduce);
            match (dtype, tiles.stage_f32) {
                (Dtype::F32, _) => vector_kernel!(fwd_portable_fma_vec::<f32, f32>(cfg)),
                (Dtype::F16, true) => vector_kernel!(fwd_portable_fma_vec::<f16, f32>(cfg)),
                (Dtype::F16, false) => vector_kernel!(fwd_portable_fma_vec::<f16, f16>(cfg)),
                (Dtype::Bf16, true) => vector_kernel!(fwd_portable_fma_vec::<bf16, f32>(cfg)),
                (Dtype::Bf16, false) => vector_kernel!(fwd_portable_fma_vec::<bf16, bf16>(cfg)),
            }
        }
        PortableKernel::Half(h) => {
            let cfg = fma_vec_config(&h.tiles, &args, lazy_rescale, info.plane_reduce);
            let half = HalfConfig {
                qk_chunk: h.accumulation.qk_chunk(args.head_dim as usize),
                pv_f16: h.accumulation.pv == PvAccum::F16PerTile,
                split_kv: h.split_kv,
            };
            vector_kernel!(fwd_portable_fma_half::<f16>(cfg, half))
        }
        PortableKernel::Cmma(t) => {
            let cfg = CmmaConfig {
                head_dim: args.head_dim as usize,
                v_head_dim: args.v_head_dim as usize,
                warps: t.warps as usize,
                bk: t.bk as usize,
                vec,
                causal: args.causal,
                write_lse: args.write_lse,
                lazy_rescale,
            };
            match dtype {
                Dtype::F16 => matrix_kernel!(fwd_cmma::<f16>(cfg)),
                Dtype::Bf16 => matrix_kernel!(fwd_cmma::<bf16>(cfg)),
                Dtype::F32 => unreachable!("family_unavailable refuses f32 inputs"),
            }
        }
        PortableKernel::Mma(t) => {
            let cfg = MmaFwdConfig {
                head_dim: args.head_dim as usize,
                v_head_dim: args.v_head_dim as usize,
                warps: t.warps as usize,
                mt: t.mt as usize,
                bk: t.bk as usize,
                vec,
                causal: args.causal,
                write_lse: args.write_lse,
                lazy_rescale,
            };
            match dtype {
                Dtype::F16 => matrix_kernel!(fwd_mma::<f16>(cfg)),
                Dtype::Bf16 => matrix_kernel!(fwd_mma::<bf16>(cfg)),
                Dtype::F32 => unreachable!("family_unavailable refuses f32 inputs"),
            }
        }
        PortableKernel::Int8(_) | PortableKernel::Fp8(_) | PortableKernel::Fp4(_) | PortableKernel::Decode(_) => {
            unreachable!("refused or launched above")
        }
    }
    info.launched = true;
    Ok(info)
}

/// Score modifiers for [`launch_modified`], in FlashAttention's conventions: a sliding window
/// `(left, right)` (`None`: unbounded on that side) around the row's aligned position `a(i)`
/// (`i + kv_len - q_len`, or `i` with `top_left`), softcap `cap · tanh(s / cap)` and ALiBi
/// `-slope · |a(i) - j|` on the scaled logit `s`, and sinks joining the softmax denominator.
/// Causal masking (the shape's `causal`) composes with the window: a right extent of 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScoreMods<'a> {
    pub top_left: bool,
    pub window_left: Option<u32>,
    pub window_right: Option<u32>,
    pub softcap: Option<f32>,
    /// One per Q head.
    pub sinks: Option<&'a [f32]>,
    /// One per Q head.
    pub alibi_slopes: Option<&'a [f32]>,
}

impl ScoreMods<'_> {
    /// The modifier kernels' comptime key: causal masking is a right extent of 0.
    pub(crate) fn config(&self, causal: bool) -> ModsConfig {
        ModsConfig {
            left: self.window_left.is_some(),
            right: causal || self.window_right.is_some(),
            softcap: self.softcap.is_some(),
            alibi: self.alibi_slopes.is_some(),
        }
    }

    /// The per-head parameters the modifier kernels read: the sinks, then the ALiBi slopes, one
    /// per Q head each. Sinks below the kernels' "no score" value take no mass either way;
    /// clamping them keeps infinities out of the kernels (WGSL has none). Without sinks, a sink
    /// far below any score (exp(sink − m) is exactly 0, even for a row that saw no key).
    pub(crate) fn head_params(&self, heads: usize) -> Vec<f32> {
        let mut params = vec![0.0f32; 2 * heads];
        params[..heads].fill(-3.0e38);
        if let Some(sinks) = self.sinks {
            for (p, &x) in params[..heads].iter_mut().zip(sinks) {
                *p = x.max(crate::kernel::NO_MAX);
            }
        }
        if let Some(slopes) = self.alibi_slopes {
            params[heads..].copy_from_slice(slopes);
        }
        params
    }

    /// Whether the modifiers leave attention as [`launch`] computes it.
    pub fn is_none(&self, shape: &AttentionShape) -> bool {
        let aligned_same = !self.top_left || shape.q_len == shape.kv_len;
        self.window_left.is_none()
            && self.window_right.is_none()
            && self.softcap.is_none()
            && self.sinks.is_none()
            && self.alibi_slopes.is_none()
            && (aligned_same || !shape.causal)
    }

    pub(crate) fn check(&self, args: &Args) -> Result<(), LaunchError> {
        let invalid = |reason: String| Err(LaunchError::InvalidProblem { reason });
        if let Some(cap) = self.softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return invalid(format!("softcap {cap} is not finite and positive"));
            }
        }
        for (what, x) in [("left", self.window_left), ("right", self.window_right)] {
            if x.is_some_and(|x| x > u32::MAX / 2) {
                return invalid(format!("window {what} extent {x:?} exceeds {}", u32::MAX / 2));
            }
        }
        for (what, values, neg_inf) in [("sinks", self.sinks, true), ("alibi slopes", self.alibi_slopes, false)] {
            let Some(values) = values else { continue };
            if values.len() != args.q_heads as usize {
                return invalid(format!("{} {what} for {} q heads", values.len(), args.q_heads));
            }
            if values.iter().any(|x| !(x.is_finite() || (neg_inf && *x == f32::NEG_INFINITY))) {
                return invalid(format!("{what} hold a NaN or an infinity"));
            }
        }
        Ok(())
    }
}

/// [`launch`] with score modifiers ([`ScoreMods`]): the vector FMA kernel's modifier variant,
/// which visits only the key tiles a query tile's windows touch, or the decode kernels' (whose
/// split, from [`select_modified`] or built by hand, must cover the keys the modifiers leave
/// visible). Modifiers that change nothing launch the plain kernel; any other kernel is
/// [`LaunchError::WrongKernel`].
#[allow(clippy::too_many_arguments)]
pub fn launch_modified<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    mods: &ScoreMods<'_>,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    if mods.is_none(shape) {
        return launch(client, kernel, shape, dtype, q, k, v, o, lse);
    }
    if let PortableKernel::Decode(_) = kernel {
        return launch_with(client, kernel, shape, dtype, Some(mods), q, k, v, o, lse);
    }
    modified(client, kernel, shape, dtype, mods, None, q, k, v, o, lse)
}

/// [`launch_modified`] on a packed variable-length batch, in [`launch_varlen`]'s layout and
/// conventions. Every sequence aligns its rows with its own lengths: `a(i) = i + kv_len_b -
/// q_len_b` (or `i` with `top_left`) for the window, causal masking and ALiBi. Modifiers that
/// change nothing on any sequence launch [`launch_varlen`].
#[allow(clippy::too_many_arguments)]
pub fn launch_modified_varlen<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    mods: &ScoreMods<'_>,
    batch: &VarlenBatch<'_>,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    // The alignment matters to causal masking only (without a window or ALiBi), and the
    // sequences' own lengths may differ where the shape's longest ones are equal.
    let aligned_same = !mods.top_left || !shape.causal;
    if mods.is_none(shape) && aligned_same {
        return launch_varlen(client, kernel, shape, dtype, batch, q, k, v, o, lse);
    }
    modified(client, kernel, shape, dtype, mods, Some(batch), q, k, v, o, lse)
}

/// The launch of the modifier kernel, on the shape's batch or on a packed one (`varlen`).
#[allow(clippy::too_many_arguments)]
fn modified<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    mods: &ScoreMods<'_>,
    varlen: Option<&VarlenBatch<'_>>,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let PortableKernel::Fma(tiles) = *kernel else {
        return Err(LaunchError::WrongKernel {
            kernel: kernel.name(),
            reason: "score modifiers run on the vector FMA kernel only".into(),
        });
    };
    let args = Args::new(shape)?;
    mods.check(&args)?;
    check_dtype_supported(client, dtype)?;
    vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    // The varlen kernel's q_len is the batch's Q rows (the sequences' lengths come from the
    // offsets).
    let (extents, lse_len, kernel_q_len) = match varlen {
        Some(batch) => {
            let (extents, total_q) = check_varlen_buffers(&args, dtype, batch, [q, k, v, o], lse)?;
            (extents, args.q_heads as u64 * total_q as u64, total_q)
        }
        None => {
            let extents = args.extents();
            let bytes = dtype.size_bytes() as u64;
            for ((tensor, elems), handle) in extents.into_iter().zip([q, k, v, o]) {
                check_extent(tensor, elems.max(W as u64), bytes, handle)?;
            }
            check_lse(&args, lse)?;
            (extents, if args.write_lse { args.lse_len() } else { 1 }, args.q_len)
        }
    };
    let suffix = if varlen.is_some() { "_varlen" } else { "" };
    let Some(mut info) = prepare(client, kernel, &args, dtype)? else {
        let mut info = empty_info(kernel, &args, dtype);
        info.kernel.push_str(suffix);
        return Ok(info);
    };
    info.kernel.push_str(suffix);
    log::debug!("launching {} with score modifiers {mods:?} for {args:?}", info.kernel);

    // Causal masking is a right extent of 0, whatever the window's.
    let right = if args.causal { Some(0) } else { mods.window_right };
    let mc = mods.config(args.causal);
    let heads = args.q_heads as usize;
    let params_handle = client.create_from_slice(&mods.head_params(heads).iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>());

    let arr = |handle: &Handle, elems: u64| {
        // SAFETY: `check_extent` proved the handle covers `max(elems, W)` elements; every row
        // start is a multiple of W (vector_layout_ok).
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(W).max(1)) }
    };
    let (lse_handle, lse_arg_len) = match lse {
        Some(handle) => (handle.clone(), lse_len.max(1)),
        None => (client.empty(4), 1),
    };
    // SAFETY: the caller's LSE buffer was checked to hold `lse_len` floats (the kernel writes
    // none when that is 0); without one the kernel writes nothing to the 1-float scratch.
    let lse_arg = || unsafe { ArrayArg::from_raw_parts(lse_handle.clone(), lse_arg_len as usize) };
    // SAFETY: `params` holds 2 · q_heads floats; the kernel reads `head` and `q_heads + head`.
    let params_arg = || unsafe { ArrayArg::from_raw_parts(params_handle.clone(), 2 * heads) };
    // SAFETY: `check_varlen_buffers` proved both offset buffers hold `batch + 1` u32.
    let offsets_arg = |handle: &Handle| unsafe { ArrayArg::from_raw_parts(handle.clone(), args.batch as usize + 1) };
    let count = cube_count(kernel, &args);
    let count_arg = CubeCount::Static(count.0, count.1, count.2);
    let dim = CubeDim::new_1d(kernel.units());
    // The kernel scales the scores itself, before the modifiers; its softmax runs with 1.
    let unscaled = Args { scale: 1.0, q_len: kernel_q_len, ..args };
    // The varlen kernel takes each sequence's own lengths instead.
    let row_shift = if mods.top_left { args.q_len } else { args.kv_len };
    let mod_arg = || {
        ModArgsLaunch::new(
            row_shift,
            mods.window_left.unwrap_or(0),
            right.unwrap_or(0),
            args.scale,
            mods.softcap.unwrap_or(1.0),
        )
    };
    let cfg = fma_vec_config(&tiles, &args, true, info.plane_reduce);
    macro_rules! go {
        ($e:ty, $s:ty) => {
            // SAFETY: as for `launch` and `launch_varlen`: every global index stays inside the
            // rows of the cube's batch entry or sequence, and the buffers cover the extents.
            unsafe {
                match varlen {
                    None => fwd_portable_fma_vec_mods::launch_unchecked::<$e, $s, R>(
                        client, count_arg, dim, W,
                        arr(q, extents[0].1), arr(k, extents[1].1), arr(v, extents[2].1), arr(o, extents[3].1),
                        lse_arg(), shape_arg::<R>(&unscaled), mod_arg(), params_arg(), cfg, mc,
                    ),
                    Some(batch) => fwd_portable_fma_vec_mods_varlen::launch_unchecked::<$e, $s, R>(
                        client, count_arg, dim, W,
                        arr(q, extents[0].1), arr(k, extents[1].1), arr(v, extents[2].1), arr(o, extents[3].1),
                        lse_arg(), offsets_arg(batch.cu_seqlens_q), offsets_arg(batch.cu_seqlens_k),
                        shape_arg::<R>(&unscaled), mod_arg(), params_arg(), cfg, mc, mods.top_left,
                    ),
                }
            }
        };
    }
    match (dtype, tiles.stage_f32) {
        (Dtype::F32, _) => go!(f32, f32),
        (Dtype::F16, true) => go!(f16, f32),
        (Dtype::F16, false) => go!(f16, f16),
        (Dtype::Bf16, true) => go!(bf16, f32),
        (Dtype::Bf16, false) => go!(bf16, bf16),
    }
    info.launched = true;
    Ok(info)
}

/// A packed variable-length batch for [`launch_varlen`], in FlashAttention's varlen
/// convention: sequence `b` owns the Q/O rows `[cu_seqlens_q[b], cu_seqlens_q[b+1])` and the
/// K/V rows `[cu_seqlens_k[b], cu_seqlens_k[b+1])` of token-major tensors.
#[derive(Debug, Clone, Copy)]
pub struct VarlenBatch<'a> {
    /// Q and O rows of all sequences (`cu_seqlens_q[batch]`).
    pub total_q: usize,
    /// K and V rows of all sequences (`cu_seqlens_k[batch]`).
    pub total_k: usize,
    /// `batch + 1` u32 offsets on the device, from 0, non-decreasing, the last `total_q`.
    pub cu_seqlens_q: &'a Handle,
    /// `batch + 1` u32 offsets on the device, from 0, non-decreasing, the last `total_k`.
    pub cu_seqlens_k: &'a Handle,
}

/// [`launch`] on a packed variable-length batch ([`VarlenBatch`]): the vector FMA kernel's
/// varlen variant, any other kernel than [`PortableKernel::Fma`] is
/// [`LaunchError::WrongKernel`].
///
/// `shape.batch` is the number of sequences, `shape.q_len` / `shape.kv_len` the longest
/// sequence's lengths (they size the grid; a longer sequence's excess rows would be left
/// unwritten), and the strides' head and seq entries address the packed tensors: Q
/// `[total_q, q_heads, d]`, K and V `[total_k, kv_heads, d]` (V its own head dim), O
/// `[total_q, q_heads, dv]`, row `t`'s head `h` at `t · seq + h · head`; the batch strides are
/// unused. LSE (with `shape.write_lse`) is f32 `[q_heads, total_q]`, `(h, t)` at
/// `h · total_q + t`. Causal masking is bottom-right aligned per sequence; a sequence without
/// queries does nothing, rows without keys get `O = 0` and `LSE = -inf`.
///
/// The offsets are device data and are not read here: the caller validates them (from 0,
/// non-decreasing, ending at `total_q` / `total_k`, no sequence longer than the shape's
/// lengths). Sizes are checked: the tensors against `total_q` / `total_k`, the offset buffers
/// against `batch + 1` entries.
#[allow(clippy::too_many_arguments)]
pub fn launch_varlen<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    batch: &VarlenBatch<'_>,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let PortableKernel::Fma(tiles) = *kernel else {
        return Err(LaunchError::WrongKernel {
            kernel: kernel.name(),
            reason: "variable-length batches run on the vector FMA kernel only".into(),
        });
    };
    let args = Args::new(shape)?;
    check_dtype_supported(client, dtype)?;
    vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    let (extents, total_q) = check_varlen_buffers(&args, dtype, batch, [q, k, v, o], lse)?;
    let lse_len = args.q_heads as u64 * total_q as u64;
    let offsets = args.batch as u64 + 1;
    let Some(mut info) = prepare(client, kernel, &args, dtype)? else {
        let mut info = empty_info(kernel, &args, dtype);
        info.kernel.push_str("_varlen");
        return Ok(info);
    };
    info.kernel.push_str("_varlen");
    log::debug!("launching {} on {} packed sequences for {args:?}", info.kernel, args.batch);

    let arr = |handle: &Handle, elems: u64| {
        // SAFETY: `check_extent` proved the handle covers `max(elems, W)` elements; every row
        // start is a multiple of W (vector_layout_ok).
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(W).max(1)) }
    };
    // SAFETY: `check_varlen_buffers` proved both offset buffers hold `batch + 1` u32.
    let offsets_arg = |handle: &Handle| unsafe { ArrayArg::from_raw_parts(handle.clone(), offsets as usize) };
    let (lse_handle, lse_arg_len) = match lse {
        Some(handle) => (handle.clone(), lse_len.max(1)),
        None => (client.empty(4), 1),
    };
    // SAFETY: the caller's LSE buffer was checked to hold `q_heads · total_q` floats (the
    // kernel writes none when that is 0); without one the kernel writes nothing to the scratch.
    let lse_arg = unsafe { ArrayArg::from_raw_parts(lse_handle, lse_arg_len as usize) };
    let count = cube_count(kernel, &args);
    let count_arg = CubeCount::Static(count.0, count.1, count.2);
    let dim = CubeDim::new_1d(kernel.units());
    let cfg = fma_vec_config(&tiles, &args, lazy_rescale(kernel), info.plane_reduce);
    // The kernel's q_len is the batch's Q rows (the sequences' lengths come from the offsets).
    let packed = Args { q_len: total_q, ..args };
    macro_rules! go {
        ($e:ty, $s:ty) => {
            // SAFETY: every global index stays inside the rows of the cube's sequence (given
            // valid offsets) and the buffers cover the packed extents.
            unsafe {
                fwd_portable_fma_vec_varlen::launch_unchecked::<$e, $s, R>(
                    client, count_arg, dim, W,
                    arr(q, extents[0].1), arr(k, extents[1].1), arr(v, extents[2].1), arr(o, extents[3].1),
                    lse_arg, offsets_arg(batch.cu_seqlens_q), offsets_arg(batch.cu_seqlens_k), shape_arg::<R>(&packed), cfg,
                )
            }
        };
    }
    match (dtype, tiles.stage_f32) {
        (Dtype::F32, _) => go!(f32, f32),
        (Dtype::F16, true) => go!(f16, f32),
        (Dtype::F16, false) => go!(f16, f16),
        (Dtype::Bf16, true) => go!(bf16, f32),
        (Dtype::Bf16, false) => go!(bf16, bf16),
    }
    info.launched = true;
    Ok(info)
}

/// (name, extent in elements) of Q, K, V, O.
type Extents = [(&'static str, u64); 4];

/// Size checks of a packed batch's buffers: Q, K, V, O against `total_q` / `total_k` rows
/// (at least one vector each), both offset buffers against `batch + 1` u32, the LSE against
/// `q_heads · total_q` floats. Returns the extents of Q, K, V, O and `total_q`.
fn check_varlen_buffers(
    args: &Args,
    dtype: Dtype,
    batch: &VarlenBatch<'_>,
    tensors: [&Handle; 4],
    lse: Option<&Handle>,
) -> Result<(Extents, u32), LaunchError> {
    let narrow = |what: &'static str, value: usize| u32::try_from(value).map_err(|_| LaunchError::TooLarge { what, value });
    let total_q = narrow("total_q", batch.total_q)?;
    let total_k = narrow("total_k", batch.total_k)?;
    let extents = args.varlen_extents(total_q, total_k);
    let bytes = dtype.size_bytes() as u64;
    for ((tensor, elems), handle) in extents.into_iter().zip(tensors) {
        check_extent(tensor, elems.max(W as u64), bytes, handle)?;
    }
    let offsets = args.batch as u64 + 1;
    check_extent("cu_seqlens_q", offsets, 4, batch.cu_seqlens_q)?;
    check_extent("cu_seqlens_k", offsets, 4, batch.cu_seqlens_k)?;
    let lse_len = args.q_heads as u64 * total_q as u64;
    match (args.write_lse, lse) {
        (true, Some(handle)) => check_extent("lse", lse_len, 4, handle)?,
        (true, None) => {
            return Err(LaunchError::InvalidProblem { reason: "write_lse is set but no lse buffer was given".into() })
        }
        (false, Some(_)) => {
            return Err(LaunchError::InvalidProblem { reason: "an lse buffer was given but write_lse is not set".into() })
        }
        (false, None) => {}
    }
    Ok((extents, total_q))
}

/// The accumulation a kernel compiles for.
fn accumulation_of(kernel: &PortableKernel) -> Accumulation {
    match kernel {
        PortableKernel::Half(h) => h.accumulation,
        _ => Accumulation::default(),
    }
}

/// FlashAttention-4's conditional rescale (exact either way), except with f16 P·V: a stale max
/// lets p reach 2^8, and a tile's f16 P·V sum could overflow (see `fma_half.rs`).
fn lazy_rescale(kernel: &PortableKernel) -> bool {
    accumulation_of(kernel).pv != PvAccum::F16PerTile
}

/// `(ceil(q_len / bq), q_heads, batch)`.
fn cube_count(kernel: &PortableKernel, args: &Args) -> (u32, u32, u32) {
    (args.q_len.div_ceil(kernel.block_q()), args.q_heads, args.batch)
}

/// Fit and grid checks shared by [`launch`], [`launch_int8`] and [`launch_fp8`]: the record of the launch, or
/// `None` when the grid is empty (nothing to enqueue).
fn prepare<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    args: &Args,
    dtype: Dtype,
) -> Result<Option<LaunchInfo>, LaunchError> {
    kernel.check_fits(CubeLimits::of(client), args.head_dim, args.v_head_dim, dtype)?;
    let count = cube_count(kernel, args);
    check_grid(count, client.properties().hardware.max_cube_count)?;
    if count.0 == 0 || count.1 == 0 || count.2 == 0 {
        log::debug!("{}: empty grid, nothing launched", kernel.name());
        return Ok(None);
    }
    let plane_reduce = match kernel {
        PortableKernel::Fma(t)
        | PortableKernel::Int8(Int8Tiles { tiles: t, .. })
        | PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Fma(t), .. })
        | PortableKernel::Fp4(Fp4Tiles { tiles: t, .. })
        | PortableKernel::Half(HalfTiles { tiles: t, .. }) => plane_reduce_ok(client, t.tc),
        PortableKernel::Decode(d) => d.reduce_lanes().is_some_and(|tc| plane_reduce_ok(client, tc)),
        PortableKernel::Cmma(_)
        | PortableKernel::Mma(_)
        | PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Mma(_) | Fp8Tiling::Decode(_), .. }) => {
            true
        }
    };
    Ok(Some(LaunchInfo {
        kernel: kernel.kernel_name(dtype, args.head_dim as usize, args.v_head_dim as usize),
        cube_count: count,
        units_per_cube: kernel.units(),
        shared_memory_bytes: kernel.smem_bytes(args.head_dim, args.v_head_dim, dtype),
        plane_reduce,
        launched: false,
    }))
}

fn empty_info(kernel: &PortableKernel, args: &Args, dtype: Dtype) -> LaunchInfo {
    LaunchInfo {
        kernel: kernel.kernel_name(dtype, args.head_dim as usize, args.v_head_dim as usize),
        cube_count: cube_count(kernel, args),
        units_per_cube: kernel.units(),
        shared_memory_bytes: kernel.smem_bytes(args.head_dim, args.v_head_dim, dtype),
        plane_reduce: false,
        launched: false,
    }
}

fn fma_vec_config(tiles: &FmaVecTiles, args: &Args, lazy_rescale: bool, plane_reduce: bool) -> FmaVecConfig {
    FmaVecConfig {
        head_dim: args.head_dim as usize,
        v_head_dim: args.v_head_dim as usize,
        bq: tiles.bq as usize,
        bk: tiles.bk as usize,
        tr: tiles.tr as usize,
        tc: tiles.tc as usize,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale,
        plane_reduce,
    }
}

/// The INT8 kernel for `shape` with `v_dtype` V and O (f16 or f32): the vector FMA tiling
/// (`bq` a multiple of 16) that fits the runtime, whose blocking the prepass then follows
/// ([`Int8Tiles::quant`]).
pub fn select_int8<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    v_dtype: Dtype,
    granularity: Int8Granularity,
    smooth_k: bool,
) -> Result<PortableKernel, LaunchError> {
    let args = Args::new(shape)?;
    check_dtype_supported(client, v_dtype)?;
    if v_dtype == Dtype::Bf16 {
        return Err(LaunchError::UnsupportedDtype { dtype: v_dtype, runtime: "the INT8 kernel (f16 or f32 V)" });
    }
    vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    let kernels = fma_vec_candidates(args.head_dim.max(args.v_head_dim))
        .iter()
        .map(|&tiles| PortableKernel::Int8(Int8Tiles { tiles, granularity, smooth_k }));
    first_fitting(kernels, CubeLimits::of(client), args.head_dim, args.v_head_dim, v_dtype).map_err(|last| {
        LaunchError::FamilyUnavailable {
            family: Family::Fma,
            reason: format!("no INT8 tiling fits{}", last.map(|e| format!(": {e}")).unwrap_or_default()),
        }
    })
}

/// Attention on INT8 Q and K from [`crate::quantize_int8`] run with `kernel`'s
/// [`Int8Tiles::quant`] (the operands record theirs; a mismatch is refused), V in `v_dtype`
/// (f16 or f32), O in `v_dtype`, LSE f32 `[batch, q_heads, q_len]` when `shape.write_lse` (the
/// unsmoothed logits' LSE: the prepass's shift is added back). `shape.scale` is the softmax
/// scale the prepass folded into the Q scales.
#[allow(clippy::too_many_arguments)]
pub fn launch_int8<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    v_dtype: Dtype,
    ops: &Int8DeviceOperands,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let PortableKernel::Int8(int8) = *kernel else {
        return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "launch_int8 runs the INT8 kernel only".into() });
    };
    let args = Args::new(shape)?;
    let quant = int8.quant();
    if ops.quant != quant {
        return Err(LaunchError::InvalidProblem {
            reason: format!("the INT8 operands were quantized as {:?}, the kernel reads {quant:?}", ops.quant),
        });
    }
    check_quant_args(&args, &quant)?;
    check_dtype_supported(client, v_dtype)?;
    if v_dtype == Dtype::Bf16 {
        return Err(LaunchError::UnsupportedDtype { dtype: v_dtype, runtime: "the INT8 kernel (f16 or f32 V)" });
    }
    vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    // Q/K extents in bytes (the codes, 4 per word), V/O in elements of v_dtype.
    let extents = args.extents();
    let vbytes = v_dtype.size_bytes() as u64;
    check_extent("q codes", extents[0].1.max(W as u64), 1, &ops.q_codes)?;
    check_extent("k codes", extents[1].1.max(W as u64), 1, &ops.k_codes)?;
    check_extent("v", extents[2].1.max(W as u64), vbytes, v)?;
    check_extent("o", extents[3].1.max(W as u64), vbytes, o)?;
    let (q_scales_len, k_scales_len) = scales_len(&quant.blocking, &args, quant.granularity);
    check_extent("q scales", q_scales_len, 4, &ops.q_scales)?;
    check_extent("k scales", k_scales_len, 4, &ops.k_scales)?;
    check_lse(&args, lse)?;
    let shift_lse = quant.smooth_k && args.write_lse;
    if shift_lse {
        match &ops.lse_shift {
            Some(h) => check_extent("lse shift", args.lse_len(), 4, h)?,
            None => {
                return Err(LaunchError::InvalidProblem { reason: "K was smoothed but the operands hold no LSE shift".into() })
            }
        }
    }
    let Some(mut info) = prepare(client, kernel, &args, v_dtype)? else {
        return Ok(empty_info(kernel, &args, v_dtype));
    };
    let tiles = int8.tiles;
    let blocking = quant.blocking;
    let cfg = fma_vec_config(&tiles, &args, true, info.plane_reduce);
    let icfg = Int8Config { granularity: quant.granularity, warps: blocking.warps, shift_lse };
    log::debug!("launching {} {icfg:?} for {args:?}", info.kernel);

    // SAFETY (both): checked above to cover `max(elems, W)` elements and to hold `len` floats.
    let vectors = |handle: &Handle, elems: u64| unsafe { vector_arg(handle, elems) };
    let floats = |handle: &Handle, len: u64| unsafe { float_arg(handle, len) };
    let shift = match (&ops.lse_shift, shift_lse) {
        (Some(h), true) => floats(h, args.lse_len()),
        _ => floats(&client.empty(4), 1),
    };
    let (lse_handle, lse_len) = lse_binding(client, &args, lse);
    // Logits arrive in log2 units: the softmax's exp((s - m)·scale) with scale = ln 2 is
    // 2^(s - m), and its LSE m·ln 2 + ln l.
    let shape_arg = shape_arg::<R>(&Args { scale: core::f32::consts::LN_2, ..args });
    let q_blocks = args.q_len.div_ceil(tiles.bq);
    let k_blocks = args.kv_len.div_ceil(tiles.bk);
    let scale_shape = Int8ShapeLaunch::new(args.kv_heads, q_blocks, k_blocks);
    let count = info.cube_count;
    let count = CubeCount::Static(count.0, count.1, count.2);
    let dim = CubeDim::new_1d(tiles.units());
    macro_rules! go {
        ($e:ty, $s:ty) => {
            // SAFETY: every global index is guarded by q_len/kv_len, and the buffers were
            // checked to cover the strided extents and the scale layouts.
            unsafe {
                fwd_portable_fma_vec_int8::launch_unchecked::<$e, $s, R>(
                    client,
                    count,
                    dim,
                    W,
                    vectors(&ops.q_codes, extents[0].1),
                    vectors(&ops.k_codes, extents[1].1),
                    floats(&ops.q_scales, q_scales_len),
                    floats(&ops.k_scales, k_scales_len),
                    shift,
                    vectors(v, extents[2].1),
                    vectors(o, extents[3].1),
                    ArrayArg::from_raw_parts(lse_handle, lse_len as usize),
                    shape_arg,
                    scale_shape,
                    cfg,
                    icfg,
                )
            }
        };
    }
    match (v_dtype, tiles.stage_f32) {
        (Dtype::F32, _) => go!(f32, f32),
        (Dtype::F16, true) => go!(f16, f32),
        (Dtype::F16, false) => go!(f16, f16),
        (Dtype::Bf16, _) => unreachable!("refused above"),
    }
    info.launched = true;
    Ok(info)
}

/// `handle` bound as `ceil(elems / W)` vectors (or words of 4 codes), at least one.
///
/// # Safety
/// The handle must hold `max(elems, W)` elements (bytes for codes), rounded up to whole vectors
/// (`check_extent`; row starts and head dims are multiples of W, so every vector the kernels
/// read lies inside a row).
unsafe fn vector_arg<R: Runtime>(handle: &Handle, elems: u64) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(W).max(1)) }
}

/// `handle` bound as `max(len, 1)` f32.
///
/// # Safety
/// The handle must hold `len` floats, and one at least where the kernel reads one.
unsafe fn float_arg<R: Runtime>(handle: &Handle, len: u64) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(handle.clone(), (len as usize).max(1)) }
}

/// The dtypes the FP8 kernel needs on this runtime: O's type, and f16 (P is rounded to f16 and
/// the stages may be f16).
fn check_fp8_dtypes<R: Runtime>(client: &ComputeClient<R>, o_dtype: Dtype) -> Result<(), LaunchError> {
    check_dtype_supported(client, o_dtype)?;
    check_dtype_supported(client, Dtype::F16)
}

/// The FP8 kernel for `shape` with `format` codes, `granularity` descales and `o_dtype` O (f32,
/// f16, or bf16 where the runtime has it), through the same fit check as every kernel: the
/// manual-MMA one ([`Fp8Tiling::Mma`], the first entry of [`mma_fp8_candidates`] that fits,
/// the smallest query tiles first when `q_len` fits them) where
/// the f16 mma kernel runs (the capability check of [`Family::Mma`]) and the head dims and
/// strides are multiples of 8 ([`fp8_mma_layout_ok`]), else the first vector FMA tiling that
/// fits. With `DescaleGranularity::PerBlock` the caller computes the descales over
/// [`Fp8Tiles::descale_blocks`] of the result. Needs f16 on the runtime
/// ([`LaunchError::UnsupportedDtype`] otherwise), and head dims and strides that are multiples
/// of 4 ([`LaunchError::UnalignedLayout`]).
pub fn select_fp8<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    o_dtype: Dtype,
    format: Fp8Format,
    granularity: DescaleGranularity,
) -> Result<PortableKernel, LaunchError> {
    let args = Args::new(shape)?;
    check_fp8_dtypes(client, o_dtype)?;
    vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    let limits = CubeLimits::of(client);
    let dmax = args.head_dim.max(args.v_head_dim);
    let fp8 = |tiles| PortableKernel::Fp8(Fp8Tiles { tiles, format, granularity });
    let fcfg = Fp8Config { format, granularity };
    match crate::decode::select_fp8_decode(client, &args, shape, fcfg) {
        Ok(d) => match first_fitting([fp8(Fp8Tiling::Decode(d))].into_iter(), limits, args.head_dim, args.v_head_dim, o_dtype) {
            Ok(kernel) => return Ok(kernel),
            Err(last) => log::debug!("FP8 row decode kernel not chosen: {last:?}"),
        },
        Err(why) => log::debug!("FP8 row decode kernel not chosen: {why}"),
    }
    let mma_why = mma_unavailable(client, Dtype::F16).or_else(|| fp8_mma_layout_ok(&args).err());
    match mma_why {
        None => {
            let kernels = fp8_mma_order(mma_fp8_candidates(dmax), args.q_len)
                .into_iter()
                .map(|t| fp8(Fp8Tiling::Mma(t)));
            match first_fitting(kernels, limits, args.head_dim, args.v_head_dim, o_dtype) {
                Ok(kernel) => return Ok(kernel),
                Err(last) => log::debug!("FP8 mma kernel not chosen: no tiling fits ({last:?})"),
            }
        }
        Some(why) => log::debug!("FP8 mma kernel not chosen: {why}"),
    }
    let kernels = fma_vec_candidates(dmax).iter().map(|&t| fp8(Fp8Tiling::Fma(t)));
    first_fitting(kernels, limits, args.head_dim, args.v_head_dim, o_dtype).map_err(|last| {
        LaunchError::FamilyUnavailable {
            family: Family::Fma,
            reason: format!("no FP8 tiling fits{}", last.map(|e| format!(": {e}")).unwrap_or_default()),
        }
    })
}

/// The FP8 mma table in the order to try for `q_len` query rows: as listed, except that when
/// every query row fits the smallest query tile of the table (decode-like shapes), the tilings
/// with that smallest tile come first. Rows past `q_len` are computed and thrown away, so a
/// larger tile adds only idle planes; the smaller cube does the same useful work with fewer
/// units and registers (d 128: 4 x 1 at bk 64 is 128 units of ~230 registers, two cubes per
/// SM where 8 x 1 allows one).
fn fp8_mma_order(table: &[MmaTiles], q_len: u32) -> Vec<MmaTiles> {
    let mut order = table.to_vec();
    if let Some(smallest) = table.iter().map(MmaTiles::bq).min() {
        if q_len <= smallest {
            // Stable: the table's order among equal tiles.
            order.sort_by_key(|t| t.bq() != smallest);
        }
    }
    order
}

/// Whether the FP8 mma kernel can read the codes: it loads 8 codes (8 bytes) at a time, so the
/// head dims and every (batch, head, seq) stride must be multiples of 8.
fn fp8_mma_layout_ok(args: &Args) -> Result<(), String> {
    let mut all = vec![args.head_dim, args.v_head_dim];
    all.extend(args.q_strides);
    all.extend(args.k_strides);
    all.extend(args.v_strides);
    if all.iter().any(|&x| !(x as usize).is_multiple_of(FP8_VEC)) {
        return Err(format!("the FP8 mma kernel reads {FP8_VEC} codes at a time: head dims and Q/K/V strides must be multiples of {FP8_VEC}"));
    }
    Ok(())
}

/// Attention on FP8 Q, K, V with `kernel` (from [`select_fp8`]): `O = softmax(scale · Q·Kᵀ) · V`
/// on the values `decode(code) · descale`, O in `o_dtype`, LSE f32 `[batch, q_heads, q_len]`
/// when `shape.write_lse`.
///
/// - `q`, `k`, `v`: the codes (one byte each, the kernel's format), laid out by the shape's
///   strides in elements = bytes, head-dim stride 1. Head dims and strides must be multiples of
///   4 (the kernel reads words of 4 codes), and each buffer must hold the strided extent in
///   bytes, at least 4: a caller allocating a ragged size pads it to a multiple of 4.
/// - `q_descale`, `k_descale`, `v_descale`: f32, `DescaleGranularity::count` entries each:
///   Q over `(batch, q_heads, q_len)` with blocks of `bq`, K and V over `(batch, kv_heads,
///   kv_len)` with blocks of `bk` ([`Fp8Tiles::descale_blocks`]). Their values are not checked
///   (that needs a read): a non-finite or non-positive descale gives non-finite or wrong rows,
///   never a fault.
///
/// The mma variant ([`Fp8Tiling::Mma`]) also needs the f16 mma kernel's runtime
/// ([`LaunchError::FamilyUnavailable`]) and head dims and Q/K/V strides that are multiples of 8
/// ([`LaunchError::UnalignedLayout`]).
///
/// Codes that are not finite (NaN; e5m2 inf) make every row that sees them NaN (O and LSE);
/// see `kernel/fma_vec_fp8.rs`. Everything is checked before anything is enqueued.
#[allow(clippy::too_many_arguments)]
pub fn launch_fp8<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    o_dtype: Dtype,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    q_descale: &Handle,
    k_descale: &Handle,
    v_descale: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let PortableKernel::Fp8(fp8) = *kernel else {
        return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "launch_fp8 runs the FP8 kernel only".into() });
    };
    let args = Args::new(shape)?;
    check_fp8_dtypes(client, o_dtype)?;
    vector_layout_ok(shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    if let Fp8Tiling::Mma(_) = fp8.tiles {
        if let Some(reason) = mma_unavailable(client, Dtype::F16) {
            return Err(LaunchError::FamilyUnavailable { family: Family::Mma, reason });
        }
        fp8_mma_layout_ok(&args).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    }
    // Codes in bytes (4 per word), O in elements of o_dtype.
    let extents = args.extents();
    let min = W as u64;
    check_extent("q codes", extents[0].1.max(min), 1, q)?;
    check_extent("k codes", extents[1].1.max(min), 1, k)?;
    check_extent("v codes", extents[2].1.max(min), 1, v)?;
    check_extent("o", extents[3].1.max(min), o_dtype.size_bytes() as u64, o)?;
    let (q_descales, kv_descales) = fp8.descale_counts(&args);
    check_extent("q descales", q_descales, 4, q_descale)?;
    check_extent("k descales", kv_descales, 4, k_descale)?;
    check_extent("v descales", kv_descales, 4, v_descale)?;
    check_lse(&args, lse)?;
    if let Fp8Tiling::Decode(t) = fp8.tiles {
        let fcfg = Fp8Config { format: fp8.format, granularity: fp8.granularity };
        let (q_blocks, k_blocks) = (args.q_len.div_ceil(crate::kernel::decode_rows::ROW_FP8_Q_BLOCK as u32), args.kv_len.div_ceil(t.bk()));
        // SAFETY: checked above to cover `max(elems, W)` codes and to hold the descale counts;
        // an empty descale tensor (no keys: never read) is bound as a 1-float scratch.
        let floats = |handle: &Handle, len: u64| match len {
            0 => unsafe { float_arg(&client.empty(4), 1) },
            _ => unsafe { float_arg(handle, len) },
        };
        let inputs = crate::decode::Fp8RowInputs {
            words: [q, k, v].map(|h| h.clone()),
            extents: [extents[0].1, extents[1].1, extents[2].1],
            descales: [floats(q_descale, q_descales), floats(k_descale, kv_descales), floats(v_descale, kv_descales)],
            fp8_shape: Fp8ShapeLaunch::new(args.kv_heads, q_blocks, k_blocks, f32::NAN),
            fcfg,
        };
        let lse = lse_binding(client, &args, lse);
        return crate::decode::launch_fp8_rows(client, kernel, &t, &args, o_dtype, inputs, (o, extents[3].1), lse);
    }
    let Some(mut info) = prepare(client, kernel, &args, o_dtype)? else {
        return Ok(empty_info(kernel, &args, o_dtype));
    };
    let fcfg = Fp8Config { format: fp8.format, granularity: fp8.granularity };
    log::debug!("launching {} {fcfg:?} for {args:?}", info.kernel);

    // SAFETY (both): checked above to cover `max(elems, W)` elements (bytes for the codes) and
    // to hold `len` floats. A descale tensor of no entries (PerBlock without keys, never read)
    // is bound as a 1-float scratch: the caller's buffer may be empty.
    let vectors = |handle: &Handle, elems: u64| unsafe { vector_arg(handle, elems) };
    let floats = |handle: &Handle, len: u64| match len {
        0 => unsafe { float_arg(&client.empty(4), 1) },
        _ => unsafe { float_arg(handle, len) },
    };
    let (lse_handle, lse_len) = lse_binding(client, &args, lse);
    let fp8_shape = Fp8ShapeLaunch::new(
        args.kv_heads,
        args.q_len.div_ceil(fp8.tiles.bq()),
        args.kv_len.div_ceil(fp8.tiles.bk()),
        f32::NAN,
    );
    let count = info.cube_count;
    let count = CubeCount::Static(count.0, count.1, count.2);
    let dim = CubeDim::new_1d(fp8.tiles.units());
    let tiles = match fp8.tiles {
        Fp8Tiling::Fma(tiles) => tiles,
        Fp8Tiling::Decode(_) => unreachable!("launched above"),
        Fp8Tiling::Mma(t) => {
            let cfg = MmaFwdConfig {
                head_dim: args.head_dim as usize,
                v_head_dim: args.v_head_dim as usize,
                warps: t.warps as usize,
                mt: t.mt as usize,
                bk: t.bk as usize,
                vec: FP8_VEC,
                causal: args.causal,
                write_lse: args.write_lse,
                lazy_rescale: true,
            };
            // SAFETY: checked above to cover the strided extents (at least 4 bytes); every row
            // start and head dim is a multiple of 8 (`fp8_mma_layout_ok`), so every 8-code
            // vector the kernel reads lies inside a row of the extent. O is bound by element.
            let codes = |handle: &Handle, elems: u64| unsafe {
                ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(FP8_VEC).max(1))
            };
            let words = FP8_VEC / 4;
            let cvt = crate::decode::fp8_conversion(client, fcfg);
            macro_rules! go_mma {
                ($e:ty) => {
                    // SAFETY: every global index is guarded by q_len/kv_len, and the buffers were
                    // checked to cover the strided extents and the descale layouts.
                    unsafe {
                        fwd_mma_fp8::launch_unchecked::<$e, R>(
                            client,
                            count,
                            dim,
                            words,
                            codes(q, extents[0].1),
                            codes(k, extents[1].1),
                            codes(v, extents[2].1),
                            floats(q_descale, q_descales),
                            floats(k_descale, kv_descales),
                            floats(v_descale, kv_descales),
                            ArrayArg::from_raw_parts(o.clone(), (extents[3].1 as usize).max(1)),
                            ArrayArg::from_raw_parts(lse_handle, lse_len as usize),
                            shape_arg::<R>(&args),
                            fp8_shape,
                            cfg,
                            fcfg,
                            cvt,
                        )
                    }
                };
            }
            match o_dtype {
                Dtype::F32 => go_mma!(f32),
                Dtype::F16 => go_mma!(f16),
                Dtype::Bf16 => go_mma!(bf16),
            }
            info.launched = true;
            return Ok(info);
        }
    };
    let cfg = fma_vec_config(&tiles, &args, true, info.plane_reduce);
    macro_rules! go {
        ($e:ty, $s:ty) => {
            // SAFETY: every global index is guarded by q_len/kv_len, and the buffers were
            // checked to cover the strided extents and the descale layouts.
            unsafe {
                fwd_portable_fma_vec_fp8::launch_unchecked::<$e, $s, R>(
                    client,
                    count,
                    dim,
                    W,
                    vectors(q, extents[0].1),
                    vectors(k, extents[1].1),
                    vectors(v, extents[2].1),
                    floats(q_descale, q_descales),
                    floats(k_descale, kv_descales),
                    floats(v_descale, kv_descales),
                    vectors(o, extents[3].1),
                    ArrayArg::from_raw_parts(lse_handle, lse_len as usize),
                    shape_arg::<R>(&args),
                    fp8_shape,
                    cfg,
                    fcfg,
                )
            }
        };
    }
    match (o_dtype, tiles.stage_f32) {
        (Dtype::F32, true) => go!(f32, f32),
        (Dtype::F32, false) => go!(f32, f16),
        (Dtype::F16, true) => go!(f16, f32),
        (Dtype::F16, false) => go!(f16, f16),
        (Dtype::Bf16, true) => go!(bf16, f32),
        (Dtype::Bf16, false) => go!(bf16, f16),
    }
    info.launched = true;
    Ok(info)
}

/// Row reductions use plane shuffles when the runtime has them and the `tc` units of a row fit
/// in every plane.
pub(crate) fn plane_reduce_ok<R: Runtime>(client: &ComputeClient<R>, tc: u32) -> bool {
    client.features().plane.contains(Plane::Ops) && client.properties().hardware.plane_size_min >= tc
}

pub(crate) fn check_lse(args: &Args, lse: Option<&Handle>) -> Result<(), LaunchError> {
    match (args.write_lse, lse) {
        (true, Some(handle)) => check_extent("lse", args.lse_len(), 4, handle),
        (true, None) => Err(LaunchError::InvalidProblem { reason: "write_lse is set but no lse buffer was given".into() }),
        (false, Some(_)) => Err(LaunchError::InvalidProblem { reason: "an lse buffer was given but write_lse is not set".into() }),
        (false, None) => Ok(()),
    }
}

/// Whether `handle` holds `elems` elements of `elem_bytes`, all within 32-bit indexing.
pub(crate) fn check_extent(tensor: &'static str, elems: u64, elem_bytes: u64, handle: &Handle) -> Result<(), LaunchError> {
    if elems > u32::MAX as u64 {
        return Err(LaunchError::IndexOverflow { tensor, elems });
    }
    let available_bytes = handle.size_in_used();
    let required_bytes = elems * elem_bytes;
    if required_bytes > available_bytes {
        return Err(LaunchError::BufferTooSmall { tensor, required_bytes, available_bytes });
    }
    Ok(())
}

/// The LSE binding: the caller's buffer, or (the kernels always bind one) a 1-element scratch.
pub(crate) fn lse_binding<R: Runtime>(client: &ComputeClient<R>, args: &Args, lse: Option<&Handle>) -> (Handle, u64) {
    let handle = match lse {
        Some(handle) => handle.clone(),
        None => client.empty(4),
    };
    (handle, if args.write_lse { args.lse_len() } else { 1 })
}

pub(crate) fn shape_arg<R: Runtime>(args: &Args) -> AttnShapeLaunch<R> {
    let [q0, q1, q2] = args.q_strides;
    let [k0, k1, k2] = args.k_strides;
    let [v0, v1, v2] = args.v_strides;
    let [o0, o1, o2] = args.o_strides;
    AttnShapeLaunch::new(
        args.q_len,
        args.kv_len,
        args.group_size(),
        args.q_heads,
        q0,
        q1,
        q2,
        k0,
        k1,
        k2,
        v0,
        v1,
        v2,
        o0,
        o1,
        o2,
        args.scale,
        f32::NEG_INFINITY,
    )
}

/// Checks the grid against the runtime limit.
pub(crate) fn check_grid(cube_count: (u32, u32, u32), max: (u32, u32, u32)) -> Result<(), LaunchError> {
    if cube_count.0 > max.0 || cube_count.1 > max.1 || cube_count.2 > max.2 {
        return Err(LaunchError::TooManyCubes { x: cube_count.0, y: cube_count.1, z: cube_count.2, max });
    }
    Ok(())
}

/// Widest global load (in elements, up to 16 bytes) that every row start of Q, K and V is
/// aligned to: the head dims and all (batch, head, seq) strides must be multiples of it.
fn load_vector_width(args: &Args, dtype: Dtype) -> usize {
    let max = 16 / dtype.size_bytes() as u32;
    let mut all = vec![args.head_dim, args.v_head_dim];
    all.extend(args.q_strides);
    all.extend(args.k_strides);
    all.extend(args.v_strides);
    let mut width = max;
    while width > 1 && all.iter().any(|&x| x % width != 0) {
        width /= 2;
    }
    width as usize
}

#[cfg(test)]
mod fp8_order_tests {
    use super::*;

    #[test]
    fn decode_shapes_take_the_smallest_query_tile_first() {
        let table = mma_fp8_candidates(128);
        let bqs = |q_len| fp8_mma_order(table, q_len).iter().map(MmaTiles::bq).collect::<Vec<_>>();
        assert_eq!(bqs(4096), table.iter().map(MmaTiles::bq).collect::<Vec<_>>());
        assert_eq!(bqs(1), vec![64, 128]);
        assert_eq!(bqs(64), vec![64, 128]);
        assert_eq!(bqs(65), vec![128, 64]);
        // The same entries either way.
        let mut sorted = fp8_mma_order(table, 1);
        sorted.sort_by_key(|t| (t.warps, t.mt, t.bk));
        let mut listed = table.to_vec();
        listed.sort_by_key(|t| (t.warps, t.mt, t.bk));
        assert_eq!(sorted, listed);
    }
}

/// The 4-bit kernel for `shape`: Q and K in `format`, V as `v`, O in f32. The first vector FMA
/// tiling that fits the runtime (always staged in f32). The head dim must be a multiple of the
/// format's block (16 or 32) and V's of 4; any strides of O (Q, K and V arrive in the dense
/// layouts of [`Fp4Operands`]).
pub fn select_fp4<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    format: Fp4Format,
    v: Fp4V,
) -> Result<PortableKernel, LaunchError> {
    let args = Args::new(shape)?;
    check_fp4_args(&args, format)?;
    let kernels = fma_vec_candidates(args.head_dim.max(args.v_head_dim))
        .iter()
        .map(|&tiles| PortableKernel::Fp4(Fp4Tiles { tiles, format, v, decode: None }));
    let mut kernel = first_fitting(kernels, CubeLimits::of(client), args.head_dim, args.v_head_dim, Dtype::F32).map_err(|last| {
        LaunchError::FamilyUnavailable {
            family: Family::Fma,
            reason: format!("no 4-bit tiling fits{}", last.map(|e| format!(": {e}")).unwrap_or_default()),
        }
    })?;
    // Decode shapes of NVFP4 Q, K and V take the 4-bit MMA decode kernel where it runs.
    if let PortableKernel::Fp4(f) = &mut kernel {
        f.decode = crate::decode::select_fp4_decode(client, &args, shape, format, v);
        if let Some(d) = f.decode {
            let decode = PortableKernel::Fp4(*f);
            if let Err(e) = decode.check_fits(CubeLimits::of(client), args.head_dim, args.v_head_dim, Dtype::F32) {
                log::debug!("4-bit MMA decode kernel {d} does not fit: {e}");
                f.decode = None;
            }
        }
    }
    Ok(kernel)
}

/// Shape rules of the 4-bit kernel beyond [`Args::new`]: whole scale blocks along the head
/// dim, whole 4-wide vectors along V's and O's rows.
fn check_fp4_args(args: &Args, format: Fp4Format) -> Result<(), LaunchError> {
    let block = format.block() as u32;
    if !args.head_dim.is_multiple_of(block) {
        return Err(LaunchError::InvalidProblem {
            reason: format!("{format:?} scales blocks of {block} along the head dim: head_dim {} is not a multiple", args.head_dim),
        });
    }
    let mut all = vec![args.v_head_dim];
    all.extend(args.o_strides);
    if all.iter().any(|x| x % W as u32 != 0) {
        return Err(LaunchError::UnalignedLayout {
            reason: format!("v_head_dim ({}) and O's strides ({:?}) must be multiples of {W}", args.v_head_dim, args.o_strides),
        });
    }
    Ok(())
}

/// Bytes of each 4-bit operand for this shape: `[q, q_scales, k, k_scales, v, v_scales]`
/// (`v_scales` 0 for bf16 V).
pub fn fp4_operand_bytes(shape: &AttentionShape, format: Fp4Format, v: Fp4V) -> Result<[u64; 6], LaunchError> {
    let args = Args::new(shape)?;
    check_fp4_args(&args, format)?;
    let (d, dv) = (args.head_dim as u64, args.v_head_dim as u64);
    let block = format.block() as u64;
    let q_rows = args.batch as u64 * args.q_heads as u64 * args.q_len as u64;
    let kv_rows = args.batch as u64 * args.kv_heads as u64 * args.kv_len as u64;
    let (v_bytes, v_scale_bytes) = match v {
        Fp4V::Bf16 => (kv_rows * dv * 2, 0),
        Fp4V::Nvfp4 | Fp4V::Nvfp4P16 => {
            let cols = (args.kv_len as u64).div_ceil(P_BLOCK as u64) * P_BLOCK as u64;
            let rows = args.batch as u64 * args.kv_heads as u64 * dv;
            (rows * cols / 2, rows * cols / P_BLOCK as u64)
        }
    };
    Ok([q_rows * d / 2, q_rows * d / block, kv_rows * d / 2, kv_rows * d / block, v_bytes, v_scale_bytes])
}

/// Attention on 4-bit Q and K (and V, with [`Fp4V::Nvfp4`] or [`Fp4V::Nvfp4P16`]), decoded as
/// they are staged:
/// `O = softmax(scale · Q·Kᵀ) · V` in f32 (O's strides from `shape`, 4 bytes per element), LSE
/// f32 `[batch, q_heads, q_len]` when `shape.write_lse`. `kernel` from [`select_fp4`]. Every
/// operand is checked to cover its layout before anything is enqueued; code and scale values
/// are not checked (that needs a read): scale code 0x7F (UE4M3 NaN) or 0xFF (E8M0 NaN) decode
/// to finite garbage, not NaN.
pub fn launch_fp4<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    ops: Fp4Operands<'_>,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let PortableKernel::Fp4(fp4) = *kernel else {
        return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "launch_fp4 runs the 4-bit kernel only".into() });
    };
    let args = Args::new(shape)?;
    let bytes = fp4_operand_bytes(shape, fp4.format, fp4.v)?;
    let names = ["q codes", "q scales", "k codes", "k scales", "v", "v scales"];
    let handles = [ops.q, ops.q_scales, ops.k, ops.k_scales, ops.v, ops.v_scales];
    // Bound as whole words, at least one.
    let words = |b: u64| b.div_ceil(4).max(1);
    for ((name, b), h) in names.into_iter().zip(bytes).zip(handles) {
        check_extent(name, words(b) * 4, 1, h)?;
    }
    for h in ops.tensor_scales {
        check_extent("tensor scale", 1, 4, h)?;
    }
    if let Some(h) = ops.lse_shift {
        check_extent("lse shift", args.lse_len(), 4, h)?;
    }
    let shift_lse = ops.lse_shift.is_some() && args.write_lse;
    let extents = args.extents();
    check_extent("o", extents[3].1.max(W as u64), 4, o)?;
    check_lse(&args, lse)?;
    if let Some(t) = fp4.decode {
        let lse_bound = lse_binding(client, &args, lse);
        return crate::decode::launch_fp4_mma(client, kernel, &t, &args, &ops, bytes, shift_lse, (o, extents[3].1), lse_bound);
    }
    let Some(mut info) = prepare(client, kernel, &args, Dtype::F32)? else {
        return Ok(empty_info(kernel, &args, Dtype::F32));
    };
    // The running max always moves: see `fma_vec_fp4`.
    let cfg = fma_vec_config(&fp4.tiles, &args, false, info.plane_reduce);
    let fcfg = Fp4Config { mx: fp4.format == Fp4Format::Mxfp4, v4: fp4.v.is_4bit(), p16: fp4.v == Fp4V::Nvfp4P16, shift_lse };
    let shift = match ops.lse_shift {
        // SAFETY: checked above to hold `lse_len` floats.
        Some(h) if shift_lse => unsafe { float_arg(h, args.lse_len()) },
        // SAFETY: a 4-byte scratch, never read (shift_lse is off).
        _ => unsafe { float_arg(&client.empty(4), 1) },
    };
    let v_words = match fp4.v {
        Fp4V::Bf16 => 0,
        Fp4V::Nvfp4 | Fp4V::Nvfp4P16 => args.kv_len.div_ceil(P_BLOCK as u32) * (P_BLOCK / 8) as u32,
    };
    log::debug!("launching {} {fcfg:?} for {args:?}", info.kernel);
    // SAFETY: each handle was checked to hold `words(bytes)` words; the kernel reads whole words
    // inside the layouts of `Fp4Operands`, guarded by q_len / kv_len.
    let word_arg = |h: &Handle, b: u64| unsafe { ArrayArg::from_raw_parts(h.clone(), words(b) as usize) };
    let (lse_handle, lse_len) = lse_binding(client, &args, lse);
    // Q, K and V are read in dense rows; the AttnShape carries O's strides (and the rest).
    let shape_arg = shape_arg::<R>(&args);
    let fshape = Fp4ShapeLaunch::new(args.kv_heads, v_words);
    let count = info.cube_count;
    // SAFETY: as above; O was checked to cover its strided extent (as 4-wide f32 vectors, row
    // starts multiples of 4), the LSE its `lse_len` floats.
    unsafe {
        fwd_portable_fma_vec_fp4::launch_unchecked::<R>(
            client,
            CubeCount::Static(count.0, count.1, count.2),
            CubeDim::new_1d(fp4.tiles.units()),
            W,
            word_arg(ops.q, bytes[0]),
            word_arg(ops.q_scales, bytes[1]),
            word_arg(ops.k, bytes[2]),
            word_arg(ops.k_scales, bytes[3]),
            word_arg(ops.v, bytes[4]),
            word_arg(ops.v_scales, bytes[5]),
            ArrayArg::from_raw_parts(ops.tensor_scales[0].clone(), 1),
            ArrayArg::from_raw_parts(ops.tensor_scales[1].clone(), 1),
            ArrayArg::from_raw_parts(ops.tensor_scales[2].clone(), 1),
            shift,
            vector_arg(o, extents[3].1),
            ArrayArg::from_raw_parts(lse_handle, lse_len as usize),
            shape_arg,
            fshape,
            cfg,
            fcfg,
        )
    };
    info.launched = true;
    Ok(info)
}
