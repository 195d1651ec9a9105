//! The CPU backend: multi-threaded, straightforward attention so the library works on any
//! machine. Inputs are rounded to the precision's element type (what a GPU kernel would read),
//! logits, softmax and accumulation are f32, and P is rounded to the 16-bit type before P·V as a
//! tensor-core kernel does.
//!
//! FP8 (`Precision::Fp8`): the inputs are quantized at upload to codes with f32 descales
//! (`codec::fp8_scaled`, descale blocks of the plan's blocking), and the kernel reads the codes:
//! `s = (Σ q·k) · (q_descale · k_descale)` on decoded values, P rounded to f16, each key's V
//! term scaled by its V descale.

use rayon::prelude::*;

use super::{Backend, ResidentData};
use crate::error::{Error, Result};
use crate::codec::fp8;
use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use crate::emulation::Blocking;
use crate::precision::{Dtype, PvAccum, PvFormat, QkAccum};
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
}

/// The CPU's dispatch table: the float kernel, the FP8 kernel.
static TABLE: [Row<CpuBackend>; 2] =
    [Row { family: Family::Cpu, test: cpu_kernel }, Row { family: Family::Cpu, test: cpu_fp8_kernel }];

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
