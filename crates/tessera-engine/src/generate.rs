//! Token generation: prefill the prompt in one batch, then decode one token at a time,
//! sampling greedily or with temperature / top-k / top-p, streaming text as it forms.

use crate::kv_cache::{KvCache, KvDtype};
use crate::llama::{Config, Llama};
use crate::tokenizer::{Detok, Tokenizer};
use crate::{Error, Result};
use rand::{Rng as _, SeedableRng};
use std::time::Instant;
use tessera_core::{Isa, TensorView};

/// How to pick each next token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1 = all).
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this (1 = off).
    pub repetition_penalty: f32,
    /// Subtracted from a recent token's logit once per occurrence (OpenAI's
    /// `frequency_penalty`, in [−2, 2]; 0 = off).
    pub frequency_penalty: f32,
    /// Subtracted once from the logit of every recent token (OpenAI's
    /// `presence_penalty`, in [−2, 2]; 0 = off).
    pub presence_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at, as llama.cpp's
    /// `penalty_last_n` (vLLM counts generated tokens only).
    pub penalty_window: usize,
    /// Seed of this request's own RNG (its output does not depend on other requests).
    pub seed: u64,
    /// Added to these tokens' logits before sampling (after the repetition penalty), as
    /// OpenAI's `logit_bias`: each id once, each bias in ±[`MAX_LOGIT_BIAS`]; −100 all
    /// but bans a token, +100 all but forces it. Log-probabilities still report the
    /// model's own distribution.
    pub logit_bias: Vec<(u32, f32)>,
}

/// The largest |penalty| of [`Sampling::frequency_penalty`] and
/// [`Sampling::presence_penalty`] (OpenAI's bound).
pub const MAX_OPENAI_PENALTY: f32 = 2.0;

/// The largest |bias| [`Sampling::logit_bias`] takes (OpenAI's bound).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_window: 64,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl Sampling {
    /// Checks every field, the bias's token ids against a vocabulary of `vocab`.
    pub(crate) fn validate(&self, vocab: usize) -> Result<()> {
        let t = self.temperature;
        let checks = [
            (
                t >= 0.0 && t.is_finite(),
                format!("temperature {t} must be finite and ≥ 0"),
            ),
            // Comparisons are false for NaN, so NaN fails each.
            (
                self.top_p > 0.0 && self.top_p <= 1.0,
                format!("top_p {} must be in (0, 1]", self.top_p),
            ),
            (
                (0.0..=1.0).contains(&self.min_p),
                format!("min_p {} must be in [0, 1]", self.min_p),
            ),
            (
                self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite(),
                format!(
                    "repetition penalty {} must be finite and > 0",
                    self.repetition_penalty
                ),
            ),
            (
                self.frequency_penalty.abs() <= MAX_OPENAI_PENALTY,
                format!(
                    "frequency_penalty {} must be in [-2, 2]",
                    self.frequency_penalty
                ),
            ),
            (
                self.presence_penalty.abs() <= MAX_OPENAI_PENALTY,
                format!(
                    "presence_penalty {} must be in [-2, 2]",
                    self.presence_penalty
                ),
            ),
        ];
        let bad: Vec<&str> = checks
            .iter()
            .filter(|c| !c.0)
            .map(|c| c.1.as_str())
            .collect();
        if !bad.is_empty() {
            return Err(Error::request(
                "sampling",
                format!("sampling: {}", bad.join("; ")),
            ));
        }
        let mut ids: Vec<u32> = Vec::with_capacity(self.logit_bias.len());
        for &(t, b) in &self.logit_bias {
            if t as usize >= vocab {
                return Err(Error::request(
                    "sampling",
                    format!("logit_bias: token id {t} ≥ vocabulary size {vocab}"),
                ));
            }
            if b.is_nan() || b.abs() > MAX_LOGIT_BIAS {
                return Err(Error::request(
                    "sampling",
                    format!("logit_bias: token {t}'s bias {b} is not in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]"),
                ));
            }
            ids.push(t);
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::request(
                "sampling",
                format!("logit_bias: token {} given twice", w[0]),
            ));
        }
        Ok(())
    }
}

/// What a generation did, with timings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// The generated token ids.
    pub generated: Vec<u32>,
    /// The generated text (cut before a stop string).
    pub text: String,
    /// Prefill time, seconds.
    pub prefill_s: f64,
    /// Decode time, seconds (every step after prefill).
    pub decode_s: f64,
    /// The reason it stopped: "stop token", "stop string", "length" (max_tokens reached),
    /// "context" (the model's context filled first) or "cancelled".
    pub finish: &'static str,
}

impl Stats {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_s.max(1e-12)
    }
    /// Decode rate over the tokens after the first (the first comes from prefill).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated.len().saturating_sub(1) as f64 / self.decode_s.max(1e-12)
    }
}

/// Picks the next token from `logits` (penalising tokens in `history`). NaN logits are an
/// error (a broken model must not produce plausible text).
pub fn sample(
    logits: &[f32],
    history: &[u32],
    s: &Sampling,
    rng: &mut rand::rngs::StdRng,
) -> Result<u32> {
    let nan = || Error::Model("NaN in the logits".into());
    let penalised =
        s.repetition_penalty != 1.0 || s.frequency_penalty != 0.0 || s.presence_penalty != 0.0;
    if s.temperature == 0.0 && !penalised && s.logit_bias.is_empty() {
        // Greedy: the argmax kernel returns the first NaN if there is one, so its one
        // pass is also the check. A separate early-exit scan first made a 49152-logit
        // row take 32 µs instead of 5 (host C), 16 such rows per batched decode step.
        let v = TensorView::contiguous(logits, &[1, logits.len()])?;
        let t = tessera_kernels::ops::argmax::argmax(Isa::best(), &v)?[0];
        return match logits[t as usize].is_nan() {
            true => Err(nan()),
            false => Ok(t),
        };
    }
    // No early exit, so it vectorizes.
    if logits.iter().fold(false, |any, v| any | v.is_nan()) {
        return Err(nan());
    }
    let adjusted;
    let logits = if penalised || !s.logit_bias.is_empty() {
        let mut l = logits.to_vec();
        if penalised {
            // Each recent token once, with its count there.
            let mut seen = history[history.len().saturating_sub(s.penalty_window)..].to_vec();
            seen.sort_unstable();
            for run in seen.chunk_by(|a, b| a == b) {
                if let Some(v) = l.get_mut(run[0] as usize) {
                    if s.repetition_penalty != 1.0 {
                        *v = if *v > 0.0 {
                            *v / s.repetition_penalty
                        } else {
                            *v * s.repetition_penalty
                        };
                    }
                    *v -= run.len() as f32 * s.frequency_penalty + s.presence_penalty;
                }
            }
        }
        for &(t, b) in &s.logit_bias {
            let v = l.get_mut(t as usize).ok_or_else(|| {
                Error::Model(format!(
                    "logit_bias: token id {t} ≥ {} logits",
                    logits.len()
                ))
            })?;
            *v += b;
        }
        adjusted = l;
        &adjusted[..]
    } else {
        logits
    };
    if s.temperature == 0.0 {
        let v = TensorView::contiguous(logits, &[1, logits.len()])?;
        return Ok(tessera_kernels::ops::argmax::argmax(Isa::best(), &v)?[0]);
    }
    let idx = ranked(logits, s.top_k);
    let max = logits[idx[0]];
    let mut probs: Vec<f64> = idx
        .iter()
        .map(|&i| (((logits[i] - max) / s.temperature) as f64).exp())
        .collect();
    // min-p: relative to the top probability (exp(0) = 1 before normalising).
    let keep_min = probs
        .iter()
        .take_while(|&&p| p >= s.min_p as f64)
        .count()
        .max(1);
    probs.truncate(keep_min);
    let total: f64 = probs.iter().sum();
    let mut kept = 0;
    let mut acc = 0.0;
    for p in probs.iter_mut() {
        *p /= total;
        acc += *p;
        kept += 1;
        if acc >= s.top_p as f64 {
            break;
        }
    }
    let mass: f64 = probs[..kept].iter().sum();
    let mut r = rng.random::<f64>() * mass;
    for (j, p) in probs[..kept].iter().enumerate() {
        r -= p;
        if r <= 0.0 {
            return Ok(idx[j] as u32);
        }
    }
    Ok(idx[kept - 1] as u32)
}

/// Token ids by descending logit (ties: lower id first), the first `top_k` of them
/// (every one for 0). Top-k selects before it sorts: with a full sort, sampling a
/// 49152-logit row at temperature 1, top-k 40 took 1.42 ms; now 0.16 ms (host C).
fn ranked(logits: &[f32], top_k: usize) -> Vec<usize> {
    let order = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if top_k > 0 && top_k < idx.len() {
        idx.select_nth_unstable_by(top_k - 1, order);
        idx.truncate(top_k);
    }
    idx.sort_unstable_by(order);
    idx
}

/// What to generate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (at least 1; the context also ends generation).
    pub max_tokens: usize,
    /// How to pick each token.
    pub sampling: Sampling,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// Keep going through end-of-turn tokens (benchmarks that need exact lengths).
    pub ignore_eos: bool,
    /// How the KV cache stores keys and values (f16 by default: half the decode
    /// attention traffic; f32 for bit-faithful attention).
    pub kv_dtype: KvDtype,
}

/// What [`generate`] drives: a model that runs one sequence through a cache of its
/// own (the CPU [`Llama`], or its copy on a device, [`crate::llama::DeviceLlama`]).
pub trait Decoder {
    /// The model's configuration.
    fn config(&self) -> &Config;
    /// A new, empty sequence with room for `capacity` positions, its keys and values
    /// stored as `kv_dtype` (an error where the model cannot store them so).
    fn sequence(&self, capacity: usize, kv_dtype: KvDtype) -> Result<Box<dyn Sequence + '_>>;
}

/// One sequence of a [`Decoder`]: its cache and the forward pass that extends it.
pub trait Sequence {
    /// Runs `tokens` at the next positions and returns the logits after the last one.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// Positions cached so far.
    fn cached(&self) -> usize;
}

/// The CPU model's sequence: a contiguous [`KvCache`].
struct HostSequence<'a> {
    model: &'a Llama,
    cache: KvCache,
}

impl Sequence for HostSequence<'_> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.model.forward(tokens, &mut self.cache)
    }
    fn cached(&self) -> usize {
        self.cache.len()
    }
}

impl Decoder for Llama {
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn sequence(&self, capacity: usize, kv_dtype: KvDtype) -> Result<Box<dyn Sequence + '_>> {
        let cache = KvCache::with_dtype(&self.cfg, capacity, kv_dtype)?;
        Ok(Box::new(HostSequence { model: self, cache }))
    }
}

/// Generates for `req`, calling `on_text` with each new piece of text: whole UTF-8
/// characters only, and never text that might still turn into a stop string.
pub fn generate<M: Decoder + ?Sized>(
    model: &M,
    tok: &Tokenizer,
    req: &Request,
    mut on_text: impl FnMut(&str),
) -> Result<Stats> {
    generate_until(model, tok, req, |piece| {
        on_text(piece);
        true
    })
}

/// [`generate`] whose consumer can stop it: `on_text` returning false ends generation
/// after that piece, with finish "cancelled" (a stream whose reader went away).
pub fn generate_until<M: Decoder + ?Sized>(
    model: &M,
    tok: &Tokenizer,
    req: &Request,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Stats> {
    let (prompt, sampling) = (&req.prompt[..], &req.sampling);
    sampling.validate(model.config().vocab)?;
    if prompt.is_empty() {
        return Err(Error::request("prompt", "empty prompt"));
    }
    if req.stop.iter().any(|s| s.is_empty()) {
        return Err(Error::request("stop", "empty stop string"));
    }
    if req.max_tokens == 0 {
        return Err(Error::request(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    let capacity = prompt
        .len()
        .saturating_add(req.max_tokens)
        .min(model.config().context);
    if prompt.len() >= capacity {
        return Err(Error::request(
            "prompt",
            format!(
                "prompt of {} tokens does not fit the {}-token context",
                prompt.len(),
                model.config().context
            ),
        ));
    }
    let mut seq = model.sequence(capacity, req.kv_dtype)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(sampling.seed);
    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        finish: "length",
        ..Stats::default()
    };
    let mut history = prompt.to_vec();
    let t0 = Instant::now();
    let mut logits = seq.forward(prompt)?;
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut text = TextStream::new(&req.stop);
    let mut detok = Detok::default();
    while stats.generated.len() < req.max_tokens && seq.cached() < capacity {
        let next = sample(&logits, &history, sampling, &mut rng)?;
        if !req.ignore_eos && tok.stop.contains(&next) {
            stats.finish = "stop token";
            break;
        }
        stats.generated.push(next);
        history.push(next);
        let piece = text.push(detok.advance(tok, &stats.generated)?);
        if !piece.text.is_empty() && !on_text(&piece.text) {
            stats.text = text.text().to_string();
            stats.finish = "cancelled";
            stats.decode_s = t1.elapsed().as_secs_f64();
            return Ok(stats);
        }
        if piece.stopped {
            stats.text = text.text().to_string();
            stats.finish = "stop string";
            stats.decode_s = t1.elapsed().as_secs_f64();
            return Ok(stats);
        }
        if stats.generated.len() < req.max_tokens && seq.cached() < capacity {
            logits = seq.forward(&[next])?;
        }
    }
    if stats.finish == "length" && stats.generated.len() < req.max_tokens {
        stats.finish = "context";
    }
    let rest = text.finish();
    if !rest.is_empty() {
        on_text(&rest);
    }
    stats.text = text.text().to_string();
    stats.decode_s = t1.elapsed().as_secs_f64();
    Ok(stats)
}

/// New text of one step of a [`TextStream`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextPiece {
    /// Text that can be shown now.
    pub text: String,
    /// A stop string appeared: the stream ends before it.
    pub stopped: bool,
}

/// Turns the growing decoded text of a generation into pieces safe to show: whole UTF-8
/// characters only (a character split across tokens decodes to U+FFFD until complete),
/// never text that might still turn into a stop string, and nothing from the first stop
/// string on.
#[derive(Clone, Debug)]
pub struct TextStream {
    stop: Vec<String>,
    /// Bytes that may be the start of a stop string: held back.
    hold: usize,
    text: String,
    shown: usize,
    stopped: bool,
}

impl TextStream {
    /// A stream that stops before the first of `stop`.
    pub fn new(stop: &[String]) -> Self {
        TextStream {
            stop: stop.to_vec(),
            hold: stop
                .iter()
                .map(|s| s.len())
                .max()
                .unwrap_or(1)
                .saturating_sub(1),
            text: String::new(),
            shown: 0,
            stopped: false,
        }
    }

    /// Takes the whole decoded text so far; returns what became showable.
    pub fn push(&mut self, text: &str) -> TextPiece {
        if self.stopped {
            return TextPiece::default();
        }
        if let Some(at) = self.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
            let piece = text.get(self.shown..at).unwrap_or_default().to_string();
            self.text = text[..at].to_string();
            self.shown = at.max(self.shown);
            self.stopped = true;
            return TextPiece {
                text: piece,
                stopped: true,
            };
        }
        self.text = text.to_string();
        let mut safe = text.len().saturating_sub(self.hold);
        while !text.is_char_boundary(safe) {
            safe -= 1;
        }
        if text[..safe].ends_with('\u{FFFD}') || safe <= self.shown {
            return TextPiece::default();
        }
        let piece = text[self.shown..safe].to_string();
        self.shown = safe;
        TextPiece {
            text: piece,
            stopped: false,
        }
    }

    /// At the end of the generation: the held-back rest (unless it ends in a split
    /// character).
    pub fn finish(&mut self) -> String {
        if self.stopped || self.text.len() <= self.shown || self.text.ends_with('\u{FFFD}') {
            return String::new();
        }
        let rest = self.text[self.shown..].to_string();
        self.shown = self.text.len();
        rest
    }

    /// The text so far (cut before a stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether a stop string was reached.
    pub fn stopped(&self) -> bool {
        self.stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random logits with many ties (values on a coarse grid).
    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| rng.random_range(-20i32..20) as f32 * 0.25)
            .collect()
    }

    /// Top-k by selection equals the first k of an independent full sort in f64 with
    /// the same tie rule (lower id first).
    #[test]
    fn ranked_is_the_prefix_of_a_full_sort() {
        for (n, seed) in [(1, 1), (7, 2), (1000, 3), (49152, 4)] {
            let l = logits(n, seed);
            let mut want: Vec<(f64, usize)> = l.iter().map(|&v| (-(v as f64), 0)).collect();
            for (i, w) in want.iter_mut().enumerate() {
                w.1 = i;
            }
            want.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
            let want: Vec<usize> = want.into_iter().map(|(_, i)| i).collect();
            for k in [0, 1, 2, 40, n.saturating_sub(1), n, n + 5] {
                let got = ranked(&l, k);
                let len = if k == 0 { n } else { k.min(n) };
                assert_eq!(got, want[..len], "n {n} k {k}");
            }
        }
    }

    /// Every sampled token is among the k largest logits, and greedy picks the first
    /// maximum.
    #[test]
    fn samples_stay_in_the_top_k() {
        let l = logits(5000, 9);
        let mut sorted: Vec<usize> = (0..l.len()).collect();
        sorted.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).expect("finite").then(a.cmp(&b)));
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let s = Sampling {
            temperature: 1.5,
            top_k: 3,
            top_p: 1.0,
            ..Sampling::default()
        };
        for _ in 0..200 {
            let t = sample(&l, &[], &s, &mut rng).expect("sample") as usize;
            assert!(sorted[..3].contains(&t), "{t} outside the top 3");
        }
        let greedy = sample(&l, &[], &Sampling::default(), &mut rng).expect("greedy");
        assert_eq!(greedy as usize, sorted[0]);
    }

    /// A NaN anywhere in the logits is an error, greedy or not.
    #[test]
    fn nan_logits_are_an_error() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        for at in [0, 17, 4999] {
            let mut l = logits(5000, 11);
            l[at] = f32::NAN;
            for temperature in [0.0, 0.8] {
                let s = Sampling {
                    temperature,
                    ..Sampling::default()
                };
                let e = sample(&l, &[], &s, &mut rng).expect_err("NaN must fail");
                assert!(e.to_string().contains("NaN"), "{e}");
            }
        }
    }

    /// logit_bias shifts greedy picks and the sampled distribution as softmax(logits +
    /// bias) computed here in f64 says, and the repetition penalty applies first.
    #[test]
    fn logit_bias_moves_picks_and_probabilities() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let l = [1.0f32, 2.0, 0.5, -1.0];
        let greedy = |bias: Vec<(u32, f32)>, history: &[u32], penalty: f32| {
            let s = Sampling {
                logit_bias: bias,
                repetition_penalty: penalty,
                ..Sampling::default()
            };
            sample(&l, history, &s, &mut rand::rngs::StdRng::seed_from_u64(0)).expect("greedy")
        };
        assert_eq!(greedy(vec![], &[], 1.0), 1);
        assert_eq!(greedy(vec![(1, -100.0)], &[], 1.0), 0);
        assert_eq!(greedy(vec![(3, 3.5)], &[], 1.0), 3, "-1 + 3.5 > 2");
        // Penalty 4 makes token 1's logit 0.5, then +0.6 puts it at 1.1 > 1.
        assert_eq!(greedy(vec![(1, 0.6)], &[1], 4.0), 1);
        assert_eq!(greedy(vec![(1, 0.4)], &[1], 4.0), 0);

        let bias = [(0u32, 1.5f32), (2, -0.5)];
        let s = Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            logit_bias: bias.to_vec(),
            ..Sampling::default()
        };
        let mut want: Vec<f64> = l.iter().map(|&v| v as f64).collect();
        for (t, b) in bias {
            want[t as usize] += b as f64;
        }
        let z: f64 = want.iter().map(|v| v.exp()).sum();
        let draws = 40_000;
        let mut seen = [0usize; 4];
        for _ in 0..draws {
            seen[sample(&l, &[], &s, &mut rng).expect("sample") as usize] += 1;
        }
        for (t, &n) in seen.iter().enumerate() {
            let (got, p) = (n as f64 / draws as f64, want[t].exp() / z);
            // 5 standard deviations of a binomial frequency.
            let tol = 5.0 * (p * (1.0 - p) / draws as f64).sqrt();
            assert!(
                (got - p).abs() <= tol,
                "token {t}: {got} against {p} ± {tol}"
            );
        }
    }

    /// Out-of-vocabulary ids, biases outside ±100 (or NaN) and repeated ids are errors
    /// naming the field, from `validate` and from `sample` itself.
    #[test]
    fn bad_logit_bias_is_an_error() {
        let with = |logit_bias: Vec<(u32, f32)>| Sampling {
            logit_bias,
            ..Sampling::default()
        };
        assert!(with(vec![(3, 100.0), (0, -100.0)]).validate(4).is_ok());
        for (bias, says) in [
            (vec![(4, 1.0)], "token id 4"),
            (vec![(0, 100.5)], "not in"),
            (vec![(0, f32::NAN)], "not in"),
            (vec![(0, f32::NEG_INFINITY)], "not in"),
            (vec![(2, 1.0), (1, 1.0), (2, -1.0)], "token 2 given twice"),
        ] {
            let e = with(bias.clone()).validate(4).expect_err("must fail");
            assert!(
                e.to_string().contains(says) && e.to_string().contains("logit_bias"),
                "{bias:?}: {e}"
            );
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let e = sample(&[0.0; 4], &[], &with(vec![(9, 1.0)]), &mut rng).expect_err("id 9 of 4");
        assert!(e.to_string().contains("logit_bias"), "{e}");
    }

    /// Each bad field is named alone (a message listing every field, good ones too,
    /// hid which one was wrong).
    #[test]
    fn bad_sampling_names_only_the_bad_field() {
        let fields = [
            "temperature",
            "top_p",
            "min_p",
            "repetition penalty",
            "frequency_penalty",
            "presence_penalty",
        ];
        for (i, field) in fields.into_iter().enumerate() {
            let mut bad = Sampling::default();
            match i {
                0 => bad.temperature = f32::NAN,
                1 => bad.top_p = 0.0,
                2 => bad.min_p = -0.5,
                3 => bad.repetition_penalty = f32::INFINITY,
                4 => bad.frequency_penalty = 2.5,
                _ => bad.presence_penalty = f32::NAN,
            }
            let e = bad.validate(10).expect_err(field).to_string();
            let named: Vec<&str> = fields.into_iter().filter(|f| e.contains(f)).collect();
            assert_eq!(named, [field], "{e}");
        }
        assert!(Sampling::default().validate(10).is_ok());
    }

    /// frequency_penalty subtracts per occurrence in the window, presence_penalty once
    /// per token seen, as llama.cpp's penalties do; tokens older than the window are not
    /// penalised, and negative values encourage.
    #[test]
    fn frequency_and_presence_penalties_follow_their_definitions() {
        let l = [2.0f32, 1.5, 0.0];
        let greedy = |history: &[u32], frequency: f32, presence: f32| {
            let s = Sampling {
                frequency_penalty: frequency,
                presence_penalty: presence,
                ..Sampling::default()
            };
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            sample(&l, history, &s, &mut rng).expect("greedy")
        };
        // Token 0 seen twice: 2 − 2·0.3 = 1.4 < 1.5; 2 − 2·0.2 = 1.6 > 1.5.
        assert_eq!(greedy(&[0, 0], 0.3, 0.0), 1);
        assert_eq!(greedy(&[0, 0], 0.2, 0.0), 0);
        // Presence counts once: 2 − 0.6 = 1.4; 2 − 0.4 = 1.6.
        assert_eq!(greedy(&[0, 0], 0.0, 0.6), 1);
        assert_eq!(greedy(&[0, 0], 0.0, 0.4), 0);
        // Both, and token 1 penalised too: 2 − 0.2 − 0.1 = 1.7 against 1.5 − 0.1 − 0.1 = 1.3.
        assert_eq!(greedy(&[0, 1], 0.1, 0.1), 0);
        // Negative values encourage: 0 + 2·1.5 = 3 > 2; 0 + 1.8 = 1.8 < 2.
        assert_eq!(greedy(&[2, 2], -1.5, 0.0), 2);
        assert_eq!(greedy(&[2, 2], 0.0, -1.8), 0);
        // Ten 0s, then 64 2s: the 0s are out of the window, so 0 keeps 2.0 (counted,
        // it would fall to 2 − 10·0.3 = −1 below token 1's 1.5).
        let mut old = vec![0u32; 10];
        old.extend(std::iter::repeat_n(2u32, 64));
        assert_eq!(greedy(&old, 0.3, 0.0), 0);
        assert_eq!(
            greedy(&old[..70], 0.3, 0.0),
            1,
            "four 0s in the window: 2 − 1.2 = 0.8"
        );
    }
}
