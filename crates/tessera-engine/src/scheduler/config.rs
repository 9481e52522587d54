//! A scheduler's limits ([`SchedulerConfig`]) and the KV budget they start from, apart
//! from the scheduler's running state: what a front end (`tessera serve` and
//! `bench-serve`) builds from its flags and checks, the model-free limits
//! ([`SchedulerConfig::check_limits`]) before it loads a model.

#[cfg(doc)]
use super::Scheduler;
use crate::kv_cache::{KvDtype, KvStore, BLOCK};
use crate::{Error, Result};

/// Limits of a scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_seqs: usize,
    /// Most tokens in one step (decode tokens plus prompt chunks).
    pub max_batch_tokens: usize,
    /// KV blocks of [`BLOCK`] positions in the pool.
    pub kv_blocks: usize,
    /// How the KV pool stores keys and values.
    pub kv_dtype: KvDtype,
    /// Reuse cached blocks of identical prompt prefixes.
    pub prefix_caching: bool,
    /// While sequences decode, size the steps' prompt chunks so a step takes at most
    /// this many times the decode-only step of the running and waiting sequences (up to
    /// `max_seqs`), as measured while running (`pacing`'s docs): the decoding streams'
    /// inter-token latency against the prefill rate of prompts that arrive beside them.
    /// `None` (the default): only `max_batch_tokens` bounds a step, and the schedule
    /// does not depend on timing.
    pub itl_factor: Option<f64>,
}

/// Most an [`SchedulerConfig::itl_factor`] may be: a larger one is a typo, refused like
/// the other absurd limits.
pub const MAX_ITL_FACTOR: f64 = 1000.0;

/// Fraction of physical memory the KV pool takes when no budget is given.
pub const DEFAULT_KV_FRACTION: f64 = 0.25;

impl SchedulerConfig {
    /// Limits with a KV pool of `kv_bytes` (whole blocks; at least one), prefix caching
    /// on and no pacing.
    pub fn with_memory(
        model: &crate::llama::Config,
        max_seqs: usize,
        max_batch_tokens: usize,
        kv_bytes: u64,
        kv_dtype: KvDtype,
    ) -> Self {
        let per = KvStore::block_bytes(model, kv_dtype) as u64;
        SchedulerConfig {
            max_seqs,
            max_batch_tokens,
            kv_blocks: (kv_bytes / per.max(1)).min(usize::MAX as u64) as usize,
            kv_dtype,
            prefix_caching: true,
            itl_factor: None,
        }
    }

    /// The default KV budget: [`DEFAULT_KV_FRACTION`] of physical memory, but no more
    /// than `max_seqs` full contexts need.
    pub fn default_kv_bytes(model: &crate::llama::Config, max_seqs: usize, dtype: KvDtype) -> u64 {
        let per_seq =
            model.context.div_ceil(BLOCK) as u64 * KvStore::block_bytes(model, dtype) as u64;
        let ram = physical_memory().unwrap_or(8 << 30);
        ((ram as f64 * DEFAULT_KV_FRACTION) as u64).min(per_seq.saturating_mul(max_seqs as u64))
    }

    /// Checks the limits that need no model: sequences at once, tokens per step and the
    /// pacing factor. [`SchedulerConfig::validate`] starts with it; a front end calls it
    /// before it loads (or downloads) a model, so a bad flag costs no wait.
    pub fn check_limits(
        max_seqs: usize,
        max_batch_tokens: usize,
        itl_factor: Option<f64>,
    ) -> Result<()> {
        if max_seqs == 0 || max_seqs > 1 << 16 {
            return Err(Error::Model(format!(
                "max-seqs {max_seqs} must be in 1..=65536"
            )));
        }
        if max_batch_tokens == 0 || max_batch_tokens > 1 << 20 {
            return Err(Error::Model(format!(
                "max-batch-tokens {max_batch_tokens} must be in 1..=1048576"
            )));
        }
        if let Some(f) = itl_factor {
            if !(f > 1.0 && f <= MAX_ITL_FACTOR) {
                return Err(Error::Model(format!(
                    "itl-factor {f} must be above 1 and at most {MAX_ITL_FACTOR} (leave it out for \
                     no pacing)"
                )));
            }
        }
        Ok(())
    }

    /// Checks the limits (what [`Scheduler::new`] checks first), so a front end can
    /// report a bad one before it announces the pool. The KV size is checked against
    /// `model`'s block size.
    pub fn validate(&self, model: &crate::llama::Config) -> Result<()> {
        Self::check_limits(self.max_seqs, self.max_batch_tokens, self.itl_factor)?;
        if self.kv_blocks == 0 {
            return Err(Error::Model(format!(
                "the KV budget holds no block of {BLOCK} positions"
            )));
        }
        let block = KvStore::block_bytes(model, self.kv_dtype);
        if self
            .kv_blocks
            .checked_mul(block)
            .is_none_or(|b| b > crate::kv_cache::MAX_BYTES)
        {
            return Err(Error::Model(format!(
                "a KV pool of {} blocks of {BLOCK} positions is too large (over {} GiB)",
                self.kv_blocks,
                crate::kv_cache::MAX_BYTES >> 30
            )));
        }
        Ok(())
    }
}

/// Physical memory in bytes (Linux `/proc/meminfo`), if known.
pub fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
