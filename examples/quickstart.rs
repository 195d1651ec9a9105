//! The README's quick start: attention on the best device present, checked against the f64
//! reference. Runs anywhere (a CUDA GPU, else a hardware wgpu adapter, else the CPU).
use half::f16;
use quattn::{AttentionProblem, Device, Precision, Session, Strategy};

fn main() -> Result<(), quattn::Error> {
    // One sequence of 256 tokens, 8 query heads sharing 2 KV heads, head dim 64, causal.
    let problem = AttentionProblem::new(1, 8, 256, 64).kv_heads(2).causal(true).with_lse(true);
    let session = Session::new(Device::Auto)?; // keeps device clients and compiled kernels
    let plan = session.plan(&problem, Precision::F16_DEFAULT, Strategy::Auto)?; // validates, picks the kernel
    println!("{} runs {}", session.info().adapter, plan.kernel_name());

    // Inputs in the problem's layout (BHSD here), any of f32 / f16 / bf16.
    let fill = |n: usize, seed: u32| -> Vec<f16> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f16::from_f32((x % 2001) as f32 / 1000.0 - 1.0)
            })
            .collect()
    };
    let (q, k, v) = (fill(problem.q_len_elems(), 1), fill(problem.k_len_elems(), 2), fill(problem.v_len_elems(), 3));

    let out = session.run(&plan, &q, &k, &v)?; // O in the problem's layout, LSE [batch, heads, q_len]

    // The independent f64 reference on the same (f16-rounded) inputs.
    let widen = |x: &[f16]| x.iter().map(|a| a.to_f32()).collect::<Vec<f32>>();
    let reference = quattn::reference::attention_f64(&problem, &widen(&q), &widen(&k), &widen(&v))?;
    let err = quattn::metrics::ErrorMetrics::compare(&out.o, &reference.o);
    println!("rel-L2 {:.2e}, cos-sim {:.6}, LSE of row 0: {:.4}", err.rel_l2, err.cos_sim, out.lse.as_ref().map_or(f32::NAN, |l| l[0]));
    assert!(err.rel_l2 < 2e-3, "rel-L2 {:.2e} above the f16 tolerance", err.rel_l2);
    Ok(())
}
