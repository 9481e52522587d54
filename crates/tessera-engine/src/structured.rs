//! Structured output: decoding constrained to a JSON schema (or any JSON object) with
//! `llguidance`, the constrained-decoding library llama.cpp and vLLM use. Before each
//! sampled token the request's matcher gives the set of tokens that keep the output a
//! valid prefix of the grammar; every other token's logit becomes −∞, so the sampler can
//! only pick valid text, and generation stops when the grammar is complete.
//!
//! The token-level view of the vocabulary (each token's bytes, byte-level BPE undone)
//! comes from the tokenizer's own `tokenizer.json` form through llguidance's reader, so
//! the masks agree with what the tokenizer decodes.

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;

/// What a request's output must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid against this schema (OpenAI's `json_schema`).
    JsonSchema(Value),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}))
            }
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
        }
    }
}

/// The vocabulary as llguidance sees it, with our tokenizer for its re-tokenizations.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let text = String::from_utf8_lossy(s);
        match self.tok.encode_plain(&text) {
            Ok(ids) => ids,
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Builds matchers for one tokenizer (the vocabulary's trie is built once).
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammars")
    }
}

impl Grammars {
    /// The vocabulary of `tok`, padded with empty tokens to the model's `vocab`.
    pub fn new(tok: Arc<Tokenizer>, vocab: usize) -> Result<Self> {
        let err = |e: String| Error::Tokenizer(format!("structured output: {e}"));
        let json: Value =
            serde_json::from_str(&tok.to_hf_json()?).map_err(|e| err(e.to_string()))?;
        let mut words =
            llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| err(e.to_string()))?;
        if words.len() > vocab {
            return Err(err(format!(
                "the tokenizer has {} tokens, the model {vocab}",
                words.len()
            )));
        }
        words.resize(vocab, Vec::new());
        let eos = tok
            .eos
            .or(tok.stop.first().copied())
            .ok_or_else(|| err("the tokenizer has no end-of-sequence token to finish on".into()))?;
        let info = TokRxInfo {
            vocab_size: vocab as u32,
            tok_eos: eos,
            tok_bos: tok.bos,
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: tok.stop.iter().copied().find(|&t| t != eos),
        };
        let env: TokEnv = Arc::new(Env {
            trie: TokTrie::from(&info, &words),
            tok,
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| err(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A fresh matcher for `g`; an invalid schema is an error naming the reason.
    pub fn matcher(&self, g: &Grammar) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(g.top_level())
            .map_err(|e| Error::request("grammar", format!("invalid schema: {e}")))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(Error::request("grammar", format!("invalid schema: {e}")));
        }
        Ok(Constraint(m))
    }
}

/// One sequence's grammar state.
#[derive(Clone)]
pub struct Constraint(Matcher);

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

impl Constraint {
    /// Sets the logits of tokens the grammar does not allow next to −∞.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self
            .0
            .compute_mask_or_eos()
            .map_err(|e| Error::Model(format!("structured output: {e}")))?;
        for (t, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(t as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past the sampled token.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.0
            .consume_token(token)
            .map_err(|e| Error::Model(format!("structured output: {e}")))
    }

    /// The grammar is complete: nothing more may follow.
    pub fn is_stopped(&self) -> bool {
        self.0.is_stopped()
    }
}
