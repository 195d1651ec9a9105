//! On an H100 (compute capability 9.0): check every `fwd_wgmma` variant against an f64 CPU
//! reference and time it.
//!
//! ```text
//! cargo run --release -p quattn-native --example wgmma_check               # check + bench
//! cargo run --release -p quattn-native --example wgmma_check -- --check-only
//! cargo run --release -p quattn-native --example wgmma_check -- --bench-only
//! ```
//!
//! Check: deterministic inputs (rounded to fp16; the reference sees exactly those values),
//! cases non-causal, causal, GQA 8/2, ragged q_len 1 / 17 / 127 / 300 with kv_len != q_len
//! (including kv_len < q_len under the causal mask, where rows see no key), bhsd and bshd
//! strides. O and LSE are poisoned with NaN before every launch, so a row or column the kernel
//! forgets to write fails. One line per variant, `PASS`/`FAIL`, exit code 1 if any failed.
//!
//! Thresholds: |dO| <= 4e-3 and |dLSE| <= 2e-3 (absolute). The inputs are exact in both
//! computations; what differs is (a) P rounded to fp16 before P·V (relative 2^-11 per element,
//! which on the convex combination O = Σ p v / Σ p of |v| <= 3.5 stays below ~1e-3 since the
//! errors are unbiased and weighted by p / l), (b) O rounded to fp16 on output (half an ulp:
//! 2^-11 relative, <= 1e-3 for |O| < 2, 2e-3 for |O| < 4), (c) f32 accumulation and
//! ex2/lg2.approx (~1e-6 relative). The sum of the bounds is ~3e-3; the HMMA family with the
//! same arithmetic passes at 4e-3 (hmma_check). LSE sees only (c) and the f32 max/scale
//! rounding: |LSE| < 20, so ~1e-5; 2e-3 leaves room for approximate lg2 without hiding a wrong
//! row (a missing key moves LSE by ~1/kv_len, a wrong mask by far more).
//!
//! Bench (`--bench-only`, or after the check): TFLOP/s (4·b·h·s²·d, halved when causal) at hd
//! 64/128, seq 4k/16k, batch = 16384 / seq, heads = 2048 / hd, non-causal and causal; median of
//! 20 runs each timed by its own CUDA events, after 3 warm-up runs. The HMMA family's table
//! variant (fp16, f32/f32) is timed in the same process for reference.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use half::f16;
use quattn_native::{AttentionShape, Layout, HmmaConfig, HmmaKernel, Dtype, PvAccum, QkAccum, Strides, WgmmaConfig, WgmmaKernel};

type BoxErr = Box<dyn std::error::Error>;

const TOL_O: f64 = 4e-3;
const TOL_LSE: f64 = 2e-3;

/// Deterministic normal-ish samples (sum of uniforms, std ~1), no RNG dependency.
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

fn f16_bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| f16::from_f32(*v).to_bits()).collect()
}
fn f16_vals(x: &[u16]) -> Vec<f32> {
    x.iter().map(|v| f16::from_bits(*v).to_f32()).collect()
}

#[derive(Debug)]
struct Case {
    name: &'static str,
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    causal: bool,
    bshd: bool,
}

fn cases() -> Vec<Case> {
    let c = |name, batch, q_heads, kv_heads, q_len, kv_len, causal, bshd| Case {
        name, batch, q_heads, kv_heads, q_len, kv_len, causal, bshd,
    };
    vec![
        c("non-causal", 1, 2, 2, 256, 256, false, false),
        c("causal", 1, 2, 2, 256, 256, true, false),
        c("gqa 8/2 bshd", 2, 8, 2, 200, 333, false, true),
        c("gqa 8/2 causal", 1, 8, 2, 256, 384, true, false),
        c("q1 causal", 1, 2, 1, 1, 77, true, false),
        c("q1 non-causal", 2, 2, 2, 1, 1000, false, true),
        c("q17 causal", 1, 4, 2, 17, 300, true, true),
        c("q127 causal kv<q", 1, 2, 2, 127, 50, true, false),
        c("q127 non-causal", 1, 2, 1, 127, 129, false, true),
        c("q300 causal", 1, 4, 1, 300, 333, true, false),
        c("q300 non-causal bshd", 2, 2, 2, 300, 129, false, true),
    ]
}

/// Max |dO|, max |dLSE| of one case (infinite if anything is NaN or unexpectedly infinite).
fn check(stream: &Arc<CudaStream>, kernel: &WgmmaKernel, c: &Case) -> Result<(f64, f64), BoxErr> {
    let d = kernel.config().head_dim as usize;
    let layout = if c.bshd { Layout::Bshd } else { Layout::Bhsd };
    let args = AttentionShape::contiguous(layout, c.batch, c.q_heads, c.kv_heads, c.q_len, c.kv_len, d, c.causal);
    let nq = c.batch * c.q_heads * c.q_len * d;
    let nk = c.batch * c.kv_heads * c.kv_len * d;
    let nl = c.batch * c.q_heads * c.q_len;
    let q = f16_vals(&f16_bits(&samples(nq, 11)));
    let k = f16_vals(&f16_bits(&samples(nk, 12)));
    let v = f16_vals(&f16_bits(&samples(nk, 13)));
    let qd = stream.clone_htod(&f16_bits(&q))?;
    let kd = stream.clone_htod(&f16_bits(&k))?;
    let vd = stream.clone_htod(&f16_bits(&v))?;
    // NaN poison: fp16 quiet NaN 0x7e00, f32 NaN.
    let mut od = stream.clone_htod(&vec![0x7e00u16; nq])?;
    let mut ld = stream.clone_htod(&vec![f32::NAN; nl])?;
    kernel.launch(stream, &args, &qd, &kd, &vd, &mut od, &mut ld)?;
    let o = f16_vals(&stream.clone_dtoh(&od)?);
    let lse = stream.clone_dtoh(&ld)?;

    let at = |s: &Strides, b: usize, h: usize, i: usize| s.offset(b, h, i);
    let diff = |r: f64, g: f64| if g.is_nan() || (r.is_finite() && !g.is_finite()) { f64::INFINITY } else { (r - g).abs() };
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
                    err_o = err_o.max(diff(r, o[oo + x] as f64));
                }
                let got = lse[(b * c.q_heads + h) * c.q_len + i] as f64;
                let e = if visible == 0 {
                    if got == f64::NEG_INFINITY { 0.0 } else { f64::INFINITY }
                } else {
                    diff(m + sum.ln(), got)
                };
                err_lse = err_lse.max(e);
            }
        }
    }
    Ok((err_o, err_lse))
}

fn bench_args(d: usize, seq: usize, causal: bool) -> AttentionShape {
    let (batch, heads) = ((16384 / seq).max(1), 2048 / d);
    AttentionShape::contiguous(Layout::Bhsd, batch, heads, heads, seq, seq, d, causal)
}

/// Median TFLOP/s of 20 individually event-timed launches of `launch`.
fn time_median(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    args: &AttentionShape,
    d: usize,
    mut launch: impl FnMut() -> Result<(), BoxErr>,
) -> Result<f64, BoxErr> {
    for _ in 0..3 {
        launch()?;
    }
    let mut ms = Vec::with_capacity(20);
    for _ in 0..20 {
        let start = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(stream)?;
        launch()?;
        end.record(stream)?;
        end.synchronize()?;
        ms.push(start.elapsed_ms(&end)? as f64);
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = 0.5 * (ms[9] + ms[10]);
    let flops = 4.0 * (args.batch * args.q_heads * args.q_len * args.kv_len * d) as f64 * if args.causal { 0.5 } else { 1.0 };
    Ok(flops / (med * 1e-3) / 1e12)
}

fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kernel: &WgmmaKernel, hmma: Option<&HmmaKernel>) -> Result<String, BoxErr> {
    let d = kernel.config().head_dim as usize;
    let mut line = String::new();
    for seq in [4096, 16384] {
        for causal in [false, true] {
            let args = bench_args(d, seq, causal);
            let n = args.batch * args.q_heads * seq * d;
            let x = f16_bits(&samples(n, 7));
            let qd = stream.clone_htod(&x)?;
            let kd = stream.clone_htod(&x)?;
            let vd = stream.clone_htod(&x)?;
            let mut od = stream.alloc_zeros::<u16>(n)?;
            let mut ld = stream.alloc_zeros::<f32>(args.batch * args.q_heads * seq)?;
            let w = time_median(ctx, stream, &args, d, || Ok(kernel.launch(stream, &args, &qd, &kd, &vd, &mut od, &mut ld)?))?;
            let tag = format!("s{}k{}", seq / 1024, if causal { " causal" } else { "" });
            line.push_str(&format!(" | {tag} {w:5.1}"));
            if let Some(h) = hmma {
                let r = time_median(ctx, stream, &args, d, || Ok(h.launch(stream, &args, &qd, &kd, &vd, &mut od, &mut ld)?))?;
                line.push_str(&format!(" (hmma {r:5.1})"));
            }
        }
    }
    line.push_str(" TFLOP/s");
    Ok(line)
}

fn main() -> Result<(), BoxErr> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (check_only, bench_only) = (mode == "--check-only", mode == "--bench-only");
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    let cc = ctx.compute_capability()?;
    println!("device {} cc {:?}", ctx.name()?, cc);
    if WgmmaConfig::target_for((cc.0 as u32, cc.1 as u32)).is_none() {
        println!("FAIL: fwd_wgmma runs on compute capability 9.0 (sm_90a) only");
        std::process::exit(2);
    }
    let mut all_ok = true;
    for cfg in WgmmaConfig::all() {
        let kernel = match WgmmaKernel::load(&ctx, cfg) {
            Ok(k) => k,
            Err(e) => {
                println!("FAIL {:28} load: {e}", cfg.name());
                all_ok = false;
                continue;
            }
        };
        let res = kernel.compiled().resources;
        let mut line = format!(
            "{:28} regs {:3} spill {:3}",
            cfg.name(),
            res.map(|r| r.registers).unwrap_or(0),
            res.map(|r| r.spill_store_bytes).unwrap_or(0)
        );
        if !bench_only {
            let (mut eo, mut el) = (0f64, 0f64);
            let mut worst = "";
            for c in cases() {
                let (o, l) = check(&stream, &kernel, &c)?;
                if o > TOL_O || l > TOL_LSE {
                    worst = c.name;
                }
                eo = eo.max(o);
                el = el.max(l);
            }
            let ok = eo <= TOL_O && el <= TOL_LSE;
            all_ok &= ok;
            line.push_str(&format!(" | {} dO {eo:.1e} dLSE {el:.1e}", if ok { "PASS" } else { "FAIL" }));
            if !ok {
                line.push_str(&format!(" (failing case e.g. {worst})"));
            }
        }
        if !check_only {
            // The table variants are compared with the HMMA family's table variant.
            let hmma = if cfg.tile.is_none() {
                HmmaConfig::new(cfg.head_dim as usize, Dtype::F16, QkAccum::F32, PvAccum::F32)
                    .and_then(|h| HmmaKernel::load(&ctx, h))
                    .ok()
            } else {
                None
            };
            line.push_str(&bench(&ctx, &stream, &kernel, hmma.as_ref())?);
        }
        println!("{line}");
    }
    println!("{}", if all_ok { "ALL PASS" } else { "SOME FAILED" });
    if !all_ok {
        std::process::exit(1);
    }
    Ok(())
}
