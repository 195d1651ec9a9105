//! NVRTC through cudarc: finding the library, compiling one kernel source for one exact
//! target to a CUBIN, and reading ptxas' resource summary out of the compile log.

use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::arch::Arch;
use crate::error::{NativeError, Result};

/// The loaded NVRTC library.
#[derive(Clone, Debug)]
pub struct NvrtcInfo {
    /// `(major, minor)` as reported by `nvrtcVersion`.
    pub version: (i32, i32),
    /// Folder the library was pre-loaded from; `None` when the dynamic loader found it itself.
    pub lib_dir: Option<PathBuf>,
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use cudarc::nvrtc::sys;

    // Pre-loaded libraries must stay mapped for the life of the process: cudarc and libnvrtc
    // look them up again by soname and would otherwise find nothing.
    static PRELOADED: OnceLock<Vec<libloading::Library>> = OnceLock::new();

    fn preload_from(dir: &std::path::Path) -> std::result::Result<Vec<libloading::Library>, String> {
        let lib = crate::tools::nvrtc_file_in(dir)
            .ok_or_else(|| format!("no libnvrtc in {}", dir.display()))?;
        let mut libs = Vec::new();
        // libnvrtc dlopens its builtins by bare soname with no RUNPATH of its own; once a
        // library with that soname is mapped, the lookup resolves to it.
        for b in crate::tools::nvrtc_builtins_in(dir) {
            // SAFETY: loading NVIDIA's library runs only its ELF initialisers.
            match unsafe { libloading::Library::new(&b) } {
                Ok(l) => libs.push(l),
                Err(e) => log::debug!("pre-loading {}: {e}", b.display()),
            }
        }
        // SAFETY: as above.
        let l = unsafe { libloading::Library::new(&lib) }
            .map_err(|e| format!("loading {}: {e}", lib.display()))?;
        libs.push(l);
        Ok(libs)
    }

    fn load() -> std::result::Result<NvrtcInfo, String> {
        let explicit = std::env::var_os(crate::tools::ENV_NVRTC_LIB).is_some();
        let mut lib_dir = None;
        // An explicit override wins over whatever the loader would find, so it is mapped first.
        // SAFETY: is_culib_present only dlopens/dlcloses candidate names.
        if explicit || !unsafe { sys::is_culib_present() } {
            let mut errors = Vec::new();
            for dir in crate::tools::nvrtc_lib_dirs() {
                match preload_from(&dir) {
                    Ok(libs) => {
                        log::info!("NVRTC: using {}", dir.display());
                        let _ = PRELOADED.set(libs);
                        lib_dir = Some(dir);
                        break;
                    }
                    Err(e) => errors.push(e),
                }
            }
            // SAFETY: as above.
            if !unsafe { sys::is_culib_present() } {
                return Err(format!(
                    "libnvrtc not loadable: set {} to its folder, add it to LD_LIBRARY_PATH, or \
                     `pip install nvidia-cuda-nvrtc` (searched: {})",
                    crate::tools::ENV_NVRTC_LIB,
                    if errors.is_empty() { "no candidate folders".to_string() } else { errors.join("; ") }
                ));
            }
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above), the out-pointers are valid.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| format!("nvrtcVersion: {e:?}"))?;
        Ok(NvrtcInfo { version: (major, minor), lib_dir })
    }

    pub fn nvrtc() -> Result<&'static NvrtcInfo> {
        static INFO: OnceLock<std::result::Result<NvrtcInfo, String>> = OnceLock::new();
        INFO.get_or_init(load).as_ref().map_err(|e| NativeError::NvrtcNotFound(e.clone()))
    }

    fn call(name: &'static str, r: sys::nvrtcResult) -> Result<()> {
        r.result().map_err(|e| NativeError::Nvrtc { call: name, code: format!("{e:?}") })
    }

    /// Outcome of one NVRTC compilation: the cubin, or the log explaining why not.
    pub enum Compiled {
        Ok { cubin: Vec<u8>, log: String },
        Failed { log: String },
    }

    pub fn compile(
        file_name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<Compiled> {
        nvrtc()?;
        let to_c = |s: &str, what: &str| {
            CString::new(s).map_err(|_| NativeError::InvalidArgs(format!("NUL byte in {what}")))
        };
        let src = to_c(source, "kernel source")?;
        let name = to_c(file_name, "file name")?;
        let h_src = headers.iter().map(|(_, t)| to_c(t, "header")).collect::<Result<Vec<_>>>()?;
        let h_name = headers.iter().map(|(n, _)| to_c(n, "header name")).collect::<Result<Vec<_>>>()?;
        let h_src_p: Vec<*const c_char> = h_src.iter().map(|s| s.as_ptr()).collect();
        let h_name_p: Vec<*const c_char> = h_name.iter().map(|s| s.as_ptr()).collect();
        let opts = options.iter().map(|o| to_c(o, "option")).collect::<Result<Vec<_>>>()?;
        let opts_p: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();

        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer refers to a live NUL-terminated string owned above; counts match.
        unsafe {
            call(
                "nvrtcCreateProgram",
                sys::nvrtcCreateProgram(
                    &mut prog,
                    src.as_ptr(),
                    name.as_ptr(),
                    h_src_p.len() as i32,
                    h_src_p.as_ptr(),
                    h_name_p.as_ptr(),
                ),
            )?;
        }
        // Destroy the program on every path out of here.
        struct Guard(sys::nvrtcProgram);
        impl Drop for Guard {
            fn drop(&mut self) {
                // SAFETY: created above and destroyed exactly once.
                let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
            }
        }
        let guard = Guard(prog);
        // SAFETY: valid program, option pointers live for the call.
        let status = unsafe { sys::nvrtcCompileProgram(guard.0, opts_p.len() as i32, opts_p.as_ptr()) };
        let log = {
            let mut n = 0usize;
            // SAFETY: valid program; buffer sized by NVRTC.
            unsafe { call("nvrtcGetProgramLogSize", sys::nvrtcGetProgramLogSize(guard.0, &mut n))? };
            let mut buf = vec![0u8; n.max(1)];
            unsafe { call("nvrtcGetProgramLog", sys::nvrtcGetProgramLog(guard.0, buf.as_mut_ptr() as *mut c_char))? };
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).into_owned()
        };
        if status != sys::nvrtcResult::NVRTC_SUCCESS {
            return Ok(Compiled::Failed { log });
        }
        let mut n = 0usize;
        // SAFETY: valid, successfully compiled program; buffer sized by NVRTC.
        unsafe { call("nvrtcGetCUBINSize", sys::nvrtcGetCUBINSize(guard.0, &mut n))? };
        let mut cubin = vec![0u8; n];
        unsafe { call("nvrtcGetCUBIN", sys::nvrtcGetCUBIN(guard.0, cubin.as_mut_ptr() as *mut c_char))? };
        Ok(Compiled::Ok { cubin, log })
    }
}

#[cfg(feature = "cuda")]
pub(crate) use imp::{compile, Compiled};

/// Finds and loads NVRTC (once per process); see [`crate::tools`] for the search order.
pub fn nvrtc() -> Result<&'static NvrtcInfo> {
    #[cfg(feature = "cuda")]
    {
        imp::nvrtc()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(NativeError::NotCompiledWithCuda)
    }
}

/// The options every compile gets besides `-arch` and the kernel's defines.
pub(crate) fn base_options(arch: Arch) -> Vec<String> {
    vec![
        format!("-arch={}", arch.as_str()),
        "--std=c++17".to_string(),
        // ptxas' verbose summary (registers, spills) is the resource report of the cubin.
        "-Xptxas=-v".to_string(),
    ]
}

/// What ptxas said about a module's kernel entries (with several, the largest of each figure).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resources {
    pub registers: u32,
    pub stack_frame_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub static_shared_bytes: u32,
}

impl Resources {
    /// Parses the `-Xptxas=-v` lines of an NVRTC log. `None` if no register line is present.
    pub fn parse_ptxas_log(log: &str) -> Option<Resources> {
        let num_before = |line: &str, suffix: &str| -> Option<u32> {
            let idx = line.find(suffix)?;
            line[..idx].split_whitespace().last()?.parse().ok()
        };
        let mut r = Resources::default();
        let mut seen = false;
        // A module with several entries lists each: the largest of every figure, so that a
        // spill in any entry shows.
        for line in log.lines() {
            if let Some(v) = num_before(line, " bytes stack frame") {
                r.stack_frame_bytes = r.stack_frame_bytes.max(v);
            }
            if let Some(v) = num_before(line, " bytes spill stores") {
                r.spill_store_bytes = r.spill_store_bytes.max(v);
            }
            if let Some(v) = num_before(line, " bytes spill loads") {
                r.spill_load_bytes = r.spill_load_bytes.max(v);
            }
            if let Some(v) = num_before(line, " registers") {
                r.registers = r.registers.max(v);
                seen = true;
            }
            if let Some(v) = num_before(line, " bytes smem") {
                r.static_shared_bytes = r.static_shared_bytes.max(v);
            }
        }
        seen.then_some(r)
    }

    /// Bytes spilled to local memory, stores plus loads.
    pub fn spill_bytes(&self) -> u32 {
        self.spill_store_bytes + self.spill_load_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_summary() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 236 registers, used 1 barriers, 1024 bytes smem\n";
        let r = Resources::parse_ptxas_log(log).unwrap();
        assert_eq!(
            r,
            Resources {
                registers: 236,
                stack_frame_bytes: 8,
                spill_store_bytes: 4,
                spill_load_bytes: 12,
                static_shared_bytes: 1024
            }
        );
        assert_eq!(Resources::parse_ptxas_log("nothing"), None);
    }

    /// Two entries: a spill in the first one must not hide behind the second's clean summary.
    #[test]
    fn a_spill_in_any_entry_shows() {
        let log = "ptxas info    : Compiling entry function 'stats' for 'sm_90'\n\
                   ptxas         .     16 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads\n\
                   ptxas info    : Used 64 registers, used 1 barriers, 24576 bytes smem\n\
                   ptxas info    : Compiling entry function 'main' for 'sm_90'\n\
                   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 80 registers, used 1 barriers, 17000 bytes smem\n";
        let r = Resources::parse_ptxas_log(log).unwrap();
        assert_eq!((r.registers, r.spill_store_bytes, r.spill_load_bytes, r.stack_frame_bytes), (80, 16, 16, 16));
        assert_eq!(r.static_shared_bytes, 24576);
    }
}
