//! The Q·Kᵀ side of each mode: inputs prepared (rounded or quantized) once, then one logit per
//! (query row, key) produced exactly as the mode's MMA and dequantization would.

use super::mma;
use crate::codec::fp4::e2m1;
use crate::codec::fp8::ue4m3;
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use crate::codec::int8::{self, Int8ScaleLayout, Int8Tensor};
use crate::codec::nvfp4::{Nvfp4Tensor, BLOCK as NVFP4_BLOCK};
use crate::{AttentionProblem, Precision, QkAccum, Result};

use super::Blocking;

/// Prepared Q and K of one mode.
pub(super) enum ScorePlan {
    /// Q and K already rounded to the mode's float type.
    Float { q: Vec<f32>, k: Vec<f32>, accum: QkAccum, chunk: usize, k_step: usize },
    /// INT8 codes; the Q scales carry `softmax_scale · log2 e`, so logits come out in log2 units.
    Int8 { q: Int8Tensor, k: Int8Tensor, layout: Int8ScaleLayout, smoothing: Option<Smoothing> },
    /// FP8 codes decoded to f32 (exact), with their descales.
    Fp8 { q: Vec<f32>, k: Vec<f32>, q_desc: (Vec<f32>, DescaleLayout), k_desc: (Vec<f32>, DescaleLayout) },
    /// NVFP4 elements and block scales decoded to f32 (exact), rows in memory order; K
    /// smoothed first when `smoothing` is set.
    Nvfp4 { q: Decoded4, k: Decoded4, smoothing: Option<Smoothing> },
}

/// What is needed to add `scale · q·μ` back to the LSE.
pub(super) struct Smoothing { q: Vec<f32>, mean: Vec<f32> }

/// An NVFP4 tensor with its codes decoded: `elems` row-major like the source, `scales`
/// `[rows, cols / 16]`.
pub(super) struct Decoded4 {
    pub(super) elems: Vec<f32>,
    pub(super) scales: Vec<f32>,
    pub(super) tensor_scale: f32,
}

impl Decoded4 {
    pub(super) fn new(t: &Nvfp4Tensor) -> Self {
        let n = t.rows * t.cols;
        Decoded4 {
            elems: (0..n).map(|i| e2m1::decode(t.code(i / t.cols, i % t.cols))).collect(),
            scales: t.block_scales.iter().map(|&c| ue4m3::decode(c)).collect(),
            tensor_scale: t.tensor_scale,
        }
    }
}

impl ScorePlan {
    /// `q`, `k` are the inputs already rounded to the precision's input dtype.
    pub(super) fn prepare(
        problem: &AttentionProblem,
        precision: Precision,
        blocking: &Blocking,
        q: Vec<f32>,
        k: Vec<f32>,
    ) -> Result<Self> {
        let scale = problem.softmax_scale();
        Ok(match precision {
            Precision::F32 => ScorePlan::Float { q, k, accum: QkAccum::F32, chunk: blocking.qk_chunk, k_step: blocking.k_step },
            Precision::F16 { qk, .. } | Precision::Bf16 { qk, .. } => ScorePlan::Float { q, k, accum: qk, chunk: blocking.qk_chunk, k_step: blocking.k_step },
            Precision::Int8Qk {
                granularity, smooth_k, ..
            } => {
                let layout = Int8ScaleLayout::new(problem, granularity, blocking.int8())?;
                let fold = scale * std::f32::consts::LOG2_E;
                let qt = int8::quantize_q(problem, &layout, &q, fold)?;
                let (kt, smoothing) = if smooth_k {
                    let sm = int8::smooth_k(problem, &k)?;
                    (int8::quantize_k(problem, &layout, &sm.values)?, Some(Smoothing { q, mean: sm.mean }))
                } else {
                    (int8::quantize_k(problem, &layout, &k)?, None)
                };
                ScorePlan::Int8 { q: qt, k: kt, layout, smoothing }
            }
            Precision::Fp8 { format, descale, .. } => {
                let ql = DescaleLayout {
                    granularity: descale,
                    batch: problem.batch,
                    heads: problem.q_heads,
                    len: problem.q_len,
                    block_rows: blocking.block_q,
                };
                let kl =
                    DescaleLayout { heads: problem.kv_heads, len: problem.kv_len, block_rows: blocking.block_k, ..ql };
                let qt = Fp8Tensor::quantize(format, &q, problem.q_strides(), problem.head_dim, ql)?;
                let kt = Fp8Tensor::quantize(format, &k, problem.k_strides(), problem.head_dim, kl)?;
                let raw = |t: &Fp8Tensor| (0..t.codes.len()).map(|i| t.raw(i)).collect::<Vec<f32>>();
                ScorePlan::Fp8 { q: raw(&qt), k: raw(&kt), q_desc: (qt.descales, ql), k_desc: (kt.descales, kl) }
            }
            Precision::Nvfp4 { smooth_k, .. } => {
                // Rows gathered densely (`[batch, heads, len]` order): the 16-element blocks run
                // along each row, and a strided buffer's rows need not start at multiples of
                // the head dim (nor its padding hold numbers).
                let d = problem.head_dim;
                let dense = |x: &[f32], st: crate::Strides, heads: usize, len: usize| -> Vec<f32> {
                    (0..problem.batch * heads * len)
                        .flat_map(|r| x[st.offset(r / (heads * len), (r / len) % heads, r % len)..][..d].iter().copied())
                        .collect()
                };
                let (k, smoothing) = if smooth_k {
                    let sm = int8::smooth_k(problem, &k)?;
                    (sm.values, Some(Smoothing { q: q.clone(), mean: sm.mean }))
                } else {
                    (k, None)
                };
                let qd = dense(&q, problem.q_strides(), problem.q_heads, problem.q_len);
                let kd = dense(&k, problem.k_strides(), problem.kv_heads, problem.kv_len);
                let qt = Nvfp4Tensor::quantize(&qd, qd.len() / d, d)?;
                let kt = Nvfp4Tensor::quantize(&kd, kd.len() / d, d)?;
                ScorePlan::Nvfp4 { q: Decoded4::new(&qt), k: Decoded4::new(&kt), smoothing }
            }
        })
    }

    /// Factor turning a logit into base-2 units (`p = exp2(s·c − m·c)`).
    pub(super) fn log2_factor(&self, problem: &AttentionProblem) -> f32 {
        match self {
            ScorePlan::Int8 { .. } => 1.0,
            _ => problem.softmax_scale() * std::f32::consts::LOG2_E,
        }
    }

    /// Factor turning a logit into natural-log units (for the LSE).
    pub(super) fn natural_factor(&self, problem: &AttentionProblem) -> f32 {
        match self {
            ScorePlan::Int8 { .. } => std::f32::consts::LN_2,
            _ => problem.softmax_scale(),
        }
    }

    /// What smoothing took off the LSE of row `i` (0 without smoothing).
    pub(super) fn lse_shift(&self, problem: &AttentionProblem, b: usize, h: usize, i: usize) -> f32 {
        match self {
            ScorePlan::Int8 { smoothing: Some(sm), .. } | ScorePlan::Nvfp4 { smoothing: Some(sm), .. } => {
                let d = problem.head_dim;
                let kvh = problem.kv_head_of(h);
                let q_row = &sm.q[problem.q_strides().offset(b, h, i)..][..d];
                let mean = &sm.mean[(b * problem.kv_heads + kvh) * d..][..d];
                int8::lse_shift(q_row, mean, problem.softmax_scale())
            }
            _ => 0.0,
        }
    }

    /// The logit of query `(b, h, i)` against key `j` of KV head `kvh`, before any softmax
    /// scaling for the float, FP8 and NVFP4 modes, in log2 units for INT8.
    pub(super) fn score(&self, problem: &AttentionProblem, b: usize, h: usize, kvh: usize, i: usize, j: usize) -> f32 {
        let d = problem.head_dim;
        let qo = problem.q_strides().offset(b, h, i);
        let ko = problem.k_strides().offset(b, kvh, j);
        match self {
            ScorePlan::Float { q, k, accum, chunk, k_step } => mma::dot(&q[qo..][..d], &k[ko..][..d], *accum, *chunk, *k_step),
            ScorePlan::Int8 { q, k, layout, .. } => {
                // Integer products and sums are exact; the i32 → f32 conversion is exact while
                // |dot| < 2^24, i.e. for head_dim < 1040.
                let dot: i32 =
                    q.codes[qo..][..d].iter().zip(&k.codes[ko..][..d]).map(|(&a, &b)| a as i32 * b as i32).sum();
                let qs = q.scales[layout.q_scale_index(b, h, i)];
                let ks = k.scales[layout.k_scale_index(b, kvh, j)];
                dot as f32 * (qs * ks)
            }
            ScorePlan::Fp8 { q, k, q_desc, k_desc } => {
                let dot = mma::dot(&q[qo..][..d], &k[ko..][..d], QkAccum::F32, d, mma::K_STEP);
                dot * (q_desc.0[q_desc.1.index(b, h, i)] * k_desc.0[k_desc.1.index(b, kvh, j)])
            }
            ScorePlan::Nvfp4 { q, k, .. } => {
                // A block-scaled MMA: per 16-element block the E2M1 products (exact) are summed
                // and multiplied by both UE4M3 scales (exact), blocks accumulate in f32, and the
                // tensor scales are applied once at the end.
                let qr = (b * problem.q_heads + h) * problem.q_len + i;
                let kr = (b * problem.kv_heads + kvh) * problem.kv_len + j;
                let nb = d / NVFP4_BLOCK;
                let mut acc = 0.0f32;
                for blk in 0..nb {
                    let qe = &q.elems[qr * d + blk * NVFP4_BLOCK..][..NVFP4_BLOCK];
                    let ke = &k.elems[kr * d + blk * NVFP4_BLOCK..][..NVFP4_BLOCK];
                    let inner = qe.iter().zip(ke).fold(0.0f32, |s, (a, b)| s + a * b);
                    acc += (q.scales[qr * nb + blk] * k.scales[kr * nb + blk]) * inner;
                }
                acc * (q.tensor_scale * k.tensor_scale)
            }
        }
    }
}
