//! The wgmma forward family (`cuda/fwd_wgmma.cu`): FlashAttention-3-style attention on Hopper's
//! warpgroup MMA (`wgmma.mma_async`, SASS `HGMMA`), fp16 inputs, f32 accumulation for both
//! Q·Kᵀ and P·V, head dims 64 and 128. sm_90a only (H100/H200/GH200, compute capability 9.0).
//!
//! Run on the H100: `examples/wgmma_check.rs` passes on every variant (f64 reference: non-causal,
//! causal, GQA, ragged lengths, bshd), and `quattn selftest`
//! checks it through the facade, which picks it for fp16 with f32 accumulation on compute
//! capability 9.0.
//!
//! Structure (the kernel header has the details): warp specialized, a TMA producer warpgroup and
//! 2 ping-ponging consumer warpgroups of 64 query rows, Q/K/V in shared memory in the canonical
//! 128-byte-swizzle layout written by TMA into mbarrier-guarded K/V stages, S = Q·Kᵀ with both
//! operands by descriptor, P converted to f16 in registers as the register-A operand of P·V, V
//! by descriptor with the transpose bit (MN-major, no transposed copy), and the S wgmma of tile
//! j issued before the P·V of tile j - 1 so that the softmax of tile j overlaps that P·V (FA3's
//! intra-warpgroup pipelining). Same `FwdParams` ABI ([`HmmaParams`]), launch arguments (an
//! [`AttentionShape`]), masks (sequence end, bottom-right causal), GQA and LSE as
//! [`crate::hmma`].
//!
//! The `_varlen` variants ([`WgmmaConfig::varlen`], launched by `WgmmaKernel::launch_varlen`) run
//! packed variable-length batches ([`crate::varlen`]) with the same pipeline and tiles; with
//! score modifiers too (`_mods..._varlen`, `launch_varlen_raw` with their [`ModParams`]), each
//! sequence's band aligned against its own lengths.

use crate::arch::Arch;
use crate::cache::{CompileRequest, FWD_WGMMA};
use crate::error::{NativeError, Result};
use crate::hmma::{HmmaConfig, HmmaParams};
use crate::mods::ModVariant;
#[cfg(test)]
use crate::mods::{ModParams, ModValues, MOD_MAX_HEADS, MOD_UNBOUNDED};
use crate::tma::{RowsTensor, TmaSpec, WS_CONSUMER_REGS, WS_PRODUCER_REGS};
use crate::varlen::{VarlenPtrs, VarlenShape};
use quattn_core::{AttentionShape, Dtype, PvAccum, QkAccum};

const KERNEL: &str = "fwd_wgmma";

/// Kernel parameter block: the same `FwdParams` C layout as `fwd_hmma.cu`.
pub type WgmmaParams = HmmaParams;

/// CTA shape of one variant: 2 consumer warpgroups of 64 query rows (BLOCK_M = 128) and a
/// 128-thread TMA producer warpgroup, `block_n` keys per KV tile in `stages` K/V stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct WgmmaTile {
    /// Keys per KV tile (64 or 128): the N of the Q·Kᵀ wgmma and the K of P·V.
    pub block_n: u32,
    /// K/V stages of the producer's ring (2 to 4).
    pub stages: u32,
}

impl WgmmaTile {
    /// Consumer warpgroups, 64 query rows each.
    pub const WARPGROUPS: u32 = 2;

    pub const fn new(block_n: u32, stages: u32) -> Self {
        WgmmaTile { block_n, stages }
    }
    pub fn block_m(&self) -> u32 {
        64 * Self::WARPGROUPS
    }
    /// Consumer threads plus the 128-thread producer.
    pub fn threads(&self) -> u32 {
        128 * Self::WARPGROUPS + 128
    }
    /// Dynamic shared memory, mirror of `ws::SMEM_BYTES`: Q, the K and V stages, the mbarriers
    /// (8 bytes each: one for Q, four per stage), and 1024 bytes of slack to round the base up
    /// to the 1024-byte alignment of the 128B swizzle.
    pub fn smem_bytes(&self, head_dim: u32) -> u32 {
        let row = head_dim * 2;
        self.block_m() * row + 2 * self.stages * self.block_n * row + 8 * (1 + 4 * self.stages) + 1024
    }
    /// `w2n128_tma2`.
    pub fn suffix(&self) -> String {
        format!("w{}n{}_tma{}", Self::WARPGROUPS, self.block_n, self.stages)
    }
}

/// Tile per head dim, measured on the H100 with `wgmma_check --bench-only` (fp16, batch·seq =
/// 16k, heads = 2048/hd, TFLOP/s non-causal at seq 4k / 16k), against the best tiles (warpgroups
/// x 64 rows, keys) of a kernel without a producer in which every thread loads with cp.async:
///
/// | tile                              | hd64          | hd128         |
/// |-----------------------------------|---------------|---------------|
/// | cp.async 1 x 64, 128              | 381 / 382     | 348 / 366     |
/// | cp.async 2 x 64, 128              | 292 / 305     | 478 / 487     |
/// | **TMA 2 x 64, 128, 2 stages**     | **447 / 471** | **659 / 689** |
/// | TMA 2 x 64, 128, 3 stages         | 446 / 475     | 651 / 674     |
///
/// Two stages is the table tile at both head dims: the producer warpgroup removes the loads
/// from the consumers' instruction stream and the two consumers' ping-pong keeps the tensor
/// cores busy through each other's softmax.
pub const WGMMA_TILES: [(u32, WgmmaTile); 2] = [(64, WgmmaTile::new(128, 2)), (128, WgmmaTile::new(128, 2))];

/// Grid, block and shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaLaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
}

/// One compiled variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct WgmmaConfig {
    pub head_dim: u32,
    /// `None`: the tile from [`WGMMA_TILES`]; `Some`: forced (tests, sweeps).
    pub tile: Option<WgmmaTile>,
    /// `Some`: the score-modifier variant.
    pub mods: Option<ModVariant>,
    /// The variable-length variant ([`crate::varlen`]), with or without score modifiers.
    pub varlen: bool,
}

impl WgmmaConfig {
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];
    /// wgmma exists only on the `a` target of compute capability 9.0.
    pub const TARGETS: &'static [Arch] = &[Arch::Sm90a];

    /// Validated constructor with the table tile.
    pub fn new(head_dim: usize) -> Result<Self> {
        let cfg = WgmmaConfig { head_dim: head_dim as u32, tile: None, mods: None, varlen: false };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Head dim in the table; a forced tile has 64 or 128 keys and 2 to 4 stages.
    pub fn validate(&self) -> Result<()> {
        let t = self.tile()?;
        if !(t.block_n == 64 || t.block_n == 128) || !(2..=4).contains(&t.stages) {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("tile {t:?} (needs BLOCK_N 64 or 128 and 2 to 4 stages)"),
            });
        }
        if t.smem_bytes(self.head_dim) > 227 * 1024 {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("tile {t:?} needs {} bytes of shared memory", t.smem_bytes(self.head_dim)),
            });
        }
        Ok(())
    }

    /// The tile ([`WGMMA_TILES`] or the forced one).
    pub fn tile(&self) -> Result<WgmmaTile> {
        let unsupported = NativeError::UnsupportedHeadDim {
            kernel: KERNEL,
            head_dim: self.head_dim as usize,
            supported: Self::HEAD_DIMS,
        };
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return Err(unsupported);
        }
        if let Some(t) = self.tile {
            return Ok(t);
        }
        WGMMA_TILES.iter().find(|(hd, _)| *hd == self.head_dim).map(|(_, t)| *t).ok_or(unsupported)
    }

    /// The score-modifier variant of the table tile.
    pub fn with_mods(head_dim: usize, mods: ModVariant) -> Result<Self> {
        Ok(WgmmaConfig { mods: Some(mods), ..Self::new(head_dim)? })
    }

    /// The variable-length variant of the table tile ([`crate::varlen`]).
    pub fn varlen(head_dim: usize) -> Result<Self> {
        Ok(WgmmaConfig { varlen: true, ..Self::new(head_dim)? })
    }

    /// The variable-length variant with score modifiers.
    pub fn varlen_with_mods(head_dim: usize, mods: ModVariant) -> Result<Self> {
        Ok(WgmmaConfig { mods: Some(mods), ..Self::varlen(head_dim)? })
    }

    /// `fwd_wgmma_f16_d128`, with `_w2n128_tma3` etc. for a forced tile, `_mods...` for the
    /// score-modifier variants and `_varlen` for the variable-length ones.
    pub fn name(&self) -> String {
        let forced = self.tile.map(|t| format!("_{}", t.suffix())).unwrap_or_default();
        let mods = self.mods.map(|m| m.suffix()).unwrap_or_default();
        let varlen = if self.varlen { "_varlen" } else { "" };
        format!("{KERNEL}_f16_d{}{forced}{mods}{varlen}", self.head_dim)
    }

    /// Every variant the report and tests compile: the table tiles, and the other shapes as
    /// forced tiles (compiled so that a sweep on the H100 has them ready).
    pub fn all() -> Vec<WgmmaConfig> {
        let mut v = Vec::new();
        for hd in [64u32, 128] {
            v.push(WgmmaConfig { head_dim: hd, tile: None, mods: None, varlen: false });
            let table = WGMMA_TILES.iter().find(|(d, _)| *d == hd).map(|(_, t)| *t);
            let forced = [WgmmaTile::new(128, 2), WgmmaTile::new(128, 3)];
            for t in forced.into_iter().filter(|t| Some(*t) != table) {
                v.push(WgmmaConfig { head_dim: hd, tile: Some(t), mods: None, varlen: false });
            }
            for (softcap, alibi) in [(false, false), (true, false), (false, true), (true, true)] {
                v.push(WgmmaConfig { head_dim: hd, tile: None, mods: Some(ModVariant { softcap, alibi }), varlen: false });
            }
            v.push(WgmmaConfig { head_dim: hd, tile: None, mods: None, varlen: true });
            for (softcap, alibi) in [(false, false), (true, false), (false, true), (true, true)] {
                v.push(WgmmaConfig { head_dim: hd, tile: None, mods: Some(ModVariant { softcap, alibi }), varlen: true });
            }
        }
        v
    }

    /// The `-D` defines the kernel reads (see the header of `fwd_wgmma.cu`).
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let t = self.tile()?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        let mut v = vec![
            d("HEAD_DIM", self.head_dim),
            d("BLOCK_N", t.block_n),
            d("KV_STAGES", t.stages),
            d("PRODUCER_REGS", WS_PRODUCER_REGS),
            d("CONSUMER_REGS", WS_CONSUMER_REGS),
        ];
        if let Some(m) = self.mods {
            v.extend(m.defines());
        }
        if self.varlen {
            v.push(d("VARLEN", 1));
        }
        Ok(v)
    }

    /// The compile request for `arch` (only [`Arch::Sm90a`]).
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        if !Self::TARGETS.contains(&arch) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("wgmma needs sm_90a, not {arch}") });
        }
        Ok(CompileRequest { kernel: self.name(), source: &FWD_WGMMA, arch, defines: self.defines()? })
    }

    /// Dynamic shared memory of the launch.
    pub fn smem_bytes(&self) -> Result<u32> {
        Ok(self.tile()?.smem_bytes(self.head_dim))
    }

    /// SASS opcodes that must appear, as nvdisasm 13.x spells the wgmma of sm_90a: Q·Kᵀ is
    /// m64n{BLOCK_N}k16 with both operands in shared memory, P·V m64n{D}k16 with A in
    /// registers; both f16 x f16 -> f32. Also the tensor loads and the producer's register
    /// release.
    pub fn expected_instructions(&self) -> Vec<String> {
        let Ok(t) = self.tile() else { return Vec::new() };
        let mut v = vec![format!("HGMMA.64x{}x16.F32", t.block_n), format!("HGMMA.64x{}x16.F32", self.head_dim)];
        v.dedup();
        v.push("UTMALDG.4D".into());
        v.push("USETMAXREG.DEALLOC.CTAPOOL".into());
        v
    }

    /// [`Arch::Sm90a`] for compute capability 9.0, else `None`.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    /// The HMMA config whose argument checks (head dim, strides, scale, grid limits) are exactly
    /// the ones this kernel needs.
    fn args_twin(&self) -> Result<HmmaConfig> {
        HmmaConfig::new(self.head_dim as usize, Dtype::F16, QkAccum::F32, PvAccum::F32)
    }

    /// Validates launch arguments (the HMMA family's rules: same ABI, same layouts).
    pub fn validate_args(&self, args: &AttentionShape) -> Result<()> {
        self.validate()?;
        self.args_twin()?.validate_args(args)
    }

    /// The three tensor maps of the kernel (Q boxes of BLOCK_M rows, K and V boxes of BLOCK_N
    /// rows, each 64 halves wide with the 128B swizzle).
    pub fn tma_specs(&self, args: &AttentionShape, ptrs: [u64; 5]) -> Result<[TmaSpec; 3]> {
        let t = self.tile()?;
        self.validate_args(args)?;
        let x = |addr, heads, len, strides| RowsTensor {
            addr, elem_bytes: 2, head_dim: self.head_dim as usize, len, heads, batch: args.batch, strides,
        };
        Ok([
            TmaSpec::rows("Q", x(ptrs[0], args.q_heads, args.q_len, args.q), 64, t.block_m(), 128)?,
            TmaSpec::rows("K", x(ptrs[1], args.kv_heads, args.kv_len, args.k), 64, t.block_n, 128)?,
            TmaSpec::rows("V", x(ptrs[2], args.kv_heads, args.kv_len, args.v), 64, t.block_n, 128)?,
        ])
    }

    /// The three tensor maps of a varlen launch: each spans every sequence's rows of its packed
    /// tensor (`total_q` or `total_k` rows, batch extent 1), so a box that runs past a
    /// sequence's end reads the next sequence's rows (masked keys; Q rows whose O is never
    /// stored) or zeros past the last row.
    pub fn tma_specs_varlen(&self, args: &VarlenShape, ptrs: &VarlenPtrs) -> Result<[TmaSpec; 3]> {
        let t = self.tile()?;
        args.validate(self.head_dim)?;
        let x = |addr, heads: usize, len: usize, s: quattn_core::Strides| RowsTensor {
            addr,
            elem_bytes: 2,
            head_dim: self.head_dim as usize,
            len,
            heads,
            batch: 1,
            // One batch entry: its stride only has to be a valid one (the span of the rows).
            strides: quattn_core::Strides { batch: s.seq.max(s.head).max(8) * len.max(heads), ..s },
        };
        Ok([
            TmaSpec::rows("Q", x(ptrs.q, args.q_heads, args.total_q, args.q), 64, t.block_m(), 128)?,
            TmaSpec::rows("K", x(ptrs.k, args.kv_heads, args.total_k.max(1), args.k), 64, t.block_n, 128)?,
            TmaSpec::rows("V", x(ptrs.v, args.kv_heads, args.total_k.max(1), args.v), 64, t.block_n, 128)?,
        ])
    }

    /// Grid `(query blocks, q_heads, batch)`, block [`WgmmaTile::threads`] threads.
    pub fn launch_shape(&self, args: &AttentionShape) -> Result<WgmmaLaunchShape> {
        let t = self.tile()?;
        let m_blocks = args.q_len.div_ceil(t.block_m() as usize);
        Ok(WgmmaLaunchShape {
            grid: (m_blocks as u32, args.q_heads as u32, args.batch as u32),
            block: (t.threads(), 1, 1),
            smem_bytes: self.smem_bytes()?,
        })
    }
}

#[cfg(feature = "cuda")]
pub use launch::WgmmaKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};
    use crate::tma::TmaMapCache;
    use crate::mods::ModParams;

    /// One wgmma variant loaded into a CUDA context (compute capability 9.0 only).
    #[derive(Debug)]
    pub struct WgmmaKernel {
        config: WgmmaConfig,
        function: CudaFunction,
        compiled: Arc<CompiledKernel>,
        /// The TMA kernel's tensor maps of the last launch.
        maps: TmaMapCache,
    }

    impl WgmmaKernel {
        /// Compiles (or fetches from the global cache) `config` for sm_90a and loads it.
        pub fn load(ctx: &Arc<CudaContext>, config: WgmmaConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        /// As [`Self::load`], with an explicit cache.
        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: WgmmaConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm90a, WgmmaConfig::target_for)?;
            let (function, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, config.smem_bytes()?)?;
            Ok(WgmmaKernel { config, function, compiled, maps: TmaMapCache::default() })
        }

        pub fn config(&self) -> &WgmmaConfig {
            &self.config
        }
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }

        /// Launches on `stream`. `T` is the 2-byte fp16 element type (`half::f16`, `u16`);
        /// `lse` is `[batch, q_heads, q_len]` f32. Shapes, strides and lengths are checked first.
        #[allow(clippy::too_many_arguments)]
        pub fn launch<T, Q, K, V, O, L>(
            &self,
            stream: &Arc<CudaStream>,
            args: &AttentionShape,
            q: &Q,
            k: &K,
            v: &V,
            o: &mut O,
            lse: &mut L,
        ) -> Result<()>
        where
            Q: DevicePtr<T>,
            K: DevicePtr<T>,
            V: DevicePtr<T>,
            O: DevicePtrMut<T>,
            L: DevicePtrMut<f32>,
        {
            if std::mem::size_of::<T>() != 2 {
                return Err(NativeError::InvalidArgs(format!(
                    "element type must be 2 bytes (fp16), got {}",
                    std::mem::size_of::<T>()
                )));
            }
            self.config.validate_args(args)?;
            let need = self.config.args_twin()?.required_lens(args);
            let have = [q.len(), k.len(), v.len(), o.len(), lse.len()];
            for ((name, n), h) in ["q", "k", "v", "o", "lse"].iter().zip(need).zip(have) {
                if h < n {
                    return Err(NativeError::InvalidArgs(format!("{name} has {h} elements, needs {n}")));
                }
            }
            let (qp, _gq) = q.device_ptr(stream);
            let (kp, _gk) = k.device_ptr(stream);
            let (vp, _gv) = v.device_ptr(stream);
            let (op, _go) = o.device_ptr_mut(stream);
            let (lp, _gl) = lse.device_ptr_mut(stream);
            // SAFETY: lengths were checked against every offset the kernel touches.
            // A modifier variant refuses a launch without its parameters (launch_raw).
            unsafe { self.launch_raw(stream, args, None, [qp, kp, vp, op, lp]) }
        }

        /// Launches with raw device addresses `[q, k, v, o, lse]`.
        ///
        /// # Safety
        /// Each pointer must address device memory of at least [`HmmaConfig::required_lens`]
        /// elements (2-byte elements; f32 for LSE), valid until the kernel finishes on `stream`.
        /// `mods` is required by a [`ModVariant`] variant (built by
        /// [`crate::mods::ModParams::new`] for this config and shape) and refused by the others.
        pub unsafe fn launch_raw(
            &self,
            stream: &Arc<CudaStream>,
            args: &AttentionShape,
            mods: Option<&ModParams>,
            ptrs: [u64; 5],
        ) -> Result<()> {
            self.config.validate_args(args)?;
            if self.config.varlen {
                return Err(NativeError::InvalidArgs(format!(
                    "{} is a variable-length variant: launch it with launch_varlen",
                    self.config.name()
                )));
            }
            if mods.is_some() != self.config.mods.is_some() {
                return Err(NativeError::InvalidArgs(format!(
                    "{}: score-modifier parameters {} for this variant",
                    self.config.name(),
                    if mods.is_some() { "given" } else { "missing" }
                )));
            }
            if let Some(i) = ptrs.iter().position(|p| p % 16 != 0) {
                return Err(NativeError::InvalidArgs(format!(
                    "{} pointer {:#x} is not 16-byte aligned",
                    ["q", "k", "v", "o", "lse"][i],
                    ptrs[i]
                )));
            }
            let shape = self.config.launch_shape(args)?;
            let params = HmmaParams::new(args, ptrs);
            let maps = self.maps.maps(&self.config.tma_specs(args, ptrs)?)?;
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem_bytes };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            b.arg(&maps);
            if let Some(m) = mods {
                b.arg(m);
            }
            // SAFETY: the parameter structs match the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }

        /// Launches a variable-length batch ([`crate::varlen`]) on `stream`: `q`, `k`, `v`, `o`
        /// packed token-major with `args`' strides, `lse` (optional) f32 `[q_heads, total_q]`,
        /// `cu_seqlens_q` / `cu_seqlens_k` int32 of exactly `batch + 1` entries. Lengths, shapes
        /// and the variant are checked first; the cumulative lengths themselves live on the
        /// device and must satisfy [`VarlenShape::check_cu_seqlens`].
        #[allow(clippy::too_many_arguments)]
        pub fn launch_varlen<T, Q, K, V, O, L, C, D>(
            &self,
            stream: &Arc<CudaStream>,
            args: &VarlenShape,
            q: &Q,
            k: &K,
            v: &V,
            o: &mut O,
            lse: Option<&mut L>,
            cu_seqlens_q: &C,
            cu_seqlens_k: &D,
        ) -> Result<()>
        where
            Q: DevicePtr<T>,
            K: DevicePtr<T>,
            V: DevicePtr<T>,
            O: DevicePtrMut<T>,
            L: DevicePtrMut<f32>,
            C: DevicePtr<i32>,
            D: DevicePtr<i32>,
        {
            let (cq, ck) = (cu_seqlens_q, cu_seqlens_k);
            crate::varlen::with_checked_ptrs(stream, args, self.config.head_dim, "fp16", q, k, v, o, lse, cq, ck, |ptrs| {
                // SAFETY: lengths were checked against every row the shape names.
                // A modifier variant refuses a launch without its parameters (launch_varlen_raw).
                unsafe { self.launch_varlen_raw(stream, args, None, ptrs) }
            })
        }

        /// Launches a variable-length batch with raw device addresses.
        ///
        /// # Safety
        /// Each address must hold at least [`VarlenShape::required_lens`] elements (2-byte
        /// tensors, f32 LSE unless 0, int32 `cu_seqlens`) valid until the kernel finishes on
        /// `stream`, and the cumulative lengths on the device must pass
        /// [`VarlenShape::check_cu_seqlens`] for `args`. `mods` is required by a modifier
        /// variant (built by [`ModParams::for_varlen`] for this config and shape) and refused by
        /// the others.
        pub unsafe fn launch_varlen_raw(
            &self,
            stream: &Arc<CudaStream>,
            args: &VarlenShape,
            mods: Option<&ModParams>,
            ptrs: &VarlenPtrs,
        ) -> Result<()> {
            if !self.config.varlen {
                return Err(NativeError::InvalidArgs(format!(
                    "{} is not a variable-length variant (WgmmaConfig::varlen)",
                    self.config.name()
                )));
            }
            if mods.is_some() != self.config.mods.is_some() {
                return Err(NativeError::InvalidArgs(format!(
                    "{}: score-modifier parameters {} for this variant",
                    self.config.name(),
                    if mods.is_some() { "given" } else { "missing" }
                )));
            }
            self.config.validate()?;
            args.validate(self.config.head_dim)?;
            VarlenShape::check_ptrs(ptrs)?;
            let t = self.config.tile()?;
            let (params, vparams) = args.params(ptrs);
            let maps = self.maps.maps(&self.config.tma_specs_varlen(args, ptrs)?)?;
            let cfg = LaunchConfig {
                grid_dim: args.grid(t.block_m()),
                block_dim: (t.threads(), 1, 1),
                shared_mem_bytes: self.config.smem_bytes()?,
            };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            b.arg(&maps);
            b.arg(&vparams);
            if let Some(m) = mods {
                b.arg(m);
            }
            // SAFETY: the parameter structs match the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::Layout;

    #[test]
    fn configs_names_defines_and_smem() {
        // hd 128's table tile: TMA, 2 stages, 9 mbarriers.
        let c = WgmmaConfig::new(128).unwrap();
        assert_eq!(c.name(), "fwd_wgmma_f16_d128");
        assert_eq!(c.smem_bytes().unwrap(), 128 * 256 + 4 * 128 * 256 + 8 * 9 + 1024);
        assert_eq!(
            c.expected_instructions(),
            vec!["HGMMA.64x128x16.F32".to_string(), "UTMALDG.4D".into(), "USETMAXREG.DEALLOC.CTAPOOL".into()]
        );
        let d = c.defines().unwrap();
        assert!(d.contains(&("BLOCK_N".into(), "128".into())) && d.contains(&("KV_STAGES".into(), "2".into())));
        assert!(d.contains(&("PRODUCER_REGS".into(), "24".into())) && d.contains(&("CONSUMER_REGS".into(), "240".into())));
        // A forced tile: 3 stages, 13 mbarriers.
        let t3 = WgmmaConfig { head_dim: 64, tile: Some(WgmmaTile::new(128, 3)), mods: None, varlen: false };
        assert_eq!(t3.name(), "fwd_wgmma_f16_d64_w2n128_tma3");
        assert_eq!(t3.smem_bytes().unwrap(), 128 * 128 + 6 * 128 * 128 + 8 * 13 + 1024);
        assert!(t3.defines().unwrap().contains(&("KV_STAGES".into(), "3".into())));
        // 64 keys fit; 96 keys, 1 or 5 stages do not; four stages at hd 128 exceed shared memory.
        assert!(WgmmaConfig { head_dim: 128, tile: Some(WgmmaTile::new(64, 4)), mods: None, varlen: false }.validate().is_ok());
        for bad in [WgmmaTile::new(96, 2), WgmmaTile::new(128, 1), WgmmaTile::new(64, 5)] {
            assert!(WgmmaConfig { head_dim: 64, tile: Some(bad), mods: None, varlen: false }.validate().is_err(), "{bad:?}");
        }
        assert!(WgmmaConfig { head_dim: 128, tile: Some(WgmmaTile::new(128, 4)), mods: None, varlen: false }.validate().is_err());
        let c64 = WgmmaConfig::new(64).unwrap();
        assert_eq!(
            c64.expected_instructions(),
            vec![
                "HGMMA.64x128x16.F32".to_string(),
                "HGMMA.64x64x16.F32".into(),
                "UTMALDG.4D".into(),
                "USETMAXREG.DEALLOC.CTAPOOL".into()
            ]
        );
        assert!(matches!(WgmmaConfig::new(96), Err(NativeError::UnsupportedHeadDim { .. })));
        assert!(matches!(c.request(Arch::Sm90), Err(NativeError::UnsupportedConfig { .. })));
        let mut names: Vec<String> = WgmmaConfig::all().iter().map(|c| c.name()).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn modifier_variants_and_their_parameters() {
        let m = ModVariant { softcap: true, alibi: false };
        let c = WgmmaConfig::with_mods(128, m).unwrap();
        assert_eq!(c.name(), "fwd_wgmma_f16_d128_mods_softcap");
        let d = c.defines().unwrap();
        for (k, v) in [("MODS", "1"), ("MOD_SOFTCAP", "1"), ("MOD_ALIBI", "0")] {
            assert!(d.contains(&(k.into(), v.into())), "{k}={v} in {d:?}");
        }
        assert!(!WgmmaConfig::new(128).unwrap().defines().unwrap().iter().any(|(k, _)| k == "MODS"));
        // ModParams: 4 ints, 2 floats, two arrays of 128 floats.
        assert_eq!(std::mem::size_of::<ModParams>(), 4 * 4 + 2 * 4 + 2 * 4 * MOD_MAX_HEADS);
        let a = AttentionShape::contiguous(Layout::Bhsd, 1, 4, 2, 100, 300, 128, true);
        let slopes = [0.5f32, 0.25, 0.125, 0.0625];
        let sinks = [0.0f32, -1.0, f32::NEG_INFINITY, 2.0];
        let v = ModValues { top_left: false, left: Some(64), right: None, softcap: Some(30.0), alibi_slopes: None, sinks: Some(&sinks) };
        let p = ModParams::new(&c.name(), c.mods, &a, &v).unwrap();
        // Bottom-right: a(i) = i + 200; causal caps the unbounded right extent at 0.
        assert_eq!((p.offset, p.left, p.right), (200, 64, 0));
        assert!((p.cap_raw - 30.0 / a.scale).abs() < 1e-3 && (p.inv_cap_raw * p.cap_raw - 1.0).abs() < 1e-6);
        assert_eq!(p.sink_log2[1], -std::f32::consts::LOG2_E);
        assert_eq!((p.sink_log2[2], p.sink_log2[4]), (f32::NEG_INFINITY, f32::NEG_INFINITY));
        let tl = ModParams::new(&c.name(), c.mods, &AttentionShape { causal: false, ..a }, &ModValues { top_left: true, right: Some(7), ..v }).unwrap();
        assert_eq!((tl.offset, tl.right), (0, 7));
        // What the variant lacks or the values break is refused.
        let e = |v: &ModValues, c: &WgmmaConfig| ModParams::new(&c.name(), c.mods, &a, v).unwrap_err().to_string();
        assert!(e(&ModValues { softcap: None, ..v }, &c).contains("does not match"));
        assert!(e(&ModValues { alibi_slopes: Some(&slopes), ..v }, &c).contains("does not match"));
        assert!(e(&ModValues { softcap: Some(-1.0), ..v }, &c).contains("finite and positive"));
        assert!(e(&ModValues { sinks: Some(&sinks[..3]), ..v }, &c).contains("3 values for 4"));
        assert!(e(&v, &WgmmaConfig::new(128).unwrap()).contains("takes no score modifiers"));
        let alibi = WgmmaConfig::with_mods(128, ModVariant { softcap: false, alibi: true }).unwrap();
        let pa = ModParams::new(&alibi.name(), alibi.mods, &a, &ModValues { softcap: None, alibi_slopes: Some(&slopes), ..v }).unwrap();
        assert!((pa.alibi_raw[1] - 0.25 / a.scale).abs() < 1e-6 && pa.alibi_raw[4] == 0.0);
        let many = AttentionShape::contiguous(Layout::Bhsd, 1, 256, 256, 100, 300, 128, true);
        assert!(ModParams::new(&c.name(), c.mods, &many, &ModValues { sinks: None, ..v }).unwrap_err().to_string().contains("at most 128"));
        // Every modifier variant, dense and varlen, is compiled by the SASS tests (`all`).
        assert_eq!(WgmmaConfig::all().iter().filter(|c| c.mods.is_some() && !c.varlen).count(), 8);
        assert_eq!(WgmmaConfig::all().iter().filter(|c| c.mods.is_some() && c.varlen).count(), 8);
        // The alignment travels as a flag too (the varlen variants align per sequence).
        assert_eq!((p.top_left, tl.top_left), (0, 1));
    }

    #[test]
    fn varlen_variant_names_defines_and_tensor_maps() {
        let c = WgmmaConfig::varlen(128).unwrap();
        assert_eq!(c.name(), "fwd_wgmma_f16_d128_varlen");
        assert!(c.defines().unwrap().contains(&("VARLEN".into(), "1".into())));
        assert!(!WgmmaConfig::new(128).unwrap().defines().unwrap().iter().any(|(k, _)| k == "VARLEN"));
        assert_eq!(WgmmaConfig::all().iter().filter(|c| c.varlen && c.mods.is_none()).count(), 2);
        assert!(matches!(WgmmaConfig::varlen(80), Err(NativeError::UnsupportedHeadDim { .. })));
        // With score modifiers: both defines, both suffixes.
        let m = WgmmaConfig::varlen_with_mods(128, ModVariant { softcap: false, alibi: true }).unwrap();
        assert_eq!(m.name(), "fwd_wgmma_f16_d128_mods_alibi_varlen");
        let d = m.defines().unwrap();
        for (k, v) in [("VARLEN", "1"), ("MODS", "1"), ("MOD_SOFTCAP", "0"), ("MOD_ALIBI", "1")] {
            assert!(d.contains(&(k.into(), v.into())), "{k}={v} in {d:?}");
        }
        assert_eq!(m.tile().unwrap(), c.tile().unwrap());
        // Packed [total, heads, d]: maps over all rows of each tensor, batch extent 1.
        let a = VarlenShape::packed(3, 1000, 1200, 600, 700, 8, 2, 128, true);
        let ptrs = VarlenPtrs { q: 0x1000, k: 0x2000, v: 0x3000, o: 0x4000, lse: 0, cu_seqlens_q: 0x5000, cu_seqlens_k: 0x6000 };
        let [q, k, v] = c.tma_specs_varlen(&a, &ptrs).unwrap();
        assert_eq!((q.dims, q.box_dims), ([128, 1000, 8, 1], [64, 128, 1, 1]));
        assert_eq!((q.strides[0], q.strides[1]), (8 * 256, 256));
        assert_eq!((k.dims, k.strides[0], v.addr), ([128, 1200, 2, 1], 2 * 256, 0x3000));
        assert!(q.strides[2] % 16 == 0 && k.strides[2] % 16 == 0);
        // A head dim the variant does not have is refused before any map.
        let b = VarlenShape::packed(3, 1000, 1200, 600, 700, 8, 2, 64, true);
        assert!(matches!(c.tma_specs_varlen(&b, &ptrs), Err(NativeError::InvalidArgs(_))));
        // The modifier parameters of a varlen launch: no launch-wide offset (each sequence
        // aligns itself), the limits checked against the longest sequences.
        let (slopes, sinks) = ([0.25f32; 8], [0.5f32; 8]);
        let v = ModValues { top_left: false, left: Some(32), right: None, softcap: None, alibi_slopes: Some(&slopes), sinks: Some(&sinks) };
        let mp = ModParams::for_varlen(&m.name(), m.mods, &a, &v).unwrap();
        assert_eq!((mp.offset, mp.top_left, mp.left, mp.right), (0, 0, 32, 0));
        let tl = ModParams::for_varlen(&m.name(), m.mods, &VarlenShape { causal: false, ..a }, &ModValues { top_left: true, ..v }).unwrap();
        assert_eq!((tl.offset, tl.top_left, tl.right), (0, 1, MOD_UNBOUNDED));
        let long = VarlenShape { max_kv_len: 1 << 29, total_k: 1 << 29, ..a };
        assert!(ModParams::for_varlen(&m.name(), m.mods, &long, &v).unwrap_err().to_string().contains("2^29"));
        assert!(ModParams::for_varlen(&c.name(), c.mods, &a, &v).unwrap_err().to_string().contains("takes no score modifiers"));
    }

    #[test]
    fn only_hopper_runs_it() {
        assert_eq!(WgmmaConfig::target_for((9, 0)), Some(Arch::Sm90a));
        assert_eq!(WgmmaConfig::target_for((8, 0)), None);
        assert_eq!(WgmmaConfig::target_for((10, 0)), None);
    }

    #[test]
    fn params_layout_matches_the_kernel_struct() {
        // Same FwdParams as fwd_hmma.cu: 5 pointers + 12 strides (8 bytes) + 8 four-byte fields.
        assert_eq!(std::mem::size_of::<WgmmaParams>(), 17 * 8 + 8 * 4);
        assert_eq!(std::mem::align_of::<WgmmaParams>(), 8);
    }

    #[test]
    fn launch_shape_and_args() {
        let c = WgmmaConfig::new(128).unwrap();
        let a = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 1000, 128, true);
        c.validate_args(&a).unwrap();
        let shape = c.launch_shape(&a).unwrap();
        assert_eq!((shape.grid, shape.block, shape.smem_bytes), ((8, 8, 2), (384, 1, 1), c.smem_bytes().unwrap()));
        // Tensor maps: Q boxes of 128 rows, K/V of 128 keys, 64 halves wide, 128B swizzle.
        let [q, k, v] = c.tma_specs(&a, [0x1000, 0x2000, 0x3000, 0x4000, 0x5000]).unwrap();
        assert_eq!((q.dims, q.strides, q.box_dims), ([128, 1000, 8, 2], [256, 256_000, 2_048_000], [64, 128, 1, 1]));
        assert_eq!((k.dims, v.addr, v.swizzle_bytes), ([128, 1000, 2, 2], 0x3000, 128));
        let mut b = a;
        b.q.seq = 132;
        assert!(c.validate_args(&b).is_err());
    }

    /// Tensors above 2^31 elements: each map is rank 4 `(dim, seq, head, batch)` with 64-bit
    /// byte strides, so a box's coordinates are (column, row, head, batch), each far inside
    /// TMA's signed 32-bit coordinates (rows up to `MAX_SEQ_LEN`), whatever the tensor spans.
    #[test]
    fn tensor_maps_of_tensors_above_2_pow_31_elements() {
        let c = WgmmaConfig::new(128).unwrap();
        // Q: 1 x 32 x 600k x 128 (2.46e9 elements, 4.9 GB).
        let a = AttentionShape::contiguous(Layout::Bhsd, 1, 32, 8, 600_000, 256, 128, false);
        let [q, k, _] = c.tma_specs(&a, [0x1000, 0x2000, 0x3000, 0x4000, 0x5000]).unwrap();
        assert_eq!((q.dims, q.strides), ([128, 600_000, 32, 1], [256, 600_000 * 256, 32 * 600_000 * 256]));
        assert!(q.strides[2] > u32::MAX as u64);
        assert_eq!(k.dims, [128, 256, 8, 1]);
        // BSHD K/V: 2 x 2.2M keys x 8 heads x 128 (4.5e9 elements each).
        let b = AttentionShape::contiguous(Layout::Bshd, 2, 32, 8, 128, 2_200_000, 128, true);
        let [_, k, v] = c.tma_specs(&b, [0x1000, 0x2000, 0x3000, 0x4000, 0x5000]).unwrap();
        assert_eq!((k.dims, k.strides), ([128, 2_200_000, 8, 2], [8 * 256, 256, 2_200_000 * 8 * 256]));
        assert_eq!(v.strides, k.strides);
        // The longest sequence the kernel takes is a box row coordinate TMA can address.
        assert!(crate::hmma::MAX_SEQ_LEN < i32::MAX as usize);
        // TMA's byte strides stop below 2^40 (a batch stride of 2^39 elements): refused with a
        // typed error, never encoded wrapped.
        let mut far = a;
        far.batch = 2;
        far.q.batch = 1 << 39;
        assert!(matches!(c.tma_specs(&far, [0x1000, 0x2000, 0x3000, 0x4000, 0x5000]), Err(NativeError::InvalidArgs(m)) if m.contains("below 2^40")));
    }
}
