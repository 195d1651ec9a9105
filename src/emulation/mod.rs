//! CPU emulations of every [`Precision`]: attention computed the way a tiled flash-attention
//! kernel computes it, rounding at the same points, so a kernel can be held to "the quantization
//! error this mode is expected to have" and not only to an f64 reference.
//!
//! # The order of operations (all of it in f32 unless a mode says otherwise)
//! Per query row `i` of Q head `h` (KV head `h / (q_heads / kv_heads)`), over KV tiles of
//! `block_k` keys, skipping tiles past the row's last visible key (bottom-right causal rule):
//! 1. `s_j` for the tile's keys, as the mode's Q·Kᵀ says (below); masked keys get `-inf`.
//! 2. `m_new = max(m, max_j s_j)`; `p_j = exp2(fma(s_j, c, −m_new·c))` with
//!    `c = softmax_scale · log2 e` (or `c = 1` where that constant is folded into Q's scale);
//!    `alpha = exp2((m − m_new)·c)` (0 on the first tile). Kernels may keep a stale max
//!    instead (FlashAttention-4's conditional rescale: the max only moves once it has grown by
//!    more than a threshold, 8 in log2 units, so `p ≤ 2^8`); that is the same softmax, with P
//!    rounded to 16 bits in another binade: same relative error, not the same bits. The
//!    emulation always moves the max.
//! 3. `l = l·alpha + Σ_j p_j` (the **unrounded** f32 p, in key order).
//! 4. `acc = acc·alpha`, then `acc += P·V` with P rounded to the mode's P format (for the
//!    tile-local modes the tile's product is formed first and folded in as
//!    `acc = acc·alpha + tile`).
//! 5. At the end `O = acc / l` (a division; kernels that multiply by `1/l` differ by ≤ 1 ulp)
//!    and `LSE = m·scale_nat + ln(l)` (`scale_nat = softmax_scale`, or `ln 2` where logits are in
//!    log2 units), plus the smoothing shift where K was smoothed. Rows that see no key:
//!    `O = 0`, `LSE = -inf`.
//!
//! Products of two low-precision operands are exact in f32; they are summed in k-steps of
//! [`Blocking::k_step`] (16: one `m16n8k16` MMA; 1: an FMA kernel) and each step is added to the
//! accumulator, which is rounded to its own type (once: an f16 accumulator takes the exact sum
//! rounded to f16, as a fused multiply-add does). A partial last k-step is a zero-padded one, which changes no sum, so no head-dim
//! divisibility is needed except NVFP4's 16-element and MXFP4's 32-element scale blocks. `exp2` and `ln` are the
//! CPU's (correctly rounded or nearly); device `ex2.approx` differs by a few ulps.
//!
//! # Modes
//! Inputs are first rounded to [`Precision::input_dtype`] (what a kernel receives), then:
//! * `F32`: nothing else.
//! * `F16`/`Bf16 {qk, pv}`: Q, K, V in the 16-bit type; QK `F32`: f32 accumulator; `F16`: f16
//!   accumulator rounded after every k-step; `TwoStage`: f16 accumulation within each
//!   `qk_chunk` of the head dim, each chunk's f16 result added to an f32 sum. P rounded to f16
//!   (bf16 for `Bf16`). PV `F32`: f32 accumulator; `F16PerTile`: f16 accumulation over the
//!   tile's k-steps, folded into f32 once per tile after the rescale. bf16 MMAs only accumulate
//!   in f32, so `Bf16` with QK `F16` or `TwoStage`, or PV `F16PerTile`, is an error.
//! * `Int8Qk`: Q and K as [`crate::codec::int8`] describes (scales laid out for
//!   `Int8Blocking { block_q, block_k, warps }` of this [`Blocking`]), `softmax_scale · log2 e`
//!   folded into Q's scales; `s = (Σ q_i8·k_i8) as f32 · (q_scale · k_scale)` in log2 units.
//!   With `smooth_k`, K − μ is quantized and the LSE returned is that of the **unsmoothed**
//!   logits: `scale · (q · μ)` is added back ([`crate::codec::int8::lse_shift`], q the f16 Q).
//!   PV `F16`: P and V in f16, f32 accumulator. PV `Fp8`: P as `e4m3(p · 448)`; V as E4M3 with
//!   one scale per (batch, KV head, channel) over all keys, `amax / 448`; each tile's product
//!   of decoded values is summed in f32 and multiplied by `v_scale / 448` before it is added.
//! * `Fp8 {format, descale, p}`: Q, K, V as [`crate::codec::fp8_scaled`] (descale blocks:
//!   `block_q` rows of Q, `block_k` keys of K and V); `s = (Σ q·k) · (q_descale · k_descale)`,
//!   decoded codes, exact products, f32 accumulator. P `F16`: f16; P `Fp8`: `e4m3(p · 448)`
//!   **also when the format is E5M2** — P lies in [0, 1] and needs mantissa, not range, and
//!   mixed E4M3×E5M2 MMAs exist (sm_89+ `mma`, `wgmma`). The tile product is multiplied by
//!   `v_descale` (`/ 448` for FP8 P), per tile (V's descale may change per tile). The portable
//!   FP8 mma kernel with per-block descales folds `v_descale` into P instead and rounds
//!   `p · v_descale` (relative to the row's largest such product) to f16: like the stale max,
//!   the same relative error, not the same bits (its host twin is `tests/fp8_mma_block_twin.rs`).
//! * `Nvfp4 {v}`: Q and K as [`crate::codec::nvfp4`] along the head dim (each tensor one tensor
//!   scale; `head_dim % 16 == 0`); `s` is a block-scaled MMA: per 16-block
//!   `(sq · sk) · Σ e2m1·e2m1` (exact), blocks summed in f32, times `ts_q · ts_k`. `v: Bf16`: P
//!   and V in bf16, f32 accumulator. `v: Nvfp4`: V in NVFP4 with 16-key blocks per channel (the
//!   key axis padded with zeros to a multiple of 16; one tensor scale); P in NVFP4 with 16-key
//!   blocks per row and the fixed tensor scale `tensor_scale_for(1.0) = 1/2688`, valid because
//!   `p ≤ 1`; per block `(sp · sv) · Σ e2m1·e2m1`, summed in f32 over the tile, times
//!   `ts_p · ts_v` (`block_k % 16 == 0`). `v: Nvfp4P16`: V as for `v: Nvfp4` (the same
//!   codes), P rounded to f16; per stretch of a tile's keys inside one 16-key block of V,
//!   `sv · Σ p16·e2m1` (exact products, summed in f32 in key order), summed in f32 over the
//!   tile, times `ts_v` (any `block_k`). With `smooth_k`, K − μ is quantized (μ and the
//!   subtraction as [`crate::codec::int8::smooth_k`]) and the LSE gets `scale · (q · μ)` back
//!   ([`crate::codec::int8::lse_shift`], q the input-rounded Q), as for INT8.
//! * `Mxfp4`: Q and K as [`crate::codec::mxfp4`] along the head dim (E8M0 scale per 32, no
//!   tensor scale; `head_dim % 32 == 0`); `s` per 32-block `(sq · sk) · Σ e2m1·e2m1` (exact),
//!   blocks summed in f32. P and V in bf16, f32 accumulator. `smooth_k` as for `Nvfp4`.

mod mma;
mod scores;
mod values;

#[cfg(test)]
mod tests;

use rayon::prelude::*;

use crate::codec::float16::{round_bf16_vec, round_f16_vec};
use crate::{AttentionProblem, Dtype, Error, Nvfp4V, Precision, PvAccum, QkAccum, Result};
pub(crate) use scores::quantize_qk_4bit;
use scores::ScorePlan;
pub(crate) use values::quantize_vt_nvfp4;
use values::ValuePlan;

/// Tile shape the emulation follows (it must be the kernel's for bit-level agreement of the
/// quantization scales and tile-wise rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Blocking {
    /// Query rows per block: the INT8 Q-scale and FP8 Q-descale block.
    pub block_q: usize,
    /// Keys per KV tile: the online-softmax step, the K scale block, the F16PerTile fold.
    pub block_k: usize,
    /// Warps per query block (INT8 per-warp / per-thread scales).
    pub warps: usize,
    /// Head-dim chunk of the TwoStage QK accumulation (a multiple of `k_step`).
    pub qk_chunk: usize,
    /// Products summed (in f32) before each add into an accumulator of the float modes: 16
    /// for tensor-core kernels (`m16n8k16`), 1 for FMA kernels, whose every step is one fused
    /// multiply-add (the portable packed-f16 kernel).
    pub k_step: usize,
    /// Independent online softmaxes over interleaved KV tiles (a split-KV decode kernel whose
    /// warps each keep their own running max), merged at the end; `None`: one softmax over
    /// every tile in order.
    pub key_streams: Option<KeyStreams>,
}

/// The KV tiles each online softmax of a split-KV kernel walks: split `s` holds keys
/// `[s · keys_per_split, (s + 1) · keys_per_split)`, cut into cube tiles of `warps · block_k`
/// keys, and warp `w` of the split takes the `block_k` keys from `w · block_k` of each, in
/// order, with its own running max; the states are merged in f32 by their maxima. The modes
/// that round P against the running max (NVFP4 P) depend on this walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyStreams {
    pub keys_per_split: usize,
    pub warps: usize,
}

impl KeyStreams {
    /// The first key of each tile of stream `(split, warp)` below `kv_len`, in walk order.
    pub fn tiles(&self, block_k: usize, kv_len: usize, split: usize, warp: usize) -> impl Iterator<Item = usize> {
        let begin = split * self.keys_per_split;
        let end = (begin + self.keys_per_split).min(kv_len);
        let cube = self.warps * block_k;
        (begin..end).step_by(cube.max(1)).map(move |c| c + warp * block_k).filter(move |&k0| k0 < end)
    }

    /// Splits over `kv_len` keys.
    pub fn splits(&self, kv_len: usize) -> usize {
        kv_len.div_ceil(self.keys_per_split.max(1)).max(1)
    }
}

impl Default for Blocking {
    fn default() -> Self {
        Blocking { block_q: 128, block_k: 64, warps: 8, qk_chunk: 32, k_step: mma::K_STEP, key_streams: None }
    }
}

impl Blocking {
    /// The INT8 scale blocking (`codec::int8::Int8Blocking`) of this tiling.
    pub fn int8(&self) -> crate::codec::int8::Int8Blocking {
        crate::codec::int8::Int8Blocking { block_q: self.block_q, block_k: self.block_k, warps: self.warps }
    }

    /// Checks the blocking against the problem and mode.
    pub fn validate(&self, problem: &AttentionProblem, precision: Precision) -> Result<()> {
        if self.block_q == 0 || self.block_k == 0 || self.warps == 0 || self.qk_chunk == 0 || self.k_step == 0 {
            return Err(Error::Quantization(format!(
                "emulation blocking has a zero size: {self:?}"
            )));
        }
        if let Some(ks) = self.key_streams {
            if ks.warps == 0 || ks.keys_per_split == 0 || !ks.keys_per_split.is_multiple_of(ks.warps * self.block_k) {
                return Err(Error::Quantization(format!(
                    "key streams {ks:?}: splits must be whole cube tiles of {} warps x {} keys",
                    ks.warps, self.block_k
                )));
            }
        }
        match precision {
            Precision::F16 {
                qk: QkAccum::TwoStage, ..
            } if !self.qk_chunk.is_multiple_of(self.k_step) => Err(Error::Quantization(format!(
                "qk_chunk {} is not a multiple of the k-step {}",
                self.qk_chunk, self.k_step
            ))),
            Precision::Int8Qk { granularity, .. } => crate::codec::int8::check_blocking(&self.int8(), granularity),
            Precision::Nvfp4 { v, .. } => {
                if !problem.head_dim.is_multiple_of(16) {
                    return Err(Error::UnsupportedHeadDim {
                        head_dim: problem.head_dim,
                        path: "NVFP4 (16-element scale blocks along the head dim)".into(),
                        supported: (1..=16).map(|i| 16 * i).collect(),
                    });
                }
                // NVFP4 P takes its 16-key scale blocks per tile; f16 P has none (V's blocks
                // are indexed by key, so tiles may cut them).
                if v == Nvfp4V::Nvfp4 && !self.block_k.is_multiple_of(16) {
                    return Err(Error::Quantization(format!(
                        "NVFP4 P·V needs block_k % 16 == 0 (16-key scale blocks), got {}",
                        self.block_k
                    )));
                }
                Ok(())
            }
            Precision::Mxfp4 { .. } if !problem.head_dim.is_multiple_of(32) => Err(Error::UnsupportedHeadDim {
                head_dim: problem.head_dim,
                path: "MXFP4 (32-element scale blocks along the head dim)".into(),
                supported: (1..=8).map(|i| 32 * i).collect(),
            }),
            _ => Ok(()),
        }
    }
}

/// What [`emulate`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct EmulatedOutput {
    /// O in the problem's layout (`o_strides`).
    pub o: Vec<f32>,
    /// Natural-log LSE, `[batch, q_heads, q_len]`; `-inf` for rows that see no key.
    pub lse: Vec<f32>,
}

fn unsupported(precision: Precision, reason: &str) -> Error {
    Error::UnsupportedPrecision { precision, device: "any device".into(), reason: reason.into() }
}

/// Runs attention on the CPU the way a kernel of `precision` with tile shape `blocking` would
/// (module docs). `q`, `k`, `v` are f32 in the problem's layout; all rounding happens here.
pub fn emulate(
    problem: &AttentionProblem,
    precision: Precision,
    blocking: &Blocking,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Result<EmulatedOutput> {
    problem.validate()?;
    // The emulations model the kernels' arithmetic on plain attention, not score modifiers.
    crate::registry::refuse_modifiers(problem, "the CPU emulation")?;
    crate::registry::refuse_paged(problem, "the CPU emulation")?;
    crate::registry::refuse_varlen(problem, "the CPU emulation")?;
    problem.check_lengths(q.len(), k.len(), v.len())?;
    if let Precision::Bf16 { qk, pv } = precision {
        if qk != QkAccum::F32 || pv != PvAccum::F32 {
            return Err(unsupported(
                precision,
                "bf16 MMAs accumulate only in f32; f16 accumulation is an f16-input mode",
            ));
        }
    }
    blocking.validate(problem, precision)?;

    let round = |x: &[f32]| match precision.input_dtype() {
        Dtype::F32 => x.to_vec(),
        Dtype::F16 => round_f16_vec(x),
        Dtype::Bf16 => round_bf16_vec(x),
    };
    let scores = ScorePlan::prepare(problem, precision, blocking, round(q), round(k))?;
    let values = ValuePlan::prepare(problem, precision, blocking, round(v))?;

    let rows = problem.batch * problem.q_heads * problem.q_len;
    let results: Vec<(Vec<f32>, f32)> = (0..rows)
        .into_par_iter()
        .map_init(Vec::new, |scratch, r| {
            let (b, h, i) = (
                r / (problem.q_heads * problem.q_len),
                (r / problem.q_len) % problem.q_heads,
                r % problem.q_len,
            );
            row(problem, blocking, &scores, &values, b, h, i, scratch)
        })
        .collect();

    let mut o = vec![0.0f32; problem.o_len_elems()];
    let mut lse = vec![0.0f32; rows];
    let st = problem.o_strides();
    for (r, (orow, l)) in results.into_iter().enumerate() {
        let (b, h, i) = (
            r / (problem.q_heads * problem.q_len),
            (r / problem.q_len) % problem.q_heads,
            r % problem.q_len,
        );
        o[st.offset(b, h, i)..][..problem.v_head_dim].copy_from_slice(&orow);
        lse[r] = l;
    }
    Ok(EmulatedOutput { o, lse })
}

/// One query row through the online softmax (steps 1–5 of the module docs).
#[allow(clippy::too_many_arguments)]
fn row(
    problem: &AttentionProblem,
    blocking: &Blocking,
    scores: &ScorePlan,
    values: &ValuePlan,
    b: usize,
    h: usize,
    i: usize,
    scratch: &mut Vec<f32>,
) -> (Vec<f32>, f32) {
    let dv = problem.v_head_dim;
    let visible = problem.visible_keys(i);
    if visible == 0 {
        return (vec![0.0f32; dv], f32::NEG_INFINITY);
    }
    let kvh = problem.kv_head_of(h);
    let c = scores.log2_factor(problem);
    let bk = blocking.block_k;
    let (m, l, acc) = match blocking.key_streams {
        None => stream(problem, blocking, scores, values, b, h, kvh, i, (0..visible.div_ceil(bk)).map(|t| t * bk), scratch),
        Some(ks) => {
            // Each (split, warp) stream alone, then the states merged by their maxima.
            let mut states = Vec::new();
            for split in 0..ks.splits(problem.kv_len) {
                for warp in 0..ks.warps {
                    let tiles = ks.tiles(bk, problem.kv_len, split, warp).filter(|&k0| k0 < visible);
                    states.push(stream(problem, blocking, scores, values, b, h, kvh, i, tiles, scratch));
                }
            }
            let m = states.iter().fold(f32::NEG_INFINITY, |a, s| a.max(s.0));
            let mut acc = vec![0.0f32; dv];
            let mut l = 0.0f32;
            if m != f32::NEG_INFINITY {
                for (ms, ls, accs) in &states {
                    if *ms == f32::NEG_INFINITY {
                        continue;
                    }
                    let w = ((ms - m) * c).exp2();
                    l += ls * w;
                    acc.iter_mut().zip(accs).for_each(|(a, x)| *a += x * w);
                }
            }
            (m, l, acc)
        }
    };
    let mut acc = acc;
    if l == 0.0 {
        return (vec![0.0; dv], f32::NEG_INFINITY);
    }
    acc.iter_mut().for_each(|a| *a /= l);
    let lse = m * scores.natural_factor(problem) + l.ln() + scores.lse_shift(problem, b, h, i);
    (acc, lse)
}

/// One online softmax over the KV tiles starting at `tiles` (steps 1–4 of the module docs):
/// its running max, row sum and unnormalized accumulator.
#[allow(clippy::too_many_arguments)]
fn stream(
    problem: &AttentionProblem,
    blocking: &Blocking,
    scores: &ScorePlan,
    values: &ValuePlan,
    b: usize,
    h: usize,
    kvh: usize,
    i: usize,
    tiles: impl Iterator<Item = usize>,
    scratch: &mut Vec<f32>,
) -> (f32, f32, Vec<f32>) {
    let dv = problem.v_head_dim;
    let visible = problem.visible_keys(i);
    let c = scores.log2_factor(problem);
    let mut acc = vec![0.0f32; dv];
    let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
    let mut s = vec![0.0f32; blocking.block_k];
    let mut p = vec![0.0f32; blocking.block_k];
    for k0 in tiles {
        let tile = k0 / blocking.block_k;
        let n = blocking.block_k.min(problem.kv_len - k0);
        for (jj, sj) in s[..n].iter_mut().enumerate() {
            let j = k0 + jj;
            *sj = if j < visible {
                scores.score(problem, b, h, kvh, i, j)
            } else {
                f32::NEG_INFINITY
            };
        }
        let m_new = s[..n].iter().fold(m, |a, &x| a.max(x));
        if m_new == f32::NEG_INFINITY {
            continue; // nothing finite yet: no probability mass, nothing to rescale
        }
        let mc = m_new * c;
        for (pj, &sj) in p[..n].iter_mut().zip(&s[..n]) {
            *pj = if sj == f32::NEG_INFINITY {
                0.0
            } else {
                sj.mul_add(c, -mc).exp2()
            };
        }
        let alpha = if m == f32::NEG_INFINITY {
            0.0
        } else {
            ((m - m_new) * c).exp2()
        };
        l = l * alpha + p[..n].iter().sum::<f32>();
        values.accumulate(problem, b, kvh, tile, k0, &p[..n], alpha, &mut acc, scratch);
        m = m_new;
    }
    (m, l, acc)
}
