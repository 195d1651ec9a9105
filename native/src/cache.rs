//! Compiled-kernel cache: in memory (read lock on hits, write lock on a miss) and on disk, so a
//! second process skips NVRTC entirely.
//!
//! The key holds every compile-time input: kernel variant, source file, target arch, all `-D`
//! defines (dtype, accumulation modes, head dim, tile config), the NVRTC version and the option
//! list. The disk file name is a SHA-256 of the kernel text, every header's text and that key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use sha2::{Digest, Sha256};

use crate::arch::Arch;
use crate::error::{NativeError, Result};
use crate::nvrtc::Resources;

/// Override of the disk cache folder; empty or `off` disables the disk cache.
pub const ENV_CACHE_DIR: &str = "QUATTN_CACHE_DIR";

/// Headers every kernel may include; supplied to NVRTC by name, never pasted into a kernel.
pub(crate) const HEADERS: [(&str, &str); 1] = [("common.cuh", include_str!("../cuda/common.cuh"))];

/// One `.cu` file of `native/cuda/`, embedded in the binary.
#[derive(Debug)]
pub struct KernelSource {
    /// File name, also NVRTC's program name (shows up in diagnostics).
    pub file: &'static str,
    /// `extern "C"` entry point.
    pub entry: &'static str,
    pub text: &'static str,
}

/// The HMMA forward family.
pub static FWD_HMMA: KernelSource =
    KernelSource { file: "fwd_hmma.cu", entry: "fwd_hmma", text: include_str!("../cuda/fwd_hmma.cu") };

/// The INT8 tcgen05 UMMA forward family (sm_100a only).
pub static FWD_INT8_UMMA: KernelSource = KernelSource {
    file: "fwd_int8_umma.cu",
    entry: "fwd_int8_umma",
    text: include_str!("../cuda/fwd_int8_umma.cu"),
};
/// The wgmma forward family (sm_90a only).
pub static FWD_WGMMA: KernelSource =
    KernelSource { file: "fwd_wgmma.cu", entry: "fwd_wgmma", text: include_str!("../cuda/fwd_wgmma.cu") };

/// The INT8 Q·Kᵀ forward family.
pub static FWD_INT8: KernelSource =
    KernelSource { file: "fwd_int8.cu", entry: "fwd_int8", text: include_str!("../cuda/fwd_int8.cu") };

/// The INT8 Q·Kᵀ forward family on wgmma (sm_90a only).
pub static FWD_WGMMA_INT8: KernelSource = KernelSource {
    file: "fwd_wgmma_int8.cu",
    entry: "fwd_wgmma_int8",
    text: include_str!("../cuda/fwd_wgmma_int8.cu"),
};

/// The INT8 quantization prepass of the native INT8 families (three passes, `-D PASS`).
pub static INT8_PREPASS: KernelSource =
    KernelSource { file: "int8_prepass.cu", entry: "int8_prepass", text: include_str!("../cuda/int8_prepass.cu") };

/// The NVFP4 / MXFP4 quantization prepass (one entry, two modes).
pub static NVFP4_QUANT: KernelSource =
    KernelSource { file: "nvfp4_quant.cu", entry: "nvfp4_quant", text: include_str!("../cuda/nvfp4_quant.cu") };

/// The NVFP4 block-scaled MMA forward family (sm_120a only).
pub static FWD_NVFP4: KernelSource =
    KernelSource { file: "fwd_nvfp4.cu", entry: "fwd_nvfp4", text: include_str!("../cuda/fwd_nvfp4.cu") };

/// Everything that makes one cubin different from another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Variant name, e.g. `fwd_hmma_f16_f32_f32_d128`.
    pub kernel: String,
    pub source_file: &'static str,
    pub arch: Arch,
    /// `-D` defines, sorted by name.
    pub defines: Vec<(String, String)>,
    pub nvrtc_version: (i32, i32),
    pub options: Vec<String>,
}

/// A request to compile `source` for `arch` with `defines`.
#[derive(Clone, Debug)]
pub struct CompileRequest<'a> {
    pub kernel: String,
    pub source: &'a KernelSource,
    pub arch: Arch,
    pub defines: Vec<(String, String)>,
}

/// Where a compiled kernel came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Origin {
    /// NVRTC ran in this process, taking this many milliseconds.
    Compiled { millis: u64 },
    /// Read from the disk cache.
    Disk,
}

/// A cubin with its compile log and ptxas resource summary.
#[derive(Debug)]
pub struct CompiledKernel {
    pub key: CacheKey,
    pub entry: &'static str,
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings, ptxas `-v` summary).
    pub log: String,
    pub resources: Option<Resources>,
    pub origin: Origin,
}

/// In-memory + on-disk cache of compiled kernels.
#[derive(Debug)]
pub struct KernelCache {
    memory: RwLock<HashMap<CacheKey, Arc<CompiledKernel>>>,
    dir: Option<PathBuf>,
}

/// `$QUATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/quattn` / `~/.cache/quattn` (platform cache dir).
pub fn default_cache_dir() -> Option<PathBuf> {
    match std::env::var(ENV_CACHE_DIR) {
        Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("off") => None,
        Ok(v) => Some(PathBuf::from(v)),
        Err(_) => dirs::cache_dir().map(|d| d.join("quattn")),
    }
}

impl KernelCache {
    /// A cache writing cubins to `dir` (`None`: memory only).
    pub fn new(dir: Option<PathBuf>) -> Self {
        KernelCache { memory: RwLock::new(HashMap::new()), dir }
    }

    /// The process-wide cache, on [`default_cache_dir`].
    pub fn global() -> &'static KernelCache {
        static GLOBAL: OnceLock<KernelCache> = OnceLock::new();
        GLOBAL.get_or_init(|| KernelCache::new(default_cache_dir()))
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The full key of a request (needs NVRTC loaded for its version).
    pub fn key(&self, req: &CompileRequest<'_>) -> Result<CacheKey> {
        let version = crate::nvrtc::nvrtc()?.version;
        let mut defines = req.defines.clone();
        defines.sort();
        Ok(CacheKey {
            kernel: req.kernel.clone(),
            source_file: req.source.file,
            arch: req.arch,
            defines,
            nvrtc_version: version,
            options: crate::nvrtc::base_options(req.arch),
        })
    }

    /// Returns the cubin for `req`, compiling it on a miss of both caches. NVRTC diagnostics come
    /// back as [`NativeError::Compile`].
    pub fn get_or_compile(&self, req: &CompileRequest<'_>) -> Result<Arc<CompiledKernel>> {
        let key = self.key(req)?;
        if let Some(hit) = self.memory.read().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(hit);
        }
        let digest = disk_digest(req.source, &key);
        let compiled = match self.read_disk(&digest, &key, req.source.entry) {
            Some(c) => c,
            None => {
                let c = compile_uncached(req.source, key.clone())?;
                self.write_disk(&digest, &c);
                c
            }
        };
        let compiled = Arc::new(compiled);
        let mut map = self.memory.write().unwrap_or_else(|e| e.into_inner());
        // Two threads may have compiled the same key; keep the first so callers share one Arc.
        Ok(map.entry(key).or_insert(compiled).clone())
    }

    fn paths(&self, digest: &str) -> Option<(PathBuf, PathBuf)> {
        let dir = self.dir.as_ref()?;
        Some((dir.join(format!("{digest}.cubin")), dir.join(format!("{digest}.log"))))
    }

    fn read_disk(&self, digest: &str, key: &CacheKey, entry: &'static str) -> Option<CompiledKernel> {
        let (cubin_path, log_path) = self.paths(digest)?;
        let cubin = std::fs::read(&cubin_path).ok()?;
        let log = std::fs::read_to_string(&log_path).ok()?;
        // A truncated or foreign file is a miss, never a cubin handed to the driver.
        if !cubin.starts_with(b"\x7fELF") {
            log::warn!("ignoring malformed cache file {}", cubin_path.display());
            return None;
        }
        log::debug!("{} for {}: disk cache hit {}", key.kernel, key.arch, cubin_path.display());
        Some(CompiledKernel {
            key: key.clone(),
            entry,
            resources: Resources::parse_ptxas_log(&log),
            cubin,
            log,
            origin: Origin::Disk,
        })
    }

    /// Best effort: a read-only or full disk only costs the next process a compile.
    fn write_disk(&self, digest: &str, c: &CompiledKernel) {
        let Some((cubin_path, log_path)) = self.paths(digest) else { return };
        let write = || -> std::io::Result<()> {
            let dir = cubin_path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            // Write-then-rename so a concurrent reader never sees half a file; the log goes
            // first because a cubin without its log is a miss anyway.
            let tmp = |p: &Path| p.with_extension(format!("tmp{}", std::process::id()));
            for (path, bytes) in [(&log_path, c.log.as_bytes()), (&cubin_path, &c.cubin[..])] {
                let t = tmp(path);
                std::fs::write(&t, bytes)?;
                std::fs::rename(&t, path)?;
            }
            Ok(())
        };
        if let Err(e) = write() {
            log::warn!(
                "{}",
                NativeError::Cache { path: cubin_path.clone(), source: e }
            );
        }
    }
}

fn disk_digest(source: &KernelSource, key: &CacheKey) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        // Length-prefixed so that concatenations cannot collide.
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(source.text.as_bytes());
    for (name, text) in HEADERS {
        field(name.as_bytes());
        field(text.as_bytes());
    }
    field(format!("{key:?}").as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(feature = "cuda")]
fn compile_uncached(source: &KernelSource, key: CacheKey) -> Result<CompiledKernel> {
    let mut options = key.options.clone();
    options.extend(key.defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    let start = std::time::Instant::now();
    let out = crate::nvrtc::compile(source.file, source.text, &HEADERS, &options)?;
    let millis = start.elapsed().as_millis() as u64;
    match out {
        crate::nvrtc::Compiled::Ok { cubin, log } => {
            let resources = Resources::parse_ptxas_log(&log);
            log::info!(
                "NVRTC compiled {} for {} in {millis} ms ({} registers)",
                key.kernel,
                key.arch,
                resources.map(|r| r.registers).unwrap_or(0)
            );
            Ok(CompiledKernel { entry: source.entry, cubin, log, resources, origin: Origin::Compiled { millis }, key })
        }
        crate::nvrtc::Compiled::Failed { log } => {
            Err(NativeError::Compile { kernel: key.kernel, arch: key.arch, log })
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn compile_uncached(_source: &KernelSource, _key: CacheKey) -> Result<CompiledKernel> {
    Err(NativeError::NotCompiledWithCuda)
}
