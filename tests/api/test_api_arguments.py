"""Every public function's arguments: None where the default is "none", wrong types everywhere.

The walk reads each public callable's signature and calls it once per parameter and hostile value
(None, then values of the wrong type or range), every other argument valid. Each call must succeed
or raise an archrun.ArchrunError (a parameter whose default is None must accept None); anything
else (TypeError, AttributeError, IndexError, ...) fails the test, listed by callable and parameter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.api_walk import CHATML, LLAMA, Fresh, _call, _parameters, _targets, hostile

import archrun
from archrun.errors import ArchrunError


def with_template(directory: Path) -> Path:
    """The tiny llama fixture with a chat template (chat_tokens' template=None then means the file's)."""
    from fuzzing.gguf_model import KV, parse, serialize

    m = parse(LLAMA.read_bytes())
    m.kvs.append(KV("tokenizer.chat_template", 8, CHATML))
    path = directory / "llama_chat.gguf"
    path.write_bytes(serialize(m))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return archrun.load(with_template(tmp_path_factory.mktemp("api")), backend="reference")


@pytest.fixture(scope="module")
def host_model():
    return archrun.load(LLAMA, backend="reference", block_style="host_reference")








def walk(model, host_model) -> list[str]:
    failures = []
    for label, fn, base in _targets(model, host_model):
        for name, default in _parameters(fn, base):
            for value in [None, *hostile()]:
                kwargs = {k: v.make() if isinstance(v, Fresh) else v for k, v in base.items()}
                kwargs[name] = value
                try:
                    _call(fn, kwargs)
                except ArchrunError:
                    if value is None and default is None and name in dict(_parameters(fn, {})):
                        failures.append(f"{label}({name}=None): refused, but None is its default")
                except BaseException as exc:  # noqa: BLE001 - the point of the walk
                    failures.append(f"{label}({name}={archrun.errors.shown(value, 40)}): "
                                    f"{type(exc).__name__}: {str(exc)[:120]}")
    return failures


def test_every_public_argument_accepts_none_or_refuses_it_typed(model, host_model) -> None:
    failures = walk(model, host_model)
    assert not failures, "\n".join(failures)
