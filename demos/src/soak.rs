//! `quattn soak`: many calls of mixed shapes and precisions in one process, for leaks and
//! drift. A set of generator cases (`quattn::fuzz`: ragged GQA shapes, both layouts, strides,
//! causal or not, every precision the device plans, Auto or a forced family) is planned once
//! and called round-robin through `Session::run` (upload, launch, download: every call
//! allocates and frees device buffers). Every call must succeed and give, bit for bit, the
//! output of the first call of its case. Host RSS (`/proc/self/statm`), the device's used
//! memory (CUDA: `cuMemGetInfo`) and the CubeCL memory pool are sampled after the warm-up and
//! at the end; growth past the bound below after the warm-up is a failure.

use std::time::Instant;

use quattn::fuzz::{Generator, Profile};
use quattn::{Device, Plan, Session};
use serde::Serialize;

use crate::args::{DeviceArg, SoakArgs};

/// Growth after the warm-up that counts as a leak: the larger of this many bytes and
/// [`GROWTH_FRACTION`] of the warm-up value (allocators and pools round to pages and size
/// classes).
const GROWTH_BYTES: u64 = 32 << 20;
const GROWTH_FRACTION: f64 = 0.05;

#[derive(Serialize, Clone, Copy, Default)]
struct Sample {
    call: usize,
    seconds: f64,
    host_rss_bytes: u64,
    /// Used memory of the whole device (total − free), CUDA only.
    device_used_bytes: Option<u64>,
    /// The session's CubeCL memory pool: reserved and in use.
    cubecl_reserved_bytes: Option<u64>,
    cubecl_in_use_bytes: Option<u64>,
}

struct Class {
    plan: Plan,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Hash of the first call's O and LSE bits.
    first: Option<u64>,
}

/// Resident pages of this process (`/proc/self/statm`, second field; 0 where it is missing).
fn resident_pages() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|r| r.parse::<u64>().ok()))
        .unwrap_or(0)
}

fn rss_bytes() -> u64 {
    #[cfg(unix)]
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    };
    #[cfg(not(unix))]
    let page = 4096;
    resident_pages() * page
}

/// Used memory of CUDA device `ordinal` (device-wide: every context of every process).
fn cuda_used(ordinal: usize) -> Option<u64> {
    let ctx = quattn_native::device::open_context(ordinal).ok()?;
    ctx.bind_to_thread().ok()?;
    let (free, total) = quattn::cudarc::driver::result::mem_get_info().ok()?;
    Some((total - free) as u64)
}

fn cubecl_usage(s: &Session) -> Option<(u64, u64)> {
    let usage = match s.info().kind {
        "cuda" => s.cubecl_client::<quattn::cubecl::cuda::CudaRuntime>().ok()?.memory_usage().ok()?,
        "wgpu" | "wgpu-spirv" => s.cubecl_client::<quattn::cubecl::wgpu::WgpuRuntime>().ok()?.memory_usage().ok()?,
        _ => return None,
    };
    Some((usage.bytes_reserved, usage.bytes_in_use))
}

fn hash(o: &quattn::Output) -> u64 {
    // FNV-1a over the bits.
    o.o.iter().chain(o.lse.iter().flatten()).fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3))
}

pub fn main(a: &SoakArgs) -> anyhow::Result<i32> {
    let device = match a.device {
        DeviceArg::Cuda => Device::Cuda(a.ordinal),
        DeviceArg::Hip => Device::Hip(a.ordinal),
        DeviceArg::Wgpu => Device::Wgpu(quattn::WgpuAdapter::Default),
        DeviceArg::WgpuSpirv => Device::WgpuSpirv(quattn::WgpuAdapter::Default),
        DeviceArg::Cpu => Device::Cpu,
        DeviceArg::Auto => Device::Auto,
    };
    let session = Session::new(device)?;
    let info = session.info();
    let profile = Profile::probe(&session).with_budget(a.max_len, a.max_work).with_palette(a.kernels);
    let generator = Generator::new(a.seed, profile);
    // The round-robin set: valid cases that plan (refusals are the fuzzer's business).
    let mut classes = Vec::new();
    for i in 0..(a.classes as u64 * 20) {
        if classes.len() == a.classes {
            break;
        }
        let case = generator.case(i);
        if let Ok(plan) = session.plan(&case.problem, case.precision, case.strategy) {
            let x = case.inputs();
            classes.push(Class { plan, q: x.q, k: x.k, v: x.v, first: None });
        }
    }
    anyhow::ensure!(!classes.is_empty(), "no generator case plans on {}", info.kind);
    let kernels: std::collections::BTreeSet<String> = classes.iter().map(|c| c.plan.kernel_name()).collect();
    eprintln!(
        "soak on {} ({}): {} calls over {} cases ({} kernels), warm-up {} calls, seed {:#x}",
        info.kind,
        info.adapter,
        a.calls,
        classes.len(),
        kernels.len(),
        a.warmup,
        a.seed
    );
    let ordinal = match device {
        Device::Cuda(o) => Some(o),
        _ => None,
    };
    let start = Instant::now();
    let sample = |call: usize| -> Sample {
        let cubecl = cubecl_usage(&session);
        Sample {
            call,
            seconds: start.elapsed().as_secs_f64(),
            host_rss_bytes: rss_bytes(),
            device_used_bytes: ordinal.and_then(cuda_used),
            cubecl_reserved_bytes: cubecl.map(|c| c.0),
            cubecl_in_use_bytes: cubecl.map(|c| c.1),
        }
    };
    let mut samples = vec![sample(0)];
    let (mut errors, mut drifted) = (0usize, 0usize);
    let n = classes.len();
    for call in 0..a.calls {
        let c = &mut classes[call % n];
        match session.run(&c.plan, &c.q, &c.k, &c.v) {
            Ok(out) => {
                let h = hash(&out);
                match c.first {
                    None => c.first = Some(h),
                    Some(f) if f != h => {
                        drifted += 1;
                        if drifted <= 5 {
                            eprintln!("call {call}: {} gave other bits than its first call", c.plan.kernel_name());
                        }
                    }
                    Some(_) => {}
                }
            }
            Err(e) => {
                errors += 1;
                if errors <= 5 {
                    eprintln!("call {call}: {} failed: {e}", c.plan.kernel_name());
                }
            }
        }
        let done = call + 1;
        if done == a.warmup || done == a.calls || done % a.sample_every.max(1) == 0 {
            let s = sample(done);
            if a.json {
                println!("{}", serde_json::to_string(&s)?);
            }
            samples.push(s);
        }
    }
    let warm = samples.iter().find(|s| s.call >= a.warmup.min(a.calls)).copied().unwrap_or_default();
    let end = samples.last().copied().unwrap_or_default();
    let grows = |from: u64, to: u64| to > from && (to - from) > GROWTH_BYTES.max((from as f64 * GROWTH_FRACTION) as u64);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut leaks = Vec::new();
    let mut line = |what: &str, from: Option<u64>, to: Option<u64>| {
        if let (Some(f), Some(t)) = (from, to) {
            let verdict = if grows(f, t) { "GROWS" } else { "flat" };
            if grows(f, t) {
                leaks.push(what.to_string());
            }
            println!("soak: {what:<22} after warm-up {:>10.1} MiB, at the end {:>10.1} MiB ({:+.1} MiB): {verdict}", mib(f), mib(t), mib(t) - mib(f));
        }
    };
    line("host RSS", Some(warm.host_rss_bytes), Some(end.host_rss_bytes));
    line("device used (CUDA)", warm.device_used_bytes, end.device_used_bytes);
    line("CubeCL pool reserved", warm.cubecl_reserved_bytes, end.cubecl_reserved_bytes);
    line("CubeCL pool in use", warm.cubecl_in_use_bytes, end.cubecl_in_use_bytes);
    println!(
        "soak: {} calls on {} in {:.1} s: {errors} errors, {drifted} calls with other bits than their case's first; {}",
        a.calls,
        info.kind,
        end.seconds,
        if leaks.is_empty() { "memory flat after the warm-up".to_string() } else { format!("memory grows: {}", leaks.join(", ")) }
    );
    Ok(if errors == 0 && drifted == 0 && leaks.is_empty() { 0 } else { 1 })
}
