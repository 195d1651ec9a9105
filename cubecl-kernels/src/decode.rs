//! The split-KV decode kernel (`kernel/decode.rs`) on the host: when it applies, its tile
//! table, the split of the KV sequence, and its launch (the decode kernel, then the merge when
//! there is more than one split).

use std::fmt;

use cubecl::prelude::*;
use cubecl::server::Handle;
use half::{bf16, f16};
use quattn_core::{Accumulation, AttentionShape, Dtype};

use crate::error::LaunchError;
use crate::kernel::decode::{decode_merge, fwd_portable_decode, DecodeArgsLaunch};
use crate::kernel::fma_vec::{FmaVecConfig, W};
use crate::launch::{check_grid, vector_layout_ok, CubeLimits, Family, LaunchInfo, PortableKernel};
use crate::problem::Args;
use crate::tiling::FmaVecTiles;

/// Most packed query rows (`group · q_len`) per (batch, KV head): one cube's query tile.
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
/// SMs assumed where the runtime reports none (wgpu reports no count): about an H100's 132.
pub const ASSUMED_SMS: u32 = 128;

/// The decode kernel resolved for one shape: the vector FMA tiling of its packed query tile and
/// the split of the keys ([`decode_split`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeTiles {
    pub tiles: FmaVecTiles,
    /// Cubes along the KV sequence per (batch, KV head); 1 writes O directly.
    pub splits: u32,
    /// Keys of every split but the last, a multiple of `tiles.bk`.
    pub keys_per_split: u32,
}

impl fmt::Display for DecodeTiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_split{}x{}", self.tiles, self.splits, self.keys_per_split)
    }
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
    let bk = bk.max(1) as u64;
    let tiles = (kv_len as u64).div_ceil(bk).max(1);
    let slots = sms.max(1) as u64 * CUBES_PER_SM as u64;
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

/// Why the decode family does not take this problem, if it does not: at most
/// [`DECODE_MAX_ROWS`] packed rows per KV head, at least [`DECODE_MIN_KV`] keys, the vector
/// layout of the FMA kernels.
pub(crate) fn decode_shape_refusal(args: &Args, shape: &AttentionShape) -> Option<String> {
    let rows = args.group_size() as u64 * args.q_len as u64;
    if rows == 0 || rows > DECODE_MAX_ROWS as u64 {
        return Some(format!(
            "not decode-shaped: {rows} query rows per KV head ({} q heads per KV head x q_len {}), the decode tile takes 1..={DECODE_MAX_ROWS}",
            args.group_size(),
            args.q_len
        ));
    }
    if args.kv_len < DECODE_MIN_KV {
        return Some(format!("kv_len {} is below {DECODE_MIN_KV}: one per-head tile streams it without a merge", args.kv_len));
    }
    vector_layout_ok(shape).err()
}

/// The decode kernel for `shape` on `dtype` inputs, f32 accumulation: the first tiling that fits
/// the runtime, with the split of [`decode_split`] on the runtime's SM count.
pub(crate) fn select<R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    shape: &AttentionShape,
    dtype: Dtype,
    accumulation: Accumulation,
) -> Result<PortableKernel, LaunchError> {
    let unavailable = |reason: String| LaunchError::FamilyUnavailable { family: Family::Decode, reason };
    if !accumulation.is_f32() {
        return Err(unavailable("it accumulates in f32 only".into()));
    }
    if let Some(reason) = decode_shape_refusal(args, shape) {
        return Err(unavailable(reason));
    }
    let limits = CubeLimits::of(client);
    let sms = client.properties().hardware.num_streaming_multiprocessors.unwrap_or(ASSUMED_SMS);
    let rows = args.group_size() * args.q_len;
    let pairs = args.batch as u64 * args.kv_heads as u64;
    let mut last = None;
    for tiles in decode_candidates(rows, args.head_dim, args.v_head_dim) {
        let (splits, keys_per_split) = decode_split(pairs, args.kv_len, tiles.bk, sms);
        let kernel = PortableKernel::Decode(DecodeTiles { tiles, splits, keys_per_split });
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
    /// Whether this resolved kernel covers `args`: the rows fit the tile, and the split covers
    /// the keys with non-empty splits of whole tiles.
    fn check_shape(&self, args: &Args) -> Result<(), LaunchError> {
        let bad = |reason: String| Err(LaunchError::WrongKernel { kernel: format!("portable_decode_{self}"), reason });
        let rows = args.group_size() as u64 * args.q_len as u64;
        if rows > self.tiles.bq as u64 {
            return bad(format!("{rows} packed query rows exceed the tile's {}", self.tiles.bq));
        }
        let kps = self.keys_per_split as u64;
        if self.splits == 0 || self.splits > MAX_SPLITS || kps == 0 || !kps.is_multiple_of(self.tiles.bk as u64) {
            return bad(format!("1..={MAX_SPLITS} splits of a positive multiple of {} keys", self.tiles.bk));
        }
        let kv = args.kv_len as u64;
        let splits = self.splits as u64;
        if splits * kps < kv || (splits > 1 && (splits - 1) * kps >= kv) {
            return bad(format!("the split does not cover kv_len {kv} with non-empty splits"));
        }
        if splits * kps > u32::MAX as u64 {
            return bad("the split reaches past 32-bit key indices".into());
        }
        Ok(())
    }
}

/// Launches the decode kernel and, with several splits, the merge. The caller ([`crate::launch`])
/// checked the dtype, the vector layout, the buffers' extents and the LSE binding.
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
) -> Result<LaunchInfo, LaunchError> {
    kernel.check_fits(CubeLimits::of(client), args.head_dim, args.v_head_dim, dtype)?;
    t.check_shape(args)?;
    let count = (t.splits, args.kv_heads, args.batch);
    let max = client.properties().hardware.max_cube_count;
    check_grid(count, max)?;
    let rows = args.group_size() * args.q_len;
    let mut info = LaunchInfo {
        kernel: kernel.kernel_name(dtype, args.head_dim as usize, args.v_head_dim as usize),
        cube_count: count,
        units_per_cube: kernel.units(),
        shared_memory_bytes: kernel.smem_bytes(args.head_dim, args.v_head_dim, dtype),
        plane_reduce,
        launched: false,
    };
    if count.0 == 0 || count.1 == 0 || count.2 == 0 || rows == 0 {
        log::debug!("{}: empty grid, nothing launched", info.kernel);
        return Ok(info);
    }
    let direct = t.splits == 1;
    // Partial states, f32: `[batch][kv_head][split][bq][dv]` and `[...][bq]`.
    let states = args.batch as u64 * args.kv_heads as u64 * t.splits as u64 * t.tiles.bq as u64;
    let (o_elems, lse_elems) = if direct { (W as u64, 1) } else { (states * args.v_head_dim as u64, states) };
    for (tensor, elems) in [("decode partial O", o_elems), ("decode partial LSE", lse_elems)] {
        if elems > u32::MAX as u64 {
            return Err(LaunchError::IndexOverflow { tensor, elems });
        }
    }
    let part_o = client.empty(o_elems as usize * 4);
    let part_lse = client.empty(lse_elems as usize * 4);
    log::debug!("launching {} ({} splits of {} keys) for {args:?}", info.kernel, t.splits, t.keys_per_split);

    let extents = args.extents();
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
    // SAFETY: allocated above with exactly these many f32s.
    let part_o_arg = || unsafe { ArrayArg::from_raw_parts(part_o.clone(), (o_elems as usize).div_ceil(W)) };
    let part_lse_arg = || unsafe { ArrayArg::from_raw_parts(part_lse.clone(), lse_elems as usize) };
    let dec_arg = || DecodeArgsLaunch::new(rows, t.splits, t.keys_per_split);
    let cfg = FmaVecConfig {
        head_dim: args.head_dim as usize,
        v_head_dim: args.v_head_dim as usize,
        bq: t.tiles.bq as usize,
        bk: t.tiles.bk as usize,
        tr: t.tiles.tr as usize,
        tc: t.tiles.tc as usize,
        causal: args.causal,
        write_lse: args.write_lse,
        lazy_rescale: true,
        plane_reduce,
    };
    let count_arg = CubeCount::Static(count.0, count.1, count.2);
    let dim = CubeDim::new_1d(kernel.units());
    macro_rules! decode {
        ($e:ty, $s:ty) => {
            // SAFETY: every global index is guarded by q_len / kv_len / rows, the buffers cover
            // the strided extents, and the partial states are indexed inside their allocation
            // (`check_shape`: rows ≤ bq, split < splits).
            unsafe {
                fwd_portable_decode::launch_unchecked::<$e, $s, R>(
                    client, count_arg, dim, W,
                    arr(q, extents[0].1), arr(k, extents[1].1), arr(v, extents[2].1), arr(o, extents[3].1),
                    lse_arg(), part_o_arg(), part_lse_arg(), crate::launch::shape_arg::<R>(args), dec_arg(), cfg, direct,
                )
            }
        };
    }
    match (dtype, t.tiles.stage_f32) {
        (Dtype::F32, _) => decode!(f32, f32),
        (Dtype::F16, true) => decode!(f16, f32),
        (Dtype::F16, false) => decode!(f16, f16),
        (Dtype::Bf16, true) => decode!(bf16, f32),
        (Dtype::Bf16, false) => decode!(bf16, bf16),
    }
    if !direct {
        let merge_count = CubeCount::Static(rows, args.kv_heads, args.batch);
        check_grid((rows, args.kv_heads, args.batch), max)?;
        let merge_dim = CubeDim::new_1d(args.v_head_dim / W as u32);
        let (bq, dv, write_lse) = (t.tiles.bq as usize, args.v_head_dim as usize, args.write_lse);
        macro_rules! merge {
            ($e:ty) => {
                // SAFETY: the merge reads states `< batch · kv_heads · splits · bq` (rows ≤ bq)
                // and writes O rows and LSE entries of existing (head, position) pairs.
                unsafe {
                    decode_merge::launch_unchecked::<$e, R>(
                        client, merge_count, merge_dim, W,
                        part_o_arg(), part_lse_arg(), arr(o, extents[3].1), lse_arg(),
                        crate::launch::shape_arg::<R>(args), dec_arg(), bq, dv, write_lse,
                    )
                }
            };
        }
        match dtype {
            Dtype::F32 => merge!(f32),
            Dtype::F16 => merge!(f16),
            Dtype::Bf16 => merge!(bf16),
        }
    }
    info.launched = true;
    Ok(info)
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
