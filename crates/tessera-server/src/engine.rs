//! The engine thread: one OS thread owns the [`Scheduler`] and drives it step after step;
//! request handlers talk to it only through channels, so no handler ever waits on a
//! model step and no step waits on a slow client.
//!
//! A submission is a group of sequences (a request with `n` choices), checked as a whole
//! before any is queued. Each sequence gets an unbounded channel of its [`Event`]s. A
//! handler that goes away (the client disconnected) drops its receivers; before every
//! step the thread cancels the sequences whose receivers are gone, so their KV blocks are
//! free by the next step.

use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tessera_engine::scheduler::{Event, FinishReason, GenRequest, Scheduler, SeqId};
use tessera_engine::score::Scored;
use tokio::sync::{mpsc as tmpsc, oneshot};

/// Events of one sequence.
pub type EventRx = tmpsc::UnboundedReceiver<Event>;

enum Command {
    Submit {
        reqs: Vec<GenRequest>,
        reply: oneshot::Sender<Result<Vec<EventRx>, String>>,
    },
    /// Teacher-forced scores of a prompt (`echo` with log-probabilities), computed
    /// between steps: the streams in flight wait for it as for a long prefill.
    Score {
        tokens: Vec<u32>,
        alternatives: usize,
        reply: oneshot::Sender<Result<Scored, String>>,
    },
    /// Cancel everything in flight (the end of a graceful shutdown's grace period).
    CancelAll,
    Stop,
}

/// State the handlers read without asking the thread.
#[derive(Debug, Default)]
pub struct Shared {
    /// Sequences accepted and not yet finished.
    pub in_flight: AtomicUsize,
    /// Set once a shutdown began: new requests get 503.
    pub shutting_down: AtomicBool,
}

/// Handle to the engine thread (cheap to clone).
#[derive(Clone, Debug)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    /// Counters the handlers read.
    pub shared: Arc<Shared>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// The model's context length.
    pub context: usize,
    /// The model's vocabulary size (token ids below it).
    pub vocab: usize,
    /// Positions the KV pool holds.
    pub pool_positions: usize,
}

/// Per-sequence bookkeeping on the engine thread.
struct Route {
    tx: tmpsc::UnboundedSender<Event>,
    submitted: Instant,
    last_token: Option<Instant>,
}

impl EngineHandle {
    /// Starts the thread that owns `scheduler`.
    pub fn start(
        scheduler: Scheduler,
        metrics: Arc<Metrics>,
    ) -> (Self, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let context = scheduler.model().cfg.context;
        let vocab = scheduler.model().cfg.vocab;
        let pool_positions = scheduler.config().kv_blocks * tessera_engine::kv_cache::BLOCK;
        let (sh, m) = (shared.clone(), metrics.clone());
        let thread = std::thread::Builder::new()
            .name("tessera-engine".into())
            .spawn(move || run(scheduler, rx, sh, m))
            .expect("spawning the engine thread");
        let handle = EngineHandle {
            tx,
            shared,
            metrics,
            context,
            vocab,
            pool_positions,
        };
        (handle, thread)
    }

    /// Queues `reqs` as one group: every one is checked first, and either all are queued
    /// (one event receiver each, in order) or none is (the first error).
    pub async fn submit(&self, reqs: Vec<GenRequest>) -> Result<Vec<EventRx>, String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Submit { reqs, reply })
            .map_err(|_| "the engine has stopped".to_string())?;
        rx.await.map_err(|_| "the engine has stopped".to_string())?
    }

    /// ln p of each token of `tokens` after the first given the ones before it, with the
    /// `alternatives` most likely tokens at each position ([`tessera_engine::score`]).
    pub async fn score(&self, tokens: Vec<u32>, alternatives: usize) -> Result<Scored, String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Score {
                tokens,
                alternatives,
                reply,
            })
            .map_err(|_| "the engine has stopped".to_string())?;
        rx.await.map_err(|_| "the engine has stopped".to_string())?
    }

    /// Cancels every sequence in flight.
    pub fn cancel_all(&self) {
        let _ = self.tx.send(Command::CancelAll);
    }

    /// Stops the thread after cancelling what is left.
    pub fn stop(&self) {
        let _ = self.tx.send(Command::Stop);
    }
}

fn run(mut s: Scheduler, rx: mpsc::Receiver<Command>, shared: Arc<Shared>, metrics: Arc<Metrics>) {
    let mut routes: HashMap<SeqId, Route> = HashMap::new();
    let mut stop = false;
    while !stop {
        // Idle: sleep until a command comes. Busy: take what has come, then step.
        let first = if s.has_work() {
            rx.try_recv().ok()
        } else {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            }
        };
        let mut cmds: Vec<Command> = first.into_iter().collect();
        cmds.extend(rx.try_iter());
        for c in cmds {
            match c {
                Command::Submit { reqs, reply } => {
                    let res = submit(&mut s, reqs, &mut routes, &shared);
                    if let Err(rxs) = reply.send(res) {
                        // The handler is gone already: its sequences are cancelled below.
                        drop(rxs);
                    }
                }
                Command::Score {
                    tokens,
                    alternatives,
                    reply,
                } => {
                    let scored = tessera_engine::score::score(s.model(), &tokens, alternatives);
                    let _ = reply.send(scored.map_err(|e| e.to_string()));
                }
                Command::CancelAll => cancel_where(&mut s, &mut routes, &shared, |_| true),
                Command::Stop => stop = true,
            }
        }
        // Clients that went away: free their blocks before the next step.
        cancel_where(&mut s, &mut routes, &shared, |r| r.tx.is_closed());
        if stop {
            cancel_where(&mut s, &mut routes, &shared, |_| true);
            break;
        }
        let before = s.stats();
        let events = match s.step() {
            Ok(e) => e,
            Err(e) => {
                // A step that cannot run fails everything in flight, loudly.
                let ids: Vec<SeqId> = routes.keys().copied().collect();
                for id in ids {
                    s.cancel(id);
                    if let Some(r) = routes.remove(&id) {
                        let _ = r.tx.send(Event::Failed {
                            id,
                            error: e.to_string(),
                        });
                        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                continue;
            }
        };
        let now = Instant::now();
        for e in events {
            let id = match &e {
                Event::Token { id, .. } | Event::Finished { id, .. } | Event::Failed { id, .. } => {
                    *id
                }
            };
            let Some(r) = routes.get_mut(&id) else {
                continue;
            };
            match &e {
                Event::Token { .. } => {
                    metrics.token();
                    match r.last_token {
                        None => metrics.ttft.observe((now - r.submitted).as_secs_f64()),
                        Some(t) => metrics.itl.observe((now - t).as_secs_f64()),
                    }
                    r.last_token = Some(now);
                }
                Event::Finished { .. } | Event::Failed { .. } => {}
            }
            let done = !matches!(e, Event::Token { .. });
            let _ = r.tx.send(e);
            if done {
                routes.remove(&id);
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
        }
        metrics.record_step(&before, &s.stats());
    }
    metrics.record_step(&s.stats(), &s.stats());
}

fn submit(
    s: &mut Scheduler,
    reqs: Vec<GenRequest>,
    routes: &mut HashMap<SeqId, Route>,
    shared: &Shared,
) -> Result<Vec<EventRx>, String> {
    let ids = s.add_group(reqs).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let (tx, rx) = tmpsc::unbounded_channel();
        routes.insert(
            id,
            Route {
                tx,
                submitted: Instant::now(),
                last_token: None,
            },
        );
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        out.push(rx);
    }
    Ok(out)
}

/// Cancels the routed sequences `which` selects; their receivers get the final event.
fn cancel_where(
    s: &mut Scheduler,
    routes: &mut HashMap<SeqId, Route>,
    shared: &Shared,
    which: impl Fn(&Route) -> bool,
) {
    let ids: Vec<SeqId> = routes
        .iter()
        .filter(|(_, r)| which(r))
        .map(|(&id, _)| id)
        .collect();
    for id in ids {
        let ev = s.cancel(id).unwrap_or(Event::Finished {
            id,
            reason: FinishReason::Cancelled,
            tail: String::new(),
            text: String::new(),
            usage: Default::default(),
        });
        if let Some(r) = routes.remove(&id) {
            let _ = r.tx.send(ev);
            shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
