//! Locating the CUDA tools this crate uses at run time: libnvrtc (through cudarc) and the
//! disassemblers cuobjdump / nvdisasm. None of them need a GPU, and on GPU-less machines they
//! usually come from the PyPI wheels (`nvidia-cuda-nvrtc`, `nvidia-cuda-cuobjdump`,
//! `nvidia-cuda-nvdisasm`), whose files land in `site-packages/nvidia/cu13/{lib,bin}`; see
//! `.ci/install-cuda-tools.sh`.
//!
//! Search order, for every tool: the explicit override variable, then the usual system places
//! (`PATH` / the dynamic loader, `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`), then the
//! `site-packages` folders of `python3` (or `$QUATTN_PYTHON`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Override: path of libnvrtc.so.* itself or of the folder holding it.
pub const ENV_NVRTC_LIB: &str = "QUATTN_NVRTC_LIB";
/// Override: path of the cuobjdump binary.
pub const ENV_CUOBJDUMP: &str = "QUATTN_CUOBJDUMP";
/// Override: path of the nvdisasm binary.
pub const ENV_NVDISASM: &str = "QUATTN_NVDISASM";
/// Override: the python interpreter asked for its site-packages folders.
pub const ENV_PYTHON: &str = "QUATTN_PYTHON";

/// A disassembler this crate can drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disassembler {
    Cuobjdump,
    Nvdisasm,
}

impl Disassembler {
    pub fn binary_name(self) -> &'static str {
        match self {
            Disassembler::Cuobjdump => "cuobjdump",
            Disassembler::Nvdisasm => "nvdisasm",
        }
    }
    fn env_var(self) -> &'static str {
        match self {
            Disassembler::Cuobjdump => ENV_CUOBJDUMP,
            Disassembler::Nvdisasm => ENV_NVDISASM,
        }
    }
}

/// Toolkit roots named by the environment or at the conventional place.
fn cuda_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(|v| std::env::var_os(v))
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots
}

/// `nvidia/` folders of the Python installation (wheel layout). Computed once: it spawns python.
fn python_nvidia_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let mut pythons: Vec<String> = Vec::new();
        if let Ok(p) = std::env::var(ENV_PYTHON) {
            pythons.push(p);
        }
        pythons.extend(["python3".to_string(), "python".to_string()]);
        let script = "import site, sys\n\
                      paths = list(sys.path)\n\
                      try:\n    paths += site.getsitepackages()\nexcept Exception:\n    pass\n\
                      try:\n    paths.append(site.getusersitepackages())\nexcept Exception:\n    pass\n\
                      print('\\n'.join(p for p in paths if p))";
        for py in pythons {
            let Ok(out) = Command::new(&py).arg("-c").arg(script).output() else { continue };
            if !out.status.success() {
                continue;
            }
            let mut dirs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| Path::new(l.trim()).join("nvidia"))
                .filter(|p| p.is_dir())
                .collect();
            dirs.dedup();
            log::debug!("python {py}: nvidia wheel folders {dirs:?}");
            return dirs;
        }
        Vec::new()
    })
}

/// Wheel sub-folders that hold `lib` / `bin`: CUDA 13 wheels share `cu13/`, CUDA 12 wheels use
/// one folder per component.
fn wheel_subdirs(kind: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for base in python_nvidia_dirs() {
        for comp in ["cu13", "cuda_nvrtc", "cuda_cuobjdump", "cuda_nvdisasm", "cu12"] {
            let p = base.join(comp).join(kind);
            if p.is_dir() {
                out.push(p);
            }
        }
    }
    out
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Finds a disassembler binary, or `None` with nothing installed.
pub fn find_disassembler(tool: Disassembler) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(tool.env_var()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
        log::warn!("{}={} is not a file; searching elsewhere", tool.env_var(), p.display());
    }
    let name = tool.binary_name();
    which(name)
        .or_else(|| cuda_roots().into_iter().map(|r| r.join("bin").join(name)).find(|p| p.is_file()))
        .or_else(|| wheel_subdirs("bin").into_iter().map(|d| d.join(name)).find(|p| p.is_file()))
}

/// The first usable disassembler: cuobjdump (takes cubins directly and prints resource usage),
/// else nvdisasm.
pub fn find_any_disassembler() -> Option<(Disassembler, PathBuf)> {
    [Disassembler::Cuobjdump, Disassembler::Nvdisasm]
        .into_iter()
        .find_map(|t| find_disassembler(t).map(|p| (t, p)))
}

/// Folders that may hold libnvrtc, in search order (without the loader's own search path).
pub fn nvrtc_lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os(ENV_NVRTC_LIB) {
        let p = PathBuf::from(p);
        if p.is_file() {
            if let Some(parent) = p.parent() {
                dirs.push(parent.to_path_buf());
            }
        } else {
            dirs.push(p);
        }
    }
    for root in cuda_roots() {
        dirs.push(root.join("lib64"));
        dirs.push(root.join("lib"));
        dirs.push(root.join("targets/x86_64-linux/lib"));
        dirs.push(root.join("targets/sbsa-linux/lib"));
    }
    dirs.extend(wheel_subdirs("lib"));
    dirs.retain(|d| d.is_dir());
    dirs
}

/// The libnvrtc file in `dir`, preferring the soname cudarc asks for (`libnvrtc.so.<major>`).
pub(crate) fn nvrtc_file_in(dir: &Path) -> Option<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("libnvrtc.so") || (n.starts_with("nvrtc64") && n.ends_with(".dll"))
            })
        })
        .collect();
    // libnvrtc.so.13 before libnvrtc.so.13.0.88 before libnvrtc.so: shortest versioned name.
    names.sort_by_key(|p| {
        let n = p.file_name().map(|n| n.len()).unwrap_or(0);
        let unversioned = p.extension().is_some_and(|e| e == "so");
        (unversioned, n)
    });
    names.into_iter().next()
}

/// The NVRTC builtins libraries next to libnvrtc (libnvrtc dlopens them by bare name).
pub(crate) fn nvrtc_builtins_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins") && !n.contains(".alt."))
        })
        .collect();
    v.sort();
    v
}
