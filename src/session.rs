//! [`Session`]: device state kept across calls (clients, compiled kernels), planning, upload,
//! launch and timing.

use crate::backend::{self, Backend, ResidentData};
use crate::emulation::{self, Blocking};
use crate::error::{Error, Result};
use crate::nonfinite;
use crate::registry::{Family, KernelId};
use crate::tensor::{Element, HostSlice};
use crate::{AttentionProblem, Device, Precision, Strategy};

/// What a session runs on, as reported to users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub device: Device,
    /// `cpu`, `wgpu` (WGSL), `wgpu-spirv` (CubeCL's SPIR-V compiler on Vulkan) or `cuda`.
    pub kind: &'static str,
    /// Adapter or GPU name.
    pub adapter: String,
}

/// The path a plan takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A kernel of the session's backend.
    Device,
    /// The CPU emulation of the precision ([`Strategy::Reference`]).
    Emulation,
}

/// A validated problem with its kernel chosen and configured; reusable across calls. Every
/// execution runs exactly [`Plan::kernel`]: nothing is re-selected per call. A paged cache's
/// block table and lengths and a variable-length batch's offsets are host data of the plan
/// (immutable `Arc`s): the GPU backends skip copying them to the device while consecutive
/// calls' plans hold the same `Arc`s (see [`crate::paged`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub problem: AttentionProblem,
    pub precision: Precision,
    pub strategy: Strategy,
    /// The kernel that will run, with its resolved configuration.
    pub kernel: KernelId,
    /// The tile shape the path's quantization follows (`block_q`, `block_k`, `warps`,
    /// `qk_chunk`, `k_step`): the INT8 scale layout depends on it, so the CPU emulation must use
    /// the same to agree with the kernel. `Some(Blocking::default())` on the emulation path;
    /// `None` for kernels whose numerics do not depend on a blocking.
    pub blocking: Option<Blocking>,
    /// The families the dispatch table tried before this one, with the reason each gave.
    pub rejected: Vec<(Family, String)>,
}

impl Plan {
    /// The kernel's display name (reports and logs; dispatch never reads it).
    pub fn kernel_name(&self) -> String {
        self.kernel.name()
    }

    /// The kernel's family.
    pub fn family(&self) -> Family {
        self.kernel.family()
    }

    /// Which path the plan takes.
    pub fn path(&self) -> Path {
        match self.kernel {
            KernelId::Emulation { .. } => Path::Emulation,
            _ => Path::Device,
        }
    }

    /// Element type of Q, K, V and O on the device (O only, for FP8 plans: their inputs are
    /// FP8 codes).
    pub fn dtype(&self) -> crate::Dtype {
        self.precision.input_dtype()
    }

    /// For a plan on an FP8 kernel, the number of f32 descales of Q, K and V its granularity
    /// takes: on the portable FP8 kernel, descale blocks of its query and key tiles
    /// (`blocking`'s `block_q` and `block_k`); on the native FP8 kernels, `[1]` per tensor or
    /// `[batch, heads]` per head. `None` for other plans.
    pub fn fp8_descale_lens(&self) -> Option<[usize; 3]> {
        let p = &self.problem;
        match &self.kernel {
            KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Fp8(fp8), .. } => {
                let (bq, bk) = fp8.descale_blocks();
                let g = fp8.granularity;
                Some([g.count(p.batch, p.q_heads, p.q_len, bq), g.count(p.batch, p.kv_heads, p.kv_len, bk), g.count(p.batch, p.kv_heads, p.kv_len, bk)])
            }
            KernelId::Native(_) => match self.precision {
                crate::Precision::Fp8 { descale, .. } => crate::codec::fp8_scaled::descale_counts(p, descale),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether the plan runs the portable FP8 kernel (codes and descales in CubeCL handles).
    pub(crate) fn is_portable_fp8(&self) -> bool {
        matches!(self.kernel, KernelId::Portable { kernel: quattn_cubecl::PortableKernel::Fp8(_), .. })
    }
}

/// Result of one call: O in the problem's layout (f32), LSE `[batch, q_heads, q_len]` when asked.
#[derive(Debug, Clone)]
pub struct Output {
    pub o: Vec<f32>,
    pub lse: Option<Vec<f32>>,
    pub kernel: String,
}

/// Inputs (and output buffers) living on the session's device, so repeated launches and timing
/// exclude host transfers.
pub struct Resident {
    plan: Plan,
    data: ResidentData,
    /// The rows that see a non-finite input, set to NaN on download.
    poison: Option<nonfinite::Poison>,
}

impl Resident {
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
}

/// Host copies for the emulation path.
struct EmulationData {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Option<(Vec<f32>, Vec<f32>)>,
}

/// Device state kept across calls: the device's clients, compiled kernels and dispatch table.
/// `Send + Sync`: one session serves many threads.
///
/// Every problem [`Session::plan`] accepts also runs: what a backend cannot compute is refused
/// there with a typed error, and a problem that is invalid everywhere (a zero size, a
/// non-positive or non-finite scale, a GQA ratio that is not an integer) gets the same error on
/// every backend. Host inputs follow the [NaN policy](crate::nonfinite): a row that sees a NaN
/// or ±inf comes out NaN, every other row as if those values were 0, on every backend alike.
///
/// ```
/// use quattn::{AttentionProblem, Device, Precision, Session, Strategy};
///
/// let session = Session::new(Device::Cpu)?;
/// let problem = AttentionProblem::new(1, 2, 16, 32).causal(true).with_lse(true);
/// let plan = session.plan(&problem, Precision::F32, Strategy::Auto)?; // typed errors happen here
/// assert_eq!(plan.kernel_name(), "fwd_cpu_f32_d32");
/// let q: Vec<f32> = (0..problem.q_len_elems()).map(|i| (i % 7) as f32 * 0.1).collect();
/// let v = vec![0.25f32; problem.v_len_elems()];
/// let out = session.run(&plan, &q, &q, &v)?;
/// // Every value of V is 0.25, so every weighted average is too.
/// assert!(out.o.iter().all(|&x| (x - 0.25).abs() < 1e-6));
/// // Row 0 sees one key (causal): its LSE is that key's scaled logit.
/// let lse = out.lse.expect("asked for");
/// assert!(lse[0].is_finite());
/// # Ok::<(), quattn::Error>(())
/// ```
pub struct Session {
    backend: Box<dyn Backend>,
}

impl Session {
    /// Opens `device`. `Device::Auto` takes the best device present: a CUDA GPU, else a hardware
    /// wgpu adapter, else the CPU.
    pub fn new(device: Device) -> Result<Session> {
        let backend = backend::open(device)?;
        let s = Session { backend };
        log::info!("quattn session on {:?}", s.info());
        Ok(s)
    }

    pub fn info(&self) -> DeviceInfo {
        self.backend.info()
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Validates the problem and picks the kernel; all checks happen here, before any work.
    pub fn plan(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<Plan> {
        problem.validate()?;
        precision.validate()?;
        let (kernel, blocking, rejected) = match strategy {
            Strategy::Reference => {
                // The emulations model the kernels' arithmetic, not the score modifiers.
                crate::registry::refuse_modifiers(problem, "the CPU emulation (Strategy::Reference)")?;
                crate::registry::refuse_paged(problem, "the CPU emulation (Strategy::Reference)")?;
                crate::registry::refuse_varlen(problem, "the CPU emulation (Strategy::Reference)")?;
                let blocking = Blocking::default();
                blocking.validate(problem, precision)?;
                (KernelId::Emulation { precision, blocking }, Some(blocking), Vec::new())
            }
            _ => {
                let planned = self.backend.plan(problem, precision, strategy)?;
                (planned.choice.kernel, planned.choice.blocking, planned.rejected)
            }
        };
        Ok(Plan { problem: problem.clone(), precision, strategy, kernel, blocking, rejected })
    }

    /// Plans and runs in one call, host slices in, host vectors out.
    pub fn run<T: Element>(&self, plan: &Plan, q: &[T], k: &[T], v: &[T]) -> Result<Output> {
        let mut r = self.upload(plan, q, k, v)?;
        self.execute(&mut r)?;
        self.download(&r)
    }

    pub fn upload<T: Element>(&self, plan: &Plan, q: &[T], k: &[T], v: &[T]) -> Result<Resident> {
        self.upload_slices(plan, T::host_slice(q), T::host_slice(k), T::host_slice(v))
    }

    /// Like [`Session::upload`] with element types chosen at run time.
    ///
    /// Inputs follow the [NaN policy](crate::nonfinite): a finite value the plan's element
    /// type cannot hold is [`Error::InputOverflow`]; NaN and ±inf reach no kernel, and the rows that
    /// see them come out NaN from [`Session::download`].
    pub fn upload_slices(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<Resident> {
        plan.problem.check_lengths(q.len(), k.len(), v.len())?;
        let screened = nonfinite::screen(&plan.problem, plan.precision, q, k, v)?;
        fn pick<'a>(copy: &'a Option<nonfinite::Owned>, x: HostSlice<'a>) -> HostSlice<'a> {
            copy.as_ref().map_or(x, |c| c.slice())
        }
        let (q, k, v) = (pick(&screened.q, q), pick(&screened.k, k), pick(&screened.v, v));
        let data: ResidentData = match plan.path() {
            Path::Emulation => Box::new(EmulationData { q: q.to_f32_vec(), k: k.to_f32_vec(), v: v.to_f32_vec(), out: None }),
            Path::Device => self.backend.upload(plan, q, k, v)?,
        };
        Ok(Resident { plan: plan.clone(), data, poison: screened.poison })
    }

    /// Launches on the resident data; on GPUs this may return before the device finishes.
    pub fn execute(&self, r: &mut Resident) -> Result<()> {
        match r.plan.path() {
            Path::Emulation => {
                let d = emulation_data(&r.plan, &mut r.data)?;
                d.out = Some(run_emulation(&r.plan, &d.q, &d.k, &d.v)?);
                Ok(())
            }
            Path::Device => self.backend.execute(&r.plan, &mut r.data),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        self.backend.synchronize()
    }

    /// Waits for the device and copies O (and LSE) back. Rows that see a non-finite input are
    /// NaN; rows whose inputs are finite and whose output is not are [`Error::Overflow`] (the
    /// [NaN policy](crate::nonfinite)).
    pub fn download(&self, r: &Resident) -> Result<Output> {
        let (mut o, mut lse) = match r.plan.path() {
            Path::Emulation => {
                let d = r.data.downcast_ref::<EmulationData>().and_then(|d| d.out.as_ref()).ok_or_else(|| Error::Kernel {
                    kernel: r.plan.kernel_name(),
                    reason: "download before execute".into(),
                })?;
                (d.0.clone(), r.plan.problem.return_lse.then(|| d.1.clone()))
            }
            Path::Device => {
                self.backend.synchronize()?;
                self.backend.download(&r.plan, &r.data)?
            }
        };
        let kernel = r.plan.kernel_name();
        nonfinite::finish(&r.plan.problem, r.plan.precision, &kernel, r.poison.as_ref(), &mut o, lse.as_deref_mut())?;
        Ok(Output { o, lse, kernel })
    }

    /// The INT8 Q/K codes, scales, K mean and LSE shift the last [`Session::execute`] of an
    /// INT8 plan produced, read back (after waiting for the device), where the backend keeps
    /// them: the native CUDA path. `None` for other plans and backends. For checking a device
    /// prepass against the codec (`codec::int8::verify_operands`).
    pub fn int8_operands(&self, r: &Resident) -> Result<Option<crate::codec::int8::Int8Operands>> {
        match r.plan.path() {
            Path::Device => self.backend.int8_operands(&r.plan, &r.data),
            Path::Emulation => Ok(None),
        }
    }

    /// The FP8 codes and descales a native CUDA FP8 plan's upload quantized on the device, read
    /// back (after waiting for the device); `None` for other plans and backends. For checking the
    /// device prepass against the codec ([`crate::codec::fp8_scaled::Fp8Tensor::matches`]).
    pub fn fp8_operands(&self, r: &Resident) -> Result<Option<crate::codec::fp8_scaled::Fp8Operands>> {
        match r.plan.path() {
            Path::Device => self.backend.fp8_operands(&r.plan, &r.data),
            Path::Emulation => Ok(None),
        }
    }

    /// Milliseconds of the attention kernel alone where a plan runs in steps (the INT8 prepass
    /// and a native kernel): `None` when [`Session::time`] already measures only the kernel.
    pub fn time_kernel(&self, r: &mut Resident, warmup: usize, iters: usize) -> Result<Option<Vec<f64>>> {
        match r.plan.path() {
            Path::Device => self.backend.time_kernel(&r.plan, &mut r.data, warmup, iters),
            Path::Emulation => Ok(None),
        }
    }

    /// Milliseconds per execution on resident data: `iters` samples after `warmup` runs, timed
    /// on the device where the backend can.
    pub fn time(&self, r: &mut Resident, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        match r.plan.path() {
            Path::Device => self.backend.time(&r.plan, &mut r.data, warmup, iters),
            Path::Emulation => {
                let mut v = Vec::with_capacity(iters);
                for i in 0..warmup + iters {
                    let t = std::time::Instant::now();
                    self.execute(r)?;
                    if i >= warmup {
                        v.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                Ok(v)
            }
        }
    }
}

/// The CPU emulation of the plan's precision: (O, LSE).
fn run_emulation(plan: &Plan, q: &[f32], k: &[f32], v: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
    let out = emulation::emulate(&plan.problem, plan.precision, &plan.blocking.unwrap_or_default(), q, k, v)?;
    Ok((out.o, out.lse))
}

fn emulation_data<'a>(plan: &Plan, data: &'a mut ResidentData) -> Result<&'a mut EmulationData> {
    data.downcast_mut::<EmulationData>().ok_or_else(|| Error::Kernel {
        kernel: plan.kernel_name(),
        reason: "resident data belongs to another path".into(),
    })
}

/// One-call attention on the best device present with the accurate default strategy.
pub fn attention<T: Element>(
    problem: &AttentionProblem,
    precision: Precision,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<Output> {
    let s = Session::new(Device::Auto)?;
    let plan = s.plan(problem, precision, Strategy::Auto)?;
    s.run(&plan, q, k, v)
}
