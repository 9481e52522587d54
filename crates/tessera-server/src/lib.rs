//! Tessera's OpenAI-compatible server: `axum` on a `tokio` runtime in front of one engine
//! thread that drives the continuous-batching [`Scheduler`].
//!
//! The layers: [`api`] checks OpenAI's request fields, [`routes`] answers the endpoints
//! (JSON or SSE), [`engine`] owns the scheduler on its own thread, [`metrics`] exports
//! Prometheus text. Shutdown is graceful: on SIGINT/SIGTERM (or [`RunningServer::shutdown`])
//! new requests get 503, the listener closes, in-flight requests run to completion for up
//! to a grace period, then whatever is left is cancelled and every stream still gets its
//! closing event.

#![warn(missing_docs)]

pub mod api;
pub mod engine;
pub mod metrics;
pub mod routes;

use engine::EngineHandle;
use metrics::Metrics;
use routes::AppState;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tessera_engine::chat::ChatTemplate;
use tessera_engine::scheduler::Scheduler;
use tokio::sync::oneshot;

/// Server errors (binding, runtime): the model and requests have their own.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    /// Binding the address or running the runtime failed.
    Io(#[from] std::io::Error),
    #[error("{0}")]
    /// The model could not be loaded or the scheduler built.
    Engine(#[from] tessera_engine::Error),
}

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (0: any free port).
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on `/v1/*` when set.
    pub api_key: Option<String>,
    /// The model id clients name (`/v1/models` lists it).
    pub model_name: String,
    /// Sequences and prompt scorings accepted and unfinished before new requests get 429.
    pub max_queue: usize,
    /// Largest request body in bytes (413 above it).
    pub max_body: usize,
    /// How long a shutdown lets in-flight requests finish before cancelling them.
    pub shutdown_grace: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            model_name: "tessera".into(),
            max_queue: 1024,
            max_body: 4 << 20,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// A server running on its own threads.
#[derive(Debug)]
pub struct RunningServer {
    /// The address it listens on (the real port when 0 was asked for).
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), Error>>>,
}

impl RunningServer {
    /// Shuts down gracefully and waits for the server to end.
    pub fn shutdown(mut self) -> Result<(), Error> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.join()
    }

    /// Waits until the server ends (after a signal or [`RunningServer::shutdown`]).
    pub fn join(mut self) -> Result<(), Error> {
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::Io(std::io::Error::other(
                "the server thread panicked",
            ))),
            None => Ok(()),
        }
    }
}

/// Binds and starts serving `scheduler`; returns once the listener is up. The server
/// stops on SIGINT/SIGTERM when `signals`, or on [`RunningServer::shutdown`].
pub fn spawn(
    scheduler: Scheduler,
    opts: ServerOptions,
    signals: bool,
) -> Result<RunningServer, Error> {
    let tok = scheduler.tokenizer().clone();
    let template = match &tok.chat_template {
        Some(src) => {
            let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default();
            Some(Arc::new(ChatTemplate::new(
                src,
                &text(tok.bos),
                &text(tok.eos),
            )?))
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("tessera-http")
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind((
        opts.host.as_str(),
        opts.port,
    )))?;
    let addr = listener.local_addr()?;
    let metrics = Arc::new(Metrics::new());
    let (engine, engine_thread) = EngineHandle::start(scheduler, metrics);
    let state = AppState {
        engine: engine.clone(),
        tok,
        template,
        model_name: opts.model_name.clone(),
        api_key: opts.api_key.clone(),
        max_queue: opts.max_queue,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let app = routes::router(state, opts.max_body);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let grace = opts.shutdown_grace;
    let thread = std::thread::Builder::new()
        .name("tessera-server".into())
        .spawn(move || -> Result<(), Error> {
            let e2 = engine.clone();
            let shutdown = async move {
                wait_for_stop(stop_rx, signals).await;
                e2.shared.shutting_down.store(true, Ordering::Relaxed);
                // In-flight requests get `grace` to finish; then they are cancelled.
                let e3 = e2.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    e3.cancel_all();
                });
            };
            let served = rt.block_on(async {
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await
            });
            engine.stop();
            let _ = engine_thread.join();
            rt.shutdown_timeout(Duration::from_secs(1));
            served.map_err(Error::Io)
        })?;
    Ok(RunningServer {
        addr,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

async fn wait_for_stop(stop: oneshot::Receiver<()>, signals: bool) {
    if !signals {
        let _ = stop.await;
        return;
    }
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = stop.await;
                return;
            }
        };
        tokio::select! {
            _ = stop => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::select! {
        _ = stop => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
