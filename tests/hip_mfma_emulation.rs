//! The HIP kernels' index math and numerics, mirrored on the CPU (no AMD GPU exists here; the
//! kernels are compiled and disassembly-checked, never run).
//!
//! `quattn_native::hip::emulate_forward` runs `native/hip/fwd_mfma.hip` / `fwd_mfma_fp8.hip`'s
//! tile loop lane by lane: Qᵀ, K, Vᵀ and Pᵀ fragments gathered with the kernels' own index
//! expressions, every MFMA rebuilt from the lanes through the ISA operand layout (exact
//! products, one f32 rounding per MFMA), the MFMA shapes and tile sizes taken from the same
//! table that gives the kernels their `-D` defines. This test holds that mirror to the
//! independent f64 reference with the precision's tolerance, for every family, both targets,
//! both head dims, both FP8 MFMA forms (`32x32x16_fp8_fp8`, gfx950's `32x32x64_f8f6f4`), causal / GQA / ragged shapes (partial last query block and KV tile, rows that
//! see no key), and, for the FP8 family on gfx950 (whose e4m3 is the OCP one the facade's
//! emulation uses), to the facade's FP8 emulation.
//!
//! Where the kernel rounds differently from the mirror: `v_exp_f32` / `v_log_f32` are
//! approximate (~1 ulp) where the mirror uses the CPU's; the matrix core's internal sum order
//! inside one MFMA is not specified (the mirror rounds its exact sum once, which is at least as
//! precise). O is converted to the kernel's output type below before comparing.

use quattn::codec::float16::{round_bf16, round_f16};
use quattn::codec::fp8::{e4m3, e4m3fnuz, Saturation};
use quattn::emulation::{emulate, Blocking};
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::reference::attention_f64;
use quattn::{AttentionProblem, DescaleGranularity, Dtype, Fp8Format, Precision, PvFormat};
use quattn_native::hip::{emulate_forward, EmulatedHead, Fp8Encoding, Fp8Mfma, GfxArch, HipFp8P, HipKernelId, MfmaConfig, MfmaFp8Config};

/// Ragged lengths (partial last query block of the 128-row workgroup and last 64-key tile),
/// several KV tiles, GQA, causal with q_len > kv_len (leading rows see no key) and < kv_len.
fn problems(hd: usize) -> Vec<AttentionProblem> {
    vec![
        AttentionProblem::new(1, 4, 150, hd).kv_heads(2).kv_len(203),
        AttentionProblem::new(1, 2, 150, hd).kv_heads(1).kv_len(203).causal(true),
        AttentionProblem::new(2, 2, 133, hd).kv_heads(2).kv_len(70).causal(true).with_lse(true),
    ]
}

/// One (b, h) slice `[len, d]` of a BHSD tensor.
fn head<'a>(x: &'a [f32], b: usize, heads: usize, h: usize, len: usize, d: usize) -> &'a [f32] {
    &x[((b * heads + h) * len) * d..][..len * d]
}

fn round_e4m3(x: f32) -> f32 {
    e4m3::decode(e4m3::encode(x, Saturation::Saturate))
}
fn round_e4m3fnuz(x: f32) -> f32 {
    e4m3fnuz::decode(e4m3fnuz::encode(x, Saturation::Saturate))
}

/// The device's e4m3 codes of `x / descale` (descale = amax / max over the slice), decoded,
/// and the descale: the FP8 family's per-head quantization on `enc`.
fn quantize_head(x: &[f32], enc: Fp8Encoding) -> (Vec<f32>, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = if amax > 0.0 { amax / enc.max() } else { 1.0 };
    let round = match enc {
        Fp8Encoding::E4m3Fn => round_e4m3,
        Fp8Encoding::E4m3Fnuz => round_e4m3fnuz,
    };
    (x.iter().map(|&v| round(v / d)).collect(), d)
}

/// O `[b, h, q, d]` and LSE `[b, h, q]` of the mirror over every head.
fn mirror(p: &AttentionProblem, id: HipKernelId, arch: GfxArch, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (d, hq, hk) = (p.head_dim, p.q_heads, p.kv_heads);
    let group = hq / hk;
    let (round_p, round_out): (fn(f32) -> f32, fn(f32) -> f32) = match id {
        HipKernelId::Mfma(MfmaConfig { input: Dtype::Bf16, .. }) => (round_bf16, round_bf16),
        HipKernelId::Mfma(_) => (round_f16, round_f16),
        HipKernelId::MfmaFp8(c) => (
            match (c.p, arch.fp8()) {
                (HipFp8P::F16, _) => round_f16,
                (HipFp8P::Fp8, Fp8Encoding::E4m3Fn) => round_e4m3,
                (HipFp8P::Fp8, Fp8Encoding::E4m3Fnuz) => round_e4m3fnuz,
            },
            if c.out == Dtype::Bf16 { round_bf16 } else { round_f16 },
        ),
    };
    let kern = id.emulated(arch, round_p);
    let mut o = vec![0f32; p.batch * hq * p.q_len * d];
    let mut lse = vec![0f32; p.batch * hq * p.q_len];
    for b in 0..p.batch {
        for h in 0..hq {
            let (qh, kh, vh) = (head(q, b, hq, h, p.q_len, d), head(k, b, hk, h / group, p.kv_len, d), head(v, b, hk, h / group, p.kv_len, d));
            let scale_log2 = p.softmax_scale() * std::f32::consts::LOG2_E;
            let (qv, kv, vv, c_log2, o_factor) = match id {
                HipKernelId::Mfma(c) => {
                    let r = if c.input == Dtype::Bf16 { round_bf16 } else { round_f16 };
                    let rv = |x: &[f32]| x.iter().map(|&a| r(a)).collect::<Vec<f32>>();
                    (rv(qh), rv(kh), rv(vh), scale_log2, 1.0)
                }
                HipKernelId::MfmaFp8(_) => {
                    // The backend quantizes the f16 values a device receives, as the facade's
                    // FP8 emulation does.
                    let q16 = |x: &[f32]| x.iter().map(|&a| round_f16(a)).collect::<Vec<f32>>();
                    let enc = arch.fp8();
                    let ((qc, qd), (kc, kd), (vc, vd)) = (quantize_head(&q16(qh), enc), quantize_head(&q16(kh), enc), quantize_head(&q16(vh), enc));
                    (qc, kc, vc, scale_log2 * (qd * kd), vd)
                }
            };
            let out = emulate_forward(
                &EmulatedHead { q: &qv, k: &kv, v: &vv, q_len: p.q_len, kv_len: p.kv_len, head_dim: d, c_log2, o_factor, causal: p.causal },
                &kern,
            );
            let base = (b * hq + h) * p.q_len;
            for (i, x) in out.o.iter().enumerate() {
                o[base * d + i] = round_out(*x);
            }
            lse[base..base + p.q_len].copy_from_slice(&out.lse);
        }
    }
    (o, lse)
}

fn precision_of(id: HipKernelId) -> Precision {
    match id {
        HipKernelId::Mfma(MfmaConfig { input: Dtype::Bf16, .. }) => Precision::BF16_DEFAULT,
        HipKernelId::Mfma(_) => Precision::F16_DEFAULT,
        HipKernelId::MfmaFp8(c) => Precision::Fp8 {
            format: Fp8Format::E4M3,
            descale: DescaleGranularity::PerHead,
            p: if c.p == HipFp8P::Fp8 { PvFormat::Fp8 } else { PvFormat::F16 },
        },
    }
}

fn check(id: HipKernelId, arch: GfxArch) {
    for (n, p) in problems(id.head_dim()).iter().enumerate() {
        let (q, k, v) = quattn::inputs::qkv(p, 17 + n as u64);
        let precision = precision_of(id);
        // The reference sees what the kernel receives for the 16-bit family (inputs rounded to
        // the type), the unquantized inputs for FP8 (its tolerance covers the quantization).
        let rounded = |x: &[f32]| -> Vec<f32> {
            match precision {
                Precision::Bf16 { .. } => x.iter().map(|&a| round_bf16(a)).collect(),
                Precision::F16 { .. } => x.iter().map(|&a| round_f16(a)).collect(),
                _ => x.to_vec(),
            }
        };
        let reference = attention_f64(p, &rounded(&q), &rounded(&k), &rounded(&v)).expect("reference");
        let (o, lse) = mirror(p, id, arch, &q, &k, &v);
        let tol = Tolerance::for_precision(precision);
        let ref_max = reference.o.iter().fold(0f64, |m, x| m.max(x.abs()));
        let m = ErrorMetrics::compare(&o, &reference.o);
        let what = format!("{id} on {arch}, problem {n} {p:?}");
        assert!(tol.accepts(&m, ref_max), "{what}: O {m:?} outside {tol:?}");
        // Rows that see no key: O = 0 and LSE = -inf exactly, as the reference.
        let l = compare_lse(&lse, &reference.lse).unwrap_or_else(|| panic!("{what}: LSE -inf rows differ from the reference"));
        assert!(l.max_abs < 20.0 * tol.max_rel_l2, "{what}: LSE {l:?}");
        // The error is the precision's, not an f32 path in disguise.
        if matches!(precision, Precision::Fp8 { .. }) {
            assert!(m.rel_l2 > 1e-3, "{what}: FP8 error {m:?} is too small to be quantized");
        }
        // gfx950's e4m3 is OCP: the facade's FP8 emulation quantizes the same f16 values the
        // same way (per-head descales = amax / 448, RNE, P = e4m3(448 p) against the running
        // max of the same 64-key tiles); only the order of f32 sums and the MFMA's single
        // rounding differ, so both agree to within the bf16 rounding of O (2⁻⁸ relative)
        // except where a P value sits within an f32 rounding of an e4m3 rounding boundary.
        if arch == GfxArch::Gfx950 {
            if let HipKernelId::MfmaFp8(c) = id {
                let e = emulate(p, precision, &Blocking::default(), &q, &k, &v).expect("emulation");
                let out_round: fn(f32) -> f32 = if c.out == Dtype::Bf16 { round_bf16 } else { round_f16 };
                let e_o: Vec<f64> = e.o.iter().map(|&x| out_round(x) as f64).collect();
                let d = ErrorMetrics::compare(&o, &e_o);
                let bound = 2f64.powi(-8);
                assert!(d.rel_l2 < bound, "{what}: mirror vs facade emulation {d:?}");
            }
        }
    }
}

#[test]
fn mfma_16bit_mirror_meets_the_f16_and_bf16_tolerances() {
    for arch in GfxArch::ALL {
        for hd in [64, 128] {
            for input in [Dtype::F16, Dtype::Bf16] {
                check(HipKernelId::Mfma(MfmaConfig { head_dim: hd, input }), arch);
            }
        }
    }
}

#[test]
fn mfma_fp8_mirror_meets_the_fp8_tolerance_with_both_p_formats() {
    for mfma in [Fp8Mfma::X16, Fp8Mfma::X64] {
        for hd in [64, 128] {
            for p in [HipFp8P::Fp8, HipFp8P::F16] {
                let id = HipKernelId::MfmaFp8(MfmaFp8Config { head_dim: hd, p, out: Dtype::Bf16, mfma });
                for &arch in id.targets() {
                    check(id, arch);
                }
            }
        }
    }
}

/// The test can fail: pairing P's keys with the wrong V rows (the C-layout row of register
/// r0 + i taken for the B-layout k index g·KPL + i) breaks the result by far more than the
/// tolerance.
#[test]
fn a_wrong_key_pairing_is_caught() {
    let p = AttentionProblem::new(1, 1, 64, 64).kv_len(96);
    let (q, k, v) = quattn::inputs::qkv(&p, 3);
    let reference = attention_f64(&p, &q, &k, &v).expect("reference");
    // Permute V within each 32-key group the way a B-order (not C-order) read would see it.
    let mut v_bad = v.clone();
    for key in 0..p.kv_len {
        let (t, j) = (key / 32, key % 32);
        let (g, r) = ((j / 4) % 2, (j / 8) * 4 + j % 4);
        let src = 32 * t + (g * 16 + r) % 32;
        if src < p.kv_len {
            v_bad[key * 64..][..64].copy_from_slice(&v[src * 64..][..64]);
        }
    }
    let id = HipKernelId::Mfma(MfmaConfig { head_dim: 64, input: Dtype::F16 });
    let (o, _) = mirror(&p, id, GfxArch::Gfx950, &q, &k, &v_bad);
    let m = ErrorMetrics::compare(&o, &reference.o);
    let tol = Tolerance::for_precision(Precision::F16_DEFAULT);
    assert!(m.rel_l2 > 10.0 * tol.max_rel_l2, "{m:?}");
}

/// Without ROCm (CI, this machine) a HIP session is a typed error naming why, never a panic,
/// and `Device::Auto` still opens a device.
#[test]
fn hip_without_rocm_is_device_unavailable() {
    match quattn::Session::new(quattn::Device::Hip(0)) {
        Err(quattn::Error::DeviceUnavailable { device, reason }) => {
            assert_eq!(device, quattn::Device::Hip(0));
            assert!(!reason.is_empty());
            eprintln!("hip:0 unavailable: {reason}");
        }
        Err(e) => panic!("expected DeviceUnavailable, got {e}"),
        Ok(s) => eprintln!("skipped: a HIP device is present here ({})", s.info().adapter),
    }
    // An ordinal past any machine's device count is unavailable with or without ROCm.
    assert!(matches!(quattn::Session::new(quattn::Device::Hip(1 << 20)), Err(quattn::Error::DeviceUnavailable { .. })));
    assert!(quattn::Session::new(quattn::Device::Auto).is_ok());
}
