//! Portable forward kernel, vectorized: register-tiled FMA on 4-wide vectors for both matmuls,
//! stages in shared memory as 4-wide vectors, online softmax in f32. Runs on every CubeCL
//! runtime (WGSL, SPIR-V, CUDA); needs every row start of Q, K, V and O aligned to 4 elements
//! (`launch::vector_layout_ok`).
//!
//! Why it is shaped like this:
//! - Every shared-memory read is a 16-byte vector: the unit's 4 query rows of Qᵀ, 4 keys of Kᵀ,
//!   4 rows of Pᵀ, 4 output columns of V; one 2-byte load per operand reached ~5 TFLOP/s on an
//!   H100 through Vulkan.
//! - Q, K and V may be staged in f32 (`stage_f32`), converted once when staged, instead of once
//!   per use (12 conversions per 32 FMA for f16 operands).
//! - Masking is a runtime flag of one copy of the KV step, not a second comptime copy: two
//!   unrolled copies double the shader, and causal launches (which run both copies side by
//!   side) ran 3x slower per FLOP on the H100's Vulkan driver.
//! - K and V are prefetched: each tile's global loads are issued into registers a phase early
//!   (this tile's V during Q·Kᵀ and the softmax, the next tile's K during P·V) and written to
//!   shared memory after the compute they overlap (software pipelining without asynchronous
//!   copies, which WGSL lacks). A tile inside the keys loads with no per-row test.
//!
//! Units are laid out `tr x tc` (unit `(r, c)` = `r * tc + c`, so the `tc` units of a row are
//! consecutive lanes). With `W = 4`:
//! - scores: unit `(r, c)` owns rows `r*rm .. r*rm+rm` and the key quads `j*tc + c`,
//!   `j < rn/W` (interleaved, so that the `tc` units of a plane read consecutive 16-byte
//!   vectors of Kᵀ: one shared-memory wavefront).
//! - output: the same rows and the column quads `j*tc + c`, `j < dvt/W`.

use cubecl::prelude::*;

use super::{
    cube_key_ranges, is_visible, seq_k_offset, seq_kv_len, seq_lse_index, seq_q_len, seq_q_offset, seq_span, AttnShape, SeqSpan,
    LAZY_RESCALE_THRESHOLD, MASK_THRESHOLD, NO_MAX,
};

/// Vector width of the stages and global accesses.
pub(crate) const W: usize = 4;

/// Compile-time key of the vectorized FMA kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FmaVecConfig {
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub bq: usize,
    pub bk: usize,
    pub tr: usize,
    pub tc: usize,
    pub causal: bool,
    pub write_lse: bool,
    pub lazy_rescale: bool,
    pub plane_reduce: bool,
}

impl FmaVecConfig {
    pub const fn rm(&self) -> usize {
        self.bq / self.tr
    }
    pub const fn rn(&self) -> usize {
        self.bk / self.tc
    }
    pub const fn dvt(&self) -> usize {
        self.v_head_dim / self.tc
    }
    pub const fn units(&self) -> usize {
        self.tr * self.tc
    }
    /// Row quads per unit.
    pub const fn rq(&self) -> usize {
        self.rm() / W
    }
    /// Key quads per unit.
    pub const fn kq(&self) -> usize {
        self.rn() / W
    }
    /// Output column quads per unit.
    pub const fn cq(&self) -> usize {
        self.dvt() / W
    }
    /// Pitches in vectors. Qᵀ `[d][bq/W]`, Kᵀ `[d][bk/W]`, V `[key][dv/W]`.
    pub const fn q_pitch(&self) -> usize {
        self.bq / W
    }
    pub const fn k_pitch(&self) -> usize {
        self.bk / W
    }
    pub const fn v_pitch(&self) -> usize {
        self.v_head_dim / W
    }
    /// Pᵀ `[key][bq/W + 1]`: the pad vector moves the keys a unit writes (4 apart) onto
    /// different banks.
    pub const fn p_pitch(&self) -> usize {
        self.bq / W + 1
    }
    pub const fn kv_stage_len(&self) -> usize {
        let k = self.head_dim * self.k_pitch();
        let v = self.bk * self.v_pitch();
        if k > v {
            k
        } else {
            v
        }
    }
}

/// `E`: element type of Q, K, V, O. `S`: element type of the Q/K/V stages (f32, or `E` to save
/// shared memory). `N` must be `W`.
#[cube(launch_unchecked)]
pub fn fwd_portable_fma_vec<E: Float, S: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    #[comptime] cfg: FmaVecConfig,
) {
    fma_vec_forward::<E, S, N>(q, k, v, o, lse, shape, &ComptimeOption::new_None(), cfg);
}

/// [`fwd_portable_fma_vec`] on a packed variable-length batch (FlashAttention's varlen
/// convention): Q `[total_q, q_heads, d]`, K and V `[total_k, kv_heads, d]`, O `[total_q,
/// q_heads, dv]` through the shape's head and row strides (its batch strides are unused), LSE
/// `[q_heads, total_q]`. Sequence `b` (the cube's z) owns the Q/O rows `[cu_q[b], cu_q[b+1])`
/// and the K/V rows `[cu_k[b], cu_k[b+1])`; the shape's lengths are the longest sequence's
/// (the grid). Cubes past their sequence's queries leave at once, and the key loop ends at the
/// sequence's keys, so no cube reads or writes another sequence's rows.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_fma_vec_varlen<E: Float, S: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    cu_seqlens_q: &Array<u32>,
    cu_seqlens_k: &Array<u32>,
    shape: &AttnShape,
    #[comptime] cfg: FmaVecConfig,
) {
    let seq = seq_span(cu_seqlens_q, cu_seqlens_k, CUBE_POS_Z as usize);
    // Uniform over the cube, before any barrier.
    if CUBE_POS_X as usize * cfg.bq >= seq.q_len {
        terminate!();
    }
    fma_vec_forward::<E, S, N>(q, k, v, o, lse, shape, &ComptimeOption::new_Some(seq), cfg);
}

/// The kernel's body, on the shape's batch (`seq` none) or on one packed sequence.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fma_vec_forward<E: Float, S: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    seq: &ComptimeOption<SeqSpan>,
    #[comptime] cfg: FmaVecConfig,
) {
    let unit = UNIT_POS as usize;
    let unit_row = unit / cfg.tc;
    let unit_col = unit % cfg.tc;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q0 = CUBE_POS_X as usize * cfg.bq;
    let kv_head = head / shape.group as usize;
    let q_len = seq_q_len(shape, seq);
    let kv_len = seq_kv_len(shape, seq);

    let q_base = seq_q_offset(batch, shape.q_s0, shape.q_s2, seq) + head * shape.q_s1 as usize;
    let k_base = seq_k_offset(batch, shape.k_s0, shape.k_s2, seq) + kv_head * shape.k_s1 as usize;
    let v_base = seq_k_offset(batch, shape.v_s0, shape.v_s2, seq) + kv_head * shape.v_s1 as usize;

    let mut q_stage = SharedMemory::<Vector<S, N>>::new(comptime!(cfg.head_dim * cfg.q_pitch()));
    let mut kv_stage = SharedMemory::<Vector<S, N>>::new(cfg.kv_stage_len());
    let mut p_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.bk * cfg.p_pitch()));
    let mut red_stage = SharedMemory::<f32>::new(comptime!(cfg.bq * cfg.tc));

    cube_load_transposed::<E, S, N>(
        q, &mut q_stage, q_base, shape.q_s2 as usize, q0, q_len, cfg.bq, cfg.head_dim, cfg,
    );

    let mut row_max = Array::<f32>::new(cfg.rm());
    let mut row_sum = Array::<f32>::new(cfg.rm());
    let mut acc = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.cq()));
    let mut scores = Array::<Vector<f32, N>>::new(comptime!(cfg.rm() * cfg.kq()));
    #[unroll]
    for i in 0..cfg.rm() {
        row_max[i] = NO_MAX;
        row_sum[i] = 0.0;
    }
    #[unroll]
    for i in 0..comptime!(cfg.rm() * cfg.cq()) {
        acc[i] = Vector::new(0.0f32);
    }

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, cfg.bq, cfg.bk, cfg.causal);

    // K and V are prefetched: the next K (and this tile's V) are loaded into registers before
    // the compute they overlap, and written to shared memory after it.
    let mut k_regs = Array::<Vector<E, N>>::new(comptime!(gather_transposed_len(cfg.bk, cfg.head_dim, cfg.units())));
    let mut v_regs = Array::<Vector<E, N>>::new(comptime!(gather_v_len(&cfg)));
    let k_stride = shape.k_s2 as usize;
    let v_stride = shape.v_s2 as usize;
    if num_tiles > 0 {
        unit_gather_transposed::<E, N>(k, &mut k_regs, k_base, k_stride, 0, kv_len, cfg.bk, cfg.head_dim, cfg);
    }

    sync_cube();

    // One copy of the step for all tiles; the mask is a runtime branch (see the module doc).
    for tile in 0..num_tiles {
        let k0 = tile * cfg.bk;
        let masked = tile >= num_full;

        stage_k::<E, S, N>(&k_regs, &mut kv_stage, cfg);
        sync_cube();
        // This tile's V is in flight during Q·Kᵀ and the softmax.
        unit_gather_v::<E, N>(v, &mut v_regs, v_base, v_stride, k0, kv_len, cfg);

        thread_score_matmul::<S, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg);
        if masked {
            thread_apply_mask_seq::<N>(&mut scores, shape, seq, q0, k0, unit_row, unit_col, cfg);
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
        // Every unit is done reading K (the shared-memory reduction already ended with a
        // barrier), and P is complete.
        if cfg.plane_reduce {
            sync_cube();
        }

        stage_v::<E, S, N>(&v_regs, &mut kv_stage, cfg);
        sync_cube();
        // The next tile's K is in flight during P·V.
        if tile + 1 < num_tiles {
            unit_gather_transposed::<E, N>(k, &mut k_regs, k_base, k_stride, k0 + cfg.bk, kv_len, cfg.bk, cfg.head_dim, cfg);
        }

        thread_value_matmul::<f32, S, N>(&p_stage, &kv_stage, &mut acc, unit_row, unit_col, cfg);
        // The next tile overwrites K/V, P and the reduction scratch.
        sync_cube();
    }

    write_results_seq::<E, N>(
        o, lse, &mut red_stage, &row_max, &mut row_sum, &acc, shape, seq, batch, head, q0, unit_row,
        unit_col, cfg,
    );
}

/// Stages `rows` rows (from `row0`, zero past `len`) of a row-major `[row][dim]` tensor as
/// `[dim][rows/W]` vectors of W rows, converted to `S`. Each task reads a W x W block (W
/// vectors of W consecutive dims from W consecutive rows) and writes it transposed; tasks are
/// numbered row-quad fastest so that a plane's writes of one dim are consecutive vectors.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cube_load_transposed<E: Float, S: Float, N: Size>(
    src: &Array<Vector<E, N>>,
    stage: &mut SharedMemory<Vector<S, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    // Each load guarded on its own: the two halves of the split loads, back to back.
    let mut regs = Array::<Vector<E, N>>::new(comptime!(gather_transposed_len(rows, dim, cfg.units())));
    gather_transposed::<E, N>(src, &mut regs, base, row_stride, row0, len, rows, dim, true, cfg);
    unit_scatter_transposed::<E, S, N>(&regs, stage, rows, dim, cfg);
}

/// Stages the prefetched K tile (the registers a previous [`unit_gather_transposed`] filled)
/// into `kv_stage` as `[d][bk/W]`.
#[cube]
pub(crate) fn stage_k<E: Float, S: Float, N: Size>(
    k_regs: &Array<Vector<E, N>>,
    kv_stage: &mut SharedMemory<Vector<S, N>>,
    #[comptime] cfg: FmaVecConfig,
) {
    unit_scatter_transposed::<E, S, N>(k_regs, kv_stage, cfg.bk, cfg.head_dim, cfg);
}

/// Stages the prefetched V tile (from [`unit_gather_v`]) into `kv_stage` as `[key][dv/W]`.
#[cube]
pub(crate) fn stage_v<E: Float, S: Float, N: Size>(
    v_regs: &Array<Vector<E, N>>,
    kv_stage: &mut SharedMemory<Vector<S, N>>,
    #[comptime] cfg: FmaVecConfig,
) {
    unit_scatter_v::<E, S, N>(v_regs, kv_stage, cfg);
}

/// [`cube_load_transposed`] in two halves, so that the global loads of the next tile can be
/// issued before the compute they overlap: `unit_gather_transposed` reads this unit's tasks into
/// registers (`regs[step * W + e]`), `unit_scatter_transposed` writes them transposed into the
/// stage. A tile wholly inside `len` takes a copy of the loads with no per-row test (one
/// uniform branch per tile instead of a divergent one per load: on NVIDIA's Vulkan driver each
/// guarded load is its own branch region, and the next load waits for it).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn unit_gather_transposed<E: Float, N: Size>(
    src: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    if row0 + rows <= len {
        gather_transposed::<E, N>(src, regs, base, row_stride, row0, len, rows, dim, false, cfg);
    } else {
        gather_transposed::<E, N>(src, regs, base, row_stride, row0, len, rows, dim, true, cfg);
    }
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn gather_transposed<E: Float, N: Size>(
    src: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] guarded: bool,
    #[comptime] cfg: FmaVecConfig,
) {
    let row_quads = comptime!(rows / W);
    let tasks = comptime!(rows / W * (dim / W));
    let per_unit = comptime!(tasks.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let t = step * cfg.units() + UNIT_POS as usize;
        // No test where every unit has a task at every step.
        if comptime!(tasks.is_multiple_of(cfg.units())) {
            gather_transposed_task::<E, N>(src, regs, base, row_stride, row0, len, t, step, row_quads, guarded);
        } else if t < tasks {
            gather_transposed_task::<E, N>(src, regs, base, row_stride, row0, len, t, step, row_quads, guarded);
        }
    }
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn gather_transposed_task<E: Float, N: Size>(
    src: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    t: usize,
    #[comptime] step: usize,
    #[comptime] row_quads: usize,
    #[comptime] guarded: bool,
) {
    let rq = t % row_quads;
    let dq = t / row_quads;
    #[unroll]
    for e in 0..W {
        let row = row0 + rq * W + e;
        let index = (base + row * row_stride) / W + dq;
        if guarded {
            let mut value = Vector::<E, N>::new(E::from_int(0));
            if row < len {
                value = src[index];
            }
            regs[step * W + e] = value;
        } else {
            regs[step * W + e] = src[index];
        }
    }
}

/// The second half of [`unit_gather_transposed`]: this unit's W x W blocks, transposed into
/// `[dim][rows/W]`.
#[cube]
pub(crate) fn unit_scatter_transposed<E: Float, S: Float, N: Size>(
    regs: &Array<Vector<E, N>>,
    stage: &mut SharedMemory<Vector<S, N>>,
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
        if comptime!(tasks.is_multiple_of(cfg.units())) {
            scatter_transposed_task::<E, S, N>(regs, stage, t, step, row_quads);
        } else if t < tasks {
            scatter_transposed_task::<E, S, N>(regs, stage, t, step, row_quads);
        }
    }
}

#[cube]
fn scatter_transposed_task<E: Float, S: Float, N: Size>(
    regs: &Array<Vector<E, N>>,
    stage: &mut SharedMemory<Vector<S, N>>,
    t: usize,
    #[comptime] step: usize,
    #[comptime] row_quads: usize,
) {
    let rq = t % row_quads;
    let dq = t / row_quads;
    #[unroll]
    for x in 0..W {
        let mut column = Vector::<S, N>::empty();
        #[unroll]
        for e in 0..W {
            column[e] = S::cast_from(regs[step * W + e][x]);
        }
        stage[(dq * W + x) * row_quads + rq] = column;
    }
}

/// [`cube_load_v`] in two halves (see [`unit_gather_transposed`]): this unit's vectors of the
/// value tile into `regs[step]`, zero past `kv_len`.
#[cube]
pub(crate) fn unit_gather_v<E: Float, N: Size>(
    v: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    v_base: usize,
    v_row_stride: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    if k0 + cfg.bk <= kv_len {
        gather_v::<E, N>(v, regs, v_base, v_row_stride, k0, kv_len, false, cfg);
    } else {
        gather_v::<E, N>(v, regs, v_base, v_row_stride, k0, kv_len, true, cfg);
    }
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn gather_v<E: Float, N: Size>(
    v: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    v_base: usize,
    v_row_stride: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] guarded: bool,
    #[comptime] cfg: FmaVecConfig,
) {
    let per_row = comptime!(cfg.v_pitch());
    let count = comptime!(cfg.bk * cfg.v_pitch());
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if comptime!(count.is_multiple_of(cfg.units())) {
            gather_v_task::<E, N>(v, regs, v_base, v_row_stride, k0, kv_len, e, step, per_row, guarded);
        } else if e < count {
            gather_v_task::<E, N>(v, regs, v_base, v_row_stride, k0, kv_len, e, step, per_row, guarded);
        }
    }
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn gather_v_task<E: Float, N: Size>(
    v: &Array<Vector<E, N>>,
    regs: &mut Array<Vector<E, N>>,
    v_base: usize,
    v_row_stride: usize,
    k0: usize,
    kv_len: usize,
    e: usize,
    #[comptime] step: usize,
    #[comptime] per_row: usize,
    #[comptime] guarded: bool,
) {
    let key = e / per_row;
    let col = e % per_row;
    let index = (v_base + (k0 + key) * v_row_stride) / W + col;
    if guarded {
        let mut value = Vector::<E, N>::new(E::from_int(0));
        if k0 + key < kv_len {
            value = v[index];
        }
        regs[step] = value;
    } else {
        regs[step] = v[index];
    }
}

/// The second half of [`unit_gather_v`].
#[cube]
pub(crate) fn unit_scatter_v<E: Float, S: Float, N: Size>(
    regs: &Array<Vector<E, N>>,
    kv_stage: &mut SharedMemory<Vector<S, N>>,
    #[comptime] cfg: FmaVecConfig,
) {
    let count = comptime!(cfg.bk * cfg.v_pitch());
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if comptime!(count.is_multiple_of(cfg.units())) {
            kv_stage[e] = Vector::cast_from(regs[step]);
        } else if e < count {
            kv_stage[e] = Vector::cast_from(regs[step]);
        }
    }
}

/// Registers per unit for [`unit_gather_transposed`] of `rows x dim` and [`unit_gather_v`].
pub(crate) const fn gather_transposed_len(rows: usize, dim: usize, units: usize) -> usize {
    (rows / W * (dim / W)).div_ceil(units) * W
}
pub(crate) const fn gather_v_len(cfg: &FmaVecConfig) -> usize {
    (cfg.bk * cfg.v_pitch()).div_ceil(cfg.units())
}

/// Stages values `[k0, k0+bk)` row-major (`[key][dv/W]`), zero past `kv_len` so that masked
/// probabilities (exactly 0) never meet garbage.
#[cube]
pub(crate) fn cube_load_v<E: Float, S: Float, N: Size>(
    v: &Array<Vector<E, N>>,
    kv_stage: &mut SharedMemory<Vector<S, N>>,
    v_base: usize,
    v_row_stride: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let mut regs = Array::<Vector<E, N>>::new(comptime!(gather_v_len(&cfg)));
    gather_v::<E, N>(v, &mut regs, v_base, v_row_stride, k0, kv_len, true, cfg);
    unit_scatter_v::<E, S, N>(&regs, kv_stage, cfg);
}

/// `scores[i][j] = sum_d Q[row_i][d] * K[key_j][d]` for the unit's `rm x rn` block, on
/// vectors of W keys: per head-dim index, `rm/W + rn/W` vector loads for `rm * rn/W` vector FMAs.
#[cube]
pub(crate) fn thread_score_matmul<S: Float, N: Size>(
    q_stage: &SharedMemory<Vector<S, N>>,
    kv_stage: &SharedMemory<Vector<S, N>>,
    scores: &mut Array<Vector<f32, N>>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let rq = comptime!(cfg.rq());
    let kq = comptime!(cfg.kq());
    #[unroll]
    for i in 0..rm * kq {
        scores[i] = Vector::new(0.0f32);
    }
    let mut a = Array::<Vector<f32, N>>::new(rq);
    let mut b = Array::<Vector<f32, N>>::new(kq);
    let q_off = unit_row * rq;
    for d in 0..cfg.head_dim {
        #[unroll]
        for i in 0..rq {
            a[i] = Vector::cast_from(q_stage[d * cfg.q_pitch() + q_off + i]);
        }
        #[unroll]
        for j in 0..kq {
            b[j] = Vector::cast_from(kv_stage[d * cfg.k_pitch() + j * cfg.tc + unit_col]);
        }
        #[unroll]
        for i in 0..rm {
            let ai = Vector::<f32, N>::new(a[i / W][i % W]);
            #[unroll]
            for j in 0..kq {
                scores[i * kq + j] = fma(ai, b[j], scores[i * kq + j]);
            }
        }
    }
}

/// Sets invisible scores (key past `kv_len`, or above the causal diagonal) to `NO_MAX`.
#[cube]
pub(crate) fn thread_apply_mask<N: Size>(
    scores: &mut Array<Vector<f32, N>>,
    shape: &AttnShape,
    q0: usize,
    k0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    thread_apply_mask_seq::<N>(scores, shape, &ComptimeOption::new_None(), q0, k0, unit_row, unit_col, cfg);
}

/// [`thread_apply_mask`] with the lengths of the cube's sequence (`seq`, or the shape's).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn thread_apply_mask_seq<N: Size>(
    scores: &mut Array<Vector<f32, N>>,
    shape: &AttnShape,
    seq: &ComptimeOption<SeqSpan>,
    q0: usize,
    k0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let kq = comptime!(cfg.kq());
    let q_len = seq_q_len(shape, seq);
    let kv_len = seq_kv_len(shape, seq);
    #[unroll]
    for i in 0..rm {
        let row = q0 + unit_row * rm + i;
        #[unroll]
        for j in 0..kq {
            let mut s = scores[i * kq + j];
            #[unroll]
            for e in 0..W {
                let key = k0 + (j * cfg.tc + unit_col) * W + e;
                let visible = is_visible(row, key, q_len, kv_len, cfg.causal);
                s[e] = select(visible, s[e], NO_MAX);
            }
            scores[i * kq + j] = s;
        }
    }
}

/// Max (or sum) over the `tc` units sharing each of this unit's rows: plane shuffles among the
/// `tc` consecutive lanes, or shared memory (ends with a barrier).
#[cube]
pub(crate) fn cube_row_reduce(
    partial: &mut Array<f32>,
    red_stage: &mut SharedMemory<f32>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] is_max: bool,
    #[comptime] cfg: FmaVecConfig,
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
                let other = plane_shuffle_xor(value, mask);
                if is_max {
                    value = max(value, other);
                } else {
                    value += other;
                }
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
                if is_max {
                    value = max(value, red_stage[base + c]);
                } else {
                    value += red_stage[base + c];
                }
            }
            partial[i] = value;
        }
    }
}

/// Online softmax for one tile: new row max, rescale of the running sum and accumulator, and
/// `P = exp((S - m)·scale)` written to shared memory as `Pᵀ` (`[key][row quad]`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn online_softmax<P: Float, N: Size>(
    scores: &mut Array<Vector<f32, N>>,
    row_max: &mut Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &mut Array<Vector<f32, N>>,
    p_stage: &mut SharedMemory<Vector<P, N>>,
    red_stage: &mut SharedMemory<f32>,
    scale: f32,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let rq = comptime!(cfg.rq());
    let kq = comptime!(cfg.kq());
    let cq = comptime!(cfg.cq());

    let mut tile_max = Array::<f32>::new(rm);
    #[unroll]
    for i in 0..rm {
        let mut m = scores[i * kq];
        #[unroll]
        for j in 1..kq {
            m = max(m, scores[i * kq + j]);
        }
        tile_max[i] = max(max(m[0], m[1]), max(m[2], m[3]));
    }
    cube_row_reduce(&mut tile_max, red_stage, unit_row, unit_col, true, cfg);

    let scale_v = Vector::<f32, N>::new(scale);
    let threshold = Vector::<f32, N>::new(MASK_THRESHOLD);
    let zero = Vector::<f32, N>::new(0.0f32);
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
        let neg_scaled_max = Vector::<f32, N>::new(-new_max * scale);

        let mut tile_sum = Vector::<f32, N>::new(0.0f32);
        #[unroll]
        for j in 0..kq {
            let s = scores[i * kq + j];
            // Masked scores are NO_MAX: zero them explicitly, since a row that has seen only
            // masked keys has NO_MAX as its max too and the exponent would be 0.
            let p = select_many(
                s.greater_than(threshold),
                Vector::exp(fma(s, scale_v, neg_scaled_max)),
                zero,
            );
            scores[i * kq + j] = p;
            tile_sum += p;
        }

        let alpha = f32::exp((old_max - new_max) * scale);
        if cfg.lazy_rescale {
            if new_max != old_max {
                row_sum[i] *= alpha;
                let alpha_v = Vector::<f32, N>::new(alpha);
                #[unroll]
                for c in 0..cq {
                    acc[i * cq + c] *= alpha_v;
                }
            }
        } else {
            row_sum[i] *= alpha;
            let alpha_v = Vector::<f32, N>::new(alpha);
            #[unroll]
            for c in 0..cq {
                acc[i * cq + c] *= alpha_v;
            }
        }
        row_sum[i] += (tile_sum[0] + tile_sum[1]) + (tile_sum[2] + tile_sum[3]);
        row_max[i] = new_max;
    }

    // Pᵀ: for each of the unit's keys, its rows as vectors of W rows.
    #[unroll]
    for j in 0..kq {
        #[unroll]
        for e in 0..W {
            let key = (j * cfg.tc + unit_col) * W + e;
            #[unroll]
            for qi in 0..rq {
                let mut column = Vector::<f32, N>::empty();
                #[unroll]
                for l in 0..W {
                    column[l] = scores[(qi * W + l) * kq + j][e];
                }
                p_stage[key * cfg.p_pitch() + unit_row * rq + qi] = Vector::cast_from(column);
            }
        }
    }
}

/// `acc[i][c] += sum_j P[row_i][key_j] * V[key_j][col_c]` on vectors of W output columns.
#[cube]
pub(crate) fn thread_value_matmul<P: Float, S: Float, N: Size>(
    p_stage: &SharedMemory<Vector<P, N>>,
    kv_stage: &SharedMemory<Vector<S, N>>,
    acc: &mut Array<Vector<f32, N>>,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let rq = comptime!(cfg.rq());
    let cq = comptime!(cfg.cq());
    let mut p = Array::<Vector<f32, N>>::new(rq);
    let mut vv = Array::<Vector<f32, N>>::new(cq);
    let p_off = unit_row * rq;
    for key in 0..cfg.bk {
        #[unroll]
        for i in 0..rq {
            p[i] = Vector::cast_from(p_stage[key * cfg.p_pitch() + p_off + i]);
        }
        #[unroll]
        for c in 0..cq {
            vv[c] = Vector::cast_from(kv_stage[key * cfg.v_pitch() + c * cfg.tc + unit_col]);
        }
        #[unroll]
        for i in 0..rm {
            let pi = Vector::<f32, N>::new(p[i / W][i % W]);
            #[unroll]
            for c in 0..cq {
                acc[i * cq + c] = fma(pi, vv[c], acc[i * cq + c]);
            }
        }
    }
}

/// Epilogue: reduce the row sums, then `O = acc / l` and `LSE = m·scale + ln l`; rows that saw
/// no key get `O = 0` and `LSE = lse_empty` (-inf).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_results<E: Float, N: Size>(
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    red_stage: &mut SharedMemory<f32>,
    row_max: &Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &Array<Vector<f32, N>>,
    shape: &AttnShape,
    batch: usize,
    head: usize,
    q0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    write_results_seq::<E, N>(
        o, lse, red_stage, row_max, row_sum, acc, shape, &ComptimeOption::new_None(), batch, head, q0, unit_row, unit_col, cfg,
    );
}

/// [`write_results`] into the rows of the cube's sequence (`seq`, or the shape's batch).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_results_seq<E: Float, N: Size>(
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    red_stage: &mut SharedMemory<f32>,
    row_max: &Array<f32>,
    row_sum: &mut Array<f32>,
    acc: &Array<Vector<f32, N>>,
    shape: &AttnShape,
    seq: &ComptimeOption<SeqSpan>,
    batch: usize,
    head: usize,
    q0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let cq = comptime!(cfg.cq());
    cube_row_reduce(row_sum, red_stage, unit_row, unit_col, false, cfg);

    let q_len = seq_q_len(shape, seq);
    let o_base = seq_q_offset(batch, shape.o_s0, shape.o_s2, seq) + head * shape.o_s1 as usize;
    #[unroll]
    for i in 0..rm {
        let row = q0 + unit_row * rm + i;
        if row < q_len {
            let l = row_sum[i];
            let seen = l > 0.0;
            let inv = Vector::<f32, N>::new(select(seen, 1.0 / l, 0.0));
            let o_row = (o_base + row * shape.o_s2 as usize) / W;
            #[unroll]
            for c in 0..cq {
                o[o_row + c * cfg.tc + unit_col] = Vector::cast_from(acc[i * cq + c] * inv);
            }
            if cfg.write_lse {
                if unit_col == 0 {
                    let value = select(
                        seen,
                        row_max[i] * shape.scale + f32::ln(select(seen, l, 1.0)),
                        shape.lse_empty,
                    );
                    lse[seq_lse_index(shape, seq, batch, head, q_len, row)] = value;
                }
            }
        }
    }
}

/// The vector FMA kernel compiled for CUDA offline (no GPU): on CUDA the selection gives it f32
/// inputs (the matrix families take f16 and bf16) and any input type with the family forced.
/// Every head dim and input type, causal with LSE, at the tiling the selection gives on the
/// H100; the other masking and LSE variant at head dim 128; the A100's build of each type.
/// NVRTC must compile each, CubeCL must declare the shared memory the fit check counts, and
/// ptxas must not spill up to head dim 128 (`offline_cuda::prefetch_spill_free`).
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib fma_vec::cuda_tests`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::offline_cuda::{Cover, 
        array, attn_shape_arg, fma_vec_config, head_dims, selected_fma_tiles, settings, prefetch_spill_free, Arch, OfflineCuda, Variant,
    };
    use crate::launch::PortableKernel;
    use crate::Dtype;
    use cubecl::wgpu::WgpuRuntime;

    fn definition(client: &ComputeClient<WgpuRuntime>, dtype: Dtype, stage_f32: bool, cfg: FmaVecConfig) -> KernelDefinition {
        macro_rules! def {
            ($e:ty, $s:ty) => {
                fwd_portable_fma_vec::FwdPortableFmaVec::<$e, $s, WgpuRuntime>::new(
                    settings(cfg.units()),
                    client.clone(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    attn_shape_arg(),
                    W,
                    cfg,
                )
                .define()
            };
        }
        // The launcher's dispatch (`launch`): f32 is staged in f32 whatever the tiling says.
        match (dtype, stage_f32) {
            (Dtype::F32, _) => def!(f32, f32),
            (Dtype::F16, true) => def!(half::f16, f32),
            (Dtype::F16, false) => def!(half::f16, half::f16),
            (Dtype::Bf16, true) => def!(half::bf16, f32),
            (Dtype::Bf16, false) => def!(half::bf16, half::bf16),
        }
    }

    fn varlen_definition(client: &ComputeClient<WgpuRuntime>, dtype: Dtype, stage_f32: bool, cfg: FmaVecConfig) -> KernelDefinition {
        macro_rules! def {
            ($e:ty, $s:ty) => {
                fwd_portable_fma_vec_varlen::FwdPortableFmaVecVarlen::<$e, $s, WgpuRuntime>::new(
                    settings(cfg.units()),
                    client.clone(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    array(),
                    attn_shape_arg(),
                    W,
                    cfg,
                )
                .define()
            };
        }
        // `launch_varlen`'s dispatch.
        match (dtype, stage_f32) {
            (Dtype::F32, _) => def!(f32, f32),
            (Dtype::F16, true) => def!(half::f16, f32),
            (Dtype::F16, false) => def!(half::f16, half::f16),
            (Dtype::Bf16, true) => def!(half::bf16, f32),
            (Dtype::Bf16, false) => def!(half::bf16, half::bf16),
        }
    }

    /// The varlen variant: every input type causal with LSE at head dim 128 on the H100, the
    /// other masking and LSE variant, a `dv != d` build and the A100's build with f16.
    ///
    /// `cargo test --release -p quattn-cubecl --features cuda --lib fma_vec::cuda_tests::nvrtc_compiles_the_varlen`
    #[test]
    fn nvrtc_compiles_the_varlen_variants_with_the_tiling_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let mut cases: Vec<_> = Dtype::ALL.into_iter().map(|dtype| (Arch::Sm90, dtype, 128, 128, true, true)).collect();
        cases.push((Arch::Sm90, Dtype::F16, 128, 128, false, false));
        cases.push((Arch::Sm90, Dtype::F16, 64, 128, true, true));
        cases.push((Arch::Sm80, Dtype::F16, 128, 128, true, true));
        let variants = cases.into_iter().map(|(arch, dtype, d, dv, causal, write_lse)| {
            let tiles = selected_fma_tiles(arch, d, dv, dtype, PortableKernel::Fma);
            let cfg = fma_vec_config(&tiles, d, dv, causal, write_lse, true);
            let formula = PortableKernel::Fma(tiles).smem_bytes(d as u32, dv as u32, dtype);
            Variant {
                name: format!("fma_vec_varlen_{dtype}_d{d}v{dv}_{tiles}_causal{causal}_lse{write_lse}"),
                arch,
                definition: varlen_definition(cuda.client(), dtype, tiles.stage_f32, cfg),
                shared_bytes: Some(formula - 4 * cfg.bq * cfg.tc),
                spill_free: prefetch_spill_free(d, dv),
            }
        });
        cuda.check_all(variants);
    }

    #[test]
    fn nvrtc_compiles_the_cuda_variants_with_the_tiling_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let mut cases = Vec::new();
        for dtype in Dtype::ALL {
            for (d, dv) in head_dims() {
                cases.push((Arch::Sm90, dtype, d, dv, true, true));
            }
            cases.push((Arch::Sm90, dtype, 128, 128, false, false));
            cases.push((Arch::Sm80, dtype, 128, 128, true, true));
        }
        let mut cover = Cover::new();
        let variants = cases.into_iter().filter(|c| cover.take(&[&c.0, &c.1, &c.2, &c.3, &c.4, &c.5])).map(|(arch, dtype, d, dv, causal, write_lse)| {
            let tiles = selected_fma_tiles(arch, d, dv, dtype, PortableKernel::Fma);
            let cfg = fma_vec_config(&tiles, d, dv, causal, write_lse, true);
            // With plane reductions the f32 reduction scratch is unused and dropped.
            let formula = PortableKernel::Fma(tiles).smem_bytes(d as u32, dv as u32, dtype);
            Variant {
                name: format!("fma_vec_{dtype}_d{d}v{dv}_{tiles}_causal{causal}_lse{write_lse}"),
                arch,
                definition: definition(cuda.client(), dtype, tiles.stage_f32, cfg),
                shared_bytes: Some(formula - 4 * cfg.bq * cfg.tc),
                spill_free: prefetch_spill_free(d, dv),
            }
        });
        cuda.check_all(variants);
    }
}
