//! KV block accounting for the batching engine: a fixed pool of [`BLOCK`]-position blocks,
//! reference counts, and automatic prefix caching.
//!
//! Every full block is keyed by a hash of its tokens chained with the hash of everything
//! before it (as vLLM's automatic prefix caching does), so equal keys mean equal prefixes
//! and therefore equal keys and values. A new sequence takes the cached blocks of its
//! longest matching prefix (reference count + 1) and computes only the rest. Blocks are
//! shared only when full, so nobody ever writes into a shared block and no copy-on-write
//! is needed.
//!
//! A block whose count drops to zero keeps its contents and its key: it moves to an LRU
//! list, still findable by a later prefix, until an allocation needs it (free blocks
//! without a key go first, then the least recently released cached block). The tokens of
//! each cached block are stored beside its key and compared on a hit, so a 64-bit hash
//! collision cannot hand a sequence someone else's keys.

use crate::kv_cache::BLOCK;
use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// The chained key of the full block holding `tokens`, after a prefix keyed `parent`
/// (0 for the first block).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What a cached block holds: its key, its parent's key and its tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CachedBlock {
    hash: u64,
    parent: u64,
    tokens: [u32; BLOCK],
}

/// Counters for reports and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks referenced by at least one sequence.
    pub used: usize,
    /// Unreferenced blocks that still hold a cached prefix (reusable or evictable).
    pub cached: usize,
    /// Prompt positions looked up in the prefix cache, and those found.
    pub lookup_tokens: u64,
    /// Of those, positions found in the prefix cache.
    pub hit_tokens: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
}

/// The pool's bookkeeping (the keys and values themselves live in a
/// [`crate::kv_cache::KvStore`] of the same number of blocks). Crate-internal: the
/// scheduler is its only user and upholds what its methods assume (block ids from this
/// manager, full blocks of [`BLOCK`] tokens).
#[derive(Debug)]
pub(crate) struct BlockManager {
    refs: Vec<u32>,
    /// Never-keyed (or evicted) unreferenced blocks.
    free: Vec<u32>,
    /// Key of each block that has one.
    meta: Vec<Option<CachedBlock>>,
    by_hash: HashMap<u64, u32>,
    /// Unreferenced keyed blocks by release time (oldest first).
    lru: BTreeMap<u64, u32>,
    /// Each block's LRU stamp while it is in `lru`.
    stamp: Vec<u64>,
    clock: u64,
    prefix_caching: bool,
    stats: BlockStats,
}

impl BlockManager {
    /// A pool of `total` blocks; `prefix_caching` off makes every release a plain free.
    pub(crate) fn new(total: usize, prefix_caching: bool) -> Self {
        BlockManager {
            refs: vec![0; total],
            free: (0..total as u32).rev().collect(),
            meta: vec![None; total],
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            stamp: vec![0; total],
            clock: 0,
            prefix_caching,
            stats: BlockStats {
                total,
                ..BlockStats::default()
            },
        }
    }

    pub(crate) fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks an allocation can take now (free plus evictable).
    pub(crate) fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    pub(crate) fn stats(&self) -> BlockStats {
        BlockStats {
            used: self.total() - self.available(),
            cached: self.lru.len(),
            ..self.stats
        }
    }

    /// Takes the cached blocks of the longest prefix of `tokens` (whole blocks, at most
    /// `max_tokens` positions) and returns them with their keys; each gets a reference.
    pub(crate) fn acquire_prefix(
        &mut self,
        tokens: &[u32],
        max_tokens: usize,
    ) -> (Vec<u32>, Vec<u64>) {
        let (mut blocks, mut hashes) = (Vec::new(), Vec::new());
        let whole = max_tokens.min(tokens.len()) / BLOCK;
        self.stats.lookup_tokens += (whole * BLOCK) as u64;
        if !self.prefix_caching {
            return (blocks, hashes);
        }
        let mut parent = 0;
        for chunk in tokens.chunks_exact(BLOCK).take(whole) {
            let hash = block_hash(parent, chunk);
            let Some(&b) = self.by_hash.get(&hash) else {
                break;
            };
            let m = self.meta[b as usize]
                .as_ref()
                .expect("hashed blocks have meta");
            if m.parent != parent || m.tokens[..] != *chunk {
                break; // a collision: not the same prefix
            }
            self.take_ref(b);
            blocks.push(b);
            hashes.push(hash);
            parent = hash;
        }
        self.stats.hit_tokens += (blocks.len() * BLOCK) as u64;
        (blocks, hashes)
    }

    fn take_ref(&mut self, b: u32) {
        if self.refs[b as usize] == 0 {
            self.lru.remove(&self.stamp[b as usize]);
        }
        self.refs[b as usize] += 1;
    }

    /// Allocates `n` fresh blocks (each with one reference), or none when fewer than `n`
    /// are available.
    pub(crate) fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.available() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = match self.free.pop() {
                Some(b) => b,
                None => {
                    let (_, b) = self.lru.pop_first().expect("counted in available()");
                    let m = self.meta[b as usize]
                        .take()
                        .expect("cached blocks have meta");
                    self.by_hash.remove(&m.hash);
                    self.stats.evictions += 1;
                    b
                }
            };
            self.refs[b as usize] = 1;
            out.push(b);
        }
        Some(out)
    }

    /// Keys full block `index` of a sequence (`tokens` are its positions, `parent` the
    /// previous block's key) so later prefixes can find it; returns its key. A block
    /// whose key another block already holds stays unkeyed (both hold the same values).
    pub(crate) fn register(&mut self, block: u32, parent: u64, tokens: &[u32]) -> u64 {
        let hash = block_hash(parent, tokens);
        if self.prefix_caching
            && self.meta[block as usize].is_none()
            && !self.by_hash.contains_key(&hash)
        {
            let mut t = [0u32; BLOCK];
            t.copy_from_slice(tokens);
            self.meta[block as usize] = Some(CachedBlock {
                hash,
                parent,
                tokens: t,
            });
            self.by_hash.insert(hash, block);
        }
        hash
    }

    /// Drops one reference to each block; blocks nobody holds become free (or cached,
    /// LRU-ordered, when they carry a key).
    pub(crate) fn release(&mut self, blocks: &[u32]) {
        // Later blocks of a sequence are released first so that, under eviction, a
        // prefix's tail goes before its head (the head is what other prompts share).
        for &b in blocks.iter().rev() {
            let r = &mut self.refs[b as usize];
            debug_assert!(*r > 0, "block {b} released more often than taken");
            *r = r.saturating_sub(1);
            if *r > 0 {
                continue;
            }
            if self.meta[b as usize].is_some() {
                self.clock += 1;
                self.stamp[b as usize] = self.clock;
                self.lru.insert(self.clock, b);
            } else {
                self.free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn shared_prefixes_are_found_and_counted() {
        let mut m = BlockManager::new(8, true);
        let a = toks(1, 3 * BLOCK);
        let blocks = m.allocate(3).unwrap();
        let mut parent = 0;
        for (i, &b) in blocks.iter().enumerate() {
            parent = m.register(b, parent, &a[i * BLOCK..(i + 1) * BLOCK]);
        }
        // Same first two blocks, different third.
        let mut b = a.clone();
        b[2 * BLOCK + 3] = 7;
        let (got, hashes) = m.acquire_prefix(&b, b.len());
        assert_eq!(got, blocks[..2]);
        assert_eq!(hashes.len(), 2);
        assert_eq!(m.stats().hit_tokens, 2 * BLOCK as u64);
        // At most 20 tokens: one whole block.
        let (one, _) = m.acquire_prefix(&a, 20);
        assert_eq!(one, blocks[..1]);
        m.release(&one);
        m.release(&got);
        m.release(&blocks);
        assert_eq!(m.stats().used, 0);
        assert_eq!(m.stats().cached, 3);
        // Released blocks are still found until evicted.
        let (again, _) = m.acquire_prefix(&a, a.len());
        assert_eq!(again, blocks);
        m.release(&again);
    }

    #[test]
    fn eviction_takes_free_blocks_first_then_least_recent() {
        let mut m = BlockManager::new(4, true);
        let a = toks(2, BLOCK);
        let b = toks(3, BLOCK);
        let ba = m.allocate(1).unwrap();
        m.register(ba[0], 0, &a);
        let bb = m.allocate(1).unwrap();
        m.register(bb[0], 0, &b);
        m.release(&ba);
        m.release(&bb);
        // Two free blocks go first: both cached prefixes survive.
        let x = m.allocate(2).unwrap();
        assert!(!x.contains(&ba[0]) && !x.contains(&bb[0]));
        assert_eq!(m.acquire_prefix(&a, BLOCK).0, ba);
        m.release(&ba);
        // Now `b` is the least recently released: it goes first.
        let y = m.allocate(1).unwrap();
        assert_eq!(y, bb);
        assert!(m.acquire_prefix(&b, BLOCK).0.is_empty());
        assert_eq!(m.acquire_prefix(&a, BLOCK).0, ba);
        assert_eq!(m.stats().evictions, 1);
        assert!(m.allocate(1).is_none(), "everything is referenced");
    }

    #[test]
    fn a_colliding_key_is_not_a_hit() {
        let mut m = BlockManager::new(2, true);
        let a = toks(4, BLOCK);
        let blk = m.allocate(1).unwrap();
        let h = m.register(blk[0], 0, &a);
        // Forge a collision: another prefix's key pointing at this block.
        let other = toks(5, BLOCK);
        m.by_hash.insert(block_hash(0, &other), blk[0]);
        assert!(m.acquire_prefix(&other, BLOCK).0.is_empty());
        assert_eq!(m.acquire_prefix(&a, BLOCK).1, vec![h]);
    }

    #[test]
    fn without_prefix_caching_nothing_is_kept() {
        let mut m = BlockManager::new(2, false);
        let a = toks(6, BLOCK);
        let blk = m.allocate(1).unwrap();
        m.register(blk[0], 0, &a);
        m.release(&blk);
        assert!(m.acquire_prefix(&a, BLOCK).0.is_empty());
        assert_eq!(m.stats().cached, 0);
        assert_eq!(m.available(), 2);
    }
}
