//! The INT8 wgmma forward family (`cuda/fwd_wgmma_int8.cu`): SageAttention-style attention with
//! Q·Kᵀ on Hopper's s8 warpgroup MMA (`wgmma.mma_async ... m64nNk32.s32.s8.s8`, SASS `IGMMA`,
//! twice the f16 wgmma rate), f32 online softmax in log2 units, and P·V in registers on a second
//! warpgroup MMA ([`Int8WgmmaPv`]): f16 P and f16 V on the f16 wgmma (`HGMMA`), or e4m3 P and
//! e4m3 V with per-channel V scales on the e4m3 wgmma (`QGMMA`, SageAttention2), which runs at
//! the s8 rate. sm_90a only. The f16 P·V variants are checked and timed on an H100 by
//! `examples/int8_check.rs` and `quattn selftest`.
//!
//! The e4m3 P·V variants read V as Vᵀ codes written by the quantization prepass
//! ([`crate::Int8PrepassConfig`] with `v_fp8`): `[b, kv_heads, d, kv_pad]` e4m3 codes,
//! `kv_pad` = kv_len rounded up to [`INT8_FP8_KV_PAD`], keys permuted inside every group of 32
//! (the kernel header derives the permutation), and `v_scale [b, kv_heads, d]` f32.
//!
//! Warp specialized: a TMA producer warpgroup feeds two ping-ponging consumer warpgroups through
//! mbarrier-guarded K/V stages (2 by default, [`Int8WgmmaConfig::stages`]), the tensor maps built
//! per launch from the strides ([`Int8WgmmaConfig::tma_specs`]).
//!
//! Host contract: exactly the IMMA family's ([`crate::int8`]): [`Int8Args`], [`Int8Ptrs`],
//! [`Int8Buffers`](crate::Int8Buffers), the `Int8FwdParams` ABI ([`Int8Params`], same field
//! layout), the scale layouts of `quattn::codec::int8::Int8ScaleLayout` for
//! [`Int8WgmmaConfig::blocking`], LSE shift, f32 P·V only.
//!
//! Tile: 2 consumer warpgroups x 64 query rows (block_q = 128), 128 keys per KV tile (block_k
//! = 128 = keys per K scale), 256 consumer threads plus a 128-thread producer;
//! consumer warp `W = tid / 32` (counted from the first consumer) owns rows `16W .. 16W + 15`,
//! lane quad `g` rows `16W + g` and `16W + g + 8` (the wgmma accumulator layout). The scale
//! layout is therefore `(block_q, block_k, warps) = (128, 128, 8)` in every granularity:
//! per warp = 16 rows per warp; per thread = 8 layout warps of 16 rows, 8 row groups each,
//! exactly the codec's per-thread model (`block_q / warps == 16`). The IMMA family's
//! [`Int8Config`] with the forced tile 8 warps x 16 rows x 128 keys has the same blocking; it is
//! kept as this family's [`Int8WgmmaConfig::scale_twin`] so that argument and length checks are
//! literally the IMMA family's.

use crate::arch::Arch;
use crate::cache::{CompileRequest, FWD_WGMMA_INT8};
use crate::error::{NativeError, Result};
use crate::int8::{Int8Args, Int8Config, Int8LaunchShape, Int8Params, Int8Ptrs, Int8Tile};
use crate::tma::{RowsTensor, TmaSpec, WS_CONSUMER_REGS, WS_PRODUCER_REGS};
use quattn_core::{Int8Blocking, Int8Granularity, PvAccum, Strides};

const KERNEL: &str = "fwd_wgmma_int8";

/// Query rows per CTA (2 warpgroups x 64).
pub const WGMMA_INT8_BLOCK_Q: u32 = 128;
/// Keys per KV tile and per K scale.
pub const WGMMA_INT8_BLOCK_K: u32 = 128;
/// Warps per CTA, also the warps of the Q scale layout.
pub const WGMMA_INT8_WARPS: u32 = 8;

/// Kernel parameter block: `Int8FwdParams`, the IMMA family's layout.
pub type Int8WgmmaParams = Int8Params;

/// Vᵀ rows of the e4m3 P·V variants are padded to a multiple of this many keys (zeros past
/// kv_len; a 192-key tile reads past the padding as TMA zeros).
pub const INT8_FP8_KV_PAD: usize = 128;

/// The P·V half of a variant. Both accumulate in f32 registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Int8WgmmaPv {
    /// f16 P and f16 V on the f16 wgmma; 128-key tiles and K scales.
    F16,
    /// e4m3 P (`e4m3(448 p)`, p relative to the running max) and e4m3 V (one scale per channel)
    /// on the e4m3 wgmma.
    E4m3 {
        /// Keys per KV tile: 128 or 192.
        block_n: u32,
        /// Keys per K scale: 64 or 128, dividing `block_n`.
        k_block: u32,
        /// Two-level accumulation: the wgmma accumulator is added into f32 sums every `flush`
        /// KV tiles (0: one level, the accumulator holds the whole sum).
        flush: u32,
    },
}

/// One compiled variant: head dim, Q scale granularity, K/V stages of the TMA pipeline and the
/// P·V format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8WgmmaConfig {
    pub head_dim: u32,
    pub granularity: Int8Granularity,
    /// K/V stages of the producer's ring (2 to 4).
    pub stages: u32,
    pub pv: Int8WgmmaPv,
}

/// `(head dim, keys per tile, keys per K scale, stages)` of the e4m3 P·V variants that
/// [`Int8WgmmaConfig::new_fp8`] picks. Not measured on this family yet: the FP8 wgmma family's
/// table (`crate::wgmma_fp8::FP8_TILES`, the same pipeline with e4m3 Q·Kᵀ) found 192-key tiles
/// with 2 stages the fastest at both head dims; 192 keys take three 64-key K scales.
pub const INT8_FP8_TILES: [(u32, u32, u32, u32); 2] = [(64, 192, 64, 2), (128, 192, 64, 2)];

/// KV tiles per flush of the two-level P·V accumulation that [`Int8WgmmaConfig::new_fp8`]
/// picks: the e4m3 wgmma accumulates with a ~13-bit significand (SageAttention2 measured it),
/// so a flush every 4 tiles (at most 24 k-steps in the short accumulator) bounds its rounding
/// at about 24 * 2^-13 = 0.3% of the flushed part, and costs a shared-memory read-modify-write
/// of the accumulator every 4 tiles.
pub const INT8_FP8_FLUSH: u32 = 4;


impl Int8WgmmaConfig {
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];
    /// wgmma exists only on the `a` target of compute capability 9.0.
    pub const TARGETS: &'static [Arch] = &[Arch::Sm90a];

    /// The K/V stages `new` picks.
    pub const DEFAULT_STAGES: u32 = 2;

    /// Validated f16 P·V constructor with [`Self::DEFAULT_STAGES`].
    pub fn new(head_dim: usize, granularity: Int8Granularity) -> Result<Self> {
        Self::with_stages(head_dim, granularity, Self::DEFAULT_STAGES)
    }

    /// Validated f16 P·V constructor with an explicit stage count.
    pub fn with_stages(head_dim: usize, granularity: Int8Granularity, stages: u32) -> Result<Self> {
        let cfg = Int8WgmmaConfig { head_dim: head_dim as u32, granularity, stages, pv: Int8WgmmaPv::F16 };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The e4m3 P·V variant of [`INT8_FP8_TILES`] with [`INT8_FP8_FLUSH`].
    pub fn new_fp8(head_dim: usize, granularity: Int8Granularity) -> Result<Self> {
        let Some(&(_, block_n, k_block, stages)) = INT8_FP8_TILES.iter().find(|t| t.0 as usize == head_dim) else {
            return Err(NativeError::UnsupportedHeadDim { kernel: KERNEL, head_dim, supported: Self::HEAD_DIMS });
        };
        let cfg = Int8WgmmaConfig {
            head_dim: head_dim as u32,
            granularity,
            stages,
            pv: Int8WgmmaPv::E4m3 { block_n, k_block, flush: INT8_FP8_FLUSH },
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Keys per KV tile.
    pub fn block_n(&self) -> u32 {
        match self.pv {
            Int8WgmmaPv::F16 => WGMMA_INT8_BLOCK_K,
            Int8WgmmaPv::E4m3 { block_n, .. } => block_n,
        }
    }

    /// Keys per K scale (the blocking's `block_k`).
    pub fn k_block(&self) -> u32 {
        match self.pv {
            Int8WgmmaPv::F16 => WGMMA_INT8_BLOCK_K,
            Int8WgmmaPv::E4m3 { k_block, .. } => k_block,
        }
    }

    /// Whether P·V runs in e4m3 (V read as Vᵀ codes with per-channel scales).
    pub fn pv_fp8(&self) -> bool {
        matches!(self.pv, Int8WgmmaPv::E4m3 { .. })
    }

    /// Keys per Vᵀ column block in shared memory (its swizzle span in bytes): 128 at 128-key
    /// tiles, else 64 (e4m3 P·V only).
    pub fn vt_block(&self) -> u32 {
        if self.block_n() == 128 { 128 } else { 64 }
    }

    /// The f16 P·V variant for an IMMA family config's head dim and granularity; refuses f16
    /// P·V accumulation.
    pub fn from_int8(c: &Int8Config) -> Result<Self> {
        if c.pv != PvAccum::F32 {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: "P·V accumulates in f32 only".into() });
        }
        Self::new(c.head_dim as usize, c.granularity)
    }

    /// The stage counts the report and tests compile.
    pub const STAGES: &'static [u32] = &[2, 3];

    /// Every variant the report and tests compile: f16 P·V at head dim x granularity x stages;
    /// e4m3 P·V at head dim x granularity with the table tile, and at hd 128 per block the
    /// alternatives the benchmark script compares (one-level accumulation, a flush every tile,
    /// 128-key tiles and scales).
    pub fn all() -> Vec<Int8WgmmaConfig> {
        let mut v = Vec::new();
        for head_dim in [64, 128] {
            for granularity in Int8Granularity::ALL {
                for &stages in Self::STAGES {
                    v.push(Int8WgmmaConfig { head_dim, granularity, stages, pv: Int8WgmmaPv::F16 });
                }
            }
        }
        for head_dim in [64, 128] {
            for granularity in Int8Granularity::ALL {
                if let Ok(c) = Self::new_fp8(head_dim, granularity) {
                    v.push(c);
                }
            }
        }
        v.extend(Self::fp8_alternatives());
        v
    }

    /// The e4m3 P·V variants next to the table one (hd 128, per-block Q scales) that the
    /// benchmark script times and checks: one-level accumulation, a flush every tile, 128-key
    /// tiles with 128-key K scales.
    pub fn fp8_alternatives() -> Vec<Int8WgmmaConfig> {
        let Ok(base) = Self::new_fp8(128, Int8Granularity::PerBlock) else { return Vec::new() };
        let Int8WgmmaPv::E4m3 { block_n, k_block, .. } = base.pv else { return Vec::new() };
        let e4m3 = |block_n, k_block, flush| Int8WgmmaConfig { pv: Int8WgmmaPv::E4m3 { block_n, k_block, flush }, ..base };
        vec![e4m3(block_n, k_block, 0), e4m3(block_n, k_block, 1), e4m3(128, 128, INT8_FP8_FLUSH)]
    }

    pub fn validate(&self) -> Result<()> {
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return Err(NativeError::UnsupportedHeadDim {
                kernel: KERNEL,
                head_dim: self.head_dim as usize,
                supported: Self::HEAD_DIMS,
            });
        }
        if !(2..=4).contains(&self.stages) {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("{} TMA stages (2 to 4 supported)", self.stages),
            });
        }
        if let Int8WgmmaPv::E4m3 { block_n, k_block, .. } = self.pv {
            if !(block_n == 128 || block_n == 192) || !(k_block == 64 || k_block == 128) || block_n % k_block != 0 {
                return Err(NativeError::UnsupportedConfig {
                    kernel: KERNEL,
                    reason: format!("{block_n}-key tiles with {k_block}-key K scales (tiles of 128 or 192 keys, scales of 64 or 128 dividing them)"),
                });
            }
        }
        if self.smem_bytes_unchecked() > 227 * 1024 {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("{} bytes of shared memory (227 KiB at most)", self.smem_bytes_unchecked()),
            });
        }
        Ok(())
    }

    /// The IMMA family config with this family's scale blocking (forced tile 8 warps x 16 rows,
    /// [`Self::k_block`] keys, f32 P·V): its [`Int8Config::blocking`], [`Int8Args::validate`]
    /// and [`Int8Args::required_lens`] are this kernel's.
    pub fn scale_twin(&self) -> Int8Config {
        Int8Config {
            head_dim: self.head_dim,
            granularity: self.granularity,
            pv: PvAccum::F32,
            tile: Some(Int8Tile::new(WGMMA_INT8_WARPS, self.k_block(), 16)),
        }
    }

    /// The scale layout: `(block_q, block_k, warps)` = `(128, k_block, 8)` in every granularity.
    pub fn blocking(&self) -> Result<Int8Blocking> {
        self.validate()?;
        let b = Int8Blocking {
            block_q: WGMMA_INT8_BLOCK_Q as usize,
            block_k: self.k_block() as usize,
            warps: WGMMA_INT8_WARPS as usize,
        };
        debug_assert_eq!(self.scale_twin().blocking().ok(), Some(b));
        Ok(b)
    }

    /// `fwd_wgmma_int8_{block|warp|thread}_d{hd}_tma{stages}` (f16 P·V), or
    /// `fwd_wgmma_int8_e4m3pv_{block|warp|thread}_d{hd}_n{block_n}k{k_block}_tma{stages}_f{flush}`.
    pub fn name(&self) -> String {
        match self.pv {
            Int8WgmmaPv::F16 => format!("{KERNEL}_{}_d{}_tma{}", self.granularity.tag(), self.head_dim, self.stages),
            Int8WgmmaPv::E4m3 { block_n, k_block, flush } => format!(
                "{KERNEL}_e4m3pv_{}_d{}_n{block_n}k{k_block}_tma{}_f{flush}",
                self.granularity.tag(),
                self.head_dim,
                self.stages
            ),
        }
    }

    /// The `-D` defines the kernel reads: HEAD_DIM, Q_GRAN (0 block, 1 warp, 2 thread),
    /// KV_STAGES, PRODUCER_REGS and CONSUMER_REGS; for e4m3 P·V also PV_FP8, BLOCK_N, K_BLOCK
    /// and PV_FLUSH.
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let gran = match self.granularity {
            Int8Granularity::PerBlock => 0,
            Int8Granularity::PerWarp => 1,
            Int8Granularity::PerThread => 2,
        };
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        let mut v = vec![
            d("HEAD_DIM", self.head_dim),
            d("Q_GRAN", gran),
            d("KV_STAGES", self.stages),
            d("PRODUCER_REGS", WS_PRODUCER_REGS),
            d("CONSUMER_REGS", WS_CONSUMER_REGS),
        ];
        if let Int8WgmmaPv::E4m3 { block_n, k_block, flush } = self.pv {
            v.extend([d("PV_FP8", 1), d("BLOCK_N", block_n), d("K_BLOCK", k_block), d("PV_FLUSH", flush)]);
        }
        Ok(v)
    }

    /// Threads per CTA: 384, two consumer warpgroups and the TMA producer warpgroup.
    pub fn threads(&self) -> u32 {
        32 * WGMMA_INT8_WARPS + 128
    }

    /// The compile request for `arch` (only [`Arch::Sm90a`]).
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        if !Self::TARGETS.contains(&arch) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("wgmma needs sm_90a, not {arch}") });
        }
        Ok(CompileRequest { kernel: self.name(), source: &FWD_WGMMA_INT8, arch, defines: self.defines()? })
    }

    /// Dynamic shared memory, mirror of `ws::SMEM_BYTES`: int8 Q, the int8 K and the V stages
    /// (f16 V, or e4m3 Vᵀ), the mbarriers (8 bytes each: one for Q, four per stage), with a
    /// two-level e4m3 P·V the f32 O sums (2 x 128 threads x hd / 2 floats, 1024-aligned after
    /// the barriers), plus 1024 bytes to round the base up to the swizzle alignment.
    pub fn smem_bytes(&self) -> Result<u32> {
        self.validate()?;
        Ok(self.smem_bytes_unchecked())
    }

    fn smem_bytes_unchecked(&self) -> u32 {
        let (d, stages, n) = (self.head_dim, self.stages, self.block_n());
        let bars_end = WGMMA_INT8_BLOCK_Q * d + stages * n * d + stages * self.v_tile_bytes() + 8 * (1 + 4 * stages);
        match self.pv {
            Int8WgmmaPv::E4m3 { flush, .. } if flush > 0 => bars_end.div_ceil(1024) * 1024 + 256 * (d / 2) * 4 + 1024,
            _ => bars_end + 1024,
        }
    }

    /// Bytes of one stage's V tile: f16 `[128 keys][hd]`, or e4m3 `[hd][block_n keys]`.
    fn v_tile_bytes(&self) -> u32 {
        match self.pv {
            Int8WgmmaPv::F16 => WGMMA_INT8_BLOCK_K * 2 * self.head_dim,
            Int8WgmmaPv::E4m3 { block_n, .. } => block_n * self.head_dim,
        }
    }

    /// SASS opcodes that must appear, as nvdisasm 13.x spells them: the s8 Q·Kᵀ wgmma
    /// (m64n{block_n}k32, s32 accumulators) and the P·V wgmma (f16: m64n{hd}k16; e4m3:
    /// m64n{hd}k32), both with f32 accumulators. Also the tensor loads and the producer's
    /// register release.
    pub fn expected_instructions(&self) -> Vec<String> {
        let pv = match self.pv {
            Int8WgmmaPv::F16 => format!("HGMMA.64x{}x16.F32", self.head_dim),
            Int8WgmmaPv::E4m3 { .. } => format!("QGMMA.64x{}x32.F32.E4M3.E4M3", self.head_dim),
        };
        vec![
            format!("IGMMA.64x{}x32.S8.S8", self.block_n()),
            pv,
            "UTMALDG.4D".into(),
            "USETMAXREG.DEALLOC.CTAPOOL".into(),
        ]
    }

    /// [`Arch::Sm90a`] for compute capability 9.0, else `None`.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    /// The IMMA family's argument checks for this blocking (shapes, strides, grid limits).
    pub fn validate_args(&self, args: &Int8Args) -> Result<()> {
        self.validate()?;
        args.validate(&self.scale_twin())
    }

    /// Grid `(ceil(q_len / 128), q_heads, batch)`, [`Self::threads`] threads. The kernel takes
    /// the number of Q scale blocks per head from the grid width.
    pub fn launch_shape(&self, args: &Int8Args) -> Result<Int8LaunchShape> {
        let m_blocks = args.shape.q_len.div_ceil(WGMMA_INT8_BLOCK_Q as usize);
        Ok(Int8LaunchShape {
            grid: (m_blocks as u32, args.shape.q_heads as u32, args.shape.batch as u32),
            block: (self.threads(), 1, 1),
            smem_bytes: self.smem_bytes()?,
        })
    }

    /// Kernel parameters: the IMMA family's.
    pub fn params(&self, args: &Int8Args, ptrs: &Int8Ptrs) -> Int8WgmmaParams {
        args.params(ptrs)
    }

    /// What the kernel's three tensor maps describe (Q, K, V), checked against TMA's rules:
    /// rank 4 `(dim, seq, head, batch)`; int8 Q boxes of 128 rows and K boxes of
    /// [`Self::block_n`] rows, head-dim bytes wide, with the swizzle of the kernel's K-major
    /// layout (128B at hd 128, 64B at hd 64). f16 P·V: f16 V boxes of 128 rows x 64 halves, 128B
    /// swizzle (one box per 64 columns). e4m3 P·V: `ptrs.v` is the Vᵀ codes
    /// `[b, kv_heads, d, kv_pad]`, rank 4 `(key, dim, kv head, batch)`, boxes of hd rows x
    /// [`Self::vt_block`] keys with that many bytes of swizzle.
    pub fn tma_specs(&self, args: &Int8Args, ptrs: &Int8Ptrs) -> Result<[TmaSpec; 3]> {
        self.validate_args(args)?;
        let d = self.head_dim as usize;
        let int8_swizzle = if self.head_dim == 128 { 128 } else { 64 };
        let sh = &args.shape;
        let t = |addr, elem_bytes, heads, len, strides| RowsTensor { addr, elem_bytes, head_dim: d, len, heads, batch: sh.batch, strides };
        let v = match self.pv {
            Int8WgmmaPv::F16 => TmaSpec::rows("V", t(ptrs.v, 2, sh.kv_heads, sh.kv_len, sh.v), 64, WGMMA_INT8_BLOCK_K, 128)?,
            Int8WgmmaPv::E4m3 { .. } => {
                let pad = vt_kv_pad(sh.kv_len);
                let strides = Strides { seq: pad, head: d * pad, batch: sh.kv_heads * d * pad };
                let vt = RowsTensor { addr: ptrs.v, elem_bytes: 1, head_dim: pad, len: d, heads: sh.kv_heads, batch: sh.batch, strides };
                TmaSpec::rows("Vt", vt, self.vt_block(), self.head_dim, self.vt_block())?
            }
        };
        Ok([
            TmaSpec::rows("Q", t(ptrs.q, 1, sh.q_heads, sh.q_len, sh.q), self.head_dim, WGMMA_INT8_BLOCK_Q, int8_swizzle)?,
            TmaSpec::rows("K", t(ptrs.k, 1, sh.kv_heads, sh.kv_len, sh.k), self.head_dim, self.block_n(), int8_swizzle)?,
            v,
        ])
    }

    /// Element counts of the e4m3 P·V operands of a launch over `args`: the Vᵀ codes
    /// `[b, kv_heads, hd, kv_pad]` and the V scales `[b, kv_heads, hd]`.
    pub fn fp8_v_lens(&self, args: &Int8Args) -> (usize, usize) {
        let (d, sh) = (self.head_dim as usize, &args.shape);
        (sh.batch * sh.kv_heads * d * vt_kv_pad(sh.kv_len), sh.batch * sh.kv_heads * d)
    }
}

/// The key that column `col` of a Vᵀ row holds (the kernel header's permutation sigma inside
/// every group of 32 keys, which makes the S accumulator registers P's e4m3 A fragment).
pub fn vt_key(col: usize) -> usize {
    let k = col % 32;
    (col - k) + 16 * (k / 16) + 8 * ((k % 4) / 2) + 2 * ((k % 16) / 4) + (k % 2)
}

/// Keys per Vᵀ row of the e4m3 P·V variants: kv_len rounded up to [`INT8_FP8_KV_PAD`].
pub fn vt_kv_pad(kv_len: usize) -> usize {
    kv_len.max(1).div_ceil(INT8_FP8_KV_PAD) * INT8_FP8_KV_PAD
}

#[cfg(feature = "cuda")]
pub use launch::Int8WgmmaKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};
    use crate::int8::{check_lens, Int8Buffers, Int8Lens};
    use crate::tma::TmaMapCache;

    /// One INT8 wgmma variant loaded into a CUDA context (compute capability 9.0 only).
    #[derive(Debug)]
    pub struct Int8WgmmaKernel {
        config: Int8WgmmaConfig,
        function: CudaFunction,
        compiled: Arc<CompiledKernel>,
        /// The TMA kernel's tensor maps of the last launch.
        maps: TmaMapCache,
    }

    impl Int8WgmmaKernel {
        /// Compiles (or fetches from the global cache) `config` for sm_90a and loads it.
        pub fn load(ctx: &Arc<CudaContext>, config: Int8WgmmaConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        /// As [`Self::load`], with an explicit cache.
        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Int8WgmmaConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm90a, Int8WgmmaConfig::target_for)?;
            let (function, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, config.smem_bytes()?)?;
            Ok(Int8WgmmaKernel { config, function, compiled, maps: TmaMapCache::default() })
        }

        pub fn config(&self) -> &Int8WgmmaConfig {
            &self.config
        }
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }

        /// Launches with typed buffers, as [`crate::Int8Kernel::launch`]: shapes, strides, every
        /// buffer's length and alignment are checked before anything is enqueued.
        pub fn launch<T, Q, K, V, O, L, S>(
            &self,
            stream: &Arc<CudaStream>,
            args: &Int8Args,
            bufs: Int8Buffers<'_, T, Q, K, V, O, L, S>,
        ) -> Result<()>
        where
            Q: DevicePtr<i8>,
            K: DevicePtr<i8>,
            V: DevicePtr<T>,
            O: DevicePtrMut<T>,
            L: DevicePtrMut<f32>,
            S: DevicePtr<f32>,
        {
            if self.config.pv_fp8() {
                return Err(NativeError::InvalidArgs(format!(
                    "{} reads e4m3 Vᵀ codes and V scales: launch it with launch_fp8_raw",
                    self.config.name()
                )));
            }
            if std::mem::size_of::<T>() != 2 {
                return Err(NativeError::InvalidArgs(format!(
                    "V/O element type must be 2 bytes (f16), got {}",
                    std::mem::size_of::<T>()
                )));
            }
            if args.lse_shift != bufs.lse_shift.is_some() {
                return Err(NativeError::InvalidArgs(format!(
                    "lse_shift announced {} but {} buffer passed",
                    args.lse_shift,
                    if bufs.lse_shift.is_some() { "a" } else { "no" }
                )));
            }
            self.config.validate_args(args)?;
            let need = args.required_lens(&self.config.scale_twin())?;
            let have = Int8Lens {
                q: bufs.q.len(),
                k: bufs.k.len(),
                v: bufs.v.len(),
                o: bufs.o.len(),
                lse: bufs.lse.len(),
                q_scale: bufs.q_scale.len(),
                k_scale: bufs.k_scale.len(),
                lse_shift: bufs.lse_shift.map(|s| s.len()).unwrap_or(0),
            };
            check_lens(&need, &have)?;
            let (q, _gq) = bufs.q.device_ptr(stream);
            let (k, _gk) = bufs.k.device_ptr(stream);
            let (v, _gv) = bufs.v.device_ptr(stream);
            let (o, _go) = bufs.o.device_ptr_mut(stream);
            let (lse, _gl) = bufs.lse.device_ptr_mut(stream);
            let (q_scale, _gqs) = bufs.q_scale.device_ptr(stream);
            let (k_scale, _gks) = bufs.k_scale.device_ptr(stream);
            let shift = bufs.lse_shift.map(|s| s.device_ptr(stream));
            let lse_shift = shift.as_ref().map(|(p, _)| *p).unwrap_or(0);
            let ptrs = Int8Ptrs { q, k, v, o, lse, q_scale, k_scale, lse_shift };
            // SAFETY: every buffer's length was checked against what the kernel touches.
            unsafe { self.launch_raw(stream, args, &ptrs) }
        }

        /// Launches an f16 P·V variant with raw device addresses, exactly as
        /// [`crate::Int8Kernel::launch_raw`].
        ///
        /// # Safety
        /// Each pointer must address device memory of at least the element counts of
        /// [`Int8Args::required_lens`] for [`Int8WgmmaConfig::scale_twin`] (int8 Q/K, f16 V/O,
        /// f32 LSE/scales/shift), valid until the kernel finishes on `stream`; scales must be
        /// positive and finite.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, args: &Int8Args, ptrs: &Int8Ptrs) -> Result<()> {
            if self.config.pv_fp8() {
                return Err(NativeError::InvalidArgs(format!("{} needs its V scales: launch_fp8_raw", self.config.name())));
            }
            // SAFETY: forwarded contract.
            unsafe { self.launch_with(stream, args, ptrs, 0) }
        }

        /// Launches an e4m3 P·V variant: `ptrs.v` is the Vᵀ codes and `v_scale` the V scales
        /// ([`Int8WgmmaConfig::fp8_v_lens`]), both as the prepass with `v_fp8` writes them.
        ///
        /// # Safety
        /// As [`Self::launch_raw`] for Q, K, O, LSE, the Q/K scales and the shift; `ptrs.v` and
        /// `v_scale` must address at least the element counts of
        /// [`Int8WgmmaConfig::fp8_v_lens`] (bytes, f32), valid until the kernel finishes on
        /// `stream`; the V scales positive and finite.
        pub unsafe fn launch_fp8_raw(&self, stream: &Arc<CudaStream>, args: &Int8Args, ptrs: &Int8Ptrs, v_scale: u64) -> Result<()> {
            if !self.config.pv_fp8() {
                return Err(NativeError::InvalidArgs(format!("{} computes f16 P·V: launch_raw", self.config.name())));
            }
            if v_scale == 0 || v_scale % 16 != 0 {
                return Err(NativeError::InvalidArgs(format!("v_scale address {v_scale:#x} is null or not 16-byte aligned")));
            }
            // SAFETY: forwarded contract.
            unsafe { self.launch_with(stream, args, ptrs, v_scale) }
        }

        /// # Safety
        /// The contract of [`Self::launch_raw`] / [`Self::launch_fp8_raw`] for the variant.
        unsafe fn launch_with(&self, stream: &Arc<CudaStream>, args: &Int8Args, ptrs: &Int8Ptrs, v_scale: u64) -> Result<()> {
            self.config.validate_args(args)?;
            args.validate_ptrs(ptrs)?;
            let shape = self.config.launch_shape(args)?;
            let params = self.config.params(args, ptrs);
            let maps = self.maps.maps(&self.config.tma_specs(args, ptrs)?)?;
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem_bytes };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            b.arg(&maps);
            b.arg(&v_scale);
            // SAFETY: the parameter structs match the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::{AttentionShape, Layout, Strides};

    #[test]
    fn names_defines_smem_and_targets() {
        let c = Int8WgmmaConfig::new(128, Int8Granularity::PerThread).unwrap();
        assert_eq!(c.name(), "fwd_wgmma_int8_thread_d128_tma2");
        assert_eq!(c.smem_bytes().unwrap(), 128 * 128 + 2 * 128 * 128 + 2 * 128 * 256 + 8 * 9 + 1024);
        assert_eq!(c.threads(), 384);
        let d = c.defines().unwrap();
        assert!(d.contains(&("Q_GRAN".into(), "2".into())) && d.contains(&("HEAD_DIM".into(), "128".into())));
        assert!(d.contains(&("KV_STAGES".into(), "2".into())));
        // 3 stages: 13 mbarriers.
        let t = Int8WgmmaConfig::with_stages(64, Int8Granularity::PerBlock, 3).unwrap();
        assert_eq!(t.name(), "fwd_wgmma_int8_block_d64_tma3");
        assert_eq!(t.smem_bytes().unwrap(), 128 * 64 + 3 * 128 * 64 + 3 * 128 * 128 + 8 * 13 + 1024);
        assert_eq!(t.threads(), 384);
        let d = t.defines().unwrap();
        assert!(d.contains(&("Q_GRAN".into(), "0".into())) && d.contains(&("KV_STAGES".into(), "3".into())));
        assert!(t.expected_instructions().iter().any(|i| i.starts_with("UTMALDG")));
        assert!(Int8WgmmaConfig::with_stages(64, Int8Granularity::PerBlock, 5).is_err());
        assert!(Int8WgmmaConfig::with_stages(64, Int8Granularity::PerBlock, 1).is_err());
        assert_eq!(Int8WgmmaConfig::new(64, Int8Granularity::PerBlock).unwrap().stages, Int8WgmmaConfig::DEFAULT_STAGES);
        assert!(matches!(Int8WgmmaConfig::new(96, Int8Granularity::PerBlock), Err(NativeError::UnsupportedHeadDim { .. })));
        assert!(matches!(c.request(Arch::Sm90), Err(NativeError::UnsupportedConfig { .. })));
        assert_eq!(Int8WgmmaConfig::target_for((9, 0)), Some(Arch::Sm90a));
        assert_eq!(Int8WgmmaConfig::target_for((8, 0)), None);
        assert_eq!(Int8WgmmaConfig::target_for((10, 0)), None);
        let mut names: Vec<String> = Int8WgmmaConfig::all().iter().map(|c| c.name()).collect();
        let n = 6 * Int8WgmmaConfig::STAGES.len() + 6 + Int8WgmmaConfig::fp8_alternatives().len();
        assert_eq!(names.len(), n);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
        let f16 = Int8Config::new(128, Int8Granularity::PerBlock, PvAccum::F16PerTile).unwrap();
        assert!(Int8WgmmaConfig::from_int8(&f16).is_err());
    }

    #[test]
    fn e4m3_pv_variants_name_define_and_size_what_the_kernel_reads() {
        let c = Int8WgmmaConfig::new_fp8(128, Int8Granularity::PerWarp).unwrap();
        assert_eq!(c.pv, Int8WgmmaPv::E4m3 { block_n: 192, k_block: 64, flush: INT8_FP8_FLUSH });
        assert_eq!(c.name(), "fwd_wgmma_int8_e4m3pv_warp_d128_n192k64_tma2_f4");
        let d = c.defines().unwrap();
        for (k, v) in [("PV_FP8", "1"), ("BLOCK_N", "192"), ("K_BLOCK", "64"), ("PV_FLUSH", "4"), ("Q_GRAN", "1")] {
            assert!(d.contains(&(k.into(), v.into())), "{k}={v} missing from {d:?}");
        }
        // Q 16 KiB, 2 x (K 24 KiB + Vt 24 KiB), 9 barriers, then 1024-aligned O sums of 256
        // threads x 64 floats, plus the base alignment.
        let bars_end: u32 = 128 * 128 + 2 * (192 * 128 + 128 * 192) + 8 * 9;
        assert_eq!(c.smem_bytes().unwrap(), bars_end.div_ceil(1024) * 1024 + 256 * 64 * 4 + 1024);
        assert_eq!(c.blocking().unwrap(), Int8Blocking { block_q: 128, block_k: 64, warps: 8 });
        assert_eq!(c.vt_block(), 64);
        let e = c.expected_instructions();
        assert!(e.contains(&"IGMMA.64x192x32.S8.S8".to_string()) && e.contains(&"QGMMA.64x128x32.F32.E4M3.E4M3".to_string()), "{e:?}");
        // One level: no O sums in shared memory.
        let one = Int8WgmmaConfig { pv: Int8WgmmaPv::E4m3 { block_n: 128, k_block: 128, flush: 0 }, ..c };
        assert_eq!(one.smem_bytes().unwrap(), 128 * 128 + 2 * (128 * 128 + 128 * 128) + 8 * 9 + 1024);
        assert_eq!(one.vt_block(), 128);
        assert!(one.expected_instructions().contains(&"IGMMA.64x128x32.S8.S8".to_string()));
        // Tiles and scales the kernel's static_asserts refuse.
        for (block_n, k_block) in [(256, 64), (192, 128), (128, 32)] {
            let bad = Int8WgmmaConfig { pv: Int8WgmmaPv::E4m3 { block_n, k_block, flush: 0 }, ..c };
            assert!(matches!(bad.validate(), Err(NativeError::UnsupportedConfig { .. })), "{block_n}/{k_block}");
        }
        // Four stages of 192-key tiles with the O sums do not fit 227 KiB.
        let big = Int8WgmmaConfig { stages: 4, ..c };
        assert!(matches!(big.validate(), Err(NativeError::UnsupportedConfig { .. })));
        assert!(Int8WgmmaConfig::new_fp8(96, Int8Granularity::PerBlock).is_err());
        // hd 64 takes 64B-swizzled Q/K rows and the same tile.
        let c64 = Int8WgmmaConfig::new_fp8(64, Int8Granularity::PerThread).unwrap();
        assert_eq!(c64.name(), "fwd_wgmma_int8_e4m3pv_thread_d64_n192k64_tma2_f4");
        assert!(c64.expected_instructions().contains(&"QGMMA.64x64x32.F32.E4M3.E4M3".to_string()));
    }

    #[test]
    fn vt_key_permutes_each_group_of_32_keys() {
        for g in 0..3 {
            let mut keys: Vec<usize> = (32 * g..32 * g + 32).map(vt_key).collect();
            // Column 4t + e of a 16-column half holds keys 2t, 2t + 1, 2t + 8, 2t + 9 of it.
            assert_eq!(&keys[..8], &[32 * g, 32 * g + 1, 32 * g + 8, 32 * g + 9, 32 * g + 2, 32 * g + 3, 32 * g + 10, 32 * g + 11]);
            keys.sort();
            assert_eq!(keys, (32 * g..32 * g + 32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn e4m3_pv_tma_maps_read_the_transposed_v() {
        let c = Int8WgmmaConfig::new_fp8(128, Int8Granularity::PerBlock).unwrap();
        let a = Int8Args { shape: AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 777, 128, false), lse_shift: false };
        let [q, k, v] = c.tma_specs(&a, &ptrs()).unwrap();
        assert_eq!(q.box_dims, [128, 128, 1, 1]);
        // K boxes of one 192-key tile.
        assert_eq!((k.box_dims, k.swizzle_bytes), ([128, 192, 1, 1], 128));
        // Vᵀ [b][kvh][d][kv_pad]: 777 keys padded to 896, boxes of 64 keys x 128 rows, 64B swizzle.
        assert_eq!(vt_kv_pad(777), 896);
        assert_eq!((v.addr, v.elem_bytes, v.dims), (0x3000, 1, [896, 128, 2, 2]));
        assert_eq!(v.strides, [896, 128 * 896, 2 * 128 * 896]);
        assert_eq!((v.box_dims, v.swizzle_bytes), ([64, 128, 1, 1], 64));
        assert_eq!(c.fp8_v_lens(&a), (2 * 2 * 128 * 896, 2 * 2 * 128));
        // 128-key tiles read 128-key Vᵀ blocks with the 128B swizzle.
        let c128 = Int8WgmmaConfig { pv: Int8WgmmaPv::E4m3 { block_n: 128, k_block: 128, flush: 4 }, ..c };
        let [_, k, v] = c128.tma_specs(&a, &ptrs()).unwrap();
        assert_eq!((k.box_dims[1], v.box_dims, v.swizzle_bytes), (128, [128, 128, 1, 1], 128));
        // The scale layout follows the K scale block: 64 keys per K scale.
        let lens = a.required_lens(&c.scale_twin()).unwrap();
        assert_eq!(lens.k_scale, 2 * 2 * 777usize.div_ceil(64));
    }

    #[test]
    fn blocking_is_the_codec_model_in_every_granularity() {
        for c in Int8WgmmaConfig::all() {
            let b = c.blocking().unwrap();
            assert_eq!(b, Int8Blocking { block_q: 128, block_k: c.k_block() as usize, warps: 8 });
            assert_eq!(c.scale_twin().blocking().unwrap(), b);
            c.scale_twin().validate().unwrap();
            // Per thread: 16 rows per layout warp (the codec's requirement).
            assert_eq!(b.rows_per_warp(), 16);
            b.check(c.granularity).unwrap();
        }
    }

    #[test]
    fn args_lengths_and_launch_shape() {
        let c = Int8WgmmaConfig::new(128, Int8Granularity::PerWarp).unwrap();
        let mut shape = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 777, 128, true);
        shape.o = Strides::new(Layout::Bshd, 8, 1000, 128);
        let a = Int8Args { shape, lse_shift: true };
        c.validate_args(&a).unwrap();
        let lens = a.required_lens(&c.scale_twin()).unwrap();
        assert_eq!(lens.q_scale, 2 * 8 * 1000usize.div_ceil(128) * 8);
        assert_eq!(lens.k_scale, 2 * 2 * 777usize.div_ceil(128));
        let s = c.launch_shape(&a).unwrap();
        assert_eq!((s.grid, s.block, s.smem_bytes), ((8, 8, 2), (384, 1, 1), c.smem_bytes().unwrap()));
        let mut b = a;
        b.shape.q.seq = 136;
        assert!(c.validate_args(&b).is_err());
    }

    fn ptrs() -> Int8Ptrs {
        Int8Ptrs { q: 0x1000, k: 0x2000, v: 0x3000, o: 0x4000, lse: 0x5000, q_scale: 0x6000, k_scale: 0x7000, lse_shift: 0 }
    }

    #[test]
    fn tma_specs_describe_the_kernel_boxes_in_both_layouts() {
        let c = Int8WgmmaConfig::new(128, Int8Granularity::PerBlock).unwrap();
        let mut shape = AttentionShape::contiguous(Layout::Bshd, 2, 8, 2, 1000, 777, 128, false);
        shape.k = Strides::new(Layout::Bhsd, 2, 777, 128);
        let a = Int8Args { shape, lse_shift: false };
        let [q, k, v] = c.tma_specs(&a, &ptrs()).unwrap();
        // Q int8 BSHD: byte strides seq = heads * d, head = d, batch = seq * heads * d.
        assert_eq!((q.addr, q.elem_bytes, q.dims), (0x1000, 1, [128, 1000, 8, 2]));
        assert_eq!(q.strides, [8 * 128, 128, 1000 * 8 * 128]);
        assert_eq!((q.box_dims, q.swizzle_bytes), ([128, 128, 1, 1], 128));
        assert_eq!((k.dims, k.strides), ([128, 777, 2, 2], [128, 777 * 128, 2 * 777 * 128]));
        // V f16: byte strides twice the element strides; boxes of 64 halves (128 bytes).
        assert_eq!((v.elem_bytes, v.dims), (2, [128, 777, 2, 2]));
        assert_eq!(v.strides, [2 * 2 * 128, 2 * 128, 2 * 777 * 2 * 128]);
        assert_eq!((v.box_dims, v.swizzle_bytes), ([64, 128, 1, 1], 128));
        // hd 64: int8 rows of 64 bytes take the 64-byte swizzle.
        let c64 = Int8WgmmaConfig::new(64, Int8Granularity::PerBlock).unwrap();
        let a64 = Int8Args { shape: AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 777, 64, false), ..a };
        let [q, _, v] = c64.tma_specs(&a64, &ptrs()).unwrap();
        assert_eq!((q.box_dims, q.swizzle_bytes), ([64, 128, 1, 1], 64));
        assert_eq!((v.box_dims, v.swizzle_bytes), ([64, 128, 1, 1], 128));
    }

    #[test]
    fn tma_specs_refuse_what_tma_cannot_address() {
        let c = Int8WgmmaConfig::new(128, Int8Granularity::PerBlock).unwrap();
        let a = Int8Args { shape: AttentionShape::contiguous(Layout::Bhsd, 1, 2, 2, 64, 64, 128, false), lse_shift: false };
        let msg = |r: Result<[TmaSpec; 3]>| match r {
            Err(NativeError::InvalidArgs(m)) => m,
            other => panic!("expected InvalidArgs, got {other:?}"),
        };
        let m = msg(c.tma_specs(&a, &Int8Ptrs { k: 0x2008, ..ptrs() }));
        assert!(m.contains("TMA map of K") && m.contains("16-byte aligned"), "{m}");
        let m = msg(TmaSpec::new("K", 0, 1, [128, 64, 2, 1], [128, 8200, 16400], [128, 128, 1, 1], 128).map(|s| [s; 3]));
        assert!(m.contains("TMA map of K") && m.contains("stride 8200"), "{m}");
        assert!(TmaSpec::new("X", 0, 1, [128, 10, 1, 1], [128, 1280, 1280], [64, 128, 1, 1], 128).is_err());
        assert!(TmaSpec::new("X", 0, 1, [128, 0, 1, 1], [128, 1280, 1280], [128, 128, 1, 1], 128).is_err());
        assert!(TmaSpec::new("X", 0, 1, [128, 10, 1, 1], [128, 1280, 1280], [128, 128, 1, 1], 128).is_ok());
    }
}
