//! The 4-bit prepass's CPU recipe (`quattn_native::nvfp4_quant::host`, the reference the GPU
//! check `native/examples/nvfp4_check.rs` holds the CUDA prepass to, byte for byte) equals
//! quattn's codecs (`codec::nvfp4`, `codec::mxfp4`) byte for byte, on the layouts the prepass
//! writes. Together the two make the GPU prepass bit-exact with the codec.

use quattn::codec::float16::{round_bf16_vec, round_f16_vec};
use quattn::codec::mxfp4::Mxfp4Tensor;
use quattn::codec::nvfp4::Nvfp4Tensor;
use quattn::Layout;
use quattn_native::nvfp4_quant::{host, Fp4Format};
use quattn_native::Strides;

/// Inputs that reach every branch of the recipe: normal values with outliers, E2M1 rounding
/// ties at power-of-two divisors, f16 subnormals next to normal blocks, zero blocks, one huge
/// block next to tiny ones (block scales that underflow UE4M3 to 0), and all zeros.
fn inputs(n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let base = quattn::inputs::normal_with_outliers(n, 3);
    let mids = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5];
    let ties: Vec<f32> = (0..n)
        .map(|i| {
            let e = ((i / 32) % 7) as i32 - 3;
            let v = if i % 32 == 0 { 6.0 } else { mids[i * 7 % mids.len()] };
            (if i % 3 == 0 { -v } else { v }) * 2f32.powi(e)
        })
        .collect();
    let tiny: Vec<f32> = (0..n)
        .map(|i| match (i / 16) % 4 {
            0 => 0.0,
            1 => base[i] * 1e-6,
            2 => base[i] * 6e-8,
            _ => base[i],
        })
        .collect();
    let span: Vec<f32> = (0..n).map(|i| if i < 16 { 6e4 } else { base[i] * 1e-3 }).collect();
    vec![("outliers", base), ("ties", ties), ("tiny", tiny), ("span", span), ("zeros", vec![0.0; n])]
}

#[test]
fn host_recipe_equals_the_codecs_byte_for_byte() {
    let (batch, heads, seq) = (2, 3, 41);
    for d in [64usize, 128] {
        let n = batch * heads * seq * d;
        for (name, x) in inputs(n) {
            for (dt, x) in [("f16", round_f16_vec(&x)), ("bf16", round_bf16_vec(&x))] {
                for layout in [Layout::Bhsd, Layout::Bshd] {
                    let st = Strides::new(layout, heads, seq, d);
                    let rows = host::rows_from_strided(&x, batch, heads, seq, d, &st);
                    let what = format!("{name} {dt} d{d} {layout:?}");
                    // The codec on the rows in the prepass's order (its row order does not
                    // change a byte: blocks are per row, the tensor scale global).
                    let t = Nvfp4Tensor::quantize(&rows, rows.len() / d, d).unwrap();
                    let h = host::quantize(Fp4Format::Nvfp4, &rows, d);
                    assert_eq!(h.tensor_scale.to_bits(), t.tensor_scale.to_bits(), "{what}");
                    assert_eq!(h.scales, t.block_scales, "{what}: NVFP4 scales");
                    assert_eq!(h.codes, t.packed, "{what}: NVFP4 codes");
                    let m = Mxfp4Tensor::quantize(&rows, rows.len() / d, d).unwrap();
                    let hm = host::quantize(Fp4Format::Mxfp4, &rows, d);
                    assert_eq!(hm.scales, m.scales, "{what}: MXFP4 scales");
                    assert_eq!(hm.codes, m.packed, "{what}: MXFP4 codes");
                }
            }
        }
    }
}

#[test]
fn the_inputs_exercise_the_edge_cases() {
    // The comparison above is only as good as its inputs: zero block scales (UE4M3 underflow)
    // and saturated elements must occur.
    let d = 64;
    let all = inputs(2 * 3 * 41 * d);
    let span = &all.iter().find(|(n, _)| *n == "span").unwrap().1;
    let h = host::quantize(Fp4Format::Nvfp4, &round_f16_vec(span), d);
    assert!(h.scales.contains(&0), "no underflowed block scale");
    let outl = &all[0].1;
    let h = host::quantize(Fp4Format::Nvfp4, &round_f16_vec(outl), d);
    assert!(h.codes.iter().any(|&b| b & 0x7 == 0x7 || b >> 4 & 0x7 == 0x7), "no saturated code");
}

#[test]
fn vt_prepass_recipe_equals_the_emulations_nvfp4_v() {
    // quattn's emulation of `nvfp4-v4` quantizes Vᵀ `[batch·kv_heads·d, ceil16(kv_len)]` with
    // one tensor scale; the Vᵀ prepass pads to 64 keys. Padding adds zero blocks only: each row's
    // first ceil16(kv_len) keys must match byte for byte, the rest be zero codes and scales.
    let (batch, heads, seq, d) = (2, 2, 77, 64);
    let st = Strides::new(Layout::Bshd, heads, seq, d);
    let v = round_f16_vec(&quattn::inputs::normal_with_outliers(batch * heads * seq * d, 9));
    let cols = seq.div_ceil(16) * 16;
    let mut vt = vec![0.0f32; batch * heads * d * cols];
    for b in 0..batch {
        for h in 0..heads {
            for s in 0..seq {
                for c in 0..d {
                    vt[((b * heads + h) * d + c) * cols + s] = v[b * st.batch + h * st.head + s * st.seq + c];
                }
            }
        }
    }
    let t = Nvfp4Tensor::quantize(&vt, batch * heads * d, cols).unwrap();
    let pad = seq.div_ceil(64) * 64;
    let h = host::quantize(Fp4Format::Nvfp4, &host::vt_rows(&v, batch, heads, seq, d, &st), pad);
    assert_eq!(h.tensor_scale.to_bits(), t.tensor_scale.to_bits());
    for r in 0..batch * heads * d {
        assert_eq!(&h.codes[r * pad / 2..][..cols / 2], &t.packed[r * cols / 2..][..cols / 2], "row {r} codes");
        assert!(h.codes[r * pad / 2 + cols / 2..(r + 1) * pad / 2].iter().all(|&c| c == 0), "row {r} padding codes");
        assert_eq!(&h.scales[r * pad / 16..][..cols / 16], &t.block_scales[r * cols / 16..][..cols / 16], "row {r} scales");
        assert!(h.scales[r * pad / 16 + cols / 16..(r + 1) * pad / 16].iter().all(|&c| c == 0), "row {r} padding scales");
    }
}
