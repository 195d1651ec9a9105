//! Device tensors on CUDA: caller-owned cudarc buffers and the caller's stream. quattn enqueues
//! its kernels on that stream and returns without synchronizing; O comes back in f16 on the
//! device. Prints why it skips on a machine without a CUDA GPU.
use half::f16;
use quattn::cudarc::driver::CudaContext;
use quattn::{AttentionProblem, CudaTensor, CudaTensorMut, Device, Precision, Session, Strategy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let session = match Session::new(Device::Cuda(0)) {
        Ok(s) => s,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    let problem = AttentionProblem::new(2, 16, 1000, 128).kv_heads(4).causal(true).with_lse(true);
    let plan = session.plan(&problem, Precision::F16_DEFAULT, Strategy::Auto)?;
    println!("{} runs {}", session.info().adapter, plan.kernel_name());

    let (q, k, v) = quattn::inputs::qkv(&problem, 11);
    let half = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
    let (q, k, v) = (half(&q), half(&k), half(&v));

    // The caller's context (the device's primary context, shared with quattn) and stream.
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let (dq, dk, dv) = (stream.clone_htod(&q)?, stream.clone_htod(&k)?, stream.clone_htod(&v)?);
    let mut d_o = stream.alloc_zeros::<f16>(problem.o_len_elems())?;
    let mut d_lse = stream.alloc_zeros::<f32>(problem.lse_len_elems())?;

    session.run_cuda(
        &plan,
        &stream,
        CudaTensor::new(&dq, &stream),
        CudaTensor::new(&dk, &stream),
        CudaTensor::new(&dv, &stream),
        CudaTensorMut::new(&mut d_o, &stream),
        Some(CudaTensorMut::new(&mut d_lse, &stream)),
    )?;
    let o = stream.clone_dtoh(&d_o)?; // waits for the stream

    let host = session.run(&plan, &q, &k, &v)?;
    let same = o.iter().zip(&host.o).all(|(a, b)| a.to_f32().to_bits() == b.to_bits());
    let widen = |x: &[f16]| x.iter().map(|a| a.to_f32()).collect::<Vec<f32>>();
    let reference = quattn::reference::attention_f64(&problem, &widen(&q), &widen(&k), &widen(&v))?;
    let err = quattn::metrics::ErrorMetrics::compare(&widen(&o), &reference.o);
    println!("device-tensor O bit-identical to the host path: {same}; rel-L2 vs f64 {:.2e}", err.rel_l2);
    if !same || err.rel_l2 > 2e-3 {
        return Err("device-tensor path disagrees".into());
    }
    Ok(())
}
