//! Times the INT8 quantization prepass (`int8_prepass`, f16 inputs) on a CUDA GPU against its
//! bytes at 3 TB/s (the H100's HBM3): [`Int8PrepassConfig::min_bytes`] (every input read once,
//! every code written once) and [`Int8PrepassConfig::moved_bytes`] (plus the stats launch's
//! second read of K, and of V with e4m3 V). Per shape it runs the
//! prepasses of the s8 wgmma family: f16 P·V per-block unsmoothed, per-block smoothed and
//! per-thread smoothed, and e4m3 P·V per-block smoothed (V to e4m3 Vᵀ); with stats, the two
//! launches (stats, then quantize) timed together; median of 20 device-timed runs each. Every
//! launch must leave the tickets zero (exit status 1 otherwise; `quattn selftest --only
//! int8-prepass` checks the codes, scales, mean, LSE shift and Vᵀ against the codec).
//!
//! `cargo run --release -p quattn-native --example int8_prepass_bench [-- --json]`
//!
//! Output: one line per (shape, prepass): microseconds, GB/s of the moved bytes, and the
//! time over the time of the min and of the moved bytes at 3 TB/s (the target is at most 1.5).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use quattn_native::{AttentionShape, Dtype, Int8Granularity, Int8Prepass, Int8PrepassConfig, Int8WgmmaConfig, Layout, PrepassPtrs};

type BoxErr = Box<dyn std::error::Error>;

/// The DRAM bandwidth the bytes are measured against, bytes per second.
const MODEL_BANDWIDTH: f64 = 3.0e12;

/// f16 bits of values in about [-4, 4] with a few large ones and a per-channel offset (what
/// smoothing removes), no NaN or infinity.
fn halves(n: usize, head_dim: usize, seed: u64) -> Vec<u16> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0 + (i % head_dim) as f32 * 0.05;
            let x = if i % 997 == 0 { x * 64.0 } else { x };
            half::f16::from_f32(x).to_bits()
        })
        .collect()
}

/// Device buffers of one prepass configuration over one shape.
struct Buffers {
    x: [CudaSlice<u16>; 3],
    q_codes: CudaSlice<u8>,
    k_codes: CudaSlice<u8>,
    vt_codes: CudaSlice<u8>,
    q_scale: CudaSlice<f32>,
    k_scale: CudaSlice<f32>,
    mean: CudaSlice<f32>,
    k_partial: CudaSlice<f64>,
    v_scale: CudaSlice<f32>,
    v_inv: CudaSlice<f32>,
    v_partial: CudaSlice<f32>,
    tickets: CudaSlice<u32>,
    lse_shift: CudaSlice<f32>,
}

impl Buffers {
    /// `x`: the f16 bits of Q, K and V.
    fn new(stream: &Arc<CudaStream>, c: &Int8PrepassConfig, a: &AttentionShape, x: &[Vec<u16>; 3]) -> Result<Self, BoxErr> {
        let l = c.required_lens(a)?;
        let f = |n: usize| stream.alloc_zeros::<f32>(n.max(4));
        Ok(Buffers {
            x: [stream.clone_htod(&x[0])?, stream.clone_htod(&x[1])?, stream.clone_htod(&x[2])?],
            q_codes: stream.alloc_zeros(l.q_codes.max(16))?,
            k_codes: stream.alloc_zeros(l.k_codes.max(16))?,
            vt_codes: stream.alloc_zeros(l.vt_codes.max(16))?,
            q_scale: f(l.q_scale)?,
            k_scale: f(l.k_scale)?,
            mean: f(l.mean)?,
            k_partial: stream.alloc_zeros(l.k_partial.max(2))?,
            v_scale: f(l.v_scale)?,
            v_inv: f(l.v_inv)?,
            v_partial: f(l.v_partial)?,
            tickets: stream.alloc_zeros(l.tickets.max(4))?,
            lse_shift: f(l.lse_shift)?,
        })
    }

    fn ptrs(&mut self, s: &Arc<CudaStream>, c: &Int8PrepassConfig) -> PrepassPtrs {
        let on = |b: bool, x: u64| if b { x } else { 0 };
        let (sm, vf) = (c.smooth_k, c.v_fp8);
        PrepassPtrs {
            q: self.x[0].device_ptr(s).0,
            k: self.x[1].device_ptr(s).0,
            v: on(vf, self.x[2].device_ptr(s).0),
            q_codes: self.q_codes.device_ptr_mut(s).0,
            k_codes: self.k_codes.device_ptr_mut(s).0,
            vt_codes: on(vf, self.vt_codes.device_ptr_mut(s).0),
            q_scale: self.q_scale.device_ptr_mut(s).0,
            k_scale: self.k_scale.device_ptr_mut(s).0,
            mean: on(sm, self.mean.device_ptr_mut(s).0),
            k_partial: on(sm, self.k_partial.device_ptr_mut(s).0),
            v_scale: on(vf, self.v_scale.device_ptr_mut(s).0),
            v_inv: on(vf, self.v_inv.device_ptr_mut(s).0),
            v_partial: on(vf, self.v_partial.device_ptr_mut(s).0),
            tickets: on(sm || vf, self.tickets.device_ptr_mut(s).0),
            lse_shift: on(sm, self.lse_shift.device_ptr_mut(s).0),
        }
    }
}

fn median_us(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, mut f: impl FnMut() -> Result<(), BoxErr>) -> Result<f64, BoxErr> {
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
        t.push(a.elapsed_ms(&b)? as f64 * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn main() -> Result<(), BoxErr> {
    let json = std::env::args().any(|a| a == "--json");
    let ctx = quattn_native::device::open_context(0)?;
    let stream = ctx.default_stream();
    let shapes = [
        ("b1 h16 s16384 d128", AttentionShape::contiguous(Layout::Bhsd, 1, 16, 16, 16384, 16384, 128, false)),
        ("b4 h16 s4096 d128", AttentionShape::contiguous(Layout::Bhsd, 4, 16, 16, 4096, 4096, 128, false)),
        ("b16 h16 s1024 d128", AttentionShape::contiguous(Layout::Bhsd, 16, 16, 16, 1024, 1024, 128, false)),
        ("b2 h32/8 s8192 d64 bshd", AttentionShape::contiguous(Layout::Bshd, 2, 32, 8, 8192, 8192, 64, false)),
    ];
    if !json {
        println!("device {} | bytes at {:.0} TB/s: min = inputs read once + codes written once; moved = min + the stats items' reads", ctx.name()?, MODEL_BANDWIDTH / 1e12);
    }
    let mut bad = 0;
    for (name, shape) in shapes {
        let d = shape.head_dim;
        let (nq, nk) = (shape.batch * shape.q_heads * shape.q_len * d, shape.batch * shape.kv_heads * shape.kv_len * d);
        let inputs = [halves(nq, d, 1), halves(nk, d, 2), halves(nk, d, 3)];
        // (label, the kernel whose blocking the prepass serves, smoothing)
        let configs = [
            ("f16pv block", Int8WgmmaConfig::new(d, Int8Granularity::PerBlock)?, false),
            ("f16pv block smooth", Int8WgmmaConfig::new(d, Int8Granularity::PerBlock)?, true),
            ("f16pv thread smooth", Int8WgmmaConfig::new(d, Int8Granularity::PerThread)?, true),
            ("e4m3pv block smooth", Int8WgmmaConfig::new_fp8(d, Int8Granularity::PerBlock)?, true),
        ];
        for (label, kcfg, smooth) in configs {
            let pc = Int8PrepassConfig::new(d, Dtype::F16, kcfg.blocking()?, kcfg.granularity, smooth)?;
            let pc = if kcfg.pv_fp8() { pc.with_v_fp8() } else { pc };
            let (min, moved) = (pc.min_bytes(&shape) as f64, pc.moved_bytes(&shape) as f64);
            let mut bufs = Buffers::new(&stream, &pc, &shape, &inputs)?;
            let k = Int8Prepass::load(&ctx, pc)?;
            let launches = if pc.has_stats() { 2 } else { 1 };
            let ptrs = bufs.ptrs(&stream, &pc);
            // SAFETY: every buffer was allocated with `required_lens` of this configuration and
            // shape; the tickets start zeroed and every launch leaves them zero.
            let us = median_us(&ctx, &stream, || Ok(unsafe { k.launch_raw(&stream, &shape, &ptrs) }?))?;
            let tickets_zero = stream.clone_dtoh(&bufs.tickets)?.iter().all(|&w| w == 0);
            if !tickets_zero {
                bad += 1;
            }
            let (r_min, r_moved) = (us * 1e-6 / (min / MODEL_BANDWIDTH), us * 1e-6 / (moved / MODEL_BANDWIDTH));
            let gbs = moved / (us * 1e-6) / 1e9;
            if json {
                println!(
                    "{{\"section\":\"int8_prepass\",\"shape\":\"{name}\",\"prepass\":\"{label}\",\"launches\":{launches},\"us\":{us:.2},\"min_bytes\":{min},\"moved_bytes\":{moved},\"gb_per_s_moved\":{gbs:.1},\"ratio_to_min_bytes_at_3tbs\":{r_min:.3},\"ratio_to_moved_bytes_at_3tbs\":{r_moved:.3},\"within_1_5x_min\":{},\"within_1_5x_moved\":{},\"tickets_zero\":{tickets_zero}}}",
                    r_min <= 1.5,
                    r_moved <= 1.5
                );
            } else {
                println!(
                    "{name:24} {label:20} {launches} launch(es) {us:8.1} us {gbs:6.0} GB/s moved | x min {r_min:5.2} x moved {r_moved:5.2}{}",
                    if tickets_zero { "" } else { "  TICKETS LEFT NONZERO" }
                );
            }
        }
    }
    if bad > 0 {
        eprintln!("int8_prepass_bench: {bad} prepasses left their tickets nonzero");
        std::process::exit(1);
    }
    Ok(())
}
