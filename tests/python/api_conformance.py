"""The published OpenAPI document against the server it describes.

schemathesis (pinned) runs every conformance check, in every phase, on every route of a real `hillside serve`
(the real model, a data folder of its own), for a bounded number of cases per route. A document
is added first, so that the routes that read one get past their 404.

Run by scripts/api-conformance.sh (part of `make test`):
    python3 api_conformance.py HILLSIDE_BINARY SCHEMATHESIS_CLI CASES_PER_ROUTE
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import urllib.request

from serve import control_secret, start

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Every check but the response time, which is a benchmark's business (`--checks all` adds it).
CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance", "negative_data_rejection", "positive_data_acceptance", "missing_required_header",
    "unsupported_method", "allow_header_conformance", "use_after_free", "ensure_resource_availability",
    "ignored_auth", "object_level_authorization",
])
NOTES = (
    "Minutes of the harbour board.\n\n"
    "The board met on Tuesday. The new crane is late; the pier repairs finish in May.\n\n"
    "The ferry timetable changes in June, with two more crossings on Saturdays.\n"
)


def start_in(binary, work):
    """The server with a models folder of its own (the fuzzer deletes, imports and pulls models), a
    hub address nothing answers at, and replies of at most 16 tokens where a case names no
    `max_tokens` (OpenAI's default for completions): unbounded, each ran to the end of the context,
    and those cases took most of the run."""
    (work / "config.toml").write_text("[server]\nmax_tokens = 16\n")
    model = subprocess.run([binary, "models", "path"], capture_output=True, text=True, check=True).stdout.strip()
    os.environ.update(HILLSIDE_MODELS_DIR=str(work / "models"), HF_ENDPOINT="http://127.0.0.1:9",
                      HF_HOME=str(work / "no-hf-cache"))
    server, base = start(binary, "--model", model, "--context", "1024", "--config", str(work / "config.toml"),
                         "--documents-dir", str(work / "documents"), "--cold-dir", str(work / "cold"))
    return server, base, control_secret(server)


def post(url, body, content_type):
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.load(reply)


def add_document(base):
    boundary = "hillside-conformance"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n"
        f"Content-Type: text/plain\r\n\r\n{NOTES}\r\n--{boundary}--\r\n"
    ).encode()
    return post(f"{base}/v1/hillside/documents", body, f"multipart/form-data; boundary={boundary}")["id"]


def check_default_bound(base):
    """The config file's `[server] max_tokens` is in force: greedy counting, which no end-of-text
    cuts short, stops at 16 tokens."""
    body = json.dumps({"prompt": "One, two, three, four,", "temperature": 0, "repeat_penalty": 1.0, "stop": []})
    reply = post(f"{base}/v1/completions", body.encode(), "application/json")
    got = (reply["usage"]["completion_tokens"], reply["choices"][0]["finish_reason"])
    if got != (16, "length"):
        sys.exit(f"[server] max_tokens = 16 is not in force: {got}")


def served_model(base):
    with urllib.request.urlopen(f"{base}/v1/models", timeout=60) as reply:
        return json.load(reply)["data"][0]["id"]


def with_ids(document, model):
    """The checked-in config with the document to read and the model to describe: the fuzzer's
    uploads are rarely documents, and guessed names never models. Only for the routes that take
    them, and without the stateful phase, which would carry these ids to routes of other kinds."""
    text = (ROOT / "schemathesis.toml").read_text()
    for path, value in [("/v1/models/{id}", model), ("/v1/hillside/documents/{id}", document),
                        ("/v1/hillside/documents/{id}/text", document),
                        ("/v1/hillside/documents/{id}/summary", document)]:
        # Not DELETE, which would take the document away from the routes tested after it.
        text += f'\n[[operations]]\ninclude-path = "{path}"\nexclude-method = "DELETE"\n'
        text += f'parameters = {{ "path.id" = {json.dumps(value)} }}\n'
    return text


def main(binary, cli, cases):
    with tempfile.TemporaryDirectory(prefix="hillside-conformance-") as scratch:
        work = pathlib.Path(scratch)
        # With this run's secret, as the web UI sends it: the fuzzer reaches the settings and models
        # routes' own checks.
        server, base, secret = start_in(binary, work)

        def run(config, *only):
            (work / "schemathesis.toml").write_text(config)
            return subprocess.run(
                [cli, "--config-file", str(work / "schemathesis.toml"), "run", f"{base}/openapi.json",
                 "--checks", CHECKS, "--max-examples", cases, "--workers", "1", "--seed", "1", "--no-color",
                 "--request-timeout", "300", "--header", f"X-Hillside-Control: {secret}", *only],
                cwd=work,
            ).returncode

        try:
            check_default_bound(base)
            # Every route in every phase, then the routes that take an id again, with real ones.
            every = run((ROOT / "schemathesis.toml").read_text())
            with_real_ids = run(with_ids(add_document(base), served_model(base)), "--phases", "coverage,fuzzing",
                                "--include-path-regex", "^/v1/(models|hillside/documents)/[{]id[}]")
        finally:
            server.terminate()
            server.wait(timeout=60)
        sys.exit(every or with_real_ids)


if __name__ == "__main__":
    main(*sys.argv[1:4])
