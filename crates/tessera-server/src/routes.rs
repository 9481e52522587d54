//! The HTTP endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/models` (and
//! `/v1/models/{model}`), `/health`, `/metrics`. Handlers parse and check a request
//! ([`crate::api`]), hand its sequences to the engine thread and turn the events that
//! come back into OpenAI's response or its SSE chunk stream (`sse`). Every accepted
//! request ends in its completion or an error body; nothing is dropped silently.

use crate::api::{self, ApiError, ApiResult, Common, Prompt};
use crate::engine::{EngineHandle, EventRx, Refusal};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use sse::stream_response;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tessera_engine::chat::ChatTemplate;
use tessera_engine::scheduler::{Event, FinishReason, GenRequest, TokenLogprob, Usage};
use tessera_engine::tokenizer::Tokenizer;

mod sse;

/// Everything a handler needs.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The engine thread.
    pub engine: EngineHandle,
    /// The model's tokenizer.
    pub tok: Arc<Tokenizer>,
    /// The model's chat template, if it has one.
    pub template: Option<Arc<ChatTemplate>>,
    /// Model id in responses and `/v1/models`.
    pub model_name: String,
    /// Required bearer token, if set.
    pub api_key: Option<String>,
    /// Most sequences accepted and unfinished before new requests get 429.
    pub max_queue: usize,
    /// Unix time the server started (`created` in `/v1/models`).
    pub created: u64,
}

/// The router over `state`, refusing bodies over `max_body` bytes (413).
pub fn router(state: AppState, max_body: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*model}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

fn error_response(e: &ApiError) -> Response {
    let mut r = (e.status, Json(e.body())).into_response();
    if e.status == StatusCode::TOO_MANY_REQUESTS {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

async fn not_found() -> Response {
    error_response(&ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint (see /v1/chat/completions, /v1/completions, /v1/models[/{model}], /health, /metrics)",
    ))
}

fn authorize(st: &AppState, headers: &HeaderMap) -> ApiResult<()> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if g == key => Ok(()),
        _ => Err(ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or incorrect API key (send Authorization: Bearer KEY)",
            )
        }),
    }
}

fn body_of(body: Result<Bytes, BytesRejection>, limit_hint: &str) -> ApiResult<Map<String, Value>> {
    match body {
        Ok(b) => api::object(&b),
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is over the server's limit ({limit_hint})"),
        )),
        Err(r) => Err(ApiError::invalid("", r.body_text())),
    }
}

/// The served model as OpenAI's model object.
fn model_object(st: &AppState) -> Value {
    json!({"id": st.model_name, "object": "model", "created": st.created, "owned_by": "tessera"})
}

async fn models(State(st): State<AppState>, headers: HeaderMap) -> Response {
    model_listing(&st, &headers, || {
        Ok(json!({"object": "list", "data": [model_object(&st)]}))
    })
}

/// `GET /v1/models/{model}` (the client's `models.retrieve`): the served model, 404 for
/// any other name. Names may hold slashes (`HuggingFaceTB/SmolLM2-135M-Instruct`).
async fn model(
    State(st): State<AppState>,
    Path(asked): Path<String>,
    headers: HeaderMap,
) -> Response {
    model_listing(&st, &headers, || match asked == st.model_name {
        true => Ok(model_object(&st)),
        false => Err(api::model_not_found(&asked, &st.model_name)),
    })
}

/// Authorizes, then answers `body` (both model endpoints), counting the outcome.
fn model_listing(
    st: &AppState,
    headers: &HeaderMap,
    body: impl FnOnce() -> ApiResult<Value>,
) -> Response {
    match authorize(st, headers).and_then(|()| body()) {
        Ok(v) => {
            st.engine.metrics.request("models", 200);
            Json(v).into_response()
        }
        Err(e) => {
            st.engine.metrics.request("models", e.status.as_u16());
            error_response(&e)
        }
    }
}

async fn health(State(st): State<AppState>) -> Response {
    match st.engine.shared.shutting_down.load(Ordering::Relaxed) {
        true => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting down"})),
        )
            .into_response(),
        false => Json(json!({"status": "ok"})).into_response(),
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, ct)], st.engine.metrics.encode()).into_response()
}

/// Which endpoint a generation answers, for response shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn endpoint(self) -> &'static str {
        match self {
            Kind::Chat => "chat_completions",
            Kind::Completion => "completions",
        }
    }
}

async fn chat(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(st, headers, body, Kind::Chat).await
}

async fn completions(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(st, headers, body, Kind::Completion).await
}

async fn respond(
    st: AppState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Response {
    let r = generate(&st, &headers, body, kind).await;
    let status = match &r {
        Ok(_) => 200,
        Err(e) => e.status.as_u16(),
    };
    st.engine.metrics.request(kind.endpoint(), status);
    r.unwrap_or_else(|e| error_response(&e))
}

/// One request's sequences and how to answer.
struct Job {
    kind: Kind,
    common: Common,
    /// Prompt token counts, one per prompt (choices `p·n .. (p+1)·n` are prompt p's).
    prompt_lens: Vec<usize>,
    id: String,
    created: u64,
    model: String,
}

async fn generate(
    st: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> ApiResult<Response> {
    authorize(st, headers)?;
    if st.engine.shared.shutting_down.load(Ordering::Relaxed) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        ));
    }
    let m = body_of(body, "see --max-body")?;
    api::check_model(&m, &st.model_name)?;
    api::unsupported(&m, kind == Kind::Chat)?;
    let common = api::common(&m, kind == Kind::Chat)?;
    let mut echo: Option<Vec<Echo>> = None;
    let prompts: Vec<Vec<u32>> = match kind {
        Kind::Chat => {
            let msgs = api::messages(&m)?;
            let t = st.template.as_ref().ok_or_else(|| {
                ApiError::invalid(
                    "messages",
                    "this model has no chat template; use /v1/completions",
                )
            })?;
            let text = t
                .render(&msgs, true)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
            vec![st
                .tok
                .encode_chat(&text)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?]
        }
        Kind::Completion => {
            let given = api::prompts(&m)?;
            let ids = given
                .iter()
                .map(|p| match p {
                    Prompt::Text(t) => st
                        .tok
                        .encode(t)
                        .map_err(|e| ApiError::invalid("prompt", e.to_string())),
                    Prompt::Tokens(ids) => Ok(ids.clone()),
                })
                .collect::<ApiResult<Vec<_>>>()?;
            let vocab = st.engine.vocab;
            if let Some(t) = ids.iter().flatten().find(|&&t| t as usize >= vocab) {
                let msg = format!("token id {t} is outside the vocabulary of {vocab}");
                return Err(ApiError::invalid("prompt", msg));
            }
            if let Some(i) = ids.iter().position(Vec::is_empty) {
                let which = match ids.len() {
                    1 => "the prompt".to_string(),
                    _ => format!("prompt {i}"),
                };
                return Err(ApiError::invalid(
                    "prompt",
                    format!("{which} has no tokens"),
                ));
            }
            if common.echo {
                echo = Some(echoes(st, &given, &ids, common.logprobs).await?);
            }
            ids
        }
    };
    if common.max_tokens == Some(0) {
        // Only `echo` allows it: the prompts' scores, nothing generated.
        let echo = echo.unwrap_or_default();
        let choices: Vec<Value> = (0..prompts.len() * common.n)
            .map(|i| {
                let e = &echo[i / common.n];
                let lps = common.logprobs.map(|_| completion_logprobs(&e.entries));
                json!({"index": i, "text": e.text, "logprobs": lps, "finish_reason": "length"})
            })
            .collect();
        // Each prompt counts once, whatever n is, as `usage_json` counts it.
        let prompt: usize = prompts.iter().map(Vec::len).sum();
        let usage = json!({"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt,
                           "prompt_tokens_details": {"cached_tokens": 0}});
        return Ok(Json(
            json!({"id": format!("cmpl-{:016x}", rand_id()), "object": "text_completion",
            "created": now_s(), "model": st.model_name, "choices": choices, "usage": usage}),
        )
        .into_response());
    }
    let field = match kind {
        Kind::Chat => "messages",
        Kind::Completion => "prompt",
    };
    let reqs = requests(st, field, &prompts, &common)?;
    admit(st, reqs.len())?;
    let rxs = st.engine.submit(reqs).await.map_err(|r| refused(r, kind))?;
    let job = Job {
        kind,
        prompt_lens: prompts.iter().map(Vec::len).collect(),
        id: format!(
            "{}-{:016x}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            rand_id()
        ),
        created: now_s(),
        model: st.model_name.clone(),
        common,
    };
    if job.common.stream {
        return Ok(stream_response(st.tok.clone(), job, rxs));
    }
    Ok(Json(collect(&st.tok, &job, rxs, echo.as_deref()).await?).into_response())
}

/// A 429 unless `n` more sequences or scorings fit under `--max-queue`.
fn admit(st: &AppState, n: usize) -> ApiResult<()> {
    let queued = st.engine.queued();
    if queued + n > st.max_queue {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "{queued} sequences and prompt scorings are in flight (limit {}); retry shortly",
                st.max_queue
            ),
        ));
    }
    Ok(())
}

/// The prompt's part of an `echo` answer: the prompt as given (token ids decoded, their
/// special tokens spelled out) and, when log-probabilities are asked for, one entry per
/// prompt token, the first with null log-probability and alternatives (nothing predicts
/// it), each with the byte offset in `text` where its text starts.
#[derive(Default)]
struct Echo {
    text: String,
    entries: Vec<Value>,
}

/// Each prompt's [`Echo`], scored by the engine thread ([`EngineHandle::score`]) when
/// `logprobs` asks for alternatives.
async fn echoes(
    st: &AppState,
    given: &[Prompt],
    ids: &[Vec<u32>],
    logprobs: Option<usize>,
) -> ApiResult<Vec<Echo>> {
    if logprobs.is_some() {
        admit(st, ids.iter().filter(|p| p.len() > 1).count())?;
    }
    let mut out = Vec::with_capacity(ids.len());
    for (p, ids) in given.iter().zip(ids) {
        let ctx = st.engine.context;
        if ids.len() > ctx {
            let msg = format!(
                "the prompt has {} tokens; this model's context is {ctx} tokens",
                ids.len()
            );
            return Err(ApiError::invalid("prompt", msg));
        }
        let decoded = |special| {
            st.tok
                .text_offsets(ids, special)
                .map_err(|e| ApiError::invalid("prompt", e.to_string()))
        };
        let (text, offsets) = match p {
            // Without logprobs the offsets go nowhere and a text prompt is echoed as given.
            Prompt::Text(t) if logprobs.is_none() => (t.clone(), Vec::new()),
            Prompt::Tokens(_) => decoded(true)?,
            Prompt::Text(t) => {
                let (mut with, mut offsets) = decoded(true)?;
                if with != *t {
                    (with, offsets) = decoded(false)?;
                }
                if with != *t {
                    // A tokenizer that does not give the text back (a BOS it adds, a
                    // normalizer): the offsets are its decoding's, kept inside the text.
                    tessera_engine::tokenizer::fit_offsets(t, &mut offsets);
                }
                (t.clone(), offsets)
            }
        };
        let mut entries = Vec::new();
        if let Some(k) = logprobs {
            let scored = match ids.len() {
                0 | 1 => None,
                _ => Some(
                    st.engine
                        .score(ids.clone(), k)
                        .await
                        .map_err(|r| refused(r, Kind::Completion))?,
                ),
            };
            for (i, (&t, &offset)) in ids.iter().zip(&offsets).enumerate() {
                let piece = st.tok.piece(t);
                let at = i
                    .checked_sub(1)
                    .and_then(|j| Some(&scored.as_ref()?.positions[j]));
                let (lp, top) = match at {
                    None => (Value::Null, Value::Null),
                    Some(s) => {
                        let top = s
                            .top
                            .iter()
                            .map(|&(a, l)| (st.tok.piece(a), json!(l as f64 - s.log_norm)));
                        (json!(s.logprob), Value::Object(top.collect()))
                    }
                };
                entries.push(json!({"token": piece, "logprob": lp, "top": top, "offset": offset}));
            }
        }
        out.push(Echo { text, entries });
    }
    Ok(out)
}

/// The answer to what the engine thread refused: a 400 naming the request field at
/// fault (the engine's field names mapped to the endpoint's), a 503 while the server
/// shuts down, a 500 for the engine's own failure.
fn refused(r: Refusal, kind: Kind) -> ApiError {
    match r {
        Refusal::Request { field, detail } => {
            let param = match (field, kind) {
                ("prompt", Kind::Chat) => "messages",
                ("grammar", _) => "response_format",
                ("logprobs", Kind::Chat) => "top_logprobs",
                // Sampling's message names the parameter (temperature, logit_bias, …).
                ("sampling", _) => "",
                (other, _) => other,
            };
            ApiError::invalid(param, detail)
        }
        Refusal::Stopped => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        ),
        Refusal::Failed(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e),
    }
}

/// The engine requests of every prompt × choice, max_tokens checked against the context;
/// `field` is the request field the prompts came from, named by a prompt's error.
fn requests(
    st: &AppState,
    field: &'static str,
    prompts: &[Vec<u32>],
    c: &Common,
) -> ApiResult<Vec<GenRequest>> {
    let ctx = st.engine.context;
    let vocab = st.engine.vocab;
    if let Some((t, _)) = c
        .sampling
        .logit_bias
        .iter()
        .find(|(t, _)| *t as usize >= vocab)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("logit_bias names token {t}; the vocabulary has {vocab} tokens"),
        ));
    }
    let mut out = Vec::new();
    for p in prompts {
        if p.len() >= ctx {
            return Err(ApiError::invalid(
                field,
                format!(
                    "the prompt has {} tokens; this model's context is {ctx} tokens",
                    p.len()
                ),
            ));
        }
        let max_tokens = match c.max_tokens {
            Some(v) if p.len() + v > ctx => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("this model's context is {ctx} tokens: the prompt has {} and max_tokens asks for {v} more", p.len()),
                ))
            }
            Some(v) => v,
            // As much as the context and the KV pool allow.
            None => (ctx.min(st.engine.pool_positions)).saturating_sub(p.len()).max(1),
        };
        for i in 0..c.n {
            let mut sampling = c.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(i as u64);
            out.push(GenRequest {
                prompt: p.clone(),
                max_tokens,
                sampling,
                stop: c.stop.clone(),
                ignore_eos: c.ignore_eos,
                logprobs: c.logprobs,
                grammar: c.grammar.clone(),
            });
        }
    }
    Ok(out)
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now())
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::StopToken | FinishReason::StopString | FinishReason::Cancelled => "stop",
    }
}

/// One token's log-probability in the endpoint's shape.
fn logprob_json(
    tok: &Tokenizer,
    kind: Kind,
    token: u32,
    lp: &TokenLogprob,
    offset: usize,
) -> Value {
    let text = |t: u32| tok.piece(t);
    match kind {
        Kind::Chat => {
            let entry = |t: u32, l: f32| json!({"token": text(t), "logprob": l, "bytes": text(t).into_bytes()});
            let mut e = entry(token, lp.logprob);
            e["top_logprobs"] = Value::Array(lp.top.iter().map(|&(t, l)| entry(t, l)).collect());
            e
        }
        Kind::Completion => {
            let top: Map<String, Value> =
                lp.top.iter().map(|&(t, l)| (text(t), json!(l))).collect();
            json!({"token": text(token), "logprob": lp.logprob, "top": top, "offset": offset})
        }
    }
}

/// Completions' parallel arrays from per-token entries.
fn completion_logprobs(entries: &[Value]) -> Value {
    let col = |k: &str| Value::Array(entries.iter().map(|e| e[k].clone()).collect());
    json!({"tokens": col("token"), "token_logprobs": col("logprob"), "top_logprobs": col("top"), "text_offset": col("offset")})
}

fn usage_json(job: &Job, usages: &[Usage]) -> Value {
    let n = job.common.n;
    let prompt: usize = job.prompt_lens.iter().sum();
    let completion: usize = usages.iter().map(|u| u.completion_tokens).sum();
    let cached: usize = usages
        .iter()
        .step_by(n.max(1))
        .map(|u| u.cached_tokens)
        .sum();
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Waits for every choice and builds the whole response.
async fn collect(
    tok: &Tokenizer,
    job: &Job,
    rxs: Vec<EventRx>,
    echo: Option<&[Echo]>,
) -> ApiResult<Value> {
    let mut choices = Vec::new();
    let mut usages = Vec::new();
    for (index, mut rx) in rxs.into_iter().enumerate() {
        let prefix = echo.map(|e| &e[index / job.common.n]);
        let mut entries = prefix.map(|e| e.entries.clone()).unwrap_or_default();
        let mut offset = prefix.map_or(0, |e| e.text.len());
        loop {
            match rx.recv().await {
                Some(Event::Token {
                    token,
                    text,
                    logprob,
                    ..
                }) => {
                    if let Some(lp) = &logprob {
                        entries.push(logprob_json(tok, job.kind, token, lp, offset));
                    }
                    offset += text.len();
                }
                Some(Event::Finished {
                    reason,
                    text,
                    usage,
                    ..
                }) => {
                    let lps = job.common.logprobs.map(|_| match job.kind {
                        Kind::Chat => json!({"content": entries}),
                        Kind::Completion => completion_logprobs(&entries),
                    });
                    choices.push(match job.kind {
                        Kind::Chat => json!({"index": index, "message": {"role": "assistant", "content": text},
                                             "logprobs": lps, "finish_reason": finish_reason(reason)}),
                        Kind::Completion => {
                            let text = prefix.map_or(String::new(), |e| e.text.clone()) + &text;
                            json!({"index": index, "text": text, "logprobs": lps,
                                   "finish_reason": finish_reason(reason)})
                        }
                    });
                    usages.push(usage);
                    break;
                }
                Some(Event::Failed { error, .. }) => {
                    return Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        error,
                    ))
                }
                None => {
                    return Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "the engine stopped",
                    ))
                }
            }
        }
    }
    let object = match job.kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    Ok(
        json!({"id": job.id, "object": object, "created": job.created, "model": job.model,
              "choices": choices, "usage": usage_json(job, &usages)}),
    )
}
