//! f16 and bf16 rounding, through the `half` crate (IEEE round-to-nearest-even, subnormals,
//! overflow to infinity). The emulation rounds its 16-bit operands with these so it rounds
//! exactly as a device conversion (`cvt.rn`) does.

use half::{bf16, f16};

/// `x` rounded to the nearest f16 and widened back (exact) to f32.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `x` rounded to the nearest bf16 and widened back (exact) to f32.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Converts a slice to f16 (RNE).
pub fn to_f16_vec(x: &[f32]) -> Vec<f16> {
    x.iter().map(|&v| f16::from_f32(v)).collect()
}

/// Converts a slice to bf16 (RNE).
pub fn to_bf16_vec(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// Widens f16 values to f32 (exact).
pub fn f16_to_f32_vec(x: &[f16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// Widens bf16 values to f32 (exact).
pub fn bf16_to_f32_vec(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// Every element rounded to f16 and kept as f32 (what a kernel reading f16 inputs sees).
pub fn round_f16_vec(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| round_f16(v)).collect()
}

/// Every element rounded to bf16 and kept as f32.
pub fn round_bf16_vec(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| round_bf16(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_ties_go_to_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (f16 has 10 mantissa bits).
        assert_eq!(round_f16(1.0 + 2f32.powi(-11)), 1.0);
        // 1 + 3·2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
        assert_eq!(round_f16(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9));
        assert_eq!(round_f16(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 1.0 + 2f32.powi(-10));
    }

    #[test]
    fn f16_subnormals_and_overflow() {
        let tiny = 2f32.powi(-24); // smallest f16 subnormal
        assert_eq!(round_f16(tiny), tiny);
        assert_eq!(round_f16(tiny * 0.5), 0.0); // tie between 0 and tiny -> even (0)
        assert_eq!(round_f16(tiny * 1.5), 2.0 * tiny); // tie between 1 and 2 ulps -> 2
        assert_eq!(round_f16(65504.0), 65504.0);
        assert_eq!(round_f16(65519.0), 65504.0);
        assert_eq!(round_f16(65520.0), f32::INFINITY); // halfway to 2^16 rounds to even = inf
        assert_eq!(round_f16(-1e6), f32::NEG_INFINITY);
        assert!(round_f16(f32::NAN).is_nan());
    }

    #[test]
    fn bf16_ties_subnormals_and_overflow() {
        // bf16 has 7 mantissa bits.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        let tiny = 2f32.powi(-133); // smallest bf16 subnormal
        assert_eq!(round_bf16(tiny), tiny);
        assert_eq!(round_bf16(tiny * 0.5), 0.0);
        let max = (2.0 - 2f32.powi(-7)) * 2f32.powi(127); // largest finite bf16
        let mid = (2.0 - 2f32.powi(-8)) * 2f32.powi(127); // halfway from max to 2^128
        assert_eq!(round_bf16(max), max);
        assert_eq!(round_bf16(mid.next_down()), max);
        assert_eq!(round_bf16(mid), f32::INFINITY); // max has an odd mantissa
        assert_eq!(round_bf16(-mid), f32::NEG_INFINITY);
    }

    #[test]
    fn slice_converters_round_trip() {
        let x = [0.1f32, -2.5, 65504.0, 1e-8];
        assert_eq!(f16_to_f32_vec(&to_f16_vec(&x)), round_f16_vec(&x));
        assert_eq!(bf16_to_f32_vec(&to_bf16_vec(&x)), round_bf16_vec(&x));
    }
}
