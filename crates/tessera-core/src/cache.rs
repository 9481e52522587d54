//! The CPU's data caches as Linux reports them (`/sys/devices/system/cpu/cpu0/cache`),
//! read once. Kernels size their blocks from the L1D and L2 (a block tuned for one
//! host's 48 KiB L1 spills on a 32 KiB one); benchmarks size their cold rotation sets past
//! the largest cache. Where sysfs says nothing (not Linux, a sandbox) every size is
//! None and callers keep the defaults they document.

use std::sync::OnceLock;

/// Sizes of CPU 0's data (or unified) caches, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheSizes {
    /// The level-1 data cache.
    pub l1d: Option<usize>,
    /// The level-2 (data or unified) cache of one core.
    pub l2: Option<usize>,
    /// The largest data or unified cache (the last level).
    pub largest: Option<usize>,
}

impl CacheSizes {
    /// This host's, from sysfs (read once).
    pub fn get() -> CacheSizes {
        static SIZES: OnceLock<CacheSizes> = OnceLock::new();
        *SIZES.get_or_init(|| read_sysfs("/sys/devices/system/cpu/cpu0/cache"))
    }
}

fn read_sysfs(dir: &str) -> CacheSizes {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return CacheSizes::default();
    };
    let mut sizes = CacheSizes::default();
    for entry in entries.flatten() {
        let path = entry.path();
        let read = |name: &str| std::fs::read_to_string(path.join(name)).ok();
        let Some(kind) = read("type") else { continue };
        if kind.trim() == "Instruction" {
            continue;
        }
        let Some(bytes) = read("size").as_deref().and_then(parse_cache_size) else {
            continue;
        };
        match read("level").as_deref().map(str::trim) {
            Some("1") => sizes.l1d = Some(bytes),
            Some("2") => sizes.l2 = Some(bytes),
            _ => {}
        }
        sizes.largest = sizes.largest.max(Some(bytes));
    }
    sizes
}

/// Bytes in a sysfs cache size (`48K`, `2048K`, `32M`, `307200K`, or plain bytes).
pub fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale).filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sysfs sizes as Linux writes them; anything else is no size (the default holds).
    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("48K\n"), Some(48 << 10));
        assert_eq!(parse_cache_size("307200K"), Some(300 << 20));
        assert_eq!(parse_cache_size("32M"), Some(32 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        for bad in ["", "K", "0K", "12Q", "-1K", "99999999999999999999G", "1.5M"] {
            assert_eq!(parse_cache_size(bad), None, "{bad:?}");
        }
    }

    /// A sysfs tree as Linux lays it out (Zen 3: 32K L1D and L1I, 512K L2, 32M L3),
    /// with an unreadable entry among them: the L1 instruction cache is not the L1D.
    #[test]
    fn the_tree_gives_the_l1d_the_l2_and_the_largest_cache() {
        let root = std::env::temp_dir().join(format!("tessera-cache-{}", std::process::id()));
        let caches = [
            ("index0", "Data", "1", "32K"),
            ("index1", "Instruction", "1", "64K"),
            ("index2", "Unified", "2", "512K"),
            ("index3", "Unified", "3", "32768K"),
            ("index4", "Unified", "4", "garbage"),
        ];
        for (dir, kind, level, size) in caches {
            let d = root.join(dir);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        let got = read_sysfs(root.to_str().unwrap());
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(got.l1d, Some(32 << 10));
        assert_eq!(got.l2, Some(512 << 10));
        assert_eq!(got.largest, Some(32 << 20));
        assert_eq!(read_sysfs("/nonexistent"), CacheSizes::default());
    }
}
