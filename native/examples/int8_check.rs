//! On a GPU: run every INT8 variant (granularity x P·V mode x head dim) against an f64 CPU
//! reference of the kernel's math on the same int8 codes and scales, then time it. Both INT8
//! families: the mma.sync IMMA one (`fwd_int8_*`, every target) and the s8 wgmma one
//! (`fwd_wgmma_int8_*`, compute capability 9.0 only; skipped elsewhere), each with the scale
//! layout of its own blocking.
//!
//! ```text
//! cargo run --release -p quattn-native --example int8_check [-- [--check-only|--bench-only] [--wgmma-only|--imma-only]]
//! QUATTN_SWEEP_INT8=128x4x64x32s,128x8x64x16,64x4x64x32 cargo run --release -p quattn-native --example int8_check
//! ```
//!
//! The reference: `s = dot(q_i8, k_i8) · (q_scale · k_scale)` (log2 units), masked keys
//! dropped, `p = 2^(s − max)`, `O = Σ p·v / Σ p`, `LSE = max·ln 2 + ln Σ p + shift`, in f64. The
//! kernel rounds P to f16 and accumulates in f32 (or f16 per tile), so the threshold on |dO| is
//! relative to max|V| (= 1 here): P in f16 is a 2^-11 relative error per term, and every O
//! element is a convex combination of V values, so |dO| <= ~2^-11·max|V| ≈ 5e-4 plus
//! accumulation error; 2e-3 (f32 P·V) / 6e-3 (f16 per-tile P·V: the f16 partial sum of one
//! tile rounds again, ~2^-11 of a sum up to the tile's Σ p) leave 4x margin. |dLSE| (natural
//! log units, absolute): ex2.approx / lg2.approx are ~2^-22 relative, sums in f32, so 1e-3 is
//! generous while a wrong scale, tile, mask or shift gives errors of order 0.1 and up.
//!
//! O and LSE are filled with NaN before each launch, so an output the kernel leaves unwritten
//! fails. Exit status 1 on any FAIL.
//!
//! Without `QUATTN_SWEEP_INT8`: every `Int8Config::all()` variant with its table tile. With
//! it: forced tiles only, checked and timed in per-block / f32 P·V mode. An entry is
//! `HD x WARPS x BLOCK_N x ROWS_PER_WARP[s][p]`: `s` = Q in shared memory, `p` = Q·Kᵀ one m
//! tile at a time; e.g. `128x4x64x32s` (the hd128 f32 table tile), `128x8x128x16` (the
//! previous one), `128x8x64x16` (sm_100a's compact tile), `64x4x64x32p`.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::f16;
use quattn_native::{AttentionShape, Layout, 
    Int8Args, Int8Buffers, Int8Config, Int8Granularity, Int8Kernel, Int8Tile, Int8WgmmaConfig, Int8WgmmaKernel,
    PvAccum, Strides,
};

type BoxErr = Box<dyn std::error::Error>;

/// Deterministic LCG stream, no RNG dependency.
struct Lcg(u64);
impl Lcg {
    fn new(seed: u64) -> Self {
        Lcg(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407))
    }
    /// Uniform in [0, 1).
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// int8 codes in [-127, 127], roughly bell-shaped like quantized activations.
fn codes(n: usize, seed: u64) -> Vec<i8> {
    let mut r = Lcg::new(seed);
    (0..n)
        .map(|_| {
            let x = (r.next() + r.next() + r.next() - 1.5) * 2.0 / 1.5; // in (-2, 2)
            (x * 63.5).round().clamp(-127.0, 127.0) as i8
        })
        .collect()
}

/// Positive scales in `[lo, hi)`.
fn scales(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f32> {
    let mut r = Lcg::new(seed);
    (0..n).map(|_| (lo + (hi - lo) * r.next()) as f32).collect()
}

/// f16 values in [-1, 1], as raw bits (what the device buffers hold).
fn values(n: usize, seed: u64) -> Vec<u16> {
    let mut r = Lcg::new(seed);
    (0..n).map(|_| f16::from_f64(r.next() * 2.0 - 1.0).to_bits()).collect()
}
fn f16_at(bits: &[u16], i: usize) -> f64 {
    f16::from_bits(bits[i]).to_f64()
}

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    causal: bool,
    bshd: bool,
    shift: bool,
}

fn cases() -> Vec<Case> {
    let c = |batch, q_heads, kv_heads, q_len, kv_len, causal, bshd, shift| Case {
        batch, q_heads, kv_heads, q_len, kv_len, causal, bshd, shift,
    };
    vec![
        c(1, 2, 2, 256, 256, false, false, false),  // non-causal, whole tiles
        c(1, 2, 2, 256, 256, true, false, true),    // causal, square
        c(2, 8, 2, 200, 333, false, false, true),   // GQA 8 over 2, ragged, kv_len != q_len
        c(1, 8, 2, 300, 333, true, true, false),    // GQA, causal, BSHD strides
        c(1, 2, 1, 1, 77, true, false, true),       // q_len 1
        c(1, 2, 2, 17, 130, false, true, false),    // q_len 17, BSHD
        c(1, 2, 2, 127, 190, true, false, true),    // q_len 127
        c(2, 2, 1, 300, 129, true, true, true),     // causal with q_len > kv_len: early rows see nothing
    ]
}

/// Host copy of one case's inputs.
struct Inputs {
    args: Int8Args,
    q: Vec<i8>,
    k: Vec<i8>,
    v: Vec<u16>,
    q_scale: Vec<f32>,
    k_scale: Vec<f32>,
    shift: Vec<f32>,
}

/// Index of query row `i`'s Q scale, from the codec's documented layout
/// (`quattn::codec::int8::Int8ScaleLayout`), written out independently of the kernel.
fn q_scale_index(cfg: &Int8Config, a: &Int8Args, b: usize, h: usize, i: usize) -> usize {
    let blk = cfg.blocking().expect("valid config");
    let (bq, warps) = (blk.block_q, blk.warps);
    let nqb = a.shape.q_len.div_ceil(bq);
    let (blk, r) = (i / bq, i % bq);
    let head = b * a.shape.q_heads + h;
    match cfg.granularity {
        Int8Granularity::PerBlock => head * nqb + blk,
        Int8Granularity::PerWarp => (head * nqb + blk) * warps + r / (bq / warps),
        Int8Granularity::PerThread => ((head * nqb + blk) * warps + r / 16) * 8 + (r % 16) % 8,
    }
}

fn inputs(cfg: &Int8Config, c: &Case, seed: u64) -> Result<Inputs, BoxErr> {
    let d = cfg.head_dim as usize;
    let layout = if c.bshd { Layout::Bshd } else { Layout::Bhsd };
    let shape = AttentionShape::contiguous(layout, c.batch, c.q_heads, c.kv_heads, c.q_len, c.kv_len, d, c.causal);
    let args = Int8Args { shape, lse_shift: c.shift };
    let lens = args.required_lens(cfg)?;
    // Scales: amax/127 of unit-variance data, times the folded softmax_scale·log2 e for Q, so
    // logits span a few units in log2 and softmax is neither flat nor one-hot.
    let fold = std::f64::consts::LOG2_E / (d as f64).sqrt();
    Ok(Inputs {
        q: codes(lens.q, seed),
        k: codes(lens.k, seed + 1),
        v: values(lens.v, seed + 2),
        q_scale: scales(lens.q_scale, seed + 3, 0.02 * fold, 0.04 * fold),
        k_scale: scales(lens.k_scale, seed + 4, 0.02, 0.04),
        shift: scales(lens.lse_shift, seed + 5, -2.0, 2.0),
        args,
    })
}

/// Max |dO| and |dLSE| against the f64 reference; a NaN or a wrong -inf counts as infinite.
fn compare(cfg: &Int8Config, x: &Inputs, o: &[u16], lse: &[f32]) -> (f64, f64) {
    let a = &x.args;
    let d = cfg.head_dim as usize;
    let bk = cfg.blocking().expect("valid config").block_k;
    let at = |s: &Strides, b: usize, h: usize, i: usize| s.offset(b, h, i);
    let nkb = a.shape.kv_len.div_ceil(bk);
    let group = a.shape.q_heads / a.shape.kv_heads;
    let (mut err_o, mut err_lse) = (0f64, 0f64);
    let bad = |e: f64| if e.is_nan() { f64::INFINITY } else { e };
    for b in 0..a.shape.batch {
        for h in 0..a.shape.q_heads {
            let kh = h / group;
            for i in 0..a.shape.q_len {
                let visible = if a.shape.causal {
                    (i as i64 + a.shape.kv_len as i64 - a.shape.q_len as i64 + 1).clamp(0, a.shape.kv_len as i64) as usize
                } else {
                    a.shape.kv_len
                };
                let qo = at(&a.shape.q, b, h, i);
                let qs = x.q_scale[q_scale_index(cfg, a, b, h, i)] as f64;
                let s: Vec<f64> = (0..visible)
                    .map(|j| {
                        let ko = at(&a.shape.k, b, kh, j);
                        let dot: i64 = (0..d).map(|c| x.q[qo + c] as i64 * x.k[ko + c] as i64).sum();
                        let ks = x.k_scale[(b * a.shape.kv_heads + kh) * nkb + j / bk] as f64;
                        dot as f64 * qs * ks
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|v| (v - m).exp2()).collect();
                let sum: f64 = p.iter().sum();
                let oo = at(&a.shape.o, b, h, i);
                for c in 0..d {
                    let r = if visible == 0 {
                        0.0
                    } else {
                        (0..visible).map(|j| p[j] * f16_at(&x.v, at(&a.shape.v, b, kh, j) + c)).sum::<f64>() / sum
                    };
                    err_o = err_o.max(bad((r - f16_at(o, oo + c)).abs()));
                }
                let row = (b * a.shape.q_heads + h) * a.shape.q_len + i;
                let got = lse[row] as f64;
                let e = if visible == 0 {
                    if got == f64::NEG_INFINITY { 0.0 } else { f64::INFINITY }
                } else {
                    let shift = if a.lse_shift { x.shift[row] as f64 } else { 0.0 };
                    bad((m * std::f64::consts::LN_2 + sum.ln() + shift - got).abs())
                };
                err_lse = err_lse.max(e);
            }
        }
    }
    (err_o, err_lse)
}

/// Device copies of one case.
struct Device {
    q: CudaSlice<i8>,
    k: CudaSlice<i8>,
    v: CudaSlice<u16>,
    o: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    q_scale: CudaSlice<f32>,
    k_scale: CudaSlice<f32>,
    shift: Option<CudaSlice<f32>>,
}

fn upload(stream: &Arc<CudaStream>, cfg: &Int8Config, x: &Inputs) -> Result<Device, BoxErr> {
    let lens = x.args.required_lens(cfg)?;
    Ok(Device {
        q: stream.clone_htod(&x.q)?,
        k: stream.clone_htod(&x.k)?,
        v: stream.clone_htod(&x.v)?,
        // Poison: anything the kernel does not write stays NaN and fails the comparison.
        o: stream.clone_htod(&vec![f16::NAN.to_bits(); lens.o])?,
        lse: stream.clone_htod(&vec![f32::NAN; lens.lse])?,
        q_scale: stream.clone_htod(&x.q_scale)?,
        k_scale: stream.clone_htod(&x.k_scale)?,
        shift: if x.args.lse_shift { Some(stream.clone_htod(&x.shift)?) } else { None },
    })
}

/// A loaded variant of either INT8 family; both take the same arguments and buffers.
enum AnyKernel {
    Imma(Int8Kernel),
    Wgmma(Int8WgmmaKernel),
}

impl AnyKernel {
    /// The IMMA config whose scale blocking (and granularity, head dim, P·V mode) is the
    /// kernel's: the config itself, or the wgmma family's `scale_twin`.
    fn scale_cfg(&self) -> Int8Config {
        match self {
            AnyKernel::Imma(k) => *k.config(),
            AnyKernel::Wgmma(k) => k.config().scale_twin(),
        }
    }
    fn name(&self) -> String {
        match self {
            AnyKernel::Imma(k) => k.config().name(),
            AnyKernel::Wgmma(k) => k.config().name(),
        }
    }
    fn compiled(&self) -> &quattn_native::CompiledKernel {
        match self {
            AnyKernel::Imma(k) => k.compiled(),
            AnyKernel::Wgmma(k) => k.compiled(),
        }
    }
}

fn launch(stream: &Arc<CudaStream>, kernel: &AnyKernel, args: &Int8Args, dev: &mut Device) -> Result<(), BoxErr> {
    let bufs = Int8Buffers {
            q: &dev.q,
            k: &dev.k,
            v: &dev.v,
            o: &mut dev.o,
            lse: &mut dev.lse,
            q_scale: &dev.q_scale,
            k_scale: &dev.k_scale,
            lse_shift: dev.shift.as_ref(),
            _elem: std::marker::PhantomData,
        };
    match kernel {
        AnyKernel::Imma(k) => k.launch(stream, args, bufs)?,
        AnyKernel::Wgmma(k) => k.launch(stream, args, bufs)?,
    }
    Ok(())
}

fn check(stream: &Arc<CudaStream>, kernel: &AnyKernel, c: &Case, seed: u64) -> Result<(f64, f64), BoxErr> {
    let cfg = kernel.scale_cfg();
    let x = inputs(&cfg, c, seed)?;
    let mut dev = upload(stream, &cfg, &x)?;
    launch(stream, kernel, &x.args, &mut dev)?;
    let o = stream.clone_dtoh(&dev.o)?;
    let lse = stream.clone_dtoh(&dev.lse)?;
    Ok(compare(&cfg, &x, &o, &lse))
}

/// FLOPs of one forward: 4·b·h·sq·skv·d, halved for causal (square sequences here).
fn flops(batch: usize, heads: usize, seq: usize, d: usize, causal: bool) -> f64 {
    4.0 * (batch * heads * seq * seq * d) as f64 * if causal { 0.5 } else { 1.0 }
}

/// TFLOP/s of one shape: batch = 16384 / seq, heads = 2048 / head dim, median of 25 timed runs
/// after 5 warm-up launches, each timed with its own pair of CUDA events.
fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kernel: &AnyKernel, seq: usize, causal: bool) -> Result<f64, BoxErr> {
    let cfg = kernel.scale_cfg();
    let d = cfg.head_dim as usize;
    let (batch, heads) = ((16384 / seq).max(1), 2048 / d);
    let shape = AttentionShape::contiguous(Layout::Bhsd, batch, heads, heads, seq, seq, d, causal);
    let args = Int8Args { shape, lse_shift: false };
    let lens = args.required_lens(&cfg)?;
    let fold = std::f64::consts::LOG2_E / (d as f64).sqrt();
    let x = Inputs {
        q: codes(lens.q, 11),
        k: codes(lens.k, 12),
        v: values(lens.v, 13),
        q_scale: scales(lens.q_scale, 14, 0.02 * fold, 0.04 * fold),
        k_scale: scales(lens.k_scale, 15, 0.02, 0.04),
        shift: Vec::new(),
        args,
    };
    let mut dev = upload(stream, &cfg, &x)?;
    for _ in 0..5 {
        launch(stream, kernel, &args, &mut dev)?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut ms = Vec::new();
    for _ in 0..25 {
        let (start, end) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
        start.record(stream)?;
        launch(stream, kernel, &args, &mut dev)?;
        end.record(stream)?;
        end.synchronize()?;
        ms.push(start.elapsed_ms(&end)? as f64);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let median = ms[ms.len() / 2];
    Ok(flops(batch, heads, seq, d, causal) / (median * 1e-3) / 1e12)
}

/// Checks (unless `bench_only`) and times (unless `check_only`) one variant; prints one line.
/// Returns whether the check passed (true when skipped by --bench-only).
fn run_one(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, cfg: Int8Config, check_only: bool, bench_only: bool) -> Result<bool, BoxErr> {
    match Int8Kernel::load(ctx, cfg) {
        Ok(k) => run_kernel(ctx, stream, AnyKernel::Imma(k), check_only, bench_only),
        Err(e) => {
            println!("FAIL {:44} load: {e}", cfg.name());
            Ok(false)
        }
    }
}

/// [`run_one`] for the wgmma family.
fn run_one_wgmma(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, cfg: Int8WgmmaConfig, check_only: bool, bench_only: bool) -> Result<bool, BoxErr> {
    match Int8WgmmaKernel::load(ctx, cfg) {
        Ok(k) => run_kernel(ctx, stream, AnyKernel::Wgmma(k), check_only, bench_only),
        Err(e) => {
            println!("FAIL {:44} load: {e}", cfg.name());
            Ok(false)
        }
    }
}

fn run_kernel(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kernel: AnyKernel, check_only: bool, bench_only: bool) -> Result<bool, BoxErr> {
    let cfg = kernel.scale_cfg();
    let tol_o = match cfg.pv {
        PvAccum::F32 => 2e-3,
        PvAccum::F16PerTile => 6e-3,
    };
    let tol_lse = 1e-3;
    let res = kernel.compiled().resources;
    let mut line = format!(
        "{:44} regs {:3} spill {:3}",
        kernel.name(),
        res.map(|r| r.registers).unwrap_or(0),
        res.map(|r| r.spill_store_bytes).unwrap_or(0)
    );
    let mut ok = true;
    if !bench_only {
        let (mut eo, mut el) = (0f64, 0f64);
        for (n, c) in cases().iter().enumerate() {
            let (o, l) = check(stream, &kernel, c, 100 * n as u64 + 1)?;
            if !(o <= tol_o && l <= tol_lse) {
                println!("  case {c:?}: dO {o:.2e} dLSE {l:.2e}");
            }
            eo = eo.max(o);
            el = el.max(l);
        }
        ok = eo <= tol_o && el <= tol_lse;
        line.push_str(&format!(" | {} dO {eo:.1e} (<= {tol_o:.0e}) dLSE {el:.1e}", if ok { "PASS" } else { "FAIL" }));
    }
    if !check_only {
        for seq in [4096, 8192, 16384] {
            let nc = bench(ctx, stream, &kernel, seq, false)?;
            let c = bench(ctx, stream, &kernel, seq, true)?;
            line.push_str(&format!(" | s{}k {nc:5.1} causal {c:5.1}", seq / 1024));
        }
        line.push_str(" TFLOP/s");
    }
    println!("{line}");
    Ok(ok)
}

/// `HD x WARPS x BLOCK_N x ROWS[s][p]` (see the header).
fn parse_tile(t: &str) -> Option<(usize, Int8Tile)> {
    let parts: Vec<&str> = t.trim().split('x').collect();
    if parts.len() != 4 {
        return None;
    }
    let num = |s: &str| s.parse::<u32>().ok();
    let rows = parts[3];
    let split = rows.ends_with('p');
    let rows = rows.trim_end_matches('p');
    let smem = rows.ends_with('s');
    let rows = rows.trim_end_matches('s');
    let tile = Int8Tile {
        q_in_regs: !smem,
        qk_split: split,
        ..Int8Tile::new(num(parts[1])?, num(parts[2])?, num(rows)?)
    };
    Some((num(parts[0])? as usize, tile))
}

fn main() {
    let code = match run() {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("int8_check: {e}");
            2
        }
    };
    std::process::exit(code);
}

fn run() -> Result<bool, BoxErr> {
    let flags: Vec<String> = std::env::args().skip(1).collect();
    let has = |f: &str| flags.iter().any(|a| a == f);
    let (check_only, bench_only) = (has("--check-only"), has("--bench-only"));
    let (imma, wgmma) = (!has("--wgmma-only"), !has("--imma-only"));
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    println!("device {} cc {:?}", ctx.name()?, ctx.compute_capability()?);
    let mut all_ok = true;
    if let Ok(sweep) = std::env::var("QUATTN_SWEEP_INT8") {
        for t in sweep.split(',').filter(|t| !t.trim().is_empty()) {
            let Some((hd, tile)) = parse_tile(t) else {
                println!("FAIL {t}: not HD x WARPS x BLOCK_N x ROWS[s][p]");
                all_ok = false;
                continue;
            };
            let mut cfg = Int8Config::new(hd, Int8Granularity::PerBlock, PvAccum::F32)?;
            cfg.tile = Some(tile);
            if let Err(e) = cfg.validate() {
                println!("SKIP {t}: {e}");
                continue;
            }
            all_ok &= run_one(&ctx, &stream, cfg, check_only, bench_only)?;
        }
    } else {
        if imma {
            for cfg in Int8Config::all() {
                all_ok &= run_one(&ctx, &stream, cfg, check_only, bench_only)?;
            }
        }
        if wgmma {
            let (major, minor) = ctx.compute_capability()?;
            if Int8WgmmaConfig::target_for((major as u32, minor as u32)).is_some() {
                // f16 P·V only: the e4m3 P·V variants read the prepass's Vᵀ codes (checked by
                // the facade's `examples/int8_fp8_check.rs` and `quattn selftest`).
                for cfg in Int8WgmmaConfig::all().into_iter().filter(|c| !c.pv_fp8()) {
                    all_ok &= run_one_wgmma(&ctx, &stream, cfg, check_only, bench_only)?;
                }
            } else {
                println!("SKIP fwd_wgmma_int8_*: needs compute capability 9.0, device is {major}.{minor}");
            }
        }
    }
    println!("{}", if all_ok { "ALL PASS" } else { "SOME FAILED" });
    Ok(all_ok)
}
