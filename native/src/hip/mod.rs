//! The AMD native layer: HIP attention kernels for CDNA3 (gfx942) and CDNA4 (gfx950) on the
//! 32×32 MFMA instructions, their configurations, the compile + disassembly report, the lane
//! layout emulation, and (feature `hip`) the HIP runtime and hipRTC loaded at run time.
//!
//! **Not run on hardware**: there is no AMD GPU where this was written. Every variant is
//! compiled for both targets by LLVM clang, disassembled and checked ([`report`]), and its tile
//! loop is mirrored on the CPU through the MFMA operand layouts ([`layout`]); the runtime's
//! paths without ROCm are tested. Nothing here has executed on an AMD device.
//!
//! - [`config`]: targets ([`GfxArch`]), the families ([`HipKernelId`]), defines, expected
//!   instructions, the launch ABI ([`HipFwdParams`]).
//! - [`layout`]: the MFMA lane layout table and the CPU mirror of the kernels' tile loop.
//! - [`compile`]: clang (offline) and the [`compile::HipCompiler`] interface, the code object
//!   cache.
//! - [`prepass`]: the FP8 quantization prepass (f16/bf16 to the target's e4m3 with descales)
//!   and the host transliteration of its encode.
//! - [`report`]: the per-(variant, arch) compile report.
//! - [`runtime`] (feature `hip`): libamdhip64 and libhiprtc through libloading.

pub mod compile;
pub mod config;
pub mod layout;
pub mod prepass;
pub mod report;
#[cfg(feature = "hip")]
pub mod runtime;
pub mod source;

pub use compile::{Clang, HipCache, HipCodeObject, HipCompiler, HipVariant};
pub use config::{Fp8Encoding, Fp8Mfma, GfxArch, HipFp8P, HipFwdParams, HipKernelId, HipTile, MfmaConfig, MfmaFp8Config, HIP_HEAD_DIMS, HIP_TILE, HIP_TILE_GFX942_D128};
pub use layout::{emulate_forward, EmulatedHead, EmulatedKernel, EmulatedOutput, MfmaShape};
pub use prepass::{encode_e4m3, HipPrepassId, HIP_PREPASS_THREADS};
pub use report::{all_variants, hip_compile_report, HipKernelReport};
