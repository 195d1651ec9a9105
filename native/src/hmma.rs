//! The HMMA forward family (`cuda/fwd_hmma.cu`): FlashAttention-2-style attention on
//! `mma.sync.m16n8k16`, fp16 or bf16 inputs, with a choice of accumulation precision for Q·Kᵀ
//! and P·V. Runs on every target from sm_80 up; on Hopper/Blackwell it is the fallback next to
//! the wgmma / tcgen05 families, on Ampere/Ada/consumer Blackwell it is the fast path.
//!
//! The `_varlen` variants ([`HmmaConfig::varlen`], f16 or bf16 with f32 accumulation, launched by
//! `HmmaKernel::launch_varlen`) run packed variable-length batches ([`crate::varlen`]); with
//! score modifiers too (`_mods..._varlen`, `launch_varlen_raw` with their
//! [`crate::mods::ModParams`]), each sequence's band aligned against its own lengths.

use crate::arch::Arch;
use crate::cache::{CompileRequest, FWD_HMMA};
use crate::error::{NativeError, Result};
use crate::mods::ModVariant;
use quattn_core::{AttentionShape, Dtype, PvAccum, QkAccum, Strides, TWO_STAGE_CHUNK};

const KERNEL: &str = "fwd_hmma";

// `QkAccum::TwoStage` folds every TWO_STAGE_CHUNK head dims: whole k16 MMA steps, dividing both
// head dims of the family (the kernel's static_assert, checked here before any compile).
const _: () = assert!(
    TWO_STAGE_CHUNK.is_multiple_of(16) && 64usize.is_multiple_of(TWO_STAGE_CHUNK) && 128usize.is_multiple_of(TWO_STAGE_CHUNK)
);

/// Tile shape of one head dim. One table ([`HMMA_TILES`]), no branches elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HmmaTile {
    /// Warps per CTA.
    pub warps: u32,
    /// Keys per KV tile.
    pub block_n: u32,
    /// Query rows per warp: 16 (one m16 tile) or 32 (two, FA2's layout: every K/V fragment
    /// read from shared memory feeds twice as many MMAs). BLOCK_M = rows_per_warp * warps.
    pub rows_per_warp: u32,
    /// Q's MMA fragments loaded once into registers (`true`), or Q kept resident in shared
    /// memory and re-read each k-step (`false`: fewer registers, more ldmatrix, more smem).
    pub q_in_regs: bool,
}

/// One row of the tile table: the tiles of one head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HmmaTileRow {
    pub head_dim: u32,
    /// Modes that accumulate in f32 only (F32 Q·Kᵀ and P·V, every bf16 variant).
    pub tile: HmmaTile,
    /// Modes with any f16 accumulator (F16 / two-stage Q·Kᵀ, f16-per-tile P·V): their f16
    /// partial sums live next to the f32 scores or O, and at hd128 with 32 rows per warp that
    /// sits right at 255 registers, spilling on some targets.
    pub f16_accum: HmmaTile,
    /// The f32-only modes on targets where ptxas spills `tile` at 255 registers (sm_100a,
    /// sm_120a: its register allocation differs from sm_80..sm_90 for the same source). Chosen
    /// to compile without spills there; not measured on such hardware (we have none).
    pub compact: HmmaTile,
}

/// Tile configuration per head dim, and why. Measured on the H100 (fp16, F32 mode, batch·seq =
/// 16k, heads = 2048/hd, TFLOP/s at s4k / s16k; torch SDPA flash in the same calls: hd64 306 /
/// 308, hd128 351 / 346), with `hmma_check` and `QUATTN_SWEEP`:
///
/// | tile (warps x rows/warp, BLOCK_N, Q)  | hd64                  | hd128                     |
/// |---------------------------------------|-----------------------|---------------------------|
/// | 4 x 16, 64, registers                 | 255 / 260             | 289 / 295                 |
/// | 8 x 16, 64, registers                 | 179 / 184             | 246 / 253                 |
/// | 4 x 32, 64, registers                 | 277 / 283             | does not fit              |
/// | 4 x 32, 64, shared memory             | 282 / 288             | **352 / 361**             |
/// | 4 x 32, 32, shared memory             | -                     | 297 / 302                 |
/// | 4 x 32, 128, shared memory            | **323 / 327**         | -                         |
/// | 4 x 16, 128, registers                | 262 / 270             | -                         |
/// | 2 x 32, 64, registers                 | 280 / 281             | -                         |
///
/// Why 32 rows per warp: at 16 rows each ldmatrix.x4 (512 B, 4 clocks of an SM's 128 B/clk
/// shared-memory bandwidth) feeds 2 MMAs (~1.5 SM clocks each on an H100), so the loop is
/// bound by shared memory; at 32 rows a K or V fragment feeds 4 and the tensor cores become
/// the limit (FA2's layout, FA2's 128 x 64 / 4-warp CTA at hd128). With 64-key tiles hd64 can
/// keep Q in registers (Q 32 + O 64 + S 64 registers); its default takes 128-key tiles instead
/// (S 128 registers, Q in shared memory); at hd128 Q 64 + O 128 + S 64 exceeds 255, so Q stays in
/// shared memory (96 KiB per CTA: 2 CTAs per SM on an H100, by registers and by shared
/// memory; 1 on sm_80/86/89) and costs 2 extra ldmatrix per k-step, shared by that step's 16
/// MMAs. That tile uses all 255 registers; the f16-accumulating modes keep the 16-row tile,
/// which fits. The 16-row tiles stay available as forced tiles ([`HmmaTile::new`]); re-pick
/// here after measuring with `hmma_check`'s `QUATTN_SWEEP`.
pub const HMMA_TILES: [HmmaTileRow; 2] = [
    HmmaTileRow {
        head_dim: 64,
        // 128 keys per tile halve the per-tile softmax overhead (row max/sum, rescale) that limits
        // hd64, where a tile carries half the MMAs of hd128; Q moves to shared memory to make room
        // for the wider S (255 registers, no spill). The f16-accumulating modes spill (152 B)
        // with it, so they keep 64 keys.
        tile: HmmaTile { warps: 4, block_n: 128, rows_per_warp: 32, q_in_regs: false },
        f16_accum: HmmaTile { warps: 4, block_n: 64, rows_per_warp: 32, q_in_regs: true },
        compact: HmmaTile { warps: 4, block_n: 64, rows_per_warp: 32, q_in_regs: true },
    },
    HmmaTileRow {
        head_dim: 128,
        tile: HmmaTile { warps: 4, block_n: 64, rows_per_warp: 32, q_in_regs: false },
        f16_accum: HmmaTile::new(4, 64),
        compact: HmmaTile::new(4, 64),
    },
];

impl HmmaTile {
    /// The original layout: 16 rows per warp, Q in registers.
    pub const fn new(warps: u32, block_n: u32) -> Self {
        HmmaTile { warps, block_n, rows_per_warp: 16, q_in_regs: true }
    }
    pub fn block_m(&self) -> u32 {
        self.rows_per_warp * self.warps
    }
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }
    /// Dynamic shared memory, mirror of `cfg::SMEM_BYTES`: two stages of a K and a V tile,
    /// plus a resident Q tile when Q is not held in registers.
    pub fn smem_bytes(&self, head_dim: u32) -> u32 {
        let row = head_dim * 2;
        2 * 2 * self.block_n * row + if self.q_in_regs { 0 } else { self.block_m() * row }
    }
    /// Name suffix of a forced tile: `w8n64` for the original layout, `w4n64r32` with 32 rows
    /// per warp, a trailing `qs` when Q stays in shared memory.
    pub fn suffix(&self) -> String {
        let rows = if self.rows_per_warp == 16 { String::new() } else { format!("r{}", self.rows_per_warp) };
        let q = if self.q_in_regs { "" } else { "qs" };
        format!("w{}n{}{rows}{q}", self.warps, self.block_n)
    }
}

/// One compiled variant of the family: everything that changes the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HmmaConfig {
    pub head_dim: u32,
    /// f16 or bf16 ([`Dtype::F32`] is refused: mma.sync has no f32 inputs).
    pub input: Dtype,
    pub qk: QkAccum,
    pub pv: PvAccum,
    /// `None`: the tile from [`HMMA_TILES`]; `Some`: forced (tests, tuning sweeps).
    pub tile: Option<HmmaTile>,
    /// `Some`: the score-modifier variant (f32 accumulation only).
    pub mods: Option<ModVariant>,
    /// The variable-length variant ([`crate::varlen`]; f32 accumulation), with or without
    /// score modifiers.
    pub varlen: bool,
}

impl HmmaConfig {
    /// Head dims with a tile entry; others are refused so the facade can fall back.
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];

    /// Targets the family is built and checked for: mma.sync m16n8k16 exists on all of them,
    /// and nothing in the kernel needs an arch-specific (`a`) feature, so an H100 runs the
    /// sm_90 build. sm_100a and sm_120a take the table's `compact` tile for the f32-only modes
    /// ([`HmmaConfig::tile_for`]); they are compiled and checked here, never run (we have no
    /// such device).
    pub const TARGETS: &'static [Arch] = &[Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90, Arch::Sm100a, Arch::Sm120a];
    /// Targets of the score-modifier variants: those whose SASS is checked free of spills at
    /// their tiles (a device of another compute capability falls through to a kernel with
    /// modifiers elsewhere).
    pub const MOD_TARGETS: &'static [Arch] = &[Arch::Sm80, Arch::Sm90, Arch::Sm120a];

    /// Validated constructor.
    pub fn new(head_dim: usize, input: Dtype, qk: QkAccum, pv: PvAccum) -> Result<Self> {
        let cfg = HmmaConfig { head_dim: head_dim as u32, input, qk, pv, tile: None, mods: None, varlen: false };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The variable-length variant for `input` (f16 or bf16, f32 accumulation).
    pub fn varlen(head_dim: usize, input: Dtype) -> Result<Self> {
        let cfg = HmmaConfig { varlen: true, ..Self::new(head_dim, input, QkAccum::F32, PvAccum::F32)? };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The variable-length variant with score modifiers (f32 accumulation, the modifier tile).
    pub fn varlen_with_mods(head_dim: usize, input: Dtype, mods: ModVariant) -> Result<Self> {
        let cfg = HmmaConfig { mods: Some(mods), ..Self::varlen(head_dim, input)? };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The targets this variant is built and SASS-checked for: [`Self::MOD_TARGETS`] for the
    /// modifier and variable-length variants, [`Self::TARGETS`] for the others.
    pub fn targets(&self) -> &'static [Arch] {
        if self.mods.is_some() || self.varlen {
            Self::MOD_TARGETS
        } else {
            Self::TARGETS
        }
    }

    /// Checks the combination exists (head dim in the table, f16 or bf16 inputs, bf16 only with
    /// f32 accumulation).
    pub fn validate(&self) -> Result<()> {
        if self.tile_opt(Arch::Sm90).is_none() {
            return Err(NativeError::UnsupportedHeadDim {
                kernel: KERNEL,
                head_dim: self.head_dim as usize,
                supported: Self::HEAD_DIMS,
            });
        }
        let bad = |reason: String| Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason });
        if let Some(t) = self.tile {
            // Mirrors the kernel's static_asserts so a bad forced tile fails before NVRTC.
            let threads = t.threads();
            let chunks = self.head_dim / 8;
            if t.warps == 0 || t.block_n < 16 || t.block_n % 16 != 0
                || !(t.rows_per_warp == 16 || t.rows_per_warp == 32)
                || (t.q_in_regs && t.block_m() > 2 * t.block_n)
                || (t.block_m() * chunks) % threads != 0 || (t.block_n * chunks) % threads != 0
            {
                return bad(format!(
                    "tile {t:?} (needs BLOCK_N % 16 == 0, 16 or 32 rows per warp, \
                     BLOCK_M <= 2*BLOCK_N with Q in registers, even copies)"
                ));
            }
            // 227 KiB of shared memory per block on sm_90, less elsewhere: the driver refuses
            // larger launches; this catches absurd sweeps before NVRTC.
            if t.smem_bytes(self.head_dim) > 227 * 1024 {
                return bad(format!("tile {t:?} needs {} bytes of shared memory", t.smem_bytes(self.head_dim)));
            }
        }
        if self.input == Dtype::F32 {
            return bad("f32 inputs (mma.sync takes f16 or bf16)".into());
        }
        if self.input == Dtype::Bf16 && (self.qk != QkAccum::F32 || self.pv != PvAccum::F32) {
            return bad("bf16 mma.sync accumulates in f32 only".into());
        }
        if self.mods.is_some() && (self.qk != QkAccum::F32 || self.pv != PvAccum::F32) {
            return bad("score modifiers with f32 accumulation only".into());
        }
        if self.varlen && (self.qk != QkAccum::F32 || self.pv != PvAccum::F32) {
            return bad("variable-length batches with f32 accumulation only".into());
        }
        Ok(())
    }

    fn tile_opt(&self, arch: Arch) -> Option<HmmaTile> {
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return None;
        }
        if self.tile.is_some() {
            return self.tile;
        }
        let row = HMMA_TILES.iter().find(|r| r.head_dim == self.head_dim)?;
        if let Some(m) = self.mods {
            if m.softcap || m.alibi || self.varlen {
                // Softcap and ALiBi (a transform of every score) and the per-sequence addressing
                // of the varlen kernel do not fit next to 32 rows per warp in 255 registers; 16
                // rows per warp with Q in registers do.
                return Some(HmmaTile::new(4, 64));
            }
            // The band and sinks alone: the plain f32 tile, which they fit at 255 registers
            // without a spill (their masks are per tile, like the causal one), except at hd64
            // on sm_90, where ptxas spills a loop bound (4 bytes) with 128-key tiles and the
            // compact tile (32 rows per warp, 64 keys, Q in registers) fits.
            return Some(match (self.head_dim, arch) {
                (_, Arch::Sm100a | Arch::Sm120a) | (64, Arch::Sm90) => row.compact,
                _ => row.tile,
            });
        }
        if self.varlen && self.head_dim == 128 {
            // The dense hd128 tile (32 rows per warp) uses all 255 registers; the per-sequence
            // addressing of the varlen kernel tips it into spills on sm_80 and sm_90, so the
            // 16-row tile (Q in registers) it fits in.
            return Some(HmmaTile::new(4, 64));
        }
        Some(match (self.qk == QkAccum::F32 && self.pv == PvAccum::F32, arch) {
            (false, _) => row.f16_accum,
            (true, Arch::Sm100a | Arch::Sm120a) => row.compact,
            (true, _) => row.tile,
        })
    }

    /// The tile shape from [`HMMA_TILES`] on `arch` (or the forced tile).
    pub fn tile_for(&self, arch: Arch) -> Result<HmmaTile> {
        self.tile_opt(arch).ok_or(NativeError::UnsupportedHeadDim {
            kernel: KERNEL,
            head_dim: self.head_dim as usize,
            supported: Self::HEAD_DIMS,
        })
    }

    /// The tile on sm_80..sm_90 (what an H100 runs).
    pub fn tile(&self) -> Result<HmmaTile> {
        self.tile_for(Arch::Sm90)
    }

    /// `fwd_hmma_{in}_{qk}_{pv}_d{hd}`, e.g. `fwd_hmma_f16_2s32_f32_d128` (`2s32`: two-stage
    /// Q·Kᵀ with [`TWO_STAGE_CHUNK`] dims per fold).
    pub fn name(&self) -> String {
        let input = self.input.name();
        let qk = match self.qk {
            QkAccum::F32 => "f32".to_string(),
            QkAccum::F16 => "f16".to_string(),
            QkAccum::TwoStage => format!("2s{TWO_STAGE_CHUNK}"),
        };
        let pv = match self.pv {
            PvAccum::F32 => "f32",
            PvAccum::F16PerTile => "f16",
        };
        let forced = self.tile.map(|t| format!("_{}", t.suffix())).unwrap_or_default();
        let mods = self.mods.map(|m| m.suffix()).unwrap_or_default();
        let varlen = if self.varlen { "_varlen" } else { "" };
        format!("fwd_hmma_{input}_{qk}_{pv}_d{}{forced}{mods}{varlen}", self.head_dim)
    }

    /// Every variant the report and tests compile.
    pub fn all() -> Vec<HmmaConfig> {
        let mut v = Vec::new();
        for hd in [64, 128] {
            for qk in [QkAccum::F32, QkAccum::F16, QkAccum::TwoStage] {
                for pv in [PvAccum::F32, PvAccum::F16PerTile] {
                    v.push(HmmaConfig { head_dim: hd, input: Dtype::F16, qk, pv, tile: None, mods: None, varlen: false });
                }
            }
            v.push(HmmaConfig { head_dim: hd, input: Dtype::Bf16, qk: QkAccum::F32, pv: PvAccum::F32, tile: None, mods: None, varlen: false });
            // The modifier variants: the band and sinks alone (a sliding window, the plain tile),
            // and with softcap and ALiBi compiled in (the superset of the others' code, the
            // 16-row tile).
            for input in [Dtype::F16, Dtype::Bf16] {
                for (softcap, alibi) in [(false, false), (true, true)] {
                    let mods = Some(ModVariant { softcap, alibi });
                    v.push(HmmaConfig { head_dim: hd, input, qk: QkAccum::F32, pv: PvAccum::F32, tile: None, mods, varlen: false });
                }
            }
            for input in [Dtype::F16, Dtype::Bf16] {
                v.push(HmmaConfig { head_dim: hd, input, qk: QkAccum::F32, pv: PvAccum::F32, tile: None, mods: None, varlen: true });
            }
            // Varlen with modifiers: the band, sinks and per-sequence alignment alone, and with
            // softcap and ALiBi compiled in (the superset).
            for input in [Dtype::F16, Dtype::Bf16] {
                for (softcap, alibi) in [(false, false), (true, true)] {
                    let mods = Some(ModVariant { softcap, alibi });
                    v.push(HmmaConfig { head_dim: hd, input, qk: QkAccum::F32, pv: PvAccum::F32, tile: None, mods, varlen: true });
                }
            }
        }
        v
    }

    /// The `-D` defines the kernel reads (see the header of `fwd_hmma.cu`).
    pub fn defines(&self, arch: Arch) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let tile = self.tile_for(arch)?;
        // QK_CHUNK is read by the two-stage mode only; the others pass the same value.
        let qk = match self.qk {
            QkAccum::F32 => 0,
            QkAccum::F16 => 1,
            QkAccum::TwoStage => 2,
        };
        let chunk = TWO_STAGE_CHUNK as u32;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        let mut v = vec![
            d("HEAD_DIM", self.head_dim),
            d("WARPS", tile.warps),
            d("BLOCK_N", tile.block_n),
            d("ROWS_PER_WARP", tile.rows_per_warp),
            d("Q_IN_REGS", tile.q_in_regs as u32),
            d("IN_BF16", (self.input == Dtype::Bf16) as u32),
            d("QK_ACC", qk),
            d("QK_CHUNK", chunk),
            d("PV_ACC", (self.pv == PvAccum::F16PerTile) as u32),
        ];
        if let Some(m) = self.mods {
            v.extend(m.defines());
        }
        if self.varlen {
            v.push(d("VARLEN", 1));
        }
        Ok(v)
    }

    /// The compile request for `arch`.
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Ok(CompileRequest { kernel: self.name(), source: &FWD_HMMA, arch, defines: self.defines(arch)? })
    }

    /// SASS opcodes that must appear (and only these HMMA forms): the proof that the mode is
    /// really built on the intended tensor-core instruction. None for f32 inputs, which
    /// [`Self::validate`] refuses.
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        let f32acc = match self.input {
            Dtype::F16 => "HMMA.16816.F32",
            Dtype::Bf16 => "HMMA.16816.F32.BF16",
            Dtype::F32 => return Vec::new(),
        };
        let qk = match self.qk {
            QkAccum::F32 => f32acc,
            QkAccum::F16 | QkAccum::TwoStage => "HMMA.16816.F16",
        };
        let pv = match self.pv {
            PvAccum::F32 => f32acc,
            PvAccum::F16PerTile => "HMMA.16816.F16",
        };
        let mut v = vec![qk, pv];
        v.dedup();
        v
    }

    /// Targets among [`Self::TARGETS`] that a device of compute capability `cc` runs, best
    /// first.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }
}

/// Longest query or key sequence of the HMMA and wgmma kernels, `2^30 - 1`: row and key
/// indices are i32, and the non-causal mask bound (`0x3fffffff`, a key index no row reaches)
/// must lie past the last key. Offsets have no such limit: every per-(batch, head) base and
/// every row offset is computed in 64 bits from the i64 strides of [`HmmaParams`], so a tensor
/// may span any number of elements the device holds.
pub const MAX_SEQ_LEN: usize = (1 << 30) - 1;

/// Elements a `[batch, heads, seq, dim]` view with strides `s` spans; `usize::MAX` when that
/// overflows (no buffer is that long, so a length check against it fails).
pub(crate) fn span(s: &Strides, batch: usize, heads: usize, seq: usize, dim: usize) -> usize {
    s.extent(batch, heads, seq, dim).unwrap_or(usize::MAX)
}

/// Checks that the strides of tensor `name` are multiples of `align` elements (the kernels move
/// 16-byte pieces of rows) and fit the kernels' i64 stride fields.
pub(crate) fn check_strides(name: &str, s: &Strides, align: usize) -> Result<()> {
    let x = s.to_array();
    if x.iter().any(|&v| !v.is_multiple_of(align) || v > i64::MAX as usize) {
        return Err(NativeError::InvalidArgs(format!("{name} strides {s:?} must be multiples of {align} elements below 2^63")));
    }
    Ok(())
}

/// Mirror of `FwdParams` in `fwd_hmma.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HmmaParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
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
    pub kv_group: i32,
    pub scale_log2: f32,
    pub scale: f32,
    pub causal: i32,
    pub pad_: i32,
}

/// Grid, block and shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HmmaLaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
}

/// The launch arguments of the HMMA and wgmma families: one [`AttentionShape`] (sizes, strides,
/// softmax scale, causal mask). These kernels always write the LSE, whatever `write_lse` says,
/// so an LSE buffer is always passed.
impl HmmaConfig {
    /// Element counts Q, K, V, O and LSE must at least have (`usize::MAX` where a span
    /// overflows: no buffer passes that check).
    pub fn required_lens(&self, s: &AttentionShape) -> [usize; 5] {
        let [q, k, v, o] = s.extents().unwrap_or([usize::MAX; 4]);
        [q, k, v, o, s.lse_len()]
    }

    /// Validates everything that does not need device pointers: the shape's head dims are this
    /// config's, sizes fit the grid and the kernel's i32 fields (sequences up to
    /// [`MAX_SEQ_LEN`]), a finite positive scale, strides in whole 16-byte pieces below 2^63.
    /// The number of elements a tensor spans has no limit here.
    pub fn validate_args(&self, s: &AttentionShape) -> Result<()> {
        self.validate()?;
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        if s.head_dim != self.head_dim as usize || s.v_head_dim != s.head_dim {
            return bad(format!(
                "head dims {} / {} (V) for a kernel of head dim {}",
                s.head_dim, s.v_head_dim, self.head_dim
            ));
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 {
            return bad(format!("empty problem: {s:?}"));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", s.q_heads, s.kv_heads));
        }
        if s.q_len > MAX_SEQ_LEN || s.kv_len > MAX_SEQ_LEN {
            return bad(format!("sequence lengths {} / {} (KV) exceed {MAX_SEQ_LEN}", s.q_len, s.kv_len));
        }
        // Grid y/z limits.
        if s.q_heads > 65535 || s.batch > 65535 {
            return bad(format!("batch {} / heads {} exceed the grid limit 65535", s.batch, s.q_heads));
        }
        if !(s.scale.is_finite() && s.scale > 0.0) {
            // The kernel tracks the row max of raw scores; a non-positive scale would flip it.
            return bad(format!("softmax scale must be finite and > 0, got {}", s.scale));
        }
        for (name, st) in [("q", &s.q), ("k", &s.k), ("v", &s.v), ("o", &s.o)] {
            // cp.async / vector stores move 16-byte rows pieces: 8 elements.
            check_strides(name, st, 8)?;
        }
        Ok(())
    }

    /// Grid `(query blocks, q_heads, batch)`, one CTA of `rows_per_warp * warps` rows each.
    pub fn launch_shape(&self, s: &AttentionShape, arch: Arch) -> Result<HmmaLaunchShape> {
        let tile = self.tile_for(arch)?;
        let m_blocks = s.q_len.div_ceil(tile.block_m() as usize);
        Ok(HmmaLaunchShape {
            grid: (m_blocks as u32, s.q_heads as u32, s.batch as u32),
            block: (tile.threads(), 1, 1),
            smem_bytes: tile.smem_bytes(self.head_dim),
        })
    }
}

impl HmmaParams {
    /// Kernel parameters of `s` for the device pointers `[q, k, v, o, lse]` (strides as checked
    /// by [`HmmaConfig::validate_args`]: below 2^63).
    pub fn new(s: &AttentionShape, ptrs: [u64; 5]) -> HmmaParams {
        let scale_log2 = s.scale * std::f32::consts::LOG2_E;
        let [q, k, v, o] = [s.q, s.k, s.v, s.o].map(|x| x.to_array().map(|v| v as i64));
        HmmaParams {
            q: ptrs[0],
            k: ptrs[1],
            v: ptrs[2],
            o: ptrs[3],
            lse: ptrs[4],
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
            kv_group: (s.q_heads / s.kv_heads.max(1)) as i32,
            scale_log2,
            scale: s.scale,
            causal: s.causal as i32,
            pad_: 0,
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::HmmaKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{
        CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
        PushKernelArg,
    };

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};
    use crate::varlen::{VarlenPtrs, VarlenShape};

    // SAFETY: #[repr(C)] plain-old-data mirror of the kernel's by-value parameter struct.
    unsafe impl DeviceRepr for HmmaParams {}

    /// One HMMA variant loaded into a CUDA context, ready to launch.
    #[derive(Debug)]
    pub struct HmmaKernel {
        config: HmmaConfig,
        arch: Arch,
        function: CudaFunction,
        compiled: Arc<CompiledKernel>,
    }

    impl HmmaKernel {
        /// Compiles (or fetches from the global cache) `config` for the context's device and
        /// loads it.
        pub fn load(ctx: &Arc<CudaContext>, config: HmmaConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        /// As [`Self::load`], with an explicit cache.
        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: HmmaConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = if config.varlen {
                // The targets whose SASS the compile tests check for this variant.
                let targets = config.targets();
                crate::device::target_arch(ctx, KERNEL, Arch::Sm80, |cc| {
                    Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| targets.contains(a))
                })?
            } else {
                crate::device::target_arch(ctx, KERNEL, Arch::Sm80, HmmaConfig::target_for)?
            };
            let (function, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, config.tile_for(arch)?.smem_bytes(config.head_dim))?;
            Ok(HmmaKernel { config, arch, function, compiled })
        }

        pub fn config(&self) -> &HmmaConfig {
            &self.config
        }
        pub fn arch(&self) -> Arch {
            self.arch
        }
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }

        /// Launches on `stream`. `T` is the 2-byte element type (fp16 or bf16 bits: `half::f16`,
        /// `u16`, ...); `lse` is `[batch, q_heads, q_len]` f32. Shapes, strides, lengths and
        /// 16-byte alignment are checked before anything is enqueued.
        #[allow(clippy::too_many_arguments)]
        pub fn launch<T, Q, K, V, O, L>(
            &self,
            stream: &Arc<CudaStream>,
            args: &AttentionShape,
            q: &Q,
            k: &K,
            v: &V,
            o: &mut O,
            lse: &mut L,
        ) -> Result<()>
        where
            Q: DevicePtr<T>,
            K: DevicePtr<T>,
            V: DevicePtr<T>,
            O: DevicePtrMut<T>,
            L: DevicePtrMut<f32>,
        {
            if std::mem::size_of::<T>() != 2 {
                return Err(NativeError::InvalidArgs(format!(
                    "element type must be 2 bytes (fp16/bf16), got {}",
                    std::mem::size_of::<T>()
                )));
            }
            self.config.validate_args(args)?;
            let need = self.config.required_lens(args);
            let have = [q.len(), k.len(), v.len(), o.len(), lse.len()];
            for ((name, n), h) in ["q", "k", "v", "o", "lse"].iter().zip(need).zip(have) {
                if h < n {
                    return Err(NativeError::InvalidArgs(format!("{name} has {h} elements, needs {n}")));
                }
            }
            let (qp, _gq) = q.device_ptr(stream);
            let (kp, _gk) = k.device_ptr(stream);
            let (vp, _gv) = v.device_ptr(stream);
            let (op, _go) = o.device_ptr_mut(stream);
            let (lp, _gl) = lse.device_ptr_mut(stream);
            // SAFETY: lengths were checked against every offset the kernel touches.
            unsafe { self.launch_raw(stream, args, None, [qp, kp, vp, op, lp]) }
        }

        /// Launches with raw device addresses `[q, k, v, o, lse]`.
        ///
        /// # Safety
        /// Each pointer must address device memory of at least
        /// [`HmmaConfig::required_lens`] elements (2-byte elements; f32 for LSE), valid until
        /// the kernel finishes on `stream`.
        /// `mods` is required by a modifier variant (built by [`crate::mods::ModParams::new`]
        /// for this config and shape) and refused by the others.
        pub unsafe fn launch_raw(
            &self,
            stream: &Arc<CudaStream>,
            args: &AttentionShape,
            mods: Option<&crate::mods::ModParams>,
            ptrs: [u64; 5],
        ) -> Result<()> {
            self.config.validate_args(args)?;
            if self.config.varlen {
                return Err(NativeError::InvalidArgs(format!(
                    "{} is a variable-length variant: launch it with launch_varlen",
                    self.config.name()
                )));
            }
            if mods.is_some() != self.config.mods.is_some() {
                return Err(NativeError::InvalidArgs(format!(
                    "{}: score-modifier parameters {} for this variant",
                    self.config.name(),
                    if mods.is_some() { "given" } else { "missing" }
                )));
            }
            if let Some(i) = ptrs.iter().position(|p| p % 16 != 0) {
                return Err(NativeError::InvalidArgs(format!(
                    "{} pointer {:#x} is not 16-byte aligned",
                    ["q", "k", "v", "o", "lse"][i],
                    ptrs[i]
                )));
            }
            let shape = self.config.launch_shape(args, self.arch)?;
            let params = HmmaParams::new(args, ptrs);
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem_bytes };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            if let Some(m) = mods {
                b.arg(m);
            }
            // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }

        /// Launches a variable-length batch ([`crate::varlen`]) on `stream`: `q`, `k`, `v`, `o`
        /// packed token-major with `args`' strides (fp16 or bf16 bits as the config says),
        /// `lse` (optional) f32 `[q_heads, total_q]`, `cu_seqlens_q` / `cu_seqlens_k` int32 of
        /// exactly `batch + 1` entries. Lengths, shapes and the variant are checked first; the
        /// cumulative lengths themselves live on the device and must satisfy
        /// [`VarlenShape::check_cu_seqlens`].
        #[allow(clippy::too_many_arguments)]
        pub fn launch_varlen<T, Q, K, V, O, L, C, D>(
            &self,
            stream: &Arc<CudaStream>,
            args: &VarlenShape,
            q: &Q,
            k: &K,
            v: &V,
            o: &mut O,
            lse: Option<&mut L>,
            cu_seqlens_q: &C,
            cu_seqlens_k: &D,
        ) -> Result<()>
        where
            Q: DevicePtr<T>,
            K: DevicePtr<T>,
            V: DevicePtr<T>,
            O: DevicePtrMut<T>,
            L: DevicePtrMut<f32>,
            C: DevicePtr<i32>,
            D: DevicePtr<i32>,
        {
            let (cq, ck) = (cu_seqlens_q, cu_seqlens_k);
            crate::varlen::with_checked_ptrs(stream, args, self.config.head_dim, "fp16/bf16", q, k, v, o, lse, cq, ck, |ptrs| {
                // SAFETY: lengths were checked against every row the shape names.
                // A modifier variant refuses a launch without its parameters (launch_varlen_raw).
                unsafe { self.launch_varlen_raw(stream, args, None, ptrs) }
            })
        }

        /// Launches a variable-length batch with raw device addresses.
        ///
        /// # Safety
        /// Each address must hold at least [`VarlenShape::required_lens`] elements (2-byte
        /// tensors, f32 LSE unless 0, int32 `cu_seqlens`) valid until the kernel finishes on
        /// `stream`, and the cumulative lengths on the device must pass
        /// [`VarlenShape::check_cu_seqlens`] for `args`. `mods` is required by a modifier
        /// variant (built by [`crate::mods::ModParams::for_varlen`] for this config and shape)
        /// and refused by the others.
        pub unsafe fn launch_varlen_raw(
            &self,
            stream: &Arc<CudaStream>,
            args: &VarlenShape,
            mods: Option<&crate::mods::ModParams>,
            ptrs: &VarlenPtrs,
        ) -> Result<()> {
            if !self.config.varlen {
                return Err(NativeError::InvalidArgs(format!(
                    "{} is not a variable-length variant (HmmaConfig::varlen)",
                    self.config.name()
                )));
            }
            if mods.is_some() != self.config.mods.is_some() {
                return Err(NativeError::InvalidArgs(format!(
                    "{}: score-modifier parameters {} for this variant",
                    self.config.name(),
                    if mods.is_some() { "given" } else { "missing" }
                )));
            }
            self.config.validate()?;
            args.validate(self.config.head_dim)?;
            VarlenShape::check_ptrs(ptrs)?;
            let tile = self.config.tile_for(self.arch)?;
            let (params, vparams) = args.params(ptrs);
            let cfg = LaunchConfig {
                grid_dim: args.grid(tile.block_m()),
                block_dim: (tile.threads(), 1, 1),
                shared_mem_bytes: tile.smem_bytes(self.config.head_dim),
            };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            b.arg(&vparams);
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
    fn unsupported_head_dim_is_typed() {
        let e = HmmaConfig::new(96, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap_err();
        assert!(matches!(e, NativeError::UnsupportedHeadDim { head_dim: 96, .. }), "{e}");
        let e = HmmaConfig::new(128, Dtype::Bf16, QkAccum::F16, PvAccum::F32).unwrap_err();
        assert!(matches!(e, NativeError::UnsupportedConfig { .. }), "{e}");
        let e = HmmaConfig::new(128, Dtype::F32, QkAccum::F32, PvAccum::F32).unwrap_err();
        assert!(matches!(&e, NativeError::UnsupportedConfig { reason, .. } if reason.contains("f32 inputs")), "{e}");
        assert!(HmmaConfig { head_dim: 128, input: Dtype::F32, qk: QkAccum::F32, pv: PvAccum::F32, tile: None, mods: None, varlen: false }
            .expected_instructions()
            .is_empty());
    }

    #[test]
    fn tiles_validate_and_name_like_the_kernel() {
        let mut cfg = HmmaConfig::new(128, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap();
        // Table: 32 rows per warp with Q in shared memory for f32 accumulation at hd128,
        // the 16-row tile for the f16-accumulating modes.
        let t = cfg.tile().unwrap();
        assert_eq!((t.block_m(), t.threads(), t.smem_bytes(128)), (128, 128, 2 * 2 * 64 * 256 + 128 * 256));
        let f16 = HmmaConfig::new(128, Dtype::F16, QkAccum::F16, PvAccum::F32).unwrap();
        assert_eq!(f16.tile().unwrap(), HmmaTile::new(4, 64));
        cfg.tile = Some(HmmaTile::new(8, 64));
        assert!(cfg.name().ends_with("_d128_w8n64"), "{}", cfg.name());
        assert_eq!(cfg.tile().unwrap().smem_bytes(128), 2 * 2 * 64 * 256);
        cfg.tile = Some(HmmaTile { rows_per_warp: 32, q_in_regs: false, ..HmmaTile::new(4, 32) });
        assert!(cfg.name().ends_with("_w4n32r32qs"), "{}", cfg.name());
        cfg.validate().unwrap();
        // Q in registers is staged through one K+V stage: BLOCK_M <= 2 * BLOCK_N.
        cfg.tile = Some(HmmaTile { rows_per_warp: 32, ..HmmaTile::new(4, 32) });
        assert!(cfg.validate().is_err());
        cfg.tile = Some(HmmaTile { rows_per_warp: 48, ..HmmaTile::new(4, 64) });
        assert!(cfg.validate().is_err());
        let d = cfg.defines(Arch::Sm90);
        assert!(d.is_err());
        cfg.tile = None;
        let d = cfg.defines(Arch::Sm90).unwrap();
        assert!(d.contains(&("ROWS_PER_WARP".into(), "32".into())) && d.contains(&("Q_IN_REGS".into(), "0".into())));
    }

    #[test]
    fn varlen_variants() {
        let c = HmmaConfig::varlen(128, Dtype::Bf16).unwrap();
        assert_eq!(c.name(), "fwd_hmma_bf16_f32_f32_d128_varlen");
        assert_eq!(c.targets(), HmmaConfig::MOD_TARGETS);
        assert!(c.defines(Arch::Sm90).unwrap().contains(&("VARLEN".into(), "1".into())));
        // hd128 takes the 16-row tile everywhere; hd64 keeps the table tile.
        assert_eq!(c.tile_for(Arch::Sm90).unwrap(), HmmaTile::new(4, 64));
        let c64 = HmmaConfig::varlen(64, Dtype::F16).unwrap();
        assert_eq!(c64.tile_for(Arch::Sm90).unwrap(), HMMA_TILES[0].tile);
        assert_eq!(HmmaConfig::all().iter().filter(|c| c.varlen && c.mods.is_none()).count(), 4);
        assert!(matches!(HmmaConfig::varlen(96, Dtype::F16), Err(NativeError::UnsupportedHeadDim { .. })));
        let f16 = HmmaConfig { pv: PvAccum::F16PerTile, ..c64 };
        assert!(matches!(f16.validate(), Err(NativeError::UnsupportedConfig { .. })));
        // With score modifiers: the modifier tile at both head dims, both defines, both suffixes.
        let m = HmmaConfig::varlen_with_mods(64, Dtype::Bf16, ModVariant { softcap: true, alibi: true }).unwrap();
        assert_eq!(m.name(), "fwd_hmma_bf16_f32_f32_d64_mods_softcap_alibi_varlen");
        assert_eq!((m.tile_for(Arch::Sm80).unwrap(), m.targets()), (HmmaTile::new(4, 64), HmmaConfig::MOD_TARGETS));
        let d = m.defines(Arch::Sm90).unwrap();
        for (k, v) in [("VARLEN", "1"), ("MODS", "1"), ("MOD_SOFTCAP", "1"), ("MOD_ALIBI", "1"), ("IN_BF16", "1")] {
            assert!(d.contains(&(k.into(), v.into())), "{k}={v} in {d:?}");
        }
        assert_eq!(HmmaConfig::all().iter().filter(|c| c.varlen && c.mods.is_some()).count(), 8);
        let f16m = HmmaConfig { input: Dtype::F16, qk: QkAccum::F16, ..m };
        assert!(matches!(f16m.validate(), Err(NativeError::UnsupportedConfig { .. })));
    }

    #[test]
    fn window_only_modifier_variants_take_the_plain_tile_where_it_fits() {
        for row in HMMA_TILES {
            let hd = row.head_dim as usize;
            for input in [Dtype::F16, Dtype::Bf16] {
                let plain = HmmaConfig::new(hd, input, QkAccum::F32, PvAccum::F32).unwrap();
                let window = HmmaConfig { mods: Some(ModVariant::default()), ..plain };
                assert_eq!(window.name(), format!("{}_mods", plain.name()));
                assert_eq!(window.targets(), HmmaConfig::MOD_TARGETS);
                for arch in [Arch::Sm80, Arch::Sm120a] {
                    assert_eq!(window.tile_for(arch).unwrap(), plain.tile_for(arch).unwrap(), "{} {arch:?}", window.name());
                }
                // hd64's 128-key tile spills on sm_90 next to the band: the compact one, still
                // 32 rows per warp.
                let want = if hd == 64 { row.compact } else { row.tile };
                assert_eq!(window.tile_for(Arch::Sm90).unwrap(), want);
                assert_eq!(window.tile_for(Arch::Sm90).unwrap().rows_per_warp, 32);
                // Softcap or ALiBi, and the varlen variants, keep the 16-row tile.
                for (softcap, alibi) in [(true, true), (true, false), (false, true)] {
                    let m = HmmaConfig { mods: Some(ModVariant { softcap, alibi }), ..plain };
                    assert_eq!(m.tile_for(Arch::Sm90).unwrap(), HmmaTile::new(4, 64));
                }
                let vl = HmmaConfig::varlen_with_mods(hd, input, ModVariant::default()).unwrap();
                assert_eq!(vl.tile_for(Arch::Sm90).unwrap(), HmmaTile::new(4, 64));
                // Both modifier variants are in the compiled and checked list.
                let all = HmmaConfig::all();
                for m in [ModVariant::default(), ModVariant { softcap: true, alibi: true }] {
                    assert!(all.contains(&HmmaConfig { mods: Some(m), ..plain }), "{m:?} d{hd} {input:?}");
                }
            }
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<String> = HmmaConfig::all().iter().map(|c| c.name()).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn hopper_runs_the_sm90_build() {
        assert_eq!(HmmaConfig::target_for((9, 0)), Some(Arch::Sm90));
        assert_eq!(HmmaConfig::target_for((8, 9)), Some(Arch::Sm89));
        assert_eq!(HmmaConfig::target_for((7, 5)), None);
        assert_eq!(HmmaConfig::target_for((10, 0)), Some(Arch::Sm100a));
        assert_eq!(HmmaConfig::target_for((12, 0)), Some(Arch::Sm120a));
    }

    #[test]
    fn blackwell_targets_take_the_compact_tile_for_f32_modes_only() {
        for row in HMMA_TILES {
            let f32 = HmmaConfig::new(row.head_dim as usize, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap();
            let f16 = HmmaConfig::new(row.head_dim as usize, Dtype::F16, QkAccum::F16, PvAccum::F16PerTile).unwrap();
            assert_eq!(f32.tile_for(Arch::Sm90).unwrap(), row.tile);
            assert_eq!(f32.tile_for(Arch::Sm100a).unwrap(), row.compact);
            assert_eq!(f32.tile_for(Arch::Sm120a).unwrap(), row.compact);
            assert_eq!(f16.tile_for(Arch::Sm120a).unwrap(), row.f16_accum);
            // The defines (and so the cubin) follow the arch.
            let block_n = |a| f32.defines(a).unwrap().into_iter().find(|(k, _)| k == "BLOCK_N").unwrap().1;
            assert_eq!(block_n(Arch::Sm100a), row.compact.block_n.to_string());
            assert_eq!(block_n(Arch::Sm90), row.tile.block_n.to_string());
        }
    }

    #[test]
    fn params_layout_matches_the_kernel_struct() {
        // 5 pointers + 12 strides (8 bytes) + 8 four-byte fields.
        assert_eq!(std::mem::size_of::<HmmaParams>(), 17 * 8 + 8 * 4);
    }

    /// Tensors above 2^31 elements: accepted, the strides reach the kernel exact in its i64
    /// fields (per-(batch, head) bases above 2^31 elements), the lengths the launcher checks
    /// are the full spans; only sequences past [`MAX_SEQ_LEN`] are refused.
    #[test]
    fn tensors_above_2_pow_31_elements_keep_64_bit_strides() {
        let cfg = HmmaConfig::new(128, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap();
        // Q and O: 1 x 32 heads x 600k rows x 128 = 2.46e9 elements; head 31 starts past 2^31.
        let a = AttentionShape::contiguous(Layout::Bhsd, 1, 32, 8, 600_000, 256, 128, false);
        cfg.validate_args(&a).unwrap();
        let [q, _, _, o, lse] = cfg.required_lens(&a);
        assert_eq!((q, o, lse), (32 * 600_000 * 128, 32 * 600_000 * 128, 32 * 600_000));
        assert!(q > i32::MAX as usize && q > u32::MAX as usize / 2);
        let p = HmmaParams::new(&a, [16, 32, 48, 64, 80]);
        assert_eq!((p.q_head_stride, p.o_head_stride, p.q_len), (600_000 * 128, 600_000 * 128, 600_000));
        assert!(31 * p.q_head_stride > i32::MAX as i64);
        assert_eq!(cfg.launch_shape(&a, Arch::Sm90).unwrap().grid, (600_000u32.div_ceil(128), 32, 1));
        // BSHD K and V of 8 heads x 2.2M keys: the seq stride times the row passes 2^31, and a
        // batch stride of 2.25e9 elements (batch 2) stays exact.
        let b = AttentionShape::contiguous(Layout::Bshd, 2, 32, 8, 128, 2_200_000, 128, true);
        cfg.validate_args(&b).unwrap();
        let p = HmmaParams::new(&b, [16, 32, 48, 64, 80]);
        assert_eq!((p.k_batch_stride, p.k_seq_stride, p.k_head_stride), (2_200_000 * 8 * 128, 8 * 128, 128));
        assert_eq!(cfg.required_lens(&b)[1], 2 * 2_200_000 * 8 * 128);
        // Sequence lengths: up to 2^30 - 1 (i32 indices, the non-causal mask bound).
        let c = AttentionShape::contiguous(Layout::Bhsd, 1, 1, 1, 64, MAX_SEQ_LEN, 128, false);
        cfg.validate_args(&c).unwrap();
        let d = AttentionShape { kv_len: MAX_SEQ_LEN + 1, ..c };
        assert!(matches!(cfg.validate_args(&d), Err(NativeError::InvalidArgs(m)) if m.contains("exceed")));
        let d = AttentionShape { q_len: MAX_SEQ_LEN + 1, ..c };
        assert!(cfg.validate_args(&d).is_err());
    }

    #[test]
    fn args_validation() {
        let cfg = HmmaConfig::new(128, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap();
        let mut a = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 1000, 128, true);
        cfg.validate_args(&a).unwrap();
        assert_eq!(cfg.launch_shape(&a, Arch::Sm90).unwrap().grid, (8, 8, 2));
        assert_eq!(cfg.required_lens(&a), [2 * 8 * 1000 * 128, 2 * 2 * 1000 * 128, 2 * 2 * 1000 * 128, 2 * 8 * 1000 * 128, 2 * 8 * 1000]);
        let p = HmmaParams::new(&a, [16, 32, 48, 64, 80]);
        assert_eq!((p.q_seq_stride, p.k_head_stride, p.kv_group, p.causal), (128, 1000 * 128, 4, 1));
        assert_eq!((p.scale, p.scale_log2), (a.scale, a.scale * std::f32::consts::LOG2_E));
        a.kv_heads = 3;
        assert!(cfg.validate_args(&a).is_err());
        a.kv_heads = 2;
        a.q.seq = 132;
        assert!(cfg.validate_args(&a).is_err());
        a.q.seq = 128;
        // The shape's head dims must be the kernel's.
        let other = AttentionShape { v_head_dim: 64, ..a };
        assert!(matches!(cfg.validate_args(&other), Err(NativeError::InvalidArgs(_))));
        let other = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 1000, 64, true);
        assert!(matches!(cfg.validate_args(&other), Err(NativeError::InvalidArgs(_))));
        // A stride above 2^63 does not fit the kernel's i64 fields.
        a.k.batch = 1 << 63;
        assert!(cfg.validate_args(&a).is_err());
    }
}
