//! Seeded differential testing of the public API: random problems, precisions, strategies and
//! inputs ([`Generator`]), each planned and run on a [`Session`] and judged ([`run_case`]):
//!
//! * the plan: a problem that [`AttentionProblem::validate`] or [`Precision::validate`] refuses
//!   must be refused with that same error on every backend and strategy; any other refusal must
//!   be a capability error ([`Error::UnsupportedHeadDim`], [`Error::UnsupportedPrecision`], ...),
//!   never a failure after `plan` accepted;
//! * the output against the f64 [`reference`] with [`Tolerance::for_precision`] (O: rel-L2,
//!   cosine, max-abs; LSE: max-abs, infinities exactly), and for the quantized and
//!   f16-accumulating modes against the CPU [`emulation`] of the mode with the plan's blocking
//!   (where the emulation itself is farther from the reference than the per-precision bound,
//!   the input's own rounding error, plus 10%, bounds the kernel instead, for O and LSE);
//! * the [NaN policy](crate::nonfinite): rows that see a NaN or ±inf are NaN, the others are
//!   judged as above on inputs where those values are 0; rows that see no key are `O = 0`,
//!   `LSE = -inf` exactly.
//!
//! A case is a pure function of `(seed, index)` and the device's [`Profile`], so a failure
//! replays from the two numbers ([`SEED_ENV`], [`CASE_ENV`]).
//!
//! The generator keeps each precision inside the regime its tolerance is stated for (unit
//! normal inputs with outliers, scores of order one): huge or tiny Q and K come with the
//! softmax scale that keeps the scores' magnitude (`scale / c²` for Q and K times `c`), V may
//! be scaled freely where P·V accumulates in f32, and the f16-accumulating modes keep unit
//! magnitudes. Inputs that leave that regime on purpose (overflow, non-finite scores) are the
//! NaN-policy tests' business.

pub mod policy;

use std::collections::BTreeMap;
use std::fmt;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::emulation;
use crate::error::{Error, Result};
use crate::metrics::{compare_lse, ErrorMetrics, Tolerance};
use crate::problem::{Strides, TensorStrides};
use crate::reference;
use crate::{AttentionProblem, Dtype, Family, Layout, Precision, PvAccum, QkAccum, Session, Strategy, TensorName};

/// The seed every run starts with; a rotating one ([`rotating_seed`]) adds new cases each run.
pub const FIXED_SEED: u64 = 0x5eed_0f_a77e_4710;
/// Environment variable that replays one seed (decimal or `0x` hex) instead of the usual seeds.
pub const SEED_ENV: &str = "QUATTN_FUZZ_SEED";
/// Environment variable that, with [`SEED_ENV`], replays a single case index.
pub const CASE_ENV: &str = "QUATTN_FUZZ_CASE";

/// Head dims the generator draws from: the ones kernels have tiles for and some they have not
/// (those test the refusals).
pub const HEAD_DIMS: [usize; 15] = [8, 16, 24, 32, 40, 48, 64, 72, 80, 96, 112, 128, 160, 192, 256];

/// What a session offers, as found by planning a small probe problem: the generator draws from
/// it, so most cases run and a few test refusals.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The session's kind (`cpu`, `wgpu`, `cuda`).
    pub device: String,
    /// Precisions that plan with [`Strategy::Auto`].
    pub precisions: Vec<Precision>,
    /// `Auto`, every family of the registry that plans some precision, and `Reference`.
    pub strategies: Vec<Strategy>,
    /// Head dims of [`HEAD_DIMS`] that plan in some precision.
    pub head_dims: Vec<usize>,
    /// Longest query or key sequence (the 600 by default).
    pub max_len: usize,
    /// Bound on `batch · q_heads · q_len · kv_len · (head_dim + v_head_dim)`, the cost of the f64
    /// reference: lengths, heads and batch shrink until a case fits.
    pub max_work: f64,
    /// Draw each seed's cases from this many kernel configurations (precision, strategy, head
    /// dims, causal, LSE: what a compiled kernel is specialized on) instead of from all of them:
    /// where compiling dominates (llvmpipe takes 2 to 12 s per kernel), the sizes, strides,
    /// scales and data still vary case by case and the configurations change with the seed.
    pub palette: Option<usize>,
    /// The `(strategy, precision, head dim)` triples of the profile that plan the probe problem
    /// (at that head dim): a palette's configurations come from these but for one, so that a
    /// seed's few kernels mostly run instead of testing refusals.
    pub plans: Vec<(Strategy, Precision, usize)>,
}

impl Profile {
    /// Probes `session` by planning (nothing runs).
    pub fn probe(session: &Session) -> Profile {
        let probe = |d: usize| AttentionProblem::new(1, 2, 8, d).kv_len(24);
        let precisions: Vec<Precision> =
            Precision::all_named().into_iter().filter(|&p| session.plan(&probe(64), p, Strategy::Auto).is_ok()).collect();
        // Each strategy with the precisions it plans at head dim 64.
        let mut planned: Vec<(Strategy, Vec<Precision>)> = vec![(Strategy::Auto, precisions.clone())];
        for f in Family::ALL {
            let s = match f {
                Family::Native(k) => Strategy::Native(k),
                Family::Portable(k) => Strategy::PortableFamily(k),
                Family::Cpu | Family::Emulation => continue,
            };
            let ps: Vec<Precision> = Precision::all_named().into_iter().filter(|&p| session.plan(&probe(64), p, s).is_ok()).collect();
            if !ps.is_empty() {
                planned.push((s, ps));
            }
        }
        let mut strategies: Vec<Strategy> = planned.iter().map(|(s, _)| *s).collect();
        strategies.push(Strategy::Reference);
        let head_dims: Vec<usize> = HEAD_DIMS
            .into_iter()
            .filter(|&d| precisions.iter().any(|&p| session.plan(&probe(d), p, Strategy::Auto).is_ok()))
            .collect();
        // The (strategy, precision, head dim) triples that plan, from the pairs that plan at 64
        // (planning a portable kernel sizes its tiles, which costs: the full product is ten
        // times the work).
        let mut plans = Vec::new();
        for (s, ps) in &planned {
            for &p in ps {
                for &d in &head_dims {
                    if d == 64 || session.plan(&probe(d), p, *s).is_ok() {
                        plans.push((*s, p, d));
                    }
                }
            }
        }
        Profile {
            device: session.info().kind.to_string(),
            precisions,
            strategies,
            head_dims,
            max_len: 600,
            max_work: 2.0e7,
            palette: None,
            plans,
        }
    }

    /// The same profile with another size budget.
    pub fn with_budget(mut self, max_len: usize, max_work: f64) -> Profile {
        self.max_len = max_len.max(1);
        self.max_work = max_work;
        self
    }

    /// The same profile drawing each seed's cases from `n` kernel configurations.
    pub fn with_palette(mut self, n: usize) -> Profile {
        self.palette = Some(n.max(1));
        self
    }

    /// The same profile without the head dims above `max` (their kernels are the slowest to
    /// compile).
    pub fn max_head_dim(mut self, max: usize) -> Profile {
        self.head_dims.retain(|&d| d <= max);
        self.plans.retain(|&(_, _, d)| d <= max);
        self
    }
}

/// What a compiled kernel is specialized on: the part of a case a palette fixes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Config {
    precision: Precision,
    strategy: Strategy,
    head_dim: usize,
    v_head_dim: usize,
    causal: bool,
    lse: bool,
}

/// A NaN or infinity planted in one element of Q, K or V.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    pub tensor: TensorName,
    /// (batch, head, position) of the row, in the tensor's own heads and length.
    pub row: (usize, usize, usize),
    pub channel: usize,
    pub value: f32,
}

/// How a case's inputs are drawn: unit normal values with sparse ±8σ outliers
/// ([`crate::inputs::normal_with_outliers`]), then:
#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    /// Q and K are multiplied by this (the scale is divided by its square, keeping the scores).
    pub qk_magnitude: f32,
    /// V is multiplied by this.
    pub v_magnitude: f32,
    /// Some rows of each tensor set to exactly 0.
    pub zero_rows: bool,
    /// Some rows replaced by the negation of the row before them.
    pub sign_flips: bool,
    /// One tensor all zero.
    pub zero_tensor: Option<TensorName>,
    /// Planted NaN / ±inf values.
    pub non_finite: Vec<NonFinite>,
}

/// One generated case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub seed: u64,
    pub index: u64,
    pub problem: AttentionProblem,
    pub precision: Precision,
    pub strategy: Strategy,
    /// The element type of the host slices handed to [`Session::run`].
    pub host: Dtype,
    pub data: Data,
}

/// Q, K, V of a case as the kernel receives them (rounded to the host type and the precision's
/// input type), widened to f32, in the problem's strides; elements outside a strided view are
/// NaN (a kernel or screen that reads them shows it).
#[derive(Debug, Clone)]
pub struct Inputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// SplitMix64's finalizer: independent streams from `(seed, index)`.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn stream(seed: u64, index: u64, salt: u64) -> StdRng {
    StdRng::seed_from_u64(mix(seed ^ mix(index ^ mix(salt))))
}

/// A seed that changes every run (the clock), for the rotating part of a fuzz budget.
pub fn rotating_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    mix(nanos ^ u64::from(std::process::id()))
}

/// The replay request in the environment: `(seed, Some(index))` for one case, `(seed, None)`
/// for a seed's whole budget; `None` when [`SEED_ENV`] is unset; `Err` naming the variable when
/// a value does not parse.
pub fn replay_from_env() -> std::result::Result<Option<(u64, Option<u64>)>, String> {
    let parse = |name: &str, s: &str| -> std::result::Result<u64, String> {
        let s = s.trim();
        let r = match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => s.parse(),
        };
        r.map_err(|e| format!("{name}={s}: {e}"))
    };
    let Ok(seed) = std::env::var(SEED_ENV) else { return Ok(None) };
    let seed = parse(SEED_ENV, &seed)?;
    let case = match std::env::var(CASE_ENV) {
        Ok(c) => Some(parse(CASE_ENV, &c)?),
        Err(_) => None,
    };
    Ok(Some((seed, case)))
}

/// Draws cases for one device profile.
#[derive(Debug, Clone)]
pub struct Generator {
    pub seed: u64,
    pub profile: Profile,
}

/// How wide a precision's accumulation is, which sets how far the generator may scale inputs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Regime {
    /// f32 scores and P·V accumulation on float inputs: any magnitude within range.
    Wide,
    /// f16 accumulation of Q·Kᵀ or P·V: unit magnitudes only.
    Half,
    /// Quantized Q/K (and V): scale-invariant codes, scores kept of order one.
    Quantized,
}

fn regime(p: Precision) -> Regime {
    match p {
        Precision::F32 | Precision::F16 { qk: QkAccum::F32, pv: PvAccum::F32 } | Precision::Bf16 { .. } => Regime::Wide,
        Precision::F16 { .. } => Regime::Half,
        _ => Regime::Quantized,
    }
}

fn pick<T: Copy>(rng: &mut StdRng, xs: &[T], fallback: T) -> T {
    if xs.is_empty() {
        fallback
    } else {
        xs[rng.random_range(0..xs.len())]
    }
}

/// A sequence length in `1..=max`: mostly short, some long (log-uniform-ish classes).
fn length(rng: &mut StdRng, max: usize) -> usize {
    let hi = match rng.random_range(0..100) {
        0..25 => 8,
        25..60 => 64,
        60..85 => 256,
        _ => max,
    }
    .min(max);
    rng.random_range(1..=hi.max(1))
}

/// Strides of a `[batch, heads, seq, dim]` view: the three outer axes in a random order, each
/// padded; `align` keeps every stride a multiple of it (the vector kernels need 4 or 8).
fn random_strides(rng: &mut StdRng, batch: usize, heads: usize, seq: usize, dim: usize, align: usize, share_batch: bool) -> Strides {
    let mut order = [0usize, 1, 2]; // 0 batch, 1 head, 2 seq; innermost first after shuffling
    for i in (1..3).rev() {
        let j = rng.random_range(0..=i);
        order.swap(i, j);
    }
    let sizes = [batch, heads, seq];
    let pad = |rng: &mut StdRng| if rng.random_bool(0.5) { 0 } else { align * rng.random_range(1..=3usize) };
    let mut strides = [0usize; 3];
    let mut span = dim.next_multiple_of(align) + pad(rng);
    for &axis in &order {
        strides[axis] = span;
        span = span * sizes[axis] + pad(rng);
    }
    if share_batch {
        strides[0] = 0;
    }
    Strides { batch: strides[0], head: strides[1], seq: strides[2] }
}

impl Generator {
    pub fn new(seed: u64, profile: Profile) -> Generator {
        Generator { seed, profile }
    }

    /// A kernel configuration drawn from the profile.
    fn config(&self, rng: &mut StdRng) -> Config {
        let prof = &self.profile;
        let strategy = match rng.random_range(0..100) {
            0..60 => Strategy::Auto,
            60..95 => pick(rng, &prof.strategies, Strategy::Auto),
            _ => Strategy::Reference,
        };
        // The emulation computes every mode; a device most of the modes it plans.
        let precision = if strategy == Strategy::Reference || !rng.random_bool(0.92) {
            pick(rng, &Precision::all_named(), Precision::F32)
        } else {
            pick(rng, &prof.precisions, Precision::F32)
        };
        let head_dim = if rng.random_bool(0.9) { pick(rng, &prof.head_dims, 64) } else { pick(rng, &HEAD_DIMS, 64) };
        let v_head_dim = if rng.random_bool(0.85) { head_dim } else { pick(rng, &prof.head_dims, head_dim) };
        Config { precision, strategy, head_dim, v_head_dim, causal: rng.random_bool(0.5), lse: rng.random_bool(0.75) }
    }

    /// A configuration the profile found to plan, drawn as [`Generator::config`] draws (the
    /// last draw where 64 found none).
    fn planned_config(&self, rng: &mut StdRng) -> Config {
        let prof = &self.profile;
        let plans = |c: &Config| {
            c.strategy == Strategy::Reference
                || (prof.head_dims.contains(&c.v_head_dim) && prof.plans.contains(&(c.strategy, c.precision, c.head_dim)))
        };
        let mut c = self.config(rng);
        for _ in 0..64 {
            if plans(&c) {
                break;
            }
            c = self.config(rng);
        }
        c
    }

    /// Case `index` of this seed (independent of every other index but for the seed's palette).
    pub fn case(&self, index: u64) -> Case {
        let prof = &self.profile;
        let mut rng = stream(self.seed, index, 1);
        let config = match prof.palette {
            Some(n) => {
                let n = n.max(1);
                let mut palette_rng = stream(self.seed, 0, 3);
                // All but the last configuration plan (where the profile has such), the last is
                // drawn freely and may test a refusal.
                let palette: Vec<Config> = (0..n)
                    .map(|i| if i + 1 < n || n == 1 { self.planned_config(&mut palette_rng) } else { self.config(&mut palette_rng) })
                    .collect();
                palette[rng.random_range(0..palette.len())]
            }
            None => self.config(&mut rng),
        };
        let Config { precision, strategy, head_dim, v_head_dim, causal, lse } = config;
        let kv_heads = pick(&mut rng, &[1usize, 1, 2, 3, 4], 1);
        let group = pick(&mut rng, &[1usize, 1, 2, 3, 4, 8], 1);
        let mut batch = pick(&mut rng, &[1usize, 1, 1, 2, 3], 1);
        let mut q_heads = kv_heads * group;
        let mut q_len = length(&mut rng, prof.max_len);
        let mut kv_len = match rng.random_range(0..100) {
            0..15 => q_len,
            _ => length(&mut rng, prof.max_len),
        };
        if rng.random_bool(0.15) {
            q_len = 1; // decode
        }
        // Fit the work bound: batch first, then heads (keeping the GQA ratio), then lengths.
        let work = |b: usize, h: usize, q: usize, k: usize| (b * h * q * k * (head_dim + v_head_dim)) as f64;
        while work(batch, q_heads, q_len, kv_len) > prof.max_work {
            if batch > 1 {
                batch -= 1;
            } else if q_heads > kv_heads && q_heads / kv_heads > 1 {
                q_heads = kv_heads * (q_heads / kv_heads / 2).max(1);
            } else if q_len.max(kv_len) > 1 {
                if q_len >= kv_len {
                    q_len = (q_len * 7 / 10).max(1);
                } else {
                    kv_len = (kv_len * 7 / 10).max(1);
                }
            } else {
                break;
            }
        }
        let layout = if rng.random_bool(0.5) { Layout::Bhsd } else { Layout::Bshd };
        let mut problem = AttentionProblem::new(batch, q_heads, q_len, head_dim)
            .kv_heads(kv_heads)
            .kv_len(kv_len)
            .v_head_dim(v_head_dim)
            .causal(causal)
            .layout(layout)
            .with_lse(lse);
        if rng.random_bool(0.2) {
            // Vector kernels read 4 or 8 elements at a time; a few unaligned views test refusals.
            let align = if rng.random_bool(0.9) { 8 } else { 1 };
            let share = batch > 1 && rng.random_bool(0.3);
            let mut st = |heads, len, dim, shared| random_strides(&mut rng, batch, heads, len, dim, align, shared);
            let strides = TensorStrides {
                q: st(q_heads, q_len, head_dim, false),
                k: st(kv_heads, kv_len, head_dim, share),
                v: st(kv_heads, kv_len, v_head_dim, share),
                o: st(q_heads, q_len, v_head_dim, false),
            };
            problem = problem.strides(strides);
        }

        let reg = regime(precision);
        let default_scale = 1.0 / (head_dim as f32).sqrt();
        let qk_magnitude = match reg {
            Regime::Half => 1.0,
            _ if rng.random_bool(0.25) => 10f32.powf(rng.random_range(-1.0f32..2.0)),
            _ => 1.0,
        };
        let v_magnitude = match reg {
            Regime::Half => 1.0,
            Regime::Wide if rng.random_bool(0.25) => 10f32.powf(rng.random_range(-3.0f32..3.0)),
            Regime::Quantized if rng.random_bool(0.25) => 10f32.powf(rng.random_range(-2.0f32..2.0)),
            _ => 1.0,
        };
        let factor = match reg {
            Regime::Wide if rng.random_bool(0.4) => 2f32.powf(rng.random_range(-2.0f32..2.0)),
            Regime::Quantized if rng.random_bool(0.4) => rng.random_range(0.5f32..1.0),
            _ => 1.0,
        };
        let scale = default_scale * factor / (qk_magnitude * qk_magnitude);
        if qk_magnitude != 1.0 || factor != 1.0 || rng.random_bool(0.2) {
            problem = problem.scale(scale);
        }

        // Problems no backend may accept: every plan must give validate's own error.
        match rng.random_range(0..100) {
            0..6 => problem = problem.scale(pick(&mut rng, &[0.0f32, -0.0, -scale, -1.0], -1.0)),
            6..8 => problem = problem.scale(pick(&mut rng, &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY], f32::NAN)),
            8..10 if q_heads > 1 => problem = problem.kv_heads(q_heads + 1),
            10..11 => match rng.random_range(0..4) {
                0 => problem.batch = 0,
                1 => problem.q_len = 0,
                2 => problem.kv_len = 0,
                _ => problem.head_dim = 0,
            },
            _ => {}
        }

        let host = match precision.input_dtype() {
            _ if rng.random_bool(0.65) => Dtype::F32,
            Dtype::F32 => pick(&mut rng, &[Dtype::F16, Dtype::Bf16], Dtype::F16),
            d => d,
        };

        let mut non_finite = Vec::new();
        if rng.random_bool(0.06) {
            for _ in 0..rng.random_range(1..=2) {
                let tensor = pick(&mut rng, &[TensorName::Q, TensorName::K, TensorName::V], TensorName::K);
                let (heads, len, dim) = match tensor {
                    TensorName::Q => (q_heads, q_len, head_dim),
                    TensorName::K => (kv_heads, kv_len, head_dim),
                    _ => (kv_heads, kv_len, v_head_dim),
                };
                non_finite.push(NonFinite {
                    tensor,
                    row: (rng.random_range(0..batch), rng.random_range(0..heads), rng.random_range(0..len)),
                    channel: rng.random_range(0..dim),
                    value: pick(&mut rng, &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY], f32::NAN),
                });
            }
        }
        let data = Data {
            qk_magnitude,
            v_magnitude,
            zero_rows: rng.random_bool(0.2),
            sign_flips: rng.random_bool(0.2),
            zero_tensor: if rng.random_bool(0.03) {
                Some(pick(&mut rng, &[TensorName::Q, TensorName::K, TensorName::V], TensorName::V))
            } else {
                None
            },
            non_finite,
        };
        // Score modifiers on a fraction of the float cases, from their own stream so that the
        // draws above (and the cases old seeds replay) stay as they were. The emulations do not
        // model modifiers, so the modes judged against them never get one.
        let mut mods_rng = stream(self.seed, index, 4);
        if reg == Regime::Wide && mods_rng.random_bool(0.15) {
            problem = draw_modifiers(&mut mods_rng, problem);
        } else if mods_rng.random_bool(0.01) {
            // Invalid parameters: every plan must give validate's own error.
            problem = match mods_rng.random_range(0..4) {
                0 => problem.softcap(pick(&mut mods_rng, &[f32::NAN, f32::INFINITY, 0.0, -1.0], f32::NAN)),
                1 => problem.window(-2, 0),
                2 => {
                    let wrong_len = vec![0.0; problem.q_heads + 1];
                    problem.sinks(wrong_len)
                }
                _ => {
                    let mut slopes = AttentionProblem::standard_alibi_slopes(problem.q_heads.max(1));
                    slopes[0] = f32::NAN;
                    problem.alibi_slopes(slopes)
                }
            };
        }
        Case { seed: self.seed, index, problem, precision, strategy, host, data }
    }
}

/// One to four score modifiers with parameters in the ranges models use (windows of a few to
/// all keys, caps near the logits' scale, sinks and slopes of either alignment).
fn draw_modifiers(rng: &mut StdRng, mut p: AttentionProblem) -> AttentionProblem {
    let extent = |rng: &mut StdRng, len: usize| -> i64 {
        match rng.random_range(0..4) {
            0 => -1,
            1 => 0,
            _ => rng.random_range(0..=len as i64 + 2),
        }
    };
    if rng.random_bool(0.5) {
        let (l, r) = (extent(rng, p.kv_len), extent(rng, p.kv_len));
        p = p.window(l, r);
    }
    if rng.random_bool(0.3) {
        p = p.softcap(pick(rng, &[1.0f32, 5.0, 30.0, 50.0], 30.0));
    }
    if rng.random_bool(0.3) {
        let sinks: Vec<f32> = (0..p.q_heads)
            .map(|_| if rng.random_bool(0.1) { f32::NEG_INFINITY } else { rng.random_range(-4.0f32..4.0) })
            .collect();
        p = p.sinks(sinks);
    }
    if rng.random_bool(0.3) {
        let slopes = AttentionProblem::standard_alibi_slopes(p.q_heads);
        p = p.alibi_slopes(slopes);
    }
    if rng.random_bool(0.4) {
        p = p.causal_align(crate::CausalAlign::TopLeft);
    }
    p
}

impl Case {
    /// The environment that replays this case.
    pub fn replay(&self) -> String {
        format!("{SEED_ENV}={:#x} {CASE_ENV}={}", self.seed, self.index)
    }

    /// The case's inputs (deterministic in `(seed, index)`). A problem `validate` refuses has
    /// none (empty tensors).
    pub fn inputs(&self) -> Inputs {
        let p = &self.problem;
        if p.validate().is_err() {
            return Inputs { q: Vec::new(), k: Vec::new(), v: Vec::new() };
        }
        let mut rng = stream(self.seed, self.index, 2);
        let d = &self.data;
        let mut tensor = |name: TensorName, heads: usize, len: usize, dim: usize, st: Strides, mag: f32| -> Vec<f32> {
            let n = p.batch * heads * len;
            let dense = crate::inputs::normal_with_outliers(n * dim, rng.random());
            let mut rows: Vec<Vec<f32>> = dense.chunks(dim.max(1)).map(|r| r.iter().map(|x| x * mag).collect()).collect();
            if d.zero_tensor == Some(name) {
                rows.iter_mut().for_each(|r| r.fill(0.0));
            }
            if d.zero_rows {
                for _ in 0..rng.random_range(1..=4usize) {
                    let r = rng.random_range(0..n);
                    rows[r].fill(0.0);
                }
            }
            if d.sign_flips && n > 1 {
                for _ in 0..rng.random_range(1..=4usize) {
                    let r = rng.random_range(1..n);
                    rows[r] = rows[r - 1].iter().map(|x| -x).collect();
                }
            }
            let mut out = vec![f32::NAN; st.extent(p.batch, heads, len, dim).unwrap_or(0)];
            for (r, row) in rows.iter().enumerate() {
                let off = st.offset(r / (heads * len), (r / len) % heads, r % len);
                for (c, &x) in row.iter().enumerate() {
                    out[off + c] = round(round(x, self.host), self.precision.input_dtype());
                }
            }
            // Plants outside the problem (a caller changed its shape after drawing) are dropped.
            for nf in d.non_finite.iter().filter(|nf| nf.tensor == name) {
                let (b, h, s) = nf.row;
                if b < p.batch && h < heads && s < len && nf.channel < dim {
                    out[st.offset(b, h, s) + nf.channel] = nf.value;
                }
            }
            out
        };
        let s = p.tensor_strides();
        let q = tensor(TensorName::Q, p.q_heads, p.q_len, p.head_dim, s.q, d.qk_magnitude);
        let k = tensor(TensorName::K, p.kv_heads, p.kv_len, p.head_dim, s.k, d.qk_magnitude);
        let v = tensor(TensorName::V, p.kv_heads, p.kv_len, p.v_head_dim, s.v, d.v_magnitude);
        Inputs { q, k, v }
    }
}

fn round(x: f32, dt: Dtype) -> f32 {
    match dt {
        Dtype::F32 => x,
        Dtype::F16 => f16::from_f32(x).to_f32(),
        Dtype::Bf16 => bf16::from_f32(x).to_f32(),
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.problem;
        write!(
            f,
            "case {} of seed {:#x}: {} {:?} b{} h{}/{} q{} k{} d{}/{}{} {:?}{} scale {} lse {} host {}",
            self.index,
            self.seed,
            self.precision,
            self.strategy,
            p.batch,
            p.q_heads,
            p.kv_heads,
            p.q_len,
            p.kv_len,
            p.head_dim,
            p.v_head_dim,
            if p.causal { " causal" } else { "" },
            p.layout,
            if p.strides.is_some() { " strided" } else { "" },
            p.scale.map_or("default".to_string(), |s| format!("{s:e}")),
            p.return_lse,
            self.host,
        )?;
        let mods = p.modifiers();
        if !mods.is_empty() {
            write!(f, " [{}: window {:?} softcap {:?} sinks {:?} alibi {:?} align {}]", mods.join(", "), p.window, p.softcap, p.sinks, p.alibi_slopes, p.causal_align.name())?;
        }
        let d = &self.data;
        write!(f, "; |qk| x{:.3e} |v| x{:.3e}", d.qk_magnitude, d.v_magnitude)?;
        if d.zero_rows {
            f.write_str(" zero-rows")?;
        }
        if d.sign_flips {
            f.write_str(" sign-flips")?;
        }
        if let Some(t) = d.zero_tensor {
            write!(f, " zero-{t}")?;
        }
        for nf in &d.non_finite {
            write!(f, " {}{:?}[{}]={}", nf.tensor, nf.row, nf.channel, nf.value)?;
        }
        Ok(())
    }
}

/// How a case ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The plan refused it with an error the rules allow: the variant's name and the text.
    Refused { kind: &'static str, error: String },
    /// Ran and met every check; `ratio` is the largest error / tolerance of them (≤ 1).
    Passed { ratio: f64 },
    /// Ran, but a check failed (`ratio` > 1 for tolerance failures, infinite for policy ones).
    Mismatch { ratio: f64, reason: String },
    /// An error where the rules allow none: a refusal of the wrong kind, or a failure after
    /// `plan` accepted.
    Failed(String),
}

/// A case, where it ran, and how it ended.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub case: Case,
    pub device: String,
    pub kernel: Option<String>,
    pub outcome: Outcome,
}

impl Verdict {
    /// Whether the case counts against the kernel (a mismatch or a failure).
    pub fn is_failure(&self) -> bool {
        matches!(self.outcome, Outcome::Mismatch { .. } | Outcome::Failed(_))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.kernel.as_deref().unwrap_or("-");
        match &self.outcome {
            Outcome::Refused { error, .. } => write!(f, "refused on {} ({k}): {error} [{}]", self.device, self.case),
            Outcome::Passed { ratio } => write!(f, "passed on {} ({k}) at {ratio:.3} of the tolerance [{}]", self.device, self.case),
            Outcome::Mismatch { ratio, reason } => {
                write!(f, "MISMATCH on {} ({k}), {ratio:.3} of the tolerance: {reason} [{}; replay: {}]", self.device, self.case, self.case.replay())
            }
            Outcome::Failed(e) => write!(f, "FAILED on {} ({k}): {e} [{}; replay: {}]", self.device, self.case, self.case.replay()),
        }
    }
}

/// The variant's name, for counting refusals by kind.
pub fn variant(e: &Error) -> &'static str {
    match e {
        Error::ZeroSize { .. } => "ZeroSize",
        Error::GqaRatio { .. } => "GqaRatio",
        Error::NonFiniteScale { .. } => "NonFiniteScale",
        Error::NonPositiveScale { .. } => "NonPositiveScale",
        Error::ShapeMismatch { .. } => "ShapeMismatch",
        Error::Rank { .. } => "Rank",
        Error::InvalidStrides { .. } => "InvalidStrides",
        Error::Dtype { .. } => "Dtype",
        Error::WrongDevice { .. } => "WrongDevice",
        Error::BufferLength { .. } => "BufferLength",
        Error::UnsupportedHeadDim { .. } => "UnsupportedHeadDim",
        Error::UnsupportedVHeadDim { .. } => "UnsupportedVHeadDim",
        Error::TooLarge { .. } => "TooLarge",
        Error::UnsupportedPrecision { .. } => "UnsupportedPrecision",
        Error::UnsupportedStrategy { .. } => "UnsupportedStrategy",
        Error::DeviceUnavailable { .. } => "DeviceUnavailable",
        Error::NotCompiledWith { .. } => "NotCompiledWith",
        Error::Quantization(_) => "Quantization",
        Error::Descales { .. } => "Descales",
        Error::EntryPoint { .. } => "EntryPoint",
        Error::Kernel { .. } => "Kernel",
        Error::InputOverflow { .. } => "InputOverflow",
        Error::InvalidLse { .. } => "InvalidLse",
        Error::Overflow { .. } => "Overflow",
        Error::InvalidModifier { .. } => "InvalidModifier",
        Error::UnsupportedFeature { .. } => "UnsupportedFeature",
        Error::UnsupportedPageSize { .. } => "UnsupportedPageSize",
        Error::BlockTableEntry { .. } => "BlockTableEntry",
        Error::UnsupportedPagedKv { .. } => "UnsupportedPagedKv",
        Error::InvalidPagedKv { .. } => "InvalidPagedKv",
        Error::UnsupportedVarLen { .. } => "UnsupportedVarLen",
        Error::InvalidVarLen { .. } => "InvalidVarLen",
    }
}

/// Whether a plan may refuse a valid problem with `e`: what a backend or family lacks.
fn is_capability(e: &Error) -> bool {
    matches!(
        e,
        Error::UnsupportedHeadDim { .. }
            | Error::UnsupportedVHeadDim { .. }
            | Error::UnsupportedPrecision { .. }
            | Error::UnsupportedStrategy { .. }
            | Error::InvalidStrides { .. }
            | Error::UnsupportedFeature { .. }
            | Error::UnsupportedPagedKv { .. }
            | Error::UnsupportedVarLen { .. }
            | Error::TooLarge { .. }
    )
}

/// Plans and runs `case` on `session` and judges it (module docs).
pub fn run_case(session: &Session, case: &Case) -> Verdict {
    let device = session.info().kind.to_string();
    let mut verdict = Verdict { case: case.clone(), device, kernel: None, outcome: Outcome::Failed(String::new()) };
    let expected = case.problem.validate().and_then(|_| case.precision.validate());
    let plan = session.plan(&case.problem, case.precision, case.strategy);
    let plan = match (expected, plan) {
        (Err(want), Err(got)) => {
            verdict.outcome = if std::mem::discriminant(&want) == std::mem::discriminant(&got) && want.to_string() == got.to_string() {
                Outcome::Refused { kind: variant(&got), error: got.to_string() }
            } else {
                Outcome::Failed(format!("refused with `{got}` where every backend must say `{want}`"))
            };
            return verdict;
        }
        (Err(want), Ok(plan)) => {
            verdict.kernel = Some(plan.kernel_name());
            verdict.outcome = Outcome::Failed(format!("planned a problem that must be refused with `{want}`"));
            return verdict;
        }
        (Ok(()), Err(got)) => {
            verdict.outcome = if is_capability(&got) {
                Outcome::Refused { kind: variant(&got), error: got.to_string() }
            } else {
                Outcome::Failed(format!("refused with a non-capability error: {got}"))
            };
            return verdict;
        }
        (Ok(()), Ok(plan)) => plan,
    };
    verdict.kernel = Some(plan.kernel_name());
    let inputs = case.inputs();
    let out = match case.host {
        Dtype::F32 => session.run(&plan, &inputs.q, &inputs.k, &inputs.v),
        Dtype::F16 => {
            let c = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>();
            session.run(&plan, &c(&inputs.q), &c(&inputs.k), &c(&inputs.v))
        }
        Dtype::Bf16 => {
            let c = |x: &[f32]| x.iter().map(|&a| bf16::from_f32(a)).collect::<Vec<_>>();
            session.run(&plan, &c(&inputs.q), &c(&inputs.k), &c(&inputs.v))
        }
    };
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            verdict.outcome = Outcome::Failed(format!("`plan` accepted, the call failed: {e}"));
            return verdict;
        }
    };
    verdict.outcome = match judge(case, &plan, &inputs, &out.o, out.lse.as_deref()) {
        Ok(o) => o,
        Err(e) => Outcome::Failed(format!("checking: {e}")),
    };
    verdict
}

/// Per query row `(b, h, i)` in row order: whether its softmax sees a non-finite input
/// (computed naively from the data, independent of the library's screen).
fn poisoned_rows(p: &AttentionProblem, x: &Inputs) -> Vec<bool> {
    let s = p.tensor_strides();
    let bad = |buf: &[f32], st: Strides, b: usize, h: usize, i: usize, dim: usize| buf[st.offset(b, h, i)..][..dim].iter().any(|v| !v.is_finite());
    let mut bad_key = vec![false; p.batch * p.kv_heads * p.kv_len];
    for b in 0..p.batch {
        for h in 0..p.kv_heads {
            for j in 0..p.kv_len {
                bad_key[(b * p.kv_heads + h) * p.kv_len + j] = bad(&x.k, s.k, b, h, j, p.head_dim) || bad(&x.v, s.v, b, h, j, p.v_head_dim);
            }
        }
    }
    let mut rows = Vec::with_capacity(p.batch * p.q_heads * p.q_len);
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            let keys = &bad_key[(b * p.kv_heads + p.kv_head_of(h)) * p.kv_len..][..p.kv_len];
            for i in 0..p.q_len {
                let visible: Vec<usize> = (0..p.kv_len).filter(|&j| p.sees(i, j)).collect();
                rows.push(!visible.is_empty() && (bad(&x.q, s.q, b, h, i, p.head_dim) || visible.iter().any(|&j| keys[j])));
            }
        }
    }
    rows
}

/// The modes whose kernels are also held to the CPU emulation (which rounds where they round).
fn checks_emulation(p: Precision) -> bool {
    regime(p) != Regime::Wide
}

fn judge(case: &Case, plan: &crate::Plan, x: &Inputs, o: &[f32], lse: Option<&[f32]>) -> Result<Outcome> {
    let p = &case.problem;
    let tol = Tolerance::for_precision(case.precision);
    let mismatch = |reason: String| Ok(Outcome::Mismatch { ratio: f64::INFINITY, reason });
    if o.len() != p.o_len_elems() || lse.is_some_and(|l| l.len() != p.lse_len_elems()) || lse.is_some() != p.return_lse {
        return mismatch(format!("output sizes: O {} (want {}), LSE {:?}", o.len(), p.o_len_elems(), lse.map(|l| l.len())));
    }
    let poisoned = poisoned_rows(p, x);
    // Judged on inputs where the non-finite values are 0, as the policy computes the other rows.
    let clean = |t: &[f32], st: Strides, heads: usize, len: usize, dim: usize| -> Vec<f32> {
        let mut c = t.to_vec();
        for r in 0..p.batch * heads * len {
            let off = st.offset(r / (heads * len), (r / len) % heads, r % len);
            c[off..off + dim].iter_mut().filter(|a| !a.is_finite()).for_each(|a| *a = 0.0);
        }
        c
    };
    let s = p.tensor_strides();
    let (q, k, v) = if case.data.non_finite.is_empty() {
        (x.q.clone(), x.k.clone(), x.v.clone())
    } else {
        (
            clean(&x.q, s.q, p.q_heads, p.q_len, p.head_dim),
            clean(&x.k, s.k, p.kv_heads, p.kv_len, p.head_dim),
            clean(&x.v, s.v, p.kv_heads, p.kv_len, p.v_head_dim),
        )
    };
    let r = reference::attention_f64(p, &q, &k, &v)?;
    let dv = p.v_head_dim;
    let (mut got, mut want, mut got_lse, mut want_lse) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (row, &bad) in poisoned.iter().enumerate() {
        let (b, h, i) = (row / (p.q_heads * p.q_len), (row / p.q_len) % p.q_heads, row % p.q_len);
        let off = s.o.offset(b, h, i);
        let orow = &o[off..off + dv];
        let l = lse.map(|l| l[row]);
        if bad {
            if !orow.iter().all(|a| a.is_nan()) || l.is_some_and(|l| !l.is_nan()) {
                return mismatch(format!("row (b{b}, h{h}, i{i}) sees a non-finite input and must be NaN (O and LSE), got O[0] = {}, LSE {l:?}", orow[0]));
            }
            continue;
        }
        if p.visible_keys(i) == 0 && (orow.iter().any(|&a| a != 0.0) || l.is_some_and(|l| l != f32::NEG_INFINITY)) {
            return mismatch(format!("row (b{b}, h{h}, i{i}) sees no key and must be O = 0, LSE = -inf; got O[0] = {}, LSE {l:?}", orow[0]));
        }
        got.extend_from_slice(orow);
        want.extend_from_slice(&r.o[off..off + dv]);
        if let Some(l) = l {
            got_lse.push(l);
            want_lse.push(r.lse[row]);
        }
    }
    if got.is_empty() {
        return Ok(Outcome::Passed { ratio: 0.0 });
    }
    let m = ErrorMetrics::compare(&got, &want);
    let ref_max = want.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    // The quantized modes' emulation rounds where their kernels round, on the CPU: its O (in
    // the judged rows, row order) and how far the rounding alone takes it from the reference.
    let emulated = if checks_emulation(case.precision) && case.strategy != Strategy::Reference {
        let e = emulation::emulate(p, case.precision, &plan.blocking.unwrap_or_default(), &q, &k, &v)?;
        let (mut emu, mut emu_lse) = (Vec::with_capacity(got.len()), Vec::new());
        for (row, &bad) in poisoned.iter().enumerate() {
            if !bad {
                let (b, h, i) = (row / (p.q_heads * p.q_len), (row / p.q_len) % p.q_heads, row % p.q_len);
                let off = s.o.offset(b, h, i);
                emu.extend(e.o[off..off + dv].iter().map(|&a| a as f64));
                if lse.is_some() {
                    emu_lse.push(e.lse[row]);
                }
            }
        }
        let own = ErrorMetrics::compare(&emu, &want);
        // The LSE the rounded logits give: its distance from the reference's.
        let own_lse = if lse.is_some() { compare_lse(&emu_lse, &want_lse).map(|m| m.max_abs) } else { None };
        Some((emu, own, own_lse))
    } else {
        None
    };
    // The per-precision bounds describe typical inputs; where the mode's own rounding is
    // provably farther from the reference on this input, that distance, plus 10% for summation
    // order, bounds the kernel instead: the emulation's distance for a kernel (which is still
    // held to the emulation), and for the emulation itself (`Strategy::Reference`) the distance
    // the rounding of its inputs alone causes, plus P's unit roundoff `u`.
    let yardstick = match &emulated {
        Some((_, own, own_lse)) => Some((*own, *own_lse, 0.0)),
        None if case.strategy == Strategy::Reference => {
            input_rounding(case, plan, (&q, &k, &v), &poisoned, lse.is_some(), &want, &want_lse)?
        }
        None => None,
    };
    let (mut max_rel_l2, mut min_cos, mut abs_bound) = (tol.max_rel_l2, tol.min_cos_sim, tol.max_abs_rel * ref_max.max(1e-30));
    let mut lse_bound = tol.max_abs_rel;
    if let Some((own, own_lse, u)) = &yardstick {
        max_rel_l2 = max_rel_l2.max(own.rel_l2 * 1.1 + u);
        min_cos = min_cos.min(1.0 - (1.0 - own.cos_sim) * 1.1 - u * u);
        abs_bound = abs_bound.max(own.max_abs * 1.1 + u * ref_max);
        if let Some(l) = own_lse {
            lse_bound = lse_bound.max(l * 1.1 + u.ln_1p());
        }
    }
    let mut ratio = (m.rel_l2 / max_rel_l2).max(m.max_abs / abs_bound).max((1.0 - m.cos_sim) / (1.0 - min_cos));
    if ref_max == 0.0 {
        // An all-zero reference (V zero): the kernel must give exact zeros.
        ratio = if m.max_abs == 0.0 { 0.0 } else { f64::INFINITY };
    }
    let mut why = Vec::new();
    if !(ratio <= 1.0) {
        why.push(format!(
            "O: rel_l2 {:.3e} (max {:.2e}), cos {:.7} (min {:.7}), max_abs {:.3e} (max {:.3e})",
            m.rel_l2, max_rel_l2, m.cos_sim, min_cos, m.max_abs, abs_bound
        ));
    }
    if lse.is_some() {
        match compare_lse(&got_lse, &want_lse) {
            None => {
                ratio = f64::INFINITY;
                why.push("LSE: infinities differ from the reference".into());
            }
            Some(lm) => {
                let bound = lse_bound;
                let lr = lm.max_abs / bound;
                ratio = ratio.max(lr);
                if !(lr <= 1.0) {
                    why.push(format!("LSE max_abs {:.3e} (max {:.2e})", lm.max_abs, bound));
                }
            }
        }
    }
    if let Some((emu, _, _)) = &emulated {
        let vs = ErrorMetrics::compare(&got, emu);
        let er = if vs.rel_l2.is_finite() || vs.rel_l2.is_nan() { vs.rel_l2 / tol.max_rel_l2 } else { f64::INFINITY };
        ratio = ratio.max(er);
        if !(er <= 1.0) {
            why.push(format!("O vs the CPU emulation of {}: rel_l2 {:.3e} (max {:.1e})", case.precision, vs.rel_l2, tol.max_rel_l2));
        }
    }
    if ratio.is_nan() {
        ratio = f64::INFINITY;
    }
    Ok(if why.is_empty() { Outcome::Passed { ratio } } else { Outcome::Mismatch { ratio, reason: why.join("; ") } })
}

/// For an FP8, INT8, NVFP4 or MXFP4 mode run by its emulation: the f64 reference on Q, K and V
/// as the mode's codes and scales give them back (the emulation's scale layouts; with K
/// smoothing: K − μ quantized, μ added back, which leaves every row's softmax as the
/// emulation's), against the reference on the inputs, over the judged rows (O, and the LSE's
/// max-abs when judged), and P's unit roundoff. What rounding the inputs alone costs on this
/// input, computed without the emulation: on ill-conditioned inputs (a few keys whose V rows
/// cancel) it passes the per-precision bound. The case's inputs already hold the mode's input
/// dtype ([`Case::inputs`]), so the codes are those the emulation quantizes.
#[allow(clippy::too_many_arguments)]
fn input_rounding(
    case: &Case,
    plan: &crate::Plan,
    (q, k, v): (&[f32], &[f32], &[f32]),
    poisoned: &[bool],
    with_lse: bool,
    want: &[f64],
    want_lse: &[f64],
) -> Result<Option<(ErrorMetrics, Option<f64>, f64)>> {
    let p = &case.problem;
    let blocking = plan.blocking.unwrap_or_default();
    let (dq, dk, dv, u) = match case.precision {
        Precision::Fp8 { format, descale, p: pf } => {
            use crate::codec::fp8_scaled::{DescaleLayout, Fp8Tensor};
            let dequantized = |x: &[f32], strides: Strides, heads: usize, len: usize, dim: usize, block_rows: usize| -> Result<Vec<f32>> {
                let layout = DescaleLayout { granularity: descale, batch: p.batch, heads, len, block_rows };
                let t = Fp8Tensor::quantize(format, x, strides, dim, layout)?;
                Ok(map_rows(x, strides, (p.batch, heads, len, dim), |b, h, i, _, e| t.raw(e) * t.descales[layout.index(b, h, i)]))
            };
            (
                dequantized(q, p.q_strides(), p.q_heads, p.q_len, p.head_dim, blocking.block_q)?,
                dequantized(k, p.k_strides(), p.kv_heads, p.kv_len, p.head_dim, blocking.block_k)?,
                dequantized(v, p.v_strides(), p.kv_heads, p.kv_len, p.v_head_dim, blocking.block_k)?,
                p_roundoff(pf),
            )
        }
        Precision::Int8Qk { granularity, smooth_k, pv } => {
            use crate::codec::int8;
            let layout = int8::Int8ScaleLayout::new(p, granularity, blocking.int8())?;
            let (d, dv) = (p.head_dim, p.v_head_dim);
            let qt = int8::quantize_q(p, &layout, q, 1.0)?;
            let dq = map_rows(q, p.q_strides(), (p.batch, p.q_heads, p.q_len, d), |b, h, i, _, e| {
                qt.codes[e] as f32 * qt.scales[layout.q_scale_index(b, h, i)]
            });
            let sm = if smooth_k { Some(int8::smooth_k(p, k)?) } else { None };
            let kt = int8::quantize_k(p, &layout, sm.as_ref().map_or(k, |s| &s.values[..]))?;
            let dk = map_rows(k, p.k_strides(), (p.batch, p.kv_heads, p.kv_len, d), |b, h, j, c, e| {
                let mean = sm.as_ref().map_or(0.0, |s| s.mean[(b * p.kv_heads + h) * d + c]);
                kt.codes[e] as f32 * kt.scales[layout.k_scale_index(b, h, j)] + mean
            });
            let dv = if pv == crate::PvFormat::Fp8 {
                let vt = int8::quantize_v_e4m3(p, v)?;
                map_rows(v, p.v_strides(), (p.batch, p.kv_heads, p.kv_len, dv), |b, h, _, c, e| {
                    crate::codec::fp8::e4m3::decode(vt.codes[e]) * vt.scales[(b * p.kv_heads + h) * dv + c]
                })
            } else {
                v.to_vec()
            };
            (dq, dk, dv, p_roundoff(pv))
        }
        Precision::Nvfp4 { v: vf, smooth_k } => {
            let (dq, dk) = dequantized_qk_4bit(p, smooth_k, q, k, crate::codec::nvfp4::Nvfp4Tensor::quantize)?;
            // 4-bit V: the emulation's `Vᵀ` codes (16-key blocks along the keys of each channel,
            // one tensor scale); bf16 V is the input as it is.
            let dv = if vf.is_4bit() {
                let vt = emulation::quantize_vt_nvfp4(p, v)?;
                map_rows(v, p.v_strides(), (p.batch, p.kv_heads, p.kv_len, p.v_head_dim), |b, h, j, c, _| {
                    vt.value((b * p.kv_heads + h) * p.v_head_dim + c, j)
                })
            } else {
                v.to_vec()
            };
            // P in NVFP4 is E2M1 codes times a UE4M3 scale per 16 keys, set from the block's
            // largest p (the fixed tensor scale 1/2688 holds p ≤ 1): elements in E2M1's normal
            // range round with its unit roundoff 2^-2 (one mantissa bit), as e4m3 P rounds with
            // 2^-4; bf16 P: 2^-8; f16 P: 2^-11.
            let u = match vf {
                crate::Nvfp4V::Bf16 => 2f64.powi(-8),
                crate::Nvfp4V::Nvfp4 => 2f64.powi(-2),
                crate::Nvfp4V::Nvfp4P16 => 2f64.powi(-11),
            };
            (dq, dk, dv, u)
        }
        Precision::Mxfp4 { smooth_k } => {
            let (dq, dk) = dequantized_qk_4bit(p, smooth_k, q, k, crate::codec::mxfp4::Mxfp4Tensor::quantize)?;
            // V stays bf16; P is rounded to bf16.
            (dq, dk, v.to_vec(), 2f64.powi(-8))
        }
        _ => return Ok(None),
    };
    let r = reference::attention_f64(p, &dq, &dk, &dv)?;
    let (mut o, mut l) = (Vec::with_capacity(want.len()), Vec::new());
    let so = p.o_strides();
    for (row, &bad) in poisoned.iter().enumerate() {
        if !bad {
            let (b, h, i) = (row / (p.q_heads * p.q_len), (row / p.q_len) % p.q_heads, row % p.q_len);
            let off = so.offset(b, h, i);
            o.extend_from_slice(&r.o[off..off + p.v_head_dim]);
            if with_lse {
                l.push(r.lse[row] as f32);
            }
        }
    }
    let own_lse = if with_lse { compare_lse(&l, want_lse).map(|m| m.max_abs) } else { None };
    Ok(Some((ErrorMetrics::compare(&o, want), own_lse, u)))
}

/// Unit roundoff of P in the FP8 and INT8 modes: e4m3 P 2^-4, f16 P 2^-11.
fn p_roundoff(pf: crate::PvFormat) -> f64 {
    if pf == crate::PvFormat::Fp8 {
        2f64.powi(-4)
    } else {
        2f64.powi(-11)
    }
}

/// Q and K of a 4-bit mode as its codes and scales give them back, in the problem's layout:
/// quantized as the emulation quantizes them ([`emulation::quantize_qk_4bit`]: blocks along
/// the head dim; with `smooth_k` K − μ, μ added back here).
fn dequantized_qk_4bit<T: crate::codec::fp4::BlockScaled4>(
    p: &AttentionProblem,
    smooth_k: bool,
    q: &[f32],
    k: &[f32],
    quantize: impl Fn(&[f32], usize, usize) -> Result<T>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let t = emulation::quantize_qk_4bit(p, smooth_k, q, k, quantize)?;
    let d = p.head_dim;
    let dq = map_rows(q, p.q_strides(), (p.batch, p.q_heads, p.q_len, d), |b, h, i, c, _| {
        t.q.element((b * p.q_heads + h) * p.q_len + i, c)
    });
    let dk = map_rows(k, p.k_strides(), (p.batch, p.kv_heads, p.kv_len, d), |b, h, j, c, _| {
        let mean = t.mean.as_ref().map_or(0.0, |m| m[(b * p.kv_heads + h) * d + c]);
        t.k.element((b * p.kv_heads + h) * p.kv_len + j, c) + mean
    });
    Ok((dq, dk))
}

/// `x` with every element of the strided `(batch, heads, len, dim)` view replaced by
/// `f(b, h, row, channel, element index)`; elements between rows are kept.
fn map_rows(
    x: &[f32],
    strides: Strides,
    (batch, heads, len, dim): (usize, usize, usize, usize),
    f: impl Fn(usize, usize, usize, usize, usize) -> f32,
) -> Vec<f32> {
    let mut out = x.to_vec();
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..len {
                let o = strides.offset(b, h, i);
                for c in 0..dim {
                    out[o + c] = f(b, h, i, c, o + c);
                }
            }
        }
    }
    out
}

/// Counts and the distribution of error / tolerance over a run of cases.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub cases: usize,
    pub passed: usize,
    pub refused: usize,
    pub mismatches: usize,
    pub failures: usize,
    /// error / tolerance of every case that ran (passed or mismatched).
    pub ratios: Vec<f64>,
    /// Refusals by the error's variant name.
    pub refusals: BTreeMap<String, usize>,
}

impl Summary {
    pub fn add(&mut self, v: &Verdict) {
        self.cases += 1;
        match &v.outcome {
            Outcome::Passed { ratio } => {
                self.passed += 1;
                self.ratios.push(*ratio);
            }
            Outcome::Mismatch { ratio, .. } => {
                self.mismatches += 1;
                self.ratios.push(*ratio);
            }
            Outcome::Refused { kind, .. } => {
                self.refused += 1;
                *self.refusals.entry(kind.to_string()).or_default() += 1;
            }
            Outcome::Failed(_) => self.failures += 1,
        }
    }

    /// The `q`-quantile (0..=1) of error / tolerance over the cases that ran; NaN when none ran.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.ratios.is_empty() {
            return f64::NAN;
        }
        let mut r = self.ratios.clone();
        r.sort_by(|a, b| a.total_cmp(b));
        let i = ((r.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        r[i.min(r.len() - 1)]
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cases: {} passed, {} refused, {} mismatches, {} failures; error/tolerance median {:.3}, p99 {:.3}, max {:.3}",
            self.cases,
            self.passed,
            self.refused,
            self.mismatches,
            self.failures,
            self.quantile(0.5),
            self.quantile(0.99),
            self.quantile(1.0)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_profile() -> Profile {
        Profile {
            device: "cpu".into(),
            precisions: vec![Precision::F32, Precision::F16_DEFAULT, Precision::BF16_DEFAULT, Precision::FP8_DEFAULT],
            strategies: vec![Strategy::Auto, Strategy::Reference],
            head_dims: HEAD_DIMS.to_vec(),
            max_len: 600,
            max_work: 2.0e7,
            palette: None,
            plans: Vec::new(),
        }
    }

    #[test]
    fn a_palette_bounds_the_kernel_configurations() {
        let g = Generator::new(3, cpu_profile().with_palette(4));
        let mut configs = Vec::new();
        for i in 0..200 {
            let c = g.case(i);
            let p = &c.problem;
            if p.validate().is_err() {
                continue; // compiles nothing
            }
            let key = (c.precision, c.strategy, p.head_dim, p.v_head_dim, p.causal, p.return_lse);
            if !configs.contains(&key) {
                configs.push(key);
            }
        }
        assert!(configs.len() <= 4, "{configs:?}");
    }

    #[test]
    fn a_palette_is_drawn_from_configurations_that_plan_but_for_one() {
        let mut prof = cpu_profile().with_palette(5);
        prof.head_dims = vec![64];
        prof.plans = vec![(Strategy::Auto, Precision::F32, 64), (Strategy::Auto, Precision::FP8_DEFAULT, 64)];
        for seed in 0..20 {
            let g = Generator::new(seed, prof.clone());
            let mut configs = Vec::new();
            for i in 0..300 {
                let c = g.case(i);
                if c.problem.validate().is_err() {
                    continue; // the case broke the problem on purpose
                }
                let key = (c.precision, c.strategy, c.problem.head_dim, c.problem.v_head_dim);
                if !configs.contains(&key) {
                    configs.push(key);
                }
            }
            let planned = configs
                .iter()
                .filter(|&&(p, s, d, v)| s == Strategy::Reference || (v == 64 && prof.plans.contains(&(s, p, d))))
                .count();
            assert!(configs.len() - planned <= 1, "seed {seed}: {configs:?}");
        }
    }

    #[test]
    fn cases_replay_from_seed_and_index() {
        let g = Generator::new(7, cpu_profile());
        for i in 0..50 {
            let (a, b) = (g.case(i), g.case(i));
            assert_eq!(a, b);
            let (x, y) = (a.inputs(), b.inputs());
            assert_eq!(x.q.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), y.q.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
        assert_ne!(Generator::new(8, cpu_profile()).case(3), g.case(3));
    }

    #[test]
    fn cases_respect_the_budget_and_cover_the_space() {
        let g = Generator::new(FIXED_SEED, cpu_profile());
        let (mut causal_wide, mut strided, mut invalid, mut gqa, mut long) = (0, 0, 0, 0, 0);
        for i in 0..2000 {
            let c = g.case(i);
            let p = &c.problem;
            if p.validate().is_err() {
                invalid += 1;
                continue;
            }
            let work = (p.batch * p.q_heads * p.q_len * p.kv_len * (p.head_dim + p.v_head_dim)) as f64;
            assert!(work <= 2.0e7 || (p.q_len == 1 && p.kv_len == 1), "{c}");
            assert!(p.q_len <= 600 && p.kv_len <= 600);
            causal_wide += usize::from(p.causal && p.q_len > p.kv_len);
            strided += usize::from(p.strides.is_some());
            gqa += usize::from(p.q_heads > p.kv_heads);
            long += usize::from(p.q_len.max(p.kv_len) > 300);
            let x = c.inputs();
            assert_eq!((x.q.len(), x.k.len(), x.v.len()), (p.q_len_elems(), p.k_len_elems(), p.v_len_elems()));
        }
        assert!(causal_wide > 100 && strided > 200 && invalid > 100 && gqa > 500 && long > 30, "{causal_wide} {strided} {invalid} {gqa} {long}");
    }
}
