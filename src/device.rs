//! [`Device`] and [`Strategy`]: where attention runs, and what the caller forces.

use std::fmt;

/// Which wgpu adapter to open (mirrors the adapter classes wgpu reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WgpuAdapter {
    /// The adapter wgpu picks by default (high-performance preference).
    #[default]
    Default,
    /// The n-th discrete GPU.
    Discrete(usize),
    /// The n-th integrated GPU.
    Integrated(usize),
    /// The n-th virtual GPU.
    Virtual(usize),
    /// A software adapter (llvmpipe, WARP, SwiftShader).
    Software,
}

/// Where attention runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The best device present: a CUDA GPU, else a hardware wgpu adapter, else the CPU.
    #[default]
    Auto,
    /// Multi-threaded CPU kernels.
    Cpu,
    /// CubeCL kernels through wgpu (Vulkan, Metal, DX12, or a software adapter), compiled to
    /// WGSL; in a build with the `spirv` feature, Vulkan adapters get SPIR-V instead (CubeCL
    /// 0.10 chooses the compiler per build, not per device). [`crate::DeviceInfo::kind`] says
    /// which ran: `wgpu` or `wgpu-spirv`.
    Wgpu(WgpuAdapter),
    /// CubeCL kernels through wgpu's Vulkan backend, compiled by CubeCL's SPIR-V compiler
    /// (feature `spirv`), which offers the driver's cooperative matrices
    /// (VK_KHR_cooperative_matrix) to the matrix-unit kernel. A typed error when the build
    /// lacks the feature, the adapter is not a Vulkan one, or its driver lacks what the SPIR-V
    /// compiler needs.
    WgpuSpirv(WgpuAdapter),
    /// CUDA GPU by ordinal: CubeCL kernels, and native kernels where the device matches.
    Cuda(usize),
    /// AMD GPU by HIP ordinal (ROCm's libamdhip64 loaded at run time, feature `hip`): the native
    /// MFMA kernels on gfx942 / gfx950, compiled by hipRTC. **Not run on hardware**: the
    /// kernels are compiled, disassembly-checked and mirrored on the CPU only. Without ROCm, a
    /// typed [`crate::Error::DeviceUnavailable`].
    Hip(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Wgpu(a) => write!(f, "wgpu({a:?})"),
            Device::WgpuSpirv(a) => write!(f, "wgpu-spirv({a:?})"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Hip(i) => write!(f, "hip:{i}"),
        }
    }
}

/// Families of native (hand-written, per-architecture) kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NativeKind {
    /// mma.sync HMMA FP16/BF16 kernels (sm_80+).
    Hmma,
    /// Warpgroup-MMA (wgmma) FP16 kernel with f32 accumulation (sm_90a: H100/H200).
    Wgmma,
    /// INT8 Q/K with mma.sync IMMA (sm_80+).
    Int8Imma,
    /// INT8 Q/K with s8 warpgroup MMA (sm_90a: H100/H200).
    Int8Wgmma,
    /// INT8 Q/K with tcgen05 UMMA (sm_100a; compiled and SASS-checked, not run on hardware).
    Int8Umma,
    /// FP8 e4m3 Q·Kᵀ and P·V on warpgroup MMA, warp-specialized with TMA (sm_90a: H100/H200).
    Fp8Wgmma,
    /// FP8 e4m3 Q·Kᵀ on mma.sync (native on sm_89 and sm_120a, compiled and SASS-checked, not
    /// run on such hardware; on sm_90 the same PTX runs as an f16 sequence).
    Fp8Mma,
    /// f16/bf16 flash attention on AMD MFMA (HIP; gfx950 `32x32x16`, gfx942 `32x32x8`).
    /// Compiled and disassembly-checked, not run on hardware.
    HipMfma,
    /// FP8 e4m3 flash attention on AMD MFMA (`32x32x16_fp8_fp8`; OCP e4m3 on gfx950, e4m3fnuz
    /// on gfx942). Compiled and disassembly-checked, not run on hardware.
    HipMfmaFp8,
    /// Split-KV decode (flash-decoding) on mma.sync, f16/bf16 with f32 accumulation (sm_80+):
    /// the query rows of a GQA group (times q_len, at most 64) in one tile against a slice of
    /// the keys, the slices merged by their LSE in the same launch; on a paged cache also any
    /// number of rows (a prefill), in tiles of 64.
    Decode,
    /// NVFP4 Q·Kᵀ on the block-scaled mma.sync (sm_120a; compiled and SASS-checked, not run on
    /// hardware, no launch path in the facade yet: its row never selects it).
    Nvfp4,
}

impl NativeKind {
    pub const fn name(self) -> &'static str {
        match self {
            NativeKind::Hmma => "hmma",
            NativeKind::Wgmma => "wgmma",
            NativeKind::Int8Imma => "int8-imma",
            NativeKind::Int8Wgmma => "int8-wgmma",
            NativeKind::Int8Umma => "int8-umma",
            NativeKind::Fp8Wgmma => "fp8-wgmma",
            NativeKind::Fp8Mma => "fp8-mma",
            NativeKind::HipMfma => "mfma",
            NativeKind::HipMfmaFp8 => "mfma-fp8",
            NativeKind::Decode => "decode",
            NativeKind::Nvfp4 => "nvfp4",
        }
    }
}

/// Families of portable (CubeCL) kernels, for forcing one with [`Strategy::PortableFamily`]
/// (A/B runs, tests); [`Strategy::Portable`] lets the runtime's capabilities choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortableKind {
    /// The register-tiled FMA kernel; runs on every CubeCL device.
    Fma,
    /// Cooperative-matrix (WMMA) kernel, softmax through shared memory: CUDA, and Vulkan with
    /// cooperative matrices (SPIR-V builds).
    Cmma,
    /// Manual-MMA (`mma.sync` m16n8k16) kernel with the softmax in registers: CUDA sm_80+.
    Mma,
    /// The INT8 Q/K kernel (after the CubeCL quantization prepass); every CubeCL device.
    Int8,
    /// The FP8 kernel: e4m3/e5m2 codes of Q, K and V with f32 descales, decoded as they are
    /// staged, f32 softmax and accumulation, P rounded to f16; every CubeCL device.
    Fp8,
    /// The 4-bit kernel: NVFP4 Q/K (E2M1 codes with UE4M3 block scales), bf16 or NVFP4 V,
    /// decoded as they are staged, f32 softmax and accumulation; every CubeCL device.
    Fp4,
    /// Split-KV decode (flash-decoding): the q heads of a GQA group and their positions packed
    /// into one query tile per (batch, KV head), the KV sequence split across cubes and the
    /// partial states merged; float modes, decode shapes (at most 64 packed rows per KV head,
    /// at least 512 keys), or on a paged cache, which only this family reads among the portable
    /// ones, any length and any number of rows (prefill and chunked prefill in blocks of 64
    /// rows); no score modifiers; every CubeCL device.
    Decode,
}

impl PortableKind {
    pub const fn name(self) -> &'static str {
        match self {
            PortableKind::Fma => "fma",
            PortableKind::Cmma => "cmma",
            PortableKind::Mma => "mma",
            PortableKind::Int8 => "int8",
            PortableKind::Fp8 => "fp8",
            PortableKind::Fp4 => "fp4",
            PortableKind::Decode => "decode",
        }
    }
}

/// What the caller forces; `Auto` lets dispatch choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// The fastest path that supports the problem on the device.
    #[default]
    Auto,
    /// The CubeCL kernels (or the CPU kernel on [`Device::Cpu`]).
    Portable,
    /// One portable (CubeCL) kernel family; a typed error if the device or problem does not
    /// support it.
    PortableFamily(PortableKind),
    /// One native kernel family; a typed error if it does not support the problem or device.
    Native(NativeKind),
    /// The CPU emulation of the precision (rounds where a kernel rounds); slow, for checking.
    Reference,
}
