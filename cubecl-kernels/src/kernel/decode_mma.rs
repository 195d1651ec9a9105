//! Split-KV decode on manual MMA (`mma.sync` m16n8k16, CUDA): the row decode kernel's job
//! (`decode_rows.rs`: a handful of packed query rows of one KV head against a long cache) with
//! both products on the tensor cores and the K/V operands built in registers straight from
//! global memory, no shared-memory stage and no barrier in the key loop.
//!
//! Why: the row kernel spends about 23 instructions per key and element pair on FMAs,
//! conversions and its three barriers per tile; on FP8 codes it is bound by instruction issue,
//! not by the bytes it reads. Here one warp-wide MMA does 2048 multiply-adds, so what is left
//! per K/V element is its load and (codes) one conversion per two elements.
//!
//! Per cube: `warps` warps over one (split, KV head, batch), as the row kernel, with the same
//! partial-state format for [`super::decode::decode_merge`]. A cube tile is `warps · 16 ·
//! steps` keys; warp `w` takes the `16 · steps` keys from `w · 16 · steps` of each, runs its own
//! online softmax, and the warps' states are combined through shared memory at the end.
//! Lane `l = 4g + t`:
//!
//! - **S = Q·Kᵀ** (A = Q, the packed rows padded to 16 with zeros; B = Kᵀ): n-tile `j` is keys
//!   `8j .. 8j + 8` of the warp's keys, key `8j + g` read by lanes `4g .. 4g + 4`, lane `t`
//!   holding head-dim elements `[t·d/4, (t+1)·d/4)` of it as `d/4` contiguous elements (one or
//!   a few 16-byte loads). The k-slots of the MMA are a permutation of the head dim that the
//!   Q fragments (loaded once) follow: k-step `s`, slots `2t, 2t+1` are elements `t·d/4 + 4s +
//!   {0, 1}`, slots `2t+8, 2t+9` are `t·d/4 + 4s + {2, 3}`.
//! - **softmax**: accumulator tile `j` holds row `g`, keys `8j + 2t, +1` (rows `g + 8` are the
//!   padding); the row max is two quad shuffles, the lazy rescale FA4's.
//! - **Oᵀ += Vᵀ·Pᵀ** (A = Vᵀ, m-tile `i` of 16 head-dim columns; B = Pᵀ, 8 rows): the B
//!   fragment of key step `c` is P of S tiles `2c` and `2c + 1` in place (row `g`, keys `2t,
//!   2t+1` and `2t+8, 2t+9`). The A fragment wants two keys of one output column per register,
//!   so lane `(g, t)` reads keys `16c + {2t, 2t+1, 2t+8, 2t+9}`, output columns `[g·dv/8,
//!   (g+1)·dv/8)` of each (contiguous), and pairs the two keys' elements with byte
//!   permutes; m-tile `i`'s rows `g` and `g + 8` are columns `g·dv/8 + 2i` and `+ 1`. The
//!   accumulator holds columns of rows `2t, 2t+1`, which is how O is written.
//!
//! K/V elements are 16-bit (`code_bytes` 2: f16 or bf16, the MMA's type) or FP8 codes (1:
//! OCP e4m3 or e5m2, converted two at a time by the device's `cvt` into exact f16 values).
//! FP8 numerics are the row kernel's with per-tensor or per-head descales: `s = (Σ q·k) ·
//! q_descale · k_descale`, folded into each row's softmax scale; P rounded to f16 for P·V and O
//! multiplied by the V descale in the epilogue; the row sums on the unrounded P. Non-finite
//! codes are zeroed before conversion and recorded (the Q rows that hold one, the lowest key
//! whose K or V row holds one); rows that see them are written as NaN, as the row kernel does.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use super::decode::{split_keys, DecodeArgs};
use super::decode_rows::{NO_KEY, POISON_LSE};
use super::fma_vec_fp8::{clear_marked, convert_pair, non_finite_bytes, Fp8Config, Fp8Shape};
use super::mma::{acc_zero, Pair, MMA_K, MMA_M, MMA_N, PLANE};
use super::{is_visible, AttnShape, LAZY_RESCALE_THRESHOLD, MASK_THRESHOLD, NO_MAX};

/// Most packed rows: the MMA's 8 columns of Oᵀ.
pub const MMA_DECODE_MAX_ROWS: usize = 8;

/// Compile-time key of the MMA decode kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmaDecodeConfig {
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// Packed query rows, exactly (`group · q_len`).
    pub rows: usize,
    pub warps: usize,
    /// 16-key P·V steps per warp per cube tile.
    pub steps: usize,
    /// 32-bit words per global load.
    pub vec: usize,
    /// Bytes per K/V element: 2 (f16/bf16) or 1 (FP8 codes).
    pub code_bytes: usize,
    pub causal: bool,
    pub write_lse: bool,
}

impl MmaDecodeConfig {
    pub const fn units(&self) -> usize {
        self.warps * PLANE
    }
    /// Keys of one warp per cube tile.
    pub const fn warp_keys(&self) -> usize {
        MMA_K * self.steps
    }
    /// Keys per cube tile (the split's unit).
    pub const fn bk(&self) -> usize {
        self.warps * self.warp_keys()
    }
    pub const fn s_tiles(&self) -> usize {
        self.warp_keys() / MMA_N
    }
    pub const fn qk_steps(&self) -> usize {
        self.head_dim / MMA_K
    }
    pub const fn o_tiles(&self) -> usize {
        self.v_head_dim / MMA_M
    }
    /// 32-bit words of a K row one lane holds: `d/4` elements.
    pub const fn k_words(&self) -> usize {
        self.head_dim / 4 * self.code_bytes / 4
    }
    /// 32-bit words of a V row one lane holds: `dv/8` elements.
    pub const fn v_words(&self) -> usize {
        self.v_head_dim / 8 * self.code_bytes / 4
    }
    /// f32s of the warps' final states: `[warps][rows][2 + dv]` (max, sum, accumulator).
    pub const fn merge_len(&self) -> usize {
        self.warps * self.rows * (self.v_head_dim + 2)
    }
    /// Shared memory in bytes: the merge, and (codes) the two records of non-finite codes.
    pub const fn smem_bytes(&self) -> usize {
        4 * self.merge_len() + if self.code_bytes == 1 { 8 } else { 0 }
    }

    /// Why the kernel's loops do not cover this configuration, if they do not.
    pub fn invalid(&self) -> Option<String> {
        let (d, dv) = (self.head_dim, self.v_head_dim);
        if self.rows == 0 || self.rows > MMA_DECODE_MAX_ROWS {
            return Some(format!("{} rows: the MMA decode kernel holds 1..={MMA_DECODE_MAX_ROWS}", self.rows));
        }
        if !(self.code_bytes == 1 || self.code_bytes == 2) {
            return Some(format!("{}-byte elements: the MMA decode kernel reads 16-bit elements or FP8 codes", self.code_bytes));
        }
        // Each lane holds whole words of d/4 (K) and dv/8 (V) elements, and an FP8 lane's V
        // words pair up byte by byte (two m-tiles per word).
        let words = 4 / self.code_bytes;
        if d == 0 || !d.is_multiple_of(MMA_K) || !(d / 4).is_multiple_of(words) {
            return Some(format!("head dim {d}: a multiple of 16 whose quarter is whole words"));
        }
        if dv == 0 || !dv.is_multiple_of(MMA_M) || !(dv / 8).is_multiple_of(words) {
            return Some(format!("V head dim {dv}: a multiple of 16 whose eighth is whole words"));
        }
        // A lane holds d/4 elements of two K rows and dv/8 of four V rows per key step, and
        // 4·dv/16 accumulators: at d 128, 154 to 168 registers; past it ptxas spills.
        if d.max(dv) > 128 {
            return Some(format!("head dims {d} and {dv}: the MMA decode kernel's registers hold up to 128"));
        }
        if self.warps == 0 || self.steps == 0 {
            return Some("no warps or no key steps".into());
        }
        if self.vec == 0 || !self.k_words().is_multiple_of(self.vec) || !self.v_words().is_multiple_of(self.vec) {
            return Some(format!("loads of {} words do not divide a lane's {} K and {} V words", self.vec, self.k_words(), self.v_words()));
        }
        None
    }
}

/// One cube per (split, KV head, batch): grid `(splits, kv_heads, batch)`, `cfg.units()` units.
/// `q`: Q as 32-bit words (two 16-bit elements or four codes); `k`, `v`: K and V as vectors of
/// `N` words. `direct`: one split, O and the LSE written in place; otherwise the partial state
/// goes to `part_o` (`[batch][kv_head][split][rows][dv]` f32) and `part_lse` (`[...][rows]`).
/// The descales and `fp8` are read with FP8 codes only (`cfg.code_bytes == 1`; `fcfg` per
/// tensor or per head).
#[cube(
    launch_unchecked,
    fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_decode_mma<O: Float, E: Float, N: Size>(
    q: &Array<u32>,
    k: &Array<Vector<u32, N>>,
    v: &Array<Vector<u32, N>>,
    q_descale: &Array<f32>,
    k_descale: &Array<f32>,
    v_descale: &Array<f32>,
    o: &mut Array<O>,
    lse: &mut Array<f32>,
    part_o: &mut Array<f32>,
    part_lse: &mut Array<f32>,
    shape: &AttnShape,
    dec: &DecodeArgs,
    fp8: &Fp8Shape,
    #[comptime] cfg: MmaDecodeConfig,
    #[comptime] fcfg: Fp8Config,
    #[comptime] direct: bool,
) {
    let codes = comptime!(cfg.code_bytes == 1);
    let unit = UNIT_POS as usize;
    let warp = unit / PLANE;
    let lane = UNIT_POS_PLANE;
    let g = lane as usize / 4;
    let t = lane as usize % 4;
    let split = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let q_len = shape.q_len as usize;
    let kv_len = shape.kv_len as usize;
    let group = shape.group as usize;
    let rows = comptime!(cfg.rows);

    let mut merge = SharedMemory::<f32>::new(comptime!(cfg.merge_len()));
    // Codes: `[0]` bit r set when Q row r holds a non-finite code; `[1]` the lowest key of the
    // split whose K or V row holds one.
    let bad = SharedMemory::<Atomic<u32>>::new(comptime!(if cfg.code_bytes == 1 { 2usize } else { 1usize }));
    if comptime!(codes) {
        if unit == 0 {
            bad[0].store(0u32);
            bad[1].store(NO_KEY);
        }
        sync_cube();
    }

    // This lane's softmax row `g` (padding past `rows`: any position, Q zero).
    let row_head = kv_head * group + g / q_len;
    let row_pos = g % q_len;
    let mut kv_index = 0usize;
    if comptime!(fcfg.per_head()) {
        kv_index = batch * fp8.kv_heads as usize + kv_head;
    }
    let scale = row_scale(q_descale, k_descale, shape, batch, min(row_head, shape.q_heads as usize - 1), kv_index, fcfg, codes);
    let mut o_factor = 1.0f32;
    if comptime!(codes) {
        o_factor = v_descale[kv_index];
    }

    let (q_frags, q_bad) = load_q::<E>(q, shape, batch, row_head, row_pos, g, t, cfg, fcfg);
    if comptime!(codes) {
        if q_bad {
            bad[0].fetch_or(1u32 << g as u32);
        }
    }

    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;
    let keys = split_keys(shape, dec, kv_len, split, cfg.bk(), cfg.causal);
    let (k_begin, num_tiles, full) = (keys.begin, keys.tiles, keys.full);
    let warp_k0 = k_begin + warp * comptime!(cfg.warp_keys());

    let mut k_regs = Array::<Vector<u32, N>>::new(comptime!(cfg.s_tiles() * cfg.k_words() / cfg.vec));
    let mut v_regs = Array::<Vector<u32, N>>::new(comptime!(cfg.steps * 4 * cfg.v_words() / cfg.vec));
    let mut s_frags = Sequence::<Array<Vector<f32, Pair>>>::new();
    #[unroll]
    for _ in 0..cfg.s_tiles() {
        s_frags.push(acc_zero());
    }
    let mut o_frags = Sequence::<Array<Vector<f32, Pair>>>::new();
    #[unroll]
    for _ in 0..cfg.o_tiles() {
        o_frags.push(acc_zero());
    }
    let mut row_max = NO_MAX.runtime();
    let mut row_sum = 0.0f32;
    let mut bad_key = NO_KEY.runtime();

    if num_tiles > 0 {
        load_k(k, &mut k_regs, shape, k_base, warp_k0, kv_len, g, t, cfg);
        load_v(v, &mut v_regs, shape, v_base, warp_k0, kv_len, g, t, cfg);
    }
    for tile in 0..num_tiles {
        let k0 = warp_k0 + tile * comptime!(cfg.bk());
        if comptime!(codes) {
            clear_k(&mut k_regs, &mut bad_key, k0, g, fcfg, cfg);
        }
        score_matmul::<E, N>(&q_frags, &k_regs, &mut s_frags, cfg, fcfg);
        if tile + 1 < num_tiles {
            load_k(k, &mut k_regs, shape, k_base, k0 + comptime!(cfg.bk()), kv_len, g, t, cfg);
        }
        if k0 + comptime!(cfg.warp_keys()) > full {
            softmax(&mut s_frags, &mut o_frags, &mut row_max, &mut row_sum, scale, k0, row_pos, q_len, kv_len, t, true, cfg);
        } else {
            softmax(&mut s_frags, &mut o_frags, &mut row_max, &mut row_sum, scale, k0, row_pos, q_len, kv_len, t, false, cfg);
        }
        if comptime!(codes) {
            clear_v(&mut v_regs, &mut bad_key, k0, t, fcfg, cfg);
        }
        value_matmul::<E, N>(&s_frags, &v_regs, &mut o_frags, cfg, fcfg);
        if tile + 1 < num_tiles {
            load_v(v, &mut v_regs, shape, v_base, k0 + comptime!(cfg.bk()), kv_len, g, t, cfg);
        }
    }

    // The warp's state into the merge: the quad's partial sums reduced, each lane's columns of
    // rows 2t and 2t + 1.
    row_sum += plane_shuffle_xor(row_sum, 1u32);
    row_sum += plane_shuffle_xor(row_sum, 2u32);
    let pitch = comptime!(cfg.v_head_dim + 2);
    if t == 0 && g < rows {
        let at = (warp * rows + g) * pitch;
        merge[at] = row_max;
        merge[at + 1] = row_sum;
    }
    let cols = comptime!(cfg.v_head_dim / 8);
    #[unroll]
    for e in 0..2usize {
        let r = 2 * t + e;
        if r < rows {
            let at = (warp * rows + r) * pitch + 2 + g * cols;
            #[unroll]
            for i in 0..cfg.o_tiles() {
                let frag = o_frags.index(i);
                merge[at + 2 * i] = frag[0][e];
                merge[at + 2 * i + 1] = frag[1][e];
            }
        }
    }
    if comptime!(codes) {
        if bad_key != NO_KEY {
            bad[1].fetch_min(bad_key);
        }
    }
    sync_cube();

    let mut q_bad_rows = 0u32;
    let mut lowest = NO_KEY.runtime();
    if comptime!(codes) {
        q_bad_rows = bad[0].load();
        lowest = bad[1].load();
    }
    // Combine: task (row, 4 columns).
    let quads = comptime!(cfg.v_head_dim / 4);
    let tasks = comptime!(cfg.rows * cfg.v_head_dim / 4);
    let kv_heads = shape.q_heads as usize / group;
    #[unroll]
    for step in 0..comptime!(tasks.div_ceil(cfg.units())) {
        let task = step * comptime!(cfg.units()) + unit;
        if task < tasks {
            let r = task / quads;
            let c = (task % quads) * 4;
            let head = kv_head * group + r / q_len;
            let pos = r % q_len;
            let sc = row_scale(q_descale, k_descale, shape, batch, head, kv_index, fcfg, codes);
            let (m, total, out) = combine_warps(&merge, r, c, sc, rows, pitch, cfg.warps);
            let seen = total > 0.0;
            let inv = select(seen, o_factor / total, 0.0);
            let state_lse = m * sc + f32::ln(select(seen, total, 1.0));
            let mut poisoned = false;
            if comptime!(codes) {
                let mut kv_bad = (lowest as usize) < kv_len;
                if comptime!(cfg.causal) {
                    kv_bad = kv_bad && lowest as usize + q_len <= pos + kv_len;
                }
                poisoned = seen && (((q_bad_rows >> r as u32) & 1u32) != 0u32 || kv_bad);
            }
            if comptime!(direct) {
                let o_row = batch * shape.o_s0 as usize + head * shape.o_s1 as usize + pos * shape.o_s2 as usize + c;
                #[unroll]
                for e in 0..4usize {
                    o[o_row + e] = O::cast_from(select(poisoned, fp8.nan, out[e] * inv));
                }
                if comptime!(cfg.write_lse) {
                    if c == 0 {
                        lse[(batch * shape.q_heads as usize + head) * q_len + pos] =
                            select(poisoned, fp8.nan, select(seen, state_lse, shape.lse_empty));
                    }
                }
            } else {
                let state = ((batch * kv_heads + kv_head) * dec.splits as usize + split) * rows + r;
                #[unroll]
                for e in 0..4usize {
                    part_o[state * comptime!(cfg.v_head_dim) + c + e] = out[e] * inv;
                }
                if c == 0 {
                    part_lse[state] = select(poisoned, POISON_LSE, select(seen, state_lse, NO_MAX));
                }
            }
        }
    }
}

/// Packed row `r`'s states of the `warps` warps in `merge` (`[warp][rows][pitch]`: max, sum,
/// accumulator) combined by their maxima at softmax scale `scale`: the common max, the summed
/// row sum and accumulator columns `c .. c + 4`, unnormalized. Warps that saw no key weigh 0.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn combine_warps(
    merge: &SharedMemory<f32>,
    r: usize,
    c: usize,
    scale: f32,
    #[comptime] rows: usize,
    #[comptime] pitch: usize,
    #[comptime] warps: usize,
) -> (f32, f32, Array<f32>) {
    let mut m = NO_MAX.runtime();
    #[unroll]
    for w in 0..warps {
        m = max(m, merge[(w * rows + r) * pitch]);
    }
    let mut total = 0.0f32;
    let mut out = Array::<f32>::new(4usize);
    #[unroll]
    for e in 0..4usize {
        out[e] = 0.0;
    }
    #[unroll]
    for w in 0..warps {
        let at = (w * rows + r) * pitch;
        let mw = merge[at];
        let weight = select(mw > MASK_THRESHOLD, f32::exp((mw - m) * scale), 0.0);
        total += weight * merge[at + 1];
        #[unroll]
        for e in 0..4usize {
            out[e] += weight * merge[at + 2 + c + e];
        }
    }
    (m, total, out)
}

/// The softmax scale of the rows of q head `head`: the shape's, with codes times the Q and K
/// descales (`kv_index` K's entry). One function for the key loop and the epilogue, so that
/// both use the same rounding.
#[cube]
#[allow(clippy::too_many_arguments)]
fn row_scale(
    q_descale: &Array<f32>,
    k_descale: &Array<f32>,
    shape: &AttnShape,
    batch: usize,
    head: usize,
    kv_index: usize,
    #[comptime] fcfg: Fp8Config,
    #[comptime] codes: bool,
) -> f32 {
    let mut scale = shape.scale;
    if comptime!(codes) {
        let mut q_index = 0usize;
        if comptime!(fcfg.per_head()) {
            q_index = batch * shape.q_heads as usize + head;
        }
        scale = shape.scale * (q_descale[q_index] * k_descale[kv_index]);
    }
    scale
}

/// The lane's Q fragments, `[k-step]`: row `g` (zero past `rows`), elements `t·d/4 + 4s +
/// {0, 1}` (register 0) and `+ {2, 3}` (register 2); rows `g + 8` zero. With codes, a
/// non-finite code is zeroed and reported (the second value, for row `g`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_q<E: Float>(
    q: &Array<u32>,
    shape: &AttnShape,
    batch: usize,
    head: usize,
    pos: usize,
    g: usize,
    t: usize,
    #[comptime] cfg: MmaDecodeConfig,
    #[comptime] fcfg: Fp8Config,
) -> (Sequence<Array<Vector<E, Pair>>>, bool) {
    let real = g < cfg.rows;
    let base = batch * shape.q_s0 as usize + head * shape.q_s1 as usize + pos * shape.q_s2 as usize + t * comptime!(cfg.head_dim / 4);
    let mut frags = Sequence::<Array<Vector<E, Pair>>>::new();
    let mut any_bad = false;
    let zero = Vector::<E, Pair>::new(E::from_int(0));
    #[unroll]
    for s in 0..cfg.qk_steps() {
        let mut a = Array::<Vector<E, Pair>>::new(4usize);
        a[1] = zero;
        a[3] = zero;
        if comptime!(cfg.code_bytes == 1) {
            let mut word = 0u32;
            if real {
                word = q[base / 4 + s];
            }
            let nf = non_finite_bytes(word, fcfg);
            if nf != 0u32 {
                any_bad = true;
                word = clear_marked(word, nf);
            }
            a[0] = Vector::<E, Pair>::reinterpret(u32::reinterpret(convert_pair(u16::cast_from(word), fcfg)));
            a[2] = Vector::<E, Pair>::reinterpret(u32::reinterpret(convert_pair(u16::cast_from(word >> 16u32), fcfg)));
        } else {
            let mut lo = 0u32;
            let mut hi = 0u32;
            if real {
                lo = q[base / 2 + 2 * s];
                hi = q[base / 2 + 2 * s + 1];
            }
            a[0] = Vector::<E, Pair>::reinterpret(lo);
            a[2] = Vector::<E, Pair>::reinterpret(hi);
        }
        frags.push(a);
    }
    (frags, any_bad)
}

/// Word `x` of the register array `regs` of `vec`-word vectors.
#[cube]
fn word_of<N: Size>(regs: &Array<Vector<u32, N>>, #[comptime] x: usize, #[comptime] vec: usize) -> u32 {
    let vector = regs[comptime!(x / vec)];
    vector[comptime!(x % vec)]
}

/// The warp's K rows of the tile from `k0`: n-tile `j`, key `k0 + 8j + g`, this lane's `d/4`
/// elements from `t·d/4`; zero past `kv_len`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_k<N: Size>(
    k: &Array<Vector<u32, N>>,
    regs: &mut Array<Vector<u32, N>>,
    shape: &AttnShape,
    k_base: usize,
    k0: usize,
    kv_len: usize,
    g: usize,
    t: usize,
    #[comptime] cfg: MmaDecodeConfig,
) {
    let per_row = comptime!(cfg.k_words() / cfg.vec);
    #[unroll]
    for j in 0..cfg.s_tiles() {
        let key = k0 + j * MMA_N + g;
        let start = ((k_base + key * shape.k_s2 as usize + t * comptime!(cfg.head_dim / 4)) * comptime!(cfg.code_bytes)) / comptime!(4 * cfg.vec);
        #[unroll]
        for x in 0..per_row {
            let mut value = Vector::<u32, N>::new(0u32);
            if key < kv_len {
                value = k[start + x];
            }
            regs[comptime!(j * per_row + x)] = value;
        }
    }
}

/// The warp's V rows of the tile from `k0`: for key step `c`, keys `k0 + 16c + {2t, 2t+1, 2t+8,
/// 2t+9}` (slots 0..4), this lane's `dv/8` elements from `g·dv/8`; zero past `kv_len`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_v<N: Size>(
    v: &Array<Vector<u32, N>>,
    regs: &mut Array<Vector<u32, N>>,
    shape: &AttnShape,
    v_base: usize,
    k0: usize,
    kv_len: usize,
    g: usize,
    t: usize,
    #[comptime] cfg: MmaDecodeConfig,
) {
    let per_row = comptime!(cfg.v_words() / cfg.vec);
    #[unroll]
    for c in 0..cfg.steps {
        #[unroll]
        for slot in 0..4usize {
            let key = k0 + v_key(c, slot, t);
            let start = ((v_base + key * shape.v_s2 as usize + g * comptime!(cfg.v_head_dim / 8)) * comptime!(cfg.code_bytes)) / comptime!(4 * cfg.vec);
            #[unroll]
            for x in 0..per_row {
                let mut value = Vector::<u32, N>::new(0u32);
                if key < kv_len {
                    value = v[start + x];
                }
                regs[comptime!((c * 4 + slot) * per_row + x)] = value;
            }
        }
    }
}

/// Codes: each K row of the tile with a non-finite code has them zeroed and its key recorded.
#[cube]
fn clear_k<N: Size>(regs: &mut Array<Vector<u32, N>>, bad_key: &mut u32, k0: usize, g: usize, #[comptime] fcfg: Fp8Config, #[comptime] cfg: MmaDecodeConfig) {
    let per_row = comptime!(cfg.k_words() / cfg.vec);
    #[unroll]
    for j in 0..cfg.s_tiles() {
        clear_row(regs, bad_key, k0 + j * MMA_N + g, comptime!(j * per_row), per_row, fcfg, cfg.vec);
    }
}

/// Codes: [`clear_k`] on the tile's V rows.
#[cube]
fn clear_v<N: Size>(regs: &mut Array<Vector<u32, N>>, bad_key: &mut u32, k0: usize, t: usize, #[comptime] fcfg: Fp8Config, #[comptime] cfg: MmaDecodeConfig) {
    let per_row = comptime!(cfg.v_words() / cfg.vec);
    #[unroll]
    for c in 0..cfg.steps {
        #[unroll]
        for slot in 0..4usize {
            clear_row(regs, bad_key, k0 + v_key(c, slot, t), comptime!((c * 4 + slot) * per_row), per_row, fcfg, cfg.vec);
        }
    }
}

/// One row's `per_row` vectors from `regs[at]`: where a code is non-finite, the codes are
/// zeroed and `key` is recorded in `bad_key` (the lowest such key).
#[cube]
fn clear_row<N: Size>(
    regs: &mut Array<Vector<u32, N>>,
    bad_key: &mut u32,
    key: usize,
    #[comptime] at: usize,
    #[comptime] per_row: usize,
    #[comptime] fcfg: Fp8Config,
    #[comptime] vec: usize,
) {
    let mut any = 0u32;
    #[unroll]
    for x in 0..per_row {
        let vector = regs[comptime!(at + x)];
        #[unroll]
        for e in 0..vec {
            any |= non_finite_bytes(vector[e], fcfg);
        }
    }
    if any != 0u32 {
        *bad_key = min(*bad_key, key as u32);
        #[unroll]
        for x in 0..per_row {
            let mut vector = regs[comptime!(at + x)];
            #[unroll]
            for e in 0..vec {
                vector[e] = clear_marked(vector[e], non_finite_bytes(vector[e], fcfg));
            }
            regs[comptime!(at + x)] = vector;
        }
    }
}

/// The key (from the warp tile's first) of V slot `slot` of key step `c` for lane quad index
/// `t`: slots 0..4 are keys `16c + 2t + {0, 1, 8, 9}`, the k-slots `2t, 2t+1, 2t+8, 2t+9` of
/// P's B fragment.
#[cube]
fn v_key(#[comptime] c: usize, #[comptime] slot: usize, t: usize) -> usize {
    comptime!(c * MMA_K + (slot % 2) + 8 * (slot / 2)) + 2 * t
}

/// The two elements of `pair` (the first in the low half) as the MMA's 16-bit pair: as is, or
/// two codes through the device's conversion.
#[cube]
fn operand_pair<E: Float>(pair: u32, #[comptime] fcfg: Fp8Config, #[comptime] codes: bool) -> Vector<E, Pair> {
    if comptime!(codes) {
        Vector::<E, Pair>::reinterpret(u32::reinterpret(convert_pair(u16::cast_from(pair), fcfg)))
    } else {
        Vector::<E, Pair>::reinterpret(pair)
    }
}

/// S (`16 x warp_keys`, rows past `rows` zero) = Q·K(t)ᵀ into zeroed accumulators.
#[cube]
fn score_matmul<E: Float, N: Size>(
    q_frags: &Sequence<Array<Vector<E, Pair>>>,
    k_regs: &Array<Vector<u32, N>>,
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    #[comptime] cfg: MmaDecodeConfig,
    #[comptime] fcfg: Fp8Config,
) {
    let def = MmaDefinition::<E, E, f32>::new(MMA_M, MMA_N, MMA_K);
    let codes = comptime!(cfg.code_bytes == 1);
    let kw = comptime!(cfg.k_words());
    #[unroll]
    for j in 0..cfg.s_tiles() {
        let frag = s_frags.index_mut(j);
        frag[0] = Vector::new(0.0f32);
        frag[1] = Vector::new(0.0f32);
        #[unroll]
        for s in 0..cfg.qk_steps() {
            let mut b = Array::<Vector<E, Pair>>::new(2usize);
            if comptime!(codes) {
                // Word s: elements 4s .. 4s + 4 of the lane's share.
                let word = word_of(k_regs, comptime!(j * kw + s), cfg.vec);
                b[0] = operand_pair::<E>(word, fcfg, true);
                b[1] = operand_pair::<E>(word >> 16u32, fcfg, true);
            } else {
                b[0] = operand_pair::<E>(word_of(k_regs, comptime!(j * kw + 2 * s), cfg.vec), fcfg, false);
                b[1] = operand_pair::<E>(word_of(k_regs, comptime!(j * kw + 2 * s + 1), cfg.vec), fcfg, false);
            }
            def.execute_inplace(q_frags.index(s), &b, s_frags.index_mut(j));
        }
    }
}

/// Online softmax of the warp's score tile (row `g`, keys `8j + 2t, +1` of tile `j`), with this
/// row's scale; scores become probabilities in place, and the accumulators (columns of rows
/// `2t`, `2t + 1`) are rescaled when a row max moved past the lazy threshold.
#[cube]
#[allow(clippy::too_many_arguments)]
fn softmax(
    s_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    row_max: &mut f32,
    row_sum: &mut f32,
    scale: f32,
    k0: usize,
    pos: usize,
    q_len: usize,
    kv_len: usize,
    t: usize,
    #[comptime] masked: bool,
    #[comptime] cfg: MmaDecodeConfig,
) {
    let mut tile_max = NO_MAX.runtime();
    #[unroll]
    for j in 0..cfg.s_tiles() {
        let frag = s_frags.index_mut(j);
        let mut x = frag[0];
        if comptime!(masked) {
            #[unroll]
            for e in 0..2usize {
                let key = k0 + j * MMA_N + 2 * t + e;
                x[e] = select(is_visible(pos, key, q_len, kv_len, cfg.causal), x[e], NO_MAX);
            }
            frag[0] = x;
        }
        tile_max = max(tile_max, max(x[0], x[1]));
    }
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 1u32));
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 2u32));
    let old_max = *row_max;
    let new_max = select((tile_max - old_max) * scale > LAZY_RESCALE_THRESHOLD, tile_max, old_max);
    let neg_scaled_max = -new_max * scale;
    let mut tile_sum = 0.0f32;
    #[unroll]
    for j in 0..cfg.s_tiles() {
        let frag = s_frags.index_mut(j);
        let mut x = frag[0];
        #[unroll]
        for e in 0..2usize {
            let mut p = f32::exp(fma(x[e], scale, neg_scaled_max));
            if comptime!(masked) {
                p = select(x[e] > MASK_THRESHOLD, p, 0.0);
            }
            x[e] = p;
            tile_sum += p;
        }
        frag[0] = x;
    }
    let alpha = f32::exp((old_max - new_max) * scale);
    // Before the store: `old_max` names the variable behind `row_max` itself (a CubeCL `let` of a
    // dereferenced local), so after `*row_max = new_max` the comparison would always be false.
    let moved = new_max != old_max;
    *row_sum = *row_sum * alpha + tile_sum;
    *row_max = new_max;
    if plane_any(moved) {
        // Accumulator columns belong to rows 2t and 2t + 1: lanes 8t and 8t + 4 hold their
        // factors.
        let mut factors = Vector::<f32, Pair>::empty();
        factors[0] = plane_shuffle(alpha, (8 * t) as u32);
        factors[1] = plane_shuffle(alpha, (8 * t + 4) as u32);
        #[unroll]
        for i in 0..cfg.o_tiles() {
            let frag = o_frags.index_mut(i);
            frag[0] = frag[0] * factors;
            frag[1] = frag[1] * factors;
        }
    }
}

/// Oᵀ (`dv x 8`) += V(t)ᵀ·Pᵀ. The B fragment of key step `c` is P of S tiles `2c`, `2c + 1`
/// (row `g`), rounded to the MMA's type; m-tile `i`'s A fragment pairs keys `(2t, 2t+1)`
/// (registers 0, 1) and `(2t+8, 2t+9)` (2, 3) of columns `g·dv/8 + 2i` (0, 2) and `+ 1` (1, 3).
#[cube]
fn value_matmul<E: Float, N: Size>(
    s_frags: &Sequence<Array<Vector<f32, Pair>>>,
    v_regs: &Array<Vector<u32, N>>,
    o_frags: &mut Sequence<Array<Vector<f32, Pair>>>,
    #[comptime] cfg: MmaDecodeConfig,
    #[comptime] fcfg: Fp8Config,
) {
    let def = MmaDefinition::<E, E, f32>::new(MMA_M, MMA_N, MMA_K);
    let codes = comptime!(cfg.code_bytes == 1);
    let vw = comptime!(cfg.v_words());
    #[unroll]
    for c in 0..cfg.steps {
        let mut b = Array::<Vector<E, Pair>>::new(2usize);
        b[0] = Vector::<E, Pair>::cast_from(s_frags.index(comptime!(2 * c))[0]);
        b[1] = Vector::<E, Pair>::cast_from(s_frags.index(comptime!(2 * c + 1))[0]);
        #[unroll]
        for i in 0..cfg.o_tiles() {
            let mut a = Array::<Vector<E, Pair>>::new(4usize);
            #[unroll]
            for half in 0..2usize {
                // Slots (0, 1) are keys 2t, 2t + 1; (2, 3) are 2t + 8, 2t + 9.
                let first = comptime!((c * 4 + 2 * half) * vw);
                let second = comptime!((c * 4 + 2 * half + 1) * vw);
                if comptime!(codes) {
                    // Word i/2 holds columns 4(i/2) .. +4; this m-tile's two are bytes 2(i%2), +1.
                    let shift = comptime!(16 * (i % 2) as u32);
                    let x = word_of(v_regs, comptime!(first + i / 2), cfg.vec) >> shift;
                    let y = word_of(v_regs, comptime!(second + i / 2), cfg.vec) >> shift;
                    let lo = (x & 0xffu32) | ((y & 0xffu32) << 8u32);
                    let hi = ((x >> 8u32) & 0xffu32) | (y & 0xff00u32);
                    a[comptime!(2 * half)] = operand_pair::<E>(lo, fcfg, true);
                    a[comptime!(2 * half + 1)] = operand_pair::<E>(hi, fcfg, true);
                } else {
                    let x = word_of(v_regs, comptime!(first + i), cfg.vec);
                    let y = word_of(v_regs, comptime!(second + i), cfg.vec);
                    a[comptime!(2 * half)] = operand_pair::<E>((x & 0xffffu32) | (y << 16u32), fcfg, false);
                    a[comptime!(2 * half + 1)] = operand_pair::<E>((x >> 16u32) | (y & 0xffff_0000u32), fcfg, false);
                }
            }
            def.execute_inplace(&a, &b, o_frags.index_mut(i));
        }
    }
}

/// NVRTC compiles of the MMA decode kernel for sm_90a: shared memory as counted, no spills,
/// the HMMA count of the key loop, and (codes) the device's FP8 conversion.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib decode_mma`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::kernel::decode::DecodeArgsCompilationArg;
    use crate::kernel::fma_vec_fp8::Fp8ShapeCompilationArg;
    use crate::kernel::offline_cuda::{array, attn_shape_arg, nvrtc_cubin, settings, Arch, OfflineCuda, Variant};
    use cubecl::wgpu::WgpuRuntime;
    use quattn_core::{DescaleGranularity, Fp8Format};

    pub(crate) fn definition<E: Float + CubeElement>(
        client: &ComputeClient<WgpuRuntime>,
        cfg: MmaDecodeConfig,
        fcfg: Fp8Config,
        direct: bool,
    ) -> KernelDefinition {
        let dec = DecodeArgsCompilationArg { rows: (), splits: (), keys_per_split: (), nan: (), page_shift: (), max_pages: (), lens_at: (), num_pages: () };
        fwd_portable_decode_mma::FwdPortableDecodeMma::<f32, E, WgpuRuntime>::new(
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
            attn_shape_arg(),
            dec,
            Fp8ShapeCompilationArg { kv_heads: (), q_blocks: (), k_blocks: (), nan: () },
            cfg.vec,
            cfg,
            fcfg,
            direct,
        )
        .define()
    }

    /// The variants the launcher picks at the decode shapes, each format.
    fn cases() -> Vec<(String, MmaDecodeConfig, Fp8Config, bool)> {
        let per_head = |format| Fp8Config { format, granularity: DescaleGranularity::PerHead };
        let mut all = Vec::new();
        for (d, rows) in [(128usize, 4usize), (128, 8), (64, 8), (128, 1)] {
            for (code_bytes, steps, fcfg, dtype) in [
                (2usize, 1usize, per_head(Fp8Format::E4M3), "f16"),
                (2, 1, per_head(Fp8Format::E4M3), "bf16"),
                (1, 2, per_head(Fp8Format::E4M3), "e4m3"),
                (1, 2, Fp8Config { format: Fp8Format::E5M2, granularity: DescaleGranularity::PerTensor }, "e5m2"),
            ] {
                let words = d / 4 * code_bytes / 4;
                let vec = [4usize, 2, 1].into_iter().find(|v| words % v == 0 && (d / 8 * code_bytes / 4) % v == 0).unwrap();
                for (causal, direct) in [(false, false), (true, true)] {
                    let cfg = MmaDecodeConfig { head_dim: d, v_head_dim: d, rows, warps: 4, steps, vec, code_bytes, causal, write_lse: true };
                    assert_eq!(cfg.invalid(), None, "{cfg:?}");
                    all.push((format!("decode_mma_{dtype}_d{d}_rows{rows}_causal{causal}_direct{direct}"), cfg, fcfg, direct));
                }
            }
        }
        all
    }

    #[test]
    fn nvrtc_sm90_compiles_the_mma_decode_kernel_with_its_shared_memory_and_no_spills() {
        let Some(cuda) = OfflineCuda::new() else { return };
        let variants = cases().into_iter().map(|(name, cfg, fcfg, direct)| {
            let definition = if name.contains("bf16") {
                definition::<half::bf16>(cuda.client(), cfg, fcfg, direct)
            } else {
                definition::<half::f16>(cuda.client(), cfg, fcfg, direct)
            };
            Variant { name, arch: Arch::Sm90, definition, shared_bytes: Some(cfg.smem_bytes()), spill_free: true }
        });
        // 16-bit inputs also run on the A100 (FP8 needs sm_89's conversion): its d 128 cases.
        let ampere = cases().into_iter().filter(|(n, c, _, _)| c.code_bytes == 2 && n.contains("d128")).map(|(name, cfg, fcfg, direct)| {
            let definition = if name.contains("bf16") {
                definition::<half::bf16>(cuda.client(), cfg, fcfg, direct)
            } else {
                definition::<half::f16>(cuda.client(), cfg, fcfg, direct)
            };
            Variant { name, arch: Arch::Sm80, definition, shared_bytes: Some(cfg.smem_bytes()), spill_free: true }
        });
        cuda.check_all(variants.chain(ampere));
    }

    /// The key loop is on the tensor cores: the kernel's HMMAs are exactly one warp step's (the
    /// loop body is not unrolled: `s_tiles · qk_steps` for S and `steps · o_tiles` for Oᵀ, of
    /// the type's HMMA), and codes go through the device's FP8 conversion (`F2FP...E4M3` or
    /// `.E5M2`, none on 16-bit inputs).
    #[test]
    fn nvrtc_sm90_sass_has_one_warp_steps_hmma_and_the_fp8_conversion() {
        let Some(cuda) = OfflineCuda::new() else { return };
        if quattn_native::tools::find_any_disassembler().is_none() {
            assert!(std::env::var_os("CI").is_none(), "CUDA tools required under CI: no cuobjdump / nvdisasm");
            println!("SKIPPED: no cuobjdump / nvdisasm");
            return;
        }
        let include = crate::kernel::offline_cuda::cuda_include_dir().expect("OfflineCuda found the headers");
        let options = vec!["--gpu-architecture=sm_90a".to_string(), format!("--include-path={}", include.display()), "-Xptxas=-v".to_string()];
        let mut failures = Vec::new();
        for (name, cfg, fcfg, direct) in cases().into_iter().filter(|(n, c, _, _)| n.contains("d128_rows4") && !c.causal) {
            let bf16 = name.contains("bf16");
            let definition = if bf16 {
                definition::<half::bf16>(cuda.client(), cfg, fcfg, direct)
            } else {
                definition::<half::f16>(cuda.client(), cfg, fcfg, direct)
            };
            let (source, _) = cuda.translate(definition, Arch::Sm90).unwrap();
            let (cubin, _) = nvrtc_cubin(&source, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            let sass = quattn_native::sass::disassemble(&cubin).unwrap();
            let hist = quattn_native::sass::opcode_histogram(&sass);
            let count = |f: &dyn Fn(&str) -> bool| -> usize { hist.iter().filter(|(op, _)| f(op)).map(|(_, n)| n).sum() };
            let hmma_type = if bf16 { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
            let hmma = count(&|op| op == hmma_type);
            let expected = cfg.s_tiles() * cfg.qk_steps() + cfg.steps * cfg.o_tiles();
            let tag = match fcfg.format {
                quattn_core::Fp8Format::E4M3 => ".E4M3.",
                quattn_core::Fp8Format::E5M2 => ".E5M2.",
            };
            let conversions = count(&|op| op.starts_with("F2FP") && op.contains(tag));
            let codes = cfg.code_bytes == 1;
            println!("{name}: {hmma} {hmma_type} (expected {expected}), {conversions} FP8 conversions");
            if hmma != expected || (conversions > 0) != codes {
                failures.push(name);
            }
        }
        assert!(failures.is_empty(), "HMMA count or FP8 conversions wrong for: {failures:?}");
    }
}
