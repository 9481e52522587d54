//! Byte-level BPE tokenizer built from GGUF metadata with the `tokenizers` crate.
//!
//! GGUF stores the vocabulary (`tokenizer.ggml.tokens`), merges, token types and the
//! pre-tokenizer name; we rebuild the equivalent Hugging Face pipeline: the pre-tokenizer's
//! splits (for `smollm`, every digit alone, then the GPT-2 byte-level regex), BPE over the
//! byte-level alphabet, control tokens (type 3) matched as special tokens, and the
//! byte-level decoder.
//!
//! HF checkpoints ship that pipeline ready-made as `tokenizer.json`
//! ([`Tokenizer::from_hf_dir`]), with BOS/EOS and the chat template in
//! `tokenizer_config.json`.

use crate::gguf::Gguf;
use crate::{Error, Result};
use serde_json::Value as Json;
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer as HfTokenizer};

/// A tokenizer plus the ids generation needs.
#[derive(Debug)]
pub struct Tokenizer {
    inner: HfTokenizer,
    /// Beginning-of-sequence token, if the model has one.
    pub bos: Option<u32>,
    /// End-of-sequence token, if the model has one.
    pub eos: Option<u32>,
    /// Whether `encode` puts BOS in front.
    pub add_bos: bool,
    /// The chat template, when the model ships one.
    pub chat_template: Option<String>,
    /// Ids that end a turn: EOS and ChatML's `<|im_end|>` when present.
    pub stop: Vec<u32>,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// The tokenizer a GGUF file describes (`tokenizer.ggml.*`), checked against its vocabulary.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.get("tokenizer.ggml.model")?.as_str().unwrap_or_default();
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "tokenizer model '{model}' is not supported (gpt2 byte-level BPE)"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            let arr = g
                .get(key)?
                .as_array()
                .ok_or_else(|| Error::Tokenizer(format!("{key} is not an array")))?;
            arr.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| Error::Tokenizer(format!("{key} holds a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| Error::Tokenizer(format!("merge '{m}' has no space")))
            })
            .collect::<Result<_>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        if vocab.len() != tokens.len() {
            return Err(Error::Tokenizer(
                "duplicate tokens in the vocabulary".into(),
            ));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err)?;
        let mut inner = HfTokenizer::new(bpe);
        let pre = g
            .metadata
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        let byte_level = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
        let pre_tok = match pre {
            "smollm" => Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level,
            ]),
            "gpt-2" | "default" => Sequence::new(vec![byte_level]),
            other => {
                return Err(Error::Tokenizer(format!(
                    "pre-tokenizer '{other}' is not supported yet (smollm, gpt-2)"
                )))
            }
        };
        inner.with_pre_tokenizer(Some(pre_tok));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        // Required: without the types, control tokens such as <|im_start|> would be split
        // as text (the default model's chat prompt grows from 37 tokens to 66) and the
        // model would answer a prompt it was never trained on.
        let types = match g.metadata.get("tokenizer.ggml.token_type") {
            None => {
                return Err(Error::Tokenizer(
                    "tokenizer.ggml.token_type is missing: without it control tokens \
                     such as <|im_start|> would be read as text"
                        .into(),
                ))
            }
            Some(v) => match v.as_array() {
                Some(a) if a.len() == tokens.len() => a,
                Some(a) => {
                    return Err(Error::Tokenizer(format!(
                        "tokenizer.ggml.token_type has {} entries for {} tokens",
                        a.len(),
                        tokens.len()
                    )))
                }
                None => {
                    return Err(Error::Tokenizer(
                        "tokenizer.ggml.token_type is not an array".into(),
                    ))
                }
            },
        };
        let special: Vec<AddedToken> = types
            .iter()
            .zip(&tokens)
            .filter(|(t, _)| t.as_u64() == Some(3))
            .map(|(_, s)| AddedToken::from(s.clone(), true))
            .collect();
        inner.add_special_tokens(&special);
        // Absent: none. Present, it must be a token of this vocabulary.
        let id = |key: &str| -> Result<Option<u32>> {
            let Some(v) = g.metadata.get(key) else {
                return Ok(None);
            };
            match v.as_u64() {
                Some(id) if (id as usize) < tokens.len() => Ok(Some(id as u32)),
                _ => Err(Error::Tokenizer(format!(
                    "{key} = {v:?} is not a token id below the vocabulary's {}",
                    tokens.len()
                ))),
            }
        };
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let stop = turn_ends(&inner, eos.into_iter().collect());
        Ok(Tokenizer {
            inner,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos,
            add_bos: g
                .metadata
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            chat_template: g
                .metadata
                .get("tokenizer.chat_template")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            stop,
        })
    }

    /// The tokenizer of an HF checkpoint directory (`tokenizer.json`, and
    /// `tokenizer_config.json` / `config.json` for BOS, EOS and the chat template).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        // `tokenizers` panics on some malformed files instead of returning its error
        // (an `expect` in its decoder deserializer, found by the `tokenizer_json` fuzz
        // target): caught here and reported like any other bad file.
        let loaded = std::panic::catch_unwind(|| HfTokenizer::from_file(&path)).map_err(|_| {
            Error::Tokenizer(format!(
                "{}: malformed (the tokenizers crate could not deserialize it)",
                path.display()
            ))
        })?;
        let inner = loaded
            .map_err(|e| Error::Tokenizer(format!("{}/tokenizer.json: {e}", dir.display())))?;
        let json = |name: &str| -> Result<Json> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(t) => serde_json::from_str(&t)
                    .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display()))),
                Err(_) => Ok(Json::Null),
            }
        };
        let (tc, config) = (json("tokenizer_config.json")?, json("config.json")?);
        // Special tokens are written as a string or as {"content": string}.
        let special = |key: &str| {
            let v = &tc[key];
            v.as_str()
                .or_else(|| v["content"].as_str())
                .and_then(|t| inner.token_to_id(t))
        };
        let bos = special("bos_token").or(config["bos_token_id"].as_u64().map(|v| v as u32));
        let mut eos_ids: Vec<u32> = special("eos_token").into_iter().collect();
        match &config["eos_token_id"] {
            Json::Array(a) => eos_ids.extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32)),
            v => eos_ids.extend(v.as_u64().map(|v| v as u32)),
        }
        eos_ids.dedup();
        Ok(Tokenizer {
            bos,
            eos: eos_ids.first().copied(),
            add_bos: tc["add_bos_token"].as_bool().unwrap_or(false),
            chat_template: tc["chat_template"].as_str().map(str::to_owned),
            stop: turn_ends(&inner, eos_ids),
            inner,
        })
    }

    /// The pipeline as `tokenizer.json` text (to export a GGUF model's tokenizer).
    pub fn to_hf_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(tok_err)
    }

    /// Token ids of `text` (special tokens written in the text are recognised), with BOS
    /// first when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(tok_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Token ids of `text` alone: no BOS, special tokens written in the text recognised.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of a rendered chat prompt: as [`Tokenizer::encode`], but no BOS is added
    /// when the text already starts with it (templates print `bos_token` themselves, and
    /// HF tokenizes their output without adding special tokens).
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>> {
        let bos_text = self.bos.and_then(|b| self.token_text(b));
        let mut ids = self.encode(text)?;
        if self.add_bos && bos_text.is_some_and(|b| !b.is_empty() && text.starts_with(&b)) {
            ids.remove(0);
        }
        Ok(ids)
    }

    /// Tokens in the vocabulary, added and special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A token's own text as the vocabulary spells it (special tokens included).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The text one token adds when decoded on its own (special tokens as their text).
    pub fn piece(&self, id: u32) -> String {
        self.inner.decode(&[id], false).unwrap_or_default()
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(tok_err)
    }

    /// Text of `ids` with special tokens as their text (`<|im_start|>`), as a prompt
    /// given as token ids spells them.
    pub fn decode_with_special(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tok_err)
    }

    /// The text of `ids` ([`Tokenizer::decode_with_special`] when `special`, else
    /// [`Tokenizer::decode`]) and the byte offset in it where each token's text starts:
    /// the length of the text the tokens before it decode to. Tokens that end inside a
    /// UTF-8 character add nothing until the one that completes it, so they share its
    /// offset. Every offset is a character boundary of the text, and none is below the
    /// one before it. Linear in the tokens (an incremental decode), for prompts of any
    /// length and content.
    pub fn text_offsets(&self, ids: &[u32], special: bool) -> Result<(String, Vec<usize>)> {
        let mut detok = Detok {
            special,
            ..Detok::default()
        };
        let mut offsets = Vec::with_capacity(ids.len());
        for i in 0..ids.len() {
            offsets.push(detok.text.len());
            detok.advance(self, &ids[..=i])?;
        }
        let text = detok.finish(self, ids)?;
        // Where a character's bytes were shown as U+FFFD and then completed, the text
        // behind an offset can have changed length.
        fit_offsets(&text, &mut offsets);
        Ok((text, offsets))
    }

    /// The prompt for one user message in the model's chat format: the model's own
    /// template rendered as Hugging Face renders it ([`crate::chat`]); a model without a
    /// template gets the message as is. A template that fails to render is an error.
    pub fn chat_prompt(&self, message: &str) -> Result<String> {
        if self.chat_template.is_none() {
            return Ok(message.to_owned());
        }
        self.chat_messages(&[crate::chat::Message::new("user", message)])
    }

    /// The prompt for a conversation, ending with the assistant's turn: the model's
    /// template rendered as Hugging Face renders it. A model without a template is an
    /// error here (there is no neutral way to join several turns).
    pub fn chat_messages(&self, messages: &[crate::chat::Message]) -> Result<String> {
        let Some(src) = &self.chat_template else {
            return Err(Error::Tokenizer(
                "the model has no chat template; pass a raw prompt instead".into(),
            ));
        };
        let text = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or_default();
        let t = crate::chat::ChatTemplate::new(src, &text(self.bos), &text(self.eos))?;
        t.render(messages, true)
    }
}

/// Makes `offsets` fit `text`: each at most the text's length, on a character boundary,
/// and none above the one after it (so they never decrease).
pub fn fit_offsets(text: &str, offsets: &mut [usize]) {
    let mut next = text.len();
    for o in offsets.iter_mut().rev() {
        *o = (*o).min(next);
        while !text.is_char_boundary(*o) {
            *o -= 1;
        }
        next = *o;
    }
}

/// Text decoded a few tokens at a time instead of whole after every token (which made
/// each generation step O(generated tokens) per sequence). Tokens `prefix..read` were
/// decoded last time; decoding `prefix..` again and keeping what extends that text gives
/// the new characters with the context a decoder needs (leading spaces, merged bytes),
/// and waits while the last token ends inside a UTF-8 character. Special tokens are
/// skipped (generated text), or kept as their text when `special` is set.
#[derive(Clone, Debug, Default)]
pub(crate) struct Detok {
    prefix: usize,
    read: usize,
    text: String,
    special: bool,
}

/// Tokens a character can still be waiting for: a UTF-8 character is at most 4 bytes and
/// a token at least one, so text still ending in U+FFFD after this many more tokens
/// never becomes a character.
const MAX_PENDING: usize = 4;

impl Detok {
    fn decode(&self, tok: &Tokenizer, ids: &[u32]) -> Result<String> {
        match self.special {
            true => tok.decode_with_special(ids),
            false => tok.decode(ids),
        }
    }

    /// The whole text of `tokens` (which grew by one token since the last call), up to
    /// a character the last tokens have not finished.
    ///
    /// Each call decodes a window of at most [`MAX_PENDING`] + 1 tokens past the last
    /// text shown and the window before it, so a run of bytes that never forms a
    /// character (a prompt of lone UTF-8 continuation bytes) costs linear time, not
    /// quadratic: after `MAX_PENDING` tokens its U+FFFD are final.
    pub(crate) fn advance(&mut self, tok: &Tokenizer, tokens: &[u32]) -> Result<&str> {
        let before = self.decode(tok, &tokens[self.prefix..self.read])?;
        let now = self.decode(tok, &tokens[self.prefix..])?;
        let pending = tokens.len() - self.read;
        match now.strip_prefix(before.as_str()) {
            Some(new)
                if !new.is_empty() && (!new.ends_with('\u{FFFD}') || pending >= MAX_PENDING) =>
            {
                self.text.push_str(new);
                (self.prefix, self.read) = (self.read, tokens.len());
            }
            Some(_) => {}
            // The window's text changed behind its end: bytes shown as U+FFFD that the
            // last tokens completed into a character. Its own text is replaced.
            None if self.text.ends_with(before.as_str()) => {
                self.text.truncate(self.text.len() - before.len());
                self.text.push_str(&now);
                (self.prefix, self.read) = (self.read, tokens.len());
            }
            // A decoder whose output for a window is not an extension: decode it all.
            None => {
                self.text = self.decode(tok, tokens)?;
                (self.prefix, self.read) = (tokens.len(), tokens.len());
            }
        }
        Ok(&self.text)
    }

    /// The whole text of `tokens` (the ones [`Detok::advance`] saw last), an unfinished
    /// last character included as the decoder spells it (U+FFFD).
    fn finish(mut self, tok: &Tokenizer, tokens: &[u32]) -> Result<String> {
        if self.read < tokens.len() {
            let before = self.decode(tok, &tokens[self.prefix..self.read])?;
            let now = self.decode(tok, &tokens[self.prefix..])?;
            match now.strip_prefix(before.as_str()) {
                Some(rest) => self.text.push_str(rest),
                None => self.text = self.decode(tok, tokens)?,
            }
        }
        Ok(self.text)
    }
}

/// `eos` plus the end-of-turn markers of the chat formats in use (ChatML's `<|im_end|>`,
/// Llama 3's `<|eot_id|>`) when the vocabulary has them.
fn turn_ends(inner: &HfTokenizer, mut ids: Vec<u32>) -> Vec<u32> {
    for marker in ["<|im_end|>", "<|eot_id|>"] {
        if let Some(id) = inner.token_to_id(marker) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}
