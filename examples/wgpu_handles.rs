//! Device tensors on wgpu: Q, K, V as CubeCL handles of the session's client, O and the LSE
//! written into handles the caller allocated, nothing copied through the host until the caller
//! reads O. Runs on any wgpu adapter, mesa's llvmpipe software Vulkan included.
use quattn::cubecl::wgpu::WgpuRuntime;
use half::f16;
use quattn::{AttentionProblem, CubeclTensors, Device, Precision, Session, Strategy, WgpuAdapter};

fn main() -> Result<(), quattn::Error> {
    let session = match Session::new(Device::Wgpu(WgpuAdapter::Default)) {
        Ok(s) => s,
        Err(e) => {
            println!("skipped: no wgpu adapter ({e})");
            return Ok(());
        }
    };
    let problem = AttentionProblem::new(2, 4, 100, 64).kv_heads(2).kv_len(150).causal(true).with_lse(true);
    let plan = session.plan(&problem, Precision::F16_DEFAULT, Strategy::Auto)?;
    println!("{} runs {}", session.info().adapter, plan.kernel_name());

    let (q, k, v) = quattn::inputs::qkv(&problem, 7);
    let half = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
    let (q, k, v) = (half(&q), half(&k), half(&v));

    // What a CubeCL (or burn) program holds: handles on the device's client.
    let client = session.cubecl_client::<WgpuRuntime>()?;
    let bytes = |x: &[f16]| client.create_from_slice(bytemuck::cast_slice(x));
    let (qh, kh, vh) = (bytes(&q), bytes(&k), bytes(&v));
    let oh = client.empty(problem.o_len_elems() * 2);
    let lh = client.empty(problem.lse_len_elems() * 4);

    session.run_cubecl::<WgpuRuntime>(&plan, CubeclTensors { q: &qh, k: &kh, v: &vh, o: &oh, lse: Some(&lh) })?;

    // Read back only to check: O is f16 on the device, like the inputs.
    let o: Vec<f16> = bytemuck::pod_collect_to_vec(&client.read_one(oh).expect("read O"));
    let host = session.run(&plan, &q, &k, &v)?;
    let same = o.iter().zip(&host.o).all(|(a, b)| a.to_f32().to_bits() == b.to_bits());
    let widen = |x: &[f16]| x.iter().map(|a| a.to_f32()).collect::<Vec<f32>>();
    let reference = quattn::reference::attention_f64(&problem, &widen(&q), &widen(&k), &widen(&v))?;
    let err = quattn::metrics::ErrorMetrics::compare(&widen(&o), &reference.o);
    println!("device-tensor O bit-identical to the host path: {same}; rel-L2 vs f64 {:.2e}", err.rel_l2);
    assert!(same && err.rel_l2 < 2e-3);
    Ok(())
}
