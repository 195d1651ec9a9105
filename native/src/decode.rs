//! The decode family (`cuda/fwd_decode.cu`): flash-decoding on `mma.sync.m16n8k16`, fp16 or
//! bf16, f32 accumulation, for few query rows per KV head against a long KV sequence, and the
//! prefill of a paged cache.
//!
//! One CTA takes one (batch, KV head, row block, split): the query rows of the whole GQA group
//! at every query position are packed (`rows = group · q_len`), a row block is one tile of them
//! (16, 32 or 64 rows; decode is one block, a paged prefill several: [`DecodeConfig::row_blocks`]),
//! against one slice of the keys, so K and V are read once per group and row block. When the
//! CTAs cannot fill the device, the keys are split across CTAs ([`decode_split`]) and each split
//! writes its partial O (f32, normalized over its keys) and LSE; the last split of a row block to
//! finish combines them by their LSE (an atomic count per row block in a caller's buffer of
//! [`DecodeConfig::counters_len`] zeroed `u32`s, which the kernel leaves zeroed), so a decode is
//! one launch. One split writes O and the LSE directly. Masks, GQA, strides and the LSE follow the
//! other families ([`AttentionShape`]: bottom-right causal alignment, ragged lengths, any
//! strides in 16-byte pieces).
//!
//! The paged variants ([`DecodeConfig::paged`]) read K and V from the pools of a paged cache,
//! `[num_pages, page_size, kv_heads, head_dim]`, through a block table `[batch, max_pages]`,
//! each sequence with its own length ([`PagedArgs`]); every other part of the kernel is the same
//! source. Page sizes are the powers of two 16 to 256: a K/V tile (64 keys at hd128, 128 at
//! hd64) may span several pages, so every copied key row looks its page up (the table entries
//! of the next tile are read one tile ahead).
//!
//! The modifier variants ([`DecodeConfig::mods`], launched with a [`ModParams`]) take the
//! score modifiers of the other f16/bf16 families: window and causal band with its alignment
//! (per sequence in the paged variants), softcap, ALiBi per packed row's Q head, and sinks
//! (added once: in the epilogue with one split, by the merge with several). Their splits
//! divide only the keys some query position sees ([`mod_key_range`]), so keys outside every
//! row's window are never read.

use crate::arch::Arch;
use crate::cache::{CompileRequest, KernelSource};
use crate::error::{NativeError, Result};
use crate::hmma::check_strides;
use crate::mods::{ModParams, ModVariant};
use crate::report::KernelVariant;
use quattn_core::{AttentionShape, Dtype};

const KERNEL: &str = "fwd_decode";

/// The decode kernel.
pub static FWD_DECODE: KernelSource =
    KernelSource { file: "fwd_decode.cu", entry: "fwd_decode", text: include_str!("../cuda/fwd_decode.cu") };

/// Warps per CTA: the row tiles times the warps sharing each tile's keys.
pub const DECODE_WARPS: u32 = 4;

/// K/V pipeline of one variant: keys per tile and tiles resident in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct DecodeTile {
    /// Keys per K+V tile.
    pub block_n: u32,
    /// Tiles in shared memory; `stages - 1` are in flight while one is consumed.
    pub stages: u32,
}

impl DecodeTile {
    pub const fn new(block_n: u32, stages: u32) -> Self {
        DecodeTile { block_n, stages }
    }
    /// Dynamic shared memory, mirror of `cfg::SMEM_BYTES`: the K+V stages and the Q rows.
    pub fn smem_bytes(&self, head_dim: u32, rows: u32) -> u32 {
        let row = 2 * head_dim;
        self.stages * 2 * self.block_n * row + rows * row
    }
    /// `n64s3`.
    pub fn suffix(&self) -> String {
        format!("n{}s{}", self.block_n, self.stages)
    }
}

/// The pipeline per head dim, and why. The kernel reads each K/V byte once and does little
/// arithmetic per byte, so what sets its speed is how many bytes every SM keeps in flight: with
/// 32 KiB tiles and 3 stages a CTA holds 96 KiB (plus its Q rows) of shared memory, two CTAs fit
/// an H100 SM (228 KiB), and each keeps two tiles in flight while it consumes the third: 128 KiB
/// in flight per SM, above what covers HBM latency at full bandwidth (~3 TB/s x ~1.5 µs over
/// 132 SMs ≈ 34 KiB). At hd64 the same bytes per tile take 128 keys. Other pipelines run as
/// forced tiles ([`DecodeConfig::tile`]) through `decode_check`'s sweep.
pub const DECODE_TILES: [(u32, DecodeTile); 2] = [(64, DecodeTile::new(128, 3)), (128, DecodeTile::new(64, 3))];

/// One compiled decode variant: everything that changes the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct DecodeConfig {
    pub head_dim: u32,
    /// f16 or bf16 (Q, K, V and O).
    pub input: Dtype,
    /// Query rows per CTA: 16, 32 or 64 (one m16 tile per 16 rows; the 4 warps split each
    /// K/V tile's keys among the warps of a row tile).
    pub rows: u32,
    /// `None`: the pipeline of [`DECODE_TILES`]; `Some`: forced (tests, sweeps).
    pub tile: Option<DecodeTile>,
    /// K and V in paged pools read through a block table ([`PagedArgs`]).
    pub paged: bool,
    /// `Some`: the score-modifier variant (launched with a [`ModParams`]).
    pub mods: Option<ModVariant>,
}

impl DecodeConfig {
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];
    /// Row tiles of the family.
    pub const ROWS: [u32; 3] = [16, 32, 64];
    /// The most query rows (`group · q_len`) one CTA packs.
    pub const MAX_ROWS: usize = 64;

    /// Every target mma.sync m16n8k16 and cp.async exist on; nothing needs an arch-specific
    /// feature, so an H100 runs the sm_90 build.
    pub const TARGETS: &'static [Arch] = &[Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90];

    /// The variant for `rows = group · q_len` query rows per (batch, KV head): the smallest row
    /// tile that holds them, or past [`Self::MAX_ROWS`] the largest, in row blocks.
    pub fn new(head_dim: usize, input: Dtype, rows: usize) -> Result<Self> {
        let tile_rows = Self::ROWS.iter().copied().find(|&r| r as usize >= rows).unwrap_or(Self::MAX_ROWS as u32);
        let cfg = DecodeConfig { head_dim: head_dim as u32, input, rows: tile_rows, tile: None, paged: false, mods: None };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Row blocks (CTAs along the packed rows) per (batch, KV head, split) of `s`: 1 for
    /// decode; only the largest row tile takes more rows than it holds.
    pub fn row_blocks(&self, s: &AttentionShape) -> usize {
        (s.group_size() * s.q_len).div_ceil(self.rows as usize).max(1)
    }

    /// The zeroed `u32` counters a launch of `s` with more than one split needs at
    /// [`DecodePtrs::counters`]: one per (batch, KV head, row block). The kernel returns each to
    /// zero, so one buffer serves every launch on one stream.
    pub fn counters_len(&self, s: &AttentionShape) -> usize {
        s.batch * s.kv_heads * self.row_blocks(s)
    }

    /// Warps owning a row tile each (`WARPS_M`).
    pub fn warps_m(&self) -> u32 {
        self.rows / 16
    }

    /// Checks the combination exists; mirrors the kernel's static_asserts so a bad forced tile
    /// fails before NVRTC.
    pub fn validate(&self) -> Result<()> {
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return Err(NativeError::UnsupportedHeadDim { kernel: KERNEL, head_dim: self.head_dim as usize, supported: Self::HEAD_DIMS });
        }
        let bad = |reason: String| Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason });
        if self.input == Dtype::F32 {
            return bad("f32 inputs (mma.sync takes f16 or bf16)".into());
        }
        if !Self::ROWS.contains(&self.rows) {
            return bad(format!("{} rows per CTA (16, 32 or 64)", self.rows));
        }
        let t = self.tile();
        let warps_n = DECODE_WARPS / self.warps_m();
        let chunks = self.head_dim / 8;
        let copy_step = 32 * DECODE_WARPS / chunks;
        let key_slice = t.block_n / warps_n;
        if t.stages < 2 || t.block_n == 0 || !t.block_n.is_multiple_of(warps_n) || !key_slice.is_multiple_of(16)
            || !t.block_n.is_multiple_of(copy_step)
        {
            return bad(format!(
                "tile {t:?} at {} rows (needs >= 2 stages, block_n / {warps_n} a multiple of 16, block_n a multiple of {copy_step})",
                self.rows
            ));
        }
        let smem = t.smem_bytes(self.head_dim, self.rows);
        if smem > 227 * 1024 {
            return bad(format!("tile {t:?} needs {smem} bytes of shared memory"));
        }
        // The epilogue's per-warp O slabs and row statistics live in the drained stages.
        let stages = t.stages * 2 * t.block_n * 2 * self.head_dim;
        let epi = 4 * (DECODE_WARPS * 16 * (self.head_dim + 4) + 2 * DECODE_WARPS * 16 + self.rows);
        if epi > stages {
            return bad(format!("tile {t:?}: the epilogue's {epi} bytes do not fit in the stages"));
        }
        // So do the in-kernel merge's weights: one per (split, row) and a factor per row.
        let merge = 4 * (MAX_SPLITS + 1) * self.rows;
        if merge > stages {
            return bad(format!("tile {t:?}: the merge's {merge} bytes of weights do not fit in the stages"));
        }
        Ok(())
    }

    /// The pipeline: the forced one or the table's.
    pub fn tile(&self) -> DecodeTile {
        self.tile.unwrap_or_else(|| {
            DECODE_TILES.iter().find(|(hd, _)| *hd == self.head_dim).map(|(_, t)| *t).unwrap_or(DECODE_TILES[1].1)
        })
    }

    pub fn smem_bytes(&self) -> u32 {
        self.tile().smem_bytes(self.head_dim, self.rows)
    }

    /// The paged variant of this one.
    pub fn with_paged(self, paged: bool) -> Self {
        DecodeConfig { paged, ..self }
    }

    /// The modifier variant `mods` of this one (`None`: without modifiers).
    pub fn with_mods(self, mods: Option<ModVariant>) -> Self {
        DecodeConfig { mods, ..self }
    }

    /// `fwd_decode_{in}_m{rows}_d{hd}`, e.g. `fwd_decode_f16_m16_d128`
    /// (`fwd_decode_paged_...` for the paged variants); a forced tile adds its suffix (`_n64s4`),
    /// a modifier variant its own (`_mods_softcap_alibi`).
    pub fn name(&self) -> String {
        let forced = self.tile.map(|t| format!("_{}", t.suffix())).unwrap_or_default();
        let paged = if self.paged { "paged_" } else { "" };
        let mods = self.mods.map(|m| m.suffix()).unwrap_or_default();
        format!("fwd_decode_{paged}{}_m{}_d{}{forced}{mods}", self.input.name(), self.rows, self.head_dim)
    }

    /// Every variant without modifiers (the tests and `decode_check` run them;
    /// [`DecodeUnit::all`] adds [`Self::all_mods`] for the report).
    pub fn all() -> Vec<DecodeConfig> {
        let mut v = Vec::new();
        for hd in [64, 128] {
            for input in [Dtype::F16, Dtype::Bf16] {
                for rows in Self::ROWS {
                    for paged in [false, true] {
                        v.push(DecodeConfig { head_dim: hd, input, rows, tile: None, paged, mods: None });
                    }
                }
            }
        }
        v
    }

    /// The modifier variant of every variant of [`Self::all`], with softcap and ALiBi compiled
    /// in: the superset of the other modifier variants' code (those drop the two score
    /// transforms), so what the report and the compile tests check of it holds for them.
    pub fn all_mods() -> Vec<DecodeConfig> {
        Self::all().into_iter().map(|c| c.with_mods(Some(ModVariant { softcap: true, alibi: true }))).collect()
    }

    /// The `-D` defines the kernel reads (see the header of `fwd_decode.cu`).
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let t = self.tile();
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        let mut v = vec![
            d("HEAD_DIM", self.head_dim),
            d("WARPS_M", self.warps_m()),
            d("BLOCK_N", t.block_n),
            d("STAGES", t.stages),
            d("IN_BF16", (self.input == Dtype::Bf16) as u32),
            d("PAGED", self.paged as u32),
        ];
        if let Some(m) = self.mods {
            v.extend(m.defines());
        }
        Ok(v)
    }

    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        check_target(arch)?;
        Ok(CompileRequest { kernel: self.name(), source: &FWD_DECODE, arch, defines: self.defines()? })
    }

    /// SASS opcodes that must appear (and the only matrix opcodes allowed): both GEMMs on the
    /// f32-accumulating HMMA of the input type, K and V through cp.async.
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        let mma = match self.input {
            Dtype::Bf16 => "HMMA.16816.F32.BF16",
            _ => "HMMA.16816.F32",
        };
        vec![mma, "LDGSTS.E.BYPASS.LTC128B.128"]
    }

    /// Targets among [`Self::TARGETS`] that a device of compute capability `cc` runs, best
    /// first.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }
}

fn check_target(arch: Arch) -> Result<()> {
    if DecodeConfig::TARGETS.contains(&arch) {
        Ok(())
    } else {
        Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("target {arch} (built for {:?})", DecodeConfig::TARGETS) })
    }
}

/// One compiled unit of the family: a decode variant or the paged cache's writer (the registry's
/// and the compile report's unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DecodeUnit {
    Attention(DecodeConfig),
    /// The paged cache's writer (`append_kv.cu`), compiled and checked with the family.
    AppendKv(crate::append_kv::AppendKvConfig),
}

impl DecodeUnit {
    /// Every decode variant (the modifier variants too), then the paged cache's writer.
    pub fn all() -> Vec<DecodeUnit> {
        let mut v: Vec<DecodeUnit> = DecodeConfig::all().into_iter().chain(DecodeConfig::all_mods()).map(DecodeUnit::Attention).collect();
        v.push(DecodeUnit::AppendKv(crate::append_kv::AppendKvConfig));
        v
    }
}

impl KernelVariant for DecodeUnit {
    fn name(&self) -> String {
        match self {
            DecodeUnit::Attention(c) => c.name(),
            DecodeUnit::AppendKv(c) => c.name(),
        }
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        match self {
            DecodeUnit::Attention(c) => c.request(arch),
            DecodeUnit::AppendKv(c) => c.request(arch),
        }
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        let v = match self {
            DecodeUnit::Attention(c) => c.expected_instructions(),
            DecodeUnit::AppendKv(c) => c.expected_instructions(),
        };
        v.into_iter().map(String::from).collect()
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        match self {
            DecodeUnit::Attention(c) => c.smem_bytes(),
            DecodeUnit::AppendKv(_) => 0,
        }
    }
}

// ---- the split of the KV sequence ---------------------------------------------------------------

/// Fewest K/V tiles a split gets: below this a CTA spends as long filling its pipeline and
/// merging as streaming keys.
pub const MIN_TILES_PER_SPLIT: u32 = 4;
/// Most splits per (batch, KV head, row block): bounds the merge's loop and the partial buffers.
pub const MAX_SPLITS: u32 = 128;

/// How one decode launch divides each (batch, KV head)'s keys among CTAs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct DecodeSplit {
    /// CTAs along the KV sequence per (batch, KV head); 1 writes O directly, more go through
    /// the merge kernel.
    pub splits: u32,
    /// Keys of every split but the last, a multiple of the tile's `block_n` (so only the last
    /// split has a partial tile).
    pub keys_per_split: u32,
}

/// The split count of a decode launch: a pure function of the shape and the device.
///
/// `pairs = batch · kv_heads` CTAs run without splitting; the device holds `slots = sms ·
/// ctas_per_sm` resident CTAs (`ctas_per_sm` is the kernel's occupancy: shared memory and
/// registers per CTA). The kernel is bound by memory bandwidth, which resident CTAs share
/// evenly, so equal splits that all fit in one wave finish together: `splits = slots / pairs`
/// (rounded down: a second, partial wave would run alone at the end), at least 1, at most
/// [`MAX_SPLITS`], and small enough that every split keeps [`MIN_TILES_PER_SPLIT`] tiles of
/// `block_n` keys. Split lengths are whole tiles, then the count is recomputed from them (it
/// can only shrink). Example, H100 (132 SMs, 2 CTAs per SM), batch 8 x 8 KV heads, block_n 64:
/// 264 / 64 = 4 splits of 2048 keys at kv 8k, 4 of 8192 at kv 32k.
pub fn decode_split(pairs: usize, kv_len: usize, block_n: u32, sms: u32, ctas_per_sm: u32) -> DecodeSplit {
    let block_n = block_n.max(1) as usize;
    let tiles = kv_len.div_ceil(block_n).max(1);
    let slots = (sms.max(1) as usize) * (ctas_per_sm.max(1) as usize);
    let by_device = (slots / pairs.max(1)).max(1);
    let by_length = (tiles / MIN_TILES_PER_SPLIT as usize).max(1);
    let want = by_device.min(by_length).min(MAX_SPLITS as usize);
    let tiles_per_split = tiles.div_ceil(want);
    let splits = tiles.div_ceil(tiles_per_split);
    DecodeSplit { splits: splits as u32, keys_per_split: (tiles_per_split * block_n).min(u32::MAX as usize) as u32 }
}

/// The keys some query position of one (batch, KV head) sees under the modifiers `mp`, with
/// `q_len` positions against `kv_len` keys: `lo..hi` (empty when none sees any), the range the
/// modifier variants split (mirror of `mod_keys` as `fwd_decode.cu` calls it). Its length
/// never decreases with `kv_len` (bottom-right: `min(kv_len, q_len + left)`; top-left:
/// `min(kv_len, q_len + right)`), so at the longest sequence of a paged cache it bounds every
/// sequence's, each measured against its own length.
pub fn mod_key_range(mp: &ModParams, q_len: usize, kv_len: usize) -> std::ops::Range<usize> {
    let (q, kv) = (q_len as i64, kv_len as i64);
    let offset = if mp.top_left != 0 { 0 } else { kv - q };
    let lo = (offset - mp.left as i64).max(0);
    let hi = (offset + q - 1 + mp.right as i64 + 1).min(kv);
    let lo = lo.min(kv) as usize;
    lo..(hi.max(lo as i64) as usize)
}

/// The keys a split of one (batch, KV head) divides: the sequence, or with modifiers the keys
/// some position sees ([`mod_key_range`]).
pub fn split_keys(s: &AttentionShape, mods: Option<&ModParams>) -> usize {
    mods.map_or(s.kv_len, |m| mod_key_range(m, s.q_len, s.kv_len).len())
}

impl DecodeSplit {
    /// f32 elements of the partial O and LSE buffers a launch of `s` with this split writes
    /// (0 for one split, which writes O directly).
    pub fn partial_lens(&self, s: &AttentionShape) -> (usize, usize) {
        if self.splits <= 1 {
            return (0, 0);
        }
        let rows = s.batch * s.kv_heads * (self.splits as usize) * s.group_size() * s.q_len;
        (rows * s.head_dim, rows)
    }
}

// ---- launch arguments -------------------------------------------------------------------------------

/// Mirror of `DecodeParams` in `fwd_decode.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub part_o: u64,
    pub part_lse: u64,
    pub counters: u64,
    pub block_table: u64,
    pub seq_lens: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_seq_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_seq_stride: i64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_seq_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_seq_stride: i64,
    pub q_len: i32,
    pub kv_len: i32,
    pub q_heads: i32,
    pub kv_heads: i32,
    pub group: i32,
    pub rows: i32,
    pub splits: i32,
    pub keys_per_split: i32,
    pub scale_log2: f32,
    pub scale: f32,
    pub causal: i32,
    pub page_shift: i32,
    pub max_pages: i32,
    pub num_pages: i32,
}

/// Device addresses of one decode launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodePtrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    /// f32 `[batch, q_heads, q_len]`, always written.
    pub lse: u64,
    /// f32 partial O, [`DecodeSplit::partial_lens`] elements (unused with one split).
    pub part_o: u64,
    /// f32 partial LSE (unused with one split).
    pub part_lse: u64,
    /// [`DecodeConfig::counters_len`] `u32`s, zero before the launch (unused with one split).
    pub counters: u64,
    /// Paged variants: i32 block table `[batch, max_pages]` (0 otherwise).
    pub block_table: u64,
    /// Paged variants: i32 sequence lengths `[batch]` (0 otherwise).
    pub seq_lens: u64,
}

/// The geometry of a paged cache, for the paged variants: the pools are `[num_pages,
/// page_size, kv_heads, head_dim]`; the shape's `kv_len` is the longest sequence (it sets the
/// split) and its K/V strides are not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedArgs {
    pub page_size: u32,
    pub max_pages: u32,
    pub num_pages: u32,
}

impl PagedArgs {
    /// Page sizes the paged variants take.
    pub const PAGE_SIZES: [u32; 5] = [16, 32, 64, 128, 256];

    /// A supported page size, a non-empty table and pool, pool rows and table columns within
    /// the kernel's i32 arithmetic, the longest sequence within the table.
    pub fn validate(&self, s: &AttentionShape) -> Result<()> {
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        if !Self::PAGE_SIZES.contains(&self.page_size) {
            return bad(format!("page size {} (supported: {:?})", self.page_size, Self::PAGE_SIZES));
        }
        if self.max_pages == 0 || self.num_pages == 0 {
            return bad(format!("{self:?}: an empty block table or pool"));
        }
        let cap = self.max_pages as u64 * self.page_size as u64;
        if cap > i32::MAX as u64 || self.num_pages as u64 * self.page_size as u64 > i32::MAX as u64 {
            return bad(format!("{self:?}: table or pool rows exceed i32"));
        }
        if s.kv_len as u64 > cap {
            return bad(format!("kv_len {} exceeds the {cap} keys a table row holds", s.kv_len));
        }
        Ok(())
    }

    /// Elements each pool holds at `kv_heads` heads of `head_dim`.
    pub fn pool_elems(&self, s: &AttentionShape) -> usize {
        self.num_pages as usize * self.page_size as usize * s.kv_heads * s.head_dim
    }
}

impl DecodeConfig {
    /// Element counts Q, K, V, O and LSE must at least have (`usize::MAX` where a span
    /// overflows: no buffer passes that check).
    pub fn required_lens(&self, s: &AttentionShape) -> [usize; 5] {
        let [q, k, v, o] = s.extents().unwrap_or([usize::MAX; 4]);
        [q, k, v, o, s.lse_len()]
    }

    /// Validates everything that does not need device pointers: the shape's head dims are this
    /// config's, the group's rows fit the row tile, sizes fit the grid and the kernel's i32
    /// fields, a finite positive scale, strides in whole 16-byte pieces.
    pub fn validate_args(&self, s: &AttentionShape) -> Result<()> {
        self.validate()?;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        if s.head_dim != self.head_dim as usize || s.v_head_dim != s.head_dim {
            return bad(format!("head dims {} / {} (V) for a kernel of head dim {}", s.head_dim, s.v_head_dim, self.head_dim));
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 {
            return bad(format!("empty problem: {s:?}"));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", s.q_heads, s.kv_heads));
        }
        let rows = s.group_size().checked_mul(s.q_len).unwrap_or(usize::MAX);
        // Only the largest row tile runs in row blocks: a smaller one was picked for decode.
        if (rows > self.rows as usize && self.rows as usize != Self::MAX_ROWS) || rows > i32::MAX as usize {
            return bad(format!(
                "{rows} query rows per KV head (group {} x q_len {}) exceed the {} rows of {}",
                s.group_size(),
                s.q_len,
                self.rows,
                self.name()
            ));
        }
        if s.kv_len > i32::MAX as usize || s.q_heads > i32::MAX as usize {
            return bad("sequence length or heads exceed i32".into());
        }
        if s.kv_heads > 65535 || s.batch > 65535 {
            return bad(format!("batch {} / KV heads {} exceed the grid limit 65535", s.batch, s.kv_heads));
        }
        if !(s.scale.is_finite() && s.scale > 0.0) {
            // The kernel tracks the row max of raw scores; a non-positive scale would flip it.
            return bad(format!("softmax scale must be finite and > 0, got {}", s.scale));
        }
        for (name, st) in [("q", &s.q), ("k", &s.k), ("v", &s.v), ("o", &s.o)] {
            check_strides(name, st, 8)?;
        }
        Ok(())
    }

    /// Checks a split against the shape and its modifiers (those of the modifier variants):
    /// at least one split, whole tiles, every split holding keys of [`split_keys`], the merge's
    /// bound.
    pub fn validate_split(&self, s: &AttentionShape, mods: Option<&ModParams>, split: DecodeSplit) -> Result<()> {
        let bn = self.tile().block_n;
        let keys = split_keys(s, mods);
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        if split.splits == 0 || split.splits > MAX_SPLITS || split.keys_per_split == 0 || !split.keys_per_split.is_multiple_of(bn) {
            return bad(format!("split {split:?} (1..={MAX_SPLITS} splits of a multiple of {bn} keys)"));
        }
        if split.keys_per_split > i32::MAX as u32 {
            return bad(format!("split {split:?}: keys per split exceed i32"));
        }
        let covered = split.splits as usize * split.keys_per_split as usize;
        let first_of_last = (split.splits as usize - 1) * split.keys_per_split as usize;
        if covered < keys || (split.splits > 1 && first_of_last >= keys) {
            return bad(format!("split {split:?} does not cover the {keys} keys to split (kv_len {}) with non-empty splits", s.kv_len));
        }
        if split.splits as u64 * self.row_blocks(s) as u64 > i32::MAX as u64 {
            return bad(format!("split {split:?} x {} row blocks exceed the grid", self.row_blocks(s)));
        }
        Ok(())
    }
}

impl DecodeParams {
    /// Kernel parameters of `s` with `split` for the device addresses `ptrs` (shape and split
    /// as checked by [`DecodeConfig::validate_args`] and [`DecodeConfig::validate_split`]).
    pub fn new(s: &AttentionShape, split: DecodeSplit, ptrs: &DecodePtrs, paged: Option<PagedArgs>) -> DecodeParams {
        let [q, k, v, o] = [s.q, s.k, s.v, s.o].map(|x| x.to_array().map(|v| v as i64));
        let group = s.group_size();
        DecodeParams {
            q: ptrs.q,
            k: ptrs.k,
            v: ptrs.v,
            o: ptrs.o,
            lse: ptrs.lse,
            part_o: ptrs.part_o,
            part_lse: ptrs.part_lse,
            counters: ptrs.counters,
            block_table: ptrs.block_table,
            seq_lens: ptrs.seq_lens,
            q_batch_stride: q[0],
            q_head_stride: q[1],
            q_seq_stride: q[2],
            k_batch_stride: k[0],
            k_head_stride: k[1],
            k_seq_stride: k[2],
            v_batch_stride: v[0],
            v_head_stride: v[1],
            v_seq_stride: v[2],
            o_batch_stride: o[0],
            o_head_stride: o[1],
            o_seq_stride: o[2],
            q_len: s.q_len as i32,
            kv_len: s.kv_len as i32,
            q_heads: s.q_heads as i32,
            kv_heads: s.kv_heads as i32,
            group: group as i32,
            rows: (group * s.q_len) as i32,
            splits: split.splits as i32,
            keys_per_split: split.keys_per_split as i32,
            scale_log2: s.scale * std::f32::consts::LOG2_E,
            scale: s.scale,
            causal: s.causal as i32,
            page_shift: paged.map_or(0, |g| g.page_size.trailing_zeros() as i32),
            max_pages: paged.map_or(0, |g| g.max_pages as i32),
            num_pages: paged.map_or(0, |g| g.num_pages as i32),
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::DecodeKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::sys::CUdevice_attribute;
    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};

    // SAFETY: #[repr(C)] plain-old-data mirrors of the kernels' by-value parameter structs.
    unsafe impl DeviceRepr for DecodeParams {}

    /// One decode variant, loaded into a CUDA context, with the device numbers its split
    /// function needs.
    #[derive(Debug)]
    pub struct DecodeKernel {
        config: DecodeConfig,
        arch: Arch,
        fwd: CudaFunction,
        compiled: Arc<CompiledKernel>,
        sms: u32,
        ctas_per_sm: u32,
    }

    impl DecodeKernel {
        /// Compiles (or fetches from the global cache) `config` for the context's device and
        /// loads it.
        pub fn load(ctx: &Arc<CudaContext>, config: DecodeConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        /// As [`Self::load`], with an explicit cache.
        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: DecodeConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm80, DecodeConfig::target_for)?;
            let smem = config.smem_bytes();
            let (fwd, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, smem)?;
            let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
            let ctas_per_sm = fwd.occupancy_max_active_blocks_per_multiprocessor(32 * DECODE_WARPS, smem as usize, None)?.max(1);
            Ok(DecodeKernel { config, arch, fwd, compiled, sms, ctas_per_sm })
        }

        pub fn config(&self) -> &DecodeConfig {
            &self.config
        }
        pub fn arch(&self) -> Arch {
            self.arch
        }
        /// The decode kernel's cubin, log and resources.
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }
        /// SMs of the device and resident CTAs of this variant per SM.
        pub fn occupancy(&self) -> (u32, u32) {
            (self.sms, self.ctas_per_sm)
        }

        /// The split [`decode_split`] gives `s` (with the modifiers `mods` of a modifier
        /// variant: its [`split_keys`]) on this device: its (batch, KV head, row block) CTAs
        /// are the pairs to split.
        pub fn split_for(&self, s: &AttentionShape, mods: Option<&ModParams>) -> DecodeSplit {
            let ctas = s.batch * s.kv_heads * self.config.row_blocks(s);
            decode_split(ctas, split_keys(s, mods), self.config.tile().block_n, self.sms, self.ctas_per_sm)
        }

        /// Launches decode on `stream` (one kernel: with several splits the last split of each
        /// row block merges them).
        ///
        /// # Safety
        /// `ptrs.q/k/v/o/lse` must address device memory of at least
        /// [`DecodeConfig::required_lens`] elements (2-byte elements; f32 for the LSE), and with
        /// more than one split `ptrs.part_o` / `ptrs.part_lse` f32 memory of
        /// [`DecodeSplit::partial_lens`] elements and `ptrs.counters` the
        /// [`DecodeConfig::counters_len`] zeroed `u32`s, not used by another launch in flight,
        /// all valid until the kernel finishes on `stream`. `mods` is required by a modifier variant (built by [`ModParams::new`] for
        /// this config and shape) and refused by the others.
        pub unsafe fn launch_raw(
            &self,
            stream: &Arc<CudaStream>,
            s: &AttentionShape,
            mods: Option<&ModParams>,
            split: DecodeSplit,
            ptrs: &DecodePtrs,
        ) -> Result<()> {
            if self.config.paged {
                return Err(NativeError::InvalidArgs(format!("{} reads a paged cache: launch it with launch_paged_raw", self.config.name())));
            }
            // SAFETY: the caller's contract.
            unsafe { self.launch_any(stream, s, mods, split, ptrs, None) }
        }

        /// Launches a paged variant on `stream`: K and V are the pools of `paged`, read through
        /// the i32 block table `[batch, max_pages]` and the i32 lengths `[batch]` at
        /// `ptrs.block_table` / `ptrs.seq_lens`; `s.kv_len` is the longest sequence.
        ///
        /// # Safety
        /// As [`Self::launch_raw`], with K and V of [`PagedArgs::pool_elems`] elements, the
        /// table and the lengths valid device memory, every length at most `s.kv_len`, and every
        /// table entry a sequence's length reaches a page of the pool (the kernel zero-fills
        /// rows of entries outside the pool, but reads the entries themselves). `mods` as for
        /// [`Self::launch_raw`], built for `s` (its `kv_len` the longest sequence; the kernel
        /// measures each sequence's positions against its own length).
        pub unsafe fn launch_paged_raw(
            &self,
            stream: &Arc<CudaStream>,
            s: &AttentionShape,
            mods: Option<&ModParams>,
            paged: PagedArgs,
            split: DecodeSplit,
            ptrs: &DecodePtrs,
        ) -> Result<()> {
            if !self.config.paged {
                return Err(NativeError::InvalidArgs(format!("{} reads strided K/V: launch it with launch_raw", self.config.name())));
            }
            paged.validate(s)?;
            for (name, p) in [("block_table", ptrs.block_table), ("seq_lens", ptrs.seq_lens)] {
                if p == 0 || p % 4 != 0 {
                    return Err(NativeError::InvalidArgs(format!("{name} pointer {p:#x} is null or not 4-byte aligned")));
                }
            }
            // SAFETY: the caller's contract.
            unsafe { self.launch_any(stream, s, mods, split, ptrs, Some(paged)) }
        }

        unsafe fn launch_any(
            &self,
            stream: &Arc<CudaStream>,
            s: &AttentionShape,
            mods: Option<&ModParams>,
            split: DecodeSplit,
            ptrs: &DecodePtrs,
            paged: Option<PagedArgs>,
        ) -> Result<()> {
            self.config.validate_args(s)?;
            if mods.is_some() != self.config.mods.is_some() {
                return Err(NativeError::InvalidArgs(format!(
                    "{}: score-modifier parameters {} for this variant",
                    self.config.name(),
                    if mods.is_some() { "given" } else { "missing" }
                )));
            }
            self.config.validate_split(s, mods, split)?;
            let named = [("q", ptrs.q), ("k", ptrs.k), ("v", ptrs.v), ("o", ptrs.o), ("lse", ptrs.lse), ("part_o", ptrs.part_o), ("part_lse", ptrs.part_lse)];
            let needed = if split.splits > 1 { 7 } else { 5 };
            for (name, p) in &named[..needed] {
                if *p == 0 || p % 16 != 0 {
                    return Err(NativeError::InvalidArgs(format!("{name} pointer {p:#x} is null or not 16-byte aligned")));
                }
            }
            if split.splits > 1 && (ptrs.counters == 0 || ptrs.counters % 4 != 0) {
                return Err(NativeError::InvalidArgs(format!("counters pointer {:#x} is null or not 4-byte aligned", ptrs.counters)));
            }
            let params = DecodeParams::new(s, split, ptrs, paged);
            let blocks = split.splits as usize * self.config.row_blocks(s);
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, s.kv_heads as u32, s.batch as u32),
                block_dim: (32 * DECODE_WARPS, 1, 1),
                shared_mem_bytes: self.config.smem_bytes(),
            };
            let mut b = stream.launch_builder(&self.fwd);
            b.arg(&params);
            if let Some(m) = mods {
                b.arg(m);
            }
            // SAFETY: the parameter structs match the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::Layout;

    #[test]
    fn variants_pick_the_smallest_row_tile_and_row_blocks_past_it() {
        let c = DecodeConfig::new(128, Dtype::F16, 4).unwrap();
        assert_eq!((c.rows, c.warps_m()), (16, 1));
        assert_eq!(c.name(), "fwd_decode_f16_m16_d128");
        assert_eq!(DecodeConfig::new(128, Dtype::F16, 17).unwrap().rows, 32);
        assert_eq!(DecodeConfig::new(64, Dtype::Bf16, 64).unwrap().rows, 64);
        // Past 64 rows: the 64-row tile in row blocks (65 rows: 2 blocks; 4 x 300: 19).
        let wide = DecodeConfig::new(128, Dtype::F16, 65).unwrap();
        assert_eq!(wide.rows, 64);
        let s = AttentionShape::contiguous(Layout::Bhsd, 3, 8, 2, 300, 500, 128, true);
        assert_eq!((wide.row_blocks(&s), wide.counters_len(&s)), (19, 3 * 2 * 19));
        wide.validate_args(&s).unwrap();
        let one = AttentionShape::contiguous(Layout::Bhsd, 3, 8, 2, 1, 500, 128, true);
        assert_eq!((c.row_blocks(&one), c.counters_len(&one)), (1, 6));
        assert!(matches!(DecodeConfig::new(96, Dtype::F16, 4), Err(NativeError::UnsupportedHeadDim { head_dim: 96, .. })));
        assert!(matches!(DecodeConfig::new(128, Dtype::F32, 4), Err(NativeError::UnsupportedConfig { .. })));
    }

    #[test]
    fn forced_tiles_validate_like_the_kernel() {
        let mut c = DecodeConfig::new(128, Dtype::F16, 16).unwrap();
        // Table: 64 keys, 3 stages at hd128: 96 KiB of stages plus 16 Q rows.
        assert_eq!(c.smem_bytes(), 3 * 2 * 64 * 256 + 16 * 256);
        c.tile = Some(DecodeTile::new(64, 4));
        c.validate().unwrap();
        assert!(c.name().ends_with("_d128_n64s4"), "{}", c.name());
        // 4 warps over 32 keys: 8 keys a warp, not a k16 step.
        c.tile = Some(DecodeTile::new(32, 6));
        assert!(c.validate().is_err());
        // At 64 rows one warp takes every key of a tile: 32 keys are fine.
        let mut wide = DecodeConfig::new(128, Dtype::F16, 64).unwrap();
        wide.tile = Some(DecodeTile::new(32, 6));
        wide.validate().unwrap();
        c.tile = Some(DecodeTile::new(64, 1));
        assert!(c.validate().is_err());
        c.tile = Some(DecodeTile::new(256, 4));
        assert!(matches!(&c.validate(), Err(NativeError::UnsupportedConfig { reason, .. }) if reason.contains("shared memory")));
        let d = DecodeConfig::new(64, Dtype::Bf16, 40).unwrap().defines().unwrap();
        assert!(d.contains(&("WARPS_M".into(), "4".into())) && d.contains(&("IN_BF16".into(), "1".into())));
        assert!(d.contains(&("BLOCK_N".into(), "128".into())));
    }

    #[test]
    fn names_are_unique_and_targets_are_mma_sync_ones() {
        let mut names: Vec<String> = DecodeUnit::all().iter().map(|u| u.name()).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
        assert_eq!(DecodeConfig::target_for((9, 0)), Some(Arch::Sm90));
        assert_eq!(DecodeConfig::target_for((8, 9)), Some(Arch::Sm89));
        assert_eq!(DecodeConfig::target_for((7, 5)), None);
        assert!(DecodeConfig::new(128, Dtype::F16, 4).unwrap().request(Arch::Sm90a).is_err());
    }

    #[test]
    fn params_layout_matches_the_kernel_structs() {
        // 10 pointers + 12 strides (8 bytes) + 14 four-byte fields.
        assert_eq!(std::mem::size_of::<DecodeParams>(), 22 * 8 + 14 * 4);
        assert_eq!(std::mem::offset_of!(DecodeParams, counters), 7 * 8);
    }

    /// The split function on the H100 (132 SMs, 2 CTAs per SM) at the decode shapes of the
    /// benchmark, and its limits.
    #[test]
    fn split_fills_one_wave_of_the_device() {
        // batch 8 x 8 KV heads: 264 slots / 64 pairs = 4 splits.
        assert_eq!(decode_split(64, 8192, 64, 132, 2), DecodeSplit { splits: 4, keys_per_split: 2048 });
        assert_eq!(decode_split(64, 32768, 64, 132, 2), DecodeSplit { splits: 4, keys_per_split: 8192 });
        // One CTA per SM: 2 splits.
        assert_eq!(decode_split(64, 32768, 64, 132, 1), DecodeSplit { splits: 2, keys_per_split: 16384 });
        // As many pairs as slots or more: no split.
        assert_eq!(decode_split(264, 32768, 64, 132, 2).splits, 1);
        assert_eq!(decode_split(1000, 32768, 64, 132, 2).splits, 1);
        // A short sequence keeps MIN_TILES_PER_SPLIT tiles per split.
        assert_eq!(decode_split(1, 1024, 64, 132, 2), DecodeSplit { splits: 4, keys_per_split: 256 });
        assert_eq!(decode_split(1, 100, 64, 132, 2), DecodeSplit { splits: 1, keys_per_split: 128 });
        // One pair, a long sequence: MAX_SPLITS.
        assert_eq!(decode_split(1, 1 << 20, 64, 132, 2).splits, MAX_SPLITS);
        // Ragged: whole tiles per split (17 tiles over 4 splits: 5 a split, 2 in the last), the
        // count recomputed from them.
        assert_eq!(decode_split(66, 64 * 17, 64, 132, 2), DecodeSplit { splits: 4, keys_per_split: 5 * 64 });
        // 25 tiles over 6 wanted splits: 5 tiles a split, so 5 splits.
        assert_eq!(decode_split(44, 64 * 24 + 5, 64, 132, 2), DecodeSplit { splits: 5, keys_per_split: 5 * 64 });
        // Empty sequence: one split, nothing to merge.
        assert_eq!(decode_split(8, 0, 64, 132, 2).splits, 1);
    }

    #[test]
    fn every_split_covers_the_sequence_with_whole_tiles() {
        let cfg = DecodeConfig::new(128, Dtype::F16, 16).unwrap();
        let bn = cfg.tile().block_n;
        for pairs in [1usize, 3, 8, 64, 200, 300] {
            for kv in [1usize, 63, 64, 65, 255, 1000, 4097, 8192, 32768, 100_000] {
                for (sms, occ) in [(132, 2), (108, 1), (8, 3)] {
                    let sp = decode_split(pairs, kv, bn, sms, occ);
                    let s = AttentionShape::contiguous(Layout::Bhsd, pairs, 4, 1, 1, kv, 128, false);
                    cfg.validate_split(&s, None, sp).unwrap_or_else(|e| panic!("pairs {pairs} kv {kv}: {sp:?}: {e}"));
                    assert!(sp.splits as usize * pairs <= (sms as usize * occ as usize).max(pairs), "more than one wave: {sp:?}");
                    if sp.splits > 1 {
                        assert!(sp.keys_per_split >= MIN_TILES_PER_SPLIT * bn, "{sp:?}");
                    }
                }
            }
        }
        let s = AttentionShape::contiguous(Layout::Bhsd, 1, 4, 1, 1, 1000, 128, false);
        // Not whole tiles, not covering, an empty last split.
        for bad in [DecodeSplit { splits: 2, keys_per_split: 500 }, DecodeSplit { splits: 1, keys_per_split: 64 }, DecodeSplit { splits: 3, keys_per_split: 512 }, DecodeSplit { splits: 0, keys_per_split: 64 }] {
            assert!(cfg.validate_split(&s, None, bad).is_err(), "{bad:?}");
        }
    }

    /// `mod_key_range` is the union of the positions' bands, key by key, and never shrinks as
    /// the sequence grows (what lets the longest sequence of a paged cache set the split).
    #[test]
    fn mod_key_range_is_the_union_of_the_bands() {
        use crate::mods::{ModValues, MOD_UNBOUNDED};
        let ext = |x: i64| (x >= 0).then_some(x as u64);
        for q_len in [1usize, 3, 7] {
            for top_left in [false, true] {
                for (left, right) in [(-1i64, -1i64), (0, 0), (2, -1), (-1, 3), (5, 1), (40, 0), (0, 9)] {
                    let mut prev = 0;
                    for kv_len in 0..60usize {
                        let s = AttentionShape::contiguous(Layout::Bhsd, 1, 2, 1, q_len, kv_len, 64, false);
                        let v = ModValues { top_left, left: ext(left), right: ext(right), ..Default::default() };
                        let mp = ModParams::new("t", Some(ModVariant::default()), &s, &v).unwrap();
                        assert!(mp.left <= MOD_UNBOUNDED && mp.right <= MOD_UNBOUNDED);
                        let off = if top_left { 0 } else { kv_len as i64 - q_len as i64 };
                        let seen: Vec<usize> = (0..kv_len)
                            .filter(|&j| {
                                (0..q_len as i64).any(|i| {
                                    let d = i + off - j as i64;
                                    (left < 0 || d <= left) && (right < 0 || -d <= right)
                                })
                            })
                            .collect();
                        let r = mod_key_range(&mp, q_len, kv_len);
                        let want = seen.first().map_or(0, |&a| seen.last().unwrap() + 1 - a);
                        assert_eq!(r.len(), want, "q {q_len} kv {kv_len} tl {top_left} ({left}, {right}): {r:?} vs {seen:?}");
                        if let Some(&a) = seen.first() {
                            assert_eq!(r.start, a);
                        }
                        assert!(r.len() >= prev, "the span shrank at kv {kv_len}");
                        prev = r.len();
                    }
                }
            }
        }
    }

    /// With modifiers the split divides the keys some position sees: a 100-key window at kv
    /// 50000 is one split of two tiles' worth, the whole sequence many; validation follows.
    #[test]
    fn modifier_splits_cover_only_the_visible_keys() {
        use crate::mods::ModValues;
        let cfg = DecodeConfig::new(128, Dtype::F16, 16).unwrap().with_mods(Some(ModVariant::default()));
        assert_eq!(cfg.name(), "fwd_decode_f16_m16_d128_mods");
        assert!(cfg.defines().unwrap().contains(&("MODS".into(), "1".into())));
        let s = AttentionShape::contiguous(Layout::Bhsd, 1, 8, 2, 2, 50_000, 128, true);
        let v = ModValues { left: Some(100), ..Default::default() };
        let mp = ModParams::new(&cfg.name(), cfg.mods, &s, &v).unwrap();
        // Positions 49998 and 49999 see 49898 ..= 49999.
        assert_eq!(mod_key_range(&mp, 2, 50_000), 49_898..50_000);
        assert_eq!(split_keys(&s, Some(&mp)), 102);
        let bn = cfg.tile().block_n;
        let sp = decode_split(2, split_keys(&s, Some(&mp)), bn, 132, 2);
        assert_eq!(sp, DecodeSplit { splits: 1, keys_per_split: 2 * bn });
        cfg.validate_split(&s, Some(&mp), sp).unwrap();
        // A split of the whole sequence has splits with no visible key: refused.
        let whole = decode_split(2, s.kv_len, bn, 132, 2);
        assert!(whole.splits > 1);
        assert!(cfg.validate_split(&s, Some(&mp), whole).is_err());
        // Without the window every key is visible (causal, bottom-right).
        let open = ModParams::new(&cfg.name(), cfg.mods, &s, &ModValues::default()).unwrap();
        assert_eq!(split_keys(&s, Some(&open)), 50_000);
        cfg.validate_split(&s, Some(&open), whole).unwrap();
        // Every modifier variant is named apart from its plain twin.
        for m in DecodeConfig::all_mods() {
            assert!(m.name().ends_with("_mods_softcap_alibi"), "{}", m.name());
            assert_ne!(m.name(), m.with_mods(None).name());
        }
    }

    #[test]
    fn args_validation() {
        let cfg = DecodeConfig::new(128, Dtype::F16, 16).unwrap();
        let mut a = AttentionShape::contiguous(Layout::Bhsd, 8, 32, 8, 1, 8192, 128, false);
        cfg.validate_args(&a).unwrap();
        let sp = DecodeSplit { splits: 4, keys_per_split: 2048 };
        assert_eq!(sp.partial_lens(&a), (8 * 8 * 4 * 4 * 128, 8 * 8 * 4 * 4));
        assert_eq!(DecodeSplit { splits: 1, keys_per_split: 8192 }.partial_lens(&a), (0, 0));
        let p = DecodeParams::new(&a, sp, &DecodePtrs { q: 16, ..Default::default() }, None);
        assert_eq!((p.group, p.rows, p.splits, p.keys_per_split, p.k_head_stride), (4, 4, 4, 2048, 8192 * 128));
        // 5 positions x group 4 = 20 rows do not fit 16 (only the 64-row tile takes row blocks).
        a.q_len = 5;
        assert!(matches!(cfg.validate_args(&a), Err(NativeError::InvalidArgs(m)) if m.contains("20 query rows")));
        assert!(DecodeConfig::new(128, Dtype::F16, 20).unwrap().validate_args(&a).is_ok());
        a.q_len = 4;
        cfg.validate_args(&a).unwrap();
        a.kv_heads = 3;
        assert!(cfg.validate_args(&a).is_err());
        a.kv_heads = 8;
        a.scale = 0.0;
        assert!(cfg.validate_args(&a).is_err());
        a.scale = 0.1;
        a.k.seq = 132;
        assert!(cfg.validate_args(&a).is_err());
        let other = AttentionShape::contiguous(Layout::Bshd, 1, 4, 1, 1, 10, 64, true);
        assert!(cfg.validate_args(&other).is_err());
    }
}
