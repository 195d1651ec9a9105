//! Score modifiers of the native f16/bf16 kernels (`MODS` variants of `fwd_wgmma.cu`,
//! `fwd_hmma.cu` and `fwd_decode.cu`): the variant key, the kernel's parameter block and its
//! validation.

use crate::error::{NativeError, Result};
use crate::varlen::VarlenShape;
use quattn_core::AttentionShape;

/// The score-modifier variant of a kernel (`MODS = 1`, see `common.cuh` and the headers of
/// `fwd_wgmma.cu`, `fwd_hmma.cu` and `fwd_decode.cu`): the band mask (sliding window, causal
/// and its alignment, with tile skipping) and attention sinks always; softcap and ALiBi
/// compiled in only where asked, since they cost work on every score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ModVariant {
    pub softcap: bool,
    pub alibi: bool,
}

impl ModVariant {
    /// `_mods`, `_mods_softcap`, `_mods_alibi`, `_mods_softcap_alibi`.
    pub fn suffix(&self) -> String {
        let mut s = String::from("_mods");
        if self.softcap {
            s.push_str("_softcap");
        }
        if self.alibi {
            s.push_str("_alibi");
        }
        s
    }

    /// The `-D` defines of the variant.
    pub fn defines(&self) -> Vec<(String, String)> {
        let d = |k: &str, v: bool| (k.to_string(), (v as u32).to_string());
        vec![d("MODS", true), d("MOD_SOFTCAP", self.softcap), d("MOD_ALIBI", self.alibi)]
    }
}

/// Window extents at or above this are unbounded (`MOD_UNBOUNDED` of the kernel); sequence
/// lengths of a modifier launch stay below it so that `a(i) ± extent + 1` fits an `int`.
pub const MOD_UNBOUNDED: i32 = 1 << 29;
/// Q heads a modifier launch takes: its per-head ALiBi slopes and sinks travel in the kernel's
/// parameter block (`MOD_MAX_HEADS`).
pub const MOD_MAX_HEADS: usize = 128;

/// The extra kernel argument of a [`ModVariant`], the C layout of `ModParams` (common.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModParams {
    /// `a(i) = i + offset`: `kv_len - q_len` (bottom-right) or 0 (top-left). Dense launches
    /// only: the varlen variants compute it per sequence from `top_left`.
    pub offset: i32,
    /// Window extents; causal is `right = 0`; [`MOD_UNBOUNDED`]: no bound.
    pub left: i32,
    pub right: i32,
    /// 1: top-left (`offset` is 0 at any length), 0: bottom-right (`offset` is `kv_len -
    /// q_len`, which a kernel whose sequences have lengths of their own measures per sequence).
    pub top_left: i32,
    /// `softcap / scale` and its inverse (raw score units); 0 without a softcap.
    pub cap_raw: f32,
    pub inv_cap_raw: f32,
    /// `slope / scale` per Q head.
    pub alibi_raw: [f32; MOD_MAX_HEADS],
    /// `sink · log2(e)` per Q head; `-inf` where there is no sink.
    pub sink_log2: [f32; MOD_MAX_HEADS],
}

/// The score modifiers of one launch, as the problem states them (natural-log, scaled-logit
/// units), for [`ModParams::new`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ModValues<'a> {
    /// Row alignment: `true` is top-left (`a(i) = i`), `false` bottom-right.
    pub top_left: bool,
    /// Window extents; `None` on a side is unbounded.
    pub left: Option<u64>,
    pub right: Option<u64>,
    pub softcap: Option<f32>,
    pub alibi_slopes: Option<&'a [f32]>,
    pub sinks: Option<&'a [f32]>,
}

impl ModParams {
    /// Validates the modifiers against the launch shape and the variant `mods` of kernel `name`
    /// and converts them to the kernel's units (`args.scale` is the softmax scale).
    pub fn new(name: &str, mods: Option<ModVariant>, args: &AttentionShape, m: &ModValues) -> Result<Self> {
        fn bad<T>(reason: String) -> Result<T> {
            Err(NativeError::InvalidArgs(reason))
        }
        let Some(mods) = mods else {
            return bad(format!("{name} takes no score modifiers"));
        };
        if args.q_len >= MOD_UNBOUNDED as usize || args.kv_len >= MOD_UNBOUNDED as usize {
            return bad(format!("sequence lengths {} and {} must stay below 2^29 with score modifiers", args.q_len, args.kv_len));
        }
        if args.q_heads > MOD_MAX_HEADS {
            return bad(format!("{} query heads; score modifiers take at most {MOD_MAX_HEADS}", args.q_heads));
        }
        let scale = args.scale;
        if !(scale.is_finite() && scale > 0.0) {
            return bad(format!("softmax scale {scale} must be finite and positive"));
        }
        let extent = |x: Option<u64>| x.map_or(MOD_UNBOUNDED, |v| v.min(MOD_UNBOUNDED as u64) as i32);
        let mut right = extent(m.right);
        if args.causal {
            right = right.min(0);
        }
        let mut p = ModParams {
            offset: if m.top_left { 0 } else { args.kv_len as i32 - args.q_len as i32 },
            left: extent(m.left),
            right,
            top_left: m.top_left as i32,
            cap_raw: 0.0,
            inv_cap_raw: 0.0,
            alibi_raw: [0.0; MOD_MAX_HEADS],
            sink_log2: [f32::NEG_INFINITY; MOD_MAX_HEADS],
        };
        match (m.softcap, mods.softcap) {
            (Some(cap), true) if cap.is_finite() && cap > 0.0 => {
                p.cap_raw = cap / scale;
                p.inv_cap_raw = scale / cap;
            }
            (Some(cap), true) => return bad(format!("softcap {cap} must be finite and positive")),
            (None, false) => {}
            (c, _) => return bad(format!("softcap {c:?} does not match the variant {name}")),
        }
        let per_head = |what: &str, a: &[f32]| -> Result<()> {
            if a.len() != args.q_heads || a.iter().any(|x| x.is_nan()) {
                return bad(format!("{what}: {} values for {} query heads (one each, not NaN)", a.len(), args.q_heads));
            }
            Ok(())
        };
        match (m.alibi_slopes, mods.alibi) {
            (Some(a), true) => {
                per_head("ALiBi slopes", a)?;
                if a.iter().any(|x| !x.is_finite()) {
                    return bad("ALiBi slopes must be finite".into());
                }
                for (d, x) in p.alibi_raw.iter_mut().zip(a) {
                    *d = x / scale;
                }
            }
            (None, false) => {}
            (a, _) => return bad(format!("ALiBi {} does not match the variant {name}", a.is_some())),
        }
        if let Some(sk) = m.sinks {
            per_head("sinks", sk)?;
            if sk.iter().any(|x| *x == f32::INFINITY) {
                return bad("a sink of +inf takes all the mass; sinks must be below +inf".into());
            }
            for (d, x) in p.sink_log2.iter_mut().zip(sk) {
                *d = x * std::f32::consts::LOG2_E;
            }
        }
        Ok(p)
    }

    /// As [`Self::new`] for a variable-length launch: the checks take the longest sequences'
    /// lengths, and `offset` is 0 since the varlen variants align each sequence against its
    /// own lengths (`top_left`).
    pub fn for_varlen(name: &str, mods: Option<ModVariant>, args: &VarlenShape, m: &ModValues) -> Result<Self> {
        Ok(ModParams { offset: 0, ..Self::new(name, mods, &args.dense_view(), m)? })
    }
}

#[cfg(feature = "cuda")]
// SAFETY: `#[repr(C)]` plain data matching `ModParams` of common.cuh.
unsafe impl cudarc::driver::DeviceRepr for ModParams {}
