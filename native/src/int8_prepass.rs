//! The INT8 quantization prepass of the native INT8 families (`cuda/int8_prepass.cu`): Q and K
//! to INT8 codes with f32 scales, optional K smoothing (per-channel mean over the keys) and the
//! LSE shift, and for the e4m3 P·V of the s8 wgmma family (`v_fp8`) V to e4m3 Vᵀ codes with
//! per-channel scales, on the stream the attention kernel then runs on, so that the prepass and
//! the kernel are ordered by the stream alone (no host synchronization between them).
//!
//! The numerics are the CPU codec's (`quattn::codec::int8`): codes and scales bit-exact given
//! the mean, which is accumulated in f64 and rounded once (the codec does the same in another
//! order). The portable CubeCL prepass (`quattn_cubecl::quantize_int8`) computes the same
//! tensors for the portable kernels; this one exists because the native kernels run on a cudarc
//! stream that CubeCL's stream cannot be ordered against without a host wait.
//!
//! Without smoothing or `v_fp8`, one launch of quantize items (every tile of V, block of K and
//! block of Q). With either, a launch of stats items first (`int8_prepass_stats`: the K mean
//! and the V amax over chunks of 256 keys; the last chunk of each (batch, kv head) reduces them,
//! counted by an atomic ticket), then the quantize launch, which reads K and V again. A one-launch
//! form whose quantize items waited for their head's statistics and read K and V again from L2
//! measured slower on every benchmark shape (`benchmarks/2026-11-29-h200-r`): its waits and
//! per-item ticket traffic cost more than the second read from DRAM.

use crate::arch::Arch;
use crate::cache::{CompileRequest, INT8_PREPASS};
use crate::error::{NativeError, Result};
use crate::hmma::{check_strides, span};
use quattn_core::{AttentionShape, Dtype, Int8Blocking, Int8Granularity, Strides, INT8_MMA_M};

const KERNEL: &str = "int8_prepass";
/// The entry of the stats launch, in the same module.
const STATS_ENTRY: &str = "int8_prepass_stats";
/// Keys per stats item (`CHUNK` in the kernel).
pub const PREPASS_MEAN_CHUNK: usize = 256;
/// Threads per CTA.
const THREADS: u32 = 256;
/// The `ELEM` define of the prepass: the element type of the Q and K it reads.
fn elem_define(input: Dtype) -> u32 {
    match input {
        Dtype::F16 => 0,
        Dtype::Bf16 => 1,
        Dtype::F32 => 2,
    }
}

/// One prepass: everything that changes the generated code of its passes. The scale blocking is
/// the attention kernel's (`Int8Config::blocking`, `Int8WgmmaConfig::blocking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8PrepassConfig {
    pub head_dim: u32,
    /// Element type of the Q, K (and V) the prepass reads.
    pub input: Dtype,
    /// Query rows per Q scale block, keys per K scale, warps of the Q scale layout.
    pub blocking: Int8Blocking,
    pub granularity: Int8Granularity,
    pub smooth_k: bool,
    /// Also V to e4m3 Vᵀ codes with per-channel scales (the e4m3 P·V of the s8 wgmma family).
    pub v_fp8: bool,
}

/// The kernels of one prepass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PrepassPass {
    /// Codes and scales of Q and K (and the LSE shift when smoothing), Vᵀ codes with `v_fp8`;
    /// with smoothing or `v_fp8` also the per-chunk f64 channel sums of K and f32 channel amax
    /// of V, reduced by the last chunk of each (batch, kv head) into the mean and the V scales.
    Quantize,
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

    /// Validated constructor from an attention kernel's blocking (f16 P·V: V is not read).
    pub fn new(
        head_dim: usize,
        input: Dtype,
        blocking: Int8Blocking,
        granularity: Int8Granularity,
        smooth_k: bool,
    ) -> Result<Self> {
        let cfg = Int8PrepassConfig { head_dim: head_dim as u32, input, blocking, granularity, smooth_k, v_fp8: false };
        cfg.validate()?;
        Ok(cfg)
    }

    /// This prepass, also writing e4m3 Vᵀ codes and V scales.
    pub fn with_v_fp8(self) -> Self {
        Int8PrepassConfig { v_fp8: true, ..self }
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

    /// The passes a launch runs, in order (one kernel).
    pub fn passes(&self) -> &'static [PrepassPass] {
        &[PrepassPass::Quantize]
    }

    /// Whether the launch has stats items (the K mean, the V scales).
    pub fn has_stats(&self) -> bool {
        self.smooth_k || self.v_fp8
    }

    /// The targets of `v_fp8` prepasses: the e4m3 conversion needs sm_89 or newer.
    pub const TARGETS_FP8: &'static [Arch] = &[Arch::Sm89, Arch::Sm90, Arch::Sm100a, Arch::Sm120a];

    /// The targets this configuration compiles for.
    pub fn targets(&self) -> &'static [Arch] {
        if self.v_fp8 { Self::TARGETS_FP8 } else { Self::TARGETS }
    }

    /// Targets among [`Self::TARGETS`] that a device of compute capability `cc` runs.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    /// The target of this configuration for a device of compute capability `cc`, if any.
    pub fn target_of(&self, cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| self.targets().contains(a))
    }

    /// Variants compiled by the report, f16 input at both head dims: the s8 wgmma f16 P·V
    /// blocking per-block unsmoothed and smoothed and per-thread smoothed, and its e4m3 P·V
    /// blocking (64-key K scales) per-block smoothed with V.
    pub fn report_variants() -> Vec<PrepassVariant> {
        let mut v = Vec::new();
        for hd in Self::HEAD_DIMS {
            let b128 = Int8Blocking { block_q: 128, block_k: 128, warps: 8 };
            let b64 = Int8Blocking { block_q: 128, block_k: 64, warps: 8 };
            for (blocking, gran, smooth, v_fp8) in [
                (b128, Int8Granularity::PerBlock, false, false),
                (b128, Int8Granularity::PerBlock, true, false),
                (b128, Int8Granularity::PerThread, true, false),
                (b64, Int8Granularity::PerBlock, true, true),
            ] {
                let Ok(config) = Self::new(*hd as usize, Dtype::F16, blocking, gran, smooth) else {
                    continue;
                };
                let config = if v_fp8 { config.with_v_fp8() } else { config };
                v.extend(config.passes().iter().map(|&pass| PrepassVariant { config, pass }));
            }
        }
        v
    }
}

impl PrepassVariant {
    /// `int8_prepass_quant_{input}_d{hd}` plus the blocking and granularity, then `_smooth`
    /// and `_vfp8` where they apply: e.g. `int8_prepass_quant_f16_d128_q128k128w8_thread_smooth`.
    pub fn name(&self) -> String {
        let c = &self.config;
        let head = format!("{}_d{}", c.input.name(), c.head_dim);
        let tail = format!("{}{}", if c.smooth_k { "_smooth" } else { "" }, if c.v_fp8 { "_vfp8" } else { "" });
        match self.pass {
            PrepassPass::Quantize => format!(
                "int8_prepass_quant_{head}_q{}k{}w{}_{}{tail}",
                c.blocking.block_q,
                c.blocking.block_k,
                c.blocking.warps,
                c.granularity.tag(),
            ),
        }
    }

    /// The `-D` defines (see the header of `int8_prepass.cu`).
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        let c = &self.config;
        c.validate()?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        let gran = match c.granularity {
            Int8Granularity::PerBlock => 0,
            Int8Granularity::PerWarp => 1,
            Int8Granularity::PerThread => 2,
        };
        let b = &c.blocking;
        Ok(vec![
            d("HEAD_DIM", c.head_dim),
            d("ELEM", elem_define(c.input)),
            d("SMOOTH", c.smooth_k as u32),
            d("V_FP8", c.v_fp8 as u32),
            d("BLOCK_Q", b.block_q as u32),
            d("BLOCK_K", b.block_k as u32),
            d("Q_GRAN", gran),
            d("Q_RPW", b.rows_per_warp() as u32),
        ])
    }

    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Ok(CompileRequest { kernel: self.name(), source: &INT8_PREPASS, arch, defines: self.defines()? })
    }

    /// SASS that must be there: the round-to-nearest-even float to int conversion (the exact
    /// path of the codes); with stats items their atomic tickets and, with smoothing, their f64
    /// adds (the accumulation the codec's tolerance assumes); with `v_fp8` the e4m3 conversion
    /// of V.
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        let c = &self.config;
        let mut v = vec!["F2I.NTZ"];
        if c.has_stats() {
            v.push("ATOMG.E.ADD.STRONG.GPU");
        }
        if c.smooth_k {
            v.push("DADD");
        }
        if c.v_fp8 {
            v.push("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C");
        }
        v
    }
}

/// Device addresses of one prepass (0 for buffers the configuration does not use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrepassPtrs {
    /// Q, K and V (the config's input type; V only with `v_fp8`).
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// int8 codes (written).
    pub q_codes: u64,
    pub k_codes: u64,
    /// e4m3 Vᵀ codes `[batch, kv_heads, head_dim, kv_pad]` (written; `v_fp8` only).
    pub vt_codes: u64,
    /// f32 scales (written).
    pub q_scale: u64,
    pub k_scale: u64,
    /// f32 `[batch, kv_heads, head_dim]` K mean (written; smoothing only).
    pub mean: u64,
    /// f64 `[batch, kv_heads, chunks, head_dim]` scratch (smoothing only).
    pub k_partial: u64,
    /// f32 `[batch, kv_heads, head_dim]` V scales and their reciprocals (written; `v_fp8`).
    pub v_scale: u64,
    pub v_inv: u64,
    /// f32 `[batch, kv_heads, chunks, head_dim]` scratch (`v_fp8` only).
    pub v_partial: u64,
    /// u32 `[batch * kv_heads]` tickets of the stats items (smoothing
    /// or `v_fp8`): zero before the first launch (allocate zeroed); every launch leaves them
    /// zero.
    pub tickets: u64,
    /// f32 `[batch, q_heads, q_len]` LSE shift (written; smoothing only).
    pub lse_shift: u64,
}

/// Element counts of every buffer ([`Int8PrepassConfig::required_lens`]); 0 for buffers the
/// configuration does not use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrepassLens {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub q_codes: usize,
    pub k_codes: usize,
    pub vt_codes: usize,
    pub q_scale: usize,
    pub k_scale: usize,
    pub mean: usize,
    pub k_partial: usize,
    pub v_scale: usize,
    pub v_inv: usize,
    pub v_partial: usize,
    pub tickets: usize,
    pub lse_shift: usize,
}

impl PrepassLens {
    /// Whether buffers of `self`'s counts hold a prepass that needs `need`.
    pub fn covers(&self, need: &PrepassLens) -> bool {
        let h = [
            self.q_codes, self.k_codes, self.vt_codes, self.q_scale, self.k_scale, self.mean, self.k_partial, self.v_scale,
            self.v_inv, self.v_partial, self.tickets, self.lse_shift,
        ];
        let n = [
            need.q_codes, need.k_codes, need.vt_codes, need.q_scale, need.k_scale, need.mean, need.k_partial, need.v_scale,
            need.v_inv, need.v_partial, need.tickets, need.lse_shift,
        ];
        h.iter().zip(&n).all(|(h, n)| h >= n)
    }
}

/// Mirror of `PrepassParams` in `int8_prepass.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PrepassParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub q_codes: u64,
    pub k_codes: u64,
    pub vt_codes: u64,
    pub q_scale: u64,
    pub k_scale: u64,
    pub mean: u64,
    pub k_partial: u64,
    pub v_scale: u64,
    pub v_inv: u64,
    pub v_partial: u64,
    pub tickets: u64,
    pub lse_shift: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_seq_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_seq_stride: i64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_seq_stride: i64,
    pub batch: i32,
    pub q_heads: i32,
    pub kv_heads: i32,
    pub q_len: i32,
    pub kv_len: i32,
    pub kv_group: i32,
    pub q_blocks: i32,
    pub k_blocks: i32,
    pub chunks: i32,
    pub kv_pad: i32,
    pub q_ctas: i32,
    pub k_ctas: i32,
    pub v_ctas: i32,
    pub fold: f32,
    pub softmax_scale: f32,
}

/// Chunks of [`PREPASS_MEAN_CHUNK`] keys: stats items per (batch, kv head).
fn chunks(s: &AttentionShape) -> usize {
    s.kv_len.div_ceil(PREPASS_MEAN_CHUNK)
}

/// Keys per V tile of the quantize pass; Vᵀ rows are padded to a multiple of it.
pub const PREPASS_VT_KEYS: usize = 128;

/// Rows one quantize CTA covers for scale blocks of `block` rows: as many whole blocks as fit
/// in 128 rows (`Q_ROWS` / `K_ROWS` in the kernel).
fn cta_rows(block: usize) -> usize {
    block * (128 / block)
}

/// The launch arguments of a prepass: the [`AttentionShape`] of the attention call it feeds (its
/// `scale` is folded with log2 e into the stored Q scales and multiplies the LSE shift). The
/// codes are written with the strides of Q and K (one byte per element); Vᵀ densely.
impl Int8PrepassConfig {
    /// Quantize CTAs per (batch, head) of Q, K and V.
    fn ctas_per_head(&self, s: &AttentionShape) -> (usize, usize, usize) {
        let b = &self.blocking;
        let v = if self.v_fp8 { s.kv_len.div_ceil(PREPASS_VT_KEYS) } else { 0 };
        (s.q_len.div_ceil(cta_rows(b.block_q)), s.kv_len.div_ceil(cta_rows(b.block_k)), v)
    }

    /// Quantize items: every tile of V, block group of K and of Q.
    fn quantize_ctas(&self, s: &AttentionShape) -> usize {
        let (q, k, v) = self.ctas_per_head(s);
        s.batch * s.q_heads * q + s.batch * s.kv_heads * (k + v)
    }

    /// Keys per Vᵀ row: kv_len rounded up to [`PREPASS_VT_KEYS`].
    pub fn kv_pad(s: &AttentionShape) -> usize {
        s.kv_len.max(1).div_ceil(PREPASS_VT_KEYS) * PREPASS_VT_KEYS
    }

    /// Element counts of every buffer of a prepass over `s`.
    pub fn required_lens(&self, s: &AttentionShape) -> Result<PrepassLens> {
        self.validate()?;
        let hd = self.head_dim as usize;
        let r = |st: &Strides, h, n| span(st, s.batch, h, n, hd);
        let (q, k) = (r(&s.q, s.q_heads, s.q_len), r(&s.k, s.kv_heads, s.kv_len));
        let (smooth, vf) = (self.smooth_k, self.v_fp8);
        let kvh = s.batch * s.kv_heads;
        let when = |on: bool, n: usize| if on { n } else { 0 };
        Ok(PrepassLens {
            q,
            k,
            v: when(vf, r(&s.v, s.kv_heads, s.kv_len)),
            q_codes: q,
            k_codes: k,
            vt_codes: when(vf, kvh * hd * Self::kv_pad(s)),
            q_scale: s.batch * s.q_heads * self.blocking.q_blocks(s.q_len) * self.q_slots(),
            k_scale: kvh * self.blocking.k_blocks(s.kv_len),
            mean: when(smooth, kvh * hd),
            k_partial: when(smooth, kvh * chunks(s) * hd),
            v_scale: when(vf, kvh * hd),
            v_inv: when(vf, kvh * hd),
            v_partial: when(vf, kvh * chunks(s) * hd),
            tickets: when(smooth || vf, kvh),
            lse_shift: when(smooth, s.batch * s.q_heads * s.q_len),
        })
    }

    /// Everything about `s` that does not need device pointers: the head dim, sizes, GQA,
    /// strides that keep every 8-channel access aligned, a finite positive softmax scale, a
    /// grid that fits. The prepass reads Q, K and (with `v_fp8`) V; `o` and `write_lse` are not
    /// used.
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
        if self.v_fp8 {
            check_strides("v", &s.v, 8)?;
        }
        let big = Self::kv_pad(s) * self.head_dim as usize * s.batch * s.kv_heads;
        let lens = [s.q_len, s.kv_len, s.batch, s.q_heads, s.kv_heads, self.quantize_ctas(s), s.batch * s.kv_heads * chunks(s), Self::kv_pad(s)];
        if lens.iter().any(|&x| x > i32::MAX as usize) || s.kv_heads > 65535 || s.batch > 65535 || big > i64::MAX as usize {
            return bad(format!("prepass too large for one launch: {s:?}"));
        }
        Ok(())
    }

    /// Every address non-null where the configuration uses it, 16-byte aligned.
    pub fn validate_ptrs(&self, p: &PrepassPtrs) -> Result<()> {
        let mut need = vec![("q", p.q), ("k", p.k), ("q_codes", p.q_codes), ("k_codes", p.k_codes), ("q_scale", p.q_scale), ("k_scale", p.k_scale)];
        if self.smooth_k {
            need.extend([("mean", p.mean), ("k_partial", p.k_partial), ("lse_shift", p.lse_shift)]);
        }
        if self.v_fp8 {
            need.extend([("v", p.v), ("vt_codes", p.vt_codes), ("v_scale", p.v_scale), ("v_inv", p.v_inv), ("v_partial", p.v_partial)]);
        }
        if self.smooth_k || self.v_fp8 {
            need.push(("tickets", p.tickets));
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
        let [q, k, v] = [s.q, s.k, s.v].map(|x| x.to_array().map(|v| v as i64));
        let (q_ctas, k_ctas, v_ctas) = self.ctas_per_head(s);
        PrepassParams {
            q: p.q,
            k: p.k,
            v: p.v,
            q_codes: p.q_codes,
            k_codes: p.k_codes,
            vt_codes: p.vt_codes,
            q_scale: p.q_scale,
            k_scale: p.k_scale,
            mean: p.mean,
            k_partial: p.k_partial,
            v_scale: p.v_scale,
            v_inv: p.v_inv,
            v_partial: p.v_partial,
            tickets: p.tickets,
            lse_shift: p.lse_shift,
            q_batch_stride: q[0],
            q_head_stride: q[1],
            q_seq_stride: q[2],
            k_batch_stride: k[0],
            k_head_stride: k[1],
            k_seq_stride: k[2],
            v_batch_stride: v[0],
            v_head_stride: v[1],
            v_seq_stride: v[2],
            batch: s.batch as i32,
            q_heads: s.q_heads as i32,
            kv_heads: s.kv_heads as i32,
            q_len: s.q_len as i32,
            kv_len: s.kv_len as i32,
            kv_group: (s.q_heads / s.kv_heads.max(1)) as i32,
            q_blocks: self.blocking.q_blocks(s.q_len) as i32,
            k_blocks: self.blocking.k_blocks(s.kv_len) as i32,
            chunks: chunks(s) as i32,
            kv_pad: Self::kv_pad(s) as i32,
            q_ctas: q_ctas as i32,
            k_ctas: k_ctas as i32,
            v_ctas: v_ctas as i32,
            // The codec's caller computes the fold the same way (one f32 product).
            fold: s.scale * std::f32::consts::LOG2_E,
            softmax_scale: s.scale,
        }
    }

    /// Grid of the stats launch (configurations with stats): one CTA per chunk of each (batch,
    /// kv head).
    pub fn stats_grid(&self, s: &AttentionShape) -> u32 {
        (s.batch * s.kv_heads * chunks(s)) as u32
    }

    /// Grid and block of the quantize launch: one CTA per quantize item.
    pub fn launch_dims(&self, s: &AttentionShape, pass: PrepassPass) -> ((u32, u32, u32), (u32, u32, u32)) {
        match pass {
            PrepassPass::Quantize => ((self.quantize_ctas(s) as u32, 1, 1), (THREADS, 1, 1)),
        }
    }

    /// Bytes the launch must move at least: every input element read once (Q, K and, with
    /// `v_fp8`, V), every code and scale written once. The stats launch reads K (smoothing) and
    /// V (`v_fp8`) a second time; [`Self::moved_bytes`] counts that too.
    pub fn min_bytes(&self, s: &AttentionShape) -> usize {
        let e = self.input.size_bytes();
        let (q, k) = (s.batch * s.q_heads * s.q_len, s.batch * s.kv_heads * s.kv_len);
        let d = self.head_dim as usize;
        let v = if self.v_fp8 { k } else { 0 };
        (q + k + v) * d * (e + 1)
    }

    /// [`Self::min_bytes`] plus the stats items' reads of K and V.
    pub fn moved_bytes(&self, s: &AttentionShape) -> usize {
        let e = self.input.size_bytes();
        let k = s.batch * s.kv_heads * s.kv_len * self.head_dim as usize * e;
        self.min_bytes(s) + if self.smooth_k { k } else { 0 } + if self.v_fp8 { k } else { 0 }
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
        /// `int8_prepass_stats` of the same module (configurations with stats), launched before
        /// the quantize pass.
        stats: Option<CudaFunction>,
    }

    impl Int8Prepass {
        /// Compiles (or fetches from the global cache) the passes of `config` for the
        /// context's device and loads them.
        pub fn load(ctx: &Arc<CudaContext>, config: Int8PrepassConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Int8PrepassConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let min = if config.v_fp8 { Arch::Sm89 } else { Arch::Sm80 };
            let arch = crate::device::target_arch(ctx, KERNEL, min, |cc| config.target_of(cc))?;
            let mut stats = None;
            let functions = config
                .passes()
                .iter()
                .map(|&pass| {
                    let (module, compiled) = crate::device::load_module(ctx, cache, &PrepassVariant { config, pass }.request(arch)?)?;
                    if config.has_stats() {
                        stats = Some(crate::device::module_function(&module, STATS_ENTRY, 0)?);
                    }
                    Ok((pass, crate::device::module_function(&module, compiled.entry, 0)?))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Int8Prepass { config, arch, functions, stats })
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
            let launch = |f: &CudaFunction, grid: u32| -> Result<()> {
                let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
                let mut b = stream.launch_builder(f);
                b.arg(&params);
                // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
                unsafe { b.launch(cfg) }?;
                Ok(())
            };
            // With stats, the stats launch first: the quantize items read what it writes.
            if let Some(stats) = &self.stats {
                launch(stats, self.config.stats_grid(args))?;
            }
            for (pass, function) in &self.functions {
                launch(function, self.config.launch_dims(args, *pass).0 .0)?;
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
        assert_eq!(l.k_partial, 2 * 2 * 4 * 128);
        assert_eq!(l.lse_shift, 2 * 8 * 300);
        // A ticket per (batch, kv head).
        assert_eq!(l.tickets, 2 * 2);
        assert_eq!((l.q, l.q_codes), (2 * 8 * 300 * 128, 2 * 8 * 300 * 128));
        assert_eq!((l.v, l.vt_codes, l.v_scale, l.v_inv, l.v_partial), (0, 0, 0, 0, 0));
        assert_eq!(c.passes(), &[PrepassPass::Quantize]);
        assert!(c.has_stats());
        let plain = Int8PrepassConfig { smooth_k: false, granularity: Int8Granularity::PerBlock, ..c };
        let l = plain.required_lens(&args()).unwrap();
        assert_eq!((l.q_scale, l.mean, l.k_partial, l.lse_shift, l.tickets), (2 * 8 * 3, 0, 0, 0, 0));
        assert_eq!(plain.passes(), &[PrepassPass::Quantize]);
        assert!(!plain.has_stats());
        // V in e4m3: Vᵀ rows of 777 keys padded to 896, scales per channel, stats items even
        // without smoothing.
        let v = plain.with_v_fp8();
        let l = v.required_lens(&args()).unwrap();
        assert_eq!((l.v, l.vt_codes), (2 * 2 * 777 * 128, 2 * 2 * 128 * 896));
        assert_eq!((l.v_scale, l.v_inv, l.v_partial, l.tickets, l.mean), (2 * 2 * 128, 2 * 2 * 128, 2 * 2 * 4 * 128, 4, 0));
        assert!(v.has_stats());
        assert!(l.covers(&l) && !plain.required_lens(&args()).unwrap().covers(&l));
    }

    #[test]
    fn quantize_grid_covers_whole_blocks_per_cta() {
        // 64-key K scales: two blocks per K CTA; Q blocks of 128 rows; V tiles of 128 keys.
        let c = Int8PrepassConfig::new(128, Dtype::F16, bl(128, 64, 8), Int8Granularity::PerBlock, true).unwrap().with_v_fp8();
        let a = args();
        assert_eq!(c.ctas_per_head(&a), (3, 7, 7));
        assert_eq!(c.quantize_ctas(&a), 2 * 8 * 3 + 2 * 2 * (7 + 7));
        let p = c.params(&a, &PrepassPtrs::default());
        assert_eq!((p.q_ctas, p.k_ctas, p.v_ctas, p.kv_pad, p.k_blocks, p.chunks), (3, 7, 7, 896, 13, 4));
        // The quantize launch: its items; the stats launch: 4 chunks per (batch, kv head).
        assert_eq!(c.launch_dims(&a, PrepassPass::Quantize).0, ((2 * 8 * 3 + 2 * 2 * (7 + 7)) as u32, 1, 1));
        assert_eq!(c.stats_grid(&a), 2 * 2 * 4);
        let plain = Int8PrepassConfig { smooth_k: false, v_fp8: false, ..c };
        assert_eq!(plain.launch_dims(&a, PrepassPass::Quantize).0, ((2 * 8 * 3 + 2 * 2 * 7) as u32, 1, 1));
        // 96-row blocks: one per CTA (two would not fit 128 rows).
        let odd = Int8PrepassConfig::new(128, Dtype::F16, bl(96, 48, 6), Int8Granularity::PerWarp, false).unwrap();
        assert_eq!(odd.ctas_per_head(&a), (300usize.div_ceil(96), 777usize.div_ceil(96), 0));
        // Bytes: f16 in, one byte out per element; the stats pass reads K and V again.
        let (q, k) = (2 * 8 * 300 * 128, 2 * 2 * 777 * 128);
        assert_eq!(c.min_bytes(&a), (q + 2 * k) * 3);
        assert_eq!(c.moved_bytes(&a), (q + 2 * k) * 3 + 2 * 2 * k);
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
        let ok_ptrs = PrepassPtrs { q: 16, k: 16, q_codes: 16, k_codes: 16, q_scale: 16, k_scale: 16, ..Default::default() };
        assert!(c.validate_ptrs(&ok_ptrs).is_ok());
        // With V in e4m3: V, Vᵀ, its scales, its scratch and the tickets are required.
        let v = c.with_v_fp8();
        assert!(v.validate_ptrs(&ok_ptrs).is_err());
        let all = PrepassPtrs { v: 32, vt_codes: 32, v_scale: 32, v_inv: 32, v_partial: 32, tickets: 32, ..ok_ptrs };
        assert!(v.validate_ptrs(&all).is_ok());
        assert!(v.validate_ptrs(&PrepassPtrs { tickets: 0, ..all }).is_err());
        // V strides are checked only when V is read.
        let bad_v = AttentionShape { v: Strides { batch: 2 * 777 * 64, head: 777 * 64, seq: 68 }, ..a };
        assert!(c.validate_args(&bad_v).is_ok());
        assert!(matches!(v.validate_args(&bad_v), Err(NativeError::InvalidArgs(_))));
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

    /// The codec's code: the f32 quotient rounded half to even, clamped.
    fn codec_code(x: f32, s: f32) -> i8 {
        (x / s).round_ties_even().clamp(-127.0, 127.0) as i8
    }

    /// `CodeScale::code` of the quantize pass, step for step: r = fl(1 / scale) through the
    /// prescaled inline division (reciprocal estimate `y0`), q = fl(x r), the integer of q from
    /// the bits of q + 1.5 * 2^23, and the exact path where q is within 2^-14 of a
    /// half-integer. Returns the code and whether the exact path ran.
    fn kernel_code(x: f32, s: f32, y0_ulps: i32) -> (i8, bool) {
        let f = if s < 8.673_617_4e-19 { 1.844_674_4e19f32 } else { 1.0 };
        let sf = s * f;
        let r = div_inline(1.0, sf, ulp_step(1.0 / sf, y0_ulps)) * f;
        let q = x * r;
        let b = q + 12_582_912.0;
        let d = q - (b - 12_582_912.0);
        if d.abs() < 0.499_938_964_843_75 {
            return ((b.to_bits() & 0xff) as u8 as i8, false);
        }
        let e = div_inline(x * f, sf, ulp_step(1.0 / sf, y0_ulps)).round_ties_even().clamp(-127.0, 127.0);
        (e as i8, true)
    }

    /// The product path with its midpoint guard gives the codec's code everywhere the kernel
    /// uses it: scales from amax / 127 over 2^-60 .. 2^100 amax (tiny ones prescaled), at random
    /// points, at ±amax and at every code midpoint (k + 1/2) · scale and its neighbours, where
    /// the guard must hand over to the exact division; and the exact path stays rare on random
    /// values (it costs a division).
    #[test]
    fn product_codes_with_the_midpoint_guard_are_the_codec_codes() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64;
        let (mut random, mut exact_random, mut checked) = (0usize, 0usize, 0usize);
        for _ in 0..20_000 {
            let amax = (2f64.powf(-60.0 + 160.0 * unit(next())) * (1.0 + unit(next()))) as f32;
            let s = (amax as f64 * (1.0 / 127.0)) as f32;
            let mut points: Vec<(f32, bool)> = (0..32).map(|_| ((((unit(next()) * 2.0 - 1.0) * amax as f64) as f32), true)).collect();
            points.extend([(amax, false), (-amax, false), (0.0, false)]);
            let k = (next() % 254) as i32 - 127;
            let mid = (k as f32 + 0.5) * s;
            points.extend((-4..=4).map(|d| (ulp_step(mid, d), false)));
            for (x, is_random) in points {
                if x.abs() > amax {
                    continue;
                }
                for y0 in [-1, 0, 1] {
                    let (got, exact) = kernel_code(x, s, y0);
                    assert_eq!(got, codec_code(x, s), "x {x:e} scale {s:e} (y0 {y0} ulps): exact path {exact}");
                    checked += 1;
                    if is_random {
                        random += 1;
                        exact_random += exact as usize;
                    }
                }
            }
        }
        assert!(checked > 2_000_000);
        assert!(exact_random * 1000 < random, "{exact_random} of {random} random values took the exact path");
    }

    /// The Vᵀ writer of the quantize pass, lane by lane: thread (dg, cg) reads keys
    /// 16 cg + 2j + (e & 1) + 8 (e >> 1) at channels 4dg .. 4dg + 3 as words, transposes each
    /// 4 x 4 block of bytes with byte_perm, and writes Vᵀ rows 4dg + dd, columns 16 cg + 4j + e.
    /// The result must be the attention kernel's layout: column 32c + k holds key
    /// 32c + sigma(k), sigma(k) = 16 (k / 16) + 8 ((k % 4) / 2) + 2 ((k % 16) / 4) + (k % 2).
    #[test]
    fn vt_writer_transposes_with_the_kernels_key_permutation() {
        // PTX prmt (default mode): byte i of the result is byte (sel >> 4i) & 7 of {y, x}.
        let byte_perm = |x: u32, y: u32, sel: u32| -> u32 {
            let bytes = ((y as u64) << 32) | x as u64;
            (0..4).fold(0u32, |acc, i| acc | ((((bytes >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) as u32) << (8 * i)))
        };
        let sigma = |k: usize| 16 * (k / 16) + 8 * ((k % 4) / 2) + 2 * ((k % 16) / 4) + (k % 2);
        for d in [64usize, 128] {
            let keys = 128;
            let tile: Vec<u8> = (0..keys * d).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
            let word = |key: usize, dg: usize| u32::from_le_bytes(tile[key * d + 4 * dg..][..4].try_into().unwrap());
            let mut vt = vec![0u8; d * keys];
            let dgs = d / 4;
            for tid in 0..dgs * (keys / 16) {
                let (dg, cg) = (tid % dgs, tid / dgs);
                let mut out = [[0u32; 4]; 4];
                for j in 0..4 {
                    let w: Vec<u32> = (0..4).map(|e| word(16 * cg + 2 * j + (e & 1) + 8 * (e >> 1), dg)).collect();
                    let (t0, t1) = (byte_perm(w[0], w[1], 0x5140), byte_perm(w[0], w[1], 0x7362));
                    let (t2, t3) = (byte_perm(w[2], w[3], 0x5140), byte_perm(w[2], w[3], 0x7362));
                    out[0][j] = byte_perm(t0, t2, 0x5410);
                    out[1][j] = byte_perm(t0, t2, 0x7632);
                    out[2][j] = byte_perm(t1, t3, 0x5410);
                    out[3][j] = byte_perm(t1, t3, 0x7632);
                }
                for (dd, row) in out.iter().enumerate() {
                    for (j, w) in row.iter().enumerate() {
                        vt[(4 * dg + dd) * keys + 16 * cg + 4 * j..][..4].copy_from_slice(&w.to_le_bytes());
                    }
                }
            }
            for ch in 0..d {
                for col in 0..keys {
                    let key = (col & !31) + sigma(col & 31);
                    assert_eq!(vt[ch * keys + col], tile[key * d + ch], "d {d}: Vt[{ch}][{col}] should be key {key}");
                }
            }
        }
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
