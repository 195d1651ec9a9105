//! The one rounding routine behind every small float format (E4M3, E5M2, UE4M3, E2M1): encode a
//! magnitude on the format's grid with round-to-nearest-even, subnormals included. Keeping one
//! routine means the formats cannot disagree on how ties or the subnormal range are handled;
//! each format only decides what to do with codes past its largest finite value.

/// Field widths of a sign-magnitude binary float with an implicit leading one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Minifloat {
    pub man_bits: u32,
    pub bias: i32,
}

/// `2^e` for `e` in `[-149, 127]`, built from bits so it is exact (no `powi` rounding question).
pub(crate) fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

impl Minifloat {
    /// Code (exponent and mantissa fields, no sign) of the grid point nearest to `a`, ties to
    /// the even code. `a` must be finite and non-negative. The exponent range is unbounded
    /// above, so a value past the format's largest finite number comes back as a code past it
    /// (possibly past the field width); the caller decides between saturation, inf and NaN.
    ///
    /// Why it works: on the grid of binade `e` the spacing is `2^(e - man_bits)`, so
    /// `n = rne(a / spacing)` is the significand including the implicit one, and the code is
    /// `(biased_exponent - 1) << man_bits | ...` + `n`; a carry from `n = 2^(man_bits+1)` rolls
    /// into the exponent field by itself, and in the subnormal binade the same formula gives
    /// the subnormal code (biased exponent 0) directly.
    pub fn encode_magnitude(self, a: f32) -> u32 {
        if a == 0.0 {
            return 0;
        }
        let emin = 1 - self.bias;
        let bits = a.to_bits();
        let exp_field = (bits >> 23) as i32;
        // f32 subnormals lie far below every small format's smallest normal.
        let e = if exp_field == 0 { emin - 1 } else { exp_field - 127 };
        let e_eff = e.max(emin);
        // a * 2^(man_bits - e_eff) is exact: a power-of-two scaling that stays in range.
        let n = (a * pow2(self.man_bits as i32 - e_eff)).round_ties_even() as u32;
        (((e_eff + self.bias - 1) as u32) << self.man_bits) + n
    }

    /// Value of a magnitude code (no sign bit, no special values).
    pub fn decode_magnitude(self, code: u32) -> f32 {
        let exp_field = (code >> self.man_bits) as i32;
        let man = code & ((1 << self.man_bits) - 1);
        if exp_field == 0 {
            man as f32 * pow2(1 - self.bias - self.man_bits as i32)
        } else {
            ((1 << self.man_bits) + man) as f32 * pow2(exp_field - self.bias - self.man_bits as i32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_is_exact_over_the_whole_range() {
        for e in -149..=127 {
            assert_eq!(pow2(e) as f64, 2f64.powi(e), "2^{e}");
        }
    }
}
