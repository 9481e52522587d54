#!/usr/bin/env python3
"""Chat-template reference data: the text Hugging Face's own renderer
(transformers.utils.chat_template_utils.render_jinja_template, as apply_chat_template
uses it) produces for fixed conversations under the chat templates of SmolLM2, Llama 3,
Mistral and Qwen2 (each as its model's tokenizer_config.json ships it). The engine's
minijinja renderer is tested against this file; it shares no code with the engine.

    pip install transformers
    python3 scripts/reference_chat.py > crates/tessera-engine/tests/data/chat_templates.json
"""
import json

from transformers.utils.chat_template_utils import render_jinja_template

TEMPLATES = {
    "smollm2": {
        "bos": "<|im_start|>", "eos": "<|im_end|>",
        "template": "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    },
    "llama3": {
        "bos": "<|begin_of_text|>", "eos": "<|eot_id|>",
        "template": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
    },
    "mistral": {
        "bos": "<s>", "eos": "</s>",
        "template": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
    },
    "qwen2": {
        "bos": "", "eos": "<|im_end|>",
        "template": "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    },
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "  Hi there!  "}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nA short one."}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Colour of the sky?"}],
]

cases = []
for name, t in TEMPLATES.items():
    for i, conv in enumerate(CONVERSATIONS):
        for gen in (True, False):
            try:
                out = render_jinja_template([conv], chat_template=t["template"], add_generation_prompt=gen,
                                            bos_token=t["bos"], eos_token=t["eos"])[0][0]
                cases.append({"template": name, "conversation": i, "add_generation_prompt": gen, "text": out})
            except Exception as e:  # the template refuses this conversation
                cases.append({"template": name, "conversation": i, "add_generation_prompt": gen, "error": str(e)})

print(json.dumps({"templates": TEMPLATES, "conversations": CONVERSATIONS, "cases": cases}, indent=1))
