//! [`Precision`]: what is computed, in which number formats, rounded where.

use std::fmt;

pub use quattn_core::{DescaleGranularity, Dtype, Fp8Format, Int8Granularity, PvAccum, QkAccum};

/// Format of the probabilities P (or V) entering the P·V product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PvFormat {
    #[default]
    F16,
    Fp8,
}

/// Format of V (and with it P) in the NVFP4 mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Nvfp4V {
    /// bf16 V; P rounded to bf16.
    #[default]
    Bf16,
    /// NVFP4 `Vᵀ` (16-key blocks along the keys of each channel, one tensor scale); P quantized
    /// to NVFP4 per 16 keys with the fixed tensor scale 1/2688.
    Nvfp4,
    /// NVFP4 `Vᵀ` as for [`Nvfp4V::Nvfp4`] (the same codes and layout); P rounded to f16 and
    /// P·V accumulated in f32, as the f16 kernels do. Where no FP4 MMA exists the V codes are
    /// decoded to 16-bit values anyway, so quantizing P would only add error and instructions:
    /// the mode of a 4-bit KV cache on portable devices (long-context decode).
    Nvfp4P16,
}

impl Nvfp4V {
    /// V is 4-bit (`Vᵀ` codes) rather than bf16.
    pub const fn is_4bit(self) -> bool {
        matches!(self, Nvfp4V::Nvfp4 | Nvfp4V::Nvfp4P16)
    }
}

/// What the attention computes, in which formats. Every mode the project has is named here,
/// including those whose kernels come later (they return a typed error until then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Everything in f32.
    F32,
    /// f16 Q, K, V; softmax in f32; P rounded to f16 for P·V.
    F16 { qk: QkAccum, pv: PvAccum },
    /// bf16 Q, K, V; softmax in f32; P rounded to bf16 for P·V.
    Bf16 { qk: QkAccum, pv: PvAccum },
    /// SageAttention-style INT8 Q and K with f32 scales, INT32 Q·Kᵀ accumulation. With
    /// `pv: F16` the portable CubeCL path runs it on every wgpu and CUDA device (a quantization
    /// prepass, then the INT8 kernel; the plan records the blocking its scales follow); `pv:
    /// Fp8` (e4m3 P and per-channel e4m3 V, SageAttention2) runs natively on sm_90a (the s8
    /// wgmma kernel's e4m3 P·V variant) and in the CPU emulation.
    Int8Qk { granularity: Int8Granularity, smooth_k: bool, pv: PvFormat },
    /// FP8 Q, K, V with f32 descales; P in f16 or FP8.
    Fp8 { format: Fp8Format, descale: DescaleGranularity, p: PvFormat },
    /// NVFP4 Q and K (E2M1 values, UE4M3 scale per 16, f32 tensor scale); V in bf16 or NVFP4,
    /// P in bf16, NVFP4 or f16 ([`Nvfp4V`]).
    /// With `smooth_k` the per-(batch, KV head) mean of K over the keys is subtracted before K
    /// is quantized (as for INT8; softmax is unchanged, the LSE gets `scale · q·μ` back).
    Nvfp4 { v: Nvfp4V, smooth_k: bool },
    /// MXFP4 Q and K (E2M1 values, one E8M0 power-of-two scale per 32 along the head dim, no
    /// tensor scale); V in bf16, P rounded to bf16, softmax in f32. `smooth_k` as for NVFP4.
    Mxfp4 { smooth_k: bool },
}

impl Precision {
    pub const F16_DEFAULT: Precision = Precision::F16 { qk: QkAccum::F32, pv: PvAccum::F32 };
    pub const BF16_DEFAULT: Precision = Precision::Bf16 { qk: QkAccum::F32, pv: PvAccum::F32 };
    pub const INT8_DEFAULT: Precision =
        Precision::Int8Qk { granularity: Int8Granularity::PerBlock, smooth_k: true, pv: PvFormat::F16 };
    pub const FP8_DEFAULT: Precision =
        Precision::Fp8 { format: Fp8Format::E4M3, descale: DescaleGranularity::PerTensor, p: PvFormat::F16 };
    pub const NVFP4_DEFAULT: Precision = Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k: false };

    /// Short stable name, as the CLI spells it.
    pub fn name(&self) -> String {
        match *self {
            Precision::F32 => "f32".into(),
            Precision::F16 { qk, pv } => format!("f16{}{}", qk_suffix(qk), pv_suffix(pv)),
            Precision::Bf16 { qk, pv } => format!("bf16{}{}", qk_suffix(qk), pv_suffix(pv)),
            Precision::Int8Qk { granularity, smooth_k, pv } => format!(
                "int8-{}{}{}",
                match granularity {
                    Int8Granularity::PerBlock => "block",
                    Int8Granularity::PerWarp => "warp",
                    Int8Granularity::PerThread => "thread",
                },
                if smooth_k { "" } else { "-nosmooth" },
                if pv == PvFormat::Fp8 { "-pvfp8" } else { "" }
            ),
            Precision::Fp8 { format, descale, p } => format!(
                "fp8-{}{}{}",
                match format {
                    Fp8Format::E4M3 => "e4m3",
                    Fp8Format::E5M2 => "e5m2",
                },
                match descale {
                    DescaleGranularity::PerTensor => "",
                    DescaleGranularity::PerHead => "-head",
                    DescaleGranularity::PerBlock => "-block",
                },
                if p == PvFormat::Fp8 { "-pfp8" } else { "" }
            ),
            Precision::Nvfp4 { v, smooth_k } => format!(
                "nvfp4{}{}",
                match v {
                    Nvfp4V::Bf16 => "",
                    Nvfp4V::Nvfp4 => "-v4",
                    Nvfp4V::Nvfp4P16 => "-v4p16",
                },
                if smooth_k { "-smooth" } else { "" }
            ),
            Precision::Mxfp4 { smooth_k } => format!("mxfp4{}", if smooth_k { "-smooth" } else { "" }),
        }
    }

    /// Parses the CLI spelling: the names of [`Precision::name`] plus the short aliases
    /// `f16-acc16`, `f16-2stage`, `int8`, `fp8`.
    pub fn parse(s: &str) -> Option<Precision> {
        let s = s.trim().to_ascii_lowercase();
        let all = Self::all_named();
        if let Some(p) = all.iter().find(|p| p.name() == s) {
            return Some(*p);
        }
        Some(match s.as_str() {
            "f16-acc16" => Precision::F16 { qk: QkAccum::F16, pv: PvAccum::F32 },
            "f16-2stage" | "f16-twostage" => Precision::F16 { qk: QkAccum::TwoStage, pv: PvAccum::F32 },
            "int8" => Self::INT8_DEFAULT,
            "fp8" => Self::FP8_DEFAULT,
            _ => return None,
        })
    }

    /// Every distinct mode (for parsing, listing and test matrices).
    pub fn all_named() -> Vec<Precision> {
        let mut v = vec![Precision::F32];
        for qk in [QkAccum::F32, QkAccum::F16, QkAccum::TwoStage] {
            for pv in [PvAccum::F32, PvAccum::F16PerTile] {
                v.push(Precision::F16 { qk, pv });
            }
        }
        v.push(Precision::BF16_DEFAULT);
        for granularity in [Int8Granularity::PerBlock, Int8Granularity::PerWarp, Int8Granularity::PerThread] {
            for smooth_k in [true, false] {
                for pv in [PvFormat::F16, PvFormat::Fp8] {
                    v.push(Precision::Int8Qk { granularity, smooth_k, pv });
                }
            }
        }
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for descale in [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock] {
                for p in [PvFormat::F16, PvFormat::Fp8] {
                    v.push(Precision::Fp8 { format, descale, p });
                }
            }
        }
        for smooth_k in [false, true] {
            v.push(Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k });
            v.push(Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k });
            v.push(Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k });
        }
        for smooth_k in [false, true] {
            v.push(Precision::Mxfp4 { smooth_k });
        }
        v
    }

    /// Rejects modes no hardware computes: bf16 tensor-core MMAs accumulate in f32 only, so
    /// bf16 with f16 or two-stage accumulation does not exist.
    pub fn validate(&self) -> crate::Result<()> {
        match *self {
            Precision::Bf16 { qk, pv } if qk != QkAccum::F32 || pv != PvAccum::F32 => Err(crate::Error::UnsupportedPrecision {
                precision: *self,
                device: "any device".into(),
                reason: "bf16 matrix units accumulate in f32 only".into(),
            }),
            _ => Ok(()),
        }
    }

    /// The element type the inputs are converted to before the kernel sees them.
    pub fn input_dtype(&self) -> Dtype {
        match self {
            Precision::F32 => Dtype::F32,
            Precision::Bf16 { .. } => Dtype::Bf16,
            Precision::Nvfp4 { v: Nvfp4V::Bf16, .. } | Precision::Mxfp4 { .. } => Dtype::Bf16,
            // NVFP4 V, with NVFP4 or f16 P: f16 inputs.
            Precision::Nvfp4 { v: Nvfp4V::Nvfp4 | Nvfp4V::Nvfp4P16, .. } => Dtype::F16,
            _ => Dtype::F16,
        }
    }
}

fn qk_suffix(qk: QkAccum) -> &'static str {
    match qk {
        QkAccum::F32 => "",
        QkAccum::F16 => "-acc16",
        QkAccum::TwoStage => "-2stage",
    }
}

fn pv_suffix(pv: PvAccum) -> &'static str {
    match pv {
        PvAccum::F32 => "",
        PvAccum::F16PerTile => "-pv16",
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_unique_and_parses_back() {
        let all = Precision::all_named();
        let mut names: Vec<String> = all.iter().map(|p| p.name()).collect();
        for p in &all {
            assert_eq!(Precision::parse(&p.name()), Some(*p), "{}", p.name());
        }
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate precision names");
    }

    #[test]
    fn bf16_accumulates_in_f32_only() {
        assert!(Precision::BF16_DEFAULT.validate().is_ok());
        assert!(Precision::Bf16 { qk: QkAccum::TwoStage, pv: PvAccum::F32 }.validate().is_err());
        assert!(Precision::Bf16 { qk: QkAccum::F32, pv: PvAccum::F16PerTile }.validate().is_err());
        assert!(Precision::all_named().iter().all(|p| p.validate().is_ok()));
    }

    #[test]
    fn cli_aliases() {
        assert_eq!(Precision::parse("f16-acc16"), Some(Precision::F16 { qk: QkAccum::F16, pv: PvAccum::F32 }));
        assert_eq!(Precision::parse("f16-2stage"), Some(Precision::F16 { qk: QkAccum::TwoStage, pv: PvAccum::F32 }));
        assert_eq!(Precision::parse("int8"), Some(Precision::INT8_DEFAULT));
        assert_eq!(Precision::parse("fp8"), Some(Precision::FP8_DEFAULT));
        assert_eq!(Precision::parse("nvfp4"), Some(Precision::NVFP4_DEFAULT));
        assert_eq!(Precision::parse("nvfp4-v4"), Some(Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k: false }));
        assert_eq!(Precision::parse("nvfp4-v4p16"), Some(Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k: false }));
        assert_eq!(Precision::parse("nvfp4-v4p16-smooth"), Some(Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k: true }));
        assert_eq!(Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k: true }.input_dtype(), Dtype::F16);
        assert_eq!(Precision::parse("nvfp4-p16"), None);
        assert_eq!(Precision::parse("mxfp4"), Some(Precision::Mxfp4 { smooth_k: false }));
        assert_eq!(Precision::parse("mxfp4-smooth"), Some(Precision::Mxfp4 { smooth_k: true }));
        assert_eq!(Precision::parse("f64"), None);
        assert_eq!(Precision::parse("bf16-2stage"), None);
    }
}
