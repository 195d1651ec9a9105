//! Compiling the HIP sources to AMD code objects, through hipRTC at run time or an LLVM clang
//! offline (CI and `quattn kernels`, no ROCm needed), with the memory + disk cache design of
//! the NVRTC path (`crate::cache`): the key holds every compile input, the disk file name is a
//! SHA-256 of the source, the headers and that key, files are written then renamed, and a file
//! that is not an ELF is a miss.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock, RwLock};

use sha2::{Digest, Sha256};

use super::config::{GfxArch, HipKernelId};
use super::source::{HipSource, HIP_HEADERS};
use crate::cache::Origin;
use crate::error::{NativeError, Result};

/// Override: the clang that compiles HIP for amdgcn offline.
pub const ENV_HIP_CLANG: &str = "QUATTN_HIP_CLANG";
/// Override: llvm-objdump for AMD code objects.
pub const ENV_LLVM_OBJDUMP: &str = "QUATTN_LLVM_OBJDUMP";
/// Override: llvm-readelf (code object metadata notes).
pub const ENV_LLVM_READELF: &str = "QUATTN_LLVM_READELF";

/// Everything that makes one code object different from another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HipCacheKey {
    pub kernel: String,
    pub source_file: &'static str,
    pub arch: GfxArch,
    /// `-D` defines, sorted by name.
    pub defines: Vec<(String, String)>,
    /// The compiler and its version (`hiprtc 7.0`, `clang version 22.1.8`).
    pub compiler: String,
    pub options: Vec<String>,
}

/// A compiled code object (an ELF for `hipModuleLoadData`).
#[derive(Debug)]
pub struct HipCodeObject {
    pub key: HipCacheKey,
    pub entry: &'static str,
    pub code: Vec<u8>,
    pub log: String,
    pub origin: Origin,
}

/// A compiled HIP kernel variant (an attention family's [`HipKernelId`] or the prepass's
/// [`super::prepass::HipPrepassId`]): what the cache keys it by and what the compile report
/// checks in its code object.
pub trait HipVariant: Send + Sync {
    /// Unique among every variant of every source.
    fn name(&self) -> String;
    fn source(&self) -> &'static HipSource;
    /// The `-D` defines on `arch`, sorted by name.
    fn defines(&self, arch: GfxArch) -> Result<Vec<(String, String)>>;
    /// Targets it is built and checked for.
    fn targets(&self) -> &'static [GfxArch];
    /// Instructions the code object must contain; any `v_mfma*` not among them is unexpected.
    fn expected_instructions(&self, arch: GfxArch) -> Vec<String>;
    /// MFMAs one wave issues per KV tile (0 without MFMA).
    fn mfma_per_tile(&self, arch: GfxArch) -> usize;
    /// Waves per workgroup (occupancy).
    fn waves(&self, arch: GfxArch) -> u32;
}

impl HipVariant for HipKernelId {
    fn name(&self) -> String {
        HipKernelId::name(self)
    }
    fn source(&self) -> &'static HipSource {
        HipKernelId::source(self)
    }
    fn defines(&self, arch: GfxArch) -> Result<Vec<(String, String)>> {
        HipKernelId::defines(self, arch)
    }
    fn targets(&self) -> &'static [GfxArch] {
        HipKernelId::targets(self)
    }
    fn expected_instructions(&self, arch: GfxArch) -> Vec<String> {
        HipKernelId::expected_instructions(self, arch)
    }
    fn mfma_per_tile(&self, arch: GfxArch) -> usize {
        HipKernelId::mfma_per_tile(self, arch)
    }
    fn waves(&self, arch: GfxArch) -> u32 {
        self.tile(arch).waves
    }
}

/// A compiler of HIP sources to code objects.
pub trait HipCompiler: Send + Sync {
    /// Name and version, part of the cache key.
    fn identity(&self) -> String;
    /// Options for `arch` (defines excluded).
    fn options(&self, arch: GfxArch) -> Vec<String>;
    /// Compiles `source` with `options` (defines included); `Err(log)` on diagnostics.
    fn compile(&self, kernel: &str, source: &HipSource, arch: GfxArch, options: &[String]) -> Result<(Vec<u8>, String)>;
}

/// LLVM clang with the AMDGPU target, compiling device code only against no ROCm headers or
/// device libraries (the sources need neither).
#[derive(Debug, Clone)]
pub struct Clang {
    pub path: PathBuf,
    pub version: String,
}

/// A tool found by override variable or by name in PATH.
fn find_tool(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for name in names {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// The LLVM major version suffix of a tool name (`clang-22` -> `-22`).
fn suffix_of(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.rfind('-').map(|i| name[i..].to_string()).filter(|s| s[1..].chars().all(|c| c.is_ascii_digit())).unwrap_or_default()
}

impl Clang {
    /// `$QUATTN_HIP_CLANG`, else `clang-22`, else `clang` in PATH. Cached per process.
    pub fn find() -> Result<&'static Clang> {
        static CLANG: OnceLock<std::result::Result<Clang, String>> = OnceLock::new();
        CLANG
            .get_or_init(|| {
                let path = find_tool(ENV_HIP_CLANG, &["clang-22", "clang"])
                    .ok_or_else(|| format!("no clang-22 or clang in PATH (or ${ENV_HIP_CLANG})"))?;
                let out = Command::new(&path).arg("--version").output().map_err(|e| format!("{}: {e}", path.display()))?;
                let version = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string();
                if !out.status.success() || version.is_empty() {
                    return Err(format!("{} --version failed", path.display()));
                }
                Ok(Clang { path, version })
            })
            .as_ref()
            .map_err(|e| NativeError::HipToolNotFound(e.clone()))
    }

    /// llvm-objdump / llvm-readelf of the same LLVM as this clang.
    fn sibling(&self, env: &str, tool: &str) -> Result<PathBuf> {
        let suffix = suffix_of(&self.path);
        let same_dir = self.path.parent().map(|d| d.join(format!("{tool}{suffix}")));
        if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(p));
        }
        if let Some(p) = same_dir.filter(|p| p.is_file()) {
            return Ok(p);
        }
        find_tool(env, &[&format!("{tool}{suffix}"), tool]).ok_or_else(|| NativeError::HipToolNotFound(format!("no {tool}{suffix} next to {}", self.path.display())))
    }

    pub fn objdump(&self) -> Result<PathBuf> {
        self.sibling(ENV_LLVM_OBJDUMP, "llvm-objdump")
    }

    pub fn readelf(&self) -> Result<PathBuf> {
        self.sibling(ENV_LLVM_READELF, "llvm-readelf")
    }
}

/// Scratch folder for one offline compile: the source and its headers as files.
fn scratch_dir(kernel: &str, arch: GfxArch) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("quattn-hip-{}-{n}-{kernel}-{arch}", std::process::id()))
}

impl HipCompiler for Clang {
    fn identity(&self) -> String {
        self.version.clone()
    }

    fn options(&self, arch: GfxArch) -> Vec<String> {
        [
            "-x",
            "hip",
            &format!("--offload-arch={arch}"),
            "--offload-device-only",
            "--no-gpu-bundle-output",
            "-nogpulib",
            "-nogpuinc",
            "-O3",
            "-std=c++17",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn compile(&self, kernel: &str, source: &HipSource, arch: GfxArch, options: &[String]) -> Result<(Vec<u8>, String)> {
        let dir = scratch_dir(kernel, arch);
        let io = |e: std::io::Error| NativeError::Cache { path: dir.clone(), source: e };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let run = || -> Result<(Vec<u8>, String)> {
            std::fs::write(dir.join(source.file), source.text).map_err(io)?;
            for (name, text) in HIP_HEADERS {
                std::fs::write(dir.join(name), text).map_err(io)?;
            }
            let out_path = dir.join("out.hsaco");
            let out = Command::new(&self.path)
                .args(options)
                .arg("-c")
                .arg(dir.join(source.file))
                .arg("-o")
                .arg(&out_path)
                .output()
                .map_err(|e| NativeError::HipToolNotFound(format!("{}: {e}", self.path.display())))?;
            let log = String::from_utf8_lossy(&out.stderr).into_owned();
            if !out.status.success() {
                return Err(NativeError::HipCompile { kernel: kernel.to_string(), arch: arch.to_string(), log });
            }
            Ok((std::fs::read(&out_path).map_err(io)?, log))
        };
        let r = run();
        let _ = std::fs::remove_dir_all(&dir);
        r
    }
}

/// Memory + disk cache of code objects.
#[derive(Debug)]
pub struct HipCache {
    memory: RwLock<HashMap<HipCacheKey, Arc<HipCodeObject>>>,
    dir: Option<PathBuf>,
}

impl HipCache {
    /// A cache writing code objects to `dir` (`None`: memory only).
    pub fn new(dir: Option<PathBuf>) -> Self {
        HipCache { memory: RwLock::new(HashMap::new()), dir }
    }

    /// The process-wide cache, in the NVRTC cache's folder ([`crate::default_cache_dir`]).
    pub fn global() -> &'static HipCache {
        static GLOBAL: OnceLock<HipCache> = OnceLock::new();
        GLOBAL.get_or_init(|| HipCache::new(crate::default_cache_dir()))
    }

    pub fn key(&self, id: &dyn HipVariant, arch: GfxArch, compiler: &dyn HipCompiler) -> Result<HipCacheKey> {
        Ok(HipCacheKey {
            kernel: id.name(),
            source_file: id.source().file,
            arch,
            defines: id.defines(arch)?,
            compiler: compiler.identity(),
            options: compiler.options(arch),
        })
    }

    /// The code object of `id` for `arch`, compiled on a miss of both caches.
    pub fn get_or_compile(&self, id: &dyn HipVariant, arch: GfxArch, compiler: &dyn HipCompiler) -> Result<Arc<HipCodeObject>> {
        let key = self.key(id, arch, compiler)?;
        if let Some(hit) = self.memory.read().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(hit);
        }
        let source = id.source();
        let digest = digest(source, &key);
        let obj = match self.read_disk(&digest, &key, source.entry) {
            Some(o) => o,
            None => {
                let mut options = key.options.clone();
                options.extend(key.defines.iter().map(|(k, v)| format!("-D{k}={v}")));
                let start = std::time::Instant::now();
                let (code, log) = compiler.compile(&key.kernel, source, arch, &options)?;
                let millis = start.elapsed().as_millis() as u64;
                log::info!("{} compiled {} for {arch} in {millis} ms", compiler.identity(), key.kernel);
                let o = HipCodeObject { key: key.clone(), entry: source.entry, code, log, origin: Origin::Compiled { millis } };
                self.write_disk(&digest, &o);
                o
            }
        };
        let obj = Arc::new(obj);
        let mut map = self.memory.write().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(key).or_insert(obj).clone())
    }

    fn paths(&self, digest: &str) -> Option<(PathBuf, PathBuf)> {
        let dir = self.dir.as_ref()?;
        Some((dir.join(format!("{digest}.hsaco")), dir.join(format!("{digest}.hsaco.log"))))
    }

    fn read_disk(&self, digest: &str, key: &HipCacheKey, entry: &'static str) -> Option<HipCodeObject> {
        let (code_path, log_path) = self.paths(digest)?;
        let code = std::fs::read(&code_path).ok()?;
        let log = std::fs::read_to_string(&log_path).ok()?;
        if !code.starts_with(b"\x7fELF") {
            log::warn!("ignoring malformed cache file {}", code_path.display());
            return None;
        }
        Some(HipCodeObject { key: key.clone(), entry, code, log, origin: Origin::Disk })
    }

    fn write_disk(&self, digest: &str, o: &HipCodeObject) {
        let Some((code_path, log_path)) = self.paths(digest) else { return };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(code_path.parent().unwrap_or(Path::new(".")))?;
            let tmp = |p: &Path| p.with_extension(format!("tmp{}", std::process::id()));
            for (path, bytes) in [(&log_path, o.log.as_bytes()), (&code_path, &o.code[..])] {
                let t = tmp(path);
                std::fs::write(&t, bytes)?;
                std::fs::rename(&t, path)?;
            }
            Ok(())
        };
        if let Err(e) = write() {
            log::warn!("{}", NativeError::Cache { path: code_path.clone(), source: e });
        }
    }
}

fn digest(source: &HipSource, key: &HipCacheKey) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(source.text.as_bytes());
    for (name, text) in HIP_HEADERS {
        field(name.as_bytes());
        field(text.as_bytes());
    }
    field(format!("{key:?}").as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::fp8_prepass::Fp8PrepassPass;
    use crate::hip::prepass::HipPrepassId;

    /// A compiler that counts its compiles and returns a minimal ELF image.
    struct Counting(AtomicUsize);

    impl HipCompiler for Counting {
        fn identity(&self) -> String {
            "counting 1".into()
        }
        fn options(&self, arch: GfxArch) -> Vec<String> {
            vec![format!("--offload-arch={arch}")]
        }
        fn compile(&self, _kernel: &str, _source: &HipSource, _arch: GfxArch, options: &[String]) -> Result<(Vec<u8>, String)> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok((b"\x7fELF fake".to_vec(), options.join(" ")))
        }
    }

    /// The disk cache serves a second process (a fresh cache on the same folder) without
    /// compiling, keys differ per variant and arch, and a damaged file is a miss.
    #[test]
    fn disk_cache_hits_across_caches_and_damaged_files_miss() {
        let dir = tempfile::tempdir().expect("temp dir");
        let c = Counting(AtomicUsize::new(0));
        let id = HipPrepassId { input: quattn_core::Dtype::F16, pass: Fp8PrepassPass::Quantize };
        let a = HipCache::new(Some(dir.path().to_path_buf()));
        let first = a.get_or_compile(&id, GfxArch::Gfx950, &c).unwrap();
        assert!(matches!(first.origin, Origin::Compiled { .. }));
        assert!(first.log.contains("-DPASS=1") && first.log.contains("-DELEM=0"), "{}", first.log);
        assert!(Arc::ptr_eq(&first, &a.get_or_compile(&id, GfxArch::Gfx950, &c).unwrap()));
        assert_eq!(c.0.load(Ordering::SeqCst), 1);
        let b = HipCache::new(Some(dir.path().to_path_buf()));
        let again = b.get_or_compile(&id, GfxArch::Gfx950, &c).unwrap();
        assert!(matches!(again.origin, Origin::Disk));
        assert_eq!((again.code.as_slice(), c.0.load(Ordering::SeqCst)), (first.code.as_slice(), 1));
        // Another arch is another key.
        b.get_or_compile(&id, GfxArch::Gfx942, &c).unwrap();
        assert_eq!(c.0.load(Ordering::SeqCst), 2);
        // Damage every code object: a fresh cache recompiles instead of loading it.
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "hsaco") {
                std::fs::write(&p, b"not an elf").unwrap();
            }
        }
        let fresh = HipCache::new(Some(dir.path().to_path_buf())).get_or_compile(&id, GfxArch::Gfx950, &c).unwrap();
        assert!(matches!(fresh.origin, Origin::Compiled { .. }));
        assert_eq!(c.0.load(Ordering::SeqCst), 3);
    }
}
