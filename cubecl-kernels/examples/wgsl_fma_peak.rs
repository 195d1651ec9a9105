//! Register-only multiply-add throughput of hand-written WGSL on the first wgpu adapter, per
//! arithmetic form (f32, f16, vec2<f16>, vec4<f16>; `a*b+c` or `fma`), and whether the f16 forms
//! really round in f16.
//!
//! Why it exists: the packed-f16 attention kernel (`kernel/fma_half.rs`) runs at the HFMA2 rate
//! through CUDA but not through WGSL on NVIDIA's Vulkan driver. This probe separates "the driver
//! does not pack f16 math from WGSL at all" from "the kernel's shape keeps it from packing".
//!
//! Every thread runs `CHAINS` independent multiply-add chains `acc = acc * a + b` (or the named
//! form) for a run-time number of steps; `a`, `b` and the start value come from a buffer, so the
//! compiler can fold nothing. With a = 1 and b = 2^-12 an accumulator that starts at 1 stays at 1
//! when every step rounds to f16 (b is under half an f16 ulp at 1) and grows to 1 + steps·2^-12
//! when the steps run in f32: the probe reads the result back and says which one happened.
//!
//! `cargo run --release -p quattn-cubecl --example wgsl_fma_peak [-- --steps N --reps R]`
//! (any adapter; on llvmpipe use a small `--groups`).

use std::time::Instant;

const CHAINS: usize = 8;
const UNROLL: usize = 4;
const WG: u32 = 256;

/// One arithmetic form of the probe.
struct Form {
    name: &'static str,
    /// WGSL type of an accumulator.
    ty: &'static str,
    /// Scalar lanes per accumulator (FLOPs per step = 2 · lanes).
    lanes: usize,
    /// Whether the form computes in f16 (then it needs `enable f16;` and should round in f16).
    half: bool,
    /// Accumulators live in one function-scope array (`acc[k]`, constant indices) instead of
    /// separate variables, as CubeCL's kernels keep them.
    array: bool,
    /// One unrolled step `u` of every chain; `acc(k)` names accumulator `k`.
    step: fn(usize) -> String,
    /// FLOPs of one step of all chains, where not `CHAINS * 2 * lanes` (the mixed form).
    flops: Option<usize>,
}

fn acc(k: usize, array: bool) -> String {
    if array { format!("acc[{k}]") } else { format!("acc{k}") }
}

/// `acc = acc * a + b` (a = 1, b = 2^-12: f16 keeps 1, f32 grows).
fn mul_add(array: bool) -> String {
    (0..CHAINS).map(|k| { let a = acc(k, array); format!("    {a} = {a} * a + b;\n") }).collect()
}

fn forms() -> Vec<Form> {
    vec![
        Form { name: "f32 a*b+c", ty: "f32", lanes: 1, half: false, array: false, step: |_| mul_add(false), flops: None },
        Form {
            name: "f32 fma",
            ty: "f32",
            lanes: 1,
            half: false,
            array: false,
            step: |_| (0..CHAINS).map(|k| format!("    acc{k} = fma(acc{k}, a, b);\n")).collect(),
            flops: None,
        },
        Form { name: "f16 a*b+c", ty: "f16", lanes: 1, half: true, array: false, step: |_| mul_add(false), flops: None },
        Form { name: "vec2<f16> a*b+c", ty: "vec2<f16>", lanes: 2, half: true, array: false, step: |_| mul_add(false), flops: None },
        Form {
            name: "vec2<f16> fma",
            ty: "vec2<f16>",
            lanes: 2,
            half: true,
            array: false,
            step: |_| (0..CHAINS).map(|k| format!("    acc{k} = fma(acc{k}, a, b);\n")).collect(),
            flops: None,
        },
        // The attention kernel's shape: a scalar splatted over a pair, times a pair, plus the
        // accumulator (the addend). The scalar is the chain's own lane y (a loop-invariant one
        // would let the compiler hoist the product); b = 2^-12, so f16 keeps 1.
        Form {
            name: "vec2<f16> splat*v+acc",
            ty: "vec2<f16>",
            lanes: 2,
            half: true,
            array: false,
            step: |_| (0..CHAINS).map(|k| format!("    acc{k} = vec2<f16>(acc{k}.y) * b + acc{k};\n")).collect(),
            flops: None,
        },
        Form {
            name: "vec2<f16> splat, array",
            ty: "vec2<f16>",
            lanes: 2,
            half: true,
            array: true,
            step: |_| (0..CHAINS).map(|k| format!("    acc[{k}] = vec2<f16>(acc[{k}].y) * b + acc[{k}];\n")).collect(),
            flops: None,
        },
        // As the kernel: operands read from workgroup memory each step (vec4 of scalars to
        // splat, one pair), accumulators in an array.
        Form {
            name: "vec2<f16> splat, smem",
            ty: "vec2<f16>",
            lanes: 2,
            half: true,
            array: true,
            step: |u| {
                let mut s = format!("    let sm{u} = sm_s[(i * {UNROLL}u + {u}u) & 63u];\n    let vm{u} = sm_v[(i * {UNROLL}u + {u}u) & 63u];\n");
                for k in 0..CHAINS {
                    s += &format!("    acc[{k}] = vec2<f16>(sm{u}[{}]) * vm{u} + acc[{k}];\n", k % 4);
                }
                s
            },
            flops: None,
        },
        // Half the chains packed f16, half f32 (`accf`): whether the two share one pipe.
        Form {
            name: "mix 4 vec2<f16> + 4 f32",
            ty: "vec2<f16>",
            lanes: 2,
            half: true,
            array: false,
            step: |_| {
                (0..CHAINS / 2)
                    .map(|k| format!("    acc{k} = acc{k} * a + b;\n    accf{k} = accf{k} * af + bf;\n"))
                    .collect()
            },
            flops: Some(CHAINS / 2 * 4 + CHAINS / 2 * 2),
        },
        Form { name: "vec4<f16> a*b+c", ty: "vec4<f16>", lanes: 4, half: true, array: false, step: |_| mul_add(false), flops: None },
        Form { name: "vec2<f32> a*b+c", ty: "vec2<f32>", lanes: 2, half: false, array: false, step: |_| mul_add(false), flops: None },
    ]
}

fn shader(form: &Form) -> String {
    let ty = form.ty;
    let scalar = if form.half { "f16" } else { "f32" };
    let mut s = String::new();
    if form.half {
        s += "enable f16;\n";
    }
    s += "@group(0) @binding(0) var<storage, read> params: array<f32, 4>;\n";
    s += "@group(0) @binding(1) var<storage, read> steps: array<u32, 1>;\n";
    s += "@group(0) @binding(2) var<storage, read_write> out: array<f32>;\n";
    s += &format!("var<workgroup> sm_s: array<vec4<{scalar}>, 64>;\nvar<workgroup> sm_v: array<vec2<{scalar}>, 64>;\n");
    s += &format!("@compute @workgroup_size({WG})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {{\n");
    s += &format!("  let a = {ty}({scalar}(params[1]));\n  let b = {ty}({scalar}(params[2]));\n");
    s += &format!("  let s = vec4<{scalar}>({scalar}(params[1]));\n");
    s += "  let af = params[1];\n  let bf = params[2];\n";
    for k in 0..CHAINS / 2 {
        s += &format!("  var accf{k} = params[0] + params[3] * {k}.0;\n");
    }
    s += &format!("  if (lid < 64u) {{ sm_s[lid] = s; sm_v[lid] = vec2<{scalar}>({scalar}(params[2])); }}\n  workgroupBarrier();\n");
    if form.array {
        s += &format!("  var acc: array<{ty}, {CHAINS}>;\n");
    }
    for k in 0..CHAINS {
        // Chains start at params[0] (1.0) plus params[3] (0) times k, so no two chains are
        // provably equal.
        let a = acc(k, form.array);
        let decl = if form.array { "" } else { "var " };
        s += &format!("  {decl}{a} = {ty}({scalar}(params[0] + params[3] * {k}.0));\n");
    }
    s += "  for (var i = 0u; i < steps[0]; i = i + 1u) {\n";
    for u in 0..UNROLL {
        s += &(form.step)(u);
    }
    s += "  }\n";
    // Every thread writes the sum of every lane of every chain (in f32), so nothing is dead
    // code (summing only lane x lets the compiler drop the other lanes' math).
    s += "  var total = 0.0;\n";
    for k in 0..CHAINS {
        let a = acc(k, form.array);
        for lane in ["x", "y", "z", "w"].iter().take(form.lanes) {
            let v = if form.lanes == 1 { a.clone() } else { format!("{a}.{lane}") };
            s += &format!("  total = total + f32({v});\n");
        }
    }
    if form.flops.is_some() {
        for k in 0..CHAINS / 2 {
            s += &format!("  total = total + accf{k};\n");
        }
    }
    s += "  let idx = gid.x + gid.y * nwg.x * 256u;\n  out[idx] = total;\n}\n";
    s
}

fn arg(args: &[String], name: &str, default: u32) -> u32 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let steps = arg(&args, "--steps", 256);
    let reps = arg(&args, "--reps", 10);
    let groups = arg(&args, "--groups", 16384);
    let dump = args.iter().any(|a| a == "--dump");

    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::PRIMARY;
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .expect("no wgpu adapter");
    let info = adapter.get_info();
    println!("adapter: {} ({:?}, {:?}, driver {} {})", info.name, info.backend, info.device_type, info.driver, info.driver_info);
    let has_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: None,
        required_features: if has_f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() },
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .expect("device");

    use wgpu::util::DeviceExt;
    let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&[1.0f32, 1.0, 2f32.powi(-12), 0.0]),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let steps_buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: &steps.to_le_bytes(),
        usage: wgpu::BufferUsages::STORAGE,
    });
    // Two-dimensional grid when the group count passes the per-dimension limit.
    let max_x = device.limits().max_compute_workgroups_per_dimension;
    let (gx, gy) = if groups <= max_x { (groups, 1) } else { (max_x.min(4096), groups.div_ceil(max_x.min(4096))) };
    let threads = (gx * gy * WG) as u64;
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: threads * 4,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 4,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let total_steps = (steps as usize * UNROLL) as f64;
    let f16_value = CHAINS as f64;
    let f32_value = CHAINS as f64 * (1.0 + total_steps * 2f64.powi(-12));
    // Thread 0's total sums every lane: the expected values scale with the lanes.
    println!("grid {gx}x{gy} x {WG} threads, {CHAINS} chains x {} steps, {reps} launches per timing", steps as usize * UNROLL);
    println!("{:<24} {:>9} {:>9}  {:>10}  rounding", "form", "ms", "TFLOP/s", "thread 0");
    for form in forms() {
        if form.half && !has_f16 {
            println!("{:<24} skipped: adapter has no SHADER_F16", form.name);
            continue;
        }
        let src = shader(&form);
        if dump {
            println!("{src}");
        }
        // As CubeCL creates its WGSL modules: no bounds checks, no loop bounding.
        // SAFETY: every index in the probe's shaders is in range by construction (constant
        // indices into fixed arrays, `& 63` into 64-element arrays, one write per thread).
        let module = unsafe {
            device.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor { label: Some(form.name), source: wgpu::ShaderSource::Wgsl(src.into()) },
                wgpu::ShaderRuntimeChecks::unchecked(),
            )
        };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(form.name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: params.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: steps_buf.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: out.as_entire_binding() },
            ],
        });
        let run = |n: u32| {
            let mut enc = device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind, &[]);
                for _ in 0..n {
                    pass.dispatch_workgroups(gx, gy, 1);
                }
            }
            queue.submit([enc.finish()]);
            device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        };
        run(2);
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            run(reps);
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        let per_step = form.flops.unwrap_or(CHAINS * 2 * form.lanes) as f64;
        let flops = threads as f64 * total_steps * per_step;
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&out, 0, &readback, 0, 4);
        queue.submit([enc.finish()]);
        readback.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        let v = {
            let data = readback.slice(..).get_mapped_range();
            f32::from_le_bytes([data[0], data[1], data[2], data[3]]) as f64
        };
        readback.unmap();
        let lanes = form.lanes as f64;
        let rounding = if (v - lanes * f16_value).abs() < 1e-3 {
            "every step in f16"
        } else if (v - lanes * f32_value).abs() < 1e-3 * lanes * f32_value {
            "f32 (not f16)"
        } else {
            "other"
        };
        let rounding = if form.flops.is_some() {
            "(mixed)"
        } else if form.half {
            rounding
        } else {
            "(f32 form)"
        };
        println!("{:<24} {:>9.3} {:>9.1}  {:>10.4}  {rounding}", form.name, best * 1e3, flops / best / 1e12, v);
    }
}
