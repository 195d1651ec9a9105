//! Dumps the SASS of registry variants into a folder, one file per (variant, target), for
//! before/after diffs of refactors that must not change the machine code. No GPU needed.
//!
//! `cargo run --release -p quattn-native --example sass_dump -- DIR [FAMILY...]`
//!
//! Without FAMILY every variant of [`NativeKernelId::all`] is dumped for every target it is
//! compiled for; with FAMILY (e.g. `fwd_wgmma fwd_wgmma_int8`) only those families. Files are
//! named `<variant>.<arch>.sass`; the variant names are unique across the registry.
use quattn_native::{sass, KernelCache, KernelVariant, NativeKernelId};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: sass_dump DIR [FAMILY...]")?);
    let families: Vec<String> = args.collect();
    std::fs::create_dir_all(&dir)?;
    let cache = KernelCache::new(None);
    let mut n = 0usize;
    for id in NativeKernelId::all() {
        if !families.is_empty() && !families.iter().any(|f| f == id.family()) {
            continue;
        }
        for &arch in id.targets() {
            let req = KernelVariant::request(&id, arch)?;
            let compiled = cache.get_or_compile(&req)?;
            let file = dir.join(format!("{}.{}.sass", KernelVariant::name(&id), arch.as_str()));
            std::fs::write(file, sass::disassemble(&compiled.cubin)?)?;
            n += 1;
        }
    }
    eprintln!("sass_dump: {n} (variant, target) pairs into {}", dir.display());
    Ok(())
}
