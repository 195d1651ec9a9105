//! Portable forward kernel: register-tiled FMA for both matmuls, K/V staged in shared memory,
//! online softmax in f32. Runs on every CubeCL runtime (WGSL, SPIR-V, CUDA).
//!
//! Per cube (one tile of `bq` query rows of one (batch, head)):
//! - global: stage Q once (transposed), then walk KV tiles — first the fully visible ones with no
//!   mask code, then the ones cut by the causal diagonal or the sequence end with the mask;
//!   tiles above the diagonal are never visited.
//! - stage, per KV tile: `score_matmul` (S = Q·Kᵀ), `online_softmax` (row max across the units
//!   of a row, rescale, P into shared memory), `value_matmul` (acc += P·V).
//! - epilogue: `write_results` (O = acc / l, LSE = m·scale + ln l).
//!
//! Units are laid out `tr x tc`: unit `(r, c)` owns score rows `r*rm .. r*rm+rm`, score columns
//! `c*rn .. c*rn+rn` and output columns `c, c+tc, c+2tc, ...` (strided so that the `tc` units
//! of a row read consecutive V entries and write consecutive O entries).

use cubecl::prelude::*;

use super::{cube_key_ranges, is_visible, AttnShape, LAZY_RESCALE_THRESHOLD, MASK_THRESHOLD, NO_MAX};

/// Compile-time key of the FMA kernel: everything that changes the generated code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FmaConfig {
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub bq: usize,
    pub bk: usize,
    pub tr: usize,
    pub tc: usize,
    pub causal: bool,
    pub write_lse: bool,
    /// FlashAttention-4 trick: keep a stale row max (and skip the accumulator rescale) until the
    /// true max exceeds it by more than `LAZY_RESCALE_THRESHOLD` in the exponent.
    pub lazy_rescale: bool,
    /// Reduce row statistics with plane shuffles instead of shared memory.
    pub plane_reduce: bool,
}

impl FmaConfig {
    pub const fn rm(&self) -> usize {
        self.bq / self.tr
    }
    pub const fn rn(&self) -> usize {
        self.bk / self.tc
    }
    /// Output columns per unit.
    pub const fn dvt(&self) -> usize {
        self.v_head_dim / self.tc
    }
    pub const fn units(&self) -> usize {
        self.tr * self.tc
    }
    /// Pitch of the transposed Q stage (one row per head-dim index).
    pub const fn q_pitch(&self) -> usize {
        self.bq + crate::tiling::STAGE_PAD as usize
    }
    /// Pitch of the transposed K stage.
    pub const fn k_pitch(&self) -> usize {
        self.bk + crate::tiling::STAGE_PAD as usize
    }
    /// The K tile (transposed) and the V tile (row-major) share one buffer.
    pub const fn kv_stage_len(&self) -> usize {
        let k = self.head_dim * self.k_pitch();
        let v = self.bk * self.v_head_dim;
        if k > v {
            k
        } else {
            v
        }
    }
}

#[cube(launch_unchecked)]
pub fn fwd_portable_fma<E: Float>(
    q: &Array<E>,
    k: &Array<E>,
    v: &Array<E>,
    o: &mut Array<E>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    #[comptime] cfg: FmaConfig,
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

    let q_base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize;
    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    let mut q_stage = SharedMemory::<E>::new(cfg.head_dim * cfg.q_pitch());
    let mut kv_stage = SharedMemory::<E>::new(cfg.kv_stage_len());
    let mut p_stage = SharedMemory::<f32>::new(cfg.bk * cfg.bq);
    let mut red_stage = SharedMemory::<f32>::new(cfg.bq * cfg.tc);

    cube_load_q(q, &mut q_stage, q_base, shape.q_s2 as usize, q0, q_len, cfg);

    let mut row_max = Array::<f32>::new(cfg.rm());
    let mut row_sum = Array::<f32>::new(cfg.rm());
    let mut acc = Array::<f32>::new(cfg.rm() * cfg.dvt());
    let mut scores = Array::<f32>::new(cfg.rm() * cfg.rn());
    #[unroll]
    for i in 0..cfg.rm() {
        row_max[i] = NO_MAX;
        row_sum[i] = 0.0;
    }
    #[unroll]
    for i in 0..cfg.rm() * cfg.dvt() {
        acc[i] = 0.0;
    }

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, cfg.bq, cfg.bk, cfg.causal);

    sync_cube();

    for tile in 0..num_full {
        kv_step(
            k, v, &q_stage, &mut kv_stage, &mut p_stage, &mut red_stage, &mut scores,
            &mut row_max, &mut row_sum, &mut acc, shape, k_base, v_base, tile * cfg.bk, q0,
            unit_row, unit_col, false, cfg,
        );
    }
    for tile in num_full..num_tiles {
        kv_step(
            k, v, &q_stage, &mut kv_stage, &mut p_stage, &mut red_stage, &mut scores,
            &mut row_max, &mut row_sum, &mut acc, shape, k_base, v_base, tile * cfg.bk, q0,
            unit_row, unit_col, true, cfg,
        );
    }

    write_results(
        o, lse, &mut red_stage, &row_max, &mut row_sum, &acc, shape, batch, head, q0,
        unit_row, unit_col, cfg,
    );
}

/// Stages the cube's Q tile transposed (`[d][row]`), zero-filling rows past `q_len`.
#[cube]
fn cube_load_q<E: Float>(
    q: &Array<E>,
    q_stage: &mut SharedMemory<E>,
    q_base: usize,
    q_row_stride: usize,
    q0: usize,
    q_len: usize,
    #[comptime] cfg: FmaConfig,
) {
    let count = comptime!(cfg.bq * cfg.head_dim);
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if e < count {
            let row = e / cfg.head_dim;
            let d = e % cfg.head_dim;
            let mut value = E::from_int(0);
            if q0 + row < q_len {
                value = q[q_base + (q0 + row) * q_row_stride + d];
            }
            q_stage[d * cfg.q_pitch() + row] = value;
        }
    }
}

/// Stages keys `[k0, k0+bk)` transposed (`[d][key]`), zero past `kv_len`.
#[cube]
fn cube_load_k<E: Float>(
    k: &Array<E>,
    kv_stage: &mut SharedMemory<E>,
    k_base: usize,
    k_row_stride: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] cfg: FmaConfig,
) {
    let count = comptime!(cfg.bk * cfg.head_dim);
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if e < count {
            let key = e / cfg.head_dim;
            let d = e % cfg.head_dim;
            let mut value = E::from_int(0);
            if k0 + key < kv_len {
                value = k[k_base + (k0 + key) * k_row_stride + d];
            }
            kv_stage[d * cfg.k_pitch() + key] = value;
        }
    }
}

/// Stages values `[k0, k0+bk)` row-major (`[key][dv]`), zero past `kv_len` so that masked
/// probabilities (exactly 0) never meet garbage.
#[cube]
fn cube_load_v<E: Float>(
    v: &Array<E>,
    kv_stage: &mut SharedMemory<E>,
    v_base: usize,
    v_row_stride: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] cfg: FmaConfig,
) {
    let count = comptime!(cfg.bk * cfg.v_head_dim);
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if e < count {
            let key = e / cfg.v_head_dim;
            let d = e % cfg.v_head_dim;
            let mut value = E::from_int(0);
            if k0 + key < kv_len {
                value = v[v_base + (k0 + key) * v_row_stride + d];
            }
            kv_stage[e] = value;
        }
    }
}

/// One KV tile: load K, scores, online softmax, load V, accumulate P·V.
/// `masked` is comptime so the fully visible tiles carry no mask code at all.
#[cube]
#[allow(clippy::too_many_arguments)]
fn kv_step<E: Float>(
    k: &Array<E>,
    v: &Array<E>,
    q_stage: &SharedMemory<E>,
    kv_stage: &mut SharedMemory<E>,
    p_stage: &mut SharedMemory<f32>,
    red_stage: &mut SharedMemory<f32>,
    scores: &mut Array<f32>,
    row_max: &mut Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &mut Array<f32>,
    shape: &AttnShape,
    k_base: usize,
    v_base: usize,
    k0: usize,
    q0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] masked: bool,
    #[comptime] cfg: FmaConfig,
) {
    let kv_len = shape.kv_len as usize;
    cube_load_k(k, kv_stage, k_base, shape.k_s2 as usize, k0, kv_len, cfg);
    sync_cube();

    thread_score_matmul(q_stage, kv_stage, scores, unit_row, unit_col, cfg);
    if masked {
        thread_apply_mask(scores, shape, q0, k0, unit_row, unit_col, cfg);
    }

    // The row-max reduction ends with a barrier when it goes through shared memory; after it
    // every unit is done reading K, so V may overwrite the buffer.
    online_softmax(
        scores, row_max, row_sum, acc, p_stage, red_stage, shape.scale, unit_row, unit_col,
        masked, cfg,
    );
    if cfg.plane_reduce {
        sync_cube();
    }

    cube_load_v(v, kv_stage, v_base, shape.v_s2 as usize, k0, kv_len, cfg);
    sync_cube();

    thread_value_matmul(p_stage, kv_stage, acc, unit_row, unit_col, cfg);
    // The next tile overwrites K/V, P and the reduction scratch.
    sync_cube();
}

/// `scores[i][j] = sum_d Q[row_i][d] * K[key_j][d]` for the unit's `rm x rn` block.
#[cube]
fn thread_score_matmul<E: Float>(
    q_stage: &SharedMemory<E>,
    kv_stage: &SharedMemory<E>,
    scores: &mut Array<f32>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaConfig,
) {
    let rm = comptime!(cfg.rm());
    let rn = comptime!(cfg.rn());
    #[unroll]
    for i in 0..rm * rn {
        scores[i] = 0.0;
    }
    let mut a = Array::<f32>::new(rm);
    let mut b = Array::<f32>::new(rn);
    let q_off = unit_row * rm;
    let k_off = unit_col * rn;
    for d in 0..cfg.head_dim {
        #[unroll]
        for i in 0..rm {
            a[i] = f32::cast_from(q_stage[d * cfg.q_pitch() + q_off + i]);
        }
        #[unroll]
        for j in 0..rn {
            b[j] = f32::cast_from(kv_stage[d * cfg.k_pitch() + k_off + j]);
        }
        #[unroll]
        for i in 0..rm {
            #[unroll]
            for j in 0..rn {
                scores[i * rn + j] = fma(a[i], b[j], scores[i * rn + j]);
            }
        }
    }
}

/// Sets invisible scores (key past `kv_len`, or above the causal diagonal) to `NO_MAX`.
#[cube]
fn thread_apply_mask(
    scores: &mut Array<f32>,
    shape: &AttnShape,
    q0: usize,
    k0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaConfig,
) {
    let rm = comptime!(cfg.rm());
    let rn = comptime!(cfg.rn());
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    #[unroll]
    for i in 0..rm {
        let row = q0 + unit_row * rm + i;
        #[unroll]
        for j in 0..rn {
            let key = k0 + unit_col * rn + j;
            let visible = is_visible(row, key, q_len, kv_len, cfg.causal);
            scores[i * rn + j] = select(visible, scores[i * rn + j], NO_MAX);
        }
    }
}

/// Max over the `tc` units sharing each of this unit's rows. Through shared memory (ends with
/// a barrier) or, when the runtime has planes, with shuffles among the `tc` consecutive lanes.
#[cube]
fn cube_row_reduce_max(
    partial: &mut Array<f32>,
    red_stage: &mut SharedMemory<f32>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaConfig,
) {
    let rm = comptime!(cfg.rm());
    if cfg.plane_reduce {
        #[unroll]
        for i in 0..rm {
            let mut value = partial[i];
            // Butterfly over the tc consecutive lanes of the row: masks tc/2, ..., 1.
            #[unroll]
            for step in 0..comptime!(cfg.tc.trailing_zeros() as usize) {
                let mask = comptime!((cfg.tc >> (step + 1)) as u32);
                value = max(value, plane_shuffle_xor(value, mask));
            }
            partial[i] = value;
        }
    } else {
        #[unroll]
        for i in 0..rm {
            red_stage[(unit_row * rm + i) * cfg.tc + unit_col] = partial[i];
        }
        sync_cube();
        #[unroll]
        for i in 0..rm {
            let base = (unit_row * rm + i) * cfg.tc;
            let mut value = red_stage[base];
            #[unroll]
            for c in 1..cfg.tc {
                value = max(value, red_stage[base + c]);
            }
            partial[i] = value;
        }
    }
}

/// Sum over the `tc` units sharing each row (epilogue only: partial row sums stay per unit
/// during the main loop because every unit of a row applies the same rescale factor).
#[cube]
fn cube_row_reduce_sum(
    partial: &mut Array<f32>,
    red_stage: &mut SharedMemory<f32>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaConfig,
) {
    let rm = comptime!(cfg.rm());
    if cfg.plane_reduce {
        #[unroll]
        for i in 0..rm {
            let mut value = partial[i];
            // Butterfly over the tc consecutive lanes of the row: masks tc/2, ..., 1.
            #[unroll]
            for step in 0..comptime!(cfg.tc.trailing_zeros() as usize) {
                let mask = comptime!((cfg.tc >> (step + 1)) as u32);
                value += plane_shuffle_xor(value, mask);
            }
            partial[i] = value;
        }
    } else {
        #[unroll]
        for i in 0..rm {
            red_stage[(unit_row * rm + i) * cfg.tc + unit_col] = partial[i];
        }
        sync_cube();
        #[unroll]
        for i in 0..rm {
            let base = (unit_row * rm + i) * cfg.tc;
            let mut value = red_stage[base];
            #[unroll]
            for c in 1..cfg.tc {
                value += red_stage[base + c];
            }
            partial[i] = value;
        }
    }
}

/// Online softmax for one tile: new row max, rescale of the running sum and accumulator, and
/// `P = exp((S - m)·scale)` written to shared memory as `[key][row]` for the value matmul.
#[cube]
#[allow(clippy::too_many_arguments)]
fn online_softmax(
    scores: &Array<f32>,
    row_max: &mut Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &mut Array<f32>,
    p_stage: &mut SharedMemory<f32>,
    red_stage: &mut SharedMemory<f32>,
    scale: f32,
    unit_row: usize,
    unit_col: usize,
    #[comptime] masked: bool,
    #[comptime] cfg: FmaConfig,
) {
    let rm = comptime!(cfg.rm());
    let rn = comptime!(cfg.rn());
    let dvt = comptime!(cfg.dvt());

    let mut tile_max = Array::<f32>::new(rm);
    #[unroll]
    for i in 0..rm {
        let mut value = scores[i * rn];
        #[unroll]
        for j in 1..rn {
            value = max(value, scores[i * rn + j]);
        }
        tile_max[i] = value;
    }
    cube_row_reduce_max(&mut tile_max, red_stage, unit_row, unit_col, cfg);

    #[unroll]
    for i in 0..rm {
        let old_max = row_max[i];
        let mut new_max = max(old_max, tile_max[i]);
        if cfg.lazy_rescale {
            // Keep the stale max while the exponent headroom suffices. Both the running sum and
            // the accumulator keep using it, so the result stays exact.
            new_max = select(
                (tile_max[i] - old_max) * scale > LAZY_RESCALE_THRESHOLD,
                tile_max[i],
                old_max,
            );
        }
        let neg_scaled_max = -new_max * scale;

        let mut tile_sum = 0.0f32;
        #[unroll]
        for j in 0..rn {
            let s = scores[i * rn + j];
            let mut p = f32::exp(fma(s, scale, neg_scaled_max));
            if masked {
                p = select(s > MASK_THRESHOLD, p, 0.0);
            }
            p_stage[(unit_col * rn + j) * cfg.bq + unit_row * rm + i] = p;
            tile_sum += p;
        }

        if cfg.lazy_rescale {
            if new_max != old_max {
                let alpha = f32::exp((old_max - new_max) * scale);
                row_sum[i] *= alpha;
                #[unroll]
                for c in 0..dvt {
                    acc[i * dvt + c] *= alpha;
                }
            }
        } else {
            let alpha = f32::exp((old_max - new_max) * scale);
            row_sum[i] *= alpha;
            #[unroll]
            for c in 0..dvt {
                acc[i * dvt + c] *= alpha;
            }
        }
        row_sum[i] += tile_sum;
        row_max[i] = new_max;
    }
}

/// `acc[i][c] += sum_j P[row_i][key_j] * V[key_j][col_c]` for the unit's rows and columns.
#[cube]
fn thread_value_matmul<E: Float>(
    p_stage: &SharedMemory<f32>,
    kv_stage: &SharedMemory<E>,
    acc: &mut Array<f32>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaConfig,
) {
    let rm = comptime!(cfg.rm());
    let dvt = comptime!(cfg.dvt());
    let mut p = Array::<f32>::new(rm);
    let mut vv = Array::<f32>::new(dvt);
    let p_off = unit_row * rm;
    for key in 0..cfg.bk {
        #[unroll]
        for i in 0..rm {
            p[i] = p_stage[key * cfg.bq + p_off + i];
        }
        #[unroll]
        for c in 0..dvt {
            vv[c] = f32::cast_from(kv_stage[key * cfg.v_head_dim + unit_col + c * cfg.tc]);
        }
        #[unroll]
        for i in 0..rm {
            #[unroll]
            for c in 0..dvt {
                acc[i * dvt + c] = fma(p[i], vv[c], acc[i * dvt + c]);
            }
        }
    }
}

/// Epilogue: reduce the row sums, then `O = acc / l` and `LSE = m·scale + ln l`; rows that saw
/// no key get `O = 0` and `LSE = lse_empty` (-inf).
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_results<E: Float>(
    o: &mut Array<E>,
    lse: &mut Array<f32>,
    red_stage: &mut SharedMemory<f32>,
    row_max: &Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &Array<f32>,
    shape: &AttnShape,
    batch: usize,
    head: usize,
    q0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaConfig,
) {
    let rm = comptime!(cfg.rm());
    let dvt = comptime!(cfg.dvt());
    cube_row_reduce_sum(row_sum, red_stage, unit_row, unit_col, cfg);

    let q_len = shape.q_len as usize;
    let o_base = batch * shape.o_s0 as usize + head * shape.o_s1 as usize;
    #[unroll]
    for i in 0..rm {
        let row = q0 + unit_row * rm + i;
        if row < q_len {
            let l = row_sum[i];
            let seen = l > 0.0;
            let inv = select(seen, 1.0 / l, 0.0);
            let o_row = o_base + row * shape.o_s2 as usize;
            #[unroll]
            for c in 0..dvt {
                o[o_row + unit_col + c * cfg.tc] = E::cast_from(acc[i * dvt + c] * inv);
            }
            if cfg.write_lse {
                if unit_col == 0 {
                    let value = select(
                        seen,
                        row_max[i] * shape.scale + f32::ln(select(seen, l, 1.0)),
                        shape.lse_empty,
                    );
                    lse[(batch * shape.q_heads as usize + head) * q_len + row] = value;
                }
            }
        }
    }
}
