//! Split-KV decode (flash-decoding) on the vector FMA kernel's tile pieces.
//!
//! Decode steps (a few query positions against a long KV cache) leave the per-head kernels with
//! one small query tile per (batch, q head), each streaming the whole cache: K/V are read once
//! per q head, and `batch · q_heads` cubes cannot keep a large GPU's memory system busy. Here a
//! cube owns one (row block, split, KV head, batch):
//!
//! - **packing**: the `group` q heads of the KV head and their `q_len` positions form
//!   `rows = group · q_len` packed query rows, row `r` = q head `kv_head · group + r / q_len` at
//!   position `r % q_len` (so a head's positions are consecutive rows), cut into `row_blocks =
//!   ceil(rows / bq)` blocks of `bq` rows: block `rb` holds rows `[rb · bq, rb · bq + bq)`. K
//!   and V are read once per block (once per group on decode shapes, whose rows fit one
//!   block; more rows are a prefill against a paged cache). The last block is padded with zero
//!   rows; padded rows are never written.
//! - **split**: the keys of a (batch, KV head) are cut into `splits` ranges of
//!   `keys_per_split` keys (a multiple of `bk`, so only the last range ends inside a tile);
//!   split `s` streams `[s · keys_per_split, min((s+1) · keys_per_split, kv_len))`.
//! - **causal**, bottom-right aligned per position: row `r` sees key `j` iff
//!   `j + q_len <= r % q_len + kv_len`. A block's rows hold positions `[lo, hi]` (consecutive
//!   positions of one head, or all of them where the block crosses from one head to the next):
//!   keys below `kv_len + 1 - q_len + lo` are visible to every row of the block, so only tiles
//!   reaching past it take the mask (a runtime branch, as in `fma_vec`), and tiles from `kv_len
//!   + 1 - q_len + hi` on are visible to none, so the block's splits stop before them.
//! - **output**: with one split the cube writes O (input type) and the LSE directly; with
//!   several it writes a partial state per row (O normalized by its own row sum, in f32, and its
//!   natural-log LSE, `NO_MAX` for a row that saw no key in that split), and [`decode_merge`]
//!   combines them: `O = Σ_s e^(lse_s - m) O_s / Σ_s e^(lse_s - m)`, `LSE = m + ln Σ_s
//!   e^(lse_s - m)` with `m = max_s lse_s`. Rows that see no key get `O = 0`, `LSE = -inf`.
//!
//! Each KV tile is the FMA kernel's step unchanged (prefetch of K and V into registers, Q·Kᵀ on
//! 4-wide vectors, online softmax with the lazy rescale, P·V), so the numerics are those of the
//! vector FMA kernel.

use cubecl::prelude::*;

use super::fma_vec::{
    cube_row_reduce, gather_transposed_len, gather_v_len, online_softmax, stage_k, stage_v, thread_score_matmul,
    thread_value_matmul, unit_gather_transposed, unit_gather_v, FmaVecConfig, W,
};
use super::decode_rows::POISON_THRESHOLD;
use super::fma_vec_mods::{key_hi, key_lo, softcap_score, ModArgs, ModsConfig};
use super::{AttnShape, MASK_THRESHOLD, NO_MAX};

/// The score modifiers a decode kernel is compiled with (part of its compile-time key; the
/// values come in [`ModArgs`] and the head parameters): the window sides that bound the keys
/// (causal masking is a right extent of 0), softcap, ALiBi, top-left alignment (else
/// bottom-right at the sequence's own length), and sinks.
///
/// Row `r` (position `p = r % q_len`) sits at `a = p + shift` (`shift` is `kv_len`, or `q_len`
/// top-left: `a(p) + q_len`, unsigned) and sees keys `[key_lo(a), key_hi(a))`. A split covers
/// the keys some row of its cube sees, from the first such key rounded down to a whole tile
/// (so tiles start at multiples of `bk`, as paged reads need), `keys_per_split` each; tiles no
/// row sees are never loaded, tiles every row sees whole carry no mask. Scores are scaled,
/// softcapped (`cap · tanh(s / cap)`), then ALiBi (`- slope · |a - key - q_len|`), then
/// masked. Sinks join the denominator once: in the kernel's epilogue with one split, in
/// [`decode_merge`] with several (the partial states leave them out). Rows that see no key keep
/// `O = 0`, `LSE = -inf`, sink or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DecodeMods {
    pub mc: ModsConfig,
    pub top_left: bool,
    pub sinks: bool,
}

/// The runtime split of one decode launch and the packed tile's height.
#[derive(CubeType, CubeLaunch)]
pub struct DecodeArgs {
    /// `group · q_len` packed query rows per (batch, KV head): `ceil(rows / bq)` row blocks (1
    /// for the row kernels, whose `bq` is `rows`).
    pub rows: u32,
    pub splits: u32,
    /// Keys per split, a multiple of the KV tile.
    pub keys_per_split: u32,
    /// The NaN the merge writes for rows a split marks poisoned (passed in: WGSL cannot spell
    /// it).
    pub nan: f32,
    /// Paged caches (the kernels' `paged`): log2 of the page size, the block table's columns,
    /// and where the per-sequence lengths start in the table buffer (`batch · max_pages`).
    pub page_shift: u32,
    pub max_pages: u32,
    pub lens_at: u32,
    /// Pages in each pool: a table entry past them reads the last page rather than past the
    /// pool (the host validates the table; this keeps a bad one inside the buffers).
    pub num_pages: u32,
}

/// The keys sequence `batch` holds: its entry of a paged cache's lengths, or the shape's.
#[cube]
pub(crate) fn seq_kv_len(shape: &AttnShape, dec: &DecodeArgs, table: &Array<u32>, batch: usize, #[comptime] paged: bool) -> usize {
    if comptime!(paged) {
        // At most the keys the sequence's table row holds, whatever the length says.
        min(table[dec.lens_at as usize + batch], dec.max_pages << dec.page_shift) as usize
    } else {
        shape.kv_len as usize
    }
}

/// The K/V row of key `key` of sequence `batch`: with a paged cache, its slot in the pool
/// (`page · page_size + key mod page_size`, the page from the sequence's block-table row),
/// else the key itself. Only for keys the sequence holds: entries past them are never read.
#[cube]
pub(crate) fn key_row(dec: &DecodeArgs, table: &Array<u32>, batch: usize, key: usize, #[comptime] paged: bool) -> usize {
    if comptime!(paged) {
        let shift = dec.page_shift as usize;
        let page = min(table[batch * dec.max_pages as usize + (key >> shift)], dec.num_pages - 1) as usize;
        (page << shift) | (key & ((1usize << shift) - 1))
    } else {
        key
    }
}

/// How the tile of keys from `k0` (`< kv_len`) is gathered: `(base, first row, rows valid
/// below)` for the gather functions, which read row `first + i` at `base + (first + i) ·
/// stride` while it is below the bound. Strided tensors: the tensor's base, `k0`, `kv_len`;
/// paged: the pool row of `k0` folded into the base (the tile lies in one page), 0, and the
/// keys left.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile_rows(
    dec: &DecodeArgs,
    table: &Array<u32>,
    batch: usize,
    base: usize,
    stride: usize,
    k0: usize,
    kv_len: usize,
    #[comptime] paged: bool,
) -> (usize, usize, usize) {
    if comptime!(paged) {
        (base + key_row(dec, table, batch, k0, true) * stride, 0usize, kv_len - k0)
    } else {
        (base, k0, kv_len)
    }
}

/// A split's keys: the first, the number of `bk`-key tiles, and the keys every packed position
/// sees (`kv_len`, or causal bottom-right `kv_len + 1 - q_len + lo` for rows of positions from
/// `lo`).
#[derive(CubeType, Clone, Copy)]
pub(crate) struct SplitKeys {
    pub begin: usize,
    pub tiles: usize,
    pub full: usize,
    /// With modifiers, the first key every row sees (tiles starting below it are masked).
    pub full_lo: usize,
}

/// [`SplitKeys`] of split `split` of a sequence of `kv_len` keys for rows of every position:
/// keys `[split · keys_per_split, min(+ keys_per_split, kv_len))`, whole tiles but the last.
#[cube]
pub(crate) fn split_keys(
    shape: &AttnShape,
    dec: &DecodeArgs,
    kv_len: usize,
    split: usize,
    #[comptime] bk: usize,
    #[comptime] causal: bool,
) -> SplitKeys {
    block_split_keys(shape, dec, kv_len, split, 0usize, 0usize, bk, causal, false)
}

/// [`split_keys`], and with `blocked` for rows of positions `[lo, hi]` only (`hi < q_len`;
/// unused otherwise): causal, the split also stops at the keys the last position sees
/// (`kv_len + 1 - q_len + hi`), and the keys every row sees start from position `lo`'s.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn block_split_keys(
    shape: &AttnShape,
    dec: &DecodeArgs,
    kv_len: usize,
    split: usize,
    lo: usize,
    hi: usize,
    #[comptime] bk: usize,
    #[comptime] causal: bool,
    #[comptime] blocked: bool,
) -> SplitKeys {
    let q_len = shape.q_len as usize;
    let begin = split * dec.keys_per_split as usize;
    let mut end = min(begin + dec.keys_per_split as usize, kv_len);
    let mut full = kv_len;
    if causal {
        if blocked {
            // Position `p` sees the keys below `kv_len + 1 + p - q_len` (none where that is
            // not positive); `q_len` is added on both sides to stay unsigned.
            let seen_hi = kv_len + 1 + hi;
            let seen_lo = kv_len + 1 + lo;
            end = min(end, select(seen_hi > q_len, seen_hi - q_len, 0));
            full = select(seen_lo > q_len, seen_lo - q_len, 0);
        } else {
            full = select(kv_len + 1 > q_len, kv_len + 1 - q_len, 0);
        }
    }
    let tiles = select(end > begin, (end - begin + bk - 1) / bk, 0);
    SplitKeys { begin, tiles, full, full_lo: 0usize }
}

/// `a(p) + q_len` of position `p` in a sequence of `kv_len` keys ([`DecodeMods`]).
#[cube]
pub(crate) fn mod_shift(q_len: usize, kv_len: usize, #[comptime] dm: DecodeMods) -> usize {
    if comptime!(dm.top_left) {
        q_len
    } else {
        kv_len
    }
}

/// [`SplitKeys`] with modifiers for rows of positions `[pos_lo, pos_hi]` ([`DecodeMods`]):
/// split `split` starts `keys_per_split · split` keys after the first key some row sees
/// (rounded down to a tile) and stops at the last; `full_lo..full` are the keys every row sees.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mod_split_keys(
    shape: &AttnShape,
    dec: &DecodeArgs,
    mods: &ModArgs,
    kv_len: usize,
    split: usize,
    pos_lo: usize,
    pos_hi: usize,
    #[comptime] bk: usize,
    #[comptime] dm: DecodeMods,
) -> SplitKeys {
    let q_len = shape.q_len as usize;
    let shift = mod_shift(q_len, kv_len, dm);
    // The window only moves right with the position.
    let lo = key_lo(pos_lo + shift, q_len, kv_len, mods, dm.mc);
    let hi = key_hi(pos_hi + shift, q_len, kv_len, mods, dm.mc);
    let full_lo = key_lo(pos_hi + shift, q_len, kv_len, mods, dm.mc);
    let full = key_hi(pos_lo + shift, q_len, kv_len, mods, dm.mc);
    let begin = lo / bk * bk + split * dec.keys_per_split as usize;
    let end = min(hi, begin + dec.keys_per_split as usize);
    let tiles = select(end > begin && hi > lo, (end - begin + bk - 1) / bk, 0);
    SplitKeys { begin, tiles, full, full_lo }
}

/// Score `x` (scaled) of key `key` for a row at `a` that sees `[lo, hi)`: softcap, ALiBi
/// (`slope`), then, on a tile some row does not see whole (`masked`), `NO_MAX` outside the
/// row's keys.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mod_score(
    x: f32,
    key: usize,
    a: usize,
    lo: usize,
    hi: usize,
    slope: f32,
    q_len: usize,
    mods: &ModArgs,
    masked: bool,
    #[comptime] mc: ModsConfig,
) -> f32 {
    let mut s = x;
    if comptime!(mc.softcap) {
        s = softcap_score(s, mods.softcap);
    }
    if comptime!(mc.alibi) {
        let kpos = key + q_len;
        let dist = select(a >= kpos, a - kpos, kpos - a);
        s -= slope * f32::cast_from(dist);
    }
    if masked {
        s = select(key >= lo && key < hi, s, NO_MAX);
    }
    s
}

/// One cube per (row block, split, KV head, batch): grid `(row_blocks · splits, kv_heads,
/// batch)`, x = `rb · splits + split`, `row_blocks = ceil(rows / cfg.bq)`. `direct`: one split,
/// O and the LSE written in place (`part_o`/`part_lse` unused); otherwise the partial state goes
/// to `part_o` (`[batch][kv_head][split][row_blocks · bq][dv]` f32) and `part_lse`
/// (`[batch][kv_head][split][row_blocks · bq]`). `blocked`: more than one row block. Without
/// it the one block starts at row 0 and holds every position, known at compile time, so the
/// decode shapes' kernel carries none of the block arithmetic (ptxas: 16 more registers at
/// d 128 otherwise, a resident cube fewer).
///
/// `mods` and `head_params` (the sinks `[q_heads]`, then the ALiBi slopes `[q_heads]`): score
/// modifiers as [`DecodeMods`] `dm` says, with `shape.scale` 1 (the modifiers scale the scores
/// themselves, by `mods.scale`); both `None` without modifiers, which binds nothing.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fwd_portable_decode<E: Float, S: Float, N: Size>(
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
    #[comptime] cfg: FmaVecConfig,
    #[comptime] direct: bool,
    #[comptime] paged: bool,
    #[comptime] blocked: bool,
    #[comptime] dm: DecodeMods,
) {
    let unit = UNIT_POS as usize;
    let unit_row = unit / cfg.tc;
    let unit_col = unit % cfg.tc;

    let splits = dec.splits as usize;
    let kv_head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let q_len = shape.q_len as usize;
    let kv_len = seq_kv_len(shape, dec, table, batch, paged);
    let group = shape.group as usize;
    let rows = dec.rows as usize;
    // The block's packed rows `[row0, row0 + bq)`, real below `rows`, and the positions they
    // hold: consecutive ones of one head, or every position where the block crosses heads.
    let mut split = CUBE_POS_X as usize;
    let mut row0 = 0usize;
    let mut pos_lo = 0usize;
    let mut pos_hi = 0usize;
    if comptime!(blocked) {
        split = CUBE_POS_X as usize % splits;
        row0 = CUBE_POS_X as usize / splits * cfg.bq;
        let last = min(row0 + cfg.bq, rows) - 1;
        let one_head = row0 / q_len == last / q_len;
        pos_lo = select(one_head, row0 % q_len, 0);
        pos_hi = select(one_head, last % q_len, q_len - 1);
    }

    let k_base = batch * shape.k_s0 as usize + kv_head * shape.k_s1 as usize;
    let v_base = batch * shape.v_s0 as usize + kv_head * shape.v_s1 as usize;

    let mut q_stage = SharedMemory::<Vector<S, N>>::new(comptime!(cfg.head_dim * cfg.q_pitch()));
    let mut kv_stage = SharedMemory::<Vector<S, N>>::new(cfg.kv_stage_len());
    let mut p_stage = SharedMemory::<Vector<f32, N>>::new(comptime!(cfg.bk * cfg.p_pitch()));
    let mut red_stage = SharedMemory::<f32>::new(comptime!(cfg.bq * cfg.tc));

    cube_load_packed_q::<E, S, N>(q, &mut q_stage, shape, batch, kv_head * group, row0, rows, cfg);

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

    let keys = decode_split_keys(shape, dec, mods, kv_len, split, pos_lo, pos_hi, cfg.bk, cfg.causal, blocked, dm);
    let (k_begin, num_tiles) = (keys.begin, keys.tiles);

    let mut k_regs = Array::<Vector<E, N>>::new(comptime!(gather_transposed_len(cfg.bk, cfg.head_dim, cfg.units())));
    let mut v_regs = Array::<Vector<E, N>>::new(comptime!(gather_v_len(&cfg)));
    let k_stride = shape.k_s2 as usize;
    let v_stride = shape.v_s2 as usize;
    // A paged cache's tile lies in one page (`bk` divides the page size, tiles start at
    // multiples of `bk`): its rows are consecutive pool rows from the slot of its first key,
    // gathered as a tensor's rows from 0 with `kv_len - k0` of them valid.
    if num_tiles > 0 {
        let (base, row0, len) = tile_rows(dec, table, batch, k_base, k_stride, k_begin, kv_len, paged);
        unit_gather_transposed::<E, N>(k, &mut k_regs, base, k_stride, row0, len, cfg.bk, cfg.head_dim, cfg);
    }

    sync_cube();

    for tile in 0..num_tiles {
        let k0 = k_begin + tile * cfg.bk;
        let masked = tile_masked(k0, &keys, mods, cfg.bk);

        stage_k::<E, S, N>(&k_regs, &mut kv_stage, cfg);
        sync_cube();
        let (v_at, v_row0, v_len) = tile_rows(dec, table, batch, v_base, v_stride, k0, kv_len, paged);
        unit_gather_v::<E, N>(v, &mut v_regs, v_at, v_stride, v_row0, v_len, cfg);

        thread_score_matmul::<S, N>(&q_stage, &kv_stage, &mut scores, unit_row, unit_col, cfg);
        #[comptime]
        match mods {
            ComptimeOption::Some(m) => {
                thread_modify_packed::<N>(&mut scores, shape, m, head_params, kv_head, kv_len, k0, row0, rows, masked, unit_row, unit_col, cfg, dm);
            }
            ComptimeOption::None => {
                if masked {
                    thread_mask_packed::<N>(&mut scores, q_len, kv_len, k0, row0, unit_row, unit_col, cfg);
                }
            }
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

        stage_v::<E, S, N>(&v_regs, &mut kv_stage, cfg);
        sync_cube();
        if tile + 1 < num_tiles {
            let (base, row0, len) = tile_rows(dec, table, batch, k_base, k_stride, k0 + cfg.bk, kv_len, paged);
            unit_gather_transposed::<E, N>(k, &mut k_regs, base, k_stride, row0, len, cfg.bk, cfg.head_dim, cfg);
        }

        thread_value_matmul::<f32, S, N>(&p_stage, &kv_stage, &mut acc, unit_row, unit_col, cfg);
        sync_cube();
    }

    cube_row_reduce(&mut row_sum, &mut red_stage, unit_row, unit_col, false, cfg);

    let rm = comptime!(cfg.rm());
    let cq = comptime!(cfg.cq());
    if comptime!(direct && dm.sinks) {
        // One split: the sink joins the denominator here (several: in the merge).
        #[unroll]
        for i in 0..rm {
            let r = row0 + unit_row * rm + i;
            let l = row_sum[i];
            if r < rows && l > 0.0 {
                let m = row_max[i];
                let sink = head_param(head_params, kv_head * group + r / q_len);
                let big = max(m, sink);
                let alpha = f32::exp(m - big);
                row_sum[i] = l * alpha + f32::exp(sink - big);
                row_max[i] = big;
                #[unroll]
                for c in 0..cq {
                    acc[i * cq + c] = acc[i * cq + c] * Vector::new(alpha);
                }
            }
        }
    }
    let kv_heads = shape.q_heads as usize / group;
    #[unroll]
    for i in 0..rm {
        let r = row0 + unit_row * rm + i;
        if r < rows {
            let l = row_sum[i];
            let seen = l > 0.0;
            let inv = Vector::<f32, N>::new(select(seen, 1.0 / l, 0.0));
            let state_lse = row_max[i] * shape.scale + f32::ln(select(seen, l, 1.0));
            if direct {
                let head = kv_head * group + r / q_len;
                let pos = r % q_len;
                let o_row = (batch * shape.o_s0 as usize + head * shape.o_s1 as usize + pos * shape.o_s2 as usize) / W;
                #[unroll]
                for c in 0..cq {
                    o[o_row + c * cfg.tc + unit_col] = Vector::cast_from(acc[i * cq + c] * inv);
                }
                if cfg.write_lse {
                    if unit_col == 0 {
                        lse[(batch * shape.q_heads as usize + head) * q_len + pos] = select(seen, state_lse, shape.lse_empty);
                    }
                }
            } else {
                // A split's states hold every block's rows.
                let mut state = ((batch * kv_heads + kv_head) * splits + split) * cfg.bq + r;
                if comptime!(blocked) {
                    let state_rows = (rows + cfg.bq - 1) / cfg.bq * cfg.bq;
                    state = ((batch * kv_heads + kv_head) * splits + split) * state_rows + r;
                }
                let o_row = state * cfg.v_pitch();
                #[unroll]
                for c in 0..cq {
                    part_o[o_row + c * cfg.tc + unit_col] = acc[i * cq + c] * inv;
                }
                if unit_col == 0 {
                    part_lse[state] = select(seen, state_lse, NO_MAX);
                }
            }
        }
    }
}

/// The split's keys for rows of positions `[pos_lo, pos_hi]` (all positions without `blocked`):
/// [`block_split_keys`], or with modifiers [`mod_split_keys`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_split_keys(
    shape: &AttnShape,
    dec: &DecodeArgs,
    mods: &ComptimeOption<ModArgs>,
    kv_len: usize,
    split: usize,
    pos_lo: usize,
    pos_hi: usize,
    #[comptime] bk: usize,
    #[comptime] causal: bool,
    #[comptime] blocked: bool,
    #[comptime] dm: DecodeMods,
) -> SplitKeys {
    #[comptime]
    match mods {
        ComptimeOption::Some(m) => {
            let mut hi = pos_hi;
            if comptime!(!blocked) {
                hi = shape.q_len as usize - 1;
            }
            mod_split_keys(shape, dec, m, kv_len, split, pos_lo, hi, bk, dm)
        }
        ComptimeOption::None => block_split_keys(shape, dec, kv_len, split, pos_lo, pos_hi, bk, causal, blocked),
    }
}

/// Whether the tile of keys from `k0` needs the mask: it reaches past the keys every row sees
/// (or, with modifiers, starts before them).
#[cube]
pub(crate) fn tile_masked(k0: usize, keys: &SplitKeys, mods: &ComptimeOption<ModArgs>, #[comptime] bk: usize) -> bool {
    #[comptime]
    match mods {
        ComptimeOption::Some(_) => k0 + bk > keys.full || k0 < keys.full_lo,
        ComptimeOption::None => k0 + bk > keys.full,
    }
}

/// Entry `index` of the head parameters (0 without them).
#[cube]
pub(crate) fn head_param(head_params: &ComptimeOption<Array<f32>>, index: usize) -> f32 {
    #[comptime]
    match head_params {
        ComptimeOption::Some(p) => p[index],
        ComptimeOption::None => f32::new(0.0),
    }
}

/// The unit's scores with modifiers ([`DecodeMods`]): scaled by `mods.scale`, then as
/// [`mod_score`] with each packed row's position and Q head (padding rows take the last real
/// row's; they are never written). The mask's bounds are computed on masked tiles only, which
/// keeps them out of the registers the tile loop holds (ptxas, sm_90: the f16-staged tile at
/// d 128 spills otherwise).
#[cube]
#[allow(clippy::too_many_arguments)]
fn thread_modify_packed<N: Size>(
    scores: &mut Array<Vector<f32, N>>,
    shape: &AttnShape,
    mods: &ModArgs,
    head_params: &ComptimeOption<Array<f32>>,
    kv_head: usize,
    kv_len: usize,
    k0: usize,
    row0: usize,
    rows: usize,
    masked: bool,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
    #[comptime] dm: DecodeMods,
) {
    let rm = comptime!(cfg.rm());
    let kq = comptime!(cfg.kq());
    let q_len = shape.q_len as usize;
    let group = shape.group as usize;
    let shift = mod_shift(q_len, kv_len, dm);
    #[unroll]
    for i in 0..rm {
        let r = min(row0 + unit_row * rm + i, rows - 1);
        let mut a = 0usize;
        let mut slope = 0.0f32;
        if comptime!(dm.mc.alibi) {
            a = r % q_len + shift;
            slope = head_param(head_params, shape.q_heads as usize + kv_head * group + r / q_len);
        }
        #[unroll]
        for j in 0..kq {
            let mut s = scores[i * kq + j];
            #[unroll]
            for e in 0..W {
                let key = k0 + (j * cfg.tc + unit_col) * W + e;
                s[e] = mod_score(s[e] * mods.scale, key, a, 0usize, 0usize, slope, q_len, mods, false, dm.mc);
            }
            scores[i * kq + j] = s;
        }
    }
    if masked {
        #[unroll]
        for i in 0..rm {
            let r = min(row0 + unit_row * rm + i, rows - 1);
            let a = r % q_len + shift;
            let lo = key_lo(a, q_len, kv_len, mods, dm.mc);
            let hi = key_hi(a, q_len, kv_len, mods, dm.mc);
            #[unroll]
            for j in 0..kq {
                let mut s = scores[i * kq + j];
                #[unroll]
                for e in 0..W {
                    let key = k0 + (j * cfg.tc + unit_col) * W + e;
                    s[e] = select(key >= lo && key < hi, s[e], NO_MAX);
                }
                scores[i * kq + j] = s;
            }
        }
    }
}

/// Stages the packed rows `[row0, row0 + bq)` of Q (zero rows from `rows` on) as Qᵀ,
/// `[dim][bq/W]` vectors of W rows, converted to `S`: each task reads a W x W block (W
/// consecutive dims of W consecutive rows, each row at its own head and position) and writes it
/// transposed.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cube_load_packed_q<E: Float, S: Float, N: Size>(
    q: &Array<Vector<E, N>>,
    stage: &mut SharedMemory<Vector<S, N>>,
    shape: &AttnShape,
    batch: usize,
    head0: usize,
    row0: usize,
    rows: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let row_quads = comptime!(cfg.bq / W);
    let tasks = comptime!(cfg.bq / W * (cfg.head_dim / W));
    let per_unit = comptime!(tasks.div_ceil(cfg.units()));
    let q_len = shape.q_len as usize;
    let q_base = batch * shape.q_s0 as usize;
    #[unroll]
    for step in 0..per_unit {
        let t = step * cfg.units() + UNIT_POS as usize;
        if t < tasks {
            let rq = t % row_quads;
            let dq = t / row_quads;
            let mut block = Array::<Vector<E, N>>::new(W);
            #[unroll]
            for e in 0..W {
                let r = row0 + rq * W + e;
                let mut value = Vector::<E, N>::new(E::from_int(0));
                if r < rows {
                    let head = head0 + r / q_len;
                    let pos = r % q_len;
                    value = q[(q_base + head * shape.q_s1 as usize + pos * shape.q_s2 as usize) / W + dq];
                }
                block[e] = value;
            }
            #[unroll]
            for x in 0..W {
                let mut column = Vector::<S, N>::empty();
                #[unroll]
                for e in 0..W {
                    column[e] = S::cast_from(block[e][x]);
                }
                stage[(dq * W + x) * row_quads + rq] = column;
            }
        }
    }
}

/// Sets invisible scores to `NO_MAX`: keys past `kv_len`, and (causal) keys above the
/// bottom-right diagonal of the position `r % q_len` of each packed row `r` (the block's from
/// `row0`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn thread_mask_packed<N: Size>(
    scores: &mut Array<Vector<f32, N>>,
    q_len: usize,
    kv_len: usize,
    k0: usize,
    row0: usize,
    unit_row: usize,
    unit_col: usize,
    #[comptime] cfg: FmaVecConfig,
) {
    let rm = comptime!(cfg.rm());
    let kq = comptime!(cfg.kq());
    #[unroll]
    for i in 0..rm {
        let pos = (row0 + unit_row * rm + i) % q_len;
        #[unroll]
        for j in 0..kq {
            let mut s = scores[i * kq + j];
            #[unroll]
            for e in 0..W {
                let key = k0 + (j * cfg.tc + unit_col) * W + e;
                let mut visible = key < kv_len;
                if cfg.causal {
                    visible = visible && key + q_len <= pos + kv_len;
                }
                s[e] = select(visible, s[e], NO_MAX);
            }
            scores[i * kq + j] = s;
        }
    }
}

/// Combines the splits' partial states into O and the LSE. One cube per (packed row, KV head,
/// batch): grid `(rows, kv_heads, batch)`, `dv / W` units, unit `c` owning output vector `c`; a
/// split's states hold `ceil(rows / bq) · bq` rows.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn decode_merge<E: Float, N: Size>(
    part_o: &Array<Vector<f32, N>>,
    part_lse: &Array<f32>,
    o: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    shape: &AttnShape,
    dec: &DecodeArgs,
    sinks: &ComptimeOption<Array<f32>>,
    #[comptime] bq: usize,
    #[comptime] v_head_dim: usize,
    #[comptime] write_lse: bool,
) {
    let r = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Y as usize;
    let batch = CUBE_POS_Z as usize;
    let c = UNIT_POS as usize;
    let pitch = comptime!(v_head_dim / W);
    let q_len = shape.q_len as usize;
    let group = shape.group as usize;
    let kv_heads = shape.q_heads as usize / group;
    let splits = dec.splits as usize;
    let first = (batch * kv_heads + kv_head) * splits;
    // Whole blocks of `bq` rows (one for the row kernels).
    let pitch_rows = (dec.rows as usize + bq - 1) / bq * bq;

    // The launch merges two splits or more.
    let mut m = part_lse[first * pitch_rows + r];
    for s in 1..splits {
        m = max(m, part_lse[(first + s) * pitch_rows + r]);
    }
    let mut total = 0.0f32;
    let mut acc = Vector::<f32, N>::new(0.0f32);
    // A split of the row-decode kernel that met a non-finite code the row sees marks its state
    // (FP8 inputs): the row is NaN.
    let poisoned = m > POISON_THRESHOLD;
    if m > MASK_THRESHOLD && !poisoned {
        // With sinks (`[q_heads]`), a row that sees a key weighs its head's sink once, here.
        #[comptime]
        match sinks {
            ComptimeOption::Some(p) => {
                let sink = p[kv_head * group + r / q_len];
                m = max(m, sink);
                total = f32::exp(sink - m);
            }
            ComptimeOption::None => {}
        }
        for s in 0..splits {
            let state = (first + s) * pitch_rows + r;
            let l = part_lse[state];
            // Splits that saw no key hold NO_MAX and weigh nothing.
            let w = select(l > MASK_THRESHOLD, f32::exp(l - m), 0.0);
            total += w;
            acc += part_o[state * pitch + c] * Vector::<f32, N>::new(w);
        }
    }
    let seen = total > 0.0;
    let inv = Vector::<f32, N>::new(select(seen, 1.0 / total, 0.0));
    let head = kv_head * group + r / q_len;
    let pos = r % q_len;
    let o_row = (batch * shape.o_s0 as usize + head * shape.o_s1 as usize + pos * shape.o_s2 as usize) / W;
    let mut value = acc * inv;
    let mut row_lse = select(seen, m + f32::ln(select(seen, total, 1.0)), shape.lse_empty);
    if poisoned {
        value = Vector::new(dec.nan);
        row_lse = dec.nan;
    }
    o[o_row + c] = Vector::cast_from(value);
    if write_lse {
        if c == 0 {
            lse[(batch * shape.q_heads as usize + head) * q_len + pos] = row_lse;
        }
    }
}

/// The CUDA C++ CubeCL generates for the decode kernel (one split and several, causal and not,
/// f16 stages and f32, in row blocks for paged prefill) and the merge, compiled offline by
/// NVRTC for sm_90 (no GPU): the source declares the shared memory `FmaVecTiles::smem_bytes`
/// counts (less the reduction scratch, which plane shuffles leave unused) and ptxas accepts it;
/// the kernel spills nothing.
///
/// `cargo test --release -p quattn-cubecl --features cuda --lib decode`
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use crate::decode::decode_candidates;
    use crate::kernel::fma_vec_mods::ModArgsCompilationArg;
    use crate::kernel::offline_cuda::{client, cuda_include_dir, nvrtc_cubin, ADDR, COMPILE_LOCK};
    use crate::kernel::AttnShapeCompilationArg;
    use cubecl::cuda::CudaCompiler;
    use cubecl::wgpu::WgpuRuntime;
    use cubecl::Compiler as _;

    fn shape() -> AttnShapeCompilationArg {
        AttnShapeCompilationArg {
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
        }
    }

    fn dec() -> DecodeArgsCompilationArg {
        DecodeArgsCompilationArg { rows: (), splits: (), keys_per_split: (), nan: (), page_shift: (), max_pages: (), lens_at: (), num_pages: () }
    }

    fn mod_args() -> ComptimeOptionCompilationArg<ModArgs> {
        ComptimeOptionCompilationArg::Some(ModArgsCompilationArg { row_shift: (), left: (), right: (), scale: (), softcap: () })
    }

    fn decode_definition<E: Float + CubeElement, S: Float + CubeElement>(
        client: &ComputeClient<WgpuRuntime>,
        cfg: FmaVecConfig,
        direct: bool,
        paged: bool,
        blocked: bool,
        dm: Option<DecodeMods>,
    ) -> KernelDefinition {
        let array = || ArrayCompilationArg { inplace: None };
        let settings = KernelSettings::default().cube_dim(CubeDim::new_1d(cfg.units() as u32)).address_type(AddressType::U32);
        fwd_portable_decode::FwdPortableDecode::<E, S, WgpuRuntime>::new(
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
            shape(),
            dec(),
            if dm.is_some() { mod_args() } else { ComptimeOptionCompilationArg::None },
            if dm.is_some() { ComptimeOptionCompilationArg::Some(array()) } else { ComptimeOptionCompilationArg::None },
            W,
            cfg,
            direct,
            paged,
            blocked,
            dm.unwrap_or_default(),
        )
        .define()
    }

    fn merge_definition<E: Float + CubeElement>(client: &ComputeClient<WgpuRuntime>, bq: usize, dv: usize, sinks: bool) -> KernelDefinition {
        let array = || ArrayCompilationArg { inplace: None };
        let settings = KernelSettings::default().cube_dim(CubeDim::new_1d((dv / W) as u32)).address_type(AddressType::U32);
        decode_merge::DecodeMerge::<E, WgpuRuntime>::new(
            settings,
            client.clone(),
            array(),
            array(),
            array(),
            array(),
            shape(),
            dec(),
            if sinks { ComptimeOptionCompilationArg::Some(array()) } else { ComptimeOptionCompilationArg::None },
            W,
            bq,
            dv,
            true,
        )
        .define()
    }

    #[test]
    fn nvrtc_sm90_compiles_decode_and_merge_with_the_shared_memory_and_no_spills() {
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
        let Some(client) = client() else { return };
        let mut options = <CudaCompiler as cubecl::Compiler>::CompilationOptions::default();
        options.supports_features.fast_math = true;
        let nvrtc_options = vec![
            "--gpu-architecture=sm_90".to_string(),
            format!("--include-path={}", include.display()),
            "--std=c++17".to_string(),
            "-Xptxas=-v".to_string(),
        ];
        let compile = |def: KernelDefinition| {
            let _serial = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            CudaCompiler::default().compile(def, &options, ExecutionMode::Unchecked, ADDR).unwrap()
        };
        let mut failures = Vec::new();
        // Every modifier, causal masking as the right extent, sinks.
        let all = DecodeMods { mc: ModsConfig { left: true, right: true, softcap: true, alibi: true }, top_left: false, sinks: true };
        for (d, rows) in [(128usize, 4u32), (64, 40), (128, 400)] {
            // Decode: the paged variant on the causal, several-split case; every modifier on a
            // paged cache with one split (the sinks in the epilogue). More rows than a tile
            // (paged prefill): row blocks, causal with several splits and not with one, and
            // every modifier with several splits.
            let variants: &[(bool, bool, bool, bool, Option<DecodeMods>)] = match rows {
                ..=64 => &[
                    (false, false, false, false, None),
                    (true, true, false, false, None),
                    (true, false, true, false, None),
                    (false, true, true, false, Some(all)),
                ],
                _ => &[(true, false, true, true, None), (false, true, true, true, None), (false, false, true, true, Some(all))],
            };
            for tiles in decode_candidates(rows, d as u32, d as u32).into_iter().take(2) {
                for &(causal, direct, paged, blocked, dm) in variants {
                    let cfg = FmaVecConfig {
                        head_dim: d,
                        v_head_dim: d,
                        bq: tiles.bq as usize,
                        bk: tiles.bk as usize,
                        tr: tiles.tr as usize,
                        tc: tiles.tc as usize,
                        causal,
                        write_lse: true,
                        lazy_rescale: true,
                        plane_reduce: true,
                    };
                    let def = match tiles.stage_f32 {
                        false => decode_definition::<half::f16, half::f16>(&client, cfg, direct, paged, blocked, dm),
                        true => decode_definition::<half::bf16, f32>(&client, cfg, direct, paged, blocked, dm),
                    };
                    let kernel = compile(def);
                    let mods = if dm.is_some() { "_mods" } else { "" };
                    let name = format!("decode_d{d}_{tiles}_causal{causal}_direct{direct}_paged{paged}_blocked{blocked}{mods}");
                    let scratch = 4 * tiles.bq as usize * tiles.tc as usize;
                    // f16 and bf16 inputs: 2-byte elements.
                    let formula = tiles.smem_bytes(d as u32, d as u32, 2) as usize;
                    assert_eq!(kernel.shared_memory_size() + scratch, formula, "{name}: declared shared memory");
                    let (_, log) = nvrtc_cubin(&kernel.to_string(), &nvrtc_options).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let res = quattn_native::Resources::parse_ptxas_log(&log).unwrap_or_else(|| panic!("{name}: no ptxas report in {log}"));
                    println!("{name}: {} registers, {} B spilled", res.registers, res.spill_bytes());
                    if res.spill_bytes() != 0 {
                        failures.push(name);
                    }
                }
            }
            let merges = [
                ("f16", merge_definition::<half::f16>(&client, 16, d, false)),
                ("bf16", merge_definition::<half::bf16>(&client, 64, d, false)),
                ("f16_sinks", merge_definition::<half::f16>(&client, 16, d, true)),
            ];
            for (dtype, def) in merges {
                let kernel = compile(def);
                let name = format!("decode_merge_{dtype}_d{d}");
                nvrtc_cubin(&kernel.to_string(), &nvrtc_options).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
        assert!(failures.is_empty(), "spills: {failures:?}");
    }
}
