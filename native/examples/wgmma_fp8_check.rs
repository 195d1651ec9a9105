//! On an H100 (compute capability 9.0): check every `fwd_wgmma_fp8` attention variant against an
//! f64 reference and against an emulation of the kernel's own arithmetic, then time it next to
//! the f16 wgmma family.
//!
//! ```text
//! cargo run --release -p quattn-native --example wgmma_fp8_check               # check + bench
//! cargo run --release -p quattn-native --example wgmma_fp8_check -- --check-only
//! cargo run --release -p quattn-native --example wgmma_fp8_check -- --bench-only
//! cargo run --release -p quattn-native --example wgmma_fp8_check -- --cpu-selftest  # no GPU:
//!                                                  # the emulation against the f64 reference
//! QUATTN_FP8_CHECK_ONLY=_w3,_rs cargo run ...      # only variants whose names contain a part
//!                                                  # (and the table variants)
//! ```
//!
//! # Check
//! Inputs: normal-ish samples with outliers (one element in 97 scaled by 6), quantized on the
//! host to E4M3 (round to nearest even, saturating) with descale `amax / 448` per tensor or per
//! (batch, head). Cases: non-causal, causal, GQA 8/2 with bshd strides, ragged q_len 1 / 17 / 127
//! / 300 with kv_len != q_len (kv_len < q_len under the causal mask: rows that see no key), and
//! two stale-max cases: a key in the tile processed last (the first BLOCK_N keys; the kernel
//! walks tiles from the end) that gives row 0 a score far above everything before it (the max grows late),
//! and one in the tile processed first that gives row 1 its max at once (the max only shrinks
//! relative to it afterwards), and the first with the key 12 times row 0's query instead of 3
//! times: a jump of about 190 log2 units, past the range of exp2 against the earlier max. O (f16 / bf16), LSE and the Vᵀ scratch are poisoned with NaN
//! before each launch; the prepass's Vᵀ is read back and compared byte for byte with the
//! permutation of `vt_key_of_column`.
//!
//! Two exact-S cases use Q and K codes in {-2, -1.5, .., 2}: every partial sum of Q·Kᵀ is then a
//! multiple of 1/4 below 2^10, exact in any accumulator. The long case (table variants only):
//! q_len 128, kv_len 16384, for the accumulation of O over 128 tiles.
//!
//! Two comparisons per case:
//! * `ref`, the gate of every case: f64 attention on the dequantized inputs. The kernel differs
//!   by P's E4M3 rounding (relative 2^-4 per probability at most, unbiased), O's 16-bit rounding
//!   and the tensor cores' arithmetic: about 1% relative L2 on these flat random softmaxes.
//!   Thresholds: rel-L2 <= 0.06, cos >= 0.998, P <= 448 (1 + 1e-5) (the unclamped probability
//!   of the emulation: an ulp of rounding above 448 at the row max is what cvt .satfinite
//!   clamps), and per row |dLSE| <= 2e-3 + ln 2 ·
//!   2^-10 · max_j Σ_x |q_x k_x| c: FP8 wgmma adds its products into the accumulator with a
//!   significand of about 13 bits (measured here, and DeepSeek-V3's report of ~14 bits on H800),
//!   so a score may be off by a few 2^-13 of its sum of |products| (2^-10: eight such
//!   truncations), and LSE moves by at most the largest score error of its row (the row sum adds
//!   the unrounded f32 probabilities; `_rs` variants add the E4M3-rounded ones in the P·V wgmma,
//!   which moves ln l by up to ln(1 + 2^-4 + kv_len 2^-10 / 448), allowed on top; their
//!   emulation adds the same rounded values, so its gate stays as tight).
//! * `emu`: the kernel's algorithm on the CPU: the same codes and descales, the same tile order
//!   (last tile first, BLOCK_N keys), the same f32 formulas (`c = scale_log2 * qd * kd`, `p =
//!   exp2(fma(s, c, -(m c - P_LOG2)))`, the per-warp rescale rule over 16-row groups including the
//!   zero rows past q_len, P = e4m3(p) exactly, `alpha`, `l`, `O = acc * (vd / l)` rounded to the
//!   output type), scores as the exact dot product rounded once to f32. Gated on the exact-S
//!   cases only: there the scores agree exactly, and what remains is ex2.approx (<= 2 ulp) against
//!   exp2 (a P one E4M3 step apart only within ~1e-6 of a rounding midpoint), O's accumulation in
//!   the tensor core (relative 2^-13 per k32 step at most: <= 1.5e-3 over the 12 steps of these
//!   cases) and one 16-bit ulp where the roundings straddle. Thresholds: rel-L2 <= 2e-3,
//!   |dLSE| <= 1e-4. On the random cases the emulation is reported, not gated: the scores differ
//!   by the accumulator's truncation, which moves every probability of a row alike (LSE) and
//!   flips E4M3 roundings of P near midpoints.
//!
//! # Bench
//! hd 128 then 64, (seq, batch, heads) = (4k, 16, 16), (8k, 8, 16), (16k, 4, 16), non-causal and causal;
//! median of 20 launches each timed by its own CUDA events after 3 warm-ups; TFLOP/s =
//! 4·b·h·s²·d / t (half for causal). FP8: attention alone and prepass + attention; the f16 wgmma
//! table variant on the same shapes in the same process, and the ratio.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::{bf16, f16};
use quattn_native::wgmma_fp8::{kv_pad, vt_key_of_column, Fp8Args, Fp8Buffers, Fp8Ptrs, Fp8WgmmaConfig, Fp8WgmmaKernel};
use quattn_native::{AttentionShape, DescaleGranularity, Dtype, Layout, Strides, WgmmaConfig, WgmmaKernel};

type BoxErr = Box<dyn std::error::Error>;

// ---- E4M3 on the host (bit-exact: round to nearest even, saturate to +-448) -----------------------

fn e4m3_decode(c: u8) -> f32 {
    let s = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((c >> 3) & 15) as i32;
    let m = (c & 7) as f32;
    if e == 15 && (c & 7) == 7 {
        return f32::NAN;
    }
    if e == 0 {
        s * m * (2f32).powi(-9)
    } else {
        s * (1.0 + m / 8.0) * (2f32).powi(e - 7)
    }
}

fn e4m3_encode(x: f32) -> u8 {
    let s: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7f;
    }
    if a > 448.0 {
        return s | 0x7e;
    }
    if a < (2f32).powi(-6) {
        // Subnormals: multiples of 2^-9 (code = the multiple; 8 is the smallest normal, 0x08).
        return s | (a * 512.0).round_ties_even() as u8;
    }
    let b = a.to_bits();
    let r = (b + 0x7ffff + ((b >> 20) & 1)) & !0xfffff;
    let e = ((r >> 23) as i32) - 127 + 7;
    let m = ((r >> 20) & 7) as u8;
    if e > 15 || (e == 15 && m == 7) {
        return s | 0x7e;
    }
    s | ((e as u8) << 3) | m
}

// ---- inputs -----------------------------------------------------------------------------------

/// Deterministic normal-ish samples (sum of uniforms, std ~1) with one outlier (x6) in 97.
fn samples(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                acc += ((s >> 40) as f32) / ((1u64 << 24) as f32) - 0.5;
            }
            acc * 1.732 * if (i as u64 + seed).is_multiple_of(97) { 6.0 } else { 1.0 }
        })
        .collect()
}

/// E4M3 codes and descales of a `[batch, heads, len, d]` tensor (strides `st`), per tensor or
/// per (batch, head): descale = amax / 448.
fn quantize(x: &[f32], st: &Strides, batch: usize, heads: usize, len: usize, d: usize, g: DescaleGranularity) -> (Vec<u8>, Vec<f32>) {
    let at = |b: usize, h: usize, i: usize| b * st.batch as usize + h * st.head as usize + i * st.seq as usize;
    let mut amax = vec![0f32; batch * heads];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..len {
                for c in 0..d {
                    amax[b * heads + h] = amax[b * heads + h].max(x[at(b, h, i) + c].abs());
                }
            }
        }
    }
    let desc: Vec<f32> = match g {
        DescaleGranularity::PerTensor => vec![amax.iter().cloned().fold(0f32, f32::max).max(1e-30) / 448.0],
        DescaleGranularity::PerHead | DescaleGranularity::PerBlock => amax.iter().map(|a| a.max(1e-30) / 448.0).collect(),
    };
    let mut codes = vec![0u8; x.len()];
    for b in 0..batch {
        for h in 0..heads {
            let dq = desc[if g == DescaleGranularity::PerTensor { 0 } else { b * heads + h }];
            for i in 0..len {
                for c in 0..d {
                    codes[at(b, h, i) + c] = e4m3_encode(x[at(b, h, i) + c] / dq);
                }
            }
        }
    }
    (codes, desc)
}

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    causal: bool,
    bshd: bool,
    descale: DescaleGranularity,
    /// The stale-max case: big scores in the last and the first processed tile.
    /// 0, or the factor of the aligned keys' K rows over their query rows (module docs of
    /// `inputs`): the larger, the further the max jumps.
    spikes: f32,
    /// Q and K codes in {-2, -1.5, .., 2}: every partial sum of Q·Kᵀ is a multiple of 1/4 below
    /// 2^10 in magnitude, exact in any accumulator with 12 or more significand bits.
    exact_s: bool,
}

fn cases() -> Vec<Case> {
    use DescaleGranularity::{PerHead as H, PerTensor as T};
    let c = |name, batch, q_heads, kv_heads, q_len, kv_len, causal, bshd, descale, spikes| Case {
        name, batch, q_heads, kv_heads, q_len, kv_len, causal, bshd, descale, spikes, exact_s: false,
    };
    let exact = |name, q_heads, kv_heads, q_len, kv_len, causal, descale| Case {
        exact_s: true, ..c(name, 1, q_heads, kv_heads, q_len, kv_len, causal, false, descale, 0.0)
    };
    vec![
        c("non-causal", 1, 2, 2, 256, 256, false, false, T, 0.0),
        c("causal per-head", 1, 2, 2, 256, 256, true, false, H, 0.0),
        c("gqa 8/2 bshd per-head", 2, 8, 2, 200, 333, false, true, H, 0.0),
        c("gqa 8/2 causal", 1, 8, 2, 256, 384, true, false, T, 0.0),
        c("q1 causal", 1, 2, 1, 1, 77, true, false, H, 0.0),
        c("q1 non-causal bshd", 2, 2, 2, 1, 1000, false, true, T, 0.0),
        c("q17 causal bshd", 1, 4, 2, 17, 300, true, true, H, 0.0),
        c("q127 causal kv<q", 1, 2, 2, 127, 50, true, false, T, 0.0),
        c("q300 non-causal bshd", 2, 2, 2, 300, 129, false, true, H, 0.0),
        // Whole query blocks that see no key (rows below 250), between blocks that do.
        c("q300 causal kv<q per-head", 2, 2, 2, 300, 50, true, false, H, 0.0),
        c("max grows late / shrinks", 1, 2, 2, 256, 1024, false, false, T, 3.0),
        c("max grows late causal per-head", 1, 2, 2, 256, 1024, true, false, H, 3.0),
        // A jump of ~190 log2 units: exp2 against the stale max overflows to +inf.
        c("max jumps past exp2's range", 1, 2, 2, 256, 1024, false, false, H, 12.0),
        exact("exact S non-causal", 2, 2, 256, 256, false, T),
        exact("exact S gqa causal per-head", 4, 2, 200, 333, true, H),
    ]
}

/// The long-sequence case (table variants only: its f64 reference is the slow part).
fn long_case() -> Case {
    Case {
        name: "long kv 16k", batch: 1, q_heads: 1, kv_heads: 1, q_len: 128, kv_len: 16384, causal: false, bshd: false,
        descale: DescaleGranularity::PerTensor, spikes: 0.0, exact_s: false,
    }
}

struct Inputs {
    /// Shapes and code strides of the case (`shape`); descales per `descale`.
    args: Fp8Args,
    q: Vec<u8>,
    k: Vec<u8>,
    v: Vec<u8>,
    qd: Vec<f32>,
    kd: Vec<f32>,
    vd: Vec<f32>,
    /// The codes decoded (exact).
    qf: Vec<f32>,
    kf: Vec<f32>,
    vf: Vec<f32>,
}

fn inputs(c: &Case, d: usize) -> Inputs {
    let layout = |h, n| if c.bshd { Strides::new(Layout::Bshd, h, n, d) } else { Strides::new(Layout::Bhsd, h, n, d) };
    let shape = AttentionShape {
        batch: c.batch,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        q_len: c.q_len,
        kv_len: c.kv_len,
        head_dim: d,
        v_head_dim: d,
        q: layout(c.q_heads, c.q_len),
        k: layout(c.kv_heads, c.kv_len),
        v: layout(c.kv_heads, c.kv_len),
        o: layout(c.q_heads, c.q_len),
        scale: 1.0 / (d as f32).sqrt(),
        causal: c.causal,
        write_lse: true,
    };
    let args = Fp8Args::new(shape, c.descale);
    let q_f = samples(c.batch * c.q_heads * c.q_len * d, 11);
    let q = &q_f;
    let mut k = samples(c.batch * c.kv_heads * c.kv_len * d, 12);
    let v = samples(c.batch * c.kv_heads * c.kv_len * d, 13);
    if c.spikes > 0.0 {
        // Key 5 (tile 0, processed last) aligned with query row 0 of each head's group leader;
        // the last key (processed first) aligned with row 1: scores ~3 |q|^2 scale >> the rest.
        let group = c.q_heads / c.kv_heads;
        for b in 0..c.batch {
            for kh in 0..c.kv_heads {
                let h = kh * group;
                for (key, row) in [(5usize, 0usize), (c.kv_len - 1, 1)] {
                    for x in 0..d {
                        let qo = b * shape.q.batch as usize + h * shape.q.head as usize + row * shape.q.seq as usize + x;
                        let ko = b * shape.k.batch as usize + kh * shape.k.head as usize + key * shape.k.seq as usize + x;
                        k[ko] = c.spikes * q[qo];
                    }
                }
            }
        }
    }
    let (mut q, mut qd) = quantize(&q_f, &shape.q, c.batch, c.q_heads, c.q_len, d, c.descale);
    let (mut k, mut kd) = quantize(&k, &shape.k, c.batch, c.kv_heads, c.kv_len, d, c.descale);
    if c.exact_s {
        let small = |x: &f32| e4m3_encode(((x * 2.0).round().clamp(-4.0, 4.0)) / 2.0);
        let k_f = samples(c.batch * c.kv_heads * c.kv_len * d, 12);
        q = q_f.iter().map(small).collect();
        k = k_f.iter().map(small).collect();
        qd.iter_mut().for_each(|x| *x = 0.25);
        kd.iter_mut().for_each(|x| *x = 0.25);
    }
    let (v, vd) = quantize(&v, &shape.v, c.batch, c.kv_heads, c.kv_len, d, c.descale);
    let dec = |x: &[u8]| x.iter().map(|&c| e4m3_decode(c)).collect::<Vec<f32>>();
    let (qf, kf, vf) = (dec(&q), dec(&k), dec(&v));
    Inputs { args, q, k, v, qd, kd, vd, qf, kf, vf }
}

fn at(s: &Strides, b: usize, h: usize, i: usize) -> usize {
    b * s.batch as usize + h * s.head as usize + i * s.seq as usize
}
fn descale(x: &[f32], g: DescaleGranularity, b: usize, heads: usize, h: usize) -> f32 {
    if g == DescaleGranularity::PerTensor { x[0] } else { x[b * heads + h] }
}
fn visible(a: &AttentionShape, i: usize) -> usize {
    if a.causal {
        (i as i64 + a.kv_len as i64 - a.q_len as i64 + 1).clamp(0, a.kv_len as i64) as usize
    } else {
        a.kv_len
    }
}

/// f64 attention on the dequantized codes: (O [b, h, q, d] dense, LSE [b, h, q], per row the
/// largest sum of |products| of a visible key in log2 units: max_j Σ_x |q_x k_x| · c).
fn reference(inp: &Inputs, d: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let a = &inp.args.shape;
    let group = a.q_heads / a.kv_heads;
    let mut o = vec![0f64; a.batch * a.q_heads * a.q_len * d];
    let mut lse = vec![f64::NEG_INFINITY; a.batch * a.q_heads * a.q_len];
    let mut sabs = vec![0f64; a.batch * a.q_heads * a.q_len];
    for b in 0..a.batch {
        for h in 0..a.q_heads {
            let kh = h / group;
            let (qd, kd, vd) = (
                descale(&inp.qd, inp.args.descale, b, a.q_heads, h) as f64,
                descale(&inp.kd, inp.args.descale, b, a.kv_heads, kh) as f64,
                descale(&inp.vd, inp.args.descale, b, a.kv_heads, kh) as f64,
            );
            for i in 0..a.q_len {
                let n = visible(a, i);
                if n == 0 {
                    continue;
                }
                let qo = at(&a.q, b, h, i);
                let s: Vec<f64> = (0..n)
                    .map(|j| {
                        let ko = at(&a.k, b, kh, j);
                        (0..d).map(|x| inp.qf[qo + x] as f64 * inp.kf[ko + x] as f64).sum::<f64>()
                            * qd * kd * a.scale as f64
                    })
                    .collect();
                let qo2 = at(&a.q, b, h, i);
                sabs[(b * a.q_heads + h) * a.q_len + i] = (0..n)
                    .map(|j| {
                        let ko = at(&a.k, b, kh, j);
                        (0..d).map(|x| (inp.qf[qo2 + x] as f64 * inp.kf[ko + x] as f64).abs()).sum::<f64>()
                    })
                    .fold(0f64, f64::max)
                    * qd
                    * kd
                    * a.scale as f64
                    * std::f64::consts::LOG2_E;
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = e.iter().sum();
                let r = ((b * a.q_heads + h) * a.q_len + i) * d;
                for x in 0..d {
                    o[r + x] = (0..n).map(|j| e[j] * inp.vf[at(&a.v, b, kh, j) + x] as f64).sum::<f64>() * vd / l;
                }
                lse[(b * a.q_heads + h) * a.q_len + i] = m + l.ln();
            }
        }
    }
    (o, lse, sabs)
}

/// The kernel's arithmetic on the CPU (module docs): (O [b, h, q, d] dense before the 16-bit
/// rounding, LSE, the largest stored P seen).
fn emulate(inp: &Inputs, d: usize, cfg: &Fp8WgmmaConfig) -> (Vec<f32>, Vec<f32>, f32) {
    let (rescale_log2, bn, bm) = (cfg.rescale_log2, cfg.block_n as usize, cfg.block_m() as usize);
    let a = &inp.args.shape;
    let group = a.q_heads / a.kv_heads;
    // The kernel's constant: log2(448) as the same decimal literal, so the same f32.
    #[allow(clippy::excessive_precision)]
    let p_log2 = 8.807354922057604f32 - rescale_log2 as f32;
    let scale_log2 = a.scale * std::f32::consts::LOG2_E;
    let mut o = vec![0f32; a.batch * a.q_heads * a.q_len * d];
    let mut lse = vec![0f32; a.batch * a.q_heads * a.q_len];
    let mut p_max = 0f32;
    let m_blocks = a.q_len.div_ceil(bm);
    for b in 0..a.batch {
        for h in 0..a.q_heads {
            let kh = h / group;
            let qd = descale(&inp.qd, inp.args.descale, b, a.q_heads, h);
            let kd = descale(&inp.kd, inp.args.descale, b, a.kv_heads, kh);
            let vd = descale(&inp.vd, inp.args.descale, b, a.kv_heads, kh);
            let c = scale_log2 * qd * kd;
            for mb in 0..m_blocks {
                let m0 = mb * bm;
                // cta_tiles: the keys the CTA visits.
                let n_end = if a.causal { a.kv_len.min((m0 + bm + a.kv_len).saturating_sub(a.q_len)) } else { a.kv_len };
                let n_tiles = n_end.div_ceil(bn);
                for g0 in (m0..m0 + bm).step_by(16) {
                    // 16 rows of one warp; rows past q_len read zero Q rows (scores 0).
                    let rows: Vec<usize> = (g0..g0 + 16).collect();
                    let mut m = [f32::NEG_INFINITY; 16];
                    let mut l = [0f32; 16];
                    let mut acc = vec![0f32; 16 * d];
                    let diag = |i: usize| -> usize {
                        if a.causal { (i as i64 + a.kv_len as i64 - a.q_len as i64 + 1).clamp(0, a.kv_len as i64) as usize } else { a.kv_len }
                    };
                    let mut s = vec![0f32; 16 * bn];
                    for t in (0..n_tiles).rev() {
                        let k0 = t * bn;
                        let mut mx = m;
                        for (r, &i) in rows.iter().enumerate() {
                            let vis = diag(i).min(a.kv_len);
                            for jj in 0..bn {
                                let j = k0 + jj;
                                s[r * bn + jj] = if j >= vis {
                                    f32::NEG_INFINITY
                                } else if i >= a.q_len {
                                    0.0
                                } else {
                                    let qo = at(&a.q, b, h, i);
                                    let ko = at(&a.k, b, kh, j);
                                    (0..d).map(|x| inp.qf[qo + x] as f64 * inp.kf[ko + x] as f64).sum::<f64>() as f32
                                };
                                mx[r] = mx[r].max(s[r * bn + jj]);
                            }
                        }
                        let need = (0..16).any(|r| (mx[r] - m[r]) * c > rescale_log2 as f32);
                        let mut alpha = [1f32; 16];
                        for r in 0..16 {
                            let mn = if need { mx[r] } else { m[r] };
                            alpha[r] = if mn == m[r] { 1.0 } else { ((m[r] - mn) * c).exp2() };
                            m[r] = mn;
                            l[r] *= alpha[r];
                            let mc = (if mn == f32::NEG_INFINITY { 0.0 } else { mn * c }) - p_log2;
                            let mut tile = vec![0f64; d];
                            for jj in 0..bn {
                                let p = s[r * bn + jj].mul_add(c, -mc).exp2();
                                if !cfg.rowsum_mma {
                                    l[r] += p;
                                }
                                if p == 0.0 {
                                    continue;
                                }
                                p_max = p_max.max(p);
                                let pq = e4m3_decode(e4m3_encode(p)) as f64;
                                // The row sums from the P·V wgmma add the stored (rounded) P.
                                if cfg.rowsum_mma {
                                    l[r] += pq as f32;
                                }
                                let j = k0 + jj;
                                let vo = at(&a.v, b, kh, j);
                                for (t, &v) in tile.iter_mut().zip(&inp.vf[vo..vo + d]) {
                                    *t += pq * v as f64;
                                }
                            }
                            for (a, &t) in acc[r * d..(r + 1) * d].iter_mut().zip(&tile) {
                                *a = *a * alpha[r] + t as f32;
                            }
                        }
                    }
                    for (r, &i) in rows.iter().enumerate() {
                        if i >= a.q_len {
                            continue;
                        }
                        let idx = (b * a.q_heads + h) * a.q_len + i;
                        let empty = l[r].is_nan() || l[r] <= 0.0;
                        let inv = if empty { 0.0 } else { vd / l[r] };
                        for x in 0..d {
                            o[idx * d + x] = acc[r * d + x] * inv;
                        }
                        lse[idx] = if empty {
                            f32::NEG_INFINITY
                        } else {
                            (m[r] * c + l[r].log2() - p_log2) * std::f32::consts::LN_2
                        };
                    }
                }
            }
        }
    }
    (o, lse, p_max)
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    rel_l2: f64,
    max_abs: f64,
    cos: f64,
    /// <got, want> / <want, want>: 1 without a systematic scale error.
    gain: f64,
    max_o: f64,
    lse: f64,
    /// Rows whose |dLSE| exceeds their tolerance.
    lse_bad: usize,
}

/// `lse_tol[row]`: the allowed |dLSE| of each row.
fn compare(got: &[f64], want: &[f64], lse_got: &[f32], lse_want: &[f64], lse_tol: &[f64]) -> Stats {
    let (mut num, mut den, mut dot, mut gg, mut st) = (0f64, 0f64, 0f64, 0f64, Stats::default());
    for (&g, &w) in got.iter().zip(want) {
        let e = if g.is_nan() { f64::INFINITY } else { (g - w).abs() };
        st.max_abs = st.max_abs.max(e);
        st.max_o = st.max_o.max(w.abs());
        num += e * e;
        den += w * w;
        dot += g * w;
        gg += g * g;
    }
    st.rel_l2 = (num / den.max(1e-300)).sqrt();
    st.cos = dot / (gg.sqrt() * den.sqrt()).max(1e-300);
    st.gain = dot / den.max(1e-300);
    for ((&g, &w), &tol) in lse_got.iter().zip(lse_want).zip(lse_tol) {
        let e = if w == f64::NEG_INFINITY {
            if g == f32::NEG_INFINITY { 0.0 } else { f64::INFINITY }
        } else if !g.is_finite() {
            f64::INFINITY
        } else {
            (g as f64 - w).abs()
        };
        st.lse = st.lse.max(e);
        st.lse_bad += (e > tol) as usize;
    }
    st
}

/// Runs one case; returns (vs ref, vs emulation, largest stored P of the emulation).
fn check(stream: &Arc<CudaStream>, kernel: &Fp8WgmmaKernel, c: &Case) -> Result<(Stats, Stats, f32), BoxErr> {
    let cfg = *kernel.config();
    let d = cfg.head_dim as usize;
    let inp = inputs(c, d);
    let lens = cfg.required_lens(&inp.args);
    let a = inp.args.shape;
    let qg = stream.clone_htod(&inp.q)?;
    let kg = stream.clone_htod(&inp.k)?;
    let vg = stream.clone_htod(&inp.v)?;
    let mut vt: CudaSlice<u8> = stream.clone_htod(&vec![0x7fu8; lens.vt])?; // NaN codes: the prepass must overwrite all
    let mut og = stream.clone_htod(&vec![0x7fffu16; lens.o])?; // NaN in f16 and bf16
    let mut lg = stream.clone_htod(&vec![f32::NAN; lens.lse])?;
    let qdg = stream.clone_htod(&inp.qd)?;
    let kdg = stream.clone_htod(&inp.kd)?;
    let vdg = stream.clone_htod(&inp.vd)?;
    kernel.launch(
        stream,
        &inp.args,
        Fp8Buffers::<u16, _, _, _, _, _, _, _>::new(&qg, &kg, &vg, &mut vt, &mut og, &mut lg, &qdg, &kdg, &vdg),
    )?;
    // The prepass: Vᵀ column 32c + k holds key 32c + sigma(k), zeros past kv_len.
    let vt_host = stream.clone_dtoh(&vt)?;
    let pad = kv_pad(&a);
    for b in 0..a.batch {
        for kh in 0..a.kv_heads {
            for x in 0..d {
                for col in 0..pad {
                    let key = (col & !31) + vt_key_of_column(col & 31);
                    let want = if key < a.kv_len { inp.v[at(&a.v, b, kh, key) + x] } else { 0 };
                    let got = vt_host[((b * a.kv_heads + kh) * d + x) * pad + col];
                    if got != want {
                        return Err(format!("Vt[{b}][{kh}][{x}][{col}] = {got:#x}, want {want:#x}").into());
                    }
                }
            }
        }
    }
    let o_bits = stream.clone_dtoh(&og)?;
    let lse = stream.clone_dtoh(&lg)?;
    let to_f = |x: u16| match cfg.out {
        Dtype::F16 | Dtype::F32 => f16::from_bits(x).to_f64(),
        Dtype::Bf16 => bf16::from_bits(x).to_f64(),
    };
    let mut got = vec![0f64; a.batch * a.q_heads * a.q_len * d];
    for b in 0..a.batch {
        for h in 0..a.q_heads {
            for i in 0..a.q_len {
                let r = ((b * a.q_heads + h) * a.q_len + i) * d;
                let oo = at(&a.o, b, h, i);
                for x in 0..d {
                    got[r + x] = to_f(o_bits[oo + x]);
                }
            }
        }
    }
    let ((ro, rl, sabs), (eo, el, p_max)) = std::thread::scope(|sc| {
        let r = sc.spawn(|| reference(&inp, d));
        let e = emulate(&inp, d, &cfg);
        (r.join().expect("reference thread"), e)
    });
    // The emulation's O rounded to the output type as the kernel's is.
    let eo64: Vec<f64> = eo
        .iter()
        .map(|&x| match cfg.out {
            Dtype::F16 | Dtype::F32 => f16::from_f32(x).to_f64(),
            Dtype::Bf16 => bf16::from_f32(x).to_f64(),
        })
        .collect();
    let el64: Vec<f64> = el.iter().map(|&x| x as f64).collect();
    // LSE against the reference: the FP8 wgmma sums Q·Kᵀ with a ~13-bit significand (module
    // docs), so a score may be off by a few 2^-13 of its sum of |products|; LSE moves by at most
    // the largest such error of the row's keys. 2^-10 allows eight truncations.
    // The row sums from the P·V wgmma (`_rs`) go through its accumulator (about 13 significand
    // bits) over the tile's block_n / 32 k-steps before l adds them in f32: ln l may move by up
    // to that many truncations of 2^-13, which the emulation (exact f32 adds) does not model.
    let rs_acc = if cfg.rowsum_mma { (cfg.block_n as f64 / 32.0 * 2f64.powi(-13)).ln_1p() } else { 0.0 };
    // With the row sums from the P·V wgmma, l sums the E4M3-rounded P: each normal term is off
    // by at most 2^-4 of itself and each subnormal one by 2^-10, against l >= 448 (the row max's
    // term), so ln l moves by at most ln(1 + 2^-4 + kv_len 2^-10 / 448) on top.
    let rs_tol = if cfg.rowsum_mma { (2f64.powi(-4) + inp.args.shape.kv_len as f64 * 2f64.powi(-10) / 448.0).ln_1p() } else { 0.0 };
    let ref_tol: Vec<f64> = sabs.iter().map(|x| 2e-3 + std::f64::consts::LN_2 * x * 2f64.powi(-10) + rs_tol + rs_acc).collect();
    let emu_tol = vec![1e-4 + rs_acc; el.len()];
    Ok((compare(&got, &ro, &lse, &rl, &ref_tol), compare(&got, &eo64, &lse, &el64, &emu_tol), p_max))
}

// ---- bench ------------------------------------------------------------------------------------

/// Median milliseconds of each launch in `runs`, timed in turn round after round (3 rounds of
/// warm-up, then 20), so that all of them see the same power state: the board lowers its clocks
/// about a second into a run, which back-to-back blocks of one kernel would charge to the later.
fn interleaved_medians_ms(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    runs: &mut [Box<dyn FnMut() -> Result<(), BoxErr> + '_>],
) -> Result<Vec<f64>, BoxErr> {
    let mut ms = vec![Vec::with_capacity(20); runs.len()];
    for round in 0..23 {
        for (i, run) in runs.iter_mut().enumerate() {
            let start = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            let end = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            start.record(stream)?;
            run()?;
            end.record(stream)?;
            end.synchronize()?;
            if round >= 3 {
                ms[i].push(start.elapsed_ms(&end)? as f64);
            }
        }
    }
    Ok(ms
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.total_cmp(b));
            0.5 * (v[9] + v[10])
        })
        .collect())
}

fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, d: usize, kernels: &[&Fp8WgmmaKernel], f16k: Option<&WgmmaKernel>) -> Result<(), BoxErr> {
    // A pool of quantized normal samples (with outliers), tiled over the tensors.
    let pool: Vec<u8> = samples(1 << 20, 5).iter().map(|&x| e4m3_encode(x / (6.0 * 1.732 * 2.0 / 448.0))).collect();
    let pool16: Vec<u16> = samples(1 << 20, 5).iter().map(|&x| f16::from_f32(x).to_bits()).collect();
    // The last shape is the benchmark tables' (batch x seq 16k; at hd 128, 2048 query blocks of 128 rows, a
    // 15.5-wave grid on 132 SMs).
    for (seq, batch, heads) in [(4096usize, 16usize, 16usize), (8192, 8, 16), (16384, 4, 16), (16384, 1, 16)] {
        let n = batch * heads * seq * d;
        let codes: Vec<u8> = (0..n).map(|i| pool[(i * 7 + i / 977) % pool.len()]).collect();
        let qg = stream.clone_htod(&codes)?;
        let kg = stream.clone_htod(&codes)?;
        let vg = stream.clone_htod(&codes)?;
        let mut og = stream.alloc_zeros::<u16>(n)?;
        let mut lg = stream.alloc_zeros::<f32>(batch * heads * seq)?;
        let mut og16 = stream.alloc_zeros::<u16>(n)?;
        let mut lg16 = stream.alloc_zeros::<f32>(batch * heads * seq)?;
        let desc = stream.clone_htod(&[6.0f32 * 1.732 * 2.0 / 448.0])?;
        let halves: Vec<u16> = (0..n).map(|i| pool16[(i * 7 + i / 977) % pool16.len()]).collect();
        let (q16, k16, v16) = (stream.clone_htod(&halves)?, stream.clone_htod(&halves)?, stream.clone_htod(&halves)?);
        drop(halves);
        for causal in [false, true] {
            let s = Strides::new(Layout::Bhsd, heads, seq, d);
            let ha = AttentionShape {
                batch, q_heads: heads, kv_heads: heads, q_len: seq, kv_len: seq, head_dim: d, v_head_dim: d, q: s, k: s, v: s, o: s,
                scale: 1.0 / (d as f32).sqrt(), causal, write_lse: true,
            };
            let a = Fp8Args::new(ha, DescaleGranularity::PerTensor);
            let flops = 4.0 * (batch * heads * seq * seq * d) as f64 * if causal { 0.5 } else { 1.0 };
            let tf = |ms: f64| flops / (ms * 1e-3) / 1e12;
            let Some(vt_len) = kernels.iter().map(|k| k.config().required_lens(&a).vt).max() else { return Ok(()) };
            let mut vt = stream.alloc_zeros::<u8>(vt_len)?;
            let mut line = format!("d{d} s{:>2}k b{:>2} h{} {:10}", seq / 1024, batch, heads, if causal { "causal" } else { "non-causal" });
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let (qp, _a) = qg.device_ptr(stream);
            let (kp, _b) = kg.device_ptr(stream);
            let (vp, _c) = vg.device_ptr(stream);
            let (vtp, _d) = vt.device_ptr_mut(stream);
            let (op, _e) = og.device_ptr_mut(stream);
            let (lp, _f) = lg.device_ptr_mut(stream);
            let (dp, _g) = desc.device_ptr(stream);
            let ptrs = Fp8Ptrs { q: qp, k: kp, v: vp, vt: vtp, o: op, lse: lp, q_descale: dp, k_descale: dp, v_descale: dp };
            // The f16 kernel, then per FP8 kernel the attention alone and with the prepass.
            let mut runs: Vec<Box<dyn FnMut() -> Result<(), BoxErr> + '_>> = Vec::new();
            if let Some(w) = f16k {
                let (og16, lg16) = (&mut og16, &mut lg16);
                let (q16, k16, v16) = (&q16, &k16, &v16);
                runs.push(Box::new(move || Ok(w.launch(stream, &ha, q16, k16, v16, og16, lg16)?)));
            }
            for &k in kernels {
                // SAFETY: buffers sized by required_lens above, alive for the whole bench.
                runs.push(Box::new(move || Ok(unsafe { k.launch_attention_raw(stream, &a, &ptrs) }?)));
                runs.push(Box::new(move || {
                    unsafe {
                        k.launch_prepass_raw(stream, &a, vp, vtp)?;
                        k.launch_attention_raw(stream, &a, &ptrs)?;
                    }
                    Ok(())
                }));
            }
            let ms = interleaved_medians_ms(ctx, stream, &mut runs)?;
            drop(runs);
            let mut ms = ms.into_iter();
            let f16_tf = match f16k {
                Some(_) => {
                    let t = tf(ms.next().unwrap_or(f64::NAN));
                    line.push_str(&format!(" | f16 wgmma {t:6.1}"));
                    Some(t)
                }
                None => None,
            };
            for k in kernels {
                let attn = ms.next().unwrap_or(f64::NAN);
                let total = ms.next().unwrap_or(f64::NAN);
                let ratio = f16_tf.map(|f| format!(" x{:.2}", tf(attn) / f)).unwrap_or_default();
                line.push_str(&format!(
                    " | {} {:6.1} (+prepass {:6.1}){ratio}",
                    k.config().name().trim_start_matches("fwd_fp8_wgmma_"),
                    tf(attn),
                    tf(total)
                ));
            }
            println!("{line} TFLOP/s");
        }
    }
    Ok(())
}

/// [`Fp8WgmmaConfig::all`], or those whose names contain one of the comma-separated parts of
/// `QUATTN_FP8_CHECK_ONLY` (the table variants always).
fn variants() -> Vec<Fp8WgmmaConfig> {
    let only = std::env::var("QUATTN_FP8_CHECK_ONLY").unwrap_or_default();
    let parts: Vec<&str> = only.split(',').filter(|p| !p.is_empty()).collect();
    Fp8WgmmaConfig::all()
        .into_iter()
        .filter(|c| {
            parts.is_empty()
                || Fp8WgmmaConfig::new(c.head_dim as usize, c.out).ok() == Some(*c)
                || parts.iter().any(|p| c.name().contains(p))
        })
        .collect()
}

fn main() -> Result<(), BoxErr> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (check_only, bench_only) = (mode == "--check-only", mode == "--bench-only");
    // The host codec: every finite code round-trips, ties go to the even code, values past the
    // largest finite saturate.
    for c in 0u8..=255 {
        if c & 0x7f != 0x7f {
            assert_eq!(e4m3_encode(e4m3_decode(c)), if c == 0x80 { 0x80 } else { c }, "code {c:#x}");
        }
    }
    assert_eq!(e4m3_encode(1.0625), 0x38); // halfway between 1 and 1.125: to the even 1
    assert_eq!(e4m3_encode(1.1875), 0x3a); // halfway between 1.125 and 1.25: to 1.25
    assert_eq!(e4m3_encode(3.0 * 2f32.powi(-10)), 0x02); // subnormal tie 1.5 * 2^-9 -> 2 * 2^-9
    assert_eq!((e4m3_encode(464.0), e4m3_encode(1e9), e4m3_encode(-500.0)), (0x7e, 0x7e, 0xfe));
    if mode == "--cpu-selftest" {
        // The emulation against the f64 reference, no GPU: the P quantization error alone.
        for d in [64usize, 128] {
            for c in cases() {
                let inp = inputs(&c, d);
                let (ro, rl, _) = reference(&inp, d);
                let base = Fp8WgmmaConfig { block_n: 128, ..Fp8WgmmaConfig::new(d, Dtype::F16)? };
                // The stale-max threshold 0 and 8, and the row sums of the rounded P (three
                // warpgroups).
                let variants = [(0u32, base), (8, Fp8WgmmaConfig { rescale_log2: 8, ..base }), (0, Fp8WgmmaConfig { wgs: 3, rowsum_mma: true, ..base })];
                for (r, cfg) in variants {
                    let (eo, el, p_max) = emulate(&inp, d, &cfg);
                    let st = compare(&eo.iter().map(|&x| x as f64).collect::<Vec<_>>(), &ro, &el, &rl, &vec![1e-4; rl.len()]);
                    println!(
                        "d{d} r{r}{} {:32} emu vs ref rel-L2 {:.2e} max-abs {:.2e} cos {:.6} gain {:.5} dLSE {:.1e} ({} rows > 1e-4) P max {:.1}",
                        if cfg.rowsum_mma { " rs" } else { "" },
                        c.name,
                        st.rel_l2,
                        st.max_abs,
                        st.cos,
                        st.gain,
                        st.lse,
                        st.lse_bad,
                        p_max
                    );
                }
            }
        }
        return Ok(());
    }
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    let cc = ctx.compute_capability()?;
    println!("device {} cc {:?}", ctx.name()?, cc);
    if Fp8WgmmaConfig::target_for((cc.0 as u32, cc.1 as u32)).is_none() {
        println!("FAIL: fwd_wgmma_fp8 runs on compute capability 9.0 (sm_90a) only");
        std::process::exit(2);
    }
    // Compile every variant in parallel first (NVRTC is single-threaded per program); the loads
    // below then hit the in-memory cache.
    {
        let mut reqs = Vec::new();
        for cfg in variants() {
            reqs.push(cfg.request(quattn_native::Arch::Sm90a)?);
            reqs.push(cfg.prepass_request(quattn_native::Arch::Sm90a)?);
        }
        reqs.push(WgmmaConfig::new(128)?.request(quattn_native::Arch::Sm90a)?);
        reqs.push(WgmmaConfig::new(64)?.request(quattn_native::Arch::Sm90a)?);
        let t0 = std::time::Instant::now();
        std::thread::scope(|sc| {
            for req in &reqs {
                sc.spawn(move || {
                    if let Err(e) = quattn_native::KernelCache::global().get_or_compile(req) {
                        println!("compile {}: {e}", req.kernel);
                    }
                });
            }
        });
        println!("compiled {} programs in {:.1} s", reqs.len(), t0.elapsed().as_secs_f64());
    }
    let mut all_ok = true;
    let mut bench_kernels = Vec::new();
    for cfg in variants() {
        let kernel = match Fp8WgmmaKernel::load(&ctx, cfg) {
            Ok(k) => k,
            Err(e) => {
                println!("FAIL {:36} load: {e}", cfg.name());
                all_ok = false;
                continue;
            }
        };
        let res = kernel.compiled().resources;
        println!("{:36} regs {:3} spill {:3}", cfg.name(), res.map(|r| r.registers).unwrap_or(0), res.map(|r| r.spill_store_bytes).unwrap_or(0));
        if !bench_only {
            let table = Fp8WgmmaConfig::new(cfg.head_dim as usize, cfg.out).ok() == Some(cfg);
            let mut list = cases();
            // The long case also for the row sums from the P·V wgmma: their accumulation over
            // 16k keys has the accumulator's truncation, as O's has.
            if table || cfg.rowsum_mma {
                list.push(long_case());
            }
            for c in &list {
                let name = c.name;
                let (r, e, p_max) = match check(&stream, &kernel, c) {
                    Ok(x) => x,
                    Err(err) => {
                        println!("  FAIL {name:32} {err}");
                        all_ok = false;
                        continue;
                    }
                };
                // Gate A (every case): the f64 reference. Gate B (exact-S cases): the emulation,
                // where only P·V's accumulation, ex2/lg2.approx and O's rounding remain.
                // P: the largest unclamped probability the emulation met. At the row max the exp2
                // argument is P_LOG2 up to the rounding of m c - P_LOG2 (an ulp of |m c| < 64 is
                // <= 2^-18), so P may exceed 448 by that much (cvt .satfinite clamps it), never by
                // a stale max's factor.
                let ref_ok = r.rel_l2 <= 0.06 && r.cos >= 0.998 && r.lse_bad == 0 && p_max <= 448.0 * (1.0 + 1e-5);
                let emu_ok = !c.exact_s || (e.rel_l2 <= 2e-3 && e.lse_bad == 0);
                let ok = ref_ok && emu_ok;
                all_ok &= ok;
                println!(
                    "  {} {:32} ref rel-L2 {:.2e} max-abs {:.2e} cos {:.6} gain {:.5} dLSE {:.1e} ({} rows over) | emu{} rel-L2 {:.2e} max-abs {:.2e} (max|O| {:.2}) gain {:.5} dLSE {:.1e} | P max {:.1}",
                    if ok { "PASS" } else { "FAIL" },
                    name, r.rel_l2, r.max_abs, r.cos, r.gain, r.lse, r.lse_bad,
                    if c.exact_s { "(gated)" } else { "" }, e.rel_l2, e.max_abs, e.max_o, e.gain, e.lse, p_max
                );
            }
        }
        if cfg.out == Dtype::F16 {
            bench_kernels.push(kernel);
        }
    }
    if !check_only {
        for d in [128usize, 64] {
            let f16k = WgmmaConfig::new(d).and_then(|c| WgmmaKernel::load(&ctx, c)).ok();
            let ks: Vec<&Fp8WgmmaKernel> = bench_kernels.iter().filter(|k| k.config().head_dim as usize == d).collect();
            bench(&ctx, &stream, d, &ks, f16k.as_ref())?;
        }
    }
    println!("{}", if all_ok { "ALL PASS" } else { "SOME FAILED" });
    if !all_ok {
        std::process::exit(1);
    }
    Ok(())
}
