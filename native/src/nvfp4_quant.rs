//! The 4-bit quantization prepass (`cuda/nvfp4_quant.cu`): one attention input (Q or K, f16 or
//! bf16 with strides) to NVFP4 (E2M1 codes, one UE4M3 scale per 16 elements along the head dim,
//! one f32 tensor scale) or MXFP4 (one E8M0 scale per 32), on the caller's stream. The recipe is
//! quattn's `codec::nvfp4` / `codec::mxfp4` bit for bit; [`host`] is the same recipe on the CPU,
//! which the facade's tests hold equal to the codec and the GPU check holds equal to the kernel.
//!
//! # Output layout
//! Rows in `(batch, head, seq)` order whatever the source strides (a contiguous BHSD tensor's
//! row order), `rows = batch · heads · seq`:
//! * codes: `[rows, head_dim / 2]` bytes, element `2i` of a row in the low nibble of byte `i`
//!   (the codec's packing);
//! * scales: `[rows, head_dim / block]` bytes (the codec's `block_scales` / `scales`);
//! * NVFP4 only: the tensor scale, one f32.
//!
//! This is also the layout the sm_120a block-scaled MMA (`kind::mxf4nvf4`, m16n8k64) consumes
//! without any swizzle: for one 64-element k-step of one row, the A or B operand register of
//! lane `4g + t` is the little-endian u32 at byte `16·c + 4t` / `16·c + 16 + 4t` of the 32 code
//! bytes, and the `scale_vec::4X` scale operand is the little-endian u32 of that row's four
//! scale bytes at `4·step` (byte `j` scales elements `16j .. 16j + 15`), see
//! [`crate::nvfp4::lanes`]. The 128×4 "swizzled" scale-factor atoms of CUTLASS's sm100/sm120
//! GEMMs exist for TMA tiles of many rows per scale load; a flash-attention kernel that loads a
//! K tile row by row needs none, so no conversion pass exists. A caller holding codes in another
//! layout reorders once on its side ([`host::rows_from_strided`] is that reordering on the CPU).
//!
//! NVFP4 takes two launches (amax over the tensor, then quantize); MXFP4 one.

use quattn_core::{Dtype, Strides};

use crate::arch::Arch;
use crate::cache::{CompileRequest, NVFP4_QUANT};
use crate::error::{NativeError, Result};
use crate::report::KernelVariant;

const KERNEL: &str = "nvfp4_quant";
/// Threads per CTA, one per scale block (mirror of `THREADS`).
pub const THREADS: u32 = 256;
/// Largest grid of the NVFP4 amax pass, a grid-stride loop with one atomic per CTA (mirror of
/// `AMAX_CTAS`).
pub const AMAX_CTAS: u32 = 1024;

/// The 4-bit block-scaled format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp4Format {
    /// UE4M3 scale per 16 elements and an f32 tensor scale.
    Nvfp4,
    /// E8M0 (power-of-two) scale per 32 elements.
    Mxfp4,
}

impl Fp4Format {
    /// Elements per scale.
    pub const fn block(self) -> usize {
        match self {
            Fp4Format::Nvfp4 => 16,
            Fp4Format::Mxfp4 => 32,
        }
    }
    fn tag(self) -> &'static str {
        match self {
            Fp4Format::Nvfp4 => "nvfp4",
            Fp4Format::Mxfp4 => "mxfp4",
        }
    }
}

/// One compiled variant: everything that changes the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Nvfp4QuantConfig {
    pub head_dim: u32,
    pub format: Fp4Format,
    /// Source element type: f16 or bf16.
    pub dtype: Dtype,
    /// Write Vᵀ (rows (batch, head, channel), [`VT_PAD`]-padded keys, blocks along the keys):
    /// the V operand of the sm_120a kernel's FP4 P·V.
    pub vt: bool,
}

/// Keys per Vᵀ row are padded to a multiple of this (the attention kernel's K/V tile).
pub const VT_PAD: usize = 64;

impl Nvfp4QuantConfig {
    /// Plain CUDA (no tensor-core or arch-specific instruction): every target of the project.
    pub const TARGETS: &'static [Arch] =
        &[Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90, Arch::Sm100a, Arch::Sm120a];

    pub fn new(head_dim: usize, format: Fp4Format, dtype: Dtype) -> Result<Self> {
        let c = Nvfp4QuantConfig { head_dim: head_dim as u32, format, dtype, vt: false };
        c.validate()?;
        Ok(c)
    }

    /// Head dim a multiple of 32 in 32..=256 (whole 16-byte loads of whole blocks), 16-bit source.
    pub fn validate(&self) -> Result<()> {
        if !self.head_dim.is_multiple_of(32) || !(32..=256).contains(&self.head_dim) {
            return Err(NativeError::UnsupportedHeadDim {
                kernel: KERNEL,
                head_dim: self.head_dim as usize,
                supported: &[32, 64, 96, 128, 160, 192, 224, 256],
            });
        }
        if !matches!(self.dtype, Dtype::F16 | Dtype::Bf16) {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("source must be f16 or bf16, not {:?}", self.dtype),
            });
        }
        Ok(())
    }

    /// The Vᵀ variant of this config.
    pub fn transposed(self) -> Self {
        Nvfp4QuantConfig { vt: true, ..self }
    }

    /// `nvfp4_quant_{nvfp4|mxfp4}_{f16|bf16}[_vt]_d{hd}`.
    pub fn name(&self) -> String {
        let dt = if self.dtype == Dtype::Bf16 { "bf16" } else { "f16" };
        let vt = if self.vt { "_vt" } else { "" };
        format!("{KERNEL}_{}_{dt}{vt}_d{}", self.format.tag(), self.head_dim)
    }

    /// The report's variants: both formats and source types at head dims 64 and 128, and the
    /// f16 NVFP4 Vᵀ of the FP4 P·V kernel (its inputs are f16).
    pub fn all() -> Vec<Nvfp4QuantConfig> {
        let mut v = Vec::new();
        for head_dim in [64, 128] {
            for format in [Fp4Format::Nvfp4, Fp4Format::Mxfp4] {
                for dtype in [Dtype::F16, Dtype::Bf16] {
                    v.push(Nvfp4QuantConfig { head_dim, format, dtype, vt: false });
                }
            }
            v.push(Nvfp4QuantConfig { head_dim, format: Fp4Format::Nvfp4, dtype: Dtype::F16, vt: true });
        }
        v
    }

    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        self.validate()?;
        if !Self::TARGETS.contains(&arch) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("no {arch} target") });
        }
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        Ok(CompileRequest {
            kernel: self.name(),
            source: &NVFP4_QUANT,
            arch,
            defines: vec![
                d("HEAD_DIM", self.head_dim),
                d("FORMAT", (self.format == Fp4Format::Mxfp4) as u32),
                d("DTYPE", (self.dtype == Dtype::Bf16) as u32),
                d("VT", self.vt as u32),
            ],
        })
    }

    /// Byte counts of codes and scales for a source of `batch · heads` heads of `seq` rows.
    pub fn output_lens(&self, batch: usize, heads: usize, seq: usize) -> (usize, usize) {
        let n = self.output_elems(batch, heads, seq);
        (n / 2, n / self.format.block())
    }

    /// Elements (codes) of the output: the source's, or Vᵀ's with padded keys.
    fn output_elems(&self, batch: usize, heads: usize, seq: usize) -> usize {
        let d = self.head_dim as usize;
        if self.vt {
            batch * heads * d * seq.div_ceil(VT_PAD) * VT_PAD
        } else {
            batch * heads * seq * d
        }
    }

    /// Checks a source tensor of `batch × heads × seq` rows with `strides` (elements).
    pub fn validate_source(&self, batch: usize, heads: usize, seq: usize, strides: &Strides) -> Result<()> {
        self.validate()?;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        let rows = batch.checked_mul(heads).and_then(|x| x.checked_mul(seq));
        match rows {
            None | Some(0) => return bad(format!("empty or oversized source {batch}x{heads}x{seq}")),
            // The kernel's block index and the amax pass's grid stride stay within i32.
            Some(r)
                if r.saturating_mul(self.head_dim as usize / self.format.block())
                    > (i32::MAX as usize - (AMAX_CTAS * THREADS) as usize)
                    || self.output_elems(batch, heads, seq) / self.format.block() > i32::MAX as usize / 2 =>
            {
                return bad(format!("{r} rows exceed the i32 block index"))
            }
            _ => {}
        }
        // 16-byte loads of 8 elements.
        crate::hmma::check_strides("source", strides, 8)
    }

    /// Kernel parameters of one launch.
    #[allow(clippy::too_many_arguments)]
    pub fn params(
        &self,
        mode: u32,
        batch: usize,
        heads: usize,
        seq: usize,
        strides: &Strides,
        ptrs: Nvfp4QuantPtrs,
    ) -> Nvfp4QuantParams {
        Nvfp4QuantParams {
            src: ptrs.src,
            codes: ptrs.codes,
            scales: ptrs.scales,
            amax: ptrs.amax,
            tensor_scale: ptrs.tensor_scale,
            batch_stride: strides.batch as i64,
            head_stride: strides.head as i64,
            seq_stride: strides.seq as i64,
            heads: heads as i32,
            seq_len: seq as i32,
            rows: (batch * heads * seq) as i32,
            mode: mode as i32,
        }
    }

    /// Grid of the quantize launch: one thread per output scale block.
    pub fn grid(&self, batch: usize, heads: usize, seq: usize) -> u32 {
        (self.output_elems(batch, heads, seq) / self.format.block()).div_ceil(THREADS as usize) as u32
    }

    /// Grid of the amax launch: a grid-stride loop over the source's blocks.
    pub fn amax_grid(&self, batch: usize, heads: usize, seq: usize) -> u32 {
        let blocks = batch * heads * seq * self.head_dim as usize / self.format.block();
        (blocks.div_ceil(THREADS as usize) as u32).min(AMAX_CTAS)
    }
}

/// Device pointers of one launch (`amax` and `tensor_scale` unused by MXFP4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvfp4QuantPtrs {
    pub src: u64,
    pub codes: u64,
    pub scales: u64,
    /// One u32, zeroed by the launcher before the amax pass.
    pub amax: u64,
    pub tensor_scale: u64,
}

/// Mirror of `Nvfp4QuantParams` in `nvfp4_quant.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvfp4QuantParams {
    pub src: u64,
    pub codes: u64,
    pub scales: u64,
    pub amax: u64,
    pub tensor_scale: u64,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub seq_stride: i64,
    pub heads: i32,
    pub seq_len: i32,
    pub rows: i32,
    pub mode: i32,
}

impl KernelVariant for Nvfp4QuantConfig {
    fn name(&self) -> String {
        Nvfp4QuantConfig::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Nvfp4QuantConfig::request(self, arch)
    }
    /// The rounding conversion of every E2M1 / scale code (`rintf` then the cast: one
    /// `F2I.U32.NTZ`) and, for NVFP4, the amax reduction (`atomicMax` with its result unused:
    /// `RED` before sm_90, `REDG` from sm_90 on). No matrix instruction may appear.
    fn expected_instructions(&self, arch: Arch) -> Vec<String> {
        let mut v = vec!["F2I.U32.NTZ".to_string()];
        if self.format == Fp4Format::Nvfp4 {
            let red = if arch.compute_capability().0 >= 9 { "REDG" } else { "RED" };
            v.push(format!("{red}.E.MAX.STRONG.GPU"));
        }
        v
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        0
    }
}

/// The prepass recipe on the CPU, operation for operation (the kernel's reference in the GPU
/// check, and held equal to quattn's codec by the facade's tests).
pub mod host {
    use super::Fp4Format;

    /// What the prepass writes for one tensor.
    #[derive(Clone, Debug, PartialEq)]
    pub struct Quantized {
        pub codes: Vec<u8>,
        pub scales: Vec<u8>,
        /// NVFP4's tensor scale (1 for MXFP4, which has none).
        pub tensor_scale: f32,
    }

    /// `2^e` for `e` in `[-149, 127]`, exact.
    fn pow2(e: i32) -> f32 {
        if e >= -126 {
            f32::from_bits(((e + 127) as u32) << 23)
        } else {
            f32::from_bits(1u32 << (e + 149))
        }
    }

    fn encode_magnitude(a: f32, man_bits: i32, bias: i32) -> u32 {
        if a == 0.0 {
            return 0;
        }
        let emin = 1 - bias;
        let exp_field = (a.to_bits() >> 23) as i32;
        let e = if exp_field == 0 { emin - 1 } else { exp_field - 127 };
        let e_eff = e.max(emin);
        let n = (a * pow2(man_bits - e_eff)).round_ties_even() as u32;
        (((e_eff + bias - 1) as u32) << man_bits) + n
    }

    /// E2M1 code, saturating (sign from the sign bit).
    pub fn e2m1_encode(x: f32) -> u8 {
        let sign = ((x.to_bits() >> 31) << 3) as u8;
        let a = x.abs();
        if !(a <= f32::MAX) {
            return sign | 7;
        }
        sign | encode_magnitude(a, 1, 1).min(7) as u8
    }

    /// UE4M3 code, saturating at 448.
    pub fn ue4m3_encode(x: f32) -> u8 {
        if x.is_nan() {
            return 0x7F;
        }
        if x <= 0.0 {
            return 0;
        }
        if x > f32::MAX {
            return 0x7E;
        }
        encode_magnitude(x, 3, 7).min(0x7E) as u8
    }

    /// Value of a UE4M3 code below 0x7F.
    pub fn ue4m3_decode(code: u8) -> f32 {
        let exp_field = (code >> 3) as i32;
        let man = (code & 7) as f32;
        if exp_field == 0 {
            man * pow2(-9)
        } else {
            (8.0 + man) * pow2(exp_field - 10)
        }
    }

    fn floor_log2(a: f32) -> i32 {
        let bits = a.to_bits() & 0x7FFF_FFFF;
        let exp_field = (bits >> 23) as i32;
        if exp_field != 0 {
            exp_field - 127
        } else {
            -149 + (31 - bits.leading_zeros() as i32)
        }
    }

    /// Quantizes `rows` rows of `head_dim` values (already in output row order, f32 holding
    /// the 16-bit source values exactly).
    pub fn quantize(format: Fp4Format, x: &[f32], head_dim: usize) -> Quantized {
        let block = format.block();
        let rows = x.len() / head_dim;
        let mut codes = vec![0u8; rows * head_dim / 2];
        let mut scales = vec![0u8; rows * head_dim / block];
        let ts = match format {
            Fp4Format::Nvfp4 => {
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                if amax == 0.0 {
                    1.0
                } else {
                    (amax / 2688.0).max(f32::MIN_POSITIVE)
                }
            }
            Fp4Format::Mxfp4 => 1.0,
        };
        for (bi, blk) in x.chunks_exact(block).enumerate() {
            let bamax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let (sc, denom) = match format {
                Fp4Format::Nvfp4 => {
                    let sc = ue4m3_encode((bamax / 6.0) / ts);
                    (sc, ue4m3_decode(sc) * ts)
                }
                Fp4Format::Mxfp4 => {
                    let e = if bamax == 0.0 { -127 } else { (floor_log2(bamax) - 2).clamp(-127, 127) };
                    ((e + 127) as u8, pow2(e))
                }
            };
            scales[bi] = sc;
            for (j, &v) in blk.iter().enumerate() {
                let c = if denom == 0.0 { 0 } else { e2m1_encode(v / denom) };
                codes[(bi * block + j) / 2] |= c << (4 * (j % 2));
            }
        }
        Quantized { codes, scales, tensor_scale: ts }
    }

    /// Vᵀ of a strided `[batch, heads, seq, head_dim]` source as the `vt` prepass lays it out:
    /// rows (batch, head, channel) of `seq` rounded up to [`super::VT_PAD`] keys, zeros past `seq`.
    pub fn vt_rows(
        src: &[f32],
        batch: usize,
        heads: usize,
        seq: usize,
        head_dim: usize,
        strides: &quattn_core::Strides,
    ) -> Vec<f32> {
        let pad = seq.div_ceil(super::VT_PAD) * super::VT_PAD;
        let mut out = vec![0.0f32; batch * heads * head_dim * pad];
        for b in 0..batch {
            for h in 0..heads {
                for s in 0..seq {
                    let o = b * strides.batch + h * strides.head + s * strides.seq;
                    for c in 0..head_dim {
                        out[((b * heads + h) * head_dim + c) * pad + s] = src[o + c];
                    }
                }
            }
        }
        out
    }

    /// The rows of a strided `[batch, heads, seq, head_dim]` source in the prepass's row order.
    pub fn rows_from_strided(
        src: &[f32],
        batch: usize,
        heads: usize,
        seq: usize,
        head_dim: usize,
        strides: &quattn_core::Strides,
    ) -> Vec<f32> {
        let mut out = Vec::with_capacity(batch * heads * seq * head_dim);
        for b in 0..batch {
            for h in 0..heads {
                for s in 0..seq {
                    let o = b * strides.batch + h * strides.head + s * strides.seq;
                    out.extend_from_slice(&src[o..o + head_dim]);
                }
            }
        }
        out
    }
}

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::KernelCache;

    // SAFETY: #[repr(C)] plain-old-data mirror of the kernel's by-value parameter struct.
    unsafe impl DeviceRepr for Nvfp4QuantParams {}

    /// The prepass of one config, loaded into a CUDA context.
    #[derive(Debug)]
    pub struct Nvfp4Quant {
        config: Nvfp4QuantConfig,
        arch: Arch,
        function: CudaFunction,
    }

    impl Nvfp4Quant {
        pub fn load(ctx: &Arc<CudaContext>, config: Nvfp4QuantConfig) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm80, Nvfp4QuantConfig::target_for)?;
            let (function, _) = crate::device::load_function(ctx, KernelCache::global(), &config.request(arch)?, 0)?;
            Ok(Nvfp4Quant { config, arch, function })
        }

        pub fn config(&self) -> &Nvfp4QuantConfig {
            &self.config
        }
        pub fn arch(&self) -> Arch {
            self.arch
        }

        /// Enqueues the prepass of one `batch × heads × seq` tensor on `stream`: for NVFP4 the
        /// amax word is zeroed, then the amax and quantize launches run.
        ///
        /// # Safety
        /// `src` must address the strided source (16-bit elements), `codes` / `scales` the
        /// byte counts of [`Nvfp4QuantConfig::output_lens`], `amax` one u32 and `tensor_scale`
        /// one f32 (NVFP4), all valid until the launches finish on `stream`.
        pub unsafe fn launch_raw(
            &self,
            stream: &Arc<CudaStream>,
            batch: usize,
            heads: usize,
            seq: usize,
            strides: &Strides,
            ptrs: Nvfp4QuantPtrs,
        ) -> Result<()> {
            self.config.validate_source(batch, heads, seq, strides)?;
            if ptrs.src % 16 != 0 || ptrs.codes % 16 != 0 || ptrs.scales == 0 {
                return Err(NativeError::InvalidArgs("source and codes must be 16-byte aligned, scales non-null".into()));
            }
            let modes: &[u32] = match self.config.format {
                Fp4Format::Nvfp4 => {
                    if ptrs.amax == 0 || ptrs.tensor_scale == 0 {
                        return Err(NativeError::InvalidArgs("NVFP4 needs the amax word and the tensor-scale slot".into()));
                    }
                    // SAFETY: `amax` addresses one u32 per the contract.
                    unsafe {
                        cudarc::driver::result::memset_d8_async(ptrs.amax, 0, 4, stream.cu_stream())?;
                    }
                    &[0, 1]
                }
                Fp4Format::Mxfp4 => &[1],
            };
            for &mode in modes {
                let grid = if mode == 0 { self.config.amax_grid(batch, heads, seq) } else { self.config.grid(batch, heads, seq) };
                let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
                let params = self.config.params(mode, batch, heads, seq, strides, ptrs);
                let mut b = stream.launch_builder(&self.function);
                b.arg(&params);
                // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
                unsafe { b.launch(cfg) }?;
            }
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::Nvfp4Quant;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_validate_and_name() {
        assert!(Nvfp4QuantConfig::new(96, Fp4Format::Nvfp4, Dtype::F16).is_ok());
        assert!(matches!(Nvfp4QuantConfig::new(80, Fp4Format::Nvfp4, Dtype::F16), Err(NativeError::UnsupportedHeadDim { .. })));
        assert!(matches!(Nvfp4QuantConfig::new(64, Fp4Format::Mxfp4, Dtype::F32), Err(NativeError::UnsupportedConfig { .. })));
        let c = Nvfp4QuantConfig::new(128, Fp4Format::Mxfp4, Dtype::Bf16).unwrap();
        assert_eq!(c.name(), "nvfp4_quant_mxfp4_bf16_d128");
        assert_eq!(c.output_lens(1, 2, 5), (640, 40));
        assert_eq!(c.grid(2, 5, 100), (1000 * 4usize).div_ceil(256) as u32);
        assert_eq!(c.amax_grid(64, 64, 4096), AMAX_CTAS);
        // Vᵀ: 2·8·128 rows of 100 keys padded to 128.
        let t = Nvfp4QuantConfig::new(128, Fp4Format::Nvfp4, Dtype::F16).unwrap().transposed();
        assert_eq!(t.name(), "nvfp4_quant_nvfp4_f16_vt_d128");
        assert_eq!(t.output_lens(2, 8, 100), (2 * 8 * 128 * 64, 2 * 8 * 128 * 8));
        let s = Strides { batch: 8 * 100 * 128, head: 100 * 128, seq: 128 };
        assert!(c.validate_source(2, 8, 100, &s).is_ok());
        assert!(c.validate_source(2, 8, 0, &s).is_err());
        assert!(c.validate_source(2, 8, 100, &Strides { seq: 132, ..s }).is_err());
    }

    #[test]
    fn host_recipe_by_hand() {
        // amax 6: tensor scale 6/2688, block scale ≈ 448 -> 0x7E, elements ≈ themselves.
        let mut x = vec![0.0f32; 32];
        x[0] = 6.0;
        x[1] = -0.5;
        x[2] = 3.0;
        x[3] = -2.0;
        x[17] = 0.25; // a tie: rounds to the even code 0
        let q = host::quantize(Fp4Format::Nvfp4, &x, 32);
        assert_eq!(q.tensor_scale, 6.0 / 2688.0);
        assert_eq!(q.scales[0], 0x7E);
        assert_eq!(&q.codes[..2], &[0x97, 0xC5]);
        // Block 1's amax 0.25: (0.25/6)/(6/2688) = 18.67 -> UE4M3 18 (0x59 = 1.125 * 16);
        // 0.25 / (18 * 6/2688) = 6.2 saturates to 6.
        assert_eq!(q.scales[1], 0x59);
        assert_eq!(q.codes[8], 0x70);
        // MXFP4: block amax 6 -> 2^(2 - 2) = 1 (code 127).
        let m = host::quantize(Fp4Format::Mxfp4, &x, 32);
        assert_eq!(m.scales, vec![127]);
        assert_eq!(&m.codes[..2], &[0x97, 0xC5]);
        assert_eq!(m.codes[8], 0x00); // 0.25 ties to 0
    }

    #[test]
    fn ue4m3_host_codes_round_trip() {
        for c in 0..0x7Fu8 {
            let v = host::ue4m3_decode(c);
            assert_eq!(host::ue4m3_encode(v), c, "{c:#x}");
        }
        assert_eq!(host::ue4m3_encode(1e9), 0x7E);
        assert_eq!(host::ue4m3_encode(-1.0), 0);
        assert_eq!(host::ue4m3_encode(1.0), 0x38);
    }

    #[test]
    fn rows_from_strided_reorders_bshd() {
        let (b, h, s, d) = (2, 3, 4, 2);
        let st = Strides::new(quattn_core::Layout::Bshd, h, s, d);
        let src: Vec<f32> = (0..b * h * s * d).map(|i| i as f32).collect();
        let rows = host::rows_from_strided(&src, b, h, s, d, &st);
        // Row (b 0, h 1, s 2) starts at 0*.. + 1*2 + 2*6 = 14 in BSHD.
        let r = (0 * h + 1) * s + 2;
        assert_eq!(&rows[r * d..r * d + 2], &[14.0, 15.0]);
        // Vᵀ row (b 1, h 2, channel 1), key 3: source (1, 3, 2) at 1·24 + 3·6 + 2·2 + 1 = 47.
        let vt = host::vt_rows(&src, b, h, s, d, &st);
        assert_eq!(vt.len(), b * h * d * VT_PAD);
        assert_eq!(vt[((h + 2) * d + 1) * VT_PAD + 3], 47.0);
        assert_eq!(vt[((h + 2) * d + 1) * VT_PAD + s], 0.0);
    }
}
