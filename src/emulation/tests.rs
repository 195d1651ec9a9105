//! Emulation against an independent f64 two-pass softmax (no tiles, no online rescaling).

use super::*;
use crate::codec::float16::{round_bf16_vec, round_f16, round_f16_vec};
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use crate::codec::int8::{self, Int8Blocking, Int8ScaleLayout};
use crate::codec::nvfp4::Nvfp4Tensor;
use crate::{DescaleGranularity, Fp8Format, Int8Granularity, Layout, PvFormat};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// Straightforward f64 attention: logits, max, exp, sum, weighted V. O in the problem's
/// layout, LSE `[batch, q_heads, q_len]` (natural log, -inf for rows with no key).
fn reference(p: &AttentionProblem, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let scale = p.softmax_scale() as f64;
    let mut o = vec![0.0f64; p.o_len_elems()];
    let mut lse = vec![f64::NEG_INFINITY; p.lse_len_elems()];
    let group = p.q_heads / p.kv_heads;
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            let kh = h / group;
            for i in 0..p.q_len {
                // Causal, bottom-right: key j is visible iff j + q_len <= i + kv_len.
                let keys: Vec<usize> = (0..p.kv_len).filter(|&j| !p.causal || j + p.q_len <= i + p.kv_len).collect();
                if keys.is_empty() {
                    continue;
                }
                let qo = p.q_strides().offset(b, h, i);
                let logits: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let ko = p.k_strides().offset(b, kh, j);
                        scale * (0..d).map(|c| q[qo + c] as f64 * k[ko + c] as f64).sum::<f64>()
                    })
                    .collect();
                let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = w.iter().sum();
                let oo = p.o_strides().offset(b, h, i);
                for (&j, wj) in keys.iter().zip(&w) {
                    let vo = p.v_strides().offset(b, kh, j);
                    for c in 0..dv {
                        o[oo + c] += wj / z * v[vo + c] as f64;
                    }
                }
                lse[(b * p.q_heads + h) * p.q_len + i] = m + z.ln();
            }
        }
    }
    (o, lse)
}

fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Largest `|ΔLSE| / (1 + |LSE|)` over rows that see keys (the LSE's error grows with the size
/// of the logits, so it is measured relative to it); rows that see none must be -inf in both.
fn lse_err(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if *y == f64::NEG_INFINITY {
                assert_eq!(*x, f32::NEG_INFINITY);
                0.0
            } else {
                (*x as f64 - y).abs() / (1.0 + y.abs())
            }
        })
        .fold(0.0, f64::max)
}

/// Normal(0, std) with about 0.5% outliers ×8.
fn gaussian(rng: &mut rand::rngs::StdRng, n: usize, std: f32) -> Vec<f32> {
    let normal = Normal::new(0.0f32, std).unwrap();
    (0..n)
        .map(|_| {
            let x = normal.sample(rng);
            if rng.random::<f32>() < 0.005 {
                8.0 * x
            } else {
                x
            }
        })
        .collect()
}

fn inputs(p: &AttentionProblem, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (
        gaussian(&mut rng, p.q_len_elems(), 1.0),
        gaussian(&mut rng, p.k_len_elems(), 1.0),
        gaussian(&mut rng, p.v_len_elems(), 1.0),
    )
}

/// (O rel-L2, max LSE error) of `precision` against the f64 reference.
fn errors(
    p: &AttentionProblem,
    precision: Precision,
    blocking: &Blocking,
    x: &(Vec<f32>, Vec<f32>, Vec<f32>),
) -> (f64, f64) {
    let out = emulate(p, precision, blocking, &x.0, &x.1, &x.2).unwrap();
    let (o, lse) = reference(p, &x.0, &x.1, &x.2);
    (rel_l2(&out.o, &o), lse_err(&out.lse, &lse))
}

fn small_blocking() -> Blocking {
    Blocking { block_q: 32, block_k: 32, warps: 2, qk_chunk: 32, k_step: 16, key_streams: None }
}

fn all_supported() -> Vec<Precision> {
    Precision::all_named()
        .into_iter()
        .filter(|p| !matches!(p, Precision::Bf16 { qk, pv } if *qk != QkAccum::F32 || *pv != PvAccum::F32))
        .collect()
}

/// (O rel-L2, LSE relative) bounds per mode on N(0,1) inputs with 0.5% ×8 outliers: about
/// 3× what the modes show on such data, so a misplaced rounding or scale breaks them.
fn tolerance(precision: Precision) -> (f64, f64) {
    match precision {
        Precision::F32 => (1e-5, 1e-5),
        Precision::F16 { qk: QkAccum::F32, .. } => (2e-3, 2e-3),
        Precision::F16 { .. } => (4e-3, 3e-3),
        Precision::Bf16 { .. } => (1.5e-2, 1.5e-2),
        Precision::Int8Qk { .. } => (0.1, 0.06),
        Precision::Fp8 { format: Fp8Format::E4M3, .. } => (0.15, 0.15),
        Precision::Fp8 { format: Fp8Format::E5M2, .. } => (0.35, 0.3),
        Precision::Nvfp4 { .. } => (0.4, 0.3),
        // Coarser than NVFP4 (power-of-two scales per 32): 0.29 and 0.23 on the data of
        // `every_mode_is_within_its_tolerance_of_the_reference`.
        Precision::Mxfp4 { .. } => (0.6, 0.5),
    }
}

#[test]
fn f32_matches_the_f64_reference_across_shapes_and_tiles() {
    let shapes = [
        AttentionProblem::new(2, 4, 70, 64).kv_heads(2).kv_len(90),
        AttentionProblem::new(2, 4, 70, 64).kv_heads(2).kv_len(90).causal(true),
        AttentionProblem::new(1, 4, 17, 40).kv_heads(1).kv_len(45).causal(true).layout(Layout::Bshd),
        AttentionProblem::new(1, 2, 33, 24).kv_len(33).v_head_dim(40).scale(0.3),
    ];
    for (n, p) in shapes.iter().enumerate() {
        let x = inputs(p, 100 + n as u64);
        for block_k in [16, 32, 64, 128] {
            let blk = Blocking { block_k, ..small_blocking() };
            let (eo, el) = errors(p, Precision::F32, &blk, &x);
            assert!(eo < 1e-5 && el < 1e-5, "shape {n} block_k {block_k}: o {eo:e} lse {el:e}");
        }
    }
}

#[test]
fn every_mode_is_within_its_tolerance_of_the_reference() {
    let p = AttentionProblem::new(1, 2, 96, 64).kv_len(80);
    let x = inputs(&p, 201);
    for precision in all_supported() {
        let (eo, el) = errors(&p, precision, &small_blocking(), &x);
        let (to, tl) = tolerance(precision);
        assert!(eo < to && el < tl, "{precision}: o {eo:.3e} (< {to:e}) lse {el:.3e} (< {tl:e})");
        // The modes that round anything must show some error (the rounding is really applied).
        if precision != Precision::F32 {
            assert!(eo > 1e-5, "{precision}: suspiciously exact ({eo:e})");
        }
    }
}

#[test]
fn bf16_with_f16_accumulation_is_an_error() {
    let p = AttentionProblem::new(1, 1, 8, 16);
    let x = inputs(&p, 202);
    for (qk, pv) in
        [(QkAccum::F16, PvAccum::F32), (QkAccum::TwoStage, PvAccum::F32), (QkAccum::F32, PvAccum::F16PerTile)]
    {
        let r = emulate(&p, Precision::Bf16 { qk, pv }, &Blocking::default(), &x.0, &x.1, &x.2);
        assert!(matches!(r, Err(Error::UnsupportedPrecision { .. })), "{qk:?} {pv:?}");
    }
}

#[test]
fn invalid_inputs_give_typed_errors() {
    let p = AttentionProblem::new(1, 2, 8, 40);
    let x = inputs(&p, 203);
    let blk = Blocking::default();
    let r = emulate(&p, Precision::F32, &blk, &x.0[1..], &x.1, &x.2);
    assert!(matches!(r, Err(Error::BufferLength { .. })));
    let r = emulate(&p, Precision::NVFP4_DEFAULT, &blk, &x.0, &x.1, &x.2);
    assert!(matches!(r, Err(Error::UnsupportedHeadDim { head_dim: 40, .. })));
    // MXFP4's scale blocks are 32 wide: 48 is a multiple of NVFP4's 16, not of 32.
    let p48 = AttentionProblem::new(1, 2, 8, 48);
    let x48 = inputs(&p48, 213);
    assert!(emulate(&p48, Precision::NVFP4_DEFAULT, &blk, &x48.0, &x48.1, &x48.2).is_ok());
    for smooth_k in [false, true] {
        let r = emulate(&p48, Precision::Mxfp4 { smooth_k }, &blk, &x48.0, &x48.1, &x48.2);
        assert!(matches!(r, Err(Error::UnsupportedHeadDim { head_dim: 48, .. })), "{r:?}");
    }
    let bad = AttentionProblem::new(1, 3, 8, 40).kv_heads(2);
    assert!(matches!(emulate(&bad, Precision::F32, &blk, &[], &[], &[]), Err(Error::GqaRatio { .. })));
    let p16 = AttentionProblem::new(1, 2, 8, 32);
    let x16 = inputs(&p16, 204);
    let thread = Precision::Int8Qk { granularity: Int8Granularity::PerThread, smooth_k: true, pv: PvFormat::F16 };
    let blk64 = Blocking { block_q: 64, ..Blocking::default() }; // 8 rows per warp: no 16-row fragment
    assert!(matches!(emulate(&p16, thread, &blk64, &x16.0, &x16.1, &x16.2), Err(Error::Quantization(_))));
    let zero = Blocking { block_k: 0, ..Blocking::default() };
    assert!(emulate(&p16, Precision::F32, &zero, &x16.0, &x16.1, &x16.2).is_err());
    let odd = Blocking { block_k: 24, ..Blocking::default() };
    assert!(emulate(&p16, Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k: false }, &odd, &x16.0, &x16.1, &x16.2).is_err());
    // f16 P has no 16-key blocks of its own: the same V codes on tiles that cut V's blocks.
    assert!(emulate(&p16, Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k: false }, &odd, &x16.0, &x16.1, &x16.2).is_ok());
    let chunk = Blocking { qk_chunk: 24, ..Blocking::default() };
    let two = Precision::F16 { qk: QkAccum::TwoStage, pv: PvAccum::F32 };
    assert!(emulate(&p16, two, &chunk, &x16.0, &x16.1, &x16.2).is_err());
}

/// INT8: the emulation equals f64 attention on the dequantized Q and K (and f16 V) up to the
/// f16 rounding of P; this checks the scale plumbing (indices, GQA, folding, LSE shift)
/// separately from the quantization error itself.
#[test]
fn int8_equals_attention_on_dequantized_inputs() {
    let p = AttentionProblem::new(2, 4, 40, 32).kv_heads(2).kv_len(45).causal(true).layout(Layout::Bshd);
    let blk = small_blocking();
    let x = inputs(&p, 205);
    let (q16, k16, v16) = (round_f16_vec(&x.0), round_f16_vec(&x.1), round_f16_vec(&x.2));
    for granularity in [Int8Granularity::PerBlock, Int8Granularity::PerWarp, Int8Granularity::PerThread] {
        for smooth_k in [false, true] {
            let precision = Precision::Int8Qk { granularity, smooth_k, pv: PvFormat::F16 };
            let out = emulate(&p, precision, &blk, &x.0, &x.1, &x.2).unwrap();
            let lay =
                Int8ScaleLayout::new(&p, granularity, Int8Blocking { block_q: 32, block_k: 32, warps: 2 }).unwrap();
            let qt = int8::quantize_q(&p, &lay, &q16, 1.0).unwrap();
            let sm = int8::smooth_k(&p, &k16).unwrap();
            let kin = if smooth_k { &sm.values } else { &k16 };
            let kt = int8::quantize_k(&p, &lay, kin).unwrap();
            let (mut qd, mut kd) = (vec![0.0f32; q16.len()], vec![0.0f32; k16.len()]);
            let (d, qs, ks) = (p.head_dim, p.q_strides(), p.k_strides());
            for b in 0..2 {
                for h in 0..4 {
                    for i in 0..40 {
                        let o = qs.offset(b, h, i);
                        for c in 0..d {
                            qd[o + c] = qt.codes[o + c] as f32 * qt.scales[lay.q_scale_index(b, h, i)];
                        }
                    }
                }
                for h in 0..2 {
                    for j in 0..45 {
                        let o = ks.offset(b, h, j);
                        for c in 0..d {
                            kd[o + c] = kt.codes[o + c] as f32 * kt.scales[lay.k_scale_index(b, h, j)];
                        }
                    }
                }
            }
            let (o_ref, mut lse_ref) = reference(&p, &qd, &kd, &v16);
            if smooth_k {
                // LSE of the unsmoothed logits: add scale · q·μ (f64, from the f16 Q).
                for b in 0..2 {
                    for h in 0..4 {
                        for i in 0..40 {
                            let qo = qs.offset(b, h, i);
                            let mu = &sm.mean[(b * 2 + h / 2) * d..][..d];
                            let qmu: f64 = (0..d).map(|c| q16[qo + c] as f64 * mu[c] as f64).sum();
                            lse_ref[(b * 4 + h) * 40 + i] += p.softmax_scale() as f64 * qmu;
                        }
                    }
                }
            }
            let (eo, el) = (rel_l2(&out.o, &o_ref), lse_err(&out.lse, &lse_ref));
            assert!(eo < 1e-3 && el < 1e-4, "{precision}: o {eo:e} lse {el:e}");
        }
    }
}

/// FP8 (P in f16): the emulation equals f64 attention on the dequantized Q, K, V up to P's
/// f16 rounding.
#[test]
fn fp8_equals_attention_on_dequantized_inputs() {
    let p = AttentionProblem::new(1, 4, 40, 32).kv_heads(2).kv_len(45).causal(true);
    let blk = small_blocking();
    let x = inputs(&p, 206);
    let r16 = |v: &[f32]| round_f16_vec(v);
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        for descale in [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock] {
            let precision = Precision::Fp8 { format, descale, p: PvFormat::F16 };
            let out = emulate(&p, precision, &blk, &x.0, &x.1, &x.2).unwrap();
            let deq = |v: &[f32], heads: usize, len: usize, dim: usize, rows: usize, st: crate::Strides| -> Vec<f32> {
                let l = DescaleLayout { granularity: descale, batch: 1, heads, len, block_rows: rows };
                let t = Fp8Tensor::quantize(format, &r16(v), st, dim, l).unwrap();
                let mut out = vec![0.0f32; v.len()];
                for h in 0..heads {
                    for i in 0..len {
                        let o = st.offset(0, h, i);
                        for c in 0..dim {
                            out[o + c] = t.raw(o + c) * t.descales[l.index(0, h, i)];
                        }
                    }
                }
                out
            };
            let qd = deq(&x.0, 4, 40, 32, 32, p.q_strides());
            let kd = deq(&x.1, 2, 45, 32, 32, p.k_strides());
            let vd = deq(&x.2, 2, 45, 32, 32, p.v_strides());
            let (o_ref, lse_ref) = reference(&p, &qd, &kd, &vd);
            let (eo, el) = (rel_l2(&out.o, &o_ref), lse_err(&out.lse, &lse_ref));
            assert!(eo < 1e-3 && el < 1e-4, "{precision}: o {eo:e} lse {el:e}");
        }
    }
}

/// NVFP4 Q·K with bf16 P·V equals f64 attention on the dequantized Q, K and bf16 V up to P's
/// bf16 rounding.
#[test]
fn nvfp4_equals_attention_on_dequantized_inputs() {
    let p = AttentionProblem::new(1, 2, 40, 32).kv_len(45).causal(true).layout(Layout::Bshd);
    let x = inputs(&p, 207);
    let out = emulate(&p, Precision::NVFP4_DEFAULT, &small_blocking(), &x.0, &x.1, &x.2).unwrap();
    let deq = |v: &[f32]| {
        let r = round_bf16_vec(v);
        Nvfp4Tensor::quantize(&r, r.len() / 32, 32).unwrap().dequantize()
    };
    let (o_ref, lse_ref) = reference(&p, &deq(&x.0), &deq(&x.1), &round_bf16_vec(&x.2));
    let (eo, el) = (rel_l2(&out.o, &o_ref), lse_err(&out.lse, &lse_ref));
    assert!(eo < 8e-3 && el < 1e-4, "o {eo:e} lse {el:e}");
}

/// NVFP4 V with f16 P equals f64 attention on the dequantized Q, K and V (V quantized along the
/// keys, `quantize_vt_nvfp4`) up to P's f16 rounding, on KV tiles of 16, 32 and 24 keys (the
/// last cut V's 16-key blocks); NVFP4 P on the same codes is far from it.
#[test]
fn nvfp4_v_with_f16_p_equals_attention_on_dequantized_inputs() {
    let p = AttentionProblem::new(1, 2, 40, 32).kv_len(45).causal(true);
    let x = inputs(&p, 215);
    let (q, k, v) = (round_f16_vec(&x.0), round_f16_vec(&x.1), round_f16_vec(&x.2));
    let deq = |r: &[f32]| Nvfp4Tensor::quantize(r, r.len() / 32, 32).unwrap().dequantize();
    let t = quantize_vt_nvfp4(&p, &v).unwrap();
    let vt = t.dequantize();
    let mut dv = vec![0.0f32; v.len()];
    let st = p.v_strides();
    for h in 0..p.kv_heads {
        for j in 0..p.kv_len {
            for c in 0..32 {
                dv[st.offset(0, h, j) + c] = vt[(h * 32 + c) * t.cols + j];
            }
        }
    }
    let (o_ref, lse_ref) = reference(&p, &deq(&q), &deq(&k), &dv);
    let prec = Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k: false };
    for block_k in [16, 32, 24] {
        let blk = Blocking { block_k, ..small_blocking() };
        let out = emulate(&p, prec, &blk, &x.0, &x.1, &x.2).unwrap();
        let (eo, el) = (rel_l2(&out.o, &o_ref), lse_err(&out.lse, &lse_ref));
        assert!(eo < 1e-3 && el < 1e-5, "block_k {block_k}: o {eo:e} lse {el:e}");
    }
    let p4 = emulate(&p, Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k: false }, &small_blocking(), &x.0, &x.1, &x.2).unwrap();
    let p16 = emulate(&p, prec, &small_blocking(), &x.0, &x.1, &x.2).unwrap();
    let (e4, e16) = (rel_l2(&p4.o, &o_ref), rel_l2(&p16.o, &o_ref));
    assert!(e4 > 20.0 * e16, "NVFP4 P {e4:e} vs f16 P {e16:e}");
    // The LSE does not see P's format.
    assert_eq!(p4.lse, p16.lse);
}

/// MXFP4 Q·K with bf16 P·V equals f64 attention on the dequantized Q, K (the codec's decode of
/// its own codes: E2M1 times the E8M0 power of two) and bf16 V up to P's bf16 rounding; with
/// smoothing, on the dequantized K − μ, and the LSE gets `scale · q·μ` back.
#[test]
fn mxfp4_equals_attention_on_dequantized_inputs() {
    use crate::codec::mxfp4::Mxfp4Tensor;
    // Head dim 64: two 32-element scale blocks per row; BSHD rows are dense in memory, so the
    // blocks of the buffer's rows are the kernel's.
    let p = AttentionProblem::new(1, 2, 40, 64).kv_len(45).causal(true).layout(Layout::Bshd);
    let x = inputs(&p, 214);
    let deq = |v: &[f32]| Mxfp4Tensor::quantize(v, v.len() / 64, 64).unwrap().dequantize();
    let (q, k, v) = (round_bf16_vec(&x.0), round_bf16_vec(&x.1), round_bf16_vec(&x.2));
    for smooth_k in [false, true] {
        let out = emulate(&p, Precision::Mxfp4 { smooth_k }, &small_blocking(), &x.0, &x.1, &x.2).unwrap();
        let (kq, shift) = if smooth_k {
            let sm = int8::smooth_k(&p, &k).unwrap();
            let shift: Vec<f32> = (0..p.q_heads * p.q_len)
                .map(|r| {
                    let (h, i) = (r / p.q_len, r % p.q_len);
                    let mu = &sm.mean[p.kv_head_of(h) * 64..][..64];
                    int8::lse_shift(&q[p.q_strides().offset(0, h, i)..][..64], mu, p.softmax_scale())
                })
                .collect();
            (deq(&sm.values), shift)
        } else {
            (deq(&k), vec![0.0; p.q_heads * p.q_len])
        };
        let (o_ref, mut lse_ref) = reference(&p, &deq(&q), &kq, &v);
        lse_ref.iter_mut().zip(&shift).for_each(|(l, s)| *l += *s as f64);
        let (eo, el) = (rel_l2(&out.o, &o_ref), lse_err(&out.lse, &lse_ref));
        assert!(eo < 8e-3 && el < 1e-4, "smooth_k {smooth_k}: o {eo:e} lse {el:e}");
        // And far from attention on the unquantized inputs: the codes are really used.
        let (o_plain, _) = reference(&p, &q, &k, &v);
        assert!(rel_l2(&out.o, &o_plain) > 10.0 * eo, "smooth_k {smooth_k}");
    }
}

#[test]
fn smoothing_helps_with_an_outlier_k_channel() {
    let p = AttentionProblem::new(1, 2, 64, 64).kv_len(96);
    let mut x = inputs(&p, 208);
    // K without the random outliers, so that the channel offset is what sets K's amax.
    let mut rng = rand::rngs::StdRng::seed_from_u64(218);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    x.1 = (0..p.k_len_elems()).map(|_| normal.sample(&mut rng)).collect();
    let ks = p.k_strides();
    for h in 0..2 {
        for j in 0..96 {
            x.1[ks.offset(0, h, j) + 5] += 8.0; // a channel offset of 8σ shared by every key
        }
    }
    for granularity in [Int8Granularity::PerBlock, Int8Granularity::PerWarp, Int8Granularity::PerThread] {
        for pv in [PvFormat::F16, PvFormat::Fp8] {
            let with = errors(&p, Precision::Int8Qk { granularity, smooth_k: true, pv }, &small_blocking(), &x);
            let without = errors(&p, Precision::Int8Qk { granularity, smooth_k: false, pv }, &small_blocking(), &x);
            assert!(
                with.0 < without.0,
                "{granularity:?} {pv:?}: O error with smoothing {} !< without {}",
                with.0,
                without.0
            );
            assert!(
                with.1 < without.1,
                "{granularity:?} {pv:?}: LSE error with smoothing {} !< without {}",
                with.1,
                without.1
            );
        }
    }
}

#[test]
fn f16_accumulation_error_is_ordered_on_a_long_head_dim() {
    let p = AttentionProblem::new(1, 2, 64, 256).kv_len(64);
    let x = inputs(&p, 209);
    let err = |qk| errors(&p, Precision::F16 { qk, pv: PvAccum::F32 }, &small_blocking(), &x);
    let (f32_acc, two, f16_acc) = (err(QkAccum::F32), err(QkAccum::TwoStage), err(QkAccum::F16));
    // The LSE sees the logits' rounding alone (l sums the unrounded p), so it orders cleanly.
    assert!(f32_acc.1 < two.1 && two.1 < f16_acc.1, "LSE errors f32 {} 2stage {} f16 {}", f32_acc.1, two.1, f16_acc.1);
    assert!(f16_acc.0 > f32_acc.0, "O errors f16 {} !> f32 {}", f16_acc.0, f32_acc.0);
}

#[test]
fn causal_gqa_ragged_in_every_mode() {
    let p = AttentionProblem::new(2, 4, 17, 32).kv_heads(2).kv_len(45).causal(true).layout(Layout::Bshd);
    let x = inputs(&p, 210);
    let blk = Blocking { block_q: 32, block_k: 16, warps: 2, qk_chunk: 16, k_step: 16, key_streams: None };
    for precision in all_supported() {
        let (eo, el) = errors(&p, precision, &blk, &x);
        let (to, tl) = tolerance(precision);
        assert!(eo < to && el < tl, "{precision}: o {eo:.3e} lse {el:.3e}");
    }
}

#[test]
fn rows_that_see_no_key_give_zero_and_minus_infinity() {
    // q_len 45 > kv_len 17, causal: row i sees i + 17 - 45 + 1 keys, so rows 0..28 see none.
    let p = AttentionProblem::new(1, 2, 45, 32).kv_len(17).causal(true);
    let x = inputs(&p, 211);
    let blk = Blocking { block_q: 32, block_k: 16, warps: 2, qk_chunk: 32, k_step: 16, key_streams: None };
    for precision in all_supported() {
        let out = emulate(&p, precision, &blk, &x.0, &x.1, &x.2).unwrap();
        for h in 0..2 {
            for i in 0..45 {
                let o = &out.o[p.o_strides().offset(0, h, i)..][..32];
                let lse = out.lse[h * 45 + i];
                if i < 28 {
                    assert!(o.iter().all(|&v| v == 0.0), "{precision} row {i}");
                    assert_eq!(lse, f32::NEG_INFINITY, "{precision} row {i}");
                } else {
                    assert!(
                        lse.is_finite() && o.iter().all(|v| v.is_finite()) && o.iter().any(|&v| v != 0.0),
                        "{precision} row {i}"
                    );
                }
            }
        }
    }
}

/// With one tile the online softmax is a two-pass softmax; written out here directly (same
/// k-step grouping, same exp2 form, P rounded to f16), the results must agree bit for bit.
#[test]
fn one_tile_f16_equals_a_two_pass_computation() {
    let p = AttentionProblem::new(1, 2, 20, 48).kv_len(37);
    let x = inputs(&p, 212);
    let blk = Blocking { block_k: 37, ..small_blocking() };
    let out = emulate(&p, Precision::F16_DEFAULT, &blk, &x.0, &x.1, &x.2).unwrap();
    let (q, k, v) = (round_f16_vec(&x.0), round_f16_vec(&x.1), round_f16_vec(&x.2));
    let c = p.softmax_scale() * std::f32::consts::LOG2_E;
    // A 16-wide k-step: products summed in f32, then added to the running f32 sum.
    let grouped = |n: usize, term: &dyn Fn(usize) -> f32| -> f32 {
        (0..n).step_by(16).fold(0.0f32, |acc, s0| acc + (s0..(s0 + 16).min(n)).fold(0.0f32, |t, i| t + term(i)))
    };
    for h in 0..2 {
        for i in 0..20 {
            let qo = p.q_strides().offset(0, h, i);
            let s: Vec<f32> = (0..37)
                .map(|j| {
                    let ko = p.k_strides().offset(0, h, j);
                    grouped(48, &|c| q[qo + c] * k[ko + c])
                })
                .collect();
            let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let pr: Vec<f32> = s.iter().map(|&sj| sj.mul_add(c, -(m * c)).exp2()).collect();
            let l: f32 = pr.iter().sum();
            let p16: Vec<f32> = pr.iter().map(|&x| round_f16(x)).collect();
            let oo = p.o_strides().offset(0, h, i);
            for d in 0..48 {
                let num = grouped(37, &|j| p16[j] * v[p.v_strides().offset(0, h, j) + d]);
                assert_eq!(out.o[oo + d], num / l, "row {i} dim {d}");
            }
            assert_eq!(out.lse[h * 20 + i], m * p.softmax_scale() + l.ln());
        }
    }
}

/// Key streams: one split of one warp is the plain walk, bit for bit; several splits and warps
/// (each its own running max, merged at the end) stay within NVFP4's tolerance of f64 and, since
/// P is quantized against each stream's own max, give other bits than the plain walk; the
/// tiles of the streams cover every key once.
#[test]
fn key_streams_follow_a_split_kv_kernels_walk() {
    let p = AttentionProblem::new(1, 4, 2, 32).kv_heads(2).kv_len(1000).causal(true);
    let prec = Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k: false };
    let x = inputs(&p, 77);
    let plain = Blocking { block_k: 64, ..small_blocking() };
    let one = Blocking { key_streams: Some(KeyStreams { keys_per_split: 1024, warps: 1 }), ..plain };
    let a = emulate(&p, prec, &plain, &x.0, &x.1, &x.2).unwrap();
    let b = emulate(&p, prec, &one, &x.0, &x.1, &x.2).unwrap();
    assert_eq!(a, b);
    let ks = KeyStreams { keys_per_split: 512, warps: 4 };
    let mut seen = vec![0u32; p.kv_len];
    for split in 0..ks.splits(p.kv_len) {
        for warp in 0..ks.warps {
            for k0 in ks.tiles(64, p.kv_len, split, warp) {
                seen[k0..(k0 + 64).min(p.kv_len)].iter_mut().for_each(|n| *n += 1);
            }
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "streams cover each key once");
    let many = Blocking { key_streams: Some(ks), ..plain };
    let c = emulate(&p, prec, &many, &x.0, &x.1, &x.2).unwrap();
    assert_ne!(a.o, c.o);
    let (tol_o, tol_lse) = tolerance(prec);
    let (eo, el) = errors(&p, prec, &many, &x);
    assert!(eo < tol_o && el < tol_lse, "streams: O {eo}, LSE {el}");
    // Splits that are not whole cube tiles are refused.
    let bad = Blocking { key_streams: Some(KeyStreams { keys_per_split: 100, warps: 4 }), ..plain };
    assert!(emulate(&p, prec, &bad, &x.0, &x.1, &x.2).is_err());
}
