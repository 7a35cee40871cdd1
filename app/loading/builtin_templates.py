"""Chat templates an operator names instead of writing one (`--chat-template NAME`, `server.chat_template`),
as llama-server's `--chat-template` names its built-in ones. mlx_lm.server's `--chat-template` takes
a template's text instead: text with Jinja tags is taken as the template itself.

Each renders `messages` (system, user, assistant) and the generation prompt, with the tokenizer's
`bos_token` where the format starts with one; none renders tools (a model that calls tools brings its
own template, or the operator's file: `--chat-template-file`).
"""

from __future__ import annotations

import difflib

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA2 = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}"
    "{% elif m['role'] == 'user' %}{{ '[INST] ' }}"
    "{% if ns.system %}{{ '<<SYS>>\\n' + ns.system + '\\n<</SYS>>\\n\\n' }}"
    "{% set ns.system = '' %}{% endif %}{{ m['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\\n\\n' %}"
    "{% else %}{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\\n' + (ns.system if role == 'user' else '') + m['content'] + '<end_of_turn>\\n' }}"
    "{% if role == 'user' %}{% set ns.system = '' %}{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\\n\\n' %}"
    "{% elif m['role'] == 'user' %}{{ '[INST] ' + ns.system + m['content'] + '[/INST]' }}{% set ns.system = '' %}"
    "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}"
)
PHI3 = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
ZEPHYR = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
BUILTIN_TEMPLATES = {
    "chatml": CHATML,
    "qwen": CHATML,  # Qwen's models speak ChatML
    "llama2": LLAMA2,
    "llama3": LLAMA3,
    "gemma": GEMMA,
    "mistral": MISTRAL,
    "mistral-v1": MISTRAL,
    "mistral-v3": MISTRAL,
    "phi3": PHI3,
    "zephyr": ZEPHYR,
}
JINJA_TAGS = ("{%", "{{")


def builtin_source(value: str) -> str:
    """A built-in template's source by name, or `value` itself where it is a template's text (Jinja
    tags in it, as mlx_lm.server's --chat-template takes one); ValueError for any other name."""
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    if any(tag in value for tag in JINJA_TAGS):
        return value
    names = ", ".join(BUILTIN_TEMPLATES)
    close = difflib.get_close_matches(value, list(BUILTIN_TEMPLATES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"{value!r} is no built-in chat template{hint} (built-in: {names}); for a template of your own, "
        "write it to a file and pass --chat-template-file FILE (server.chat_template_file)"
    )
