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
/// the f64 reference, without and with score modifiers (each sequence's band and alignment
/// against its own lengths), into NaN-poisoned outputs; a packed run with modifiers against each
/// sequence run alone on the dense modifier variant. Skips without a CUDA device.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use half::{bf16, f16};
    use quattn::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
    use quattn::{CausalAlign, CudaTensor, CudaTensorMut, Element, Family, NativeKind, Plan};
    use std::sync::Arc;

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
        // With a score modifier Auto stays on the native kernels (their varlen modifier variants).
        let p = cases[1].clone().window(64, 0);
        let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        assert!(matches!(plan.family(), Family::Native(NativeKind::Wgmma | NativeKind::Hmma)), "{}", plan.kernel_name());
        assert!(plan.kernel_name().contains("_mods") && plan.kernel_name().ends_with("_varlen"), "{}", plan.kernel_name());
        check_with(&s, &p, Precision::F16_DEFAULT, Strategy::Auto, 99);
    }

    /// Whether the device has the wgmma kernel (compute capability 9.0): Auto's f16 choice.
    fn has_wgmma(s: &Session) -> bool {
        let probe = AttentionProblem::new(1, 2, 64, 64);
        s.plan(&probe, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Wgmma)).is_ok()
    }

    /// One of the modifier sets of the tests below applied to `p` (its heads give the per-head
    /// sinks and slopes).
    fn modified(p: AttentionProblem, which: &str) -> AttentionProblem {
        let h = p.q_heads;
        let sinks: Vec<f32> = (0..h).map(|i| [0.5, -1.0, 2.0, f32::NEG_INFINITY][i % 4]).collect();
        let slopes = AttentionProblem::standard_alibi_slopes(h);
        match which {
            "window" => p.window(96, 40),
            "causal top-left" => p.causal(true).causal_align(CausalAlign::TopLeft),
            "causal bottom-right" => p.causal(true),
            "softcap" => p.softcap(15.0),
            "sinks" => p.sinks(sinks),
            "alibi" => p.alibi_slopes(slopes),
            "all, bottom-right causal" => p.causal(true).window(300, 0).softcap(20.0).sinks(sinks).alibi_slopes(slopes),
            "all, top-left window" => p.causal_align(CausalAlign::TopLeft).window(64, 64).softcap(20.0).sinks(sinks).alibi_slopes(slopes),
            other => panic!("no modifier set {other}"),
        }
    }

    const MODIFIER_SETS: [&str; 8] = [
        "window",
        "causal top-left",
        "causal bottom-right",
        "softcap",
        "sinks",
        "alibi",
        "all, bottom-right causal",
        "all, top-left window",
    ];

    /// Runs `plan` through caller-held device buffers (O and LSE filled with NaN first, so a row
    /// the kernel leaves unwritten fails); returns O widened, the LSE and the rounded inputs.
    #[allow(clippy::type_complexity)]
    fn run_poisoned<T: Element + DeviceRepr>(s: &Session, stream: &Arc<CudaStream>, plan: &Plan, seed: u64) -> (Vec<f32>, Vec<f32>, [Vec<f32>; 3]) {
        let p = &plan.problem;
        let (q, k, v) = inputs::qkv(p, seed);
        let round = |x: &[f32]| -> Vec<T> { x.iter().map(|&a| T::from_f32(a)).collect() };
        let (q, k, v) = (round(&q), round(&k), round(&v));
        let up = |x: &[T]| -> CudaSlice<T> { stream.clone_htod(x).unwrap() };
        let (dq, dk, dv) = (up(&q), up(&k), up(&v));
        let mut d_o = up(&vec![T::from_f32(f32::NAN); p.o_len_elems()]);
        let mut d_lse = stream.clone_htod(&vec![f32::NAN; p.lse_len_elems()]).unwrap();
        s.run_cuda(
            plan,
            stream,
            CudaTensor::new(&dq, stream),
            CudaTensor::new(&dk, stream),
            CudaTensor::new(&dv, stream),
            CudaTensorMut::new(&mut d_o, stream),
            Some(CudaTensorMut::new(&mut d_lse, stream)),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", plan.kernel_name()));
        let o: Vec<f32> = stream.clone_dtoh(&d_o).unwrap().iter().map(|x| x.to_f32()).collect();
        let lse = stream.clone_dtoh(&d_lse).unwrap();
        let wide = |x: &[T]| -> Vec<f32> { x.iter().map(|a| a.to_f32()).collect() };
        (o, lse, [wide(&q), wide(&k), wide(&v)])
    }

    /// Plans `p` with `strategy`, checks the family it lands on, runs it poisoned and checks O
    /// and LSE against the f64 reference with the precision's tolerances (as `check_with`).
    fn check_native(s: &Session, stream: &Arc<CudaStream>, p: &AttentionProblem, precision: Precision, strategy: Strategy, want: NativeKind, seed: u64) {
        let plan = s.plan(p, precision, strategy).unwrap_or_else(|e| panic!("plan {precision} {strategy:?}: {e}"));
        assert_eq!(plan.family(), Family::Native(want), "{precision} {strategy:?}: {}", plan.kernel_name());
        let name = plan.kernel_name();
        // Bottom-right causal is the kernels' own alignment, not a modifier: the plain variant.
        assert!(name.ends_with("_varlen") && name.contains("_mods") == p.has_modifiers(), "{name}");
        let (o, lse, [q, k, v]) = match precision.input_dtype() {
            quattn::Dtype::Bf16 => run_poisoned::<bf16>(s, stream, &plan, seed),
            _ => run_poisoned::<f16>(s, stream, &plan, seed),
        };
        let r = attention_f64(p, &q, &k, &v).unwrap();
        let m = ErrorMetrics::compare(&o, &r.o);
        let tol = Tolerance::for_precision(precision);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        assert!(tol.accepts(&m, ref_max), "{name} {precision}: {m:?}");
        let lm = compare_lse(&lse, &r.lse).unwrap_or_else(|| panic!("{name}: LSE infinities differ"));
        assert!(lm.max_abs <= tol.max_abs_rel, "{name} {precision}: LSE {lm:?}");
    }

    /// Ragged batches (an empty query sequence, one with no key, q longer than kv, one query,
    /// 3000 tokens) under every modifier alone and all at once: Auto on f16 (wgmma where the
    /// device has it, else HMMA), HMMA forced on f16, Auto on bf16 (HMMA), at head dims 128
    /// and 64.
    #[test]
    fn native_varlen_modifier_variants_match_the_reference() {
        let Some(s) = common::open(Device::Cuda(0)) else { return };
        let stream = CudaContext::new(0).unwrap().new_stream().unwrap();
        let f16_auto = if has_wgmma(&s) { NativeKind::Wgmma } else { NativeKind::Hmma };
        let batches = [
            packed(&[0, 300, 1, 3000, 77, 129], &[40, 120, 400, 3000, 0, 700], 4, 2, 128),
            packed(&[1, 0, 700, 33, 200], &[64, 5, 513, 20, 200], 8, 4, 64),
        ];
        let mut seed = 200;
        for base in &batches {
            for which in MODIFIER_SETS {
                println!("d{} {which}", base.head_dim);
                let p = modified(base.clone(), which);
                for (precision, strategy, want) in [
                    (Precision::F16_DEFAULT, Strategy::Auto, f16_auto),
                    (Precision::F16_DEFAULT, Strategy::Native(NativeKind::Hmma), NativeKind::Hmma),
                    (Precision::BF16_DEFAULT, Strategy::Auto, NativeKind::Hmma),
                ] {
                    check_native(&s, &stream, &p, precision, strategy, want, seed);
                    seed += 1;
                }
            }
        }
    }

    /// A packed run with modifiers gives, within the precision's tolerance, what each sequence
    /// gives alone as a dense problem on the same family's dense modifier variant: the
    /// per-sequence alignment, band and ALiBi distances are those of the sequence's own lengths.
    #[test]
    fn native_varlen_modifiers_equal_each_sequence_alone() {
        let Some(s) = common::open(Device::Cuda(0)) else { return };
        let stream = CudaContext::new(0).unwrap().new_stream().unwrap();
        let q_lens = [300usize, 1, 0, 129, 700];
        let k_lens = [120usize, 400, 30, 700, 700];
        let (heads, kv_heads, d) = (4usize, 2usize, 128usize);
        let families = if has_wgmma(&s) { vec![NativeKind::Wgmma, NativeKind::Hmma] } else { vec![NativeKind::Hmma] };
        for which in ["all, bottom-right causal", "all, top-left window"] {
            let p = modified(packed(&q_lens, &k_lens, heads, kv_heads, d), which);
            let vl = p.varlen.clone().unwrap();
            for &family in &families {
                let precision = Precision::F16_DEFAULT;
                let tol = Tolerance::for_precision(precision);
                let plan = s.plan(&p, precision, Strategy::Native(family)).unwrap();
                assert!(plan.kernel_name().ends_with("_varlen"), "{}", plan.kernel_name());
                let (o, lse, [q, k, v]) = run_poisoned::<f16>(&s, &stream, &plan, 300);
                for b in 0..q_lens.len() {
                    let (nq, nk) = (q_lens[b], k_lens[b]);
                    if nq == 0 {
                        continue;
                    }
                    let one = modified(AttentionProblem::new(1, heads, nq, d).kv_heads(kv_heads).kv_len(nk).layout(Layout::Bshd).with_lse(true), which);
                    let alone = s.plan(&one, precision, Strategy::Native(family)).unwrap();
                    assert!(alone.kernel_name().contains("_mods") && !alone.kernel_name().ends_with("_varlen"), "{}", alone.kernel_name());
                    let (q0, k0) = (vl.q_row(b, 0), vl.k_row(b, 0));
                    let qs = &q[q0 * heads * d..][..nq * heads * d];
                    let ks = &k[k0 * kv_heads * d..][..nk * kv_heads * d];
                    let vs = &v[k0 * kv_heads * d..][..nk * kv_heads * d];
                    let out = s.run(&alone, qs, ks, vs).unwrap();
                    // Packed rows of the sequence against its dense run (same [row, head, dim] order).
                    let packed_o = &o[q0 * heads * d..][..nq * heads * d];
                    let dense: Vec<f64> = out.o.iter().map(|&x| x as f64).collect();
                    let m = ErrorMetrics::compare(packed_o, &dense);
                    let dense_max = dense.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
                    assert!(tol.accepts(&m, dense_max), "{family:?} {which} sequence {b}: {m:?}");
                    let alone_lse = out.lse.unwrap();
                    for h in 0..heads {
                        for i in 0..nq {
                            let (x, y) = (lse[p.lse_index(b, h, i)], alone_lse[h * nq + i]);
                            let same = (x.is_infinite() && x == y) || (x - y).abs() as f64 <= tol.max_abs_rel;
                            assert!(same, "{family:?} {which} sequence {b} head {h} row {i}: LSE {x} packed, {y} alone");
                        }
                    }
                }
            }
        }
    }
}

/// The portable backend keeps a plan's offsets on the device between calls on CubeCL handles
/// (wgpu; llvmpipe in CI): on one set of Q/K/V handles, two calls with one plan, then a plan over
/// other offsets with the same totals, then the first again; each O (poisoned with NaN) and LSE
/// against the f64 reference of its own offsets. The two batches' answers differ, so stale
/// offsets on the device could not pass.
#[test]
fn wgpu_handles_follow_new_offsets() {
    use quattn::cubecl::wgpu::WgpuRuntime;
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let p1 = packed(&[5, 20, 7], &[40, 13, 60], 4, 2, 64).causal(true);
    let p2 = packed(&[20, 5, 7], &[13, 60, 40], 4, 2, 64).causal(true);
    assert_eq!((p1.q_len_elems(), p1.k_len_elems()), (p2.q_len_elems(), p2.k_len_elems()));
    let (plan1, plan2) = (s.plan(&p1, Precision::F32, Strategy::Auto).unwrap(), s.plan(&p2, Precision::F32, Strategy::Auto).unwrap());
    assert!(plan1.kernel_name().starts_with("fwd_portable_"), "{}", plan1.kernel_name());
    let (q, k, v) = inputs::qkv(&p1, 70);
    let up = |x: &[f32]| client.create_from_slice(bytemuck::cast_slice(x));
    let (qh, kh, vh) = (up(&q), up(&k), up(&v));
    let tol = Tolerance::for_precision(Precision::F32);
    let mut outs = Vec::new();
    for (i, plan) in [&plan1, &plan1, &plan2, &plan1].into_iter().enumerate() {
        let p = &plan.problem;
        let (oh, lh) = (up(&vec![f32::NAN; p.o_len_elems()]), up(&vec![f32::NAN; p.lse_len_elems()]));
        s.run_cubecl::<WgpuRuntime>(plan, quattn::CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) }).unwrap();
        let o: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(oh).unwrap());
        let lse: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(lh).unwrap());
        let r = attention_f64(p, &q, &k, &v).unwrap();
        assert!(o.iter().all(|x| x.is_finite()), "call {i}: a row left unwritten or non-finite");
        let m = ErrorMetrics::compare(&o, &r.o);
        assert!(tol.accepts(&m, r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()))), "call {i}: {m:?}");
        let lm = compare_lse(&lse, &r.lse).unwrap_or_else(|| panic!("call {i}: LSE infinities differ"));
        assert!(lm.max_abs <= tol.max_abs_rel, "call {i}: LSE {lm:?}");
        outs.push(o);
    }
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], outs[3]);
    let m = ErrorMetrics::compare(&outs[2], &outs[0].iter().map(|&x| x as f64).collect::<Vec<_>>());
    assert!(m.rel_l2 > 0.1, "the two batches give the same answer: {m:?}");
}
