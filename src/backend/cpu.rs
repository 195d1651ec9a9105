//! The CPU backend: multi-threaded, straightforward attention so the library works on any
//! machine. Inputs are rounded to the precision's element type (what a GPU kernel would read),
//! logits, softmax and accumulation are f32, and P is rounded to the 16-bit type before P·V as a
//! tensor-core kernel does.
//!
//! FP8 (`Precision::Fp8`): the inputs are quantized at upload to codes with f32 descales
//! (`codec::fp8_scaled`, descale blocks of the plan's blocking), and the kernel reads the codes:
//! `s = (Σ q·k) · (q_descale · k_descale)` on decoded values, P rounded to f16, each key's V
//! term scaled by its V descale.
//!
//! 4-bit (`Precision::Nvfp4`, `Precision::Mxfp4`): Q and K are quantized at upload to packed
//! E2M1 codes with their block scales (and V, for NVFP4 V, to codes along the key axis), through
//! the functions the emulation quantizes with, so both see the same codes. The kernel decodes
//! each row's codes as it reads them and follows the emulation's arithmetic in the plan's KV
//! tiles (an online softmax: P is rounded against the running max of each tile, and NVFP4 P
//! takes its block scales per tile), so it agrees with the emulation of its blocking to f32
//! rounding.

use rayon::prelude::*;

use super::{Backend, ResidentData};
use crate::error::{Error, Result};
use crate::codec::float16::{round_bf16, round_f16};
use crate::codec::fp4::{e2m1, BlockScaled4};
use crate::codec::fp8::{self, ue4m3};
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use crate::codec::mxfp4::Mxfp4Tensor;
use crate::codec::nvfp4::{self, Nvfp4Tensor};
use crate::codec::int8;
use crate::emulation::Blocking;
use crate::precision::{Dtype, Nvfp4V, PvAccum, PvFormat, QkAccum};
use crate::registry::{self, Choice, Family, KernelId, Planned, Reject, Row};
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Device, Precision, Strategy};

pub(crate) struct CpuBackend {
    threads: usize,
}

impl CpuBackend {
    pub(crate) fn new() -> Self {
        CpuBackend { threads: rayon::current_num_threads() }
    }
}

/// Inputs as the kernel reads them, O and LSE (f32) on the host.
struct CpuData {
    inputs: Inputs,
    o: Vec<f32>,
    lse: Vec<f32>,
}

enum Inputs {
    /// Values as the element type rounds them.
    Float { q: Vec<f32>, k: Vec<f32>, v: Vec<f32> },
    /// FP8 codes and descales.
    Fp8 { q: Fp8Tensor, k: Fp8Tensor, v: Fp8Tensor },
    /// NVFP4 Q and K codes.
    Nvfp4(Fp4Inputs<Nvfp4Tensor>),
    /// MXFP4 Q and K codes.
    Mxfp4(Fp4Inputs<Mxfp4Tensor>),
}

/// The inputs of the 4-bit kernel.
struct Fp4Inputs<T> {
    /// Q's rows `[batch, q_heads, q_len]`, codes along the head dim.
    q: T,
    /// K's (K − μ with smoothing) rows `[batch, kv_heads, kv_len]`, codes along the head dim.
    k: T,
    v: Fp4Values,
    /// With K smoothing, what it took off each query row's LSE (`scale · q·μ`), indexed
    /// `(b · q_heads + h) · q_len + i`; empty without.
    lse_shift: Vec<f32>,
}

enum Fp4Values {
    /// V in bf16, in the problem's layout.
    Bf16(Vec<half::bf16>),
    /// Vᵀ in NVFP4 (`emulation::values::quantize_vt_nvfp4`): channel rows over the keys; P
    /// quantized to NVFP4.
    Nvfp4(Nvfp4Tensor),
    /// Vᵀ as for `Nvfp4`; P rounded to f16.
    Nvfp4P16(Nvfp4Tensor),
}

/// The CPU's dispatch table: the float kernel, the FP8 kernel, the 4-bit kernel.
static TABLE: [Row<CpuBackend>; 3] = [
    Row { family: Family::Cpu, test: cpu_kernel },
    Row { family: Family::Cpu, test: cpu_fp8_kernel },
    Row { family: Family::Cpu, test: cpu_fp4_kernel },
];

/// Keys per KV tile of the 4-bit kernel (a multiple of 16: NVFP4 P's scale blocks).
const CPU_FP4_BLOCK_K: usize = 64;

fn cpu_fp4_kernel(_: &CpuBackend, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
    if !matches!(precision, Precision::Nvfp4 { .. } | Precision::Mxfp4 { .. }) {
        return registry::not_applicable(format!("{precision} is not a 4-bit mode"));
    }
    // Scale blocks run along contiguous sequences, and the kernel computes what the emulation
    // does, which has no score modifiers.
    registry::refuse_paged(problem, "the CPU 4-bit kernel")?;
    registry::refuse_varlen(problem, "the CPU 4-bit kernel")?;
    registry::refuse_modifiers(problem, "the CPU 4-bit kernel")?;
    let blocking = Blocking { block_k: CPU_FP4_BLOCK_K, ..Blocking::default() };
    blocking.validate(problem, precision)?;
    Ok(Choice { kernel: KernelId::CpuFp4 { precision, head_dim: problem.head_dim }, blocking: Some(blocking) })
}

/// Rows of Q and keys of K/V per FP8 descale block (`DescaleGranularity::PerBlock`).
const CPU_FP8_BLOCK: usize = 64;

fn cpu_fp8_kernel(_: &CpuBackend, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
    let Precision::Fp8 { format, descale, p } = precision else {
        return registry::not_applicable(format!("{precision} is not an FP8 mode"));
    };
    if p == PvFormat::Fp8 {
        // FP8 P is quantized against the running row max of each KV tile: its value depends on
        // the kernel's tiling, which a two-pass softmax does not have.
        return Err(Reject::Refused(Error::UnsupportedPrecision {
            precision,
            device: "cpu".into(),
            reason: "the CPU FP8 kernel rounds P to f16; FP8 P (quantized per KV tile against the running max) \
                     runs in the CPU emulation (Strategy::Reference)"
                .into(),
        }));
    }
    // FP8 descale blocks run along a contiguous sequence.
    registry::refuse_paged(problem, "the CPU FP8 kernel")?;
    registry::refuse_varlen(problem, "the CPU FP8 kernel")?;
    let blocking = Blocking { block_q: CPU_FP8_BLOCK, block_k: CPU_FP8_BLOCK, ..Blocking::default() };
    blocking.validate(problem, precision)?;
    Ok(Choice { kernel: KernelId::CpuFp8 { format, descale, p, head_dim: problem.head_dim }, blocking: Some(blocking) })
}

fn cpu_kernel(_: &CpuBackend, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
    let dtype = match precision {
        Precision::F32 => Dtype::F32,
        Precision::F16 { qk: QkAccum::F32, pv: PvAccum::F32 } => Dtype::F16,
        Precision::Bf16 { qk: QkAccum::F32, pv: PvAccum::F32 } => Dtype::Bf16,
        Precision::Fp8 { .. } => return registry::not_applicable("FP8 runs on the FP8 row"),
        Precision::Nvfp4 { .. } | Precision::Mxfp4 { .. } => return registry::not_applicable("4-bit modes run on the 4-bit row"),
        _ => {
            return Err(Reject::Refused(Error::UnsupportedPrecision {
                precision,
                device: "cpu".into(),
                reason: "the CPU kernel computes f32, f16 and bf16 with f32 accumulation; \
                         Strategy::Reference runs the CPU emulation of this mode"
                    .into(),
            }))
        }
    };
    Ok(Choice { kernel: KernelId::Cpu { dtype, head_dim: problem.head_dim }, blocking: None })
}

fn cpu_data<'a>(plan: &Plan, data: &'a mut ResidentData) -> Result<&'a mut CpuData> {
    data.downcast_mut::<CpuData>().ok_or_else(|| super::foreign(plan))
}

impl Backend for CpuBackend {
    fn info(&self) -> DeviceInfo {
        DeviceInfo { device: Device::Cpu, kind: "cpu", adapter: format!("CPU ({} threads)", self.threads) }
    }

    fn plan(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<Planned> {
        registry::walk(&TABLE, self, "cpu", problem, precision, strategy)
    }

    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData> {
        let p = &plan.problem;
        let inputs = match plan.kernel {
            KernelId::CpuFp8 { format, descale, .. } => {
                let b = plan.blocking.unwrap_or_default();
                // Quantized from the values a device receives (f16), as the emulation does.
                let dtype = plan.precision.input_dtype();
                let layout = |heads, len, block_rows| DescaleLayout { granularity: descale, batch: p.batch, heads, len, block_rows };
                Inputs::Fp8 {
                    q: Fp8Tensor::quantize(format, &q.rounded_to(dtype), p.q_strides(), p.head_dim, layout(p.q_heads, p.q_len, b.block_q))?,
                    k: Fp8Tensor::quantize(format, &k.rounded_to(dtype), p.k_strides(), p.head_dim, layout(p.kv_heads, p.kv_len, b.block_k))?,
                    v: Fp8Tensor::quantize(format, &v.rounded_to(dtype), p.v_strides(), p.v_head_dim, layout(p.kv_heads, p.kv_len, b.block_k))?,
                }
            }
            KernelId::CpuFp4 { precision, .. } => {
                let dtype = precision.input_dtype();
                let (q, k, v) = (q.rounded_to(dtype), k.rounded_to(dtype), v.rounded_to(dtype));
                let (smooth_k, v_format) = match precision {
                    Precision::Nvfp4 { v, smooth_k } => (smooth_k, v),
                    Precision::Mxfp4 { smooth_k } => (smooth_k, Nvfp4V::Bf16),
                    _ => return Err(super::foreign(plan)),
                };
                let values = match v_format {
                    Nvfp4V::Bf16 => Fp4Values::Bf16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
                    Nvfp4V::Nvfp4 => Fp4Values::Nvfp4(crate::emulation::quantize_vt_nvfp4(p, &v)?),
                    Nvfp4V::Nvfp4P16 => Fp4Values::Nvfp4P16(crate::emulation::quantize_vt_nvfp4(p, &v)?),
                };
                match precision {
                    Precision::Mxfp4 { .. } => Inputs::Mxfp4(Fp4Inputs::new(p, smooth_k, &q, &k, values, Mxfp4Tensor::quantize)?),
                    _ => Inputs::Nvfp4(Fp4Inputs::new(p, smooth_k, &q, &k, values, Nvfp4Tensor::quantize)?),
                }
            }
            _ => {
                let dtype = plan.precision.input_dtype();
                Inputs::Float { q: q.rounded_to(dtype), k: k.rounded_to(dtype), v: v.rounded_to(dtype) }
            }
        };
        Ok(Box::new(CpuData {
            inputs,
            o: vec![f32::NAN; p.o_len_elems()],
            lse: vec![f32::NAN; p.lse_len_elems()],
        }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        let d = cpu_data(plan, data)?;
        let p_round = match plan.kernel {
            KernelId::Cpu { dtype: Dtype::F32, .. } => PRound::None,
            KernelId::Cpu { dtype, .. } => PRound::To(dtype),
            KernelId::CpuFp8 { .. } => PRound::To(Dtype::F16),
            KernelId::CpuFp4 { .. } => {
                let blocking = plan.blocking.ok_or_else(|| super::foreign(plan))?;
                let CpuData { inputs, o, lse } = d;
                match inputs {
                    Inputs::Nvfp4(x) => forward_fp4(&plan.problem, &blocking, x, o, lse),
                    Inputs::Mxfp4(x) => forward_fp4(&plan.problem, &blocking, x, o, lse),
                    _ => return Err(super::foreign(plan)),
                }
                return Ok(());
            }
            _ => return Err(super::foreign(plan)),
        };
        forward(&plan.problem, p_round, d);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let d = data.downcast_ref::<CpuData>().ok_or_else(|| super::foreign(plan))?;
        Ok((d.o.clone(), plan.problem.return_lse.then(|| d.lse.clone())))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// How P is rounded before P·V.
#[derive(Clone, Copy)]
enum PRound {
    None,
    To(Dtype),
}

fn round(x: f32, r: PRound) -> f32 {
    match r {
        PRound::None | PRound::To(Dtype::F32) => x,
        PRound::To(Dtype::F16) => half::f16::from_f32(x).to_f32(),
        PRound::To(Dtype::Bf16) => half::bf16::from_f32(x).to_f32(),
    }
}

/// Read access to one input tensor: a row's values (FP8: decoded codes, without the descale) and
/// the row's factor (FP8: its descale; floats: 1).
trait Rows: Sync {
    fn row(&self, offset: usize, len: usize, out: &mut [f32]);
    fn factor(&self, b: usize, h: usize, row: usize) -> f32;
}

impl Rows for Vec<f32> {
    fn row(&self, offset: usize, len: usize, out: &mut [f32]) {
        out[..len].copy_from_slice(&self[offset..][..len]);
    }
    fn factor(&self, _: usize, _: usize, _: usize) -> f32 {
        1.0
    }
}

impl Rows for Fp8Tensor {
    fn row(&self, offset: usize, len: usize, out: &mut [f32]) {
        for (o, &c) in out[..len].iter_mut().zip(&self.codes[offset..][..len]) {
            *o = fp8::decode(self.format, c);
        }
    }
    fn factor(&self, b: usize, h: usize, row: usize) -> f32 {
        self.descales[self.layout.index(b, h, row)]
    }
}

fn forward(p: &AttentionProblem, p_round: PRound, data: &mut CpuData) {
    let CpuData { inputs, o, lse } = data;
    match inputs {
        Inputs::Float { q, k, v } => forward_rows(p, p_round, q, k, v, o, lse),
        Inputs::Fp8 { q, k, v } => forward_rows(p, p_round, q, k, v, o, lse),
        // Planned with the 4-bit kernel only (`execute` runs it).
        Inputs::Nvfp4(_) | Inputs::Mxfp4(_) => {}
    }
}

/// Where a K or V row starts: strided tensors, or a paged cache's pool.
enum KvIndex<'a> {
    Strided(crate::Strides),
    Paged { cache: &'a crate::paged::PagedKv, kv_heads: usize, dim: usize },
}

impl KvIndex<'_> {
    fn new(p: &AttentionProblem, strides: crate::Strides, dim: usize) -> KvIndex<'_> {
        match &p.paged {
            Some(cache) => KvIndex::Paged { cache, kv_heads: p.kv_heads, dim },
            None => KvIndex::Strided(strides),
        }
    }
    /// Key `j` of sequence `b`, KV head `h` (`b`, `j`: the tensor position, see
    /// [`AttentionProblem::k_position`], for strided tensors).
    #[inline]
    fn offset(&self, b: usize, h: usize, j: usize) -> usize {
        match self {
            KvIndex::Strided(s) => s.offset(b, h, j),
            KvIndex::Paged { cache, kv_heads, dim } => cache.offset(b, h, j, *kv_heads, *dim),
        }
    }
}

/// Rows are independent: one task per (batch, head, query row), each a two-pass softmax in f32
/// over the row's visible keys only (`visible_range`: keys a window or the causal mask hides
/// are never read). `s = (q · k) · (q_factor · k_factor) · scale`, then the score modifiers
/// (`modify_score`); each key's P·V term is `round(p) · v_factor · v`; a sink adds
/// `exp(sink − m)` to the denominator only. With a paged cache, K and V rows are read through the
/// block table and each sequence's masks measure against its own length.
fn forward_rows<T: Rows>(p: &AttentionProblem, p_round: PRound, q: &T, k: &T, v: &T, o: &mut [f32], lse: &mut [f32]) {
    let scale = p.softmax_scale();
    let (qs, os) = (p.q_strides(), p.o_strides());
    let (hd, dv) = (p.head_dim, p.v_head_dim);
    let (ks, vs) = (KvIndex::new(p, p.k_strides(), hd), KvIndex::new(p, p.v_strides(), dv));
    let seqs: Vec<std::borrow::Cow<'_, AttentionProblem>> = (0..p.batch).map(|b| p.sequence(b)).collect();
    // A variable-length batch's rows past a shorter sequence's end do not exist: skipped.
    let rows: Vec<(usize, usize, usize, Vec<f32>, f32)> = (0..p.batch * p.q_heads * p.q_len)
        .into_par_iter()
        .map(|r| (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len))
        .filter(|&(b, _, i)| p.has_q_row(b, i))
        .map_init(
            || (vec![0.0f32; p.kv_len], vec![0.0f32; hd], vec![0.0f32; hd.max(dv)]),
            |(s, qrow, row), (b, h, i)| {
                let kh = p.kv_head_of(h);
                let sp = &seqs[b];
                let keys = sp.visible_range(i);
                let mut out = vec![0.0f32; dv];
                if keys.is_empty() {
                    return (b, h, i, out, f32::NEG_INFINITY);
                }
                let (qb, qi) = p.q_position(b, i);
                q.row(qs.offset(qb, h, qi), hd, qrow);
                let qf = q.factor(b, h, i);
                let modified = p.softcap.is_some() || p.alibi_slopes.is_some();
                // One sink per head (validated at plan time).
                let sink = p.sinks.as_ref().and_then(|x| x.get(h).copied());
                let mut m = sink.unwrap_or(f32::NEG_INFINITY);
                for (j, sj) in keys.clone().zip(s.iter_mut()) {
                    let (kb, kj) = p.k_position(b, j);
                    k.row(ks.offset(kb, kh, kj), hd, row);
                    let dot = qrow.iter().zip(row.iter()).map(|(a, b)| a * b).sum::<f32>();
                    *sj = dot * (qf * k.factor(b, kh, j)) * scale;
                    if modified {
                        *sj = sp.modify_score(*sj, h, i, j);
                    }
                    // NaN scores (NaN codes) make the row NaN, as they do on a GPU.
                    m = if sj.is_nan() { f32::NAN } else { m.max(*sj) };
                }
                let mut l = sink.map_or(0.0, |x| (x - m).exp());
                for (j, &sj) in keys.zip(s.iter()) {
                    let e = (sj - m).exp();
                    l += e;
                    let pj = round(e, p_round) * v.factor(b, kh, j);
                    let (kb, kj) = p.k_position(b, j);
                    v.row(vs.offset(kb, kh, kj), dv, row);
                    for (oc, &vc) in out.iter_mut().zip(row.iter()) {
                        *oc += pj * vc;
                    }
                }
                for oc in out.iter_mut() {
                    *oc /= l;
                }
                (b, h, i, out, m + l.ln())
            },
        )
        .collect();
    for (b, h, i, out, l) in rows {
        let (ob, oi) = p.q_position(b, i);
        o[os.offset(ob, h, oi)..][..dv].copy_from_slice(&out);
        lse[p.lse_index(b, h, i)] = l;
    }
}

impl<T: BlockScaled4> Fp4Inputs<T> {
    /// `q`, `k` rounded to the mode's input dtype; `quantize` the format's tensor quantizer.
    fn new(
        p: &AttentionProblem,
        smooth_k: bool,
        q: &[f32],
        k: &[f32],
        v: Fp4Values,
        quantize: impl Fn(&[f32], usize, usize) -> Result<T>,
    ) -> Result<Self> {
        let t = crate::emulation::quantize_qk_4bit(p, smooth_k, q, k, quantize)?;
        let d = p.head_dim;
        let lse_shift = match &t.mean {
            Some(mean) => (0..p.batch * p.q_heads * p.q_len)
                .map(|r| {
                    let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
                    let q_row = &q[p.q_strides().offset(b, h, i)..][..d];
                    int8::lse_shift(q_row, &mean[(b * p.kv_heads + p.kv_head_of(h)) * d..][..d], p.softmax_scale())
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(Fp4Inputs { q: t.q, k: t.k, v, lse_shift })
    }
}

/// The E2M1 values of the low and high nibble of every byte.
fn e2m1_pairs() -> [[f32; 2]; 256] {
    std::array::from_fn(|b| [e2m1::decode(b as u8), e2m1::decode((b >> 4) as u8)])
}

/// Decodes the E2M1 codes of `bytes` (two per byte, low nibble first) into `out`.
#[inline]
fn decode_codes(bytes: &[u8], pairs: &[[f32; 2]; 256], out: &mut [f32]) {
    for (o, &b) in out.chunks_exact_mut(2).zip(bytes) {
        o.copy_from_slice(&pairs[b as usize]);
    }
}

/// The 4-bit kernel: one task per query row, an online softmax over KV tiles of
/// `blocking.block_k` keys in the order and with the roundings of the emulation's `row` (module
/// docs of [`crate::emulation`]): per key the block-scaled dot product of the decoded Q and K
/// codes, `p = exp2(fma(s, c, −m·c))` against the tile's running max, `l` from the unrounded p;
/// bf16 V: P rounded to bf16, products summed per `k_step` keys into the rescaled f32
/// accumulator; NVFP4 V: P quantized per 16-key block with the fixed tensor scale
/// `tensor_scale_for(1.0)`, per block `(sp · sv) · Σ e2m1·e2m1`, the tile's sum times both tensor
/// scales; NVFP4 V with f16 P: per stretch of the tile's keys in one V block `sv · Σ p16·e2m1`,
/// the tile's sum times V's tensor scale. LSE `m · scale + ln l` plus the smoothing shift.
fn forward_fp4<T: BlockScaled4 + Sync>(p: &AttentionProblem, blocking: &Blocking, x: &Fp4Inputs<T>, o: &mut [f32], lse: &mut [f32]) {
    let pairs = e2m1_pairs();
    let scale_of: [f32; 256] = std::array::from_fn(|c| T::decode_scale(c as u8));
    let ue4m3_of: [f32; 256] = std::array::from_fn(|c| ue4m3::decode(c as u8));
    let (d, dv, bk, ks, bs) = (p.head_dim, p.v_head_dim, blocking.block_k, blocking.k_step, T::BLOCK);
    let nb = d / bs;
    let c = p.softmax_scale() * std::f32::consts::LOG2_E;
    let ts = x.q.tensor_scale() * x.k.tensor_scale();
    let vs = p.v_strides();
    let p_ts = nvfp4::tensor_scale_for(1.0);
    let rows: Vec<(Vec<f32>, f32)> = (0..p.batch * p.q_heads * p.q_len)
        .into_par_iter()
        .map_init(
            || (vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; bk], vec![0.0f32; bk], vec![0.0f32; dv], [0.0f32; nvfp4::BLOCK]),
            |(qv, kv, s, pr, tile_sum, pe), r| {
                let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
                let visible = p.visible_keys(i);
                let mut acc = vec![0.0f32; dv];
                if visible == 0 {
                    return (acc, f32::NEG_INFINITY);
                }
                let kvh = p.kv_head_of(h);
                decode_codes(&x.q.packed()[r * d / 2..][..d / 2], &pairs, qv);
                let q_scales = &x.q.scale_codes()[r * nb..][..nb];
                let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
                for tile in 0..visible.div_ceil(bk) {
                    let k0 = tile * bk;
                    let n = bk.min(p.kv_len - k0);
                    for (jj, sj) in s[..n].iter_mut().enumerate() {
                        let j = k0 + jj;
                        if j >= visible {
                            *sj = f32::NEG_INFINITY;
                            continue;
                        }
                        let kr = (b * p.kv_heads + kvh) * p.kv_len + j;
                        decode_codes(&x.k.packed()[kr * d / 2..][..d / 2], &pairs, kv);
                        let k_scales = &x.k.scale_codes()[kr * nb..][..nb];
                        let mut dot = 0.0f32;
                        for blk in 0..nb {
                            let inner = qv[blk * bs..][..bs].iter().zip(&kv[blk * bs..][..bs]).fold(0.0f32, |a, (x, y)| a + x * y);
                            dot += (scale_of[q_scales[blk] as usize] * scale_of[k_scales[blk] as usize]) * inner;
                        }
                        *sj = dot * ts;
                    }
                    let m_new = s[..n].iter().fold(m, |a, &v| a.max(v));
                    if m_new == f32::NEG_INFINITY {
                        continue;
                    }
                    let mc = m_new * c;
                    for (pj, &sj) in pr[..n].iter_mut().zip(&s[..n]) {
                        *pj = if sj == f32::NEG_INFINITY { 0.0 } else { sj.mul_add(c, -mc).exp2() };
                    }
                    let alpha = if m == f32::NEG_INFINITY { 0.0 } else { ((m - m_new) * c).exp2() };
                    l = l * alpha + pr[..n].iter().sum::<f32>();
                    match &x.v {
                        Fp4Values::Bf16(v) => {
                            acc.iter_mut().for_each(|a| *a *= alpha);
                            for (st, ps) in pr[..n].chunks(ks).enumerate() {
                                tile_sum.fill(0.0);
                                for (jj, &pj) in ps.iter().enumerate() {
                                    let pj = round_bf16(pj);
                                    let row = &v[vs.offset(b, kvh, k0 + st * ks + jj)..][..dv];
                                    for (t, &vc) in tile_sum.iter_mut().zip(row) {
                                        *t += pj * vc.to_f32();
                                    }
                                }
                                acc.iter_mut().zip(tile_sum.iter()).for_each(|(a, t)| *a += t);
                            }
                        }
                        Fp4Values::Nvfp4(vt) => {
                            let nbv = vt.cols / nvfp4::BLOCK;
                            tile_sum.fill(0.0);
                            for (bi, pb) in pr[..n].chunks(nvfp4::BLOCK).enumerate() {
                                let amax = pb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                                let code = nvfp4::block_scale_code(amax, p_ts);
                                for (e, &pj) in pe.iter_mut().zip(pb) {
                                    *e = e2m1::decode(nvfp4::encode_element(pj, code, p_ts));
                                }
                                let p_scale = ue4m3::decode(code);
                                let blk = (k0 + bi * nvfp4::BLOCK) / nvfp4::BLOCK;
                                let mut ve = [0.0f32; nvfp4::BLOCK];
                                for (ch, t) in tile_sum.iter_mut().enumerate() {
                                    let row = (b * p.kv_heads + kvh) * dv + ch;
                                    decode_codes(&vt.packed[(row * vt.cols + blk * nvfp4::BLOCK) / 2..][..nvfp4::BLOCK / 2], &pairs, &mut ve);
                                    let inner = pe[..pb.len()].iter().zip(&ve).fold(0.0f32, |a, (x, y)| a + x * y);
                                    *t += (p_scale * ue4m3_of[vt.block_scales[row * nbv + blk] as usize]) * inner;
                                }
                            }
                            let f = p_ts * vt.tensor_scale;
                            acc.iter_mut().zip(tile_sum.iter()).for_each(|(a, t)| *a = *a * alpha + t * f);
                        }
                        Fp4Values::Nvfp4P16(vt) => {
                            let nbv = vt.cols / nvfp4::BLOCK;
                            pr[..n].iter_mut().for_each(|x| *x = round_f16(*x));
                            tile_sum.fill(0.0);
                            let mut ve = [0.0f32; nvfp4::BLOCK];
                            let mut start = 0;
                            while start < n {
                                let blk = (k0 + start) / nvfp4::BLOCK;
                                let end = ((blk + 1) * nvfp4::BLOCK - k0).min(n);
                                let (ps, off) = (&pr[start..end], (k0 + start) % nvfp4::BLOCK);
                                for (ch, t) in tile_sum.iter_mut().enumerate() {
                                    let row = (b * p.kv_heads + kvh) * dv + ch;
                                    decode_codes(&vt.packed[(row * vt.cols + blk * nvfp4::BLOCK) / 2..][..nvfp4::BLOCK / 2], &pairs, &mut ve);
                                    let inner = ps.iter().zip(&ve[off..]).fold(0.0f32, |a, (x, y)| a + x * y);
                                    *t += ue4m3_of[vt.block_scales[row * nbv + blk] as usize] * inner;
                                }
                                start = end;
                            }
                            let f = vt.tensor_scale;
                            acc.iter_mut().zip(tile_sum.iter()).for_each(|(a, t)| *a = *a * alpha + t * f);
                        }
                    }
                    m = m_new;
                }
                if l == 0.0 {
                    return (vec![0.0; dv], f32::NEG_INFINITY);
                }
                acc.iter_mut().for_each(|a| *a /= l);
                let shift = x.lse_shift.get(r).copied().unwrap_or(0.0);
                (acc, m * p.softmax_scale() + l.ln() + shift)
            },
        )
        .collect();
    let os = p.o_strides();
    for (r, (out, l)) in rows.into_iter().enumerate() {
        let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
        o[os.offset(b, h, i)..][..dv].copy_from_slice(&out);
        lse[p.lse_index(b, h, i)] = l;
    }
}
