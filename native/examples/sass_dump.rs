//! Dumps the SASS of every wgmma variant (f16 and INT8) into a folder, for before/after diffs
//! of refactors that must not change the machine code. No GPU needed.
//!
//! `cargo run --release -p quattn-native --features cuda --example sass_dump -- DIR`
use quattn_native::{sass, Arch, Int8WgmmaConfig, KernelCache, WgmmaConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).ok_or("usage: sass_dump DIR")?);
    std::fs::create_dir_all(&dir)?;
    let cache = KernelCache::new(None);
    let mut reqs = Vec::new();
    for c in WgmmaConfig::all() {
        reqs.push(c.request(Arch::Sm90a)?);
    }
    for c in Int8WgmmaConfig::all() {
        reqs.push(c.request(Arch::Sm90a)?);
    }
    for req in reqs {
        let compiled = cache.get_or_compile(&req)?;
        std::fs::write(dir.join(format!("{}.sass", req.kernel)), sass::disassemble(&compiled.cubin)?)?;
    }
    Ok(())
}
