"""The demo's requests through the proxy (scripts/demo.sh runs it with the proxy's port): held-out prompts of
validate's task with the right answers beside the model's, one streamed chat request, the proxy's counters."""

import json
import sys

import httpx

from hybridserve.core.validate.synthetic import make_examples


def prompt_label(text: str) -> str:
    """'first four words ... last four words' (N words): the prompt is counted in words, not model tokens."""
    words = text.split()
    return f"'{' '.join(words[:4])} ... {' '.join(words[-4:])}' ({len(words)} words)"


def main(port: str) -> None:
    url = f"http://127.0.0.1:{port}"
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    print(f"== model: {model}; task: the most frequent section marker of a 520-760 word prompt, then the last one")
    examples = make_examples(seed=2026, num_examples=4)
    for ex in examples[:3]:
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": ex.prompt_text, "max_tokens": 8,
                                                      "temperature": 0}, timeout=60).json()
        print(f"== /v1/completions {prompt_label(ex.prompt_text)} -> {r['choices'][0]['text']!r}, "
              f"right answer {ex.answer_text!r}")
    chat = {"model": model, "messages": [{"role": "user", "content": examples[3].prompt_text}], "max_tokens": 8,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=chat, timeout=60) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events if e != "[DONE]")
    print(f"== /v1/chat/completions (stream, {len(events)} events, last {events[-1]}) -> {text!r}, "
          f"right answer {examples[3].answer_text!r}")
    print("== proxy metrics:")
    print("\n".join(l for l in httpx.get(f"{url}/metrics").text.splitlines() if l.startswith("hybridserve_proxy_req")))


if __name__ == "__main__":
    main(sys.argv[1])
