//! The Q·Kᵀ side of each mode: inputs prepared (rounded or quantized) once, then one logit per
//! (query row, key) produced exactly as the mode's MMA and dequantization would.

use super::mma;
use crate::codec::fp4::{e2m1, BlockScaled4};
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use crate::codec::int8::{self, Int8ScaleLayout, Int8Tensor};
use crate::codec::mxfp4::Mxfp4Tensor;
use crate::codec::nvfp4::Nvfp4Tensor;
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
    /// NVFP4 or MXFP4 elements and block scales decoded to f32 (exact), rows in `[batch, heads,
    /// len]` order; K smoothed first when `smoothing` is set.
    Fp4 { q: Decoded4, k: Decoded4, smoothing: Option<Smoothing> },
}

/// What is needed to add `scale · q·μ` back to the LSE.
pub(super) struct Smoothing { q: Vec<f32>, mean: Vec<f32> }

/// A block-scaled 4-bit tensor with its codes decoded: `elems` row-major like the source,
/// `scales` `[rows, cols / block]`.
pub(super) struct Decoded4 {
    pub(super) elems: Vec<f32>,
    pub(super) scales: Vec<f32>,
    pub(super) tensor_scale: f32,
    /// Elements per scale: 16 (NVFP4) or 32 (MXFP4).
    pub(super) block: usize,
}

impl Decoded4 {
    pub(super) fn new<T: BlockScaled4>(t: &T) -> Self {
        Decoded4 {
            elems: t.packed().iter().flat_map(|&b| [e2m1::decode(b), e2m1::decode(b >> 4)]).collect(),
            scales: t.scale_codes().iter().map(|&c| T::decode_scale(c)).collect(),
            tensor_scale: t.tensor_scale(),
            block: T::BLOCK,
        }
    }
}

/// Q and K of a 4-bit mode as its kernels quantize them.
pub(crate) struct Qk4<T> {
    /// Q's rows, `[batch, q_heads, q_len]` by `head_dim`.
    pub q: T,
    /// K's rows (K − μ with smoothing), `[batch, kv_heads, kv_len]` by `head_dim`.
    pub k: T,
    /// With smoothing, μ: `[batch, kv_heads]` by `head_dim` ([`int8::smooth_k`]).
    pub mean: Option<Vec<f32>>,
}

/// Quantizes Q and K (the inputs rounded to the mode's input dtype) with `quantize`
/// (`Nvfp4Tensor::quantize` or `Mxfp4Tensor::quantize`): with `smooth_k` K − μ first, then each
/// tensor's rows gathered densely, since the scale blocks run along each row and a strided
/// buffer's rows need not start at multiples of the head dim (nor its padding hold numbers).
/// The emulation and the CPU 4-bit kernel both quantize through here.
pub(crate) fn quantize_qk_4bit<T>(
    problem: &AttentionProblem,
    smooth_k: bool,
    q: &[f32],
    k: &[f32],
    quantize: impl Fn(&[f32], usize, usize) -> Result<T>,
) -> Result<Qk4<T>> {
    let d = problem.head_dim;
    let dense = |x: &[f32], st: crate::Strides, heads: usize, len: usize| -> Vec<f32> {
        (0..problem.batch * heads * len)
            .flat_map(|r| x[st.offset(r / (heads * len), (r / len) % heads, r % len)..][..d].iter().copied())
            .collect()
    };
    let smoothed;
    let (k, mean) = if smooth_k {
        let sm = int8::smooth_k(problem, k)?;
        smoothed = sm.values;
        (&smoothed[..], Some(sm.mean))
    } else {
        (k, None)
    };
    let qd = dense(q, problem.q_strides(), problem.q_heads, problem.q_len);
    let kd = dense(k, problem.k_strides(), problem.kv_heads, problem.kv_len);
    Ok(Qk4 { q: quantize(&qd, qd.len() / d, d)?, k: quantize(&kd, kd.len() / d, d)?, mean })
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
                let t = quantize_qk_4bit(problem, smooth_k, &q, &k, Nvfp4Tensor::quantize)?;
                let smoothing = t.mean.map(|mean| Smoothing { q, mean });
                ScorePlan::Fp4 { q: Decoded4::new(&t.q), k: Decoded4::new(&t.k), smoothing }
            }
            Precision::Mxfp4 { smooth_k } => {
                let t = quantize_qk_4bit(problem, smooth_k, &q, &k, Mxfp4Tensor::quantize)?;
                let smoothing = t.mean.map(|mean| Smoothing { q, mean });
                ScorePlan::Fp4 { q: Decoded4::new(&t.q), k: Decoded4::new(&t.k), smoothing }
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
            ScorePlan::Int8 { smoothing: Some(sm), .. } | ScorePlan::Fp4 { smoothing: Some(sm), .. } => {
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
            ScorePlan::Fp4 { q, k, .. } => {
                // A block-scaled MMA: per block the E2M1 products (exact) are summed and
                // multiplied by both scales (UE4M3 or E8M0: exact), blocks accumulate in f32, and
                // the tensor scales are applied once at the end.
                let qr = (b * problem.q_heads + h) * problem.q_len + i;
                let kr = (b * problem.kv_heads + kvh) * problem.kv_len + j;
                let bs = q.block;
                let nb = d / bs;
                let mut acc = 0.0f32;
                for blk in 0..nb {
                    let qe = &q.elems[qr * d + blk * bs..][..bs];
                    let ke = &k.elems[kr * d + blk * bs..][..bs];
                    let inner = qe.iter().zip(ke).fold(0.0f32, |s, (a, b)| s + a * b);
                    acc += (q.scales[qr * nb + blk] * k.scales[kr * nb + blk]) * inner;
                }
                acc * (q.tensor_scale * k.tensor_scale)
            }
        }
    }
}
