//! The HIP backend (AMD GPUs through ROCm, loaded at run time): the native MFMA kernels of
//! `quattn_native::hip` on gfx942 and gfx950, compiled by hipRTC into the code-object cache and
//! launched on the null stream. **Not run on hardware**: no AMD device was available; the
//! kernels are compiled and disassembly-checked, their tile loop is mirrored on the CPU, and
//! this backend's paths without ROCm (no library, no device, an arch without kernels) are
//! tested. The dispatch table has only the native rows: a HIP device takes f16/bf16 with f32
//! accumulation and FP8 e4m3 (per tensor or head), head dims 64 and 128.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use half::{bf16, f16};
use quattn_native::hip::runtime::{DeviceBuffer, HipModule, HipRuntime, Hiprtc};
use quattn_native::hip::{Fp8Encoding, Fp8Mfma, GfxArch, HipCache, HipFp8P, HipFwdParams, HipKernelId, MfmaConfig, MfmaFp8Config, HIP_HEAD_DIMS};
use quattn_native::NativeError;

use super::{Backend, ResidentData};
use crate::codec::fp8::{e4m3, e4m3fnuz, Saturation};
use crate::codec::fp8_scaled::DescaleLayout;
use crate::error::{Error, Result};
use crate::precision::{DescaleGranularity, Dtype, Fp8Format, PvAccum, PvFormat, QkAccum};
use crate::registry::{self, Choice, Family, KernelId, Planned, Reject, Row};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, NativeKind, Precision, Strategy, Strides};

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
    modules: RwLock<HashMap<HipKernelId, Arc<HipModule>>>,
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

    fn module(&self, id: HipKernelId) -> Result<Arc<HipModule>> {
        if let Some(m) = self.modules.read().ok().and_then(|m| m.get(&id).cloned()) {
            return Ok(m);
        }
        let err = |e: NativeError| Error::Kernel { kernel: id.name(), reason: e.to_string() };
        let rtc = Hiprtc::get().map_err(err)?;
        let obj = HipCache::global().get_or_compile(&id, self.arch, rtc.as_ref()).map_err(err)?;
        let m = Arc::new(self.rt.load_module(self.ordinal, &obj.code, obj.entry).map_err(err)?);
        let mut map = self.modules.write().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(id).or_insert(m).clone())
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

/// Codes of the device's e4m3 and f32 descales (`amax / max` per descale group), rows at the
/// strides' offsets: `codec::fp8_scaled`'s recipe on the arch's encoding.
fn quantize(enc: Fp8Encoding, x: &[f32], s: Strides, dim: usize, layout: DescaleLayout) -> (Vec<u8>, Vec<f32>) {
    let rows = || (0..layout.batch).flat_map(move |b| (0..layout.heads).flat_map(move |h| (0..layout.len).map(move |i| (b, h, i))));
    let mut amax = vec![0f32; layout.count()];
    for (b, h, i) in rows() {
        let o = s.offset(b, h, i);
        let a = &mut amax[layout.index(b, h, i)];
        *a = x[o..][..dim].iter().fold(*a, |m, v| m.max(v.abs()));
    }
    let descales: Vec<f32> = amax.iter().map(|&a| if a > 0.0 { a / enc.max() } else { 1.0 }).collect();
    let mut codes = vec![0u8; x.len()];
    for (b, h, i) in rows() {
        let o = s.offset(b, h, i);
        let d = descales[layout.index(b, h, i)];
        for c in 0..dim {
            let y = x[o + c] / d;
            codes[o + c] = match enc {
                Fp8Encoding::E4m3Fn => e4m3::encode(y, Saturation::Saturate),
                Fp8Encoding::E4m3Fnuz => e4m3fnuz::encode(y, Saturation::Saturate),
            };
        }
    }
    (codes, descales)
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
                let layout = |heads, len| DescaleLayout { granularity: descale, batch: p.batch, heads, len, block_rows: len.max(1) };
                let enc = self.arch.fp8();
                let (qc, qd) = quantize(enc, &q.rounded_to(dtype), p.q_strides(), p.head_dim, layout(p.q_heads, p.q_len));
                let (kc, kd) = quantize(enc, &k.rounded_to(dtype), p.k_strides(), p.head_dim, layout(p.kv_heads, p.kv_len));
                let (vc, vd) = quantize(enc, &v.rounded_to(dtype), p.v_strides(), p.v_head_dim, layout(p.kv_heads, p.kv_len));
                let f = |d: &[f32]| d.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
                (put(&qc)?, put(&kc)?, put(&vc)?, Some([put(&f(&qd))?, put(&f(&kd))?, put(&f(&vd))?]))
            }
            _ => return Err(super::foreign(plan)),
        };
        let o = self.rt.alloc(self.ordinal, p.o_len_elems() * 2).map_err(err)?;
        o.zero().map_err(err)?;
        let lse = if p.return_lse { Some(self.rt.alloc(self.ordinal, p.lse_len_elems() * 4).map_err(err)?) } else { None };
        Ok(Box::new(HipData { q: qb, k: kb, v: vb, o, lse, descales }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        let id = plan_kernel(plan)?;
        let d = hip_data(plan, data)?;
        let s = plan.problem.shape();
        let descale = match plan.precision {
            Precision::Fp8 { descale, .. } => Some(descale),
            _ => None,
        };
        id.validate_args(&s, descale).map_err(|e| self.kernel_error(plan, e))?;
        let module = self.module(id)?;
        let ptrs = [d.q.device_ptr(), d.k.device_ptr(), d.v.device_ptr(), d.o.device_ptr(), d.lse.as_ref().map_or(0, |l| l.device_ptr())];
        let desc = d.descales.as_ref().zip(descale).map(|(b, g)| (b.each_ref().map(|x| x.device_ptr()), g));
        let params = HipFwdParams::new(&s, ptrs, desc);
        let (grid, block) = id.launch_dims(&s, self.arch);
        // SAFETY: the params are the kernel's FwdParams; every buffer was sized from the
        // problem's extents at upload, and validate_args checked the shape against them.
        unsafe { module.launch(grid, block, &params) }.map_err(|e| self.kernel_error(plan, e))
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
