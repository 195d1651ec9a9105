//! The timing harness the register-only probes (`fma_peak_cuda`, `xu_probe_cuda`) share.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

pub type BoxErr = Box<dyn std::error::Error>;

/// Milliseconds per launch: two warm-up launches, then the best of three timings of `reps`
/// launches queued back to back between two events.
pub fn best_ms_per_launch(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    reps: u32,
    mut launch: impl FnMut() -> Result<(), BoxErr>,
) -> Result<f64, BoxErr> {
    for _ in 0..2 {
        launch()?;
    }
    // cudarc's default event flags disable timing; elapsed time needs CU_EVENT_DEFAULT.
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        start.record(stream)?;
        for _ in 0..reps {
            launch()?;
        }
        end.record(stream)?;
        end.synchronize()?;
        best = best.min(start.elapsed_ms(&end)? as f64 / reps as f64);
    }
    Ok(best)
}

/// The value after `name` on the command line, or `default`.
pub fn arg(name: &str, default: u32) -> u32 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}
