//! Prefill pacing: how many prompt tokens a step may carry beside running decodes.
//!
//! A fixed token budget cannot serve both ends of chunked prefill. A large one prefills
//! a long prompt quickly but stalls every decoding stream for each whole chunk (host B,
//! 8 streams, a 2,048-token prompt at the default 256 tokens a step: p99 inter-token
//! latency 22–27× the median without it, docs/performance.md); a small one keeps the
//! streams smooth but starves a prompt that arrives alone. What a prompt token costs
//! beside the decodes depends on the host, the activations' width, how many rows the
//! matmul kernels already run and the chunk's context (its attention), so the pacer does
//! not model it: it measures it.
//!
//! It keeps the time of recent decode-only steps per number of decode rows (the
//! baseline), and from every step that adds prompt tokens to decodes, the extra time per
//! prompt token. The next such step gets as many prompt tokens as keep it within
//! `factor` × the decode-only step of the batch that is forming, at least one: the
//! decoding sequences and those whose prompts are waiting or in flight (up to
//! `max_seqs`), each extra row priced as a prompt token unless that count has run
//! alone. Against the current decodes only, a burst of 16 prompts prefilled a few
//! tokens a step beside the first streams, whose steps would be 16 rows' soon anyway
//! (host B, 3 rounds: TTFT p50 4.3–4.8 s against 2.2–2.6 now and 1.8 unpaced; the
//! measurement in `7f60202`'s message). A decode count without a baseline first gets one
//! step of decodes alone, which measures it: while prompts keep every step mixed
//! nothing else would, and another count's baseline is no estimate (a step of 16
//! decodes is not one of 4). Counts are at most `max_seqs` and baselines are kept, so
//! these probe steps are few and a prompt always progresses. With no decoding sequence
//! a step is not paced: the token budget alone bounds it. Estimates are exponential
//! averages, so they follow a prompt whose attention grows chunk by chunk and forget a
//! step slowed by something else.
//!
//! Prompt work a caller runs between steps (the server's `echo` scoring, where every
//! position also computes its logits: several chunk tokens' cost) takes the margin the
//! last step left ([`Pacer::room_after`]), priced by its own measured time once it has
//! one: priced as chunk tokens, 8 streams' gaps during a scoring were 2–6× their median
//! at a factor of 1.5; priced by its own time, 1.4–1.6× (host B, 3 alternated rounds,
//! `8379af5`'s message; the current figure in docs/performance.md).
//!
//! Pacing is opt-in ([`SchedulerConfig::itl_factor`]): it makes step composition depend
//! on wall time (outputs do not, beyond rounding: batch invariance holds for any
//! chunking), and it slows every prompt that arrives beside streams, a burst of them
//! too (docs/performance.md, host B).
//!
//! [`SchedulerConfig::itl_factor`]: super::SchedulerConfig::itl_factor

use std::collections::BTreeMap;

/// Weight of the newest measurement in the running averages: about the last four steps
/// count, so a prompt's growing attention is followed within a few chunks.
const NEWEST_WEIGHT: f64 = 0.25;

/// Paces prompt chunks beside decodes ([module docs](self)).
#[derive(Clone, Debug)]
pub(crate) struct Pacer {
    factor: f64,
    /// Decode rows → averaged seconds of a step with only those decode rows.
    baseline: BTreeMap<usize, f64>,
    /// Averaged extra seconds per prompt token in steps that also decode.
    per_prompt_token: Option<f64>,
    /// Averaged seconds per position of prompt work run between steps (the server's
    /// scoring, where every position also computes its logits).
    per_between: Option<f64>,
}

impl Pacer {
    /// A pacer keeping mixed steps within `factor` (> 1) × a decode-only step.
    pub(crate) fn new(factor: f64) -> Self {
        Pacer {
            factor,
            baseline: BTreeMap::new(),
            per_prompt_token: None,
            per_between: None,
        }
    }

    /// Prompt tokens a step with `decodes` decode rows may add while `batch` sequences
    /// (≥ decodes: the running ones and those waiting, up to `max_seqs`) will decode
    /// once the prompts in flight have joined: unbounded with no decodes, none while
    /// their count has no baseline (the step measures it), else enough to keep the step
    /// within `factor` × the decode-only step of `batch` rows ([`Pacer::batch_step`]),
    /// at least 1.
    pub(crate) fn allowance(&self, decodes: usize, batch: usize) -> usize {
        if decodes == 0 {
            return usize::MAX;
        }
        let Some(&base) = self.baseline.get(&decodes) else {
            return 0;
        };
        let per = priced(self.per_prompt_token, base, decodes);
        let target = self.batch_step(decodes, batch.max(decodes), base, per);
        // `as` saturates: a huge ratio (free prompt tokens) is no limit.
        (((self.factor * target - base) / per).floor() as usize).max(1)
    }

    /// The decode-only step of `batch` rows, given `decodes` rows' `base` and the
    /// prompt token's cost `per`: measured where that count has run, else `base` plus
    /// `per` for each row more (a decode row is one more matmul row, as a prompt token
    /// is; its attention reads a context instead of a chunk's). Pacing against the
    /// batch that forms, not the few sequences decoding so far, keeps a burst from
    /// prefilling a few tokens a step beside streams whose steps will soon be
    /// `batch` rows anyway.
    fn batch_step(&self, decodes: usize, batch: usize, base: f64, per: f64) -> f64 {
        match self.baseline.get(&batch) {
            Some(&measured) if batch > decodes => measured,
            _ => base + (batch - decodes) as f64 * per,
        }
    }

    /// Records a step's time: `decodes` decode rows and `prompt` prompt tokens.
    pub(crate) fn record(&mut self, decodes: usize, prompt: usize, secs: f64) {
        if decodes == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        if prompt == 0 {
            let b = self.baseline.entry(decodes).or_insert(secs);
            *b += NEWEST_WEIGHT * (secs - *b);
            return;
        }
        let Some(&base) = self.baseline.get(&decodes) else {
            return;
        };
        let per = (secs - base).max(0.0) / prompt as f64;
        average(&mut self.per_prompt_token, per);
    }

    /// Positions of prompt work that may run after a step of `decodes` decode rows that
    /// took `step_secs`, keeping the two within `factor` × the baseline: unbounded with
    /// no decodes, none without a baseline or once the step took the whole margin.
    pub(crate) fn room_after(&self, decodes: usize, step_secs: f64) -> usize {
        if decodes == 0 {
            return usize::MAX;
        }
        let Some(&base) = self.baseline.get(&decodes) else {
            return 0;
        };
        let spare = self.factor * base - step_secs;
        if spare.is_nan() || spare <= 0.0 {
            return 0;
        }
        // Before any such work is measured, a chunk token's cost.
        let per = priced(self.per_between.or(self.per_prompt_token), base, decodes);
        (spare / per).floor() as usize
    }

    /// Records prompt work run between steps: `positions` in `secs`.
    pub(crate) fn record_between(&mut self, positions: usize, secs: f64) {
        if positions == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        average(&mut self.per_between, secs / positions as f64);
    }
}

/// Seconds a prompt position costs beside `decodes` decode rows whose step takes
/// `base`: `measured` when there is a positive one, else the first guess, two decode
/// rows' share of the step. That halves "prompt rows cost what decode rows cost" (the
/// case on hosts where the step is bound by its matmuls' instructions); the first
/// measurement corrects it either way.
fn priced(measured: Option<f64>, base: f64, decodes: usize) -> f64 {
    match measured {
        Some(per) if per > 0.0 => per,
        _ => 2.0 * base / decodes as f64,
    }
}

/// Folds `sample` into an exponential average (the first sample starts it).
fn average(avg: &mut Option<f64>, sample: f64) {
    let a = avg.get_or_insert(sample);
    *a += NEWEST_WEIGHT * (sample - *a);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_decodes_no_limit_a_probe_step_then_a_guess() {
        let mut p = Pacer::new(2.0);
        assert_eq!(p.allowance(0, 0), usize::MAX);
        assert_eq!(
            p.allowance(8, 8),
            0,
            "a step of decodes alone measures them"
        );
        p.record(8, 0, 0.02);
        p.record(1, 0, 0.01);
        assert_eq!(p.allowance(8, 8), 4, "no prompt token measured yet");
        assert_eq!(p.allowance(1, 1), 1, "at least one token");
    }

    #[test]
    fn allowance_keeps_a_linear_step_within_the_factor() {
        // A made-up host, in powers of two so the arithmetic is exact: 2⁻⁸ s a decode
        // row, 2⁻⁹ s a prompt token, 2⁻⁷ s fixed; 8 decode rows take 39 ms.
        let step = |decodes: usize, prompt: usize| {
            decodes as f64 / 256.0 + prompt as f64 / 512.0 + 1.0 / 128.0
        };
        let mut p = Pacer::new(2.0);
        p.record(8, 0, step(8, 0));
        let mut chunk = p.allowance(8, 8);
        for _ in 0..20 {
            p.record(8, chunk, step(8, chunk));
            chunk = p.allowance(8, 8);
        }
        // (2 − 1) × 39 ms / 1.95 ms = 20 tokens: the step takes exactly 2× the baseline.
        assert_eq!(chunk, 20);
        assert_eq!(step(8, chunk), 2.0 * step(8, 0));
        // A 3× factor doubles the spare time.
        let mut wide = Pacer::new(3.0);
        wide.record(8, 0, step(8, 0));
        wide.record(8, 4, step(8, 4));
        assert_eq!(wide.allowance(8, 8), 40);
    }

    #[test]
    fn a_growing_cost_shrinks_the_chunks_and_a_falling_one_grows_them() {
        let mut p = Pacer::new(2.0);
        p.record(4, 0, 0.010);
        // Attention over a growing context: each prompt token costs more.
        let mut last = usize::MAX;
        for cost in [0.001, 0.002, 0.004, 0.008] {
            for _ in 0..30 {
                let c = p.allowance(4, 4);
                p.record(4, c, 0.010 + cost * c as f64);
            }
            let c = p.allowance(4, 4);
            assert!(c < last, "{c} tokens at {cost} s each, {last} before");
            assert!(c as f64 * cost <= 0.010 * 1.05, "{c} × {cost}");
            last = c;
        }
        for _ in 0..30 {
            let c = p.allowance(4, 4);
            p.record(4, c, 0.010 + 0.0005 * c as f64);
        }
        assert!(p.allowance(4, 4) >= 19, "{}", p.allowance(4, 4));
        // Prompt tokens that cost nothing beside the decodes are not limited.
        for _ in 0..80 {
            let c = p.allowance(4, 4).min(1 << 20);
            p.record(4, c, 0.010);
        }
        assert!(p.allowance(4, 4) > 1 << 20);
    }

    #[test]
    fn baselines_are_per_decode_count_and_bad_times_are_ignored() {
        // Powers of two again: 2⁻⁸ s per prompt token.
        let per = 1.0 / 256.0;
        let mut p = Pacer::new(2.0);
        p.record(8, 0, 8.0 * per);
        p.record(2, 0, 3.0 * per);
        p.record(8, 4, 12.0 * per);
        assert_eq!(p.allowance(8, 8), 8);
        assert_eq!(p.allowance(2, 2), 3);
        assert_eq!(p.allowance(5, 5), 0, "another count's baseline is not used");
        p.record(5, 2, 1.0); // nor is a mixed step without a baseline
        assert_eq!(p.allowance(8, 8), 8);
        p.record(8, 4, f64::NAN);
        p.record(8, 0, -1.0);
        p.record(0, 4, 5.0);
        assert_eq!(p.allowance(8, 8), 8);
        // A mixed step faster than its baseline (noise) means cheaper prompt tokens,
        // not a negative cost.
        p.record(2, 3, 2.0 * per);
        assert_eq!(p.allowance(2, 2), 4);
    }

    #[test]
    fn a_forming_batch_sets_the_target() {
        // Powers of two: 2 decode rows take 2⁻⁶ s, a prompt token costs 2⁻⁸ s; factor 2.
        let (base, per) = (1.0 / 64.0, 1.0 / 256.0);
        let mut p = Pacer::new(2.0);
        p.record(2, 0, base);
        // No token priced yet: the first guess (4 rows' worth of a step per token,
        // 2⁻⁷ s) prices the 14 sequences about to join as well.
        assert_eq!(p.allowance(2, 2), 1, "(2 − 1) × 2 / 2 tokens");
        assert_eq!(p.allowance(2, 16), 29, "1 + 2 × 14 tokens");
        p.record(2, 4, base + 4.0 * per);
        assert_eq!(p.allowance(2, 2), 4, "the current decodes alone");
        // 16 rows estimated at 2⁻⁶ + 14 × 2⁻⁸ s: 2 × that − 2⁻⁶ s leaves 4 + 28 tokens.
        assert_eq!(p.allowance(2, 16), 32);
        assert_eq!(p.allowance(2, 1), 4, "a batch below the decodes is theirs");
        // Once 16 rows have run alone, their measured step is the target.
        p.record(16, 0, 4.0 * base);
        assert_eq!(p.allowance(2, 16), 28, "(2 × 2⁻⁴ − 2⁻⁶) s / 2⁻⁸ s");
    }

    #[test]
    fn work_between_steps_gets_the_margin_the_step_left() {
        // Powers of two: a 2⁻⁵ s decode-only step of 8 rows, factor 2.
        let base = 1.0 / 32.0;
        let mut p = Pacer::new(2.0);
        assert_eq!(p.room_after(0, 1.0), usize::MAX, "no decodes: not paced");
        assert_eq!(p.room_after(8, base), 0, "no baseline yet");
        p.record(8, 0, base);
        assert_eq!(p.room_after(8, base), 4, "the first guess");
        assert_eq!(
            p.room_after(8, 1.5 * base),
            2,
            "priced alike, a smaller margin"
        );
        assert_eq!(p.room_after(8, 2.0 * base), 0, "the step took the margin");
        p.record(8, 4, base + 4.0 / 1024.0); // 2⁻¹⁰ s a chunk token
        assert_eq!(p.room_after(8, base), 32, "priced as chunk tokens");
        p.record_between(4, 4.0 / 256.0); // a scored position: 2⁻⁸ s
        assert_eq!(p.room_after(8, base), 8, "priced as measured");
        assert_eq!(
            p.room_after(8, base + 4.0 / 256.0),
            4,
            "after a costlier step"
        );
        p.record_between(0, 1.0);
        p.record_between(3, f64::INFINITY);
        assert_eq!(p.room_after(8, base), 8, "bad samples ignored");
    }
}
