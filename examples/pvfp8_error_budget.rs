//! Where the error of INT8 Q·Kᵀ with E4M3 P·V (`Precision::Int8Qk { pv: Fp8 }`, SageAttention2's
//! design) comes from, and whether any formulation that keeps P and V in E4M3 for an
//! E4M3×E4M3 P·V can reach the mode's target of cos-sim ≥ 0.9995 (rel-L2 ≲ 0.0316) against the
//! f64 reference on the project's inputs.
//!
//! Attention is recomputed here in f64 with a pluggable rounding of each operand, so every
//! error source can be switched on alone:
//! * Q·Kᵀ: exact (f64 dot of the f16 inputs) or the mode's INT8 (per-block or per-thread Q
//!   scales over the kernel blocking 128 × 64 × 8, K smoothed, `softmax_scale · log2 e` folded
//!   into Q's scales: the codec's codes and scales, `dot · q_scale · k_scale`).
//! * P: the online softmax of a flash kernel (KV tiles of 64 keys, `p = exp2(s − m)` against the
//!   running max `m`), then P rounded: exact; f16; `e4m3(448 p)` (the mode); `e4m3(448 p / 2^8)`
//!   (a stale max allowed to lag by 2^8, FlashAttention-4's conditional rescale); against the
//!   tile's own max (`e4m3(448 exp2(s − m_tile))`, the tile product times `exp2(m_tile − m)`);
//!   split into two E4M3 terms, `hi = e4m3(448 p)` and `lo = e4m3(448 p − hi)` in the same
//!   units (a second E4M3 MMA into the same accumulator); or rounded up or down per key so as to
//!   cancel the error vector `Σ (p̂ − p) v̂` accumulated over the row so far (greedy error
//!   feedback, a bound on what data-dependent rounding of P could do; not a tile-local
//!   operation of any kernel).
//! * V: exact; E4M3 with one scale per (batch, KV head, channel), `amax / 448` (the mode, the
//!   codec's [`quattn::codec::int8::quantize_v_e4m3`]); the same after subtracting V's
//!   per-channel mean over the keys (added back to O, valid since each row's probabilities sum
//!   to 1); one scale per 64 keys and channel; one scale per head; split into two E4M3 terms
//!   under the one per-channel scale `s`, `hi = e4m3(v / s)`, `lo = e4m3(v / s − hi)`. With
//!   both split the product is `P_hi·V_hi + P_hi·V_lo + P_lo·V_hi` (three MMAs; `P_lo·V_lo`,
//!   2^-8 of it, dropped).
//! * The row sum `l`: of the unrounded P (the mode's kernel and emulation) or of the rounded P
//!   (row sums from the P·V MMA).
//!
//! Products and sums are f64, so only the number formats differ from the reference. The mode's
//! CPU emulation (`quattn::emulation::emulate`, int8-block-pvfp8, f32 sums per tile) is run next
//! to configuration (e) as a cross-check: they agree to the printed digits, so the mode's
//! accumulation adds nothing visible.
//!
//! Cases: the 7 shape classes of `quattn selftest --quick` the emulation accepts, with the
//! selftest's inputs and seeds (unit normal with 0.1% ±8σ outliers, rounded to f16), whose
//! worst case is the ACCURACY.md row; and a bulk shape (b1 h8 s1024 hd128, 3 seeds) for the
//! statistics without small-sample noise.
//!
//! The analytic model printed per case: with per-element relative errors η_ij of P and ε_jc of
//! V, independent and of RMS ρ_P, ρ_V, δO_ic ≈ Σ_j w_ij v_jc (η_ij + ε_jc) (w the softmax
//! weights), so rel-L2(O)² ≈ κ² (ρ_P² + ρ_V²) with
//! κ² = Σ_ic Σ_j w_ij² v_jc² / Σ_ic O_ic² (= ‖p∘v‖² / ‖p·v‖² summed over rows and channels).
//! ρ_V is V's energy-weighted relative error ‖V̂ − V‖/‖V‖, ρ_P P's relative error weighted
//! by w², both measured; for values whose mantissas are spread log-uniformly (as for exp2 of
//! a continuous score) E4M3 round-to-nearest gives ρ = 2^-4 / √(3 · 3/(2 ln 2)) ≈ 0.0245.
//!
//! Output: `benchmarks/2026-11-29-cpu-pvfp8/pvfp8_error_budget.txt`. In short: κ ≈ 1 on these
//! inputs (V has no common component for the noise to average against), ρ_P ≈ 0.024 and
//! ρ_V ≈ 0.026, so E4M3 P and V alone cost rel-L2 ≈ 0.035 (cos-sim 0.9994) with exact Q·Kᵀ;
//! scales, smoothing and where P is referenced do not move it; only a second E4M3 term per
//! operand (more MMAs than f16 P·V) gets to 0.9995.
//!
//!     cargo run --release --example pvfp8_error_budget

use quattn::codec::float16::round_f16;
use quattn::codec::fp8::{e4m3, Saturation};
use quattn::codec::int8::{self, Int8ScaleLayout};
use quattn::emulation::{emulate, Blocking};
use quattn::metrics::ErrorMetrics;
use quattn::{inputs, reference, AttentionProblem, Dtype, HostSlice, Int8Granularity, Layout, Precision, PvFormat};
use rayon::prelude::*;

/// Keys per KV tile (the online-softmax step; the mode's K-scale block).
const BLOCK_K: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum Qk {
    Exact,
    /// Per-block Q scales (the worst granularity of the ACCURACY.md rows).
    Int8,
    /// Per-thread Q scales (the best).
    Int8Thread,
}

#[derive(Clone, Copy, PartialEq)]
enum P {
    Exact,
    F16,
    /// `e4m3(p · 448 · 2^-lag)`: `lag` 0 is the mode; 8 a running max that may lag by 2^8.
    E4m3 { lag: i32 },
    /// Against the tile's own row max.
    E4m3Tile,
    /// `hi = e4m3(448 p)`, `lo = e4m3(16 (448 p − hi)) / 16`.
    E4m3Split,
    /// Up or down per key, cancelling the accumulated `Σ (p̂ − p) v̂`.
    E4m3Shaped,
}

#[derive(Clone, Copy, PartialEq)]
enum V {
    Exact,
    /// Per (batch, KV head, channel) `amax / 448`: the mode.
    Channel,
    /// Channel, after subtracting the per-channel mean over the keys.
    ChannelSmoothed,
    /// One scale per 64 keys and channel.
    Block,
    /// One scale per (batch, KV head).
    Head,
    /// Channel, plus a second E4M3 term for the residual (per-channel scale).
    Split,
}

struct Config {
    name: &'static str,
    qk: Qk,
    p: P,
    v: V,
    /// `l` sums the rounded P.
    l_rounded: bool,
}

const fn cfg(name: &'static str, qk: Qk, p: P, v: V) -> Config {
    Config { name, qk, p, v, l_rounded: false }
}

const CONFIGS: &[Config] = &[
    cfg("(a) exact QK, e4m3 P", Qk::Exact, P::E4m3 { lag: 0 }, V::Exact),
    cfg("(b) exact QK, e4m3 V", Qk::Exact, P::Exact, V::Channel),
    cfg("(c) exact QK, e4m3 P+V", Qk::Exact, P::E4m3 { lag: 0 }, V::Channel),
    cfg("(d) int8 QK only", Qk::Int8, P::Exact, V::Exact),
    cfg("(d') int8-thread QK only", Qk::Int8Thread, P::Exact, V::Exact),
    cfg("    int8, f16 P (pv16 mode)", Qk::Int8, P::F16, V::Exact),
    cfg("(e) int8, e4m3 P+V (mode)", Qk::Int8, P::E4m3 { lag: 0 }, V::Channel),
    cfg("(e') int8-thread, e4m3 P+V", Qk::Int8Thread, P::E4m3 { lag: 0 }, V::Channel),
    cfg("    int8, e4m3 P, exact V", Qk::Int8, P::E4m3 { lag: 0 }, V::Exact),
    cfg("    int8, f16 P, e4m3 V", Qk::Int8, P::F16, V::Channel),
    cfg("m1 V smoothed", Qk::Int8, P::E4m3 { lag: 0 }, V::ChannelSmoothed),
    cfg("m2 V scale per 64 keys", Qk::Int8, P::E4m3 { lag: 0 }, V::Block),
    cfg("m3 V scale per head", Qk::Int8, P::E4m3 { lag: 0 }, V::Head),
    cfg("m4 P vs tile max", Qk::Int8, P::E4m3Tile, V::Channel),
    cfg("m5 P 448/2^8 (lagging max)", Qk::Int8, P::E4m3 { lag: 8 }, V::Channel),
    Config { name: "m6 l of rounded P", qk: Qk::Int8, p: P::E4m3 { lag: 0 }, v: V::Channel, l_rounded: true },
    cfg("m7 P noise-shaped", Qk::Int8, P::E4m3Shaped, V::Channel),
    cfg("m8 P split (2 MMAs)", Qk::Int8, P::E4m3Split, V::Channel),
    cfg("m9 V split (2 MMAs)", Qk::Int8, P::E4m3 { lag: 0 }, V::Split),
    cfg("m10 P+V split (3 MMAs)", Qk::Int8, P::E4m3Split, V::Split),
    cfg("m8' P split, int8-thread", Qk::Int8Thread, P::E4m3Split, V::Channel),
    cfg("m9' V split, int8-thread", Qk::Int8Thread, P::E4m3 { lag: 0 }, V::Split),
    cfg("m10' P+V split, int8-thread", Qk::Int8Thread, P::E4m3Split, V::Split),
];

fn e4m3_rn(x: f64) -> f64 {
    e4m3::decode(e4m3::encode(x as f32, Saturation::Saturate)) as f64
}

/// The E4M3 values just below and above `x ≥ 0` (equal when `x` is one).
fn e4m3_neighbours(x: f64) -> (f64, f64) {
    let c = e4m3::encode(x as f32, Saturation::Saturate);
    let r = e4m3::decode(c) as f64;
    if r == x {
        (r, r)
    } else if r < x {
        (r, if c < e4m3::MAX_CODE { e4m3::decode(c + 1) as f64 } else { r })
    } else {
        (if c > 0 { e4m3::decode(c - 1) as f64 } else { 0.0 }, r)
    }
}

/// One case's inputs, reference and prepared operands.
struct Case {
    p: AttentionProblem,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    reference: Vec<f64>,
    /// Logits in log2 units, `[row][key]` (rows `(b, h, i)` in order): exact, INT8 per-block
    /// and per-thread scales.
    s_exact: Vec<f64>,
    s_int8: Vec<f64>,
    s_int8_thread: Vec<f64>,
}

impl Case {
    fn new(p: AttentionProblem, seed: u64) -> Result<Case, quattn::Error> {
        let (q, k, v) = inputs::qkv(&p, seed);
        let f16 = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(Dtype::F16);
        let (q, k, v) = (f16(q), f16(k), f16(v));
        let reference = reference::attention_f64(&p, &q, &k, &v)?.o;
        let (d, n) = (p.head_dim, p.kv_len);
        let scale = p.softmax_scale() as f64 * std::f64::consts::LOG2_E;
        let rows = p.batch * p.q_heads * p.q_len;
        let (qs, ks) = (p.q_strides(), p.k_strides());
        let s_exact: Vec<f64> = (0..rows)
            .into_par_iter()
            .flat_map_iter(|r| {
                let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
                let (qo, kvh) = (qs.offset(b, h, i), p.kv_head_of(h));
                let (q, k) = (&q, &k);
                (0..n).map(move |j| {
                    let ko = ks.offset(b, kvh, j);
                    (0..d).map(|c| q[qo + c] as f64 * k[ko + c] as f64).sum::<f64>() * scale
                })
            })
            .collect();
        // The codec's INT8 Q and smoothed K, `softmax_scale · log2 e` folded into Q's scales.
        let int8_scores = |granularity| -> Result<Vec<f64>, quattn::Error> {
            let layout = Int8ScaleLayout::new(&p, granularity, Blocking::default().int8())?;
            let qt = int8::quantize_q(&p, &layout, &q, p.softmax_scale() * std::f32::consts::LOG2_E)?;
            let kt = int8::quantize_k(&p, &layout, &int8::smooth_k(&p, &k)?.values)?;
            Ok((0..rows)
                .into_par_iter()
                .flat_map_iter(|r| {
                    let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
                    let (qo, kvh) = (qs.offset(b, h, i), p.kv_head_of(h));
                    let qsc = qt.scales[layout.q_scale_index(b, h, i)];
                    let (qt, kt, layout) = (&qt, &kt, &layout);
                    (0..n).map(move |j| {
                        let ko = ks.offset(b, kvh, j);
                        let dot: i32 = (0..d).map(|c| qt.codes[qo + c] as i32 * kt.codes[ko + c] as i32).sum();
                        dot as f64 * (qsc * kt.scales[layout.k_scale_index(b, kvh, j)]) as f64
                    })
                })
                .collect())
        };
        let s_int8 = int8_scores(Int8Granularity::PerBlock)?;
        let s_int8_thread = int8_scores(Int8Granularity::PerThread)?;
        Ok(Case { p, q, k, v, reference, s_exact, s_int8, s_int8_thread })
    }

    /// V as the P·V product sees it (dequantized, f64, problem layout), the second term of a
    /// split V (same layout), and the mean to add back to O.
    fn values(&self, mode: V) -> (Vec<f64>, Option<Vec<f64>>, Vec<f64>) {
        let p = &self.p;
        let (dv, n, st) = (p.v_head_dim, p.kv_len, p.v_strides());
        let groups = p.batch * p.kv_heads;
        let mut mean = vec![0.0f64; groups * dv];
        let mut x: Vec<f64> = self.v.iter().map(|&a| a as f64).collect();
        let idx = |g: usize, j: usize| st.offset(g / p.kv_heads, g % p.kv_heads, j);
        if mode == V::ChannelSmoothed {
            for g in 0..groups {
                for c in 0..dv {
                    let m = (0..n).map(|j| x[idx(g, j) + c]).sum::<f64>() / n as f64;
                    mean[g * dv + c] = m;
                    (0..n).for_each(|j| x[idx(g, j) + c] -= m);
                }
            }
        }
        // E4M3 of `y` with one scale `amax / 448` per channel (`per_channel`) or per head, over
        // all keys or per `block` keys; with `residual` also the second term, the E4M3 code of
        // `y / s − code` under the same scale `s` (so both terms feed one accumulator).
        let quantize2 = |y: &[f64], block: Option<usize>, per_channel: bool, residual: bool| -> (Vec<f64>, Vec<f64>) {
            let mut out = y.to_vec();
            let mut res = vec![0.0f64; y.len()];
            for g in 0..groups {
                let key_blocks = block.map_or(1, |bk| n.div_ceil(bk));
                for kb in 0..key_blocks {
                    let keys = block.map_or(0..n, |bk| kb * bk..((kb + 1) * bk).min(n));
                    let chans: Vec<Vec<usize>> = if per_channel { (0..dv).map(|c| vec![c]).collect() } else { vec![(0..dv).collect()] };
                    for cs in chans {
                        let amax = keys.clone().flat_map(|j| cs.iter().map(move |&c| (j, c))).fold(0.0f64, |m, (j, c)| m.max(y[idx(g, j) + c].abs()));
                        let s = if amax > 0.0 { amax / 448.0 } else { 1.0 };
                        for j in keys.clone() {
                            for &c in &cs {
                                let o = idx(g, j) + c;
                                let hi = e4m3_rn(y[o] / s);
                                out[o] = hi * s;
                                if residual {
                                    res[o] = e4m3_rn(y[o] / s - hi) * s;
                                }
                            }
                        }
                    }
                }
            }
            (out, res)
        };
        let quantize = |y: &[f64], block, per_channel| quantize2(y, block, per_channel, false).0;
        let (v, lo) = match mode {
            V::Exact => (x, None),
            V::Channel | V::ChannelSmoothed => (quantize(&x, None, true), None),
            V::Block => (quantize(&x, Some(BLOCK_K), true), None),
            V::Head => (quantize(&x, None, false), None),
            V::Split => {
                let (hi, lo) = quantize2(&x, None, true, true);
                (hi, Some(lo))
            }
        };
        (v, lo, mean)
    }

    /// O (problem layout) of one configuration.
    fn run(&self, c: &Config) -> Vec<f64> {
        let p = &self.p;
        let (dv, n) = (p.v_head_dim, p.kv_len);
        let (v, v_lo, mean) = self.values(c.v);
        let s_all = match c.qk {
            Qk::Exact => &self.s_exact,
            Qk::Int8 => &self.s_int8,
            Qk::Int8Thread => &self.s_int8_thread,
        };
        let (vs, os) = (p.v_strides(), p.o_strides());
        let rows = p.batch * p.q_heads * p.q_len;
        let out: Vec<Vec<f64>> = (0..rows)
            .into_par_iter()
            .map(|r| {
                let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
                let kvh = p.kv_head_of(h);
                let s = &s_all[r * n..][..n];
                let visible = p.visible_keys(i);
                if visible == 0 {
                    return vec![0.0; dv]; // the reference's O of a row that sees no key
                }
                let vrow = |j: usize| &v[vs.offset(b, kvh, j)..][..dv];
                let vlo = |j: usize| v_lo.as_ref().map(|x| &x[vs.offset(b, kvh, j)..][..dv]);
                let (mut m, mut l) = (f64::NEG_INFINITY, 0.0f64);
                let mut acc = vec![0.0f64; dv];
                let mut err = vec![0.0f64; dv]; // Σ (p̂ − p) v̂ for the shaped P
                for k0 in (0..visible).step_by(BLOCK_K) {
                    let keys = k0..(k0 + BLOCK_K).min(visible);
                    let m_tile = keys.clone().fold(f64::NEG_INFINITY, |a, j| a.max(s[j]));
                    let m_new = m.max(m_tile);
                    let alpha = if m == f64::NEG_INFINITY { 0.0 } else { (m - m_new).exp2() };
                    l *= alpha;
                    acc.iter_mut().for_each(|a| *a *= alpha);
                    err.iter_mut().for_each(|a| *a *= alpha);
                    for j in keys {
                        let pj = (s[j] - m_new).exp2();
                        let vj = vrow(j);
                        let pr = match c.p {
                            P::Exact => pj,
                            P::F16 => round_f16(pj as f32) as f64,
                            P::E4m3 { lag } => {
                                let f = 448.0 * (-lag as f64).exp2();
                                e4m3_rn(pj * f) / f
                            }
                            P::E4m3Tile => e4m3_rn((s[j] - m_tile).exp2() * 448.0) / 448.0 * (m_tile - m_new).exp2(),
                            P::E4m3Split => e4m3_rn(pj * 448.0) / 448.0,
                            P::E4m3Shaped => {
                                let (lo, hi) = e4m3_neighbours(pj * 448.0);
                                let (vv, ev) = vj.iter().zip(&err).fold((0.0, 0.0), |(a, b), (&x, &e)| (a + x * x, b + e * x));
                                let cost = |q: f64| {
                                    let d = q / 448.0 - pj;
                                    d * d * vv + 2.0 * d * ev
                                };
                                let q = if cost(lo) <= cost(hi) { lo } else { hi } / 448.0;
                                err.iter_mut().zip(vj).for_each(|(e, &x)| *e += (q - pj) * x);
                                q
                            }
                        };
                        // The second P term of a split P: `e4m3(448 p − hi)` in the same units.
                        let pr_lo = if c.p == P::E4m3Split { e4m3_rn(pj * 448.0 - pr * 448.0) / 448.0 } else { 0.0 };
                        l += if c.l_rounded { pr + pr_lo } else { pj };
                        // P_hi·V_hi + P_hi·V_lo + P_lo·V_hi (P_lo·V_lo, 2^-8 of the product, dropped).
                        acc.iter_mut().zip(vj).for_each(|(a, &x)| *a += (pr + pr_lo) * x);
                        if let Some(lo) = vlo(j) {
                            acc.iter_mut().zip(lo).for_each(|(a, &x)| *a += pr * x);
                        }
                    }
                    m = m_new;
                }
                let mu = &mean[(b * p.kv_heads + kvh) * dv..][..dv];
                acc.iter().zip(mu).map(|(a, mu)| a / l + mu).collect()
            })
            .collect();
        let mut o = vec![0.0f64; p.o_len_elems()];
        for (r, row) in out.into_iter().enumerate() {
            let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
            o[os.offset(b, h, i)..][..dv].copy_from_slice(&row);
        }
        o
    }

    /// κ, ρ_P, ρ_V of the analytic model (module docs) for exact scores, mode's P and V.
    fn model(&self) -> (f64, f64, f64) {
        let p = &self.p;
        let (dv, n) = (p.v_head_dim, p.kv_len);
        let (vq, _, _) = self.values(V::Channel);
        let v: Vec<f64> = self.v.iter().map(|&a| a as f64).collect();
        let vs = p.v_strides();
        let rows = p.batch * p.q_heads * p.q_len;
        // Per row: Σ_c Σ_j w² v², Σ_c O², Σ_j w² η², Σ_j w².
        let sums: Vec<[f64; 4]> = (0..rows)
            .into_par_iter()
            .map(|r| {
                let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
                let kvh = p.kv_head_of(h);
                let s = &self.s_exact[r * n..][..p.visible_keys(i)];
                let m = s.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
                let e: Vec<f64> = s.iter().map(|&x| (x - m).exp2()).collect();
                let l: f64 = e.iter().sum();
                let mut o = vec![0.0; dv];
                let (mut wv, mut w2eta2, mut w2) = (0.0, 0.0, 0.0);
                for (j, &pj) in e.iter().enumerate() {
                    let w = pj / l;
                    let row = &v[vs.offset(b, kvh, j)..][..dv];
                    o.iter_mut().zip(row).for_each(|(a, &x)| *a += w * x);
                    wv += w * w * row.iter().map(|x| x * x).sum::<f64>();
                    let eta = e4m3_rn(pj * 448.0) / (pj * 448.0) - 1.0;
                    if pj * 448.0 > 0.0 {
                        w2eta2 += w * w * eta * eta;
                    }
                    w2 += w * w;
                }
                [wv, o.iter().map(|x| x * x).sum(), w2eta2, w2]
            })
            .collect();
        let t = sums.iter().fold([0.0; 4], |a, x| [a[0] + x[0], a[1] + x[1], a[2] + x[2], a[3] + x[3]]);
        let (mut dv2, mut v2) = (0.0, 0.0);
        for g in 0..p.batch * p.kv_heads {
            for j in 0..n {
                let o = vs.offset(g / p.kv_heads, g % p.kv_heads, j);
                for c in 0..dv {
                    dv2 += (vq[o + c] - v[o + c]).powi(2);
                    v2 += v[o + c].powi(2);
                }
            }
        }
        ((t[0] / t[1]).sqrt(), (t[2] / t[3]).sqrt(), (dv2 / v2).sqrt())
    }
}

fn main() -> Result<(), quattn::Error> {
    let seed = |p: &AttentionProblem| 0x5e1f ^ (p.q_len as u64 * 131 + p.head_dim as u64);
    // `quattn selftest --quick`'s shapes (demos/src/selftest.rs) without the paged one.
    let quick = [
        AttentionProblem::new(1, 2, 1, 64).kv_len(77),
        AttentionProblem::new(1, 8, 17, 64).kv_heads(2).kv_len(45).causal(true),
        AttentionProblem::new(2, 4, 127, 32).causal(true).layout(Layout::Bshd),
        AttentionProblem::new(1, 2, 300, 128).kv_len(200).causal(true),
        AttentionProblem::new(1, 2, 64, 96).kv_len(130),
        AttentionProblem::new(1, 1, 33, 256).kv_len(65).layout(Layout::Bshd),
        AttentionProblem::new(2, 8, 3, 128).kv_heads(2).kv_len(1500).causal(true).layout(Layout::Bshd),
    ];
    let mut cases: Vec<(String, Case)> = Vec::new();
    for p in quick {
        let name = format!("b{} h{}/{} q{} kv{} d{}{}", p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, if p.causal { " causal" } else { "" });
        let s = seed(&p);
        cases.push((name, Case::new(p, s)?));
    }
    let n_quick = cases.len();
    for s in 1..=3u64 {
        cases.push((format!("bulk b1 h8 s1024 d128 seed {s}"), Case::new(AttentionProblem::new(1, 8, 1024, 128), s)?));
    }

    println!("analytic model per case: rel-L2 ≈ κ·sqrt(ρ_P² + ρ_V²), exact Q·K (module docs)");
    println!("{:<34} {:>6} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}", "case", "κ", "ρ_P", "ρ_V", "pred (a)", "meas (a)", "pred (b)", "meas (b)", "pred (c)");
    let mut meas: Vec<Vec<ErrorMetrics>> = Vec::new();
    for (name, case) in &cases {
        let m: Vec<ErrorMetrics> = CONFIGS.iter().map(|c| ErrorMetrics::compare(&case.run(c), &case.reference)).collect();
        let (kappa, rp, rv) = case.model();
        println!(
            "{:<34} {:>6.3} {:>7.4} {:>7.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4} (meas (c) {:.4})",
            name, kappa, rp, rv, kappa * rp, m[0].rel_l2, kappa * rv, m[1].rel_l2, kappa * rp.hypot(rv), m[2].rel_l2
        );
        meas.push(m);
    }

    // The mode's own CPU emulation on the same inputs, as a cross-check of (e).
    let mode = Precision::Int8Qk { granularity: Int8Granularity::PerBlock, smooth_k: true, pv: PvFormat::Fp8 };
    let emu: Vec<ErrorMetrics> = cases
        .iter()
        .map(|(_, c)| {
            let o = emulate(&c.p, mode, &Blocking::default(), &c.q, &c.k, &c.v).expect("emulation");
            ErrorMetrics::compare(&o.o, &c.reference)
        })
        .collect();

    let summary = |name: &str, ms: &[ErrorMetrics]| {
        let q = &ms[..n_quick];
        let worst_cos = q.iter().map(|m| m.cos_sim).fold(f64::INFINITY, f64::min);
        let worst_rel = q.iter().map(|m| m.rel_l2).fold(0.0, f64::max);
        let mean_cos = q.iter().map(|m| m.cos_sim).sum::<f64>() / q.len() as f64;
        let mean_rel = q.iter().map(|m| m.rel_l2).sum::<f64>() / q.len() as f64;
        let b = &ms[n_quick..];
        let bulk_cos = b.iter().map(|m| m.cos_sim).sum::<f64>() / b.len() as f64;
        let bulk_rel = b.iter().map(|m| m.rel_l2).sum::<f64>() / b.len() as f64;
        println!(
            "{:<30} {:>10.6} {:>9.4} {:>10.6} {:>9.4} {:>10.6} {:>9.4}",
            name, worst_cos, worst_rel, mean_cos, mean_rel, bulk_cos, bulk_rel
        );
    };
    println!();
    println!("over the {n_quick} selftest cases (worst, mean) and the bulk shape (mean of 3 seeds); target cos ≥ 0.9995");
    println!("{:<30} {:>10} {:>9} {:>10} {:>9} {:>10} {:>9}", "configuration", "worst cos", "worst rel", "mean cos", "mean rel", "bulk cos", "bulk rel");
    for (i, c) in CONFIGS.iter().enumerate() {
        let col: Vec<ErrorMetrics> = meas.iter().map(|m| m[i]).collect();
        summary(c.name, &col);
    }
    summary("    emulate(int8-block-pvfp8)", &emu);
    println!();
    println!("per case cos-sim (columns: the cases above in order)");
    for (i, c) in CONFIGS.iter().enumerate() {
        let row: Vec<String> = meas.iter().map(|m| format!("{:.5}", m[i].cos_sim)).collect();
        println!("{:<30} {}", c.name, row.join(" "));
    }
    let row: Vec<String> = emu.iter().map(|m| format!("{:.5}", m.cos_sim)).collect();
    println!("{:<30} {}", "    emulate(int8-block-pvfp8)", row.join(" "));
    Ok(())
}
