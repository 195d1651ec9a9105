//! The manual-MMA kernel (`mma.rs`) on FP8 Q, K and V (OCP e4m3 or e5m2 codes with f32
//! descales), decoding on load: the codes are read as 8-byte vectors (two `u32` words, 8 codes
//! of one row) into registers, decoded to f16 when staged (every e4m3 and e5m2 value is an f16
//! value, so the stages hold the exact code values), and everything after the stage is
//! `mma.rs`'s: m16n8k16 f16 MMAs with f32 accumulation, the online softmax in registers, P
//! rounded to f16 as the A operand of P·V.
//!
//! Numerics are `fma_vec_fp8.rs`'s (and so the facade's FP8 emulation's):
//!
//! - Q·K descales: `s = (Σ q·k) · (q_descale · k_descale)`. With per-tensor and per-head
//!   descales the factor is constant over the cube's whole KV walk and is folded into the
//!   softmax scale (`exp((s − m) · scale · factor)`, the running max kept in undescaled units,
//!   `LSE = m · scale · factor + ln l`).
//! - V descale: `Σ_j (p̃_j · v_descale) · v_j` with P rounded to f16 (`p̃`). Constant over the
//!   walk (per tensor, per head), it multiplies O once in the epilogue.
//! - Per-block descales change per KV tile, and both fold into the softmax so that a tile
//!   costs per row what it costs with constant descales (one op per row, none per score or
//!   per O element). With `c_t = scale · q_descale · k_descale_t` and `a_t = ln v_descale_t`,
//!   the running max is kept in scaled units with the V descale's log added,
//!   `M = max_j (s_j · c_t + a_t)`: the factor is positive, so the tile's raw row max scaled is
//!   its scaled max. P is `p'_j = exp(s_j · c_t + a_t − M)`, the probability times its V
//!   descale, relative to the row's largest such product; rounded to f16 it accumulates
//!   straight into O. The row sum takes the undescaled `p_j = p'_j · e^-a_t` (one FMA per row),
//!   so `O = acc / l` and `LSE = M + ln l`. `p' ≤ e^5.6` under the lazy rescale (no f16
//!   overflow, whatever the descales' ratios), and a tile with a small V descale loses
//!   precision to f16's subnormals only for products below `2^-14` of the row's largest. This
//!   rounds `p · v_descale` (scaled) to f16 where the facade's emulation rounds `p` and then
//!   multiplies by `v_descale`: the same relative error, not the same bits (as with the lazy
//!   rescale's stale max). `a_t` is clamped to ±`V_LOG_LIMIT` (60), which keeps the row sums
//!   in f32's range: V descales outside `[e^-60, e^60]` act as those bounds (zero as `e^-60`).
//! - The descale blocks are the tile: `bq` query rows per Q descale, `bk` keys per K/V descale
//!   (`Fp8Tiles::descale_blocks`).
//!
//! Decoding works on pairs of codes. On CUDA where the device converts FP8 (sm_89 and later),
//! one `cvt` turns two codes into two f16 (the `cvt` comptime flag, chosen by the launcher as
//! for the row decode kernel). Elsewhere two bytes spread to the high bytes of two f16 lanes give
//! e5m2 as is (e5m2 is the upper byte of an f16), and for e4m3 sign and the 7 exponent-mantissa
//! bits placed 3 bits lower give `value · 2^-8` as an f16 bit pattern (subnormal e4m3 codes land
//! on f16 subnormals with the same mantissa), which one f16 multiply by 256 makes exact. Both
//! give the exact code values, so the two paths stage the same f16 bits.
//!
//! Non-finite codes (e4m3 `S.1111.111`; e5m2 `S.11111.xx`) are recorded as in
//! `fma_vec_fp8.rs`, and zeroed before either decode (a NaN score would leave its row's sum NaN,
//! and the poisoning below tells rows that see a key by a positive sum; a V NaN times a zero
//! probability would reach every row). The records: the Q rows that hold one, and the lowest key
//! whose K or V row holds one; every row that sees such a key, or whose own Q row holds one, is
//! written as NaN (O and LSE) after the epilogue. Rows that see no key keep `O = 0`, `LSE = lse_empty`.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;
use half::f16;

use super::fma_vec_fp8::{clear_marked, convert_pair, non_finite_bytes, Fp8Config, Fp8Shape};
use super::mma::{
    acc_zero, cube_fetch_rows, plane_load_q, plane_masked_row_max, plane_online_softmax, plane_rescale_o,
    plane_score_matmul, plane_value_matmul, write_results, MmaFwdConfig, Pair, MMA_M, MMA_N, MMA_K, PLANE, SMEM_ALIGN,
};
use super::{cube_key_ranges, is_visible, AttnShape, LAZY_RESCALE_THRESHOLD, MASK_THRESHOLD, NO_MAX};

/// Codes (and f16 stage elements) per vector: one 8-byte global load, one 16-byte stage vector.
pub(crate) const FP8_VEC: usize = 8;
/// Stage vectors: 8 f16 (16 bytes, one `ldmatrix` row).
pub(crate) type Halves = Const<8>;
/// Two f16 per 32-bit word, four words per stage vector.
type Words = Const<4>;

/// The "no bad key" value of the lowest-bad-key record.
const NO_KEY: u32 = u32::MAX;

/// `O`: element type of O. `N`: words per code vector (2, launched as such).
#[cube(
    launch_unchecked,
    fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_mma_fp8<O: Float, N: Size>(
    q: &Array<Vector<u32, N>>,
    k: &Array<Vector<u32, N>>,
    v: &Array<Vector<u32, N>>,
    q_descale: &Array<f32>,
    k_descale: &Array<f32>,
    v_descale: &Array<f32>,
    o: &mut Array<O>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    fp8: &Fp8Shape,
    #[comptime] cfg: MmaFwdConfig,
    #[comptime] fcfg: Fp8Config,
    #[comptime] cvt: bool,
) {
    let d = cfg.head_dim;
    let bq = comptime!(cfg.bq());
    let plane = UNIT_POS as usize / PLANE;
    let lane = UNIT_POS_PLANE;
    let unit = UNIT_POS as usize;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q_block = CUBE_POS_X as usize;
    let q0 = q_block * bq;
    let kv_head = head / shape.group as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let plane_q0 = q0 + plane * comptime!(cfg.mt * MMA_M);

    let q_base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize;
    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    // `bad[r]` (r < bq): Q row q0 + r holds a non-finite code; `bad[bq]`: the lowest key whose
    // K or V row holds one, NO_KEY if none.
    let mut bad = SharedMemory::<Atomic<u32>>::new(comptime!(bq + 1));
    let flags = comptime!(bq + 1);
    #[unroll]
    for step in 0..comptime!(flags.div_ceil(cfg.units())) {
        let r = step * cfg.units() + unit;
        if r < flags {
            bad[r].store(select(r == bq, NO_KEY, 0u32));
        }
    }
    sync_cube();

    let mut q_stage = SharedMemory::<Vector<f16, Halves>>::new_aligned(comptime!(cfg.q_elems() / FP8_VEC), SMEM_ALIGN);
    let mut k_stage = SharedMemory::<Vector<f16, Halves>>::new_aligned(comptime!(cfg.k_elems() / FP8_VEC), SMEM_ALIGN);
    let mut v_stage = SharedMemory::<Vector<f16, Halves>>::new_aligned(comptime!(cfg.v_elems() / FP8_VEC), SMEM_ALIGN);

    let q_regs = cube_fetch_rows(q, q_base, shape.q_s2 as usize, q0, q_len, bq, d, cfg);
    cube_store_codes(q, q_base, shape.q_s2 as usize, q0, q_len, &q_regs, &mut q_stage, &mut bad, bq, d, cfg.q_pitch(), true, cfg, fcfg, cvt);
    sync_cube();
    let q_frags = plane_load_q::<f16, Halves>(&q_stage, plane, lane, cfg);
    sync_cube();
    // SAFETY: uniform control flow, and nothing refers to the Q stage past this point.
    unsafe { q_stage.free() };

    // Descale indices: [1], [batch, heads] or [batch, heads, blocks].
    let mut q_index = 0usize;
    if comptime!(fcfg.per_block()) {
        q_index = (batch * shape.q_heads as usize + head) * fp8.q_blocks as usize + q_block;
    } else if comptime!(fcfg.per_head()) {
        q_index = batch * shape.q_heads as usize + head;
    }
    let q_ds = q_descale[q_index];
    let mut kv_index = 0usize;
    if comptime!(fcfg.per_block()) {
        kv_index = (batch * fp8.kv_heads as usize + kv_head) * fp8.k_blocks as usize;
    } else if comptime!(fcfg.per_head()) {
        kv_index = batch * fp8.kv_heads as usize + kv_head;
    }
    // Constant descales fold into the softmax scale and the epilogue; per block, `scale` is the
    // score factor without the tile's K descale, and the running max is kept in scaled units,
    // so the LSE takes it as is (see the module doc).
    let mut scale = shape.scale * q_ds;
    let mut lse_scale = 1.0f32;
    let mut o_factor = 1.0f32;
    if comptime!(!fcfg.per_block()) {
        scale = shape.scale * (q_ds * k_descale[kv_index]);
        lse_scale = scale;
        o_factor = v_descale[kv_index];
    }

    let mut o_frags = Sequence::<Array<Vector<f32, Pair>>>::new();
    #[unroll]
    for _ in 0..cfg.mt * cfg.o_tiles() {
        o_frags.push(acc_zero());
    }
    let mut s_frags = Sequence::<Array<Vector<f32, Pair>>>::new();
    #[unroll]
    for _ in 0..cfg.mt * cfg.s_tiles() {
        s_frags.push(acc_zero());
    }
    let mut stats = Array::<f32>::new(comptime!(4 * cfg.mt));
    #[unroll]
    for i in 0..2 * cfg.mt {
        stats[i] = NO_MAX;
        stats[comptime!(2 * cfg.mt + i)] = 0.0;
    }

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, bq, cfg.bk, cfg.causal);
    if num_tiles > 0 {
        let k_regs = cube_fetch_rows(k, k_base, shape.k_s2 as usize, 0, kv_len, cfg.bk, d, cfg);
        cube_store_codes(k, k_base, shape.k_s2 as usize, 0, kv_len, &k_regs, &mut k_stage, &mut bad, cfg.bk, d, cfg.k_pitch(), false, cfg, fcfg, cvt);
        sync_cube();
    }
    for tile in 0..num_full {
        kv_step_fp8(
            k, v, k_descale, v_descale, &mut k_stage, &mut v_stage, &mut bad, &q_frags, &mut s_frags, &mut o_frags,
            &mut stats, shape, scale, k_base, v_base, kv_index, tile, num_tiles, plane_q0, lane, false, cfg, fcfg, cvt,
        );
    }
    for tile in num_full..num_tiles {
        kv_step_fp8(
            k, v, k_descale, v_descale, &mut k_stage, &mut v_stage, &mut bad, &q_frags, &mut s_frags, &mut o_frags,
            &mut stats, shape, scale, k_base, v_base, kv_index, tile, num_tiles, plane_q0, lane, true, cfg, fcfg, cvt,
        );
    }

    write_results(o, lse, &o_frags, &stats, shape, lse_scale, o_factor, batch, head, plane_q0, lane, cfg);

    // Poison: the records are complete (every store and atomic precedes the walk's last
    // barrier, or the one after the Q stage), and a lane overwrites only the elements it wrote
    // above, so program order orders the two writes.
    let bad_key = bad[bq].load() as usize;
    write_poison(o, lse, &bad, &stats, shape, bad_key, fp8.nan, batch, head, q0, plane_q0, lane, cfg);
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn kv_step_fp8<N: Size>(
    k: &Array<Vector<u32, N>>,
    v: &Array<Vector<u32, N>>,
    k_descale: &Array<f32>,
    v_descale: &Array<f32>,
    k_stage: &mut SharedMemory<Vector<f16, Halves>>,
    v_stage: &mut SharedMemory<Vector<f16, Halves>>,
    bad: &mut SharedMemory<Atomic<u32>>,
    q_frags: &Sequence<Array<Vector<f16, Pair>>>,
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    stats: &mut Array<f32>,
    shape: &AttnShape,
    scale: f32,
    k_base: usize,
    v_base: usize,
    kv_index: usize,
    tile: usize,
    num_tiles: usize,
    plane_q0: usize,
    lane: u32,
    #[comptime] masked: bool,
    #[comptime] cfg: MmaFwdConfig,
    #[comptime] fcfg: Fp8Config,
    #[comptime] cvt: bool,
) {
    let d = cfg.head_dim;
    let dv = cfg.v_head_dim;
    let bk = cfg.bk;
    let kv_len = shape.kv_len as usize;
    let k0 = tile * bk;

    // Per block: the tile's descales, read before the score MMAs that hide their latency.
    let mut k_ds = 1.0f32;
    let mut v_ds = 1.0f32;
    if comptime!(fcfg.per_block()) {
        k_ds = k_descale[kv_index + tile];
        v_ds = v_descale[kv_index + tile];
    }
    let v_regs = cube_fetch_rows(v, v_base, shape.v_s2 as usize, k0, kv_len, bk, dv, cfg);

    plane_score_matmul::<f16, Halves>(q_frags, k_stage, s_frags, lane, cfg);
    if comptime!(fcfg.per_block()) {
        let v_log = max(min(f32::ln(v_ds), V_LOG_LIMIT), -V_LOG_LIMIT);
        plane_online_softmax_descaled(s_frags, o_frags, stats, shape, scale * k_ds, v_log, plane_q0, k0, lane, masked, cfg);
    } else {
        plane_online_softmax(s_frags, o_frags, stats, shape, scale, plane_q0, k0, lane, masked, cfg);
    }

    cube_store_codes(v, v_base, shape.v_s2 as usize, k0, kv_len, &v_regs, v_stage, bad, bk, dv, cfg.v_pitch(), false, cfg, fcfg, cvt);
    let next = tile + 1;
    let has_next = next < num_tiles;
    let k_len = select(has_next, kv_len, 0);
    let k_regs = cube_fetch_rows(k, k_base, shape.k_s2 as usize, next * bk, k_len, bk, d, cfg);
    // V(t) is visible, and every plane is done reading K(t).
    sync_cube();

    plane_value_matmul::<f16, Halves>(s_frags, v_stage, o_frags, lane, cfg);
    cube_store_codes(k, k_base, shape.k_s2 as usize, next * bk, k_len, &k_regs, k_stage, bad, bk, d, cfg.k_pitch(), false, cfg, fcfg, cvt);
    // K(t+1) is visible, and every plane is done reading V(t).
    sync_cube();
}

/// The 8 codes of `clean` (two words, memory order) as 8 f16 values (a non-finite code gives
/// an unspecified value, which [`cube_store_codes`] overwrites):
/// through the device's FP8 conversion (`cvt`: two codes to two f16 per instruction), or in
/// integer instructions and one f16 multiply per pair. Both give every finite code's exact
/// value (every e4m3 and e5m2 value is an f16 value).
#[cube]
pub(crate) fn decode_fp8_x8(clean: Vector<u32, Const<2>>, #[comptime] fcfg: Fp8Config, #[comptime] cvt: bool) -> Vector<f16, Halves> {
    if comptime!(cvt) {
        let mut out = Vector::<u32, Words>::empty();
        #[unroll]
        for w in 0..2usize {
            #[unroll]
            for h in 0..2usize {
                // Byte 0 of the half-word is the lower f16 lane, as memory order wants.
                let pair = convert_pair(u16::cast_from(clean[w] >> comptime!(16 * h as u32)), fcfg);
                out[comptime!(2 * w + h)] = u32::reinterpret(pair);
            }
        }
        Vector::<f16, Halves>::reinterpret(out)
    } else {
        let mut pairs = Vector::<u32, Words>::empty();
        #[unroll]
        for w in 0..2usize {
            pairs[comptime!(2 * w)] = clean[w] & 0xffffu32;
            pairs[comptime!(2 * w + 1)] = clean[w] >> 16u32;
        }
        // Each word: code b0 in bits 0..8, b1 in 8..16; to f16 lanes (b0 low, b1 high).
        let bytes = Vector::<u32, Words>::new(0xffu32);
        let spread = (pairs & bytes) | ((pairs & Vector::new(0xff00u32)) << Vector::new(8u32));
        let mut out = Vector::<f16, Halves>::reinterpret(spread << Vector::new(8u32));
        if comptime!(fcfg.mantissa_bits() == 3) {
            let bits = ((spread & Vector::new(0x0080_0080u32)) << Vector::new(8u32))
                | ((spread & Vector::new(0x007f_007fu32)) << Vector::new(7u32));
            out = Vector::<f16, Halves>::reinterpret(bits) * Vector::new(f16::from_int(256));
        }
        out
    }
}

/// Writes what [`cube_fetch_rows`] loaded (`rows` rows of `dim` codes from `row0`, in vectors
/// of 8) decoded into a stage of `pitch`-element rows (`mma::cube_store_rows`' indexing). A
/// vector with a non-finite code marks its row: Q (`is_q`) in `bad[row - row0]`, K and V in
/// the lowest bad key `bad[bq]`, and is stored with those codes as zero. `src` .. `len` are
/// the arguments `regs` was fetched with (`row0`: the tile's first Q row or key).
///
/// Where [`nonfinite_rare_path`] says so, the common path only tests for non-finite codes
/// (or-ed over the unit's vectors, about two integer ops per word) and decodes the codes as
/// they are; a unit that saw one reads its codes again and rewrites, cleared, the vectors that
/// hold one. Elsewhere each vector is cleared and tested on its own.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_store_codes<N: Size>(
    src: &Array<Vector<u32, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    regs: &Array<Vector<u32, N>>,
    stage: &mut SharedMemory<Vector<f16, Halves>>,
    bad: &mut SharedMemory<Atomic<u32>>,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] pitch: usize,
    #[comptime] is_q: bool,
    #[comptime] cfg: MmaFwdConfig,
    #[comptime] fcfg: Fp8Config,
    #[comptime] cvt: bool,
) {
    let per_row = comptime!(dim / FP8_VEC);
    let stage_row = comptime!(pitch / FP8_VEC);
    let count = comptime!(rows * dim / FP8_VEC);
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    let unit = UNIT_POS as usize;
    if comptime!(nonfinite_rare_path(cfg, fcfg)) {
        let mut any_bad = 0u32;
        #[unroll]
        for step in 0..per_unit {
            let e = step * cfg.units() + unit;
            if vector_in_tile(e, step, count, cfg) {
                let codes = regs[step];
                any_bad |= non_finite_bytes(codes[0], fcfg) | non_finite_bytes(codes[1], fcfg);
                let mut raw = Vector::<u32, Const<2>>::empty();
                raw[0] = codes[0];
                raw[1] = codes[1];
                stage[(e / per_row) * stage_row + e % per_row] = decode_fp8_x8(raw, fcfg, cvt);
            }
        }
        // The same unit rewrites what it stored above, so program order orders the two
        // stores. The codes are read again rather than kept: kept live past the decode they
        // made ptxas spill.
        if any_bad != 0u32 {
            let again = cube_fetch_rows(src, base, row_stride, row0, len, rows, dim, cfg);
            cube_store_codes_cleared(&again, stage, bad, row0, rows, dim, pitch, is_q, cfg, fcfg, cvt);
        }
    } else {
        cube_store_codes_cleared(regs, stage, bad, row0, rows, dim, pitch, is_q, cfg, fcfg, cvt);
    }
}

/// Every vector of `regs` (as [`cube_store_codes`] takes them) through [`store_codes_cleared`].
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_store_codes_cleared<N: Size>(
    regs: &Array<Vector<u32, N>>,
    stage: &mut SharedMemory<Vector<f16, Halves>>,
    bad: &mut SharedMemory<Atomic<u32>>,
    row0: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] pitch: usize,
    #[comptime] is_q: bool,
    #[comptime] cfg: MmaFwdConfig,
    #[comptime] fcfg: Fp8Config,
    #[comptime] cvt: bool,
) {
    let per_row = comptime!(dim / FP8_VEC);
    let stage_row = comptime!(pitch / FP8_VEC);
    let count = comptime!(rows * dim / FP8_VEC);
    let unit = UNIT_POS as usize;
    #[unroll]
    for step in 0..comptime!(count.div_ceil(cfg.units())) {
        let e = step * cfg.units() + unit;
        if vector_in_tile(e, step, count, cfg) {
            let row = e / per_row;
            store_codes_cleared(regs[step], stage, bad, row * stage_row + e % per_row, row, row0, is_q, cfg, fcfg, cvt);
        }
    }
}

/// Whether vector `e` (of `count`, step `step` of the units' round robin) is in the tile:
/// tested only in the last step, where `count` need not fill every unit.
#[cube]
fn vector_in_tile(e: usize, #[comptime] step: usize, #[comptime] count: usize, #[comptime] cfg: MmaFwdConfig) -> bool {
    let mut in_tile = true;
    if comptime!(step * cfg.units() + cfg.units() > count) {
        in_tile = e < count;
    }
    in_tile
}

/// One vector of 8 codes decoded into `stage[index]` with its non-finite codes as zero, and
/// recorded (`row` of the tile starting at `row0`) if it holds one.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_codes_cleared<N: Size>(
    codes: Vector<u32, N>,
    stage: &mut SharedMemory<Vector<f16, Halves>>,
    bad: &mut SharedMemory<Atomic<u32>>,
    index: usize,
    row: usize,
    row0: usize,
    #[comptime] is_q: bool,
    #[comptime] cfg: MmaFwdConfig,
    #[comptime] fcfg: Fp8Config,
    #[comptime] cvt: bool,
) {
    let nf0 = non_finite_bytes(codes[0], fcfg);
    let nf1 = non_finite_bytes(codes[1], fcfg);
    let mut clean = Vector::<u32, Const<2>>::empty();
    clean[0] = clear_marked(codes[0], nf0);
    clean[1] = clear_marked(codes[1], nf1);
    stage[index] = decode_fp8_x8(clean, fcfg, cvt);
    if (nf0 | nf1) != 0u32 {
        if is_q {
            bad[row].store(1u32);
        } else {
            bad[cfg.bq()].fetch_min((row0 + row) as u32);
        }
    }
}

/// Whether [`cube_store_codes`] takes non-finite codes on a rare path. Measured on an H200
/// (`quattn bench`, portable strategy, against the per-vector form in the same call): head
/// dim 64 with constant descales executes 7.5% fewer instructions (Nsight Compute, seq 4k
/// causal) and runs 2–8% faster (seq 4k and 16k, causal and not); at head dim 128, and with
/// per-block descales, ptxas schedules the key step worse around the rare path's branch (up
/// to 9% slower), and at head dim 32 it spills.
pub(crate) const fn nonfinite_rare_path(cfg: MmaFwdConfig, fcfg: Fp8Config) -> bool {
    let d = if cfg.head_dim > cfg.v_head_dim { cfg.head_dim } else { cfg.v_head_dim };
    d > 32 && d <= 64 && !fcfg.per_block()
}

/// Bound on `|ln v_descale|` of the per-block softmax: V descales below `e^-60` (zero
/// included) act as `e^-60`, above `e^60` as `e^60`. With the lazy rescale's headroom the row
/// sums then stay within f32 (`l ≤ n·e^(60 + 5.6)` over `n` keys, and the largest term is at
/// least `e^-60`, so terms down to `2^-40` of it are normal numbers).
const V_LOG_LIMIT: f32 = 60.0;

/// `mma::plane_online_softmax` with per-tile descales, folded so that a tile costs per row what
/// the constant-descale form costs (see the module doc): `score_scale` is the softmax scale
/// times the tile's Q and K descales, `v_log` the log of its V descale (clamped to
/// [`V_LOG_LIMIT`]). The running max `M` is kept in scaled units with the V descale's log
/// added, `max_j (s_j · score_scale + v_log)`: the factor is positive, so the tile's raw row
/// max scaled is the scaled max (one FMA per row). The probabilities written back are
/// `p'_j = exp(s_j · score_scale + v_log − M)` (P·V accumulates them straight into O, in the
/// same reference as the row sum), and the row sum takes `p_j = p'_j · e^-v_log`
/// (`exp(s_j · score_scale − M)`, undescaled), one multiply per row. Under the lazy rescale
/// `p' ≤ e^5.6`, so f16 P cannot overflow. The masked tile max and the O rescale are the f16
/// kernel's (`plane_masked_row_max`, `plane_rescale_o`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn plane_online_softmax_descaled(
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    stats: &mut Array<f32>,
    shape: &AttnShape,
    score_scale: f32,
    v_log: f32,
    plane_q0: usize,
    k0: usize,
    lane: u32,
    #[comptime] masked: bool,
    #[comptime] cfg: MmaFwdConfig,
) {
    let st = cfg.s_tiles();
    let v_inv = f32::exp(-v_log);
    let mut alpha = Array::<f32>::new(comptime!(2 * cfg.mt));
    let mut moved = false;
    #[unroll]
    for m in 0..cfg.mt {
        #[unroll]
        for h in 0..2usize {
            let tile_max = plane_masked_row_max(s_frags, shape, plane_q0, k0, lane, m, h, masked, cfg);
            // The tile's max in the running max's units; a row that sees none of the tile's
            // keys keeps NO_MAX (its scaled value could pass for a score).
            let mut scaled_max = fma(tile_max, score_scale, v_log);
            if masked {
                scaled_max = select(tile_max > MASK_THRESHOLD, scaled_max, NO_MAX);
            }
            let old_max = stats[comptime!(2 * m + h)];
            let mut new_max = max(old_max, scaled_max);
            if cfg.lazy_rescale {
                new_max = select(scaled_max - old_max > LAZY_RESCALE_THRESHOLD, scaled_max, old_max);
            }
            let bias = v_log - new_max;
            let mut tile_sum = 0.0f32;
            #[unroll]
            for j in 0..cfg.s_tiles() {
                let frag = s_frags.index_mut(comptime!(m * st + j));
                let mut x = frag[h];
                #[unroll]
                for e in 0..2usize {
                    let mut p = f32::exp(fma(x[e], score_scale, bias));
                    if masked {
                        p = select(x[e] > MASK_THRESHOLD, p, 0.0);
                    }
                    x[e] = p;
                    tile_sum += p;
                }
                frag[h] = x;
            }
            let a = f32::exp(old_max - new_max);
            alpha[comptime!(2 * m + h)] = a;
            let sum_idx = comptime!(2 * cfg.mt + 2 * m + h);
            stats[sum_idx] = fma(tile_sum, v_inv, stats[sum_idx] * a);
            stats[comptime!(2 * m + h)] = new_max;
            moved = moved || new_max != old_max;
        }
    }
    plane_rescale_o(o_frags, &alpha, moved, cfg);
}

/// Rows that saw a key and whose Q row or a visible key holds a non-finite code: O and LSE
/// NaN, written by the lanes that wrote them in `write_results`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_poison<E: Float>(
    o: &mut Array<E>,
    lse: &mut Array<f32>,
    bad: &SharedMemory<Atomic<u32>>,
    stats: &Array<f32>,
    shape: &AttnShape,
    bad_key: usize,
    nan: f32,
    batch: usize,
    head: usize,
    q0: usize,
    plane_q0: usize,
    lane: u32,
    #[comptime] cfg: MmaFwdConfig,
) {
    let def = MmaDefinition::<f32, f32, f32>::new(MMA_M, MMA_N, MMA_K);
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let o_base = batch * shape.o_s0 as usize + head * shape.o_s1 as usize;
    let o_s2 = shape.o_s2 as usize;
    #[unroll]
    for m in 0..cfg.mt {
        #[unroll]
        for h in 0..2usize {
            // A lane's partial sum is positive iff its quad's is: every lane of the quad
            // sums the same rows' probabilities, all >= 0; the reduction is repeated so that
            // the test is exactly `write_results`' (l > 0).
            let mut l = stats[comptime!(2 * cfg.mt + 2 * m + h)];
            l += plane_shuffle_xor(l, 1u32);
            l += plane_shuffle_xor(l, 2u32);
            let (r, c0) = def.position_of_nth(lane, comptime!((2 * h) as u32), MatrixIdent::Accumulator);
            let row = plane_q0 + m * MMA_M + r as usize;
            if row < q_len {
                let q_bad = bad[row - q0].load() != 0u32;
                let kv_bad = is_visible(row, bad_key, q_len, kv_len, cfg.causal);
                if l > 0.0 && (q_bad || kv_bad) {
                    if cfg.write_lse {
                        if c0 == 0 {
                            lse[(batch * shape.q_heads as usize + head) * q_len + row] = nan;
                        }
                    }
                    let row_base = o_base + row * o_s2 + c0 as usize;
                    let value = E::cast_from(nan);
                    #[unroll]
                    for n in 0..cfg.o_tiles() {
                        o[row_base + n * MMA_N] = value;
                        o[row_base + n * MMA_N + 1] = value;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod decode_tests {
    //! The pairwise decode of `decode_fp8_x8` on the host, for every code of both formats,
    //! against the formats' definition.
    use super::*;
    use quattn_core::Fp8Format;

    /// `(-1)^s · 2^(e − bias) · 1.m`, subnormal `2^(1 − bias) · 0.m`; `None` where not finite.
    fn reference(format: Fp8Format, code: u8) -> Option<f64> {
        let (e_bits, m_bits, bias) = match format {
            Fp8Format::E4M3 => (4, 3, 7),
            Fp8Format::E5M2 => (5, 2, 15),
        };
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((code & 0x7f) >> m_bits) as i32;
        let m = (code & ((1 << m_bits) - 1)) as f64 / (1 << m_bits) as f64;
        let e_max = (1 << e_bits) - 1;
        let non_finite = match format {
            Fp8Format::E4M3 => code & 0x7f == 0x7f,
            Fp8Format::E5M2 => e == e_max,
        };
        if non_finite {
            return None;
        }
        Some(if e == 0 { sign * 2f64.powi(1 - bias) * m } else { sign * 2f64.powi(e - bias) * (1.0 + m) })
    }

    /// Host twin of `decode_fp8_x8` on one word (4 codes, memory order).
    fn twin(format: Fp8Format, word: u32) -> [f64; 4] {
        let fcfg = Fp8Config { format, granularity: quattn_core::DescaleGranularity::PerTensor };
        let non_finite = ((word & fcfg.non_finite_mask()) + fcfg.non_finite_carry()) & 0x8080_8080;
        let clean = word & !((non_finite >> 7) * 0xff);
        let mut out = [0.0; 4];
        for (p, pair) in [clean & 0xffff, clean >> 16].into_iter().enumerate() {
            let spread = (pair & 0xff) | ((pair & 0xff00) << 8);
            let (bits, factor) = match format {
                Fp8Format::E5M2 => (spread << 8, 1.0f32),
                Fp8Format::E4M3 => (((spread & 0x0080_0080) << 8) | ((spread & 0x007f_007f) << 7), 256.0),
            };
            for lane in 0..2 {
                let h = half::f16::from_bits((bits >> (16 * lane)) as u16);
                // The f16 product is exact (checked: it equals the f32 one).
                let product = half::f16::from_f32(h.to_f32() * factor);
                assert_eq!(product.to_f32(), h.to_f32() * factor);
                out[2 * p + lane] = product.to_f64();
            }
        }
        out
    }

    #[test]
    fn pairwise_decode_is_exact_and_zeroes_non_finite_codes() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for code in 0..=255u8 {
                // The code in each position of a word, next to finite neighbours.
                for pos in 0..4 {
                    let word = ((code as u32) << (8 * pos)) | (0x3838_3838 & !(0xff << (8 * pos)));
                    let got = twin(format, word)[pos];
                    let want = reference(format, code).unwrap_or(0.0);
                    assert_eq!(got.to_bits(), want.to_bits(), "{format} code {code:#04x} at {pos}");
                    let neighbour = twin(format, word)[(pos + 1) % 4];
                    assert_eq!(neighbour, reference(format, 0x38).unwrap());
                }
            }
        }
    }
}

/// The FP8 mma kernel compiled for CUDA offline (no GPU), like `mma.rs`'s `cuda_tests`: every
/// tiling of [`mma_fp8_candidates`](crate::mma_fp8_candidates) at every head dim (and one
/// `dv != d`), causal, both formats, the three descale granularities (two softmax bodies:
/// per-block folds the tile's descales into it), f16 O. CubeCL's
/// allocator gives exactly what the fit check counts (`PortableKernel::smem_bytes`: the f16 mma
/// kernel's stages after the non-finite records' `bq + 1` words, 16-byte aligned), and NVRTC for sm_90a gives the f16 mma
/// kernel's HMMA count, LDSM, and no spills. By default (`Cover`) each head dim's first tiling
/// of each granularity is compiled, with the conversion where it comes first. Each variant's
/// loops (the unmasked and the masked key step) are printed with their SASS instruction counts
/// and opcode mix (`QUATTN_MMA_CUDA_DIR=<dir>` also writes the sources and the SASS there).
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib mma_fp8`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::fma_vec_fp8::Fp8ShapeCompilationArg;
    use crate::kernel::offline_cuda::{client, cuda_include_dir, nvrtc_cubin, ADDR, COMPILE_LOCK};
    use crate::problem::SUPPORTED_HEAD_DIMS;
    use crate::tiling::{mma_fp8_candidates, mma_fp8_record_bytes};
    use crate::kernel::AttnShapeCompilationArg;
    use crate::MmaTiles;
    use cubecl::cuda::CudaCompiler;
    use cubecl::wgpu::WgpuRuntime;
    use cubecl::Compiler as _;
    use quattn_core::{DescaleGranularity, Fp8Format};

    fn definition(client: &ComputeClient<WgpuRuntime>, cfg: MmaFwdConfig, fcfg: Fp8Config, cvt: bool) -> KernelDefinition {
        let array = || ArrayCompilationArg { inplace: None };
        let shape = AttnShapeCompilationArg {
            q_len: (),
            kv_len: (),
            group: (),
            q_heads: (),
            q_s0: (),
            q_s1: (),
            q_s2: (),
            k_s0: (),
            k_s1: (),
            k_s2: (),
            v_s0: (),
            v_s1: (),
            v_s2: (),
            o_s0: (),
            o_s1: (),
            o_s2: (),
            scale: (),
            lse_empty: (),
        };
        let fp8 = Fp8ShapeCompilationArg { kv_heads: (), q_blocks: (), k_blocks: (), nan: () };
        let settings = KernelSettings::default()
            .cube_dim(CubeDim::new_1d(cfg.units() as u32))
            .address_type(AddressType::U32);
        fwd_mma_fp8::FwdMmaFp8::<half::f16, WgpuRuntime>::new(
            settings,
            client.clone(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            array(),
            shape,
            fp8,
            FP8_VEC / 4,
            cfg,
            fcfg,
            cvt,
        )
        .define()
    }

    #[test]
    fn nvrtc_sm90_hmma_shared_memory_and_no_spills() {
        let skip = |why: String| {
            assert!(std::env::var_os("CI").is_none(), "CUDA tools required under CI: {why}");
            println!("SKIPPED: {why}");
        };
        let Some(include) = cuda_include_dir() else {
            return skip("no CUDA headers (cuda_fp16.h)".into());
        };
        if let Err(e) = quattn_native::nvrtc() {
            return skip(e.to_string());
        }
        if quattn_native::tools::find_any_disassembler().is_none() {
            return skip("no cuobjdump / nvdisasm".into());
        }
        let Some(client) = client() else { return };
        let mut options = <CudaCompiler as cubecl::Compiler>::CompilationOptions::default();
        options.supports_features.fast_math = true;
        options.supports_features.grid_constants = true;
        options.supports_features.clusters = true;
        options.supports_features.elect_sync = true;
        let nvrtc_options = vec![
            "--gpu-architecture=sm_90a".to_string(),
            format!("--include-path={}", include.display()),
            "--std=c++17".to_string(),
            "-Xptxas=-v".to_string(),
        ];
        let dump = std::env::var_os("QUATTN_MMA_CUDA_DIR").map(std::path::PathBuf::from);
        let mut failures = Vec::new();
        let mut dims: Vec<(usize, usize)> = SUPPORTED_HEAD_DIMS.iter().map(|&d| (d, d)).collect();
        dims.push((64, 128));
        let grans = [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock];
        let configs = dims.into_iter().flat_map(|(d, dv)| grans.into_iter().map(move |g| (d, dv, g))).flat_map(|(d, dv, g)| {
            mma_fp8_candidates(d.max(dv) as u32).iter().map(move |t| (g, MmaFwdConfig {
                head_dim: d,
                v_head_dim: dv,
                warps: t.warps as usize,
                mt: t.mt as usize,
                bk: t.bk as usize,
                vec: FP8_VEC,
                causal: true,
                write_lse: true,
                lazy_rescale: true,
            }))
        });
        let mut cover = crate::kernel::offline_cuda::Cover::new();
        for (granularity, cfg) in configs {
            // The device's FP8 conversion (what sm_89+ runs) and the integer decode, each format.
            for (format, cvt) in [(Fp8Format::E4M3, true), (Fp8Format::E5M2, true), (Fp8Format::E4M3, false), (Fp8Format::E5M2, false)] {
                if cover.take(&[&(cfg.head_dim, cfg.v_head_dim), &granularity, &(cfg.warps, cfg.mt, cfg.bk), &(format, cvt), &(cfg.head_dim, granularity)]) {
                    let fcfg = Fp8Config { format, granularity };
                    let kernel = {
                        let _serial = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                        CudaCompiler::default()
                            .compile(definition(&client, cfg, fcfg, cvt), &options, ExecutionMode::Unchecked, ADDR)
                            .unwrap()
                    };
                    let name = format!(
                        "mma_fp8_{format}_{granularity:?}_d{}v{}_w{}_mt{}_bk{}_cvt{cvt}",
                        cfg.head_dim, cfg.v_head_dim, cfg.warps, cfg.mt, cfg.bk
                    );
                    let tiles = MmaTiles { warps: cfg.warps as u32, mt: cfg.mt as u32, bk: cfg.bk as u32 };
                    let formula = tiles.smem_bytes(cfg.head_dim as u32, cfg.v_head_dim as u32, 2) as usize;
                    let records = mma_fp8_record_bytes(&tiles) as usize;
                    let declared = kernel.shared_memory_size();
                    let source = kernel.to_string();
                    if let Some(dir) = &dump {
                        std::fs::create_dir_all(dir).unwrap();
                        std::fs::write(dir.join(format!("{name}.cu")), &source).unwrap();
                    }
                    let (cubin, log) = nvrtc_cubin(&source, &nvrtc_options).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let res = quattn_native::Resources::parse_ptxas_log(&log)
                        .unwrap_or_else(|| panic!("{name}: no ptxas report in {log}"));
                    let sass = quattn_native::sass::disassemble(&cubin).unwrap();
                    if let Some(dir) = &dump {
                        std::fs::write(dir.join(format!("{name}.sass")), &sass).unwrap();
                    }
                    let hist = quattn_native::sass::opcode_histogram(&sass);
                    let count = |prefix: &str| -> usize {
                        hist.iter().filter(|(op, _)| op.starts_with(prefix)).map(|(_, n)| n).sum()
                    };
                    let hmma = count("HMMA.16816.F32");
                    let per_step = cfg.mt * (cfg.s_tiles() * cfg.qk_steps() + cfg.pv_steps() * cfg.o_tiles());
                    let ldsm = count("LDSM");
                    // The conversion is `F2FP.F16.E4M3.UNPACK_B` (or `.E5M2.`): present exactly
                    // when asked for.
                    let format_tag = match format {
                        Fp8Format::E4M3 => ".E4M3.",
                        Fp8Format::E5M2 => ".E5M2.",
                    };
                    let conversions: usize =
                        hist.iter().filter(|(op, _)| op.starts_with("F2FP") && op.contains(format_tag)).map(|(_, n)| n).sum();
                    println!(
                        "{name}: {} registers, {} B spilled, {declared} B shared ({formula} + {records}), {hmma} HMMA \
                         (expected {}), {ldsm} LDSM, {conversions} FP8 conversions",
                        res.registers,
                        res.spill_bytes(),
                        2 * per_step,
                    );
                    for l in quattn_native::sass::loops(&sass) {
                        println!("  loop {:#x}-{:#x}: {}", l.start, l.end, l.summary(14));
                    }
                    if declared != formula + records
                        || hmma != 2 * per_step
                        || ldsm == 0
                        || res.spill_bytes() != 0
                        || (conversions > 0) != cvt
                    {
                        failures.push(name);
                    }
                }
            }
        }
        assert!(failures.is_empty(), "shared memory, HMMA count, LDSM, FP8 conversions or spills wrong for: {failures:?}");
    }
}
