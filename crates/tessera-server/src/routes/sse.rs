//! A streamed answer: the engine's events for every choice, merged as they come, turned
//! into OpenAI's SSE chunks (chat deltas or completion texts), then the usage chunk when
//! asked for and `[DONE]`. A choice whose engine channel ends early gets an error event,
//! so a client never waits on a stream that will not finish.

use super::{completion_logprobs, finish_reason, logprob_json, usage_json, Job, Kind};
use crate::api::ApiError;
use crate::engine::EventRx;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tessera_engine::scheduler::{Event, Usage};
use tessera_engine::tokenizer::Tokenizer;

/// One choice's events, tagged with its index (`None`: its channel closed early).
type ChoiceEvents = std::pin::Pin<Box<dyn Stream<Item = (usize, Option<Event>)> + Send>>;

/// State of one streamed response.
struct StreamState {
    tok: Arc<Tokenizer>,
    job: Job,
    events: stream::SelectAll<ChoiceEvents>,
    usages: Vec<Option<Usage>>,
    offsets: Vec<usize>,
    left: usize,
    done: bool,
}

impl StreamState {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> SseEvent {
        let object = match self.job.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let mut j = json!({"id": self.job.id, "object": object, "created": self.job.created,
                           "model": self.job.model, "choices": choices});
        if self.job.common.include_usage {
            j["usage"] = usage.unwrap_or(Value::Null);
        }
        SseEvent::default().data(j.to_string())
    }

    fn choice(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        match self.job.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}])
            }
            Kind::Completion => {
                json!([{"index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}])
            }
        }
    }

    /// The SSE events for one engine event of choice `index`.
    fn on_event(&mut self, index: usize, ev: Option<Event>) -> Vec<SseEvent> {
        match ev {
            Some(Event::Token {
                token,
                text,
                logprob,
                ..
            }) => {
                if text.is_empty() && logprob.is_none() {
                    return Vec::new();
                }
                let lps = match &logprob {
                    None => Value::Null,
                    Some(lp) => {
                        let e =
                            logprob_json(&self.tok, self.job.kind, token, lp, self.offsets[index]);
                        match self.job.kind {
                            Kind::Chat => json!({"content": [e]}),
                            Kind::Completion => completion_logprobs(&[e]),
                        }
                    }
                };
                self.offsets[index] += text.len();
                vec![self.chunk(self.choice(index, Some(&text), lps, None), None)]
            }
            Some(Event::Finished {
                reason,
                tail,
                usage,
                ..
            }) => {
                let mut out = Vec::new();
                if !tail.is_empty() {
                    out.push(self.chunk(self.choice(index, Some(&tail), Value::Null, None), None));
                }
                let finish = finish_reason(reason);
                let none = match self.job.kind {
                    Kind::Chat => None,
                    Kind::Completion => Some(""),
                };
                out.push(self.chunk(self.choice(index, none, Value::Null, Some(finish)), None));
                self.usages[index] = Some(usage);
                self.left -= 1;
                out
            }
            Some(Event::Failed { error, .. }) => self.fail(index, &error),
            None => self.fail(index, "the engine stopped"),
        }
    }

    fn fail(&mut self, index: usize, error: &str) -> Vec<SseEvent> {
        self.left = self.left.saturating_sub(1);
        self.usages[index] = Some(Usage::default());
        let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", error);
        vec![SseEvent::default().data(e.body().to_string())]
    }

    /// What follows the last choice: the usage chunk when asked for, then `[DONE]`.
    fn closing(&self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.job.common.include_usage {
            let u: Vec<Usage> = self.usages.iter().map(|u| u.unwrap_or_default()).collect();
            out.push(self.chunk(json!([]), Some(usage_json(&self.job, &u))));
        }
        out.push(SseEvent::default().data("[DONE]"));
        out
    }
}

pub(super) fn stream_response(tok: Arc<Tokenizer>, job: Job, rxs: Vec<EventRx>) -> Response {
    let n = rxs.len();
    let events = stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| {
        // Each receiver ends with one `None` (the channel closed) after its last event.
        let s = stream::unfold(Some(rx), move |rx| async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(e @ Event::Token { .. }) => Some(((i, Some(e)), Some(rx))),
                Some(e) => Some(((i, Some(e)), None)),
                None => Some(((i, None), None)),
            }
        });
        Box::pin(s) as ChoiceEvents
    }));
    let st = StreamState {
        tok,
        job,
        events,
        usages: vec![None; n],
        offsets: vec![0; n],
        left: n,
        done: false,
    };
    // Chat streams open every choice with the assistant role.
    let opening: Vec<SseEvent> = match st.job.kind {
        Kind::Chat => (0..n)
            .map(|i| {
                let c = json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
                st.chunk(c, None)
            })
            .collect(),
        Kind::Completion => Vec::new(),
    };
    let body = stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        if st.left == 0 {
            st.done = true;
            let closing = st.closing();
            return Some((closing, st));
        }
        match st.events.next().await {
            Some((i, ev)) => {
                let out = st.on_event(i, ev);
                Some((out, st))
            }
            None => {
                st.done = true;
                let closing = st.closing();
                Some((closing, st))
            }
        }
    });
    let all = stream::iter(opening)
        .chain(body.flat_map(stream::iter))
        .map(Ok::<_, Infallible>);
    Sse::new(all)
        .keep_alive(KeepAlive::default())
        .into_response()
}
