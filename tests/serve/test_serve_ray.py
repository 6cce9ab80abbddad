"""`archrun serve --ray`: a local Ray cluster on loopback runs 2 replicas of the real SmolLM2 server as one Ray
Serve deployment; the openai client's requests are spread over both and answered as by one server (greedy
replies agree, streaming works). Bounded: the cluster is torn down, and the test fails past DEADLINE_S."""

from __future__ import annotations

import concurrent.futures
import os
import socket

import pytest
from support.models import real_model
from support.ray_cluster import loopback_cluster

from archrun.serve import ServeConfig

DEADLINE_S = 420
if os.environ.get("CI"):
    import ray  # noqa: F401 - CI installs the ray extra: a missing one is a failure, not a skip
ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    from ray import serve

    from archrun.serve.ray import deployment

    path = real_model("smollm2")
    with loopback_cluster(DEADLINE_S, "the Ray test"):
        try:
            port = _free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            app = deployment(path, ServeConfig(parallel=1, model_name="smollm2"), replicas=2,
                             load_options={"threads": 1})
            serve.run(app, name="archrun", route_prefix="/")
            yield f"http://127.0.0.1:{port}"
        finally:
            serve.shutdown()


def test_two_replicas_behind_one_openai_endpoint(endpoint):
    client = openai.OpenAI(base_url=endpoint + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Name a colour."}]

    def one(_):
        raw = client.chat.completions.with_raw_response.create(
            model="smollm2", messages=ask, max_tokens=8, temperature=0, extra_body={"cache_prompt": False})
        return raw.headers["x-archrun-replica"], raw.parse().choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(12)))
    assert len({replica for replica, _ in answers}) == 2, answers  # both replicas served
    assert len({text for _, text in answers}) == 1 and answers[0][1]  # and answer alike (one sequence per slot)
    stream = client.chat.completions.create(model="smollm2", messages=ask, max_tokens=8, temperature=0, stream=True,
                                            extra_body={"cache_prompt": False})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answers[0][1]
    assert [m.id for m in client.models.list().data] == ["smollm2"]


def test_bad_deployments_are_refused(tmp_path):
    from archrun.errors import InvalidRequest
    from archrun.serve.ray import deployment

    with pytest.raises(InvalidRequest):
        deployment(tmp_path / "missing.gguf", ServeConfig(), replicas=2)
    with pytest.raises(InvalidRequest):
        deployment(real_model("smollm2"), ServeConfig(), replicas=0)


def test_cli_refuses_bad_replicas_in_one_line(capsys):
    from archrun.cli import main

    assert main(["serve", str(real_model("smollm2")), "--ray", "--replicas", "0"]) == 1
    assert capsys.readouterr().err.startswith("archrun: error: --replicas must be")
