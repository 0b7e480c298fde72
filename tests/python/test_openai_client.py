"""The official `openai` Python client against `hillside serve`, on the real model.

Run by scripts/openai-client-test.sh (part of `make test`): python3 test_openai_client.py HILLSIDE_BINARY
"""

import os
import sys

import openai

from serve import start

MODEL = "smollm2-135m-instruct"
KEY = "sk-hillside-test"


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def main(binary):
    server, base = start(binary, "--context", "2048", env={**os.environ, "HILLSIDE_API_KEY": KEY})
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of Germany?"}]

        check(any(m.id == MODEL for m in client.models.list()), "the model is listed")

        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
        text = reply.choices[0].message.content
        check("Berlin" in text, f"chat answers: {text!r}")
        check(reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0, "usage in a whole reply")
        check(reply.choices[0].finish_reason in ("stop", "length"), reply.choices[0].finish_reason)

        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(streamed == text, f"streamed {streamed!r} != whole {text!r}")
        check(chunks[-1].usage is not None and not chunks[-1].choices, "usage arrives last, alone")
        check(all(c.usage is None for c in chunks[:-1]), "usage only in the last chunk")
        plain = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, stream=True))
        check(all(c.usage is None for c in plain), "no usage unless asked for")

        completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
        check("Paris" in completion.choices[0].text, completion.choices[0].text)
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True)
            if c.choices
        )
        check(streamed == completion.choices[0].text, f"{streamed!r} != {completion.choices[0].text!r}")

        try:
            client.chat.completions.create(model="gpt-4o", messages=messages)
            raise AssertionError("an unknown model must fail")
        except openai.NotFoundError as e:
            check(e.code == "model_not_found", e)
        try:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 3000}])
            raise AssertionError("a prompt over the context must fail")
        except openai.BadRequestError as e:
            check(e.code == "context_length_exceeded", e)
        try:
            openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0).models.list()
            raise AssertionError("a wrong key must fail")
        except openai.AuthenticationError:
            pass
    finally:
        server.terminate()
        code = server.wait(timeout=30)
    check(code == 0, f"serve exits cleanly on SIGTERM (exit {code})")
    print(f"openai {openai.__version__} client against hillside serve: ok")


if __name__ == "__main__":
    main(sys.argv[1])
