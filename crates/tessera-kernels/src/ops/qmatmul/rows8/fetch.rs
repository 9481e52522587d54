//! How the interleaved kernels ask for the codes they read next: a pass streams each
//! group's codes once (decode) or re-reads them from L1 for each of its activation rows
//! (a batch), and the hardware prefetcher alone left decode at 0.80× of these software
//! prefetches (docs/performance.md). Shared by every instance: `dots_with`'s, `planes`
//! and `amx`.

/// Where and how far ahead a pass asks for the codes it reads next ([`prefetch_pair`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fetch {
    /// Into L1, [`PREFETCH_PAIRS`] ahead.
    L1,
    /// Into L2 (x86; L1 on Arm), [`PREFETCH_PAIRS`] ahead.
    L2,
    /// Into L2 [`FAR_PAIRS`] ahead and on into L1 [`NEAR_PAIRS`] ahead (x86; on Arm as
    /// [`Fetch::L1`], untimed there).
    Staged,
}

impl Fetch {
    /// How a pass of `rows` activation rows fetches its codes.
    ///
    /// A batch pass (4 or more rows) reads each group twice or more from L1 beside its
    /// activation records (~13 KiB for 16 rows at K = 576), and the next group's codes
    /// fetched into L1 as well filled a 32 KiB L1D: the Q8_0 LM head of a 16-stream step,
    /// whose weights stream from DRAM, took 2.09–2.37 ms (min of each round's samples)
    /// against 1.85–1.88 with L2 prefetches (host C, AMD Zen 4, 2026-12-03, `tessera bench
    /// qmatmul --dtype q8_0 --shape 16x49152x576 --variant avx512-vnni-r8`, 3 alternated
    /// rounds): [`Fetch::L2`].
    ///
    /// One and two rows (decode, whose codes are read once) stage them. Host H (Intel,
    /// 2026-12-04, `tessera bench qmatmul --dtype D --shape S --variant avx512-vnni-a16
    /// --json`, cold medians, 3 alternated rounds), against the one L1 prefetch 8 pairs
    /// ahead: Q4_1 1×576×576 11.0–11.3 → 10.5–10.8 µs, 1×960×576 15.0–15.4 → 14.5–15.1,
    /// 1×3072×576 42.6–45.6 → 40.8–42.0, 1×576×1536 26.3–28.2 → 25.0–25.2, the Q8_0 LM
    /// head 1163–1179 → 1077–1142; `tessera bench-model --prompt-tokens 64 --gen-tokens
    /// 128 --runs 3` decode 278–290 → 297–319 tok/s. L2 distances of 12–24 pairs and L1
    /// ones of 2–6 were within noise of these; L2 alone 8 pairs ahead was slower there
    /// (576×576 10.9–11.0 → 11.2–11.3 µs, 3072×576 41.7–42.6 → 43.5–44.6) and no faster
    /// on host C (AMD Zen 4, 1×3072×576). Our reading, not measured directly: the L2
    /// prefetch keeps more lines in flight than the L1's fill buffers hold, and the L1
    /// one then finds them in L2. Unmeasured on AMD and AVX2 hosts, which take it too.
    /// Each line needs its own L2 prefetch: asking for every other one (leaving the rest
    /// to the hardware streamer) was ~20% slower on host H (2026-12-05, the command above,
    /// 3 alternated rounds: 576×576 12.6–13.0 µs against 10.5–10.8, medians); so was adding
    /// L2 prefetches of the scales and minima 32 chunks ahead (2–9% by shape, 4 rounds),
    /// or asking for a thread's first 16 pairs at once at its first group (0–10%, 4
    /// rounds), as paged attention's chunks do: more lines asked for at once is slower.
    #[inline(always)]
    pub(super) const fn for_rows(rows: usize) -> Self {
        if rows >= 4 {
            Fetch::L2
        } else {
            Fetch::Staged
        }
    }
}

/// Chunk pairs the codes are prefetched ahead: 2–3 KiB. The hardware prefetcher alone
/// left decode up at 0.80× and the LM head at 0.87× of this (docs/performance.md); 4
/// pairs ahead was slower, 16 no different.
const PREFETCH_PAIRS: usize = 8;

/// [`Fetch::Staged`]'s distance into L2: 4 KiB of a group's 4-bit codes, 8 of bytes.
const FAR_PAIRS: usize = 16;

/// [`Fetch::Staged`]'s distance into L1, from the L2.
const NEAR_PAIRS: usize = 2;

/// Prefetches chunk pair `pair + D` of a group whose codes start at `codes`
/// (`pair_bytes` a pair, `group_bytes` the group) for each distance D `fetch` asks for:
/// every cache line of it, as the kernel reads all of them. Past the group's end it
/// follows the rows' next call, which starts `groups` groups on (the call's count; a
/// constant once inlined). Groups lie one after another, and a call covering two (zmm)
/// next reads the two after them: running into its own second group instead left the
/// next call's second group to demand misses (Q4_1 16×3072×576 cold 118–120 µs against
/// 107–110, host H).
#[inline(always)]
pub(super) fn prefetch_pair(
    codes: *const u8,
    pair: usize,
    (pair_bytes, group_bytes): (usize, usize),
    groups: usize,
    fetch: Fetch,
) {
    let at = |ahead: usize| {
        let mut ahead = (pair + ahead) * pair_bytes;
        if groups > 1 && ahead >= group_bytes {
            ahead += (groups - 1) * group_bytes * (ahead / group_bytes);
        }
        // Past the last rows this reads past the allocation, which a prefetch may do:
        // it never faults, and `wrapping_add` keeps the address arithmetic defined.
        codes.wrapping_add(ahead)
    };
    let lines = |p: *const u8, to_l2: bool| {
        for line in (0..pair_bytes).step_by(64) {
            prefetch_line(p.wrapping_add(line), to_l2);
        }
    };
    match fetch {
        Fetch::L1 => lines(at(PREFETCH_PAIRS), false),
        Fetch::L2 => lines(at(PREFETCH_PAIRS), true),
        // Arm asks for L1 either way: no Arm timing exists to choose otherwise.
        Fetch::Staged if cfg!(target_arch = "aarch64") => lines(at(PREFETCH_PAIRS), false),
        Fetch::Staged => {
            lines(at(FAR_PAIRS), true);
            lines(at(NEAR_PAIRS), false);
        }
    }
}

/// Asks for the line holding `p`: into L2 when `to_l2` on x86, else (and always on Arm)
/// into L1. Any address: a prefetch never faults.
#[inline(always)]
fn prefetch_line(p: *const u8, to_l2: bool) {
    // SAFETY: a prefetch only hints the cache; SSE is baseline on x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        if to_l2 {
            _mm_prefetch::<{ _MM_HINT_T1 }>(p.cast())
        } else {
            _mm_prefetch::<{ _MM_HINT_T0 }>(p.cast())
        }
    };
    #[cfg(target_arch = "aarch64")]
    let _ = to_l2;
    // SAFETY: PRFM never faults and touches no register but its address operand.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p,
            options(nostack, readonly, preserves_flags))
    };
}
