//! Selection, once per problem: the portable kernel family and its tiles resolved into a
//! [`PortableKernel`] that a caller keeps (the facade's plan) and launches as often as it likes
//! with [`launch_selected`], which re-derives nothing. The families are tried in one order —
//! manual MMA, cooperative-matrix MMA, the vector FMA kernel, the scalar FMA kernel for layouts
//! the vector kernel cannot read — and each one passed over says why.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::error::LaunchError;
use crate::launch::{
    auto_variant, check_elem_supported, fma_scalar_tiles, fma_vec_tiles, half_tiles, half_split_kv, int8_tiles,
    launch_int8, launch_with, resolve_cmma_tiles, resolve_mma_tiles, variant_unavailable, LaunchInfo, LaunchOptions,
    Variant,
};
use crate::problem::{AttentionArgs, ElemType};
use crate::quant::{Int8Blocking, Int8Operands, Int8Quant};

/// The portable kernel families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortableFamily {
    /// The register-tiled FMA kernel on 4-wide vectors (f32 accumulation); every runtime.
    Fma,
    /// The scalar FMA kernel: any strides (the vector kernel needs 4-aligned ones).
    FmaScalar,
    /// The packed-f16 FMA kernel of the f16-accumulating modes.
    Half,
    /// 16x16x16 cooperative matrices, softmax through shared memory.
    Cmma,
    /// m16n8k16 manual MMA with the softmax in registers (CUDA sm_80+).
    Mma,
    /// The INT8 Q/K kernel after [`crate::quantize_int8`].
    Int8,
}

impl PortableFamily {
    pub const fn name(self) -> &'static str {
        match self {
            PortableFamily::Fma => "fma_vec",
            PortableFamily::FmaScalar => "fma",
            PortableFamily::Half => "fma_half",
            PortableFamily::Cmma => "cmma",
            PortableFamily::Mma => "mma",
            PortableFamily::Int8 => "fma_vec_int8",
        }
    }
}

/// A portable kernel resolved for one problem on one runtime: the family and launch options
/// with every choice pinned (variant, tiles, K/V stages, accumulation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PortableKernel {
    pub family: PortableFamily,
    pub options: LaunchOptions,
    /// The query block and KV tile (and warps of 16 rows) the kernel steps through: the
    /// blocking its INT8 scales and per-tile f16 folds follow.
    pub blocking: Int8Blocking,
}

impl PortableKernel {
    /// `{family}_{tiles}` for logs and reports.
    pub fn name(&self) -> String {
        let o = &self.options;
        let tiles = match self.family {
            PortableFamily::Fma | PortableFamily::Half | PortableFamily::Int8 => o.fma_vec_tiles.map(|t| t.to_string()),
            PortableFamily::FmaScalar => o.fma_tiles.map(|t| format!("bq{}_bk{}", t.bq, t.bk)),
            PortableFamily::Cmma => o.cmma_tiles.map(|t| format!("bq{}_bk{}", t.bq(), t.bk)),
            PortableFamily::Mma => o.mma_tiles.map(|t| t.to_string()),
        };
        format!("{}_{}", self.family.name(), tiles.unwrap_or_default())
    }
}

/// What to select: the element type of Q, K, V and O, the caller's options (a forced
/// [`Variant`], the accumulation, pinned tiles), and whether Q/K are INT8.
#[derive(Debug, Clone, Copy)]
pub struct Selection {
    pub elem: ElemType,
    pub options: LaunchOptions,
    pub int8: bool,
}

/// The kernel [`launch_selected`] will run for `args`, every choice made here. A forced variant
/// that cannot run is a [`LaunchError::VariantUnavailable`] naming why.
pub fn select<R: Runtime>(client: &ComputeClient<R>, args: &AttentionArgs, want: &Selection) -> Result<PortableKernel, LaunchError> {
    args.validate()?;
    let elem = want.elem;
    let mut options = want.options;
    let blocking_of = |bq: u32, bk: u32| Int8Blocking { block_q: bq, block_k: bk, warps: (bq / 16).max(1) };
    if want.int8 {
        let tiles = int8_tiles(client, args, elem, &options)?;
        options.fma_vec_tiles = Some(tiles);
        options.variant = Variant::PortableFma;
        return Ok(PortableKernel { family: PortableFamily::Int8, options, blocking: blocking_of(tiles.bq, tiles.bk) });
    }
    check_elem_supported(client, elem)?;
    if !options.accumulation.is_f32() {
        let tiles = half_tiles(client, args, elem, &options)?;
        let hw = &client.properties().hardware;
        options.split_kv = Some(half_split_kv(&tiles, args.head_dim, args.v_head_dim, &options, hw.max_shared_memory_size));
        options.fma_vec_tiles = Some(tiles);
        options.variant = Variant::PortableFma;
        return Ok(PortableKernel { family: PortableFamily::Half, options, blocking: blocking_of(tiles.bq, tiles.bk) });
    }
    let variant = match options.variant {
        Variant::Auto => {
            let (v, why) = auto_variant(client, args, elem, &options);
            if let Some(why) = why {
                log::debug!("portable {} kernel: {why}", v.name());
            }
            v
        }
        forced => {
            if let Some(reason) = variant_unavailable(client, args, elem, &options) {
                return Err(LaunchError::VariantUnavailable { variant: forced.name(), reason });
            }
            forced
        }
    };
    options.variant = variant;
    match variant {
        Variant::Mma => {
            let t = resolve_mma_tiles(client, args, elem, &options)?;
            options.mma_tiles = Some(t);
            Ok(PortableKernel { family: PortableFamily::Mma, options, blocking: blocking_of(t.bq(), t.bk) })
        }
        Variant::Cmma => {
            let t = resolve_cmma_tiles(client, args, elem, &options)?;
            options.cmma_tiles = Some(t);
            Ok(PortableKernel { family: PortableFamily::Cmma, options, blocking: blocking_of(t.bq(), t.bk) })
        }
        Variant::PortableFmaScalar => scalar(client, args, elem, options),
        Variant::Auto | Variant::PortableFma => match fma_vec_tiles(client, args, elem, &options) {
            Ok(t) => {
                options.fma_vec_tiles = Some(t);
                options.variant = Variant::PortableFma;
                Ok(PortableKernel { family: PortableFamily::Fma, options, blocking: blocking_of(t.bq, t.bk) })
            }
            Err(reason) if options.fma_vec_tiles.is_none() => {
                log::debug!("vector FMA kernel not used: {reason}");
                scalar(client, args, elem, options)
            }
            Err(reason) => Err(LaunchError::VariantUnavailable { variant: "portable_fma_vec", reason }),
        },
    }
}

fn scalar<R: Runtime>(client: &ComputeClient<R>, args: &AttentionArgs, elem: ElemType, mut options: LaunchOptions) -> Result<PortableKernel, LaunchError> {
    let t = fma_scalar_tiles(client, args, elem, &options)?;
    options.fma_tiles = Some(t);
    options.variant = Variant::PortableFmaScalar;
    Ok(PortableKernel { family: PortableFamily::FmaScalar, options, blocking: Int8Blocking { block_q: t.bq, block_k: t.bk, warps: 1 } })
}

/// Launches `kernel` (from [`select`] for these `args` and `elem`) on the buffers; checks the
/// buffers against the arguments, re-selects nothing.
#[allow(clippy::too_many_arguments)]
pub fn launch_selected<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    args: &AttentionArgs,
    elem: ElemType,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    if kernel.family == PortableFamily::Int8 {
        return Err(LaunchError::VariantUnavailable {
            variant: "portable_fma_vec_int8",
            reason: "INT8 plans launch through launch_selected_int8 with their quantized operands".into(),
        });
    }
    launch_with(client, args, elem, &kernel.options, q, k, v, o, lse)
}

/// Launches an INT8 `kernel` (from [`select`] with `int8`) on the prepass's operands.
#[allow(clippy::too_many_arguments)]
pub fn launch_selected_int8<R: Runtime>(
    client: &ComputeClient<R>,
    kernel: &PortableKernel,
    args: &AttentionArgs,
    v_elem: ElemType,
    quant: &Int8Quant,
    ops: &Int8Operands,
    v: &Handle,
    o: &Handle,
    lse: Option<&Handle>,
) -> Result<LaunchInfo, LaunchError> {
    launch_int8(client, args, v_elem, &kernel.options, quant, ops, v, o, lse)
}
