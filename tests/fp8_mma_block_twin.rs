//! The portable FP8 mma kernel's per-block softmax (`quattn-cubecl`'s `kernel/mma_fp8.rs`) as a
//! host twin, held to the CPU emulation and the f64 reference with the bounds
//! `tests/fp8_portable.rs` holds the kernel to (which needs a CUDA device). The kernel folds the
//! tile's V descale into P, so it rounds `p · v_descale` (relative to the row's largest such
//! product) to f16 where the emulation rounds `p` and multiplies by the descale after the tile's
//! P·V: the twin shows that this stays within the emulation bound for descales that differ
//! between KV tiles by up to 2^20, growing and shrinking along the walk. The twin follows the
//! kernel's arithmetic op for op up to the f32 summation order (the kernel sums each row over
//! its lane quad), with the host's `exp`/`ln` for the device's approximate ones.

use half::f16;
use quattn::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use quattn::emulation::Blocking;
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{inputs, reference, AttentionProblem, DescaleGranularity, Dtype, Fp8Format, HostSlice, Layout, Precision, PvFormat};

/// The kernel's constants (`kernel/mod.rs`, `kernel/mma_fp8.rs`).
const NO_MAX: f32 = -1.0e30;
const LAZY_RESCALE_THRESHOLD: f32 = 5.545_177;
const V_LOG_LIMIT: f32 = 60.0;

/// O (rounded to f16, the input type) and LSE of the twin on the codes `blocking` quantizes.
fn twin(p: &AttentionProblem, format: Fp8Format, blocking: &Blocking, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let layout =
        |heads, len, block_rows| DescaleLayout { granularity: DescaleGranularity::PerBlock, batch: p.batch, heads, len, block_rows };
    let bk = blocking.block_k;
    let qt = Fp8Tensor::quantize(format, q, p.q_strides(), p.head_dim, layout(p.q_heads, p.q_len, blocking.block_q)).unwrap();
    let kt = Fp8Tensor::quantize(format, k, p.k_strides(), p.head_dim, layout(p.kv_heads, p.kv_len, bk)).unwrap();
    let vt = Fp8Tensor::quantize(format, v, p.v_strides(), p.v_head_dim, layout(p.kv_heads, p.kv_len, bk)).unwrap();
    let (qs, ks, vs, os) = (p.q_strides(), p.k_strides(), p.v_strides(), p.o_strides());
    let mut o = vec![0.0f32; p.o_len_elems()];
    let mut lse = vec![f32::NEG_INFINITY; p.batch * p.q_heads * p.q_len];
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            let kh = h / (p.q_heads / p.kv_heads);
            for i in 0..p.q_len {
                // Keys the row sees (bottom-right causal); tiles past them change nothing.
                let n = if p.causal { (i + p.kv_len).saturating_sub(p.q_len - 1).min(p.kv_len) } else { p.kv_len };
                let scale = p.softmax_scale() * qt.descales[qt.layout.index(b, h, i)];
                let (mut m, mut l) = (NO_MAX, 0.0f32);
                let mut acc = vec![0.0f32; p.v_head_dim];
                for t in 0..n.div_ceil(bk) {
                    let keys = t * bk..((t + 1) * bk).min(n);
                    let c = scale * kt.descales[kt.layout.index(b, kh, t * bk)];
                    let a = vt.descales[vt.layout.index(b, kh, t * bk)].ln().clamp(-V_LOG_LIMIT, V_LOG_LIMIT);
                    // Scores: exact products, summed in f32 per 16-deep MMA step.
                    let s: Vec<f32> = keys
                        .clone()
                        .map(|j| {
                            (0..p.head_dim).step_by(16).fold(0.0f32, |sum, x0| {
                                let step: f64 = (x0..(x0 + 16).min(p.head_dim))
                                    .map(|x| qt.raw(qs.offset(b, h, i) + x) as f64 * kt.raw(ks.offset(b, kh, j) + x) as f64)
                                    .sum();
                                sum + step as f32
                            })
                        })
                        .collect();
                    let scaled_max = s.iter().fold(NO_MAX, |x, &y| x.max(y)).mul_add(c, a);
                    let new_max = if scaled_max - m > LAZY_RESCALE_THRESHOLD { scaled_max } else { m };
                    let bias = a - new_max;
                    let pp: Vec<f32> = s.iter().map(|&x| x.mul_add(c, bias).exp()).collect();
                    let alpha = (m - new_max).exp();
                    l = pp.iter().sum::<f32>().mul_add((-a).exp(), l * alpha);
                    for (col, acc) in acc.iter_mut().enumerate() {
                        let pv: f32 =
                            keys.clone().zip(&pp).map(|(j, &x)| f16::from_f32(x).to_f32() * vt.raw(vs.offset(b, kh, j) + col)).sum();
                        *acc = *acc * alpha + pv;
                    }
                    m = new_max;
                }
                if l > 0.0 {
                    lse[(b * p.q_heads + h) * p.q_len + i] = m + l.ln();
                    for (col, acc) in acc.iter().enumerate() {
                        o[os.offset(b, h, i) + col] = f16::from_f32(acc * (1.0 / l)).to_f32();
                    }
                }
            }
        }
    }
    (o, lse)
}

/// The twin against the f64 reference (the mode's tolerance) and the emulation (O rel-L2 below
/// 1e-3, LSE within 1e-4), as `tests/fp8_portable.rs` checks the kernel.
fn check(p: &AttentionProblem, format: Fp8Format, q: &[f32], k: &[f32], v: &[f32]) {
    let prec = Precision::Fp8 { format, descale: DescaleGranularity::PerBlock, p: PvFormat::F16 };
    // The kernel's descale blocks at d 64 and 128 (4 x 2 and 8 x 1 warps, 64-key tiles).
    let blocking = Blocking::default();
    assert_eq!((blocking.block_q, blocking.block_k), (128, 64));
    let (o, lse) = twin(p, format, &blocking, q, k, v);
    let o: Vec<f64> = o.iter().map(|&x| x as f64).collect();
    let r = reference::attention_f64(p, q, k, v).unwrap();
    let m = ErrorMetrics::compare(&o, &r.o);
    let tol = Tolerance::for_precision(prec);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{format} {p:?}: {m:?} vs {tol:?}");
    let emu = quattn::emulation::emulate(p, prec, &blocking, q, k, v).unwrap();
    let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
    let me = ErrorMetrics::compare(&o, &e);
    let el: Vec<f64> = emu.lse.iter().map(|&x| x as f64).collect();
    let lm = compare_lse(&lse, &el).expect("LSE infinities match");
    println!(
        "{format} b{} h{}/{} q{} kv{} d{} causal {}: twin vs emulation O rel-L2 {:.2e}, LSE {:.1e}; vs f64 {:.2e}",
        p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, p.causal, me.rel_l2, lm.max_abs, m.rel_l2
    );
    assert!(me.rel_l2 < 1e-3, "{format} {p:?}: twin vs emulation {me:?}");
    assert!(lm.max_abs < 1e-4, "{format} {p:?}: LSE vs emulation {lm:?}");
}

fn f16_rounded(x: &[f32]) -> Vec<f32> {
    HostSlice::F32(x).rounded_to(Dtype::F16)
}

#[test]
fn per_block_twin_follows_the_emulation() {
    for (i, p) in [
        AttentionProblem::new(1, 4, 1, 64).kv_heads(2).kv_len(300),
        AttentionProblem::new(1, 2, 70, 128).kv_len(130).causal(true),
        AttentionProblem::new(2, 2, 33, 64).kv_len(65).layout(Layout::Bshd),
    ]
    .into_iter()
    .enumerate()
    {
        let p = p.with_lse(true);
        let (q, k, v) = inputs::qkv(&p, 700 + i as u64);
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            check(&p, format, &f16_rounded(&q), &f16_rounded(&k), &f16_rounded(&v));
        }
    }
}

/// K and V rows of KV tile t scaled by powers of two `[t % 3]`: V descales 2^10 and 2^20
/// apart, the largest first and last, and falling by 2^12 along the walk.
#[test]
fn per_block_twin_follows_the_emulation_with_descales_far_apart() {
    let scales: [([f32; 3], [f32; 3]); 3] = [
        ([1.0, 2.0, 0.5], [1.0 / 64.0, 16.0, 1.0]),
        ([1.0, 1.0, 1.0], [1.0 / 1024.0, 1024.0, 1.0]),
        ([1.0, 2.0, 1.0], [1.0, 1.0 / 4096.0, 1.0 / 4096.0]),
    ];
    for (k_scales, v_scales) in scales {
        for (i, p) in [
            AttentionProblem::new(1, 2, 70, 128).kv_len(300).causal(true),
            AttentionProblem::new(2, 4, 40, 64).kv_heads(2).kv_len(200).layout(Layout::Bshd),
        ]
        .into_iter()
        .enumerate()
        {
            let p = p.with_lse(true);
            let (q, mut k, mut v) = inputs::qkv(&p, 900 + i as u64);
            for (x, scales, st, dim) in [(&mut k, k_scales, p.k_strides(), p.head_dim), (&mut v, v_scales, p.v_strides(), p.v_head_dim)] {
                for b in 0..p.batch {
                    for h in 0..p.kv_heads {
                        for j in 0..p.kv_len {
                            let row = st.offset(b, h, j);
                            x[row..row + dim].iter_mut().for_each(|e| *e *= scales[(j / 64) % 3]);
                        }
                    }
                }
            }
            for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
                check(&p, format, &f16_rounded(&q), &f16_rounded(&k), &f16_rounded(&v));
            }
        }
    }
}
