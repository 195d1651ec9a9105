//! NVFP4 quantization on the device, bit for bit the CPU codec's recipe (`quattn::codec::nvfp4`):
//! `tensor_scale = max(amax / 2688, f32::MIN_POSITIVE)` (1 for an all-zero tensor); per block of
//! 16, `block = ue4m3((amax_block / 6) / tensor_scale)`; per element
//! `e2m1(x / (ue4m3(block) · tensor_scale))` (code 0 where that divisor is 0). Every division is
//! correctly rounded (`div_rn_bits`, as the INT8 prepass's), multiplications are correctly
//! rounded on every target, and the encoders are the attention kernel's.
//!
//! Two launches: [`nvfp4_tensor_scale`] (one cube reduces the whole tensor: simple and exact,
//! not fast) and [`nvfp4_quantize_blocks`] (one unit per 4 blocks, so that each writes whole
//! words: 8 code words and 1 scale word).
//!
//! Domain: finite input (the codec refuses the rest); divisors `ue4m3(block) · tensor_scale`
//! that are f32 normals, i.e. tensors whose amax is above about 2^-117 (smaller ones are below
//! every scale the format can hold usefully).

use cubecl::prelude::*;

use super::fma_vec_fp4::{e2m1_code, ue4m3_code, ue4m3_value};
use super::quant::div_rn_bits;

/// Units of the tensor-scale cube.
pub(crate) const AMAX_UNITS: usize = 256;
/// Units per cube of the block kernel.
pub(crate) const BLOCK_UNITS: usize = 128;
/// Blocks per unit of the block kernel (4 scale bytes = one word).
pub(crate) const BLOCKS_PER_UNIT: usize = 4;
/// `2688.0f32.to_bits()`: 6 · 448.
const DIVISOR_BITS: u32 = 0x4528_0000;
/// `6.0f32.to_bits()`.
const SIX_BITS: u32 = 0x40c0_0000;
/// `f32::MIN_POSITIVE.to_bits()`, used as an f32 literal made at expansion time (a bitcast of a
/// literal does not compile on CUDA).
const MIN_NORMAL_BITS: u32 = 0x0080_0000;

/// `out[0] = tensor_scale_for(max |x|)` over `n` elements. One cube of [`AMAX_UNITS`] units.
#[cube(launch_unchecked)]
pub fn nvfp4_tensor_scale(x: &Array<f32>, out: &mut Array<f32>, n: u32) {
    let unit = UNIT_POS as usize;
    let mut red = SharedMemory::<f32>::new(AMAX_UNITS);
    let mut m = 0.0f32;
    let mut i = unit;
    while i < n as usize {
        m = max(m, f32::abs(x[i]));
        i += AMAX_UNITS;
    }
    red[unit] = m;
    sync_cube();
    #[unroll]
    for step in 0..comptime!(AMAX_UNITS.trailing_zeros() as usize) {
        let half = comptime!(AMAX_UNITS >> (step + 1));
        if unit < half {
            red[unit] = max(red[unit], red[unit + half]);
        }
        sync_cube();
    }
    if unit == 0 {
        let amax = red[0];
        // A quotient below the normal range comes back as 0 and is raised to MIN_POSITIVE, as
        // the codec raises its subnormal quotient.
        let ts = max(div_rn_bits(amax, DIVISOR_BITS), f32::new(comptime!(f32::from_bits(MIN_NORMAL_BITS))));
        out[0] = select(amax == 0.0f32, 1.0f32, ts);
    }
}

/// Quantizes `blocks` blocks of 16 consecutive elements with the tensor scale `ts[0]`: codes
/// two per byte (element `2i` in the low nibble), 8 per word; one UE4M3 code per block, 4 per
/// word.
#[cube(launch_unchecked)]
pub fn nvfp4_quantize_blocks(x: &Array<f32>, ts: &Array<f32>, packed: &mut Array<u32>, scales: &mut Array<u32>, blocks: u32) {
    let g = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    let tensor_scale = ts[0];
    let first = g * BLOCKS_PER_UNIT;
    if first < blocks as usize {
        let mut scale_word = 0u32;
        #[unroll]
        for j in 0..BLOCKS_PER_UNIT {
            let b = first + j;
            if b < blocks as usize {
                let base = b * 16;
                let mut amax = 0.0f32;
                #[unroll]
                for e in 0..16usize {
                    amax = max(amax, f32::abs(x[base + e]));
                }
                let code = ue4m3_code(div_rn_bits(div_rn_bits(amax, SIX_BITS), u32::reinterpret(tensor_scale)));
                let denom = ue4m3_value(code) * tensor_scale;
                scale_word |= code << comptime!((8 * j) as u32);
                #[unroll]
                for w in 0..2usize {
                    let mut word = 0u32;
                    #[unroll]
                    for e in 0..8usize {
                        let mut c = 0u32;
                        if denom != 0.0f32 {
                            c = e2m1_code(div_rn_bits(x[base + w * 8 + e], u32::reinterpret(denom)));
                        }
                        word |= c << comptime!((4 * e) as u32);
                    }
                    packed[b * 2 + w] = word;
                }
            }
        }
        scales[g] = scale_word;
    }
}

/// Scale bytes `[rows, cols]`, row-major and packed 4 per word, from the 128x4-blocked layout
/// the block-scaled MMAs read (`crate::blocked_scale_offset`): output word `w` gathers bytes
/// `4w .. 4w + 4`, those past `rows · cols` zero.
#[cube(launch_unchecked)]
pub fn scales_from_blocked(src: &Array<u32>, dst: &mut Array<u32>, rows: u32, cols: u32) {
    let w = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    let cols = cols as usize;
    let n = rows as usize * cols;
    if w * 4 < n {
        let col_blocks = cols.div_ceil(4);
        let mut word = 0u32;
        #[unroll]
        for b in 0..4usize {
            let i = w * 4 + b;
            if i < n {
                let (r, c) = (i / cols, i % cols);
                let at = ((r / 128) * col_blocks + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
                word |= ((src[at / 4] >> (8 * (at % 4)) as u32) & 0xffu32) << comptime!((8 * b) as u32);
            }
        }
        dst[w] = word;
    }
}

/// The NVFP4 quantization kernels and the blocked-scale conversion compiled for CUDA offline (no GPU), for the H100 and the
/// A100: NVRTC must compile them (a bitcast of an f32 literal, which CubeCL's CUDA backend emits
/// as `reinterpret_cast` of an rvalue, fails here) and ptxas must not spill.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib quant_fp4::cuda_tests`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{array, settings, Arch, OfflineCuda, Variant};
    use cubecl::wgpu::WgpuRuntime;

    #[test]
    fn nvrtc_compiles_the_quantization_and_scale_layout_kernels_without_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let client = cuda.client();
        let variants = [Arch::Sm90, Arch::Sm80].into_iter().flat_map(|arch| {
            [
                Variant {
                    name: "nvfp4_tensor_scale".into(),
                    arch,
                    definition: nvfp4_tensor_scale::Nvfp4TensorScale::<WgpuRuntime>::new(
                        settings(AMAX_UNITS),
                        client.clone(),
                        array(),
                        array(),
                        (),
                    )
                    .define(),
                    // The reduction buffer: one f32 per unit.
                    shared_bytes: Some(4 * AMAX_UNITS),
                    spill_free: true,
                },
                Variant {
                    name: "nvfp4_quantize_blocks".into(),
                    arch,
                    definition: nvfp4_quantize_blocks::Nvfp4QuantizeBlocks::<WgpuRuntime>::new(
                        settings(BLOCK_UNITS),
                        client.clone(),
                        array(),
                        array(),
                        array(),
                        array(),
                        (),
                    )
                    .define(),
                    shared_bytes: Some(0),
                    spill_free: true,
                },
                Variant {
                    name: "scales_from_blocked".into(),
                    arch,
                    definition: scales_from_blocked::ScalesFromBlocked::<WgpuRuntime>::new(
                        settings(256),
                        client.clone(),
                        array(),
                        array(),
                        (),
                        (),
                    )
                    .define(),
                    shared_bytes: Some(0),
                    spill_free: true,
                },
            ]
        });
        cuda.check_all(variants);
    }
}
