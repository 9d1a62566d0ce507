"""The official `openai` Python client against specd: speculated answers equal the real
vLLM's, streamed and not, and errors arrive as the client library expects them."""

import openai
import pytest

MODEL = "specd-target"
PROMPT = "def accumulate(values, weight):\n    total = 0\n" + "    total += values[3] * weight\n" * 4


@pytest.fixture(scope="module")
def clients(upstream, specd):
    return (openai.OpenAI(base_url=upstream + "/v1", api_key="x"),
            openai.OpenAI(base_url=specd + "/v1", api_key="x"))


def test_completion_matches_direct(clients):
    direct, via = clients
    a = direct.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0)
    b = via.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].finish_reason == b.choices[0].finish_reason
    assert a.usage.completion_tokens == b.usage.completion_tokens
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    spec = b.usage.model_extra["speculation"]
    assert spec["rounds"] >= 1 and spec["draft_tokens"] >= spec["accepted_tokens"]


def test_streamed_chat_matches_direct(clients):
    direct, via = clients
    msgs = [{"role": "user", "content": "Repeat: alpha beta gamma alpha beta gamma"}]
    def run(c):
        text, usage, roles = "", None, []
        for ch in c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True}):
            if ch.choices:
                d = ch.choices[0].delta
                text += d.content or ""
                if d.role:
                    roles.append(d.role)
            if ch.usage:
                usage = ch.usage
        return text, usage, roles
    a, b = run(direct), run(via)
    assert a[0] == b[0]
    assert a[1].completion_tokens == b[1].completion_tokens
    assert b[2] == ["assistant"]


def test_speculation_can_be_switched_off_per_request(clients):
    _, via = clients
    r = via.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                               extra_headers={"x-speculation": "off"})
    assert "speculation" not in (r.usage.model_extra or {})


def test_bad_request_is_an_openai_error(clients):
    _, via = clients
    with pytest.raises(openai.BadRequestError) as e:
        via.completions.create(model=MODEL, prompt=PROMPT, max_tokens=-3)
    assert "max_tokens" in str(e.value)
