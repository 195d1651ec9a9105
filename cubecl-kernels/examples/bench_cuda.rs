//! Every kernel variant and tiling on one runtime: first a correctness check on a small shape
//! against an f64 CPU reference, then throughput at seq 4096 (batch·seq = 16k, heads = 2048/d).
//! One line per (variant, shape).
//!
//! ```text
//! cargo build --release -p quattn-cubecl --features cuda --examples
//! target/release/examples/bench_cuda cuda      # mma + cmma + FMA variants through NVRTC
//! target/release/examples/bench_cuda cuda --filter mma_   # the mma tilings only
//! target/release/examples/bench_cuda wgpu      # FMA variants through WGSL (Vulkan on Linux)
//! target/release/examples/bench_cuda wgpu --quick   # seq 256, batch 1, 1 iteration (llvmpipe smoke test)
//! ```
//!
//! Options: `--seq N` (default 4096), `--batch N` (default 16384/seq), `--iters N` (default 10),
//! `--d 64,128`, `--filter TEXT[,TEXT...]`
//! (only variants whose name contains one of the TEXTs; `TEXT$` matches the whole name). TFLOP/s counts only the (query, key) pairs the
//! causal mask keeps (`AttentionArgs::flops`).

use std::time::Instant;

use cubecl::prelude::*;
use quattn_cubecl::{
    cmma_candidates, fma_candidates, fma_half_candidates, fma_vec_candidates, launch_with, mma_candidates,
    Accumulation, AttentionArgs, CmmaTiles, ElemType, FmaVecTiles, KvLoads, LaunchOptions, MmaTiles, QkAccumulation,
    Variant,
};

struct Opts { seq: u32, iters: usize, dims: Vec<u32>, filter: Option<String>, batch: Option<u32> }

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runtime = args.get(1).cloned().unwrap_or_else(|| "cuda".into());
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let opts = Opts {
        seq: value("--seq").map(|s| s.parse().unwrap()).unwrap_or(if quick { 256 } else { 4096 }),
        iters: value("--iters").map(|s| s.parse().unwrap()).unwrap_or(if quick { 1 } else { 10 }),
        dims: value("--d")
            .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
            .unwrap_or(vec![64, 128]),
        filter: value("--filter"),
        batch: value("--batch").map(|s| s.parse().unwrap()).or(if quick { Some(1) } else { None }),
    };
    match runtime.as_str() {
        #[cfg(feature = "cuda")]
        "cuda" => {
            use cubecl::cuda::{CudaDevice, CudaRuntime};
            bench(&CudaRuntime::client(&CudaDevice::default()), &opts);
        }
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
            bench(&WgpuRuntime::client(&WgpuDevice::DefaultDevice), &opts);
        }
        other => {
            eprintln!("unknown or not compiled runtime `{other}` (cuda needs --features cuda)");
            std::process::exit(2);
        }
    }
}

/// One thing to run: a name and the launch options that pin it.
struct Candidate { name: String, elem: ElemType, options: LaunchOptions }

impl Candidate {
    /// rel-L2 bound of the small correctness check: the element type's, or the f16-accumulating
    /// mode's (`Tolerance::for_precision` in the facade).
    fn tolerance(&self) -> f64 {
        let acc = self.options.accumulation;
        match (self.elem, acc.qk) {
            (ElemType::F32, _) => 1e-5,
            (ElemType::F16, QkAccumulation::F16) => 1e-2,
            (ElemType::F16, _) if !acc.is_f32() => 4e-3,
            (ElemType::F16, _) => 2e-3,
            (ElemType::Bf16, _) => 1.6e-2,
        }
    }
}

fn candidates<R: Runtime>(client: &ComputeClient<R>, d: u32) -> Vec<Candidate> {
    let base = LaunchOptions::default();
    let mut out = vec![Candidate { name: "auto".into(), elem: ElemType::F16, options: base }];
    // The packed-f16 kernel: every f16-accumulating mode on the table's first tile, and the
    // fastest mode (two-stage Q·Kᵀ, per-tile P·V) on every tile of the table plus a few more
    // (refused with a typed error where they do not fit).
    let two_stage = QkAccumulation::TwoStage { chunk: 32 };
    for (tag, qk, pv_f16) in [
        ("2s_pv16", two_stage, true),
        ("qk16_pv16", QkAccumulation::F16, true),
        ("2s", two_stage, false),
        ("qk16", QkAccumulation::F16, false),
        ("pv16", QkAccumulation::F32, true),
    ] {
        let mut tiles: Vec<FmaVecTiles> = fma_half_candidates(d).to_vec();
        if tag == "2s_pv16" || tag == "qk16_pv16" {
            let t = |bq, bk, tr, tc| FmaVecTiles { bq, bk, tr, tc, stage_f32: false };
            for extra in [
                t(64, 64, 16, 8),
                t(64, 32, 16, 8),
                t(32, 64, 4, 16),
                t(64, 64, 8, 8),
                t(128, 64, 16, 8),
                t(128, 32, 16, 8),
                // 4 rows x 4 keys x 8 columns per unit (half the accumulators of 16 x 8):
                // fewer registers per unit, for drivers that allocate many (Vulkan).
                t(64, 64, 16, 16),
                t(32, 64, 8, 16),
                t(16, 64, 4, 16),
                t(32, 32, 8, 8),
                t(96, 32, 24, 8),
            ] {
                if !tiles.contains(&extra) {
                    tiles.push(extra);
                }
            }
        } else {
            tiles.truncate(1);
        }
        for t in tiles {
            // K/V staging (and separate K/V stages): every choice on the fastest mode's tiles,
            // the default elsewhere. The default splits the stages where they fit.
            let loads: &[(KvLoads, Option<bool>, &str)] = if tag == "2s_pv16" {
                &[
                    (KvLoads::Direct, Some(false), "_direct"),
                    (KvLoads::TileChecked, Some(false), "_tc"),
                    (KvLoads::Prefetch, Some(false), "_pf4"),
                    (KvLoads::Prefetch, None, ""),
                ]
            } else {
                &[(KvLoads::Prefetch, None, "")]
            };
            for &(kv_loads, split_kv, suffix) in loads {
                out.push(Candidate {
                    name: format!("half_{tag}_{t}{suffix}"),
                    elem: ElemType::F16,
                    options: LaunchOptions {
                        variant: Variant::PortableFma,
                        fma_vec_tiles: Some(t),
                        accumulation: Accumulation { qk, pv_f16 },
                        kv_loads: Some(kv_loads),
                        split_kv,
                        ..base
                    },
                });
            }
        }
    }
    // The mma table (every entry is spill-free offline), plus tilings the table leaves out:
    // they are refused with a typed error when their fragments exceed the register budget.
    let mut mma: Vec<MmaTiles> = mma_candidates(d).to_vec();
    for extra in [
        MmaTiles { warps: 4, mt: 1, bk: 32 },
        MmaTiles { warps: 8, mt: 1, bk: 32 },
        MmaTiles { warps: 4, mt: 2, bk: 32 },
    ] {
        if !mma.contains(&extra) {
            mma.push(extra);
        }
    }
    for tiles in mma {
        for (elem, lazy) in [(ElemType::F16, true), (ElemType::F16, false), (ElemType::Bf16, true)] {
            if (!lazy || elem == ElemType::Bf16) && tiles != mma_candidates(d)[0] {
                continue;
            }
            out.push(Candidate {
                name: format!("mma_{tiles}{}", if lazy { "" } else { "_eager" }),
                elem,
                options: LaunchOptions {
                    variant: Variant::Mma,
                    mma_tiles: Some(tiles),
                    lazy_rescale: lazy,
                    ..base
                },
            });
        }
    }
    let mut cmma: Vec<CmmaTiles> = cmma_candidates(d).to_vec();
    // Beyond the table: 8 planes (128 query rows per cube) and longer key tiles.
    for extra in [
        CmmaTiles { warps: 8, bk: 64 },
        CmmaTiles { warps: 8, bk: 32 },
        CmmaTiles { warps: 4, bk: 128 },
    ] {
        if !cmma.contains(&extra) {
            cmma.push(extra);
        }
    }
    for tiles in cmma {
        for (elem, lazy) in [(ElemType::F16, true), (ElemType::F16, false), (ElemType::Bf16, true)] {
            if !lazy && tiles != cmma_candidates(d)[0] || elem == ElemType::Bf16 && tiles != cmma_candidates(d)[0] {
                continue;
            }
            out.push(Candidate {
                name: format!("cmma_{tiles}{}", if lazy { "" } else { "_eager" }),
                elem,
                options: LaunchOptions {
                    variant: Variant::Cmma,
                    cmma_tiles: Some(tiles),
                    lazy_rescale: lazy,
                    ..base
                },
            });
        }
    }
    for (i, &tiles) in fma_vec_candidates(d).iter().enumerate() {
        // f32 inputs only on the first fitting entries (the table is the same); every K/V
        // staging on the first entry.
        let elems: &[ElemType] = if i < 2 { &[ElemType::F16, ElemType::F32] } else { &[ElemType::F16] };
        let loads: &[(KvLoads, &str)] = if i == 0 {
            &[(KvLoads::Direct, "_direct"), (KvLoads::TileChecked, "_tc"), (KvLoads::Prefetch, "")]
        } else {
            &[(KvLoads::Prefetch, "")]
        };
        for &elem in elems {
            for &(kv_loads, suffix) in loads {
                out.push(Candidate {
                    name: format!("fma_vec_{tiles}{suffix}"),
                    elem,
                    options: LaunchOptions {
                        variant: Variant::PortableFma,
                        fma_vec_tiles: Some(tiles),
                        kv_loads: Some(kv_loads),
                        ..base
                    },
                });
            }
        }
    }
    // The plane-shuffle reductions against the shared-memory ones, on the default tiles.
    out.push(Candidate {
        name: "fma_vec_default_noplane".into(),
        elem: ElemType::F16,
        options: LaunchOptions { variant: Variant::PortableFma, allow_plane_ops: false, ..base },
    });
    for &tiles in fma_candidates(d) {
        out.push(Candidate {
            name: format!("fma_scalar_{tiles}"),
            elem: ElemType::F16,
            options: LaunchOptions {
                variant: Variant::PortableFmaScalar,
                fma_tiles: Some(tiles),
                ..base
            },
        });
    }
    let _ = client;
    out
}

fn bench<R: Runtime>(client: &ComputeClient<R>, opts: &Opts) {
    let hw = &client.properties().hardware;
    println!(
        "runtime {} | smem {} B | units/cube {} | planes {:?} size {}..{} | cmma configs {} | mma configs {}",
        R::name(client),
        hw.max_shared_memory_size,
        hw.max_units_per_cube,
        client.features().plane,
        hw.plane_size_min,
        hw.plane_size_max,
        client.features().matmul.cmma.len(),
        client.features().matmul.mma.len()
    );
    for &d in &opts.dims {
        let heads = (2048 / d).max(1);
        let batch = opts.batch.unwrap_or((16384 / opts.seq).max(1));
        for cand in candidates(client, d) {
            if let Some(f) = &opts.filter {
                // `NAME$` matches NAME exactly, anything else as a substring.
                if !f.split(',').any(|f| f.strip_suffix('$').map_or(cand.name.contains(f), |exact| cand.name == exact)) {
                    continue;
                }
            }
            let elem_name = format!("{:?}", cand.elem).to_lowercase();
            // Correctness first, on a ragged small shape, both causal modes.
            let mut check = String::new();
            let mut ok = true;
            for causal in [false, true] {
                match check_small(client, d, causal, cand.elem, &cand.options) {
                    Ok((err, kernel)) => {
                        ok &= err < cand.tolerance();
                        if check.is_empty() {
                            check = kernel;
                        }
                        check.push_str(&format!(" err{}={err:.1e}", if causal { "C" } else { "N" }));
                    }
                    Err(e) => {
                        println!("d{d:<3} {elem_name:4} {:40} skipped: {e}", cand.name);
                        ok = false;
                        check.clear();
                        break;
                    }
                }
            }
            if !ok {
                if !check.is_empty() {
                    println!("d{d:<3} {elem_name:4} {:40} FAILED {check}", cand.name);
                }
                continue;
            }
            let mut line = format!("d{d:<3} {elem_name:4} {:40}", cand.name);
            for causal in [false, true] {
                let args = AttentionArgs::bhsd(batch, heads, heads, opts.seq, opts.seq, d, causal);
                match time(client, &args, cand.elem, &cand.options, opts.iters) {
                    Ok(secs) => line.push_str(&format!(
                        " | {} {:8.3} ms {:6.1} TF",
                        if causal { "causal" } else { "full  " },
                        secs * 1e3,
                        args.flops() / secs / 1e12
                    )),
                    Err(e) => line.push_str(&format!(" | {e}")),
                }
            }
            line.push_str(&format!(" | {check}"));
            println!("{line}");
        }
    }
}

fn time<R: Runtime>(
    client: &ComputeClient<R>,
    args: &AttentionArgs,
    elem: ElemType,
    options: &LaunchOptions,
    iters: usize,
) -> Result<f64, String> {
    let n = (args.batch * args.q_heads * args.q_len * args.head_dim) as usize;
    let bufs: Vec<_> = (0..4).map(|i| upload(client, elem, &random(n, i as u64 + 1))).collect();
    let run = || launch_with(client, args, elem, options, &bufs[0], &bufs[1], &bufs[2], &bufs[3], None);
    for _ in 0..2 {
        run().map_err(|e| e.to_string())?;
    }
    cubecl::future::block_on(client.sync()).map_err(|e| format!("{e:?}"))?;
    // Best of three timed loops: the device's clock and the driver's batching vary between
    // loops (single loops of the same kernel differed by up to 30% through Vulkan).
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..iters {
            run().map_err(|e| e.to_string())?;
        }
        let enqueued = start.elapsed().as_secs_f64();
        cubecl::future::block_on(client.sync()).map_err(|e| format!("{e:?}"))?;
        let total = start.elapsed().as_secs_f64();
        // Where the host clock's time goes: enqueueing (host work per launch) or waiting for
        // the device. A device-bound loop enqueues in a small fraction of the total.
        eprintln!("  host: enqueue {:.3} ms/launch, total {:.3} ms/launch ({iters} launches)", enqueued * 1e3 / iters as f64, total * 1e3 / iters as f64);
        best = best.min(total / iters as f64);
    }
    Ok(best)
}

/// O's relative L2 error against an f64 reference on a small ragged BHSD problem, and the
/// kernel's name.
fn check_small<R: Runtime>(
    client: &ComputeClient<R>,
    d: u32,
    causal: bool,
    elem: ElemType,
    options: &LaunchOptions,
) -> Result<(f64, String), String> {
    let (b, h, sq, sk) = (1u32, 2u32, 77u32, 150u32);
    let mut args = AttentionArgs::bhsd(b, h, h, sq, sk, d, causal);
    args.write_lse = false;
    let round = |x: f64| match elem {
        ElemType::F32 => x as f32 as f64,
        ElemType::F16 => half::f16::from_f64(x).to_f64(),
        ElemType::Bf16 => half::bf16::from_f64(x).to_f64(),
    };
    let q: Vec<f64> = random((b * h * sq * d) as usize, 11).into_iter().map(round).collect();
    let k: Vec<f64> = random((b * h * sk * d) as usize, 12).into_iter().map(round).collect();
    let v: Vec<f64> = random((b * h * sk * d) as usize, 13).into_iter().map(round).collect();
    let o = upload(client, elem, &vec![f64::NAN; (b * h * sq * d) as usize]);
    let info = launch_with(
        client,
        &args,
        elem,
        options,
        &upload(client, elem, &q),
        &upload(client, elem, &k),
        &upload(client, elem, &v),
        &o,
        None,
    )
    .map_err(|e| e.to_string())?;
    let got = download(client, elem, o)?;
    let (d, sq, sk) = (d as usize, sq as usize, sk as usize);
    let scale = args.scale as f64;
    let (mut err2, mut ref2) = (0.0, 0.0);
    for bh in 0..(b * h) as usize {
        for i in 0..sq {
            let visible = if causal { (i + 1 + sk).saturating_sub(sq).min(sk) } else { sk };
            let s: Vec<f64> = (0..visible)
                .map(|j| scale * (0..d).map(|x| q[(bh * sq + i) * d + x] * k[(bh * sk + j) * d + x]).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for c in 0..d {
                let want = if visible == 0 {
                    0.0
                } else {
                    (0..visible).map(|j| (s[j] - m).exp() * v[(bh * sk + j) * d + c]).sum::<f64>() / l
                };
                let g = got[(bh * sq + i) * d + c];
                if !g.is_finite() {
                    return Ok((f64::INFINITY, info.kernel));
                }
                err2 += (g - want).powi(2);
                ref2 += want * want;
            }
        }
    }
    Ok(((err2 / ref2.max(1e-300)).sqrt(), info.kernel))
}

/// Normal-ish values (sum of uniforms) so the softmax is not degenerate.
fn random(count: usize, seed: u64) -> Vec<f64> {
    let mut state = 0x2545_f491_4f6c_dd1du64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 / (1u64 << 53) as f64) - 0.5
    };
    (0..count).map(|_| (next() + next() + next()) * 2.0).collect()
}

fn upload<R: Runtime>(client: &ComputeClient<R>, elem: ElemType, data: &[f64]) -> cubecl::server::Handle {
    let bytes: Vec<u8> = match elem {
        ElemType::F32 => data.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        ElemType::F16 => data.iter().flat_map(|&x| half::f16::from_f64(x).to_le_bytes()).collect(),
        ElemType::Bf16 => data.iter().flat_map(|&x| half::bf16::from_f64(x).to_le_bytes()).collect(),
    };
    client.create_from_slice(&bytes)
}

fn download<R: Runtime>(
    client: &ComputeClient<R>,
    elem: ElemType,
    handle: cubecl::server::Handle,
) -> Result<Vec<f64>, String> {
    let bytes = client.read_one(handle).map_err(|e| format!("{e:?}"))?;
    Ok(match elem {
        ElemType::F32 => bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        ElemType::F16 => bytes.chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        ElemType::Bf16 => bytes.chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
    })
}
