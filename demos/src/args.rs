//! The command line.

use clap::{Args, Parser, Subcommand, ValueEnum};
use quattn::{AttentionProblem, Device, Layout, NativeKind, PortableKind, Precision, Strategy, WgpuAdapter};

#[derive(Parser)]
#[command(name = "quattn", version, about = "Fast low-precision flash attention: demo, benchmark and self-test")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run one attention call on random inputs, check it against the f64 reference, report.
    Run(RunArgs),
    /// The performance table (TFLOP/s on the FlashAttention benchmark grid).
    Bench(BenchArgs),
    /// The correctness matrix on every device present; non-zero exit on any failure.
    Selftest(SelftestArgs),
    /// Compile every native kernel variant with NVRTC, disassemble, check instructions and spills.
    Kernels(KernelsArgs),
    /// Many calls of mixed shapes and precisions in one process: errors, output drift, host RSS
    /// and device memory after the warm-up and at the end.
    Soak(SoakArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DeviceArg {
    Auto,
    Cpu,
    /// wgpu with this build's compiler: WGSL, or SPIR-V on Vulkan when built with `--features spirv`.
    Wgpu,
    /// wgpu on Vulkan with CubeCL's SPIR-V compiler (cooperative matrices); needs `--features spirv`.
    WgpuSpirv,
    Cuda,
    /// AMD GPU through ROCm's HIP runtime (gfx942 / gfx950; kernels not run on hardware).
    Hip,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AdapterArg {
    Default,
    Discrete,
    Integrated,
    Virtual,
    Software,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum StrategyArg {
    Auto,
    Portable,
    Native,
    Reference,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum NativeArg {
    Hmma,
    Wgmma,
    Int8Imma,
    Int8Wgmma,
    Int8Umma,
    Fp8Wgmma,
    Fp8Mma,
    /// AMD MFMA f16/bf16 (HIP; not run on hardware).
    Mfma,
    /// AMD MFMA FP8 e4m3 (HIP; not run on hardware).
    MfmaFp8,
    /// Split-KV decode (q_len x GQA group <= 64 rows per KV head).
    Decode,
    Nvfp4,
}

/// Portable (CubeCL) kernel family with `--strategy portable`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PortableArg {
    /// The best the runtime offers: mma, else cmma, else the FMA kernel.
    Auto,
    Fma,
    Cmma,
    Mma,
    /// The INT8 Q/K kernel (with its CubeCL prepass).
    Int8,
    /// The FP8 kernel (e4m3/e5m2 codes decoded as they are staged).
    Fp8,
    /// The 4-bit kernel (NVFP4 codes decoded as they are staged).
    Fp4,
    /// Split-KV decode: GQA group packed per KV head, keys split across cubes, merged.
    Decode,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LayoutArg {
    Bhsd,
    Bshd,
}

#[derive(Args, Clone, Debug)]
pub struct DeviceOpts {
    /// Where to run: auto = the best present (a GPU, else the CPU).
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceArg,
    /// wgpu adapter class (with --device wgpu or wgpu-spirv).
    #[arg(long, value_enum, default_value = "default")]
    pub adapter: AdapterArg,
    /// CUDA device ordinal, or index of the adapter within its class.
    #[arg(long, default_value_t = 0)]
    pub ordinal: usize,
    /// Which path: auto, portable (CubeCL / CPU kernel), native (with --native), reference (CPU emulation).
    #[arg(long, value_enum, default_value = "auto")]
    pub strategy: StrategyArg,
    /// Native kernel family (with --strategy native).
    #[arg(long, value_enum, default_value = "hmma")]
    pub native: NativeArg,
    /// Portable kernel family (with --strategy portable): auto, fma, cmma (WMMA, softmax through
    /// shared memory) or mma (mma.sync, softmax in registers; CUDA sm_80+).
    #[arg(long, value_enum, default_value = "auto")]
    pub portable: PortableArg,
}

impl DeviceOpts {
    pub fn device(&self) -> Device {
        let n = self.ordinal;
        match self.device {
            DeviceArg::Auto => Device::Auto,
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda(n),
            DeviceArg::Hip => Device::Hip(n),
            DeviceArg::Wgpu => Device::Wgpu(self.wgpu_adapter()),
            DeviceArg::WgpuSpirv => Device::WgpuSpirv(self.wgpu_adapter()),
        }
    }

    fn wgpu_adapter(&self) -> WgpuAdapter {
        let n = self.ordinal;
        match self.adapter {
            AdapterArg::Default => WgpuAdapter::Default,
            AdapterArg::Discrete => WgpuAdapter::Discrete(n),
            AdapterArg::Integrated => WgpuAdapter::Integrated(n),
            AdapterArg::Virtual => WgpuAdapter::Virtual(n),
            AdapterArg::Software => WgpuAdapter::Software,
        }
    }

    pub fn strategy(&self) -> Strategy {
        match self.strategy {
            StrategyArg::Auto => Strategy::Auto,
            StrategyArg::Portable => match self.portable {
                PortableArg::Auto => Strategy::Portable,
                PortableArg::Fma => Strategy::PortableFamily(PortableKind::Fma),
                PortableArg::Cmma => Strategy::PortableFamily(PortableKind::Cmma),
                PortableArg::Mma => Strategy::PortableFamily(PortableKind::Mma),
                PortableArg::Int8 => Strategy::PortableFamily(PortableKind::Int8),
                PortableArg::Fp8 => Strategy::PortableFamily(PortableKind::Fp8),
                PortableArg::Fp4 => Strategy::PortableFamily(PortableKind::Fp4),
                PortableArg::Decode => Strategy::PortableFamily(PortableKind::Decode),
            },
            StrategyArg::Reference => Strategy::Reference,
            StrategyArg::Native => Strategy::Native(match self.native {
                NativeArg::Hmma => NativeKind::Hmma,
                NativeArg::Wgmma => NativeKind::Wgmma,
                NativeArg::Int8Imma => NativeKind::Int8Imma,
                NativeArg::Int8Wgmma => NativeKind::Int8Wgmma,
                NativeArg::Int8Umma => NativeKind::Int8Umma,
                NativeArg::Fp8Wgmma => NativeKind::Fp8Wgmma,
                NativeArg::Fp8Mma => NativeKind::Fp8Mma,
                NativeArg::Mfma => NativeKind::HipMfma,
                NativeArg::MfmaFp8 => NativeKind::HipMfmaFp8,
                NativeArg::Decode => NativeKind::Decode,
                NativeArg::Nvfp4 => NativeKind::Nvfp4,
            }),
        }
    }
}

pub fn parse_precision(s: &str) -> Result<Precision, String> {
    Precision::parse(s).ok_or_else(|| {
        let names: Vec<String> = Precision::all_named().iter().map(|p| p.name()).collect();
        format!(
            "unknown precision `{s}`; one of f32|f16|f16-acc16|f16-2stage|bf16|int8|fp8|nvfp4|mxfp4 or a full name: {}",
            names.join(", ")
        )
    })
}

/// Score modifiers of `run` and `bench` (README "Score modifiers").
#[derive(Args, Clone, Debug, Default)]
pub struct ModifierArgs {
    /// Sliding window `L,R` (FlashAttention's window_size): row i sees keys a(i)-L ..= a(i)+R;
    /// -1 is unbounded on that side.
    #[arg(long, value_parser = parse_window, allow_hyphen_values = true)]
    pub window: Option<(i64, i64)>,
    /// Softcap C: scaled logits s become C·tanh(s/C) (before the mask).
    #[arg(long)]
    pub softcap: Option<f32>,
    /// Random attention sinks, one per q head (N(0, 2²), from the input seed).
    #[arg(long)]
    pub sinks: bool,
    /// ALiBi with the standard slopes 2^(-8(h+1)/H).
    #[arg(long)]
    pub alibi: bool,
    /// Where the rows sit among the keys when q_len != kv_len, for causal masking, the window
    /// and ALiBi: bottom-right (FlashAttention, a(i) = i + kv_len - q_len) or top-left (torch
    /// SDPA's is_causal, a(i) = i).
    #[arg(long, value_enum, default_value = "bottom-right")]
    pub causal_align: CausalAlignArg,
}

#[derive(Clone, Copy, Debug, Default, ValueEnum, PartialEq, Eq)]
pub enum CausalAlignArg {
    #[default]
    BottomRight,
    TopLeft,
}

impl ModifierArgs {
    /// `p` with the modifiers set (sinks drawn from `seed`).
    pub fn apply(&self, mut p: AttentionProblem, seed: u64) -> AttentionProblem {
        if let Some((l, r)) = self.window {
            p = p.window(l, r);
        }
        if let Some(c) = self.softcap {
            p = p.softcap(c);
        }
        if self.sinks {
            let sinks: Vec<f32> = quattn::inputs::normal_with_outliers(p.q_heads, seed ^ 0x5eed_5111).into_iter().map(|x| 2.0 * x).collect();
            p = p.sinks(sinks);
        }
        if self.alibi {
            let slopes = AttentionProblem::standard_alibi_slopes(p.q_heads);
            p = p.alibi_slopes(slopes);
        }
        p.causal_align(match self.causal_align {
            CausalAlignArg::BottomRight => quattn::CausalAlign::BottomRight,
            CausalAlignArg::TopLeft => quattn::CausalAlign::TopLeft,
        })
    }
}

/// `L,R` as two integers.
fn parse_window(s: &str) -> Result<(i64, i64), String> {
    let (l, r) = s.split_once(',').ok_or_else(|| format!("window `{s}`: expected L,R (e.g. 4096,0; -1 is unbounded)"))?;
    let n = |x: &str| x.trim().parse::<i64>().map_err(|e| format!("window `{s}`: `{x}` is not an integer: {e}"));
    Ok((n(l)?, n(r)?))
}

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub dev: DeviceOpts,
    /// f32|f16|f16-acc16|f16-2stage|bf16|int8|fp8|nvfp4|mxfp4, or a full precision name.
    #[arg(long, default_value = "f16", value_parser = parse_precision)]
    pub precision: Precision,
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// KV heads (GQA/MQA); defaults to --heads.
    #[arg(long)]
    pub kv_heads: Option<usize>,
    #[arg(long, default_value_t = 512)]
    pub seq: usize,
    /// Key/value sequence length; defaults to --seq.
    #[arg(long)]
    pub kv_seq: Option<usize>,
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    #[arg(long)]
    pub causal: bool,
    /// Softmax scale; defaults to 1/sqrt(head_dim).
    #[arg(long, allow_hyphen_values = true)]
    pub scale: Option<f32>,
    #[arg(long, value_enum, default_value = "bhsd")]
    pub layout: LayoutArg,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Timed repetitions after warm-up (median reported).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Skip the f64 reference check (for shapes too large to check on the CPU).
    #[arg(long)]
    pub no_check: bool,
    /// Inputs from N(0, 1) with +8σ on a few channels of every key (the INT8 accuracy case of
    /// issue #5) instead of the default normal values with sparse outliers.
    #[arg(long)]
    pub k_outlier_channels: bool,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// K and V in a paged cache of pages of N keys (16, 32, 64, 128 or 256), every sequence
    /// `--kv-seq` keys long, its pages shuffled through the pool.
    #[arg(long)]
    pub page_size: Option<usize>,
    /// A variable-length batch: comma-separated per-sequence lengths (queries and keys alike),
    /// packed token-major; replaces `--batch`, `--seq` and `--kv-seq`.
    #[arg(long, value_delimiter = ',')]
    pub varlen: Vec<usize>,
    #[command(flatten)]
    pub mods: ModifierArgs,
}

/// `p` as a variable-length batch of sequences of `lens` queries and keys each, or `p` itself
/// when `lens` is empty.
pub fn varlen(p: AttentionProblem, lens: &[usize]) -> AttentionProblem {
    if lens.is_empty() {
        p
    } else {
        p.varlen(quattn::VarLen::from_lengths(lens, lens))
    }
}

/// `p` with its K/V in a paged cache of `page_size` keys a page (every sequence `kv_len` long,
/// pages shuffled; deterministic in `seed`), or `p` itself.
pub fn paged(p: AttentionProblem, page_size: Option<usize>, seed: u64) -> AttentionProblem {
    match page_size {
        Some(ps) => {
            let lens = vec![p.kv_len; p.batch];
            p.paged_kv(quattn::inputs::paged_kv(ps, &lens, 0, 0, seed))
        }
        None => p,
    }
}

impl RunArgs {
    pub fn problem(&self) -> AttentionProblem {
        let mut p = AttentionProblem::new(self.batch, self.heads, self.seq, self.head_dim)
            .kv_heads(self.kv_heads.unwrap_or(self.heads))
            .kv_len(self.kv_seq.unwrap_or(self.seq))
            .causal(self.causal)
            .layout(match self.layout {
                LayoutArg::Bhsd => Layout::Bhsd,
                LayoutArg::Bshd => Layout::Bshd,
            })
            .with_lse(true);
        if let Some(s) = self.scale {
            p = p.scale(s);
        }
        let p = varlen(p, &self.varlen);
        paged(self.mods.apply(p, self.seed), self.page_size, self.seed)
    }
}

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub dev: DeviceOpts,
    /// Precisions to benchmark (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "f16", value_parser = parse_precision)]
    pub precision: Vec<Precision>,
    /// Head dims of the grid.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 128])]
    pub head_dims: Vec<usize>,
    /// Sequence lengths of the grid (batch = tokens / seq, heads = 2048 / head_dim).
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 4096, 16384])]
    pub seqs: Vec<usize>,
    /// batch · seq of every row (FlashAttention's grid uses 16384).
    #[arg(long, default_value_t = 16384)]
    pub tokens: usize,
    /// Model width: heads = width / head_dim.
    #[arg(long, default_value_t = 2048)]
    pub width: usize,
    /// Query length of every row (decode: 1); the keys then number `seq`. Default: `seq`.
    #[arg(long)]
    pub q_len: Option<usize>,
    /// KV heads of every row (GQA/MQA; must divide the query heads). Default: the query heads.
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Causal rows: both, only causal, or only non-causal.
    #[arg(long, value_enum, default_value = "both")]
    pub causal: CausalArg,
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    #[arg(long, default_value_t = 30)]
    pub iters: usize,
    /// One JSON object per row on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also time cubek-attention 0.2 (the upstream CubeCL attention) on the same device and
    /// shapes (needs the `peer-cubek` build feature; rows say so when it is missing).
    #[arg(long)]
    pub peers: bool,
    /// Instead of the grid: the host time one call of the device-tensor path costs on CUDA
    /// (`Session::run_cuda`, caller-owned buffers, enqueue only) next to a launch on the
    /// session's own buffers (`Session::execute`), at a decode shape (batch 8, 32 q heads over
    /// 8 KV heads, q_len 1, kv_len 8192, head dim 128, f16).
    #[arg(long)]
    pub api_overhead: bool,
    /// K and V of every row in a paged cache of pages of N keys (see `quattn run --page-size`).
    #[arg(long)]
    pub page_size: Option<usize>,
    /// Q, K, V, O layout of the grid's problems (a paged cache's pools have their own).
    #[arg(long, value_enum, default_value = "bhsd")]
    pub layout: LayoutArg,
    /// Instead of the grid: one variable-length batch per head dim (and causal choice) of these
    /// comma-separated sequence lengths (queries and keys alike), heads = width / head_dim.
    #[arg(long, value_delimiter = ',')]
    pub varlen: Vec<usize>,
    #[command(flatten)]
    pub mods: ModifierArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum CausalArg {
    Both,
    Causal,
    NonCausal,
}

#[derive(Args, Clone, Debug)]
pub struct SelftestArgs {
    /// Devices to test (comma-separated); default: every device present.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub devices: Vec<DeviceArg>,
    /// A shorter matrix.
    #[arg(long)]
    pub quick: bool,
    /// One JSON object per case on stdout.
    #[arg(long)]
    pub json: bool,
    /// Only the case groups whose name contains this: `matrix` (every precision x shape x
    /// family), `mods` (the score modifiers), `varlen` (variable-length batches),
    /// `int8-prepass`, `fp8` (the native FP8 prepass and CUDA entry points), `device-tensors`.
    #[arg(long)]
    pub only: Option<String>,
    /// Run only shard I of N (`I/N`, 0-based): cases are dealt round-robin, so N processes with
    /// I = 0..N together run the whole matrix once (compiles dominate on a GPU and run in
    /// parallel across processes).
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
    /// Also run N differential-fuzzing cases per seed (`quattn::fuzz`: random shapes, precisions,
    /// strategies, strides, scales and inputs against the f64 reference and the emulation) on
    /// every device, for a fixed seed and one that changes every run, plus the NaN-policy,
    /// overflow and determinism checks on every kernel family; counted like the other cases.
    #[arg(long, value_name = "N")]
    pub fuzz: Option<u64>,
    /// With --fuzz: this seed only (decimal or 0x hex; the seed a failure printed), instead of
    /// the fixed and the rotating one.
    #[arg(long, value_parser = parse_seed, requires = "fuzz")]
    pub fuzz_seed: Option<u64>,
    /// Skip the precision x shape matrix and the prepass / device-tensor cases (with --fuzz:
    /// the reliability cases alone).
    #[arg(long)]
    pub no_matrix: bool,
}

fn parse_seed(s: &str) -> Result<u64, String> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("seed `{s}`: {e}"))
}

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("expected I/N, got `{s}`"))?;
    let i: usize = i.trim().parse().map_err(|e| format!("shard index `{i}`: {e}"))?;
    let n: usize = n.trim().parse().map_err(|e| format!("shard count `{n}`: {e}"))?;
    if n == 0 || i >= n {
        return Err(format!("shard {i}/{n}: need 0 <= I < N"));
    }
    Ok((i, n))
}

#[derive(Args, Clone, Debug)]
pub struct KernelsArgs {
    /// Architectures to compile for (comma-separated, e.g. sm_90,sm_100a); default: every target
    /// of every kernel.
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// One JSON object per (kernel, arch) on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Clone, Debug)]
pub struct SoakArgs {
    /// Where to run.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceArg,
    /// CUDA device ordinal (with --device cuda).
    #[arg(long, default_value_t = 0)]
    pub ordinal: usize,
    /// Calls in all.
    #[arg(long, default_value_t = 10_000)]
    pub calls: usize,
    /// Calls before the reference sample of memory (every kernel compiled, pools grown).
    #[arg(long, default_value_t = 1_000)]
    pub warmup: usize,
    /// A memory sample every this many calls (printed with --json).
    #[arg(long, default_value_t = 1_000)]
    pub sample_every: usize,
    /// Distinct generator cases called round-robin.
    #[arg(long, default_value_t = 64)]
    pub classes: usize,
    /// Kernel configurations the cases are drawn from.
    #[arg(long, default_value_t = 12)]
    pub kernels: usize,
    /// Longest query or key sequence of a case.
    #[arg(long, default_value_t = 600)]
    pub max_len: usize,
    /// Bound on batch · heads · q_len · kv_len · (head dims) of a case.
    #[arg(long, default_value_t = 2.0e7)]
    pub max_work: f64,
    /// Generator seed of the cases.
    #[arg(long, value_parser = parse_seed, default_value = "0x50a6")]
    pub seed: u64,
    /// One JSON object per memory sample on stdout.
    #[arg(long)]
    pub json: bool,
}
