//! The kernel registry: every kernel family quattn can dispatch to ([`Family`]), the typed id of
//! a chosen kernel with its resolved configuration ([`KernelId`]), and the ordered dispatch
//! tables the backends plan with.
//!
//! A backend's table is an ordered list of rows `(family, capability test)`. [`Session::plan`]
//! walks it once: the first row whose family the strategy allows and whose test accepts the
//! problem is the plan's kernel; every row passed over leaves its reason in the plan (and in the
//! debug log). Executions reuse the plan's [`KernelId`]: nothing is looked up by name and nothing
//! is re-derived per call.
//!
//! [`Session::plan`]: crate::Session::plan

use std::fmt;

use crate::emulation::Blocking;
use crate::error::{Error, Result};
use crate::problem::{MAX_TENSOR_ELEMS, MAX_TENSOR_ELEMS_32BIT};
use crate::{AttentionProblem, NativeKind, PortableKind, Precision, Strategy};

/// A family of kernels: one source, parameterized by its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// The multi-threaded CPU kernel.
    Cpu,
    /// The CPU emulation of a precision ([`Strategy::Reference`]).
    Emulation,
    /// A portable CubeCL kernel ([`PortableKind`] names the sub-family).
    Portable(PortableKind),
    /// A native kernel ([`NativeKind`] names it).
    Native(NativeKind),
}

impl Family {
    /// Every family, in no particular order (each backend's table orders its own rows).
    pub const ALL: [Family; 20] = [
        Family::Cpu,
        Family::Emulation,
        Family::Portable(PortableKind::Fma),
        Family::Portable(PortableKind::Cmma),
        Family::Portable(PortableKind::Mma),
        Family::Portable(PortableKind::Int8),
        Family::Portable(PortableKind::Fp8),
        Family::Portable(PortableKind::Fp4),
        Family::Portable(PortableKind::Decode),
        Family::Native(NativeKind::Hmma),
        Family::Native(NativeKind::Wgmma),
        Family::Native(NativeKind::Int8Imma),
        Family::Native(NativeKind::Int8Wgmma),
        Family::Native(NativeKind::Int8Umma),
        Family::Native(NativeKind::Fp8Wgmma),
        Family::Native(NativeKind::Fp8Mma),
        Family::Native(NativeKind::HipMfma),
        Family::Native(NativeKind::HipMfmaFp8),
        Family::Native(NativeKind::Decode),
        Family::Native(NativeKind::Nvfp4),
    ];

    /// Whether `strategy` lets dispatch consider this family.
    pub fn allowed_by(self, strategy: Strategy) -> bool {
        match (strategy, self) {
            (Strategy::Reference, f) => f == Family::Emulation,
            (_, Family::Emulation) => false,
            (Strategy::Auto, _) => true,
            (Strategy::Portable, f) => matches!(f, Family::Cpu | Family::Portable(_)),
            (Strategy::PortableFamily(k), f) => f == Family::Portable(k),
            (Strategy::Native(k), f) => f == Family::Native(k),
        }
    }
}

impl Family {
    /// Whether the family implements the score modifiers (window, softcap, sinks, ALiBi,
    /// top-left alignment): the CPU kernels, the portable FMA row (whose test refuses its
    /// packed-f16 kernel), the portable split-KV decode row (on contiguous and paged caches)
    /// and the native wgmma, HMMA and split-KV decode rows (their modifier
    /// variants, which refuse the shapes and accumulation modes they cannot take; the decode
    /// variants on paged caches too, positions measured per sequence). Every other family
    /// refuses a problem that sets one, so that `Strategy::Auto` moves on to one that has them
    /// instead of ignoring them.
    pub fn has_score_modifiers(self) -> bool {
        matches!(
            self,
            Family::Cpu
                | Family::Portable(PortableKind::Fma)
                | Family::Portable(PortableKind::Decode)
                | Family::Native(NativeKind::Wgmma)
                | Family::Native(NativeKind::Hmma)
                | Family::Native(NativeKind::Decode)
        )
    }
}

impl Family {
    /// Whether the family reads K and V through a paged cache's block table ([`crate::paged`]).
    pub fn has_paged_kv(self) -> bool {
        matches!(self, Family::Cpu | Family::Portable(PortableKind::Decode) | Family::Native(NativeKind::Decode))
    }
}

impl Family {
    /// Whether the family takes variable-length (packed) batches ([`crate::varlen`]): the CPU
    /// kernels, the portable FMA row (whose test refuses its packed-f16 kernel) and the native
    /// wgmma and HMMA rows (their varlen variants: f32 accumulation, with or without score
    /// modifiers, each sequence aligned against its own lengths).
    pub fn has_varlen(self) -> bool {
        matches!(self, Family::Cpu | Family::Portable(PortableKind::Fma) | Family::Native(NativeKind::Wgmma) | Family::Native(NativeKind::Hmma))
    }
}

/// The typed refusal of a kernel that does not take variable-length batches, for such a problem.
pub(crate) fn refuse_varlen(problem: &AttentionProblem, kernel: impl fmt::Display) -> Result<()> {
    match &problem.varlen {
        Some(_) => Err(Error::UnsupportedVarLen { kernel: kernel.to_string() }),
        None => Ok(()),
    }
}

/// The typed refusal of a kernel that does not read paged caches, for a paged problem.
pub(crate) fn refuse_paged(problem: &AttentionProblem, kernel: impl fmt::Display) -> Result<()> {
    match &problem.paged {
        Some(_) => Err(Error::UnsupportedPagedKv { kernel: kernel.to_string() }),
        None => Ok(()),
    }
}

impl Family {
    /// The most elements one tensor (Q, K, V or O, strides included) may span on this family:
    /// [`MAX_TENSOR_ELEMS`] (any size memory holds) for the CPU kernels, the CPU emulation and
    /// the native f16/bf16 HMMA and wgmma kernels, whose per-(batch, head) bases and row offsets
    /// are 64-bit (their sequence lengths have a limit of their own, `2^30 - 1`, checked by
    /// their rows); [`MAX_TENSOR_ELEMS_32BIT`] for every other family (the portable CubeCL
    /// kernels index in u32, the native INT8, FP8, NVFP4 and decode families and the HIP kernels
    /// are checked up to 32-bit offsets only). [`walk`] refuses a larger problem with
    /// [`Error::TooLarge`] naming the family, so `Strategy::Auto` moves on to one that takes it.
    pub fn max_tensor_elems(self) -> usize {
        match self {
            Family::Cpu | Family::Emulation | Family::Native(NativeKind::Hmma) | Family::Native(NativeKind::Wgmma) => MAX_TENSOR_ELEMS,
            _ => MAX_TENSOR_ELEMS_32BIT,
        }
    }
}

/// The typed refusal of `family` for a problem one of whose tensors spans more elements than
/// the family indexes ([`Family::max_tensor_elems`]).
pub(crate) fn refuse_size(problem: &AttentionProblem, family: Family) -> Result<()> {
    let (what, n) = problem.largest_tensor();
    let limit = family.max_tensor_elems();
    if n > limit {
        return Err(Error::TooLarge { what, value: n as u128, limit: limit as u128, path: format!("the {family} kernel family") });
    }
    Ok(())
}

/// The typed refusal of a kernel that lacks the problem's first modifier, if it sets any.
pub(crate) fn refuse_modifiers(problem: &AttentionProblem, kernel: impl fmt::Display) -> Result<()> {
    match problem.modifiers().first() {
        Some(&feature) => Err(Error::UnsupportedFeature { feature, kernel: kernel.to_string() }),
        None => Ok(()),
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Family::Cpu => f.write_str("cpu"),
            Family::Emulation => f.write_str("emulation"),
            Family::Portable(k) => write!(f, "portable-{}", k.name()),
            Family::Native(k) => write!(f, "native-{}", k.name()),
        }
    }
}

/// The kernel a plan runs, with everything resolved at plan time.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelId {
    /// The CPU kernel on inputs rounded to `dtype` (P rounded to it too before P·V).
    Cpu { dtype: crate::Dtype, head_dim: usize },
    /// The CPU kernel on FP8 codes with f32 descales (blocks of the plan's blocking).
    CpuFp8 { format: crate::Fp8Format, descale: crate::DescaleGranularity, p: crate::PvFormat, head_dim: usize },
    /// The CPU kernel on 4-bit codes (`precision` an NVFP4 or MXFP4 mode): Q and K codes with
    /// their block scales, V in bf16 or NVFP4 codes along the key axis, in the plan's KV tiles.
    CpuFp4 { precision: Precision, head_dim: usize },
    /// The CPU emulation of `precision`, following this blocking.
    Emulation { precision: Precision, blocking: Blocking },
    /// A portable CubeCL kernel, its tiles chosen; `name` says which for reports.
    Portable { kernel: quattn_cubecl::PortableKernel, name: String },
    /// A native kernel (and, for INT8 plans, its quantization prepass), its variant chosen.
    Native(NativeChoice),
    /// A native HIP kernel (AMD MFMA) and the arch it is compiled for (not run on hardware).
    Hip { kernel: quattn_native::hip::HipKernelId, arch: quattn_native::hip::GfxArch },
}

/// A native kernel with the prepass that feeds it, if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NativeChoice {
    pub kernel: quattn_native::NativeKernelId,
    pub prepass: Option<quattn_native::NativeKernelId>,
    /// Decode plans: how the KV sequence is split across CTAs on this device
    /// ([`quattn_native::decode_split`]); `None` for the other families.
    pub split: Option<quattn_native::DecodeSplit>,
}

impl KernelId {
    /// The family the kernel belongs to.
    pub fn family(&self) -> Family {
        match self {
            KernelId::Cpu { .. } | KernelId::CpuFp8 { .. } | KernelId::CpuFp4 { .. } => Family::Cpu,
            KernelId::Emulation { .. } => Family::Emulation,
            KernelId::Portable { kernel, .. } => Family::Portable(portable_kind(kernel)),
            KernelId::Native(n) => Family::Native(native_kind(&n.kernel)),
            KernelId::Hip { kernel: quattn_native::hip::HipKernelId::Mfma(_), .. } => Family::Native(NativeKind::HipMfma),
            KernelId::Hip { kernel: quattn_native::hip::HipKernelId::MfmaFp8(_), .. } => Family::Native(NativeKind::HipMfmaFp8),
        }
    }

    /// A stable display name (`fwd_{family}_{config}`), for reports and logs only: dispatch never
    /// reads it.
    pub fn name(&self) -> String {
        match self {
            KernelId::Cpu { dtype, head_dim } => format!("fwd_cpu_{dtype}_d{head_dim}"),
            KernelId::CpuFp8 { format, descale, p, head_dim } => {
                format!("fwd_cpu_{}_d{head_dim}", Precision::Fp8 { format: *format, descale: *descale, p: *p }.name())
            }
            KernelId::CpuFp4 { precision, head_dim } => format!("fwd_cpu_{}_d{head_dim}", precision.name()),
            KernelId::Emulation { precision, .. } => format!("emulate_{}", precision.name()),
            KernelId::Portable { name, .. } => name.clone(),
            KernelId::Native(n) => match n.split {
                Some(s) => format!("{}_split{}", n.kernel.name(), s.splits),
                None => n.kernel.name(),
            },
            KernelId::Hip { kernel, arch } => format!("{kernel}_{arch}"),
        }
    }
}

impl fmt::Display for KernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

fn portable_kind(k: &quattn_cubecl::PortableKernel) -> PortableKind {
    use quattn_cubecl::PortableKernel as P;
    match k {
        P::Fma(_) | P::Half(_) => PortableKind::Fma,
        P::Cmma(_) => PortableKind::Cmma,
        P::Mma(_) => PortableKind::Mma,
        P::Int8(_) => PortableKind::Int8,
        P::Fp8(_) => PortableKind::Fp8,
        P::Fp4(_) => PortableKind::Fp4,
        P::Decode(_) => PortableKind::Decode,
    }
}

fn native_kind(k: &quattn_native::NativeKernelId) -> NativeKind {
    use quattn_native::NativeKernelId as N;
    match k {
        N::Hmma(_) => NativeKind::Hmma,
        N::Wgmma(_) => NativeKind::Wgmma,
        N::Int8Imma(_) => NativeKind::Int8Imma,
        N::Int8Wgmma(_) => NativeKind::Int8Wgmma,
        N::Int8Umma(_) => NativeKind::Int8Umma,
        N::Int8Prepass(_) | N::Int8PrepassPass(_) => NativeKind::Int8Imma,
        N::Fp8Wgmma(_) => NativeKind::Fp8Wgmma,
        N::Fp8Mma(_) => NativeKind::Fp8Mma,
        // The FP8 quantization prepass serves both FP8 families; it is never a plan's kernel.
        N::Fp8Prepass(_) | N::Fp8PrepassPass(_) => NativeKind::Fp8Wgmma,
        N::Decode(_) => NativeKind::Decode,
        N::Nvfp4(_) | N::Nvfp4Quant(_) => NativeKind::Nvfp4,
    }
}

/// What a row's capability test returns: the kernel, why it fits, and the blocking the
/// emulation must follow to agree with it (INT8 scale layout, f16 accumulation steps).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Choice {
    pub kernel: KernelId,
    pub blocking: Option<Blocking>,
}

/// Why a row did not take a problem.
#[derive(Debug)]
pub(crate) enum Reject {
    /// The family does not compute this kind of problem at all (another precision, say): a
    /// reason for the log, not the error a caller sees when another row explains better.
    NotApplicable(String),
    /// The family computes this kind of problem but not this one, with the typed error.
    Refused(Error),
}

impl From<Error> for Reject {
    fn from(e: Error) -> Self {
        Reject::Refused(e)
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::NotApplicable(r) => f.write_str(r),
            Reject::Refused(e) => write!(f, "{e}"),
        }
    }
}

/// A row's test: the configuration for the problem, or why not.
pub(crate) type Test<B> = fn(&B, &AttentionProblem, Precision) -> std::result::Result<Choice, Reject>;

/// One row of a dispatch table: a family and the test that resolves its configuration for a
/// problem or says why it does not take it.
pub(crate) struct Row<B: ?Sized> {
    pub family: Family,
    pub test: Test<B>,
}

/// The outcome of walking a table.
pub(crate) struct Planned {
    pub choice: Choice,
    /// The rows passed over, with the reason each gave.
    pub rejected: Vec<(Family, String)>,
}

/// Walks `table` in order for `strategy`: the first allowed row whose test accepts wins; a row
/// whose family lacks the problem's score modifiers ([`refuse_modifiers`]) or cannot index its
/// tensors ([`refuse_size`]) is refused before its test runs. When
/// none does: a forced family's own reason (as [`Error::UnsupportedStrategy`], typed shape
/// errors kept as they are); otherwise the last typed refusal, or, when every row found the
/// problem outside its family, an [`Error::UnsupportedPrecision`] listing why.
pub(crate) fn walk<B>(
    table: &[Row<B>],
    backend: &B,
    device: &str,
    problem: &AttentionProblem,
    precision: Precision,
    strategy: Strategy,
) -> Result<Planned> {
    let mut rejected = Vec::new();
    let mut refused = None;
    let mut allowed = 0;
    for row in table.iter().filter(|r| r.family.allowed_by(strategy)) {
        allowed += 1;
        let kernel = || format!("the {} kernel family", row.family);
        let tested = if row.family.has_score_modifiers() { Ok(()) } else { refuse_modifiers(problem, kernel()) }
            .and_then(|_| if row.family.has_paged_kv() { Ok(()) } else { refuse_paged(problem, kernel()) })
            .and_then(|_| if row.family.has_varlen() { Ok(()) } else { refuse_varlen(problem, kernel()) })
            .and_then(|_| refuse_size(problem, row.family))
            .map_err(Reject::Refused)
            .and_then(|_| (row.test)(backend, problem, precision));
        match tested {
            Ok(choice) => {
                for (family, why) in &rejected {
                    log::debug!("plan on {device}: not {family}: {why}");
                }
                log::debug!("plan on {device}: {} ({})", choice.kernel.name(), row.family);
                return Ok(Planned { choice, rejected });
            }
            Err(r) => {
                rejected.push((row.family, r.to_string()));
                if let Reject::Refused(e) = r {
                    refused = Some(e);
                }
            }
        }
    }
    let forced = matches!(strategy, Strategy::Native(_) | Strategy::PortableFamily(_));
    if allowed == 0 {
        return Err(Error::UnsupportedStrategy {
            strategy,
            device: device.into(),
            reason: format!(
                "no kernel family of this device answers to {} (this device has: {})",
                match strategy {
                    Strategy::PortableFamily(k) => format!("the portable {} family", k.name()),
                    Strategy::Native(k) => format!("the native {} family", k.name()),
                    _ => "it".to_string(),
                },
                table.iter().map(|r| r.family.to_string()).collect::<Vec<_>>().join(", ")
            ),
        });
    }
    let reasons = || rejected.iter().map(|(f, why)| format!("{f}: {why}")).collect::<Vec<_>>().join("; ");
    match refused {
        Some(e) if forced => Err(forced_error(strategy, device, e)),
        Some(e) => Err(e),
        None if forced => Err(Error::UnsupportedStrategy { strategy, device: device.into(), reason: reasons() }),
        None => Err(Error::UnsupportedPrecision { precision, device: device.into(), reason: reasons() }),
    }
}

/// A forced family's refusal as [`Error::UnsupportedStrategy`], keeping typed shape errors as
/// they are (a head dim the family lacks, or a size above its limit, is the same error whoever
/// asks).
fn forced_error(strategy: Strategy, device: &str, e: Error) -> Error {
    match e {
        Error::UnsupportedStrategy { .. }
        | Error::UnsupportedHeadDim { .. }
        | Error::UnsupportedVHeadDim { .. }
        | Error::UnsupportedFeature { .. }
        | Error::UnsupportedPagedKv { .. }
        | Error::UnsupportedVarLen { .. }
        | Error::TooLarge { .. } => e,
        e => Error::UnsupportedStrategy { strategy, device: device.into(), reason: e.to_string() },
    }
}

/// Shorthand for a row that does not apply.
pub(crate) fn not_applicable<T>(reason: impl Into<String>) -> std::result::Result<T, Reject> {
    Err(Reject::NotApplicable(reason.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_allow_exactly_their_families() {
        for f in Family::ALL {
            assert!(!f.allowed_by(Strategy::Reference) || f == Family::Emulation);
            assert_eq!(f.allowed_by(Strategy::Auto), f != Family::Emulation, "{f}");
        }
        assert!(Family::Native(NativeKind::Wgmma).allowed_by(Strategy::Native(NativeKind::Wgmma)));
        assert!(!Family::Native(NativeKind::Hmma).allowed_by(Strategy::Native(NativeKind::Wgmma)));
        assert!(!Family::Native(NativeKind::Hmma).allowed_by(Strategy::Portable));
        assert!(Family::Cpu.allowed_by(Strategy::Portable));
        assert!(!Family::Cpu.allowed_by(Strategy::PortableFamily(PortableKind::Fma)));
    }

    /// A family without modifiers is passed over with a typed refusal naming the modifier
    /// (never run on a problem that has one); `Auto` falls through to one that has them, a
    /// forced family keeps the refusal.
    #[test]
    fn modifiers_pass_over_families_without_them() {
        fn accept(_: &(), p: &AttentionProblem, _: Precision) -> std::result::Result<Choice, Reject> {
            Ok(Choice { kernel: KernelId::Cpu { dtype: crate::Dtype::F32, head_dim: p.head_dim }, blocking: None })
        }
        let only: Vec<Family> = Family::ALL.iter().copied().filter(|f| f.has_score_modifiers()).collect();
        assert_eq!(
            only,
            vec![
                Family::Cpu,
                Family::Portable(PortableKind::Fma),
                Family::Portable(PortableKind::Decode),
                Family::Native(NativeKind::Hmma),
                Family::Native(NativeKind::Wgmma),
                Family::Native(NativeKind::Decode)
            ]
        );
        let table = [Row { family: Family::Native(NativeKind::Int8Imma), test: accept }, Row { family: Family::Cpu, test: accept }];
        let p = AttentionProblem::new(1, 2, 8, 64).softcap(30.0);
        let planned = walk(&table, &(), "test", &p, Precision::F32, Strategy::Auto).unwrap();
        assert_eq!(planned.rejected.len(), 1);
        assert!(planned.rejected[0].1.contains("softcap"), "{}", planned.rejected[0].1);
        match walk(&table, &(), "test", &p, Precision::F32, Strategy::Native(NativeKind::Int8Imma)) {
            Err(Error::UnsupportedFeature { feature: "softcap", kernel }) => assert!(kernel.contains("native-int8-imma"), "{kernel}"),
            other => panic!("{:?}", other.map(|p| p.choice.kernel)),
        }
        // Without a modifier the first row takes it.
        let plain = AttentionProblem::new(1, 2, 8, 64);
        assert!(walk(&table, &(), "test", &plain, Precision::F32, Strategy::Auto).unwrap().rejected.is_empty());
    }

    /// The size gate: the 64-bit families (CPU, native HMMA and wgmma) take tensors above
    /// 2^31 elements, every other family refuses them with `TooLarge` naming itself and its
    /// limit before its test runs, also when forced; a span of exactly 2^31 - 128 elements
    /// passes everywhere.
    #[test]
    fn families_refuse_tensors_beyond_their_offsets() {
        fn accept(_: &(), p: &AttentionProblem, _: Precision) -> std::result::Result<Choice, Reject> {
            Ok(Choice { kernel: KernelId::Cpu { dtype: crate::Dtype::F16, head_dim: p.head_dim }, blocking: None })
        }
        // Q and O: 1 x 32 x 600k x 128 = 2.46e9 elements.
        let big = AttentionProblem::new(1, 32, 600_000, 128).kv_heads(8).kv_len(256);
        assert_eq!(big.largest_tensor(), ("Q elements", 32 * 600_000 * 128));
        // K and V: BSHD, 8 heads x 2.2M keys; Q and O small.
        let big_kv = AttentionProblem::new(1, 32, 128, 128).kv_heads(8).kv_len(2_200_000).layout(crate::Layout::Bshd);
        assert_eq!(big_kv.largest_tensor(), ("K elements", 8 * 2_200_000 * 128));
        let edge = AttentionProblem::new(1, 1, (1 << 24) - 1, 128);
        let over = AttentionProblem::new(1, 1, 1 << 24, 128);
        let wide: Vec<Family> = Family::ALL.iter().copied().filter(|f| f.max_tensor_elems() > MAX_TENSOR_ELEMS_32BIT).collect();
        assert_eq!(wide, vec![Family::Cpu, Family::Emulation, Family::Native(NativeKind::Hmma), Family::Native(NativeKind::Wgmma)]);
        for f in Family::ALL.into_iter().filter(|&f| f != Family::Emulation) {
            let table = [Row { family: f, test: accept }];
            let strategy = match f {
                Family::Native(k) => Strategy::Native(k),
                Family::Portable(k) => Strategy::PortableFamily(k),
                _ => Strategy::Auto,
            };
            for strategy in [Strategy::Auto, strategy] {
                assert!(walk(&table, &(), "test", &edge, Precision::F16_DEFAULT, strategy).is_ok(), "{f}");
                for p in [&big, &big_kv, &over] {
                    match walk(&table, &(), "test", p, Precision::F16_DEFAULT, strategy) {
                        Ok(_) => assert!(wide.contains(&f), "{f} took {} elements", p.largest_tensor().1),
                        Err(Error::TooLarge { what, value, limit, path }) => {
                            assert!(!wide.contains(&f), "{f}");
                            assert_eq!((what, value, limit), (p.largest_tensor().0, p.largest_tensor().1 as u128, i32::MAX as u128));
                            assert!(path.contains(&f.to_string()), "{path}");
                        }
                        Err(e) => panic!("{f}: {e}"),
                    }
                }
            }
        }
        // Auto passes over a 32-bit family to the next row that takes the problem.
        let table = [Row { family: Family::Native(NativeKind::Decode), test: accept }, Row { family: Family::Cpu, test: accept }];
        let planned = walk(&table, &(), "test", &big_kv, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
        assert_eq!(planned.rejected.len(), 1);
        assert!(planned.rejected[0].1.contains("too large for the native-decode kernel family"), "{}", planned.rejected[0].1);
    }

    #[test]
    fn family_names_are_unique() {
        let mut names: Vec<String> = Family::ALL.iter().map(|f| f.to_string()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Family::ALL.len());
    }
}
