//! On a GPU: run every HMMA variant against an f64 CPU reference (non-causal, causal, GQA,
//! ragged lengths, bshd strides) and time the hd128 forward at seq 4k.
//!
//! `cargo run --release -p quattn-native --example hmma_check [-- --bench-only|--check-only]`

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use half::{bf16, f16};
use quattn_native::{HmmaArgs, HmmaConfig, HmmaKernel, InputType, PvAccum, QkAccum, Strides};

type BoxErr = Box<dyn std::error::Error>;

/// Deterministic normal-ish samples (sum of uniforms), no RNG dependency.
fn samples(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                acc += ((s >> 40) as f32) / ((1u64 << 24) as f32) - 0.5;
            }
            acc * 1.732
        })
        .collect()
}

fn to_bits(x: &[f32], input: InputType) -> Vec<u16> {
    match input {
        InputType::F16 => x.iter().map(|v| f16::from_f32(*v).to_bits()).collect(),
        InputType::Bf16 => x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect(),
    }
}
fn from_bits(x: &[u16], input: InputType) -> Vec<f32> {
    match input {
        InputType::F16 => x.iter().map(|v| f16::from_bits(*v).to_f32()).collect(),
        InputType::Bf16 => x.iter().map(|v| bf16::from_bits(*v).to_f32()).collect(),
    }
}

struct Case {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    causal: bool,
    bshd: bool,
}

fn check(stream: &Arc<CudaStream>, kernel: &HmmaKernel, c: &Case) -> Result<(f64, f64), BoxErr> {
    let cfg = *kernel.config();
    let d = cfg.head_dim as usize;
    let layout = |h, n| if c.bshd { Strides::bshd(h, n, d) } else { Strides::bhsd(h, n, d) };
    let args = HmmaArgs {
        batch: c.batch,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        q_len: c.q_len,
        kv_len: c.kv_len,
        q: layout(c.q_heads, c.q_len),
        k: layout(c.kv_heads, c.kv_len),
        v: layout(c.kv_heads, c.kv_len),
        o: layout(c.q_heads, c.q_len),
        scale: 1.0 / (d as f32).sqrt(),
        causal: c.causal,
    };
    let nq = c.batch * c.q_heads * c.q_len * d;
    let nk = c.batch * c.kv_heads * c.kv_len * d;
    // Inputs rounded to the kernel's dtype; the reference sees exactly those values.
    let q = from_bits(&to_bits(&samples(nq, 1), cfg.input), cfg.input);
    let k = from_bits(&to_bits(&samples(nk, 2), cfg.input), cfg.input);
    let v = from_bits(&to_bits(&samples(nk, 3), cfg.input), cfg.input);
    let qd = stream.clone_htod(&to_bits(&q, cfg.input))?;
    let kd = stream.clone_htod(&to_bits(&k, cfg.input))?;
    let vd = stream.clone_htod(&to_bits(&v, cfg.input))?;
    let mut od = stream.alloc_zeros::<u16>(nq)?;
    let mut ld = stream.alloc_zeros::<f32>(c.batch * c.q_heads * c.q_len)?;
    kernel.launch(stream, &args, &qd, &kd, &vd, &mut od, &mut ld)?;
    let o = from_bits(&stream.clone_dtoh(&od)?, cfg.input);
    let lse = stream.clone_dtoh(&ld)?;

    let at = |s: &Strides, b: usize, h: usize, i: usize| b * s.batch as usize + h * s.head as usize + i * s.seq as usize;
    let (mut err_o, mut err_lse) = (0f64, 0f64);
    let group = c.q_heads / c.kv_heads;
    for b in 0..c.batch {
        for h in 0..c.q_heads {
            let kh = h / group;
            for i in 0..c.q_len {
                let visible = if c.causal {
                    (i as i64 + c.kv_len as i64 - c.q_len as i64 + 1).clamp(0, c.kv_len as i64) as usize
                } else {
                    c.kv_len
                };
                let qo = at(&args.q, b, h, i);
                let mut s: Vec<f64> = (0..visible)
                    .map(|j| {
                        let ko = at(&args.k, b, kh, j);
                        (0..d).map(|x| q[qo + x] as f64 * k[ko + x] as f64).sum::<f64>() * args.scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for x in s.iter_mut() {
                    *x = (*x - m).exp();
                    sum += *x;
                }
                let oo = at(&args.o, b, h, i);
                for x in 0..d {
                    let r = if visible == 0 {
                        0.0
                    } else {
                        (0..visible).map(|j| s[j] * v[at(&args.v, b, kh, j) + x] as f64).sum::<f64>() / sum
                    };
                    err_o = err_o.max((r - o[oo + x] as f64).abs());
                }
                let ref_lse = if visible == 0 { f64::NEG_INFINITY } else { m + sum.ln() };
                let got = lse[(b * c.q_heads + h) * c.q_len + i] as f64;
                let e = if ref_lse.is_infinite() {
                    if got == f64::NEG_INFINITY { 0.0 } else { f64::INFINITY }
                } else {
                    (ref_lse - got).abs()
                };
                err_lse = err_lse.max(e);
            }
        }
    }
    Ok((err_o, err_lse))
}

fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kernel: &HmmaKernel, causal: bool) -> Result<f64, BoxErr> {
    let d = kernel.config().head_dim as usize;
    let (batch, heads, seq) = (4usize, 16usize, 4096usize);
    let s = Strides::bhsd(heads, seq, d);
    let args = HmmaArgs {
        batch, q_heads: heads, kv_heads: heads, q_len: seq, kv_len: seq, q: s, k: s, v: s, o: s,
        scale: 1.0 / (d as f32).sqrt(), causal,
    };
    let n = batch * heads * seq * d;
    let x = to_bits(&samples(n, 7), kernel.config().input);
    let qd = stream.clone_htod(&x)?;
    let kd = stream.clone_htod(&x)?;
    let vd = stream.clone_htod(&x)?;
    let mut od = stream.alloc_zeros::<u16>(n)?;
    let mut ld = stream.alloc_zeros::<f32>(batch * heads * seq)?;
    for _ in 0..3 {
        kernel.launch(stream, &args, &qd, &kd, &vd, &mut od, &mut ld)?;
    }
    let start = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    let iters = 20;
    start.record(stream)?;
    for _ in 0..iters {
        kernel.launch(stream, &args, &qd, &kd, &vd, &mut od, &mut ld)?;
    }
    end.record(stream)?;
    end.synchronize()?;
    let ms = start.elapsed_ms(&end)? as f64 / iters as f64;
    let flops = 4.0 * (batch * heads * seq * seq * d) as f64 * if causal { 0.5 } else { 1.0 };
    Ok(flops / (ms * 1e-3) / 1e12)
}

fn main() -> Result<(), BoxErr> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    println!("device {} cc {:?}", ctx.name()?, ctx.compute_capability()?);
    let cases = [
        Case { batch: 1, q_heads: 2, kv_heads: 2, q_len: 256, kv_len: 256, causal: false, bshd: false },
        Case { batch: 2, q_heads: 4, kv_heads: 2, q_len: 200, kv_len: 333, causal: false, bshd: true },
        Case { batch: 1, q_heads: 4, kv_heads: 1, q_len: 300, kv_len: 333, causal: true, bshd: false },
        Case { batch: 1, q_heads: 2, kv_heads: 2, q_len: 333, kv_len: 130, causal: true, bshd: true },
        Case { batch: 1, q_heads: 1, kv_heads: 1, q_len: 1, kv_len: 77, causal: true, bshd: false },
    ];
    let mut all_ok = true;
    let sweeping = std::env::var_os("QUATTN_SWEEP").is_some();
    for cfg in HmmaConfig::all().into_iter().filter(|_| !sweeping) {
        let kernel = HmmaKernel::load(&ctx, cfg)?;
        let tol = match (cfg.input, cfg.qk, cfg.pv) {
            (InputType::Bf16, _, _) => 2e-2,
            (_, QkAccum::F32, PvAccum::F32) => 4e-3,
            _ => 1.5e-2,
        };
        if mode != "--bench-only" {
            for (ci, c) in cases.iter().enumerate() {
                let (eo, el) = check(&stream, &kernel, c)?;
                let ok = eo <= tol && el <= 1e-2;
                all_ok &= ok;
                println!("{} {:30} case {ci}: max|dO| {eo:.2e} max|dLSE| {el:.2e} {}", if ok { "ok  " } else { "FAIL" }, cfg.name(), kernel.compiled().resources.map(|r| r.registers).unwrap_or(0));
            }
        }
        if mode != "--check-only" && cfg.head_dim == 128 || (mode == "--bench-only") {
            let nc = bench(&ctx, &stream, &kernel, false)?;
            let c = bench(&ctx, &stream, &kernel, true)?;
            println!("bench {:30} b4 h16 s4096: {nc:6.1} TFLOP/s, causal {c:6.1} TFLOP/s", cfg.name());
        }
    }
    // Tuning sweep: QUATTN_SWEEP="128x4x64,64x8x64" benches forced tiles (head dim x warps x BLOCK_N).
    if let Ok(sweep) = std::env::var("QUATTN_SWEEP") {
        for t in sweep.split(',').filter(|t| !t.is_empty()) {
            let parts: Vec<&str> = t.split('x').collect();
            let [hd, w, n] = parts[..] else { continue };
            for (input, qk, pv) in [(InputType::F16, QkAccum::F32, PvAccum::F32), (InputType::F16, QkAccum::F16, PvAccum::F16PerTile)] {
                let mut cfg = HmmaConfig::new(hd.parse()?, input, qk, pv)?;
                cfg.tile = Some(quattn_native::HmmaTile { warps: w.parse()?, block_n: n.parse()? });
                let kernel = match HmmaKernel::load(&ctx, cfg) { Ok(k) => k, Err(e) => { println!("{t}: {e}"); continue } };
                let (eo, _) = check(&stream, &kernel, &cases[2])?;
                let nc = bench(&ctx, &stream, &kernel, false)?;
                let c = bench(&ctx, &stream, &kernel, true)?;
                println!("sweep {:34} regs {:3} err {eo:.1e}: {nc:6.1} TFLOP/s, causal {c:6.1}", cfg.name(), kernel.compiled().resources.map(|r| r.registers).unwrap_or(0));
            }
        }
        return Ok(());
    }
    println!("{}", if all_ok { "ALL OK" } else { "SOME FAILED" });
    Ok(())
}
