//! The CubeCL backend, generic over the runtime: one implementation serves wgpu (Vulkan, Metal,
//! DX12, software adapters) and CUDA. Device buffers are CubeCL handles; timing uses CubeCL's
//! profiler (CUDA events) on CUDA and the host clock on wgpu adapters (see `time`).
//!
//! `Int8Qk` runs as two steps on the device: the CubeCL quantization prepass (f16 Q and K to
//! INT8 codes and scales, K smoothing) then the INT8 attention kernel; the scale layout
//! follows the kernel's tiles, recorded on the plan as its [`Blocking`].

use std::panic::{catch_unwind, AssertUnwindSafe};

use cubecl::prelude::*;
use cubecl::server::Handle;
use half::{bf16, f16};
use quattn_cubecl::{Accumulation, Family, Int8DeviceOperands, Int8Quant, LaunchError, PortableKernel, SUPPORTED_HEAD_DIMS};

use super::{Backend, KernelChoice, ResidentData};
use crate::error::{Error, Result};
use crate::emulation::Blocking;
use crate::precision::{Dtype, Int8Granularity, PvAccum, PvFormat, QkAccum};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, PortableKind, Precision, Strategy};

/// Executions per host-timed sample on wgpu adapters.
const WGPU_TIMING_BATCH: usize = 5;

pub(crate) struct CubeclBackend<R: Runtime> {
    client: ComputeClient<R>,
    info: DeviceInfo,
}

pub(crate) struct GpuData {
    pub(crate) q: Handle,
    pub(crate) k: Handle,
    pub(crate) v: Handle,
    pub(crate) o: Handle,
    pub(crate) lse: Option<Handle>,
    /// Element type of the uploaded Q, K, V and of O.
    pub(crate) elem: Dtype,
    mode: Mode,
    /// The kernel every execute launches, selected once at upload.
    kernel: PortableKernel,
}

/// What the portable path computes for a precision.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// The float kernels on inputs of this element type, accumulating as the precision says.
    Float(Dtype, Accumulation),
    /// Prepass to INT8 Q/K, then the INT8 kernel with f16 V.
    Int8 { granularity: Int8Granularity, smooth_k: bool },
}

impl Mode {
    fn elem(&self) -> Dtype {
        match self {
            Mode::Float(e, _) => *e,
            Mode::Int8 { .. } => Dtype::F16,
        }
    }
}

impl<R: Runtime> CubeclBackend<R> {
    /// Opens the CubeCL client; CubeCL panics when a device cannot be opened, which becomes a
    /// typed error here.
    pub(crate) fn open(device: Device, runtime_device: R::Device, kind: &'static str, adapter: String) -> Result<Self> {
        let client = catch_unwind(AssertUnwindSafe(|| R::client(&runtime_device))).map_err(|p| Error::DeviceUnavailable {
            device,
            reason: format!("CubeCL could not open it: {}", panic_message(&p)),
        })?;
        Ok(CubeclBackend { client, info: DeviceInfo { device, kind, adapter } })
    }

    /// The same backend reported as `device` of `kind` (a wgpu client that runs SPIR-V).
    #[cfg(feature = "wgpu")]
    pub(crate) fn relabel(mut self, device: Device, kind: &'static str) -> Self {
        self.info.device = device;
        self.info.kind = kind;
        self
    }

    pub(crate) fn data<'a>(&self, plan: &Plan, data: &'a ResidentData) -> Result<&'a GpuData> {
        data.downcast_ref::<GpuData>().ok_or_else(|| foreign(plan))
    }

    /// An uninitialised device buffer of `bytes` bytes.
    pub(crate) fn empty(&self, bytes: usize) -> Handle {
        self.client.empty(bytes)
    }

    /// The CubeCL client (e.g. to ask which compiler a wgpu client runs, `runs_spirv`).
    #[allow(dead_code)]
    pub(crate) fn client(&self) -> &ComputeClient<R> {
        &self.client
    }

    /// The INT8 prepass on device-resident Q and K (`elem`, the problem's layout): codes at the
    /// source's element offsets (4 per `u32` word; as bytes, an int8 tensor with Q's / K's
    /// strides), f32 scales laid out for `blocking` as `codec::int8::Int8ScaleLayout` says, Q
    /// scales folded with `softmax_scale · log2 e`, and with `smooth_k` the K mean
    /// `[batch, kv_heads, head_dim]` and the LSE shift `[batch, q_heads, q_len]`. Enqueued on
    /// the client's stream; the handles are valid as soon as it returns. The portable INT8
    /// path's prepass; the native CUDA kernels have their own on their stream
    /// (`quattn_native::Int8Prepass`).
    pub(crate) fn quantize_int8(
        &self,
        problem: &AttentionProblem,
        granularity: Int8Granularity,
        smooth_k: bool,
        blocking: &Blocking,
        elem: Dtype,
        q: &Handle,
        k: &Handle,
    ) -> Result<Int8DeviceOperands> {
        let quant = int8_quant(granularity, smooth_k, blocking);
        quattn_cubecl::quantize_int8(&self.client, &problem.shape(), elem, &quant, q, k)
            .map_err(|e| launch_error("quantize_int8", "the INT8 prepass", e))
    }

    /// The portable kernel of a plan's problem, precision and strategy on this client, and why
    /// the better families were passed over.
    fn portable_kernel(&self, problem: &AttentionProblem, mode: Mode, strategy: Strategy) -> std::result::Result<(PortableKernel, String), LaunchError> {
        let shape = problem.shape();
        match mode {
            Mode::Int8 { granularity, smooth_k } => {
                let kernel = quattn_cubecl::select_int8(&self.client, &shape, Dtype::F16, granularity, smooth_k)?;
                Ok((kernel, String::new()))
            }
            Mode::Float(elem, accumulation) => {
                let family = match strategy {
                    Strategy::PortableFamily(PortableKind::Fma) => Some(Family::Fma),
                    Strategy::PortableFamily(PortableKind::Cmma) => Some(Family::Cmma),
                    Strategy::PortableFamily(PortableKind::Mma) => Some(Family::Mma),
                    _ => None,
                };
                let selection = quattn_cubecl::select(&self.client, &shape, elem, accumulation, family)?;
                let why = if family.is_some() {
                    "forced".to_string()
                } else {
                    selection.passed_over.iter().map(|(f, why)| format!("no {f}: {why}")).collect::<Vec<_>>().join("; ")
                };
                Ok((selection.kernel, why))
            }
        }
    }
}

/// Whether CubeCL compiles this wgpu client's kernels to SPIR-V. CubeCL 0.10 does not say so
/// directly (`WgpuRuntime::name` is `wgpu<spirv>` for every Vulkan client of a `spirv` build,
/// also one whose driver lacks what the SPIR-V compiler needs and that falls back to WGSL); its
/// Vulkan feature registration, the step that also selects the SPIR-V compiler, is the only
/// place that adds `Plane::Sync`.
#[cfg(feature = "wgpu")]
pub(crate) fn runs_spirv(client: &ComputeClient<cubecl::wgpu::WgpuRuntime>) -> bool {
    cfg!(feature = "spirv") && client.features().plane.contains(cubecl::features::Plane::Sync)
}

#[cfg(feature = "cuda")]
impl CubeclBackend<cubecl::cuda::CudaRuntime> {
    /// The raw CUdeviceptr of a CubeCL CUDA buffer (offset applied), for native kernels that
    /// read what a CubeCL kernel wrote. The resource is `cubecl::cuda`'s `GpuResource { ptr,
    /// binding, size }` (its module is private: reach it through
    /// `ComputeClient::get_resource(handle).resource()`); the pointer stays valid while `handle`
    /// (or a clone) is alive. Order the native stream after CubeCL's before reading.
    #[allow(dead_code)]
    pub(crate) fn device_ptr(&self, handle: &Handle) -> Result<u64> {
        let resource = self
            .client
            .get_resource(handle.clone())
            .map_err(|e| Error::Kernel { kernel: "device_ptr".into(), reason: format!("CubeCL resource: {e:?}") })?;
        Ok(resource.resource().ptr)
    }
}

fn int8_quant(granularity: Int8Granularity, smooth_k: bool, blocking: &Blocking) -> Int8Quant {
    Int8Quant {
        granularity,
        blocking: quattn_cubecl::Int8Blocking { block_q: blocking.block_q, block_k: blocking.block_k, warps: blocking.warps },
        smooth_k,
    }
}

fn foreign(plan: &Plan) -> Error {
    Error::Kernel { kernel: plan.kernel.clone(), reason: "resident data belongs to another backend".into() }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "unknown panic".into())
}

/// What the portable path computes for a precision, or why it cannot. The f16-accumulating
/// modes run on the packed-f16 FMA kernel (f16 FMAs: HFMA2 on NVIDIA, packed math elsewhere).
fn portable_mode(precision: Precision) -> std::result::Result<Mode, &'static str> {
    match precision {
        Precision::F32 => Ok(Mode::Float(Dtype::F32, Accumulation::default())),
        Precision::F16 { qk, pv } => Ok(Mode::Float(Dtype::F16, Accumulation { qk, pv })),
        Precision::Bf16 { qk: QkAccum::F32, pv: PvAccum::F32 } => Ok(Mode::Float(Dtype::Bf16, Accumulation::default())),
        Precision::Bf16 { .. } => Err("bf16 is accumulated in f32 only"),
        Precision::Int8Qk { granularity, smooth_k, pv: PvFormat::F16 } => Ok(Mode::Int8 { granularity, smooth_k }),
        Precision::Int8Qk { pv: PvFormat::Fp8, .. } => Err(
            "the portable INT8 kernel computes P·V with f16 P and V; FP8 P·V (e4m3 P, per-channel e4m3 V) needs an FP8 matrix unit and has no portable kernel",
        ),
        _ => Err("no portable kernel for this quantized mode yet"),
    }
}

fn launch_error(kernel: &str, path: &str, e: LaunchError) -> Error {
    match e {
        LaunchError::UnsupportedHeadDim { head_dim, supported, .. } => Error::UnsupportedHeadDim {
            head_dim,
            path: path.into(),
            supported: supported.to_vec(),
        },
        e => Error::Kernel { kernel: kernel.into(), reason: e.to_string() },
    }
}

/// Device bytes of a host tensor, padded to at least one 4-wide vector: the vector kernels
/// bind every buffer as vectors, also an empty one.
fn to_bytes(x: HostSlice<'_>, elem: Dtype) -> Vec<u8> {
    let v = x.to_f32_vec();
    let mut bytes: Vec<u8> = match elem {
        Dtype::F32 => bytemuck::cast_slice(&v).to_vec(),
        Dtype::F16 => bytemuck::cast_slice(&v.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>()).to_vec(),
        Dtype::Bf16 => bytemuck::cast_slice(&v.iter().map(|&a| bf16::from_f32(a)).collect::<Vec<_>>()).to_vec(),
    };
    bytes.resize(bytes.len().max(MIN_ELEMS * elem.size_bytes()), 0);
    bytes
}

/// Elements every device tensor holds at least (one vector of the vector kernels).
const MIN_ELEMS: usize = 4;

fn from_bytes(b: &[u8], elem: Dtype) -> Vec<f32> {
    match elem {
        Dtype::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(b),
        Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(b).into_iter().map(f16::to_f32).collect(),
        Dtype::Bf16 => bytemuck::pod_collect_to_vec::<u8, bf16>(b).into_iter().map(bf16::to_f32).collect(),
    }
}

impl<R: Runtime> Backend for CubeclBackend<R> {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn select(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<KernelChoice> {
        let device = format!("{} ({})", self.info.kind, self.info.adapter);
        if let Strategy::Native(_) = strategy {
            return Err(Error::UnsupportedStrategy { strategy, device, reason: "no native kernel is integrated for this device yet".into() });
        }
        let mode = portable_mode(precision).map_err(|reason| Error::UnsupportedPrecision { precision, device: device.clone(), reason: reason.into() })?;
        let elem = mode.elem();
        for d in [problem.head_dim, problem.v_head_dim] {
            if !SUPPORTED_HEAD_DIMS.contains(&d) {
                return Err(Error::UnsupportedHeadDim {
                    head_dim: d,
                    path: "the portable CubeCL kernel".into(),
                    supported: SUPPORTED_HEAD_DIMS.to_vec(),
                });
            }
        }
        quattn_cubecl::check_dtype_supported(&self.client, elem)
            .map_err(|e| Error::UnsupportedPrecision { precision, device: device.clone(), reason: e.to_string() })?;
        if let (Mode::Int8 { .. }, Strategy::PortableFamily(kind)) = (mode, strategy) {
            if kind != PortableKind::Fma {
                return Err(Error::UnsupportedStrategy {
                    strategy,
                    device,
                    reason: format!("INT8 Q/K run on the portable FMA kernel only, not {}", kind.name()),
                });
            }
        }
        let (kernel, why) = self.portable_kernel(problem, mode, strategy).map_err(|e| match (strategy, mode) {
            (Strategy::PortableFamily(_), Mode::Float(..)) => Error::UnsupportedStrategy { strategy, device: device.clone(), reason: e.to_string() },
            _ => Error::UnsupportedPrecision { precision, device: device.clone(), reason: e.to_string() },
        })?;
        match kernel {
            PortableKernel::Int8(int8) => {
                let b = int8.blocking();
                let blocking = Blocking { block_q: b.block_q, block_k: b.block_k, warps: b.warps, ..Blocking::default() };
                blocking.validate(problem, precision)?;
                Ok(KernelChoice {
                    name: format!("fwd_portable_{}_{}_d{}", self.info.kind, precision.name(), problem.head_dim),
                    reason: "INT8 prepass and portable CubeCL INT8 kernel".into(),
                    blocking: Some(blocking),
                })
            }
            PortableKernel::Half(half) => {
                // The packed-f16 FMA kernel: its tile is the blocking the emulation must follow
                // (the F16PerTile fold is per KV tile), and every step is one FMA (k_step 1).
                let blocking = Blocking {
                    block_q: half.tiles.bq as usize,
                    block_k: half.tiles.bk as usize,
                    warps: 1,
                    qk_chunk: quattn_core::TWO_STAGE_CHUNK,
                    k_step: 1,
                };
                blocking.validate(problem, precision)?;
                Ok(KernelChoice {
                    name: format!("fwd_portable_half_{}_{}_d{}", self.info.kind, precision.name(), problem.head_dim),
                    reason: format!("portable CubeCL packed-f16 FMA kernel ({}): {precision} accumulates in f16", half.tiles),
                    blocking: Some(blocking),
                })
            }
            kernel => {
                let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
                let (family, reason) = match kernel.family() {
                    Family::Mma => ("portable_mma", format!("portable CubeCL register-softmax manual-MMA (mma) kernel{why}")),
                    Family::Cmma => ("portable_cmma", format!("portable CubeCL matrix-unit (cmma) kernel{why}")),
                    Family::Fma => ("portable", format!("portable CubeCL FMA kernel{why}")),
                };
                Ok(KernelChoice {
                    name: format!("fwd_{family}_{}_{}_d{}", self.info.kind, precision.input_dtype(), problem.head_dim),
                    reason,
                    blocking: None,
                })
            }
        }
    }

    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        let mode = portable_mode(plan.precision).map_err(|reason| Error::UnsupportedPrecision {
            precision: plan.precision,
            device: self.info.kind.into(),
            reason: reason.into(),
        })?;
        let elem = mode.elem();
        let p = &plan.problem;
        let (kernel, _) = self
            .portable_kernel(p, mode, plan.strategy)
            .map_err(|e| launch_error(&plan.kernel, "the portable CubeCL kernel", e))?;
        let c = &self.client;
        Ok(Box::new(GpuData {
            q: c.create_from_slice(&to_bytes(q, elem)),
            k: c.create_from_slice(&to_bytes(k, elem)),
            v: c.create_from_slice(&to_bytes(v, elem)),
            o: c.empty(p.o_len_elems().max(MIN_ELEMS) * elem.size_bytes()),
            lse: p.return_lse.then(|| c.empty(p.lse_len_elems() * 4)),
            elem,
            mode,
            kernel,
        }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        let d = self.data(plan, data)?;
        let shape = plan.problem.shape();
        match d.mode {
            Mode::Float(elem, _) => {
                quattn_cubecl::launch::<R>(
                    &self.client,
                    &d.kernel,
                    &shape,
                    elem,
                    &d.q,
                    &d.k,
                    &d.v,
                    &d.o,
                    d.lse.as_ref(),
                )
                .map_err(|e| launch_error(&plan.kernel, "the portable CubeCL kernel", e))?;
            }
            Mode::Int8 { granularity, smooth_k } => {
                let blocking = plan.blocking.ok_or_else(|| Error::Kernel { kernel: plan.kernel.clone(), reason: "an INT8 plan without the blocking its scales follow".into() })?;
                let ops = self.quantize_int8(&plan.problem, granularity, smooth_k, &blocking, d.elem, &d.q, &d.k)?;
                quattn_cubecl::launch_int8::<R>(
                    &self.client,
                    &d.kernel,
                    &shape,
                    d.elem,
                    &ops,
                    &d.v,
                    &d.o,
                    d.lse.as_ref(),
                )
                .map_err(|e| launch_error(&plan.kernel, "the portable CubeCL INT8 kernel", e))?;
            }
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        pollster::block_on(self.client.sync()).map_err(|e| Error::Kernel { kernel: "synchronize".into(), reason: format!("{e:?}") })
    }

    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let d = self.data(plan, data)?;
        let read = |h: &Handle| {
            self.client.read_one(h.clone()).map_err(|e| Error::Kernel { kernel: plan.kernel.clone(), reason: format!("read back: {e:?}") })
        };
        let o = from_bytes(&read(&d.o)?, d.elem);
        let lse = match &d.lse {
            Some(h) => Some(from_bytes(&read(h)?, Dtype::F32)),
            None => None,
        };
        Ok((o[..plan.problem.o_len_elems()].to_vec(), lse.map(|l| l[..plan.problem.lse_len_elems()].to_vec())))
    }

    /// CubeCL's profiler (CUDA events) on CUDA; the host clock on wgpu adapters, whose timestamp
    /// queries undercount SPIR-V cooperative-matrix kernels on NVIDIA's Vulkan driver 2.5× (a
    /// device-bound launch loop took 13 ms per launch where the timestamps said 5.2;
    /// BENCHMARKS.md, runs `t` and `u`). For the WGSL kernels the two agree within 2%. Each
    /// wgpu sample is a batch of [`WGPU_TIMING_BATCH`] executions per synchronization: one
    /// wgpu synchronization per launch added up to 6 ms to a 13 ms launch there (run `w`).
    fn time(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        if matches!(self.info.device, Device::Wgpu(_) | Device::WgpuSpirv(_)) {
            return super::host_time(self, plan, data, warmup, iters, WGPU_TIMING_BATCH);
        }
        for _ in 0..warmup {
            self.execute(plan, data)?;
        }
        self.synchronize()?;
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let (r, dur) = self
                .client
                .profile(|| self.execute(plan, data), "quattn attention")
                .map_err(|e| Error::Kernel { kernel: plan.kernel.clone(), reason: format!("profiling: {e:?}") })?;
            r?;
            out.push(pollster::block_on(dur.resolve()).duration().as_secs_f64() * 1e3);
        }
        Ok(out)
    }
}
