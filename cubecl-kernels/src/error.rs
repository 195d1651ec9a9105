//! Why a launch was refused. Every check runs on the host before anything is enqueued.

use crate::problem::ElemType;

/// A launch the crate refused, with enough detail to act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LaunchError {
    #[error("head dims (qk {head_dim}, v {v_head_dim}) are not supported; supported: {supported:?}")]
    UnsupportedHeadDim {
        head_dim: u32,
        v_head_dim: u32,
        supported: &'static [u32],
    },

    #[error("element type {elem:?} is not supported by runtime `{runtime}`")]
    UnsupportedElemType { elem: ElemType, runtime: &'static str },

    #[error("invalid problem: {reason}")]
    InvalidProblem { reason: String },

    #[error("{tensor} buffer holds {available_bytes} bytes but the strides reach {required_bytes}")]
    BufferTooSmall {
        tensor: &'static str,
        required_bytes: u64,
        available_bytes: u64,
    },

    #[error("{tensor} spans {elems} elements, beyond the kernel's 32-bit indexing")]
    IndexOverflow { tensor: &'static str, elems: u64 },

    #[error("kernel `{kernel}` needs {required} bytes of shared memory, runtime allows {available}")]
    SharedMemoryExceeded {
        kernel: String,
        required: usize,
        available: usize,
    },

    #[error("kernel `{kernel}` needs {required} units per cube, runtime allows {available}")]
    TooManyUnits {
        kernel: String,
        required: u32,
        available: u32,
    },

    #[error("grid ({x}, {y}, {z}) exceeds the runtime's maximum cube count {max:?}")]
    TooManyCubes {
        x: u32,
        y: u32,
        z: u32,
        max: (u32, u32, u32),
    },

    #[error("invalid tile configuration {tiles}: {reason}")]
    InvalidTiles { tiles: String, reason: String },

    #[error("variant `{variant}` is not available: {reason}")]
    VariantUnavailable {
        variant: &'static str,
        reason: String,
    },
}
