//! On a GPU: run HMMA variants against an f64 CPU reference (non-causal, causal, GQA, ragged
//! lengths, bshd strides) and time them. One line per variant: name, registers, max |dO| and
//! |dLSE| over all check cases, TFLOP/s non-causal / causal at seq 4096 (batch 4) and 16384
//! (batch 1), heads = 2048 / head dim (16 at hd128, 32 at hd64).
//!
//! ```text
//! cargo run --release -p quattn-native --example hmma_check [-- --bench-only|--check-only]
//! QUATTN_SWEEP=128x4x64x32s,128x4x32x32s,64x4x64x32 cargo run --release -p quattn-native --example hmma_check
//! ```
//!
//! Without `QUATTN_SWEEP`: every variant of `HmmaConfig::all()` with its table tile.
//! With it: forced tiles only, each checked and timed in the F32/F32 and F16/F16 modes (fp16).
//! A sweep entry is `HD x WARPS x BLOCK_N [x ROWS_PER_WARP[s]]`, comma-separated:
//! `128x8x64` = hd128, 8 warps, BLOCK_N 64, 16 rows per warp, Q in registers (the original
//! layout); `64x4x64x32` = 32 rows per warp, Q in registers; `128x4x64x32s` = 32 rows per
//! warp, Q resident in shared memory. Tiles the kernel cannot build are reported and skipped.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use half::{bf16, f16};
use quattn_native::{AttentionShape, Layout, HmmaConfig, HmmaKernel, HmmaTile, Dtype, PvAccum, QkAccum, Strides};

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

fn to_bits(x: &[f32], input: Dtype) -> Vec<u16> {
    match input {
        Dtype::F16 => x.iter().map(|v| f16::from_f32(*v).to_bits()).collect(),
        Dtype::Bf16 => x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect(),
        Dtype::F32 => unreachable!("HmmaConfig refuses f32 inputs"),
    }
}
fn from_bits(x: &[u16], input: Dtype) -> Vec<f32> {
    match input {
        Dtype::F16 => x.iter().map(|v| f16::from_bits(*v).to_f32()).collect(),
        Dtype::Bf16 => x.iter().map(|v| bf16::from_bits(*v).to_f32()).collect(),
        Dtype::F32 => unreachable!("HmmaConfig refuses f32 inputs"),
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
    let layout = if c.bshd { Layout::Bshd } else { Layout::Bhsd };
    let args = AttentionShape::contiguous(layout, c.batch, c.q_heads, c.kv_heads, c.q_len, c.kv_len, d, c.causal);
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

    let at = |s: &Strides, b: usize, h: usize, i: usize| s.offset(b, h, i);
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

/// TFLOP/s of one launch shape, seq `seq`, batch * seq = 16k, heads = 2048 / head dim.
fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kernel: &HmmaKernel, seq: usize, causal: bool) -> Result<f64, BoxErr> {
    let d = kernel.config().head_dim as usize;
    let (batch, heads) = ((16384 / seq).max(1), 2048 / d);
    let args = AttentionShape::contiguous(Layout::Bhsd, batch, heads, heads, seq, seq, d, causal);
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

fn cases() -> [Case; 5] {
    [
        Case { batch: 1, q_heads: 2, kv_heads: 2, q_len: 256, kv_len: 256, causal: false, bshd: false },
        Case { batch: 2, q_heads: 4, kv_heads: 2, q_len: 200, kv_len: 333, causal: false, bshd: true },
        Case { batch: 1, q_heads: 4, kv_heads: 1, q_len: 300, kv_len: 333, causal: true, bshd: false },
        Case { batch: 1, q_heads: 2, kv_heads: 2, q_len: 333, kv_len: 130, causal: true, bshd: true },
        Case { batch: 1, q_heads: 1, kv_heads: 1, q_len: 1, kv_len: 77, causal: true, bshd: false },
    ]
}

/// Checks (unless `bench_only`) and times (unless `check_only`) one variant; prints one line.
/// Returns whether the check passed (true when skipped).
fn run_one(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, cfg: HmmaConfig, check_only: bool, bench_only: bool) -> Result<bool, BoxErr> {
    let kernel = match HmmaKernel::load(ctx, cfg) {
        Ok(k) => k,
        Err(e) => {
            println!("SKIP {:40} {e}", cfg.name());
            return Ok(true);
        }
    };
    let tol = match (cfg.input, cfg.qk, cfg.pv) {
        (Dtype::Bf16, _, _) => 2e-2,
        (_, QkAccum::F32, PvAccum::F32) => 4e-3,
        _ => 1.5e-2,
    };
    let res = kernel.compiled().resources;
    let mut line = format!(
        "{:40} regs {:3} spill {:3}",
        cfg.name(),
        res.map(|r| r.registers).unwrap_or(0),
        res.map(|r| r.spill_store_bytes).unwrap_or(0)
    );
    let mut ok = true;
    if !bench_only {
        let (mut eo, mut el) = (0f64, 0f64);
        for c in cases().iter() {
            let (o, l) = check(stream, &kernel, c)?;
            eo = eo.max(o);
            el = el.max(l);
        }
        ok = eo <= tol && el <= 1e-2;
        line.push_str(&format!(" | {} dO {eo:.1e} dLSE {el:.1e}", if ok { "ok  " } else { "FAIL" }));
    }
    if !check_only {
        for seq in [4096, 16384] {
            let nc = bench(ctx, stream, &kernel, seq, false)?;
            let c = bench(ctx, stream, &kernel, seq, true)?;
            line.push_str(&format!(" | s{}k {nc:5.1} causal {c:5.1}", seq / 1024));
        }
        line.push_str(" TFLOP/s");
    }
    println!("{line}");
    Ok(ok)
}

/// `HD x WARPS x BLOCK_N [x ROWS[s]]` (see the header).
fn parse_tile(t: &str) -> Option<(usize, HmmaTile)> {
    let parts: Vec<&str> = t.trim().split('x').collect();
    let num = |s: &str| s.parse::<u32>().ok();
    let (hd, warps, block_n) = (num(parts.first()?)?, num(parts.get(1)?)?, num(parts.get(2)?)?);
    let mut tile = HmmaTile::new(warps, block_n);
    if let Some(r) = parts.get(3) {
        let (rows, smem) = match r.strip_suffix('s') {
            Some(rows) => (rows, true),
            None => (*r, false),
        };
        tile.rows_per_warp = num(rows)?;
        tile.q_in_regs = !smem;
    }
    (parts.len() <= 4).then_some((hd as usize, tile))
}

fn main() -> Result<(), BoxErr> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (check_only, bench_only) = (mode == "--check-only", mode == "--bench-only");
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    println!("device {} cc {:?}", ctx.name()?, ctx.compute_capability()?);
    let mut all_ok = true;
    if let Ok(sweep) = std::env::var("QUATTN_SWEEP") {
        for t in sweep.split(',').filter(|t| !t.trim().is_empty()) {
            let Some((hd, tile)) = parse_tile(t) else {
                println!("SKIP {t}: not HD x WARPS x BLOCK_N [x ROWS[s]]");
                continue;
            };
            for (qk, pv) in [(QkAccum::F32, PvAccum::F32), (QkAccum::F16, PvAccum::F16PerTile)] {
                let mut cfg = HmmaConfig::new(hd, Dtype::F16, qk, pv)?;
                cfg.tile = Some(tile);
                if let Err(e) = cfg.validate() {
                    println!("SKIP {t}: {e}");
                    continue;
                }
                all_ok &= run_one(&ctx, &stream, cfg, check_only, bench_only)?;
            }
        }
    } else {
        for cfg in HmmaConfig::all() {
            all_ok &= run_one(&ctx, &stream, cfg, check_only, bench_only)?;
        }
    }
    println!("{}", if all_ok { "ALL OK" } else { "SOME FAILED" });
    Ok(())
}
