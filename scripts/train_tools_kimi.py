#!/usr/bin/env python3
"""Train `agent-tools-kimi`: `agent-tools` (scripts/train_tools.py) writing its tool calls
in the kimi_k2 format, for specd's `--tool-call-parser kimi_k2` tests.

    python scripts/make_models.py --agent-tools-kimi

The same conversations, model and training as `agent-tools`; the tokenizer adds
`<think>`, `</think>` and kimi_k2's five call markers (`<|tool_calls_section_begin|>`,
`<|tool_calls_section_end|>`, `<|tool_call_begin|>`, `<|tool_call_argument_begin|>`,
`<|tool_call_end|>`) as added, non-special tokens, and an assistant turn with calls
is written

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>

with IDX the call's place in the conversation, as Kimi-K2 writes its call ids. The chat
template renders `tools` in a system turn, opens the assistant turn with `<think>\\n`
(earlier turns lose their reasoning), renders assistant `tool_calls` in that format with
their `id`s, and `tool` messages as turns of their own, so vLLM's `kimi_k2` reasoning
and tool parsers read what it writes. About six minutes on a shared core.
"""

from __future__ import annotations

import json

import train_tools as tt

NAME = "agent-tools-kimi"
SECTION_START = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
TOKENS = [tt.THINK_START, tt.THINK_END, SECTION_START, SECTION_END, CALL_BEGIN, ARG_BEGIN,
          CALL_END]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n' }}"
    "{% for tool in tools %}"
    "{{ tool['function']['name'] }}: {{ tool['function']['description'] or '' }}\n"
    "{% endfor %}"
    "{{ 'Call tools in the kimi_k2 format.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% set content = message['content'] or '' %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' + content + '<|tool_calls_section_begin|>' }}"
    "{% for tc in message['tool_calls'] %}"
    "{% set f = tc['function'] %}"
    "{{ '<|tool_call_begin|>' + tc['id'] + '<|tool_call_argument_begin|>' }}"
    "{% if f['arguments'] is string %}{{ f['arguments'] }}"
    "{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "{{ '<|tool_call_end|>' }}"
    "{% endfor %}"
    "{{ '<|tool_calls_section_end|><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
RECIPE = {**tt.RECIPE, "template": CHAT_TEMPLATE, "format": "kimi_k2"}


def turn_text(m: dict) -> str:
    """An assistant turn as the model writes it (the template's rendering of calls)."""
    calls = m.get("tool_calls", [])
    if not calls:
        return m["content"]
    body = "".join(
        f'{CALL_BEGIN}{c["id"]}{ARG_BEGIN}'
        f'{json.dumps(c["function"]["arguments"], ensure_ascii=False)}{CALL_END}'
        for c in calls)
    return f'{m["content"]}{SECTION_START}{body}{SECTION_END}'


def first_args(text: str) -> str:
    """The first call's arguments, when it is well formed."""
    if SECTION_START not in text:
        return ""
    call = text.split(CALL_BEGIN, 1)[1].split(CALL_END, 1)[0]
    header, args = call.split(ARG_BEGIN, 1)
    assert header.startswith("functions.") and ":" in header, header
    return json.dumps(json.loads(args))


KIMI = tt.Format(NAME, TOKENS, CHAT_TEMPLATE, RECIPE, turn_text, first_args)


def ensure_agent_tools_kimi(root, tok_dir) -> None:
    tt.ensure_agent_tools(root, tok_dir, KIMI)
