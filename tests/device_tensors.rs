//! The device-tensor API: caller-held device buffers in, O (and the LSE) written on the device
//! in the plan's element type, bit-identical to the host path (which uploads and runs the same
//! launch) and within tolerance of the f64 reference; buffers that do not fit the plan are
//! typed errors before anything is enqueued.

mod common;

use half::f16;
use quattn::cubecl::wgpu::WgpuRuntime;
use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{
    inputs, reference, AttentionProblem, CubeclTensors, Device, Error, Precision, Session, Strategy, TensorName,
    TensorStrides, WgpuAdapter,
};

fn half(x: &[f32]) -> Vec<f16> {
    x.iter().map(|&a| f16::from_f32(a)).collect()
}

fn widen(x: &[f16]) -> Vec<f32> {
    x.iter().map(|a| a.to_f32()).collect()
}

/// Runs `p` through CubeCL handles and through the host path; returns the device O and LSE.
fn run_handles(s: &Session, p: &AttentionProblem, q: &[f16], k: &[f16], v: &[f16]) -> (Vec<f16>, Vec<f32>) {
    let plan = s.plan(p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    let c = s.cubecl_client::<WgpuRuntime>().unwrap();
    let up = |x: &[f16]| c.create_from_slice(bytemuck::cast_slice(x));
    let (qh, kh, vh) = (up(q), up(k), up(v));
    // Poisoned outputs: a kernel that skips an element leaves NaN behind.
    let oh = up(&vec![f16::NAN; p.o_len_elems()]);
    let lh = c.create_from_slice(bytemuck::cast_slice(&vec![f32::NAN; p.lse_len_elems()]));
    s.run_cubecl::<WgpuRuntime>(&plan, CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) }).unwrap();
    let o: Vec<f16> = bytemuck::pod_collect_to_vec(&c.read_one(oh).unwrap());
    let lse: Vec<f32> = bytemuck::pod_collect_to_vec(&c.read_one(lh).unwrap());
    (o[..p.o_len_elems()].to_vec(), lse[..p.lse_len_elems()].to_vec())
}

#[test]
fn wgpu_handles_in_handles_out() {
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    for (i, p) in [
        AttentionProblem::new(2, 4, 100, 64).kv_heads(2).kv_len(150).causal(true).with_lse(true),
        AttentionProblem::new(1, 2, 33, 128).layout(quattn::Layout::Bshd).with_lse(true),
    ]
    .into_iter()
    .enumerate()
    {
        let (q, k, v) = inputs::qkv(&p, 40 + i as u64);
        let (q, k, v) = (half(&q), half(&k), half(&v));
        let (o, lse) = run_handles(&s, &p, &q, &k, &v);

        let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        let host = s.run(&plan, &q, &k, &v).unwrap();
        assert!(o.iter().zip(&host.o).all(|(a, b)| a.to_f32().to_bits() == b.to_bits()), "{p:?}: device O differs from the host path");
        assert_eq!(lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), host.lse.unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>());

        let r = reference::attention_f64(&p, &widen(&q), &widen(&k), &widen(&v)).unwrap();
        let m = ErrorMetrics::compare(&widen(&o), &r.o);
        let ref_max = r.o.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        assert!(Tolerance::for_precision(Precision::F16_DEFAULT).accepts(&m, ref_max), "{p:?}: {m:?}");
        let lm = compare_lse(&lse, &r.lse).expect("LSE infinities agree");
        assert!(lm.max_abs < 1e-2, "{lm:?}");
    }
}

/// Q, K, V as views into one packed QKV buffer per token (`[batch, seq, 3, heads, dim]`, what a
/// fused projection writes), O into a buffer with padding between rows: explicit strides, no
/// copy.
#[test]
fn wgpu_strided_views_of_a_packed_qkv_buffer() {
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    // h · d · 2 bytes = 256: the views' offsets meet wgpu's storage-buffer offset alignment.
    let (b, h, n, d) = (2, 2, 40, 64);
    let tok = 3 * h * d;
    let view = |which: usize| which * h * d;
    let qkv_strides = quattn::Strides { batch: n * tok, head: d, seq: tok };
    let o_strides = quattn::Strides { batch: n * (h * d + 8), head: d, seq: h * d + 8 };
    let p = AttentionProblem::new(b, h, n, d)
        .causal(true)
        .strides(TensorStrides { q: qkv_strides, k: qkv_strides, v: qkv_strides, o: o_strides });
    p.validate().unwrap();
    let packed = half(&inputs::normal_with_outliers(b * n * tok, 5));
    // Dense copies for the reference.
    let dense = |which: usize| -> Vec<f32> {
        let mut out = Vec::with_capacity(b * h * n * d);
        for bi in 0..b {
            for hi in 0..h {
                for si in 0..n {
                    let at = view(which) + qkv_strides.offset(bi, hi, si);
                    out.extend(packed[at..at + d].iter().map(|x| x.to_f32()));
                }
            }
        }
        out
    };
    let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    let c = s.cubecl_client::<WgpuRuntime>().unwrap();
    let whole = c.create_from_slice(bytemuck::cast_slice(&packed));
    // Views into the packed buffer: the handle offset selects Q, K or V.
    let part = |which: usize| whole.clone().offset_start((view(which) * 2) as u64);
    let (qh, kh, vh) = (part(0), part(1), part(2));
    let oh = c.create_from_slice(bytemuck::cast_slice(&vec![f16::NAN; p.o_len_elems()]));
    s.run_cubecl::<WgpuRuntime>(&plan, CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: None }).unwrap();
    let o: Vec<f16> = bytemuck::pod_collect_to_vec(&c.read_one(oh).unwrap());

    let dp = AttentionProblem::new(b, h, n, d).causal(true);
    let r = reference::attention_f64(&dp, &dense(0), &dense(1), &dense(2)).unwrap();
    let mut got = Vec::with_capacity(b * h * n * d);
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..n {
                let at = o_strides.offset(bi, hi, si);
                got.extend(o[at..at + d].iter().map(|x| x.to_f32()));
            }
        }
    }
    let m = ErrorMetrics::compare(&got, &r.o);
    assert!(m.rel_l2 < 2e-3, "{m:?}");
    // The padding between O's rows is never written.
    assert!(o[h * d..h * d + 8].iter().all(|x| x.is_nan()), "padding written");
}

#[test]
fn wgpu_handles_that_do_not_fit_are_typed_errors() {
    let Some(s) = common::open(Device::Wgpu(WgpuAdapter::Default)) else { return };
    let p = AttentionProblem::new(1, 2, 64, 64).with_lse(true);
    let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    let c = s.cubecl_client::<WgpuRuntime>().unwrap();
    let ok = c.empty(p.q_len_elems() * 2);
    let short = c.empty(p.q_len_elems() * 2 - 2);
    let lse = c.empty(p.lse_len_elems() * 4);
    let e = s.run_cubecl::<WgpuRuntime>(&plan, CubeclTensors { q: &ok, k: &short, v: &ok, o: &ok, lse: Some(&lse) }).unwrap_err();
    assert!(matches!(e, Error::BufferLength { tensor: TensorName::K, .. }), "{e}");
    let e = s.run_cubecl::<WgpuRuntime>(&plan, CubeclTensors { q: &ok, k: &ok, v: &ok, o: &ok, lse: None }).unwrap_err();
    assert!(matches!(e, Error::BufferLength { tensor: TensorName::Lse, .. }), "{e}");
}

#[test]
fn cubecl_handles_on_the_cpu_device_are_refused() {
    let s = Session::new(Device::Cpu).unwrap();
    assert!(matches!(s.cubecl_client::<WgpuRuntime>(), Err(Error::WrongDevice { .. })));
}

#[test]
fn overlapping_output_strides_are_refused() {
    let st = quattn::Strides { batch: 64 * 64, head: 64, seq: 32 };
    let p = AttentionProblem::new(1, 1, 64, 64).strides(TensorStrides { q: st, k: st, v: st, o: st });
    let e = p.validate().unwrap_err();
    assert!(matches!(e, Error::InvalidStrides { tensor: TensorName::Output, .. }), "{e}");
}

/// Caller-owned cudarc buffers on the caller's stream: f16 in, f16 O out, bit-identical to the
/// host path and within tolerance of f64. Skipped with a reason where no CUDA GPU is present.
#[cfg(feature = "cuda")]
#[test]
fn cuda_slices_on_the_callers_stream() {
    use quattn::cudarc::driver::CudaContext;
    use quattn::{CudaTensor, CudaTensorMut};
    let Some(s) = common::open(Device::Cuda(0)) else { return };
    let p = AttentionProblem::new(2, 8, 300, 128).kv_heads(2).kv_len(500).causal(true).with_lse(true);
    let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    let (q, k, v) = inputs::qkv(&p, 3);
    let (q, k, v) = (half(&q), half(&k), half(&v));
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let (dq, dk, dv) = (stream.clone_htod(&q).unwrap(), stream.clone_htod(&k).unwrap(), stream.clone_htod(&v).unwrap());
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
    .unwrap();
    let o = stream.clone_dtoh(&d_o).unwrap();
    let lse = stream.clone_dtoh(&d_lse).unwrap();
    let host = s.run(&plan, &q, &k, &v).unwrap();
    assert!(o.iter().zip(&host.o).all(|(a, b)| a.to_f32().to_bits() == b.to_bits()), "device O differs from the host path");
    assert_eq!(lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), host.lse.unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    let r = reference::attention_f64(&p, &widen(&q), &widen(&k), &widen(&v)).unwrap();
    let m = ErrorMetrics::compare(&widen(&o), &r.o);
    assert!(m.rel_l2 < 2e-3, "{m:?}");
    // A wrong element type is refused before any launch.
    let d32 = stream.alloc_zeros::<f32>(p.q_len_elems()).unwrap();
    let e = s
        .run_cuda(
            &plan,
            &stream,
            CudaTensor::new(&d32, &stream),
            CudaTensor::new(&dk, &stream),
            CudaTensor::new(&dv, &stream),
            CudaTensorMut::new(&mut d_o, &stream),
            Some(CudaTensorMut::new(&mut d_lse, &stream)),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Dtype { tensor: TensorName::Q, .. }), "{e}");
}
