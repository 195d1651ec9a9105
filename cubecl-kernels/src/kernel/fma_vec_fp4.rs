//! The vectorized FMA kernel on 4-bit block-scaled Q and K (NVFP4: E2M1 codes with one UE4M3
//! scale per 16 elements and an f32 tensor scale; MXFP4: E2M1 codes with one E8M0 scale per 32),
//! decoding on load: what is read from global memory is the packed codes (8 per `u32` word) and
//! the one-byte block scales; each staged element is `e2m1 · block_scale`, exact in f32.
//!
//! - `s = (Σ_d q̃_d·k̃_d) · (ts_q · ts_k)`: every product of two staged elements is exact (at
//!   most 5 significant bits each), so only the f32 sum rounds, as in a block-scaled MMA.
//! - V is either bf16 (two per word, widened exactly) with P rounded to bf16 before P·V, or
//!   4-bit along the key axis (`Vᵀ`, one scale per 16 keys of a channel, staged as
//!   `e2m1 · ue4m3`, exact) with P quantized to NVFP4 per 16 keys of a row with the fixed
//!   tensor scale `1/2688` (valid because `p ≤ 1`), or (`p16`) with P rounded to f16 (round to
//!   nearest even, subnormals included; computed on the f32 bits, so no f16 arithmetic is
//!   needed); then `acc` holds `Σ p̃·ṽ` and the epilogue applies `ts_p · ts_v` (`ts_v` alone
//!   with f16 P) once.
//! - The running max always moves (no FlashAttention-4 stale max): with a stale max `p` could
//!   reach 2^8 and NVFP4 P with its fixed tensor scale would saturate.
//!
//! Everything else (scores, softmax, row sums of the unrounded P, accumulation) is `fma_vec`'s,
//! in f32. Inputs are dense rows: Q row `(b·q_heads + h)·q_len + i`, K row
//! `(b·kv_heads + kvh)·kv_len + j`, `head_dim / 8` words each; V rows likewise
//! (`v_head_dim / 2` words of bf16), or `Vᵀ` rows `(b·kv_heads + kvh)·v_head_dim + c` of
//! `v_cols / 8` words (`v_cols` = `kv_len` padded to 16 with zero codes). Scale codes are bytes,
//! row-major `[rows, cols / block]`, packed 4 per word.

use cubecl::prelude::*;

use super::fma_vec::{online_softmax, thread_apply_mask, thread_score_matmul, thread_value_matmul, write_results, FmaVecConfig, W};
use super::quant::div_rn_bits;
use super::{cube_key_ranges, AttnShape, NO_MAX};

/// Codes per `u32` word.
const CODES_PER_WORD: usize = 8;
/// Keys per NVFP4 block of P and Vᵀ.
pub(crate) const P_BLOCK: usize = 16;
/// `(1/2688).to_bits()`: the NVFP4 tensor scale of P (`tensor_scale_for(1.0)`). The kernel
/// takes it as an f32 literal made at expansion time: a bitcast of a literal does not compile on
/// CUDA (see `div_rn_bits`), and the literal is printed exactly.
pub(crate) const P_TENSOR_SCALE_BITS: u32 = 0x39c3_0c31;
/// `6.0f32.to_bits()`, the largest E2M1 magnitude.
const SIX_BITS: u32 = 0x40c0_0000;

/// Compile-time key of the 4-bit inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fp4Config {
    /// MXFP4 (E8M0 per 32) for Q and K instead of NVFP4 (UE4M3 per 16).
    pub mx: bool,
    /// V as 4-bit `Vᵀ` (and P quantized to NVFP4) instead of bf16 V (and P rounded to bf16).
    pub v4: bool,
    /// With `v4`: P rounded to f16 instead of quantized to NVFP4 (`Fp4V::Nvfp4P16`).
    pub p16: bool,
    /// Add the per-row LSE shift (K was smoothed).
    pub shift_lse: bool,
}

/// Runtime extents of the 4-bit tensors.
#[derive(CubeType, CubeLaunch)]
pub struct Fp4Shape {
    pub kv_heads: u32,
    /// Words per row of `Vᵀ` (`v_cols / 8`); unused with bf16 V.
    pub v_words: u32,
}

/// `q_ts`, `k_ts`, `v_ts`: one f32 tensor scale each (1 for MXFP4 Q/K; `v_ts` unused with bf16
/// V). O is f32.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_fma_vec_fp4<N: Size>(
    q: &Array<u32>,
    q_sc: &Array<u32>,
    k: &Array<u32>,
    k_sc: &Array<u32>,
    v: &Array<u32>,
    v_sc: &Array<u32>,
    q_ts: &Array<f32>,
    k_ts: &Array<f32>,
    v_ts: &Array<f32>,
    lse_shift: &Array<f32>,
    o: &mut Array<Vector<f32, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    fshape: &Fp4Shape,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] fcfg: Fp4Config,
) {
    let unit = UNIT_POS as usize;
    let unit_row = unit / cfg.tc;
    let unit_col = unit % cfg.tc;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q0 = CUBE_POS_X as usize * cfg.bq;
    let kv_head = head / shape.group as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let kv_heads = fshape.kv_heads as usize;

    let q_row0 = (batch * shape.q_heads as usize + head) * q_len;
    let k_row0 = (batch * kv_heads + kv_head) * kv_len;

    let mut q_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.head_dim * cfg.q_pitch()));
    let mut kv_stage = SharedMemory::<Vector<f32, N>>::new(cfg.kv_stage_len());
    let mut p_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.bk * cfg.p_pitch()));
    let mut red_stage = SharedMemory::<f32>::new(comptime!(cfg.bq * cfg.tc));

    cube_load_fp4_transposed::<N>(q, q_sc, &mut q_stage, q_row0, q0, q_len, cfg.bq, cfg.head_dim, fcfg.mx, cfg);

    let rm = comptime!(cfg.rm());
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
    let qk_factor = Vector::<f32, N>::new(q_ts[0] * k_ts[0]);

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, cfg.bq, cfg.bk, cfg.causal);

    sync_cube();

    for tile in 0..num_tiles {
        let k0 = tile * cfg.bk;
        let masked = tile >= num_full;

        cube_load_fp4_transposed::<N>(k, k_sc, &mut kv_stage, k_row0, k0, kv_len, cfg.bk, cfg.head_dim, fcfg.mx, cfg);
        sync_cube();

        thread_score_matmul::<f32, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg);
        #[unroll]
        for i in 0..comptime!(cfg.rm() * cfg.kq()) {
            scores[i] = scores[i] * qk_factor;
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
        // P is complete and every unit is done reading K.
        sync_cube();
        if fcfg.v4 {
            if fcfg.p16 {
                cube_round_p::<N>(&mut p_stage, true, cfg);
            } else {
                cube_quantize_p::<N>(&mut p_stage, cfg);
            }
            cube_load_v4::<N>(v, v_sc, &mut kv_stage, (batch * kv_heads + kv_head) * cfg.v_head_dim, fshape.v_words as usize, k0, cfg);
        } else {
            cube_round_p::<N>(&mut p_stage, false, cfg);
            cube_load_v_bf16::<N>(v, &mut kv_stage, k_row0, k0, kv_len, cfg);
        }
        sync_cube();

        thread_value_matmul::<f32, f32, N>(&p_stage, &kv_stage, &mut acc, unit_row, unit_col, cfg);
        sync_cube();
    }

    if fcfg.v4 {
        // acc holds Σ p̃·ṽ of the elements and block scales: the tensor scales (P's only when
        // P is NVFP4), once.
        let p_ts = comptime!(if fcfg.p16 { 1.0f32 } else { f32::from_bits(P_TENSOR_SCALE_BITS) });
        let f = Vector::<f32, N>::new(f32::new(p_ts) * v_ts[0]);
        #[unroll]
        for i in 0..comptime!(cfg.rm() * cfg.cq()) {
            acc[i] = acc[i] * f;
        }
    }

    write_results::<f32, N>(
        o, lse, &mut red_stage, &row_max, &mut row_sum, &acc, shape, batch, head, q0, unit_row, unit_col, cfg,
    );

    // Smoothing took `lse_shift` off every logit of the row: add it back to the LSE written
    // above (same unit, same address). Rows that saw no key keep -inf.
    if fcfg.shift_lse {
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

/// The value of E2M1 code `code` (low nibble), exactly, from its bits.
#[cube]
pub(crate) fn e2m1_value(code: u32) -> f32 {
    let e = (code >> 1u32) & 3u32;
    let m = code & 1u32;
    let normal = ((e + 126u32) << 23u32) | (m << 22u32);
    // Exponent 0: 0 or the subnormal 0.5.
    let sub = select(m == 1u32, 0x3f00_0000u32, 0u32);
    let sign = (code & 8u32) << 28u32;
    f32::reinterpret(select(e != 0u32, normal, sub) | sign)
}

/// The value of UE4M3 code `code` (sign bit ignored: scales are positive; 0x7F is never
/// produced by the saturating encoder).
#[cube]
pub(crate) fn ue4m3_value(code: u32) -> f32 {
    let e = (code >> 3u32) & 15u32;
    let m = code & 7u32;
    let normal = f32::reinterpret(((e + 120u32) << 23u32) | (m << 20u32));
    // Subnormals are m · 2^-9 (exact).
    select(e != 0u32, normal, f32::cast_from(m) * 0.001_953_125f32)
}

/// The value of E8M0 code `code`: `2^(code − 127)`; code 0 is the f32 subnormal 2^-127.
#[cube]
pub(crate) fn e8m0_value(code: u32) -> f32 {
    f32::reinterpret(select(code == 0u32, 0x0040_0000u32, code << 23u32))
}

/// The nearest UE4M3 code of `x ≥ 0` (finite), ties to even, saturating to 448 (0x7E): the
/// codec's `ue4m3::encode` on non-negative input.
#[cube]
pub(crate) fn ue4m3_code(x: f32) -> u32 {
    let bits = u32::reinterpret(x);
    let exp = bits >> 23u32;
    // Normal range (2^-6, biased exponent 121, and up): round the mantissa to 3 bits; the code
    // is (exp − 127 + 7) << 3 plus the mantissa, and a carry out of it moves the exponent.
    let man = bits & 0x7f_ffffu32;
    let keep = man >> 20u32;
    let rest = man & 0xf_ffffu32;
    let up = rest > 0x8_0000u32 || (rest == 0x8_0000u32 && (keep & 1u32) == 1u32);
    let normal = ((max(exp, 120u32) - 120u32) << 3u32) + keep + select(up, 1u32, 0u32);
    // Subnormal range: m = round_half_even(x · 2^9) (the product is exact), m ≤ 8.
    let y = x * 512.0f32;
    let fl = f32::floor(y);
    let frac = y - fl;
    let m = u32::cast_from(fl);
    let sub_up = frac > 0.5f32 || (frac == 0.5f32 && (m & 1u32) == 1u32);
    let sub = m + select(sub_up, 1u32, 0u32);
    let code = select(exp >= 121u32, normal, sub);
    min(code, 0x7eu32)
}

/// The nearest E2M1 code of `x` (finite), ties to even, saturating to ±6: the codec's
/// `e2m1::encode`. Each term counts a midpoint passed; at a tie the comparison is strict where
/// the lower neighbour has the even code and inclusive where the upper one has.
#[cube]
pub(crate) fn e2m1_code(x: f32) -> u32 {
    let a = f32::abs(x);
    let mut c = select(a > 0.25f32, 1u32, 0u32);
    c += select(a >= 0.75f32, 1u32, 0u32);
    c += select(a > 1.25f32, 1u32, 0u32);
    c += select(a >= 1.75f32, 1u32, 0u32);
    c += select(a > 2.5f32, 1u32, 0u32);
    c += select(a >= 3.5f32, 1u32, 0u32);
    c += select(a > 5.0f32, 1u32, 0u32);
    let sign = (u32::reinterpret(x) >> 28u32) & 8u32;
    c | sign
}

/// Byte `index` of a byte array packed 4 per word.
#[cube]
fn byte_at(src: &Array<u32>, index: usize) -> u32 {
    (src[index / 4] >> (8 * (index % 4)) as u32) & 0xffu32
}

/// Stages `rows` 4-bit rows (dense, from row `row_base + row0`, zero past `len`) of `dim`
/// elements as `[dim][rows/W]` vectors of W rows, each element `e2m1 · block_scale`. A task
/// reads one word (8 elements) of each of W consecutive rows and their block scales.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_load_fp4_transposed<N: Size>(
    src: &Array<u32>,
    scales: &Array<u32>,
    stage: &mut SharedMemory<Vector<f32, N>>,
    row_base: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] mx: bool,
    #[comptime] cfg: FmaVecConfig,
) {
    let block = comptime!(if mx { 32usize } else { 16usize });
    let words_per_row = comptime!(dim / CODES_PER_WORD);
    let blocks_per_row = comptime!(dim / block);
    let row_quads = comptime!(rows / W);
    let tasks = comptime!(rows / W * words_per_row);
    let per_unit = comptime!(tasks.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let t = step * cfg.units() + UNIT_POS as usize;
        if t < tasks {
            let rq = t % row_quads;
            let dw = t / row_quads;
            let mut words = Array::<u32>::new(W);
            let mut scale = Array::<f32>::new(W);
            #[unroll]
            for e in 0..W {
                let row = row0 + rq * W + e;
                let mut word = 0u32;
                let mut s = 0.0f32;
                if row < len {
                    let r = row_base + row;
                    word = src[r * words_per_row + dw];
                    let code = byte_at(scales, r * blocks_per_row + dw * CODES_PER_WORD / block);
                    if mx {
                        s = e8m0_value(code);
                    } else {
                        s = ue4m3_value(code);
                    }
                }
                words[e] = word;
                scale[e] = s;
            }
            #[unroll]
            for x in 0..CODES_PER_WORD {
                let mut column = Vector::<f32, N>::empty();
                #[unroll]
                for e in 0..W {
                    column[e] = e2m1_value((words[e] >> comptime!((4 * x) as u32)) & 15u32) * scale[e];
                }
                stage[(dw * CODES_PER_WORD + x) * row_quads + rq] = column;
            }
        }
    }
}

/// Stages bf16 values `[k0, k0+bk)` row-major (`[key][dv/W]`), widened exactly; zero past
/// `kv_len`. A task reads two words (4 values) of one key.
#[cube]
fn cube_load_v_bf16<N: Size>(
    v: &Array<u32>,
    stage: &mut SharedMemory<Vector<f32, N>>,
    row_base: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let per_row = comptime!(cfg.v_pitch());
    let words_per_row = comptime!(cfg.v_head_dim / 2);
    let count = comptime!(cfg.bk * cfg.v_pitch());
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if e < count {
            let key = e / per_row;
            let col = e % per_row;
            let mut lo = 0u32;
            let mut hi = 0u32;
            if k0 + key < kv_len {
                let w = (row_base + k0 + key) * words_per_row + col * 2;
                lo = v[w];
                hi = v[w + 1];
            }
            let mut value = Vector::<f32, N>::empty();
            value[0] = f32::reinterpret(lo << 16u32);
            value[1] = f32::reinterpret(lo & 0xffff_0000u32);
            value[2] = f32::reinterpret(hi << 16u32);
            value[3] = f32::reinterpret(hi & 0xffff_0000u32);
            stage[e] = value;
        }
    }
}

/// Stages keys `[k0, k0+bk)` of 4-bit `Vᵀ` (rows `row_base + c`, `v_words` words each) as
/// `[key][dv/W]`, each element `e2m1 · ue4m3`. A task reads one word (8 keys) of each of W
/// consecutive channels and their block scales; keys past the padded row are zero (keys
/// between `kv_len` and the padding hold zero codes).
#[cube]
fn cube_load_v4<N: Size>(
    v: &Array<u32>,
    v_sc: &Array<u32>,
    stage: &mut SharedMemory<Vector<f32, N>>,
    row_base: usize,
    v_words: usize,
    k0: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let key_words = comptime!(cfg.bk / CODES_PER_WORD);
    let channel_quads = comptime!(cfg.v_pitch());
    let tasks = comptime!(cfg.bk / CODES_PER_WORD * cfg.v_pitch());
    let per_unit = comptime!(tasks.div_ceil(cfg.units()));
    let w0 = k0 / CODES_PER_WORD;
    let blocks_per_row = v_words / 2;
    #[unroll]
    for step in 0..per_unit {
        let t = step * cfg.units() + UNIT_POS as usize;
        if t < tasks {
            let kw = t % key_words;
            let cquad = t / key_words;
            let mut words = Array::<u32>::new(W);
            let mut scale = Array::<f32>::new(W);
            #[unroll]
            for e in 0..W {
                let r = row_base + cquad * W + e;
                let mut word = 0u32;
                let mut s = 0.0f32;
                if w0 + kw < v_words {
                    word = v[r * v_words + w0 + kw];
                    s = ue4m3_value(byte_at(v_sc, r * blocks_per_row + (w0 + kw) / 2));
                }
                words[e] = word;
                scale[e] = s;
            }
            #[unroll]
            for x in 0..CODES_PER_WORD {
                let mut value = Vector::<f32, N>::empty();
                #[unroll]
                for e in 0..W {
                    value[e] = e2m1_value((words[e] >> comptime!((4 * x) as u32)) & 15u32) * scale[e];
                }
                stage[(kw * CODES_PER_WORD + x) * channel_quads + cquad] = value;
            }
        }
    }
}

/// Rounds every staged probability in place, to f16 (`f16`: [`round_f16_nonneg`]) or to bf16
/// (round to nearest even on the bits), both on the f32 bits (P is finite, non-negative and at
/// most 1 here). The row sums keep the unrounded values.
#[cube]
fn cube_round_p<N: Size>(p_stage: &mut SharedMemory<Vector<f32, N>>, #[comptime] f16: bool, #[comptime] cfg: FmaVecConfig) {
    let count = comptime!(cfg.bk * cfg.p_pitch());
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if e < count {
            let p = p_stage[e];
            let mut r = Vector::<f32, N>::empty();
            #[unroll]
            for l in 0..W {
                if comptime!(f16) {
                    r[l] = round_f16_nonneg(p[l]);
                } else {
                    let bits = u32::reinterpret(p[l]);
                    r[l] = f32::reinterpret((bits + 0x7fffu32 + ((bits >> 16u32) & 1u32)) & 0xffff_0000u32);
                }
            }
            p_stage[e] = r;
        }
    }
}

/// `x ≥ 0` (finite, below 65520) rounded to the nearest f16 value, ties to even, as an f32: from
/// 2^-14 up the mantissa is rounded to 10 bits; below, to a multiple of f16's subnormal step
/// 2^-24 (`x · 2^24` is exact, its fraction decides).
#[cube]
pub(crate) fn round_f16_nonneg(x: f32) -> f32 {
    let bits = u32::reinterpret(x);
    // Normal f16 range (biased f32 exponent 113 = 2^-14 and up): 13 mantissa bits dropped.
    let normal = f32::reinterpret((bits + 0xfffu32 + ((bits >> 13u32) & 1u32)) & 0xffff_e000u32);
    // Subnormal range: m = round_half_even(x · 2^24), m ≤ 1024 (1024 · 2^-24 = 2^-14, normal).
    let y = x * 16_777_216.0f32;
    let fl = f32::floor(y);
    let frac = y - fl;
    let m = u32::cast_from(fl);
    let up = frac > 0.5f32 || (frac == 0.5f32 && (m & 1u32) == 1u32);
    let sub = f32::cast_from(m + select(up, 1u32, 0u32)) * 5.960_464_5e-8f32;
    select((bits >> 23u32) >= 113u32, normal, sub)
}

/// Quantizes the staged probabilities to NVFP4 in place, per 16 keys of a row, with the fixed
/// tensor scale `ts = 1/2688`, exactly as the codec does (`block = ue4m3((amax / 6) / ts)`,
/// `code = e2m1(p / (ue4m3(block) · ts))`, correctly rounded divisions), and stores each as
/// `e2m1 · ue4m3(block)` (the tensor scale is applied in the epilogue). A task is one 16-key
/// block of W rows (one vector of Pᵀ per key).
#[cube]
fn cube_quantize_p<N: Size>(p_stage: &mut SharedMemory<Vector<f32, N>>, #[comptime] cfg: FmaVecConfig) {
    let row_quads = comptime!(cfg.bq / W);
    let tasks = comptime!(cfg.bk / P_BLOCK * (cfg.bq / W));
    let per_unit = comptime!(tasks.div_ceil(cfg.units()));
    let ts = f32::new(comptime!(f32::from_bits(P_TENSOR_SCALE_BITS)));
    #[unroll]
    for step in 0..per_unit {
        let t = step * cfg.units() + UNIT_POS as usize;
        if t < tasks {
            let rq = t % row_quads;
            let kb = t / row_quads;
            let base = kb * P_BLOCK * cfg.p_pitch() + rq;
            let mut amax = Vector::<f32, N>::new(0.0f32);
            #[unroll]
            for j in 0..P_BLOCK {
                amax = max(amax, Vector::abs(p_stage[base + j * cfg.p_pitch()]));
            }
            let mut scale = Vector::<f32, N>::empty();
            let mut denom = Vector::<f32, N>::empty();
            #[unroll]
            for l in 0..W {
                let code = ue4m3_code(div_rn_bits(div_rn_bits(amax[l], SIX_BITS), P_TENSOR_SCALE_BITS));
                let s = ue4m3_value(code);
                scale[l] = s;
                denom[l] = s * ts;
            }
            #[unroll]
            for j in 0..P_BLOCK {
                let p = p_stage[base + j * cfg.p_pitch()];
                let mut r = Vector::<f32, N>::empty();
                #[unroll]
                for l in 0..W {
                    // A block whose scale underflowed to 0 has code 0 everywhere (the codec's rule).
                    let mut value = 0.0f32;
                    if denom[l] > 0.0f32 {
                        value = e2m1_value(e2m1_code(div_rn_bits(p[l], u32::reinterpret(denom[l])))) * scale[l];
                    }
                    r[l] = value;
                }
                p_stage[base + j * cfg.p_pitch()] = r;
            }
        }
    }
}

/// P's f16 rounding on a wgpu adapter (llvmpipe in CI) against the `half` crate's conversion:
/// every f16 value in [0, 1], the midpoints between neighbours and the f32 values one ulp either
/// side of them (ties to even, in the normal and the subnormal range and across the binade
/// boundaries), values that round to zero, and random values.
#[cfg(test)]
mod tests {
    use super::*;
    use cubecl::wgpu::WgpuRuntime;

    #[cube(launch_unchecked)]
    fn round_kernel(x: &Array<f32>, out: &mut Array<f32>) {
        let i = ABSOLUTE_POS;
        if i < x.len() {
            out[i] = round_f16_nonneg(x[i]);
        }
    }

    #[test]
    fn p_rounds_to_the_nearest_f16_ties_to_even() {
        let Some(client) = crate::kernel::wgpu_test_client() else { return };
        // f16 bits 0 ..= 0x3c00 are every value in [0, 1].
        let mut xs = Vec::new();
        for b in 0u16..0x3c00 {
            let (lo, hi) = (half::f16::from_bits(b).to_f32(), half::f16::from_bits(b + 1).to_f32());
            let mid = 0.5 * (lo + hi);
            xs.push(lo);
            for j in -1i32..=1 {
                xs.push(f32::from_bits((mid.to_bits() as i32 + j) as u32));
            }
        }
        xs.extend([1.0f32, 1e-30, 2f32.powi(-26), 2f32.powi(-25), 3.0 * 2f32.powi(-26)]);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Log-uniform over 2^-30 .. 1.
            let e = (state >> 58) as i32 % 30;
            xs.push(((state >> 34) as f32 / (1u64 << 30) as f32) * 2f32.powi(-e));
        }
        let n = xs.len();
        let out = client.empty(4 * n);
        // SAFETY: n floats in and out, guarded by `x.len()`.
        unsafe {
            round_kernel::launch_unchecked::<WgpuRuntime>(
                &client,
                CubeCount::Static((n as u32).div_ceil(64), 1, 1),
                CubeDim::new_1d(64),
                ArrayArg::from_raw_parts(client.create_from_slice(f32::as_bytes(&xs)), n),
                ArrayArg::from_raw_parts(out.clone(), n),
            );
        }
        let got = f32::from_bytes(&client.read_one(out).unwrap()).to_vec();
        let mut wrong = Vec::new();
        for (x, g) in xs.iter().zip(&got) {
            let want = half::f16::from_f32(*x).to_f32();
            if want.to_bits() != g.to_bits() {
                wrong.push((*x, want, *g));
            }
        }
        assert!(wrong.is_empty(), "{} of {n} wrong, e.g. {:?}", wrong.len(), &wrong[..wrong.len().min(8)]);
    }
}

/// The 4-bit kernel compiled for CUDA offline (no GPU), at the tiling `select_fp4` gives on the
/// H100: NVFP4 and MXFP4 Q/K with bf16 and NVFP4 V at every head dim, causal with the LSE
/// shift; the other masking and LSE variant at head dim 128; the A100's build of each format.
/// NVRTC must compile each (a bitcast of an f32 literal, which CubeCL's CUDA backend emits as
/// `reinterpret_cast` of an rvalue, fails here), CubeCL must declare the shared memory the fit
/// check counts, and ptxas must not spill.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib fma_vec_fp4::cuda_tests`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{Cover, 
        array, attn_shape_arg, fma_vec_config, head_dims, selected_fma_tiles, settings, Arch, OfflineCuda,
        Variant,
    };
    use crate::launch::{Fp4Format, Fp4Tiles, Fp4V, PortableKernel};
    use crate::Dtype;
    use cubecl::wgpu::WgpuRuntime;

    fn definition(client: &ComputeClient<WgpuRuntime>, cfg: FmaVecConfig, fcfg: Fp4Config) -> KernelDefinition {
        fwd_portable_fma_vec_fp4::FwdPortableFmaVecFp4::<WgpuRuntime>::new(
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
            array(),
            array(),
            array(),
            array(),
            attn_shape_arg(),
            Fp4ShapeCompilationArg { kv_heads: (), v_words: () },
            W,
            cfg,
            fcfg,
        )
        .define()
    }

    #[test]
    fn nvrtc_compiles_the_cuda_variants_with_the_tiling_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let formats = [
            (Fp4Format::Nvfp4, Fp4V::Bf16),
            (Fp4Format::Nvfp4, Fp4V::Nvfp4),
            (Fp4Format::Nvfp4, Fp4V::Nvfp4P16),
            (Fp4Format::Mxfp4, Fp4V::Bf16),
            (Fp4Format::Mxfp4, Fp4V::Nvfp4),
        ];
        // (arch, format, V, d, dv, causal and LSE with its shift)
        let mut cases = Vec::new();
        for (format, v) in formats {
            for (d, dv) in head_dims() {
                cases.push((Arch::Sm90, format, v, d, dv, true));
            }
            cases.push((Arch::Sm90, format, v, 128, 128, false));
            cases.push((Arch::Sm80, format, v, 128, 128, true));
        }
        let mut cover = Cover::new();
        let variants = cases.into_iter().filter(|c| cover.take(&[&c.0, &c.1, &c.2, &c.3, &c.4, &c.5])).map(|(arch, format, v, d, dv, causal)| {
            let fp4 = |tiles| PortableKernel::Fp4(Fp4Tiles { tiles, format, v, decode: None });
            let tiles = selected_fma_tiles(arch, d, dv, Dtype::F32, fp4);
            // As `launch_fp4` builds them: no stale max; the shift only with the LSE.
            let cfg = fma_vec_config(&tiles, d, dv, causal, causal, false);
            let fcfg = Fp4Config { mx: format == Fp4Format::Mxfp4, v4: v.is_4bit(), p16: v == Fp4V::Nvfp4P16, shift_lse: causal };
            // With plane reductions the f32 reduction scratch is unused and dropped.
            let formula = fp4(tiles).smem_bytes(d as u32, dv as u32, Dtype::F32);
            Variant {
                name: format!("fma_vec_{format:?}_v{v:?}_d{d}v{dv}_{tiles}_causal{causal}_lse{causal}"),
                arch,
                definition: definition(cuda.client(), cfg, fcfg),
                shared_bytes: Some(formula - 4 * cfg.bq * cfg.tc),
                spill_free: true,
            }
        });
        cuda.check_all(variants);
    }
}
