//! `append_kv` (`cuda/append_kv.cu`): writes new keys and values into the pools of a paged KV
//! cache through its block table, the device side of `quattn::PagedKv::append`. 16-bit
//! elements (f16 or bf16: the kernel copies bits), head dims in 16-byte pieces.

use crate::arch::Arch;
use crate::cache::{CompileRequest, KernelSource};
use crate::decode::DecodeConfig;
use crate::error::{NativeError, Result};
use crate::report::KernelVariant;

const KERNEL: &str = "append_kv";

/// The kernel source.
pub static APPEND_KV: KernelSource = KernelSource { file: "append_kv.cu", entry: "append_kv", text: include_str!("../cuda/append_kv.cu") };

/// The one variant: the kernel copies 16-bit elements whatever their type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, Default)]
pub struct AppendKvConfig;

impl AppendKvConfig {
    pub const THREADS: u32 = 128;

    /// `fwd_decode_append_kv`: named after the decode family, whose paged variants read what it
    /// writes (the registry keeps it among the family's units).
    pub fn name(&self) -> String {
        format!("fwd_decode_{KERNEL}")
    }

    /// Built for the decode family's targets (the cache it writes is what the paged decode
    /// variants read).
    pub fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        if !DecodeConfig::TARGETS.contains(&arch) {
            return Err(NativeError::UnsupportedConfig { kernel: KERNEL, reason: format!("target {arch} (built for {:?})", DecodeConfig::TARGETS) });
        }
        Ok(CompileRequest { kernel: self.name(), source: &APPEND_KV, arch, defines: Vec::new() })
    }

    /// 16-byte loads and stores, no matrix opcode.
    pub fn expected_instructions(&self) -> Vec<&'static str> {
        vec!["LDG.E.128", "STG.E.128"]
    }
}

impl KernelVariant for AppendKvConfig {
    fn name(&self) -> String {
        AppendKvConfig::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        AppendKvConfig::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        AppendKvConfig::expected_instructions(self).into_iter().map(String::from).collect()
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        0
    }
}

/// The sizes of one append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendKvArgs {
    pub batch: usize,
    pub new_tokens: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub page_size: usize,
    pub max_pages: usize,
    pub num_pages: usize,
}

impl AppendKvArgs {
    /// Non-empty sizes within the grid and i32 arithmetic, head dims in 16-byte pieces.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(NativeError::InvalidArgs(m));
        let a = self;
        if a.batch == 0 || a.kv_heads == 0 || a.head_dim == 0 || a.v_head_dim == 0 || a.page_size == 0 || a.max_pages == 0 || a.num_pages == 0 {
            return bad(format!("empty append: {a:?}"));
        }
        if !a.head_dim.is_multiple_of(8) || !a.v_head_dim.is_multiple_of(8) {
            return bad(format!("head dims {} / {} are not multiples of 8 (16-byte pieces)", a.head_dim, a.v_head_dim));
        }
        if a.batch > 65535 || a.new_tokens > i32::MAX as usize {
            return bad(format!("batch {} (grid limit 65535) or {} new tokens", a.batch, a.new_tokens));
        }
        if a.max_pages as u64 * a.page_size as u64 > i32::MAX as u64 || a.num_pages as u64 * a.page_size as u64 > i32::MAX as u64 {
            return bad(format!("{a:?}: table or pool rows exceed i32"));
        }
        Ok(())
    }

    /// Elements of the K pool, the V pool, the new K rows, the new V rows.
    pub fn lens(&self) -> [usize; 4] {
        let rows = self.num_pages * self.page_size * self.kv_heads;
        let new = self.batch * self.new_tokens * self.kv_heads;
        [rows * self.head_dim, rows * self.v_head_dim, new * self.head_dim, new * self.v_head_dim]
    }
}

/// Mirror of `AppendKvParams` in `append_kv.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AppendKvParams {
    pub k_pool: u64,
    pub v_pool: u64,
    pub k_new: u64,
    pub v_new: u64,
    pub block_table: u64,
    pub seq_lens: u64,
    pub status: u64,
    pub batch: i32,
    pub new_tokens: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub v_head_dim: i32,
    pub page_size: i32,
    pub max_pages: i32,
    pub num_pages: i32,
}

/// Device addresses of one append.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendKvPtrs {
    pub k_pool: u64,
    pub v_pool: u64,
    pub k_new: u64,
    pub v_new: u64,
    /// i32 `[batch, max_pages]`.
    pub block_table: u64,
    /// i32 `[batch]`: the lengths before the append.
    pub seq_lens: u64,
    /// One u32, set to 1 when a position has no page (left as it is otherwise).
    pub status: u64,
}

impl AppendKvParams {
    pub fn new(a: &AppendKvArgs, p: &AppendKvPtrs) -> Self {
        AppendKvParams {
            k_pool: p.k_pool,
            v_pool: p.v_pool,
            k_new: p.k_new,
            v_new: p.v_new,
            block_table: p.block_table,
            seq_lens: p.seq_lens,
            status: p.status,
            batch: a.batch as i32,
            new_tokens: a.new_tokens as i32,
            kv_heads: a.kv_heads as i32,
            head_dim: a.head_dim as i32,
            v_head_dim: a.v_head_dim as i32,
            page_size: a.page_size as i32,
            max_pages: a.max_pages as i32,
            num_pages: a.num_pages as i32,
        }
    }
}

#[cfg(feature = "cuda")]
pub use launch::AppendKvKernel;

#[cfg(feature = "cuda")]
mod launch {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

    use super::*;
    use crate::cache::KernelCache;

    // SAFETY: #[repr(C)] plain-old-data mirror of the kernel's by-value parameter struct.
    unsafe impl DeviceRepr for AppendKvParams {}

    /// The append kernel loaded into a CUDA context.
    #[derive(Debug)]
    pub struct AppendKvKernel {
        function: CudaFunction,
    }

    impl AppendKvKernel {
        /// Compiles (or fetches from the global cache) and loads the kernel.
        pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
            let arch = crate::device::target_arch(ctx, KERNEL, Arch::Sm80, DecodeConfig::target_for)?;
            let (function, _) = crate::device::load_function(ctx, KernelCache::global(), &AppendKvConfig.request(arch)?, 0)?;
            Ok(AppendKvKernel { function })
        }

        /// Enqueues the append on `stream` (nothing for zero new tokens).
        ///
        /// # Safety
        /// The pointers must address device memory of [`AppendKvArgs::lens`] elements (16-bit),
        /// the table `batch · max_pages` i32, the lengths `batch` i32 and the status one u32,
        /// valid until the kernel finishes on `stream`.
        pub unsafe fn launch_raw(&self, stream: &Arc<CudaStream>, a: &AppendKvArgs, p: &AppendKvPtrs) -> Result<()> {
            a.validate()?;
            if a.new_tokens == 0 {
                return Ok(());
            }
            for (name, x, align) in [("k_pool", p.k_pool, 16), ("v_pool", p.v_pool, 16), ("k_new", p.k_new, 16), ("v_new", p.v_new, 16), ("block_table", p.block_table, 4), ("seq_lens", p.seq_lens, 4), ("status", p.status, 4)] {
                if x == 0 || x % align != 0 {
                    return Err(NativeError::InvalidArgs(format!("{name} pointer {x:#x} is null or not {align}-byte aligned")));
                }
            }
            let params = AppendKvParams::new(a, p);
            let cfg = LaunchConfig { grid_dim: (a.new_tokens as u32, a.batch as u32, 1), block_dim: (AppendKvConfig::THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = stream.launch_builder(&self.function);
            b.arg(&params);
            // SAFETY: the parameter struct matches the kernel's signature; memory per contract.
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_layout_and_validation() {
        // 7 pointers + 8 four-byte fields.
        assert_eq!(std::mem::size_of::<AppendKvParams>(), 7 * 8 + 8 * 4);
        let a = AppendKvArgs { batch: 2, new_tokens: 3, kv_heads: 4, head_dim: 128, v_head_dim: 64, page_size: 16, max_pages: 8, num_pages: 10 };
        a.validate().unwrap();
        assert_eq!(a.lens(), [10 * 16 * 4 * 128, 10 * 16 * 4 * 64, 2 * 3 * 4 * 128, 2 * 3 * 4 * 64]);
        assert!(AppendKvArgs { head_dim: 12, ..a }.validate().is_err());
        assert!(AppendKvArgs { num_pages: 0, ..a }.validate().is_err());
        assert!(AppendKvArgs { max_pages: 1 << 28, ..a }.validate().is_err());
        assert!(AppendKvConfig.request(Arch::Sm90).is_ok());
        assert!(AppendKvConfig.request(Arch::Sm90a).is_err());
    }
}
