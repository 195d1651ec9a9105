//! Score modifiers (sliding window, softcap, attention sinks, ALiBi, causal alignment) on the
//! CPU backend, the portable FMA kernel (wgpu: mesa's llvmpipe in CI) and the native CUDA
//! kernels (wgmma, HMMA, split-KV decode; skipped without a GPU) against the f64 reference; the
//! reference's own consistency; typed errors and capability refusals.

mod common;

use common::open;
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::reference::{attention_f64, ReferenceOutput};
use quattn::{inputs, AttentionProblem, CausalAlign, Device, Error, Family, HostSlice, Layout, PortableKind, Precision, Session, Strategy};

/// Random sinks around the logits' range (one per Q head), deterministic in `seed`.
fn sinks(heads: usize, seed: u64) -> Vec<f32> {
    inputs::normal_with_outliers(heads, seed).into_iter().map(|x| 2.0 * x).collect()
}

/// Runs `p` (with LSE) on `s` and checks O and LSE against the f64 reference on the inputs as
/// the plan's element type rounds them. Returns the reference for further checks.
fn check(s: &Session, p: &AttentionProblem, precision: Precision, seed: u64) -> ReferenceOutput {
    check_with(s, p, precision, Strategy::Auto, seed)
}

/// [`check`] with a chosen strategy.
fn check_with(s: &Session, p: &AttentionProblem, precision: Precision, strategy: Strategy, seed: u64) -> ReferenceOutput {
    let p = p.clone().with_lse(true);
    let plan = s.plan(&p, precision, strategy).unwrap_or_else(|e| panic!("plan {precision} {p:?}: {e}"));
    let (q, k, v) = inputs::qkv(&p, seed);
    let dt = precision.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let out = s.run(&plan, &q, &k, &v).unwrap_or_else(|e| panic!("run {precision} {p:?}: {e}"));
    let r = attention_f64(&p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{} {precision} {p:?}: {m:?} outside {tol:?}", plan.kernel);
    let lse = out.lse.as_ref().expect("LSE asked for");
    let lm = compare_lse(lse, &r.lse).unwrap_or_else(|| panic!("{} {p:?}: LSE infinities differ", plan.kernel));
    assert!(lm.max_abs <= tol.max_abs_rel, "{} {precision} {p:?}: LSE {lm:?}", plan.kernel);
    // Rows that see no key (of their own sequence's keys, for a paged cache): exactly O = 0 and
    // LSE = -inf (the outputs start poisoned).
    let os = p.o_strides();
    for b in 0..p.batch {
        let sp = p.sequence(b);
        for h in 0..p.q_heads {
            for i in (0..p.q_len).filter(|&i| sp.visible_keys(i) == 0) {
                assert!(out.o[os.offset(b, h, i)..][..p.v_head_dim].iter().all(|&x| x == 0.0), "{p:?}: row {i} not zero");
                assert_eq!(lse[(b * p.q_heads + h) * p.q_len + i], f32::NEG_INFINITY, "{p:?}: row {i}");
            }
        }
    }
    r
}

/// One problem per modifier and some combinations, with ragged lengths, GQA and both layouts.
fn cases() -> Vec<(&'static str, AttentionProblem)> {
    let base = AttentionProblem::new(2, 4, 37, 64).kv_heads(2).kv_len(70);
    vec![
        ("window both sides", base.clone().window(9, 3)),
        ("window left, causal", base.clone().window(12, -1).causal(true)),
        ("window right only", base.clone().window(-1, 5).layout(Layout::Bshd)),
        // Logits of scale 1 on unit-normal inputs are ~N(0, 64): the cap bends most of them.
        ("softcap", base.clone().scale(1.0).softcap(4.0)),
        ("sinks", base.clone().sinks(sinks(4, 5))),
        ("alibi", base.clone().alibi_slopes(AttentionProblem::standard_alibi_slopes(4)).causal(true)),
        ("top-left causal, kv longer", base.clone().causal(true).causal_align(CausalAlign::TopLeft)),
        ("top-left causal, q longer", base.clone().kv_len(20).causal(true).causal_align(CausalAlign::TopLeft)),
        (
            "everything",
            base.clone()
                .scale(0.5)
                .window(15, 2)
                .softcap(6.0)
                .sinks(sinks(4, 9))
                .alibi_slopes(AttentionProblem::standard_alibi_slopes(4))
                .causal_align(CausalAlign::TopLeft),
        ),
        // q_len > kv_len, bottom-right, a narrow window: the first rows see no key, sinks or not.
        ("empty rows", AttentionProblem::new(1, 2, 50, 32).kv_len(20).window(3, 0).sinks(vec![0.5, -1.0])),
    ]
}

#[test]
fn cpu_matches_the_reference_for_every_modifier() {
    let s = Session::new(Device::Cpu).unwrap();
    for (i, (name, p)) in cases().into_iter().enumerate() {
        for precision in [Precision::F32, Precision::F16_DEFAULT, Precision::BF16_DEFAULT] {
            println!("{name} {precision}");
            check(&s, &p, precision, 10 + i as u64);
        }
    }
}

#[test]
fn cpu_fp8_kernel_takes_modifiers() {
    // The CPU FP8 kernel shares the float kernel's row loop, modifiers included.
    use quattn::{DescaleGranularity, Fp8Format, PvFormat};
    let s = Session::new(Device::Cpu).unwrap();
    let p = AttentionProblem::new(1, 4, 40, 64).kv_len(90).window(20, -1).causal(true).softcap(8.0).sinks(sinks(4, 1));
    let precision = Precision::Fp8 { format: Fp8Format::E4M3, descale: DescaleGranularity::PerHead, p: PvFormat::F16 };
    check(&s, &p, precision, 77);
}

/// The reference's modifiers against what they must reduce to.
#[test]
fn reference_modifiers_reduce_to_plain_attention() {
    let p = AttentionProblem::new(2, 4, 33, 32).kv_heads(2).kv_len(47).layout(Layout::Bshd);
    let (q, k, v) = inputs::qkv(&p, 3);
    let run = |p: &AttentionProblem| attention_f64(p, &q, &k, &v).unwrap();
    let close = |a: &ReferenceOutput, b: &ReferenceOutput, tol: f64, what: &str| {
        let d = a.o.iter().zip(&b.o).chain(a.lse.iter().zip(&b.lse)).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(d <= tol, "{what}: differs by {d:e}");
    };
    for causal in [false, true] {
        let plain = run(&p.clone().causal(causal));
        // A cap far above every logit: tanh(x) = x - x³/3 + ..., so the change is ~s³/(3 cap²).
        close(&run(&p.clone().causal(causal).softcap(1e6)), &plain, 1e-9, "huge softcap");
        close(&run(&p.clone().causal(causal).window(47, 47)), &plain, 0.0, "window covering every key");
        close(&run(&p.clone().causal(causal).window(-1, -1)), &plain, 0.0, "unbounded window");
        close(&run(&p.clone().causal(causal).sinks(vec![f32::NEG_INFINITY; 4])), &plain, 0.0, "sinks of -inf");
        close(&run(&p.clone().causal(causal).alibi_slopes(vec![0.0; 4])), &plain, 0.0, "zero ALiBi slopes");
    }
    // A softcap that bends the logits changes the result (the check above is not vacuous).
    let bent = run(&p.clone().scale(1.0).softcap(2.0));
    let straight = run(&p.clone().scale(1.0));
    assert!(bent.lse.iter().zip(&straight.lse).any(|(a, b)| (a - b).abs() > 0.1));
    // Alignment matters only when q_len != kv_len.
    let sq = AttentionProblem::new(1, 2, 40, 32).causal(true).window(7, -1).alibi_slopes(vec![0.25, 0.5]);
    let (q2, k2, v2) = inputs::qkv(&sq, 4);
    let tl = attention_f64(&sq.clone().causal_align(CausalAlign::TopLeft), &q2, &k2, &v2).unwrap();
    let br = attention_f64(&sq, &q2, &k2, &v2).unwrap();
    assert_eq!(tl.o, br.o);
    assert_eq!(tl.lse, br.lse);
}

/// Closed forms: one key with a sink; ALiBi on two keys; top-left vs bottom-right rows.
#[test]
fn reference_closed_forms() {
    // One key of logit a and a sink c: O = v · e^a / (e^a + e^c), LSE = ln(e^a + e^c).
    let p = AttentionProblem::new(1, 1, 1, 1).kv_len(1).scale(1.0).sinks(vec![0.5]);
    let r = attention_f64(&p, &[2.0], &[1.5], &[4.0]).unwrap();
    let (a, c) = (3.0f64, 0.5f64);
    assert!((r.o[0] - 4.0 * a.exp() / (a.exp() + c.exp())).abs() < 1e-12);
    assert!((r.lse[0] - (a.exp() + c.exp()).ln()).abs() < 1e-12);
    // ALiBi, bottom-right, q_len 1, kv_len 2: a(0) = 1; key 0 gets -slope, key 1 gets 0.
    let p = AttentionProblem::new(1, 1, 1, 1).kv_len(2).scale(1.0).alibi_slopes(vec![0.75]);
    let r = attention_f64(&p, &[1.0], &[0.0, 0.0], &[10.0, 20.0]).unwrap();
    let w0 = (-0.75f64).exp() / ((-0.75f64).exp() + 1.0);
    assert!((r.o[0] - (10.0 * w0 + 20.0 * (1.0 - w0))).abs() < 1e-12);
    // Top-left causal, q_len 2 < kv_len 3: row 0 sees key 0 only (bottom-right: keys 0 and 1).
    let p = AttentionProblem::new(1, 1, 2, 1).kv_len(3).scale(1.0).causal(true);
    let (q, k, v) = ([0.0f32, 0.0], [0.0f32, 0.0, 0.0], [3.0f32, 5.0, 7.0]);
    let tl = attention_f64(&p.clone().causal_align(CausalAlign::TopLeft), &q, &k, &v).unwrap();
    let br = attention_f64(&p, &q, &k, &v).unwrap();
    assert_eq!(tl.o, vec![3.0, 4.0]);
    assert_eq!(br.o, vec![4.0, 5.0]);
    // Softcap: one key, the logit is cap · tanh(s / cap) exactly (LSE of one key).
    let p = AttentionProblem::new(1, 1, 1, 1).kv_len(1).scale(1.0).softcap(2.0);
    let r = attention_f64(&p, &[3.0], &[1.0], &[1.0]).unwrap();
    assert!((r.lse[0] - 2.0 * (1.5f64).tanh()).abs() < 1e-7);
}

/// `visible_range` is the contiguous form of `sees` (the mask's one definition), and `sees`
/// follows FlashAttention's window rule `a(i) - left <= j <= a(i) + right`.
#[test]
fn visible_range_is_the_mask() {
    for (q_len, kv_len) in [(5, 9), (9, 5), (7, 7), (1, 12)] {
        for align in [CausalAlign::BottomRight, CausalAlign::TopLeft] {
            for causal in [false, true] {
                for (left, right) in [(-1, -1), (0, 0), (2, -1), (-1, 3), (3, 1), (20, 20)] {
                    let p = AttentionProblem::new(1, 1, q_len, 8).kv_len(kv_len).causal(causal).causal_align(align).window(left, right);
                    for i in 0..q_len {
                        let a = match align {
                            CausalAlign::BottomRight => i as i64 + kv_len as i64 - q_len as i64,
                            CausalAlign::TopLeft => i as i64,
                        };
                        let want: Vec<usize> = (0..kv_len)
                            .filter(|&j| {
                                let j = j as i64;
                                (left < 0 || j >= a - left) && (right < 0 || j <= a + right) && (!causal || j <= a)
                            })
                            .collect();
                        let got: Vec<usize> = p.visible_range(i).collect();
                        let by_sees: Vec<usize> = (0..kv_len).filter(|&j| p.sees(i, j)).collect();
                        assert_eq!(got, want, "{p:?} row {i}");
                        assert_eq!(by_sees, want, "{p:?} row {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn invalid_modifiers_are_typed_errors_at_plan_time() {
    let s = Session::new(Device::Cpu).unwrap();
    let p = AttentionProblem::new(1, 4, 16, 32);
    let bad = [
        ("sliding window", p.clone().window(-2, 0)),
        ("sliding window", p.clone().window(3, -5)),
        ("sliding window", p.clone().window(1 << 40, 0)),
        ("softcap", p.clone().softcap(f32::NAN)),
        ("softcap", p.clone().softcap(f32::INFINITY)),
        ("softcap", p.clone().softcap(0.0)),
        ("softcap", p.clone().softcap(-3.0)),
        ("attention sinks", p.clone().sinks(vec![0.0; 3])),
        ("attention sinks", p.clone().sinks(vec![0.0, f32::NAN, 0.0, 0.0])),
        ("attention sinks", p.clone().sinks(vec![0.0, 0.0, f32::INFINITY, 0.0])),
        ("ALiBi slopes", p.clone().alibi_slopes(vec![0.5; 5])),
        ("ALiBi slopes", p.clone().alibi_slopes(vec![0.5, 0.5, 0.5, f32::NEG_INFINITY])),
    ];
    for (want, problem) in bad {
        for strategy in [Strategy::Auto, Strategy::Reference] {
            match s.plan(&problem, Precision::F32, strategy) {
                Err(Error::InvalidModifier { modifier, reason }) => {
                    assert_eq!(modifier, want, "{reason}");
                    assert!(!reason.is_empty());
                }
                other => panic!("{problem:?}: expected InvalidModifier({want}), got {other:?}"),
            }
        }
        // The reference refuses the same problems, with the same error.
        let n = |len| vec![0.0f32; len];
        assert!(matches!(
            attention_f64(&problem, &n(problem.q_len_elems()), &n(problem.k_len_elems()), &n(problem.v_len_elems())),
            Err(Error::InvalidModifier { .. })
        ));
    }
}

#[test]
fn families_without_modifiers_refuse_them_by_name() {
    let s = Session::new(Device::Cpu).unwrap();
    let p = AttentionProblem::new(1, 4, 16, 32);
    for (feature, problem) in [
        ("sliding window", p.clone().window(4, 0)),
        ("softcap", p.clone().softcap(30.0)),
        ("attention sinks", p.clone().sinks(vec![0.0; 4])),
        ("ALiBi", p.clone().alibi_slopes(AttentionProblem::standard_alibi_slopes(4))),
        ("top-left causal alignment", p.clone().kv_len(20).causal(true).causal_align(CausalAlign::TopLeft)),
    ] {
        // The emulations do not model the modifiers: a capability error naming it.
        match s.plan(&problem, Precision::F16_DEFAULT, Strategy::Reference) {
            Err(Error::UnsupportedFeature { feature: f, kernel }) => {
                assert_eq!(f, feature);
                assert!(kernel.contains("emulation"), "{kernel}");
            }
            other => panic!("{problem:?}: {other:?}"),
        }
        // The CPU kernel has them.
        assert_eq!(s.plan(&problem, Precision::F16_DEFAULT, Strategy::Auto).unwrap().family(), Family::Cpu);
    }
    // Top-left alignment changes nothing when q_len == kv_len or without a mask: no refusal.
    let same = p.clone().causal(true).causal_align(CausalAlign::TopLeft);
    assert!(same.modifiers().is_empty());
    assert!(s.plan(&same, Precision::F16_DEFAULT, Strategy::Reference).is_ok());
}

/// Top-left alignment moves the rows of a paged cache's shorter sequences even when `q_len`
/// equals the longest one: it counts as a modifier there (kernels without modifiers, which align
/// bottom-right per sequence, refuse it), and the CPU kernel matches the reference.
#[test]
fn top_left_alignment_counts_per_sequence() {
    let base = AttentionProblem::new(2, 2, 3, 32).causal(true).causal_align(CausalAlign::TopLeft);
    let ragged = base.clone().paged_kv(inputs::paged_kv(16, &[3, 2], 1, 0, 1));
    assert_eq!(ragged.kv_len, 3);
    assert_eq!(ragged.modifiers(), vec!["top-left causal alignment"]);
    let even = base.paged_kv(inputs::paged_kv(16, &[3, 3], 1, 0, 2));
    assert!(even.modifiers().is_empty());
    let s = Session::new(Device::Cpu).unwrap();
    assert!(matches!(s.plan(&ragged, Precision::F16_DEFAULT, Strategy::Reference), Err(Error::UnsupportedFeature { .. })));
    check(&s, &ragged, Precision::F32, 5);
}

/// The NaN policy follows the window: a NaN key poisons exactly the rows whose window holds it;
/// every other row is what it is without it.
#[test]
fn nan_poisons_only_the_rows_whose_window_sees_it() {
    let s = Session::new(Device::Cpu).unwrap();
    let p = AttentionProblem::new(1, 2, 30, 32).kv_len(30).window(3, 2).sinks(vec![0.0, 1.0]).with_lse(true);
    let plan = s.plan(&p, Precision::F32, Strategy::Auto).unwrap();
    let (q, mut k, v) = inputs::qkv(&p, 41);
    let bad = 12;
    for h in 0..2 {
        k[p.k_strides().offset(0, h, bad) + 5] = f32::NAN;
    }
    let out = s.run(&plan, &q, &k, &v).unwrap();
    let mut clean = k.clone();
    clean.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = 0.0);
    let r = attention_f64(&p, &q, &clean, &v).unwrap();
    let lse = out.lse.unwrap();
    for h in 0..2 {
        for i in 0..p.q_len {
            let row = &out.o[p.o_strides().offset(0, h, i)..][..32];
            let want = &r.o[p.o_strides().offset(0, h, i)..][..32];
            // Row i sees keys i-3 ..= i+2 (q_len == kv_len).
            if (i as i64 - 3..=i as i64 + 2).contains(&(bad as i64)) {
                assert!(row.iter().all(|x| x.is_nan()) && lse[h * 30 + i].is_nan(), "row {i} sees key {bad}");
            } else {
                assert!(row.iter().zip(want).all(|(a, b)| (*a as f64 - b).abs() < 1e-5), "row {i}");
            }
        }
    }
}

#[test]
fn standard_alibi_slopes_are_the_geometric_sequence() {
    let s = AttentionProblem::standard_alibi_slopes(8);
    assert_eq!(s, vec![0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]);
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;
    use quattn::cubecl::wgpu::WgpuRuntime;
    use quattn::{CubeclTensors, KernelId, WgpuAdapter};

    fn session() -> Option<Session> {
        open(Device::Wgpu(WgpuAdapter::Default))
    }

    /// Every modifier at once (one kernel compile on llvmpipe), GQA, q_len != kv_len, f32; then
    /// top-left causal with a left window and sinks in f16 over several query and key tiles.
    #[test]
    fn portable_kernel_matches_the_reference() {
        let Some(s) = session() else { return };
        let all = AttentionProblem::new(1, 4, 37, 64)
            .kv_heads(2)
            .kv_len(70)
            .scale(0.5)
            .window(15, 2)
            .softcap(6.0)
            .sinks(sinks(4, 21))
            .alibi_slopes(AttentionProblem::standard_alibi_slopes(4))
            .causal_align(CausalAlign::TopLeft);
        let plan = s.plan(&all, Precision::F32, Strategy::Auto).unwrap();
        assert_eq!(plan.family(), Family::Portable(PortableKind::Fma), "{}", plan.kernel);
        check(&s, &all, Precision::F32, 22);
        // The same kernel, bottom-right and with empty rows (q_len > kv_len).
        let wide = AttentionProblem { q_len: 90, ..all.clone() }.causal_align(CausalAlign::BottomRight).window(4, 0);
        assert!((0..90).any(|i| wide.visible_keys(i) == 0));
        check(&s, &wide, Precision::F32, 23);
        // A window wider than a query tile plus two key tiles: key tiles wholly inside every
        // row's window run without the mask (the modifiers still apply there).
        let inner = AttentionProblem { q_len: 64, kv_len: 300, ..all.clone() }.window(100, 100);
        check(&s, &inner, Precision::F32, 26);

        let causal = AttentionProblem::new(1, 2, 100, 64)
            .kv_len(230)
            .causal(true)
            .window(40, -1)
            .sinks(sinks(2, 24))
            .causal_align(CausalAlign::TopLeft)
            .layout(Layout::Bshd);
        let plan = s.plan(&causal, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        assert_eq!(plan.family(), Family::Portable(PortableKind::Fma), "{}", plan.kernel);
        check(&s, &causal, Precision::F16_DEFAULT, 25);
    }

    /// Families without modifiers refuse them by name; `Auto` falls back to the FMA kernel.
    #[test]
    fn other_portable_families_refuse_modifiers() {
        let Some(s) = session() else { return };
        let p = AttentionProblem::new(1, 2, 32, 64).window(8, 0);
        for kind in [PortableKind::Cmma, PortableKind::Mma, PortableKind::Int8, PortableKind::Fp8] {
            match s.plan(&p, Precision::F16_DEFAULT, Strategy::PortableFamily(kind)) {
                Err(Error::UnsupportedFeature { feature, .. }) => assert_eq!(feature, "sliding window"),
                other => panic!("{kind:?}: {other:?}"),
            }
        }
        // The f16-accumulating modes run on the packed-f16 kernel, which has no modifiers.
        let f16_acc = Precision::F16 { qk: quattn::QkAccum::F16, pv: quattn::PvAccum::F16PerTile };
        assert!(matches!(s.plan(&p, f16_acc, Strategy::Portable), Err(Error::UnsupportedFeature { .. })));
        assert!(matches!(s.plan(&p, f16_acc, Strategy::Auto), Err(Error::UnsupportedFeature { .. })));
    }

    /// Key tiles wholly outside every row's window are never loaded: NaN in K and V there (on
    /// device handles, which nothing screens) leaves the output finite and right, where a kernel
    /// that computed those tiles and discarded them would get `0 · NaN = NaN` in P·V. O starts
    /// poisoned with NaN, so every row must be written.
    #[test]
    fn window_skips_the_key_tiles_it_masks() {
        let Some(s) = session() else { return };
        let (q_len, kv_len, left) = (8, 300, 20);
        let p = AttentionProblem::new(1, 2, q_len, 64).kv_len(kv_len).causal(true).window(left as i64, -1).with_lse(true);
        let plan = s.plan(&p, Precision::F32, Strategy::Auto).unwrap();
        let KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Fma(tiles), .. } = &plan.kernel else {
            panic!("expected the FMA kernel, got {}", plan.kernel);
        };
        // Bottom-right: row 0 sees keys from kv_len - q_len - left on.
        let first_visible = kv_len - q_len - left;
        let first_tile_key = first_visible / tiles.bk as usize * tiles.bk as usize;
        assert!(first_tile_key >= tiles.bk as usize, "the case must leave at least one tile out");
        let (q, mut k, mut v) = inputs::qkv(&p, 31);
        let ks = p.k_strides();
        for h in 0..p.kv_heads {
            for j in 0..first_tile_key {
                k[ks.offset(0, h, j)..][..64].fill(f32::NAN);
                v[ks.offset(0, h, j)..][..64].fill(f32::NAN);
            }
        }
        let client = s.cubecl_client::<WgpuRuntime>().unwrap();
        let bytes = |x: &[f32]| x.iter().flat_map(|a| a.to_ne_bytes()).collect::<Vec<u8>>();
        let (qh, kh, vh) =
            (client.create_from_slice(&bytes(&q)), client.create_from_slice(&bytes(&k)), client.create_from_slice(&bytes(&v)));
        let oh = client.create_from_slice(&bytes(&vec![f32::NAN; p.o_len_elems()]));
        let lh = client.create_from_slice(&bytes(&vec![f32::NAN; p.lse_len_elems()]));
        s.run_cubecl::<WgpuRuntime>(&plan, CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) }).unwrap();
        let read = |h| -> Vec<f32> { bytemuck::pod_collect_to_vec(&client.read_one(h).unwrap()) };
        let (o, lse) = (read(oh), read(lh));
        assert!(o.iter().chain(&lse).all(|x| x.is_finite()), "a masked-out tile reached P·V, or a row was not written");
        // The reference reads only the keys each row sees.
        let r = attention_f64(&p, &q, &k, &v).unwrap();
        let m = ErrorMetrics::compare(&o, &r.o);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        assert!(Tolerance::for_precision(Precision::F32).accepts(&m, ref_max), "{m:?}");
        let lm = compare_lse(&lse, &r.lse).unwrap();
        assert!(lm.max_abs <= 1e-4, "{lm:?}");
    }

    use quattn_cubecl::{decode_candidates, DecodeTiles, DecodeTiling, PortableKernel};

    /// Sinks that weigh against hundreds of keys (a key's e^s is ~1.6 on average here), one per
    /// Q head: e^(5 ± 4).
    fn heavy_sinks(heads: usize, seed: u64) -> Vec<f32> {
        sinks(heads, seed).into_iter().map(|x| x + 5.0).collect()
    }

    /// Each modifier alone, then two combinations (names with a comma), on `base`.
    fn decode_cases(base: &AttentionProblem, seed: u64) -> Vec<(&'static str, AttentionProblem)> {
        let h = base.q_heads;
        let alibi = AttentionProblem::standard_alibi_slopes(h);
        vec![
            ("window left, causal", base.clone().causal(true).window(100, -1)),
            ("window both sides", base.clone().window(150, 20)),
            ("top-left causal", base.clone().causal(true).causal_align(CausalAlign::TopLeft)),
            ("top-left window right", base.clone().window(-1, 300).causal_align(CausalAlign::TopLeft)),
            ("softcap", base.clone().scale(1.0).softcap(8.0)),
            ("sinks", base.clone().sinks(heavy_sinks(h, seed))),
            ("alibi", base.clone().alibi_slopes(alibi.clone())),
            ("window, softcap, sinks", base.clone().window(200, 3).softcap(6.0).sinks(heavy_sinks(h, seed + 1))),
            ("alibi, top-left causal", base.clone().causal(true).alibi_slopes(alibi).causal_align(CausalAlign::TopLeft)),
        ]
    }

    /// Which decode kernel and split a case runs on.
    #[derive(Debug, Clone, Copy)]
    enum Run {
        /// Auto's choice: the row kernel (at most 8 packed rows) with the split it gives, which
        /// divides the keys the modifiers leave visible.
        Auto,
        /// The row kernel (`false`) or the smallest tile kernel (`true`) with splits of
        /// `n` tiles over the sequence (`None`: one split, which writes O directly and adds
        /// the sinks in the epilogue; several go through the merge, which adds them there).
        Forced(bool, Option<usize>),
    }

    /// The plan of `p` (Auto must pick the portable decode family's row kernel), run as `run`
    /// says.
    fn decode_plan(s: &Session, p: &AttentionProblem, precision: Precision, run: Run) -> quattn::Plan {
        let p = p.clone().with_lse(true);
        let mut plan = s.plan(&p, precision, Strategy::Auto).unwrap_or_else(|e| panic!("plan {precision} {p:?}: {e}"));
        assert_eq!(plan.family(), Family::Portable(PortableKind::Decode), "{p:?}: {}", plan.kernel);
        let KernelId::Portable { kernel: PortableKernel::Decode(t), name } = plan.kernel.clone() else { unreachable!() };
        assert!(matches!(t.tiling, DecodeTiling::Rows(_)), "{p:?}: {t}");
        let Run::Forced(tile, per) = run else { return plan };
        let (d, dv) = (p.head_dim as u32, p.v_head_dim as u32);
        let rows = (p.q_heads / p.kv_heads * p.q_len) as u32;
        let page = p.paged.as_ref().map_or(u32::MAX, |pg| pg.page_size as u32);
        let tiling = match tile {
            false => t.tiling,
            // The smallest tile kernel whose key tiles lie in a page: llvmpipe's 32 KiB.
            true => decode_candidates(rows, d, dv)
                .into_iter()
                .map(DecodeTiling::Tile)
                .filter(|&tiling| DecodeTiles { tiling, splits: 1, keys_per_split: 0 }.bk() <= page)
                .find(|&tiling| DecodeTiles { tiling, splits: 1, keys_per_split: 0 }.smem_bytes(d, dv, 4) <= 32 * 1024)
                .expect("a tile kernel for llvmpipe"),
        };
        let bk = DecodeTiles { tiling, splits: 1, keys_per_split: 0 }.bk() as usize;
        let tiles = p.kv_len.div_ceil(bk);
        let per = per.unwrap_or(tiles).min(tiles);
        let forced = DecodeTiles { tiling, splits: tiles.div_ceil(per) as u32, keys_per_split: (per * bk) as u32 };
        assert_eq!(forced.splits > 1, per < tiles);
        plan.kernel = KernelId::Portable { kernel: PortableKernel::Decode(forced), name };
        plan
    }

    /// Runs `plan` on device handles whose O and LSE hold NaN beforehand (every row must be
    /// written), Q/K/V in the plan's input type, and judges O and the LSE against the f64
    /// reference on the rounded inputs: the precision's tolerances, and rows that see no key
    /// (of their own sequence) exactly O = 0 and LSE = -inf.
    fn check_decode_plan(s: &Session, plan: &quattn::Plan, name: &str, k_nan_below: Option<usize>, seed: u64) {
        use half::f16;
        let p = &plan.problem;
        let client = s.cubecl_client::<WgpuRuntime>().unwrap();
        let dt = plan.precision.input_dtype();
        let (q, k, v) = inputs::qkv(p, seed);
        let (q, mut k, mut v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
        // The reference reads only the keys each row sees: NaN elsewhere must not reach O.
        let r = attention_f64(p, &q, &k, &v).unwrap();
        if let Some(lo) = k_nan_below {
            let (ks, vs) = (p.k_strides(), p.v_strides());
            for b in 0..p.batch {
                for h in 0..p.kv_heads {
                    for j in 0..lo.min(p.sequence(b).kv_len) {
                        let (k_at, v_at) = match &p.paged {
                            Some(pg) => (pg.offset(b, h, j, p.kv_heads, p.head_dim), pg.offset(b, h, j, p.kv_heads, p.v_head_dim)),
                            None => (ks.offset(b, h, j), vs.offset(b, h, j)),
                        };
                        k[k_at..][..p.head_dim].fill(f32::NAN);
                        v[v_at..][..p.v_head_dim].fill(f32::NAN);
                    }
                }
            }
        }
        let bytes = |x: &[f32]| -> Vec<u8> {
            match dt {
                quattn::Dtype::F16 => bytemuck::cast_slice(&x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>()).to_vec(),
                _ => bytemuck::cast_slice(x).to_vec(),
            }
        };
        let up = |x: &[f32]| client.create_from_slice(&bytes(x));
        let (qh, kh, vh) = (up(&q), up(&k), up(&v));
        let oh = up(&vec![f32::NAN; p.o_len_elems()]);
        let lh = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
        s.run_cubecl::<WgpuRuntime>(plan, CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) })
            .unwrap_or_else(|e| panic!("{name} {}: {e}", plan.kernel_name()));
        let raw = client.read_one(oh).unwrap();
        let o: Vec<f32> = match dt {
            quattn::Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(&raw).iter().map(|x| x.to_f32()).collect(),
            _ => bytemuck::pod_collect_to_vec(&raw),
        };
        let lse: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(lh).unwrap());
        let what = format!("{name} {} {:?}", plan.kernel_name(), plan.kernel);
        assert!(o.iter().all(|x| x.is_finite()), "{what}: a row left unwritten, or a key no row sees was read");
        let m = ErrorMetrics::compare(&o, &r.o);
        let tol = Tolerance::for_precision(plan.precision);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        assert!(tol.accepts(&m, ref_max), "{what}: {m:?} outside {tol:?}");
        let lm = compare_lse(&lse, &r.lse).unwrap_or_else(|| panic!("{what}: LSE infinities differ"));
        assert!(lm.max_abs <= tol.max_abs_rel, "{what}: LSE {lm:?}");
        let os = p.o_strides();
        for b in 0..p.batch {
            let sp = p.sequence(b);
            for h in 0..p.q_heads {
                for i in (0..p.q_len).filter(|&i| sp.visible_keys(i) == 0) {
                    assert!(o[os.offset(b, h, i)..][..p.v_head_dim].iter().all(|&x| x == 0.0), "{what}: sequence {b} row {i} not zero");
                    assert_eq!(lse[(b * p.q_heads + h) * p.q_len + i], f32::NEG_INFINITY, "{what}: sequence {b} row {i}");
                }
            }
        }
    }

    /// The portable decode kernels with every modifier alone and in combination, on a
    /// contiguous cache (GQA 4, two positions: 8 packed rows, ragged 700 keys, BSHD for half
    /// the cases): Auto picks the decode family; the row kernel at Auto's split and with one,
    /// the tile kernel with splits of two tiles and with one, against the f64 reference. Each
    /// modifier alone on one of them in turn (every kernel compile is seconds on llvmpipe), the
    /// combinations on all four.
    #[test]
    fn portable_decode_kernels_match_the_reference_for_every_modifier() {
        let Some(s) = session() else { return };
        let base = AttentionProblem::new(2, 8, 2, 64).kv_heads(2).kv_len(700);
        let runs = [Run::Auto, Run::Forced(false, None), Run::Forced(true, Some(2)), Run::Forced(true, None)];
        for (j, (name, p)) in decode_cases(&base, 40).into_iter().enumerate() {
            let p = if j % 2 == 1 { p.layout(Layout::Bshd) } else { p };
            let these = if name.contains(',') { &runs[..] } else { &runs[j % runs.len()..][..1] };
            for &run in these {
                let plan = decode_plan(&s, &p, Precision::F16_DEFAULT, run);
                check_decode_plan(&s, &plan, name, None, 50 + j as u64);
            }
        }
    }

    /// The same on paged caches: shuffled pages of 16 and 64 keys, ragged lengths (a long
    /// sequence, a short one, one key, none: rows of the last two that see nothing, splits of
    /// the shorter ones with no key), each sequence aligned at its own length. Pages of 16:
    /// each modifier alone on the row kernel at Auto's split or the tile kernel with splits of
    /// two tiles in turn, the combinations on both; pages of 64: the combinations on the row
    /// kernel with one split and splits of three tiles, and the tile kernel with one split.
    #[test]
    fn portable_decode_kernels_match_the_reference_for_every_modifier_on_paged_caches() {
        let Some(s) = session() else { return };
        let lens = [700usize, 57, 1, 0];
        for (i, ps) in [16usize, 64].into_iter().enumerate() {
            let base = AttentionProblem::new(lens.len(), 8, 2, 64).kv_heads(2).paged_kv(inputs::paged_kv(ps, &lens, 1, 3, 70 + i as u64));
            let runs: &[Run] = match ps {
                16 => &[Run::Auto, Run::Forced(true, Some(2))],
                _ => &[Run::Forced(false, None), Run::Forced(false, Some(3)), Run::Forced(true, None)],
            };
            for (j, (name, p)) in decode_cases(&base, 80 + i as u64).into_iter().enumerate() {
                let these = match (name.contains(','), ps) {
                    (true, _) => runs,
                    (false, 16) => &runs[j % 2..][..1],
                    (false, _) => &[],
                };
                for &run in these {
                    let plan = decode_plan(&s, &p, Precision::F16_DEFAULT, run);
                    check_decode_plan(&s, &plan, name, None, 90 + j as u64);
                }
            }
        }
    }

    /// Keys before every row's window are never read by the decode kernels (row and tile, one
    /// split and several, contiguous and paged): NaN in their K and V rows leaves every output
    /// finite and right, where a kernel that loaded them and masked their scores would get
    /// `0 · NaN = NaN` in P·V. The split of Auto divides the window's keys only: one split here.
    #[test]
    fn portable_decode_never_reads_keys_outside_every_window() {
        let Some(s) = session() else { return };
        let contiguous = AttentionProblem::new(1, 8, 2, 64).kv_heads(2).kv_len(2000).causal(true).window(90, -1).softcap(20.0);
        let paged = AttentionProblem::new(2, 8, 2, 64)
            .kv_heads(2)
            .causal(true)
            .window(90, -1)
            .paged_kv(inputs::paged_kv(64, &[2000, 1500], 0, 1, 5));
        for p in [contiguous, paged] {
            // Bottom-right at the longest length: the shorter sequence's window starts earlier.
            let lo = p.sequence(p.batch - 1).visible_range(0).start;
            assert!(lo > 1000, "{lo}");
            let auto = decode_plan(&s, &p, Precision::F16_DEFAULT, Run::Auto);
            let KernelId::Portable { kernel: PortableKernel::Decode(t), .. } = &auto.kernel else { unreachable!() };
            assert_eq!(t.splits, 1, "{}", auto.kernel);
            // NaN below the window's first tile of 64 keys (the tiles start at multiples of bk).
            let nan_below = lo / 64 * 64;
            for run in [Run::Auto, Run::Forced(false, Some(1)), Run::Forced(true, Some(1)), Run::Forced(true, None)] {
                let plan = decode_plan(&s, &p, Precision::F16_DEFAULT, run);
                check_decode_plan(&s, &plan, "window", Some(nan_below), 7);
            }
        }
    }
}

/// The native modifier variants against the f64 reference: the wgmma kernel (f16, compute
/// capability 9.0) and the HMMA kernel (bf16 under Auto, f16 forced): every case above at head
/// dim 64, and windows over many key tiles at head dim 128 (tiles outside every row's band
/// skipped, tiles inside it unmasked). Skips without a CUDA device.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use quattn::NativeKind;

    fn session() -> Option<Session> {
        let s = open(Device::Cuda(0))?;
        let probe = AttentionProblem::new(1, 2, 64, 64).window(8, 0);
        match s.plan(&probe, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Wgmma)) {
            Ok(_) => Some(s),
            Err(e) => {
                println!("SKIPPED: no wgmma on this CUDA device: {e}");
                None
            }
        }
    }

    fn wgmma(s: &Session, p: &AttentionProblem, seed: u64) {
        let plan = s.plan(p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        assert_eq!(plan.family(), Family::Native(NativeKind::Wgmma), "{} {p:?}", plan.kernel);
        check(s, p, Precision::F16_DEFAULT, seed);
    }

    #[test]
    fn wgmma_kernel_matches_the_reference() {
        let Some(s) = session() else { return };
        for (i, (name, p)) in cases().into_iter().enumerate() {
            if p.head_dim != 64 {
                continue;
            }
            println!("{name}");
            wgmma(&s, &p, 40 + i as u64);
        }
        let long = AttentionProblem::new(2, 8, 1000, 128).kv_heads(2).kv_len(3000);
        for (i, p) in [
            long.clone().causal(true).window(256, 0),
            long.clone().window(300, 200).layout(Layout::Bshd),
            long.clone().causal(true).causal_align(CausalAlign::TopLeft).sinks(sinks(8, 3)),
            long.clone().window(-1, 40).softcap(20.0).alibi_slopes(AttentionProblem::standard_alibi_slopes(8)),
            AttentionProblem::new(1, 4, 700, 128).kv_len(300).causal(true).window(100, 0).sinks(sinks(4, 4)),
        ]
        .iter()
        .enumerate()
        {
            wgmma(&s, p, 60 + i as u64);
        }
    }

    #[test]
    fn hmma_kernel_matches_the_reference() {
        let Some(s) = open(Device::Cuda(0)) else { return };
        let long = AttentionProblem::new(2, 8, 600, 128).kv_heads(2).kv_len(1500);
        let mut cases: Vec<AttentionProblem> = cases().into_iter().map(|(_, p)| p).filter(|p| p.head_dim == 64).collect();
        cases.extend([
            long.clone().causal(true).window(256, 0),
            long.clone().window(-1, 40).softcap(20.0).alibi_slopes(AttentionProblem::standard_alibi_slopes(8)).layout(Layout::Bshd),
            long.clone().causal(true).causal_align(CausalAlign::TopLeft).sinks(sinks(8, 3)),
        ]);
        for (i, p) in cases.iter().enumerate() {
            let plan = s.plan(p, Precision::BF16_DEFAULT, Strategy::Auto).unwrap();
            assert_eq!(plan.family(), Family::Native(NativeKind::Hmma), "{} {p:?}", plan.kernel);
            check(&s, p, Precision::BF16_DEFAULT, 80 + i as u64);
            check_with(&s, p, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Hmma), 90 + i as u64);
        }
        // The f16-accumulating modes have no modifier variant: a refusal by name.
        match s.plan(&cases[0], Precision::parse("f16-acc16").unwrap(), Strategy::Native(NativeKind::Hmma)) {
            Err(Error::UnsupportedFeature { kernel, .. }) => assert!(kernel.contains("f16 accumulation"), "{kernel}"),
            other => panic!("{:?}", other.map(|p| p.kernel)),
        }
    }

    /// The window-only HMMA variant (band, alignment and sinks without softcap or ALiBi, the
    /// plain kernel's 32-row tile): bf16 through Auto and f16 forced, hd64 and hd128, against
    /// f64. The bands are chosen so that CTAs have partly visible tiles above their whole ones
    /// (diagonal, sequence end), whole ones, and partly visible ones below (the window's left
    /// edge), or no whole tile at all (a window narrower than a tile), with row counts that are
    /// not multiples of the tile's rows.
    #[test]
    fn hmma_window_only_variant_matches_the_reference() {
        use quattn::KernelId;
        use quattn_native::{ModVariant, NativeKernelId};
        let Some(s) = open(Device::Cuda(0)) else { return };
        let d128 = |q_len, kv_len| AttentionProblem::new(2, 8, q_len, 128).kv_heads(2).kv_len(kv_len);
        let d64 = |q_len, kv_len| AttentionProblem::new(2, 4, q_len, 64).kv_heads(2).kv_len(kv_len);
        let cases = [
            d128(1000, 3000).causal(true).window(300, 0),
            d128(700, 700).window(200, 150).layout(Layout::Bshd),
            d128(1000, 3000).causal(true).window(20, 0).sinks(sinks(8, 6)),
            d128(900, 1300).causal(true).causal_align(CausalAlign::TopLeft).window(500, 0),
            d64(1000, 1700).causal(true).window(400, 0),
            d64(517, 517).window(150, 60).sinks(sinks(4, 7)),
            d64(1000, 1700).window(-1, 90).layout(Layout::Bshd),
        ];
        for (i, p) in cases.iter().enumerate() {
            for (precision, strategy) in [(Precision::BF16_DEFAULT, Strategy::Auto), (Precision::F16_DEFAULT, Strategy::Native(NativeKind::Hmma))] {
                let plan = s.plan(p, precision, strategy).unwrap();
                assert_eq!(plan.family(), Family::Native(NativeKind::Hmma), "{} {p:?}", plan.kernel);
                let KernelId::Native(choice) = &plan.kernel else { panic!("{}", plan.kernel) };
                let NativeKernelId::Hmma(c) = choice.kernel else { panic!("{}", plan.kernel) };
                assert_eq!(c.mods, Some(ModVariant::default()), "{}", plan.kernel);
                println!("{} {precision} {p:?}", plan.kernel);
                check_with(&s, p, precision, strategy, 120 + i as u64);
            }
        }
    }

    /// Past what the parameter block holds (128 Q heads), the wgmma row refuses and Auto moves
    /// on to a kernel with modifiers.
    #[test]
    fn wgmma_refuses_what_its_parameters_cannot_hold() {
        let Some(s) = session() else { return };
        let p = AttentionProblem::new(1, 130, 64, 64).kv_heads(2).alibi_slopes(AttentionProblem::standard_alibi_slopes(130));
        match s.plan(&p, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Wgmma)) {
            Err(Error::UnsupportedFeature { kernel, .. }) => assert!(kernel.contains("at most 128"), "{kernel}"),
            other => panic!("{:?}", other.map(|p| p.kernel)),
        }
        assert_ne!(s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap().family(), Family::Native(NativeKind::Wgmma));
    }
}

/// The native split-KV decode kernel's modifier variants against the f64 reference: decode
/// shapes (q_len 1 and 3, GQA 32/8 and 8/2, so each packed row of a CTA has its own Q head's
/// slope and sink and its own position), kv 5000 and paged caches of ragged lengths (pages of
/// 16 and 64 keys, positions measured per sequence), each modifier alone and all at once, f16
/// and bf16, at the split the device picks and at forced splits; Auto picks the kernel. Skips
/// without a CUDA device of compute capability 8.0 or newer.
#[cfg(feature = "cuda")]
mod cuda_decode {
    use super::*;
    use quattn::{KernelId, NativeKind};
    use quattn_native::{DecodeSplit, DecodeUnit, NativeKernelId};

    const DECODE: Strategy = Strategy::Native(NativeKind::Decode);

    /// A CUDA session whose decode kernel takes a plain decode shape (sm_80 or newer).
    fn session() -> Option<Session> {
        let s = open(Device::Cuda(0))?;
        let probe = AttentionProblem::new(1, 8, 1, 128).kv_heads(2).kv_len(256);
        match s.plan(&probe, Precision::F16_DEFAULT, DECODE) {
            Ok(_) => Some(s),
            Err(e) => {
                println!("SKIPPED: no native decode kernel on this CUDA device: {e}");
                None
            }
        }
    }

    /// Sinks that weigh against thousands of keys (a key's e^s is ~1.6 on average here, 5000
    /// keys sum to ~e^9), one per Q head: e^(6 ± 4).
    fn heavy_sinks(heads: usize, seed: u64) -> Vec<f32> {
        sinks(heads, seed).into_iter().map(|x| x + 6.0).collect()
    }

    /// The keys some position of `p` sees at its `kv_len` (the longest sequence of a paged
    /// cache), the range the kernel's splits divide.
    fn visible_span(p: &AttentionProblem) -> usize {
        let r: Vec<_> = (0..p.q_len).map(|i| p.visible_range(i)).filter(|r| !r.is_empty()).collect();
        match (r.iter().map(|r| r.start).min(), r.iter().map(|r| r.end).max()) {
            (Some(lo), Some(hi)) => hi - lo,
            _ => 0,
        }
    }

    /// The plan of `p` on the decode kernel (Auto must pick the same kernel) with, for `Some(n)`,
    /// its split replaced by about `n` splits of whole tiles over the visible keys.
    fn plan(s: &Session, p: &AttentionProblem, precision: Precision, splits: Option<u32>) -> quattn::Plan {
        let p = p.clone().with_lse(true);
        let auto = s.plan(&p, precision, Strategy::Auto).unwrap_or_else(|e| panic!("auto {precision} {p:?}: {e}"));
        assert_eq!(auto.family(), Family::Native(NativeKind::Decode), "{precision} {p:?}: Auto took {}", auto.kernel);
        let mut plan = s.plan(&p, precision, DECODE).unwrap_or_else(|e| panic!("decode {precision} {p:?}: {e}"));
        assert_eq!(plan.kernel, auto.kernel);
        let KernelId::Native(mut choice) = plan.kernel.clone() else { panic!("{}", plan.kernel) };
        let NativeKernelId::Decode(DecodeUnit::Attention(config)) = choice.kernel else { panic!("{}", plan.kernel) };
        assert!(config.mods.is_some(), "{}: not the modifier variant", plan.kernel);
        assert_eq!(config.paged, p.paged.is_some());
        let split = choice.split.expect("a decode plan records its split");
        let bn = config.tile().block_n as usize;
        let tiles = visible_span(&p).div_ceil(bn).max(1);
        // The device's split divides the visible keys only.
        assert!(split.splits as usize <= tiles && split.splits as usize * split.keys_per_split as usize >= visible_span(&p), "{split:?}");
        if let Some(n) = splits {
            let per = tiles.div_ceil(n as usize);
            choice.split = Some(DecodeSplit { splits: tiles.div_ceil(per) as u32, keys_per_split: (per * bn) as u32 });
            plan.kernel = KernelId::Native(choice);
        }
        plan
    }

    /// Runs `p` on the decode kernel at the device's split and at `forced` splits, in f16 and
    /// bf16, against the reference (`check_plan`: O, LSE, rows that see nothing exactly 0 and
    /// -inf).
    fn check_decode(s: &Session, name: &str, p: &AttentionProblem, forced: &[u32], seed: u64) {
        for precision in [Precision::F16_DEFAULT, Precision::BF16_DEFAULT] {
            for splits in std::iter::once(None).chain(forced.iter().map(|&n| Some(n))) {
                let plan = plan(s, p, precision, splits);
                println!("{name} {precision} {}", plan.kernel);
                check_plan(s, &plan, seed);
            }
        }
    }

    /// [`check_with`] on a given plan.
    fn check_plan(s: &Session, plan: &quattn::Plan, seed: u64) {
        let p = &plan.problem;
        let (q, k, v) = inputs::qkv(p, seed);
        let dt = plan.precision.input_dtype();
        let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
        let out = s.run(plan, &q, &k, &v).unwrap_or_else(|e| panic!("run {} {p:?}: {e}", plan.kernel));
        let r = attention_f64(p, &q, &k, &v).unwrap();
        judge(plan, &out.o, out.lse.as_deref().expect("LSE asked for"), &r);
    }

    /// O and LSE of `plan` against the reference `r`; rows that see no key exactly 0 and -inf.
    fn judge(plan: &quattn::Plan, o: &[f32], lse: &[f32], r: &ReferenceOutput) {
        let p = &plan.problem;
        let m = ErrorMetrics::compare(o, &r.o);
        let tol = Tolerance::for_precision(plan.precision);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        assert!(tol.accepts(&m, ref_max), "{} {p:?}: {m:?} outside {tol:?}", plan.kernel);
        let lm = compare_lse(lse, &r.lse).unwrap_or_else(|| panic!("{} {p:?}: LSE infinities differ", plan.kernel));
        assert!(lm.max_abs <= tol.max_abs_rel, "{} {p:?}: LSE {lm:?}", plan.kernel);
        let os = p.o_strides();
        for b in 0..p.batch {
            let sp = p.sequence(b);
            for h in 0..p.q_heads {
                for i in (0..p.q_len).filter(|&i| sp.visible_keys(i) == 0) {
                    assert!(o[os.offset(b, h, i)..][..p.v_head_dim].iter().all(|&x| x == 0.0), "{p:?}: sequence {b} row {i} not zero");
                    assert_eq!(lse[(b * p.q_heads + h) * p.q_len + i], f32::NEG_INFINITY, "{p:?}: sequence {b} row {i}");
                }
            }
        }
    }

    /// Each modifier alone and all at once on `base`, named.
    fn modifier_cases(base: &AttentionProblem, seed: u64) -> Vec<(&'static str, AttentionProblem)> {
        let h = base.q_heads;
        let alibi = AttentionProblem::standard_alibi_slopes(h);
        vec![
            ("window left, causal", base.clone().causal(true).window(700, -1)),
            ("window both sides", base.clone().window(900, 40)),
            ("top-left causal", base.clone().causal(true).causal_align(CausalAlign::TopLeft)),
            ("top-left window right", base.clone().window(-1, 2000).causal_align(CausalAlign::TopLeft)),
            ("softcap", base.clone().scale(1.0).softcap(8.0)),
            ("sinks", base.clone().sinks(heavy_sinks(h, seed))),
            ("alibi", base.clone().causal(true).alibi_slopes(alibi.clone())),
            (
                "everything",
                base.clone().scale(0.5).window(1500, 3).softcap(6.0).sinks(heavy_sinks(h, seed + 1)).alibi_slopes(alibi.clone()),
            ),
            (
                "everything, top-left",
                base.clone()
                    .causal(true)
                    .window(1200, -1)
                    .softcap(6.0)
                    .sinks(heavy_sinks(h, seed + 2))
                    .alibi_slopes(alibi)
                    .causal_align(CausalAlign::TopLeft),
            ),
        ]
    }

    #[test]
    fn decode_kernel_matches_the_reference_for_every_modifier() {
        let Some(s) = session() else { return };
        let shapes = [
            // GQA 32/8, one position, head dim 128, two sequences.
            AttentionProblem::new(2, 32, 1, 128).kv_heads(8).kv_len(5000),
            // GQA 32/8, three positions (12 packed rows), BSHD.
            AttentionProblem::new(1, 32, 3, 128).kv_heads(8).kv_len(5000).layout(Layout::Bshd),
            // GQA 8/2, three positions, head dim 64 (128-key tiles).
            AttentionProblem::new(1, 8, 3, 64).kv_heads(2).kv_len(5000),
        ];
        for (i, base) in shapes.iter().enumerate() {
            for (j, (name, p)) in modifier_cases(base, 10 * i as u64).into_iter().enumerate() {
                check_decode(&s, name, &p, &[3, 9], 100 + 10 * i as u64 + j as u64);
            }
        }
    }

    /// Paged caches: ragged lengths (one long, one short, one key, none) in pages of 16 and 64
    /// keys; each sequence measures positions against its own length, so the host's split
    /// (over the longest sequence's visible keys) leaves shorter sequences splits with no key,
    /// which must weigh nothing, and rows of the one-key and empty sequences see nothing.
    #[test]
    fn paged_decode_kernel_matches_the_reference_for_every_modifier() {
        let Some(s) = session() else { return };
        let lens = [5000usize, 777, 1, 0];
        for (i, page_size) in [16usize, 64].into_iter().enumerate() {
            for (q_heads, kv_heads, q_len) in [(32, 8, 1), (8, 2, 3)] {
                let base = AttentionProblem::new(lens.len(), q_heads, q_len, 128)
                    .kv_heads(kv_heads)
                    .paged_kv(inputs::paged_kv(page_size, &lens, 1, 3, 7 + i as u64));
                for (j, (name, p)) in modifier_cases(&base, 30 + i as u64).into_iter().enumerate() {
                    check_decode(&s, name, &p, &[5], 200 + 10 * i as u64 + j as u64);
                }
            }
        }
    }

    /// A window narrower than one split's keys (and than one tile): the split covers the visible
    /// keys only, one split, or two forced over its two tiles; a window that reaches past the
    /// sequence's start; rows that see no key (q_len > kv_len, bottom-right) with sinks.
    #[test]
    fn narrow_windows_and_rows_that_see_nothing() {
        let Some(s) = session() else { return };
        let narrow = AttentionProblem::new(1, 32, 3, 128).kv_heads(8).kv_len(5000).causal(true).window(40, -1);
        assert!(visible_span(&narrow) < 64);
        let plan = plan(&s, &narrow, Precision::F16_DEFAULT, None);
        let KernelId::Native(choice) = &plan.kernel else { unreachable!() };
        assert_eq!(choice.split.unwrap().splits, 1, "{}", plan.kernel);
        check_decode(&s, "narrow window", &narrow, &[], 300);
        let two_tiles = AttentionProblem::new(2, 8, 3, 128).kv_heads(2).kv_len(5000).causal(true).window(100, -1).sinks(heavy_sinks(8, 3));
        check_decode(&s, "window of two tiles", &two_tiles, &[2], 301);
        let start = AttentionProblem::new(1, 8, 3, 64).kv_heads(2).kv_len(5000).window(3, 20).causal_align(CausalAlign::TopLeft);
        check_decode(&s, "window at the start", &start, &[], 302);
        let empty = AttentionProblem::new(1, 8, 3, 64).kv_heads(2).kv_len(2).causal(true).sinks(heavy_sinks(8, 4));
        assert_eq!(empty.visible_keys(0), 0);
        check_decode(&s, "rows that see nothing", &empty, &[], 303);
    }

    /// Keys outside every position's window are never read: NaN there (K and V, in caller
    /// buffers, which nothing screens) leaves every output finite and right, where a kernel that
    /// loaded those keys and masked them would get `0 · NaN = NaN` in P·V. O and LSE start
    /// poisoned with NaN, so every row must be written. At the device's split and at three.
    #[test]
    fn keys_outside_every_window_are_never_read() {
        use half::f16;
        use quattn::cudarc::driver::CudaContext;
        use quattn::{CudaTensor, CudaTensorMut};
        let Some(s) = session() else { return };
        let p = AttentionProblem::new(1, 32, 3, 128).kv_heads(8).kv_len(5000).causal(true).window(300, -1).softcap(20.0).with_lse(true);
        let lo = (0..p.q_len).map(|i| p.visible_range(i).start).min().unwrap();
        assert!(lo > 4000);
        let (q, mut k, mut v) = inputs::qkv(&p, 61);
        let ks = p.k_strides();
        for h in 0..p.kv_heads {
            for j in 0..lo {
                k[ks.offset(0, h, j)..][..128].fill(f32::NAN);
                v[ks.offset(0, h, j)..][..128].fill(f32::NAN);
            }
        }
        let to_f16 = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
        let wide = |x: &[f16]| x.iter().map(|a| a.to_f32()).collect::<Vec<f32>>();
        let (hq, hk, hv) = (to_f16(&q), to_f16(&k), to_f16(&v));
        // The reference reads only the keys each row sees.
        let r = attention_f64(&p, &wide(&hq), &wide(&hk), &wide(&hv)).unwrap();
        let ctx = CudaContext::new(0).unwrap();
        let stream = ctx.new_stream().unwrap();
        let (dq, dk, dv) = (stream.clone_htod(&hq).unwrap(), stream.clone_htod(&hk).unwrap(), stream.clone_htod(&hv).unwrap());
        for splits in [None, Some(3)] {
            let plan = plan(&s, &p, Precision::F16_DEFAULT, splits);
            let mut d_o = stream.clone_htod(&vec![f16::NAN; p.o_len_elems()]).unwrap();
            let mut d_lse = stream.clone_htod(&vec![f32::NAN; p.lse_len_elems()]).unwrap();
            s.run_cuda(
                &plan,
                &stream,
                CudaTensor::new(&dq, &stream),
                CudaTensor::new(&dk, &stream),
                CudaTensor::new(&dv, &stream),
                CudaTensorMut::new(&mut d_o, &stream),
                Some(CudaTensorMut::new(&mut d_lse, &stream)),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", plan.kernel));
            let o = wide(&stream.clone_dtoh(&d_o).unwrap());
            let lse = stream.clone_dtoh(&d_lse).unwrap();
            assert!(o.iter().chain(&lse).all(|x| x.is_finite()), "{}: a key outside every window was read, or a row not written", plan.kernel);
            judge(&plan, &o, &lse, &r);
        }
    }

    /// Past what the parameter block holds (128 Q heads), the decode row refuses by name and
    /// Auto moves on to a kernel with modifiers.
    #[test]
    fn decode_refuses_what_its_parameters_cannot_hold() {
        let Some(s) = session() else { return };
        let p = AttentionProblem::new(1, 256, 1, 128).kv_heads(32).kv_len(4096).alibi_slopes(AttentionProblem::standard_alibi_slopes(256));
        match s.plan(&p, Precision::F16_DEFAULT, DECODE) {
            Err(Error::UnsupportedFeature { kernel, .. }) => assert!(kernel.contains("at most 128"), "{kernel}"),
            other => panic!("{:?}", other.map(|p| p.kernel)),
        }
        assert_ne!(s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap().family(), Family::Native(NativeKind::Decode));
    }
}
