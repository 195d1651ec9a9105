//! The compile report of the HIP families (`quattn kernels`, CI): every variant compiled offline
//! by clang for gfx942 and gfx950, disassembled with llvm-objdump and checked for its MFMA
//! instructions (and no other MFMA form), its registers, LDS, scratch and occupancy from the
//! code object's metadata. Nothing here runs on a GPU.

use std::collections::BTreeMap;
use std::process::Command;

use super::compile::{Clang, HipCache, HipVariant};
use super::prepass::HipPrepassId;
use super::config::{GfxArch, HipKernelId};
use crate::cache::Origin;
use crate::error::{NativeError, Result};

/// One (variant, arch) line of the report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct HipKernelReport {
    pub kernel: String,
    pub arch: GfxArch,
    pub compiled: bool,
    /// The compiler's log when compilation failed, or why it could not run.
    pub error: Option<String>,
    pub vgprs: Option<u32>,
    pub agprs: Option<u32>,
    pub sgprs: Option<u32>,
    /// `.group_segment_fixed_size`: static LDS of the workgroup.
    pub lds_bytes: Option<u32>,
    /// `.private_segment_fixed_size`: scratch per lane (spills, stack); must be 0.
    pub scratch_bytes: Option<u32>,
    pub vgpr_spills: Option<u32>,
    pub sgpr_spills: Option<u32>,
    /// Waves per SIMD the registers and LDS allow (of 8).
    pub waves_per_simd: Option<u32>,
    /// MFMAs one wave issues per KV tile, by the kernel's loop structure.
    pub mfma_per_tile: usize,
    pub compile_millis: Option<u64>,
    pub expected: Vec<String>,
    pub missing: Vec<String>,
    /// `v_mfma*` forms present but not expected.
    pub unexpected: Vec<String>,
    /// Counts of the instructions that matter: every `v_mfma*`, FP8 conversions, `v_exp_f32`,
    /// LDS and global memory operations.
    pub instructions: BTreeMap<String, usize>,
    pub disassembly_error: Option<String>,
}

impl HipKernelReport {
    /// Compiled, disassembled, the intended MFMAs and nothing else, no scratch, no spill, LDS
    /// within the arch's limit.
    pub fn ok(&self) -> bool {
        self.compiled
            && self.disassembly_error.is_none()
            && self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.scratch_bytes == Some(0)
            && self.vgpr_spills == Some(0)
            && self.sgpr_spills == Some(0)
            && self.lds_bytes.is_some_and(|l| l <= self.arch.lds_bytes())
    }

    pub fn summary(&self) -> String {
        let status = if self.ok() { "ok" } else { "FAIL" };
        let opt = |v: Option<u32>| v.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
        let mfma: Vec<String> =
            self.instructions.iter().filter(|(k, _)| k.starts_with("v_mfma")).map(|(k, v)| format!("{k}x{v}")).collect();
        let mut s = format!(
            "{status:4} {:34} {:7} vgpr {:>3} agpr {:>3} sgpr {:>3} lds {:>6} scratch {} waves/simd {} mfma/tile {} [{}] (not run on hardware)",
            self.kernel,
            self.arch.as_str(),
            opt(self.vgprs),
            opt(self.agprs),
            opt(self.sgprs),
            opt(self.lds_bytes),
            opt(self.scratch_bytes),
            opt(self.waves_per_simd),
            self.mfma_per_tile,
            mfma.join(" ")
        );
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

/// Mnemonic counts of an llvm-objdump listing (`\t<mnemonic> <operands> // <address>: <hex>`).
pub fn mnemonic_histogram(listing: &str) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for line in listing.lines() {
        let t = line.trim_start();
        if !line.starts_with('\t') && !line.starts_with("  ") {
            continue;
        }
        let Some(op) = t.split_whitespace().next() else { continue };
        if op.starts_with(|c: char| c.is_ascii_lowercase()) && op.contains('_') {
            *h.entry(op.to_string()).or_insert(0) += 1;
        }
    }
    h
}

fn interesting(op: &str) -> bool {
    op.starts_with("v_mfma")
        || op.contains("fp8")
        || op == "v_exp_f32"
        || op.starts_with("ds_read")
        || op.starts_with("ds_write")
        || op.starts_with("ds_load")
        || op.starts_with("ds_store")
        || op.starts_with("global_load")
        || op.starts_with("global_store")
        || op.starts_with("ds_bpermute")
        || op.starts_with("scratch_")
}

/// Integer fields of the code object's metadata (`llvm-readelf --notes`), first kernel.
pub fn metadata_fields(notes: &str) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    for line in notes.lines() {
        let t = line.trim().trim_start_matches("- ");
        let Some((k, v)) = t.split_once(':') else { continue };
        let k = k.trim();
        if !k.starts_with('.') {
            continue;
        }
        if let Ok(n) = v.trim().parse::<u32>() {
            m.entry(k.trim_start_matches('.').to_string()).or_insert(n);
        }
    }
    m
}

/// Waves per SIMD: the unified register file (512 VGPRs per lane, arch VGPRs and AGPRs each
/// rounded up to granules of 8) and the LDS of a CU (4 SIMDs) bound it, at most 8.
pub fn waves_per_simd(arch: GfxArch, vgprs: u32, agprs: u32, lds: u32, waves_per_group: u32) -> u32 {
    let regs = vgprs.div_ceil(8) * 8 + agprs.div_ceil(8) * 8;
    let by_regs = if regs == 0 { 8 } else { (512 / regs).min(8) };
    let groups_per_cu = if lds == 0 { u32::MAX } else { arch.lds_bytes() / lds };
    let by_lds = groups_per_cu.saturating_mul(waves_per_group) / 4;
    by_regs.min(by_lds)
}

fn run(tool: &std::path::Path, args: &[&str], file: &std::path::Path) -> Result<String> {
    let out = Command::new(tool)
        .args(args)
        .arg(file)
        .output()
        .map_err(|e| NativeError::HipToolNotFound(format!("{}: {e}", tool.display())))?;
    if !out.status.success() {
        return Err(NativeError::Disassembler { tool: "llvm-objdump/readelf", message: String::from_utf8_lossy(&out.stderr).into_owned() });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Compiles, disassembles and checks one variant on one arch.
pub fn report_variant(cache: &HipCache, clang: &Clang, id: &dyn HipVariant, arch: GfxArch) -> HipKernelReport {
    let expected = id.expected_instructions(arch);
    let mut r = HipKernelReport {
        kernel: id.name(),
        arch,
        compiled: false,
        error: None,
        vgprs: None,
        agprs: None,
        sgprs: None,
        lds_bytes: None,
        scratch_bytes: None,
        vgpr_spills: None,
        sgpr_spills: None,
        waves_per_simd: None,
        mfma_per_tile: id.mfma_per_tile(arch),
        compile_millis: None,
        missing: expected.clone(),
        expected,
        unexpected: Vec::new(),
        instructions: BTreeMap::new(),
        disassembly_error: None,
    };
    let obj = match cache.get_or_compile(id, arch, clang) {
        Ok(o) => o,
        Err(NativeError::HipCompile { log, .. }) => {
            r.error = Some(log);
            return r;
        }
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    r.compiled = true;
    r.compile_millis = match obj.origin {
        Origin::Compiled { millis } => Some(millis),
        Origin::Disk => None,
    };
    let path = std::env::temp_dir().join(format!("quattn-hip-{}-{}-{arch}.hsaco", std::process::id(), r.kernel));
    if let Err(e) = std::fs::write(&path, &obj.code) {
        r.disassembly_error = Some(e.to_string());
        return r;
    }
    let checked = (|| -> Result<()> {
        let listing = run(&clang.objdump()?, &["-d"], &path)?;
        let notes = run(&clang.readelf()?, &["--notes"], &path)?;
        let hist = mnemonic_histogram(&listing);
        r.missing = r.expected.iter().filter(|e| !hist.contains_key(*e)).cloned().collect();
        r.unexpected = hist.keys().filter(|k| k.starts_with("v_mfma") && !r.expected.contains(k)).cloned().collect();
        r.instructions = hist.into_iter().filter(|(k, _)| interesting(k)).collect();
        let meta = metadata_fields(&notes);
        let get = |k: &str| meta.get(k).copied();
        r.vgprs = get("vgpr_count");
        r.agprs = get("agpr_count");
        r.sgprs = get("sgpr_count");
        r.lds_bytes = get("group_segment_fixed_size");
        r.scratch_bytes = get("private_segment_fixed_size");
        r.vgpr_spills = get("vgpr_spill_count");
        r.sgpr_spills = get("sgpr_spill_count");
        if let (Some(v), Some(a), Some(l)) = (r.vgprs, r.agprs, r.lds_bytes) {
            r.waves_per_simd = Some(waves_per_simd(arch, v, a, l, id.waves(arch)));
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    if let Err(e) = checked {
        r.disassembly_error = Some(e.to_string());
    }
    r
}

/// Every HIP variant: the attention families', then the prepass's.
pub fn all_variants() -> &'static [Box<dyn HipVariant>] {
    static ALL: std::sync::OnceLock<Vec<Box<dyn HipVariant>>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let mut v: Vec<Box<dyn HipVariant>> = HipKernelId::all().into_iter().map(|k| Box::new(k) as Box<dyn HipVariant>).collect();
        v.extend(HipPrepassId::all().into_iter().map(|k| Box::new(k) as Box<dyn HipVariant>));
        v
    })
}

/// Every HIP variant on every target, in parallel over the cores; each line says what went
/// wrong for it. `Err` only when no clang is found.
pub fn hip_compile_report(cache: &HipCache) -> Result<Vec<HipKernelReport>> {
    let clang = Clang::find()?;
    let jobs: Vec<(&dyn HipVariant, GfxArch)> = all_variants()
        .iter()
        .flat_map(|id| id.targets().iter().map(move |&a| (id.as_ref(), a)))
        .collect();
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::with_capacity(jobs.len()));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((id, arch)) = jobs.get(i) else { break };
                let r = report_variant(cache, clang, *id, *arch);
                results.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
            });
        }
    });
    let mut v = results.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_by_key(|(i, _)| *i);
    Ok(v.into_iter().map(|(_, r)| r).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_objdump_and_metadata() {
        let listing = "\tv_mfma_f32_32x32x16_bf16 v[2:17], v[20:23], v[24:27], v[2:17]// 000000001654: D3B70002\n\
                       \tv_mfma_f32_32x32x16_bf16 v[2:17], v[20:23], v[24:27], v[2:17]// 000000001660: D3B70002\n\
                       \ts_endpgm                                                   // 000000001670: BF810000\n\
                       0000000000001600 <fwd_mfma>:\n";
        let h = mnemonic_histogram(listing);
        assert_eq!(h.get("v_mfma_f32_32x32x16_bf16"), Some(&2));
        assert_eq!(h.get("s_endpgm"), Some(&1));
        assert_eq!(h.len(), 2);
        let notes = "  - .agpr_count:     0\n    .group_segment_fixed_size: 35840\n    .private_segment_fixed_size: 0\n    .vgpr_count:     168\n";
        let m = metadata_fields(notes);
        assert_eq!(m.get("agpr_count"), Some(&0));
        assert_eq!(m.get("group_segment_fixed_size"), Some(&35840));
        assert_eq!(m.get("vgpr_count"), Some(&168));
    }

    #[test]
    fn occupancy_from_registers_and_lds() {
        // 168 VGPRs -> 168 of 512: 3 waves; 35 KiB of LDS: one 4-wave group per CU on gfx942
        // (64 KiB) = 1 wave per SIMD, four on gfx950 (160 KiB) = 4 waves per SIMD.
        assert_eq!(waves_per_simd(GfxArch::Gfx950, 168, 0, 35840, 4), 3);
        assert_eq!(waves_per_simd(GfxArch::Gfx942, 168, 0, 35840, 4), 1);
        assert_eq!(waves_per_simd(GfxArch::Gfx950, 64, 0, 0, 4), 8);
    }
}
