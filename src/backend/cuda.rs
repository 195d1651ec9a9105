//! The CUDA device: native kernels where they support the problem, the portable CubeCL kernels
//! otherwise. The dispatch table, best first: the split-KV decode kernel (f16/bf16, sm_80+, at
//! most 64 query rows per KV head: decode and short chunks; any rows of a paged cache), the
//! warp-specialized wgmma kernel (f16, sm_90a),
//! the mma.sync HMMA kernels (f16/bf16, sm_80+), the native INT8 kernels (tcgen05 UMMA on
//! compute capability 10.0, s8 wgmma on 9.0, IMMA from sm_80, each after the native
//! quantization prepass), the native FP8 kernels (e4m3 wgmma on 9.0, e4m3 mma.sync from 8.9,
//! each after its Vᵀ prepass), the native NVFP4 kernel (block-scaled mma.sync, compute
//! capability 12.0 only, after the NVFP4 prepass; not run on hardware), then the portable rows
//! of [`CubeclBackend`] (among them the 4-bit kernel, NVFP4's row everywhere else).
//!
//! FP8: the native FP8 plans take f16 Q, K and V and quantize them on the device with the FP8
//! prepass (e4m3 codes and f32 descales, bit-exact with `codec::fp8_scaled`, which the CPU and
//! portable FP8 paths quantize with on the host). The host path does so once at upload, then
//! V's Vᵀ prepass (V is fixed for resident data); each execution runs the attention kernel. On
//! device tensors ([`crate::Session::run_cuda`]) the FP8 prepass, the Vᵀ prepass and the kernel
//! run at every call on the caller's stream; pre-quantized codes
//! ([`crate::Session::run_cuda_fp8`]) skip the FP8 prepass.
//!
//! Native kernels are loaded once into the device's primary context through one
//! [`ModuleStore`] and launched with raw device addresses: the host path's own buffers, or a
//! caller's memory on the caller's stream ([`crate::Session::run_cuda`]), or CubeCL handles
//! ([`crate::Session::run_cubecl`]). The portable kernels run on CubeCL's own context and
//! stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cubecl::cuda::CudaRuntime;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use quattn_native::wgmma_fp8::{Fp8WgmmaConfig, Fp8WgmmaUnit};
use quattn_native::decode::{DecodeConfig, DecodePtrs, DecodeUnit, PagedArgs};
use quattn_native::{
    DescaleGranularity, Fp8Args, Fp8MmaConfig, Fp8MmaUnit, Fp8PrepassConfig, Fp8PrepassPtrs, Fp8Ptrs, Fp8P, HmmaConfig, Int8Args, Int8Config, Int8PrepassConfig, Int8Ptrs, Int8UmmaConfig, Int8WgmmaConfig, Loaded,
    ModParams, ModValues, ModVariant, ModuleStore, NativeError, NativeKernelId, PrepassLens, PrepassPtrs, VarlenPtrs, VarlenShape, WgmmaConfig,
};

use super::gpu::{CubeclBackend, GpuData};
use super::tables::{TableCache, TableKey, Upload};
use super::{Backend, ResidentData};
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Operands, Fp8Tensor};
use crate::codec::int8::{E4m3VOperands, Int8Operands};
use crate::device_tensor::{CubeclTensors, CudaCall};
use crate::emulation::Blocking;
use crate::error::{Error, Result};
use crate::precision::{PvAccum, PvFormat, QkAccum};
use crate::registry::{self, not_applicable, Choice, Family, KernelId, NativeChoice, Planned, Reject, Row};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, Dtype, Fp8Format, NativeKind, Precision, Strategy};

pub(crate) struct CudaBackend {
    portable: CubeclBackend<CudaRuntime>,
    ctx: Arc<CudaContext>,
    /// The stream of the host path.
    stream: Arc<CudaStream>,
    store: ModuleStore,
    /// Compute capability of the device.
    cc: (u32, u32),
    /// Per caller stream: the INT8 prepass outputs and an LSE for kernels that always write
    /// one, grown on demand. Keyed by stream, so work on one stream never races another's.
    scratch: Mutex<HashMap<usize, Scratch>>,
    /// Per stream: the partial O and LSE of the decode splits, grown on demand (a separate
    /// lock: decode launches take it inside `launch_native`, which `run_raw` calls holding
    /// `scratch`).
    decode_scratch: Mutex<HashMap<usize, DecodeBuffers>>,
}

/// A problem's host tables as its kernel reads them from one i32 buffer: a paged cache's block
/// table followed by its lengths (the paged decode variants), a variable-length batch's
/// `cu_seqlens_q` followed by `cu_seqlens_k` (the varlen variants); `None` for other problems.
fn table_words(p: &AttentionProblem) -> Option<Vec<i32>> {
    TableKey::of(p).map(|k| k.words_from(0))
}

/// The f32 partial states of split-KV decode and its split counters (zero between launches:
/// the kernel returns each to zero), with their element counts.
struct DecodeBuffers {
    part_o: CudaSlice<f32>,
    part_lse: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}

/// The dispatch table of a CUDA device, best first.
fn table() -> [Row<CudaBackend>; 16] {
    [
        // First: it takes only shapes with at most 64 query rows per KV head, where it reads K
        // and V once per GQA group and splits the sequence to fill the device, and paged
        // prefills (in row blocks), which no other native family reads.
        Row { family: Family::Native(NativeKind::Decode), test: CudaBackend::decode_row },
        Row { family: Family::Native(NativeKind::Wgmma), test: CudaBackend::wgmma_row },
        Row { family: Family::Native(NativeKind::Hmma), test: CudaBackend::hmma_row },
        Row { family: Family::Native(NativeKind::Int8Umma), test: |b, p, prec| b.int8_row(p, prec, NativeKind::Int8Umma) },
        Row { family: Family::Native(NativeKind::Int8Wgmma), test: |b, p, prec| b.int8_row(p, prec, NativeKind::Int8Wgmma) },
        Row { family: Family::Native(NativeKind::Int8Imma), test: |b, p, prec| b.int8_row(p, prec, NativeKind::Int8Imma) },
        Row { family: Family::Native(NativeKind::Fp8Wgmma), test: |b, p, prec| b.fp8_row(p, prec, NativeKind::Fp8Wgmma) },
        Row { family: Family::Native(NativeKind::Fp8Mma), test: |b, p, prec| b.fp8_row(p, prec, NativeKind::Fp8Mma) },
        Row { family: Family::Native(NativeKind::Nvfp4), test: |b, p, prec| b.nvfp4_row(p, prec) },
        Row { family: Family::Portable(crate::PortableKind::Decode), test: |b, p, prec| b.portable.float_row(p, prec, quattn_cubecl::Family::Decode) },
        Row { family: Family::Portable(crate::PortableKind::Mma), test: |b, p, prec| b.portable.float_row(p, prec, quattn_cubecl::Family::Mma) },
        Row { family: Family::Portable(crate::PortableKind::Cmma), test: |b, p, prec| b.portable.float_row(p, prec, quattn_cubecl::Family::Cmma) },
        Row { family: Family::Portable(crate::PortableKind::Int8), test: |b, p, prec| b.portable.int8_row(p, prec) },
        Row { family: Family::Portable(crate::PortableKind::Fp8), test: |b, p, prec| b.portable.fp8_row(p, prec) },
        Row { family: Family::Portable(crate::PortableKind::Fp4), test: |b, p, prec| b.portable.fp4_row(p, prec) },
        Row { family: Family::Portable(crate::PortableKind::Fma), test: |b, p, prec| b.portable.float_row(p, prec, quattn_cubecl::Family::Fma) },
    ]
}

/// Device buffers of the native INT8 prepass, with their element counts.
struct Int8Buffers {
    lens: PrepassLens,
    q_codes: CudaSlice<u8>,
    k_codes: CudaSlice<u8>,
    q_scale: CudaSlice<f32>,
    k_scale: CudaSlice<f32>,
    mean: Option<CudaSlice<f32>>,
    k_partial: Option<CudaSlice<f64>>,
    lse_shift: Option<CudaSlice<f32>>,
    /// e4m3 P·V: the Vᵀ codes, V scales and reciprocals, the stats pass's V scratch.
    vt_codes: Option<CudaSlice<u8>>,
    v_scale: Option<CudaSlice<f32>>,
    v_inv: Option<CudaSlice<f32>>,
    v_partial: Option<CudaSlice<f32>>,
    /// The stats pass's tickets (zeroed once; every launch leaves them zero).
    tickets: Option<CudaSlice<u32>>,
}

/// Scratch of one stream.
#[derive(Default)]
struct Scratch {
    lse: Option<CudaSlice<f32>>,
    /// A paged or variable-length plan's tables ([`table_words`]) for device-tensor calls,
    /// copied on this stream when a call's tables are not the ones `held_tables` names.
    tables: Option<CudaSlice<i32>>,
    held_tables: TableCache,
    int8: Option<Int8Buffers>,
    fp8: Fp8Scratch,
}

/// FP8 scratch of one stream, each buffer grown on demand: the codes and descales the device
/// prepass writes from f16 inputs, the Vᵀ of the FP8 families, the prepass's partial maxima and
/// arrival counters (zero between prepasses).
#[derive(Default)]
struct Fp8Scratch {
    codes: [Option<CudaSlice<u8>>; 3],
    descales: [Option<CudaSlice<f32>>; 3],
    vt: Option<CudaSlice<u8>>,
    partial: Option<CudaSlice<f32>>,
    counter: Option<CudaSlice<u32>>,
}

/// The host path's buffers of a native plan, on the backend's stream.
struct NativeData {
    o: CudaSlice<u16>,
    /// Always allocated: the native kernels always write the LSE.
    lse: CudaSlice<f32>,
    inputs: NativeInputs,
}

/// What the host path keeps of Q, K and V.
enum NativeInputs {
    /// f16/bf16 bits, and the INT8 prepass outputs of INT8 plans (rewritten every execution).
    /// A paged or variable-length plan's tables ([`table_words`]) ride along.
    Float { q: CudaSlice<u16>, k: CudaSlice<u16>, v: CudaSlice<u16>, int8: Option<Int8Buffers>, tables: Option<CudaSlice<i32>> },
    /// FP8 codes and descales, and the Vᵀ the family's prepass wrote once at upload: V is fixed
    /// for resident data, so an execution runs the attention kernel alone.
    Fp8(Fp8Buffers),
    /// NVFP4 prepass outputs written once at upload, likewise.
    Nvfp4(Nvfp4Buffers),
}

/// One NVFP4 prepass output: codes, block scales, the amax word, the tensor scale.
struct Nvfp4Quantized {
    codes: CudaSlice<u8>,
    scales: CudaSlice<u8>,
    amax: CudaSlice<u32>,
    tensor_scale: CudaSlice<f32>,
}

/// The buffers of a native NVFP4 plan: Q's and K's prepass outputs, V in 16 bits and, for FP4
/// P·V, Vᵀ's prepass output (read instead of V). The 16-bit Q and K stay allocated with them.
struct Nvfp4Buffers {
    q: Nvfp4Quantized,
    k: Nvfp4Quantized,
    v: CudaSlice<u16>,
    vt: Option<Nvfp4Quantized>,
    _q: CudaSlice<u16>,
    _k: CudaSlice<u16>,
}

/// The codes, descales and Vᵀ scratch of a native FP8 plan.
struct Fp8Buffers {
    q: CudaSlice<u8>,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    vt: CudaSlice<u8>,
    q_descale: CudaSlice<f32>,
    k_descale: CudaSlice<f32>,
    v_descale: CudaSlice<f32>,
}

impl Fp8Buffers {
    /// Their addresses on `stream`, with O and the LSE of the call.
    fn ptrs(&mut self, stream: &Arc<CudaStream>, o: u64, lse: u64) -> Fp8Ptrs {
        let s = stream;
        Fp8Ptrs {
            q: self.q.device_ptr_mut(s).0,
            k: self.k.device_ptr_mut(s).0,
            v: self.v.device_ptr_mut(s).0,
            vt: self.vt.device_ptr_mut(s).0,
            o,
            lse,
            q_descale: self.q_descale.device_ptr_mut(s).0,
            k_descale: self.k_descale.device_ptr_mut(s).0,
            v_descale: self.v_descale.device_ptr_mut(s).0,
        }
    }
}

fn native_err(kernel: &str, e: NativeError) -> Error {
    Error::Kernel { kernel: kernel.into(), reason: e.to_string() }
}

/// The HMMA config for a problem, or why the native kernels do not take it.

/// The modifier variant a problem with score modifiers needs: softcap and ALiBi compiled in
/// only when it sets them.
fn mod_variant(problem: &AttentionProblem) -> ModVariant {
    ModVariant { softcap: problem.softcap.is_some(), alibi: problem.alibi_slopes.is_some() }
}

/// The kernel parameters of a modifier variant for `problem` (window, alignment, softcap, ALiBi,
/// sinks in the kernel's units); for a variable-length problem those of the varlen variants,
/// which align each sequence against its own lengths.
fn mod_params(name: &str, variant: ModVariant, problem: &AttentionProblem) -> std::result::Result<ModParams, NativeError> {
    let values = ModValues {
        top_left: problem.causal_align == crate::CausalAlign::TopLeft,
        left: problem.window.and_then(|w| w.left_bound()),
        right: problem.window.and_then(|w| w.right_bound()),
        softcap: problem.softcap,
        alibi_slopes: problem.alibi_slopes.as_deref(),
        sinks: problem.sinks.as_deref(),
    };
    match varlen_shape(problem) {
        Some(shape) => ModParams::for_varlen(name, Some(variant), &shape, &values),
        None => ModParams::new(name, Some(variant), &problem.shape(), &values),
    }
}

/// The typed refusal of a modifier variant that cannot take `problem`'s modifiers at its shape
/// (too many heads for its parameter block, lengths past 2^29), so Auto moves on.
fn refuse_mod_shape(name: &str, e: NativeError) -> Reject {
    Reject::Refused(Error::UnsupportedFeature { feature: "score modifiers at this shape", kernel: format!("{name}: {e}") })
}

/// `config` as is for a problem without modifiers; otherwise its modifier variant (`set`),
/// provided the variant takes this problem: what it cannot take (too many heads for its
/// parameter block, lengths past 2^29) is a typed refusal, so Auto moves on to a kernel that can.
fn with_mod_variant<C: Copy>(
    mut config: C,
    problem: &AttentionProblem,
    set: impl Fn(&mut C),
    key: impl Fn(&C) -> (String, Option<ModVariant>),
) -> std::result::Result<C, Reject> {
    if !problem.has_modifiers() {
        return Ok(config);
    }
    set(&mut config);
    let (name, variant) = key(&config);
    if let Some(v) = variant {
        mod_params(&name, v, problem).map_err(|e| refuse_mod_shape(&name, e))?;
    }
    Ok(config)
}

/// A variable-length problem as the native varlen variants take it (packed strides, each
/// sequence's rows found through the offsets `table_words` uploads).
fn varlen_shape(p: &AttentionProblem) -> Option<VarlenShape> {
    let vl = p.varlen.as_ref()?;
    let s = p.shape();
    Some(VarlenShape {
        batch: p.batch,
        total_q: vl.total_q(),
        total_k: vl.total_k(),
        max_q_len: p.q_len,
        max_kv_len: p.kv_len,
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        head_dim: p.head_dim,
        v_head_dim: p.v_head_dim,
        causal: p.causal,
        scale: p.softmax_scale(),
        q: s.q,
        k: s.k,
        v: s.v,
        o: s.o,
    })
}

/// The varlen variant of a native f16/bf16 family for a variable-length problem (`config` builds
/// it, with the problem's modifier variant when it sets modifiers), checked against the shape,
/// the offsets (the host copy the kernel will read) and, with modifiers, their parameters at
/// this shape (`kernel_name` names the variant); `Ok(None)` for a dense problem.
fn varlen_config<C>(
    problem: &AttentionProblem,
    name: &str,
    config: impl FnOnce(Option<ModVariant>) -> std::result::Result<C, NativeError>,
    check: impl FnOnce(&C, &VarlenShape) -> std::result::Result<(), NativeError>,
    kernel_name: impl FnOnce(&C) -> String,
) -> std::result::Result<Option<C>, Reject> {
    let (Some(vl), Some(shape)) = (&problem.varlen, varlen_shape(problem)) else { return Ok(None) };
    let refuse = |e: NativeError| Reject::Refused(Error::UnsupportedVarLen { kernel: format!("the {name} kernels: {e}") });
    let mods = problem.has_modifiers().then(|| mod_variant(problem));
    let config = config(mods).map_err(refuse)?;
    shape.validate(problem.head_dim as u32).map_err(refuse)?;
    shape.check_cu_seqlens(&vl.cu_seqlens_q, &vl.cu_seqlens_k).map_err(refuse)?;
    check(&config, &shape).map_err(refuse)?;
    if let Some(v) = mods {
        let kernel = kernel_name(&config);
        mod_params(&kernel, v, problem).map_err(|e| refuse_mod_shape(&kernel, e))?;
    }
    Ok(Some(config))
}

/// The wgmma varlen variant for a variable-length problem (with its modifier variant when it
/// sets modifiers); `Ok(None)` for a dense problem.
fn wgmma_varlen(problem: &AttentionProblem) -> std::result::Result<Option<WgmmaConfig>, Reject> {
    varlen_config(
        problem,
        "wgmma",
        |mods| match mods {
            Some(m) => WgmmaConfig::varlen_with_mods(problem.head_dim, m),
            None => WgmmaConfig::varlen(problem.head_dim),
        },
        |c, shape| c.tma_specs_varlen(shape, &VarlenPtrs::default()).map(|_| ()),
        |c| c.name(),
    )
}

/// The HMMA varlen variant of `input` for a variable-length problem (with its modifier variant
/// when it sets modifiers); `Ok(None)` for a dense problem.
fn hmma_varlen(problem: &AttentionProblem, input: Dtype) -> std::result::Result<Option<HmmaConfig>, Reject> {
    let config = |mods: Option<ModVariant>| match mods {
        Some(m) => HmmaConfig::varlen_with_mods(problem.head_dim, input, m),
        None => HmmaConfig::varlen(problem.head_dim, input),
    };
    varlen_config(problem, "HMMA", config, |_, _| Ok(()), |c| c.name())
}

/// The dense HMMA variant of `config` for `problem`: `config` itself without score modifiers,
/// otherwise the modifier variant compiling in exactly the modifiers the problem sets (the
/// parameter block matches one variant only), so a window, causal band or sinks alone take the
/// window-only variant (the plain kernel's tile) and softcap or ALiBi the 16-row ones.
fn hmma_dense(problem: &AttentionProblem, config: HmmaConfig) -> std::result::Result<HmmaConfig, Reject> {
    config.validate_args(&problem.shape()).map_err(|e| Reject::NotApplicable(e.to_string()))?;
    if problem.has_modifiers() && (config.qk != QkAccum::F32 || config.pv != PvAccum::F32) {
        // The modifier variants accumulate in f32 only.
        registry::refuse_modifiers(problem, format!("{} (f16 accumulation)", config.name()))?;
    }
    with_mod_variant(config, problem, |c| c.mods = Some(mod_variant(problem)), |c| (c.name(), c.mods))
}

fn hmma_config(problem: &AttentionProblem, precision: Precision) -> std::result::Result<HmmaConfig, String> {
    let (input, qk, pv) = match precision {
        Precision::F16 { qk, pv } => (Dtype::F16, qk, pv),
        Precision::Bf16 { qk, pv } => (Dtype::Bf16, qk, pv),
        _ => return Err(format!("HMMA kernels compute f16/bf16 inputs, not {precision}")),
    };
    if problem.v_head_dim != problem.head_dim {
        return Err(format!("HMMA kernels need v_head_dim == head_dim (got {} and {})", problem.v_head_dim, problem.head_dim));
    }
    HmmaConfig::new(problem.head_dim, input, qk, pv).map_err(|e| e.to_string())
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
            store: ModuleStore::new(ctx.clone()),
            ctx,
            stream,
            cc: (major, minor),
            scratch: Mutex::new(HashMap::new()),
            decode_scratch: Mutex::new(HashMap::new()),
        })
    }

    /// Loads a native kernel (compiling it on first use) in the primary context.
    /// The loaded module of `id` (compiled and loaded on first use); the caller has bound the
    /// context. Names are formatted only for errors: this runs on every launch.
    fn load(&self, id: NativeKernelId) -> Result<Arc<Loaded>> {
        self.store.get(id).map_err(|e| native_err(&id.to_string(), e))
    }

    /// CubeCL's CUDA runtime keeps its own context current on the thread; the native kernels,
    /// their buffers and events live in the primary context, so every native call binds it first
    /// (a launch or event in the wrong context fails with CUDA_ERROR_INVALID_HANDLE).
    fn bind(&self, plan: &Plan) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| Error::Kernel { kernel: plan.kernel_name(), reason: e.to_string() })
    }

    fn wgmma_row(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
        if precision != Precision::F16_DEFAULT {
            return not_applicable(format!("the wgmma kernel computes f16 with f32 accumulation, not {precision}"));
        }
        if WgmmaConfig::target_for(self.cc).is_none() {
            return not_applicable(format!("the wgmma kernel needs compute capability 9.0 (sm_90a), this device is {}.{}", self.cc.0, self.cc.1));
        }
        let hmma = hmma_config(problem, precision).map_err(Reject::NotApplicable)?;
        if let Some(config) = wgmma_varlen(problem)? {
            return self.native_choice(NativeKernelId::Wgmma(config), None, None);
        }
        let config = WgmmaConfig::new(problem.head_dim).map_err(|e| Reject::NotApplicable(e.to_string()))?;
        hmma.validate_args(&problem.shape()).map_err(|e| Reject::NotApplicable(e.to_string()))?;
        // The tensor maps' rules (byte strides positive multiples of 16 below 2^40), on a
        // placeholder address: a shape TMA cannot describe falls through to the HMMA kernels.
        config.tma_specs(&problem.shape(), [0; 5]).map_err(|e| Reject::NotApplicable(e.to_string()))?;
        let config = with_mod_variant(config, problem, |c| c.mods = Some(mod_variant(problem)), |c| (c.name(), c.mods))?;
        self.native_choice(NativeKernelId::Wgmma(config), None, None)
    }

    /// Split-KV decode: f16 or bf16 with f32 accumulation, at most
    /// [`DecodeConfig::MAX_ROWS`] query rows (`group · q_len`) per KV head, or any number in row
    /// blocks of that many on a paged cache (its prefill); a problem with score
    /// modifiers takes the modifier variant (refused, typed, where its parameter block cannot
    /// hold them). The plan records the split the device's occupancy gives
    /// ([`quattn_native::decode_split`], over the keys some position sees with modifiers).
    fn decode_row(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
        let na = |e: String| Reject::NotApplicable(e);
        let input = match precision {
            Precision::F16_DEFAULT => Dtype::F16,
            Precision::BF16_DEFAULT => Dtype::Bf16,
            _ => return not_applicable(format!("the decode kernel computes f16 or bf16 with f32 accumulation, not {precision}")),
        };
        if DecodeConfig::target_for(self.cc).is_none() {
            return not_applicable(format!("the decode kernel needs sm_80 or newer, this device is {}.{}", self.cc.0, self.cc.1));
        }
        if problem.v_head_dim != problem.head_dim {
            return not_applicable(format!("the decode kernel needs v_head_dim == head_dim (got {} and {})", problem.v_head_dim, problem.head_dim));
        }
        // A dense prefill goes to the prefill families; a paged one runs here in row blocks.
        let rows = problem.group_size().saturating_mul(problem.q_len);
        if rows > DecodeConfig::MAX_ROWS && problem.paged.is_none() {
            return not_applicable(format!(
                "{rows} query rows per KV head (group {} x q_len {}): the decode kernel packs at most {} of a strided cache (a prefill shape)",
                problem.group_size(),
                problem.q_len,
                DecodeConfig::MAX_ROWS
            ));
        }
        let config = DecodeConfig::new(problem.head_dim, input, rows).map_err(|e| na(e.to_string()))?.with_paged(problem.paged.is_some());
        let shape = problem.shape();
        config.validate_args(&shape).map_err(|e| na(e.to_string()))?;
        let config = with_mod_variant(config, problem, |c| c.mods = Some(mod_variant(problem)), |c| (c.name(), c.mods))?;
        let mods = match config.mods {
            Some(v) => Some(mod_params(&config.name(), v, problem).map_err(|e| na(e.to_string()))?),
            None => None,
        };
        let id = NativeKernelId::Decode(DecodeUnit::Attention(config));
        let choice = self.native_choice(id, None, None)?;
        let loaded = self.load(id).map_err(|e| na(e.to_string()))?;
        let Loaded::Decode(kernel) = &*loaded else {
            return not_applicable(format!("{id} loaded as another family"));
        };
        // With modifiers the split divides only the keys some position sees (at the longest
        // sequence of a paged cache, which bounds every sequence's).
        let split = kernel.split_for(&shape, mods.as_ref());
        config.validate_split(&shape, mods.as_ref(), split).map_err(|e| na(e.to_string()))?;
        log::debug!("decode plan {id}: {} splits of {} keys ({:?} SMs x CTAs per SM)", split.splits, split.keys_per_split, kernel.occupancy());
        let KernelId::Native(mut n) = choice.kernel else { return Err(Reject::NotApplicable("not a native choice".into())) };
        n.split = Some(split);
        Ok(Choice { kernel: KernelId::Native(n), blocking: choice.blocking })
    }

    /// The partial-state buffers and split counters of a decode launch of `need` (O, LSE,
    /// counters) elements on `stream`, grown on demand; returns their addresses.
    fn decode_partials(&self, plan: &Plan, stream: &Arc<CudaStream>, need: (usize, usize, usize)) -> Result<(u64, u64, u64)> {
        let mut map = self.decode_scratch.lock().map_err(|_| Error::Kernel { kernel: plan.kernel_name(), reason: "decode scratch lock poisoned".into() })?;
        let e = driver_of(plan);
        let fits = |b: &DecodeBuffers| b.part_o.len() >= need.0 && b.part_lse.len() >= need.1 && b.counters.len() >= need.2;
        let key = stream.cu_stream() as usize;
        if map.get(&key).is_none_or(|b| !fits(b)) {
            // The old buffers may still be read by work queued on `stream`: let it finish
            // before they are freed.
            if map.contains_key(&key) {
                stream.synchronize().map_err(&e)?;
            }
            let s = &self.stream;
            // SAFETY: every partial state is written by the decode kernel before the merge
            // reads it; the counters start zeroed.
            let b = DecodeBuffers {
                part_o: unsafe { s.alloc::<f32>(need.0.max(4)) }.map_err(&e)?,
                part_lse: unsafe { s.alloc::<f32>(need.1.max(4)) }.map_err(&e)?,
                counters: s.alloc_zeros::<u32>(need.2.max(4)).map_err(&e)?,
            };
            s.synchronize().map_err(&e)?;
            map.insert(key, b);
        }
        let b = map.get_mut(&key).ok_or_else(|| Error::Kernel { kernel: plan.kernel_name(), reason: "decode scratch missing".into() })?;
        let part_o = b.part_o.device_ptr_mut(stream).0;
        let part_lse = b.part_lse.device_ptr_mut(stream).0;
        let counters = b.counters.device_ptr_mut(stream).0;
        Ok((part_o, part_lse, counters))
    }

    fn hmma_row(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
        let config = hmma_config(problem, precision).map_err(Reject::NotApplicable)?;
        if HmmaConfig::target_for(self.cc).is_none() {
            return not_applicable(format!("the HMMA kernels need sm_80 or newer, this device is {}.{}", self.cc.0, self.cc.1));
        }
        if problem.varlen.is_some() && (config.qk != QkAccum::F32 || config.pv != PvAccum::F32) {
            // The varlen variants accumulate in f32 only.
            registry::refuse_varlen(problem, format!("{} (f16 accumulation)", config.name()))?;
        }
        if let Some(config) = hmma_varlen(problem, config.input)? {
            return self.native_choice(NativeKernelId::Hmma(config), None, None);
        }
        let config = hmma_dense(problem, config)?;
        self.native_choice(NativeKernelId::Hmma(config), None, None)
    }

    /// The sm_120a NVFP4 family: compute capability 12.0 only, so Auto never considers it on
    /// other devices ([`nvfp4_native_decision`] decides; the portable 4-bit row after it takes
    /// the problem there). Compiled and SASS-checked, **not run on hardware**: the host path
    /// quantizes Q and K (and V's transpose) with the NVFP4 prepass at upload and launches the
    /// kernel per execution ([`Self::upload_nvfp4`]); the emulation follows its 64 x 64 tiles.
    fn nvfp4_row(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
        let d = nvfp4_native_decision(self.cc, problem, precision)?;
        let blocking = Blocking {
            block_q: quattn_native::nvfp4::BLOCK_Q as usize,
            block_k: quattn_native::nvfp4::BLOCK_K as usize,
            warps: 4,
            ..Blocking::default()
        };
        blocking.validate(problem, precision)?;
        if let Some(vt) = d.vt_prepass {
            self.load(NativeKernelId::Nvfp4Quant(vt)).map_err(|e| Reject::NotApplicable(format!("the NVFP4 Vᵀ prepass does not load: {e}")))?;
        }
        self.native_choice(NativeKernelId::Nvfp4(d.kernel), Some(NativeKernelId::Nvfp4Quant(d.qk_prepass)), Some(blocking))
    }

    /// The host path of a native NVFP4 plan: Q, K, V uploaded in the plan's 16-bit type, then
    /// the NVFP4 prepass on the backend's stream writes Q's and K's codes, block scales and
    /// tensor scales (and, for FP4 P·V, Vᵀ's), once: the inputs of resident data are fixed, so
    /// an execution launches the attention kernel alone. Not run on hardware.
    fn upload_nvfp4(&self, plan: &Plan, choice: &NativeChoice, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        use quattn_native::nvfp4_quant::Nvfp4QuantPtrs;
        let (NativeKernelId::Nvfp4(kcfg), Some(NativeKernelId::Nvfp4Quant(qcfg))) = (choice.kernel, choice.prepass) else {
            return Err(super::foreign(plan));
        };
        let p = &plan.problem;
        let shape = p.shape();
        let s = &self.stream;
        let e = driver_of(plan);
        let dtype = plan.dtype();
        let o = s.alloc_zeros::<u16>(p.o_len_elems()).map_err(&e)?;
        let lse = s.alloc_zeros::<f32>(p.lse_len_elems().max(1)).map_err(&e)?;
        let (mut qh, mut kh, mut vh) =
            (s.clone_htod(&bits(q, dtype)).map_err(&e)?, s.clone_htod(&bits(k, dtype)).map_err(&e)?, s.clone_htod(&bits(v, dtype)).map_err(&e)?);
        let vt_cfg = (kcfg.pv == quattn_native::nvfp4::PvMode::Fp4).then(|| qcfg.transposed());
        // Codes, scales, the amax word and the tensor-scale slot of one prepass output.
        let alloc = |cfg: &quattn_native::nvfp4_quant::Nvfp4QuantConfig, heads: usize, seq: usize| -> Result<Nvfp4Quantized> {
            let (codes, scales) = cfg.output_lens(p.batch, heads, seq);
            // SAFETY (alloc): the prepass writes every code and scale before the kernel reads
            // them; the amax word is zeroed by the prepass launcher.
            Ok(Nvfp4Quantized {
                codes: unsafe { s.alloc::<u8>(codes.max(16)) }.map_err(&e)?,
                scales: unsafe { s.alloc::<u8>(scales.max(16)) }.map_err(&e)?,
                amax: s.alloc_zeros::<u32>(1).map_err(&e)?,
                tensor_scale: s.alloc_zeros::<f32>(1).map_err(&e)?,
            })
        };
        let mut bq = alloc(&qcfg, p.q_heads, p.q_len)?;
        let mut bk = alloc(&qcfg, p.kv_heads, p.kv_len)?;
        let mut bvt = match &vt_cfg {
            Some(c) => Some(alloc(c, p.kv_heads, p.kv_len)?),
            None => None,
        };
        self.bind(plan)?;
        let prepass = |cfg| -> Result<Arc<Loaded>> { self.load(NativeKernelId::Nvfp4Quant(cfg)) };
        let run = |loaded: &Loaded, src: u64, b: &mut Nvfp4Quantized, heads: usize, seq: usize, strides: &quattn_native::Strides| -> Result<()> {
            let Loaded::Nvfp4Quant(k) = loaded else { return Err(super::foreign(plan)) };
            let ptrs = Nvfp4QuantPtrs {
                src,
                codes: b.codes.device_ptr_mut(s).0,
                scales: b.scales.device_ptr_mut(s).0,
                amax: b.amax.device_ptr_mut(s).0,
                tensor_scale: b.tensor_scale.device_ptr_mut(s).0,
            };
            // SAFETY: the source was uploaded for this problem with these strides; the outputs
            // were allocated with `output_lens` of this config; the launcher checks the rest.
            unsafe { k.launch_raw(s, p.batch, heads, seq, strides, ptrs) }.map_err(|e| native_err("nvfp4_quant", e))
        };
        let qk = prepass(qcfg)?;
        run(&qk, qh.device_ptr_mut(s).0, &mut bq, p.q_heads, p.q_len, &shape.q)?;
        run(&qk, kh.device_ptr_mut(s).0, &mut bk, p.kv_heads, p.kv_len, &shape.k)?;
        if let (Some(c), Some(b)) = (vt_cfg, bvt.as_mut()) {
            run(&*prepass(c)?, vh.device_ptr_mut(s).0, b, p.kv_heads, p.kv_len, &shape.v)?;
        }
        Ok(Box::new(NativeData { o, lse, inputs: NativeInputs::Nvfp4(Nvfp4Buffers { v: vh, q: bq, k: bk, vt: bvt, _q: qh, _k: kh }) }))
    }

    /// One execution of a native NVFP4 plan: the attention kernel on the prepass outputs of
    /// upload. With `timed`, events bracket it (pushed there; nothing waits). Not run on
    /// hardware.
    fn launch_nvfp4(&self, plan: &Plan, stream: &Arc<CudaStream>, b: &mut Nvfp4Buffers, o: u64, lse: u64, timed: Option<&mut KernelEvents>) -> Result<()> {
        let KernelId::Native(choice) = &plan.kernel else { return Err(super::foreign(plan)) };
        self.bind(plan)?;
        let kernel = self.load(choice.kernel)?;
        let Loaded::Nvfp4(k) = &*kernel else { return Err(super::foreign(plan)) };
        let s = stream;
        let addr = |x: &mut Nvfp4Quantized| (x.codes.device_ptr_mut(s).0, x.scales.device_ptr_mut(s).0, x.tensor_scale.device_ptr_mut(s).0);
        let (q_codes, q_scales, q_ts) = addr(&mut b.q);
        let (k_codes, k_scales, k_ts) = addr(&mut b.k);
        let (v, v_scales, v_ts) = match b.vt.as_mut() {
            Some(vt) => addr(vt),
            None => (b.v.device_ptr_mut(s).0, 0, 0),
        };
        let ptrs = quattn_native::nvfp4::Nvfp4Ptrs { q_codes, q_scales, k_codes, k_scales, q_ts, k_ts, v, v_scales, v_ts, o, lse: if plan.problem.return_lse { lse } else { 0 } };
        let start = self.start_event(plan, stream, timed.is_some())?;
        // SAFETY: every buffer was allocated for this problem and config at upload (the prepass
        // outputs by `output_lens`), V and O with the problem's strides; the launcher checks the
        // arguments.
        unsafe { k.launch_raw(stream, &plan.problem.shape(), ptrs) }.map_err(|e| native_err(&plan.kernel_name(), e))?;
        self.end_event(plan, stream, start, timed)
    }

    /// A timing event recorded on `stream` now.
    fn recorded_event(&self, plan: &Plan, stream: &Arc<CudaStream>) -> Result<CudaEvent> {
        let e = driver_of(plan);
        // cudarc's default event flags disable timing; elapsed time needs CU_EVENT_DEFAULT.
        let ev = self.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(&e)?;
        ev.record(stream).map_err(&e)?;
        Ok(ev)
    }

    /// A recorded start event on `stream` when `timed` (the kernel's launch follows).
    fn start_event(&self, plan: &Plan, stream: &Arc<CudaStream>, timed: bool) -> Result<Option<CudaEvent>> {
        if timed { self.recorded_event(plan, stream).map(Some) } else { Ok(None) }
    }

    /// Records the end event after the kernel's launch and pushes the pair into `timed`.
    fn end_event(&self, plan: &Plan, stream: &Arc<CudaStream>, start: Option<CudaEvent>, timed: Option<&mut KernelEvents>) -> Result<()> {
        if let (Some(start), Some(events)) = (start, timed) {
            events.push((start, self.recorded_event(plan, stream)?));
        }
        Ok(())
    }

    /// Waits for the stream once, then the milliseconds between each pair of `events`.
    fn elapsed_ms(&self, plan: &Plan, events: &KernelEvents) -> Result<Vec<f64>> {
        let e = driver_of(plan);
        self.stream.synchronize().map_err(&e)?;
        events.iter().map(|(start, end)| Ok(start.elapsed_ms(end).map_err(&e)? as f64)).collect()
    }

    /// An INT8 family: its kernel, the blocking its scales need, and the prepass for them. FP8
    /// P·V runs on the s8 wgmma family only (its e4m3 P·V variant, V quantized by the prepass).
    fn int8_row(&self, problem: &AttentionProblem, precision: Precision, family: NativeKind) -> std::result::Result<Choice, Reject> {
        let na = |e: String| Reject::NotApplicable(e);
        let Precision::Int8Qk { granularity, smooth_k, pv } = precision else {
            return not_applicable(format!("the native INT8 kernels compute INT8 Q/K, not {precision}"));
        };
        let fp8_pv = pv == PvFormat::Fp8;
        if fp8_pv && family != NativeKind::Int8Wgmma {
            return not_applicable("this native INT8 kernel takes f16 P·V only; FP8 P·V runs on the s8 wgmma kernel (sm_90a)");
        }
        if problem.v_head_dim != problem.head_dim {
            return not_applicable(format!("native INT8 kernels need v_head_dim == head_dim (got {} and {})", problem.v_head_dim, problem.head_dim));
        }
        let g = granularity;
        let (id, b) = match family {
            NativeKind::Int8Umma => {
                if !Int8UmmaConfig::supported(self.cc) {
                    return not_applicable(format!("the tcgen05 UMMA kernel needs compute capability 10.0, this device is {}.{}", self.cc.0, self.cc.1));
                }
                let c = Int8UmmaConfig::new(problem.head_dim, g, PvAccum::F32).map_err(|e| na(e.to_string()))?;
                (NativeKernelId::Int8Umma(c), c.blocking().map_err(|e| na(e.to_string()))?)
            }
            NativeKind::Int8Wgmma => {
                if Int8WgmmaConfig::target_for(self.cc).is_none() {
                    return not_applicable(format!("the s8 wgmma kernel needs compute capability 9.0 (sm_90a), this device is {}.{}", self.cc.0, self.cc.1));
                }
                let c = if fp8_pv { Int8WgmmaConfig::new_fp8(problem.head_dim, g) } else { Int8WgmmaConfig::new(problem.head_dim, g) }
                    .map_err(|e| na(e.to_string()))?;
                (NativeKernelId::Int8Wgmma(c), c.blocking().map_err(|e| na(e.to_string()))?)
            }
            _ => {
                if Int8Config::target_for(self.cc).is_none() {
                    return not_applicable(format!("the IMMA kernel needs sm_80 or newer, this device is {}.{}", self.cc.0, self.cc.1));
                }
                let c = Int8Config::new(problem.head_dim, g, PvAccum::F32).map_err(|e| na(e.to_string()))?;
                (NativeKernelId::Int8Imma(c), c.blocking().map_err(|e| na(e.to_string()))?)
            }
        };
        // The prepass writes the Q and K codes in the problem's strides, which the kernel then
        // copies in 16-byte pieces: its launch checks (strides, grid limits) belong to the plan.
        let args = Int8Args { shape: problem.shape(), lse_shift: false };
        match &id {
            NativeKernelId::Int8Wgmma(c) => c.validate_args(&args),
            NativeKernelId::Int8Imma(c) => args.validate(c),
            _ => Ok(()),
        }
        .map_err(|e| na(e.to_string()))?;
        let blocking = Blocking { block_q: b.block_q, block_k: b.block_k, warps: b.warps, ..Blocking::default() };
        blocking.validate(problem, precision).map_err(|e| na(e.to_string()))?;
        // The INT8 plans take f16 Q, K and V.
        let prepass = Int8PrepassConfig::new(problem.head_dim, Dtype::F16, b, g, smooth_k).map_err(|e| na(e.to_string()))?;
        let prepass = if fp8_pv { prepass.with_v_fp8() } else { prepass };
        prepass.validate_args(&problem.shape()).map_err(|e| na(e.to_string()))?;
        self.native_choice(id, Some(NativeKernelId::Int8Prepass(prepass)), Some(blocking))
    }

    /// A native FP8 family: e4m3 codes with per-tensor or per-head descales (e5m2 and per-block
    /// descales run on the portable FP8 kernel). The wgmma family computes P·V in e4m3 only; the
    /// mma.sync family in f16 (V decoded) or e4m3.
    fn fp8_row(&self, problem: &AttentionProblem, precision: Precision, family: NativeKind) -> std::result::Result<Choice, Reject> {
        let na = |e: String| Reject::NotApplicable(e);
        let Precision::Fp8 { format, descale, p } = precision else {
            return not_applicable(format!("the native FP8 kernels compute FP8 inputs, not {precision}"));
        };
        if format != Fp8Format::E4M3 {
            return not_applicable("the native FP8 kernels read e4m3 codes");
        }
        if descale == DescaleGranularity::PerBlock {
            return not_applicable("the native FP8 kernels take per-tensor or per-head descales");
        }
        if problem.v_head_dim != problem.head_dim {
            return not_applicable(format!("native FP8 kernels need v_head_dim == head_dim (got {} and {})", problem.v_head_dim, problem.head_dim));
        }
        let out = Dtype::F16;
        let args = Fp8Args::new(problem.shape(), descale);
        let (id, block_k) = match family {
            NativeKind::Fp8Wgmma => {
                if p != PvFormat::Fp8 {
                    return not_applicable("the FP8 wgmma kernel rounds P to e4m3 (PvFormat::Fp8)");
                }
                if Fp8WgmmaConfig::target_for(self.cc).is_none() {
                    return not_applicable(format!("the FP8 wgmma kernel needs compute capability 9.0 (sm_90a), this device is {}.{}", self.cc.0, self.cc.1));
                }
                let c = Fp8WgmmaConfig::new(problem.head_dim, out).map_err(|e| na(e.to_string()))?;
                c.validate_args(&args).map_err(|e| na(e.to_string()))?;
                (NativeKernelId::Fp8Wgmma(Fp8WgmmaUnit::Attention(c)), c.block_n as usize)
            }
            _ => {
                if Fp8MmaConfig::target_for(self.cc).is_none() {
                    return not_applicable(format!("the FP8 mma.sync kernel needs compute capability 8.9 or newer, this device is {}.{}", self.cc.0, self.cc.1));
                }
                let pf = if p == PvFormat::Fp8 { Fp8P::E4m3 } else { Fp8P::F16 };
                let c = Fp8MmaConfig::new(problem.head_dim, pf, out).map_err(|e| na(e.to_string()))?;
                c.validate_args(&args).map_err(|e| na(e.to_string()))?;
                let t = c.tile().map_err(|e| na(e.to_string()))?;
                (NativeKernelId::Fp8Mma(Fp8MmaUnit::Fwd(c)), t.block_n as usize)
            }
        };
        // The emulation's FP8 P is quantized per KV tile: the kernel's key tile.
        let blocking = Blocking { block_k, ..Blocking::default() };
        blocking.validate(problem, precision).map_err(|e| na(e.to_string()))?;
        // The plans take f16 Q, K and V (host slices or device tensors) and quantize them on the
        // device; pre-quantized codes skip the prepass (`Session::run_cuda_fp8`).
        let prepass = Fp8PrepassConfig::new(Dtype::F16, format).map_err(|e| na(e.to_string()))?;
        prepass.validate_args(&args).map_err(|e| na(e.to_string()))?;
        self.native_choice(id, Some(NativeKernelId::Fp8Prepass(prepass)), Some(blocking))
    }

    /// Resident buffers of a native FP8 plan: the host's f16 Q, K and V uploaded, quantized by
    /// the device prepass into codes and descales, V's Vᵀ written; on the host-path stream. The
    /// 16-bit copies are freed after the prepass (stream-ordered).
    fn upload_fp8(&self, plan: &Plan, x: [HostSlice<'_>; 3], o: u64, lse: u64) -> Result<Fp8Buffers> {
        let (config, args) = self.fp8_prepass_of(plan)?;
        let e = driver_of(plan);
        let s = &self.stream;
        let need = config.required_lens(&args);
        // The session screened the inputs (the NaN policy): every element of the views is finite
        // and within f16; the prepass reads nothing else.
        let [q16, k16, v16] = x.map(|x| bits(x, config.input));
        let (mut q16, mut k16, mut v16) = (s.clone_htod(&q16).map_err(&e)?, s.clone_htod(&k16).map_err(&e)?, s.clone_htod(&v16).map_err(&e)?);
        let zeros = |n: usize| s.alloc_zeros::<u8>(n.max(16)).map_err(&e);
        let floats = |n: usize| s.alloc_zeros::<f32>(n.max(1)).map_err(&e);
        let mut b = Fp8Buffers {
            q: zeros(need.q)?,
            k: zeros(need.k)?,
            v: zeros(need.v)?,
            vt: zeros(self.fp8_vt_len(plan)?)?,
            q_descale: floats(need.q_descale)?,
            k_descale: floats(need.kv_descale)?,
            v_descale: floats(need.kv_descale)?,
        };
        let mut partial = floats(need.partial)?;
        let mut counter = s.alloc_zeros::<u32>(need.counter.max(1)).map_err(&e)?;
        let ptrs = b.ptrs(s, o, lse);
        let pre = Fp8PrepassPtrs {
            q: q16.device_ptr_mut(s).0,
            k: k16.device_ptr_mut(s).0,
            v: v16.device_ptr_mut(s).0,
            q_codes: ptrs.q,
            k_codes: ptrs.k,
            v_codes: ptrs.v,
            q_descale: ptrs.q_descale,
            k_descale: ptrs.k_descale,
            v_descale: ptrs.v_descale,
            partial: partial.device_ptr_mut(s).0,
            counter: counter.device_ptr_mut(s).0,
        };
        self.launch_fp8_prepass(config, &args, s, &pre)?;
        // V is fixed from here on: its Vᵀ once, on the stream every execution runs on.
        self.launch_fp8_vt(plan, s, &ptrs)?;
        Ok(b)
    }

    /// The FP8 prepass of a native FP8 plan and the plan's arguments.
    fn fp8_prepass_of(&self, plan: &Plan) -> Result<(Fp8PrepassConfig, Fp8Args)> {
        match (&plan.kernel, plan.precision) {
            (KernelId::Native(NativeChoice { prepass: Some(NativeKernelId::Fp8Prepass(c)), .. }), Precision::Fp8 { descale, .. }) => {
                Ok((*c, Fp8Args::new(plan.problem.shape(), descale)))
            }
            _ => Err(super::foreign(plan)),
        }
    }

    /// Bytes of the Vᵀ scratch of a native FP8 plan's family.
    fn fp8_vt_len(&self, plan: &Plan) -> Result<usize> {
        let (_, args) = self.fp8_prepass_of(plan)?;
        match plan.kernel {
            KernelId::Native(NativeChoice { kernel: NativeKernelId::Fp8Wgmma(Fp8WgmmaUnit::Attention(c)), .. }) => Ok(c.required_lens(&args).vt),
            KernelId::Native(NativeChoice { kernel: NativeKernelId::Fp8Mma(Fp8MmaUnit::Fwd(c)), .. }) => Ok(c.required_lens(&args).vt),
            _ => Err(super::foreign(plan)),
        }
    }

    /// Enqueues the FP8 prepass `config` over `args` on `stream`.
    fn launch_fp8_prepass(&self, config: Fp8PrepassConfig, args: &Fp8Args, stream: &Arc<CudaStream>, ptrs: &Fp8PrepassPtrs) -> Result<()> {
        let id = NativeKernelId::Fp8Prepass(config);
        self.ctx.bind_to_thread().map_err(driver("fp8_prepass"))?;
        let kernel = self.load(id)?;
        let Loaded::Fp8Prepass(k) = &*kernel else {
            return Err(Error::Kernel { kernel: id.to_string(), reason: "the registry loaded another family".into() });
        };
        // SAFETY: every buffer was allocated for these arguments (`required_lens`) or checked
        // against them by the caller; the counters are zero (allocated zeroed, left zero by
        // each prepass) and used by this stream only; the launcher checks arguments and alignment.
        unsafe { k.launch_raw(stream, args, ptrs) }.map_err(|e| native_err(&id.to_string(), e))
    }

    /// Loads the kernels (compiling on first use) so a plan that succeeds can run.
    fn native_choice(&self, kernel: NativeKernelId, prepass: Option<NativeKernelId>, blocking: Option<Blocking>) -> std::result::Result<Choice, Reject> {
        self.ctx.bind_to_thread().map_err(|e| Reject::NotApplicable(format!("the CUDA context does not bind: {e}")))?;
        for id in std::iter::once(kernel).chain(prepass) {
            self.load(id).map_err(|e| Reject::NotApplicable(format!("{id} does not load: {e}")))?;
        }
        Ok(Choice { kernel: KernelId::Native(NativeChoice { kernel, prepass, split: None }), blocking })
    }

    /// Prepass buffers for `plan` (allocated on the host-path stream, which is synchronized
    /// once so that any stream may use them).
    fn alloc_int8(&self, plan: &Plan, config: &Int8PrepassConfig) -> Result<Int8Buffers> {
        let lens = config.required_lens(&plan.problem.shape()).map_err(|e| native_err("int8_prepass", e))?;
        let name = plan.kernel_name();
        let e = driver(&name);
        let s = &self.stream;
        // SAFETY (alloc): every buffer but the tickets is written by the prepass before
        // anything reads it; the tickets start at zero.
        let opt = |n: usize| if n == 0 { Ok(None) } else { unsafe { s.alloc::<f32>(n) }.map(Some) };
        let b = Int8Buffers {
            q_codes: unsafe { s.alloc::<u8>(lens.q_codes.max(16)) }.map_err(&e)?,
            k_codes: unsafe { s.alloc::<u8>(lens.k_codes.max(16)) }.map_err(&e)?,
            q_scale: unsafe { s.alloc::<f32>(lens.q_scale.max(4)) }.map_err(&e)?,
            k_scale: unsafe { s.alloc::<f32>(lens.k_scale.max(4)) }.map_err(&e)?,
            mean: opt(lens.mean).map_err(&e)?,
            k_partial: if lens.k_partial == 0 { None } else { Some(unsafe { s.alloc::<f64>(lens.k_partial) }.map_err(&e)?) },
            lse_shift: opt(lens.lse_shift).map_err(&e)?,
            vt_codes: if lens.vt_codes == 0 { None } else { Some(unsafe { s.alloc::<u8>(lens.vt_codes) }.map_err(&e)?) },
            v_scale: opt(lens.v_scale).map_err(&e)?,
            v_inv: opt(lens.v_inv).map_err(&e)?,
            v_partial: opt(lens.v_partial).map_err(&e)?,
            tickets: if lens.tickets == 0 { None } else { Some(s.alloc_zeros::<u32>(lens.tickets).map_err(&e)?) },
            lens,
        };
        s.synchronize().map_err(&e)?;
        Ok(b)
    }

    /// A varlen launch's pointers: the call's buffers and the offsets in `call.tables`
    /// (`cu_seqlens_q` then `cu_seqlens_k`, [`table_words`]).
    fn varlen_ptrs(&self, plan: &Plan, call: &CudaCall) -> Result<VarlenPtrs> {
        if call.tables == 0 {
            return Err(Error::Kernel { kernel: plan.kernel_name(), reason: "a variable-length plan without its offsets on the device".into() });
        }
        let n = plan.problem.batch as u64 + 1;
        Ok(VarlenPtrs { q: call.q, k: call.k, v: call.v, o: call.o, lse: call.lse, cu_seqlens_q: call.tables, cu_seqlens_k: call.tables + 4 * n })
    }

    /// Enqueues the plan's native kernel (after its prepass, for INT8) on `stream` over the
    /// buffers of `call` (LSE required) and `int8`. With `timed`, events bracket the attention
    /// kernel alone (pushed there; nothing waits).
    fn launch_native(
        &self,
        plan: &Plan,
        stream: &Arc<CudaStream>,
        call: &CudaCall,
        int8: Option<&mut Int8Buffers>,
        timed: Option<&mut KernelEvents>,
    ) -> Result<()> {
        let KernelId::Native(choice) = &plan.kernel else { return Err(super::foreign(plan)) };
        self.bind(plan)?;
        let kernel = self.load(choice.kernel)?;
        let p = &plan.problem;
        let shape = p.shape();
        // The name is formatted only for an error: this runs on every call.
        let name = || plan.kernel_name();
        let failed = |e: NativeError| native_err(&name(), e);
        let ptrs5 = [call.q, call.k, call.v, call.o, call.lse];
        // The start event, recorded just before the attention kernel's launch (after the INT8
        // prepass): `record(&mut start)` at each launch site.
        let mut start: Option<CudaEvent> = None;
        let want = timed.is_some();
        let record = |slot: &mut Option<CudaEvent>| -> Result<()> {
            *slot = self.start_event(plan, stream, want)?;
            Ok(())
        };
        match &*kernel {
            Loaded::Hmma(k) if k.config().varlen => {
                let ptrs = self.varlen_ptrs(plan, call)?;
                let shape = varlen_shape(p).ok_or_else(|| Error::Kernel { kernel: name(), reason: "a varlen kernel for a dense problem".into() })?;
                let mods = match k.config().mods {
                    Some(v) => Some(mod_params(&k.config().name(), v, p).map_err(failed)?),
                    None => None,
                };
                record(&mut start)?;
                // SAFETY: as below; the offsets were validated with the plan against the
                // buffers' totals and copied to `call.tables` on this stream.
                unsafe { k.launch_varlen_raw(stream, &shape, mods.as_ref(), &ptrs) }.map_err(failed)?;
            }
            Loaded::Wgmma(k) if k.config().varlen => {
                let ptrs = self.varlen_ptrs(plan, call)?;
                let shape = varlen_shape(p).ok_or_else(|| Error::Kernel { kernel: name(), reason: "a varlen kernel for a dense problem".into() })?;
                let mods = match k.config().mods {
                    Some(v) => Some(mod_params(&k.config().name(), v, p).map_err(failed)?),
                    None => None,
                };
                record(&mut start)?;
                // SAFETY: as for the HMMA varlen variant.
                unsafe { k.launch_varlen_raw(stream, &shape, mods.as_ref(), &ptrs) }.map_err(failed)?;
            }
            Loaded::Hmma(k) => {
                let mods = match k.config().mods {
                    Some(v) => Some(mod_params(&k.config().name(), v, p).map_err(failed)?),
                    None => None,
                };
                record(&mut start)?;
                // SAFETY: the caller's buffers were checked against the problem's extents
                // (`Session::run_cuda`) or allocated for it (upload); the launcher checks
                // the arguments, alignment and lengths it can see.
                unsafe { k.launch_raw(stream, &shape, mods.as_ref(), ptrs5) }.map_err(failed)?;
            }
            Loaded::Wgmma(k) => {
                let mods = match k.config().mods {
                    Some(v) => Some(mod_params(&k.config().name(), v, p).map_err(failed)?),
                    None => None,
                };
                record(&mut start)?;
                // SAFETY: as above.
                unsafe { k.launch_raw(stream, &shape, mods.as_ref(), ptrs5) }.map_err(failed)?;
            }
            Loaded::Decode(k) => {
                let Some(split) = choice.split else {
                    return Err(Error::Kernel { kernel: name(), reason: "a decode plan without its split".into() });
                };
                let (part_o, part_lse, counters) = match split.partial_lens(&shape) {
                    (0, 0) => (0, 0, 0),
                    (o, lse) => self.decode_partials(plan, stream, (o, lse, k.config().counters_len(&shape)))?,
                };
                let mods = match k.config().mods {
                    Some(v) => Some(mod_params(&k.config().name(), v, p).map_err(failed)?),
                    None => None,
                };
                let mut ptrs = DecodePtrs { q: call.q, k: call.k, v: call.v, o: call.o, lse: call.lse, part_o, part_lse, counters, ..Default::default() };
                match (&p.paged, k.config().paged) {
                    (Some(pg), true) if call.tables != 0 => {
                        ptrs.block_table = call.tables;
                        ptrs.seq_lens = call.tables + 4 * pg.block_table.len() as u64;
                        let geometry = PagedArgs { page_size: pg.page_size as u32, max_pages: pg.max_pages as u32, num_pages: pg.num_pages as u32 };
                        record(&mut start)?;
                        // SAFETY: as above; the table and lengths were validated with the plan
                        // (every entry a sequence reads is a page of the pool) and copied to
                        // `call.tables` on this stream.
                        unsafe { k.launch_paged_raw(stream, &shape, mods.as_ref(), geometry, split, &ptrs) }.map_err(failed)?;
                    }
                    (None, false) => {
                        record(&mut start)?;
                        // SAFETY: as above; the partial buffers hold `partial_lens` elements.
                        unsafe { k.launch_raw(stream, &shape, mods.as_ref(), split, &ptrs) }.map_err(failed)?;
                    }
                    _ => return Err(Error::Kernel { kernel: name(), reason: "a paged problem without its block table, or a paged kernel for strided K/V".into() }),
                }
            }
            Loaded::Int8Imma(_) | Loaded::Int8Wgmma(_) | Loaded::Int8Umma(_) => {
                let (Some(prepass_id), Some(b)) = (choice.prepass, int8) else {
                    return Err(Error::Kernel { kernel: name(), reason: "an INT8 plan without its prepass buffers".into() });
                };
                let prepass = self.load(prepass_id)?;
                let Loaded::Int8Prepass(prepass) = &*prepass else { return Err(super::foreign(plan)) };
                let ps = stream;
                let (q_codes, k_codes) = (b.q_codes.device_ptr_mut(ps).0, b.k_codes.device_ptr_mut(ps).0);
                let mut addr = |x: &mut CudaSlice<f32>| x.device_ptr_mut(ps).0;
                let (q_scale, k_scale) = (addr(&mut b.q_scale), addr(&mut b.k_scale));
                let mut opt = |x: &mut Option<CudaSlice<f32>>| x.as_mut().map(&mut addr).unwrap_or(0);
                let (mean, lse_shift) = (opt(&mut b.mean), opt(&mut b.lse_shift));
                let (v_scale, v_inv, v_partial) = (opt(&mut b.v_scale), opt(&mut b.v_inv), opt(&mut b.v_partial));
                let k_partial = b.k_partial.as_mut().map(|x| x.device_ptr_mut(ps).0).unwrap_or(0);
                let vt_codes = b.vt_codes.as_mut().map(|x| x.device_ptr_mut(ps).0).unwrap_or(0);
                let tickets = b.tickets.as_mut().map(|x| x.device_ptr_mut(ps).0).unwrap_or(0);
                let v = if vt_codes != 0 { call.v } else { 0 };
                let pre = PrepassPtrs {
                    q: call.q, k: call.k, v, q_codes, k_codes, vt_codes, q_scale, k_scale, mean, k_partial, v_scale, v_inv, v_partial,
                    tickets, lse_shift,
                };
                // SAFETY: Q, K and V cover the problem (checked or allocated for it); the outputs
                // were allocated for this problem and config (`Int8PrepassConfig::required_lens`).
                unsafe { prepass.launch_raw(stream, &shape, &pre) }.map_err(|e| native_err("int8_prepass", e))?;
                record(&mut start)?;
                let args = Int8Args { shape, lse_shift: lse_shift != 0 };
                let ptrs = Int8Ptrs { q: q_codes, k: k_codes, v: call.v, o: call.o, lse: call.lse, q_scale, k_scale, lse_shift };
                // SAFETY: as above; the launchers check arguments, alignment and non-null pointers.
                match &*kernel {
                    Loaded::Int8Imma(k) => unsafe { k.launch_raw(stream, &args, &ptrs) },
                    // e4m3 P·V reads the prepass's Vᵀ codes and V scales instead of V.
                    Loaded::Int8Wgmma(k) if k.config().pv_fp8() => unsafe { k.launch_fp8_raw(stream, &args, &Int8Ptrs { v: vt_codes, ..ptrs }, v_scale) },
                    Loaded::Int8Wgmma(k) => unsafe { k.launch_raw(stream, &args, &ptrs) },
                    Loaded::Int8Umma(k) => {
                        let a = [ptrs.q, ptrs.k, ptrs.v, ptrs.o, ptrs.lse, ptrs.q_scale, ptrs.k_scale, ptrs.lse_shift];
                        unsafe { k.launch_raw(stream, &args, a) }
                    }
                    _ => unreachable_kernel(),
                }
                .map_err(failed)?;
            }
            Loaded::Fp8Wgmma(_) | Loaded::Fp8Mma(_) => {
                return Err(Error::Kernel { kernel: name(), reason: "an FP8 plan launched without its code buffers".into() });
            }
            Loaded::Nvfp4(_) => {
                return Err(Error::Kernel {
                    kernel: name(),
                    reason: "the native NVFP4 family runs through the host path only (Session::run); device tensors run the portable 4-bit kernel".into(),
                })
            }
            Loaded::Int8Prepass(_) | Loaded::Fp8Prepass(_) | Loaded::Nvfp4Quant(_) => return Err(super::foreign(plan)),
        }
        self.end_event(plan, stream, start, timed)
    }

    /// The device-tensor path: `plan` on caller memory, enqueued on the caller's stream. FP8
    /// plans take f16 Q, K and V here and quantize them with the device prepass into the
    /// stream's scratch.
    pub(crate) fn run_raw(&self, plan: &Plan, stream: &Arc<CudaStream>, call: &CudaCall) -> Result<()> {
        let KernelId::Native(choice) = &plan.kernel else {
            return Err(Error::WrongDevice {
                tensor: crate::TensorName::Q,
                expected: format!("CubeCL handles: plan {} runs a portable CubeCL kernel (use Session::run_cubecl)", plan.kernel_name()),
                got: "CUDA memory".into(),
            });
        };
        self.check_stream(stream)?;
        self.bind(plan)?;
        let mut scratch = self.scratch.lock().map_err(|_| Error::Kernel { kernel: plan.kernel_name(), reason: "scratch lock poisoned".into() })?;
        let s = scratch.entry(stream.cu_stream() as usize).or_default();
        let mut call = *call;
        if call.lse == 0 {
            call.lse = self.lse_scratch(plan, stream, s)?;
        }
        if let Some(key) = TableKey::of(&plan.problem) {
            call.tables = self.stream_tables(plan, stream, s, key)?;
        }
        if matches!(plan.precision, Precision::Fp8 { .. }) {
            let (config, args) = self.fp8_prepass_of(plan)?;
            let need = config.required_lens(&args);
            let f = &mut s.fp8;
            for (slot, n) in f.codes.iter_mut().zip([need.q, need.k, need.v]) {
                self.grow(slot, n.max(16))?;
            }
            for (slot, n) in f.descales.iter_mut().zip([need.q_descale, need.kv_descale, need.kv_descale]) {
                self.grow(slot, n.max(1))?;
            }
            self.grow(&mut f.partial, need.partial.max(1))?;
            self.grow(&mut f.counter, need.counter.max(1))?;
            self.grow(&mut f.vt, self.fp8_vt_len(plan)?.max(16))?;
            let addr8 = |x: &mut Option<CudaSlice<u8>>| x.as_mut().map_or(0, |x| x.device_ptr_mut(stream).0);
            let addr32 = |x: &mut Option<CudaSlice<f32>>| x.as_mut().map_or(0, |x| x.device_ptr_mut(stream).0);
            let [qc, kc, vc] = &mut f.codes;
            let [qd, kd, vd] = &mut f.descales;
            let ptrs = Fp8Ptrs {
                q: addr8(qc),
                k: addr8(kc),
                v: addr8(vc),
                vt: addr8(&mut f.vt),
                o: call.o,
                lse: call.lse,
                q_descale: addr32(qd),
                k_descale: addr32(kd),
                v_descale: addr32(vd),
            };
            let pre = Fp8PrepassPtrs {
                q: call.q,
                k: call.k,
                v: call.v,
                q_codes: ptrs.q,
                k_codes: ptrs.k,
                v_codes: ptrs.v,
                q_descale: ptrs.q_descale,
                k_descale: ptrs.k_descale,
                v_descale: ptrs.v_descale,
                partial: addr32(&mut f.partial),
                counter: f.counter.as_mut().map_or(0, |x| x.device_ptr_mut(stream).0),
            };
            self.launch_fp8_prepass(config, &args, stream, &pre)?;
            return self.launch_fp8(plan, stream, &ptrs, true, None);
        }
        if let Some(NativeKernelId::Int8Prepass(config)) = choice.prepass {
            let need = config.required_lens(&plan.problem.shape()).map_err(|e| native_err("int8_prepass", e))?;
            if s.int8.as_ref().is_none_or(|b| !b.lens.covers(&need)) {
                s.int8 = Some(self.alloc_int8(plan, &config)?);
            }
        }
        self.launch_native(plan, stream, &call, s.int8.as_mut(), None)
    }

    /// A native FP8 plan on caller-held codes and descales (`ptrs.vt` ignored: the stream's
    /// Vᵀ scratch; `ptrs.lse` 0: the stream's LSE scratch), on the caller's stream.
    pub(crate) fn run_raw_fp8(&self, plan: &Plan, stream: &Arc<CudaStream>, ptrs: &Fp8Ptrs) -> Result<()> {
        self.fp8_prepass_of(plan)?;
        self.check_stream(stream)?;
        self.bind(plan)?;
        let mut scratch = self.scratch.lock().map_err(|_| Error::Kernel { kernel: plan.kernel_name(), reason: "scratch lock poisoned".into() })?;
        let s = scratch.entry(stream.cu_stream() as usize).or_default();
        let mut ptrs = *ptrs;
        if ptrs.lse == 0 {
            ptrs.lse = self.lse_scratch(plan, stream, s)?;
        }
        self.grow(&mut s.fp8.vt, self.fp8_vt_len(plan)?.max(16))?;
        ptrs.vt = s.fp8.vt.as_mut().map_or(0, |x| x.device_ptr_mut(stream).0);
        self.launch_fp8(plan, stream, &ptrs, true, None)
    }

    /// The FP8 prepass `config` over `args` on caller memory (`ptrs.partial` and
    /// `ptrs.counter` ignored: the stream's scratch), on the caller's stream.
    pub(crate) fn quantize_raw(&self, config: Fp8PrepassConfig, args: &Fp8Args, stream: &Arc<CudaStream>, ptrs: &Fp8PrepassPtrs) -> Result<()> {
        self.check_stream(stream)?;
        self.ctx.bind_to_thread().map_err(driver("fp8_prepass"))?;
        config.validate_args(args).map_err(|e| native_err("fp8_prepass", e))?;
        let need = config.required_lens(args);
        let mut scratch = self.scratch.lock().map_err(|_| Error::Kernel { kernel: "fp8_prepass".into(), reason: "scratch lock poisoned".into() })?;
        let f = &mut scratch.entry(stream.cu_stream() as usize).or_default().fp8;
        self.grow(&mut f.partial, need.partial.max(1))?;
        self.grow(&mut f.counter, need.counter.max(1))?;
        let mut ptrs = *ptrs;
        ptrs.partial = f.partial.as_mut().map_or(0, |x| x.device_ptr_mut(stream).0);
        ptrs.counter = f.counter.as_mut().map_or(0, |x| x.device_ptr_mut(stream).0);
        self.launch_fp8_prepass(config, args, stream, &ptrs)
    }

    /// A stream of the session's device (its primary context), or a typed error.
    fn check_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::WrongDevice {
                tensor: crate::TensorName::Q,
                expected: format!("a stream of CUDA device {}'s primary context", self.ctx.ordinal()),
                got: format!("a stream of device {}'s context {:?}", stream.context().ordinal(), stream.context().cu_ctx()),
            });
        }
        Ok(())
    }

    /// The stream's LSE scratch, grown to the plan's LSE: for kernels that always write one.
    fn lse_scratch(&self, plan: &Plan, stream: &Arc<CudaStream>, s: &mut Scratch) -> Result<u64> {
        self.grow(&mut s.lse, plan.problem.lse_len_elems().max(1))?;
        Ok(s.lse.as_mut().map_or(0, |l| l.device_ptr_mut(stream).0))
    }

    /// The device address of `key`'s tables in `stream`'s scratch. The tables are host data of
    /// the plan, copied on the caller's stream before the launch that reads them, and only when
    /// the scratch does not hold them already ([`TableCache`]): a launch enqueued earlier on this
    /// stream reads the words it was given, since any copy that replaces them is ordered after
    /// it, and other streams have their own scratch.
    fn stream_tables(&self, plan: &Plan, stream: &Arc<CudaStream>, s: &mut Scratch, key: TableKey) -> Result<u64> {
        let capacity = s.tables.as_ref().map_or(0, |b| b.len());
        let from = match s.held_tables.upload(&key, capacity) {
            Upload::Nothing => None,
            Upload::Tail { from } => Some(from),
            Upload::All => Some(0),
            Upload::Grow => {
                self.grow(&mut s.tables, key.len())?;
                Some(0)
            }
        };
        let buf = s.tables.as_mut().ok_or_else(|| Error::Kernel { kernel: plan.kernel_name(), reason: "table scratch missing".into() })?;
        if let Some(from) = from {
            s.held_tables.forget();
            let words = key.words_from(from);
            stream.memcpy_htod(&words, &mut buf.slice_mut(from..key.len())).map_err(driver_of(plan))?;
            s.held_tables.hold(key);
        }
        Ok(buf.device_ptr_mut(stream).0)
    }

    /// Replaces `slot` by a zeroed buffer of `n` elements unless it holds at least that many.
    /// Allocated on the host-path stream, which is synchronized once so that any stream may use
    /// the buffer.
    fn grow<T: DeviceRepr + ValidAsZeroBits>(&self, slot: &mut Option<CudaSlice<T>>, n: usize) -> Result<()> {
        if slot.as_ref().is_none_or(|x| x.len() < n) {
            let e = driver("scratch");
            *slot = Some(self.stream.alloc_zeros::<T>(n).map_err(&e)?);
            self.stream.synchronize().map_err(&e)?;
        }
        Ok(())
    }

    fn native_data<'a>(&self, plan: &Plan, data: &'a mut ResidentData) -> Result<&'a mut NativeData> {
        data.downcast_mut::<NativeData>().ok_or_else(|| super::foreign(plan))
    }

    fn execute_native(&self, plan: &Plan, data: &mut ResidentData, timed: Option<&mut KernelEvents>) -> Result<()> {
        let d = self.native_data(plan, data)?;
        let stream = self.stream.clone();
        let (o, lse) = (d.o.device_ptr_mut(&stream).0, d.lse.device_ptr_mut(&stream).0);
        match &mut d.inputs {
            NativeInputs::Float { q, k, v, int8, tables } => {
                let tables = tables.as_mut().map_or(0, |x| x.device_ptr_mut(&stream).0);
                let call = CudaCall { q: q.device_ptr_mut(&stream).0, k: k.device_ptr_mut(&stream).0, v: v.device_ptr_mut(&stream).0, o, lse, tables };
                self.launch_native(plan, &stream, &call, int8.as_mut(), timed)
            }
            NativeInputs::Fp8(b) => {
                let ptrs = b.ptrs(&stream, o, lse);
                self.launch_fp8(plan, &stream, &ptrs, false, timed)
            }
            NativeInputs::Nvfp4(b) => self.launch_nvfp4(plan, &stream, b, o, lse, timed),
        }
    }

    /// The loaded kernel of an FP8 plan (context bound) and its launch arguments.
    fn fp8_kernel(&self, plan: &Plan) -> Result<(Arc<Loaded>, Fp8Args)> {
        let (KernelId::Native(choice), Precision::Fp8 { descale, .. }) = (&plan.kernel, plan.precision) else {
            return Err(super::foreign(plan));
        };
        self.bind(plan)?;
        Ok((self.load(choice.kernel)?, Fp8Args::new(plan.problem.shape(), descale)))
    }

    /// The family's Vᵀ prepass of `ptrs.v` into `ptrs.vt`, on `stream`.
    fn launch_fp8_vt(&self, plan: &Plan, stream: &Arc<CudaStream>, ptrs: &Fp8Ptrs) -> Result<()> {
        let (kernel, args) = self.fp8_kernel(plan)?;
        // SAFETY: V and Vᵀ were allocated for this problem and config or checked against it;
        // the launchers check the arguments and alignment.
        match &*kernel {
            Loaded::Fp8Wgmma(k8) => unsafe { k8.launch_prepass_raw(stream, &args, ptrs.v, ptrs.vt) },
            Loaded::Fp8Mma(k8) => unsafe { k8.launch_vt_raw(stream, &args, ptrs) },
            _ => return Err(super::foreign(plan)),
        }
        .map_err(|e| native_err(&plan.kernel_name(), e))
    }

    /// Enqueues an FP8 plan's attention kernel on `stream` over `ptrs` (codes, descales, Vᵀ, O,
    /// LSE), after the family's Vᵀ prepass of `ptrs.v` when `vt` is set (V changes per call;
    /// resident data wrote Vᵀ at upload). With `timed`, events bracket the attention kernel
    /// alone (pushed there; nothing waits).
    fn launch_fp8(&self, plan: &Plan, stream: &Arc<CudaStream>, ptrs: &Fp8Ptrs, vt: bool, timed: Option<&mut KernelEvents>) -> Result<()> {
        if vt {
            self.launch_fp8_vt(plan, stream, ptrs)?;
        }
        let (kernel, args) = self.fp8_kernel(plan)?;
        let failed = |e: NativeError| native_err(&plan.kernel_name(), e);
        let start = self.start_event(plan, stream, timed.is_some())?;
        // SAFETY: the buffers were allocated for this problem and config (`alloc_fp8`, Vᵀ of
        // `required_lens`) or checked against it (the device-tensor entry points), Vᵀ written by
        // the family's prepass of this V; the launchers check the arguments and alignment.
        match &*kernel {
            Loaded::Fp8Wgmma(k8) => unsafe { k8.launch_attention_raw(stream, &args, ptrs) },
            Loaded::Fp8Mma(k8) => unsafe { k8.launch_fwd_raw(stream, &args, ptrs) },
            _ => return Err(super::foreign(plan)),
        }
        .map_err(failed)?;
        self.end_event(plan, stream, start, timed)
    }
}

fn unreachable_kernel() -> std::result::Result<(), NativeError> {
    Err(NativeError::InvalidArgs("not an INT8 kernel".into()))
}

/// Start and end events around each timed kernel launch.
type KernelEvents = Vec<(CudaEvent, CudaEvent)>;

/// A driver error of `plan`'s kernel, its name formatted only when there is one.
fn driver_of(plan: &Plan) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Kernel { kernel: plan.kernel_name(), reason: e.to_string() }
}

fn driver(kernel: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Kernel { kernel: kernel.to_string(), reason: e.to_string() }
}

/// The host values as the 16-bit bits of `dtype`; values already of that type pass through.
fn bits(x: HostSlice<'_>, dtype: Dtype) -> Vec<u16> {
    match (x, dtype) {
        (HostSlice::Bf16(s), Dtype::Bf16) => bytemuck::cast_slice(s).to_vec(),
        (HostSlice::F32(s), Dtype::Bf16) => s.iter().map(|&a| bf16::from_f32(a).to_bits()).collect(),
        (HostSlice::F16(s), Dtype::Bf16) => s.iter().map(|&a| bf16::from_f32(a.to_f32()).to_bits()).collect(),
        // The native kernels read f16 otherwise.
        (HostSlice::F16(s), _) => bytemuck::cast_slice(s).to_vec(),
        (HostSlice::F32(s), _) => s.iter().map(|&a| f16::from_f32(a).to_bits()).collect(),
        (HostSlice::Bf16(s), _) => s.iter().map(|&a| f16::from_f32(a.to_f32()).to_bits()).collect(),
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> DeviceInfo {
        self.portable.info()
    }

    fn plan(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<Planned> {
        let device = format!("cuda ({})", self.info().adapter);
        registry::walk(&table(), self, &device, problem, precision, strategy)
    }

    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        let KernelId::Native(choice) = &plan.kernel else {
            return self.portable.upload(plan, q, k, v);
        };
        let p = &plan.problem;
        self.bind(plan)?;
        let e = driver_of(plan);
        let s = &self.stream;
        if matches!(choice.kernel, NativeKernelId::Nvfp4(_)) {
            return self.upload_nvfp4(plan, choice, q, k, v);
        }
        let dtype = plan.dtype();
        let int8 = match choice.prepass {
            Some(NativeKernelId::Int8Prepass(config)) => Some(self.alloc_int8(plan, &config)?),
            _ => None,
        };
        let mut o = s.alloc_zeros::<u16>(p.o_len_elems()).map_err(&e)?;
        let mut lse = s.alloc_zeros::<f32>(p.lse_len_elems().max(1)).map_err(&e)?;
        if matches!(plan.precision, Precision::Fp8 { .. }) {
            let fp8 = self.upload_fp8(plan, [q, k, v], o.device_ptr_mut(s).0, lse.device_ptr_mut(s).0)?;
            return Ok(Box::new(NativeData { o, lse, inputs: NativeInputs::Fp8(fp8) }));
        }
        Ok(Box::new(NativeData {
            o,
            lse,
            inputs: NativeInputs::Float {
                q: s.clone_htod(&bits(q, dtype)).map_err(&e)?,
                k: s.clone_htod(&bits(k, dtype)).map_err(&e)?,
                v: s.clone_htod(&bits(v, dtype)).map_err(&e)?,
                int8,
                tables: table_words(p).map(|w| s.clone_htod(&w)).transpose().map_err(&e)?,
            },
        }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        match plan.kernel {
            KernelId::Native(_) => self.execute_native(plan, data, None),
            _ => self.portable.execute(plan, data),
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver("synchronize"))?;
        self.stream.synchronize().map_err(driver("synchronize"))?;
        self.portable.synchronize()
    }

    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let KernelId::Native(_) = plan.kernel else {
            return self.portable.download(plan, data);
        };
        let d = data.downcast_ref::<NativeData>().ok_or_else(|| super::foreign(plan))?;
        self.bind(plan)?;
        let e = driver_of(plan);
        let o = self.stream.clone_dtoh(&d.o).map_err(&e)?;
        let o = match plan.dtype() {
            Dtype::Bf16 => o.into_iter().map(|b| bf16::from_bits(b).to_f32()).collect(),
            _ => o.into_iter().map(|b| f16::from_bits(b).to_f32()).collect(),
        };
        let lse = if plan.problem.return_lse { Some(self.stream.clone_dtoh(&d.lse).map_err(&e)?[..plan.problem.lse_len_elems()].to_vec()) } else { None };
        Ok((o, lse))
    }

    fn time_kernel(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Option<Vec<f64>>> {
        match &plan.kernel {
            // The INT8 prepass runs before the kernel at every execution. (FP8 plans quantize
            // and transpose V at upload: their executions are the attention kernel alone.)
            KernelId::Native(NativeChoice { prepass: Some(_), .. }) if !matches!(plan.precision, Precision::Fp8 { .. }) => {}
            _ => return Ok(None),
        }
        for _ in 0..warmup {
            self.execute_native(plan, data, None)?;
        }
        // As `time`: calls queued back to back, the kernel of each between its own events, and
        // one wait at the end (a wait after every call left the GPU idle between kernels).
        let mut events = KernelEvents::with_capacity(iters);
        for _ in 0..iters {
            self.execute_native(plan, data, Some(&mut events))?;
        }
        self.elapsed_ms(plan, &events).map(Some)
    }

    fn int8_operands(&self, plan: &Plan, data: &ResidentData) -> Result<Option<Int8Operands>> {
        let Some(NativeData { inputs: NativeInputs::Float { int8: Some(b), .. }, .. }) = data.downcast_ref::<NativeData>() else {
            return Ok(None);
        };
        self.bind(plan)?;
        let e = driver_of(plan);
        let s = &self.stream;
        s.synchronize().map_err(&e)?;
        let lens = &b.lens;
        let codes = |x: &CudaSlice<u8>, n: usize| -> Result<Vec<i8>> { Ok(s.clone_dtoh(x).map_err(&e)?[..n].iter().map(|&c| c as i8).collect()) };
        let floats = |x: &CudaSlice<f32>, n: usize| -> Result<Vec<f32>> { Ok(s.clone_dtoh(x).map_err(&e)?[..n].to_vec()) };
        let v = match (&b.vt_codes, &b.v_scale) {
            (Some(vt), Some(vs)) => {
                // Vᵀ [b, kv_heads, d, kv_pad] with the kernel's key permutation, back to dense
                // [b, kv_heads, kv_len, d]; the padding past kv_len must be zero.
                let p = &plan.problem;
                let (d, n) = (p.head_dim, p.kv_len);
                let pad = Int8PrepassConfig::kv_pad(&p.shape());
                let raw = s.clone_dtoh(vt).map_err(&e)?;
                let mut codes = vec![0u8; p.batch * p.kv_heads * n * d];
                let mut padding_nonzero = 0;
                for bh in 0..p.batch * p.kv_heads {
                    for c in 0..d {
                        let row = &raw[(bh * d + c) * pad..][..pad];
                        for (col, &x) in row.iter().enumerate() {
                            let key = quattn_native::vt_key(col);
                            if key < n {
                                codes[(bh * n + key) * d + c] = x;
                            } else {
                                padding_nonzero += (x != 0) as usize;
                            }
                        }
                    }
                }
                Some(E4m3VOperands { codes, scales: floats(vs, lens.v_scale)?, padding_nonzero })
            }
            _ => None,
        };
        Ok(Some(Int8Operands {
            q_codes: codes(&b.q_codes, lens.q_codes)?,
            q_scales: floats(&b.q_scale, lens.q_scale)?,
            k_codes: codes(&b.k_codes, lens.k_codes)?,
            k_scales: floats(&b.k_scale, lens.k_scale)?,
            k_mean: b.mean.as_ref().map(|m| floats(m, lens.mean)).transpose()?,
            lse_shift: b.lse_shift.as_ref().map(|m| floats(m, lens.lse_shift)).transpose()?,
            v,
        }))
    }

    fn fp8_operands(&self, plan: &Plan, data: &ResidentData) -> Result<Option<Fp8Operands>> {
        let (Some(NativeData { inputs: NativeInputs::Fp8(b), .. }), Precision::Fp8 { format, descale, .. }) = (data.downcast_ref::<NativeData>(), plan.precision) else {
            return Ok(None);
        };
        self.bind(plan)?;
        let e = driver_of(plan);
        let s = &self.stream;
        s.synchronize().map_err(&e)?;
        let p = &plan.problem;
        let tensor = |codes: &CudaSlice<u8>, descales: &CudaSlice<f32>, heads: usize, len: usize, elems: usize| -> Result<Fp8Tensor> {
            let layout = DescaleLayout { granularity: descale, batch: p.batch, heads, len, block_rows: 1 };
            Ok(Fp8Tensor {
                format,
                codes: s.clone_dtoh(codes).map_err(&e)?[..elems].to_vec(),
                descales: s.clone_dtoh(descales).map_err(&e)?[..layout.count()].to_vec(),
                layout,
            })
        };
        Ok(Some(Fp8Operands {
            q: tensor(&b.q, &b.q_descale, p.q_heads, p.q_len, p.q_len_elems())?,
            k: tensor(&b.k, &b.k_descale, p.kv_heads, p.kv_len, p.k_len_elems())?,
            v: tensor(&b.v, &b.v_descale, p.kv_heads, p.kv_len, p.v_len_elems())?,
        }))
    }

    fn time(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        // End to end on the device clock: for INT8, the prepass and the kernel.
        let KernelId::Native(_) = plan.kernel else {
            return self.portable.time(plan, data, warmup, iters);
        };
        for _ in 0..warmup {
            self.execute(plan, data)?;
        }
        self.bind(plan)?;
        // Calls queue back to back, each between its own events, and the host waits once at the
        // end (as the torch peers are timed): a call's time is the device's, not the host's
        // enqueue after an idle device (the bench reports that apart).
        let mut events = KernelEvents::with_capacity(iters);
        for _ in 0..iters {
            let start = self.recorded_event(plan, &self.stream)?;
            self.execute(plan, data)?;
            events.push((start, self.recorded_event(plan, &self.stream)?));
        }
        self.elapsed_ms(plan, &events)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn cubecl(&self) -> Option<&dyn std::any::Any> {
        Some(&self.portable)
    }

    /// CubeCL handles: portable plans launch on them as they are; native plans run on their
    /// memory on the native stream, ordered after CubeCL's stream (which wrote them) by a
    /// synchronization, and before CubeCL reads O by the same.
    fn run_handles(&self, plan: &Plan, t: &CubeclTensors<'_>) -> Result<()> {
        if !matches!(plan.kernel, KernelId::Native(_)) {
            // An LSE handle is written only when the problem asks for the LSE.
        let lse = if plan.problem.return_lse { t.lse.cloned() } else { None };
        let varlen = self.portable.held_varlen(plan)?;
        let d = GpuData { q: t.q.clone(), k: t.k.clone(), v: t.v.clone(), o: t.o.clone(), lse, descales: None, fp4: None, varlen };
            return self.portable.launch(plan, &d);
        }
        let ptr = |h: &cubecl::server::Handle| self.portable.device_ptr(h);
        let call = CudaCall { q: ptr(t.q)?, k: ptr(t.k)?, v: ptr(t.v)?, o: ptr(t.o)?, lse: t.lse.map(ptr).transpose()?.unwrap_or(0), tables: 0 };
        self.portable.synchronize()?;
        let stream = self.stream.clone();
        self.run_raw(plan, &stream, &call)?;
        self.stream.synchronize().map_err(driver(&plan.kernel_name()))
    }
}

/// What the native NVFP4 family would run for a problem: the sm_120a attention variant and the
/// quantization prepasses that feed it (Q and K along the head dim; V's transpose for FP4 P·V).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nvfp4Native {
    pub kernel: quattn_native::nvfp4::Nvfp4Config,
    pub qk_prepass: quattn_native::nvfp4_quant::Nvfp4QuantConfig,
    pub vt_prepass: Option<quattn_native::nvfp4_quant::Nvfp4QuantConfig>,
}

/// The dispatch decision of the native NVFP4 family on a device of compute capability `cc`,
/// without a device: compute capability 12.0 only (the block-scaled `mma.sync` exists on
/// sm_120a), NVFP4 Q/K only (MXFP4 is a typed refusal that Auto passes over to the portable
/// 4-bit row), unsmoothed K (the kernel has no LSE shift; the portable 4-bit kernel smooths),
/// head dims the kernel was built for, and shapes its launcher and the prepass accept. V in
/// bf16 runs the bf16 HMMA P·V with the conditional rescale; V in NVFP4 the block-scaled P·V
/// (no rescale: P's fixed tensor scale needs p ≤ 1) on f16 inputs, as `input_dtype` says. NVFP4
/// V with f16 P (`Nvfp4V::Nvfp4P16`) has no variant of the kernel: a typed refusal that Auto
/// passes over to the portable 4-bit row.
pub(crate) fn nvfp4_native_decision(
    cc: (u32, u32),
    problem: &AttentionProblem,
    precision: Precision,
) -> std::result::Result<Nvfp4Native, Reject> {
    use quattn_native::nvfp4::{Nvfp4Config, PvMode};
    use quattn_native::nvfp4_quant::{Fp4Format, Nvfp4QuantConfig};
    if let Precision::Mxfp4 { .. } = precision {
        return Err(Reject::Refused(Error::UnsupportedPrecision {
            precision,
            device: format!("CUDA compute capability {}.{}", cc.0, cc.1),
            reason: "no native MXFP4 attention kernel: the block-scaled kernel (fwd_nvfp4_*) takes NVFP4 Q/K only; \
                     the portable 4-bit kernel (Strategy::Portable, Auto's next 4-bit row) runs MXFP4"
                .into(),
        }));
    }
    let Precision::Nvfp4 { v, smooth_k } = precision else {
        return not_applicable(format!("the native NVFP4 kernel computes NVFP4 Q/K, not {precision}"));
    };
    let (pv, rescale) = match v {
        crate::Nvfp4V::Bf16 => (PvMode::Half { bf16: true }, true),
        crate::Nvfp4V::Nvfp4 => (PvMode::Fp4, false),
        crate::Nvfp4V::Nvfp4P16 => {
            return Err(Reject::Refused(Error::UnsupportedPrecision {
                precision,
                device: format!("CUDA compute capability {}.{}", cc.0, cc.1),
                reason: "no native kernel for NVFP4 V with f16 P: the block-scaled kernel (fwd_nvfp4_*) takes bf16 V and P \
                         or NVFP4 V and P; the portable 4-bit kernel (Strategy::Portable, Auto's next 4-bit row) runs it"
                    .into(),
            }))
        }
    };
    if !Nvfp4Config::supported(cc) {
        return not_applicable(format!(
            "the block-scaled NVFP4 kernel needs compute capability 12.0 (sm_120a), this device is {}.{}",
            cc.0, cc.1
        ));
    }
    if smooth_k {
        return not_applicable("the sm_120a NVFP4 kernel does not smooth K (no LSE shift); the portable 4-bit kernel does");
    }
    let na = |e: quattn_native::NativeError| Reject::NotApplicable(e.to_string());
    let kernel = Nvfp4Config::new(problem.head_dim, pv, rescale, 0).map_err(na)?;
    let shape = problem.shape();
    kernel.validate_args(&shape).map_err(na)?;
    let dtype = precision.input_dtype();
    let qk_prepass = Nvfp4QuantConfig::new(problem.head_dim, Fp4Format::Nvfp4, dtype).map_err(na)?;
    qk_prepass.validate_source(problem.batch, problem.q_heads, problem.q_len, &shape.q).map_err(na)?;
    qk_prepass.validate_source(problem.batch, problem.kv_heads, problem.kv_len, &shape.k).map_err(na)?;
    let vt_prepass = match pv {
        PvMode::Fp4 => {
            let vt = qk_prepass.transposed();
            vt.validate_source(problem.batch, problem.kv_heads, problem.kv_len, &shape.v).map_err(na)?;
            Some(vt)
        }
        PvMode::Half { .. } => None,
    };
    Ok(Nvfp4Native { kernel, qk_prepass, vt_prepass })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Nvfp4V;

    /// Auto on a CUDA device with tensors above 2^31 elements: the size gate of the walk
    /// (applied before each row's capability test, which needs a device and is stood in for by
    /// one that accepts) passes over split-KV decode and lands on the first 64-bit family:
    /// wgmma, or HMMA where the wgmma row does not apply (not compute capability 9.0). The
    /// f16 HMMA and wgmma configs take these shapes (their argument checks need no device).
    #[test]
    fn auto_takes_a_64_bit_family_for_tensors_above_2_pow_31_elements() {
        fn accept(_: &(), p: &AttentionProblem, _: Precision) -> std::result::Result<Choice, Reject> {
            Ok(Choice { kernel: KernelId::Cpu { dtype: Dtype::F16, head_dim: p.head_dim }, blocking: None })
        }
        let families: Vec<Family> = table().iter().map(|r| r.family).collect();
        let rows = |skip: Option<Family>| -> Vec<Row<()>> {
            families.iter().filter(|&&f| Some(f) != skip).map(|&f| Row { family: f, test: accept }).collect()
        };
        let wide = |f: Family| f.max_tensor_elems() > crate::problem::MAX_TENSOR_ELEMS_32BIT;
        assert_eq!(
            families.iter().copied().filter(|&f| wide(f)).collect::<Vec<_>>(),
            vec![Family::Native(NativeKind::Wgmma), Family::Native(NativeKind::Hmma)]
        );
        let prefill = AttentionProblem::new(1, 32, 600_000, 128).kv_heads(8).kv_len(256);
        let decode = AttentionProblem::new(1, 32, 1, 128).kv_heads(8).kv_len(2_200_000).layout(crate::Layout::Bshd);
        for p in [&prefill, &decode] {
            for (skip, want) in [(None, NativeKind::Wgmma), (Some(Family::Native(NativeKind::Wgmma)), NativeKind::Hmma)] {
                let table = rows(skip);
                let planned = registry::walk(&table, &(), "cuda", p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
                let chosen = table[planned.rejected.len()].family;
                assert_eq!(chosen, Family::Native(want));
                assert_eq!(planned.rejected.iter().map(|r| r.0).collect::<Vec<_>>(), vec![Family::Native(NativeKind::Decode)]);
                assert!(planned.rejected[0].1.contains("too large"), "{}", planned.rejected[0].1);
            }
            // Everything else on the device refuses with the typed limit, forced or in Auto.
            let int8 = registry::walk(&rows(None), &(), "cuda", p, Precision::INT8_DEFAULT, Strategy::Native(NativeKind::Int8Wgmma));
            assert!(matches!(int8, Err(Error::TooLarge { limit, .. }) if limit == i32::MAX as u128));
            let portable = registry::walk(&rows(None), &(), "cuda", p, Precision::F16_DEFAULT, Strategy::Portable);
            assert!(matches!(portable, Err(Error::TooLarge { path, .. }) if path.contains("portable-fma")));
            // The rows' own checks, without a device: the f16 configs accept the shape.
            let hmma = hmma_config(p, Precision::F16_DEFAULT).unwrap();
            hmma.validate_args(&p.shape()).unwrap();
            WgmmaConfig::new(128).unwrap().tma_specs(&p.shape(), [0; 5]).unwrap();
        }
    }

    /// Dense HMMA dispatch with score modifiers: a window (causal or not) or sinks alone take
    /// the window-only variant, which runs the plain kernel's 32-row tile; softcap or ALiBi the
    /// variant compiling in what the problem sets (the 16-row tile, the superset when both are
    /// set); no modifier, the plain kernel. Needs no device.
    #[test]
    fn dense_hmma_problems_take_the_lightest_modifier_variant() {
        let slopes = AttentionProblem::standard_alibi_slopes(8);
        let base = AttentionProblem::new(1, 8, 4096, 128).kv_heads(2).causal(true);
        for precision in [Precision::BF16_DEFAULT, Precision::F16_DEFAULT] {
            let cfg = hmma_config(&base, precision).unwrap();
            let plain = hmma_dense(&base, cfg).unwrap();
            assert_eq!(plain.mods, None);
            let window = hmma_dense(&base.clone().window(1024, 0), cfg).unwrap();
            assert_eq!(window.mods, Some(ModVariant::default()));
            assert_eq!(window.name(), format!("{}_mods", plain.name()));
            let sinks = hmma_dense(&base.clone().causal(false).sinks(vec![0.5f32; 8]), cfg).unwrap();
            assert_eq!(sinks.mods, Some(ModVariant::default()));
            for arch in [quattn_native::Arch::Sm80, quattn_native::Arch::Sm90] {
                assert_eq!(window.tile_for(arch).unwrap().rows_per_warp, 32, "{arch:?}");
                assert_eq!(window.tile_for(arch).unwrap(), plain.tile_for(arch).unwrap(), "{arch:?}");
            }
            let cases = [
                (base.clone().window(1024, 0).softcap(30.0), ModVariant { softcap: true, alibi: false }),
                (base.clone().alibi_slopes(slopes.clone()), ModVariant { softcap: false, alibi: true }),
                (base.clone().window(1024, 0).softcap(30.0).alibi_slopes(slopes.clone()), ModVariant { softcap: true, alibi: true }),
            ];
            for (p, want) in cases {
                let c = hmma_dense(&p, cfg).unwrap();
                assert_eq!(c.mods, Some(want));
                assert_eq!(c.tile_for(quattn_native::Arch::Sm90).unwrap().rows_per_warp, 16);
                // The launch parameters of the chosen variant accept the problem's modifiers.
                mod_params(&c.name(), want, &p).unwrap();
            }
            mod_params(&window.name(), ModVariant::default(), &base.clone().window(1024, 0)).unwrap();
        }
        // The f16-accumulating modes have no modifier variant: refused by name.
        let f16acc = Precision::F16 { qk: QkAccum::F16, pv: PvAccum::F32 };
        let windowed = base.clone().window(1024, 0);
        match hmma_dense(&windowed, hmma_config(&windowed, f16acc).unwrap()) {
            Err(Reject::Refused(Error::UnsupportedFeature { feature, .. })) => assert_eq!(feature, "sliding window"),
            other => panic!("{other:?}"),
        }
    }

    /// A variable-length problem with score modifiers: the walk's family gates let it through
    /// to the native wgmma and HMMA rows (Auto lands on wgmma when its test accepts), whose
    /// varlen configs are the modifier variants (no device needed to build and check them):
    /// wgmma for f16, HMMA for f16 and bf16, with parameters that leave the alignment to each
    /// sequence (no launch-wide offset). A parameter block that cannot hold the heads is a
    /// typed refusal, so Auto moves on.
    #[test]
    fn varlen_problems_with_modifiers_take_the_native_modifier_variants() {
        fn accept(_: &(), p: &AttentionProblem, _: Precision) -> std::result::Result<Choice, Reject> {
            Ok(Choice { kernel: KernelId::Cpu { dtype: Dtype::F16, head_dim: p.head_dim }, blocking: None })
        }
        let sinks = vec![0.5f32, -1.0, 2.0, f32::NEG_INFINITY];
        let p = AttentionProblem::new(1, 4, 1, 128)
            .kv_heads(2)
            .varlen(crate::VarLen::from_lengths(&[0, 300, 1, 3000], &[40, 120, 400, 3000]))
            .causal(true)
            .window(64, 0)
            .softcap(20.0)
            .alibi_slopes(AttentionProblem::standard_alibi_slopes(4))
            .sinks(sinks.clone());
        let rows: Vec<Row<()>> = table().iter().map(|r| Row { family: r.family, test: accept }).collect();
        let planned = registry::walk(&rows, &(), "cuda", &p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        assert_eq!(rows[planned.rejected.len()].family, Family::Native(NativeKind::Wgmma));
        assert_eq!(planned.rejected.iter().map(|r| r.0).collect::<Vec<_>>(), vec![Family::Native(NativeKind::Decode)]);
        for kind in [NativeKind::Wgmma, NativeKind::Hmma] {
            registry::walk(&rows, &(), "cuda", &p, Precision::F16_DEFAULT, Strategy::Native(kind)).unwrap();
        }

        let w = wgmma_varlen(&p).unwrap().unwrap();
        assert_eq!((w.name().as_str(), w.varlen), ("fwd_wgmma_f16_d128_mods_softcap_alibi_varlen", true));
        for input in [Dtype::F16, Dtype::Bf16] {
            let h = hmma_varlen(&p, input).unwrap().unwrap();
            assert_eq!((h.mods, h.varlen, h.input), (Some(ModVariant { softcap: true, alibi: true }), true, input));
        }
        // Only the modifiers the problem sets are compiled in.
        let plain = AttentionProblem { softcap: None, alibi_slopes: None, ..p.clone() };
        assert_eq!(wgmma_varlen(&plain).unwrap().unwrap().name(), "fwd_wgmma_f16_d128_mods_varlen");
        let none = AttentionProblem { window: None, sinks: None, causal: false, ..plain.clone() };
        assert_eq!(wgmma_varlen(&none).unwrap().unwrap().mods, None);
        assert!(wgmma_varlen(&AttentionProblem::new(1, 4, 300, 128)).unwrap().is_none());

        // Each sequence aligns itself: the launch carries the alignment, not an offset.
        let mp = mod_params(&w.name(), ModVariant { softcap: true, alibi: true }, &p).unwrap();
        assert_eq!((mp.offset, mp.top_left, mp.left, mp.right), (0, 0, 64, 0));
        assert_eq!(mp.sink_log2[1], -std::f32::consts::LOG2_E);
        let tl = p.clone().causal_align(crate::CausalAlign::TopLeft);
        let mt = mod_params(&w.name(), ModVariant { softcap: true, alibi: true }, &tl).unwrap();
        assert_eq!((mt.offset, mt.top_left), (0, 1));
        // The dense problem's parameters keep their launch-wide offset.
        let dense = AttentionProblem::new(1, 4, 100, 128).kv_len(300).window(64, 0);
        let md = mod_params("dense", ModVariant::default(), &dense).unwrap();
        assert_eq!((md.offset, md.top_left), (200, 0));

        // More heads than the parameter block holds: refused by name.
        let many = AttentionProblem::new(1, 130, 1, 128)
            .kv_heads(2)
            .varlen(crate::VarLen::from_lengths(&[5, 7], &[9, 7]))
            .alibi_slopes(AttentionProblem::standard_alibi_slopes(130));
        for r in [wgmma_varlen(&many).map(|_| ()), hmma_varlen(&many, Dtype::Bf16).map(|_| ())] {
            match r {
                Err(Reject::Refused(Error::UnsupportedFeature { kernel, .. })) => assert!(kernel.contains("at most 128"), "{kernel}"),
                other => panic!("{other:?}"),
            }
        }
        // A head dim without a varlen variant is a varlen refusal, modifiers or not.
        let d96 = AttentionProblem::new(1, 4, 1, 96).varlen(crate::VarLen::from_lengths(&[5], &[9])).window(8, 0);
        assert!(matches!(wgmma_varlen(&d96), Err(Reject::Refused(Error::UnsupportedVarLen { .. }))));
    }

    /// Auto over the CUDA table's families in their order, MXFP4 and NVFP4, on a device of
    /// compute capability `cc`: the native NVFP4 row decides with its real decision (it needs no
    /// device); the portable 4-bit row, whose test needs a CubeCL client, is stood in for by
    /// one that takes the 4-bit modes (`fp4_row`'s own planning is exercised on wgpu); every
    /// other row does not apply. MXFP4 and NVFP4 with f16 P pass the native row's typed refusal
    /// and land on the portable kernel on every compute capability; NVFP4 stays native on 12.0
    /// only. Forcing the native family is the typed refusal naming the missing kernel.
    #[test]
    fn mxfp4_falls_through_the_native_refusal_to_the_portable_4bit_kernel() {
        fn row_test(cc: &(u32, u32), p: &AttentionProblem, prec: Precision, family: Family) -> std::result::Result<Choice, Reject> {
            let stand_in = Choice { kernel: KernelId::Cpu { dtype: Dtype::F32, head_dim: p.head_dim }, blocking: None };
            match family {
                Family::Native(NativeKind::Nvfp4) => nvfp4_native_decision(*cc, p, prec).map(|_| stand_in),
                Family::Portable(crate::PortableKind::Fp4) if matches!(prec, Precision::Nvfp4 { .. } | Precision::Mxfp4 { .. }) => Ok(stand_in),
                _ => not_applicable("stand-in"),
            }
        }
        // One fn per family (a row's test is a plain fn pointer).
        fn native_nvfp4(cc: &(u32, u32), p: &AttentionProblem, prec: Precision) -> std::result::Result<Choice, Reject> {
            row_test(cc, p, prec, Family::Native(NativeKind::Nvfp4))
        }
        fn portable_fp4(cc: &(u32, u32), p: &AttentionProblem, prec: Precision) -> std::result::Result<Choice, Reject> {
            row_test(cc, p, prec, Family::Portable(crate::PortableKind::Fp4))
        }
        fn other(_: &(u32, u32), _: &AttentionProblem, _: Precision) -> std::result::Result<Choice, Reject> {
            not_applicable("stand-in")
        }
        let rows: Vec<Row<(u32, u32)>> = table()
            .iter()
            .map(|r| {
                let test: registry::Test<(u32, u32)> = match r.family {
                    Family::Native(NativeKind::Nvfp4) => native_nvfp4,
                    Family::Portable(crate::PortableKind::Fp4) => portable_fp4,
                    _ => other,
                };
                Row { family: r.family, test }
            })
            .collect();
        let p = AttentionProblem::new(1, 8, 200, 128).kv_heads(2).kv_len(300).causal(true);
        let fp4 = Family::Portable(crate::PortableKind::Fp4);
        for cc in [(12, 0), (9, 0), (8, 0), (10, 0)] {
            for smooth_k in [false, true] {
                let mx = Precision::Mxfp4 { smooth_k };
                let planned = registry::walk(&rows, &cc, "cuda", &p, mx, Strategy::Auto).unwrap();
                let chosen = rows.iter().filter(|r| r.family.allowed_by(Strategy::Auto)).nth(planned.rejected.len()).unwrap().family;
                assert_eq!(chosen, fp4, "{cc:?} {mx}");
                let native = planned.rejected.iter().find(|(f, _)| *f == Family::Native(NativeKind::Nvfp4)).expect("the native row was tried");
                assert!(native.1.contains("no native MXFP4"), "{}", native.1);
                match registry::walk(&rows, &cc, "cuda", &p, mx, Strategy::Native(NativeKind::Nvfp4)) {
                    Err(Error::UnsupportedStrategy { reason, .. }) => assert!(reason.contains("no native MXFP4"), "{reason}"),
                    other => panic!("{cc:?}: {:?}", other.map(|p| p.choice.kernel)),
                }
                let portable = registry::walk(&rows, &cc, "cuda", &p, mx, Strategy::Portable).unwrap();
                assert!(portable.rejected.iter().all(|(f, _)| matches!(f, Family::Portable(_))), "{:?}", portable.rejected);
            }
            let nv = Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k: false };
            let planned = registry::walk(&rows, &cc, "cuda", &p, nv, Strategy::Auto).unwrap();
            let chosen = rows.iter().filter(|r| r.family.allowed_by(Strategy::Auto)).nth(planned.rejected.len()).unwrap().family;
            let want = if cc == (12, 0) { Family::Native(NativeKind::Nvfp4) } else { fp4 };
            assert_eq!(chosen, want, "{cc:?} NVFP4");
            // NVFP4 V with f16 P has no native kernel: the portable 4-bit row on every compute
            // capability, and forcing the native family is the typed refusal naming it.
            for smooth_k in [false, true] {
                let p16 = Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k };
                let planned = registry::walk(&rows, &cc, "cuda", &p, p16, Strategy::Auto).unwrap();
                let chosen = rows.iter().filter(|r| r.family.allowed_by(Strategy::Auto)).nth(planned.rejected.len()).unwrap().family;
                assert_eq!(chosen, fp4, "{cc:?} {p16}");
                let native = planned.rejected.iter().find(|(f, _)| *f == Family::Native(NativeKind::Nvfp4)).expect("the native row was tried");
                assert!(native.1.contains("f16 P"), "{}", native.1);
                match registry::walk(&rows, &cc, "cuda", &p, p16, Strategy::Native(NativeKind::Nvfp4)) {
                    Err(Error::UnsupportedStrategy { reason, .. }) => assert!(reason.contains("f16 P"), "{reason}"),
                    other => panic!("{cc:?} {p16}: {:?}", other.map(|p| p.choice.kernel)),
                }
            }
        }
    }

    #[test]
    fn nvfp4_dispatch_picks_the_native_family_on_compute_capability_12_0_only() {
        let p = AttentionProblem::new(2, 8, 200, 128).kv_heads(2).kv_len(300).causal(true);
        let prec = Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k: false };
        let d = nvfp4_native_decision((12, 0), &p, prec).unwrap();
        assert_eq!(d.kernel.head_dim, 128);
        assert_eq!(d.kernel.pv, quattn_native::nvfp4::PvMode::Half { bf16: true });
        assert_eq!(d.qk_prepass.dtype, Dtype::Bf16);
        assert!(d.vt_prepass.is_none());
        let v4 = nvfp4_native_decision((12, 0), &p, Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k: false }).unwrap();
        assert_eq!(v4.kernel.pv, quattn_native::nvfp4::PvMode::Fp4);
        assert!(!v4.kernel.rescale);
        assert!(v4.vt_prepass.is_some_and(|c| c.vt && c.dtype == Dtype::F16));
        // Not on Hopper, Blackwell datacenter or Ampere: the block-scaled mma.sync is sm_120a's.
        for cc in [(9, 0), (10, 0), (8, 0), (8, 9)] {
            assert!(matches!(nvfp4_native_decision(cc, &p, prec), Err(Reject::NotApplicable(_))), "{cc:?}");
        }
        // Smoothed K and head dims the kernel lacks fall through to the next row.
        let smooth = Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k: true };
        assert!(matches!(nvfp4_native_decision((12, 0), &p, smooth), Err(Reject::NotApplicable(_))));
        let d32 = AttentionProblem::new(1, 1, 16, 32);
        assert!(matches!(nvfp4_native_decision((12, 0), &d32, prec), Err(Reject::NotApplicable(_))));
        assert!(matches!(nvfp4_native_decision((12, 0), &p, Precision::F16_DEFAULT), Err(Reject::NotApplicable(_))));
        // NVFP4 V with f16 P has no variant of the kernel: a typed refusal naming it, also on
        // 12.0, where the same shape with NVFP4 P is native.
        for cc in [(12, 0), (9, 0)] {
            match nvfp4_native_decision(cc, &p, Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k: false }) {
                Err(Reject::Refused(Error::UnsupportedPrecision { reason, .. })) => assert!(reason.contains("f16 P"), "{reason}"),
                other => panic!("{cc:?}: {:?}", other.map(|d| d.kernel)),
            }
        }
        // MXFP4 has no native kernel on any compute capability: a typed refusal naming it.
        for cc in [(12, 0), (9, 0)] {
            match nvfp4_native_decision(cc, &p, Precision::Mxfp4 { smooth_k: false }) {
                Err(Reject::Refused(Error::UnsupportedPrecision { reason, .. })) => assert!(reason.contains("no native MXFP4"), "{reason}"),
                other => panic!("{cc:?}: {:?}", other.map(|d| d.kernel)),
            }
        }
    }
}
