#!/usr/bin/env python3
"""Train `agent-tools-llama3`: `agent-tools` (scripts/train_tools.py) writing its tool
calls as Llama 3.1 writes JSON calls, for specd's `--tool-call-parser llama3_json` tests.

    python scripts/make_models.py --agent-tools-llama3

The same conversations, model and training as `agent-tools`, without the reasoning
(Llama 3.1 does not reason). The tokenizer adds `<|python_tag|>` as an added, non-special
token (vLLM's `llama3_json` parser refuses a tokenizer without it; non-special, it stays
in the text the parser reads), and an assistant turn with calls is written

    <|python_tag|>{"name": "NAME", "parameters": {...}}; {"name": ..., "parameters": ...}

(several calls `;`-separated, as the parser reads them). The chat template renders
`tools` in a system turn with Llama 3.1's instruction for JSON calls, assistant
`tool_calls` in that format and `tool` messages as `ipython` turns, so vLLM's
`llama3_json` tool parser reads what it writes, whole and streamed (a streamed answer's
calls are read only when it starts with `<|python_tag|>` or `{`). About six minutes on
a shared core.
"""

from __future__ import annotations

import json

import train_tools as tt

NAME = "agent-tools-llama3"
PYTHON_TAG = "<|python_tag|>"
TOKENS = [PYTHON_TAG]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n' }}"
    "{% for tool in tools %}"
    "{{ tool['function']['name'] }}: {{ tool['function']['description'] or '' }}\n"
    "{% endfor %}"
    "{{ 'Respond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% set content = message['content'] or '' %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' + content + '<|python_tag|>' }}"
    "{% for tc in message['tool_calls'] %}"
    "{% set f = tc['function'] %}"
    "{% if not loop.first %}{{ '; ' }}{% endif %}"
    "{{ '{\"name\": \"' + f['name'] + '\", \"parameters\": ' }}"
    "{% if f['arguments'] is string %}{{ f['arguments'] }}"
    "{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "{{ '}' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>ipython\\n' + content + '<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
RECIPE = {**tt.RECIPE, "template": CHAT_TEMPLATE, "format": "llama3_json"}


def turn_text(m: dict) -> str:
    """An assistant turn as the model writes it (the template's rendering of calls)."""
    calls = m.get("tool_calls", [])
    if not calls:
        return m["content"]
    body = "; ".join(
        f'{{"name": "{c["function"]["name"]}", "parameters": '
        f'{json.dumps(c["function"]["arguments"], ensure_ascii=False)}}}'
        for c in calls)
    return f'{m["content"]}{PYTHON_TAG}{body}'


def first_args(text: str) -> str:
    """The first call's arguments, when it is well formed."""
    if PYTHON_TAG not in text:
        return ""
    body = text.split(PYTHON_TAG, 1)[1]
    obj, _ = json.JSONDecoder().raw_decode(body)
    return json.dumps(obj["parameters"])


LLAMA3 = tt.Format(NAME, TOKENS, CHAT_TEMPLATE, RECIPE, turn_text, first_args, thinks=False)


def ensure_agent_tools_llama3(root, tok_dir) -> None:
    tt.ensure_agent_tools(root, tok_dir, LLAMA3)
