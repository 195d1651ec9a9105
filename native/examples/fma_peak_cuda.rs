//! Register-only multiply-add throughput through CUDA (NVRTC, inline PTX), the twin of
//! quattn-cubecl's `examples/wgsl_fma_peak.rs`: the same chains (`acc = acc * a + b`, 8 per
//! thread, 4 unrolled steps per loop trip), so the two drivers' packed-f16 rates can be compared
//! on one GPU. Forms: f32 `fma.rn.f32`, packed f16 `fma.rn.f16x2`, and a mix of both (4 chains
//! each), which shows whether the FP32 and packed-f16 multiply-adds share one pipe.
//!
//! `cargo run --release -p quattn-native --features cuda --example fma_peak_cuda [-- --steps N]`

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::CompileOptions;

const CHAINS: usize = 8;
const UNROLL: usize = 4;
const BLOCK: u32 = 256;

#[path = "common/probe.rs"]
mod probe;
use probe::{arg, BoxErr};

/// Chain `k` of a form is f16x2 when `half(k)`, f32 otherwise.
struct Form {
    name: &'static str,
    half: fn(usize) -> bool,
}

fn forms() -> [Form; 3] {
    [
        Form { name: "f32 fma.rn.f32", half: |_| false },
        Form { name: "f16x2 fma.rn.f16x2", half: |_| true },
        Form { name: "mix: 4 f16x2 + 4 f32", half: |k| k < CHAINS / 2 },
    ]
}

fn source(form: &Form) -> String {
    let mut s = String::from(
        "__device__ __forceinline__ unsigned splat_h2(float v) { unsigned r; asm(\"{ .reg .f16 h; cvt.rn.f16.f32 h, %1; mov.b32 %0, {h, h}; }\" : \"=r\"(r) : \"f\"(v)); return r; }\n\
         __device__ __forceinline__ float sum_h2(unsigned v) { float lo, hi; asm(\"{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }\" : \"=f\"(lo), \"=f\"(hi) : \"r\"(v)); return lo + hi; }\n\
         extern \"C\" __global__ void peak(const float* p, const unsigned* steps, float* out) {\n\
           float a = p[1], b = p[2];\n\
           unsigned ah = splat_h2(a), bh = splat_h2(b);\n",
    );
    for k in 0..CHAINS {
        if (form.half)(k) {
            s += &format!("  unsigned acc{k} = splat_h2(p[0] + p[3] * {k}.0f);\n");
        } else {
            s += &format!("  float acc{k} = p[0] + p[3] * {k}.0f;\n");
        }
    }
    s += "  for (unsigned i = 0; i < steps[0]; ++i) {\n";
    for _ in 0..UNROLL {
        for k in 0..CHAINS {
            if (form.half)(k) {
                s += &format!("    asm(\"fma.rn.f16x2 %0, %0, %1, %2;\" : \"+r\"(acc{k}) : \"r\"(ah), \"r\"(bh));\n");
            } else {
                s += &format!("    acc{k} = fmaf(acc{k}, a, b);\n");
            }
        }
    }
    s += "  }\n  float total = 0.0f;\n";
    for k in 0..CHAINS {
        if (form.half)(k) {
            s += &format!("  total += sum_h2(acc{k});\n");
        } else {
            s += &format!("  total += acc{k};\n");
        }
    }
    s += "  out[blockIdx.x * blockDim.x + threadIdx.x] = total;\n}\n";
    s
}

fn main() -> Result<(), BoxErr> {
    let steps = arg("--steps", 256);
    let reps = arg("--reps", 10);
    let blocks = arg("--blocks", 16384);
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    println!("device: {}", ctx.name()?);
    let params = stream.clone_htod(&[1.0f32, 1.0, 2f32.powi(-12), 0.0])?;
    let steps_buf = stream.clone_htod(&[steps])?;
    let threads = (blocks * BLOCK) as usize;
    let mut out = stream.alloc_zeros::<f32>(threads)?;
    let total_steps = (steps as usize * UNROLL) as f64;
    println!("{blocks} blocks x {BLOCK} threads, {CHAINS} chains x {} steps, {reps} launches per timing", total_steps);
    println!("{:<24} {:>9} {:>9}  {:>10}", "form", "ms", "TFLOP/s", "thread 0");
    for form in forms() {
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(
            source(&form),
            CompileOptions { arch: Some("sm_90"), ..Default::default() },
        )?;
        let module = ctx.load_module(ptx)?;
        let f = module.load_function("peak")?;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        let best = probe::best_ms_per_launch(&ctx, &stream, reps, || {
            let mut b = stream.launch_builder(&f);
            b.arg(&params).arg(&steps_buf).arg(&mut out);
            // SAFETY: the kernel reads 4 floats and 1 u32 and writes one float per thread
            // into `out`, which holds blocks * BLOCK floats.
            unsafe { b.launch(cfg) }?;
            Ok(())
        })?;
        // FLOPs per step: 2 per f32 chain, 4 per f16x2 chain.
        let per_step: usize = (0..CHAINS).map(|k| if (form.half)(k) { 4 } else { 2 }).sum();
        let flops = threads as f64 * total_steps * per_step as f64;
        let v = stream.clone_dtoh(&out.slice(0..1))?[0];
        println!("{:<24} {:>9.3} {:>9.1}  {:>10.4}", form.name, best, flops / (best * 1e-3) / 1e12, v);
    }
    Ok(())
}
