//! Split-KV decode for a handful of packed query rows (`group · q_len ≤ ROW_DECODE_MAX_ROWS`).
//!
//! The tile decode kernel (`decode.rs`) runs the FMA kernel's step on a query tile of at least
//! 16 rows; a GQA group at q_len 1 has 4 or 8, so most of its FMAs and accumulator registers
//! are padding, and its register count holds occupancy too low to keep enough loads in flight.
//! This kernel holds exactly the real rows and is shaped around the loads instead. A cube of
//! [`ROW_UNITS`] units owns one (split, KV head, batch), as in `decode.rs` (the same packing,
//! split, causal alignment and partial-state format, so the same [`super::decode::decode_merge`]
//! combines the splits). Per tile of `bk` keys:
//!
//! - **scores**: [`KEY_LANES`] adjacent units share one key, each taking every
//!   `KEY_LANES`-th vector of its row (so the four read one contiguous run of the row per
//!   step: coalesced), and write their partial dot products for every row to shared memory;
//!   after a barrier every unit sums the partials of one or two (row, key) pairs into the
//!   tile's scores. The barriers also order each buffer's reuse by the next tile, so one copy
//!   of each suffices.
//! - **softmax**: after a second barrier every unit turns one or two (row, key) scores into
//!   probabilities against the row's running max, which all units share (it moves only when
//!   the tile's max passes it by more than the lazy-rescale threshold), so each exponential is
//!   taken once (FP8: P rounded to f16, then times the V descale).
//! - **P·V**: after a third barrier the units form `groups` of `dv / W` lanes; each group takes `bk / groups`
//!   consecutive keys of the tile and accumulates P times V rows it reads whole per step
//!   (coalesced), lane `c` owning output vector `c`, after rescaling by the row's factor.
//! - K (and, up to 4 rows, V) of the next tile are loaded into registers while the current
//!   one is computed; above 4 rows V is loaded after the dot products (see `late_v`). On a
//!   paged cache the block-table entries of those K (and early V) loads are read a tile
//!   earlier still, so that the loads do not wait on them.
//!
//! At the end the groups' states are combined through shared memory (`O = Σ_g e^(m_g - m) O_g /
//! Σ_g e^(m_g - m) l_g`) and the first group writes O (one split) or the split's partial state.
//! Q is staged once, in f32, multiplied by the softmax scale; scores, softmax and accumulation
//! are f32.

use cubecl::prelude::*;

use super::decode::{decode_split_keys, head_param, key_row, mod_score, mod_shift, seq_kv_len, split_keys, tile_masked, DecodeArgs, DecodeMods};
use super::fma_vec::W;
use super::fma_vec_mods::{key_hi, key_lo, ModArgs};
use super::fma_vec_fp8::{convert_pair, word_has_non_finite, Fp8Config, Fp8Shape};
use super::{AttnShape, LAZY_RESCALE_THRESHOLD, MASK_THRESHOLD, NO_MAX};

/// Units per cube.
pub const ROW_UNITS: usize = 128;
/// Units sharing one key's dot products.
pub const KEY_LANES: usize = 4;
/// The "no bad key" value of the lowest-bad-key record.
pub(crate) const NO_KEY: u32 = u32::MAX;
/// Partial LSE of a split whose row must come out NaN (above any real LSE, which stays below
/// the scores' magnitude, and far from `NO_MAX`); the merge spreads it.
pub(crate) const POISON_LSE: f32 = 1.0e30;
/// Partial LSEs above this are [`POISON_LSE`].
pub(crate) const POISON_THRESHOLD: f32 = 1.0e29;
/// Most packed rows the kernel holds.
pub const ROW_DECODE_MAX_ROWS: usize = 8;

/// Compile-time key of the row decode kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowDecodeConfig {
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// Packed query rows, exactly (`group · q_len`).
    pub rows: usize,
    /// Keys per tile.
    pub bk: usize,
    pub causal: bool,
    pub write_lse: bool,
    /// K and V in a paged cache's pools, read through the block table.
    pub paged: bool,
}

impl RowDecodeConfig {
    /// Lanes of a softmax group: one per output vector.
    pub const fn lanes(&self) -> usize {
        self.v_head_dim / W
    }
    pub const fn groups(&self) -> usize {
        ROW_UNITS / self.lanes()
    }
    /// Keys per group per tile.
    pub const fn kb(&self) -> usize {
        self.bk / self.groups()
    }
    /// Keys whose dot products one pass of the cube computes.
    pub const fn keys_per_pass(&self) -> usize {
        ROW_UNITS / KEY_LANES
    }
    pub const fn passes(&self) -> usize {
        self.bk / self.keys_per_pass()
    }
    /// Vectors of a K row per unit.
    pub const fn chunk(&self) -> usize {
        self.head_dim / W / KEY_LANES
    }
    /// f32s of the partial dots `[KEY_LANES][rows][bk]`, then the scores `[rows][bk]`.
    pub const fn part_len(&self) -> usize {
        KEY_LANES * self.rows * self.bk
    }
    pub const fn score_len(&self) -> usize {
        self.rows * self.bk
    }
    /// f32s of the groups' final states: `[groups][rows][2 + dv]` (max, sum, accumulator).
    pub const fn merge_len(&self) -> usize {
        self.groups() * self.rows * (self.v_head_dim + 2)
    }
    /// Whether V is loaded after the tile's dot products rather than a tile ahead: above 4
    /// rows the dot products' accumulators and the prefetched V do not fit the registers
    /// together (ptxas spills at d 128, 8 rows, causal).
    pub const fn late_v(&self) -> bool {
        self.rows > 4
    }
    /// Offset of the row statistics after the partial dots and the scores: the running max
    /// of each row by tile parity (`2 · rows`), then each row's rescale factor (`rows`).
    pub const fn stats(&self) -> usize {
        self.part_len() + self.score_len()
    }
    /// Offset of the tile's probabilities `[rows][bk]`, then (FP8) the unrounded ones: apart
    /// from the partial dots, which the next tile writes while this one's P·V reads them.
    pub const fn probs(&self) -> usize {
        self.stats() + 3 * self.rows
    }
    pub const fn scratch_len(&self) -> usize {
        let parts = self.probs() + 2 * self.score_len();
        let merge = self.merge_len();
        if parts > merge {
            parts
        } else {
            merge
        }
    }
    /// Shared memory in bytes: Q (f32 vectors) and the scratch.
    pub const fn smem_bytes(&self) -> usize {
        4 * (self.rows * self.head_dim + self.scratch_len())
    }

    /// Why the kernel's loops do not cover this configuration, if they do not.
    pub fn invalid(&self) -> Option<String> {
        let (d, dv) = (self.head_dim, self.v_head_dim);
        if self.rows == 0 || self.rows > ROW_DECODE_MAX_ROWS {
            return Some(format!("{} rows: the row decode kernel holds 1..={ROW_DECODE_MAX_ROWS}", self.rows));
        }
        if d == 0 || !d.is_multiple_of(W * KEY_LANES) {
            return Some(format!("head dim {d} is not a multiple of {}", W * KEY_LANES));
        }
        if dv == 0 || !dv.is_multiple_of(W) || !ROW_UNITS.is_multiple_of(dv / W) {
            return Some(format!("V head dim {dv}: {ROW_UNITS} units must split into groups of dv/{W} lanes"));
        }
        if self.bk == 0 || !self.bk.is_multiple_of(self.keys_per_pass()) || !self.bk.is_multiple_of(self.groups()) {
            return Some(format!("{} keys per tile: a multiple of {} and of {} groups", self.bk, self.keys_per_pass(), self.groups()));
        }
        None
    }
}

/// One cube per (split, KV head, batch): grid `(splits, kv_heads, batch)`, [`ROW_UNITS`] units.
/// `direct`: one split, O and the LSE written in place; otherwise the partial state goes to
/// `part_o` (`[batch][kv_head][split][rows][dv]` f32) and `part_lse` (`[...][rows]`).
///
/// `mods` and `head_params` (the sinks `[q_heads]`, then the ALiBi slopes `[q_heads]`): score
/// modifiers as [`DecodeMods`] `dm` says (`cfg.causal` off: causal masking is their right
/// extent of 0), applied to each (row, key) score once its partials are summed; both `None`
/// without modifiers, which binds nothing.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_decode_rows<E: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    part_o: &mut Array<Vector<f32, N>>,
    part_lse: &mut Array<f32>,
    table: &Array<u32>,
    shape: &AttnShape,
    dec: &DecodeArgs,
    mods: &ComptimeOption<ModArgs>,
    head_params: &ComptimeOption<Array<f32>>,
    #[comptime] cfg: RowDecodeConfig,
    #[comptime] direct: bool,
    #[comptime] dm: DecodeMods,
) {
    let unit = UNIT_POS as usize;
    let split = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let q_len = shape.q_len as usize;
    let kv_len = seq_kv_len(shape, dec, table, batch, cfg.paged);
    let group = shape.group as usize;

    let rows = comptime!(cfg.rows);
    let dq = comptime!(cfg.head_dim / W);
    let lanes = comptime!(cfg.lanes());
    let kb = comptime!(cfg.kb());
    let chunk = comptime!(cfg.chunk());
    let passes = comptime!(cfg.passes());
    let per_pass = comptime!(cfg.keys_per_pass());
    let bk = comptime!(cfg.bk);

    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;
    let k_stride = shape.k_s2 as usize;
    let v_stride = shape.v_s2 as usize;

    let mut q_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.rows * cfg.head_dim / W));
    let mut scratch = SharedMemory::<f32>::new(comptime!(cfg.scratch_len()));

    // Q, scaled: row r is q head `kv_head · group + r / q_len` at position `r % q_len`.
    let q_tasks = comptime!(cfg.rows * cfg.head_dim / W);
    let q_steps = comptime!(q_tasks.div_ceil(ROW_UNITS));
    let scale = Vector::<f32, N>::new(shape.scale);
    #[unroll]
    for step in 0..q_steps {
        let t = step * ROW_UNITS + unit;
        if t < q_tasks {
            let r = t / dq;
            let c = t % dq;
            let head = kv_head * group + r / q_len;
            let pos = r % q_len;
            let index = (batch * shape.q_s0 as usize + head * shape.q_s1 as usize + pos * shape.q_s2 as usize) / W + c;
            q_stage[t] = Vector::<f32, N>::cast_from(q[index]) * scale;
        }
    }

    // Score roles: key `unit / KEY_LANES` of each pass, vectors `lane_k + i · KEY_LANES`.
    let key_in_pass = unit / KEY_LANES;
    let lane_k = unit % KEY_LANES;
    // Softmax roles: group `g` owns keys `[g · kb, (g + 1) · kb)` of a tile, lane `c` output
    // vector `c`.
    let g = unit / lanes;
    let c = unit % lanes;

    let keys = decode_split_keys(shape, dec, mods, kv_len, split, 0usize, 0usize, cfg.bk, cfg.causal, false, dm);
    let (k_begin, num_tiles) = (keys.begin, keys.tiles);

    let mut k_regs = Array::<Vector<E, N>>::new(comptime!(cfg.passes() * cfg.chunk()));
    let mut v_regs = Array::<Vector<E, N>>::new(kb);
    let mut row_max = Array::<f32>::new(rows);
    let mut row_sum = Array::<f32>::new(rows);
    let mut acc = Array::<Vector<f32, N>>::new(rows);
    init_rows::<N>(&mut row_max, &mut row_sum, &mut acc, cfg);
    let mut pages = new_page_rows(cfg);

    if num_tiles > 0 {
        init_page_rows(&mut pages, dec, table, batch, k_begin, kv_len, key_in_pass, g, cfg);
        load_k::<E, N>(k, &mut k_regs, &mut pages, dec, table, batch, k_base, k_stride, k_begin, kv_len, key_in_pass, lane_k, cfg);
        if comptime!(!cfg.late_v()) {
            load_v::<E, N>(v, &mut v_regs, &mut pages, dec, table, batch, v_base, v_stride, k_begin + g * kb, kv_len, c, cfg);
        }
    }
    if unit < rows {
        scratch[comptime!(cfg.stats()) + unit] = NO_MAX;
    }
    sync_cube();

    for tile in 0..num_tiles {
        let k0 = k_begin + tile * bk;
        let masked = tile_masked(k0, &keys, mods, bk);

        // Partial dot products of this unit's key with every row.
        #[unroll]
        for p in 0..passes {
            let mut dots = Array::<Vector<f32, N>>::new(rows);
            #[unroll]
            for i in 0..chunk {
                let kf = Vector::<f32, N>::cast_from(k_regs[p * chunk + i]);
                accumulate_dots::<N>(&mut dots, kf, &q_stage, lane_k, i, cfg);
            }
            #[comptime]
            match mods {
                // The modifiers mask the summed scores.
                ComptimeOption::Some(_) => {
                    store_dots::<N>(&dots, &mut scratch, 1.0, k0, p * per_pass + key_in_pass, lane_k, q_len, kv_len, false, cfg);
                }
                ComptimeOption::None => {
                    store_dots::<N>(&dots, &mut scratch, 1.0, k0, p * per_pass + key_in_pass, lane_k, q_len, kv_len, masked, cfg);
                }
            }
        }
        if tile + 1 < num_tiles {
            load_k::<E, N>(k, &mut k_regs, &mut pages, dec, table, batch, k_base, k_stride, k0 + bk, kv_len, key_in_pass, lane_k, cfg);
        }
        if comptime!(cfg.late_v()) {
            load_v::<E, N>(v, &mut v_regs, &mut pages, dec, table, batch, v_base, v_stride, k0 + g * kb, kv_len, c, cfg);
        }
        sync_cube();
        #[comptime]
        match mods {
            ComptimeOption::Some(m) => {
                sum_scores_mods(&mut scratch, unit, shape, m, head_params, kv_head, kv_len, k0, masked, cfg, dm);
            }
            ComptimeOption::None => {
                sum_scores(&mut scratch, unit, cfg);
            }
        }
        sync_cube();
        tile_probabilities(&mut scratch, unit, tile % 2, 1.0, false, cfg);
        sync_cube();

        rescale_rows::<N>(&scratch, &mut row_sum, &mut acc, cfg);
        #[unroll]
        for jj in 0..kb {
            let vf = Vector::<f32, N>::cast_from(v_regs[jj]);
            accumulate_key::<N>(&scratch, &mut row_sum, &mut acc, vf, g * kb + jj, false, cfg);
        }
        if comptime!(!cfg.late_v()) {
            if tile + 1 < num_tiles {
                load_v::<E, N>(v, &mut v_regs, &mut pages, dec, table, batch, v_base, v_stride, k0 + bk + g * kb, kv_len, c, cfg);
            }
        }
    }

    final_max(&scratch, &mut row_max, num_tiles, cfg);
    if comptime!(direct && dm.sinks) {
        fold_sinks::<N>(&mut row_max, &mut row_sum, &mut acc, shape, head_params, kv_head, g, cfg);
    }
    finish_rows::<E, N>(
        o, lse, part_o, part_lse, &mut scratch, &row_max, &row_sum, &acc, shape, dec, 0u32, NO_KEY, 0.0f32, cfg, direct, false,
    );
}

/// One split with sinks: each row that saw a key takes its head's sink into the denominator,
/// once (group 0's sum), every group's state rescaled to the new max, which [`finish_rows`]
/// then finds in every group.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fold_sinks<N: Size>(
    row_max: &mut Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &mut Array<Vector<f32, N>>,
    shape: &AttnShape,
    head_params: &ComptimeOption<Array<f32>>,
    kv_head: usize,
    g: usize,
    #[comptime] cfg: RowDecodeConfig,
) {
    let q_len = shape.q_len as usize;
    let group = shape.group as usize;
    #[unroll]
    for r in 0..cfg.rows {
        let m = row_max[r];
        if m > MASK_THRESHOLD {
            let sink = head_param(head_params, kv_head * group + r / q_len);
            let big = max(m, sink);
            let alpha = f32::exp(m - big);
            row_sum[r] = row_sum[r] * alpha + select(g == 0, f32::exp(sink - big), 0.0);
            acc[r] = acc[r] * Vector::new(alpha);
            row_max[r] = big;
        }
    }
}

/// [`sum_scores`] with modifiers ([`DecodeMods`]): each (row, key) score, summed from its
/// partials (Q carries the softmax scale), through [`mod_score`] with the row's position and Q
/// head.
#[cube]
#[allow(clippy::too_many_arguments)]
fn sum_scores_mods(
    scratch: &mut SharedMemory<f32>,
    unit: usize,
    shape: &AttnShape,
    mods: &ModArgs,
    head_params: &ComptimeOption<Array<f32>>,
    kv_head: usize,
    kv_len: usize,
    k0: usize,
    masked: bool,
    #[comptime] cfg: RowDecodeConfig,
    #[comptime] dm: DecodeMods,
) {
    let len = comptime!(cfg.score_len());
    let part_len = comptime!(cfg.part_len());
    let bk = comptime!(cfg.bk);
    let q_len = shape.q_len as usize;
    let group = shape.group as usize;
    let shift = mod_shift(q_len, kv_len, dm);
    #[unroll]
    for step in 0..comptime!(len.div_ceil(ROW_UNITS)) {
        let t = step * ROW_UNITS + unit;
        if comptime!(len.is_multiple_of(ROW_UNITS)) || t < len {
            let sum = (scratch[t] + scratch[t + len]) + (scratch[t + comptime!(2 * len)] + scratch[t + comptime!(3 * len)]);
            let r = t / bk;
            let a = r % q_len + shift;
            let lo = key_lo(a, q_len, kv_len, mods, dm.mc);
            let hi = key_hi(a, q_len, kv_len, mods, dm.mc);
            let mut slope = 0.0f32;
            if comptime!(dm.mc.alibi) {
                slope = head_param(head_params, shape.q_heads as usize + kv_head * group + r / q_len);
            }
            scratch[part_len + t] = mod_score(sum, k0 + t % bk, a, lo, hi, slope, q_len, mods, masked, dm.mc);
        }
    }
}

/// Every row's running max at `NO_MAX`, its sum and accumulator at zero.
#[cube]
pub(crate) fn init_rows<N: Size>(row_max: &mut Array<f32>, row_sum: &mut Array<f32>, acc: &mut Array<Vector<f32, N>>, #[comptime] cfg: RowDecodeConfig) {
    #[unroll]
    for r in 0..cfg.rows {
        row_max[r] = NO_MAX;
        row_sum[r] = 0.0;
        acc[r] = Vector::new(0.0f32);
    }
}

/// Adds vector `i` of this unit's share of a K row (`kf`, decoded) times each row's matching Q
/// vector to the rows' dot products.
#[cube]
pub(crate) fn accumulate_dots<N: Size>(
    dots: &mut Array<Vector<f32, N>>,
    kf: Vector<f32, N>,
    q_stage: &SharedMemory<Vector<f32, N>>,
    lane_k: usize,
    #[comptime] i: usize,
    #[comptime] cfg: RowDecodeConfig,
) {
    let dq = comptime!(cfg.head_dim / W);
    #[unroll]
    for r in 0..cfg.rows {
        let qv = q_stage[r * dq + lane_k + i * KEY_LANES];
        if comptime!(i == 0) {
            dots[r] = kf * qv;
        } else {
            dots[r] = fma(kf, qv, dots[r]);
        }
    }
}

/// Writes this unit's partial dots of tile key `j` (key `k0 + j`), times `factor`, to the
/// partial buffer `[lane_k][row][j]`; in a tile reaching past the keys every row sees
/// (`masked`), invisible keys get `NO_MAX` (keys past `kv_len`, and causal keys above the
/// bottom-right diagonal of the row's position `r % q_len`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_dots<N: Size>(
    dots: &Array<Vector<f32, N>>,
    scratch: &mut SharedMemory<f32>,
    factor: f32,
    k0: usize,
    j: usize,
    lane_k: usize,
    q_len: usize,
    kv_len: usize,
    masked: bool,
    #[comptime] cfg: RowDecodeConfig,
) {
    let key = k0 + j;
    #[unroll]
    for r in 0..cfg.rows {
        let a = dots[r];
        let mut dot = ((a[0] + a[1]) + (a[2] + a[3])) * factor;
        if masked {
            let mut visible = key < kv_len;
            if cfg.causal {
                visible = visible && key + q_len <= r % q_len + kv_len;
            }
            dot = select(visible, dot, NO_MAX);
        }
        scratch[(lane_k * cfg.rows + r) * cfg.bk + j] = dot;
    }
}

/// The tile's scores `[row][key]` after the partial buffer: each (row, key) summed once from
/// its [`KEY_LANES`] partials (the softmax groups would otherwise each read all of them).
/// Masked keys sum to below `MASK_THRESHOLD`.
#[cube]
pub(crate) fn sum_scores(scratch: &mut SharedMemory<f32>, unit: usize, #[comptime] cfg: RowDecodeConfig) {
    let len = comptime!(cfg.score_len());
    let part_len = comptime!(cfg.part_len());
    #[unroll]
    for step in 0..comptime!(len.div_ceil(ROW_UNITS)) {
        let t = step * ROW_UNITS + unit;
        if comptime!(len.is_multiple_of(ROW_UNITS)) || t < len {
            scratch[part_len + t] = (scratch[t] + scratch[t + len]) + (scratch[t + comptime!(2 * len)] + scratch[t + comptime!(3 * len)]);
        }
    }
}

/// The tile's probabilities, once per (row, key), after [`sum_scores`]: the row's running max
/// (shared by every softmax group, kept by tile parity: read from `parity`, written to the
/// other) moves only when the tile's max passes it by more than the lazy-rescale threshold, so
/// P stays below e^threshold and the sums stay exact in f32; P = e^(s - max) goes to `[row][key]`
/// (masked scores, and every score of a row that has seen no
/// visible key, weigh 0) at [`RowDecodeConfig::probs`], and each row's rescale factor e^(old -
/// new) to the statistics. With `p_f16` the P entering P·V is rounded to f16 and multiplied
/// by `pv_factor` (a V descale), and the unrounded P, which the row sums take, follows.
#[cube]
pub(crate) fn tile_probabilities(
    scratch: &mut SharedMemory<f32>,
    unit: usize,
    parity: usize,
    pv_factor: f32,
    #[comptime] p_f16: bool,
    #[comptime] cfg: RowDecodeConfig,
) {
    let len = comptime!(cfg.score_len());
    let score = comptime!(cfg.part_len());
    let stats = comptime!(cfg.stats());
    let rows = comptime!(cfg.rows);
    let bk = comptime!(cfg.bk);
    #[unroll]
    for step in 0..comptime!(len.div_ceil(ROW_UNITS)) {
        let t = step * ROW_UNITS + unit;
        if comptime!(len.is_multiple_of(ROW_UNITS)) || t < len {
            let r = t / bk;
            let old = scratch[stats + parity * rows + r];
            let mut tile_max = NO_MAX.runtime();
            #[unroll]
            for jj in 0..bk {
                tile_max = max(tile_max, scratch[score + r * bk + jj]);
            }
            let m = select(tile_max > old + LAZY_RESCALE_THRESHOLD, tile_max, old);
            let s = scratch[score + t];
            let p = select(s > MASK_THRESHOLD, f32::exp(s - m), 0.0);
            let probs = comptime!(cfg.probs());
            if comptime!(p_f16) {
                scratch[probs + len + t] = p;
                scratch[probs + t] = f32::cast_from(half::f16::cast_from(p)) * pv_factor;
            } else {
                scratch[probs + t] = p;
            }
            if t % bk == 0 {
                scratch[stats + (1 - parity) * rows + r] = m;
                // A row that has seen no key has NO_MAX: its first visible score rescales by
                // e^(NO_MAX - s) = 0, its zeros.
                scratch[stats + 2 * rows + r] = f32::exp(old - m);
            }
        }
    }
}

/// Applies each row's rescale factor of the tile to the unit's sums and accumulators.
#[cube]
pub(crate) fn rescale_rows<N: Size>(
    scratch: &SharedMemory<f32>,
    row_sum: &mut Array<f32>,
    acc: &mut Array<Vector<f32, N>>,
    #[comptime] cfg: RowDecodeConfig,
) {
    #[unroll]
    for r in 0..cfg.rows {
        let alpha = scratch[comptime!(cfg.stats() + 2 * cfg.rows) + r];
        row_sum[r] *= alpha;
        acc[r] = acc[r] * Vector::new(alpha);
    }
}

/// Tile key `j` of every row into the unit's sums and accumulators: P from
/// [`tile_probabilities`] times the key's V vector `vf`.
#[cube]
pub(crate) fn accumulate_key<N: Size>(
    scratch: &SharedMemory<f32>,
    row_sum: &mut Array<f32>,
    acc: &mut Array<Vector<f32, N>>,
    vf: Vector<f32, N>,
    j: usize,
    #[comptime] p_f16: bool,
    #[comptime] cfg: RowDecodeConfig,
) {
    #[unroll]
    for r in 0..cfg.rows {
        let at = comptime!(cfg.probs() + r * cfg.bk) + j;
        acc[r] = fma(vf, Vector::new(scratch[at]), acc[r]);
        if comptime!(p_f16) {
            row_sum[r] += scratch[comptime!(cfg.score_len()) + at];
        } else {
            row_sum[r] += scratch[at];
        }
    }
}

/// Every row's running max after `num_tiles` tiles (`NO_MAX` for none), read before
/// [`finish_rows`] reuses the scratch.
#[cube]
pub(crate) fn final_max(scratch: &SharedMemory<f32>, row_max: &mut Array<f32>, num_tiles: usize, #[comptime] cfg: RowDecodeConfig) {
    let parity = num_tiles % 2;
    #[unroll]
    for r in 0..cfg.rows {
        row_max[r] = scratch[comptime!(cfg.stats()) + parity * cfg.rows + r];
    }
}

/// Combines the softmax groups' states through shared memory (`[g][r]`: max, sum, then the
/// accumulator) and writes O and the LSE (`direct`) or the split's partial state. With
/// `poison` (FP8 codes), a row that saw a key and whose Q row holds a non-finite code (bit `r`
/// of `q_bad`) or that sees `bad_key` (a key whose K or V row holds one; `NO_KEY` if none) is
/// written as `nan`, or its partial state as [`POISON_LSE`] for the merge to spread.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_rows<E: Float, N: Size>(
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    part_o: &mut Array<Vector<f32, N>>,
    part_lse: &mut Array<f32>,
    scratch: &mut SharedMemory<f32>,
    row_max: &Array<f32>,
    row_sum: &Array<f32>,
    acc: &Array<Vector<f32, N>>,
    shape: &AttnShape,
    dec: &DecodeArgs,
    q_bad: u32,
    bad_key: u32,
    nan: f32,
    #[comptime] cfg: RowDecodeConfig,
    #[comptime] direct: bool,
    #[comptime] poison: bool,
) {
    let unit = UNIT_POS as usize;
    let split = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let group = shape.group as usize;
    let rows = comptime!(cfg.rows);
    let lanes = comptime!(cfg.lanes());
    let g = unit / lanes;
    let c = unit % lanes;

    sync_cube();
    let pitch = comptime!(cfg.v_head_dim + 2);
    #[unroll]
    for r in 0..rows {
        let at = (g * rows + r) * pitch;
        if c == 0 {
            scratch[at] = row_max[r];
            scratch[at + 1] = row_sum[r];
        }
        #[unroll]
        for e in 0..W {
            scratch[at + 2 + c * W + e] = acc[r][e];
        }
    }
    sync_cube();

    if g == 0 {
        let groups = comptime!(cfg.groups());
        let kv_heads = shape.q_heads as usize / group;
        #[unroll]
        for r in 0..rows {
            let mut m = NO_MAX.runtime();
            #[unroll]
            for gg in 0..groups {
                m = max(m, scratch[(gg * rows + r) * pitch]);
            }
            let mut total = 0.0f32;
            let mut out = Vector::<f32, N>::new(0.0f32);
            #[unroll]
            for gg in 0..groups {
                let at = (gg * rows + r) * pitch;
                let mg = scratch[at];
                let w = select(mg > MASK_THRESHOLD, f32::exp(mg - m), 0.0);
                total += w * scratch[at + 1];
                let mut part = Vector::<f32, N>::empty();
                #[unroll]
                for e in 0..W {
                    part[e] = scratch[at + 2 + c * W + e];
                }
                out = fma(part, Vector::new(w), out);
            }
            let seen = total > 0.0;
            let inv = Vector::<f32, N>::new(select(seen, 1.0 / total, 0.0));
            let state_lse = m + f32::ln(select(seen, total, 1.0));
            let pos = r % q_len;
            let mut poisoned = false;
            if comptime!(poison) {
                let mut kv_bad = (bad_key as usize) < kv_len;
                if cfg.causal {
                    kv_bad = kv_bad && bad_key as usize + q_len <= pos + kv_len;
                }
                poisoned = seen && (((q_bad >> comptime!(r as u32)) & 1u32) != 0u32 || kv_bad);
            }
            if direct {
                let head = kv_head * group + r / q_len;
                let o_row = (batch * shape.o_s0 as usize + head * shape.o_s1 as usize + pos * shape.o_s2 as usize) / W;
                let mut value = out * inv;
                let mut row_lse = select(seen, state_lse, shape.lse_empty);
                if poisoned {
                    value = Vector::new(nan);
                    row_lse = nan;
                }
                o[o_row + c] = Vector::cast_from(value);
                if cfg.write_lse {
                    if c == 0 {
                        lse[(batch * shape.q_heads as usize + head) * q_len + pos] = row_lse;
                    }
                }
            } else {
                let state = ((batch * kv_heads + kv_head) * dec.splits as usize + split) * rows + r;
                part_o[state * lanes + c] = out * inv;
                if c == 0 {
                    part_lse[state] = select(poisoned, POISON_LSE, select(seen, state_lse, NO_MAX));
                }
            }
        }
    }
}

/// The Q descale blocks of the FP8 row kernel with `DescaleGranularity::PerBlock`: its rows are
/// at most 8 positions of a head, so one block per (batch, head) covers them.
pub const ROW_FP8_Q_BLOCK: usize = 64;

/// [`fwd_portable_decode_rows`] on FP8 codes (OCP e4m3 or e5m2, 4 per `u32` word: one vector)
/// with f32 descales, mirroring the FP8 FMA kernel's numerics (`fma_vec_fp8.rs`): codes
/// decoded bit-exactly, `s = (Σ q·k) · q_descale · k_descale` (the Q descale and the softmax
/// scale folded into the staged Q, the K descale applied per tile), P rounded to f16 for P·V
/// and then times the tile's V descale, the row sums on the unrounded P. Per-block descales
/// follow [`ROW_FP8_Q_BLOCK`] query rows and the kernel's `bk` keys (a split is whole tiles).
/// Non-finite codes are recorded as they are decoded (Q rows as a bit mask, the lowest such key of
/// the split's K or V rows); rows that see them come out NaN ([`finish_rows`]).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_decode_rows_fp8<E: Float, N: Size>(
    q: &Array<u32>,
    k: &Array<u32>,
    v: &Array<u32>,
    q_descale: &Array<f32>,
    k_descale: &Array<f32>,
    v_descale: &Array<f32>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    part_o: &mut Array<Vector<f32, N>>,
    part_lse: &mut Array<f32>,
    shape: &AttnShape,
    dec: &DecodeArgs,
    fp8: &Fp8Shape,
    #[comptime] cfg: RowDecodeConfig,
    #[comptime] fcfg: Fp8Config,
    #[comptime] cvt: bool,
    #[comptime] direct: bool,
) {
    let unit = UNIT_POS as usize;
    let split = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let group = shape.group as usize;

    let rows = comptime!(cfg.rows);
    let dq = comptime!(cfg.head_dim / W);
    let lanes = comptime!(cfg.lanes());
    let kb = comptime!(cfg.kb());
    let chunk = comptime!(cfg.chunk());
    let passes = comptime!(cfg.passes());
    let per_pass = comptime!(cfg.keys_per_pass());
    let bk = comptime!(cfg.bk);

    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;
    let k_stride = shape.k_s2 as usize;
    let v_stride = shape.v_s2 as usize;

    let mut q_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.rows * cfg.head_dim / W));
    let mut scratch = SharedMemory::<f32>::new(comptime!(cfg.scratch_len()));
    // `[0]`: bit r set when Q row r holds a non-finite code; `[1]`: the lowest such key of K or
    // V in this split.
    let bad = SharedMemory::<Atomic<u32>>::new(2usize);
    if unit == 0 {
        bad[0].store(0u32);
        bad[1].store(NO_KEY);
    }
    sync_cube();

    // Q decoded, times its descale and the softmax scale.
    let q_tasks = comptime!(cfg.rows * cfg.head_dim / W);
    #[unroll]
    for step in 0..comptime!(q_tasks.div_ceil(ROW_UNITS)) {
        let t = step * ROW_UNITS + unit;
        if t < q_tasks {
            let r = t / dq;
            let c = t % dq;
            let head = kv_head * group + r / q_len;
            let pos = r % q_len;
            let word = q[(batch * shape.q_s0 as usize + head * shape.q_s1 as usize + pos * shape.q_s2 as usize) / W + c];
            if word_has_non_finite(word, fcfg) {
                bad[0].fetch_or(1u32 << r as u32);
            }
            let mut q_index = 0usize;
            if comptime!(fcfg.per_block()) {
                q_index = (batch * shape.q_heads as usize + head) * fp8.q_blocks as usize + pos / ROW_FP8_Q_BLOCK;
            } else if comptime!(fcfg.per_head()) {
                q_index = batch * shape.q_heads as usize + head;
            }
            q_stage[t] = decode_word::<N>(word, fcfg) * Vector::new(q_descale[q_index] * shape.scale);
        }
    }

    let key_in_pass = unit / KEY_LANES;
    let lane_k = unit % KEY_LANES;
    let g = unit / lanes;
    let c = unit % lanes;

    let keys = split_keys(shape, dec, kv_len, split, cfg.bk, cfg.causal);
    let (k_begin, num_tiles, full_keys) = (keys.begin, keys.tiles, keys.full);
    let mut kv_index = 0usize;
    if comptime!(fcfg.per_block()) {
        kv_index = (batch * fp8.kv_heads as usize + kv_head) * fp8.k_blocks as usize;
    } else if comptime!(fcfg.per_head()) {
        kv_index = batch * fp8.kv_heads as usize + kv_head;
    }

    let mut k_regs = Array::<u32>::new(comptime!(cfg.passes() * cfg.chunk()));
    let mut v_regs = Array::<u32>::new(kb);
    let mut row_max = Array::<f32>::new(rows);
    let mut row_sum = Array::<f32>::new(rows);
    let mut acc = Array::<Vector<f32, N>>::new(rows);
    init_rows::<N>(&mut row_max, &mut row_sum, &mut acc, cfg);
    let mut bad_key = NO_KEY.runtime();

    if num_tiles > 0 {
        load_k_words(k, &mut k_regs, k_base, k_stride, k_begin, kv_len, key_in_pass, lane_k, cfg);
        if comptime!(!cfg.late_v()) {
            load_v_words(v, &mut v_regs, v_base, v_stride, k_begin + g * kb, kv_len, c, cfg);
        }
    }
    if unit < rows {
        scratch[comptime!(cfg.stats()) + unit] = NO_MAX;
    }
    sync_cube();

    for tile in 0..num_tiles {
        let k0 = k_begin + tile * bk;
        let masked = k0 + bk > full_keys;
        let mut ds_index = kv_index;
        if comptime!(fcfg.per_block()) {
            ds_index += k0 / bk;
        }

        #[unroll]
        for p in 0..passes {
            let j = p * per_pass + key_in_pass;
            let mut dots = Array::<Vector<f32, N>>::new(rows);
            #[unroll]
            for i in 0..chunk {
                let word = k_regs[p * chunk + i];
                if word_has_non_finite(word, fcfg) {
                    bad_key = min(bad_key, (k0 + j) as u32);
                }
                accumulate_dots::<N>(&mut dots, decode_codes::<N>(word, fcfg, cvt, false), &q_stage, lane_k, i, cfg);
            }
            store_dots::<N>(&dots, &mut scratch, k_descale[ds_index], k0, j, lane_k, q_len, kv_len, masked, cfg);
        }
        if tile + 1 < num_tiles {
            load_k_words(k, &mut k_regs, k_base, k_stride, k0 + bk, kv_len, key_in_pass, lane_k, cfg);
        }
        if comptime!(cfg.late_v()) {
            load_v_words(v, &mut v_regs, v_base, v_stride, k0 + g * kb, kv_len, c, cfg);
        }
        sync_cube();
        sum_scores(&mut scratch, unit, cfg);
        sync_cube();
        tile_probabilities(&mut scratch, unit, tile % 2, v_descale[ds_index], true, cfg);
        sync_cube();

        rescale_rows::<N>(&scratch, &mut row_sum, &mut acc, cfg);
        #[unroll]
        for jj in 0..kb {
            let word = v_regs[jj];
            if word_has_non_finite(word, fcfg) {
                bad_key = min(bad_key, (k0 + g * kb + jj) as u32);
            }
            let vf = decode_codes::<N>(word, fcfg, cvt, true);
            accumulate_key::<N>(&scratch, &mut row_sum, &mut acc, vf, g * kb + jj, true, cfg);
        }
        if comptime!(!cfg.late_v()) {
            if tile + 1 < num_tiles {
                load_v_words(v, &mut v_regs, v_base, v_stride, k0 + bk + g * kb, kv_len, c, cfg);
            }
        }
    }

    final_max(&scratch, &mut row_max, num_tiles, cfg);
    // Keys past kv_len load as zero words: never bad.
    if bad_key != NO_KEY {
        bad[1].fetch_min(bad_key);
    }
    // finish_rows' first barrier orders the records before they are read.
    sync_cube();
    let q_bad = bad[0].load();
    let lowest = bad[1].load();
    finish_rows::<E, N>(
        o, lse, part_o, part_lse, &mut scratch, &row_max, &row_sum, &acc, shape, dec, q_bad, lowest, fp8.nan, cfg, direct, true,
    );
}

/// The 4 codes of `word` as f32: through the device's FP8 conversion (`cvt`), or in integer and
/// float instructions ([`decode_word`]). Both give every finite code's exact value.
///
/// The conversion gives non-finite codes their NaN or infinity. In K that reaches only the
/// scores of the rows that see them (masked scores are selected away), which the kernel writes
/// as NaN anyway; but a V row's NaN or infinity times a zero probability (a key a row does not
/// see) would reach every row, so with `finite` (V) the converted values are clamped to ±65504,
/// the finite f16 range (`max` and `min` return the other operand for a NaN): every code value
/// lies inside it. [`decode_word`] gives non-finite codes finite values already.
#[cube]
fn decode_codes<N: Size>(word: u32, #[comptime] fcfg: Fp8Config, #[comptime] cvt: bool, #[comptime] finite: bool) -> Vector<f32, N> {
    if comptime!(cvt) {
        // Each half-word converted on its own: a 4-code vector would be taken apart into
        // bytes and put together again around the two conversions.
        let a = convert_pair(u16::cast_from(word), fcfg);
        let b = convert_pair(u16::cast_from(word >> 16u32), fcfg);
        let mut out = Vector::<f32, N>::empty();
        out[0] = f32::cast_from(a[0]);
        out[1] = f32::cast_from(a[1]);
        out[2] = f32::cast_from(b[0]);
        out[3] = f32::cast_from(b[1]);
        if comptime!(finite) {
            out = max(out, Vector::new(-65504.0f32));
            // e4m3 has no infinities: its NaN is taken care of by `max`.
            if comptime!(fcfg.mantissa_bits() == 2) {
                out = min(out, Vector::new(65504.0f32));
            }
        }
        out
    } else {
        decode_word::<N>(word, fcfg)
    }
}

/// The 4 codes of `word` decoded to f32, bit-exact for every finite code, in integer and
/// float instructions only: the magnitude's exponent and mantissa placed in an f32 with the
/// exponent rebiased, which for a subnormal code (exponent field 0) reads as `2^(1-bias) ·
/// (1 + m/2^mbits) / 2`, so that twice it less `2^(1-bias)` is its exact value `2^(1-bias) ·
/// m/2^mbits`; then the sign bit. The subnormal path takes no integer-to-float conversion (a
/// quarter-rate instruction, in a loop bound by instructions), and non-finite codes are not
/// zeroed: they decode to finite values, which only the rows that see them weigh, and the
/// kernel writes those rows as NaN.
#[cube]
fn decode_word<N: Size>(word: u32, #[comptime] fcfg: Fp8Config) -> Vector<f32, N> {
    let min_normal = comptime!(fcfg.subnormal_step() * (1u32 << fcfg.mantissa_bits()) as f32);
    let mut value = Vector::<f32, N>::empty();
    #[unroll]
    for x in 0..W {
        let byte = word >> comptime!((8 * x) as u32);
        let magnitude = byte & 0x7fu32;
        let sign = (byte & 0x80u32) << 24u32;
        let normal = f32::reinterpret((magnitude << comptime!(23 - fcfg.mantissa_bits())) + comptime!(fcfg.bias_adjust() << 23));
        let unsigned = select(magnitude < comptime!(1u32 << fcfg.mantissa_bits()), normal * 2.0 - min_normal, normal);
        value[x] = f32::reinterpret(u32::reinterpret(unsigned) | sign);
    }
    value
}

/// [`load_k`] on code words.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_k_words(
    k: &Array<u32>,
    regs: &mut Array<u32>,
    k_base: usize,
    k_stride: usize,
    k0: usize,
    kv_len: usize,
    key_in_pass: usize,
    lane_k: usize,
    #[comptime] cfg: RowDecodeConfig,
) {
    let chunk = comptime!(cfg.chunk());
    #[unroll]
    for p in 0..comptime!(cfg.passes()) {
        let key = k0 + p * comptime!(cfg.keys_per_pass()) + key_in_pass;
        let row = (k_base + key * k_stride) / W + lane_k;
        #[unroll]
        for i in 0..chunk {
            let mut word = 0u32;
            if key < kv_len {
                word = k[row + i * KEY_LANES];
            }
            regs[p * chunk + i] = word;
        }
    }
}

/// [`load_v`] on code words.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_v_words(
    v: &Array<u32>,
    regs: &mut Array<u32>,
    v_base: usize,
    v_stride: usize,
    first: usize,
    kv_len: usize,
    c: usize,
    #[comptime] cfg: RowDecodeConfig,
) {
    #[unroll]
    for jj in 0..comptime!(cfg.kb()) {
        let key = first + jj;
        let mut word = 0u32;
        if key < kv_len {
            word = v[(v_base + key * v_stride) / W + c];
        }
        regs[jj] = word;
    }
}

/// Paged caches: the pool rows of the keys the next [`load_k`] (entry `p` for pass `p`) and
/// [`load_v`] (entry `passes`, the group's first key) of this unit read. Each load reads its
/// rows from here and puts those of the keys `bk` further on in their place, so a block-table
/// entry is read a tile before the K/V loads that need it rather than just before them (with
/// small pages every tile would otherwise wait on a table read before its loads). With
/// `late_v` the V entry stays unused and [`load_v`] reads its table entry itself: held across
/// the tile, it makes ptxas spill at 8 rows (d 128, causal, one split). `None` without a paged
/// cache: the key is its own row.
#[cube]
fn new_page_rows(#[comptime] cfg: RowDecodeConfig) -> ComptimeOption<Array<u32>> {
    if comptime!(cfg.paged) {
        ComptimeOption::new_Some(Array::<u32>::new(comptime!(cfg.passes() + 1)))
    } else {
        ComptimeOption::new_None()
    }
}

/// The pool row of `key` (0 past `kv_len`: no load reads it, and its table entry may lie past
/// the sequence's row of the table).
#[cube]
fn page_row(dec: &DecodeArgs, table: &Array<u32>, batch: usize, key: usize, kv_len: usize) -> u32 {
    let mut row = 0u32;
    if key < kv_len {
        row = key_row(dec, table, batch, key, true) as u32;
    }
    row
}

/// Fills `pages` ([`new_page_rows`]) for the first [`load_k`] and [`load_v`] (group `g`'s keys)
/// of the tile at `k0`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn init_page_rows(
    pages: &mut ComptimeOption<Array<u32>>,
    dec: &DecodeArgs,
    table: &Array<u32>,
    batch: usize,
    k0: usize,
    kv_len: usize,
    key_in_pass: usize,
    g: usize,
    #[comptime] cfg: RowDecodeConfig,
) {
    #[comptime]
    match pages {
        ComptimeOption::Some(rows) => {
            #[unroll]
            for p in 0..comptime!(cfg.passes()) {
                rows[p] = page_row(dec, table, batch, k0 + p * comptime!(cfg.keys_per_pass()) + key_in_pass, kv_len);
            }
            if comptime!(!cfg.late_v()) {
                rows[comptime!(cfg.passes())] = page_row(dec, table, batch, k0 + g * comptime!(cfg.kb()), kv_len);
            }
        }
        ComptimeOption::None => {}
    }
}

/// This unit's vectors of its key in every pass of the tile at `k0` (zeros past `kv_len`);
/// paged, from the rows in `pages`, then those of the tile at `k0 + bk` into their place.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_k<E: Float, N: Size>(
    k: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    pages: &mut ComptimeOption<Array<u32>>,
    dec: &DecodeArgs,
    table: &Array<u32>,
    batch: usize,
    k_base: usize,
    k_stride: usize,
    k0: usize,
    kv_len: usize,
    key_in_pass: usize,
    lane_k: usize,
    #[comptime] cfg: RowDecodeConfig,
) {
    let chunk = comptime!(cfg.chunk());
    #[unroll]
    for p in 0..comptime!(cfg.passes()) {
        let key = k0 + p * comptime!(cfg.keys_per_pass()) + key_in_pass;
        if key < kv_len {
            let row = (k_base + stored_row(pages, key, p) * k_stride) / W + lane_k;
            #[unroll]
            for i in 0..chunk {
                regs[p * chunk + i] = k[row + i * KEY_LANES];
            }
        } else {
            #[unroll]
            for i in 0..chunk {
                regs[p * chunk + i] = Vector::new(E::from_int(0));
            }
        }
    }
    #[comptime]
    match pages {
        ComptimeOption::Some(rows) => {
            #[unroll]
            for p in 0..comptime!(cfg.passes()) {
                let key = k0 + comptime!(cfg.bk + p * cfg.keys_per_pass()) + key_in_pass;
                rows[p] = page_row(dec, table, batch, key, kv_len);
            }
        }
        ComptimeOption::None => {}
    }
}

/// The row of `key`: entry `at` of `pages` where paged, else the key.
#[cube]
fn stored_row(pages: &ComptimeOption<Array<u32>>, key: usize, #[comptime] at: usize) -> usize {
    #[comptime]
    match pages {
        ComptimeOption::Some(rows) => rows[at] as usize,
        ComptimeOption::None => key,
    }
}

/// Vector `c` of the `kb` V rows from `first` (zeros past `kv_len`); paged, from the row in
/// `pages`, then that of the group's keys in the next tile (`first + bk`) into its place (with
/// `late_v`, from the table).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_v<E: Float, N: Size>(
    v: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    pages: &mut ComptimeOption<Array<u32>>,
    dec: &DecodeArgs,
    table: &Array<u32>,
    batch: usize,
    v_base: usize,
    v_stride: usize,
    first: usize,
    kv_len: usize,
    c: usize,
    #[comptime] cfg: RowDecodeConfig,
) {
    // The group's `kb` keys start at a multiple of `kb`, which divides the page size (checked at
    // launch): one page holds them all, so one table entry gives their rows.
    let mut first_row = first;
    #[comptime]
    match pages {
        ComptimeOption::Some(rows) => {
            if comptime!(cfg.late_v()) {
                first_row = page_row(dec, table, batch, first, kv_len) as usize;
            } else {
                first_row = rows[comptime!(cfg.passes())] as usize;
            }
        }
        ComptimeOption::None => {}
    }
    #[unroll]
    for jj in 0..comptime!(cfg.kb()) {
        let key = first + jj;
        let mut value = Vector::<E, N>::new(E::from_int(0));
        if key < kv_len {
            value = v[(v_base + (first_row + jj) * v_stride) / W + c];
        }
        regs[jj] = value;
    }
    if comptime!(!cfg.late_v()) {
        #[comptime]
        match pages {
            ComptimeOption::Some(rows) => {
                rows[comptime!(cfg.passes())] = page_row(dec, table, batch, first + comptime!(cfg.bk), kv_len);
            }
            ComptimeOption::None => {}
        }
    }
}

/// The CUDA C++ CubeCL generates for the row decode kernel, compiled offline by NVRTC for
/// sm_90a (no GPU): each head-dim layout of its groups, one split and several, causal and not,
/// float inputs and FP8 codes; the source declares the shared memory
/// [`RowDecodeConfig::smem_bytes`] counts (FP8: two u32 records more, in whole 16-byte blocks),
/// and ptxas spills nothing.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib decode_rows`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::decode::DecodeArgsCompilationArg;
    use crate::kernel::fma_vec_fp8::Fp8ShapeCompilationArg;
    use crate::kernel::fma_vec_mods::{ModArgsCompilationArg, ModsConfig};
    use crate::kernel::offline_cuda::{array, attn_shape_arg, settings, Arch, OfflineCuda, Variant};
    use cubecl::wgpu::WgpuRuntime;
    use quattn_core::{DescaleGranularity, Fp8Format};

    fn dec() -> DecodeArgsCompilationArg {
        DecodeArgsCompilationArg { rows: (), splits: (), keys_per_split: (), nan: (), page_shift: (), max_pages: (), lens_at: (), num_pages: () }
    }

    fn definition<E: Float + CubeElement>(client: &ComputeClient<WgpuRuntime>, cfg: RowDecodeConfig, direct: bool, dm: Option<DecodeMods>) -> KernelDefinition {
        let mods = match dm {
            Some(_) => ComptimeOptionCompilationArg::Some(ModArgsCompilationArg { row_shift: (), left: (), right: (), scale: (), softcap: () }),
            None => ComptimeOptionCompilationArg::None,
        };
        let params = if dm.is_some() { ComptimeOptionCompilationArg::Some(array()) } else { ComptimeOptionCompilationArg::None };
        fwd_portable_decode_rows::FwdPortableDecodeRows::<E, WgpuRuntime>::new(
            settings(ROW_UNITS),
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
            dec(),
            mods,
            params,
            W,
            cfg,
            direct,
            dm.unwrap_or_default(),
        )
        .define()
    }

    fn definition_fp8<E: Float + CubeElement>(
        client: &ComputeClient<WgpuRuntime>,
        cfg: RowDecodeConfig,
        fcfg: Fp8Config,
        cvt: bool,
        direct: bool,
    ) -> KernelDefinition {
        fwd_portable_decode_rows_fp8::FwdPortableDecodeRowsFp8::<E, WgpuRuntime>::new(
            settings(ROW_UNITS),
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
            attn_shape_arg(),
            dec(),
            Fp8ShapeCompilationArg { kv_heads: (), q_blocks: (), k_blocks: (), nan: () },
            W,
            cfg,
            fcfg,
            cvt,
            direct,
        )
        .define()
    }

    #[test]
    fn nvrtc_sm90_compiles_the_row_decode_kernel_with_its_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let mut variants = Vec::new();
        // (head dim, rows, element type): the decode shapes (GQA 4 and 8 at d 128), d 64's
        // eight groups, d 256's two, one row.
        // The decode shapes again on a paged cache (a table entry per key row).
        let cases = [
            (128usize, 4usize, "f16", false),
            (128, 8, "bf16", false),
            (64, 8, "f16", false),
            (256, 4, "f32", false),
            (128, 1, "f16", false),
            (128, 4, "f16", true),
            (128, 8, "bf16", true),
        ];
        // Every modifier (causal masking as the right extent, so `causal` off), sinks: the decode
        // shapes, paged, with one split (the sinks in the epilogue) and several.
        let all = DecodeMods { mc: ModsConfig { left: true, right: true, softcap: true, alibi: true }, top_left: false, sinks: true };
        let mod_cases = [(128usize, 4usize, "f16", true), (128, 8, "bf16", true)];
        let plain = cases.iter().flat_map(|&c| [(c, false, false, None), (c, true, true, None)]);
        let modded = mod_cases.iter().flat_map(|&c| [(c, false, false, Some(all)), (c, false, true, Some(all))]);
        for ((d, rows, dtype, paged), causal, direct, dm) in plain.chain(modded) {
            {
                let cfg = RowDecodeConfig { head_dim: d, v_head_dim: d, rows, bk: 32, causal, write_lse: true, paged };
                assert_eq!(cfg.invalid(), None, "{cfg:?}");
                let definition = match dtype {
                    "f16" => definition::<half::f16>(cuda.client(), cfg, direct, dm),
                    "bf16" => definition::<half::bf16>(cuda.client(), cfg, direct, dm),
                    _ => definition::<f32>(cuda.client(), cfg, direct, dm),
                };
                let mods = if dm.is_some() { "_mods" } else { "" };
                variants.push(Variant {
                    name: format!("decode_rows_{dtype}_d{d}_rows{rows}_bk32_causal{causal}_direct{direct}_paged{paged}{mods}"),
                    arch: Arch::Sm90,
                    definition,
                    shared_bytes: Some(cfg.smem_bytes()),
                    spill_free: true,
                });
            }
        }
        // FP8 codes: the decode shape, e4m3 per head and e5m2 per block (8 rows).
        let fp8_cases = [
            (4usize, Fp8Config { format: Fp8Format::E4M3, granularity: DescaleGranularity::PerHead }),
            (8, Fp8Config { format: Fp8Format::E5M2, granularity: DescaleGranularity::PerBlock }),
        ];
        // Each with the device's FP8 conversion (CUDA sm_89+) and with the integer decode.
        for (rows, fcfg) in fp8_cases {
            for ((causal, direct), cvt) in [((false, false), true), ((true, true), false), ((false, false), false), ((true, true), true)] {
                let cfg = RowDecodeConfig { head_dim: 128, v_head_dim: 128, rows, bk: 32, causal, write_lse: true, paged: false };
                variants.push(Variant {
                    name: format!(
                        "decode_rows_fp8_{:?}_{:?}_rows{rows}_causal{causal}_direct{direct}_cvt{cvt}",
                        fcfg.format, fcfg.granularity
                    ),
                    arch: Arch::Sm90,
                    definition: definition_fp8::<half::f16>(cuda.client(), cfg, fcfg, cvt, direct),
                    shared_bytes: Some((cfg.smem_bytes() + 8).next_multiple_of(16)),
                    // Four rows through the conversion: ptxas, given only the cube size (CubeCL
                    // declares no minimum of resident cubes), cuts the registers these want
                    // (about 104 to 127) to 96 for a fifth resident cube and spills a few words,
                    // how many depending on CubeCL's declaration order: a word stored before the
                    // key loop and loaded in the epilogue, or one store and load per key tile
                    // against about 870 instructions. Every other variant must be spill-free.
                    spill_free: !(cvt && rows == 4),
                });
            }
        }
        cuda.check_all(variants);
    }
}

#[cfg(test)]
mod decode_tests {
    //! `decode_word`'s arithmetic on the host, for every finite code of both formats, against
    //! the formats' definition.
    use super::*;
    use quattn_core::{DescaleGranularity, Fp8Format};

    /// `(-1)^s · 2^(e − bias) · 1.m`, subnormal `2^(1 − bias) · 0.m`; `None` where not finite.
    fn definition(format: Fp8Format, code: u8) -> Option<f32> {
        let (m_bits, bias, e_max) = match format {
            Fp8Format::E4M3 => (3, 7, 15),
            Fp8Format::E5M2 => (2, 15, 31),
        };
        let sign = if code & 0x80 != 0 { -1.0f64 } else { 1.0 };
        let e = ((code & 0x7f) >> m_bits) as i32;
        let m = (code & ((1 << m_bits) - 1)) as f64 / (1 << m_bits) as f64;
        let finite = match format {
            Fp8Format::E4M3 => code & 0x7f != 0x7f,
            Fp8Format::E5M2 => e != e_max,
        };
        finite.then(|| (if e == 0 { sign * 2f64.powi(1 - bias) * m } else { sign * 2f64.powi(e - bias) * (1.0 + m) }) as f32)
    }

    /// The host twin of `decode_word` for the code in byte `x` of `word`.
    fn twin(fcfg: Fp8Config, word: u32, x: u32) -> f32 {
        let min_normal = fcfg.subnormal_step() * (1u32 << fcfg.mantissa_bits()) as f32;
        let byte = word >> (8 * x);
        let magnitude = byte & 0x7f;
        let sign = (byte & 0x80) << 24;
        let normal = f32::from_bits((magnitude << (23 - fcfg.mantissa_bits())) + (fcfg.bias_adjust() << 23));
        let unsigned = if magnitude < (1 << fcfg.mantissa_bits()) { normal * 2.0 - min_normal } else { normal };
        f32::from_bits(unsigned.to_bits() | sign)
    }

    #[test]
    fn word_decode_is_exact_for_every_finite_code() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let fcfg = Fp8Config { format, granularity: DescaleGranularity::PerTensor };
            for code in 0..=255u8 {
                for x in 0..4u32 {
                    let word = ((code as u32) << (8 * x)) | (0x3838_3838 & !(0xff << (8 * x)));
                    let got = twin(fcfg, word, x);
                    match definition(format, code) {
                        // Bit for bit, signed zeros included.
                        Some(want) => assert_eq!(got.to_bits(), want.to_bits(), "{format} code {code:#04x} at byte {x}"),
                        // Non-finite codes decode to finite values (the kernel poisons their rows).
                        None => assert!(got.is_finite(), "{format} code {code:#04x}"),
                    }
                }
            }
        }
    }
}
