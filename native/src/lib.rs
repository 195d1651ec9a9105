//! Native fast paths of quattn.
//!
//! Hand-written tensor-core attention kernels (`native/cuda/*.cu`, shared helpers in
//! `native/cuda/common.cuh`), compiled at run time with NVRTC through cudarc for the exact
//! target, cached in memory and on disk, checked by disassembly, and launched through cudarc's
//! driver API with plain parameters. This crate does not depend on the `quattn` facade.
//!
//! - [`arch`]: compile targets and compute-capability mapping.
//! - [`tools`]: where libnvrtc, cuobjdump and nvdisasm are found (env overrides, PATH, CUDA
//!   toolkit, Python wheels).
//! - [`cache`]: kernel sources, compile requests, the memory + disk cache.
//! - [`report`]: the per-(variant, arch) compile report used by `quattn kernels` and CI.
//! - [`hmma`]: the mma.sync (HMMA) forward family, its configs and its launcher.
//! - [`int8_umma`]: the INT8 Q·Kᵀ forward family on sm_100a's tcgen05 UMMA (compiled and
//!   disassembled, not run on hardware).
//! - [`int8`]: the INT8 Q·Kᵀ (IMMA) forward family, its configs and its launcher.
//! - [`int8_prepass`]: the INT8 quantization prepass of the native INT8 families (codes,
//!   scales, K smoothing, LSE shift), on the attention kernel's stream.
//! - [`wgmma`]: the fp16 forward family on Hopper's warpgroup MMA (sm_90a; compiled and
//!   disassembled, run on the H100).
//! - [`wgmma_int8`]: the INT8 Q·Kᵀ forward family on Hopper's s8 wgmma (sm_90a; compiled and
//!   disassembled, run on the H100), same host contract as [`int8`].
//! - [`fp8`]: the launch arguments, buffer lengths and addresses both native FP8 families take.
//! - [`fp8_prepass`]: the FP8 quantization prepass of the native FP8 families (f16/bf16 Q, K, V
//!   to e4m3/e5m2 codes and descales, bit-exact with the codec), on the attention kernel's stream.
//! - [`mma_fp8`]: the FP8 (e4m3) forward family on mma.sync, Q·Kᵀ and P·V on e4m3 MMAs
//!   (sm_89 / sm_120a native, compiled and disassembled, not run on such hardware; sm_90
//!   lowered by ptxas and run on the H100 for the numerics), with its V prepass.
//! - [`hip`]: the AMD layer: MFMA kernels for gfx942 / gfx950 (`native/hip/`), compiled and
//!   disassembly-checked with clang, mirrored on the CPU through the MFMA lane layout, and the
//!   HIP runtime (feature `hip`); not run on hardware.
//! - [`decode`]: split-KV decode (flash-decoding) on mma.sync, few query rows per KV head
//!   against a long KV sequence, its splits merged by their LSE in the same launch; also the
//!   prefill of a paged cache, in row blocks.
//! - [`varlen`]: variable-length (packed, `cu_seqlens`) batches of the f16/bf16 forward
//!   kernels, their launch arguments and checks.
//! - [`device`]: device queries.

pub mod append_kv;
pub mod arch;
pub mod cache;
pub mod decode;
pub mod device;
pub mod error;
pub mod hip;
pub mod hmma;
pub mod int8_umma;
pub mod int8;
pub mod int8_prepass;
pub mod fp8;
pub mod fp8_prepass;
pub mod mma_fp8;
pub mod nvfp4;
pub mod nvfp4_quant;
pub mod nvrtc;
pub mod registry;
pub mod report;
pub mod sass;
pub mod tma;
pub mod tools;
pub mod mods;
pub mod varlen;
pub mod wgmma;
pub mod wgmma_int8;
pub mod wgmma_fp8;

pub use arch::Arch;
#[cfg(feature = "cuda")]
pub use decode::DecodeKernel;
#[cfg(feature = "cuda")]
pub use append_kv::AppendKvKernel;
pub use decode::{decode_split, mod_key_range, split_keys, DecodeConfig, DecodeParams, DecodePtrs, PagedArgs, DecodeSplit, DecodeTile, DecodeUnit, DECODE_TILES};
pub use cache::{default_cache_dir, CacheKey, CompileRequest, CompiledKernel, KernelCache, Origin};
pub use error::{NativeError, Result};
/// The shared types of quattn's crates that this crate's API takes: launch shape, element type, strides,
/// accumulation modes, INT8 scale granularity and blocking.
pub use quattn_core::{AttentionShape, DescaleGranularity, Dtype, Fp8Format, Int8Blocking, Int8Granularity, Layout, PvAccum, QkAccum, Strides, TWO_STAGE_CHUNK};
#[cfg(feature = "cuda")]
pub use hmma::HmmaKernel;
#[cfg(feature = "cuda")]
pub use int8_umma::Int8UmmaKernel;
pub use int8_umma::{Int8UmmaArgs, Int8UmmaConfig, Int8UmmaParams, INT8_UMMA_TILES};
pub use hmma::{HmmaConfig, HmmaParams, HmmaTile, HMMA_TILES};
#[cfg(feature = "cuda")]
pub use int8::{Int8Buffers, Int8Kernel};
pub use int8::{Int8Args, Int8Config, Int8Lens, Int8Params, Int8Ptrs, Int8Tile, INT8_TILES};
#[cfg(feature = "cuda")]
pub use int8_prepass::Int8Prepass;
pub use int8_prepass::{Int8PrepassConfig, PrepassLens, PrepassPass, PrepassPtrs, PrepassVariant};
#[cfg(feature = "cuda")]
pub use mma_fp8::Fp8MmaKernel;
#[cfg(feature = "cuda")]
pub use fp8::Fp8Buffers;
pub use fp8::{Fp8Args, Fp8LaunchShape, Fp8Lens, Fp8Ptrs};
#[cfg(feature = "cuda")]
pub use fp8_prepass::Fp8Prepass;
pub use fp8_prepass::{Fp8PrepassConfig, Fp8PrepassLens, Fp8PrepassPass, Fp8PrepassPath, Fp8PrepassPtrs, Fp8PrepassVariant};
pub use mma_fp8::{Fp8MmaConfig, Fp8MmaParams, Fp8MmaUnit, Fp8MmaTileRow, Fp8P, Fp8VtConfig, FP8_MMA_TILES};
pub use nvrtc::{nvrtc, NvrtcInfo, Resources};
pub use registry::NativeKernelId;
#[cfg(feature = "cuda")]
pub use registry::{Loaded, ModuleStore};
pub use report::{compile_family_report, compile_report, KernelReport, KernelVariant};
#[cfg(feature = "cuda")]
pub use wgmma::WgmmaKernel;
pub use wgmma::{WgmmaConfig, WgmmaParams, WgmmaTile, WGMMA_TILES};
pub use mods::{ModParams, ModValues, ModVariant, MOD_MAX_HEADS, MOD_UNBOUNDED};
#[cfg(feature = "cuda")]
pub use wgmma_int8::Int8WgmmaKernel;
pub use tma::TmaSpec;
pub use varlen::{VarlenLens, VarlenParams, VarlenPtrs, VarlenShape};
pub use wgmma_int8::{vt_key, Int8WgmmaConfig, Int8WgmmaParams, Int8WgmmaPv, INT8_FP8_FLUSH, INT8_FP8_TILES};
