//! `quattn bench`: the FlashAttention benchmark grid (head dim × seq, batch = tokens/seq,
//! heads = width/head_dim, causal and not) timed on device-resident inputs; median of many runs
//! after warm-up.

use indicatif::{ProgressBar, ProgressStyle};
use quattn::metrics::flops;
use quattn::{AttentionProblem, Precision, Session};
use serde::Serialize;

use crate::args::{BenchArgs, CausalArg};
use crate::check;
use crate::run::Shape;

/// One row of the table; peers (`crate::peers`) produce the same rows.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub device: String,
    pub adapter: String,
    pub kernel: Option<String>,
    pub precision: String,
    pub shape: Shape,
    pub ms: Option<f64>,
    pub tflops: Option<f64>,
    /// Why the row did not run, when it did not.
    pub skipped: Option<String>,
}

pub fn grid(a: &BenchArgs) -> Vec<AttentionProblem> {
    let mut v = Vec::new();
    let causals: &[bool] = match a.causal {
        CausalArg::Both => &[false, true],
        CausalArg::Causal => &[true],
        CausalArg::NonCausal => &[false],
    };
    if !a.varlen.is_empty() {
        for &d in &a.head_dims {
            for &c in causals {
                let p = crate::args::varlen(AttentionProblem::new(1, (a.width / d).max(1), 1, d).causal(c), &a.varlen);
                let p = match a.kv_heads {
                    Some(kv) => p.kv_heads(kv),
                    None => p,
                };
                v.push(a.mods.apply(p, 17));
            }
        }
        return v;
    }
    for &d in &a.head_dims {
        for &s in &a.seqs {
            for &c in causals {
                let batch = (a.tokens / s).max(1);
                let heads = (a.width / d).max(1);
                let layout = match a.layout {
                    crate::args::LayoutArg::Bhsd => quattn::Layout::Bhsd,
                    crate::args::LayoutArg::Bshd => quattn::Layout::Bshd,
                };
                let p = a.mods.apply(AttentionProblem::new(batch, heads, a.q_len.unwrap_or(s), d).kv_len(s).causal(c).layout(layout), 17);
                let p = match a.kv_heads {
                    Some(kv) => p.kv_heads(kv),
                    None => p,
                };
                v.push(crate::args::paged(p, a.page_size, 17));
            }
        }
    }
    v
}

pub fn main(a: &BenchArgs) -> anyhow::Result<i32> {
    if a.api_overhead {
        return api_overhead(a);
    }
    let session = Session::new(a.dev.device())?;
    let info = session.info();
    let problems = grid(a);
    let bar = ProgressBar::new((problems.len() * a.precision.len()) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()));
    let mut rows = Vec::new();
    for p in &problems {
        for &prec in &a.precision {
            bar.set_message(format!("{} d{} s{}{}", prec, p.head_dim, p.q_len, if p.causal { " causal" } else { "" }));
            let new = bench_one(&session, p, prec, a).unwrap_or_else(|e| {
                vec![Row {
                    device: info.kind.into(),
                    adapter: info.adapter.clone(),
                    kernel: None,
                    precision: prec.name(),
                    shape: Shape::of(p),
                    ms: None,
                    tflops: None,
                    skipped: Some(e.to_string()),
                }]
            });
            for row in new {
                if a.json {
                    bar.suspend(|| println!("{}", serde_json::to_string(&row).unwrap_or_default()));
                }
                rows.push(row);
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    if a.peers {
        let p = crate::peers::cubek_rows(&problems, a.dev.device(), crate::peers::CubekVariant::DEFAULTS, a.warmup, a.iters.max(1));
        for r in p {
            if a.json {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
            }
            rows.push(r);
        }
    }
    if !a.json {
        println!("device: {} ({})", info.kind, info.adapter);
        println!("{:<10} {:>4} {:>6} {:>5} {:>5} {:>7} {:>10} {:>9}  kernel", "precision", "hd", "seq", "batch", "heads", "causal", "ms", "TFLOP/s");
        for r in &rows {
            let s = &r.shape;
            match (&r.ms, &r.tflops, &r.skipped) {
                (Some(ms), Some(tf), _) => println!(
                    "{:<10} {:>4} {:>6} {:>5} {:>5} {:>7} {:>10.3} {:>9.2}  {}",
                    r.precision,
                    s.head_dim,
                    s.seq,
                    s.batch,
                    s.heads,
                    s.causal,
                    ms,
                    tf,
                    r.kernel.as_deref().unwrap_or("")
                ),
                (_, _, skipped) => println!(
                    "{:<10} {:>4} {:>6} {:>5} {:>5} {:>7}  skipped: {}",
                    r.precision,
                    s.head_dim,
                    s.seq,
                    s.batch,
                    s.heads,
                    s.causal,
                    skipped.as_deref().unwrap_or("")
                ),
            }
        }
    }
    Ok(0)
}

/// One row, end to end; plans that run in steps (INT8: prepass, then the kernel) add a second
/// row for the kernel alone, named `<kernel> (kernel only)`.
fn bench_one(session: &Session, p: &AttentionProblem, prec: Precision, a: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let info = session.info();
    let plan = session.plan(p, prec, a.dev.strategy())?;
    let (q, k, v) = check::inputs(p, prec, 17);
    let mut r = session.upload(&plan, &q, &k, &v)?;
    let row = |kernel: String, ms: f64| Row {
        device: info.kind.into(),
        adapter: info.adapter.clone(),
        kernel: Some(kernel),
        precision: prec.name(),
        shape: Shape::of(p),
        ms: Some(ms),
        tflops: Some(flops(p) / (ms * 1e-3) / 1e12),
        skipped: None,
    };
    let mut t = session.time(&mut r, a.warmup, a.iters.max(1))?;
    let mut rows = vec![row(plan.kernel_name(), check::median(&mut t))];
    if let Some(mut k) = session.time_kernel(&mut r, a.warmup, a.iters.max(1))? {
        rows.push(row(format!("{} (kernel only)", plan.kernel_name()), check::median(&mut k)));
    }
    Ok(rows)
}

/// Host microseconds per call of the device-tensor path, of a launch on the session's resident
/// buffers, and of a bare cudarc launch of an empty kernel on the same stream with the same
/// tensors as arguments (the driver's and cudarc's share, which any caller pays): what quattn
/// adds is the difference. Plus the device time per call, at a decode shape.
fn api_overhead(a: &BenchArgs) -> anyhow::Result<i32> {
    use half::f16;
    use quattn::cudarc::driver::CudaContext;
    use quattn::{CudaTensor, CudaTensorMut, Device, Precision, Strategy};
    use std::time::Instant;
    let session = Session::new(Device::Cuda(a.dev.ordinal))?;
    let p = AttentionProblem::new(8, 32, 1, 128).kv_heads(8).kv_len(8192);
    let plan = session.plan(&p, Precision::F16_DEFAULT, Strategy::Auto)?;
    let (q, k, v) = check::inputs(&p, Precision::F16_DEFAULT, 5);
    let half = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
    let ctx = CudaContext::new(a.dev.ordinal)?;
    let stream = ctx.new_stream()?;
    let (dq, dk, dv) = (stream.clone_htod(&half(&q))?, stream.clone_htod(&half(&k))?, stream.clone_htod(&half(&v))?);
    let mut o = stream.alloc_zeros::<f16>(p.o_len_elems())?;
    // Batches short enough that the launch queue never fills (the host then measures its own
    // work, not the device's), synchronized between batches; only the enqueue is timed.
    let (batches, per) = (a.iters.max(1), 200usize);
    let calls = batches * per;
    let mut enqueue = |n: usize| -> anyhow::Result<f64> {
        let t = Instant::now();
        for _ in 0..n {
            session.run_cuda(
                &plan,
                &stream,
                CudaTensor::new(&dq, &stream),
                CudaTensor::new(&dk, &stream),
                CudaTensor::new(&dv, &stream),
                CudaTensorMut::new(&mut o, &stream),
                None,
            )?;
        }
        let host = t.elapsed().as_secs_f64();
        stream.synchronize()?;
        Ok(host)
    };
    enqueue(per)?;
    let mut host = 0.0;
    for _ in 0..batches {
        host += enqueue(per)?;
    }
    // The floor: an empty kernel with the same five pointers, launched through cudarc's builder
    // (which orders the tensors' streams as the device-tensor path does).
    let ptx = quattn::cudarc::nvrtc::compile_ptx(
        "extern \"C\" __global__ void nop(const void* q, const void* k, const void* v, void* o, void* lse) {}",
    )?;
    let nop = ctx.load_module(ptx)?.load_function("nop")?;
    let cfg = quattn::cudarc::driver::LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    let lse_null = 0u64;
    let mut bare_batch = |n: usize| -> anyhow::Result<f64> {
        use quattn::cudarc::driver::PushKernelArg;
        let t = Instant::now();
        for _ in 0..n {
            let mut b = stream.launch_builder(&nop);
            b.arg(&dq).arg(&dk).arg(&dv).arg(&mut o).arg(&lse_null);
            // SAFETY: the kernel reads and writes nothing.
            unsafe { b.launch(cfg) }?;
        }
        let host = t.elapsed().as_secs_f64();
        stream.synchronize()?;
        Ok(host)
    };
    bare_batch(per)?;
    let mut bare = 0.0;
    for _ in 0..batches {
        bare += bare_batch(per)?;
    }
    let mut r = session.upload(&plan, &q, &k, &v)?;
    let mut resident_host = 0.0;
    for i in 0..=batches {
        session.synchronize()?;
        let t = Instant::now();
        for _ in 0..per {
            session.execute(&mut r)?;
        }
        if i > 0 {
            resident_host += t.elapsed().as_secs_f64();
        }
    }
    session.synchronize()?;
    let mut device = session.time(&mut r, a.warmup, a.iters.max(1))?;
    let out = serde_json::json!({
        "bench": "api_overhead",
        "adapter": session.info().adapter,
        "kernel": plan.kernel_name(),
        "shape": Shape::of(&p),
        "calls": calls,
        "run_cuda_host_us": host / calls as f64 * 1e6,
        "execute_host_us": resident_host / calls as f64 * 1e6,
        "bare_launch_host_us": bare / calls as f64 * 1e6,
        "added_host_us": (host - bare) / calls as f64 * 1e6,
        "device_us": check::median(&mut device) * 1e3,
    });
    println!("{out}");
    Ok(0)
}
