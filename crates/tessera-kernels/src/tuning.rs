//! Tuned configurations the kernels consult at run time.
//!
//! `tessera tune` searches an op's tunable space on this machine and saves the winners
//! (a JSON cache handled by `tessera-perf`, which checks the machine and the kernels'
//! version); the CLI installs the valid ones here at start-up. A kernel called with its
//! default configuration asks [`lookup`] for its (op, dtype, variant, shape bucket) and
//! falls back to its defaults when nothing was tuned, or when the entry was tuned for a
//! different tunable space (its checksum differs): never a stale configuration.

use crate::registry::{TuneConfig, TuneSpace};
use std::sync::RwLock;

/// One tuned configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedEntry {
    /// The op's registry name.
    pub op: String,
    /// The dtype, as it displays.
    pub dtype: String,
    /// The variant's label.
    pub variant: String,
    /// [`bucket`] of the problem's tuning dims.
    pub bucket: String,
    /// [`space_checksum`] of the space the search ran over.
    pub space: u64,
    /// The winning parameter values.
    pub config: Vec<(String, usize)>,
}

static TABLE: RwLock<Vec<TunedEntry>> = RwLock::new(Vec::new());

/// Replaces the installed table.
pub fn install(entries: Vec<TunedEntry>) {
    *TABLE.write().unwrap_or_else(|p| p.into_inner()) = entries;
}

/// Whether any tuned configuration is installed (lets callers skip building the key).
pub fn is_empty() -> bool {
    TABLE.read().unwrap_or_else(|p| p.into_inner()).is_empty()
}

/// Dims rounded up to powers of two: problems within a factor of two share a tuning.
pub fn bucket(dims: &[usize]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.next_power_of_two().to_string())
        .collect();
    parts.join("x")
}

/// FNV-1a over every parameter's name, default and choices: a tuning made for another
/// space (new choices, renamed parameters, a changed default) does not match.
pub fn space_checksum(space: &TuneSpace) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for p in &space.0 {
        eat(p.name.as_bytes());
        eat(&p.default.to_le_bytes());
        for c in &p.choices {
            eat(&c.to_le_bytes());
        }
        eat(b";");
    }
    h
}

/// The tuned configuration for this op/dtype/variant and problem dims, if any was
/// installed for exactly this tunable space. Values outside the space's choices are
/// ignored (the cache is user-editable JSON).
pub fn lookup(
    op: &str,
    dtype: &str,
    variant: &str,
    dims: &[usize],
    space: &TuneSpace,
) -> Option<TuneConfig> {
    let table = TABLE.read().unwrap_or_else(|p| p.into_inner());
    let (b, sum) = (bucket(dims), space_checksum(space));
    let e = table.iter().find(|e| {
        e.op == op && e.dtype == dtype && e.variant == variant && e.bucket == b && e.space == sum
    })?;
    let mut cfg = space.defaults();
    for p in &space.0 {
        if let Some(&(_, v)) = e.config.iter().find(|(n, _)| n == p.name) {
            if p.choices.contains(&v) {
                cfg.set(p.name, v);
            }
        }
    }
    Some(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::TuneParam;

    fn space(choices: Vec<usize>) -> TuneSpace {
        TuneSpace(vec![TuneParam {
            name: "kc",
            default: 256,
            choices,
        }])
    }

    #[test]
    fn lookup_matches_key_bucket_and_space() {
        let s = space(vec![128, 256, 512]);
        install(vec![TunedEntry {
            op: "demo".into(),
            dtype: "f32".into(),
            variant: "avx512".into(),
            bucket: bucket(&[1000, 64]),
            space: space_checksum(&s),
            config: vec![("kc".into(), 512)],
        }]);
        assert_eq!(bucket(&[1000, 64]), "1024x64");
        let hit = lookup("demo", "f32", "avx512", &[600, 33], &s).expect("same bucket");
        assert_eq!(hit.get("kc"), Some(512));
        assert!(
            lookup("demo", "f32", "avx512", &[2000, 64], &s).is_none(),
            "other bucket"
        );
        assert!(
            lookup("demo", "bf16", "avx512", &[1000, 64], &s).is_none(),
            "other dtype"
        );
        // A changed space (a choice added) invalidates the entry.
        assert!(lookup(
            "demo",
            "f32",
            "avx512",
            &[1000, 64],
            &space(vec![128, 256, 512, 1024])
        )
        .is_none());
        install(Vec::new());
        assert!(lookup("demo", "f32", "avx512", &[1000, 64], &s).is_none());

        // GEMM's run-time path reads the table (same test: the table is global).
        use crate::ops::gemm::{default_blocking, tune_space, tuned_blocking};
        use tessera_core::{DType, Isa};
        let isa = Isa::best();
        install(vec![TunedEntry {
            op: "gemm".into(),
            dtype: "f32".into(),
            variant: isa.name().into(),
            bucket: bucket(&[64, 64, 64]),
            space: space_checksum(&tune_space()),
            config: vec![
                ("kc".into(), 128),
                ("mc".into(), 48),
                ("kc_bogus".into(), 1),
            ],
        }]);
        let b = tuned_blocking(isa, DType::F32, 60, 50, 33);
        assert_eq!((b.kc, b.mc), (128, 48));
        assert_eq!(
            tuned_blocking(isa, DType::F32, 600, 50, 33).kc,
            default_blocking(isa).kc
        );
        assert_eq!(
            tuned_blocking(isa, DType::BF16, 60, 50, 33).kc,
            default_blocking(isa).kc
        );

        // So does paged attention's split size (chunk), keyed by its own dims.
        use crate::ops::paged_attention::{self as paged, tuned_chunk};
        let dims = paged::tune_dims(4, 4 * 300, 2, 64);
        install(vec![TunedEntry {
            op: "paged_attention".into(),
            dtype: "f32".into(),
            variant: isa.name().into(),
            bucket: bucket(&dims),
            space: space_checksum(&paged::tune_space()),
            config: vec![("chunk".into(), 128), ("threads".into(), 1)],
        }]);
        assert_eq!(tuned_chunk(isa, DType::F32, &dims), Some(128));
        // Mean context 280 shares the bucket; 64 sequences or bf16 do not.
        assert_eq!(
            tuned_chunk(isa, DType::F32, &paged::tune_dims(4, 4 * 280, 2, 64)),
            Some(128)
        );
        assert_eq!(
            tuned_chunk(isa, DType::F32, &paged::tune_dims(64, 64 * 300, 2, 64)),
            None
        );
        assert_eq!(tuned_chunk(isa, DType::BF16, &dims), None);
        install(Vec::new());
    }
}
