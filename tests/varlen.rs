//! Variable-length (packed) batches on the CPU backend: against the f64 reference, against
//! each sequence run alone as a dense problem (bit for bit), the NaN policy through packed rows,
//! the typed errors of bad offsets, and the refusals of the families without varlen kernels.

mod common;

use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::reference::attention_f64;
use quattn::{inputs, AttentionProblem, Device, Error, HostSlice, Layout, PagedKv, PortableKind, Precision, Session, Strategy, VarLen, WgpuAdapter};

fn cpu() -> Session {
    Session::new(Device::Cpu).unwrap()
}

/// A packed problem of `q_lens[b]` queries over `k_lens[b]` keys per sequence.
fn packed(q_lens: &[usize], k_lens: &[usize], heads: usize, kv_heads: usize, d: usize) -> AttentionProblem {
    AttentionProblem::new(1, heads, 1, d).kv_heads(kv_heads).varlen(VarLen::from_lengths(q_lens, k_lens)).with_lse(true)
}

/// Runs `p` on the CPU and checks O and LSE against the f64 reference on the rounded inputs;
/// returns (O, LSE, rounded q, k, v).
#[allow(clippy::type_complexity)]
fn check(p: &AttentionProblem, precision: Precision, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    check_on(&cpu(), p, precision, seed)
}

#[allow(clippy::type_complexity)]
fn check_on(s: &Session, p: &AttentionProblem, precision: Precision, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    check_with(s, p, precision, Strategy::Auto, seed)
}

#[allow(clippy::type_complexity)]
fn check_with(s: &Session, p: &AttentionProblem, precision: Precision, strategy: Strategy, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let plan = s.plan(p, precision, strategy).unwrap_or_else(|e| panic!("plan {p:?}: {e}"));
    let (q, k, v) = inputs::qkv(p, seed);
    let dt = precision.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let out = s.run(&plan, &q, &k, &v).unwrap();
    let r = attention_f64(p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{precision} {p:?}: {m:?}");
    let lse = out.lse.clone().unwrap();
    let lm = compare_lse(&lse, &r.lse).expect("LSE infinities agree");
    assert!(lm.max_abs <= tol.max_abs_rel, "{precision}: LSE {lm:?}");
    (out.o, lse, q, k, v)
}

#[test]
fn shapes_follow_the_packed_convention() {
    let p = packed(&[3, 0, 5], &[4, 2, 7], 8, 2, 64).v_head_dim(32);
    assert_eq!((p.batch, p.q_len, p.kv_len, p.layout), (3, 5, 7, Layout::Bshd));
    assert_eq!(p.q_shape(), [1, 8, 8, 64]);
    assert_eq!(p.k_shape(), [1, 13, 2, 64]);
    assert_eq!(p.v_shape(), [1, 13, 2, 32]);
    assert_eq!(p.o_shape(), [1, 8, 8, 32]);
    assert_eq!(p.lse_shape(), [1, 8, 8]);
    assert_eq!((p.q_len_elems(), p.k_len_elems(), p.o_len_elems(), p.lse_len_elems()), (8 * 8 * 64, 13 * 2 * 64, 8 * 8 * 32, 64));
    assert_eq!(p.q_position(2, 4), (0, 7));
    assert_eq!(p.lse_index(2, 3, 4), 3 * 8 + 7);
    assert!(!p.has_q_row(1, 0) && p.has_q_row(2, 4) && !p.has_q_row(0, 3));
}

#[test]
fn cpu_matches_the_reference_on_ragged_sequences() {
    // Empty query and key sequences, one row, q longer and shorter than k, lengths off any tile.
    let q_lens = [37usize, 0, 1, 64, 5, 130];
    let k_lens = [37usize, 9, 0, 200, 1, 77];
    for (i, (precision, causal, kv_heads)) in
        [(Precision::F32, false, 4), (Precision::F16_DEFAULT, true, 2), (Precision::BF16_DEFAULT, true, 1)].into_iter().enumerate()
    {
        let p = packed(&q_lens, &k_lens, 4, kv_heads, 64).causal(causal);
        let (o, lse, ..) = check(&p, precision, 30 + i as u64);
        // Sequence 2 has no key: its row is O = 0, LSE = -inf (the CPU starts from NaN).
        for h in 0..4 {
            assert_eq!(lse[p.lse_index(2, h, 0)], f32::NEG_INFINITY);
            let (ob, oi) = p.q_position(2, 0);
            assert!(o[p.o_strides().offset(ob, h, oi)..][..64].iter().all(|&x| x == 0.0));
        }
    }
    // With score modifiers, measured against each sequence's own lengths.
    let slopes = AttentionProblem::standard_alibi_slopes(4);
    let p = packed(&q_lens, &k_lens, 4, 2, 32).causal(true).window(16, 0).softcap(20.0).alibi_slopes(slopes).sinks(vec![0.5, -1.0, 2.0, f32::NEG_INFINITY]);
    check(&p, Precision::F32, 40);
}

/// Each sequence of a packed run gives bit for bit what it gives alone as a dense problem, and
/// so does the f64 reference: the rows are found where the offsets say, and each sequence's
/// causal alignment is against its own lengths.
#[test]
fn packed_equals_each_sequence_alone() {
    let q_lens = [20usize, 3, 0, 48];
    let k_lens = [20usize, 40, 5, 17];
    let p = packed(&q_lens, &k_lens, 4, 2, 32).causal(true);
    let s = cpu();
    let (q, k, v) = inputs::qkv(&p, 8);
    let out = s.run(&s.plan(&p, Precision::F32, Strategy::Auto).unwrap(), &q, &k, &v).unwrap();
    let r = attention_f64(&p, &q, &k, &v).unwrap();
    let (lse, vl) = (out.lse.unwrap(), p.varlen.clone().unwrap());
    let row = |h: usize, d: usize| h * d; // head offset within a packed row
    for b in 0..q_lens.len() {
        let (nq, nk) = (q_lens[b], k_lens[b]);
        if nq == 0 {
            continue;
        }
        let one = AttentionProblem::new(1, 4, nq, 32).kv_heads(2).kv_len(nk).causal(true).layout(Layout::Bshd).with_lse(true);
        let (q0, k0) = (vl.q_row(b, 0), vl.k_row(b, 0));
        let qs = &q[q0 * 4 * 32..][..nq * 4 * 32];
        let ks = &k[k0 * 2 * 32..][..nk * 2 * 32];
        let vs = &v[k0 * 2 * 32..][..nk * 2 * 32];
        let alone = s.run(&s.plan(&one, Precision::F32, Strategy::Auto).unwrap(), qs, ks, vs).unwrap();
        let ref_alone = attention_f64(&one, qs, ks, vs).unwrap();
        for i in 0..nq {
            for h in 0..4 {
                let packed_o = &out.o[(q0 + i) * 4 * 32 + row(h, 32)..][..32];
                let alone_o = &alone.o[i * 4 * 32 + row(h, 32)..][..32];
                assert_eq!(packed_o, alone_o, "sequence {b} row {i} head {h}");
                assert_eq!(&r.o[(q0 + i) * 4 * 32 + row(h, 32)..][..32], &ref_alone.o[i * 4 * 32 + row(h, 32)..][..32]);
                assert_eq!(lse[p.lse_index(b, h, i)].to_bits(), alone.lse.as_ref().unwrap()[h * nq + i].to_bits());
                assert_eq!(r.lse[p.lse_index(b, h, i)].to_bits(), ref_alone.lse[h * nq + i].to_bits());
            }
        }
    }
}

/// A NaN in one packed key row poisons exactly the rows of its own sequence that see that key.
#[test]
fn nan_policy_follows_the_packed_rows() {
    let q_lens = [6usize, 6];
    let k_lens = [6usize, 6];
    let p = packed(&q_lens, &k_lens, 2, 1, 16).causal(true);
    let s = cpu();
    let (q, mut k, v) = inputs::qkv(&p, 3);
    // Key 3 of sequence 1 (packed row 9).
    k[9 * 16 + 5] = f32::NAN;
    let out = s.run(&s.plan(&p, Precision::F32, Strategy::Auto).unwrap(), &q, &k, &v).unwrap();
    let lse = out.lse.unwrap();
    for b in 0..2 {
        for h in 0..2 {
            for i in 0..6 {
                let poisoned = b == 1 && i >= 3;
                assert_eq!(lse[p.lse_index(b, h, i)].is_nan(), poisoned, "sequence {b} head {h} row {i}");
                let (ob, oi) = p.q_position(b, i);
                let o = &out.o[p.o_strides().offset(ob, h, oi)..][..16];
                assert_eq!(o.iter().all(|x| x.is_nan()), poisoned);
                assert!(poisoned || o.iter().all(|x| x.is_finite()));
            }
        }
    }
}

#[test]
fn bad_offsets_are_typed_errors() {
    let s = cpu();
    let plan = |p: &AttentionProblem| s.plan(p, Precision::F32, Strategy::Auto);
    let invalid = |p: AttentionProblem| match plan(&p) {
        Err(Error::InvalidVarLen { reason }) => reason,
        other => panic!("{p:?}: {other:?}"),
    };
    let base = packed(&[4, 5], &[6, 7], 2, 2, 32);
    // Offsets that decrease, that do not start at 0, of the wrong length.
    let mut p = base.clone();
    p.varlen = Some(VarLen::new([0, 5, 4], [0, 6, 13]));
    assert!(invalid(p).contains("decreases"));
    let mut p = base.clone();
    p.varlen = Some(VarLen::new([2, 4, 9], [0, 6, 13]));
    assert!(invalid(p).contains("start at 0"));
    let mut p = base.clone();
    p.varlen = Some(VarLen::new([0, 4, 9], [0, 13]));
    assert!(invalid(p).contains("cu_seqlens_k has 2 entries"));
    // Maxima that do not match, a layout or strides that are not the packed ones, a paged cache.
    let mut p = base.clone();
    p.q_len = 9;
    assert!(invalid(p).contains("not the longest"));
    assert!(invalid(base.clone().layout(Layout::Bhsd)).contains("Layout::Bshd"));
    let strides = AttentionProblem::new(2, 2, 5, 32).kv_len(7).tensor_strides();
    assert!(invalid(base.clone().strides(strides)).contains("explicit strides"));
    let mut p = base.clone();
    p.paged = Some(PagedKv::new(16, 2, vec![0, 1], vec![6, 7]));
    assert!(invalid(p).contains("paged"));
    // Buffers that do not hold the packed rows.
    let good = plan(&base).unwrap();
    let n = |x: usize| vec![0.5f32; x];
    match s.run(&good, &n(9 * 2 * 32), &n(13 * 2 * 32), &n(12 * 2 * 32)) {
        Err(Error::BufferLength { expected, got, .. }) => assert_eq!((expected, got), (13 * 2 * 32, 12 * 2 * 32)),
        other => panic!("{other:?}"),
    }
    assert!(s.run(&good, &n(9 * 2 * 32), &n(13 * 2 * 32), &n(13 * 2 * 32)).is_ok());
}

/// Families without varlen kernels refuse a packed problem with a typed error, and Auto passes
/// over them.
#[test]
fn families_without_varlen_refuse() {
    let s = cpu();
    let p = packed(&[4, 5], &[6, 7], 2, 2, 64);
    assert!(matches!(s.plan(&p, Precision::F32, Strategy::Reference), Err(Error::UnsupportedVarLen { .. })));
    assert!(matches!(s.plan(&p, Precision::FP8_DEFAULT, Strategy::Auto), Err(Error::UnsupportedVarLen { .. })));
}

/// The portable FMA kernel on wgpu (llvmpipe in CI): ragged packed batches against the f64
/// reference, with and without score modifiers; the families without varlen kernels refuse.
#[test]
fn wgpu_portable_matches_the_reference() {
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let q_lens = [37usize, 0, 1, 64, 5, 130];
    let k_lens = [37usize, 9, 0, 200, 1, 77];
    for (i, (precision, causal)) in [(Precision::F32, true), (Precision::F16_DEFAULT, false)].into_iter().enumerate() {
        let p = packed(&q_lens, &k_lens, 4, 2, 64).causal(causal);
        let plan = s.plan(&p, precision, Strategy::Auto).unwrap();
        assert!(plan.kernel_name().starts_with("fwd_portable_"), "{}", plan.kernel_name());
        check_on(&s, &p, precision, 50 + i as u64);
    }
    let p = packed(&q_lens, &k_lens, 4, 2, 64).causal(true).window(24, 0).softcap(15.0).sinks(vec![0.5, -1.0, 2.0, 1.0]);
    check_on(&s, &p, Precision::F32, 60);
    let p = packed(&[1, 1], &[300, 20], 8, 2, 64);
    assert!(matches!(s.plan(&p, Precision::F16_DEFAULT, Strategy::PortableFamily(PortableKind::Decode)), Err(Error::UnsupportedVarLen { .. })));
}

/// The native varlen variants (wgmma on sm_90a, HMMA f16/bf16 elsewhere and forced) against
/// the f64 reference; with a score modifier Auto moves on to the portable FMA kernel, the native
/// varlen variants having none. Skips without a CUDA device.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use quattn::{Family, NativeKind};

    #[test]
    fn native_varlen_kernels_match_the_reference() {
        let Some(s) = common::open(Device::Cuda(0)) else { return };
        let cases = [
            packed(&[1000, 1, 0, 257, 64, 3000], &[1000, 1, 5, 300, 64, 2000], 16, 4, 128).causal(true),
            packed(&[513, 77, 2048, 5], &[513, 900, 100, 5], 8, 8, 64),
        ];
        for (i, p) in cases.iter().enumerate() {
            let seed = 70 + 10 * i as u64;
            let plan = s.plan(p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
            assert!(matches!(plan.family(), Family::Native(NativeKind::Wgmma | NativeKind::Hmma)), "{}", plan.kernel_name());
            check_with(&s, p, Precision::F16_DEFAULT, Strategy::Auto, seed);
            check_with(&s, p, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Hmma), seed + 1);
            check_with(&s, p, Precision::BF16_DEFAULT, Strategy::Auto, seed + 2);
        }
        let p = cases[1].clone().window(64, 0);
        let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        assert_eq!(plan.family(), Family::Portable(PortableKind::Fma), "{}", plan.kernel_name());
        check_with(&s, &p, Precision::F16_DEFAULT, Strategy::Auto, 99);
        assert!(matches!(s.plan(&p, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Wgmma)), Err(Error::UnsupportedFeature { .. })));
    }
}
