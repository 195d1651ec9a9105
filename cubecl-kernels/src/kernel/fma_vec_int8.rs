//! The vectorized FMA kernel on INT8 Q and K (the output of the prepass in `quant.rs`),
//! decoding on load: each `u32` word is 4 codes of one row, decoded to exact small integers in
//! the stage type. Everything after the score matmul is `fma_vec`'s:
//!
//! - `dot = Σ q_i8·k_i8` in f32 FMAs: every product and partial sum is an integer below 2²⁴
//!   (`127² · 256 < 2²⁴`), so the dot is exact, as an INT32 MMA's.
//! - `s = dot · (q_scale · k_scale)`, one multiply per (row, key): the Q scale carries
//!   `softmax_scale · log2 e`, so `s` is the logit in log2 units, and the online softmax runs
//!   with `scale = ln 2` (`exp((s − m)·ln 2) = 2^(s − m)`), its LSE `m·ln 2 + ln l`.
//! - With smoothing the LSE gets the prepass's `lse_shift` added, by the unit that wrote it.
//!
//! The scales follow the tile: the Q block is the cube's `bq` rows and one K scale covers the
//! tile's `bk` keys (one load per tile), so the prepass must have used `block_q = bq`,
//! `block_k = bk` (the launcher checks).

use cubecl::prelude::*;

use super::fma_vec::{
    cube_load_v, online_softmax, thread_apply_mask, thread_score_matmul, thread_value_matmul, write_results,
    FmaVecConfig, W,
};
use super::quant::{block_slot, Int8Granularity};
use super::{cube_key_ranges, AttnShape, NO_MAX};

/// Compile-time key of the INT8 inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Int8Config {
    pub granularity: Int8Granularity,
    /// Warps of the Q scale layout (`bq / warps` rows each).
    pub warps: usize,
    /// Add the per-row LSE shift (K was smoothed).
    pub shift_lse: bool,
}

impl Int8Config {
    pub const fn slots(&self) -> usize {
        match self.granularity {
            Int8Granularity::PerBlock => 1,
            Int8Granularity::PerWarp => self.warps,
            Int8Granularity::PerThread => self.warps * super::quant::THREAD_GROUPS,
        }
    }
}

/// Runtime shape of the scale tensors.
#[derive(CubeType, CubeLaunch)]
pub struct Int8Shape {
    pub kv_heads: u32,
    /// `ceil(q_len / bq)`.
    pub q_blocks: u32,
    /// `ceil(kv_len / bk)`.
    pub k_blocks: u32,
}

/// `E`: element type of V and O. `S`: stage type (the codes are exact in any float type).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_fma_vec_int8<E: Float, S: Float, N: Size>(
    q: &Array<u32>,
    k: &Array<u32>,
    q_scales: &Array<f32>,
    k_scales: &Array<f32>,
    lse_shift: &Array<f32>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    scales: &Int8Shape,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] icfg: Int8Config,
) {
    let unit = UNIT_POS as usize;
    let unit_row = unit / cfg.tc;
    let unit_col = unit % cfg.tc;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q_block = CUBE_POS_X as usize;
    let q0 = q_block * cfg.bq;
    let kv_head = head / shape.group as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;

    let q_base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize;
    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    let mut q_stage = SharedMemory::<Vector<S, N>>::new(comptime!(cfg.head_dim * cfg.q_pitch()));
    let mut kv_stage = SharedMemory::<Vector<S, N>>::new(cfg.kv_stage_len());
    let mut p_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.bk * cfg.p_pitch()));
    let mut red_stage = SharedMemory::<f32>::new(comptime!(cfg.bq * cfg.tc));

    cube_load_codes_transposed::<S, N>(q, &mut q_stage, q_base, shape.q_s2 as usize, q0, q_len, cfg.bq, cfg.head_dim, cfg);

    // The Q scale of each of the unit's rows (rows past q_len read their group's scale too:
    // it exists, and their scores are never written out).
    let rm = comptime!(cfg.rm());
    let kq = comptime!(cfg.kq());
    let slots = comptime!(icfg.slots());
    let q_scale_base = ((batch * shape.q_heads as usize + head) * scales.q_blocks as usize + q_block) * slots;
    let mut q_scale = Array::<f32>::new(rm);
    #[unroll]
    for i in 0..rm {
        q_scale[i] = q_scales[q_scale_base + block_slot(unit_row * rm + i, icfg.granularity, cfg.bq, icfg.warps)];
    }
    let k_scale_base = (batch * scales.kv_heads as usize + kv_head) * scales.k_blocks as usize;

    let mut row_max = Array::<f32>::new(rm);
    let mut row_sum = Array::<f32>::new(rm);
    let mut acc = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.cq()));
    let mut scores = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.kq()));
    #[unroll]
    for i in 0..rm {
        row_max[i] = NO_MAX;
        row_sum[i] = 0.0;
    }
    #[unroll]
    for i in 0..comptime!(cfg.rm() * cfg.cq()) {
        acc[i] = Vector::new(0.0f32);
    }

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, cfg.bq, cfg.bk, cfg.causal);

    sync_cube();

    for tile in 0..num_tiles {
        let k0 = tile * cfg.bk;
        let masked = tile >= num_full;

        cube_load_codes_transposed::<S, N>(k, &mut kv_stage, k_base, shape.k_s2 as usize, k0, kv_len, cfg.bk, cfg.head_dim, cfg);
        sync_cube();

        thread_score_matmul::<S, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg);
        // Dequantize: s = dot · (q_scale · k_scale), the base-2 logit.
        let k_scale = k_scales[k_scale_base + tile];
        #[unroll]
        for i in 0..rm {
            let factor = Vector::<f32, N>::new(q_scale[i] * k_scale);
            #[unroll]
            for j in 0..kq {
                scores[i * kq + j] = scores[i * kq + j] * factor;
            }
        }
        if masked {
            thread_apply_mask::<N>(&mut scores, shape, q0, k0, unit_row, unit_col, cfg);
        }

        online_softmax::<f32, N>(
            &mut scores,
            &mut row_max,
            &mut row_sum,
            &mut acc,
            &mut p_stage,
            &mut red_stage,
            shape.scale,
            unit_row,
            unit_col,
            cfg,
        );
        if cfg.plane_reduce {
            sync_cube();
        }

        cube_load_v::<E, S, N>(v, &mut kv_stage, v_base, shape.v_s2 as usize, k0, kv_len, cfg);
        sync_cube();

        thread_value_matmul::<f32, S, N>(&p_stage, &kv_stage, &mut acc, unit_row, unit_col, cfg);
        sync_cube();
    }

    write_results::<E, N>(
        o, lse, &mut red_stage, &row_max, &mut row_sum, &acc, shape, batch, head, q0, unit_row, unit_col, cfg,
    );

    // Smoothing took `lse_shift` off every logit of the row: add it back to the LSE written
    // above (same unit, same address, so program order makes the value visible). Rows that saw
    // no key keep -inf.
    if icfg.shift_lse {
        if cfg.write_lse {
            if unit_col == 0 {
                #[unroll]
                for i in 0..rm {
                    let row = q0 + unit_row * rm + i;
                    if row < q_len && row_sum[i] > 0.0 {
                        let idx = (batch * shape.q_heads as usize + head) * q_len + row;
                        lse[idx] = lse[idx] + lse_shift[idx];
                    }
                }
            }
        }
    }
}

/// `fma_vec`'s transposing stage load on INT8 codes: each task reads one word (4 channels) from
/// each of W consecutive rows, decodes them and writes the W x W block transposed. Rows past
/// `len` are zero.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_load_codes_transposed<S: Float, N: Size>(
    src: &Array<u32>,
    stage: &mut SharedMemory<Vector<S, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let row_quads = comptime!(rows / W);
    let tasks = comptime!(rows / W * (dim / W));
    let per_unit = comptime!(tasks.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let t = step * cfg.units() + UNIT_POS as usize;
        if t < tasks {
            let rq = t % row_quads;
            let dq = t / row_quads;
            let mut words = Array::<u32>::new(W);
            #[unroll]
            for e in 0..W {
                let row = row0 + rq * W + e;
                let mut word = 0u32;
                if row < len {
                    word = src[(base + row * row_stride) / W + dq];
                }
                words[e] = word;
            }
            #[unroll]
            for x in 0..W {
                let mut column = Vector::<S, N>::empty();
                #[unroll]
                for e in 0..W {
                    column[e] = S::cast_from(decode_code(words[e], x));
                }
                stage[(dq * W + x) * row_quads + rq] = column;
            }
        }
    }
}

/// Byte `x` of `word` as the signed integer it encodes (two's complement), in f32.
#[cube]
fn decode_code(word: u32, #[comptime] x: usize) -> f32 {
    let byte = (word >> comptime!((8 * x) as u32)) & 0xffu32;
    f32::cast_from(byte) - select(byte >= 128u32, 256.0f32, 0.0f32)
}

/// The INT8 kernel compiled for CUDA offline (no GPU), at the tiling `select_int8` gives on the
/// H100: every head dim with f16 V, per-thread Q scales and the LSE shift, causal; at head dim
/// 128 every Q scale granularity with and without the shift, f32 V, and the other masking and
/// LSE variant; the A100's build. NVRTC must compile each, CubeCL must declare the shared
/// memory the fit check counts, and ptxas must not spill.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib fma_vec_int8::cuda_tests`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{Cover, 
        array, attn_shape_arg, fma_vec_config, head_dims, selected_fma_tiles, settings, Arch, OfflineCuda,
        Variant,
    };
    use crate::launch::{Int8Tiles, PortableKernel};
    use crate::Dtype;
    use cubecl::wgpu::WgpuRuntime;

    fn definition(
        client: &ComputeClient<WgpuRuntime>,
        v_dtype: Dtype,
        stage_f32: bool,
        cfg: FmaVecConfig,
        icfg: Int8Config,
    ) -> KernelDefinition {
        macro_rules! def {
            ($e:ty, $s:ty) => {
                fwd_portable_fma_vec_int8::FwdPortableFmaVecInt8::<$e, $s, WgpuRuntime>::new(
                    settings(cfg.units()),
                    client.clone(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    attn_shape_arg(),
                    Int8ShapeCompilationArg { kv_heads: (), q_blocks: (), k_blocks: () },
                    W,
                    cfg,
                    icfg,
                )
                .define()
            };
        }
        // `launch_int8`'s dispatch (bf16 V is refused).
        match (v_dtype, stage_f32) {
            (Dtype::F32, _) => def!(f32, f32),
            (Dtype::F16, true) => def!(half::f16, f32),
            (Dtype::F16, false) => def!(half::f16, half::f16),
            (Dtype::Bf16, _) => unreachable!("the INT8 kernel takes f16 or f32 V"),
        }
    }

    #[test]
    fn nvrtc_compiles_the_cuda_variants_with_the_tiling_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        use Int8Granularity::{PerBlock, PerThread, PerWarp};
        // (arch, V type, d, dv, granularity, shift_lse, causal, write_lse)
        let mut cases = Vec::new();
        for (d, dv) in head_dims() {
            cases.push((Arch::Sm90, Dtype::F16, d, dv, PerThread, true, true, true));
        }
        for granularity in [PerBlock, PerWarp, PerThread] {
            for shift in [false, true] {
                if (granularity, shift) != (PerThread, true) {
                    cases.push((Arch::Sm90, Dtype::F16, 128, 128, granularity, shift, true, true));
                }
            }
        }
        cases.push((Arch::Sm90, Dtype::F32, 128, 128, PerThread, true, true, true));
        cases.push((Arch::Sm90, Dtype::F16, 128, 128, PerThread, false, false, false));
        cases.push((Arch::Sm80, Dtype::F16, 128, 128, PerThread, true, true, true));
        cases.push((Arch::Sm80, Dtype::F32, 128, 128, PerBlock, false, true, true));
        let mut cover = Cover::new();
        let variants = cases.into_iter().filter(|c| cover.take(&[&c.0, &c.1, &c.2, &c.3, &c.4, &c.5, &c.6, &c.7])).map(|(arch, v_dtype, d, dv, granularity, shift_lse, causal, write_lse)| {
            let int8 = |tiles| Int8Tiles { tiles, granularity, smooth_k: shift_lse };
            let tiles = selected_fma_tiles(arch, d, dv, v_dtype, |t| PortableKernel::Int8(int8(t)));
            let cfg = fma_vec_config(&tiles, d, dv, causal, write_lse, true);
            // As `launch_int8` builds it: the scale layout's warps.
            let icfg = Int8Config { granularity, warps: int8(tiles).blocking().warps, shift_lse };
            // With plane reductions the f32 reduction scratch is unused and dropped.
            let formula = PortableKernel::Int8(int8(tiles)).smem_bytes(d as u32, dv as u32, v_dtype);
            Variant {
                name: format!(
                    "fma_vec_int8_{}_{v_dtype}_d{d}v{dv}_{tiles}_shift{shift_lse}_causal{causal}_lse{write_lse}",
                    granularity.tag()
                ),
                arch,
                definition: definition(cuda.client(), v_dtype, tiles.stage_f32, cfg, icfg),
                shared_bytes: Some(formula - 4 * cfg.bq * cfg.tc),
                spill_free: true,
            }
        });
        cuda.check_all(variants);
    }
}
