//! Why a launch was refused. Every check runs on the host before anything is enqueued.

use quattn_core::Dtype;

use crate::launch::Family;

/// A launch the crate refused, with enough detail to act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LaunchError {
    #[error("head dims (qk {head_dim}, v {v_head_dim}) are not supported; supported: {supported:?}")]
    UnsupportedHeadDim {
        head_dim: usize,
        v_head_dim: usize,
        supported: &'static [usize],
    },

    #[error("element type {dtype} is not supported by `{runtime}`")]
    UnsupportedDtype { dtype: Dtype, runtime: &'static str },

    #[error("invalid problem: {reason}")]
    InvalidProblem { reason: String },

    #[error("{what} = {value} does not fit the kernels' 32-bit indexing")]
    TooLarge { what: &'static str, value: usize },

    #[error("the vector kernels cannot read these tensors: {reason}; realign or pad them")]
    UnalignedLayout { reason: String },

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

    #[error("the {family} kernel family cannot run this: {reason}")]
    FamilyUnavailable { family: Family, reason: String },

    #[error("kernel `{kernel}` does not run this: {reason}")]
    WrongKernel { kernel: String, reason: String },
}
