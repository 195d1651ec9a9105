//! The INT8 quantization prepass of the native INT8 families (`cuda/int8_prepass.cu`): Q and K
//! to INT8 codes with f32 scales, optional K smoothing (per-channel mean over the keys) and the
//! LSE shift, on the stream the attention kernel then runs on, so that the prepass and the
//! kernel are ordered by the stream alone (no host synchronization between them).
//!
//! The numerics are the CPU codec's (`quattn::codec::int8`): codes and scales bit-exact given
//! the mean, which is accumulated in f64 and rounded once (the codec does the same in another
//! order). The portable CubeCL prepass (`quattn_cubecl::quantize_int8`) computes the same
//! tensors for the portable kernels; this one exists because the native kernels run on a cudarc
//! stream that CubeCL's stream cannot be ordered against without a host wait.
//!
//! Up to three launches: mean partials over chunks of 256 keys, the mean (both only with
//! smoothing), then one launch that quantizes every block of Q and of K.

use crate::arch::Arch;
use crate::cache::{CompileRequest, INT8_PREPASS};
use crate::error::{NativeError, Result};
use crate::hmma::{HmmaArgs, Strides};
use crate::int8::Int8Granularity;

const KERNEL: &str = "int8_prepass";
/// Keys per CTA of the mean-partials pass (`CHUNK` in the kernel).
pub const PREPASS_MEAN_CHUNK: usize = 256;
/// Threads per CTA of the partials and quantize passes.
const THREADS: u32 = 256;

/// Element type of the Q and K the prepass reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PrepassInput {
    F16,
    Bf16,
    F32,
}

impl PrepassInput {
    fn define(self) -> u32 {
        match self {
            PrepassInput::F16 => 0,
            PrepassInput::Bf16 => 1,
            PrepassInput::F32 => 2,
        }
    }
    fn tag(self) -> &'static str {
        match self {
            PrepassInput::F16 => "f16",
            PrepassInput::Bf16 => "bf16",
            PrepassInput::F32 => "f32",
        }
    }
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            PrepassInput::F32 => 4,
            _ => 2,
        }
    }
}

/// One prepass: everything that changes the generated code of its quantize pass. The scale
/// blocking is the attention kernel's (`Int8Config::blocking`, `Int8WgmmaConfig::blocking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8PrepassConfig {
    pub head_dim: u32,
    pub input: PrepassInput,
    /// Query rows per Q scale block.
    pub block_q: u32,
    /// Keys per K scale.
    pub block_k: u32,
    /// Warps of the Q scale layout (`block_q / warps` rows each).
    pub warps: u32,
    pub granularity: Int8Granularity,
    pub smooth_k: bool,
}

/// The three kernels of one prepass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PrepassPass {
    /// Per-chunk f64 channel sums of K.
    MeanPartial,
    /// The mean, rounded to f32.
    Mean,
    /// Codes and scales of Q and K (and the LSE shift when smoothing).
    Quantize,
}

impl PrepassPass {
    fn define(self) -> u32 {
        match self {
            PrepassPass::MeanPartial => 0,
            PrepassPass::Mean => 1,
            PrepassPass::Quantize => 2,
        }
    }
}

/// One compiled kernel of a prepass (a [`crate::report::KernelVariant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PrepassVariant {
    pub config: Int8PrepassConfig,
    pub pass: PrepassPass,
}

impl Int8PrepassConfig {
    pub const HEAD_DIMS: &'static [u32] = &[64, 128];
    /// Plain CUDA (no tensor cores, no arch-specific feature): one build per native target.
    pub const TARGETS: &'static [Arch] =
        &[Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90, Arch::Sm100a, Arch::Sm120a];

    /// Validated constructor from an attention kernel's `(block_q, block_k, warps)` blocking.
    pub fn new(
        head_dim: usize,
        input: PrepassInput,
        blocking: (usize, usize, usize),
        granularity: Int8Granularity,
        smooth_k: bool,
    ) -> Result<Self> {
        let (block_q, block_k, warps) = blocking;
        let cfg = Int8PrepassConfig {
            head_dim: head_dim as u32,
            input,
            block_q: block_q as u32,
            block_k: block_k as u32,
            warps: warps as u32,
            granularity,
            smooth_k,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Mirrors the kernel's static_asserts.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason });
        if !Self::HEAD_DIMS.contains(&self.head_dim) {
            return bad(format!("head dim {} (the prepass takes {:?})", self.head_dim, Self::HEAD_DIMS));
        }
        for (what, rows) in [("block_q", self.block_q), ("block_k", self.block_k)] {
            if rows == 0 || rows % 16 != 0 || rows > 128 {
                return bad(format!("{what} {rows} (a multiple of 16, at most 128)"));
            }
        }
        if self.warps == 0 || self.block_q % self.warps != 0 || (self.block_q / self.warps) % 16 != 0 {
            return bad(format!("{} layout warps over block_q {} (16k rows per warp needed)", self.warps, self.block_q));
        }
        if self.granularity == Int8Granularity::PerThread && self.block_q / self.warps != 16 {
            return bad(format!("per-thread scales need 16 rows per layout warp, not {}", self.block_q / self.warps));
        }
        Ok(())
    }

    /// Q scales per (batch, head, block).
    pub fn q_slots(&self) -> usize {
        match self.granularity {
            Int8Granularity::PerBlock => 1,
            Int8Granularity::PerWarp => self.warps as usize,
            Int8Granularity::PerThread => self.warps as usize * 8,
        }
    }

    /// The passes a launch runs, in order.
    pub fn passes(&self) -> &'static [PrepassPass] {
        if self.smooth_k {
            &[PrepassPass::MeanPartial, PrepassPass::Mean, PrepassPass::Quantize]
        } else {
            &[PrepassPass::Quantize]
        }
    }

    /// Targets among [`Self::TARGETS`] that a device of compute capability `cc` runs.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    /// Variants compiled by the report: f16 input at both head dims, the mean passes, and the
    /// quantize pass of the s8 wgmma blocking per-block unsmoothed and per-thread smoothed.
    pub fn report_variants() -> Vec<PrepassVariant> {
        let mut v = Vec::new();
        for hd in Self::HEAD_DIMS {
            for (gran, smooth) in [(Int8Granularity::PerBlock, false), (Int8Granularity::PerThread, true)] {
                let Ok(config) = Self::new(*hd as usize, PrepassInput::F16, (128, 128, 8), gran, smooth) else {
                    continue;
                };
                v.extend(config.passes().iter().map(|&pass| PrepassVariant { config, pass }));
            }
        }
        v
    }
}

impl PrepassVariant {
    /// `int8_prepass_{pass}_{input}_d{hd}` plus, for the quantize pass, the blocking,
    /// granularity and smoothing: e.g. `int8_prepass_quant_f16_d128_q128k128w8_thread_smooth`.
    pub fn name(&self) -> String {
        let c = &self.config;
        let head = format!("{}_d{}", c.input.tag(), c.head_dim);
        match self.pass {
            PrepassPass::MeanPartial => format!("int8_prepass_meanpart_{head}"),
            PrepassPass::Mean => format!("int8_prepass_mean_{head}"),
            PrepassPass::Quantize => format!(
                "int8_prepass_quant_{head}_q{}k{}w{}_{}{}",
                c.block_q,
                c.block_k,
                c.warps,
                c.granularity.tag(),
                if c.smooth_k { "_smooth" } else { "" }
            ),
        }
    }

    /// The `-D` defines (see the header of `int8_prepass.cu`).
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        let c = &self.config;
        c.validate()?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        let mut out = vec![d("HEAD_DIM", c.head_dim), d("ELEM", c.input.define()), d("PASS", self.pass.define())];
        if self.pass == PrepassPass::Quantize {
            let gran = match c.granularity {
                Int8Granularity::PerBlock => 0,
                Int8Granularity::PerWarp => 1,
                Int8Granularity::PerThread => 2,
            };
            out.extend([
                d("BLOCK_Q", c.block_q),
                d("BLOCK_K", c.block_k),
                d("Q_GRAN", gran),
                d("Q_RPW", c.block_q / c.warps),
                d("SMOOTH", c.smooth_k as u32),
            ]);
        }
        Ok(out)
    }

    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Ok(CompileRequest { kernel: self.name(), source: &INT8_PREPASS, arch, defines: self.defines()? })
    }

    /// SASS that must be there: f64 adds in the mean passes (the accumulation the codec's
    /// tolerance assumes), the round-to-nearest-even float to int conversion of the codes.
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        match self.pass {
            PrepassPass::MeanPartial | PrepassPass::Mean => vec!["DADD"],
            PrepassPass::Quantize => vec!["F2I.NTZ"],
        }
    }
}

/// Shapes and strides of one prepass. Q and K strides are in elements (head dim contiguous);
/// the codes are written with the same strides (one byte per element).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrepassArgs {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub q: Strides,
    pub k: Strides,
    /// Folded with log2 e into the stored Q scales; multiplies the LSE shift.
    pub softmax_scale: f32,
}

/// Device addresses of one prepass (0 for buffers the configuration does not use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrepassPtrs {
    /// Q and K (the config's input type).
    pub q: u64,
    pub k: u64,
    /// int8 codes (written).
    pub q_codes: u64,
    pub k_codes: u64,
    /// f32 scales (written).
    pub q_scale: u64,
    pub k_scale: u64,
    /// f32 `[batch, kv_heads, head_dim]` K mean (written; smoothing only).
    pub mean: u64,
    /// f64 `[batch, kv_heads, chunks, head_dim]` scratch (smoothing only).
    pub partial: u64,
    /// f32 `[batch, q_heads, q_len]` LSE shift (written; smoothing only).
    pub lse_shift: u64,
}

/// Element counts of every buffer ([`PrepassArgs::required_lens`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrepassLens {
    pub q: usize,
    pub k: usize,
    pub q_codes: usize,
    pub k_codes: usize,
    pub q_scale: usize,
    pub k_scale: usize,
    pub mean: usize,
    pub partial: usize,
    pub lse_shift: usize,
}

/// Mirror of `PrepassParams` in `int8_prepass.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PrepassParams {
    pub q: u64,
    pub k: u64,
    pub q_codes: u64,
    pub k_codes: u64,
    pub q_scale: u64,
    pub k_scale: u64,
    pub mean: u64,
    pub partial: u64,
    pub lse_shift: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_seq_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_seq_stride: i64,
    pub batch: i32,
    pub q_heads: i32,
    pub kv_heads: i32,
    pub q_len: i32,
    pub kv_len: i32,
    pub kv_group: i32,
    pub q_blocks: i32,
    pub k_blocks: i32,
    pub chunks: i32,
    pub fold: f32,
    pub softmax_scale: f32,
}

impl PrepassArgs {
    /// Chunks of [`PREPASS_MEAN_CHUNK`] keys of the mean-partials pass.
    pub fn chunks(&self) -> usize {
        self.kv_len.div_ceil(PREPASS_MEAN_CHUNK)
    }

    /// CTAs of the quantize pass: every block of Q, then every block of K.
    fn quantize_ctas(&self, config: &Int8PrepassConfig) -> usize {
        self.batch * self.q_heads * self.q_len.div_ceil(config.block_q as usize)
            + self.batch * self.kv_heads * self.kv_len.div_ceil(config.block_k as usize)
    }

    pub fn required_lens(&self, config: &Int8PrepassConfig) -> Result<PrepassLens> {
        config.validate()?;
        let hd = config.head_dim as usize;
        let r = |s: &Strides, h, n| HmmaArgs::required_len(s, self.batch, h, n, hd).max(0) as usize;
        let (q, k) = (r(&self.q, self.q_heads, self.q_len), r(&self.k, self.kv_heads, self.kv_len));
        let smooth = config.smooth_k;
        let kvh = self.batch * self.kv_heads;
        Ok(PrepassLens {
            q,
            k,
            q_codes: q,
            k_codes: k,
            q_scale: self.batch * self.q_heads * self.q_len.div_ceil(config.block_q as usize) * config.q_slots(),
            k_scale: kvh * self.kv_len.div_ceil(config.block_k as usize),
            mean: if smooth { kvh * hd } else { 0 },
            partial: if smooth { kvh * self.chunks() * hd } else { 0 },
            lse_shift: if smooth { self.batch * self.q_heads * self.q_len } else { 0 },
        })
    }

    /// Everything that does not need device pointers: sizes, GQA, strides that keep every
    /// 8-channel access aligned, a finite positive softmax scale, a grid that fits.
    pub fn validate(&self, config: &Int8PrepassConfig) -> Result<()> {
        config.validate()?;
        let bad = |s: String| Err(NativeError::InvalidArgs(s));
        if self.batch == 0 || self.q_heads == 0 || self.kv_heads == 0 || self.q_len == 0 || self.kv_len == 0 {
            return bad(format!("empty prepass: {self:?}"));
        }
        if self.q_heads % self.kv_heads != 0 {
            return bad(format!("q_heads {} is not a multiple of kv_heads {}", self.q_heads, self.kv_heads));
        }
        if !(self.softmax_scale.is_finite() && self.softmax_scale > 0.0) {
            return bad(format!("softmax scale {} (finite and positive needed)", self.softmax_scale));
        }
        for (what, s) in [("q", self.q), ("k", self.k)] {
            if [s.batch, s.head, s.seq].iter().any(|x| *x < 0 || x % 8 != 0) {
                return bad(format!("{what} strides {s:?}: non-negative multiples of 8 elements needed"));
            }
        }
        let lens = [self.q_len, self.kv_len, self.batch, self.q_heads, self.kv_heads, self.quantize_ctas(config)];
        if lens.iter().any(|&x| x > i32::MAX as usize) || self.kv_heads > 65535 || self.batch > 65535 {
            return bad(format!("prepass too large for one launch: {self:?}"));
        }
        Ok(())
    }

    /// Every address non-null where the configuration uses it, 16-byte aligned.
    pub fn validate_ptrs(&self, config: &Int8PrepassConfig, p: &PrepassPtrs) -> Result<()> {
        let mut need = vec![("q", p.q), ("k", p.k), ("q_codes", p.q_codes), ("k_codes", p.k_codes), ("q_scale", p.q_scale), ("k_scale", p.k_scale)];
        if config.smooth_k {
            need.extend([("mean", p.mean), ("partial", p.partial), ("lse_shift", p.lse_shift)]);
        }
        for (what, ptr) in need {
            if ptr == 0 || ptr % 16 != 0 {
                return Err(NativeError::InvalidArgs(format!("{what} address {ptr:#x} is null or not 16-byte aligned")));
            }
        }
        Ok(())
    }

    pub fn params(&self, config: &Int8PrepassConfig, p: &PrepassPtrs) -> PrepassParams {
        PrepassParams {
            q: p.q,
            k: p.k,
            q_codes: p.q_codes,
            k_codes: p.k_codes,
            q_scale: p.q_scale,
            k_scale: p.k_scale,
            mean: p.mean,
            partial: p.partial,
            lse_shift: p.lse_shift,
            q_batch_stride: self.q.batch,
            q_head_stride: self.q.head,
            q_seq_stride: self.q.seq,
            k_batch_stride: self.k.batch,
            k_head_stride: self.k.head,
            k_seq_stride: self.k.seq,
            batch: self.batch as i32,
            q_heads: self.q_heads as i32,
            kv_heads: self.kv_heads as i32,
            q_len: self.q_len as i32,
            kv_len: self.kv_len as i32,
            kv_group: (self.q_heads / self.kv_heads.max(1)) as i32,
            q_blocks: self.q_len.div_ceil(config.block_q as usize) as i32,
            k_blocks: self.kv_len.div_ceil(config.block_k as usize) as i32,
            chunks: self.chunks() as i32,
            // The codec's caller computes the fold the same way (one f32 product).
            fold: self.softmax_scale * std::f32::consts::LOG2_E,
            softmax_scale: self.softmax_scale,
        }
    }

    /// Grid and block of one pass.
    pub fn launch_dims(&self, config: &Int8PrepassConfig, pass: PrepassPass) -> ((u32, u32, u32), (u32, u32, u32)) {
        match pass {
            PrepassPass::MeanPartial => ((self.chunks() as u32, self.kv_heads as u32, self.batch as u32), (THREADS, 1, 1)),
            PrepassPass::Mean => (((self.batch * self.kv_heads) as u32, 1, 1), (config.head_dim, 1, 1)),
            PrepassPass::Quantize => ((self.quantize_ctas(config) as u32, 1, 1), (THREADS, 1, 1)),
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
    unsafe impl DeviceRepr for PrepassParams {}

    /// The kernels of one prepass, loaded into a CUDA context.
    #[derive(Debug)]
    pub struct Int8Prepass {
        config: Int8PrepassConfig,
        arch: Arch,
        functions: Vec<(PrepassPass, CudaFunction)>,
    }

    impl Int8Prepass {
        /// Compiles (or fetches from the global cache) the passes of `config` for the
        /// context's device and loads them.
        pub fn load(ctx: &Arc<CudaContext>, config: Int8PrepassConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Int8PrepassConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm80, Int8PrepassConfig::target_for)?;
            let functions = config
                .passes()
                .iter()
                .map(|&pass| {
                    let (f, _) = crate::device::load_function(ctx, cache, &PrepassVariant { config, pass }.request(arch)?, 0)?;
                    Ok((pass, f))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Int8Prepass { config, arch, functions })
        }

        pub fn config(&self) -> &Int8PrepassConfig {
            &self.config
        }
        pub fn arch(&self) -> Arch {
            self.arch
        }

        /// Enqueues every pass on `stream`.
        ///
        /// # Safety
        /// Each pointer must address device memory of at least the element counts of
        /// [`PrepassArgs::required_lens`] (input type for Q/K, bytes for codes, f32 for scales,
        /// mean and shift, f64 for the partials), valid until the passes finish on `stream`.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, args: &PrepassArgs, ptrs: &PrepassPtrs) -> Result<()> {
            args.validate(&self.config)?;
            args.validate_ptrs(&self.config, ptrs)?;
            let params = args.params(&self.config, ptrs);
            for (pass, function) in &self.functions {
                let (grid_dim, block_dim) = args.launch_dims(&self.config, *pass);
                let cfg = LaunchConfig { grid_dim, block_dim, shared_mem_bytes: 0 };
                let mut b = stream.launch_builder(function);
                b.arg(&params);
                // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
                unsafe { b.launch(cfg) }?;
            }
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::Int8Prepass;

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> PrepassArgs {
        PrepassArgs {
            batch: 2,
            q_heads: 8,
            kv_heads: 2,
            q_len: 300,
            kv_len: 777,
            q: Strides::bhsd(8, 300, 128),
            k: Strides::bhsd(2, 777, 128),
            softmax_scale: 128f32.sqrt().recip(),
        }
    }

    #[test]
    fn lens_follow_the_codec_layout() {
        let c = Int8PrepassConfig::new(128, PrepassInput::F16, (128, 128, 8), Int8Granularity::PerThread, true).unwrap();
        let l = args().required_lens(&c).unwrap();
        assert_eq!(l.q_scale, 2 * 8 * 3 * 64);
        assert_eq!(l.k_scale, 2 * 2 * 7);
        assert_eq!(l.mean, 2 * 2 * 128);
        assert_eq!(l.partial, 2 * 2 * 4 * 128);
        assert_eq!(l.lse_shift, 2 * 8 * 300);
        assert_eq!((l.q, l.q_codes), (2 * 8 * 300 * 128, 2 * 8 * 300 * 128));
        let plain = Int8PrepassConfig { smooth_k: false, granularity: Int8Granularity::PerBlock, ..c };
        let l = args().required_lens(&plain).unwrap();
        assert_eq!((l.q_scale, l.mean, l.partial, l.lse_shift), (2 * 8 * 3, 0, 0, 0));
        assert_eq!(plain.passes(), &[PrepassPass::Quantize]);
    }

    #[test]
    fn invalid_configs_and_args_are_typed() {
        let ok = |hd, b, g| Int8PrepassConfig::new(hd, PrepassInput::F16, b, g, false);
        assert!(ok(96, (128, 128, 8), Int8Granularity::PerBlock).is_err());
        assert!(ok(128, (128, 120, 8), Int8Granularity::PerBlock).is_err());
        assert!(ok(128, (256, 128, 8), Int8Granularity::PerBlock).is_err());
        assert!(ok(128, (128, 64, 4), Int8Granularity::PerThread).is_err());
        assert!(ok(128, (128, 64, 4), Int8Granularity::PerWarp).is_ok());
        let c = ok(64, (128, 64, 4), Int8Granularity::PerWarp).unwrap();
        let mut a = args();
        a.q = Strides::bhsd(8, 300, 64);
        a.k = Strides::bhsd(2, 777, 64);
        assert!(a.validate(&c).is_ok());
        for bad in [
            PrepassArgs { kv_heads: 3, ..a },
            PrepassArgs { q_len: 0, ..a },
            PrepassArgs { softmax_scale: f32::NAN, ..a },
            PrepassArgs { q: Strides { batch: 8 * 300 * 64, head: 300 * 64, seq: 68 }, ..a },
        ] {
            assert!(matches!(bad.validate(&c), Err(NativeError::InvalidArgs(_))), "{bad:?}");
        }
        assert!(a.validate_ptrs(&c, &PrepassPtrs { q: 16, k: 16, q_codes: 16, k_codes: 16, q_scale: 16, k_scale: 8, ..Default::default() }).is_err());
        assert!(a.validate_ptrs(&c, &PrepassPtrs { q: 16, k: 16, q_codes: 16, k_codes: 16, q_scale: 16, k_scale: 16, ..Default::default() }).is_ok());
    }

    /// `thread_div_inline` of the kernel, step for step (`mul_add` is the exact FMA), from a
    /// reciprocal estimate `y0` (PTX: `rcp.approx.f32` is within 1 ulp).
    fn div_inline(a: f32, b: f32, y0: f32) -> f32 {
        let e = (-b).mul_add(y0, 1.0);
        let y = y0.mul_add(e, y0);
        let q = a * y;
        let r = (-b).mul_add(q, a);
        let q = r.mul_add(y, q);
        let r = (-b).mul_add(q, a);
        r.mul_add(y, q)
    }

    fn ulp_step(x: f32, k: i32) -> f32 {
        f32::from_bits((x.to_bits() as i64 + k as i64) as u32)
    }

    /// The kernel's code division is correctly rounded wherever the kernel uses it: scales in
    /// [2^-60, 2^120] (amax / 127 never exceeds 2^121; smaller ones are pre-scaled by 2^64), |a| <= 127.5 scale, with any
    /// reciprocal estimate within 1 ulp, at random points and at the code midpoints (k + 1/2)
    /// scale and their neighbours, where a wrong last bit would change the code.
    #[test]
    fn inline_division_is_correctly_rounded_on_the_code_range() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64;
        let mut checked = 0;
        for _ in 0..200_000 {
            let b = (2f64.powf(-60.0 + 180.0 * unit(next())) * (1.0 + unit(next()))) as f32;
            let b = b.clamp(2f32.powi(-60), 2f32.powi(120));
            let mut points = vec![((unit(next()) * 255.0 - 127.5) * b as f64) as f32];
            let k = (next() % 255) as i32 - 127;
            let mid = (k as f32 + 0.5) * b;
            points.extend((-3..=3).map(|d| ulp_step(mid, d)));
            for a in points {
                let rn = 1.0 / b;
                for y0 in [ulp_step(rn, -1), rn, ulp_step(rn, 1)] {
                    let got = div_inline(a, b, y0);
                    assert_eq!(got.to_bits(), (a / b).to_bits(), "{a:e} / {b:e} with y0 {y0:e}: {got:e} vs {:e}", a / b);
                    checked += 1;
                }
            }
        }
        assert!(checked > 4_000_000);
    }

    /// The kernel's scale: amax · (1/127) in f64 rounded once to f32 is amax / 127 correctly
    /// rounded, normal and subnormal, including every f16 amax.
    #[test]
    fn scale_through_f64_is_correctly_rounded() {
        let f64_scale = |a: f32| (a as f64 * (1.0 / 127.0)) as f32;
        for bits in (0u32..0x7f80_0000).step_by(97) {
            let a = f32::from_bits(bits);
            assert_eq!(f64_scale(a).to_bits(), (a / 127.0).to_bits(), "amax {a:e}");
        }
        for h in 1u16..0x7c00 {
            let a = half::f16::from_bits(h).to_f32();
            assert_eq!(f64_scale(a).to_bits(), (a / 127.0).to_bits(), "f16 amax {a:e}");
        }
    }

    #[test]
    fn names_are_unique() {
        let v = Int8PrepassConfig::report_variants();
        let mut names: Vec<String> = v.iter().map(|x| x.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), v.len());
    }
}
