"""Copy-paste snippets for the console's connect page (K2): each client
pointed at this gateway by the base URL the console itself is served from,
written the way that client's own settings take it (docs/providers.md, "Claude Code
and Codex CLI")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Snippet:
    title: str
    language: str
    text: str


def snippets(root: str, model: str) -> list[Snippet]:
    """``root`` ends in ``/`` (``https://gateway.example/``)."""
    origin = root.rstrip("/")
    return [
        Snippet("OpenAI SDK (Python)", "python", f'''from openai import OpenAI

client = OpenAI(base_url="{origin}/v1", api_key="hb-…")
reply = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello"}}])
print(reply.choices[0].message.content)'''),
        Snippet("Anthropic SDK (Python)", "python", f'''from anthropic import Anthropic

client = Anthropic(base_url="{origin}", api_key="hb-…")
reply = client.messages.create(model="{model}", max_tokens=256, messages=[{{"role": "user", "content": "Hello"}}])
print(reply.content[0].text)'''),
        Snippet("Google GenAI SDK (Python)", "python", f'''from google import genai
from google.genai import types

client = genai.Client(api_key="hb-…", http_options=types.HttpOptions(base_url="{origin}"))
reply = client.models.generate_content(model="{model}", contents="Hello")
print(reply.text)'''),
        Snippet("Claude Code", "shell", f'''export ANTHROPIC_BASE_URL={origin}
export ANTHROPIC_AUTH_TOKEN=hb-…
export ANTHROPIC_MODEL={model}
claude'''),
        Snippet("Codex CLI (~/.codex/config.toml)", "toml", f'''model = "{model}"
model_provider = "hopbase"

[model_providers.hopbase]
name = "HopBase"
base_url = "{origin}/v1"
env_key = "HOPBASE_API_KEY"
wire_api = "responses"

# then: export HOPBASE_API_KEY=hb-…'''),
    ]
