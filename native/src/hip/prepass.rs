//! The FP8 quantization prepass on HIP (`native/hip/fp8_prepass.hip`): Q, K and V in f16 or bf16
//! to the target's e4m3 codes (e4m3fn on gfx950, e4m3fnuz on gfx942) with f32 descales per
//! tensor or per (batch, head), with the conventions of the CUDA prepass
//! ([`crate::fp8_prepass`]), whose tiling, launch ABI ([`Fp8PrepassParams`]) and host-side slab
//! planning it shares. Compiled and disassembly-checked; not run on hardware.
//!
//! [`encode_e4m3`] is the host transliteration of the kernel's `thread_encode`, step for step, so
//! that a CPU test can hold the kernel's arithmetic against the codecs (`quattn::codec`); the
//! kernel's header says why it encodes in integer arithmetic and not with `v_cvt_pk_fp8_f32`.

use quattn_core::{Dtype, Fp8Format};

use super::compile::HipVariant;
use super::config::{Fp8Encoding, GfxArch};
use super::source::{HipSource, FP8_PREPASS_HIP};
use crate::error::{NativeError, Result};
use crate::fp8::Fp8Args;
use crate::fp8_prepass::{Fp8PrepassConfig, Fp8PrepassLens, Fp8PrepassParams, Fp8PrepassPass, Fp8PrepassPtrs};

/// Threads per workgroup of both passes (4 waves of 64).
pub const HIP_PREPASS_THREADS: u32 = 256;

/// One compiled kernel of the HIP prepass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HipPrepassId {
    /// f16 or bf16 inputs.
    pub input: Dtype,
    pub pass: Fp8PrepassPass,
}

impl HipPrepassId {
    pub fn new(input: Dtype, pass: Fp8PrepassPass) -> Result<Self> {
        let id = HipPrepassId { input, pass };
        id.shared()?;
        if pass == Fp8PrepassPass::OnePass {
            return Err(NativeError::UnsupportedConfig { kernel: "fp8_prepass", reason: "the HIP prepass has the amax and quantize passes only".into() });
        }
        Ok(id)
    }

    /// Every variant: f16 and bf16 inputs, both passes.
    pub fn all() -> Vec<HipPrepassId> {
        [Dtype::F16, Dtype::Bf16]
            .into_iter()
            .flat_map(|input| [Fp8PrepassPass::Amax, Fp8PrepassPass::Quantize].map(|pass| HipPrepassId { input, pass }))
            .collect()
    }

    /// The CUDA prepass config of the same tiling and ABI (e4m3; the target picks the encoding),
    /// which plans slabs and builds parameters for both.
    fn shared(&self) -> Result<Fp8PrepassConfig> {
        Fp8PrepassConfig::new(self.input, Fp8Format::E4M3)
    }

    /// `fp8_prepass_{amax|quant}_{f16|bf16}`.
    pub fn name(&self) -> String {
        let pass = match self.pass {
            Fp8PrepassPass::Amax => "amax",
            Fp8PrepassPass::Quantize => "quant",
            Fp8PrepassPass::OnePass => "onepass",
        };
        format!("fp8_prepass_{pass}_{}", self.input.name())
    }

    pub fn source(&self) -> &'static HipSource {
        &FP8_PREPASS_HIP
    }

    /// The `-D` defines (the kernel's header), sorted by name.
    pub fn defines(&self) -> Result<Vec<(String, String)>> {
        self.shared()?;
        Ok(vec![
            ("ELEM".into(), ((self.input == Dtype::Bf16) as u32).to_string()),
            ("PASS".into(), ((self.pass == Fp8PrepassPass::Quantize) as u32).to_string()),
        ])
    }

    /// What the code object must contain: the amax pass's arrival atomic and max; the quantize
    /// pass's IEEE division (`v_div_fixup_f32` ends the correctly rounded f32 division, the
    /// quotient the codec rounds) and the round-to-nearest-even of subnormal codes
    /// (`v_rndne_f32`).
    pub fn expected_instructions(&self) -> Vec<String> {
        match self.pass {
            Fp8PrepassPass::Amax => vec!["global_atomic_add".into(), "v_max_f32_e32".into()],
            Fp8PrepassPass::Quantize | Fp8PrepassPass::OnePass => vec!["v_div_fixup_f32".into(), "v_rndne_f32_e32".into()],
        }
    }

    /// Checks the arguments and gives the element counts of every buffer of a prepass over
    /// `args` (inputs and codes in elements, descales f32, scratch: partial f32, counter u32).
    pub fn required_lens(input: Dtype, args: &Fp8Args) -> Result<Fp8PrepassLens> {
        let c = HipPrepassId { input, pass: Fp8PrepassPass::Amax }.shared()?;
        c.validate_args(args)?;
        Ok(c.required_lens(args))
    }

    /// Checks the arguments and plans the launches of one prepass over `args`: per slab of whole
    /// descale groups of at most `slab_bytes` input bytes, the parameters (the same for both
    /// passes) and the grid (one workgroup per tile). The amax launch of a slab precedes its
    /// quantize launch.
    pub fn launches(input: Dtype, args: &Fp8Args, ptrs: &Fp8PrepassPtrs, slab_bytes: Option<usize>) -> Result<Vec<(Fp8PrepassParams, u32)>> {
        let c = HipPrepassId { input, pass: Fp8PrepassPass::Amax }.shared()?;
        c.validate_args(args)?;
        c.validate_ptrs(ptrs)?;
        c.slabs(args, slab_bytes)
            .into_iter()
            .map(|slab| {
                let tiles = slab.tile_end - slab.tile_begin;
                let grid = u32::try_from(tiles).map_err(|_| NativeError::InvalidArgs(format!("{tiles} prepass tiles in one launch")))?;
                Ok((c.params(args, ptrs, slab), grid))
            })
            .collect()
    }
}

impl HipVariant for HipPrepassId {
    fn name(&self) -> String {
        HipPrepassId::name(self)
    }
    fn source(&self) -> &'static HipSource {
        &FP8_PREPASS_HIP
    }
    fn defines(&self, _arch: GfxArch) -> Result<Vec<(String, String)>> {
        HipPrepassId::defines(self)
    }
    fn targets(&self) -> &'static [GfxArch] {
        &GfxArch::ALL
    }
    fn expected_instructions(&self, _arch: GfxArch) -> Vec<String> {
        HipPrepassId::expected_instructions(self)
    }
    fn mfma_per_tile(&self, _arch: GfxArch) -> usize {
        0
    }
    fn waves(&self, _arch: GfxArch) -> u32 {
        HIP_PREPASS_THREADS / 64
    }
}

impl std::fmt::Display for HipPrepassId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// The descale of a group of largest magnitude `amax` (NaN elements excluded): `amax / max` in
/// f32, 1 for an all-zero group, infinite when an element is.
pub fn descale_for(enc: Fp8Encoding, amax: f32) -> f32 {
    if amax > 0.0 {
        amax / enc.max()
    } else {
        1.0
    }
}

/// The code of `y` in `enc`, exactly as `thread_encode` in `fp8_prepass.hip` computes it: round
/// to nearest even, saturating to ±max, NaN to the NaN code (`sign | 0x7f` in e4m3fn, `0x80` in
/// e4m3fnuz), and in e4m3fnuz -0 and magnitudes rounding to zero to `0x00`.
pub fn encode_e4m3(y: f32, enc: Fp8Encoding) -> u8 {
    let fnuz = enc == Fp8Encoding::E4m3Fnuz;
    let (bias, max_code) = if fnuz { (8u32, 0x7fu32) } else { (7, 0x7e) };
    let b = y.to_bits();
    let sign = (b >> 24) & 0x80;
    let a = b & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return if fnuz { 0x80 } else { (sign | 0x7f) as u8 };
    }
    let code = if a >= (128 - bias) << 23 {
        // Normal: rebias in place, round 23 mantissa bits to 3, ties to even.
        let r = a - ((127 - bias) << 23);
        (r + 0x7_ffff + ((r >> 20) & 1)) >> 20
    } else {
        // Subnormal: the exact scaled magnitude rounded to an integer, ties to even
        // (`__builtin_rintf` in the default round mode).
        (f32::from_bits(a) * (1u32 << (2 + bias)) as f32).round_ties_even() as u32
    };
    let code = code.min(max_code);
    if fnuz && code == 0 {
        0
    } else {
        (sign | code) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quattn_core::{AttentionShape, DescaleGranularity, Layout};

    #[test]
    fn names_defines_and_expected_instructions() {
        let all = HipPrepassId::all();
        let mut names: Vec<String> = all.iter().map(|i| i.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 4);
        let q = HipPrepassId::new(Dtype::Bf16, Fp8PrepassPass::Quantize).unwrap();
        assert_eq!(q.name(), "fp8_prepass_quant_bf16");
        assert_eq!(q.defines().unwrap(), vec![("ELEM".into(), "1".into()), ("PASS".into(), "1".into())]);
        assert!(HipPrepassId::new(Dtype::F32, Fp8PrepassPass::Amax).is_err());
        assert!(HipPrepassId { input: Dtype::F32, pass: Fp8PrepassPass::Amax }.defines().is_err());
    }

    #[test]
    fn encode_corner_cases() {
        use Fp8Encoding::*;
        assert_eq!(encode_e4m3(448.0, E4m3Fn), 0x7e);
        assert_eq!(encode_e4m3(464.0, E4m3Fn), 0x7e);
        assert_eq!(encode_e4m3(f32::INFINITY, E4m3Fn), 0x7e);
        assert_eq!(encode_e4m3(f32::NEG_INFINITY, E4m3Fn), 0xfe);
        assert_eq!(encode_e4m3(-f32::NAN, E4m3Fn), 0xff);
        assert_eq!(encode_e4m3(-0.0, E4m3Fn), 0x80);
        // Smallest subnormal 2^-9; half of it ties to 0, a bit more rounds up.
        assert_eq!(encode_e4m3(2f32.powi(-9), E4m3Fn), 0x01);
        assert_eq!(encode_e4m3(2f32.powi(-10), E4m3Fn), 0x00);
        assert_eq!(encode_e4m3(2f32.powi(-10) * 1.01, E4m3Fn), 0x01);
        assert_eq!(encode_e4m3(240.0, E4m3Fnuz), 0x7f);
        assert_eq!(encode_e4m3(248.0, E4m3Fnuz), 0x7f);
        assert_eq!(encode_e4m3(-1e30, E4m3Fnuz), 0xff);
        assert_eq!(encode_e4m3(f32::NAN, E4m3Fnuz), 0x80);
        assert_eq!(encode_e4m3(-0.0, E4m3Fnuz), 0x00);
        assert_eq!(encode_e4m3(-2f32.powi(-12), E4m3Fnuz), 0x00);
        assert_eq!(encode_e4m3(1.0, E4m3Fnuz), 0x40);
        assert_eq!(encode_e4m3(1.0, E4m3Fn), 0x38);
    }

    #[test]
    fn launches_cover_every_tile_and_check_arguments() {
        let s = AttentionShape::contiguous(Layout::Bhsd, 2, 4, 2, 100, 300, 128, false);
        let args = Fp8Args::new(s, DescaleGranularity::PerHead);
        let ptrs = Fp8PrepassPtrs { q: 16, k: 32, v: 48, q_codes: 64, k_codes: 72, v_codes: 80, q_descale: 4, k_descale: 8, v_descale: 12, partial: 20, counter: 24 };
        let one = HipPrepassId::launches(Dtype::F16, &args, &ptrs, None).unwrap();
        assert_eq!(one.len(), 1);
        // 64 rows per tile at hd 128: Q 2 tiles per head, K/V 5.
        assert_eq!(one[0].1, 2 * 4 * 2 + 2 * 2 * 2 * 5);
        let many = HipPrepassId::launches(Dtype::F16, &args, &ptrs, Some(0)).unwrap();
        assert_eq!(many.len(), 8 + 8);
        assert_eq!(many.iter().map(|l| l.1).sum::<u32>(), one[0].1);
        assert!(HipPrepassId::launches(Dtype::F16, &args, &Fp8PrepassPtrs { k: 40, ..ptrs }, None).is_err());
        let blocked = Fp8Args::new(s, DescaleGranularity::PerBlock);
        assert!(matches!(HipPrepassId::launches(Dtype::F16, &blocked, &ptrs, None), Err(NativeError::InvalidArgs(_))));
        assert!(HipPrepassId::launches(Dtype::F32, &args, &ptrs, None).is_err());
    }
}
