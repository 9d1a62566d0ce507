#!/usr/bin/env python3
"""Reference outputs of vLLM's own `hermes` tool parser, for specd's unit tests.

    ~/.cache/specd/vllm-venv/bin/python scripts/tool_parser_reference.py \
        > src/speculation/tools/hermes_vllm.json

For each text: the whole-answer parse (`extract_tool_calls`), the streaming parse fed
one character per step (`extract_tool_calls_streaming`, the finest split of the text)
and the arguments left unstreamed at the end. Needs the agent-tools model's tokenizer
(scripts/make_models.py --agent-tools); the parser only holds it.
"""
import json
import os
import sys
from pathlib import Path

from transformers import AutoTokenizer
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
tok = AutoTokenizer.from_pretrained(str(Path(os.environ.get("SPECD_MODELS_DIR", Path.home() / ".cache/specd/models")) / "agent-tools"))
req = ChatCompletionRequest(model="m", messages=[{"role":"user","content":"x"}], tools=[{"type":"function","function":{"name":"f"}}])
cases = [
 'plain text',
 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
 '<tool_call>\n{"name":"add","arguments":{"a":1.50,"b":-0,"c":1e3}}\n</tool_call>\n<tool_call>\n{"name": "s", "arguments": {"q": "caf\\u00e9 é"}}\n</tool_call> trailing',
 '<tool_call>\n{"name": "f", "arguments": {"x": 1}}',
 '<tool_call>\n{"name": "f", "arguments": {"x": 1',
 '  \n<tool_call>{"name": "f", "arguments": "str"}</tool_call>',
 'a <tool_call></tool_call>',
 '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
 '<tool_call>{"name": "f"}</tool_call>',
 'x < y <tool_',
 '<tool_call>{"arguments": {"k": [1, 2]}, "name": "g"}</tool_call>',
]
out = []
for text in cases:
    p = Hermes2ProToolParser(tok)
    r = p.extract_tool_calls(text, req)
    whole = {"called": r.tools_called, "content": r.content,
             "calls": [[c.function.name, c.function.arguments] for c in r.tool_calls]}
    p = Hermes2ProToolParser(tok)
    steps = []
    cur = ""
    # one step per character: the finest split
    for ch in text:
        prev = cur; cur += ch
        d = p.extract_tool_calls_streaming(prev, cur, ch, [], [], [], req)
        if d is None:
            steps.append(None)
        else:
            steps.append({"content": d.content, "calls": [[t.index, t.function.name if t.function else None, t.function.arguments if t.function else None] for t in d.tool_calls]})
    out.append({"text": text, "whole": whole, "steps": steps, "remaining": p.get_remaining_unstreamed_args()})
json.dump(out, sys.stdout, ensure_ascii=False, indent=0)
