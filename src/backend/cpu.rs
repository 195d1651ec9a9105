//! The CPU backend: multi-threaded, straightforward attention so the library works on any
//! machine. Inputs are rounded to the precision's element type (what a GPU kernel would read),
//! logits, softmax and accumulation are f32, and P is rounded to the 16-bit type before P·V as a
//! tensor-core kernel does.

use rayon::prelude::*;

use super::{Backend, ResidentData};
use crate::error::{Error, Result};
use crate::precision::{Dtype, PvAccum, QkAccum};
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

/// Inputs as the element type rounds them, O and LSE, all f32 on the host.
struct CpuData {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    lse: Vec<f32>,
}

/// The CPU's dispatch table: one kernel.
static TABLE: [Row<CpuBackend>; 1] = [Row { family: Family::Cpu, test: cpu_kernel }];

fn cpu_kernel(_: &CpuBackend, problem: &AttentionProblem, precision: Precision) -> std::result::Result<Choice, Reject> {
    let dtype = match precision {
        Precision::F32 => Dtype::F32,
        Precision::F16 { qk: QkAccum::F32, pv: PvAccum::F32 } => Dtype::F16,
        Precision::Bf16 { qk: QkAccum::F32, pv: PvAccum::F32 } => Dtype::Bf16,
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
        let dtype = plan.precision.input_dtype();
        let p = &plan.problem;
        Ok(Box::new(CpuData {
            q: q.rounded_to(dtype),
            k: k.rounded_to(dtype),
            v: v.rounded_to(dtype),
            o: vec![f32::NAN; p.o_len_elems()],
            lse: vec![f32::NAN; p.lse_len_elems()],
        }))
    }

    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()> {
        let d = cpu_data(plan, data)?;
        let p_round = match plan.kernel {
            KernelId::Cpu { dtype: Dtype::F32, .. } => None,
            KernelId::Cpu { dtype, .. } => Some(dtype),
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

fn round(x: f32, dtype: Option<Dtype>) -> f32 {
    match dtype {
        None | Some(Dtype::F32) => x,
        Some(Dtype::F16) => half::f16::from_f32(x).to_f32(),
        Some(Dtype::Bf16) => half::bf16::from_f32(x).to_f32(),
    }
}

/// Rows are independent: one task per (batch, head, query row), each a two-pass softmax in f32.
fn forward(p: &AttentionProblem, p_round: Option<Dtype>, data: &mut CpuData) {
    let CpuData { q, k, v, o, lse } = data;
    let scale = p.softmax_scale();
    let (qs, ks, vs, os) = (p.q_strides(), p.k_strides(), p.v_strides(), p.o_strides());
    let (hd, dv) = (p.head_dim, p.v_head_dim);
    let rows: Vec<(usize, usize, usize, Vec<f32>, f32)> = (0..p.batch * p.q_heads * p.q_len)
        .into_par_iter()
        .map_init(
            || vec![0.0f32; p.kv_len],
            |s, r| {
                let (b, h, i) = (r / (p.q_heads * p.q_len), (r / p.q_len) % p.q_heads, r % p.q_len);
                let kh = p.kv_head_of(h);
                let n = p.visible_keys(i);
                let mut out = vec![0.0f32; dv];
                if n == 0 {
                    return (b, h, i, out, f32::NEG_INFINITY);
                }
                let qrow = &q[qs.offset(b, h, i)..][..hd];
                let mut m = f32::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate().take(n) {
                    let krow = &k[ks.offset(b, kh, j)..][..hd];
                    *sj = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f32>() * scale;
                    m = m.max(*sj);
                }
                let mut l = 0.0f32;
                for (j, &sj) in s.iter().enumerate().take(n) {
                    let e = (sj - m).exp();
                    l += e;
                    let pj = round(e, p_round);
                    let vrow = &v[vs.offset(b, kh, j)..][..dv];
                    for (oc, &vc) in out.iter_mut().zip(vrow) {
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
        o[os.offset(b, h, i)..][..dv].copy_from_slice(&out);
        lse[(b * p.q_heads + h) * p.q_len + i] = l;
    }
}
