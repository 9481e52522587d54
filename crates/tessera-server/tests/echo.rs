//! Completions' `echo` over a loopback socket: the prompt's log-probabilities against
//! the model's own logits, and how prompt scoring shares the engine with the streams in
//! flight (a slice per step, counted under `--max-queue`, dropped when its client goes).

mod common;

use common::*;
use serde_json::json;
use std::io::BufRead;
use std::time::{Duration, Instant};
use tessera_server::ServerOptions;

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
    assert_eq!(token_strings(lp).concat(), text);
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
    let offsets = text_offsets(lp);
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[n] == text.len(),
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

/// A completions `logprobs` object's `tokens`.
fn token_strings(lp: &serde_json::Value) -> Vec<&str> {
    let tokens = lp["tokens"].as_array().expect("tokens");
    tokens.iter().map(|t| t.as_str().unwrap()).collect()
}

/// A completions `logprobs` object's `text_offset`.
fn text_offsets(lp: &serde_json::Value) -> Vec<usize> {
    let offsets = lp["text_offset"].as_array().expect("text_offset");
    offsets
        .iter()
        .map(|o| o.as_u64().unwrap() as usize)
        .collect()
}

/// Waits (polling /metrics, at most a minute) until `done` holds for the metric `name`.
fn wait_for_metric(a: std::net::SocketAddr, name: &str, done: impl Fn(f64) -> bool) -> f64 {
    let t = Instant::now();
    loop {
        let v = metric(a, name);
        if done(v) {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{name} stuck at {v}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A long prompt to score shares the engine with the streams in flight: with a 64-token
/// step budget and one stream decoding, a 3,000-token prompt takes 48 slices of 63
/// positions, one per step, so a stream with 31 tokens left when the scoring starts ends
/// first (before, the whole prompt was scored
/// between two steps and the stream waited for it). A scoring counts under
/// `--max-queue`, and one whose client went away stops at its next slice.
#[test]
fn echo_scoring_takes_a_slice_per_step() {
    let (_, tok) = default_model();
    let all = tok
        .encode(&"The quick brown fox jumps over the lazy dog. ".repeat(500))
        .expect("encode");
    assert!(all.len() >= 4000, "{} tokens", all.len());
    let echo = |ids: &[u32]| json!({"model": MODEL, "prompt": ids, "echo": true, "max_tokens": 0, "logprobs": 1});
    let srv = server(
        ServerOptions {
            max_queue: 2,
            ..Default::default()
        },
        256,
    );
    let a = srv.addr;
    let scored = "tessera_scored_positions_total";
    let queued = "tessera_prompt_scorings";

    let stream = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 32,
                        "ignore_eos": true, "temperature": 0, "stream": true});
    let mut s1 = open_stream(a, "/v1/completions", &[], &stream);
    let before = metric(a, scored);
    let body = echo(&all[..3000]);
    let scoring = std::thread::spawn(move || {
        let r = post(a, "/v1/completions", &body);
        (r, Instant::now())
    });
    wait_for_metric(a, queued, |v| v == 1.0);
    // The stream and the scoring fill --max-queue 2: another scoring and a generation
    // get 429; an echo without logprobs scores nothing and passes.
    let (s, r) = post(a, "/v1/completions", &echo(&all[..10]));
    assert_eq!(s, 429, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("prompt scorings")));
    let gen = json!({"model": MODEL, "prompt": "x", "max_tokens": 1});
    assert_eq!(post(a, "/v1/completions", &gen).0, 429);
    let plain = json!({"model": MODEL, "prompt": "x y", "max_tokens": 0, "echo": true});
    assert_eq!(post(a, "/v1/completions", &plain).0, 200);

    // The connection stays open (keep-alive): read up to the stream's end marker.
    let mut line = String::new();
    while !line.starts_with("data: [DONE]") {
        line.clear();
        assert!(s1.read_line(&mut line).expect("the stream goes on") > 0);
    }
    let streamed = Instant::now();
    let ((s, r), answered) = scoring.join().unwrap();
    assert_eq!(s, 200, "{r}");
    assert!(
        streamed < answered,
        "the stream ended after the 3,000-token scoring"
    );
    let lps = r["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(lps.len(), 3000);
    assert!(lps[0].is_null());
    assert!(lps[1..]
        .iter()
        .all(|l| l.as_f64().is_some_and(|l| l.is_finite() && l <= 0.0)));
    assert_eq!(metric(a, scored) - before, 2999.0);
    assert_eq!(metric(a, queued), 0.0);

    // A client that goes away mid-scoring: the rest of its 4,000 positions is not scored.
    let before = metric(a, scored);
    let body = echo(&all[..4000]).to_string();
    let mut c = std::net::TcpStream::connect(a).expect("connect");
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    std::io::Write::write_all(&mut c, req.as_bytes()).unwrap();
    wait_for_metric(a, scored, |v| v > before);
    drop(c);
    wait_for_metric(a, queued, |v| v == 0.0);
    let done = metric(a, scored) - before;
    assert!(
        done < 3999.0,
        "all {done} positions scored for a client that had gone"
    );
    let (s, r) = post(a, "/v1/completions", &echo(&all[..10]));
    assert_eq!(s, 200, "{r}");
    srv.shutdown().expect("clean shutdown");
}

/// The echoed prompt is the prompt as given, a token-id prompt's special tokens spelled
/// out (as the `tokens` list spells them), and each `text_offset` is where that token's
/// text starts in the returned text: checked against the text itself, not against the
/// offsets' own computation. The tokens of a character split across several (the crab's
/// four bytes) share the character's offset; the completion starts where the prompt ends.
#[test]
fn echo_spells_the_prompt_with_its_offsets() {
    let (model, tok) = default_model();
    drop(model);
    let text = "<|im_start|>user\nWhy 🦀 crabs? é<|im_end|>";
    let crab_at = text.find(" 🦀").unwrap();
    let ids = tok.encode(text).expect("encode");
    let n = ids.len();
    let srv = server(ServerOptions::default(), 64);
    let a = srv.addr;
    for prompt in [json!(text), json!(ids)] {
        let (s, r) = post(
            a,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt, "echo": true, "logprobs": 0,
                    "max_tokens": 2, "temperature": 0, "ignore_eos": true}),
        );
        assert_eq!(s, 200, "{r}");
        let c = &r["choices"][0];
        let full = c["text"].as_str().unwrap();
        assert!(full.starts_with(text), "{prompt} echoed as {full:?}");
        let lp = &c["logprobs"];
        let (tokens, offsets) = (token_strings(lp), text_offsets(lp));
        assert_eq!((tokens.len(), offsets.len()), (n + 2, n + 2), "{lp}");
        assert_eq!((tokens[0], offsets[0]), ("<|im_start|>", 0), "{lp}");
        assert_eq!(offsets[1], "<|im_start|>".len(), "{lp}");
        assert_eq!(
            offsets[n],
            text.len(),
            "the completion starts after the prompt"
        );
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
        let mut split = 0;
        for (i, (t, &o)) in tokens.iter().zip(&offsets).enumerate().take(n) {
            assert!(full.is_char_boundary(o), "token {i} at {o}");
            if t.contains('\u{FFFD}') {
                split += 1;
                assert_eq!(o, crab_at, "token {i} {t:?}: part of the crab");
            } else {
                assert!(
                    full[o..].starts_with(t),
                    "token {i} {t:?} at {o} in {full:?}"
                );
            }
        }
        assert!(
            split >= 2,
            "the crab is not split across tokens: {tokens:?}"
        );
    }
    // Bytes that never form a character (the crab's continuation tokens alone) between
    // whole crabs: the echo is the whole prompt decoded at once, and the offsets stay
    // non-decreasing character boundaries inside it.
    let crab = tok.encode(" 🦀").expect("encode");
    let lone = crab[crab.len() - 1];
    let ids: Vec<u32> = [vec![lone; 6], crab.clone(), vec![lone; 2], crab].concat();
    let (s, r) = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ids, "echo": true, "logprobs": 0, "max_tokens": 0}),
    );
    assert_eq!(s, 200, "{r}");
    let full = r["choices"][0]["text"].as_str().unwrap();
    assert_eq!(full, tok.decode_with_special(&ids).unwrap());
    assert_eq!(full.matches('🦀').count(), 2, "{full:?}");
    let offsets = text_offsets(&r["choices"][0]["logprobs"]);
    assert_eq!(offsets.len(), ids.len());
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert!(
        offsets.iter().all(|&o| full.is_char_boundary(o)),
        "{offsets:?}"
    );
    srv.shutdown().expect("clean shutdown");
}

/// A scoring still running when a shutdown's grace period ends is cancelled and answered
/// 503 (the server is going away), not 500.
#[test]
fn scoring_cut_by_shutdown_is_a_503() {
    let (model, tok) = default_model();
    drop(model);
    let ids = tok
        .encode(&"The quick brown fox jumps over the lazy dog. ".repeat(500))
        .expect("encode");
    let srv = server(
        ServerOptions {
            shutdown_grace: Duration::from_millis(200),
            ..Default::default()
        },
        256,
    );
    let a = srv.addr;
    let body = json!({"model": MODEL, "prompt": &ids[..4000], "echo": true, "max_tokens": 0,
                      "logprobs": 1});
    let scoring = std::thread::spawn(move || post(a, "/v1/completions", &body));
    wait_for_metric(a, "tessera_scored_positions_total", |v| v > 0.0);
    srv.shutdown().expect("clean shutdown");
    let (s, r) = scoring.join().unwrap();
    assert_eq!(s, 503, "{r}");
    assert_eq!(r["error"]["type"], "server_error", "{r}");
}
