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
use crate::hmma::{check_strides, span};
use quattn_core::{AttentionShape, Dtype, Int8Blocking, Int8Granularity, Strides, INT8_MMA_M};

const KERNEL: &str = "int8_prepass";
/// Keys per CTA of the mean-partials pass (`CHUNK` in the kernel).
pub const PREPASS_MEAN_CHUNK: usize = 256;
/// Threads per CTA of the partials and quantize passes.
const THREADS: u32 = 256;

/// The `ELEM` define of the prepass: the element type of the Q and K it reads.
fn elem_define(input: Dtype) -> u32 {
    match input {
        Dtype::F16 => 0,
        Dtype::Bf16 => 1,
        Dtype::F32 => 2,
    }
}

/// One prepass: everything that changes the generated code of its quantize pass. The scale
/// blocking is the attention kernel's (`Int8Config::blocking`, `Int8WgmmaConfig::blocking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8PrepassConfig {
    pub head_dim: u32,
    /// Element type of the Q and K the prepass reads.
    pub input: Dtype,
    /// Query rows per Q scale block, keys per K scale, warps of the Q scale layout.
    pub blocking: Int8Blocking,
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

    /// Validated constructor from an attention kernel's blocking.
    pub fn new(
        head_dim: usize,
        input: Dtype,
        blocking: Int8Blocking,
        granularity: Int8Granularity,
        smooth_k: bool,
    ) -> Result<Self> {
        let cfg = Int8PrepassConfig { head_dim: head_dim as u32, input, blocking, granularity, smooth_k };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Mirrors the kernel's static_asserts.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason });
        if !Self::HEAD_DIMS.contains(&self.head_dim) {
            return bad(format!("head dim {} (the prepass takes {:?})", self.head_dim, Self::HEAD_DIMS));
        }
        let Int8Blocking { block_q, block_k, warps } = self.blocking;
        for (what, rows) in [("block_q", block_q), ("block_k", block_k)] {
            if rows == 0 || rows % 16 != 0 || rows > 128 {
                return bad(format!("{what} {rows} (a multiple of 16, at most 128)"));
            }
        }
        if warps == 0 || block_q % warps != 0 || (block_q / warps) % 16 != 0 {
            return bad(format!("{warps} layout warps over block_q {block_q} (16k rows per warp needed)"));
        }
        if self.granularity == Int8Granularity::PerThread && block_q / warps != INT8_MMA_M {
            return bad(format!("per-thread scales need {INT8_MMA_M} rows per layout warp, not {}", block_q / warps));
        }
        Ok(())
    }

    /// Q scales per (batch, head, block).
    pub fn q_slots(&self) -> usize {
        self.blocking.q_slots(self.granularity)
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
                let blocking = Int8Blocking { block_q: 128, block_k: 128, warps: 8 };
                let Ok(config) = Self::new(*hd as usize, Dtype::F16, blocking, gran, smooth) else {
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
        let head = format!("{}_d{}", c.input.name(), c.head_dim);
        match self.pass {
            PrepassPass::MeanPartial => format!("int8_prepass_meanpart_{head}"),
            PrepassPass::Mean => format!("int8_prepass_mean_{head}"),
            PrepassPass::Quantize => format!(
                "int8_prepass_quant_{head}_q{}k{}w{}_{}{}",
                c.blocking.block_q,
                c.blocking.block_k,
                c.blocking.warps,
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
        let mut out = vec![d("HEAD_DIM", c.head_dim), d("ELEM", elem_define(c.input)), d("PASS", self.pass.define())];
        if self.pass == PrepassPass::Quantize {
            let gran = match c.granularity {
                Int8Granularity::PerBlock => 0,
                Int8Granularity::PerWarp => 1,
                Int8Granularity::PerThread => 2,
            };
            let b = &c.blocking;
            out.extend([
                d("BLOCK_Q", b.block_q as u32),
                d("BLOCK_K", b.block_k as u32),
                d("Q_GRAN", gran),
                d("Q_RPW", b.rows_per_warp() as u32),
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

/// Element counts of every buffer ([`Int8PrepassConfig::required_lens`]).
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

/// Chunks of [`PREPASS_MEAN_CHUNK`] keys of the mean-partials pass.
fn chunks(s: &AttentionShape) -> usize {
    s.kv_len.div_ceil(PREPASS_MEAN_CHUNK)
}

/// The launch arguments of a prepass: the [`AttentionShape`] of the attention call it feeds (its
/// `scale` is folded with log2 e into the stored Q scales and multiplies the LSE shift). The
/// codes are written with the strides of Q and K (one byte per element).
impl Int8PrepassConfig {
    /// CTAs of the quantize pass: every block of Q, then every block of K.
    fn quantize_ctas(&self, s: &AttentionShape) -> usize {
        s.batch * s.q_heads * self.blocking.q_blocks(s.q_len)
            + s.batch * s.kv_heads * self.blocking.k_blocks(s.kv_len)
    }

    /// Element counts of every buffer of a prepass over `s`.
    pub fn required_lens(&self, s: &AttentionShape) -> Result<PrepassLens> {
        self.validate()?;
        let hd = self.head_dim as usize;
        let r = |st: &Strides, h, n| span(st, s.batch, h, n, hd);
        let (q, k) = (r(&s.q, s.q_heads, s.q_len), r(&s.k, s.kv_heads, s.kv_len));
        let smooth = self.smooth_k;
        let kvh = s.batch * s.kv_heads;
        Ok(PrepassLens {
            q,
            k,
            q_codes: q,
            k_codes: k,
            q_scale: s.batch * s.q_heads * self.blocking.q_blocks(s.q_len) * self.q_slots(),
            k_scale: kvh * self.blocking.k_blocks(s.kv_len),
            mean: if smooth { kvh * hd } else { 0 },
            partial: if smooth { kvh * chunks(s) * hd } else { 0 },
            lse_shift: if smooth { s.batch * s.q_heads * s.q_len } else { 0 },
        })
    }

    /// Everything about `s` that does not need device pointers: the head dim, sizes, GQA,
    /// strides that keep every 8-channel access aligned, a finite positive softmax scale, a
    /// grid that fits. The prepass reads Q and K only (`v`, `o`, `write_lse` are not used).
    pub fn validate_args(&self, s: &AttentionShape) -> Result<()> {
        self.validate()?;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        if s.head_dim != self.head_dim as usize {
            return bad(format!("head dim {} for a prepass of head dim {}", s.head_dim, self.head_dim));
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 || s.kv_len == 0 {
            return bad(format!("empty prepass: {s:?}"));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return bad(format!("q_heads {} is not a multiple of kv_heads {}", s.q_heads, s.kv_heads));
        }
        if !(s.scale.is_finite() && s.scale > 0.0) {
            return bad(format!("softmax scale {} (finite and positive needed)", s.scale));
        }
        for (what, st) in [("q", &s.q), ("k", &s.k)] {
            check_strides(what, st, 8)?;
        }
        let lens = [s.q_len, s.kv_len, s.batch, s.q_heads, s.kv_heads, self.quantize_ctas(s)];
        if lens.iter().any(|&x| x > i32::MAX as usize) || s.kv_heads > 65535 || s.batch > 65535 {
            return bad(format!("prepass too large for one launch: {s:?}"));
        }
        Ok(())
    }

    /// Every address non-null where the configuration uses it, 16-byte aligned.
    pub fn validate_ptrs(&self, p: &PrepassPtrs) -> Result<()> {
        let mut need = vec![("q", p.q), ("k", p.k), ("q_codes", p.q_codes), ("k_codes", p.k_codes), ("q_scale", p.q_scale), ("k_scale", p.k_scale)];
        if self.smooth_k {
            need.extend([("mean", p.mean), ("partial", p.partial), ("lse_shift", p.lse_shift)]);
        }
        for (what, ptr) in need {
            if ptr == 0 || ptr % 16 != 0 {
                return Err(NativeError::InvalidArgs(format!("{what} address {ptr:#x} is null or not 16-byte aligned")));
            }
        }
        Ok(())
    }

    /// Kernel parameters of a prepass over `s` (strides as checked by [`Self::validate_args`]:
    /// below 2^63).
    pub fn params(&self, s: &AttentionShape, p: &PrepassPtrs) -> PrepassParams {
        let [q, k] = [s.q, s.k].map(|x| x.to_array().map(|v| v as i64));
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
            q_batch_stride: q[0],
            q_head_stride: q[1],
            q_seq_stride: q[2],
            k_batch_stride: k[0],
            k_head_stride: k[1],
            k_seq_stride: k[2],
            batch: s.batch as i32,
            q_heads: s.q_heads as i32,
            kv_heads: s.kv_heads as i32,
            q_len: s.q_len as i32,
            kv_len: s.kv_len as i32,
            kv_group: (s.q_heads / s.kv_heads.max(1)) as i32,
            q_blocks: self.blocking.q_blocks(s.q_len) as i32,
            k_blocks: self.blocking.k_blocks(s.kv_len) as i32,
            chunks: chunks(s) as i32,
            // The codec's caller computes the fold the same way (one f32 product).
            fold: s.scale * std::f32::consts::LOG2_E,
            softmax_scale: s.scale,
        }
    }

    /// Grid and block of one pass.
    pub fn launch_dims(&self, s: &AttentionShape, pass: PrepassPass) -> ((u32, u32, u32), (u32, u32, u32)) {
        match pass {
            PrepassPass::MeanPartial => ((chunks(s) as u32, s.kv_heads as u32, s.batch as u32), (THREADS, 1, 1)),
            PrepassPass::Mean => (((s.batch * s.kv_heads) as u32, 1, 1), (self.head_dim, 1, 1)),
            PrepassPass::Quantize => ((self.quantize_ctas(s) as u32, 1, 1), (THREADS, 1, 1)),
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
        /// [`Int8PrepassConfig::required_lens`] (input type for Q/K, bytes for codes, f32 for
        /// scales, mean and shift, f64 for the partials), valid until the passes finish on
        /// `stream`.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, args: &AttentionShape, ptrs: &PrepassPtrs) -> Result<()> {
            self.config.validate_args(args)?;
            self.config.validate_ptrs(ptrs)?;
            let params = self.config.params(args, ptrs);
            for (pass, function) in &self.functions {
                let (grid_dim, block_dim) = self.config.launch_dims(args, *pass);
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
    use quattn_core::Layout;

    fn bl(block_q: usize, block_k: usize, warps: usize) -> Int8Blocking {
        Int8Blocking { block_q, block_k, warps }
    }

    fn args() -> AttentionShape {
        AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 300, 777, 128, false)
    }

    #[test]
    fn lens_follow_the_codec_layout() {
        let c = Int8PrepassConfig::new(128, Dtype::F16, bl(128, 128, 8), Int8Granularity::PerThread, true).unwrap();
        let l = c.required_lens(&args()).unwrap();
        assert_eq!(l.q_scale, 2 * 8 * 3 * 64);
        assert_eq!(l.k_scale, 2 * 2 * 7);
        assert_eq!(l.mean, 2 * 2 * 128);
        assert_eq!(l.partial, 2 * 2 * 4 * 128);
        assert_eq!(l.lse_shift, 2 * 8 * 300);
        assert_eq!((l.q, l.q_codes), (2 * 8 * 300 * 128, 2 * 8 * 300 * 128));
        let plain = Int8PrepassConfig { smooth_k: false, granularity: Int8Granularity::PerBlock, ..c };
        let l = plain.required_lens(&args()).unwrap();
        assert_eq!((l.q_scale, l.mean, l.partial, l.lse_shift), (2 * 8 * 3, 0, 0, 0));
        assert_eq!(plain.passes(), &[PrepassPass::Quantize]);
    }

    #[test]
    fn invalid_configs_and_args_are_typed() {
        let ok = |hd, (q, k, w), g| Int8PrepassConfig::new(hd, Dtype::F16, bl(q, k, w), g, false);
        assert!(ok(96, (128, 128, 8), Int8Granularity::PerBlock).is_err());
        assert!(ok(128, (128, 120, 8), Int8Granularity::PerBlock).is_err());
        assert!(ok(128, (256, 128, 8), Int8Granularity::PerBlock).is_err());
        assert!(ok(128, (128, 64, 4), Int8Granularity::PerThread).is_err());
        assert!(ok(128, (128, 64, 4), Int8Granularity::PerWarp).is_ok());
        let c = ok(64, (128, 64, 4), Int8Granularity::PerWarp).unwrap();
        let a = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 300, 777, 64, false);
        assert!(c.validate_args(&a).is_ok());
        for bad in [
            AttentionShape { kv_heads: 3, ..a },
            AttentionShape { q_len: 0, ..a },
            AttentionShape { scale: f32::NAN, ..a },
            AttentionShape { q: Strides { batch: 8 * 300 * 64, head: 300 * 64, seq: 68 }, ..a },
            // The shape's head dim is the prepass's.
            args(),
        ] {
            assert!(matches!(c.validate_args(&bad), Err(NativeError::InvalidArgs(_))), "{bad:?}");
        }
        assert!(c.validate_ptrs(&PrepassPtrs { q: 16, k: 16, q_codes: 16, k_codes: 16, q_scale: 16, k_scale: 8, ..Default::default() }).is_err());
        assert!(c.validate_ptrs(&PrepassPtrs { q: 16, k: 16, q_codes: 16, k_codes: 16, q_scale: 16, k_scale: 16, ..Default::default() }).is_ok());
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
