//! The engine's chat-template renderer (minijinja) against the text Hugging Face's own
//! renderer produced for the same conversations under the SmolLM2, Llama 3, Mistral and
//! Qwen2 templates (`scripts/reference_chat.py`, which runs transformers'
//! `render_jinja_template`; its output is committed in tests/data/chat_templates.json).
//! A template that refuses a conversation (Mistral's role alternation) must refuse it
//! here too, with its message.

use serde_json::Value;
use tessera_engine::chat::{ChatTemplate, Message};

#[test]
fn templates_render_as_hugging_face_renders_them() {
    let data: Value =
        serde_json::from_str(include_str!("data/chat_templates.json")).expect("valid JSON");
    let convs: Vec<Vec<Message>> = data["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c.as_array()
                .unwrap()
                .iter()
                .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect()
        })
        .collect();
    let cases = data["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 24);
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let t = &data["templates"][name];
        let tpl = ChatTemplate::new(
            t["template"].as_str().unwrap(),
            t["bos"].as_str().unwrap(),
            t["eos"].as_str().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let conv = &convs[case["conversation"].as_u64().unwrap() as usize];
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = tpl.render(conv, gen);
        let at = format!(
            "{name}, conversation {}, generation prompt {gen}",
            case["conversation"]
        );
        match (case.get("text").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) => assert_eq!(got, want, "{at}"),
            (None, Err(e)) => {
                let want = case["error"].as_str().unwrap();
                assert!(e.to_string().contains(want), "{at}: {e} vs {want}");
            }
            (want, got) => panic!("{at}: HF gave {want:?}, we gave {got:?}"),
        }
    }
}
