//! Throughput of the kernels on a CUDA GPU: `cargo run -p quattn-cubecl --release
//! --features cuda --example bench_cuda`. TFLOP/s counts only the (query, key) pairs the causal
//! mask keeps (`AttentionArgs::flops`).

use std::time::Instant;

use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::*;
use quattn_cubecl::{launch_with, AttentionArgs, ElemType, LaunchOptions, Variant};

fn main() {
    let client = CudaRuntime::client(&CudaDevice::default());
    let hw = &client.properties().hardware;
    println!("smem {} planes {:?} cmma {}", hw.max_shared_memory_size, client.features().plane, client.features().matmul.cmma.len());
    let iters = 10;
    for (d, seq, batch, heads) in [(128u32, 4096u32, 2u32, 16u32), (64, 4096, 2, 32)] {
        for causal in [false, true] {
            let args = AttentionArgs::bhsd(batch, heads, heads, seq, seq, d, causal);
            for (variant, elem, lazy) in [
                (Variant::Cmma, ElemType::F16, true),
                (Variant::Cmma, ElemType::F16, false),
                (Variant::Cmma, ElemType::Bf16, true),
                (Variant::PortableFma, ElemType::F16, true),
                (Variant::PortableFma, ElemType::F16, false),
                (Variant::PortableFma, ElemType::F32, true),
            ] {
                let n = (batch * heads * seq * d) as usize * elem.size_bytes();
                let bufs: Vec<_> = (0..4).map(|_| client.create_from_slice(&random_bytes(n, elem))).collect();
                let options = LaunchOptions { variant, lazy_rescale: lazy, ..Default::default() };
                let run = || launch_with(&client, &args, elem, &options, &bufs[0], &bufs[1], &bufs[2], &bufs[3], None);
                let info = match run() {
                    Ok(info) => info,
                    Err(e) => {
                        println!("d{d} causal={causal} {variant:?} {elem:?}: refused: {e}");
                        continue;
                    }
                };
                if let Err(e) = cubecl::future::block_on(client.sync()) {
                    println!("{}: failed: {e:?}", info.kernel);
                    continue;
                }
                // A kernel that failed to compile leaves O untouched (here: inputs, finite);
                // poison O and make sure every value comes back finite.
                let poison = client.create_from_slice(&vec![0xffu8; n]);
                let check = launch_with(&client, &args, elem, &options, &bufs[0], &bufs[1], &bufs[2], &poison, None);
                let bytes = client.read_one(poison).map(|b| b.to_vec()).unwrap_or_default();
                let finite = check.is_ok() && !bytes.is_empty() && bytes.chunks(elem.size_bytes()).all(|c| match elem {
                    ElemType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite(),
                    ElemType::F16 => half::f16::from_le_bytes([c[0], c[1]]).is_finite(),
                    ElemType::Bf16 => half::bf16::from_le_bytes([c[0], c[1]]).is_finite(),
                });
                if !finite {
                    println!("{}: output not fully written, skipping timing", info.kernel);
                    continue;
                }
                let start = Instant::now();
                for _ in 0..iters {
                    run().unwrap();
                }
                cubecl::future::block_on(client.sync()).unwrap();
                let secs = start.elapsed().as_secs_f64() / iters as f64;
                println!(
                    "d{d} seq{seq} b{batch} h{heads} causal={causal:5} {:38} lazy={lazy:5} {:8.3} ms {:7.1} TFLOP/s",
                    info.kernel,
                    secs * 1e3,
                    args.flops() / secs / 1e12
                );
            }
        }
    }
}

/// Normal-ish values (sum of uniforms) so the softmax is not degenerate.
fn random_bytes(bytes: usize, elem: ElemType) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 / (1u64 << 53) as f64) - 0.5
    };
    let count = bytes / elem.size_bytes();
    let values = (0..count).map(|_| (next() + next() + next()) * 2.0);
    match elem {
        ElemType::F32 => values.flat_map(|x| (x as f32).to_le_bytes()).collect(),
        ElemType::F16 => values.flat_map(|x| half::f16::from_f64(x).to_le_bytes()).collect(),
        ElemType::Bf16 => values.flat_map(|x| half::bf16::from_f64(x).to_le_bytes()).collect(),
    }
}
