//! Compile targets. NVRTC compiles for exactly one of these; the `a` variants unlock
//! architecture-specific instructions (wgmma on sm_90a, tcgen05 on sm_100a, block-scaled MMA on
//! sm_120a) and run only on that exact chip.

use std::fmt;

/// A GPU compile target, as named by `-arch=`.
/// Serialized as its `-arch=` spelling (`"sm_90a"`), the name users and scripts know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Arch {
    #[serde(rename = "sm_80")]
    Sm80,
    #[serde(rename = "sm_86")]
    Sm86,
    #[serde(rename = "sm_89")]
    Sm89,
    #[serde(rename = "sm_90")]
    Sm90,
    #[serde(rename = "sm_90a")]
    Sm90a,
    #[serde(rename = "sm_100a")]
    Sm100a,
    #[serde(rename = "sm_120a")]
    Sm120a,
}

impl Arch {
    /// Every target this crate knows, oldest first.
    pub const ALL: [Arch; 7] =
        [Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90, Arch::Sm90a, Arch::Sm100a, Arch::Sm120a];

    /// The `-arch=` spelling, e.g. `sm_90a`.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm86 => "sm_86",
            Arch::Sm89 => "sm_89",
            Arch::Sm90 => "sm_90",
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
            Arch::Sm120a => "sm_120a",
        }
    }

    /// Parses `sm_90a` / `90a` / `sm90a`.
    pub fn parse(s: &str) -> Option<Arch> {
        let t = s.trim().trim_start_matches("sm_").trim_start_matches("sm");
        Arch::ALL.into_iter().find(|a| a.as_str().trim_start_matches("sm_") == t)
    }

    /// Compute capability `(major, minor)` of the chip this target runs on.
    pub fn compute_capability(self) -> (u32, u32) {
        match self {
            Arch::Sm80 => (8, 0),
            Arch::Sm86 => (8, 6),
            Arch::Sm89 => (8, 9),
            Arch::Sm90 | Arch::Sm90a => (9, 0),
            Arch::Sm100a => (10, 0),
            Arch::Sm120a => (12, 0),
        }
    }

    /// True for the architecture-specific (`a`) targets.
    pub fn is_arch_specific(self) -> bool {
        matches!(self, Arch::Sm90a | Arch::Sm100a | Arch::Sm120a)
    }

    /// Targets a device of compute capability `(major, minor)` can run, most specific first:
    /// an H100 (9.0) runs `sm_90a` and `sm_90`; an RTX 4090 (8.9) runs `sm_89`; an unknown newer
    /// chip runs the newest generic target below it (cubins of generic targets are forward
    /// compatible within a major version only, hence the major check).
    pub fn for_compute_capability(major: u32, minor: u32) -> Vec<Arch> {
        let exact: Vec<Arch> = Arch::ALL
            .into_iter()
            .filter(|a| a.compute_capability() == (major, minor))
            .rev()
            .collect();
        if !exact.is_empty() {
            return exact;
        }
        Arch::ALL
            .into_iter()
            .rev()
            .filter(|a| !a.is_arch_specific())
            .find(|a| {
                let (ma, mi) = a.compute_capability();
                ma == major && mi <= minor
            })
            .into_iter()
            .collect()
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips() {
        for a in Arch::ALL {
            assert_eq!(Arch::parse(a.as_str()), Some(a));
        }
        assert_eq!(Arch::parse("90a"), Some(Arch::Sm90a));
        assert_eq!(Arch::parse("sm_75"), None);
    }

    #[test]
    fn hopper_gets_arch_specific_first() {
        assert_eq!(Arch::for_compute_capability(9, 0), vec![Arch::Sm90a, Arch::Sm90]);
        assert_eq!(Arch::for_compute_capability(8, 7), vec![Arch::Sm86]);
        assert_eq!(Arch::for_compute_capability(12, 0), vec![Arch::Sm120a]);
        assert!(Arch::for_compute_capability(7, 5).is_empty());
    }
}
