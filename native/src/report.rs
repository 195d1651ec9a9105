//! The compile report behind `quattn kernels [--json]` and CI: every kernel variant compiled
//! for every target it is meant for, disassembled, and checked for registers, spills and the
//! tensor-core instructions it is built around.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::arch::Arch;
use crate::cache::{CompileRequest, KernelCache, Origin};
use crate::error::{NativeError, Result};
use crate::hmma::HmmaConfig;
use crate::int8::Int8Config;
use crate::int8_prepass::PrepassVariant;
use crate::int8_umma::Int8UmmaConfig;
use crate::wgmma::WgmmaConfig;
use crate::wgmma_int8::Int8WgmmaConfig;

/// What a kernel family declares for one compiled variant: its name, its NVRTC request per
/// target, the SASS instructions it is built around and its shared memory. Each family
/// implements it for its config type; [`crate::NativeKernelId`] lists every variant.
pub trait KernelVariant: Send + Sync {
    /// Variant name, unique across families (it is also the cache key's kernel name).
    fn name(&self) -> String;
    /// The NVRTC request for `arch`.
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>>;
    /// SASS opcodes that must be present on `arch`; any other `*MMA*` opcode is reported as
    /// unexpected.
    fn expected_instructions(&self, arch: Arch) -> Vec<String>;
    /// Dynamic shared memory the launch requests on `arch`.
    fn dynamic_smem_bytes(&self, arch: Arch) -> u32;
}

impl KernelVariant for HmmaConfig {
    fn name(&self) -> String {
        HmmaConfig::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        HmmaConfig::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        HmmaConfig::expected_instructions(self).into_iter().map(String::from).collect()
    }
    fn dynamic_smem_bytes(&self, arch: Arch) -> u32 {
        self.tile_for(arch).map(|t| t.smem_bytes(self.head_dim)).unwrap_or(0)
    }
}

impl KernelVariant for Int8UmmaConfig {
    fn name(&self) -> String {
        Int8UmmaConfig::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Int8UmmaConfig::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        Int8UmmaConfig::expected_instructions(self).into_iter().map(String::from).collect()
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        self.smem_bytes().unwrap_or(0)
    }
}

impl KernelVariant for WgmmaConfig {
    fn name(&self) -> String {
        WgmmaConfig::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        WgmmaConfig::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        WgmmaConfig::expected_instructions(self)
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        self.smem_bytes().unwrap_or(0)
    }
}

impl KernelVariant for Int8WgmmaConfig {
    fn name(&self) -> String {
        Int8WgmmaConfig::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Int8WgmmaConfig::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        Int8WgmmaConfig::expected_instructions(self)
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        self.smem_bytes().unwrap_or(0)
    }
}

impl KernelVariant for PrepassVariant {
    fn name(&self) -> String {
        PrepassVariant::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        PrepassVariant::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        PrepassVariant::expected_instructions(self).into_iter().map(String::from).collect()
    }
    fn dynamic_smem_bytes(&self, _arch: Arch) -> u32 {
        0
    }
}

impl KernelVariant for Int8Config {
    fn name(&self) -> String {
        Int8Config::name(self)
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        Int8Config::request(self, arch)
    }
    fn expected_instructions(&self, _arch: Arch) -> Vec<String> {
        Int8Config::expected_instructions(self).into_iter().map(String::from).collect()
    }
    fn dynamic_smem_bytes(&self, arch: Arch) -> u32 {
        self.smem_bytes_for(arch).unwrap_or(0)
    }
}

/// One (variant, arch) line of the report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelReport {
    /// Variant name, e.g. `fwd_hmma_f16_f32_f32_d128`.
    pub kernel: String,
    pub arch: Arch,
    /// NVRTC produced a cubin.
    pub compiled: bool,
    /// NVRTC's log when compilation failed (or another error preventing the compile).
    pub error: Option<String>,
    pub registers: Option<u32>,
    pub spill_store_bytes: Option<u32>,
    pub spill_load_bytes: Option<u32>,
    pub stack_frame_bytes: Option<u32>,
    /// Dynamic shared memory the launch requests.
    pub dynamic_smem_bytes: u32,
    /// Milliseconds NVRTC took, `None` when served from the disk cache.
    pub compile_millis: Option<u64>,
    /// Tensor-core SASS opcodes that must be present.
    pub expected: Vec<String>,
    /// Expected opcodes absent from the SASS.
    pub missing: Vec<String>,
    /// MMA-family opcodes present although not expected (a mode that silently changed).
    pub unexpected: Vec<String>,
    /// Counts of the opcodes that matter for performance: every *MMA*, LDSM, LDGSTS, MUFU.EX2,
    /// I2F.
    pub instructions: BTreeMap<String, usize>,
    /// Why the SASS could not be checked (no disassembler, tool failure).
    pub disassembly_error: Option<String>,
}

impl KernelReport {
    /// Compiled, disassembled, every expected instruction present, nothing unexpected, no spill.
    pub fn ok(&self) -> bool {
        self.compiled
            && self.disassembly_error.is_none()
            && self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.spill_store_bytes == Some(0)
            && self.spill_load_bytes == Some(0)
    }

    /// One human-readable line.
    pub fn summary(&self) -> String {
        let status = if self.ok() { "ok" } else { "FAIL" };
        let opt = |v: Option<u32>| v.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
        let mut s = format!(
            "{status:4} {:28} {:8} regs {:>3} spill {}/{} smem {:>6}",
            self.kernel,
            self.arch.as_str(),
            opt(self.registers),
            opt(self.spill_store_bytes),
            opt(self.spill_load_bytes),
            self.dynamic_smem_bytes
        );
        let mma: Vec<String> = self
            .instructions
            .iter()
            .filter(|(k, _)| k.contains("MMA"))
            .map(|(k, v)| format!("{k}x{v}"))
            .collect();
        s.push_str(&format!(" [{}]", mma.join(" ")));
        if !self.missing.is_empty() {
            s.push_str(&format!(" missing {:?}", self.missing));
        }
        if !self.unexpected.is_empty() {
            s.push_str(&format!(" unexpected {:?}", self.unexpected));
        }
        if let Some(e) = self.error.as_ref().or(self.disassembly_error.as_ref()) {
            s.push_str(&format!(" error: {}", e.lines().next().unwrap_or("")));
        }
        s
    }
}

/// A matrix-unit opcode (HMMA, IMMA, HGMMA, UTCIMMA, ...). `HFMA2.MMA` is not one: it is a
/// packed-f16 FMA that ptxas issues on the MMA pipe, e.g. to materialize constants.
fn is_matrix_op(op: &str) -> bool {
    op.contains("MMA") && !op.starts_with("HFMA2.MMA")
}

fn interesting(op: &str) -> bool {
    is_matrix_op(op)
        || op.starts_with("LDSM")
        || op.starts_with("LDGSTS")
        || op == "MUFU.EX2"
        // I2F*: int -> float conversions. I2F runs on the slow conversion pipe; I2FP (sm_86 and
        // later) on the integer ALU, one per score in the INT8 kernels.
        || op.starts_with("I2F")
        // Tensor-memory traffic and UMMA commits of the tcgen05 families.
        || op.starts_with("LDTM")
        || op.starts_with("STTM")
        || op == "UTCBAR"
        // Global atomics: the counters of kernels that finish their work in the last CTA.
        || op.starts_with("ATOMG")
        || op.starts_with("RED.")
}

/// Report of one variant on one target.
pub fn report_variant(cache: &KernelCache, config: &dyn KernelVariant, arch: Arch) -> KernelReport {
    let expected = config.expected_instructions(arch);
    let mut r = KernelReport {
        kernel: config.name(),
        arch,
        compiled: false,
        error: None,
        registers: None,
        spill_store_bytes: None,
        spill_load_bytes: None,
        stack_frame_bytes: None,
        dynamic_smem_bytes: config.dynamic_smem_bytes(arch),
        compile_millis: None,
        missing: expected.clone(),
        expected,
        unexpected: Vec::new(),
        instructions: BTreeMap::new(),
        disassembly_error: None,
    };
    let compiled = match config.request(arch).and_then(|req| cache.get_or_compile(&req)) {
        Ok(c) => c,
        Err(NativeError::Compile { log, .. }) => {
            r.error = Some(log);
            return r;
        }
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    r.compiled = true;
    r.compile_millis = match compiled.origin {
        Origin::Compiled { millis } => Some(millis),
        Origin::Disk => None,
    };
    if let Some(res) = compiled.resources {
        r.registers = Some(res.registers);
        r.spill_store_bytes = Some(res.spill_store_bytes);
        r.spill_load_bytes = Some(res.spill_load_bytes);
        r.stack_frame_bytes = Some(res.stack_frame_bytes);
    }
    match crate::sass::disassemble(&compiled.cubin) {
        Ok(sass) => {
            let hist = crate::sass::opcode_histogram(&sass);
            r.missing = r.expected.iter().filter(|e| !hist.contains_key(*e)).cloned().collect();
            r.unexpected = hist
                .keys()
                .filter(|k| is_matrix_op(k) && !r.expected.contains(k))
                .cloned()
                .collect();
            r.instructions = hist.into_iter().filter(|(k, _)| interesting(k)).collect();
        }
        Err(e) => r.disassembly_error = Some(e.to_string()),
    }
    r
}

/// Every (variant, target) pair of the registry ([`crate::NativeKernelId::all`]), restricted to
/// `archs` when given.
pub fn all_targets(archs: Option<&[Arch]>) -> Vec<(Arc<dyn KernelVariant>, Arch)> {
    let mut jobs = Vec::new();
    for id in crate::registry::NativeKernelId::all() {
        for &arch in id.targets() {
            if archs.is_none_or(|a| a.contains(&arch)) {
                jobs.push((Arc::new(id) as Arc<dyn KernelVariant>, arch));
            }
        }
    }
    jobs
}

/// Compiles and checks every variant on every target it is meant for (restricted to `archs`
/// when given), in parallel over the available cores. Never fails as a whole: each line says
/// what went wrong for it. Ordered by variant, then arch.
pub fn compile_report(cache: &KernelCache, archs: Option<&[Arch]>) -> Vec<KernelReport> {
    run_jobs(cache, all_targets(archs))
}

/// [`compile_report`] restricted to one family's variants ([`crate::NativeKernelId::family`]):
/// what a family's own checks need, without compiling every other family for its targets.
pub fn compile_family_report(cache: &KernelCache, archs: Option<&[Arch]>, family: &str) -> Vec<KernelReport> {
    let jobs = crate::registry::NativeKernelId::all()
        .into_iter()
        .filter(|id| id.family() == family)
        .flat_map(|id| {
            id.targets()
                .iter()
                .filter(|&&arch| archs.is_none_or(|a| a.contains(&arch)))
                .map(|&arch| (Arc::new(id) as Arc<dyn KernelVariant>, arch))
                .collect::<Vec<_>>()
        })
        .collect();
    run_jobs(cache, jobs)
}

fn run_jobs(cache: &KernelCache, jobs: Vec<(Arc<dyn KernelVariant>, Arch)>) -> Vec<KernelReport> {
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::with_capacity(jobs.len()));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((cfg, arch)) = jobs.get(i) else { break };
                let r = report_variant(cache, cfg.as_ref(), *arch);
                results.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
            });
        }
    });
    let mut v = results.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().map(|(_, r)| r).collect()
}
