//! The FP8 mma.sync forward family (`cuda/fwd_mma_fp8.cu` and its V prepass
//! `cuda/mma_fp8_vt.cu`): attention on e4m3 codes of Q, K and V with f32 descales. Q·Kᵀ runs on
//! `mma.sync.m16n8k32.row.col.f32.e4m3.e4m3.f32` (f32 accumulation), the online softmax in f32
//! registers (exp2 with `softmax_scale · log2 e · q_descale · k_descale` folded in), and P·V as
//! [`Fp8P::F16`] (P rounded to f16, V's codes decoded exactly to f16, `m16n8k16` f16 MMA) or
//! [`Fp8P::E4m3`] (P as `e4m3(448 p)` on the e4m3 m16n8k32). The V descale is applied in the
//! epilogue.
//!
//! **Not run on sm_89 / sm_120 hardware.** The native e4m3 `mma.sync` exists on sm_89 (Ada) and
//! sm_120a (consumer Blackwell); they are compiled and SASS-checked here (nvdisasm prints
//! `QMMA.16832.F32.E4M3.E4M3` on both, `F2FP.F16.E4M3.UNPACK_B` for the V decode of P in f16,
//! `F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C` for P in e4m3). sm_90 accepts the same PTX and
//! ptxas lowers each e4m3 m16n8k32 to `F2FP.F16.E4M3.UNPACK_B` conversions of both operands and
//! two `HMMA.16816.F32` (see [`Fp8MmaConfig::expected_instructions`]); an H100 runs that build,
//! which checks the numerics (`examples/mma_fp8_check.rs`: every case within one output ulp of an
//! emulation that rounds where the kernel rounds), not the speed of FP8 tensor cores.
//!
//! Measured on the H100 (that sm_90 build, 8 warps x 16 rows, 64 keys per tile), seq 4096, head
//! dim 128, batch 4, 16 heads, median of 10 launches: P in f16 2.27 ms (243 TFLOP/s), causal
//! 1.22 ms (225); P in e4m3 2.41 ms (228), causal 1.31 ms (210); the V prepass 0.03-0.04 ms.
//!
//! # Host contract
//! * Q, K, V: e4m3 codes (`u8`) in `[batch, heads, seq, head_dim]` with any strides (bytes =
//!   elements, multiples of 16), the head dim contiguous. Descales: f32 buffers, per tensor
//!   (`[1]` each) or per (batch, head) (`[batch, q_heads]` for Q, `[batch, kv_heads]` for K and
//!   V), [`DescaleGranularity`]. A value is `decode(code) · descale`.
//! * The V prepass ([`Fp8MmaKernel::launch_vt_raw`]) writes `Vt`: `[batch, kv_heads,
//!   head_dim, vt_len]` e4m3 with [`vt_len`] = `kv_len` rounded up to [`VT_ALIGN`] keys, keys
//!   permuted within groups of 16 (the header of `fwd_mma_fp8.cu` says how and why), zero past
//!   `kv_len`. [`Fp8MmaKernel::launch_raw`] runs the prepass and the forward on one stream; a
//!   caller that keeps V fixed across calls (a KV cache) may run the prepass once and call
//!   [`Fp8MmaKernel::launch_fwd_raw`] afterwards.
//! * O: f16 or bf16 ([`Fp8MmaConfig::out`]), any strides (multiples of 8 elements); LSE:
//!   `[batch, q_heads, q_len]` f32 in natural-log units of the scaled logits.
//! * GQA, causal (bottom-right aligned), ragged `q_len` / `kv_len`, head dims 64 and 128.

use crate::arch::Arch;
use crate::cache::{CompileRequest, KernelSource};
use crate::error::{NativeError, Result};
use crate::hmma::HmmaTile;
use quattn_core::{AttentionShape, DescaleGranularity, Dtype};

pub use crate::fp8::{Fp8Args, Fp8LaunchShape, Fp8Lens, Fp8Ptrs};
use crate::report::KernelVariant;

const KERNEL: &str = "fwd_mma_fp8";

/// The forward kernel source.
pub static FWD_MMA_FP8: KernelSource =
    KernelSource { file: "fwd_mma_fp8.cu", entry: "fwd_mma_fp8", text: include_str!("../cuda/fwd_mma_fp8.cu") };
/// The V transpose-and-permute prepass source.
pub static MMA_FP8_VT: KernelSource =
    KernelSource { file: "mma_fp8_vt.cu", entry: "mma_fp8_vt", text: include_str!("../cuda/mma_fp8_vt.cu") };

/// `Vt` rows are `kv_len` rounded up to this many keys: a multiple of every KV tile the family
/// uses, so the kernel copies whole tiles without column predicates.
pub const VT_ALIGN: usize = 128;
/// Keys per prepass CTA (`vt::KEYS` in `mma_fp8_vt.cu`).
const VT_CTA_KEYS: usize = 64;
/// Threads per prepass CTA (`vt::THREADS`).
const VT_THREADS: u32 = 256;

/// Format of P (and V) in the P·V product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp8P {
    /// P rounded to f16, V's e4m3 codes decoded to f16 (exact), `m16n8k16` f16 MMA, f32
    /// accumulation ("variant A"; the facade's `PvFormat::F16`).
    F16,
    /// P as `e4m3(448 p)` (RNE, saturating), V's codes as they are, e4m3 `m16n8k32` MMA, f32
    /// accumulation ("variant B"; the facade's `PvFormat::Fp8`).
    E4m3,
}

/// The tiles of one head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Fp8MmaTileRow {
    pub head_dim: u32,
    /// sm_89: the INT8 mma.sync family's tile (`INT8_TILES`): same 8-bit Q/K operands, same
    /// register budget for scores and O (32 rows per warp, so each K and Vt fragment feeds
    /// twice as many MMAs as with 16).
    pub tile: HmmaTile,
    /// sm_90 and sm_120a: 8 warps x 16 rows, Q in registers. On sm_90 ptxas turns every e4m3
    /// MMA into operand conversions plus two f16 MMAs, whose temporaries push the 32-row tiles
    /// to 255 registers and into spills (4-72 bytes with e4m3 P); sm_120a allocates registers
    /// differently from sm_89 for the same source and spills the hd128 32-row tile (4 bytes).
    /// Same rows per CTA as `tile`.
    pub compact: HmmaTile,
}

/// Tile per head dim. Every variant compiles with these without spills or local memory on
/// sm_89, sm_90 and sm_120a (`tests/compile_mma_fp8.rs`); none is measured on FP8 hardware.
pub const FP8_MMA_TILES: [Fp8MmaTileRow; 2] = [
    Fp8MmaTileRow {
        head_dim: 64,
        tile: HmmaTile { warps: 4, block_n: 64, rows_per_warp: 32, q_in_regs: true },
        compact: HmmaTile { warps: 8, block_n: 64, rows_per_warp: 16, q_in_regs: true },
    },
    Fp8MmaTileRow {
        head_dim: 128,
        tile: HmmaTile { warps: 4, block_n: 64, rows_per_warp: 32, q_in_regs: false },
        compact: HmmaTile { warps: 8, block_n: 64, rows_per_warp: 16, q_in_regs: true },
    },
];

/// One compiled forward variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Fp8MmaConfig {
    pub head_dim: u32,
    pub p: Fp8P,
    /// Element type of O (f16 or bf16).
    pub out: Dtype,
    /// `None`: the tile from [`FP8_MMA_TILES`]; `Some`: forced (tests, sweeps).
    pub tile: Option<HmmaTile>,
}

impl Fp8MmaConfig {
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];

    /// sm_89 and sm_120a: native e4m3 mma.sync (compiled and SASS-checked, not run). sm_90:
    /// the same PTX, lowered by ptxas (what an H100 runs).
    pub const TARGETS: &'static [Arch] = &[Arch::Sm89, Arch::Sm90, Arch::Sm120a];

    /// Validated constructor.
    pub fn new(head_dim: usize, p: Fp8P, out: Dtype) -> Result<Self> {
        let cfg = Fp8MmaConfig { head_dim: head_dim as u32, p, out, tile: None };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Every variant the report and the compile tests build: head dim x P format x O type.
    pub fn all() -> Vec<Fp8MmaConfig> {
        let mut v = Vec::new();
        for head_dim in [64, 128] {
            for p in [Fp8P::F16, Fp8P::E4m3] {
                for out in [Dtype::F16, Dtype::Bf16] {
                    v.push(Fp8MmaConfig { head_dim, p, out, tile: None });
                }
            }
        }
        v
    }

    /// The tile built for `arch`: the forced one everywhere, else the table's `tile` on sm_89
    /// and its `compact` tile on sm_90 and sm_120a ([`Fp8MmaTileRow`]).
    pub fn tile_for(&self, arch: Arch) -> Result<HmmaTile> {
        let unsupported =
            || NativeError::UnsupportedHeadDim { kernel: KERNEL, head_dim: self.head_dim as usize, supported: Self::HEAD_DIMS };
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return Err(unsupported());
        }
        if let Some(t) = self.tile {
            return Ok(t);
        }
        let row = FP8_MMA_TILES.iter().find(|r| r.head_dim == self.head_dim).ok_or_else(unsupported)?;
        Ok(match arch {
            Arch::Sm89 => row.tile,
            _ => row.compact,
        })
    }

    /// The tile of sm_89 ([`Self::tile_for`]); every target's tile has its rows per CTA.
    pub fn tile(&self) -> Result<HmmaTile> {
        self.tile_for(Arch::Sm89)
    }

    /// Dynamic shared memory on `arch`, mirror of `cfg::SMEM_BYTES`: two stages of an e4m3 K
    /// tile and an e4m3 Vt tile, plus a resident e4m3 Q tile when Q is not held in registers.
    pub fn smem_bytes_for(&self, arch: Arch) -> Result<u32> {
        Ok(Self::tile_smem_bytes(self.tile_for(arch)?, self.head_dim))
    }

    fn tile_smem_bytes(t: HmmaTile, d: u32) -> u32 {
        2 * 2 * t.block_n * d + if t.q_in_regs { 0 } else { t.block_m() * d }
    }

    /// Checks the combination exists; mirrors the kernel's static_asserts for forced tiles.
    pub fn validate(&self) -> Result<()> {
        if self.out == Dtype::F32 {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: "O is f16 or bf16".into() });
        }
        let t = self.tile()?;
        if self.tile.is_some() {
            let bad = |reason: String| Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason });
            let (d, threads) = (self.head_dim, t.threads());
            let even = |rows: u32, row_bytes: u32| {
                let chunks = row_bytes / 16;
                chunks > 0 && threads % chunks == 0 && {
                    let step = threads / chunks;
                    step.is_multiple_of(8) && rows.is_multiple_of(step)
                }
            };
            let stage = 2 * t.block_n * d;
            if t.warps == 0
                || !(t.block_n == 64 || (t.block_n % 128 == 0 && t.block_n <= 256))
                || !(t.rows_per_warp == 16 || t.rows_per_warp == 32)
                || (t.q_in_regs && t.block_m() * d > stage)
                || t.block_m() * 2 * d > 2 * stage
                || !even(t.block_m(), d)
                || !even(t.block_n, d)
                || !even(d, t.block_n)
            {
                return bad(format!(
                    "tile {t:?} (needs BLOCK_N 64 or a multiple of 128 up to 256, 16 or 32 rows per warp, \
                     Q within one K+Vt stage when in registers, O (16-bit) within both stages, even copies)"
                ));
            }
            let smem = Self::tile_smem_bytes(t, d);
            // sm_89 and sm_120 give a block at most 99 KiB of shared memory.
            if smem > 99 * 1024 {
                return bad(format!("tile {t:?} needs {smem} bytes of shared memory"));
            }
        }
        Ok(())
    }

    /// `fwd_mma_fp8_{p}_{out}_d{hd}[_{tile}]`, e.g. `fwd_mma_fp8_pe4m3_f16_d128`.
    pub fn name(&self) -> String {
        let p = match self.p {
            Fp8P::F16 => "pf16",
            Fp8P::E4m3 => "pe4m3",
        };
        let out = match self.out {
            Dtype::Bf16 => "bf16",
            // F32 O is refused by `validate`.
            Dtype::F16 | Dtype::F32 => "f16",
        };
        let forced = self.tile.map(|t| format!("_{}", t.suffix())).unwrap_or_default();
        format!("fwd_mma_fp8_{p}_{out}_d{}{forced}", self.head_dim)
    }

    /// The `-D` defines the kernel reads on `arch` (the header of `fwd_mma_fp8.cu`).
    pub fn defines(&self, arch: Arch) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let t = self.tile_for(arch)?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        Ok(vec![
            d("HEAD_DIM", self.head_dim),
            d("WARPS", t.warps),
            d("BLOCK_N", t.block_n),
            d("ROWS_PER_WARP", t.rows_per_warp),
            d("Q_IN_REGS", t.q_in_regs as u32),
            d("P_FP8", (self.p == Fp8P::E4m3) as u32),
            d("OUT_BF16", (self.out == Dtype::Bf16) as u32),
        ])
    }

    /// The compile request for `arch` (one of [`Self::TARGETS`]).
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        check_target(arch)?;
        Ok(CompileRequest { kernel: self.name(), source: &FWD_MMA_FP8, arch, defines: self.defines(arch)? })
    }

    /// SASS opcodes that must appear on `arch` (and the only matrix opcodes allowed). sm_89 and
    /// sm_120a run the e4m3 MMA natively: nvdisasm 13.0 prints `QMMA.16832.F32.E4M3.E4M3` on
    /// both, plus `HMMA.16816.F32` for f16 P·V. sm_90 has no FP8 mma.sync: ptxas converts the
    /// e4m3 operands to f16 and issues two `HMMA.16816.F32` per m16n8k32 (its two k16 halves),
    /// so only that form appears there.
    pub fn expected_instructions(&self, arch: Arch) -> Vec<&'static str> {
        let fp8 = match arch {
            Arch::Sm89 | Arch::Sm120a => Some("QMMA.16832.F32.E4M3.E4M3"),
            _ => None,
        };
        match (fp8, self.p) {
            (Some(f), Fp8P::F16) => vec![f, "HMMA.16816.F32"],
            (Some(f), Fp8P::E4m3) => vec![f],
            (None, _) => vec!["HMMA.16816.F32"],
        }
    }

    /// The target a device of compute capability `cc` runs, if any.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }
}

fn check_target(arch: Arch) -> Result<()> {
    if Fp8MmaConfig::TARGETS.contains(&arch) {
        Ok(())
    } else {
        Err(NativeError::UnsupportedConfig {
            kernel: KERNEL,
            reason: format!("{arch} is not a target (e4m3 mma.sync: sm_89, sm_90, sm_120a)"),
        })
    }
}

/// The V prepass of one head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Fp8VtConfig {
    pub head_dim: u32,
}

impl Fp8VtConfig {
    pub fn new(head_dim: usize) -> Result<Self> {
        if !Fp8MmaConfig::HEAD_DIMS.contains(&head_dim) {
            return Err(NativeError::UnsupportedHeadDim { kernel: KERNEL, head_dim, supported: Fp8MmaConfig::HEAD_DIMS });
        }
        Ok(Fp8VtConfig { head_dim: head_dim as u32 })
    }
    /// `fwd_mma_fp8_vt_d{hd}`.
    pub fn name(&self) -> String {
        format!("fwd_mma_fp8_vt_d{}", self.head_dim)
    }
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        check_target(arch)?;
        Fp8VtConfig::new(self.head_dim as usize)?;
        Ok(CompileRequest {
            kernel: self.name(),
            source: &MMA_FP8_VT,
            arch,
            defines: vec![("HEAD_DIM".into(), self.head_dim.to_string())],
        })
    }
}

/// One compiled unit of the family: a forward variant or the V prepass of a head dim (the
/// registry's and the compile report's unit; loading a forward variant loads its prepass too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp8MmaUnit {
    Fwd(Fp8MmaConfig),
    VPrepass(Fp8VtConfig),
}

impl Fp8MmaUnit {
    /// Every forward variant, then the prepass of each head dim.
    pub fn all() -> Vec<Fp8MmaUnit> {
        let mut v: Vec<Fp8MmaUnit> = Fp8MmaConfig::all().into_iter().map(Fp8MmaUnit::Fwd).collect();
        v.extend(Fp8MmaConfig::HEAD_DIMS.iter().map(|&hd| Fp8MmaUnit::VPrepass(Fp8VtConfig { head_dim: hd as u32 })));
        v
    }
}

impl KernelVariant for Fp8MmaUnit {
    fn name(&self) -> String {
        match self {
            Fp8MmaUnit::Fwd(c) => c.name(),
            Fp8MmaUnit::VPrepass(c) => c.name(),
        }
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        match self {
            Fp8MmaUnit::Fwd(c) => c.request(arch),
            Fp8MmaUnit::VPrepass(c) => c.request(arch),
        }
    }
    fn expected_instructions(&self, arch: Arch) -> Vec<String> {
        match self {
            Fp8MmaUnit::Fwd(c) => c.expected_instructions(arch).into_iter().map(String::from).collect(),
            // Byte moves only: 4-byte global loads and stores (no MMA may appear).
            Fp8MmaUnit::VPrepass(_) => vec!["STG.E".to_string()],
        }
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        match self {
            Fp8MmaUnit::Fwd(c) => c.smem_bytes_for(_arch).unwrap_or(0),
            Fp8MmaUnit::VPrepass(_) => 0,
        }
    }
}

/// Mirror of `Fp8FwdParams` in `fwd_mma_fp8.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8MmaParams {
    pub q: u64,
    pub k: u64,
    pub vt: u64,
    pub o: u64,
    pub lse: u64,
    pub q_desc: u64,
    pub k_desc: u64,
    pub v_desc: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_seq_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_seq_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_seq_stride: i64,
    pub q_len: i32,
    pub kv_len: i32,
    pub q_heads: i32,
    pub kv_heads: i32,
    pub kv_group: i32,
    pub causal: i32,
    pub vt_len: i32,
    pub q_desc_batch: i32,
    pub q_desc_head: i32,
    pub kv_desc_batch: i32,
    pub kv_desc_head: i32,
    pub scale_log2: f32,
}

/// Mirror of `Fp8VtParams` in `mma_fp8_vt.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8VtParams {
    pub v: u64,
    pub vt: u64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_seq_stride: i64,
    pub kv_len: i32,
    pub kv_heads: i32,
    pub vt_len: i32,
    pub pad_: i32,
}

/// Keys per Vt row: `kv_len` rounded up to [`VT_ALIGN`].
pub fn vt_len(s: &AttentionShape) -> usize {
    s.kv_len.div_ceil(VT_ALIGN) * VT_ALIGN
}

impl Fp8MmaConfig {
    /// Validates everything about `args` that does not need device pointers (`kv_len >= 1`).
    pub fn validate_args(&self, args: &Fp8Args) -> Result<()> {
        self.validate()?;
        // vt_len and the Vt head offsets are i32 / i64 on the device; keep vt_len in i32.
        args.check(self.head_dim, vt_len(&args.shape), false)
    }

    /// Element counts of every buffer, Vt `[batch, kv_heads, head_dim, vt_len]` included.
    pub fn required_lens(&self, args: &Fp8Args) -> Fp8Lens {
        let s = &args.shape;
        args.lens(s.batch * s.kv_heads * self.head_dim as usize * vt_len(s))
    }

    /// Forward grid `(query blocks, q_heads, batch)` of the tile built for `arch`.
    pub fn launch_shape(&self, args: &Fp8Args, arch: Arch) -> Result<Fp8LaunchShape> {
        let t = self.tile_for(arch)?;
        let s = &args.shape;
        Ok(Fp8LaunchShape {
            grid: (s.q_len.div_ceil(t.block_m() as usize) as u32, s.q_heads as u32, s.batch as u32),
            block: (t.threads(), 1, 1),
            smem_bytes: self.smem_bytes_for(arch)?,
        })
    }
}

/// Checks device addresses: 16-byte alignment of what is copied in 16-byte pieces, 4-byte
/// alignment of the f32 buffers, no null pointer.
pub fn validate_ptrs(ptrs: &Fp8Ptrs) -> Result<()> {
    for (name, p, align) in [
        ("q", ptrs.q, 16),
        ("k", ptrs.k, 16),
        ("v", ptrs.v, 16),
        ("vt", ptrs.vt, 16),
        ("o", ptrs.o, 16),
        ("lse", ptrs.lse, 4),
        ("q_descale", ptrs.q_descale, 4),
        ("k_descale", ptrs.k_descale, 4),
        ("v_descale", ptrs.v_descale, 4),
    ] {
        if p == 0 {
            return Err(NativeError::InvalidArgs(format!("{name} pointer is null")));
        }
        if p % align != 0 {
            return Err(NativeError::InvalidArgs(format!("{name} pointer {p:#x} is not {align}-byte aligned")));
        }
    }
    Ok(())
}

impl Fp8MmaParams {
    /// Forward kernel parameters.
    pub fn new(args: &Fp8Args, ptrs: &Fp8Ptrs) -> Fp8MmaParams {
        let s = &args.shape;
        let (qb, qh, kb, kh) = match args.descale {
            DescaleGranularity::PerTensor => (0, 0, 0, 0),
            DescaleGranularity::PerHead | DescaleGranularity::PerBlock => (s.q_heads as i32, 1, s.kv_heads as i32, 1),
        };
        Fp8MmaParams {
            q: ptrs.q,
            k: ptrs.k,
            vt: ptrs.vt,
            o: ptrs.o,
            lse: ptrs.lse,
            q_desc: ptrs.q_descale,
            k_desc: ptrs.k_descale,
            v_desc: ptrs.v_descale,
            q_batch_stride: s.q.batch as i64,
            q_head_stride: s.q.head as i64,
            q_seq_stride: s.q.seq as i64,
            k_batch_stride: s.k.batch as i64,
            k_head_stride: s.k.head as i64,
            k_seq_stride: s.k.seq as i64,
            o_batch_stride: s.o.batch as i64,
            o_head_stride: s.o.head as i64,
            o_seq_stride: s.o.seq as i64,
            q_len: s.q_len as i32,
            kv_len: s.kv_len as i32,
            q_heads: s.q_heads as i32,
            kv_heads: s.kv_heads as i32,
            kv_group: (s.q_heads / s.kv_heads) as i32,
            causal: s.causal as i32,
            vt_len: vt_len(s) as i32,
            q_desc_batch: qb,
            q_desc_head: qh,
            kv_desc_batch: kb,
            kv_desc_head: kh,
            scale_log2: s.scale * std::f32::consts::LOG2_E,
        }
    }
}

impl Fp8VtParams {
    /// Prepass parameters.
    pub fn new(s: &AttentionShape, ptrs: &Fp8Ptrs) -> Fp8VtParams {
        Fp8VtParams {
            v: ptrs.v,
            vt: ptrs.vt,
            v_batch_stride: s.v.batch as i64,
            v_head_stride: s.v.head as i64,
            v_seq_stride: s.v.seq as i64,
            kv_len: s.kv_len as i32,
            kv_heads: s.kv_heads as i32,
            vt_len: vt_len(s) as i32,
            pad_: 0,
        }
    }

    /// Prepass grid `(vt_len / 64, kv_heads, batch)`, 256 threads, static shared memory.
    pub fn launch_shape(s: &AttentionShape) -> Fp8LaunchShape {
        Fp8LaunchShape {
            grid: ((vt_len(s) / VT_CTA_KEYS) as u32, s.kv_heads as u32, s.batch as u32),
            block: (VT_THREADS, 1, 1),
            smem_bytes: 0,
        }
    }
}

#[cfg(feature = "cuda")]
pub use crate::fp8::Fp8Buffers;
#[cfg(feature = "cuda")]
pub use launch::Fp8MmaKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};

    // SAFETY: #[repr(C)] plain-old-data mirrors of the kernels' by-value parameter structs.
    unsafe impl DeviceRepr for Fp8MmaParams {}
    unsafe impl DeviceRepr for Fp8VtParams {}

    /// One forward variant and its V prepass, loaded into a CUDA context.
    #[derive(Debug)]
    pub struct Fp8MmaKernel {
        config: Fp8MmaConfig,
        arch: Arch,
        fwd: CudaFunction,
        vt: CudaFunction,
        compiled: Arc<CompiledKernel>,
        compiled_vt: Arc<CompiledKernel>,
    }

    impl Fp8MmaKernel {
        /// Compiles (or fetches from the global cache) `config` and its prepass for the
        /// context's device and loads both.
        pub fn load(ctx: &Arc<CudaContext>, config: Fp8MmaConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        /// As [`Self::load`], with an explicit cache.
        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Fp8MmaConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm89, Fp8MmaConfig::target_for)?;
            let (fwd, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, config.smem_bytes_for(arch)?)?;
            let vt_cfg = Fp8VtConfig::new(config.head_dim as usize)?;
            let (vt, compiled_vt) = crate::device::load_function(ctx, cache, &vt_cfg.request(arch)?, 0)?;
            Ok(Fp8MmaKernel { config, arch, fwd, vt, compiled, compiled_vt })
        }

        pub fn config(&self) -> &Fp8MmaConfig {
            &self.config
        }
        pub fn arch(&self) -> Arch {
            self.arch
        }
        /// The forward kernel's cubin, log and resources.
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }
        /// The prepass's cubin, log and resources.
        pub fn compiled_vt(&self) -> &CompiledKernel {
            &self.compiled_vt
        }

        /// Prepass then forward on `stream`, with typed buffers. Shapes, strides, every
        /// buffer's length and alignment are checked before anything is enqueued.
        #[allow(clippy::type_complexity)]
        pub fn launch<T, Q, K, V, VT, O, L, S>(
            &self,
            stream: &Arc<CudaStream>,
            args: &Fp8Args,
            bufs: Fp8Buffers<'_, T, Q, K, V, VT, O, L, S>,
        ) -> Result<()>
        where
            Q: DevicePtr<u8>,
            K: DevicePtr<u8>,
            V: DevicePtr<u8>,
            VT: DevicePtrMut<u8>,
            O: DevicePtrMut<T>,
            L: DevicePtrMut<f32>,
            S: DevicePtr<f32>,
        {
            if std::mem::size_of::<T>() != 2 {
                return Err(NativeError::InvalidArgs(format!(
                    "O element type must be 2 bytes (f16/bf16), got {}",
                    std::mem::size_of::<T>()
                )));
            }
            self.config.validate_args(args)?;
            self.config.required_lens(args).check(&bufs.lens())?;
            let (q, _gq) = bufs.q.device_ptr(stream);
            let (k, _gk) = bufs.k.device_ptr(stream);
            let (v, _gv) = bufs.v.device_ptr(stream);
            let (vt, _gvt) = bufs.vt.device_ptr_mut(stream);
            let (o, _go) = bufs.o.device_ptr_mut(stream);
            let (lse, _gl) = bufs.lse.device_ptr_mut(stream);
            let (q_descale, _gqd) = bufs.q_descale.device_ptr(stream);
            let (k_descale, _gkd) = bufs.k_descale.device_ptr(stream);
            let (v_descale, _gvd) = bufs.v_descale.device_ptr(stream);
            let ptrs = Fp8Ptrs { q, k, v, vt, o, lse, q_descale, k_descale, v_descale };
            // SAFETY: every buffer's length was checked against what the kernels touch.
            unsafe { self.launch_raw(stream, args, &ptrs) }
        }

        /// Prepass (V -> Vt) then forward, with raw device addresses.
        ///
        /// # Safety
        /// Each pointer must address device memory of at least [`Fp8MmaConfig::required_lens`]
        /// elements (bytes for the codes and Vt, 2-byte elements for O, f32 for LSE and the
        /// descales), valid until both kernels finish on `stream`; descales positive and finite.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, args: &Fp8Args, ptrs: &Fp8Ptrs) -> Result<()> {
            // SAFETY: forwarded contract.
            unsafe {
                self.launch_vt_raw(stream, args, ptrs)?;
                self.launch_fwd_raw(stream, args, ptrs)
            }
        }

        /// The V prepass alone: reads `ptrs.v`, writes `ptrs.vt`.
        ///
        /// # Safety
        /// As [`Self::launch_raw`] for `v` and `vt`.
        pub unsafe fn launch_vt_raw(&self, stream: &Arc<CudaStream>, args: &Fp8Args, ptrs: &Fp8Ptrs) -> Result<()> {
            self.config.validate_args(args)?;
            validate_ptrs(ptrs)?;
            let shape = Fp8VtParams::launch_shape(&args.shape);
            let params = Fp8VtParams::new(&args.shape, ptrs);
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: 0 };
            let mut b = stream.launch_builder(&self.vt);
            b.arg(&params);
            // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }

        /// The forward alone, on a Vt the prepass wrote for this V (`ptrs.v` is not read).
        ///
        /// # Safety
        /// As [`Self::launch_raw`]; `ptrs.vt` must hold the prepass output of the same
        /// `batch`, `kv_heads`, `kv_len` and head dim.
        pub unsafe fn launch_fwd_raw(&self, stream: &Arc<CudaStream>, args: &Fp8Args, ptrs: &Fp8Ptrs) -> Result<()> {
            self.config.validate_args(args)?;
            validate_ptrs(ptrs)?;
            let shape = self.config.launch_shape(args, self.arch)?;
            let params = Fp8MmaParams::new(args, ptrs);
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem_bytes };
            let mut b = stream.launch_builder(&self.fwd);
            b.arg(&params);
            // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

/// The key stored at byte position `pos` of a Vt row (the prepass's permutation within groups
/// of 16 keys); host-side mirror for tests and emulations.
pub fn vt_key_at(pos: usize) -> usize {
    let (g, l) = (pos / 16, pos % 16);
    16 * g + 2 * (l / 4) + (l % 2) + 8 * ((l / 2) % 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Fp8Args {
        use quattn_core::{Layout, Strides};
        let mut s = AttentionShape::contiguous(Layout::Bhsd, 2, 8, 2, 1000, 777, 128, true);
        s.scale = 0.088;
        s.v = Strides::new(Layout::Bshd, 2, 777, 128);
        s.o = Strides::new(Layout::Bshd, 8, 1000, 128);
        Fp8Args::new(s, DescaleGranularity::PerHead)
    }

    #[test]
    fn names_are_unique_and_start_with_the_family() {
        let mut names: Vec<String> = Fp8MmaUnit::all().iter().map(|u| u.name()).collect();
        assert_eq!(names.len(), 10);
        assert!(names.iter().all(|n| n.starts_with(KERNEL)), "{names:?}");
        assert!(names.contains(&"fwd_mma_fp8_pe4m3_f16_d128".to_string()), "{names:?}");
        assert!(names.contains(&"fwd_mma_fp8_vt_d64".to_string()), "{names:?}");
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn vt_permutation_is_a_bijection_matching_the_accumulator_layout() {
        // Position 4t + i of a 16-key group: lane t's accumulator keys 2t, 2t+1 (n8 tile 0) and
        // 8 + 2t, 9 + 2t (n8 tile 1), in that byte order.
        for t in 0..4 {
            assert_eq!([0, 1, 2, 3].map(|i| vt_key_at(4 * t + i)), [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]);
        }
        let mut seen = [false; 64];
        for pos in 0..64 {
            let k = vt_key_at(pos);
            assert_eq!(k / 16, pos / 16);
            assert!(!seen[k]);
            seen[k] = true;
        }
    }

    #[test]
    fn targets_and_expected_instructions() {
        assert_eq!(Fp8MmaConfig::target_for((8, 9)), Some(Arch::Sm89));
        assert_eq!(Fp8MmaConfig::target_for((9, 0)), Some(Arch::Sm90));
        assert_eq!(Fp8MmaConfig::target_for((12, 0)), Some(Arch::Sm120a));
        assert_eq!(Fp8MmaConfig::target_for((8, 6)), None);
        assert_eq!(Fp8MmaConfig::target_for((10, 0)), None);
        let a = Fp8MmaConfig::new(128, Fp8P::F16, Dtype::F16).unwrap();
        let b = Fp8MmaConfig::new(128, Fp8P::E4m3, Dtype::F16).unwrap();
        assert_eq!(a.expected_instructions(Arch::Sm89), vec!["QMMA.16832.F32.E4M3.E4M3", "HMMA.16816.F32"]);
        assert_eq!(b.expected_instructions(Arch::Sm120a), vec!["QMMA.16832.F32.E4M3.E4M3"]);
        assert_eq!(b.expected_instructions(Arch::Sm90), vec!["HMMA.16816.F32"]);
        assert!(a.request(Arch::Sm80).is_err());
        assert!(Fp8VtConfig::new(64).unwrap().request(Arch::Sm86).is_err());
    }

    #[test]
    fn config_validation_mirrors_the_kernel() {
        assert!(matches!(
            Fp8MmaConfig::new(96, Fp8P::F16, Dtype::F16),
            Err(NativeError::UnsupportedHeadDim { head_dim: 96, .. })
        ));
        let mut cfg = Fp8MmaConfig::new(128, Fp8P::E4m3, Dtype::Bf16).unwrap();
        assert_eq!(cfg.smem_bytes_for(Arch::Sm89).unwrap(), 4 * 64 * 128 + 128 * 128);
        assert_eq!(cfg.smem_bytes_for(Arch::Sm90).unwrap(), 4 * 64 * 128);
        let d = cfg.defines(Arch::Sm89).unwrap();
        assert!(d.contains(&("WARPS".into(), "4".into())) && d.contains(&("Q_IN_REGS".into(), "0".into())));
        let d90 = cfg.defines(Arch::Sm90).unwrap();
        assert!(d90.contains(&("WARPS".into(), "8".into())) && d90.contains(&("ROWS_PER_WARP".into(), "16".into())));
        assert!(d.contains(&("P_FP8".into(), "1".into())) && d.contains(&("OUT_BF16".into(), "1".into())));
        cfg.tile = Some(HmmaTile { warps: 4, block_n: 96, rows_per_warp: 32, q_in_regs: false });
        assert!(matches!(cfg.validate(), Err(NativeError::UnsupportedConfig { .. })));
        cfg.tile = Some(HmmaTile { warps: 8, block_n: 64, rows_per_warp: 16, q_in_regs: true });
        cfg.validate().unwrap();
        assert!(cfg.name().ends_with("_d128_w8n64"), "{}", cfg.name());
        // 32 keys: O does not fit in the two stages.
        cfg.tile = Some(HmmaTile { warps: 4, block_n: 32, rows_per_warp: 32, q_in_regs: false });
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn params_layout_matches_the_kernel_structs() {
        // 8 pointers + 9 strides (8 bytes) + 12 four-byte fields.
        assert_eq!(std::mem::size_of::<Fp8MmaParams>(), 17 * 8 + 12 * 4);
        // 2 pointers + 3 strides + 4 four-byte fields.
        assert_eq!(std::mem::size_of::<Fp8VtParams>(), 5 * 8 + 4 * 4);
        let a = args();
        let ptrs = Fp8Ptrs { q: 16, k: 32, v: 48, vt: 64, o: 80, lse: 96, q_descale: 100, k_descale: 104, v_descale: 108 };
        let p = Fp8MmaParams::new(&a, &ptrs);
        assert_eq!((p.q_len, p.kv_len, p.kv_group, p.causal, p.vt_len), (1000, 777, 4, 1, 896));
        assert_eq!((p.q_desc_batch, p.q_desc_head, p.kv_desc_batch, p.kv_desc_head), (8, 1, 2, 1));
        assert_eq!((p.q_desc, p.k_desc, p.v_desc, p.vt), (100, 104, 108, 64));
        let pt = Fp8MmaParams::new(&Fp8Args { descale: DescaleGranularity::PerTensor, ..a }, &ptrs);
        assert_eq!((pt.q_desc_batch, pt.q_desc_head, pt.kv_desc_batch, pt.kv_desc_head), (0, 0, 0, 0));
        let vp = Fp8VtParams::new(&a.shape, &ptrs);
        assert_eq!((vp.v_seq_stride, vp.vt_len, vp.kv_heads, vp.v), (2 * 128, 896, 2, 48));
        assert_eq!(Fp8VtParams::launch_shape(&a.shape).grid, (14, 2, 2));
    }

    #[test]
    fn required_lengths_and_validation() {
        let cfg = Fp8MmaConfig::new(128, Fp8P::F16, Dtype::F16).unwrap();
        let mut a = args();
        cfg.validate_args(&a).unwrap();
        let lens = cfg.required_lens(&a);
        assert_eq!(lens.vt, 2 * 2 * 128 * 896);
        assert_eq!((lens.q_descale, lens.k_descale, lens.v_descale), (16, 4, 4));
        assert_eq!(lens.o, 2 * 8 * 1000 * 128);
        for arch in Fp8MmaConfig::TARGETS {
            assert_eq!(cfg.launch_shape(&a, *arch).unwrap().grid, (8, 8, 2));
        }
        assert_eq!(cfg.launch_shape(&a, Arch::Sm90).unwrap().block, (256, 1, 1));
        a.shape.v.seq = 136;
        assert!(cfg.validate_args(&a).is_err());
        a.shape.v.seq = 256;
        a.shape.kv_heads = 3;
        assert!(cfg.validate_args(&a).is_err());
        a.shape.kv_heads = 2;
        a.shape.scale = 0.0;
        assert!(cfg.validate_args(&a).is_err());
        a.shape.scale = 0.088;
        a.shape.kv_len = 0;
        assert!(cfg.validate_args(&a).is_err(), "the mma family needs a key");
        a.shape.kv_len = 777;
        cfg.validate_args(&a).unwrap();
        let good = Fp8Ptrs { q: 256, k: 512, v: 768, vt: 1024, o: 1280, lse: 1536, q_descale: 1540, k_descale: 1544, v_descale: 1548 };
        validate_ptrs(&good).unwrap();
        assert!(validate_ptrs(&Fp8Ptrs { vt: 1032, ..good }).is_err());
        assert!(validate_ptrs(&Fp8Ptrs { v_descale: 0, ..good }).is_err());
    }
}
