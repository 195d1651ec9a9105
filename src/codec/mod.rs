//! Bit-exact number-format codecs (CPU): the ground truth that kernels and prepasses are tested
//! against.
//!
//! * [`float16`]: f16 / bf16 rounding (RNE, via `half`).
//! * [`fp8`]: OCP E4M3, E5M2, the unsigned UE4M3 scale format, and E4M3FNUZ (AMD gfx942).
//! * [`fp4`]: E2M1 elements and E8M0 scales; [`nvfp4`] and [`mxfp4`] build block-scaled
//!   tensors from them.
//! * [`int8`]: symmetric INT8 for Q and K, K smoothing, and the scale-tensor layouts.
//! * [`fp8_scaled`]: FP8 tensors with f32 descales per tensor, head or block of rows.

pub mod float16;
pub mod fp4;
pub mod fp8;
pub mod fp8_scaled;
pub mod int8;
mod minifloat;
pub mod mxfp4;
pub mod nvfp4;

pub use fp8::Saturation;
