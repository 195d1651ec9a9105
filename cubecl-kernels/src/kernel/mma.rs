//! Register-resident forward kernel on manual MMA (CubeCL `MmaDefinition`: `mma.sync`
//! m16n8k16 on CUDA), FlashAttention-2 style: f16/bf16 Q·Kᵀ and P·V with f32 accumulation,
//! and the whole online softmax in registers.
//!
//! Checked offline for every tiling of the table (`cuda_tests` at the end: CubeCL's allocator gives exactly
//! `MmaTiles::smem_bytes`; NVRTC for sm_90a with CubeCL's runtime options gives one
//! HMMA.16816.F32 per unrolled MMA, LDSM for every fragment load, no spills), and its lane
//! arithmetic against the PTX fragment layouts on the host (`layout_tests`).
//!
//! Why it exists: the cmma kernel (`cmma.rs`) cannot see which score a lane holds (WMMA
//! fragments are opaque), so it spills every score tile to shared memory, runs the softmax from
//! there, writes P back and rescales O through a scratch. With manual MMA the per-lane layout is
//! known (`MmaDefinition::position_of_nth`), so:
//! - S = Q·Kᵀ stays in the accumulator registers; each lane holds two rows of its 16-row slice
//!   (`g = lane / 4` and `g + 8`), two adjacent keys per 8-key tile. Row max and row sum are a
//!   two-step shuffle inside the lane quad (`lane ^ 1`, `lane ^ 2`); the sum is kept per lane
//!   and reduced once, in the epilogue.
//! - P is converted to f16/bf16 in registers and fed as the A operand of P·V: the f32
//!   accumulator of two adjacent n8 tiles (keys `16c .. 16c+16`) holds exactly the elements of
//!   the m16n8k16 A fragment of key step `c`, in order (checked on the host against the PTX
//!   layouts in the tests below).
//! - O stays in registers; the (lazy, FA4) rescale is a register multiply.
//!
//! Per cube: `warps` planes of 32 lanes; plane `w` owns `16 * mt` query rows for the whole KV
//! walk. Shared memory holds the Q stage (until its fragments are in registers) and then one K
//! and one V stage, rows padded by 8 elements (16 bytes) so that the eight 16-byte rows of an
//! `ldmatrix` phase fall on distinct bank groups. Per KV tile (two cube barriers):
//!
//! 1. issue the global loads of V(t) into registers;
//! 2. S = Q·K(t)ᵀ from the K stage (`ldmatrix.x4`, two k-steps per load), mask where the tile
//!    needs it, online softmax;
//! 3. store V(t) to its stage, issue the global loads of K(t+1); barrier;
//! 4. O += P·V(t) (`ldmatrix.x4.trans`, two n8 tiles per load); store K(t+1); barrier.
//!
//! So every global load has a matrix phase to hide behind without a second shared stage.
//! CubeCL 0.10 has `cp.async` (`copy_async`), but completion is only tracked through a libcu++
//! `cuda::barrier` (`commit_copy_async`), which needs the `cuda/barrier` header at NVRTC time;
//! the register prefetch does without.
//!
//! Numerics are the other kernels': scale folded into one FMA per score inside `exp` (CubeCL
//! 0.10's IR has no `exp2`), finite masking sentinel, lazy rescale with
//! [`LAZY_RESCALE_THRESHOLD`], `O = acc / l`, `LSE = m·scale + ln l`, empty rows `O = 0`,
//! `LSE = lse_empty`.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;

use super::{cube_key_ranges, is_visible, AttnShape, LAZY_RESCALE_THRESHOLD, MASK_THRESHOLD, NO_MAX};

/// Rows of one MMA (and of one m-tile of a plane).
pub(crate) const MMA_M: usize = 16;
/// Columns of one accumulator tile.
pub(crate) const MMA_N: usize = 8;
/// Depth of one MMA.
pub(crate) const MMA_K: usize = 16;
/// Lanes per plane the layouts are written for (validated at launch).
pub(crate) const PLANE: usize = 32;
/// Row padding of the 16-bit stages: 16 bytes, so consecutive rows start on different 16-byte
/// bank groups (a pitch of `d + 8` elements is `16 mod 128` bytes for every supported `d`).
pub(crate) const PAD: usize = 8;
/// `ldmatrix` wants 16-byte aligned rows.
pub(crate) const SMEM_ALIGN: usize = 16;

/// Registers of every fragment hold two elements (one 32-bit register of f16/bf16 pairs, or
/// two f32 accumulators). `launch` checks that the runtime's `MmaProperties` agree.
pub(crate) type Pair = Const<2>;

/// Compile-time key of the mma kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmaFwdConfig {
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// Planes per cube.
    pub warps: usize,
    /// 16-row m-tiles per plane: the K and V fragments loaded from shared memory are reused
    /// `mt` times.
    pub mt: usize,
    /// Keys per KV tile (multiple of 16).
    pub bk: usize,
    /// Elements per global load (the vector width of the Q/K/V arrays).
    pub vec: usize,
    pub causal: bool,
    pub write_lse: bool,
    pub lazy_rescale: bool,
}

impl MmaFwdConfig {
    pub const fn bq(&self) -> usize {
        self.warps * self.mt * MMA_M
    }
    pub const fn units(&self) -> usize {
        self.warps * PLANE
    }
    pub const fn q_pitch(&self) -> usize {
        self.head_dim + PAD
    }
    pub const fn k_pitch(&self) -> usize {
        self.head_dim + PAD
    }
    pub const fn v_pitch(&self) -> usize {
        self.v_head_dim + PAD
    }
    /// k-steps of S = Q·Kᵀ (A fragments of Q per m-tile).
    pub const fn qk_steps(&self) -> usize {
        self.head_dim / MMA_K
    }
    /// n8 tiles of S per m-tile.
    pub const fn s_tiles(&self) -> usize {
        self.bk / MMA_N
    }
    /// k-steps of P·V.
    pub const fn pv_steps(&self) -> usize {
        self.bk / MMA_K
    }
    /// n8 tiles of O per m-tile.
    pub const fn o_tiles(&self) -> usize {
        self.v_head_dim / MMA_N
    }
    pub const fn q_elems(&self) -> usize {
        self.bq() * self.q_pitch()
    }
    pub const fn k_elems(&self) -> usize {
        self.bk * self.k_pitch()
    }
    pub const fn v_elems(&self) -> usize {
        self.bk * self.v_pitch()
    }
    /// Shared memory in bytes: the Q stage is freed once its fragments are in registers, and
    /// the K and V stages take its place. Test-only: the cross-check of `MmaTiles::smem_bytes`,
    /// the one formula selection and launch use.
    #[cfg(test)]
    pub const fn smem_bytes(&self, elem_bytes: usize) -> usize {
        let q = self.q_elems() * elem_bytes;
        let kv = (self.k_elems() + self.v_elems()) * elem_bytes;
        if q > kv {
            q
        } else {
            kv
        }
    }
}

// `exp` lowers to `__expf` only with all three flags; the kernel never produces NaN or infinity
// (masked scores are the finite NO_MAX, and -inf only passes through as the LSE of empty rows).
#[cube(
    launch_unchecked,
    fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
)]
pub fn fwd_mma<E: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<E>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    #[comptime] cfg: MmaFwdConfig,
) {
    let d = cfg.head_dim;
    let bq = comptime!(cfg.bq());
    let plane = UNIT_POS as usize / PLANE;
    let lane = UNIT_POS_PLANE;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q0 = CUBE_POS_X as usize * bq;
    let kv_head = head / shape.group as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    // First query row of this plane.
    let plane_q0 = q0 + plane * comptime!(cfg.mt * MMA_M);

    let q_base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize;
    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    let mut q_stage =
        SharedMemory::<Vector<E, N>>::new_aligned(comptime!(cfg.q_elems() / cfg.vec), SMEM_ALIGN);
    let mut k_stage =
        SharedMemory::<Vector<E, N>>::new_aligned(comptime!(cfg.k_elems() / cfg.vec), SMEM_ALIGN);
    let mut v_stage =
        SharedMemory::<Vector<E, N>>::new_aligned(comptime!(cfg.v_elems() / cfg.vec), SMEM_ALIGN);

    let q_regs = cube_fetch_rows(q, q_base, shape.q_s2 as usize, q0, q_len, bq, d, cfg);
    cube_store_rows(&q_regs, &mut q_stage, bq, d, cfg.q_pitch(), cfg);
    sync_cube();
    let q_frags = plane_load_q::<E, N>(&q_stage, plane, lane, cfg);
    // Every plane has its Q fragments before the stage's memory goes to K and V.
    sync_cube();
    // SAFETY: uniform control flow, and nothing refers to the Q stage past this point.
    unsafe { q_stage.free() };

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
    // Per m-tile and row half (rows g and g + 8): running max at [2m + h], the lane's partial
    // running sum at [2 mt + 2m + h]. An array because cube functions cannot take `&mut f32`.
    let mut stats = Array::<f32>::new(comptime!(4 * cfg.mt));
    #[unroll]
    for i in 0..2 * cfg.mt {
        stats[i] = NO_MAX;
        stats[comptime!(2 * cfg.mt + i)] = 0.0;
    }

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, bq, cfg.bk, cfg.causal);
    if num_tiles > 0 {
        let k_regs = cube_fetch_rows(k, k_base, shape.k_s2 as usize, 0, kv_len, cfg.bk, d, cfg);
        cube_store_rows(&k_regs, &mut k_stage, cfg.bk, d, cfg.k_pitch(), cfg);
        sync_cube();
    }
    for tile in 0..num_full {
        kv_step(
            k, v, &mut k_stage, &mut v_stage, &q_frags, &mut s_frags, &mut o_frags, &mut stats,
            shape, k_base, v_base, tile, num_tiles, plane_q0, lane, false, cfg,
        );
    }
    for tile in num_full..num_tiles {
        kv_step(
            k, v, &mut k_stage, &mut v_stage, &q_frags, &mut s_frags, &mut o_frags, &mut stats,
            shape, k_base, v_base, tile, num_tiles, plane_q0, lane, true, cfg,
        );
    }

    write_results(o, lse, &o_frags, &stats, shape, shape.scale, 1.0f32, batch, head, plane_q0, lane, cfg);
}

/// An f32 accumulator fragment (m16n8) set to zero.
#[cube]
pub(crate) fn acc_zero() -> Array<Vector<f32, Pair>> {
    let mut frag = Array::<Vector<f32, Pair>>::new(2usize);
    frag[0] = Vector::new(0.0f32);
    frag[1] = Vector::new(0.0f32);
    frag
}

/// This unit's share of `rows` rows of `dim` elements starting at `row0`, as global loads
/// issued now and consumed later by [`cube_store_rows`]; rows past `len` are zero. Vector `e`
/// of the tile goes to unit `e % units`; when a step of the cube covers whole rows, a unit
/// keeps its column and moves down a fixed number of rows per step, so its addresses are one
/// base plus a stride (the general case divides per step).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cube_fetch_rows<E: Numeric, N: Size>(
    src: &Array<Vector<E, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] cfg: MmaFwdConfig,
) -> Array<Vector<E, N>> {
    let per_row = comptime!(dim / cfg.vec);
    let count = comptime!(rows * dim / cfg.vec);
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    let unit = UNIT_POS as usize;
    let mut regs = Array::<Vector<E, N>>::new(per_unit);
    if comptime!(cfg.units().is_multiple_of(per_row)) {
        let rows_per_step = comptime!(cfg.units() / per_row);
        // `base` and `row_stride` are multiples of `vec` (the launch picks `vec` so).
        let stride = row_stride / cfg.vec;
        let row = row0 + unit / per_row;
        let start = base / cfg.vec + row * stride + unit % per_row;
        #[unroll]
        for step in 0..per_unit {
            let mut value = Vector::<E, N>::new(E::from_int(0));
            let mut in_tile = true;
            if comptime!(step * cfg.units() + cfg.units() > count) {
                in_tile = step * cfg.units() + unit < count;
            }
            if in_tile && row + step * rows_per_step < len {
                value = src[start + step * rows_per_step * stride];
            }
            regs[step] = value;
        }
    } else {
        #[unroll]
        for step in 0..per_unit {
            let e = step * cfg.units() + unit;
            let row = e / per_row;
            let col = e % per_row;
            let mut value = Vector::<E, N>::new(E::from_int(0));
            if e < count && row0 + row < len {
                value = src[(base + (row0 + row) * row_stride) / cfg.vec + col];
            }
            regs[step] = value;
        }
    }
    regs
}

/// Writes what [`cube_fetch_rows`] loaded into a stage of `pitch`-element rows.
#[cube]
fn cube_store_rows<E: Float, N: Size>(
    regs: &Array<Vector<E, N>>,
    stage: &mut SharedMemory<Vector<E, N>>,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] pitch: usize,
    #[comptime] cfg: MmaFwdConfig,
) {
    let per_row = comptime!(dim / cfg.vec);
    let stage_row = comptime!(pitch / cfg.vec);
    let count = comptime!(rows * dim / cfg.vec);
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    let unit = UNIT_POS as usize;
    if comptime!(cfg.units().is_multiple_of(per_row)) {
        let rows_per_step = comptime!(cfg.units() / per_row);
        let start = (unit / per_row) * stage_row + unit % per_row;
        #[unroll]
        for step in 0..per_unit {
            let mut in_tile = true;
            if comptime!(step * cfg.units() + cfg.units() > count) {
                in_tile = step * cfg.units() + unit < count;
            }
            if in_tile {
                stage[start + comptime!(step * rows_per_step * stage_row)] = regs[step];
            }
        }
    } else {
        #[unroll]
        for step in 0..per_unit {
            let e = step * cfg.units() + unit;
            if e < count {
                stage[(e / per_row) * stage_row + e % per_row] = regs[step];
            }
        }
    }
}

/// Start (in vectors of the stage) of the 16-byte row at (`row`, `col`) of a stage of
/// `pitch`-element rows. Every row and column offset the kernel adds to a lane's own start is a
/// comptime multiple of 8 elements, so it is added after the division, as an immediate: the
/// dozens of `ldmatrix` addresses of a KV step then cost one register, not one each.
#[cube]
pub(crate) fn ldmatrix_start(
    row: usize,
    col: usize,
    #[comptime] pitch: usize,
    #[comptime] vec: usize,
) -> usize {
    (row * pitch + col) / vec
}

/// The plane's Q fragments (A operands), `[m * qk_steps + kc]`, one `ldmatrix.x4` each: lane
/// `l` points at row `l % 16`, columns `8 * (l / 16)` of the 16x16 block (host twin in the
/// layout tests: `ldmatrix_a`).
#[cube]
pub(crate) fn plane_load_q<E: Float, N: Size>(
    q_stage: &SharedMemory<Vector<E, N>>,
    plane: usize,
    lane: u32,
    #[comptime] cfg: MmaFwdConfig,
) -> Sequence<Array<Vector<E, Pair>>> {
    let def = MmaDefinition::<E, E, f32>::new(MMA_M, MMA_N, MMA_K);
    let lane = lane as usize;
    let row = plane * comptime!(cfg.mt * MMA_M) + lane % 16;
    let col = (lane / 16) * 8;
    let mut frags = Sequence::<Array<Vector<E, Pair>>>::new();
    #[unroll]
    for m in 0..cfg.mt {
        #[unroll]
        for kc in 0..cfg.qk_steps() {
            let start =
                ldmatrix_start(row + m * MMA_M, col + kc * MMA_K, cfg.q_pitch(), cfg.vec);
            let frag = def.load_matrix::<Vector<E, N>, Pair>(
                &q_stage.slice(start, start + comptime!(8 / cfg.vec)),
                MatrixIdent::A,
                4usize,
                false,
            );
            frags.push(frag);
        }
    }
    frags
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn kv_step<E: Float, N: Size>(
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    k_stage: &mut SharedMemory<Vector<E, N>>,
    v_stage: &mut SharedMemory<Vector<E, N>>,
    q_frags: &Sequence<Array<Vector<E, Pair>>>,
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    stats: &mut Array<f32>,
    shape: &AttnShape,
    k_base: usize,
    v_base: usize,
    tile: usize,
    num_tiles: usize,
    plane_q0: usize,
    lane: u32,
    #[comptime] masked: bool,
    #[comptime] cfg: MmaFwdConfig,
) {
    let d = cfg.head_dim;
    let dv = cfg.v_head_dim;
    let bk = cfg.bk;
    let kv_len = shape.kv_len as usize;
    let k0 = tile * bk;

    // V(t) is loaded while S is computed; its stage was last read before the previous step's
    // final barrier.
    let v_regs = cube_fetch_rows(v, v_base, shape.v_s2 as usize, k0, kv_len, bk, dv, cfg);

    plane_score_matmul::<E, N>(q_frags, k_stage, s_frags, lane, cfg);
    plane_online_softmax(s_frags, o_frags, stats, shape, shape.scale, plane_q0, k0, lane, masked, cfg);

    cube_store_rows(&v_regs, v_stage, bk, dv, cfg.v_pitch(), cfg);
    // K(t+1) is loaded while P·V runs; past the last tile every load is predicated off.
    let next = tile + 1;
    let has_next = next < num_tiles;
    let k_len = select(has_next, kv_len, 0);
    let k_regs = cube_fetch_rows(k, k_base, shape.k_s2 as usize, next * bk, k_len, bk, d, cfg);
    // V(t) is visible, and every plane is done reading K(t).
    sync_cube();

    plane_value_matmul::<E, N>(s_frags, v_stage, o_frags, lane, cfg);
    cube_store_rows(&k_regs, k_stage, bk, d, cfg.k_pitch(), cfg);
    // K(t+1) is visible, and every plane is done reading V(t).
    sync_cube();
}

/// S (`16 mt x bk`) = Q·K(t)ᵀ into the zeroed accumulators `[m * s_tiles + j]`. The B operand
/// of key tile `j` and k-step `kc` is K rows `8j .. 8j+8`, columns `16 kc .. 16 kc + 16`
/// (Kᵀ column-major is K row-major): one `ldmatrix.x4` (no transpose) gives the B fragments of
/// two consecutive k-steps (host twin in the layout tests: `ldmatrix_k`).
#[cube]
pub(crate) fn plane_score_matmul<E: Float, N: Size>(
    q_frags: &Sequence<Array<Vector<E, Pair>>>,
    k_stage: &SharedMemory<Vector<E, N>>,
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    lane: u32,
    #[comptime] cfg: MmaFwdConfig,
) {
    let def = MmaDefinition::<E, E, f32>::new(MMA_M, MMA_N, MMA_K);
    let lane = lane as usize;
    let lane_start = ldmatrix_start(lane % 8, (lane / 8) * 8, cfg.k_pitch(), cfg.vec);
    let st = cfg.s_tiles();
    let qk = cfg.qk_steps();
    #[unroll]
    for i in 0..cfg.mt * cfg.s_tiles() {
        let frag = s_frags.index_mut(i);
        frag[0] = Vector::new(0.0f32);
        frag[1] = Vector::new(0.0f32);
    }
    #[unroll]
    for j in 0..cfg.s_tiles() {
        #[unroll]
        for kp in 0..cfg.qk_steps() / 2 {
            let start =
                lane_start + comptime!((j * MMA_N * cfg.k_pitch() + kp * 2 * MMA_K) / cfg.vec);
            let b4 = def.load_matrix::<Vector<E, N>, Pair>(
                &k_stage.slice(start, start + comptime!(8 / cfg.vec)),
                MatrixIdent::B,
                4usize,
                false,
            );
            let mut b_lo = Array::<Vector<E, Pair>>::new(2usize);
            let mut b_hi = Array::<Vector<E, Pair>>::new(2usize);
            b_lo[0] = b4[0];
            b_lo[1] = b4[1];
            b_hi[0] = b4[2];
            b_hi[1] = b4[3];
            #[unroll]
            for m in 0..cfg.mt {
                def.execute_inplace(
                    q_frags.index(comptime!(m * qk + 2 * kp)),
                    &b_lo,
                    s_frags.index_mut(comptime!(m * st + j)),
                );
                def.execute_inplace(
                    q_frags.index(comptime!(m * qk + 2 * kp + 1)),
                    &b_hi,
                    s_frags.index_mut(comptime!(m * st + j)),
                );
            }
        }
    }
}

/// Online softmax of the plane's score tile, in registers, with softmax scale `scale`. Vector `h` of accumulator tile `j`
/// holds row `g + 8h` (g = lane / 4), keys `8j + 2t, 8j + 2t + 1` (t = lane % 4); the four
/// lanes of a quad share the rows, so the row max is two shuffles. Scores become
/// probabilities in place; the output fragments are rescaled when a row max moved.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn plane_online_softmax(
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    stats: &mut Array<f32>,
    shape: &AttnShape,
    scale: f32,
    plane_q0: usize,
    k0: usize,
    lane: u32,
    #[comptime] masked: bool,
    #[comptime] cfg: MmaFwdConfig,
) {
    let st = cfg.s_tiles();
    let mut alpha = Array::<f32>::new(comptime!(2 * cfg.mt));
    let mut moved = false;
    #[unroll]
    for m in 0..cfg.mt {
        #[unroll]
        for h in 0..2usize {
            let tile_max = plane_masked_row_max(s_frags, shape, plane_q0, k0, lane, m, h, masked, cfg);
            let old_max = stats[comptime!(2 * m + h)];
            let mut new_max = max(old_max, tile_max);
            if cfg.lazy_rescale {
                new_max =
                    select((tile_max - old_max) * scale > LAZY_RESCALE_THRESHOLD, tile_max, old_max);
            }
            let neg_scaled_max = -new_max * scale;
            let mut tile_sum = 0.0f32;
            #[unroll]
            for j in 0..cfg.s_tiles() {
                let frag = s_frags.index_mut(comptime!(m * st + j));
                let mut x = frag[h];
                #[unroll]
                for e in 0..2usize {
                    let mut p = f32::exp(fma(x[e], scale, neg_scaled_max));
                    if masked {
                        p = select(x[e] > MASK_THRESHOLD, p, 0.0);
                    }
                    x[e] = p;
                    tile_sum += p;
                }
                frag[h] = x;
            }
            let a = f32::exp((old_max - new_max) * scale);
            alpha[comptime!(2 * m + h)] = a;
            let sum_idx = comptime!(2 * cfg.mt + 2 * m + h);
            stats[sum_idx] = stats[sum_idx] * a + tile_sum;
            stats[comptime!(2 * m + h)] = new_max;
            moved = moved || new_max != old_max;
        }
    }
    plane_rescale_o(o_frags, &alpha, moved, cfg);
}

/// The max over the plane's score tile of row `g + 8h` of m-tile `m` (vector `h` of its
/// accumulator tiles, reduced over the quad), with the elements a mask hides (`masked`) set to
/// `NO_MAX` in the fragments first. The raw scores' max: the caller scales it.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn plane_masked_row_max(
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    shape: &AttnShape,
    plane_q0: usize,
    k0: usize,
    lane: u32,
    #[comptime] m: usize,
    #[comptime] h: usize,
    #[comptime] masked: bool,
    #[comptime] cfg: MmaFwdConfig,
) -> f32 {
    let def = MmaDefinition::<f32, f32, f32>::new(MMA_M, MMA_N, MMA_K);
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let st = cfg.s_tiles();
    let mut tile_max = NO_MAX.runtime();
    #[unroll]
    for j in 0..cfg.s_tiles() {
        let frag = s_frags.index_mut(comptime!(m * st + j));
        let mut x = frag[h];
        if masked {
            #[unroll]
            for e in 0..2usize {
                // CubeCL's own (row, column) of this accumulator element.
                let (r, c) = def.position_of_nth(lane, comptime!((2 * h + e) as u32), MatrixIdent::Accumulator);
                let row = plane_q0 + m * MMA_M + r as usize;
                let key = k0 + j * MMA_N + c as usize;
                let visible = is_visible(row, key, q_len, kv_len, cfg.causal);
                x[e] = select(visible, x[e], NO_MAX);
            }
            frag[h] = x;
        }
        tile_max = max(tile_max, max(x[0], x[1]));
    }
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 1u32));
    max(tile_max, plane_shuffle_xor(tile_max, 2u32))
}

/// O *= `alpha` per row (entry `2m + h`: row `g + 8h` of m-tile `m`), skipped under the lazy
/// rescale unless some row of the plane `moved`.
#[cube]
pub(crate) fn plane_rescale_o(
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    alpha: &Array<f32>,
    moved: bool,
    #[comptime] cfg: MmaFwdConfig,
) {
    let mut rescale = true;
    if cfg.lazy_rescale {
        rescale = plane_any(moved);
    }
    if rescale {
        let ot = cfg.o_tiles();
        #[unroll]
        for m in 0..cfg.mt {
            #[unroll]
            for n in 0..cfg.o_tiles() {
                let frag = o_frags.index_mut(comptime!(m * ot + n));
                #[unroll]
                for h in 0..2usize {
                    frag[h] = frag[h] * Vector::new(alpha[comptime!(2 * m + h)]);
                }
            }
        }
    }
}

/// O (`16 mt x dv`) += P·V(t). P's A fragment of key step `c` is the converted accumulators of
/// S tiles `2c` and `2c + 1` (vectors 0, 1 of each: rows g and g + 8); V's B fragments of two
/// adjacent n8 tiles come from one `ldmatrix.x4.trans` (host twin in the layout tests: `ldmatrix_v`).
#[cube]
pub(crate) fn plane_value_matmul<E: Float, N: Size>(
    s_frags: &Sequence<Array<Vector<f32, Pair>>>,
    v_stage: &SharedMemory<Vector<E, N>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    lane: u32,
    #[comptime] cfg: MmaFwdConfig,
) {
    let def = MmaDefinition::<E, E, f32>::new(MMA_M, MMA_N, MMA_K);
    let lane = lane as usize;
    let lane_start = ldmatrix_start(lane % 16, (lane / 16) * 8, cfg.v_pitch(), cfg.vec);
    let st = cfg.s_tiles();
    let ot = cfg.o_tiles();
    #[unroll]
    for c in 0..cfg.pv_steps() {
        let mut p_frags = Sequence::<Array<Vector<E, Pair>>>::new();
        #[unroll]
        for m in 0..cfg.mt {
            let lo = s_frags.index(comptime!(m * st + 2 * c));
            let hi = s_frags.index(comptime!(m * st + 2 * c + 1));
            let mut a = Array::<Vector<E, Pair>>::new(4usize);
            a[0] = Vector::<E, Pair>::cast_from(lo[0]);
            a[1] = Vector::<E, Pair>::cast_from(lo[1]);
            a[2] = Vector::<E, Pair>::cast_from(hi[0]);
            a[3] = Vector::<E, Pair>::cast_from(hi[1]);
            p_frags.push(a);
        }
        #[unroll]
        for np in 0..cfg.o_tiles() / 2 {
            let start =
                lane_start + comptime!((c * MMA_K * cfg.v_pitch() + np * 2 * MMA_N) / cfg.vec);
            let b4 = def.load_matrix::<Vector<E, N>, Pair>(
                &v_stage.slice(start, start + comptime!(8 / cfg.vec)),
                MatrixIdent::B,
                4usize,
                true,
            );
            let mut b_lo = Array::<Vector<E, Pair>>::new(2usize);
            let mut b_hi = Array::<Vector<E, Pair>>::new(2usize);
            b_lo[0] = b4[0];
            b_lo[1] = b4[1];
            b_hi[0] = b4[2];
            b_hi[1] = b4[3];
            #[unroll]
            for m in 0..cfg.mt {
                def.execute_inplace(
                    p_frags.index(m),
                    &b_lo,
                    o_frags.index_mut(comptime!(m * ot + 2 * np)),
                );
                def.execute_inplace(
                    p_frags.index(m),
                    &b_hi,
                    o_frags.index_mut(comptime!(m * ot + 2 * np + 1)),
                );
            }
        }
    }
}

/// Epilogue: the quad reduces its partial row sums, `O = acc · (o_factor / l)` straight from the
/// registers (each lane writes its two adjacent columns of rows g and g + 8), `LSE = m·scale +
/// ln l` by the quad's first lane; rows that saw no key get `O = 0` and `LSE = lse_empty`.
/// `scale` is the softmax's (the FP8 kernel folds its Q·K descales into it), `o_factor` a
/// constant factor of every P·V product (1, or the FP8 kernel's V descale).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_results<E: Float>(
    o: &mut Array<E>,
    lse: &mut Array<f32>,
    o_frags: &Sequence<Array<Vector<f32, Pair>>>,
    stats: &Array<f32>,
    shape: &AttnShape,
    scale: f32,
    o_factor: f32,
    batch: usize,
    head: usize,
    plane_q0: usize,
    lane: u32,
    #[comptime] cfg: MmaFwdConfig,
) {
    let def = MmaDefinition::<f32, f32, f32>::new(MMA_M, MMA_N, MMA_K);
    let q_len = shape.q_len as usize;
    let o_base = batch * shape.o_s0 as usize + head * shape.o_s1 as usize;
    let o_s2 = shape.o_s2 as usize;
    let ot = cfg.o_tiles();
    #[unroll]
    for m in 0..cfg.mt {
        #[unroll]
        for h in 0..2usize {
            let mut l = stats[comptime!(2 * cfg.mt + 2 * m + h)];
            l += plane_shuffle_xor(l, 1u32);
            l += plane_shuffle_xor(l, 2u32);
            let seen = l > 0.0;
            let inv = select(seen, o_factor / l, 0.0);
            let (r, c0) = def.position_of_nth(lane, comptime!((2 * h) as u32), MatrixIdent::Accumulator);
            let row = plane_q0 + m * MMA_M + r as usize;
            if row < q_len {
                if cfg.write_lse {
                    if c0 == 0 {
                        let value = select(
                            seen,
                            stats[comptime!(2 * m + h)] * scale + f32::ln(select(seen, l, 1.0)),
                            shape.lse_empty,
                        );
                        lse[(batch * shape.q_heads as usize + head) * q_len + row] = value;
                    }
                }
                let row_base = o_base + row * o_s2 + c0 as usize;
                #[unroll]
                for n in 0..cfg.o_tiles() {
                    let x = o_frags.index(comptime!(m * ot + n))[h];
                    o[row_base + n * MMA_N] = E::cast_from(x[0] * inv);
                    o[row_base + n * MMA_N + 1] = E::cast_from(x[1] * inv);
                }
            }
        }
    }
}

#[cfg(test)]
mod layout_tests {
    //! The fragment layouts of `mma.sync.m16n8k16` with 16-bit inputs and f32 accumulators, as
    //! the PTX ISA states them (section "Matrix Fragments for mma.m16n8k16 with floating point
    //! type"), and the behaviour of `ldmatrix` (thread `l` supplies row `l % 8` of matrix
    //! `l / 8`; thread `4g + t` receives row `g`, elements `2t, 2t + 1` of each matrix, or of
    //! its transpose with `.trans`). CubeCL's CUDA `position_of_nth` lowering says the same
    //! (cubecl-cpp `cuda/processors.rs`); the kernel's masking uses that one directly.
    use super::*;

    // Host twins of the kernel's lane -> (row, column) arithmetic for `ldmatrix` (the same
    // expressions as in `plane_load_q`, `plane_score_matmul` and `plane_value_matmul`).

    /// Row and column (elements, inside the 16x16 Q block) of the 16-byte row lane `lane` hands
    /// to the Q `ldmatrix.x4`.
    const fn ldmatrix_a(lane: usize) -> (usize, usize) {
        (lane % 16, (lane / 16) * 8)
    }

    /// Row (key, inside the 8-key tile) and column (head dim, inside the 32-wide pair of k-steps)
    /// lane `lane` hands to the K `ldmatrix.x4`.
    const fn ldmatrix_k(lane: usize) -> (usize, usize) {
        (lane % 8, (lane / 8) * 8)
    }

    /// Row (key, inside the 16-key step) and column (inside the 16-wide pair of n8 tiles) lane
    /// `lane` hands to the V `ldmatrix.x4.trans`.
    const fn ldmatrix_v(lane: usize) -> (usize, usize) {
        (lane % 16, (lane / 16) * 8)
    }

    /// (row, col) of element `i` (0..8) of lane `lane`'s A fragment (16 x 16).
    fn a_elem(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        let row = g + 8 * ((i / 2) % 2);
        let col = 2 * t + i % 2 + 8 * (i / 4);
        (row, col)
    }

    /// (row k, col n) of element `i` (0..4) of lane `lane`'s B fragment (16 x 8).
    fn b_elem(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        (2 * t + i % 2 + 8 * (i / 2), g)
    }

    /// (row, col) of element `i` (0..4) of lane `lane`'s accumulator (16 x 8).
    fn c_elem(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        (g + 8 * (i / 2), 2 * t + i % 2)
    }

    /// Simulates `ldmatrix.x4` on a row-major matrix `at(row, col)`: lane `l` points at
    /// `addr(l)` = (row, col) of an 8-element row; returns the 4 x 2 elements lane `lane`
    /// receives.
    fn ldmatrix_x4(
        at: impl Fn(usize, usize) -> u32,
        addr: impl Fn(usize) -> (usize, usize),
        trans: bool,
        lane: usize,
    ) -> [[u32; 2]; 4] {
        let (g, t) = (lane / 4, lane % 4);
        let mut out = [[0; 2]; 4];
        for (m, regs) in out.iter_mut().enumerate() {
            for (e, value) in regs.iter_mut().enumerate() {
                // Element (r, c) of 8x8 matrix m lives in the row supplied by lane 8m + r.
                let (r, c) = if trans { (2 * t + e, g) } else { (g, 2 * t + e) };
                let (row, col) = addr(8 * m + r);
                *value = at(row, col + c);
            }
        }
        out
    }

    /// A distinct value per (row, col).
    fn id(row: usize, col: usize) -> u32 {
        (row * 1000 + col) as u32
    }

    #[test]
    fn q_ldmatrix_gives_the_a_fragment() {
        for lane in 0..PLANE {
            let regs = ldmatrix_x4(id, ldmatrix_a, false, lane);
            for i in 0..8 {
                let (row, col) = a_elem(lane, i);
                assert_eq!(regs[i / 2][i % 2], id(row, col), "lane {lane} elem {i}");
            }
        }
    }

    #[test]
    fn k_ldmatrix_gives_two_b_fragments_of_k_transposed() {
        // B = Kᵀ: B[kk][n] = K[n][kk]; K row-major [key][d]. Registers 0-1 are the k-step at
        // columns 0..16, registers 2-3 the one at 16..32.
        for lane in 0..PLANE {
            let regs = ldmatrix_x4(id, ldmatrix_k, false, lane);
            for step in 0..2 {
                for i in 0..4 {
                    let (kk, n) = b_elem(lane, i);
                    let want = id(n, 16 * step + kk);
                    assert_eq!(regs[2 * step + i / 2][i % 2], want, "lane {lane} step {step} elem {i}");
                }
            }
        }
    }

    #[test]
    fn v_ldmatrix_trans_gives_two_b_fragments_of_v() {
        // B = V: B[kk][n] = V[key kk][col n]; registers 0-1 are n8 tile 0, 2-3 tile 1.
        for lane in 0..PLANE {
            let regs = ldmatrix_x4(id, ldmatrix_v, true, lane);
            for tile in 0..2 {
                for i in 0..4 {
                    let (kk, n) = b_elem(lane, i);
                    let want = id(kk, 8 * tile + n);
                    assert_eq!(regs[2 * tile + i / 2][i % 2], want, "lane {lane} tile {tile} elem {i}");
                }
            }
        }
    }

    #[test]
    fn two_accumulator_tiles_are_the_next_a_fragment() {
        // P's A fragment (16 x 16 keys) from S tiles 2c (keys 0..8) and 2c+1 (keys 8..16): A
        // register r (elements 2r, 2r+1) = tile r / 2, vector r % 2 (elements 2(r%2), +1).
        for lane in 0..PLANE {
            for i in 0..8 {
                let (reg, e) = (i / 2, i % 2);
                let (tile, vector) = (reg / 2, reg % 2);
                let (row, col) = c_elem(lane, 2 * vector + e);
                assert_eq!(a_elem(lane, i), (row, 8 * tile + col), "lane {lane} elem {i}");
            }
        }
    }

    #[test]
    fn accumulator_rows_are_shared_by_lane_quads() {
        // The softmax's two shuffles (xor 1, xor 2) reduce over exactly the lanes of a row, and
        // vector h of a tile is one row (g + 8h).
        for lane in 0..PLANE {
            for h in 0..2 {
                let row = c_elem(lane, 2 * h).0;
                assert_eq!(row, c_elem(lane, 2 * h + 1).0);
                let sharing: Vec<usize> =
                    (0..PLANE).filter(|&l| c_elem(l, 2 * h).0 == row).collect();
                let quad: Vec<usize> = (0..4).map(|x| lane ^ x).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
                assert_eq!(sharing, quad, "lane {lane} h {h}");
            }
        }
        // The epilogue's LSE writer (column 0 of the row) is the quad's first lane.
        for lane in 0..PLANE {
            assert_eq!(c_elem(lane, 0).1 == 0, lane % 4 == 0);
        }
    }
}

/// The kernel expanded and compiled for CUDA offline, for every tiling of the table (and one
/// `dv != d`), causal and not, both rescale modes: CubeCL's allocator gives it exactly
/// [`MmaTiles::smem_bytes`](crate::MmaTiles::smem_bytes), and the source has the `mma.sync`
/// and `ldmatrix` calls. Nothing is launched: a wgpu adapter (llvmpipe will do) is only needed
/// to expand the kernel, with wgpu's MMA register layout, which the test checks is CUDA's.
/// `QUATTN_MMA_CUDA_DIR=<dir>` also writes the CUDA sources there. The NVRTC compile and SASS
/// check of the same sources is `nvrtc_sass` below.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib mma`
#[cfg(all(test, feature = "cuda"))]
pub(crate) mod cuda_tests {
    use super::*;
    use crate::kernel::AttnShapeCompilationArg;
    use crate::problem::SUPPORTED_HEAD_DIMS;
    use crate::tiling::mma_candidates;
    use crate::{Dtype as ElemType, MmaTiles};
    use crate::kernel::offline_cuda::{client, cuda_include_dir, nvrtc_cubin, ADDR, COMPILE_LOCK};
    use cubecl::cuda::{CudaCompiler, CudaRuntime};
    use cubecl::wgpu::WgpuRuntime;
    use cubecl::Compiler as _;

    /// Every table entry at every head dim (and one dv != d); `all_modes` adds non-causal and
    /// eager-rescale variants of each.
    pub(crate) fn configs(all_modes: bool) -> Vec<MmaFwdConfig> {
        let mut dims: Vec<(usize, usize)> =
            SUPPORTED_HEAD_DIMS.iter().map(|&d| (d as usize, d as usize)).collect();
        dims.push((64, 128));
        let modes: &[(bool, bool)] =
            if all_modes { &[(true, true), (false, true), (true, false)] } else { &[(true, true)] };
        let mut out = Vec::new();
        for (d, dv) in dims {
            for t in mma_candidates(d.max(dv) as u32) {
                for &(causal, lazy_rescale) in modes {
                    out.push(MmaFwdConfig {
                        head_dim: d,
                        v_head_dim: dv,
                        warps: t.warps as usize,
                        mt: t.mt as usize,
                        bk: t.bk as usize,
                        vec: 8,
                        causal,
                        write_lse: true,
                        lazy_rescale,
                    });
                }
            }
        }
        out
    }

    pub(crate) fn name(cfg: &MmaFwdConfig, elem: &str) -> String {
        format!(
            "mma_{elem}_d{}v{}_w{}_mt{}_bk{}_causal{}_lazy{}",
            cfg.head_dim, cfg.v_head_dim, cfg.warps, cfg.mt, cfg.bk, cfg.causal, cfg.lazy_rescale
        )
    }

    fn expected(cfg: &MmaFwdConfig) -> usize {
        let tiles = MmaTiles { warps: cfg.warps as u32, mt: cfg.mt as u32, bk: cfg.bk as u32 };
        tiles.smem_bytes(cfg.head_dim as u32, cfg.v_head_dim as u32, 2) as usize
    }

    fn definition<E: Float + CubeElement>(
        client: &ComputeClient<WgpuRuntime>,
        cfg: MmaFwdConfig,
    ) -> KernelDefinition {
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
        let settings = KernelSettings::default()
            .cube_dim(CubeDim::new_1d(cfg.units() as u32))
            .address_type(AddressType::U32);
        fwd_mma::FwdMma::<E, WgpuRuntime>::new(
            settings,
            client.clone(),
            array(),
            array(),
            array(),
            array(),
            array(),
            shape,
            cfg.vec,
            cfg,
        )
        .define()
    }

    /// CUDA C++ sources of the configurations, f16 and bf16, with their names.
    pub(crate) fn cuda_sources(all_modes: bool) -> Option<Vec<(String, MmaFwdConfig, String, usize)>> {
        let client = client()?;
        // What CubeCL's CUDA runtime compiles with on sm_90 (cubecl-cuda `runtime.rs`): fast
        // math (`exp` -> `__expf` under the kernel's flags), grid constants, clusters.
        let mut options = <CudaCompiler as cubecl::Compiler>::CompilationOptions::default();
        options.supports_features.fast_math = true;
        options.supports_features.grid_constants = true;
        options.supports_features.clusters = true;
        options.supports_features.elect_sync = true;
        let mut out = Vec::new();
        let _serial = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for cfg in configs(all_modes) {
            for elem in ["f16", "bf16"] {
                let def = match elem {
                    "f16" => definition::<half::f16>(&client, cfg),
                    _ => definition::<half::bf16>(&client, cfg),
                };
                let kernel = CudaCompiler::default()
                    .compile(def, &options, ExecutionMode::Unchecked, ADDR)
                    .unwrap();
                out.push((name(&cfg, elem), cfg, kernel.to_string(), kernel.shared_memory_size()));
            }
        }
        Some(out)
    }

    #[test]
    fn expansion_layout_is_cudas() {
        for elem in [ElemType::F16, ElemType::Bf16] {
            assert_eq!(crate::launch::mma_layout_mismatch::<CudaRuntime>(elem), None);
            assert_eq!(crate::launch::mma_layout_mismatch::<WgpuRuntime>(elem), None);
        }
    }

    #[test]
    fn cuda_shared_memory_is_the_tiling_formula_and_mma_sync_is_used() {
        let Some(sources) = cuda_sources(true) else {
            return;
        };
        let dump = std::env::var_os("QUATTN_MMA_CUDA_DIR").map(std::path::PathBuf::from);
        for (name, cfg, source, smem) in sources {
            assert_eq!(smem, expected(&cfg), "{name}");
            assert!(source.contains("__mma_m16n8k16_"), "{name}: no manual mma call");
            assert!(source.contains("__ldmatrix_"), "{name}: no ldmatrix call");
            assert!(!source.contains("wmma::"), "{name}: WMMA fragments in the mma kernel");
            assert!(source.contains("__expf("), "{name}: exp is not the fast one");
            if let Some(dir) = &dump {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(dir.join(format!("{name}.cu")), source).unwrap();
            }
        }
    }

    /// Every table entry, f16 and bf16, compiled by NVRTC for sm_90a (what CubeCL's CUDA
    /// runtime asks for on an H100) and disassembled: every MMA of the unrolled loops is an
    /// HMMA.16816.F32 (two KV-step specializations: unmasked and masked), the fragments come
    /// through LDSM, and ptxas spills nothing. Skips (saying why) without NVRTC, the CUDA
    /// headers or a disassembler.
    #[test]
    fn nvrtc_sm90_hmma_and_no_spills() {
        // Skips (saying why) on a developer machine without the tools; under CI, where
        // .ci/install-cuda-tools.sh installs them, a missing tool is a failure.
        let skip = |why: String| {
            assert!(std::env::var_os("CI").is_none(), "CUDA tools required under CI: {why}");
            println!("SKIPPED: {why}");
        };
        let Some(include) = cuda_include_dir() else {
            return skip(
                "no CUDA headers (cuda_fp16.h); set CUDA_HOME or `pip install nvidia-cuda-runtime \
                 nvidia-cuda-crt` next to nvidia-cuda-nvrtc (.ci/install-cuda-tools.sh does)"
                    .into(),
            );
        };
        if let Err(e) = quattn_native::nvrtc() {
            return skip(e.to_string());
        }
        if quattn_native::tools::find_any_disassembler().is_none() {
            return skip("no cuobjdump / nvdisasm".into());
        }
        let Some(sources) = cuda_sources(false) else {
            return;
        };
        let options = vec![
            "--gpu-architecture=sm_90a".to_string(),
            format!("--include-path={}", include.display()),
            "--std=c++17".to_string(),
            "-Xptxas=-v".to_string(),
        ];
        let mut failures = Vec::new();
        let mut cover = crate::kernel::offline_cuda::Cover::new();
        for (name, cfg, source, _) in sources {
            let elem = name.split('_').nth(1).unwrap_or_default().to_string();
            if !cover.take(&[&(cfg.head_dim, cfg.v_head_dim), &(cfg.warps, cfg.mt, cfg.bk), &elem]) {
                continue;
            }
            let (cubin, log) = nvrtc_cubin(&source, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            let res = quattn_native::Resources::parse_ptxas_log(&log)
                .unwrap_or_else(|| panic!("{name}: no ptxas report in {log}"));
            let sass = quattn_native::sass::disassemble(&cubin).unwrap();
            let hist = quattn_native::sass::opcode_histogram(&sass);
            let count = |prefix: &str| -> usize {
                hist.iter().filter(|(op, _)| op.starts_with(prefix)).map(|(_, n)| n).sum()
            };
            let hmma = count("HMMA.16816.F32");
            let per_step = cfg.mt * (cfg.s_tiles() * cfg.qk_steps() + cfg.pv_steps() * cfg.o_tiles());
            let ldsm = count("LDSM");
            println!(
                "{name}: {} registers, {} B spilled, {hmma} HMMA (expected {}), {ldsm} LDSM, {} LDL/STL",
                res.registers,
                res.spill_bytes(),
                2 * per_step,
                count("LDL") + count("STL"),
            );
            for l in quattn_native::sass::loops(&sass) {
                println!("  loop {:#x}-{:#x}: {}", l.start, l.end, l.summary(14));
            }
            if hmma != 2 * per_step || ldsm == 0 || res.spill_bytes() != 0 {
                failures.push(name);
            }
        }
        assert!(failures.is_empty(), "HMMA count, LDSM or spills wrong for: {failures:?}");
    }
}
