//! The portable 4-bit kernel on a wgpu adapter (mesa's software Vulkan in CI): `Precision::Nvfp4`
//! plans on it, its output against the f64 reference (the mode's tolerance) and against the CPU
//! emulation with the kernel's tiles (the same codes and the same P rounding, so what is left is
//! f32 summation order and the exp implementation); `Precision::Mxfp4` the same way, and its
//! plan's kernel launched on codes the CPU codec quantizes, into a NaN-poisoned O, against the
//! facade bit for bit; MXFP4 Q/K through the crate's launch; the typed errors.

mod common;

use cubecl::wgpu::WgpuRuntime;
use quattn::codec::fp4::{e2m1, e8m0};
use quattn::codec::mxfp4::Mxfp4Tensor;
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{cubecl, inputs, reference, AttentionProblem, Device, Error, Family, Layout, Nvfp4V, PortableKind, Precision, Session, Strategy, WgpuAdapter};
use quattn_cubecl::{Fp4Format, Fp4Operands, Fp4V, LaunchError};

fn session() -> Option<Session> {
    common::open(Device::Wgpu(WgpuAdapter::Default))
}

#[test]
fn nvfp4_plans_on_the_4bit_kernel_and_follows_its_emulation() {
    let Some(s) = session() else { return };
    let cases = [
        (AttentionProblem::new(1, 4, 5, 64).kv_heads(2).kv_len(100), Nvfp4V::Bf16, false),
        (AttentionProblem::new(1, 4, 5, 64).kv_heads(2).kv_len(100), Nvfp4V::Nvfp4, true),
        (AttentionProblem::new(1, 4, 5, 64).kv_heads(2).kv_len(100), Nvfp4V::Nvfp4P16, false),
        (AttentionProblem::new(1, 4, 37, 128).kv_heads(2).kv_len(61).causal(true), Nvfp4V::Nvfp4P16, true),
        (AttentionProblem::new(2, 2, 33, 64).kv_len(50).causal(true).layout(Layout::Bshd), Nvfp4V::Bf16, true),
    ];
    for (i, (p, v, smooth_k)) in cases.into_iter().enumerate() {
        let p = p.with_lse(true);
        let prec = Precision::Nvfp4 { v, smooth_k };
        let plan = s.plan(&p, prec, Strategy::Auto).unwrap_or_else(|e| panic!("plan {prec} {p:?}: {e}"));
        assert_eq!(plan.family(), Family::Portable(PortableKind::Fp4), "{}", plan.kernel);
        let (q, k, vv) = inputs::qkv(&p, 1500 + i as u64);
        let out = s.run(&plan, &q, &k, &vv).unwrap();
        assert!(out.o.iter().all(|x| x.is_finite()), "{}: non-finite O", plan.kernel);
        let r = reference::attention_f64(&p, &q, &k, &vv).unwrap();
        let m = ErrorMetrics::compare(&out.o, &r.o);
        let tol = Tolerance::for_precision(prec);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        assert!(tol.accepts(&m, ref_max), "{} {p:?}: {m:?} vs {tol:?}", plan.kernel);
        // The emulation with the kernel's tiles quantizes Q, K (and V, P) to the same codes; the
        // products are exact on both sides, so only f32 sums and exp differ (relative ~1e-6),
        // unless a probability lands within an ulp of a rounding boundary of bf16 or E2M1 and
        // rounds the other way: one element of one row, far below this bound.
        let emu = quattn::emulation::emulate(&p, prec, &plan.blocking.unwrap(), &q, &k, &vv).unwrap();
        let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
        let me = ErrorMetrics::compare(&out.o, &e);
        assert!(me.rel_l2 < 1e-4, "{} {p:?}: kernel vs emulation {me:?} (vs f64: {m:?})", plan.kernel);
        let el: Vec<f64> = emu.lse.iter().map(|&x| x as f64).collect();
        let lm = compare_lse(out.lse.as_ref().unwrap(), &el).expect("LSE infinities match");
        assert!(lm.max_abs < 1e-4, "{} LSE vs emulation {lm:?}", plan.kernel);
    }
}

/// NVFP4 V with f16 P (`nvfp4-v4p16`) on the portable 4-bit kernel: its own kernel variant
/// (`v4p16` in the name), the same V buffers as `nvfp4-v4`; against attention in f64 on the
/// decoded Q, K and V codes only P's f16 rounding is left (NVFP4 P leaves its 4-bit error), so
/// against f64 on the inputs it is the closer of the two; each follows its own emulation.
#[test]
fn f16_p_with_nvfp4_v_is_closer_to_f64_than_nvfp4_p() {
    let Some(s) = session() else { return };
    let shapes = [
        AttentionProblem::new(1, 4, 5, 64).kv_heads(2).kv_len(100),
        AttentionProblem::new(1, 2, 40, 128).kv_len(333).causal(true),
    ];
    for (si, p) in shapes.into_iter().enumerate() {
        let p = p.with_lse(true);
        let (q, k, v) = inputs::qkv(&p, 2100 + si as u64);
        let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
        let (dq, dk, dv) = common::nvfp4_v_decoded(&p, &q, &k, &v);
        let rd = reference::attention_f64(&p, &dq, &dk, &dv).unwrap();
        let run = |v_fmt| {
            let prec = Precision::Nvfp4 { v: v_fmt, smooth_k: false };
            let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
            assert_eq!(plan.family(), Family::Portable(PortableKind::Fp4), "{}", plan.kernel);
            let quattn::KernelId::Portable { kernel, .. } = &plan.kernel else { panic!("{}", plan.kernel) };
            let quattn_cubecl::PortableKernel::Fp4(t) = kernel else { panic!("{}", plan.kernel) };
            let want = if v_fmt == Nvfp4V::Nvfp4P16 { Fp4V::Nvfp4P16 } else { Fp4V::Nvfp4 };
            assert_eq!(t.v, want, "{}", plan.kernel);
            let out = s.run(&plan, &q, &k, &v).unwrap();
            let emu = quattn::emulation::emulate(&p, prec, &plan.blocking.unwrap(), &q, &k, &v).unwrap();
            let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
            let me = ErrorMetrics::compare(&out.o, &e);
            assert!(me.rel_l2 < 1e-4, "{} shape {si}: kernel vs emulation {me:?}", plan.kernel);
            let m = ErrorMetrics::compare(&out.o, &r.o);
            let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
            let tol = Tolerance::for_precision(prec);
            assert!(tol.accepts(&m, ref_max), "{} shape {si}: {m:?} vs {tol:?}", plan.kernel);
            (kernel.name(), m, ErrorMetrics::compare(&out.o, &rd.o))
        };
        let (n4, p4, p4_codes) = run(Nvfp4V::Nvfp4);
        let (n16, p16, p16_codes) = run(Nvfp4V::Nvfp4P16);
        assert!(n16.contains("nvfp4_v4p16_") && n4.contains("nvfp4_v4_"), "{n4} / {n16}");
        println!("shape {si}: vs f64 rel-L2 {n4} {:.4}, {n16} {:.4}; vs f64 on the codes {:.2e} / {:.2e}", p4.rel_l2, p16.rel_l2, p4_codes.rel_l2, p16_codes.rel_l2);
        assert!(p16_codes.rel_l2 < 1e-3, "shape {si}: f16 P vs attention on the codes {p16_codes:?}");
        assert!(p4_codes.rel_l2 > 20.0 * p16_codes.rel_l2, "shape {si}: NVFP4 P {p4_codes:?} vs f16 P {p16_codes:?}");
        assert!(p16.rel_l2 < p4.rel_l2 && p16.cos_sim > p4.cos_sim, "shape {si}: f16 P {p16:?} vs NVFP4 P {p4:?}");
    }
}

/// Q and K in MXFP4 (E8M0 per 32) through `launch_fp4` on codes quantized by the CPU codec, bf16
/// V, into an O and LSE filled with NaN: every element is written, and the result is attention
/// over the decoded values with P rounded to bf16 (relative error ≤ 2^-9 per probability).
#[test]
fn mxfp4_codes_through_the_launch_write_every_output() {
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let p = AttentionProblem::new(1, 2, 7, 64).kv_len(45).with_lse(true);
    let shape = p.shape();
    let kernel = quattn_cubecl::select_fp4(&client, &shape, Fp4Format::Mxfp4, Fp4V::Bf16).unwrap();
    let (q, k, v) = inputs::qkv(&p, 77);
    // BHSD inputs are dense rows already.
    let tq = Mxfp4Tensor::quantize(&q, p.batch * p.q_heads * p.q_len, p.head_dim).unwrap();
    let tk = Mxfp4Tensor::quantize(&k, p.batch * p.kv_heads * p.kv_len, p.head_dim).unwrap();
    let vb: Vec<f32> = v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
    let v_bits: Vec<u8> = vb.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect();
    let words = |b: &[u8]| {
        let mut b = b.to_vec();
        b.resize(b.len().next_multiple_of(4).max(4), 0);
        client.create_from_slice(&b)
    };
    let (hq, hqs, hk, hks, hv) = (words(&tq.packed), words(&tq.scales), words(&tk.packed), words(&tk.scales), words(&v_bits));
    let none = words(&[]);
    let ts = client.create_from_slice(bytemuck::cast_slice(&[1.0f32]));
    let o = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.o_len_elems()]));
    let lse = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
    let ops = Fp4Operands { q: &hq, q_scales: &hqs, k: &hk, k_scales: &hks, v: &hv, v_scales: &none, tensor_scales: [&ts; 3], lse_shift: None };
    quattn_cubecl::launch_fp4(&client, &kernel, &shape, ops, &o, Some(&lse)).unwrap();
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(o).unwrap());
    let got_lse: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(lse).unwrap());
    assert!(got.iter().chain(&got_lse).all(|x| x.is_finite()), "an output element was not written");
    // The decoded codes, by the codec's own element and scale decoders.
    let decode = |t: &Mxfp4Tensor| -> Vec<f32> {
        (0..t.rows * t.cols).map(|i| e2m1::decode(t.code(i / t.cols, i % t.cols)) * e8m0::decode(t.scales[i / 32])).collect()
    };
    let (dq, dk) = (decode(&tq), decode(&tk));
    assert_eq!(dq, tq.dequantize());
    let r = reference::attention_f64(&p, &dq, &dk, &vb).unwrap();
    let m = ErrorMetrics::compare(&got, &r.o);
    assert!(m.rel_l2 < 2f64.powi(-9), "MXFP4 kernel vs f64 on the decoded values: {m:?}");
    let rl = compare_lse(&got_lse, &r.lse).expect("LSE infinities match");
    assert!(rl.max_abs < 1e-4, "LSE {rl:?}");
}

#[test]
fn typed_errors_of_the_4bit_path() {
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    // Operands smaller than their layouts are refused before anything is enqueued.
    let p = AttentionProblem::new(1, 1, 4, 64).kv_len(16);
    let shape = p.shape();
    let kernel = quattn_cubecl::select_fp4(&client, &shape, Fp4Format::Nvfp4, Fp4V::Nvfp4).unwrap();
    let small = client.create_from_slice(&[0u8; 4]);
    let o = client.empty(p.o_len_elems() * 4);
    let ops = Fp4Operands { q: &small, q_scales: &small, k: &small, k_scales: &small, v: &small, v_scales: &small, tensor_scales: [&small; 3], lse_shift: None };
    let e = quattn_cubecl::launch_fp4(&client, &kernel, &shape, ops, &o, None).unwrap_err();
    assert!(matches!(e, LaunchError::BufferTooSmall { tensor: "q codes", .. }), "{e}");
    // The float launch refuses the 4-bit kernel.
    let e = quattn_cubecl::launch(&client, &kernel, &shape, quattn::Dtype::F32, &o, &o, &o, &o, None).unwrap_err();
    assert!(matches!(e, LaunchError::WrongKernel { .. }), "{e}");
    // Through the facade: a head dim the portable kernels lack is a typed error, not a panic.
    let bad = AttentionProblem::new(1, 1, 4, 48).kv_len(16);
    let e = s.plan(&bad, Precision::NVFP4_DEFAULT, Strategy::PortableFamily(PortableKind::Fp4)).unwrap_err();
    assert!(matches!(e, Error::UnsupportedHeadDim { .. } | Error::UnsupportedStrategy { .. }), "{e}");
    // The 4-bit family takes only the 4-bit modes.
    let e = s.plan(&p, Precision::F16_DEFAULT, Strategy::PortableFamily(PortableKind::Fp4)).unwrap_err();
    assert!(matches!(e, Error::UnsupportedStrategy { .. }), "{e}");
    // MXFP4 scales blocks of 32 along the head dim: a head dim that is not a multiple is the
    // typed error the CPU gives, in Auto and forced.
    let hd48 = AttentionProblem::new(1, 1, 4, 48).kv_len(16);
    for strategy in [Strategy::Auto, Strategy::PortableFamily(PortableKind::Fp4)] {
        match s.plan(&hd48, Precision::Mxfp4 { smooth_k: false }, strategy) {
            Err(Error::UnsupportedHeadDim { head_dim: 48, path, .. }) => assert!(path.contains("MXFP4"), "{path}"),
            other => panic!("{strategy:?}: {:?}", other.map(|p| p.kernel)),
        }
    }
}

/// Gathers the `[batch, heads, len]` rows of `head_dim` values of a strided tensor densely.
fn dense(x: &[f32], st: quattn::Strides, batch: usize, heads: usize, len: usize, d: usize) -> Vec<f32> {
    (0..batch * heads * len).flat_map(|r| x[st.offset(r / (heads * len), (r / len) % heads, r % len)..][..d].to_vec()).collect()
}

/// `Precision::Mxfp4` plans on the portable 4-bit kernel in Auto (the kernel's name says MXFP4)
/// and runs through the facade: within the mode's tolerance of the f64 reference, and within
/// f32 summation noise of the CPU emulation with the kernel's tiles (the same codes, the same
/// bf16 P). The same kernel launched here into an O and LSE filled with NaN, on codes the CPU
/// codec quantizes from the bf16-rounded inputs (K − μ with smoothing, and the LSE shift
/// `scale · q·μ`), writes every element and gives the facade's result bit for bit: the upload
/// quantizes as the codec does.
#[test]
fn mxfp4_plans_on_the_4bit_kernel_and_follows_its_emulation() {
    use quattn::codec::int8::{lse_shift, smooth_k};
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let cases = [
        // GQA, a KV length that is no multiple of the key tile.
        (AttentionProblem::new(1, 4, 5, 64).kv_heads(2).kv_len(100), false),
        // Causal with ragged lengths, GQA, smoothed K.
        (AttentionProblem::new(1, 4, 37, 64).kv_heads(2).kv_len(61).causal(true), true),
        // Head dim 128, two batches, BSHD, causal.
        (AttentionProblem::new(2, 2, 33, 128).kv_len(50).causal(true).layout(Layout::Bshd), false),
        (AttentionProblem::new(1, 4, 9, 128).kv_heads(1).kv_len(70), true),
    ];
    for (i, (p, smooth)) in cases.into_iter().enumerate() {
        let p = p.with_lse(true);
        let prec = Precision::Mxfp4 { smooth_k: smooth };
        let plan = s.plan(&p, prec, Strategy::Auto).unwrap_or_else(|e| panic!("plan {prec} {p:?}: {e}"));
        assert_eq!(plan.family(), Family::Portable(PortableKind::Fp4), "{}", plan.kernel);
        assert!(plan.kernel_name().contains("mxfp4"), "{}", plan.kernel_name());
        let quattn::KernelId::Portable { kernel, .. } = &plan.kernel else { panic!("{}", plan.kernel) };
        assert!(matches!(kernel, quattn_cubecl::PortableKernel::Fp4(t) if t.format == Fp4Format::Mxfp4 && t.v == Fp4V::Bf16), "{kernel:?}");
        assert!(kernel.name().contains("mxfp4"), "{}", kernel.name());
        // Channel outliers in K where K is smoothed (what smoothing is for), N(0, 1) with
        // outliers elsewhere.
        let (q, k, v) = if smooth { inputs::qkv_k_outlier_channels(&p, 1700 + i as u64, 8.0) } else { inputs::qkv(&p, 1700 + i as u64) };
        let out = s.run(&plan, &q, &k, &v).unwrap();
        let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
        let m = ErrorMetrics::compare(&out.o, &r.o);
        let tol = Tolerance::for_precision(prec);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        assert!(tol.accepts(&m, ref_max), "{} {p:?}: {m:?} vs {tol:?}", plan.kernel);
        let emu = quattn::emulation::emulate(&p, prec, &plan.blocking.unwrap(), &q, &k, &v).unwrap();
        let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
        let me = ErrorMetrics::compare(&out.o, &e);
        let em = ErrorMetrics::compare(&emu.o, &r.o);
        println!("{} {p:?}: kernel vs f64 {m:?}; emulation vs f64 {em:?}; kernel vs emulation {me:?}", plan.kernel);
        assert!(me.rel_l2 < 1e-4, "{} {p:?}: kernel vs emulation {me:?} (vs f64: {m:?})", plan.kernel);
        let el: Vec<f64> = emu.lse.iter().map(|&x| x as f64).collect();
        let lm = compare_lse(out.lse.as_ref().unwrap(), &el).expect("LSE infinities match");
        assert!(lm.max_abs < 1e-4, "{} LSE vs emulation {lm:?}", plan.kernel);
        let rl = compare_lse(out.lse.as_ref().unwrap(), &r.lse).expect("LSE infinities match");
        assert!(rl.max_abs <= tol.max_abs_rel, "{} LSE vs f64 {rl:?}", plan.kernel);

        // The direct launch into NaN.
        let bf = |x: &[f32]| -> Vec<f32> { x.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect() };
        let (qb, kb, vb) = (bf(&q), bf(&k), bf(&v));
        let d = p.head_dim;
        let (kq, shift) = if smooth {
            let sm = smooth_k(&p, &kb).unwrap();
            let st = p.q_strides();
            let mut shift = Vec::new();
            for b in 0..p.batch {
                for h in 0..p.q_heads {
                    let mean = &sm.mean[(b * p.kv_heads + p.kv_head_of(h)) * d..][..d];
                    shift.extend((0..p.q_len).map(|i| lse_shift(&qb[st.offset(b, h, i)..][..d], mean, p.softmax_scale())));
                }
            }
            (sm.values, Some(shift))
        } else {
            (kb, None)
        };
        let tq = Mxfp4Tensor::quantize(&dense(&qb, p.q_strides(), p.batch, p.q_heads, p.q_len, d), p.batch * p.q_heads * p.q_len, d).unwrap();
        let tk = Mxfp4Tensor::quantize(&dense(&kq, p.k_strides(), p.batch, p.kv_heads, p.kv_len, d), p.batch * p.kv_heads * p.kv_len, d).unwrap();
        let vd = dense(&vb, p.v_strides(), p.batch, p.kv_heads, p.kv_len, p.v_head_dim);
        let v_bits: Vec<u8> = vd.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect();
        let words = |b: &[u8]| {
            let mut b = b.to_vec();
            b.resize(b.len().next_multiple_of(4).max(4), 0);
            client.create_from_slice(&b)
        };
        let (hq, hqs, hk, hks, hv, none) = (words(&tq.packed), words(&tq.scales), words(&tk.packed), words(&tk.scales), words(&v_bits), words(&[]));
        let ts = client.create_from_slice(bytemuck::cast_slice(&[1.0f32]));
        let hshift = shift.as_ref().map(|x| client.create_from_slice(bytemuck::cast_slice(x)));
        let o = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.o_len_elems()]));
        let lse = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
        let ops = Fp4Operands { q: &hq, q_scales: &hqs, k: &hk, k_scales: &hks, v: &hv, v_scales: &none, tensor_scales: [&ts; 3], lse_shift: hshift.as_ref() };
        quattn_cubecl::launch_fp4(&client, kernel, &p.shape(), ops, &o, Some(&lse)).unwrap();
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(o).unwrap());
        let got_lse: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(lse).unwrap());
        assert!(got.iter().chain(&got_lse).all(|x| x.is_finite()), "{}: an output element was not written", plan.kernel);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&out.o), "{}: the facade's O differs from the launch on the codec's codes", plan.kernel);
        assert_eq!(bits(&got_lse), bits(out.lse.as_ref().unwrap()), "{}: LSE", plan.kernel);
    }
}

/// The CubeCL NVFP4 quantization against the CPU codec, byte for byte: random rows with
/// outliers, and a row of blocks built to land on ties (block scales halfway between two UE4M3
/// codes, normal and subnormal, and elements halfway between two E2M1 values), which round to
/// even.
#[test]
fn device_nvfp4_quantization_is_bit_exact_with_the_codec() {
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let cols = 64;
    // amax 2688 makes the tensor scale exactly 1, so each block's scale is ue4m3(amax_b / 6).
    let mut ties = vec![0.0f32; cols];
    ties[0] = 2688.0;
    // Block 1: amax 6.375 -> 1.0625, halfway between UE4M3 1.0 and 1.125 -> 1.0 (even); then
    // elements on the E2M1 midpoints under the divisor 1.
    let mids = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    ties[16] = 6.375;
    for (i, m) in mids.iter().enumerate() {
        ties[17 + i] = *m;
        ties[24 + i] = -*m;
    }
    // Block 2: amax 9 · 2^-9 -> 1.5 · 2^-9, halfway between the subnormals 2^-9 and 2^-8.
    ties[32] = 9.0 / 512.0;
    ties[33] = -3.0 / 512.0;
    // Block 3: zeros and a negative zero.
    ties[48] = -0.0;
    for (rows, seed) in [(1usize, 0u64), (37, 5), (3, 9)] {
        let x: Vec<f32> = if seed == 0 { ties.clone() } else { inputs::normal_with_outliers(rows * cols, seed) };
        let h = client.create_from_slice(bytemuck::cast_slice(&x));
        let d = quattn_cubecl::quantize_nvfp4(&client, &h, rows, cols).unwrap();
        let cpu = quattn::codec::nvfp4::Nvfp4Tensor::quantize(&x, rows, cols).unwrap();
        let packed = client.read_one(d.packed).unwrap();
        let scales = client.read_one(d.block_scales).unwrap();
        let ts: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(d.tensor_scale).unwrap());
        assert_eq!(ts[0].to_bits(), cpu.tensor_scale.to_bits(), "tensor scale, seed {seed}");
        assert_eq!(&scales[..cpu.block_scales.len()], &cpu.block_scales[..], "block scales, seed {seed}");
        assert_eq!(&packed[..cpu.packed.len()], &cpu.packed[..], "codes, seed {seed}");
    }
    // The tie row really has ties: the even choices, spelled out.
    let cpu = quattn::codec::nvfp4::Nvfp4Tensor::quantize(&ties, 1, cols).unwrap();
    assert_eq!(cpu.tensor_scale, 1.0);
    assert_eq!(cpu.block_scales[1], 0x38, "1.0625 -> 1.0");
    assert_eq!(cpu.block_scales[2], 0x02, "1.5 * 2^-9 -> 2^-8");
    assert_eq!(e2m1::decode(cpu.code(0, 17)), 0.0);
    assert_eq!(e2m1::decode(cpu.code(0, 18)), 1.0);
}

/// On a CUDA device without the sm_120a kernel, `Precision::Nvfp4` plans on the portable 4-bit
/// kernel through CubeCL CUDA and follows its emulation as on wgpu. Skipped without a CUDA GPU.
#[test]
fn cuda_runs_the_portable_4bit_kernel_where_the_native_one_is_not() {
    let Some(s) = common::open(Device::Cuda(0)) else { return };
    let p = AttentionProblem::new(1, 4, 5, 64).kv_heads(2).kv_len(100).with_lse(true);
    for (v, smooth_k) in [(Nvfp4V::Bf16, false), (Nvfp4V::Nvfp4, true), (Nvfp4V::Nvfp4P16, false)] {
        let prec = Precision::Nvfp4 { v, smooth_k };
        let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
        if plan.family() != Family::Portable(PortableKind::Fp4) {
            println!("SKIPPED: {prec} plans on {} here", plan.kernel);
            return;
        }
        let (q, k, vv) = inputs::qkv(&p, 1600);
        let out = s.run(&plan, &q, &k, &vv).unwrap();
        let emu = quattn::emulation::emulate(&p, prec, &plan.blocking.unwrap(), &q, &k, &vv).unwrap();
        let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
        let me = ErrorMetrics::compare(&out.o, &e);
        println!("cuda {}: kernel vs emulation {me:?}", plan.kernel);
        assert!(me.rel_l2 < 1e-4, "{}: kernel vs emulation {me:?}", plan.kernel);
    }
}

/// MXFP4 has no native CUDA kernel: on every CUDA device Auto plans it on the portable 4-bit
/// kernel through CubeCL CUDA, which follows its emulation and the mode's tolerance as on
/// wgpu; forcing the native NVFP4 family is a typed refusal. Skipped without a CUDA GPU.
#[test]
fn cuda_runs_mxfp4_on_the_portable_4bit_kernel() {
    let Some(s) = common::open(Device::Cuda(0)) else { return };
    for (p, smooth_k) in [
        (AttentionProblem::new(1, 4, 5, 64).kv_heads(2).kv_len(100), false),
        (AttentionProblem::new(1, 4, 37, 128).kv_heads(2).kv_len(61).causal(true), true),
    ] {
        let p = p.with_lse(true);
        let prec = Precision::Mxfp4 { smooth_k };
        let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
        assert_eq!(plan.family(), Family::Portable(PortableKind::Fp4), "{}", plan.kernel);
        assert!(plan.kernel_name().contains("mxfp4"), "{}", plan.kernel_name());
        let (q, k, v) = inputs::qkv(&p, 1800);
        let out = s.run(&plan, &q, &k, &v).unwrap();
        let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
        let m = ErrorMetrics::compare(&out.o, &r.o);
        let tol = Tolerance::for_precision(prec);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        assert!(tol.accepts(&m, ref_max), "{}: {m:?} vs {tol:?}", plan.kernel);
        let emu = quattn::emulation::emulate(&p, prec, &plan.blocking.unwrap(), &q, &k, &v).unwrap();
        let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
        let me = ErrorMetrics::compare(&out.o, &e);
        println!("cuda {}: kernel vs f64 {m:?}; kernel vs emulation {me:?}", plan.kernel);
        assert!(me.rel_l2 < 1e-4, "{}: kernel vs emulation {me:?}", plan.kernel);
        match s.plan(&p, prec, Strategy::Native(quattn::NativeKind::Nvfp4)) {
            Err(Error::UnsupportedStrategy { reason, .. }) => assert!(reason.contains("no native MXFP4"), "{reason}"),
            other => panic!("{:?}", other.map(|p| p.kernel)),
        }
    }
}

/// Pre-quantized NVFP4 codes on the device (`Session::run_cubecl_fp4`), quantized here by the
/// codec in the documented layouts, give bit for bit what the host path gives (which quantizes
/// the same values on the device, bit-exact with the codec), with bf16 V and with NVFP4 `Vᵀ`;
/// smoothed plans, plans of other modes and short buffers are typed errors.
/// `[rows, cols]` scale bytes (row-major) in the 128x4-blocked layout, spelled as PyTorch's
/// `to_blocked` does it: pad to multiples of (128, 4) (here with 0xee, which no reader may
/// use), view each 128x4 block as `[4][32][4]`, swap the first two axes, flatten.
fn to_blocked(x: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let (rp, cp) = (rows.div_ceil(128) * 128, cols.div_ceil(4) * 4);
    let at = |r: usize, c: usize| if r < rows && c < cols { x[r * cols + c] } else { 0xee };
    let mut out = Vec::with_capacity(rp * cp);
    for rb in 0..rp / 128 {
        for cb in 0..cp / 4 {
            for i in 0..32 {
                for j in 0..4 {
                    for c in 0..4 {
                        out.push(at(rb * 128 + j * 32 + i, cb * 4 + c));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn blocked_scales_convert_to_row_major_on_the_device() {
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for (rows, cols) in [(1usize, 1usize), (3, 4), (128, 4), (130, 3), (257, 9), (300, 8)] {
        let x: Vec<u8> = (0..rows * cols)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 56) as u8
            })
            .collect();
        let blocked = to_blocked(&x, rows, cols);
        assert_eq!(blocked.len(), quattn_cubecl::blocked_scale_bytes(rows, cols));
        for (r, c) in [(0, 0), (rows - 1, cols - 1), (rows / 2, cols / 2)] {
            assert_eq!(blocked[quattn_cubecl::blocked_scale_offset(r, c, cols)], x[r * cols + c], "offset of ({r}, {c}) in [{rows}, {cols}]");
        }
        let src = client.create_from_slice(&blocked);
        let dst = quattn_cubecl::scales_from_blocked(&client, &src, rows, cols).unwrap();
        let got = client.read_one(dst).unwrap();
        assert_eq!(&got[..rows * cols], &x[..], "[{rows}, {cols}]");
        assert!(got[rows * cols..].iter().all(|&b| b == 0), "[{rows}, {cols}]: the last word's tail");
        // One word short of the blocked layout: a typed error.
        let short = client.create_from_slice(&blocked[..blocked.len() - 4]);
        assert!(quattn_cubecl::scales_from_blocked(&client, &short, rows, cols).is_err(), "[{rows}, {cols}]");
    }
}

#[test]
fn pre_quantized_nvfp4_codes_on_the_device_match_the_host_path() {
    use quattn::codec::nvfp4::Nvfp4Tensor;
    use quattn::{Fp4ScaleLayout, Fp4Tensors, HostSlice};
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let p = AttentionProblem::new(2, 4, 5, 64).kv_heads(2).kv_len(70).with_lse(true);
    let (q, k, v) = inputs::qkv(&p, 1900);
    let round = |x: &[f32]| HostSlice::F32(x).rounded_to(quattn::Dtype::Bf16);
    let (q, k, v) = (round(&q), round(&k), round(&v));
    let words = |b: &[u8]| {
        let mut b = b.to_vec();
        b.resize(b.len().next_multiple_of(4).max(4), 0);
        client.create_from_slice(&b)
    };
    let scalar = |x: f32| client.create_from_slice(bytemuck::cast_slice(&[x]));
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let tq = Nvfp4Tensor::quantize(&q, p.batch * p.q_heads * p.q_len, d).unwrap();
    let tk = Nvfp4Tensor::quantize(&k, p.batch * p.kv_heads * p.kv_len, d).unwrap();
    let (hq, hqs, hk, hks) = (words(&tq.packed), words(&tq.block_scales), words(&tk.packed), words(&tk.block_scales));
    let v_cols = p.kv_len.div_ceil(16) * 16;
    let mut vt = vec![0.0f32; p.batch * p.kv_heads * dv * v_cols];
    for bh in 0..p.batch * p.kv_heads {
        for j in 0..p.kv_len {
            for c in 0..dv {
                vt[(bh * dv + c) * v_cols + j] = v[(bh * p.kv_len + j) * dv + c];
            }
        }
    }
    let tv = Nvfp4Tensor::quantize(&vt, p.batch * p.kv_heads * dv, v_cols).unwrap();
    let v_bf16: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect();
    for v_mode in [Nvfp4V::Bf16, Nvfp4V::Nvfp4, Nvfp4V::Nvfp4P16] {
        let plan = s.plan(&p, Precision::Nvfp4 { v: v_mode, smooth_k: false }, Strategy::Auto).unwrap();
        let host = s.run(&plan, &q, &k, &v).unwrap();
        let (hv, hvs, ts_v) = match v_mode {
            Nvfp4V::Bf16 => (words(&v_bf16), None, scalar(1.0)),
            Nvfp4V::Nvfp4 | Nvfp4V::Nvfp4P16 => (words(&tv.packed), Some(words(&tv.block_scales)), scalar(tv.tensor_scale)),
        };
        let o = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.o_len_elems()]));
        let lse = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
        let (ts_q, ts_k) = (scalar(tq.tensor_scale), scalar(tk.tensor_scale));
        let t = Fp4Tensors {
            q: &hq,
            q_scales: &hqs,
            k: &hk,
            k_scales: &hks,
            v: &hv,
            v_scales: hvs.as_ref(),
            tensor_scales: [&ts_q, &ts_k, &ts_v],
            o: &o,
            lse: Some(&lse),
        };
        s.run_cubecl_fp4::<WgpuRuntime>(&plan, t).unwrap();
        let o: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(o.clone()).unwrap());
        let lse: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(lse.clone()).unwrap());
        assert!(o.iter().zip(&host.o).all(|(a, b)| a.to_bits() == b.to_bits()), "{v_mode:?}: O differs from the host path");
        assert!(lse.iter().zip(host.lse.as_ref().unwrap()).all(|(a, b)| a.to_bits() == b.to_bits()), "{v_mode:?}: LSE differs");

        // The same codes with their scales in the 128x4-blocked layout (padding bytes not
        // zero): converted on the device, the same O and LSE bit for bit.
        let bq = words(&to_blocked(&tq.block_scales, tq.rows, d / 16));
        let bk = words(&to_blocked(&tk.block_scales, tk.rows, d / 16));
        let bv = v_mode.is_4bit().then(|| words(&to_blocked(&tv.block_scales, tv.rows, v_cols / 16)));
        let ob = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.o_len_elems()]));
        let lb = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
        let tb = Fp4Tensors { q_scales: &bq, k_scales: &bk, v_scales: bv.as_ref().or(hvs.as_ref()), o: &ob, lse: Some(&lb), ..t };
        s.run_cubecl_fp4_scales::<WgpuRuntime>(&plan, tb, Fp4ScaleLayout::Blocked128x4).unwrap();
        let ob: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(ob.clone()).unwrap());
        let lb: Vec<f32> = bytemuck::pod_collect_to_vec(&client.read_one(lb.clone()).unwrap());
        assert!(ob.iter().zip(&host.o).all(|(a, b)| a.to_bits() == b.to_bits()), "{v_mode:?}: O from blocked scales differs");
        assert!(lb.iter().zip(host.lse.as_ref().unwrap()).all(|(a, b)| a.to_bits() == b.to_bits()), "{v_mode:?}: LSE from blocked scales differs");
        // Row-major K scales are too short for the blocked layout (K's rows are not a multiple
        // of 128): a typed error, nothing launched.
        let out = client.empty(p.o_len_elems() * 4);
        let err = s.run_cubecl_fp4_scales::<WgpuRuntime>(&plan, Fp4Tensors { k_scales: &hks, o: &out, ..tb }, Fp4ScaleLayout::Blocked128x4).unwrap_err();
        assert!(matches!(err, Error::BufferLength { tensor: quattn::TensorName::K, .. }), "{err}");

        // A V scale buffer one word short.
        if let Some(short) = v_mode.is_4bit().then(|| words(&tv.block_scales[..tv.block_scales.len() - 4])) {
            let out = client.empty(p.o_len_elems() * 4);
            let err = s.run_cubecl_fp4::<WgpuRuntime>(&plan, Fp4Tensors { v_scales: Some(&short), o: &out, ..t }).unwrap_err();
            assert!(matches!(err, Error::BufferLength { .. }), "{err}");
        }
    }
    // Smoothed plans and other modes are refused by name; the generic entry refuses 4-bit plans.
    let smoothed = s.plan(&p, Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k: true }, Strategy::Auto).unwrap();
    let (o, ts) = (client.empty(p.o_len_elems() * 4), scalar(1.0));
    let t = Fp4Tensors { q: &hq, q_scales: &hqs, k: &hk, k_scales: &hks, v: &hq, v_scales: None, tensor_scales: [&ts, &ts, &ts], o: &o, lse: None };
    assert!(matches!(s.run_cubecl_fp4::<WgpuRuntime>(&smoothed, t), Err(Error::EntryPoint { .. })));
    let f16_plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    assert!(matches!(s.run_cubecl_fp4::<WgpuRuntime>(&f16_plan, t), Err(Error::EntryPoint { .. })));
    let fp4_plan = s.plan(&p, Precision::NVFP4_DEFAULT, Strategy::Auto).unwrap();
    let lse = client.empty(p.lse_len_elems() * 4);
    let err = s.run_cubecl::<WgpuRuntime>(&fp4_plan, quattn::CubeclTensors { q: &hq, k: &hk, v: &hq, o: &o, lse: Some(&lse) }).unwrap_err();
    assert!(err.to_string().contains("run_cubecl_fp4"), "{err}");
}

/// Decode shapes of NVFP4 Q, K and V (P NVFP4) on CUDA: Auto plans the 4-bit MMA decode kernel
/// (`decode_mma_fp4.rs`: codes decoded in registers for the f16 tensor cores, split KV), whose
/// output is within the mode's tolerance of f64 and follows the emulation with its key streams
/// (each warp of each split its own running max, against which P is quantized): the same codes
/// and roundings, so only f32 sums and exp differ. Packed rows 4 and 8, a ragged last tile,
/// several splits and one, causal q_len 2, K smoothing, and scores that jump mid-walk (K times
/// 6 over the second half: the running maxima move late). Skipped without a CUDA GPU.
#[test]
fn cuda_decode_shapes_run_the_4bit_mma_decode_kernel() {
    let Some(s) = common::open(Device::Cuda(0)) else { return };
    let cases = [
        (AttentionProblem::new(2, 8, 1, 128).kv_heads(2).kv_len(3001), false, false),
        (AttentionProblem::new(1, 8, 1, 128).kv_heads(1).kv_len(600), true, false),
        (AttentionProblem::new(1, 4, 2, 128).kv_heads(1).kv_len(777).causal(true), false, false),
        (AttentionProblem::new(2, 4, 1, 128).kv_heads(2).kv_len(20000), false, true),
    ];
    // Both P formats of the kernel: NVFP4 (`-v4`) and f16 (`-v4p16`).
    let runs = cases.into_iter().enumerate().flat_map(|(i, c)| [Nvfp4V::Nvfp4, Nvfp4V::Nvfp4P16].map(|v| (i, c.clone(), v)));
    for (i, (p, smooth_k, jump), v) in runs {
        let p = p.with_lse(true);
        let prec = Precision::Nvfp4 { v, smooth_k };
        let plan = s.plan(&p, prec, Strategy::Auto).unwrap_or_else(|e| panic!("plan {prec} {p:?}: {e}"));
        if plan.family() != Family::Portable(PortableKind::Fp4) {
            println!("SKIPPED: {prec} plans on {} here", plan.kernel);
            return;
        }
        assert!(plan.kernel.to_string().contains("decode_mma"), "{p:?}: {}", plan.kernel);
        let (q, mut k, vv) = inputs::qkv(&p, 1700 + i as u64);
        if jump {
            let half = p.kv_len / 2;
            let st = p.k_strides();
            for b in 0..p.batch {
                for h in 0..p.kv_heads {
                    for j in half..p.kv_len {
                        k[st.offset(b, h, j)..][..p.head_dim].iter_mut().for_each(|x| *x *= 6.0);
                    }
                }
            }
        }
        let out = s.run(&plan, &q, &k, &vv).unwrap();
        assert!(out.o.iter().all(|x| x.is_finite()), "{}: non-finite O", plan.kernel);
        let r = reference::attention_f64(&p, &q, &k, &vv).unwrap();
        let m = ErrorMetrics::compare(&out.o, &r.o);
        let tol = Tolerance::for_precision(prec);
        let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        let emu = quattn::emulation::emulate(&p, prec, &plan.blocking.unwrap(), &q, &k, &vv).unwrap();
        let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
        let me = ErrorMetrics::compare(&out.o, &e);
        let em = ErrorMetrics::compare(&emu.o, &r.o);
        println!("cuda {} {p:?}: kernel vs f64 {m:?}; emulation vs f64 {em:?}; kernel vs emulation {me:?}", plan.kernel);
        // The mode's tolerance is for the normal-with-outliers inputs; K times 6 makes the
        // softmax peaky enough that NVFP4 P and K lose far more (the emulation itself is about
        // 0.5 from f64 there), so that case is held to the emulation alone.
        if !jump {
            assert!(tol.accepts(&m, ref_max), "{} {p:?}: {m:?} vs {tol:?}", plan.kernel);
        }
        assert!(me.rel_l2 < 1e-4, "{} {p:?}: kernel vs emulation {me:?} (vs f64: {m:?})", plan.kernel);
        let el: Vec<f64> = emu.lse.iter().map(|&x| x as f64).collect();
        let lm = compare_lse(out.lse.as_ref().unwrap(), &el).expect("LSE infinities match");
        assert!(lm.max_abs < 1e-4, "{} LSE vs emulation {lm:?}", plan.kernel);
    }
}
