//! The CUDA device: native kernels where they support the problem (HMMA for f16/bf16; for INT8
//! Q/K the native prepass followed by the IMMA kernel, s8 wgmma on compute capability 9.0 or the
//! tcgen05 UMMA kernel on 10.0), the portable CubeCL kernel otherwise. All share the device's
//! primary context. Dispatch by architecture and problem happens here and only here.
//!
//! The native INT8 path keeps Q, K, V, O and the LSE in CubeCL buffers (uploaded and read back
//! by CubeCL, synchronized once after the upload and before the read-back) and runs the prepass
//! and the kernel back to back on the native stream: an execution enqueues and returns, with
//! no host wait between the prepass and the kernel.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cubecl::cuda::CudaRuntime;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::{bf16, f16};
use quattn_native::{
    HmmaArgs, HmmaConfig, HmmaKernel, InputType, Int8Args, Int8Config, Int8Kernel, Int8Prepass, Int8PrepassConfig,
    Int8Ptrs, Int8UmmaConfig, Int8UmmaKernel, Int8WgmmaConfig, Int8WgmmaKernel, NativeError, PrepassArgs, PrepassInput,
    PrepassLens, PrepassPtrs, WgmmaConfig, WgmmaKernel,
};

use super::gpu::{CubeclBackend, GpuData};
use super::{Backend, KernelChoice, ResidentData};
use crate::codec::int8::Int8Operands;
use crate::error::{Error, Result};
use crate::emulation::Blocking;
use crate::precision::{Int8Granularity, PvAccum, PvFormat, QkAccum};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, NativeKind, Precision, Strategy};

pub(crate) struct CudaBackend {
    portable: CubeclBackend<CudaRuntime>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Loaded native kernels by config; read lock on the hot path.
    kernels: RwLock<HashMap<HmmaConfig, Arc<HmmaKernel>>>,
    int8_kernels: RwLock<HashMap<Int8Native, Arc<Int8Loaded>>>,
    wgmma_kernels: RwLock<HashMap<WgmmaConfig, Arc<WgmmaKernel>>>,
    prepasses: RwLock<HashMap<Int8PrepassConfig, Arc<Int8Prepass>>>,
    /// Compute capability of the device.
    cc: (u32, u32),
}

/// Which native INT8 kernel, with its config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Int8Native {
    /// mma.sync IMMA (sm_80+).
    Imma(Int8Config),
    /// s8 wgmma (sm_90a).
    Wgmma(Int8WgmmaConfig),
    /// tcgen05 UMMA (compute capability 10.0 only; not run on hardware).
    Umma(Int8UmmaConfig),
}

enum Int8Loaded {
    Imma(Int8Kernel),
    Wgmma(Int8WgmmaKernel),
    Umma(Int8UmmaKernel),
}

impl Int8Native {
    fn name(&self) -> String {
        match self {
            Int8Native::Imma(c) => c.name(),
            Int8Native::Wgmma(c) => c.name(),
            Int8Native::Umma(c) => c.name(),
        }
    }
    /// `(block_q, block_k, warps)` the scales must be laid out for.
    fn blocking(&self) -> std::result::Result<Blocking, NativeError> {
        let (block_q, block_k, warps) = match self {
            Int8Native::Imma(c) => c.blocking()?,
            Int8Native::Wgmma(c) => c.blocking()?,
            Int8Native::Umma(c) => c.blocking()?,
        };
        Ok(Blocking { block_q, block_k, warps, ..Blocking::default() })
    }
}

/// An INT8 plan on a native kernel: the portable upload (f16 Q, K, V; O; LSE), a scratch LSE
/// when the caller did not ask for one (the kernels always write it), the prepass outputs in
/// native buffers, and everything an execution needs, resolved once at upload: the loaded
/// prepass and kernel, their arguments and every device address.
struct Int8NativeData {
    portable: ResidentData,
    /// Held only to keep the scratch LSE allocated while `kernel_ptrs` points at it.
    _lse_scratch: Option<cubecl::server::Handle>,
    /// The prepass outputs (`prepass_ptrs` and `kernel_ptrs` address them).
    outputs: Int8PrepassBuffers,
    prepass: Arc<Int8Prepass>,
    prepass_args: PrepassArgs,
    prepass_ptrs: PrepassPtrs,
    /// Element counts of the prepass buffers (for reading them back).
    prepass_lens: PrepassLens,
    kernel: Arc<Int8Loaded>,
    kernel_args: Int8Args,
    kernel_ptrs: Int8Ptrs,
    /// The stream the prepass and the kernel run on: dropping the data waits for it, so that
    /// CubeCL never reuses a buffer a native kernel may still touch.
    stream: Arc<CudaStream>,
}

/// Codes, scales, K mean, its f64 partial sums and the LSE shift (the last three only with
/// smoothing).
struct Int8PrepassBuffers {
    q_codes: CudaSlice<u8>,
    k_codes: CudaSlice<u8>,
    q_scale: CudaSlice<f32>,
    k_scale: CudaSlice<f32>,
    mean: Option<CudaSlice<f32>>,
    partial: Option<CudaSlice<f64>>,
    lse_shift: Option<CudaSlice<f32>>,
}

impl Drop for Int8NativeData {
    fn drop(&mut self) {
        if let Err(e) = self.stream.synchronize() {
            log::error!("waiting for the native INT8 stream before freeing its buffers: {e}");
        }
    }
}

struct NativeData {
    config: HmmaConfig,
    /// The wgmma kernel runs the plan (same arguments and buffers as HMMA's).
    wgmma: Option<WgmmaConfig>,
    args: HmmaArgs,
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    o: CudaSlice<u16>,
    lse: CudaSlice<f32>,
}

fn native_err(kernel: &str, e: NativeError) -> Error {
    Error::Kernel { kernel: kernel.into(), reason: e.to_string() }
}

/// The HMMA config for a problem, or why the native kernels do not take it.
fn hmma_config(problem: &AttentionProblem, precision: Precision) -> std::result::Result<HmmaConfig, String> {
    let (input, qk, pv) = match precision {
        Precision::F16 { qk, pv } => (InputType::F16, qk, pv),
        Precision::Bf16 { qk, pv } => (InputType::Bf16, qk, pv),
        _ => return Err(format!("HMMA kernels compute f16/bf16 inputs, not {precision}")),
    };
    if problem.v_head_dim != problem.head_dim {
        return Err(format!("HMMA kernels need v_head_dim == head_dim (got {} and {})", problem.v_head_dim, problem.head_dim));
    }
    let qk = match qk {
        QkAccum::F32 => quattn_native::QkAccum::F32,
        QkAccum::F16 => quattn_native::QkAccum::F16,
        QkAccum::TwoStage => quattn_native::QkAccum::TwoStage { chunk: quattn_native::hmma::DEFAULT_TWO_STAGE_CHUNK },
    };
    let pv = match pv {
        PvAccum::F32 => quattn_native::PvAccum::F32,
        PvAccum::F16PerTile => quattn_native::PvAccum::F16PerTile,
    };
    HmmaConfig::new(problem.head_dim, input, qk, pv).map_err(|e| e.to_string())
}

fn hmma_args(p: &AttentionProblem) -> HmmaArgs {
    let s = |x: crate::Strides| quattn_native::Strides { batch: x.batch as i64, head: x.head as i64, seq: x.seq as i64 };
    HmmaArgs {
        batch: p.batch,
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        q_len: p.q_len,
        kv_len: p.kv_len,
        q: s(p.q_strides()),
        k: s(p.k_strides()),
        v: s(p.v_strides()),
        o: s(p.o_strides()),
        scale: p.softmax_scale(),
        causal: p.causal,
    }
}

fn bits(x: HostSlice<'_>, input: InputType) -> Vec<u16> {
    let v = x.to_f32_vec();
    match input {
        InputType::F16 => v.into_iter().map(|a| f16::from_f32(a).to_bits()).collect(),
        InputType::Bf16 => v.into_iter().map(|a| bf16::from_f32(a).to_bits()).collect(),
    }
}

fn is_native(plan: &Plan) -> bool {
    plan.kernel.starts_with("fwd_hmma") || (plan.kernel.starts_with("fwd_wgmma") && !is_native_int8(plan))
}

/// The wgmma config for a problem on a device of compute capability `cc`, or why the wgmma
/// kernel does not take it (fp16 with f32 accumulation, head dim 64 or 128, sm_90a only).
fn wgmma_config(problem: &AttentionProblem, precision: Precision, cc: (u32, u32)) -> std::result::Result<WgmmaConfig, String> {
    if precision != Precision::F16_DEFAULT {
        return Err(format!("the wgmma kernel computes f16 with f32 accumulation, not {precision}"));
    }
    if WgmmaConfig::target_for(cc).is_none() {
        return Err(format!("the wgmma kernel needs compute capability 9.0 (sm_90a), this device is {}.{}", cc.0, cc.1));
    }
    if problem.v_head_dim != problem.head_dim {
        return Err(format!("the wgmma kernel needs v_head_dim == head_dim (got {} and {})", problem.v_head_dim, problem.head_dim));
    }
    WgmmaConfig::new(problem.head_dim).map_err(|e| e.to_string())
}

fn is_native_int8(plan: &Plan) -> bool {
    plan.kernel.starts_with("fwd_int8") || plan.kernel.starts_with("fwd_wgmma_int8")
}

/// Which native INT8 family a plan's kernel name belongs to.
fn int8_family_of(kernel: &str) -> NativeKind {
    if kernel.starts_with("fwd_int8_umma") {
        NativeKind::Int8Umma
    } else if kernel.starts_with("fwd_wgmma_int8") {
        NativeKind::Int8Wgmma
    } else {
        NativeKind::Int8Imma
    }
}

/// The native INT8 kernel for a problem on a device of compute capability `cc`, or why none
/// takes it: `family` forces one (`Int8Imma`, `Int8Wgmma`, `Int8Umma`); `None` picks UMMA on
/// 10.0, s8 wgmma on 9.0, IMMA elsewhere from sm_80.
fn int8_native(problem: &AttentionProblem, precision: Precision, cc: (u32, u32), family: Option<NativeKind>) -> std::result::Result<Int8Native, String> {
    let Precision::Int8Qk { granularity, pv, .. } = precision else {
        return Err(format!("the native INT8 kernels compute INT8 Q/K, not {precision}"));
    };
    if pv != PvFormat::F16 {
        return Err("the native INT8 kernels take f16 P·V only (FP8 P·V is emulated on sm_90 mma.sync)".into());
    }
    if problem.v_head_dim != problem.head_dim {
        return Err(format!("native INT8 kernels need v_head_dim == head_dim (got {} and {})", problem.v_head_dim, problem.head_dim));
    }
    let g = native_granularity(granularity);
    let family = family.unwrap_or(if Int8UmmaConfig::supported(cc) {
        NativeKind::Int8Umma
    } else if Int8WgmmaConfig::target_for(cc).is_some() {
        NativeKind::Int8Wgmma
    } else {
        NativeKind::Int8Imma
    });
    match family {
        NativeKind::Int8Umma => {
            if !Int8UmmaConfig::supported(cc) {
                return Err(format!("the tcgen05 UMMA kernel needs compute capability 10.0, this device is {}.{}", cc.0, cc.1));
            }
            Int8UmmaConfig::new(problem.head_dim, g, quattn_native::PvAccum::F32).map(Int8Native::Umma).map_err(|e| e.to_string())
        }
        NativeKind::Int8Wgmma => {
            if Int8WgmmaConfig::target_for(cc).is_none() {
                return Err(format!("the s8 wgmma kernel needs compute capability 9.0 (sm_90a), this device is {}.{}", cc.0, cc.1));
            }
            Int8WgmmaConfig::new(problem.head_dim, g).map(Int8Native::Wgmma).map_err(|e| e.to_string())
        }
        _ => {
            if Int8Config::target_for(cc).is_none() {
                return Err(format!("the IMMA kernel needs sm_80 or newer, this device is {}.{}", cc.0, cc.1));
            }
            Int8Config::new(problem.head_dim, g, quattn_native::PvAccum::F32).map(Int8Native::Imma).map_err(|e| e.to_string())
        }
    }
}

fn native_granularity(g: Int8Granularity) -> quattn_native::Int8Granularity {
    match g {
        Int8Granularity::PerBlock => quattn_native::Int8Granularity::PerBlock,
        Int8Granularity::PerWarp => quattn_native::Int8Granularity::PerWarp,
        Int8Granularity::PerThread => quattn_native::Int8Granularity::PerThread,
    }
}

fn native_strides(x: crate::Strides) -> quattn_native::Strides {
    quattn_native::Strides { batch: x.batch as i64, head: x.head as i64, seq: x.seq as i64 }
}

fn int8_args(p: &AttentionProblem, lse_shift: bool) -> Int8Args {
    Int8Args {
        batch: p.batch,
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        q_len: p.q_len,
        kv_len: p.kv_len,
        q: native_strides(p.q_strides()),
        k: native_strides(p.k_strides()),
        v: native_strides(p.v_strides()),
        o: native_strides(p.o_strides()),
        causal: p.causal,
        lse_shift,
    }
}

fn prepass_config(problem: &AttentionProblem, precision: Precision, blocking: &Blocking) -> std::result::Result<Int8PrepassConfig, NativeError> {
    let (granularity, smooth_k) = match precision {
        Precision::Int8Qk { granularity, smooth_k, .. } => (granularity, smooth_k),
        _ => return Err(NativeError::InvalidArgs(format!("an INT8 prepass for {precision}"))),
    };
    // The INT8 plans upload f16 Q, K and V (`gpu::Mode::Int8`).
    Int8PrepassConfig::new(
        problem.head_dim,
        PrepassInput::F16,
        (blocking.block_q, blocking.block_k, blocking.warps),
        native_granularity(granularity),
        smooth_k,
    )
}

fn prepass_args(p: &AttentionProblem) -> PrepassArgs {
    PrepassArgs {
        batch: p.batch,
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        q_len: p.q_len,
        kv_len: p.kv_len,
        q: native_strides(p.q_strides()),
        k: native_strides(p.k_strides()),
        softmax_scale: p.softmax_scale(),
    }
}

impl CudaBackend {
    pub(crate) fn open(device: Device, ordinal: usize, name: String) -> Result<Self> {
        let unavailable = |e: NativeError| Error::DeviceUnavailable { device, reason: e.to_string() };
        let ctx = quattn_native::device::open_context(ordinal).map_err(unavailable)?;
        let (major, minor) = quattn_native::device::compute_capability(&ctx).map_err(unavailable)?;
        let name = format!("{name} (sm_{major}{minor})");
        let portable = CubeclBackend::<CudaRuntime>::open(device, cubecl::cuda::CudaDevice::new(ordinal), "cuda", name)?;
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            portable,
            ctx,
            stream,
            kernels: RwLock::new(HashMap::new()),
            int8_kernels: RwLock::new(HashMap::new()),
            wgmma_kernels: RwLock::new(HashMap::new()),
            prepasses: RwLock::new(HashMap::new()),
            cc: (major, minor),
        })
    }

    fn wgmma_kernel(&self, config: WgmmaConfig) -> Result<Arc<WgmmaKernel>> {
        if let Some(k) = self.wgmma_kernels.read().ok().and_then(|m| m.get(&config).cloned()) {
            return Ok(k);
        }
        self.bind(&config.name())?;
        let k = Arc::new(WgmmaKernel::load(&self.ctx, config).map_err(|e| native_err(&config.name(), e))?);
        if let Ok(mut m) = self.wgmma_kernels.write() {
            m.insert(config, k.clone());
        }
        Ok(k)
    }

    /// Loads the wgmma kernel for the problem, or says why it does not take it.
    fn select_wgmma(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<WgmmaConfig, String> {
        let config = wgmma_config(problem, precision, self.cc)?;
        hmma_args(problem).validate(&hmma_config(problem, precision)?).map_err(|e| e.to_string())?;
        self.wgmma_kernel(config).map_err(|e| e.to_string())?;
        Ok(config)
    }

    fn int8_kernel(&self, which: Int8Native) -> Result<Arc<Int8Loaded>> {
        if let Some(k) = self.int8_kernels.read().ok().and_then(|m| m.get(&which).cloned()) {
            return Ok(k);
        }
        let name = which.name();
        self.bind(&name)?;
        let k = Arc::new(match which {
            Int8Native::Imma(c) => Int8Loaded::Imma(Int8Kernel::load(&self.ctx, c).map_err(|e| native_err(&name, e))?),
            Int8Native::Wgmma(c) => Int8Loaded::Wgmma(Int8WgmmaKernel::load(&self.ctx, c).map_err(|e| native_err(&name, e))?),
            Int8Native::Umma(c) => Int8Loaded::Umma(Int8UmmaKernel::load(&self.ctx, c).map_err(|e| native_err(&name, e))?),
        });
        if let Ok(mut m) = self.int8_kernels.write() {
            m.insert(which, k.clone());
        }
        Ok(k)
    }

    fn prepass(&self, config: Int8PrepassConfig) -> Result<Arc<Int8Prepass>> {
        if let Some(k) = self.prepasses.read().ok().and_then(|m| m.get(&config).cloned()) {
            return Ok(k);
        }
        self.bind("int8_prepass")?;
        let k = Arc::new(Int8Prepass::load(&self.ctx, config).map_err(|e| native_err("int8_prepass", e))?);
        if let Ok(mut m) = self.prepasses.write() {
            m.insert(config, k.clone());
        }
        Ok(k)
    }

    /// Plans an INT8 problem on a native kernel (loading it), with the blocking its scales need.
    fn select_int8(&self, problem: &AttentionProblem, precision: Precision, family: Option<NativeKind>) -> std::result::Result<KernelChoice, String> {
        let which = int8_native(problem, precision, self.cc, family)?;
        let blocking = which.blocking().map_err(|e| e.to_string())?;
        blocking.validate(problem, precision).map_err(|e| e.to_string())?;
        let prepass = prepass_config(problem, precision, &blocking).map_err(|e| e.to_string())?;
        prepass_args(problem).validate(&prepass).map_err(|e| e.to_string())?;
        self.prepass(prepass).map_err(|e| e.to_string())?;
        self.int8_kernel(which).map_err(|e| e.to_string())?;
        let kind = match which {
            Int8Native::Umma(_) => "tcgen05 UMMA (not run on hardware)",
            Int8Native::Wgmma(_) => "s8 wgmma",
            Int8Native::Imma(_) => "mma.sync IMMA",
        };
        Ok(KernelChoice {
            name: which.name(),
            reason: format!("native INT8 prepass + native {kind} kernel"),
            blocking: Some(blocking),
        })
    }

    /// Enqueues the INT8 prepass and the native kernel on the native stream. With `timed`,
    /// events bracket the kernel alone and the call waits for them, returning the kernel's
    /// milliseconds; otherwise it returns once both are enqueued.
    fn execute_int8(&self, plan: &Plan, data: &mut ResidentData, timed: bool) -> Result<Option<f64>> {
        let nd = data
            .downcast_ref::<Int8NativeData>()
            .ok_or_else(|| Error::Kernel { kernel: plan.kernel.clone(), reason: "resident data belongs to another kernel".into() })?;
        self.bind(&plan.kernel)?;
        let e = self.driver(&plan.kernel);
        let s = &self.stream;
        // SAFETY: Q and K are the plan's live CubeCL buffers (uploaded and synchronized at
        // upload), the outputs were allocated at upload for this problem and config
        // (`PrepassArgs::required_lens`); everything stays alive until the stream is idle
        // (`Int8NativeData`'s drop waits for it).
        unsafe { nd.prepass.launch_raw(s, &nd.prepass_args, &nd.prepass_ptrs) }.map_err(|err| native_err("int8_prepass", err))?;
        let events = if timed {
            let f = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            Some((self.ctx.new_event(f).map_err(&e)?, self.ctx.new_event(f).map_err(&e)?))
        } else {
            None
        };
        if let Some((start, _)) = &events {
            start.record(s).map_err(&e)?;
        }
        let (args, ptrs) = (&nd.kernel_args, &nd.kernel_ptrs);
        // SAFETY: as above; V, O and the LSE are the plan's CubeCL buffers, sized by the upload
        // for this problem; the launchers check arguments, alignment and non-null pointers.
        let launched = match &*nd.kernel {
            Int8Loaded::Imma(k) => unsafe { k.launch_raw(s, args, ptrs) },
            Int8Loaded::Wgmma(k) => unsafe { k.launch_raw(s, args, ptrs) },
            Int8Loaded::Umma(k) => {
                let p = [ptrs.q, ptrs.k, ptrs.v, ptrs.o, ptrs.lse, ptrs.q_scale, ptrs.k_scale, ptrs.lse_shift];
                unsafe { k.launch_raw(s, args, p) }
            }
        };
        launched.map_err(|err| native_err(&plan.kernel, err))?;
        match &events {
            Some((start, end)) => {
                end.record(s).map_err(&e)?;
                end.synchronize().map_err(&e)?;
                Ok(Some(start.elapsed_ms(end).map_err(&e)? as f64))
            }
            None => Ok(None),
        }
    }

    fn kernel(&self, config: HmmaConfig) -> Result<Arc<HmmaKernel>> {
        if let Some(k) = self.kernels.read().ok().and_then(|m| m.get(&config).cloned()) {
            return Ok(k);
        }
        self.bind(&config.name())?;
        let k = Arc::new(HmmaKernel::load(&self.ctx, config).map_err(|e| native_err(&config.name(), e))?);
        if let Ok(mut m) = self.kernels.write() {
            m.insert(config, k.clone());
        }
        Ok(k)
    }

    /// CubeCL's CUDA runtime keeps its own context current on the thread; the native kernels,
    /// their buffers and events live in the primary context, so every native call binds it first
    /// (a launch or event in the wrong context fails with CUDA_ERROR_INVALID_HANDLE).
    fn bind(&self, kernel: &str) -> Result<()> {
        self.ctx.bind_to_thread().map_err(self.driver(kernel))
    }

    fn native_data<'a>(&self, plan: &Plan, data: &'a mut ResidentData) -> Result<&'a mut NativeData> {
        data.downcast_mut::<NativeData>()
            .ok_or_else(|| Error::Kernel { kernel: plan.kernel.clone(), reason: "resident data belongs to another kernel".into() })
    }

    fn driver(&self, kernel: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
        let kernel = kernel.to_string();
        move |e| Error::Kernel { kernel: kernel.clone(), reason: e.to_string() }
    }
}

impl Backend for CudaBackend {
    fn time_kernel(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Option<Vec<f64>>> {
        if !is_native_int8(plan) {
            return Ok(None);
        }
        for _ in 0..warmup {
            self.execute_int8(plan, data, false)?;
        }
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            out.push(self.execute_int8(plan, data, true)?.unwrap_or(f64::NAN));
        }
        Ok(Some(out))
    }

    fn info(&self) -> DeviceInfo {
        self.portable.info()
    }

    fn select(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<KernelChoice> {
        let device = format!("cuda ({})", self.info().adapter);
        match strategy {
            Strategy::Native(NativeKind::Hmma) => {
                let config = hmma_config(problem, precision)
                    .map_err(|reason| Error::UnsupportedStrategy { strategy, device: device.clone(), reason })?;
                self.kernel(config)?;
                Ok(KernelChoice { name: config.name(), reason: "forced native HMMA".into(), blocking: None })
            }
            Strategy::Native(kind @ (NativeKind::Int8Imma | NativeKind::Int8Wgmma | NativeKind::Int8Umma)) => self
                .select_int8(problem, precision, Some(kind))
                .map(|mut c| {
                    c.reason = format!("forced: {}", c.reason);
                    c
                })
                .map_err(|reason| Error::UnsupportedStrategy { strategy, device: device.clone(), reason }),
            Strategy::Native(NativeKind::Wgmma) => {
                let config = self
                    .select_wgmma(problem, precision)
                    .map_err(|reason| Error::UnsupportedStrategy { strategy, device: device.clone(), reason })?;
                Ok(KernelChoice { name: config.name(), reason: "forced native wgmma".into(), blocking: None })
            }
            Strategy::Native(_) => Err(Error::UnsupportedStrategy { strategy, device, reason: "this native kernel family is not implemented yet".into() }),
            Strategy::Auto if matches!(precision, Precision::Int8Qk { .. }) => match self.select_int8(problem, precision, None) {
                Ok(c) => Ok(c),
                Err(why) => {
                    let mut c = self.portable.select(problem, precision, Strategy::Portable)?;
                    c.reason = format!("{}: no native INT8 kernel takes it ({why})", c.reason);
                    Ok(c)
                }
            },
            Strategy::Auto => {
                let wgmma = match self.select_wgmma(problem, precision) {
                    Ok(config) => {
                        return Ok(KernelChoice { name: config.name(), reason: "native wgmma kernel supports the problem".into(), blocking: None })
                    }
                    Err(why) => why,
                };
                match hmma_config(problem, precision).and_then(|c| self.kernel(c).map(|_| c).map_err(|e| e.to_string())) {
                    Ok(config) => Ok(KernelChoice {
                        name: config.name(),
                        reason: format!("native HMMA kernel supports the problem (not wgmma: {wgmma})"),
                        blocking: None,
                    }),
                    Err(why) => {
                        let mut c = self.portable.select(problem, precision, Strategy::Portable)?;
                        c.reason = format!("portable CubeCL kernel: native HMMA does not take it ({why}); nor wgmma ({wgmma})");
                        Ok(c)
                    }
                }
            }
            _ => self.portable.select(problem, precision, strategy),
        }
    }

    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        if is_native_int8(plan) {
            // f16 Q, K, V, O and the LSE as the portable INT8 path has them (the prepass reads
            // Q and K there, the kernel reads V and writes O and the LSE), and the prepass
            // outputs on the native stream.
            let portable = self.portable.upload(plan, q, k, v)?;
            let lse_scratch = (!plan.problem.return_lse).then(|| self.portable.empty(plan.problem.lse_len_elems() * 4));
            let d: &GpuData = self.portable.data(plan, &portable)?;
            let lse = d.lse.as_ref().or(lse_scratch.as_ref()).ok_or_else(|| Error::Kernel { kernel: plan.kernel.clone(), reason: "no LSE buffer".into() })?;
            // Each lookup is a blocking round trip to CubeCL's device thread: once, here.
            let ptr = |h: &cubecl::server::Handle| self.portable.device_ptr(h);
            let (q_in, k_in, v, o, lse) = (ptr(&d.q)?, ptr(&d.k)?, ptr(&d.v)?, ptr(&d.o)?, ptr(lse)?);
            // The native stream reads what CubeCL's stream uploaded.
            self.portable.synchronize()?;
            let kernel_err = |reason: String| Error::Kernel { kernel: plan.kernel.clone(), reason };
            let which = int8_native(&plan.problem, plan.precision, self.cc, Some(int8_family_of(&plan.kernel))).map_err(kernel_err)?;
            let kernel = self.int8_kernel(which)?;
            let blocking = plan.blocking.ok_or_else(|| kernel_err("an INT8 plan without its blocking".into()))?;
            let prepass = self.prepass(prepass_config(&plan.problem, plan.precision, &blocking).map_err(|e| native_err("int8_prepass", e))?)?;
            let prepass_args = prepass_args(&plan.problem);
            let lens = prepass_args.required_lens(prepass.config()).map_err(|e| native_err("int8_prepass", e))?;
            self.bind(&plan.kernel)?;
            let e = self.driver(&plan.kernel);
            let s = &self.stream;
            // SAFETY (alloc): every buffer is written by the prepass before anything reads it.
            let opt = |n: usize| if n == 0 { Ok(None) } else { unsafe { s.alloc::<f32>(n) }.map(Some) };
            let mut outputs = Int8PrepassBuffers {
                q_codes: unsafe { s.alloc::<u8>(lens.q_codes.max(16)) }.map_err(&e)?,
                k_codes: unsafe { s.alloc::<u8>(lens.k_codes.max(16)) }.map_err(&e)?,
                q_scale: unsafe { s.alloc::<f32>(lens.q_scale.max(4)) }.map_err(&e)?,
                k_scale: unsafe { s.alloc::<f32>(lens.k_scale.max(4)) }.map_err(&e)?,
                mean: opt(lens.mean).map_err(&e)?,
                partial: if lens.partial == 0 { None } else { Some(unsafe { s.alloc::<f64>(lens.partial) }.map_err(&e)?) },
                lse_shift: opt(lens.lse_shift).map_err(&e)?,
            };
            // Addresses of allocations that never move; the guards only record stream use and
            // every buffer here lives on this stream.
            use cudarc::driver::DevicePtrMut;
            let b = &mut outputs;
            let (q_codes, k_codes) = (b.q_codes.device_ptr_mut(s).0, b.k_codes.device_ptr_mut(s).0);
            let mut addr = |x: &mut CudaSlice<f32>| x.device_ptr_mut(s).0;
            let (q_scale, k_scale) = (addr(&mut b.q_scale), addr(&mut b.k_scale));
            let mean = b.mean.as_mut().map(&mut addr).unwrap_or(0);
            let lse_shift = b.lse_shift.as_mut().map(&mut addr).unwrap_or(0);
            let partial = b.partial.as_mut().map(|x| x.device_ptr_mut(s).0).unwrap_or(0);
            return Ok(Box::new(Int8NativeData {
                portable,
                _lse_scratch: lse_scratch,
                outputs,
                prepass,
                prepass_args,
                prepass_ptrs: PrepassPtrs { q: q_in, k: k_in, q_codes, k_codes, q_scale, k_scale, mean, partial, lse_shift },
                prepass_lens: lens,
                kernel,
                kernel_args: int8_args(&plan.problem, lse_shift != 0),
                kernel_ptrs: Int8Ptrs { q: q_codes, k: k_codes, v, o, lse, q_scale, k_scale, lse_shift },
                stream: s.clone(),
            }));
        }
        if !is_native(plan) {
            return self.portable.upload(plan, q, k, v);
        }
        let config = hmma_config(&plan.problem, plan.precision).map_err(|reason| Error::Kernel { kernel: plan.kernel.clone(), reason })?;
        let p = &plan.problem;
        self.bind(&plan.kernel)?;
        let e = self.driver(&plan.kernel);
        let s = &self.stream;
        let wgmma = if plan.kernel.starts_with("fwd_wgmma") {
            Some(wgmma_config(p, plan.precision, self.cc).map_err(|reason| Error::Kernel { kernel: plan.kernel.clone(), reason })?)
        } else {
            None
        };
        Ok(Box::new(NativeData {
            config,
            wgmma,
            args: hmma_args(p),
            q: s.clone_htod(&bits(q, config.input)).map_err(&e)?,
            k: s.clone_htod(&bits(k, config.input)).map_err(&e)?,
            v: s.clone_htod(&bits(v, config.input)).map_err(&e)?,
            o: s.alloc_zeros::<u16>(p.o_len_elems()).map_err(&e)?,
            lse: s.alloc_zeros::<f32>(p.lse_len_elems()).map_err(&e)?,
        }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        if is_native_int8(plan) {
            return self.execute_int8(plan, data, false).map(|_| ());
        }
        if !is_native(plan) {
            return self.portable.execute(plan, data);
        }
        let d = self.native_data(plan, data)?;
        if let Some(w) = d.wgmma {
            let kernel = self.wgmma_kernel(w)?;
            self.bind(&plan.kernel)?;
            return kernel.launch(&self.stream, &d.args, &d.q, &d.k, &d.v, &mut d.o, &mut d.lse).map_err(|e| native_err(&plan.kernel, e));
        }
        let kernel = self.kernel(d.config)?;
        self.bind(&plan.kernel)?;
        kernel.launch(&self.stream, &d.args, &d.q, &d.k, &d.v, &mut d.o, &mut d.lse).map_err(|e| native_err(&plan.kernel, e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind("synchronize")?;
        self.stream.synchronize().map_err(self.driver("synchronize"))?;
        self.portable.synchronize()
    }

    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        if is_native_int8(plan) {
            let nd = data
                .downcast_ref::<Int8NativeData>()
                .ok_or_else(|| Error::Kernel { kernel: plan.kernel.clone(), reason: "resident data belongs to another kernel".into() })?;
            // CubeCL reads O and the LSE on its stream: the native one must be done with them.
            self.stream.synchronize().map_err(self.driver(&plan.kernel))?;
            return self.portable.download(plan, &nd.portable);
        }
        if !is_native(plan) {
            return self.portable.download(plan, data);
        }
        let d = data
            .downcast_ref::<NativeData>()
            .ok_or_else(|| Error::Kernel { kernel: plan.kernel.clone(), reason: "resident data belongs to another kernel".into() })?;
        self.bind(&plan.kernel)?;
        let e = self.driver(&plan.kernel);
        let o = self.stream.clone_dtoh(&d.o).map_err(&e)?;
        let o = match d.config.input {
            InputType::F16 => o.into_iter().map(|b| f16::from_bits(b).to_f32()).collect(),
            InputType::Bf16 => o.into_iter().map(|b| bf16::from_bits(b).to_f32()).collect(),
        };
        let lse = if plan.problem.return_lse { Some(self.stream.clone_dtoh(&d.lse).map_err(&e)?) } else { None };
        Ok((o, lse))
    }

    fn int8_operands(&self, plan: &Plan, data: &ResidentData) -> Result<Option<Int8Operands>> {
        let Some(nd) = data.downcast_ref::<Int8NativeData>() else {
            return Ok(None);
        };
        self.bind(&plan.kernel)?;
        let e = self.driver(&plan.kernel);
        let s = &self.stream;
        s.synchronize().map_err(&e)?;
        let (b, lens) = (&nd.outputs, &nd.prepass_lens);
        let codes = |x: &CudaSlice<u8>, n: usize| -> Result<Vec<i8>> { Ok(s.clone_dtoh(x).map_err(&e)?[..n].iter().map(|&c| c as i8).collect()) };
        let floats = |x: &CudaSlice<f32>, n: usize| -> Result<Vec<f32>> { Ok(s.clone_dtoh(x).map_err(&e)?[..n].to_vec()) };
        Ok(Some(Int8Operands {
            q_codes: codes(&b.q_codes, lens.q_codes)?,
            q_scales: floats(&b.q_scale, lens.q_scale)?,
            k_codes: codes(&b.k_codes, lens.k_codes)?,
            k_scales: floats(&b.k_scale, lens.k_scale)?,
            k_mean: b.mean.as_ref().map(|m| floats(m, lens.mean)).transpose()?,
            lse_shift: b.lse_shift.as_ref().map(|m| floats(m, lens.lse_shift)).transpose()?,
        }))
    }

    fn time(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        // End to end on the device clock: for INT8, the prepass and the kernel.
        if !is_native(plan) && !is_native_int8(plan) {
            return self.portable.time(plan, data, warmup, iters);
        }
        for _ in 0..warmup {
            self.execute(plan, data)?;
        }
        self.bind(&plan.kernel)?;
        let e = self.driver(&plan.kernel);
        // cudarc's default event flags disable timing; elapsed time needs CU_EVENT_DEFAULT.
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(timed).map_err(&e)?;
        let end = self.ctx.new_event(timed).map_err(&e)?;
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            start.record(&self.stream).map_err(&e)?;
            self.execute(plan, data)?;
            end.record(&self.stream).map_err(&e)?;
            end.synchronize().map_err(&e)?;
            out.push(start.elapsed_ms(&end).map_err(&e)? as f64);
        }
        Ok(out)
    }
}
