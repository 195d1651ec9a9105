//! Matrix-unit forward kernel (CubeCL `cmma`: WMMA on CUDA): f16/bf16 Q·Kᵀ and P·V on 16x16x16
//! tiles with f32 accumulation; softmax in f32 on the CUDA cores.
//!
//! Per cube: `warps` planes of 32 units; plane `w` owns query rows `16w .. 16w+16` for the
//! whole KV walk, so the only cube-wide barriers are around the K/V stage loads.
//! - global: stage Q once (its fragments then live in registers, and its shared memory is freed
//!   for the K, V, P stages and the scratch), walk KV tiles like the FMA kernel (unmasked tiles
//!   first, then the masked tail).
//! - stage, per KV tile: `score_matmul` into accumulator fragments, spilled to a per-plane f32
//!   scratch; `online_softmax` with two lanes per row (pair max by shuffle), P written to shared
//!   memory in the input type; `value_matmul` on the output fragments.
//! - The output fragments' element layout is opaque, so a rescale goes through the scratch
//!   (store, scale rows, reload), two fragments (32 columns) at a time so that the scratch is
//!   only as wide as the score tile. With the lazy (FA4) rescale the plane skips it unless one
//!   of its 16 rows grew past the threshold, which after the first tiles is rare.
//!
//! Shared memory is `max(Q, K + V + P + scratch)`: CubeCL's allocator places the later buffers
//! over the freed Q stage (every buffer is a multiple of 32 bytes, so they pack without gaps);
//! [`CmmaConfig::smem_bytes`] is that sum and `CmmaTiles::smem_bytes` must agree with it.

use cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use cubecl::prelude::*;

use super::{cube_key_ranges, is_visible, AttnShape, LAZY_RESCALE_THRESHOLD, MASK_THRESHOLD, NO_MAX};

/// Matrix-unit tile edge (m = n = k).
const MMA: usize = 16;
/// Lanes per plane the kernel is written for (validated at launch).
const PLANE: usize = 32;
/// Output columns per pass through the scratch (rescale and epilogue): one per lane of a plane,
/// two fragments. `bk` (a multiple of 32) is never narrower, so the score-wide scratch holds
/// them, and every supported `dv` is a multiple.
const O_COLS: usize = PLANE;

/// Compile-time key of the cmma kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmmaConfig {
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// Planes per cube; each owns 16 query rows.
    pub warps: usize,
    /// Keys per KV tile (multiple of 32: each lane of a row pair takes half).
    pub bk: usize,
    /// Elements per global load (the vector width of the Q/K/V arrays).
    pub vec: usize,
    pub causal: bool,
    pub write_lse: bool,
    pub lazy_rescale: bool,
}

/// Row padding (elements) of the 16-bit stages: 16 bytes, the smallest that keeps WMMA's
/// 32-byte fragment alignment while moving consecutive rows off the same banks.
const PAD16: usize = 8;
/// Row padding of the f32 scratch (16 bytes).
const PAD32: usize = 4;
/// WMMA loads and stores need 32-byte aligned fragment pointers.
const SMEM_ALIGN: usize = 32;

impl CmmaConfig {
    pub const fn q_pitch(&self) -> usize {
        self.head_dim + PAD16
    }
    pub const fn k_pitch(&self) -> usize {
        self.head_dim + PAD16
    }
    pub const fn v_pitch(&self) -> usize {
        self.v_head_dim + PAD16
    }
    pub const fn p_pitch(&self) -> usize {
        self.bk + PAD16
    }
    /// Pitch of the f32 scratch: 16 rows of scores (`bk` wide), or of `O_COLS` output columns.
    pub const fn s_pitch(&self) -> usize {
        self.bk + PAD32
    }
    pub const fn bq(&self) -> usize {
        self.warps * MMA
    }
    pub const fn units(&self) -> usize {
        self.warps * PLANE
    }
    /// f32 scratch per plane: 16 rows of scores (`bk` wide, at least `O_COLS`).
    pub const fn scratch_per_plane(&self) -> usize {
        MMA * self.s_pitch()
    }

    /// Elements of each shared buffer, as allocated by the kernel: Q, K, V (vectors of `vec`),
    /// P (input type) and the scratch (f32).
    pub const fn q_elems(&self) -> usize {
        self.bq() * self.q_pitch()
    }
    pub const fn k_elems(&self) -> usize {
        self.bk * self.k_pitch()
    }
    pub const fn v_elems(&self) -> usize {
        self.bk * self.v_pitch()
    }
    pub const fn p_elems(&self) -> usize {
        self.bq() * self.p_pitch()
    }
    pub const fn scratch_elems(&self) -> usize {
        self.warps * self.scratch_per_plane()
    }

    /// Shared memory of the kernel in bytes for `elem_bytes`-sized inputs: the Q stage is freed
    /// once its fragments are loaded, so the other four buffers reuse it. Test-only: the
    /// cross-check of `CmmaTiles::smem_bytes`, the one formula selection and launch use.
    #[cfg(test)]
    pub const fn smem_bytes(&self, elem_bytes: usize) -> usize {
        let q = self.q_elems() * elem_bytes;
        let rest = (self.k_elems() + self.v_elems() + self.p_elems()) * elem_bytes
            + self.scratch_elems() * 4;
        if q > rest {
            q
        } else {
            rest
        }
    }

    /// Whether every buffer is a whole number of `SMEM_ALIGN` blocks (so the allocator leaves no
    /// alignment gaps and [`Self::smem_bytes`] is exact).
    #[cfg(test)]
    pub const fn buffers_aligned(&self, elem_bytes: usize) -> bool {
        (self.q_elems() * elem_bytes).is_multiple_of(SMEM_ALIGN)
            && (self.k_elems() * elem_bytes).is_multiple_of(SMEM_ALIGN)
            && (self.v_elems() * elem_bytes).is_multiple_of(SMEM_ALIGN)
            && (self.p_elems() * elem_bytes).is_multiple_of(SMEM_ALIGN)
            && (self.scratch_elems() * 4).is_multiple_of(SMEM_ALIGN)
    }
}

// `exp` lowers to `__expf` only with all three flags; the kernel never produces NaN or infinity
// (masked scores are the finite NO_MAX, and -inf only passes through as the LSE of empty rows).
#[cube(
    launch_unchecked,
    fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
)]
pub fn fwd_cmma<E: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    o: &mut Array<E>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    #[comptime] cfg: CmmaConfig,
) {
    let d = cfg.head_dim;
    let dv = cfg.v_head_dim;
    let bq = comptime!(cfg.bq());
    let warp = UNIT_POS as usize / PLANE;
    let lane = UNIT_POS as usize % PLANE;

    let batch = CUBE_POS_Z as usize;
    let head = CUBE_POS_Y as usize;
    let q0 = CUBE_POS_X as usize * bq;
    let kv_head = head / shape.group as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;

    let q_base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize;
    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    let mut q_stage =
        SharedMemory::<Vector<E, N>>::new_aligned(comptime!(cfg.q_elems() / cfg.vec), SMEM_ALIGN);
    let mut k_stage =
        SharedMemory::<Vector<E, N>>::new_aligned(comptime!(cfg.k_elems() / cfg.vec), SMEM_ALIGN);
    let mut v_stage =
        SharedMemory::<Vector<E, N>>::new_aligned(comptime!(cfg.v_elems() / cfg.vec), SMEM_ALIGN);
    let mut p_stage = SharedMemory::<E>::new_aligned(comptime!(cfg.p_elems()), SMEM_ALIGN);
    let mut scratch = SharedMemory::<f32>::new_aligned(comptime!(cfg.scratch_elems()), SMEM_ALIGN);

    cube_load_rows(q, &mut q_stage, q_base, shape.q_s2 as usize, q0, q_len, bq, d, cfg.q_pitch(), cfg);
    sync_cube();

    // Q fragments stay in registers for the whole KV walk.
    let mut q_frags = Sequence::<cmma::Matrix<E>>::new();
    #[unroll]
    for kc in 0..d / MMA {
        let start = (warp * MMA * cfg.q_pitch() + kc * MMA) / cfg.vec;
        let frag = unsafe {
            cmma::Matrix::<E>::uninitialized(MatrixIdent::A, MMA, MMA, MMA, MatrixLayout::RowMajor)
        };
        cmma::load(&frag, &q_stage.slice(start, q_stage.len()), cfg.q_pitch() as u32);
        q_frags.push(frag);
    }
    // Every plane has its Q fragments before the stage's memory goes to K, V, P and the scratch
    // (the first write there may be another plane's epilogue when the cube sees no key).
    sync_cube();
    // SAFETY: uniform control flow, and nothing refers to the Q stage past this point.
    unsafe { q_stage.free() };
    let mut o_frags = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..dv / MMA {
        o_frags.push(cmma::Matrix::<f32>::from_value(
            MatrixIdent::Accumulator,
            MMA,
            MMA,
            MMA,
            MatrixLayout::Undefined,
            0.0,
        ));
    }
    let mut s_frags = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..cfg.bk / MMA {
        s_frags.push(cmma::Matrix::<f32>::from_value(
            MatrixIdent::Accumulator,
            MMA,
            MMA,
            MMA,
            MatrixLayout::Undefined,
            0.0,
        ));
    }

    // Two lanes per row: lane 2r and 2r+1 share row r of the plane's 16.
    // Running (max, sum) of the lane's row; an array because cube functions cannot take
    // `&mut f32`.
    let mut stats = Array::<f32>::new(2usize);
    stats[0] = NO_MAX;
    stats[1] = 0.0;

    let (num_full, num_tiles) = cube_key_ranges(q0, q_len, kv_len, bq, cfg.bk, cfg.causal);
    for tile in 0..num_full {
        kv_step(
            k, v, &mut k_stage, &mut v_stage, &mut p_stage, &mut scratch, &q_frags, &mut s_frags,
            &mut o_frags, &mut stats, shape, k_base, v_base, tile * cfg.bk, q0,
            warp, lane, false, cfg,
        );
    }
    for tile in num_full..num_tiles {
        kv_step(
            k, v, &mut k_stage, &mut v_stage, &mut p_stage, &mut scratch, &q_frags, &mut s_frags,
            &mut o_frags, &mut stats, shape, k_base, v_base, tile * cfg.bk, q0,
            warp, lane, true, cfg,
        );
    }

    write_results(
        o, lse, &mut scratch, &o_frags, stats[0], stats[1], shape, batch, head, q0, warp, lane,
        cfg,
    );
}

/// Stages `rows` rows of `dim` elements starting at `row0`, row-major, vector by vector;
/// rows past `len` are zero.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_load_rows<E: Float, N: Size>(
    src: &Array<Vector<E, N>>,
    stage: &mut SharedMemory<Vector<E, N>>,
    base: usize,
    row_stride: usize,
    row0: usize,
    len: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] pitch: usize,
    #[comptime] cfg: CmmaConfig,
) {
    let per_row = comptime!(dim / cfg.vec);
    let stage_row = comptime!(pitch / cfg.vec);
    let count = comptime!(rows * dim / cfg.vec);
    let per_unit = comptime!(count.div_ceil(cfg.units()));
    #[unroll]
    for step in 0..per_unit {
        let e = step * cfg.units() + UNIT_POS as usize;
        if e < count {
            let row = e / per_row;
            let col = e % per_row;
            let mut value = Vector::<E, N>::new(E::from_int(0));
            if row0 + row < len {
                value = src[(base + (row0 + row) * row_stride) / cfg.vec + col];
            }
            stage[row * stage_row + col] = value;
        }
    }
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn kv_step<E: Float, N: Size>(
    k: &Array<Vector<E, N>>,
    v: &Array<Vector<E, N>>,
    k_stage: &mut SharedMemory<Vector<E, N>>,
    v_stage: &mut SharedMemory<Vector<E, N>>,
    p_stage: &mut SharedMemory<E>,
    scratch: &mut SharedMemory<f32>,
    q_frags: &Sequence<cmma::Matrix<E>>,
    s_frags: &mut Sequence<cmma::Matrix<f32>>,
    o_frags: &mut Sequence<cmma::Matrix<f32>>,
    stats: &mut Array<f32>,
    shape: &AttnShape,
    k_base: usize,
    v_base: usize,
    k0: usize,
    q0: usize,
    warp: usize,
    lane: usize,
    #[comptime] masked: bool,
    #[comptime] cfg: CmmaConfig,
) {
    let d = cfg.head_dim;
    let dv = cfg.v_head_dim;
    let bk = cfg.bk;
    let kv_len = shape.kv_len as usize;

    // Every plane is done with the previous K, V and (its own) P.
    sync_cube();
    cube_load_rows(k, k_stage, k_base, shape.k_s2 as usize, k0, kv_len, bk, d, cfg.k_pitch(), cfg);
    cube_load_rows(v, v_stage, v_base, shape.v_s2 as usize, k0, kv_len, bk, dv, cfg.v_pitch(), cfg);
    sync_cube();

    // score_matmul: S (16 x bk) = Q (16 x d) · Kᵀ; K row-major [key][d] is Kᵀ column-major.
    #[unroll]
    for n in 0..bk / MMA {
        cmma::fill(s_frags.index(n), 0.0f32);
    }
    #[unroll]
    for kc in 0..d / MMA {
        #[unroll]
        for n in 0..bk / MMA {
            let b = unsafe {
                cmma::Matrix::<E>::uninitialized(MatrixIdent::B, MMA, MMA, MMA, MatrixLayout::ColMajor)
            };
            cmma::load(
                &b,
                &k_stage.slice((n * MMA * cfg.k_pitch() + kc * MMA) / cfg.vec, k_stage.len()),
                cfg.k_pitch() as u32,
            );
            cmma::execute::<E, E, f32, f32>(q_frags.index(kc), &b, s_frags.index(n), s_frags.index(n));
        }
    }
    let plane_base = warp * cfg.scratch_per_plane();
    #[unroll]
    for n in 0..bk / MMA {
        cmma::store(
            &mut scratch.slice_mut(plane_base + n * MMA, scratch.len()),
            s_frags.index(n),
            cfg.s_pitch() as u32,
            MatrixLayout::RowMajor,
        );
    }
    sync_plane();

    // online_softmax: lane pair (2r, 2r+1) owns row r, each half of the keys.
    let r = lane / 2;
    let half = lane % 2;
    let half_bk = comptime!(cfg.bk / 2);
    let row = q0 + warp * MMA + r;
    let scale = shape.scale;
    let mut s = Array::<f32>::new(half_bk);
    let mut tile_max = NO_MAX.runtime();
    #[unroll]
    for c in 0..half_bk {
        let col = half * half_bk + c;
        let mut value = scratch[plane_base + r * cfg.s_pitch() + col];
        if masked {
            let visible = is_visible(row, k0 + col, shape.q_len as usize, kv_len, cfg.causal);
            value = select(visible, value, NO_MAX);
        }
        s[c] = value;
        tile_max = max(tile_max, value);
    }
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 1u32));

    let old_max = stats[0];
    let mut new_max = max(old_max, tile_max);
    if cfg.lazy_rescale {
        new_max = select((tile_max - old_max) * scale > LAZY_RESCALE_THRESHOLD, tile_max, old_max);
    }
    let neg_scaled_max = -new_max * scale;
    let mut tile_sum = 0.0f32;
    #[unroll]
    for c in 0..half_bk {
        let mut p = f32::exp(fma(s[c], scale, neg_scaled_max));
        if masked {
            p = select(s[c] > MASK_THRESHOLD, p, 0.0);
        }
        p_stage[(warp * MMA + r) * cfg.p_pitch() + half * half_bk + c] = E::cast_from(p);
        tile_sum += p;
    }
    let alpha = f32::exp((old_max - new_max) * scale);
    stats[1] = stats[1] * alpha + tile_sum;
    stats[0] = new_max;

    // Rescale the output fragments through the scratch (their layout is opaque).
    let mut rescale = true;
    if cfg.lazy_rescale {
        rescale = plane_any(new_max != old_max);
    }
    if rescale {
        plane_scale_rows(o_frags, scratch, alpha, plane_base, r, half, cfg);
    }
    sync_plane();

    // value_matmul: O (16 x dv) += P (16 x bk) · V (bk x dv), V row-major [key][dv].
    #[unroll]
    for kc in 0..bk / MMA {
        let a = cmma::Matrix::<E>::from_slice(
            MatrixIdent::A,
            MMA,
            MMA,
            MMA,
            MatrixLayout::RowMajor,
            &p_stage.slice(warp * MMA * cfg.p_pitch() + kc * MMA, p_stage.len()),
            cfg.p_pitch() as u32,
        );
        #[unroll]
        for n in 0..dv / MMA {
            let b = unsafe {
                cmma::Matrix::<E>::uninitialized(MatrixIdent::B, MMA, MMA, MMA, MatrixLayout::RowMajor)
            };
            cmma::load(
                &b,
                &v_stage.slice((kc * MMA * cfg.v_pitch() + n * MMA) / cfg.vec, v_stage.len()),
                cfg.v_pitch() as u32,
            );
            cmma::execute::<E, E, f32, f32>(&a, &b, o_frags.index(n), o_frags.index(n));
        }
    }
}

/// Multiplies row `r` of the plane's output fragments by `alpha` (each lane of the row pair
/// scales half of the columns), `O_COLS` columns at a time: store two fragments to the
/// scratch, scale, reload.
#[cube]
fn plane_scale_rows(
    o_frags: &mut Sequence<cmma::Matrix<f32>>,
    scratch: &mut SharedMemory<f32>,
    alpha: f32,
    plane_base: usize,
    r: usize,
    half: usize,
    #[comptime] cfg: CmmaConfig,
) {
    let frags = comptime!(O_COLS / MMA);
    let half_cols = comptime!(O_COLS / 2);
    #[unroll]
    for pass in 0..cfg.v_head_dim / O_COLS {
        #[unroll]
        for f in 0..frags {
            cmma::store(
                &mut scratch.slice_mut(plane_base + f * MMA, scratch.len()),
                o_frags.index(comptime!(pass * frags + f)),
                cfg.s_pitch() as u32,
                MatrixLayout::RowMajor,
            );
        }
        sync_plane();
        #[unroll]
        for c in 0..half_cols {
            let idx = plane_base + r * cfg.s_pitch() + half * half_cols + c;
            scratch[idx] = scratch[idx] * alpha;
        }
        sync_plane();
        #[unroll]
        for f in 0..frags {
            cmma::load_with_layout(
                o_frags.index(comptime!(pass * frags + f)),
                &scratch.slice(plane_base + f * MMA, scratch.len()),
                cfg.s_pitch() as u32,
                MatrixLayout::RowMajor,
            );
        }
        // The next pass stores over what this one reloads.
        sync_plane();
    }
}

/// Epilogue: O = acc / l row by row, `O_COLS` columns at a time through the scratch (the whole
/// plane writes 32 consecutive elements of one row at a time, so stores are coalesced),
/// LSE = m·scale + ln l; rows that saw no key get O = 0, LSE = -inf.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_results<E: Float>(
    o: &mut Array<E>,
    lse: &mut Array<f32>,
    scratch: &mut SharedMemory<f32>,
    o_frags: &Sequence<cmma::Matrix<f32>>,
    row_max: f32,
    row_sum: f32,
    shape: &AttnShape,
    batch: usize,
    head: usize,
    q0: usize,
    warp: usize,
    lane: usize,
    #[comptime] cfg: CmmaConfig,
) {
    let plane_base = warp * cfg.scratch_per_plane();
    let q_len = shape.q_len as usize;
    let frags = comptime!(O_COLS / MMA);
    let l = row_sum + plane_shuffle_xor(row_sum, 1u32);
    let seen = l > 0.0;
    let inv = select(seen, 1.0 / l, 0.0);

    let r = lane / 2;
    let own_row = q0 + warp * MMA + r;
    if cfg.write_lse {
        if lane % 2 == 0 && own_row < q_len {
            let value = select(
                seen,
                row_max * shape.scale + f32::ln(select(seen, l, 1.0)),
                shape.lse_empty,
            );
            lse[(batch * shape.q_heads as usize + head) * q_len + own_row] = value;
        }
    }

    let o_base = batch * shape.o_s0 as usize + head * shape.o_s1 as usize;
    #[unroll]
    for pass in 0..cfg.v_head_dim / O_COLS {
        // The previous pass (or the score spill / rescale before the epilogue) is read.
        sync_plane();
        #[unroll]
        for f in 0..frags {
            cmma::store(
                &mut scratch.slice_mut(plane_base + f * MMA, scratch.len()),
                o_frags.index(comptime!(pass * frags + f)),
                cfg.s_pitch() as u32,
                MatrixLayout::RowMajor,
            );
        }
        sync_plane();
        #[unroll]
        for rr in 0..MMA {
            let row_inv = plane_shuffle(inv, (2 * rr) as u32);
            let row = q0 + warp * MMA + rr;
            if row < q_len {
                let col = pass * O_COLS + lane;
                o[o_base + row * shape.o_s2 as usize + col] =
                    E::cast_from(scratch[plane_base + rr * cfg.s_pitch() + lane] * row_inv);
            }
        }
    }
}

/// CubeCL's shared-memory allocator run offline on the real kernel: compiled for SPIR-V (with
/// `VK_KHR_workgroup_memory_explicit_layout`, as on NVIDIA) and for CUDA, every tiling of the
/// table asks for exactly [`CmmaTiles::smem_bytes`](crate::CmmaTiles::smem_bytes), so the
/// freed Q stage really is reused. Nothing is launched: a wgpu adapter (llvmpipe will do) is
/// only needed to expand the kernel. `QUATTN_CMMA_CUDA_DIR=<dir>` also writes the CUDA
/// sources there, for an offline NVRTC compile.
///
/// `cargo test --release -p quattn-cubecl --features spirv,cuda --lib cmma`
#[cfg(all(test, any(feature = "spirv", feature = "cuda")))]
mod tests {
    use super::*;
    use crate::kernel::AttnShapeCompilationArg;
    use crate::problem::SUPPORTED_HEAD_DIMS;
    use crate::tiling::cmma_candidates;
    use crate::CmmaTiles;
    use cubecl::ir::{ElemType, StorageType, UIntKind};
    use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
    #[allow(unused_imports)]
    use cubecl::Compiler as _;

    fn client() -> Option<ComputeClient<WgpuRuntime>> {
        let instance = wgpu::Instance::default();
        let adapters = cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        if adapters.is_empty() {
            println!("SKIPPED: no wgpu adapter to expand the kernel with");
            return None;
        }
        Some(WgpuRuntime::client(&WgpuDevice::DefaultDevice))
    }

    /// Every table entry at every head dim (and one dv != d), both rescale modes.
    fn configs() -> Vec<CmmaConfig> {
        let mut dims: Vec<(usize, usize)> =
            SUPPORTED_HEAD_DIMS.iter().map(|&d| (d as usize, d as usize)).collect();
        dims.push((64, 128));
        let mut out = Vec::new();
        for (d, dv) in dims {
            for t in cmma_candidates(d.max(dv) as u32) {
                for lazy_rescale in [false, true] {
                    out.push(CmmaConfig {
                        head_dim: d,
                        v_head_dim: dv,
                        warps: t.warps as usize,
                        bk: t.bk as usize,
                        vec: 8,
                        causal: true,
                        write_lse: true,
                        lazy_rescale,
                    });
                }
            }
        }
        out
    }

    fn expected(cfg: &CmmaConfig) -> usize {
        let tiles = CmmaTiles { warps: cfg.warps as u32, bk: cfg.bk as u32 };
        tiles.smem_bytes(cfg.head_dim as u32, cfg.v_head_dim as u32, 2) as usize
    }

    fn definition(client: &ComputeClient<WgpuRuntime>, cfg: CmmaConfig) -> KernelDefinition {
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
        fwd_cmma::FwdCmma::<half::f16, WgpuRuntime>::new(
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

    const ADDR: StorageType = StorageType::Scalar(ElemType::UInt(UIntKind::U32));

    fn name(cfg: &CmmaConfig) -> String {
        format!(
            "d{}v{}_w{}_bk{}_lazy{}",
            cfg.head_dim, cfg.v_head_dim, cfg.warps, cfg.bk, cfg.lazy_rescale
        )
    }

    #[cfg(feature = "spirv")]
    #[test]
    fn spirv_shared_memory_is_the_tiling_formula() {
        use cubecl::wgpu::vulkan::VkSpirvCompiler;
        let Some(client) = client() else { return };
        for cfg in configs() {
            let mut options = <VkSpirvCompiler as cubecl::Compiler>::CompilationOptions::default();
            options.vulkan.supports_explicit_smem = true;
            let kernel = VkSpirvCompiler::default()
                .compile(definition(&client, cfg), &options, ExecutionMode::Unchecked, ADDR)
                .unwrap();
            assert_eq!(kernel.shared_size, expected(&cfg), "{}", name(&cfg));
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_shared_memory_is_the_tiling_formula() {
        use cubecl::cuda::CudaCompiler;
        let Some(client) = client() else { return };
        let dump = std::env::var_os("QUATTN_CMMA_CUDA_DIR").map(std::path::PathBuf::from);
        let _serial = crate::kernel::offline_cuda::COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for cfg in configs() {
            let kernel = CudaCompiler::default()
                .compile(definition(&client, cfg), &Default::default(), ExecutionMode::Unchecked, ADDR)
                .unwrap();
            assert_eq!(kernel.shared_memory_size(), expected(&cfg), "{}", name(&cfg));
            if let Some(dir) = &dump {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(dir.join(format!("{}.cu", name(&cfg))), kernel.to_string()).unwrap();
            }
        }
    }

    /// The tiling the selection gives at every head dim, f16 and bf16, causal with the LSE, with
    /// 8-wide loads (and scalar ones at head dim 128), compiled by NVRTC for sm_90a (and the
    /// A100's build at head dim 128): each must compile, declare the shared memory the fit check
    /// counts, and not spill.
    #[cfg(feature = "cuda")]
    #[test]
    fn nvrtc_compiles_the_selected_tilings() {
        use crate::kernel::offline_cuda::{Cover, array, attn_shape_arg, head_dims, settings, Arch, OfflineCuda, Variant};
        use crate::launch::{CubeLimits, PortableKernel};
        use crate::Dtype;
        let Some(cuda) = OfflineCuda::new() else { return };
        let mut cases = Vec::new();
        // (arch, dtype, d, dv, elements per global load)
        for dtype in [Dtype::F16, Dtype::Bf16] {
            for (d, dv) in head_dims() {
                cases.push((Arch::Sm90, dtype, d, dv, 8));
            }
            cases.push((Arch::Sm80, dtype, 128, 128, 8));
        }
        // Strides that are not multiples of 2 elements: scalar loads (`load_vector_width`).
        cases.push((Arch::Sm90, Dtype::F16, 128, 128, 1));
        let mut cover = Cover::new();
        let variants = cases.into_iter().filter(|c| cover.take(&[&c.0, &c.1, &c.2, &c.3, &c.4])).map(|(arch, dtype, d, dv, vec)| {
            let limits = CubeLimits { max_shared_bytes: arch.max_shared_bytes(), max_units: 1024 };
            let tiles = *cmma_candidates(d.max(dv) as u32)
                .iter()
                .find(|&&t| PortableKernel::Cmma(t).check_fits(limits, d as u32, dv as u32, dtype).is_ok())
                .expect("a cmma tiling fits");
            // As `launch` builds it.
            let cfg = CmmaConfig {
                head_dim: d,
                v_head_dim: dv,
                warps: tiles.warps as usize,
                bk: tiles.bk as usize,
                vec,
                causal: true,
                write_lse: true,
                lazy_rescale: true,
            };
            macro_rules! def {
                ($e:ty) => {
                    fwd_cmma::FwdCmma::<$e, WgpuRuntime>::new(
                        settings(cfg.units()),
                        cuda.client().clone(),
                        array(),
                        array(),
                        array(),
                        array(),
                        array(),
                        attn_shape_arg(),
                        cfg.vec,
                        cfg,
                    )
                    .define()
                };
            }
            let definition = match dtype {
                Dtype::Bf16 => def!(half::bf16),
                _ => def!(half::f16),
            };
            Variant {
                name: format!("cmma_{dtype}_d{d}v{dv}_w{}_bk{}_vec{vec}", tiles.warps, tiles.bk),
                arch,
                definition,
                shared_bytes: Some(PortableKernel::Cmma(tiles).smem_bytes(d as u32, dv as u32, dtype)),
                spill_free: true,
            }
        });
        cuda.check_all(variants);
    }
}
