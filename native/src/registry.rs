//! The native kernel registry: every family's variants behind one typed id ([`NativeKernelId`]),
//! the list the compile report, the compile tests and the facade's dispatch iterate, and (with
//! the `cuda` feature) the one module store that loads and caches them per CUDA context.
//!
//! A family provides its config type (name, variants, targets, defines, expected SASS
//! instructions, shared memory: [`KernelVariant`]) and its launcher; adding one means its `.cu`
//! source, its family file, one variant here and its tests.

use crate::arch::Arch;
use crate::cache::CompileRequest;
use crate::decode::{DecodeConfig, DecodeUnit};
use crate::error::Result;
use crate::fp8_prepass::{Fp8PrepassConfig, Fp8PrepassPass, Fp8PrepassVariant};
use crate::hmma::HmmaConfig;
use crate::int8::Int8Config;
use crate::int8_prepass::{Int8PrepassConfig, PrepassPass, PrepassVariant};
use crate::int8_umma::Int8UmmaConfig;
use crate::mma_fp8::{Fp8MmaConfig, Fp8MmaUnit};
use crate::nvfp4::Nvfp4Config;
use crate::nvfp4_quant::Nvfp4QuantConfig;
use crate::report::KernelVariant;
use crate::wgmma::WgmmaConfig;
use crate::wgmma_int8::Int8WgmmaConfig;
use crate::wgmma_fp8::{Fp8WgmmaConfig, Fp8WgmmaUnit};

/// One native kernel: its family and resolved config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum NativeKernelId {
    /// mma.sync HMMA forward (f16/bf16; sm_80 and later).
    Hmma(HmmaConfig),
    /// Warp-specialized TMA + wgmma forward (f16; sm_90a).
    Wgmma(WgmmaConfig),
    /// INT8 Q·Kᵀ on mma.sync IMMA (sm_80 and later).
    Int8Imma(Int8Config),
    /// INT8 Q·Kᵀ on s8 wgmma (sm_90a).
    Int8Wgmma(Int8WgmmaConfig),
    /// INT8 Q·Kᵀ on tcgen05 UMMA (sm_100a; compiled and SASS-checked, not run on hardware).
    Int8Umma(Int8UmmaConfig),
    /// FP8 (E4M3) Q·Kᵀ and P·V on e4m3 wgmma (sm_90a): an attention variant (it loads with its
    /// Vᵀ prepass) or, as compiled, the prepass of a head dim.
    Fp8Wgmma(Fp8WgmmaUnit),
    /// The INT8 quantization prepass of the INT8 families (its three passes load together).
    Int8Prepass(Int8PrepassConfig),
    /// One pass of the prepass, as compiled (the report's and the compile tests' unit).
    Int8PrepassPass(PrepassVariant),
    /// FP8 (e4m3) Q·Kᵀ and P·V on mma.sync (sm_89, sm_120a native; sm_90 lowered by ptxas),
    /// a forward variant or its V prepass.
    Fp8Mma(Fp8MmaUnit),
    /// Split-KV decode on mma.sync (f16/bf16; sm_80 and later; its splits merged in-kernel),
    /// also the paged prefill: a decode variant or, as compiled, the paged cache's writer.
    Decode(DecodeUnit),
    /// NVFP4 Q·Kᵀ on the block-scaled mma.sync (sm_120a; compiled and SASS-checked, not run on
    /// hardware).
    Nvfp4(Nvfp4Config),
    /// The NVFP4 / MXFP4 quantization prepass (every target).
    Nvfp4Quant(Nvfp4QuantConfig),
    /// The FP8 quantization prepass of the FP8 families (its two passes load together).
    Fp8Prepass(Fp8PrepassConfig),
    /// One pass of the FP8 prepass, as compiled (the report's and the compile tests' unit).
    Fp8PrepassPass(Fp8PrepassVariant),
}

impl NativeKernelId {
    /// Every compiled unit of every family: the registry. Each appears once; the prepass as its
    /// separately compiled passes.
    pub fn all() -> Vec<NativeKernelId> {
        let mut v: Vec<NativeKernelId> = HmmaConfig::all().into_iter().map(NativeKernelId::Hmma).collect();
        v.extend(Int8Config::all().into_iter().map(NativeKernelId::Int8Imma));
        v.extend(Int8PrepassConfig::report_variants().into_iter().map(NativeKernelId::Int8PrepassPass));
        v.extend(Int8UmmaConfig::all().into_iter().map(NativeKernelId::Int8Umma));
        v.extend(WgmmaConfig::all().into_iter().map(NativeKernelId::Wgmma));
        v.extend(Int8WgmmaConfig::all().into_iter().map(NativeKernelId::Int8Wgmma));
        v.extend(Fp8WgmmaUnit::all().into_iter().map(NativeKernelId::Fp8Wgmma));
        v.extend(Fp8MmaUnit::all().into_iter().map(NativeKernelId::Fp8Mma));
        v.extend(DecodeUnit::all().into_iter().map(NativeKernelId::Decode));
        v.extend(Nvfp4Config::all().into_iter().map(NativeKernelId::Nvfp4));
        v.extend(Nvfp4QuantConfig::all().into_iter().map(NativeKernelId::Nvfp4Quant));
        v.extend(
            Fp8PrepassConfig::all()
                .into_iter()
                .flat_map(|config| config.passes().map(|pass| NativeKernelId::Fp8PrepassPass(Fp8PrepassVariant { config, pass }))),
        );
        v
    }

    /// The variant's name, unique across the registry (also its cache key's kernel name).
    pub fn name(&self) -> String {
        self.variant().name()
    }

    /// The family's name (the kernel source's entry point).
    pub fn family(&self) -> &'static str {
        match self {
            NativeKernelId::Hmma(_) => "fwd_hmma",
            NativeKernelId::Wgmma(_) => "fwd_wgmma",
            NativeKernelId::Int8Imma(_) => "fwd_int8",
            NativeKernelId::Int8Wgmma(_) => "fwd_wgmma_int8",
            NativeKernelId::Int8Umma(_) => "fwd_int8_umma",
            NativeKernelId::Fp8Wgmma(_) => "fwd_fp8_wgmma",
            NativeKernelId::Int8Prepass(_) | NativeKernelId::Int8PrepassPass(_) => "int8_prepass",
            NativeKernelId::Fp8Mma(_) => "fwd_mma_fp8",
            NativeKernelId::Decode(_) => "fwd_decode",
            NativeKernelId::Nvfp4(_) => "fwd_nvfp4",
            NativeKernelId::Nvfp4Quant(_) => "nvfp4_quant",
            NativeKernelId::Fp8Prepass(_) | NativeKernelId::Fp8PrepassPass(_) => "fp8_prepass",
        }
    }

    /// The targets the family is compiled for.
    pub fn targets(&self) -> &'static [Arch] {
        match self {
            NativeKernelId::Hmma(c) => c.targets(),
            NativeKernelId::Wgmma(_) => WgmmaConfig::TARGETS,
            NativeKernelId::Int8Imma(_) => Int8Config::TARGETS,
            NativeKernelId::Int8Wgmma(_) => Int8WgmmaConfig::TARGETS,
            NativeKernelId::Int8Umma(_) => Int8UmmaConfig::TARGETS,
            NativeKernelId::Fp8Wgmma(_) => Fp8WgmmaConfig::TARGETS,
            NativeKernelId::Int8Prepass(c) => c.targets(),
            NativeKernelId::Int8PrepassPass(v) => v.config.targets(),
            NativeKernelId::Fp8Mma(_) => Fp8MmaConfig::TARGETS,
            NativeKernelId::Decode(_) => DecodeConfig::TARGETS,
            NativeKernelId::Nvfp4(_) => Nvfp4Config::TARGETS,
            NativeKernelId::Nvfp4Quant(_) => Nvfp4QuantConfig::TARGETS,
            NativeKernelId::Fp8Prepass(_) | NativeKernelId::Fp8PrepassPass(_) => Fp8PrepassConfig::TARGETS,
        }
    }

    /// The target a device of compute capability `cc` runs this kernel as, if any.
    pub fn target_for(&self, cc: (u32, u32)) -> Option<Arch> {
        match self {
            NativeKernelId::Hmma(c) if c.mods.is_some() || c.varlen => {
                Arch::for_compute_capability(cc.0, cc.1).into_iter().find(|a| c.targets().contains(a))
            }
            NativeKernelId::Hmma(_) => HmmaConfig::target_for(cc),
            NativeKernelId::Wgmma(_) => WgmmaConfig::target_for(cc),
            NativeKernelId::Int8Imma(_) => Int8Config::target_for(cc),
            NativeKernelId::Int8Wgmma(_) => Int8WgmmaConfig::target_for(cc),
            NativeKernelId::Int8Umma(_) => Int8UmmaConfig::target_for(cc),
            NativeKernelId::Fp8Wgmma(_) => Fp8WgmmaConfig::target_for(cc),
            NativeKernelId::Int8Prepass(c) => c.target_of(cc),
            NativeKernelId::Int8PrepassPass(v) => v.config.target_of(cc),
            NativeKernelId::Fp8Mma(_) => Fp8MmaConfig::target_for(cc),
            NativeKernelId::Decode(_) => DecodeConfig::target_for(cc),
            NativeKernelId::Nvfp4(_) => Nvfp4Config::target_for(cc),
            NativeKernelId::Nvfp4Quant(_) => Nvfp4QuantConfig::target_for(cc),
            NativeKernelId::Fp8Prepass(_) | NativeKernelId::Fp8PrepassPass(_) => Fp8PrepassConfig::target_for(cc),
        }
    }

    /// The variant as the compile report sees it (a whole prepass as its quantize pass, the
    /// one its configuration names).
    fn variant(&self) -> Box<dyn KernelVariant> {
        match *self {
            NativeKernelId::Hmma(c) => Box::new(c),
            NativeKernelId::Wgmma(c) => Box::new(c),
            NativeKernelId::Int8Imma(c) => Box::new(c),
            NativeKernelId::Int8Wgmma(c) => Box::new(c),
            NativeKernelId::Int8Umma(c) => Box::new(c),
            NativeKernelId::Fp8Wgmma(u) => Box::new(u),
            NativeKernelId::Int8Prepass(config) => Box::new(PrepassVariant { config, pass: PrepassPass::Quantize }),
            NativeKernelId::Int8PrepassPass(c) => Box::new(c),
            NativeKernelId::Fp8Mma(u) => Box::new(u),
            NativeKernelId::Decode(u) => Box::new(u),
            NativeKernelId::Nvfp4(c) => Box::new(c),
            NativeKernelId::Nvfp4Quant(c) => Box::new(c),
            NativeKernelId::Fp8Prepass(config) => Box::new(Fp8PrepassVariant { config, pass: Fp8PrepassPass::Quantize }),
            NativeKernelId::Fp8PrepassPass(v) => Box::new(v),
        }
    }
}

impl KernelVariant for NativeKernelId {
    fn name(&self) -> String {
        self.variant().name()
    }
    fn request(&self, arch: Arch) -> Result<CompileRequest<'static>> {
        self.variant().request(arch)
    }
    fn expected_instructions(&self, arch: Arch) -> Vec<String> {
        self.variant().expected_instructions(arch)
    }
    fn dynamic_smem_bytes(&self, arch: Arch) -> u32 {
        self.variant().dynamic_smem_bytes(arch)
    }
}

impl std::fmt::Display for NativeKernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&KernelVariant::name(self))
    }
}

#[cfg(feature = "cuda")]
pub use store::{Loaded, ModuleStore};

#[cfg(feature = "cuda")]
mod store {
    use std::collections::HashMap;
    use std::sync::{Arc, RwLock};

    use cudarc::driver::CudaContext;

    use super::NativeKernelId;
    use crate::error::{NativeError, Result};
    use crate::wgmma_fp8::{Fp8WgmmaKernel, Fp8WgmmaUnit};
    use crate::mma_fp8::{Fp8MmaKernel, Fp8MmaUnit};
    use crate::decode::{DecodeKernel, DecodeUnit};
    use crate::{Fp8Prepass, HmmaKernel, Int8Kernel, Int8Prepass, Int8UmmaKernel, Int8WgmmaKernel, WgmmaKernel};

    /// A loaded kernel of any family.
    #[derive(Debug)]
    pub enum Loaded {
        Hmma(HmmaKernel),
        Wgmma(WgmmaKernel),
        Int8Imma(Int8Kernel),
        Int8Wgmma(Int8WgmmaKernel),
        Int8Umma(Int8UmmaKernel),
        Fp8Wgmma(Fp8WgmmaKernel),
        Int8Prepass(Int8Prepass),
        Fp8Mma(Fp8MmaKernel),
        Decode(DecodeKernel),
        Nvfp4(crate::nvfp4::Nvfp4Kernel),
        Nvfp4Quant(crate::nvfp4_quant::Nvfp4Quant),
        Fp8Prepass(Fp8Prepass),
    }

    /// The kernels loaded into one CUDA context, by id: compiled (or read from the disk cache)
    /// and loaded on first use, shared afterwards. Read lock on the hot path, write lock on a
    /// miss. The one module cache of the native layer.
    pub struct ModuleStore {
        ctx: Arc<CudaContext>,
        loaded: RwLock<HashMap<NativeKernelId, Arc<Loaded>>>,
    }

    impl ModuleStore {
        pub fn new(ctx: Arc<CudaContext>) -> Self {
            ModuleStore { ctx, loaded: RwLock::new(HashMap::new()) }
        }

        pub fn context(&self) -> &Arc<CudaContext> {
            &self.ctx
        }

        /// The loaded kernel for `id`, loading it on first use.
        pub fn get(&self, id: NativeKernelId) -> Result<Arc<Loaded>> {
            if let Some(k) = self.loaded.read().ok().and_then(|m| m.get(&id).cloned()) {
                return Ok(k);
            }
            let ctx = &self.ctx;
            let k = Arc::new(match id {
                NativeKernelId::Hmma(c) => Loaded::Hmma(HmmaKernel::load(ctx, c)?),
                NativeKernelId::Wgmma(c) => Loaded::Wgmma(WgmmaKernel::load(ctx, c)?),
                NativeKernelId::Int8Imma(c) => Loaded::Int8Imma(Int8Kernel::load(ctx, c)?),
                NativeKernelId::Int8Wgmma(c) => Loaded::Int8Wgmma(Int8WgmmaKernel::load(ctx, c)?),
                NativeKernelId::Int8Umma(c) => Loaded::Int8Umma(Int8UmmaKernel::load(ctx, c)?),
                NativeKernelId::Fp8Wgmma(Fp8WgmmaUnit::Attention(c)) => Loaded::Fp8Wgmma(Fp8WgmmaKernel::load(ctx, c)?),
                NativeKernelId::Fp8Wgmma(u @ Fp8WgmmaUnit::VTranspose { .. }) => {
                    return Err(NativeError::InvalidArgs(format!(
                        "{} is the Vᵀ prepass; it loads with an attention variant",
                        crate::report::KernelVariant::name(&u)
                    )))
                }
                NativeKernelId::Int8Prepass(c) => Loaded::Int8Prepass(Int8Prepass::load(ctx, c)?),
                NativeKernelId::Fp8Mma(Fp8MmaUnit::Fwd(c)) => Loaded::Fp8Mma(Fp8MmaKernel::load(ctx, c)?),
                NativeKernelId::Fp8Mma(Fp8MmaUnit::VPrepass(v)) => {
                    return Err(NativeError::InvalidArgs(format!(
                        "{} is the V prepass; it loads with its forward variant",
                        v.name()
                    )))
                }
                NativeKernelId::Decode(DecodeUnit::Attention(c)) => Loaded::Decode(DecodeKernel::load(ctx, c)?),
                NativeKernelId::Decode(DecodeUnit::AppendKv(_)) => {
                    return Err(NativeError::InvalidArgs("append_kv is not an attention kernel; it loads through AppendKvKernel::load".into()))
                }
                NativeKernelId::Nvfp4(c) => Loaded::Nvfp4(crate::nvfp4::Nvfp4Kernel::load(ctx, c)?),
                NativeKernelId::Nvfp4Quant(c) => Loaded::Nvfp4Quant(crate::nvfp4_quant::Nvfp4Quant::load(ctx, c)?),
                NativeKernelId::Fp8Prepass(c) => Loaded::Fp8Prepass(Fp8Prepass::load(ctx, c)?),
                NativeKernelId::Fp8PrepassPass(v) => {
                    return Err(NativeError::InvalidArgs(format!(
                        "{} is one compiled pass; load the prepass through its config",
                        v.name()
                    )))
                }
                NativeKernelId::Int8PrepassPass(v) => {
                    return Err(NativeError::InvalidArgs(format!(
                        "{} is one compiled pass; load the prepass through its config",
                        v.name()
                    )))
                }
            });
            if let Ok(mut m) = self.loaded.write() {
                m.entry(id).or_insert_with(|| k.clone());
            }
            Ok(k)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_are_unique_and_every_id_has_targets() {
        let all = NativeKernelId::all();
        assert!(all.len() > 20, "{} variants", all.len());
        let mut names: Vec<String> = all.iter().map(|k| KernelVariant::name(k)).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate variant names");
        for k in &all {
            assert!(!k.targets().is_empty(), "{k}");
            assert!(KernelVariant::name(k).starts_with(k.family()), "{k} is not named after its family {}", k.family());
            assert!(!k.expected_instructions(k.targets()[0]).is_empty(), "{k} expects no instruction");
        }
    }

    #[test]
    fn every_family_is_in_the_registry() {
        let all = NativeKernelId::all();
        for family in ["fwd_hmma", "fwd_wgmma", "fwd_int8", "fwd_wgmma_int8", "fwd_int8_umma", "int8_prepass", "fwd_fp8_wgmma", "fwd_mma_fp8", "fwd_decode", "fwd_nvfp4", "nvfp4_quant", "fp8_prepass"] {
            assert!(all.iter().any(|k| k.family() == family), "{family} missing");
        }
    }
}
