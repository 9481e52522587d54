//! OpenAI's request fields, checked into engine requests, and its error shape.
//!
//! Requests are parsed from `serde_json::Value` field by field, so that a wrong type or
//! an out-of-range value gets a message naming the field (`"max_tokens must be an
//! integer ≥ 1"`), as OpenAI's own API answers, instead of a serde position. Unknown
//! fields are ignored, as vLLM and llama.cpp's server do; but fields OpenAI defines that
//! would change the output and that this server does not implement (tools, suffix, …)
//! are refused with a 400 naming them ([`unsupported`]), so nothing a request asks for
//! is dropped silently.

use axum::http::StatusCode;
use serde_json::{json, Map, Value};
use tessera_engine::chat::Message;
use tessera_engine::generate::{Sampling, MAX_LOGIT_BIAS};
use tessera_engine::scheduler::MAX_TOP_LOGPROBS;
use tessera_engine::structured::Grammar;

/// Most choices one request may ask for.
pub const MAX_N: usize = 16;

/// An OpenAI-style error: status, message, type, and the offending parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status of the response.
    pub status: StatusCode,
    /// What went wrong, for the user.
    pub message: String,
    /// OpenAI's error `type` (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// OpenAI's error `code`, when one applies.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: (!param.is_empty()).then(|| param.to_string()),
            code: None,
        }
    }
    /// An error of any status and type.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }
    /// The JSON body OpenAI clients expect: `{"error": {message, type, param, code}}`.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// A handler's result.
pub type ApiResult<T> = Result<T, ApiError>;

/// The sampling and output fields both endpoints share.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// `max_tokens` (or `max_completion_tokens`); None: as much as the context and the KV pool allow.
    pub max_tokens: Option<usize>,
    /// Temperature, top-k/p, min-p, penalties and seed.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Choices to generate.
    pub n: usize,
    /// Alternatives per token when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    /// Answer as server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with token counts.
    pub include_usage: bool,
    /// Keep going through end-of-turn tokens (benchmarks).
    pub ignore_eos: bool,
    /// `response_format`: JSON output constrained by llguidance.
    pub grammar: Option<Grammar>,
    /// Completions' `echo`: the prompt comes back before the completion, with its
    /// tokens' log-probabilities when `logprobs` is set (the first token's null).
    pub echo: bool,
}

/// A parsed JSON body: an object, or a 400.
pub fn object(body: &[u8]) -> ApiResult<Map<String, Value>> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("", format!("the body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::invalid("", "the body must be a JSON object")),
    }
}

fn present<'a>(m: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    m.get(k).filter(|v| !v.is_null())
}

fn uint(m: &Map<String, Value>, k: &str, lo: u64, hi: u64) -> ApiResult<Option<u64>> {
    match present(m, k) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            _ => Err(ApiError::invalid(
                k,
                format!("{k} must be an integer in {lo}..={hi}, got {v}"),
            )),
        },
    }
}

fn float(m: &Map<String, Value>, k: &str, lo: f64, hi: f64, default: f64) -> ApiResult<f64> {
    match present(m, k) {
        None => Ok(default),
        Some(v) => match v.as_f64() {
            Some(x) if x >= lo && x <= hi => Ok(x),
            _ => Err(ApiError::invalid(
                k,
                format!("{k} must be a number in [{lo}, {hi}], got {v}"),
            )),
        },
    }
}

fn boolean(m: &Map<String, Value>, k: &str) -> ApiResult<bool> {
    match present(m, k) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::invalid(
            k,
            format!("{k} must be a boolean, got {v}"),
        )),
    }
}

/// The served model's name must be asked for (404 otherwise, as OpenAI answers).
pub fn check_model(m: &Map<String, Value>, served: &str) -> ApiResult<()> {
    match present(m, "model") {
        Some(Value::String(s)) if s == served => Ok(()),
        Some(Value::String(s)) => Err(model_not_found(s, served)),
        Some(v) => Err(ApiError::invalid(
            "model",
            format!("model must be a string, got {v}"),
        )),
        None => Err(ApiError::invalid("model", "model is required")),
    }
}

/// The 404 for a model this server does not serve (a request's `model`, or
/// `/v1/models/{model}`), as OpenAI answers it.
pub fn model_not_found(asked: &str, served: &str) -> ApiError {
    ApiError {
        code: Some("model_not_found"),
        param: Some("model".into()),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model '{asked}' does not exist; this server serves '{served}'"),
        )
    }
}

/// The fields shared by chat and completions. `chat` selects the chat spelling of the
/// log-probability fields (`logprobs: bool` + `top_logprobs`) over the completions one
/// (`logprobs: int`).
pub fn common(m: &Map<String, Value>, chat: bool) -> ApiResult<Common> {
    let echo = !chat && boolean(m, "echo")?;
    // With echo, max_tokens 0 asks for the prompt's scores alone (as evaluation
    // harnesses do).
    let least = u64::from(!echo);
    let max_tokens = match (
        uint(m, "max_completion_tokens", least, u32::MAX as u64)?,
        uint(m, "max_tokens", least, u32::MAX as u64)?,
    ) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens {b} and max_completion_tokens {a} disagree; give one"),
            ))
        }
        (a, b) => a.or(b),
    };
    let temperature = float(m, "temperature", 0.0, 2.0, 1.0)?;
    let top_p = float(m, "top_p", 0.0, 1.0, 1.0)?;
    if top_p == 0.0 {
        return Err(ApiError::invalid("top_p", "top_p must be > 0"));
    }
    let stop = match present(m, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid("stop", "stop must be a string or a list of strings")
            })?,
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!("stop must be a string or a list of strings, got {v}"),
            ))
        }
    };
    if stop.len() > 4 || stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid(
            "stop",
            "stop takes up to 4 non-empty strings",
        ));
    }
    let n = uint(m, "n", 1, MAX_N as u64)?.unwrap_or(1) as usize;
    let logprobs = if chat {
        let top = uint(m, "top_logprobs", 0, MAX_TOP_LOGPROBS as u64)?;
        match (boolean(m, "logprobs")?, top) {
            (true, t) => Some(t.unwrap_or(0) as usize),
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                ))
            }
            (false, None) => None,
        }
    } else {
        uint(m, "logprobs", 0, 5)?.map(|v| v as usize)
    };
    let include_usage = match present(m, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")?,
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("stream_options must be an object, got {v}"),
            ))
        }
    };
    let grammar = match present(m, "response_format") {
        None => None,
        Some(rf) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Grammar::JsonObject),
            Some("json_schema") => match rf.get("json_schema").and_then(|j| j.get("schema")) {
                Some(s @ Value::Object(_)) => Some(Grammar::JsonSchema(s.clone())),
                Some(Value::Bool(true)) => Some(Grammar::JsonObject),
                _ => {
                    return Err(ApiError::invalid(
                        "response_format",
                        "response_format json_schema needs json_schema.schema, an object",
                    ))
                }
            },
            _ => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!("response_format {rf}: type must be text, json_object or json_schema"),
                ))
            }
        },
    };
    let sampling = Sampling {
        logit_bias: logit_bias(m)?,
        temperature: temperature as f32,
        top_k: uint(m, "top_k", 0, 1 << 20)?.unwrap_or(0) as usize,
        top_p: top_p as f32,
        min_p: float(m, "min_p", 0.0, 1.0, 0.0)? as f32,
        repetition_penalty: float(m, "repetition_penalty", 0.01, 10.0, 1.0)? as f32,
        frequency_penalty: float(m, "frequency_penalty", -2.0, 2.0, 0.0)? as f32,
        presence_penalty: float(m, "presence_penalty", -2.0, 2.0, 0.0)? as f32,
        seed: uint(m, "seed", 0, u64::MAX)?.unwrap_or(0),
        ..Sampling::default()
    };
    Ok(Common {
        max_tokens: max_tokens.map(|v| v as usize),
        sampling,
        stop,
        n,
        logprobs,
        stream: boolean(m, "stream")?,
        include_usage,
        ignore_eos: boolean(m, "ignore_eos")?,
        grammar,
        echo,
    })
}

/// `logit_bias`: token ids (as decimal strings, OpenAI's spelling) to biases in ±100.
/// Ids past the vocabulary are checked where it is known (the route).
fn logit_bias(m: &Map<String, Value>) -> ApiResult<Vec<(u32, f32)>> {
    let o = match present(m, "logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("logit_bias must be an object of token ids to numbers, got {v}"),
            ))
        }
    };
    o.iter()
        .map(|(k, v)| {
            // Canonical decimal only, so two keys cannot name one token ("1", "01").
            let id = k
                .parse::<u32>()
                .ok()
                .filter(|t| t.to_string() == *k)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias keys must be token ids (decimal integers), got {k:?}"),
                    )
                })?;
            let lim = MAX_LOGIT_BIAS as f64;
            match v.as_f64() {
                Some(b) if b.abs() <= lim => Ok((id, b as f32)),
                _ => Err(ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias[{k:?}] must be a number in [-{lim}, {lim}], got {v}"),
                )),
            }
        })
        .collect()
}

/// Fields both endpoints read.
#[rustfmt::skip]
const COMMON_FIELDS: &[&str] = &[
    "model", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
    "presence_penalty", "logit_bias", "logprobs", "stop", "seed", "response_format",
    "ignore_eos",
];
/// Fields only chat reads (tools, audio and modalities to refuse all but their neutral
/// spellings; `parallel_tool_calls` means nothing without tools).
#[rustfmt::skip]
const CHAT_FIELDS: &[&str] = &[
    "messages", "top_logprobs", "tools", "tool_choice", "functions", "function_call",
    "parallel_tool_calls", "audio", "modalities",
];
/// Fields only completions read.
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "best_of", "suffix"];
/// OpenAI fields about accounts, storage and routing at OpenAI: they cannot change an
/// answer, so they are accepted and have no effect here.
#[rustfmt::skip]
const NO_EFFECT_FIELDS: &[&str] = &[
    "user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
];

/// A field this endpoint does not read is a 400 naming it (OpenAI answers the same), so
/// a misspelt `max_token` or a vendor extension is never dropped silently.
fn unknown_fields(m: &Map<String, Value>, chat: bool) -> ApiResult<()> {
    let own = if chat { CHAT_FIELDS } else { COMPLETION_FIELDS };
    let known = |k: &str| {
        [COMMON_FIELDS, own, NO_EFFECT_FIELDS]
            .iter()
            .any(|l| l.contains(&k))
    };
    let Some(k) = m.keys().find(|k| !known(k)) else {
        return Ok(());
    };
    let endpoint = if chat {
        "chat completions"
    } else {
        "completions"
    };
    let mut read: Vec<&str> = [COMMON_FIELDS, own].concat();
    read.sort_unstable();
    Err(ApiError::invalid(
        k,
        format!(
            "unrecognized field {k:?}: {endpoint} here read {}",
            read.join(", ")
        ),
    ))
}

/// Refuses the fields OpenAI defines that would change the output and that this server
/// does not implement (chat: function and tool calling, audio; completions: `echo`
/// with `stream`, `best_of` > 1, `suffix`). Their neutral spellings (an empty tool
/// list, `"none"`, `best_of: 1`) pass.
pub fn unsupported(m: &Map<String, Value>, chat: bool) -> ApiResult<()> {
    let refuse = |k: &str, what: &str| {
        Err(ApiError::invalid(
            k,
            format!("{k} is not supported by this server ({what})"),
        ))
    };
    unknown_fields(m, chat)?;
    let neutral_choice = |v: &Value| matches!(v.as_str(), Some("none" | "auto"));
    if chat {
        for k in ["tools", "functions"] {
            if present(m, k).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
                return refuse(k, "it does not generate or parse tool calls");
            }
        }
        for k in ["tool_choice", "function_call"] {
            if present(m, k).is_some_and(|v| !neutral_choice(v)) {
                return refuse(k, "it does not generate or parse tool calls");
            }
        }
        if present(m, "audio").is_some() {
            return refuse("audio", "it answers in text only");
        }
        let text_only = |v: &Value| {
            v.as_array()
                .is_some_and(|a| a.iter().all(|x| x.as_str() == Some("text")))
        };
        if present(m, "modalities").is_some_and(|v| !text_only(v)) {
            return refuse("modalities", "it answers in text only");
        }
    } else {
        if boolean(m, "echo")? && boolean(m, "stream")? {
            return refuse("echo", "not with stream: echo answers as one response");
        }
        if present(m, "best_of").is_some_and(|v| v.as_u64() != Some(1)) {
            return refuse("best_of", "use n for several completions");
        }
        if present(m, "suffix").is_some_and(|v| v.as_str() != Some("")) {
            return refuse("suffix", "it does not fill in the middle");
        }
    }
    Ok(())
}

/// `messages` as chat messages (string content, or a list of text parts).
pub fn messages(m: &Map<String, Value>) -> ApiResult<Vec<Message>> {
    let list = match present(m, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid("messages", "messages must not be empty"))
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "messages",
                format!("messages must be a list, got {v}"),
            ))
        }
        None => return Err(ApiError::invalid("messages", "messages is required")),
    };
    list.iter()
        .enumerate()
        .map(|(i, msg)| {
            let p = format!("messages[{i}]");
            let role = msg
                .get("role")
                .and_then(Value::as_str)
                .filter(|r| ["system", "user", "assistant", "developer", "tool"].contains(r))
                .ok_or_else(|| ApiError::invalid(&p, format!("{p}.role must be system, user, assistant, developer or tool")))?;
            let content = match msg.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|part| match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => Ok(t.to_string()),
                        _ => Err(ApiError::invalid(&p, format!("{p}.content parts must be {{\"type\": \"text\", \"text\": ...}}"))),
                    })
                    .collect::<ApiResult<Vec<_>>>()?
                    .join(""),
                Some(Value::Null) | None if role == "assistant" => String::new(),
                _ => return Err(ApiError::invalid(&p, format!("{p}.content must be a string or a list of text parts"))),
            };
            // A history with tool calls cannot be rendered faithfully: this server has no
            // tools (`unsupported` refuses them), so its messages carry no calls either.
            for key in ["tool_calls", "function_call"] {
                match msg.get(key) {
                    None | Some(Value::Null) => {}
                    Some(Value::Array(a)) if a.is_empty() => {}
                    Some(_) => return Err(ApiError::invalid(&format!("{p}.{key}"), format!("{p}.{key} is not supported: this server does not implement tool calling"))),
                }
            }
            let text_field = |key: &str| match msg.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(ApiError::invalid(&format!("{p}.{key}"), format!("{p}.{key} must be a string, got {v}"))),
            };
            // "developer" is OpenAI's newer name for the system role.
            let role = if role == "developer" { "system" } else { role };
            Ok(Message {
                name: text_field("name")?,
                tool_call_id: text_field("tool_call_id")?,
                ..Message::new(role, &content)
            })
        })
        .collect()
}

/// A completions `prompt`: text, a list of texts, token ids, or a list of token-id lists.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A string, tokenized by the server.
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

/// The request's prompts: a string, a list of strings, token ids or a list of id lists.
pub fn prompts(m: &Map<String, Value>) -> ApiResult<Vec<Prompt>> {
    let bad = || {
        ApiError::invalid("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of such lists")
    };
    let ids = |a: &[Value]| -> ApiResult<Vec<u32>> {
        a.iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&x| x <= u32::MAX as u64)
                    .map(|x| x as u32)
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)
    };
    let out = match present(m, "prompt") {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid("prompt", "prompt must not be empty"))
        }
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) => a
                .iter()
                .map(|v| v.as_str().map(|s| Prompt::Text(s.into())).ok_or_else(bad))
                .collect::<ApiResult<_>>()?,
            Value::Number(_) => vec![Prompt::Tokens(ids(a)?)],
            Value::Array(_) => a
                .iter()
                .map(|v| {
                    v.as_array()
                        .ok_or_else(bad)
                        .and_then(|l| ids(l))
                        .map(Prompt::Tokens)
                })
                .collect::<ApiResult<_>>()?,
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    if out.len() > MAX_N {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {MAX_N} prompts per request"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request fuzz target's seeds (`fuzz/seeds/request`) are valid requests, so
    /// the fuzzer starts from bodies that reach every validation step.
    #[test]
    fn fuzz_seeds_are_valid_requests() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/request");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("fuzz/seeds/request") {
            let path = entry.unwrap().path();
            let body = std::fs::read(&path).unwrap();
            let m = object(&body).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            check_model(&m, "smollm2-135m-instruct-q4_1").unwrap();
            let chat = m.contains_key("messages");
            unsupported(&m, chat).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            common(&m, chat).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            if chat {
                assert!(!messages(&m).unwrap().is_empty());
            } else {
                assert!(!prompts(&m).unwrap().is_empty());
            }
            seen += 1;
        }
        assert!(seen >= 3, "{seen} seeds");
    }

    /// Fields an endpoint does not read are 400s naming them, OpenAI's no-effect fields
    /// pass, and the two spellings of max_tokens must agree.
    #[test]
    fn unknown_fields_are_refused() {
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        let completion = json!({"model": "m", "prompt": "x"});
        let with = |base: &Value, k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            object(b.to_string().as_bytes()).unwrap()
        };
        for (base, is_chat, k, v) in [
            (&chat, true, "max_token", json!(4)),
            (&chat, true, "echo", json!(true)),
            (&chat, true, "stop_token_ids", json!([2])),
            (&completion, false, "top_logprobs", json!(2)),
            (&completion, false, "messages", json!([])),
            (&completion, false, "min_tokens", json!(3)),
        ] {
            let e = unsupported(&with(base, k, v), is_chat).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(k), "{e:?}");
            assert!(
                e.message.contains("max_tokens"),
                "lists what is read: {e:?}"
            );
        }
        for (base, is_chat) in [(&chat, true), (&completion, false)] {
            for k in NO_EFFECT_FIELDS.iter().chain(COMMON_FIELDS) {
                // Known fields pass this check (their values are checked by `common`).
                unsupported(&with(base, k, json!(null)), is_chat).unwrap();
            }
        }
        let both = |a: u64, b: u64| {
            let mut m = with(&chat, "max_tokens", json!(a));
            m.insert("max_completion_tokens".into(), json!(b));
            common(&m, true)
        };
        assert_eq!(both(7, 7).unwrap().max_tokens, Some(7));
        assert_eq!(both(7, 8).unwrap_err().param.as_deref(), Some("max_tokens"));
    }

    /// A message's `name` and `tool_call_id` are kept for the template; tool calls in the
    /// history and non-string names are 400s naming the field.
    #[test]
    fn message_fields_are_kept_or_refused() {
        let req =
            |messages: Value| object(json!({"messages": messages}).to_string().as_bytes()).unwrap();
        let m = req(json!([{"role": "user", "content": "Hi", "name": "Ada"},
                            {"role": "assistant", "content": "Hello", "tool_calls": []},
                            {"role": "tool", "content": "42", "tool_call_id": "call_7"}]));
        let got = messages(&m).unwrap();
        assert_eq!(got[0].name.as_deref(), Some("Ada"));
        assert_eq!(
            (got[1].name.as_deref(), got[1].tool_call_id.as_deref()),
            (None, None)
        );
        assert_eq!(got[2].tool_call_id.as_deref(), Some("call_7"));
        let calls = json!([{"id": "call_7", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]);
        for (bad, param) in [
            (
                json!([{"role": "assistant", "content": null, "tool_calls": calls}]),
                "messages[0].tool_calls",
            ),
            (
                json!([{"role": "assistant", "content": "x", "function_call": {"name": "f"}}]),
                "messages[0].function_call",
            ),
            (
                json!([{"role": "user", "content": "x"}, {"role": "user", "content": "y", "name": 3}]),
                "messages[1].name",
            ),
            (
                json!([{"role": "tool", "content": "x", "tool_call_id": ["a"]}]),
                "messages[0].tool_call_id",
            ),
        ] {
            let e = messages(&req(bad.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{bad}: {e:?}");
        }
    }
}
