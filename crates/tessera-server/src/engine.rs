//! The engine thread: one OS thread owns the [`Scheduler`] and drives it step after step;
//! request handlers talk to it only through channels, so no handler ever waits on a
//! model step and no step waits on a slow client.
//!
//! A submission is a group of sequences (a request with `n` choices), checked as a whole
//! before any is queued. Each sequence gets an unbounded channel of its [`Event`]s. A
//! handler that goes away (the client disconnected) drops its receivers; before every
//! step the thread cancels the sequences whose receivers are gone, so their KV blocks are
//! free by the next step.
//!
//! Prompt scoring (`echo` with log-probabilities) runs on the same thread, one scoring at
//! a time in arrival order, after each step with what the step left of `max_batch_tokens`
//! and, with `--itl-factor`, of the step's time margin beside its decodes, priced by the
//! slices' own measured time ([`Scheduler::prompt_room`]; one position at least): a long
//! prompt to score delays the streams in flight by one slice per step, as a chunked
//! prefill does, not by its whole length. A scoring whose client went away is dropped
//! before its next slice.

use crate::metrics::Metrics;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tessera_engine::scheduler::{Event, FinishReason, GenRequest, Scheduler, SeqId};
use tessera_engine::score::{Scored, Scorer};
use tokio::sync::{mpsc as tmpsc, oneshot};

/// Events of one sequence.
pub type EventRx = tmpsc::UnboundedReceiver<Event>;

/// Why the engine thread did not queue a submission or did not finish a scoring: typed,
/// so a handler answers 400, 503 or 500 from what happened, not from its wording.
#[derive(Debug)]
pub enum Refusal {
    /// A request the engine refuses: the [`GenRequest`] field at fault and why
    /// ([`tessera_engine::Error::Request`]).
    Request {
        /// The engine's name for the field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The server is shutting down: the thread stopped, or cancelled the work.
    Stopped,
    /// The engine failed while taking or running it (the server's fault, not the
    /// request's).
    Failed(String),
}

impl From<tessera_engine::Error> for Refusal {
    /// A request error is the client's; any other engine error the server's.
    fn from(e: tessera_engine::Error) -> Self {
        match e {
            tessera_engine::Error::Request { field, detail } => Refusal::Request { field, detail },
            other => Refusal::Failed(other.to_string()),
        }
    }
}

enum Command {
    Submit {
        reqs: Vec<GenRequest>,
        reply: oneshot::Sender<Result<Vec<EventRx>, Refusal>>,
    },
    /// Teacher-forced scores of a prompt (`echo` with log-probabilities), computed a
    /// slice per step.
    Score {
        tokens: Vec<u32>,
        alternatives: usize,
        reply: oneshot::Sender<Result<Scored, Refusal>>,
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
    /// Prompt scorings asked for and not yet answered.
    pub scoring: AtomicUsize,
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
    pub async fn submit(&self, reqs: Vec<GenRequest>) -> Result<Vec<EventRx>, Refusal> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Submit { reqs, reply })
            .map_err(|_| Refusal::Stopped)?;
        rx.await.map_err(|_| Refusal::Stopped)?
    }

    /// ln p of each token of `tokens` after the first given the ones before it, with the
    /// `alternatives` most likely tokens at each position ([`tessera_engine::score`]).
    /// Counted in [`Shared::scoring`] from the call until the answer.
    pub async fn score(&self, tokens: Vec<u32>, alternatives: usize) -> Result<Scored, Refusal> {
        let (reply, rx) = oneshot::channel();
        self.shared.scoring.fetch_add(1, Ordering::Relaxed);
        let sent = self.tx.send(Command::Score {
            tokens,
            alternatives,
            reply,
        });
        if sent.is_err() {
            self.shared.scoring.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::Stopped);
        }
        // The engine thread takes the count back when it answers or drops the scoring.
        rx.await.map_err(|_| Refusal::Stopped)?
    }

    /// Sequences and prompt scorings accepted and not yet finished.
    pub fn queued(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed) + self.shared.scoring.load(Ordering::Relaxed)
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

/// A prompt being scored (or waiting to be) and who wants its scores.
struct ScoreJob {
    scorer: Scorer,
    reply: oneshot::Sender<Result<Scored, Refusal>>,
}

/// Answers the scoring at the front of `jobs` and removes it.
fn answer(jobs: &mut VecDeque<ScoreJob>, shared: &Shared, res: Result<Scored, Refusal>) {
    if let Some(job) = jobs.pop_front() {
        let _ = job.reply.send(res);
        shared.scoring.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Scores the next slice, `budget` positions at most, of the first live scoring in
/// `jobs`: scorings whose client went away are dropped first; a finished or failed one is
/// answered. Returns the positions scored.
fn score_slice(
    jobs: &mut VecDeque<ScoreJob>,
    s: &Scheduler,
    shared: &Shared,
    budget: usize,
) -> usize {
    while jobs.front().is_some_and(|j| j.reply.is_closed()) {
        jobs.pop_front();
        shared.scoring.fetch_sub(1, Ordering::Relaxed);
    }
    let Some(job) = jobs.front_mut() else {
        return 0;
    };
    let before = job.scorer.progress().0;
    let res = job.scorer.advance(s.model(), budget);
    let scored = job.scorer.progress().0 - before;
    match res {
        Ok(false) => {}
        Ok(true) => {
            if let Some(job) = jobs.pop_front() {
                let _ = job.reply.send(
                    job.scorer
                        .finish()
                        .map_err(|e| Refusal::Failed(e.to_string())),
                );
                shared.scoring.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Err(e) => answer(jobs, shared, Err(Refusal::Failed(e.to_string()))),
    }
    scored
}

fn run(mut s: Scheduler, rx: mpsc::Receiver<Command>, shared: Arc<Shared>, metrics: Arc<Metrics>) {
    let mut routes: HashMap<SeqId, Route> = HashMap::new();
    let mut scoring: VecDeque<ScoreJob> = VecDeque::new();
    let mut stop = false;
    while !stop {
        // Idle: sleep until a command comes. Busy: take what has come, then step.
        let first = if s.has_work() || !scoring.is_empty() {
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
                } => match Scorer::new(s.model(), tokens, alternatives) {
                    Ok(scorer) => scoring.push_back(ScoreJob { scorer, reply }),
                    Err(e) => {
                        let _ = reply.send(Err(e.into()));
                        shared.scoring.fetch_sub(1, Ordering::Relaxed);
                    }
                },
                Command::CancelAll => {
                    cancel_where(&mut s, &mut routes, &shared, |_| true);
                    while !scoring.is_empty() {
                        answer(&mut scoring, &shared, Err(Refusal::Stopped));
                    }
                }
                Command::Stop => stop = true,
            }
        }
        // Clients that went away: free their blocks before the next step.
        cancel_where(&mut s, &mut routes, &shared, |r| r.tx.is_closed());
        if stop {
            cancel_where(&mut s, &mut routes, &shared, |_| true);
            while !scoring.is_empty() {
                answer(&mut scoring, &shared, Err(Refusal::Stopped));
            }
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
        let after = s.stats();
        metrics.record_step(&before, &after);
        // A scoring takes what the step left of the token budget, paced beside decodes
        // with --itl-factor (one position at least), after the step's events are on
        // their way.
        let started = Instant::now();
        let scored = score_slice(&mut scoring, &s, &shared, s.prompt_room().max(1));
        s.record_prompt_work(scored, started.elapsed().as_secs_f64());
        metrics.record_scoring(scoring.len(), scored);
    }
    metrics.record_step(&s.stats(), &s.stats());
}

fn submit(
    s: &mut Scheduler,
    reqs: Vec<GenRequest>,
    routes: &mut HashMap<SeqId, Route>,
    shared: &Shared,
) -> Result<Vec<EventRx>, Refusal> {
    let ids = s.add_group(reqs)?;
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
