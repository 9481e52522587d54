//! Token generation: prefill the prompt in one batch, then decode one token at a time,
//! sampling greedily or with temperature / top-k / top-p, streaming text as it forms.

use crate::llama::{KvCache, Llama};
use crate::tokenizer::Tokenizer;
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
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
        }
    }
}

impl Sampling {
    fn validate(&self) -> Result<()> {
        let temperature_ok = self.temperature >= 0.0 && self.temperature.is_finite();
        let top_p_ok = self.top_p > 0.0 && self.top_p <= 1.0; // false for NaN
        if !(temperature_ok && top_p_ok) {
            return Err(Error::Model(format!(
                "sampling: temperature {} must be ≥ 0, top_p {} in (0, 1]",
                self.temperature, self.top_p
            )));
        }
        Ok(())
    }
}

/// What a generation did, with timings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub generated: Vec<u32>,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// The reason it stopped: "stop token" or "length".
    pub finish: &'static str,
}

impl Stats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_s.max(1e-12)
    }
    /// Decode rate over the tokens after the first (the first comes from prefill).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated.len().saturating_sub(1) as f64 / self.decode_s.max(1e-12)
    }
}

/// Picks the next token from `logits`. NaN logits are an error (a broken model must not
/// produce plausible text).
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut rand::rngs::StdRng) -> Result<u32> {
    if logits.iter().any(|v| v.is_nan()) {
        return Err(Error::Model("NaN in the logits".into()));
    }
    if s.temperature == 0.0 {
        let v = TensorView::contiguous(logits, &[1, logits.len()])?;
        return Ok(tessera_kernels::ops::argmax::argmax(Isa::best(), &v)?[0]);
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if s.top_k > 0 {
        idx.truncate(s.top_k);
    }
    let max = logits[idx[0]];
    let mut probs: Vec<f64> = idx
        .iter()
        .map(|&i| (((logits[i] - max) / s.temperature) as f64).exp())
        .collect();
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

/// Generates up to `max_tokens` after `prompt`, calling `on_text` with each new piece of
/// text (only whole UTF-8 characters).
pub fn generate(
    model: &Llama,
    tok: &Tokenizer,
    prompt: &[u32],
    max_tokens: usize,
    sampling: &Sampling,
    mut on_text: impl FnMut(&str),
) -> Result<Stats> {
    sampling.validate()?;
    if prompt.is_empty() {
        return Err(Error::Model("empty prompt".into()));
    }
    let capacity = (prompt.len() + max_tokens).min(model.cfg.context);
    if prompt.len() >= capacity {
        return Err(Error::Model(format!(
            "prompt of {} tokens does not fit the {}-token context",
            prompt.len(),
            model.cfg.context
        )));
    }
    let mut cache = KvCache::new(&model.cfg, capacity)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(sampling.seed);
    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        finish: "length",
        ..Stats::default()
    };
    let t0 = Instant::now();
    let mut logits = model.forward(prompt, &mut cache)?;
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut shown = 0;
    while stats.generated.len() < max_tokens && cache.len() < capacity {
        let next = sample(&logits, sampling, &mut rng)?;
        if tok.stop.contains(&next) {
            stats.finish = "stop token";
            break;
        }
        stats.generated.push(next);
        let text = tok.decode(&stats.generated)?;
        // Hold back a trailing partial character (a multi-byte one split across tokens).
        if !text.ends_with('\u{FFFD}') && text.len() > shown {
            on_text(&text[shown..]);
            shown = text.len();
        }
        if stats.generated.len() < max_tokens && cache.len() < capacity {
            logits = model.forward(&[next], &mut cache)?;
        }
    }
    stats.decode_s = t1.elapsed().as_secs_f64();
    Ok(stats)
}
