"""`archrun serve` and `archrun chat` on the command line: options checked before the model loads,
and the chat's KV cache kept between turns."""

from __future__ import annotations

import io

import pytest

import archrun
from archrun.cli import main


def test_serve_help_lists_the_server_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for flag in ("--api-key", "--parallel", "--ctx", "--host", "--port", "--queue", "--max-body"):
        assert flag in out


@pytest.mark.parametrize("flag", [["--parallel", "0"], ["--port", "70000"], ["--queue", "-1"], ["--ctx", "1"],
                                  ["--max-body", "0"], ["--api-key", ""]])
def test_serve_refuses_bad_options_in_one_line_before_loading(tmp_path, flag, capsys):
    assert main(["serve", str(tmp_path / "absent.gguf"), *flag]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag[0] in err[0]


@pytest.mark.parametrize("flag, message", [(["--max-memory", "2XB"], "memory size"), (["--max-kv", "0"], "memory size"),
                                           (["--watchdog", "0"], "--watchdog"),
                                           (["--reasoning-budget", "-2"], "--reasoning-budget")])
def test_serve_refuses_bad_memory_watchdog_and_budget_options(tmp_path, flag, message, capsys):
    assert main(["serve", str(tmp_path / "absent.gguf"), *flag]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_serve_needs_a_model_and_refuses_an_empty_models_dir(tmp_path, capsys):
    assert main(["serve"]) == 1
    assert "no model to serve" in capsys.readouterr().err
    assert main(["serve", "--models-dir", str(tmp_path)]) == 1
    assert "no model to serve" in capsys.readouterr().err
    assert main(["serve", "--models-dir", str(tmp_path / "absent")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_serve_several_models_runs_the_front(synth_model, tmp_path, monkeypatch):
    import uvicorn

    from archrun.serve.front import Front

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **k: started.append(app))
    one, two = synth_model(), tmp_path / "two.gguf"
    two.symlink_to(one)
    assert main(["serve", str(one), str(two), "--max-memory", "1GiB", "--port", "0"]) == 0
    front = started[0]
    assert isinstance(front, Front) and front.pool.budget.limit == 2**30
    assert [e.facts.id for e in front.pool.entries.values()] == [one.name, "two.gguf"]


def test_serve_refuses_a_context_beyond_the_models(synth_model, capsys, monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the server must not start"))
    path = str(synth_model(n_ctx=64))
    assert main(["serve", path, "--ctx", "128"]) == 1
    assert "--ctx 128 exceeds the model's context length 64" in capsys.readouterr().err


def test_chat_keeps_one_prefix_cache_across_turns(synth_model, monkeypatch, capsys):
    seen = []

    def fake_chat(model, history, cache=None, **options):
        seen.append(cache)
        text = f"reply {len(seen)}"

        class Gen:
            result = archrun.generation.generate.GenerationResult(text, (), "stop", 1, 0, {})

            def __iter__(self):
                return iter([text])

        return Gen()

    monkeypatch.setattr(archrun, "chat", fake_chat)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nagain\n"))
    assert main(["chat", str(synth_model())]) == 0
    assert len(seen) == 2 and seen[0] is seen[1] is not None
    assert "reply 1" in capsys.readouterr().out
