//! Symmetric INT8 quantization of Q and K (SageAttention style), K smoothing, the layout of the
//! scale tensors that prepasses write and kernels read, and the E4M3 V of the mode's FP8 P·V.
//!
//! # Element recipe
//! `scale = amax / 127` (f32 division) over the elements sharing the scale; `amax == 0` gives
//! `scale = 1` (all codes 0, and the scale stays a usable divisor). Code
//! `q = clamp(rne(x / scale), -127, 127)` — a true f32 division then round-half-even
//! (`__float2int_rn`); -128 is never produced, so the range is symmetric and `-q` never
//! overflows. Dequantize: `q · scale`.
//!
//! Folding: a constant `fold` (for attention `softmax_scale · log2 e`) may be multiplied into
//! the **stored** Q scale after the codes are computed (`stored = scale * fold`, one f32
//! multiply), so the codes do not depend on it and `(q_i32 · k_i32) as f32 · (q_scale · k_scale)`
//! is directly the base-2 logit.
//!
//! # Scale tensors ([`Int8ScaleLayout`])
//! Indices below are row-major over the listed shape. `nqb = ceil(q_len / block_q)`,
//! `nkb = ceil(kv_len / block_k)`; the last block of a ragged length is partial and its scale is
//! taken over the rows that exist. Q scales are per **Q head**, K scales per **KV head** (GQA:
//! Q head `h` multiplies by the K scales of KV head `h / (q_heads / kv_heads)`).
//! * Q, [`Int8Granularity::PerBlock`]: `[batch, q_heads, nqb]`; row `i` → `i / block_q`.
//! * Q, `PerWarp`: `[batch, q_heads, nqb, warps]`; warp `w = (i % block_q) / (block_q / warps)`
//!   owns `block_q / warps` consecutive rows.
//! * Q, `PerThread`: `[batch, q_heads, nqb, warps, 8]`, needs `block_q / warps == 16`. In an
//!   `mma.m16n8k32` A fragment lane `l` holds rows `l / 4` and `l / 4 + 8` of its warp's 16 rows,
//!   so the 4 lanes of group `g = l / 4` share rows `{g, g + 8}`: row `i` → group
//!   `(i % block_q % 16) % 8`. A group whose rows are all past `q_len` has scale 1.
//! * K: `[batch, kv_heads, nkb]`; key `j` → `j / block_k`.
//!
//! # K smoothing
//! Before quantizing K, subtract its per-channel mean over the key sequence,
//! `μ[b, kv_h, c] = mean_j K[b, kv_h, j, c]` (shape `[batch, kv_heads, head_dim]`). K often has
//! a large per-channel offset shared by all keys; it inflates amax and so the quantization step,
//! while carrying no information for attention: `q · (k_j − μ) = q · k_j − q · μ`, and `q · μ`
//! is the same for every key `j` of a query row, so softmax over `j` (shift-invariant) is
//! unchanged. The log-sum-exp is not: `LSE_smoothed = LSE − scale · (q · μ)`. Kernels in this
//! project return the LSE of the **unsmoothed** logits: they add [`lse_shift`] back (computed
//! from the Q the kernel received, before quantization). The mean is accumulated in f64 and
//! rounded to f32; `k − μ` is one f32 subtraction and is quantized directly (not re-rounded to
//! f16). A GPU prepass sums in another order, so its μ may differ by an ulp.
//!
//! # V in E4M3 (FP8 P·V, SageAttention2)
//! One scale per (batch, KV head, channel) over all keys: `scale = amax / 448` (f32 division;
//! `amax == 0` gives 1), `inv = 1 / scale` (f32 division), code `e4m3(v · inv)` with the product
//! rounded to f32 first and then to nearest E4M3 (ties to even), saturating at ±448 — a multiply
//! by the reciprocal, not a division, because that is what a prepass does per element
//! ([`quantize_v_e4m3`]). Dequantize: `decode(code) · scale`.

use crate::{AttentionProblem, Error, Int8Granularity, Result};

/// Largest code magnitude; the range is the symmetric `[-127, 127]`.
pub const QMAX: f32 = 127.0;
/// Rows of one warp in the `PerThread` fragment model (the M of `mma.m16n8k32`), and its row
/// groups (lane quads).
pub use quattn_core::{INT8_MMA_M as MMA_M, INT8_THREAD_GROUPS as THREAD_GROUPS};

/// The scale of a group whose largest magnitude is `amax`.
#[inline]
pub fn scale_for(amax: f32) -> f32 {
    if amax > 0.0 {
        amax / QMAX
    } else {
        1.0
    }
}

/// The code of `x` under `scale` (unfolded).
#[inline]
pub fn quantize(x: f32, scale: f32) -> i8 {
    (x / scale).round_ties_even().clamp(-QMAX, QMAX) as i8
}

pub use quattn_core::Int8Blocking;

/// `blocking`'s check for `granularity` as the facade's error.
pub fn check_blocking(blocking: &Int8Blocking, granularity: Int8Granularity) -> Result<()> {
    blocking.check(granularity).map_err(Error::Quantization)
}

/// Shapes and index maps of the Q and K scale tensors (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int8ScaleLayout {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub granularity: Int8Granularity,
    pub blocking: Int8Blocking,
}

impl Int8ScaleLayout {
    pub fn new(problem: &AttentionProblem, granularity: Int8Granularity, blocking: Int8Blocking) -> Result<Self> {
        check_blocking(&blocking, granularity)?;
        Ok(Int8ScaleLayout {
            batch: problem.batch,
            q_heads: problem.q_heads,
            kv_heads: problem.kv_heads,
            q_len: problem.q_len,
            kv_len: problem.kv_len,
            granularity,
            blocking,
        })
    }

    /// `ceil(q_len / block_q)`.
    pub fn q_blocks(&self) -> usize {
        self.q_len.div_ceil(self.blocking.block_q)
    }

    /// `ceil(kv_len / block_k)`.
    pub fn k_blocks(&self) -> usize {
        self.kv_len.div_ceil(self.blocking.block_k)
    }

    /// Q scales of one (batch, head).
    fn q_per_head(&self) -> usize {
        self.q_blocks()
            * match self.granularity {
                Int8Granularity::PerBlock => 1,
                Int8Granularity::PerWarp => self.blocking.warps,
                Int8Granularity::PerThread => self.blocking.warps * THREAD_GROUPS,
            }
    }

    pub fn q_scales_shape(&self) -> Vec<usize> {
        let mut s = vec![self.batch, self.q_heads, self.q_blocks()];
        match self.granularity {
            Int8Granularity::PerBlock => {}
            Int8Granularity::PerWarp => s.push(self.blocking.warps),
            Int8Granularity::PerThread => s.extend([self.blocking.warps, THREAD_GROUPS]),
        }
        s
    }

    pub fn k_scales_shape(&self) -> Vec<usize> {
        vec![self.batch, self.kv_heads, self.k_blocks()]
    }

    pub fn q_scales_len(&self) -> usize {
        self.batch * self.q_heads * self.q_per_head()
    }

    pub fn k_scales_len(&self) -> usize {
        self.batch * self.kv_heads * self.k_blocks()
    }

    /// Position of query row `row`'s scale among those of its (batch, head).
    fn q_slot(&self, row: usize) -> usize {
        let bq = self.blocking.block_q;
        let (qb, r) = (row / bq, row % bq);
        match self.granularity {
            Int8Granularity::PerBlock => qb,
            Int8Granularity::PerWarp => qb * self.blocking.warps + r / self.blocking.rows_per_warp(),
            Int8Granularity::PerThread => {
                let w = r / MMA_M;
                (qb * self.blocking.warps + w) * THREAD_GROUPS + (r % MMA_M) % THREAD_GROUPS
            }
        }
    }

    /// Index into the Q scales of query row `row` of Q head `h` in batch `b`.
    #[inline]
    pub fn q_scale_index(&self, b: usize, h: usize, row: usize) -> usize {
        (b * self.q_heads + h) * self.q_per_head() + self.q_slot(row)
    }

    /// Index into the K scales of key `key` of KV head `kv_h` in batch `b`.
    #[inline]
    pub fn k_scale_index(&self, b: usize, kv_h: usize, key: usize) -> usize {
        (b * self.kv_heads + kv_h) * self.k_blocks() + key / self.blocking.block_k
    }
}

/// INT8 codes in the problem's layout (same strides as the f32 input) and their scales.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Tensor {
    pub codes: Vec<i8>,
    /// Laid out as [`Int8ScaleLayout`] says for this tensor (Q scales possibly folded).
    pub scales: Vec<f32>,
}

/// Every element of the `[batch, heads, len, dim]` view is finite (elements between strided
/// rows are not part of it).
fn check_finite(what: &str, x: &[f32], st: crate::Strides, batch: usize, heads: usize, len: usize, dim: usize) -> Result<()> {
    for b in 0..batch {
        for h in 0..heads {
            for j in 0..len {
                let o = st.offset(b, h, j);
                if let Some(c) = x[o..o + dim].iter().position(|v| !v.is_finite()) {
                    return Err(Error::Quantization(format!("{what} element {} is {} (must be finite)", o + c, x[o + c])));
                }
            }
        }
    }
    Ok(())
}

fn check_len(what: &str, got: usize, expected: usize) -> Result<()> {
    if got != expected {
        return Err(Error::Quantization(format!("{what} holds {got} values, the problem needs {expected}")));
    }
    Ok(())
}

/// Quantizes Q (problem layout) with one scale per group of [`Int8ScaleLayout`]; `fold` is
/// multiplied into the stored scales (1.0 for none).
pub fn quantize_q(problem: &AttentionProblem, layout: &Int8ScaleLayout, q: &[f32], fold: f32) -> Result<Int8Tensor> {
    check_len("Q", q.len(), problem.q_len_elems())?;
    let (st, d) = (problem.q_strides(), problem.head_dim);
    check_finite("Q", q, st, problem.batch, problem.q_heads, problem.q_len, d)?;
    let mut amax = vec![0.0f32; layout.q_scales_len()];
    for b in 0..problem.batch {
        for h in 0..problem.q_heads {
            for i in 0..problem.q_len {
                let row = &q[st.offset(b, h, i)..][..d];
                let a = &mut amax[layout.q_scale_index(b, h, i)];
                *a = row.iter().fold(*a, |m, x| m.max(x.abs()));
            }
        }
    }
    let scales: Vec<f32> = amax.iter().map(|&a| scale_for(a)).collect();
    let mut codes = vec![0i8; q.len()];
    for b in 0..problem.batch {
        for h in 0..problem.q_heads {
            for i in 0..problem.q_len {
                let s = scales[layout.q_scale_index(b, h, i)];
                let o = st.offset(b, h, i);
                for c in 0..d {
                    codes[o + c] = quantize(q[o + c], s);
                }
            }
        }
    }
    Ok(Int8Tensor { codes, scales: scales.iter().map(|s| s * fold).collect() })
}

/// Quantizes K (problem layout; smoothed or not) with one scale per block of `block_k` keys.
pub fn quantize_k(problem: &AttentionProblem, layout: &Int8ScaleLayout, k: &[f32]) -> Result<Int8Tensor> {
    check_len("K", k.len(), problem.k_len_elems())?;
    let (st, d) = (problem.k_strides(), problem.head_dim);
    check_finite("K", k, st, problem.batch, problem.kv_heads, problem.kv_len, d)?;
    let mut amax = vec![0.0f32; layout.k_scales_len()];
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            for j in 0..problem.kv_len {
                let a = &mut amax[layout.k_scale_index(b, h, j)];
                *a = k[st.offset(b, h, j)..][..d].iter().fold(*a, |m, x| m.max(x.abs()));
            }
        }
    }
    let scales: Vec<f32> = amax.iter().map(|&a| scale_for(a)).collect();
    let mut codes = vec![0i8; k.len()];
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            for j in 0..problem.kv_len {
                let s = scales[layout.k_scale_index(b, h, j)];
                let o = st.offset(b, h, j);
                for c in 0..d {
                    codes[o + c] = quantize(k[o + c], s);
                }
            }
        }
    }
    Ok(Int8Tensor { codes, scales })
}

/// K with its per-channel mean removed, and that mean.
#[derive(Debug, Clone, PartialEq)]
pub struct SmoothedK {
    /// `K − μ`, problem layout.
    pub values: Vec<f32>,
    /// `μ`, `[batch, kv_heads, head_dim]`; index `(b * kv_heads + kv_h) * head_dim + c`.
    pub mean: Vec<f32>,
}

/// Subtracts the per-(batch, KV head, channel) mean over the key sequence (module docs).
pub fn smooth_k(problem: &AttentionProblem, k: &[f32]) -> Result<SmoothedK> {
    check_len("K", k.len(), problem.k_len_elems())?;
    let (st, d) = (problem.k_strides(), problem.head_dim);
    check_finite("K", k, st, problem.batch, problem.kv_heads, problem.kv_len, d)?;
    let mut mean = vec![0.0f32; problem.batch * problem.kv_heads * d];
    let mut values = k.to_vec();
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            let mu = &mut mean[(b * problem.kv_heads + h) * d..][..d];
            let mut sum = vec![0.0f64; d];
            for j in 0..problem.kv_len {
                for (s, &x) in sum.iter_mut().zip(&k[st.offset(b, h, j)..][..d]) {
                    *s += x as f64;
                }
            }
            for (m, s) in mu.iter_mut().zip(&sum) {
                *m = (s / problem.kv_len as f64) as f32;
            }
            // From `k`, not in place: views that share rows across the batch (batch stride 0)
            // would be smoothed once per batch.
            for j in 0..problem.kv_len {
                let o = st.offset(b, h, j);
                for ((x, &k), m) in values[o..o + d].iter_mut().zip(&k[o..o + d]).zip(mu.iter()) {
                    *x = k - m;
                }
            }
        }
    }
    Ok(SmoothedK { values, mean })
}

/// What smoothing took off a query row's natural-log LSE: `softmax_scale · (q · μ)`. Add it to
/// the LSE of the smoothed logits.
///
/// The dot's order, in f32 with every product and sum rounded: the products of each
/// [`LSE_CHUNK`] consecutive channels summed left to right, then those partial sums added in a
/// pairwise tree (neighbours at each level, an odd last one carried up). A GPU lane holding
/// one chunk of a row computes the same sum with a butterfly of shuffles, all lanes at once,
/// where a channel-order chain would be a row's whole head dim long.
pub fn lse_shift(q_row: &[f32], mean: &[f32], softmax_scale: f32) -> f32 {
    let n = q_row.len().min(mean.len());
    let mut level: Vec<f32> = q_row[..n]
        .chunks(LSE_CHUNK)
        .zip(mean[..n].chunks(LSE_CHUNK))
        .map(|(q, m)| q.iter().zip(m).map(|(a, b)| a * b).reduce(|s, p| s + p).unwrap_or(0.0))
        .collect();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| if p.len() == 2 { p[0] + p[1] } else { p[0] }).collect();
    }
    level.first().copied().unwrap_or(0.0) * softmax_scale
}

/// Channels per left-to-right partial sum of [`lse_shift`]'s dot (a GPU lane's 16 bytes of f16).
pub const LSE_CHUNK: usize = 8;

/// Largest E4M3 magnitude, the code range of V's scale.
pub const V_E4M3_MAX: f32 = crate::codec::fp8::e4m3::MAX;

/// V as E4M3 codes with one scale per (batch, KV head, channel) (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct E4m3V {
    /// Codes in the problem's V layout (`v_strides`).
    pub codes: Vec<u8>,
    /// `[batch, kv_heads, v_head_dim]`.
    pub scales: Vec<f32>,
}

/// Quantizes V (problem layout) to E4M3 with per-channel scales (module docs).
pub fn quantize_v_e4m3(problem: &AttentionProblem, v: &[f32]) -> Result<E4m3V> {
    use crate::codec::fp8::{e4m3, Saturation};
    check_len("V", v.len(), problem.v_len_elems())?;
    check_finite("V", v, problem.v_strides(), problem.batch, problem.kv_heads, problem.kv_len, problem.v_head_dim)?;
    let (dv, st) = (problem.v_head_dim, problem.v_strides());
    let mut amax = vec![0.0f32; problem.batch * problem.kv_heads * dv];
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            let a = &mut amax[(b * problem.kv_heads + h) * dv..][..dv];
            for j in 0..problem.kv_len {
                for (m, x) in a.iter_mut().zip(&v[st.offset(b, h, j)..][..dv]) {
                    *m = m.max(x.abs());
                }
            }
        }
    }
    let scales: Vec<f32> = amax.iter().map(|&a| if a > 0.0 { a / V_E4M3_MAX } else { 1.0 }).collect();
    let mut codes = vec![0u8; v.len()];
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            let s = &scales[(b * problem.kv_heads + h) * dv..][..dv];
            for j in 0..problem.kv_len {
                let o = st.offset(b, h, j);
                for c in 0..dv {
                    codes[o + c] = e4m3::encode(v[o + c] * (1.0 / s[c]), Saturation::Saturate);
                }
            }
        }
    }
    Ok(E4m3V { codes, scales })
}

/// The E4M3 V a device prepass produced, read back to the host: codes dense
/// `[batch, kv_heads, kv_len, v_head_dim]` (whatever layout the device keeps them in), the
/// scales, and how many bytes of the device's padding past `kv_len` are not zero.
#[derive(Debug, Clone, PartialEq)]
pub struct E4m3VOperands {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub padding_nonzero: usize,
}

/// The INT8 operands a device prepass produced, read back to the host (codes in the problem's
/// layout, scales in [`Int8ScaleLayout`]'s; the mean and the LSE shift only with smoothing; V
/// only with FP8 P·V).
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Operands {
    pub q_codes: Vec<i8>,
    pub q_scales: Vec<f32>,
    pub k_codes: Vec<i8>,
    pub k_scales: Vec<f32>,
    pub k_mean: Option<Vec<f32>>,
    pub lse_shift: Option<Vec<f32>>,
    pub v: Option<E4m3VOperands>,
}

/// Checks a device prepass's E4M3 V against [`quantize_v_e4m3`] of `v` (the V the device read,
/// as f32): scales and every code bit for bit, zero padding, and that the codes are not trivial
/// (some channel reaches ±448).
pub fn verify_v_operands(problem: &AttentionProblem, v: &[f32], dev: &E4m3VOperands) -> Result<()> {
    let fail = |m: String| Err(Error::Quantization(m));
    let want = quantize_v_e4m3(problem, v)?;
    if dev.scales.len() != want.scales.len() {
        return fail(format!("V scales: {} values, expected {}", dev.scales.len(), want.scales.len()));
    }
    if let Some(i) = (0..want.scales.len()).find(|&i| dev.scales[i].to_bits() != want.scales[i].to_bits()) {
        return fail(format!("V scale [{i}]: device {:e} vs codec {:e}", dev.scales[i], want.scales[i]));
    }
    let (dv, st) = (problem.v_head_dim, problem.v_strides());
    if dev.codes.len() != problem.batch * problem.kv_heads * problem.kv_len * dv {
        return fail(format!("V codes: {} values, expected {}", dev.codes.len(), problem.batch * problem.kv_heads * problem.kv_len * dv));
    }
    let (mut bad, mut first) = (0usize, None);
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            for j in 0..problem.kv_len {
                for c in 0..dv {
                    let (got, want) = (dev.codes[((b * problem.kv_heads + h) * problem.kv_len + j) * dv + c], want.codes[st.offset(b, h, j) + c]);
                    if got != want {
                        bad += 1;
                        first.get_or_insert((b, h, j, c, got, want));
                    }
                }
            }
        }
    }
    if let Some((b, h, j, c, got, want)) = first {
        return fail(format!("V codes: {bad} differ, first at (b {b}, kv head {h}, key {j}, channel {c}): device {got:#04x} vs codec {want:#04x}"));
    }
    if dev.padding_nonzero != 0 {
        return fail(format!("V codes: {} padding bytes past kv_len are not zero", dev.padding_nonzero));
    }
    if !dev.codes.iter().any(|&x| x & 0x7f == crate::codec::fp8::e4m3::MAX_CODE) {
        return fail("no V code reaches ±448: the largest magnitude of a channel must".into());
    }
    Ok(())
}

/// How a device prepass sums the K mean and the LSE-shift dot, which sets how closely they must
/// match the codec's (everything else must match bit for bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSums {
    /// f32 sums in any order (the CubeCL prepass): any summation tree of `n` terms puts at most
    /// `n − 1` roundings on each term's path, so the mean is within `(n + 2)·u·mean|k|` (plus
    /// its final rounding) and the shift within `2(d + 2)·u·Σ|q·μ|·scale` of the codec's.
    F32AnyOrder,
    /// The mean summed in f64 (in another order) and rounded once, so within one f32 rounding
    /// of the codec's; the shift in the codec's order and rounding (the native CUDA prepass):
    /// bit for bit.
    F64MeanCodecShift,
}

/// Checks a device prepass against this codec: Q and K codes and scales bit for bit (K
/// quantized from `K − μ` with the device's μ, as the codec would with that μ), the mean and the
/// LSE shift as `sums` says, and that the codes are not trivial (some ±127). `q` and `k` are the
/// inputs the device read, as f32; `fold` is the factor folded into the Q scales.
#[allow(clippy::too_many_arguments)]
pub fn verify_operands(
    problem: &AttentionProblem,
    layout: &Int8ScaleLayout,
    smooth: bool,
    q: &[f32],
    k: &[f32],
    fold: f32,
    dev: &Int8Operands,
    sums: DeviceSums,
) -> Result<()> {
    let fail = |m: String| Err(Error::Quantization(m));
    let codes = |what: &str, got: &[i8], want: &[i8]| -> Result<()> {
        if got.len() != want.len() {
            return fail(format!("{what}: {} codes, expected {}", got.len(), want.len()));
        }
        match (0..want.len()).find(|&i| got[i] != want[i]) {
            Some(i) => {
                let n = (0..want.len()).filter(|&j| got[j] != want[j]).count();
                fail(format!("{what}: {n} codes differ, first at {i}: device {} vs codec {}", got[i], want[i]))
            }
            None => Ok(()),
        }
    };
    let bits = |what: &str, got: &[f32], want: &[f32]| -> Result<()> {
        if got.len() != want.len() {
            return fail(format!("{what}: {} values, expected {}", got.len(), want.len()));
        }
        match (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            Some(i) => fail(format!("{what}[{i}]: device {:e} vs codec {:e}", got[i], want[i])),
            None => Ok(()),
        }
    };
    let cq = quantize_q(problem, layout, q, fold)?;
    codes("Q codes", &dev.q_codes, &cq.codes)?;
    bits("Q scales", &dev.q_scales, &cq.scales)?;
    let (d, u) = (problem.head_dim, f32::EPSILON as f64 / 2.0);
    let k_in = if smooth {
        let (Some(mean), Some(shift)) = (&dev.k_mean, &dev.lse_shift) else {
            return fail("smoothing without a device mean or LSE shift".into());
        };
        if mean.len() != problem.batch * problem.kv_heads * d || shift.len() != problem.batch * problem.q_heads * problem.q_len {
            return fail(format!("mean / LSE shift lengths {} / {}", mean.len(), shift.len()));
        }
        let cpu = smooth_k(problem, k)?.mean;
        let st = problem.k_strides();
        for b in 0..problem.batch {
            for h in 0..problem.kv_heads {
                for c in 0..d {
                    let i = (b * problem.kv_heads + h) * d + c;
                    let rounding = u * (cpu[i] as f64).abs().max(f32::MIN_POSITIVE as f64);
                    let tol = match sums {
                        DeviceSums::F32AnyOrder => {
                            let abs_mean = (0..problem.kv_len).map(|j| (k[st.offset(b, h, j) + c] as f64).abs()).sum::<f64>() / problem.kv_len as f64;
                            (problem.kv_len as f64 + 2.0) * u * abs_mean + rounding
                        }
                        DeviceSums::F64MeanCodecShift => 2.0 * rounding,
                    };
                    let err = (mean[i] as f64 - cpu[i] as f64).abs();
                    if !(err <= tol) {
                        return fail(format!("mean[{i}]: device {} vs codec {} (err {err:e} > {tol:e})", mean[i], cpu[i]));
                    }
                }
            }
        }
        let mut nonzero = 0;
        for b in 0..problem.batch {
            for h in 0..problem.q_heads {
                let mu = &mean[(b * problem.kv_heads + problem.kv_head_of(h)) * d..][..d];
                for i in 0..problem.q_len {
                    let row = &q[problem.q_strides().offset(b, h, i)..][..d];
                    let want = lse_shift(row, mu, problem.softmax_scale());
                    let got = shift[(b * problem.q_heads + h) * problem.q_len + i];
                    let ok = match sums {
                        DeviceSums::F32AnyOrder => {
                            let mag: f64 = row.iter().zip(mu).map(|(a, m)| (*a as f64 * *m as f64).abs()).sum::<f64>() * problem.softmax_scale() as f64;
                            ((got - want) as f64).abs() <= 2.0 * (d as f64 + 2.0) * u * mag
                        }
                        DeviceSums::F64MeanCodecShift => got.to_bits() == want.to_bits(),
                    };
                    if !ok {
                        return fail(format!("lse_shift ({b},{h},{i}): device {got:e} vs codec {want:e}"));
                    }
                    nonzero += (want != 0.0) as usize;
                }
            }
        }
        if nonzero == 0 {
            return fail("the LSE shift is never exercised (all zero)".into());
        }
        // K − μ with the device's μ, one f32 subtraction as the codec does.
        let st = problem.k_strides();
        let mut kk = k.to_vec();
        for b in 0..problem.batch {
            for h in 0..problem.kv_heads {
                for j in 0..problem.kv_len {
                    for c in 0..d {
                        kk[st.offset(b, h, j) + c] -= mean[(b * problem.kv_heads + h) * d + c];
                    }
                }
            }
        }
        kk
    } else {
        if dev.k_mean.is_some() || dev.lse_shift.is_some() {
            return fail("smoothing outputs without smoothing".into());
        }
        k.to_vec()
    };
    let ck = quantize_k(problem, layout, &k_in)?;
    codes("K codes", &dev.k_codes, &ck.codes)?;
    bits("K scales", &dev.k_scales, &ck.scales)?;
    if !(dev.k_codes.iter().any(|&x| x.unsigned_abs() == 127) && dev.q_codes.iter().any(|&x| x.unsigned_abs() == 127)) {
        return fail("no code reaches ±127: the largest magnitude of a block must".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    /// `verify_operands` accepts the codec's own operands and catches one wrong code, one
    /// wrong scale bit, a mean off by more than one rounding and a wrong shift.
    #[test]
    fn verify_operands_accepts_the_codec_and_catches_single_errors() {
        let p = AttentionProblem::new(2, 4, 70, 64).kv_heads(2).kv_len(150);
        let (q, mut k) = (gaussian(1, p.q_len_elems(), 1.0), gaussian(2, p.k_len_elems(), 1.0));
        for (i, x) in k.iter_mut().enumerate() {
            if i % 64 == 5 {
                *x += 8.0;
            }
        }
        let blk = Int8Blocking { block_q: 128, block_k: 128, warps: 8 };
        let lay = Int8ScaleLayout::new(&p, Int8Granularity::PerThread, blk).unwrap();
        let fold = p.softmax_scale() * core::f32::consts::LOG2_E;
        let sm = smooth_k(&p, &k).unwrap();
        let (cq, ck) = (quantize_q(&p, &lay, &q, fold).unwrap(), quantize_k(&p, &lay, &sm.values).unwrap());
        let shift: Vec<f32> = (0..p.batch)
            .flat_map(|b| (0..p.q_heads).map(move |h| (b, h)))
            .flat_map(|(b, h)| {
                let mu = sm.mean[(b * p.kv_heads + p.kv_head_of(h)) * 64..][..64].to_vec();
                let (q, p) = (&q, &p);
                (0..p.q_len).map(move |i| lse_shift(&q[p.q_strides().offset(b, h, i)..][..64], &mu, p.softmax_scale()))
            })
            .collect();
        let good = Int8Operands {
            q_codes: cq.codes,
            q_scales: cq.scales,
            k_codes: ck.codes,
            k_scales: ck.scales,
            k_mean: Some(sm.mean.clone()),
            lse_shift: Some(shift),
            v: None,
        };
        let check = |o: &Int8Operands| verify_operands(&p, &lay, true, &q, &k, fold, o, DeviceSums::F64MeanCodecShift);
        check(&good).unwrap();
        let mut bad = good.clone();
        bad.k_codes[77] = bad.k_codes[77].wrapping_add(1);
        assert!(check(&bad).is_err());
        let mut bad = good.clone();
        bad.q_scales[3] = f32::from_bits(bad.q_scales[3].to_bits() + 1);
        assert!(check(&bad).is_err());
        let mut bad = good.clone();
        let m = &mut bad.k_mean.as_mut().unwrap()[9];
        *m = f32::from_bits(m.to_bits() + 4);
        assert!(check(&bad).is_err());
        let mut bad = good.clone();
        let s = &mut bad.lse_shift.as_mut().unwrap()[11];
        *s = f32::from_bits(s.to_bits() + 1);
        assert!(check(&bad).is_err());
        // The f32-order tolerance admits a last-bit difference in the shift.
        assert!(verify_operands(&p, &lay, true, &q, &k, fold, &bad, DeviceSums::F32AnyOrder).is_ok());
    }

    /// V's codes round `v · fl(1 / scale)` (the native prepass's product), not the quotient
    /// `v / scale`: on values where the two round to different E4M3 codes, the codec takes the
    /// product's; scales are per channel over every key; ±amax is ±448; padding keys do not
    /// exist in the problem layout.
    #[test]
    fn v_codes_round_the_product_with_the_reciprocal_per_channel() {
        use crate::codec::fp8::{e4m3, Saturation};
        let p = AttentionProblem::new(2, 4, 3, 64).kv_heads(2).kv_len(300);
        let v = gaussian(7, p.v_len_elems(), 1.5);
        let q = quantize_v_e4m3(&p, &v).unwrap();
        assert_eq!(q.scales.len(), 2 * 2 * 64);
        let st = p.v_strides();
        let (mut differ, mut top) = (0usize, 0usize);
        for b in 0..2 {
            for h in 0..2 {
                for c in 0..64 {
                    let amax = (0..300).map(|j| v[st.offset(b, h, j) + c].abs()).fold(0.0f32, f32::max);
                    let s = q.scales[(b * 2 + h) * 64 + c];
                    assert_eq!(s.to_bits(), (amax / 448.0).to_bits());
                    for j in 0..300 {
                        let x = v[st.offset(b, h, j) + c];
                        let code = q.codes[st.offset(b, h, j) + c];
                        assert_eq!(code, e4m3::encode(x * (1.0 / s), Saturation::Saturate));
                        differ += (code != e4m3::encode(x / s, Saturation::Saturate)) as usize;
                        top += (x.abs() == amax && code & 0x7f == e4m3::MAX_CODE) as usize;
                    }
                }
            }
        }
        assert!(top >= 2 * 2 * 64, "every channel's amax is ±448");
        // Dividing would change some codes: values within an f32 ulp of an E4M3 rounding
        // midpoint (x = midpoint · scale and its neighbours) tell the product from the quotient,
        // and there the codec (and the emulation, which decodes its codes) takes the product.
        let mut hunt = 0usize;
        for i in 0..4000u32 {
            let amax = 1.0 + i as f32 * 0.000_731;
            let s = amax / 448.0;
            for mid in [1.0625f32, 1.3125, 1.9375, 12.5, 208.0] {
                let x0 = mid * s;
                for d in -3i32..=3 {
                    let x = f32::from_bits((x0.to_bits() as i32 + d) as u32);
                    let (prod, quot) = (e4m3::encode(x * (1.0 / s), Saturation::Saturate), e4m3::encode(x / s, Saturation::Saturate));
                    if prod != quot {
                        hunt += 1;
                        // The codec's code of x in a one-key, one-channel V whose amax is amax.
                        let one = AttentionProblem::new(1, 1, 1, 1).kv_len(2);
                        let q = quantize_v_e4m3(&one, &[x, amax]).unwrap();
                        assert_eq!(q.scales[0].to_bits(), s.to_bits());
                        assert_eq!(q.codes[0], prod, "x {x:e} scale {s:e}: product {prod:#04x}, quotient {quot:#04x}");
                    }
                }
            }
        }
        assert!(differ + hunt > 0, "no value tells the product from the quotient");
        // An all-zero channel takes scale 1 and code 0.
        let z = quantize_v_e4m3(&p, &vec![0.0; p.v_len_elems()]).unwrap();
        assert!(z.scales.iter().all(|&s| s == 1.0) && z.codes.iter().all(|&c| c == 0));
    }

    /// `verify_v_operands` accepts the codec's own V and catches one code, one scale bit and
    /// nonzero padding.
    #[test]
    fn verify_v_operands_catches_single_errors() {
        let p = AttentionProblem::new(1, 2, 3, 64).kv_heads(2).kv_len(130);
        let v = gaussian(9, p.v_len_elems(), 1.0);
        let q = quantize_v_e4m3(&p, &v).unwrap();
        let st = p.v_strides();
        let mut dense = vec![0u8; q.codes.len()];
        for h in 0..2 {
            for j in 0..130 {
                dense[(h * 130 + j) * 64..][..64].copy_from_slice(&q.codes[st.offset(0, h, j)..][..64]);
            }
        }
        let good = E4m3VOperands { codes: dense, scales: q.scales.clone(), padding_nonzero: 0 };
        verify_v_operands(&p, &v, &good).unwrap();
        let mut bad = good.clone();
        bad.codes[1000] ^= 1;
        assert!(verify_v_operands(&p, &v, &bad).is_err());
        let mut bad = good.clone();
        bad.scales[5] = f32::from_bits(bad.scales[5].to_bits() + 1);
        assert!(verify_v_operands(&p, &v, &bad).is_err());
        assert!(verify_v_operands(&p, &v, &E4m3VOperands { padding_nonzero: 3, ..good }).is_err());
    }

    fn gaussian(seed: u64, n: usize, std: f32) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let normal = Normal::new(0.0f32, std).unwrap();
        (0..n).map(|_| normal.sample(&mut rng)).collect()
    }

    #[test]
    fn rounding_is_half_even_and_symmetric() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-2.5, -2),
            (-0.5, 0),
            (126.5, 126),
            (127.4, 127),
            (200.0, 127),
            (-200.0, -127),
            (-127.6, -127),
        ];
        for (x, q) in cases {
            assert_eq!(quantize(x, 1.0), q, "{x}");
        }
        assert_eq!(scale_for(0.0), 1.0);
        assert_eq!(scale_for(254.0), 2.0);
    }

    #[test]
    fn blocking_validation() {
        assert!(Int8Blocking::default().check(Int8Granularity::PerThread).is_ok());
        let b = Int8Blocking { block_q: 64, block_k: 64, warps: 8 };
        assert!(b.check(Int8Granularity::PerWarp).is_ok());
        assert!(matches!(check_blocking(&b, Int8Granularity::PerThread), Err(Error::Quantization(_))));
        assert!(Int8Blocking { block_q: 100, block_k: 64, warps: 8 }.check(Int8Granularity::PerBlock).is_err());
        assert!(Int8Blocking { block_q: 128, block_k: 0, warps: 8 }.check(Int8Granularity::PerBlock).is_err());
    }

    /// GQA 4:2, ragged q_len 40 / kv_len 45, block_q 32 with 2 warps of 16 rows, block_k 16.
    /// Expected indices worked out by hand from the module docs.
    #[test]
    fn scale_index_mapping_gqa_ragged() {
        let p = AttentionProblem::new(2, 4, 40, 32).kv_heads(2).kv_len(45);
        let blk = Int8Blocking { block_q: 32, block_k: 16, warps: 2 };
        let thread = Int8ScaleLayout::new(&p, Int8Granularity::PerThread, blk).unwrap();
        assert_eq!(thread.q_scales_shape(), vec![2, 4, 2, 2, 8]);
        assert_eq!(thread.q_scales_len(), 256);
        // row 37: block 1, row 5 of the block, warp 0, group 5 -> slot (1*2+0)*8+5 = 21.
        assert_eq!(thread.q_scale_index(1, 3, 37), 7 * 32 + 21);
        // row 29: block 0, warp 1 (rows 16..32), row 13 of the warp -> group 5 -> slot 13.
        assert_eq!(thread.q_scale_index(0, 0, 29), 13);
        // Rows sharing row 0's scale within a block: {0, 8}; row 16's: {16, 24}.
        let share = |r: usize| -> Vec<usize> {
            (0..40).filter(|&i| thread.q_scale_index(0, 1, i) == thread.q_scale_index(0, 1, r)).collect()
        };
        assert_eq!(share(0), vec![0, 8]);
        assert_eq!(share(16), vec![16, 24]);
        assert_eq!(share(33), vec![33]); // block 1 has rows 32..40 only: row 41 does not exist
        assert_eq!(share(39), vec![39]);
        let warp = Int8ScaleLayout::new(&p, Int8Granularity::PerWarp, blk).unwrap();
        assert_eq!(warp.q_scales_shape(), vec![2, 4, 2, 2]);
        assert_eq!(warp.q_scale_index(0, 1, 37), 4 + 2);
        assert_eq!(warp.q_scale_index(0, 1, 15), 4);
        assert_eq!(warp.q_scale_index(0, 1, 16), 5);
        let block = Int8ScaleLayout::new(&p, Int8Granularity::PerBlock, blk).unwrap();
        assert_eq!(block.q_scales_shape(), vec![2, 4, 2]);
        assert_eq!(block.q_scale_index(0, 1, 37), 3);
        assert_eq!(block.q_scale_index(1, 0, 31), 8);
        // K: ceil(45/16) = 3 blocks per KV head.
        assert_eq!(block.k_scales_shape(), vec![2, 2, 3]);
        assert_eq!(block.k_scale_index(1, 1, 44), 11);
        assert_eq!(block.k_scale_index(1, 1, 32), 11);
        assert_eq!(block.k_scale_index(1, 1, 31), 10);
        assert_eq!(block.k_scale_index(0, 1, 0), 3);
    }

    #[test]
    fn smoothing_a_view_shared_across_the_batch_smooths_once() {
        // K of one batch shared by three (batch stride 0), against the same K copied per batch.
        let dense = AttentionProblem::new(3, 1, 2, 16).kv_len(5);
        let st = crate::Strides { batch: 0, head: 5 * 16, seq: 16 };
        let shared = dense.clone().strides(crate::TensorStrides { q: dense.q_strides(), k: st, v: st, o: dense.o_strides() });
        let k: Vec<f32> = (0..5 * 16).map(|i| ((i * 37 % 23) as f32 - 11.0) / 4.0).collect();
        let copied: Vec<f32> = (0..3).flat_map(|_| k.iter().copied()).collect();
        let a = smooth_k(&shared, &k).unwrap();
        let b = smooth_k(&dense, &copied).unwrap();
        assert_eq!(a.values[..], b.values[..5 * 16]);
        assert_eq!(a.mean, b.mean);
    }

    #[test]
    fn quantized_q_and_k_dequantize_within_half_a_step() {
        let p = AttentionProblem::new(2, 4, 40, 32).kv_heads(2).kv_len(45).layout(crate::Layout::Bshd);
        let blk = Int8Blocking { block_q: 32, block_k: 16, warps: 2 };
        let q = gaussian(31, p.q_len_elems(), 1.0);
        let k = gaussian(32, p.k_len_elems(), 2.0);
        for g in [Int8Granularity::PerBlock, Int8Granularity::PerWarp, Int8Granularity::PerThread] {
            let lay = Int8ScaleLayout::new(&p, g, blk).unwrap();
            let fold = 0.3f32;
            let qt = quantize_q(&p, &lay, &q, fold).unwrap();
            let kt = quantize_k(&p, &lay, &k).unwrap();
            let (qs, ks) = (p.q_strides(), p.k_strides());
            // Independently: the amax over each scale's rows, from the rows that share an index.
            let mut q_amax = vec![0.0f32; lay.q_scales_len()];
            for b in 0..2 {
                for h in 0..4 {
                    for i in 0..40 {
                        for c in 0..32 {
                            let x = q[qs.offset(b, h, i) + c];
                            let idx = lay.q_scale_index(b, h, i);
                            q_amax[idx] = q_amax[idx].max(x.abs());
                            let s = qt.scales[idx] / fold;
                            let err = (x - qt.codes[qs.offset(b, h, i) + c] as f32 * s).abs();
                            assert!(err <= 0.5 * s * (1.0 + 1e-5), "{g:?} Q ({b},{h},{i},{c})");
                        }
                    }
                }
            }
            for (i, (&a, &s)) in q_amax.iter().zip(&qt.scales).enumerate() {
                let expected = if a > 0.0 { a / 127.0 * fold } else { fold };
                assert_eq!(s, expected, "{g:?} Q scale {i}");
            }
            for b in 0..2 {
                for h in 0..2 {
                    for j in 0..45 {
                        let s = kt.scales[lay.k_scale_index(b, h, j)];
                        for c in 0..32 {
                            let x = k[ks.offset(b, h, j) + c];
                            assert!((x - kt.codes[ks.offset(b, h, j) + c] as f32 * s).abs() <= 0.5 * s * (1.0 + 1e-5));
                        }
                    }
                }
            }
            // The largest element of each K block maps to ±127.
            assert!(kt.codes.iter().any(|&c| c.unsigned_abs() == 127));
        }
    }

    /// The native prepass computes the LSE shift as lanes of 8 channels each, left to right,
    /// then a butterfly of shuffles (xor 1, 2, 4, ...) over a row's lanes. That is the codec's
    /// pairwise tree only because f32 addition commutes; simulated here lane by lane at both
    /// head dims, bit for bit, on rows whose sums cancel (where the order shows).
    #[test]
    fn lse_shift_order_is_the_lane_butterfly() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x15e5_1f7);
        let n = Normal::new(0.0f32, 1.0).unwrap();
        let mut differ = 0;
        for d in [64usize, 128] {
            let lanes = d / LSE_CHUNK;
            for _ in 0..200 {
                let q: Vec<f32> = (0..d).map(|i| n.sample(&mut rng) * if i % 17 == 0 { 300.0 } else { 1.0 }).collect();
                let mu: Vec<f32> = (0..d).map(|_| n.sample(&mut rng)).collect();
                let mut lane: Vec<f32> = (0..lanes)
                    .map(|l| {
                        let c = l * LSE_CHUNK;
                        (1..LSE_CHUNK).fold(q[c] * mu[c], |s, e| s + q[c + e] * mu[c + e])
                    })
                    .collect();
                let mut o = 1;
                while o < lanes {
                    lane = (0..lanes).map(|l| lane[l] + lane[l ^ o]).collect();
                    o <<= 1;
                }
                let want = lse_shift(&q, &mu, 0.125);
                for v in &lane {
                    assert_eq!((v * 0.125).to_bits(), want.to_bits(), "d {d}");
                }
                let chain = q.iter().zip(&mu).fold(0.0f32, |s, (a, b)| s + a * b) * 0.125;
                differ += (chain.to_bits() != want.to_bits()) as usize;
            }
        }
        // The order shows on these rows: a channel-order chain gives other bits on many.
        assert!(differ > 40, "{differ}");
    }

    #[test]
    fn smoothing_leaves_softmax_unchanged_and_shifts_lse_by_q_dot_mean() {
        let p = AttentionProblem::new(1, 2, 5, 16).kv_heads(1).kv_len(23);
        let q = gaussian(41, p.q_len_elems(), 1.0);
        let mut k = gaussian(42, p.k_len_elems(), 1.0);
        for j in 0..23 {
            k[j * 16 + 3] += 8.0; // an outlier channel
        }
        let sm = smooth_k(&p, &k).unwrap();
        // The mean, in f64 independently.
        for c in 0..16 {
            let m: f64 = (0..23).map(|j| k[j * 16 + c] as f64).sum::<f64>() / 23.0;
            assert!((sm.mean[c] as f64 - m).abs() <= 1e-6 * m.abs().max(1.0));
        }
        let scale = p.softmax_scale() as f64;
        let soft = |kk: &[f32], qi: &[f32]| -> (Vec<f64>, f64) {
            let s: Vec<f64> =
                (0..23).map(|j| scale * (0..16).map(|c| qi[c] as f64 * kk[j * 16 + c] as f64).sum::<f64>()).collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            (s.iter().map(|x| (x - m).exp() / z).collect(), m + z.ln())
        };
        for h in 0..2 {
            for i in 0..5 {
                let qi = &q[p.q_strides().offset(0, h, i)..][..16];
                let (p0, lse0) = soft(&k, qi);
                let (p1, lse1) = soft(&sm.values, qi);
                for (a, b) in p0.iter().zip(&p1) {
                    assert!((a - b).abs() < 1e-6, "softmax changed: {a} vs {b}");
                }
                let shift = lse_shift(qi, &sm.mean, p.softmax_scale()) as f64;
                assert!((lse0 - (lse1 + shift)).abs() < 1e-5, "lse {lse0} vs {lse1} + {shift}");
                assert!(shift.abs() > 1e-3, "the test must exercise a real shift");
            }
        }
    }
}
