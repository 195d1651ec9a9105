//! Offline CUDA compile checks of the CubeCL kernels (tests, feature `cuda`; no GPU needed).
//! A kernel's definition is expanded through a wgpu client (llvmpipe under CI), translated to
//! CUDA C++ by CubeCL's CUDA compiler with the options CubeCL's CUDA runtime uses on the target
//! architecture, and compiled by NVRTC as that runtime compiles it, with ptxas' resource report.
//! What NVRTC rejects here fails at the first launch on a GPU, so every kernel's `cuda_tests`
//! compile the variants its launcher can select on CUDA.
//!
//! Without NVRTC, the CUDA headers or a wgpu adapter the checks skip (saying why) on a
//! developer machine; under CI (`CI` set), where `.ci/run` installs them, a missing tool is a
//! failure.

use std::path::PathBuf;

use cubecl::cuda::CudaCompiler;
use cubecl::ir::{ElemType, StorageType, UIntKind};
use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use cubecl::Compiler as _;
use quattn_native::Resources;

use super::fma_vec::FmaVecConfig;
use super::AttnShapeCompilationArg;
use crate::launch::{CubeLimits, PortableKernel};
use crate::problem::SUPPORTED_HEAD_DIMS;
use crate::tiling::{fma_vec_candidates, FmaVecTiles};
use crate::Dtype;

/// The wgpu client the kernels are expanded with, or `None` (skipping) without an adapter
/// outside CI.
pub(crate) fn client() -> Option<ComputeClient<WgpuRuntime>> {
    let instance = wgpu::Instance::default();
    let adapters = cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    if adapters.is_empty() {
        // CI installs mesa's llvmpipe: there a missing adapter is a failure.
        assert!(std::env::var_os("CI").is_none(), "no wgpu adapter under CI (mesa-vulkan-drivers missing?)");
        println!("SKIPPED: no wgpu adapter to expand the kernel with");
        return None;
    }
    Some(WgpuRuntime::client(&WgpuDevice::DefaultDevice))
}

/// Which variants an offline check compiles. NVRTC and ptxas take 5 to 20 s per kernel on two
/// cores, and a full product of a kernel's options (element types x head dims x modes) is
/// dozens of kernels: by default a variant is compiled when it brings a value of one of its
/// factors that no compiled variant had (so every element type, head dim, mode and target is
/// compiled at least once, in the first combination the sweep reaches); `QUATTN_NVRTC_ALL=1`
/// compiles the whole product.
pub(crate) struct Cover {
    all: bool,
    seen: std::collections::HashSet<(usize, String)>,
}

impl Cover {
    pub(crate) fn new() -> Cover {
        Cover { all: std::env::var("QUATTN_NVRTC_ALL").is_ok_and(|v| v == "1"), seen: Default::default() }
    }

    /// Whether to compile the variant of these factor values (in a fixed order per check).
    pub(crate) fn take(&mut self, factors: &[&dyn std::fmt::Debug]) -> bool {
        let keys: Vec<(usize, String)> = factors.iter().enumerate().map(|(i, f)| (i, format!("{f:?}"))).collect();
        let new = keys.iter().any(|k| !self.seen.contains(k));
        self.seen.extend(keys);
        self.all || new
    }
}

/// The address type the launchers run with (CubeCL's default for kernels without a dynamic
/// address type).
pub(crate) const ADDR: StorageType = StorageType::Scalar(ElemType::UInt(UIntKind::U32));

/// CubeCL's C++ compiler numbers its temporaries (`_tmp_N`) with process-wide state: two
/// tests compiling kernels at once produce sources that declare `_tmp_0` twice. Tests that
/// call `CudaCompiler::compile` hold this lock.
pub(crate) static COMPILE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The CUDA headers CubeCL's sources include (`cuda_fp16.h`, `cuda_runtime.h`, `mma.h`):
/// a toolkit's, or the `nvidia-cuda-runtime` + `nvidia-cuda-crt` wheels' next to NVRTC's.
pub(crate) fn cuda_include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|root| PathBuf::from(root).join("include"))
        .collect();
    candidates.push("/usr/local/cuda/include".into());
    for lib in quattn_native::tools::nvrtc_lib_dirs() {
        if let Some(parent) = lib.parent() {
            candidates.push(parent.join("include"));
        }
    }
    candidates.into_iter().find(|dir| dir.join("cuda_fp16.h").is_file() && dir.join("cuda_runtime.h").is_file())
}

/// NVRTC: `source` to a cubin, with the compile log.
pub(crate) fn nvrtc_cubin(source: &str, options: &[String]) -> Result<(Vec<u8>, String), String> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::CString;
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, None).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` is a live program until destroyed below; buffers are sized by NVRTC.
    unsafe {
        let compiled = result::compile_program(prog, options);
        let log = result::get_program_log(prog).map_err(|e| format!("{e:?}"))?;
        let log = std::ffi::CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
        let out = match compiled {
            Err(e) => Err(format!("{e:?}: {log}")),
            Ok(()) => {
                let mut n = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut n).result().map_err(|e| format!("{e:?}"))?;
                let mut cubin = vec![0u8; n];
                sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut std::ffi::c_char)
                    .result()
                    .map_err(|e| format!("{e:?}"))?;
                Ok((cubin, log))
            }
        };
        let _ = result::destroy_program(prog);
        out
    }
}

/// The runtime shape argument of every attention kernel (all scalars).
pub(crate) fn attn_shape_arg() -> AttnShapeCompilationArg {
    AttnShapeCompilationArg {
        q_len: (),
        kv_len: (),
        group: (),
        q_heads: (),
        q_s0: (),
        q_s1: (),
        q_s2: (),
        k_s0: (),
        k_s1: (),
        k_s2: (),
        v_s0: (),
        v_s1: (),
        v_s2: (),
        o_s0: (),
        o_s1: (),
        o_s2: (),
        scale: (),
        lse_empty: (),
    }
}

/// A global array argument (no in-place aliasing, as every launcher binds them).
pub(crate) fn array() -> ArrayCompilationArg {
    ArrayCompilationArg { inplace: None }
}

/// Launch settings of a 1-D cube of `units` units, 32-bit addresses.
pub(crate) fn settings(units: usize) -> KernelSettings {
    KernelSettings::default().cube_dim(CubeDim::new_1d(units as u32)).address_type(AddressType::U32)
}

/// Every supported head dim with `dv = d`, and one `dv != d`.
pub(crate) fn head_dims() -> Vec<(usize, usize)> {
    let mut dims: Vec<(usize, usize)> = SUPPORTED_HEAD_DIMS.iter().map(|&d| (d, d)).collect();
    dims.push((64, 128));
    dims
}

/// The vector FMA tiling the selection gives the kernel `wrap(tiles)` on `arch` for these head
/// dims (`dtype`: the element type of its fit check): the first entry of the table that
/// passes `PortableKernel::check_fits` within the architecture's limits, as `first_fit`,
/// `select_int8` and `select_fp4` take it.
pub(crate) fn selected_fma_tiles(
    arch: Arch,
    d: usize,
    dv: usize,
    dtype: Dtype,
    wrap: impl Fn(FmaVecTiles) -> PortableKernel,
) -> FmaVecTiles {
    let limits = CubeLimits { max_shared_bytes: arch.max_shared_bytes(), max_units: 1024 };
    *fma_vec_candidates(d.max(dv) as u32)
        .iter()
        .find(|&&t| wrap(t).check_fits(limits, d as u32, dv as u32, dtype).is_ok())
        .unwrap_or_else(|| panic!("no vector tiling fits d={d} dv={dv} {dtype} on {arch:?}"))
}

/// The vector kernels' compile-time key as the launchers build it on CUDA (`fma_vec_config`):
/// plane reductions always (CUDA has plane shuffles on 32-wide planes, `tc <= 32`).
pub(crate) fn fma_vec_config(tiles: &FmaVecTiles, d: usize, dv: usize, causal: bool, write_lse: bool, lazy_rescale: bool) -> FmaVecConfig {
    FmaVecConfig {
        head_dim: d,
        v_head_dim: dv,
        bq: tiles.bq as usize,
        bk: tiles.bk as usize,
        tr: tiles.tr as usize,
        tc: tiles.tc as usize,
        causal,
        write_lse,
        lazy_rescale,
        plane_reduce: true,
    }
}

/// A GPU architecture the portable kernels run on through CubeCL's CUDA runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arch {
    /// Ampere (A100): the oldest architecture with every portable family.
    Sm80,
    /// Hopper (H100).
    Sm90,
}

impl Arch {
    const fn version(self) -> u32 {
        match self {
            Arch::Sm80 => 80,
            Arch::Sm90 => 90,
        }
    }

    /// The options CubeCL's CUDA runtime compiles with on a device of this architecture
    /// (cubecl-cuda `runtime.rs`): fast math always, grid constants from sm_70, `tanh.approx`
    /// from sm_75 (CUDA 12.8+; NVRTC here is 13.0), clusters and `elect.sync` from sm_90.
    pub(crate) fn cubecl_options(self) -> <CudaCompiler as cubecl::Compiler>::CompilationOptions {
        let v = self.version();
        let mut options = <CudaCompiler as cubecl::Compiler>::CompilationOptions::default();
        options.supports_features.fast_math = true;
        options.supports_features.grid_constants = v >= 70;
        options.supports_features.fast_tanh = v >= 75;
        options.supports_features.clusters = v >= 90;
        options.supports_features.elect_sync = v >= 90;
        options
    }

    /// NVRTC's target as the runtime names it: the architecture-specific `sm_90a` from sm_90 on.
    fn nvrtc_target(self) -> String {
        let v = self.version();
        if v >= 90 {
            format!("sm_{v}a")
        } else {
            format!("sm_{v}")
        }
    }

    /// Dynamic shared memory a cube may opt into (`MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, what
    /// the runtime checks a launch against): 163 KiB on the A100, 227 KiB on the H100.
    pub(crate) const fn max_shared_bytes(self) -> usize {
        match self {
            Arch::Sm80 => 166_912,
            Arch::Sm90 => 232_448,
        }
    }
}

/// One kernel variant to compile.
pub(crate) struct Variant {
    pub name: String,
    pub arch: Arch,
    pub definition: KernelDefinition,
    /// The shared memory CubeCL must declare, where the fit check counts it exactly.
    pub shared_bytes: Option<usize>,
    /// ptxas must not spill (see [`prefetch_spill_free`]).
    pub spill_free: bool,
}

/// Whether ptxas is held to spilling nothing in the vector FMA kernels that prefetch whole K and
/// V tiles in the input type (`fma_vec`, `fma_vec_mods`, `fma_half`) at these head dims: up to
/// head dim 128. At 256 the table's first tiling (16 query rows x 64 keys on 4 x 16 units)
/// gives each unit a prefetch of 64 4-wide vectors of K and 64 of V, and ptxas spills on
/// sm_90a: 17-25 KB at 32 registers (`fma_vec`; `fma_vec_mods` with f32), 3-4 KB at 255
/// (`fma_vec_mods` with f16/bf16, `fma_half`). A known cost of that tiling on CUDA, printed by
/// [`OfflineCuda::check_all`] and not failed on. The INT8 and 4-bit kernels, which prefetch
/// codes, do not spill there and are held to it at every head dim.
pub(crate) fn prefetch_spill_free(d: usize, dv: usize) -> bool {
    d.max(dv) <= 128
}

/// The tools of the offline compile: a wgpu client to expand kernels with and the CUDA headers
/// (NVRTC is loaded by `quattn_native::nvrtc`).
pub(crate) struct OfflineCuda {
    client: ComputeClient<WgpuRuntime>,
    include: PathBuf,
}

impl OfflineCuda {
    /// The tools, or `None` after saying why (a failure under CI).
    pub(crate) fn new() -> Option<Self> {
        let skip = |why: String| {
            assert!(std::env::var_os("CI").is_none(), "CUDA tools required under CI: {why}");
            println!("SKIPPED: {why}");
        };
        let Some(include) = cuda_include_dir() else {
            skip(
                "no CUDA headers (cuda_fp16.h); set CUDA_HOME or `pip install nvidia-cuda-runtime \
                 nvidia-cuda-crt` next to nvidia-cuda-nvrtc (.ci/install-cuda-tools.sh does)"
                    .into(),
            );
            return None;
        };
        if let Err(e) = quattn_native::nvrtc() {
            skip(e.to_string());
            return None;
        }
        Some(OfflineCuda { client: client()?, include })
    }

    pub(crate) fn client(&self) -> &ComputeClient<WgpuRuntime> {
        &self.client
    }

    /// CubeCL's CUDA translation of `definition` for `arch`: the source and the shared memory
    /// it declares.
    pub(crate) fn translate(&self, definition: KernelDefinition, arch: Arch) -> Result<(String, usize), String> {
        let _serial = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let kernel = CudaCompiler::default()
            .compile(definition, &arch.cubecl_options(), ExecutionMode::Unchecked, ADDR)
            .map_err(|e| format!("CubeCL's CUDA compiler: {e:?}"))?;
        Ok((kernel.to_string(), kernel.shared_memory_size()))
    }

    /// NVRTC's compile of `source` for `arch` with the options of CubeCL's runtime (the target,
    /// `-lineinfo`) and `-Xptxas=-v`: ptxas' report, or NVRTC's errors (its warnings left out).
    pub(crate) fn nvrtc(&self, source: &str, arch: Arch) -> Result<Resources, String> {
        let options = vec![
            format!("--gpu-architecture={}", arch.nvrtc_target()),
            format!("--include-path={}", self.include.display()),
            "-lineinfo".to_string(),
            "-Xptxas=-v".to_string(),
        ];
        let (_, log) = nvrtc_cubin(source, &options).map_err(|log| {
            // Each error line and the source line NVRTC quotes after it.
            let lines: Vec<&str> = log.lines().collect();
            let errors: Vec<&str> = (0..lines.len())
                .filter(|&i| lines[i].contains("error") || (i > 0 && lines[i - 1].contains("error")))
                .map(|i| lines[i])
                .collect();
            if errors.is_empty() {
                format!("NVRTC: {log}")
            } else {
                format!("NVRTC: {}", errors.join("\n"))
            }
        })?;
        Resources::parse_ptxas_log(&log).ok_or_else(|| format!("no ptxas report in {log}"))
    }

    /// Compiles every variant and fails naming each one that NVRTC rejects, that declares other
    /// shared memory than expected or more than its architecture allows a cube, or that ptxas
    /// spills where it must not (the variants are those the launchers select on CUDA, so each
    /// spill is paid on a GPU). With `QUATTN_CUDA_SOURCE_DIR` set, every source is written there
    /// as `NAME.cu`.
    pub(crate) fn check_all(&self, variants: impl IntoIterator<Item = Variant>) {
        let dump = std::env::var_os("QUATTN_CUDA_SOURCE_DIR").map(PathBuf::from);
        let mut failures = Vec::new();
        let mut count = 0;
        for v in variants {
            count += 1;
            let name = format!("{}_{:?}", v.name, v.arch).to_lowercase();
            let fail = |failures: &mut Vec<String>, e: String| {
                println!("{name}: does not compile: {e}");
                failures.push(format!("{name}: does not compile: {e}"));
            };
            let (source, declared) = match self.translate(v.definition, v.arch) {
                Ok(t) => t,
                Err(e) => {
                    fail(&mut failures, e);
                    continue;
                }
            };
            if let Some(dir) = &dump {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(dir.join(format!("{name}.cu")), &source).unwrap();
            }
            let r = match self.nvrtc(&source, v.arch) {
                Ok(r) => r,
                Err(e) => {
                    fail(&mut failures, e);
                    continue;
                }
            };
            let shared = declared + r.static_shared_bytes as usize;
            println!(
                "{name}: {} registers, {} B spilled, {} B shared ({} B static)",
                r.registers,
                r.spill_bytes(),
                shared,
                r.static_shared_bytes
            );
            if let Some(expected) = v.shared_bytes {
                if declared != expected {
                    failures.push(format!("{name}: declares {declared} B of shared memory, the fit check counts {expected}"));
                }
            }
            if shared > v.arch.max_shared_bytes() {
                failures.push(format!("{name}: {shared} B of shared memory, over the {} B a cube may use", v.arch.max_shared_bytes()));
            }
            if v.spill_free && r.spill_bytes() != 0 {
                failures.push(format!("{name}: ptxas spills {} B", r.spill_bytes()));
            }
        }
        assert!(count > 0, "no variant to compile");
        println!("{count} variants compiled (QUATTN_NVRTC_ALL=1 compiles every combination)");
        assert!(failures.is_empty(), "{} of {count} variants fail:\n{}", failures.len(), failures.join("\n"));
    }
}

