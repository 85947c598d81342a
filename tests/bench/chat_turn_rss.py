"""`chat_turn`'s peak memory and CPU time on one pure-chat turn, measured as Lambda runs it (a part of
`tests.bench.aws_calls`, whose JSON holds the result under "chat_turn").

The emulated API Gateway edge runs `ws_default` as usual and `chat_turn` in a child process set up like a
Lambda execution environment (tests/support/lambda_process.py): `functions/chat_turn` first on
`sys.path`, `shared/` on PYTHONPATH as the layer, and only the environment variables template.yaml gives
the function (`template_env`: the Globals' and ChatTurnFunction's, with the LLM key in a Secrets
Manager secret as a deployment with `LlmSecretArn` has it) plus the runtime's own (AWS_*, LAMBDA_*).
Its driver is the real SDK-free one (`AnthropicLiteDriver`) against a fake Anthropic API speaking the
real SSE wire format (tests/fakes/fake_anthropic.py): `DELTAS` text deltas `DELTA_GAP_MS` apart
(scaled in --quick), 3,000 input and 500 output tokens. A stock client is subscribed, so every frame
is posted. `TURNS` turns run in one warm environment; the child reports `ru_maxrss` and VmHWM after
its init phase and after each turn, and each turn's CPU seconds (user + system).

The recommended `ChatTurnMemorySize` is the smallest of `SIZES` that holds the peak plus
`MARGIN_MB` (Lambda's runtime client and its own process count against the setting; the rest is
headroom) and whose CPU share (1 vCPU at 1,769 MB) runs the turn's CPU work in at most
`MAX_CPU_BUSY` of the LLM's streaming time (the CPU does not pace the stream) and the work before
the LLM request (lease, history, budget hold: the first delta waits for it) in at most
`MAX_BEFORE_LLM_S` on a warm environment's turn. An environment's first turn also creates its AWS
and HTTP clients and reads the key and the configuration (≈ 0.24 s of CPU: 1.6 s at 256 MB); cold
starts are about 1 % of invocations, and that first-turn figure is reported next to the choice.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[2]
TURNS: Final = 2
SIZES: Final = (128, 256, 512, 1024)
MARGIN_MB: Final = 30
FULL_VCPU_MB: Final = 1769
MAX_CPU_BUSY: Final = 0.5
MAX_BEFORE_LLM_S: Final = 1.0
INPUT_TOKENS: Final = 3000
OUTPUT_TOKENS: Final = 500
STACK: Final = "bench"
REGION: Final = "us-east-1"
CONDITIONS: Final = {"HasLlmSecret": True, "HasWorkerImage": False, "HasOtelExporter": False}


def template_env(resources: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment variables template.yaml gives ChatTurnFunction (Globals merged as SAM does):
    parameters at their defaults, `resources` for the other `Ref`s, `overrides` by variable name.
    A variable this cannot resolve raises, so that a new one in the template is not silently left out."""
    from tests.template.template_model import _function, _template

    params = {name: str(p["Default"]) for name, p in _template()["Parameters"].items() if "Default" in p}
    pseudo = {"AWS::StackName": STACK, "AWS::Region": REGION, "AWS::URLSuffix": "amazonaws.com", **params}
    dropped = object()

    def resolve(value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and len(value) == 1:
            (kind, arg), = value.items()
            if kind == "Ref":
                if arg == "AWS::NoValue":
                    return dropped
                return resources.get(arg, pseudo.get(arg))
            if kind == "Fn::If":
                return resolve(arg[1] if CONDITIONS[arg[0]] else arg[2])
            if kind == "Fn::Join":
                items = arg[1]
                if isinstance(items, dict):  # a list parameter: its value is comma-separated text
                    text = resolve(items)
                    return None if text is None else arg[0].join(p for p in str(text).split(",") if p)
                parts = [resolve(x) for x in items]
                return None if any(p is None for p in parts) else arg[0].join(str(p) for p in parts)
            if kind == "Fn::Sub" and isinstance(arg, str):
                out = arg
                for name, v in {**pseudo, **resources}.items():
                    out = out.replace("${" + name + "}", v)
                return None if "${" in out else out
        return None

    env: dict[str, str] = {}
    for name, value in _function("ChatTurnFunction")["Environment"]["Variables"].items():
        resolved = overrides[name] if name in overrides else resolve(value)
        if resolved is dropped:
            continue
        if resolved is None:
            raise ValueError(f"template variable {name} = {value!r}: the bench cannot resolve it")
        env[name] = str(resolved)
    return env


def lambda_env(function_env: Mapping[str, str], *, edge_env: Mapping[str, str], llm_base_url: str,
               memory_mb: int, layer: Path) -> dict[str, str]:
    """What a Lambda execution environment of chat_turn sees: the function's variables, the runtime's,
    the layer on PYTHONPATH, and the emulation's endpoints (moto, the edge, the fake LLM)."""
    task_root = REPO / "functions" / "chat_turn"
    return {
        **function_env,
        "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_LAMBDA_FUNCTION_NAME": "agentvm-chat-turn", "AWS_LAMBDA_FUNCTION_VERSION": "1",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb), "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
        "AWS_LAMBDA_LOG_FORMAT": "JSON", "LAMBDA_TASK_ROOT": str(task_root), "LANG": "en_US.UTF-8",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TZ": ":UTC",
        "PYTHONPATH": f"{REPO / 'shared'}:{layer}",  # the layer: agentvm and its requirements
        "AVM_AWS_ENDPOINT_URL": edge_env["AVM_AWS_ENDPOINT_URL"],
        "AVM_LAMBDA_ENDPOINT_URL": edge_env["AVM_LAMBDA_ENDPOINT_URL"],
        "AVM_LLM_BASE_URL": llm_base_url,
    }


def layer_dir(target: Path) -> Path:
    """The Lambda layer's python/ folder, as symlinks into this venv: every distribution of
    shared/requirements.txt (the layer's full resolution) and nothing else, so that the child cannot
    import what the layer does not ship (aws-xray-sdk, anthropic, moto, ...)."""
    from importlib.metadata import distribution

    names = [line.split("==")[0].strip() for line in (REPO / "shared" / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        dist = distribution(name)
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] not in ("..", "bin")}:
            source = Path(str(dist.locate_file(top)))
            link = target / top
            if source.exists() and not link.exists() and top != "__pycache__":
                link.symlink_to(source)
    return target


def _mb(kb: int | None) -> float:
    return round((kb or 0) / 1024, 1)


def _peak_kb(usage: Mapping[str, Any]) -> int:
    """VmHWM: the peak resident set of this process image. Linux keeps `ru_maxrss` across fork and
    execve, so a child of the (large) bench process starts with the parent's peak in it."""
    return int(usage["vmhwm_kb"]) if usage.get("vmhwm_kb") else int(usage["maxrss_kb"])


def _cpu_before(samples: list[list[float]], at: float) -> float:
    """CPU seconds the invocation had spent when the LLM request arrived (at `at`, time.monotonic())."""
    spent = [cpu for t, cpu in samples if t <= at]
    return (spent[-1] if spent else samples[0][1]) - samples[0][1]


def recommend(peak_rss_mb: float, cpu_s: float, stream_s: float, cpu_before_llm_s: float
              ) -> tuple[int, dict[str, Any]]:
    """The recommended memory size and, per size in `SIZES`, whether it fits, the CPU share's load over
    the stream and how long the share needs for the work before the LLM request (the first delta waits)."""
    table: dict[str, Any] = {}
    chosen = SIZES[-1]
    for size in reversed(SIZES):
        share = size / FULL_VCPU_MB
        busy = cpu_s / share / stream_s
        before = cpu_before_llm_s / share
        fits = peak_rss_mb + MARGIN_MB <= size
        table[str(size)] = {"vcpu": round(share, 3), "headroom_mb": round(size - peak_rss_mb, 1), "fits": fits,
                            "cpu_s_at_share": round(cpu_s / share, 2), "cpu_busy_of_stream": round(busy, 3),
                            "before_llm_s_at_share": round(before, 2)}
        if fits and busy <= MAX_CPU_BUSY and before <= MAX_BEFORE_LLM_S:
            chosen = size
    return chosen, dict(sorted(table.items(), key=lambda kv: int(kv[0])))


async def measure(*, endpoint: str, scale: float, deltas: int, gap_ms: float, model: str, flush_ms: int,
                  max_flush_ms: int, chunks: list[str], budget: Decimal) -> dict[str, Any]:
    from agentvm.adapters.aws.botocore_async import dummy_session
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
    from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
    from agentvm.auth.api_keys import new_key
    from agentvm.domain.usage import Budget
    from tests.fakes.fake_anthropic import FakeAnthropic, FakeUsage, Reply, Text
    from tests.support.cloud_edge import CloudEdge
    from tests.support.stock_client import StockClient

    table, bucket = f"rss-{uuid.uuid4().hex[:12]}", f"rss-{uuid.uuid4().hex[:12]}"
    session = dummy_session(REGION)
    s3: Any = session.create_client("s3", endpoint_url=endpoint, region_name=REGION)
    sm: Any = session.create_client("secretsmanager", endpoint_url=endpoint, region_name=REGION)
    try:
        s3.create_bucket(Bucket=bucket)
        secret_arn = sm.create_secret(Name=f"agentvm/{table}/llm", SecretString="sk-ant-bench-dummy")["ARN"]
    finally:
        s3.close()
        sm.close()
    store = DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION)
    await store.open()
    await store.create_table()
    key, token = new_key("bench")
    await DynamoDBKeys(store).put_key(key)
    await DynamoDBUsageLedger(store).put_budget(Budget("bench", monthly=budget))
    reply = Reply([Text(chunks[:deltas])], usage=FakeUsage(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS),
                  model=model, event_delay_s=gap_ms / 1000)
    memory_now = 512  # what the child is told (AWS_LAMBDA_FUNCTION_MEMORY_SIZE); it changes nothing it does
    try:
        with FakeAnthropic() as llm, tempfile.TemporaryDirectory() as tmp:
            edge = CloudEdge(moto_endpoint=endpoint, token=token, table_name=table)
            function_env = template_env(
                {"Table": table, "Bucket": bucket, "LlmSecretArn": secret_arn},
                {"AVM_WS_ENDPOINT": edge.ws_endpoint, "AVM_STREAM_FLUSH_MS": str(round(flush_ms * scale)),
                 "AVM_STREAM_MAX_FLUSH_MS": str(round(max_flush_ms * scale))})
            edge.processes["chat_turn"] = processes = _process_environments(
                lambda_env(function_env, edge_env=edge.handler_env(), llm_base_url=llm.base_url,
                           memory_mb=memory_now, layer=layer_dir(Path(tmp) / "python")))
            from tests.bench.aws_calls import _environment

            async with edge.running():
                with _environment(**edge.handler_env(), AVM_CHAT_TURN_FUNCTION="agentvm-chat-turn:live",
                                  AVM_RELIABLE_WRAPPER="false"):
                    async with StockClient(edge.url, ack=False) as client:
                        image = await client.new_image("bench", name="rss", model=model)
                        for n in range(TURNS):
                            llm.enqueue(reply)
                            events = await client.turn(image["imageId"], f"turn {n + 1}: a long answer please",
                                                       timeout=120)
                            await edge.settle(include_invokes=True, timeout=60)
                            if os.environ.get("AVM_BENCH_DEBUG"):
                                print(json.dumps(events)[:3000], file=sys.stderr)
            edge.check()
            llm_at = [r.at for r in llm.requests if r.path.startswith("/v1/messages")]
        assert len(llm_at) == TURNS, f"{len(llm_at)} LLM requests for {TURNS} turns"
        turns = await store.list_turns("bench", image["sessionId"])
        assert len(turns) == TURNS and all(t.status == "completed" for t in turns), turns
    finally:
        await store.close()
    m = processes.measured
    assert len(m.init) == 1 and len(m.invocations) == TURNS, (m.init, m.invocations)
    init, first, last = m.init[0], m.invocations[0], m.invocations[-1]
    peak_mb = _mb(_peak_kb(last["usage"]))
    stream_s = deltas * gap_ms / 1000 / scale  # the full run's streaming time, also in --quick
    cpu_s = max(i["cpu_s"] for i in m.invocations)
    before_llm = [_cpu_before(i["cpu_samples"], at) for i, at in zip(m.invocations, llm_at, strict=True)]
    memory_mb, sizes = recommend(peak_mb, cpu_s, stream_s, before_llm[-1])  # a warm turn's
    return {
        "peak_rss_mb": peak_mb, "memory_mb": memory_mb, "margin_mb": MARGIN_MB,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "startup_rss_mb": _mb(init["startup"]["vmrss_kb"]),
        "init_peak_rss_mb": _mb(_peak_kb(init["usage"])), "init_cpu_ms": round(init["cpu_s"] * 1000),
        "init_s": round(init["init_s"], 3),
        "turns": [{"peak_rss_mb": _mb(_peak_kb(i["usage"])), "rss_mb": _mb(i["usage"]["vmrss_kb"]),
                   "cpu_ms": round(i["cpu_s"] * 1000), "cpu_ms_before_llm": round(b * 1000),
                   "wall_s": round(i["wall_s"], 2)} for i, b in zip(m.invocations, before_llm, strict=True)],
        "first_turn_peak_rss_mb": _mb(_peak_kb(first["usage"])),
        "cpu_ms_per_turn": round(cpu_s * 1000), "stream_s": stream_s, "sizes": sizes,
    }


def _process_environments(env: Mapping[str, str]) -> Any:
    from tests.support.lambda_process import ProcessEnvironments

    # -S: no site-packages (the venv's), only PYTHONPATH: shared/ and the layer's requirements
    return ProcessEnvironments(env, limit=1, python_args=("-S",))


def report(ct: Mapping[str, Any]) -> str:
    turns = ", ".join(f"turn {n}: peak {t['peak_rss_mb']} MB, {t['cpu_ms']} ms CPU ({t['cpu_ms_before_llm']} "
                      f"before the LLM request) in {t['wall_s']} s" for n, t in enumerate(ct["turns"], 1))
    sizes = "\n  ".join(f"{size} MB ({s['vcpu']:g} vCPU): {'fits' if s['fits'] else 'too small'} "
                        f"({s['headroom_mb']:g} MB above the peak), CPU busy {s['cpu_busy_of_stream']:.0%} of the "
                        f"stream, {s['before_llm_s_at_share']:g} s of CPU before the LLM request"
                        for size, s in ct["sizes"].items())
    return (f"chat_turn peak RSS: {ct['peak_rss_mb']} MB (Python {ct['python']}; after init "
            f"{ct['init_peak_rss_mb']} MB, {ct['init_cpu_ms']} ms CPU; {turns})\n"
            f"  {sizes}\n"
            f"  recommended ChatTurnMemorySize: {ct['memory_mb']} MB (peak + {ct['margin_mb']} MB for Lambda's "
            f"runtime and headroom; CPU busy ≤ {MAX_CPU_BUSY:.0%} of a {ct['stream_s']:g} s stream, ≤ "
            f"{MAX_BEFORE_LLM_S:g} s of CPU before the LLM request)")


def main(argv: list[str] | None = None) -> int:
    """Standalone: `python -m tests.bench.chat_turn_rss [--quick] [--json FILE]` (aws_calls runs it too)."""
    import argparse
    import asyncio

    from tests.bench import aws_calls

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="time scaled by 1/10")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    with aws_calls.moto_server() as endpoint:
        ct = asyncio.run(aws_calls.measure_chat_turn(endpoint, 0.1 if args.quick else 1.0))
    print(report(ct))
    if args.json is not None:
        args.json.write_text(json.dumps(ct, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
