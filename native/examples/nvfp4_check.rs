//! On a GPU: the 4-bit quantization prepass (`nvfp4_quant`, NVFP4 and MXFP4, f16 and bf16
//! sources, head dims 64 and 128, and the NVFP4 Vᵀ of the FP4 P·V kernel) checked byte for byte against its CPU recipe
//! (`nvfp4_quant::host`, which quattn's `tests/nvfp4_prepass_codec.rs` holds equal to
//! `codec::nvfp4` / `codec::mxfp4`), then timed.
//!
//! ```text
//! cargo run --release -p quattn-native --example nvfp4_check [-- [--check-only|--bench-only] [--json FILE]]
//! ```
//!
//! Check inputs: normal values with 1% outliers x20 in BHSD and BSHD (strided rows), a tensor of
//! E2M1 rounding ties (every value a grid midpoint times its block's divisor), one with f16
//! subnormals and zero blocks, and an all-zero tensor (tensor scale 1). Any differing code byte,
//! scale byte or tensor-scale bit is a FAIL; exit status 1 on any FAIL.
//!
//! Timing: Q-shaped `[8, 32, 4096, d]` f16/bf16, the whole prepass (NVFP4: amax-word reset, amax
//! pass, quantize pass; MXFP4: one pass), median of 20 CUDA-event timings after 3 warm-ups.
//! Reported: GB/s of the bytes the passes move (NVFP4 reads the source twice) and the input
//! bytes per second, each against the H100 SXM's 3.35 TB/s HBM3 (the brief's "3 TB/s" target).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::{bf16, f16};
use quattn_native::nvfp4_quant::{host, Fp4Format, Nvfp4Quant, Nvfp4QuantConfig, Nvfp4QuantPtrs, VT_PAD};
use quattn_native::{Dtype, Layout, Strides};

type BoxErr = Box<dyn std::error::Error>;

struct Lcg(u64);
impl Lcg {
    fn new(seed: u64) -> Self {
        Lcg(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407))
    }
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.next().max(1e-300), self.next());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Values rounded to the source type, as (bits, f32 value).
fn to_source(dtype: Dtype, x: &[f32]) -> (Vec<u16>, Vec<f32>) {
    match dtype {
        Dtype::Bf16 => x.iter().map(|&v| { let h = bf16::from_f32(v); (h.to_bits(), h.to_f32()) }).unzip(),
        _ => x.iter().map(|&v| { let h = f16::from_f32(v); (h.to_bits(), h.to_f32()) }).unzip(),
    }
}

#[derive(Clone, Copy)]
enum Input {
    Outliers,
    Ties,
    Subnormal,
    Zero,
}

fn make(input: Input, n: usize, seed: u64) -> Vec<f32> {
    let mut r = Lcg::new(seed);
    match input {
        Input::Outliers => (0..n).map(|_| {
            let x = r.normal() as f32;
            if r.next() < 0.01 { x * 20.0 } else { x }
        }).collect(),
        // Per 16-block: the block max 6 · 2^e, the rest E2M1 midpoints · 2^e (ties under a
        // divisor of 2^e when the block scale lands on a power of two).
        Input::Ties => {
            let mids = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 3.0];
            (0..n).map(|i| {
                let e = ((i / 16) % 5) as i32 - 2;
                let v = if i % 16 == 0 { 6.0 } else { mids[(r.next() * mids.len() as f64) as usize] };
                let s = if r.next() < 0.5 { -1.0 } else { 1.0 };
                s * v * 2f32.powi(e)
            }).collect()
        }
        Input::Subnormal => (0..n).map(|i| {
            if (i / 16) % 7 == 3 { 0.0 } else if (i / 32) % 5 == 1 { (r.normal() * 1e-6) as f32 } else { (r.normal() * 1e-2) as f32 }
        }).collect(),
        Input::Zero => vec![0.0; n],
    }
}

struct DevOut {
    codes: CudaSlice<u8>,
    scales: CudaSlice<u8>,
    amax: CudaSlice<u32>,
    ts: CudaSlice<f32>,
}

fn alloc_out(stream: &Arc<CudaStream>, cfg: &Nvfp4QuantConfig, b: usize, h: usize, s: usize) -> Result<DevOut, BoxErr> {
    let (nc, ns) = cfg.output_lens(b, h, s);
    Ok(DevOut {
        // Poison: a byte the kernel does not write differs from the reference.
        codes: stream.clone_htod(&vec![0xA5u8; nc])?,
        scales: stream.clone_htod(&vec![0xA5u8; ns])?,
        amax: stream.alloc_zeros::<u32>(1)?,
        ts: stream.clone_htod(&[f32::NAN])?,
    })
}

#[allow(clippy::too_many_arguments)]
fn run(
    stream: &Arc<CudaStream>,
    k: &Nvfp4Quant,
    src: &CudaSlice<u16>,
    out: &mut DevOut,
    b: usize,
    h: usize,
    s: usize,
    st: &Strides,
) -> Result<(), BoxErr> {
    let (sp, _g0) = src.device_ptr(stream);
    let (cp, _g1) = out.codes.device_ptr_mut(stream);
    let (scp, _g2) = out.scales.device_ptr_mut(stream);
    let (ap, _g3) = out.amax.device_ptr_mut(stream);
    let (tp, _g4) = out.ts.device_ptr_mut(stream);
    let ptrs = Nvfp4QuantPtrs { src: sp, codes: cp, scales: scp, amax: ap, tensor_scale: tp };
    // SAFETY: buffers sized by output_lens / the strided source, alive until synchronize below.
    unsafe { k.launch_raw(stream, b, h, s, st, ptrs)? };
    Ok(())
}

fn check(stream: &Arc<CudaStream>, k: &Nvfp4Quant, layout: Layout, input: Input, seed: u64) -> Result<bool, BoxErr> {
    let cfg = *k.config();
    let d = cfg.head_dim as usize;
    let (b, h, s) = (2, 3, 77);
    let st = Strides::new(layout, h, s, d);
    let x = make(input, b * h * s * d, seed);
    let (bits, vals) = to_source(cfg.dtype, &x);
    let src = stream.clone_htod(&bits)?;
    let mut out = alloc_out(stream, &cfg, b, h, s)?;
    run(stream, k, &src, &mut out, b, h, s, &st)?;
    stream.synchronize()?;
    let codes = stream.clone_dtoh(&out.codes)?;
    let scales = stream.clone_dtoh(&out.scales)?;
    let ts = stream.clone_dtoh(&out.ts)?[0];
    let want = if cfg.vt {
        let pad = s.div_ceil(VT_PAD) * VT_PAD;
        host::quantize(cfg.format, &host::vt_rows(&vals, b, h, s, d, &st), pad)
    } else {
        host::quantize(cfg.format, &host::rows_from_strided(&vals, b, h, s, d, &st), d)
    };
    let bad_codes = codes.iter().zip(&want.codes).filter(|(a, b)| a != b).count();
    let bad_scales = scales.iter().zip(&want.scales).filter(|(a, b)| a != b).count();
    let ts_ok = cfg.format == Fp4Format::Mxfp4 || ts.to_bits() == want.tensor_scale.to_bits();
    let ok = bad_codes == 0 && bad_scales == 0 && ts_ok;
    let name = match input {
        Input::Outliers => "outliers",
        Input::Ties => "ties",
        Input::Subnormal => "subnormal",
        Input::Zero => "zero",
    };
    println!(
        "{} {:32} {:?} {:10} code bytes {:6}/{:6} differ, scale bytes {:5}/{:5} differ, tensor scale {:e} vs {:e}",
        if ok { "PASS" } else { "FAIL" },
        cfg.name(),
        layout,
        name,
        bad_codes,
        codes.len(),
        bad_scales,
        scales.len(),
        ts,
        want.tensor_scale
    );
    if !ok {
        if let Some(i) = codes.iter().zip(&want.codes).position(|(a, b)| a != b) {
            println!("     first code byte {i}: gpu {:#04x} cpu {:#04x}", codes[i], want.codes[i]);
        }
        if let Some(i) = scales.iter().zip(&want.scales).position(|(a, b)| a != b) {
            println!("     first scale byte {i}: gpu {:#04x} cpu {:#04x}", scales[i], want.scales[i]);
        }
    }
    Ok(ok)
}

/// (moved GB/s, input GB/s, median ms).
/// Source bits for the timing: uniform values with 1% outliers x20 (the distribution does not
/// change the work; a cheap generator keeps host time out of the device call).
fn bench_source(dtype: Dtype, n: usize) -> Vec<u16> {
    let mut r = Lcg::new(5);
    (0..n)
        .map(|_| {
            let u = r.next();
            let x = ((u * 4096.0).fract() - 0.5) as f32 * 4.0 * if u < 0.01 { 20.0 } else { 1.0 };
            if dtype == Dtype::Bf16 { bf16::from_f32(x).to_bits() } else { f16::from_f32(x).to_bits() }
        })
        .collect()
}

fn bench(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, k: &Nvfp4Quant, bits: &[u16]) -> Result<(f64, f64, f64), BoxErr> {
    let cfg = *k.config();
    let d = cfg.head_dim as usize;
    let (b, h, s) = (8, 32, 4096);
    let n = b * h * s * d;
    let st = Strides::new(Layout::Bhsd, h, s, d);
    assert_eq!(bits.len(), n);
    let src = stream.clone_htod(bits)?;
    let mut out = alloc_out(stream, &cfg, b, h, s)?;
    for _ in 0..3 {
        run(stream, k, &src, &mut out, b, h, s, &st)?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut ms = Vec::new();
    for _ in 0..20 {
        let (start, end) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
        start.record(stream)?;
        run(stream, k, &src, &mut out, b, h, s, &st)?;
        end.record(stream)?;
        end.synchronize()?;
        ms.push(start.elapsed_ms(&end)? as f64);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let med = ms[ms.len() / 2];
    let input = (n * 2) as f64;
    let (nc, ns) = cfg.output_lens(b, h, s);
    let reads = if cfg.format == Fp4Format::Nvfp4 { 2.0 } else { 1.0 };
    let moved = reads * input + (nc + ns) as f64;
    Ok((moved / (med * 1e-3) / 1e9, input / (med * 1e-3) / 1e9, med))
}

fn main() -> Result<(), BoxErr> {
    let args: Vec<String> = std::env::args().collect();
    let check_only = args.iter().any(|a| a == "--check-only");
    let bench_only = args.iter().any(|a| a == "--bench-only");
    let json_path = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1).cloned());
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    println!("device: {} (cc {:?})", ctx.name()?, ctx.compute_capability()?);
    let mut all_ok = true;
    let mut rows = Vec::new();
    let mut sources: std::collections::HashMap<(bool, u32), Vec<u16>> = std::collections::HashMap::new();
    for cfg in Nvfp4QuantConfig::all() {
        let k = Nvfp4Quant::load(&ctx, cfg)?;
        if !bench_only {
            for (i, input) in [Input::Outliers, Input::Ties, Input::Subnormal, Input::Zero].into_iter().enumerate() {
                for layout in [Layout::Bhsd, Layout::Bshd] {
                    all_ok &= check(&stream, &k, layout, input, 100 + i as u64)?;
                }
            }
        }
        if !check_only {
            let bits = sources
                .entry((cfg.dtype == Dtype::Bf16, cfg.head_dim))
                .or_insert_with(|| bench_source(cfg.dtype, 8 * 32 * 4096 * cfg.head_dim as usize));
            let (moved, input, ms) = bench(&ctx, &stream, &k, bits)?;
            println!(
                "TIME {:32} {:8.3} ms  {:7.1} GB/s moved ({:4.1}% of 3350)  {:7.1} GB/s of input",
                cfg.name(),
                ms,
                moved,
                100.0 * moved / 3350.0,
                input
            );
            rows.push(format!(
                "{{\"kernel\":\"{}\",\"shape\":[8,32,4096,{}],\"ms\":{ms:.4},\"moved_gbs\":{moved:.1},\"input_gbs\":{input:.1}}}",
                cfg.name(),
                cfg.head_dim
            ));
        }
    }
    if let Some(p) = json_path {
        std::fs::write(&p, format!("{{\"device\":\"{}\",\"pass\":{all_ok},\"timings\":[{}]}}\n", ctx.name()?, rows.join(",")))?;
    }
    if !bench_only {
        println!("{}", if all_ok { "ALL PASS" } else { "SOME FAILED" });
    }
    if !all_ok {
        std::process::exit(1);
    }
    Ok(())
}
