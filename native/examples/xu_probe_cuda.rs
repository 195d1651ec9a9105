//! Which pipe an s32 → f32 conversion takes on this GPU: register-only chains of `cvt.rn.f32.s32`
//! (SASS I2FP.F32.S32 on sm_90), of `ex2.approx.ftz.f32` (MUFU.EX2), both interleaved, and of
//! the exact two-instruction conversion `float(s) = bits(s + 0x4b400000) - 1.5 · 2^23` (an
//! integer add and an f32 add, exact for |s| < 2^22). If the interleaved form takes the sum of
//! the two single forms' times, the conversion and the exponential share one pipe; if it takes
//! the longer of the two, they do not. The softmax of the s8 wgmma kernel converts every score
//! and takes every exponential, so this decides whether its conversions compete with its
//! exponentials.
//!
//! `cargo run --release -p quattn-native --features cuda --example xu_probe_cuda [-- --steps N]`

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::CompileOptions;

const CHAINS: usize = 8;
const UNROLL: usize = 4;
const BLOCK: u32 = 256;

#[path = "common/probe.rs"]
mod probe;
use probe::{arg, BoxErr};

#[derive(Clone, Copy, PartialEq)]
enum Op {
    /// `cvt.rn.f32.s32`, the result's bits fed back as the next integer.
    Cvt,
    /// `ex2.approx.ftz.f32` of a value in (0, 1]: the chain stays there.
    Ex2,
    /// The integer add and f32 add of the exact conversion, fed back as `cvt` is.
    AddAdd,
}

struct Form {
    name: &'static str,
    op: fn(usize) -> Op,
}

fn forms() -> [Form; 5] {
    [
        Form { name: "cvt.rn.f32.s32 x8", op: |_| Op::Cvt },
        Form { name: "ex2.approx x8", op: |_| Op::Ex2 },
        Form { name: "cvt x4 + ex2 x4", op: |k| if k % 2 == 0 { Op::Cvt } else { Op::Ex2 } },
        Form { name: "iadd+fadd x8", op: |_| Op::AddAdd },
        Form { name: "iadd+fadd x4 + ex2 x4", op: |k| if k % 2 == 0 { Op::AddAdd } else { Op::Ex2 } },
    ]
}

fn source(form: &Form) -> String {
    let mut s = String::from("extern \"C\" __global__ void probe(const float* p, const unsigned* steps, float* out) {\n");
    for k in 0..CHAINS {
        match (form.op)(k) {
            Op::Ex2 => s += &format!("  float x{k} = p[0] * (0.5f + 0.01f * {k});\n"),
            _ => s += &format!("  int x{k} = (int)(p[1] + {k}.0f);\n"),
        }
    }
    s += "  for (unsigned i = 0; i < steps[0]; ++i) {\n";
    for _ in 0..UNROLL {
        for k in 0..CHAINS {
            s += &match (form.op)(k) {
                Op::Cvt => format!("    {{ float f; asm volatile(\"cvt.rn.f32.s32 %0, %1;\" : \"=f\"(f) : \"r\"(x{k})); x{k} = __float_as_int(f) >> 9; }}\n"),
                Op::Ex2 => format!("    asm volatile(\"ex2.approx.ftz.f32 %0, %0;\" : \"+f\"(x{k}));\n"),
                Op::AddAdd => format!(
                    "    {{ float f; asm volatile(\"{{ .reg .b32 t; add.s32 t, %1, 0x4b400000; sub.f32 %0, t, 0f4B400000; }}\" : \"=f\"(f) : \"r\"(x{k})); x{k} = __float_as_int(f) >> 9; }}\n"
                ),
            };
        }
    }
    s += "  }\n  float total = 0.0f;\n";
    for k in 0..CHAINS {
        match (form.op)(k) {
            Op::Ex2 => s += &format!("  total += x{k};\n"),
            _ => s += &format!("  total += (float)x{k};\n"),
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
    let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as f64;
    let clock_khz = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? as f64;
    println!("device: {} ({sms} SMs, {:.0} MHz max clock)", ctx.name()?, clock_khz / 1e3);
    let params = stream.clone_htod(&[-0.75f32, 1000.0])?;
    let steps_buf = stream.clone_htod(&[steps])?;
    let threads = (blocks * BLOCK) as usize;
    let mut out = stream.alloc_zeros::<f32>(threads)?;
    let ops_per_thread = (steps as usize * UNROLL * CHAINS) as f64;
    println!("{blocks} blocks x {BLOCK} threads, {CHAINS} chains x {} steps, {reps} launches per timing", steps as usize * UNROLL);
    println!("{:<24} {:>9} {:>14}  {:>10}", "form", "ms", "ops/clk/SM", "thread 0");
    for form in forms() {
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source(&form), CompileOptions { arch: Some("sm_90"), ..Default::default() })?;
        let module = ctx.load_module(ptx)?;
        let f = module.load_function("probe")?;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        let best = probe::best_ms_per_launch(&ctx, &stream, reps, || {
            let mut b = stream.launch_builder(&f);
            b.arg(&params).arg(&steps_buf).arg(&mut out);
            // SAFETY: the kernel reads 2 floats and 1 u32 and writes one float per thread
            // into `out`, which holds blocks * BLOCK floats.
            unsafe { b.launch(cfg) }?;
            Ok(())
        })?;
        // Conversions or exponentials (one per chain step) per clock per SM at the max clock.
        let rate = threads as f64 * ops_per_thread / (best * 1e-3) / (sms * clock_khz * 1e3);
        let v = stream.clone_dtoh(&out.slice(0..1))?[0];
        println!("{:<24} {:>9.3} {:>14.1}  {:>10.4}", form.name, best, rate, v);
    }
    Ok(())
}
