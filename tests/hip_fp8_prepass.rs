//! The HIP FP8 prepass's numerics (`native/hip/fp8_prepass.hip`), held against the codecs on the
//! CPU (no AMD GPU here; the kernel is compiled and disassembly-checked, never run).
//!
//! `quattn_native::hip::encode_e4m3` is the kernel's integer encode transliterated step for step;
//! `quattn_native::hip::prepass::descale_for` its descale. Over every f16 input (all 65536 bit
//! patterns, NaN and infinities included) and a set of descales, the codes must be the codecs':
//! `codec::fp8::e4m3` (gfx950, OCP e4m3fn) and `codec::fp8::e4m3fnuz` (gfx942), and a whole
//! per-head quantization of every finite f16 value must reproduce `codec::fp8_scaled` bit for bit
//! (codes and descales).

use half::f16;
use quattn::codec::fp8::{e4m3, e4m3fnuz, Saturation};
use quattn::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
use quattn::{DescaleGranularity, Fp8Format, Strides};
use quattn_native::hip::prepass::descale_for;
use quattn_native::hip::{encode_e4m3, Fp8Encoding};

fn codec(enc: Fp8Encoding, y: f32) -> u8 {
    match enc {
        Fp8Encoding::E4m3Fn => e4m3::encode(y, Saturation::Saturate),
        Fp8Encoding::E4m3Fnuz => e4m3fnuz::encode(y, Saturation::Saturate),
    }
}

const ENCODINGS: [Fp8Encoding; 2] = [Fp8Encoding::E4m3Fn, Fp8Encoding::E4m3Fnuz];

#[test]
fn encode_is_the_codecs_on_every_f16_quotient() {
    // Descales of the prepass (amax / max) for amaxes from the f16 extremes to its subnormals,
    // 1 (an all-zero group), and values whose quotients land in e4m3's subnormals, its rounding
    // ties and past its max.
    let amaxes = [65504.0f32, 448.0, 240.0, 1.0, 3.0, 0.1, 2f32.powi(-14), 2f32.powi(-24), 1000.0];
    for enc in ENCODINGS {
        let mut descales: Vec<f32> = amaxes.iter().map(|&a| descale_for(enc, a)).collect();
        descales.extend([1.0, 0.5, 0.75, 2f32.powi(-20), 300.0]);
        let mut checked = 0usize;
        for d in descales {
            for bits in 0..=u16::MAX {
                let x = f16::from_bits(bits).to_f32();
                let y = x / d;
                let (got, want) = (encode_e4m3(y, enc), codec(enc, y));
                assert_eq!(got, want, "{enc:?}: x {x} ({bits:#06x}) / {d} = {y}: kernel {got:#04x}, codec {want:#04x}");
                checked += 1;
            }
        }
        assert_eq!(checked, 14 * 65536);
    }
}

#[test]
fn encode_is_the_codecs_across_f32() {
    // Every 251st f32 bit pattern (both signs, all exponents): rounding in every binade,
    // subnormal quotients, NaN payloads, infinities.
    for enc in ENCODINGS {
        let mut bits = 0u64;
        while bits <= u32::MAX as u64 {
            let y = f32::from_bits(bits as u32);
            assert_eq!(encode_e4m3(y, enc), codec(enc, y), "{enc:?}: {y:e} ({bits:#010x})");
            bits += 251;
        }
        // Around every code's rounding boundaries: the midpoints and their neighbours.
        for c in 0u8..=0x7f {
            let (lo, hi) = match enc {
                Fp8Encoding::E4m3Fn => (e4m3::decode(c), e4m3::decode(c + 1)),
                Fp8Encoding::E4m3Fnuz => (e4m3fnuz::decode(c), e4m3fnuz::decode(c.wrapping_add(1) & 0x7f)),
            };
            if !lo.is_finite() || !hi.is_finite() || hi <= lo {
                continue;
            }
            let mid = (lo + hi) / 2.0;
            for y in [mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)] {
                for s in [y, -y] {
                    assert_eq!(encode_e4m3(s, enc), codec(enc, s), "{enc:?}: {s:e}");
                }
            }
        }
    }
}

/// A per-head prepass of `x` (`[1, heads, len, dim]` contiguous) as the kernel computes it: amax
/// with NaN skipped, `descale_for`, the quotient rounded to f32, the kernel's encode.
fn mirror(enc: Fp8Encoding, x: &[f32], heads: usize) -> (Vec<u8>, Vec<f32>) {
    let per = x.len() / heads;
    let mut codes = Vec::with_capacity(x.len());
    let mut descales = Vec::new();
    for h in x.chunks(per) {
        let d = descale_for(enc, h.iter().fold(0f32, |m, v| m.max(v.abs())));
        descales.push(d);
        codes.extend(h.iter().map(|&v| encode_e4m3(v / d, enc)));
    }
    (codes, descales)
}

#[test]
fn per_head_prepass_of_every_finite_f16_is_fp8_scaled() {
    // Head 0: every finite f16 (63488 values) and zeros to whole rows of 128; head 1: the same
    // scaled into a small range (another descale); head 2: all zeros (descale 1).
    let mut all: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).filter(|v| v.is_finite()).collect();
    all.resize(all.len().div_ceil(128) * 128, 0.0);
    let len = all.len() / 128;
    let mut x = all.clone();
    x.extend(all.iter().map(|&v| f16::from_f32(v / 65536.0).to_f32()));
    x.extend(std::iter::repeat_n(0.0, all.len()));
    let layout = DescaleLayout { granularity: DescaleGranularity::PerHead, batch: 1, heads: 3, len, block_rows: len };
    let strides = Strides { batch: 3 * len * 128, head: len * 128, seq: 128 };
    let want = Fp8Tensor::quantize(Fp8Format::E4M3, &x, strides, 128, layout).expect("finite input");
    let (codes, descales) = mirror(Fp8Encoding::E4m3Fn, &x, 3);
    assert_eq!(descales, want.descales);
    assert_eq!(descales[2], 1.0);
    let first = codes.iter().zip(&want.codes).position(|(a, b)| a != b);
    assert!(first.is_none(), "code {first:?} differs: x {}", first.map_or(0.0, |i| x[i]));
    // gfx942: the same recipe on e4m3fnuz (max 240).
    let (codes, descales) = mirror(Fp8Encoding::E4m3Fnuz, &x, 3);
    for (h, chunk) in x.chunks(x.len() / 3).enumerate() {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = if amax > 0.0 { amax / e4m3fnuz::MAX } else { 1.0 };
        assert_eq!(descales[h], d);
        for (i, &v) in chunk.iter().enumerate() {
            assert_eq!(codes[h * chunk.len() + i], e4m3fnuz::encode(v / d, Saturation::Saturate), "head {h} x {v}");
        }
    }
}

#[test]
fn nan_and_infinite_elements_follow_the_cuda_conventions() {
    for enc in ENCODINGS {
        // A NaN element: out of the amax, a NaN code; the others as without it.
        let (codes, d) = mirror(enc, &[1.0, f32::NAN, -2.0, 0.5], 1);
        assert_eq!(d[0], 2.0 / enc.max());
        let is_nan = |c: u8| match enc {
            Fp8Encoding::E4m3Fn => e4m3::decode(c).is_nan(),
            Fp8Encoding::E4m3Fnuz => e4m3fnuz::decode(c).is_nan(),
        };
        assert!(is_nan(codes[1]));
        assert_eq!(codes[2], codec(enc, -enc.max()));
        // An infinite element: the descale is infinite, finite elements become zero codes and
        // the infinite one NaN (inf / inf).
        let (codes, d) = mirror(enc, &[1.0, f32::INFINITY, -3.0], 1);
        assert!(d[0].is_infinite());
        assert_eq!(codes[0], 0);
        // inf / inf is a NaN whose sign the hardware picks (x86 sets it, AMD does not), so
        // only NaN-ness is portable: e4m3fn writes S.1111.111, e4m3fnuz 0x80.
        assert!(is_nan(codes[1]), "{:#04x}", codes[1]);
        assert_eq!(codes[2] & 0x7f, 0);
    }
}
