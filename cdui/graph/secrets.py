"""SECRET param values: taken out of every stored copy, put back in memory only.

``split_secrets(graph, registry, library)`` returns a deep copy of the graph
with every value a ``secret``-typed param would get blanked, and the list of
``(path, value)`` pairs that were removed. ``fill_secrets(graph, secrets)``
puts them back at the same paths (in the run subprocess, which gets them on
its stdin pipe, never argv or environment).

Where a secret can sit, at every preset depth:

- a node's ``data.params``;
- a preset node's ``data.internalParams[<inner id>]`` (it overrides that inner
  node's params);
- every preset definition's inner nodes (``params`` or ``data.params``, and, for
  an inner node that is itself a preset, its ``data.internalParams``). Nested
  presets are defined in the same ``presets`` list, so walking every
  definition reaches every depth.

Then, as the guarantee that nothing was missed, the graph is expanded the way
the run will expand it; every value that lands in a secret param of an
expanded node, and every value found above, is also taken out wherever else
it still appears in the copy (a message param that repeats the key),
and is masked even if it came from somewhere that is not stored (an installed
preset file).

Masking works on values, never on an encoded line: :func:`redact_value` walks
decoded event data (keys too) before it is encoded, and :func:`redact_text`
also replaces the JSON-escaped and ``repr`` forms a value takes inside text
(quotes, backslashes, tabs, newlines and non-ASCII letters all change when
escaped). A secret shorter than :data:`MIN_SECRET_LEN` characters cannot be
masked without blanking ordinary words, so :func:`short_secrets` lists them
and submit refuses them. Line-oriented text (a run's stderr) is read line by
line, so a secret that spans lines is also masked piece by piece, for every
line of it at least :data:`MIN_SECRET_LEN` long.
"""
from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from cdui.core.project import env_secrets
from cdui.graph.model import parse
from cdui.nodes.registry import Registry

Path_ = list[Any]
MIN_SECRET_LEN = 4
MASK = "***"
# This machine's own API keys that nodes read from the run's environment (LLMChat): not the graph's
# secrets, but masked as they are wherever a run writes (events, errors, logs).
OPENAI_ENV = ("CODEFYUI_OPENAI_API_KEY", "OPENAI_API_KEY")
ANTHROPIC_ENV = ("CODEFYUI_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY")
ENV_SECRETS = OPENAI_ENV + ANTHROPIC_ENV
PRESET_PREFIX = "preset:"
# An override for an inner node this code cannot see (unknown preset) is
# scrubbed by name: better a blank param than a stored key.
_SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential")


def _secret_names(registry: Registry, node_type: str) -> set[str]:
    cls = registry.get(node_type)
    if cls is None:
        return set()
    return {p.name for p in cls.define_params() if p.param_type == "secret"}


def _named_secret(params: Any) -> set[str]:
    if not isinstance(params, dict):
        return set()
    return {k for k in params if isinstance(k, str) and any(w in k.lower() for w in _SECRET_WORDS)}


def _preset_name(p: dict[str, Any]) -> str:
    return str(p.get("preset_name") or p.get("name"))


def split_secrets(graph: Any, registry: Registry,
                  library: dict[str, dict[str, Any]] | None = None) -> tuple[Any, list[tuple[Path_, Any]]]:
    g = copy.deepcopy(graph)
    found: list[tuple[Path_, Any]] = []
    if not isinstance(g, dict):
        return g, found
    presets: dict[str, dict[str, Any]] = dict(library or {})
    presets.update({_preset_name(p): p for p in g.get("presets") or [] if isinstance(p, dict)})

    def scrub(params: Any, names: set[str], path: Path_) -> None:
        if not isinstance(params, dict):
            return
        for name in sorted(names):
            if params.get(name) not in (None, ""):
                found.append((path + [name], params[name]))
                params[name] = ""

    def scrub_internal(internal: Any, preset_type: str, path: Path_) -> None:
        if not isinstance(internal, dict):
            return
        preset = presets.get(preset_type[len(PRESET_PREFIX):])
        inner_types = {x.get("id"): x.get("type") for x in (preset or {}).get("nodes") or [] if isinstance(x, dict)}
        for inner_id, params in internal.items():
            itype = inner_types.get(inner_id)
            names = _secret_names(registry, itype) if isinstance(itype, str) else set()
            if not isinstance(itype, str) or itype.startswith(PRESET_PREFIX) or registry.get(itype) is None:
                names |= _named_secret(params)
            scrub(params, names, path + [inner_id])

    def scrub_node(n: Any, path: Path_) -> None:
        if not isinstance(n, dict) or not isinstance(n.get("type"), str):
            return
        names = _secret_names(registry, n["type"])
        scrub(n.get("params"), names, path + ["params"])
        data = n.get("data")
        if isinstance(data, dict):
            scrub(data.get("params"), names, path + ["data", "params"])
            if n["type"].startswith(PRESET_PREFIX):
                scrub_internal(data.get("internalParams"), n["type"], path + ["data", "internalParams"])

    for i, n in enumerate(g.get("nodes") or []):
        scrub_node(n, ["nodes", i])
    for j, p in enumerate(g.get("presets") or []):
        if isinstance(p, dict):
            for k, inner in enumerate(p.get("nodes") or []):
                scrub_node(inner, ["presets", j, "nodes", k])

    # The guarantee: whatever the expansion puts into a secret param, and any
    # other copy of a secret found above, is gone from the copy.
    values = _expanded_secret_values(graph, registry, library) | {v for _, v in found if isinstance(v, str)}
    # The open project's .env values too (cdui/core/project.py): one pasted into any param is taken out of
    # the stored copy and put back in memory for the run, as a secret param's value is.
    env_values = {v for v in env_secrets().values() if len(v) >= MIN_SECRET_LEN}
    for path, leaf in list(_string_leaves(g, [])):
        if leaf in values or leaf in env_values:
            _set(g, path, "")
            found.append((path, leaf))
    stored = {str(v) for _, v in found}
    # Values that are not in the stored copy at all (an installed preset file's): masked only.
    found.extend(([], v) for v in sorted(values - stored))
    return g, found


def _expanded_secret_values(graph: Any, registry: Registry,
                            library: dict[str, dict[str, Any]] | None) -> set[str]:
    try:
        expanded, _ = parse(graph, library)
    except Exception:  # a graph parse refuses is refused at validation; nothing to add here
        return set()
    out: set[str] = set()
    for n in expanded.nodes.values():
        for name in _secret_names(registry, n.type):
            v = n.params.get(name)
            if v not in (None, ""):
                out.add(str(v))
    return out


def _string_leaves(obj: Any, path: Path_) -> Iterable[tuple[Path_, str]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _string_leaves(v, path + [k])
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _string_leaves(v, path + [i])
    elif isinstance(obj, str) and path:
        yield path, obj


def _set(obj: Any, path: Path_, value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def fill_secrets(graph: Any, secrets: list[tuple[Path_, Any]]) -> Any:
    g = copy.deepcopy(graph)
    for path, value in secrets:
        if not path:
            continue  # a value that is masked only: it never left its place
        try:
            _set(g, path, value)
        except (KeyError, IndexError, TypeError):
            continue
    return g


def describe_path(graph: Any, path: Path_) -> str:
    """``nodes[0] (id 'hook') data.params.api_key``: where a secret sits, without its value."""
    out: list[str] = []
    obj = graph
    for key in path:
        try:
            obj = obj[key]
        except (KeyError, IndexError, TypeError):
            obj = None
        if isinstance(key, int):
            ident = obj.get("id") if isinstance(obj, dict) else None
            out[-1] += f"[{key}]" + (f" (id {ident!r})" if ident else "")
        else:
            out.append(str(key))
    return ".".join(out) if out else "(a preset installed in data/presets)"


def environment_secrets(env: Mapping[str, str]) -> list[tuple[Path_, Any]]:
    """The environment's API keys (:data:`ENV_SECRETS`) as masked-only secrets (no path in the graph).

    One shorter than :data:`MIN_SECRET_LEN` cannot be masked without blanking ordinary words and is
    left out (no provider issues such a key)."""
    values = {env.get(name, "").strip() for name in ENV_SECRETS}
    return [([], v) for v in sorted(values) if len(v) >= MIN_SECRET_LEN]


def project_secrets(values: Mapping[str, str] | None = None) -> list[tuple[Path_, Any]]:
    """The .env values of the project this process opened (cdui/core/project.py), or ``values``, as
    masked-only secrets; one shorter than :data:`MIN_SECRET_LEN` cannot be masked and is left out (the
    project's start warns about it)."""
    got = env_secrets() if values is None else values
    return [([], v) for v in sorted(set(got.values())) if len(v) >= MIN_SECRET_LEN]


def short_secrets(secrets: list[tuple[Path_, Any]]) -> list[Path_]:
    """Paths of secrets too short to mask safely (refused at submit)."""
    return [p for p, v in secrets if len(str(v)) < MIN_SECRET_LEN]


def _forms(secrets: Iterable[tuple[Path_, Any]]) -> tuple[str, ...]:
    # Masking runs for every event of a run: the forms of the same values are worked out once. The
    # cache holds the values of the last few runs' secrets, which this process held anyway.
    return _forms_of(tuple(str(value) for _, value in secrets))


@functools.lru_cache(maxsize=16)
def _forms_of(values: tuple[str, ...]) -> tuple[str, ...]:
    forms: set[str] = set()
    for v in values:
        if len(v) < MIN_SECRET_LEN:
            continue
        forms.add(v)
        forms.add(json.dumps(v)[1:-1])
        forms.add(json.dumps(v, ensure_ascii=False)[1:-1])
        forms.add(repr(v)[1:-1])
        forms.add(v.encode("unicode_escape").decode("ascii"))
        # How an exception shows the bytes of a header or body: b'...\xe9...'.
        for enc in ("utf-8", "latin-1"):
            try:
                forms.add(repr(v.encode(enc))[2:-1])
            except UnicodeEncodeError:
                pass
        for line in v.splitlines():
            if len(line) >= MIN_SECRET_LEN:
                forms.add(line)
    # Longest first, so a value is masked whole before any of its pieces.
    return tuple(sorted((f for f in forms if len(f) >= MIN_SECRET_LEN), key=len, reverse=True))


def redact_text(text: str, secrets: list[tuple[Path_, Any]]) -> str:
    """Blank every secret value (and its escaped forms) in a log line or error message."""
    if not secrets:
        return text
    for form in _forms(secrets):
        if form in text:
            text = text.replace(form, MASK)
    return text


def redact_value(obj: Any, secrets: list[tuple[Path_, Any]]) -> Any:
    """Blank secret values in decoded event data: strings, dict keys, nested lists and dicts."""
    forms = _forms(secrets) if secrets else ()
    if not forms:
        return obj

    def walk(x: Any) -> Any:
        if isinstance(x, str):
            for form in forms:
                if form in x:
                    x = x.replace(form, MASK)
            return x
        if isinstance(x, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x
    return walk(obj)
