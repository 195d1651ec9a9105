//! Peers timed beside our kernels by `quattn bench --peers`, so that one device call measures
//! both under the same conditions.
//!
//! * cubek-attention 0.2 (the upstream CubeCL attention, on the same cubecl 0.10 as quattn),
//!   called through its public `launch_ref` on fp16 device-resident BHSD inputs, on the CUDA
//!   runtime or a wgpu adapter. Built only with the `peer-cubek` feature; without it the rows
//!   come back skipped, so call sites need no `#[cfg]`.
//! * torch SDPA lives in `demos/peers/torch_sdpa.py` (python is not needed to build or test us).
//!
//! Timing is the same as quattn's GPU backend: CubeCL's `client.profile` around one launch
//! (device timestamps where the runtime has them), median of `iters` samples after `warmup`
//! launches, TFLOP/s from [`quattn::metrics::flops`].

use quattn::{AttentionProblem, Device, Layout, Precision};

/// A peer's row is a `quattn bench` row, so both print as the same JSON.
pub use crate::bench::Row as PeerRow;
use crate::run::Shape as PeerShape;

/// Which cubek-attention routine, and its tiling where the routine takes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CubekVariant {
    /// `Strategy::Unit`: one unit per row, no matrix instructions; runs on any adapter whose
    /// plane (subgroup) size is at least 2, llvmpipe included. Slow.
    Unit,
    /// `Strategy::BlackboxAccelerated`: cmma tiles with shared memory for the row-wise softmax.
    /// `planes` = planes per cube (stage rows), `seq_q`/`seq_kv` = tiles per plane partition.
    Accelerated { planes: u8, seq_q: u8, seq_kv: u8 },
}

impl CubekVariant {
    /// What to try on a GPU: the accelerated routine at a few stage sizes (cubek 0.2 has no
    /// autotuner for attention, so we sweep a little and keep the fastest), and the unit
    /// routine for adapters without matrix instructions (llvmpipe).
    pub const DEFAULTS: &'static [CubekVariant] = &[
        CubekVariant::Accelerated { planes: 4, seq_q: 1, seq_kv: 1 },
        CubekVariant::Accelerated { planes: 8, seq_q: 1, seq_kv: 1 },
        CubekVariant::Accelerated { planes: 4, seq_q: 2, seq_kv: 1 },
        CubekVariant::Accelerated { planes: 1, seq_q: 1, seq_kv: 1 },
        CubekVariant::Unit,
    ];

    #[cfg_attr(not(feature = "peer-cubek"), allow(dead_code))]
    pub fn name(&self) -> String {
        match self {
            CubekVariant::Unit => "unit".into(),
            CubekVariant::Accelerated { planes, seq_q, seq_kv } => format!("accel-p{planes}q{seq_q}k{seq_kv}"),
        }
    }
}

/// Why cubek-attention cannot compute `p` as quattn defines it, if it cannot.
#[cfg_attr(not(feature = "peer-cubek"), allow(dead_code))]
fn cubek_unsupported(p: &AttentionProblem) -> Option<String> {
    if p.kv_heads != p.q_heads {
        return Some("cubek-attention 0.2 has no grouped-query attention (kv_heads must equal heads)".into());
    }
    if p.layout != Layout::Bhsd {
        return Some("the cubek peer is wired for BHSD inputs only".into());
    }
    if let Some(s) = p.scale {
        if (s - 1.0 / (p.head_dim as f32).sqrt()).abs() > f32::EPSILON {
            return Some("cubek-attention 0.2 always scales by 1/sqrt(head_dim)".into());
        }
    }
    if p.has_modifiers() {
        return Some(format!("cubek-attention 0.2 has no score modifiers ({})", p.modifiers().join(", ")));
    }
    if p.causal && p.q_len != p.kv_len {
        // quattn aligns the causal mask bottom-right; cubek's alignment for q_len != kv_len is
        // not documented, so only square causal problems are compared.
        return Some("causal with q_len != kv_len: cubek's mask alignment is not quattn's contract".into());
    }
    if p.return_lse {
        return Some("cubek-attention 0.2 does not return the LSE".into());
    }
    None
}

/// Times cubek-attention on each problem on `device` (f16 inputs, f32 accumulation: quattn's
/// `f16` precision). For each problem the variants are tried in order and the fastest that runs
/// is reported; `Unit` is tried only when no accelerated variant ran (it is slow without matrix
/// instructions: seconds per call on the large grid rows). When none runs the row is skipped
/// with each variant's reason. Never panics on an unsupported shape or device.
/// `CubekVariant::DEFAULTS` is the usual `variants`.
pub fn cubek_rows(problems: &[AttentionProblem], device: Device, variants: &[CubekVariant], warmup: usize, iters: usize) -> Vec<PeerRow> {
    imp::rows(problems, device, variants, warmup, iters)
}

/// cubek-attention's output O (BHSD, as f32) for host inputs `q`, `k`, `v` (BHSD, rounded to
/// f16 on upload), for accuracy checks against `quattn::reference::attention_f64`.
#[allow(dead_code)] // for accuracy reports; the bench needs only `cubek_rows`
pub fn cubek_output(problem: &AttentionProblem, device: Device, variant: CubekVariant, q: &[f32], k: &[f32], v: &[f32]) -> anyhow::Result<Vec<f32>> {
    imp::output(problem, device, variant, q, k, v)
}

/// The `device` field of a row for a device that could not be opened (quattn's `DeviceInfo::kind`).
fn device_kind(d: Device) -> &'static str {
    match d {
        Device::Auto => "auto",
        Device::Cpu => "cpu",
        Device::Wgpu(_) => "wgpu",
        Device::WgpuSpirv(_) => "wgpu-spirv",
        Device::Cuda(_) => "cuda",
        Device::Hip(_) => "hip",
    }
}

fn skipped_row(p: &AttentionProblem, device: &str, adapter: &str, reason: String) -> PeerRow {
    PeerRow {
        device: device.into(),
        adapter: adapter.into(),
        kernel: None,
        precision: Precision::F16_DEFAULT.name(),
        shape: PeerShape::of(p),
        ms: None,
        tflops: None,
        skipped: Some(reason),
    }
}

#[cfg(not(feature = "peer-cubek"))]
mod imp {
    use super::*;

    const NOT_BUILT: &str = "built without the `peer-cubek` feature (cargo build --release -p quattn-demos --features peer-cubek)";

    pub fn rows(problems: &[AttentionProblem], device: Device, _: &[CubekVariant], _: usize, _: usize) -> Vec<PeerRow> {
        problems.iter().map(|p| skipped_row(p, device_kind(device), "", NOT_BUILT.into())).collect()
    }

    pub fn output(_: &AttentionProblem, _: Device, _: CubekVariant, _: &[f32], _: &[f32], _: &[f32]) -> anyhow::Result<Vec<f32>> {
        anyhow::bail!(NOT_BUILT)
    }
}

#[cfg(feature = "peer-cubek")]
mod imp {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use cubecl::prelude::*;
    use cubecl::server::Handle;
    use cubecl::zspace::{Shape, Strides};
    use cubek_attention::definition::{AccumulatorPrecision, AttentionGlobalTypes, AttentionOptions};
    use cubek_attention::launch::{launch_ref, BlueprintStrategy, Strategy};
    use cubek_attention::routines::blackbox_accelerated::BlackboxAcceleratedStrategy;
    use half::f16;
    use quattn::metrics::flops;
    use quattn::{Session, WgpuAdapter};

    use super::*;

    /// Where the peer runs: quattn resolves the device (so the adapter name matches its rows),
    /// then the peer opens the same device through CubeCL.
    struct Target {
        device: Device,
        kind: String,
        adapter: String,
    }

    fn resolve(device: Device) -> Result<Target, String> {
        let s = Session::new(device).map_err(|e| format!("device: {e}"))?;
        let info = s.info();
        Ok(Target { device: info.device, kind: info.kind.into(), adapter: info.adapter })
    }

    pub fn rows(problems: &[AttentionProblem], device: Device, variants: &[CubekVariant], warmup: usize, iters: usize) -> Vec<PeerRow> {
        let t = match resolve(device) {
            Ok(t) => t,
            Err(e) => return problems.iter().map(|p| skipped_row(p, device_kind(device), "", e.clone())).collect(),
        };
        problems
            .iter()
            .map(|p| {
                let r = match t.device {
                    Device::Cuda(i) => best::<cubecl::cuda::CudaRuntime>(&cubecl::cuda::CudaDevice::new(i), p, variants, warmup, iters),
                    // The peer gets the compiler this build gives the adapter, as quattn does.
                    Device::Wgpu(a) | Device::WgpuSpirv(a) => best::<cubecl::wgpu::WgpuRuntime>(&wgpu_device(a), p, variants, warmup, iters),
                    other => Err(format!("cubek-attention needs a CubeCL GPU runtime, not {other}")),
                };
                match r {
                    Ok((variant, ms)) => PeerRow {
                        device: t.kind.clone(),
                        adapter: t.adapter.clone(),
                        kernel: Some(format!("cubek-attention/{}", variant.name())),
                        precision: Precision::F16_DEFAULT.name(),
                        shape: PeerShape::of(p),
                        ms: Some(ms),
                        tflops: Some(flops(p) / (ms * 1e-3) / 1e12),
                        skipped: None,
                    },
                    Err(reason) => skipped_row(p, &t.kind, &t.adapter, reason),
                }
            })
            .collect()
    }

    pub fn output(problem: &AttentionProblem, device: Device, variant: CubekVariant, q: &[f32], k: &[f32], v: &[f32]) -> anyhow::Result<Vec<f32>> {
        let t = resolve(device).map_err(anyhow::Error::msg)?;
        let r = match t.device {
            Device::Cuda(i) => run_once::<cubecl::cuda::CudaRuntime>(&cubecl::cuda::CudaDevice::new(i), problem, variant, q, k, v),
            Device::Wgpu(a) | Device::WgpuSpirv(a) => run_once::<cubecl::wgpu::WgpuRuntime>(&wgpu_device(a), problem, variant, q, k, v),
            other => Err(format!("cubek-attention needs a CubeCL GPU runtime, not {other}")),
        };
        r.map_err(anyhow::Error::msg)
    }

    fn wgpu_device(a: WgpuAdapter) -> cubecl::wgpu::WgpuDevice {
        use cubecl::wgpu::WgpuDevice;
        match a {
            WgpuAdapter::Default => WgpuDevice::DefaultDevice,
            WgpuAdapter::Discrete(i) => WgpuDevice::DiscreteGpu(i),
            WgpuAdapter::Integrated(i) => WgpuDevice::IntegratedGpu(i),
            WgpuAdapter::Virtual(i) => WgpuDevice::VirtualGpu(i),
            WgpuAdapter::Software => WgpuDevice::Cpu,
        }
    }

    /// Device-resident Q, K, V, O of one problem.
    struct Resident {
        q: Handle,
        k: Handle,
        v: Handle,
        o: Handle,
    }

    fn f16_bytes(x: &[f32]) -> Vec<u8> {
        x.iter().flat_map(|&a| f16::from_f32(a).to_le_bytes()).collect()
    }

    fn upload<R: Runtime>(client: &ComputeClient<R>, p: &AttentionProblem, q: &[f32], k: &[f32], v: &[f32]) -> Resident {
        let o_elems = p.batch * p.q_heads * p.q_len * p.v_head_dim;
        Resident {
            q: client.create_from_slice(&f16_bytes(q)),
            k: client.create_from_slice(&f16_bytes(k)),
            v: client.create_from_slice(&f16_bytes(v)),
            o: client.empty(o_elems * 2),
        }
    }

    /// A contiguous BHSD binding of `h`.
    fn bhsd<R: Runtime>(h: &Handle, b: usize, heads: usize, s: usize, d: usize) -> TensorBinding<R> {
        // SAFETY: `upload` sized every handle for exactly b·heads·s·d f16 elements, contiguous.
        unsafe { TensorBinding::from_raw_parts(h.clone(), Strides::new(&[heads * s * d, s * d, d, 1]), Shape::new([b, heads, s, d])) }
    }

    fn strategy(v: CubekVariant) -> Strategy {
        match v {
            CubekVariant::Unit => Strategy::Unit(BlueprintStrategy::Inferred(())),
            CubekVariant::Accelerated { planes, seq_q, seq_kv } => {
                Strategy::BlackboxAccelerated(BlueprintStrategy::Inferred(BlackboxAcceleratedStrategy { num_planes: planes, seq_q, seq_kv }))
            }
        }
    }

    fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
        p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "unknown panic".into())
    }

    /// One launch of cubek-attention on resident data; setup errors and panics become `Err`.
    fn launch<R: Runtime>(client: &ComputeClient<R>, p: &AttentionProblem, variant: CubekVariant, d: &Resident) -> Result<(), String> {
        let dtypes = AttentionGlobalTypes::from_single_float_dtype(f16::as_type_native_unchecked(), AttentionGlobalTypes::mask_dtype(client));
        let options = AttentionOptions { causal: p.causal, accumulator_precision: AccumulatorPrecision::default() };
        let r = catch_unwind(AssertUnwindSafe(|| {
            launch_ref::<R>(
                strategy(variant),
                client,
                bhsd(&d.q, p.batch, p.q_heads, p.q_len, p.head_dim),
                bhsd(&d.k, p.batch, p.kv_heads, p.kv_len, p.head_dim),
                bhsd(&d.v, p.batch, p.kv_heads, p.kv_len, p.v_head_dim),
                None,
                bhsd(&d.o, p.batch, p.q_heads, p.q_len, p.v_head_dim),
                &dtypes,
                options,
            )
        }));
        match r {
            Ok(Ok(())) => Ok(()),
            // cubek's Debug output ends lines with '\n'; one line reads better in a table.
            Ok(Err(e)) => Err(format!("{e:?}").trim().replace('\n', "; ")),
            Err(panic) => Err(format!("panicked: {}", panic_message(&panic))),
        }
    }

    fn sync<R: Runtime>(client: &ComputeClient<R>) -> Result<(), String> {
        cubecl::future::block_on(client.sync()).map_err(|e| format!("sync: {e:?}"))
    }

    fn open<R: Runtime>(device: &R::Device) -> Result<ComputeClient<R>, String> {
        catch_unwind(AssertUnwindSafe(|| R::client(device))).map_err(|p| format!("CubeCL could not open the device: {}", panic_message(&p)))
    }

    fn run_once<R: Runtime>(device: &R::Device, p: &AttentionProblem, variant: CubekVariant, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>, String> {
        if let Some(why) = cubek_unsupported(p) {
            return Err(why);
        }
        let client = open::<R>(device)?;
        let d = upload(&client, p, q, k, v);
        launch(&client, p, variant, &d)?;
        let bytes = client.read_one(d.o.clone()).map_err(|e| format!("reading O: {e:?}"))?;
        let o_elems = p.batch * p.q_heads * p.q_len * p.v_head_dim;
        Ok(bytes.chunks_exact(2).take(o_elems).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect())
    }

    /// Median milliseconds of the fastest variant that runs on `p`.
    fn best<R: Runtime>(device: &R::Device, p: &AttentionProblem, variants: &[CubekVariant], warmup: usize, iters: usize) -> Result<(CubekVariant, f64), String> {
        if let Some(why) = cubek_unsupported(p) {
            return Err(why);
        }
        if variants.is_empty() {
            return Err("no cubek variant requested".into());
        }
        let client = open::<R>(device)?;
        let (q, k, v) = quattn::inputs::qkv(p, 17);
        let d = upload(&client, p, &q, &k, &v);
        drop((q, k, v));
        let mut best: Option<(CubekVariant, f64)> = None;
        let mut reasons = Vec::new();
        for &variant in variants {
            if variant == CubekVariant::Unit && best.is_some() {
                continue;
            }
            match time(&client, p, variant, &d, warmup, iters) {
                Ok(ms) => {
                    log::info!("cubek {} on {:?}: {ms:.3} ms", variant.name(), PeerShape::of(p));
                    if best.is_none_or(|(_, b)| ms < b) {
                        best = Some((variant, ms));
                    }
                }
                Err(e) => reasons.push(format!("{}: {e}", variant.name())),
            }
        }
        best.ok_or_else(|| reasons.join(" | "))
    }

    fn time<R: Runtime>(client: &ComputeClient<R>, p: &AttentionProblem, variant: CubekVariant, d: &Resident, warmup: usize, iters: usize) -> Result<f64, String> {
        // The first launch compiles; errors there (config, compile) end this variant.
        launch(client, p, variant, d)?;
        for _ in 0..warmup {
            launch(client, p, variant, d)?;
        }
        sync(client)?;
        let mut t = Vec::with_capacity(iters.max(1));
        for _ in 0..iters.max(1) {
            let (r, dur) = client.profile(|| launch(client, p, variant, d), "cubek attention").map_err(|e| format!("profiling: {e:?}"))?;
            r?;
            t.push(cubecl::future::block_on(dur.resolve()).duration().as_secs_f64() * 1e3);
        }
        t.sort_by(|a, b| a.total_cmp(b));
        Ok(t[t.len() / 2])
    }
}
