//! The CUDA device: native HMMA kernels where they support the problem, the portable CubeCL
//! kernel otherwise. Both share the device's primary context. Dispatch by architecture and
//! problem happens here and only here.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cubecl::cuda::CudaRuntime;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::{bf16, f16};
use quattn_native::{HmmaArgs, HmmaConfig, HmmaKernel, InputType, NativeError};

use super::gpu::CubeclBackend;
use super::{Backend, KernelChoice, ResidentData};
use crate::error::{Error, Result};
use crate::precision::{PvAccum, QkAccum};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, NativeKind, Precision, Strategy};

pub(crate) struct CudaBackend {
    portable: CubeclBackend<CudaRuntime>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Loaded native kernels by config; read lock on the hot path.
    kernels: RwLock<HashMap<HmmaConfig, Arc<HmmaKernel>>>,
}

struct NativeData {
    config: HmmaConfig,
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
    plan.kernel.starts_with("fwd_hmma")
}

impl CudaBackend {
    pub(crate) fn open(device: Device, ordinal: usize, name: String) -> Result<Self> {
        let unavailable = |e: NativeError| Error::DeviceUnavailable { device, reason: e.to_string() };
        let ctx = quattn_native::device::open_context(ordinal).map_err(unavailable)?;
        let (major, minor) = quattn_native::device::compute_capability(&ctx).map_err(unavailable)?;
        let name = format!("{name} (sm_{major}{minor})");
        let portable = CubeclBackend::<CudaRuntime>::open(device, cubecl::cuda::CudaDevice::new(ordinal), "cuda", name)?;
        let stream = ctx.default_stream();
        Ok(CudaBackend { portable, ctx, stream, kernels: RwLock::new(HashMap::new()) })
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
            Strategy::Native(_) => Err(Error::UnsupportedStrategy { strategy, device, reason: "this native kernel family is not implemented yet".into() }),
            Strategy::Auto => match hmma_config(problem, precision).and_then(|c| self.kernel(c).map(|_| c).map_err(|e| e.to_string())) {
                Ok(config) => Ok(KernelChoice { name: config.name(), reason: "native HMMA kernel supports the problem".into(), blocking: None }),
                Err(why) => {
                    let mut c = self.portable.select(problem, precision, Strategy::Portable)?;
                    c.reason = format!("portable CubeCL kernel: native HMMA does not take it ({why})");
                    Ok(c)
                }
            },
            _ => self.portable.select(problem, precision, strategy),
        }
    }

    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        if !is_native(plan) {
            return self.portable.upload(plan, q, k, v);
        }
        let config = hmma_config(&plan.problem, plan.precision).map_err(|reason| Error::Kernel { kernel: plan.kernel.clone(), reason })?;
        let p = &plan.problem;
        self.bind(&plan.kernel)?;
        let e = self.driver(&plan.kernel);
        let s = &self.stream;
        Ok(Box::new(NativeData {
            config,
            args: hmma_args(p),
            q: s.clone_htod(&bits(q, config.input)).map_err(&e)?,
            k: s.clone_htod(&bits(k, config.input)).map_err(&e)?,
            v: s.clone_htod(&bits(v, config.input)).map_err(&e)?,
            o: s.alloc_zeros::<u16>(p.o_len_elems()).map_err(&e)?,
            lse: s.alloc_zeros::<f32>(p.lse_len_elems()).map_err(&e)?,
        }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        if !is_native(plan) {
            return self.portable.execute(plan, data);
        }
        let d = self.native_data(plan, data)?;
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

    fn time(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        if !is_native(plan) {
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
