//! Device queries: which compile target a CUDA device runs, and opening a context without
//! cudarc's panic when no driver library is installed.

use std::sync::Arc;

use crate::arch::Arch;
use crate::error::{NativeError, Result};

/// True if the CUDA driver library (libcuda) can be loaded.
pub fn driver_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only dlopens/dlcloses candidate library names.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Opens the primary context of device `ordinal`, or a typed error where cudarc would panic.
#[cfg(feature = "cuda")]
pub fn open_context(ordinal: usize) -> Result<Arc<cudarc::driver::CudaContext>> {
    if !driver_available() {
        return Err(NativeError::DriverNotFound("libcuda could not be loaded".into()));
    }
    Ok(cudarc::driver::CudaContext::new(ordinal)?)
}

/// Compute capability of the context's device.
#[cfg(feature = "cuda")]
pub fn compute_capability(ctx: &cudarc::driver::CudaContext) -> Result<(u32, u32)> {
    let (major, minor) = ctx.compute_capability()?;
    Ok((major as u32, minor as u32))
}

/// Compile targets the context's device runs, most specific first (sm_90 -> sm_90a, sm_90).
#[cfg(feature = "cuda")]
pub fn device_archs(ctx: &cudarc::driver::CudaContext) -> Result<Vec<Arch>> {
    let (major, minor) = compute_capability(ctx)?;
    Ok(Arch::for_compute_capability(major, minor))
}

/// The target a kernel family builds for the context's device (`target_for` is the family's
/// `target_for(cc)`), or [`NativeError::UnsupportedArch`] naming what it `needs`.
#[cfg(feature = "cuda")]
pub fn target_arch(
    ctx: &cudarc::driver::CudaContext,
    kernel: &'static str,
    needs: Arch,
    target_for: impl Fn((u32, u32)) -> Option<Arch>,
) -> Result<Arch> {
    let cc = compute_capability(ctx)?;
    target_for(cc).ok_or_else(|| NativeError::UnsupportedArch { kernel, needs, device: format!("sm_{}{}", cc.0, cc.1) })
}

/// Compiles `request` (or takes it from `cache`), loads it into `ctx` and opts the function in
/// to `smem_bytes` of dynamic shared memory (above 48 KiB a kernel has to): the load step of
/// every native family.
#[cfg(feature = "cuda")]
pub fn load_function(
    ctx: &Arc<cudarc::driver::CudaContext>,
    cache: &crate::cache::KernelCache,
    request: &crate::cache::CompileRequest<'_>,
    smem_bytes: u32,
) -> Result<(cudarc::driver::CudaFunction, Arc<crate::cache::CompiledKernel>)> {
    let (module, compiled) = load_module(ctx, cache, request)?;
    Ok((module_function(&module, compiled.entry, smem_bytes)?, compiled))
}

/// Compiles `request` (or takes it from `cache`) and loads its module into `ctx`, for a family
/// whose module holds more than one entry ([`module_function`] each).
#[cfg(feature = "cuda")]
pub fn load_module(
    ctx: &Arc<cudarc::driver::CudaContext>,
    cache: &crate::cache::KernelCache,
    request: &crate::cache::CompileRequest<'_>,
) -> Result<(Arc<cudarc::driver::CudaModule>, Arc<crate::cache::CompiledKernel>)> {
    let compiled = cache.get_or_compile(request)?;
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.clone()))?;
    Ok((module, compiled))
}

/// Entry `entry` of a loaded module, opted in to `smem_bytes` of dynamic shared memory.
#[cfg(feature = "cuda")]
pub fn module_function(module: &Arc<cudarc::driver::CudaModule>, entry: &str, smem_bytes: u32) -> Result<cudarc::driver::CudaFunction> {
    let function = module.load_function(entry)?;
    function.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem_bytes as i32,
    )?;
    Ok(function)
}

#[cfg(not(feature = "cuda"))]
pub fn open_context(_ordinal: usize) -> Result<Arc<()>> {
    Err(NativeError::NotCompiledWithCuda)
}

/// Number of CUDA devices, 0 when no driver is installed.
#[cfg(feature = "cuda")]
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Ok(0);
    }
    Ok(cudarc::driver::CudaContext::device_count()? as usize)
}

/// The device's marketing name (e.g. "NVIDIA H100 80GB HBM3").
#[cfg(feature = "cuda")]
pub fn device_name(ordinal: usize) -> Result<String> {
    Ok(open_context(ordinal)?.name()?)
}
