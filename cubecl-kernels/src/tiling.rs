//! Tilings of the portable kernels and their tables, one per kernel and head dim, best first.
//! The selection (`launch::first_fit`) takes the first entry that fits the runtime's
//! shared-memory and units-per-cube limits. Pure functions, no device.

use crate::error::LaunchError;

/// Tiling of the vectorized FMA kernel (`fma_vec.rs`; also the packed-f16 and INT8 kernels):
/// a cube of `tr * tc` units owns `bq` query rows and walks the keys `bk` at a time, and where
/// the Q/K/V stages are converted. Unit `(r, c)` computes an `rm x rn` block of scores on 4-wide vectors,
/// so `rm` and `rn` are multiples of 4 and `v_head_dim` a multiple of `4 * tc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FmaVecTiles {
    pub bq: u32,
    pub bk: u32,
    pub tr: u32,
    pub tc: u32,
    /// Stage Q, K and V in f32 (converted once when staged) rather than in the input type
    /// (converted at every use; half the shared memory for f16/bf16 inputs).
    pub stage_f32: bool,
}

impl core::fmt::Display for FmaVecTiles {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let stage = if self.stage_f32 { "sf32" } else { "sin" };
        write!(f, "bq{}_bk{}_t{}x{}_{stage}", self.bq, self.bk, self.tr, self.tc)
    }
}

impl FmaVecTiles {
    pub const fn units(&self) -> u32 {
        self.tr * self.tc
    }
    pub const fn rm(&self) -> u32 {
        self.bq / self.tr
    }
    pub const fn rn(&self) -> u32 {
        self.bk / self.tc
    }
    pub const fn stage_bytes(&self, elem_bytes: u32) -> u32 {
        if self.stage_f32 {
            4
        } else {
            elem_bytes
        }
    }

    /// Shared memory in bytes: Qᵀ (`d x bq`) and one buffer for Kᵀ (`d x bk`) then V
    /// (`bk x dv`) in the stage type, f32 Pᵀ (`bk x (bq + 4)`), f32 reduction scratch
    /// (`bq x tc`).
    pub const fn smem_bytes(&self, head_dim: u32, v_head_dim: u32, elem_bytes: u32) -> u32 {
        let k = head_dim * self.bk;
        let v = self.bk * v_head_dim;
        let kv = if k > v { k } else { v };
        (head_dim * self.bq + kv) * self.stage_bytes(elem_bytes)
            + 4 * (self.bk * (self.bq + 4) + self.bq * self.tc)
    }

    /// Shared memory in bytes of the packed-f16 kernel (`fma_half.rs`) on this tiling: Qᵀ,
    /// one K-then-V buffer and Pᵀ (`bk x (bq + 4)`) in f16, the f32 reduction scratch.
    pub const fn smem_bytes_half(&self, head_dim: u32, v_head_dim: u32) -> u32 {
        let k = head_dim * self.bk;
        let v = self.bk * v_head_dim;
        let kv = if k > v { k } else { v };
        2 * (head_dim * self.bq + kv + self.bk * (self.bq + 4)) + 4 * self.bq * self.tc
    }

    /// [`Self::smem_bytes_half`] with K and V in separate stages (the packed-f16 kernel's
    /// two-barrier tile, `LaunchOptions::split_kv`).
    pub const fn smem_bytes_half_split(&self, head_dim: u32, v_head_dim: u32) -> u32 {
        let k = head_dim * self.bk;
        let v = self.bk * v_head_dim;
        2 * (head_dim * self.bq + k + v + self.bk * (self.bq + 4)) + 4 * self.bq * self.tc
    }

    /// Shared memory in bytes of the FP8 kernel (`fma_vec_fp8.rs`) on this tiling: Qᵀ and one
    /// K-then-V buffer in the stage type (f32, or f16: decoded codes are exact in either), f16
    /// Pᵀ (`bk x (bq + 4)`), the f32 reduction scratch and `bq + 1` u32 records of non-finite
    /// codes; the total padded to the stage vector (4 stage elements), the widest alignment
    /// among the buffers, as the CUDA declarations are. Without plane reductions this is the
    /// kernel's allocation; with them the scratch is unused and dropped, so an upper bound.
    pub const fn smem_bytes_fp8(&self, head_dim: u32, v_head_dim: u32) -> u32 {
        let k = head_dim * self.bk;
        let v = self.bk * v_head_dim;
        let kv = if k > v { k } else { v };
        let bytes = (head_dim * self.bq + kv) * self.stage_bytes(2)
            + 2 * self.bk * (self.bq + 4)
            + 4 * (self.bq * self.tc + self.bq + 1);
        bytes.next_multiple_of(4 * self.stage_bytes(2))
    }

    pub fn validate(&self, head_dim: u32, v_head_dim: u32) -> Result<(), LaunchError> {
        let err = |reason: &str| {
            Err(LaunchError::InvalidTiles { tiles: self.to_string(), reason: reason.to_string() })
        };
        if self.bq == 0 || self.bk == 0 || self.tr == 0 || self.tc == 0 {
            return err("all tile sizes must be positive");
        }
        if !self.bq.is_multiple_of(4 * self.tr) {
            return err("bq must be a multiple of 4 * tr (rows per unit in vectors of 4)");
        }
        if !self.bk.is_multiple_of(4 * self.tc) {
            return err("bk must be a multiple of 4 * tc (keys per unit in vectors of 4)");
        }
        if !v_head_dim.is_multiple_of(4 * self.tc) || !head_dim.is_multiple_of(4) {
            return err("v_head_dim must be a multiple of 4 * tc and head_dim of 4");
        }
        if !self.tc.is_power_of_two() || self.tc > 32 {
            return err("tc must be a power of two up to 32 (it is the reduction width)");
        }
        Ok(())
    }
}

/// Candidate tilings of the vectorized FMA kernel per head dim, best first.
///
/// Why these shapes:
/// - `rm = 4` query rows x `rn = 4` keys per unit (one vector of each per head-dim index,
///   16 FMA per 2 vector loads) and `tc = 8` units per row (the row reductions stay inside a
///   plane).
/// - The accumulator is `rm * dv/tc` floats: 64 at d=128 with `tc = 8`; d=256 uses `tc = 16`.
/// - Shared memory is dominated by Qᵀ (`d * bq`). At d ≤ 64 everything fits in f32 within
///   48 KiB (Vulkan on NVIDIA) at bq = 64. At d = 128, bq = 64 only fits with the stages in
///   the input type (f16), so the f32-staged bq = 32 (half the units per cube) comes next.
/// - The last entries fit llvmpipe's 32 KiB. f32 at d = 256 (16 KiB of K tile per 16 keys)
///   fits 48 KiB only with 16 keys per tile and 32 KiB only with 8 query rows per cube; both
///   keep 4 x 4 vectors per unit and pay with a large accumulator (256 floats per unit).
pub fn fma_vec_candidates(head_dim: u32) -> &'static [FmaVecTiles] {
    const fn t(bq: u32, bk: u32, tr: u32, tc: u32, stage_f32: bool) -> FmaVecTiles {
        FmaVecTiles { bq, bk, tr, tc, stage_f32 }
    }
    const SMALL: &[FmaVecTiles] = &[
        t(64, 32, 16, 8, true),
        t(64, 32, 16, 8, false),
        t(64, 64, 16, 8, false),
        t(32, 32, 8, 8, true),
        t(16, 32, 4, 8, true),
    ];
    const MEDIUM: &[FmaVecTiles] = &[
        t(64, 32, 16, 8, false),
        t(32, 32, 8, 8, true),
        t(32, 32, 8, 8, false),
        t(16, 32, 4, 8, true),
        t(16, 32, 4, 8, false),
    ];
    const LARGE: &[FmaVecTiles] = &[
        t(16, 64, 4, 16, false),
        t(16, 32, 4, 8, false),
        t(16, 32, 4, 8, true),
        t(16, 16, 4, 4, true),
        t(8, 16, 2, 4, true),
    ];
    match head_dim {
        0..=64 => SMALL,
        65..=128 => MEDIUM,
        _ => LARGE,
    }
}

/// Candidate tilings of the packed-f16 FMA kernel (`fma_half.rs`) per head dim, best first
/// (stages always in f16, so `stage_f32` is false).
///
/// Measured on an H100 (seq 4096, non-causal, prefetched K/V):
/// - hd 128: 64 query rows x 64 keys on 16 x 16 units (4 rows x 4 keys and 4 x 8 output
///   columns per unit) leads through WGSL on Vulkan (38.6 TFLOP/s two-stage, 40.0-40.2 with f16
///   Q·Kᵀ, against 36.5-37.0 for 64 x 32 on 16 x 8). Through CUDA the order is the other way
///   round (46.5 against 41.9); one table serves every runtime, and Vulkan is where the portable
///   path is the fast path. The second entry fits llvmpipe's 32 KiB (30 976 bytes).
/// - hd <= 64: 64 x 32 on 16 x 8 leads through WGSL (43.5 against 35.5 for 16 x 16).
/// - 8 rows per unit (`t8x8`, `t4x16`) spills into fewer warps and loses everywhere. hd 256 is
///   not measured.
pub fn fma_half_candidates(head_dim: u32) -> &'static [FmaVecTiles] {
    const fn t(bq: u32, bk: u32, tr: u32, tc: u32) -> FmaVecTiles {
        FmaVecTiles { bq, bk, tr, tc, stage_f32: false }
    }
    const SMALL: &[FmaVecTiles] = &[t(64, 32, 16, 8), t(64, 64, 8, 16), t(64, 32, 8, 8)];
    const MEDIUM: &[FmaVecTiles] = &[t(64, 64, 16, 16), t(64, 32, 16, 8), t(64, 64, 8, 16), t(32, 32, 4, 8)];
    const LARGE: &[FmaVecTiles] = &[t(16, 64, 4, 16), t(16, 32, 4, 8)];
    match head_dim {
        0..=64 => SMALL,
        65..=128 => MEDIUM,
        _ => LARGE,
    }
}

/// Tiling of the matrix-unit (cmma) kernel: `warps` planes of 32 units, each owning 16 query
/// rows, walking `bk` keys at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmmaTiles {
    pub warps: u32,
    pub bk: u32,
}

impl core::fmt::Display for CmmaTiles {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "bq{}_bk{}_w{}", self.bq(), self.bk, self.warps)
    }
}

impl CmmaTiles {
    pub const fn bq(&self) -> u32 {
        self.warps * 16
    }
    pub const fn units(&self) -> u32 {
        self.warps * 32
    }

    /// Bytes of shared memory, exactly as the kernel allocates it: K, V and P staged in the
    /// input type plus a per-plane f32 scratch of 16 rows x `bk` (the score spill; the output
    /// goes through it 32 columns at a time), all of which reuse the Q stage once Q's
    /// fragments are in registers, so the total is `max(Q, K + V + P + scratch)`.
    /// Rows are padded by 8 elements (16 bytes for f16/bf16) and the f32 scratch rows by 4;
    /// every buffer is then a whole number of 32-byte blocks, so alignment adds nothing.
    ///
    /// This counts on the runtime aliasing shared buffers: CUDA does, and so does SPIR-V on
    /// Vulkan with `VK_KHR_workgroup_memory_explicit_layout` (NVIDIA, RADV, ANV). Without that
    /// extension CubeCL declares the buffers side by side (`Q + K + V + P + scratch`) and a
    /// launch past the limit fails in CubeCL's own shared-memory check.
    pub const fn smem_bytes(&self, head_dim: u32, v_head_dim: u32, elem_bytes: u32) -> u32 {
        const PAD16: u32 = 8;
        const PAD32: u32 = 4;
        let q = self.bq() * (head_dim + PAD16) * elem_bytes;
        let k = self.bk * (head_dim + PAD16) * elem_bytes;
        let v = self.bk * (v_head_dim + PAD16) * elem_bytes;
        let p = self.bq() * (self.bk + PAD16) * elem_bytes;
        let scratch = self.warps * 16 * (self.bk + PAD32) * 4;
        let rest = k + v + p + scratch;
        if q > rest {
            q
        } else {
            rest
        }
    }

    pub fn validate(&self) -> Result<(), LaunchError> {
        if self.warps == 0 || self.bk == 0 || !self.bk.is_multiple_of(32) {
            return Err(LaunchError::InvalidTiles {
                tiles: self.to_string(),
                reason: "warps must be positive and bk a positive multiple of 32".into(),
            });
        }
        Ok(())
    }
}

/// Candidate cmma tilings per head dim, best first.
///
/// Measured on an H100 (seq 4096, f16, non-causal, host-timed): 4 planes x bk 32 is the best or within 5-12% of the best on
/// both runtimes, and bk 64 loses everywhere.
///
/// | tiling (planes x bk) | CUDA d64 | CUDA d128 | Vulkan SPIR-V d64 | Vulkan SPIR-V d128 |
/// |---|---|---|---|---|
/// | 4 x 32 | 130.2 | 97.5 | **51.7** | **51.8** |
/// | 4 x 64 | 92.8 | 69.4 | 39.9 | – (over 48 KiB) |
/// | 8 x 32 | **148.6** | 99.2 | 37.8 | 44.7 |
/// | 8 x 64 | 86.1 | **102.1** | – | – |
/// | 2 x 32 | 71.3 | 55.7 | 32.2 | 33.1 |
///
/// One table serves both (the best per runtime would need the runtime in the key; 4 x 32
/// gives up at most 12% on CUDA and is the best on Vulkan). The register budget per lane is
/// `d/16` Q fragments + `bk/16` score fragments + `dv/16` output fragments.
///
/// Shared memory (f16/bf16, [`CmmaTiles::smem_bytes`]) is dominated by K and V once the Q stage
/// is reused: 4 planes x bk 32 take 27 KiB at d=96, 31 KiB at d=128 and 47 KiB at d=256, so
/// CUDA (opt-in up to 227 KiB) and Vulkan (SPIR-V cooperative matrices, 48 KiB on NVIDIA) both
/// run 4 planes x bk 32 at every head dim. The other entries are for smaller limits.
pub fn cmma_candidates(head_dim: u32) -> &'static [CmmaTiles] {
    const fn t(warps: u32, bk: u32) -> CmmaTiles {
        CmmaTiles { warps, bk }
    }
    const SMALL: &[CmmaTiles] = &[t(4, 32), t(4, 64), t(2, 32)];
    const LARGE: &[CmmaTiles] = &[t(4, 32), t(2, 32)];
    match head_dim {
        0..=128 => SMALL,
        _ => LARGE,
    }
}

/// Tiling of the register-resident manual-MMA kernel (`kernel/mma.rs`): `warps` planes of 32
/// lanes, each owning `mt` m-tiles of 16 query rows, walking `bk` keys at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmaTiles {
    pub warps: u32,
    pub mt: u32,
    pub bk: u32,
}

impl core::fmt::Display for MmaTiles {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "bq{}_bk{}_w{}_mt{}", self.bq(), self.bk, self.warps, self.mt)
    }
}

impl MmaTiles {
    pub const fn bq(&self) -> u32 {
        self.warps * self.mt * 16
    }
    pub const fn units(&self) -> u32 {
        self.warps * 32
    }

    /// Bytes of shared memory, exactly as the kernel allocates it: `max(Q, K + V)` in the input
    /// type (the Q stage is freed once its fragments are in registers), rows padded by 8
    /// elements (16 bytes) against `ldmatrix` bank conflicts.
    pub const fn smem_bytes(&self, head_dim: u32, v_head_dim: u32, elem_bytes: u32) -> u32 {
        const PAD: u32 = 8;
        let q = self.bq() * (head_dim + PAD) * elem_bytes;
        let kv = self.bk * (head_dim + PAD + v_head_dim + PAD) * elem_bytes;
        if q > kv {
            q
        } else {
            kv
        }
    }

    /// What the kernel's loops rely on: K fragments are loaded two k-steps at a time (head dim
    /// a multiple of 32), V fragments two n8 tiles at a time (v head dim a multiple of 16),
    /// P·V steps 16 keys at a time.
    pub fn validate(&self, head_dim: u32, v_head_dim: u32) -> Result<(), LaunchError> {
        let err = |reason: &str| {
            Err(LaunchError::InvalidTiles { tiles: self.to_string(), reason: reason.to_string() })
        };
        if self.warps == 0 || self.mt == 0 || self.bk == 0 || !self.bk.is_multiple_of(16) {
            return err("warps and mt must be positive and bk a positive multiple of 16");
        }
        if !head_dim.is_multiple_of(32) {
            return err("head_dim must be a multiple of 32 (K fragments come two k-steps per ldmatrix)");
        }
        if !v_head_dim.is_multiple_of(16) {
            return err("v_head_dim must be a multiple of 16 (V fragments come two n8 tiles per ldmatrix)");
        }
        let regs = self.fragment_registers(head_dim, v_head_dim);
        if regs > MMA_FRAGMENT_REGISTERS {
            return Err(LaunchError::InvalidTiles {
                tiles: self.to_string(),
                reason: format!(
                    "its fragments take {regs} registers per lane at d={head_dim} dv={v_head_dim}, \
                     over the {MMA_FRAGMENT_REGISTERS} that leave room for the rest (it would spill)"
                ),
            });
        }
        Ok(())
    }

    /// 32-bit registers per lane held by fragments across a KV step: Q (A operands, 4 per
    /// 16x16), S and O (4 f32 per 16x8 tile), and the larger of the K / V prefetches (16-bit
    /// elements, spread over the cube's units).
    pub const fn fragment_registers(&self, head_dim: u32, v_head_dim: u32) -> u32 {
        let q = self.mt * (head_dim / 16) * 4;
        let s = self.mt * (self.bk / 8) * 4;
        let o = self.mt * (v_head_dim / 8) * 4;
        let kv_dim = if head_dim > v_head_dim { head_dim } else { v_head_dim };
        let prefetch = (self.bk * kv_dim * 2 / 4).div_ceil(self.units());
        q + s + o + prefetch
    }
}

/// Fragment registers per lane an mma tiling may take: 255 per thread is the hardware limit,
/// and addresses, softmax temporaries and the P fragments of one key step need about 40.
pub const MMA_FRAGMENT_REGISTERS: u32 = 216;

/// Candidate tilings of the mma kernel per head dim, best first. Measured on an H100 (fp16,
/// seq 4k, batch 4, heads = 2048/d, host-timed, each tiling first checked against an f64
/// reference; TFLOP/s non-causal / causal):
///
/// | head dim | planes x m-tiles, bk | TFLOP/s |
/// | --- | --- | --- |
/// | 64 | **4 x 2, 64** | **238.9 / 224.8** |
/// | 64 | 4 x 1, 64 | 201.4 / 196.4 |
/// | 64 | 8 x 1, 64 | 201.3 / 155.4 |
/// | 128 | **8 x 1, 64** | **238.8 / 208.5** |
/// | 128 | 4 x 1, 32 | 229.7 / 202.4 |
/// | 128 | 4 x 1, 64 | 211.6 / 190.7 |
///
/// d 96 takes d 128's order and d 256 its one entry, unmeasured. Every entry is checked
/// offline (`kernel::mma` tests: NVRTC for sm_90a, ptxas report): all HMMA, no spills.
/// Registers per lane from that report (f16 and bf16 alike; CubeCL's CUDA compile options,
/// fast math on), and what 65536 registers per SM then allow:
///
/// | head dim | planes x m-tiles, bk | registers | warps per SM |
/// | --- | --- | --- | --- |
/// | 64 | 4 x 2, 64 (bq 128) | 249 | 8 |
/// | 64 | 4 x 1, 64 | 160 | 12 |
/// | 64 | 8 x 1, 64 | 147 | 8 |
/// | 128 | 4 x 1, 64 | 241 | 8 |
/// | 128 | 8 x 1, 64 (bq 128) | 229 | 8 |
/// | 128 | 4 x 1, 32 | 168 | 12 |
/// | 256 | 8 x 1, 16 | 254 | 8 |
///
/// Left out because ptxas spills there: 4 x 1 at bk 32 for d 32 (88 B), 8 x 1 at bk 32 for
/// d 96 (36 B), 4 x 1 at bk 16 for d 256 (8 B), 4 x 2 at d 128 (1.1 KiB at bk 32).
///
/// Why: two m-tiles per plane halve the `ldmatrix` traffic per MMA (each K/V fragment feeds two
/// MMAs), but at d 128 the second m-tile's Q and O fragments spill (1.1 KiB at bk 32), so d 128
/// keeps one m-tile; with one m-tile shared memory still bounds the score MMAs only near
/// 470 TFLOP/s on an H100 (512 bytes of `ldmatrix` per two m16n8k16). Larger `bk` amortizes the
/// two barriers and the softmax's shuffles per KV step; smaller `bk` buys occupancy (d 128,
/// bk 32: 12 warps per SM). At d 256 only bk 16 fits the registers.
/// [`MmaTiles::validate`] also refuses tilings whose fragments alone exceed
/// [`MMA_FRAGMENT_REGISTERS`]. Shared memory is small next to CUDA's limits (d 128, bk 64:
/// 34 KiB).
pub fn mma_candidates(head_dim: u32) -> &'static [MmaTiles] {
    const fn t(warps: u32, mt: u32, bk: u32) -> MmaTiles {
        MmaTiles { warps, mt, bk }
    }
    const SMALL: &[MmaTiles] = &[t(4, 2, 64), t(4, 1, 64), t(8, 1, 64)];
    const MEDIUM: &[MmaTiles] = &[t(8, 1, 64), t(4, 1, 32), t(4, 1, 64)];
    const LARGE: &[MmaTiles] = &[t(8, 1, 16)];
    match head_dim {
        0..=64 => SMALL,
        65..=128 => MEDIUM,
        _ => LARGE,
    }
}

/// Candidate tilings of the FP8 mma kernel (`mma_fp8.rs`) per head dim, best first (every
/// descale granularity): the f16 mma kernel's table ([`mma_candidates`]) without the tilings
/// where the decode's registers make ptxas spill (checked offline by `kernel::mma_fp8`'s NVRTC
/// test, sm_90a): 4 x 1 at bk 64 for d 32 (up to 56 B at 96 registers), 4 x 1 at bk 32 for
/// d 65..=128 (up to 24 B at 168 registers). Per-block descales fold into the softmax as the
/// constant ones do (the kernel's module doc), within a few registers of them and spill-free
/// on every tiling here, so every granularity takes the same table.
pub fn mma_fp8_candidates(head_dim: u32) -> &'static [MmaTiles] {
    const fn t(warps: u32, mt: u32, bk: u32) -> MmaTiles {
        MmaTiles { warps, mt, bk }
    }
    const TINY: &[MmaTiles] = &[t(4, 2, 64), t(8, 1, 64)];
    const MEDIUM: &[MmaTiles] = &[t(8, 1, 64), t(4, 1, 64)];
    match head_dim {
        0..=32 => TINY,
        65..=128 => MEDIUM,
        _ => mma_candidates(head_dim),
    }
}

/// Bytes of the FP8 mma kernel's non-finite records (`bq + 1` words), as allocated before the
/// 16-byte aligned stages.
pub const fn mma_fp8_record_bytes(tiles: &MmaTiles) -> u32 {
    (4 * (tiles.bq() + 1)).div_ceil(16) * 16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::{first_fit, CubeLimits, Family, PortableKernel};
    use quattn_core::{Accumulation, Dtype, PvAccum, QkAccum};

    /// The supported head dims as the tile functions take them.
    const DIMS: [u32; 5] = [32, 64, 96, 128, 256];

    #[test]
    fn dims_are_the_supported_ones() {
        assert_eq!(DIMS.map(|d| d as usize).as_slice(), crate::problem::SUPPORTED_HEAD_DIMS);
    }

    fn limits(max_shared_bytes: usize, max_units: u32) -> CubeLimits {
        CubeLimits { max_shared_bytes, max_units }
    }

    fn dtype(bytes: u32) -> Dtype {
        if bytes == 4 {
            Dtype::F32
        } else {
            Dtype::F16
        }
    }

    fn select_fma_vec_tiles(d: u32, dv: u32, bytes: u32, smem: usize, units: u32) -> Option<FmaVecTiles> {
        match first_fit(Family::Fma, Accumulation::default(), d, dv, dtype(bytes), limits(smem, units)) {
            Ok(PortableKernel::Fma(t)) => Some(t),
            _ => None,
        }
    }

    fn select_fma_half_tiles(d: u32, dv: u32, smem: usize, units: u32) -> Option<FmaVecTiles> {
        let acc = Accumulation { qk: QkAccum::TwoStage, pv: PvAccum::F16PerTile };
        match first_fit(Family::Fma, acc, d, dv, Dtype::F16, limits(smem, units)) {
            Ok(PortableKernel::Half(h)) => Some(h.tiles),
            _ => None,
        }
    }

    fn select_cmma_tiles(d: u32, dv: u32, bytes: u32, smem: usize, units: u32) -> Option<CmmaTiles> {
        match first_fit(Family::Cmma, Accumulation::default(), d, dv, dtype(bytes), limits(smem, units)) {
            Ok(PortableKernel::Cmma(t)) => Some(t),
            _ => None,
        }
    }

    fn select_mma_tiles(d: u32, dv: u32, bytes: u32, smem: usize, units: u32) -> Option<MmaTiles> {
        match first_fit(Family::Mma, Accumulation::default(), d, dv, dtype(bytes), limits(smem, units)) {
            Ok(PortableKernel::Mma(t)) => Some(t),
            _ => None,
        }
    }

    /// Every head-dim pair has a vector tiling within llvmpipe's 32 KiB and Vulkan's 48 KiB,
    /// in f32 and in f16.
    #[test]
    fn every_head_dim_fits_32k_and_48k() {
        for d in DIMS {
            for dv in DIMS {
                for bytes in [4, 2] {
                    for smem in [32 * 1024, 48 * 1024] {
                        let t = select_fma_vec_tiles(d, dv, bytes, smem, 256);
                        assert!(t.is_some(), "no tiles for d={d} dv={dv} bytes={bytes} smem={smem}");
                    }
                }
            }
        }
    }

    #[test]
    fn all_candidates_are_valid() {
        for d in DIMS {
            for t in fma_vec_candidates(d) {
                t.validate(d, d).unwrap();
            }
        }
    }

    #[test]
    fn vec_tiles_fit_vulkan_and_llvmpipe_in_f16() {
        for d in DIMS {
            for smem in [32 * 1024, 48 * 1024] {
                assert!(select_fma_vec_tiles(d, d, 2, smem, 256).is_some(), "d={d} smem={smem}");
            }
        }
        // The first choice on Vulkan/NVIDIA (48 KiB) keeps 64 query rows per cube up to d=128.
        assert_eq!(select_fma_vec_tiles(128, 128, 2, 48 * 1024, 1024).unwrap().bq, 64);
        assert_eq!(select_fma_vec_tiles(64, 64, 2, 48 * 1024, 1024).unwrap().bq, 64);
    }

    #[test]
    fn half_tiles_fit_vulkan_and_llvmpipe() {
        for d in DIMS {
            for smem in [32 * 1024, 48 * 1024] {
                let t = select_fma_half_tiles(d, d, smem, 256).unwrap_or_else(|| panic!("d={d} smem={smem}"));
                assert!(t.smem_bytes_half(d, d) as usize <= smem);
                assert!(!t.stage_f32);
            }
        }
        // The measured best at d = 128: 64 rows x 64 keys on 16 x 16 units where
        // 48 KiB fit it (Vulkan on NVIDIA), 64 x 32 on 16 x 8 on llvmpipe's 32 KiB.
        let t = select_fma_half_tiles(128, 128, 48 * 1024, 1024).unwrap();
        assert_eq!((t.bq, t.bk, t.tr, t.tc, t.rm()), (64, 64, 16, 16, 4));
        assert_eq!(t.smem_bytes_half(128, 128), 2 * (128 * 64 + 128 * 64 + 64 * 68) + 4 * 64 * 16);
        // Separate K and V stages do not fit it in 48 KiB: the launcher keeps one stage.
        assert!(t.smem_bytes_half_split(128, 128) as usize > 48 * 1024);
        let t = select_fma_half_tiles(128, 128, 32 * 1024, 1024).unwrap();
        assert_eq!((t.bq, t.bk, t.tr, t.tc, t.rm()), (64, 32, 16, 8, 4));
        // The f16 P stage is counted: 30976 bytes, of which P is 2 · 32 · 68; split K/V add
        // the V tile (2 · 32 · 128) and fit 48 KiB, not 32.
        assert_eq!(t.smem_bytes_half(128, 128), 2 * (128 * 64 + 128 * 32 + 32 * 68) + 4 * 64 * 8);
        assert_eq!(t.smem_bytes_half_split(128, 128), t.smem_bytes_half(128, 128) + 2 * 32 * 128);
        assert!(t.smem_bytes_half_split(128, 128) as usize <= 48 * 1024);
        assert!(t.smem_bytes_half_split(128, 128) as usize > 32 * 1024);
    }

    #[test]
    fn cmma_tiles_within_vulkans_48k_in_f16() {
        let pick = |d| select_cmma_tiles(d, d, 2, 48 * 1024, 1024);
        assert_eq!(pick(32), Some(CmmaTiles { warps: 4, bk: 32 }));
        assert_eq!(pick(64), Some(CmmaTiles { warps: 4, bk: 32 }));
        assert_eq!(pick(96), Some(CmmaTiles { warps: 4, bk: 32 }));
        assert_eq!(pick(128), Some(CmmaTiles { warps: 4, bk: 32 }));
        assert_eq!(pick(256), Some(CmmaTiles { warps: 4, bk: 32 }));
    }

    #[test]
    fn cmma_tiles_under_cudas_opt_in_limit_in_f16() {
        // H100: 227 KiB per block with the opt-in attribute.
        let pick = |d| select_cmma_tiles(d, d, 2, 227 * 1024, 1024);
        for d in [32, 64, 96, 128, 256] {
            assert_eq!(pick(d), Some(CmmaTiles { warps: 4, bk: 32 }), "d={d}");
        }
        // Where 4 x 32 does not fit, the next entries do.
        assert_eq!(select_cmma_tiles(128, 128, 2, 24 * 1024, 1024), Some(CmmaTiles { warps: 2, bk: 32 }));
    }

    #[test]
    fn cmma_smem_numbers() {
        let t = |warps, bk| CmmaTiles { warps, bk };
        // max(Q, K + V + P + scratch), f16.
        assert_eq!(t(4, 64).smem_bytes(128, 128, 2), 17408 + 17408 + 9216 + 17408);
        assert_eq!(t(4, 32).smem_bytes(128, 128, 2), 8704 + 8704 + 5120 + 9216);
        assert_eq!(t(4, 64).smem_bytes(64, 64, 2), 9216 + 9216 + 9216 + 17408);
        assert_eq!(t(4, 32).smem_bytes(256, 256, 2), 16896 + 16896 + 5120 + 9216);
        // Q is the larger side only with many planes, a large d and a small dv.
        assert_eq!(t(8, 32).smem_bytes(256, 32, 2), 128 * 264 * 2);
    }

    /// The host formula and the buffers the kernel allocates (same element counts, same
    /// padding constants) agree for every candidate and head-dim pair, and every buffer is a
    /// whole number of 32-byte blocks, so CubeCL's allocator packs them without gaps.
    #[test]
    fn cmma_smem_formula_matches_the_kernel() {
        use crate::kernel::cmma::CmmaConfig;
        for d in DIMS {
            for dv in DIMS {
                for t in cmma_candidates(d.max(dv)) {
                    for elem_bytes in [2u32, 4] {
                        let cfg = CmmaConfig {
                            head_dim: d as usize,
                            v_head_dim: dv as usize,
                            warps: t.warps as usize,
                            bk: t.bk as usize,
                            vec: 8,
                            causal: false,
                            write_lse: true,
                            lazy_rescale: true,
                        };
                        let what = format!("{t} d={d} dv={dv} elem={elem_bytes}");
                        assert!(cfg.buffers_aligned(elem_bytes as usize), "{what}");
                        assert_eq!(
                            t.smem_bytes(d, dv, elem_bytes) as usize,
                            cfg.smem_bytes(elem_bytes as usize),
                            "{what}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn mma_tiles_fit_every_head_dim_and_match_the_kernel() {
        use crate::kernel::mma::MmaFwdConfig;
        for d in DIMS {
            for dv in DIMS {
                let pick = select_mma_tiles(d, dv, 2, 227 * 1024, 1024);
                assert!(pick.is_some(), "d={d} dv={dv}");
                for t in mma_candidates(d.max(dv)) {
                    t.validate(d, dv).unwrap();
                    let cfg = MmaFwdConfig {
                        head_dim: d as usize,
                        v_head_dim: dv as usize,
                        warps: t.warps as usize,
                        mt: t.mt as usize,
                        bk: t.bk as usize,
                        vec: 8,
                        causal: false,
                        write_lse: true,
                        lazy_rescale: true,
                    };
                    assert_eq!(t.smem_bytes(d, dv, 2) as usize, cfg.smem_bytes(2), "{t} d={d} dv={dv}");
                    assert_eq!(t.bq() as usize, cfg.bq());
                }
            }
        }
    }

    #[test]
    fn mma_smem_numbers_and_rules() {
        let t = |warps, mt, bk| MmaTiles { warps, mt, bk };
        // max(Q, K + V), f16, rows padded by 8.
        assert_eq!(t(4, 1, 64).smem_bytes(128, 128, 2), 64 * 136 * 2 * 2);
        assert_eq!(t(4, 2, 64).smem_bytes(64, 64, 2), 128 * 72 * 2);
        assert_eq!(t(8, 1, 16).smem_bytes(256, 256, 2), 128 * 264 * 2);
        assert!(t(4, 1, 24).validate(64, 64).is_err());
        assert!(t(4, 1, 32).validate(48, 64).is_err());
        assert!(t(4, 1, 32).validate(64, 40).is_err());
        assert!(t(0, 1, 32).validate(64, 64).is_err());
        assert!(t(4, 1, 32).validate(96, 96).is_ok());
        // Fragment registers: Q 32 + S 32 + O 64 + K/V prefetch 32 at d=128, bk=64.
        assert_eq!(t(4, 1, 64).fragment_registers(128, 128), 160);
        assert_eq!(t(4, 2, 32).fragment_registers(128, 128), 64 + 32 + 128 + 16);
        assert!(t(4, 2, 32).validate(128, 128).is_err(), "240 registers would spill");
        // The first choice on CUDA (measured, see mma_candidates): two m-tiles up to d=64, one
        // above; a runtime with fewer units per cube than 8 planes take falls to the next entry.
        assert_eq!(select_mma_tiles(64, 64, 2, 227 * 1024, 1024), Some(t(4, 2, 64)));
        assert_eq!(select_mma_tiles(128, 128, 2, 227 * 1024, 1024), Some(t(8, 1, 64)));
        assert_eq!(select_mma_tiles(128, 128, 2, 227 * 1024, 128), Some(t(4, 1, 32)));
        assert_eq!(select_mma_tiles(256, 256, 2, 227 * 1024, 1024), Some(t(8, 1, 16)));
    }
}
