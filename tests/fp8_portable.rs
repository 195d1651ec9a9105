//! The portable FP8 kernel through the facade, on a wgpu adapter (mesa's software Vulkan in CI):
//! `Precision::Fp8` plans on it, its output against the f64 reference (the mode's tolerance) and
//! against the CPU emulation with the kernel's descale blocks (the same quantization: only the
//! summation order, the O rounding to f16 and the place of the descales differ), the device path
//! on CubeCL handles bit-identical to the host path, NaN codes confined to the rows that see
//! them, and the typed errors of the FP8 entry points.

mod common;

use cubecl::wgpu::WgpuRuntime;
use half::f16;
use quattn::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{
    cubecl, inputs, reference, AttentionProblem, CubeclTensors, DescaleGranularity, Device, Error, Family, Fp8Descales, Fp8Format,
    HostSlice, Layout, PortableKind, Precision, PvFormat, Session, Strategy, WgpuAdapter,
};

fn session() -> Option<Session> {
    common::open(Device::Wgpu(WgpuAdapter::Default))
}

fn fp8(format: Fp8Format, descale: DescaleGranularity) -> Precision {
    Precision::Fp8 { format, descale, p: PvFormat::F16 }
}

fn f16_inputs(p: &AttentionProblem, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q, k, v) = inputs::qkv(p, seed);
    let r = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(quattn::Dtype::F16);
    (r(q), r(k), r(v))
}

#[test]
fn fp8_plans_on_the_portable_kernel_and_follows_its_emulation() {
    prefill_follows_emulation(session(), Strategy::Auto);
}

/// On CUDA the portable FP8 family is the mma kernel, its stages decoded through the device's
/// FP8 conversion on sm_89 and later: the same checks.
#[test]
fn cuda_fp8_portable_kernel_follows_its_emulation() {
    prefill_follows_emulation(common::open(Device::Cuda(0)), Strategy::Portable);
}

fn prefill_follows_emulation(s: Option<Session>, strategy: Strategy) {
    let Some(s) = s else { return };
    let shapes = [
        AttentionProblem::new(1, 4, 1, 64).kv_heads(2).kv_len(300),
        AttentionProblem::new(1, 2, 70, 128).kv_len(130).causal(true),
        AttentionProblem::new(2, 2, 33, 64).kv_len(65).layout(Layout::Bshd),
    ];
    for (i, p) in shapes.into_iter().enumerate() {
        let p = p.with_lse(true);
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for descale in [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock] {
                let prec = fp8(format, descale);
                let plan = s.plan(&p, prec, strategy).unwrap_or_else(|e| panic!("plan {prec} {p:?}: {e}"));
                let (q, k, v) = f16_inputs(&p, 700 + i as u64);
                check_against_reference_and_emulation(&s, &plan, &q, &k, &v);
            }
        }
    }
}

/// One run of `plan` against the f64 reference (the mode's tolerance) and against the
/// emulation with the kernel's descale blocks.
fn check_against_reference_and_emulation(s: &Session, plan: &quattn::Plan, q: &[f32], k: &[f32], v: &[f32]) {
    let (p, prec) = (&plan.problem, plan.precision);
    assert_eq!(plan.family(), Family::Portable(PortableKind::Fp8), "{}", plan.kernel);
    let out = s.run(plan, q, k, v).unwrap();
    // Against f64 on the f16 values: the mode's tolerance (FP8 quantization error).
    let r = reference::attention_f64(p, q, k, v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(prec);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{} {p:?}: {m:?} vs {tol:?}", plan.kernel);
    // Against the emulation with the kernel's descale blocks: the same codes, so what is left
    // is O's f16 rounding (2^-11 relative), f32 summation order, and where P is rounded (the
    // lazy rescale's stale max; the mma kernel's per-block V descale folded into P).
    let emu = quattn::emulation::emulate(p, prec, &plan.blocking.unwrap(), q, k, v).unwrap();
    let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
    let me = ErrorMetrics::compare(&out.o, &e);
    assert!(me.rel_l2 < 1e-3, "{} {p:?}: kernel vs emulation {me:?}", plan.kernel);
    let el: Vec<f64> = emu.lse.iter().map(|&x| x as f64).collect();
    let lm = compare_lse(out.lse.as_ref().unwrap(), &el).expect("LSE infinities match");
    assert!(lm.max_abs < 1e-4, "{} LSE vs emulation {lm:?}", plan.kernel);
}

#[test]
fn per_block_descales_far_apart_follow_the_emulation() {
    per_block_descales_far_apart(session(), Strategy::Auto);
}

#[test]
fn cuda_per_block_descales_far_apart_follow_the_emulation() {
    per_block_descales_far_apart(common::open(Device::Cuda(0)), Strategy::Portable);
}

/// Per-block descales that differ between KV tiles by up to 2^10: K and V rows of tile t
/// scaled by `K_SCALES[t % 3]` and `V_SCALES[t % 3]` (powers of two), so that the running max
/// of the mma kernel, kept over `s · c_t + ln v_descale_t`, moves between tiles of small and
/// large V descales both ways. The ratios stay where the emulation's f16 P, rounded before the
/// descale, keeps its precision too (`tests/fp8_mma_block_twin.rs` goes further on the host).
fn per_block_descales_far_apart(s: Option<Session>, strategy: Strategy) {
    const K_SCALES: [f32; 3] = [1.0, 2.0, 0.5];
    const V_SCALES: [f32; 3] = [1.0 / 64.0, 16.0, 1.0];
    let Some(s) = s else { return };
    let shapes = [
        AttentionProblem::new(1, 2, 70, 128).kv_len(300).causal(true),
        AttentionProblem::new(2, 4, 40, 64).kv_heads(2).kv_len(200).layout(Layout::Bshd),
    ];
    for (i, p) in shapes.into_iter().enumerate() {
        let p = p.with_lse(true);
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let prec = fp8(format, DescaleGranularity::PerBlock);
            let plan = s.plan(&p, prec, strategy).unwrap_or_else(|e| panic!("plan {prec} {p:?}: {e}"));
            let block_k = plan.blocking.unwrap().block_k;
            let (q, mut k, mut v) = inputs::qkv(&p, 900 + i as u64);
            for (x, scales, st, dim) in [(&mut k, K_SCALES, p.k_strides(), p.head_dim), (&mut v, V_SCALES, p.v_strides(), p.v_head_dim)] {
                for b in 0..p.batch {
                    for h in 0..p.kv_heads {
                        for j in 0..p.kv_len {
                            let row = st.offset(b, h, j);
                            x[row..row + dim].iter_mut().for_each(|e| *e *= scales[(j / block_k) % 3]);
                        }
                    }
                }
            }
            let r = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(quattn::Dtype::F16);
            check_against_reference_and_emulation(&s, &plan, &r(q), &r(k), &r(v));
        }
    }
}

/// Codes and descales as a caller holding an FP8 KV cache would: quantized on the host with the
/// plan's descale blocks, uploaded as CubeCL handles.
struct DeviceFp8 {
    q: cubecl::server::Handle,
    k: cubecl::server::Handle,
    v: cubecl::server::Handle,
    dq: cubecl::server::Handle,
    dk: cubecl::server::Handle,
    dv: cubecl::server::Handle,
}

fn quantize(p: &AttentionProblem, plan: &quattn::Plan, format: Fp8Format, descale: DescaleGranularity, qkv: (&[f32], &[f32], &[f32])) -> [Fp8Tensor; 3] {
    let b = plan.blocking.unwrap();
    let layout = |heads, len, block_rows| DescaleLayout { granularity: descale, batch: p.batch, heads, len, block_rows };
    [
        Fp8Tensor::quantize(format, qkv.0, p.q_strides(), p.head_dim, layout(p.q_heads, p.q_len, b.block_q)).unwrap(),
        Fp8Tensor::quantize(format, qkv.1, p.k_strides(), p.head_dim, layout(p.kv_heads, p.kv_len, b.block_k)).unwrap(),
        Fp8Tensor::quantize(format, qkv.2, p.v_strides(), p.v_head_dim, layout(p.kv_heads, p.kv_len, b.block_k)).unwrap(),
    ]
}

fn upload<R: cubecl::Runtime>(client: &cubecl::prelude::ComputeClient<R>, t: &[Fp8Tensor; 3]) -> DeviceFp8 {
    let codes = |x: &Fp8Tensor| {
        let mut c = x.codes.clone();
        c.resize(c.len().next_multiple_of(16), 0xAA);
        client.create_from_slice(&c)
    };
    let ds = |x: &Fp8Tensor| client.create_from_slice(bytemuck::cast_slice(&x.descales));
    DeviceFp8 { q: codes(&t[0]), k: codes(&t[1]), v: codes(&t[2]), dq: ds(&t[0]), dk: ds(&t[1]), dv: ds(&t[2]) }
}

fn run_device<R: cubecl::Runtime>(s: &Session, plan: &quattn::Plan, d: &DeviceFp8) -> (Vec<f16>, Vec<f32>) {
    let client = s.cubecl_client::<R>().unwrap();
    let p = &plan.problem;
    let poison_o = vec![f16::NAN; p.o_len_elems()];
    let o = client.create_from_slice(bytemuck::cast_slice(&poison_o));
    let lse = client.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
    let t = CubeclTensors { q: &d.q, k: &d.k, v: &d.v, o: &o, lse: Some(&lse) };
    s.run_cubecl_fp8::<R>(plan, t, Fp8Descales { q: &d.dq, k: &d.dk, v: &d.dv }).unwrap();
    let o = bytemuck::pod_collect_to_vec(&client.read_one(o).unwrap());
    let lse = bytemuck::pod_collect_to_vec(&client.read_one(lse).unwrap());
    (o, lse)
}

#[test]
fn device_codes_and_descales_give_the_host_paths_bits() {
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    for (p, format, descale) in [
        (AttentionProblem::new(1, 4, 3, 128).kv_heads(2).kv_len(200), Fp8Format::E4M3, DescaleGranularity::PerBlock),
        (AttentionProblem::new(2, 2, 40, 64).kv_len(90).causal(true).layout(Layout::Bshd), Fp8Format::E5M2, DescaleGranularity::PerHead),
    ] {
        let p = p.with_lse(true);
        let prec = fp8(format, descale);
        let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
        let (q, k, v) = f16_inputs(&p, 41);
        let host = s.run(&plan, &q, &k, &v).unwrap();
        let t = quantize(&p, &plan, format, descale, (&q, &k, &v));
        let lens = plan.fp8_descale_lens().unwrap();
        assert_eq!(lens, [t[0].descales.len(), t[1].descales.len(), t[2].descales.len()], "{}", plan.kernel);
        let (o, lse) = run_device::<WgpuRuntime>(&s, &plan, &upload(&client, &t));
        for (i, (d, h)) in o.iter().zip(&host.o).enumerate() {
            // The host path's O is the same f16 widened: equal bits, NaN never.
            assert_eq!(d.to_f32().to_bits(), h.to_bits(), "{} O[{i}]: device {d} vs host {h}", plan.kernel);
        }
        assert_eq!(lse, host.lse.unwrap(), "{} LSE", plan.kernel);
    }
}

#[test]
fn nan_codes_poison_only_the_rows_that_see_them() {
    nan_codes::<WgpuRuntime>(session(), Strategy::Auto);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_nan_codes_poison_only_the_rows_that_see_them() {
    nan_codes::<cubecl::cuda::CudaRuntime>(common::open(Device::Cuda(0)), Strategy::Portable);
}

fn nan_codes<R: cubecl::Runtime>(s: Option<Session>, strategy: Strategy) {
    let Some(s) = s else { return };
    let client = s.cubecl_client::<R>().unwrap();
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        // q_len == kv_len, causal: query i sees keys 0..=i.
        let p = AttentionProblem::new(1, 2, 80, 64).causal(true).with_lse(true);
        let descale = DescaleGranularity::PerTensor;
        let plan = s.plan(&p, fp8(format, descale), strategy).unwrap();
        let (q, k, v) = f16_inputs(&p, 9);
        let mut t = quantize(&p, &plan, format, descale, (&q, &k, &v));
        let nan = match format {
            Fp8Format::E4M3 => 0x7F,
            Fp8Format::E5M2 => 0x7E,
        };
        let (key, row, v_key) = (50, 20, 70);
        // Head 0: a NaN in K's key 50 (rows 50.. see it); head 1: a NaN in Q's row 20 and one
        // in V's key 70 (rows 70.. see it; the rows before weigh it by zero, which must not
        // make them NaN).
        t[1].codes[p.k_strides().offset(0, 0, key) + 3] = nan;
        t[0].codes[p.q_strides().offset(0, 1, row) + 5] = nan;
        t[2].codes[p.v_strides().offset(0, 1, v_key) + 9] = nan;
        let (o, _) = run_device::<R>(&s, &plan, &upload(&client, &t));
        let os = p.o_strides();
        for h in 0..2 {
            for i in 0..p.q_len {
                let r = &o[os.offset(0, h, i)..][..p.v_head_dim];
                let poisoned = if h == 0 { i >= key } else { i == row || i >= v_key };
                if poisoned {
                    assert!(r.iter().all(|x| x.is_nan()), "{format} head {h} row {i} must be NaN");
                } else {
                    assert!(r.iter().all(|x| x.is_finite()), "{format} head {h} row {i} must stay finite");
                }
            }
        }
    }
}

#[test]
fn fp8_entry_points_refuse_what_they_cannot_run() {
    let Some(s) = session() else { return };
    let client = s.cubecl_client::<WgpuRuntime>().unwrap();
    let p = AttentionProblem::new(1, 2, 16, 64).kv_len(40);
    // FP8 P needs an FP8 matrix unit: a typed refusal, the emulation still plans.
    let pfp8 = Precision::Fp8 { format: Fp8Format::E4M3, descale: DescaleGranularity::PerTensor, p: PvFormat::Fp8 };
    let err = s.plan(&p, pfp8, Strategy::Auto).unwrap_err();
    assert!(matches!(err, Error::UnsupportedPrecision { .. }), "{err}");
    assert!(s.plan(&p, pfp8, Strategy::Reference).is_ok());
    // A head dim the kernel lacks.
    let err = s.plan(&AttentionProblem::new(1, 1, 8, 48), Precision::FP8_DEFAULT, Strategy::Auto).unwrap_err();
    assert!(matches!(err, Error::UnsupportedHeadDim { .. }), "{err}");

    let descale = DescaleGranularity::PerBlock;
    let plan = s.plan(&p, fp8(Fp8Format::E4M3, descale), Strategy::Auto).unwrap();
    let (q, k, v) = f16_inputs(&p, 3);
    let d = upload(&client, &quantize(&p, &plan, Fp8Format::E4M3, descale, (&q, &k, &v)));
    let o = client.empty(p.o_len_elems() * 2);
    let t = CubeclTensors { q: &d.q, k: &d.k, v: &d.v, o: &o, lse: None };
    // An FP8 plan through the float entry point, a float plan through the FP8 one.
    let err = s.run_cubecl::<WgpuRuntime>(&plan, t).unwrap_err();
    assert!(matches!(err, Error::EntryPoint { .. }), "{err}");
    let f16_plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    let err = s.run_cubecl_fp8::<WgpuRuntime>(&f16_plan, t, Fp8Descales { q: &d.dq, k: &d.dk, v: &d.dv }).unwrap_err();
    assert!(matches!(err, Error::EntryPoint { .. }), "{err}");
    // Per-block descales of K passed where V's are expected is fine (same count); a per-tensor
    // descale where blocks are expected is not.
    let one = client.create_from_slice(bytemuck::cast_slice(&[1.0f32]));
    let err = s.run_cubecl_fp8::<WgpuRuntime>(&plan, t, Fp8Descales { q: &d.dq, k: &one, v: &d.dv }).unwrap_err();
    assert!(matches!(err, Error::Descales { tensor: quattn::TensorName::K, .. }), "{err}");
    // Codes too short for the shape.
    let short = client.create_from_slice(&[0x38u8; 16]);
    let err = s.run_cubecl_fp8::<WgpuRuntime>(&plan, CubeclTensors { v: &short, ..t }, Fp8Descales { q: &d.dq, k: &d.dk, v: &d.dv }).unwrap_err();
    assert!(matches!(err, Error::BufferLength { tensor: quattn::TensorName::V, .. }), "{err}");
}

/// `plan` with its FP8 row decode kernel's split replaced by one split (O written directly).
fn one_split(mut plan: quattn::Plan) -> quattn::Plan {
    use quattn_cubecl::{DecodeTiles, Fp8Tiles, Fp8Tiling, PortableKernel};
    let quattn::KernelId::Portable { kernel: PortableKernel::Fp8(f), name } = plan.kernel.clone() else {
        panic!("not a portable FP8 kernel: {}", plan.kernel)
    };
    let Fp8Tiling::Decode(d) = f.tiles else { panic!("not the row decode kernel: {name}") };
    let kps = (plan.problem.kv_len as u32).next_multiple_of(d.bk());
    let tiles = Fp8Tiling::Decode(DecodeTiles { splits: 1, keys_per_split: kps, ..d });
    plan.kernel = quattn::KernelId::Portable { kernel: PortableKernel::Fp8(Fp8Tiles { tiles, ..f }), name };
    plan
}

/// Decode shapes (at most 8 packed rows per KV head, at least 512 keys) plan on the FP8 decode
/// family, with one split and with the split Auto chose (merged), against f64 and the
/// emulation with the kernel's descale blocks, for both formats and every descale granularity.
/// On CUDA (sm_89 and later) per-tensor and per-head descales run the MMA decode kernel and
/// per-block ones the row kernel, both through the device's FP8 conversion; elsewhere the row
/// kernel decodes in integer instructions: each is checked where a device runs it.
#[test]
fn fp8_decode_shapes_run_the_row_decode_kernel() {
    decode_shapes(session(), Strategy::Auto, false);
}

#[test]
fn cuda_fp8_decode_shapes_run_the_decode_kernels() {
    // CUDA's Auto takes the native FP8 kernels: the portable family is asked for.
    decode_shapes(common::open(Device::Cuda(0)), Strategy::Portable, true);
}

fn decode_shapes(s: Option<Session>, strategy: Strategy, mma: bool) {
    let Some(s) = s else { return };
    let shapes = [
        // GQA 4, one position, a ragged cache.
        AttentionProblem::new(1, 8, 1, 128).kv_heads(2).kv_len(700),
        // GQA 4 x 2 positions = 8 rows, causal, BSHD, d 64.
        AttentionProblem::new(2, 4, 2, 64).kv_heads(1).kv_len(1000).causal(true).layout(Layout::Bshd),
    ];
    for (i, p) in shapes.into_iter().enumerate() {
        let p = p.with_lse(true);
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for descale in [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock] {
                let prec = fp8(format, descale);
                let auto = s.plan(&p, prec, strategy).unwrap_or_else(|e| panic!("plan {prec} {p:?}: {e}"));
                assert!(auto.kernel.to_string().contains("decode"), "{prec} {p:?}: {}", auto.kernel);
                let on_mma = auto.kernel.to_string().contains("_mma");
                assert_eq!(on_mma, mma && descale != DescaleGranularity::PerBlock, "{prec} {p:?}: {}", auto.kernel);
                let (q, k, v) = f16_inputs(&p, 900 + i as u64);
                let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
                let emu = quattn::emulation::emulate(&p, prec, &auto.blocking.unwrap(), &q, &k, &v).unwrap();
                for plan in [auto.clone(), one_split(auto.clone())] {
                    let out = s.run(&plan, &q, &k, &v).unwrap();
                    let m = ErrorMetrics::compare(&out.o, &r.o);
                    let tol = Tolerance::for_precision(prec);
                    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
                    assert!(tol.accepts(&m, ref_max), "{} {p:?}: {m:?} vs {tol:?}", plan.kernel);
                    let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
                    let me = ErrorMetrics::compare(&out.o, &e);
                    assert!(me.rel_l2 < 1e-3, "{} {p:?}: kernel vs emulation {me:?}", plan.kernel);
                    let el: Vec<f64> = emu.lse.iter().map(|&x| x as f64).collect();
                    let lm = compare_lse(out.lse.as_ref().unwrap(), &el).expect("LSE infinities match");
                    assert!(lm.max_abs < 1e-4, "{} LSE vs emulation {lm:?}", plan.kernel);
                }
            }
        }
    }
}

/// NaN codes through the row decode kernel, split and merged or written directly: a NaN in K
/// poisons the positions whose causal window reaches its key, a NaN in Q only its own row.
#[test]
fn fp8_decode_nan_codes_poison_only_the_rows_that_see_them() {
    decode_nan_codes::<WgpuRuntime>(session(), Strategy::Auto);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_fp8_decode_nan_codes_poison_only_the_rows_that_see_them() {
    decode_nan_codes::<cubecl::cuda::CudaRuntime>(common::open(Device::Cuda(0)), Strategy::Portable);
}

fn decode_nan_codes<R: cubecl::Runtime>(s: Option<Session>, strategy: Strategy) {
    let Some(s) = s else { return };
    let client = s.cubecl_client::<R>().unwrap();
    // 2 KV heads, GQA 2 x 4 positions; bottom-right causal: position i sees keys <= i + 596.
    let p = AttentionProblem::new(1, 4, 4, 64).kv_heads(2).kv_len(600).causal(true).with_lse(true);
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let descale = DescaleGranularity::PerHead;
        let auto = s.plan(&p, fp8(format, descale), strategy).unwrap();
        assert!(auto.kernel.to_string().contains("decode"), "{}", auto.kernel);
        let (q, k, v) = f16_inputs(&p, 19);
        let mut t = quantize(&p, &auto, format, descale, (&q, &k, &v));
        let nan = match format {
            Fp8Format::E4M3 => 0x7F,
            Fp8Format::E5M2 => 0x7E,
        };
        let (key, row) = (598, 1);
        // KV head 0 (q heads 0, 1): a NaN in V's key 598 (positions 2 and 3 see it); KV head 1
        // (q heads 2, 3): a NaN in K's key 597 (positions 1 to 3); q head 3: a NaN in Q's
        // position 1.
        t[2].codes[p.v_strides().offset(0, 0, key) + 7] = nan;
        t[1].codes[p.k_strides().offset(0, 1, key - 1) + 5] = nan;
        t[0].codes[p.q_strides().offset(0, 3, row) + 2] = nan;
        let d = upload(&client, &t);
        for plan in [auto.clone(), one_split(auto.clone())] {
            let (o, lse) = run_device::<R>(&s, &plan, &d);
            let os = p.o_strides();
            for h in 0..4 {
                for i in 0..p.q_len {
                    let r = &o[os.offset(0, h, i)..][..p.v_head_dim];
                    let poisoned = (h < 2 && i + 596 >= key) || (h >= 2 && i + 596 >= key - 1) || (h == 3 && i == row);
                    let l = lse[h * p.q_len + i];
                    if poisoned {
                        assert!(r.iter().all(|x| x.is_nan()) && l.is_nan(), "{} head {h} row {i} must be NaN", plan.kernel);
                    } else {
                        assert!(r.iter().all(|x| x.is_finite()) && l.is_finite(), "{} head {h} row {i} must stay finite", plan.kernel);
                    }
                }
            }
        }
    }
}
