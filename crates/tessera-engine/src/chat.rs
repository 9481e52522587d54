//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`, HF
//! `tokenizer_config.json`), rendered with `minijinja` the way Hugging Face's
//! `apply_chat_template` renders it: `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`, `raise_exception`, and Python string methods (`.strip()`, `.title()`…)
//! through minijinja-contrib's compatibility layer, since real templates (Llama 3,
//! Mistral, Qwen2) call them. A template that fails to compile or render is an error
//! naming the reason, never a silent fallback.

use crate::{Error, Result};
use minijinja::{context, Environment, ErrorKind};
use serde::Serialize;

/// One chat message. The optional fields reach the template only when set (`message.name
/// is defined` is false otherwise), as Hugging Face passes a message's keys as given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant` (templates may accept others).
    pub role: String,
    /// The message text.
    pub content: String,
    /// The participant's name (OpenAI's `name`), for templates that print it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The tool call a `tool` message answers (OpenAI's `tool_call_id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message from borrowed strings.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            name: None,
            tool_call_id: None,
        }
    }
}

/// Template instructions one rendering may run: a template comes from the model file,
/// so a loop over `range(10**5)` nested in another must end in an error, not hold the
/// engine. SmolLM2's template renders a 10,000-message conversation within it
/// (`fuel_bounds_rendering`).
const TEMPLATE_FUEL: u64 = 10_000_000;

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the special tokens' texts it may print.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // HF's renderer trims blocks this way (`trim_blocks`, `lstrip_blocks`).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| Error::Tokenizer(format!("chat template does not compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// The prompt text for `messages`, ending with the assistant's turn opener when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        t.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| Error::Tokenizer(format!("chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as its GGUF carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_renders_as_hf_does() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let got = t.render(&[Message::new("user", "Hi")], true).unwrap();
        // The text transformers' apply_chat_template gives for the same message.
        let want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by \
                    Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(got, want);
    }

    #[test]
    fn fuel_bounds_rendering() {
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[Message::new("user", "x")], true).unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
        // A 10 000-message conversation still renders with SmolLM2's template.
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let long: Vec<Message> = (0..10_000).map(|_| Message::new("user", "Hi")).collect();
        let text = t.render(&long, true).unwrap();
        assert_eq!(text.matches("<|im_start|>user").count(), 10_000);
    }

    /// `name` and `tool_call_id` reach a template that prints them, and only when set, as
    /// transformers passes a message's keys (the expected text is written out by hand).
    #[test]
    fn optional_message_fields_reach_the_template() {
        let src = "{% for m in messages %}{{ m.role }}{% if m.name is defined %} ({{ m.name }})\
                   {% endif %}{% if m.tool_call_id is defined %} [{{ m.tool_call_id }}]{% endif %}\
                   : {{ m.content }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let named = Message {
            name: Some("Ada".into()),
            ..Message::new("user", "Hi")
        };
        let answer = Message {
            tool_call_id: Some("call_7".into()),
            ..Message::new("tool", "42")
        };
        let got = t
            .render(&[Message::new("system", "Be brief."), named, answer], false)
            .unwrap();
        assert_eq!(
            got,
            "system: Be brief.\nuser (Ada): Hi\ntool [call_7]: 42\n"
        );
    }

    #[test]
    fn broken_templates_are_errors() {
        assert!(ChatTemplate::new("{% for x in %}", "", "").is_err());
        let t = ChatTemplate::new("{{ raise_exception('only user roles') }}", "", "").unwrap();
        let e = t.render(&[Message::new("user", "x")], true).unwrap_err();
        assert!(e.to_string().contains("only user roles"), "{e}");
    }
}
