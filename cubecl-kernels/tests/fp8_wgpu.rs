//! The FP8 kernel on wgpu (llvmpipe on machines without a GPU): FP8 codes from a test-local
//! encoder, descales per tensor / head / block, against an f64 reference on the decoded values
//! times their descales, with error bounds derived below. Shapes are small: llvmpipe on two
//! cores is slow.
#![cfg(feature = "wgpu")]

mod common;

use common::{download, upload, wgpu_client, Layout};
use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::wgpu::WgpuRuntime;
use quattn_core::Strides;
use quattn_cubecl::{
    launch, launch_fp8, select_fp8, AttentionShape, DescaleGranularity, Dtype, Fp8Format, Fp8Tiles, Fp8Tiling, FmaVecTiles,
    LaunchError, LaunchInfo, PortableKernel,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

type Client = ComputeClient<WgpuRuntime>;

// ---- A bit-exact OCP FP8 codec, independent of the crate's ----

fn mantissa_bits(format: Fp8Format) -> u32 {
    match format {
        Fp8Format::E4M3 => 3,
        Fp8Format::E5M2 => 2,
    }
}

fn bias(format: Fp8Format) -> i32 {
    match format {
        Fp8Format::E4M3 => 7,
        Fp8Format::E5M2 => 15,
    }
}

/// The value of `code`: NaN for e4m3 `S.1111.111` and e5m2 `S.11111.{01,10,11}`, ±inf for e5m2
/// `S.11111.00`.
fn decode(format: Fp8Format, code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let mb = mantissa_bits(format);
    let e = ((code & 0x7f) >> mb) as i32;
    let m = (code & ((1 << mb) - 1)) as f64;
    match format {
        Fp8Format::E4M3 if code & 0x7f == 0x7f => return f64::NAN,
        Fp8Format::E5M2 if e == 31 => return if m == 0.0 { sign * f64::INFINITY } else { f64::NAN },
        _ => {}
    }
    if e == 0 {
        sign * m * 2f64.powi(1 - bias(format) - mb as i32)
    } else {
        sign * (1.0 + m / (1 << mb) as f64) * 2f64.powi(e - bias(format))
    }
}

fn is_finite_code(format: Fp8Format, code: u8) -> bool {
    decode(format, code).is_finite()
}

/// The largest finite magnitude code.
fn max_code(format: Fp8Format) -> u8 {
    match format {
        Fp8Format::E4M3 => 0x7e,
        Fp8Format::E5M2 => 0x7b,
    }
}

/// Round to nearest, ties to the even code, saturating at the largest finite value.
fn encode(format: Fp8Format, x: f64) -> u8 {
    let a = x.abs();
    let mut best = 0u8;
    let mut best_err = f64::INFINITY;
    for c in 0..=max_code(format) {
        let err = (decode(format, c) - a).abs();
        if err < best_err || (err == best_err && c & 1 == 0) {
            best = c;
            best_err = err;
        }
    }
    best | if x < 0.0 { 0x80 } else { 0 }
}

#[test]
fn test_codec_by_hand() {
    use Fp8Format::*;
    assert_eq!(decode(E4M3, 0x7e), 448.0);
    assert_eq!(decode(E4M3, 0x01), 2f64.powi(-9));
    assert_eq!(decode(E4M3, 0x08), 2f64.powi(-6));
    assert_eq!(decode(E4M3, 0xb9), -1.125 * 2f64.powi(0));
    assert!(decode(E4M3, 0xff).is_nan());
    assert_eq!(decode(E5M2, 0x7b), 57344.0);
    assert_eq!(decode(E5M2, 0x01), 2f64.powi(-16));
    assert_eq!(decode(E5M2, 0x04), 2f64.powi(-14));
    assert_eq!(decode(E5M2, 0xfc), f64::NEG_INFINITY);
    assert!(decode(E5M2, 0x7d).is_nan());
    // Ties to even: 1.0625 lies between 1.0 (0x38, even) and 1.125 (0x39).
    assert_eq!(encode(E4M3, 1.0625), 0x38);
    assert_eq!(encode(E4M3, 1.1875), 0x3a);
    assert_eq!(encode(E4M3, 1e9), 0x7e);
    assert_eq!(encode(E5M2, -1e9), 0xfb);
    for format in [E4M3, E5M2] {
        for c in 0..=255u8 {
            if is_finite_code(format, c) && c != 0x80 {
                assert_eq!(encode(format, decode(format, c)), c, "{format} {c:#x}");
            }
        }
    }
}

// ---- Problems ----

#[derive(Debug, Clone, Copy)]
struct Fp8Case {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    head_dim: usize,
    causal: bool,
    layout: Layout,
    format: Fp8Format,
    granularity: DescaleGranularity,
    o: Dtype,
    seed: u64,
}

impl Fp8Case {
    fn new(q_len: usize, kv_len: usize, head_dim: usize, causal: bool, format: Fp8Format, granularity: DescaleGranularity, o: Dtype) -> Self {
        Fp8Case {
            batch: 1,
            q_heads: 2,
            kv_heads: 1,
            q_len,
            kv_len,
            head_dim,
            causal,
            layout: Layout::Bhsd,
            format,
            granularity,
            o,
            seed: 0xf8 ^ (q_len as u64) << 8 ^ (kv_len as u64) << 24 ^ head_dim as u64,
        }
    }

    fn shape(&self) -> AttentionShape {
        let (l, d) = (self.layout, self.head_dim);
        AttentionShape {
            batch: self.batch,
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            q_len: self.q_len,
            kv_len: self.kv_len,
            head_dim: d,
            v_head_dim: d,
            causal: self.causal,
            scale: 1.0 / (d as f32).sqrt(),
            q: common::strides(l, self.q_heads, self.q_len, d),
            k: common::strides(l, self.kv_heads, self.kv_len, d),
            v: common::strides(l, self.kv_heads, self.kv_len, d),
            o: common::strides(l, self.q_heads, self.q_len, d),
            write_lse: true,
        }
    }
}

/// One FP8 tensor: codes in logical `[batch, heads, len, dim]` order, descales in the layout of
/// `DescaleGranularity::count`.
#[derive(Clone)]
struct Fp8Host {
    dims: [usize; 4],
    codes: Vec<u8>,
    descales: Vec<f32>,
    granularity: DescaleGranularity,
    block_rows: usize,
}

impl Fp8Host {
    fn descale_index(&self, b: usize, h: usize, row: usize) -> usize {
        let [_, heads, len, _] = self.dims;
        match self.granularity {
            DescaleGranularity::PerTensor => 0,
            DescaleGranularity::PerHead => b * heads + h,
            DescaleGranularity::PerBlock => (b * heads + h) * len.div_ceil(self.block_rows) + row / self.block_rows,
        }
    }

    /// Random values with ~0.5% outliers of magnitude 6..10, scaled by a factor that depends on
    /// the descale group (so that a wrong descale index shows), quantized with the recipe of
    /// the facade: `descale = amax / max_finite` per group, codes `encode(x / descale)`.
    fn random(rng: &mut StdRng, format: Fp8Format, dims: [usize; 4], granularity: DescaleGranularity, block_rows: usize) -> Self {
        let [bn, hn, sn, dn] = dims;
        let mut t = Fp8Host { dims, codes: vec![0; bn * hn * sn * dn], descales: vec![], granularity, block_rows };
        let groups = granularity.count(bn, hn, sn, block_rows).max(1);
        let mut x = vec![0.0f64; t.codes.len()];
        let mut amax = vec![0.0f64; groups];
        for b in 0..bn {
            for h in 0..hn {
                for s in 0..sn {
                    let g = t.descale_index(b, h, s);
                    let factor = 0.5 * (1 + (b + 2 * h + 3 * (s / block_rows)) % 4) as f64;
                    for d in 0..dn {
                        let mut v: f64 = rng.sample(StandardNormal);
                        if rng.random::<f64>() < 0.005 {
                            v = v.signum() * rng.random_range(6.0..10.0);
                        }
                        let i = ((b * hn + h) * sn + s) * dn + d;
                        x[i] = v * factor;
                        amax[g] = amax[g].max(x[i].abs());
                    }
                }
            }
        }
        let max = decode(format, max_code(format));
        t.descales = amax.iter().map(|&a| if a > 0.0 { (a / max) as f32 } else { 1.0 }).collect();
        for b in 0..bn {
            for h in 0..hn {
                for s in 0..sn {
                    let ds = t.descales[t.descale_index(b, h, s)] as f64;
                    for d in 0..dn {
                        let i = ((b * hn + h) * sn + s) * dn + d;
                        t.codes[i] = encode(format, x[i] / ds);
                    }
                }
            }
        }
        t
    }

    fn code(&self, b: usize, h: usize, s: usize, d: usize) -> u8 {
        let [_, hn, sn, dn] = self.dims;
        self.codes[((b * hn + h) * sn + s) * dn + d]
    }

    fn set(&mut self, b: usize, h: usize, s: usize, d: usize, code: u8) {
        let [_, hn, sn, dn] = self.dims;
        self.codes[((b * hn + h) * sn + s) * dn + d] = code;
    }

    /// `decode(code) · descale`, exact in f64; non-finite codes as `None`.
    fn value(&self, format: Fp8Format, b: usize, h: usize, s: usize, d: usize) -> Option<f64> {
        let x = decode(format, self.code(b, h, s, d));
        x.is_finite().then(|| x * self.descales[self.descale_index(b, h, s)] as f64)
    }

    fn row_is_finite(&self, format: Fp8Format, b: usize, h: usize, s: usize) -> bool {
        (0..self.dims[3]).all(|d| is_finite_code(format, self.code(b, h, s, d)))
    }

    /// The codes at their strided offsets, in a buffer of the extent padded to whole words (at
    /// least one).
    fn upload(&self, client: &Client, st: Strides) -> Handle {
        let [bn, hn, sn, dn] = self.dims;
        let len = st.extent(bn, hn, sn, dn).unwrap().max(4).next_multiple_of(4);
        let mut bytes = vec![0u8; len];
        for b in 0..bn {
            for h in 0..hn {
                for s in 0..sn {
                    for d in 0..dn {
                        bytes[st.offset(b, h, s) + d] = self.code(b, h, s, d);
                    }
                }
            }
        }
        client.create_from_slice(&bytes)
    }

    fn upload_descales(&self, client: &Client) -> Handle {
        client.create_from_slice(f32::as_bytes(&self.descales))
    }
}

struct Inputs {
    q: Fp8Host,
    k: Fp8Host,
    v: Fp8Host,
}

fn random_inputs(case: &Fp8Case, tiles: &Fp8Tiles) -> Inputs {
    let (bq, bk) = tiles.descale_blocks();
    let mut rng = StdRng::seed_from_u64(case.seed);
    let (b, hq, hk, d) = (case.batch, case.q_heads, case.kv_heads, case.head_dim);
    Inputs {
        q: Fp8Host::random(&mut rng, case.format, [b, hq, case.q_len, d], case.granularity, bq),
        k: Fp8Host::random(&mut rng, case.format, [b, hk, case.kv_len, d], case.granularity, bk),
        v: Fp8Host::random(&mut rng, case.format, [b, hk, case.kv_len, d], case.granularity, bk),
    }
}

// ---- Reference and error bounds ----

/// Unit roundoff of f32.
const U32: f64 = 1.0 / 16_777_216.0;

/// What the f64 reference knows about one row: O, LSE, and the terms of the error bounds.
struct RowRef {
    /// The row sees no key (O = 0, LSE = -inf).
    empty: bool,
    /// The row sees a non-finite code (NaN expected).
    poisoned: bool,
    o: Vec<f64>,
    lse: f64,
    /// `A_c = Σ_j p_j |v_jc| / l`: the scale of every relative error on P.
    a: Vec<f64>,
    /// `B_c = Σ_j p_j² v_jc² / l²`: the variance scale of independent errors on P.
    b: Vec<f64>,
    /// `Σ_j |v_jc|` over the visible keys.
    s1: Vec<f64>,
    /// Relative error of any one p_j from f32 arithmetic before the f16 rounding (see `bounds`).
    p_rel: f64,
    lse_abs: f64,
}

/// Attention in f64 on `decode(code) · descale`, two-pass, plus the error bound terms.
///
/// Error model of the kernel against this reference, per O element of row i, column c:
/// - P rounded to f16: each p_j gets a relative error |δ_j| ≤ 2^-10 (WGSL only promises one of
///   the two neighbours; round-to-nearest-even, as CUDA and llvmpipe do, halves it), in the
///   subnormal range (p < 2^-14, relative to the running max, l ≥ 1) an absolute error of
///   2^-24. P·V then errs by at most `2^-10·A_c + 2^-24·S1_c`; l takes the unrounded p.
/// - f32 before the rounding, as a relative error on each p_j (`p_rel`): the dot of d exact
///   products summed in f32 and folded with two descales and the softmax scale (≤ (d + 4)·u32
///   of `scale·Σ|q k|`, twice for the score and the max it is compared with), exp (WGSL: 3 +
///   2|x| ulp), the f32 accumulation of n terms in l and in P·V (≤ (n + 4)·u32 each). A
///   relative error ε on every p moves O by ≤ 2ε·A_c.
/// - O's own rounding: 2^-10 |O| for f16 (+2^-24 subnormal), nothing beyond f32 for f32.
fn reference(case: &Fp8Case, inp: &Inputs) -> Vec<RowRef> {
    let (f, d, scale) = (case.format, case.head_dim, case.shape().scale as f64);
    let group = case.q_heads / case.kv_heads;
    let mut rows = Vec::new();
    for b in 0..case.batch {
        for h in 0..case.q_heads {
            let kh = h / group;
            for i in 0..case.q_len {
                let n = if case.causal {
                    (i as i64 + case.kv_len as i64 - case.q_len as i64 + 1).clamp(0, case.kv_len as i64) as usize
                } else {
                    case.kv_len
                };
                let zero = |x: Option<f64>| x.unwrap_or(0.0);
                let poisoned = n > 0
                    && (!inp.q.row_is_finite(f, b, h, i)
                        || (0..n).any(|j| !inp.k.row_is_finite(f, b, kh, j) || !inp.v.row_is_finite(f, b, kh, j)));
                let mut row = RowRef {
                    empty: n == 0,
                    poisoned,
                    o: vec![0.0; d],
                    lse: f64::NEG_INFINITY,
                    a: vec![0.0; d],
                    b: vec![0.0; d],
                    s1: vec![0.0; d],
                    p_rel: 0.0,
                    lse_abs: 0.0,
                };
                if n == 0 {
                    rows.push(row);
                    continue;
                }
                let mut s = vec![0.0; n];
                let mut dot_err: f64 = 0.0;
                for (j, sj) in s.iter_mut().enumerate() {
                    let (mut dot, mut abs) = (0.0, 0.0);
                    for x in 0..d {
                        let p = zero(inp.q.value(f, b, h, i, x)) * zero(inp.k.value(f, b, kh, j, x));
                        dot += p;
                        abs += p.abs();
                    }
                    *sj = scale * dot;
                    dot_err = dot_err.max((d + 4) as f64 * U32 * scale * abs);
                }
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = p.iter().sum();
                // exp's argument error is at most the largest exponent that still matters.
                let x_max = s.iter().zip(&p).filter(|(_, &p)| p > U32).map(|(x, _)| m - x).fold(0.0, f64::max);
                let exp_err = (3.0 + 2.0 * x_max) * U32;
                let acc_err = (n + 4) as f64 * U32;
                row.p_rel = 2.0 * dot_err + exp_err + 2.0 * acc_err;
                for c in 0..d {
                    for (j, &pj) in p.iter().enumerate() {
                        let vj = zero(inp.v.value(f, b, kh, j, c));
                        row.o[c] += pj * vj / l;
                        row.a[c] += pj * vj.abs() / l;
                        row.b[c] += (pj * vj / l).powi(2);
                        row.s1[c] += vj.abs();
                    }
                }
                row.lse = m + l.ln();
                // LSE: the score and exp errors (as on l), f32 rounding of m·scale, ln (3 ulp,
                // or 2^-21 absolute near 1) and the final add.
                row.lse_abs = 2.0 * dot_err + exp_err + acc_err + 3.0 * U32 * (m.abs() + row.lse.abs() + 2.0 * l.ln().abs())
                    + 2f64.powi(-21);
                rows.push(row);
            }
        }
    }
    rows
}

/// Measured errors of one run, and the bounds they were held to.
#[derive(Debug)]
struct Outcome {
    info: LaunchInfo,
    rel_l2: f64,
    rel_l2_bound: f64,
    /// max over elements of |error| / bound (≤ 1 passes).
    worst_ratio: f64,
    lse_worst_ratio: f64,
    poisoned_rows: usize,
}

fn run(client: &Client, case: &Fp8Case, inject: impl Fn(&mut Inputs)) -> Result<Outcome, LaunchError> {
    let shape = case.shape();
    let kernel = select_fp8(client, &shape, case.o, case.format, case.granularity)?;
    let PortableKernel::Fp8(tiles) = kernel else { panic!("select_fp8 chose {kernel:?}") };
    let mut inp = random_inputs(case, &tiles);
    inject(&mut inp);

    let (q, k, v) = (inp.q.upload(client, shape.q), inp.k.upload(client, shape.k), inp.v.upload(client, shape.v));
    let (qd, kd, vd) = (inp.q.upload_descales(client), inp.k.upload_descales(client), inp.v.upload_descales(client));
    let o_len = shape.o.extent(case.batch, case.q_heads, case.q_len, case.head_dim).unwrap().max(4);
    let o = upload(client, case.o, &vec![f64::NAN; o_len]);
    let lse = upload(client, Dtype::F32, &vec![f64::NAN; (case.batch * case.q_heads * case.q_len).max(1)]);
    let info = launch_fp8(client, &kernel, &shape, case.o, &q, &k, &v, &qd, &kd, &vd, &o, Some(&lse))?;
    let o_got = download(client, case.o, o);
    let lse_got = download(client, Dtype::F32, lse);

    let rows = reference(case, &inp);
    let (u_o, o_sub) = match case.o {
        Dtype::F32 => (0.0, 0.0),
        _ => (2f64.powi(-10), 2f64.powi(-24)),
    };
    let (mut err2, mut ref2, mut var, mut det2) = (0.0, 0.0, 0.0, 0.0);
    let (mut worst, mut lse_worst, mut poisoned) = (0.0f64, 0.0f64, 0);
    for bi in 0..case.batch {
        for h in 0..case.q_heads {
            for i in 0..case.q_len {
                let r = (bi * case.q_heads + h) * case.q_len + i;
                let row = &rows[r];
                let o_row = shape.o.offset(bi, h, i);
                let got_lse = lse_got[r];
                if row.poisoned {
                    poisoned += 1;
                    assert!(got_lse.is_nan(), "{case:?}: row {r} sees a non-finite code, LSE {got_lse}");
                    for c in 0..case.head_dim {
                        assert!(o_got[o_row + c].is_nan(), "{case:?}: row {r} sees a non-finite code, O[{c}] {}", o_got[o_row + c]);
                    }
                    continue;
                }
                if row.empty {
                    assert_eq!(got_lse, f64::NEG_INFINITY, "{case:?}: empty row {r}");
                    for c in 0..case.head_dim {
                        assert_eq!(o_got[o_row + c], 0.0, "{case:?}: empty row {r}");
                    }
                    continue;
                }
                assert!(got_lse.is_finite(), "{case:?}: row {r} LSE {got_lse}");
                lse_worst = lse_worst.max((got_lse - row.lse).abs() / row.lse_abs);
                for c in 0..case.head_dim {
                    let (got, want) = (o_got[o_row + c], row.o[c]);
                    assert!(got.is_finite(), "{case:?}: row {r} O[{c}] = {got} (unwritten or poisoned)");
                    let det = 2.0 * row.p_rel * row.a[c] + 2f64.powi(-24) * row.s1[c] + u_o * want.abs() + o_sub;
                    let bound = 2f64.powi(-10) * row.a[c] + det;
                    worst = worst.max((got - want).abs() / bound);
                    err2 += (got - want).powi(2);
                    ref2 += want * want;
                    var += row.b[c];
                    det2 += det * det;
                }
            }
        }
    }
    // rel-L2: the f16 rounding errors of P are independent and zero-mean under
    // round-to-nearest-even (|δ| ≤ 2^-11), so E‖err_P‖² ≤ 2^-22·ΣB; over thousands of elements
    // the sum concentrates, and 3x its root is far in the tail. The deterministic terms are
    // added in the worst case.
    let rel_l2_bound = (3.0 * 2f64.powi(-11) * var.sqrt() + det2.sqrt()) / ref2.sqrt().max(f64::MIN_POSITIVE);
    Ok(Outcome {
        info,
        rel_l2: if ref2 > 0.0 { (err2 / ref2).sqrt() } else { 0.0 },
        rel_l2_bound,
        worst_ratio: worst,
        lse_worst_ratio: lse_worst,
        poisoned_rows: poisoned,
    })
}

fn check(case: Fp8Case) -> Option<Outcome> {
    let client = wgpu_client()?;
    let out = run(&client, &case, |_| {}).expect("launch refused");
    println!("{case:?}\n  -> {out:?}");
    assert!(out.info.launched);
    assert!(out.info.kernel.starts_with(&format!("portable_fma_vec_fp8_{}_", case.format)), "{}", out.info.kernel);
    assert!(out.worst_ratio <= 1.0, "an O element beyond its bound: {out:?}");
    assert!(out.lse_worst_ratio <= 1.0, "an LSE beyond its bound: {out:?}");
    assert!(out.rel_l2 <= out.rel_l2_bound, "O rel-L2 beyond its bound: {out:?}");
    Some(out)
}

use DescaleGranularity::{PerBlock, PerHead, PerTensor};
use Fp8Format::{E4M3, E5M2};

#[test]
fn e4m3_per_tensor_d64_noncausal_o_f32() {
    check(Fp8Case::new(37, 77, 64, false, E4M3, PerTensor, Dtype::F32));
}

#[test]
fn e5m2_per_head_d128_causal_gqa_bshd_o_f16() {
    check(Fp8Case {
        q_heads: 4,
        kv_heads: 2,
        layout: Layout::Bshd,
        ..Fp8Case::new(45, 70, 128, true, E5M2, PerHead, Dtype::F16)
    });
}

#[test]
fn e4m3_per_block_d64_causal_q_longer_gqa_bshd_o_f16() {
    // Bottom-right alignment: the first rows see no key. Several Q blocks and KV tiles, so the
    // per-block descales of both are indexed.
    check(Fp8Case {
        batch: 2,
        q_heads: 4,
        kv_heads: 2,
        layout: Layout::Bshd,
        ..Fp8Case::new(100, 70, 64, true, E4M3, PerBlock, Dtype::F16)
    });
}

#[test]
fn e5m2_per_block_d128_noncausal_o_f32() {
    check(Fp8Case::new(33, 100, 128, false, E5M2, PerBlock, Dtype::F32));
}

#[test]
fn e4m3_per_head_d128_causal_kv_longer_o_f32() {
    check(Fp8Case { q_heads: 4, kv_heads: 2, ..Fp8Case::new(20, 90, 128, true, E4M3, PerHead, Dtype::F32) });
}

#[test]
fn e5m2_per_tensor_d64_causal_bshd_o_f16() {
    check(Fp8Case { layout: Layout::Bshd, ..Fp8Case::new(70, 70, 64, true, E5M2, PerTensor, Dtype::F16) });
}

#[test]
fn e4m3_per_block_no_keys() {
    // Every row sees nothing: O = 0, LSE = -inf; the K and V descale tensors have no entries.
    let out = check(Fp8Case::new(5, 0, 64, false, E4M3, PerBlock, Dtype::F16));
    assert!(out.is_none_or(|o| o.rel_l2 == 0.0));
    let Some(client) = wgpu_client() else { return };
    let shape = Fp8Case::new(5, 0, 64, false, E4M3, PerBlock, Dtype::F32).shape();
    let kernel = select_fp8(&client, &shape, Dtype::F32, E4M3, PerBlock).unwrap();
    let (codes, none) = (client.empty(2 * 5 * 64), client.empty(0));
    let (qd, o, lse) = (client.empty(8), client.empty(4 * 2 * 5 * 64), client.empty(4 * 10));
    let info = launch_fp8(&client, &kernel, &shape, Dtype::F32, &codes, &codes, &codes, &qd, &none, &none, &o, Some(&lse));
    assert!(info.unwrap().launched);
    assert!(download(&client, Dtype::F32, lse).iter().all(|&x| x == f64::NEG_INFINITY));
}

/// Every finite code through the kernel bit-exactly: Q all zero codes makes every score 0, so
/// with one key p = 1 exactly, l = 1, and O = (1 · v_descale) · decode(code) with a descale
/// whose products with the codes are exact (1.5). Non-finite codes are left out (0 in their
/// place): they poison the row, tested below.
#[test]
fn every_finite_code_decodes_bit_exactly() {
    let Some(client) = wgpu_client() else { return };
    for format in [E4M3, E5M2] {
        let case = Fp8Case { q_heads: 2, kv_heads: 2, ..Fp8Case::new(1, 1, 128, false, format, PerTensor, Dtype::F32) };
        let shape = case.shape();
        let kernel = select_fp8(&client, &shape, Dtype::F32, format, PerTensor).unwrap();
        let host = |dims: [usize; 4], codes: Vec<u8>, descale: f32| Fp8Host {
            dims,
            codes,
            descales: vec![descale],
            granularity: PerTensor,
            block_rows: 1,
        };
        let finite = |c: u8| if is_finite_code(format, c) { c } else { 0 };
        let q = host([1, 2, 1, 128], vec![0; 256], 0.75);
        let k = host([1, 2, 1, 128], (0..=255u8).map(finite).rev().collect(), 1.25);
        let v = host([1, 2, 1, 128], (0..=255u8).map(finite).collect(), 1.5);
        let o = upload(&client, Dtype::F32, &[f64::NAN; 256]);
        let lse = upload(&client, Dtype::F32, &[f64::NAN; 2]);
        launch_fp8(
            &client,
            &kernel,
            &shape,
            Dtype::F32,
            &q.upload(&client, shape.q),
            &k.upload(&client, shape.k),
            &v.upload(&client, shape.v),
            &q.upload_descales(&client),
            &k.upload_descales(&client),
            &v.upload_descales(&client),
            &o,
            Some(&lse),
        )
        .unwrap();
        let got = download(&client, Dtype::F32, o);
        for c in 0..=255u8 {
            let want = decode(format, finite(c)) * 1.5;
            assert_eq!(got[c as usize], want, "{format} code {c:#04x}");
        }
        assert_eq!(download(&client, Dtype::F32, lse), vec![0.0, 0.0]);
    }
}

/// Non-finite codes poison exactly the rows that see them: a NaN in K row j every query row that
/// sees key j (all rows of the KV head's query heads without a mask, rows i ≥ j with one), a
/// NaN in Q row i only O row i, a non-finite V code like a K one. The other rows stay finite
/// and within their bounds.
#[test]
fn non_finite_codes_poison_only_the_rows_that_see_them() {
    let Some(client) = wgpu_client() else { return };
    let base = Fp8Case { q_heads: 4, kv_heads: 2, ..Fp8Case::new(40, 40, 64, true, E4M3, PerBlock, Dtype::F16) };
    let nan_e4m3 = 0x7f;
    // (case, injection, expected poisoned rows: (batch, q head, row) → bool)
    type Inject = Box<dyn Fn(&mut Inputs)>;
    type Expect = Box<dyn Fn(usize, usize) -> bool>;
    let cases: Vec<(Fp8Case, Inject, Expect)> = vec![
        // K row 37 of KV head 1 (second tile, 32-key tiles), causal: q heads 2 and 3, rows ≥ 37.
        (base, Box::new(move |i: &mut Inputs| i.k.set(0, 1, 37, 5, nan_e4m3)), Box::new(|h, r| h >= 2 && r >= 37)),
        // The same without the mask: every row of q heads 2 and 3.
        (
            Fp8Case { causal: false, ..base },
            Box::new(move |i: &mut Inputs| i.k.set(0, 1, 37, 5, 0xff)),
            Box::new(|h, _| h >= 2),
        ),
        // Q row 5 of q head 0: that row only.
        (base, Box::new(move |i: &mut Inputs| i.q.set(0, 0, 5, 63, nan_e4m3)), Box::new(|h, r| h == 0 && r == 5)),
        // e5m2: -inf in V row 20 of KV head 0 and NaN in K row 3 of KV head 1.
        (
            Fp8Case { format: E5M2, o: Dtype::F32, ..base },
            Box::new(|i: &mut Inputs| {
                i.v.set(0, 0, 20, 17, 0xfc);
                i.k.set(0, 1, 3, 0, 0x7e);
            }),
            Box::new(|h, r| (h < 2 && r >= 20) || (h >= 2 && r >= 3)),
        ),
    ];
    for (case, inject, expect) in cases {
        let out = run(&client, &case, inject).expect("launch refused");
        println!("{case:?}\n  -> {out:?}");
        let want = (0..case.q_heads).flat_map(|h| (0..case.q_len).map(move |r| (h, r))).filter(|&(h, r)| expect(h, r)).count();
        // `run` asserted NaN on every row its reference marks; the count ties that marking to
        // the expectation spelled out here.
        assert_eq!(out.poisoned_rows, want, "{case:?}");
        assert!(out.worst_ratio <= 1.0 && out.lse_worst_ratio <= 1.0 && out.rel_l2 <= out.rel_l2_bound, "{out:?}");
    }
}

/// Refusals happen on the host, before anything is enqueued, and are typed.
#[test]
fn fp8_refusals() {
    let Some(client) = wgpu_client() else { return };
    let case = Fp8Case::new(16, 16, 64, false, E4M3, PerBlock, Dtype::F32);
    let shape = case.shape();
    let kernel = select_fp8(&client, &shape, Dtype::F32, E4M3, PerBlock).unwrap();
    let PortableKernel::Fp8(tiles) = kernel else { panic!("{kernel:?}") };
    // No manual MMA on wgpu: the FMA variant.
    let Fp8Tiling::Fma(fma_tiles) = tiles.tiles else { panic!("{kernel:?}") };
    assert_eq!(tiles.descale_blocks(), (fma_tiles.bq as usize, fma_tiles.bk as usize));
    assert_eq!(kernel.blocking().map(|b| (b.block_q, b.block_k)), Some(tiles.descale_blocks()));
    assert!(kernel.name().starts_with("portable_fma_vec_fp8_e4m3_block_bq"), "{}", kernel.name());
    assert!(kernel.kernel_name(Dtype::F16, 64, 64).starts_with("portable_fma_vec_fp8_e4m3_block_f16_d64_"));

    let codes = 2 * 16 * 64;
    let bytes = |n: usize| client.empty(n);
    let (q, k, v) = (bytes(codes), bytes(codes), bytes(codes));
    let ds = bytes(4 * 2);
    let o = bytes(4 * codes);
    let lse = bytes(4 * 32);
    let go = |shape: &AttentionShape, kernel: &PortableKernel, k: &Handle, qd: &Handle, o_dtype| {
        launch_fp8(&client, kernel, shape, o_dtype, &q, k, &v, qd, &ds, &ds, &o, None)
    };
    assert!(go(&shape_no_lse(&shape), &kernel, &k, &ds, Dtype::F32).unwrap().launched);

    // The wrong kernel kind, both ways.
    let fma = PortableKernel::Fma(fma_tiles);
    assert!(matches!(go(&shape_no_lse(&shape), &fma, &k, &ds, Dtype::F32), Err(LaunchError::WrongKernel { .. })));
    assert!(matches!(
        launch(&client, &kernel, &shape_no_lse(&shape), Dtype::F32, &q, &k, &v, &o, None),
        Err(LaunchError::WrongKernel { .. })
    ));

    // A head dim without tiles.
    let d80 = AttentionShape { head_dim: 80, v_head_dim: 80, ..shape_no_lse(&shape) };
    assert!(matches!(select_fp8(&client, &d80, Dtype::F32, E4M3, PerBlock), Err(LaunchError::UnsupportedHeadDim { .. })));
    assert!(matches!(go(&d80, &kernel, &k, &ds, Dtype::F32), Err(LaunchError::UnsupportedHeadDim { .. })));

    // A row start off a word: refused at selection and at launch.
    let mut unaligned = shape_no_lse(&shape);
    unaligned.k.seq = 66;
    unaligned.k.head = 66 * 16;
    unaligned.k.batch = 66 * 16;
    assert!(matches!(select_fp8(&client, &unaligned, Dtype::F32, E4M3, PerBlock), Err(LaunchError::UnalignedLayout { .. })));
    assert!(matches!(go(&unaligned, &kernel, &k, &ds, Dtype::F32), Err(LaunchError::UnalignedLayout { .. })));

    // Descales too few for the granularity: PerBlock Q needs [1, 2, ceil(16 / bq)] = 2 here,
    // PerHead would need 2 and PerTensor 1; one float is short for the first two.
    let one = bytes(4);
    assert!(matches!(
        go(&shape_no_lse(&shape), &kernel, &k, &one, Dtype::F32),
        Err(LaunchError::BufferTooSmall { tensor: "q descales", .. })
    ));
    let per_tensor = PortableKernel::Fp8(Fp8Tiles { granularity: PerTensor, ..tiles });
    assert!(launch_fp8(&client, &per_tensor, &shape_no_lse(&shape), Dtype::F32, &q, &k, &v, &one, &one, &one, &o, None).is_ok());
    let per_head = PortableKernel::Fp8(Fp8Tiles { granularity: PerHead, ..tiles });
    assert!(matches!(
        launch_fp8(&client, &per_head, &shape_no_lse(&shape), Dtype::F32, &q, &k, &v, &one, &one, &one, &o, None),
        Err(LaunchError::BufferTooSmall { tensor: "q descales", .. })
    ));
    // K and V: PerBlock over 40 keys is 2 tiles of 32 (one KV head).
    let longer = AttentionShape { kv_len: 40, k: shape.k, v: shape.v, ..shape_no_lse(&shape) };
    let (k40, v40) = (bytes(40 * 64), bytes(40 * 64));
    assert_eq!(tiles.tiles.bk(), 32);
    assert!(matches!(
        launch_fp8(&client, &kernel, &longer, Dtype::F32, &q, &k40, &v40, &ds, &one, &ds, &o, None),
        Err(LaunchError::BufferTooSmall { tensor: "k descales", .. })
    ));
    assert!(matches!(
        launch_fp8(&client, &kernel, &longer, Dtype::F32, &q, &k40, &v40, &ds, &ds, &one, &o, None),
        Err(LaunchError::BufferTooSmall { tensor: "v descales", .. })
    ));

    // Code buffers short of the strided extent (in bytes).
    let short = bytes(codes / 2 - 4);
    assert!(matches!(
        go(&shape_no_lse(&shape), &kernel, &short, &ds, Dtype::F32),
        Err(LaunchError::BufferTooSmall { tensor: "k codes", .. })
    ));
    // O is counted in its own type: f32 O needs 4 bytes per element.
    assert!(matches!(
        launch_fp8(&client, &kernel, &shape_no_lse(&shape), Dtype::F32, &q, &k, &v, &ds, &ds, &ds, &q, None),
        Err(LaunchError::BufferTooSmall { tensor: "o", .. })
    ));

    // An LSE buffer must come with write_lse, and the other way round.
    assert!(matches!(go(&shape, &kernel, &k, &ds, Dtype::F32), Err(LaunchError::InvalidProblem { .. })));
    assert!(launch_fp8(&client, &kernel, &shape, Dtype::F32, &q, &k, &v, &ds, &ds, &ds, &o, Some(&lse)).is_ok());

    // A hand-built tiling that cannot run is refused, not replaced.
    let huge = PortableKernel::Fp8(Fp8Tiles { tiles: Fp8Tiling::Fma(FmaVecTiles { bq: 256, bk: 256, tr: 16, tc: 8, stage_f32: true }), ..tiles });
    assert!(matches!(go(&shape_no_lse(&shape), &huge, &k, &ds, Dtype::F32), Err(LaunchError::SharedMemoryExceeded { .. })));

    // bf16 O where the adapter lacks bf16 (llvmpipe): refused by name.
    let bf16 = client.features().type_usage(cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16).into());
    if bf16.is_empty() {
        assert!(matches!(
            select_fp8(&client, &shape, Dtype::Bf16, E4M3, PerBlock),
            Err(LaunchError::UnsupportedDtype { dtype: Dtype::Bf16, .. })
        ));
        assert!(matches!(go(&shape_no_lse(&shape), &kernel, &k, &ds, Dtype::Bf16), Err(LaunchError::UnsupportedDtype { .. })));
    }
}

/// Descale values are the facade's to check (the kernel cannot without a read): NaN, ±inf, 0
/// and negative descales give whatever rows they give, but the launch runs and every output
/// is written (no NaN-poisoned slot left from before, except where the values make NaN).
#[test]
fn bad_descale_values_do_not_fault() {
    let Some(client) = wgpu_client() else { return };
    let case = Fp8Case { q_heads: 2, kv_heads: 1, ..Fp8Case::new(20, 40, 64, true, E4M3, PerHead, Dtype::F32) };
    let shape = case.shape();
    let kernel = select_fp8(&client, &shape, Dtype::F32, E4M3, PerHead).unwrap();
    let PortableKernel::Fp8(tiles) = kernel else { panic!("{kernel:?}") };
    let inp = random_inputs(&case, &tiles);
    let (q, k, v) = (inp.q.upload(&client, shape.q), inp.k.upload(&client, shape.k), inp.v.upload(&client, shape.v));
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -1.5] {
        let qd = client.create_from_slice(f32::as_bytes(&[bad, 0.5]));
        let kd = client.create_from_slice(f32::as_bytes(&[bad]));
        let o = client.create_from_slice(f32::as_bytes(&vec![7.0f32; 2 * 20 * 64]));
        let lse = client.create_from_slice(f32::as_bytes(&[7.0f32; 40]));
        launch_fp8(&client, &kernel, &shape, Dtype::F32, &q, &k, &v, &qd, &kd, &kd, &o, Some(&lse)).unwrap();
        let o = download(&client, Dtype::F32, o);
        let lse = download(&client, Dtype::F32, lse);
        // Every slot was overwritten: the sentinel 7 is not an attention output of these values
        // with overwhelming probability, and the write does not depend on the descales.
        assert!(o.iter().all(|&x| x != 7.0) && lse.iter().all(|&x| x != 7.0), "descale {bad}: unwritten outputs");
    }
}

fn shape_no_lse(shape: &AttentionShape) -> AttentionShape {
    AttentionShape { write_lse: false, ..*shape }
}
