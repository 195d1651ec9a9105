//! The CubeCL backend, generic over the runtime: one implementation serves wgpu (Vulkan, Metal,
//! DX12, software adapters) and CUDA. Device buffers are CubeCL handles; timing uses CubeCL's
//! profiler (CUDA events) on CUDA and the host clock on wgpu adapters (see `time`).
//!
//! The dispatch table tries the portable families best first (manual MMA, cooperative-matrix
//! MMA, the INT8 kernel, the FMA kernels); the plan keeps the resolved
//! [`quattn_cubecl::PortableKernel`], which every execution launches as it is.
//!
//! `Fp8` runs on FP8 codes with f32 descales: the host path quantizes Q, K and V at upload
//! (`codec::fp8_scaled`, descale blocks of the kernel's tiles, recorded on the plan as its
//! [`Blocking`], as the CPU FP8 kernel does), the device path takes the caller's codes and
//! descales ([`crate::Session::run_cubecl_fp8`]); the kernel decodes as it stages.
//!
//! `Nvfp4` runs on the 4-bit kernel: at upload the host path gathers Q and K (and, for
//! `Nvfp4V::Nvfp4` and `Nvfp4V::Nvfp4P16`, V transposed to key-axis rows) from the values rounded to the mode's input
//! type, as the emulation does, and the CubeCL NVFP4 quantization kernel
//! ([`quattn_cubecl::quantize_nvfp4`], bit-exact with [`crate::codec::nvfp4`]) turns them into
//! codes and scales on the device; bf16 V is uploaded as bf16 bits. `Mxfp4` runs on the same
//! kernel: Q and K are quantized on the host by the emulation's own MXFP4 quantization
//! ([`crate::emulation::quantize_qk_4bit`] with [`crate::codec::mxfp4`]) and uploaded as codes
//! and E8M0 scales, with tensor scales 1 and bf16 V. The attention kernel reads the 4-bit codes
//! and decodes them as it stages them; O comes back in f32.
//!
//! `Int8Qk` runs as two steps on the device: the CubeCL quantization prepass (f16 Q and K to
//! INT8 codes and scales, K smoothing) then the INT8 attention kernel; the scale layout
//! follows the kernel's tiles, recorded on the plan as its [`Blocking`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use cubecl::prelude::*;
use cubecl::server::Handle;
use half::{bf16, f16};
use quattn_cubecl::{Accumulation, Family as Portable, Int8DeviceOperands, LaunchError, PortableKernel, SUPPORTED_HEAD_DIMS};

use super::tables::{TableCache, TableKey};
use super::{Backend, ResidentData};
use crate::device_tensor::CubeclTensors;
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use crate::codec::mxfp4::Mxfp4Tensor;
use crate::emulation::Blocking;
use crate::error::{Error, Result};
use crate::precision::{Nvfp4V, PvAccum, PvFormat, QkAccum};
use crate::registry::{self, not_applicable, Choice, Family, KernelId, Planned, Reject, Row};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, Dtype, PortableKind, Precision, Strategy, TWO_STAGE_CHUNK};

/// The problem's score modifiers as the portable kernels take them.
fn score_mods(p: &AttentionProblem) -> quattn_cubecl::ScoreMods<'_> {
    let window = p.window;
    quattn_cubecl::ScoreMods {
        top_left: p.causal_align == crate::CausalAlign::TopLeft,
        // Validated at plan time to fit u32.
        window_left: window.and_then(|w| w.left_bound()).map(|x| x as u32),
        window_right: window.and_then(|w| w.right_bound()).map(|x| x as u32),
        softcap: p.softcap,
        sinks: p.sinks.as_deref(),
        alibi_slopes: p.alibi_slopes.as_deref(),
    }
}

/// Elements every device tensor of the host path holds at least: the vector kernels bind each
/// buffer as 4-wide vectors, an empty one included.
const MIN_ELEMS: usize = 4;

/// Executions per host-timed sample on wgpu adapters.
const WGPU_TIMING_BATCH: usize = 5;

pub(crate) struct CubeclBackend<R: Runtime> {
    client: ComputeClient<R>,
    info: DeviceInfo,
    /// The device copies of the last paged or variable-length plan's tables, reused while the
    /// calls' tables are the same `Arc`s ([`TableCache`]).
    tables: Mutex<HeldTables>,
}

/// Table handles and the tables they hold. A handle is never written after it is created: new
/// tables get new handles, and a launch enqueued with replaced ones still holds them (CubeCL
/// handles are reference-counted) and reads what it was given, on any stream.
#[derive(Default)]
struct HeldTables {
    cache: TableCache,
    handles: Option<TableHandles>,
}

#[derive(Clone)]
enum TableHandles {
    /// A paged cache's block table and lengths in one u32 buffer ([`CubeclBackend::paged_table`]).
    Paged(Handle),
    /// A variable-length batch's `cu_seqlens_q` and `cu_seqlens_k` (u32).
    Varlen([Handle; 2]),
}

/// The buffers of one call: the host path's uploads, or a caller's handles.
pub(crate) struct GpuData {
    pub(crate) q: Handle,
    pub(crate) k: Handle,
    pub(crate) v: Handle,
    pub(crate) o: Handle,
    pub(crate) lse: Option<Handle>,
    /// The f32 descales of FP8 codes in `q`, `k`, `v` (FP8 plans only).
    pub(crate) descales: Option<Fp8Descales>,
    /// The block scales and tensor scales of 4-bit codes in `q`, `k` (and `v`) (4-bit plans
    /// only).
    pub(crate) fp4: Option<Fp4Scales>,
    /// A variable-length batch's `cu_seqlens_q` and `cu_seqlens_k` (u32).
    pub(crate) varlen: Option<[Handle; 2]>,
}

/// The scale buffers of a 4-bit call ([`quattn_cubecl::Fp4Operands`]' layouts).
pub(crate) struct Fp4Scales {
    pub(crate) q: Handle,
    pub(crate) k: Handle,
    /// A 4-byte placeholder with bf16 V.
    pub(crate) v: Handle,
    /// One f32 each: the tensor scales of Q, K and V (V's unused with bf16 V).
    pub(crate) tensor: [Handle; 3],
    /// f32 `[batch, q_heads, q_len]` where K was smoothed: what the LSE gets back.
    pub(crate) lse_shift: Option<Handle>,
}

/// The descale buffers of an FP8 call (f32, [`quattn_cubecl::DescaleGranularity`]'s shapes).
pub(crate) struct Fp8Descales {
    pub(crate) q: Handle,
    pub(crate) k: Handle,
    pub(crate) v: Handle,
}

/// The portable dispatch table, best first: `Auto` and `Portable` take the first row that
/// accepts, a forced family its own row.
fn table<R: Runtime>() -> [Row<CubeclBackend<R>>; 7] {
    [
        // First: it refuses every problem but decode shapes, where it beats the per-head tiles.
        Row { family: Family::Portable(PortableKind::Decode), test: |b, p, prec| b.float_row(p, prec, Portable::Decode) },
        Row { family: Family::Portable(PortableKind::Mma), test: |b, p, prec| b.float_row(p, prec, Portable::Mma) },
        Row { family: Family::Portable(PortableKind::Cmma), test: |b, p, prec| b.float_row(p, prec, Portable::Cmma) },
        Row { family: Family::Portable(PortableKind::Int8), test: CubeclBackend::<R>::int8_row },
        Row { family: Family::Portable(PortableKind::Fp8), test: CubeclBackend::<R>::fp8_row },
        Row { family: Family::Portable(PortableKind::Fp4), test: CubeclBackend::<R>::fp4_row },
        Row { family: Family::Portable(PortableKind::Fma), test: |b, p, prec| b.float_row(p, prec, Portable::Fma) },
    ]
}

impl<R: Runtime> CubeclBackend<R> {
    /// Opens the CubeCL client; CubeCL panics when a device cannot be opened, which becomes a
    /// typed error here.
    pub(crate) fn open(device: Device, runtime_device: R::Device, kind: &'static str, adapter: String) -> Result<Self> {
        let client = catch_unwind(AssertUnwindSafe(|| R::client(&runtime_device))).map_err(|p| Error::DeviceUnavailable {
            device,
            reason: format!("CubeCL could not open it: {}", panic_message(&p)),
        })?;
        Ok(CubeclBackend { client, info: DeviceInfo { device, kind, adapter }, tables: Mutex::default() })
    }

    /// The same backend reported as `device` of `kind` (a wgpu client that runs SPIR-V).
    #[cfg(feature = "wgpu")]
    pub(crate) fn relabel(mut self, device: Device, kind: &'static str) -> Self {
        self.info.device = device;
        self.info.kind = kind;
        self
    }

    pub(crate) fn client(&self) -> &ComputeClient<R> {
        &self.client
    }

    fn device_name(&self) -> String {
        format!("{} ({})", self.info.kind, self.info.adapter)
    }

    /// Checks shared by every row: head dims with a tile entry, an element type the runtime has.
    fn common(&self, problem: &AttentionProblem, precision: Precision, elem: Dtype) -> std::result::Result<(), Reject> {
        for d in [problem.head_dim, problem.v_head_dim] {
            if !SUPPORTED_HEAD_DIMS.contains(&d) {
                return Err(Reject::Refused(Error::UnsupportedHeadDim {
                    head_dim: d,
                    path: "the portable CubeCL kernels".into(),
                    supported: SUPPORTED_HEAD_DIMS.to_vec(),
                }));
            }
        }
        quattn_cubecl::check_dtype_supported(&self.client, elem)
            .map_err(|e| Reject::Refused(Error::UnsupportedPrecision { precision, device: self.device_name(), reason: e.to_string() }))
    }

    /// The float families: f32/f16/bf16 inputs; the f16-accumulating modes on the FMA row only
    /// (the packed-f16 kernel).
    pub(crate) fn float_row(&self, problem: &AttentionProblem, precision: Precision, family: Portable) -> std::result::Result<Choice, Reject> {
        let (elem, accumulation) = match precision {
            Precision::F32 => (Dtype::F32, Accumulation::default()),
            Precision::F16 { qk, pv } => (Dtype::F16, Accumulation { qk, pv }),
            Precision::Bf16 { qk: QkAccum::F32, pv: PvAccum::F32 } => (Dtype::Bf16, Accumulation::default()),
            Precision::Bf16 { .. } => {
                return Err(Reject::Refused(Error::UnsupportedPrecision {
                    precision,
                    device: self.device_name(),
                    reason: "bf16 is accumulated in f32 only".into(),
                }))
            }
            _ => return not_applicable(format!("{precision} is not a float mode")),
        };
        if !accumulation.is_f32() && family != Portable::Fma {
            return not_applicable(format!("the {family} kernel accumulates in f32 only; {precision} runs on the packed-f16 FMA kernel"));
        }
        self.common(problem, precision, elem)?;
        // The decode family's split divides the keys the modifiers leave visible.
        let mods = score_mods(problem);
        let kernel = match &problem.paged {
            // Only the decode kernels read a paged cache (the registry offers no other family).
            Some(pg) if family == Portable::Decode => quattn_cubecl::select_paged_modified(&self.client, &problem.shape(), elem, pg.page_size as u32, Some(&mods))
                .map_err(|e| self.refusal(precision, e))?,
            _ => quattn_cubecl::select_modified(&self.client, &problem.shape(), elem, accumulation, Some(family), &mods).map_err(|e| self.refusal(precision, e))?.kernel,
        };
        // The FMA and decode kernels have the score modifiers (the decode kernels on contiguous
        // and paged caches alike).
        if !matches!(kernel, PortableKernel::Fma(_) | PortableKernel::Decode(_)) {
            registry::refuse_modifiers(problem, format!("the portable {} kernel", kernel.name()))?;
        }
        if !matches!(kernel, PortableKernel::Fma(_)) {
            registry::refuse_varlen(problem, format!("the portable {} kernel", kernel.name()))?;
        }
        let (blocking, name) = match kernel {
            // The packed-f16 FMA kernel: its tile is the blocking the emulation must follow
            // (the F16PerTile fold is per KV tile), and every step is one FMA (k_step 1).
            PortableKernel::Half(h) => {
                let b = Blocking { block_q: h.tiles.bq as usize, block_k: h.tiles.bk as usize, warps: 1, qk_chunk: TWO_STAGE_CHUNK, k_step: 1, key_streams: None };
                b.validate(problem, precision)?;
                (Some(b), format!("fwd_portable_half_{}_{}_d{}", self.info.kind, precision.name(), problem.head_dim))
            }
            k => {
                let family = match k.family() {
                    Portable::Mma => "portable_mma",
                    Portable::Cmma => "portable_cmma",
                    Portable::Fma => "portable",
                    Portable::Decode if matches!(k, PortableKernel::Decode(t) if matches!(t.tiling, quattn_cubecl::DecodeTiling::Mma(_))) => {
                        "portable_decode_mma"
                    }
                    Portable::Decode => "portable_decode",
                };
                (None, format!("fwd_{family}_{}_{elem}_d{}", self.info.kind, problem.head_dim))
            }
        };
        Ok(Choice { kernel: KernelId::Portable { kernel, name }, blocking })
    }

    /// INT8 Q/K with f16 P·V: the CubeCL prepass, then the INT8 kernel.
    pub(crate) fn int8_row(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
        let (granularity, smooth_k) = match precision {
            Precision::Int8Qk { pv: PvFormat::F16, granularity, smooth_k } => (granularity, smooth_k),
            Precision::Int8Qk { pv: PvFormat::Fp8, .. } => {
                return Err(Reject::Refused(Error::UnsupportedPrecision {
                    precision,
                    device: self.device_name(),
                    reason: "the portable INT8 kernel computes P·V with f16 P and V; FP8 P·V (e4m3 P, per-channel e4m3 V) needs an FP8 matrix unit and has no portable kernel".into(),
                }))
            }
            _ => return not_applicable(format!("{precision} is not an INT8 mode")),
        };
        self.common(problem, precision, Dtype::F16)?;
        let kernel = quattn_cubecl::select_int8(&self.client, &problem.shape(), Dtype::F16, granularity, smooth_k)
            .map_err(|e| self.refusal(precision, e))?;
        let PortableKernel::Int8(int8) = kernel else {
            return Err(Reject::Refused(Error::Kernel { kernel: kernel.name(), reason: "select_int8 chose a float kernel".into() }));
        };
        let b = int8.blocking();
        let blocking = Blocking { block_q: b.block_q, block_k: b.block_k, warps: b.warps, ..Blocking::default() };
        blocking.validate(problem, precision)?;
        let name = format!("fwd_portable_{}_{}_d{}", self.info.kind, precision.name(), problem.head_dim);
        Ok(Choice { kernel: KernelId::Portable { kernel, name }, blocking: Some(blocking) })
    }

    /// FP8 Q/K/V codes with f32 descales and f16 P: the FP8 kernel. Its tiles set the descale
    /// blocks (`DescaleGranularity::PerBlock`), which the plan's blocking records for the
    /// emulation and for callers laying out descales.
    pub(crate) fn fp8_row(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
        let Precision::Fp8 { format, descale, p } = precision else {
            return not_applicable(format!("{precision} is not an FP8 mode"));
        };
        if p == PvFormat::Fp8 {
            return Err(Reject::Refused(Error::UnsupportedPrecision {
                precision,
                device: self.device_name(),
                reason: "the portable FP8 kernel rounds P to f16 for P·V; FP8 P (quantized per KV tile against the running \
                         max) needs an FP8 matrix unit and runs in the CPU emulation (Strategy::Reference)"
                    .into(),
            }));
        }
        let o_dtype = precision.input_dtype();
        self.common(problem, precision, o_dtype)?;
        let kernel = quattn_cubecl::select_fp8(&self.client, &problem.shape(), o_dtype, format, descale)
            .map_err(|e| self.refusal(precision, e))?;
        let PortableKernel::Fp8(fp8) = kernel else {
            return Err(Reject::Refused(Error::Kernel { kernel: kernel.name(), reason: "select_fp8 chose another kernel".into() }));
        };
        let (block_q, block_k) = fp8.descale_blocks();
        let blocking = Blocking { block_q, block_k, ..Blocking::default() };
        blocking.validate(problem, precision)?;
        // The variant in the name: the split-KV decode kernels on decode shapes (the MMA one
        // marked), the manual-MMA FP8 kernel where the f16 mma kernel runs.
        let variant = match fp8.tiles {
            quattn_cubecl::Fp8Tiling::Decode(d) if matches!(d.tiling, quattn_cubecl::DecodeTiling::Mma(_)) => "decode_mma_",
            quattn_cubecl::Fp8Tiling::Decode(_) => "decode_",
            quattn_cubecl::Fp8Tiling::Mma(_) => "mma_",
            quattn_cubecl::Fp8Tiling::Fma(_) => "",
        };
        let name = format!("fwd_portable_{variant}{}_{}_d{}", self.info.kind, precision.name(), problem.head_dim);
        Ok(Choice { kernel: KernelId::Portable { kernel, name }, blocking: Some(blocking) })
    }

    /// NVFP4 Q/K with bf16 or NVFP4 V (NVFP4 or f16 P), or MXFP4 Q/K with bf16 V: the 4-bit
    /// kernel (O in f32).
    /// Its tiles set the P·V steps (one online-softmax step and P's 16-key blocks per KV tile),
    /// which the plan's blocking records for the emulation.
    pub(crate) fn fp4_row(&self, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
        let (format, fv) = match precision {
            Precision::Nvfp4 { v: Nvfp4V::Bf16, .. } => (quattn_cubecl::Fp4Format::Nvfp4, quattn_cubecl::Fp4V::Bf16),
            Precision::Nvfp4 { v: Nvfp4V::Nvfp4, .. } => (quattn_cubecl::Fp4Format::Nvfp4, quattn_cubecl::Fp4V::Nvfp4),
            Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, .. } => (quattn_cubecl::Fp4Format::Nvfp4, quattn_cubecl::Fp4V::Nvfp4P16),
            Precision::Mxfp4 { .. } => (quattn_cubecl::Fp4Format::Mxfp4, quattn_cubecl::Fp4V::Bf16),
            _ => return not_applicable(format!("{precision} is not a 4-bit mode")),
        };
        // The format's own head-dim rule first (scale blocks along the head dim), the error the
        // CPU and the emulation give, then the portable kernels' head dims.
        let mut blocking = Blocking { warps: 1, ..Blocking::default() };
        blocking.validate(problem, precision)?;
        self.common(problem, precision, Dtype::F32)?;
        let kernel = quattn_cubecl::select_fp4(&self.client, &problem.shape(), format, fv).map_err(|e| self.refusal(precision, e))?;
        let PortableKernel::Fp4(fp4) = kernel else {
            return Err(Reject::Refused(Error::Kernel { kernel: kernel.name(), reason: "select_fp4 chose another kernel".into() }));
        };
        (blocking.block_q, blocking.block_k) = (fp4.tiles.bq as usize, fp4.tiles.bk as usize);
        if let Some(d) = fp4.decode {
            // The MMA decode kernel: each warp of each split its own softmax over 64-key tiles.
            blocking.block_k = quattn_cubecl::FP4_DECODE_WARP_KEYS;
            blocking.key_streams = Some(crate::emulation::KeyStreams { keys_per_split: d.keys_per_split as usize, warps: d.units() as usize / 32 });
        }
        blocking.validate(problem, precision)?;
        // The variant in the name: the MMA decode kernel on decode shapes.
        let variant = if fp4.decode.is_some() { "decode_mma_" } else { "" };
        let name = format!("fwd_portable_{variant}{}_{}_d{}", self.info.kind, precision.name(), problem.head_dim);
        Ok(Choice { kernel: KernelId::Portable { kernel, name }, blocking: Some(blocking) })
    }

    fn refusal(&self, precision: Precision, e: LaunchError) -> Reject {
        match e {
            LaunchError::UnsupportedHeadDim { .. } => Reject::Refused(launch_error("select", "the portable CubeCL kernels", e)),
            e => Reject::Refused(Error::UnsupportedPrecision { precision, device: self.device_name(), reason: e.to_string() }),
        }
    }

    /// Launches the plan's portable kernel on `d`. INT8 plans run the prepass first (f16 Q and
    /// K to codes and scales laid out for the kernel's tiles, Q scales folded with
    /// `softmax_scale · log2 e`, K smoothed when asked), on the same stream.
    pub(crate) fn launch(&self, plan: &Plan, d: &GpuData) -> Result<()> {
        let KernelId::Portable { kernel, .. } = &plan.kernel else { return Err(super::foreign(plan)) };
        let shape = plan.problem.shape();
        let failed = |e| launch_error(&plan.kernel_name(), "the portable CubeCL kernel", e);
        if let (PortableKernel::Decode(_), Some(pg)) = (kernel, &plan.problem.paged) {
            let Some(TableHandles::Paged(table)) = self.held_tables(plan)? else {
                return Err(Error::Kernel { kernel: plan.kernel_name(), reason: "a paged plan without its block table".into() });
            };
            let cache = quattn_cubecl::PagedCache { page_size: pg.page_size as u32, num_pages: pg.num_pages as u32, max_pages: pg.max_pages as u32, table: &table };
            let mods = score_mods(&plan.problem);
            quattn_cubecl::launch_paged_modified::<R>(&self.client, kernel, &shape, plan.dtype(), &mods, &cache, &d.q, &d.k, &d.v, &d.o, d.lse.as_ref())
                .map_err(failed)?;
            return Ok(());
        }
        match kernel {
            PortableKernel::Int8(int8) => {
                let ops: Int8DeviceOperands = quattn_cubecl::quantize_int8(&self.client, &shape, Dtype::F16, &int8.quant(), &d.q, &d.k)
                    .map_err(|e| launch_error("quantize_int8", "the INT8 prepass", e))?;
                quattn_cubecl::launch_int8::<R>(&self.client, kernel, &shape, Dtype::F16, &ops, &d.v, &d.o, d.lse.as_ref()).map_err(failed)?;
            }
            PortableKernel::Fp4(_) => {
                let Some(sc) = &d.fp4 else {
                    return Err(Error::Kernel {
                        kernel: plan.kernel_name(),
                        reason: "a 4-bit plan needs its block and tensor scales: pass codes through Session::run_cubecl_fp4, or values through Session::run".into(),
                    });
                };
                let ops = quattn_cubecl::Fp4Operands {
                    q: &d.q,
                    q_scales: &sc.q,
                    k: &d.k,
                    k_scales: &sc.k,
                    v: &d.v,
                    v_scales: &sc.v,
                    tensor_scales: [&sc.tensor[0], &sc.tensor[1], &sc.tensor[2]],
                    lse_shift: sc.lse_shift.as_ref(),
                };
                quattn_cubecl::launch_fp4::<R>(&self.client, kernel, &shape, ops, &d.o, d.lse.as_ref()).map_err(failed)?;
            }
            PortableKernel::Fp8(_) => {
                let Some(ds) = &d.descales else {
                    return Err(Error::Kernel { kernel: plan.kernel_name(), reason: "an FP8 plan needs descale buffers".into() });
                };
                quattn_cubecl::launch_fp8::<R>(&self.client, kernel, &shape, plan.dtype(), &d.q, &d.k, &d.v, &ds.q, &ds.k, &ds.v, &d.o, d.lse.as_ref())
                    .map_err(failed)?;
            }
            _ => {
                let p = &plan.problem;
                let mods = score_mods(p);
                match (&p.varlen, &d.varlen) {
                    (Some(vl), Some([cu_q, cu_k])) => {
                        let batch = quattn_cubecl::VarlenBatch { total_q: vl.total_q(), total_k: vl.total_k(), cu_seqlens_q: cu_q, cu_seqlens_k: cu_k };
                        quattn_cubecl::launch_modified_varlen::<R>(&self.client, kernel, &shape, plan.dtype(), &mods, &batch, &d.q, &d.k, &d.v, &d.o, d.lse.as_ref())
                            .map_err(failed)?;
                    }
                    (None, _) => {
                        quattn_cubecl::launch_modified::<R>(&self.client, kernel, &shape, plan.dtype(), &mods, &d.q, &d.k, &d.v, &d.o, d.lse.as_ref())
                            .map_err(failed)?;
                    }
                    (Some(_), None) => {
                        return Err(Error::Kernel { kernel: plan.kernel_name(), reason: "a variable-length plan without its offset buffers".into() });
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) fn data<'a>(&self, plan: &Plan, data: &'a ResidentData) -> Result<&'a GpuData> {
        data.downcast_ref::<GpuData>().ok_or_else(|| super::foreign(plan))
    }

    /// Device buffers for the plan: inputs uploaded in the plan's element type (host values
    /// already of that type pass through as bytes), O and the LSE allocated. FP8 plans upload
    /// codes and descales quantized here from the values rounded to f16 (what a device holding
    /// f16 tensors would quantize), in the plan's descale blocks.
    pub(crate) fn upload_data(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<GpuData> {
        let p = &plan.problem;
        let dtype = plan.dtype();
        if let KernelId::Portable { kernel: PortableKernel::Fp4(fp4), .. } = &plan.kernel {
            return self.upload_fp4(plan, fp4, q, k, v);
        }
        let c = &self.client;
        let o = c.empty(p.o_len_elems().max(MIN_ELEMS) * dtype.size_bytes());
        let lse = p.return_lse.then(|| c.empty(p.lse_len_elems() * 4));
        if let KernelId::Portable { kernel: PortableKernel::Fp8(fp8), .. } = &plan.kernel {
            let (block_q, block_k) = fp8.descale_blocks();
            let layout = |heads, len, block_rows| DescaleLayout { granularity: fp8.granularity, batch: p.batch, heads, len, block_rows };
            let quant = |x: HostSlice<'_>, strides, dim, layout| Fp8Tensor::quantize(fp8.format, &x.rounded_to(dtype), strides, dim, layout);
            let tq = quant(q, p.q_strides(), p.head_dim, layout(p.q_heads, p.q_len, block_q))?;
            let tk = quant(k, p.k_strides(), p.head_dim, layout(p.kv_heads, p.kv_len, block_k))?;
            let tv = quant(v, p.v_strides(), p.v_head_dim, layout(p.kv_heads, p.kv_len, block_k))?;
            let codes = |t: &Fp8Tensor| c.create_from_slice(&padded_codes(&t.codes));
            let descales = |t: &Fp8Tensor| {
                let mut d = t.descales.clone();
                d.resize(d.len().max(MIN_ELEMS), 1.0);
                c.create_from_slice(bytemuck::cast_slice(&d))
            };
            return Ok(GpuData {
                q: codes(&tq),
                k: codes(&tk),
                v: codes(&tv),
                o,
                lse,
                descales: Some(Fp8Descales { q: descales(&tq), k: descales(&tk), v: descales(&tv) }),
                fp4: None,
                varlen: None,
            });
        }
        Ok(GpuData {
            q: c.create_from_slice(&to_bytes(q, dtype)),
            k: c.create_from_slice(&to_bytes(k, dtype)),
            v: c.create_from_slice(&to_bytes(v, dtype)),
            o,
            lse,
            descales: None,
            fp4: None,
            varlen: self.varlen_handles(p),
        })
    }

    /// The 4-bit plan's operands: Q and K gathered into dense `[batch, heads, len]` rows and
    /// quantized (NVFP4 on the device, one tensor scale each; MXFP4 on the host through the
    /// emulation's own quantization, tensor scales 1), V as dense bf16 rows or as NVFP4 `Vᵀ`
    /// (per channel, keys padded with zeros to a multiple of 16), all from the values rounded to
    /// the mode's input type (the emulation's recipe). With `smooth_k`, K − μ is quantized and
    /// the LSE shift `scale · q·μ` uploaded ([`crate::codec::int8::smooth_k`] and
    /// [`crate::codec::int8::lse_shift`]). O is f32.
    fn upload_fp4(&self, plan: &Plan, fp4: &quattn_cubecl::Fp4Tiles, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<GpuData> {
        let p = &plan.problem;
        let c = &self.client;
        let dtype = plan.dtype();
        let (d, dv) = (p.head_dim, p.v_head_dim);
        let q = q.rounded_to(dtype);
        let k = k.rounded_to(dtype);
        let smooth_k = matches!(plan.precision, Precision::Nvfp4 { smooth_k: true, .. } | Precision::Mxfp4 { smooth_k: true });
        // The per-row LSE shift `scale · q·μ` of smoothed K, `[batch, q_heads, q_len]`.
        let lse_shift = |mean: &[f32]| -> Handle {
            let st = p.q_strides();
            let mut shift = Vec::with_capacity(p.lse_len_elems());
            for b in 0..p.batch {
                for h in 0..p.q_heads {
                    let mean = &mean[(b * p.kv_heads + p.kv_head_of(h)) * d..][..d];
                    for i in 0..p.q_len {
                        shift.push(crate::codec::int8::lse_shift(&q[st.offset(b, h, i)..][..d], mean, p.softmax_scale()));
                    }
                }
            }
            shift.resize(shift.len().max(1), 0.0);
            c.create_from_slice(bytemuck::cast_slice(&shift))
        };
        let bytes = |b: &[u8]| c.create_from_slice(&padded_words(b));
        let v = dense_rows(&v.rounded_to(dtype), p.v_strides(), p.batch, p.kv_heads, p.kv_len, dv);
        let bf16_v = || {
            let bits: Vec<u8> = v.iter().flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes()).collect();
            (bytes(&bits), bytes(&[]), c.create_from_slice(bytemuck::cast_slice(&[1.0f32])))
        };
        if fp4.format == quattn_cubecl::Fp4Format::Mxfp4 {
            // No device quantizer for MXFP4: the codec's codes, uploaded as they are (the layout
            // the kernel reads: packed rows, E8M0 codes `[rows, head_dim / 32]`).
            let t = crate::emulation::quantize_qk_4bit(p, smooth_k, &q, &k, Mxfp4Tensor::quantize)?;
            let shift = t.mean.as_deref().map(lse_shift);
            let (v_handle, v_scales, one) = bf16_v();
            return Ok(GpuData {
                q: bytes(&t.q.packed),
                k: bytes(&t.k.packed),
                v: v_handle,
                o: c.empty(p.o_len_elems().max(MIN_ELEMS) * 4),
                lse: p.return_lse.then(|| c.empty(p.lse_len_elems() * 4)),
                descales: None,
                fp4: Some(Fp4Scales {
                    q: bytes(&t.q.scales),
                    k: bytes(&t.k.scales),
                    v: v_scales,
                    tensor: [one.clone(), one.clone(), one],
                    lse_shift: shift,
                }),
                varlen: None,
            });
        }
        let (k, lse_shift) = if smooth_k {
            let sm = crate::codec::int8::smooth_k(p, &k)?;
            let shift = lse_shift(&sm.mean);
            (sm.values, Some(shift))
        } else {
            (k, None)
        };
        let q = dense_rows(&q, p.q_strides(), p.batch, p.q_heads, p.q_len, d);
        let k = dense_rows(&k, p.k_strides(), p.batch, p.kv_heads, p.kv_len, d);
        // The kernel cannot refuse non-finite values as the codec does (the session's NaN
        // policy has replaced them before any upload; this keeps the rule where it is used).
        let quantize = |x: &[f32], rows: usize, cols: usize| -> Result<quattn_cubecl::Nvfp4DeviceTensor> {
            if let Some(i) = x.iter().position(|v| !v.is_finite()) {
                return Err(Error::Quantization(format!("NVFP4 input element {i} is {} (must be finite)", x[i])));
            }
            let h = c.create_from_slice(&padded_words(bytemuck::cast_slice(x)));
            quattn_cubecl::quantize_nvfp4(c, &h, rows, cols).map_err(|e| launch_error("quantize_nvfp4", "the NVFP4 quantization kernel", e))
        };
        let tq = quantize(&q, p.batch * p.q_heads * p.q_len, d)?;
        let tk = quantize(&k, p.batch * p.kv_heads * p.kv_len, d)?;
        let (v_handle, v_scales, ts_v) = match fp4.v {
            quattn_cubecl::Fp4V::Bf16 => bf16_v(),
            quattn_cubecl::Fp4V::Nvfp4 | quattn_cubecl::Fp4V::Nvfp4P16 => {
                let cols = p.kv_len.div_ceil(16) * 16;
                let rows = p.batch * p.kv_heads * dv;
                let mut vt = vec![0.0f32; rows * cols];
                for (r, row) in v.chunks_exact(dv.max(1)).enumerate() {
                    let (bh, j) = (r / p.kv_len.max(1), r % p.kv_len.max(1));
                    for (ch, &x) in row.iter().enumerate() {
                        vt[(bh * dv + ch) * cols + j] = x;
                    }
                }
                let tv = quantize(&vt, rows, cols)?;
                (tv.packed, tv.block_scales, tv.tensor_scale)
            }
        };
        Ok(GpuData {
            q: tq.packed,
            k: tk.packed,
            v: v_handle,
            o: c.empty(p.o_len_elems().max(MIN_ELEMS) * 4),
            lse: p.return_lse.then(|| c.empty(p.lse_len_elems() * 4)),
            descales: None,
            fp4: Some(Fp4Scales { q: tq.block_scales, k: tk.block_scales, v: v_scales, tensor: [tq.tensor_scale, tk.tensor_scale, ts_v], lse_shift }),
            varlen: None,
        })
    }

    /// The plan's tables on the device: the held handles while the plan's tables are the `Arc`s
    /// they were made from, else new handles, which replace them. `None` for a problem without
    /// tables.
    fn held_tables(&self, plan: &Plan) -> Result<Option<TableHandles>> {
        let p = &plan.problem;
        let Some(key) = TableKey::of(p) else { return Ok(None) };
        let mut held = self.tables.lock().map_err(|_| Error::Kernel { kernel: plan.kernel_name(), reason: "table cache lock poisoned".into() })?;
        if let (true, Some(h)) = (held.cache.holds(&key), &held.handles) {
            return Ok(Some(h.clone()));
        }
        // Only the tables the key names are uploaded (a paged key wins over offsets).
        let handles = match (&key, &p.paged) {
            (TableKey::Paged { .. }, Some(pg)) => TableHandles::Paged(self.paged_table(pg)),
            _ => match self.varlen_handles(p) {
                Some(v) => TableHandles::Varlen(v),
                None => return Ok(None),
            },
        };
        held.cache.hold(key);
        held.handles = Some(handles.clone());
        Ok(Some(handles))
    }

    /// A variable-length plan's offsets for a call on caller handles ([`Self::held_tables`]).
    pub(crate) fn held_varlen(&self, plan: &Plan) -> Result<Option<[Handle; 2]>> {
        match self.held_tables(plan)? {
            Some(TableHandles::Varlen(v)) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// A paged cache's block table and sequence lengths in one u32 buffer (host data of the
    /// plan, validated at plan time). Entries past a sequence's pages may be -1; the kernels
    /// never read them.
    pub(crate) fn paged_table(&self, pg: &crate::paged::PagedKv) -> Handle {
        let mut words: Vec<u32> = pg.block_table.iter().chain(pg.seq_lens.iter()).map(|&x| x as u32).collect();
        words.resize(words.len().max(MIN_ELEMS), 0);
        self.client.create_from_slice(bytemuck::cast_slice(&words))
    }

    /// An uninitialised device buffer of `bytes` bytes.
    #[allow(dead_code)]
    /// A variable-length plan's offsets on the device (`cu_seqlens_q`, `cu_seqlens_k` as u32:
    /// validated non-negative at plan time).
    pub(crate) fn varlen_handles(&self, p: &AttentionProblem) -> Option<[Handle; 2]> {
        p.varlen.as_ref().map(|vl| {
            let words = |cu: &[i32]| {
                let mut w: Vec<u32> = cu.iter().map(|&x| x.max(0) as u32).collect();
                w.resize(w.len().max(MIN_ELEMS), 0);
                self.client.create_from_slice(bytemuck::cast_slice(&w))
            };
            [words(&vl.cu_seqlens_q), words(&vl.cu_seqlens_k)]
        })
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
    pub(crate) fn device_ptr(&self, handle: &Handle) -> Result<u64> {
        let resource = self
            .client
            .get_resource(handle.clone())
            .map_err(|e| Error::Kernel { kernel: "device_ptr".into(), reason: format!("CubeCL resource: {e:?}") })?;
        Ok(resource.resource().ptr)
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "unknown panic".into())
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

/// FP8 codes padded with zero codes to whole 16-byte vectors of 32-bit words (the kernel reads
/// codes four to a word), at least one vector.
/// `[batch, heads, len, dim]` rows gathered from a tensor with these strides.
fn dense_rows(x: &[f32], st: crate::problem::Strides, batch: usize, heads: usize, len: usize, dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * heads * len * dim);
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..len {
                out.extend_from_slice(&x[st.offset(b, h, i)..][..dim]);
            }
        }
    }
    out
}

/// Bytes padded with zeros to whole `u32` words, at least one (the 4-bit kernel reads words).
fn padded_words(b: &[u8]) -> Vec<u8> {
    let mut v = b.to_vec();
    v.resize(b.len().next_multiple_of(4).max(4), 0);
    v
}

fn padded_codes(codes: &[u8]) -> Vec<u8> {
    let mut v = codes.to_vec();
    v.resize(codes.len().next_multiple_of(16).max(16), 0);
    v
}

/// The host values as `dtype` bytes (values already of that type are copied as they are),
/// padded to [`MIN_ELEMS`].
fn to_bytes(x: HostSlice<'_>, dtype: Dtype) -> Vec<u8> {
    let mut bytes = to_bytes_exact(x, dtype);
    bytes.resize(bytes.len().max(MIN_ELEMS * dtype.size_bytes()), 0);
    bytes
}

fn to_bytes_exact(x: HostSlice<'_>, dtype: Dtype) -> Vec<u8> {
    match (x, dtype) {
        (HostSlice::F32(s), Dtype::F32) => bytemuck::cast_slice(s).to_vec(),
        (HostSlice::F16(s), Dtype::F16) => bytemuck::cast_slice(s).to_vec(),
        (HostSlice::Bf16(s), Dtype::Bf16) => bytemuck::cast_slice(s).to_vec(),
        (x, Dtype::F32) => bytemuck::cast_slice(&x.to_f32_vec()).to_vec(),
        (HostSlice::F32(s), Dtype::F16) => bytemuck::cast_slice(&s.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>()).to_vec(),
        (HostSlice::Bf16(s), Dtype::F16) => bytemuck::cast_slice(&s.iter().map(|&a| f16::from_f32(a.to_f32())).collect::<Vec<_>>()).to_vec(),
        (HostSlice::F32(s), Dtype::Bf16) => bytemuck::cast_slice(&s.iter().map(|&a| bf16::from_f32(a)).collect::<Vec<_>>()).to_vec(),
        (HostSlice::F16(s), Dtype::Bf16) => bytemuck::cast_slice(&s.iter().map(|&a| bf16::from_f32(a.to_f32())).collect::<Vec<_>>()).to_vec(),
    }
}

pub(crate) fn from_bytes(b: &[u8], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(b),
        Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(b).into_iter().map(f16::to_f32).collect(),
        Dtype::Bf16 => bytemuck::pod_collect_to_vec::<u8, bf16>(b).into_iter().map(bf16::to_f32).collect(),
    }
}

impl<R: Runtime> Backend for CubeclBackend<R> {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn plan(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<Planned> {
        registry::walk(&table::<R>(), self, &self.device_name(), problem, precision, strategy)
    }

    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        Ok(Box::new(self.upload_data(plan, q, k, v)?))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        let d = self.data(plan, data)?;
        self.launch(plan, d)
    }

    fn synchronize(&self) -> Result<()> {
        pollster::block_on(self.client.sync()).map_err(|e| Error::Kernel { kernel: "synchronize".into(), reason: format!("{e:?}") })
    }

    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let d = self.data(plan, data)?;
        let read = |h: &Handle| {
            self.client.read_one(h.clone()).map_err(|e| Error::Kernel { kernel: plan.kernel_name(), reason: format!("read back: {e:?}") })
        };
        // The 4-bit kernel writes O in f32.
        let o_dtype = if d.fp4.is_some() { Dtype::F32 } else { plan.dtype() };
        let o = from_bytes(&read(&d.o)?, o_dtype);
        let lse = match &d.lse {
            Some(h) => Some(from_bytes(&read(h)?, Dtype::F32)),
            None => None,
        };
        Ok((o[..plan.problem.o_len_elems()].to_vec(), lse.map(|l| l[..plan.problem.lse_len_elems()].to_vec())))
    }

    /// CubeCL's profiler (CUDA events) on CUDA; the host clock on wgpu adapters, whose timestamp
    /// queries undercount SPIR-V cooperative-matrix kernels on NVIDIA's Vulkan driver 2.5x (a
    /// device-bound launch loop takes 13 ms per launch where the timestamps say 5.2). Each wgpu
    /// sample is a batch of [`WGPU_TIMING_BATCH`] executions per synchronization: one wgpu
    /// synchronization per launch adds up to 6 ms to a 13 ms launch there.
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
                .map_err(|e| Error::Kernel { kernel: plan.kernel_name(), reason: format!("profiling: {e:?}") })?;
            r?;
            out.push(pollster::block_on(dur.resolve()).duration().as_secs_f64() * 1e3);
        }
        Ok(out)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn cubecl(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn run_handles(&self, plan: &Plan, t: &CubeclTensors<'_>) -> Result<()> {
        // An LSE handle is written only when the problem asks for the LSE.
        let lse = if plan.problem.return_lse { t.lse.cloned() } else { None };
        // The offsets are host data of the plan: copied when they are not the held ones.
        let varlen = self.held_varlen(plan)?;
        let d = GpuData { q: t.q.clone(), k: t.k.clone(), v: t.v.clone(), o: t.o.clone(), lse, descales: None, fp4: None, varlen };
        self.launch(plan, &d)
    }
}
