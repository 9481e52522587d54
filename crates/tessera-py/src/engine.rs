//! The engine from Python: load a model once, then `generate` (whole or streamed),
//! `score` and `chat`. Generation runs with the GIL released; a stream runs it on its own
//! thread and hands text pieces over a channel, and stops generating when the Python
//! iterator is dropped or closed.

use crate::engine_err;
use pyo3::exceptions::{PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use tessera_engine::chat::Message;
use tessera_engine::generate::{generate, generate_until, Request, Sampling, Stats};
use tessera_engine::kv_cache::KvDtype;
use tessera_engine::linear::Activations;
use tessera_engine::llama::Llama;
use tessera_engine::tokenizer::Tokenizer;
use tessera_engine::weights::{parse_quantize, LoadOptions};

/// A loaded model and its tokenizer, shared by the engine and its streams.
#[derive(Debug)]
struct Loaded {
    model: Llama,
    tok: Tokenizer,
}

/// A model loaded for generation and scoring.
#[pyclass(module = "tessera._tessera", frozen)]
#[derive(Debug)]
pub struct Engine {
    inner: Arc<Loaded>,
    kv: KvDtype,
    path: PathBuf,
}

/// Sampling and stopping knobs of one call (keyword arguments of `generate`).
#[derive(Default)]
struct Knobs {
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Vec<String>>,
    ignore_eos: Option<bool>,
    logit_bias: Option<std::collections::HashMap<u32, f32>>,
}

/// The keywords `generate` takes; anything else is a TypeError (a misspelt knob must
/// not be ignored).
fn knobs(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Knobs> {
    let mut k = Knobs::default();
    let Some(kw) = kwargs else {
        return Ok(k);
    };
    for (key, v) in kw.iter() {
        let name: String = key.extract()?;
        let bad = |e: PyErr| PyTypeError::new_err(format!("{name}: {e}"));
        if v.is_none() {
            continue;
        }
        match name.as_str() {
            "max_tokens" => k.max_tokens = Some(v.extract().map_err(bad)?),
            "temperature" => k.temperature = Some(v.extract().map_err(bad)?),
            "top_k" => k.top_k = Some(v.extract().map_err(bad)?),
            "top_p" => k.top_p = Some(v.extract().map_err(bad)?),
            "min_p" => k.min_p = Some(v.extract().map_err(bad)?),
            "repetition_penalty" => k.repetition_penalty = Some(v.extract().map_err(bad)?),
            "frequency_penalty" => k.frequency_penalty = Some(v.extract().map_err(bad)?),
            "presence_penalty" => k.presence_penalty = Some(v.extract().map_err(bad)?),
            "seed" => k.seed = Some(v.extract().map_err(bad)?),
            "stop" => {
                k.stop = Some(match v.extract::<String>() {
                    Ok(one) => vec![one],
                    Err(_) => v.extract().map_err(bad)?,
                })
            }
            "ignore_eos" => k.ignore_eos = Some(v.extract().map_err(bad)?),
            "logit_bias" => k.logit_bias = Some(v.extract().map_err(bad)?),
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected keyword argument {name:?} (one of: max_tokens, temperature, \
                     top_k, top_p, min_p, repetition_penalty, frequency_penalty, \
                     presence_penalty, seed, stop, ignore_eos, logit_bias)"
                )))
            }
        }
    }
    Ok(k)
}

impl Engine {
    /// `generate` without streaming: the result dict.
    fn generate_whole<'py>(
        &self,
        py: Python<'py>,
        prompt: &Bound<'py, PyAny>,
        chat: bool,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let req = self.request(prompt, chat, knobs(kwargs)?)?;
        let inner = &self.inner;
        let stats = py.detach(|| generate(&inner.model, &inner.tok, &req, |_| {}));
        result_dict(py, &req, &stats.map_err(engine_err)?)
    }

    /// The request for `prompt` (text, or token ids) with `k`'s knobs; text goes through
    /// the chat template when `chat`.
    fn request(&self, prompt: &Bound<'_, PyAny>, chat: bool, k: Knobs) -> PyResult<Request> {
        let tok = &self.inner.tok;
        let ids = if let Ok(s) = prompt.cast::<PyString>() {
            let text: String = s.extract()?;
            let text = if chat {
                tok.chat_prompt(&text).map_err(engine_err)?
            } else {
                text
            };
            tok.encode(&text).map_err(engine_err)?
        } else {
            let ids: Vec<u32> = prompt.extract().map_err(|_| {
                PyTypeError::new_err("prompt: expected a str or a list of token ids")
            })?;
            let vocab = self.inner.model.cfg.vocab;
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
                return Err(PyValueError::new_err(format!(
                    "prompt: token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
            ids
        };
        let d = Sampling::default();
        Ok(Request {
            prompt: ids,
            max_tokens: k.max_tokens.unwrap_or(128),
            sampling: Sampling {
                temperature: k.temperature.unwrap_or(0.0),
                top_k: k.top_k.unwrap_or(40),
                top_p: k.top_p.unwrap_or(0.95),
                min_p: k.min_p.unwrap_or(0.0),
                repetition_penalty: k.repetition_penalty.unwrap_or(1.0),
                frequency_penalty: k.frequency_penalty.unwrap_or(0.0),
                presence_penalty: k.presence_penalty.unwrap_or(0.0),
                seed: k.seed.unwrap_or(0),
                logit_bias: k.logit_bias.unwrap_or_default().into_iter().collect(),
                ..d
            },
            stop: k.stop.unwrap_or_default(),
            ignore_eos: k.ignore_eos.unwrap_or(false),
            kv_dtype: self.kv,
        })
    }
}

/// The result of a generation as a dict: text, ids, prompt_ids, finish and rates.
fn result_dict<'py>(py: Python<'py>, req: &Request, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("text", &s.text)?;
    d.set_item("ids", &s.generated)?;
    d.set_item("prompt_ids", &req.prompt)?;
    d.set_item("finish", s.finish)?;
    d.set_item("prefill_tok_s", s.prefill_tok_s())?;
    d.set_item("decode_tok_s", s.decode_tok_s())?;
    Ok(d)
}

#[pymethods]
impl Engine {
    /// Loads `model` (a GGUF file or a Hugging Face checkpoint directory; default: the
    /// default model, downloaded on first use). quantize re-encodes float weights (q4_0,
    /// q8_0, …); acts is the activation precision of decode-size matmuls over block
    /// formats ("a16", the default: 16 bits per 32 values through the integer kernels;
    /// "f32": exact; "int8": 8 bits, as llama.cpp), int8_acts=True the same as "int8";
    /// kv_cache "f16", "f32" or "q8" (int8 codes, a scale per position and head);
    /// large_pages=True packs the weights into 2 MiB pages (as `tessera serve` does:
    /// faster decode, a slower first load in some virtual machines).
    #[new]
    #[pyo3(signature = (model=None, *, quantize=None, int8_acts=false, kv_cache="f16", acts=None, large_pages=false))]
    fn new(
        py: Python<'_>,
        model: Option<PathBuf>,
        quantize: Option<&str>,
        int8_acts: bool,
        kv_cache: &str,
        acts: Option<&str>,
        large_pages: bool,
    ) -> PyResult<Self> {
        let kv: KvDtype = kv_cache
            .parse()
            .map_err(|e| PyValueError::new_err(format!("kv_cache: {e}")))?;
        let opts = LoadOptions {
            quantize: quantize
                .map(parse_quantize)
                .transpose()
                .map_err(engine_err)?,
            activations: activations(acts, int8_acts)?,
            large_pages,
        };
        let (inner, path) = py.detach(|| {
            let path = match model {
                Some(p) => p,
                None => tessera_engine::pull::pull(&tessera_engine::pull::DEFAULT_MODEL, |l| {
                    eprintln!("tessera: {l}")
                })
                .map_err(engine_err)?,
            };
            let (model, tok) = tessera_engine::open(&path, &opts)
                .map_err(|e| PyValueError::new_err(format!("{}: {e}", path.display())))?;
            Ok::<_, PyErr>((Loaded { model, tok }, path))
        })?;
        Ok(Engine {
            inner: Arc::new(inner),
            kv,
            path,
        })
    }

    /// The model file or directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Token ids of `text` (no chat template; BOS as the model's tokenizer adds it).
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        self.inner.tok.encode(text).map_err(engine_err)
    }

    /// Text of `ids` (special tokens skipped).
    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        self.inner.tok.decode(&ids).map_err(engine_err)
    }

    /// Generates from `prompt` (a str, or a list of token ids) and returns a dict with
    /// text, ids, prompt_ids, finish ("stop token", "stop string", "length", "context") and rates.
    /// chat: wrap a str prompt in the model's chat template. Keywords: max_tokens (128),
    /// temperature (0 = greedy), top_k (40), top_p (0.95), min_p (0), repetition_penalty
    /// (1), frequency_penalty and presence_penalty (0; OpenAI's, over the last 64
    /// tokens), seed (0), stop (list of str), ignore_eos (False), logit_bias ({token id:
    /// bias in [-100, 100]}, added to the logits before sampling). stream=True returns what
    /// `stream` does instead: an iterator of text pieces as they are generated.
    #[pyo3(signature = (prompt, *, chat=false, stream=false, **kwargs))]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: &Bound<'py, PyAny>,
        chat: bool,
        stream: bool,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if stream {
            return Ok(Bound::new(py, self.stream(prompt, chat, kwargs)?)?.into_any());
        }
        Ok(self.generate_whole(py, prompt, chat, kwargs)?.into_any())
    }

    /// As `generate`, but returns an iterator of text pieces as they are generated; its
    /// `result` holds the generate dict once the iterator is exhausted.
    #[pyo3(signature = (prompt, *, chat=false, **kwargs))]
    fn stream(
        &self,
        prompt: &Bound<'_, PyAny>,
        chat: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<TextIter> {
        let req = self.request(prompt, chat, knobs(kwargs)?)?;
        // A small buffer: the generator thread runs at most a few pieces ahead.
        let (tx, rx) = sync_channel::<Event>(16);
        let inner = Arc::clone(&self.inner);
        let req2 = req.clone();
        std::thread::spawn(move || {
            let r = generate_until(&inner.model, &inner.tok, &req2, |piece| {
                tx.send(Event::Piece(piece.to_owned())).is_ok()
            });
            let _ = tx.send(Event::Done(r.map_err(|e| e.to_string())));
        });
        Ok(TextIter {
            rx: Mutex::new(Some(rx)),
            req,
            result: Mutex::new(None),
        })
    }

    /// Generates the assistant's reply to `messages` (a list of {"role", "content"}
    /// dicts, optionally with "name" or "tool_call_id") through the model's chat template;
    /// keywords as for `generate`.
    #[pyo3(signature = (messages, **kwargs))]
    fn chat<'py>(
        &self,
        py: Python<'py>,
        messages: &Bound<'py, PyList>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut msgs = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let get = |key: &str| -> PyResult<String> {
                m.get_item(key)
                    .and_then(|v| v.extract::<String>())
                    .map_err(|_| {
                        PyValueError::new_err(format!(
                            "messages[{i}]: expected a dict with str \"role\" and \"content\""
                        ))
                    })
            };
            // Optional str keys reach the template as given (as Hugging Face passes them).
            let optional = |key: &str| -> PyResult<Option<String>> {
                match m.get_item(key) {
                    Err(_) => Ok(None),
                    Ok(v) if v.is_none() => Ok(None),
                    Ok(v) => v.extract::<String>().map(Some).map_err(|_| {
                        PyValueError::new_err(format!("messages[{i}][\"{key}\"] must be a str"))
                    }),
                }
            };
            msgs.push(Message {
                name: optional("name")?,
                tool_call_id: optional("tool_call_id")?,
                ..Message::new(&get("role")?, &get("content")?)
            });
        }
        if msgs.is_empty() {
            return Err(PyValueError::new_err("messages: empty conversation"));
        }
        let text = self.inner.tok.chat_messages(&msgs).map_err(engine_err)?;
        let prompt = PyString::new(py, &text);
        self.generate_whole(py, prompt.as_any(), false, kwargs)
    }

    /// Teacher-forced log-probabilities of `text` (a str, raw) or token ids: a dict with
    /// tokens, logprobs (ln p of each token after the first, given its prefix),
    /// top (per position the `top_k` best (id, logit) pairs) and perplexity.
    #[pyo3(signature = (text, *, top_k=5))]
    fn score<'py>(
        &self,
        py: Python<'py>,
        text: &Bound<'py, PyAny>,
        top_k: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ids = self.request(text, false, Knobs::default())?.prompt;
        let inner = &self.inner;
        let s = py
            .detach(|| tessera_engine::score::score(&inner.model, &ids, top_k))
            .map_err(engine_err)?;
        let d = PyDict::new(py);
        d.set_item("tokens", &ids)?;
        let lp: Vec<f64> = s.positions.iter().map(|p| p.logprob).collect();
        let top: Vec<Vec<(u32, f32)>> = s.positions.iter().map(|p| p.top.clone()).collect();
        d.set_item("logprobs", lp)?;
        d.set_item("top", top)?;
        d.set_item("perplexity", s.perplexity)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let c = &self.inner.model.cfg;
        format!(
            "Engine({:?}: {} layers, dim {}, vocab {})",
            self.path.display().to_string(),
            c.n_layers,
            c.dim,
            c.vocab
        )
    }
}

#[derive(Debug)]
enum Event {
    Piece(String),
    Done(Result<Stats, String>),
}

/// Text pieces of a generation in progress (`Engine.stream`).
#[pyclass(module = "tessera._tessera")]
#[derive(Debug)]
pub struct TextIter {
    /// None once finished or closed (dropping the receiver stops the generator thread
    /// at its next piece).
    rx: Mutex<Option<Receiver<Event>>>,
    req: Request,
    result: Mutex<Option<Stats>>,
}

#[pymethods]
impl TextIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<String> {
        fn poisoned<T>(_: T) -> PyErr {
            PyValueError::new_err("stream state poisoned by a panic")
        }
        // The receiver leaves the lock while waiting (with the GIL released), so a
        // concurrent `close` does not block; it is put back unless the stream ended.
        let Some(rx) = self.rx.lock().map_err(poisoned)?.take() else {
            return Err(PyStopIteration::new_err(()));
        };
        let (rx, event) = py.detach(move || {
            let e = rx.recv();
            (rx, e)
        });
        match event {
            Ok(Event::Piece(p)) => {
                *self.rx.lock().map_err(poisoned)? = Some(rx);
                Ok(p)
            }
            Ok(Event::Done(r)) => {
                let stats = r.map_err(PyValueError::new_err)?;
                *self.result.lock().map_err(poisoned)? = Some(stats);
                Err(PyStopIteration::new_err(()))
            }
            Err(_) => Err(PyValueError::new_err(
                "the generation thread ended without a result",
            )),
        }
    }

    /// Stops the generation (the thread ends at its next piece).
    fn close(&self) {
        if let Ok(mut g) = self.rx.lock() {
            *g = None;
        }
    }

    /// The generate dict (text, ids, …) once the iterator is exhausted; None before.
    #[getter]
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let g = self
            .result
            .lock()
            .map_err(|_| PyValueError::new_err("poisoned"))?;
        g.as_ref()
            .map(|s| result_dict(py, &self.req, s))
            .transpose()
    }
}

/// The activation mode from `acts` and the `int8_acts` shorthand (both given must agree).
pub(crate) fn activations(acts: Option<&str>, int8_acts: bool) -> PyResult<Activations> {
    let parsed = acts
        .map(Activations::parse)
        .transpose()
        .map_err(|e| PyValueError::new_err(format!("acts: {e}")))?;
    match (parsed, int8_acts) {
        (Some(a), true) if a != Activations::Int8 => Err(PyValueError::new_err(format!(
            "int8_acts=True contradicts acts={:?}",
            a.name()
        ))),
        (_, true) => Ok(Activations::Int8),
        (Some(a), false) => Ok(a),
        (None, false) => Ok(Activations::default()),
    }
}
