//! The FP8 wgmma forward family (`cuda/fwd_wgmma_fp8.cu`): FlashAttention-3-FP8-style attention
//! on Hopper with Q·Kᵀ and P·V both on E4M3 warpgroup MMAs (`wgmma.mma_async ...
//! k32.f32.e4m3.e4m3`), f32 accumulation, f32 online softmax, P rounded to E4M3 in registers and
//! fed to P·V as its register A operand. sm_90a only. Same CTA as the TMA kernels of
//! [`crate::wgmma`] / [`crate::wgmma_int8`]: a TMA producer warpgroup, two (or, at head dim 64,
//! three) consumer warpgroups of 64 query rows taking their wgmma turns round robin, `block_n`
//! keys per KV tile, `stages` K/V stages. At head dim 64 the row sums of P come from the P·V
//! wgmma (`rowsum_mma`: 8 columns of E4M3 ones appended to Vᵀ in shared memory), so `l` sums the
//! E4M3-rounded P there.
//!
//! # Host contract
//! * Q `[b, q_heads, q_len, d]`, K and V `[b, kv_heads, kv_len, d]`: E4M3 codes (`u8`), strides
//!   in bytes, `d` 64
//!   or 128. Value `x = decode(code) * descale`. Q, K and V strides are multiples of 16 bytes,
//!   their addresses 16-byte aligned (TMA reads Q and K, the prepass V in 16-byte pieces).
//! * Descales (f32, positive, finite) per [`DescaleGranularity`]: one per tensor (`[1]` each), or one
//!   per (batch, head) (`q_descale [b * q_heads]`, `k_descale` / `v_descale [b * kv_heads]`).
//! * FP8 wgmma reads only K-major operands, so V reaches the attention kernel as Vᵀ: the
//!   prepass ([`Fp8WgmmaKernel::launch_prepass`]) writes `vt [b, kv_heads, d, kv_pad]` codes,
//!   `kv_pad = `[`kv_pad`] (kv_len rounded up to 128), keys permuted inside each
//!   group of 32 so that the S accumulator registers are P's A fragment as they are (the kernel
//!   header derives the permutation), zeros past kv_len. It runs on the same stream; a caller
//!   that reuses V (a KV cache) may keep `vt` and skip it.
//! * O `[b, q_heads, q_len, d]` (any strides, multiples of 8 elements) in f16 or bf16
//!   ([`Dtype`]); LSE `[b, q_heads, q_len]` f32, natural log, `-inf` for rows that see no key.
//! * Softmax scale > 0; bottom-right causal mask; GQA (`q_heads % kv_heads == 0`).
//!
//! # Numerics
//! `s` = f32 dot product of the codes, `c = scale · log2 e · q_descale · k_descale`, online
//! softmax with the running max `m` (raw units), `p = exp2(s c − m c)`, P stored as
//! `e4m3(448 · 2^−r · p)` with `r = rescale_log2`: the max moves once some row of a warp grew by
//! more than `r` (log2 units), so a stale max leaves `p ≤ 2^r` and P ≤ 448. The table variants
//! have `r = 0` (the max moves whenever it grows, `P = e4m3(448 p)`, `p ≤ 1`: the quantization
//! of quattn's FP8 emulation with `PvFormat::Fp8`). `l` sums the unrounded values, O = acc ·
//! v_descale / l, LSE = (m c + log2 l − log2(448 · 2^−r)) ln 2.
//!
//! The E4M3 wgmma adds its products into the f32 accumulator with a significand of about 13
//! bits, not 24 (measured on the H100: scores differ from their exact f32 sums by ~1e-3
//! relative, O of a 16k-key row is ~7e-4 low; with Q·Kᵀ partial sums that are exact in 12 bits
//! the kernel matches an emulation of its arithmetic to 3e-4 relative L2 and 3e-6 in LSE). So
//! LSE is off by up to ~1e-3 of the largest score (log2 units) and O by a few 1e-3 relative on
//! top of P's E4M3 rounding (~1% relative L2 against f64 attention on the dequantized inputs).
//!
//! # Run on the H100
//! `examples/wgmma_fp8_check.rs` passes on every variant (f64 reference, emulation on exact-S
//! inputs, Vᵀ prepass read back, stale-max cases, GQA, causal, ragged, bshd, 16k keys) and
//! times it against the f16 wgmma family: the table tiles ([`FP8_TILES`]) run at 1.16-1.54x its
//! TFLOP/s at hd 128 (median of the two runs 1.36x) and 1.03-1.29x at hd 64.

use crate::arch::Arch;
use crate::cache::{CompileRequest, KernelSource};
use crate::error::{NativeError, Result};
use quattn_core::{AttentionShape, DescaleGranularity, Dtype, Strides};

pub use crate::fp8::{Fp8Args, Fp8LaunchShape, Fp8Lens, Fp8Ptrs};
use crate::report::KernelVariant;
use crate::tma::{RowsTensor, TmaSpec, WS_PRODUCER_REGS};

/// Prefix of every variant name (and the family name of the registry). Not `fwd_wgmma_...`:
/// the f16 family's tests select their variants by that prefix.
const KERNEL: &str = "fwd_fp8_wgmma";

/// The attention kernel's source (entry `fwd_wgmma_fp8`).
pub static FWD_WGMMA_FP8: KernelSource =
    KernelSource { file: "fwd_wgmma_fp8.cu", entry: "fwd_wgmma_fp8", text: include_str!("../cuda/fwd_wgmma_fp8.cu") };
/// The Vᵀ prepass: the same file compiled with `VT_PREPASS=1` (entry `fp8_vt_prepass`).
pub static FP8_VT_PREPASS: KernelSource =
    KernelSource { file: "fwd_wgmma_fp8.cu", entry: "fp8_vt_prepass", text: include_str!("../cuda/fwd_wgmma_fp8.cu") };

/// Vᵀ rows are padded to a multiple of this many keys (the KV tile of 128 keys; the 192-key tile
/// reads past the padding as TMA zeros).
pub const FP8_KV_PAD: u32 = 128;

/// `(head dim, keys per KV tile, stages, consumer warpgroups, row sums from the P·V wgmma)` of
/// the table variants. The 2-warpgroup tiles were measured on one H100 80GB HBM3
/// with `examples/wgmma_fp8_check.rs`: TFLOP/s of the attention kernel alone (median of 20),
/// (seq, batch, heads) = (4k, 16, 16) / (8k, 8, 16) / (16k, 4, 16), non-causal and causal, two
/// runs of the same binary on two machines (run-to-run spread up to ~10%); the f16 wgmma table
/// kernel in the same processes for reference.
///
/// | hd 128 (keys, stages)  | 4k nc / c             | 8k nc / c             | 16k nc / c            |
/// |------------------------|-----------------------|-----------------------|-----------------------|
/// | 128, 2                 | 701-811 / 614-705     | 850-871 / 747-750     | 752-895 / 839-876     |
/// | 128, 3                 | 811-822 / 687-727     | 727-838 / 779-810     | 773-793 / 813-814     |
/// | **192, 2**             | **776-860 / 721-767** | **863-946 / 697-805** | **864-976 / 875-901** |
/// | 192, 3                 | 730-731 / 713-768     | 875-892 / 804-855     | 869-886 / 873         |
/// | 192, 2, exp2_poly 4    | 729-765 / 651-659     | 774-796 / 715-721     | 780-788 / 770-787     |
/// | 192, 2, exp2_poly 8    | 796-798 / 702-725     | 849 / 766             | 814-826 / 827-832     |
/// | f16 wgmma              | 630-670 / 592-603     | 617-635 / 569-580     | 635-636 / 595-597     |
///
/// | hd 64                  | 4k nc / c             | 8k nc / c             | 16k nc / c            |
/// |------------------------|-----------------------|-----------------------|-----------------------|
/// | 128, 2                 | 420 / 377             | 449 / 402             | 461 / 429             |
/// | **192, 2**             | **497-518 / 418-433** | **557-575 / 493-496** | **588-603 / 551-555** |
/// | 192, 2, exp2_poly 4    | 453-454 / 403         | 485 / 445             | 495 / 474             |
/// | 192, 2, exp2_poly 8    | 476-477 / 412-413     | 514 / 457             | 534-535 / 488         |
/// | f16 wgmma              | 454 / 405             | 455 / 395             | 457 / 432             |
///
/// 192 keys with 2 stages is the best or within the spread of the best everywhere; the stale-max
/// threshold 8 (`rescale_log2`) is within the spread too, and moving exp2 onto the FMA pipes
/// (`exp2_poly`, every 4th or 8th score) is slower at both head dims: the degree-6 polynomial's
/// eleven instructions per score cost the softmax warp more issue time than the MUFU time they
/// free. So does a cubic (`exp2_cubic`, eight instructions): on one H200 with the launches
/// interleaved (`benchmarks/2026-11-29-h200-za/exp2-cubic`), every 8th score ran 1-4% slower at
/// hd 128 and 4-8% at hd 64, every 4th 4-10% and 12-17%, though MUFU.EX2 is the busiest pipe at
/// hd 64.
///
/// At hd 64 the softmax bounds the kernel (about 7 instructions and one MUFU.EX2 per score against
/// half the MMA work of hd 128), so it takes what FlashAttention-3 takes there, three consumer
/// warpgroups (192 query rows, 128 keys, 160 registers a thread), and the row sums of P from the
/// P·V wgmma instead of one add per score, with 3 K/V stages. On one H200 at 16k
/// (`benchmarks/2026-11-29-h200-a`, `fp8_check.txt`), non-causal / causal TFLOP/s: 192 keys, 2
/// warpgroups 597 / 565; 3 warpgroups 635 / 598; with the row sums 674 / 628 at 2 stages and
/// 685 / 654 at 3 (the table variant; also the best at 4k and 8k). At hd 128 neither pays: with
/// the row sums 921 / 917, 224-key tiles 888 / 893, against 957 / 905 for 192 keys. Nor does the
/// Vᵀ swizzle: Vᵀ in whole 128-key blocks with the 128-byte swizzle (the last block of a tile
/// loaded whole) ran 192-key tiles at 883-885 non-causal against 963-965 for the 64-byte
/// blocks, and 224-key tiles at 887-888 against 884-895 for the 32-byte ones
/// (`benchmarks/2026-11-29-h200-w`): the extra Vᵀ bytes cost more than any swizzle gains.
pub const FP8_TILES: [(u32, u32, u32, u32, bool); 2] = [(64, 128, 3, 3, true), (128, 192, 2, 2, false)];

/// One compiled attention variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Fp8WgmmaConfig {
    pub head_dim: u32,
    pub out: Dtype,
    /// Keys per KV tile: 128, 160, 192, 224 or 256.
    pub block_n: u32,
    /// Consumer warpgroups of 64 query rows (2 or 3), taking their wgmma turns round robin.
    pub wgs: u32,
    /// The row sums of P from the P·V wgmma (8 columns of E4M3 ones appended to V) instead of
    /// one f32 add per score; `l` then sums the E4M3-rounded P.
    pub rowsum_mma: bool,
    /// K/V TMA stages (2 to 4).
    pub stages: u32,
    /// The stale-max threshold `r` in log2 units (0 to 8); P is stored as `e4m3(448 · 2^−r · p)`.
    pub rescale_log2: u32,
    /// 0: every exp2 on the MUFU unit; k (2 to 8): every k-th score of the unmasked tiles by a
    /// polynomial on the FMA pipes (as accurate as `ex2.approx`).
    pub exp2_poly: u32,
    /// With `exp2_poly`: a cubic instead of the degree-6 polynomial (relative error at most
    /// 7.5e-5, far inside E4M3's steps of 2^-3).
    pub exp2_cubic: bool,
}

/// A compiled unit of the family: an attention variant or the Vᵀ prepass of a head dim (the
/// registry's and the compile report's unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp8WgmmaUnit {
    Attention(Fp8WgmmaConfig),
    VTranspose { head_dim: u32 },
}

impl Fp8WgmmaConfig {
    pub const HEAD_DIMS: &'static [usize] = &[64, 128];
    /// wgmma exists only on the `a` target of compute capability 9.0.
    pub const TARGETS: &'static [Arch] = &[Arch::Sm90a];

    /// Validated constructor: the table variant of the head dim ([`FP8_TILES`], `rescale_log2`
    /// 0: the max moves whenever it grows, the facade emulation's quantization of P).
    pub fn new(head_dim: usize, out: Dtype) -> Result<Self> {
        let Some(&(_, block_n, stages, wgs, rowsum_mma)) = FP8_TILES.iter().find(|t| t.0 as usize == head_dim) else {
            return Err(NativeError::UnsupportedHeadDim { kernel: KERNEL, head_dim, supported: Self::HEAD_DIMS });
        };
        let c = Fp8WgmmaConfig {
            head_dim: head_dim as u32,
            out,
            block_n,
            wgs,
            rowsum_mma,
            stages,
            rescale_log2: 0,
            exp2_poly: 0,
            exp2_cubic: false,
        };
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<()> {
        if self.out == Dtype::F32 {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: "O is f16 or bf16".into() });
        }
        if !Self::HEAD_DIMS.contains(&(self.head_dim as usize)) {
            return Err(NativeError::UnsupportedHeadDim {
                kernel: KERNEL,
                head_dim: self.head_dim as usize,
                supported: Self::HEAD_DIMS,
            });
        }
        if ![128, 160, 192, 224, 256].contains(&self.block_n) {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("BLOCK_N {} (128, 160, 192, 224 or 256)", self.block_n),
            });
        }
        if !(self.wgs == 2 || self.wgs == 3) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("{} consumer warpgroups (2 or 3)", self.wgs) });
        }
        if !(2..=4).contains(&self.stages) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("{} stages (2 to 4)", self.stages) });
        }
        if self.smem_bytes_unchecked() > 227 * 1024 {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("{} bytes of shared memory", self.smem_bytes_unchecked()),
            });
        }
        if !(self.exp2_poly == 0 || (2..=8).contains(&self.exp2_poly)) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("exp2_poly {} (0 or 2 to 8)", self.exp2_poly) });
        }
        if self.exp2_cubic && self.exp2_poly == 0 {
            // Without exp2_poly it would change nothing but the config, whose name is the plain one.
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: "exp2_cubic without exp2_poly".into() });
        }
        if self.rescale_log2 > 8 {
            return Err(NativeError::UnsupportedConfig {
                kernel: KERNEL,
                reason: format!("rescale_log2 {} would let a stale max push P past 448 (0 to 8)", self.rescale_log2),
            });
        }
        Ok(())
    }

    /// Every attention variant the report and tests compile: head dim x O type with the table
    /// tile, and at f16 the other tiles (128 / 192 keys, 2 / 3 stages), the stale-max threshold 8,
    /// polynomial exp2 on every 4th or 8th score, wider tiles and three consumer warpgroups, kept
    /// compiled for sweeps on the H100.
    pub fn all() -> Vec<Fp8WgmmaConfig> {
        let mut v: Vec<Fp8WgmmaConfig> = Vec::new();
        let push = |v: &mut Vec<Fp8WgmmaConfig>, c: Fp8WgmmaConfig| {
            if !v.contains(&c) {
                v.push(c);
            }
        };
        for head_dim in [64, 128] {
            for out in [Dtype::F16, Dtype::Bf16] {
                if let Ok(c) = Fp8WgmmaConfig::new(head_dim, out) {
                    push(&mut v, c);
                }
            }
            let Ok(table) = Fp8WgmmaConfig::new(head_dim, Dtype::F16) else { continue };
            // Two consumer warpgroups, 192 keys, 2 stages: the sweeps vary one thing from here.
            let classic = Fp8WgmmaConfig { wgs: 2, rowsum_mma: false, block_n: 192, stages: 2, ..table };
            for block_n in [128, 192] {
                for stages in [2, 3] {
                    for rescale_log2 in [0, 8] {
                        push(&mut v, Fp8WgmmaConfig { block_n, stages, rescale_log2, ..classic });
                    }
                }
            }
            for exp2_poly in [4, 8] {
                push(&mut v, Fp8WgmmaConfig { exp2_poly, ..classic });
            }
            // Wider tiles (the 32-byte-swizzled Vᵀ blocks of 160 and 224 keys), three consumer
            // warpgroups (192 query rows at 160 registers a thread) and the row sums from the
            // P·V wgmma.
            let wide: &[(u32, u32, u32, bool)] = if head_dim == 64 {
                &[
                    (3, 128, 2, false),
                    (3, 160, 2, false),
                    (3, 160, 3, false),
                    (2, 224, 2, false),
                    (2, 256, 2, false),
                    (3, 128, 2, true),
                    (3, 128, 3, true),
                    (2, 192, 2, true),
                ]
            } else {
                &[(2, 160, 2, false), (2, 224, 2, false), (2, 192, 2, true)]
            };
            for &(wgs, block_n, stages, rowsum_mma) in wide {
                push(&mut v, Fp8WgmmaConfig { wgs, block_n, stages, rowsum_mma, ..classic });
            }
            // The table tile with a cubic exp2 on the FMA pipes for every 4th or 8th score.
            for exp2_poly in [4, 8] {
                push(&mut v, Fp8WgmmaConfig { exp2_poly, exp2_cubic: true, ..table });
            }
        }
        v
    }

    /// `fwd_fp8_wgmma_e4m3_f16_d128_n128_tma2`, `_w3` for three consumer warpgroups, `_rs` for the
    /// row sums from the P·V wgmma, `_r8` for a
    /// stale-max threshold, `_p4` for polynomial exp2 on every 4th score.
    pub fn name(&self) -> String {
        let w = if self.wgs == 2 { String::new() } else { format!("_w{}", self.wgs) };
        let w = if self.rowsum_mma { format!("{w}_rs") } else { w };
        let r = if self.rescale_log2 == 0 { String::new() } else { format!("_r{}", self.rescale_log2) };
        let p = match (self.exp2_poly, self.exp2_cubic) {
            (0, _) => String::new(),
            (k, false) => format!("_p{k}"),
            (k, true) => format!("_p{k}c"),
        };
        format!("{KERNEL}_e4m3_{}_d{}_n{}{w}_tma{}{r}{p}", self.out.name(), self.head_dim, self.block_n, self.stages)
    }

    /// Columns of the P·V wgmma: the head dim, and 8 columns of row sums with `rowsum_mma`.
    pub fn pv_n(&self) -> u32 {
        self.head_dim + if self.rowsum_mma { 8 } else { 0 }
    }

    /// Query rows per CTA: 64 per consumer warpgroup.
    pub fn block_m(&self) -> u32 {
        64 * self.wgs
    }

    /// Threads per CTA: the producer warpgroup and the consumers.
    pub fn threads(&self) -> u32 {
        128 * (self.wgs + 1)
    }

    /// Registers per consumer thread after `setmaxnreg`: what the 64 Ki register file leaves each
    /// consumer lane beside the producer's [`WS_PRODUCER_REGS`], in setmaxnreg's steps of 8
    /// ([`crate::tma::WS_CONSUMER_REGS`], 240, for two consumers; 160 for three).
    pub fn consumer_regs(&self) -> u32 {
        (65_536 / 128 - WS_PRODUCER_REGS) / self.wgs / 8 * 8
    }

    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.validate()?;
        let d = |k: &str, v: u32| (k.to_string(), v.to_string());
        Ok(vec![
            d("HEAD_DIM", self.head_dim),
            d("OUT_BF16", (self.out == Dtype::Bf16) as u32),
            d("BLOCK_N", self.block_n),
            d("CONSUMER_WGS", self.wgs),
            d("ROWSUM_MMA", self.rowsum_mma as u32),
            d("KV_STAGES", self.stages),
            d("PRODUCER_REGS", WS_PRODUCER_REGS),
            d("CONSUMER_REGS", self.consumer_regs()),
            d("RESCALE_LOG2", self.rescale_log2),
            d("EXP2_POLY", self.exp2_poly),
            d("EXP2_POLY_DEG", if self.exp2_cubic { 3 } else { 6 }),
        ])
    }

    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        check_target(arch)?;
        Ok(CompileRequest { kernel: self.name(), source: &FWD_WGMMA_FP8, arch, defines: self.defines()? })
    }

    /// The prepass compile request for this head dim.
    pub fn prepass_request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Fp8WgmmaUnit::VTranspose { head_dim: self.head_dim }.request(arch)
    }

    /// Dynamic shared memory, mirror of `ws::SMEM_BYTES`: Q, the K and Vᵀ stages (one byte per
    /// element; a Vᵀ stage with its ones rows, rounded up to 1 KiB), the mbarriers (one for Q,
    /// four per stage) and 1024 bytes of alignment slack.
    pub fn smem_bytes(&self) -> Result<u32> {
        self.validate()?;
        Ok(self.smem_bytes_unchecked())
    }

    fn smem_bytes_unchecked(&self) -> u32 {
        let d = self.head_dim;
        let v_stage = (self.pv_n() * self.block_n).div_ceil(1024) * 1024;
        self.block_m() * d + self.stages * (self.block_n * d + v_stage) + 8 * (1 + 4 * self.stages) + 1024
    }

    /// Keys per Vᵀ column block (its swizzle span in bytes): the widest of 128, 64 and 32 that
    /// divides BLOCK_N.
    pub fn vt_block(&self) -> u32 {
        [128, 64, 32].into_iter().find(|b| self.block_n.is_multiple_of(*b)).unwrap_or(32)
    }

    /// SASS opcodes that must appear (nvdisasm 13.x spells the 8-bit float wgmma `QGMMA`): the
    /// E4M3 wgmma of Q·Kᵀ (m64n{block_n}k32) and of P·V (m64n{pv_n}k32), the TMA loads and the
    /// producer's register release.
    pub fn expected_instructions(&self) -> Vec<String> {
        let mut v = vec![
            format!("QGMMA.64x{}x32.F32.E4M3.E4M3", self.block_n),
            format!("QGMMA.64x{}x32.F32.E4M3.E4M3", self.pv_n()),
            "UTMALDG.4D".into(),
            "USETMAXREG.DEALLOC.CTAPOOL".into(),
        ];
        v.dedup();
        v
    }

    /// [`Arch::Sm90a`] for compute capability 9.0, else `None`.
    pub fn target_for(cc: (u32, u32)) -> Option<Arch> {
        Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| Self::TARGETS.contains(a))
    }

    /// Grid `(ceil(q_len / block_m), q_heads, batch)`, 128 (wgs + 1) threads.
    pub fn launch_shape(&self, args: &Fp8Args) -> Result<Fp8LaunchShape> {
        let s = &args.shape;
        let m_blocks = s.q_len.div_ceil(self.block_m() as usize);
        Ok(Fp8LaunchShape {
            grid: (m_blocks as u32, s.q_heads as u32, s.batch as u32),
            block: (self.threads(), 1, 1),
            smem_bytes: self.smem_bytes()?,
        })
    }

    /// The three tensor maps: Q boxes of `block_m` rows and K boxes of `block_n` rows, hd bytes wide
    /// (128B swizzle at hd 128, 64B at hd 64), Vᵀ boxes of hd rows x [`Self::vt_block`] keys
    /// (the swizzle of that span), all rank 4.
    pub fn tma_specs(&self, args: &Fp8Args, q: u64, k: u64, vt: u64) -> Result<[TmaSpec; 3]> {
        self.validate_args(args)?;
        let s = &args.shape;
        let d = self.head_dim as usize;
        let swizzle = if d == 128 { 128 } else { 64 };
        let t = |addr, heads, len, strides| RowsTensor { addr, elem_bytes: 1, head_dim: d, len, heads, batch: s.batch, strides };
        let pad = kv_pad(s);
        let vt_strides = Strides { seq: pad, head: d * pad, batch: s.kv_heads * d * pad };
        Ok([
            TmaSpec::rows("Q", t(q, s.q_heads, s.q_len, s.q), d as u32, self.block_m(), swizzle)?,
            TmaSpec::rows("K", t(k, s.kv_heads, s.kv_len.max(1), s.k), d as u32, self.block_n, swizzle)?,
            TmaSpec::rows(
                "Vt",
                RowsTensor { addr: vt, elem_bytes: 1, head_dim: pad, len: d, heads: s.kv_heads, batch: s.batch, strides: vt_strides },
                self.vt_block(),
                d as u32,
                self.vt_block(),
            )?,
        ])
    }
}

fn check_target(arch: Arch) -> Result<()> {
    if Fp8WgmmaConfig::TARGETS.contains(&arch) {
        Ok(())
    } else {
        Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("wgmma needs sm_90a, not {arch}") })
    }
}

impl Fp8WgmmaUnit {
    /// Every compiled unit: the attention variants, then the prepass per head dim.
    pub fn all() -> Vec<Fp8WgmmaUnit> {
        let mut v: Vec<Fp8WgmmaUnit> = Fp8WgmmaConfig::all().into_iter().map(Fp8WgmmaUnit::Attention).collect();
        v.extend([64u32, 128].map(|head_dim| Fp8WgmmaUnit::VTranspose { head_dim }));
        v
    }
}

impl KernelVariant for Fp8WgmmaUnit {
    fn name(&self) -> String {
        match self {
            Fp8WgmmaUnit::Attention(c) => c.name(),
            Fp8WgmmaUnit::VTranspose { head_dim } => format!("{KERNEL}_vt_d{head_dim}"),
        }
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        match self {
            Fp8WgmmaUnit::Attention(c) => c.request(arch),
            Fp8WgmmaUnit::VTranspose { head_dim } => {
                check_target(arch)?;
                if !Fp8WgmmaConfig::HEAD_DIMS.contains(&(*head_dim as usize)) {
                    return Err(NativeError::UnsupportedHeadDim {
                        kernel: KERNEL,
                        head_dim: *head_dim as usize,
                        supported: Fp8WgmmaConfig::HEAD_DIMS,
                    });
                }
                Ok(CompileRequest {
                    kernel: self.name(),
                    source: &FP8_VT_PREPASS,
                    arch,
                    defines: vec![("HEAD_DIM".into(), head_dim.to_string()), ("VT_PREPASS".into(), "1".into())],
                })
            }
        }
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        match self {
            Fp8WgmmaUnit::Attention(c) => c.expected_instructions(),
            // One 16-byte store of 16 transposed codes per thread.
            Fp8WgmmaUnit::VTranspose { .. } => vec!["STG.E.128".into()],
        }
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        match self {
            Fp8WgmmaUnit::Attention(c) => c.smem_bytes().unwrap_or(0),
            Fp8WgmmaUnit::VTranspose { .. } => 0,
        }
    }
}

/// Keys per Vᵀ row: kv_len rounded up to [`FP8_KV_PAD`] (at least one tile).
pub fn kv_pad(s: &AttentionShape) -> usize {
    s.kv_len.max(1).div_ceil(FP8_KV_PAD as usize) * FP8_KV_PAD as usize
}

/// Mirror of `Fp8FwdParams` in `fwd_wgmma_fp8.cu`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8WgmmaParams {
    pub o: u64,
    pub lse: u64,
    pub q_descale: u64,
    pub k_descale: u64,
    pub v_descale: u64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_seq_stride: i64,
    pub q_len: i32,
    pub kv_len: i32,
    pub q_heads: i32,
    pub kv_heads: i32,
    pub kv_group: i32,
    pub causal: i32,
    pub descale_per_head: i32,
    pub scale_log2: f32,
}

/// Mirror of `Fp8VtParams` (the prepass).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8VtParams {
    pub v: u64,
    pub vt: u64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_seq_stride: i64,
    pub kv_len: i32,
    pub kv_pad: i32,
    pub kv_heads: i32,
    pub batch: i32,
}

impl Fp8WgmmaConfig {
    /// Validates everything about `args` that does not need device pointers (`kv_len == 0` is
    /// legal: every row then sees no key).
    pub fn validate_args(&self, args: &Fp8Args) -> Result<()> {
        self.validate()?;
        args.check(self.head_dim, kv_pad(&args.shape), true)
    }

    /// Minimum lengths (elements) of every buffer, Vᵀ `[b, kv_heads, d, kv_pad]` included.
    pub fn required_lens(&self, args: &Fp8Args) -> Fp8Lens {
        let s = &args.shape;
        args.lens(s.batch * s.kv_heads * self.head_dim as usize * kv_pad(s))
    }
}

impl Fp8WgmmaParams {
    /// The attention kernel's parameters (`ptrs.v` is not read).
    pub fn new(args: &Fp8Args, ptrs: &Fp8Ptrs) -> Fp8WgmmaParams {
        let s = &args.shape;
        Fp8WgmmaParams {
            o: ptrs.o,
            lse: ptrs.lse,
            q_descale: ptrs.q_descale,
            k_descale: ptrs.k_descale,
            v_descale: ptrs.v_descale,
            o_batch_stride: s.o.batch as i64,
            o_head_stride: s.o.head as i64,
            o_seq_stride: s.o.seq as i64,
            q_len: s.q_len as i32,
            kv_len: s.kv_len as i32,
            q_heads: s.q_heads as i32,
            kv_heads: s.kv_heads as i32,
            kv_group: (s.q_heads / s.kv_heads) as i32,
            causal: s.causal as i32,
            descale_per_head: (args.descale == DescaleGranularity::PerHead) as i32,
            scale_log2: s.scale * std::f32::consts::LOG2_E,
        }
    }
}

impl Fp8VtParams {
    /// The prepass's parameters.
    pub fn new(s: &AttentionShape, v: u64, vt: u64) -> Fp8VtParams {
        Fp8VtParams {
            v,
            vt,
            v_batch_stride: s.v.batch as i64,
            v_head_stride: s.v.head as i64,
            v_seq_stride: s.v.seq as i64,
            kv_len: s.kv_len as i32,
            kv_pad: kv_pad(s) as i32,
            kv_heads: s.kv_heads as i32,
            batch: s.batch as i32,
        }
    }
}

/// Column `k` of a group of 32 Vᵀ columns holds key `sigma(k)` of the group (the kernel header
/// derives it from the wgmma fragment layouts); host mirror of the prepass's `vt_sigma`.
pub fn vt_key_of_column(k: usize) -> usize {
    16 * (k / 16) + 8 * ((k % 4) / 2) + 2 * ((k % 16) / 4) + (k % 2)
}

#[cfg(feature = "cuda")]
pub use crate::fp8::Fp8Buffers;
#[cfg(feature = "cuda")]
pub use launch::Fp8WgmmaKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::{CompiledKernel, KernelCache};
    use crate::tma::TmaMapCache;

    // SAFETY: plain data with the kernels' C layouts (mirrors above).
    unsafe impl DeviceRepr for Fp8WgmmaParams {}
    unsafe impl DeviceRepr for Fp8VtParams {}

    /// One FP8 wgmma variant and its Vᵀ prepass, loaded into a CUDA context (cc 9.0 only).
    #[derive(Debug)]
    pub struct Fp8WgmmaKernel {
        config: Fp8WgmmaConfig,
        function: CudaFunction,
        prepass: CudaFunction,
        compiled: Arc<CompiledKernel>,
        maps: TmaMapCache,
    }

    impl Fp8WgmmaKernel {
        pub fn load(ctx: &Arc<CudaContext>, config: Fp8WgmmaConfig) -> Result<Self> {
            Self::load_with_cache(ctx, config, KernelCache::global())
        }

        pub fn load_with_cache(ctx: &Arc<CudaContext>, config: Fp8WgmmaConfig, cache: &KernelCache) -> Result<Self> {
            config.validate()?;
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm90a, Fp8WgmmaConfig::target_for)?;
            let (function, compiled) = crate::device::load_function(ctx, cache, &config.request(arch)?, config.smem_bytes()?)?;
            let (prepass, _) = crate::device::load_function(ctx, cache, &config.prepass_request(arch)?, 0)?;
            Ok(Fp8WgmmaKernel { config, function, prepass, compiled, maps: TmaMapCache::default() })
        }

        pub fn config(&self) -> &Fp8WgmmaConfig {
            &self.config
        }
        pub fn compiled(&self) -> &CompiledKernel {
            &self.compiled
        }

        /// Prepass then attention on `stream`, every length and alignment checked first.
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
                return Err(NativeError::InvalidArgs(format!("O element type must be 2 bytes, got {}", std::mem::size_of::<T>())));
            }
            self.config.validate_args(args)?;
            self.config.required_lens(args).check(&bufs.lens())?;
            let (q, _gq) = bufs.q.device_ptr(stream);
            let (k, _gk) = bufs.k.device_ptr(stream);
            let (v, _gv) = bufs.v.device_ptr(stream);
            let (vt, _gvt) = bufs.vt.device_ptr_mut(stream);
            let (o, _go) = bufs.o.device_ptr_mut(stream);
            let (lse, _gl) = bufs.lse.device_ptr_mut(stream);
            let (q_descale, _g1) = bufs.q_descale.device_ptr(stream);
            let (k_descale, _g2) = bufs.k_descale.device_ptr(stream);
            let (v_descale, _g3) = bufs.v_descale.device_ptr(stream);
            // SAFETY: every buffer's length was checked against what the kernels touch.
            unsafe {
                self.launch_prepass_raw(stream, args, v, vt)?;
                self.launch_attention_raw(stream, args, &Fp8Ptrs { q, k, v, vt, o, lse, q_descale, k_descale, v_descale })
            }
        }

        /// The Vᵀ prepass alone (raw addresses: V codes, Vᵀ scratch of [`Fp8Lens::vt`] bytes).
        ///
        /// # Safety
        /// `v` must address [`Fp8Lens::v`] bytes and `vt` [`Fp8Lens::vt`] writable bytes (16-byte
        /// aligned), valid until the kernel finishes on `stream`.
        pub unsafe fn launch_prepass_raw(&self, stream: &Arc<CudaStream>, args: &Fp8Args, v: u64, vt: u64) -> Result<()> {
            self.config.validate_args(args)?;
            let s = &args.shape;
            if !vt.is_multiple_of(16) || vt == 0 || !v.is_multiple_of(16) || (v == 0 && s.kv_len > 0) {
                return Err(NativeError::InvalidArgs(format!(
                    "v {v:#x} / vt {vt:#x} pointers must be 16-byte aligned (vt non-null)"
                )));
            }
            // One CTA per 64 keys of a (batch, kv head); kv_pad is a multiple of 64.
            let tiles = kv_pad(s) / 64;
            if tiles > i32::MAX as usize {
                return Err(NativeError::InvalidArgs(format!("prepass grid of {tiles} key tiles")));
            }
            let params = Fp8VtParams::new(s, v, vt);
            let cfg = LaunchConfig {
                grid_dim: (tiles as u32, s.kv_heads as u32, s.batch as u32),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = stream.launch_builder(&self.prepass);
            b.arg(&params);
            // SAFETY: parameter struct matches the kernel; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }

        /// The attention kernel alone, reading the Vᵀ that a prepass wrote.
        ///
        /// # Safety
        /// Every pointer but `v` (not read) must address at least
        /// [`Fp8WgmmaConfig::required_lens`] elements, `vt`
        /// written by the prepass for the same V shape, descales positive and finite, all valid
        /// until the kernel finishes on `stream`.
        pub unsafe fn launch_attention_raw(&self, stream: &Arc<CudaStream>, args: &Fp8Args, ptrs: &Fp8Ptrs) -> Result<()> {
            self.config.validate_args(args)?;
            for (name, p, align) in [
                ("q", ptrs.q, 16),
                ("k", ptrs.k, 16),
                ("vt", ptrs.vt, 16),
                ("o", ptrs.o, 16),
                ("lse", ptrs.lse, 4),
                ("q_descale", ptrs.q_descale, 4),
                ("k_descale", ptrs.k_descale, 4),
                ("v_descale", ptrs.v_descale, 4),
            ] {
                if p == 0 || p % align != 0 {
                    return Err(NativeError::InvalidArgs(format!("{name} pointer {p:#x} is null or not {align}-byte aligned")));
                }
            }
            let shape = self.config.launch_shape(args)?;
            let params = Fp8WgmmaParams::new(args, ptrs);
            let maps = self.maps.maps(&self.config.tma_specs(args, ptrs.q, ptrs.k, ptrs.vt)?)?;
            let cfg = LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem_bytes };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            b.arg(&maps);
            // SAFETY: the parameter structs match the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_defines_smem_and_targets() {
        let c = Fp8WgmmaConfig::new(128, Dtype::F16).unwrap();
        assert_eq!(c.name(), "fwd_fp8_wgmma_e4m3_f16_d128_n192_tma2");
        assert_eq!(c.smem_bytes().unwrap(), 128 * 128 + 2 * 2 * 192 * 128 + 8 * 9 + 1024);
        let d = c.defines().unwrap();
        assert!(d.contains(&("OUT_BF16".into(), "0".into())) && d.contains(&("RESCALE_LOG2".into(), "0".into())));
        // Head dim 64: three consumer warpgroups, 128-key tiles, the row sums from P·V (m64n72).
        let b = Fp8WgmmaConfig::new(64, Dtype::Bf16).unwrap();
        assert_eq!(b.name(), "fwd_fp8_wgmma_e4m3_bf16_d64_n128_w3_rs_tma3");
        assert_eq!((b.block_m(), b.threads(), b.pv_n()), (192, 512, 72));
        assert_eq!(b.smem_bytes().unwrap(), 192 * 64 + 3 * (128 * 64 + 72 * 128) + 8 * 13 + 1024);
        assert!(b.defines().unwrap().contains(&("ROWSUM_MMA".to_string(), "1".to_string())));
        assert_eq!(
            b.expected_instructions(),
            vec![
                "QGMMA.64x128x32.F32.E4M3.E4M3".to_string(),
                "QGMMA.64x72x32.F32.E4M3.E4M3".into(),
                "UTMALDG.4D".into(),
                "USETMAXREG.DEALLOC.CTAPOOL".into()
            ]
        );
        assert!(Fp8WgmmaConfig { rescale_log2: 9, ..c }.validate().is_err());
        assert!(Fp8WgmmaConfig { exp2_cubic: true, ..c }.validate().is_err());
        assert!(Fp8WgmmaConfig { stages: 5, ..c }.validate().is_err());
        assert!(Fp8WgmmaConfig { block_n: 96, ..c }.validate().is_err());
        assert!(Fp8WgmmaConfig { block_n: 288, ..c }.validate().is_err());
        assert!(Fp8WgmmaConfig { wgs: 4, ..c }.validate().is_err());
        // Three consumer warpgroups: 192 query rows, 512 threads, 160 registers a consumer.
        let w3 = Fp8WgmmaConfig { head_dim: 64, block_n: 160, wgs: 3, ..c };
        assert_eq!(w3.name(), "fwd_fp8_wgmma_e4m3_f16_d64_n160_w3_tma2");
        assert_eq!((w3.block_m(), w3.threads(), w3.consumer_regs()), (192, 512, 160));
        assert_eq!(w3.smem_bytes().unwrap(), 192 * 64 + 2 * 2 * 160 * 64 + 8 * 9 + 1024);
        assert_eq!(w3.vt_block(), 32);
        assert!(w3.defines().unwrap().contains(&("CONSUMER_WGS".to_string(), "3".to_string())));
        assert!(WS_PRODUCER_REGS + 3 * w3.consumer_regs() <= 512);
        assert_eq!([128, 160, 192, 224, 256].map(|block_n| Fp8WgmmaConfig { block_n, ..c }.vt_block()), [128, 32, 64, 32, 128]);
        let n192 = Fp8WgmmaConfig { block_n: 192, stages: 3, ..c };
        assert_eq!(Fp8WgmmaConfig { block_n: 128, ..c }.name(), "fwd_fp8_wgmma_e4m3_f16_d128_n128_tma2");
        assert_eq!(n192.smem_bytes().unwrap(), 128 * 128 + 3 * 2 * 192 * 128 + 8 * 13 + 1024);
        assert_eq!(
            n192.expected_instructions()[..2],
            ["QGMMA.64x192x32.F32.E4M3.E4M3".to_string(), "QGMMA.64x128x32.F32.E4M3.E4M3".into()]
        );
        assert!(matches!(Fp8WgmmaConfig::new(96, Dtype::F16), Err(NativeError::UnsupportedHeadDim { .. })));
        assert!(matches!(c.request(Arch::Sm90), Err(NativeError::UnsupportedConfig { .. })));
        assert_eq!(Fp8WgmmaConfig::target_for((9, 0)), Some(Arch::Sm90a));
        assert_eq!(Fp8WgmmaConfig::target_for((8, 9)), None);
        assert_eq!(Fp8WgmmaConfig::target_for((10, 0)), None);
        let mut names: Vec<String> = Fp8WgmmaUnit::all().iter().map(|u| u.name()).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(names.contains(&"fwd_fp8_wgmma_vt_d64".to_string()));
        assert!(names.contains(&"fwd_fp8_wgmma_e4m3_f16_d64_n192_tma3_r8".to_string()));
    }

    #[test]
    fn vt_permutation_is_a_permutation_matching_the_fragments() {
        let mut seen = [false; 32];
        for k in 0..32 {
            seen[vt_key_of_column(k)] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // Lane t, row g: A positions 4t..4t+3 carry its accumulator keys 2t, 2t+1, 8+2t, 9+2t;
        // positions 16+4t.. carry 16+2t, 17+2t, 24+2t, 25+2t.
        for t in 0..4 {
            assert_eq!([0, 1, 2, 3].map(|e| vt_key_of_column(4 * t + e)), [2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t]);
            assert_eq!(
                [0, 1, 2, 3].map(|e| vt_key_of_column(16 + 4 * t + e)),
                [16 + 2 * t, 17 + 2 * t, 24 + 2 * t, 25 + 2 * t]
            );
        }
    }

    #[test]
    fn params_layout_and_args() {
        assert_eq!(std::mem::size_of::<Fp8WgmmaParams>(), 8 * 8 + 8 * 4);
        assert_eq!(std::mem::size_of::<Fp8VtParams>(), 5 * 8 + 4 * 4);
        let c = Fp8WgmmaConfig { block_n: 128, ..Fp8WgmmaConfig::new(128, Dtype::F16).unwrap() };
        let mut shape = AttentionShape::contiguous(quattn_core::Layout::Bhsd, 2, 8, 2, 1000, 777, 128, true);
        shape.scale = 0.088;
        shape.k = Strides::new(quattn_core::Layout::Bshd, 2, 777, 128);
        shape.o = Strides::new(quattn_core::Layout::Bshd, 8, 1000, 128);
        let a = Fp8Args::new(shape, DescaleGranularity::PerHead);
        c.validate_args(&a).unwrap();
        assert_eq!(kv_pad(&a.shape), 896);
        let l = c.required_lens(&a);
        assert_eq!((l.vt, l.q_descale, l.k_descale, l.lse), (2 * 2 * 128 * 896, 16, 4, 2 * 8 * 1000));
        let [q, k, vt] = c.tma_specs(&a, 0x1000, 0x2000, 0x3000).unwrap();
        assert_eq!((q.elem_bytes, q.dims, q.box_dims, q.swizzle_bytes), (1, [128, 1000, 8, 2], [128, 128, 1, 1], 128));
        assert_eq!((k.dims, k.strides), ([128, 777, 2, 2], [256, 128, 777 * 256]));
        assert_eq!((vt.dims, vt.strides, vt.box_dims), ([896, 128, 2, 2], [896, 128 * 896, 2 * 128 * 896], [128, 128, 1, 1]));
        let p = Fp8WgmmaParams::new(&a, &Fp8Ptrs { o: 1, lse: 2, q_descale: 3, k_descale: 4, v_descale: 5, ..Default::default() });
        assert_eq!((p.kv_group, p.descale_per_head, p.causal, p.scale_log2), (4, 1, 1, 0.088 * std::f32::consts::LOG2_E));
        let vp = Fp8VtParams::new(&a.shape, 16, 32);
        assert_eq!((vp.kv_pad, vp.kv_len, vp.v_seq_stride), (896, 777, 128));
        let mut bad = a;
        bad.shape.q.seq = 136;
        assert!(c.validate_args(&bad).is_err());
        let c64 = Fp8WgmmaConfig { block_n: 128, wgs: 2, rowsum_mma: false, ..Fp8WgmmaConfig::new(64, Dtype::F16).unwrap() };
        assert!(c64.validate_args(&a).is_err(), "head dim 128 arguments for a head dim 64 kernel");
        let mut a64 = a;
        a64.shape = AttentionShape { scale: 0.088, causal: true, ..AttentionShape::contiguous(quattn_core::Layout::Bhsd, 2, 8, 2, 1000, 777, 64, true) };
        let [q, _, vt] = c64.tma_specs(&a64, 0x1000, 0x2000, 0x3000).unwrap();
        assert_eq!((q.box_dims, q.swizzle_bytes), ([64, 128, 1, 1], 64));
        assert_eq!((vt.box_dims, vt.swizzle_bytes), ([128, 64, 1, 1], 128));
        // 192-key tiles: K boxes of 192 rows, Vᵀ in 64-key blocks with the 64B swizzle.
        let [_, k, vt] = Fp8WgmmaConfig { block_n: 192, ..c64 }.tma_specs(&a64, 0x1000, 0x2000, 0x3000).unwrap();
        assert_eq!((k.box_dims, vt.box_dims, vt.swizzle_bytes), ([64, 192, 1, 1], [64, 64, 1, 1], 64));
        // Three warpgroups, 160-key tiles: Q boxes of 192 rows, Vᵀ in 32-key blocks (32B swizzle).
        let [q, k, vt] = Fp8WgmmaConfig { block_n: 160, wgs: 3, ..c64 }.tma_specs(&a64, 0x1000, 0x2000, 0x3000).unwrap();
        assert_eq!((q.box_dims, k.box_dims), ([64, 192, 1, 1], [64, 160, 1, 1]));
        assert_eq!((vt.box_dims, vt.swizzle_bytes), ([32, 64, 1, 1], 32));
        assert_eq!(Fp8WgmmaConfig { block_n: 160, wgs: 3, ..c64 }.launch_shape(&a64).unwrap().block, (512, 1, 1));
    }
}
