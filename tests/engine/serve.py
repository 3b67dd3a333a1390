"""Serve one workload on a real ``sglang.Engine`` and write what it answered.

Run as a script, one process per side (``python serve.py SPEC.json``): the
caller decides whether flatgather is on by setting ``FLATGATHER_SGLANG`` in
this process's environment, exactly as an operator does, so the engine's
spawned scheduler turns it on through the installed ``.pth`` line. This
script never imports flatgather.

With ``"http": true`` in the spec, the same workload goes to a server
started as operators start one, ``python -m sglang.launch_server``, as one
batch ``POST /generate``.

With ``"front_end": "http"`` the server runs with the model's tokenizer
and answers a fixed sequence of calls (``workload.front_end_calls``): the
raw bytes of each response are written, as the client got them. With
``"front_end": "engine"`` an ``sglang.Engine`` with the tokenizer answers
``workload.front_end_engine_calls``, each logprob field written as its
``repr`` (types included). With ``"split": true`` this process starts with
flatgather off and turns it on before the server or engine starts, so only
the processes they spawn (scheduler, detokenizer) run it; the server's own
process (``launch_server``) is started through a wrapper that does the same.

The answer file holds, per request, the output ids and every logprob field
of ``meta_info`` (floats written by ``repr``, so they compare bit for bit),
and the markers of the engine's trace (see ``sitecustomize.py``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workload  # noqa: E402

KEPT = (
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "input_token_logprobs",
    "output_token_logprobs",
    "input_top_logprobs",
    "output_top_logprobs",
    "input_token_ids_logprobs",
    "output_token_ids_logprobs",
    "spec_verify_ct",
    "spec_accept_length",
)
"""The ``meta_info`` fields compared: everything the request asked for,
nothing that varies between runs of the same engine (ids, timings)."""

SCENARIOS = {
    # No speculative decoding: SGLang's pure-torch attention.
    "plain": {"attention_backend": "torch_native"},
    # EAGLE3 spec v2, one draft token per step, acceptance forced by the
    # environment the caller sets (SGLANG_SIMULATE_ACC_LEN).
    "eagle3-topk1": {
        "attention_backend": "triton",
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 2,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 3,
    },
    "eagle3-topk2": {
        "attention_backend": "triton",
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 2,
        "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 4,
    },
}


def engine_args(spec: dict) -> dict:
    args = {
        "model_path": spec["target"],
        "device": "cpu",
        "dtype": "float32",
        # Only the front-end scenario loads the tokenizer: the others feed
        # ids and compare ids and values.
        "skip_tokenizer_init": not spec.get("front_end"),
        # The automatic fraction comes out negative on a CPU.
        "mem_fraction_static": 0.05,
        "max_total_tokens": 8192,
        "disable_cuda_graph": True,
        "sampling_backend": "pytorch",
        "random_seed": 0,
        "log_level": "info",
        # Small chunks split the long prompts; a prefill batch holds up to
        # four chunks' worth of tokens, so many short requests share one.
        "chunked_prefill_size": spec.get("chunked_prefill_size", 64),
        "max_prefill_tokens": 4 * spec.get("chunked_prefill_size", 64),
    }
    args |= SCENARIOS[spec["scenario"]] | spec.get("engine", {})
    if "speculative_algorithm" in args:
        args["speculative_draft_model_path"] = spec["draft"]
    return args


def exact(value):
    """Floats as their repr (bit for bit, -0.0 and NaN included)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return [exact(v) for v in value]
    if isinstance(value, dict):
        return {k: exact(v) for k, v in value.items()}
    return value


def answer(out: dict) -> dict:
    meta = out["meta_info"]
    return exact({"output_ids": out["output_ids"]} | {k: meta[k] for k in KEPT if k in meta})


HIGHEST_PORT = 55535
"""Releases 0.5.14 to 0.5.19 refuse to start on a port past this one: they
put a gRPC port at ``--port`` + 10000 and check that it is a port. The
kernel's ephemeral ports reach 60999."""


def _free_port() -> int:
    """A loopback port free when asked, at most :data:`HIGHEST_PORT`."""
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(20000, HIGHEST_PORT + 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def _cli(args: dict) -> list[str]:
    out = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False:
            out += [flag, str(value)]
    return out


def post_json(url: str, body: dict, timeout: float):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{url}: {exc.code} {exc.read().decode(errors='replace')}") from None


def serve_http(spec: dict, batch: dict) -> tuple[list, float, float]:
    """Start ``python -m sglang.launch_server`` on a free loopback port,
    send the batch as one ``POST /generate``, stop the server."""
    # The HTTP schema takes no None in a batch's id lists; SGLang reads an
    # empty list as None.
    batch = batch | {"token_ids_logprob": [ids or [] for ids in batch["token_ids_logprob"]]}
    server, port, up = start_server(engine_args(spec))
    try:
        sent = time.perf_counter()
        outs = post_json(f"http://127.0.0.1:{port}/generate", batch, timeout=600)
        serve_s = time.perf_counter() - sent
    finally:
        stop_server(server)
    return outs, up, serve_s


SPLIT = (
    "import os, runpy; "
    # This process started with the switch off (its .pth line did nothing);
    # the processes it spawns read it on.
    "os.environ['FLATGATHER_SGLANG'] = '1'; "
    "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)"
)


def start_server(args: dict, split: bool = False) -> tuple[subprocess.Popen, int, float]:
    """``python -m sglang.launch_server`` on a free loopback port, up and
    healthy; with ``split``, the same module run by a wrapper that turns
    flatgather on for its spawned processes only.

    The port is free when picked, not when the server binds it: another
    server on the machine can take it in between, answer the health check,
    and ours then fails to bind. So the server that answers must serve our
    model (``/model_info``) and ours must still run; if not, another port.
    Returns the server, its port and the seconds it took to come up."""
    command = ["-c", SPLIT] if split else ["-m", "sglang.launch_server"]
    started = time.perf_counter()
    for _ in range(3):
        port = _free_port()
        cli = _cli(args | {"host": "127.0.0.1", "port": port})
        server = subprocess.Popen([sys.executable, *command, *cli], start_new_session=True)
        if _up(server, port, args["model_path"], started + 300):
            return server, port, time.perf_counter() - started
        stop_server(server)
    raise RuntimeError("no server of ours came up on three ports")


def _up(server: subprocess.Popen, port: int, model: str, deadline: float) -> bool:
    """Whether our server came up on ``port``; False when it exited or
    another one answers there."""
    url = f"http://127.0.0.1:{port}"
    while True:
        if server.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                pass
            with urllib.request.urlopen(f"{url}/model_info", timeout=5) as response:
                served = json.loads(response.read()).get("model_path")
            # Ours also still runs: another server may answer while ours
            # fails to bind.
            time.sleep(1)
            return served == model and server.poll() is None
        except OSError:
            if time.perf_counter() > deadline:
                raise RuntimeError("the server was not up after 300 s") from None
            time.sleep(0.5)


def stop_server(server: subprocess.Popen) -> None:
    """Stop the server and every process it started (none left to stop
    where the server and its group have exited already)."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        server.wait()
        return
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _raw(url: str, body: dict, timeout: float) -> dict:
    """One call's status and body bytes exactly as they came (an SSE stream
    whole, to its end), the bytes kept as latin-1 text for the JSON file."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, data = exc.code, exc.read()
    return {"status": status, "body": data.decode("latin-1")}


def serve_front_end(spec: dict) -> tuple[list, float, float, int]:
    """The front-end calls, one after the other (never two at once: the
    batches the scheduler forms, and so the floats, are then the same on
    both sides), against one server."""
    server, port, up = start_server(engine_args(spec), spec.get("split", False))
    try:
        sent = time.perf_counter()
        outs = [
            {"name": name} | _raw(f"http://127.0.0.1:{port}{path}", body, timeout=300)
            for name, path, body in workload.front_end_calls(spec.get("seed", 0))
        ]
        serve_s = time.perf_counter() - sent
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}) while serving")
    finally:
        stop_server(server)
    return outs, up, serve_s, server.pid


def _engine_generate(engine, kwargs: dict):
    """``engine.generate(**kwargs)``; where the release's ``Engine.generate``
    takes no ``return_text_in_logprobs`` (0.5.23), the request it builds,
    with that field, handed to its tokenizer manager the way it hands it."""
    import inspect

    if "return_text_in_logprobs" in inspect.signature(engine.generate).parameters:
        return engine.generate(**kwargs)
    from sglang.srt.managers.io_struct import GenerateReqInput

    kwargs = dict(kwargs)
    obj = GenerateReqInput(text=kwargs.pop("prompt", None), **kwargs)
    generator = engine.tokenizer_manager.generate_request(obj, None)
    return engine.loop.run_until_complete(generator.__anext__())


def serve_front_end_engine(spec: dict) -> tuple[list, float, float, int]:
    """``Engine.generate`` with the tokenizer, each call's logprob fields as
    their ``repr``: the Python objects the front end hands back, types
    included (a float's bits, an int id, a str or None text)."""
    if spec.get("split"):
        os.environ["FLATGATHER_SGLANG"] = "1"
    import sglang

    started = time.perf_counter()
    engine = sglang.Engine(**engine_args(spec))
    up = time.perf_counter() - started
    try:
        sent = time.perf_counter()
        outs = []
        for name, kwargs in workload.front_end_engine_calls(spec.get("seed", 0)):
            served = _engine_generate(engine, kwargs)
            for i, out in enumerate(served if isinstance(served, list) else [served]):
                meta = out["meta_info"]
                fields = {k: repr(meta[k]) for k in sorted(meta) if "logprobs" in k}
                outs.append(
                    {"name": f"{name}[{i}]", "text": repr(out.get("text"))}
                    | {"output_ids": repr(out.get("output_ids"))}
                    | fields
                )
        serve_s = time.perf_counter() - sent
    finally:
        engine.shutdown()
    return outs, up, serve_s, os.getpid()


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    switch = os.environ.get("FLATGATHER_SGLANG", "")
    if spec.get("front_end"):
        serve = serve_front_end if spec["front_end"] == "http" else serve_front_end_engine
        outs, up, serve_s, pid = serve(spec)
        result = {
            "answers": outs,
            "flatgather": switch,
            "main_pid": pid,
            "startup_s": up,
            "serve_s": serve_s,
        }
        Path(spec["out"]).write_text(json.dumps(result))
        return 0
    reqs = workload.requests(spec["requests"], seed=spec.get("seed", 0), **spec.get("shape", {}))
    calls = [r.as_kwargs() for r in reqs]
    batch = {key: [c[key] for c in calls] for key in calls[0]}
    if spec.get("http"):
        outs, up, serve_s = serve_http(spec, batch)
    else:
        import sglang

        started = time.perf_counter()
        engine = sglang.Engine(**engine_args(spec))
        up = time.perf_counter() - started
        try:
            # The serving time: the call, start-up and shutdown excluded.
            # With "repeat", the first call is a warm-up and the time is the
            # median of the next ones (the first call after start-up can
            # wait a few hundred ms on SGLang's own start, either side).
            times = []
            for _ in range(1 + spec.get("repeat", 0)):
                sent = time.perf_counter()
                served = engine.generate(**batch)
                times.append(time.perf_counter() - sent)
                outs = outs if times[1:] else served
            serve_s = statistics.median(times[1:] or times)
        finally:
            engine.shutdown()
    result = {
        "answers": [answer(o) for o in outs],
        "flatgather": os.environ.get("FLATGATHER_SGLANG", ""),
        "startup_s": up,
        "serve_s": serve_s,
    }
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
