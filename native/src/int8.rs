//! The INT8 forward family (`cuda/fwd_int8.cu`): SageAttention-style attention with Q and K as
//! int8 codes plus f32 scales, Q·Kᵀ on `mma.sync.m16n8k32.s8` (exact s32 sums), f32 online
//! softmax in log2 units, and P·V with f16 P and f16 V on `mma.sync.m16n8k16`. Runs on every
//! target from sm_80 up; s8 mma.sync runs at twice the f16 rate on sm_80/sm_90.
//!
//! The facade quantizes (its prepass writes the codes and the scales laid out as
//! `quattn::codec::int8::Int8ScaleLayout` for [`Int8Config::blocking`]), folds
//! `softmax_scale · log2 e` into the Q scales, and launches through [`Int8Kernel::launch_raw`].
//! The kernel computes exactly the order of operations of `quattn::emulation` for
//! `Precision::Int8Qk` (see the header of `fwd_int8.cu` for the one rounding it skips).

use crate::arch::Arch;
use crate::cache::{CompileRequest, FWD_INT8};
use crate::error::{NativeError, Result};
use crate::hmma::{check_strides, HmmaTile};
use quattn_core::{AttentionShape, Int8Blocking, Int8Granularity, PvAccum, INT8_MMA_M};

const KERNEL: &str = "fwd_int8";

/// Tile shape of one head dim: the HMMA tile's fields ([`HmmaTile`]: warps, keys per KV
/// tile, rows per warp, Q in registers or shared memory) plus how Q·Kᵀ walks the warp's m tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8Tile {
    pub warps: u32,
    /// Keys per KV tile, also keys per K scale.
    pub block_n: u32,
    /// 16 or 32 query rows per warp; BLOCK_M = rows_per_warp * warps.
    pub rows_per_warp: u32,
    /// Q's int8 MMA fragments held in registers (`true`) or re-read from shared memory.
    pub q_in_regs: bool,
    /// Scores and softmax one m16 tile at a time (`true`): half the score registers live, each
    /// K fragment read once per m tile instead of once per warp. P·V is unchanged.
    pub qk_split: bool,
}

impl Int8Tile {
    /// `warps` x `rows_per_warp` rows, `block_n` keys, Q in registers, no split.
    pub const fn new(warps: u32, block_n: u32, rows_per_warp: u32) -> Self {
        Int8Tile { warps, block_n, rows_per_warp, q_in_regs: true, qk_split: false }
    }
    pub fn block_m(&self) -> u32 {
        self.rows_per_warp * self.warps
    }
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }
    /// Name suffix of a forced tile: the HMMA suffix (`w4n64r32`, `qs` when Q stays in
    /// shared memory) and a trailing `p` for Q·Kᵀ per m tile (split).
    pub fn suffix(&self) -> String {
        let h = HmmaTile { warps: self.warps, block_n: self.block_n, rows_per_warp: self.rows_per_warp, q_in_regs: self.q_in_regs };
        format!("{}{}", h.suffix(), if self.qk_split { "p" } else { "" })
    }
}

/// One row of the tile table: the tiles of one head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8TileRow {
    pub head_dim: u32,
    /// P·V accumulating in f32.
    pub f32_pv: Int8Tile,
    /// P·V accumulating in f16 per KV tile (its f16 partial sums sit next to the f32 O).
    pub f16_pv: Int8Tile,
    /// The f32 P·V tile on sm_100a, where `f32_pv` does not fit in 255 registers. Same scale
    /// blocking as `f32_pv` (rows per CTA, keys per tile; per-warp scales are read from the
    /// `f32_pv` layout, `Q_LAYOUT_WARPS`), so the facade's prepass does not depend on the arch.
    pub compact: Int8Tile,
}

/// Tile configuration per head dim, and why. Measured on the H100 with
/// `int8_check`'s `QUATTN_SWEEP_INT8` (PerBlock, f32 P·V, batch·seq = 16k, heads = 2048/hd,
/// TFLOP/s non-causal at seq 4k / 8k / 16k):
///
/// | tile (warps x rows/warp, BLOCK_N, Q)        | hd64              | hd128                   |
/// |---------------------------------------------|-------------------|-------------------------|
/// | 4 x 32, 64, registers                       | **298 / 306 / 314** | spills (see below)    |
/// | 4 x 32, 128, shared memory (spills, below)  | 341 / 348 / 358   | -                       |
/// | 8 x 16, 64, registers                       | -                 | 267 / 274 / 279         |
/// | 8 x 16, 128, registers                      | -                 | 319 / 326 / 333         |
/// | 4 x 32, 64, shared memory (spills 24 B)     | -                 | 375 / 381 / 392         |
/// | 4 x 32, 64, shared memory, split (40 B)     | -                 | 387 / 393 / 401         |
/// | 4 x 32, 64, shared memory, no spill         | -                 | (the table tile)        |
///
/// The 32-row hd128 tiles are the fastest, as for HMMA (each K/V fragment feeds 4 MMAs instead
/// of 2), but the report refuses spills, and ptxas fills freed registers with hoisted addresses
/// (Q in registers or shared memory, 48 keys, scores one m tile at a time (`qk_split`): 20-100
/// spilled bytes on sm_90). The kernel keeps those out of the KV loop (lane offsets, copy rows and Q scales from an opaque thread index,
/// no predicates on whole-tile prefetches, scores accumulated from 0 instead of the I2F bias,
/// conditional O rescale), and **4 x 32, 64 keys, Q in shared memory** (`128x4x64x32s`)
/// compiles with 255 registers and no spill on sm_80, sm_86, sm_89, sm_90 and sm_120a in all
/// three granularities, f32 P·V: it is the hd128 f32 tile (the 24-byte-spill build of the same
/// shape ran 375 / 381 / 392).
/// sm_100a spills it (4-40 B; split and Q-in-registers forms 80-200 B), so sm_100a
/// builds the row's `compact` tile, 8 x 16 x 64 keys (197 registers), which has the same scale
/// blocking (per-warp scales shared by warp pairs). The split form (`...32sp`) spills on sm_90
/// and f16 per-tile P·V spills 16-100 B in every 32-row form, so f16_pv keeps 8 x 16 x 64.
/// All of the measured tiles are ≤ 1.15x torch's FlashAttention-2
/// (353 / 357 TFLOP/s at 8k / 16k): mma.sync runs s8 at twice the f16 rate, but P·V stays f16
/// and the softmax does not shrink (BENCHMARKS.md).
pub const INT8_TILES: [Int8TileRow; 2] = [
    // 128 keys with Q in shared memory (341-358 measured) spills with per-thread scales on
    // sm_80..sm_90 (20-40 B) and on sm_100a in every granularity: hd64 keeps 64 keys.
    Int8TileRow {
        head_dim: 64,
        f32_pv: Int8Tile::new(4, 64, 32),
        f16_pv: Int8Tile::new(4, 64, 32),
        compact: Int8Tile::new(4, 64, 32),
    },
    Int8TileRow {
        head_dim: 128,
        f32_pv: Int8Tile { q_in_regs: false, ..Int8Tile::new(4, 64, 32) },
        f16_pv: Int8Tile::new(8, 64, 16),
        compact: Int8Tile::new(8, 64, 16),
    },
];

/// One compiled variant of the family: everything that changes the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Int8Config {
    pub head_dim: u32,
    pub granularity: Int8Granularity,
    pub pv: PvAccum,
    /// `None`: the tile from [`INT8_TILES`]; `Some`: forced (tests, tuning sweeps).
    pub tile: Option<Int8Tile>,
}

impl Int8Config {
    /// Head dims with a tile entry; others are refused so the facade can fall back.
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];

    /// Targets the family is built and checked for: mma.sync m16n8k32 s8 and m16n8k16 f16 exist
    /// on all of them and nothing needs an arch-specific (`a`) feature, so an H100 runs the
    /// sm_90 build. sm_100a and sm_120a get native builds as well; on sm_100a f32 P·V takes the
    /// table's `compact` tile ([`Self::tile_for`]), the only one that does not spill there.
    pub const TARGETS: &'static [Arch] =
        &[Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90, Arch::Sm100a, Arch::Sm120a];

    /// Validated constructor.
    pub fn new(head_dim: usize, granularity: Int8Granularity, pv: PvAccum) -> Result<Self> {
        let cfg = Int8Config { head_dim: head_dim as u32, granularity, pv, tile: None };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Every variant the report and tests compile: granularity x P·V mode x head dim.
    pub fn all() -> Vec<Int8Config> {
        let mut v = Vec::new();
        for head_dim in [64, 128] {
            for granularity in Int8Granularity::ALL {
                for pv in [PvAccum::F32, PvAccum::F16PerTile] {
                    v.push(Int8Config { head_dim, granularity, pv, tile: None });
                }
            }
        }
        v
    }

    fn tile_opt(&self) -> Option<Int8Tile> {
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return None;
        }
        if self.tile.is_some() {
            return self.tile;
        }
        let row = INT8_TILES.iter().find(|r| r.head_dim == self.head_dim)?;
        Some(match self.pv {
            PvAccum::F32 => row.f32_pv,
            PvAccum::F16PerTile => row.f16_pv,
        })
    }

    /// The tile built for `arch`: a forced tile everywhere, else the table's, except f32 P·V on
    /// sm_100a, which takes the row's `compact` tile (same scale blocking as [`Self::tile`]).
    pub fn tile_for(&self, arch: Arch) -> Result<Int8Tile> {
        let t = self.tile()?;
        if self.tile.is_some() || self.pv != PvAccum::F32 || arch != Arch::Sm100a {
            return Ok(t);
        }
        Ok(INT8_TILES.iter().find(|r| r.head_dim == self.head_dim).map_or(t, |row| row.compact))
    }

    /// The tile shape ([`INT8_TILES`] or the forced one); it defines the scale blocking.
    pub fn tile(&self) -> Result<Int8Tile> {
        self.tile_opt().ok_or(NativeError::UnsupportedHeadDim {
            kernel: KERNEL,
            head_dim: self.head_dim as usize,
            supported: Self::HEAD_DIMS,
        })
    }

    /// Dynamic shared memory, mirror of `cfg::SMEM_BYTES`: two stages of an int8 K and an f16
    /// V tile, plus a resident int8 Q tile when Q is not held in registers.
    pub fn smem_bytes(&self) -> Result<u32> {
        Ok(Self::tile_smem_bytes(self.tile()?, self.head_dim))
    }

    /// [`Self::smem_bytes`] of the tile built for `arch` ([`Self::tile_for`]).
    pub fn smem_bytes_for(&self, arch: Arch) -> Result<u32> {
        Ok(Self::tile_smem_bytes(self.tile_for(arch)?, self.head_dim))
    }

    fn tile_smem_bytes(t: Int8Tile, d: u32) -> u32 {
        2 * t.block_n * 3 * d + if t.q_in_regs { 0 } else { t.block_m() * d }
    }

    /// The Q/K scale layout: block_q = the CTA's rows, block_k = keys per KV tile (one K scale
    /// each), warps = the CTA's warps, except per-thread scales: the 4 lanes of a quad share
    /// rows `g` and `g + 8` of a 16-row m tile, so their layout has one 16-row "warp" per m tile
    /// (`block_q / INT8_MMA_M`) whatever the CTA's warps.
    pub fn blocking(&self) -> Result<Int8Blocking> {
        let t = self.tile()?;
        let warps = match self.granularity {
            Int8Granularity::PerThread => t.block_m() / INT8_MMA_M as u32,
            _ => t.warps,
        };
        Ok(Int8Blocking { block_q: t.block_m() as usize, block_k: t.block_n as usize, warps: warps as usize })
    }

    /// Checks the combination exists and mirrors the kernel's static_asserts for forced tiles.
    pub fn validate(&self) -> Result<()> {
        let t = self.tile()?;
        if self.tile.is_some() {
            let bad = |reason: String| Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason });
            let (d, threads) = (self.head_dim, t.threads());
            // Per copy: a thread moves one 16-byte chunk of STEP = threads / chunks rows, and
            // STEP must be a multiple of 8 rows dividing the tile.
            let even = |rows: u32, row_bytes: u32| {
                let chunks = row_bytes / 16;
                threads % chunks == 0 && {
                    let step = threads / chunks;
                    step % 8 == 0 && rows % step == 0
                }
            };
            let stage = t.block_n * 3 * d;
            if t.warps == 0
                || t.block_n < 16
                || t.block_n % 16 != 0
                || !(t.rows_per_warp == 16 || t.rows_per_warp == 32)
                || (t.q_in_regs && t.block_m() * d > stage)
                || t.block_m() * 2 * d > 2 * stage
                || !even(t.block_m(), d)
                || !even(t.block_n, d)
                || !even(t.block_n, 2 * d)
            {
                return bad(format!(
                    "tile {t:?} (needs BLOCK_N % 16 == 0, 16 or 32 rows per warp, Q (int8) within one \
                     K+V stage when in registers, O (f16) within both stages, even copies)"
                ));
            }
            let smem = self.smem_bytes()?;
            if smem > 227 * 1024 {
                return bad(format!("tile {t:?} needs {smem} bytes of shared memory"));
            }
        }
        Ok(())
    }

    /// `fwd_int8_{granularity}_{pv}_d{hd}[_{tile}]`, e.g. `fwd_int8_block_f32_d128`.
    pub fn name(&self) -> String {
        let pv = match self.pv {
            PvAccum::F32 => "f32",
            PvAccum::F16PerTile => "f16",
        };
        let forced = self.tile.map(|t| format!("_{}", t.suffix())).unwrap_or_default();
        format!("fwd_int8_{}_{pv}_d{}{forced}", self.granularity.tag(), self.head_dim)
    }

    /// The `-D` defines the kernel reads (see the header of `fwd_int8.cu`), for the table tile.
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.defines_for_tile(self.tile()?)
    }

    /// The `-D` defines of the tile built for `arch` ([`Self::tile_for`]).
    pub fn defines_for(&self, arch: Arch) -> Result<Vec<(String, String)>> {
        self.defines_for_tile(self.tile_for(arch)?)
    }

    fn defines_for_tile(&self, t: Int8Tile) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let layout_warps = self.tile()?.warps;
        let gran = match self.granularity {
            Int8Granularity::PerBlock => 0,
            Int8Granularity::PerWarp => 1,
            Int8Granularity::PerThread => 2,
        };
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        Ok(vec![
            d("HEAD_DIM", self.head_dim),
            d("WARPS", t.warps),
            d("BLOCK_N", t.block_n),
            d("ROWS_PER_WARP", t.rows_per_warp),
            d("Q_IN_REGS", t.q_in_regs as u32),
            d("Q_GRAN", gran),
            d("QK_SPLIT", t.qk_split as u32),
            d("PV_ACC", (self.pv == PvAccum::F16PerTile) as u32),
            d("Q_LAYOUT_WARPS", layout_warps),
        ])
    }

    /// The compile request for `arch`.
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Ok(CompileRequest { kernel: self.name(), source: &FWD_INT8, arch, defines: self.defines_for(arch)? })
    }

    /// SASS opcodes that must appear (and only these MMA forms): IMMA for Q·Kᵀ, the P·V HMMA of
    /// the accumulation mode.
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        let pv = match self.pv {
            PvAccum::F32 => "HMMA.16816.F32",
            PvAccum::F16PerTile => "HMMA.16816.F16",
        };
        vec!["IMMA.16832.S8.S8", pv]
    }

    /// Targets among [`Self::TARGETS`] that a device of compute capability `cc` runs, best
    /// first.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }
}

/// Launch arguments of the INT8 families.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Int8Args {
    /// Sizes, strides and causal mask. The int8 Q and K codes have the strides of the tensors
    /// they were quantized from (one byte per element); V and O are f16. `scale` is not read
    /// by the attention kernels: the prepass folds it into the Q scales (`q_scale = amax / 127 ·
    /// softmax_scale · log2 e`), so logits come out in log2 units. The LSE is always written.
    pub shape: AttentionShape,
    /// Whether an `lse_shift` buffer (`[batch, q_heads, q_len]` f32) is passed.
    pub lse_shift: bool,
}

/// Device addresses of one launch; `lse_shift` 0 when [`Int8Args::lse_shift`] is false.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int8Ptrs {
    /// int8 Q codes.
    pub q: u64,
    /// int8 K codes.
    pub k: u64,
    /// f16 V.
    pub v: u64,
    /// f16 O (written).
    pub o: u64,
    /// f32 LSE `[batch, q_heads, q_len]` (written).
    pub lse: u64,
    /// f32 Q scales (`Int8ScaleLayout` for [`Int8Config::blocking`] and the granularity).
    pub q_scale: u64,
    /// f32 K scales `[batch, kv_heads, ceil(kv_len / block_k)]`.
    pub k_scale: u64,
    /// f32 `[batch, q_heads, q_len]` added to the LSE, or 0.
    pub lse_shift: u64,
}

/// Element counts every buffer of a launch must at least have ([`Int8Args::required_lens`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8Lens {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
    pub lse: usize,
    pub q_scale: usize,
    pub k_scale: usize,
    /// 0 without an LSE shift.
    pub lse_shift: usize,
}

/// Mirror of `Int8FwdParams` in `fwd_int8.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Int8Params {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub q_scale: u64,
    pub k_scale: u64,
    pub lse_shift: u64,
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
    pub kv_group: i32,
    pub causal: i32,
}

/// Grid, block and shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8LaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
}

impl Int8Args {
    /// Element counts of every buffer (int8 codes, f16 V/O, f32 LSE/scales/shift) for
    /// `config`'s blocking and granularity.
    pub fn required_lens(&self, config: &Int8Config) -> Result<Int8Lens> {
        let s = &self.shape;
        // The spans of the shape's strides; `usize::MAX` where one overflows (no buffer passes).
        let [q, k, v, o] = s.extents().unwrap_or([usize::MAX; 4]);
        let b = config.blocking()?;
        let rows = s.lse_len();
        Ok(Int8Lens {
            q,
            k,
            v,
            o,
            lse: rows,
            q_scale: s.batch * s.q_heads * b.q_blocks(s.q_len) * b.q_slots(config.granularity),
            k_scale: s.batch * s.kv_heads * b.k_blocks(s.kv_len),
            lse_shift: if self.lse_shift { rows } else { 0 },
        })
    }

    /// Validates everything that does not need device pointers.
    pub fn validate(&self, config: &Int8Config) -> Result<()> {
        config.validate()?;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        let s = &self.shape;
        if s.head_dim != config.head_dim as usize || s.v_head_dim != s.head_dim {
            return bad(format!(
                "head dims {} / {} (V) for a kernel of head dim {}",
                s.head_dim, s.v_head_dim, config.head_dim
            ));
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 || s.kv_len == 0 {
            return bad(format!("empty problem: {self:?}"));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", s.q_heads, s.kv_heads));
        }
        if s.q_len > i32::MAX as usize || s.kv_len > i32::MAX as usize {
            return bad("sequence length exceeds i32".into());
        }
        if s.q_heads > 65535 || s.batch > 65535 {
            return bad(format!("batch {} / heads {} exceed the grid limit 65535", s.batch, s.q_heads));
        }
        // cp.async and the O stores move 16-byte pieces of rows: 16 int8 or 8 f16 elements.
        for (name, s, align) in [("q", &s.q, 16), ("k", &s.k, 16), ("v", &s.v, 8), ("o", &s.o, 8)] {
            check_strides(name, s, align)?;
        }
        Ok(())
    }

    /// Checks device addresses: 16-byte alignment of every tensor the kernel copies in
    /// 16-byte pieces, 4-byte alignment of the f32 buffers, `lse_shift` present iff announced.
    pub fn validate_ptrs(&self, ptrs: &Int8Ptrs) -> Result<()> {
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        for (name, p, align) in [
            ("q", ptrs.q, 16),
            ("k", ptrs.k, 16),
            ("v", ptrs.v, 16),
            ("o", ptrs.o, 16),
            ("lse", ptrs.lse, 4),
            ("q_scale", ptrs.q_scale, 4),
            ("k_scale", ptrs.k_scale, 4),
            ("lse_shift", ptrs.lse_shift, 4),
        ] {
            if p % align != 0 {
                return bad(format!("{name} pointer {p:#x} is not {align}-byte aligned"));
            }
            if p == 0 && name != "lse_shift" {
                return bad(format!("{name} pointer is null"));
            }
        }
        if self.lse_shift != (ptrs.lse_shift != 0) {
            return bad(format!(
                "lse_shift announced {} but pointer is {:#x}",
                self.lse_shift, ptrs.lse_shift
            ));
        }
        Ok(())
    }

    /// Kernel parameters for the given device pointers (strides as checked by
    /// [`Self::validate`]: below 2^63).
    pub fn params(&self, ptrs: &Int8Ptrs) -> Int8Params {
        let [q, k, v, o] = [self.shape.q, self.shape.k, self.shape.v, self.shape.o].map(|s| s.to_array().map(|x| x as i64));
        Int8Params {
            q: ptrs.q,
            k: ptrs.k,
            v: ptrs.v,
            o: ptrs.o,
            lse: ptrs.lse,
            q_scale: ptrs.q_scale,
            k_scale: ptrs.k_scale,
            lse_shift: ptrs.lse_shift,
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
            q_len: self.shape.q_len as i32,
            kv_len: self.shape.kv_len as i32,
            q_heads: self.shape.q_heads as i32,
            kv_heads: self.shape.kv_heads as i32,
            kv_group: (self.shape.q_heads / self.shape.kv_heads) as i32,
            causal: self.shape.causal as i32,
        }
    }

    /// Grid `(query blocks, q_heads, batch)`, one CTA of `block_q` rows each. The kernel takes
    /// the number of Q scale blocks per head from the grid width, so the two must agree.
    pub fn launch_shape(&self, config: &Int8Config) -> Result<Int8LaunchShape> {
        self.launch_shape_of(config, config.tile()?, config.smem_bytes()?)
    }

    /// [`Self::launch_shape`] of the tile built for `arch` ([`Int8Config::tile_for`]): the
    /// grid is the same (same rows per CTA), threads and shared memory follow the tile.
    pub fn launch_shape_for(&self, config: &Int8Config, arch: Arch) -> Result<Int8LaunchShape> {
        self.launch_shape_of(config, config.tile_for(arch)?, config.smem_bytes_for(arch)?)
    }

    fn launch_shape_of(&self, config: &Int8Config, tile: Int8Tile, smem_bytes: u32) -> Result<Int8LaunchShape> {
        debug_assert_eq!(tile.block_m(), config.tile()?.block_m());
        let m_blocks = self.shape.q_len.div_ceil(tile.block_m() as usize);
        Ok(Int8LaunchShape {
            grid: (m_blocks as u32, self.shape.q_heads as u32, self.shape.batch as u32),
            block: (tile.threads(), 1, 1),
            smem_bytes,
        })
    }
}

#[cfg(feature = "cuda")]
pub use launch::Int8Kernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};

    // SAFETY: #[repr(C)] plain-old-data mirror of the kernel's by-value parameter struct.
    unsafe impl DeviceRepr for Int8Params {}

    /// Device buffers of one [`Int8Kernel::launch`]; `T` is the 2-byte f16 element type of V/O.
    pub struct Int8Buffers<'a, T, Q, K, V, O, L, S>
    where
        Q: DevicePtr<i8>,
        K: DevicePtr<i8>,
        V: DevicePtr<T>,
        O: DevicePtrMut<T>,
        L: DevicePtrMut<f32>,
        S: DevicePtr<f32>,
    {
        pub q: &'a Q,
        pub k: &'a K,
        pub v: &'a V,
        pub o: &'a mut O,
        pub lse: &'a mut L,
        pub q_scale: &'a S,
        pub k_scale: &'a S,
        pub lse_shift: Option<&'a S>,
        pub _elem: std::marker::PhantomData<T>,
    }

    /// One INT8 variant loaded into a CUDA context, ready to launch.
    #[derive(Debug)]
    pub struct Int8Kernel {
        config: Int8Config,
        arch: Arch,
        function: CudaFunction,
        compiled: Arc<CompiledKernel>,
    }

    impl Int8Kernel {
        /// Compiles (or fetches from the global cache) `config` for the context's device and
        /// loads it.
        pub fn load(ctx: &Arc<CudaContext>, config: Int8Config) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        /// As [`Self::load`], with an explicit cache.
        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Int8Config, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm80, Int8Config::target_for)?;
            let (function, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, config.smem_bytes_for(arch)?)?;
            Ok(Int8Kernel { config, arch, function, compiled })
        }

        pub fn config(&self) -> &Int8Config {
            &self.config
        }
        pub fn arch(&self) -> Arch {
            self.arch
        }
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }

        /// Launches on `stream` with typed buffers. Shapes, strides, every buffer's length and
        /// alignment are checked before anything is enqueued.
        pub fn launch<T, Q, K, V, O, L, S>(
            &self,
            stream: &Arc<CudaStream>,
            args: &Int8Args,
            bufs: Int8Buffers<'_, T, Q, K, V, O, L, S>,
        ) -> Result<()>
        where
            Q: DevicePtr<i8>,
            K: DevicePtr<i8>,
            V: DevicePtr<T>,
            O: DevicePtrMut<T>,
            L: DevicePtrMut<f32>,
            S: DevicePtr<f32>,
        {
            if std::mem::size_of::<T>() != 2 {
                return Err(NativeError::InvalidArgs(format!(
                    "V/O element type must be 2 bytes (f16), got {}",
                    std::mem::size_of::<T>()
                )));
            }
            if args.lse_shift != bufs.lse_shift.is_some() {
                return Err(NativeError::InvalidArgs(format!(
                    "lse_shift announced {} but {} buffer passed",
                    args.lse_shift,
                    if bufs.lse_shift.is_some() { "a" } else { "no" }
                )));
            }
            args.validate(&self.config)?;
            let need = args.required_lens(&self.config)?;
            let have = Int8Lens {
                q: bufs.q.len(),
                k: bufs.k.len(),
                v: bufs.v.len(),
                o: bufs.o.len(),
                lse: bufs.lse.len(),
                q_scale: bufs.q_scale.len(),
                k_scale: bufs.k_scale.len(),
                lse_shift: bufs.lse_shift.map(|s| s.len()).unwrap_or(0),
            };
            check_lens(&need, &have)?;
            let (q, _gq) = bufs.q.device_ptr(stream);
            let (k, _gk) = bufs.k.device_ptr(stream);
            let (v, _gv) = bufs.v.device_ptr(stream);
            let (o, _go) = bufs.o.device_ptr_mut(stream);
            let (lse, _gl) = bufs.lse.device_ptr_mut(stream);
            let (q_scale, _gqs) = bufs.q_scale.device_ptr(stream);
            let (k_scale, _gks) = bufs.k_scale.device_ptr(stream);
            let shift = bufs.lse_shift.map(|s| s.device_ptr(stream));
            let lse_shift = shift.as_ref().map(|(p, _)| *p).unwrap_or(0);
            let ptrs = Int8Ptrs { q, k, v, o, lse, q_scale, k_scale, lse_shift };
            // SAFETY: every buffer's length was checked against what the kernel touches.
            unsafe { self.launch_raw(stream, args, &ptrs) }
        }

        /// Launches with raw device addresses (the facade's CubeCL buffers).
        ///
        /// # Safety
        /// Each pointer must address device memory of at least the element counts of
        /// [`Int8Args::required_lens`] (int8 Q/K, f16 V/O, f32 LSE/scales/shift), valid until
        /// the kernel finishes on `stream`; scales must be positive and finite.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, args: &Int8Args, ptrs: &Int8Ptrs) -> Result<()> {
            args.validate(&self.config)?;
            args.validate_ptrs(ptrs)?;
            let shape = args.launch_shape_for(&self.config, self.arch)?;
            let params = args.params(ptrs);
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem_bytes };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::Int8Buffers;

/// `have` against `need`, buffer by buffer, as a typed error naming the first short one.
pub fn check_lens(need: &Int8Lens, have: &Int8Lens) -> Result<()> {
    let pairs = [
        ("q", need.q, have.q),
        ("k", need.k, have.k),
        ("v", need.v, have.v),
        ("o", need.o, have.o),
        ("lse", need.lse, have.lse),
        ("q_scale", need.q_scale, have.q_scale),
        ("k_scale", need.k_scale, have.k_scale),
        ("lse_shift", need.lse_shift, have.lse_shift),
    ];
    for (name, n, h) in pairs {
        if h < n {
            return Err(NativeError::InvalidArgs(format!("{name} has {h} elements, needs {n}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::{Layout, Strides};

    fn args() -> Int8Args {
        let mut shape = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 777, 128, true);
        shape.o = Strides::new(Layout::Bshd, 8, 1000, 128);
        Int8Args { shape, lse_shift: true }
    }

    #[test]
    fn unsupported_head_dim_is_typed() {
        let e = Int8Config::new(96, Int8Granularity::PerBlock, PvAccum::F32).unwrap_err();
        assert!(matches!(e, NativeError::UnsupportedHeadDim { head_dim: 96, .. }), "{e}");
        assert!(Int8Config::new(128, Int8Granularity::PerThread, PvAccum::F16PerTile).is_ok());
    }

    #[test]
    fn names_are_unique_and_say_the_mode() {
        let mut names: Vec<String> = Int8Config::all().iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), 12);
        assert!(names.contains(&"fwd_int8_block_f32_d128".to_string()), "{names:?}");
        assert!(names.contains(&"fwd_int8_thread_f16_d64".to_string()), "{names:?}");
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
        // No clash with the HMMA family either (both go through one cache and one report).
        assert!(names.iter().all(|n| !crate::hmma::HmmaConfig::all().iter().any(|h| &h.name() == n)));
    }

    #[test]
    fn blocking_follows_the_tile_and_the_granularity() {
        for hd in [64, 128] {
            let block = Int8Config::new(hd, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
            let t = block.tile().unwrap();
            assert_eq!(block.blocking().unwrap(), Int8Blocking { block_q: t.block_m() as usize, block_k: t.block_n as usize, warps: t.warps as usize });
            let thread = Int8Config::new(hd, Int8Granularity::PerThread, PvAccum::F32).unwrap();
            let Int8Blocking { block_q: bq, warps: w, .. } = thread.blocking().unwrap();
            // The codec's per-thread model: 16 rows per layout warp.
            assert_eq!(bq / w, 16);
        }
        let mut forced = Int8Config::new(128, Int8Granularity::PerWarp, PvAccum::F32).unwrap();
        forced.tile = Some(Int8Tile::new(8, 64, 16));
        assert_eq!(forced.blocking().unwrap(), Int8Blocking { block_q: 128, block_k: 64, warps: 8 });
        assert!(forced.name().ends_with("_d128_w8n64"), "{}", forced.name());
    }

    #[test]
    fn smem_and_tile_validation_mirror_the_kernel() {
        let mut cfg = Int8Config::new(128, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
        cfg.tile = Some(Int8Tile::new(4, 64, 32));
        assert_eq!(cfg.smem_bytes().unwrap(), 2 * (64 * 128 + 64 * 256));
        cfg.validate().unwrap();
        cfg.tile = Some(Int8Tile { q_in_regs: false, ..Int8Tile::new(4, 64, 32) });
        assert_eq!(cfg.smem_bytes().unwrap(), 2 * (64 * 128 + 64 * 256) + 128 * 128);
        // 32 keys: O (128 rows x 256 B) does not fit in two 12 KiB stages.
        cfg.tile = Some(Int8Tile { q_in_regs: false, ..Int8Tile::new(4, 32, 32) });
        assert!(matches!(cfg.validate(), Err(NativeError::UnsupportedConfig { .. })));
        cfg.tile = Some(Int8Tile::new(4, 64, 24));
        assert!(cfg.validate().is_err());
        assert!(cfg.defines().is_err());
        cfg.tile = Some(Int8Tile::new(4, 40, 16));
        assert!(cfg.validate().is_err());
        cfg.tile = None;
        let d = cfg.defines().unwrap();
        assert!(d.contains(&("Q_GRAN".into(), "0".into())) && d.contains(&("HEAD_DIM".into(), "128".into())));
        let thread = Int8Config::new(64, Int8Granularity::PerThread, PvAccum::F16PerTile).unwrap();
        let d = thread.defines().unwrap();
        assert!(d.contains(&("Q_GRAN".into(), "2".into())) && d.contains(&("PV_ACC".into(), "1".into())));
    }

    #[test]
    fn compact_tiles_keep_the_scale_blocking() {
        for row in INT8_TILES {
            let (t, c) = (row.f32_pv, row.compact);
            assert_eq!((c.block_m(), c.block_n), (t.block_m(), t.block_n), "{row:?}");
            assert_eq!(c.warps % t.warps, 0, "{row:?}");
        }
        for g in Int8Granularity::ALL {
            let cfg = Int8Config::new(128, g, PvAccum::F32).unwrap();
            let (t90, t100) = (cfg.tile_for(Arch::Sm90).unwrap(), cfg.tile_for(Arch::Sm100a).unwrap());
            assert_eq!(t90, cfg.tile().unwrap());
            assert_eq!(t100, INT8_TILES[1].compact);
            let d = cfg.defines_for(Arch::Sm100a).unwrap();
            assert!(d.contains(&("WARPS".into(), t100.warps.to_string())), "{d:?}");
            assert!(d.contains(&("Q_LAYOUT_WARPS".into(), t90.warps.to_string())), "{d:?}");
            let a = args();
            let s90 = a.launch_shape_for(&cfg, Arch::Sm90).unwrap();
            let s100 = a.launch_shape_for(&cfg, Arch::Sm100a).unwrap();
            assert_eq!(s90.grid, s100.grid);
            assert_eq!((s90.block.0, s100.block.0), (t90.threads(), t100.threads()));
            assert_eq!(s100.smem_bytes, cfg.smem_bytes_for(Arch::Sm100a).unwrap());
            // f16 P·V and forced tiles are the same everywhere.
            let f16 = Int8Config::new(128, g, PvAccum::F16PerTile).unwrap();
            assert_eq!(f16.tile_for(Arch::Sm100a).unwrap(), f16.tile().unwrap());
            let mut forced = cfg;
            forced.tile = Some(Int8Tile::new(8, 128, 16));
            assert_eq!(forced.tile_for(Arch::Sm100a).unwrap(), Int8Tile::new(8, 128, 16));
        }
    }

    #[test]
    fn expected_instructions_follow_the_pv_mode() {
        let f32 = Int8Config::new(64, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
        assert_eq!(f32.expected_instructions(), vec!["IMMA.16832.S8.S8", "HMMA.16816.F32"]);
        let f16 = Int8Config::new(64, Int8Granularity::PerBlock, PvAccum::F16PerTile).unwrap();
        assert_eq!(f16.expected_instructions(), vec!["IMMA.16832.S8.S8", "HMMA.16816.F16"]);
        assert_eq!(Int8Config::target_for((9, 0)), Some(Arch::Sm90));
        assert_eq!(Int8Config::target_for((10, 0)), Some(Arch::Sm100a));
        assert_eq!(Int8Config::target_for((7, 5)), None);
    }

    #[test]
    fn params_layout_matches_the_kernel_struct() {
        // 8 pointers + 12 strides (8 bytes) + 6 four-byte fields.
        assert_eq!(std::mem::size_of::<Int8Params>(), 20 * 8 + 6 * 4);
        let a = args();
        let p = a.params(&Int8Ptrs { q: 16, k: 32, v: 48, o: 64, lse: 80, q_scale: 96, k_scale: 112, lse_shift: 128 });
        assert_eq!((p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.kv_group, p.causal), (1000, 777, 8, 2, 4, 1));
        assert_eq!((p.o_seq_stride, p.lse_shift), (8 * 128, 128));
    }

    #[test]
    fn required_lengths_cover_every_buffer() {
        let a = args();
        let block = Int8Config::new(128, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
        let Int8Blocking { block_q: bq, block_k: bk, warps: w } = block.blocking().unwrap();
        let lens = a.required_lens(&block).unwrap();
        assert_eq!(lens.q, 2 * 8 * 1000 * 128);
        assert_eq!(lens.k, 2 * 2 * 777 * 128);
        assert_eq!(lens.o, 2 * 8 * 1000 * 128);
        assert_eq!(lens.lse, 2 * 8 * 1000);
        assert_eq!(lens.lse_shift, 2 * 8 * 1000);
        assert_eq!(lens.q_scale, 2 * 8 * 1000usize.div_ceil(bq));
        assert_eq!(lens.k_scale, 2 * 2 * 777usize.div_ceil(bk));
        let warp = Int8Config::new(128, Int8Granularity::PerWarp, PvAccum::F32).unwrap();
        assert_eq!(a.required_lens(&warp).unwrap().q_scale, 2 * 8 * 1000usize.div_ceil(bq) * w);
        let thread = Int8Config::new(128, Int8Granularity::PerThread, PvAccum::F32).unwrap();
        assert_eq!(a.required_lens(&thread).unwrap().q_scale, 2 * 8 * 1000usize.div_ceil(bq) * (bq / 16) * 8);
        // One element short anywhere is refused, naming the buffer.
        let mut have = lens;
        have.k_scale -= 1;
        let e = check_lens(&lens, &have).unwrap_err();
        assert!(e.to_string().contains("k_scale"), "{e}");
        have = lens;
        have.lse_shift = 0;
        assert!(check_lens(&lens, &have).unwrap_err().to_string().contains("lse_shift"));
        check_lens(&lens, &lens).unwrap();
    }

    #[test]
    fn args_validation() {
        let cfg = Int8Config::new(128, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
        let mut a = args();
        a.validate(&cfg).unwrap();
        assert_eq!(a.launch_shape(&cfg).unwrap().grid, (8, 8, 2));
        a.shape.kv_heads = 3;
        assert!(matches!(a.validate(&cfg), Err(NativeError::InvalidArgs(_))));
        a.shape.kv_heads = 2;
        // int8 rows are copied in 16-byte pieces: a seq stride of 136 int8 elements is refused,
        // while 136 is fine for the f16 V.
        a.shape.q.seq = 136;
        assert!(a.validate(&cfg).is_err());
        a.shape.q.seq = 128;
        a.shape.v.seq = 136;
        a.validate(&cfg).unwrap();
        a.shape.kv_len = 0;
        assert!(a.validate(&cfg).is_err());
        a.shape.kv_len = 777;
        let good = Int8Ptrs { q: 256, k: 512, v: 768, o: 1024, lse: 1280, q_scale: 1536, k_scale: 1792, lse_shift: 2048 };
        a.validate_ptrs(&good).unwrap();
        assert!(a.validate_ptrs(&Int8Ptrs { k: 520, ..good }).is_err());
        assert!(a.validate_ptrs(&Int8Ptrs { lse_shift: 0, ..good }).is_err());
        a.lse_shift = false;
        a.validate_ptrs(&Int8Ptrs { lse_shift: 0, ..good }).unwrap();
        assert!(a.validate_ptrs(&Int8Ptrs { q_scale: 0, ..good }).is_err());
    }
}
