//! The HIP kernel sources (`native/hip/`), embedded in the binary.

/// One `.hip` file: its name, `extern "C"` entry point and text.
#[derive(Debug)]
pub struct HipSource {
    pub file: &'static str,
    pub entry: &'static str,
    pub text: &'static str,
}

/// Headers the sources include by name; supplied to hipRTC as named headers and written next to
/// the source for an offline clang compile.
pub const HIP_HEADERS: [(&str, &str); 1] = [("common.h", include_str!("../../hip/common.h"))];

/// The f16/bf16 MFMA forward family.
pub static FWD_MFMA: HipSource =
    HipSource { file: "fwd_mfma.hip", entry: "fwd_mfma", text: include_str!("../../hip/fwd_mfma.hip") };

/// The FP8 MFMA forward family.
pub static FWD_MFMA_FP8: HipSource =
    HipSource { file: "fwd_mfma_fp8.hip", entry: "fwd_mfma_fp8", text: include_str!("../../hip/fwd_mfma_fp8.hip") };

/// The FP8 quantization prepass of the FP8 family (two passes, `-D PASS`).
pub static FP8_PREPASS_HIP: HipSource =
    HipSource { file: "fp8_prepass.hip", entry: "fp8_prepass", text: include_str!("../../hip/fp8_prepass.hip") };
