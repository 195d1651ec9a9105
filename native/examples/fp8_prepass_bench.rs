//! Times the FP8 quantization prepass (`fp8_prepass`, f16 to e4m3) on a CUDA GPU against its
//! bytes model: each input element read once and each code written once
//! ([`Fp8PrepassConfig::model_bytes`]), at 3 TB/s (the H100's HBM3). Per shape and descale
//! granularity it runs the amax and quantize passes with the default slabs (half the L2), one
//! slab for the whole call (the quantize pass then reads its input from DRAM again) and slabs
//! of a quarter and of the whole L2, then the one-read pass (`slabs` "onepass") where it
//! applies, median of 20 device-timed runs each. Before each variant the codes and descales are
//! poisoned (bytes 0x7f: a NaN code, never the code of a finite input); every variant must give
//! the codes and descales of the first (exit status 1 otherwise) and leave the scratch counters
//! zero.
//!
//! `cargo run --release -p quattn-native --example fp8_prepass_bench [-- --json]`
//!
//! Output: one line per (shape, granularity, slabs): milliseconds, GB/s of the model's bytes,
//! and `x model`, the time over the model's time at 3 TB/s (the target is at most 1.5), and
//! whether the default path (`auto`) takes the one-read pass there. With `--json`, one JSON
//! object per line instead.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use quattn_native::{AttentionShape, DescaleGranularity, Dtype, Fp8Args, Fp8Format, Fp8Prepass, Fp8PrepassConfig, Fp8PrepassPath, Fp8PrepassPtrs, Layout};

type BoxErr = Box<dyn std::error::Error>;

/// The DRAM bandwidth the model is measured against, bytes per second.
const MODEL_BANDWIDTH: f64 = 3.0e12;

/// f16 bits of values in about [-4, 4] with a few large ones, no NaN or infinity.
fn halves(n: usize, seed: u64) -> Vec<u16> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
            let x = if i % 997 == 0 { x * 64.0 } else { x };
            half::f16::from_f32(x).to_bits()
        })
        .collect()
}

struct Buffers {
    x: [CudaSlice<u16>; 3],
    codes: [CudaSlice<u8>; 3],
    descales: [CudaSlice<f32>; 3],
    partial: CudaSlice<f32>,
    counter: CudaSlice<u32>,
}

impl Buffers {
    fn new(stream: &Arc<CudaStream>, c: &Fp8PrepassConfig, a: &Fp8Args) -> Result<Self, BoxErr> {
        let l = c.required_lens(a);
        Ok(Buffers {
            x: [stream.clone_htod(&halves(l.q, 1))?, stream.clone_htod(&halves(l.k, 2))?, stream.clone_htod(&halves(l.v, 3))?],
            codes: [stream.alloc_zeros(l.q)?, stream.alloc_zeros(l.k)?, stream.alloc_zeros(l.v)?],
            descales: [stream.alloc_zeros(l.q_descale)?, stream.alloc_zeros(l.kv_descale)?, stream.alloc_zeros(l.kv_descale)?],
            partial: stream.alloc_zeros(l.partial)?,
            counter: stream.alloc_zeros(l.counter)?,
        })
    }

    fn ptrs(&mut self, s: &Arc<CudaStream>) -> Fp8PrepassPtrs {
        let [q, k, v] = &mut self.x;
        let [qc, kc, vc] = &mut self.codes;
        let [qd, kd, vd] = &mut self.descales;
        Fp8PrepassPtrs {
            q: q.device_ptr_mut(s).0,
            k: k.device_ptr_mut(s).0,
            v: v.device_ptr_mut(s).0,
            q_codes: qc.device_ptr_mut(s).0,
            k_codes: kc.device_ptr_mut(s).0,
            v_codes: vc.device_ptr_mut(s).0,
            q_descale: qd.device_ptr_mut(s).0,
            k_descale: kd.device_ptr_mut(s).0,
            v_descale: vd.device_ptr_mut(s).0,
            partial: self.partial.device_ptr_mut(s).0,
            counter: self.counter.device_ptr_mut(s).0,
        }
    }

    /// Codes and descales overwritten with bytes 0x7f.
    fn poison(&mut self, s: &Arc<CudaStream>) -> Result<(), BoxErr> {
        for c in &mut self.codes {
            s.memcpy_htod(&vec![0x7fu8; c.len()], c)?;
        }
        for d in &mut self.descales {
            s.memcpy_htod(&vec![f32::from_bits(0x7f7f_7f7f); d.len()], d)?;
        }
        Ok(())
    }

    /// Whether every scratch counter is zero (the state each launch must leave).
    fn counters_zero(&self, s: &Arc<CudaStream>) -> Result<bool, BoxErr> {
        Ok(s.clone_dtoh(&self.counter)?.iter().all(|&c| c == 0))
    }

    /// Codes and descale bits, read back.
    fn read(&self, s: &Arc<CudaStream>) -> Result<(Vec<Vec<u8>>, Vec<Vec<u32>>), BoxErr> {
        let codes = self.codes.iter().map(|c| s.clone_dtoh(c)).collect::<Result<Vec<_>, _>>()?;
        let descales = self.descales.iter().map(|d| s.clone_dtoh(d).map(|v| v.iter().map(|x| x.to_bits()).collect())).collect::<Result<Vec<_>, _>>()?;
        Ok((codes, descales))
    }
}

fn median_ms(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, mut f: impl FnMut() -> Result<(), BoxErr>) -> Result<f64, BoxErr> {
    for _ in 0..3 {
        f()?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
    let mut t = Vec::new();
    for _ in 0..20 {
        a.record(stream)?;
        f()?;
        b.record(stream)?;
        b.synchronize()?;
        t.push(a.elapsed_ms(&b)? as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn main() -> Result<(), BoxErr> {
    let json = std::env::args().any(|a| a == "--json");
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    let config = Fp8PrepassConfig::new(Dtype::F16, Fp8Format::E4M3)?;
    let base = Fp8Prepass::load(&ctx, config)?;
    let l2 = base.slab_bytes().map(|b| 2 * b);
    let shapes = [
        ("b16 h16 s1024 d128", AttentionShape::contiguous(Layout::Bhsd, 16, 16, 16, 1024, 1024, 128, false)),
        ("b4 h16 s4096 d128", AttentionShape::contiguous(Layout::Bhsd, 4, 16, 16, 4096, 4096, 128, false)),
        ("b1 h16 s16384 d128", AttentionShape::contiguous(Layout::Bhsd, 1, 16, 16, 16384, 16384, 128, false)),
        ("b2 h16 s8192 d64 bshd", AttentionShape::contiguous(Layout::Bshd, 2, 16, 16, 8192, 8192, 64, false)),
        ("decode q1 kv32768 gqa32/8 d128", AttentionShape::contiguous(Layout::Bhsd, 1, 32, 8, 1, 32768, 128, false)),
        // Small enough for the one-read pass per tensor too (4 MB tensors: 256 tiles a group).
        ("b1 h8 s2048 d128", AttentionShape::contiguous(Layout::Bhsd, 1, 8, 8, 2048, 2048, 128, false)),
    ];
    let mut mismatches = 0;
    if !json {
        println!(
            "device {} | L2 {} MB | one-read pass: {} co-resident CTAs | model: input read once + codes written once, at {:.0} TB/s",
            ctx.name()?,
            l2.unwrap_or(0) >> 20,
            base.resident_ctas(),
            MODEL_BANDWIDTH / 1e12
        );
    }
    for (name, shape) in shapes {
        for g in [DescaleGranularity::PerHead, DescaleGranularity::PerTensor] {
            let args = Fp8Args::new(shape, g);
            let model = config.model_bytes(&args) as f64;
            let mut bufs = Buffers::new(&stream, &config, &args)?;
            let mut first: Option<(Vec<Vec<u8>>, Vec<Vec<u32>>)> = None;
            // Which path the default (Auto) takes for these arguments.
            let auto = if base.onepass_grid(&args)?.is_some() { "onepass" } else { "twopass" };
            let two = |b: Option<usize>| (Fp8PrepassPath::TwoPass, b);
            let slabs = [("L2/2", two(l2.map(|b| b / 2))), ("one", two(None)), ("L2/4", two(l2.map(|b| b / 4))), ("L2", two(l2)), ("onepass", (Fp8PrepassPath::OnePass, None))];
            for (slab_name, (path, slab)) in slabs {
                let k = Fp8Prepass::load(&ctx, config)?.with_slab_bytes(slab).with_path(path);
                let launches = match k.onepass_grid(&args) {
                    Ok(Some(_)) => 1,
                    Ok(None) => 2 * config.slabs(&args, slab).len(),
                    Err(e) => {
                        eprintln!("{name} {g:?} {slab_name}: skipped ({e})");
                        continue;
                    }
                };
                bufs.poison(&stream)?;
                let ptrs = bufs.ptrs(&stream);
                // SAFETY: every buffer was allocated with `required_lens` of these arguments; the
                // counters start zeroed and the prepass leaves them zero.
                let ms = median_ms(&ctx, &stream, || Ok(unsafe { k.launch_raw(&stream, &args, &ptrs) }?))?;
                let got = bufs.read(&stream)?;
                let zero = bufs.counters_zero(&stream)?;
                if !zero {
                    eprintln!("{name} {g:?} {slab_name}: scratch counters left nonzero");
                }
                let same = first.as_ref().is_none_or(|f| *f == got) && zero;
                if !same {
                    mismatches += 1;
                }
                first.get_or_insert(got);
                let ratio = ms * 1e-3 / (model / MODEL_BANDWIDTH);
                let gbs = model / (ms * 1e-3) / 1e9;
                if json {
                    println!(
                        "{{\"shape\":\"{name}\",\"granularity\":\"{g:?}\",\"slabs\":\"{slab_name}\",\"auto\":\"{auto}\",\"launches\":{launches},\"ms\":{ms:.5},\"model_bytes\":{model},\"model_gbs\":{gbs:.1},\"x_model\":{ratio:.3},\"same_codes\":{same}}}"
                    );
                } else {
                    println!(
                        "{name:32} {g:<10?} slabs {slab_name:<7} ({launches:>3} launches) {ms:8.4} ms {gbs:7.0} GB/s x model {ratio:5.2} auto {auto}{}",
                        if same { "" } else { "  CODES DIFFER from the first slab size (or counters left nonzero)" }
                    );
                }
            }
        }
    }
    if mismatches > 0 {
        eprintln!("fp8_prepass_bench: {mismatches} runs gave other codes or descales than the default slabs, or left counters nonzero");
        std::process::exit(1);
    }
    Ok(())
}
