//! The HIP kernel families' configurations: targets, the tile table, the `-D` defines, the
//! instructions each variant must contain, the launch ABI and the emulated rounding.

use quattn_core::{AttentionShape, DescaleGranularity, Dtype};

use super::layout::{EmulatedKernel, MfmaShape};
use super::source::{HipSource, FWD_MFMA, FWD_MFMA_FP8};
use crate::error::{NativeError, Result};

/// An AMD compile target (`--offload-arch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum GfxArch {
    /// CDNA3 (MI300X, MI325X): 64 KiB of LDS per workgroup, FP8 = e4m3fnuz.
    #[serde(rename = "gfx942")]
    Gfx942,
    /// CDNA4 (MI350X, MI355X): 160 KiB of LDS per workgroup, FP8 = OCP e4m3fn.
    #[serde(rename = "gfx950")]
    Gfx950,
}

/// The FP8 e4m3 encoding an arch's MFMA and conversions read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp8Encoding {
    /// OCP e4m3fn (bias 7, max 448, ±0, NaN = S.1111.111).
    E4m3Fn,
    /// e4m3fnuz (bias 8, max 240, one zero, NaN = 0x80).
    E4m3Fnuz,
}

impl Fp8Encoding {
    /// Largest finite value.
    pub const fn max(self) -> f32 {
        match self {
            Fp8Encoding::E4m3Fn => 448.0,
            Fp8Encoding::E4m3Fnuz => 240.0,
        }
    }
}

impl GfxArch {
    pub const ALL: [GfxArch; 2] = [GfxArch::Gfx942, GfxArch::Gfx950];

    pub const fn as_str(self) -> &'static str {
        match self {
            GfxArch::Gfx942 => "gfx942",
            GfxArch::Gfx950 => "gfx950",
        }
    }

    /// Parses a device's arch name, target features included (`gfx942:sramecc+:xnack-`).
    pub fn parse(name: &str) -> Option<GfxArch> {
        let base = name.trim().split(':').next().unwrap_or("");
        GfxArch::ALL.into_iter().find(|a| a.as_str() == base)
    }

    /// LDS a workgroup may allocate.
    pub const fn lds_bytes(self) -> u32 {
        match self {
            GfxArch::Gfx942 => 64 * 1024,
            GfxArch::Gfx950 => 160 * 1024,
        }
    }

    /// The FP8 encoding of the arch's MFMA.
    pub const fn fp8(self) -> Fp8Encoding {
        match self {
            GfxArch::Gfx942 => Fp8Encoding::E4m3Fnuz,
            GfxArch::Gfx950 => Fp8Encoding::E4m3Fn,
        }
    }

    /// The 32×32 MFMA of 16-bit inputs: `32x32x8` on CDNA3, `32x32x16` on CDNA4 (twice the K
    /// per instruction, same 32-cycle issue per the CDNA4 ISA guide).
    pub const fn mfma_16bit(self) -> MfmaShape {
        match self {
            GfxArch::Gfx942 => MfmaShape { k: 8 },
            GfxArch::Gfx950 => MfmaShape { k: 16 },
        }
    }

    /// The FP8 MFMA of a [`Fp8Mfma`] form.
    pub const fn mfma_fp8(self, form: Fp8Mfma) -> MfmaShape {
        match form {
            Fp8Mfma::X16 => MfmaShape { k: 16 },
            Fp8Mfma::X64 => MfmaShape { k: 64 },
        }
    }
}

impl std::fmt::Display for GfxArch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Workgroup tiling: `waves` waves of 32 query rows, `block_n` keys per KV tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HipTile {
    pub waves: u32,
    pub block_n: u32,
}

/// The tiling of both families: 4 waves (256 threads) share each K/V tile in LDS; 64-key tiles
/// make two Sᵀ accumulator tiles per wave (32 VGPRs), next to Oᵀ (16·D/32) and Qᵀ (D/4 VGPRs at
/// 16 bits): ~170 VGPRs of the 512 a lane may have at hd 128. The f8f6f4 `32x32x64` P·V needs
/// the 64 keys. One exception ([`HipKernelId::tile`]): [`HIP_TILE_GFX942_D128`].
pub const HIP_TILE: HipTile = HipTile { waves: 4, block_n: 64 };

/// The 16-bit family at hd 128 on gfx942: 64-key tiles take 35 KiB of LDS, one workgroup
/// (one wave per SIMD) on gfx942's 64 KiB; 32-key tiles take 18.5 KiB, three workgroups by LDS
/// and two waves per SIMD by registers. Chosen from the LDS and register counts of the
/// disassembly, not measured (no AMD device).
pub const HIP_TILE_GFX942_D128: HipTile = HipTile { waves: 4, block_n: 32 };

impl HipTile {
    pub const fn block_m(self) -> u32 {
        32 * self.waves
    }
    pub const fn threads(self) -> u32 {
        64 * self.waves
    }
}

/// Head dims of both families.
pub const HIP_HEAD_DIMS: &[usize] = &[64, 128];

/// The f16/bf16 MFMA forward (`native/hip/fwd_mfma.hip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct MfmaConfig {
    pub head_dim: u32,
    /// f16 or bf16 (Q, K, V and O).
    pub input: Dtype,
}

/// P·V of the FP8 family (the design note's options A and B).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum HipFp8P {
    /// P rounded to f16 against V decoded to f16, on the f16 MFMA (option A).
    F16,
    /// P as the device's e4m3 of `P_MAX · p` against V's codes on the fp8 MFMA (option B).
    Fp8,
}

/// The FP8 MFMA instruction of Q·Kᵀ (and of P·V with FP8 P).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Fp8Mfma {
    /// `v_mfma_f32_32x32x16_fp8_fp8` (gfx942 and gfx950): the same K and issue cost as
    /// gfx950's bf16 `32x32x16`.
    X16,
    /// `v_mfma_scale_f32_32x32x64_f8f6f4` with unit scales (gfx950 only): 4× the K at 2× the
    /// issue cycles of `X16` (CDNA4 ISA guide), so half the matrix-core time per tile.
    X64,
}

/// The FP8 MFMA forward (`native/hip/fwd_mfma_fp8.hip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct MfmaFp8Config {
    pub head_dim: u32,
    pub p: HipFp8P,
    /// f16 or bf16 O.
    pub out: Dtype,
    pub mfma: Fp8Mfma,
}

/// One compiled HIP variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum HipKernelId {
    Mfma(MfmaConfig),
    MfmaFp8(MfmaFp8Config),
}

fn check_head_dim(kernel: &'static str, head_dim: u32) -> Result<()> {
    if HIP_HEAD_DIMS.contains(&(head_dim as usize)) {
        Ok(())
    } else {
        Err(NativeError::UnsupportedHeadDim { kernel, head_dim: head_dim as usize, supported: HIP_HEAD_DIMS })
    }
}

fn check_16bit(kernel: &'static str, what: &str, d: Dtype) -> Result<()> {
    match d {
        Dtype::F16 | Dtype::Bf16 => Ok(()),
        Dtype::F32 => Err(NativeError::UnsupportedConfig { kernel, reason: format!("{what} must be f16 or bf16") }),
    }
}

impl MfmaConfig {
    pub fn new(head_dim: usize, input: Dtype) -> Result<Self> {
        let c = MfmaConfig { head_dim: head_dim as u32, input };
        check_head_dim("fwd_mfma", c.head_dim)?;
        check_16bit("fwd_mfma", "the input type", input)?;
        Ok(c)
    }
}

impl MfmaFp8Config {
    pub fn new(head_dim: usize, p: HipFp8P, out: Dtype, mfma: Fp8Mfma) -> Result<Self> {
        let c = MfmaFp8Config { head_dim: head_dim as u32, p, out, mfma };
        check_head_dim("fwd_mfma_fp8", c.head_dim)?;
        check_16bit("fwd_mfma_fp8", "O", out)?;
        Ok(c)
    }
}

impl HipKernelId {
    /// Every variant: the report's and the compile tests' list.
    pub fn all() -> Vec<HipKernelId> {
        let mut v = Vec::new();
        for hd in [64, 128] {
            for input in [Dtype::F16, Dtype::Bf16] {
                v.push(HipKernelId::Mfma(MfmaConfig { head_dim: hd, input }));
            }
            for mfma in [Fp8Mfma::X16, Fp8Mfma::X64] {
                for p in [HipFp8P::F16, HipFp8P::Fp8] {
                    for out in [Dtype::F16, Dtype::Bf16] {
                        v.push(HipKernelId::MfmaFp8(MfmaFp8Config { head_dim: hd, p, out, mfma }));
                    }
                }
            }
        }
        v
    }

    /// Targets the variant is built and checked for (the f8f6f4 form exists on gfx950 only).
    pub fn targets(&self) -> &'static [GfxArch] {
        match self {
            HipKernelId::MfmaFp8(MfmaFp8Config { mfma: Fp8Mfma::X64, .. }) => &[GfxArch::Gfx950],
            _ => &GfxArch::ALL,
        }
    }

    pub fn family(&self) -> &'static str {
        match self {
            HipKernelId::Mfma(_) => "fwd_mfma",
            HipKernelId::MfmaFp8(_) => "fwd_mfma_fp8",
        }
    }

    /// `fwd_mfma_{bf16|f16}_d{hd}`, `fwd_mfma_fp8_p{f16|fp8}_o{f16|bf16}_d{hd}[_x64]`.
    pub fn name(&self) -> String {
        match self {
            HipKernelId::Mfma(c) => format!("fwd_mfma_{}_d{}", c.input.name(), c.head_dim),
            HipKernelId::MfmaFp8(c) => format!(
                "fwd_mfma_fp8_p{}_o{}_d{}{}",
                match c.p {
                    HipFp8P::F16 => "f16",
                    HipFp8P::Fp8 => "fp8",
                },
                c.out.name(),
                c.head_dim,
                if c.mfma == Fp8Mfma::X64 { "_x64" } else { "" }
            ),
        }
    }

    pub fn head_dim(&self) -> usize {
        match self {
            HipKernelId::Mfma(c) => c.head_dim as usize,
            HipKernelId::MfmaFp8(c) => c.head_dim as usize,
        }
    }

    pub fn source(&self) -> &'static HipSource {
        match self {
            HipKernelId::Mfma(_) => &FWD_MFMA,
            HipKernelId::MfmaFp8(_) => &FWD_MFMA_FP8,
        }
    }

    /// The variant's tiling on `arch` (see [`HIP_TILE`]).
    pub fn tile(&self, arch: GfxArch) -> HipTile {
        match (self, arch) {
            (HipKernelId::Mfma(c), GfxArch::Gfx942) if c.head_dim == 128 => HIP_TILE_GFX942_D128,
            _ => HIP_TILE,
        }
    }

    /// The Q·Kᵀ and P·V MFMA shapes on `arch`.
    pub fn mfma(&self, arch: GfxArch) -> (MfmaShape, MfmaShape) {
        match self {
            HipKernelId::Mfma(_) => (arch.mfma_16bit(), arch.mfma_16bit()),
            HipKernelId::MfmaFp8(c) => (
                arch.mfma_fp8(c.mfma),
                match c.p {
                    HipFp8P::F16 => arch.mfma_16bit(),
                    HipFp8P::Fp8 => arch.mfma_fp8(c.mfma),
                },
            ),
        }
    }

    /// The `-D` defines the source reads (its header lists them), from [`HIP_TILE`] and the
    /// MFMA table.
    pub fn defines(&self, arch: GfxArch) -> Result<Vec<(String, String)>> {
        let tile = self.tile(arch);
        let (qk, pv) = self.mfma(arch);
        let d = |k: &str, v: usize| (k.to_string(), v.to_string());
        let mut v = vec![
            d("HEAD_DIM", self.head_dim()),
            d("WAVES", tile.waves as usize),
            d("BLOCK_N", tile.block_n as usize),
            d("MFMA_K", qk.k),
            d("PV_MFMA_K", pv.k),
        ];
        match self {
            HipKernelId::Mfma(c) => {
                check_head_dim("fwd_mfma", c.head_dim)?;
                check_16bit("fwd_mfma", "the input type", c.input)?;
                v.push(d("IN_BF16", (c.input == Dtype::Bf16) as usize));
            }
            HipKernelId::MfmaFp8(c) => {
                check_head_dim("fwd_mfma_fp8", c.head_dim)?;
                check_16bit("fwd_mfma_fp8", "O", c.out)?;
                if !self.targets().contains(&arch) {
                    return Err(NativeError::UnsupportedConfig {
                        kernel: "fwd_mfma_fp8",
                        reason: format!("{} has no {:?} MFMA", arch, c.mfma),
                    });
                }
                v.push(d("P_FP8", (c.p == HipFp8P::Fp8) as usize));
                v.push(d("OUT_BF16", (c.out == Dtype::Bf16) as usize));
            }
        }
        v.sort();
        Ok(v)
    }

    /// Instructions the code object must contain on `arch`; any other `v_mfma*` is
    /// unexpected.
    pub fn expected_instructions(&self, arch: GfxArch) -> Vec<String> {
        let mfma16 = |ty: &str| match arch {
            GfxArch::Gfx942 => format!("v_mfma_f32_32x32x8_{ty}"),
            GfxArch::Gfx950 => format!("v_mfma_f32_32x32x16_{ty}"),
        };
        match self {
            HipKernelId::Mfma(c) => vec![mfma16(c.input.name())],
            HipKernelId::MfmaFp8(c) => {
                let qk = match c.mfma {
                    Fp8Mfma::X16 => "v_mfma_f32_32x32x16_fp8_fp8",
                    Fp8Mfma::X64 => "v_mfma_scale_f32_32x32x64_f8f6f4",
                };
                match c.p {
                    HipFp8P::F16 => vec![qk.into(), mfma16("f16")],
                    HipFp8P::Fp8 => vec![qk.into(), "v_cvt_pk_fp8_f32".into()],
                }
            }
        }
    }

    /// MFMAs one wave issues per KV tile: Q·Kᵀ (32-key tiles × D/K) plus P·V (BN/K × D/32).
    pub fn mfma_per_tile(&self, arch: GfxArch) -> usize {
        let (qk, pv) = self.mfma(arch);
        let bn = self.tile(arch).block_n as usize;
        let d = self.head_dim();
        (bn / 32) * d / qk.k + (bn / pv.k) * (d / 32)
    }

    /// The kernel's rounding and tiling for [`super::layout::emulate_forward`]. `round_p` is P's
    /// rounding into the P·V operand: f16/bf16 for [`HipKernelId::Mfma`] (the input type), f16
    /// or the arch's e4m3 (of `P_MAX · p`) for the FP8 family; the caller supplies it because
    /// the codecs live above this crate.
    pub fn emulated(&self, arch: GfxArch, round_p: fn(f32) -> f32) -> EmulatedKernel {
        let (qk, pv) = self.mfma(arch);
        let p_log2 = match self {
            HipKernelId::MfmaFp8(MfmaFp8Config { p: HipFp8P::Fp8, .. }) => arch.fp8().max().log2(),
            _ => 0.0,
        };
        let t = self.tile(arch);
        EmulatedKernel { qk, pv, waves: t.waves as usize, block_n: t.block_n as usize, p_log2, round_p }
    }

    /// Checks a launch before anything touches the device (sizes, strides, scale, descales).
    pub fn validate_args(&self, s: &AttentionShape, descale: Option<DescaleGranularity>) -> Result<()> {
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        if s.head_dim != self.head_dim() || s.v_head_dim != s.head_dim {
            return bad(format!("head dims {} / {} (V) for a kernel of head dim {}", s.head_dim, s.v_head_dim, self.head_dim()));
        }
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.q_len == 0 {
            return bad(format!("empty problem: {s:?}"));
        }
        if !s.q_heads.is_multiple_of(s.kv_heads) {
            return bad(format!("q_heads {} not a multiple of kv_heads {}", s.q_heads, s.kv_heads));
        }
        if s.q_len > i32::MAX as usize || s.kv_len > i32::MAX as usize || s.q_heads > 65535 || s.batch > 65535 {
            return bad(format!("sizes past the grid or i32 limits: {s:?}"));
        }
        if !(s.scale.is_finite() && s.scale > 0.0) {
            return bad(format!("softmax scale must be finite and > 0, got {}", s.scale));
        }
        // 16-byte loads of rows: 8 16-bit elements or 16 FP8 codes; O is stored 4 at a time.
        let (align, o_align) = match self {
            HipKernelId::Mfma(_) => (8, 4),
            HipKernelId::MfmaFp8(_) => (16, 4),
        };
        for ((name, st), a) in [("q", &s.q), ("k", &s.k), ("v", &s.v), ("o", &s.o)].into_iter().zip([align, align, align, o_align]) {
            if [st.batch, st.head, st.seq].iter().any(|&x| x % a != 0 || x > i64::MAX as usize) {
                return bad(format!("{name} strides {st:?} must be multiples of {a} elements"));
            }
        }
        if let HipKernelId::MfmaFp8(_) = self {
            if descale == Some(DescaleGranularity::PerBlock) {
                return bad("per-block descales are not supported by fwd_mfma_fp8 (per tensor or per head)".into());
            }
        }
        Ok(())
    }

    /// Grid `(query blocks, q_heads, batch)` and block size.
    pub fn launch_dims(&self, s: &AttentionShape, arch: GfxArch) -> ((u32, u32, u32), (u32, u32, u32)) {
        let t = self.tile(arch);
        ((s.q_len.div_ceil(t.block_m() as usize) as u32, s.q_heads as u32, s.batch as u32), (t.threads(), 1, 1))
    }
}

impl std::fmt::Display for HipKernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Mirror of `FwdParams` in `native/hip/common.h`: same field order, C layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HipFwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub q_descale: u64,
    pub k_descale: u64,
    pub v_descale: u64,
    pub q_stride: [i64; 3],
    pub k_stride: [i64; 3],
    pub v_stride: [i64; 3],
    pub o_stride: [i64; 3],
    pub q_len: i32,
    pub kv_len: i32,
    pub q_heads: i32,
    pub kv_group: i32,
    pub scale: f32,
    pub causal: i32,
    pub descale_per_head: i32,
    pub pad_: i32,
}

impl HipFwdParams {
    /// Parameters of `s` for device pointers `[q, k, v, o, lse]` (lse 0: not written) and,
    /// for the FP8 family, `[q, k, v]` descale pointers.
    pub fn new(s: &AttentionShape, ptrs: [u64; 5], descales: Option<([u64; 3], DescaleGranularity)>) -> HipFwdParams {
        let st = |x: &quattn_core::Strides| [x.batch as i64, x.head as i64, x.seq as i64];
        let (d, per_head) = match descales {
            Some((d, g)) => (d, (g == DescaleGranularity::PerHead) as i32),
            None => ([0; 3], 0),
        };
        HipFwdParams {
            q: ptrs[0],
            k: ptrs[1],
            v: ptrs[2],
            o: ptrs[3],
            lse: ptrs[4],
            q_descale: d[0],
            k_descale: d[1],
            v_descale: d[2],
            q_stride: st(&s.q),
            k_stride: st(&s.k),
            v_stride: st(&s.v),
            o_stride: st(&s.o),
            q_len: s.q_len as i32,
            kv_len: s.kv_len as i32,
            q_heads: s.q_heads as i32,
            kv_group: (s.q_heads / s.kv_heads.max(1)) as i32,
            scale: s.scale,
            causal: s.causal as i32,
            descale_per_head: per_head,
            pad_: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_match_the_c_layout() {
        // 8 pointers, 12 strides, 8 four-byte fields.
        assert_eq!(std::mem::size_of::<HipFwdParams>(), 8 * 8 + 12 * 8 + 8 * 4);
        assert_eq!(std::mem::offset_of!(HipFwdParams, q_stride), 64);
        assert_eq!(std::mem::offset_of!(HipFwdParams, q_len), 160);
    }

    #[test]
    fn names_unique_and_defines_follow_the_table() {
        let all = HipKernelId::all();
        let mut names: Vec<String> = all.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        let id = HipKernelId::Mfma(MfmaConfig { head_dim: 128, input: Dtype::Bf16 });
        let defs = id.defines(GfxArch::Gfx942).unwrap();
        assert!(defs.contains(&("MFMA_K".into(), "8".into())));
        assert!(defs.contains(&("IN_BF16".into(), "1".into())));
        assert!(id.defines(GfxArch::Gfx950).unwrap().contains(&("MFMA_K".into(), "16".into())));
        // FP8 with f16 P on gfx942 runs P·V on the 32x32x8 f16 MFMA.
        let f = HipKernelId::MfmaFp8(MfmaFp8Config { head_dim: 64, p: HipFp8P::F16, out: Dtype::F16, mfma: Fp8Mfma::X16 });
        assert!(f.defines(GfxArch::Gfx942).unwrap().contains(&("PV_MFMA_K".into(), "8".into())));
        // The f8f6f4 form is refused on gfx942, which lacks it.
        let w = HipKernelId::MfmaFp8(MfmaFp8Config { head_dim: 64, p: HipFp8P::Fp8, out: Dtype::F16, mfma: Fp8Mfma::X64 });
        assert!(w.defines(GfxArch::Gfx942).is_err());
        assert!(w.defines(GfxArch::Gfx950).unwrap().contains(&("MFMA_K".into(), "64".into())));
        assert!(MfmaConfig::new(96, Dtype::F16).is_err());
        assert!(MfmaConfig::new(64, Dtype::F32).is_err());
    }

    #[test]
    fn arch_names_parse_with_features() {
        assert_eq!(GfxArch::parse("gfx942:sramecc+:xnack-"), Some(GfxArch::Gfx942));
        assert_eq!(GfxArch::parse("gfx950"), Some(GfxArch::Gfx950));
        assert_eq!(GfxArch::parse("gfx90a:sramecc+:xnack-"), None);
        assert_eq!(GfxArch::parse("gfx1100"), None);
    }

    #[test]
    fn mfma_count_per_tile() {
        // hd 128, 64-key tiles: Q·Kᵀ 2 tiles × 8 steps + P·V 2 × 2 × 4 on gfx950 (K 16).
        let bf16 = HipKernelId::Mfma(MfmaConfig { head_dim: 128, input: Dtype::Bf16 });
        assert_eq!(bf16.mfma_per_tile(GfxArch::Gfx950), 32);
        // gfx942 at hd 128: 32-key tiles of K 8 forms: 1 × 16 + 4 × 4.
        assert_eq!(bf16.mfma_per_tile(GfxArch::Gfx942), 32);
        let fp8 = HipKernelId::MfmaFp8(MfmaFp8Config { head_dim: 128, p: HipFp8P::Fp8, out: Dtype::Bf16, mfma: Fp8Mfma::X16 });
        assert_eq!(fp8.mfma_per_tile(GfxArch::Gfx950), 32);
        assert_eq!(fp8.mfma_per_tile(GfxArch::Gfx942), 32);
        // f8f6f4: Q·Kᵀ 2 tiles × 2 + P·V 1 × 4.
        let x64 = HipKernelId::MfmaFp8(MfmaFp8Config { head_dim: 128, p: HipFp8P::Fp8, out: Dtype::Bf16, mfma: Fp8Mfma::X64 });
        assert_eq!(x64.mfma_per_tile(GfxArch::Gfx950), 8);
    }
}
