//! The HIP backend (AMD GPUs through ROCm, loaded at run time): the native MFMA kernels of
//! `quattn_native::hip` on gfx942 and gfx950, compiled by hipRTC into the code-object cache and
//! launched on the null stream; FP8 plans quantize their f16 inputs on the device (the
//! prepass `fp8_prepass.hip`). **Not run on hardware**: no AMD device was available; the
//! kernels are compiled and disassembly-checked, their tile loop is mirrored on the CPU, and
//! this backend's paths without ROCm (no library, no device, an arch without kernels) are
//! tested. The dispatch table has only the native rows: a HIP device takes f16/bf16 with f32
//! accumulation and FP8 e4m3 (per tensor or head), head dims 64 and 128.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use half::{bf16, f16};
use quattn_native::hip::runtime::{DeviceBuffer, HipModule, HipRuntime, Hiprtc};
use quattn_native::fp8_prepass::{Fp8PrepassPass, Fp8PrepassPtrs};
use quattn_native::hip::{Fp8Mfma, GfxArch, HipCache, HipFp8P, HipFwdParams, HipKernelId, HipPrepassId, HipVariant, MfmaConfig, MfmaFp8Config, HIP_HEAD_DIMS, HIP_PREPASS_THREADS};
use quattn_native::{Fp8Args, NativeError};

use super::{Backend, ResidentData};
use crate::error::{Error, Result};
use crate::precision::{DescaleGranularity, Dtype, Fp8Format, PvAccum, PvFormat, QkAccum};
use crate::registry::{self, Choice, Family, KernelId, Planned, Reject, Row};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, NativeKind, Precision, Strategy};

/// HIP ordinals whose arch has kernels; empty without ROCm.
pub(crate) fn supported_devices() -> Vec<usize> {
    let Ok(rt) = HipRuntime::get() else { return Vec::new() };
    (0..rt.device_count().unwrap_or(0))
        .filter(|&i| rt.arch_name(i).ok().and_then(|a| GfxArch::parse(&a)).is_some())
        .collect()
}

pub(crate) struct HipBackend {
    device: Device,
    ordinal: usize,
    arch: GfxArch,
    adapter: String,
    rt: &'static HipRuntime,
    /// Loaded modules by variant name (attention kernels and the prepass).
    modules: RwLock<HashMap<String, Arc<HipModule>>>,
}

impl HipBackend {
    /// Opens HIP device `ordinal`: [`Error::DeviceUnavailable`] without ROCm, past the device
    /// count, or on an arch without kernels.
    pub(crate) fn open(device: Device, ordinal: usize) -> Result<Self> {
        let unavailable = |reason: String| Error::DeviceUnavailable { device, reason };
        let rt = HipRuntime::get().map_err(|e| unavailable(e.to_string()))?;
        let n = rt.device_count().map_err(|e| unavailable(e.to_string()))?;
        if ordinal >= n {
            return Err(unavailable(format!("{n} HIP device(s) present")));
        }
        let arch_name = rt.arch_name(ordinal).map_err(|e| unavailable(e.to_string()))?;
        let arch = GfxArch::parse(&arch_name).ok_or_else(|| {
            unavailable(format!("{arch_name}: quattn's HIP kernels are built for {:?}", GfxArch::ALL.map(|a| a.as_str())))
        })?;
        let name = rt.device_name(ordinal).unwrap_or_else(|_| format!("HIP device {ordinal}"));
        log::info!("hip:{ordinal}: {name} ({arch_name}); its kernels have not been run on hardware by quattn's tests");
        Ok(HipBackend { device, ordinal, arch, adapter: format!("{name} ({arch_name})"), rt, modules: RwLock::new(HashMap::new()) })
    }

    fn module(&self, id: &dyn HipVariant) -> Result<Arc<HipModule>> {
        if let Some(m) = self.modules.read().ok().and_then(|m| m.get(&id.name()).cloned()) {
            return Ok(m);
        }
        let err = |e: NativeError| Error::Kernel { kernel: id.name(), reason: e.to_string() };
        let rtc = Hiprtc::get().map_err(err)?;
        let obj = HipCache::global().get_or_compile(id, self.arch, rtc.as_ref()).map_err(err)?;
        let m = Arc::new(self.rt.load_module(self.ordinal, &obj.code, obj.entry).map_err(err)?);
        let mut map = self.modules.write().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(id.name()).or_insert(m).clone())
    }

    /// The amax and quantize passes of the prepass for `input`, loaded.
    fn prepass_modules(&self, plan: &Plan, input: Dtype) -> Result<[Arc<HipModule>; 2]> {
        let id = |pass| HipPrepassId::new(input, pass).map_err(|e| self.kernel_error(plan, e));
        Ok([self.module(&id(Fp8PrepassPass::Amax)?)?, self.module(&id(Fp8PrepassPass::Quantize)?)?])
    }

    /// Q, K and V at device addresses `qkv` (16-bit, `input`) quantized on the device by the
    /// prepass (`fp8_prepass.hip`) into new buffers of the arch's e4m3 codes and f32 descales,
    /// enqueued on the null stream. Both passes are loaded before anything is allocated, so a
    /// missing hipRTC allocates nothing. The caller synchronizes before the inputs or the
    /// returned buffers (scratch included) are freed.
    fn prepass(&self, plan: &Plan, input: Dtype, descale: DescaleGranularity, qkv: [u64; 3]) -> Result<Quantized> {
        let err = |e: NativeError| self.kernel_error(plan, e);
        let [amax, quant] = self.prepass_modules(plan, input)?;
        let args = Fp8Args::new(plan.problem.shape(), descale);
        let lens = HipPrepassId::required_lens(input, &args).map_err(err)?;
        let alloc = |bytes: usize| self.rt.alloc(self.ordinal, bytes).map_err(err);
        let codes = [alloc(lens.q)?, alloc(lens.k)?, alloc(lens.v)?];
        let descales = [alloc(lens.q_descale * 4)?, alloc(lens.kv_descale * 4)?, alloc(lens.kv_descale * 4)?];
        let scratch = [alloc(lens.partial * 4)?, alloc(lens.counter * 4)?];
        scratch[1].zero().map_err(err)?;
        let ptrs = Fp8PrepassPtrs {
            q: qkv[0],
            k: qkv[1],
            v: qkv[2],
            q_codes: codes[0].device_ptr(),
            k_codes: codes[1].device_ptr(),
            v_codes: codes[2].device_ptr(),
            q_descale: descales[0].device_ptr(),
            k_descale: descales[1].device_ptr(),
            v_descale: descales[2].device_ptr(),
            partial: scratch[0].device_ptr(),
            counter: scratch[1].device_ptr(),
        };
        // One slab: the runtime does not report the L2 size the CUDA path sizes slabs by.
        for (params, grid) in HipPrepassId::launches(input, &args, &ptrs, None).map_err(err)? {
            for m in [&amax, &quant] {
                // SAFETY: the params are the kernel's Fp8PrepassParams; the outputs were sized by
                // required_lens for these args, the inputs by the caller to the problem's
                // extents, and launches() validated args and pointers.
                if let Err(e) = unsafe { m.launch((grid, 1, 1), (HIP_PREPASS_THREADS, 1, 1), &params) } {
                    // Earlier passes may still run on the buffers freed on return.
                    if let Err(s) = self.rt.synchronize(self.ordinal) {
                        log::warn!("synchronize after a failed prepass launch: {s}");
                    }
                    return Err(err(e));
                }
            }
        }
        Ok(Quantized { codes, descales, _scratch: scratch })
    }

    /// Enqueues the attention kernel of `plan` on device addresses `[q, k, v, o, lse]` (lse 0:
    /// not written) and, FP8, the Q, K, V descales.
    fn launch_fwd(&self, plan: &Plan, ptrs: [u64; 5], descales: Option<[u64; 3]>) -> Result<()> {
        let id = plan_kernel(plan)?;
        let s = plan.problem.shape();
        let descale = match plan.precision {
            Precision::Fp8 { descale, .. } => Some(descale),
            _ => None,
        };
        id.validate_args(&s, descale).map_err(|e| self.kernel_error(plan, e))?;
        let module = self.module(&id)?;
        let params = HipFwdParams::new(&s, ptrs, descales.zip(descale));
        let (grid, block) = id.launch_dims(&s, self.arch);
        // SAFETY: the params are the kernel's FwdParams; every buffer spans the problem's
        // extents (sized at upload, or checked by Session::run_hip), and validate_args checked
        // the shape against them.
        unsafe { module.launch(grid, block, &params) }.map_err(|e| self.kernel_error(plan, e))
    }

    /// One call on caller-owned device memory ([`crate::Session::run_hip`]): FP8 plans quantize
    /// Q, K and V with the prepass into call-owned buffers first. Returns after the device has
    /// finished (the call's buffers are freed on return).
    pub(crate) fn run_raw(&self, plan: &Plan, call: &HipCall) -> Result<()> {
        let id = plan_kernel(plan)?;
        let bad = |reason: String| Err(Error::Kernel { kernel: plan.kernel_name(), reason });
        // 16-byte row loads of Q, K, V; O stored 4 16-bit elements at a time.
        for (name, ptr, align) in [("q", call.q, 16), ("k", call.k, 16), ("v", call.v, 16), ("o", call.o, 8), ("lse", call.lse, 4)] {
            if (ptr == 0 && name != "lse") || ptr % align != 0 {
                return bad(format!("{name} address {ptr:#x} is null or not {align}-byte aligned"));
            }
        }
        // The attention kernel's arguments before the prepass runs for it.
        let descale = match plan.precision {
            Precision::Fp8 { descale, .. } => Some(descale),
            _ => None,
        };
        id.validate_args(&plan.problem.shape(), descale).map_err(|e| self.kernel_error(plan, e))?;
        match (id, plan.precision) {
            (HipKernelId::Mfma(_), _) => {
                self.launch_fwd(plan, [call.q, call.k, call.v, call.o, call.lse], None)?;
                self.synchronize()
            }
            (HipKernelId::MfmaFp8(_), Precision::Fp8 { descale, .. }) => {
                let x = self.prepass(plan, plan.dtype(), descale, [call.q, call.k, call.v])?;
                let c = x.codes.each_ref().map(|b| b.device_ptr());
                let launched = self.launch_fwd(plan, [c[0], c[1], c[2], call.o, call.lse], Some(x.descales.each_ref().map(|b| b.device_ptr())));
                // The prepass's buffers are freed on return: whatever was enqueued must finish.
                let synced = self.synchronize();
                launched.and(synced)
            }
            _ => Err(super::foreign(plan)),
        }
    }

    fn kernel_error(&self, plan: &Plan, e: NativeError) -> Error {
        Error::Kernel { kernel: plan.kernel_name(), reason: e.to_string() }
    }
}

/// The HIP table: f16/bf16 MFMA, then FP8 MFMA.
static TABLE: [Row<HipBackend>; 2] = [
    Row { family: Family::Native(NativeKind::HipMfma), test: mfma_row },
    Row { family: Family::Native(NativeKind::HipMfmaFp8), test: mfma_fp8_row },
];

fn refuse(kind: NativeKind, b: &HipBackend, reason: String) -> Reject {
    Reject::Refused(Error::UnsupportedStrategy { strategy: Strategy::Native(kind), device: b.device.to_string(), reason })
}

fn check_shape(kind: NativeKind, b: &HipBackend, p: &AttentionProblem, id: HipKernelId, descale: Option<DescaleGranularity>) -> std::result::Result<(), Reject> {
    if !HIP_HEAD_DIMS.contains(&p.head_dim) {
        return Err(Reject::Refused(Error::UnsupportedHeadDim {
            head_dim: p.head_dim,
            path: format!("native {}", kind.name()),
            supported: HIP_HEAD_DIMS.to_vec(),
        }));
    }
    if p.v_head_dim != p.head_dim {
        return Err(Reject::Refused(Error::UnsupportedVHeadDim { head_dim: p.head_dim, v_head_dim: p.v_head_dim, path: format!("native {}", kind.name()) }));
    }
    id.validate_args(&p.shape(), descale).map_err(|e| refuse(kind, b, e.to_string()))
}

fn mfma_row(b: &HipBackend, p: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
    let input = match precision {
        Precision::F16 { qk: QkAccum::F32, pv: PvAccum::F32 } => Dtype::F16,
        Precision::Bf16 { qk: QkAccum::F32, pv: PvAccum::F32 } => Dtype::Bf16,
        Precision::Nvfp4 { .. } | Precision::Mxfp4 { .. } => {
            return Err(Reject::Refused(Error::UnsupportedPrecision {
                precision,
                device: b.device.to_string(),
                reason: "no HIP 4-bit kernel: the MFMA kernels take f16, bf16 and FP8; the CPU 4-bit kernel and the \
                         CPU emulation (Strategy::Reference) run the NVFP4 and MXFP4 modes"
                    .into(),
            }))
        }
        _ => return registry::not_applicable(format!("{precision}: the MFMA kernel computes f16/bf16 with f32 accumulation")),
    };
    let id = HipKernelId::Mfma(MfmaConfig { head_dim: p.head_dim as u32, input });
    check_shape(NativeKind::HipMfma, b, p, id, None)?;
    Ok(Choice { kernel: KernelId::Hip { kernel: id, arch: b.arch }, blocking: None })
}

fn mfma_fp8_row(b: &HipBackend, p: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
    let Precision::Fp8 { format, descale, p: pv } = precision else {
        return registry::not_applicable(format!("{precision} is not an FP8 mode"));
    };
    if format != Fp8Format::E4M3 {
        return Err(refuse(NativeKind::HipMfmaFp8, b, "the MFMA FP8 kernel reads e4m3 codes".into()));
    }
    let p_fmt = match pv {
        PvFormat::F16 => HipFp8P::F16,
        PvFormat::Fp8 => HipFp8P::Fp8,
    };
    // gfx950: the f8f6f4 32x32x64 form (half the matrix-core time of 32x32x16_fp8_fp8).
    let mfma = if b.arch == GfxArch::Gfx950 { Fp8Mfma::X64 } else { Fp8Mfma::X16 };
    let id = HipKernelId::MfmaFp8(MfmaFp8Config { head_dim: p.head_dim as u32, p: p_fmt, out: Dtype::F16, mfma });
    check_shape(NativeKind::HipMfmaFp8, b, p, id, Some(descale))?;
    Ok(Choice { kernel: KernelId::Hip { kernel: id, arch: b.arch }, blocking: None })
}

/// Caller-owned device addresses of one [`crate::Session::run_hip`] call (lse 0: none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HipCall {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
}

/// What the prepass wrote: codes and descales of Q, K, V, and its scratch (partial maxima,
/// arrival counters), kept alive until the device has finished with them.
struct Quantized {
    codes: [DeviceBuffer; 3],
    descales: [DeviceBuffer; 3],
    _scratch: [DeviceBuffer; 2],
}

/// Device buffers of one planned call.
struct HipData {
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    o: DeviceBuffer,
    lse: Option<DeviceBuffer>,
    /// Q, K, V descales of the FP8 family.
    descales: Option<[DeviceBuffer; 3]>,
}

fn bytes_16(x: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::Bf16 => x.iter().flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes()).collect(),
        _ => x.iter().flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes()).collect(),
    }
}

fn hip_data<'a>(plan: &Plan, data: &'a ResidentData) -> Result<&'a HipData> {
    data.downcast_ref::<HipData>().ok_or_else(|| super::foreign(plan))
}

fn plan_kernel(plan: &Plan) -> Result<HipKernelId> {
    match plan.kernel {
        KernelId::Hip { kernel, .. } => Ok(kernel),
        _ => Err(super::foreign(plan)),
    }
}

impl Backend for HipBackend {
    fn info(&self) -> DeviceInfo {
        DeviceInfo { device: self.device, kind: "hip", adapter: self.adapter.clone() }
    }

    fn plan(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<Planned> {
        registry::walk(&TABLE, self, &self.device.to_string(), problem, precision, strategy)
    }

    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        let id = plan_kernel(plan)?;
        let p = &plan.problem;
        let err = |e: NativeError| self.kernel_error(plan, e);
        let put = |bytes: &[u8]| -> Result<DeviceBuffer> {
            let b = self.rt.alloc(self.ordinal, bytes.len()).map_err(err)?;
            b.upload(bytes).map_err(err)?;
            Ok(b)
        };
        let dtype = plan.precision.input_dtype();
        let (qb, kb, vb, descales) = match (id, plan.precision) {
            (HipKernelId::Mfma(_), _) => (put(&bytes_16(&q.rounded_to(dtype), dtype))?, put(&bytes_16(&k.rounded_to(dtype), dtype))?, put(&bytes_16(&v.rounded_to(dtype), dtype))?, None),
            (HipKernelId::MfmaFp8(_), Precision::Fp8 { descale, .. }) => {
                // The prepass is loaded before anything is uploaded: without hipRTC nothing is
                // allocated.
                self.prepass_modules(plan, dtype)?;
                let put16 = |x: &HostSlice<'_>| put(&bytes_16(&x.rounded_to(dtype), dtype));
                let (q16, k16, v16) = (put16(&q)?, put16(&k)?, put16(&v)?);
                let x = self.prepass(plan, dtype, descale, [q16.device_ptr(), k16.device_ptr(), v16.device_ptr()])?;
                // The 16-bit inputs and the prepass's scratch are freed on return.
                self.synchronize()?;
                let [qc, kc, vc] = x.codes;
                (qc, kc, vc, Some(x.descales))
            }
            _ => return Err(super::foreign(plan)),
        };
        let o = self.rt.alloc(self.ordinal, p.o_len_elems() * 2).map_err(err)?;
        o.zero().map_err(err)?;
        let lse = if p.return_lse { Some(self.rt.alloc(self.ordinal, p.lse_len_elems() * 4).map_err(err)?) } else { None };
        Ok(Box::new(HipData { q: qb, k: kb, v: vb, o, lse, descales }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        let d = hip_data(plan, data)?;
        let ptrs = [d.q.device_ptr(), d.k.device_ptr(), d.v.device_ptr(), d.o.device_ptr(), d.lse.as_ref().map_or(0, |l| l.device_ptr())];
        self.launch_fwd(plan, ptrs, d.descales.as_ref().map(|b| b.each_ref().map(|x| x.device_ptr())))
    }

    fn synchronize(&self) -> Result<()> {
        self.rt.synchronize(self.ordinal).map_err(|e| Error::Kernel { kernel: "synchronize".into(), reason: e.to_string() })
    }

    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let d = hip_data(plan, data)?;
        let p = &plan.problem;
        let err = |e: NativeError| self.kernel_error(plan, e);
        self.synchronize()?;
        let mut ob = vec![0u8; p.o_len_elems() * 2];
        d.o.download(&mut ob).map_err(err)?;
        let bf = matches!(plan.kernel, KernelId::Hip { kernel: HipKernelId::Mfma(MfmaConfig { input: Dtype::Bf16, .. }), .. });
        let o = ob
            .chunks_exact(2)
            .map(|c| {
                let bits = u16::from_le_bytes([c[0], c[1]]);
                if bf { bf16::from_bits(bits).to_f32() } else { f16::from_bits(bits).to_f32() }
            })
            .collect();
        let lse = match &d.lse {
            Some(l) => {
                let mut lb = vec![0u8; p.lse_len_elems() * 4];
                l.download(&mut lb).map_err(err)?;
                Some(lb.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            None => None,
        };
        Ok((o, lse))
    }

    /// Milliseconds per execution from HIP events around each launch.
    fn time(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        for _ in 0..warmup {
            self.execute(plan, data)?;
        }
        (0..iters)
            .map(|_| {
                let mut launched = Ok(());
                let ms = self.rt.time_ms(self.ordinal, || {
                    launched = self.execute(plan, data);
                    Ok(())
                });
                launched?;
                ms.map_err(|e| self.kernel_error(plan, e))
            })
            .collect()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
