//! Typed errors of the native layer. Nothing here panics or prints: every failure (missing
//! tool, NVRTC diagnostics, refused shape, driver error) becomes a value naming what failed.

use std::path::PathBuf;

use crate::arch::Arch;

/// Result alias of this crate.
pub type Result<T, E = NativeError> = std::result::Result<T, E>;

/// Everything that can go wrong below the facade.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// The crate was built without the `cuda` feature.
    #[error("quattn-native was built without the `cuda` feature")]
    NotCompiledWithCuda,

    /// libnvrtc could not be located or loaded.
    #[error("NVRTC not found: {0}")]
    NvrtcNotFound(String),

    /// The CUDA driver (libcuda) could not be loaded, e.g. on a machine without a GPU.
    #[error("CUDA driver library not available: {0}")]
    DriverNotFound(String),

    /// NVRTC rejected the kernel; `log` is its full diagnostic output.
    #[error("NVRTC failed to compile {kernel} for {arch}: {log}")]
    Compile { kernel: String, arch: Arch, log: String },

    /// An NVRTC API call failed outside of compilation proper.
    #[error("NVRTC call {call} failed: {code}")]
    Nvrtc { call: &'static str, code: String },

    /// A disassembler (cuobjdump / nvdisasm) could not be found or failed.
    #[error("disassembler {tool}: {message}")]
    Disassembler { tool: &'static str, message: String },

    /// The disk cache could not be read or written (never fatal for compilation itself;
    /// surfaced only by APIs that operate on the cache directly).
    #[error("kernel cache at {path}: {source}")]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The kernel family has no variant for this head dim; the facade falls back.
    #[error("{kernel}: head dim {head_dim} not supported (supported: {supported:?})")]
    UnsupportedHeadDim { kernel: &'static str, head_dim: usize, supported: &'static [usize] },

    /// The requested dtype / accumulation combination does not exist on this kernel family.
    #[error("{kernel}: unsupported configuration: {reason}")]
    UnsupportedConfig { kernel: &'static str, reason: String },

    /// The device is older than what the kernel needs.
    #[error("{kernel} needs {needs} or newer, device is {device}")]
    UnsupportedArch { kernel: &'static str, needs: Arch, device: String },

    /// Launch arguments failed validation before anything touched the GPU.
    #[error("invalid launch arguments: {0}")]
    InvalidArgs(String),

    /// The HIP runtime or hipRTC (ROCm) could not be loaded or initialized.
    #[error("HIP runtime not available: {0}")]
    HipNotFound(String),

    /// A HIP or hipRTC call failed.
    #[error("HIP call {call} failed: {code}")]
    Hip { call: &'static str, code: String },

    /// A HIP kernel did not compile; `log` is the compiler's output.
    #[error("HIP compile of {kernel} for {arch} failed: {log}")]
    HipCompile { kernel: String, arch: String, log: String },

    /// The offline HIP tools (clang, llvm-objdump, llvm-readelf) were not found or failed.
    #[error("HIP tool: {0}")]
    HipToolNotFound(String),

    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}
