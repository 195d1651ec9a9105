//! Backends: one per device class, behind one trait, so the session needs no `#[cfg]`.
//! A backend whose feature is off is still named; opening it returns
//! [`Error::NotCompiledWith`].

pub(crate) mod cpu;

use std::any::Any;
use std::time::Instant;

use crate::error::Result;
use crate::session::{DeviceInfo, Plan};
use crate::tensor::HostSlice;
use crate::{AttentionProblem, Precision, Strategy};

/// Device-resident inputs and outputs of one planned call (backend-specific).
pub(crate) type ResidentData = Box<dyn Any + Send>;

/// What a backend picked for a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelChoice {
    /// Kernel name, `fwd_{arch}_{qk}_{pv}_d{hd}` style.
    pub name: String,
    /// Why this kernel (and not a faster one) was chosen; logged.
    pub reason: String,
}

pub(crate) trait Backend: Send + Sync {
    fn info(&self) -> DeviceInfo;
    /// Picks the kernel for `strategy` (never `Reference`, which the session handles) or returns
    /// the typed error naming what is unsupported.
    fn select(&self, problem: &AttentionProblem, precision: Precision, strategy: Strategy) -> Result<KernelChoice>;
    fn upload(&self, plan: &Plan, q: HostSlice<'_>, k: HostSlice<'_>, v: HostSlice<'_>) -> Result<ResidentData>;
    /// Launches; may return before the device finishes.
    fn execute(&self, plan: &Plan, data: &mut ResidentData) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    /// O (problem layout) and LSE (`[batch, q_heads, q_len]`, when asked for) as f32.
    fn download(&self, plan: &Plan, data: &ResidentData) -> Result<(Vec<f32>, Option<Vec<f32>>)>;
    /// Milliseconds per execution, `iters` samples after `warmup` runs. Backends with device
    /// timers override this; the default times each synchronized run on the host.
    fn time(&self, plan: &Plan, data: &mut ResidentData, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        for _ in 0..warmup {
            self.execute(plan, data)?;
        }
        self.synchronize()?;
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            self.execute(plan, data)?;
            self.synchronize()?;
            out.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(out)
    }
}
