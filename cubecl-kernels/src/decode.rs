//! The split-KV decode kernel (`kernel/decode.rs`) on the host: when it applies, its tile
//! table, the split of the KV sequence, and its launch (the decode kernel, then the merge when
//! there is more than one split).

use std::fmt;

use cubecl::prelude::*;
use cubecl::server::Handle;
use half::{bf16, f16};
use quattn_core::{Accumulation, AttentionShape, Dtype, Fp8Format};

use crate::error::LaunchError;
use crate::kernel::decode::{decode_merge, fwd_portable_decode, DecodeArgsLaunch, DecodeMods};
use crate::kernel::decode_mma::{fwd_portable_decode_mma, MmaDecodeConfig, MMA_DECODE_MAX_ROWS};
use crate::kernel::decode_mma_fp4::{fwd_portable_decode_mma_fp4, Fp4DecodeConfig, FP4_DECODE_MAX_ROWS, FP4_DECODE_STEPS};
use crate::kernel::fma_vec_fp4::Fp4ShapeLaunch;
use crate::kernel::decode_rows::{fwd_portable_decode_rows, fwd_portable_decode_rows_fp8, RowDecodeConfig, ROW_DECODE_MAX_ROWS, ROW_UNITS};
use crate::kernel::fma_vec_fp8::{Fp8Config, Fp8ShapeLaunch};
use crate::kernel::fma_vec::{FmaVecConfig, W};
use crate::kernel::fma_vec_mods::{ModArgs, ModArgsLaunch};
use crate::launch::{check_grid, vector_layout_ok, CubeLimits, Family, LaunchInfo, PortableKernel, ScoreMods};
use crate::problem::Args;
use crate::tiling::FmaVecTiles;

/// Most packed query rows (`group · q_len`) per (batch, KV head) the decode family takes on a
/// contiguous cache: one cube's query tile (more rows are prefill, which the per-head kernels
/// run). On a paged cache, which only this family reads, the tile kernel takes any number, in
/// blocks of its tile's rows.
pub const DECODE_MAX_ROWS: u32 = 64;
/// Fewest keys for which the decode family applies: 8 tiles of 64 keys, enough for two splits
/// of [`MIN_TILES_PER_SPLIT`] tiles. Shorter caches are one tile of work or two for the
/// per-head kernels, which need no merge.
pub const DECODE_MIN_KV: u32 = 512;
/// Fewest KV tiles a split gets: below this a cube spends as long staging Q, filling its
/// prefetch and writing its partial state as streaming keys.
pub const MIN_TILES_PER_SPLIT: u32 = 4;
/// Most splits per (batch, KV head): bounds the merge's loop and the partial buffers.
pub const MAX_SPLITS: u32 = 128;
/// Resident decode cubes assumed per SM. The cubes are small (16 to 256 units, at most 48 KiB of
/// shared memory, mostly well under), and the kernel is bound by memory latency: more cubes in
/// flight hide more of it.
pub const CUBES_PER_SM: u32 = 8;
/// Resident row-decode cubes assumed per SM: 128 units at 96 to 168 registers each (ptxas,
/// sm_90) leave room for 3 to 5 on a 64K-register SM; splitting for more would start a second,
/// partial wave.
pub const ROW_CUBES_PER_SM: u32 = 4;
/// Resident MMA decode cubes assumed per SM: 128 units at 154 to 168 registers (ptxas, sm_90,
/// d 128) leave room for 3 on a 64K-register SM.
pub const MMA_CUBES_PER_SM: u32 = 3;
/// SMs assumed where the runtime reports none (wgpu reports no count): about an H100's 132.
pub const ASSUMED_SMS: u32 = 128;

/// The decode kernel resolved for one shape: its tiling ([`DecodeTiling`]) and the split of the
/// keys ([`decode_split`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeTiles {
    pub tiling: DecodeTiling,
    /// Cubes along the KV sequence per (batch, KV head); 1 writes O directly.
    pub splits: u32,
    /// Keys of every split but the last, a multiple of the tiling's `bk`.
    pub keys_per_split: u32,
}

/// How a decode cube holds its packed query rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeTiling {
    /// The vector FMA kernel's query tile (`kernel/decode.rs`), padded to `bq ≥ 16` rows.
    Tile(FmaVecTiles),
    /// Exactly the packed rows, at most [`ROW_DECODE_MAX_ROWS`] (`kernel/decode_rows.rs`).
    Rows(RowTiles),
    /// The packed rows as the columns of manual MMAs, at most [`MMA_DECODE_MAX_ROWS`]
    /// (`kernel/decode_mma.rs`; CUDA).
    Mma(MmaDecodeTiles),
}

/// The MMA decode kernel's tiling: its packed rows, warps per cube, and 16-key steps per warp
/// per cube tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmaDecodeTiles {
    pub rows: u32,
    pub warps: u32,
    pub steps: u32,
}

impl MmaDecodeTiles {
    /// The kernel's key for elements of `code_bytes` bytes (2, or 1 for FP8 codes) read in
    /// loads of `vec` words.
    pub(crate) const fn config(&self, head_dim: u32, v_head_dim: u32, code_bytes: u32, vec: u32, causal: bool, write_lse: bool) -> MmaDecodeConfig {
        MmaDecodeConfig {
            head_dim: head_dim as usize,
            v_head_dim: v_head_dim as usize,
            rows: self.rows as usize,
            warps: self.warps as usize,
            steps: self.steps as usize,
            vec: vec as usize,
            code_bytes: code_bytes as usize,
            causal,
            write_lse,
        }
    }
    /// Keys per cube tile.
    pub const fn bk(&self) -> u32 {
        self.warps * 16 * self.steps
    }
}

/// The row decode kernel's tiling: its packed rows and keys per tile ([`ROW_UNITS`] units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowTiles {
    pub rows: u32,
    pub bk: u32,
}

impl RowTiles {
    const fn config(&self, head_dim: u32, v_head_dim: u32, causal: bool, write_lse: bool) -> RowDecodeConfig {
        RowDecodeConfig {
            head_dim: head_dim as usize,
            v_head_dim: v_head_dim as usize,
            rows: self.rows as usize,
            bk: self.bk as usize,
            causal,
            write_lse,
            paged: false,
        }
    }
}

impl fmt::Display for DecodeTiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tiling {
            DecodeTiling::Tile(t) => write!(f, "{t}")?,
            DecodeTiling::Rows(r) => write!(f, "rows{}_bk{}", r.rows, r.bk)?,
            DecodeTiling::Mma(m) => write!(f, "mma{}_w{}_s{}", m.rows, m.warps, m.steps)?,
        }
        write!(f, "_split{}x{}", self.splits, self.keys_per_split)
    }
}

impl DecodeTiles {
    /// Query rows a cube holds (the packed rows padded to the tile, or exactly).
    pub const fn bq(&self) -> u32 {
        match self.tiling {
            DecodeTiling::Tile(t) => t.bq,
            DecodeTiling::Rows(r) => r.rows,
            DecodeTiling::Mma(m) => m.rows,
        }
    }
    /// Blocks of [`Self::bq`] rows that hold `rows` packed rows: the tile kernel's cubes per
    /// (split, KV head, batch); 1 for the row kernel, which holds its rows exactly.
    pub const fn row_blocks(&self, rows: u64) -> u64 {
        match self.tiling {
            DecodeTiling::Tile(t) => rows.div_ceil(t.bq as u64),
            DecodeTiling::Rows(_) | DecodeTiling::Mma(_) => 1,
        }
    }
    /// Keys per tile.
    pub const fn bk(&self) -> u32 {
        match self.tiling {
            DecodeTiling::Tile(t) => t.bk,
            DecodeTiling::Rows(r) => r.bk,
            DecodeTiling::Mma(m) => m.bk(),
        }
    }
    pub const fn units(&self) -> u32 {
        match self.tiling {
            DecodeTiling::Tile(t) => t.units(),
            DecodeTiling::Rows(_) => ROW_UNITS as u32,
            DecodeTiling::Mma(m) => m.warps * 32,
        }
    }
    /// Shared memory of one cube in bytes on inputs of `elem_bytes` (the row kernel stages Q
    /// and its scratch in f32 whatever the input type; the MMA kernel holds only its merge, and
    /// with `elem_bytes` 1, FP8 codes, two records).
    pub const fn smem_bytes(&self, head_dim: u32, v_head_dim: u32, elem_bytes: u32) -> u32 {
        match self.tiling {
            DecodeTiling::Tile(t) => t.smem_bytes(head_dim, v_head_dim, elem_bytes),
            DecodeTiling::Rows(r) => r.config(head_dim, v_head_dim, false, false).smem_bytes() as u32,
            DecodeTiling::Mma(m) => m.config(head_dim, v_head_dim, if elem_bytes == 1 { 1 } else { 2 }, 1, false, false).smem_bytes() as u32,
        }
    }
    pub fn validate(&self, head_dim: u32, v_head_dim: u32) -> Result<(), LaunchError> {
        match self.tiling {
            DecodeTiling::Tile(t) => t.validate(head_dim, v_head_dim),
            DecodeTiling::Rows(r) => match r.config(head_dim, v_head_dim, false, false).invalid() {
                Some(reason) => Err(LaunchError::InvalidTiles { tiles: self.to_string(), reason }),
                None => Ok(()),
            },
            // The vector width is the launch's; one word always divides.
            DecodeTiling::Mma(m) => match m.config(head_dim, v_head_dim, 2, 1, false, false).invalid() {
                Some(reason) => Err(LaunchError::InvalidTiles { tiles: self.to_string(), reason }),
                None => Ok(()),
            },
        }
    }
    /// Resident cubes per SM the split assumes for this tiling's kernel.
    pub const fn cubes_per_sm(&self) -> u32 {
        match self.tiling {
            DecodeTiling::Tile(_) => CUBES_PER_SM,
            DecodeTiling::Rows(_) => ROW_CUBES_PER_SM,
            DecodeTiling::Mma(_) => MMA_CUBES_PER_SM,
        }
    }
    /// `tiling` with the split of [`decode_split_with`] for a contiguous cache of `args` on
    /// the runtime's SMs.
    fn split_for<R: Runtime>(client: &ComputeClient<R>, args: &Args, tiling: DecodeTiling) -> DecodeTiles {
        let probe = DecodeTiles { tiling, splits: 1, keys_per_split: 0 };
        Self::split_with(client, args, tiling, probe.cubes_per_sm())
    }
    /// [`Self::split_for`] for a kernel of which about `cubes_per_sm` cubes are resident per SM
    /// (the 4-bit MMA decode kernel shares the MMA tiling but not its register count).
    fn split_with<R: Runtime>(client: &ComputeClient<R>, args: &Args, tiling: DecodeTiling, cubes_per_sm: u32) -> DecodeTiles {
        let probe = DecodeTiles { tiling, splits: 1, keys_per_split: 0 };
        let sms = client.properties().hardware.num_streaming_multiprocessors.unwrap_or(ASSUMED_SMS);
        let pairs = args.batch as u64 * args.kv_heads as u64;
        let (splits, keys_per_split) = decode_split_with(pairs, args.kv_len, probe.bk(), sms, cubes_per_sm);
        DecodeTiles { tiling, splits, keys_per_split }
    }
    /// Units per row of the tile kernel's reductions, whose plane shuffles need that many
    /// lanes (`None` for the row kernel, which reduces through shared memory).
    pub const fn reduce_lanes(&self) -> Option<u32> {
        match self.tiling {
            DecodeTiling::Tile(t) => Some(t.tc),
            DecodeTiling::Rows(_) | DecodeTiling::Mma(_) => None,
        }
    }
}

/// Row kernel tilings for `rows` packed rows, best first: 32-key tiles (each unit prefetches
/// one key's share of K and `32 / groups` keys' vector of V: with 128 units, 16 KiB of f16 K/V
/// in flight per cube at d 128, which several resident cubes multiply, at half the prefetch
/// registers of 64-key tiles), then 64, each only where the kernel's loops cover the head dims.
/// Empty above [`ROW_DECODE_MAX_ROWS`] rows.
pub fn row_candidates(rows: u32, head_dim: u32, v_head_dim: u32) -> Vec<RowTiles> {
    [32u32, 64]
        .into_iter()
        .map(|bk| RowTiles { rows, bk })
        .filter(|t| rows as usize <= ROW_DECODE_MAX_ROWS && t.config(head_dim, v_head_dim, false, false).invalid().is_none())
        .collect()
}

/// The split of a decode launch: a pure function of the shape and the device.
///
/// `pairs = batch · kv_heads` cubes run without splitting; the device holds about `slots = sms
/// · CUBES_PER_SM` resident cubes. The kernel is bound by memory traffic, which resident cubes
/// share, so equal splits that all fit in one wave finish together: `splits = slots / pairs`
/// (rounded down: a partial second wave would run alone at the end), at least 1, at most
/// [`MAX_SPLITS`], and small enough that every split keeps [`MIN_TILES_PER_SPLIT`] tiles of `bk`
/// keys. Split lengths are whole tiles, then the count is recomputed from them (it can only
/// shrink). Returns `(splits, keys_per_split)`. Example, H100 (132 SMs), batch 8 x 8 KV heads,
/// bk 64: 1056 / 64 = 16 splits of 2048 keys at kv 32k, 16 of 512 at kv 8k.
pub fn decode_split(pairs: u64, kv_len: u32, bk: u32, sms: u32) -> (u32, u32) {
    decode_split_with(pairs, kv_len, bk, sms, CUBES_PER_SM)
}

/// [`decode_split`] for a kernel of which about `cubes_per_sm` cubes are resident per SM.
pub fn decode_split_with(pairs: u64, kv_len: u32, bk: u32, sms: u32, cubes_per_sm: u32) -> (u32, u32) {
    let bk = bk.max(1) as u64;
    let tiles = (kv_len as u64).div_ceil(bk).max(1);
    let slots = sms.max(1) as u64 * cubes_per_sm.max(1) as u64;
    let by_device = (slots / pairs.max(1)).max(1);
    let by_length = (tiles / MIN_TILES_PER_SPLIT as u64).max(1);
    let want = by_device.min(by_length).min(MAX_SPLITS as u64);
    let tiles_per_split = tiles.div_ceil(want);
    let splits = tiles.div_ceil(tiles_per_split);
    (splits as u32, (tiles_per_split * bk).min(u32::MAX as u64) as u32)
}

/// Tilings of the packed query tile, best first. Every unit holds `rm = 4` rows, so `bq = 4 ·
/// tr` is the smallest of 16, 32, 64 that holds the rows and `d / 4` (16 at d ≤ 64, 32 at
/// d 128): more rows than the tile needs keep enough units per cube that the K/V prefetch
/// registers per unit stay at the FMA kernel's count (the extra rows are FMAs, which a
/// memory-bound step has to spare). `tc = 16` with 64-key
/// tiles where the V head dim is a multiple of 64, else `tc = 8` with 32-key tiles; stages in
/// the input type first (half the shared memory of f32 stages for f16/bf16: more resident
/// cubes), then in f32 (fewer conversions), then the 32-key and 16-key (`tc = 4`) tiles for
/// runtimes with 32 KiB.
pub fn decode_candidates(rows: u32, head_dim: u32, v_head_dim: u32) -> Vec<FmaVecTiles> {
    // Each unit prefetches `d / tr` vectors of K and of V per tile (4 keys per unit column):
    // `bq ≥ d / 4` keeps that at 16 (d 128: 243 registers at bq 16 against 255 and spills with
    // f32 stages, ptxas for sm_90).
    let least = (head_dim.max(v_head_dim) / 4).max(16);
    let bq = [16u32, 32, 64].into_iter().find(|&b| rows <= b && least <= b).unwrap_or(64);
    let tr = bq / 4;
    let mut shapes = Vec::new();
    if v_head_dim.is_multiple_of(64) {
        shapes.push((64u32, 16u32));
    }
    shapes.push((32, 8));
    // 64 f32 rows at d 64 fit llvmpipe's 32 KiB only with 16-key tiles.
    shapes.push((16, 4));
    let mut all = Vec::new();
    for (bk, tc) in shapes {
        for stage_f32 in [false, true] {
            all.push(FmaVecTiles { bq, bk, tr, tc, stage_f32 });
        }
    }
    all
}

/// Why the decode family does not take this problem on a contiguous cache, if it does not: at
/// most [`DECODE_MAX_ROWS`] packed rows per KV head, at least [`DECODE_MIN_KV`] keys, and
/// [`paged_refusal`]'s rules.
pub(crate) fn decode_shape_refusal(args: &Args, shape: &AttentionShape) -> Option<String> {
    if args.kv_len < DECODE_MIN_KV {
        return Some(format!("kv_len {} is below {DECODE_MIN_KV}: one per-head tile streams it without a merge", args.kv_len));
    }
    let rows = packed_rows(args);
    if rows > DECODE_MAX_ROWS as u64 {
        return Some(format!(
            "not decode-shaped: {rows} query rows per KV head ({} q heads per KV head x q_len {}), the decode tile takes 1..={DECODE_MAX_ROWS}",
            args.group_size(),
            args.q_len
        ));
    }
    paged_refusal(args, shape)
}

/// Why the decode family does not take this problem on a paged cache, which no other family
/// reads (any KV length, any number of packed rows): no rows, rows past 32-bit indices, or
/// the vector layout of the FMA kernels.
fn paged_refusal(args: &Args, shape: &AttentionShape) -> Option<String> {
    let rows = packed_rows(args);
    if rows == 0 || rows > u32::MAX as u64 {
        return Some(format!("{rows} query rows per KV head ({} q heads per KV head x q_len {})", args.group_size(), args.q_len));
    }
    vector_layout_ok(shape).err()
}

/// Packed query rows per (batch, KV head): `group · q_len`.
fn packed_rows(args: &Args) -> u64 {
    args.group_size() as u64 * args.q_len as u64
}

/// The decode kernel for `shape` on `dtype` inputs, f32 accumulation: the first tiling that fits
/// the runtime, with the split of [`decode_split`] on the runtime's SM count.
pub(crate) fn select<R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    shape: &AttentionShape,
    dtype: Dtype,
    accumulation: Accumulation,
    mods: Option<&ScoreMods<'_>>,
) -> Result<PortableKernel, LaunchError> {
    select_with(client, args, shape, dtype, accumulation, None, mods)
}

/// The keys the splits of a launch with modifiers divide per (batch, KV head, row block), in
/// whole tiles of `bk`: those some position sees at the longest length, `lo..hi` ([`DecodeMods`]),
/// plus a tile's worth for the rounding of a split's start down to a tile (a shorter sequence
/// of a paged cache moves its bottom-right window left by its own length, and row blocks hold
/// fewer positions: neither sees more keys), at most the whole sequence's tiles.
pub(crate) fn mod_split_span(args: &Args, mods: &ScoreMods<'_>, bk: u32) -> u64 {
    let (q, kv, bk) = (args.q_len as i64, args.kv_len as i64, bk.max(1) as i64);
    let offset = if mods.top_left { 0 } else { kv - q };
    // Causal masking is a right extent of 0, whatever the window's.
    let right = if args.causal { Some(0) } else { mods.window_right };
    let lo = mods.window_left.map_or(0, |l| offset - l as i64).clamp(0, kv);
    let hi = right.map_or(kv, |r| offset + q + r as i64).clamp(0, kv);
    if hi <= lo {
        return 0;
    }
    let tiles = ((hi - lo + bk - 1) as u64).div_ceil(bk as u64).min((kv as u64).div_ceil(bk as u64));
    tiles * bk as u64
}

/// [`select`], or with `page_size` the kernel for a paged cache of such pages: any KV length
/// and any number of packed rows (the tile kernel in row blocks above its tile), tile tilings
/// only where a key tile lies in one page (`bk ≤ page_size`), row tilings only where a softmax
/// group's V keys do (`kb ≤ page_size`). The split counts each row block as a cube of its own.
/// With `mods`, the splits divide the keys the modifiers leave visible ([`mod_split_span`]).
fn select_with<R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    shape: &AttentionShape,
    dtype: Dtype,
    accumulation: Accumulation,
    page_size: Option<u32>,
    mods: Option<&ScoreMods<'_>>,
) -> Result<PortableKernel, LaunchError> {
    let unavailable = |reason: String| LaunchError::FamilyUnavailable { family: Family::Decode, reason };
    if !accumulation.is_f32() {
        return Err(unavailable("it accumulates in f32 only".into()));
    }
    if let Some(m) = mods {
        m.check(args)?;
    }
    let refusal = match page_size {
        Some(_) => paged_refusal(args, shape),
        None => decode_shape_refusal(args, shape),
    };
    if let Some(reason) = refusal {
        return Err(unavailable(reason));
    }
    let limits = CubeLimits::of(client);
    let sms = client.properties().hardware.num_streaming_multiprocessors.unwrap_or(ASSUMED_SMS);
    // Below u32::MAX (the refusals above).
    let rows = packed_rows(args) as u32;
    let pairs = args.batch as u64 * args.kv_heads as u64;
    let mut last = None;
    // Contiguous caches without modifiers on 16-bit inputs: the MMA kernel first where the
    // runtime has the f16/bf16 manual MMA (CUDA).
    let mma = (page_size.is_none() && mods.is_none() && dtype != Dtype::F32)
        .then(|| mma_decode_tiles(client, args, dtype, 2))
        .flatten()
        .map(DecodeTiling::Mma);
    let rows_first = row_candidates(rows, args.head_dim, args.v_head_dim)
        .into_iter()
        .filter(|r| page_size.is_none_or(|ps| r.config(args.head_dim, args.v_head_dim, false, false).kb() as u32 <= ps))
        .map(DecodeTiling::Rows);
    let tiles = decode_candidates(rows, args.head_dim, args.v_head_dim)
        .into_iter()
        .filter(|t| page_size.is_none_or(|ps| t.bk <= ps))
        .map(DecodeTiling::Tile);
    for tiling in mma.into_iter().chain(rows_first).chain(tiles) {
        let probe = DecodeTiles { tiling, splits: 1, keys_per_split: 0 };
        let per_sm = probe.cubes_per_sm();
        // Every row block is a cube of its own before the keys are split.
        let blocks = pairs.saturating_mul(probe.row_blocks(rows as u64));
        let keys = match mods {
            Some(m) => mod_split_span(args, m, probe.bk()) as u32,
            None => args.kv_len,
        };
        let (splits, keys_per_split) = decode_split_with(blocks, keys, probe.bk(), sms, per_sm);
        let kernel = PortableKernel::Decode(DecodeTiles { tiling, splits, keys_per_split });
        match kernel.check_fits(limits, args.head_dim, args.v_head_dim, dtype) {
            Ok(()) => return Ok(kernel),
            Err(e) => last = Some(e),
        }
    }
    Err(unavailable(format!(
        "no tiling fits d={} dv={} in {} bytes of shared memory and {} units{}",
        args.head_dim,
        args.v_head_dim,
        limits.max_shared_bytes,
        limits.max_units,
        last.map(|e| format!(" (last candidate: {e})")).unwrap_or_default()
    )))
}

impl DecodeTiles {
    /// Whether this resolved kernel covers `args`: the row kernel holds exactly its rows (the
    /// tile kernel any number, in blocks), and the split covers the keys with non-empty splits
    /// of whole tiles.
    /// With `mods`, the split covers the keys they leave visible ([`mod_split_span`]) and, from
    /// the first of them, stays within 32-bit key indices.
    fn check_shape(&self, args: &Args, mods: Option<&ScoreMods<'_>>) -> Result<(), LaunchError> {
        let bad = |reason: String| Err(LaunchError::WrongKernel { kernel: format!("portable_decode_{self}"), reason });
        let rows = packed_rows(args);
        match self.tiling {
            // The row kernel is compiled for its exact row count.
            DecodeTiling::Rows(RowTiles { rows: held, .. }) | DecodeTiling::Mma(MmaDecodeTiles { rows: held, .. }) if rows != held as u64 => {
                return bad(format!("{rows} packed query rows, the kernel holds exactly {held}"));
            }
            _ if rows > u32::MAX as u64 => return bad(format!("{rows} packed query rows are past 32-bit row indices")),
            _ => {}
        }
        let kps = self.keys_per_split as u64;
        if self.splits == 0 || self.splits > MAX_SPLITS || kps == 0 || !kps.is_multiple_of(self.bk() as u64) {
            return bad(format!("1..={MAX_SPLITS} splits of a positive multiple of {} keys", self.bk()));
        }
        let kv = args.kv_len as u64;
        let splits = self.splits as u64;
        let (covered, what, past) = match mods {
            Some(m) => (mod_split_span(args, m, self.bk()), "the keys the score modifiers leave visible", kv + splits * kps),
            None => (kv, "kv_len", splits * kps),
        };
        if splits * kps < covered || (splits > 1 && (splits - 1) * kps >= kv) {
            return bad(format!("the split does not cover {what} ({covered} of kv_len {kv}) with non-empty splits"));
        }
        if past > u32::MAX as u64 {
            return bad("the split reaches past 32-bit key indices".into());
        }
        Ok(())
    }
}

/// The split, grid and partial-state buffers of one decode launch ([`prepare`]).
struct Prepared {
    rows: u32,
    row_blocks: u32,
    direct: bool,
    /// `(page_shift, max_pages, lens_at, num_pages)` of a paged cache, zeros otherwise.
    pages: [u32; 4],
    part_o: Handle,
    part_lse: Handle,
    o_elems: u64,
    lse_elems: u64,
}

/// Fit, shape and grid checks, the launch record, and the partial-state buffers (f32:
/// `[batch][kv_head][split][row_blocks · bq][dv]` and `[...][row_blocks · bq]`; one float each
/// when there is one split). `None` when the grid is empty (nothing to enqueue).
#[allow(clippy::too_many_arguments)]
fn prepare<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    t: &DecodeTiles,
    args: &Args,
    dtype: Dtype,
    plane_reduce: bool,
    mods: Option<&ScoreMods<'_>>,
) -> Result<(LaunchInfo, Option<Prepared>), LaunchError> {
    kernel.check_fits(CubeLimits::of(client), args.head_dim, args.v_head_dim, dtype)?;
    t.check_shape(args, mods)?;
    // Below u32::MAX (`check_shape`).
    let rows = packed_rows(args) as u32;
    let row_blocks = t.row_blocks(rows as u64) as u32;
    let along_x = t.splits as u64 * row_blocks as u64;
    let Ok(along_x) = u32::try_from(along_x) else {
        return Err(LaunchError::TooLarge { what: "decode cubes along x (row blocks x splits)", value: along_x as usize });
    };
    let count = (along_x, args.kv_heads, args.batch);
    check_grid(count, client.properties().hardware.max_cube_count)?;
    let info = LaunchInfo {
        kernel: kernel.kernel_name(dtype, args.head_dim as usize, args.v_head_dim as usize),
        cube_count: count,
        units_per_cube: kernel.units(),
        shared_memory_bytes: kernel.smem_bytes(args.head_dim, args.v_head_dim, dtype),
        plane_reduce,
        launched: false,
    };
    if count.0 == 0 || count.1 == 0 || count.2 == 0 || rows == 0 {
        log::debug!("{}: empty grid, nothing launched", info.kernel);
        return Ok((info, None));
    }
    let direct = t.splits == 1;
    let states = args.batch as u64 * args.kv_heads as u64 * t.splits as u64 * row_blocks as u64 * t.bq() as u64;
    let (o_elems, lse_elems) = if direct { (W as u64, 1) } else { (states * args.v_head_dim as u64, states) };
    for (tensor, elems) in [("decode partial O", o_elems), ("decode partial LSE", lse_elems)] {
        if elems > u32::MAX as u64 {
            return Err(LaunchError::IndexOverflow { tensor, elems });
        }
    }
    let part_o = client.empty(o_elems as usize * 4);
    let part_lse = client.empty(lse_elems as usize * 4);
    log::debug!("launching {} ({} splits of {} keys) for {args:?}", info.kernel, t.splits, t.keys_per_split);
    Ok((info, Some(Prepared { rows, row_blocks, direct, pages: [0; 4], part_o, part_lse, o_elems, lse_elems })))
}

impl Prepared {
    // SAFETY (both): allocated in `prepare` with exactly these many f32s.
    fn part_o_arg<R: Runtime>(&self) -> ArrayArg<R> {
        unsafe { ArrayArg::from_raw_parts(self.part_o.clone(), (self.o_elems as usize).div_ceil(W)) }
    }
    fn part_o_scalar_arg<R: Runtime>(&self) -> ArrayArg<R> {
        unsafe { ArrayArg::from_raw_parts(self.part_o.clone(), self.o_elems as usize) }
    }
    fn part_lse_arg<R: Runtime>(&self) -> ArrayArg<R> {
        unsafe { ArrayArg::from_raw_parts(self.part_lse.clone(), self.lse_elems as usize) }
    }
    fn dec_arg<R: Runtime>(&self, t: &DecodeTiles) -> DecodeArgsLaunch<R> {
        let [page_shift, max_pages, lens_at, num_pages] = self.pages;
        DecodeArgsLaunch::new(self.rows, t.splits, t.keys_per_split, f32::NAN, page_shift, max_pages, lens_at, num_pages)
    }

    /// With several splits, the merge of their partial states into O (`o_dtype`) and the LSE;
    /// `sinks` (at least `q_heads` floats) join each row's denominator there.
    #[allow(clippy::too_many_arguments)]
    fn merge<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        t: &DecodeTiles,
        args: &Args,
        o_dtype: Dtype,
        o: ArrayArg<R>,
        lse: ArrayArg<R>,
        sinks: Option<&Handle>,
    ) -> Result<(), LaunchError> {
        if self.direct {
            return Ok(());
        }
        let merge_count = (self.rows, args.kv_heads, args.batch);
        check_grid(merge_count, client.properties().hardware.max_cube_count)?;
        let count = CubeCount::Static(merge_count.0, merge_count.1, merge_count.2);
        let dim = CubeDim::new_1d(args.v_head_dim / W as u32);
        let (bq, dv, write_lse) = (t.bq() as usize, args.v_head_dim as usize, args.write_lse);
        // SAFETY: the caller's sink buffer holds q_heads floats; the merge reads below that.
        let sinks_arg = || match sinks {
            Some(h) => ComptimeOptionArgs::Some(unsafe { ArrayArg::from_raw_parts(h.clone(), args.q_heads as usize) }),
            None => ComptimeOptionArgs::None,
        };
        macro_rules! merge {
            ($e:ty) => {
                // SAFETY: the merge reads states `< batch · kv_heads · splits · row_blocks · bq`
                // (rows ≤ row_blocks · bq) and writes O rows and LSE entries of existing (head,
                // position) pairs.
                unsafe {
                    decode_merge::launch_unchecked::<$e, R>(
                        client, count, dim, W,
                        self.part_o_arg(), self.part_lse_arg(), o, lse,
                        crate::launch::shape_arg::<R>(args), self.dec_arg(t), sinks_arg(), bq, dv, write_lse,
                    )
                }
            };
        }
        match o_dtype {
            Dtype::F32 => merge!(f32),
            Dtype::F16 => merge!(f16),
            Dtype::Bf16 => merge!(bf16),
        }
        Ok(())
    }
}

/// The comptime key of `mods` on `args`.
fn decode_mods(args: &Args, mods: &ScoreMods<'_>) -> DecodeMods {
    DecodeMods { mc: mods.config(args.causal), top_left: mods.top_left, sinks: mods.sinks.is_some() }
}

/// Launches the decode kernel and, with several splits, the merge. The caller ([`crate::launch`])
/// checked the dtype, the vector layout, the buffers' extents and the LSE binding; `mods`
/// ([`ScoreMods::check`]ed by the caller) compiles the modifier variant.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    t: &DecodeTiles,
    args: &Args,
    dtype: Dtype,
    handles: [&Handle; 4],
    lse: (Handle, u64),
    plane_reduce: bool,
    cache: Option<&PagedCache<'_>>,
    mods: Option<&ScoreMods<'_>>,
) -> Result<LaunchInfo, LaunchError> {
    let (mut info, prep) = prepare(client, kernel, t, args, dtype, plane_reduce, mods)?;
    if mods.is_some() {
        info.kernel.push_str("_mods");
    }
    let Some(mut prep) = prep else { return Ok(info) };
    // The modifiers' comptime key, runtime values and head parameters.
    let dm = mods.map(|m| decode_mods(args, m)).unwrap_or_default();
    let heads = args.q_heads as usize;
    let params = mods.map(|m| client.create_from_slice(&m.head_params(heads).iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>()));
    let mod_arg = || -> ComptimeOptionArgs<ModArgs, R> {
        match mods {
            // `row_shift` is unused: the kernels align at each sequence's own length.
            Some(m) => ComptimeOptionArgs::Some(ModArgsLaunch::new(0, m.window_left.unwrap_or(0), m.window_right.filter(|_| !args.causal).unwrap_or(0), args.scale, m.softcap.unwrap_or(1.0))),
            None => ComptimeOptionArgs::None,
        }
    };
    // SAFETY: `params` holds 2 · q_heads floats; the kernels read below that.
    let params_arg = || -> ComptimeOptionArgs<Array<f32>, R> {
        match &params {
            Some(h) => ComptimeOptionArgs::Some(unsafe { ArrayArg::from_raw_parts(h.clone(), 2 * heads) }),
            None => ComptimeOptionArgs::None,
        }
    };
    // The tile kernel with modifiers scales the scores itself, before them; its softmax runs
    // with 1. The row kernel folds the scale into its staged Q either way.
    let unscaled = Args { scale: 1.0, ..*args };
    let tile_shape = if mods.is_some() { &unscaled } else { args };
    let causal = args.causal && mods.is_none();
    // Without a cache the kernels never read the table: one word stands in.
    let (table, table_words) = match cache {
        Some(c) => {
            prep.pages = [c.page_size.trailing_zeros(), c.max_pages, args.batch * c.max_pages, c.num_pages.max(1)];
            (c.table.clone(), c.table_words(args.batch) as usize)
        }
        None => (client.empty(4), 1),
    };
    // SAFETY: `launch_paged` checked that the table holds `table_words` words; the stand-in
    // holds one.
    let table_arg = || unsafe { ArrayArg::from_raw_parts(table.clone(), table_words) };
    let paged = cache.is_some();
    let mut extents = args.extents();
    if let Some(c) = cache {
        // The kernels index the pools' rows through the table.
        extents[1].1 = c.pool_elems(args.kv_heads, args.head_dim);
        extents[2].1 = c.pool_elems(args.kv_heads, args.v_head_dim);
    }
    let arr = |handle: &Handle, elems: u64| {
        // SAFETY: the caller's `check_extent` proved the handle covers `max(elems, W)`
        // elements, and every row start is a multiple of W (vector_layout_ok).
        unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(W).max(1)) }
    };
    let [q, k, v, o] = handles;
    let (lse_handle, lse_len) = lse;
    // SAFETY: the caller checked that its LSE buffer holds `lse_len` floats (or bound a scratch
    // float that the kernels never write).
    let lse_arg = || unsafe { ArrayArg::from_raw_parts(lse_handle.clone(), lse_len as usize) };
    let part_o_arg = || prep.part_o_arg::<R>();
    let part_lse_arg = || prep.part_lse_arg::<R>();
    let dec_arg = || prep.dec_arg::<R>(t);
    let direct = prep.direct;
    let blocked = prep.row_blocks > 1;
    let count = info.cube_count;
    let count_arg = CubeCount::Static(count.0, count.1, count.2);
    let dim = CubeDim::new_1d(kernel.units());
    match t.tiling {
        DecodeTiling::Tile(tiles) => {
            let cfg = FmaVecConfig {
                head_dim: args.head_dim as usize,
                v_head_dim: args.v_head_dim as usize,
                bq: tiles.bq as usize,
                bk: tiles.bk as usize,
                tr: tiles.tr as usize,
                tc: tiles.tc as usize,
                causal,
                write_lse: args.write_lse,
                lazy_rescale: true,
                plane_reduce,
            };
            macro_rules! decode {
                ($e:ty, $s:ty) => {
                    // SAFETY: every global index is guarded by q_len / kv_len / rows, the buffers
                    // cover the strided extents, and the partial states are indexed inside their
                    // allocation (rows ≤ row_blocks · bq, split < splits).
                    unsafe {
                        fwd_portable_decode::launch_unchecked::<$e, $s, R>(
                            client, count_arg, dim, W,
                            arr(q, extents[0].1), arr(k, extents[1].1), arr(v, extents[2].1), arr(o, extents[3].1),
                            lse_arg(), part_o_arg(), part_lse_arg(), table_arg(), crate::launch::shape_arg::<R>(tile_shape), dec_arg(),
                            mod_arg(), params_arg(), cfg, direct, paged, blocked, dm,
                        )
                    }
                };
            }
            match (dtype, tiles.stage_f32) {
                (Dtype::F32, _) => decode!(f32, f32),
                (Dtype::F16, true) => decode!(f16, f32),
                (Dtype::F16, false) => decode!(f16, f16),
                (Dtype::Bf16, true) => decode!(bf16, f32),
                (Dtype::Bf16, false) => decode!(bf16, bf16),
            }
        }
        DecodeTiling::Rows(r) => {
            let cfg = RowDecodeConfig { paged, ..r.config(args.head_dim, args.v_head_dim, causal, args.write_lse) };
            macro_rules! decode_rows {
                ($e:ty) => {
                    // SAFETY: K/V reads are guarded by kv_len, Q reads and O writes stay in the
                    // packed rows (`check_shape`: exactly `rows`), the buffers cover the strided
                    // extents, and the partial states are indexed inside their allocation.
                    unsafe {
                        fwd_portable_decode_rows::launch_unchecked::<$e, R>(
                            client, count_arg, dim, W,
                            arr(q, extents[0].1), arr(k, extents[1].1), arr(v, extents[2].1), arr(o, extents[3].1),
                            lse_arg(), part_o_arg(), part_lse_arg(), table_arg(), crate::launch::shape_arg::<R>(args), dec_arg(),
                            mod_arg(), params_arg(), cfg, direct, dm,
                        )
                    }
                };
            }
            match dtype {
                Dtype::F32 => decode_rows!(f32),
                Dtype::F16 => decode_rows!(f16),
                Dtype::Bf16 => decode_rows!(bf16),
            }
        }
        DecodeTiling::Mma(m) => {
            if paged || mods.is_some() {
                return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "the MMA decode kernel reads contiguous caches without score modifiers".into() });
            }
            let inputs = MmaInputs { q: (q, extents[0].1), k: (k, extents[1].1), v: (v, extents[2].1), fp8: None };
            // SAFETY: as `arr`, in elements: the kernel writes O element by element.
            let o_arg = unsafe { ArrayArg::from_raw_parts(o.clone(), extents[3].1.max(1) as usize) };
            launch_mma(client, m, args, count_arg, dim, &prep, t, dtype, dtype, inputs, o_arg, lse_arg())?;
        }
    }
    let sinks = params.as_ref().filter(|_| dm.sinks);
    prep.merge(client, t, args, dtype, arr(o, extents[3].1), lse_arg(), sinks)?;
    info.launched = true;
    Ok(info)
}

/// The inputs of the MMA decode kernel: Q, K and V with their extents in elements (codes), and
/// with FP8 codes their bound descales, descale shape and format.
struct MmaInputs<'a, R: Runtime> {
    q: (&'a Handle, u64),
    k: (&'a Handle, u64),
    v: (&'a Handle, u64),
    fp8: Option<([ArrayArg<R>; 3], Fp8ShapeLaunch<R>, Fp8Config)>,
}

/// Enqueues the MMA decode kernel of tiling `m` (the merge is the caller's): 16-bit inputs of
/// `dtype` (the MMA's type), or FP8 codes converted to f16; O in `o_dtype`. The caller checked
/// the extents (Q, K and V cover their strided extents, at least W elements), the layout and
/// the LSE binding.
#[allow(clippy::too_many_arguments)]
fn launch_mma<R: Runtime>(
    client: &ComputeClient<R>,
    m: MmaDecodeTiles,
    args: &Args,
    count: CubeCount,
    dim: CubeDim,
    prep: &Prepared,
    t: &DecodeTiles,
    dtype: Dtype,
    o_dtype: Dtype,
    inputs: MmaInputs<'_, R>,
    o: ArrayArg<R>,
    lse: ArrayArg<R>,
) -> Result<(), LaunchError> {
    let code_bytes = if inputs.fp8.is_some() { 1 } else { 2 };
    let vec = mma_decode_vec(args, code_bytes);
    let cfg = m.config(args.head_dim, args.v_head_dim, code_bytes, vec, args.causal, args.write_lse);
    if let Some(reason) = cfg.invalid() {
        return Err(LaunchError::InvalidTiles { tiles: t.to_string(), reason });
    }
    let words = |elems: u64| (elems * code_bytes as u64).div_ceil(4).max(1) as usize;
    // SAFETY (all three): the handles hold their extents (at least W elements), whole words
    // since every row start and head dim is a multiple of 4 elements; the kernel reads words
    // of rows below kv_len (K, V) and of the packed rows (Q), each vector inside one row
    // (`mma_decode_vec` divides the row starts and each lane's share).
    let q_arg = unsafe { ArrayArg::from_raw_parts(inputs.q.0.clone(), words(inputs.q.1)) };
    let kv_arg = |(h, elems): (&Handle, u64)| unsafe { ArrayArg::from_raw_parts(h.clone(), words(elems).div_ceil(vec as usize)) };
    let (descales, fp8_shape, fcfg) = match inputs.fp8 {
        Some(f) => f,
        None => {
            // SAFETY: Q's buffer (at least W elements) as one float each, never read without
            // codes: no scratch allocation per launch.
            let one = || unsafe { ArrayArg::from_raw_parts(inputs.q.0.clone(), 1) };
            let fcfg = Fp8Config { format: quattn_core::Fp8Format::E4M3, granularity: quattn_core::DescaleGranularity::PerTensor };
            ([one(), one(), one()], Fp8ShapeLaunch::new(1, 1, 1, f32::NAN), fcfg)
        }
    };
    let [qd, kd, vd] = descales;
    let (k_arg, v_arg) = (kv_arg(inputs.k), kv_arg(inputs.v));
    macro_rules! go {
        ($o:ty, $e:ty) => {
            // SAFETY: as above; the partial states are indexed inside their allocation (rows =
            // bq, split < splits) and O / the LSE at the packed rows' (head, position).
            unsafe {
                fwd_portable_decode_mma::launch_unchecked::<$o, $e, R>(
                    client, count, dim, vec as usize,
                    q_arg, k_arg, v_arg, qd, kd, vd, o, lse, prep.part_o_scalar_arg(), prep.part_lse_arg(),
                    crate::launch::shape_arg::<R>(args), prep.dec_arg(t), fp8_shape, cfg, fcfg, prep.direct,
                )
            }
        };
    }
    match (o_dtype, dtype) {
        (Dtype::F32, Dtype::Bf16) => go!(f32, bf16),
        (Dtype::F32, _) => go!(f32, f16),
        (Dtype::F16, Dtype::Bf16) => go!(f16, bf16),
        (Dtype::F16, _) => go!(f16, f16),
        (Dtype::Bf16, Dtype::Bf16) => go!(bf16, bf16),
        (Dtype::Bf16, _) => go!(bf16, f16),
    }
    Ok(())
}

/// A paged KV cache as the decode kernels read it: K and V pools `[num_pages, page_size,
/// kv_heads, head_dim]` (the shape's K/V strides are ignored), and one u32 buffer holding the
/// block table `[batch, max_pages]` (row-major page indices) followed by the `batch` key counts
/// of the sequences. Key `j` of sequence `b` is pool row `table[b][j / page_size] · page_size +
/// j % page_size`; causal masks align each sequence bottom-right at its own length.
///
/// The table's contents are the caller's to validate (page indices below `num_pages` for every
/// key a sequence holds, lengths within its `max_pages` pages): the kernels clamp a bad entry
/// into the pools, so it gives wrong keys, never a read outside the buffers.
#[derive(Debug, Clone, Copy)]
pub struct PagedCache<'a> {
    /// Keys per page: a power of two.
    pub page_size: u32,
    pub num_pages: u32,
    pub max_pages: u32,
    pub table: &'a Handle,
}

impl PagedCache<'_> {
    /// u32 words of the table buffer for `batch` sequences.
    pub fn table_words(&self, batch: u32) -> u64 {
        batch as u64 * self.max_pages as u64 + batch as u64
    }

    /// Elements of a pool of `kv_heads` heads of `dim`.
    fn pool_elems(&self, kv_heads: u32, dim: u32) -> u64 {
        self.num_pages as u64 * self.page_size as u64 * kv_heads as u64 * dim as u64
    }

    fn check(&self, args: &Args) -> Result<(), LaunchError> {
        let bad = |reason: String| Err(LaunchError::InvalidProblem { reason });
        if !self.page_size.is_power_of_two() {
            return bad(format!("page size {} is not a power of two", self.page_size));
        }
        if self.num_pages == 0 || self.max_pages == 0 {
            return bad(format!("a paged cache of {} pages, {} per sequence", self.num_pages, self.max_pages));
        }
        if (self.max_pages as u64) * (self.page_size as u64) < args.kv_len as u64 {
            return bad(format!("kv_len {} is past {} pages of {} keys", args.kv_len, self.max_pages, self.page_size));
        }
        Ok(())
    }
}

/// `shape` with K and V strided as a paged cache's pools: `[.., kv_heads, dim]` rows of one
/// page slot (the kernels add each row's slot through the table).
fn pool_shape(shape: &AttentionShape) -> AttentionShape {
    let pool = |dim: usize| quattn_core::Strides { batch: 0, head: dim, seq: shape.kv_heads * dim };
    AttentionShape { k: pool(shape.head_dim), v: pool(shape.v_head_dim), ..*shape }
}

/// The decode kernel for a paged cache of `page_size`-key pages ([`PagedCache`]): the decode
/// family's choice with any KV length (`shape.kv_len` the longest sequence) and any number of
/// packed rows per KV head (a prefill or chunked prefill against the cache: the tile kernel in
/// blocks of its tile's rows), tile tilings only where a key tile fits in a page.
pub fn select_paged<R: Runtime>(client: &ComputeClient<R>, shape: &AttentionShape, dtype: Dtype, page_size: u32) -> Result<PortableKernel, LaunchError> {
    if !page_size.is_power_of_two() {
        return Err(LaunchError::InvalidProblem { reason: format!("page size {page_size} is not a power of two") });
    }
    select_paged_modified(client, shape, dtype, page_size, None)
}

/// [`select_paged`] with score modifiers ([`ScoreMods`], which any tiling takes): the splits
/// divide the keys they leave visible. Modifiers that change nothing on a paged cache (see
/// [`launch_paged_modified`]) select as [`select_paged`] does.
pub fn select_paged_modified<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    dtype: Dtype,
    page_size: u32,
    mods: Option<&ScoreMods<'_>>,
) -> Result<PortableKernel, LaunchError> {
    if !page_size.is_power_of_two() {
        return Err(LaunchError::InvalidProblem { reason: format!("page size {page_size} is not a power of two") });
    }
    let pool_shape = pool_shape(shape);
    let args = Args::new(&pool_shape)?;
    let mods = mods.filter(|m| !paged_mods_none(m, shape));
    select_with(client, &args, &pool_shape, dtype, Accumulation::default(), Some(page_size), mods)
}

/// Whether `mods` leave attention on a paged cache as the plain kernels compute it: as
/// [`ScoreMods::is_none`], except that top-left causal alignment moves every sequence shorter
/// than `q_len` keys (the plain kernels align each at its own length, bottom-right).
fn paged_mods_none(mods: &ScoreMods<'_>, shape: &AttentionShape) -> bool {
    mods.is_none(shape) && !(mods.top_left && shape.causal)
}

/// [`crate::launch`] with K and V in a paged cache: a decode kernel from [`select_paged`] (its
/// key tiles, or the row kernel's V key groups, within a page), `shape.kv_len` the longest
/// sequence. Checks the
/// kernel's fit, the buffers' extents (Q, O and the LSE by the shape, each pool by its pages,
/// the table by the batch), then enqueues.
#[allow(clippy::too_many_arguments)]
pub fn launch_paged<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    cache: &PagedCache<'_>,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    launch_paged_modified(client, kernel, shape, dtype, &ScoreMods::default(), cache, q, k, v, o, lse)
}

/// [`launch_paged`] with score modifiers ([`ScoreMods`], the decode kernels' modifier variant;
/// every sequence aligns its rows at its own length): the split, from
/// [`select_paged_modified`] or built by hand, must cover the keys they leave visible.
/// Modifiers that change nothing (as [`ScoreMods::is_none`], but top-left causal alignment
/// always counts: it moves the shorter sequences) launch the plain kernel.
#[allow(clippy::too_many_arguments)]
pub fn launch_paged_modified<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    shape: &AttentionShape,
    dtype: Dtype,
    mods: &ScoreMods<'_>,
    cache: &PagedCache<'_>,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    let PortableKernel::Decode(t) = kernel else {
        return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "paged caches are read by the decode kernels only".into() });
    };
    let pool_shape = pool_shape(shape);
    let args = Args::new(&pool_shape)?;
    cache.check(&args)?;
    // The tile kernel reads a key tile from one page; the row kernel reads each group's V keys
    // from one page.
    let (keys, what) = match t.tiling {
        DecodeTiling::Tile(tiles) => (tiles.bk, "key tiles"),
        DecodeTiling::Rows(r) => (r.config(args.head_dim, args.v_head_dim, false, false).kb() as u32, "V key groups"),
        DecodeTiling::Mma(_) => {
            return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "the MMA decode kernel reads contiguous caches".into() });
        }
    };
    if keys > cache.page_size {
        return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: format!("its {keys}-key {what} span pages of {} keys", cache.page_size) });
    }
    crate::launch::check_dtype_supported(client, dtype)?;
    vector_layout_ok(&pool_shape).map_err(|reason| LaunchError::UnalignedLayout { reason })?;
    let pool = |dim: u32| cache.pool_elems(args.kv_heads, dim);
    let extents = args.extents();
    let bytes = dtype.size_bytes() as u64;
    for (tensor, elems, handle) in [
        ("q", extents[0].1, q),
        ("k pool", pool(args.head_dim), k),
        ("v pool", pool(args.v_head_dim), v),
        ("o", extents[3].1, o),
    ] {
        crate::launch::check_extent(tensor, elems.max(W as u64), bytes, handle)?;
    }
    for (tensor, elems) in [("k pool", pool(args.head_dim)), ("v pool", pool(args.v_head_dim)), ("block table", cache.table_words(args.batch))] {
        if elems > u32::MAX as u64 {
            return Err(LaunchError::IndexOverflow { tensor, elems });
        }
    }
    crate::launch::check_extent("block table", cache.table_words(args.batch), 4, cache.table)?;
    crate::launch::check_lse(&args, lse)?;
    let mods = (!paged_mods_none(mods, shape)).then_some(mods);
    if let Some(m) = mods {
        m.check(&args)?;
    }
    let plane_reduce = t.reduce_lanes().is_some_and(|tc| crate::launch::plane_reduce_ok(client, tc));
    launch(client, kernel, t, &args, dtype, [q, k, v, o], crate::launch::lse_binding(client, &args, lse), plane_reduce, Some(cache), mods)
}

/// `append_kv` on the device: token `t` of sequence `b` of `new_k` / `new_v` (`[batch,
/// new_tokens, kv_heads, dim]`, elements of `elem_bytes` bytes) into the pools of `cache` at
/// position `seq_lens[b] + t`, through the block table ([`crate::kernel`]'s `paged_append`).
/// The lengths in the table buffer are left as they are (the caller owns them). Checks the
/// buffers' sizes; the table's contents are the caller's to validate (a position whose page is
/// missing or outside the pool writes nothing). Two sequences appending into the same pool row
/// race: the caller keeps appended rows distinct.
#[allow(clippy::too_many_arguments)]
pub fn launch_paged_append<R: Runtime>(
    client: &ComputeClient<R>,
    cache: &PagedCache<'_>,
    batch: u32,
    kv_heads: u32,
    head_dim: u32,
    v_head_dim: u32,
    elem_bytes: u32,
    new_tokens: u32,
    pools: [&Handle; 2],
    new: [&Handle; 2],
) -> Result<(), LaunchError> {
    let bad = |reason: String| Err(LaunchError::InvalidProblem { reason });
    if !cache.page_size.is_power_of_two() || cache.num_pages == 0 || cache.max_pages == 0 {
        return bad(format!("a paged cache of {} pages of {} keys, {} per sequence", cache.num_pages, cache.page_size, cache.max_pages));
    }
    let row_bytes = |dim: u32| kv_heads as u64 * dim as u64 * elem_bytes as u64;
    let (k_bytes, v_bytes) = (row_bytes(head_dim), row_bytes(v_head_dim));
    if k_bytes % 4 != 0 || v_bytes % 4 != 0 {
        return bad(format!("K/V rows of {k_bytes} and {v_bytes} bytes are not whole 32-bit words"));
    }
    let (k_words, v_words) = (k_bytes / 4, v_bytes / 4);
    let rows = cache.num_pages as u64 * cache.page_size as u64;
    let tokens = batch as u64 * new_tokens as u64;
    let checks = [
        ("k pool", rows * k_words, pools[0]),
        ("v pool", rows * v_words, pools[1]),
        ("new k", tokens * k_words, new[0]),
        ("new v", tokens * v_words, new[1]),
        ("block table", cache.table_words(batch), cache.table),
    ];
    for (tensor, words, handle) in checks {
        if words > u32::MAX as u64 {
            return Err(LaunchError::IndexOverflow { tensor, elems: words });
        }
        crate::launch::check_extent(tensor, words, 4, handle)?;
    }
    if tokens == 0 || k_words == 0 {
        return Ok(());
    }
    check_grid((new_tokens, batch, 1), client.properties().hardware.max_cube_count)?;
    // SAFETY: each binding covers the words checked above; the kernel writes pool rows below
    // `num_pages · page_size` (pages at or past `num_pages` are skipped) and reads source rows
    // below `batch · new_tokens` and table words below `table_words(batch)`.
    unsafe {
        let arg = |h: &Handle, words: u64| ArrayArg::<R>::from_raw_parts(h.clone(), words.max(1) as usize);
        crate::kernel::paged_append::paged_append::launch_unchecked::<R>(
            client,
            CubeCount::Static(new_tokens, batch, 1),
            CubeDim::new_1d(128),
            arg(pools[0], rows * k_words),
            arg(pools[1], rows * v_words),
            arg(new[0], tokens * k_words),
            arg(new[1], tokens * v_words),
            arg(cache.table, cache.table_words(batch)),
            crate::kernel::paged_append::AppendArgsLaunch::new(
                new_tokens,
                cache.page_size.trailing_zeros(),
                cache.max_pages,
                cache.num_pages,
                batch * cache.max_pages,
                k_words as u32,
                v_words as u32,
            ),
        );
    }
    Ok(())
}

/// Inputs of the FP8 row decode kernel that [`crate::launch_fp8`] checked: the code buffers
/// (bytes, 4 per word) with their extents in codes, the bound Q, K and V descales, their shape,
/// and the code format.
pub(crate) struct Fp8RowInputs<R: Runtime> {
    pub words: [Handle; 3],
    pub extents: [u64; 3],
    pub descales: [ArrayArg<R>; 3],
    pub fp8_shape: Fp8ShapeLaunch<R>,
    pub fcfg: Fp8Config,
}

/// The FP8 row decode kernel and, with several splits, the merge. The caller
/// ([`crate::launch_fp8`]) checked the dtypes, the layout, every extent and the LSE.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_fp8_rows<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    t: &DecodeTiles,
    args: &Args,
    o_dtype: Dtype,
    inputs: Fp8RowInputs<R>,
    o: (&Handle, u64),
    lse: (Handle, u64),
) -> Result<LaunchInfo, LaunchError> {
    let (info, prep) = prepare(client, kernel, t, args, o_dtype, false, None)?;
    let Some(prep) = prep else { return Ok(info) };
    let Fp8RowInputs { words, extents, descales, fp8_shape, fcfg } = inputs;
    // SAFETY: as `codes` below, in elements of `o_dtype`.
    let o_arg = || unsafe { ArrayArg::from_raw_parts(o.0.clone(), (o.1 as usize).div_ceil(W).max(1)) };
    // SAFETY: the caller checked that its LSE buffer holds `lse.1` floats (or bound a scratch).
    let lse_arg = || unsafe { ArrayArg::from_raw_parts(lse.0.clone(), lse.1 as usize) };
    let count = CubeCount::Static(info.cube_count.0, info.cube_count.1, info.cube_count.2);
    let dim = CubeDim::new_1d(t.units());
    let r = match t.tiling {
        DecodeTiling::Rows(r) => r,
        DecodeTiling::Mma(m) => {
            if fcfg.per_block() || !fp8_conversion(client, fcfg) {
                return Err(LaunchError::WrongKernel {
                    kernel: kernel.name(),
                    reason: "the MMA decode kernel takes per-tensor or per-head descales, on a device that converts FP8".into(),
                });
            }
            let inputs = MmaInputs { q: (&words[0], extents[0]), k: (&words[1], extents[1]), v: (&words[2], extents[2]), fp8: Some((descales, fp8_shape, fcfg)) };
            // SAFETY: the caller checked that O holds `o.1` elements of `o_dtype`; the kernel
            // writes it element by element.
            let o_elems = unsafe { ArrayArg::from_raw_parts(o.0.clone(), o.1.max(1) as usize) };
            launch_mma(client, m, args, count, dim, &prep, t, Dtype::F16, o_dtype, inputs, o_elems, lse_arg())?;
            return finish_launch(client, info, &prep, t, args, o_dtype, o_arg(), lse_arg());
        }
        DecodeTiling::Tile(_) => {
            return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "FP8 decode runs on the row or MMA kernels".into() });
        }
    };
    let cfg = r.config(args.head_dim, args.v_head_dim, args.causal, args.write_lse);
    // SAFETY: checked by the caller to cover `max(extent, W)` codes: whole words.
    let codes = |handle: &Handle, elems: u64| unsafe { ArrayArg::from_raw_parts(handle.clone(), (elems as usize).div_ceil(W).max(1)) };
    let [qd, kd, vd] = descales;
    let cvt = fp8_conversion(client, fcfg);
    let (q, k, v) = (codes(&words[0], extents[0]), codes(&words[1], extents[1]), codes(&words[2], extents[2]));
    macro_rules! go {
        ($e:ty) => {
            // SAFETY: K/V words are read below kv_len, Q words and O vectors inside the packed
            // rows (`check_shape`), descales at indices the caller's counts cover, and the
            // partial states inside their allocation.
            unsafe {
                fwd_portable_decode_rows_fp8::launch_unchecked::<$e, R>(
                    client, count, dim, W,
                    q, k, v, qd, kd, vd, o_arg(), lse_arg(), prep.part_o_arg(), prep.part_lse_arg(),
                    crate::launch::shape_arg::<R>(args), prep.dec_arg(t), fp8_shape, cfg, fcfg, cvt, prep.direct,
                )
            }
        };
    }
    match o_dtype {
        Dtype::F32 => go!(f32),
        Dtype::F16 => go!(f16),
        Dtype::Bf16 => go!(bf16),
    }
    finish_launch(client, info, &prep, t, args, o_dtype, o_arg(), lse_arg())
}

/// The FP8 decode launch's end, after either kernel: the merge (several splits) and the record.
#[allow(clippy::too_many_arguments)]
fn finish_launch<R: Runtime>(
    client: &ComputeClient<R>,
    mut info: LaunchInfo,
    prep: &Prepared,
    t: &DecodeTiles,
    args: &Args,
    o_dtype: Dtype,
    o: ArrayArg<R>,
    lse: ArrayArg<R>,
) -> Result<LaunchInfo, LaunchError> {
    prep.merge(client, t, args, o_dtype, o, lse, None)?;
    info.launched = true;
    Ok(info)
}

/// Whether the FP8 row kernel decodes codes with the device's conversion instruction: on CUDA
/// where the runtime reports FP8 conversions (sm_89 and later: `cvt` of two codes to two f16,
/// a third of the integer decode's instructions in a loop bound by instructions). Other
/// runtimes decode with integer and float instructions, which every device has.
pub(crate) fn fp8_conversion<R: Runtime>(client: &ComputeClient<R>, fcfg: Fp8Config) -> bool {
    let uses = match fcfg.format {
        Fp8Format::E4M3 => cubecl::e4m3::supported_uses(client),
        Fp8Format::E5M2 => cubecl::e5m2::supported_uses(client),
    };
    R::name(client) == "cuda" && uses.contains(cubecl::features::TypeUsage::Conversion)
}

/// The MMA decode kernel's tiling for `args` on elements of `code_bytes` bytes (2: `dtype`
/// f16/bf16; 1: FP8 codes, which the kernel converts to f16), if it applies: the runtime's
/// manual MMA for the 16-bit type, at most [`MMA_DECODE_MAX_ROWS`] packed rows, head dims its
/// lanes split into whole words. 16 keys per warp step on 16-bit elements and 32 on codes:
/// either way 128 bytes of each K and V row per lane and step at d 128.
pub(crate) fn mma_decode_tiles<R: Runtime>(client: &ComputeClient<R>, args: &Args, dtype: Dtype, code_bytes: u32) -> Option<MmaDecodeTiles> {
    let rows = packed_rows(args);
    if rows == 0 || rows > MMA_DECODE_MAX_ROWS as u64 {
        return None;
    }
    let mma_type = if code_bytes == 1 { Dtype::F16 } else { dtype };
    if let Some(why) = crate::launch::mma_unavailable(client, mma_type) {
        log::debug!("MMA decode kernel not chosen: {why}");
        return None;
    }
    mma_decode_candidates(rows as u32, args.head_dim, args.v_head_dim, code_bytes).into_iter().next()
}

/// MMA decode kernel tilings for `rows` packed rows on elements of `code_bytes` bytes (2, or 1
/// for FP8 codes), best first: 4 warps, 16 keys per warp step on 16-bit elements and 32 on
/// codes (128 bytes of each K and V row per lane and step at d 128, all of it in flight while
/// the previous step computes). Empty where the kernel does not cover the rows or head dims.
pub fn mma_decode_candidates(rows: u32, head_dim: u32, v_head_dim: u32, code_bytes: u32) -> Vec<MmaDecodeTiles> {
    let tiles = MmaDecodeTiles { rows, warps: 4, steps: if code_bytes == 1 { 2 } else { 1 } };
    let ok = tiles.config(head_dim, v_head_dim, code_bytes, 1, false, false).invalid().is_none();
    ok.then_some(tiles).into_iter().collect()
}

/// The widest load (4, 2 or 1 words) of the MMA decode kernel that every lane's K and V start
/// is aligned to: it divides each lane's words and every K and V stride in words.
pub(crate) fn mma_decode_vec(args: &Args, code_bytes: u32) -> u32 {
    let words = |elems: u32| elems as u64 * code_bytes as u64 / 4;
    let mut all = vec![words(args.head_dim / 4), words(args.v_head_dim / 8)];
    for &s in args.k_strides.iter().chain(args.v_strides.iter()) {
        // A stride of whole words: `vector_layout_ok` holds every stride to 4 elements.
        all.push(if (s as u64 * code_bytes as u64).is_multiple_of(4) { words(s) } else { 1 });
    }
    [4u32, 2, 1].into_iter().find(|&v| all.iter().all(|&w| w.is_multiple_of(v as u64))).unwrap_or(1)
}

/// The FP8 decode kernel for `args` with `fcfg` codes, with its split: the MMA kernel where it
/// applies ([`mma_decode_tiles`]: per-tensor or per-head descales, a device that converts FP8),
/// else the row kernel ([`select_rows`]).
pub(crate) fn select_fp8_decode<R: Runtime>(client: &ComputeClient<R>, args: &Args, shape: &AttentionShape, fcfg: Fp8Config) -> Result<DecodeTiles, String> {
    if let Some(reason) = decode_shape_refusal(args, shape) {
        return Err(reason);
    }
    if !fcfg.per_block() && fp8_conversion(client, fcfg) {
        if let Some(m) = mma_decode_tiles(client, args, Dtype::F16, 1) {
            return Ok(DecodeTiles::split_for(client, args, DecodeTiling::Mma(m)));
        }
    }
    select_rows(client, args, shape)
}

/// Resident cubes per SM the 4-bit MMA decode kernel's split assumes: at about 237 registers a
/// lane, two cubes of four warps fit an SM's register file.
pub const FP4_MMA_CUBES_PER_SM: u32 = 2;

/// The 4-bit MMA decode kernel's configuration of tiling `t` (which must be `DecodeTiling::Mma`
/// with [`FP4_DECODE_STEPS`] key steps) for NVFP4 Q, K and `Vᵀ` (P NVFP4 with `Fp4V::Nvfp4`,
/// f16 with `Fp4V::Nvfp4P16`), or why not.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fp4_decode_config(
    t: &DecodeTiles,
    head_dim: u32,
    v_head_dim: u32,
    format: crate::Fp4Format,
    v: crate::Fp4V,
    causal: bool,
    write_lse: bool,
    shift_lse: bool,
) -> Result<Fp4DecodeConfig, String> {
    if format != crate::Fp4Format::Nvfp4 || !v.is_4bit() {
        return Err("the 4-bit MMA decode kernel reads NVFP4 Q, K and V".into());
    }
    let DecodeTiling::Mma(m) = t.tiling else {
        return Err(format!("{t}: the 4-bit MMA decode kernel has an MMA decode tiling"));
    };
    if m.steps as usize != FP4_DECODE_STEPS {
        return Err(format!("{t}: the 4-bit MMA decode kernel walks {FP4_DECODE_STEPS} key steps per warp tile"));
    }
    let cfg = Fp4DecodeConfig {
        head_dim: head_dim as usize,
        v_head_dim: v_head_dim as usize,
        rows: m.rows as usize,
        warps: m.warps as usize,
        causal,
        write_lse,
        shift_lse,
        p_nvfp4: v == crate::Fp4V::Nvfp4,
    };
    match cfg.invalid() {
        Some(reason) => Err(reason),
        None => Ok(cfg),
    }
}

/// The 4-bit MMA decode kernel with its split for NVFP4 Q, K and `Vᵀ` (`format`, `v`), where
/// it applies: a decode shape of at most [`FP4_DECODE_MAX_ROWS`] packed rows, the head dims it
/// covers, and a device with the f16 manual MMA (CUDA sm_80 and later; the codes and scales
/// are decoded with integer instructions). `None` otherwise (the 4-bit FMA kernel runs).
pub(crate) fn select_fp4_decode<R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    shape: &AttentionShape,
    format: crate::Fp4Format,
    v: crate::Fp4V,
) -> Option<DecodeTiles> {
    if let Some(why) = decode_shape_refusal(args, shape) {
        log::debug!("4-bit MMA decode kernel not chosen: {why}");
        return None;
    }
    let rows = packed_rows(args);
    if rows == 0 || rows > FP4_DECODE_MAX_ROWS as u64 {
        return None;
    }
    if let Some(why) = crate::launch::mma_unavailable(client, Dtype::F16) {
        log::debug!("4-bit MMA decode kernel not chosen: {why}");
        return None;
    }
    let tiling = DecodeTiling::Mma(MmaDecodeTiles { rows: rows as u32, warps: 4, steps: FP4_DECODE_STEPS as u32 });
    let probe = DecodeTiles { tiling, splits: 1, keys_per_split: 0 };
    if let Err(why) = fp4_decode_config(&probe, args.head_dim, args.v_head_dim, format, v, args.causal, args.write_lse, false) {
        log::debug!("4-bit MMA decode kernel not chosen: {why}");
        return None;
    }
    Some(DecodeTiles::split_with(client, args, tiling, FP4_MMA_CUBES_PER_SM))
}

/// Enqueues the 4-bit MMA decode kernel of `t` (from [`select_fp4_decode`]) and the merge of
/// its splits: `ops` and `bytes` as `launch_fp4` checked them, O f32 (`o.1` elements, the
/// shape's strides), the LSE binding `lse`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_fp4_mma<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    t: &DecodeTiles,
    args: &Args,
    ops: &crate::Fp4Operands<'_>,
    bytes: [u64; 6],
    shift_lse: bool,
    o: (&Handle, u64),
    lse: (Handle, u64),
) -> Result<LaunchInfo, LaunchError> {
    let crate::PortableKernel::Fp4(fp4) = kernel else {
        return Err(LaunchError::WrongKernel { kernel: kernel.name(), reason: "the 4-bit MMA decode launch runs 4-bit plans".into() });
    };
    let cfg = fp4_decode_config(t, args.head_dim, args.v_head_dim, fp4.format, fp4.v, args.causal, args.write_lse, shift_lse)
        .map_err(|reason| LaunchError::InvalidTiles { tiles: t.to_string(), reason })?;
    let (info, prep) = prepare(client, kernel, t, args, Dtype::F32, false, None)?;
    let Some(prep) = prep else { return Ok(info) };
    let count = CubeCount::Static(info.cube_count.0, info.cube_count.1, info.cube_count.2);
    let dim = CubeDim::new_1d(t.units());
    let words = |b: u64| b.div_ceil(4).max(1) as usize;
    let kw = cfg.k_words();
    // SAFETY (all): `launch_fp4` checked each handle to hold `words(bytes)` words; K rows are
    // `d/8` words, read as `d/32`-word vectors of rows below kv_len; `Vᵀ` rows an even number of
    // words (keys padded to 16), read as word pairs inside their row; Q rows and the scale bytes
    // inside their layouts; O and the LSE at the packed rows' (head, position), the partial
    // states inside their allocation.
    let word_arg = |h: &Handle, b: u64| unsafe { ArrayArg::from_raw_parts(h.clone(), words(b)) };
    let k_arg = unsafe { ArrayArg::from_raw_parts(ops.k.clone(), words(bytes[2]) / kw) };
    let v_arg = unsafe { ArrayArg::from_raw_parts(ops.v.clone(), words(bytes[4]) / 2) };
    let scalar = |h: &Handle| unsafe { ArrayArg::from_raw_parts(h.clone(), 1) };
    let shift = match ops.lse_shift {
        Some(h) if shift_lse => unsafe { ArrayArg::from_raw_parts(h.clone(), args.lse_len() as usize) },
        // Never read without the shift: Q's tensor scale stands in.
        _ => scalar(ops.tensor_scales[0]),
    };
    let o_elems = unsafe { ArrayArg::from_raw_parts(o.0.clone(), o.1.max(1) as usize) };
    let lse_arg = || unsafe { ArrayArg::from_raw_parts(lse.0.clone(), lse.1 as usize) };
    let v_words = args.kv_len.div_ceil(16) * 2;
    unsafe {
        fwd_portable_decode_mma_fp4::launch_unchecked::<R>(
            client, count, dim, kw,
            word_arg(ops.q, bytes[0]), word_arg(ops.q_scales, bytes[1]), k_arg, word_arg(ops.k_scales, bytes[3]),
            v_arg, word_arg(ops.v_scales, bytes[5]),
            scalar(ops.tensor_scales[0]), scalar(ops.tensor_scales[1]), scalar(ops.tensor_scales[2]), shift,
            o_elems, lse_arg(), prep.part_o_scalar_arg(), prep.part_lse_arg(),
            crate::launch::shape_arg::<R>(args), prep.dec_arg(t), Fp4ShapeLaunch::new(args.kv_heads, v_words), cfg, prep.direct,
        )
    };
    // SAFETY: O holds `o.1` f32s, as vectors of W (row starts and dims multiples of W).
    let o_vectors = unsafe { ArrayArg::from_raw_parts(o.0.clone(), (o.1 as usize).div_ceil(W).max(1)) };
    finish_launch(client, info, &prep, t, args, Dtype::F32, o_vectors, lse_arg())
}

/// The row decode kernel for `args`, with its split: the first [`row_candidates`] tiling, for
/// at most `ROW_DECODE_MAX_ROWS` packed rows and at least [`DECODE_MIN_KV`] keys. `Err` says
/// why not.
pub(crate) fn select_rows<R: Runtime>(client: &ComputeClient<R>, args: &Args, shape: &AttentionShape) -> Result<DecodeTiles, String> {
    if let Some(reason) = decode_shape_refusal(args, shape) {
        return Err(reason);
    }
    let rows = args.group_size() * args.q_len;
    let Some(tiles) = row_candidates(rows, args.head_dim, args.v_head_dim).into_iter().next() else {
        return Err(format!("no row decode tiling for {rows} rows at d={} dv={}", args.head_dim, args.v_head_dim));
    };
    Ok(DecodeTiles::split_for(client, args, DecodeTiling::Rows(tiles)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_fills_one_wave_and_keeps_whole_tiles() {
        // H100 decode shape: 64 (batch, KV head) pairs, 132 SMs.
        assert_eq!(decode_split(64, 32768, 64, 132), (16, 2048));
        assert_eq!(decode_split(64, 8192, 64, 132), (16, 512));
        // Short caches keep MIN_TILES_PER_SPLIT tiles per split.
        assert_eq!(decode_split(1, 1500, 64, 132), (6, 256));
        assert_eq!(decode_split(1, 100, 64, 132), (1, 128));
        // Many pairs: one split.
        assert_eq!(decode_split(4096, 1 << 20, 64, 132), (1, 1 << 20));
        // Capped.
        assert_eq!(decode_split(1, 1 << 24, 64, 1000).0, MAX_SPLITS);
        for pairs in [1u64, 3, 64, 1000] {
            for kv in [1u32, 63, 64, 65, 511, 512, 1500, 32768, 100_000] {
                for bk in [32u32, 64] {
                    let (s, kps) = decode_split(pairs, kv, bk, 132);
                    assert!((1..=MAX_SPLITS).contains(&s));
                    assert_eq!(kps % bk, 0);
                    // Covers the keys, no empty split.
                    assert!(s as u64 * kps as u64 >= kv as u64);
                    assert!(s == 1 || ((s - 1) as u64 * kps as u64) < kv as u64);
                    // Whole tiles of at least MIN_TILES_PER_SPLIT, unless there is one split.
                    assert!(s == 1 || kps / bk >= MIN_TILES_PER_SPLIT, "{pairs} {kv} {bk}: {s} x {kps}");
                    assert!(s as u64 <= (CUBES_PER_SM as u64 * 132 / pairs).max(1));
                }
            }
        }
    }

    /// The 4-bit MMA decode kernel takes NVFP4 Q, K and `Vᵀ` with either P (its `p_nvfp4` says
    /// which) and nothing else.
    #[test]
    fn fp4_decode_config_takes_nvfp4_v_with_either_p() {
        let tiling = DecodeTiling::Mma(MmaDecodeTiles { rows: 4, warps: 4, steps: FP4_DECODE_STEPS as u32 });
        let t = DecodeTiles { tiling, splits: 1, keys_per_split: 0 };
        let cfg = |format, v| fp4_decode_config(&t, 128, 128, format, v, false, true, false);
        let nv = crate::Fp4Format::Nvfp4;
        assert!(cfg(nv, crate::Fp4V::Nvfp4).unwrap().p_nvfp4);
        assert!(!cfg(nv, crate::Fp4V::Nvfp4P16).unwrap().p_nvfp4);
        assert!(cfg(nv, crate::Fp4V::Bf16).is_err());
        assert!(cfg(crate::Fp4Format::Mxfp4, crate::Fp4V::Nvfp4).is_err());
        assert!(cfg(crate::Fp4Format::Mxfp4, crate::Fp4V::Nvfp4P16).is_err());
    }

    #[test]
    fn candidates_hold_the_rows_and_validate() {
        for rows in 1..=DECODE_MAX_ROWS {
            for dv in [32u32, 64, 96, 128, 256] {
                let all = decode_candidates(rows, dv, dv);
                assert!(!all.is_empty());
                for t in all {
                    assert!(t.bq >= rows && t.bq <= 64, "{rows}: {t}");
                    assert_eq!(t.rm(), 4);
                    t.validate(dv, dv).unwrap_or_else(|e| panic!("{rows} {dv}: {e}"));
                }
            }
        }
    }
}
