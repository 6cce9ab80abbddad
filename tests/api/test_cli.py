"""The archrun command line: help, inspect, plugins, run, warmup, and one-line errors for bad input."""

import json
import subprocess
import sys

import numba
import pytest

from archrun.cli import main

COMMANDS = ["run", "chat", "inspect", "plugins", "bench", "warmup"]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_on_every_command(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert "usage: archrun " + cmd in capsys.readouterr().out


def test_inspect_prints_descriptor_and_providers(synth_model, capsys):
    path = synth_model(arch="qwen3moe", n_expert=4)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "qwen3moe (family: qwen3moe)" in out and "gating=softmax" in out and "blocks" in out
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["providers"]["moe=topk"] == "blocks"
    assert info["descriptor"]["layers"][0]["ffn"]["n_expert"] == 4


def test_plugins_lists_vocabulary_and_families(capsys):
    assert main(["plugins", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"blocks", "qwen", "llama"} <= set(info["installed"])
    assert "qwen3moe" in info["families"]["qwen"]
    assert any(e["slot"] == "attention" and e["name"] == "causal" for e in info["vocabulary"])


def _one_line_error(capsys, argv):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("archrun: error:") and "\n" not in err
    return err


def test_inspect_bad_inputs_print_one_line(tmp_path, synth_model, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    assert "magic" in _one_line_error(capsys, ["inspect", str(bad)])
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(synth_model().read_bytes()[:100])
    _one_line_error(capsys, ["inspect", str(trunc)])
    assert "No such file" in _one_line_error(capsys, ["inspect", str(tmp_path / "missing.gguf")])
    missing = synth_model(drop_tensors=("blk.0.attn_q.weight",))
    assert "blk.0.attn_q.weight" in _one_line_error(capsys, ["inspect", str(missing)])


def test_run_rejects_bad_options_in_one_line(synth_model, capsys):
    path = str(synth_model())
    assert "temperature" in _one_line_error(capsys, ["run", path, "-p", "<t5>", "--temp", "nan"])


def test_run_streams_text(synth_model, capsys):
    assert main(["run", str(synth_model()), "-p", "<t5><t6>", "-n", "3", "--temp", "0"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_console_script_exits_nonzero_with_one_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF")
    exe = [sys.executable, "-c", "import sys; from archrun.cli import main; sys.exit(main())"]
    proc = subprocess.run(exe + ["inspect", str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_warmup_fills_the_kernel_cache_for_a_model_and_weight_types(synth_model, capsys):
    """A model and its cache types, then weight types; what it warmed a later load finds compiled."""
    from archrun.kernels.matmul import dots

    path = synth_model(n_layer=1, head_dim=32)  # q8_0 caches need 32-wide heads
    assert main(["warmup", str(path), "--types", "q8_0,Q4_K", "--kv-type", "f16", "--kv-type", "q8_0"]) == 0
    assert capsys.readouterr().out == ""
    kernels = [dots.KERNELS[t] for t in (8, 12)]  # Q8_0, Q4_K
    if not numba.config.DISABLE_JIT:  # without the JIT there is nothing to compile
        assert all(k.signatures for k in kernels)  # compiled (or loaded from the cache) in this process


@pytest.mark.parametrize(("args", "message"), [
    (["--types", "Q4_Z"], "unknown weight type 'Q4_Z'"),
    (["--types", "TQ1_0"], "unknown weight type 'TQ1_0'"),
    (["nowhere.gguf"], "No such file"),
])
def test_warmup_bad_inputs_print_one_line(args, message, capsys):
    assert main(["warmup", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
