//! How far 4-bit Q and K alone move attention: the f64 reference on bf16 inputs against the same
//! computation with Q and K replaced by their NVFP4 values (V and everything else exact, in
//! f64), for the codec's recipe (block scale from the block's amax) and, as a bound on what a
//! smarter encoder could reach in the same format, for a per-block search of the scale that
//! minimizes the block's squared error (45 candidates from 0.5 to 1.6 times the amax scale,
//! each rounded to UE4M3; the tensor scale as the codec's). With and without K smoothing (the
//! per-head mean of K over the keys subtracted before quantizing). The project's inputs (unit
//! normal with 0.1% ±8σ outliers), hd 128, scale 1/√128.
//!
//!     cargo run --release --example nvfp4_error_budget [-- SEQ]

use quattn::codec::fp4::e2m1;
use quattn::codec::fp8::ue4m3;
use quattn::codec::nvfp4::{self, Nvfp4Tensor, BLOCK};
use quattn::metrics::ErrorMetrics;
use quattn::{inputs, reference, AttentionProblem, Dtype, HostSlice};

/// `rows × cols` values quantized to NVFP4 and decoded: the codec's recipe.
fn codec(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    Nvfp4Tensor::quantize(x, rows, cols).expect("finite inputs").dequantize()
}

/// The same format, each block's UE4M3 scale chosen among candidates to minimize the block's
/// squared error (elements encoded as the codec encodes them for that scale).
fn searched(x: &[f32], _rows: usize, _cols: usize) -> Vec<f32> {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let ts = nvfp4::tensor_scale_for(amax);
    let mut out = vec![0.0f32; x.len()];
    for (block, dst) in x.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
        let bmax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut best = (f64::INFINITY, 0u8);
        for i in 0..45 {
            let f = 0.5 + 1.1 * i as f32 / 44.0;
            let code = ue4m3::encode((bmax * f / e2m1::MAX) / ts);
            let err: f64 = block
                .iter()
                .map(|&v| {
                    let d = nvfp4::decode_element(nvfp4::encode_element(v, code, ts), code, ts);
                    (d as f64 - v as f64).powi(2)
                })
                .sum();
            if err < best.0 {
                best = (err, code);
            }
        }
        for (d, &v) in dst.iter_mut().zip(block) {
            *d = nvfp4::decode_element(nvfp4::encode_element(v, best.1, ts), best.1, ts);
        }
    }
    out
}

/// K minus its per-head mean over the keys (BHSD, batch 1), and the mean.
fn smooth(k: &[f32], heads: usize, len: usize, dim: usize) -> (Vec<f32>, Vec<f32>) {
    let mut mean = vec![0.0f32; heads * dim];
    for h in 0..heads {
        for c in 0..dim {
            let s: f64 = (0..len).map(|i| k[(h * len + i) * dim + c] as f64).sum();
            mean[h * dim + c] = (s / len as f64) as f32;
        }
    }
    let out = k.iter().enumerate().map(|(i, &v)| v - mean[(i / (len * dim)) * dim + i % dim]).collect();
    (out, mean)
}

fn main() -> Result<(), quattn::Error> {
    let seq: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let p = AttentionProblem::new(1, 8, seq, 128);
    let d = p.head_dim;
    let bf16 = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(Dtype::Bf16);
    println!("{:<34} {:>10} {:>10} {:>10}", "Q and K in NVFP4", "rel-L2", "cos-sim", "Q rel-L2");
    let seeds = [1u64, 2, 3];
    for (name, quant) in [("codec (amax scales)", codec as fn(&[f32], usize, usize) -> Vec<f32>), ("searched scales", searched)] {
        for smoothing in [false, true] {
            let (mut rel, mut cos, mut qrel) = (0.0f64, 0.0f64, 0.0f64);
            for seed in seeds {
                let (q, k, v) = inputs::qkv(&p, seed);
                let (q, k, v) = (bf16(q), bf16(k), bf16(v));
                let exact = reference::attention_f64(&p, &q, &k, &v)?;
                let rows = |x: &[f32]| x.len() / d;
                let dq = quant(&q, rows(&q), d);
                // Smoothing shifts every score of a query row by the same q·μ: softmax unchanged,
                // so the mean is added back to the quantized K exactly.
                let dk = if smoothing {
                    let (ks, mean) = smooth(&k, p.kv_heads, p.kv_len, d);
                    let dq_k = quant(&ks, rows(&ks), d);
                    dq_k.iter().enumerate().map(|(i, &v)| v + mean[(i / (p.kv_len * d)) * d + i % d]).collect()
                } else {
                    quant(&k, rows(&k), d)
                };
                let r = reference::attention_f64(&p, &dq, &dk, &v)?;
                let o: Vec<f32> = r.o.iter().map(|&x| x as f32).collect();
                let m = ErrorMetrics::compare(&o, &exact.o);
                let qd: Vec<f64> = q.iter().map(|&x| x as f64).collect();
                rel += m.rel_l2 / seeds.len() as f64;
                cos += m.cos_sim / seeds.len() as f64;
                qrel += ErrorMetrics::compare(&dq, &qd).rel_l2 / seeds.len() as f64;
            }
            let label = format!("{name}{}", if smoothing { ", K smoothed" } else { "" });
            println!("{label:<34} {rel:>10.4} {cos:>10.6} {qrel:>10.4}");
        }
    }
    Ok(())
}
