//! The NVFP4 forward family (`cuda/fwd_nvfp4.cu`) for consumer Blackwell (sm_120a, compute
//! capability 12.0): Q·Kᵀ on the block-scaled `mma.sync ... kind::mxf4nvf4.block_scale
//! .scale_vec::4X.m16n8k64` (SASS `OMMA.SF.16864`), f32 online softmax, P·V on f16/bf16
//! `mma.sync` with V in 16 bits ([`PvMode::Half`]) or on the block-scaled MMA with P and V in
//! NVFP4 along the keys ([`PvMode::Fp4`]). Inputs are the NVFP4 prepass's outputs
//! ([`crate::nvfp4_quant`]); a producer warp feeds a 3-stage K/V ring with bulk copies, four
//! consumer warps run the MMAs and the softmax.
//!
//! **Compiled and disassembled, not run on hardware.** No sm_120 device has run it: CI
//! compiles every variant for sm_120a with NVRTC and checks the SASS (the `OMMA.SF` instruction,
//! the HMMAs of P·V, no spill, shared memory within 99 KB); the fragment and scale-byte layout of
//! the block-scaled MMA is [`lanes`], which the facade's `tests/nvfp4_mma_emulation.rs` drives
//! through this kernel's tile order against the f64 reference and quattn's NVFP4 emulation.
//! [`Nvfp4Config::target_for`] is `Some` only for compute capability 12.0.

use crate::arch::Arch;
use crate::cache::{CompileRequest, FWD_NVFP4};
use crate::error::{NativeError, Result};
use crate::report::KernelVariant;

const KERNEL: &str = "fwd_nvfp4";

/// Query rows per CTA (four consumer warps of 16 rows).
pub const BLOCK_Q: u32 = 64;
/// Keys per K/V tile: one m16n8k64 k-step for the FP4 P·V.
pub const BLOCK_K: u32 = 64;
/// Depth of the K/V ring.
pub const STAGES: u32 = 3;
/// Threads per CTA: four consumer warps and one producer warp.
pub const THREADS: u32 = 160;
/// The conditional-rescale threshold (log2 units) of the [`Nvfp4Config::rescale`] variants:
/// P stays below 2^8, which f16 and bf16 hold with their full relative precision.
pub const RESCALE_LOG2: u32 = 8;

/// How P·V is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PvMode {
    /// V in f16 (`bf16: false`) or bf16, P rounded to the same type, f32 accumulation (HMMA).
    Half { bf16: bool },
    /// P in NVFP4 per 16 keys (tensor scale 1/2688), V in NVFP4 per 16 keys of a channel
    /// (the prepass's Vᵀ), the block-scaled MMA; O in f16.
    Fp4,
}

/// One compiled variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Nvfp4Config {
    pub head_dim: u32,
    pub pv: PvMode,
    /// FA4's conditional rescale (threshold [`RESCALE_LOG2`]); not with [`PvMode::Fp4`], whose
    /// P quantization assumes p ≤ 1.
    pub rescale: bool,
    /// Every `exp2_poly`-th score of a lane through the cubic polynomial on the FMA pipes (0:
    /// all on MUFU.EX2).
    pub exp2_poly: u32,
}

impl Nvfp4Config {
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];
    /// The block-scaled `mma.sync` exists on the `a` target of compute capability 12.0 only.
    pub const TARGETS: &'static [Arch] = &[Arch::Sm120a];

    pub fn new(head_dim: usize, pv: PvMode, rescale: bool, exp2_poly: u32) -> Result<Self> {
        let c = Nvfp4Config { head_dim: head_dim as u32, pv, rescale, exp2_poly };
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<()> {
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return Err(NativeError::UnsupportedHeadDim {
                kernel: KERNEL,
                head_dim: self.head_dim as usize,
                supported: Self::HEAD_DIMS,
            });
        }
        if self.pv == PvMode::Fp4 && self.rescale {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: "FP4 P is quantized with the fixed tensor scale of p <= 1; the conditional rescale lets p reach 2^8".into(),
            });
        }
        if self.exp2_poly > 8 {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("exp2_poly {} > 8", self.exp2_poly) });
        }
        Ok(())
    }

    /// `fwd_nvfp4_{f16|bf16|fp4}[_rs][_poly{k}]_d{hd}`.
    pub fn name(&self) -> String {
        let pv = match self.pv {
            PvMode::Half { bf16: false } => "f16",
            PvMode::Half { bf16: true } => "bf16",
            PvMode::Fp4 => "fp4",
        };
        let rs = if self.rescale { "_rs" } else { "" };
        let poly = if self.exp2_poly > 0 { format!("_poly{}", self.exp2_poly) } else { String::new() };
        format!("{KERNEL}_{pv}{rs}{poly}_d{}", self.head_dim)
    }

    /// The report's variants: every P·V mode at both head dims in the emulation's order (no
    /// rescale, MUFU exp2), plus the FA4 options (conditional rescale, polynomial exp2 on every
    /// second score) on the bf16 variant.
    pub fn all() -> Vec<Nvfp4Config> {
        let mut v = Vec::new();
        for head_dim in [64, 128] {
            for pv in [PvMode::Half { bf16: false }, PvMode::Half { bf16: true }, PvMode::Fp4] {
                v.push(Nvfp4Config { head_dim, pv, rescale: false, exp2_poly: 0 });
            }
            v.push(Nvfp4Config { head_dim, pv: PvMode::Half { bf16: true }, rescale: true, exp2_poly: 2 });
        }
        v
    }

    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    /// True only for compute capability 12.0.
    pub fn supported(cc: (u32, u32)) -> bool {
        Self::target_for(cc).is_some()
    }

    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        Ok(vec![
            d("HEAD_DIM", self.head_dim),
            d("BLOCK_K", BLOCK_K),
            d("STAGES", STAGES),
            d("VDTYPE", matches!(self.pv, PvMode::Half { bf16: true }) as u32),
            d("PV_MODE", (self.pv == PvMode::Fp4) as u32),
            d("RESCALE_LOG2", if self.rescale { RESCALE_LOG2 } else { 0 }),
            d("EXP2_POLY", self.exp2_poly),
        ])
    }

    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        if !Self::TARGETS.contains(&arch) {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("the block-scaled mma.sync needs sm_120a, not {arch}"),
            });
        }
        Ok(CompileRequest { kernel: self.name(), source: &FWD_NVFP4, arch, defines: self.defines()? })
    }

    /// Dynamic shared memory, mirror of `cfg::SMEM_BYTES`: STAGES × (K codes in padded rows,
    /// K scales, V rows padded, FP4 V scales) plus the full/empty mbarriers.
    pub fn smem_bytes(&self) -> u32 {
        let d = self.head_dim;
        let k = BLOCK_K * (d / 2 + 16);
        let ks = BLOCK_K * (d / 16);
        let (v, vs) = match self.pv {
            PvMode::Half { .. } => (BLOCK_K * (2 * d + 16), 0),
            PvMode::Fp4 => (d * (BLOCK_K / 2 + 16), d * (BLOCK_K / 16)),
        };
        STAGES * (k + ks + v + vs) + 2 * STAGES * 8
    }

    /// SASS opcodes that must appear on sm_120a: the block-scaled E2M1 MMA and, for 16-bit P·V,
    /// the f16 / bf16 HMMA with f32 accumulation.
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        let omma = "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X";
        match self.pv {
            PvMode::Half { bf16: false } => vec![omma, "HMMA.16816.F32"],
            PvMode::Half { bf16: true } => vec![omma, "HMMA.16816.F32.BF16"],
            PvMode::Fp4 => vec![omma],
        }
    }

    /// Block-scaled MMAs per K/V tile per consumer warp: Q·Kᵀ is 8 n-tiles × head_dim / 64
    /// k-steps; FP4 P·V adds head_dim / 8 n-tiles of one k-step.
    pub fn omma_per_tile(&self) -> u32 {
        let qk = (BLOCK_K / 8) * (self.head_dim / 64);
        qk + if self.pv == PvMode::Fp4 { self.head_dim / 8 } else { 0 }
    }

    /// HMMAs per K/V tile per consumer warp (16-bit P·V: BLOCK_K / 16 k-steps × head_dim / 8).
    pub fn hmma_per_tile(&self) -> u32 {
        match self.pv {
            PvMode::Half { .. } => (BLOCK_K / 16) * (self.head_dim / 8),
            PvMode::Fp4 => 0,
        }
    }
}

impl KernelVariant for Nvfp4Config {
    fn name(&self) -> String {
        Nvfp4Config::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Nvfp4Config::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        Nvfp4Config::expected_instructions(self).into_iter().map(String::from).collect()
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        self.smem_bytes()
    }
}

/// Mirror of `Nvfp4FwdParams` in `fwd_nvfp4.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Nvfp4Params {
    pub q_codes: u64,
    pub q_scales: u64,
    pub k_codes: u64,
    pub k_scales: u64,
    pub q_ts: u64,
    pub k_ts: u64,
    pub v: u64,
    pub v_scales: u64,
    pub v_ts: u64,
    pub o: u64,
    pub lse: u64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_seq_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_seq_stride: i64,
    pub q_len: i32,
    pub kv_len: i32,
    pub q_heads: i32,
    pub kv_group: i32,
    pub causal: i32,
    pub kv_pad: i32,
    pub scale_log2: f32,
    pub scale_nat: f32,
}

/// Device pointers of one launch (prepass outputs, V, O, LSE; `v_scales` / `v_ts` for
/// [`PvMode::Fp4`] only, `lse` 0 for none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvfp4Ptrs {
    pub q_codes: u64,
    pub q_scales: u64,
    pub k_codes: u64,
    pub k_scales: u64,
    pub q_ts: u64,
    pub k_ts: u64,
    pub v: u64,
    pub v_scales: u64,
    pub v_ts: u64,
    pub o: u64,
    pub lse: u64,
}

impl Nvfp4Config {
    /// Checks a launch shape: this head dim for Q, K and V, GQA, 16-byte rows of V and O.
    pub fn validate_args(&self, s: &quattn_core::AttentionShape) -> Result<()> {
        self.validate()?;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        if s.head_dim != self.head_dim as usize || s.v_head_dim != s.head_dim {
            return bad(format!("head dims {} / {} for a kernel of head dim {}", s.head_dim, s.v_head_dim, self.head_dim));
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 || s.kv_len == 0 {
            return bad(format!("empty problem: {s:?}"));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", s.q_heads, s.kv_heads));
        }
        if s.q_len > i32::MAX as usize / 2 || s.kv_len > i32::MAX as usize / 2 || s.q_heads > 65535 || s.batch > 65535 {
            return bad(format!("shape exceeds the kernel's i32 / grid limits: {s:?}"));
        }
        crate::hmma::check_strides("v", &s.v, 8)?;
        crate::hmma::check_strides("o", &s.o, 8)
    }

    /// Grid `(query blocks, q_heads, batch)`.
    pub fn grid(&self, s: &quattn_core::AttentionShape) -> (u32, u32, u32) {
        (s.q_len.div_ceil(BLOCK_Q as usize) as u32, s.q_heads as u32, s.batch as u32)
    }

    /// Kernel parameters (shape as checked by [`Self::validate_args`]).
    pub fn params(&self, s: &quattn_core::AttentionShape, ptrs: Nvfp4Ptrs) -> Nvfp4Params {
        let [v, o] = [s.v, s.o].map(|x| x.to_array().map(|y| y as i64));
        Nvfp4Params {
            q_codes: ptrs.q_codes,
            q_scales: ptrs.q_scales,
            k_codes: ptrs.k_codes,
            k_scales: ptrs.k_scales,
            q_ts: ptrs.q_ts,
            k_ts: ptrs.k_ts,
            v: ptrs.v,
            v_scales: ptrs.v_scales,
            v_ts: ptrs.v_ts,
            o: ptrs.o,
            lse: ptrs.lse,
            v_batch_stride: v[0],
            v_head_stride: v[1],
            v_seq_stride: v[2],
            o_batch_stride: o[0],
            o_head_stride: o[1],
            o_seq_stride: o[2],
            q_len: s.q_len as i32,
            kv_len: s.kv_len as i32,
            q_heads: s.q_heads as i32,
            kv_group: (s.q_heads / s.kv_heads) as i32,
            causal: s.causal as i32,
            kv_pad: s.kv_len.div_ceil(BLOCK_K as usize) as i32 * BLOCK_K as i32,
            scale_log2: s.scale * std::f32::consts::LOG2_E,
            scale_nat: s.scale,
        }
    }
}

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::KernelCache;

    // SAFETY: #[repr(C)] plain-old-data mirror of the kernel's by-value parameter struct.
    unsafe impl DeviceRepr for Nvfp4Params {}

    /// A loaded variant. Loading fails with [`NativeError::UnsupportedArch`] on every device
    /// but compute capability 12.0.
    #[derive(Debug)]
    pub struct Nvfp4Kernel {
        config: Nvfp4Config,
        function: CudaFunction,
    }

    impl Nvfp4Kernel {
        pub fn load(ctx: &Arc<CudaContext>, config: Nvfp4Config) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm120a, Nvfp4Config::target_for)?;
            let (function, _) =
                crate::device::load_function(ctx, KernelCache::global(), &config.request(arch)?, config.smem_bytes())?;
            Ok(Nvfp4Kernel { config, function })
        }

        pub fn config(&self) -> &Nvfp4Config {
            &self.config
        }

        /// Enqueues one forward on `stream`.
        ///
        /// # Safety
        /// The pointers must address the prepass outputs of this shape (codes, scales, tensor
        /// scales), V and O with the shape's strides in the variant's 16-bit type, and the LSE
        /// (`batch · q_heads · q_len` f32) when non-zero, valid until the kernel finishes.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, s: &quattn_core::AttentionShape, ptrs: Nvfp4Ptrs) -> Result<()> {
            self.config.validate_args(s)?;
            let params = self.config.params(s, ptrs);
            let cfg = LaunchConfig { grid_dim: self.config.grid(s), block_dim: (THREADS, 1, 1), shared_mem_bytes: self.config.smem_bytes() };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::Nvfp4Kernel;

/// The fragment layout of `mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64
/// .row.col.f32.e2m1.e2m1.f32.ue4m3` with scale selectors `{byte 0, thread 0}` (PTX ISA,
/// "warp-level matrix instructions with block scaling"), as plain functions of the lane: the
/// CPU side of the kernel's index math. Lane `l = 4g + t`.
pub mod lanes {
    /// Elements a lane holds per A register (eight E2M1 codes in a `.b32`).
    pub const PER_REG: usize = 8;

    /// (row, first k) of A register `i` (0..4) of lane `lane`: the register holds k .. k + 7,
    /// element `k + j` in nibble `j`.
    pub fn a_reg(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        (g + 8 * (i & 1), 8 * t + 32 * (i >> 1))
    }

    /// (col, first k) of B register `i` (0..2) of lane `lane`.
    pub fn b_reg(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        (g, 8 * t + 32 * i)
    }

    /// (row, col) of accumulator element `i` (0..4) of lane `lane`.
    pub fn c_elem(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        (g + 8 * (i >> 1), 2 * t + (i & 1))
    }

    /// The A row whose four scale bytes lane `lane` supplies (thread selector 0: lanes 4g and
    /// 4g + 1 of each quad), or `None` when the MMA ignores the lane's register.
    pub fn a_scale_row(lane: usize) -> Option<usize> {
        match lane % 4 {
            0 => Some(lane / 4),
            1 => Some(lane / 4 + 8),
            _ => None,
        }
    }

    /// The B column whose four scale bytes lane `lane` supplies (lane 4g), else `None`.
    pub fn b_scale_col(lane: usize) -> Option<usize> {
        (lane % 4 == 0).then_some(lane / 4)
    }

    /// Byte `j` of a scale register scales k `16j .. 16j + 15`.
    pub fn scale_byte_of_k(k: usize) -> usize {
        k / 16
    }

    /// Byte offsets, in the prepass layout (`head_dim / 2` code bytes per row), of A register
    /// `i` of lane `lane` for k-step `step` relative to row `row0`: what the kernel loads.
    pub fn a_code_offset(lane: usize, i: usize, step: usize, head_dim: usize, row0: usize) -> usize {
        let (r, k) = a_reg(lane, i);
        (row0 + r) * head_dim / 2 + (64 * step + k) / 2
    }

    /// Byte offset of the four scale bytes of row `row` for k-step `step` (prepass layout,
    /// `head_dim / 16` bytes per row).
    pub fn scale_offset(row: usize, step: usize, head_dim: usize) -> usize {
        row * head_dim / 16 + 4 * step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_validate_and_fit_shared_memory() {
        for c in Nvfp4Config::all() {
            c.validate().unwrap();
            assert!(c.smem_bytes() <= 99 * 1024, "{}: {}", c.name(), c.smem_bytes());
            assert!(c.name().starts_with(KERNEL));
        }
        assert_eq!(Nvfp4Config::new(128, PvMode::Half { bf16: false }, false, 0).unwrap().smem_bytes(), 3 * (5120 + 512 + 17408) + 48);
        assert!(matches!(Nvfp4Config::new(96, PvMode::Fp4, false, 0), Err(NativeError::UnsupportedHeadDim { .. })));
        assert!(matches!(Nvfp4Config::new(128, PvMode::Fp4, true, 0), Err(NativeError::UnsupportedConfig { .. })));
        assert!(Nvfp4Config::supported((12, 0)));
        assert!(!Nvfp4Config::supported((9, 0)) && !Nvfp4Config::supported((10, 0)) && !Nvfp4Config::supported((8, 9)));
        let c = Nvfp4Config::new(64, PvMode::Half { bf16: true }, true, 2).unwrap();
        assert_eq!(c.name(), "fwd_nvfp4_bf16_rs_poly2_d64");
        assert!(c.request(Arch::Sm90a).is_err());
        let defs = c.defines().unwrap();
        assert!(defs.contains(&("RESCALE_LOG2".into(), "8".into())) && defs.contains(&("VDTYPE".into(), "1".into())));
    }

    #[test]
    fn lane_layout_covers_each_operand_element_once() {
        // A: 16 x 64 codes, four registers of eight per lane.
        let mut a = vec![0u8; 16 * 64];
        let mut b = vec![0u8; 8 * 64];
        let mut c = vec![0u8; 16 * 8];
        for lane in 0..32 {
            for i in 0..4 {
                let (r, k) = lanes::a_reg(lane, i);
                for j in 0..lanes::PER_REG {
                    a[r * 64 + k + j] += 1;
                }
                let (r, col) = lanes::c_elem(lane, i);
                c[r * 8 + col] += 1;
            }
            for i in 0..2 {
                let (col, k) = lanes::b_reg(lane, i);
                for j in 0..lanes::PER_REG {
                    b[col * 64 + k + j] += 1;
                }
            }
        }
        assert!(a.iter().chain(&b).chain(&c).all(|&n| n == 1));
        // Scales: every A row and B column supplied by exactly one lane.
        let rows: Vec<usize> = (0..32).filter_map(lanes::a_scale_row).collect();
        let mut sorted = rows.clone();
        sorted.sort();
        assert_eq!(sorted, (0..16).collect::<Vec<_>>());
        let cols: Vec<usize> = (0..32).filter_map(lanes::b_scale_col).collect();
        assert_eq!(cols, (0..8).collect::<Vec<_>>());
        // A register's eight elements share one scale byte (blocks of 16 are whole).
        for lane in 0..32 {
            for i in 0..4 {
                let (_, k) = lanes::a_reg(lane, i);
                assert_eq!(lanes::scale_byte_of_k(k), lanes::scale_byte_of_k(k + 7));
            }
        }
        // The kernel's load offsets: lane 4·3 + 2 = 14, register 2 (row 3, k 48), k-step 1 of
        // head dim 128, rows from 16: byte (16 + 3)·64 + (64 + 48)/2.
        assert_eq!(lanes::a_code_offset(14, 2, 1, 128, 16), 19 * 64 + 56);
        assert_eq!(lanes::scale_offset(19, 1, 128), 19 * 8 + 4);
    }

    #[test]
    fn mma_counts_per_tile() {
        let f16 = Nvfp4Config::new(128, PvMode::Half { bf16: false }, false, 0).unwrap();
        assert_eq!((f16.omma_per_tile(), f16.hmma_per_tile()), (16, 64));
        let fp4 = Nvfp4Config::new(128, PvMode::Fp4, false, 0).unwrap();
        assert_eq!((fp4.omma_per_tile(), fp4.hmma_per_tile()), (32, 0));
    }
}
