//! The HIP runtime and hipRTC, loaded at run time (libamdhip64, libhiprtc): device enumeration
//! with the gfx arch name, device memory, module load and launch, events, and run-time
//! compilation. Without ROCm every entry point returns [`NativeError::HipNotFound`]; nothing
//! here panics. Written against the HIP C API; not run on hardware (no AMD device here).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

use super::compile::HipCompiler;
use super::config::GfxArch;
use super::source::{HipSource, HIP_HEADERS};
use crate::error::{NativeError, Result};

/// Override: path of libamdhip64.so.
pub const ENV_HIP_LIB: &str = "QUATTN_HIP_LIB";
/// Override: path of libhiprtc.so.
pub const ENV_HIPRTC_LIB: &str = "QUATTN_HIPRTC_LIB";

type HipError = c_int;
type Ptr = *mut c_void;

macro_rules! api {
    ($name:ident { $($f:ident : fn($($a:ty),*) -> $r:ty;)* }) => {
        /// Entry points of one dynamically loaded library.
        #[allow(non_snake_case)]
        struct $name {
            _lib: libloading::Library,
            $($f: unsafe extern "C" fn($($a),*) -> $r,)*
        }
        impl $name {
            /// # Safety
            /// `lib` must be the library whose C API these signatures describe.
            #[allow(non_snake_case)]
            unsafe fn load(lib: libloading::Library) -> std::result::Result<Self, String> {
                $(let $f = *lib.get::<unsafe extern "C" fn($($a),*) -> $r>(concat!(stringify!($f), "\0").as_bytes())
                    .map_err(|e| format!("{}: {e}", stringify!($f)))?;)*
                Ok($name { _lib: lib, $($f,)* })
            }
        }
    };
}

api!(HipApi {
    hipInit: fn(c_uint) -> HipError;
    hipGetDeviceCount: fn(*mut c_int) -> HipError;
    hipSetDevice: fn(c_int) -> HipError;
    hipDeviceGetName: fn(*mut c_char, c_int, c_int) -> HipError;
    hipGetDevicePropertiesR0600: fn(Ptr, c_int) -> HipError;
    hipMalloc: fn(*mut Ptr, usize) -> HipError;
    hipFree: fn(Ptr) -> HipError;
    hipMemcpyHtoD: fn(Ptr, *const c_void, usize) -> HipError;
    hipMemcpyDtoH: fn(Ptr, Ptr, usize) -> HipError;
    hipMemset: fn(Ptr, c_int, usize) -> HipError;
    hipDeviceSynchronize: fn() -> HipError;
    hipModuleLoadData: fn(*mut Ptr, *const c_void) -> HipError;
    hipModuleUnload: fn(Ptr) -> HipError;
    hipModuleGetFunction: fn(*mut Ptr, Ptr, *const c_char) -> HipError;
    hipModuleLaunchKernel: fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Ptr, *mut Ptr, *mut Ptr) -> HipError;
    hipEventCreate: fn(*mut Ptr) -> HipError;
    hipEventRecord: fn(Ptr, Ptr) -> HipError;
    hipEventSynchronize: fn(Ptr) -> HipError;
    hipEventElapsedTime: fn(*mut f32, Ptr, Ptr) -> HipError;
    hipEventDestroy: fn(Ptr) -> HipError;
    hipGetErrorString: fn(HipError) -> *const c_char;
});

api!(HiprtcApi {
    hiprtcVersion: fn(*mut c_int, *mut c_int) -> c_int;
    hiprtcCreateProgram: fn(*mut Ptr, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> c_int;
    hiprtcCompileProgram: fn(Ptr, c_int, *const *const c_char) -> c_int;
    hiprtcGetProgramLogSize: fn(Ptr, *mut usize) -> c_int;
    hiprtcGetProgramLog: fn(Ptr, *mut c_char) -> c_int;
    hiprtcGetCodeSize: fn(Ptr, *mut usize) -> c_int;
    hiprtcGetCode: fn(Ptr, *mut c_char) -> c_int;
    hiprtcDestroyProgram: fn(*mut Ptr) -> c_int;
});

/// Library file names tried in order after the override variable.
const HIP_NAMES: &[&str] = &["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so"];
const HIPRTC_NAMES: &[&str] = &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "/opt/rocm/lib/libhiprtc.so"];

fn open_library(env: &str, names: &[&str]) -> std::result::Result<libloading::Library, String> {
    let mut tried = Vec::new();
    let over = std::env::var(env).ok().filter(|s| !s.is_empty());
    for name in over.iter().map(String::as_str).chain(names.iter().copied()) {
        // SAFETY: loading a shared library runs its initializers; these are ROCm's own.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(tried.join("; "))
}

/// The loaded HIP runtime (process-wide).
pub struct HipRuntime {
    api: HipApi,
}

impl std::fmt::Debug for HipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HipRuntime")
    }
}

impl HipRuntime {
    /// libamdhip64, loaded and initialized once; [`NativeError::HipNotFound`] without ROCm.
    pub fn get() -> Result<&'static HipRuntime> {
        static RT: OnceLock<std::result::Result<HipRuntime, String>> = OnceLock::new();
        RT.get_or_init(|| {
            let lib = open_library(ENV_HIP_LIB, HIP_NAMES)?;
            // SAFETY: libamdhip64's C API has these signatures (hip_runtime_api.h).
            let api = unsafe { HipApi::load(lib) }?;
            let rt = HipRuntime { api };
            // SAFETY: plain call with flags 0.
            rt.check("hipInit", unsafe { (rt.api.hipInit)(0) }).map_err(|e| e.to_string())?;
            Ok(rt)
        })
        .as_ref()
        .map_err(|e| NativeError::HipNotFound(e.clone()))
    }

    /// True when libamdhip64 loads and initializes.
    pub fn available() -> bool {
        Self::get().is_ok()
    }

    fn check(&self, call: &'static str, code: HipError) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static string for any code.
        let msg = unsafe {
            let p = (self.api.hipGetErrorString)(code);
            if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
        };
        Err(NativeError::Hip { call, code: format!("{code} ({msg})") })
    }

    /// Number of HIP devices (0 when the runtime reports none).
    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: out-pointer to a local.
        let code = unsafe { (self.api.hipGetDeviceCount)(&mut n) };
        if code != 0 {
            // hipErrorNoDevice (100): a runtime without devices.
            return if code == 100 { Ok(0) } else { self.check("hipGetDeviceCount", code).map(|_| 0) };
        }
        Ok(n.max(0) as usize)
    }

    fn set_device(&self, ordinal: usize) -> Result<()> {
        // SAFETY: plain call.
        self.check("hipSetDevice", unsafe { (self.api.hipSetDevice)(ordinal as c_int) })
    }

    /// Marketing name of device `ordinal`.
    pub fn device_name(&self, ordinal: usize) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: buffer and its length.
        self.check("hipDeviceGetName", unsafe { (self.api.hipDeviceGetName)(buf.as_mut_ptr(), buf.len() as c_int, ordinal as c_int) })?;
        // SAFETY: NUL-terminated by the runtime within the buffer (last byte kept 0 below).
        buf[255] = 0;
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// The device's `gcnArchName` (`gfx942:sramecc+:xnack-`). Read from the R0600 properties
    /// struct by scanning it for the field's text after `name[256]`, so that no field offset of
    /// a particular ROCm release is built in.
    pub fn arch_name(&self, ordinal: usize) -> Result<String> {
        let mut props = vec![0u8; 16 * 1024];
        // SAFETY: the buffer is larger than any hipDeviceProp_tR0600 (about 1.5 KB).
        self.check("hipGetDevicePropertiesR0600", unsafe {
            (self.api.hipGetDevicePropertiesR0600)(props.as_mut_ptr().cast(), ordinal as c_int)
        })?;
        find_gfx_name(&props[256..]).ok_or_else(|| NativeError::Hip { call: "hipGetDevicePropertiesR0600", code: "no gcnArchName".into() })
    }

    /// Allocates `bytes` on device `ordinal`.
    pub fn alloc(&'static self, ordinal: usize, bytes: usize) -> Result<DeviceBuffer> {
        self.set_device(ordinal)?;
        let mut p: Ptr = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        self.check("hipMalloc", unsafe { (self.api.hipMalloc)(&mut p, bytes.max(1)) })?;
        Ok(DeviceBuffer { rt: self, ordinal, ptr: p, bytes })
    }

    /// Loads a code object on device `ordinal` and looks up `entry`.
    pub fn load_module(&'static self, ordinal: usize, code: &[u8], entry: &str) -> Result<HipModule> {
        self.set_device(ordinal)?;
        let mut module: Ptr = std::ptr::null_mut();
        // SAFETY: the runtime copies the image during the call.
        self.check("hipModuleLoadData", unsafe { (self.api.hipModuleLoadData)(&mut module, code.as_ptr().cast()) })?;
        let name = CString::new(entry).map_err(|e| NativeError::InvalidArgs(e.to_string()))?;
        let mut function: Ptr = std::ptr::null_mut();
        // SAFETY: valid module and NUL-terminated name.
        let r = self.check("hipModuleGetFunction", unsafe { (self.api.hipModuleGetFunction)(&mut function, module, name.as_ptr()) });
        if let Err(e) = r {
            // SAFETY: the module loaded above.
            unsafe { (self.api.hipModuleUnload)(module) };
            return Err(e);
        }
        Ok(HipModule { rt: self, ordinal, module, function })
    }

    /// Waits for all work on device `ordinal`.
    pub fn synchronize(&self, ordinal: usize) -> Result<()> {
        self.set_device(ordinal)?;
        // SAFETY: plain call.
        self.check("hipDeviceSynchronize", unsafe { (self.api.hipDeviceSynchronize)() })
    }

    /// Milliseconds between two events recorded around `f` on the null stream.
    pub fn time_ms(&self, ordinal: usize, f: impl FnOnce() -> Result<()>) -> Result<f64> {
        self.set_device(ordinal)?;
        let (mut a, mut b): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: out-pointers to locals; events destroyed below on every path.
        unsafe {
            self.check("hipEventCreate", (self.api.hipEventCreate)(&mut a))?;
            if let Err(e) = self.check("hipEventCreate", (self.api.hipEventCreate)(&mut b)) {
                (self.api.hipEventDestroy)(a);
                return Err(e);
            }
        }
        let run = || -> Result<f64> {
            // SAFETY: valid events, null stream.
            unsafe {
                self.check("hipEventRecord", (self.api.hipEventRecord)(a, std::ptr::null_mut()))?;
                f()?;
                self.check("hipEventRecord", (self.api.hipEventRecord)(b, std::ptr::null_mut()))?;
                self.check("hipEventSynchronize", (self.api.hipEventSynchronize)(b))?;
                let mut ms = 0f32;
                self.check("hipEventElapsedTime", (self.api.hipEventElapsedTime)(&mut ms, a, b))?;
                Ok(ms as f64)
            }
        };
        let r = run();
        // SAFETY: created above.
        unsafe {
            (self.api.hipEventDestroy)(a);
            (self.api.hipEventDestroy)(b);
        }
        r
    }
}

/// The `gfx…` text of a properties struct: the first `gfx` followed by a hex digit, up to the NUL.
pub fn find_gfx_name(bytes: &[u8]) -> Option<String> {
    let i = bytes.windows(4).position(|w| &w[..3] == b"gfx" && w[3].is_ascii_hexdigit())?;
    let end = bytes[i..].iter().position(|&b| b == 0).map(|n| i + n)?;
    let s = std::str::from_utf8(&bytes[i..end]).ok()?;
    s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '+' | '-' | '_')).then(|| s.to_string())
}

/// Device memory, freed on drop.
pub struct DeviceBuffer {
    rt: &'static HipRuntime,
    ordinal: usize,
    ptr: Ptr,
    bytes: usize,
}

// SAFETY: a device pointer is an address, usable from any host thread with the device set.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes on hip:{})", self.bytes, self.ordinal)
    }
}

impl DeviceBuffer {
    pub fn device_ptr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copies `data` to the start of the buffer (synchronous).
    pub fn upload(&self, data: &[u8]) -> Result<()> {
        if data.len() > self.bytes {
            return Err(NativeError::InvalidArgs(format!("upload of {} bytes into {}", data.len(), self.bytes)));
        }
        self.rt.set_device(self.ordinal)?;
        // SAFETY: sizes checked above.
        self.rt.check("hipMemcpyHtoD", unsafe { (self.rt.api.hipMemcpyHtoD)(self.ptr, data.as_ptr().cast(), data.len()) })
    }

    /// Copies the start of the buffer into `out` (synchronous).
    pub fn download(&self, out: &mut [u8]) -> Result<()> {
        if out.len() > self.bytes {
            return Err(NativeError::InvalidArgs(format!("download of {} bytes from {}", out.len(), self.bytes)));
        }
        self.rt.set_device(self.ordinal)?;
        // SAFETY: sizes checked above.
        self.rt.check("hipMemcpyDtoH", unsafe { (self.rt.api.hipMemcpyDtoH)(out.as_mut_ptr().cast(), self.ptr, out.len()) })
    }

    pub fn zero(&self) -> Result<()> {
        self.rt.set_device(self.ordinal)?;
        // SAFETY: the whole allocation.
        self.rt.check("hipMemset", unsafe { (self.rt.api.hipMemset)(self.ptr, 0, self.bytes) })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.rt.set_device(self.ordinal).is_ok() {
            // SAFETY: allocated by hipMalloc, freed once.
            let code = unsafe { (self.rt.api.hipFree)(self.ptr) };
            if code != 0 {
                log::warn!("hipFree failed: {code}");
            }
        }
    }
}

/// A loaded module and its kernel.
pub struct HipModule {
    rt: &'static HipRuntime,
    ordinal: usize,
    module: Ptr,
    function: Ptr,
}

// SAFETY: module and function handles are process-wide in HIP.
unsafe impl Send for HipModule {}
unsafe impl Sync for HipModule {}

impl std::fmt::Debug for HipModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipModule(hip:{})", self.ordinal)
    }
}

impl HipModule {
    /// Launches the kernel on the null stream with one by-value parameter struct.
    ///
    /// # Safety
    /// `P` must be the kernel's parameter struct (C layout) and every device pointer in it
    /// must be valid for what the kernel reads and writes.
    pub unsafe fn launch<P: Copy>(&self, grid: (u32, u32, u32), block: (u32, u32, u32), params: &P) -> Result<()> {
        self.rt.set_device(self.ordinal)?;
        let mut args: [Ptr; 1] = [params as *const P as Ptr];
        self.rt.check(
            "hipModuleLaunchKernel",
            (self.rt.api.hipModuleLaunchKernel)(
                self.function,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                0,
                std::ptr::null_mut(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        )
    }
}

impl Drop for HipModule {
    fn drop(&mut self) {
        // SAFETY: loaded by hipModuleLoadData, unloaded once.
        unsafe { (self.rt.api.hipModuleUnload)(self.module) };
    }
}

/// hipRTC as a [`HipCompiler`] (the run-time compile path).
pub struct Hiprtc {
    api: HiprtcApi,
    version: (i32, i32),
}

impl Hiprtc {
    /// libhiprtc, loaded once; [`NativeError::HipNotFound`] without ROCm.
    pub fn get() -> Result<&'static Arc<Hiprtc>> {
        static RTC: OnceLock<std::result::Result<Arc<Hiprtc>, String>> = OnceLock::new();
        RTC.get_or_init(|| {
            let lib = open_library(ENV_HIPRTC_LIB, HIPRTC_NAMES)?;
            // SAFETY: libhiprtc's C API has these signatures (hiprtc.h).
            let api = unsafe { HiprtcApi::load(lib) }?;
            let (mut a, mut b) = (0, 0);
            // SAFETY: out-pointers to locals.
            unsafe { (api.hiprtcVersion)(&mut a, &mut b) };
            Ok(Arc::new(Hiprtc { api, version: (a, b) }))
        })
        .as_ref()
        .map_err(|e| NativeError::HipNotFound(e.clone()))
    }
}

impl HipCompiler for Hiprtc {
    fn identity(&self) -> String {
        format!("hiprtc {}.{}", self.version.0, self.version.1)
    }

    fn options(&self, arch: GfxArch) -> Vec<String> {
        vec![format!("--offload-arch={arch}"), "-O3".into(), "-std=c++17".into()]
    }

    fn compile(&self, kernel: &str, source: &HipSource, arch: GfxArch, options: &[String]) -> Result<(Vec<u8>, String)> {
        let cstr = |s: &str| CString::new(s).map_err(|e| NativeError::InvalidArgs(e.to_string()));
        let text = cstr(source.text)?;
        let name = cstr(source.file)?;
        let header_texts: Vec<CString> = HIP_HEADERS.iter().map(|(_, t)| cstr(t)).collect::<Result<_>>()?;
        let header_names: Vec<CString> = HIP_HEADERS.iter().map(|(n, _)| cstr(n)).collect::<Result<_>>()?;
        let ht: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
        let hn: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
        let opts: Vec<CString> = options.iter().map(|o| cstr(o)).collect::<Result<_>>()?;
        let op: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        let fail = |call: &'static str, code: c_int| NativeError::Hip { call, code: code.to_string() };
        let mut prog: Ptr = std::ptr::null_mut();
        // SAFETY: every pointer outlives the program, which is destroyed below.
        unsafe {
            let c = (self.api.hiprtcCreateProgram)(&mut prog, text.as_ptr(), name.as_ptr(), ht.len() as c_int, ht.as_ptr(), hn.as_ptr());
            if c != 0 {
                return Err(fail("hiprtcCreateProgram", c));
            }
            let compiled = (self.api.hiprtcCompileProgram)(prog, op.len() as c_int, op.as_ptr());
            let mut log_len = 0usize;
            (self.api.hiprtcGetProgramLogSize)(prog, &mut log_len);
            let mut log = vec![0u8; log_len.max(1)];
            (self.api.hiprtcGetProgramLog)(prog, log.as_mut_ptr().cast());
            let log = String::from_utf8_lossy(&log).trim_end_matches('\0').to_string();
            let out = if compiled != 0 {
                Err(NativeError::HipCompile { kernel: kernel.to_string(), arch: arch.to_string(), log: log.clone() })
            } else {
                let mut size = 0usize;
                let c = (self.api.hiprtcGetCodeSize)(prog, &mut size);
                let mut code = vec![0u8; size];
                if c != 0 || (self.api.hiprtcGetCode)(prog, code.as_mut_ptr().cast()) != 0 {
                    Err(fail("hiprtcGetCode", c))
                } else {
                    Ok((code, log))
                }
            };
            (self.api.hiprtcDestroyProgram)(&mut prog);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_name_is_found_in_a_properties_blob() {
        let mut blob = vec![0u8; 600];
        blob[10..30].copy_from_slice(b"AMD Instinct MI300X\0");
        blob[400..423].copy_from_slice(b"gfx942:sramecc+:xnack-\0");
        assert_eq!(find_gfx_name(&blob).as_deref(), Some("gfx942:sramecc+:xnack-"));
        assert_eq!(find_gfx_name(&[0u8; 64]), None);
    }

    /// Without ROCm (as in CI): a typed error naming what was tried, no panic.
    #[test]
    fn missing_runtime_is_a_typed_error() {
        if HipRuntime::available() {
            eprintln!("skipped: a HIP runtime is installed here");
            return;
        }
        match HipRuntime::get() {
            Err(NativeError::HipNotFound(why)) => assert!(why.contains("libamdhip64"), "{why}"),
            other => panic!("expected HipNotFound, got {other:?}"),
        }
        assert!(matches!(Hiprtc::get(), Err(NativeError::HipNotFound(_))));
    }
}
