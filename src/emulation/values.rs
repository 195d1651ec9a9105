//! The P·V side of each mode: V prepared once, then per KV tile the probabilities rounded to
//! the mode's P format and the tile's product folded into the running f32 accumulator.

use super::mma::{add_f16, K_STEP};
use super::scores::Decoded4;
use super::Blocking;
use crate::codec::float16::{round_bf16, round_f16};
use crate::codec::fp4::e2m1;
use crate::codec::fp8::{e4m3, ue4m3, Saturation};
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use crate::codec::nvfp4::{self, Nvfp4Tensor, BLOCK as NVFP4_BLOCK};
use crate::{AttentionProblem, Nvfp4V, Precision, PvAccum, PvFormat, Result};

/// Rounding of P (and of V, for the float modes) before the product.
#[derive(Clone, Copy)]
pub(super) enum Round {
    F32,
    F16,
    Bf16,
}

impl Round {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            Round::F32 => x,
            Round::F16 => round_f16(x),
            Round::Bf16 => round_bf16(x),
        }
    }
}

/// P in FP8 is always E4M3 of `p · 448`: `p ≤ 1`, so the product uses the full E4M3 range
/// (448 = its max) and the fixed factor 1/448 is folded into the V descale.
pub(super) const P_FP8_SCALE: f32 = e4m3::MAX;

#[derive(Clone, Copy)]
pub(super) enum PQuant {
    F16,
    E4m3x448,
}

/// Prepared V of one mode.
pub(super) enum ValuePlan {
    /// P rounded by `round`, V (already rounded), products accumulated as `accum` says, in
    /// steps of `k_step` keys.
    Float { round: Round, v: Vec<f32>, accum: PvAccum, k_step: usize },
    /// P as `pq`, V as decoded FP8 codes; the tile's f32 product is multiplied by
    /// `factors[((b · kv_heads + kvh) · tiles + t) · v_head_dim + c]` (`t = 0` unless
    /// `per_tile`) before it is added to the accumulator.
    Scaled { pq: PQuant, v: Vec<f32>, factors: Vec<f32>, tiles: usize, per_tile: bool },
    /// V transposed to channel rows `[(b · kv_heads + kvh) · v_head_dim + c]` of the key sequence
    /// padded to a multiple of 16, in NVFP4; P as `p` says.
    Nvfp4 { v: Decoded4, cols: usize, p: Nvfp4P },
}

/// P of the NVFP4-V modes.
#[derive(Clone, Copy)]
pub(super) enum Nvfp4P {
    /// NVFP4, quantized per tile in 16-key blocks with this fixed tensor scale.
    Nvfp4 { tensor_scale: f32 },
    /// Rounded to f16.
    F16,
}

impl ValuePlan {
    /// `v` is the input already rounded to the precision's input dtype.
    pub(super) fn prepare(
        problem: &AttentionProblem,
        precision: Precision,
        blocking: &Blocking,
        v: Vec<f32>,
    ) -> Result<Self> {
        let k_step = blocking.k_step;
        let float = |round, accum| ValuePlan::Float { round, v: v.iter().map(|&x| Round::apply(round, x)).collect(), accum, k_step };
        Ok(match precision {
            Precision::F32 => float(Round::F32, PvAccum::F32),
            Precision::F16 { pv, .. } => float(Round::F16, pv),
            Precision::Bf16 { pv, .. } => float(Round::Bf16, pv),
            Precision::Int8Qk { pv: PvFormat::F16, .. } => float(Round::F16, PvAccum::F32),
            Precision::Nvfp4 { v: Nvfp4V::Bf16, .. } | Precision::Mxfp4 { .. } => float(Round::Bf16, PvAccum::F32),
            Precision::Int8Qk { pv: PvFormat::Fp8, .. } => per_channel_e4m3(problem, &v)?,
            Precision::Fp8 { format, descale, p } => {
                let l = DescaleLayout {
                    granularity: descale,
                    batch: problem.batch,
                    heads: problem.kv_heads,
                    len: problem.kv_len,
                    block_rows: blocking.block_k,
                };
                let t = Fp8Tensor::quantize(format, &v, problem.v_strides(), problem.v_head_dim, l)?;
                let (pq, p_div) = match p {
                    PvFormat::F16 => (PQuant::F16, 1.0),
                    PvFormat::Fp8 => (PQuant::E4m3x448, P_FP8_SCALE),
                };
                let tiles = problem.kv_len.div_ceil(blocking.block_k);
                let dv = problem.v_head_dim;
                let mut factors = vec![0.0f32; problem.batch * problem.kv_heads * tiles * dv];
                for b in 0..problem.batch {
                    for h in 0..problem.kv_heads {
                        for tile in 0..tiles {
                            let f = t.descales[l.index(b, h, tile * blocking.block_k)] / p_div;
                            factors[((b * problem.kv_heads + h) * tiles + tile) * dv..][..dv].fill(f);
                        }
                    }
                }
                let v = (0..t.codes.len()).map(|i| t.raw(i)).collect();
                ValuePlan::Scaled { pq, v, factors, tiles, per_tile: true }
            }
            Precision::Nvfp4 { v: v_format @ (Nvfp4V::Nvfp4 | Nvfp4V::Nvfp4P16), .. } => {
                let t = quantize_vt_nvfp4(problem, &v)?;
                let p = match v_format {
                    Nvfp4V::Nvfp4P16 => Nvfp4P::F16,
                    _ => Nvfp4P::Nvfp4 { tensor_scale: nvfp4::tensor_scale_for(1.0) },
                };
                ValuePlan::Nvfp4 { v: Decoded4::new(&t), cols: t.cols, p }
            }
        })
    }

    /// Rescales `acc` by `alpha` and adds the tile's `P·V`. `p` holds the f32 probabilities of
    /// keys `k0 .. k0 + p.len()` (0 for masked keys); `tile` is the tile's index.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn accumulate(
        &self,
        problem: &AttentionProblem,
        b: usize,
        kvh: usize,
        tile: usize,
        k0: usize,
        p: &[f32],
        alpha: f32,
        acc: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        let dv = problem.v_head_dim;
        let st = problem.v_strides();
        let off = |j: usize| st.offset(b, kvh, j);
        scratch.clear();
        scratch.resize(dv, 0.0);
        let step = scratch.as_mut_slice();
        match self {
            ValuePlan::Float { round, v, accum, k_step } => {
                let pr: Vec<f32> = p.iter().map(|&x| round.apply(x)).collect();
                let ks = *k_step;
                match accum {
                    PvAccum::F32 => {
                        acc.iter_mut().for_each(|a| *a *= alpha);
                        for (s, ps) in pr.chunks(ks).enumerate() {
                            step_product(ps, v, k0 + s * ks, &off, step);
                            acc.iter_mut().zip(step.iter()).for_each(|(a, x)| *a += x);
                        }
                    }
                    PvAccum::F16PerTile => {
                        let mut tile16 = vec![0.0f32; dv];
                        for (s, ps) in pr.chunks(ks).enumerate() {
                            step_product(ps, v, k0 + s * ks, &off, step);
                            tile16
                                .iter_mut()
                                .zip(step.iter())
                                .for_each(|(a, x)| *a = add_f16(*a, *x));
                        }
                        acc.iter_mut().zip(&tile16).for_each(|(a, t)| *a = *a * alpha + t);
                    }
                }
            }
            ValuePlan::Scaled { pq, v, factors, tiles, per_tile } => {
                let pr: Vec<f32> = p
                    .iter()
                    .map(|&x| match pq {
                        PQuant::F16 => round_f16(x),
                        PQuant::E4m3x448 => e4m3::decode(e4m3::encode(x * P_FP8_SCALE, Saturation::Saturate)),
                    })
                    .collect();
                let mut tile_sum = vec![0.0f32; dv];
                for (s, ps) in pr.chunks(K_STEP).enumerate() {
                    step_product(ps, v, k0 + s * K_STEP, &off, step);
                    tile_sum.iter_mut().zip(step.iter()).for_each(|(a, x)| *a += x);
                }
                let t = if *per_tile { tile } else { 0 };
                let f = &factors[((b * problem.kv_heads + kvh) * tiles + t) * dv..][..dv];
                for ((a, s), f) in acc.iter_mut().zip(&tile_sum).zip(f) {
                    *a = *a * alpha + s * f;
                }
            }
            ValuePlan::Nvfp4 { v, cols, p: Nvfp4P::F16 } => {
                // Per stretch of the tile's keys in one 16-key block of V: for every channel
                // `sv · Σ p16·e` (exact products summed in f32 in key order), summed over the
                // tile in f32, times V's tensor scale.
                let nb = cols / NVFP4_BLOCK;
                let pr: Vec<f32> = p.iter().map(|&x| round_f16(x)).collect();
                let mut tile_sum = vec![0.0f32; dv];
                let mut start = 0;
                while start < pr.len() {
                    let blk = (k0 + start) / NVFP4_BLOCK;
                    let end = ((blk + 1) * NVFP4_BLOCK - k0).min(pr.len());
                    let (ps, j0) = (&pr[start..end], k0 + start);
                    for (c, t) in tile_sum.iter_mut().enumerate() {
                        let row = (b * problem.kv_heads + kvh) * dv + c;
                        let ve = &v.elems[row * cols + j0..][..ps.len()];
                        let inner = ps.iter().zip(ve).fold(0.0f32, |s, (a, b)| s + a * b);
                        *t += v.scales[row * nb + blk] * inner;
                    }
                    start = end;
                }
                let f = v.tensor_scale;
                acc.iter_mut().zip(&tile_sum).for_each(|(a, s)| *a = *a * alpha + s * f);
            }
            ValuePlan::Nvfp4 { v, cols, p: Nvfp4P::Nvfp4 { tensor_scale } } => {
                let ts = *tensor_scale;
                let nb = cols / NVFP4_BLOCK;
                let mut tile_sum = vec![0.0f32; dv];
                for (blk_in_tile, pb) in p.chunks(NVFP4_BLOCK).enumerate() {
                    let amax = pb.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let code = nvfp4::block_scale_code(amax, ts);
                    let pe: Vec<f32> = pb.iter().map(|&x| e2m1::decode(nvfp4::encode_element(x, code, ts))).collect();
                    let p_scale = ue4m3::decode(code);
                    let blk = (k0 + blk_in_tile * NVFP4_BLOCK) / NVFP4_BLOCK;
                    for (c, t) in tile_sum.iter_mut().enumerate() {
                        let row = (b * problem.kv_heads + kvh) * dv + c;
                        let ve = &v.elems[row * cols + blk * NVFP4_BLOCK..][..pb.len()];
                        let inner = pe.iter().zip(ve).fold(0.0f32, |s, (a, b)| s + a * b);
                        *t += (p_scale * v.scales[row * nb + blk]) * inner;
                    }
                }
                let f = ts * v.tensor_scale;
                acc.iter_mut().zip(&tile_sum).for_each(|(a, s)| *a = *a * alpha + s * f);
            }
        }
    }
}

/// Vᵀ in NVFP4 (the `v: Nvfp4` mode's V; `v` rounded to the input dtype): channel rows
/// `[(b · kv_heads + kvh) · v_head_dim + c]` over the keys, padded with zeros to a multiple of
/// 16, so the 16-element blocks run along the key axis; one tensor scale. The emulation and the
/// CPU 4-bit kernel both quantize through here.
pub(crate) fn quantize_vt_nvfp4(problem: &AttentionProblem, v: &[f32]) -> Result<Nvfp4Tensor> {
    let (dv, n) = (problem.v_head_dim, problem.kv_len);
    let cols = n.div_ceil(NVFP4_BLOCK) * NVFP4_BLOCK;
    let rows = problem.batch * problem.kv_heads * dv;
    let mut vt = vec![0.0f32; rows * cols];
    let st = problem.v_strides();
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            for j in 0..n {
                for c in 0..dv {
                    vt[((b * problem.kv_heads + h) * dv + c) * cols + j] = v[st.offset(b, h, j) + c];
                }
            }
        }
    }
    Nvfp4Tensor::quantize(&vt, rows, cols)
}

/// One k-step of P·V over up to 16 keys (or `k_step`): for every channel, the exact products summed in f32
/// in key order (the same model as [`super::mma`]). The step's first key is `key0`; V's row of
/// key `j` starts at `offset(j)`.
fn step_product(ps: &[f32], v: &[f32], key0: usize, offset: &dyn Fn(usize) -> usize, out: &mut [f32]) {
    out.fill(0.0);
    let dv = out.len();
    for (jj, &pj) in ps.iter().enumerate() {
        for (o, &x) in out.iter_mut().zip(&v[offset(key0 + jj)..][..dv]) {
            *o += pj * x;
        }
    }
}

/// V as E4M3 with one scale per (batch, KV head, channel) over all keys
/// ([`crate::codec::int8::quantize_v_e4m3`]: `scale = amax / 448`, code `e4m3(v · (1 / scale))`,
/// the rounding of the native prepass); the INT8 mode's FP8 P·V operand. The factor applied to
/// each tile's product is `scale / 448` (V's scale and P's 1/448).
fn per_channel_e4m3(problem: &AttentionProblem, v: &[f32]) -> Result<ValuePlan> {
    let q = crate::codec::int8::quantize_v_e4m3(problem, v)?;
    let dec = q.codes.iter().map(|&c| e4m3::decode(c)).collect();
    let factors = q.scales.iter().map(|s| s / P_FP8_SCALE).collect();
    Ok(ValuePlan::Scaled { pq: PQuant::E4m3x448, v: dec, factors, tiles: 1, per_tile: false })
}
