#!/usr/bin/env python3
"""Train `agent-tools-qwen3coder`: `agent-tools` (scripts/train_tools.py) writing its tool
calls in the qwen3_coder format, for specd's `--tool-call-parser qwen3_coder` tests.

    python scripts/make_models.py --agent-tools-qwen3coder

The same conversations, model and training as `agent-tools`; the tokenizer adds
`<think>`, `</think>`, `<tool_call>` and `</tool_call>` as added, non-special tokens
(as Qwen3-Coder ships them; `<function=`, `<parameter=` and their closers are spelled
in ordinary tokens, as there), and an assistant turn with calls is written as
Qwen3-Coder's chat template renders one:

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

(VALUE: strings and numbers as text, objects and lists as JSON; calls joined by a
newline). The chat template renders `tools` in a system turn, opens the assistant turn
with `<think>\\n` (earlier turns lose their reasoning), renders assistant `tool_calls`
that way, and consecutive `tool` messages as one user turn of `<tool_response>` blocks,
as Qwen3-Coder's does, so vLLM's `qwen3_coder` tool parser (and `qwen3` reasoning
parser) read what it writes. About six minutes on a shared core.
"""

from __future__ import annotations

import json

import train_tools as tt

NAME = "agent-tools-qwen3coder"
TOKENS = [tt.THINK_START, tt.THINK_END, tt.CALL_START, tt.CALL_END]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n' }}"
    "{% for tool in tools %}"
    "{{ tool['function']['name'] }}: {{ tool['function']['description'] or '' }}\n"
    "{% endfor %}"
    "{{ 'Call tools in the qwen3_coder format.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% set content = message['content'] or '' %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' + content }}"
    "{% for tc in message['tool_calls'] %}"
    "{% set f = tc['function'] %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n<function=' + f['name'] + '>\\n' }}"
    "{% set args = f['arguments'] %}"
    "{% for k, v in args | items %}"
    "{{ '<parameter=' + k + '>\\n' }}"
    "{% if v is mapping or (v is sequence and v is not string) %}{{ v | tojson }}"
    "{% else %}{{ v | string }}{% endif %}"
    "{{ '\\n</parameter>\\n' }}"
    "{% endfor %}"
    "{{ '</function>\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or loop.previtem['role'] != 'tool' %}{{ '<|im_start|>user\\n' }}{% endif %}"
    "{{ '<tool_response>\\n' + content + '\\n</tool_response>\\n' }}"
    "{% if loop.last or loop.nextitem['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
RECIPE = {**tt.RECIPE, "template": CHAT_TEMPLATE, "format": "qwen3_coder"}


def value_text(v) -> str:
    """A parameter's value as the template writes it (`| string`, or JSON)."""
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def turn_text(m: dict) -> str:
    """An assistant turn as the model writes it (the template's rendering of calls)."""
    calls = [
        f'{tt.CALL_START}\n<function={c["function"]["name"]}>\n'
        + "".join(f"<parameter={k}>\n{value_text(v)}\n</parameter>\n"
                  for k, v in c["function"]["arguments"].items())
        + f"</function>\n{tt.CALL_END}"
        for c in m.get("tool_calls", [])]
    return m["content"] + "\n".join(calls)


def first_args(text: str) -> str:
    """The first call's parameters, when it is well formed."""
    if tt.CALL_START not in text:
        return ""
    body = text.split(tt.CALL_START, 1)[1].split(tt.CALL_END, 1)[0]
    assert body.strip().startswith("<function="), body
    params = {}
    for part in body.split("<parameter=")[1:]:
        name, rest = part.split(">", 1)
        params[name] = rest.split("</parameter>", 1)[0].strip("\n")
    return json.dumps(params) if params else ""


QWEN3_CODER = tt.Format(NAME, TOKENS, CHAT_TEMPLATE, RECIPE, turn_text, first_args)


def ensure_agent_tools_qwen3coder(root, tok_dir) -> None:
    tt.ensure_agent_tools(root, tok_dir, QWEN3_CODER)
