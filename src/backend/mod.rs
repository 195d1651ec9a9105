//! Backends: one per device class, behind one trait, so the session needs no `#[cfg]`.
//! A backend whose feature is off is still named; opening it returns
//! [`Error::NotCompiledWith`].

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) mod gpu;
#[cfg(feature = "hip")]
pub(crate) mod hip;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) mod tables;

use std::any::Any;
use std::time::Instant;

use crate::codec::int8::Int8Operands;
use crate::device_tensor::CubeclTensors;
use crate::error::{Error, Result};
use crate::registry::Planned;
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, Precision, Strategy, WgpuAdapter};

/// Device-resident inputs and outputs of one planned call (backend-specific).
pub(crate) type ResidentData = Box<dyn Any + Send>;

pub(crate) trait Backend: Send + Sync {
    fn info(&self) -> DeviceInfo;
    /// Walks the backend's dispatch table for `strategy` (never `Reference`, which the session
    /// handles): the kernel and its resolved configuration, or the typed error naming what is
    /// unsupported.
    fn plan(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<Planned>;
    /// Device buffers in the plan's element type holding the host inputs, and O / LSE buffers.
    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData>;
    /// Launches the plan's kernel; may return before the device finishes.
    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    /// O (problem layout) and LSE (`[batch, q_heads, q_len]`, when asked for), widened to f32.
    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)>;
    /// Milliseconds of the attention kernel alone, for plans that run in several steps (the
    /// INT8 prepass, then the kernel): `None` where [`Backend::time`] already is the kernel.
    fn time_kernel(&self, _plan: &Plan, _data: &mut ResidentData, _warmup: usize, _iters: usize) -> Result<Option<Vec<f64>>> {
        Ok(None)
    }
    /// The INT8 operands the last execution quantized, read back, where the backend keeps them
    /// (the native CUDA prepass); `None` elsewhere.
    fn int8_operands(&self, _plan: &Plan, _data: &ResidentData) -> Result<Option<Int8Operands>> {
        Ok(None)
    }
    /// The FP8 codes and descales the upload's device prepass wrote, read back, where the
    /// backend quantizes on the device (the native CUDA FP8 plans); `None` elsewhere.
    fn fp8_operands(&self, _plan: &Plan, _data: &ResidentData) -> Result<Option<crate::codec::fp8_scaled::Fp8Operands>> {
        Ok(None)
    }
    /// Milliseconds per execution, `iters` samples after `warmup` runs. Backends with device
    /// timers override this; the default times each synchronized run on the host.
    fn time(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        host_time(self, plan, data, warmup, iters, 1)
    }
    /// The concrete backend, for the device-tensor entry points of the session.
    fn as_any(&self) -> &dyn Any;
    /// The CubeCL backend inside (a `gpu::CubeclBackend<R>`), for CubeCL handles.
    fn cubecl(&self) -> Option<&dyn Any> {
        None
    }
    /// Runs the plan on CubeCL handles of the backend's client (checked by the session).
    fn run_handles(&self, plan: &Plan, _t: &CubeclTensors<'_>) -> Result<()> {
        Err(Error::WrongDevice {
            tensor: crate::TensorName::Q,
            expected: format!("{} ({})", self.info().kind, self.info().adapter),
            got: format!("CubeCL handles (plan {})", plan.kernel_name()),
        })
    }
}

/// The error for resident data or a kernel id that another backend produced.
pub(crate) fn foreign(plan: &Plan) -> Error {
    Error::Kernel { kernel: plan.kernel_name(), reason: "the plan or its data belongs to another backend".into() }
}

/// Milliseconds per execution on the host clock: each sample is `batch` executions enqueued back
/// to back from a synchronized device until the device is synchronized again, divided by
/// `batch` (a batch above 1 spreads the cost of one synchronization over several executions, as
/// an application that does not wait after every launch sees it).
pub(crate) fn host_time<B: Backend + ?Sized>(
    backend: &B,
    plan: &Plan,
    data: &mut ResidentData,
    warmup: usize,
    iters: usize,
    batch: usize,
) -> Result<Vec<f64>> {
    let batch = batch.max(1);
    for _ in 0..warmup {
        backend.execute(plan, data)?;
    }
    backend.synchronize()?;
    let mut out = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        for _ in 0..batch {
            backend.execute(plan, data)?;
        }
        backend.synchronize()?;
        out.push(t.elapsed().as_secs_f64() * 1e3 / batch as f64);
    }
    Ok(out)
}

/// Opens the backend for `device`; `Device::Auto` resolves to a CUDA GPU, else a gfx942/gfx950
/// HIP GPU, else a hardware wgpu adapter, else the CPU.
pub(crate) fn open(device: Device) -> Result<Box<dyn Backend>> {
    match device {
        Device::Cpu => Ok(Box::new(cpu::CpuBackend::new())),
        Device::Auto => {
            if cuda_device_count() > 0 {
                match open(Device::Cuda(0)) {
                    Ok(b) => return Ok(b),
                    Err(e) => log::warn!("auto: CUDA present but not usable ({e}); trying wgpu"),
                }
            }
            if hip_supported_device().is_some() {
                match open(Device::Hip(hip_supported_device().unwrap_or(0))) {
                    Ok(b) => return Ok(b),
                    Err(e) => log::warn!("auto: HIP device present but not usable ({e}); trying wgpu"),
                }
            }
            if let Some(adapter) = hardware_wgpu_adapter() {
                match open(Device::Wgpu(adapter)) {
                    Ok(b) => return Ok(b),
                    Err(e) => log::warn!("auto: wgpu adapter not usable ({e}); using the CPU"),
                }
            }
            Ok(Box::new(cpu::CpuBackend::new()))
        }
        Device::Wgpu(adapter) => open_wgpu(device, adapter, false),
        Device::WgpuSpirv(adapter) => open_wgpu(device, adapter, true),
        Device::Cuda(ordinal) => open_cuda(device, ordinal),
        Device::Hip(ordinal) => open_hip(device, ordinal),
    }
}

/// The first HIP device whose arch has kernels (gfx942, gfx950); `None` without ROCm.
#[cfg(feature = "hip")]
fn hip_supported_device() -> Option<usize> {
    hip::supported_devices().into_iter().next()
}

#[cfg(not(feature = "hip"))]
fn hip_supported_device() -> Option<usize> {
    None
}

#[cfg(feature = "hip")]
fn open_hip(device: Device, ordinal: usize) -> Result<Box<dyn Backend>> {
    Ok(Box::new(hip::HipBackend::open(device, ordinal)?))
}

#[cfg(not(feature = "hip"))]
fn open_hip(_device: Device, _ordinal: usize) -> Result<Box<dyn Backend>> {
    Err(Error::NotCompiledWith { feature: "hip", what: "HIP (AMD) devices" })
}

#[cfg(feature = "cuda")]
fn cuda_device_count() -> usize {
    if !quattn_native::device::driver_available() {
        return 0;
    }
    quattn_native::device::device_count().unwrap_or(0)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device_count() -> usize {
    0
}

#[cfg(feature = "cuda")]
fn open_cuda(device: Device, ordinal: usize) -> Result<Box<dyn Backend>> {
    let n = cuda_device_count();
    if ordinal >= n {
        return Err(Error::DeviceUnavailable {
            device,
            reason: if quattn_native::device::driver_available() {
                format!("{n} CUDA device(s) present")
            } else {
                "no CUDA driver (libcuda) on this machine".into()
            },
        });
    }
    let name = quattn_native::device::device_name(ordinal).unwrap_or_else(|e| format!("CUDA device {ordinal} ({e})"));
    Ok(Box::new(cuda::CudaBackend::open(device, ordinal, name)?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_device: Device, _ordinal: usize) -> Result<Box<dyn Backend>> {
    Err(Error::NotCompiledWith { feature: "cuda", what: "CUDA devices" })
}

/// An adapter wgpu sees: its class (with the index within the class), name and backend.
#[cfg(feature = "wgpu")]
#[derive(Clone)]
struct AdapterEntry {
    class: WgpuAdapter,
    name: String,
    backend: wgpu::Backend,
}

#[cfg(feature = "wgpu")]
fn wgpu_adapters() -> Vec<AdapterEntry> {
    // The primary backends only (Vulkan, Metal, DX12): the GL backend is not one CubeCL uses,
    // and probing EGL prints to stderr on headless machines.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::PRIMARY;
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    let mut counts = [0usize; 3];
    let mut out = Vec::new();
    for a in adapters {
        let info = a.get_info();
        let class = match info.device_type {
            wgpu::DeviceType::DiscreteGpu => WgpuAdapter::Discrete({ counts[0] += 1; counts[0] - 1 }),
            wgpu::DeviceType::IntegratedGpu => WgpuAdapter::Integrated({ counts[1] += 1; counts[1] - 1 }),
            wgpu::DeviceType::VirtualGpu => WgpuAdapter::Virtual({ counts[2] += 1; counts[2] - 1 }),
            wgpu::DeviceType::Cpu => WgpuAdapter::Software,
            wgpu::DeviceType::Other => continue,
        };
        out.push(AdapterEntry { class, name: format!("{} ({:?})", info.name, info.backend), backend: info.backend });
    }
    out
}

#[cfg(feature = "wgpu")]
fn hardware_wgpu_adapter() -> Option<WgpuAdapter> {
    wgpu_adapters().into_iter().map(|a| a.class).find(|c| *c != WgpuAdapter::Software)
}

#[cfg(not(feature = "wgpu"))]
fn hardware_wgpu_adapter() -> Option<WgpuAdapter> {
    None
}

/// Opens a wgpu adapter through CubeCL. `require_spirv` ([`Device::WgpuSpirv`]) turns every
/// way of not getting CubeCL's SPIR-V compiler into a typed error; otherwise the backend runs
/// whichever compiler this build gives the adapter and reports it in its kind.
#[cfg(feature = "wgpu")]
fn open_wgpu(device: Device, adapter: WgpuAdapter, require_spirv: bool) -> Result<Box<dyn Backend>> {
    use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
    if require_spirv && !cfg!(feature = "spirv") {
        return Err(Error::NotCompiledWith { feature: "spirv", what: "SPIR-V kernels on wgpu (Device::WgpuSpirv)" });
    }
    let adapters = wgpu_adapters();
    // Resolve `Default` to a concrete adapter so the reported name is the one that runs:
    // a discrete GPU first, then integrated, virtual, software.
    let order = |c: &WgpuAdapter| match c {
        WgpuAdapter::Discrete(_) => 0,
        WgpuAdapter::Integrated(_) => 1,
        WgpuAdapter::Virtual(_) => 2,
        _ => 3,
    };
    let chosen = match adapter {
        WgpuAdapter::Default => adapters.iter().min_by_key(|a| order(&a.class)).cloned(),
        want => adapters.iter().find(|a| a.class == want).cloned(),
    };
    let Some(AdapterEntry { class, name, backend }) = chosen else {
        let seen: Vec<&str> = adapters.iter().map(|a| a.name.as_str()).collect();
        return Err(Error::DeviceUnavailable { device, reason: format!("no such wgpu adapter; present: {seen:?}") });
    };
    if require_spirv && backend != wgpu::Backend::Vulkan {
        return Err(Error::DeviceUnavailable {
            device,
            reason: format!("{name} is not a Vulkan adapter; CubeCL's SPIR-V compiler runs on Vulkan only"),
        });
    }
    let wd = match class {
        WgpuAdapter::Discrete(i) => WgpuDevice::DiscreteGpu(i),
        WgpuAdapter::Integrated(i) => WgpuDevice::IntegratedGpu(i),
        WgpuAdapter::Virtual(i) => WgpuDevice::VirtualGpu(i),
        _ => WgpuDevice::Cpu,
    };
    let b = gpu::CubeclBackend::<WgpuRuntime>::open(Device::Wgpu(class), wd, "wgpu", name)?;
    if !gpu::runs_spirv(b.client()) {
        if require_spirv {
            return Err(Error::DeviceUnavailable {
                device,
                reason: format!(
                    "CubeCL drives {} with WGSL: its SPIR-V compiler needs the Vulkan driver's vulkanMemoryModel (device scope) and bufferDeviceAddress",
                    b.info().adapter
                ),
            });
        }
        return Ok(Box::new(b));
    }
    Ok(Box::new(b.relabel(Device::WgpuSpirv(class), "wgpu-spirv")))
}

#[cfg(not(feature = "wgpu"))]
fn open_wgpu(_device: Device, _adapter: WgpuAdapter, _require_spirv: bool) -> Result<Box<dyn Backend>> {
    Err(Error::NotCompiledWith { feature: "wgpu", what: "wgpu devices" })
}
