"""Chat templates derived from Jinja by sentinel rendering."""
from __future__ import annotations

import json

import pytest

from sgdsl.chat_template import (ChatTemplate, get_chat_template, guess_chat_template,
                                 list_chat_templates)
from sgdsl.errors import TemplateNotFoundError

HF_CHATML_WITH_DEFAULT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_shipped_templates_are_listed_and_named_lookup_works():
    assert {"chatml", "llama-3", "mistral", "qwen", "default"} <= set(list_chat_templates())
    assert get_chat_template("Llama3").name == "llama-3"
    with pytest.raises(TemplateNotFoundError, match="available"):
        get_chat_template("nope")


def test_llama3_prefixes_and_suffixes():
    t = get_chat_template("llama-3")
    assert t.get_prefix_and_suffix("user") == ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>")
    assert t.stop_str == ("<|eot_id|>",)


def test_mistral_user_and_assistant_split():
    t = get_chat_template("mistral")
    assert t.roles["user"] == ("[INST] ", " [/INST]")
    assert t.roles["assistant"] == ("", "</s>")


def test_default_system_prompt_is_detected_and_rendering_matches_jinja():
    t = ChatTemplate.from_jinja(HF_CHATML_WITH_DEFAULT, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert t.default_system_prompt == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert t.roles["system"] == ("<|im_start|>system\n", "<|im_end|>\n")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    from jinja2 import Template
    expected = Template(HF_CHATML_WITH_DEFAULT).render(messages=msgs, add_generation_prompt=False)
    assert t.render(msgs) == expected


def test_model_dir_template_is_read_from_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": HF_CHATML_WITH_DEFAULT, "bos_token": {"content": "<|im_start|>"}}))
    t = ChatTemplate.from_model_dir(tmp_path)
    assert t.roles["assistant"] == ("<|im_start|>assistant\n", "<|im_end|>\n")
    assert ChatTemplate.from_model_dir(tmp_path / "missing") is None


def test_guess_by_model_name():
    assert guess_chat_template("meta-llama/Meta-Llama-3-8B-Instruct").name == "llama-3"
    assert guess_chat_template("HuggingFaceTB/SmolLM2-135M-Instruct").name == "chatml"
    assert guess_chat_template("gpt2").name == "default"
